//! Memory for what requests and answers hold: counted in bytes against a budget for all of
//! them together (`http.max_buffered_bytes`) and a smaller one per key
//! (`http.max_buffered_bytes_per_key`), so that no key can hold the whole of it.
//!
//! - A request body counts from its first byte until it is admitted to run (its body, then
//!   the job parsed from it, wait in memory until then).
//! - An execution reserves the most its answer can hold (both captured streams, the
//!   sandbox's response, a write window) before it queues; when it ends the reservation
//!   shrinks to what the answer really holds, and that counts until the answer is written
//!   out or its connection closed.
//! - Any other answer counts from when it is made until it is written out.
//!
//! Past a budget, new work gets 429 (the key's share) or 503 (everyone's), as for bodies;
//! background work waits instead ([`MemoryBudget::reserve_waiting`]), woken when memory is
//! given back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::keys::Key;

#[derive(Debug)]
pub struct MemoryBudget {
    all: Arc<Pool>,
    per_key: std::sync::RwLock<HashMap<String, Arc<Pool>>>,
    per_key_bytes: u64,
    /// Told whenever one of its pools gives memory back: a waiter looks again.
    freed: Arc<Notify>,
}

/// One budget: a limit and what is counted against it now.
#[derive(Debug)]
struct Pool {
    limit: u64,
    used: AtomicU64,
    freed: Arc<Notify>,
}

impl Pool {
    fn new(limit: u64, freed: &Arc<Notify>) -> Arc<Pool> {
        Arc::new(Pool {
            limit,
            used: AtomicU64::new(0),
            freed: freed.clone(),
        })
    }

    fn try_take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn take(&self, n: u64) {
        self.used.fetch_add(n, Ordering::AcqRel);
    }

    fn give(&self, n: u64) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
            self.freed.notify_waiters();
        }
    }

    /// Whether `n` more fit now (a look that takes nothing).
    fn fits(&self, n: u64) -> bool {
        self.used
            .load(Ordering::Acquire)
            .checked_add(n)
            .is_some_and(|total| total <= self.limit)
    }
}

/// Which budget a share could not grow in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverBudget {
    /// The key's own share.
    Key,
    /// The budget of all requests.
    All,
}

/// What one request or answer holds, given back on drop.
#[derive(Debug, Default)]
pub struct Share {
    key: Option<Arc<Pool>>,
    all: Option<Arc<Pool>>,
    bytes: u64,
}

impl MemoryBudget {
    pub fn new(total_bytes: u64, per_key_bytes: u64, keys: &[Arc<Key>]) -> Self {
        let freed = Arc::new(Notify::new());
        let per_key = keys
            .iter()
            .map(|k| (k.name().to_owned(), Pool::new(per_key_bytes, &freed)))
            .collect();
        MemoryBudget {
            all: Pool::new(total_bytes, &freed),
            per_key: std::sync::RwLock::new(per_key),
            per_key_bytes,
            freed,
        }
    }

    /// A budget for each key reloaded that has none yet (a key that stays keeps its own,
    /// with what it holds now).
    pub fn reload(&self, keys: &[Arc<Key>]) {
        let mut per_key = self.per_key.write().unwrap_or_else(|e| e.into_inner());
        for k in keys {
            per_key
                .entry(k.name().to_owned())
                .or_insert_with(|| Pool::new(self.per_key_bytes, &self.freed));
        }
    }

    fn pool_of(&self, key: &str) -> Option<Arc<Pool>> {
        self.per_key
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    /// An empty share, counted against `key`'s budget (when there is a key) and everyone's.
    pub fn share(&self, key: Option<&Key>) -> Share {
        Share {
            key: key.and_then(|k| self.pool_of(k.name())),
            all: Some(self.all.clone()),
            bytes: 0,
        }
    }

    /// A share of `bytes`, or which budget it does not fit.
    pub fn reserve(&self, key: &Key, bytes: u64) -> Result<Share, OverBudget> {
        let mut share = self.share(Some(key));
        share.cover(bytes)?;
        Ok(share)
    }

    /// A share of `bytes`, waited for as long as it takes: tried again each time memory is
    /// given back (for background work, whose bounds were met before it waits here).
    pub async fn reserve_waiting(&self, key: &Key, bytes: u64) -> Share {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Listening before it looks: memory given back in between wakes it.
            freed.as_mut().enable();
            // A look first, which takes nothing: a try that fails may give back what it took
            // for a moment, which would wake this very waiter again and again.
            let fits = self.pool_of(key.name()).is_none_or(|p| p.fits(bytes));
            if fits && self.all.fits(bytes) {
                if let Ok(share) = self.reserve(key, bytes) {
                    return share;
                }
            }
            freed.await;
        }
    }

    /// Bytes counted now, against everyone's budget.
    pub fn used(&self) -> u64 {
        self.all.used.load(Ordering::Acquire)
    }

    /// Bytes counted now against `key`'s share.
    pub fn used_by(&self, key: &str) -> u64 {
        self.pool_of(key)
            .map_or(0, |p| p.used.load(Ordering::Acquire))
    }
}

impl Share {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Grows the share to `total` bytes if both budgets have room; it is left as it was if
    /// not.
    pub fn cover(&mut self, total: u64) -> Result<(), OverBudget> {
        let more = total.saturating_sub(self.bytes);
        if more == 0 {
            return Ok(());
        }
        if let Some(key) = &self.key {
            if !key.try_take(more) {
                return Err(OverBudget::Key);
            }
        }
        if let Some(all) = &self.all {
            if !all.try_take(more) {
                if let Some(key) = &self.key {
                    key.give(more);
                }
                return Err(OverBudget::All);
            }
        }
        self.bytes = total;
        Ok(())
    }

    /// Makes the share exactly `total` bytes: what is already held must be counted, room or
    /// not (a reservation made for it was smaller than the thing itself).
    pub fn set(&mut self, total: u64) {
        if total > self.bytes {
            let more = total - self.bytes;
            for pool in self.key.iter().chain(&self.all) {
                pool.take(more);
            }
        } else {
            let less = self.bytes - total;
            for pool in self.key.iter().chain(&self.all) {
                pool.give(less);
            }
        }
        self.bytes = total;
    }

    /// Takes `other`'s bytes into this share (both must count against the same budgets).
    pub fn absorb(&mut self, mut other: Share) {
        debug_assert!(
            same(&self.key, &other.key) && same(&self.all, &other.all),
            "shares of different budgets"
        );
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

fn same(a: &Option<Arc<Pool>>, b: &Option<Arc<Pool>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyConfig;
    use crate::keys::{hash_key, KeyStore};

    #[test]
    fn one_key_cannot_take_the_budget_of_all() {
        let store = KeyStore::new(vec![
            KeyConfig::new("a", hash_key("key-for-tests-000a")),
            KeyConfig::new("b", hash_key("key-for-tests-000b")),
        ])
        .unwrap();
        let (a, b) = (&store.keys()[0], &store.keys()[1]);
        let budget = MemoryBudget::new(100 << 10, 60 << 10, &store.keys());
        let first = budget.reserve(a, 50 << 10).unwrap();
        assert_eq!(budget.reserve(a, 20 << 10).err(), Some(OverBudget::Key));
        let mut other = budget.reserve(b, 40 << 10).unwrap();
        assert_eq!(other.cover(55 << 10), Err(OverBudget::All));
        // A failed growth takes nothing from either budget.
        assert_eq!(budget.used(), 90 << 10);
        assert_eq!(budget.used_by("b"), 40 << 10);
        drop(first);
        other.cover(55 << 10).unwrap();
        assert_eq!(budget.used(), 55 << 10);
        // Growing counts only what is new; shrinking gives back the rest.
        let mut grow = budget.share(Some(a));
        for n in 1..=5 {
            grow.cover(n * 1024).unwrap();
        }
        assert_eq!((grow.bytes(), budget.used_by("a")), (5 << 10, 5 << 10));
        grow.set(1024);
        assert_eq!(budget.used_by("a"), 1024);
        drop((grow, other));
        assert_eq!((budget.used(), budget.used_by("a")), (0, 0));
    }

    #[test]
    fn what_is_held_is_counted_even_past_the_budget() {
        let store =
            KeyStore::new(vec![KeyConfig::new("a", hash_key("key-for-tests-000a"))]).unwrap();
        let a = &store.keys()[0];
        let budget = MemoryBudget::new(100, 50, &store.keys());
        let mut held = budget.reserve(a, 40).unwrap();
        held.set(80); // the answer turned out larger than its reservation
        assert_eq!(budget.used_by("a"), 80);
        // Nothing new fits until it is gone.
        assert_eq!(budget.reserve(a, 1).err(), Some(OverBudget::Key));
        let mut merged = budget.share(Some(a));
        merged.absorb(held);
        assert_eq!(budget.used_by("a"), 80);
        drop(merged);
        assert_eq!((budget.used(), budget.used_by("a")), (0, 0));
        budget.reserve(a, 50).unwrap();
    }

    #[tokio::test]
    async fn a_share_waited_for_comes_once_memory_is_given_back() {
        let store = KeyStore::new(vec![
            KeyConfig::new("a", hash_key("key-for-tests-000a")),
            KeyConfig::new("b", hash_key("key-for-tests-000b")),
            KeyConfig::new("c", hash_key("key-for-tests-000c")),
        ])
        .unwrap();
        let [a, b, c] = [0, 1, 2].map(|i| store.keys()[i].clone());
        let budget = Arc::new(MemoryBudget::new(100, 60, &store.keys()));
        let _mine = budget.reserve(&a, 30).unwrap();
        let others = budget.reserve(&b, 60).unwrap();
        let little = budget.reserve(&c, 5).unwrap();
        // Its key has room (30 + 20 <= 60), everyone's has not (95 + 20 > 100).
        let (waiting, key) = (budget.clone(), a.clone());
        let waiter = tokio::spawn(async move { waiting.reserve_waiting(&key, 20).await });
        // The test's runtime has one thread: the waiter runs to its wait (a waiter woken by
        // its own tries would spin here for good).
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "no room, yet a share was given");
        // Memory given back, not enough: it looks again, and waits on.
        drop(little);
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "a share past everyone's budget was given"
        );
        // Enough: it is woken for it.
        drop(others);
        let share = tokio::time::timeout(std::time::Duration::from_secs(30), waiter)
            .await
            .expect("still waiting, though memory was given back")
            .unwrap();
        assert_eq!(
            (share.bytes(), budget.used_by("a"), budget.used()),
            (20, 50, 50)
        );
    }
}
