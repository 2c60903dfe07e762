//! The egress leash as words: which host names, ports and address ranges a sandbox's proxy
//! may connect to ([`EgressPolicy`]), the rules' own checks, and what an execution used of
//! the network ([`Usage`]). The proxy that applies them is `airlock-egress`'s.

use std::net::IpAddr;

use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a sandbox may connect through airlock's proxy. [`Default`] allows nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EgressPolicy {
    /// Host names, exactly (`pypi.org`) or every name below one (`*.pythonhosted.org`).
    pub hosts: Vec<HostRule>,
    /// Address ranges the operator opens explicitly (`10.1.2.0/24`): reachable even when
    /// special, and by IP literal, on the ports listed.
    pub ranges: Vec<RangeRule>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostRule {
    pub host: String,
    pub ports: Vec<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RangeRule {
    pub cidr: String,
    pub ports: Vec<u16>,
}

impl EgressPolicy {
    /// Checks the rules themselves; errors name the one at fault.
    pub fn validate(&self) -> Result<(), String> {
        for rule in &self.hosts {
            let host = rule.host.strip_prefix("*.").unwrap_or(&rule.host);
            if normalize(host).as_deref() != Some(host) || host.parse::<IpAddr>().is_ok() {
                return Err(format!(
                    "egress host {:?}: a lower-case host name or `*.` and one (IP addresses go \
                     in `ranges`)",
                    rule.host
                ));
            }
            if rule.ports.is_empty() || rule.ports.contains(&0) {
                return Err(format!(
                    "egress host {:?}: list its ports (1-65535)",
                    rule.host
                ));
            }
        }
        for rule in &self.ranges {
            rule.cidr
                .parse::<IpNet>()
                .map_err(|e| format!("egress range {:?}: {e}", rule.cidr))?;
            if rule.ports.is_empty() || rule.ports.contains(&0) {
                return Err(format!(
                    "egress range {:?}: list its ports (1-65535)",
                    rule.cidr
                ));
            }
        }
        Ok(())
    }

    pub fn allows_nothing(&self) -> bool {
        self.hosts.is_empty() && self.ranges.is_empty()
    }

    /// Whether `narrower` asks for nothing this policy does not allow: every host rule is
    /// covered by one of ours (a wildcard only by a wildcard at or above it) with its ports,
    /// every range by one of ours with its ports.
    pub fn covers(&self, narrower: &EgressPolicy) -> Result<(), String> {
        for rule in &narrower.hosts {
            for &port in &rule.ports {
                let covered = self.hosts.iter().any(|ours| {
                    ours.ports.contains(&port) && host_rule_covers(&ours.host, &rule.host)
                });
                if !covered {
                    return Err(format!(
                        "egress host {:?} port {port} is wider than the key's policy",
                        rule.host
                    ));
                }
            }
        }
        for rule in &narrower.ranges {
            let Ok(net) = rule.cidr.parse::<IpNet>() else {
                return Err(format!("egress range {:?} is not a CIDR", rule.cidr));
            };
            for &port in &rule.ports {
                let covered = self.ranges.iter().any(|ours| {
                    ours.ports.contains(&port)
                        && ours.cidr.parse::<IpNet>().is_ok_and(|o| o.contains(&net))
                });
                if !covered {
                    return Err(format!(
                        "egress range {:?} port {port} is wider than the key's policy",
                        rule.cidr
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A host name as compared: ASCII, lower-case, without one final dot; letters, digits, `-`
/// and dots between non-empty labels. None for anything else (an IDN must come as punycode).
pub fn normalize(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    ok.then_some(host)
}

/// `*.example.com` matches names below `example.com` (not itself); anything else matches
/// only itself.
pub fn host_matches(rule: &str, name: &str) -> bool {
    match rule.strip_prefix("*.") {
        Some(base) => name
            .strip_suffix(base)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => rule == name,
    }
}

/// Whether rule `ours` allows every name rule `theirs` does.
pub fn host_rule_covers(ours: &str, theirs: &str) -> bool {
    match (ours.strip_prefix("*."), theirs.strip_prefix("*.")) {
        (_, None) => host_matches(ours, theirs),
        (Some(base), Some(their_base)) => base == their_base || host_matches(ours, their_base),
        (None, Some(_)) => false,
    }
}

/// One execution's use of the network, as the result reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Connections made to an allowed target.
    pub connections: u64,
    /// Connections the policy or a budget refused.
    pub denied: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Requests that carried a credential (set by the proxy, never seen by the code);
    /// absent when none did.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub credential_requests: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_rules_are_named() {
        for bad in [
            serde_json::json!({"hosts": [{"host": "PyPI.org", "ports": [443]}]}),
            serde_json::json!({"hosts": [{"host": "10.0.0.1", "ports": [443]}]}),
            serde_json::json!({"hosts": [{"host": "pypi.org", "ports": []}]}),
            serde_json::json!({"hosts": [{"host": "*", "ports": [443]}]}),
            serde_json::json!({"ranges": [{"cidr": "10.0.0.0/33", "ports": [443]}]}),
            serde_json::json!({"ranges": [{"cidr": "10.0.0.0/8", "ports": [0]}]}),
        ] {
            let p: EgressPolicy = serde_json::from_value(bad.clone()).unwrap();
            assert!(p.validate().is_err(), "{bad}");
        }
    }
}
