//! The server's configuration. Precedence, lowest first: the embedded defaults (which need no
//! editing), a TOML file (`--config` or `AIRLOCK_CONFIG`), `AIRLOCK_*` environment variables,
//! and the command-line flags `--listen` and `--state-dir`.
//!
//! An environment variable names a setting by its path, upper-cased, with `__` between
//! sections: `AIRLOCK_CONCURRENCY__MAX_RUNNING=8`, `AIRLOCK_ENGINE__DEFAULTS__TIMEOUT_MS=5000`,
//! `AIRLOCK_CORS__ALLOWED_ORIGINS='["https://app.example"]'`. Values are TOML (numbers, booleans,
//! arrays), or a plain string. `AIRLOCK_API_KEY` configures one key without a file; an unknown
//! `AIRLOCK_*` variable is an error, so a typo never goes unnoticed, except the project's own
//! test and build variables (`AIRLOCK_TEST_*`) and the client's `AIRLOCK_URL`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use airlock_api::LimitsRequest;
use airlock_engine::{EngineConfig, PoolConfig, ZygoteConfig};
use serde::{Deserialize, Serialize};

/// Environment variables with a meaning of their own rather than a setting's path.
pub const ENV_API_KEY: &str = "AIRLOCK_API_KEY";
pub const ENV_CONFIG: &str = "AIRLOCK_CONFIG";
/// The log filter (`info`, `debug`, `airlock_server=debug`, ...).
pub const ENV_LOG: &str = "AIRLOCK_LOG";
/// The PostgreSQL store's password, when `store.password_file` is not set.
pub const ENV_STORE_PASSWORD: &str = "AIRLOCK_STORE_PASSWORD";
/// Variables of the project's own tests and scripts (`AIRLOCK_TEST_EVAL_SEED`, ...): never
/// settings, so the strict check of `AIRLOCK_*` leaves them alone.
pub const ENV_TEST_PREFIX: &str = "AIRLOCK_TEST_";
/// Variables the Python client reads, which a shell that runs both may hold.
pub const ENV_CLIENT: &[&str] = &["AIRLOCK_URL"];

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

impl Config {
    /// What can be checked of `[credentials]` without reading a value.
    fn validate_credentials(&self) -> Result<(), String> {
        for (name, c) in &self.credentials {
            let whose = format!("credentials.{name}");
            let ok_name = !name.is_empty()
                && name.len() <= 64
                && name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !ok_name {
                return Err(format!(
                    "{whose}: a name of lower-case letters, digits, `_` and `-`"
                ));
            }
            airlock_egress::credentials::check_hosts(&whose, &c.hosts)?;
            if c.headers.is_empty() {
                return Err(format!("{whose}: name the header(s) it sets"));
            }
            for (header, value) in &c.headers {
                if value.env.is_some() == value.file.is_some() {
                    return Err(format!(
                        "{whose}.headers.{header}: give `env` or `file` (values are never \
                         written in the configuration)"
                    ));
                }
                if value.format.matches("{}").count() != 1 {
                    return Err(format!(
                        "{whose}.headers.{header}: `format` must have one `{{}}` (where the \
                         secret goes)"
                    ));
                }
            }
        }
        let names: Vec<&String> = self.credentials.keys().collect();
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                let (ca, cb) = (&self.credentials[*a], &self.credentials[*b]);
                let overlap = ca.hosts.iter().any(|x| {
                    cb.hosts.iter().any(|y| {
                        x.ports.iter().any(|p| y.ports.contains(p))
                            && (airlock_egress::host_rule_covers(&x.host, &y.host)
                                || airlock_egress::host_rule_covers(&y.host, &x.host))
                    })
                });
                if overlap {
                    return Err(format!(
                        "credentials `{a}` and `{b}` apply to the same host and port: one \
                         request can carry one credential"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `[credentials.NAME]`: the hosts a credential applies to and the headers the proxy sets
/// on every request to them. Values are never written here: each names a host environment
/// variable or a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// Host names (exact, or `*.` and one) with their ports.
    pub hosts: Vec<airlock_egress::HostRule>,
    /// Header name to where its value comes from.
    pub headers: std::collections::BTreeMap<String, CredentialValue>,
    /// PEM certificates that verify these hosts' servers instead of the host's CA bundle
    /// (an internal service's own CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

/// One header's value: the secret from `env` or `file` (exactly one), put in `format`
/// where `{}` is (default: the secret alone).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialValue {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    #[serde(default = "secret_alone")]
    pub format: String,
}

fn secret_alone() -> String {
    "{}".into()
}

impl CredentialValue {
    /// The header's value and the secret in it, read now; errors name the source, never
    /// the value.
    pub fn read(&self) -> Result<(String, String), String> {
        let secret = airlock_tools::Secret {
            env: self.env.clone(),
            file: self.file.clone(),
        }
        .read()?;
        Ok((self.format.replacen("{}", &secret, 1), secret))
    }
}

/// `[environments]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvironmentsConfig {
    /// The index, the build's egress and its limits.
    pub build: airlock_engine::environments::BuildSettings,
    /// Environments built at start when missing or different: name to requirements.
    pub define: std::collections::BTreeMap<String, Vec<String>>,
}

/// `[volumes]`: what one key's volumes may take. A volume's size is counted in full against
/// its key's quota from its creation (its image may grow to it), whatever it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VolumesConfig {
    /// The sum of the sizes of one key's volumes.
    pub max_bytes_per_key: u64,
    pub max_volumes_per_key: usize,
    /// Largest single volume.
    pub max_size_bytes: u64,
    /// Most entries (files, directories, links) a volume may be made with.
    pub max_entries: u64,
}

impl Default for VolumesConfig {
    fn default() -> Self {
        VolumesConfig {
            max_bytes_per_key: 4 << 30,
            max_volumes_per_key: 16,
            max_size_bytes: 2 << 30,
            max_entries: 1 << 20,
        }
    }
}

impl VolumesConfig {
    pub fn quota(&self) -> airlock_engine::volumes::Quota {
        airlock_engine::volumes::Quota {
            max_volumes_per_key: self.max_volumes_per_key,
            max_size_bytes: self.max_size_bytes,
            max_entries: self.max_entries,
        }
    }
}

/// `[background]`: executions that outlive their request (`POST /v1/executions`). They take
/// the same running slots as every execution (`[concurrency]`), at most `max_running` of them
/// at once so that requests answered in place always find some.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackgroundConfig {
    /// Ceiling of `limits.timeout_ms` and `limits.cpu_ms` for background work (the engine's
    /// ceilings hold for every other limit).
    pub max_timeout_ms: u64,
    /// `limits.timeout_ms` and `limits.cpu_ms` when a submission leaves them out.
    pub default_timeout_ms: u64,
    /// Background executions running at once, all keys together; below
    /// `concurrency.max_running`, so that requests answered in place always find a slot
    /// (with one slot in all, none runs in the background).
    pub max_running: usize,
    /// Per key, unless the key sets `max_background_running`.
    pub max_running_per_key: usize,
    /// Submitted and not yet running, per key, unless the key sets `max_background_queued`;
    /// past it a submission is 429.
    pub max_queued_per_key: usize,
    /// Ended executions kept per key; past it a submission is 429 until some are deleted or
    /// expire.
    pub max_kept_per_key: usize,
    /// How long an ended execution's result and events are kept.
    pub retention_ms: u64,
    /// Bytes one key's background executions may store (their events, results, and the jobs
    /// of those waiting); past it a submission is 429, and one that runs is stopped.
    pub max_bytes_per_key: u64,
}

impl Default for BackgroundConfig {
    fn default() -> Self {
        BackgroundConfig {
            max_timeout_ms: 4 * 3600 * 1000,
            default_timeout_ms: 3600 * 1000,
            max_running: 1,
            max_running_per_key: 1,
            max_queued_per_key: 16,
            max_kept_per_key: 100,
            retention_ms: 24 * 3600 * 1000,
            max_bytes_per_key: 4 << 30,
        }
    }
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

/// The MCP endpoint (`/mcp`). It answers like every other route: only for the Host names in
/// `allowed_hosts` (and localhost and the listen address), only to browsers on the origins in
/// `cors.allowed_origins` (none by default), and only to keys with the `execute` scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Serve `/mcp`; when false it is 404 like any unknown route.
    pub enabled: bool,
    /// The tools the code of `airlock mcp` (stdio, one local user) may call: `server.tool`
    /// patterns as in a key's `tools`. Default: every read-only tool.
    pub stdio_tools: Vec<String>,
    /// How often a `run_python` or `run_in_session` call whose host gave a progress token
    /// sends `notifications/progress` while it runs, in ms (1 to 10000: hosts with short
    /// timeouts wait on while they hear from the call at least every 10 s).
    pub progress_interval_ms: u64,
}

/// The longest `mcp.progress_interval_ms`: the MCP hosts that give up on a silent call do so
/// after tens of seconds, so every 10 s keeps them waiting.
pub const MAX_PROGRESS_INTERVAL_MS: u64 = 10_000;

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            enabled: true,
            stdio_tools: vec!["*.*".into()],
            progress_interval_ms: 5000,
        }
    }
}

/// `[telemetry]`: traces exported over OTLP (HTTP/protobuf). Exporting never holds up an
/// execution: spans wait in a bounded queue for one thread that sends them in batches, and
/// those that find it full, or whose batch fails, are dropped and counted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP URL (`http://collector:4318`): spans go to its `/v1/traces`,
    /// or to the URL as given when it has a path. None: no traces, and nothing is started.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of every span's resource.
    pub service_name: String,
    /// The most spans waiting to be sent; more are dropped (and counted).
    pub max_queued_spans: usize,
    /// The most spans one request to the collector carries.
    pub max_batch_spans: usize,
    /// How long a span may wait for its batch to fill before the batch is sent.
    pub batch_interval_ms: u64,
    /// How long one request to the collector may take; its spans are dropped after that.
    pub export_timeout_ms: u64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "airlock".into(),
            max_queued_spans: 2048,
            max_batch_spans: 512,
            batch_interval_ms: 1000,
            export_timeout_ms: 2000,
        }
    }
}

impl TelemetryConfig {
    /// Where spans are sent: `otlp_endpoint`, with `/v1/traces` when it names no path.
    pub fn traces_url(&self) -> Option<String> {
        let endpoint = self.otlp_endpoint.as_deref()?;
        let url = reqwest::Url::parse(endpoint).ok()?;
        if url.path() == "/" || url.path().is_empty() {
            Some(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        } else {
            Some(endpoint.to_owned())
        }
    }

    /// The collector's host and port (`airlock doctor` tries to reach them).
    pub fn collector(&self) -> Option<(String, u16)> {
        let url = reqwest::Url::parse(self.otlp_endpoint.as_deref()?).ok()?;
        Some((url.host_str()?.to_owned(), url.port_or_known_default()?))
    }

    fn validate(&self) -> Result<(), String> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let url = reqwest::Url::parse(endpoint)
                .map_err(|e| format!("telemetry.otlp_endpoint {endpoint:?}: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(format!(
                    "telemetry.otlp_endpoint {endpoint:?}: an http:// or https:// URL with a host"
                ));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(format!(
                    "telemetry.otlp_endpoint: holds a user or password, which `--print-config` \
                     would show ({})",
                    url.host_str().unwrap_or("")
                ));
            }
        }
        if self.service_name.is_empty() {
            return Err("telemetry.service_name must not be empty".into());
        }
        if self.max_queued_spans == 0 || self.max_batch_spans == 0 {
            return Err(
                "telemetry.max_queued_spans and telemetry.max_batch_spans must be at least 1"
                    .into(),
            );
        }
        if self.batch_interval_ms == 0 || self.export_timeout_ms == 0 {
            return Err(
                "telemetry.batch_interval_ms and telemetry.export_timeout_ms must be at least 1"
                    .into(),
            );
        }
        Ok(())
    }
}

/// `[audit]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// `background`: lines are synced to disk as they are written (at most one sync every
    /// 10 ms, which the lines written meanwhile share), and nothing waits for it; `answer`:
    /// each sync at once, and an execution's answer waits for its record to be on disk.
    pub sync: AuditSync,
    /// The audit log's file (see [`Config::audit_path`] for where it goes by default).
    pub path: Option<PathBuf>,
}

/// When audit lines reach the disk (`[audit] sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditSync {
    /// Synced as written, on the syncer's thread, at most one sync every 10 ms; nothing
    /// waits for it.
    #[default]
    Background,
    /// Synced as soon as written, and an execution's answer waits for its record to be on
    /// disk.
    Answer,
}

/// The audit log's file name, in the directory [`Config::audit_path`] picks.
pub const AUDIT_FILE: &str = "audit.jsonl";

/// `[store]`: with a `url`, execution records and audit lines go to PostgreSQL (tables made
/// and migrated at start) instead of `state_dir/audit.jsonl`, so that every replica serves
/// every record. The password comes from `password_file` or `AIRLOCK_STORE_PASSWORD`, never
/// from the URL (which `--print-config` shows).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `postgres://user@host:port/database` (libpq's key=value form works too).
    pub url: Option<String>,
    /// A file holding the password (a mounted Secret, systemd's credentials directory).
    pub password_file: Option<PathBuf>,
    /// PEM certificates of the authorities that sign the database's certificate, besides
    /// the system's (a private CA). TLS is used when the server offers it, and required with
    /// `sslmode=require` in the URL; the certificate is always verified, name included.
    pub ca_file: Option<PathBuf>,
}

/// The pickle scanner (`POST /v1/pickle/scan`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PickleConfig {
    /// Globals allowed besides the built-in list, as exact `module.qualname`.
    pub allow: Vec<String>,
    /// Largest pickle scanned, and most an archive's members may inflate to together: the
    /// scan holds up to about 128 bytes of memory per byte it reads.
    pub max_bytes: u64,
    /// Scans at once; others wait.
    pub max_running: usize,
}

impl Default for PickleConfig {
    fn default() -> Self {
        PickleConfig {
            allow: Vec::new(),
            max_bytes: 16 << 20,
            max_running: 2,
        }
    }
}

impl PickleConfig {
    pub fn options(&self) -> airlock_pickle::Options {
        let mut opts = airlock_pickle::Options::default();
        opts.allow.extend(self.allow.iter().cloned());
        opts.max_bytes = usize::try_from(self.max_bytes).unwrap_or(usize::MAX);
        opts
    }
}

/// The native evaluator's budgets, per expression (`POST /v1/eval`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Longest expression, in bytes (at most 65536).
    pub max_input_bytes: usize,
    /// Bytes of values one expression may create.
    pub max_memory_bytes: usize,
    /// Widest integer one expression may create, in bits.
    pub max_int_bits: u64,
    /// Longest repr of a result, in bytes.
    pub max_result_bytes: usize,
    /// Wall clock for parsing and evaluating one expression.
    pub timeout_ms: u64,
    /// Expressions evaluated at once (0: one per CPU); more wait their turn.
    pub max_running: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        let l = airlock_pyeval::Limits::default();
        EvalConfig {
            max_input_bytes: l.max_input_bytes,
            max_memory_bytes: l.max_memory_bytes,
            max_int_bits: l.max_int_bits,
            max_result_bytes: l.max_result_bytes,
            timeout_ms: l.timeout.as_millis() as u64,
            max_running: 0,
        }
    }
}

impl EvalConfig {
    pub fn limits(&self) -> airlock_pyeval::Limits {
        airlock_pyeval::Limits {
            max_input_bytes: self.max_input_bytes,
            max_memory_bytes: self.max_memory_bytes,
            max_int_bits: self.max_int_bits,
            max_result_bytes: self.max_result_bytes,
            timeout: std::time::Duration::from_millis(self.timeout_ms),
        }
    }
}

/// Sessions: long-lived sandboxes, each owned by the key that made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Sessions open at once, all keys together; past it, 429.
    pub max_open: usize,
    /// Sessions open at once per key.
    pub max_open_per_key: usize,
    /// A session unused for this long is closed (a request may ask for less).
    pub idle_timeout_ms: u64,
    /// No session lives longer (a request may ask for less).
    pub max_lifetime_ms: u64,
    /// Where paused sessions are kept, their snapshots and records (default
    /// `<state_dir>/sessions`). Replicas that share it resume each other's paused sessions.
    pub snapshot_dir: Option<PathBuf>,
    /// Largest state one snapshot may hold, as the sandbox writes it; it also counts against
    /// the key's storage (`volumes.max_bytes_per_key`).
    pub max_snapshot_bytes: u64,
    /// When set, a session unused for this long is paused instead of closed (its idle
    /// timeout no longer closes it), so that it can live for days at the cost of its
    /// snapshot on disk.
    pub pause_after_idle_ms: Option<u64>,
    /// How long a paused session is kept before it is deleted.
    pub paused_retention_ms: u64,
    /// Paused sessions one key may have at once (each also counts against its storage).
    pub max_paused_per_key: usize,
    /// How long a snapshot (or a restore) may take before the session is ended.
    pub snapshot_timeout_ms: u64,
    /// `each_cell`: a session's state is written to its snapshot after each cell, so that a
    /// server killed (or restarted) while it is open brings it back from its last cell;
    /// `none` (the default): only a pause keeps it.
    pub checkpoint: Checkpoint,
}

/// When an open session's state is written to its snapshot (`sessions.checkpoint`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Checkpoint {
    #[default]
    None,
    EachCell,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            max_open: 16,
            max_open_per_key: 4,
            idle_timeout_ms: 600_000,
            max_lifetime_ms: 3_600_000,
            snapshot_dir: None,
            max_snapshot_bytes: 2 << 30,
            pause_after_idle_ms: None,
            paused_retention_ms: 7 * 24 * 3_600_000,
            max_paused_per_key: 10_000,
            snapshot_timeout_ms: 120_000,
            checkpoint: Checkpoint::None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Largest request body, counted on the bytes received (chunked bodies included).
    pub max_body_bytes: u64,
    /// Time allowed to send a request's headers; idle keep-alive connections close after it.
    pub header_timeout_ms: u64,
    /// Time allowed to send a request's body.
    pub body_timeout_ms: u64,
    /// Open connections at once. At the cap, a new connection closes one that is not in the
    /// middle of a request (idle, or still sending its head): from the address with the most
    /// connections, anonymous before authenticated, oldest first.
    pub max_connections: usize,
    /// Memory for request bodies and answers, all requests together: bodies received (or
    /// parsed and waiting for a slot), what each execution in flight reserves for its answer
    /// (both output streams at `output_bytes`, the result, a write window), and answers made
    /// but not yet written out. Past it, 503.
    pub max_buffered_bytes: u64,
    /// The share of `max_buffered_bytes` one key may hold; past it, 429. It must hold the
    /// answer of one execution at the ceilings.
    pub max_buffered_bytes_per_key: u64,
    /// A client must take its answer at `answer_min_bytes_per_second` or more, over every
    /// stretch of this long in which the answer waits for it; otherwise its connection is
    /// closed and the answer's memory freed (the `slow_reader` security event).
    pub answer_timeout_ms: u64,
    /// See `answer_timeout_ms`. 0 cuts off only clients that take nothing at all.
    pub answer_min_bytes_per_second: u64,
    /// `GET /readyz` without a key answers `{"ready": ...}` and its status, nothing else (a
    /// key still gets the reasons): for probes that cannot hold a key, such as Kubernetes'.
    pub readyz_without_key: bool,
    /// A streamed answer (`text/event-stream`) sends a comment line after this long without
    /// an event, so that a proxy's idle timeout does not cut a silent program's stream. 0:
    /// never.
    pub sse_keep_alive_ms: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 16 << 20,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            max_connections: 256,
            max_buffered_bytes: 1 << 30,
            max_buffered_bytes_per_key: 256 << 20,
            answer_timeout_ms: 10_000,
            answer_min_bytes_per_second: 16 << 10,
            readyz_without_key: false,
            sse_keep_alive_ms: 15_000,
        }
    }
}

/// Cross-origin access for browsers. Off (no CORS headers at all) unless origins are listed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Exact origins (`https://app.example:8443`); `*` and `null` are refused.
    pub allowed_origins: Vec<String>,
    /// Send `Access-Control-Allow-Credentials: true` to the listed origins.
    pub allow_credentials: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConcurrencyConfig {
    /// Executions running at once, for all keys together; a slot given back goes to the
    /// waiting key that started one least recently.
    pub max_running: usize,
    /// Executions waiting for a slot, for all keys together; past it, 503.
    pub max_queue: usize,
    /// Longest wait in the queue before 503.
    pub queue_timeout_ms: u64,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        ConcurrencyConfig {
            max_running: 4,
            max_queue: 64,
            queue_timeout_ms: 30_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `GET /metrics` needs a key with the `metrics` scope.
    pub require_auth: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { require_auth: true }
    }
}

/// What a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `POST /v1/execute`.
    Execute,
    /// `GET /v1/executions/{id}` (its own executions only).
    Read,
    /// `GET /metrics` (when it requires a key).
    Metrics,
    /// Building and deleting environments. Never given by default: list it explicitly.
    Admin,
    /// Seeing and deciding tool calls that wait for an approval, of the keys named in
    /// `approves` (docs/approvals.md). Never given by default.
    Approve,
}

impl Scope {
    /// What a key gets when its `scopes` are not given (everything but `admin`).
    pub const ALL: [Scope; 3] = [Scope::Execute, Scope::Read, Scope::Metrics];
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Shown in logs, metrics and the audit log instead of the key.
    pub name: String,
    /// `sha256:` and the hex SHA-256 of the key (`airlock` prints it when it makes a key).
    pub hash: String,
    #[serde(default = "all_scopes")]
    pub scopes: Vec<Scope>,
    /// Executions of this key running at once; absent: only the global limit applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<usize>,
    /// Executions of this key waiting at once, past which it gets 429; absent: only the
    /// global queue applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<usize>,
    /// Requests per minute (a bucket of that many, refilled evenly); 0: no limit.
    #[serde(default)]
    pub rate_per_minute: u32,
    /// Ceilings for this key, below the engine's own; what is left out falls to those.
    #[serde(default)]
    pub ceilings: LimitsRequest,
    /// Tools its code may call: `server.tool` patterns (`*` matches any characters). A tool
    /// not annotated read-only is granted only by its exact name. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// Where its code may connect through airlock's proxy (host names with ports, and any
    /// address range opened explicitly). Default: nowhere.
    #[serde(
        default,
        skip_serializing_if = "airlock_egress::EgressPolicy::allows_nothing"
    )]
    pub egress: airlock_egress::EgressPolicy,
    /// Credentials (`[credentials.NAME]`) the proxy may set on its code's requests to their
    /// hosts, which its `egress` must allow. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// With the `approve` scope: the keys whose tool calls it may see and decide, by name, or
    /// `"*"` for every key. Never its own calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approves: Vec<String>,
    /// Its background executions running at once; absent: `background.max_running_per_key`.
    /// 0 with `max_background_queued = 0` keeps it from submitting any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_background_running: Option<usize>,
    /// Its background executions waiting at once; absent: `background.max_queued_per_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_background_queued: Option<usize>,
}

fn all_scopes() -> Vec<Scope> {
    Scope::ALL.to_vec()
}

impl KeyConfig {
    /// A key with every scope and no limits of its own.
    pub fn new(name: &str, hash: String) -> Self {
        KeyConfig {
            name: name.to_owned(),
            hash,
            scopes: all_scopes(),
            max_concurrency: None,
            max_queue: None,
            rate_per_minute: 0,
            ceilings: LimitsRequest::default(),
            tools: Vec::new(),
            egress: airlock_egress::EgressPolicy::default(),
            credentials: Vec::new(),
            approves: Vec::new(),
            max_background_running: None,
            max_background_queued: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{0} does not name a setting (see airlock.example.toml)")]
    UnknownVariable(String),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Builds the effective configuration. `env` is the process environment (passed in so tests
/// can use their own).
pub fn load(
    file: Option<&Path>,
    env: &BTreeMap<String, String>,
    listen: Option<SocketAddr>,
    state_dir: Option<PathBuf>,
) -> Result<Config, ConfigError> {
    let mut tree = toml::Table::try_from(Config::default())
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let file = config_file(file, env);
    if let Some(path) = &file {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let from_file: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    origin: path.display().to_string(),
                    message: e.to_string(),
                })?;
        merge(&mut tree, from_file);
    }
    for (name, raw) in env {
        let Some(path) = name.strip_prefix("AIRLOCK_") else {
            continue;
        };
        if [ENV_API_KEY, ENV_CONFIG, ENV_LOG, ENV_STORE_PASSWORD].contains(&name.as_str())
            || ENV_CLIENT.contains(&name.as_str())
            || name.starts_with(ENV_TEST_PREFIX)
        {
            continue;
        }
        let segments: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
        if segments.iter().any(String::is_empty) || !has_path(&tree, &segments) {
            return Err(ConfigError::UnknownVariable(name.clone()));
        }
        set_path(&mut tree, &segments, parse_env_value(raw));
    }
    let mut config: Config = Config::deserialize(tree).map_err(|e| ConfigError::Parse {
        origin: file.map_or("the environment".into(), |p| {
            format!("{} and the environment", p.display())
        }),
        message: e.to_string(),
    })?;
    if let Some(listen) = listen {
        config.listen = listen;
    }
    if let Some(dir) = state_dir {
        config.state_dir = Some(dir);
    }
    config.validate()?;
    Ok(config)
}

/// A key's `approves` goes with the `approve` scope, and names keys that exist (a typo would
/// leave a key's calls with nobody to decide them).
fn check_approves(
    key: &KeyConfig,
    names: &std::collections::BTreeSet<String>,
) -> Result<(), String> {
    let scoped = key.scopes.contains(&Scope::Approve);
    if scoped && key.approves.is_empty() {
        return Err(
            "the approve scope needs `approves`: the names of the keys whose calls it decides, \
             or [\"*\"] for every key"
                .into(),
        );
    }
    if !scoped && !key.approves.is_empty() {
        return Err("`approves` needs the approve scope in `scopes`".into());
    }
    for name in &key.approves {
        if name == &key.name {
            return Err(
                "a key never decides its own calls: remove its own name from `approves`".into(),
            );
        }
        if name != "*" && !names.contains(name) {
            return Err(format!("`approves` names no configured key {name:?}"));
        }
    }
    Ok(())
}

/// A Kubernetes pod name or a host name's first label: what a balancer can route on.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A value from the environment: TOML when it parses as a value, else the text itself.
fn parse_env_value(raw: &str) -> toml::Value {
    match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_owned())),
        Err(_) => toml::Value::String(raw.to_owned()),
    }
}

/// Settings that are optional (absent from the defaults' table) but may still be set.
const OPTIONAL: [&[&str]; 7] = [
    &["state_dir"],
    &["replica"],
    &["store", "url"],
    &["store", "password_file"],
    &["store", "ca_file"],
    &["tools", "reserved_per_server"],
    &["telemetry", "otlp_endpoint"],
];

fn has_path(tree: &toml::Table, path: &[String]) -> bool {
    if OPTIONAL
        .iter()
        .any(|o| o.len() == path.len() && o.iter().zip(path).all(|(a, b)| a == b))
    {
        return true;
    }
    let mut table = tree;
    for (i, seg) in path.iter().enumerate() {
        match table.get(seg) {
            Some(toml::Value::Table(t)) if i + 1 < path.len() => table = t,
            Some(_) if i + 1 == path.len() => return true,
            _ => return false,
        }
    }
    false
}

fn set_path(tree: &mut toml::Table, path: &[String], value: toml::Value) {
    let (last, parents) = path.split_last().expect("non-empty path");
    let mut table = tree;
    for seg in parents {
        table = table
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("has_path checked this is a table");
    }
    table.insert(last.clone(), value);
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Whether `url` is a PostgreSQL connection string airlock accepts: parseable, and without
/// a password (which `--print-config` would show: `password_file` or
/// `AIRLOCK_STORE_PASSWORD` hold it).
fn check_store_url(url: &str) -> Result<(), String> {
    let config =
        <tokio_postgres::Config as std::str::FromStr>::from_str(url).map_err(|e| e.to_string())?;
    if config.get_password().is_some() {
        return Err(
            "holds a password: put it in store.password_file or AIRLOCK_STORE_PASSWORD".into(),
        );
    }
    if config.get_hosts().is_empty() {
        return Err("names no host".into());
    }
    // `prefer` (also the default) lets anyone on the path answer "no TLS" and ask for the
    // password in the clear: only where the path is this host.
    let local = config.get_hosts().iter().all(|h| match h {
        tokio_postgres::config::Host::Tcp(name) => {
            name == "localhost"
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        tokio_postgres::config::Host::Unix(_) => true,
    });
    if !local && config.get_ssl_mode() == tokio_postgres::config::SslMode::Prefer {
        return Err(
            "names another host without sslmode=require: add ?sslmode=require (or \
                    sslmode=disable to send the password in the clear knowingly)"
                .into(),
        );
    }
    Ok(())
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if let Some(replica) = &self.replica {
            if !is_dns_label(replica) {
                return bad(format!(
                    "replica {replica:?}: must be a DNS label (1 to 63 lower-case letters, \
                     digits and '-', not starting or ending with '-')"
                ));
            }
        }
        if let Some(url) = &self.store.url {
            if let Err(m) = check_store_url(url) {
                return bad(format!("store.url: {m}"));
            }
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
        if let Err(m) = self.validate_credentials() {
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
            if let Err(m) = check_approves(key, &names) {
                return bad(format!("keys.{}: {m}", key.name));
            }
        }
        Ok(())
    }

    /// The state directory: `state_dir` (`--state-dir`); else systemd's `$STATE_DIRECTORY`
    /// (`StateDirectory=`); else `$XDG_DATA_HOME/airlock`; else, for root, `/var/lib/airlock`;
    /// else `~/.local/share/airlock`.
    pub fn state_dir(&self) -> PathBuf {
        state_dir_from(
            self.state_dir.as_deref(),
            &|name| std::env::var(name).ok(),
            is_root(),
        )
    }

    /// The audit log's file: `[audit] path`; else `audit.jsonl` in systemd's
    /// `$LOGS_DIRECTORY` (`LogsDirectory=`); else in the state directory when one is given
    /// (`--state-dir`, `state_dir`, `$STATE_DIRECTORY`), as the operator chose one place;
    /// else where a user's logs go: `$XDG_STATE_HOME/airlock`, `/var/log/airlock` for root,
    /// `~/.local/state/airlock`.
    pub fn audit_path(&self) -> PathBuf {
        audit_path_from(self, &|name| std::env::var(name).ok(), is_root())
    }
}

/// Whether this process runs as root (its effective uid, as `/proc/self/status` says).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let uids = s.lines().find_map(|l| l.strip_prefix("Uid:"))?.to_owned();
            uids.split_whitespace().nth(1).map(|euid| euid == "0")
        })
        .unwrap_or(false)
}

/// A variable's value, unless unset or empty; systemd's `*_DIRECTORY` lists several,
/// colon-separated: the first.
fn dir_var(var: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<PathBuf> {
    let v = var(name).filter(|v| !v.is_empty())?;
    Some(PathBuf::from(v.split(':').next().unwrap_or(&v)))
}

fn state_dir_from(
    given: Option<&Path>,
    var: &dyn Fn(&str) -> Option<String>,
    root: bool,
) -> PathBuf {
    if let Some(dir) = given {
        return dir.to_path_buf();
    }
    if let Some(dir) = dir_var(var, "STATE_DIRECTORY") {
        return dir;
    }
    if let Some(data) = dir_var(var, "XDG_DATA_HOME") {
        return data.join("airlock");
    }
    match dir_var(var, "HOME") {
        Some(home) if !root => home.join(".local/share/airlock"),
        _ => PathBuf::from("/var/lib/airlock"),
    }
}

fn audit_path_from(config: &Config, var: &dyn Fn(&str) -> Option<String>, root: bool) -> PathBuf {
    const FILE: &str = AUDIT_FILE;
    if let Some(path) = &config.audit.path {
        return path.clone();
    }
    if let Some(dir) = dir_var(var, "LOGS_DIRECTORY") {
        return dir.join(FILE);
    }
    if config.state_dir.is_some() || dir_var(var, "STATE_DIRECTORY").is_some() {
        return state_dir_from(config.state_dir.as_deref(), var, root).join(FILE);
    }
    if let Some(dir) = dir_var(var, "XDG_STATE_HOME") {
        return dir.join("airlock").join(FILE);
    }
    match dir_var(var, "HOME") {
        Some(home) if !root => home.join(".local/state/airlock").join(FILE),
        _ => PathBuf::from("/var/log/airlock").join(FILE),
    }
}

/// The configuration file read when none is named (`--config`, `AIRLOCK_CONFIG`): the first
/// that exists of the user's (`$XDG_CONFIG_HOME/airlock/airlock.toml`, else
/// `~/.config/airlock/airlock.toml`) and the system's (`/etc/airlock/airlock.toml`).
pub fn config_file(file: Option<&Path>, env: &BTreeMap<String, String>) -> Option<PathBuf> {
    if let Some(file) = file {
        return Some(file.to_path_buf());
    }
    if let Some(file) = env.get(ENV_CONFIG).filter(|f| !f.is_empty()) {
        return Some(PathBuf::from(file));
    }
    let var = |name: &str| env.get(name).cloned();
    let user = dir_var(&var, "XDG_CONFIG_HOME")
        .or_else(|| dir_var(&var, "HOME").map(|h| h.join(".config")))
        .map(|d| d.join("airlock/airlock.toml"));
    user.into_iter()
        .chain([PathBuf::from("/etc/airlock/airlock.toml")])
        .find(|p| p.is_file())
}

impl Config {
    /// The configuration as TOML, as `--print-config` shows it (key hashes only, never keys).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self)
            .unwrap_or_else(|e| format!("# cannot print the configuration: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_defaults_need_no_file() {
        let c = load(None, &env(&[]), None, None).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert!(c.cors.allowed_origins.is_empty());
        assert!(c.metrics.require_auth);
    }

    #[test]
    fn background_work_leaves_requests_answered_in_place_a_slot() {
        let slots = |all: &str, background: &str| {
            load(
                None,
                &env(&[
                    ("AIRLOCK_CONCURRENCY__MAX_RUNNING", all),
                    ("AIRLOCK_BACKGROUND__MAX_RUNNING", background),
                ]),
                None,
                None,
            )
        };
        for (all, background) in [("2", "2"), ("4", "5"), ("4", "4")] {
            let e = slots(all, background).unwrap_err();
            assert!(
                e.to_string()
                    .contains("max_running must be below concurrency.max_running"),
                "{e}"
            );
        }
        // One slot in all: taken, and no background work runs (the server says so).
        assert!(slots("1", "1").is_ok());
        assert!(slots("4", "3").is_ok());
    }

    #[test]
    fn a_session_lifetime_too_short_to_start_in_is_refused() {
        for (var, value) in [
            ("AIRLOCK_SESSIONS__MAX_LIFETIME_MS", "999"),
            ("AIRLOCK_SESSIONS__IDLE_TIMEOUT_MS", "0"),
            ("AIRLOCK_SESSIONS__IDLE_TIMEOUT_MS", "999"),
        ] {
            let e = load(None, &env(&[(var, value)]), None, None).unwrap_err();
            assert!(
                e.to_string()
                    .contains("sessions.max_lifetime_ms must be at least 1000"),
                "{e}"
            );
        }
        load(
            None,
            &env(&[("AIRLOCK_SESSIONS__MAX_LIFETIME_MS", "1000")]),
            None,
            None,
        )
        .unwrap();
    }

    #[test]
    fn environment_variables_override_the_file_and_flags_override_both() {
        let dir = std::env::temp_dir().join(format!("airlock-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("airlock.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9000\"\n[concurrency]\nmax_running = 3\nmax_queue = 5\n",
        )
        .unwrap();
        let e = env(&[
            ("AIRLOCK_CONCURRENCY__MAX_RUNNING", "7"),
            ("AIRLOCK_ENGINE__DEFAULTS__TIMEOUT_MS", "1234"),
            (
                "AIRLOCK_CORS__ALLOWED_ORIGINS",
                r#"["https://app.example"]"#,
            ),
            ("AIRLOCK_STATE_DIR", "/srv/airlock"),
            ("AIRLOCK_TOOLS__RESERVED_PER_SERVER", "2"),
            ("AIRLOCK_TELEMETRY__OTLP_ENDPOINT", "http://collector:4318"),
            ("AIRLOCK_LOG_FORMAT", "json"),
            ("AIRLOCK_API_KEY", "not a setting"),
            ("PATH", "/usr/bin"),
        ]);
        let c = load(
            Some(&file),
            &e,
            Some("127.0.0.1:9100".parse().unwrap()),
            None,
        )
        .unwrap();
        assert_eq!(c.concurrency.max_running, 7, "env beats the file");
        assert_eq!(c.concurrency.max_queue, 5, "the file beats the defaults");
        assert_eq!(c.engine.defaults.timeout_ms, 1234);
        assert_eq!(c.cors.allowed_origins, ["https://app.example"]);
        assert_eq!(c.state_dir, Some(PathBuf::from("/srv/airlock")));
        assert_eq!(c.tools.reserved_per_server, Some(2), "an optional setting");
        assert_eq!(
            c.telemetry.traces_url().as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.listen.port(), 9100, "the flag beats everything");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn state_and_logs_go_where_the_host_s_conventions_say() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let home = vars(&[("HOME", "/home/u")]);
        let p = PathBuf::from;
        // A user: XDG's places; root: the system's; systemd's directories first.
        assert_eq!(
            state_dir_from(None, &home, false),
            p("/home/u/.local/share/airlock")
        );
        assert_eq!(state_dir_from(None, &home, true), p("/var/lib/airlock"));
        let systemd = vars(&[
            ("HOME", "/root"),
            ("STATE_DIRECTORY", "/var/lib/airlock:/var/lib/other"),
            ("LOGS_DIRECTORY", "/var/log/airlock"),
        ]);
        assert_eq!(state_dir_from(None, &systemd, true), p("/var/lib/airlock"));
        let xdg = vars(&[
            ("HOME", "/root"),
            ("XDG_DATA_HOME", "/d"),
            ("XDG_STATE_HOME", "/s"),
        ]);
        assert_eq!(state_dir_from(None, &xdg, true), p("/d/airlock"));
        assert_eq!(
            state_dir_from(Some(Path::new("/given")), &systemd, true),
            p("/given")
        );

        let mut c = Config::default();
        assert_eq!(
            audit_path_from(&c, &home, false),
            p("/home/u/.local/state/airlock/audit.jsonl")
        );
        assert_eq!(
            audit_path_from(&c, &home, true),
            p("/var/log/airlock/audit.jsonl")
        );
        assert_eq!(audit_path_from(&c, &xdg, true), p("/s/airlock/audit.jsonl"));
        assert_eq!(
            audit_path_from(&c, &systemd, true),
            p("/var/log/airlock/audit.jsonl")
        );
        // A state directory given is the one place the operator chose.
        c.state_dir = Some(p("/srv/airlock"));
        assert_eq!(
            audit_path_from(&c, &xdg, true),
            p("/srv/airlock/audit.jsonl")
        );
        c.audit.path = Some(p("/logs/audit.jsonl"));
        assert_eq!(audit_path_from(&c, &systemd, true), p("/logs/audit.jsonl"));
    }

    #[test]
    fn a_config_file_is_found_in_the_user_s_place_when_none_is_named() {
        let dir = std::env::temp_dir().join(format!("airlock-xdg-{}", std::process::id()));
        let file = dir.join("airlock/airlock.toml");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "[concurrency]\nmax_running = 3\n").unwrap();
        let e = env(&[("XDG_CONFIG_HOME", dir.to_str().unwrap())]);
        assert_eq!(config_file(None, &e), Some(file.clone()));
        assert_eq!(
            load(None, &e, None, None).unwrap().concurrency.max_running,
            3
        );
        // Named files win; AIRLOCK_CONFIG too.
        let named = dir.join("named.toml");
        std::fs::write(&named, "").unwrap();
        assert_eq!(config_file(Some(&named), &e), Some(named.clone()));
        let e2 = env(&[
            ("XDG_CONFIG_HOME", dir.to_str().unwrap()),
            ("AIRLOCK_CONFIG", named.to_str().unwrap()),
        ]);
        assert_eq!(config_file(None, &e2), Some(named));
        std::fs::remove_dir_all(&dir).unwrap();
        // Nothing there: the system's file, if it exists, else none.
        let e = env(&[("XDG_CONFIG_HOME", "/nonexistent")]);
        let system = Path::new("/etc/airlock/airlock.toml");
        assert_eq!(
            config_file(None, &e),
            system.is_file().then(|| system.to_path_buf())
        );
    }

    #[test]
    fn test_variables_and_the_client_s_are_not_settings() {
        let e = env(&[
            ("AIRLOCK_TEST_EVAL_SEED", "7"),
            ("AIRLOCK_TEST_ANYTHING__AT_ALL", "x"),
            ("AIRLOCK_URL", "http://127.0.0.1:8080"),
        ]);
        assert!(load(None, &e, None, None).is_ok());
        // The prefix is the whole word: a setting's typo next to it still fails.
        for typo in ["AIRLOCK_TESTS_X", "AIRLOCK_URLS", "AIRLOCK_TEST"] {
            let e = env(&[(typo, "1")]);
            assert!(
                matches!(
                    load(None, &e, None, None),
                    Err(ConfigError::UnknownVariable(_))
                ),
                "{typo}"
            );
        }
    }

    #[test]
    fn typos_and_bad_values_are_errors() {
        let e = env(&[("AIRLOCK_CONCURENCY__MAX_RUNNING", "7")]);
        assert!(matches!(
            load(None, &e, None, None),
            Err(ConfigError::UnknownVariable(_))
        ));
        let e = env(&[("AIRLOCK_CONCURRENCY__MAX_RUNNING", "many")]);
        assert!(load(None, &e, None, None)
            .unwrap_err()
            .to_string()
            .contains("max_running"));
        for origin in ["*", "null", "https://a.example/", "app.example"] {
            let e = env(&[("AIRLOCK_CORS__ALLOWED_ORIGINS", &format!("[{origin:?}]"))]);
            assert!(load(None, &e, None, None).is_err(), "{origin}");
        }
    }

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
    fn the_mcp_progress_interval_is_at_least_1_ms_and_at_most_10_s() {
        for (value, ok) in [("0", false), ("1", true), ("10000", true), ("10001", false)] {
            let vars = env(&[("AIRLOCK_MCP__PROGRESS_INTERVAL_MS", value)]);
            match load(None, &vars, None, None) {
                Ok(c) => {
                    assert!(ok, "{value} was taken");
                    assert_eq!(c.mcp.progress_interval_ms.to_string(), value);
                }
                Err(e) => {
                    assert!(!ok, "{value}: {e}");
                    assert!(e.to_string().contains("mcp.progress_interval_ms"), "{e}");
                }
            }
        }
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

    #[test]
    fn the_example_file_sets_every_setting_to_its_default() {
        let text = include_str!("../../../airlock.example.toml");
        let example: toml::Table = text.parse().unwrap();
        let defaults = toml::Table::try_from(Config::default()).unwrap();
        fn keys(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
            for (k, v) in t {
                let path = format!("{prefix}{k}");
                match v {
                    toml::Value::Table(inner) => keys(inner, &format!("{path}."), out),
                    _ => out.push(path),
                }
            }
        }
        let (mut want, mut have) = (Vec::new(), Vec::new());
        keys(&defaults, "", &mut want);
        keys(&example, "", &mut have);
        want.sort();
        have.sort();
        assert_eq!(have, want, "airlock.example.toml must list every setting");
        let parsed: Config = Config::deserialize(example).unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn a_url_for_another_host_must_require_tls() {
        assert!(check_store_url("postgres://airlock@127.0.0.1:5432/db").is_ok());
        assert!(check_store_url("postgres://airlock@localhost/db").is_ok());
        assert!(check_store_url("postgres://airlock@db.internal/db?sslmode=require").is_ok());
        assert!(check_store_url("postgres://airlock@db.internal/db?sslmode=disable").is_ok());
        let err = check_store_url("postgres://airlock@db.internal/db").unwrap_err();
        assert!(err.contains("sslmode=require"), "{err}");
        assert!(check_store_url("postgres://airlock:pw@127.0.0.1/db")
            .unwrap_err()
            .contains("password"));
    }

    #[test]
    fn the_otlp_endpoint_is_a_url_with_a_host_and_no_password() {
        let with = |endpoint: &str| TelemetryConfig {
            otlp_endpoint: Some(endpoint.into()),
            ..TelemetryConfig::default()
        };
        for bad in [
            "collector:4318",
            "ftp://collector",
            "http://",
            "http://user:secret@collector:4318",
            "not a url",
        ] {
            assert!(with(bad).validate().is_err(), "{bad} was taken");
        }
        let base = with("https://collector.example:4318/");
        assert!(base.validate().is_ok());
        assert_eq!(
            base.traces_url().as_deref(),
            Some("https://collector.example:4318/v1/traces")
        );
        let own = with("http://collector/custom/traces");
        assert_eq!(
            own.traces_url().as_deref(),
            Some("http://collector/custom/traces")
        );
        assert_eq!(own.collector(), Some(("collector".into(), 80)));
        assert!(TelemetryConfig::default().validate().is_ok());
        assert_eq!(TelemetryConfig::default().traces_url(), None);
    }
}
