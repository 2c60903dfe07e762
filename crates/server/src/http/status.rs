//! What the server says of itself: health, readiness, metrics, and the answers for unknown
//! paths and methods (the OpenAPI document is the route table's: `routes.rs`).

use crate::http::error::HttpError;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use airlock_service::caller::Caller;
use airlock_service::config::Scope;
use airlock_service::error::{Error, Kind};
use airlock_service::status;
use airlock_service::SharedServices;

pub(crate) async fn not_found() -> HttpError {
    HttpError(Error::not_found())
}

pub(crate) async fn method_not_allowed() -> HttpError {
    HttpError(Error::new(
        Kind::MethodNotAllowed,
        "method_not_allowed",
        "this route does not take that method",
    ))
}

pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Whether an execution could start now ([`status::not_ready_because`]); to keys that may
/// see metrics, how the pools, zygotes and tool servers are doing too.
pub(crate) async fn readyz(
    State(state): State<SharedServices>,
    caller: Option<Extension<Caller>>,
) -> Response {
    let reasons = status::not_ready_because(&state);
    let ready = reasons.is_empty();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = match caller {
        // A probe without a key (`http.readyz_without_key`): why not is for keys.
        None => serde_json::json!({"ready": ready}),
        Some(Extension(caller)) => {
            let mut body = serde_json::json!({"ready": ready, "reasons": reasons});
            // The pools' and tool servers' states tell everyone's traffic and name the
            // operator's programs: for keys that may see metrics.
            if caller.0.allows(Scope::Metrics) {
                if let Some(map) = body.as_object_mut() {
                    map.extend(status::details(&state));
                }
            }
            body
        }
    };
    let mut response = (code, Json(body)).into_response();
    if !ready {
        // As every 503: when to ask again (a server shutting down is gone by then).
        let secs = if state.is_shutting_down() {
            Error::shutting_down().retry_after_secs
        } else {
            Some(airlock_service::error::UNAVAILABLE_RETRY_AFTER_SECS)
        };
        if let Some(secs) = secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
    }
    response
}

/// Prometheus' text (the route's scope is `metrics`, unless the configuration opens it).
pub(crate) async fn metrics(State(state): State<SharedServices>) -> Response {
    let mut response = status::metrics_text(&state).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
