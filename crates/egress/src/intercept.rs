//! Connections to a host with a credential: the proxy ends the sandbox's TLS with a
//! certificate from a CA of this leash's own (made with the leash; its key never leaves the
//! host's memory) and opens its own TLS connection to the address it checked, verifying the
//! real certificate for the checked name. What goes over them, request by request, is
//! [`crate::relay`]'s.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, GeneralSubtree, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use crate::credentials::Credential;
use crate::scrub::Scrubber;
use crate::side::Timed;
use crate::stop::Stop;

/// The host's CA bundle, which the sandbox's trust store extends.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
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
