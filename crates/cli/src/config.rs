//! The server's configuration, read: precedence, lowest first, the embedded defaults (which
//! need no editing), a TOML file (`--config` or `AIRLOCK_CONFIG`), `AIRLOCK_*` environment
//! variables, and the command-line flags `--listen` and `--state-dir`. The libraries take the
//! result as plain values ([`Config`]), with what the host decides settled ([`settle`]); none
//! of them reads a file or the environment.
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

use airlock_server::config::{Config, Invalid, StorePassword, AUDIT_FILE, SYSTEM_STATE_DIR};
use serde::Deserialize;

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
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// Builds the effective configuration. `env` is the process environment (passed in so tests
/// can use their own).
pub fn load(
    file: Option<&Path>,
    env: &BTreeMap<String, String>,
    listen: Option<SocketAddr>,
    state_dir: Option<PathBuf>,
) -> Result<Config, ConfigError> {
    let mut tree = toml::Table::try_from(Config::default()).map_err(|e| Invalid(e.to_string()))?;
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

/// The configuration as the libraries take it, with what the host decides settled from `env`:
/// the state directory and the audit log's file by the host's conventions (unless given), and
/// the store's password from `AIRLOCK_STORE_PASSWORD`. `--print-config` shows the
/// configuration before this.
pub fn settle(mut config: Config, env: &BTreeMap<String, String>) -> Config {
    let var = |name: &str| env.get(name).cloned();
    let root = is_root();
    // The audit log's place depends on whether a state directory was given: first.
    let audit = audit_path_from(&config, &var, root);
    config.state_dir = Some(state_dir_from(config.state_dir.as_deref(), &var, root));
    config.audit.path = Some(audit);
    config.store.password = env.get(ENV_STORE_PASSWORD).cloned().map(StorePassword::new);
    config
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

/// The state directory: the one given (`--state-dir`, `state_dir`); else systemd's
/// `$STATE_DIRECTORY` (`StateDirectory=`); else `$XDG_DATA_HOME/airlock`; else, for root,
/// `/var/lib/airlock`; else `~/.local/share/airlock`.
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
        _ => PathBuf::from(SYSTEM_STATE_DIR),
    }
}

/// The audit log's file: `[audit] path`; else `audit.jsonl` in systemd's `$LOGS_DIRECTORY`
/// (`LogsDirectory=`); else in the state directory when one is given (`--state-dir`,
/// `state_dir`, `$STATE_DIRECTORY`), as the operator chose one place; else where a user's logs
/// go: `$XDG_STATE_HOME/airlock`, `/var/log/airlock` for root, `~/.local/state/airlock`.
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

/// The configuration as TOML, as `--print-config` shows it (key hashes only, never keys).
pub fn to_toml(config: &Config) -> String {
    toml::to_string_pretty(config)
        .unwrap_or_else(|e| format!("# cannot print the configuration: {e}\n"))
}

/// The log filter: `AIRLOCK_LOG`, else `RUST_LOG` (the ecosystem's habit), else
/// `info,rmcp=warn`; an empty or invalid one counts as unset. The default keeps rmcp's own
/// per-connection lines (a tool server's handshake) out.
pub fn log_filter(env: &BTreeMap<String, String>) -> tracing_subscriber::EnvFilter {
    [ENV_LOG, "RUST_LOG"]
        .iter()
        .filter_map(|name| env.get(*name).filter(|v| !v.trim().is_empty()))
        .find_map(|v| tracing_subscriber::EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info,rmcp=warn"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_server::config::LogFormat;

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
    fn the_log_filter_is_airlock_log_then_rust_log_then_info() {
        let shown = |pairs: &[(&str, &str)]| log_filter(&env(pairs)).to_string();
        assert_eq!(shown(&[]), "rmcp=warn,info");
        assert_eq!(shown(&[("RUST_LOG", "debug")]), "debug");
        assert_eq!(
            shown(&[("RUST_LOG", "debug"), ("AIRLOCK_LOG", "warn")]),
            "warn"
        );
        assert_eq!(
            shown(&[("AIRLOCK_LOG", ""), ("RUST_LOG", "error")]),
            "error"
        );
    }

    /// What the host decides reaches the libraries as values: the places its conventions
    /// pick, unless the operator gave them, and the store's password, which no printout shows.
    #[test]
    fn settling_gives_the_host_s_places_and_the_store_s_password_as_values() {
        let e = env(&[
            ("HOME", "/home/u"),
            ("XDG_DATA_HOME", "/d"),
            ("XDG_STATE_HOME", "/s"),
            ("AIRLOCK_STORE_PASSWORD", "not shown"),
        ]);
        let c = settle(Config::default(), &e);
        assert_eq!(c.state_dir(), PathBuf::from("/d/airlock"));
        assert_eq!(c.audit_path(), PathBuf::from("/s/airlock/audit.jsonl"));
        assert_eq!(
            c.store.password.as_ref().map(StorePassword::text),
            Some("not shown")
        );
        assert!(!format!("{c:?}").contains("not shown"));
        assert!(!to_toml(&c).contains("not shown"));
        // Given places are kept; the audit log goes with a given state directory.
        let given = Config {
            state_dir: Some(PathBuf::from("/given")),
            ..Config::default()
        };
        let c = settle(given, &env(&[("XDG_STATE_HOME", "/s")]));
        assert_eq!(c.state_dir(), PathBuf::from("/given"));
        assert_eq!(c.audit_path(), PathBuf::from("/given/audit.jsonl"));
        assert_eq!(c.store.password, None);
    }
}
