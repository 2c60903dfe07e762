//! Code mode in the server: the tool servers started with it, a tool set for each execution
//! of a key with grants, call records into the audit log, metrics and traces, and the listing
//! of what a key may call.

use std::sync::{Arc, Weak};

use airlock_tools::{ApprovalRecord, CallRecord, Observer, Registry, ToolSet};

use crate::config::Config;
use crate::keys::{Key, KeyStore};
use crate::services::{Services, SharedServices};

/// Starts every configured tool server and checks every key's grants against what they
/// list; any failure stops the start with its reason. None when no server is configured.
pub async fn start(config: &Config, keys: &KeyStore) -> Result<Option<Arc<Registry>>, String> {
    if config.tools.servers.is_empty() {
        check_grants(None, &keys.keys())?;
        return Ok(None);
    }
    let registry = Registry::start(config.tools.clone(), tokio::runtime::Handle::current());
    if let Err(e) = registry.started().await {
        registry.shutdown();
        return Err(e);
    }
    if let Err(e) = check_grants(Some(&registry), &keys.keys()) {
        registry.shutdown();
        return Err(e);
    }
    match registry.check_approvals() {
        Ok(warnings) => warnings.iter().for_each(|w| tracing::warn!("{w}")),
        Err(e) => {
            registry.shutdown();
            return Err(e);
        }
    }
    for s in registry.statuses() {
        tracing::info!(server = %s.name, transport = s.transport, tools = s.tools, "tool server started");
    }
    Ok(Some(registry))
}

/// Whether every key's grants name tools the servers list (warnings logged); at start and
/// when keys are reloaded.
pub fn check_grants(registry: Option<&Registry>, keys: &[Arc<Key>]) -> Result<(), String> {
    for key in keys {
        let Some(registry) = registry else {
            if !key.grants.is_empty() {
                return Err(format!(
                    "key `{}` is granted tools, but no tool server is configured ([tools.servers])",
                    key.name()
                ));
            }
            continue;
        };
        let warnings = registry
            .check_grants(&key.grants)
            .map_err(|e| format!("key `{}`: {e}", key.name()))?;
        for w in warnings {
            tracing::warn!(key = %key.name(), "{w}");
        }
    }
    Ok(())
}

/// The tool set of one execution (or session) of `key`: None when the key may call nothing,
/// so its sandbox has no tool channel at all.
pub fn for_key(state: &SharedServices, key: &Key) -> Option<Arc<ToolSet>> {
    let registry = state.tools.as_ref()?;
    if key.grants.is_empty() {
        return None;
    }
    let observer: Arc<dyn Observer> = Arc::new(ToolCallAudit(Arc::downgrade(state)));
    Some(registry.tool_set(key.name(), &key.grants, "", observer))
}

/// Records calls in the audit log and metrics.
#[derive(Debug)]
struct ToolCallAudit(Weak<Services>);

impl Observer for ToolCallAudit {
    fn approval(&self, record: &ApprovalRecord) {
        if let Some(state) = self.0.upgrade() {
            crate::approvals::record(&state, record);
        }
    }

    fn trace(&self, execution_id: &str) -> Option<airlock_tools::TraceContext> {
        let state = self.0.upgrade()?;
        let (traceparent, tracestate) = state.telemetry.tool_call_context(execution_id)?;
        Some(airlock_tools::TraceContext {
            traceparent,
            tracestate,
        })
    }

    fn call(&self, record: &CallRecord) {
        let Some(state) = self.0.upgrade() else {
            return;
        };
        state.telemetry.tool_call(record);
        let outcome = record.outcome.as_str();
        let (server, tool) = record.labels();
        state.metrics.tool_calls.add(&[server, tool, outcome]);
        state
            .metrics
            .tool_call_seconds
            .observe(std::time::Duration::from_millis(record.duration_ms));
        // A line that cannot be written is kept, and written when the log can be again.
        let _ = state.audit.append_event(record);
        tracing::info!(
            execution = %record.execution_id,
            key = %record.key,
            server = ?record.server,
            tool = ?record.tool,
            outcome,
            reason = record.reason.unwrap_or(""),
            duration_ms = record.duration_ms,
            "tool call"
        );
    }
}

/// What a key may call, as `GET /v1/tools` and MCP's `list_tool_apis` give it.
pub fn listing(state: &SharedServices, key: &Key) -> airlock_api::ToolsResponse {
    let apis = match &state.tools {
        Some(registry) => registry.apis(&key.grants),
        None => Vec::new(),
    };
    let python = airlock_tools::python_stubs(&apis);
    airlock_api::ToolsResponse {
        tools: apis,
        python,
    }
}
