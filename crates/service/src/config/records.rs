//! `[audit]`, `[store]` and `[telemetry]`: what is recorded, and where it goes.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[audit]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// `background`: lines are synced to disk as they are written (at most one sync every
    /// `sync_every_ms`, which the lines written meanwhile share), and nothing waits for it;
    /// `answer`: each sync at once, and an execution's answer waits for its record to be on
    /// disk.
    pub sync: AuditSync,
    /// With `sync = "background"`, the least time between two syncs' starts: what a power cut
    /// can lose, at most, beside one sync's own time. A quiet server's first line is synced at
    /// once all the same.
    pub sync_every_ms: u64,
    /// The audit log's file (see [`Config::audit_path`](super::Config::audit_path) for where it goes
    /// by default).
    pub path: Option<PathBuf>,
}

/// The most `[audit] sync_every_ms` may be: a second of lines at most is ever at stake.
pub const MAX_SYNC_EVERY_MS: u64 = 1000;

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            sync: AuditSync::default(),
            sync_every_ms: DEFAULT_SYNC_EVERY_MS,
            path: None,
        }
    }
}

impl AuditConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_SYNC_EVERY_MS).contains(&self.sync_every_ms) {
            return Err(format!(
                "audit.sync_every_ms ({}) must be between 1 and {MAX_SYNC_EVERY_MS}",
                self.sync_every_ms
            ));
        }
        Ok(())
    }

    /// The least time between two syncs' starts (none when each answer waits for its own).
    pub fn sync_interval(&self) -> std::time::Duration {
        match self.sync {
            AuditSync::Background => std::time::Duration::from_millis(self.sync_every_ms),
            AuditSync::Answer => std::time::Duration::ZERO,
        }
    }
}

/// `[audit] sync_every_ms` by default.
pub const DEFAULT_SYNC_EVERY_MS: u64 = 50;

/// When audit lines reach the disk (`[audit] sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditSync {
    /// Synced as written, on the syncer's thread, at most one sync every `sync_every_ms`;
    /// nothing waits for it.
    #[default]
    Background,
    /// Synced as soon as written, and an execution's answer waits for its record to be on
    /// disk.
    Answer,
}

/// The audit log's file name, in the directory
/// [`Config::audit_path`](super::Config::audit_path) picks.
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
    /// The password when `password_file` is not set: the binary gives the value of
    /// `AIRLOCK_STORE_PASSWORD` here. No file or setting names it, and `--print-config`
    /// never shows it.
    #[serde(skip)]
    pub password: Option<StorePassword>,
}

/// The store's password, held until a connection is made; its `Debug` shows no text.
#[derive(Clone, PartialEq, Eq)]
pub struct StorePassword(String);

impl StorePassword {
    pub fn new(text: String) -> Self {
        StorePassword(text)
    }

    pub fn text(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for StorePassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StorePassword(..)")
    }
}

/// Whether `url` is a PostgreSQL connection string airlock accepts: parseable, and without
/// a password (which `--print-config` would show: `password_file` or
/// `AIRLOCK_STORE_PASSWORD` hold it).
pub(super) fn check_store_url(url: &str) -> Result<(), String> {
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

    pub(super) fn validate(&self) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
