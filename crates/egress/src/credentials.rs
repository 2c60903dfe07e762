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

/// Checks a credential's hosts (`whose` names it in the error): some, each a valid rule.
pub fn check_hosts(whose: &str, hosts: &[HostRule]) -> Result<(), String> {
    if hosts.is_empty() {
        return Err(format!("{whose}: list the hosts it applies to"));
    }
    crate::EgressPolicy {
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

/// Takes every form of a set of secrets out of a stream of bytes, in any ASCII case: the
/// secret as it is; each byte other than letters and digits either as it is or escaped as
/// percent-encoding, JSON (`\u00XX`, `\/`, `\"`), HTML entities (`&#43;`, `&#x2b;`) or `+`
/// for a space, in every combination (an encoder escapes its own set); JSON quoted up to three
/// times; hex; and inside base64 or base64url text at any of the three alignments, with or
/// without one line break anywhere in it (MIME's and GitHub's wrapped base64). Each
/// occurrence becomes as many `*` (a base64 one with the character on each side, which holds
/// bits of the secret), so lengths (and a `Content-Length`) stay true. An upstream that
/// transforms what it echoes otherwise (hashes, reverses, encrypts it) is beyond it.
#[derive(Debug)]
pub struct Scrubber {
    finder: AhoCorasick,
    /// Which patterns are base64 text (by pattern index).
    base64: Vec<bool>,
    /// Every pattern, lower-case and sorted: what a stream's last bytes may be the start of.
    sorted: Vec<Vec<u8>>,
    /// The longest pattern.
    longest: usize,
}

/// What a match found in one pass over a buffer.
struct Masked {
    found: u64,
    /// A base64 match ends at the buffer's end: the byte that comes next holds bits of the
    /// secret too.
    mask_next: bool,
}

fn base64_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"+/-_".contains(&b)
}

impl Scrubber {
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Scrubber {
        let mut patterns: Vec<(Vec<u8>, bool)> = Vec::new();
        for secret in secrets {
            patterns.extend(forms(secret));
        }
        patterns.retain(|(p, _)| p.len() >= 4);
        for (p, _) in &mut patterns {
            p.make_ascii_lowercase();
        }
        patterns.sort();
        patterns.dedup_by(|a, b| a.0 == b.0);
        let longest = patterns.iter().map(|(p, _)| p.len()).max().unwrap_or(1);
        // ASCII case is ignored: an echo may upper- or lower-case what it quotes (hex and
        // percent-encoding come in both cases anyway).
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(true)
            .build(patterns.iter().map(|(p, _)| p))
            .unwrap_or_else(|_| AhoCorasick::new(Vec::<Vec<u8>>::new()).expect("empty"));
        Scrubber {
            finder,
            base64: patterns.iter().map(|(_, b)| *b).collect(),
            sorted: patterns.into_iter().map(|(p, _)| p).collect(),
            longest,
        }
    }

    /// Masks every occurrence in `data` (overlapping ones too); how many there were.
    pub fn mask(&self, data: &mut [u8]) -> u64 {
        self.mask_in(data).found
    }

    /// `text` with every occurrence masked.
    pub fn masked(&self, text: &str) -> String {
        let mut bytes = text.as_bytes().to_vec();
        self.mask(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn mask_in(&self, data: &mut [u8]) -> Masked {
        let mut spans = Vec::new();
        let mut mask_next = false;
        for m in self.finder.find_overlapping_iter(&*data) {
            let (mut start, mut end) = (m.start(), m.end());
            if self.base64[m.pattern().as_usize()] {
                if start > 0 && base64_char(data[start - 1]) {
                    start -= 1;
                }
                if end < data.len() {
                    if base64_char(data[end]) {
                        end += 1;
                    }
                } else {
                    mask_next = true;
                }
            }
            spans.push(start..end);
        }
        for span in &spans {
            data[span.clone()].fill(b'*');
        }
        Masked {
            found: spans.len() as u64,
            mask_next,
        }
    }

    /// How many of `data`'s last bytes could be the start of an occurrence that goes on in
    /// the bytes to come.
    fn open_tail(&self, data: &[u8]) -> usize {
        for k in (1..self.longest.min(data.len() + 1)).rev() {
            let tail = data[data.len() - k..].to_ascii_lowercase();
            let at = self
                .sorted
                .partition_point(|p| p.as_slice() < tail.as_slice());
            if self.sorted.get(at).is_some_and(|p| p.starts_with(&tail)) {
                return k;
            }
        }
        0
    }

    /// A stream's scrubbing, across reads.
    pub fn stream(self: &Arc<Self>) -> ScrubStream {
        ScrubStream {
            scrubber: self.clone(),
            held: Vec::new(),
            mask_next: false,
            found: 0,
        }
    }
}

/// Scrubs a stream given in pieces: a secret split across two pieces is found whole. Only
/// what could still be the start of one is held back, so a stream of small events (an
/// LLM's tokens) goes on as it comes.
#[derive(Debug)]
pub struct ScrubStream {
    scrubber: Arc<Scrubber>,
    held: Vec<u8>,
    /// The first byte to come follows a base64 match.
    mask_next: bool,
    pub found: u64,
}

impl ScrubStream {
    /// Appends `data` and returns what may go on now.
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        let from = self.held.len();
        self.held.extend_from_slice(data);
        if self.mask_next && from < self.held.len() {
            if base64_char(self.held[from]) {
                self.held[from] = b'*';
            }
            self.mask_next = false;
        }
        // Masks found now are kept in what is held; a masked byte never matches again.
        let masked = self.scrubber.mask_in(&mut self.held);
        self.found += masked.found;
        self.mask_next |= masked.mask_next;
        let open = self.scrubber.open_tail(&self.held);
        // With the byte before an open tail (a base64 match's neighbour), or a last byte of
        // base64 text that a match in the next piece would start right after.
        let keep = match open {
            0 if self.held.last().is_some_and(|&b| base64_char(b)) => 1,
            0 => 0,
            k => (k + 1).min(self.held.len()),
        };
        let rest = self.held.split_off(self.held.len() - keep);
        std::mem::replace(&mut self.held, rest)
    }

    /// The stream ended: the rest.
    pub fn finish(&mut self) -> Vec<u8> {
        self.found += self.scrubber.mask_in(&mut self.held).found;
        std::mem::take(&mut self.held)
    }
}

/// How a byte other than a letter or a digit may be written: as it is, percent-encoded,
/// JSON-escaped, as an HTML entity (decimal, hex), and the escapes of its own.
fn spellings(b: u8) -> Vec<Vec<u8>> {
    let mut out = vec![
        vec![b],
        format!("%{b:02X}").into_bytes(),
        format!("\\u{b:04x}").into_bytes(),
        format!("&#{b};").into_bytes(),
        format!("&#x{b:x};").into_bytes(),
    ];
    match b {
        b'/' | b'"' | b'\\' => out.push(vec![b'\\', b]),
        b' ' => out.push(b"+".to_vec()),
        b'\n' => out.push(b"\\n".to_vec()),
        b'\t' => out.push(b"\\t".to_vec()),
        _ => {}
    }
    out
}

/// Most spellings of one secret (each of its bytes other than letters and digits written
/// one of its ways); past it, the uniform ones and percent-encoding of any subset.
const MAX_SPELLINGS: usize = 4096;

/// The secret spelled every way [`spellings`] allows its bytes, consistently per byte.
fn spelled(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut special: Vec<u8> = secret
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_alphanumeric())
        .collect();
    special.sort_unstable();
    special.dedup();
    let ways: Vec<Vec<Vec<u8>>> = special.iter().map(|&b| spellings(b)).collect();
    let total = ways
        .iter()
        .try_fold(1usize, |n, w| n.checked_mul(w.len()))
        .unwrap_or(usize::MAX);
    let write = |choice: &dyn Fn(usize) -> usize| -> Vec<u8> {
        let mut out = Vec::with_capacity(secret.len() * 2);
        for &b in secret {
            match special.binary_search(&b) {
                Ok(i) => out.extend_from_slice(&ways[i][choice(i)]),
                Err(_) => out.push(b),
            }
        }
        out
    };
    let mut out = Vec::new();
    if total <= MAX_SPELLINGS {
        for n in 0..total {
            // `n` in mixed radix: one digit (a spelling) per special byte.
            let digits: Vec<usize> = {
                let mut rest = n;
                ways.iter()
                    .map(|w| {
                        let d = rest % w.len();
                        rest /= w.len();
                        d
                    })
                    .collect()
            };
            out.push(write(&|i| digits[i]));
        }
    } else {
        for way in 0..5 {
            out.push(write(&|_| way));
        }
        if special.len() <= 10 {
            for set in 0..1usize << special.len() {
                out.push(write(&|i| usize::from(set >> i & 1 == 1)));
            }
        }
    }
    out
}

/// The forms of `secret` a reply may carry, each with whether it is base64 text.
fn forms(secret: &[u8]) -> Vec<(Vec<u8>, bool)> {
    let mut out: Vec<(Vec<u8>, bool)> = spelled(secret).into_iter().map(|f| (f, false)).collect();
    // JSON quoted again (JSON inside a JSON string, as an error body quoting a request may
    // be): each level escapes the backslashes and quotes of the one before.
    let json: Vec<Vec<u8>> = [secret.to_vec(), {
        let mut escaped = Vec::new();
        for &b in secret {
            match b {
                b'"' | b'\\' | b'/' => escaped.extend_from_slice(&[b'\\', b]),
                b => escaped.push(b),
            }
        }
        escaped
    }]
    .into();
    for base in json {
        let mut level = base;
        for _ in 0..3 {
            let mut next = Vec::with_capacity(level.len() * 2);
            for &b in &level {
                if b == b'\\' || b == b'"' {
                    next.push(b'\\');
                }
                next.push(b);
            }
            out.push((next.clone(), false));
            level = next;
        }
    }
    out.push((
        secret
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into_bytes(),
        false,
    ));
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
            if end <= skip {
                continue;
            }
            let middle = &text.as_bytes()[skip..end];
            out.push((middle.to_vec(), true));
            // Wrapped base64 (MIME at 76 characters, GitHub's at 60): one break anywhere.
            if middle.len() <= 120 {
                for at in 1..middle.len() {
                    for brk in [&b"\n"[..], b"\r\n"] {
                        let mut wrapped = middle[..at].to_vec();
                        wrapped.extend_from_slice(brk);
                        wrapped.extend_from_slice(&middle[at..]);
                        out.push((wrapped, true));
                    }
                }
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
            // Encoders that escape their own sets: Python's quote (keeps `/`), Go's
            // PathEscape, .NET's JSON, Go's html/template, HTML hex entities.
            "s3cr3t/Tok%2Ben%3D42".into(),
            "s3cr3t%2FTok+en=42".into(),
            "s3cr3t/Tok\\u002Ben=42".into(),
            "s3cr3t/Tok&#43;en=42".into(),
            "s3cr3t&#x2F;Tok&#x2B;en&#x3D;42".into(),
        ];
        // Wrapped base64 (GitHub's at 60, MIME's at 76): wherever a break falls.
        let many = b64.encode(format!("Authorization: Bearer {SECRET}\r\n").repeat(3));
        for (width, brk) in [(60, "\n"), (76, "\r\n")] {
            cases.push(
                many.as_bytes()
                    .chunks(width)
                    .map(|c| String::from_utf8_lossy(c).into_owned() + brk)
                    .collect(),
            );
        }
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
        // The base64 characters on each side of a match carry bits of the secret: masked.
        let text = b64.encode(format!("xy{SECRET}!?"));
        let (out, _) = scrub(text.as_bytes());
        let out = String::from_utf8(out).unwrap();
        let stars = out.find('*').unwrap();
        assert_eq!(&out[..stars], &text[..stars]);
        assert!(
            stars <= 2 && out[stars..].trim_start_matches('*').len() <= 3,
            "{text} -> {out}"
        );
        // A secret with a quote and a slash, as JSON encoders that leave `/` alone write it.
        let s = Arc::new(Scrubber::new([&b"pa\"ss/word9"[..]]));
        for echo in [
            "{\"v\": \"pa\\\"ss/word9\"}",
            "\"{\\\"v\\\": \\\"pa\\\\\\\"ss/word9\\\"}\"",
        ] {
            let mut data = echo.as_bytes().to_vec();
            assert_eq!(s.mask(&mut data), 1, "{echo}");
        }
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
