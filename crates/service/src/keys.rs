//! API keys: only their SHA-256 is ever stored; a presented key is hashed and compared with
//! every configured hash in constant time. Keys are 256 random bits, so a fast hash is enough.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_api::hex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{KeyConfig, Scope};

/// Keys the server made itself, kept in the state directory (hashes only).
const KEYS_FILE: &str = "keys.json";

/// A configured key, as the server holds it.
#[derive(Debug)]
pub struct Key {
    pub config: KeyConfig,
    hash: [u8; 32],
    /// The tools its code may call (`config.tools`, parsed).
    pub grants: airlock_tools::Grants,
}

impl Key {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The first 16 hex digits of the key's SHA-256 (not secret: the hash is configuration).
    pub fn fingerprint(&self) -> String {
        hex(&self.hash[..8])
    }

    pub fn allows(&self, scope: Scope) -> bool {
        self.config.scopes.contains(&scope)
    }
}

/// The keys the server accepts; replaced whole when they are reloaded (SIGHUP).
#[derive(Debug)]
pub struct KeyStore {
    keys: std::sync::RwLock<Arc<Vec<Arc<Key>>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// `sha256:` and the hex digest of `key`, as configured and stored.
pub fn hash_key(key: &str) -> String {
    format!("sha256:{}", airlock_api::sha256_hex(key.as_bytes()))
}

fn parse_hash(hash: &str) -> Option<[u8; 32]> {
    let hex = hash.strip_prefix("sha256:")?;
    let mut out = [0u8; 32];
    for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(chunk).ok()?;
        *out.get_mut(i)? = u8::from_str_radix(s, 16).ok()?;
    }
    (hex.len() == 64).then_some(out)
}

/// `n` bytes from the kernel's random source (getrandom(2): ids are made several times a
/// request, and need no file opened each time).
pub fn random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(buf)
}

/// A new key: `ak_` and 256 random bits in hex.
pub fn generate_key() -> std::io::Result<String> {
    Ok(format!("ak_{}", hex(&random_bytes(32)?)))
}

/// A random identifier with a prefix, for executions and requests.
pub fn random_id(prefix: &str) -> String {
    let bytes = random_bytes(12).unwrap_or_else(|_| {
        // getrandom(2) cannot fail on a host that runs sandboxes; keep ids unique anyway.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos().to_le_bytes()[..12].to_vec()
    });
    format!("{prefix}{}", hex(&bytes))
}

/// An id for what this server holds (a session, an execution): `se_` and 96 random bits, or
/// with a replica name `se_<replica>_<hex>`, which a balancer in front of several replicas
/// routes on (docs/deploying.md "Several replicas").
pub fn held_id(prefix: &str, replica: Option<&str>) -> String {
    match replica {
        Some(replica) => random_id(&format!("{prefix}{replica}_")),
        None => random_id(prefix),
    }
}

/// The replica an id from [`held_id`] names, if it names one.
pub fn replica_of(id: &str) -> Option<&str> {
    let rest = id.get(3..)?;
    rest.rsplit_once('_').map(|(replica, _)| replica)
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the compiler from turning the fold back into an early exit.
    std::hint::black_box(diff) == 0
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredKey {
    name: String,
    hash: String,
    created_at: String,
}

/// The keys to serve with, and a key to show the operator once if one was just made.
#[derive(Debug)]
pub struct Resolved {
    pub store: KeyStore,
    pub generated: Option<String>,
}

impl KeyStore {
    pub fn new(configs: Vec<KeyConfig>) -> Result<Self, KeyError> {
        let keys = configs
            .into_iter()
            .map(|config| {
                let hash = parse_hash(&config.hash)
                    .ok_or_else(|| KeyError::Invalid(format!("key {}: bad hash", config.name)))?;
                let grants = airlock_tools::Grants::parse(&config.tools)
                    .map_err(|e| KeyError::Invalid(format!("key {}: {e}", config.name)))?;
                Ok(Arc::new(Key {
                    config,
                    hash,
                    grants,
                }))
            })
            .collect::<Result<Vec<Arc<Key>>, KeyError>>()?;
        // Two entries for one key: the first match would win, and with it its limits.
        for (i, a) in keys.iter().enumerate() {
            if let Some(b) = keys[..i].iter().find(|b| b.hash == a.hash) {
                return Err(KeyError::Invalid(format!(
                    "keys {} and {} are the same key (same hash)",
                    b.name(),
                    a.name()
                )));
            }
        }
        Ok(KeyStore {
            keys: std::sync::RwLock::new(Arc::new(keys)),
        })
    }

    /// The key whose hash matches, comparing against every key so that timing says nothing.
    pub fn verify(&self, presented: &str) -> Option<Arc<Key>> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for key in self.keys().iter() {
            if constant_time_eq(&digest, &key.hash) {
                found = Some(key.clone());
            }
        }
        found
    }

    /// The keys as they are now.
    pub fn keys(&self) -> Arc<Vec<Arc<Key>>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serves `other`'s keys from now on (requests already admitted keep theirs).
    pub fn replace(&self, other: KeyStore) {
        let keys = other.keys();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
    }

    /// The configured keys, plus `AIRLOCK_API_KEY`; with neither, the keys this server made
    /// before, or a new one that is returned to be shown once.
    pub fn resolve(
        configured: &[KeyConfig],
        env_key: Option<&str>,
        state_dir: &Path,
    ) -> Result<Resolved, KeyError> {
        let mut configs = configured.to_vec();
        if let Some(key) = env_key {
            if key.len() < 16 {
                return Err(KeyError::Invalid(
                    "AIRLOCK_API_KEY must be at least 16 characters".into(),
                ));
            }
            if configs.iter().any(|k| k.name == "env") {
                return Err(KeyError::Invalid(
                    "a configured key is named \"env\", which AIRLOCK_API_KEY uses".into(),
                ));
            }
            configs.push(KeyConfig::new("env", hash_key(key)));
        }
        let mut generated = None;
        if configs.is_empty() {
            let path = state_dir.join(KEYS_FILE);
            let stored: Vec<StoredKey> = match std::fs::read_to_string(&path) {
                Ok(text) => serde_json::from_str(&text).map_err(|e| KeyError::Parse {
                    path: path.clone(),
                    message: e.to_string(),
                })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let key = generate_key().map_err(|source| KeyError::Io {
                        path: path.clone(),
                        source,
                    })?;
                    let entry = StoredKey {
                        name: "default".into(),
                        hash: hash_key(&key),
                        created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                            .to_string(),
                    };
                    write_private(
                        &path,
                        &serde_json::to_vec_pretty(&[&entry]).unwrap_or_default(),
                    )?;
                    generated = Some(key);
                    vec![entry]
                }
                Err(source) => return Err(KeyError::Io { path, source }),
            };
            configs.extend(stored.into_iter().map(|k| KeyConfig::new(&k.name, k.hash)));
        }
        Ok(Resolved {
            store: KeyStore::new(configs)?,
            generated,
        })
    }
}

/// Creates `path` readable by its owner only, failing if it exists.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io)
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_key_cannot_be_configured_twice() {
        let hash = super::hash_key("key-for-tests-0001");
        let configs = vec![
            crate::config::KeyConfig::new("a", hash.clone()),
            crate::config::KeyConfig::new("b", hash),
        ];
        let err = super::KeyStore::new(configs).unwrap_err().to_string();
        assert!(err.contains("same key"), "{err}");
        let err = super::KeyStore::resolve(
            &[crate::config::KeyConfig::new(
                "limited",
                super::hash_key("key-for-tests-0001"),
            )],
            Some("key-for-tests-0001"),
            std::path::Path::new("/nonexistent"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("same key"), "{err}");
    }

    use super::*;

    #[test]
    fn ids_name_their_replica_when_there_is_one() {
        let plain = held_id("se_", None);
        assert_eq!(plain.len(), 27);
        assert_eq!(replica_of(&plain), None);
        let held = held_id("ex_", Some("airlock-2"));
        assert!(held.starts_with("ex_airlock-2_"), "{held}");
        assert_eq!(replica_of(&held), Some("airlock-2"));
        assert_eq!(replica_of("x"), None);
    }

    #[test]
    fn only_the_right_key_verifies() {
        let key = generate_key().unwrap();
        assert!(key.starts_with("ak_") && key.len() == 67);
        let store = KeyStore::new(vec![KeyConfig::new("alice", hash_key(&key))]).unwrap();
        assert_eq!(
            store.verify(&key).map(|k| k.name().to_owned()),
            Some("alice".into())
        );
        assert!(store.verify(&key[..66]).is_none());
        assert!(store.verify("").is_none());
    }

    #[test]
    fn a_generated_key_is_shown_once_and_only_its_hash_is_kept() {
        let dir = std::env::temp_dir().join(format!("airlock-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = KeyStore::resolve(&[], None, &dir).unwrap();
        let key = first.generated.expect("a new key");
        let stored = std::fs::read_to_string(dir.join(KEYS_FILE)).unwrap();
        assert!(!stored.contains(&key) && stored.contains(&hash_key(&key)));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(dir.join(KEYS_FILE))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        let second = KeyStore::resolve(&[], None, &dir).unwrap();
        assert!(second.generated.is_none(), "shown once only");
        assert!(second.store.verify(&key).is_some());
        // A configured or environment key means no generated key is made or used.
        let env = KeyStore::resolve(&[], Some("0123456789abcdef"), &dir).unwrap();
        assert!(env.store.verify(&key).is_none());
        assert!(env.store.verify("0123456789abcdef").is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
