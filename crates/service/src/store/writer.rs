//! The writer: the queue of lines waiting for their commit, and the thread that commits them
//! in batches, connecting again while the database fails.

use std::collections::{HashSet, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use tokio_postgres_rustls::MakeRustlsConnect;

use super::db::Db;
use super::rows::{insert, Row, BATCH};
use super::spool::Spool;

/// How long the writer waits between tries while the database fails (the file's cadence,
/// which a refusal's `Retry-After` tells clients).
const RETRY_EVERY: Duration = crate::audit_lines::RETRY_EVERY;

#[derive(Debug, Default)]
pub(super) struct Queue {
    /// Lines not yet committed, oldest first (those of the batch in flight included).
    pub(super) rows: VecDeque<Row>,
    /// The number the next line gets.
    pub(super) next: u64,
    /// Every line numbered up to this one is committed.
    pub(super) committed: u64,
    /// Why the last commit failed; None once one works.
    pub(super) failure: Option<String>,
    /// Lines dropped because too many were kept.
    pub(super) lost: u64,
    pub(super) stop: bool,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) queue: Mutex<Queue>,
    /// The writer waits on it for lines (and stop).
    pub(super) work: Condvar,
    /// Waiters for a commit (an answer, shutdown) wait on it.
    pub(super) done: Condvar,
    /// This replica's name, in every row.
    pub(super) replica: String,
    /// This run's lines are `<run>:<n>` in `line_key`.
    pub(super) run: String,
    /// Taken before `queue` by whoever takes both.
    pub(super) spool: Spool,
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits at most `left` for a commit (or a failure) to be announced.
    pub(super) fn wait_done<'a>(
        &self,
        queue: std::sync::MutexGuard<'a, Queue>,
        left: Duration,
    ) -> std::sync::MutexGuard<'a, Queue> {
        self.done
            .wait_timeout(queue, left)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    /// A row for line `n` of this run.
    pub(super) fn row(&self, n: u64, line: Vec<u8>) -> std::io::Result<Row> {
        Row::of(n, Some(format!("{}:{n}", self.run)), line)
    }

    /// Writes to the spool the kept lines not yet in it, and syncs them. `started`
    /// lines stay out: an execution runs only once its line is committed, and one whose line
    /// is not would be taken for interrupted (its `not_run` row, which is spooled, says why).
    pub(super) fn spool_kept(&self) -> std::io::Result<()> {
        let mut spool = self.spool.lock();
        let rows: Vec<Row> = self
            .lock()
            .rows
            .iter()
            .filter(|r| !r.spooled && r.key.is_some() && r.event != "started")
            .cloned()
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        Spool::append(&mut spool, &self.replica, &rows)?;
        let written: HashSet<u64> = rows.iter().map(|r| r.n).collect();
        let mut queue = self.lock();
        for row in queue.rows.iter_mut().filter(|r| written.contains(&r.n)) {
            row.spooled = true;
        }
        Ok(())
    }
}

/// The writer: commits queued lines in batches until stopped, connecting again while the
/// database fails. Once it can write, the spool is replayed before the batch.
pub(super) fn write_rows(
    shared: &Shared,
    connect: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    db: Option<Db>,
) {
    let mut db = db;
    // Set while the store fails (a commit failed, or one was not confirmed in time): the
    // first commit after it writes an `audit_resumed` row first.
    let mut failed_since: Option<String> = None;
    loop {
        let batch: Vec<Row> = {
            let mut queue = shared.lock();
            // While failing, it tries again even with nothing kept (the `started` lines of
            // refused executions are taken back): the `audit_resumed` row is the try.
            while queue.rows.is_empty() && !queue.stop && failed_since.is_none() {
                queue = shared.work.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
            if queue.rows.is_empty() && queue.stop {
                return;
            }
            queue.rows.iter().take(BATCH).cloned().collect()
        };
        let mut resumed = failed_since.as_ref().map(|why| {
            let lost = shared.lock().lost;
            let line = serde_json::json!({
                "event": "audit_resumed",
                "at": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
                "failure": why,
                "kept": batch.len(),
                "lost": lost,
            });
            Row {
                n: 0,
                key: None,
                event: "audit_resumed".into(),
                execution_id: None,
                session_id: None,
                key_fingerprint: None,
                line: line.to_string(),
                spooled: false,
            }
        });
        let resuming = resumed.is_some();
        let result = write_batch(shared, connect, tls, &mut db, &mut resumed, &batch);
        if resuming && resumed.is_none() {
            failed_since = None; // its `audit_resumed` row is committed
        }
        let mut queue = shared.lock();
        match result {
            Ok(()) => {
                let last = batch.last().map_or(0, |r| r.n);
                while queue.rows.front().is_some_and(|r| r.n <= last) {
                    queue.rows.pop_front();
                }
                queue.committed = queue.committed.max(last);
                if queue.failure.is_some() {
                    // A waiter's failure (no commit in time) while this round was on its
                    // way: the next round marks the time executions were refused, then
                    // ends it.
                    failed_since = queue.failure.clone();
                }
                shared.done.notify_all();
            }
            Err(e) => {
                // Once a run of failures (a waiter may have seen it first).
                if failed_since.is_none() {
                    tracing::error!(error = %e, "cannot write audit lines to PostgreSQL; refusing executions until it can");
                }
                let why = e.to_string();
                queue.failure = Some(why.clone());
                failed_since.get_or_insert(why);
                let stop = queue.stop;
                shared.done.notify_all();
                drop(queue);
                // Dropped here, where its runtime may run: the writer's own thread.
                db = None;
                // What is kept outlives this process from now on.
                if let Err(e) = shared.spool_kept() {
                    tracing::error!(error = %e, "cannot write the store's spool");
                }
                if stop {
                    return;
                }
                let queue = shared.lock();
                if !queue.stop {
                    drop(
                        shared
                            .work
                            .wait_timeout(queue, RETRY_EVERY)
                            .unwrap_or_else(|e| e.into_inner()),
                    );
                }
            }
        }
    }
}

/// One try of the writer's: connects if it must, commits the `audit_resumed` row if there
/// is one (then taken, and executions resume: their lines queue behind the kept ones),
/// replays the spool, and commits the batch.
fn write_batch(
    shared: &Shared,
    connect: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    db: &mut Option<Db>,
    resumed: &mut Option<Row>,
    batch: &[Row],
) -> std::io::Result<()> {
    let db = match db.take() {
        Some(open) => db.insert(open),
        None => db.insert(Db::connect(connect, tls)?),
    };
    let replica = shared.replica.as_str();
    if let Some(row) = resumed.as_ref() {
        db.run("writing audit lines", async |c| {
            insert(c, replica, &[row]).await
        })?;
        *resumed = None;
        let mut queue = shared.lock();
        tracing::warn!("PostgreSQL can be written again; executions resume");
        queue.failure = None;
        queue.lost = 0;
    }
    shared.spool.replay(db)?;
    if batch.is_empty() {
        return Ok(());
    }
    let rows: Vec<&Row> = batch.iter().collect();
    db.run("writing audit lines", async |c| {
        insert(c, replica, &rows).await
    })
}
