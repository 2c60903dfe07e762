//! Memory for request bodies: counted in KiB as the bytes arrive, against a budget for all
//! requests together and a smaller one per key, so that no key can hold the whole of it.
//! A request keeps its share from its first byte until it is admitted to run (its body, then
//! the job parsed from it, wait in memory until then).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::keys::Key;

#[derive(Debug)]
pub struct BodyBudget {
    all: Arc<Semaphore>,
    per_key: HashMap<String, Arc<Semaphore>>,
}

/// Which budget a body did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverBudget {
    /// The key's own share.
    Key,
    /// The budget of all requests.
    All,
}

/// One request's share, given back on drop.
#[derive(Debug, Default)]
pub struct Share {
    kib: u64,
    permits: Vec<OwnedSemaphorePermit>,
}

fn kib(bytes: u64) -> usize {
    usize::try_from(bytes / 1024).unwrap_or(usize::MAX).max(1)
}

impl BodyBudget {
    pub fn new(total_bytes: u64, per_key_bytes: u64, keys: &[Arc<Key>]) -> Self {
        let per_key = keys
            .iter()
            .map(|k| {
                (
                    k.name().to_owned(),
                    Arc::new(Semaphore::new(kib(per_key_bytes))),
                )
            })
            .collect();
        BodyBudget {
            all: Arc::new(Semaphore::new(kib(total_bytes))),
            per_key,
        }
    }

    /// Grows `share` to cover `bytes` received so far.
    pub fn cover(&self, key: &Key, share: &mut Share, bytes: u64) -> Result<(), OverBudget> {
        let more = bytes.div_ceil(1024).saturating_sub(share.kib);
        if more == 0 {
            return Ok(());
        }
        let n = u32::try_from(more).map_err(|_| OverBudget::All)?;
        let mine = self.per_key.get(key.name()).ok_or(OverBudget::Key)?;
        let from_key = mine
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| OverBudget::Key)?;
        let from_all = self
            .all
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| OverBudget::All)?;
        share.kib += more;
        share.permits.push(from_key);
        share.permits.push(from_all);
        Ok(())
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
        let budget = BodyBudget::new(100 << 10, 60 << 10, store.keys());
        let mut first = Share::default();
        budget.cover(a, &mut first, 50 << 10).unwrap();
        let mut second = Share::default();
        assert_eq!(budget.cover(a, &mut second, 20 << 10), Err(OverBudget::Key));
        let mut other = Share::default();
        budget.cover(b, &mut other, 40 << 10).unwrap();
        assert_eq!(budget.cover(b, &mut other, 55 << 10), Err(OverBudget::All));
        drop(first);
        budget.cover(b, &mut other, 55 << 10).unwrap();
        // Growing a share counts only what is new.
        let mut grow = Share::default();
        for n in 1..=5 {
            budget.cover(a, &mut grow, n * 1024).unwrap();
        }
        assert_eq!(grow.kib, 5);
    }
}
