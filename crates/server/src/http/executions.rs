//! `POST /v1/execute` (JSON or a stream of events), background executions (`POST
//! /v1/executions`, their events and their cancellation) and `GET /v1/executions/{id}`, over
//! the execution service.

use crate::http::error::HttpError;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::http::answer::{Answer, Step, Unfolded};
use crate::http::body::body_of;
use crate::http::sse;
use airlock_service::answer::{over_budget, Form, WINDOW};
use airlock_service::background::{self, Meta, Next, Stored, Tail};
use airlock_service::budget::Share;
use airlock_service::caller::{Caller, RequestId};
use airlock_service::error::Error;
use airlock_service::execution;
use airlock_service::keys::Key;
use airlock_service::pipeline::{self, Input, Work};
use airlock_service::services::not_here;
use airlock_service::SharedServices;

/// `GET /v1/executions/{id}`: the caller's own only. A background execution's state (and
/// result, once it has one), or any other execution's audit record.
pub(crate) async fn execution(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    if state.background.holds(&id) {
        if let Some(meta) = state.background.get(&caller.0, &id) {
            return background_view(&state, &caller.0, meta).await;
        }
        // Another key's, or deleted: answered as one that never was, after the same look-up
        // (neither its words nor its time tell them apart), never with its audit record.
        return Err(HttpError(
            match execution::record(&state, &caller.0, &id).await {
                Ok(_) => execution::no_record(&state, &id),
                Err(e) => e,
            },
        ));
    }
    execution::record(&state, &caller.0, &id)
        .await
        .map(|record| Json(record).into_response())
        .map_err(HttpError)
}

/// `POST /v1/execute`.
pub(crate) async fn execute(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    req: Request,
) -> Result<Response, HttpError> {
    run(&state, caller, request_id, req, |body| {
        Work::Execute(Input::Body(body))
    })
    .await
}

/// Runs the execution-like work whose arguments are `req`'s body through the pipeline: its
/// answer as JSON, or its events when the client asked for a stream (`POST /v1/execute`, a
/// session's cell).
pub(crate) async fn run(
    state: &SharedServices,
    caller: Caller,
    request_id: String,
    req: Request,
    work: impl FnOnce(airlock_service::body::Body) -> Work,
) -> Result<Response, HttpError> {
    let stream = sse::wanted(req.headers());
    let request = pipeline::Request {
        caller: caller.0,
        request_id,
        work: work(body_of(req)),
        received: None,
        stream,
        form: Form::Json,
        approvals: None,
        observer: None,
    };
    let outcome = pipeline::run(state, request, |finished, share| {
        Answer::json(&finished, share)
    })
    .await?;
    Ok(sse::respond(state, outcome))
}

/// `POST /v1/executions`: a background execution, answered `202` with its id at once.
pub(crate) async fn submit(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    req: Request,
) -> Result<Response, HttpError> {
    let request = pipeline::Request {
        caller: caller.0,
        request_id,
        work: Work::Execute(Input::Body(body_of(req))),
        received: None,
        stream: false,
        form: Form::Json,
        approvals: None,
        observer: None,
    };
    let meta = pipeline::submit(&state, request).await?;
    let mut response = (StatusCode::ACCEPTED, Json(meta.view())).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/executions/{}", meta.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// A background execution's state, and its result once it has one: the result is read
/// from the disk as it is sent, never held whole.
async fn background_view(
    state: &SharedServices,
    key: &Key,
    meta: Meta,
) -> Result<Response, HttpError> {
    let (st, m) = (state.clone(), meta.clone());
    let stored = tokio::task::spawn_blocking(move || st.background.stored(&m))
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_err(|e| match e.kind {
            // Deleted meanwhile.
            airlock_service::error::Kind::NotFound => execution::no_record(state, &meta.id),
            _ => e,
        })?;
    let Some(stored) = stored else {
        return Ok(Json(meta.view()).into_response());
    };
    // The view without its closing brace, the result, the brace.
    let mut head = serde_json::to_vec(&meta.view()).map_err(|e| Error::internal(e.to_string()))?;
    head.pop();
    head.extend_from_slice(b",\"result\":");
    let len = head.len() as u64 + stored.len + 1;
    let share = reserve_window(state, key)?;
    let source = Viewed {
        head: Some(Bytes::from(head)),
        stored: Some(stored),
        tail: Some(Bytes::from_static(b"}")),
    };
    let mut response = Unfolded::response(source, Viewed::next, Some(len), share);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// What a body read from the disk holds at once: a piece and the window.
fn reserve_window(state: &SharedServices, key: &Key) -> Result<Share, HttpError> {
    state
        .memory
        .reserve(key, background::CHUNK as u64 + WINDOW)
        .map_err(|over| HttpError(over_budget(over, "answers")))
}

/// The pieces of a background execution's view with its result.
struct Viewed {
    head: Option<Bytes>,
    stored: Option<Stored>,
    tail: Option<Bytes>,
}

impl Viewed {
    fn next(mut self) -> Step<Viewed> {
        Box::pin(async move {
            if let Some(head) = self.head.take() {
                return Some((head, self));
            }
            if let Some(stored) = self.stored.take() {
                if let Some((piece, rest)) = stored.next().await {
                    self.stored = Some(rest);
                    return Some((Bytes::from(piece), self));
                }
            }
            let tail = self.tail.take()?;
            Some((tail, self))
        })
    }
}

/// `GET /v1/executions/{id}/events`: a background execution's events as server-sent events,
/// from its start or after the event a `Last-Event-ID` names, following it while it runs.
pub(crate) async fn events(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let after = match headers.get("last-event-id") {
        None => 0,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Error::invalid(
                    "Last-Event-ID",
                    "not the id of one of this execution's events",
                )
            })?,
    };
    let (st, key, wanted) = (state.clone(), caller.0.clone(), id.clone());
    let tail = tokio::task::spawn_blocking(move || st.background.events(&key, &wanted, after))
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_err(|e| match e.kind {
            airlock_service::error::Kind::NotFound => not_here(&state, &id, "background execution"),
            _ => e,
        })?;
    let share = reserve_window(&state, &caller.0)?;
    // 0: no keep-alives, as for every stream.
    let quiet = match state.config.http.sse_keep_alive_ms {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    };
    let mut response = Unfolded::response((tail, quiet), followed, None, share);
    sse::event_stream_headers(&mut response);
    Ok(response)
}

/// The next piece of an events log followed: its bytes, a keep-alive comment while it is
/// quiet, nothing at its end.
fn followed((mut tail, quiet): (Tail, Option<Duration>)) -> Step<(Tail, Option<Duration>)> {
    Box::pin(async move {
        match tail.next(quiet).await {
            Ok(Next::Bytes(bytes)) => Some((Bytes::from(bytes), (tail, quiet))),
            Ok(Next::Silent) => Some((Bytes::from_static(sse::KEEP_ALIVE), (tail, quiet))),
            Ok(Next::End) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a background execution's events");
                None
            }
        }
    })
}

/// `DELETE /v1/executions/{id}`: cancels a background execution that is queued or running,
/// and removes it (its result and events) once it ended: `200` with its last state, or `202`
/// if it is still ending after a few seconds (it is removed when it ends).
pub(crate) async fn delete(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let meta = state
        .background
        .delete(&caller.0, &id, CANCEL_WAIT)
        .await
        .ok_or_else(|| not_here(&state, &id, "background execution"))?;
    let status = if meta.state.ended() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(meta.view())).into_response())
}

/// How long a `DELETE` waits for the execution it cancels to end.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
