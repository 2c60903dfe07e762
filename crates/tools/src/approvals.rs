//! Calls that wait for a person: a tool the operator marked `approval = "required"` is called
//! only once someone decides to let this one call run ([`Approvals`]). Each waiting call has
//! its own approval, named by an unguessable id and decided once: the decision is taken out of
//! the table as it is made, so a second decision, a timeout and the execution's end cannot
//! both win. The waiting call holds no slot of its server (`slots.rs`): it takes one only once
//! approved.
//!
//! Who may decide is the server's business (it passes `may` to [`Approvals::pending`],
//! [`Approvals::get`] and [`Approvals::decide`]); so is telling someone a call waits: a
//! watcher per execution ([`Approvals::watch`]) hears of each of its calls (a stream's event,
//! an MCP host's elicitation).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use airlock_api::{Approval, Decision};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// What became of a waiting call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Decided by `by` (a key's name, or `mcp_host`).
    Decided {
        decision: Decision,
        by: String,
        reason: Option<String>,
    },
    /// Its execution ended first (timeout, kill, cancel, a session closed or its cell over).
    Withdrawn,
}

/// Told of each call of one execution that starts waiting: with the table, to decide it.
pub type Watcher = Arc<dyn Fn(&Arc<Approvals>, &Arc<Approval>) + Send + Sync>;

struct Waiting {
    approval: Arc<Approval>,
    /// The arguments' JSON, exactly as the call will send it.
    arguments: Arc<str>,
    resolve: oneshot::Sender<Resolution>,
    /// Cancelled once the call leaves the table, however: what asks a person about it (an
    /// MCP host's dialog) stops asking.
    done: CancellationToken,
}

/// The calls waiting for an approval, on this server.
pub struct Approvals {
    waiting: Mutex<HashMap<String, Waiting>>,
    watchers: Mutex<HashMap<String, Watcher>>,
    /// The executions (and session cells) running now: only their calls may wait. A call a
    /// session's thread makes after its cell ended has no execution to wait within.
    live: Mutex<std::collections::HashSet<String>>,
    /// Whether keys can decide over HTTP (`airlock serve`). Without it (`airlock run`,
    /// `airlock mcp`) a call nobody watches is refused at once: nobody could approve it.
    over_http: AtomicBool,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("waiting", &self.lock().len())
            .finish_non_exhaustive()
    }
}

/// A call that waits: what is shown of it, where its resolution comes, who to tell.
pub(crate) struct Opened {
    pub approval: Arc<Approval>,
    pub resolution: oneshot::Receiver<Resolution>,
    pub watcher: Option<Watcher>,
}

/// Why a call could not start waiting.
#[derive(Debug, PartialEq, Eq)]
pub struct NoApprover;

/// A watcher, removed when this is dropped (the execution is over).
#[must_use = "the watcher goes when this is dropped"]
#[derive(Debug)]
pub struct Watch {
    approvals: Arc<Approvals>,
    execution_id: String,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.approvals
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.execution_id);
    }
}

impl Approvals {
    pub fn new() -> Arc<Approvals> {
        Arc::new(Approvals {
            waiting: Mutex::new(HashMap::new()),
            watchers: Mutex::new(HashMap::new()),
            live: Mutex::new(std::collections::HashSet::new()),
            over_http: AtomicBool::new(false),
        })
    }

    /// Keys may decide over HTTP from now on.
    pub fn serve_http(&self) {
        self.over_http.store(true, Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells `watcher` of each call of `execution_id` that starts waiting, until the
    /// [`Watch`] is dropped.
    pub fn watch(self: &Arc<Self>, execution_id: &str, watcher: Watcher) -> Watch {
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(execution_id.to_owned(), watcher);
        Watch {
            approvals: self.clone(),
            execution_id: execution_id.to_owned(),
        }
    }

    /// The calls waiting that `may` lets the caller see, oldest first.
    pub fn pending(&self, may: impl Fn(&Approval) -> bool) -> Vec<Approval> {
        let mut out: Vec<Approval> = self
            .lock()
            .values()
            .filter(|w| may(&w.approval))
            .map(|w| (*w.approval).clone())
            .collect();
        out.sort_by(|a, b| a.requested_at.cmp(&b.requested_at).then(a.id.cmp(&b.id)));
        out
    }

    /// The waiting call `id` and its arguments' JSON, if `may` lets the caller see it.
    pub fn get(&self, id: &str, may: impl Fn(&Approval) -> bool) -> Option<(Approval, Arc<str>)> {
        self.lock()
            .get(id)
            .filter(|w| may(&w.approval))
            .map(|w| ((*w.approval).clone(), w.arguments.clone()))
    }

    /// Decides the waiting call `id`, if it still waits and `may` lets the caller decide it;
    /// it is out of the table from then on. None otherwise: unknown, decided already, timed
    /// out, withdrawn, or not the caller's to see.
    pub fn decide(
        &self,
        id: &str,
        may: impl Fn(&Approval) -> bool,
        decision: Decision,
        by: &str,
        reason: Option<String>,
    ) -> Option<Arc<Approval>> {
        let waiting = {
            let mut table = self.lock();
            if !table.get(id).is_some_and(|w| may(&w.approval)) {
                return None;
            }
            table.remove(id)?
        };
        let resolution = Resolution::Decided {
            decision,
            by: by.to_owned(),
            reason,
        };
        // A waiter gone at this very moment (its execution ended) audits itself as withdrawn.
        waiting.done.cancel();
        waiting.resolve.send(resolution).ok()?;
        Some(waiting.approval)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `execution_id` runs: its calls may wait, until [`Approvals::withdraw_execution`].
    pub(crate) fn admit(&self, execution_id: &str) {
        self.live().insert(execution_id.to_owned());
    }

    pub(crate) fn is_live(&self, execution_id: &str) -> bool {
        self.live().contains(execution_id)
    }

    /// What is cancelled once call `id` is decided, withdrawn or out of time; [`None`] when
    /// it is already.
    pub fn finished(&self, id: &str) -> Option<CancellationToken> {
        self.lock().get(id).map(|w| w.done.clone())
    }

    /// Withdraws every call of `execution_id` still waiting, and any it would make from now
    /// on; how many were waiting. (A call that enters the table after this finds its
    /// execution gone and takes itself out: [`Approvals::is_live`] is asked after the insert.)
    pub fn withdraw_execution(&self, execution_id: &str) -> usize {
        self.live().remove(execution_id);
        let gone: Vec<Waiting> = {
            let mut table = self.lock();
            let ids: Vec<String> = table
                .iter()
                .filter(|(_, w)| w.approval.execution_id == execution_id)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| table.remove(id)).collect()
        };
        let n = gone.len();
        for w in gone {
            w.done.cancel();
            let _ = w.resolve.send(Resolution::Withdrawn);
        }
        n
    }

    /// A call starts waiting, `arguments` the JSON it will send; with its execution's
    /// watcher, to be told once the request is audited. Refused when nobody could decide it.
    pub(crate) fn open(
        self: &Arc<Self>,
        approval: Approval,
        arguments: Arc<str>,
    ) -> Result<Opened, NoApprover> {
        let watcher = self
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&approval.execution_id)
            .cloned();
        if watcher.is_none() && !self.over_http.load(Ordering::Acquire) {
            return Err(NoApprover);
        }
        let approval = Arc::new(approval);
        let (resolve, resolution) = oneshot::channel();
        self.lock().insert(
            approval.id.clone(),
            Waiting {
                approval: approval.clone(),
                arguments,
                resolve,
                done: CancellationToken::new(),
            },
        );
        Ok(Opened {
            approval,
            resolution,
            watcher,
        })
    }

    /// Takes `id` out of the table if it still waits (its waiter timed out or is gone): true
    /// then; false when a decision or a withdrawal took it first.
    pub(crate) fn close(&self, id: &str) -> bool {
        self.lock().remove(id).map(|w| w.done.cancel()).is_some()
    }
}

/// `ap_` and 128 random bits in hex. None if getrandom(2) fails: an id that is not random
/// would be guessable, so there is no fallback (the call is refused).
pub(crate) fn new_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(format!("ap_{}", airlock_api::hex(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(id: &str, execution: &str) -> Approval {
        Approval {
            id: id.into(),
            execution_id: execution.into(),
            key: "agent".into(),
            server: "crm".into(),
            tool: "write_note".into(),
            arguments: None,
            arguments_preview: "{}".into(),
            arguments_shown: airlock_api::Shown::Whole,
            arguments_escaped: false,
            arguments_bytes: 2,
            arguments_sha256: String::new(),
            line: None,
            requested_at: String::new(),
            expires_at: String::new(),
        }
    }

    #[test]
    fn one_decision_per_call_and_only_for_who_may() {
        let hub = Approvals::new();
        assert!(matches!(
            hub.open(approval("a", "ex1"), "{}".into()),
            Err(NoApprover)
        ));
        hub.serve_http();
        let mut rx_a = hub
            .open(approval("a", "ex1"), "{}".into())
            .unwrap()
            .resolution;
        let mut rx_b = hub
            .open(approval("b", "ex1"), "{}".into())
            .unwrap()
            .resolution;
        let mut rx_c = hub
            .open(approval("c", "ex2"), "{}".into())
            .unwrap()
            .resolution;
        assert!(hub
            .decide("a", |_| false, Decision::Approve, "x", None)
            .is_none());
        assert_eq!(hub.pending(|a| a.execution_id == "ex2").len(), 1);
        assert!(hub.get("a", |_| false).is_none(), "seen only by who may");
        assert_eq!(&*hub.get("a", |_| true).unwrap().1, "{}");
        assert!(hub
            .decide("a", |_| true, Decision::Deny, "boss", Some("no".into()))
            .is_some());
        assert!(
            hub.decide("a", |_| true, Decision::Approve, "boss", None)
                .is_none(),
            "decided once"
        );
        assert_eq!(
            rx_a.try_recv().unwrap(),
            Resolution::Decided {
                decision: Decision::Deny,
                by: "boss".into(),
                reason: Some("no".into())
            }
        );
        assert_eq!(hub.withdraw_execution("ex1"), 1);
        assert_eq!(rx_b.try_recv().unwrap(), Resolution::Withdrawn);
        assert!(
            rx_c.try_recv().is_err(),
            "another execution's call waits on"
        );
        assert!(hub.get("a", |_| true).is_none(), "decided: gone");
        assert!(hub.close("c"));
        assert!(!hub.close("c"));
        assert!(hub.pending(|_| true).is_empty());
    }

    #[test]
    fn ids_are_long_and_random() {
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert_eq!(a.len(), 35);
        assert_ne!(a, b);
    }
}
