//! What the server's life tells every service: whether shutdown has begun (and a signal for
//! those who wait on something else meanwhile), whether sandboxes start (the start-up trial
//! run, each execution's sandbox, and the retrials while they do not), and the executions
//! running now, which shutdown cancels.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use airlock_engine::Cancel;

/// How often `/readyz` may try a trial run again while sandboxes cannot start.
const RETRIAL_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct Lifecycle {
    shutting_down: AtomicBool,
    /// Turns true on shutdown, for whoever waits on something else meanwhile.
    shutdown: tokio::sync::watch::Sender<bool>,
    /// Whether sandboxes start: the start-up trial run, then each execution's sandbox (a
    /// failed start sets it, a sandbox that runs clears it), and why not.
    trial: Mutex<Result<(), String>>,
    /// When a trial run was last tried again while sandboxes could not start, and whether
    /// one is running.
    retrial: Arc<Mutex<(Option<Instant>, bool)>>,
    running: Arc<Mutex<HashMap<u64, Cancel>>>,
    next_execution: AtomicU64,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            shutting_down: AtomicBool::new(false),
            shutdown: tokio::sync::watch::Sender::new(false),
            trial: Mutex::new(Err("not run yet".into())),
            retrial: Arc::new(Mutex::new((None, false))),
            running: Arc::new(Mutex::new(HashMap::new())),
            next_execution: AtomicU64::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lifecycle {
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Shutdown has begun: said once, to every waiter.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
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

    /// Whether sandboxes start, and why not.
    pub fn trial(&self) -> Result<(), String> {
        lock(&self.trial).clone()
    }

    /// What a trial run found.
    pub fn set_trial(&self, trial: Result<(), String>) {
        *lock(&self.trial) = trial;
    }

    /// A sandbox could not start (too many open files, the interpreter gone): `/readyz` says
    /// so until one runs again.
    pub fn sandboxes_failed(&self, why: &str) {
        let mut trial = lock(&self.trial);
        if trial.is_ok() {
            tracing::error!(error = %why, "a sandbox could not start; not ready until one does");
        }
        *trial = Err(format!("sandboxes cannot start: {why}"));
    }

    /// A sandbox ran: whatever kept them from starting has gone.
    pub fn sandboxes_work(&self) {
        let mut trial = lock(&self.trial);
        if trial.is_err() {
            tracing::info!("sandboxes start again; ready");
            *trial = Ok(());
        }
    }

    /// A retrial to run now, if sandboxes cannot start, none runs, the last was at least
    /// `RETRIAL_EVERY` ago and shutdown has not begun: the next may run once it is dropped.
    pub fn retrial_due(&self) -> Option<Retrial> {
        if lock(&self.trial).is_ok() {
            return None;
        }
        let mut retrial = lock(&self.retrial);
        let due = retrial.0.is_none_or(|at| at.elapsed() >= RETRIAL_EVERY);
        if retrial.1 || !due || self.is_shutting_down() {
            return None;
        }
        *retrial = (Some(Instant::now()), true);
        Some(Retrial(self.retrial.clone()))
    }

    /// Kills every running execution's sandbox.
    pub fn cancel_all(&self) -> usize {
        let running = lock(&self.running);
        for cancel in running.values() {
            cancel.cancel();
        }
        running.len()
    }

    pub fn running_count(&self) -> usize {
        lock(&self.running).len()
    }

    /// Registers a running execution so that shutdown can cancel it; deregistered on drop.
    pub fn track(&self, cancel: Cancel) -> Tracked {
        let id = self.next_execution.fetch_add(1, Ordering::Relaxed);
        lock(&self.running).insert(id, cancel);
        Tracked {
            running: self.running.clone(),
            id,
        }
    }
}

/// A retrial under way; the next may start once it is dropped, however it ends (a panic too).
#[derive(Debug)]
pub struct Retrial(Arc<Mutex<(Option<Instant>, bool)>>);

impl Drop for Retrial {
    fn drop(&mut self) {
        lock(&self.0).1 = false;
    }
}

/// A running execution, known to shutdown until it is dropped.
#[derive(Debug)]
pub struct Tracked {
    running: Arc<Mutex<HashMap<u64, Cancel>>>,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        lock(&self.running).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retrial_is_due_only_while_sandboxes_fail_and_one_at_a_time() {
        let life = Lifecycle::default();
        life.set_trial(Ok(()));
        assert!(
            life.retrial_due().is_none(),
            "sandboxes start: nothing to retry"
        );
        life.sandboxes_failed("no interpreter");
        let first = life.retrial_due().expect("due while sandboxes fail");
        assert!(life.retrial_due().is_none(), "one runs already");
        drop(first);
        assert!(
            life.retrial_due().is_none(),
            "the next waits its time after the last"
        );
        life.sandboxes_work();
        assert!(life.trial().is_ok());
    }

    #[test]
    fn tracked_executions_are_cancelled_together_and_forgotten_when_dropped() {
        let life = Lifecycle::default();
        let (a, b) = (Cancel::default(), Cancel::default());
        let tracked_a = life.track(a.clone());
        let _tracked_b = life.track(b.clone());
        assert_eq!(life.running_count(), 2);
        drop(tracked_a);
        assert_eq!(life.running_count(), 1);
        assert_eq!(life.cancel_all(), 1);
        assert!(b.is_cancelled() && !a.is_cancelled());
    }
}
