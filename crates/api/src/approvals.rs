//! Approvals for tool calls (`docs/approvals.md`): a call to a tool the operator marked
//! `approval = "required"` waits until a key with the `approve` scope (or the MCP host, by
//! elicitation) decides it. These are what `GET /v1/approvals` lists, `GET
//! /v1/approvals/{id}` gives and `POST /v1/approvals/{id}` takes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One call waiting for its approval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// `ap_` and 128 random bits: names this one call, and is used once.
    pub id: String,
    /// The execution (or session cell) whose code made the call.
    pub execution_id: String,
    /// The name of the key that ran the code.
    pub key: String,
    pub server: String,
    /// The tool's own name on its server.
    pub tool: String,
    /// The arguments as the call will send them, when their JSON is at most
    /// `tools.approval_shown_bytes` and holds nothing but printable ASCII (so that they read
    /// as they are, whatever shows them); else null: `arguments_preview` shows them, and
    /// `GET /v1/approvals/{id}` has them whole.
    pub arguments: Option<serde_json::Value>,
    /// What a person is shown of the arguments: their JSON, with every character of a key or
    /// a string but printable ASCII written as `\u{...}` (a control character as JSON writes
    /// it), within `tools.approval_shown_bytes`; long strings cut when they must be (each
    /// followed by `...(N more bytes)`, outside its quotes), never a key or another value.
    /// When even the keys and other values do not fit, a sentence that says so.
    pub arguments_preview: String,
    /// How much of the arguments `arguments_preview` shows.
    pub arguments_shown: Shown,
    /// Whether `arguments_preview` writes characters of the arguments' keys or strings as
    /// escapes: anything but printable ASCII, such as a right-to-left override, an invisible
    /// or a control character. The arguments themselves then differ from how a screen may
    /// show them.
    pub arguments_escaped: bool,
    /// The size of the arguments' JSON, and its SHA-256 (hex): what the audit log names.
    pub arguments_bytes: u64,
    pub arguments_sha256: String,
    /// The line of the code that made the call, as the sandbox reported it (the code is not
    /// trusted: it says where to look, it proves nothing).
    pub line: Option<u64>,
    /// When the call asked, and when it fails as `timeout` if nobody decides (RFC 3339).
    pub requested_at: String,
    pub expires_at: String,
}

/// How much of a call's arguments its preview shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Shown {
    /// Every byte of their JSON (escaped as said).
    Whole,
    /// Every key at every depth and every value, but some long strings cut.
    Cut,
    /// Nothing: even the keys and the values other than long strings are over the bound.
    /// The preview says so; `GET /v1/approvals/{id}` has the arguments.
    TooLarge,
}

/// `GET /v1/approvals`: the calls waiting that the calling key may decide.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalList {
    pub approvals: Vec<Approval>,
}

/// `GET /v1/approvals/{id}`: one waiting call as it is listed, and its arguments whole.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDetail {
    pub approval: Approval,
    /// The arguments exactly as the call will send them: the bytes whose size and SHA-256
    /// the approval names. JSON escapes what it must (controls, quotes, backslashes); any
    /// other character, a right-to-left override included, is itself.
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub arguments: Box<serde_json::value::RawValue>,
}

/// What an approver decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The call runs, with the arguments shown.
    Approve,
    /// The call raises `ToolError(kind="denied")` in the sandbox, with the reason.
    Deny,
}

/// `POST /v1/approvals/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    pub decision: Decision,
    /// Why; the code sees a denial's reason. At most 1000 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The answer to `POST /v1/approvals/{id}`: the call as it was shown, and what was decided.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Decided {
    pub approval: Approval,
    pub decision: Decision,
    /// The name of the key that decided.
    pub decided_by: String,
}

/// The most of a reason kept: it reaches the sandbox and the audit log.
pub const MAX_REASON_CHARS: usize = 1000;
