//! What a tool call answers: an execution's or a cell's result (the verdict in words, each
//! part in a block of its own, with the verdict as structured content), and a refusal, with
//! the same fields as the HTTP API's error. The model reads the text; a host may read the
//! structured content, which each tool's output schema describes.

use airlock_api::{ExecutionResult, Status};
use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use airlock_service::error::Error;

/// What `run_python` and `run_in_session` give as structured content: the verdict, without
/// the output and the value, which the text blocks carry (as structured data they would be
/// held in memory once more, beyond what the call reserved for its answer).
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Outcome {
    /// The execution's id (`GET /v1/executions/{id}` has its record).
    id: String,
    status: Status,
    exit_code: Option<i32>,
    signal: Option<i32>,
    /// The exception's type and message, when one was raised (the traceback is in the text).
    error: Option<OutcomeError>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    limits_hit: Vec<airlock_api::LimitKind>,
    usage: airlock_api::Usage,
    /// Whether a final bare expression gave a value (shown in the text as `result: ...`).
    has_result: bool,
    /// Rich outputs (charts as images, `display()`), in the content blocks.
    outputs: usize,
    /// For a session's cell: whether it ended the session.
    #[serde(skip_serializing_if = "Option::is_none")]
    session_ended: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct OutcomeError {
    pub kind: String,
    pub message: String,
}

/// A call refused before or instead of running (a limit above the ceiling, no such session,
/// a busy one, too many requests): the same fields as the HTTP API's error.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Refusal {
    refused: RefusalDetail,
}

#[derive(Debug, Serialize, JsonSchema)]
struct RefusalDetail {
    code: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
}

/// A refusal (a limit above the ceiling, no such session, a busy session, too many requests)
/// as a result the model can read and act on.
pub(super) fn refusal(e: Error) -> CallToolResult {
    let mut text = format!("{}: {}", e.code, e.message);
    if let Some(field) = &e.field {
        text.push_str(&format!(" [field: {field}]"));
    }
    if let Some(secs) = e.retry_after_secs {
        text.push_str(&format!(" [retry after {secs} s]"));
    }
    let structured = Refusal {
        refused: RefusalDetail {
            code: e.code.to_owned(),
            message: e.message,
            field: e.field,
            retry_after_seconds: e.retry_after_secs,
        },
    };
    with_structured(
        CallToolResult::error(vec![ContentBlock::text(text)]),
        &structured,
    )
}

/// `result` with `value` as its structured content (the tool's output schema describes it).
pub(super) fn with_structured(
    mut result: CallToolResult,
    value: &impl Serialize,
) -> CallToolResult {
    result.structured_content = serde_json::to_value(value).ok();
    result
}

/// What a verdict means, for a reader who did not see the limits.
fn verdict(r: &ExecutionResult) -> String {
    let l = &r.limits;
    match r.status {
        Status::Ok => "ok".to_owned(),
        Status::Error => "error (the code raised an exception or exited non-zero)".to_owned(),
        Status::Timeout => format!(
            "timeout (killed at the wall-clock limit of {} ms)",
            l.timeout_ms
        ),
        Status::MemoryLimit => format!(
            "memory_limit (killed at the memory limit of {} MB)",
            l.memory_mb
        ),
        Status::CpuLimit => format!("cpu_limit (killed at the CPU limit of {} ms)", l.cpu_ms),
        Status::PolicyViolation => {
            "policy_violation (killed for a system call the sandbox forbids)".to_owned()
        }
        Status::Crashed => format!(
            "crashed (killed by signal {})",
            r.signal.map_or_else(|| "?".to_owned(), |s| s.to_string())
        ),
        Status::InternalError => "internal_error (airlock itself failed)".to_owned(),
    }
}

/// An execution's result for the model: the status first, then each part in a text block of
/// its own (what the code printed cannot pass for the status or another part), charts as
/// images; an error unless `ok`.
pub(super) fn execution_result(
    id: &str,
    r: &ExecutionResult,
    session_ended: Option<bool>,
    note: &str,
) -> CallToolResult {
    let mut status = format!("status: {}", verdict(r));
    if let Some(code) = r.exit_code.filter(|c| *c != 0) {
        status.push_str(&format!("\nexit_code: {code}"));
    }
    status.push_str(note);
    let mut content = vec![ContentBlock::text(status)];
    for (name, s, cut) in [
        ("stdout", &r.stdout, r.stdout_truncated),
        ("stderr", &r.stderr, r.stderr_truncated),
    ] {
        if !s.is_empty() || cut {
            let cut = if cut {
                format!("\n[{name} cut at the output limit]")
            } else {
                String::new()
            };
            content.push(ContentBlock::text(format!("{name}:\n{s}{cut}")));
        }
    }
    // None, as a final print() gives, is no result to show (as in Python's REPL).
    if let Some(value) = r.result.as_ref().filter(|v| !v.is_null()) {
        content.push(ContentBlock::text(format!(
            "result: {}",
            airlock_api::value_text(value)
        )));
    }
    if let Some(e) = &r.error {
        let mut text = format!("error: {}: {}", e.kind, e.message);
        if let Some(tb) = &e.traceback {
            text.push_str(&format!("\ntraceback:\n{tb}"));
        }
        content.push(ContentBlock::text(text));
    }
    let mut images = Vec::new();
    for o in &r.outputs {
        match (o.mime.as_str(), &o.data) {
            ("image/png", serde_json::Value::String(b64)) => {
                images.push(ContentBlock::image(b64.clone(), "image/png"));
            }
            (mime, serde_json::Value::String(s)) => {
                content.push(ContentBlock::text(format!("display ({mime}):\n{s}")));
            }
            (mime, value) => content.push(ContentBlock::text(format!("display ({mime}): {value}"))),
        }
    }
    for f in &r.files {
        let why = f.skipped.as_deref().unwrap_or("returned");
        content.push(ContentBlock::text(format!(
            "output file: {} ({} bytes, {why})",
            f.path, f.size
        )));
    }
    content.extend(images);
    let outcome = Outcome {
        id: id.to_owned(),
        status: r.status,
        exit_code: r.exit_code,
        signal: r.signal,
        error: r.error.as_ref().map(|e| OutcomeError {
            kind: e.kind.clone(),
            message: e.message.clone(),
        }),
        stdout_truncated: r.stdout_truncated,
        stderr_truncated: r.stderr_truncated,
        limits_hit: r.limits_hit.clone(),
        usage: r.usage.clone(),
        has_result: r.result.as_ref().is_some_and(|v| !v.is_null()),
        outputs: r.outputs.len(),
        session_ended,
    };
    let result = if r.status == Status::Ok {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    };
    with_structured(result, &outcome)
}
