//! Sessions: one sandbox and one interpreter for many cells (and file operations), like a
//! notebook kernel. Variables, imports and files persist between cells; the sandbox's limits
//! (memory, pids, disk, CPU) cover the whole session; each cell has its own wall clock.
//!
//! The runner (`session` mode) reads frames (see `channel`) from the host on its channel:
//! marshal from the host, JSON from the runner. A cell's
//! output is what reaches stdout and stderr while it runs: the runner flushes both before it
//! answers, and the host then reads what the pipes hold.
//!
//! A dedicated thread starts the sandbox and waits for it for its whole life: the sandbox's
//! init dies with the thread that forked it (`PR_SET_PDEATHSIG`), so it must not be a
//! short-lived worker's.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{ChildStderr, ChildStdout};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use airlock_api::{ExecutionResult, Limits, Status};
use airlock_sandbox::{KillReason, Killer, Outcome, Probe, SetOnce};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::channel::{self, Assembler, Broken, Frame};
use crate::config::RESPONSE_OVERHEAD;
use crate::engine::Engine;
use crate::error::{EngineError, Refusal};
use crate::isolation;
use crate::job::{check_entrypoint, Entrypoint, Job};
use crate::launcher::{socket_pair, Mode};
use crate::marshal::{self, Value};
use crate::paths::check_relative_path;
use crate::pump::{self, OutputSink, Progress, Stream, Streams};
use crate::request::{entrypoint_fields, tools_field};
use crate::tools::{Breach, ToolBridge};
use crate::verdict::{self, Response, Verdict};
use crate::volumes::JobVolume;

/// How long a new session may take to be ready, and a file operation to be answered.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const FILE_TIMEOUT: Duration = Duration::from_secs(10);
/// Reads of each stream once an answer is in: what the pipes hold then (background writers
/// could go on for ever).
const FINAL_READS: usize = 64;
/// Entries a listing of the working directory returns at most.
pub const MAX_LIST_ENTRIES: i32 = 10_000;

/// Why a session cannot take a request.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the session has ended ({0})")]
    Ended(Status),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A file operation the code's environment refused (no such file, a link, too large).
    #[error("{kind}: {message}")]
    File { kind: String, message: String },
}

/// How the session's sandbox ended, once it has.
type End = SetOnce<Result<Outcome, String>>;

struct Io {
    control: UnixStream,
    stdout: ChildStdout,
    stderr: ChildStderr,
    /// Readable once the sandbox has ended.
    ended: OwnedFd,
    cells: u64,
    /// Set when a cell ended the session: its status, for later requests.
    final_status: Option<Status>,
}

/// A live session. Dropping it destroys the sandbox.
pub struct Session {
    io: Mutex<Io>,
    killer: Killer,
    end: Arc<End>,
    probe: Option<Probe>,
    isolation: airlock_api::Isolation,
    limits: Limits,
    /// What a cell runs with by default: the sandbox's limits, but a cell's own wall clock
    /// and output limit.
    cell_limits: Limits,
    response_limit: u64,
    /// Code mode: the bridge serving the session's tool channel, asked for its package at
    /// each cell (the caller may change what it grants between cells).
    tools: Option<Arc<dyn ToolBridge>>,
    /// Why the tool channel was cut, when the code broke its protocol.
    breach: Arc<Breach>,
    /// The session's egress: each cell is an account of its own (`Leash::begin`), and the
    /// time between cells the session's (`Leash::for_session`, which the caller names).
    egress: Option<Arc<airlock_egress::Leash>>,
    /// The volumes its sandbox mounts, with their leases: let go once the sandbox is gone
    /// and its channel holds nothing more (a descriptor passed on it would keep a volume's
    /// mount), or with the session (after `io`, which closes the channel).
    volumes: Mutex<Vec<JobVolume>>,
}

/// One cell.
#[derive(Debug)]
pub struct Cell {
    /// The execution id the cell is audited under (its egress connections too).
    pub execution_id: String,
    pub code: String,
    pub entrypoint: Option<Entrypoint>,
    pub timeout: Duration,
}

/// What a cell did, and whether the session is over.
#[derive(Debug)]
pub struct CellResult {
    pub result: ExecutionResult,
    /// The sandbox has ended (the cell hit a limit, exited, or crashed): the session is over.
    pub ended: bool,
}

/// One entry of the working directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListedFile {
    pub path: String,
    /// `file`, `dir`, `link` (never followed) or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
}

impl Session {
    /// Starts a session whose sandbox has the job's limits (their `timeout_ms` is the
    /// session's lifetime), environment and files (the job's code is not run). Cells run with
    /// `per_cell`'s `timeout_ms` and `output_bytes` by default.
    pub fn start(
        engine: &Engine,
        mut setup: Job,
        per_cell: &Limits,
    ) -> Result<Session, EngineError> {
        engine.check(&setup)?;
        let policy = engine.job_policy(&setup);
        // Held by the thread that waits for the sandbox, until it is gone.
        let volumes = std::mem::take(&mut setup.volumes);
        let egress = setup.egress.clone();
        let request = framed(engine.runner_request(&setup, &policy, true)?)?;
        let end = Arc::new(End::default());
        let (wake_r, wake_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| io_error("pipe2", e.into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let (launcher, end2) = (engine.launcher().clone(), end.clone());
        let tools = match &setup.tools {
            Some(bridge) => Some((bridge.clone(), socket_pair()?)),
            None => None,
        };
        let breach = Arc::new(Breach::default());
        let breach2 = breach.clone();
        std::thread::Builder::new()
            .name("airlock-session".into())
            .spawn(move || {
                let (tools, theirs) = match tools {
                    Some((bridge, (ours, theirs))) => (Some((bridge, ours)), Some(theirs.into())),
                    None => (None, None),
                };
                // Where zygotes serve it, a child of the preloading one.
                let (mut child, control) =
                    match launcher.start(&policy, Mode::Session, theirs, true) {
                        Ok(started) => started,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                let serving = match (&egress, child.take_egress_listener()) {
                    (Some(leash), Some(listener)) => match leash.serve(listener) {
                        Ok(serving) => Some(serving),
                        Err(e) => {
                            let _ = tx.send(Err(io_error("serving the egress listener", e)));
                            return;
                        }
                    },
                    _ => None,
                };
                let served = tools.as_ref().and_then(|(bridge, channel)| {
                    let (bridge, channel) = (bridge.clone(), channel.try_clone());
                    let (killer, breach) = (child.killer(), breach2);
                    std::thread::Builder::new()
                        .name("airlock-session-tools".into())
                        .spawn(move || breach.serve(bridge.as_ref(), channel, &killer))
                        .ok()
                });
                drop(child.take_stdin()); // cells have no standard input
                let parts = (
                    control,
                    child.take_stdout(),
                    child.take_stderr(),
                    child.killer(),
                    child.probe(),
                    child.started_isolation(),
                );
                let _ = tx.send(Ok(parts));
                let outcome = child.wait().map_err(|e| e.to_string());
                drop(serving);
                if let Some((_, channel)) = &tools {
                    let _ = channel.shutdown(std::net::Shutdown::Both);
                }
                if let Some(served) = served {
                    let _ = served.join();
                }
                end2.set(outcome);
                let _ = nix::unistd::write(&wake_w, &[1]);
            })
            .map_err(|e| io_error("starting a session thread", e))?;
        let (control, stdout, stderr, killer, probe, started) = rx
            .recv()
            .map_err(|_| io_error("starting a session", std::io::Error::other("no sandbox")))??;
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            killer.kill(KillReason::Cancelled);
            return Err(io_error(
                "starting a session",
                std::io::Error::other("no output pipes"),
            ));
        };
        let response_limit = engine.response_limit();
        let mut io = Io {
            control,
            stdout,
            stderr,
            ended: wake_r,
            cells: 0,
            final_status: None,
        };
        let failed = |why: String| {
            killer.kill(KillReason::Cancelled);
            io_error("starting a session", std::io::Error::other(why))
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut discard = pump::Discard;
        let ex = exchange(&mut io, &request, deadline, &mut discard, 0, response_limit);
        match ex
            .reply
            .as_deref()
            .map(|r| verdict::parse_response(r, false, response_limit))
        {
            Some(Ok(Some(r))) if matches!(r.answer, Response::Result(_)) => {}
            Some(Ok(Some(verdict::Reply {
                answer: Response::Error(e),
                ..
            }))) => return Err(failed(format!("{}: {}", e.kind, e.message))),
            _ if ex.timed_out => return Err(failed("it was not ready in time".into())),
            _ => {
                let how = match end.wait(READY_TIMEOUT).map(|o| o.map(|o| o.exit)) {
                    Some(Ok(Some(exit))) => format!("the interpreter ended ({exit:?})"),
                    Some(Err(e)) => e,
                    _ => "the interpreter did not answer".into(),
                };
                return Err(failed(how));
            }
        }
        let mut isolation = started
            .wait(READY_TIMEOUT)
            .map(|i| isolation::reported(&i))
            .ok_or_else(|| failed("the sandbox did not report its isolation".into()))?;
        isolation::with_egress(&mut isolation, setup.egress.as_deref());
        Ok(Session {
            io: Mutex::new(io),
            killer,
            end,
            probe,
            isolation,
            cell_limits: Limits {
                timeout_ms: per_cell.timeout_ms,
                output_bytes: per_cell.output_bytes,
                ..setup.limits.clone()
            },
            limits: setup.limits,
            response_limit,
            tools: setup.tools,
            breach,
            egress: setup.egress,
            volumes: Mutex::new(volumes),
        })
    }

    /// Once the sandbox has ended: what its channel still holds is read and dropped (with
    /// any descriptor the code passed on it), then its volumes are let go. Nothing while it
    /// runs, or while a request uses the session.
    pub fn release_if_ended(&self) {
        if !self.end.is_set() {
            return;
        }
        let mut volumes = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        if volumes.is_empty() {
            return;
        }
        let Ok(mut io) = self.io.try_lock() else {
            return;
        };
        let _ = pump::set_nonblocking(io.control.as_fd());
        let mut buf = vec![0u8; 64 * 1024];
        for _ in 0..4096 {
            match pump::read_some(&mut io.control, &mut buf) {
                Progress::Data(_) => {}
                Progress::Eof | Progress::Blocked => break,
            }
        }
        volumes.clear();
    }

    fn io(&self) -> MutexGuard<'_, Io> {
        self.io.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limits a cell runs with, by default.
    pub fn cell_limits(&self) -> Limits {
        self.cell_limits.clone()
    }

    /// Waits until the sandbox is gone (after `close`), at most `within`.
    pub fn wait_ended(&self, within: Duration) -> bool {
        self.end.wait(within).is_some()
    }

    /// Destroys the sandbox (idempotent); what runs in it now ends as cancelled.
    pub fn close(&self) {
        self.killer.kill(KillReason::Cancelled);
    }

    /// Runs one cell; one at a time (a second caller waits for the first).
    pub fn execute(
        &self,
        cell: Cell,
        sink: &mut dyn OutputSink,
    ) -> Result<CellResult, SessionError> {
        let mut io = self.io();
        if let Some(status) = io.final_status {
            return Err(SessionError::Ended(status));
        }
        if let Some(e) = &cell.entrypoint {
            check_entrypoint(e)
                .map_err(|(field, m)| EngineError::from(Refusal::invalid(field, m)))?;
        }
        io.cells += 1;
        let filename = format!("cell{}.py", io.cells);
        let mut fields = vec![
            ("op", Value::Str("exec")),
            ("code", Value::Str(&cell.code)),
            ("filename", Value::Str(&filename)),
        ];
        fields.extend(entrypoint_fields(cell.entrypoint.as_ref()));
        let package = self.tools.as_ref().map(|t| t.package());
        if self.tools.is_some() {
            fields.push(("tools", tools_field(package.as_ref())));
        }
        let request = marshal::encode(&Value::Dict(fields))
            .map_err(|e| io_error("encoding a cell", std::io::Error::other(e)))?;
        let request = framed(request)?;
        let calls_before = self.tools.as_ref().map_or(0, |t| t.calls());

        // Connections belong to this cell from here until its answer is in, then to the
        // session again, whatever way the cell ends.
        if let Some(leash) = &self.egress {
            leash.begin(&cell.execution_id);
        }
        let _cell_running = self.egress.as_deref().map(CellRunning);
        let started = Instant::now();
        // Counters of the whole session so far: this cell's are what they grow by.
        let before = self.probe.as_ref().map(Probe::stats).unwrap_or_default();
        let mut limits = self.cell_limits();
        limits.timeout_ms = cell.timeout.as_millis() as u64;
        let output_limit = limits.output_bytes;
        let ex = exchange(
            &mut io,
            &request,
            started + cell.timeout,
            sink,
            output_limit,
            self.response_limit,
        );
        let truncated = ex.streams.truncated();
        let parsed = ex
            .reply
            .as_deref()
            .map(|r| verdict::parse_response(r, ex.overflow, self.response_limit))
            .unwrap_or(Ok(None));

        let alive = ex.reply.is_some() && !ex.overflow && !self.end.is_set();
        let v = if alive {
            // Answered, and alive: the cell's own verdict.
            let mut limits_hit = Vec::new();
            if truncated {
                limits_hit.push(airlock_api::LimitKind::Output);
            }
            // A child process killed at the memory or pids limit, the session alive.
            let now = self.probe.as_ref().map(Probe::stats).unwrap_or_default();
            if now.oom_kills > before.oom_kills {
                limits_hit.push(airlock_api::LimitKind::Memory);
            }
            if now.pids_limit_hits > before.pids_limit_hits {
                limits_hit.push(airlock_api::LimitKind::Pids);
            }
            limits_hit.sort();
            Verdict::answered(parsed, limits_hit)
        } else {
            // The sandbox ended (or must: a timeout, a broken channel): the kernel's verdict.
            let mut broken = false;
            if ex.timed_out {
                self.killer.kill(KillReason::WallTime);
            } else if self.end.wait(Duration::from_secs(2)).is_none() {
                // The code closed or misused the channel and lives on: the session can
                // no longer be trusted to answer.
                broken = true;
                self.killer.kill(KillReason::Cancelled);
            }
            let outcome = self.end.wait(Duration::from_secs(30));
            let Some(Ok(mut outcome)) = outcome else {
                let why = match outcome {
                    Some(Err(e)) => e,
                    _ => "the session's sandbox did not end".into(),
                };
                io.final_status = Some(Status::InternalError);
                return Err(io_error("ending a session", std::io::Error::other(why)).into());
            };
            // Only this cell's kills count for its verdict.
            outcome.oom_kills = outcome.oom_kills.saturating_sub(before.oom_kills);
            outcome.pids_limit_hits = outcome
                .pids_limit_hits
                .saturating_sub(before.pids_limit_hits);
            let mut v = verdict::verdict(&outcome, parsed, &limits, truncated);
            self.breach.explain(outcome.killed, &mut v);
            // A cell collects no files (its ./outputs is the session's, read as files).
            v.files = Vec::new();
            if broken {
                // The code's own doing, not airlock's failure.
                v.status = Status::Error;
                v.error = Some(verdict::result_error(
                    "the code closed or misused the session's channel; the session was \
                         ended"
                        .into(),
                ));
            }
            v
        };
        let ended = !alive;
        if ended {
            io.final_status = Some(v.status);
        }
        let stats = self.probe.as_ref().map(Probe::stats);
        let cpu_now = stats.as_ref().and_then(|s| s.cpu);
        let usage = airlock_api::Usage {
            wall_ms: started.elapsed().as_millis() as u64,
            cpu_ms: match (cpu_now, before.cpu) {
                (Some(now), Some(before)) => Some(now.saturating_sub(before).as_millis() as u64),
                _ => None,
            },
            memory_peak_bytes: stats.and_then(|s| s.memory_peak_bytes),
            tool_calls: self
                .tools
                .as_ref()
                .map_or(0, |t| t.calls().saturating_sub(calls_before)),
            egress: self.egress.as_ref().map(|l| l.end_cell()),
        };
        let result = v.into_result(ex.streams, usage, limits, self.isolation.clone());
        Ok(CellResult { result, ended })
    }

    /// Writes a file below the working directory (missing directories are made); a link or
    /// anything but a regular file in the way is refused.
    pub fn put_file(&self, path: &str, data: &[u8]) -> Result<(), SessionError> {
        check_relative_path(path).map_err(|m| EngineError::from(Refusal::invalid("path", m)))?;
        self.file_op(&Value::Dict(vec![
            ("op", Value::Str("put")),
            ("path", Value::Str(path)),
            ("data", Value::Bytes(data)),
        ]))
        .map(|_| ())
    }

    /// Reads a regular file below the working directory, at most `max_bytes`, following no
    /// link on the way.
    pub fn get_file(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, SessionError> {
        use base64::Engine as _;
        check_relative_path(path).map_err(|m| EngineError::from(Refusal::invalid("path", m)))?;
        // Half the result limit: its base64 and the answer around it fit in a response.
        let result_limit = self.response_limit - RESPONSE_OVERHEAD;
        let max = max_bytes.min(result_limit / 2).min(i32::MAX as u64);
        let value = self.file_op(&Value::Dict(vec![
            ("op", Value::Str("get")),
            ("path", Value::Str(path)),
            ("max_bytes", Value::Int(max as i32)),
        ]))?;
        let data = value
            .get("base64")
            .and_then(|d| d.as_str())
            .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
            .filter(|d| d.len() as u64 <= max && Some(d.len() as u64) == value["size"].as_u64())
            .ok_or_else(|| bad_answer("a file's contents"))?;
        Ok(data)
    }

    /// Everything below the working directory (no link followed), sorted by path.
    pub fn list_files(&self) -> Result<Vec<ListedFile>, SessionError> {
        let value = self.file_op(&Value::Dict(vec![
            ("op", Value::Str("list")),
            ("max_entries", Value::Int(MAX_LIST_ENTRIES)),
        ]))?;
        let entries: Vec<ListedFile> =
            serde_json::from_value(value).map_err(|_| bad_answer("a listing"))?;
        if entries.len() > MAX_LIST_ENTRIES as usize
            || entries
                .iter()
                .any(|e| check_relative_path(&e.path).is_err())
        {
            return Err(bad_answer("a listing"));
        }
        Ok(entries)
    }

    fn file_op(&self, op: &Value<'_>) -> Result<serde_json::Value, SessionError> {
        let mut io = self.io();
        if let Some(status) = io.final_status {
            return Err(SessionError::Ended(status));
        }
        let request = marshal::encode(op)
            .map_err(|e| io_error("encoding a file operation", std::io::Error::other(e)))?;
        let request = framed(request)?;
        // Output of background work in the meantime belongs to no cell: dropped.
        let mut discard = pump::Discard;
        let ex = exchange(
            &mut io,
            &request,
            Instant::now() + FILE_TIMEOUT,
            &mut discard,
            0,
            self.response_limit,
        );
        let parsed = ex
            .reply
            .as_deref()
            .map(|r| verdict::parse_response(r, ex.overflow, self.response_limit));
        match parsed {
            Some(Ok(Some(reply))) => match reply.answer {
                Response::Result(v) => Ok(v),
                Response::Error(e) => Err(SessionError::File {
                    kind: e.kind,
                    message: e.message,
                }),
            },
            _ => {
                // No usable answer: the session cannot be trusted to go on.
                self.killer.kill(KillReason::Cancelled);
                let status = match self.end.wait(Duration::from_secs(30)) {
                    Some(Ok(o)) => verdict::verdict(&o, Ok(None), &self.limits, false).status,
                    _ => Status::InternalError,
                };
                io.final_status = Some(status);
                Err(SessionError::Ended(status))
            }
        }
    }
}

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

/// Whether a streamed exchange wants more frames.
enum Flow {
    More,
    Done,
}

/// How a streamed exchange ended.
#[derive(Debug)]
enum StreamEnd {
    /// The receiver had what it wanted.
    Done,
    TimedOut,
    /// The sandbox ended, closed its channel or broke a frame.
    Gone,
    /// What was to be sent could not be made.
    SourceFailed,
}

/// Sends what `outgoing` puts in the buffer it is given (its last one, to fill again; until
/// it says there is no more) while handing each frame that comes
/// back to `incoming`, until it says [`Flow::Done`], the deadline passes or the sandbox ends.
/// Output the sandbox writes meanwhile belongs to no cell: read and dropped.
fn stream_exchange(
    io: &mut Io,
    outgoing: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<bool>,
    incoming: &mut dyn FnMut(&mut Vec<u8>) -> Flow,
    deadline: Instant,
    frame_cap: u64,
) -> StreamEnd {
    for fd in [io.control.as_fd(), io.stdout.as_fd(), io.stderr.as_fd()] {
        let _ = pump::set_nonblocking(fd);
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut sent = 0usize;
    let mut more_to_send = true;
    // Frames are read straight into `payload` (no copy but the kernel's): a 4-byte length,
    // then that many bytes.
    let mut head = [0u8; 4];
    let mut head_got = 0usize;
    let mut payload: Vec<u8> = Vec::new();
    let mut payload_got = 0usize;
    let mut in_payload = false;
    let mut buf = vec![0u8; 64 * 1024];
    let mut open = [true, true];
    loop {
        if sent == pending.len() && more_to_send {
            match outgoing(&mut pending) {
                Ok(true) => sent = 0,
                Ok(false) => {
                    more_to_send = false;
                    pending.clear();
                    sent = 0;
                }
                Err(_) => return StreamEnd::SourceFailed,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return StreamEnd::TimedOut;
        }
        let (control_ready, ended) = wait(io, sent < pending.len(), open, left);
        for (i, open) in open.iter_mut().enumerate() {
            if !*open {
                continue;
            }
            let got = if i == 0 {
                pump::read_some(&mut io.stdout, &mut buf)
            } else {
                pump::read_some(&mut io.stderr, &mut buf)
            };
            if matches!(got, Progress::Eof) {
                *open = false;
            }
        }
        if control_ready {
            if sent < pending.len() {
                match pump::write_some(&mut io.control, &pending[sent..]) {
                    Some(n) => sent += n,
                    None => return StreamEnd::Gone,
                }
            }
            // A bounded number of reads before the deadline is looked at again.
            for _ in 0..1024 {
                let target: &mut [u8] = if in_payload {
                    &mut payload[payload_got..]
                } else {
                    &mut head[head_got..]
                };
                let n = match pump::read_some(&mut io.control, target) {
                    Progress::Data(n) => n,
                    Progress::Eof => return StreamEnd::Gone,
                    Progress::Blocked => break,
                };
                if in_payload {
                    payload_got += n;
                } else {
                    head_got += n;
                    if head_got < head.len() {
                        continue;
                    }
                    let len = u32::from_le_bytes(head) as u64;
                    if len > frame_cap {
                        return StreamEnd::Gone;
                    }
                    payload.resize(len as usize, 0);
                    payload_got = 0;
                    in_payload = true;
                }
                if in_payload && payload_got == payload.len() {
                    in_payload = false;
                    head_got = 0;
                    if let Flow::Done = incoming(&mut payload) {
                        return StreamEnd::Done;
                    }
                }
            }
        }
        if ended {
            return StreamEnd::Gone;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.close();
    }
}

/// Ends a cell's account of egress when the cell ends, however it does.
struct CellRunning<'a>(&'a airlock_egress::Leash);

impl Drop for CellRunning<'_> {
    fn drop(&mut self) {
        self.0.end_cell();
    }
}

fn bad_answer(what: &str) -> SessionError {
    SessionError::File {
        kind: "ResultError".into(),
        message: format!("the sandbox sent an invalid answer for {what}"),
    }
}

fn io_error(what: &'static str, source: std::io::Error) -> EngineError {
    EngineError::Io { what, source }
}

/// A request (marshal) as the runner reads it: one frame.
fn framed(request: Vec<u8>) -> Result<Vec<u8>, EngineError> {
    channel::frame(&request).map_err(|e| io_error("framing a request", std::io::Error::other(e)))
}

/// What one request/answer exchange on a session's channel gave.
struct Exchange {
    /// The answer's payload (without its length).
    reply: Option<Vec<u8>>,
    /// The answer announced more than an answer may hold.
    overflow: bool,
    streams: Streams,
    timed_out: bool,
}

/// Sends `request`, then collects output until the answer is whole, the deadline passes or
/// the sandbox ends. Output that the pipes hold once the answer is in belongs to it too.
fn exchange(
    io: &mut Io,
    request: &[u8],
    deadline: Instant,
    sink: &mut dyn OutputSink,
    output_limit: u64,
    response_limit: u64,
) -> Exchange {
    let mut ex = Exchange {
        reply: None,
        overflow: false,
        streams: Streams::default(),
        timed_out: false,
    };
    for fd in [io.control.as_fd(), io.stdout.as_fd(), io.stderr.as_fd()] {
        let _ = pump::set_nonblocking(fd);
    }
    let mut sent = 0usize;
    let mut answer = Assembler::new(response_limit);
    let mut buf = vec![0u8; 64 * 1024];
    let mut open = [true, true]; // stdout, stderr
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            ex.timed_out = true;
            break;
        }
        let (control_ready, ended) = wait(io, sent < request.len(), open, left);
        drain(io, &mut buf, &mut ex, &mut open, sink, output_limit, false);
        if control_ready {
            if sent < request.len() {
                match pump::write_some(&mut io.control, &request[sent..]) {
                    Some(n) => sent += n,
                    None => break, // the runner is gone
                }
            }
            let frame = loop {
                match pump::read_some(&mut io.control, &mut buf) {
                    Progress::Data(n) => {
                        answer.push(&buf[..n]);
                        if let Some(frame) = answer.frame() {
                            break Some(frame);
                        }
                    }
                    Progress::Eof => break Some(answer.end()),
                    Progress::Blocked => break None,
                }
            };
            match frame {
                Some(Frame::Data(reply)) => {
                    ex.reply = Some(reply);
                    drain(io, &mut buf, &mut ex, &mut open, sink, output_limit, true);
                    break;
                }
                Some(Frame::Broken(Broken::TooLarge { .. })) => {
                    ex.overflow = true;
                    ex.reply = Some(Vec::new());
                    break;
                }
                // The runner closed its channel, with no whole answer on it.
                Some(Frame::End | Frame::Broken(Broken::Cut)) => break,
                None => {}
            }
        }
        if ended {
            drain(io, &mut buf, &mut ex, &mut open, sink, output_limit, true);
            break;
        }
    }
    ex
}

/// Waits (at most `left`) for the channel to be readable (or writable, with `sending`), the
/// sandbox to end or an open output stream to be readable: whether the channel is ready, and
/// whether the sandbox has ended.
fn wait(io: &Io, sending: bool, open: [bool; 2], left: Duration) -> (bool, bool) {
    let mut ctl = PollFlags::POLLIN;
    if sending {
        ctl |= PollFlags::POLLOUT;
    }
    let mut fds = vec![
        PollFd::new(io.control.as_fd(), ctl),
        PollFd::new(io.ended.as_fd(), PollFlags::POLLIN),
    ];
    if open[0] {
        fds.push(PollFd::new(io.stdout.as_fd(), PollFlags::POLLIN));
    }
    if open[1] {
        fds.push(PollFd::new(io.stderr.as_fd(), PollFlags::POLLIN));
    }
    let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
    let _ = poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    );
    let ready = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
    (ready(0), ready(1))
}

/// Reads from stdout and stderr, keeping what fits the output limit: one read each while the
/// cell runs (so the deadline is looked at between reads, however fast the code writes), or
/// what they hold, up to `FINAL_READS` reads each, once the answer is in.
fn drain(
    io: &mut Io,
    buf: &mut [u8],
    ex: &mut Exchange,
    open: &mut [bool; 2],
    sink: &mut dyn OutputSink,
    limit: u64,
    last: bool,
) {
    let reads = if last { FINAL_READS } else { 1 };
    for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
        for _ in 0..reads {
            if !open[i] {
                break;
            }
            let got = match stream {
                Stream::Stdout => pump::read_some(&mut io.stdout, buf),
                Stream::Stderr => pump::read_some(&mut io.stderr, buf),
            };
            let n = match got {
                Progress::Data(n) => n,
                Progress::Eof => {
                    open[i] = false;
                    break;
                }
                Progress::Blocked => break,
            };
            let cap = ex.streams.of(stream);
            let room = (limit as usize).saturating_sub(cap.data.len());
            let keep = n.min(room);
            if keep > 0 {
                cap.data.extend_from_slice(&buf[..keep]);
                sink.output(stream, &buf[..keep]);
            }
            if n > keep && !cap.truncated && limit > 0 {
                cap.truncated = true;
                sink.truncated(stream, limit);
            }
            // Past the budget this cell reads the stream no more (the session keeps its
            // pipe): the program blocks on it instead of making the host read for nothing.
            cap.discarded += (n - keep) as u64;
            if cap.discarded > pump::discard_budget(limit) {
                open[i] = false;
                break;
            }
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("limits", &self.limits)
            .finish()
    }
}
