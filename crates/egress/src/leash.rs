//! A leash: one execution's egress, or one session's, as the proxy that serves it counts it:
//! the policy it was given, the operator's [`Settings`] (budgets, timeouts, fixed answers for
//! names), whom the connections opened now belong to and the account each counts in
//! ([`Leash::begin`], [`Leash::end_cell`], a session's time between cells), the credentials
//! its connections may carry, and the [`Observer`] told about each connection
//! ([`ConnectionRecord`]) once it ends. Serving its listener is [`crate::proxy`]'s.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use airlock_api::egress::{normalize, EgressPolicy, Usage};
use serde::{Deserialize, Serialize};

use crate::credentials::CredentialRecord;
use crate::intercept::Interception;

/// The operator's budgets and resolution overrides, the same for every execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Connections one execution may open (denied ones count too).
    pub max_connections: u32,
    /// Bytes one execution may send, over all its connections.
    pub max_bytes_out: u64,
    /// Bytes one execution may receive, over all its connections.
    pub max_bytes_in: u64,
    pub connect_timeout_ms: u64,
    /// A connection with no byte either way for this long is closed.
    pub idle_timeout_ms: u64,
    /// Fixed answers for names (like curl's `--resolve`): the proxy uses these addresses
    /// instead of asking the host's resolver. The address checks apply to them all the same.
    pub resolve: BTreeMap<String, Vec<IpAddr>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_connections: 64,
            max_bytes_out: 16 << 20,
            max_bytes_in: 512 << 20,
            connect_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            resolve: BTreeMap::new(),
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), String> {
        for (name, zero) in [
            ("max_connections", self.max_connections == 0),
            ("max_bytes_out", self.max_bytes_out == 0),
            ("max_bytes_in", self.max_bytes_in == 0),
            ("connect_timeout_ms", self.connect_timeout_ms == 0),
            ("idle_timeout_ms", self.idle_timeout_ms == 0),
        ] {
            if zero {
                return Err(format!("egress.{name} must be greater than zero"));
            }
        }
        for name in self.resolve.keys() {
            if normalize(name).as_deref() != Some(name.as_str()) {
                return Err(format!(
                    "egress.resolve: {name:?} is not a lower-case host name"
                ));
            }
        }
        Ok(())
    }
}

/// One connection, as the audit log and metrics see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConnectionRecord {
    pub event: &'static str,
    /// The execution (or session cell) that opened it; `None` for one a session's code
    /// opened while none of its cells ran.
    pub execution_id: Option<String>,
    /// The session it was opened in, for a session's connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Opened while none of the session's cells ran (by a thread or process a cell left).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub between_cells: bool,
    pub key: String,
    /// `CONNECT`, or the plain request's method.
    pub method: String,
    pub host: String,
    pub port: u16,
    /// The address connected to (or refused), once the name was resolved.
    pub address: Option<String>,
    /// `allowed`, `denied` (the policy or a budget said no) or `failed` (allowed, but the
    /// target could not be reached, or the request was not one the proxy speaks).
    pub outcome: &'static str,
    pub reason: Option<&'static str>,
    /// What went wrong, in words, for a connection that was not allowed or was cut; or what
    /// of a plain connection was not relayed (bytes after its one request).
    pub detail: Option<String>,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub duration_ms: u64,
    /// The credential the proxy set on this connection's requests (it ended the code's TLS
    /// and opened its own): each request has an audit line of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// Requests relayed on a connection that carried a credential.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
}

/// Told about every connection once it ends.
pub trait Observer: Send + Sync + std::fmt::Debug {
    fn connection(&self, record: &ConnectionRecord);

    /// A connection refused past the connection budget after the first such refusal of its
    /// execution (which [`Observer::connection`] was told): counted, never recorded one by
    /// one, so that a loop of connections cannot flood the audit log.
    fn budget_refusal(&self) {}

    /// A request that carried a credential, once its answer was relayed (or cut).
    fn credential(&self, _record: &CredentialRecord) {}
}

/// What one account (an execution, a session's cell, or a session's time between cells)
/// used, against its budgets. A connection counts in the account it was opened under, to
/// its end.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) opened: AtomicU64,
    /// A refusal for the connection budget was audited already (the rest are only counted).
    pub(crate) budget_audited: AtomicBool,
    pub(crate) connections: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) credential_requests: AtomicU64,
}

impl Tally {
    pub(crate) fn usage(&self) -> Usage {
        Usage {
            connections: self.connections.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            credential_requests: self.credential_requests.load(Ordering::Relaxed),
        }
    }
}

/// Whom the connections opened now belong to, and the account they count in.
#[derive(Clone, Debug, Default)]
pub(crate) struct Owner {
    /// The execution or cell; `None` between a session's cells.
    pub(crate) execution_id: Option<String>,
    pub(crate) session_id: Option<String>,
    pub(crate) tally: Arc<Tally>,
}

/// The egress of one execution, or of one session: each of its cells begins anew, and the
/// time between them has an account of its own for the session's whole life.
#[derive(Debug)]
pub struct Leash {
    pub(crate) policy: EgressPolicy,
    pub(crate) settings: Arc<Settings>,
    pub(crate) key: String,
    pub(crate) owner: Mutex<Owner>,
    /// A session's time between cells ([`Leash::for_session`]).
    between_cells: OnceLock<Owner>,
    /// Connections open now (each holds threads on the host), across a session's cells.
    pub(crate) live: AtomicU64,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// The credentials its connections may carry, with the CA that ends their TLS.
    pub(crate) interception: Option<Arc<Interception>>,
}

impl Leash {
    pub fn new(
        policy: EgressPolicy,
        settings: Arc<Settings>,
        key: impl Into<String>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Self {
        Leash {
            policy,
            settings,
            key: key.into(),
            owner: Mutex::new(Owner {
                execution_id: Some(String::new()),
                ..Owner::default()
            }),
            between_cells: OnceLock::new(),
            live: AtomicU64::new(0),
            observer,
            interception: None,
        }
    }

    /// Lets this leash's connections to a credential's hosts carry it (see
    /// [`crate::intercept`]).
    pub fn with_interception(mut self, interception: Arc<Interception>) -> Self {
        self.interception = Some(interception);
        self
    }

    pub fn interception(&self) -> Option<&Arc<Interception>> {
        self.interception.as_ref()
    }

    pub fn policy(&self) -> &EgressPolicy {
        &self.policy
    }

    pub(crate) fn owner(&self) -> std::sync::MutexGuard<'_, Owner> {
        self.owner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes this the leash of session `session_id` (before its sandbox starts): connections
    /// opened while none of its cells runs belong to the session, and count in one account
    /// for its whole life, under the same budgets as one execution.
    pub fn for_session(&self, session_id: &str) {
        let between = self.between_cells.get_or_init(|| Owner {
            execution_id: None,
            session_id: Some(session_id.to_owned()),
            tally: Arc::default(),
        });
        *self.owner() = between.clone();
    }

    /// Names the execution (or cell) the connections that follow belong to, with budgets of
    /// its own.
    pub fn begin(&self, execution_id: &str) {
        *self.owner() = Owner {
            execution_id: Some(execution_id.to_owned()),
            session_id: self.between_cells.get().and_then(|b| b.session_id.clone()),
            tally: Arc::default(),
        };
    }

    /// A session's cell is over: what it used. Connections opened from now until the next
    /// [`Leash::begin`] are the session's, between cells.
    pub fn end_cell(&self) -> Usage {
        let mut owner = self.owner();
        let used = owner.tally.usage();
        if let Some(between) = self.between_cells.get() {
            *owner = between.clone();
        }
        used
    }

    /// What the current execution (or cell) used so far.
    pub fn usage(&self) -> Usage {
        self.owner().tally.usage()
    }

    /// What a session's code used while none of its cells ran, over its whole life so far;
    /// `None` for a leash that is not a session's.
    pub fn between_cells(&self) -> Option<Usage> {
        self.between_cells.get().map(|b| b.tally.usage())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_time_between_cells_is_an_account_of_its_own() {
        let leash = Leash::new(EgressPolicy::default(), Arc::default(), "k", None);
        assert_eq!(leash.between_cells(), None, "not a session's");
        leash.for_session("se_a");
        let count = |n| {
            let owner = leash.owner().clone();
            owner.tally.connections.fetch_add(n, Ordering::Relaxed);
            (owner.execution_id, owner.session_id)
        };
        assert_eq!(count(2), (None, Some("se_a".into())));
        leash.begin("ex_1");
        assert_eq!(count(1), (Some("ex_1".into()), Some("se_a".into())));
        assert_eq!(leash.end_cell().connections, 1);
        // After the cell: the session's again, its count kept.
        assert_eq!(count(3), (None, Some("se_a".into())));
        leash.begin("ex_2");
        assert_eq!(leash.usage().connections, 0, "each cell begins anew");
        assert_eq!(leash.end_cell().connections, 0);
        assert_eq!(leash.between_cells().map(|u| u.connections), Some(5));
        // An execution's leash stays the execution's.
        let leash = Leash::new(EgressPolicy::default(), Arc::default(), "k", None);
        leash.begin("ex_3");
        leash.end_cell();
        assert_eq!(leash.owner().execution_id.as_deref(), Some("ex_3"));
    }
}
