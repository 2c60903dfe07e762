//! What the tools' descriptions say of this server and of their caller, in the words they
//! share: the limits, the sandbox (its network, the named environments, the caller's
//! volumes), the verdicts, sessions, and the operator's tools the caller's code may call.
//! Made once for each `tools/list`; each tool's description (`tools.rs`) puts its own words
//! around them.

use airlock_service::config::Config;
use airlock_service::keys::Key;
use airlock_service::Services;

/// The pieces the descriptions share, for one caller (or none, when the caller is not known).
pub(super) struct Prose<'a> {
    /// The server's settings, for the figures a description names.
    pub config: &'a Config,
    /// The limits of an execution: the defaults, and the most `timeout_seconds` may ask for.
    pub limits: String,
    /// The sandbox the code runs in, as the caller's code sees it.
    pub sandbox: String,
    /// What an answer says, status by status.
    pub verdicts: &'static str,
    /// What a session is, and when it is closed.
    pub session: String,
    /// The operator's tools the caller's code may call, when there are any (else empty).
    pub code_mode: String,
}

/// Milliseconds in whole seconds, rounded up.
pub(super) fn secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

impl<'a> Prose<'a> {
    pub(super) fn new(state: &'a Services, caller: Option<&Key>) -> Prose<'a> {
        let limits = limits(state);
        let network = network(caller);
        let environments = environments(state);
        let volumes = volumes(state, caller);
        let sandbox = format!(
            "It runs in a fresh Linux sandbox: {network}, none of the host's files, an \
             unprivileged user, a private writable working directory.{environments}{volumes}"
        );
        let verdicts = "The answer says the status (ok, error, timeout, memory_limit, \
                        cpu_limit, policy_violation, crashed), stdout, stderr, the value of a \
                        final bare expression (result) and any exception with its traceback; \
                        matplotlib figures (shown or left open) come back as PNG images. Any \
                        status but ok is marked as an error.";
        let session = format!(
            "A session is one sandboxed Python interpreter kept between calls: variables, \
             imports and files stay. It is closed after {} s unused or {} s in all, and when a \
             cell ends it by a limit. One call at a time per session.",
            secs(state.config.sessions.idle_timeout_ms),
            secs(state.config.sessions.max_lifetime_ms)
        );
        Prose {
            config: &state.config,
            limits,
            sandbox,
            verdicts,
            session,
            code_mode: code_mode(state, caller),
        }
    }
}

fn limits(state: &Services) -> String {
    let engine = state.engine.config();
    let d = &engine.defaults;
    let c = &engine.ceilings;
    format!(
        "Limits: {} s of wall clock by default (timeout_seconds, at most {} s), {} MB of \
         memory, {} processes, {} MB of disk, {} bytes of output per stream (cut beyond).",
        secs(d.timeout_ms),
        // Whole seconds within the ceiling: what is advertised is accepted.
        (c.timeout_ms / 1000).max(1),
        d.memory_mb,
        d.pids,
        d.disk_mb,
        d.output_bytes
    )
}

/// The caller's egress: none, or the hosts and ranges its proxy lets through.
fn network(caller: Option<&Key>) -> String {
    let egress = caller
        .map(|k| &k.config.egress)
        .filter(|e| !e.allows_nothing());
    match egress {
        None => "no network".to_owned(),
        Some(policy) => {
            let mut allowed: Vec<String> = policy
                .hosts
                .iter()
                .map(|h| format!("{}:{:?}", h.host, h.ports))
                .collect();
            allowed.extend(
                policy
                    .ranges
                    .iter()
                    .map(|r| format!("{}:{:?}", r.cidr, r.ports)),
            );
            format!(
                "no network but HTTP and HTTPS through a proxy (HTTPS_PROXY is set; pip and \
                 requests use it) to {} only, with no DNS inside",
                allowed.join(", ")
            )
        }
    }
}

fn environments(state: &Services) -> String {
    let environments: Vec<String> = state
        .environments
        .list()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.name)
        .collect();
    if environments.is_empty() {
        String::new()
    } else {
        format!(
            " Named environments with more packages (the environment argument): {}.",
            environments.join(", ")
        )
    }
}

fn volumes(state: &Services, caller: Option<&Key>) -> String {
    let volumes: Vec<String> = caller
        .and_then(|k| state.volumes.list(&k.fingerprint()).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|v| format!("{} ({} MiB)", v.name, v.size_bytes >> 20))
        .collect();
    if volumes.is_empty() {
        String::new()
    } else {
        format!(
            " Your volumes, directories that outlive every call (the volumes argument \
             mounts them; one writer at a time): {}.",
            volumes.join(", ")
        )
    }
}

/// The operator's tools granted to the caller, by server, as `import tools` offers them.
fn code_mode(state: &Services, caller: Option<&Key>) -> String {
    let (Some(key), Some(registry)) = (caller, &state.tools) else {
        return String::new();
    };
    let mut modules: Vec<String> = Vec::new();
    for api in registry.apis(&key.grants) {
        let (server, function) = api.name.split_once('.').unwrap_or(("", ""));
        match modules.last_mut() {
            Some(m) if m.starts_with(&format!("tools.{server} ")) => {
                m.insert_str(m.len() - 1, &format!(", {function}"));
            }
            _ => modules.push(format!("tools.{server} ({function})")),
        }
    }
    if modules.is_empty() {
        String::new()
    } else {
        format!(
            " The code can call the operator's tools through `import tools` \
             (the credentials stay outside the sandbox): {}. Call list_tool_apis \
             for their Python signatures before writing code; \
             tools.search(\"words\") finds tools from the code; a failed call \
             raises tools.ToolError.",
            modules.join("; ")
        )
    }
}
