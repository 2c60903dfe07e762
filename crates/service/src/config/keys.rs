//! `[[keys]]`: who may call, with which scopes, limits and grants.

use std::collections::BTreeSet;

use airlock_api::LimitsRequest;
use serde::{Deserialize, Serialize};

/// What a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `POST /v1/execute`.
    Execute,
    /// `GET /v1/executions/{id}` (its own executions only).
    Read,
    /// `GET /metrics` (when it requires a key).
    Metrics,
    /// Building and deleting environments. Never given by default: list it explicitly.
    Admin,
    /// Seeing and deciding tool calls that wait for an approval, of the keys named in
    /// `approves` (docs/approvals.md). Never given by default.
    Approve,
}

impl Scope {
    /// What a key gets when its `scopes` are not given (everything but `admin`).
    pub const ALL: [Scope; 3] = [Scope::Execute, Scope::Read, Scope::Metrics];
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Shown in logs, metrics and the audit log instead of the key.
    pub name: String,
    /// `sha256:` and the hex SHA-256 of the key (`airlock` prints it when it makes a key).
    pub hash: String,
    #[serde(default = "all_scopes")]
    pub scopes: Vec<Scope>,
    /// Executions of this key running at once; absent: only the global limit applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<usize>,
    /// Executions of this key waiting at once, past which it gets 429; absent: only the
    /// global queue applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<usize>,
    /// Requests per minute (a bucket of that many, refilled evenly); 0: no limit.
    #[serde(default)]
    pub rate_per_minute: u32,
    /// Ceilings for this key, below the engine's own; what is left out falls to those.
    #[serde(default)]
    pub ceilings: LimitsRequest,
    /// Tools its code may call: `server.tool` patterns (`*` matches any characters). A tool
    /// not annotated read-only is granted only by its exact name. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// Where its code may connect through airlock's proxy (host names with ports, and any
    /// address range opened explicitly). Default: nowhere.
    #[serde(
        default,
        skip_serializing_if = "airlock_egress::EgressPolicy::allows_nothing"
    )]
    pub egress: airlock_egress::EgressPolicy,
    /// Credentials (`[credentials.NAME]`) the proxy may set on its code's requests to their
    /// hosts, which its `egress` must allow. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// With the `approve` scope: the keys whose tool calls it may see and decide, by name, or
    /// `"*"` for every key. Never its own calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approves: Vec<String>,
    /// Its background executions running at once; absent: `background.max_running_per_key`.
    /// 0 with `max_background_queued = 0` keeps it from submitting any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_background_running: Option<usize>,
    /// Its background executions waiting at once; absent: `background.max_queued_per_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_background_queued: Option<usize>,
}

fn all_scopes() -> Vec<Scope> {
    Scope::ALL.to_vec()
}

impl KeyConfig {
    /// A key with every scope and no limits of its own.
    pub fn new(name: &str, hash: String) -> Self {
        KeyConfig {
            name: name.to_owned(),
            hash,
            scopes: all_scopes(),
            max_concurrency: None,
            max_queue: None,
            rate_per_minute: 0,
            ceilings: LimitsRequest::default(),
            tools: Vec::new(),
            egress: airlock_egress::EgressPolicy::default(),
            credentials: Vec::new(),
            approves: Vec::new(),
            max_background_running: None,
            max_background_queued: None,
        }
    }
}

/// A key's `approves` goes with the `approve` scope, and names keys that exist (a typo would
/// leave a key's calls with nobody to decide them).
pub(super) fn check_approves(key: &KeyConfig, names: &BTreeSet<String>) -> Result<(), String> {
    let scoped = key.scopes.contains(&Scope::Approve);
    if scoped && key.approves.is_empty() {
        return Err(
            "the approve scope needs `approves`: the names of the keys whose calls it decides, \
             or [\"*\"] for every key"
                .into(),
        );
    }
    if !scoped && !key.approves.is_empty() {
        return Err("`approves` needs the approve scope in `scopes`".into());
    }
    for name in &key.approves {
        if name == &key.name {
            return Err(
                "a key never decides its own calls: remove its own name from `approves`".into(),
            );
        }
        if name != "*" && !names.contains(name) {
            return Err(format!("`approves` names no configured key {name:?}"));
        }
    }
    Ok(())
}
