//! A background execution that is queued or running, in memory: its cancel handle, its state,
//! its events log being written and the output held back for it, and what its key stores.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use airlock_engine::storage::{Account, Refused, Storage};
use airlock_engine::{Cancel, Job, OutputSink, Stream};

use airlock_api::ExecuteResponse;

use super::log::{EventsLog, Held, FLUSH_EVERY};
use super::meta::{interruption, write_meta, Meta, State};
use super::results;
use crate::error::{Error, Kind};
use crate::parked;
use crate::stream::{self, Whole};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How it ended.
#[derive(Debug)]
pub enum Ended {
    /// It ran: its result (output and all).
    Ran(Box<ExecuteResponse>),
    /// It did not run to a result of its own.
    Not(Error),
}

/// A background execution that is queued or running.
pub struct Live {
    pub id: String,
    pub(super) fingerprint: String,
    /// Its place in the order of submissions: its key's turns go by it.
    pub(super) ticket: u64,
    pub(super) dir: PathBuf,
    pub cancel: Cancel,
    /// Deleted (so cancelled) while queued or running: removed once it ends.
    deleted: tokio::sync::watch::Sender<bool>,
    meta: Mutex<Meta>,
    log: EventsLog,
    /// Output held back for the log.
    held: Mutex<Held>,
    /// Output is held now that was not: it is written [`FLUSH_EVERY`] later at most.
    held_anew: tokio::sync::Notify,
    /// Why the events log could not be written, if it could not.
    log_failed: Mutex<Option<Error>>,
    /// Where its bytes count, with its key's other background executions' (their events,
    /// results and waiting jobs, within `background.max_bytes_per_key`).
    storage: Arc<Storage>,
    /// Bytes of its job counted while it waits on the disk (`job`); 0 once it is read back
    /// or gone.
    parked: AtomicU64,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("id", &self.id).finish()
    }
}

impl Live {
    /// A submission as `meta` says, stored in `dir` with its empty events log; its job's
    /// `parked` bytes were counted in its key's storage before (what waits never holds more).
    pub(super) fn new(
        meta: Meta,
        ticket: u64,
        dir: PathBuf,
        events: File,
        storage: Arc<Storage>,
        parked: u64,
    ) -> Live {
        Live {
            id: meta.id.clone(),
            fingerprint: meta.key_fingerprint.clone(),
            ticket,
            dir,
            cancel: Cancel::default(),
            deleted: tokio::sync::watch::Sender::new(false),
            meta: Mutex::new(meta),
            log: EventsLog::new(events),
            held: Mutex::new(Held::default()),
            held_anew: tokio::sync::Notify::new(),
            log_failed: Mutex::new(None),
            storage,
            parked: AtomicU64::new(parked),
        }
    }

    /// Appends one event to the log, after the output held back before it.
    pub fn event(&self, name: &str, data: &serde_json::Value) {
        self.flush_output();
        self.append(name, data);
    }

    /// Output text for the log, held back ([`Held`]).
    fn output(&self, s: Stream, text: &str) {
        let mut held = lock(&self.held);
        let was_empty = held.is_empty();
        held.push(s, text, |s, text| self.append_text(s, text));
        if was_empty && !held.is_empty() {
            self.held_anew.notify_one();
        }
    }

    /// Writes the output held back on a clock that ticks every [`FLUSH_EVERY`] from now, at
    /// the first tick after it was held, until its last event is written: woken by output
    /// held, it sleeps only while output waits for the tick.
    pub async fn flush_held(&self) {
        let mut written = self.log.subscribe();
        let start = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = self.held_anew.notified() => {}
                _ = written.wait_for(|w| w.1) => return,
            }
            // Joined meanwhile with what follows it, up to an event's worth.
            tokio::time::sleep_until(next_tick(start, tokio::time::Instant::now())).await;
            self.flush_output();
        }
    }

    /// Writes the output held back, if any.
    fn flush_output(&self) {
        let mut held = lock(&self.held);
        if let Some((s, text)) = held.take() {
            self.append_text(s, &text);
        }
    }

    fn append_text(&self, s: Stream, text: &str) {
        self.append(stream::name(s), &serde_json::json!({ "text": text }));
    }

    /// Stops it for `why`, the first reason given.
    fn stop(&self, why: Error) {
        let mut failed = lock(&self.log_failed);
        if failed.is_none() {
            *failed = Some(why);
            self.cancel.cancel();
        }
    }

    /// Why it was stopped (its log could not be written, or its key stores too much), once.
    fn take_failure(&self) -> Option<Error> {
        lock(&self.log_failed).take()
    }

    /// Whether its last event is written.
    pub fn has_ended(&self) -> bool {
        self.log.has_ended()
    }

    /// Appends one event to the log. A log that cannot be written stops the execution: its
    /// client would otherwise miss output without knowing.
    fn append(&self, name: &str, data: &serde_json::Value) {
        match self.log.append(name, data) {
            None => {}
            Some(Ok(n)) => {
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
            Some(Err(e)) => {
                tracing::error!(execution = %self.id, error = %e, "a background execution's events cannot be written; it is stopped");
                self.stop(Error::internal(format!(
                    "its events could not be written: {e}"
                )));
            }
        }
    }

    /// It ended as `ended` says: its result stored, its last event written, `meta.json`
    /// replaced; its state now, and whether that could be written.
    pub(super) fn finish(&self, ended: Ended, shutting_down: bool) -> (Meta, bool) {
        // A job that never ran leaves the disk with it.
        self.unstore_parked();
        let mut meta = self.meta();
        let failed_log = self.take_failure();
        let (event, data) = match ended {
            Ended::Ran(mut response) => match results::store(&self.dir, &response.result) {
                Ok(size) => {
                    meta.has_result = true;
                    // Kept even past the quota (it ran): the key's next submissions are
                    // refused until it deletes some.
                    let _ = self.count(size);
                    // Stopped by airlock (its log, its key's bytes): it failed, and its events
                    // end as its state says, with why; what it ran to is kept as its result.
                    if let Some(why) = &failed_log {
                        let data = meta.end(State::Failed, Some(why)).unwrap_or_default();
                        return self.record_end(meta, "error", &data);
                    }
                    stream::without_output(&mut response.result);
                    let state = if self.is_cancelled() {
                        State::Cancelled
                    } else if shutting_down
                        && response.result.status == airlock_api::Status::InternalError
                    {
                        State::Interrupted
                    } else {
                        State::Finished
                    };
                    meta.end(state, None);
                    ("result", stream::streamed_result(&response))
                }
                Err(e) => {
                    tracing::error!(execution = %self.id, error = %e, "cannot store a background execution's result");
                    let error = Error::internal(format!("its result could not be stored: {e}"));
                    (
                        "error",
                        meta.end(State::Failed, Some(&error)).unwrap_or_default(),
                    )
                }
            },
            Ended::Not(error) => {
                let (state, error) = if self.is_cancelled() && failed_log.is_none() {
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
                ("error", meta.end(state, Some(&error)).unwrap_or_default())
            }
        };
        self.record_end(meta, event, &data)
    }

    /// Writes its last event and its state.
    fn record_end(&self, meta: Meta, event: &str, data: &serde_json::Value) -> (Meta, bool) {
        self.event(event, data);
        let saved = write_meta(&self.dir, &meta);
        if let Err(e) = &saved {
            tracing::warn!(execution = %self.id, error = %e, "cannot write a background execution's state");
        }
        self.set_meta(meta.clone());
        (meta, saved.is_ok())
    }

    /// Its last event is in: the log is closed, and its followers read to its end.
    pub(super) fn close_log(&self) {
        self.log.close();
    }

    /// How far its log is written whole, and whether its last event is in, as it changes.
    pub(super) fn written(&self) -> tokio::sync::watch::Receiver<(u64, bool)> {
        self.log.subscribe()
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

    /// What its output goes to while it runs.
    pub fn sink(self: &Arc<Self>) -> Sink {
        Sink {
            live: self.clone(),
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
        *self.deleted.borrow()
    }

    /// Resolves once it is cancelled.
    pub async fn cancelled(&self) {
        // The sender is `self`'s: the wait ends only by a cancel.
        let _ = self.deleted.subscribe().wait_for(|deleted| *deleted).await;
    }

    /// Deleted while queued or running: cancelled, and removed once it ends.
    pub(super) fn delete(&self) {
        self.deleted.send_replace(true);
        self.cancel.cancel();
    }

    pub fn meta(&self) -> Meta {
        lock(&self.meta).clone()
    }

    fn set_meta(&self, meta: Meta) {
        *lock(&self.meta) = meta;
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
    pub(super) fn unstore_parked(&self) {
        let n = self.parked.swap(0, Ordering::AcqRel);
        if n > 0 {
            let _ = std::fs::remove_file(self.dir.join("job"));
            self.uncount(n);
        }
    }
}

/// The first tick after `now` of a clock that ticks every [`FLUSH_EVERY`] from `start`.
fn next_tick(start: tokio::time::Instant, now: tokio::time::Instant) -> tokio::time::Instant {
    let every = FLUSH_EVERY.as_nanos();
    let ticks = now.saturating_duration_since(start).as_nanos() / every + 1;
    start + Duration::from_nanos(u64::try_from(ticks * every).unwrap_or(u64::MAX))
}

/// Output into the events log, as `stdout`/`stderr`/`truncated` events (those of a stream).
#[derive(Debug)]
pub struct Sink {
    live: Arc<Live>,
    whole: Whole,
}

impl Sink {
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

impl OutputSink for Sink {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_held_back_waits_for_the_next_tick_of_its_clock() {
        let start = tokio::time::Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        for (now, tick) in [
            (0, 100),
            (1, 100),
            (99, 100),
            (100, 200),
            (150, 200),
            (1_050, 1_100),
        ] {
            assert_eq!(next_tick(start, at(now)), at(tick), "{now} ms");
        }
    }
}
