//! The warm pool: sandboxes started ahead of their work, so an execution does not wait for a
//! sandbox to be built and an interpreter to start.
//!
//! A pooled sandbox is an ordinary sandbox in every respect (the same policy, namespaces,
//! cgroup, seccomp filter and Landlock ruleset as a cold one), whose runner has started and
//! waits for its request. Each serves exactly one execution and is destroyed with it: nothing
//! is ever returned to the pool. The pool holds sandboxes built for the default limits; a job
//! with other limits (beyond its timeout, which only the host enforces) gets a cold sandbox.
//!
//! Threads: a sandbox dies with the thread that started it (`PR_SET_PDEATHSIG` follows the
//! parent thread), so pooled sandboxes are started by the pool's own worker threads, which
//! live until every idle sandbox has been destroyed at `close`.
//!
//! Sizing: the pool keeps `size` sandboxes idle; each take that finds it empty raises the
//! target by one, up to `max_size`, and the target falls back by one per `shrink_after_ms`
//! without such a miss.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use airlock_sandbox::{Child, Policy};
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::launcher::{said_ready, Launcher, Mode};
use crate::policy::{self, EnvMount};
/// First pause after a failed start; it doubles up to `MAX_BACKOFF`.
const BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often a pool of the preloading zygote's children looks again while that zygote starts.
const ZYGOTE_WAIT: Duration = Duration::from_millis(200);
/// The longest a refill waits for running executions to end (see [`defer_refill`]).
const LAZY_REFILL: Duration = Duration::from_millis(100);
/// Refills allowed at once however few executions run (see [`refills_at_once`]).
const MIN_REFILLS_AT_ONCE: usize = 2;
/// How long an environment's pool outlives its last execution.
const ENV_POOL_IDLE: Duration = Duration::from_secs(600);

/// Warm pool settings (`[pool]` in the server's configuration).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Sandboxes kept ready at all times; 0 turns the pool off.
    pub size: usize,
    /// The most kept ready when demand outruns `size`.
    pub max_size: usize,
    /// The most sandboxes started at once when refilling (as many as executions are running,
    /// and at least two).
    pub workers: usize,
    /// After this long without an execution finding the pool empty, it keeps one sandbox
    /// fewer ready (down to `size`), and destroys the one too many.
    pub shrink_after_ms: u64,
    /// Children of the preloading zygote kept ready for code that names a preloaded package
    /// (with zygotes on and `size` above 0); 0 keeps none.
    pub preloaded: usize,
    /// How long an execution that finds the pool empty waits for the sandbox a refill is
    /// making before it makes one itself (0: never); one waits per refill under way (at least
    /// one), the others make theirs at once.
    pub wait_for_refill_ms: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 2,
            max_size: 8,
            // A refill spends most of its time waiting for other processes (the zygote's
            // fork, the jail's init, the runner saying it is ready): on two cores, under
            // eight clients, two workers left 10-13 % of the CPU idle (see `refills_at_once`).
            workers: 4,
            shrink_after_ms: 30_000,
            preloaded: 1,
            // About what making a sandbox from nothing takes under load here.
            wait_for_refill_ms: 15,
        }
    }
}

impl PoolConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_size < self.size {
            return Err(format!(
                "pool.max_size ({}) is below pool.size ({})",
                self.max_size, self.size
            ));
        }
        if self.shrink_after_ms == 0 {
            return Err("pool.shrink_after_ms must be greater than zero".into());
        }
        if self.preloaded > 16 {
            return Err(format!("pool.preloaded ({}) is above 16", self.preloaded));
        }
        if self.wait_for_refill_ms > 10_000 {
            return Err(format!(
                "pool.wait_for_refill_ms ({}) is above 10000",
                self.wait_for_refill_ms
            ));
        }
        if self.max_size > 256 {
            return Err(format!("pool.max_size ({}) is above 256", self.max_size));
        }
        if self.size > 0 && !(1..=16).contains(&self.workers) {
            return Err(format!(
                "pool.workers ({}) must be between 1 and 16",
                self.workers
            ));
        }
        Ok(())
    }
}

/// A sandbox whose runner is ready for its request.
pub(crate) struct Warm {
    pub child: Child,
    pub control: UnixStream,
}

/// What the pool is doing, for metrics, `/readyz` and `airlock doctor`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolStatus {
    pub size: usize,
    pub max_size: usize,
    /// What the pool is filling up to now (between `size` and `max_size`).
    pub target: usize,
    pub idle: usize,
    /// Pooled sandboxes running an execution now.
    pub in_use: u64,
    pub starting: usize,
    /// Executions that got a pooled sandbox.
    pub takes: u64,
    /// Of those, the ones that found the pool empty and waited for a refill's sandbox.
    pub waits: u64,
    /// Executions that found the pool empty and got no refill's sandbox: none came in time, or
    /// every refill under way was already waited for (they start one of their own).
    pub misses_empty: u64,
    /// Executions whose limits differ from the pool's (they always start cold).
    pub misses_limits: u64,
    /// Sandboxes added to the pool.
    pub refills: u64,
    /// Pooled sandboxes that failed to start, or were found dead when taken.
    pub failures: u64,
    pub last_error: Option<String>,
}

struct State {
    idle: VecDeque<Warm>,
    starting: usize,
    /// Takes that found the pool empty and wait for a refill's sandbox.
    waiting: usize,
    target: usize,
    last_miss: Instant,
    last_take: Instant,
    /// No more sandboxes go into the pool.
    closed: bool,
    /// The workers may exit: every sandbox they started is gone.
    stop: bool,
    last_error: Option<String>,
    /// After a failed start no worker starts another before this (one pause for the whole
    /// pool: a start that fails for one worker fails for the others too).
    retry_at: Option<Instant>,
    /// The next pause after a failure: `BACKOFF`, doubled by each, back after a success.
    backoff: Duration,
}

struct Shared {
    launcher: Launcher,
    policy: Policy,
    /// Its sandboxes are children of the preloading zygote.
    preload: bool,
    config: PoolConfig,
    state: Mutex<State>,
    /// Where the refill workers wait for work: a take, a sandbox given back, a close.
    work: Condvar,
    /// Where takes that found the pool empty wait for a refill's sandbox. Apart from `work`,
    /// so that neither wakes the other's waiters for nothing (each wake-up is a context
    /// switch, and they wait many at a time under load).
    ready: Condvar,
    in_use: AtomicU64,
    takes: AtomicU64,
    waits: AtomicU64,
    misses_empty: AtomicU64,
    misses_limits: AtomicU64,
    refills: AtomicU64,
    failures: AtomicU64,
}

/// A warm pool. Dropping it (or `close`) destroys every idle sandbox.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.shared.config)
            .finish()
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counts a pooled sandbox as in use until dropped.
pub(crate) struct InUse(Arc<Shared>);

impl Drop for InUse {
    fn drop(&mut self) {
        // Under the lock, so that a worker deciding to defer cannot miss the wake-up. One
        // worker: it wakes the next if there is more to start (see `refill`).
        let _state = self.0.state();
        self.0.in_use.fetch_sub(1, Ordering::Relaxed);
        self.0.work.notify_one();
    }
}

impl Pool {
    /// Starts filling a pool of sandboxes built from `policy` (an environment's, or the
    /// defaults'); with `preload`, children of the preloading zygote.
    pub(crate) fn start_for(
        launcher: &Launcher,
        config: PoolConfig,
        policy: Policy,
        preload: bool,
    ) -> Result<Pool, String> {
        config.validate()?;
        let shared = Arc::new(Shared {
            launcher: launcher.clone(),
            policy,
            preload,
            state: Mutex::new(State {
                idle: VecDeque::new(),
                starting: 0,
                waiting: 0,
                target: config.size,
                last_miss: Instant::now(),
                last_take: Instant::now(),
                closed: false,
                stop: false,
                last_error: None,
                retry_at: None,
                backoff: BACKOFF,
            }),
            config: config.clone(),
            work: Condvar::new(),
            ready: Condvar::new(),
            in_use: AtomicU64::new(0),
            takes: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            misses_empty: AtomicU64::new(0),
            misses_limits: AtomicU64::new(0),
            refills: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        });
        let workers = if config.size == 0 { 0 } else { config.workers };
        let handles = (0..workers)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("airlock-pool-{i}"))
                    .spawn(move || refill(&shared))
                    .map_err(|e| format!("starting a pool thread: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Pool {
            shared,
            workers: Mutex::new(handles),
        })
    }

    /// A ready sandbox for `policy`, if the pool holds one built for it. The sandbox is
    /// removed from the pool for good.
    pub(crate) fn take(&self, policy: &Policy) -> Option<(Warm, InUse)> {
        let s = &self.shared;
        if s.config.size == 0 {
            return None;
        }
        if !same_sandbox(&s.policy, policy) {
            s.misses_limits.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        loop {
            let mut state = s.state();
            let (warm, mut state) = match state.idle.pop_front() {
                Some(warm) => (warm, state),
                None if state.closed => return None,
                None => {
                    // Demand outran the pool: it keeps more ready from now on, and a refill
                    // starts if none is under way.
                    state.target = (state.target + 1).min(s.config.max_size);
                    state.last_miss = Instant::now();
                    s.work.notify_one();
                    // The sandbox a refill is making is ready sooner than one made from
                    // nothing, which would also take the CPU that one needs: wait for it, a
                    // while, unless every refill under way is already waited for.
                    let backing_off = !retry_wait(&state).is_zero();
                    if !waits_for_a_refill(state.waiting, state.starting, backing_off) {
                        s.misses_empty.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                    state.waiting += 1;
                    let (got, mut state) = wait_for_refill(s, state);
                    state.waiting -= 1;
                    let Some(warm) = got else {
                        if !state.closed {
                            s.misses_empty.fetch_add(1, Ordering::Relaxed);
                        }
                        return None;
                    };
                    s.waits.fetch_add(1, Ordering::Relaxed);
                    (warm, state)
                }
            };
            // Counted in use before the workers hear of the take (see `defer_refill`).
            state.last_take = Instant::now();
            s.in_use.fetch_add(1, Ordering::Relaxed);
            s.work.notify_one();
            drop(state);
            let in_use = InUse(s.clone());
            // A runner that wrote anything more, or whose end closed, is not a ready runner.
            // It waited in the background; it runs with the CPU weight of a cold one.
            let unfit = if readable(&warm.control) {
                Some("a pooled sandbox was found dead".to_owned())
            } else {
                (warm.child.foreground())
                    .err()
                    .map(|e| format!("giving a pooled sandbox its CPU weight: {e}"))
            };
            if let Some(why) = unfit {
                s.failures.fetch_add(1, Ordering::Relaxed);
                s.state().last_error = Some(why);
                drop(warm);
                drop(in_use);
                continue;
            }
            s.takes.fetch_add(1, Ordering::Relaxed);
            return Some((warm, in_use));
        }
    }

    pub fn status(&self) -> PoolStatus {
        let s = &self.shared;
        let state = s.state();
        PoolStatus {
            size: s.config.size,
            max_size: s.config.max_size,
            target: state.target,
            idle: state.idle.len(),
            in_use: s.in_use.load(Ordering::Relaxed),
            starting: state.starting,
            takes: s.takes.load(Ordering::Relaxed),
            waits: s.waits.load(Ordering::Relaxed),
            misses_empty: s.misses_empty.load(Ordering::Relaxed),
            misses_limits: s.misses_limits.load(Ordering::Relaxed),
            refills: s.refills.load(Ordering::Relaxed),
            failures: s.failures.load(Ordering::Relaxed),
            last_error: state.last_error.clone(),
        }
    }

    /// Host pids of the processes of every idle sandbox, one list per sandbox (to measure
    /// what an idle sandbox costs).
    pub fn idle_processes(&self) -> Vec<Vec<i32>> {
        self.shared
            .state()
            .idle
            .iter()
            .map(|w| w.child.processes())
            .collect()
    }

    /// Stops refilling and destroys every idle sandbox. Sandboxes taken from the pool must
    /// be finished first: they die with the workers, which exit here.
    pub fn close(&self) {
        let idle: Vec<Warm> = {
            let mut state = self.shared.state();
            state.closed = true;
            state.idle.drain(..).collect()
        };
        // Destroyed while the workers that started them still live, so each goes through
        // its own orderly kill and clean-up.
        drop(idle);
        self.shared.state().stop = true;
        self.shared.work.notify_all();
        self.shared.ready.notify_all();
        let workers: Vec<_> =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in workers {
            let _ = w.join();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.close();
    }
}

/// Warm pools for environments in demand: one per stored environment, started by the first
/// execution that names it (which itself starts cold), closed once unused for
/// `ENV_POOL_IDLE`.
#[derive(Debug)]
pub(crate) struct EnvPools {
    config: PoolConfig,
    pools: Mutex<BTreeMap<String, (Arc<Pool>, Instant)>>,
}

impl EnvPools {
    /// Pools of `config` (each keeps one sandbox ready once asked for, more while in
    /// demand).
    pub(crate) fn new(config: PoolConfig) -> Self {
        EnvPools {
            config,
            pools: Mutex::new(BTreeMap::new()),
        }
    }

    fn pools(&self) -> MutexGuard<'_, BTreeMap<String, (Arc<Pool>, Instant)>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pool of `env`'s sandboxes, started now (with `launcher`, from `defaults`, the
    /// policy of the default limits) if it was not running; pools unused for
    /// `ENV_POOL_IDLE` are closed on the way.
    pub(crate) fn get(
        &self,
        launcher: &Launcher,
        env: &EnvMount,
        defaults: impl FnOnce() -> Policy,
    ) -> Option<Arc<Pool>> {
        let now = Instant::now();
        let (pool, stale) = {
            let mut map = self.pools();
            let stale: Vec<Arc<Pool>> = {
                let old: Vec<String> = map
                    .iter()
                    .filter(|(hash, (_, used))| {
                        **hash != env.hash && now.duration_since(*used) > ENV_POOL_IDLE
                    })
                    .map(|(hash, _)| hash.clone())
                    .collect();
                old.iter()
                    .filter_map(|h| map.remove(h))
                    .map(|(p, _)| p)
                    .collect()
            };
            let pool = match map.get_mut(&env.hash) {
                Some((pool, used)) => {
                    *used = now;
                    Some(pool.clone())
                }
                None => {
                    // Built for the default limits, like the main pool's.
                    let mut policy = defaults();
                    policy::with_environment(&mut policy, env);
                    let config = self.config.clone();
                    if let Ok(pool) = Pool::start_for(launcher, config, policy, false) {
                        map.insert(env.hash.clone(), (Arc::new(pool), now));
                    }
                    // This execution goes cold; the next finds a sandbox ready.
                    None
                }
            };
            (pool, stale)
        };
        for pool in stale {
            pool.close();
        }
        pool
    }

    /// Closes the pool of the environment stored as `hash`, if it has one.
    pub(crate) fn close(&self, hash: &str) {
        let pool = self.pools().remove(hash);
        if let Some((pool, _)) = pool {
            pool.close();
        }
    }

    /// The pools, with how many sandboxes each holds ready.
    pub(crate) fn status(&self) -> Vec<(String, PoolStatus)> {
        self.pools()
            .iter()
            .map(|(hash, (pool, _))| (hash.clone(), pool.status()))
            .collect()
    }

    /// Closes every pool.
    pub(crate) fn close_all(&self) {
        let all: Vec<Arc<Pool>> = std::mem::take(&mut *self.pools())
            .into_values()
            .map(|(p, _)| p)
            .collect();
        for pool in all {
            pool.close();
        }
    }
}

/// Whether a sandbox built from `pooled` is the sandbox `wanted` would build: the same policy
/// in everything but the wall clock, which the host alone enforces and restarts at take.
fn same_sandbox(pooled: &Policy, wanted: &Policy) -> bool {
    let mut wanted = wanted.clone();
    wanted.limits.wall_time = pooled.limits.wall_time;
    *pooled == wanted
}

fn readable(control: &UnixStream) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) => n > 0,
        Err(_) => true,
    }
}

/// The first sandbox a refill adds to the empty pool, or [`None`] when none comes within
/// `wait_for_refill_ms` or the pool closes.
fn wait_for_refill<'a>(
    s: &'a Shared,
    state: MutexGuard<'a, State>,
) -> (Option<Warm>, MutexGuard<'a, State>) {
    // With none idle a refill is under way or due (the workers start one whenever `idle +
    // starting` is below the target, at least 1, and defer none while none is idle), unless
    // the last start failed and they back off: then the wait ends at its limit.
    let wait = Duration::from_millis(s.config.wait_for_refill_ms);
    let (mut state, _) = s
        .ready
        .wait_timeout_while(state, wait, |st| st.idle.is_empty() && !st.closed)
        .unwrap_or_else(|e| e.into_inner());
    let warm = if state.closed {
        None
    } else {
        state.idle.pop_front()
    };
    (warm, state)
}

/// One refill worker: keeps `idle + starting` at the target until the pool closes.
fn refill(s: &Arc<Shared>) {
    loop {
        // Wait for work: sandboxes to shed, or one to start.
        let excess = {
            let mut state = s.state();
            loop {
                if state.stop {
                    return;
                }
                if !state.closed {
                    let excess = shrink(s, &mut state);
                    if !excess.is_empty() {
                        break excess;
                    }
                    let running = s.in_use.load(Ordering::Relaxed) as usize;
                    let room = state.starting < refills_at_once(running, s.config.workers);
                    if room && state.idle.len() + state.starting < state.target {
                        let wait = retry_wait(&state).max(defer_refill(s, &state));
                        if wait.is_zero() {
                            state.starting += 1;
                            // Takes and ends wake one worker, not all four (each woken
                            // worker is a switch of a busy core): it passes the word on
                            // while more may start.
                            let room = state.starting < refills_at_once(running, s.config.workers);
                            if room && state.idle.len() + state.starting < state.target {
                                s.work.notify_one();
                            }
                            break Vec::new();
                        }
                        state = s
                            .work
                            .wait_timeout(state, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                        continue;
                    }
                }
                state = s
                    .work
                    .wait_timeout(state, Duration::from_secs(1))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        if !excess.is_empty() {
            drop(excess);
            continue;
        }
        let started = start_warm(&s.launcher, &s.policy, s.preload);
        let mut state = s.state();
        state.starting -= 1;
        match started {
            Ok(warm) if state.closed => {
                // Destroyed here, by the thread it would die with.
                drop(state);
                drop(warm);
            }
            Ok(warm) => {
                state.backoff = BACKOFF;
                s.refills.fetch_add(1, Ordering::Relaxed);
                state.idle.push_back(warm);
                // One take may be waiting for it (`wait_for_refill`).
                s.ready.notify_one();
            }
            Err(EngineError::ZygoteNotReady) => {
                // Not a failure: the zygote starts (or cannot, which its own status says).
                // Any word to the workers ends the wait, as it ends their others: a worker
                // woken alone must look again, or the word would be lost.
                let _ = s.work.wait_timeout(state, ZYGOTE_WAIT);
            }
            Err(e) => {
                s.failures.fetch_add(1, Ordering::Relaxed);
                state.last_error = Some(e.to_string());
                // The first failure since the last pause starts the next; the others under
                // way at the time fail for the same reason and add none.
                let now = Instant::now();
                if state.retry_at.is_none_or(|t| t <= now) {
                    state.retry_at = Some(now + state.backoff);
                    state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// How long a refill should still wait. Building a sandbox while another runs someone's code
/// slows that execution (they share cores and kernel locks: about 2 ms of a 5 ms `print(1)`
/// here), so while enough sandboxes are idle for the executions running, the refill waits
/// for those to end, or for `LAZY_REFILL` after the last take.
fn defer_refill(s: &Shared, state: &State) -> Duration {
    refill_wait(
        state.idle.len(),
        s.in_use.load(Ordering::Relaxed) as usize,
        state.last_take.elapsed(),
    )
}

/// Whether a take that finds the pool empty waits for a refill's sandbox, `waiting` takes
/// already doing so while `starting` refills are under way: one for each, and the first in
/// any case (a refill is then due, if not yet begun), unless the pool pauses after a failed
/// start (`backing_off`: nothing comes in time). Takes beyond them make their sandbox
/// themselves: queued for the refills instead, eight clients found the pool empty in 3281 of
/// 3317 takes and left 10-12 % of two cores idle between the refills' steps (390-416/s; the
/// pool off, 440-459/s; this rule, 420-431/s; same machine, same hour: BENCHMARKS.md,
/// "Executions beyond the refills make their own").
fn waits_for_a_refill(waiting: usize, starting: usize, backing_off: bool) -> bool {
    !backing_off && waiting < starting.max(1)
}

/// How many refills may be under way at once: as many as executions running (each will want
/// a replacement soon), at least two, at most `workers`. Eight clients keep four workers
/// busy, where two left the CPU idle while they waited for their sandboxes; one client back to
/// back has two, as more sandboxes built beside its execution slowed it (closed-loop p99
/// 7.7-10.3 ms with two at once, 8.4-12.0 ms with four, here).
fn refills_at_once(in_use: usize, workers: usize) -> usize {
    in_use.max(MIN_REFILLS_AT_ONCE).min(workers)
}

/// How long the pool's pause after a failed start still lasts.
fn retry_wait(state: &State) -> Duration {
    state.retry_at.map_or(Duration::ZERO, |t| {
        t.saturating_duration_since(Instant::now())
    })
}

fn refill_wait(idle: usize, in_use: usize, since_take: Duration) -> Duration {
    if in_use == 0 || idle < in_use {
        return Duration::ZERO;
    }
    LAZY_REFILL.saturating_sub(since_take)
}

/// After `shrink_after_ms` without a miss, the target falls by one (not below `size`); returns
/// the idle sandboxes now too many, to destroy outside the lock.
fn shrink(s: &Shared, state: &mut State) -> Vec<Warm> {
    let quiet = Duration::from_millis(s.config.shrink_after_ms);
    if state.target <= s.config.size || state.last_miss.elapsed() < quiet {
        return Vec::new();
    }
    state.target -= 1;
    state.last_miss = Instant::now();
    let keep = state.target.min(state.idle.len());
    state.idle.drain(keep..).collect()
}

/// Starts a sandbox for `policy` whose runner reports ready, then waits for its request.
fn start_warm(launcher: &Launcher, policy: &Policy, preload: bool) -> Result<Warm, EngineError> {
    let (child, control) = launcher.start(policy, Mode::Warm, None, preload)?;
    if !said_ready(&control) {
        // Its own report says what went wrong, when it has one.
        child.killer().kill(airlock_sandbox::KillReason::Cancelled);
        let why = match child.wait() {
            Err(e) => e.to_string(),
            Ok(o) => {
                let how = match o.exit {
                    Some(airlock_sandbox::Exit::Code(c)) => format!("exited with code {c}"),
                    Some(airlock_sandbox::Exit::Signal(s)) => format!("was killed by signal {s}"),
                    None => "ended without an exit status".into(),
                };
                let oom = if o.oom_kills > 0 {
                    " (out of memory: the default memory limit is too small for the interpreter)"
                } else {
                    ""
                };
                format!("the interpreter {how} before it was ready{oom}")
            }
        };
        return Err(EngineError::Io {
            what: "pool: starting a sandbox",
            source: std::io::Error::other(why),
        });
    }
    Ok(Warm { child, control })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;
    use crate::interpreter::Interpreter;

    #[test]
    fn only_a_sandbox_built_alike_is_taken_from_the_pool() {
        let config = EngineConfig::default();
        let Ok(python) = Interpreter::detect(&config.python) else {
            panic!("/usr/bin/python3 is required by the test suite");
        };
        let policy = |limits: &airlock_api::Limits| policy::for_limits(&config, &python, limits);
        let defaults = config.defaults.clone();
        let pooled = policy(&defaults);
        // The timeout is the host's alone: restarted at take.
        let longer = airlock_api::Limits {
            timeout_ms: defaults.timeout_ms * 2,
            output_bytes: defaults.output_bytes * 2,
            ..defaults.clone()
        };
        assert!(same_sandbox(&pooled, &policy(&longer)));
        // Anything the sandbox itself is built with is not.
        for other in [
            airlock_api::Limits {
                memory_mb: defaults.memory_mb / 2,
                ..defaults.clone()
            },
            airlock_api::Limits {
                cpu_ms: defaults.cpu_ms / 2,
                ..defaults.clone()
            },
            airlock_api::Limits {
                pids: defaults.pids / 2,
                ..defaults.clone()
            },
            airlock_api::Limits {
                disk_mb: defaults.disk_mb / 2,
                ..defaults.clone()
            },
        ] {
            assert!(!same_sandbox(&pooled, &policy(&other)), "{other:?}");
        }
    }

    #[test]
    fn a_take_waits_for_a_refill_only_where_one_is_under_way_for_it() {
        // The first waits, even before its refill has begun.
        assert!(waits_for_a_refill(0, 0, false));
        assert!(waits_for_a_refill(0, 2, false));
        assert!(waits_for_a_refill(1, 2, false));
        // Every refill under way is waited for: the next makes its own.
        assert!(!waits_for_a_refill(1, 0, false));
        assert!(!waits_for_a_refill(1, 1, false));
        assert!(!waits_for_a_refill(2, 2, false));
        assert!(!waits_for_a_refill(7, 4, false));
        // While the pool pauses after a failed start, none waits.
        assert!(!waits_for_a_refill(0, 0, true));
        assert!(!waits_for_a_refill(0, 2, true));
    }

    #[test]
    fn refills_at_once_follow_the_executions_running_between_two_and_the_workers() {
        assert_eq!(refills_at_once(0, 4), 2);
        assert_eq!(refills_at_once(1, 4), 2);
        assert_eq!(refills_at_once(3, 4), 3);
        assert_eq!(refills_at_once(8, 4), 4);
        // Fewer workers than the floor: the workers.
        assert_eq!(refills_at_once(0, 1), 1);
        assert_eq!(refills_at_once(8, 16), 8);
    }

    #[test]
    fn a_refill_waits_for_running_executions_while_enough_are_idle() {
        let ms = Duration::from_millis;
        // Nothing running, or fewer idle than running: at once.
        assert_eq!(refill_wait(0, 0, ms(0)), Duration::ZERO);
        assert_eq!(refill_wait(1, 0, ms(0)), Duration::ZERO);
        assert_eq!(refill_wait(0, 1, ms(0)), Duration::ZERO);
        assert_eq!(refill_wait(1, 2, ms(0)), Duration::ZERO);
        // As many idle as running: until they end, at most LAZY_REFILL after the last take.
        assert_eq!(refill_wait(1, 1, ms(0)), LAZY_REFILL);
        assert_eq!(refill_wait(3, 2, ms(30)), LAZY_REFILL - ms(30));
        assert_eq!(refill_wait(1, 1, LAZY_REFILL), Duration::ZERO);
        assert_eq!(refill_wait(1, 1, ms(10_000)), Duration::ZERO);
    }

    #[test]
    fn settings_are_checked() {
        assert!(PoolConfig::default().validate().is_ok());
        let bad = |c: PoolConfig| c.validate().unwrap_err();
        assert!(bad(PoolConfig {
            size: 4,
            max_size: 2,
            ..PoolConfig::default()
        })
        .contains("max_size"));
        assert!(bad(PoolConfig {
            max_size: 1000,
            ..PoolConfig::default()
        })
        .contains("256"));
        assert!(bad(PoolConfig {
            workers: 0,
            ..PoolConfig::default()
        })
        .contains("workers"));
        assert!(bad(PoolConfig {
            shrink_after_ms: 0,
            ..PoolConfig::default()
        })
        .contains("shrink_after_ms"));
        assert!(bad(PoolConfig {
            wait_for_refill_ms: 10_001,
            ..PoolConfig::default()
        })
        .contains("wait_for_refill_ms"));
        assert!(PoolConfig {
            size: 0,
            max_size: 0,
            workers: 0,
            ..PoolConfig::default()
        }
        .validate()
        .is_ok());
    }
}
