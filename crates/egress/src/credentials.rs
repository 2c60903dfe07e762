//! Credentials the proxy sets on requests to their hosts, so that the secret never enters a
//! sandbox: what a credential is once its values are read ([`Credential`]), and what one use
//! of it looks like to the audit log ([`CredentialRecord`]). Its secrets
//! ([`Credential::secrets`]) are what an interception's scrubber takes out of what the
//! upstream answers before the code reads it (`crate::scrub`).

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use airlock_api::egress::{host_matches, EgressPolicy, HostRule};

/// Shortest secret the proxy accepts: a shorter one could not be told from ordinary text
/// when it is taken out of answers.
pub const MIN_SECRET: usize = 8;

/// One header a credential sets: its name, and its whole value (`Bearer <secret>`).
#[derive(Clone)]
pub struct SetHeader {
    pub name: String,
    pub value: String,
    /// The secret inside the value, as read from the host's environment or a file.
    pub secret: String,
}

impl fmt::Debug for SetHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetHeader")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A credential with its values read: the hosts (and ports) it applies to, and the headers
/// the proxy sets on every request to them, over TLS it terminates and opens again itself.
#[derive(Clone)]
pub struct Credential {
    pub name: String,
    pub hosts: Vec<HostRule>,
    pub headers: Vec<SetHeader>,
    /// Verifies the real host's certificate (the host's CA bundle, or the operator's).
    pub upstream: Arc<rustls::ClientConfig>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// Checks the hosts and headers; errors name what is wrong, never a value.
    pub fn new(
        name: &str,
        hosts: Vec<HostRule>,
        headers: Vec<SetHeader>,
        upstream: Arc<rustls::ClientConfig>,
    ) -> Result<Credential, String> {
        let whose = format!("credentials.{name}");
        check_hosts(&whose, &hosts)?;
        if headers.is_empty() {
            return Err(format!("{whose}: name the header(s) it sets"));
        }
        for h in &headers {
            let token = !h.name.is_empty()
                && h.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token || HOP_BY_HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
                return Err(format!(
                    "{whose}: {:?} is not a header a credential may set",
                    h.name
                ));
            }
            // A line break would let a value add headers of its own; other controls have
            // no place in a header either.
            if h.value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                return Err(format!(
                    "{whose}.headers.{}: the value has a control character",
                    h.name
                ));
            }
            // An upstream reads a header's value without the spaces around it: a secret
            // with its own would be echoed without them, and no form of it would match.
            if h.secret.trim_matches([' ', '\t']) != h.secret {
                return Err(format!(
                    "{whose}.headers.{}: the secret starts or ends with whitespace",
                    h.name
                ));
            }
            // The scan reads escapes as the ASCII characters they stand for; a header's
            // value is ASCII anyway (RFC 9110's obs-text aside).
            if !h
                .secret
                .bytes()
                .all(|b| b.is_ascii() && !b.is_ascii_control())
            {
                return Err(format!(
                    "{whose}.headers.{}: the secret is not printable ASCII",
                    h.name
                ));
            }
            if h.secret.len() < MIN_SECRET || !h.value.contains(&h.secret) {
                return Err(format!(
                    "{whose}.headers.{}: the secret must be at least {MIN_SECRET} bytes and \
                     appear in the value",
                    h.name
                ));
            }
        }
        Ok(Credential {
            name: name.to_owned(),
            hosts,
            headers,
            upstream,
        })
    }

    /// Whether requests to `host` (a checked, lower-case name) on `port` carry it.
    pub fn applies_to(&self, host: &str, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|r| r.ports.contains(&port) && host_matches(&r.host, host))
    }

    /// The secrets inside its headers' values.
    pub fn secrets(&self) -> impl Iterator<Item = &[u8]> {
        self.headers.iter().map(|h| h.secret.as_bytes())
    }
}

/// Checks a credential's hosts (`whose` names it in the error): some, each a valid rule.
pub fn check_hosts(whose: &str, hosts: &[HostRule]) -> Result<(), String> {
    if hosts.is_empty() {
        return Err(format!("{whose}: list the hosts it applies to"));
    }
    EgressPolicy {
        hosts: hosts.to_vec(),
        ranges: Vec::new(),
    }
    .validate()
    .map_err(|m| format!("{whose}: {m}"))
}

/// Headers that describe one hop, never set by a credential (nor relayed as they are).
pub(crate) const HOP_BY_HOP: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// One request that carried a credential, as the audit log and metrics see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CredentialRecord {
    pub event: &'static str,
    pub execution_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub key: String,
    pub credential: String,
    pub host: String,
    pub port: u16,
    pub method: String,
    /// The request's path, without its query (which may carry the code's own values).
    pub path: String,
    /// The upstream's status; `None` when no answer came (the connection was cut).
    pub status: Option<u16>,
    /// Occurrences of the secret taken out of the answer.
    pub scrubbed: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl CredentialRecord {
    /// The record of one request on a connection to `host`:`port` that carries
    /// `credential`, before its request and answer fill it in.
    pub fn template(
        execution_id: Option<String>,
        session_id: Option<String>,
        key: &str,
        credential: &str,
        host: &str,
        port: u16,
    ) -> Self {
        CredentialRecord {
            event: "credential",
            execution_id,
            session_id,
            key: key.to_owned(),
            credential: credential.to_owned(),
            host: host.to_owned(),
            port,
            method: String::new(),
            path: String::new(),
            status: None,
            scrubbed: 0,
            bytes_out: 0,
            bytes_in: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_refuse_what_could_smuggle_or_leak() {
        let upstream = Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        );
        let host = |h: &str| HostRule {
            host: h.into(),
            ports: vec![443],
        };
        let header = |name: &str, value: &str, secret: &str| SetHeader {
            name: name.into(),
            value: value.into(),
            secret: secret.into(),
        };
        let ok = Credential::new(
            "gh",
            vec![host("api.github.com")],
            vec![header("Authorization", "Bearer abcdefgh12", "abcdefgh12")],
            upstream.clone(),
        )
        .unwrap();
        assert!(ok.applies_to("api.github.com", 443));
        assert!(!ok.applies_to("api.github.com", 80));
        assert!(!ok.applies_to("github.com", 443));
        assert!(!format!("{ok:?}").contains("abcdefgh12"), "never in Debug");
        for (hosts, headers) in [
            (vec![], vec![header("A", "abcdefgh12", "abcdefgh12")]),
            (
                vec![host("Api.github.com")],
                vec![header("A", "abcdefgh12", "abcdefgh12")],
            ),
            (vec![host("a.b")], vec![]),
            (
                vec![host("a.b")],
                vec![header("Host", "abcdefgh12", "abcdefgh12")],
            ),
            (
                vec![host("a.b")],
                vec![header("X y", "abcdefgh12", "abcdefgh12")],
            ),
            (
                vec![host("a.b")],
                vec![header("A", "abcdefgh12\r\nX: 1", "abcdefgh12")],
            ),
            (vec![host("a.b")], vec![header("A", "short", "short")]),
            (
                vec![host("a.b")],
                vec![header("A", "abcdefgh12 ", "abcdefgh12 ")],
            ),
            (
                vec![host("a.b")],
                vec![header("A", "x \tabcdefgh12", "\tabcdefgh12")],
            ),
            (
                vec![host("a.b")],
                vec![header("A", "Bearer x", "abcdefgh12")],
            ),
        ] {
            assert!(Credential::new("c", hosts, headers, upstream.clone()).is_err());
        }
        let wide = Credential::new(
            "w",
            vec![host("*.github.com")],
            vec![header("A", "abcdefgh12", "abcdefgh12")],
            upstream,
        )
        .unwrap();
        assert!(wide.applies_to("api.github.com", 443) && !wide.applies_to("github.com", 443));
    }
}
