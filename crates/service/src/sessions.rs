//! The session service: opening one ([`prepare_open`], [`start`]), its cells
//! ([`prepare_cell`], [`PreparedCell`]), its files, closing it ([`close`]); the registry of
//! open sessions and what the reaper closes are [`crate::open_sessions`] (the reaper itself,
//! which also pauses idle sessions, is `snapshots::reaper`). The order of a session's opening and of each
//! cell is the pipeline's (`pipeline/`); what each step does to a session is here. A
//! session belongs to the key that made it (by the key's fingerprint): any other key gets
//! 404. Its limits cover the whole session; each cell goes through admission like an
//! execution, and is audited like one. Idle and expired sessions are closed by a reaper, and
//! every session is closed at shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use airlock_api::{
    CellRequest, ExecuteRequest, FileEntry, FileList, SessionInfo, SessionList, SessionRequest,
};
use airlock_engine::{Cell, CellResult, Execution, Session, SessionError};

use crate::body::{read_body_as, Body};
use crate::error::{Error, Kind};
use crate::execution::{entrypoint_from, job_from, refuse_if_unavailable, resolve_limits};
use crate::keys::Key;
use crate::open_sessions::{lock, InUse, OpenSession};
use crate::services::{Services, SharedServices};
use crate::tools;

/// How often the reaper looks for idle and expired sessions.
pub const REAP_EVERY: Duration = Duration::from_millis(500);

/// The caller's session `id`; 410 `session_lost` for one of its sessions the server lost
/// when it stopped; otherwise 404 (also when it is another key's).
pub fn find(state: &Services, key: &Key, id: &str) -> Result<Arc<OpenSession>, Error> {
    let fingerprint = key.fingerprint();
    if let Some(entry) = state
        .sessions
        .lock()
        .get(id)
        .filter(|e| e.key_fingerprint == fingerprint)
    {
        return Ok(entry.clone());
    }
    if state.audit.session_lost(id, &fingerprint) {
        return Err(Error::new(
            Kind::Gone,
            "session_lost",
            "the server stopped since this session was opened, and a session does not survive a restart: start another",
        ));
    }
    Err(crate::services::not_here(state, id, "session"))
}

/// Whether one more session fits: the key's own cap (429), then the server's (503). Sessions
/// that have ended count for neither.
fn room_for_one(
    open: &HashMap<String, Arc<OpenSession>>,
    key: &Key,
    cfg: &crate::config::SessionsConfig,
) -> Result<(), Error> {
    let live = || open.values().filter(|e| lock(&e.ended).is_none());
    let mine = live()
        .filter(|e| e.key_fingerprint == key.fingerprint())
        .count();
    if mine >= cfg.max_open_per_key {
        return Err(Error::new(
            Kind::RateLimited,
            "rate_limited",
            format!("this key has {mine} sessions open, its most; close one first"),
        ));
    }
    if live().count() >= cfg.max_open {
        return Err(Error::new(
            Kind::Unavailable,
            "overloaded",
            "the server has as many sessions open as it may",
        )
        .retry_after(5));
    }
    Ok(())
}

fn session_error(e: SessionError, entry: &OpenSession) -> Error {
    match e {
        SessionError::Ended(status) => {
            *lock(&entry.ended) = Some(status);
            Error::new(
                Kind::Conflict,
                "session_ended",
                format!("the session has ended ({status}); close it and start another"),
            )
        }
        SessionError::File { kind, message } => {
            let (error_kind, code) = match kind.as_str() {
                "FileNotFoundError" => (Kind::NotFound, "not_found"),
                _ => (Kind::Invalid, "invalid_request"),
            };
            Error::new(error_kind, code, format!("{kind}: {message}")).field("path")
        }
        SessionError::Engine(airlock_engine::EngineError::Invalid(r)) => {
            crate::execution::refusal(r)
        }
        SessionError::Engine(e) => Error::internal(e.to_string()),
    }
}

/// A session asked for, checked and ready to start ([`prepare_open`], then [`start`]).
#[derive(Debug)]
pub struct Opening {
    id: String,
    request: SessionRequest,
    job: airlock_engine::Job,
    per_cell: airlock_api::Limits,
    idle: u64,
    lifetime: u64,
    tools: Option<Arc<airlock_tools::ToolSet>>,
    egress: Option<Arc<airlock_egress::Leash>>,
}

/// Checks a session's request: its timeouts within the configured ones, its cells' limits
/// within the key's ceilings, its job as an execution's (`job_from`), and room for one more
/// (CPU work: called off the async workers).
pub fn prepare_open(
    state: &SharedServices,
    key: &Key,
    asked: SessionRequest,
) -> Result<Opening, Error> {
    prepare_open_as(state, key, asked, state.held_id("se_"))
}

/// As [`prepare_open`], for a session of the id given (a paused one coming back, a fork).
pub fn prepare_open_as(
    state: &SharedServices,
    key: &Key,
    asked: SessionRequest,
    id: String,
) -> Result<Opening, Error> {
    let cfg = &state.config.sessions;
    let request = SessionRequest {
        files: Vec::new(),
        ..asked.clone()
    };
    let idle = asked.idle_timeout_ms.unwrap_or(cfg.idle_timeout_ms);
    let lifetime = asked.max_lifetime_ms.unwrap_or(cfg.max_lifetime_ms);
    // A sandbox that lives less than a second may be gone before its interpreter is ready;
    // one idle for less may be gone before the request that follows its creation.
    for (field, v, least, most) in [
        ("idle_timeout_ms", idle, 1000, cfg.idle_timeout_ms),
        ("max_lifetime_ms", lifetime, 1000, cfg.max_lifetime_ms),
    ] {
        if v < least || v > most {
            return Err(Error::invalid(
                field,
                format!("{field} must be between {least} and {most}"),
            ));
        }
    }
    // The cells' default wall clock and output, checked against the key's ceilings.
    let per_cell = resolve_limits(state, key, &asked.limits)?;
    let mut job = job_from(
        state,
        key,
        ExecuteRequest {
            code: String::new(),
            language: Default::default(),
            stdin: String::new(),
            env: asked.env,
            files: asked.files,
            limits: asked.limits,
            entrypoint: None,
            inputs: None,
            egress: asked.egress,
            credentials: asked.credentials,
            environment: asked.environment,
            volumes: asked.volumes,
        },
        &format!("session {id}"),
        crate::execution::Lifetime::Request,
    )?;
    let egress = job.egress.clone();
    if let Some(leash) = &egress {
        // Connections made while no cell runs are the session's from the start.
        leash.for_session(&id);
    }
    let tools = tools::for_key(state, key);
    job.tools = tools
        .clone()
        .map(|t| t as Arc<dyn airlock_engine::ToolBridge>);
    // The sandbox itself lives as long as the session may.
    job.limits.timeout_ms = lifetime;
    job.filename = "session.py".into();
    job.stream = true;
    room_for_one(&state.sessions.lock(), key, cfg)?;
    Ok(Opening {
        id,
        request,
        job,
        per_cell,
        idle,
        lifetime,
        tools,
        egress,
    })
}

/// Starts a session owned by `key` (on a blocking thread), registers it if there is still
/// room, and writes its audit line.
pub async fn start(
    state: &SharedServices,
    key: &Key,
    opening: Opening,
) -> Result<SessionInfo, Error> {
    let st = state.clone();
    let fingerprint = key.fingerprint();
    let entry = tokio::task::spawn_blocking(move || launch(&st, &fingerprint, opening))
        .await
        .map_err(|e| Error::internal(format!("starting a session: {e}")))??;
    let info = entry.info();
    register(state, key, entry)?;
    Ok(info)
}

/// Starts an opening's sandbox (blocking): the session, not yet registered.
pub fn launch(
    state: &SharedServices,
    key_fingerprint: &str,
    opening: Opening,
) -> Result<Arc<OpenSession>, Error> {
    let Opening {
        id,
        request,
        job,
        per_cell,
        idle,
        lifetime,
        tools,
        egress,
    } = opening;
    let session = Session::start(&state.engine, job, &per_cell).map_err(|e| {
        tracing::error!(error = %e, "cannot start a session");
        Error::new(Kind::Unavailable, "unavailable", e.to_string())
    })?;
    let now = SystemTime::now();
    Ok(Arc::new(OpenSession {
        id,
        key_fingerprint: key_fingerprint.to_owned(),
        created_at: now,
        created: Instant::now(),
        expires_at: now + Duration::from_millis(lifetime),
        pauses_when_idle: state.config.sessions.pause_after_idle_ms.is_some(),
        request,
        idle_timeout: Duration::from_millis(idle),
        max_lifetime: Duration::from_millis(lifetime),
        last_used: Mutex::new(Instant::now()),
        cells: AtomicU64::new(0),
        ended: Mutex::new(None),
        busy: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        session,
        tools,
        egress,
    }))
}

/// Registers a started session if there is still room (else closes it), and writes its
/// audit line.
pub fn register(state: &Services, key: &Key, entry: Arc<OpenSession>) -> Result<(), Error> {
    let id = entry.id.clone();
    {
        let mut open = state.sessions.lock();
        // Checked again under the lock: two creations may have raced past the first check.
        if let Err(e) = room_for_one(&open, key, &state.config.sessions) {
            entry.session.close();
            return Err(e);
        }
        open.insert(entry.id.clone(), entry);
        state.sessions.started.fetch_add(1, Ordering::Relaxed);
    }
    audit_session(state, &id, &key.fingerprint(), None);
    Ok(())
}

/// Takes a session out of the open ones (it is paused, or closed), with its audit line;
/// its sandbox is closed and waited for.
pub fn unregister(state: &Services, entry: &OpenSession, why: &str) {
    if let Some(e) = state.sessions.lock().remove(&entry.id) {
        e.closed.store(true, Ordering::Release);
        audit_session(state, &e.id, &e.key_fingerprint, Some(why));
    }
    entry.session.close();
    if why != "paused" {
        // Closed for good: its checkpoint goes too.
        state.paused.forget(&entry.id);
    }
    entry.session.wait_ended(Duration::from_secs(10));
}

/// A session's opening or closing in the audit log (a later start tells the sessions it lost
/// from those closed). A line that cannot be written is kept until it can, and executions
/// are refused meanwhile.
pub fn audit_session(state: &Services, id: &str, key_fingerprint: &str, why: Option<&str>) {
    let _ = state.audit.append_session(id, key_fingerprint, why);
}

/// `key`'s sessions, open and paused, oldest first.
pub fn list(state: &Services, key: &Key) -> SessionList {
    let mut sessions: Vec<SessionInfo> = state
        .sessions
        .lock()
        .values()
        .filter(|e| e.key_fingerprint == key.fingerprint())
        .map(|e| e.info())
        .collect();
    let open: std::collections::HashSet<String> = sessions.iter().map(|s| s.id.clone()).collect();
    sessions.extend(
        state
            .paused
            .listed_of(&key.fingerprint())
            .into_iter()
            // An open session's checkpoint is not a paused session.
            .filter(|info| !open.contains(&info.id)),
    );
    sessions.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    SessionList { sessions }
}

/// What `key`'s session `id` is, open or paused.
pub fn info(state: &Services, key: &Key, id: &str) -> Result<SessionInfo, Error> {
    match find(state, key, id) {
        Ok(entry) => Ok(entry.info()),
        Err(e) => match state.paused.record(id, &key.fingerprint()) {
            Some(record) => Ok(record.info(Duration::from_millis(
                state.config.sessions.paused_retention_ms,
            ))),
            None => Err(e),
        },
    }
}

/// Closes `key`'s session `id` and waits for its sandbox to be gone (a running cell goes with
/// it).
pub async fn close(state: &SharedServices, key: &Key, id: &str) -> Result<(), Error> {
    let entry = match find(state, key, id) {
        Ok(entry) => entry,
        Err(e) if state.paused.holds(id, &key.fingerprint()) => {
            // A paused session: its snapshot and record go, for good.
            let (st, id, fingerprint) = (state.clone(), id.to_owned(), key.fingerprint());
            return tokio::task::spawn_blocking(move || {
                st.paused.delete_owned(&id, &fingerprint)?;
                audit_session(&st, &id, &fingerprint, Some("deleted"));
                Ok::<(), Error>(())
            })
            .await
            .map_err(|e| Error::internal(format!("deleting a paused session: {e}")))?
            .map_err(|_| e);
        }
        Err(e) => return Err(e),
    };
    if let Some(e) = state.sessions.lock().remove(&entry.id) {
        e.closed.store(true, Ordering::Release);
        audit_session(state, &e.id, &e.key_fingerprint, Some("closed"));
    }
    // Its sandbox first: a pause or checkpoint under way stops, or, finishing, finds the
    // session closed. Then its checkpoint (or what a pause in flight kept), if it has one,
    // goes for good, once whatever holds the session's files has let go.
    entry.session.close();
    let st = state.clone();
    let _ = tokio::task::spawn_blocking(move || {
        st.paused.forget(&entry.id);
        entry.session.wait_ended(Duration::from_secs(10))
    })
    .await;
    Ok(())
}

/// A cell checked, holding its session for itself until it is dropped ([`prepare_cell`]).
#[derive(Debug)]
pub struct PreparedCell {
    entry: Arc<OpenSession>,
    /// What came back, when this cell's request brought a paused session back.
    resumed: Mutex<Option<airlock_api::SnapshotInfo>>,
    _busy: InUse,
    code: String,
    entrypoint: Option<airlock_engine::Entrypoint>,
    limits: airlock_api::Limits,
}

/// Checks a cell of `key`'s session (its code's size, its entrypoint, its timeout within the
/// key's ceilings) and claims the session for it: another request gets 409 meanwhile.
pub fn prepare_cell(
    state: &SharedServices,
    key: &Key,
    entry: Arc<OpenSession>,
    asked: CellRequest,
) -> Result<PreparedCell, Error> {
    let cfg = state.engine.config();
    if asked.code.len() as u64 > cfg.max_code_bytes {
        return Err(Error::too_large(
            "code",
            format!("code is over the limit of {} bytes", cfg.max_code_bytes),
        ));
    }
    let entrypoint = entrypoint_from(asked.entrypoint, asked.inputs)?;
    let mut limits = entry.session.cell_limits();
    if let Some(t) = asked.timeout_ms {
        let ceiling = resolve_limits(
            state,
            key,
            &airlock_api::LimitsRequest {
                timeout_ms: Some(t),
                ..Default::default()
            },
        )?;
        limits.timeout_ms = ceiling.timeout_ms;
    }
    let busy = entry.take()?;
    Ok(PreparedCell {
        entry,
        resumed: Mutex::new(None),
        _busy: busy,
        code: asked.code,
        entrypoint,
        limits,
    })
}

impl PreparedCell {
    /// Says what came back, when the request brought its paused session back.
    pub fn resumed(self, resumed: Option<airlock_api::SnapshotInfo>) -> Self {
        *lock(&self.resumed) = resumed;
        self
    }

    pub fn take_resumed(&self) -> Option<airlock_api::SnapshotInfo> {
        lock(&self.resumed).take()
    }

    /// The cell's limits: the session's, with its own wall clock.
    pub fn limits(&self) -> &airlock_api::Limits {
        &self.limits
    }

    pub fn code(&self) -> &str {
        &self.code
    }

    /// Its session.
    pub fn session(&self) -> Arc<OpenSession> {
        self.entry.clone()
    }

    /// Code mode: the session's tools, with the key's grants as they are now, under the
    /// cell's execution id.
    pub fn begin(&self, key: &Key, execution_id: &str) {
        if let Some(tools) = &self.entry.tools {
            tools.begin(&key.grants, execution_id);
        }
    }

    /// Runs the cell in its session's interpreter, as execution `execution_id`; what it did,
    /// as an execution, and whether it ended the session.
    pub fn execute(
        &mut self,
        execution_id: &str,
        sink: &mut dyn airlock_engine::OutputSink,
    ) -> Result<(Execution, bool), Error> {
        let cell = Cell {
            execution_id: execution_id.to_owned(),
            code: std::mem::take(&mut self.code),
            entrypoint: self.entrypoint.take(),
            timeout: Duration::from_millis(self.limits.timeout_ms),
        };
        let entry = &self.entry;
        let ready = std::time::Instant::now();
        let CellResult { result, ended } = entry
            .session
            .execute(cell, sink)
            .map_err(|e| session_error(e, entry))?;
        // A cell's sandbox is its session's: only its run is timed.
        let timings = airlock_engine::Timings {
            ready: Some(ready),
            ran: Some(std::time::Instant::now()),
            ..Default::default()
        };
        if ended {
            *lock(&entry.ended) = Some(result.status);
        }
        entry.cells.fetch_add(1, Ordering::Relaxed);
        let execution = Execution {
            result,
            sandbox_ready: None,
            pooled: false,
            forked: false,
            setup_failed: false,
            timings,
        };
        Ok((execution, ended))
    }
}

/// Runs one file operation on the caller's session `id`, off the async workers, with the
/// session held busy meanwhile.
async fn file_op<T: Send + 'static>(
    state: &SharedServices,
    key: &Arc<Key>,
    id: &str,
    what: &'static str,
    op: impl FnOnce(&Session) -> Result<T, SessionError> + Send + 'static,
) -> Result<T, Error> {
    let entry = find(state, key, id)?;
    let busy = entry.take()?;
    let e2 = entry.clone();
    let done = tokio::task::spawn_blocking(move || op(&e2.session))
        .await
        .map_err(|e| Error::internal(format!("{what}: {e}")))?;
    drop(busy);
    done.map_err(|e| session_error(e, &entry))
}

/// Writes a request body, any content type, as `path` in `key`'s session `id`.
pub async fn put_file(
    state: &SharedServices,
    key: &Arc<Key>,
    id: &str,
    path: String,
    body: Body,
) -> Result<(), Error> {
    refuse_if_unavailable(state)?;
    find(state, key, id)?; // 404 before the body is read
    airlock_engine::check_relative_path(&path).map_err(|m| Error::invalid("path", m))?;
    let body = read_body_as(state, key, body, false).await?;
    file_op(state, key, id, "writing a file", move |s| {
        s.put_file(&path, &body.bytes)
    })
    .await
}

/// The contents of `path` in `key`'s session `id`, up to `http.max_body_bytes`.
pub async fn read_file(
    state: &SharedServices,
    key: &Arc<Key>,
    id: &str,
    path: String,
) -> Result<Vec<u8>, Error> {
    refuse_if_unavailable(state)?;
    airlock_engine::check_relative_path(&path).map_err(|m| Error::invalid("path", m))?;
    let max = state.config.http.max_body_bytes;
    file_op(state, key, id, "reading a file", move |s| {
        s.get_file(&path, max)
    })
    .await
}

/// Everything below the working directory of `key`'s session `id`.
pub async fn files(state: &SharedServices, key: &Arc<Key>, id: &str) -> Result<FileList, Error> {
    refuse_if_unavailable(state)?;
    let entries = file_op(state, key, id, "listing files", |s| s.list_files()).await?;
    let files = entries
        .into_iter()
        .map(|e| FileEntry {
            path: e.path,
            kind: e.kind,
            size: e.size,
        })
        .collect();
    Ok(FileList { files })
}
