//! A job: one execution's code, input, options and limits, as the engine takes it; how another
//! thread cancels it; and the checks it passes before anything runs (sizes, counts, names and
//! paths), each refusal naming the request's field.

use std::sync::{Arc, Mutex};

use airlock_api::Limits;
use airlock_sandbox::{KillReason, Killer};

use crate::config::EngineConfig;
use crate::error::Refusal;
use crate::paths::check_relative_path;
use crate::policy::EnvMount;
use crate::pump::Stdin;
use crate::tools::ToolBridge;
use crate::volumes::JobVolume;

/// Input bounds that keep the work before a sandbox exists small (it is not under the wall
/// clock): environment variables (count and bytes, as execve itself bounds them) and files.
pub const MAX_ENV_VARS: usize = 256;
pub const MAX_ENV_BYTES: usize = 64 * 1024;
pub const MAX_FILES: usize = 1000;
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
    pub environment: Option<EnvMount>,
    /// Volumes mounted into the sandbox, each with its lease, held until the sandbox is gone.
    pub volumes: Vec<JobVolume>,
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

    pub(crate) fn attach(&self, killer: Killer) {
        let mut state = self.state();
        if state.cancelled {
            killer.kill(KillReason::Cancelled);
        }
        state.killer = Some(killer);
    }

    pub(crate) fn detach(&self) {
        self.state().killer = None;
    }
}

/// The counts of environment variables and input files alone (part of [`Job::check`]):
/// a request with too many can be refused before anything of it is decoded.
pub(crate) fn check_counts(env: usize, files: usize) -> Result<(), Refusal> {
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

impl Job {
    /// Checks the job before anything runs, under `config`'s bounds.
    pub(crate) fn check(&self, config: &EngineConfig) -> Result<(), Refusal> {
        if self.code.len() as u64 > self.max_code_bytes {
            return Err(Refusal::too_large(
                "code",
                format!(
                    "code is {} bytes, over the limit of {} bytes",
                    self.code.len(),
                    self.max_code_bytes
                ),
            ));
        }
        let name_ok = !self.filename.is_empty()
            && self.filename.len() <= 255
            && !self.filename.contains(['/', '\0']);
        if !name_ok {
            return Err(Refusal::invalid(
                "filename",
                format!("invalid code file name {:?}", self.filename),
            ));
        }
        if let Stdin::Bytes(b) = &self.stdin {
            if b.len() as u64 > config.max_stdin_bytes {
                return Err(Refusal::too_large(
                    "stdin",
                    format!(
                        "stdin is {} bytes, over the limit of {} bytes",
                        b.len(),
                        config.max_stdin_bytes
                    ),
                ));
            }
        }
        check_counts(self.env.len(), self.files.len())?;
        let env_bytes: usize = self.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if env_bytes > MAX_ENV_BYTES {
            return Err(Refusal::too_large(
                "env",
                format!("the environment is {env_bytes} bytes, over the limit of {MAX_ENV_BYTES}"),
            ));
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                return Err(Refusal::invalid(
                    format!("env.{key}"),
                    format!(
                        "invalid environment variable {key:?}: names must not be empty or \
                         contain = or NUL; values must not contain NUL"
                    ),
                ));
            }
        }
        let mut total = 0u64;
        for (i, file) in self.files.iter().enumerate() {
            check_relative_path(&file.path)
                .map_err(|m| Refusal::invalid(format!("files[{i}].path"), m))?;
            total += file.data.len() as u64;
        }
        let cap = config.max_files_bytes.min(self.limits.disk_mb * MIB);
        if total > cap {
            return Err(Refusal::too_large(
                "files",
                format!("input files total {total} bytes, over the limit of {cap} bytes"),
            ));
        }
        if let Some(entry) = &self.entrypoint {
            check_entrypoint(entry).map_err(|(field, m)| Refusal::invalid(field, m))?;
        }
        Ok(())
    }
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
