//! Approvals of tool calls in the server (docs/approvals.md): who may see and decide which
//! waiting call, the decision, each step in the audit log and metrics, and the watchers that
//! tell a streamed execution's client (an `approval_requested` event) or an MCP host (an
//! elicitation) that one of its calls waits. The table of waiting calls, and the waiting
//! itself, are the tools crate's (`airlock_tools::Approvals`).
//!
//! A key with the `approve` scope sees and decides the calls of the keys its `approves`
//! names (`"*"`: every key), never those of its own executions: an agent holding a key that
//! could approve its own calls would need no approval at all. Anything else, an id unknown,
//! decided, timed out, withdrawn or not the caller's to see, is the same 404.

use std::sync::Arc;

use airlock_api::{
    Approval, ApprovalDetail, ApprovalList, Decided, Decision, DecisionRequest, MAX_REASON_CHARS,
};
use airlock_tools::{ApprovalRecord, Approvals, Watch, Watcher};

use crate::body::{parse_json, read_body, Body};
use crate::config::Scope;
use crate::error::Error;
use crate::keys::Key;
use crate::services::{Services, SharedServices};

/// Whether `approver` may see and decide `approval`.
pub fn may_decide(approver: &Key, approval: &Approval) -> bool {
    approver.allows(Scope::Approve)
        && approval.key != approver.name()
        && approver
            .config
            .approves
            .iter()
            .any(|k| k == "*" || *k == approval.key)
}

fn table(state: &Services) -> Option<&Arc<Approvals>> {
    state.tools.as_ref().map(|registry| registry.approvals())
}

/// `GET /v1/approvals`: the calls waiting that `caller` may decide, oldest first.
pub fn list(state: &Services, caller: &Key) -> ApprovalList {
    let approvals = table(state)
        .map(|t| t.pending(|a| may_decide(caller, a)))
        .unwrap_or_default();
    ApprovalList { approvals }
}

/// `GET /v1/approvals/{id}`: one waiting call that `caller` may decide, as listed, with its
/// arguments whole (the bytes the call will send).
pub fn get(state: &Services, caller: &Key, id: &str) -> Result<ApprovalDetail, Error> {
    let found = table(state).and_then(|t| t.get(id, |a| may_decide(caller, a)));
    let Some((approval, arguments)) = found else {
        return Err(crate::services::not_here(state, id, "waiting tool call"));
    };
    let arguments = serde_json::value::RawValue::from_string(arguments.to_string())
        .map_err(|_| Error::internal("the arguments could not be read back"))?;
    Ok(ApprovalDetail {
        approval,
        arguments,
    })
}

/// `POST /v1/approvals/{id}`: decides one waiting call, once.
pub async fn decide(
    state: &SharedServices,
    caller: &Key,
    id: &str,
    body: Body,
) -> Result<Decided, Error> {
    let body = read_body(state, caller, body).await?;
    let asked: DecisionRequest = parse_json(state, &body.bytes)?;
    drop(body);
    if let Some(reason) = &asked.reason {
        if reason.chars().count() > MAX_REASON_CHARS {
            return Err(Error::invalid(
                "reason",
                format!("a reason is at most {MAX_REASON_CHARS} characters"),
            ));
        }
    }
    let decided = table(state).and_then(|t| {
        t.decide(
            id,
            |a| may_decide(caller, a),
            asked.decision,
            caller.name(),
            asked.reason.clone(),
        )
    });
    let Some(approval) = decided else {
        return Err(crate::services::not_here(state, id, "waiting tool call"));
    };
    Ok(Decided {
        approval: (*approval).clone(),
        decision: asked.decision,
        decided_by: caller.name().to_owned(),
    })
}

/// Tells `tell` of each call of `execution_id` that starts waiting, until the watch is
/// dropped; None when the server has no tools.
pub fn watch(state: &Services, execution_id: &str, tell: Watcher) -> Option<Watch> {
    table(state).map(|t| t.watch(execution_id, tell))
}

/// Withdraws the calls of `execution_id` still waiting: its execution is over.
pub fn withdraw(state: &Services, execution_id: &str) {
    if let Some(t) = table(state) {
        t.withdraw_execution(execution_id);
    }
}

/// Decides a waiting call for the MCP host that answered its elicitation (the host's user
/// stands for the key that ran the code, as its own approver).
pub fn decide_for_host(
    approvals: &Approvals,
    id: &str,
    decision: Decision,
    reason: Option<String>,
) {
    let reason = reason.map(|r| r.chars().take(MAX_REASON_CHARS).collect());
    approvals.decide(id, |_| true, decision, HOST, reason);
}

/// How the audit log names an MCP host that decided by elicitation.
pub const HOST: &str = "mcp_host";

/// Each step of an approval: an audit line, a count, a log line.
pub fn record(state: &Services, record: &ApprovalRecord) {
    state.metrics.tool_approvals.add(&[record.outcome]);
    // A line that cannot be written is kept, and written when the log can be again.
    let _ = state.audit.append_event(record);
    tracing::info!(
        approval = %record.approval_id,
        execution = %record.execution_id,
        key = %record.key,
        server = ?record.server,
        tool = ?record.tool,
        outcome = record.outcome,
        by = record.by.as_deref().unwrap_or(""),
        "tool approval"
    );
}
