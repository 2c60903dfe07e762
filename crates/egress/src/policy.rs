//! The egress leash applied: the two checks the proxy makes of an [`EgressPolicy`] (the rules
//! as data, and their own checks, are `airlock-api`'s), in this order:
//! 1. [`Checks::check_target`] on what the code asked for (`CONNECT host:port`, or a plain request's
//!    Host): a host name must match a rule exactly or by a `*.` wildcard, with the port
//!    listed; an IP literal is refused unless a listed range covers it.
//! 2. [`Checks::check_address`] on every address the proxy is about to connect to: an address of a
//!    special range (loopback, private, link-local and the metadata address, CGNAT,
//!    multicast, unspecified, and their IPv6 forms, IPv4-mapped included) is refused unless a
//!    listed range covers it. Checking the address actually connected to, after the proxy's
//!    own resolution, is what defeats names that resolve inside and DNS rebinding.
//!
//! The default policy allows nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use airlock_api::egress::{host_matches, normalize, EgressPolicy, HostRule};
use ipnet::IpNet;

/// Why a connection is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("{0:?} is not a host name the policy lists")]
    HostNotListed(String),
    #[error("port {port} is not listed for {host:?}")]
    PortNotListed { host: String, port: u16 },
    #[error("{0} is an IP address no listed range covers")]
    IpLiteral(IpAddr),
    #[error("{addr} is a {kind} address no listed range covers")]
    SpecialAddress { addr: IpAddr, kind: &'static str },
    #[error("{0:?} is not a valid host name")]
    BadHost(String),
}

impl Denied {
    /// A short name for audit lines and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::HostNotListed(_) => "host_not_listed",
            Denied::PortNotListed { .. } => "port_not_listed",
            Denied::IpLiteral(_) => "ip_literal",
            Denied::SpecialAddress { .. } => "special_address",
            Denied::BadHost(_) => "bad_host",
        }
    }
}

/// What the proxy was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A host name, lower-case, without a final dot: resolve it, then check each address.
    Name(String),
    /// An IP literal a listed range covers: connect to it as is.
    Address(IpAddr),
}

/// The proxy's two checks of a policy, in the order it makes them.
pub trait Checks {
    /// The first check: the host and port the code asked for.
    fn check_target(&self, host: &str, port: u16) -> Result<Target, Denied>;

    /// The second check: an address the proxy resolved and is about to connect to.
    fn check_address(&self, addr: IpAddr, port: u16) -> Result<(), Denied>;
}

impl Checks for EgressPolicy {
    fn check_target(&self, host: &str, port: u16) -> Result<Target, Denied> {
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(addr) = literal.parse::<IpAddr>() {
            let addr = unmap(addr);
            return if range_allows(self, addr, port) {
                Ok(Target::Address(addr))
            } else {
                Err(Denied::IpLiteral(addr))
            };
        }
        let name = normalize(host).ok_or_else(|| Denied::BadHost(host.to_owned()))?;
        let rules: Vec<&HostRule> = self
            .hosts
            .iter()
            .filter(|r| host_matches(&r.host, &name))
            .collect();
        if rules.is_empty() {
            return Err(Denied::HostNotListed(name));
        }
        if !rules.iter().any(|r| r.ports.contains(&port)) {
            return Err(Denied::PortNotListed { host: name, port });
        }
        Ok(Target::Name(name))
    }

    fn check_address(&self, addr: IpAddr, port: u16) -> Result<(), Denied> {
        let addr = unmap(addr);
        match special(addr) {
            Some(kind) if !range_allows(self, addr, port) => {
                Err(Denied::SpecialAddress { addr, kind })
            }
            _ => Ok(()),
        }
    }
}

fn range_allows(policy: &EgressPolicy, addr: IpAddr, port: u16) -> bool {
    policy.ranges.iter().any(|r| {
        r.ports.contains(&port) && r.cidr.parse::<IpNet>().is_ok_and(|n| n.contains(&addr))
    })
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
pub(crate) fn unmap(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// The special range an address is in, if any.
pub fn special(addr: IpAddr) -> Option<&'static str> {
    match unmap(addr) {
        IpAddr::V4(a) => special_v4(a),
        IpAddr::V6(a) => special_v6(a),
    }
}

fn special_v4(a: Ipv4Addr) -> Option<&'static str> {
    let [b0, b1, b2, _] = a.octets();
    Some(match () {
        _ if a == Ipv4Addr::new(169, 254, 169, 254) => "metadata",
        // IETF protocol assignments (some clouds answer metadata there) and benchmarking.
        _ if b0 == 192 && b1 == 0 && b2 == 0 => "reserved",
        _ if b0 == 198 && (b1 == 18 || b1 == 19) => "reserved",
        _ if a.is_unspecified() || b0 == 0 => "unspecified",
        _ if a.is_loopback() => "loopback",
        _ if a.is_private() => "private",
        _ if a.is_link_local() => "link-local",
        _ if b0 == 100 && (64..128).contains(&b1) => "CGNAT",
        _ if a.is_multicast() => "multicast",
        _ if a.is_broadcast() || b0 >= 240 => "reserved",
        _ => return None,
    })
}

fn special_v6(a: Ipv6Addr) -> Option<&'static str> {
    let s0 = a.segments()[0];
    // NAT64 and 6to4 embed an IPv4 address: judged by it.
    if s0 == 0x64 && a.segments()[1] == 0xff9b || s0 == 0x2002 {
        let o = a.octets();
        let embedded = if s0 == 0x2002 {
            Ipv4Addr::new(o[2], o[3], o[4], o[5])
        } else {
            Ipv4Addr::new(o[12], o[13], o[14], o[15])
        };
        return special_v4(embedded);
    }
    Some(match () {
        _ if a.is_unspecified() => "unspecified",
        _ if a.is_loopback() => "loopback",
        _ if a.to_ipv4().is_some() => "IPv4-compatible",
        _ if s0 & 0xfe00 == 0xfc00 => "unique local",
        _ if s0 & 0xffc0 == 0xfe80 => "link-local",
        _ if s0 & 0xffc0 == 0xfec0 => "site-local",
        // Teredo tunnels to an IPv4 address it hides.
        _ if s0 == 0x2001 && a.segments()[1] == 0 => "Teredo",
        _ if a.is_multicast() => "multicast",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> EgressPolicy {
        let p: EgressPolicy = serde_json::from_value(serde_json::json!({
            "hosts": [
                {"host": "pypi.org", "ports": [443]},
                {"host": "*.pythonhosted.org", "ports": [443]},
                {"host": "example.com", "ports": [80, 443]}
            ],
            "ranges": [{"cidr": "127.0.0.0/8", "ports": [8443]}]
        }))
        .unwrap();
        p.validate().unwrap();
        p
    }

    #[test]
    fn names_are_matched_exactly_or_below_a_wildcard() {
        let p = policy();
        for (host, port) in [
            ("pypi.org", 443),
            ("PyPI.org.", 443),
            ("files.pythonhosted.org", 443),
            ("a.b.pythonhosted.org", 443),
            ("example.com", 80),
        ] {
            assert!(
                matches!(p.check_target(host, port), Ok(Target::Name(_))),
                "{host}:{port}"
            );
        }
        for (host, port, reason) in [
            ("pypi.org.evil.example", 443, "host_not_listed"),
            ("evilpypi.org", 443, "host_not_listed"),
            ("pythonhosted.org", 443, "host_not_listed"),
            ("evilpythonhosted.org", 443, "host_not_listed"),
            ("pypi.org", 80, "port_not_listed"),
            ("pypi.org", 22, "port_not_listed"),
            ("pypi.org\0.x", 443, "bad_host"),
            ("pypі.org", 443, "bad_host"), // a Cyrillic і
            ("", 443, "bad_host"),
            ("a..org", 443, "bad_host"),
        ] {
            let denied = p.check_target(host, port).unwrap_err();
            assert_eq!(denied.reason(), reason, "{host:?}:{port}: {denied}");
        }
    }

    #[test]
    fn ip_literals_need_a_listed_range() {
        let p = policy();
        assert_eq!(
            p.check_target("127.0.0.1", 8443),
            Ok(Target::Address("127.0.0.1".parse().unwrap()))
        );
        assert_eq!(
            p.check_target("[::ffff:127.0.0.1]", 8443),
            Ok(Target::Address("127.0.0.1".parse().unwrap())),
            "IPv4-mapped is the IPv4 address"
        );
        for (host, port) in [
            ("127.0.0.1", 80),
            ("93.184.216.34", 443),
            ("[2606:4700::1111]", 443),
            ("::1", 8443),
        ] {
            assert_eq!(
                p.check_target(host, port).unwrap_err().reason(),
                "ip_literal",
                "{host}:{port}"
            );
        }
    }

    #[test]
    fn special_addresses_are_refused_after_resolution_unless_listed() {
        let p = policy();
        for addr in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "224.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "192.0.0.192",
            "198.18.0.1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            let addr: IpAddr = addr.parse().unwrap();
            let port = if addr == "127.0.0.1".parse::<IpAddr>().unwrap() {
                443
            } else {
                8443
            };
            let denied = p.check_address(addr, port).unwrap_err();
            assert_eq!(denied.reason(), "special_address", "{addr}: {denied}");
        }
        assert_eq!(
            special("169.254.169.254".parse().unwrap()),
            Some("metadata")
        );
        for public in ["93.184.216.34", "2606:4700::1111", "64:ff9b::5db8:d822"] {
            assert_eq!(
                p.check_address(public.parse().unwrap(), 443),
                Ok(()),
                "{public}"
            );
        }
        // A listed range opens its special addresses, on its ports only.
        assert_eq!(p.check_address("127.0.0.1".parse().unwrap(), 8443), Ok(()));
        assert_eq!(
            p.check_address("::ffff:127.0.0.2".parse().unwrap(), 8443),
            Ok(())
        );
    }

    #[test]
    fn a_request_is_never_wider_than_its_key() {
        let key = policy();
        let asks = |v: serde_json::Value| -> EgressPolicy { serde_json::from_value(v).unwrap() };
        assert!(key
            .covers(&asks(
                serde_json::json!({"hosts": [{"host": "pypi.org", "ports": [443]}]})
            ))
            .is_ok());
        assert!(key
            .covers(&asks(
                serde_json::json!({"hosts": [{"host": "files.pythonhosted.org", "ports": [443]}]})
            ))
            .is_ok());
        assert!(key
            .covers(&asks(
                serde_json::json!({"hosts": [{"host": "*.a.pythonhosted.org", "ports": [443]}]})
            ))
            .is_ok());
        for wider in [
            serde_json::json!({"hosts": [{"host": "pypi.org", "ports": [80]}]}),
            serde_json::json!({"hosts": [{"host": "*.pypi.org", "ports": [443]}]}),
            serde_json::json!({"hosts": [{"host": "*.org", "ports": [443]}]}),
            serde_json::json!({"ranges": [{"cidr": "127.0.0.0/7", "ports": [8443]}]}),
            serde_json::json!({"ranges": [{"cidr": "127.0.0.1/32", "ports": [22]}]}),
        ] {
            assert!(key.covers(&asks(wider.clone())).is_err(), "{wider}");
        }
        assert!(EgressPolicy::default().allows_nothing());
        assert_eq!(
            EgressPolicy::default()
                .check_target("pypi.org", 443)
                .unwrap_err()
                .reason(),
            "host_not_listed"
        );
    }
}
