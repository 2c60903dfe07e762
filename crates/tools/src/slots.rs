//! A tool server's call slots, shared fairly by the keys that call it.
//!
//! A call in flight cannot be taken back, so fairness is decided when a slot is given:
//! - a key that holds none of the server's slots may take any free one;
//! - a key that holds some may take one only while more than `reserve` stay free: the keys
//!   already calling hold at most `total - reserve` together, so a key that comes later finds
//!   a slot at once, however long their calls run;
//! - a slot that comes free goes to the waiting key that holds the fewest (the earliest call
//!   first among equals): no key gains a slot while a key holding fewer waits for one;
//! - a call that gets no slot within its wait gets none (the broker answers `unavailable`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// One server's slots.
#[derive(Debug)]
pub(crate) struct Slots {
    reserve: usize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    /// Slots held, by key (keys holding none are absent).
    held: HashMap<Arc<str>, usize>,
    /// Calls waiting, in the order they came.
    waiting: VecDeque<Waiter>,
    next_id: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    key: Arc<str>,
    grant: oneshot::Sender<Slot>,
}

/// One call's slot, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<Slots>,
    key: Arc<str>,
}

/// Slots given under the lock, sent after it is released: a send that fails drops its slot,
/// which takes the lock again to give it back.
type Given = Vec<(oneshot::Sender<Slot>, Slot)>;

impl Slots {
    /// `total` slots, of which keys already holding one cannot take the last `reserve`.
    pub fn new(total: usize, reserve: usize) -> Arc<Slots> {
        Arc::new(Slots {
            reserve,
            state: Mutex::new(State {
                free: total,
                held: HashMap::new(),
                waiting: VecDeque::new(),
                next_id: 0,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for one call of `key`; None when none was given within `wait`.
    pub async fn acquire(self: &Arc<Self>, key: &str, wait: Duration) -> Option<Slot> {
        let (grant, rx) = oneshot::channel();
        let (mut waiting, given) = {
            let mut state = self.state();
            let id = state.next_id;
            state.next_id += 1;
            state.waiting.push_back(Waiter {
                id,
                key: Arc::from(key),
                grant,
            });
            let waiting = Waiting {
                slots: self,
                id,
                rx,
            };
            (waiting, self.give(&mut state))
        };
        send(given);
        match tokio::time::timeout(wait, &mut waiting.rx).await {
            Ok(slot) => slot.ok(),
            Err(_) => {
                waiting.leave();
                // Given between the timeout and leaving the queue.
                waiting.rx.try_recv().ok()
            }
        }
    }

    /// Gives free slots to the waiting calls that may take them, by the rules above.
    fn give(self: &Arc<Self>, state: &mut State) -> Given {
        let mut given = Vec::new();
        while state.free > 0 {
            let above_reserve = state.free > self.reserve;
            let next = state
                .waiting
                .iter()
                .enumerate()
                .map(|(at, w)| (state.held.get(&w.key).copied().unwrap_or(0), at))
                .filter(|&(held, _)| held == 0 || above_reserve)
                .min();
            let Some((_, at)) = next else { break };
            let Some(waiter) = state.waiting.remove(at) else {
                break;
            };
            state.free -= 1;
            *state.held.entry(waiter.key.clone()).or_insert(0) += 1;
            let slot = Slot {
                slots: self.clone(),
                key: waiter.key,
            };
            given.push((waiter.grant, slot));
        }
        given
    }
}

fn send(given: Given) {
    for (grant, slot) in given {
        // A call that stopped waiting drops the slot it was sent: it is given back.
        let _ = grant.send(slot);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let given = {
            let mut state = self.slots.state();
            state.free += 1;
            match state.held.get_mut(&self.key) {
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    state.held.remove(&self.key);
                }
            }
            self.slots.give(&mut state)
        };
        send(given);
    }
}

/// A call in the queue; it leaves the queue when dropped (a timeout, or the execution
/// ended), before its receiver is dropped, so a slot is never sent to nobody unseen.
struct Waiting<'a> {
    slots: &'a Arc<Slots>,
    id: u64,
    rx: oneshot::Receiver<Slot>,
}

impl Waiting<'_> {
    fn leave(&self) {
        let mut state = self.slots.state();
        state.waiting.retain(|w| w.id != self.id);
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // A slot already sent is dropped with `rx`, after this, and so given back.
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::from_millis(20);

    fn held(slots: &Slots, key: &str) -> usize {
        slots.state().held.get(key).copied().unwrap_or(0)
    }

    fn free(slots: &Slots) -> usize {
        slots.state().free
    }

    #[tokio::test]
    async fn a_key_alone_leaves_the_reserve_to_the_next_key() {
        let slots = Slots::new(4, 1);
        let mut a = Vec::new();
        for _ in 0..3 {
            a.push(slots.acquire("a", NOW).await.expect("below the reserve"));
        }
        assert!(
            slots.acquire("a", NOW).await.is_none(),
            "the reserve is not a's"
        );
        let b = slots
            .acquire("b", NOW)
            .await
            .expect("a newcomer takes the reserve");
        assert_eq!(
            (held(&slots, "a"), held(&slots, "b"), free(&slots)),
            (3, 1, 0)
        );
        assert!(slots.acquire("c", NOW).await.is_none(), "nothing is free");
        drop(b);
        assert_eq!((held(&slots, "b"), free(&slots)), (0, 1));
        drop(a);
        assert_eq!(free(&slots), 4);
        assert!(slots.state().held.is_empty() && slots.state().waiting.is_empty());
    }

    #[tokio::test]
    async fn a_slot_that_comes_free_goes_to_the_key_holding_fewest() {
        let slots = Slots::new(4, 0);
        let mut a: Vec<Slot> = Vec::new();
        for _ in 0..3 {
            a.push(slots.acquire("a", NOW).await.unwrap());
        }
        let b1 = slots.acquire("b", NOW).await.unwrap();
        // a waits first, b second; b holds fewer, so b is served first.
        let wait = Duration::from_secs(5);
        let (s1, s2) = (slots.clone(), slots.clone());
        let a4 = tokio::spawn(async move { s1.acquire("a", wait).await });
        tokio::time::sleep(NOW).await;
        let b2 = tokio::spawn(async move { s2.acquire("b", wait).await });
        tokio::time::sleep(NOW).await;
        assert_eq!(slots.state().waiting.len(), 2);
        a.pop();
        let b2 = b2.await.unwrap().expect("b holds fewer");
        assert_eq!((held(&slots, "a"), held(&slots, "b")), (2, 2));
        assert_eq!(slots.state().waiting.len(), 1, "a still waits");
        drop(b1);
        let a4 = a4.await.unwrap().expect("a, alone waiting");
        assert_eq!((held(&slots, "a"), held(&slots, "b")), (3, 1));
        drop((a, a4, b2));
        assert_eq!(free(&slots), 4);
    }

    #[tokio::test]
    async fn a_call_that_stops_waiting_leaves_nothing_behind() {
        let slots = Slots::new(1, 0);
        let a = slots.acquire("a", NOW).await.unwrap();
        let started = std::time::Instant::now();
        assert!(slots
            .acquire("b", Duration::from_millis(100))
            .await
            .is_none());
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(100) && waited < Duration::from_secs(2));
        // A waiting call dropped (its execution ended) leaves the queue.
        let s = slots.clone();
        let pending = tokio::spawn(async move { s.acquire("c", Duration::from_secs(60)).await });
        tokio::time::sleep(NOW).await;
        pending.abort();
        let _ = pending.await;
        assert!(slots.state().waiting.is_empty());
        drop(a);
        assert_eq!(free(&slots), 1);
        assert!(slots.acquire("d", Duration::ZERO).await.is_some());
        assert_eq!(free(&slots), 1, "given back when dropped");
    }
}
