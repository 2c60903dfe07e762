//! The audit log: JSON lines appended to `audit.jsonl` in the state directory (mode 0600).
//! Each execution has two: `{"event": "started", ...}` before its sandbox starts (an execution
//! whose line cannot be written does not run), then its record with the verdict. They hold
//! who, when, what code (its SHA-256, never the code), the limits and the verdict; never a
//! key, never the sandbox's environment or output.
//! The most recent records are also kept in memory for `GET /v1/executions/{id}`.
//!
//! Lines are synced (`fdatasync`) on a thread of their own as they are written, at most one
//! sync every 10 ms, whose lines share it: a quiet server's `started` line is on disk about a
//! millisecond after the execution starts, a busy one's within about 10 ms, so a power cut
//! loses at most that last moment, and the executions it stopped are found at the next start.
//! With `audit.sync = "answer"` an execution's answer also waits for its record to be on disk
//! (about 1 ms more per execution here), and syncs are not spaced: while the disk works, a
//! power cut then never loses the record of an answered execution. (While it does not,
//! answers still go out, their records kept in memory; and a failed `fdatasync` may have lost
//! lines written before it, which Linux reports only once.) A write that fails (the disk is
//! full or read-only) stops new executions; the lines it could not write (records, sessions,
//! tool calls) are kept in memory and written first, with an `audit_resumed` line, as soon as
//! a write works again: the server recovers by itself and the log loses nothing.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use airlock_api::ExecutionRecord;

use crate::audit_lines::{cut_torn_tail, interrupted, line_of, Recovery, StartedLine, RETRY_EVERY};
use crate::config::{AuditConfig, AuditSync};

/// Records served by id; older ones stay in the file.
const RECENT: usize = 10_000;
/// A record is well under 2 KiB; reading this much of the tail finds the recent ones.
const TAIL_BYTES: u64 = RECENT as u64 * 2048;

/// Lines kept while the log cannot be written; beyond this the oldest are counted as lost.
/// Executions are refused meanwhile, so only those already running add to them.
const MAX_PENDING: usize = 100_000;
#[derive(Debug)]
struct Inner {
    file: Arc<File>,
    recent: HashMap<String, ExecutionRecord>,
    order: VecDeque<String>,
    /// Lines a failed write left unwritten, oldest first.
    pending: VecDeque<Vec<u8>>,
    /// Lines dropped from `pending` because it was full.
    lost: u64,
    /// Why the last write failed, and when it was last tried; None once a write works.
    failure: Option<(String, Instant)>,
    /// Lines written so far (a line's number is what its sync waits for).
    written: u64,
}

/// Where records and audit lines go: the file (the default) or PostgreSQL (`[store] url`).
/// Both keep what they could not write and refuse executions meanwhile, and both give the
/// executions and sessions an earlier run left open their ends at start.
#[derive(Debug)]
pub enum AuditLog {
    File(Arc<FileLog>),
    Postgres(Box<crate::store::PgLog>),
}

impl AuditLog {
    /// Opens the store the configuration names; what opening it repaired and found.
    pub fn open(config: &crate::config::Config) -> std::io::Result<(Self, Recovery)> {
        match &config.store.url {
            None => FileLog::open(&config.audit_path(), &config.audit)
                .map(|(log, recovery)| (AuditLog::File(Arc::new(log)), recovery)),
            Some(_) => crate::store::PgLog::open(config)
                .map(|(log, recovery)| (AuditLog::Postgres(Box::new(log)), recovery)),
        }
    }

    /// Appends one execution's record, with its verdict; with `sync = "answer"`, returns once
    /// it is durable. If it cannot be written, it is kept (and served by id) until it can.
    pub fn append(&self, record: &ExecutionRecord) -> std::io::Result<()> {
        match self {
            AuditLog::File(log) => log.append(record),
            AuditLog::Postgres(log) => log.append(record),
        }
    }

    /// Appends the line written before an execution starts: if the store is failing, the
    /// execution does not run.
    pub fn append_started(&self, started: &StartedLine<'_>) -> std::io::Result<()> {
        match self {
            AuditLog::File(log) => log.append_started(started),
            AuditLog::Postgres(log) => log.append_started(started),
        }
    }

    /// Appends another event's line (a tool call, an egress connection), kept until it can
    /// be written.
    pub fn append_event(&self, event: &impl serde::Serialize) -> std::io::Result<()> {
        let line = line_of(event)?;
        match self {
            AuditLog::File(log) => log.append_line(line),
            AuditLog::Postgres(log) => log.append_line(line),
        }
    }

    /// Why the store cannot be written, or None; never waits for the disk or the database.
    pub fn failure(&self) -> Option<String> {
        match self {
            AuditLog::File(log) => log.failure(),
            AuditLog::Postgres(log) => log.failure(),
        }
    }

    /// While the store cannot be written, has it tried again (the file: at most once a
    /// second, on a blocking thread; PostgreSQL: its writer retries by itself). Why it cannot
    /// be written, as `failure`.
    pub fn retry_soon(&self) -> Option<String> {
        match self {
            AuditLog::File(log) => log.retry_soon(),
            AuditLog::Postgres(log) => log.failure(),
        }
    }

    /// SIGHUP: the file opened again by its path, so that a log rotated away (logrotate's
    /// `create`) is continued in a new file. What was written is synced first. PostgreSQL
    /// has no file to reopen.
    pub fn reopen(&self) -> std::io::Result<()> {
        match self {
            AuditLog::File(log) => log.reopen(),
            AuditLog::Postgres(_) => Ok(()),
        }
    }

    /// At shutdown: writes what was kept, if it can; why not, if it could not.
    pub fn write_kept(&self) -> Option<String> {
        match self {
            AuditLog::File(log) => log.write_kept(),
            AuditLog::Postgres(log) => log.write_kept(),
        }
    }

    /// Whether `id` is a session of the key with `fingerprint` that was lost when the server
    /// (this replica) stopped: opened before this start and never closed.
    pub fn session_lost(&self, id: &str, fingerprint: &str) -> bool {
        let lost = match self {
            AuditLog::File(log) => &log.lost_sessions,
            AuditLog::Postgres(log) => log.lost_sessions(),
        };
        lost.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .is_some_and(|f| f == fingerprint)
    }

    /// A session's opening (`why` None) or closing by its key or the reaper (`why`); those
    /// closed otherwise (the server stopped) are lost at the next start.
    pub fn append_session(
        &self,
        id: &str,
        key_fingerprint: &str,
        why: Option<&str>,
    ) -> std::io::Result<()> {
        let event = SessionEvent {
            event: Cow::Borrowed(if why.is_some() {
                "session_closed"
            } else {
                "session_opened"
            }),
            id: Cow::Borrowed(id),
            key_fingerprint: Cow::Borrowed(key_fingerprint),
            why: why.map(Cow::Borrowed),
        };
        self.append_event(&event)
    }

    /// An execution's record by id (the file: among the most recent; PostgreSQL: any, which
    /// may wait for the database, so not on an async thread; an error when it cannot be read).
    pub fn get(&self, id: &str) -> std::io::Result<Option<ExecutionRecord>> {
        match self {
            AuditLog::File(log) => Ok(log.get(id)),
            AuditLog::Postgres(log) => log.get(id),
        }
    }
}

/// The audit log file.
#[derive(Debug)]
pub struct FileLog {
    path: PathBuf,
    inner: Mutex<Inner>,
    syncer: Arc<Syncer>,
    /// Why the log cannot be written, as last known: read without waiting for disk work.
    status: Mutex<Option<String>>,
    /// Whether a retry is running (`retry_soon`).
    retrying: std::sync::atomic::AtomicBool,
    /// Whether an execution's answer waits for its record to be on disk.
    sync_before_answer: bool,
    /// Sessions opened before this start and never closed by their key or the reaper: they
    /// died with the server. Id to key fingerprint.
    lost_sessions: Mutex<HashMap<String, String>>,
}

impl FileLog {
    /// Opens (or creates) the log, repairs it and loads the most recent records. A last line
    /// cut short (the machine lost power mid-write) is cut off; every execution whose
    /// `started` line has no record after it (the server stopped before it ended) gets its
    /// final record now: `internal_error`, `interrupted`. [`Recovery`] says what was done.
    pub fn open(path: &Path, config: &AuditConfig) -> std::io::Result<(Self, Recovery)> {
        let sync = config.sync;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let path = path.to_path_buf();
        let (file, torn_bytes) = open_file(&path)?;
        let mut recovery = Recovery {
            torn_bytes,
            ..Recovery::default()
        };
        let mut inner = Inner {
            file: Arc::new(file),
            recent: HashMap::new(),
            order: VecDeque::new(),
            pending: VecDeque::new(),
            lost: 0,
            failure: None,
            written: 0,
        };
        let mut reader = File::open(&path)?;
        let len = reader.metadata()?.len();
        let start = len.saturating_sub(TAIL_BYTES);
        reader.seek(SeekFrom::Start(start))?;
        // What the file held when measured, and no more (a device such as /dev/full reads
        // without end).
        let mut lines = BufReader::new(reader.take(len - start)).lines();
        if start > 0 {
            lines.next(); // a partial line
        }
        // Executions started and not ended, in the order they started; sessions likewise.
        let mut open: Vec<StartedLine<'static>> = Vec::new();
        let mut sessions: HashMap<String, String> = HashMap::new();
        // Each line parsed once, then read as what its `event` says it is (none: a record).
        for line in lines.map_while(Result::ok) {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let event = value.get("event").and_then(serde_json::Value::as_str);
            match event {
                None => {
                    if let Ok(record) = serde_json::from_value::<ExecutionRecord>(value) {
                        open.retain(|s| s.id != record.id);
                        remember(&mut inner, record);
                    }
                }
                Some("started") => {
                    if let Ok(started) = serde_json::from_value::<StartedLine<'static>>(value) {
                        open.push(started);
                    }
                }
                Some("session_opened" | "session_closed") => {
                    if let Ok(e) = serde_json::from_value::<SessionEvent<'static>>(value) {
                        if e.event == "session_opened" {
                            sessions.insert(e.id.into_owned(), e.key_fingerprint.into_owned());
                        } else {
                            sessions.remove(&*e.id);
                        }
                    }
                }
                Some(_) => {}
            }
        }
        recovery.lost_sessions = sessions.len();
        for started in open {
            let record = interrupted(started);
            write_line(&inner.file, &line_of(&record)?)?;
            recovery.interrupted.push(record.id.clone());
            remember(&mut inner, record);
        }
        if !recovery.interrupted.is_empty() || recovery.torn_bytes > 0 {
            inner.file.sync_data()?;
        }
        // Answers that wait for their record are not made to wait for the interval too.
        let syncer = Syncer::start(inner.file.clone(), config.sync_interval())?;
        let log = FileLog {
            path,
            syncer,
            status: Mutex::new(None),
            retrying: std::sync::atomic::AtomicBool::new(false),
            sync_before_answer: sync == AuditSync::Answer,
            inner: Mutex::new(inner),
            lost_sessions: Mutex::new(sessions),
        };
        Ok((log, recovery))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one execution's record, with its verdict; with `sync = "answer"`, returns once
    /// it is on disk. If it cannot be written, it is kept (and served by id) until it can.
    pub fn append(&self, record: &ExecutionRecord) -> std::io::Result<()> {
        let line = line_of(record)?;
        let written = {
            let mut inner = self.lock();
            remember(&mut inner, record.clone());
            self.write(&mut inner, line, true)
        }?;
        self.syncer.request(written);
        if !self.sync_before_answer {
            return Ok(());
        }
        self.syncer
            .wait(written)
            .inspect_err(|e| self.sync_failed(e))
    }

    /// Appends the line written before an execution starts, and has it synced meanwhile: if
    /// it cannot be written, the execution does not run (and the line is not kept).
    pub fn append_started(&self, started: &StartedLine<'_>) -> std::io::Result<()> {
        let line = line_of(started)?;
        let written = self.write(&mut self.lock(), line, false)?;
        self.syncer.request(written);
        Ok(())
    }

    /// Appends another event's line; the next record's sync makes it durable. Kept until it
    /// can be written.
    fn append_line(&self, line: Vec<u8>) -> std::io::Result<()> {
        self.write(&mut self.lock(), line, true).map(|_| ())
    }

    /// Why the log cannot be written, or None; never waits for the disk.
    pub fn failure(&self) -> Option<String> {
        let status = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        status.or_else(|| self.syncer.failure())
    }

    /// While the log cannot be written, tries it again (at most once a second, one try at a
    /// time) on a blocking thread: the kept lines are written after an `audit_resumed` line,
    /// and synced. Why it cannot be written, as `failure`.
    pub fn retry_soon(self: &Arc<Self>) -> Option<String> {
        use std::sync::atomic::Ordering;
        let why = self.failure()?;
        if !self.retrying.swap(true, Ordering::AcqRel) {
            let log = self.clone();
            let retry = move || {
                log.retry(false);
                log.retrying.store(false, Ordering::Release);
            };
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(retry)),
                Err(_) => retry(),
            }
        }
        Some(why)
    }

    /// The first failure of a run of them: logged once, and executions refused from now.
    fn fail(&self, inner: &mut Inner, what: &str, e: &dyn std::fmt::Display) {
        if inner.failure.is_none() {
            tracing::error!(path = %self.path.display(), error = %e, "cannot {what} the audit log; refusing executions until it can");
            self.set_failure(inner, Some(e.to_string()));
        }
    }

    fn set_failure(&self, inner: &mut Inner, why: Option<String>) {
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = why.clone();
        inner.failure = why.map(|w| (w, Instant::now()));
    }

    /// At shutdown: tries once more to write the kept lines, and syncs what is written; why
    /// not, if it could not.
    pub fn write_kept(&self) -> Option<String> {
        if let Some(why) = self.retry(true) {
            return Some(why);
        }
        let file = self.lock().file.clone();
        file.sync_data().err().map(|e| e.to_string())
    }

    /// Syncs the file written so far, then opens the path again (a new file if the old one
    /// was moved away); later lines go there. While the log cannot be written this is left to
    /// the retries, which reopen it too.
    pub fn reopen(&self) -> std::io::Result<()> {
        let mut inner = self.lock();
        if inner.failure.is_some() {
            return Ok(());
        }
        inner.file.sync_data()?;
        let (file, torn) = open_file(&self.path)?;
        if torn > 0 {
            tracing::warn!(bytes = torn, "cut a torn last line off the audit log");
        }
        inner.file = Arc::new(file);
        self.syncer.resume(inner.file.clone(), inner.written);
        tracing::info!(path = %self.path.display(), "audit log reopened");
        Ok(())
    }

    fn retry(&self, now: bool) -> Option<String> {
        let mut inner = self.lock();
        if let Some(why) = self.syncer.failure() {
            // A `started` line's sync, which nobody waited for.
            self.fail(&mut inner, "sync", &why);
        }
        let (why, tried) = inner.failure.as_ref()?;
        if !now && tried.elapsed() < RETRY_EVERY {
            return Some(why.clone());
        }
        let resumed = Resumed {
            event: "audit_resumed",
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            failure: why,
            kept: inner.pending.len(),
            lost: inner.lost,
        };
        let resumed = match line_of(&resumed) {
            Ok(line) => line,
            Err(e) => return Some(e.to_string()),
        };
        inner.pending.push_front(resumed);
        let before = inner.written;
        // Opened again by its path: the file system may have been mounted anew meanwhile.
        let reopened = open_file(&self.path).map(|(file, torn)| {
            if torn > 0 {
                tracing::warn!(bytes = torn, "cut a torn last line off the audit log");
            }
            inner.file = Arc::new(file);
        });
        match reopened
            .and_then(|()| self.flush(&mut inner))
            .and_then(|()| inner.file.sync_data())
        {
            Ok(()) => {
                self.syncer.resume(inner.file.clone(), inner.written);
                tracing::warn!(
                    path = %self.path.display(),
                    "the audit log can be written again; executions resume"
                );
                self.set_failure(&mut inner, None);
                inner.lost = 0;
                None
            }
            Err(e) => {
                // The `audit_resumed` line goes if it was not written (the next try writes
                // its own); if it was, what follows it stays kept.
                if inner.written == before {
                    inner.pending.pop_front();
                }
                let why = e.to_string();
                self.set_failure(&mut inner, Some(why.clone()));
                Some(why)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the kept lines, then `line`, and returns its number; on failure `line` is kept
    /// if `keep`, and every later execution is refused until a write works.
    fn write(&self, inner: &mut Inner, line: Vec<u8>, keep: bool) -> std::io::Result<u64> {
        let result = if inner.failure.is_some() {
            // Written by `failure()`'s retry, with the line that says so.
            Err(std::io::Error::other(
                inner
                    .failure
                    .as_ref()
                    .map_or("", |f| f.0.as_str())
                    .to_owned(),
            ))
        } else {
            // Nothing is kept while writes work: `retry` empties `pending` before it clears
            // `failure`.
            write_line(&inner.file, &line).map(|()| {
                inner.written += 1;
                inner.written
            })
        };
        if let Err(e) = &result {
            if keep {
                if inner.pending.len() == MAX_PENDING {
                    inner.pending.pop_front();
                    inner.lost += 1;
                }
                inner.pending.push_back(line);
            }
            self.fail(inner, "append to", e);
        }
        result
    }

    fn flush(&self, inner: &mut Inner) -> std::io::Result<()> {
        while let Some(line) = inner.pending.front() {
            write_line(&inner.file, line)?;
            inner.written += 1;
            inner.pending.pop_front();
        }
        Ok(())
    }

    fn sync_failed(&self, e: &std::io::Error) {
        self.fail(&mut self.lock(), "sync", e);
    }

    fn get(&self, id: &str) -> Option<ExecutionRecord> {
        self.lock().recent.get(id).cloned()
    }
}

/// One JSON line in a single write, so lines never interleave; on failure the file is cut
/// back, so no torn line is left for the next one to be glued to.
fn write_line(mut file: &File, line: &[u8]) -> std::io::Result<()> {
    let before = file.metadata()?.len();
    if let Err(e) = file.write_all(line) {
        let _ = file.set_len(before);
        return Err(e);
    }
    Ok(())
}

/// The line that ends a time the log could not be written.
#[derive(serde::Serialize)]
struct Resumed<'a> {
    event: &'static str,
    at: String,
    /// Why writes failed.
    failure: &'a str,
    /// Lines kept meanwhile, written after this one.
    kept: usize,
    /// Lines dropped because too many were kept.
    lost: u64,
}

/// A session's `session_opened` and `session_closed` lines.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SessionEvent<'a> {
    event: Cow<'a, str>,
    id: Cow<'a, str>,
    key_fingerprint: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    why: Option<Cow<'a, str>>,
}

impl Drop for FileLog {
    fn drop(&mut self) {
        self.syncer.stop();
    }
}

/// `fdatasync` on a thread of its own: lines written while a sync runs, or within `interval`
/// of its start, share the next one.
#[derive(Debug)]
struct Syncer {
    interval: Duration,
    state: Mutex<SyncState>,
    /// The thread waits on it for lines to sync.
    work: Condvar,
    /// Writers wait on it for their line.
    done: Condvar,
}

#[derive(Debug)]
struct SyncState {
    file: Arc<File>,
    /// The last line asked to be synced, and the last one synced.
    wanted: u64,
    synced: u64,
    /// Why a sync failed; until the log is written again, nothing counts as synced.
    failed: Option<String>,
    stop: bool,
    /// The thread waits for a line to sync (not mid-sync, nor waiting out the interval).
    idle: bool,
    /// The least time between two syncs' starts so far.
    #[cfg(test)]
    closest: Option<Duration>,
}

impl Syncer {
    fn start(file: Arc<File>, interval: Duration) -> std::io::Result<Arc<Syncer>> {
        let syncer = Arc::new(Syncer {
            interval,
            state: Mutex::new(SyncState {
                file,
                wanted: 0,
                synced: 0,
                failed: None,
                stop: false,
                idle: false,
                #[cfg(test)]
                closest: None,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let s = syncer.clone();
        std::thread::Builder::new()
            .name("airlock-audit-sync".into())
            .spawn(move || s.run())?;
        Ok(syncer)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self) {
        let mut state = self.lock();
        let mut last: Option<Instant> = None;
        loop {
            while !state.stop && (state.wanted <= state.synced || state.failed.is_some()) {
                state.idle = true;
                state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
                state.idle = false;
            }
            if state.stop {
                return;
            }
            // Within the interval of the last sync: the lines that come meanwhile share this one.
            if let Some(due) = last.map(|t| t + self.interval) {
                while !state.stop && Instant::now() < due {
                    let left = due.saturating_duration_since(Instant::now());
                    state = self
                        .work
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                if state.stop {
                    return;
                }
            }
            let (file, target) = (state.file.clone(), state.wanted);
            let now = Instant::now();
            #[cfg(test)]
            if let Some(gap) = last.map(|t| now - t) {
                state.closest = Some(state.closest.map_or(gap, |c| c.min(gap)));
            }
            drop(state);
            last = Some(now);
            let synced = file.sync_data();
            state = self.lock();
            match synced {
                Ok(()) => state.synced = state.synced.max(target),
                Err(e) => state.failed = Some(e.to_string()),
            }
            self.done.notify_all();
        }
    }

    fn request(&self, line: u64) {
        let mut state = self.lock();
        state.wanted = state.wanted.max(line);
        // Busy or waiting out the interval, the thread looks at `wanted` next by itself.
        if state.idle {
            self.work.notify_one();
        }
    }

    /// Waits until `line` is on disk.
    fn wait(&self, line: u64) -> std::io::Result<()> {
        let mut state = self.lock();
        loop {
            if state.synced >= line {
                return Ok(());
            }
            if let Some(why) = &state.failed {
                return Err(std::io::Error::other(why.clone()));
            }
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// The log was written and synced again, up to `line`, maybe in a file opened anew.
    fn resume(&self, file: Arc<File>, line: u64) {
        let mut state = self.lock();
        state.file = file;
        state.failed = None;
        state.synced = state.synced.max(line);
        state.wanted = state.wanted.max(line);
        self.done.notify_all();
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.work.notify_one();
    }
}

/// Opens (or creates, mode 0600) the log for appending, with a torn last line cut off.
fn open_file(path: &Path) -> std::io::Result<(File, u64)> {
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    let torn = cut_torn_tail(&mut file)?;
    Ok((file, torn))
}

fn remember(inner: &mut Inner, record: ExecutionRecord) {
    inner.order.push_back(record.id.clone());
    inner.recent.insert(record.id.clone(), record);
    while inner.order.len() > RECENT {
        if let Some(old) = inner.order.pop_front() {
            inner.recent.remove(&old);
        }
    }
}

/// Reads every record of a log file (for tests and tools).
pub fn read_all(path: &Path) -> std::io::Result<Vec<ExecutionRecord>> {
    let mut text = String::new();
    File::open(path)?.read_to_string(&mut text)?;
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit_lines::INTERRUPTED;
    use crate::config::AUDIT_FILE;
    use airlock_api::{Limits, Status, Usage};
    use std::time::Duration;

    fn audit(sync: AuditSync, sync_every_ms: u64) -> AuditConfig {
        AuditConfig {
            sync,
            sync_every_ms,
            path: None,
        }
    }

    fn record(id: &str) -> ExecutionRecord {
        ExecutionRecord {
            id: id.into(),
            request_id: "rq_1".into(),
            key: "alice".into(),
            key_fingerprint: "0123456789abcdef".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            code_sha256: "0".repeat(64),
            code_bytes: 1,
            status: Status::Ok,
            exit_code: Some(0),
            signal: None,
            limits: Limits {
                timeout_ms: 1,
                memory_mb: 1,
                cpu_ms: 1,
                pids: 1,
                disk_mb: 1,
                output_bytes: 1,
            },
            limits_hit: vec![],
            usage: Usage::default(),
            interrupted: false,
            error: None,
        }
    }

    #[test]
    fn lines_are_synced_in_the_background_and_an_answer_waits_for_its_record_when_asked() {
        let dir = fresh_dir("sync");
        let (log, _) = FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Answer, 10)).unwrap();
        // Concurrent writers: each record is on disk when its append returns.
        std::thread::scope(|s| {
            for t in 0..4 {
                let log = &log;
                s.spawn(move || {
                    for i in 0..25 {
                        let before = log.lock().written;
                        log.append(&record(&format!("ex_{t}_{i}"))).unwrap();
                        // Its line came after `before`, and is synced.
                        assert!(log.syncer.lock().synced > before);
                    }
                });
            }
        });
        let (written, synced) = (log.lock().written, log.syncer.lock().synced);
        assert_eq!((written, synced), (100, 100));
        drop(log);
        // In the background: nothing waits, and the syncer catches up by itself.
        let (log, _) =
            FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Background, 10)).unwrap();
        log.append(&record("ex_bg")).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while log.syncer.lock().synced < 1 {
            assert!(Instant::now() < until, "never synced");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(read_all(log.path()).unwrap().len(), 101);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn in_the_background_lines_written_close_together_share_a_sync() {
        // The default interval, and one set longer: each is what two syncs are apart at least.
        for every_ms in [crate::config::DEFAULT_SYNC_EVERY_MS, 30] {
            let dir = fresh_dir("interval");
            let config = audit(AuditSync::Background, every_ms);
            let (log, _) = FileLog::open(&dir.join(AUDIT_FILE), &config).unwrap();
            let start = Instant::now();
            for i in 0..40 {
                log.append(&record(&format!("ex_{i}"))).unwrap();
                std::thread::sleep(Duration::from_millis(3));
            }
            let until = Instant::now() + Duration::from_secs(5);
            while log.syncer.lock().synced < 40 {
                assert!(Instant::now() < until, "never synced");
                std::thread::sleep(Duration::from_millis(1));
            }
            // Forty lines 3 ms apart, each of which would have had a sync of its own (one
            // takes well under 3 ms here): two syncs never started closer than the interval.
            let closest = log.syncer.lock().closest;
            assert!(
                closest.is_some_and(|c| c >= Duration::from_millis(every_ms)),
                "syncs {closest:?} apart with sync_every_ms = {every_ms}, over {:?}",
                start.elapsed()
            );
            assert_eq!(read_all(log.path()).unwrap().len(), 40);
            drop(log);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn records_survive_a_restart_and_the_file_is_private() {
        let dir = std::env::temp_dir().join(format!("airlock-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (log, _) = FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Answer, 10)).unwrap();
        log.append(&record("ex_a")).unwrap();
        log.append(&record("ex_b")).unwrap();
        drop(log);
        let (log, recovery) =
            FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Answer, 10)).unwrap();
        assert_eq!(recovery, Recovery::default());
        assert_eq!(log.get("ex_a").unwrap().key, "alice");
        assert!(log.get("ex_c").is_none());
        assert_eq!(read_all(log.path()).unwrap().len(), 2);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(log.path()).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn started_line(id: &str) -> String {
        let limits = record(id).limits;
        let started = StartedLine {
            event: "started".into(),
            id: id.into(),
            request_id: "rq_1".into(),
            key: "alice".into(),
            key_fingerprint: "0123456789abcdef".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            code_sha256: "0".repeat(64).into(),
            code_bytes: 1,
            limits: Cow::Owned(limits),
        };
        serde_json::to_string(&started).unwrap() + "\n"
    }

    fn fresh_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("airlock-audit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn executions_started_and_never_ended_get_an_interrupted_record_once() {
        let dir = fresh_dir("interrupted");
        let ended = serde_json::to_string(&record("ex_ended")).unwrap() + "\n";
        let tool = "{\"event\":\"tool_call\",\"execution\":\"ex_open\"}\n";
        let text = started_line("ex_ended")
            + &started_line("ex_open")
            + tool
            + &ended
            + &started_line("ex_second");
        std::fs::write(dir.join(AUDIT_FILE), text).unwrap();

        let (log, recovery) =
            FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Answer, 10)).unwrap();
        assert_eq!(recovery.interrupted, ["ex_open", "ex_second"]);
        assert_eq!(recovery.torn_bytes, 0);
        let open = log.get("ex_open").unwrap();
        assert!(open.interrupted);
        assert_eq!(open.status, airlock_api::Status::InternalError);
        assert_eq!(open.error.as_ref().unwrap().message, INTERRUPTED);
        assert_eq!((open.key.as_str(), open.code_bytes), ("alice", 1));
        assert!(!log.get("ex_ended").unwrap().interrupted);
        drop(log);

        // The records are in the file: the next start has nothing to add.
        let (log, recovery) =
            FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Answer, 10)).unwrap();
        assert_eq!(recovery, Recovery::default());
        assert!(log.get("ex_second").unwrap().interrupted);
        let records = read_all_records(log.path());
        assert_eq!(records.iter().filter(|r| r.id == "ex_open").count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_last_line_cut_short_is_cut_off() {
        let dir = fresh_dir("torn");
        let whole = serde_json::to_string(&record("ex_a")).unwrap() + "\n";
        let torn = &serde_json::to_string(&record("ex_b")).unwrap()[..40];
        std::fs::write(dir.join(AUDIT_FILE), format!("{whole}{torn}")).unwrap();
        let (log, recovery) =
            FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Answer, 10)).unwrap();
        assert_eq!(recovery.torn_bytes, 40);
        assert_eq!(std::fs::read_to_string(log.path()).unwrap(), whole);
        // The next line starts on a line of its own.
        log.append(&record("ex_c")).unwrap();
        assert_eq!(read_all(log.path()).unwrap().len(), 2);
        drop(log);

        // A file that is one torn line, and an empty one.
        std::fs::write(dir.join(AUDIT_FILE), "{\"id\":").unwrap();
        let (log, recovery) =
            FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Answer, 10)).unwrap();
        assert_eq!(recovery.torn_bytes, 6);
        assert_eq!(std::fs::metadata(log.path()).unwrap().len(), 0);
        drop(log);
        let (_, recovery) =
            FileLog::open(&dir.join(AUDIT_FILE), &audit(AuditSync::Answer, 10)).unwrap();
        assert_eq!(recovery, Recovery::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The records of a log that also holds other lines.
    fn read_all_records(path: &Path) -> Vec<ExecutionRecord> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}
