//! The types airlock speaks, one vocabulary for `airlock run --json`, HTTP and MCP.
//!
//! An execution ends in one [`ExecutionResult`]. Its `status` comes from what the kernel
//! reported about the program's process and its cgroup; `result` and `error` are data the
//! program produced inside the sandbox, already converted to JSON there.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod approvals;
pub mod egress;
mod text;
mod value;
pub use approvals::{
    Approval, ApprovalDetail, ApprovalList, Decided, Decision, DecisionRequest, Shown,
    MAX_REASON_CHARS,
};
pub use text::{write_deferring_texts, Deferred, Text};
pub use value::{value_text, ResultValue, MARK};

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
    /// Killed by the seccomp filter for a forbidden system call, or by the host for breaking
    /// the protocol of its tool channel.
    PolicyViolation,
    /// Killed by another signal.
    Crashed,
    /// airlock itself failed; the program may not have run.
    InternalError,
}

impl Status {
    /// Every status, as metrics pre-create their series.
    pub const ALL: [Status; 8] = [
        Status::Ok,
        Status::Error,
        Status::Timeout,
        Status::MemoryLimit,
        Status::CpuLimit,
        Status::PolicyViolation,
        Status::Crashed,
        Status::InternalError,
    ];

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
    /// Calls the code made to the operator's tools (code mode), answered or refused.
    #[serde(default)]
    pub tool_calls: u64,
    /// Connections and bytes through the egress proxy, when an egress policy applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<egress::Usage>,
}

/// What was in force for this execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Isolation {
    /// Namespaces the sandbox had of its own.
    pub namespaces: Vec<String>,
    /// The unprivileged uid the program ran as, inside the user namespace.
    pub uid: u32,
    /// `none`: a network namespace of its own with nothing in it. `egress_proxy`: the same,
    /// with loopback up and airlock's proxy listening on it as the only way out, under the
    /// `egress` policy.
    pub network: String,
    /// The egress policy that applied, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<egress::EgressPolicy>,
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

/// A rich output (a chart, a `display()` call), in the order the code made them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// `text/plain`, `text/html`, `image/png`, `image/svg+xml` or `application/json`.
    #[serde(rename = "type")]
    pub mime: String,
    /// Text for the text types and SVG, base64 for PNG, any JSON value for JSON.
    pub data: serde_json::Value,
}

/// A file the code left in `./outputs` (one-shot executions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputFile {
    /// Relative to `outputs/`.
    pub path: String,
    pub size: u64,
    /// The contents, when the file was returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// Why it was not: `a symbolic link`, `not a regular file`, `over the size limit`,
    /// `more than 100 files`, `still growing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// The media types an [`Output`] can have.
pub const OUTPUT_TYPES: [&str; 5] = [
    "text/plain",
    "text/html",
    "image/png",
    "image/svg+xml",
    "application/json",
];

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
    /// `limits.output_bytes` bytes as written. Sent, a byte takes up to 6 (a control
    /// character is escaped as `\u00XX`; an invalid byte becomes the 3 bytes of U+FFFD).
    pub stdout: Text,
    pub stderr: Text,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The value of the code's final expression, or the entrypoint's return value, as JSON,
    /// converted inside the sandbox. Values JSON has no type for arrive as objects marked
    /// `"$airlock"`: `int` (past 64 bits, up to 4300 decimal digits), `float` (`nan`, `inf`,
    /// `-inf`), `bytes` (base64), `set`, `dict` (keys that are not strings), `datetime`,
    /// `timedelta`, `decimal`, `complex`, `ndarray`, `dataframe`, `series`, and for anything
    /// else `{"$airlock": "repr", "type": ..., "repr": ..., "truncated": ..., "why": ...}`.
    #[schemars(with = "Option<ResultValue>")]
    pub result: Option<serde_json::Value>,
    pub error: Option<ErrorInfo>,
    /// Charts and `display()` outputs, in order (also with an `error`).
    #[serde(default)]
    pub outputs: Vec<Output>,
    /// Files the code left in `./outputs`, base64, within half the result limit together
    /// with `outputs`.
    #[serde(default)]
    pub files: Vec<OutputFile>,
    pub usage: Usage,
    pub limits: Limits,
    pub limits_hit: Vec<LimitKind>,
    pub isolation: Isolation,
}

/// The language of the code. Only Python exists today.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    #[default]
    Python,
}

/// How an input file's `content` is encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

/// A file placed in the working directory before the code runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    /// Relative to the working directory: no absolute paths, no `..`, no empty components.
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub encoding: Encoding,
}

/// `POST /v1/execute`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    pub code: String,
    #[serde(default)]
    pub language: Language,
    /// The program's standard input.
    #[serde(default)]
    pub stdin: String,
    /// Environment variables; nothing of the server's environment is passed.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub files: Vec<InputFile>,
    #[serde(default)]
    pub limits: LimitsRequest,
    /// Hosts the code may reach through airlock's proxy; never wider than the key's policy,
    /// which applies when this is absent.
    #[serde(default)]
    pub egress: Option<egress::EgressPolicy>,
    /// Credentials the proxy may set on the code's requests to their hosts (names from
    /// the key's `credentials`, which all apply when this is absent; `[]` for none).
    #[serde(default)]
    pub credentials: Option<Vec<String>>,
    /// A named environment (`airlock env create`): its packages are importable.
    #[serde(default)]
    pub environment: Option<String>,
    /// The caller's volumes to mount (`POST /v1/volumes`), each below `/work` or `/tmp`.
    #[serde(default)]
    pub volumes: Vec<VolumeMountRequest>,
    /// Function mode: the name of a function the code defines (`name`, or `Class.method`),
    /// called once the code has run, with `inputs` as keyword arguments; its return value
    /// becomes `result`. An `async def` is run to completion.
    #[serde(default)]
    pub entrypoint: Option<String>,
    /// The entrypoint's keyword arguments: plain data (JSON), never objects with behaviour.
    /// Only with `entrypoint`; at most [`MAX_INPUT_VALUES`] values in all.
    #[serde(default, deserialize_with = "bounded_inputs")]
    pub inputs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Values an entrypoint's `inputs` may hold in all (each number, string, list, ... counts).
/// A parsed value takes several times the bytes of its text; counting before parsing keeps
/// what a request can cost the server proportionate to its size.
pub const MAX_INPUT_VALUES: usize = 50_000;

/// `inputs`: counted in its text first, then parsed (an object, or null for none).
fn bounded_inputs<'de, D>(
    d: D,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error as _;
    let Some(raw) = Option::<Box<serde_json::value::RawValue>>::deserialize(d)? else {
        return Ok(None);
    };
    let values = count_values(raw.get());
    if values > MAX_INPUT_VALUES {
        return Err(D::Error::custom(format!(
            "inputs hold {values} values, more than {MAX_INPUT_VALUES}"
        )));
    }
    serde_json::from_str(raw.get())
        .map(Some)
        .map_err(D::Error::custom)
}

/// An upper bound on the values in a JSON text: each one but the first follows a `[`, `{`,
/// `,` or `:` outside a string.
fn count_values(text: &str) -> usize {
    let (mut count, mut in_string, mut escaped) = (1, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' | b',' | b':' => count += 1,
                _ => {}
            }
        }
    }
    count
}

/// `POST /v1/sessions`: a sandbox that keeps its interpreter between cells.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The sandbox's limits for the whole session (memory, pids, disk, CPU time); `timeout_ms`
    /// is each cell's default wall clock, `output_bytes` each cell's output.
    #[serde(default)]
    pub limits: LimitsRequest,
    /// Close the session after this long without a request (at most the server's setting;
    /// at least a second, or it could end before its next request arrives).
    #[schemars(range(min = 1000))]
    pub idle_timeout_ms: Option<u64>,
    /// Close the session this long after it started (at most the server's setting; at least
    /// a second, which its interpreter needs to start).
    #[schemars(range(min = 1000))]
    pub max_lifetime_ms: Option<u64>,
    /// Environment variables for the whole session.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Files placed in the working directory at the start.
    #[serde(default)]
    pub files: Vec<InputFile>,
    /// Hosts the session's code may reach through airlock's proxy (`pip install` from the
    /// package index, say); never wider than the key's policy, which applies when absent.
    #[serde(default)]
    pub egress: Option<egress::EgressPolicy>,
    /// Credentials the proxy may set on the session's requests to their hosts (names from
    /// the key's `credentials`, which all apply when this is absent; `[]` for none).
    #[serde(default)]
    pub credentials: Option<Vec<String>>,
    /// A named environment for the session's sandbox.
    #[serde(default)]
    pub environment: Option<String>,
    /// The caller's volumes the session's sandbox mounts, for as long as it lives.
    #[serde(default)]
    pub volumes: Vec<VolumeMountRequest>,
}

/// A volume an execution or a session mounts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMountRequest {
    /// The volume's name.
    pub name: String,
    /// Where it appears: an absolute path below `/work` or `/tmp` (e.g. `/work/data`).
    pub path: String,
    /// Mounted read-only: any number of readers at once. Writable (the default): one
    /// writer at a time, and a second gets 409 naming the holder.
    #[serde(default)]
    pub read_only: bool,
}

/// A session, as its owner sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    pub id: String,
    /// RFC 3339.
    pub created_at: String,
    /// When it will be closed at the latest, RFC 3339.
    pub expires_at: String,
    pub idle_timeout_ms: u64,
    pub max_lifetime_ms: u64,
    /// Cells run so far.
    pub cells: u64,
    /// `null` while it can run cells; else the status of the cell that ended it.
    pub ended: Option<Status>,
    pub limits: Limits,
    /// Connections and bytes through the egress proxy while none of its cells ran (by
    /// threads or processes a cell left running), over the session's life so far: one
    /// budget of `[egress]` for all of it. Absent without an egress policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_between_cells: Option<egress::Usage>,
    /// Present while the session is paused: its state is a snapshot on disk, and its next
    /// request brings it back in a fresh sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<SnapshotInfo>,
    /// Present in the answer that brought the session back (a resume, a fork): what came
    /// back, and what could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<SnapshotInfo>,
}

/// A session's snapshot: its size, and what it holds (as the session's own sandbox said).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotInfo {
    /// When it was taken, RFC 3339.
    pub taken_at: String,
    /// The cells the session had run when it was taken.
    pub cells: u64,
    /// On disk, compressed.
    pub stored_bytes: u64,
    /// As the sandbox wrote it.
    pub state_bytes: u64,
    /// The variables it holds.
    pub variables: Vec<String>,
    /// The variables that could not be kept (a lock, a generator, an open socket, a C
    /// object that refuses), each with why: they are gone from the session that comes back.
    pub not_kept: std::collections::BTreeMap<String, String>,
}
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
}

/// `POST /v1/sessions/{id}/execute`: one cell, in the session's interpreter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CellRequest {
    pub code: String,
    /// Function mode, as for `POST /v1/execute`.
    #[serde(default)]
    pub entrypoint: Option<String>,
    #[serde(default, deserialize_with = "bounded_inputs")]
    pub inputs: Option<serde_json::Map<String, serde_json::Value>>,
    /// This cell's wall clock (default: the session's `timeout_ms`). Reaching it ends the
    /// session.
    pub timeout_ms: Option<u64>,
}

/// The answer to a cell: its result, the id of its audit record, and whether it ended the
/// session (a limit, `sys.exit()`, a crash: then `status` says which).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CellResponse {
    pub id: String,
    pub session_ended: bool,
    /// Present when this cell brought a paused session back first (what came back, and
    /// what could not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<SnapshotInfo>,
    #[serde(flatten)]
    pub result: ExecutionResult,
}

/// One entry of a session's working directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileEntry {
    pub path: String,
    /// `file`, `dir`, `link` (never followed) or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
}

/// `GET /v1/sessions/{id}/files`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileList {
    pub files: Vec<FileEntry>,
}

/// `GET /v1/tools`: the operator's tools the calling key's code may call (code mode), as
/// `tools.<server>.<function>(...)` inside the sandbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsResponse {
    pub tools: Vec<ToolApi>,
    /// The same as Python stubs (signatures and docstrings), for a model to read.
    pub python: String,
}

/// One tool, as the code calls it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolApi {
    /// `server.function`: called as `tools.server.function(...)`.
    pub name: String,
    /// The tool's own name on its server.
    pub tool: String,
    /// Its annotations say it only reads; a tool that may write is granted only by name.
    pub read_only: bool,
    /// `def function(*, a: int, b: str = "x")`: keyword arguments only.
    pub signature: String,
    pub description: String,
    /// The tool's JSON Schema for its arguments, checked on the host before each call.
    pub input_schema: serde_json::Value,
}

/// The answer to `POST /v1/execute`: the result, and the id of its audit record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecuteResponse {
    pub id: String,
    #[serde(flatten)]
    pub result: ExecutionResult,
}

/// What the audit log keeps of one execution, and `GET /v1/executions/{id}` returns. Never
/// the key itself, the code, its output or its environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRecord {
    pub id: String,
    /// The request that made it (also in the `x-request-id` response header and the logs).
    pub request_id: String,
    /// Name of the API key that made it.
    pub key: String,
    /// The first 16 hex digits of the key's SHA-256: a record belongs to a key, not a name.
    pub key_fingerprint: String,
    /// When it was admitted, RFC 3339.
    pub started_at: String,
    pub code_sha256: String,
    pub code_bytes: u64,
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub limits: Limits,
    pub limits_hit: Vec<LimitKind>,
    pub usage: Usage,
    /// True when the server stopped (was killed, lost power) before the execution ended: the
    /// record was written at its next start, with status `internal_error`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Why airlock ended it without a verdict (an interrupted execution's record says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

/// Every error the HTTP API returns has this body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub error: ApiError,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    /// Stable, machine-readable: `invalid_json`, `invalid_request`, `limit_above_ceiling`,
    /// `payload_too_large`, `unsupported_media_type`, `unauthorized`, `forbidden`,
    /// `not_found`, `misdirected_request`, `rate_limited`, `overloaded`, `timeout`,
    /// `shutting_down`, `internal`.
    pub code: String,
    pub message: String,
    /// The request field at fault, as a path such as `files[2].path`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub field: Option<String>,
    /// The request's id, as in its `x-request-id` header and the server's log lines.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub request_id: Option<String>,
}

/// Bytes as lowercase hex, as digests are written in records, keys and manifests.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// The SHA-256 of `data` as lowercase hex (a record's `code_sha256`).
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_match_serde() {
        for s in Status::ALL {
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
    fn execute_requests_default_everything_but_the_code() {
        let r: ExecuteRequest = serde_json::from_str(r#"{"code": "1"}"#).unwrap();
        assert_eq!(
            (r.language, r.stdin.as_str(), r.files.len()),
            (Language::Python, "", 0)
        );
        let err = serde_json::from_str::<ExecuteRequest>(r#"{"code": "1", "lang": "python"}"#)
            .unwrap_err();
        assert!(err.to_string().contains("unknown field `lang`"), "{err}");
        let err = serde_json::from_str::<ExecuteRequest>(r#"{"code": "1", "language": "ruby"}"#)
            .unwrap_err();
        assert!(err.to_string().contains("unknown variant `ruby`"), "{err}");
    }

    #[test]
    fn a_response_is_the_result_plus_its_id() {
        let result: ExecutionResult = serde_json::from_value(serde_json::json!({
            "status": "ok", "exit_code": 0, "signal": null, "stdout": "", "stderr": "",
            "stdout_truncated": false, "stderr_truncated": false, "result": 1, "error": null,
            "usage": {"wall_ms": 1, "cpu_ms": 1, "memory_peak_bytes": 1},
            "limits": {"timeout_ms": 1, "memory_mb": 1, "cpu_ms": 1, "pids": 1, "disk_mb": 1, "output_bytes": 1},
            "limits_hit": [],
            "isolation": {"namespaces": [], "uid": 1000, "network": "none", "filesystem": "read_only",
                "seccomp": "enforced", "landlock": "fully_enforced", "landlock_abi": 6, "cgroup": "v1",
                "no_new_privs": true, "capabilities": [], "downgraded": []}
        }))
        .unwrap();
        let response = ExecuteResponse {
            id: "ex_1".into(),
            result,
        };
        let json = serde_json::to_value(&response).unwrap();
        assert_eq!(
            (json["id"].as_str(), json["status"].as_str()),
            (Some("ex_1"), Some("ok"))
        );
        assert_eq!(
            serde_json::from_value::<ExecuteResponse>(json).unwrap(),
            response
        );
    }

    #[test]
    fn inputs_are_counted_before_they_are_parsed() {
        assert_eq!(count_values(r#"{"a": [1, 2], "b": "x,y:[{"}"#), 7);
        assert_eq!(count_values(r#""\\"""#), 1);
        let many = format!(
            r#"{{"code": "", "entrypoint": "f", "inputs": {{"a": [{}]}}}}"#,
            vec!["[]"; MAX_INPUT_VALUES].join(",")
        );
        let err = serde_json::from_str::<ExecuteRequest>(&many).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        let ok: ExecuteRequest =
            serde_json::from_str(r#"{"code": "", "entrypoint": "f", "inputs": {"a": [1]}}"#)
                .unwrap();
        assert_eq!(ok.inputs.unwrap()["a"], serde_json::json!([1]));
        let none: ExecuteRequest = serde_json::from_str(r#"{"code": "", "inputs": null}"#).unwrap();
        assert!(none.inputs.is_none());
        let err =
            serde_json::from_str::<ExecuteRequest>(r#"{"code": "", "inputs": [1]}"#).unwrap_err();
        assert!(err.to_string().contains("map"), "{err}");
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

/// `POST /v1/eval`: one Python literal expression, evaluated natively (no sandbox, no
/// interpreter).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalRequest {
    /// `<expr>` or `result = <expr>`: literals, containers, operators, comparisons,
    /// `and`/`or`/`not`, `x if c else y`, subscripts and slices.
    pub expression: String,
}

/// The answer to `POST /v1/eval`: `ok` true with the value, or false with the error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EvalResponse {
    pub ok: bool,
    /// `type(value).__name__`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// `repr(value)`, exactly as CPython 3.11 prints it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repr: Option<String>,
    /// `str(value)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub str: Option<String>,
    /// The value as JSON, present only when JSON holds it exactly (an int past 64 bits and a
    /// float that is not finite in their `"$airlock"` forms, as in execution results).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<ResultValue>")]
    pub value: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<EvalError>,
}

/// A Python-style error: `ZeroDivisionError`, `TypeError`, ..., `SyntaxError`,
/// `NotAllowedError` (syntax that is refused), `MemoryError`/`TimeoutError` (a budget).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EvalError {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// True when one of the evaluator's budgets, not Python, refused the work.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub limit: bool,
}
