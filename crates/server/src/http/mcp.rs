//! MCP over streamable HTTP: `POST /mcp` takes in the message as every other body is taken
//! in, then hands it to rmcp's transport, which calls the tools of `mcp.rs`; rmcp's own
//! refusals are answered in the API's one error shape.

use crate::http::error::HttpError;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::http::answer::hold_stream;
use crate::http::body::from_parts;
use crate::http::error::{kind_of, IntoHttp};
use crate::mcp::{Handover, Tools};
use airlock_service::answer::Reserved;
use airlock_service::caller::Caller;
use airlock_service::error::Error;
use airlock_service::pipeline;
use airlock_service::SharedServices;

/// The streamable HTTP transport for `/mcp`. Stateless: each POST is answered on its own, so
/// no MCP session outlives its request or can be taken over by another key (airlock sessions
/// are the tools' own, owned by the key). Host and Origin are the guard's to check. The
/// answer is JSON, unless the call sends a notification first (progress, when the client
/// gave a token): rmcp then answers that POST with server-sent events, the notifications and
/// the result, with a comment line after `http.sse_keep_alive_ms` of silence.
pub(crate) fn service(state: SharedServices) -> StreamableHttpService<Tools, NeverSessionManager> {
    let max_body = usize::try_from(state.config.http.max_body_bytes).unwrap_or(usize::MAX);
    let keep_alive = state.config.http.sse_keep_alive_ms;
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive((keep_alive > 0).then(|| Duration::from_millis(keep_alive)))
        .with_sse_retry(None)
        .with_max_request_body_bytes(max_body)
        .disable_allowed_hosts()
        .disable_allowed_origins();
    StreamableHttpService::new(
        move || Ok(Tools::for_http(state.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// `/mcp`: a POST body read within the same limits as every other body (size, time, memory),
/// after the key's rate limit and in-flight bound (as for REST: a throttled key cannot make
/// the server read bodies for it), then the MCP transport. The message's arrival is handed to
/// the call it carries; what the call reserves for its answer counts the answer rmcp makes.
pub(crate) async fn route(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Extension(service): Extension<StreamableHttpService<Tools, NeverSessionManager>>,
    req: Request,
) -> Result<Response, HttpError> {
    if req.method() != axum::http::Method::POST {
        // rmcp answers the rest (405: stateless, no GET stream, nothing to DELETE).
        return Ok(transport_error(service.handle(req).await.into_response()).await);
    }
    let (mut parts, body) = req.into_parts();
    let (received, bytes) =
        pipeline::receive(&state, &caller.0, from_parts(&parts.headers, body)).await?;
    let handover = Handover::new(received);
    parts.extensions.insert(handover.clone());
    let slot = Reserved::default();
    parts.extensions.insert(slot.clone());
    let req = Request::from_parts(parts, Body::from(bytes));
    let mut response = transport_error(service.handle(req).await.into_response()).await;
    // Held until the message is answered when no call took it.
    drop(handover.take());
    let events = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if events {
        // The result comes after the response began: the body holds its reservation.
        return Ok(hold_stream(&state, &caller.0, response, slot));
    }
    response.extensions_mut().insert(slot);
    Ok(response)
}

/// rmcp's own refusals of a request it cannot take as MCP (a GET, an `Accept` without
/// `text/event-stream`, a wrong content type) come as plain text: they become the API's one
/// error shape. JSON-RPC answers, errors included, pass as they are.
async fn transport_error(response: Response) -> Response {
    let status = response.status();
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return response;
    }
    let code = match status.as_u16() {
        400 => "invalid_request",
        405 => "method_not_allowed",
        406 => "not_acceptable",
        413 => "payload_too_large",
        415 => "unsupported_media_type",
        s if s >= 500 => "internal",
        _ => "invalid_request",
    };
    let text = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        format!("the MCP transport refused the request ({status})")
    } else {
        text
    };
    Error::new(kind_of(status), code, message).into_http()
}
