//! Credentials kept on the host: read once at start (`[credentials.NAME]`), granted to keys,
//! narrowed per request, and set by the egress proxy on requests to their hosts
//! (`airlock_egress::intercept`). Each use is audited and counted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_egress::{Credential, SetHeader};

use crate::config::{Config, CredentialConfig};
use crate::error::Error;
use crate::keys::Key;

/// The configured credentials with their values read, and where each sandbox's trust
/// bundle (the host's CA bundle and its leash's CA) is written.
#[derive(Debug, Default)]
pub struct Credentials {
    by_name: BTreeMap<String, Arc<Credential>>,
    trust_dir: PathBuf,
}

impl Credentials {
    /// Reads every credential's values (host environment variables or files) and the CA
    /// certificates that verify its hosts; errors name the credential and the source, never
    /// a value. `trust_dir` is emptied: bundles left by a server that was killed go.
    pub fn load(config: &Config, trust_dir: &Path) -> Result<Credentials, String> {
        let mut by_name = BTreeMap::new();
        for (name, c) in &config.credentials {
            by_name.insert(name.clone(), Arc::new(read(name, c)?));
        }
        if !by_name.is_empty() {
            let _ = std::fs::remove_dir_all(trust_dir);
            std::fs::create_dir_all(trust_dir)
                .map_err(|e| format!("credentials: {}: {e}", trust_dir.display()))?;
        }
        Ok(Credentials {
            by_name,
            trust_dir: trust_dir.to_owned(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Whether every credential `keys` are granted was read at start (a reload reads keys
    /// only: a credential added with it needs a restart).
    pub fn check_grants(&self, keys: &[Arc<Key>]) -> Result<(), String> {
        for key in keys {
            if let Some(name) = key
                .config
                .credentials
                .iter()
                .find(|n| !self.by_name.contains_key(*n))
            {
                return Err(format!(
                    "key `{}` is granted credential {name:?}, which was not read at start \
                     (a new [credentials.NAME] needs a restart)",
                    key.name()
                ));
            }
        }
        Ok(())
    }
}

/// One credential, read.
pub fn read(name: &str, c: &CredentialConfig) -> Result<Credential, String> {
    let whose = format!("credentials.{name}");
    let mut headers = Vec::new();
    for (header, value) in &c.headers {
        let (value, secret) = value
            .read()
            .map_err(|m| format!("{whose}.headers.{header}: {m}"))?;
        headers.push(SetHeader {
            name: header.clone(),
            value,
            secret,
        });
    }
    let mut roots = rustls::RootCertStore::empty();
    match &c.ca_file {
        Some(path) => {
            use rustls::pki_types::pem::PemObject;
            let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("{whose}.ca_file {}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("{whose}.ca_file {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("{whose}.ca_file {}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    if roots.is_empty() {
        return Err(format!(
            "{whose}: no CA certificate to verify its hosts with (the host's bundle is \
             empty; give `ca_file`)"
        ));
    }
    let upstream =
        airlock_egress::intercept::upstream_config(roots).map_err(|m| format!("{whose}: {m}"))?;
    Credential::new(name, c.hosts.clone(), headers, Arc::new(upstream))
}

impl Credentials {
    /// The credentials an execution or session of `key` may use: those it asks for (each
    /// granted to the key), or all of the key's when it asks for none.
    pub fn for_request(
        &self,
        key: &Key,
        asked: Option<Vec<String>>,
    ) -> Result<Vec<Arc<Credential>>, Error> {
        let granted = &key.config.credentials;
        let names = match asked {
            None => granted.clone(),
            Some(asked) => {
                if let Some(wider) = asked.iter().find(|n| !granted.contains(n)) {
                    return Err(Error::forbidden(format!(
                        "credential {wider:?} is not granted to key `{}`",
                        key.name()
                    ))
                    .field("credentials"));
                }
                asked
            }
        };
        names
            .iter()
            .map(|n| {
                self.by_name.get(n).cloned().ok_or_else(|| {
                    Error::internal(format!("credential {n:?} granted but not loaded"))
                })
            })
            .collect()
    }

    /// The interception of a leash whose requests may carry `credentials`: a CA of its own and
    /// its sandbox's trust bundle.
    pub fn interception(
        &self,
        credentials: Vec<Arc<Credential>>,
    ) -> Result<Arc<airlock_egress::Interception>, Error> {
        airlock_egress::Interception::new(credentials, &self.trust_dir)
            .map(Arc::new)
            .map_err(|e| Error::internal(format!("the credential proxy's CA: {e}")))
    }
}
