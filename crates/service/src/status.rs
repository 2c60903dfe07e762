//! The server's own state, as readiness and metrics say it: whether an execution could
//! start now and why not, how the pools, zygotes and tool servers are doing, and the
//! Prometheus text.

use airlock_engine::Mechanism;

use crate::services::{Services, SharedServices};

/// Why an execution could not start now; empty when it could: the host enforces what the
/// policy requires, the start-up trial run worked (tried again while it fails), the server
/// is not shutting down, the audit log can be written, and there is room.
pub fn not_ready_because(state: &SharedServices) -> Vec<String> {
    let mut reasons = Vec::new();
    let host = airlock_sandbox::host_support();
    let downgraded = |m| state.engine.config().is_downgraded(m);
    if let Err(e) = &host.user_namespaces {
        reasons.push(format!("user namespaces: {e}"));
    }
    for (m, r) in [
        (Mechanism::Seccomp, host.seccomp.as_ref().err()),
        (Mechanism::Landlock, host.landlock_abi.as_ref().err()),
        (Mechanism::Cgroups, host.cgroup.as_ref().err()),
    ] {
        if let (false, Some(e)) = (downgraded(m), r) {
            reasons.push(format!("{}: {e}", m.name()));
        }
    }
    state.retry_trial();
    if let Err(e) = state.lifecycle.trial() {
        reasons.push(format!("trial run: {e}"));
    }
    if state.is_shutting_down() {
        reasons.push("shutting down".into());
    }
    if let Some(why) = state.audit.retry_soon() {
        reasons.push(format!("the audit log cannot be written: {why}"));
    }
    if !state.admission.has_room() {
        reasons.push("every slot and the queue are full".into());
    }
    reasons
}

/// How the pools, zygotes and tool servers are doing. None of it decides readiness: a cold
/// sandbox serves when a pool is empty, and a tool server that is down fails the calls to
/// it, not the executions (said in `degraded`).
pub fn details(state: &Services) -> serde_json::Map<String, serde_json::Value> {
    let mut body = serde_json::Map::new();
    if let Some(pool) = state.engine.pool() {
        body.insert("pool".into(), serde_json::json!(pool.status()));
    }
    if let Some(pool) = state.engine.preloaded_pool() {
        body.insert("pool_preloaded".into(), serde_json::json!(pool.status()));
    }
    if let Some(zygotes) = state.engine.zygote_status() {
        body.insert("zygote".into(), serde_json::json!(zygotes));
    }
    if let Some(tools) = &state.tools {
        let statuses = tools.statuses();
        let degraded: Vec<String> = statuses
            .iter()
            .filter(|s| s.state != airlock_tools::SourceState::Ready)
            .map(|s| {
                format!(
                    "tool server `{}` is {}: {}",
                    s.name,
                    serde_json::json!(s.state).as_str().unwrap_or(""),
                    s.error.as_deref().unwrap_or("starting")
                )
            })
            .collect();
        body.insert("degraded".into(), serde_json::json!(degraded));
        body.insert("tools".into(), serde_json::json!(statuses));
    }
    body
}

/// Every metric, in Prometheus' text format.
pub fn metrics_text(state: &Services) -> String {
    let pool = state.engine.pool().map(|p| p.status()).unwrap_or_default();
    let mut text = state.metrics.render();
    text.push_str(&crate::metrics::render_pool(&pool));
    text.push_str(&crate::metrics::render_preloaded_pool(
        &state
            .engine
            .preloaded_pool()
            .map(|p| p.status())
            .unwrap_or_default(),
    ));
    text.push_str(&crate::metrics::render_zygotes(
        &state.engine.zygote_status().unwrap_or_default(),
    ));
    text.push_str(&crate::metrics::render_environment_pools(
        &state.engine.environment_pools(),
    ));
    text.push_str(&state.sessions.render_metrics());
    let (paused, paused_bytes) = state.paused.totals();
    text.push_str(&format!(
        "# HELP airlock_sessions_paused Sessions paused now, their state in snapshots on disk.\n\
         # TYPE airlock_sessions_paused gauge\nairlock_sessions_paused {paused}\n\
         # HELP airlock_sessions_paused_bytes Bytes the paused sessions take on disk.\n\
         # TYPE airlock_sessions_paused_bytes gauge\nairlock_sessions_paused_bytes {paused_bytes}\n"
    ));
    text.push_str(&format!(
        "# HELP airlock_environments_stored_bytes Bytes the operator's environments take on disk (each stored build once; no key's).\n\
         # TYPE airlock_environments_stored_bytes gauge\nairlock_environments_stored_bytes {}\n",
        state.storage.operator_bytes()
    ));
    let (queued, running, kept) = state.background.counts();
    text.push_str(&format!(
        "# HELP airlock_background_executions Background executions by state: queued and running now, ended and kept on disk.\n\
         # TYPE airlock_background_executions gauge\n\
         airlock_background_executions{{state=\"queued\"}} {queued}\n\
         airlock_background_executions{{state=\"running\"}} {running}\n\
         airlock_background_executions{{state=\"ended\"}} {kept}\n"
    ));
    if let Some(tools) = &state.tools {
        text.push_str(&crate::metrics::render_tools(&tools.statuses()));
    }
    text.push_str(&crate::metrics::render_process());
    text.push_str(&format!(
        "# HELP airlock_memory_held_bytes Memory held by request bodies and answers (and reserved for running executions' answers).\n\
         # TYPE airlock_memory_held_bytes gauge\nairlock_memory_held_bytes {}\n\
         # HELP airlock_memory_budget_bytes http.max_buffered_bytes.\n\
         # TYPE airlock_memory_budget_bytes gauge\nairlock_memory_budget_bytes {}\n",
        state.memory.used(),
        state.config.http.max_buffered_bytes
    ));
    text
}
