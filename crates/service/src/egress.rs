//! Egress on a leash: the policy an execution runs under (the request's, never wider than
//! its key's, or the key's own), and the audit lines, metrics and spans of its connections.

use std::sync::{Arc, Weak};

use airlock_egress::{ConnectionRecord, CredentialRecord, EgressPolicy, Leash, Observer};

use crate::error::Error;
use crate::keys::Key;
use crate::services::Services;

/// The leash for one execution or session of `key`, with the credentials its requests may
/// carry; [`None`] when it may reach nothing.
pub fn for_request(
    state: &Arc<Services>,
    key: &Key,
    asked: Option<EgressPolicy>,
    asked_credentials: Option<Vec<String>>,
) -> Result<Option<Arc<Leash>>, Error> {
    let credentials = state.credentials.for_request(key, asked_credentials)?;
    let allowed = &key.config.egress;
    let policy = match asked {
        None => allowed.clone(),
        Some(asked) => {
            asked.validate().map_err(|m| Error::invalid("egress", m))?;
            allowed.covers(&asked).map_err(|m| {
                Error::forbidden(format!("{m} (key `{}`)", key.name())).field("egress")
            })?;
            asked
        }
    };
    if policy.allows_nothing() {
        return Ok(None);
    }
    let mut leash = Leash::new(
        policy,
        state.egress.clone(),
        key.name(),
        Some(observer(state)),
    );
    if !credentials.is_empty() {
        leash = leash.with_interception(state.credentials.interception(credentials)?);
    }
    Ok(Some(Arc::new(leash)))
}

/// What writes a connection's audit line and counts it.
pub fn observer(state: &Arc<Services>) -> Arc<dyn Observer> {
    Arc::new(ConnectionAudit(Arc::downgrade(state)))
}

/// Records connections in the audit log and metrics.
#[derive(Debug)]
struct ConnectionAudit(Weak<Services>);

impl Observer for ConnectionAudit {
    fn connection(&self, record: &ConnectionRecord) {
        let Some(state) = self.0.upgrade() else {
            return;
        };
        state.telemetry.connection(record);
        let reason = record.reason.unwrap_or("");
        state
            .metrics
            .egress_connections
            .add(&[record.outcome, reason]);
        state.metrics.egress_bytes.add_n(&["out"], record.bytes_out);
        state.metrics.egress_bytes.add_n(&["in"], record.bytes_in);
        // A line that cannot be written is kept, and written when the log can be again.
        let _ = state.audit.append_event(record);
        tracing::info!(
            execution = record.execution_id.as_deref().unwrap_or(""),
            session = record.session_id.as_deref().unwrap_or(""),
            between_cells = record.between_cells,
            key = %record.key,
            host = %record.host,
            port = record.port,
            address = record.address.as_deref().unwrap_or(""),
            outcome = record.outcome,
            reason,
            bytes_out = record.bytes_out,
            bytes_in = record.bytes_in,
            "egress connection"
        );
    }

    fn credential(&self, record: &CredentialRecord) {
        let Some(state) = self.0.upgrade() else {
            return;
        };
        let class = match record.status {
            Some(s @ 100..=599) => ["1xx", "2xx", "3xx", "4xx", "5xx"][usize::from(s / 100 - 1)],
            _ => "none",
        };
        state
            .metrics
            .credential_requests
            .add(&[record.credential.as_str(), class]);
        let _ = state.audit.append_event(record);
    }

    fn budget_refusal(&self) {
        if let Some(state) = self.0.upgrade() {
            state
                .metrics
                .egress_connections
                .add(&["denied", "connection_budget"]);
        }
    }
}
