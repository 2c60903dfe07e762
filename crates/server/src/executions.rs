//! `POST /v1/execute` (JSON or a stream of events) and `GET /v1/executions/{id}`.

use std::sync::Arc;

use airlock_api::{ExecuteRequest, ExecutionRecord};
use airlock_engine::{Cancel, Job};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::{Extension, Json};

use crate::answer::Answer;
use crate::budget::Share;
use crate::config::Scope;
use crate::error::Error;
use crate::guard::{Caller, RequestId};
use crate::keys::Key;
use crate::pipeline::{
    audit_start, finish, job_from, parse_json, read_body, refuse_if_unavailable, rejection,
    require, reserve_answer, run_job, CancelOnDrop, Context, Form, ReadBody,
};
use crate::SharedState;

/// How long a record read may wait for the database.
const READ_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn store_unreadable(why: &str) -> Error {
    tracing::warn!(error = %why, "cannot read a record");
    Error::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("the record cannot be read now: {why}"),
    )
    .retry_after(1)
}

pub(crate) async fn execution(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ExecutionRecord>, Error> {
    require(&caller, Scope::Read)?;
    // Another key's execution is as absent as one that never was.
    // The PostgreSQL store may query the database.
    let (st, wanted) = (state.clone(), id.clone());
    let read = tokio::task::spawn_blocking(move || st.audit.get(&wanted));
    // A database that stops answering makes this a 503, not a request that never ends.
    let found = match tokio::time::timeout(READ_WAIT, read).await {
        Ok(Ok(Ok(found))) => found,
        Ok(Ok(Err(e))) => return Err(store_unreadable(&e.to_string())),
        Ok(Err(e)) => return Err(Error::internal(format!("reading a record: {e}"))),
        Err(_) => {
            let why = format!("PostgreSQL did not answer in {} s", READ_WAIT.as_secs());
            return Err(store_unreadable(&why));
        }
    };
    match found {
        Some(record) if record.key_fingerprint == caller.0.fingerprint() => Ok(Json(record)),
        // With a shared store every replica holds every record: a miss is just a miss.
        _ if state.config.store.url.is_some() => Err(Error::not_found()),
        _ => Err(crate::sessions::not_here(&state, &id, "execution")),
    }
}

pub(crate) async fn execute(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    req: Request<Body>,
) -> Result<Response, Error> {
    require(&caller, Scope::Execute)?;
    refuse_if_unavailable(&state)?;
    let streamed = crate::stream::wanted(req.headers());
    let entered = state.admission.enter(&caller.0).map_err(rejection)?;
    let ReadBody { bytes, share } = read_body(&state, &caller.0, req).await?;
    // Parsing and checking a large body is CPU work: not on the async workers.
    let (st, key) = (state.clone(), caller.0.clone());
    let job = tokio::task::spawn_blocking(move || {
        let request: ExecuteRequest = parse_json(&st, &bytes)?;
        job_from(&st, &key, request)
    })
    .await
    .map_err(|e| Error::internal(format!("preparing the request: {e}")))??;
    // The most its answer can hold, from now until it is written out.
    let answer = reserve_answer(&state, &caller.0, &job.limits, Form::Json)?;
    if streamed {
        let admitted = state.admission.admit(&caller.0).await.map_err(rejection)?;
        drop(share); // as in run_job
        refuse_if_unavailable(&state)?;
        let guards = (entered, admitted);
        return stream_execution(state, caller.0, request_id, job, guards, answer).await;
    }
    let response = run_job(
        &state,
        &caller.0,
        request_id,
        job,
        share,
        answer,
        |r, share| Answer::json(&r, share),
    )
    .await;
    drop(entered);
    response
}

/// `Accept: text/event-stream`: the audit line first (its failure is still a plain error
/// response), then a 200 whose body carries the output as it comes and the result last. The
/// guards travel with the execution, which a client that leaves or stops reading cancels.
pub(crate) async fn stream_execution<G: Send + 'static>(
    state: SharedState,
    key: Arc<Key>,
    request_id: String,
    mut job: Job,
    guards: G,
    answer: Share,
) -> Result<Response, Error> {
    let cancel = Cancel::default();
    let mut on_drop = CancelOnDrop(Some(cancel.clone()));
    let tracked = state.track(cancel.clone());
    job.cancel = Some(cancel.clone());
    job.stream = true; // line-buffered: print() reaches the client as it happens
    let st = state.clone();
    let (ctx, job) = tokio::task::spawn_blocking(move || {
        let ctx = Context::for_job(&st, &key, request_id, &job);
        audit_start(&st, &ctx, &job.limits).map(|()| (ctx, job))
    })
    .await
    .map_err(|e| Error::internal(format!("the execution task failed: {e}")))??;
    let (response, mut events) =
        crate::stream::channel(std::sync::Arc::new(move || cancel.cancel()), answer);
    on_drop.0 = None; // from here the stream's own sender cancels
    tokio::task::spawn_blocking(move || {
        let ran = state.engine.execute(job, &mut events);
        drop((guards, tracked));
        events.end(finish(&state, ctx, ran).map(|mut r| {
            crate::stream::without_output(&mut r.result);
            r
        }));
    });
    Ok(response)
}
