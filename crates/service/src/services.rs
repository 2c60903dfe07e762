//! [`Services`]: the state every service shares, built once at start and handed to each
//! adapter. It stands above the foundation and the stores it holds (admission, budgets, the
//! audit log, keys, metrics, traces; open and paused sessions, background work), which never
//! import it; the services (executions, sessions, snapshots, ...) stand above it.

use std::sync::Arc;

use airlock_engine::storage::{Account, Quotas, Storage};
use airlock_engine::volumes::Volumes;
use airlock_engine::Engine;

use crate::admission::Admission;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::credentials::Credentials;
use crate::error::{Error, Kind};
use crate::keys::KeyStore;
use crate::lifecycle::Lifecycle;
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
    /// Shutdown, whether sandboxes start, the executions running now.
    pub lifecycle: Lifecycle,
    /// Memory for request bodies and answers (http.max_buffered_bytes, and per key).
    pub memory: budget::MemoryBudget,
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
    pub paused: Arc<crate::paused::Paused>,
    /// What each key keeps on disk (its volumes and paused sessions; its background
    /// executions'), and what is held for what is being written: the one count of it.
    pub storage: Arc<Storage>,
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
        let snapshot_dir = snapshot_dir(&config);
        let paused = Arc::new(crate::paused::Paused::open(&snapshot_dir, &config.sessions));
        // What a stop mid-way left, and tombstones that no longer matter.
        paused.tidy();
        let storage = Arc::new(
            Storage::open(&config.state_dir(), quotas(&config))
                .counting(Account::Stored, volumes.clone())
                .counting(Account::Stored, paused.clone())
                .counting_operator(environments.clone()),
        );
        let (background, interrupted) = crate::background::Background::open(
            &config.state_dir(),
            config.background.clone(),
            config.concurrency.max_running,
            storage.clone(),
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
            storage,
            config,
            engine,
            keys,
            admission,
            metrics,
            audit: Arc::new(audit),
            lifecycle: Lifecycle::default(),
            memory,
            sessions: crate::open_sessions::Sessions::default(),
            eval_slots: tokio::sync::Semaphore::new(eval_turns),
            pickle_slots: tokio::sync::Semaphore::new(pickle_turns),
            tools,
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
        self.lifecycle.is_shutting_down()
    }

    /// Refuses new executions from now on, waiters in the queues included.
    pub fn begin_shutdown(&self) {
        self.lifecycle.begin_shutdown();
        self.admission.close();
    }

    /// Changes when shutdown begins.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lifecycle.shutdown_signal()
    }

    /// Resolves once shutdown has begun.
    pub async fn shutdown_begun(&self) {
        self.lifecycle.shutdown_begun().await
    }

    /// While sandboxes cannot start, tries a trial run again in the background, at most
    /// every two seconds: readiness comes back by itself when the fault goes away, even if
    /// no execution is sent meanwhile (a balancer sends none to an unready server).
    pub fn retry_trial(self: &Arc<Self>) {
        let Some(retrial) = self.lifecycle.retrial_due() else {
            return;
        };
        let state = self.clone();
        tokio::task::spawn_blocking(move || {
            match state.engine.self_test() {
                Ok(_) => state.lifecycle.sandboxes_work(),
                Err(e) => state.lifecycle.set_trial(Err(e)),
            }
            drop(retrial);
        });
    }
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

/// Each key's quotas: its volumes and paused sessions together, its background executions.
fn quotas(config: &Config) -> Quotas {
    Quotas {
        stored: config.volumes.max_bytes_per_key,
        background: config.background.max_bytes_per_key,
    }
}

/// The storage of `config`'s state directory as a process beside the server counts it
/// (`airlock volume create`): `volumes`, and the paused sessions of the snapshot directory,
/// read from the disk at each count; the server's reservations from their files.
pub fn storage_beside_the_server(config: &Config, volumes: Arc<Volumes>) -> Storage {
    let paused = crate::paused::OnDisk {
        dir: snapshot_dir(config),
        config: config.sessions.clone(),
    };
    Storage::open(&config.state_dir(), quotas(config))
        .counting(Account::Stored, volumes)
        .counting(Account::Stored, Arc::new(paused))
}

/// `sessions.snapshot_dir`, or `sessions` in the state directory.
fn snapshot_dir(config: &Config) -> std::path::PathBuf {
    config
        .sessions
        .snapshot_dir
        .clone()
        .unwrap_or_else(|| config.state_dir().join("sessions"))
}
