//! Runs Python code in airlock sandboxes.
//!
//! Each execution gets a fresh sandbox (see `airlock-sandbox`) whose program is the host's
//! Python running `runner.py`. The code, its files and its options travel to the runner as a
//! request in Python's `marshal` format (plain values only, see `request` and `marshal`) on
//! descriptor 3, never pasted into source text; the runner answers on the same descriptor with
//! the final expression's value (converted to JSON inside the sandbox) or the exception. The
//! status comes from the kernel (see `verdict`).
//!
//! This root only names what the crate offers. [`Engine`] (`engine`) runs a [`Job`] (`job`) in
//! a sandbox whose policy `policy` builds, started by `launcher` (cold, as a zygote's child, or
//! ahead in a warm [`Pool`]); a [`Session`] keeps one sandbox for many cells; `environments`
//! and `volumes` are the stores of what a job may mount.
#![forbid(unsafe_code)]

pub mod channel;
mod compiled;
mod config;
pub mod durable;
mod engine;
pub mod environments;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod interpreter;
mod isolation;
mod job;
mod launcher;
mod marshal;
mod paths;
mod policy;
mod pool;
mod pump;
mod request;
mod runner;
mod session;
pub mod snapshot;
pub mod storage;
mod tools;
mod verdict;
pub mod volumes;
mod zygotes;

pub use config::{EngineConfig, LimitError, Mechanism};
pub use engine::{Engine, Execution, Timings};
pub use error::{EngineError, Refusal, RefusalKind};
pub use interpreter::{Interpreter, InterpreterError};
pub use job::{
    check_entrypoint, Cancel, Entrypoint, InputFile, Job, MAX_ENV_BYTES, MAX_ENV_VARS, MAX_FILES,
    MAX_INPUT_DEPTH,
};
pub use paths::{check_relative_path, MAX_NAME_BYTES};
pub use policy::{EGRESS_PORT, SCRATCH_MOUNTS, WORKDIR};
pub use pool::{Pool, PoolConfig, PoolStatus};
pub use pump::{Discard, OutputSink, Stdin, Stream};
pub use runner::source as runner;
pub use session::snapshots::{SnapshotError, SnapshotReport};
pub use session::{Cell, CellResult, ListedFile, Session, SessionError, MAX_LIST_ENTRIES};
pub use tools::{tool_answer, ToolBridge, ToolCall, ToolValue, TOOLS_FD};
pub use zygotes::{ZygoteConfig, ZygoteStatus};
