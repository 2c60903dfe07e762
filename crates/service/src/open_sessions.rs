//! The registry of open sessions ([`Sessions`]): each [`OpenSession`], what the reaper
//! closes ([`Sessions::reap`]) and the claim a request holds on one ([`InUse`]). What a
//! request does to a session is the session service's (`sessions.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use airlock_api::{SessionInfo, SessionRequest, Status};
use airlock_engine::Session;

use crate::error::{Error, Kind};

/// Every open session.
#[derive(Default)]
pub struct Sessions {
    pub(crate) open: Mutex<HashMap<String, Arc<OpenSession>>>,
    pub(crate) started: AtomicU64,
}

#[derive(Debug)]
pub struct OpenSession {
    pub(crate) id: String,
    pub(crate) key_fingerprint: String,
    pub(crate) created_at: SystemTime,
    pub(crate) created: Instant,
    /// When its sandbox's lifetime ends (from its start, or its latest resume).
    pub(crate) expires_at: SystemTime,
    /// Paused, not closed, when idle (`sessions.pause_after_idle_ms`).
    pub(crate) pauses_when_idle: bool,
    /// What it was opened with (its files aside: they are in its scratch file system), for
    /// the sandbox a resume or a fork makes.
    pub(crate) request: SessionRequest,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_lifetime: Duration,
    pub(crate) last_used: Mutex<Instant>,
    pub(crate) cells: AtomicU64,
    pub(crate) ended: Mutex<Option<Status>>,
    /// One request at a time: another gets 409.
    pub(crate) busy: AtomicBool,
    /// Removed from the open sessions (deleted or reaped): no request may start on it.
    pub(crate) closed: AtomicBool,
    pub(crate) session: Session,
    /// Code mode: the session's tool set, given the key's grants again at each cell.
    pub(crate) tools: Option<Arc<airlock_tools::ToolSet>>,
    /// The session's egress leash: each cell has budgets of its own, and the time between
    /// cells the session's.
    pub(crate) egress: Option<Arc<airlock_egress::Leash>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("open", &self.count())
            .finish()
    }
}

impl Sessions {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OpenSession>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// Every open session.
    pub fn all(&self) -> Vec<Arc<OpenSession>> {
        self.lock().values().cloned().collect()
    }

    /// Open sessions and sessions started so far, in Prometheus text.
    pub fn render_metrics(&self) -> String {
        format!(
            "# HELP airlock_sessions_open Sessions open now (ended ones until they are closed).\n\
             # TYPE airlock_sessions_open gauge\nairlock_sessions_open {}\n\
             # HELP airlock_sessions_started_total Sessions started.\n\
             # TYPE airlock_sessions_started_total counter\nairlock_sessions_started_total {}\n",
            self.count(),
            self.started.load(Ordering::Relaxed)
        )
    }

    /// Closes every session and waits for their sandboxes to be gone (shutdown).
    pub fn close_all(&self) {
        let all: Vec<Arc<OpenSession>> = self.lock().drain().map(|(_, e)| e).collect();
        for entry in &all {
            entry.session.close();
        }
        for entry in &all {
            entry.session.wait_ended(Duration::from_secs(10));
        }
    }

    /// Closes the sessions idle or alive for too long; returns them. The volumes of sessions
    /// whose sandbox has ended are let go.
    pub fn reap(&self) -> Vec<Reaped> {
        for entry in self.all() {
            entry.session.release_if_ended();
        }
        let now = Instant::now();
        let expired: Vec<Arc<OpenSession>> = {
            let mut open = self.lock();
            let ids: Vec<String> = open
                .values()
                .filter(|e| {
                    let idle = now.duration_since(*lock(&e.last_used));
                    let due = (idle >= e.idle_timeout && !e.pauses_when_idle)
                        || now.duration_since(e.created) >= e.max_lifetime;
                    // Claimed as busy for good, so that no request starts on it meanwhile;
                    // a session in use now is reaped when it is done (or killed at its
                    // lifetime by its own sandbox's clock).
                    due && e
                        .busy
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
                .map(|e| e.id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| open.remove(id))
                .inspect(|e| e.closed.store(true, Ordering::Release))
                .collect()
        };
        for e in &expired {
            e.session.close();
        }
        for e in &expired {
            e.session.wait_ended(Duration::from_secs(10));
        }
        expired
            .iter()
            .map(|e| Reaped {
                id: e.id.clone(),
                key_fingerprint: e.key_fingerprint.clone(),
                why: if now.duration_since(e.created) >= e.max_lifetime {
                    "expired"
                } else {
                    "idle"
                },
            })
            .collect()
    }
}

/// A session the reaper closed, and why (`idle` or `expired`).
#[derive(Debug)]
pub struct Reaped {
    pub id: String,
    pub key_fingerprint: String,
    pub why: &'static str,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl OpenSession {
    /// Destroys the session's sandbox now: a cell cut short leaves its state unknown.
    pub fn destroy(&self) {
        self.session.close();
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn request(&self) -> &SessionRequest {
        &self.request
    }

    /// Whether it has been unused for `idle` and can be claimed (not ended, not busy).
    pub fn idle_for(&self, idle: Duration) -> bool {
        lock(&self.ended).is_none()
            && !self.busy.load(Ordering::Acquire)
            && lock(&self.last_used).elapsed() >= idle
    }

    /// Counts as used now (a pause that failed is not tried again at once).
    pub fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    /// Removed from the open sessions (closed, reaped, paused).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Ended by a cell (`sys.exit()`, a limit, a crash) or by its sandbox's end.
    pub fn has_ended(&self) -> bool {
        lock(&self.ended).is_some()
    }

    pub fn owner(&self) -> &str {
        &self.key_fingerprint
    }

    pub fn cells(&self) -> u64 {
        self.cells.load(Ordering::Relaxed)
    }

    pub fn created_at(&self) -> SystemTime {
        self.created_at
    }

    pub fn engine_session(&self) -> &Session {
        &self.session
    }

    /// Claims the session for one request (409 while another runs).
    pub fn claim(self: &Arc<Self>) -> Result<impl Drop, Error> {
        self.take()
    }

    pub fn info(&self) -> SessionInfo {
        let rfc = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        SessionInfo {
            id: self.id.clone(),
            created_at: rfc(self.created_at),
            expires_at: rfc(self.expires_at),
            idle_timeout_ms: self.idle_timeout.as_millis() as u64,
            max_lifetime_ms: self.max_lifetime.as_millis() as u64,
            cells: self.cells.load(Ordering::Relaxed),
            ended: *lock(&self.ended),
            limits: self.session.cell_limits(),
            egress_between_cells: self.egress.as_ref().and_then(|l| l.between_cells()),
            paused: None,
            resumed: None,
        }
    }

    /// Marks the session busy for one request, or says it is.
    pub(crate) fn take(self: &Arc<Self>) -> Result<InUse, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(Kind::NotFound, "not_found", "no such session"));
        }
        if let Some(status) = *lock(&self.ended) {
            return Err(Error::new(
                Kind::Conflict,
                "session_ended",
                format!("the session has ended ({status}); close it and start another"),
            ));
        }
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(Error::new(
                Kind::Conflict,
                "session_busy",
                "the session is running another request",
            ));
        }
        let busy = InUse(self.clone());
        // Closed between the check and the claim: give it back.
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(Kind::NotFound, "not_found", "no such session"));
        }
        *lock(&self.last_used) = Instant::now();
        Ok(busy)
    }
}

/// Held while a request uses the session.
#[derive(Debug)]
pub(crate) struct InUse(Arc<OpenSession>);

impl Drop for InUse {
    fn drop(&mut self) {
        *lock(&self.0.last_used) = Instant::now();
        self.0.busy.store(false, Ordering::Release);
    }
}

impl OpenSession {
    /// The same session, as it comes back from a snapshot: its creation time and count of
    /// cells as they were.
    pub fn resumed_as(self: Arc<Self>, created_at: SystemTime, cells: u64) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut entry) => {
                entry.created_at = created_at;
                entry.cells = AtomicU64::new(cells);
                Arc::new(entry)
            }
            Err(shared) => shared,
        }
    }
}
