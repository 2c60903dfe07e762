//! The types airlock speaks, one vocabulary for `airlock run --json`, HTTP and MCP.
//!
//! An execution ends in one [`ExecutionResult`]. Its `status` comes from what the kernel
//! reported about the program's process and its cgroup; `result` and `error` are data the
//! program produced inside the sandbox, already converted to JSON there.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How an execution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Exited with code 0.
    Ok,
    /// An uncaught exception, a non-zero exit, or an unreadable result.
    Error,
    /// Killed at the wall-clock limit.
    Timeout,
    /// Killed by the kernel's OOM killer at the memory limit.
    MemoryLimit,
    /// Killed at the CPU-time limit.
    CpuLimit,
    /// Killed by the seccomp filter for a forbidden system call.
    PolicyViolation,
    /// Killed by another signal.
    Crashed,
    /// airlock itself failed; the program may not have run.
    InternalError,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::MemoryLimit => "memory_limit",
            Status::CpuLimit => "cpu_limit",
            Status::PolicyViolation => "policy_violation",
            Status::Crashed => "crashed",
            Status::InternalError => "internal_error",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An exception raised by the program, or airlock's own failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorInfo {
    /// The exception's type, e.g. `ZeroDivisionError` (qualified when not a builtin).
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// The formatted traceback, without airlock's own frames.
    pub traceback: Option<String>,
}

/// The limits an execution ran with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock time.
    pub timeout_ms: u64,
    /// Memory of the whole sandbox, files it writes included (they live in RAM).
    pub memory_mb: u64,
    /// CPU time of all its processes together.
    pub cpu_ms: u64,
    /// Processes and threads at once.
    pub pids: u32,
    /// Size of the writable file system (`/tmp` and the working directory).
    pub disk_mb: u64,
    /// Bytes kept of stdout and of stderr, each.
    pub output_bytes: u64,
}

/// Limits a caller asks for; anything left out takes the operator's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    pub timeout_ms: Option<u64>,
    pub memory_mb: Option<u64>,
    pub cpu_ms: Option<u64>,
    pub pids: Option<u32>,
    pub disk_mb: Option<u64>,
    pub output_bytes: Option<u64>,
}

/// A limit the execution reached.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    WallTime,
    CpuTime,
    Memory,
    Pids,
    Output,
}

/// Resources used, as the kernel counted them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub wall_ms: u64,
    /// CPU time of every process of the sandbox (cgroup); without cgroups, of the program and
    /// the children it waited for.
    pub cpu_ms: Option<u64>,
    /// Peak memory of the sandbox (cgroup), when cgroups were in force.
    pub memory_peak_bytes: Option<u64>,
}

/// What was in force for this execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Isolation {
    /// Namespaces the sandbox had of its own.
    pub namespaces: Vec<String>,
    /// The unprivileged uid the program ran as, inside the user namespace.
    pub uid: u32,
    /// `none`: an empty network namespace.
    pub network: String,
    /// `read_only`: only allow-listed host paths, read-only; writable tmpfs of `disk_mb`.
    pub filesystem: String,
    /// `enforced` or `disabled`.
    pub seccomp: String,
    /// `fully_enforced`, `partially_enforced` or `disabled`.
    pub landlock: String,
    pub landlock_abi: Option<u32>,
    /// `v1`, `v2` or `disabled`.
    pub cgroup: String,
    pub no_new_privs: bool,
    /// Capabilities the program held (always none).
    pub capabilities: Vec<String>,
    /// Mechanisms the operator explicitly disabled by name.
    pub downgraded: Vec<String>,
}

/// The outcome of one execution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionResult {
    pub status: Status,
    /// The program's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the program, when one did.
    pub signal: Option<i32>,
    /// What the program wrote, decoded as UTF-8 (invalid bytes become U+FFFD), capped at
    /// `limits.output_bytes`.
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The value of the code's final expression, as JSON; values that are not JSON arrive as
    /// `{"$airlock": "repr", "type": ..., "repr": ..., "truncated": ...}`.
    pub result: Option<serde_json::Value>,
    pub error: Option<ErrorInfo>,
    pub usage: Usage,
    pub limits: Limits,
    pub limits_hit: Vec<LimitKind>,
    pub isolation: Isolation,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_match_serde() {
        for s in [
            Status::Ok,
            Status::Error,
            Status::Timeout,
            Status::MemoryLimit,
            Status::CpuLimit,
            Status::PolicyViolation,
            Status::Crashed,
            Status::InternalError,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn limits_request_refuses_unknown_fields() {
        let err = serde_json::from_str::<LimitsRequest>(r#"{"timeout": 5}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"));
        let ok: LimitsRequest = serde_json::from_str(r#"{"timeout_ms": 5}"#).unwrap();
        assert_eq!(ok.timeout_ms, Some(5));
    }

    #[test]
    fn error_info_uses_type_key() {
        let e = ErrorInfo {
            kind: "ValueError".into(),
            message: "x".into(),
            traceback: None,
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"type": "ValueError", "message": "x", "traceback": null})
        );
    }
}
