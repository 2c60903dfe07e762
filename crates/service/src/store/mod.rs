//! Records and audit lines in PostgreSQL (`[store] url`), so that every replica serves every
//! record and a replica's disk holds nothing that matters while the database works.
//!
//! Each audit line is a row of `airlock_audit`: the replica that wrote it, its event
//! (`record`, `started`, `session_opened`, ...), the execution or session it is about, and
//! the line itself as `jsonb`, as the file would hold it. Rows are inserted by a thread of
//! its own, in batches: lines written while a batch commits share the next commit (group
//! commit, as the file's syncer does). A commit that fails refuses new executions and keeps
//! the lines (in memory, up to `MAX_PENDING`, and in the spool on the local disk, below);
//! the writer reconnects and tries again each second, and once it commits, an
//! `audit_resumed` row comes first, as in the file.
//!
//! Every operation on the database, connecting included, has a deadline of airlock's own
//! (`Db`): a database whose processes are stopped still has its kernel take and acknowledge
//! what is sent, so neither TCP's timeouts nor the server's `statement_timeout` would end the
//! wait; the deadline does, the connection is dropped, and the writer sees a failure it
//! recovers from.
//!
//! A line the database has not confirmed that must outlive this process (an execution's
//! record before its answer goes, and every line kept while the database fails but the
//! `started` ones) is appended to `store-spool.jsonl` in the state directory and synced
//! (`Spool`); the writer replays the spool once it can write again, and the next start does
//! before it repairs anything, so a replica killed meanwhile loses no line and never records
//! an answered execution as interrupted.
//!
//! At start, the tables are made or migrated (`MIGRATIONS`, under an advisory lock, so that
//! replicas starting together migrate once), the spool is replayed, then this replica's
//! executions that started and never ended get their `interrupted` record, and its sessions
//! never closed are lost: the crash consistency of the file, through the database. Only this
//! replica's rows are repaired, so replicas need stable, distinct names (`replica`, a
//! StatefulSet's pod names).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use airlock_api::ExecutionRecord;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::audit_lines::{line_of, Recovery, StartedLine};
use crate::config::Config;

mod db;
mod rows;
mod schema;
mod spool;
mod writer;

use db::{connection, db_error, tls, Db, COMMIT_WAIT};
use schema::{migrate, recover};
use spool::Spool;
pub use spool::SPOOL_FILE;
use writer::{write_rows, Queue, Shared};

/// Lines kept while the database cannot be written; beyond this the oldest are lost (and
/// counted in the `audit_resumed` row). Executions are refused meanwhile.
const MAX_PENDING: usize = 100_000;
/// How long shutdown waits for the kept lines to be committed.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// Records served from memory without a query (this replica's most recent).
const RECENT: usize = 10_000;
/// Idle reading connections kept open.
const MAX_IDLE_READERS: usize = 4;

/// Records and audit lines in PostgreSQL.
pub struct PgLog {
    shared: Arc<Shared>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Settings to connect again with (reads).
    connect: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    /// Idle connections records are read with: a read takes one (or connects), so reads
    /// never wait for each other, nor all of them for one the database left hanging.
    readers: Mutex<Vec<Db>>,
    /// This replica's most recent records, by id.
    recent: Mutex<(HashMap<String, ExecutionRecord>, VecDeque<String>)>,
    lost_sessions: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for PgLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLog")
            .field("replica", &self.shared.replica)
            .finish_non_exhaustive()
    }
}

impl PgLog {
    /// Connects, makes or migrates the tables, replays the spool, and repairs what this
    /// replica left open. On a thread of its own: the client drives its connection with a
    /// runtime of its own, which cannot start on a thread of the server's.
    pub fn open(config: &Config) -> std::io::Result<(PgLog, Recovery)> {
        std::thread::scope(|s| {
            s.spawn(|| PgLog::open_here(config))
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("opening the store panicked")))
        })
    }

    fn open_here(config: &Config) -> std::io::Result<(PgLog, Recovery)> {
        let replica = config.replica.clone().ok_or_else(|| {
            std::io::Error::other(
                "store.url needs this server's replica name (replica, or AIRLOCK_REPLICA): \
                 each replica repairs only its own executions at start",
            )
        })?;
        let connect = connection(config)?;
        let tls = tls(config)?;
        let spool = Spool::open(&config.state_dir())?;
        let mut db = Db::connect(&connect, &tls)?;
        db.run("migrating", async |c| migrate(c).await)?;
        // What an earlier run answered and could not commit, before anything is repaired:
        // an execution whose record is spooled is not interrupted.
        spool.replay(&mut db)?;
        let (recovery, lost_sessions) = db.run("repairing this replica's rows", async |c| {
            recover(c, &replica).await
        })?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                next: 1,
                ..Queue::default()
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            replica,
            run: crate::keys::random_id("run_"),
            spool,
        });
        let writer = {
            let shared = shared.clone();
            let (connect, tls) = (connect.clone(), tls.clone());
            std::thread::Builder::new()
                .name("airlock-store".into())
                .spawn(move || write_rows(&shared, &connect, &tls, Some(db)))?
        };
        let log = PgLog {
            shared,
            writer: Mutex::new(Some(writer)),
            connect,
            tls,
            readers: Mutex::default(),
            recent: Mutex::default(),
            lost_sessions: Mutex::new(lost_sessions),
        };
        Ok((log, recovery))
    }

    /// Queues a line for the writer; its number.
    fn push(&self, line: Vec<u8>) -> std::io::Result<u64> {
        let mut queue = self.shared.lock();
        let row = self.shared.row(queue.next, line)?;
        queue.next += 1;
        if queue.rows.len() >= MAX_PENDING {
            if queue.lost == 0 {
                tracing::error!(
                    kept = MAX_PENDING,
                    "too many audit lines kept while PostgreSQL fails: the oldest are dropped \
                     from memory (counted in the audit_resumed row; the spool still has them)"
                );
            }
            queue.rows.pop_front();
            queue.lost += 1;
        }
        let n = row.n;
        queue.rows.push_back(row);
        self.shared.work.notify_one();
        Ok(n)
    }

    pub fn append(&self, record: &ExecutionRecord) -> std::io::Result<()> {
        {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            let (by_id, order) = &mut *recent;
            if by_id.insert(record.id.clone(), record.clone()).is_none() {
                order.push_back(record.id.clone());
                if order.len() > RECENT {
                    if let Some(old) = order.pop_front() {
                        by_id.remove(&old);
                    }
                }
            }
        }
        // Committed before the answer, as the file's line is written before it: a kill
        // then cannot make an answered execution `interrupted`. (`sync` is a file setting:
        // a commit is durable.) A commit that fails or is not confirmed in time is spooled
        // instead, also before the answer.
        let n = self.push(line_of(record)?)?;
        let Err(unconfirmed) = self.wait_committed(n, false) else {
            return Ok(());
        };
        let kept = self.shared.spool_kept().and_then(|()| {
            let queue = self.shared.lock();
            let spooled = match queue.rows.iter().find(|r| r.n == n) {
                Some(row) => row.spooled,
                None => queue.committed >= n,
            };
            if spooled {
                Ok(())
            } else {
                Err(std::io::Error::other("dropped: too many lines kept"))
            }
        });
        kept.map_err(|e| {
            tracing::error!(execution = %record.id, error = %e, "a record PostgreSQL did not take cannot be spooled either");
            std::io::Error::other(format!("{unconfirmed}; the spool: {e}"))
        })
    }

    /// Waits for line `n`'s commit: an error once the store fails, or when no commit came
    /// within `COMMIT_WAIT` (which makes the store failing until one does). With `withdraw`,
    /// a line not committed by then is taken back (a `started` line whose execution will not
    /// run), unless a batch in flight holds it.
    fn wait_committed(&self, n: u64, withdraw: bool) -> std::io::Result<()> {
        let deadline = std::time::Instant::now() + COMMIT_WAIT;
        let mut queue = self.shared.lock();
        while queue.committed < n {
            if let Some(why) = queue.failure.clone() {
                if withdraw {
                    self.withdraw(&mut queue, n, &why);
                }
                return Err(std::io::Error::other(why));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                let why = format!(
                    "PostgreSQL has not confirmed a commit in {} s",
                    COMMIT_WAIT.as_secs()
                );
                tracing::error!(error = %why, "refusing executions until it does");
                queue.failure = Some(why.clone());
                if withdraw {
                    self.withdraw(&mut queue, n, &why);
                }
                return Err(std::io::Error::other(why));
            }
            queue = self.shared.wait_done(queue, left);
        }
        Ok(())
    }

    /// Takes back `started` line `n` of an execution that will not run, and queues a
    /// `not_run` line for it: a batch whose commit was never confirmed (a lost acknowledgement,
    /// a database that answers late) may hold the line all the same, and the next start of
    /// this replica must not call the execution interrupted.
    fn withdraw(&self, queue: &mut Queue, n: u64, why: &str) {
        let Some(at) = queue.rows.iter().position(|r| r.n == n) else {
            return;
        };
        let Some(started) = queue.rows.remove(at) else {
            return;
        };
        let line = serde_json::json!({
            "event": "not_run",
            "at": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            "execution_id": started.execution_id,
            "key_fingerprint": started.key_fingerprint,
            "reason": why,
        });
        let row = self.shared.row(queue.next, line.to_string().into_bytes());
        let Ok(row) = row else {
            return;
        };
        queue.next += 1;
        queue.rows.push_back(row);
        self.shared.work.notify_one();
    }

    /// The execution runs only once its line is committed (lines of executions starting
    /// together share a commit); while the database fails, it does not run.
    pub fn append_started(&self, started: &StartedLine<'_>) -> std::io::Result<()> {
        if let Some(why) = self.failure() {
            return Err(std::io::Error::other(why));
        }
        let n = self.push(line_of(started)?)?;
        self.wait_committed(n, true).inspect_err(|_| {
            // Its `not_run` line outlives a kill, as the `started` line may have been taken.
            if let Err(e) = self.shared.spool_kept() {
                tracing::error!(error = %e, "cannot write the store's spool");
            }
        })
    }

    pub fn append_line(&self, line: Vec<u8>) -> std::io::Result<()> {
        self.push(line).map(|_| ())
    }

    pub fn failure(&self) -> Option<String> {
        self.shared.lock().failure.clone()
    }

    pub fn lost_sessions(&self) -> &Mutex<HashMap<String, String>> {
        &self.lost_sessions
    }

    /// Waits (a few seconds at most) for the queued lines to be committed, then stops the
    /// writer and spools what is left; why not all were, if they were not.
    pub fn write_kept(&self) -> Option<String> {
        let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
        let mut queue = self.shared.lock();
        while !queue.rows.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            queue = self.shared.wait_done(queue, left);
        }
        queue.stop = true;
        drop(queue);
        self.shared.work.notify_all();
        if let Some(writer) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = writer.join();
        }
        let (unwritten, why) = {
            let queue = self.shared.lock();
            (queue.rows.len(), queue.failure.clone())
        };
        if unwritten == 0 {
            return None;
        }
        let why = why.unwrap_or_else(|| "it did not answer in time".into());
        let kept = match self.shared.spool_kept() {
            Ok(()) => format!(
                "kept in {}, committed at the next start",
                self.shared.spool.path.display()
            ),
            Err(e) => format!("and the spool cannot be written: {e}"),
        };
        Some(format!(
            "{unwritten} audit lines not committed to PostgreSQL ({why}); {kept}"
        ))
    }

    /// A record by id: this replica's recent ones from memory, any other from the database.
    /// An error when the database cannot be read (not the same as no such record).
    pub fn get(&self, id: &str) -> std::io::Result<Option<ExecutionRecord>> {
        if let Some(record) = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .get(id)
        {
            return Ok(Some(record.clone()));
        }
        let idle = self.readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut db = match idle {
            Some(db) => db,
            None => Db::connect(&self.connect, &self.tls)?,
        };
        // On an error the connection is dropped.
        let line = db.run("reading a record", async |c| {
            let row = c
                .query_opt(
                    "SELECT line::text FROM airlock_audit WHERE execution_id = $1 AND event = 'record' \
                     ORDER BY seq DESC LIMIT 1",
                    &[&id],
                )
                .await
                .map_err(|e| db_error("reading a record", e))?;
            Ok(row.map(|r| r.get::<_, String>(0)))
        })?;
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        if readers.len() < MAX_IDLE_READERS {
            readers.push(db);
        }
        drop(readers);
        match line {
            None => Ok(None),
            Some(line) => serde_json::from_str(&line)
                .map(Some)
                .map_err(std::io::Error::other),
        }
    }
}

impl Drop for PgLog {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        // Closing a connection runs its own runtime, which cannot run on the server's threads.
        let readers = std::mem::take(self.readers.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !readers.is_empty() {
            let _ = std::thread::spawn(move || drop(readers)).join();
        }
    }
}
