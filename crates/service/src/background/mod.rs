//! Background executions (`POST /v1/executions`): answered at once with an id, then run to
//! their end whether or not anyone listens. The order of their steps is the pipeline's
//! (`pipeline::submit`); this module keeps what outlives the request, one directory each under
//! `<state>/background/<id>/`, a file of this folder for each job:
//! - `meta.json` ([`meta`]): its state (`queued`, `running`, then `finished`, `failed`,
//!   `cancelled` or `interrupted`) and times, replaced whole (written aside, synced, renamed)
//!   at each change;
//! - `events` ([`log`]): its events as server-sent events, appended as they happen, each with
//!   an `id:` that is the byte offset just past it, so a client resumes after any event it got
//!   (`Last-Event-ID`) and is sent every byte of output exactly once; read by a [`Tail`]
//!   ([`tail`]);
//! - `result.json` ([`results`]): the result with its output, once it ran; read back from the
//!   disk, never held in memory;
//! - `job`: while it waits for its turn, what is large in its job (code, files, stdin...), so
//!   that what waits, for hours maybe, holds no memory (`parked.rs`); read back, and removed,
//!   when its turn comes.
//!
//! What is queued or running is also in memory ([`Live`], [`live`]): its cancel handle and a
//! watch of how far its events log is written, which followers wait on. Turns go by key
//! ([`queue`]): the waiting key that started least recently goes next. A restart finds those
//! in `meta.json` still queued or running and marks them `interrupted` (the audit log's own
//! repair marks their `started` line); ended ones stay readable until their retention
//! (`[background] retention_ms`) has passed, and deleted ones leave a tombstone until then
//! ([`tombs`]). [`Background`] holds them all under one lock.

mod live;
mod log;
mod meta;
mod queue;
mod results;
mod tail;
mod tombs;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use airlock_api::Limits;
use airlock_engine::storage::{Account, Refused, Storage};

use crate::config::BackgroundConfig;
use crate::error::{Error, Kind};
use crate::keys::Key;

pub use live::{Ended, Live, Sink};
pub use meta::{Meta, State, View};
pub use results::Stored;
pub use tail::{Next, Tail, CHUNK};

use meta::{now, read_meta, write_meta};
use queue::{key_limits, Queue};
use tombs::Kept;

#[derive(Default)]
struct Inner {
    live: HashMap<String, Arc<Live>>,
    queue: Queue,
    kept: Kept,
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

/// Ids are made by `keys::held_id`; anything else names nothing (and no path).
fn well_formed(id: &str) -> bool {
    id.len() <= 100
        && id.starts_with("ex_")
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A background execution's place among those running; given back when dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    bg: &'a Background,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        lock(&self.bg.inner).queue.give_back();
        self.bg.turns.notify_waiters();
    }
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
            let Some((meta, was_running)) = meta::recover(&path) else {
                continue;
            };
            if was_running {
                interrupted.push(meta.id.clone());
            }
            let _ = storage.count(
                &meta.key_fingerprint,
                Account::Background,
                &meta.id,
                stored_size(&path),
            );
            inner.kept.add(
                &meta.id,
                &meta.key_fingerprint,
                meta.ended_ms.unwrap_or(0),
                meta.deleted,
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
        let (per_key, max_queued) = key_limits(&self.config, key);
        let mut inner = lock(&self.inner);
        let counts = inner.queue.of(&fingerprint);
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
        let held = counts.queued + counts.running + inner.kept.of(&fingerprint);
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
        let meta = Meta::queued(id.clone(), key, request_id, limits);
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
        let ticket = inner.queue.enqueue(&fingerprint, per_key);
        let live = Arc::new(Live::new(
            meta,
            ticket,
            dir,
            events,
            self.storage.clone(),
            parked,
        ));
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
            inner.queue.leave(live.ticket, &live.fingerprint, false);
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
                let max = self.config.max_running;
                if inner.queue.take_turn(live.ticket, &live.fingerprint, max) {
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
        let (meta, saved) = live.finish(ended, shutting_down);
        {
            let mut inner = lock(&self.inner);
            let ended_ms = meta.ended_ms.unwrap_or(0);
            if !saved {
                inner.kept.keep_unsaved(meta);
            }
            inner.live.remove(&live.id);
            inner.kept.add(&live.id, &live.fingerprint, ended_ms, false);
            inner.queue.leave(live.ticket, &live.fingerprint, had_turn);
        }
        live.close_log();
        self.turns.notify_waiters();
        if live.is_cancelled() {
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
            if inner.kept.is_deleted(id) {
                return None;
            }
            (inner.live.get(id).cloned(), inner.kept.unsaved(id).cloned())
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
            inner.live.contains_key(id) || inner.kept.holds(id)
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

    /// `meta`'s stored result, if it has one, to be read piece by piece.
    pub fn stored(&self, meta: &Meta) -> Result<Option<Stored>, Error> {
        self.result_path(meta)
            .map(|path| Stored::open(&path))
            .transpose()
    }

    /// `meta`'s stored result, parsed (held whole in memory: for an answer made whole, as
    /// MCP's are, whose memory the caller reserved).
    pub fn result(&self, meta: &Meta) -> Result<Option<airlock_api::ExecutionResult>, Error> {
        self.result_path(meta)
            .map(|path| results::read(&path))
            .transpose()
    }

    /// `key`'s execution `id` once it ended, or as it is after `wait`.
    pub async fn wait_ended(&self, key: &Key, id: &str, wait: Duration) -> Option<Meta> {
        let meta = self.get(key, id)?;
        let live = lock(&self.inner).live.get(id).cloned();
        let Some(live) = live else {
            return Some(meta);
        };
        let mut written = live.written();
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
        live.delete();
        self.turns.notify_waiters();
        let mut written = live.written();
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
        if !lock(&self.inner).kept.mark_deleted(id) {
            return;
        }
        let Some(dir) = self.dir.as_ref().map(|d| d.join(id)) else {
            return;
        };
        let unsaved = lock(&self.inner).kept.take_unsaved(id);
        let Some(meta) = unsaved.or_else(|| read_meta(&dir)) else {
            return;
        };
        if meta.started_at.is_none() {
            // It never ran: no audit record to fall back on, so nothing needs to stay.
            self.remove(id);
            return;
        }
        self.unstore(id);
        if let Some(meta) = tombs::bury(&dir, meta) {
            lock(&self.inner).kept.keep_unsaved(meta);
        }
    }

    fn remove(&self, id: &str) {
        if let Some(dir) = &self.dir {
            self.unstore(id);
            if let Err(e) = std::fs::remove_dir_all(dir.join(id)) {
                tracing::warn!(execution = id, error = %e, "cannot remove a background execution");
            }
        }
        lock(&self.inner).kept.forget(id);
    }

    /// Takes what it stores off its owner's count, before its files go.
    fn unstore(&self, id: &str) {
        let owner = {
            let inner = lock(&self.inner);
            inner
                .kept
                .owner(id)
                .map(str::to_owned)
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
            lock(&self.inner).kept.save_unsaved(root);
        }
        let (_, now_ms) = now();
        let old = lock(&self.inner)
            .kept
            .expired(now_ms, self.config.retention_ms);
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
        let (queued, running) = inner.queue.totals();
        (queued, running, inner.kept.total())
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
        Tail::open(&path, after, live.map(|live| live.written()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Background work under a directory of its own (`name`), and keys by those names.
    fn background(
        name: &str,
        config: BackgroundConfig,
        keys: &[&str],
    ) -> (PathBuf, Background, Vec<Arc<Key>>) {
        use crate::config::KeyConfig;
        use crate::keys::{hash_key, KeyStore};
        let dir = std::env::temp_dir().join(format!("airlock-bg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let storage = airlock_engine::storage::Storage::open(
            &dir,
            airlock_engine::storage::Quotas {
                stored: 0,
                background: config.max_bytes_per_key,
            },
        );
        let (bg, _) = Background::open(&dir, config, 4, Arc::new(storage));
        let keys = keys
            .iter()
            .map(|k| KeyConfig::new(k, hash_key(&format!("key-{k}-for-tests-0001"))))
            .collect();
        (dir, bg, KeyStore::new(keys).unwrap().keys().to_vec())
    }

    fn limits() -> Limits {
        Limits {
            timeout_ms: 1000,
            memory_mb: 64,
            cpu_ms: 1000,
            pids: 8,
            disk_mb: 8,
            output_bytes: 1024,
        }
    }

    /// A waiter that deferred to another key's submission (still being stored, not yet
    /// waiting) looks again once that one takes its turn, while a turn is still free.
    #[tokio::test]
    async fn a_waiter_that_deferred_looks_again_when_the_other_takes_its_turn() {
        let config = BackgroundConfig {
            max_running: 2,
            max_running_per_key: 4,
            ..BackgroundConfig::default()
        };
        let (dir, bg, keys) = background("turns", config, &["a", "b"]);
        let (bg, a, b) = (Arc::new(bg), keys[0].clone(), keys[1].clone());
        let limits = limits();
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

    #[tokio::test]
    async fn a_wait_for_the_cancel_ends_with_the_delete() {
        let (dir, bg, keys) = background("cancel", BackgroundConfig::default(), &["a"]);
        let a = keys[0].clone();
        let live = bg.submit(&a, "ex_c".into(), "r", &limits(), 0).unwrap();
        let waiting = live.clone();
        let waiter = tokio::spawn(async move { waiting.cancelled().await });
        // The test's runtime has one thread: the waiter runs to its wait.
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "cancelled before it was");
        bg.delete(&a, "ex_c", Duration::ZERO).await.unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(30), waiter).await;
        assert!(woken.is_ok(), "still waiting, though it was cancelled");
        assert!(live.is_cancelled());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn output_held_back_is_written_without_more_output() {
        use airlock_engine::{OutputSink, Stream};
        let (dir, bg, keys) = background("flush", BackgroundConfig::default(), &["a"]);
        let a = keys[0].clone();
        let live = bg.submit(&a, "ex_f".into(), "r", &limits(), 0).unwrap();
        let flushing = live.clone();
        let flusher = tokio::spawn(async move { flushing.flush_held().await });
        let mut written = live.written();
        live.sink().output(Stream::Stdout, b"held");
        assert_eq!(written.borrow().0, 0, "held back, not written at once");
        let wrote = tokio::time::timeout(Duration::from_secs(30), written.wait_for(|w| w.0 > 0));
        assert!(wrote.await.is_ok(), "output held back was never written");
        let log = std::fs::read_to_string(dir.join("background/ex_f/events")).unwrap();
        assert!(log.contains(r#"{"text":"held"}"#), "{log}");
        // Its last event ends the flusher.
        bg.end(&live, Ended::Not(Error::internal("stopped")), false, false);
        let ended = tokio::time::timeout(Duration::from_secs(30), flusher).await;
        assert!(ended.is_ok(), "the flusher outlives its execution");
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
