//! Approvals asked of the host's user by MCP elicitation, over stdio: for each tool call the
//! sandboxed code makes that waits for an approval, a form (approve or not, and why), whose
//! answer decides the call unless something else decided it first.

use std::sync::Arc;

use crate::mcp::call::Call;
use airlock_service::approvals;

/// What asks the host's user, by MCP elicitation, about each of the execution's tool
/// calls that waits for an approval: only over stdio (the HTTP transport is stateless,
/// with no way back to the client in the middle of a call) and only when the host said
/// it takes form elicitations. None otherwise: the call waits for a key's decision over
/// HTTP (`GET /v1/approvals`), and `airlock mcp`, which has none, refuses it at once.
pub(super) fn elicitation(call: &Call<'_>) -> Option<airlock_tools::Watcher> {
    use rmcp::service::ElicitationMode;
    if !call.stdio {
        return None;
    }
    let peer = call.context.peer.clone();
    if !peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
    {
        return None;
    }
    let wait = std::time::Duration::from_millis(call.state.config.tools.approval_timeout_ms);
    Some(Arc::new(move |approvals, approval| {
        let (peer, approvals, approval) = (peer.clone(), approvals.clone(), approval.clone());
        tokio::spawn(async move {
            use rmcp::model::{ClientResult, ElicitRequest, ServerRequest};
            // Gone from the table already (decided, withdrawn): nothing to ask.
            let Some(finished) = approvals.finished(&approval.id) else {
                return;
            };
            let request = ServerRequest::ElicitRequest(ElicitRequest::new(elicit(&approval)));
            // Bounded by the approval's own time: past it the call failed as a timeout,
            // and a late answer decides nothing.
            let options = rmcp::service::PeerRequestOptions::with_timeout(wait);
            let handle = match peer.send_request_with_option(request, options).await {
                Ok(handle) => handle,
                Err(e) => {
                    tracing::warn!(approval = %approval.id, "the MCP host could not be asked: {e}");
                    return;
                }
            };
            let id = handle.id.clone();
            tokio::select! {
                answer = handle.await_response() => match answer {
                    Ok(ClientResult::ElicitResult(answer)) => {
                        let (decision, reason) = host_decision(&answer);
                        approvals::decide_for_host(&approvals, &approval.id, decision, reason);
                    }
                    Ok(_) => tracing::warn!(approval = %approval.id, "the MCP host answered an elicitation with something else"),
                    // The call waits on until it times out or its execution ends.
                    Err(e) => tracing::warn!(approval = %approval.id, "the MCP host did not answer an elicitation: {e}"),
                },
                // Decided over HTTP, withdrawn with its execution, or out of time: the
                // host's dialog is closed, not left open to be answered for nothing.
                () = finished.cancelled() => {
                    let _ = peer
                        .notify_cancelled(rmcp::model::CancelledNotificationParam::new(
                            Some(id),
                            Some("the call was decided, withdrawn or timed out".into()),
                        ))
                        .await;
                }
            }
        });
    }))
}

/// The elicitation that asks the host's user whether one waiting call may run: what the
/// code asks, the arguments as every approver is shown them (bounded, every key, escaped),
/// and a form of one required yes/no and an optional reason.
fn elicit(approval: &airlock_api::Approval) -> rmcp::model::ElicitRequestParams {
    use airlock_api::Shown;
    use rmcp::model::{ElicitRequestParams, ElicitationSchema};
    let (bytes, sha256) = (approval.arguments_bytes, &approval.arguments_sha256);
    let arguments = match approval.arguments_shown {
        Shown::Whole => format!("the arguments {}", approval.arguments_preview),
        Shown::Cut => format!(
            "the arguments {} (long strings cut; {bytes} bytes in all, SHA-256 {sha256})",
            approval.arguments_preview
        ),
        // The preview names an HTTP route, which `airlock mcp` does not serve.
        Shown::TooLarge => format!(
            "arguments too large to show here ({bytes} bytes, SHA-256 {sha256}): their keys \
             and short values alone are over what is shown"
        ),
    };
    let line = approval
        .line
        .map(|l| format!(" (at line {l} of its code, as the sandbox says)"))
        .unwrap_or_default();
    // What the code chose is escaped already; the tool's name is the tool server's.
    let message = airlock_tools::printable(&format!(
        "The sandboxed code of execution {} wants to call the tool `{}.{}`{line} with \
         {arguments}. Approve this one call?",
        approval.execution_id, approval.server, approval.tool
    ));
    let schema = ElicitationSchema::builder()
        .required_bool("approve")
        .optional_string("reason")
        .build()
        .unwrap_or_else(|_| ElicitationSchema::new(Default::default()));
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    }
}

/// What the host's answer decides: approved only when its user accepted the form with
/// `approve` true; declined, cancelled or anything else is a denial.
fn host_decision(answer: &rmcp::model::ElicitResult) -> (airlock_api::Decision, Option<String>) {
    use rmcp::model::ElicitationAction;
    let content = answer.content.as_ref();
    let reason = content
        .and_then(|c| c.get("reason"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    let approved = answer.action == ElicitationAction::Accept
        && content.and_then(|c| c.get("approve")) == Some(&serde_json::Value::Bool(true));
    match (approved, &answer.action) {
        (true, _) => (airlock_api::Decision::Approve, reason),
        (false, ElicitationAction::Accept) => (airlock_api::Decision::Deny, reason),
        (false, ElicitationAction::Decline) => (
            airlock_api::Decision::Deny,
            reason.or(Some("the MCP host's user declined".into())),
        ),
        (false, _) => (
            airlock_api::Decision::Deny,
            reason.or(Some("the MCP host's user cancelled".into())),
        ),
    }
}

#[cfg(test)]
mod tests {
    use airlock_api::{Approval, Shown};

    fn message(preview: &str, shown: Shown) -> String {
        let approval = Approval {
            id: "ap_x".into(),
            execution_id: "ex_x".into(),
            key: "agent".into(),
            server: "crm".into(),
            tool: "send\u{202e}".into(),
            arguments: None,
            arguments_preview: preview.into(),
            arguments_shown: shown,
            arguments_escaped: true,
            arguments_bytes: 70000,
            arguments_sha256: "ab".into(),
            line: Some(3),
            requested_at: String::new(),
            expires_at: String::new(),
        };
        match super::elicit(&approval) {
            rmcp::model::ElicitRequestParams::FormElicitationParams { message, .. } => message,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_dialog_shows_the_preview_every_approver_is_shown_and_nothing_raw() {
        let m = message(r#"{"to":"bob\u{202e}"}"#, Shown::Whole);
        assert!(m.contains(r#"`crm.send\u{202e}` (at line 3"#), "{m}");
        assert!(
            m.contains(r#"with the arguments {"to":"bob\u{202e}"}. Approve"#),
            "{m}"
        );
        let m = message(r#"{"a":"xx"...(9 more bytes)}"#, Shown::Cut);
        assert!(
            m.contains("long strings cut; 70000 bytes in all, SHA-256 ab"),
            "{m}"
        );
        // The preview's sentence names an HTTP route `airlock mcp` does not serve.
        let m = message("(not shown: ... GET /v1/approvals/ap_x)", Shown::TooLarge);
        assert!(
            m.contains("too large to show here (70000 bytes") && !m.contains("GET"),
            "{m}"
        );
    }
}
