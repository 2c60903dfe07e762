//! The services: what an execution, a session, an evaluation, a scan, an environment, a volume and a
//! tool listing are, once, whichever adapter asks (the HTTP handlers in [`crate::http`], the
//! MCP tools in [`crate::mcp`]). They check, admit, audit and call the engine, in the order
//! the pipeline owns for everything that runs code ([`pipeline`]); they take transport-free
//! requests and bodies ([`body::Body`]) and give back transport-free outcomes, event streams
//! ([`stream`]) and errors ([`crate::error::Error`]): no route, status code or response.
//! `tests/layers.rs` fails on a path of axum, http, hyper or rmcp here.

pub(crate) mod approvals;
pub(crate) mod background;
pub(crate) mod body;
pub(crate) mod credentials;
pub(crate) mod egress;
pub(crate) mod environments;
pub(crate) mod eval;
pub(crate) mod execution;
pub(crate) mod parked;
pub(crate) mod paused;
pub(crate) mod pickle;
pub(crate) mod pipeline;
pub(crate) mod sessions;
pub(crate) mod snapshots;
pub(crate) mod status;
pub(crate) mod stream;
pub(crate) mod tools;
pub(crate) mod volumes;

use crate::error::{Error, Kind};
use crate::AppState;

/// A 404 for what this server does not hold; one that names another replica says so, for
/// the operator whose balancer sent it to the wrong one (docs/deploying.md "Several replicas").
pub(crate) fn not_here(state: &AppState, id: &str, what: &str) -> Error {
    let message = match (crate::keys::replica_of(id), state.config.replica.as_deref()) {
        (Some(theirs), Some(ours)) if theirs != ours => format!(
            "no such {what} here: its id names replica {theirs}, and this is replica {ours}; \
             the balancer must send requests for an id to the replica it names"
        ),
        _ => format!("no such {what}"),
    };
    Error::new(Kind::NotFound, "not_found", message)
}

/// No new executions while shutting down, or while the audit log cannot be written.
pub(crate) fn refuse_if_unavailable(state: &crate::SharedState) -> Result<(), Error> {
    if state.is_shutting_down() {
        return Err(Error::shutting_down());
    }
    if let Some(why) = state.audit.retry_soon() {
        return Err(audit_unavailable(&why));
    }
    Ok(())
}

/// Worth a retry a second later: the audit log is tried again each second (the file by the
/// requests that ask, the store by its writer).
pub(crate) fn audit_unavailable(why: &str) -> Error {
    Error::new(
        Kind::Unavailable,
        "unavailable",
        format!("executions are refused while the audit log cannot be written: {why}"),
    )
    .retry_after(crate::audit_lines::RETRY_EVERY.as_secs())
}
