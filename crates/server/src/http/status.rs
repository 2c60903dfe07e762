//! What the server says of itself: health, readiness, metrics, the OpenAPI document, and the
//! answers for unknown paths and methods.

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::caller::{require, Caller};
use crate::config::Scope;
use crate::error::Error;
use crate::SharedState;

pub(crate) async fn not_found() -> Error {
    Error::not_found()
}

pub(crate) async fn method_not_allowed() -> Error {
    Error::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Whether an execution could start now: the host enforces what the policy requires, the
/// start-up trial run worked, the server is not shutting down, and there is room.
pub(crate) async fn readyz(
    State(state): State<SharedState>,
    caller: Option<Extension<Caller>>,
) -> Response {
    let mut reasons = Vec::new();
    let host = airlock_sandbox::host_support();
    let downgraded = |m| state.engine.config().is_downgraded(m);
    use airlock_engine::Mechanism;
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
    if let Err(e) = &*state.trial.lock().unwrap_or_else(|e| e.into_inner()) {
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
    let ready = reasons.is_empty();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let Some(Extension(caller)) = caller else {
        // A probe without a key (`http.readyz_without_key`): why not is for keys.
        return (status, Json(serde_json::json!({"ready": ready}))).into_response();
    };
    let mut body = serde_json::json!({"ready": ready, "reasons": reasons});
    // The pool does not decide readiness (a cold sandbox serves when it is empty), but says
    // how it is doing, to keys that may see metrics: its counters tell everyone's traffic.
    let may_see = caller.0.allows(Scope::Metrics);
    if let (true, Some(pool)) = (may_see, state.engine.pool()) {
        body["pool"] = serde_json::json!(pool.status());
    }
    if let (true, Some(pool)) = (may_see, state.engine.preloaded_pool()) {
        body["pool_preloaded"] = serde_json::json!(pool.status());
    }
    if let (true, Some(zygotes)) = (may_see, state.engine.zygote_status()) {
        body["zygote"] = serde_json::json!(zygotes);
    }
    // A tool server that is down fails the calls to it, not the executions: it is shown,
    // and said in `degraded`, without making the server unready (to the same keys: its
    // errors name the operator's programs and addresses).
    if let (true, Some(tools)) = (may_see, &state.tools) {
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
        body["degraded"] = serde_json::json!(degraded);
        body["tools"] = serde_json::json!(statuses);
    }
    (status, Json(body)).into_response()
}

pub(crate) async fn metrics(
    State(state): State<SharedState>,
    caller: Option<Extension<Caller>>,
) -> Result<Response, Error> {
    if let Some(Extension(caller)) = caller {
        require(&caller, Scope::Metrics)?;
    }
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
    if let Some(tools) = &state.tools {
        text.push_str(&crate::metrics::render_tools(&tools.statuses()));
    }
    text.push_str(&format!(
        "# HELP airlock_memory_held_bytes Memory held by request bodies and answers (and reserved for running executions' answers).\n\
         # TYPE airlock_memory_held_bytes gauge\nairlock_memory_held_bytes {}\n\
         # HELP airlock_memory_budget_bytes http.max_buffered_bytes.\n\
         # TYPE airlock_memory_budget_bytes gauge\nairlock_memory_budget_bytes {}\n",
        state.memory.used(),
        state.config.http.max_buffered_bytes
    ));
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

pub(crate) async fn openapi() -> Json<serde_json::Value> {
    Json(crate::openapi())
}
