//! The session tools: `create_session`, `run_in_session`, `list_session_files`,
//! `read_session_file` and `close_session`, over the session service and the one pipeline.

use airlock_api::{CellRequest, SessionRequest, Status};
use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mcp::call::{at_least_a_second, Arguments, Call};
use crate::mcp::executions::run;
use crate::mcp::results::with_structured;
use airlock_service::error::Error;
use airlock_service::pipeline::{self, Input, Work};
use airlock_service::sessions;

/// `create_session`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateSession {
    /// A named environment for the session (the operator lists them).
    environment: Option<String>,
    /// Your volumes the session mounts while it lives, each below /work or /tmp.
    #[serde(default)]
    volumes: Vec<airlock_api::VolumeMountRequest>,
}

/// `run_in_session`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RunInSession {
    /// The id `create_session` returned.
    session_id: String,
    /// Python 3 source, run in the session's interpreter like a notebook cell.
    code: String,
    /// Wall-clock limit for this cell, in seconds.
    #[schemars(range(min = 1))]
    timeout_seconds: Option<u64>,
}

/// Arguments naming a session only.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SessionId {
    /// The id `create_session` returned.
    session_id: String,
}

/// `read_session_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadSessionFile {
    /// The id `create_session` returned.
    session_id: String,
    /// A path relative to the session's working directory, as `list_session_files` shows it.
    path: String,
}

/// `read_session_file`'s structured content: what the content block holds.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct FileRead {
    path: String,
    bytes: u64,
    /// `text` (UTF-8), `image` (PNG) or `base64` (anything else).
    shown_as: String,
}

/// `create_session`'s structured content: the session as `GET /v1/sessions/{id}` gives it,
/// its id named `session_id`, as the text and every other session tool name it.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct CreatedSession {
    /// What `run_in_session`, `list_session_files`, `read_session_file` and `close_session`
    /// take.
    session_id: String,
    /// RFC 3339.
    created_at: String,
    /// When it will be closed at the latest, RFC 3339.
    expires_at: String,
    idle_timeout_ms: u64,
    max_lifetime_ms: u64,
    /// Cells run so far.
    cells: u64,
    /// `null` while it can run cells; else the status of the cell that ended it.
    ended: Option<Status>,
    limits: airlock_api::Limits,
}

impl From<airlock_api::SessionInfo> for CreatedSession {
    fn from(info: airlock_api::SessionInfo) -> Self {
        // A new session has had no time between cells: `egress_between_cells` is for
        // `GET /v1/sessions/{id}` later.
        let airlock_api::SessionInfo {
            id,
            created_at,
            expires_at,
            idle_timeout_ms,
            max_lifetime_ms,
            cells,
            ended,
            limits,
            egress_between_cells: _,
            paused: _,
            resumed: _,
        } = info;
        CreatedSession {
            session_id: id,
            created_at,
            expires_at,
            idle_timeout_ms,
            max_lifetime_ms,
            cells,
            ended,
            limits,
        }
    }
}

/// `close_session`'s structured content.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Closed {
    session_id: String,
}

impl Arguments for CreateSession {}

impl Arguments for RunInSession {
    fn check(&self) -> Result<(), ErrorData> {
        at_least_a_second(self.timeout_seconds)
    }
}

impl Arguments for SessionId {}

impl Arguments for ReadSessionFile {}

pub(super) async fn create_session(
    call: Call<'_>,
    a: CreateSession,
) -> Result<CallToolResult, Error> {
    let CreateSession {
        environment,
        volumes,
    } = a;
    let asked = SessionRequest {
        environment,
        volumes,
        ..SessionRequest::default()
    };
    let info = pipeline::open_session(
        call.state,
        &call.key,
        &call.request_id,
        Input::Given(asked),
        call.received,
    )
    .await?;
    let l = &info.limits;
    let result = CallToolResult::success(vec![ContentBlock::text(format!(
        "session_id: {}\nexpires_at: {}\nidle_timeout_seconds: {}\nper-cell limits: {} s \
         wall clock, {} bytes of output per stream; for the whole session: {} MB memory, \
         {} processes, {} MB disk",
        info.id,
        info.expires_at,
        info.idle_timeout_ms / 1000,
        l.timeout_ms.div_ceil(1000),
        l.output_bytes,
        l.memory_mb,
        l.pids,
        l.disk_mb
    ))]);
    Ok(with_structured(result, &CreatedSession::from(info)))
}

pub(super) async fn run_in_session(
    call: Call<'_>,
    a: RunInSession,
) -> Result<CallToolResult, Error> {
    let asked = CellRequest {
        code: a.code,
        entrypoint: None,
        inputs: None,
        timeout_ms: a.timeout_seconds.map(|s| s.saturating_mul(1000)),
    };
    let work = Work::Cell {
        session: a.session_id,
        input: Input::Given(asked),
    };
    run(call, work).await
}

pub(super) async fn list_session_files(
    call: Call<'_>,
    a: SessionId,
) -> Result<CallToolResult, Error> {
    let (state, key) = (call.state, &call.key);
    airlock_service::snapshots::bring_back_if_paused(state, key, &a.session_id).await?;
    let list = sessions::files(state, key, &a.session_id).await?;
    let text = if list.files.is_empty() {
        "(no files)".to_owned()
    } else {
        list.files
            .iter()
            .map(|f| format!("{} ({}, {} bytes)", f.path, f.kind, f.size))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let result = CallToolResult::success(vec![ContentBlock::text(text)]);
    Ok(with_structured(result, &list))
}

pub(super) async fn read_session_file(
    call: Call<'_>,
    a: ReadSessionFile,
) -> Result<CallToolResult, Error> {
    let (state, key) = (call.state, &call.key);
    let path = a.path.clone();
    airlock_service::snapshots::bring_back_if_paused(state, key, &a.session_id).await?;
    let data = sessions::read_file(state, key, &a.session_id, a.path).await?;
    let bytes = data.len() as u64;
    let (content, shown_as) = if data.starts_with(PNG_SIGNATURE) {
        let png = base64::engine::general_purpose::STANDARD.encode(&data);
        (ContentBlock::image(png, "image/png"), "image")
    } else {
        match String::from_utf8(data) {
            Ok(text) => (ContentBlock::text(text), "text"),
            Err(e) => (
                ContentBlock::text(format!(
                    "(binary file, {} bytes, base64:)\n{}",
                    e.as_bytes().len(),
                    base64::engine::general_purpose::STANDARD.encode(e.as_bytes())
                )),
                "base64",
            ),
        }
    };
    let read = FileRead {
        path,
        bytes,
        shown_as: shown_as.to_owned(),
    };
    Ok(with_structured(
        CallToolResult::success(vec![content]),
        &read,
    ))
}

pub(super) async fn close_session(call: Call<'_>, a: SessionId) -> Result<CallToolResult, Error> {
    sessions::close(call.state, &call.key, &a.session_id).await?;
    let result = CallToolResult::success(vec![ContentBlock::text(format!(
        "session {} closed",
        a.session_id
    ))]);
    Ok(with_structured(
        result,
        &Closed {
            session_id: a.session_id,
        },
    ))
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
