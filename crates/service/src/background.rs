//! Background executions (`POST /v1/executions`): answered at once with an id, then run to
//! their end whether or not anyone listens. The order of their steps is the pipeline's
//! (`pipeline::submit`); this module keeps what outlives the request, one directory each under
//! `<state>/background/<id>/`:
//! - `meta.json`: its state (`queued`, `running`, then `finished`, `failed`, `cancelled` or
//!   `interrupted`) and times, replaced whole (written aside, synced, renamed) at each change;
//! - `events`: its events as server-sent events, appended as they happen, each with an `id:`
//!   that is the byte offset just past it, so a client resumes after any event it got
//!   (`Last-Event-ID`) and is sent every byte of output exactly once. Its size follows from
//!   the output limits (each stream's output once, JSON-escaped, in events of at least a
//!   byte);
//! - `result.json`: the result with its output, once it ran; read back from the disk, never
//!   held in memory;
//! - `job`: while it waits for its turn, what is large in its job (code, files, stdin...), so
//!   that what waits, for hours maybe, holds no memory (`parked.rs`); read back, and removed,
//!   when its turn comes.
//!
//! What is queued or running is also in memory ([`Live`]): its cancel handle and a watch of
//! how far its events log is written, which followers wait on. Turns go by key
//! ([`Turns`]): the waiting key that started least recently goes next. A restart finds those in
//! `meta.json` still queued or running and marks them `interrupted` (the audit log's own
//! repair marks their `started` line); ended ones stay readable until their retention
//! (`[background] retention_ms`) has passed.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use airlock_api::{ApiError, ExecuteResponse, Limits};
use airlock_engine::durable::{write_aside, Place};
use airlock_engine::storage::{Account, Refused, Storage};
use airlock_engine::{Cancel, Job, OutputSink, Stream};
use serde::{Deserialize, Serialize};

use crate::admission::Turns;
use crate::config::BackgroundConfig;
use crate::error::{Error, Kind};
use crate::keys::Key;
use crate::parked;
use crate::stream::{self, Whole};

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
}

/// How many of one key's background executions wait, run, and are kept ended.
#[derive(Default, Clone, Copy, Debug)]
struct Counts {
    queued: usize,
    running: usize,
    kept: usize,
}

#[derive(Default)]
struct Inner {
    live: HashMap<String, Arc<Live>>,
    keys: HashMap<String, Counts>,
    /// Ended ones: owner, when they ended (for their retention), and whether they were
    /// deleted (what is left only says so).
    ended: HashMap<String, (String, u64, bool)>,
    /// Ended ones whose `meta.json` could not be replaced (a full disk): what they are, until
    /// it can be ([`Background::expire`] tries again).
    unsaved: HashMap<String, Meta>,
    /// Those waiting for their turn, in the order they were submitted: their key and how
    /// many of its executions may run at once.
    waiting: std::collections::BTreeMap<u64, (String, usize)>,
    next_ticket: u64,
    running: usize,
    /// Whose turn is next, by key fingerprint.
    turns: Turns,
}

/// Bytes an execution's directory stores: its events, its result, its job while it waits.
fn stored_size(dir: &Path) -> u64 {
    ["events", "result.json", "job"]
        .iter()
        .filter_map(|f| std::fs::symlink_metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// Every background execution of this server.
pub struct Background {
    /// `<state>/background`; `None` when it could not be made (submissions are refused).
    dir: Option<PathBuf>,
    config: BackgroundConfig,
    /// Where each key's bytes count (`background.max_bytes_per_key`).
    storage: Arc<Storage>,
    inner: Mutex<Inner>,
    /// A turn given back, or one cancelled while it waits: waiters look again.
    turns: tokio::sync::Notify,
    /// Deletions, one at a time.
    tombs: Mutex<()>,
}

impl std::fmt::Debug for Background {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Background")
            .field("dir", &self.dir)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now() -> (String, u64) {
    let at = SystemTime::now();
    let ms = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (humantime::format_rfc3339_millis(at).to_string(), ms)
}

/// Ids are made by `keys::held_id`; anything else names nothing (and no path).
fn well_formed(id: &str) -> bool {
    id.len() <= 100
        && id.starts_with("ex_")
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn write_meta(dir: &Path, meta: &Meta) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
    write_aside(&dir.join("meta.json"), &bytes, Place::Replace)
}

/// A file only airlock reads, made anew.
fn private_file(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

fn read_meta(dir: &Path) -> Option<Meta> {
    let bytes = std::fs::read(dir.join("meta.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// One server-sent event as the log holds it, `at` bytes into the log: its `id:` is the
/// offset just past it.
fn record(at: u64, name: &str, data: &str) -> Vec<u8> {
    let body = format!("event: {name}\ndata: {data}\n\n");
    let mut digits = 1;
    let end = loop {
        let end = at + 5 + digits + body.len() as u64;
        if end.to_string().len() as u64 == digits {
            break end;
        }
        digits += 1;
    };
    let mut out = format!("id: {end}\n").into_bytes();
    out.extend_from_slice(body.as_bytes());
    debug_assert_eq!(at + out.len() as u64, end);
    out
}

/// The events log being written.
struct Log {
    file: Option<File>,
    len: u64,
}

/// A background execution that is queued or running.
pub struct Live {
    pub id: String,
    fingerprint: String,
    /// Its place in the order of submissions: its key's turns go by it.
    ticket: u64,
    dir: PathBuf,
    pub cancel: Cancel,
    /// Deleted (so cancelled) while queued or running: removed once it ends.
    deleted: AtomicBool,
    meta: Mutex<Meta>,
    log: Mutex<Log>,
    /// Why the events log could not be written, if it could not.
    log_failed: Mutex<Option<Error>>,
    /// Where its bytes count, with its key's other background executions' (their events,
    /// results and waiting jobs, within `background.max_bytes_per_key`).
    storage: Arc<Storage>,
    /// Bytes of its job counted while it waits on the disk (`job`); 0 once it is read back
    /// or gone.
    parked: AtomicU64,
    /// Output held back for the log: its stream and text.
    held: Mutex<(Option<Stream>, String)>,
    /// Bytes of the events log written whole, and whether the last event is among them.
    written: tokio::sync::watch::Sender<(u64, bool)>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("id", &self.id).finish()
    }
}

impl Live {
    /// Appends one event to the log, after the output held back before it.
    pub fn event(&self, name: &str, data: &serde_json::Value) {
        self.flush_output();
        self.append(name, data);
    }

    /// Output text for the log: held back and joined with what follows it on the same stream
    /// until [`COALESCE_BYTES`] are held, the other stream writes, or the next
    /// [`Live::flush_output`] (every [`FLUSH_EVERY`] while it runs). A program that flushes a
    /// byte at a time makes a few events a second, not one per byte: the log stays within a
    /// few times the output limits. No event holds more than [`COALESCE_BYTES`] of text: a
    /// longer write is cut between characters.
    fn output(&self, s: Stream, text: &str) {
        let mut held = lock(&self.held);
        if held.0 != Some(s) && !held.1.is_empty() {
            let (stream, text) = (held.0, std::mem::take(&mut held.1));
            self.append_text(stream, &text);
        }
        held.0 = Some(s);
        held.1.push_str(text);
        let mut at = 0;
        while held.1.len() - at >= COALESCE_BYTES {
            let end = char_floor(&held.1, at + COALESCE_BYTES);
            self.append_text(Some(s), &held.1[at..end]);
            at = end;
        }
        held.1.drain(..at);
    }

    /// Writes the output held back, if any.
    pub fn flush_output(&self) {
        let mut held = lock(&self.held);
        if !held.1.is_empty() {
            let (stream, text) = (held.0, std::mem::take(&mut held.1));
            self.append_text(stream, &text);
        }
    }

    fn append_text(&self, s: Option<Stream>, text: &str) {
        if let Some(s) = s {
            self.append(stream::name(s), &serde_json::json!({ "text": text }));
        }
    }

    /// Stops it for `why`, the first reason given.
    fn stop(&self, why: Error) {
        let mut failed = lock(&self.log_failed);
        if failed.is_none() {
            *failed = Some(why);
            self.cancel.cancel();
        }
    }

    /// Whether its last event is written.
    pub fn has_ended(&self) -> bool {
        self.written.borrow().1
    }

    /// Appends one event to the log. A log that cannot be written stops the execution: its
    /// client would otherwise miss output without knowing.
    fn append(&self, name: &str, data: &serde_json::Value) {
        let mut log = lock(&self.log);
        let whole = log.len;
        let bytes = record(whole, name, &data.to_string());
        let Some(file) = log.file.as_mut() else {
            return;
        };
        match file.write_all(&bytes) {
            Ok(()) => {
                log.len += bytes.len() as u64;
                let len = log.len;
                drop(log);
                self.written.send_modify(|w| w.0 = len);
                let n = bytes.len() as u64;
                if let Err(past) = self.count(n) {
                    self.stop(Error::new(
                        Kind::TooLarge,
                        "storage_full",
                        format!(
                            "its key's background executions store more than \
                             background.max_bytes_per_key ({} bytes): it was stopped",
                            past.quota
                        ),
                    ));
                }
            }
            Err(e) => {
                // What part of the event went in is taken back (if the disk lets us), so
                // that the log holds whole events only.
                let _ = file.set_len(whole);
                log.file = None;
                drop(log);
                tracing::error!(execution = %self.id, error = %e, "a background execution's events cannot be written; it is stopped");
                self.stop(Error::internal(format!(
                    "its events could not be written: {e}"
                )));
            }
        }
    }

    /// What its output goes to while it runs.
    pub fn sink(&self) -> Sink<'_> {
        Sink {
            live: self,
            whole: Whole::default(),
        }
    }

    /// Its sandbox is starting.
    pub fn running(&self, started_at: &str) {
        let mut meta = lock(&self.meta);
        meta.state = State::Running;
        meta.started_at = Some(started_at.to_owned());
        if let Err(e) = write_meta(&self.dir, &meta) {
            tracing::warn!(execution = %self.id, error = %e, "cannot write a background execution's state");
        }
    }

    /// Whether it was cancelled: only a delete cancels one.
    pub fn is_cancelled(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    pub fn meta(&self) -> Meta {
        lock(&self.meta).clone()
    }

    /// Stores what is large in `job` in its directory while it waits, out of memory (its
    /// bytes were counted at submission). On the disk: a blocking call.
    pub fn park(&self, mut job: Job) -> Result<Job, Error> {
        let written = parked::park(&mut job, &self.dir.join("job")).map_err(|e| {
            tracing::warn!(error = %e, "cannot store a background execution's job");
            Error::new(
                Kind::Unavailable,
                "unavailable",
                format!("the background execution cannot be stored: {e}"),
            )
        })?;
        // Counted ahead by its size (`parked::size`), which it is.
        let counted = self.parked.swap(written, Ordering::AcqRel);
        debug_assert_eq!(written, counted, "a parked job's size, known ahead");
        if written > counted {
            let _ = self.count(written - counted);
        } else if written < counted {
            self.uncount(counted - written);
        }
        Ok(job)
    }

    /// Counts `n` more bytes of its key's background executions' (written already); refused
    /// when that passes their quota.
    fn count(&self, n: u64) -> Result<(), Refused> {
        self.storage
            .count(&self.fingerprint, Account::Background, &self.id, n)
    }

    fn uncount(&self, n: u64) {
        self.storage
            .uncount(&self.fingerprint, Account::Background, &self.id, n);
    }

    /// Its turn came: `job` whole again, its stdin read from the disk as the program takes it,
    /// and no longer counted among what its key stores. On the disk: a blocking call.
    pub fn unpark(&self, mut job: Job) -> Result<Job, Error> {
        let path = self.dir.join("job");
        let read = parked::unpark(&mut job, &path);
        self.unstore_parked();
        read.map(|()| job).map_err(|e| {
            tracing::error!(execution = %self.id, error = %e, "cannot read a background execution's job back");
            Error::internal(format!("its job could not be read back: {e}"))
        })
    }

    /// Removes its job from the disk (a stdin opened from it is read on), and from its key's
    /// count.
    fn unstore_parked(&self) {
        let n = self.parked.swap(0, Ordering::AcqRel);
        if n > 0 {
            let _ = std::fs::remove_file(self.dir.join("job"));
            self.uncount(n);
        }
    }
}

/// Output into the events log, as `stdout`/`stderr`/`truncated` events (those of a stream).
#[derive(Debug)]
pub struct Sink<'a> {
    live: &'a Live,
    whole: Whole,
}

impl Sink<'_> {
    /// What is still held: a character split at the very end, the output held back.
    pub fn flush(&mut self) {
        for s in [Stream::Stdout, Stream::Stderr] {
            if let Some(text) = self.whole.rest(s) {
                self.live.output(s, &text);
            }
        }
        self.live.flush_output();
    }
}

impl OutputSink for Sink<'_> {
    fn output(&mut self, s: Stream, chunk: &[u8]) {
        if let Some(text) = self.whole.text(s, chunk) {
            self.live.output(s, &text);
        }
    }

    fn truncated(&mut self, s: Stream, limit: u64) {
        self.whole.cut(s);
        self.live.event(
            "truncated",
            &serde_json::json!({ "stream": stream::name(s), "limit": limit }),
        );
    }
}

/// A background execution's place among those running; given back when dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    bg: &'a Background,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        lock(&self.bg.inner).running -= 1;
        self.bg.turns.notify_waiters();
    }
}

/// How it ended.
#[derive(Debug)]
pub enum Ended {
    /// It ran: its result (output and all).
    Ran(Box<ExecuteResponse>),
    /// It did not run to a result of its own.
    Not(Error),
}

/// The limits of one key.
fn key_limits(config: &BackgroundConfig, key: &Key) -> (usize, usize) {
    (
        key.config
            .max_background_running
            .unwrap_or(config.max_running_per_key),
        key.config
            .max_background_queued
            .unwrap_or(config.max_queued_per_key),
    )
}

impl Background {
    /// The background executions under `state_dir`: those left queued or running by the last
    /// run are marked interrupted (their ids are returned), ended ones are kept.
    pub fn open(
        state_dir: &Path,
        mut config: BackgroundConfig,
        slots: usize,
        storage: Arc<Storage>,
    ) -> (Background, Vec<String>) {
        // Requests answered in place always keep a slot: with one slot in all, none is left.
        config.max_running = config.max_running.min(slots.saturating_sub(1));
        let dir = state_dir.join("background");
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir);
        let mut inner = Inner::default();
        let mut interrupted = Vec::new();
        let dir = match made {
            Ok(()) => Some(dir),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "background executions are not available");
                None
            }
        };
        let entries = dir.as_ref().and_then(|d| std::fs::read_dir(d).ok());
        for entry in entries.into_iter().flatten().flatten() {
            let path = entry.path();
            let Some(mut meta) = read_meta(&path) else {
                // Never submitted whole (a crash between its directory and its state).
                let _ = std::fs::remove_dir_all(&path);
                continue;
            };
            // A job that waited when the server stopped: it will not run now.
            let _ = std::fs::remove_file(path.join("job"));
            if !meta.state.ended() {
                let (at, ms) = now();
                let was = meta.state;
                meta.state = State::Interrupted;
                meta.ended_at = Some(at);
                meta.ended_ms = Some(ms);
                let error = interruption(was);
                let body = error.body(Some(meta.request_id.clone()));
                meta.error = Some(body.error.clone());
                if let Ok(mut events) = std::fs::OpenOptions::new()
                    .read(true)
                    .append(true)
                    .open(path.join("events"))
                {
                    let written = events.metadata().map_or(0, |m| m.len());
                    // An event cut short by the crash (events are not synced one by one) is
                    // cut off, so that the interruption follows whole events.
                    let len = whole_events_len(&events, written);
                    if len < written {
                        tracing::warn!(execution = %meta.id, cut = written - len, "a background execution's last event was cut short by the stop; it is removed");
                        let _ = events.set_len(len);
                    }
                    let data = serde_json::to_value(&body).unwrap_or_default();
                    let _ = events.write_all(&record(len, "error", &data.to_string()));
                }
                let _ = write_meta(&path, &meta);
                interrupted.push(meta.id.clone());
            }
            if !meta.deleted {
                inner
                    .keys
                    .entry(meta.key_fingerprint.clone())
                    .or_default()
                    .kept += 1;
            }
            let _ = storage.count(
                &meta.key_fingerprint,
                Account::Background,
                &meta.id,
                stored_size(&path),
            );
            inner.ended.insert(
                meta.id.clone(),
                (
                    meta.key_fingerprint.clone(),
                    meta.ended_ms.unwrap_or(0),
                    meta.deleted,
                ),
            );
        }
        let bg = Background {
            dir,
            config,
            storage,
            inner: Mutex::new(inner),
            turns: tokio::sync::Notify::new(),
            tombs: Mutex::new(()),
        };
        (bg, interrupted)
    }

    /// Takes a submission in: within the key's bounds (waiting, kept, stored, counting the
    /// `parked` bytes its job will store while it waits), its directory made. Its job is
    /// stored next ([`Live::park`]).
    pub fn submit(
        &self,
        key: &Key,
        id: String,
        request_id: &str,
        limits: &Limits,
        parked: u64,
    ) -> Result<Arc<Live>, Error> {
        let Some(root) = &self.dir else {
            return Err(Error::new(
                Kind::Unavailable,
                "unavailable",
                "background executions are not available: the state directory cannot hold them",
            ));
        };
        if self.config.max_running == 0 {
            return Err(Error::new(
                Kind::Unavailable,
                "unavailable",
                "background executions need a running slot beside those of requests answered \
                 in place: concurrency.max_running is 1; raise it",
            ));
        }
        let fingerprint = key.fingerprint();
        let (_, max_queued) = key_limits(&self.config, key);
        let mut inner = lock(&self.inner);
        let counts = inner.keys.get(&fingerprint).copied().unwrap_or_default();
        if counts.queued >= max_queued {
            return Err(Error::new(
                Kind::RateLimited,
                "rate_limited",
                format!(
                    "this key already has {} background executions waiting, as many as it may",
                    counts.queued
                ),
            )
            .retry_after(1));
        }
        let held = counts.queued + counts.running + counts.kept;
        if held >= self.config.max_kept_per_key {
            return Err(Error::new(
                Kind::RateLimited,
                "rate_limited",
                format!(
                    "this key holds {held} background executions, as many as it may keep \
                     (background.max_kept_per_key); delete ended ones (DELETE \
                     /v1/executions/{{id}}) or wait for them to expire"
                ),
            )
            .retry_after(60));
        }
        // Its job's bytes, counted before they are written: what waits never holds more.
        let counted = self
            .storage
            .count_within(&fingerprint, Account::Background, &id, parked);
        if let Err(Refused { used: holds, .. }) = counted {
            return Err(Error::new(
                Kind::RateLimited,
                "rate_limited",
                format!(
                    "this key's background executions store {holds} bytes of events, results \
                     and waiting jobs, and this one's job needs {parked} more: past what they \
                     may (background.max_bytes_per_key); delete ended ones (DELETE \
                     /v1/executions/{{id}}) or wait for them to end or expire"
                ),
            )
            .retry_after(60));
        }
        let dir = root.join(&id);
        let (submitted_at, _) = now();
        let meta = Meta {
            id: id.clone(),
            state: State::Queued,
            key: key.name().to_owned(),
            key_fingerprint: fingerprint.clone(),
            request_id: request_id.to_owned(),
            submitted_at,
            started_at: None,
            ended_at: None,
            ended_ms: None,
            limits: limits.clone(),
            error: None,
            has_result: false,
            deleted: false,
        };
        let made = std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .append(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(dir.join("events"))
            })
            .and_then(|events| write_meta(&dir, &meta).map(|()| events))
            // Its directory's entry outlives a power loss once `background/` is synced.
            .and_then(|events| File::open(root)?.sync_all().map(|()| events));
        let events = match made {
            Ok(events) => events,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                self.storage.forget(&fingerprint, Account::Background, &id);
                tracing::warn!(error = %e, "cannot store a background execution");
                return Err(Error::new(
                    Kind::Unavailable,
                    "unavailable",
                    format!("the background execution cannot be stored: {e}"),
                ));
            }
        };
        let ticket = inner.next_ticket;
        inner.next_ticket += 1;
        let live = Arc::new(Live {
            id: id.clone(),
            fingerprint: fingerprint.clone(),
            ticket,
            dir,
            cancel: Cancel::default(),
            deleted: AtomicBool::new(false),
            meta: Mutex::new(meta),
            log: Mutex::new(Log {
                file: Some(events),
                len: 0,
            }),
            log_failed: Mutex::new(None),
            storage: self.storage.clone(),
            parked: AtomicU64::new(parked),
            held: Mutex::new((None, String::new())),
            written: tokio::sync::watch::Sender::new((0, false)),
        });
        inner.keys.entry(fingerprint.clone()).or_default().queued += 1;
        let (per_key, _) = key_limits(&self.config, key);
        inner.waiting.insert(ticket, (fingerprint, per_key));
        inner.live.insert(id, live.clone());
        Ok(live)
    }

    /// Takes back a submission whose job could not be stored ([`Live::park`]), before it was
    /// answered: as if it never was.
    pub fn withdraw(&self, live: &Live) {
        live.unstore_parked();
        self.storage
            .forget(&live.fingerprint, Account::Background, &live.id);
        {
            let mut inner = lock(&self.inner);
            inner.live.remove(&live.id);
            inner.waiting.remove(&live.ticket);
            let c = inner.keys.entry(live.fingerprint.clone()).or_default();
            c.queued = c.queued.saturating_sub(1);
        }
        let _ = std::fs::remove_dir_all(&live.dir);
        self.turns.notify_waiters();
    }

    /// Waits for `live`'s turn to run: fewer than `max_running` background executions running,
    /// and fewer than its key's own. `None` when it was cancelled meanwhile.
    pub async fn turn(&self, live: &Live) -> Option<Turn<'_>> {
        loop {
            let notified = self.turns.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = lock(&self.inner);
                if live.is_cancelled() {
                    return None;
                }
                // Of those whose key has room (one whose key is at its own bound holds up no
                // other key), the key that started least recently goes first, and its
                // earliest submitted.
                let Inner {
                    waiting,
                    keys,
                    turns,
                    ..
                } = &*inner;
                let next = turns.next(
                    waiting
                        .iter()
                        .filter(|(_, (fingerprint, per_key))| {
                            keys.get(fingerprint).map_or(0, |c| c.running) < *per_key
                        })
                        .map(|(ticket, (fingerprint, _))| (*ticket, fingerprint.as_str())),
                );
                if inner.running < self.config.max_running && next == Some(live.ticket) {
                    inner.waiting.remove(&live.ticket);
                    inner.running += 1;
                    inner.turns.start(&live.fingerprint);
                    // Held for its key now, so a second of its executions waits.
                    let c = inner.keys.entry(live.fingerprint.clone()).or_default();
                    c.queued = c.queued.saturating_sub(1);
                    c.running += 1;
                    // Those that deferred to this one look again: a turn may still be free.
                    self.turns.notify_waiters();
                    return Some(Turn { bg: self });
                }
            }
            notified.await;
        }
    }

    /// Ends `live`: its result stored, its last event written, its state and counts moved.
    pub fn end(&self, live: &Live, ended: Ended, shutting_down: bool, had_turn: bool) {
        // A job that never ran leaves the disk with it.
        live.unstore_parked();
        let (at, ms) = now();
        let mut meta = lock(&live.meta).clone();
        let failed_log = lock(&live.log_failed).take();
        let (state, event, data) = match ended {
            Ended::Ran(mut response) => {
                let path = live.dir.join("result.json");
                let stored = private_file(&path).and_then(|f| {
                    let mut w = std::io::BufWriter::new(f);
                    serde_json::to_writer(&mut w, &response.result)
                        .map_err(std::io::Error::other)?;
                    let f = w.into_inner().map_err(|e| e.into_error())?;
                    f.sync_data()?;
                    Ok(f.metadata()?.len())
                });
                if stored.is_err() {
                    // Not counted in the key's bytes, so not left to be subtracted later.
                    let _ = std::fs::remove_file(&path);
                }
                match stored {
                    Ok(size) => {
                        meta.has_result = true;
                        // Kept even past the quota (it ran): the key's next submissions
                        // are refused until it deletes some.
                        let _ = live.count(size);
                        let state = if failed_log.is_some() {
                            State::Failed
                        } else if live.is_cancelled() {
                            State::Cancelled
                        } else if shutting_down
                            && response.result.status == airlock_api::Status::InternalError
                        {
                            State::Interrupted
                        } else {
                            State::Finished
                        };
                        if let Some(why) = &failed_log {
                            meta.error = Some(why.body(None).error);
                        }
                        stream::without_output(&mut response.result);
                        (state, "result", stream::streamed_result(&response))
                    }
                    Err(e) => {
                        tracing::error!(execution = %live.id, error = %e, "cannot store a background execution's result");
                        let error = Error::internal(format!("its result could not be stored: {e}"));
                        let body = error.body(Some(meta.request_id.clone()));
                        meta.error = Some(body.error.clone());
                        (
                            State::Failed,
                            "error",
                            serde_json::to_value(body).unwrap_or_default(),
                        )
                    }
                }
            }
            Ended::Not(error) => {
                let (state, error) = if live.is_cancelled() && failed_log.is_none() {
                    (
                        State::Cancelled,
                        Error::new(
                            Kind::Conflict,
                            "cancelled",
                            "it was cancelled before it ran",
                        ),
                    )
                } else if let Some(why) = failed_log {
                    (State::Failed, why)
                } else if shutting_down {
                    (State::Interrupted, interruption(meta.state))
                } else {
                    (State::Failed, error)
                };
                let body = error.body(Some(meta.request_id.clone()));
                meta.error = Some(body.error.clone());
                (
                    state,
                    "error",
                    serde_json::to_value(body).unwrap_or_default(),
                )
            }
        };
        live.event(event, &data);
        meta.state = state;
        meta.ended_at = Some(at);
        meta.ended_ms = Some(ms);
        let saved = write_meta(&live.dir, &meta);
        if let Err(e) = &saved {
            tracing::warn!(execution = %live.id, error = %e, "cannot write a background execution's state");
        }
        *lock(&live.meta) = meta.clone();
        {
            let mut inner = lock(&self.inner);
            if saved.is_err() {
                inner.unsaved.insert(live.id.clone(), meta);
            }
            inner.live.remove(&live.id);
            inner
                .ended
                .insert(live.id.clone(), (live.fingerprint.clone(), ms, false));
            inner.waiting.remove(&live.ticket);
            let c = inner.keys.entry(live.fingerprint.clone()).or_default();
            if had_turn {
                c.running = c.running.saturating_sub(1);
            } else {
                c.queued = c.queued.saturating_sub(1);
            }
            c.kept += 1;
        }
        lock(&live.log).file = None;
        live.written.send_modify(|w| w.1 = true);
        self.turns.notify_waiters();
        if live.deleted.load(Ordering::Acquire) {
            self.tombstone(&live.id);
        }
    }

    /// `key`'s background execution `id`: what it is now. `None` when there is none of
    /// `key`'s by that id.
    pub fn get(&self, key: &Key, id: &str) -> Option<Meta> {
        if !well_formed(id) {
            return None;
        }
        let (live, unsaved) = {
            let inner = lock(&self.inner);
            // Deleted: gone from now on, even while its files are still being removed.
            if inner.ended.get(id).is_some_and(|(_, _, deleted)| *deleted) {
                return None;
            }
            (inner.live.get(id).cloned(), inner.unsaved.get(id).cloned())
        };
        let meta = match (live, unsaved) {
            (Some(live), _) => live.meta(),
            (None, Some(meta)) => meta,
            (None, None) => read_meta(&self.dir.as_ref()?.join(id))?,
        };
        (meta.key_fingerprint == key.fingerprint() && !meta.deleted).then_some(meta)
    }

    /// Whether the server holds any background execution by that id (of any key).
    pub fn holds(&self, id: &str) -> bool {
        well_formed(id) && {
            let inner = lock(&self.inner);
            inner.live.contains_key(id) || inner.ended.contains_key(id)
        }
    }

    /// Its stored result, when it has one.
    pub fn result_path(&self, meta: &Meta) -> Option<PathBuf> {
        meta.has_result
            .then(|| {
                self.dir
                    .as_ref()
                    .map(|d| d.join(&meta.id).join("result.json"))
            })
            .flatten()
    }

    /// `key`'s execution `id` once it ended, or as it is after `wait`.
    pub async fn wait_ended(&self, key: &Key, id: &str, wait: Duration) -> Option<Meta> {
        let meta = self.get(key, id)?;
        let live = lock(&self.inner).live.get(id).cloned();
        let Some(live) = live else {
            return Some(meta);
        };
        let mut written = live.written.subscribe();
        let _ = tokio::time::timeout(wait, written.wait_for(|w| w.1)).await;
        Some(live.meta())
    }

    /// Deletes `key`'s execution `id`: cancels it if it is queued or running (waiting up to
    /// `wait` for it to end), and removes its result and events once it ended; from then on
    /// it is as absent as one that never was. Its last state (not ended if it is still
    /// ending: it is removed when it does).
    pub async fn delete(&self, key: &Key, id: &str, wait: Duration) -> Option<Meta> {
        let meta = self.get(key, id)?;
        let live = lock(&self.inner).live.get(id).cloned();
        let Some(live) = live else {
            self.tombstone(&meta.id);
            return Some(meta);
        };
        live.deleted.store(true, Ordering::Release);
        live.cancel.cancel();
        self.turns.notify_waiters();
        let mut written = live.written.subscribe();
        let _ = tokio::time::timeout(wait, written.wait_for(|w| w.1)).await;
        let meta = live.meta();
        if meta.state.ended() {
            self.tombstone(&meta.id);
        }
        Some(meta)
    }

    /// Removes an ended execution's result and events, and marks it deleted: what is left
    /// of it (a small `meta.json`) only says it is gone, until its retention ends. Once.
    fn tombstone(&self, id: &str) {
        // Held to the end: a second caller returns once the first is done.
        let _one_at_a_time = lock(&self.tombs);
        {
            let mut inner = lock(&self.inner);
            let Some((owner, _, deleted)) = inner.ended.get_mut(id) else {
                return;
            };
            if *deleted {
                return;
            }
            *deleted = true;
            let owner = owner.clone();
            let c = inner.keys.entry(owner).or_default();
            c.kept = c.kept.saturating_sub(1);
        }
        let Some(dir) = self.dir.as_ref().map(|d| d.join(id)) else {
            return;
        };
        let unsaved = lock(&self.inner).unsaved.remove(id);
        let Some(mut meta) = unsaved.or_else(|| read_meta(&dir)) else {
            return;
        };
        if meta.started_at.is_none() {
            // It never ran: no audit record to fall back on, so nothing needs to stay.
            self.remove(id);
            return;
        }
        self.unstore(id);
        let _ = std::fs::remove_file(dir.join("events"));
        let _ = std::fs::remove_file(dir.join("result.json"));
        meta.deleted = true;
        meta.has_result = false;
        if let Err(e) = write_meta(&dir, &meta) {
            tracing::warn!(execution = id, error = %e, "cannot mark a background execution deleted");
            lock(&self.inner).unsaved.insert(id.to_owned(), meta);
        }
    }

    fn remove(&self, id: &str) {
        if let Some(dir) = &self.dir {
            self.unstore(id);
            if let Err(e) = std::fs::remove_dir_all(dir.join(id)) {
                tracing::warn!(execution = id, error = %e, "cannot remove a background execution");
            }
        }
        let mut inner = lock(&self.inner);
        inner.unsaved.remove(id);
        if let Some((owner, _, deleted)) = inner.ended.remove(id) {
            if !deleted {
                let c = inner.keys.entry(owner).or_default();
                c.kept = c.kept.saturating_sub(1);
            }
        }
    }

    /// Takes what it stores off its owner's count, before its files go.
    fn unstore(&self, id: &str) {
        let owner = {
            let inner = lock(&self.inner);
            inner
                .ended
                .get(id)
                .map(|e| e.0.clone())
                .or_else(|| inner.live.get(id).map(|l| l.fingerprint.clone()))
        };
        if let Some(owner) = owner {
            self.storage.forget(&owner, Account::Background, id);
        }
    }

    /// Removes the ended executions older than the retention; how many. Stores the states
    /// that could not be stored when they ended.
    pub fn expire(&self) -> usize {
        if let Some(root) = &self.dir {
            // Under the lock, so that a deletion meanwhile is not written over.
            let mut inner = lock(&self.inner);
            inner
                .unsaved
                .retain(|id, meta| write_meta(&root.join(id), meta).is_err());
        }
        let (_, now_ms) = now();
        let retention = self.config.retention_ms;
        let old: Vec<String> = lock(&self.inner)
            .ended
            .iter()
            .filter(|(_, (_, at, _))| now_ms.saturating_sub(*at) >= retention)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &old {
            self.remove(id);
        }
        old.len()
    }

    /// Resolves once no background execution is queued or running (at shutdown, once each
    /// has stored how it ended).
    pub async fn settled(&self) {
        loop {
            let notified = self.turns.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if lock(&self.inner).live.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Queued, running, and ended ones kept, now.
    pub fn counts(&self) -> (usize, usize, usize) {
        let inner = lock(&self.inner);
        inner.keys.values().fold((0, 0, 0), |(q, r, k), c| {
            (q + c.queued, r + c.running, k + c.kept)
        })
    }

    /// How often ended ones are looked at for their retention.
    pub fn expire_every(&self) -> Duration {
        Duration::from_millis((self.config.retention_ms / 4).clamp(250, 60_000))
    }

    /// A reader of `key`'s execution `id`'s events after `after` (a `Last-Event-ID`, or 0
    /// for all). `Err` names a position that is not the end of an event.
    pub fn events(&self, key: &Key, id: &str, after: u64) -> Result<Tail, Error> {
        let meta = self.get(key, id).ok_or_else(Error::not_found)?;
        let dir = self.dir.as_ref().ok_or_else(Error::not_found)?;
        let live = lock(&self.inner).live.get(id).cloned();
        let path = dir.join(&meta.id).join("events");
        let file = File::open(&path).map_err(|e| gone_or(e, "reading events"))?;
        let (written, watch) = match &live {
            Some(live) => {
                let rx = live.written.subscribe();
                let w = *rx.borrow();
                (w, Some(rx))
            }
            None => ((file.metadata().map_or(0, |m| m.len()), true), None),
        };
        if after > written.0 || !at_event_end(&file, after, written.0) {
            return Err(Error::invalid(
                "Last-Event-ID",
                format!("{after} is not the id of one of this execution's events"),
            ));
        }
        Ok(Tail {
            file: Arc::new(file),
            at: after,
            written,
            watch,
        })
    }
}

/// Whether `at` is where an event of the log ends (or its start): the two bytes before it
/// end an event, and an event (or the end) follows. An event's data is one line, so a blank
/// line only ever ends one.
fn at_event_end(file: &File, at: u64, len: u64) -> bool {
    use std::os::unix::fs::FileExt;
    if at == 0 {
        return true;
    }
    if at < 2 {
        return false;
    }
    let mut before = [0u8; 2];
    if file.read_exact_at(&mut before, at - 2).is_err() || &before != b"\n\n" {
        return false;
    }
    if at == len {
        return true;
    }
    let mut next = [0u8; 4];
    file.read_exact_at(&mut next, at).is_ok() && &next == b"id: "
}

/// The length of `file`'s first `len` bytes up to the end of its last whole event (0 when
/// none is whole): past the last blank line, which only ever ends an event.
fn whole_events_len(file: &File, len: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    const STEP: u64 = 64 << 10;
    let mut end = len;
    let mut block = vec![0u8; STEP as usize + 1];
    while end >= 2 {
        // One byte of overlap, so that a blank line across two blocks is seen.
        let start = end.saturating_sub(STEP + 1);
        let piece = &mut block[..(end - start) as usize];
        if file.read_exact_at(piece, start).is_err() {
            return 0;
        }
        if let Some(i) = piece.windows(2).rposition(|w| w == b"\n\n") {
            return start + i as u64 + 2;
        }
        if start == 0 {
            break;
        }
        end = start + 1;
    }
    0
}

/// A file of an execution deleted meanwhile is as absent as the execution.
fn gone_or(e: std::io::Error, doing: &str) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        Error::not_found()
    } else {
        Error::internal(format!("{doing}: {e}"))
    }
}

/// Why it was interrupted, as its error says.
fn interruption(was: State) -> Error {
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

/// An events log read from a position on, following it while its execution runs.
#[derive(Debug)]
pub struct Tail {
    file: Arc<File>,
    at: u64,
    /// How far the log is written whole, and whether its last event is in.
    written: (u64, bool),
    watch: Option<tokio::sync::watch::Receiver<(u64, bool)>>,
}

/// Output held back for the log joins one event up to this many bytes, the most an event holds.
const COALESCE_BYTES: usize = 16 << 10;

/// The largest `i <= at` where a character of `text` begins (`at` within `text`).
fn char_floor(text: &str, at: usize) -> usize {
    (0..=at)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0)
}
/// How often output held back is written while an execution runs.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Bytes of the log read at once.
pub const CHUNK: usize = 32 << 10;

/// What a [`Tail`] gives next.
#[derive(Debug)]
pub enum Next {
    Bytes(Vec<u8>),
    /// Nothing new for the time asked.
    Silent,
    End,
}

impl Tail {
    /// The next bytes of whole events, waiting up to `quiet` (if any) for more while it runs.
    pub async fn next(&mut self, quiet: Option<Duration>) -> std::io::Result<Next> {
        loop {
            if self.at < self.written.0 {
                let read = read_piece(&self.file, self.at, self.written.0).await?;
                self.at += read.len() as u64;
                return Ok(Next::Bytes(read));
            }
            if self.written.1 {
                return Ok(Next::End);
            }
            let Some(watch) = self.watch.as_mut() else {
                return Ok(Next::End);
            };
            let changed = match quiet {
                Some(quiet) => tokio::time::timeout(quiet, watch.changed()).await,
                None => Ok(watch.changed().await),
            };
            match changed {
                Err(_) => return Ok(Next::Silent),
                Ok(Err(_)) => {
                    // Its writer is gone: what it wrote whole is all there is.
                    self.written.1 = true;
                    self.written.0 = self.file.metadata().map_or(self.written.0, |m| m.len());
                }
                Ok(Ok(())) => self.written = *watch.borrow_and_update(),
            }
        }
    }
}

/// The piece of `file` from `at` (at most [`CHUNK`] bytes, none past `end`), read off the
/// async workers.
async fn read_piece(file: &Arc<File>, at: u64, end: u64) -> std::io::Result<Vec<u8>> {
    let want = end.saturating_sub(at).min(CHUNK as u64) as usize;
    let file = file.clone();
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0; want];
        file.read_exact_at(&mut buf, at).map(|()| buf)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// A stored result, read from the disk as it is sent.
#[derive(Debug)]
pub struct Stored {
    file: Arc<File>,
    at: u64,
    pub len: u64,
}

impl Background {
    /// `meta`'s stored result, if it has one.
    pub fn stored(&self, meta: &Meta) -> Result<Option<Stored>, Error> {
        let Some(path) = self.result_path(meta) else {
            return Ok(None);
        };
        let file = File::open(&path).map_err(|e| gone_or(e, "reading a result"))?;
        let len = file
            .metadata()
            .map_err(|e| Error::internal(format!("reading a result: {e}")))?
            .len();
        Ok(Some(Stored {
            file: Arc::new(file),
            at: 0,
            len,
        }))
    }
}

impl Background {
    /// `meta`'s stored result, parsed (held whole in memory: for an answer made whole, as
    /// MCP's are, whose memory the caller reserved).
    pub fn result(&self, meta: &Meta) -> Result<Option<airlock_api::ExecutionResult>, Error> {
        let Some(path) = self.result_path(meta) else {
            return Ok(None);
        };
        let file = File::open(&path).map_err(|e| gone_or(e, "reading a result"))?;
        serde_json::from_reader(std::io::BufReader::new(file))
            .map(Some)
            .map_err(|e| Error::internal(format!("reading a result: {e}")))
    }
}

impl Stored {
    /// Its next piece (at most [`CHUNK`] bytes), and the rest; `None` at its end.
    pub async fn next(mut self) -> Option<(Vec<u8>, Stored)> {
        if self.at >= self.len {
            return None;
        }
        let read = read_piece(&self.file, self.at, self.len).await.ok()?;
        self.at += read.len() as u64;
        Some((read, self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_s_id_is_the_offset_just_past_it() {
        let mut log = Vec::new();
        for (name, data) in [("stdout", "{\"text\":\"a\"}"), ("stderr", &"x".repeat(100))] {
            let r = record(log.len() as u64, name, data);
            log.extend_from_slice(&r);
            let text = String::from_utf8(r).unwrap();
            let id: u64 = text[4..text.find('\n').unwrap()].parse().unwrap();
            assert_eq!(id, log.len() as u64);
        }
        // Across a change in the number of digits.
        let r = record(9_990, "stdout", "{}");
        let text = String::from_utf8(r.clone()).unwrap();
        let id: u64 = text[4..text.find('\n').unwrap()].parse().unwrap();
        assert_eq!(id, 9_990 + r.len() as u64);
    }

    #[test]
    fn only_ends_of_events_are_positions_to_resume_from() {
        let dir = std::env::temp_dir().join(format!("airlock-bg-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("events");
        let mut log = record(0, "stdout", "{\"text\":\"a\\n\\nb\"}");
        let first = log.len() as u64;
        log.extend(record(first, "result", "{}"));
        std::fs::write(&path, &log).unwrap();
        let file = File::open(&path).unwrap();
        let len = log.len() as u64;
        assert!(at_event_end(&file, 0, len));
        assert!(at_event_end(&file, first, len));
        assert!(at_event_end(&file, len, len));
        for bad in [1, 2, 5, first - 1, first + 1, len - 1] {
            assert!(!at_event_end(&file, bad, len), "{bad}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_log_cut_short_is_cut_back_to_its_last_whole_event() {
        let dir = std::env::temp_dir().join(format!("airlock-bg-cut-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("events");
        // Events larger than a block, so that the search crosses blocks.
        let big = format!("{{\"text\":\"{}\"}}", "x".repeat(150 << 10));
        let mut log = record(0, "stdout", &big);
        let first = log.len() as u64;
        log.extend(record(first, "stdout", &big));
        let whole = log.len() as u64;
        std::fs::write(&path, &log).unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(whole_events_len(&file, whole), whole);
        // Every cut inside the second event goes back to the first's end.
        for cut in [first + 1, first + 70_000, whole - 2, whole - 1] {
            assert_eq!(whole_events_len(&file, cut), first, "{cut}");
        }
        for cut in [0, 1, 5, first - 1] {
            assert_eq!(whole_events_len(&file, cut), 0, "{cut}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A waiter that deferred to another key's submission (still being stored, not yet
    /// waiting) looks again once that one takes its turn, while a turn is still free.
    #[tokio::test]
    async fn a_waiter_that_deferred_looks_again_when_the_other_takes_its_turn() {
        use crate::config::KeyConfig;
        use crate::keys::{hash_key, KeyStore};
        let dir = std::env::temp_dir().join(format!("airlock-bg-turns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = BackgroundConfig {
            max_running: 2,
            max_running_per_key: 4,
            ..BackgroundConfig::default()
        };
        let storage = Storage::open(
            &dir,
            airlock_engine::storage::Quotas {
                stored: 0,
                background: config.max_bytes_per_key,
            },
        );
        let (bg, _) = Background::open(&dir, config, 4, Arc::new(storage));
        let bg = Arc::new(bg);
        let store = KeyStore::new(vec![
            KeyConfig::new("a", hash_key("key-a-for-tests-0001")),
            KeyConfig::new("b", hash_key("key-b-for-tests-0001")),
        ])
        .unwrap();
        let (a, b) = (store.keys()[0].clone(), store.keys()[1].clone());
        let limits = Limits {
            timeout_ms: 1000,
            memory_mb: 64,
            cpu_ms: 1000,
            pids: 8,
            disk_mb: 8,
            output_bytes: 1024,
        };
        // Key a has started once; key b never has, so b goes first.
        let first = bg.submit(&a, "ex_a0".into(), "r0", &limits, 0).unwrap();
        drop(bg.turn(&first).await.unwrap());
        let x = bg.submit(&a, "ex_x".into(), "r1", &limits, 0).unwrap();
        let y = bg.submit(&b, "ex_y".into(), "r2", &limits, 0).unwrap();
        let (waiter, xs) = (bg.clone(), x.clone());
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let turn = waiter.turn(&xs).await;
            let _ = tx.send(turn.is_some());
            std::mem::forget(turn);
        });
        // The test's runtime has one thread: x's task runs to its wait, deferring to y.
        tokio::task::yield_now().await;
        assert!(
            rx.try_recv().is_err(),
            "x defers to y, whose key started less recently"
        );
        let _y_turn = bg.turn(&y).await.unwrap();
        let x_started = tokio::time::timeout(Duration::from_secs(30), rx).await;
        assert!(
            matches!(x_started, Ok(Ok(true))),
            "x waits though a turn is free: {x_started:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn ids_that_are_not_execution_ids_name_nothing() {
        assert!(well_formed("ex_abc123"));
        assert!(well_formed("ex_r1_abc"));
        for bad in [
            "",
            "ex_../x",
            "se_abc",
            "ex_a/b",
            "ex_.",
            &format!("ex_{}", "a".repeat(100)),
        ] {
            assert!(!well_formed(bad), "{bad}");
        }
    }
}
