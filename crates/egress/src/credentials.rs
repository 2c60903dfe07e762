//! Credentials the proxy sets on requests to their hosts, so that the secret never enters a
//! sandbox: what a credential is once its values are read ([`Credential`]), what one use
//! of it looks like to the audit log ([`CredentialRecord`]), and the [`Scrubber`] that takes
//! every form of its secret out of what the upstream answers before the code reads it.

use std::fmt;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use serde::Serialize;

use crate::HostRule;

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
    scrubber: Arc<Scrubber>,
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
        if hosts.is_empty() {
            return Err(format!("{whose}: list the hosts it applies to"));
        }
        crate::EgressPolicy {
            hosts: hosts.clone(),
            ranges: Vec::new(),
        }
        .validate()
        .map_err(|m| format!("{whose}: {m}"))?;
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
            if h.secret.len() < MIN_SECRET || !h.value.contains(&h.secret) {
                return Err(format!(
                    "{whose}.headers.{}: the secret must be at least {MIN_SECRET} bytes and \
                     appear in the value",
                    h.name
                ));
            }
        }
        let scrubber = Scrubber::new(headers.iter().map(|h| h.secret.as_bytes()));
        Ok(Credential {
            name: name.to_owned(),
            hosts,
            headers,
            upstream,
            scrubber: Arc::new(scrubber),
        })
    }

    /// Whether requests to `host` (a checked, lower-case name) on `port` carry it.
    pub fn applies_to(&self, host: &str, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|r| r.ports.contains(&port) && crate::host_matches(&r.host, host))
    }

    pub(crate) fn scrubber(&self) -> &Arc<Scrubber> {
        &self.scrubber
    }
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

/// Takes every form of a set of secrets out of a stream of bytes, in any ASCII case: the
/// secret as it is, percent-encoded (reserved bytes or all of them, `+` for space),
/// JSON-escaped (up to three levels of quoting), in hex, and inside base64 or base64url text
/// at any of the three alignments (the characters that depend on the secret alone). Each
/// occurrence becomes as many `*`, so lengths (and a `Content-Length`) stay true. An
/// upstream that transforms what it echoes otherwise (hashes, reverses, encrypts it) is
/// beyond it.
#[derive(Debug)]
pub struct Scrubber {
    finder: AhoCorasick,
    /// The longest pattern, less one: what a stream holds back, since a pattern may go on
    /// in the bytes that come next.
    hold: usize,
}

impl Scrubber {
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Scrubber {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for secret in secrets {
            patterns.extend(forms(secret));
        }
        patterns.retain(|p| p.len() >= 4);
        patterns.sort();
        patterns.dedup();
        let hold = patterns.iter().map(Vec::len).max().unwrap_or(1) - 1;
        // ASCII case is ignored: an echo may upper- or lower-case what it quotes (hex and
        // percent-encoding come in both cases anyway).
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(true)
            .build(&patterns)
            .unwrap_or_else(|_| AhoCorasick::new(Vec::<Vec<u8>>::new()).expect("empty"));
        Scrubber { finder, hold }
    }

    /// Masks every occurrence in `data` (overlapping ones too); how many there were.
    pub fn mask(&self, data: &mut [u8]) -> u64 {
        let mut spans = Vec::new();
        for m in self.finder.find_overlapping_iter(&*data) {
            spans.push(m.range());
        }
        for span in &spans {
            data[span.clone()].fill(b'*');
        }
        spans.len() as u64
    }

    /// A stream's scrubbing, across reads.
    pub fn stream(self: &Arc<Self>) -> ScrubStream {
        ScrubStream {
            scrubber: self.clone(),
            held: Vec::new(),
            found: 0,
        }
    }
}

/// Scrubs a stream given in pieces: a secret split across two pieces is found whole.
#[derive(Debug)]
pub struct ScrubStream {
    scrubber: Arc<Scrubber>,
    held: Vec<u8>,
    pub found: u64,
}

impl ScrubStream {
    /// Appends `data` and returns what may go on now (all but the last bytes, which a
    /// secret could still be starting in).
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(data);
        // Masks found now are kept in what is held; a masked byte never matches again.
        self.found += self.scrubber.mask(&mut self.held);
        let keep = self.scrubber.hold.min(self.held.len());
        let rest = self.held.split_off(self.held.len() - keep);
        std::mem::replace(&mut self.held, rest)
    }

    /// The stream ended: the rest.
    pub fn finish(&mut self) -> Vec<u8> {
        self.found += self.scrubber.mask(&mut self.held);
        std::mem::take(&mut self.held)
    }
}

/// The forms of `secret` a reply may carry.
fn forms(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![secret.to_vec()];
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    for upper in [true, false] {
        let hex = |b: u8| {
            if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        };
        let mut reserved = String::new();
        let mut form = String::new();
        let mut all = String::new();
        for &b in secret {
            if unreserved(b) {
                reserved.push(b as char);
                form.push(b as char);
            } else {
                reserved.push_str(&hex(b));
                form.push_str(&if b == b' ' { "+".into() } else { hex(b) });
            }
            all.push_str(&hex(b));
        }
        out.extend([reserved, form, all].map(String::into_bytes));
        out.push(
            secret
                .iter()
                .map(|b| {
                    if upper {
                        format!("{b:02X}")
                    } else {
                        format!("{b:02x}")
                    }
                })
                .collect::<String>()
                .into_bytes(),
        );
    }
    if let Ok(text) = std::str::from_utf8(secret) {
        // JSON as encoders write it: `/` escaped by some, controls and non-ASCII as \u.
        let mut json = String::new();
        for c in text.chars() {
            match c {
                '"' => json.push_str("\\\""),
                '\\' => json.push_str("\\\\"),
                '/' => json.push_str("\\/"),
                c if (c as u32) < 0x20 || !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        json.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => json.push(c),
            }
        }
        // Quoted again (JSON inside a JSON string, as an error body quoting a request may
        // be): each level escapes the backslashes of the one before.
        let mut level = json;
        for _ in 0..3 {
            let next = level.replace('\\', "\\\\").replace('"', "\\\"");
            out.push(level.into_bytes());
            level = next;
        }
    }
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for offset in 0..3usize {
            let mut bytes = vec![0u8; offset];
            bytes.extend_from_slice(secret);
            let text = engine.encode(&bytes);
            // The first characters also carry the bytes before the secret, the last one
            // (when the length is not a multiple of three) the bytes after it.
            let skip = [0, 2, 3][offset];
            let end = text.len() - usize::from(bytes.len() % 3 != 0);
            if end > skip {
                out.push(text.as_bytes()[skip..end].to_vec());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t/Tok+en=42";

    fn scrub(data: &[u8]) -> (Vec<u8>, u64) {
        let s = Arc::new(Scrubber::new([SECRET.as_bytes()]));
        let mut stream = s.stream();
        let mut out = Vec::new();
        // One byte at a time: every split a reader could see.
        for b in data {
            out.extend(stream.feed(&[*b]));
        }
        out.extend(stream.finish());
        (out, stream.found)
    }

    fn absent(out: &[u8]) {
        let text = String::from_utf8_lossy(out);
        for needle in [SECRET, "s3cr3t", "Tok+en"] {
            assert!(!text.contains(needle), "{needle} in {text}");
        }
    }

    #[test]
    fn every_form_of_the_secret_is_masked_across_any_split() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let url = base64::engine::general_purpose::URL_SAFE;
        let mut cases: Vec<String> = vec![
            format!("Bearer {SECRET}"),
            format!(
                "{{\"authorization\": \"Bearer {}\"}}",
                SECRET.replace('/', "\\/")
            ),
            "s3cr3t%2FTok%2Ben%3D42".into(),
            "s3cr3t%2fTok%2ben%3d42".into(),
            "S3CR3T%2FTOK%2BEN%3D42".into(),
            "s3cr3t\\\\/Tok+en=42".into(),
            SECRET.bytes().map(|b| format!("{b:02x}")).collect(),
        ];
        // Base64 of the secret inside longer values, at each alignment.
        for prefix in ["", "B", "Be", "Bearer ", "user:"] {
            cases.push(b64.encode(format!("{prefix}{SECRET}")));
            cases.push(b64.encode(format!("{prefix}{SECRET}!")));
            cases.push(url.encode(format!("{prefix}{SECRET}??")));
        }
        for case in cases {
            let (out, found) = scrub(format!("<<{case}>>").as_bytes());
            assert!(found >= 1, "{case}");
            assert_eq!(out.len(), case.len() + 4, "lengths stay true");
            absent(&out);
            for b64_form in [b64.encode(SECRET), url.encode(SECRET)] {
                assert!(!String::from_utf8_lossy(&out).contains(b64_form.trim_end_matches('=')));
            }
        }
        let (out, found) = scrub(b"nothing to see here, not even s3cr3t/Tok");
        assert_eq!(found, 0);
        assert_eq!(out, b"nothing to see here, not even s3cr3t/Tok");
    }

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
