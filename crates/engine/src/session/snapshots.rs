//! A session's state kept and brought back: `Session::snapshot` streams what the runner
//! writes of it (its variables, functions, classes, modules and scratch files) to a sink, and
//! `Session::restore` streams it back into a fresh session; each with what the runner says of
//! it, untrusted and bounded (`SnapshotReport`).

use std::time::{Duration, Instant};

use airlock_api::Status;
use airlock_sandbox::KillReason;

use super::exchange::{framed, io_error, stream_exchange, Flow, Io, StreamEnd};
use super::{bad_answer, Session, SessionError};
use crate::error::EngineError;
use crate::marshal::{self, Value};
use crate::verdict::{self, Response};

/// What a snapshot holds (or a restore brought back), as the runner says: the names of the
/// variables, and those that could not be kept, each with why. Untrusted, and bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotReport {
    pub variables: Vec<String>,
    pub not_kept: std::collections::BTreeMap<String, String>,
}

/// Why a snapshot or a restore did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The state is larger than it may be: nothing was kept, the session lives on.
    #[error("the session's state is over {limit} bytes")]
    TooLarge { limit: u64 },
    /// The runner refused (a snapshot it could not read, a file it could not write): the
    /// session lives on.
    #[error("{kind}: {message}")]
    Refused { kind: String, message: String },
    /// Where the snapshot goes, or comes from, failed.
    #[error("the snapshot's file: {0}")]
    Store(std::io::Error),
    #[error(transparent)]
    Session(#[from] SessionError),
}

impl From<EngineError> for SnapshotError {
    fn from(e: EngineError) -> Self {
        SnapshotError::Session(SessionError::Engine(e))
    }
}

/// The largest binary frame of a snapshot (the runner's are 1 MiB).
const SNAPSHOT_FRAME: u64 = 4 << 20;
/// A restore's frames: the snapshot in pieces of 1 MiB, each after a frame's length and
/// marshal's bytes header.
const RESTORE_CHUNK: usize = 1 << 20;
const RESTORE_HEAD: usize = 4 + 5;
/// Most variables a report may name, bytes of each name and reason, and in all.
const MAX_REPORTED: usize = 10_000;
const MAX_NAME: usize = 256;
const MAX_WHY: usize = 1024;
const MAX_REPORT_BYTES: usize = 256 << 10;

impl Session {
    /// Writes the session's state (its variables, functions, classes and imported modules,
    /// and the files of its scratch file system) to `sink`, as opaque bytes that only a
    /// session's runner reads ([`Session::restore`]); at most `max_bytes` of them. The
    /// session goes on as it was.
    pub fn snapshot(
        &self,
        sink: &mut dyn FnMut(Vec<u8>) -> std::io::Result<()>,
        max_bytes: u64,
        within: Duration,
    ) -> Result<(SnapshotReport, u64), SnapshotError> {
        let mut io = self.io();
        if let Some(status) = io.final_status {
            return Err(SessionError::Ended(status).into());
        }
        let request = framed(
            marshal::encode(&Value::Dict(vec![("op", Value::Str("snapshot"))]))
                .map_err(|e| io_error("encoding a snapshot", std::io::Error::other(e)))?,
        )?;
        let mut first = Some(request);
        let mut bytes = 0u64;
        let mut send_first = |buf: &mut Vec<u8>| -> std::io::Result<bool> {
            match first.take() {
                Some(request) => {
                    *buf = request;
                    Ok(true)
                }
                None => Ok(false),
            }
        };
        let mut failed: Option<SnapshotError> = None;
        let mut chunks_done = false;
        let mut reply = None;
        let end = stream_exchange(
            &mut io,
            &mut send_first,
            &mut |frame| {
                if chunks_done {
                    reply = Some(frame.to_vec());
                    return Flow::Done;
                }
                if frame.is_empty() {
                    chunks_done = true;
                    return Flow::More;
                }
                // Past the limit, or once the sink failed, the rest is read and dropped: the
                // session lives on, and answers.
                bytes += frame.len() as u64;
                if failed.is_none() {
                    if bytes > max_bytes {
                        failed = Some(SnapshotError::TooLarge { limit: max_bytes });
                    } else if let Err(e) = sink(std::mem::take(frame)) {
                        failed = Some(SnapshotError::Store(e));
                    }
                }
                Flow::More
            },
            Instant::now() + within,
            SNAPSHOT_FRAME.max(self.response_limit),
        );
        let report = self.settle(&mut io, end, reply)?;
        match failed {
            Some(e) => Err(e),
            None => Ok((report, bytes)),
        }
    }

    /// Reads a state [`Session::snapshot`] wrote from `source` into this session (a fresh
    /// one), files first, then the variables. What the snapshot could not keep is in the
    /// report.
    pub fn restore(
        &self,
        source: &mut dyn std::io::Read,
        within: Duration,
    ) -> Result<SnapshotReport, SnapshotError> {
        let mut io = self.io();
        if let Some(status) = io.final_status {
            return Err(SessionError::Ended(status).into());
        }
        let request = framed(
            marshal::encode(&Value::Dict(vec![("op", Value::Str("restore"))]))
                .map_err(|e| io_error("encoding a restore", std::io::Error::other(e)))?,
        )?;
        let mut first = Some(request);
        let mut finished = false;
        let mut reply = None;
        let mut read_failed = None;
        let end = stream_exchange(
            &mut io,
            &mut |frame: &mut Vec<u8>| {
                if let Some(first) = first.take() {
                    *frame = first;
                    return Ok(true);
                }
                if finished {
                    return Ok(false);
                }
                // A frame of one marshalled bytes object (`s`, its length, the bytes), the
                // snapshot read straight into it; the buffer is the last frame's, so only
                // what it lacks is zeroed.
                frame.resize(RESTORE_HEAD + RESTORE_CHUNK, 0);
                let n = match read_full(source, &mut frame[RESTORE_HEAD..]) {
                    Ok(n) => n,
                    Err(e) => {
                        // The runner gets the end it waits for; the error is ours.
                        read_failed = Some(e);
                        0
                    }
                };
                if n == 0 {
                    finished = true;
                }
                frame.truncate(RESTORE_HEAD + n);
                frame[..4].copy_from_slice(&((n + 5) as u32).to_le_bytes());
                frame[4] = b's';
                frame[5..9].copy_from_slice(&(n as u32).to_le_bytes());
                Ok(true)
            },
            &mut |frame| {
                reply = Some(frame.to_vec());
                Flow::Done
            },
            Instant::now() + within,
            self.response_limit,
        );
        let report = self.settle(&mut io, end, reply)?;
        match read_failed {
            Some(e) => Err(SnapshotError::Store(e)),
            None => Ok(report),
        }
    }

    /// The runner's answer to a snapshot or a restore; a session that gave none cannot be
    /// trusted to go on, and is ended.
    fn settle(
        &self,
        io: &mut Io,
        end: StreamEnd,
        reply: Option<Vec<u8>>,
    ) -> Result<SnapshotReport, SnapshotError> {
        let parsed = match (end, reply) {
            (StreamEnd::Done, Some(reply)) => {
                verdict::parse_response(&reply, false, self.response_limit)
                    .ok()
                    .flatten()
            }
            _ => None,
        };
        // A report out of bounds is as bad as none.
        let parsed = parsed.filter(|p| match &p.answer {
            Response::Result(v) => serde_json::from_value::<SnapshotReport>(v.clone())
                .is_ok_and(|r| report_in_bounds(&r)),
            Response::Error(_) => true,
        });
        let Some(parsed) = parsed else {
            self.killer.kill(KillReason::Cancelled);
            let status = match self.end.wait(Duration::from_secs(30)) {
                Some(Ok(o)) => verdict::verdict(&o, Ok(None), &self.limits, false).status,
                _ => Status::InternalError,
            };
            io.final_status = Some(status);
            return Err(SessionError::Ended(status).into());
        };
        match parsed.answer {
            Response::Result(v) => {
                let report: SnapshotReport = serde_json::from_value(v)
                    .map_err(|_| SnapshotError::from(bad_answer("a snapshot")))?;
                Ok(report)
            }
            Response::Error(e) => Err(SnapshotError::Refused {
                kind: e.kind,
                message: e.message,
            }),
        }
    }
}

/// Whether what the sandbox says of a snapshot fits what is kept in the session's record and
/// shown.
fn report_in_bounds(report: &SnapshotReport) -> bool {
    let names = report
        .variables
        .iter()
        .chain(report.not_kept.keys())
        .map(String::len);
    let bytes: usize =
        names.clone().sum::<usize>() + report.not_kept.values().map(String::len).sum::<usize>();
    report.variables.len() + report.not_kept.len() <= MAX_REPORTED
        && names.clone().all(|n| n <= MAX_NAME)
        && report.not_kept.values().all(|w| w.len() <= MAX_WHY)
        && bytes <= MAX_REPORT_BYTES
}

/// Reads until `buf` is full or the source ends.
fn read_full(source: &mut dyn std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match source.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
