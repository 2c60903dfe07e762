//! `POST /v1/execute` (JSON or a stream of events) and `GET /v1/executions/{id}`, over the
//! execution service.

use airlock_api::ExecutionRecord;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::{Extension, Json};

use crate::answer::Form;
use crate::caller::{Caller, RequestId};
use crate::error::Error;
use crate::http::answer::Answer;
use crate::http::body::body_of;
use crate::http::sse;
use crate::service::execution;
use crate::service::pipeline::{self, Input, Work};
use crate::SharedState;

/// `GET /v1/executions/{id}`: the caller's own records only.
pub(crate) async fn execution(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ExecutionRecord>, Error> {
    execution::record(&state, &caller.0, &id).await.map(Json)
}

/// `POST /v1/execute`.
pub(crate) async fn execute(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    req: Request,
) -> Result<Response, Error> {
    run(&state, caller, request_id, req, |body| {
        Work::Execute(Input::Body(body))
    })
    .await
}

/// Runs the execution-like work whose arguments are `req`'s body through the pipeline: its
/// answer as JSON, or its events when the client asked for a stream (`POST /v1/execute`, a
/// session's cell).
pub(crate) async fn run(
    state: &SharedState,
    caller: Caller,
    request_id: String,
    req: Request,
    work: impl FnOnce(crate::service::body::Body) -> Work,
) -> Result<Response, Error> {
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
