//! Records and audit lines in PostgreSQL (`[store] url`), so that every replica serves every
//! record and a replica's disk holds nothing that matters.
//!
//! Each audit line is a row of `airlock_audit`: the replica that wrote it, its event
//! (`record`, `started`, `session_opened`, ...), the execution or session it is about, and
//! the line itself as `jsonb`, as the file would hold it. Rows are inserted by a thread of
//! its own, in batches: lines written while a batch commits share the next commit (group
//! commit, as the file's syncer does). A commit that fails refuses new executions and keeps
//! the lines (in memory, up to `MAX_PENDING`); the writer reconnects and tries again each
//! second, and once it commits, an `audit_resumed` row comes first, as in the file.
//!
//! At start, the tables are made or migrated (`MIGRATIONS`, under an advisory lock, so that
//! replicas starting together migrate once), then this replica's executions that started and
//! never ended get their `interrupted` record, and its sessions never closed are lost: the
//! crash consistency of the file, through the database. Only this replica's rows are
//! repaired, so replicas need stable, distinct names (`replica`, a StatefulSet's pod names).

use std::collections::{HashMap, VecDeque};
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use airlock_api::ExecutionRecord;
use postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::audit::{interrupted, line_of, Recovery, StartedLine};
use crate::config::Config;

/// Lines kept while the database cannot be written; beyond this the oldest are lost (and
/// counted in the `audit_resumed` row). Executions are refused meanwhile.
const MAX_PENDING: usize = 100_000;
/// Rows per insert.
const BATCH: usize = 500;
/// How long the writer waits between tries while the database fails.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How long a start or a read waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an execution waits for its `started` line or record to be committed before the
/// store counts as failing; also the bound on each statement and on unacknowledged data.
const COMMIT_WAIT: Duration = Duration::from_secs(10);
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

/// Whether `url` is a PostgreSQL connection string airlock accepts: parseable, and without
/// a password (which `--print-config` would show: `password_file` or
/// `AIRLOCK_STORE_PASSWORD` hold it).
pub fn check_url(url: &str) -> Result<(), String> {
    let config = postgres::Config::from_str(url).map_err(|e| e.to_string())?;
    if config.get_password().is_some() {
        return Err(
            "holds a password: put it in store.password_file or AIRLOCK_STORE_PASSWORD".into(),
        );
    }
    if config.get_hosts().is_empty() {
        return Err("names no host".into());
    }
    // `prefer` (also the default) lets anyone on the path answer "no TLS" and ask for the
    // password in the clear: only where the path is this host.
    let local = config.get_hosts().iter().all(|h| match h {
        postgres::config::Host::Tcp(name) => {
            name == "localhost"
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        postgres::config::Host::Unix(_) => true,
    });
    if !local && config.get_ssl_mode() == postgres::config::SslMode::Prefer {
        return Err(
            "names another host without sslmode=require: add ?sslmode=require (or \
                    sslmode=disable to send the password in the clear knowingly)"
                .into(),
        );
    }
    Ok(())
}

/// The connection settings: the URL, with the password from its file or the environment.
fn connection(config: &Config) -> std::io::Result<postgres::Config> {
    let url = config.store.url.as_deref().unwrap_or_default();
    let mut pg = postgres::Config::from_str(url).map_err(std::io::Error::other)?;
    let password = match &config.store.password_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
        ),
        None => std::env::var(crate::config::ENV_STORE_PASSWORD).ok(),
    };
    if let Some(password) = password {
        pg.password(password);
    }
    pg.connect_timeout(CONNECT_TIMEOUT);
    // A database that stops answering is a failure within seconds, not TCP's minutes.
    pg.tcp_user_timeout(COMMIT_WAIT);
    pg.keepalives_idle(Duration::from_secs(30));
    let options = pg.get_options().unwrap_or_default().to_owned();
    pg.options(&format!(
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

fn db_error(what: &str, e: postgres::Error) -> std::io::Error {
    // The server's own message (a constraint, a permission) says more than the error's kind.
    let detail = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_owned());
    std::io::Error::other(format!("PostgreSQL, {what}: {detail}"))
}

/// One audit line, with what its row is indexed by.
#[derive(Clone, Debug)]
struct Row {
    /// Its number in this run (what an answer waiting for its record waits for).
    n: u64,
    event: String,
    execution_id: Option<String>,
    session_id: Option<String>,
    key_fingerprint: Option<String>,
    line: String,
}

impl Row {
    fn of(n: u64, line: Vec<u8>) -> std::io::Result<Row> {
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
            key_fingerprint: text("key_fingerprint"),
            event,
            execution_id,
            session_id,
            line,
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
}

/// Records and audit lines in PostgreSQL.
pub struct PgLog {
    replica: String,
    shared: Arc<Shared>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Settings to connect again with (reads).
    connect: postgres::Config,
    tls: MakeRustlsConnect,
    /// Idle connections records are read with: a read takes one (or connects), so reads
    /// never wait for each other, nor all of them for one the database left hanging.
    readers: Mutex<Vec<Client>>,
    /// This replica's most recent records, by id.
    recent: Mutex<(HashMap<String, ExecutionRecord>, VecDeque<String>)>,
    lost_sessions: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for PgLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLog")
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl PgLog {
    /// Connects, makes or migrates the tables, and repairs what this replica left open. On
    /// a thread of its own: the client drives its connection with a runtime of its own,
    /// which cannot start on a thread of the server's.
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
        let mut client = connect
            .connect(tls.clone())
            .map_err(|e| db_error("connecting", e))?;
        migrate(&mut client)?;
        let (recovery, lost_sessions) = recover(&mut client, &replica)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                next: 1,
                ..Queue::default()
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let writer = {
            let (shared, replica) = (shared.clone(), replica.clone());
            let (connect, tls) = (connect.clone(), tls.clone());
            std::thread::Builder::new()
                .name("airlock-store".into())
                .spawn(move || write_rows(&shared, &replica, &connect, &tls, Some(client)))?
        };
        let log = PgLog {
            replica,
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
        let row = Row::of(queue.next, line)?;
        queue.next += 1;
        if queue.rows.len() >= MAX_PENDING {
            if queue.lost == 0 {
                tracing::error!(
                    kept = MAX_PENDING,
                    "too many audit lines kept while PostgreSQL fails: the oldest are dropped \
                     (counted in the audit_resumed row)"
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
        // a commit is durable.)
        let n = self.push(line_of(record)?)?;
        self.wait_committed(n, false)
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
        let row = Row {
            n: queue.next,
            event: "not_run".into(),
            line: line.to_string(),
            ..started
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
        self.wait_committed(n, true)
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
    /// writer; why not all were, if they were not.
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
        let unwritten = queue.rows.len();
        let why = queue.failure.clone();
        queue.stop = true;
        drop(queue);
        self.shared.work.notify_all();
        if let Some(writer) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = writer.join();
        }
        (unwritten > 0).then(|| {
            format!(
                "{unwritten} audit lines not committed to PostgreSQL: {}",
                why.unwrap_or_else(|| "it did not answer in time".into())
            )
        })
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
        let mut client = match idle {
            Some(client) => client,
            None => self
                .connect
                .connect(self.tls.clone())
                .map_err(|e| db_error("connecting to read a record", e))?,
        };
        let row = client
            .query_opt(
                "SELECT line::text FROM airlock_audit WHERE execution_id = $1 AND event = 'record' \
                 ORDER BY seq DESC LIMIT 1",
                &[&id],
            )
            .map_err(|e| db_error("reading a record", e))?; // the client is dropped
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        if readers.len() < MAX_IDLE_READERS {
            readers.push(client);
        }
        drop(readers);
        match row {
            None => Ok(None),
            Some(row) => serde_json::from_str(row.get::<_, &str>(0))
                .map(Some)
                .map_err(std::io::Error::other),
        }
    }
}

impl Drop for PgLog {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        // Closing a client runs its own runtime, which cannot start on the server's threads.
        let readers = std::mem::take(self.readers.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !readers.is_empty() {
            let _ = std::thread::spawn(move || drop(readers)).join();
        }
    }
}

/// Makes or migrates the tables, once even when several replicas start together.
fn migrate(client: &mut Client) -> std::io::Result<()> {
    let mut tx = client.transaction().map_err(|e| db_error("migrating", e))?;
    tx.batch_execute(
        "SET LOCAL client_min_messages = warning;
         SELECT pg_advisory_xact_lock(hashtext('airlock-migrations'));
         CREATE TABLE IF NOT EXISTS airlock_migrations (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .map_err(|e| db_error("migrating", e))?;
    let applied: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM airlock_migrations",
            &[],
        )
        .map_err(|e| db_error("migrating", e))?
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
            .map_err(|e| db_error(&format!("migration {version}"), e))?;
        tx.execute(
            "INSERT INTO airlock_migrations (version) VALUES ($1)",
            &[&version],
        )
        .map_err(|e| db_error("migrating", e))?;
        tracing::info!(version, "PostgreSQL store migrated");
    }
    tx.commit().map_err(|e| db_error("migrating", e))
}

/// This replica's executions that started and never ended get their `interrupted` record;
/// its sessions opened and never closed are lost (id to key fingerprint).
fn recover(
    client: &mut Client,
    replica: &str,
) -> std::io::Result<(Recovery, HashMap<String, String>)> {
    let err = |e| db_error("repairing this replica's rows", e);
    let mut tx = client.transaction().map_err(err)?;
    // Two servers given one name would otherwise both repair it.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('airlock-replica:' || $1))",
        &[&replica],
    )
    .map_err(err)?;
    let open = tx
        .query(
            "SELECT s.line::text FROM airlock_audit s WHERE s.replica = $1 AND s.event = 'started' \
             AND NOT EXISTS (SELECT 1 FROM airlock_audit r WHERE r.execution_id = s.execution_id \
             AND r.event IN ('record', 'not_run')) ORDER BY s.seq",
            &[&replica],
        )
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
    tx.commit().map_err(err)?;
    Ok((recovery, lost))
}

/// The writer: commits queued lines in batches until stopped, connecting again while the
/// database fails.
fn write_rows(
    shared: &Shared,
    replica: &str,
    connect: &postgres::Config,
    tls: &MakeRustlsConnect,
    client: Option<Client>,
) {
    let mut client = client;
    // This run's lines are `<run>:<n>` in `line_key`.
    let run = crate::keys::random_id("run_");
    // Set while commits fail: the first that works writes an `audit_resumed` row first.
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
        let resumed = failed_since.as_ref().map(|why| {
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
                event: "audit_resumed".into(),
                execution_id: None,
                session_id: None,
                key_fingerprint: None,
                line: line.to_string(),
            }
        });
        let result = match &mut client {
            Some(c) => insert(c, replica, &run, resumed.iter().chain(&batch)),
            None => connect
                .connect(tls.clone())
                .map_err(|e| db_error("connecting", e))
                .and_then(|mut c| {
                    let r = insert(&mut c, replica, &run, resumed.iter().chain(&batch));
                    client = Some(c);
                    r
                }),
        };
        let mut queue = shared.lock();
        match result {
            Ok(()) => {
                let last = batch.last().map_or(0, |r| r.n);
                while queue.rows.front().is_some_and(|r| r.n <= last) {
                    queue.rows.pop_front();
                }
                queue.committed = queue.committed.max(last);
                // A failure may also be a waiter's (no commit in time): a commit ends it.
                if failed_since.take().is_some() || queue.failure.is_some() {
                    tracing::warn!("PostgreSQL can be written again; executions resume");
                    queue.failure = None;
                    queue.lost = 0;
                }
                shared.done.notify_all();
            }
            Err(e) => {
                if queue.failure.is_none() {
                    tracing::error!(error = %e, "cannot write audit lines to PostgreSQL; refusing executions until it can");
                }
                let why = e.to_string();
                queue.failure = Some(why.clone());
                failed_since.get_or_insert(why);
                client = None;
                shared.done.notify_all();
                if !queue.stop {
                    drop(
                        shared
                            .work
                            .wait_timeout(queue, RETRY_EVERY)
                            .unwrap_or_else(|e| e.into_inner()),
                    );
                } else {
                    return;
                }
            }
        }
    }
}

/// Inserts rows in one statement and one transaction; a batch sent again after a lost
/// acknowledgement adds nothing (`line_key`). A row the database refuses as data (SQLSTATE
/// class 22, which NUL replacement should leave none of) is stored as an `audit_unstorable`
/// row holding its text, so that one line can never stop the writer.
fn insert<'a>(
    client: &mut Client,
    replica: &str,
    run: &str,
    rows: impl Iterator<Item = &'a Row> + Clone,
) -> std::io::Result<()> {
    match insert_all(client, replica, run, rows.clone()) {
        Err(e) if e.code().is_some_and(|c| c.code().starts_with("22")) => {
            for row in rows {
                if let Err(e) = insert_all(client, replica, run, std::iter::once(row)) {
                    if !e.code().is_some_and(|c| c.code().starts_with("22")) {
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
                        ..row.clone()
                    };
                    insert_all(client, replica, run, std::iter::once(&stand_in))
                        .map_err(|e| db_error("writing audit lines", e))?;
                }
            }
            Ok(())
        }
        other => other.map_err(|e| db_error("writing audit lines", e)),
    }
}

fn insert_all<'a>(
    client: &mut Client,
    replica: &str,
    run: &str,
    rows: impl Iterator<Item = &'a Row>,
) -> Result<(), postgres::Error> {
    let mut columns: [Vec<Option<String>>; 6] = Default::default();
    for row in rows {
        columns[0].push(Some(row.event.clone()));
        columns[1].push(row.execution_id.clone());
        columns[2].push(row.session_id.clone());
        columns[3].push(row.key_fingerprint.clone());
        columns[4].push(Some(row.line.clone()));
        // The `audit_resumed` row (number 0) has no key: NULLs never conflict.
        columns[5].push((row.n > 0).then(|| format!("{run}:{}", row.n)));
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
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_which_jsonb_refuses_becomes_a_replacement_character_keys_included() {
        let line = br#"{"event":"tool_call","execution_id":"ex_a","tool":"x\u0000y","args":{"k\u0000":["\u0000"]}}"#;
        let row = Row::of(7, line.to_vec()).unwrap();
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
        let row = Row::of(8, text.to_vec()).unwrap();
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
            };
            // The line as the file holds it, then as a row.
            Row::of(1, line_of(&record).unwrap()).unwrap()
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
    fn a_url_for_another_host_must_require_tls() {
        assert!(check_url("postgres://airlock@127.0.0.1:5432/db").is_ok());
        assert!(check_url("postgres://airlock@localhost/db").is_ok());
        assert!(check_url("postgres://airlock@db.internal/db?sslmode=require").is_ok());
        assert!(check_url("postgres://airlock@db.internal/db?sslmode=disable").is_ok());
        let err = check_url("postgres://airlock@db.internal/db").unwrap_err();
        assert!(err.contains("sslmode=require"), "{err}");
        assert!(check_url("postgres://airlock:pw@127.0.0.1/db")
            .unwrap_err()
            .contains("password"));
    }
}
