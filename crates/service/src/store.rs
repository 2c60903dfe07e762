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

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use airlock_api::ExecutionRecord;
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::audit_lines::{cut_torn_tail, interrupted, line_of, Recovery, StartedLine};
use crate::config::Config;

/// Lines kept while the database cannot be written; beyond this the oldest are lost (and
/// counted in the `audit_resumed` row). Executions are refused meanwhile.
const MAX_PENDING: usize = 100_000;
/// Rows per insert.
const BATCH: usize = 500;
/// How long the writer waits between tries while the database fails (the file's cadence,
/// which a refusal's `Retry-After` tells clients).
const RETRY_EVERY: Duration = crate::audit_lines::RETRY_EVERY;
/// The most connecting may take, TLS and authentication included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an execution waits for its `started` line or record to be committed before the
/// store counts as failing; also the bound on each statement and on unacknowledged data.
const COMMIT_WAIT: Duration = Duration::from_secs(10);
/// The most any one operation on a connection may take (a batch's insert, a read, a step of
/// the start) before the connection is dropped: airlock's own clock, which a stopped server
/// cannot hold up.
const OPERATION_DEADLINE: Duration = COMMIT_WAIT;
/// How long a connection that is let go gets to say goodbye.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// The spool's file in the state directory.
pub const SPOOL_FILE: &str = "store-spool.jsonl";
/// Sessions lost at a restart are answered 410 for this long after they were opened.
const LOST_SESSIONS_DAYS: i32 = 7;
/// How long shutdown waits for the kept lines to be committed.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// Records served from memory without a query (this replica's most recent).
const RECENT: usize = 10_000;
/// Idle reading connections kept open.
const MAX_IDLE_READERS: usize = 4;

/// The schema, one step per version; a step never changes once released. Applied in order,
/// each in the transaction that records it in `airlock_migrations`.
const MIGRATIONS: &[&str] = &["
    CREATE TABLE airlock_audit (
        seq bigserial PRIMARY KEY,
        replica text NOT NULL,
        written_at timestamptz NOT NULL DEFAULT now(),
        event text NOT NULL,
        execution_id text,
        session_id text,
        key_fingerprint text,
        line jsonb NOT NULL,
        -- The run that wrote it and its number there: a batch sent again after its commit's
        -- acknowledgement was lost is not stored twice.
        line_key text UNIQUE
    );
    CREATE INDEX airlock_audit_execution ON airlock_audit (execution_id, event)
        WHERE execution_id IS NOT NULL;
    CREATE INDEX airlock_audit_session ON airlock_audit (session_id, event)
        WHERE session_id IS NOT NULL;
    CREATE INDEX airlock_audit_replica ON airlock_audit (replica, event);
"];

/// The connection settings: the URL, with the password from its file, else the one the binary
/// gave (`AIRLOCK_STORE_PASSWORD`).
fn connection(config: &Config) -> std::io::Result<tokio_postgres::Config> {
    let url = config.store.url.as_deref().unwrap_or_default();
    let mut pg = tokio_postgres::Config::from_str(url).map_err(std::io::Error::other)?;
    let password = match &config.store.password_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
        ),
        None => config.store.password.as_ref().map(|p| p.text().to_owned()),
    };
    if let Some(password) = password {
        pg.password(password);
    }
    pg.connect_timeout(CONNECT_TIMEOUT);
    // A host that vanishes is a failure within seconds, not TCP's minutes: data unacknowledged
    // for 10 s, or an idle connection whose probes go unanswered for about 16 s, ends the
    // connection. (A stopped server's kernel still answers both: `Db`'s deadlines cover it.)
    pg.tcp_user_timeout(COMMIT_WAIT);
    pg.keepalives_idle(Duration::from_secs(10));
    pg.keepalives_interval(Duration::from_secs(2));
    pg.keepalives_retries(3);
    let options = pg.get_options().unwrap_or_default().to_owned();
    pg.options(format!(
        "{options} -c statement_timeout={}",
        COMMIT_WAIT.as_millis()
    ));
    if pg.get_application_name().is_none() {
        pg.application_name("airlock");
    }
    Ok(pg)
}

/// TLS to the database: its certificate verified against the system's authorities and
/// `store.ca_file`'s, its name against the URL's host. Used when the server offers TLS (the
/// URL's `sslmode=prefer`, the default), required with `sslmode=require`.
fn tls(config: &Config) -> std::io::Result<MakeRustlsConnect> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = &config.store.ca_file {
        let named = |e: &dyn std::fmt::Display| {
            std::io::Error::other(format!("store.ca_file {}: {e}", path.display()))
        };
        let pem = std::fs::read(path).map_err(|e| named(&e))?;
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            roots
                .add(cert.map_err(|e| named(&e))?)
                .map_err(|e| named(&e))?;
            added += 1;
        }
        if added == 0 {
            return Err(named(&"holds no PEM certificate"));
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(tls))
}

fn db_error(what: &str, e: tokio_postgres::Error) -> std::io::Error {
    // The server's own message (a constraint, a permission) says more than the error's kind.
    let detail = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_owned());
    std::io::Error::other(format!("PostgreSQL, {what}: {detail}"))
}

/// An operation that ran out of time.
fn late(what: &str, after: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("PostgreSQL, {what}: no answer in {} s", after.as_secs()),
    )
}

/// One connection, each operation on it bounded by `OPERATION_DEADLINE` (connecting by
/// `CONNECT_TIMEOUT`), after which it is dropped: its caller sees an error and connects
/// again. The client runs on a current-thread runtime of its own, driven only while an
/// operation waits, so a `Db` is used and dropped only on threads that are not the server's
/// (the writer's, the blocking pool's, a scoped thread at start).
struct Db {
    client: Option<Client>,
    connection: Option<tokio::task::JoinHandle<()>>,
    /// An operation ran out of time: the connection is closed at once, without a goodbye.
    abandoned: bool,
    /// Dropped last: with it go the connection's task and its socket.
    runtime: tokio::runtime::Runtime,
}

impl Db {
    fn connect(config: &tokio_postgres::Config, tls: &MakeRustlsConnect) -> std::io::Result<Db> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // `connect_timeout` bounds only the TCP handshake, which a stopped server's kernel
        // completes; the startup and authentication after it get the same bound here.
        // (A timer is made inside the runtime.)
        let connecting =
            async { tokio::time::timeout(CONNECT_TIMEOUT, config.connect(tls.clone())).await };
        let (client, connection) = match runtime.block_on(connecting) {
            Ok(connected) => connected.map_err(|e| db_error("connecting", e))?,
            Err(_) => return Err(late("connecting", CONNECT_TIMEOUT)),
        };
        let connection = runtime.spawn(async move {
            let _ = connection.await;
        });
        Ok(Db {
            client: Some(client),
            connection: Some(connection),
            abandoned: false,
            runtime,
        })
    }

    /// Runs `op` on the connection: its error, or one when it did not end within
    /// `OPERATION_DEADLINE` (the connection must then be dropped).
    fn run<T>(
        &mut self,
        what: &str,
        op: impl AsyncFnOnce(&mut Client) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let Some(client) = self.client.as_mut() else {
            return Err(std::io::Error::other(
                "PostgreSQL: the connection is closed",
            ));
        };
        match self
            .runtime
            .block_on(async { tokio::time::timeout(OPERATION_DEADLINE, op(client)).await })
        {
            Ok(done) => done,
            Err(_) => {
                self.abandoned = true;
                Err(late(what, OPERATION_DEADLINE))
            }
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        // Without its client, the connection says goodbye (`Terminate`) and closes, unless
        // an answer is still awaited: one abandoned is closed at once, with the runtime.
        drop(self.client.take());
        if let Some(connection) = self.connection.take().filter(|_| !self.abandoned) {
            let _ = self
                .runtime
                .block_on(async { tokio::time::timeout(CLOSE_WAIT, connection).await });
        }
    }
}

/// Lines the database has not confirmed, on the local disk: `store-spool.jsonl` in the state
/// directory (mode 0600), one JSON object a line (`replica`, `key`: the row's `line_key`,
/// `line`), synced before anyone relies on it. See the module's docs for what goes there.
/// Replaying adds nothing twice: a line already committed has its `line_key` taken. Every
/// process with this state directory and store (`airlock serve`, an `airlock mcp` beside it)
/// shares the file: each change to it holds an exclusive `flock`, so that one's replay never
/// empties a line another has just appended.
#[derive(Debug)]
struct Spool {
    path: PathBuf,
    file: Mutex<SpoolFile>,
}

#[derive(Debug)]
struct SpoolFile {
    file: File,
}

/// The spool's file locked against the other processes that share it, until dropped: a
/// `flock` on a second descriptor of the same open file.
fn exclusive(file: &File) -> std::io::Result<nix::fcntl::Flock<File>> {
    nix::fcntl::Flock::lock(file.try_clone()?, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::from(e))
}

/// One spooled line as read back.
#[derive(serde::Deserialize)]
struct Spooled<'a> {
    replica: String,
    key: String,
    #[serde(borrow)]
    line: &'a serde_json::value::RawValue,
}

impl Spool {
    /// Opens (or creates) the spool in `dir`, a last line cut short (a crash mid-write: no
    /// answer waited on it) cut off.
    fn open(dir: &Path) -> std::io::Result<Spool> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(SPOOL_FILE);
        let named = |e: std::io::Error| {
            std::io::Error::new(
                e.kind(),
                format!("the store's spool {}: {e}", path.display()),
            )
        };
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(named)?;
        let held = exclusive(&file).map_err(named)?;
        let torn = cut_torn_tail(&mut file).map_err(named)?;
        drop(held);
        if torn > 0 {
            tracing::warn!(bytes = torn, path = %path.display(), "cut a torn last line off the store's spool");
        }
        Ok(Spool {
            path,
            file: Mutex::new(SpoolFile { file }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SpoolFile> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `rows` in one write and syncs them.
    fn append(spool: &mut SpoolFile, replica: &str, rows: &[Row]) -> std::io::Result<()> {
        let mut text = Vec::new();
        for row in rows {
            let key = row.key.as_deref().unwrap_or_default();
            // `line` is JSON already (a row's line is what jsonb takes): kept as it is.
            writeln!(
                text,
                "{{\"replica\":{},\"key\":{},\"line\":{}}}",
                serde_json::Value::from(replica),
                serde_json::Value::from(key),
                row.line
            )?;
        }
        let _held = exclusive(&spool.file)?;
        let before = spool.file.metadata()?.len();
        if let Err(e) = (&spool.file).write_all(&text) {
            let _ = spool.file.set_len(before);
            return Err(e);
        }
        spool.file.sync_data()
    }

    /// Every line it holds, with the replica that wrote it, oldest first.
    fn read(&self) -> std::io::Result<Vec<(String, Row)>> {
        let text = std::fs::read_to_string(&self.path)?;
        let mut rows = Vec::new();
        for line in text.lines() {
            let read = serde_json::from_str::<Spooled<'_>>(line)
                .map_err(std::io::Error::other)
                .and_then(|s| {
                    let row = Row::of(0, Some(s.key), s.line.get().as_bytes().to_vec())?;
                    Ok((s.replica, row))
                });
            match read {
                Ok(row) => rows.push(row),
                Err(e) => {
                    tracing::error!(error = %e, "a line of the store's spool cannot be read; skipped")
                }
            }
        }
        Ok(rows)
    }

    /// Commits every spooled line through `db`, in order, then empties the spool; how many.
    fn replay(&self, db: &mut Db) -> std::io::Result<u64> {
        let spool = self.lock();
        let _held = exclusive(&spool.file)?;
        if spool.file.metadata()?.len() == 0 {
            return Ok(0);
        }
        let rows = self.read()?;
        for batch in rows.chunks(BATCH) {
            for same in batch.chunk_by(|a, b| a.0 == b.0) {
                let replica = &same[0].0;
                let rows: Vec<&Row> = same.iter().map(|(_, row)| row).collect();
                db.run("replaying the spool", async |c| {
                    insert(c, replica, &rows).await
                })?;
            }
        }
        spool.file.set_len(0)?;
        spool.file.sync_data()?;
        let replayed = rows.len() as u64;
        tracing::warn!(
            lines = replayed,
            "audit lines kept in the store's spool are committed to PostgreSQL"
        );
        Ok(replayed)
    }
}

/// One audit line, with what its row is indexed by.
#[derive(Clone, Debug)]
struct Row {
    /// Its number in this run (what an answer waiting for its record waits for).
    n: u64,
    /// Its `line_key`, `<run>:<n>`, which makes sending it again harmless; None for the
    /// `audit_resumed` row (NULLs never conflict).
    key: Option<String>,
    event: String,
    execution_id: Option<String>,
    session_id: Option<String>,
    key_fingerprint: Option<String>,
    line: String,
    /// Written to the spool and synced.
    spooled: bool,
}

impl Row {
    fn of(n: u64, key: Option<String>, line: Vec<u8>) -> std::io::Result<Row> {
        let mut line = String::from_utf8(line).map_err(std::io::Error::other)?;
        line.truncate(line.trim_end().len());
        let mut value: serde_json::Value = serde_json::from_str(&line)?;
        // jsonb refuses NUL in a string, and a sandbox chooses some strings (a tool's name):
        // U+FFFD stands for it, as nothing else may make a line unstorable.
        if line.contains("\\u0000") {
            replace_nul(&mut value);
            line = value.to_string();
        }
        let text = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        let event = text("event").unwrap_or_else(|| "record".to_owned());
        let (execution_id, session_id) = match event.as_str() {
            "record" | "started" => (text("id"), None),
            e if e.starts_with("session_") => (None, text("id")),
            // An egress connection names its execution, its session, or both.
            _ => (text("execution_id"), text("session_id")),
        };
        Ok(Row {
            n,
            key,
            key_fingerprint: text("key_fingerprint"),
            event,
            execution_id,
            session_id,
            line,
            spooled: false,
        })
    }
}

/// Every NUL in `value`'s strings and keys, replaced by U+FFFD.
fn replace_nul(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) => *s = s.replace('\0', "\u{FFFD}"),
        Value::Array(items) => items.iter_mut().for_each(replace_nul),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (k, mut v) in entries {
                replace_nul(&mut v);
                map.insert(k.replace('\0', "\u{FFFD}"), v);
            }
        }
        _ => {}
    }
}

#[derive(Debug, Default)]
struct Queue {
    /// Lines not yet committed, oldest first (those of the batch in flight included).
    rows: VecDeque<Row>,
    /// The number the next line gets.
    next: u64,
    /// Every line numbered up to this one is committed.
    committed: u64,
    /// Why the last commit failed; None once one works.
    failure: Option<String>,
    /// Lines dropped because too many were kept.
    lost: u64,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    /// The writer waits on it for lines (and stop).
    work: Condvar,
    /// Waiters for a commit (an answer, shutdown) wait on it.
    done: Condvar,
    /// This replica's name, in every row.
    replica: String,
    /// This run's lines are `<run>:<n>` in `line_key`.
    run: String,
    /// Taken before `queue` by whoever takes both.
    spool: Spool,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits at most `left` for a commit (or a failure) to be announced.
    fn wait_done<'a>(
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
    fn row(&self, n: u64, line: Vec<u8>) -> std::io::Result<Row> {
        Row::of(n, Some(format!("{}:{n}", self.run)), line)
    }

    /// Writes to the spool the kept lines not yet in it, and syncs them. `started`
    /// lines stay out: an execution runs only once its line is committed, and one whose line
    /// is not would be taken for interrupted (its `not_run` row, which is spooled, says why).
    fn spool_kept(&self) -> std::io::Result<()> {
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

/// Makes or migrates the tables, once even when several replicas start together.
async fn migrate(client: &mut Client) -> std::io::Result<()> {
    let err = |e| db_error("migrating", e);
    let tx = client.transaction().await.map_err(err)?;
    tx.batch_execute(
        "SET LOCAL client_min_messages = warning;
         SELECT pg_advisory_xact_lock(hashtext('airlock-migrations'));
         CREATE TABLE IF NOT EXISTS airlock_migrations (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await
    .map_err(err)?;
    let applied: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM airlock_migrations",
            &[],
        )
        .await
        .map_err(err)?
        .get(0);
    let known = MIGRATIONS.len() as i32;
    if applied > known {
        return Err(std::io::Error::other(format!(
            "the database's airlock tables are at version {applied}, made by a newer airlock; \
             this one knows up to {known}"
        )));
    }
    for (version, step) in (1..).zip(MIGRATIONS).skip(applied as usize) {
        tx.batch_execute(step)
            .await
            .map_err(|e| db_error(&format!("migration {version}"), e))?;
        tx.execute(
            "INSERT INTO airlock_migrations (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(err)?;
        tracing::info!(version, "PostgreSQL store migrated");
    }
    tx.commit().await.map_err(err)
}

/// This replica's executions that started and never ended get their `interrupted` record;
/// its sessions opened and never closed are lost (id to key fingerprint).
async fn recover(
    client: &mut Client,
    replica: &str,
) -> std::io::Result<(Recovery, HashMap<String, String>)> {
    let err = |e| db_error("repairing this replica's rows", e);
    let tx = client.transaction().await.map_err(err)?;
    // Two servers given one name would otherwise both repair it.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('airlock-replica:' || $1))",
        &[&replica],
    )
    .await
    .map_err(err)?;
    let open = tx
        .query(
            "SELECT s.line::text FROM airlock_audit s WHERE s.replica = $1 AND s.event = 'started' \
             AND NOT EXISTS (SELECT 1 FROM airlock_audit r WHERE r.execution_id = s.execution_id \
             AND r.event IN ('record', 'not_run')) ORDER BY s.seq",
            &[&replica],
        )
        .await
        .map_err(err)?;
    let mut recovery = Recovery::default();
    for row in open {
        let Ok(started) = serde_json::from_str::<StartedLine<'_>>(row.get::<_, &str>(0)) else {
            continue;
        };
        let record = interrupted(started);
        let line = String::from_utf8(line_of(&record)?).map_err(std::io::Error::other)?;
        tx.execute(
            "INSERT INTO airlock_audit (replica, event, execution_id, key_fingerprint, line) \
             VALUES ($1, 'record', $2, $3, $4::text::jsonb)",
            &[
                &replica,
                &record.id,
                &record.key_fingerprint,
                &line.trim_end(),
            ],
        )
        .await
        .map_err(err)?;
        recovery.interrupted.push(record.id);
    }
    let sessions = tx
        .query(
            "SELECT o.session_id, o.key_fingerprint FROM airlock_audit o WHERE o.replica = $1 \
             AND o.event = 'session_opened' AND o.written_at > now() - make_interval(days => $2) \
             AND NOT EXISTS (SELECT 1 FROM airlock_audit c \
             WHERE c.session_id = o.session_id AND c.event = 'session_closed')",
            &[&replica, &LOST_SESSIONS_DAYS],
        )
        .await
        .map_err(err)?;
    let lost: HashMap<String, String> = sessions
        .iter()
        .filter_map(|r| {
            Some((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, Option<String>>(1)?,
            ))
        })
        .collect();
    recovery.lost_sessions = lost.len();
    tx.commit().await.map_err(err)?;
    Ok((recovery, lost))
}

/// The writer: commits queued lines in batches until stopped, connecting again while the
/// database fails. Once it can write, the spool is replayed before the batch.
fn write_rows(
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

/// Inserts rows in one statement and one transaction; a batch sent again after a lost
/// acknowledgement adds nothing (`line_key`). A row the database refuses as data (SQLSTATE
/// class 22, which NUL replacement should leave none of) is stored as an `audit_unstorable`
/// row holding its text, so that one line can never stop the writer.
async fn insert(client: &Client, replica: &str, rows: &[&Row]) -> std::io::Result<()> {
    let refused_as_data =
        |e: &tokio_postgres::Error| e.code().is_some_and(|c| c.code().starts_with("22"));
    match insert_all(client, replica, rows).await {
        Err(e) if refused_as_data(&e) => {
            for row in rows {
                if let Err(e) = insert_all(client, replica, &[*row]).await {
                    if !refused_as_data(&e) {
                        return Err(db_error("writing audit lines", e));
                    }
                    let text = row.line.replace('\0', "\u{FFFD}");
                    let line = serde_json::json!({
                        "event": "audit_unstorable",
                        "error": db_error("storing a line", e).to_string(),
                        "text": text,
                    });
                    let stand_in = Row {
                        event: "audit_unstorable".into(),
                        line: line.to_string(),
                        ..Row::clone(row)
                    };
                    insert_all(client, replica, &[&stand_in])
                        .await
                        .map_err(|e| db_error("writing audit lines", e))?;
                }
            }
            Ok(())
        }
        other => other.map_err(|e| db_error("writing audit lines", e)),
    }
}

async fn insert_all(
    client: &Client,
    replica: &str,
    rows: &[&Row],
) -> Result<(), tokio_postgres::Error> {
    let mut columns: [Vec<Option<String>>; 6] = Default::default();
    for row in rows {
        columns[0].push(Some(row.event.clone()));
        columns[1].push(row.execution_id.clone());
        columns[2].push(row.session_id.clone());
        columns[3].push(row.key_fingerprint.clone());
        columns[4].push(Some(row.line.clone()));
        columns[5].push(row.key.clone());
    }
    let [event, execution, session, fingerprint, line, key] = &columns;
    client
        .execute(
            "INSERT INTO airlock_audit (replica, event, execution_id, session_id, key_fingerprint, line, line_key) \
             SELECT $1, e, x, s, k, l::jsonb, lk FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) \
             WITH ORDINALITY AS t(e, x, s, k, l, lk, o) ORDER BY o \
             ON CONFLICT (line_key) DO NOTHING",
            &[&replica, event, execution, session, fingerprint, line, key],
        )
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_which_jsonb_refuses_becomes_a_replacement_character_keys_included() {
        let line = br#"{"event":"tool_call","execution_id":"ex_a","tool":"x\u0000y","args":{"k\u0000":["\u0000"]}}"#;
        let row = Row::of(7, None, line.to_vec()).unwrap();
        assert!(!row.line.contains("\\u0000"), "{}", row.line);
        let value: serde_json::Value = serde_json::from_str(&row.line).unwrap();
        assert_eq!(value["tool"], "x\u{FFFD}y");
        assert_eq!(value["args"]["k\u{FFFD}"][0], "\u{FFFD}");
        assert_eq!(
            (row.n, row.event.as_str(), row.execution_id.as_deref()),
            (7, "tool_call", Some("ex_a"))
        );
        // A backslash before "u0000" is text, not NUL: left as it is.
        let text = br#"{"event":"tool_call","tool":"a\\u0000"}"#;
        let row = Row::of(8, None, text.to_vec()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&row.line).unwrap();
        assert_eq!(value["tool"], "a\\u0000");
    }

    #[test]
    fn an_egress_line_is_indexed_by_its_execution_and_its_session() {
        let record = |execution: Option<&str>, session: Option<&str>| {
            let record = airlock_egress::ConnectionRecord {
                event: "egress",
                execution_id: execution.map(str::to_owned),
                session_id: session.map(str::to_owned),
                between_cells: execution.is_none(),
                key: "k".into(),
                method: "GET".into(),
                host: "example.com".into(),
                port: 80,
                address: None,
                outcome: "allowed",
                reason: None,
                detail: None,
                bytes_out: 0,
                bytes_in: 0,
                duration_ms: 0,
                credential: None,
                requests: None,
            };
            // The line as the file holds it, then as a row.
            Row::of(1, None, line_of(&record).unwrap()).unwrap()
        };
        let between = record(None, Some("se_a"));
        assert_eq!(
            (
                between.execution_id.as_deref(),
                between.session_id.as_deref()
            ),
            (None, Some("se_a"))
        );
        let line: serde_json::Value = serde_json::from_str(&between.line).unwrap();
        assert_eq!(line["between_cells"], true);
        let cell = record(Some("ex_b"), Some("se_a"));
        assert_eq!(
            (cell.execution_id.as_deref(), cell.session_id.as_deref()),
            (Some("ex_b"), Some("se_a"))
        );
        let line: serde_json::Value = serde_json::from_str(&cell.line).unwrap();
        assert!(line.get("between_cells").is_none(), "{line}");
        let execution = record(Some("ex_c"), None);
        assert_eq!(
            (
                execution.execution_id.as_deref(),
                execution.session_id.as_deref()
            ),
            (Some("ex_c"), None)
        );
    }

    #[test]
    fn the_spool_gives_back_what_was_synced_and_cuts_a_line_torn_by_a_crash() {
        let dir = std::env::temp_dir().join(format!(
            "airlock-spool-{}-{}",
            std::process::id(),
            crate::keys::random_id("")
        ));
        let spool = Spool::open(&dir).unwrap();
        let record = br#"{"id":"ex_r0_1","status":"ok","key_fingerprint":"f"}"#;
        let rows = [
            Row::of(3, Some("run_a:3".into()), record.to_vec()).unwrap(),
            Row::of(
                4,
                Some("run_a:4".into()),
                br#"{"event":"not_run","execution_id":"ex_r0_2"}"#.to_vec(),
            )
            .unwrap(),
        ];
        Spool::append(&mut spool.lock(), "r0", &rows).unwrap();
        drop(spool);
        // A crash in the middle of the next write leaves a torn line: cut at the next open.
        let path = dir.join(SPOOL_FILE);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"replica":"r0","key":"run_a:5","li"#)
            .unwrap();
        let spool = Spool::open(&dir).unwrap();
        let back = spool.read().unwrap();
        let got: Vec<_> = back
            .iter()
            .map(|(replica, r)| {
                (
                    replica.as_str(),
                    r.key.as_deref(),
                    r.event.as_str(),
                    r.execution_id.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("r0", Some("run_a:3"), "record", Some("ex_r0_1")),
                ("r0", Some("run_a:4"), "not_run", Some("ex_r0_2")),
            ]
        );
        assert_eq!(back[0].1.key_fingerprint.as_deref(), Some("f"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two processes on one state directory (the server and an `airlock mcp`) open the spool
    /// each on its own: a change by one waits while the other holds the file, so a replay
    /// never empties what the other was appending.
    #[test]
    fn the_spool_s_file_is_changed_by_one_opening_at_a_time() {
        let dir = std::env::temp_dir().join(format!(
            "airlock-spool-{}-{}",
            std::process::id(),
            crate::keys::random_id("")
        ));
        let (one, other) = (Spool::open(&dir).unwrap(), Spool::open(&dir).unwrap());
        let held = exclusive(&one.lock().file).unwrap();
        let row = Row::of(
            1,
            Some("run_b:1".into()),
            br#"{"id":"ex_r1_1","status":"ok"}"#.to_vec(),
        )
        .unwrap();
        let appending = std::thread::spawn(move || {
            Spool::append(&mut other.lock(), "r1", &[row]).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !appending.is_finished(),
            "appended while the other held the file"
        );
        assert!(one.read().unwrap().is_empty());
        drop(held);
        appending.join().unwrap();
        let back = one.read().unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].1.key.as_deref(), Some("run_b:1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
