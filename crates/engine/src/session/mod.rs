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

mod exchange;
pub(crate) mod snapshots;

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use airlock_api::{ExecutionResult, Limits, Status};
use airlock_sandbox::{KillReason, Killer, Outcome, Probe, SetOnce};

use crate::config::RESPONSE_OVERHEAD;
use crate::engine::Engine;
use crate::error::{EngineError, Refusal};
use crate::isolation;
use crate::job::{check_entrypoint, Entrypoint, Job};
use crate::launcher::{socket_pair, Mode};
use crate::marshal::{self, Value};
use crate::paths::check_relative_path;
use crate::pump::{self, OutputSink, Progress};
use crate::request::{entrypoint_fields, tools_field};
use crate::tools::{Breach, ToolBridge};
use crate::verdict::{self, Response, Verdict};
use crate::volumes::JobVolume;
use exchange::{exchange, framed, io_error, Io};

/// How long a new session may take to be ready, and a file operation to be answered.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const FILE_TIMEOUT: Duration = Duration::from_secs(10);
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

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("limits", &self.limits)
            .finish()
    }
}
