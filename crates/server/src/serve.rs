//! Listening, connections and shutdown.
//!
//! Each connection is HTTP/1.1 through hyper, with a header read timeout (slowloris; it also
//! closes idle keep-alive connections), the wire guard (`wire.rs`) and a cap on open
//! connections where a new connection displaces the oldest idle one. On SIGTERM or SIGINT the server stops accepting, refuses new executions, lets
//! running ones finish for `shutdown_grace_ms`, then kills their sandboxes and exits.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

use airlock_engine::Engine;

use crate::http::app;
use crate::http::error::IntoHttp;
use crate::http::guard::Authenticated;
use crate::wire::{Findings, Flow, Guarded, MAX_HEAD};
use airlock_service::audit::AuditLog;
use airlock_service::config::Config;
use airlock_service::error::Error;
use airlock_service::keys::KeyStore;
use airlock_service::metrics::event;
use airlock_service::{Services, SharedServices};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Keys(#[from] airlock_service::keys::KeyError),
    #[error(transparent)]
    Engine(#[from] airlock_engine::EngineError),
    #[error("audit log: {0}")]
    Audit(std::io::Error),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("signals: {0}")]
    Signals(std::io::Error),
    #[error("warm pool: {0}")]
    Pool(String),
    #[error("MCP: {0}")]
    Mcp(String),
    #[error("tools: {0}")]
    Tools(String),
    #[error("{0}")]
    Credentials(String),
    #[error("environments: {0}")]
    Environments(#[from] airlock_engine::environments::EnvError),
}

/// What `run` reports once it listens (for callers that bind port 0).
#[derive(Debug, Clone)]
pub struct Started {
    pub addr: SocketAddr,
}

/// Blocks of this many bytes or more are mapped on their own ([`give_back_large_blocks`]).
const LARGE_BLOCK: usize = 1 << 20;

/// A large body, request or answer freed goes back to the system rather than stay resident in
/// the arena of the thread that freed it (`airlock_sandbox::map_large_blocks`): what the
/// memory budget counts is what the server holds, and a background execution's job parked on
/// the disk leaves no copy behind.
pub(crate) fn give_back_large_blocks() {
    if !airlock_sandbox::map_large_blocks(LARGE_BLOCK) {
        tracing::warn!("cannot set the allocator's threshold for large blocks");
    }
}

/// Reads the configuration again (SIGHUP), for its keys.
pub type Reload = Box<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// Runs the server until SIGTERM or SIGINT, then shuts down gracefully; on SIGHUP, the keys
/// are read again through `reload`.
pub async fn run(
    config: Config,
    env_key: Option<String>,
    reload: Reload,
    on_start: impl FnOnce(Started),
) -> Result<(), ServeError> {
    crate::sizing::check(&config).map_err(ServeError::Config)?;
    give_back_large_blocks();
    let state_dir = make_state_dir(&config)?;
    let resolved = KeyStore::resolve(&config.keys, env_key.as_deref(), &state_dir)?;
    if let Some(key) = &resolved.generated {
        // Shown this once; only its hash is kept (state_dir/keys.json).
        let shown = writeln!(
            std::io::stdout(),
            "airlock: generated an API key. It is shown only now; store it:\n{key}"
        );
        if let Err(e) = shown {
            tracing::error!(error = %e, keys = %state_dir.join("keys.json").display(),
                "the generated API key could not be shown on stdout: delete the keys file and \
                 start again, or set AIRLOCK_API_KEY");
        }
    }
    if let airlock_sandbox::ProcMasks::Removed(covers) = airlock_sandbox::unmask_proc() {
        tracing::info!(covers = %covers.join(","), "uncovered /proc in airlock's own mount namespace, for sandboxes to mount theirs");
    }
    let credentials = airlock_service::Credentials::load(&config, &state_dir.join("trust"))
        .map_err(ServeError::Credentials)?;
    let (engine, audit) = start_engine(&config, &state_dir)?;
    let tools = airlock_service::tools::start(&config, &resolved.store)
        .await
        .map_err(ServeError::Tools)?;
    // Keys with the approve scope decide waiting calls over HTTP (`airlock mcp` has none).
    if let Some(registry) = &tools {
        registry.approvals().serve_http();
    }
    let environments = open_environments(&state_dir)?;
    let listen = config.listen;
    let state: SharedServices = Arc::new(
        Services::new(config, engine, resolved.store, audit, tools, environments)
            .with_credentials(credentials),
    );
    let worst: u64 = crate::sizing::worst_case(&state.config)
        .iter()
        .map(|p| p.bytes)
        .sum();
    let audit_log = match &state.config.store.url {
        None => state.config.audit_path().display().to_string(),
        Some(_) => "PostgreSQL ([store] url)".to_owned(),
    };
    tracing::info!(
        state_dir = %state_dir.display(),
        audit_log,
        keys = state.keys.keys().len(),
        max_running = state.config.concurrency.max_running,
        worst_case_memory_mib = worst >> 20,
        "starting (`airlock doctor --config` breaks the worst-case memory down)"
    );

    let trial_state = state.clone();
    let trial = tokio::task::spawn_blocking(move || trial_state.engine.self_test().map(drop)).await;
    let trial = trial.unwrap_or_else(|e| Err(format!("the trial run failed: {e}")));
    if let Err(e) = &trial {
        tracing::error!(error = %e, "the start-up trial run failed; executions will fail until it is fixed (see `airlock doctor`)");
    }
    state.lifecycle.set_trial(trial);

    // Before the address is announced: a SIGTERM sent as soon as it is seen is not lost.
    let signals = Signals::register()?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Listen {
        addr: listen,
        source,
    })?;
    // With stderr gone the log still says it.
    let _ = writeln!(std::io::stderr(), "airlock: listening on http://{addr}");
    tracing::info!(%addr, "listening");
    on_start(Started { addr });
    tokio::spawn(airlock_service::environments::build_defined(state.clone()));

    let reload = Reload_ {
        read: reload,
        env_key,
        state_dir,
    };
    serve(listener, state, reload, signals).await
}

/// The signals the server answers: SIGHUP reloads the keys, SIGTERM and SIGINT stop it.
struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn register() -> Result<Self, ServeError> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind| signal(kind).map_err(ServeError::Signals);
        Ok(Signals {
            hup: listen(SignalKind::hangup())?,
            term: listen(SignalKind::terminate())?,
            int: listen(SignalKind::interrupt())?,
        })
    }
}

/// The state directory, made private if it is new.
pub(crate) fn make_state_dir(config: &Config) -> Result<PathBuf, ServeError> {
    let state_dir = config.state_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&state_dir)
        .map_err(|source| ServeError::StateDir {
            path: state_dir.clone(),
            source,
        })?;
    Ok(state_dir)
}

/// The environment store of the state directory, with what interrupted builds left removed.
pub(crate) fn open_environments(
    state_dir: &std::path::Path,
) -> Result<Arc<airlock_engine::environments::Environments>, ServeError> {
    let store = airlock_engine::environments::Environments::open(state_dir)?;
    store.sweep();
    Ok(Arc::new(store))
}

/// The engine (with the cgroups an earlier airlock left removed, then its warm pool started)
/// and the audit log.
pub(crate) fn start_engine(
    config: &Config,
    state_dir: &std::path::Path,
) -> Result<(Engine, AuditLog), ServeError> {
    let mut engine = Engine::new(config.engine.clone())?;
    engine.defer_cleanup();
    let (audit, recovery) = AuditLog::open(config).map_err(ServeError::Audit)?;
    if recovery.torn_bytes > 0 {
        tracing::warn!(
            bytes = recovery.torn_bytes,
            "the audit log's last line was cut short (a crash or power loss mid-write); it was cut off"
        );
    }
    if !recovery.interrupted.is_empty() {
        tracing::warn!(
            count = recovery.interrupted.len(),
            executions = %recovery.interrupted.join(","),
            "executions the server stopped in the middle of are recorded as interrupted"
        );
    }
    if let Ok(layout) = &airlock_sandbox::host_support().cgroup {
        let removed = airlock_sandbox::remove_leftovers(layout);
        if !removed.is_empty() {
            tracing::warn!(
                count = removed.len(),
                "removed sandbox cgroups left by an earlier airlock"
            );
        }
    }
    // Cold sandboxes (tools, egress, downgrades, any while a zygote starts) load the runner
    // compiled once instead of compiling it.
    if let Err(e) = engine.use_compiled_runner(&state_dir.join("runner")) {
        tracing::warn!(error = %e, "cold sandboxes compile the runner themselves");
    }
    // Before the pool, whose sandboxes then come from zygotes once one is ready.
    engine.start_zygotes(config.zygote.clone());
    // Said at start, not only in `/readyz` and `airlock doctor`: a binary copied without its
    // library beside it makes every fresh sandbox a cold one, about three times slower.
    if let Some(why) = engine
        .zygote_status()
        .filter(|z| z.enabled)
        .and_then(|z| z.unavailable)
    {
        tracing::warn!(reason = %why, "zygotes are off: every fresh sandbox starts its own interpreter");
    }
    // After the leftovers are gone: the pool's sandboxes are this run's.
    engine
        .start_pool(config.pool.clone())
        .map_err(ServeError::Pool)?;
    Ok((engine, audit))
}

/// Ends what runs once nothing new may start: running sandboxes are killed (and waited for,
/// a few seconds at most), then sessions, then the warm pool.
pub(crate) async fn stop_everything(state: &SharedServices) {
    let deadline = tokio::time::Instant::now() + KILL_DEADLINE;
    while state.lifecycle.running_count() > 0 && tokio::time::Instant::now() < deadline {
        state.lifecycle.cancel_all();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    close_sessions_and_pool(state).await;
}

async fn close_sessions_and_pool(state: &SharedServices) {
    if let Some(tools) = &state.tools {
        tools.shutdown();
    }
    // Sessions: their sandboxes are destroyed, waited for.
    let st = state.clone();
    let _ = tokio::task::spawn_blocking(move || st.sessions.close_all()).await;
    // Idle pooled sandboxes go last: nothing can take them any more.
    let st = state.clone();
    let _ = tokio::task::spawn_blocking(move || st.engine.close_pools()).await;
    let _ = tokio::task::spawn_blocking(airlock_sandbox::settle).await;
}

/// What SIGHUP needs to read the keys again as the start read them.
struct Reload_ {
    read: Reload,
    env_key: Option<String>,
    state_dir: PathBuf,
}

impl Reload_ {
    /// Reads the configuration again and serves its keys from now on; on any error the keys
    /// stay as they were. Requests already admitted finish under the key they came with.
    fn keys(&self, state: &Services) {
        let config = match (self.read)() {
            Ok(config) => config,
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the configuration cannot be read; the keys stay as they were");
                return;
            }
        };
        // With no keys at all, a start makes one and prints it; a reload would make one that
        // nobody ever sees.
        if config.keys.is_empty()
            && self.env_key.is_none()
            && !self.state_dir.join("keys.json").exists()
        {
            tracing::error!("SIGHUP: the configuration has no keys; the keys stay as they were");
            return;
        }
        let resolved =
            match KeyStore::resolve(&config.keys, self.env_key.as_deref(), &self.state_dir) {
                Ok(resolved) => resolved,
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: the keys stay as they were");
                    return;
                }
            };
        let keys = resolved.store.keys();
        if let Err(e) = airlock_service::tools::check_grants(state.tools.as_deref(), &keys) {
            tracing::error!(error = %e, "SIGHUP: the keys stay as they were");
            return;
        }
        if let Err(e) = state.credentials.check_grants(&keys) {
            tracing::error!(error = %e, "SIGHUP: the keys stay as they were");
            return;
        }
        let mut others = config.clone();
        others.keys.clone_from(&state.config.keys);
        if others != state.config {
            tracing::warn!(
                "SIGHUP reloads the keys only: the configuration's other changes need a restart"
            );
        }
        state.admission.reload(&keys);
        state.memory.reload(&keys);
        state.keys.replace(resolved.store);
        tracing::info!(keys = keys.len(), "SIGHUP: keys reloaded");
    }
}

/// Removes ended background executions once their retention has passed.
async fn expire_background(state: SharedServices) {
    let mut shutdown = state.shutdown_signal();
    loop {
        tokio::select! {
            () = tokio::time::sleep(state.background.expire_every()) => {}
            _ = shutdown.changed() => return,
        }
        let st = state.clone();
        if let Ok(n) = tokio::task::spawn_blocking(move || st.background.expire()).await {
            if n > 0 {
                tracing::info!(count = n, "ended background executions expired");
            }
        }
    }
}

async fn serve(
    listener: TcpListener,
    state: SharedServices,
    reload: Reload_,
    signals: Signals,
) -> Result<(), ServeError> {
    let Signals {
        mut hup,
        mut term,
        mut int,
    } = signals;
    let router = app(state.clone());
    let table = Arc::new(Table::new(state.config.http.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::spawn(airlock_service::snapshots::reaper(state.clone()));
    tokio::spawn(expire_background(state.clone()));

    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                // Unsent bytes wait in airlock, where they are counted, not in the kernel: a
                // write is taken once the client takes what came before (`slow_reader`).
                let _ = socket2::SockRef::from(&stream).set_tcp_notsent_lowat(NOTSENT_LOWAT);
                let (table, router, state, stop) = (table.clone(), router.clone(), state.clone(), stop_rx.clone());
                connections.spawn(async move {
                    match table.enter(&state, peer.ip()).await {
                        Some(entry) => connection(stream, entry, router, state, stop).await,
                        None => {
                            state.metrics.security_events.add(&[event::CONNECTION_REFUSED]);
                            refuse(stream).await
                        }
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = hup.recv() => {
                let st = state.clone();
                // Reading files and hashing: off the async threads. One at a time.
                let reload = &reload;
                tokio::task::block_in_place(|| {
                    // A rotated audit log is continued in a new file (logrotate's `create`).
                    if let Err(e) = st.audit.reopen() {
                        tracing::error!(error = %e, "SIGHUP: the audit log cannot be reopened");
                    }
                    reload.keys(&st)
                });
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }

    // Stop accepting, refuse new executions (queued ones included), let the running ones
    // finish for a while, then kill their sandboxes.
    drop(listener);
    state.begin_shutdown();
    let _ = stop_tx.send(true);
    let grace = Duration::from_millis(state.config.shutdown_grace_ms);
    tracing::info!(
        running = state.lifecycle.running_count(),
        grace_ms = grace.as_millis() as u64,
        "shutting down"
    );
    // Background executions hold no connection: they are waited for too.
    let drain = async {
        while connections.join_next().await.is_some() {}
        state.background.settled().await;
    };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!(
            running = state.lifecycle.running_count(),
            "grace period over: killing the sandboxes still running"
        );
        // Keep killing until nothing runs: an execution may have been between its last
        // check and its spawn when the first round went out.
        let deadline = tokio::time::Instant::now() + KILL_DEADLINE;
        while state.lifecycle.running_count() > 0 && tokio::time::Instant::now() < deadline {
            state.lifecycle.cancel_all();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Answers are on their way; the connections get a moment to write them.
        let rest = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(2), rest)
            .await
            .is_err()
        {
            connections.abort_all();
        }
        // Killed, background executions store how they ended (interrupted).
        if tokio::time::timeout(KILL_DEADLINE, state.background.settled())
            .await
            .is_err()
        {
            tracing::warn!(
                "background executions still ending: the next start marks them interrupted"
            );
        }
    }
    close_sessions_and_pool(&state).await;
    flush_traces(&state).await;
    if let Some(why) = state.audit.write_kept() {
        tracing::error!(error = %why, "stopped with audit lines that could not be written");
    }
    tracing::info!(still_running = state.lifecycle.running_count(), "stopped");
    Ok(())
}

/// Unsent bytes the kernel keeps queued on a connection (`TCP_NOTSENT_LOWAT`).
const NOTSENT_LOWAT: u32 = 128 << 10;

/// At exit: the spans of the last requests (and of the shutdown's own endings) go out.
pub(crate) async fn flush_traces(state: &SharedServices) {
    let st = state.clone();
    let flushed = tokio::task::spawn_blocking(move || st.telemetry.flush(TRACES_DEADLINE))
        .await
        .unwrap_or(false);
    if !flushed {
        tracing::warn!(
            deadline_ms = TRACES_DEADLINE.as_millis() as u64,
            "traces: spans still queued at exit are lost (the collector did not take them in time)"
        );
    }
}

/// How long the spans still queued at shutdown get to reach the collector.
const TRACES_DEADLINE: Duration = Duration::from_secs(3);

/// How long killed sandboxes get to be gone after the grace period.
const KILL_DEADLINE: Duration = Duration::from_secs(5);

/// The open connections, oldest first. At the cap, a new connection takes the place of one
/// that has no request in progress (still sending its head, or an idle keep-alive): from the
/// address holding the most connections, one that never presented a valid key before one
/// that did, the oldest first. So holding connections open without using them cannot lock
/// anyone out, and a client with a key keeps its connections while clients without one churn;
/// only when every connection is busy with a request is the new one refused. (Many addresses
/// together can still crowd others out: a proxy with per-client limits belongs in front of a
/// server exposed to them.)
struct Table {
    slots: Arc<Semaphore>,
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next: AtomicU64,
}

/// One open connection, as the table sees it.
struct Conn {
    peer: IpAddr,
    /// Requests in progress, from a complete head until the answer is written.
    busy: AtomicUsize,
    /// Answers made and not yet written out (their bodies are alive).
    answers: AtomicUsize,
    /// The answer being written had nothing more to give when last asked (a stream waiting
    /// for its execution): the client owes nothing meanwhile.
    answer_idle: AtomicBool,
    /// A request on this connection presented a valid key.
    authenticated: Arc<AtomicBool>,
    evicted: AtomicBool,
    evict: Notify,
}

/// A place in the table; gives it back on drop.
struct TableSlot {
    table: Arc<Table>,
    id: u64,
    conn: Arc<Conn>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for TableSlot {
    fn drop(&mut self) {
        self.table
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// How long a new connection waits for an evicted one to let go of its slot.
const EVICTION_WAIT: Duration = Duration::from_secs(2);
/// How long an evicted connection may take to finish the request it had just started.
const EVICTED_GRACE: Duration = Duration::from_secs(10);

impl Table {
    fn new(max: usize) -> Self {
        Table {
            slots: Arc::new(Semaphore::new(max)),
            open: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
        }
    }

    async fn enter(self: &Arc<Self>, state: &SharedServices, peer: IpAddr) -> Option<TableSlot> {
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                match self.evict_one() {
                    Eviction::AllBusy => return None,
                    Eviction::Asked => state
                        .metrics
                        .security_events
                        .add(&[event::CONNECTION_EVICTED]),
                    Eviction::Pending => {}
                }
                tokio::time::timeout(EVICTION_WAIT, self.slots.clone().acquire_owned())
                    .await
                    .ok()?
                    .ok()?
            }
        };
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            peer,
            busy: AtomicUsize::new(0),
            answers: AtomicUsize::new(0),
            answer_idle: AtomicBool::new(false),
            authenticated: Arc::new(AtomicBool::new(false)),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
        });
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, conn.clone());
        Some(TableSlot {
            table: self.clone(),
            id,
            conn,
            _slot: slot,
        })
    }

    /// Asks an idle connection to close (see [`Table`]). A connection that presented a key is
    /// not asked while one that did not is still on its way out: a burst of newcomers would
    /// otherwise run through every keyless connection before those had time to close, and
    /// reach the keyed ones.
    fn evict_one(&self) -> Eviction {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut per_peer: HashMap<IpAddr, usize> = HashMap::new();
        for conn in open.values() {
            *per_peer.entry(conn.peer).or_default() += 1;
        }
        let victim = open
            .iter()
            .filter(|(_, c)| {
                c.busy.load(Ordering::SeqCst) == 0 && !c.evicted.load(Ordering::SeqCst)
            })
            .min_by_key(|(id, c)| {
                (
                    std::cmp::Reverse(per_peer[&c.peer]),
                    c.authenticated.load(Ordering::SeqCst),
                    **id,
                )
            })
            .map(|(_, c)| c);
        let keyless_leaving = || {
            open.values().any(|c| {
                c.evicted.load(Ordering::SeqCst) && !c.authenticated.load(Ordering::SeqCst)
            })
        };
        match victim {
            Some(conn) if conn.authenticated.load(Ordering::SeqCst) && keyless_leaving() => {
                Eviction::Pending
            }
            Some(conn) => {
                conn.evicted.store(true, Ordering::SeqCst);
                conn.evict.notify_one();
                Eviction::Asked
            }
            None => Eviction::AllBusy,
        }
    }
}

/// What `evict_one` did for a newcomer at the cap.
enum Eviction {
    /// An idle connection was asked to close; its slot will follow.
    Asked,
    /// One already asked is still closing: wait for a slot.
    Pending,
    /// Every connection is busy with a request.
    AllBusy,
}

/// Marks a connection busy while a request is handled and its answer written.
struct ConnBusy(Arc<Conn>);

impl ConnBusy {
    fn new(conn: &Arc<Conn>) -> Self {
        conn.busy.fetch_add(1, Ordering::SeqCst);
        ConnBusy(conn.clone())
    }
}

impl Drop for ConnBusy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its connection busy until hyper is done with it (written, or
/// the connection gone): an answer being written is not an idle connection. It also tells
/// the slow-reader watch whether the answer has more to give.
/// A request's body that says when it has been read to its end (or had none).
struct ReadToEnd {
    inner: Incoming,
    read: Arc<AtomicBool>,
}

impl ReadToEnd {
    fn new(
        (parts, inner): (axum::http::request::Parts, Incoming),
    ) -> (Arc<AtomicBool>, Request<ReadToEnd>) {
        use hyper::body::Body as _;
        let read = Arc::new(AtomicBool::new(inner.is_end_stream()));
        let body = ReadToEnd {
            inner,
            read: read.clone(),
        };
        (read, Request::from_parts(parts, body))
    }
}

impl hyper::body::Body for ReadToEnd {
    type Data = axum::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::SeqCst);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

struct BusyBody {
    inner: Body,
    busy: ConnBusy,
}

impl BusyBody {
    fn new(inner: Body, busy: ConnBusy) -> Self {
        busy.0.answers.fetch_add(1, Ordering::SeqCst);
        busy.0.answer_idle.store(false, Ordering::SeqCst);
        BusyBody { inner, busy }
    }
}

impl Drop for BusyBody {
    fn drop(&mut self) {
        self.busy.0.answers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl hyper::body::Body for BusyBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        self.busy
            .0
            .answer_idle
            .store(polled.is_pending(), Ordering::SeqCst);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

async fn connection(
    stream: TcpStream,
    entry: TableSlot,
    router: Router,
    state: SharedServices,
    mut stop: watch::Receiver<bool>,
) {
    state.metrics.connections.inc();
    let findings = Arc::new(Findings::default());
    let flow = Arc::new(Flow::default());
    let io = TokioIo::new(Guarded::new(stream, findings.clone(), flow.clone()));
    let svc_state = state.clone();
    let conn_state = entry.conn.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let router = router.clone();
        let findings = findings.clone();
        let state = svc_state.clone();
        let busy = ConnBusy::new(&conn_state);
        let authenticated = Authenticated(conn_state.authenticated.clone());
        async move {
            let mut response = if findings.smuggling.load(Ordering::SeqCst) {
                state.metrics.security_events.add(&[event::SMUGGLING]);
                tracing::warn!("refused a request with both Transfer-Encoding and Content-Length");
                Error::invalid(
                    "headers",
                    "Transfer-Encoding together with Content-Length is refused",
                )
                .ends_connection()
                .into_http()
            } else {
                let (read, body) = ReadToEnd::new(req.into_parts());
                let mut req = body.map(Body::new);
                req.extensions_mut().insert(authenticated);
                let mut response = match router.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                // Answered before its body was read (a refusal that comes first: a lost
                // session, a rate limit): hyper closes the connection rather than read on,
                // and a client that reused it meanwhile would get no answer at all.
                if !read.load(Ordering::SeqCst) {
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                response
            };
            if findings.close_after.load(Ordering::SeqCst) {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, Infallible>(response.map(|inner| BusyBody::new(inner, busy)))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(state.config.http.header_timeout_ms))
        .max_buf_size(MAX_HEAD)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let stopping = async move {
        // (A watch guard must not live across an await: only the result is kept.)
        let _ = stop.wait_for(|stop| *stop).await.map(|_| ());
    };
    let evicted = entry.conn.evict.notified();
    let h = &state.config.http;
    let slow = slow_reader(
        &entry.conn,
        &flow,
        Duration::from_millis(h.answer_timeout_ms),
        h.answer_min_bytes_per_second,
    );
    tokio::select! {
        _ = conn.as_mut() => {}
        taken = slow => {
            // Dropping the connection drops the answer, and its memory with it.
            state.metrics.security_events.add(&[event::SLOW_READER]);
            tracing::warn!(
                peer = %entry.conn.peer,
                taken,
                timeout_ms = h.answer_timeout_ms,
                min_bytes_per_second = h.answer_min_bytes_per_second,
                "closed a connection whose client did not take its answer"
            );
        }
        _ = stopping => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
        _ = evicted => {
            if entry.conn.busy.load(Ordering::SeqCst) > 0 {
                // A request started after all: answer it (for a while), then close.
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(EVICTED_GRACE, conn).await;
            }
            // Otherwise dropping the connection closes it.
        }
    }
    state.metrics.connections.dec();
    drop(entry);
}

/// Resolves when the client takes an answer waiting for it more slowly than `min_rate`
/// bytes a second over `timeout` (or takes nothing at all), with the bytes it took in that
/// time. The answer waits for the client while the socket is full, or while an answer has
/// more to give than hyper has asked for; a stream waiting for its execution's next event,
/// a request still being handled and an idle connection owe nothing.
async fn slow_reader(conn: &Conn, flow: &Flow, timeout: Duration, min_rate: u64) -> u64 {
    let every = (timeout / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Since when the answer has waited, and what the socket had taken then.
    let mut waiting: Option<(tokio::time::Instant, u64)> = None;
    loop {
        tick.tick().await;
        let written = flow.written();
        let owed = flow.blocked()
            || (conn.answers.load(Ordering::SeqCst) > 0
                && !conn.answer_idle.load(Ordering::SeqCst));
        if !owed {
            waiting = None;
            continue;
        }
        let (since, at) = *waiting.get_or_insert((tokio::time::Instant::now(), written));
        let elapsed = since.elapsed();
        if elapsed >= timeout {
            let taken = written - at;
            let owed = (min_rate as f64 * elapsed.as_secs_f64()).max(1.0);
            if (taken as f64) < owed {
                return taken;
            }
            waiting = Some((tokio::time::Instant::now(), written));
        }
    }
}

/// Over the connection cap with every connection busy: a short 503 and close.
async fn refuse(mut stream: TcpStream) {
    let body = r#"{"error":{"code":"overloaded","message":"too many open connections"}}"#;
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        stream.write_all(response.as_bytes()),
    )
    .await;
    let _ = stream.shutdown().await;
}

/// Logs to stderr, as text or JSON lines, through `filter` (the binary picks it). A line
/// stderr cannot take is dropped: the subscriber's own report of the failure would go to the
/// same stderr through `eprintln!`, whose panic aborts the server (a log reader that went away
/// would otherwise take the server, and the clean-up of its sandboxes, with it).
pub fn init_logging(
    format: airlock_service::config::LogFormat,
    filter: tracing_subscriber::EnvFilter,
) {
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        airlock_service::config::LogFormat::Json => builder.json().flatten_event(true).try_init(),
        airlock_service::config::LogFormat::Text => builder.try_init(),
    };
}
