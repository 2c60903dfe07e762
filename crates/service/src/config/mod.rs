//! The server's configuration: the plain types of its sections, their defaults and the checks
//! of their own values. The `airlock` binary reads it (its `config.rs`: the TOML file,
//! `AIRLOCK_*` environment variables and flags, merged in that order) and settles what the
//! host decides (the state directory, the audit log's file, the store's password) before any
//! library sees it: no module here reads a file or the environment.
//!
//! One file per group of sections: how requests come in ([`requests`]: `[http]`, `[cors]`,
//! `[concurrency]`, `[metrics]`, `[mcp]`), the work that outlives a request ([`work`]:
//! `[sessions]`, `[background]`, `[volumes]`, `[environments]`), what is answered without a
//! sandbox ([`native`]: `[eval]`, `[pickle]`), what is recorded and where ([`records`]:
//! `[audit]`, `[store]`, `[telemetry]`), `[[keys]]` ([`keys`]) and `[credentials]`
//! ([`credentials`]); here, the whole and the checks that span sections.

use std::net::SocketAddr;
use std::path::PathBuf;

use airlock_engine::{EngineConfig, PoolConfig, ZygoteConfig};
use serde::{Deserialize, Serialize};

mod credentials;
mod keys;
mod native;
mod records;
mod requests;
mod work;

pub use credentials::{CredentialConfig, CredentialValue};
pub use keys::{KeyConfig, Scope};
pub use native::{EvalConfig, PickleConfig};
pub use records::{
    AuditConfig, AuditSync, StoreConfig, StorePassword, TelemetryConfig, AUDIT_FILE,
    DEFAULT_SYNC_EVERY_MS, MAX_SYNC_EVERY_MS,
};
pub use requests::{
    ConcurrencyConfig, CorsConfig, HttpConfig, McpConfig, MetricsConfig, MAX_PROGRESS_INTERVAL_MS,
};
pub use work::{BackgroundConfig, Checkpoint, EnvironmentsConfig, SessionsConfig, VolumesConfig};

/// The state directory when none is given: the system's. The binary gives the one the host's
/// conventions pick (systemd's, XDG's, the user's) in `state_dir`.
pub const SYSTEM_STATE_DIR: &str = "/var/lib/airlock";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address and port to listen on.
    pub listen: SocketAddr,
    /// Where the generated key's hash, environments and the runner's cache live (and the
    /// audit log, when this is given). Default: see [`Config::state_dir`].
    pub state_dir: Option<PathBuf>,
    /// This server's name when it is one of several replicas behind one balancer (in
    /// Kubernetes, the pod's name through `AIRLOCK_REPLICA`): session and execution ids carry
    /// it, so the balancer can send each request for one to the replica that holds it. A DNS
    /// label (lower-case letters, digits, `-`).
    pub replica: Option<String>,
    /// `text` or `json` logs, on stderr.
    pub log_format: LogFormat,
    /// Host header values accepted besides localhost names and the listen address.
    pub allowed_hosts: Vec<String>,
    /// How long running executions may finish after SIGTERM before they are killed.
    pub shutdown_grace_ms: u64,
    pub http: HttpConfig,
    pub cors: CorsConfig,
    pub concurrency: ConcurrencyConfig,
    pub metrics: MetricsConfig,
    pub engine: EngineConfig,
    /// The warm pool of sandboxes started ahead of their work.
    pub pool: PoolConfig,
    /// Fresh sandboxes as forks of a pre-imported interpreter (see docs/serving.md "Zygotes").
    pub zygote: ZygoteConfig,
    pub sessions: SessionsConfig,
    /// `POST /v1/eval`: the native evaluator's budgets.
    pub eval: EvalConfig,
    /// `POST /v1/pickle/scan`.
    pub pickle: PickleConfig,
    /// The audit log ([`Config::audit_path`]).
    pub audit: AuditConfig,
    /// Where records and audit lines go: the audit log file (default), or PostgreSQL.
    pub store: StoreConfig,
    /// `/mcp`: the MCP tools over streamable HTTP.
    pub mcp: McpConfig,
    /// OpenTelemetry traces over OTLP (docs/telemetry.md); off unless `otlp_endpoint` is set.
    pub telemetry: TelemetryConfig,
    /// Code mode: the operator's MCP servers that sandboxed code may call (see each key's
    /// `tools` grants).
    pub tools: airlock_tools::ToolsConfig,
    /// The egress proxy's budgets per execution and fixed name answers (each key's `egress`
    /// says where its code may connect; default nowhere).
    pub egress: airlock_egress::Settings,
    /// Credentials the egress proxy sets on requests to their hosts, by name; a key's
    /// `credentials` says which its code's requests may carry. Their values stay on the host.
    pub credentials: std::collections::BTreeMap<String, CredentialConfig>,
    /// Named environments: how they are built, and those the server builds at start.
    pub environments: EnvironmentsConfig,
    /// Volumes: named directories owned by a key, kept across restarts.
    pub volumes: VolumesConfig,
    /// Background executions (`POST /v1/executions`).
    pub background: BackgroundConfig,
    pub keys: Vec<KeyConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            state_dir: None,
            replica: None,
            log_format: LogFormat::Text,
            allowed_hosts: Vec::new(),
            shutdown_grace_ms: 30_000,
            http: HttpConfig::default(),
            cors: CorsConfig::default(),
            concurrency: ConcurrencyConfig::default(),
            metrics: MetricsConfig::default(),
            engine: EngineConfig::default(),
            pool: PoolConfig::default(),
            zygote: ZygoteConfig::default(),
            sessions: SessionsConfig::default(),
            eval: EvalConfig::default(),
            pickle: PickleConfig::default(),
            audit: AuditConfig::default(),
            store: StoreConfig::default(),
            mcp: McpConfig::default(),
            telemetry: TelemetryConfig::default(),
            tools: airlock_tools::ToolsConfig::default(),
            egress: airlock_egress::Settings::default(),
            credentials: std::collections::BTreeMap::new(),
            environments: EnvironmentsConfig::default(),
            volumes: VolumesConfig::default(),
            background: BackgroundConfig::default(),
            keys: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A configuration whose values do not hold together: the first fault found.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct Invalid(pub String);

/// A Kubernetes pod name or a host name's first label: what a balancer can route on.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

impl Config {
    pub fn validate(&self) -> Result<(), Invalid> {
        let bad = |m: String| Err(Invalid(m));
        if let Some(replica) = &self.replica {
            if !is_dns_label(replica) {
                return bad(format!(
                    "replica {replica:?}: must be a DNS label (1 to 63 lower-case letters, \
                     digits and '-', not starting or ending with '-')"
                ));
            }
        }
        if let Some(url) = &self.store.url {
            if let Err(m) = records::check_store_url(url) {
                return bad(format!("store.url: {m}"));
            }
        }
        if let Err(m) = self.audit.validate() {
            return bad(m);
        }
        if let Err(m) = self.tools.validate() {
            return bad(m);
        }
        if let Err(m) = self.telemetry.validate() {
            return bad(m);
        }
        if let Err(m) = self.egress.validate() {
            return bad(m);
        }
        if let Err(m) = self.environments.build.validate() {
            return bad(m);
        }
        for (name, reqs) in &self.environments.define {
            let checked = airlock_engine::environments::check_name(name)
                .and_then(|()| airlock_engine::environments::parse_requirements(&reqs.join("\n")));
            if let Err(e) = checked {
                return bad(format!("environments.define.{name}: {e}"));
            }
        }
        if let Err(m) = credentials::check(&self.credentials) {
            return bad(m);
        }
        for key in &self.keys {
            if let Err(m) = airlock_tools::Grants::parse(&key.tools) {
                return bad(format!("keys `{}`: {m}", key.name));
            }
            if let Err(m) = key.egress.validate() {
                return bad(format!("keys `{}`: {m}", key.name));
            }
            for name in &key.credentials {
                let Some(credential) = self.credentials.get(name) else {
                    return bad(format!(
                        "keys `{}`: credentials: {name:?} is not a [credentials.NAME] section",
                        key.name
                    ));
                };
                let hosts = airlock_egress::EgressPolicy {
                    hosts: credential.hosts.clone(),
                    ranges: Vec::new(),
                };
                if let Err(m) = key.egress.covers(&hosts) {
                    return bad(format!(
                        "keys `{}`: credential `{name}`'s hosts must be in its egress: {m}",
                        key.name
                    ));
                }
            }
        }
        if let Err(m) = self.pool.validate() {
            return bad(m);
        }
        if let Some(name) = self.pickle.allow.iter().find(|n| {
            let parts: Vec<&str> = n.split('.').collect();
            parts.len() < 2 || parts.iter().any(|p| p.is_empty())
        }) {
            return bad(format!(
                "pickle.allow: {name:?} is not an exact module.qualname"
            ));
        }
        if self.pickle.max_bytes == 0 || self.pickle.max_running == 0 {
            return bad("pickle.max_bytes and pickle.max_running must be at least 1".into());
        }
        if self.eval.max_input_bytes > airlock_pyeval::Limits::MAX_INPUT
            || self.eval.timeout_ms == 0
        {
            return bad(format!(
                "eval.max_input_bytes must be at most {} and eval.timeout_ms at least 1",
                airlock_pyeval::Limits::MAX_INPUT
            ));
        }
        for origin in &self.cors.allowed_origins {
            let well_formed = (origin.starts_with("https://") || origin.starts_with("http://"))
                && !origin.ends_with('/')
                && origin
                    .split("://")
                    .nth(1)
                    .is_some_and(|h| !h.is_empty() && !h.contains(['/', '*', ' ']));
            if !well_formed {
                return bad(format!(
                    "cors.allowed_origins: {origin:?} is not an exact origin such as https://app.example \
                     (`*` and `null` are never accepted)"
                ));
            }
        }
        if self.sessions.max_lifetime_ms < 1000 || self.sessions.idle_timeout_ms < 1000 {
            return bad(
                "sessions.max_lifetime_ms must be at least 1000 (a session's interpreter starts \
                 within it) and sessions.idle_timeout_ms at least 1000 (a session lives until \
                 the request after its creation)"
                    .into(),
            );
        }
        let c = &self.concurrency;
        if c.max_running == 0 {
            return bad("concurrency.max_running must be at least 1".into());
        }
        let b = &self.background;
        if (b.max_running >= c.max_running && c.max_running > 1)
            || b.default_timeout_ms == 0
            || b.default_timeout_ms > b.max_timeout_ms
            || b.retention_ms < 1000
        {
            return bad(
                "background: max_running must be below concurrency.max_running (requests \
                 answered in place keep a slot), \
                 0 < default_timeout_ms <= max_timeout_ms, and retention_ms at least 1000"
                    .into(),
            );
        }
        let h = &self.http;
        if h.max_connections == 0 || h.max_body_bytes == 0 {
            return bad("http.max_connections and http.max_body_bytes must be at least 1".into());
        }
        if h.max_buffered_bytes_per_key < h.max_body_bytes
            || h.max_buffered_bytes < h.max_buffered_bytes_per_key
        {
            return bad(
                "http: max_body_bytes <= max_buffered_bytes_per_key <= max_buffered_bytes \
                 (a body that fits no budget could never be received)"
                    .into(),
            );
        }
        if h.answer_timeout_ms == 0 {
            return bad("http.answer_timeout_ms must be at least 1".into());
        }
        if !(1..=MAX_PROGRESS_INTERVAL_MS).contains(&self.mcp.progress_interval_ms) {
            return bad(format!(
                "mcp.progress_interval_ms must be 1 to {MAX_PROGRESS_INTERVAL_MS} (a host hears \
                 from a long call at least every 10 s)"
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for key in &self.keys {
            if key.name.is_empty()
                || !key
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return bad(format!(
                    "keys: name {:?} must be letters, digits, - _ or .",
                    key.name
                ));
            }
            if !names.insert(key.name.clone()) {
                return bad(format!("keys: the name {:?} is used twice", key.name));
            }
            let hex = key.hash.strip_prefix("sha256:").unwrap_or("");
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad(format!(
                    "keys.{}: hash must be sha256: and 64 hex digits",
                    key.name
                ));
            }
            if key.max_concurrency == Some(0) {
                return bad(format!(
                    "keys.{}: max_concurrency must be at least 1",
                    key.name
                ));
            }
        }
        for key in &self.keys {
            if let Err(m) = keys::check_approves(key, &names) {
                return bad(format!("keys.{}: {m}", key.name));
            }
        }
        Ok(())
    }

    /// The state directory: `state_dir`, which the binary sets by the host's conventions
    /// when the operator gave none; else [`SYSTEM_STATE_DIR`].
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(SYSTEM_STATE_DIR))
    }

    /// The audit log's file: `[audit] path`, which the binary sets by the host's conventions
    /// when the operator gave none; else [`AUDIT_FILE`] in the state directory.
    pub fn audit_path(&self) -> PathBuf {
        self.audit
            .path
            .clone()
            .unwrap_or_else(|| self.state_dir().join(AUDIT_FILE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        let mut c = Config::default();
        c.keys.push(KeyConfig::new(
            "alice",
            format!("sha256:{}", "a".repeat(64)),
        ));
        c.validate().unwrap();
        c.keys.push(KeyConfig::new(
            "alice",
            format!("sha256:{}", "b".repeat(64)),
        ));
        assert!(c.validate().unwrap_err().to_string().contains("used twice"));
        c.keys.pop();
        c.keys.push(KeyConfig::new("bob", "plaintext".into()));
        assert!(c.validate().unwrap_err().to_string().contains("64 hex"));
    }

    #[test]
    fn the_audit_log_s_sync_spacing_is_between_a_millisecond_and_a_second() {
        let mut c = Config::default();
        assert_eq!(c.audit.sync_every_ms, DEFAULT_SYNC_EVERY_MS);
        assert_eq!(
            c.audit.sync_interval(),
            std::time::Duration::from_millis(DEFAULT_SYNC_EVERY_MS)
        );
        for ok in [1, MAX_SYNC_EVERY_MS] {
            c.audit.sync_every_ms = ok;
            c.validate().unwrap();
        }
        for bad in [0, MAX_SYNC_EVERY_MS + 1] {
            c.audit.sync_every_ms = bad;
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("audit.sync_every_ms"), "{bad}: {e}");
        }
        // Answers that wait for their record are never held back by the spacing.
        c.audit.sync_every_ms = 100;
        c.audit.sync = AuditSync::Answer;
        assert_eq!(c.audit.sync_interval(), std::time::Duration::ZERO);
    }

    #[test]
    fn pickle_allow_takes_exact_qualified_names_only() {
        let mut c = Config::default();
        c.pickle.allow = vec!["datetime.date".into()];
        assert!(c.validate().is_ok());
        for bad in ["os", "os.", ".system", "a..b"] {
            c.pickle.allow = vec![bad.into()];
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("pickle.allow"), "{bad}: {e}");
        }
    }
}
