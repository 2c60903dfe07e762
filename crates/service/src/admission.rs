//! Who may run now.
//!
//! Before its body is read, a request passes its key's rate limit and a bound on the key's
//! requests in flight (`enter`), so a throttled key cannot make the server buffer bodies for
//! it. Then it waits for a running slot (`admit`): its key's own concurrency, when the key has
//! limits of its own (bounded queue; past it, 429), then the global concurrency (bounded queue;
//! past it, 503). A key's own queue is first come, first served; the global one, which all
//! keys share, goes by [`Turns`]: a slot given back goes to the waiting key that started
//! least recently, so one key's many requests hold up another key's behind at most one of
//! its own. Queues are bounded in length and in waiting time, and closed on shutdown. The
//! configured numbers are the numbers enforced.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore, TryAcquireError};

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
    _global: Slot,
    metrics: Arc<Metrics>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.metrics.running.dec();
    }
}

/// Whose turn it is among keys waiting for something they share: the key that started least
/// recently goes first (one that never started before any that did), and one key's waiters
/// go in the order they came. A key waits behind at most one start of each other key.
#[derive(Debug, Default)]
pub struct Turns {
    clock: u64,
    /// When each key last started, on `clock`.
    last: HashMap<String, u64>,
}

impl Turns {
    /// `key` starts now.
    pub fn start(&mut self, key: &str) {
        self.clock += 1;
        match self.last.get_mut(key) {
            Some(at) => *at = self.clock,
            None => {
                self.last.insert(key.to_owned(), self.clock);
            }
        }
    }

    /// The next to go of `waiting`: each waiter's ticket (rising in the order they came) and
    /// key.
    pub fn next<'a>(&self, waiting: impl Iterator<Item = (u64, &'a str)>) -> Option<u64> {
        waiting
            .min_by_key(|(ticket, key)| (self.last.get(*key).copied().unwrap_or(0), *ticket))
            .map(|(ticket, _)| ticket)
    }
}

/// The running slots all keys share, handed out in [`Turns`].
struct Slots {
    inner: Mutex<SlotsInner>,
    /// `queue_depth` counts the waiters within the queue's bound.
    metrics: Arc<Metrics>,
}

struct SlotsInner {
    free: usize,
    closed: bool,
    next_ticket: u64,
    waiting: BTreeMap<u64, Waiter>,
    /// Waiters within the queue's bound (requests answered in place; background work waits
    /// outside it).
    queued: usize,
    turns: Turns,
}

struct Waiter {
    key: String,
    counted: bool,
    /// Sent `true` when the waiter is given a slot, `false` when it gives its place in a
    /// full queue to another key's request; dropped unsent when admission closes.
    given: oneshot::Sender<bool>,
}

/// One running slot, given back (to the next waiter, if any) when dropped.
pub struct Slot {
    slots: Arc<Slots>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = lock(&self.slots.inner);
        inner.free += 1;
        inner.hand_over(&self.slots.metrics);
    }
}

impl SlotsInner {
    /// Makes room in the full queue for a request of `key`: the newest waiter of the key
    /// that holds the most places gives its place up, when that key holds more than `key`
    /// would with it. Whether there is room now.
    fn share(&mut self, key: &str, metrics: &Metrics) -> bool {
        let mut held: HashMap<&str, (usize, u64)> = HashMap::new();
        for (ticket, w) in self.waiting.iter().filter(|(_, w)| w.counted) {
            let e = held.entry(w.key.as_str()).or_insert((0, *ticket));
            e.0 += 1;
            e.1 = e.1.max(*ticket);
        }
        let own = held.get(key).map_or(0, |h| h.0);
        let Some((_, (most, newest))) = held.into_iter().max_by_key(|(_, (n, _))| *n) else {
            return false;
        };
        if most <= own + 1 {
            return false;
        }
        if let Some(waiter) = self.unwait(newest, metrics) {
            let _ = waiter.given.send(false);
        }
        true
    }

    /// Takes `ticket` out of the queue, if it still waits there.
    fn unwait(&mut self, ticket: u64, metrics: &Metrics) -> Option<Waiter> {
        let waiter = self.waiting.remove(&ticket)?;
        if waiter.counted {
            self.queued -= 1;
            metrics.queue_depth.dec();
        }
        Some(waiter)
    }

    /// Gives the free slots to the waiters whose turn it is.
    fn hand_over(&mut self, metrics: &Metrics) {
        while self.free > 0 {
            let next = self
                .turns
                .next(self.waiting.iter().map(|(t, w)| (*t, w.key.as_str())));
            let Some(waiter) = next.and_then(|t| self.unwait(t, metrics)) else {
                return;
            };
            // A waiter that went away takes itself out of the queue first: sent, it is taken.
            if waiter.given.send(true).is_ok() {
                self.free -= 1;
                self.turns.start(&waiter.key);
            }
        }
    }
}

/// A place in the queue for a slot; leaving it early (the request dropped: its client went
/// away) takes it out of the queue, or gives back the slot it was given meanwhile.
struct Wait<'a> {
    slots: &'a Arc<Slots>,
    ticket: u64,
    given: oneshot::Receiver<bool>,
    over: bool,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.over {
            return;
        }
        let mut inner = lock(&self.slots.inner);
        if inner.unwait(self.ticket, &self.slots.metrics).is_none()
            && self.given.try_recv() == Ok(true)
        {
            inner.free += 1;
            inner.hand_over(&self.slots.metrics);
        }
    }
}

impl Slots {
    fn new(n: usize, metrics: Arc<Metrics>) -> Slots {
        Slots {
            inner: Mutex::new(SlotsInner {
                free: n,
                closed: false,
                next_ticket: 0,
                waiting: BTreeMap::new(),
                queued: 0,
                turns: Turns::default(),
            }),
            metrics,
        }
    }

    /// A slot for `key`: now if one is free, else when its turn comes. `bound`: the most that
    /// may wait within the queue's bound, and until when (none: outside it, as long as it
    /// takes).
    async fn take(
        self: &Arc<Self>,
        key: &str,
        bound: Option<(usize, tokio::time::Instant)>,
    ) -> Result<Slot, NoSlot> {
        let (ticket, given) = {
            let mut inner = lock(&self.inner);
            if inner.closed {
                return Err(NoSlot(Some(Rejection::ShuttingDown)));
            }
            if inner.free > 0 {
                inner.free -= 1;
                inner.turns.start(key);
                return Ok(Slot {
                    slots: self.clone(),
                });
            }
            if let Some((max_queue, _)) = bound {
                // A full queue: one key's requests may not keep the others' out.
                if inner.queued >= max_queue && !inner.share(key, &self.metrics) {
                    return Err(NoSlot(None));
                }
                inner.queued += 1;
                self.metrics.queue_depth.inc();
            }
            let ticket = inner.next_ticket;
            inner.next_ticket += 1;
            let (tx, rx) = oneshot::channel();
            inner.waiting.insert(
                ticket,
                Waiter {
                    key: key.to_owned(),
                    counted: bound.is_some(),
                    given: tx,
                },
            );
            (ticket, rx)
        };
        let mut wait = Wait {
            slots: self,
            ticket,
            given,
            over: false,
        };
        let got = match bound {
            Some((_, deadline)) => tokio::time::timeout_at(deadline, &mut wait.given).await,
            None => Ok((&mut wait.given).await),
        };
        wait.over = true;
        let given = match got {
            Ok(given) => given.ok(),
            Err(_elapsed) => {
                let mut inner = lock(&self.inner);
                if inner.unwait(ticket, &self.metrics).is_some() {
                    return Err(NoSlot(Some(Rejection::QueueTimeout)));
                }
                // Given a slot, or its place taken, or closed, as the time ran out.
                wait.given.try_recv().ok()
            }
        };
        match given {
            Some(true) => Ok(Slot {
                slots: self.clone(),
            }),
            // Its place in the full queue went to another key's request.
            Some(false) => Err(NoSlot(None)),
            None => Err(NoSlot(Some(Rejection::ShuttingDown))),
        }
    }

    /// Refuses every waiter and every later request.
    fn close(&self) {
        let mut inner = lock(&self.inner);
        inner.closed = true;
        let tickets: Vec<u64> = inner.waiting.keys().copied().collect();
        for ticket in tickets {
            // Dropping its sender tells the waiter.
            inner.unwait(ticket, &self.metrics);
        }
    }

    fn has_room(&self, max_queue: usize) -> bool {
        let inner = lock(&self.inner);
        inner.free > 0 || inner.queued < max_queue
    }
}

pub struct Admission {
    config: ConcurrencyConfig,
    global: Arc<Slots>,
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
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        *lock(self.count) -= 1;
    }
}

impl Admission {
    pub fn new(config: ConcurrencyConfig, keys: &[Arc<Key>], metrics: Arc<Metrics>) -> Self {
        let keys = keys
            .iter()
            .map(|k| (k.name().to_owned(), Arc::new(KeyGate::of(k))))
            .collect();
        Admission {
            global: Arc::new(Slots::new(config.max_running, metrics.clone())),
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
        self.global.has_room(self.config.max_queue)
    }

    /// Before a request's body is read: the key's rate limit, and a bound on its requests in
    /// flight (its concurrency plus its queue, when it has limits of its own).
    pub fn enter(&self, key: &Key) -> Result<Entered, Rejection> {
        let gate = self.gate(key)?;
        if lock(&self.global.inner).closed {
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
                let permit = acquire(running, &gate.waiting, queue, deadline).await;
                Some(permit.map_err(|no| no.or(Rejection::KeyBusy))?)
            }
        };
        let global = self
            .global
            .take(key.name(), Some((self.config.max_queue, deadline)))
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
            .take(key.name(), None)
            .await
            .map_err(|no| no.or(Rejection::ShuttingDown))?;
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

/// Takes a permit of a key's own now, or queues for one (first come, first served) if fewer
/// than `max_queue` already wait.
async fn acquire(
    semaphore: &Arc<Semaphore>,
    waiting: &Mutex<usize>,
    max_queue: usize,
    deadline: tokio::time::Instant,
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
    let _waiting = Waiting { count: waiting };
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
        assert_eq!(lock(&adm.global.inner).queued, 0, "the queue is left empty");
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

    /// Two keys without limits of their own, sharing `running` slots.
    fn two_keys(running: usize) -> (Arc<Admission>, Arc<Key>, Arc<Key>) {
        let store = KeyStore::new(vec![
            KeyConfig::new("a", hash_key("key-a-for-tests-0001")),
            KeyConfig::new("b", hash_key("key-b-for-tests-0001")),
        ])
        .unwrap();
        let cfg = ConcurrencyConfig {
            max_running: running,
            max_queue: 10,
            queue_timeout_ms: 10_000,
        };
        let adm = Admission::new(cfg, &store.keys(), Arc::new(Metrics::default()));
        (
            Arc::new(adm),
            store.keys()[0].clone(),
            store.keys()[1].clone(),
        )
    }

    async fn wait_queued(adm: &Admission, n: usize) {
        while lock(&adm.global.inner).queued != n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_slot_given_back_goes_to_the_key_that_started_least_recently() {
        let (adm, a, b) = two_keys(1);
        let running = adm.admit(&a).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (n, (name, key)) in [("a1", &a), ("a2", &a), ("b1", &b)].into_iter().enumerate() {
            let (admission, key, tx) = (adm.clone(), key.clone(), tx.clone());
            tokio::spawn(async move {
                let slot = admission.admit(&key).await.unwrap();
                tx.send(name).unwrap();
                drop(slot);
            });
            wait_queued(&adm, n + 1).await;
        }
        drop(running);
        let mut order = Vec::new();
        for _ in 0..3 {
            order.push(rx.recv().await.unwrap());
        }
        assert_eq!(order, ["b1", "a1", "a2"]);
        assert_eq!(lock(&adm.global.inner).free, 1);
    }

    #[tokio::test]
    async fn one_key_s_requests_never_keep_another_s_out_of_a_full_queue() {
        let (adm, a, b) = two_keys(1);
        let running = adm.admit(&a).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        // Key a fills the queue (10 places).
        for n in 0..10 {
            let (admission, key, tx) = (adm.clone(), a.clone(), tx.clone());
            waiters.push(tokio::spawn(async move {
                let got = admission.admit(&key).await.map(drop);
                tx.send((format!("a{n}"), got)).unwrap();
            }));
            wait_queued(&adm, n + 1).await;
        }
        // Key b's requests each take the place of a's newest while a holds more than b.
        for n in 0..5 {
            let (admission, key, tx) = (adm.clone(), b.clone(), tx.clone());
            waiters.push(tokio::spawn(async move {
                let got = admission.admit(&key).await.map(drop);
                tx.send((format!("b{n}"), got)).unwrap();
            }));
            let (who, got) = rx.recv().await.unwrap();
            assert_eq!(
                (who, got),
                (format!("a{}", 9 - n), Err(Rejection::Overloaded)),
                "b{n} took the place of a's newest"
            );
        }
        // Five each: a sixth of b's is refused like any request past a full queue.
        assert_eq!(lock(&adm.global.inner).queued, 10);
        assert_eq!(adm.admit(&b).await.unwrap_err(), Rejection::Overloaded);
        assert_eq!(lock(&adm.global.inner).queued, 10);
        drop(running);
        let mut order = Vec::new();
        for _ in 0..10 {
            let (who, got) = rx.recv().await.unwrap();
            assert_eq!(got, Ok(()), "{who}");
            order.push(who);
        }
        assert_eq!(
            order,
            ["b0", "a0", "b1", "a1", "b2", "a2", "b3", "a3", "b4", "a4"]
        );
    }

    #[tokio::test]
    async fn a_slot_given_to_a_waiter_that_went_away_goes_on() {
        let (adm, a, b) = two_keys(1);
        let running = adm.admit(&a).await.unwrap();
        let waiter = {
            let (adm, b) = (adm.clone(), b.clone());
            tokio::spawn(async move { adm.admit(&b).await.map(drop) })
        };
        wait_queued(&adm, 1).await;
        // Given the slot, and gone before it could take it.
        drop(running);
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(lock(&adm.global.inner).free, 1);
        assert!(adm.admit(&a).await.is_ok());
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
