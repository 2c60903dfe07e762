//! Who may run now. A request passes its key's rate limit, then its key's concurrency (with a
//! bounded queue: past it, 429), then the global concurrency (with a bounded queue: past it,
//! 503). Queues are FIFO, bounded in length and in waiting time. The configured numbers are
//! the numbers enforced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
    keys: HashMap<String, KeyGate>,
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
            .map(|k| {
                let gate = KeyGate {
                    running: k
                        .config
                        .max_concurrency
                        .map(|n| Arc::new(Semaphore::new(n))),
                    waiting: Mutex::new(0),
                    bucket: Mutex::new(Bucket {
                        tokens: f64::from(k.config.rate_per_minute),
                        updated: Instant::now(),
                    }),
                };
                (k.name().to_owned(), gate)
            })
            .collect();
        Admission {
            global: Arc::new(Semaphore::new(config.max_running)),
            global_waiting: Mutex::new(0),
            config,
            keys,
            metrics,
        }
    }

    /// Whether a request arriving now could start without waiting, or at least queue.
    pub fn has_room(&self) -> bool {
        self.global.available_permits() > 0 || *lock(&self.global_waiting) < self.config.max_queue
    }

    pub async fn admit(&self, key: &Key) -> Result<Admitted, Rejection> {
        let gate = self.keys.get(key.name()).ok_or(Rejection::KeyBusy)?;
        self.take_token(key, gate)?;
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.queue_timeout_ms);
        let key_permit = match &gate.running {
            // A key without limits of its own meets only the global ones.
            None => None,
            Some(running) => {
                let key_queue = key.config.max_queue.unwrap_or(self.config.max_queue);
                let permit = acquire(running, &gate.waiting, key_queue, deadline, None)
                    .await
                    .map_err(|full| {
                        if full {
                            Rejection::KeyBusy
                        } else {
                            Rejection::QueueTimeout
                        }
                    })?;
                Some(permit)
            }
        };
        let global_permit = acquire(
            &self.global,
            &self.global_waiting,
            self.config.max_queue,
            deadline,
            Some(&self.metrics),
        )
        .await
        .map_err(|full| {
            if full {
                Rejection::Overloaded
            } else {
                Rejection::QueueTimeout
            }
        })?;
        self.metrics.running.inc();
        Ok(Admitted {
            _key: key_permit,
            _global: global_permit,
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

/// Takes a permit now, or queues for one if fewer than `max_queue` already wait.
/// `Err(true)`: the queue is full; `Err(false)`: the wait timed out.
async fn acquire(
    semaphore: &Arc<Semaphore>,
    waiting: &Mutex<usize>,
    max_queue: usize,
    deadline: tokio::time::Instant,
    gauge: Option<&Metrics>,
) -> Result<OwnedSemaphorePermit, bool> {
    if let Ok(permit) = semaphore.clone().try_acquire_owned() {
        return Ok(permit);
    }
    {
        let mut count = lock(waiting);
        if *count >= max_queue {
            return Err(true);
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
        _ => Err(false),
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
            Admission::new(cfg, store.keys(), Arc::new(Metrics::default())),
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
    async fn the_rate_limit_names_when_to_retry() {
        let (adm, key) = setup(10, 10, 10, 10, 2);
        drop(adm.admit(&key).await.unwrap());
        drop(adm.admit(&key).await.unwrap());
        match adm.admit(&key).await.unwrap_err() {
            Rejection::RateLimited(secs) => assert!((1..=30).contains(&secs), "{secs}"),
            other => panic!("{other:?}"),
        }
    }
}
