//! The execution tools: `run_python` (an answer in place), and `start_python`,
//! `get_execution` and `cancel_execution` (background work); and [`run`], which takes an
//! execution or a session's cell through the one pipeline with its host told what it asked
//! for while it runs.

use std::time::Duration;

use airlock_api::{ExecuteRequest, LimitsRequest};
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mcp::call::{at_least_a_second, Arguments, Call};
use crate::mcp::elicit::elicitation;
use crate::mcp::progress;
use crate::mcp::results::{execution_result, with_structured, Outcome, OutcomeError};
use airlock_service::answer::{Form, Reserved};
use airlock_service::error::Error;
use airlock_service::pipeline::{self, Finished, Input, Work};
use airlock_service::SharedServices;

/// `run_python`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RunPython {
    /// The Python 3 source to run, as a script. The value of a final bare expression is
    /// returned as `result`.
    code: String,
    /// Wall-clock limit for this run, in seconds (default and maximum: see the description).
    #[schemars(range(min = 1))]
    timeout_seconds: Option<u64>,
    /// A named environment whose packages the code may import (the operator lists them).
    environment: Option<String>,
    /// Your volumes to mount (directories that outlive the call), each below /work or /tmp:
    /// `[{"name": "data", "path": "/work/data", "read_only": false}]`.
    #[serde(default)]
    volumes: Vec<airlock_api::VolumeMountRequest>,
}

/// `get_execution`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct GetExecution {
    /// The id `start_python` returned.
    id: String,
    /// Wait up to this many seconds (at most 60) for it to end before answering; 0 or absent:
    /// answer at once.
    #[schemars(range(max = 60))]
    wait_seconds: Option<u64>,
}

/// `cancel_execution`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ExecutionId {
    /// The id `start_python` returned.
    id: String,
}

/// What `start_python`, `get_execution` and `cancel_execution` say of a background execution.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Background {
    /// What `get_execution` and `cancel_execution` take.
    id: String,
    state: airlock_service::background::State,
    /// RFC 3339.
    submitted_at: String,
    started_at: Option<String>,
    ended_at: Option<String>,
    /// Why it ended without a result (failed, cancelled, interrupted).
    error: Option<OutcomeError>,
    /// Once it ran: what `run_python` would have answered (the output is in the text),
    /// passed on as that call made it.
    #[schemars(with = "Option<Outcome>")]
    outcome: Option<serde_json::Value>,
}

impl Arguments for RunPython {
    fn check(&self) -> Result<(), ErrorData> {
        at_least_a_second(self.timeout_seconds)
    }
}

impl Arguments for GetExecution {
    fn check(&self) -> Result<(), ErrorData> {
        if self.wait_seconds.is_some_and(|w| w > 60) {
            return Err(ErrorData::invalid_params(
                "invalid arguments: wait_seconds must be at most 60",
                None,
            ));
        }
        Ok(())
    }
}

impl Arguments for ExecutionId {}

pub(super) async fn run_python(call: Call<'_>, a: RunPython) -> Result<CallToolResult, Error> {
    let work = Work::Execute(Input::Given(python_request(a)));
    run(call, work).await
}

/// Runs an execution or a cell (`run_python`, `run_in_session`) through the pipeline, with
/// its host told what it asked for from now until the answer: progress and log messages, and
/// approvals by elicitation. Its result is made (off the async workers) within the
/// reservation, which is kept for the answer rmcp writes of it.
pub(super) async fn run(call: Call<'_>, work: Work) -> Result<CallToolResult, Error> {
    let every = Duration::from_millis(call.state.config.mcp.progress_interval_ms);
    let (output, reporter) = progress::watch(call.context, every, call.logs).unzip();
    let approvals = elicitation(&call);
    let request = pipeline::Request {
        caller: call.key,
        request_id: call.request_id,
        work,
        received: call.received,
        stream: false,
        form: Form::Mcp,
        approvals,
        observer: output,
    };
    let result = present(call.state, request, call.slot).await;
    if let Some(reporter) = reporter {
        reporter.finish().await;
    }
    result
}

/// The pipeline's run of `request`, its result presented for the model.
async fn present(
    state: &SharedServices,
    request: pipeline::Request,
    slot: Option<Reserved>,
) -> Result<CallToolResult, Error> {
    let present = move |finished: Finished, share| {
        let result = match &finished {
            Finished::Execution(r) => execution_result(&r.id, &r.result, None, ""),
            Finished::Cell(r) => {
                let note = if r.session_ended {
                    "\nThe session has ended because of this cell; close it and create another."
                } else {
                    ""
                };
                execution_result(&r.id, &r.result, Some(r.session_ended), note)
            }
        };
        drop(finished);
        // Over stdio there is no slot: rmcp writes the answer to stdout, and the
        // reservation ends with the call.
        if let Some(slot) = &slot {
            slot.keep(share);
        }
        result
    };
    match pipeline::run(state, request, present).await? {
        pipeline::Outcome::Done(result) => Ok(result),
        pipeline::Outcome::Streamed(_) => Err(Error::internal("an MCP call is never streamed")),
    }
}

/// The request `run_python` and `start_python` make of their arguments.
fn python_request(a: RunPython) -> ExecuteRequest {
    ExecuteRequest {
        code: a.code,
        language: Default::default(),
        stdin: String::new(),
        env: Default::default(),
        files: Vec::new(),
        limits: LimitsRequest {
            timeout_ms: a.timeout_seconds.map(|s| s.saturating_mul(1000)),
            ..Default::default()
        },
        entrypoint: None,
        inputs: None,
        egress: None,
        credentials: None,
        environment: a.environment,
        volumes: a.volumes,
    }
}

pub(super) async fn start_python(call: Call<'_>, a: RunPython) -> Result<CallToolResult, Error> {
    let request = pipeline::Request {
        caller: call.key,
        request_id: call.request_id,
        work: Work::Execute(Input::Given(python_request(a))),
        received: call.received,
        stream: false,
        // get_execution answers it whole in memory, as run_python would.
        form: Form::Mcp,
        approvals: None,
        observer: None,
    };
    let meta = pipeline::submit(call.state, request).await?;
    let text = format!(
        "execution {} started in the background ({}). Call get_execution with this id \
         (wait_seconds up to 60) for its state, and its output once it ended.",
        meta.id,
        meta.state.as_str()
    );
    Ok(background_result(&meta, text, None))
}

/// A background execution's state; once it ran, its outcome as `run_python` gives it,
/// read from the disk within the caller's memory budget.
pub(super) async fn get_execution(
    call: Call<'_>,
    a: GetExecution,
) -> Result<CallToolResult, Error> {
    let (state, key) = (call.state, &call.key);
    let wait = Duration::from_secs(a.wait_seconds.unwrap_or(0));
    let meta = state
        .background
        .wait_ended(key, &a.id, wait)
        .await
        .ok_or_else(|| airlock_service::services::not_here(state, &a.id, "background execution"))?;
    let head = match (&meta.error, meta.state) {
        (Some(e), s) => format!("execution {} is {}: {}", meta.id, s.as_str(), e.message),
        (None, s) => format!("execution {} is {}", meta.id, s.as_str()),
    };
    let (st, m, k) = (state.clone(), meta.clone(), key.clone());
    let stored = tokio::task::spawn_blocking(move || -> Result<_, Error> {
        if !m.has_result {
            return Ok(None);
        }
        // Whole in memory as text blocks and rmcp's JSON of them, as run_python's answer
        // is, and reserved as it is (its limits are the execution's).
        let bytes = airlock_service::answer::answer_bytes(st.engine.config(), &m.limits, Form::Mcp);
        let share = st
            .memory
            .reserve(&k, bytes)
            .map_err(|over| airlock_service::answer::over_budget(over, "answers"))?;
        Ok(st.background.result(&m)?.map(|result| (result, share)))
    })
    .await
    .map_err(|e| Error::internal(e.to_string()))??;
    let Some((result, share)) = stored else {
        return Ok(background_result(&meta, head, None));
    };
    let ran = execution_result(&meta.id, &result, None, "");
    drop(result);
    if let Some(slot) = &call.slot {
        slot.keep(share);
    }
    Ok(background_result(&meta, head, Some(ran)))
}

pub(super) async fn cancel_execution(
    call: Call<'_>,
    a: ExecutionId,
) -> Result<CallToolResult, Error> {
    let state = call.state;
    let meta = state
        .background
        .delete(&call.key, &a.id, Duration::from_secs(10))
        .await
        .ok_or_else(|| airlock_service::services::not_here(state, &a.id, "background execution"))?;
    let text = format!(
        "execution {} is {}; its result and output are removed",
        meta.id,
        meta.state.as_str()
    );
    Ok(background_result(&meta, text, None))
}

/// A background execution's tool result: its state in a text block, then `ran`'s blocks (the
/// outcome of one that ran), with both as structured content.
fn background_result(
    meta: &airlock_service::background::Meta,
    head: String,
    ran: Option<CallToolResult>,
) -> CallToolResult {
    let (mut content, outcome, is_error) = match ran {
        Some(ran) => (
            ran.content,
            ran.structured_content,
            ran.is_error.unwrap_or(false),
        ),
        None => (
            Vec::new(),
            None,
            matches!(
                meta.state,
                airlock_service::background::State::Failed
                    | airlock_service::background::State::Interrupted
            ),
        ),
    };
    content.insert(0, ContentBlock::text(head));
    let result = if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    let state = Background {
        id: meta.id.clone(),
        state: meta.state,
        submitted_at: meta.submitted_at.clone(),
        started_at: meta.started_at.clone(),
        ended_at: meta.ended_at.clone(),
        error: meta.error.as_ref().map(|e| OutcomeError {
            kind: e.code.clone(),
            message: e.message.clone(),
        }),
        outcome,
    };
    with_structured(result, &state)
}
