//! A background execution's state (`meta.json`): where it is, its times, its limits, why it
//! ended without a result; replaced whole (written aside, synced, renamed) at each change.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::SystemTime;

use airlock_api::{ApiError, Limits};
use airlock_engine::durable::{write_aside, Place};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Kind};

/// Where a background execution is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Waiting for its turn (`[background] max_running`, the key's own) and a slot.
    Queued,
    Running,
    /// It ran to its end: `result` says how (an exception, a timeout... are results too).
    Finished,
    /// airlock could not run it (`error` says why).
    Failed,
    /// Cancelled by `DELETE`, before or while it ran.
    Cancelled,
    /// The server stopped while it was queued or running.
    Interrupted,
}

impl State {
    /// As the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Finished => "finished",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
            State::Interrupted => "interrupted",
        }
    }

    pub fn ended(self) -> bool {
        !matches!(self, State::Queued | State::Running)
    }
}

/// What `meta.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    pub id: String,
    pub state: State,
    pub key: String,
    pub key_fingerprint: String,
    pub request_id: String,
    pub submitted_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// When it ended, in milliseconds since the epoch: its retention counts from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    pub limits: Limits,
    /// Why it ended without a result (failed, cancelled before it ran, interrupted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
    /// Whether `result.json` holds its result.
    #[serde(default)]
    pub has_result: bool,
    /// Deleted: its result and events are gone, and it is as absent as one that never was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

/// What `GET /v1/executions/{id}` says of a background execution (its result follows, from
/// the disk, when it has one).
#[derive(Debug, Serialize)]
pub struct View<'a> {
    pub id: &'a str,
    pub background: bool,
    pub state: State,
    pub submitted_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<&'a str>,
    pub limits: &'a Limits,
    /// Where its events are (`GET`, with `Last-Event-ID` to resume).
    pub events: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a ApiError>,
}

impl Meta {
    /// A submission's, queued now.
    pub(super) fn queued(
        id: String,
        key: &crate::keys::Key,
        request_id: &str,
        limits: &Limits,
    ) -> Meta {
        Meta {
            id,
            state: State::Queued,
            key: key.name().to_owned(),
            key_fingerprint: key.fingerprint(),
            request_id: request_id.to_owned(),
            submitted_at: now().0,
            started_at: None,
            ended_at: None,
            ended_ms: None,
            limits: limits.clone(),
            error: None,
            has_result: false,
            deleted: false,
        }
    }

    pub fn view(&self) -> View<'_> {
        View {
            id: &self.id,
            background: true,
            state: self.state,
            submitted_at: &self.submitted_at,
            started_at: self.started_at.as_deref(),
            ended_at: self.ended_at.as_deref(),
            limits: &self.limits,
            events: format!("/v1/executions/{}/events", self.id),
            error: self.error.as_ref(),
        }
    }

    /// Ended now, in `state`, for `error` if it ended without a result of its own; the
    /// error's body, for its last event.
    pub(super) fn end(&mut self, state: State, error: Option<&Error>) -> Option<serde_json::Value> {
        let (at, ms) = now();
        self.state = state;
        self.ended_at = Some(at);
        self.ended_ms = Some(ms);
        let body = error.map(|e| e.body(Some(self.request_id.clone())))?;
        self.error = Some(body.error.clone());
        Some(serde_json::to_value(body).unwrap_or_default())
    }
}

/// Now, as the API writes times and in milliseconds since the epoch.
pub(super) fn now() -> (String, u64) {
    let at = SystemTime::now();
    let ms = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (humantime::format_rfc3339_millis(at).to_string(), ms)
}

pub(super) fn write_meta(dir: &Path, meta: &Meta) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
    write_aside(&dir.join("meta.json"), &bytes, Place::Replace)
}

/// A file only airlock reads, made anew.
pub(super) fn private_file(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

pub(super) fn read_meta(dir: &Path) -> Option<Meta> {
    let bytes = std::fs::read(dir.join("meta.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// What the last run left in `dir`: its state, and whether it was queued or running then. It
/// is interrupted now (its log ends with the error, `meta.json` says so), and a job that
/// waited is removed: it will not run now. `None` for one never submitted whole (a crash
/// between its directory and its state), which is removed.
pub(super) fn recover(dir: &Path) -> Option<(Meta, bool)> {
    let Some(mut meta) = read_meta(dir) else {
        let _ = std::fs::remove_dir_all(dir);
        return None;
    };
    let _ = std::fs::remove_file(dir.join("job"));
    let was_running = !meta.state.ended();
    if was_running {
        let error = interruption(meta.state);
        if let Some(data) = meta.end(State::Interrupted, Some(&error)) {
            super::log::end_interrupted(dir, &meta.id, &data);
        }
        let _ = write_meta(dir, &meta);
    }
    Some((meta, was_running))
}

/// Why it was interrupted, as its error says.
pub(super) fn interruption(was: State) -> Error {
    let what = if was == State::Queued {
        "waited to run"
    } else {
        "ran"
    };
    Error::new(
        Kind::Unavailable,
        "interrupted",
        format!("the server stopped while it {what}; submit it again"),
    )
}
