//! [`Services`]: the state every service shares, built once at start and handed to each
//! adapter. It stands above the foundation and the stores it holds (admission, budgets, the
//! audit log, keys, metrics, traces; open and paused sessions, background work), which never
//! import it; the services (executions, sessions, snapshots, ...) stand above it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use airlock_engine::{Cancel, Engine};

use crate::admission::Admission;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::credentials::Credentials;
use crate::error::{Error, Kind};
use crate::keys::KeyStore;
use crate::metrics::Metrics;
use crate::{budget, keys, telemetry};

/// Everything the handlers share.
#[derive(Debug)]
pub struct Services {
    pub config: Config,
    pub engine: Engine,
    pub keys: KeyStore,
    pub admission: Admission,
    pub metrics: Arc<Metrics>,
    pub audit: Arc<AuditLog>,
    /// Lower-case host names (no port) accepted in the Host header.
    pub allowed_hosts: Vec<String>,
    /// Whether sandboxes start: the start-up trial run, then each execution's sandbox (a
    /// failed start sets it, a sandbox that runs clears it), and why not.
    pub trial: Mutex<Result<(), String>>,
    /// When `/readyz` last tried a trial run again while sandboxes could not start, and
    /// whether one is running.
    retrial: Mutex<(Option<std::time::Instant>, bool)>,
    /// Memory for request bodies and answers (http.max_buffered_bytes, and per key).
    pub memory: budget::MemoryBudget,
    shutting_down: AtomicBool,
    /// Turns true on shutdown, for whoever waits on something else meanwhile.
    shutdown: tokio::sync::watch::Sender<bool>,
    running: Mutex<HashMap<u64, Cancel>>,
    next_execution: AtomicU64,
    /// Open sessions, each one key's.
    pub sessions: crate::open_sessions::Sessions,
    /// Turns to evaluate an expression (`eval.max_running`).
    pub eval_slots: tokio::sync::Semaphore,
    /// Turns to scan a pickle (`pickle.max_running`).
    pub pickle_slots: tokio::sync::Semaphore,
    /// Code mode's tool servers, when any is configured.
    pub tools: Option<Arc<airlock_tools::Registry>>,
    /// The egress proxy's budgets and fixed name answers (`[egress]`).
    pub egress: Arc<airlock_egress::Settings>,
    /// Named environments, stored under the state directory.
    pub environments: Arc<airlock_engine::environments::Environments>,
    /// Volumes, stored under the state directory.
    pub volumes: Arc<airlock_engine::volumes::Volumes>,
    /// Paused sessions, stored in `sessions.snapshot_dir`.
    pub paused: crate::paused::Paused,
    /// `[credentials]`, read at start ([`Services::with_credentials`]).
    pub credentials: Credentials,
    /// Background executions, stored under the state directory.
    pub background: crate::background::Background,
    /// Traces over OTLP (`[telemetry]`), when configured.
    pub telemetry: telemetry::Telemetry,
}

pub type SharedServices = Arc<Services>;

pub fn eval_slots(config: &Config) -> usize {
    match config.eval.max_running {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

impl Services {
    /// A new session or execution id, naming this replica when it has a name.
    pub fn held_id(&self, prefix: &str) -> String {
        keys::held_id(prefix, self.config.replica.as_deref())
    }

    pub fn new(
        config: Config,
        engine: Engine,
        keys: KeyStore,
        audit: AuditLog,
        tools: Option<Arc<airlock_tools::Registry>>,
        environments: Arc<airlock_engine::environments::Environments>,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        let telemetry = telemetry::Telemetry::start(
            &config.telemetry,
            config.replica.as_deref(),
            metrics.clone(),
        );
        let admission = Admission::new(config.concurrency.clone(), &keys.keys(), metrics.clone());
        let allowed_hosts = allowed_hosts(&config);
        let eval_turns = eval_slots(&config);
        let pickle_turns = config.pickle.max_running.max(1);
        let memory = budget::MemoryBudget::new(
            config.http.max_buffered_bytes,
            config.http.max_buffered_bytes_per_key,
            &keys.keys(),
        );
        let volumes = Arc::new(airlock_engine::volumes::Volumes::open(&config.state_dir()));
        if let Some(why) = volumes.unavailable() {
            tracing::info!(why, "volumes are not available");
        }
        let snapshot_dir = config
            .sessions
            .snapshot_dir
            .clone()
            .unwrap_or_else(|| config.state_dir().join("sessions"));
        let paused = crate::paused::Paused::open(&snapshot_dir, &config.sessions);
        // What a stop mid-way left, and tombstones that no longer matter.
        paused.tidy();
        let (background, interrupted) = crate::background::Background::open(
            &config.state_dir(),
            config.background.clone(),
            config.concurrency.max_running,
        );
        if !interrupted.is_empty() {
            tracing::warn!(
                count = interrupted.len(),
                executions = %interrupted.join(","),
                "background executions the server stopped while they waited or ran are interrupted"
            );
        }
        Services {
            background,
            egress: Arc::new(config.egress.clone()),
            environments,
            volumes,
            paused,
            config,
            engine,
            keys,
            admission,
            metrics,
            audit: Arc::new(audit),
            allowed_hosts,
            trial: Mutex::new(Err("not run yet".into())),
            retrial: Mutex::new((None, false)),
            memory,
            shutting_down: AtomicBool::new(false),
            shutdown: tokio::sync::watch::Sender::new(false),
            sessions: crate::open_sessions::Sessions::default(),
            eval_slots: tokio::sync::Semaphore::new(eval_turns),
            pickle_slots: tokio::sync::Semaphore::new(pickle_turns),
            tools,
            running: Mutex::new(HashMap::new()),
            next_execution: AtomicU64::new(0),
            credentials: Credentials::default(),
            telemetry,
        }
    }

    /// With `[credentials]` read (their values and CA certificates).
    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Refuses new executions from now on, waiters in the queues included.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.admission.close();
        self.shutdown.send_replace(true);
    }

    /// Changes when shutdown begins.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Resolves once shutdown has begun.
    pub async fn shutdown_begun(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|begun| *begun).await.map(|_| ());
    }

    /// A sandbox could not start (too many open files, the interpreter gone): `/readyz` says
    /// so until one runs again.
    pub fn sandboxes_failed(&self, why: &str) {
        let mut trial = self.trial.lock().unwrap_or_else(|e| e.into_inner());
        if trial.is_ok() {
            tracing::error!(error = %why, "a sandbox could not start; not ready until one does");
        }
        *trial = Err(format!("sandboxes cannot start: {why}"));
    }

    /// A sandbox ran: whatever kept them from starting has gone.
    pub fn sandboxes_work(&self) {
        let mut trial = self.trial.lock().unwrap_or_else(|e| e.into_inner());
        if trial.is_err() {
            tracing::info!("sandboxes start again; ready");
            *trial = Ok(());
        }
    }

    /// While sandboxes cannot start, tries a trial run again in the background, at most
    /// every `RETRIAL_EVERY`: readiness comes back by itself when the fault goes away, even if
    /// no execution is sent meanwhile (a balancer sends none to an unready server).
    pub fn retry_trial(self: &Arc<Self>) {
        const RETRIAL_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
        if self.trial.lock().unwrap_or_else(|e| e.into_inner()).is_ok() {
            return;
        }
        {
            let mut retrial = self.retrial.lock().unwrap_or_else(|e| e.into_inner());
            let due = retrial.0.is_none_or(|at| at.elapsed() >= RETRIAL_EVERY);
            if retrial.1 || !due || self.is_shutting_down() {
                return;
            }
            *retrial = (Some(std::time::Instant::now()), true);
        }
        /// Marks the trial done however it ends (a panic too), so the next one can run.
        struct Done(Arc<Services>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.retrial.lock().unwrap_or_else(|e| e.into_inner()).1 = false;
            }
        }
        let done = Done(self.clone());
        tokio::task::spawn_blocking(move || {
            let state = &done.0;
            match state.engine.self_test() {
                Ok(_) => state.sandboxes_work(),
                Err(e) => {
                    *state.trial.lock().unwrap_or_else(|e| e.into_inner()) = Err(e);
                }
            }
        });
    }

    /// Kills every running execution's sandbox.
    pub fn cancel_all(&self) -> usize {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        for cancel in running.values() {
            cancel.cancel();
        }
        running.len()
    }

    pub fn running_count(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Registers a running execution so that shutdown can cancel it; deregistered on drop.
    pub fn track(self: &Arc<Self>, cancel: Cancel) -> Tracked {
        let id = self.next_execution.fetch_add(1, Ordering::Relaxed);
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, cancel);
        Tracked {
            state: self.clone(),
            id,
        }
    }
}

#[derive(Debug)]
pub struct Tracked {
    state: SharedServices,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.state
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// localhost names, the listen address, and what the operator added.
fn allowed_hosts(config: &Config) -> Vec<String> {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let ip = config.listen.ip();
    if !ip.is_unspecified() {
        hosts.push(ip.to_string());
    }
    hosts.extend(config.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()));
    hosts.sort();
    hosts.dedup();
    hosts
}

/// A 404 for what this server does not hold; one that names another replica says so, for
/// the operator whose balancer sent it to the wrong one (docs/deploying.md "Several replicas").
pub fn not_here(state: &Services, id: &str, what: &str) -> Error {
    let message = match (crate::keys::replica_of(id), state.config.replica.as_deref()) {
        (Some(theirs), Some(ours)) if theirs != ours => format!(
            "no such {what} here: its id names replica {theirs}, and this is replica {ours}; \
             the balancer must send requests for an id to the replica it names"
        ),
        _ => format!("no such {what}"),
    };
    Error::new(Kind::NotFound, "not_found", message)
}

/// No new executions while shutting down, or while the audit log cannot be written.
pub fn refuse_if_unavailable(state: &crate::services::SharedServices) -> Result<(), Error> {
    if state.is_shutting_down() {
        return Err(Error::shutting_down());
    }
    if let Some(why) = state.audit.retry_soon() {
        return Err(audit_unavailable(&why));
    }
    Ok(())
}

/// Worth a retry a second later: the audit log is tried again each second (the file by the
/// requests that ask, the store by its writer).
pub fn audit_unavailable(why: &str) -> Error {
    Error::new(
        Kind::Unavailable,
        "unavailable",
        format!("executions are refused while the audit log cannot be written: {why}"),
    )
    .retry_after(crate::audit_lines::RETRY_EVERY.as_secs())
}

/// The bytes each key's paused sessions take in the snapshot directory `config` names, as
/// the server counts them against the key's storage (for `airlock volume create`).
pub fn paused_bytes(config: &Config) -> impl Fn(&str) -> u64 {
    let dir = config
        .sessions
        .snapshot_dir
        .clone()
        .unwrap_or_else(|| config.state_dir().join("sessions"));
    let paused = crate::paused::Paused::open(&dir, &config.sessions);
    move |owner| paused.stored_bytes_of(owner)
}
