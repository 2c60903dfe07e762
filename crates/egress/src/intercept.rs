//! Connections to a host with a credential: the proxy ends the sandbox's TLS with a
//! certificate from a CA of this leash's own (made with the leash; its key never leaves the
//! host's memory), opens its own TLS connection to the address it checked, verifying the
//! real certificate for the checked name, and relays HTTP/1.1 requests one by one, each
//! with the credential's headers set (whatever the code sent under those names is dropped)
//! and each answer's every form of the secret masked before the code reads it.
//!
//! Each request is judged on its own: its `Host` (and an absolute target's authority) must
//! be the name the `CONNECT` asked for and the proxy checked; anything else is answered 421
//! and the connection closed. Redirects are passed to the code, never followed: its next
//! request goes where it asks, checked like any other.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, GeneralSubtree, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use crate::credentials::{Credential, CredentialRecord, HOP_BY_HOP};
use crate::head::{Head, Role};
use crate::scrub::{ScrubStream, Scrubber};

/// The host's CA bundle, which the sandbox's trust store extends.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Longest chunk-size or trailer line of an answer.
const MAX_LINE: usize = 4096;
const BUFFER: usize = 32 * 1024;
/// The pieces a decoded answer goes on in.
const CODED_UNIT: usize = 16 * 1024;
/// How long the certificates of a leash's CA are valid: past any session's life.
const VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Verifies upstream certificates against `roots`, offering HTTP/1.1 only.
pub fn upstream_config(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, String> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// One leash's interception: its credentials (with the scrubbers of their secrets), its CA,
/// the certificates made so far, and the trust bundle its sandbox mounts.
pub struct Interception {
    credentials: Vec<Carried>,
    issuer: Issuer<'static, KeyPair>,
    ca: CertificateDer<'static>,
    ca_pem: String,
    /// One key for every certificate of this CA (its sandbox is its only client).
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    bundle: PathBuf,
}

impl std::fmt::Debug for Interception {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interception")
            .field("credentials", &self.credentials)
            .field("bundle", &self.bundle)
            .finish_non_exhaustive()
    }
}

/// A credential a leash's connections may carry, and the scrubber of its secrets: made at
/// the first connection that carries it, as a host's certificate is.
#[derive(Debug)]
struct Carried {
    credential: Arc<Credential>,
    scrubber: OnceLock<Arc<Scrubber>>,
}

impl Drop for Interception {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.bundle);
    }
}

static BUNDLES: AtomicU64 = AtomicU64::new(0);

impl Interception {
    /// A new CA for `credentials` (name-constrained to their hosts), and the trust bundle
    /// (the host's, then this CA's certificate) written in `dir` for the sandbox to mount.
    pub fn new(credentials: Vec<Arc<Credential>>, dir: &Path) -> io::Result<Interception> {
        let fail = |e: rcgen::Error| io::Error::other(format!("making the CA: {e}"));
        let now = SystemTime::now();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(
            DnType::CommonName,
            "airlock credential proxy (one sandbox's CA)",
        );
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        // Even a stolen certificate of this CA would be good for these names only.
        let mut permitted: Vec<GeneralSubtree> = credentials
            .iter()
            .flat_map(|c| c.hosts.iter())
            .map(|r| {
                GeneralSubtree::DnsName(r.host.strip_prefix("*.").unwrap_or(&r.host).to_owned())
            })
            .collect();
        permitted.dedup();
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: Vec::new(),
        });
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + VALIDITY).into();
        let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(fail)?;
        let ca = params.self_signed(&ca_key).map_err(fail)?;
        let ca_pem = ca.pem();
        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(fail)?;

        let mut bundle_text = std::fs::read(SYSTEM_BUNDLE).unwrap_or_default();
        if !bundle_text.is_empty() && !bundle_text.ends_with(b"\n") {
            bundle_text.push(b'\n');
        }
        bundle_text.extend_from_slice(ca_pem.as_bytes());
        let tag: String = ca_key.public_key_raw()[1..9]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let bundle = dir.join(format!(
            "airlock-ca-{}-{}-{tag}.pem",
            std::process::id(),
            BUNDLES.fetch_add(1, Ordering::Relaxed)
        ));
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&bundle)?;
            file.write_all(&bundle_text)?;
        }
        Ok(Interception {
            credentials: credentials
                .into_iter()
                .map(|credential| Carried {
                    credential,
                    scrubber: OnceLock::new(),
                })
                .collect(),
            issuer: Issuer::new(params, ca_key),
            ca: ca.der().clone(),
            ca_pem,
            leaf_key,
            leaves: Mutex::new(HashMap::new()),
            bundle,
        })
    }

    /// The file the sandbox mounts as its CA bundle.
    pub fn trust_bundle(&self) -> &Path {
        &self.bundle
    }

    /// This CA's certificate (public).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The credential for `host` and `port`, if one applies, with the scrubber of its
    /// secrets.
    pub fn credential_for(
        &self,
        host: &str,
        port: u16,
    ) -> Option<(&Arc<Credential>, &Arc<Scrubber>)> {
        let carried = self
            .credentials
            .iter()
            .find(|c| c.credential.applies_to(host, port))?;
        let scrubber = carried
            .scrubber
            .get_or_init(|| Arc::new(Scrubber::new(carried.credential.secrets())));
        Some((&carried.credential, scrubber))
    }

    pub fn credentials(&self) -> impl Iterator<Item = &str> {
        self.credentials.iter().map(|c| c.credential.name.as_str())
    }

    /// The server side for `host`: a certificate for that name alone, HTTP/1.1 only.
    fn server_config(&self, host: &str) -> io::Result<Arc<rustls::ServerConfig>> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(config.clone());
        }
        let fail = |e: String| io::Error::other(format!("a certificate for {host}: {e}"));
        let now = SystemTime::now();
        let mut params =
            CertificateParams::new(vec![host.to_owned()]).map_err(|e| fail(e.to_string()))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + VALIDITY).into();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|e| fail(e.to_string()))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.ca.clone()], key)
            .map_err(|e| fail(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        leaves.insert(host.to_owned(), config.clone());
        Ok(config)
    }
}

/// Why an intercepted connection stopped before its natural end.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Answer the code with this (no byte of an answer was sent yet), then close.
    Reply {
        status: &'static str,
        denied: bool,
        reason: &'static str,
        detail: String,
    },
    /// Close both ends now.
    Cut {
        denied: bool,
        reason: &'static str,
        detail: Option<String>,
    },
}

impl Stop {
    fn reply(status: &'static str, reason: &'static str, detail: impl Into<String>) -> Stop {
        Stop::Reply {
            status,
            denied: false,
            reason,
            detail: detail.into(),
        }
    }

    fn denied(status: &'static str, reason: &'static str, detail: impl Into<String>) -> Stop {
        Stop::Reply {
            status,
            denied: true,
            reason,
            detail: detail.into(),
        }
    }

    fn cut(reason: &'static str, detail: impl Into<String>) -> Stop {
        Stop::Cut {
            denied: false,
            reason,
            detail: Some(detail.into()),
        }
    }

    fn io(e: io::Error) -> Stop {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Stop::Cut {
                denied: false,
                reason: "idle_timeout",
                detail: None,
            },
            _ => Stop::cut("connection_lost", e.to_string()),
        }
    }
}

/// The byte counts, budgets and idle timeout an intercepted connection is relayed under.
pub(crate) struct Meter<'a> {
    pub bytes_out: &'a AtomicU64,
    pub bytes_in: &'a AtomicU64,
    pub max_out: u64,
    pub max_in: u64,
    /// Longest wait for the upstream's next bytes.
    pub idle: Duration,
    /// This connection's own counts.
    pub out: u64,
    pub inn: u64,
}

impl Meter<'_> {
    fn sent(&mut self, n: usize) -> Result<(), Stop> {
        self.out += n as u64;
        if self.bytes_out.fetch_add(n as u64, Ordering::Relaxed) + n as u64 > self.max_out {
            return Err(Stop::Cut {
                denied: true,
                reason: "bytes_out_budget",
                detail: None,
            });
        }
        Ok(())
    }

    fn received(&mut self, n: usize) -> Result<(), Stop> {
        self.inn += n as u64;
        if self.bytes_in.fetch_add(n as u64, Ordering::Relaxed) + n as u64 > self.max_in {
            return Err(Stop::Cut {
                denied: true,
                reason: "bytes_in_budget",
                detail: None,
            });
        }
        Ok(())
    }
}

/// An upstream whose reads can be made to give up sooner than its idle timeout: what the
/// scrubber holds goes on when it is due, even while the upstream is quiet.
pub(crate) trait Timed {
    fn read_timeout(&self, wait: Duration);
}

impl Timed for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn read_timeout(&self, wait: Duration) {
        let _ = self
            .sock
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))));
    }
}

/// A stream with bytes already read ahead of it (a client's first TLS bytes, sent with its
/// `CONNECT`).
pub(crate) struct Prefixed {
    first: Vec<u8>,
    at: usize,
    pub stream: TcpStream,
}

impl Prefixed {
    pub fn new(first: Vec<u8>, stream: TcpStream) -> Self {
        Prefixed {
            first,
            at: 0,
            stream,
        }
    }
}

impl Read for Prefixed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at < self.first.len() {
            let n = (self.first.len() - self.at).min(buf.len());
            buf[..n].copy_from_slice(&self.first[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        self.stream.read(buf)
    }
}

impl Write for Prefixed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// Completes `conn`'s handshake over `io`.
fn handshake<C, D, S>(conn: &mut C, io: &mut S) -> io::Result<()>
where
    C: std::ops::DerefMut<Target = rustls::ConnectionCommon<D>>,
    S: Read + Write,
{
    while conn.is_handshaking() {
        conn.complete_io(io)?;
    }
    Ok(())
}

/// Opens TLS to the upstream (already connected to the checked address) for `host`,
/// verifying its certificate with the credential's roots.
pub(crate) fn open_upstream(
    credential: &Credential,
    host: &str,
    mut tcp: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, String> {
    let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let mut conn = rustls::ClientConnection::new(credential.upstream.clone(), name)
        .map_err(|e| e.to_string())?;
    handshake(&mut conn, &mut tcp).map_err(|e| e.to_string())?;
    Ok(rustls::StreamOwned::new(conn, tcp))
}

/// Ends the sandbox's TLS for `host` with this leash's certificate. The server name the
/// code sent, when it sent one, must be `host`.
pub(crate) fn accept_client(
    interception: &Interception,
    host: &str,
    mut io: Prefixed,
) -> Result<rustls::StreamOwned<rustls::ServerConnection, Prefixed>, Stop> {
    let config = interception
        .server_config(host)
        .map_err(|e| Stop::cut("tls_failed", e.to_string()))?;
    let mut conn = rustls::ServerConnection::new(config)
        .map_err(|e| Stop::cut("tls_failed", e.to_string()))?;
    handshake(&mut conn, &mut io).map_err(|e| {
        Stop::cut(
            "client_tls",
            format!("the code's TLS handshake failed (does it trust the system CA bundle?): {e}"),
        )
    })?;
    if let Some(sni) = conn.server_name() {
        if !sni.eq_ignore_ascii_case(host) {
            return Err(Stop::Cut {
                denied: true,
                reason: "sni_mismatch",
                detail: Some(format!(
                    "the TLS server name {sni:?} is not {host:?}, the name checked"
                )),
            });
        }
    }
    Ok(rustls::StreamOwned::new(conn, io))
}

/// A side of the relay: a stream, with the bytes read from it but not used yet.
pub(crate) struct Side<S> {
    pub io: S,
    buf: Vec<u8>,
    at: usize,
}

impl<S: Read + Write> Side<S> {
    pub fn new(io: S) -> Self {
        Side {
            io,
            buf: Vec::with_capacity(BUFFER),
            at: 0,
        }
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.at..]
    }

    fn consume(&mut self, n: usize) {
        self.at += n;
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
    }

    /// Reads more; 0 at the end of the stream.
    fn fill(&mut self) -> io::Result<usize> {
        if self.at > 0 {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + BUFFER, 0);
        let n = loop {
            match self.io.read(&mut self.buf[len..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A peer that closes without close_notify ends the stream all the same.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(0),
                other => break other,
            }
        };
        self.buf.truncate(len + *n.as_ref().unwrap_or(&0));
        n
    }

    /// One line (CRLF or LF ended) of what was read, without its end, if it is all there;
    /// for chunk sizes and trailers.
    fn take_line(&mut self) -> Result<Option<Vec<u8>>, Stop> {
        if let Some(i) = self.pending().iter().position(|&b| b == b'\n') {
            let mut line = self.pending()[..i].to_vec();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.consume(i + 1);
            return Ok(Some(line));
        }
        if self.pending().len() > MAX_LINE {
            return Err(Stop::cut("bad_answer", "a chunk line over 4 KiB"));
        }
        Ok(None)
    }
}

/// Reads a head of `role` from `side`: [`None`] if the stream ended before its first byte.
fn read_head<S: Read + Write>(
    side: &mut Side<S>,
    role: Role,
    mut meter: Option<&mut Meter<'_>>,
) -> Result<Option<Head>, Stop> {
    let max = role.max_head();
    let what = match role {
        Role::Request => "request",
        Role::Answer => "answer",
    };
    loop {
        if !side.pending().is_empty() {
            match Head::parse(role, side.pending()) {
                Ok(Some((len, head))) => {
                    side.consume(len);
                    return Ok(Some(head));
                }
                Ok(None) => {}
                Err(e) if role == Role::Request => {
                    return Err(Stop::reply(
                        "400 Bad Request",
                        "bad_request",
                        format!("not an HTTP request: {e}"),
                    ))
                }
                Err(e) => return Err(Stop::cut("bad_answer", format!("not an HTTP answer: {e}"))),
            }
            if side.pending().len() > max {
                return Err(if role == Role::Request {
                    Stop::reply(
                        "431 Request Header Fields Too Large",
                        "bad_request",
                        format!("a request head over {max} bytes"),
                    )
                } else {
                    Stop::cut("bad_answer", format!("an answer head over {max} bytes"))
                });
            }
        }
        let was_empty = side.pending().is_empty();
        let n = side.fill().map_err(|e| {
            if role == Role::Request && was_empty {
                // Waiting for a next request that never comes is the end of the connection.
                Stop::Cut {
                    denied: false,
                    reason: "closed",
                    detail: None,
                }
            } else {
                Stop::io(e)
            }
        })?;
        if n == 0 {
            return if was_empty {
                Ok(None)
            } else {
                Err(Stop::cut(
                    "connection_lost",
                    format!("the {what} head was cut short"),
                ))
            };
        }
        if let Some(m) = meter.as_deref_mut() {
            m.received(n)?;
        }
    }
}

/// Where the code's requests on one intercepted connection go, and what each is told.
pub(crate) struct Relay<'a> {
    pub credential: &'a Credential,
    /// Takes the credential's secrets out of every answer.
    pub scrubber: &'a Arc<Scrubber>,
    pub host: &'a str,
    pub port: u16,
    /// Told about each request that carried the credential.
    pub record: &'a mut dyn FnMut(CredentialRecord),
    /// The record's fields this connection fills in for each request.
    pub template: CredentialRecord,
}

impl Relay<'_> {
    /// Relays requests from `down` (the code) to `up` (the real host) until either closes.
    pub fn run<D: Read + Write, U: Read + Write + Timed>(
        &mut self,
        down: &mut Side<D>,
        up: &mut Side<U>,
        meter: &mut Meter<'_>,
    ) -> Result<(), Stop> {
        loop {
            let Some(head) = read_head(down, Role::Request, None)? else {
                return Ok(());
            };
            let (out_head, mut body, path, keep) = self.request(&head)?;
            if head.tokens("expect").iter().any(|t| t == "100-continue") {
                // Answered here: the upstream is asked nothing it would wait on.
                down.io
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .map_err(Stop::io)?;
            }
            let mut record = self.template.clone();
            record.method = head.first.chars().take(32).collect();
            record.path = path;
            let before = (meter.out, meter.inn);
            let result = self.exchange(down, up, meter, &head, out_head, &mut body, &mut record);
            record.bytes_out = meter.out - before.0;
            record.bytes_in = meter.inn - before.1;
            (self.record)(record);
            let upstream_keeps = result?;
            if !(keep && upstream_keeps) {
                return Ok(());
            }
        }
    }

    /// Checks a request of the code's and makes the head the upstream gets; with its body's
    /// framing, its path for the audit log, and whether the code keeps the connection.
    #[allow(clippy::type_complexity)]
    fn request(&self, head: &Head) -> Result<(Vec<u8>, crate::framing::Body, String, bool), Stop> {
        let method = head.first.as_str();
        if method == "CONNECT" {
            return Err(Stop::reply(
                "405 Method Not Allowed",
                "bad_request",
                "CONNECT inside a tunnel",
            ));
        }
        if head.get("upgrade").next().is_some() {
            return Err(Stop::reply(
                "501 Not Implemented",
                "bad_request",
                "protocol upgrades are not relayed on a connection that carries a credential",
            ));
        }
        let authority = |a: &str| -> Result<(), Stop> {
            let mismatch = || {
                Stop::denied(
                    "421 Misdirected Request",
                    "host_mismatch",
                    format!(
                        "{a:?} is not {}:{}, the host this connection was checked for",
                        self.host, self.port
                    ),
                )
            };
            let (name, port) = match a.rsplit_once(':') {
                Some((n, p)) if !n.contains(':') => (n, p.parse::<u16>().map_err(|_| mismatch())?),
                None => (a, 443),
                _ => return Err(mismatch()),
            };
            let same = airlock_api::egress::normalize(name).as_deref() == Some(self.host)
                && port == self.port;
            if same {
                Ok(())
            } else {
                Err(mismatch())
            }
        };
        let hosts: Vec<&[u8]> = head.get("host").collect();
        let [host] = hosts.as_slice() else {
            return Err(Stop::reply(
                "400 Bad Request",
                "bad_request",
                "a request needs exactly one Host",
            ));
        };
        authority(std::str::from_utf8(host).unwrap_or("\u{fffd}").trim())?;
        let target = head.second.as_str();
        let path = if target.starts_with('/') {
            target.to_owned()
        } else if let Some(rest) = target.strip_prefix("https://") {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            if rest[..end].contains('@') {
                return Err(Stop::reply(
                    "400 Bad Request",
                    "bad_request",
                    "user info in a target",
                ));
            }
            authority(&rest[..end])?;
            match &rest[end..] {
                "" => "/".to_owned(),
                p if p.starts_with('?') => format!("/{p}"),
                p => p.to_owned(),
            }
        } else {
            return Err(Stop::denied(
                "421 Misdirected Request",
                "host_mismatch",
                format!("{target:?}: only a path, or https:// this host"),
            ));
        };
        let body = crate::framing::Body::of(&head.as_httparse())
            .map_err(|e| Stop::reply("400 Bad Request", "bad_request", e.to_string()))?;
        let connection = head.tokens("connection");
        let keep = if head.minor == 0 {
            connection.iter().any(|t| t == "keep-alive")
        } else {
            !connection.iter().any(|t| t == "close")
        };
        let authority_text = if self.port == 443 {
            self.host.to_owned()
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let mut out =
            format!("{method} {path} HTTP/1.1\r\nHost: {authority_text}\r\n").into_bytes();
        // Headers the code's `Connection` names are this hop's, never relayed.
        let named = head.tokens("connection");
        for (name, value) in &head.headers {
            let set_here = self
                .credential
                .headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case(name));
            // Ranges are dropped: two ranges of an answer that echoes the secret, each split
            // inside it, would each hold a part too short to be recognized.
            let dropped = set_here
                || named.iter().any(|n| name.eq_ignore_ascii_case(n))
                || name.eq_ignore_ascii_case("accept-encoding")
                || name.eq_ignore_ascii_case("expect")
                || name.eq_ignore_ascii_case("range")
                || name.eq_ignore_ascii_case("if-range")
                || (HOP_BY_HOP.iter().any(|n| name.eq_ignore_ascii_case(n))
                    && !name.eq_ignore_ascii_case("content-length")
                    && !name.eq_ignore_ascii_case("transfer-encoding"));
            if !dropped {
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        }
        for h in &self.credential.headers {
            out.extend_from_slice(format!("{}: {}\r\n", h.name, h.value).as_bytes());
        }
        // Answers uncompressed: how well an answer that echoes the secret beside the code's
        // guesses compresses would tell the code the secret (BREACH), in its size and in
        // the pieces it comes in. One compressed anyway is decoded before it is scanned.
        out.extend_from_slice(b"Accept-Encoding: identity\r\n");
        if !keep {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        let audited = path
            .split('?')
            .next()
            .unwrap_or("")
            .chars()
            .take(256)
            .collect();
        Ok((out, body, audited, keep))
    }

    /// Sends one request and relays its answer; whether the connection may go on.
    #[allow(clippy::too_many_arguments)]
    fn exchange<D: Read + Write, U: Read + Write + Timed>(
        &self,
        down: &mut Side<D>,
        up: &mut Side<U>,
        meter: &mut Meter<'_>,
        request: &Head,
        out_head: Vec<u8>,
        body: &mut crate::framing::Body,
        record: &mut CredentialRecord,
    ) -> Result<bool, Stop> {
        // The head and the body's first bytes in one write: one TLS record for a small
        // request.
        let mut chunk = out_head;
        loop {
            if !body.done() && down.pending().is_empty() {
                if !chunk.is_empty() {
                    meter.sent(chunk.len())?;
                    up.io.write_all(&chunk).map_err(Stop::io)?;
                    chunk.clear();
                }
                if down.fill().map_err(Stop::io)? == 0 {
                    return Err(Stop::cut(
                        "connection_lost",
                        "the request's body was cut short",
                    ));
                }
            }
            let n = body
                .take(down.pending())
                .map_err(|e| Stop::cut("bad_request", e.to_string()))?;
            chunk.extend_from_slice(&down.pending()[..n]);
            down.consume(n);
            if body.done() {
                break;
            }
        }
        meter.sent(chunk.len())?;
        up.io.write_all(&chunk).map_err(Stop::io)?;
        up.io.flush().map_err(Stop::io)?;

        let scrubber = self.scrubber;
        loop {
            let Some(answer) = read_head(up, Role::Answer, Some(meter))? else {
                return Err(Stop::cut(
                    "connection_lost",
                    "the upstream closed before answering",
                ));
            };
            let status = answer.status();
            record.status = Some(status);
            if status == 101 {
                return Err(Stop::cut("bad_answer", "the upstream switched protocols"));
            }
            let head_only =
                request.first == "HEAD" || status == 204 || status == 304 || status < 200;
            let plan = if head_only {
                Plan::NoBody
            } else {
                plan(&answer)?
            };
            if let Plan::Refuse(coding) = &plan {
                return Err(Stop::reply(
                    "502 Bad Gateway",
                    "unscannable_encoding",
                    format!(
                        "the answer's Content-Encoding {coding:?} cannot be scanned for the \
                         credential's secret (gzip and deflate can)"
                    ),
                ));
            }
            let client_chunked = request.minor >= 1;
            let (mut out, framing) = answer_head(&answer, &plan, client_chunked);
            let upstream_closes = answer.tokens("connection").iter().any(|t| t == "close")
                || answer.minor == 0
                    && !answer
                        .tokens("connection")
                        .iter()
                        .any(|t| t == "keep-alive");
            let mut keep = !upstream_closes && framing != OutFraming::UntilClose;
            if status >= 200 && !keep {
                out.extend_from_slice(b"Connection: close\r\n");
            }
            out.extend_from_slice(b"\r\n");
            record.scrubbed += scrubber.mask(&mut out);
            down.io.write_all(&out).map_err(Stop::io)?;
            if status < 200 {
                continue;
            }
            if !head_only {
                let found = relay_body(down, up, meter, &plan, framing, scrubber)?;
                record.scrubbed += found;
            }
            down.io.flush().map_err(Stop::io)?;
            if framing == OutFraming::UntilClose {
                keep = false;
            }
            return Ok(keep);
        }
    }
}

/// How an answer's body is read, and what it is decoded from.
enum Plan {
    NoBody,
    Body {
        framing: InFraming,
        coding: Coding,
    },
    /// A content coding the proxy cannot read.
    Refuse(String),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum InFraming {
    Length(u64),
    Chunked,
    UntilClose,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OutFraming {
    None,
    /// The same length (masking keeps lengths).
    Length,
    Chunked,
    UntilClose,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coding {
    Identity,
    Gzip,
    Deflate,
}

fn plan(answer: &Head) -> Result<Plan, Stop> {
    let te = answer.tokens("transfer-encoding");
    let lengths: Vec<&[u8]> = answer.get("content-length").collect();
    let framing = if !te.is_empty() {
        if te.last().map(String::as_str) != Some("chunked") || te.len() > 1 {
            return Err(Stop::cut(
                "bad_answer",
                format!("Transfer-Encoding {te:?}: only chunked is relayed"),
            ));
        }
        InFraming::Chunked
    } else if let Some(first) = lengths.first() {
        let parse = |v: &[u8]| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let n = parse(first)
            .ok_or_else(|| Stop::cut("bad_answer", "a Content-Length that is not a number"))?;
        if lengths.iter().any(|v| parse(v) != Some(n)) {
            return Err(Stop::cut("bad_answer", "Content-Lengths that differ"));
        }
        InFraming::Length(n)
    } else {
        InFraming::UntilClose
    };
    let codings: Vec<String> = answer
        .tokens("content-encoding")
        .into_iter()
        .filter(|c| c != "identity")
        .collect();
    let coding = match codings.as_slice() {
        [] => Coding::Identity,
        [c] if c == "gzip" || c == "x-gzip" => Coding::Gzip,
        [c] if c == "deflate" => Coding::Deflate,
        _ => return Ok(Plan::Refuse(codings.join(", "))),
    };
    Ok(Plan::Body { framing, coding })
}

/// The head the code gets: the upstream's, less what the proxy changes of its framing.
fn answer_head(answer: &Head, plan: &Plan, client_chunked: bool) -> (Vec<u8>, OutFraming) {
    let framing = match plan {
        Plan::NoBody | Plan::Refuse(_) => OutFraming::None,
        Plan::Body {
            framing: InFraming::Length(_),
            coding: Coding::Identity,
        } => OutFraming::Length,
        Plan::Body {
            framing: InFraming::UntilClose,
            ..
        } => OutFraming::UntilClose,
        Plan::Body { .. } if client_chunked => OutFraming::Chunked,
        Plan::Body { .. } => OutFraming::UntilClose,
    };
    let decoded = matches!(plan, Plan::Body { coding, .. } if *coding != Coding::Identity);
    let mut out = format!("HTTP/1.1 {} {}\r\n", answer.first, answer.second).into_bytes();
    for (name, value) in &answer.headers {
        let lower = name.to_ascii_lowercase();
        let dropped = match lower.as_str() {
            "connection" | "keep-alive" | "proxy-connection" | "trailer" | "upgrade" => true,
            "transfer-encoding" => framing != OutFraming::None,
            "content-length" => framing != OutFraming::None && framing != OutFraming::Length,
            "content-encoding" | "content-md5" | "digest" | "repr-digest" | "content-digest" => {
                decoded
            }
            _ => false,
        };
        if !dropped {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
    if framing == OutFraming::Chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    (out, framing)
}

/// Where an answer's decoded bytes go, as they come: counted (when the answer was coded: the
/// decoded bytes count against the bytes-in budget, not the compressed ones), scrubbed and
/// framed for the code. A decoder writes at most its buffer's worth at a time, so an answer
/// that inflates a thousandfold is never held whole.
struct Emitter<'a, D> {
    down: &'a mut Side<D>,
    scrub: ScrubStream,
    framing: OutFraming,
    /// The execution's bytes-in account and budget, for a coded answer's decoded bytes.
    counted: Option<(&'a AtomicU64, u64)>,
    decoded: u64,
    /// A coded answer goes on in pieces of this size only (the last one excepted): how a
    /// compressed stream's pieces inflate would tell how well the secret beside the code's
    /// guesses compresses.
    unit: Option<usize>,
    pending: Vec<u8>,
    /// Why writing stopped (the decoder sees only an `io::Error`).
    stop: Option<Stop>,
}

impl<D: Read + Write> Emitter<'_, D> {
    fn send(&mut self, clean: Vec<u8>, last: bool) -> Result<(), Stop> {
        let (clean, unit) = match self.unit {
            Some(unit) => {
                self.pending.extend_from_slice(&clean);
                let whole = if last {
                    self.pending.len()
                } else {
                    self.pending.len() / unit * unit
                };
                let rest = self.pending.split_off(whole);
                (std::mem::replace(&mut self.pending, rest), unit)
            }
            None => (clean, usize::MAX),
        };
        // A coded answer's units each go in a write of their own.
        let mut pieces = clean.chunks(unit).peekable();
        while pieces.peek().is_some() || last {
            let piece = pieces.next().unwrap_or_default();
            let end = last && pieces.peek().is_none();
            let mut out = Vec::with_capacity(piece.len() + 16);
            if self.framing == OutFraming::Chunked {
                if !piece.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                if end {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
            } else {
                out.extend_from_slice(piece);
            }
            if !out.is_empty() {
                self.down.io.write_all(&out).map_err(Stop::io)?;
                // What may be all of a streamed event goes now, not with the next one.
                self.down.io.flush().map_err(Stop::io)?;
            }
            if end {
                break;
            }
        }
        Ok(())
    }

    fn take(&mut self, data: &[u8]) -> Result<(), Stop> {
        let n = data.len() as u64;
        self.decoded += n;
        if let Some((account, max)) = self.counted {
            if account.fetch_add(n, Ordering::Relaxed) + n > max {
                return Err(Stop::Cut {
                    denied: true,
                    reason: "bytes_in_budget",
                    detail: Some("the decoded answer is over the bytes-in budget".into()),
                });
            }
        }
        let clean = self.scrub.feed(data, Instant::now());
        self.send(clean, false)
    }

    /// What the scrubber held long enough goes on.
    fn due(&mut self, now: Instant) -> Result<(), Stop> {
        let clean = self.scrub.due(now);
        self.send(clean, false)
    }

    /// The answer ended: the rest, and the last chunk.
    fn end(&mut self) -> Result<(), Stop> {
        let clean = self.scrub.finish();
        self.send(clean, true)
    }
}

impl<D: Read + Write> Write for Emitter<'_, D> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.stop.is_some() {
            return Err(io::Error::other("stopped"));
        }
        match self.take(data) {
            Ok(()) => Ok(data.len()),
            Err(stop) => {
                self.stop = Some(stop);
                Err(io::Error::other("stopped"))
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Decodes a content coding into `W` as its bytes come.
enum Decoder<W: Write> {
    Identity(W),
    Gzip(flate2::write::MultiGzDecoder<W>),
    Zlib(flate2::write::ZlibDecoder<W>),
    Raw(flate2::write::DeflateDecoder<W>),
    /// Deflate before its first two bytes tell zlib from raw.
    Deflate(Vec<u8>, Option<W>),
}

impl<W: Write> Decoder<W> {
    fn new(coding: Coding, sink: W) -> Self {
        match coding {
            Coding::Identity => Decoder::Identity(sink),
            Coding::Gzip => Decoder::Gzip(flate2::write::MultiGzDecoder::new(sink)),
            Coding::Deflate => Decoder::Deflate(Vec::new(), Some(sink)),
        }
    }

    fn sink(&mut self) -> &mut W {
        match self {
            Decoder::Identity(w) => w,
            Decoder::Gzip(d) => d.get_mut(),
            Decoder::Zlib(d) => d.get_mut(),
            Decoder::Raw(d) => d.get_mut(),
            Decoder::Deflate(_, w) => w.as_mut().expect("the sink until decided"),
        }
    }

    fn feed(&mut self, data: &[u8]) -> io::Result<()> {
        if let Decoder::Deflate(first, sink) = self {
            first.extend_from_slice(data);
            if first.len() < 2 {
                return Ok(());
            }
            // A zlib stream starts with a header whose check bits make it a multiple of 31.
            let zlib =
                first[0] & 0x0f == 8 && (u16::from(first[0]) << 8 | u16::from(first[1])) % 31 == 0;
            let first = std::mem::take(first);
            let sink = sink.take().expect("the sink until decided");
            *self = if zlib {
                Decoder::Zlib(flate2::write::ZlibDecoder::new(sink))
            } else {
                Decoder::Raw(flate2::write::DeflateDecoder::new(sink))
            };
            return self.feed(&first);
        }
        match self {
            Decoder::Identity(w) => w.write_all(data),
            Decoder::Gzip(d) => d.write_all(data),
            Decoder::Zlib(d) => d.write_all(data),
            Decoder::Raw(d) => d.write_all(data),
            Decoder::Deflate(..) => unreachable!("decided above"),
        }
    }

    /// The coded stream ended; `fed`: whether it had any byte (an empty body is empty
    /// whatever its coding says).
    fn finish(&mut self, fed: bool) -> io::Result<()> {
        match self {
            _ if !fed => Ok(()),
            Decoder::Identity(_) => Ok(()),
            Decoder::Gzip(d) => d.try_finish(),
            Decoder::Zlib(d) => d.try_finish(),
            Decoder::Raw(d) => d.try_finish(),
            Decoder::Deflate(..) => Err(io::Error::other("a deflate stream of one byte")),
        }
    }
}

impl<D: Read + Write> Decoder<Emitter<'_, D>> {
    /// Why decoding (or writing what it decoded) failed with `e`: the emitter's own reason,
    /// or the answer's coding.
    fn stop(&mut self, e: io::Error) -> Stop {
        self.sink()
            .stop
            .take()
            .unwrap_or_else(|| Stop::cut("bad_answer", format!("decoding the answer: {e}")))
    }
}

/// Relays an answer's body: read as its framing says, decoded, scrubbed, framed for the
/// code. Returns how many occurrences of the secret were masked.
fn relay_body<D: Read + Write, U: Read + Write + Timed>(
    down: &mut Side<D>,
    up: &mut Side<U>,
    meter: &mut Meter<'_>,
    plan: &Plan,
    framing: OutFraming,
    scrubber: &Arc<Scrubber>,
) -> Result<u64, Stop> {
    let Plan::Body {
        framing: in_framing,
        coding,
    } = plan
    else {
        return Ok(0);
    };
    let coded = *coding != Coding::Identity;
    let emitter = Emitter {
        down,
        scrub: scrubber.stream(),
        framing,
        counted: coded.then_some((meter.bytes_in, meter.max_in)),
        decoded: 0,
        unit: coded.then_some(CODED_UNIT),
        pending: Vec::new(),
        stop: None,
    };
    let mut decoder = Decoder::new(*coding, emitter);
    let mut fed = false;
    let result = (|| -> Result<(), Stop> {
        // Reads more of the answer (`body`: of its body, not its framing). While the
        // scrubber holds bytes, a read waits only until they are due, sends them on, and
        // reads again, up to the idle timeout in all.
        let fill = |up: &mut Side<U>,
                    decoder: &mut Decoder<Emitter<'_, D>>,
                    meter: &mut Meter<'_>,
                    body: bool|
         -> Result<usize, Stop> {
            let asked = Instant::now();
            let n = loop {
                let now = Instant::now();
                let idle_left = meter.idle.saturating_sub(now - asked);
                let due = decoder.sink().scrub.next_due();
                let wait = due.map_or(idle_left, |d| {
                    idle_left.min(d.saturating_duration_since(now))
                });
                up.io.read_timeout(wait);
                match up.fill() {
                    Ok(n) => break n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) && due.is_some()
                            && asked.elapsed() < meter.idle =>
                    {
                        decoder.sink().due(Instant::now())?;
                    }
                    Err(e) => return Err(Stop::io(e)),
                }
            };
            if coded && body {
                // A coded answer's compressed bytes are not counted: its decoded ones are.
                meter.inn += n as u64;
            } else {
                meter.received(n)?;
            }
            Ok(n)
        };
        // A chunk-size or trailer line.
        let line = |up: &mut Side<U>,
                    decoder: &mut Decoder<Emitter<'_, D>>,
                    meter: &mut Meter<'_>|
         -> Result<Vec<u8>, Stop> {
            loop {
                if let Some(line) = up.take_line()? {
                    return Ok(line);
                }
                if fill(up, decoder, meter, false)? == 0 {
                    return Err(Stop::cut(
                        "bad_answer",
                        "the answer ended inside a chunk line",
                    ));
                }
            }
        };
        let pass = |decoder: &mut Decoder<Emitter<'_, D>>,
                    fed: &mut bool,
                    piece: &[u8]|
         -> Result<(), Stop> {
            *fed |= !piece.is_empty();
            decoder.feed(piece).map_err(|e| decoder.stop(e))
        };
        // `left` bytes of body (a length's or a chunk's), or all until the close.
        let mut relay = |up: &mut Side<U>,
                         decoder: &mut Decoder<Emitter<'_, D>>,
                         meter: &mut Meter<'_>,
                         left: Option<u64>|
         -> Result<(), Stop> {
            let mut left = left;
            while left != Some(0) {
                if up.pending().is_empty() && fill(up, decoder, meter, true)? == 0 {
                    return match left {
                        None => Ok(()),
                        Some(_) => Err(Stop::cut(
                            "connection_lost",
                            "the answer's body was cut short",
                        )),
                    };
                }
                let n = left.map_or(up.pending().len(), |l| {
                    (up.pending().len() as u64).min(l) as usize
                });
                pass(decoder, &mut fed, &up.pending()[..n])?;
                up.consume(n);
                left = left.map(|l| l - n as u64);
            }
            Ok(())
        };
        match *in_framing {
            InFraming::Length(left) => relay(up, &mut decoder, meter, Some(left))?,
            InFraming::UntilClose => relay(up, &mut decoder, meter, None)?,
            InFraming::Chunked => loop {
                let line_bytes = line(up, &mut decoder, meter)?;
                let text = String::from_utf8_lossy(&line_bytes);
                let size = text.split(';').next().unwrap_or("").trim();
                let left = u64::from_str_radix(size, 16)
                    .map_err(|_| Stop::cut("bad_answer", "a chunk size that is not hex"))?;
                if left == 0 {
                    // Trailers are dropped: the code gets the body, re-framed.
                    while !line(up, &mut decoder, meter)?.is_empty() {}
                    break;
                }
                relay(up, &mut decoder, meter, Some(left))?;
                if !line(up, &mut decoder, meter)?.is_empty() {
                    return Err(Stop::cut("bad_answer", "a chunk not followed by CRLF"));
                }
            },
        }
        decoder.finish(fed).map_err(|e| decoder.stop(e))?;
        decoder.sink().end()
    })();
    // The next answer's head is read with the idle timeout again.
    up.io.read_timeout(meter.idle);
    let found = decoder.sink().scrub.found;
    result.map(|()| found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::SetHeader;

    const SECRET: &str = "s3cr3t/Tok+en=42";
    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: api.test\r\nAccept-Encoding: gzip, br\r\n\r\n";

    /// A peer that gives its bytes `step` at a time and keeps (the start of) what it is sent.
    struct Peer {
        input: Vec<u8>,
        at: usize,
        step: usize,
        output: Vec<u8>,
        largest_write: usize,
        /// The size of each write, in order.
        writes: Vec<usize>,
    }

    impl Timed for Peer {
        fn read_timeout(&self, _: Duration) {}
    }

    impl Read for Peer {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = (self.input.len() - self.at).min(buf.len()).min(self.step);
            buf[..n].copy_from_slice(&self.input[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    impl Write for Peer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.output.len() < 1 << 20 {
                self.output.extend_from_slice(buf);
            }
            self.largest_write = self.largest_write.max(buf.len());
            self.writes.push(buf.len());
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn peer(input: &[u8], step: usize) -> Side<Peer> {
        Side::new(Peer {
            input: input.to_vec(),
            at: 0,
            step,
            output: Vec::new(),
            largest_write: 0,
            writes: Vec::new(),
        })
    }

    fn credential() -> Credential {
        let upstream = upstream_config(rustls::RootCertStore::empty()).unwrap();
        Credential::new(
            "api",
            vec![airlock_api::egress::HostRule {
                host: "api.test".into(),
                ports: vec![443],
            }],
            vec![SetHeader {
                name: "Authorization".into(),
                value: format!("Bearer {SECRET}"),
                secret: SECRET.into(),
            }],
            Arc::new(upstream),
        )
        .unwrap()
    }

    struct Relayed {
        code: Side<Peer>,
        upstream: Side<Peer>,
        result: Result<(), Stop>,
        counted_in: u64,
    }

    /// The code sends `requests`, the upstream answers `answers`, each `step` bytes a read.
    fn relay(requests: &[u8], answers: &[u8], step: usize, max_in: u64) -> Relayed {
        let credential = credential();
        let mut told = |_: CredentialRecord| {};
        let (out, inn) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut meter = Meter {
            bytes_out: &out,
            bytes_in: &inn,
            max_out: u64::MAX,
            max_in,
            idle: Duration::from_secs(10),
            out: 0,
            inn: 0,
        };
        let mut code = peer(requests, step);
        let mut upstream = peer(answers, step);
        let scrubber = Arc::new(Scrubber::new(credential.secrets()));
        let result = Relay {
            credential: &credential,
            scrubber: &scrubber,
            host: "api.test",
            port: 443,
            record: &mut told,
            template: CredentialRecord::template(None, None, "k", "api", "api.test", 443),
        }
        .run(&mut code, &mut upstream, &mut meter);
        Relayed {
            code,
            upstream,
            result,
            counted_in: inn.load(Ordering::Relaxed),
        }
    }

    fn answer(coding: &str, body: &[u8]) -> Vec<u8> {
        let mut a = format!(
            "HTTP/1.1 200 OK\r\nContent-Encoding: {coding}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        a.extend_from_slice(body);
        a
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// The body the code got, de-chunked.
    fn body(code: &[u8]) -> Vec<u8> {
        let text = code.split(|&b| b == 0).next().unwrap();
        let at = text.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut rest = &text[at..];
        let mut out = Vec::new();
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
            if size == 0 {
                return out;
            }
            out.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest = &rest[line_end + 2 + size + 2..];
        }
    }

    #[test]
    fn the_upstream_is_asked_for_answers_it_need_not_compress() {
        let r = relay(GET, &answer("identity", b"ok"), 1 << 15, 1 << 30);
        r.result.unwrap();
        let sent = String::from_utf8(r.upstream.io.output).unwrap();
        assert!(sent.contains("Accept-Encoding: identity\r\n"), "{sent}");
        assert!(!sent.contains("gzip"), "{sent}");
        assert!(sent.contains(&format!("Authorization: Bearer {SECRET}\r\n")));
    }

    #[test]
    fn a_coded_answer_inflates_in_bounded_pieces_counted_as_decoded() {
        // 64 MiB of zeros in 65 KB of gzip: never held whole, counted as what the code gets.
        let zeros = gzip(&vec![0u8; 64 << 20]);
        let r = relay(GET, &answer("gzip", &zeros), 1 << 15, 1 << 30);
        r.result.unwrap();
        assert!(
            r.code.io.largest_write <= 64 << 10,
            "{}",
            r.code.io.largest_write
        );
        assert!(r.counted_in >= 64 << 20, "{}", r.counted_in);
        // Past the budget, decoded bytes cut the connection.
        let r = relay(GET, &answer("gzip", &zeros), 1 << 15, 8 << 20);
        assert!(
            matches!(
                r.result,
                Err(Stop::Cut {
                    reason: "bytes_in_budget",
                    ..
                })
            ),
            "{:?}",
            r.result
        );
    }

    #[test]
    fn every_valid_coding_is_relayed_whole() {
        let mut two = gzip(b"first member, ");
        two.extend(gzip(b"second member"));
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(b"zlib, a byte at a time").unwrap();
        let zlib = z.finish().unwrap();
        let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        d.write_all(b"raw deflate").unwrap();
        let raw = d.finish().unwrap();
        for (coding, coded, plain, step) in [
            ("gzip", two, &b"first member, second member"[..], 1 << 15),
            ("deflate", zlib, b"zlib, a byte at a time", 1),
            ("deflate", raw, b"raw deflate", 1 << 15),
            ("gzip", Vec::new(), b"", 1 << 15),
        ] {
            let r = relay(GET, &answer(coding, &coded), step, 1 << 30);
            assert!(r.result.is_ok(), "{coding}: {:?}", r.result);
            assert_eq!(body(&r.code.io.output), plain, "{coding}");
        }
    }

    #[test]
    fn a_secret_in_a_coded_or_streamed_answer_is_masked_and_events_are_not_held() {
        let echo = format!("{{\"authorization\": \"Bearer {SECRET}\"}}");
        let r = relay(GET, &answer("gzip", &gzip(echo.as_bytes())), 3, 1 << 30);
        r.result.unwrap();
        let got = String::from_utf8(body(&r.code.io.output)).unwrap();
        assert_eq!(
            got,
            format!(
                "{{\"authorization\": \"Bearer {}\"}}",
                "*".repeat(SECRET.len())
            )
        );
    }

    #[test]
    fn the_pieces_of_an_answer_never_depend_on_whether_it_ends_with_part_of_the_secret() {
        // The code asks for answers that end with its guess: a prefix of the secret, and
        // another of the same length. Content-Length, chunked and close-delimited answers,
        // read in pieces of every size: the code gets the same writes of the same sizes.
        let pattern = |guess: &str, framing: &str, step: usize| -> Vec<usize> {
            let body = format!("hello {guess}");
            let answer = match framing {
                "length" => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
                "chunked" => format!(
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n{:x}\r\n{guess}\r\n0\r\n\r\n",
                    guess.len()
                ),
                _ => format!("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{body}"),
            };
            let r = relay(GET, answer.as_bytes(), step, 1 << 30);
            r.result.unwrap();
            assert!(String::from_utf8_lossy(&r.code.io.output).contains(guess));
            r.code.io.writes
        };
        for framing in ["length", "chunked", "close"] {
            for step in [1, 2, 3, 5, 9, 64, 1 << 15] {
                for (right, wrong) in [("s3cr", "zzzz"), ("s3cr3t/Tok+en=4", "xxxxxxxxxxxxxxx")] {
                    assert_eq!(
                        pattern(right, framing, step),
                        pattern(wrong, framing, step),
                        "{framing}, {step} a read: {right:?} against {wrong:?}"
                    );
                }
            }
        }
    }
}
