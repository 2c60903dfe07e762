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
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, GeneralSubtree, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use crate::credentials::{Credential, CredentialRecord, ScrubStream, HOP_BY_HOP};

/// The host's CA bundle, which the sandbox's trust store extends.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Largest request head read on an intercepted connection.
const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// Largest answer head; a longer one cuts the connection.
const MAX_ANSWER_HEAD: usize = 64 * 1024;
const MAX_REQUEST_HEADERS: usize = 64;
const MAX_ANSWER_HEADERS: usize = 128;
/// Longest chunk-size or trailer line of an answer.
const MAX_LINE: usize = 4096;
const BUFFER: usize = 32 * 1024;
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

/// One leash's interception: its credentials, its CA, the certificates made so far, and
/// the trust bundle its sandbox mounts.
pub struct Interception {
    credentials: Vec<Arc<Credential>>,
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
            credentials,
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

    /// The credential for `host` and `port`, if one applies.
    pub fn credential_for(&self, host: &str, port: u16) -> Option<&Arc<Credential>> {
        self.credentials.iter().find(|c| c.applies_to(host, port))
    }

    pub fn credentials(&self) -> impl Iterator<Item = &str> {
        self.credentials.iter().map(|c| c.name.as_str())
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

/// The byte counts and budgets an intercepted connection is relayed under.
pub(crate) struct Meter<'a> {
    pub bytes_out: &'a AtomicU64,
    pub bytes_in: &'a AtomicU64,
    pub max_out: u64,
    pub max_in: u64,
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

    /// One line (CRLF or LF ended), without its end; for chunk sizes and trailers.
    fn line(&mut self, meter: Option<&mut Meter<'_>>) -> Result<Vec<u8>, Stop> {
        let mut meter = meter;
        loop {
            if let Some(i) = self.pending().iter().position(|&b| b == b'\n') {
                let mut line = self.pending()[..i].to_vec();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.consume(i + 1);
                return Ok(line);
            }
            if self.pending().len() > MAX_LINE {
                return Err(Stop::cut("bad_answer", "a chunk line over 4 KiB"));
            }
            let n = self.fill().map_err(Stop::io)?;
            if n == 0 {
                return Err(Stop::cut(
                    "bad_answer",
                    "the answer ended inside a chunk line",
                ));
            }
            if let Some(m) = meter.as_deref_mut() {
                m.received(n)?;
            }
        }
    }
}

/// A head as read: its first line's parts and its headers.
struct Head {
    /// The method, or for an answer the status code.
    first: String,
    /// The target, or for an answer the reason phrase.
    second: String,
    minor: u8,
    headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    fn get<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Comma-separated tokens of every `name` header, lower-case.
    fn tokens(&self, name: &str) -> Vec<String> {
        self.get(name)
            .flat_map(|v| {
                String::from_utf8_lossy(v)
                    .split(',')
                    .map(|t| t.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .filter(|t| !t.is_empty())
            .collect()
    }

    fn as_httparse(&self) -> Vec<httparse::Header<'_>> {
        self.headers
            .iter()
            .map(|(n, v)| httparse::Header {
                name: n.as_str(),
                value: v.as_slice(),
            })
            .collect()
    }
}

/// Reads a head from `side`: [`None`] if the stream ended before its first byte.
fn read_head<S: Read + Write>(
    side: &mut Side<S>,
    request: bool,
    mut meter: Option<&mut Meter<'_>>,
) -> Result<Option<Head>, Stop> {
    let (max, what) = if request {
        (MAX_REQUEST_HEAD, "request")
    } else {
        (MAX_ANSWER_HEAD, "answer")
    };
    loop {
        if !side.pending().is_empty() {
            let parsed = if request {
                let mut headers = [httparse::EMPTY_HEADER; MAX_REQUEST_HEADERS];
                let mut req = httparse::Request::new(&mut headers);
                match req.parse(side.pending()) {
                    Ok(httparse::Status::Complete(len)) => Some((
                        len,
                        Head {
                            first: req.method.unwrap_or_default().to_owned(),
                            second: req.path.unwrap_or_default().to_owned(),
                            minor: req.version.unwrap_or(1),
                            headers: owned(req.headers),
                        },
                    )),
                    Ok(httparse::Status::Partial) => None,
                    Err(e) => {
                        return Err(Stop::reply(
                            "400 Bad Request",
                            "bad_request",
                            format!("not an HTTP request: {e}"),
                        ))
                    }
                }
            } else {
                let mut headers = [httparse::EMPTY_HEADER; MAX_ANSWER_HEADERS];
                let mut res = httparse::Response::new(&mut headers);
                match res.parse(side.pending()) {
                    Ok(httparse::Status::Complete(len)) => Some((
                        len,
                        Head {
                            first: res.code.unwrap_or_default().to_string(),
                            second: res.reason.unwrap_or_default().to_owned(),
                            minor: res.version.unwrap_or(1),
                            headers: owned(res.headers),
                        },
                    )),
                    Ok(httparse::Status::Partial) => None,
                    Err(e) => {
                        return Err(Stop::cut("bad_answer", format!("not an HTTP answer: {e}")))
                    }
                }
            };
            if let Some((len, head)) = parsed {
                side.consume(len);
                return Ok(Some(head));
            }
            if side.pending().len() > max {
                return Err(if request {
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
            if request && was_empty {
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

fn owned(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect()
}

/// Where the code's requests on one intercepted connection go, and what each is told.
pub(crate) struct Relay<'a> {
    pub credential: &'a Credential,
    pub host: &'a str,
    pub port: u16,
    /// Told about each request that carried the credential.
    pub record: &'a mut dyn FnMut(CredentialRecord),
    /// The record's fields this connection fills in for each request.
    pub template: CredentialRecord,
}

impl Relay<'_> {
    /// Relays requests from `down` (the code) to `up` (the real host) until either closes.
    pub fn run<D: Read + Write, U: Read + Write>(
        &mut self,
        down: &mut Side<D>,
        up: &mut Side<U>,
        meter: &mut Meter<'_>,
    ) -> Result<(), Stop> {
        loop {
            let Some(head) = read_head(down, true, None)? else {
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
            record.method = head.first.clone();
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
            let same = crate::normalize(name).as_deref() == Some(self.host) && port == self.port;
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
        // What the proxy can take the secret out of: gzip and deflate, or nothing.
        let accepted: Vec<String> = head
            .tokens("accept-encoding")
            .into_iter()
            .filter_map(|t| {
                let coding = t.split(';').next().unwrap_or("").trim().to_owned();
                ["gzip", "x-gzip", "deflate"]
                    .contains(&coding.as_str())
                    .then_some(coding)
            })
            .collect();
        let authority_text = if self.port == 443 {
            self.host.to_owned()
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let mut out =
            format!("{method} {path} HTTP/1.1\r\nHost: {authority_text}\r\n").into_bytes();
        for (name, value) in &head.headers {
            let set_here = self
                .credential
                .headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case(name));
            let dropped = set_here
                || name.eq_ignore_ascii_case("accept-encoding")
                || name.eq_ignore_ascii_case("expect")
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
        let encodings = if accepted.is_empty() {
            "identity".to_owned()
        } else {
            accepted.join(", ")
        };
        out.extend_from_slice(format!("Accept-Encoding: {encodings}\r\n").as_bytes());
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
    fn exchange<D: Read + Write, U: Read + Write>(
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

        let scrubber = self.credential.scrubber().clone();
        loop {
            let Some(answer) = read_head(up, false, Some(meter))? else {
                return Err(Stop::cut(
                    "connection_lost",
                    "the upstream closed before answering",
                ));
            };
            let status: u16 = answer.first.parse().unwrap_or(0);
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
                let found = relay_body(down, up, meter, &plan, framing, &scrubber)?;
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

/// Decodes a content coding as its bytes come.
enum Decoder {
    Identity,
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Zlib(flate2::write::ZlibDecoder<Vec<u8>>),
    Raw(flate2::write::DeflateDecoder<Vec<u8>>),
    /// Deflate before its first bytes tell zlib from raw.
    Deflate,
}

impl Decoder {
    fn feed(&mut self, data: &[u8]) -> io::Result<Vec<u8>> {
        if let Decoder::Deflate = self {
            if data.is_empty() {
                return Ok(Vec::new());
            }
            // A zlib stream starts with a header whose check bits make it a multiple of 31.
            let zlib = data.len() >= 2
                && data[0] & 0x0f == 8
                && (u16::from(data[0]) << 8 | u16::from(data[1])) % 31 == 0;
            *self = if zlib {
                Decoder::Zlib(flate2::write::ZlibDecoder::new(Vec::new()))
            } else {
                Decoder::Raw(flate2::write::DeflateDecoder::new(Vec::new()))
            };
        }
        let out = match self {
            Decoder::Identity | Decoder::Deflate => return Ok(data.to_vec()),
            Decoder::Gzip(d) => {
                d.write_all(data)?;
                std::mem::take(d.get_mut())
            }
            Decoder::Zlib(d) => {
                d.write_all(data)?;
                std::mem::take(d.get_mut())
            }
            Decoder::Raw(d) => {
                d.write_all(data)?;
                std::mem::take(d.get_mut())
            }
        };
        Ok(out)
    }

    fn finish(&mut self) -> io::Result<Vec<u8>> {
        match self {
            Decoder::Identity | Decoder::Deflate => Ok(Vec::new()),
            Decoder::Gzip(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Zlib(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
            Decoder::Raw(d) => {
                d.try_finish()?;
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }
}

/// Relays an answer's body: read as its framing says, decoded, scrubbed, framed for the
/// code. Returns how many occurrences of the secret were masked.
fn relay_body<D: Read + Write, U: Read + Write>(
    down: &mut Side<D>,
    up: &mut Side<U>,
    meter: &mut Meter<'_>,
    plan: &Plan,
    framing: OutFraming,
    scrubber: &Arc<crate::credentials::Scrubber>,
) -> Result<u64, Stop> {
    let Plan::Body {
        framing: in_framing,
        coding,
    } = plan
    else {
        return Ok(0);
    };
    let mut decoder = match coding {
        Coding::Identity => Decoder::Identity,
        Coding::Gzip => Decoder::Gzip(flate2::write::GzDecoder::new(Vec::new())),
        Coding::Deflate => Decoder::Deflate,
    };
    let mut scrub: ScrubStream = scrubber.stream();
    // Decoded bytes count against the same budget as bytes received: a small answer that
    // inflates to gigabytes is cut like a large one.
    let mut decoded_total = 0u64;
    let max_decoded = meter.max_in;
    let mut emit = |down: &mut Side<D>, data: &[u8], last: bool| -> Result<(), Stop> {
        let mut out = Vec::with_capacity(data.len() + 16);
        let clean = if last {
            let mut v = scrub.feed(data);
            v.extend(scrub.finish());
            v
        } else {
            scrub.feed(data)
        };
        if framing == OutFraming::Chunked {
            if !clean.is_empty() {
                out.extend_from_slice(format!("{:x}\r\n", clean.len()).as_bytes());
                out.extend_from_slice(&clean);
                out.extend_from_slice(b"\r\n");
            }
            if last {
                out.extend_from_slice(b"0\r\n\r\n");
            }
        } else {
            out = clean;
        }
        if !out.is_empty() {
            down.io.write_all(&out).map_err(Stop::io)?;
        }
        Ok(())
    };
    let mut decode = |data: &[u8], decoded_total: &mut u64| -> Result<Vec<u8>, Stop> {
        let out = decoder
            .feed(data)
            .map_err(|e| Stop::cut("bad_answer", format!("decoding the answer: {e}")))?;
        *decoded_total += out.len() as u64;
        if *decoded_total > max_decoded {
            return Err(Stop::Cut {
                denied: true,
                reason: "bytes_in_budget",
                detail: Some("the decoded answer is over the bytes-in budget".into()),
            });
        }
        Ok(out)
    };
    match *in_framing {
        InFraming::Length(mut left) => {
            while left > 0 {
                if up.pending().is_empty() {
                    let n = up.fill().map_err(Stop::io)?;
                    if n == 0 {
                        return Err(Stop::cut(
                            "connection_lost",
                            "the answer's body was cut short",
                        ));
                    }
                    meter.received(n)?;
                }
                let n = (up.pending().len() as u64).min(left) as usize;
                let piece = up.pending()[..n].to_vec();
                up.consume(n);
                left -= n as u64;
                let data = decode(&piece, &mut decoded_total)?;
                emit(down, &data, false)?;
            }
        }
        InFraming::UntilClose => loop {
            if up.pending().is_empty() {
                let n = up.fill().map_err(Stop::io)?;
                if n == 0 {
                    break;
                }
                meter.received(n)?;
            }
            let piece = up.pending().to_vec();
            up.consume(piece.len());
            let data = decode(&piece, &mut decoded_total)?;
            emit(down, &data, false)?;
        },
        InFraming::Chunked => loop {
            let line = up.line(Some(meter))?;
            let size_text = String::from_utf8_lossy(&line);
            let size_text = size_text.split(';').next().unwrap_or("").trim();
            let mut left = u64::from_str_radix(size_text, 16)
                .map_err(|_| Stop::cut("bad_answer", format!("a chunk size {size_text:?}")))?;
            if left == 0 {
                // Trailers are dropped: the code gets the body, re-framed.
                while !up.line(Some(meter))?.is_empty() {}
                break;
            }
            while left > 0 {
                if up.pending().is_empty() {
                    let n = up.fill().map_err(Stop::io)?;
                    if n == 0 {
                        return Err(Stop::cut(
                            "connection_lost",
                            "the answer's body was cut short",
                        ));
                    }
                    meter.received(n)?;
                }
                let n = (up.pending().len() as u64).min(left) as usize;
                let piece = up.pending()[..n].to_vec();
                up.consume(n);
                left -= n as u64;
                let data = decode(&piece, &mut decoded_total)?;
                emit(down, &data, false)?;
            }
            if !up.line(Some(meter))?.is_empty() {
                return Err(Stop::cut("bad_answer", "a chunk not followed by CRLF"));
            }
        },
    }
    let rest = decoder
        .finish()
        .map_err(|e| Stop::cut("bad_answer", format!("decoding the answer: {e}")))?;
    emit(down, &rest, true)?;
    Ok(scrub.found)
}
