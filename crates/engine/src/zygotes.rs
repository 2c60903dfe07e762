//! Zygotes for the engine's sandboxes (see [`airlock_sandbox::Zygote`]): one per sandbox root
//! (the interpreter's own, and each environment's), started in the background the first time
//! a sandbox with that root is asked for, replaced when it dies and retired after
//! `recycle_after` children or `recycle_seconds`. A sandbox a zygote cannot serve (egress, a
//! writable environment being built, a zygote not ready yet, a host that is not root) starts
//! cold, and is counted by reason.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_sandbox::{Child, Command, Policy, SpawnError, Zygote, ZygoteSpec};
use serde::{Deserialize, Serialize};

/// The `[zygote]` settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZygoteConfig {
    /// Fresh sandboxes are forks of a zygote where it can serve them; off: every sandbox
    /// starts its own interpreter.
    pub enabled: bool,
    /// Modules the zygote imports once (each where installed; a failed import is logged).
    pub preload: Vec<String>,
    /// A zygote is replaced after this many children...
    pub recycle_after: u64,
    /// ...or this many seconds, which bounds what its children share (address-space layout,
    /// hash seed).
    pub recycle_seconds: u64,
    /// airlock's library (`libairlock_sandbox.so`); by default the one beside the binary.
    pub library: Option<PathBuf>,
}

impl Default for ZygoteConfig {
    fn default() -> Self {
        ZygoteConfig {
            enabled: true,
            preload: [
                "numpy",
                "pandas",
                "matplotlib.pyplot",
                "pandas.plotting._matplotlib",
            ]
            .map(String::from)
            .to_vec(),
            recycle_after: 10_000,
            recycle_seconds: 3600,
            library: None,
        }
    }
}

/// Zygotes kept for roots not used for this long are retired.
const IDLE: Duration = Duration::from_secs(600);
/// A zygote that failed to start is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// At most this many zygotes at once (the default root's and environments').
const MAX_ZYGOTES: usize = 8;
/// Run in each zygote right after its preloads (`ZygoteSpec::warm_up`): a first chart where
/// matplotlib is preloaded, drawn again in the fork the zygote surveys.
const WARM_UP: &str = include_str!("zygote_warm_up.py");

enum Slot {
    Starting,
    Ready {
        zygote: Arc<Zygote>,
        used: Instant,
        /// A replacement is being started; this one serves until it is ready.
        replacing: bool,
    },
    Failed(Instant),
}

/// What the counters say, for metrics, `/readyz` and `airlock doctor`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ZygoteStatus {
    pub enabled: bool,
    /// Why zygotes cannot be used at all on this host, when they cannot.
    pub unavailable: Option<String>,
    pub ready: usize,
    pub starting: usize,
    /// Children alive now, across zygotes.
    pub children: usize,
    /// Sandboxes made as zygote children.
    pub spawned: u64,
    /// What a child of each ready zygote copies of it while it waits for its request (the
    /// pages the runner's rehearsal of a small request writes, and a first chart's where
    /// `matplotlib.pyplot` is preloaded), summed.
    pub prefault_bytes: u64,
    /// Ready zygotes that clone each child straight into its cgroup on cgroup v2 (one with a
    /// thread of its own forks, and the child joins through `cgroup.procs`).
    pub cloning: usize,
    /// Sandboxes started cold instead, by reason.
    pub cold: BTreeMap<String, u64>,
    pub starts: u64,
    pub failures: u64,
    pub last_error: Option<String>,
}

struct Start {
    key: String,
    spec: ZygoteSpec,
    policy: Policy,
}

/// The engine's zygotes.
pub(crate) struct Zygotes {
    config: ZygoteConfig,
    library: Result<PathBuf, String>,
    slots: Mutex<BTreeMap<String, Slot>>,
    /// Zygotes are started on one long-lived thread: a sandbox dies with the thread that
    /// started it.
    starter: Mutex<Sender<Start>>,
    spawned: AtomicU64,
    cold: Mutex<BTreeMap<String, u64>>,
    starts: AtomicU64,
    failures: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Set by `close`: no zygote is started or kept from then on.
    closed: std::sync::atomic::AtomicBool,
    /// Starts under way on the starter thread, which `close` waits for.
    in_flight: std::sync::atomic::AtomicUsize,
    /// Kills the template of the zygote being started, which `close` ends rather than wait
    /// for (a preloading zygote on a loaded host takes seconds).
    starting: Mutex<Option<airlock_sandbox::Killer>>,
    /// Zygotes retired whose children may still run, which `close` ends too.
    retiring: Mutex<Vec<Arc<Zygote>>>,
}

impl std::fmt::Debug for Zygotes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zygotes")
            .field("config", &self.config)
            .finish()
    }
}

impl Zygotes {
    pub(crate) fn new(config: ZygoteConfig) -> Arc<Zygotes> {
        let library = match &config.library {
            Some(path) => Ok(path.clone()),
            None => airlock_sandbox::own_exe()
                .and_then(|exe| airlock_sandbox::library_beside(&exe))
                .ok_or_else(|| {
                    format!(
                        "{} is not beside the airlock binary (build the workspace, or set \
                         [zygote] library)",
                        airlock_sandbox::LIBRARY_NAME
                    )
                }),
        };
        let library = library.and_then(|path| {
            if nix::unistd::geteuid().is_root() {
                Ok(path)
            } else {
                Err("zygotes need airlock to run as root (each maps a block of host uids)".into())
            }
        });
        let (tx, rx) = channel::<Start>();
        let zygotes = Arc::new(Zygotes {
            config,
            library,
            slots: Mutex::new(BTreeMap::new()),
            starter: Mutex::new(tx),
            spawned: AtomicU64::new(0),
            cold: Mutex::new(BTreeMap::new()),
            starts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            last_error: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            starting: Mutex::new(None),
            retiring: Mutex::new(Vec::new()),
        });
        let weak = Arc::downgrade(&zygotes);
        std::thread::Builder::new()
            .name("airlock-zygotes".into())
            .spawn(move || {
                for start in rx {
                    let Some(zygotes) = weak.upgrade() else { break };
                    zygotes.start(start);
                }
            })
            .expect("starting the zygote thread");
        zygotes
    }

    fn start(&self, start: Start) {
        if self.closed.load(Ordering::SeqCst) {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        self.starts.fetch_add(1, Ordering::Relaxed);
        let started = Zygote::start_watched(&start.spec, &start.policy, |killer| {
            let mut starting = self.starting();
            // `close` sets `closed` before it looks here: either it finds this killer or
            // this sees that it came.
            if self.closed.load(Ordering::SeqCst) {
                killer.kill(airlock_sandbox::KillReason::Cancelled);
            }
            *starting = Some(killer);
        });
        self.starting().take();
        let mut slots = self.slots();
        if self.closed.load(Ordering::SeqCst) {
            // Closed meanwhile: it goes now (dropping it kills it and waits), not at exit.
            drop(slots);
            drop(started);
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        match started {
            Ok(zygote) => {
                let old = slots.insert(
                    start.key,
                    Slot::Ready {
                        zygote: Arc::new(zygote),
                        used: Instant::now(),
                        replacing: false,
                    },
                );
                if let Some(Slot::Ready { zygote, .. }) = old {
                    self.retire(zygote);
                }
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "a zygote failed to start; sandboxes start cold");
                *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                if let Some(Slot::Ready { replacing, .. }) = slots.get_mut(&start.key) {
                    // The old one keeps serving; the next recycle check tries again.
                    *replacing = false;
                } else {
                    slots.insert(start.key, Slot::Failed(Instant::now()));
                }
            }
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn starting(&self) -> std::sync::MutexGuard<'_, Option<airlock_sandbox::Killer>> {
        self.starting.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn count_cold(&self, reason: &str) {
        *self
            .cold
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason.to_owned())
            .or_default() += 1;
    }

    /// Whether a zygote preloads anything (a pool of its children is worth keeping).
    pub(crate) fn preloads(&self) -> bool {
        self.config.enabled && !self.config.preload.is_empty()
    }

    /// Whether `code` names one of the preloaded modules' packages: it then runs in a child
    /// of the zygote that preloads them, and anything else in one of the lean zygote (a
    /// smaller process forks and ends faster). Either way the sandbox is the same; a guess
    /// wrong either way only costs time.
    pub(crate) fn wants_preloads(&self, code: &str) -> bool {
        self.config.enabled
            && self.config.preload.iter().any(|module| {
                let package = module.split('.').next().unwrap_or(module);
                names(code, package)
            })
    }

    fn ask_start(
        &self,
        key: String,
        command: &Command,
        policy: &Policy,
        preload: bool,
        sys_path: Vec<String>,
    ) {
        let Ok(library) = &self.library else { return };
        let modules = if preload {
            self.config.preload.clone()
        } else {
            Vec::new()
        };
        let Some(mut spec) = ZygoteSpec::for_command(command, modules, sys_path, library.clone())
        else {
            return;
        };
        // The runner defines everything once in the zygote (see its `__zygote_start__`),
        // the part it loads on demand (charts, files, tools, tracebacks) included: compiling
        // that costs about 3 ms, which each child would otherwise pay.
        spec.prepare = true;
        spec.prepare_more = format!("{}\nLOADED.append(True)\n", crate::runner::MORE);
        spec.warm_up = WARM_UP.to_owned();
        // One BLAS thread: a pool of them would be stopped and started again around every
        // fork (OpenBLAS's fork handlers), and a sandbox has one core's worth of CPU anyway.
        // Read as the preloads load; the children's environment is the one they are given.
        for name in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
            spec.preload_env.insert(name.into(), "1".into());
        }
        let start = Start {
            key,
            spec,
            policy: policy.clone(),
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let sent = self
            .starter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(start);
        if sent.is_err() {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The zygote for `policy`'s root if one is ready (starting one in the background if
    /// not), or why the sandbox starts cold.
    fn zygote_for(
        &self,
        command: &Command,
        policy: &Policy,
        preload: bool,
        sys_path: impl FnOnce() -> Vec<String>,
    ) -> Result<Arc<Zygote>, &'static str> {
        if !self.config.enabled {
            return Err("disabled");
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err("closed");
        }
        if self.library.is_err() {
            return Err("unavailable");
        }
        if policy.egress_port.is_some() {
            return Err("egress");
        }
        // A volume's idmapped mount is made as root on the host, which a zygote is not.
        if !policy.volumes.is_empty() {
            return Err("volumes");
        }
        if !policy.seccomp.is_required() {
            return Err("seccomp_downgraded");
        }
        let preload = preload && !self.config.preload.is_empty();
        let key = format!(
            "{}{}",
            if preload { "preloaded " } else { "lean " },
            serde_json::to_string(&policy.root).unwrap_or_default()
        );
        let now = Instant::now();
        let mut slots = self.slots();
        // Zygotes of roots no longer used go, as environments' pools do.
        let idle: Vec<String> = slots
            .iter()
            .filter(|(k, s)| {
                **k != key
                    && matches!(s, Slot::Ready { used, .. } if now.duration_since(*used) > IDLE)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in idle {
            if let Some(Slot::Ready { zygote, .. }) = slots.remove(&k) {
                self.retire(zygote);
            }
        }
        match slots.get_mut(&key) {
            Some(Slot::Ready {
                zygote,
                used,
                replacing,
            }) => {
                if !zygote.is_alive() {
                    let tail = zygote.log_tail();
                    tracing::warn!(log = %tail.trim(), "a zygote died; starting another");
                    slots.insert(key.clone(), Slot::Starting);
                    drop(slots);
                    self.ask_start(key, command, policy, preload, sys_path());
                    return Err("zygote_restarting");
                }
                if !zygote.serves(command, policy) {
                    return Err("other_program");
                }
                *used = now;
                let zygote = Arc::clone(zygote);
                let due = zygote.spawned() >= self.config.recycle_after
                    || zygote.age() >= Duration::from_secs(self.config.recycle_seconds);
                if due && !*replacing {
                    *replacing = true;
                    drop(slots);
                    self.ask_start(key, command, policy, preload, sys_path());
                }
                Ok(zygote)
            }
            Some(Slot::Starting) => Err("zygote_starting"),
            Some(Slot::Failed(at)) if now.duration_since(*at) < RETRY_AFTER => Err("zygote_failed"),
            _ => {
                if slots.len() >= MAX_ZYGOTES {
                    return Err("too_many_zygotes");
                }
                slots.insert(key.clone(), Slot::Starting);
                drop(slots);
                self.ask_start(key, command, policy, preload, sys_path());
                Err("zygote_starting")
            }
        }
    }

    /// Waits until the zygote for `command` and `policy` is ready; why not when it cannot be.
    pub(crate) fn wait_ready(
        &self,
        command: &Command,
        policy: &Policy,
        preload: bool,
        sys_path: impl Fn() -> Vec<String>,
        within: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            match self.zygote_for(command, policy, preload, &sys_path) {
                Ok(_) => return Ok(()),
                Err("zygote_starting" | "zygote_restarting") if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err("unavailable") => {
                    return Err(self.library.clone().err().unwrap_or_default());
                }
                Err("zygote_failed") => {
                    let error = self.last_error.lock().unwrap_or_else(|e| e.into_inner());
                    return Err(error.clone().unwrap_or_else(|| "it failed to start".into()));
                }
                Err(reason) => return Err(format!("a zygote cannot make this sandbox ({reason})")),
            }
        }
    }

    /// A sandbox for `command` as a zygote's child; `Err(command)` (given back) when it must
    /// start cold, a zygote's failure to make the child included.
    pub(crate) fn spawn(
        &self,
        command: Command,
        policy: &Policy,
        preload: bool,
        sys_path: impl FnOnce() -> Vec<String>,
    ) -> Result<Child, Command> {
        let zygote = match self.zygote_for(&command, policy, preload, sys_path) {
            Ok(zygote) => zygote,
            Err(reason) => {
                self.count_cold(reason);
                return Err(command);
            }
        };
        let Ok(fallback) = command.try_clone() else {
            self.count_cold("descriptors");
            return Err(command);
        };
        match zygote.spawn(command, policy) {
            Ok(child) => {
                self.spawned.fetch_add(1, Ordering::Relaxed);
                Ok(child)
            }
            Err(e) => {
                tracing::debug!(error = %e, "a zygote could not make a child; starting cold");
                self.count_cold("zygote_refused");
                Err(fallback)
            }
        }
    }

    /// As `spawn`, for a pooled child of the preloading zygote: [`None`], and nothing counted,
    /// while that zygote cannot serve (the pool waits for it; its start is asked for here).
    pub(crate) fn spawn_preloaded(
        &self,
        command: Command,
        policy: &Policy,
        sys_path: impl FnOnce() -> Vec<String>,
    ) -> Option<Result<Child, SpawnError>> {
        let zygote = self.zygote_for(&command, policy, true, sys_path).ok()?;
        let child = zygote.spawn(command, policy);
        if child.is_ok() {
            self.spawned.fetch_add(1, Ordering::Relaxed);
        }
        Some(child)
    }

    pub(crate) fn status(&self) -> ZygoteStatus {
        let slots = self.slots();
        let mut status = ZygoteStatus {
            enabled: self.config.enabled,
            unavailable: self.library.as_ref().err().cloned(),
            spawned: self.spawned.load(Ordering::Relaxed),
            cold: self.cold.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            starts: self.starts.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            ..ZygoteStatus::default()
        };
        for slot in slots.values() {
            match slot {
                Slot::Starting => status.starting += 1,
                Slot::Ready { zygote, .. } => {
                    status.ready += 1;
                    status.children += zygote.children();
                    status.prefault_bytes += zygote.prefault_bytes();
                    status.cloning += usize::from(zygote.clones_into_cgroups());
                }
                Slot::Failed(_) => {}
            }
        }
        status
    }

    /// Ends every zygote now, with their children (at shutdown), including one still being
    /// started, and starts no more: nothing of them is left when this returns.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Killed, not waited for: its start fails at once and the starter thread drops it.
        if let Some(killer) = self.starting().as_ref() {
            killer.kill(airlock_sandbox::KillReason::Cancelled);
        }
        let all = std::mem::take(&mut *self.slots());
        for slot in all.into_values() {
            if let Slot::Ready { zygote, .. } = slot {
                zygote.shutdown();
            }
        }
        let retiring =
            std::mem::take(&mut *self.retiring.lock().unwrap_or_else(|e| e.into_inner()));
        for zygote in retiring {
            zygote.shutdown();
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Retires a zygote once nothing else holds it: its children finish first.
    fn retire(&self, zygote: Arc<Zygote>) {
        let mut retiring = self.retiring.lock().unwrap_or_else(|e| e.into_inner());
        // Those whose retirement ended are held by this list alone.
        retiring.retain(|z| Arc::strong_count(z) > 1);
        retiring.push(Arc::clone(&zygote));
        std::thread::spawn(move || {
            // Until the spawns that hold it are done; then it takes no more children.
            while Arc::strong_count(&zygote) > 2 {
                std::thread::sleep(Duration::from_millis(100));
            }
            zygote.retire();
        });
    }
}

/// Whether `word` occurs in `text` as a whole identifier.
fn names(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_that_names_a_preloaded_package_goes_to_the_preloading_zygote() {
        let z = Zygotes::new(ZygoteConfig::default());
        assert!(z.wants_preloads("import pandas as pd"));
        assert!(z.wants_preloads("from matplotlib import pyplot"));
        assert!(z.wants_preloads("x = numpy.zeros(3)"));
        assert!(!z.wants_preloads("print(1)"));
        assert!(!z.wants_preloads("import numpyro, pandas_ta_lite"));
        let off = Zygotes::new(ZygoteConfig {
            preload: Vec::new(),
            ..ZygoteConfig::default()
        });
        assert!(!off.wants_preloads("import pandas"));
    }
}
