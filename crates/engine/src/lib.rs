//! Runs Python code in airlock sandboxes.
//!
//! Each execution gets a fresh sandbox (see `airlock-sandbox`) whose program is the host's
//! Python running `runner.py`. The code, its files and its options travel to the runner as a
//! request in Python's `marshal` format (plain values only, see `marshal`) on descriptor 3,
//! never pasted into source text; the runner answers on the same descriptor with the final
//! expression's value (converted to JSON inside the sandbox) or the exception. The status
//! comes from the kernel (see `verdict`).
#![forbid(unsafe_code)]

pub mod channel;
mod compiled;
mod config;
pub mod environments;
mod interpreter;
mod launcher;
mod marshal;
mod pool;
mod pump;
mod session;
pub mod snapshot;
mod tools;
mod verdict;
pub mod volumes;

/// Entry points for the fuzz targets (`fuzz/`, cargo fuzz): the host's parsing of what a
/// sandbox sends it. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// A program's response (its result or error, outputs and files), as the host reads it
    /// from a one-shot's or a session's channel: whether it was accepted.
    pub fn response(bytes: &[u8], limit: u64) -> bool {
        crate::verdict::parse_response(bytes, false, limit).is_ok()
    }

    /// Captured output as the result holds it: its length in bytes.
    pub fn output(bytes: &[u8], truncated: bool) -> usize {
        crate::pump::decode_output(bytes.to_vec(), truncated).len()
    }

    /// Reads `bytes` as a tool channel's frames, each at most `cap` bytes, as the tool broker
    /// does: the calls parsed before the end or the first breach of the protocol, and whether
    /// there was one.
    pub fn calls(bytes: &[u8], cap: u64) -> (usize, bool) {
        crate::tools::read_calls(bytes, cap)
    }

    /// `bytes` read as a channel's frames of at most `cap` bytes, whole (as the tool broker
    /// reads) and in pieces of `piece` bytes (as a session reads): the frames read before the
    /// end or the first broken one, and whether the two readers agree.
    pub fn frames(bytes: &[u8], cap: u64, piece: usize) -> (usize, bool) {
        let (whole, pieces) = crate::channel::read_both(bytes, cap, piece);
        let data = whole
            .iter()
            .filter(|f| matches!(f, crate::channel::Frame::Data(_)))
            .count();
        (data, whole == pieces)
    }
}
mod zygotes;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use airlock_api::{ExecutionResult, Limits, Status};
use std::sync::{Arc, Mutex, OnceLock};

use airlock_sandbox::{Enforcement, KillReason, Killer, Policy, Scratch, SpawnError};

pub use config::{EngineConfig, LimitError, Mechanism};
pub use interpreter::{Interpreter, InterpreterError};
use launcher::{Launcher, Mode};
pub use pool::{Pool, PoolConfig, PoolStatus};
pub use pump::{Discard, OutputSink, Stdin, Stream};
pub use session::{
    Cell, CellResult, ListedFile, Session, SessionError, SnapshotError, SnapshotReport,
    MAX_LIST_ENTRIES,
};
pub use tools::{tool_answer, ToolBridge, ToolCall, ToolValue, TOOLS_FD};
use verdict::Verdict;
pub use zygotes::{ZygoteConfig, ZygoteStatus};

/// The runner, passed to `python3 -c`: how a sandbox's Python ends as a zygote's children do
/// (the sandbox crate's `FINISH_PY`), then `runner.py`.
pub fn runner() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| [airlock_sandbox::FINISH_PY, include_str!("runner.py")].concat())
}
/// The rest of it, sent with each request and compiled only when needed (see runner.py).
const RUNNER_MORE: &str = include_str!("runner_more.py");
/// Where the code runs, inside the sandbox.
pub const WORKDIR: &str = "/work";
/// Writable directories, all on one tmpfs of `disk_mb`.
pub const SCRATCH_MOUNTS: [&str; 3] = ["/tmp", WORKDIR, "/dev/shm"];
pub(crate) const SANDBOX_UID: u32 = 1000;
/// Where the egress proxy listens on a sandbox's loopback (`HTTP_PROXY` points there).
pub const EGRESS_PORT: u16 = 3128;
/// Where `pip install` inside a sandbox puts packages (on the scratch file system).
const PIP_TARGET: &str = "/tmp/packages";
/// The host's CA certificates (Debian's bundle), mounted for sandboxes with egress.
const CA_BUNDLE: &str = airlock_egress::intercept::SYSTEM_BUNDLE;
/// Mounted for sandboxes with egress when the host has it.
const CURL: &str = "/usr/bin/curl";
const HOSTNAME: &str = "airlock";
const REPR_LIMIT: usize = 4096;
const MAX_DEPTH: usize = 64;
/// Input bounds that keep the work before a sandbox exists small (it is not under the wall
/// clock): environment variables (count and bytes, as execve itself bounds them) and files.
pub const MAX_ENV_VARS: usize = 256;
pub const MAX_ENV_BYTES: usize = 64 * 1024;
pub const MAX_FILES: usize = 1000;
/// Room for an error's message and traceback beyond the result limit.
pub(crate) const RESPONSE_OVERHEAD: u64 = 128 * 1024;
const MIB: u64 = 1 << 20;

/// A file to place in the working directory before the code runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputFile {
    /// Relative to the working directory: no absolute paths, no `..`.
    pub path: String,
    pub data: Vec<u8>,
}

/// Function mode: a function the code defines, called once the code has run.
#[derive(Clone, Debug, PartialEq)]
pub struct Entrypoint {
    /// `name` or `Class.method`: identifiers, looked up in the code's namespace.
    pub name: String,
    /// Keyword arguments, plain data.
    pub inputs: serde_json::Map<String, serde_json::Value>,
}

/// Deepest nesting accepted in an entrypoint's inputs.
pub const MAX_INPUT_DEPTH: usize = 64;

/// One execution, with limits already resolved ([`EngineConfig::resolve_limits`]).
#[derive(Debug)]
pub struct Job {
    pub code: String,
    /// The name tracebacks show for the code.
    pub filename: String,
    pub stdin: Stdin,
    pub env: Vec<(String, String)>,
    pub files: Vec<InputFile>,
    /// Function mode, when set: the code's final expression is not the result.
    pub entrypoint: Option<Entrypoint>,
    pub limits: Limits,
    /// Largest code accepted for this job ([`EngineConfig::code_limit`]).
    pub max_code_bytes: u64,
    /// Line-buffer the program's stdout so output streams as it is printed.
    pub stream: bool,
    /// Also print an uncaught exception's traceback on stderr, as Python itself would.
    pub echo_traceback: bool,
    /// Lets another thread stop the execution (the result is then `internal_error`).
    pub cancel: Option<Cancel>,
    /// Code mode: the operator's tools this job may call, through a channel of its own.
    pub tools: Option<Arc<dyn ToolBridge>>,
    /// Egress through airlock's proxy under this leash's policy; [`None`]: no network at all.
    pub egress: Option<Arc<airlock_egress::Leash>>,
    /// A named environment mounted at `/env` (read-only; writable only for its own build),
    /// its site-packages ahead of the interpreter's.
    pub environment: Option<environments::EnvMount>,
    /// Volumes mounted into the sandbox, each with its lease, held until the sandbox is gone.
    pub volumes: Vec<volumes::JobVolume>,
}

/// Cancels a running execution from another thread, e.g. on SIGINT. Cancelling before the
/// sandbox exists kills it as soon as it does.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<Mutex<CancelState>>);

#[derive(Debug, Default)]
struct CancelState {
    cancelled: bool,
    killer: Option<Killer>,
}

impl Cancel {
    fn state(&self) -> std::sync::MutexGuard<'_, CancelState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn cancel(&self) {
        let mut state = self.state();
        state.cancelled = true;
        if let Some(killer) = &state.killer {
            killer.kill(KillReason::Cancelled);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.state().cancelled
    }

    fn attach(&self, killer: Killer) {
        let mut state = self.state();
        if state.cancelled {
            killer.kill(KillReason::Cancelled);
        }
        state.killer = Some(killer);
    }

    fn detach(&self) {
        self.state().killer = None;
    }
}

/// A job refused before any sandbox starts: the field of the request at fault, and why. The
/// engine is the one owner of these checks; the server and the CLI map them to their answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// As a request names it: `code`, `stdin`, `env`, `env.NAME`, `files`, `files[2].path`,
    /// `entrypoint`, `inputs.x`, `path`.
    pub field: String,
    pub kind: RefusalKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// Over a size or count limit.
    TooLarge,
    /// Not a value the field may hold.
    Invalid,
}

impl Refusal {
    fn too_large(field: impl Into<String>, message: String) -> Self {
        Refusal {
            field: field.into(),
            kind: RefusalKind::TooLarge,
            message,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Refusal {
            field: field.into(),
            kind: RefusalKind::Invalid,
            message: message.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Invalid(#[from] Refusal),
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error(transparent)]
    Interpreter(#[from] InterpreterError),
    #[error("cannot start a sandbox: {0}")]
    Spawn(#[from] SpawnError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the execution was cancelled before its sandbox started")]
    Cancelled,
    /// A pooled child of the preloading zygote was asked for while that zygote cannot serve:
    /// a cold sandbox in its place would hold none of its preloads, so the pool waits.
    #[error("the preloading zygote is not ready")]
    ZygoteNotReady,
}

/// One execution's result, and how long its sandbox took to be ready.
#[derive(Debug)]
pub struct Execution {
    pub result: ExecutionResult,
    /// From starting the sandbox to its program being confined and about to run; for a
    /// sandbox from the warm pool, the time it took to take it.
    pub sandbox_ready: Option<Duration>,
    /// Whether the sandbox came from the warm pool.
    pub pooled: bool,
    /// Whether the sandbox was a zygote's child (see `zygotes`); a cold one otherwise.
    pub forked: bool,
    /// The sandbox could not be built (its `internal_error`, a `SandboxError`): the host's
    /// fault, such as a path it mounts gone, never the program's or its client's.
    pub setup_failed: bool,
    /// When its steps ended, for the server's traces.
    pub timings: Timings,
}

/// When an execution's steps ended (`None`: not taken, or not known), for the server's
/// traces: the sandbox asked for, it was ready, the program was over, its response parsed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// A sandbox asked for: taken from a pool, forked by a zygote or started cold.
    pub asked: Option<std::time::Instant>,
    /// The program about to run.
    pub ready: Option<std::time::Instant>,
    /// The program ended, its output and response read.
    pub ran: Option<std::time::Instant>,
    /// The response parsed into the result.
    pub parsed: Option<std::time::Instant>,
}

/// Runs jobs. Cheap to share between threads.
#[derive(Clone, Debug)]
pub struct Engine {
    config: EngineConfig,
    /// What starts sandboxes, the pools' too (see `launcher`).
    launcher: Launcher,
    pool: Option<Arc<Pool>>,
    /// Children of the preloading zygote, ready (see [`PoolConfig::preloaded`]).
    preloaded_pool: Option<Arc<Pool>>,
    /// Pools per environment, started when one is first asked for (see `env_pool`).
    env_pools: Option<Arc<EnvPools>>,
    defer_cleanup: bool,
}

/// Warm pools for environments in demand: one per stored environment, started by the first
/// execution that names it (which itself starts cold), closed once unused for
/// `ENV_POOL_IDLE`.
#[derive(Debug)]
struct EnvPools {
    config: PoolConfig,
    pools: Mutex<std::collections::BTreeMap<String, (Arc<Pool>, std::time::Instant)>>,
}

/// How long an environment's pool outlives its last execution.
const ENV_POOL_IDLE: Duration = Duration::from_secs(600);

impl Engine {
    pub fn new(config: EngineConfig) -> Result<Self, EngineError> {
        let interpreter = Interpreter::detect(&config.python)?;
        Ok(Engine {
            config,
            launcher: Launcher::new(interpreter),
            pool: None,
            preloaded_pool: None,
            env_pools: None,
            defer_cleanup: false,
        })
    }

    /// Cold sandboxes load the runner compiled once (see `compiled`) instead of compiling its
    /// source, kept in `cache_dir` (made if missing). On failure they keep the source.
    pub fn use_compiled_runner(&mut self, cache_dir: &Path) -> Result<(), String> {
        let policy = self.policy(&self.config.defaults);
        let python = &self.launcher.interpreter.path;
        let runner = compiled::CompiledRunner::load(python, runner(), &policy, cache_dir)?;
        self.launcher.compiled = Some(runner);
        Ok(())
    }

    /// The next cold sandbox starts with `init`, an init started ahead (see
    /// [`airlock_sandbox::Prestarted`]); one never used is killed with the engine.
    pub fn use_prestarted(&self, init: airlock_sandbox::Prestarted) {
        *self
            .launcher
            .prestarted
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(init);
    }

    /// Makes fresh sandboxes forks of zygotes from now on, where a zygote serves them (this
    /// engine and its clones made from now on). Start before the pool, so that it uses them.
    pub fn start_zygotes(&mut self, config: ZygoteConfig) {
        self.launcher.zygotes = Some(zygotes::Zygotes::new(config));
    }

    /// What the zygotes do; [`None`] when they were never started.
    pub fn zygote_status(&self) -> Option<ZygoteStatus> {
        self.launcher.zygotes.as_ref().map(|z| z.status())
    }

    /// Answers as soon as a sandbox's processes are gone, leaving the removal of its empty
    /// cgroup to a background thread (a long-running server; [`airlock_sandbox::settle`] must
    /// be called before exiting).
    pub fn defer_cleanup(&mut self) {
        self.defer_cleanup = true;
    }

    /// Starts a warm pool (see `pool`) that this engine, and its clones made from now on,
    /// take sandboxes from.
    pub fn start_pool(&mut self, config: PoolConfig) -> Result<Arc<Pool>, String> {
        let pool = Arc::new(Pool::start(self, config.clone())?);
        self.pool = Some(pool.clone());
        let preloads = self.launcher.zygotes.as_ref().is_some_and(|z| z.preloads());
        if config.size > 0 && config.preloaded > 0 && preloads {
            // Children of the preloading zygote, for code that names its packages: they
            // have no fork and jail to wait for, as the lean ones.
            let preloaded = PoolConfig {
                size: config.preloaded,
                max_size: config.preloaded,
                workers: 1,
                ..config.clone()
            };
            let policy = self.policy(&self.config.defaults);
            let pool = Pool::start_for(&self.launcher, preloaded, policy, true)?;
            self.preloaded_pool = Some(Arc::new(pool));
        }
        if config.size > 0 {
            // An environment keeps one sandbox ready once asked for, more while in demand.
            let config = PoolConfig {
                size: 1,
                max_size: config.max_size.clamp(1, 4),
                workers: 1,
                // Its sandboxes start cold (tens of milliseconds): one barely begun would
                // rarely be ready within a wait meant for a zygote's child.
                wait_for_refill_ms: 0,
                ..config
            };
            self.env_pools = Some(Arc::new(EnvPools {
                config,
                pools: Mutex::new(std::collections::BTreeMap::new()),
            }));
        }
        Ok(pool)
    }

    /// The pool of `env`'s sandboxes, started now if it was not running; pools unused for
    /// `ENV_POOL_IDLE` are closed on the way.
    fn env_pool(&self, env: &environments::EnvMount) -> Option<Arc<Pool>> {
        let pools = self.env_pools.as_ref()?;
        let now = std::time::Instant::now();
        let (pool, stale) = {
            let mut map = pools.pools.lock().unwrap_or_else(|e| e.into_inner());
            let stale: Vec<Arc<Pool>> = {
                let old: Vec<String> = map
                    .iter()
                    .filter(|(hash, (_, used))| {
                        **hash != env.hash && now.duration_since(*used) > ENV_POOL_IDLE
                    })
                    .map(|(hash, _)| hash.clone())
                    .collect();
                old.iter()
                    .filter_map(|h| map.remove(h))
                    .map(|(p, _)| p)
                    .collect()
            };
            let pool = match map.get_mut(&env.hash) {
                Some((pool, used)) => {
                    *used = now;
                    Some(pool.clone())
                }
                None => {
                    // Built for the default limits, like the main pool's.
                    let mut policy = self.policy(&self.config.defaults);
                    with_environment(&mut policy, env);
                    let config = pools.config.clone();
                    if let Ok(pool) = Pool::start_for(&self.launcher, config, policy, false) {
                        map.insert(env.hash.clone(), (Arc::new(pool), now));
                    }
                    // This execution goes cold; the next finds a sandbox ready.
                    None
                }
            };
            (pool, stale)
        };
        for pool in stale {
            pool.close();
        }
        pool
    }

    /// Closes the pool of the environment stored as `hash`, if it has one.
    pub fn close_environment_pool(&self, hash: &str) {
        let Some(pools) = &self.env_pools else {
            return;
        };
        let pool = pools
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(hash);
        if let Some((pool, _)) = pool {
            pool.close();
        }
    }

    /// The pools of environments, with how many sandboxes each holds ready.
    pub fn environment_pools(&self) -> Vec<(String, PoolStatus)> {
        let Some(pools) = &self.env_pools else {
            return Vec::new();
        };
        let map = pools.pools.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .map(|(hash, (pool, _))| (hash.clone(), pool.status()))
            .collect()
    }

    /// Closes every pool: the default one and the environments'.
    pub fn close_pools(&self) {
        if let Some(pools) = &self.env_pools {
            let all: Vec<Arc<Pool>> =
                std::mem::take(&mut *pools.pools.lock().unwrap_or_else(|e| e.into_inner()))
                    .into_values()
                    .map(|(p, _)| p)
                    .collect();
            for pool in all {
                pool.close();
            }
        }
        for pool in [&self.pool, &self.preloaded_pool].into_iter().flatten() {
            pool.close();
        }
        if let Some(zygotes) = &self.launcher.zygotes {
            zygotes.close();
        }
    }

    pub fn pool(&self) -> Option<&Arc<Pool>> {
        self.pool.as_ref()
    }

    /// The pool of the preloading zygote's children (see [`PoolConfig::preloaded`]).
    pub fn preloaded_pool(&self) -> Option<&Arc<Pool>> {
        self.preloaded_pool.as_ref()
    }

    /// Waits until the zygote that would make `job`'s sandbox is ready (starting it if need
    /// be), for a caller that wants its one execution to be a zygote's child (`airlock run
    /// --zygote`). Errors say why it cannot be.
    pub fn wait_for_zygote(&self, job: &Job, within: Duration) -> Result<(), String> {
        let policy = self.job_policy(job);
        self.launcher.wait_for_zygote(&policy, &job.code, within)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The most memory one execution's result can hold, under `limits`: both captured
    /// streams as written, and the sandbox's response (result, error, outputs, files) once
    /// parsed and serialized again (twice its bytes: numbers and escapes can grow a little
    /// when written back).
    pub fn result_bytes(&self, limits: &Limits) -> u64 {
        self.config.result_bytes(limits)
    }

    pub fn interpreter(&self) -> &Interpreter {
        &self.launcher.interpreter
    }

    /// Checks a job before anything runs.
    /// The counts of environment variables and input files alone (part of [`Engine::check`]):
    /// a request with too many can be refused before anything of it is decoded.
    pub fn check_counts(&self, env: usize, files: usize) -> Result<(), Refusal> {
        if env > MAX_ENV_VARS {
            return Err(Refusal::too_large(
                "env",
                format!("{env} environment variables, over the limit of {MAX_ENV_VARS}"),
            ));
        }
        if files > MAX_FILES {
            return Err(Refusal::too_large(
                "files",
                format!("{files} input files, over the limit of {MAX_FILES}"),
            ));
        }
        Ok(())
    }

    pub fn check(&self, job: &Job) -> Result<(), EngineError> {
        let refused = |r: Refusal| Err(EngineError::Invalid(r));
        if job.code.len() as u64 > job.max_code_bytes {
            return refused(Refusal::too_large(
                "code",
                format!(
                    "code is {} bytes, over the limit of {} bytes",
                    job.code.len(),
                    job.max_code_bytes
                ),
            ));
        }
        let name_ok = !job.filename.is_empty()
            && job.filename.len() <= 255
            && !job.filename.contains(['/', '\0']);
        if !name_ok {
            return refused(Refusal::invalid(
                "filename",
                format!("invalid code file name {:?}", job.filename),
            ));
        }
        if let Stdin::Bytes(b) = &job.stdin {
            if b.len() as u64 > self.config.max_stdin_bytes {
                return refused(Refusal::too_large(
                    "stdin",
                    format!(
                        "stdin is {} bytes, over the limit of {} bytes",
                        b.len(),
                        self.config.max_stdin_bytes
                    ),
                ));
            }
        }
        self.check_counts(job.env.len(), job.files.len())?;
        let env_bytes: usize = job.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if env_bytes > MAX_ENV_BYTES {
            return refused(Refusal::too_large(
                "env",
                format!("the environment is {env_bytes} bytes, over the limit of {MAX_ENV_BYTES}"),
            ));
        }
        for (key, value) in &job.env {
            if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                return refused(Refusal::invalid(
                    format!("env.{key}"),
                    format!(
                        "invalid environment variable {key:?}: names must not be empty or \
                         contain = or NUL; values must not contain NUL"
                    ),
                ));
            }
        }
        let mut total = 0u64;
        for (i, file) in job.files.iter().enumerate() {
            check_relative_path(&file.path)
                .map_err(|m| Refusal::invalid(format!("files[{i}].path"), m))?;
            total += file.data.len() as u64;
        }
        let cap = self.config.max_files_bytes.min(job.limits.disk_mb * MIB);
        if total > cap {
            return refused(Refusal::too_large(
                "files",
                format!("input files total {total} bytes, over the limit of {cap} bytes"),
            ));
        }
        if let Some(entry) = &job.entrypoint {
            check_entrypoint(entry).map_err(|(field, m)| Refusal::invalid(field, m))?;
        }
        Ok(())
    }

    /// The sandbox policy for one execution.
    pub fn policy(&self, limits: &Limits) -> Policy {
        let enforce = |m| {
            if self.config.is_downgraded(m) {
                Enforcement::Disabled
            } else {
                Enforcement::Required
            }
        };
        let disk = limits.disk_mb * MIB;
        Policy {
            root: self.launcher.interpreter.root.clone(),
            scratch: Scratch {
                size_bytes: disk,
                // Enough for real work, not for millions of empty files.
                inodes: (limits.disk_mb * 256).clamp(1024, 1 << 20),
                mounts: SCRATCH_MOUNTS.iter().map(PathBuf::from).collect(),
            },
            workdir: PathBuf::from(WORKDIR),
            hostname: HOSTNAME.into(),
            uid: SANDBOX_UID,
            gid: SANDBOX_UID,
            limits: airlock_sandbox::Limits {
                wall_time: Duration::from_millis(limits.timeout_ms),
                cpu_time: Duration::from_millis(limits.cpu_ms),
                memory_bytes: limits.memory_mb * MIB,
                pids: limits.pids,
                open_files: self.config.open_files,
                file_size_bytes: disk,
                cpu_millicores: self.config.cpu_millicores,
            },
            seccomp: enforce(Mechanism::Seccomp),
            landlock: enforce(Mechanism::Landlock),
            cgroups: enforce(Mechanism::Cgroups),
            die_with_parent: true,
            egress_port: None,
            volumes: Vec::new(),
        }
    }

    /// The policy for `job`: its limits, and the egress listener and environment it asks for.
    fn job_policy(&self, job: &Job) -> Policy {
        let mut policy = self.policy(&job.limits);
        if let Some(leash) = &job.egress {
            with_egress_port(&mut policy, leash);
        }
        if let Some(env) = &job.environment {
            with_environment(&mut policy, env);
        }
        policy.volumes = job.volumes.iter().map(volumes::JobVolume::mount).collect();
        policy
    }

    /// The runner's request for `job`, whose sandbox has `policy` (see `marshal`); with the
    /// runner's on-demand part (`more`) unless its sandbox is a zygote's child, whose zygote
    /// has defined it once for all its children.
    fn runner_request(
        &self,
        job: &Job,
        policy: &Policy,
        more: bool,
    ) -> Result<Vec<u8>, EngineError> {
        use marshal::Value;
        // A limit past what one marshal integer holds is no limit anyway: no single answer
        // can be that large.
        let int = |n: u64| Value::Int(n.min(i32::MAX as u64) as i32);
        // After the standard library: the environment's and the interpreter's packages, then
        // where `pip install` puts packages in a sandbox.
        let mut sys_path = self.launcher.sys_path(policy);
        sys_path.push(PIP_TARGET.to_owned());
        let mut fields = vec![
            ("code", Value::Str(&job.code)),
            ("filename", Value::Str(&job.filename)),
            (
                "env",
                Value::Dict(
                    job.env
                        .iter()
                        .map(|(k, v)| (k.as_str(), Value::Str(v)))
                        .collect(),
                ),
            ),
            (
                "files",
                Value::List(
                    job.files
                        .iter()
                        .map(|f| {
                            Value::Dict(vec![
                                ("path", Value::Str(&f.path)),
                                ("data", Value::Bytes(&f.data)),
                            ])
                        })
                        .collect(),
                ),
            ),
            ("stream", Value::Bool(job.stream)),
            ("echo_traceback", Value::Bool(job.echo_traceback)),
            (
                "sys_path",
                Value::List(sys_path.iter().map(|p| Value::Str(p)).collect()),
            ),
            ("more", Value::Str(if more { RUNNER_MORE } else { "" })),
            ("result_limit", int(self.config.max_result_bytes)),
            ("repr_limit", int(REPR_LIMIT as u64)),
            ("max_depth", int(MAX_DEPTH as u64)),
        ];
        let package = job.tools.as_ref().map(|t| t.package());
        fields.push(("tools", marshal::tools_field(package.as_ref())));
        fields.extend(marshal::entrypoint_fields(job.entrypoint.as_ref()));
        marshal::encode(&Value::Dict(fields)).map_err(|e| EngineError::Io {
            what: "encoding the request",
            source: std::io::Error::other(e),
        })
    }

    /// The most a runner's response may hold: the result limit, and room for an error's
    /// message and traceback.
    fn response_limit(&self) -> u64 {
        self.config.max_result_bytes + RESPONSE_OVERHEAD
    }

    /// Runs one job in a fresh sandbox. Errors mean nothing ran (bad input, or a host that
    /// cannot enforce the policy); anything that happens once the sandbox exists is a result.
    pub fn execute(
        &self,
        mut job: Job,
        sink: &mut dyn OutputSink,
    ) -> Result<Execution, EngineError> {
        self.check(&job)?;
        let policy = self.job_policy(&job);
        // Encoded before a sandbox is taken, so that a request that cannot be is refused
        // without one; again with the runner's on-demand part for a cold sandbox.
        let mut request = self.runner_request(&job, &policy, false)?;
        if job.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
            return Err(EngineError::Cancelled);
        }
        let asked = std::time::Instant::now();
        // A job with tools has a channel of its own, the sandbox's end at descriptor 4.
        let (tools, tools_theirs) = match &job.tools {
            Some(bridge) => {
                let (ours, theirs) = socket_pair()?;
                (Some((bridge.clone(), ours)), Some(OwnedFd::from(theirs)))
            }
            None => (None, None),
        };
        // Held until the execution ends: the pool counts its sandbox in use meanwhile.
        let (sandbox, in_use) = self.sandbox_for(&job, &policy, tools_theirs)?;
        let pooled = in_use.is_some();
        let taken = pooled.then(|| asked.elapsed());
        let forked = sandbox.child.is_zygote_child();
        if !forked {
            request = self.runner_request(&job, &policy, true)?;
        }
        let stdin = std::mem::replace(&mut job.stdin, Stdin::Empty);
        let ran = self.run(sandbox, &job, stdin, request, tools, sink)?;
        let mut timings = Timings {
            asked: Some(asked),
            ran: Some(std::time::Instant::now()),
            ..Timings::default()
        };
        let io = ran.io;
        let outcome = match ran.waited {
            Ok(outcome) => outcome,
            Err(e) => {
                let mut iso = planned_isolation(&policy);
                with_egress(&mut iso, job.egress.as_deref());
                let usage = airlock_api::Usage::default();
                let result = Verdict::setup_failed(e.to_string())
                    .into_result(io.streams, usage, job.limits, iso);
                drop(in_use);
                return Ok(Execution {
                    result,
                    sandbox_ready: None,
                    pooled,
                    forked,
                    setup_failed: true,
                    timings,
                });
            }
        };
        let response =
            verdict::parse_response(&io.response, io.response_overflow, self.response_limit());
        let mut v = verdict::verdict(&outcome, response, &job.limits, io.streams.truncated());
        ran.breach.explain(outcome.killed, &mut v);
        let usage = airlock_api::Usage {
            wall_ms: outcome.usage.wall.as_millis() as u64,
            cpu_ms: outcome
                .usage
                .cpu
                .or(outcome.usage.program_cpu)
                .map(|d| d.as_millis() as u64),
            memory_peak_bytes: outcome.usage.memory_peak_bytes,
            tool_calls: ran.tool_calls,
            egress: ran.egress,
        };
        let mut iso = isolation(&outcome.isolation);
        with_egress(&mut iso, job.egress.as_deref());
        let result = v.into_result(io.streams, usage, job.limits, iso);
        timings.parsed = Some(std::time::Instant::now());
        drop(in_use);
        let sandbox_ready = taken.or(outcome.ready_after);
        timings.ready = sandbox_ready.map(|d| asked + d);
        Ok(Execution {
            result,
            sandbox_ready,
            pooled,
            forked,
            setup_failed: false,
            timings,
        })
    }

    /// A sandbox for `job`: one from a pool that holds one built alike (with its count of
    /// sandboxes in use), or one started now (with `tools`, the tool channel's end, when the
    /// job has tools).
    fn sandbox_for(
        &self,
        job: &Job,
        policy: &Policy,
        tools: Option<OwnedFd>,
    ) -> Result<(Sandbox, Option<pool::InUse>), EngineError> {
        // Pooled sandboxes are lean zygotes' children (or cold): code that names a preloaded
        // package takes a child of the zygote that has it loaded instead.
        let preload = self.launcher.wants_preloads(&job.code);
        // A pooled sandbox has no tool channel and no egress listener: a job with tools or
        // egress starts its own.
        // Nor volumes.
        let pool = match (&tools, &job.egress, &job.environment) {
            _ if !job.volumes.is_empty() => None,
            (None, None, None) if preload => self.preloaded_pool.clone(),
            _ if preload => None,
            (None, None, None) => self.pool.clone(),
            (None, None, Some(env)) if !env.writable => self.env_pool(env),
            _ => None,
        };
        if let Some((warm, in_use)) = pool.and_then(|p| p.take(policy)) {
            let mut child = warm.child;
            child.restart_clock(policy.limits.wall_time);
            let sandbox = Sandbox {
                child,
                control: warm.control,
            };
            return Ok((sandbox, Some(in_use)));
        }
        let (child, control) = self.launcher.start(policy, Mode::Cold, tools, preload)?;
        Ok((Sandbox { child, control }, None))
    }

    /// Runs `sandbox` to its end: the request in, the output and the response out (`pump`),
    /// with the egress proxy and the tool bridge beside it and the job's cancel attached.
    fn run(
        &self,
        sandbox: Sandbox,
        job: &Job,
        stdin: Stdin,
        request: Vec<u8>,
        tools: Option<(Arc<dyn ToolBridge>, UnixStream)>,
        sink: &mut dyn OutputSink,
    ) -> Result<Ran, EngineError> {
        let Sandbox { mut child, control } = sandbox;
        if self.defer_cleanup {
            child.defer_cleanup();
        }
        let serving = match (&job.egress, child.take_egress_listener()) {
            (Some(leash), Some(listener)) => {
                Some(leash.serve(listener).map_err(|source| EngineError::Io {
                    what: "serving the egress listener",
                    source,
                })?)
            }
            _ => None,
        };
        if let Some(c) = &job.cancel {
            c.attach(child.killer());
        }
        // The output is pumped by the thread that waits for the sandbox, unless the sink may
        // block (a slow reader must never hold up the limits' enforcement): then by a thread
        // of its own, told by `stop` that the sandbox is gone.
        let stop = if sink.may_block() {
            Some(
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| EngineError::Io {
                    what: "pipe2",
                    source: e.into(),
                })?,
            )
        } else {
            None
        };
        let pump = pump::Pump {
            stdin: child.take_stdin(),
            stdin_source: stdin,
            stdin_limit: self.config.max_stdin_bytes,
            control,
            request,
            stdout: child.take_stdout(),
            stderr: child.take_stderr(),
            output_limit: job.limits.output_bytes,
            response_limit: self.response_limit(),
            sink,
        };
        let killer = child.killer();
        let breach = tools::Breach::default();
        let (waited, io) = std::thread::scope(|s| {
            let served = tools.as_ref().map(|(bridge, channel)| {
                let (breach, killer) = (&breach, &killer);
                s.spawn(move || breach.serve(bridge.as_ref(), channel.try_clone(), killer))
            });
            let (waited, pumped) = match stop {
                Some((stop_r, stop_w)) => {
                    let io = s.spawn(move || pump.run(stop_r));
                    let waited = child.wait();
                    let _ = nix::unistd::write(&stop_w, &[1]);
                    (waited, Err(io))
                }
                None => {
                    let mut pumping = pump.start();
                    let waited = child.wait_beside(&mut pumping);
                    (waited, Ok(pumping.finish()))
                }
            };
            if let Some(served) = served {
                // The sandbox is gone: the bridge reads the end of its channel and cancels
                // what is still running upstream.
                if let Some((_, channel)) = &tools {
                    let _ = channel.shutdown(std::net::Shutdown::Both);
                }
                let _ = served.join();
            }
            (waited, pumped.or_else(|io| io.join().map_err(drop)))
        });
        let tool_calls = tools.as_ref().map_or(0, |(bridge, _)| bridge.calls());
        let egress = serving.map(airlock_egress::Serving::finish);
        if let Some(c) = &job.cancel {
            c.detach();
        }
        let io = io.map_err(|_| EngineError::Io {
            what: "output pump",
            source: std::io::Error::other("panicked"),
        })?;
        Ok(Ran {
            waited,
            io,
            tool_calls,
            egress,
            breach,
        })
    }
}

/// A sandbox whose runner waits for its request on `control`.
struct Sandbox {
    child: airlock_sandbox::Child,
    control: UnixStream,
}

/// What running a sandbox to its end gave.
struct Ran {
    /// How it ended, or why that is unknown (it could not be built).
    waited: Result<airlock_sandbox::Outcome, airlock_sandbox::WaitError>,
    io: pump::Collected,
    tool_calls: u64,
    egress: Option<airlock_egress::Usage>,
    /// Why the tool channel was cut, if the code broke its protocol.
    breach: tools::Breach,
}

impl Engine {
    /// Runs real code in a real sandbox with the default limits and checks what it sees: the
    /// unprivileged uid, its own hostname, and only its init and itself in `/proc`. Whether
    /// every mechanism was in force is in the result's `isolation`, for the caller to judge.
    pub fn self_test(&self) -> Result<ExecutionResult, String> {
        Ok(self.self_test_execution()?.result)
    }

    /// The trial job of `self_test`.
    pub fn self_test_job(&self) -> Result<Job, String> {
        let limits = self
            .config
            .resolve_limits(&airlock_api::LimitsRequest::default())
            .map_err(|e| e.to_string())?;
        Ok(Job {
            code: "import os, socket\n[os.getuid(), socket.gethostname(), sorted(p for p in os.listdir('/proc') if p.isdigit())]".into(),
            filename: "self_test.py".into(),
            stdin: Stdin::Empty,
            env: Vec::new(),
            files: Vec::new(),
            entrypoint: None,
            limits,
            max_code_bytes: self.config.max_code_bytes,
            stream: false,
            echo_traceback: false,
            cancel: None,
            tools: None,
            egress: None,
            environment: None,
            volumes: Vec::new(),
        })
    }

    /// As `self_test`, with how the sandbox came to be (pooled, a zygote's child).
    pub fn self_test_execution(&self) -> Result<Execution, String> {
        let job = self.self_test_job()?;
        let execution = self.execute(job, &mut Discard).map_err(|e| e.to_string())?;
        let r = &execution.result;
        if r.status != Status::Ok {
            let why = r
                .error
                .as_ref()
                .map(|e| format!("{}: {}", e.kind, e.message))
                .unwrap_or_default();
            return Err(format!(
                "a trial run ended with status {}: {why} {}",
                r.status,
                r.stderr.to_string_lossy().trim()
            ));
        }
        let expected = serde_json::json!([SANDBOX_UID, HOSTNAME, ["1", "2"]]);
        if r.result.as_ref() != Some(&expected) {
            return Err(format!(
                "a trial run saw {:?}, expected {expected}",
                r.result
            ));
        }
        Ok(execution)
    }
}

fn socket_pair() -> Result<(UnixStream, UnixStream), EngineError> {
    UnixStream::pair().map_err(|source| EngineError::Io {
        what: "socketpair",
        source,
    })
}

/// An entrypoint names a function by identifiers (`name` or `Class.method`); its inputs are
/// plain data no deeper than [`MAX_INPUT_DEPTH`]. Errors name the field at fault.
pub fn check_entrypoint(entry: &Entrypoint) -> Result<(), (&'static str, String)> {
    let identifier = |part: &str| {
        let mut chars = part.chars();
        chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
            && chars.all(|c| c == '_' || c.is_alphanumeric())
    };
    if entry.name.len() > 255 || !entry.name.split('.').all(identifier) {
        return Err((
            "entrypoint",
            format!(
                "{:?} is not a name such as `main` or `Class.method`",
                entry.name
            ),
        ));
    }
    // Iterative: hostile nesting must not use the stack.
    let mut pending: Vec<(&serde_json::Value, usize)> =
        entry.inputs.values().map(|v| (v, 1)).collect();
    while let Some((value, depth)) = pending.pop() {
        if depth > MAX_INPUT_DEPTH {
            return Err((
                "inputs",
                format!("nested more than {MAX_INPUT_DEPTH} levels deep"),
            ));
        }
        match value {
            serde_json::Value::Array(items) => pending.extend(items.iter().map(|v| (v, depth + 1))),
            serde_json::Value::Object(map) => pending.extend(map.values().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    Ok(())
}

/// The most bytes one part of a path may have: the longest name Linux takes (`NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// `path` must stay inside the working directory: relative, normal components only, each a
/// name a file system takes.
pub fn check_relative_path(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    let normal = !path.is_empty()
        && !path.contains('\0')
        && !path.ends_with('/')
        && p.components().all(|c| matches!(c, Component::Normal(_)))
        && !path.split('/').any(|c| c.is_empty() || c == ".");
    if !normal {
        return Err(format!(
            "invalid file path {path:?}: must be relative, without `.`, `..` or empty parts"
        ));
    }
    match path.split('/').find(|c| c.len() > MAX_NAME_BYTES) {
        Some(long) => Err(format!(
            "invalid file path: a part of it is {} bytes long, more than the {MAX_NAME_BYTES} \
             a file name may have",
            long.len()
        )),
        None => Ok(()),
    }
}

/// A sandbox with egress gets the proxy's port and the host's CA certificates (public data:
/// TLS through the proxy is end to end, so the code verifies servers itself); one whose
/// requests may carry a credential gets them with its leash's own CA certificate added,
/// since the proxy ends TLS to those hosts itself.
pub(crate) fn with_egress_port(policy: &mut Policy, leash: &airlock_egress::Leash) {
    policy.egress_port = Some(EGRESS_PORT);
    // curl, for code that shells out to it (its libraries are the interpreter's already).
    if Path::new(CURL).is_file() {
        policy.root.push(airlock_sandbox::RootEntry::ReadOnly {
            source: PathBuf::from(CURL),
            target: PathBuf::from(CURL),
        });
    }
    let source = match leash.interception() {
        Some(ix) => ix.trust_bundle().to_owned(),
        None if Path::new(CA_BUNDLE).is_file() => PathBuf::from(CA_BUNDLE),
        None => return,
    };
    policy.root.push(airlock_sandbox::RootEntry::ReadOnly {
        source,
        target: PathBuf::from(CA_BUNDLE),
    });
}

/// Mounts `env` at `/env`: read-only, or writable for its own build.
fn with_environment(policy: &mut Policy, env: &environments::EnvMount) {
    let (source, target) = (env.source.clone(), PathBuf::from(environments::ENV_MOUNT));
    policy.root.push(if env.writable {
        airlock_sandbox::RootEntry::Writable { source, target }
    } else {
        airlock_sandbox::RootEntry::ReadOnly { source, target }
    });
}

/// Reports the egress policy a sandbox ran under, when it had one.
fn with_egress(iso: &mut airlock_api::Isolation, leash: Option<&airlock_egress::Leash>) {
    if let Some(leash) = leash {
        iso.network = "egress_proxy".into();
        iso.egress = Some(leash.policy().clone());
    }
}

fn isolation(iso: &airlock_sandbox::Isolation) -> airlock_api::Isolation {
    use airlock_sandbox::{CgroupVersion, LandlockState};
    airlock_api::Isolation {
        namespaces: iso.namespaces.clone(),
        uid: iso.uid,
        network: "none".into(),
        egress: None,
        filesystem: "read_only".into(),
        seccomp: if iso.seccomp { "enforced" } else { "disabled" }.into(),
        landlock: match iso.landlock.state {
            LandlockState::FullyEnforced => "fully_enforced",
            LandlockState::PartiallyEnforced => "partially_enforced",
            LandlockState::NotEnforced => "not_enforced",
            LandlockState::Disabled => "disabled",
        }
        .into(),
        landlock_abi: iso.landlock.abi,
        cgroup: match iso.cgroup {
            Some(CgroupVersion::V1) => "v1",
            Some(CgroupVersion::V2) => "v2",
            None => "disabled",
        }
        .into(),
        no_new_privs: iso.no_new_privs,
        capabilities: if iso.capabilities_dropped {
            Vec::new()
        } else {
            vec!["unknown".into()]
        },
        downgraded: iso.downgraded.clone(),
    }
}

/// What a policy asks for, for results of sandboxes that never reported.
fn planned_isolation(policy: &Policy) -> airlock_api::Isolation {
    isolation(&airlock_sandbox::Isolation::planned(policy, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_bounded_before_anything_runs() {
        let engine = Engine::new(EngineConfig::default()).expect("an engine");
        let job = |env: Vec<(String, String)>, files: usize| Job {
            code: "1".into(),
            filename: "main.py".into(),
            stdin: Stdin::Bytes(Vec::new()),
            env,
            files: (0..files)
                .map(|i| InputFile {
                    path: format!("f{i}"),
                    data: Vec::new(),
                })
                .collect(),
            entrypoint: None,
            limits: engine.config().defaults.clone(),
            max_code_bytes: 1000,
            stream: false,
            echo_traceback: false,
            cancel: None,
            tools: None,
            egress: None,
            environment: None,
            volumes: Vec::new(),
        };
        let refused = |j: Job| match engine.check(&j) {
            Err(EngineError::Invalid(r)) => r.message,
            other => panic!("accepted: {other:?}"),
        };
        assert!(engine.check(&job(Vec::new(), MAX_FILES)).is_ok());
        assert!(refused(job(Vec::new(), MAX_FILES + 1)).contains("input files"));
        let many = (0..=MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert!(refused(job(many, 0)).contains("environment variables"));
        let big = vec![("V".to_owned(), "x".repeat(MAX_ENV_BYTES))];
        assert!(refused(job(big, 0)).contains("bytes"));

        // Each refusal names the request's field and its kind, which the server answers with
        // (413 or 400, `field`): the engine is the only place these checks are made.
        let field_of = |j: Job| match engine.check(&j) {
            Err(EngineError::Invalid(r)) => (r.field, r.kind),
            other => panic!("accepted: {other:?}"),
        };
        use RefusalKind::{Invalid, TooLarge};
        let long = Job {
            code: "#".repeat(1001),
            ..job(Vec::new(), 0)
        };
        assert_eq!(field_of(long), ("code".into(), TooLarge));
        let named = job(vec![("A=B".into(), "x".into())], 0);
        assert_eq!(field_of(named), ("env.A=B".into(), Invalid));
        let mut escaping = job(Vec::new(), 2);
        escaping.files[1].path = "a/../../b".into();
        assert_eq!(field_of(escaping), ("files[1].path".into(), Invalid));
        assert_eq!(
            field_of(job(Vec::new(), MAX_FILES + 1)),
            ("files".into(), TooLarge)
        );
        let mut heavy = job(Vec::new(), 1);
        heavy.files[0].data = vec![0; (engine.config().max_files_bytes + 1) as usize];
        assert_eq!(field_of(heavy), ("files".into(), TooLarge));
        let stdin = Job {
            stdin: Stdin::Bytes(vec![0; engine.config().max_stdin_bytes as usize + 1]),
            ..job(Vec::new(), 0)
        };
        assert_eq!(field_of(stdin), ("stdin".into(), TooLarge));
        let entry = Job {
            entrypoint: Some(Entrypoint {
                name: "not a name".into(),
                inputs: Default::default(),
            }),
            ..job(Vec::new(), 0)
        };
        assert_eq!(field_of(entry), ("entrypoint".into(), Invalid));
    }

    #[test]
    fn relative_paths_only() {
        let longest = "n".repeat(MAX_NAME_BYTES);
        for ok in [
            "a.txt",
            "data/x.csv",
            "a/b/c",
            &longest,
            &format!("a/{longest}/b"),
        ] {
            assert!(check_relative_path(ok).is_ok(), "{ok}");
        }
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        for bad in [&long, &format!("a/{long}"), &format!("{long}/a")] {
            assert!(check_relative_path(bad).is_err(), "{bad}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "./a",
            "a//b",
            "a/",
            "a/./b",
            "a\0b",
        ] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn policy_follows_limits_and_downgrades() {
        let Ok(engine) = Engine::new(EngineConfig {
            downgrade: vec![Mechanism::Landlock],
            ..EngineConfig::default()
        }) else {
            panic!("/usr/bin/python3 is required by the test suite");
        };
        let limits = engine.config().defaults.clone();
        let p = engine.policy(&limits);
        p.validate().unwrap();
        assert_eq!(p.limits.memory_bytes, limits.memory_mb * MIB);
        assert_eq!(p.scratch.size_bytes, limits.disk_mb * MIB);
        assert_eq!(p.landlock, Enforcement::Disabled);
        assert_eq!(p.seccomp, Enforcement::Required);
        assert_eq!(p.cgroups, Enforcement::Required);
        assert_eq!(
            planned_isolation(&p).downgraded,
            vec!["landlock".to_owned()]
        );
    }
}
