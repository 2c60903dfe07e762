//! airlock's HTTP API: `POST /v1/execute` and friends, authenticated and hardened, over the
//! engine; and the same operations as MCP tools, over HTTP or stdio.
//!
//! # Layers
//! Each module belongs to one layer and imports only from its own layer or the ones below.
//! `tests/layers.rs` reads every `crate::` and `super::` path and fails on one that points up,
//! on an import between adapters other than `http` → `mcp`, on a circle among the top-level
//! modules or among the submodules of `service/` and `http/`, and on any path of axum, http,
//! hyper, rmcp or tower in `service/`:
//!
//! 1. **Start-up** ([`serve`], [`stdio`]): builds the state, the listeners and the signals,
//!    and mounts the adapters on them.
//! 2. **Adapters** ([`http`], [`mcp`]): turn a transport's request into a service call and
//!    its outcome into an answer. `http` holds the one route table (`http::routes`: each
//!    route's method, path, handler, OpenAPI operation and scope, from which the router, the
//!    OpenAPI document and the guard's scope checks are made), the guard, the handlers, the
//!    HTTP form of errors (`http::error`, the one place an [`Error`] becomes a status),
//!    answers, bodies and server-sent events, and MCP's streamable HTTP transport, which
//!    mounts [`mcp`]'s tools: the one import between adapters. [`mcp`] turns tool calls into
//!    service calls and results into tool results.
//! 3. **Services** ([`service`]): executions, sessions, evaluation, pickle scans,
//!    environments, tools and egress, each written once for every adapter. Everything that
//!    runs code goes through the one pipeline (`service::pipeline`), which owns the order of
//!    its steps. They take transport-free requests and bodies and give back transport-free
//!    outcomes, event streams and [`Error`]s.
//! 4. **Foundation**: configuration (which imports no other module), keys and the
//!    [`caller`], admission, memory budgets and the size of answers, the audit log, its lines
//!    and its store, metrics, traces ([`telemetry`]), the one error type ([`Error`]: a kind, a
//!    code, a message, the field, when to come back; no status), the connection layer
//!    ([`wire`]), sizing and the OpenAPI descriptions. They know no layer above.
//!
//! Below them all is the engine ([`airlock_engine`]), which knows nothing of this crate.
//! [`AppState`], at the crate root, is the shared state every layer reads.
//!
//! # What is enforced
//! - Every route but `/healthz` and `/openapi.json` needs a valid key (`Authorization: Bearer
//!   ...`), and the key's scope for the route; `/metrics` and `/readyz` only when the
//!   configuration does not open them (`metrics.require_auth`, `http.readyz_without_key`).
//!   Keys are stored as SHA-256 hashes and compared in constant time.
//! - Host header allow-list (DNS rebinding), no CORS unless origins are listed, requests from
//!   foreign origins refused, only `application/json` bodies.
//! - Body size counted on the bytes received, header and body read timeouts, a cap on open
//!   connections, `Transfer-Encoding` with `Content-Length` refused.
//! - Global and per-key concurrency with bounded queues, per-key rate limits and ceilings.
#![forbid(unsafe_code)]
// The OpenAPI document is one `json!` literal, deeper than the default allows.
#![recursion_limit = "256"]

// Start-up.
mod serve;
mod stdio;

// Adapters.
mod http;
pub mod mcp;

// Services.
mod service;

// Foundation.
pub mod admission;
mod answer;
pub mod audit;
mod audit_lines;
mod budget;
mod caller;
pub mod config;
mod error;
pub mod keys;
pub mod metrics;
mod openapi;
pub mod sizing;
mod store;
mod telemetry;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use airlock_engine::{Cancel, Engine};

pub use error::Error;
pub use http::app;
pub use http::routes::{openapi, ROUTES};
pub use serve::{init_logging, run, Reload, ServeError, Started};
pub use service::credentials::{read as read_credential, Credentials};
pub use stdio::run_stdio;

/// The bytes each key's paused sessions take in the snapshot directory `config` names, as
/// the server counts them against the key's storage (for `airlock volume create`).
pub fn paused_bytes(config: &config::Config) -> impl Fn(&str) -> u64 {
    let dir = config
        .sessions
        .snapshot_dir
        .clone()
        .unwrap_or_else(|| config.state_dir().join("sessions"));
    let paused = service::paused::Paused::open(&dir, &config.sessions);
    move |owner| paused.stored_bytes_of(owner)
}

use crate::admission::Admission;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::keys::KeyStore;
use crate::metrics::Metrics;

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
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
    pub sessions: service::sessions::Sessions,
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
    pub paused: service::paused::Paused,
    /// `[credentials]`, read at start ([`AppState::with_credentials`]).
    pub credentials: Credentials,
    /// Background executions, stored under the state directory.
    pub(crate) background: service::background::Background,
    /// Traces over OTLP (`[telemetry]`), when configured.
    pub telemetry: telemetry::Telemetry,
}

pub type SharedState = Arc<AppState>;

pub(crate) fn eval_slots(config: &Config) -> usize {
    match config.eval.max_running {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

impl AppState {
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
        let paused = service::paused::Paused::open(&snapshot_dir, &config.sessions);
        // What a stop mid-way left, and tombstones that no longer matter.
        paused.tidy();
        let (background, interrupted) = service::background::Background::open(
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
        AppState {
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
            sessions: service::sessions::Sessions::default(),
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
        struct Done(Arc<AppState>);
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
    fn track(self: &Arc<Self>, cancel: Cancel) -> Tracked {
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

struct Tracked {
    state: SharedState,
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
