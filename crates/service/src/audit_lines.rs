//! What the audit log holds, whichever store keeps it: one JSON line per event (an
//! execution's `started` line, its final record, the `interrupted` record a restart gives an
//! execution that never ended), what opening a log repaired, and a file's torn last line cut
//! off. The file log (`audit.rs`) and PostgreSQL (`store.rs`) both write these.

use std::borrow::Cow;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

use airlock_api::ExecutionRecord;

/// How often a failed log is tried again (by the requests and readiness probes that ask),
/// and the store's writer tries the database again: what a refusal's `Retry-After` says.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// One JSON line: the value and a newline.
pub fn line_of(value: &impl serde::Serialize) -> std::io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

/// The line written when an execution is about to start (`"event": "started"`); the
/// record with the verdict follows when it ends. Read back at start, owned.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct StartedLine<'a> {
    pub event: Cow<'a, str>,
    pub id: Cow<'a, str>,
    pub request_id: Cow<'a, str>,
    pub key: Cow<'a, str>,
    pub key_fingerprint: Cow<'a, str>,
    pub started_at: Cow<'a, str>,
    pub code_sha256: Cow<'a, str>,
    pub code_bytes: u64,
    pub limits: Cow<'a, airlock_api::Limits>,
}

/// What opening the log repaired and found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Bytes of a last line cut short, cut off.
    pub torn_bytes: u64,
    /// Executions that had started and not ended, now recorded as interrupted.
    pub interrupted: Vec<String>,
    /// Sessions that were open when the server stopped.
    pub lost_sessions: usize,
}

/// What an interrupted execution's record says.
pub const INTERRUPTED: &str =
    "the server stopped before this execution ended; its outcome is unknown";

pub fn interrupted(started: StartedLine<'_>) -> ExecutionRecord {
    ExecutionRecord {
        id: started.id.into_owned(),
        request_id: started.request_id.into_owned(),
        key: started.key.into_owned(),
        key_fingerprint: started.key_fingerprint.into_owned(),
        started_at: started.started_at.into_owned(),
        code_sha256: started.code_sha256.into_owned(),
        code_bytes: started.code_bytes,
        status: airlock_api::Status::InternalError,
        exit_code: None,
        signal: None,
        limits: started.limits.into_owned(),
        limits_hit: Vec::new(),
        usage: airlock_api::Usage::default(),
        interrupted: true,
        error: Some(airlock_api::ErrorInfo {
            kind: "Interrupted".into(),
            message: INTERRUPTED.into(),
            traceback: None,
        }),
    }
}

/// Cuts the file back to its last newline: what follows it is a line the machine stopped in
/// the middle of (each line is one write, so a crashed process leaves none). Returns the bytes
/// cut.
pub fn cut_torn_tail(file: &mut File) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    let mut end = len;
    let mut buf = [0u8; 4096];
    while end > 0 {
        let from = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - from) as usize];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(chunk)?;
        if let Some(at) = chunk.iter().rposition(|&b| b == b'\n') {
            end = from + at as u64 + 1;
            break;
        }
        end = from;
    }
    if end < len {
        file.set_len(end)?;
    }
    Ok(len - end)
}
