//! Who may run now.
//!
//! Before its body is read, a request passes its key's rate limit and a bound on the key's
//! requests in flight (`enter`), so a throttled key cannot make the server buffer bodies for
//! it. Then it waits for a running slot (`admit`): its key's own concurrency, when the key has
//! limits of its own (bounded queue; past it, 429), then the global concurrency (bounded queue;
//! past it, 503). Queues are FIFO, bounded in length and in waiting time, and closed on
//! shutdown. The configured numbers are the numbers enforced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::config::ConcurrencyConfig;
use crate::keys::Key;
use crate::metrics::Metrics;

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// The key's rate limit; retry after this many seconds.
    RateLimited(u64),
    /// The key's own concurrency and queue are full.
    KeyBusy,
    /// The server's concurrency and queue are full.
    Overloaded,
    /// Waited in a queue for longer than allowed.
    QueueTimeout,
    /// The server is shutting down.
    ShuttingDown,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

struct KeyGate {
    /// The key's own concurrency, when it has one.
    running: Option<Arc<Semaphore>>,
    waiting: Mutex<usize>,
    bucket: Mutex<Bucket>,
    /// Requests of this key between `enter` and their answer.
    in_flight: Mutex<usize>,
    /// The key's settings the gate was made for (`max_concurrency`, `rate_per_minute`).
    limits: (Option<usize>, u32),
}

impl KeyGate {
    fn limits_of(k: &Key) -> (Option<usize>, u32) {
        (k.config.max_concurrency, k.config.rate_per_minute)
    }

    fn of(k: &Key) -> KeyGate {
        let rate = f64::from(k.config.rate_per_minute);
        KeyGate {
            running: k
                .config
                .max_concurrency
                .map(|n| Arc::new(Semaphore::new(n))),
            waiting: Mutex::new(0),
            bucket: Mutex::new(Bucket {
                tokens: rate,
                updated: Instant::now(),
            }),
            in_flight: Mutex::new(0),
            limits: KeyGate::limits_of(k),
        }
    }
}

/// A request that passed its key's rate limit and in-flight bound; held until it is answered.
pub struct Entered {
    gate: Arc<KeyGate>,
}

impl std::fmt::Debug for Entered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Entered")
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        *lock(&self.gate.in_flight) -= 1;
    }
}

/// Holds a running slot, globally and for the key, until dropped.
#[derive(Debug)]
pub struct Admitted {
    _key: Option<OwnedSemaphorePermit>,
    _global: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.metrics.running.dec();
    }
}

pub struct Admission {
    config: ConcurrencyConfig,
    global: Arc<Semaphore>,
    global_waiting: Mutex<usize>,
    /// Each key's gate, by name; keys reloaded get theirs (`reload`).
    keys: std::sync::RwLock<HashMap<String, Arc<KeyGate>>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("config", &self.config)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Decrements a waiting count when the wait ends, however it ends (the request may be
/// dropped while it waits: the client went away).
struct Waiting<'a> {
    count: &'a Mutex<usize>,
    gauge: Option<&'a Metrics>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        *lock(self.count) -= 1;
        if let Some(m) = self.gauge {
            m.queue_depth.dec();
        }
    }
}

impl Admission {
    pub fn new(config: ConcurrencyConfig, keys: &[Arc<Key>], metrics: Arc<Metrics>) -> Self {
        let keys = keys
            .iter()
            .map(|k| (k.name().to_owned(), Arc::new(KeyGate::of(k))))
            .collect();
        Admission {
            global: Arc::new(Semaphore::new(config.max_running)),
            global_waiting: Mutex::new(0),
            config,
            keys: std::sync::RwLock::new(keys),
            metrics,
        }
    }

    /// Gates for reloaded keys: a key whose limits did not change keeps its gate (what it
    /// runs and its rate so far); a new key or one with new limits starts afresh.
    pub fn reload(&self, keys: &[Arc<Key>]) {
        let mut gates = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::take(&mut *gates);
        for k in keys {
            let gate = old
                .get(k.name())
                .filter(|g| g.limits == KeyGate::limits_of(k))
                .cloned()
                .unwrap_or_else(|| Arc::new(KeyGate::of(k)));
            gates.insert(k.name().to_owned(), gate);
        }
    }

    /// Whether a request arriving now could start without waiting, or at least queue.
    pub fn has_room(&self) -> bool {
        self.global.available_permits() > 0 || *lock(&self.global_waiting) < self.config.max_queue
    }

    /// Before a request's body is read: the key's rate limit, and a bound on its requests in
    /// flight (its concurrency plus its queue, when it has limits of its own).
    pub fn enter(&self, key: &Key) -> Result<Entered, Rejection> {
        let gate = self.gate(key)?;
        if self.global.is_closed() {
            return Err(Rejection::ShuttingDown);
        }
        let mut in_flight = lock(&gate.in_flight);
        if let Some(running) = key.config.max_concurrency {
            let bound = running + key.config.max_queue.unwrap_or(self.config.max_queue);
            if *in_flight >= bound {
                return Err(Rejection::KeyBusy);
            }
        }
        // (A request refused for being one too many costs no token.)
        self.take_token(key, &gate)?;
        *in_flight += 1;
        drop(in_flight);
        Ok(Entered { gate: gate.clone() })
    }

    fn gate(&self, key: &Key) -> Result<Arc<KeyGate>, Rejection> {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key.name())
            .cloned()
            .ok_or(Rejection::KeyBusy)
    }

    /// Stops admitting: every waiter and every later request is refused.
    pub fn close(&self) {
        self.global.close();
        for gate in self.keys.read().unwrap_or_else(|e| e.into_inner()).values() {
            if let Some(running) = &gate.running {
                running.close();
            }
        }
    }

    /// Waits for a running slot: the key's own (when it has limits), then the global one.
    pub async fn admit(&self, key: &Key) -> Result<Admitted, Rejection> {
        let gate = self.gate(key)?;
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.queue_timeout_ms);
        let key_permit = match &gate.running {
            // A key without limits of its own meets only the global ones.
            None => None,
            Some(running) => {
                let queue = key.config.max_queue.unwrap_or(self.config.max_queue);
                let permit = acquire(running, &gate.waiting, queue, deadline, None).await;
                Some(permit.map_err(|no| no.or(Rejection::KeyBusy))?)
            }
        };
        let global = acquire(
            &self.global,
            &self.global_waiting,
            self.config.max_queue,
            deadline,
            Some(&self.metrics),
        )
        .await
        .map_err(|no| no.or(Rejection::Overloaded))?;
        self.metrics.running.inc();
        Ok(Admitted {
            _key: key_permit,
            _global: global,
            metrics: self.metrics.clone(),
        })
    }

    /// Waits for a running slot as long as it takes, outside the queues' bounds: for
    /// background work, whose own bounds (`[background]`) were met before it waits here.
    /// Only closing (shutdown) refuses it.
    pub async fn admit_waiting(&self, key: &Key) -> Result<Admitted, Rejection> {
        let gate = self.gate(key)?;
        let key_permit = match &gate.running {
            None => None,
            Some(running) => Some(
                running
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| Rejection::ShuttingDown)?,
            ),
        };
        let global = self
            .global
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Rejection::ShuttingDown)?;
        self.metrics.running.inc();
        Ok(Admitted {
            _key: key_permit,
            _global: global,
            metrics: self.metrics.clone(),
        })
    }

    fn take_token(&self, key: &Key, gate: &KeyGate) -> Result<(), Rejection> {
        let rate = f64::from(key.config.rate_per_minute);
        if rate == 0.0 {
            return Ok(());
        }
        let mut bucket = lock(&gate.bucket);
        let now = Instant::now();
        let refill = now.duration_since(bucket.updated).as_secs_f64() * rate / 60.0;
        bucket.tokens = (bucket.tokens + refill).min(rate);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) * 60.0 / rate;
            Err(Rejection::RateLimited(wait.ceil() as u64))
        }
    }
}

/// Why `acquire` gave up: the queue was full (the caller says whose), or a definite reason.
struct NoSlot(Option<Rejection>);

impl NoSlot {
    fn or(self, full: Rejection) -> Rejection {
        self.0.unwrap_or(full)
    }
}

/// Takes a permit now, or queues for one if fewer than `max_queue` already wait.
async fn acquire(
    semaphore: &Arc<Semaphore>,
    waiting: &Mutex<usize>,
    max_queue: usize,
    deadline: tokio::time::Instant,
    gauge: Option<&Metrics>,
) -> Result<OwnedSemaphorePermit, NoSlot> {
    match semaphore.clone().try_acquire_owned() {
        Ok(permit) => return Ok(permit),
        Err(TryAcquireError::Closed) => return Err(NoSlot(Some(Rejection::ShuttingDown))),
        Err(TryAcquireError::NoPermits) => {}
    }
    {
        let mut count = lock(waiting);
        if *count >= max_queue {
            return Err(NoSlot(None));
        }
        *count += 1;
    }
    if let Some(m) = gauge {
        m.queue_depth.inc();
    }
    let _waiting = Waiting {
        count: waiting,
        gauge,
    };
    match tokio::time::timeout_at(deadline, semaphore.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        Ok(Err(_closed)) => Err(NoSlot(Some(Rejection::ShuttingDown))),
        Err(_elapsed) => Err(NoSlot(Some(Rejection::QueueTimeout))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyConfig;
    use crate::keys::{hash_key, KeyStore};

    fn setup(
        running: usize,
        queue: usize,
        key_conc: usize,
        key_queue: usize,
        rate: u32,
    ) -> (Admission, Arc<Key>) {
        let mut kc = KeyConfig::new("k", hash_key("key-for-tests-0001"));
        kc.max_concurrency = Some(key_conc);
        kc.max_queue = Some(key_queue);
        kc.rate_per_minute = rate;
        let store = KeyStore::new(vec![kc]).unwrap();
        let key = store.keys()[0].clone();
        let cfg = ConcurrencyConfig {
            max_running: running,
            max_queue: queue,
            queue_timeout_ms: 200,
        };
        (
            Admission::new(cfg, &store.keys(), Arc::new(Metrics::default())),
            key,
        )
    }

    #[tokio::test]
    async fn the_configured_concurrency_is_the_enforced_one() {
        let (adm, key) = setup(2, 0, 10, 10, 0);
        let a = adm.admit(&key).await.unwrap();
        let _b = adm.admit(&key).await.unwrap();
        assert_eq!(adm.admit(&key).await.unwrap_err(), Rejection::Overloaded);
        drop(a);
        assert!(adm.admit(&key).await.is_ok());
    }

    #[tokio::test]
    async fn a_key_past_its_own_limit_and_queue_is_told_so() {
        let (adm, key) = setup(10, 10, 1, 0, 0);
        let _a = adm.admit(&key).await.unwrap();
        assert_eq!(adm.admit(&key).await.unwrap_err(), Rejection::KeyBusy);
    }

    #[tokio::test]
    async fn queued_requests_wait_then_time_out() {
        let (adm, key) = setup(1, 1, 5, 5, 0);
        let _a = adm.admit(&key).await.unwrap();
        let started = std::time::Instant::now();
        assert_eq!(adm.admit(&key).await.unwrap_err(), Rejection::QueueTimeout);
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(*lock(&adm.global_waiting), 0, "the queue is left empty");
    }

    #[tokio::test]
    async fn closing_refuses_waiters_and_newcomers() {
        let (adm, key) = setup(1, 5, 5, 5, 0);
        let adm = Arc::new(adm);
        let _running = adm.admit(&key).await.unwrap();
        let waiter = {
            let (adm, key) = (adm.clone(), key.clone());
            tokio::spawn(async move { adm.admit(&key).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        adm.close();
        assert_eq!(waiter.await.unwrap().unwrap_err(), Rejection::ShuttingDown);
        assert_eq!(adm.admit(&key).await.unwrap_err(), Rejection::ShuttingDown);
        assert_eq!(adm.enter(&key).err(), Some(Rejection::ShuttingDown));
    }

    #[tokio::test]
    async fn a_key_s_requests_in_flight_are_bounded_before_any_body_is_read() {
        let (adm, key) = setup(10, 10, 1, 1, 0);
        let a = adm.enter(&key).unwrap();
        let _b = adm.enter(&key).unwrap();
        assert_eq!(adm.enter(&key).err(), Some(Rejection::KeyBusy));
        drop(a);
        assert!(adm.enter(&key).is_ok());
    }

    #[tokio::test]
    async fn the_rate_limit_names_when_to_retry() {
        let (adm, key) = setup(10, 10, 10, 10, 2);
        drop(adm.enter(&key).unwrap());
        drop(adm.enter(&key).unwrap());
        match adm.enter(&key).err().unwrap() {
            Rejection::RateLimited(secs) => assert!((1..=30).contains(&secs), "{secs}"),
            other => panic!("{other:?}"),
        }
    }
}
