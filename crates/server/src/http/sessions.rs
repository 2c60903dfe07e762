//! Sessions over HTTP: `/v1/sessions` and below, over the session service.

use crate::http::error::HttpError;
use airlock_api::{FileList, SessionInfo, SessionList};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::http::body::body_of;
use crate::http::executions;
use airlock_service::caller::{Caller, RequestId};
use airlock_service::pipeline::{self, Input, Work};
use airlock_service::sessions;
use airlock_service::SharedServices;

/// `POST /v1/sessions`.
pub(crate) async fn create(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    req: Request,
) -> Result<Response, HttpError> {
    let body = Input::Body(body_of(req));
    let info = pipeline::open_session(&state, &caller.0, &request_id, body, None).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// `GET /v1/sessions`.
pub(crate) async fn list(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<SessionList>, HttpError> {
    Ok(Json(sessions::list(&state, &caller.0)))
}

/// `GET /v1/sessions/{id}`.
pub(crate) async fn get(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, HttpError> {
    sessions::info(&state, &caller.0, &id)
        .map(Json)
        .map_err(HttpError)
}

/// `DELETE /v1/sessions/{id}`: the sandbox is destroyed at once, a running cell with it; the
/// answer comes when it is gone.
pub(crate) async fn delete(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, HttpError> {
    sessions::close(&state, &caller.0, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sessions/{id}/execute`: one cell.
pub(crate) async fn execute(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, HttpError> {
    executions::run(&state, caller, request_id, req, |body| Work::Cell {
        session: id,
        input: Input::Body(body),
    })
    .await
}

/// `PUT /v1/sessions/{id}/files/{*path}`: the body, as the file's contents.
pub(crate) async fn put_file(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
    req: Request,
) -> Result<StatusCode, HttpError> {
    airlock_service::snapshots::bring_back_if_paused(&state, &caller.0, &id).await?;
    sessions::put_file(&state, &caller.0, &id, path, body_of(req)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions/{id}/files/{*path}`: the file's contents.
pub(crate) async fn get_file(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, HttpError> {
    airlock_service::snapshots::bring_back_if_paused(&state, &caller.0, &id).await?;
    let data = sessions::read_file(&state, &caller.0, &id, path).await?;
    let mut response = Response::new(Body::from(data));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// `GET /v1/sessions/{id}/files`: everything below the working directory.
pub(crate) async fn list_files(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<FileList>, HttpError> {
    airlock_service::snapshots::bring_back_if_paused(&state, &caller.0, &id).await?;
    Ok(Json(sessions::files(&state, &caller.0, &id).await?))
}

/// `POST /v1/sessions/{id}/pause`.
pub(crate) async fn pause(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, HttpError> {
    airlock_service::snapshots::pause_session(&state, &caller.0, id)
        .await
        .map(Json)
        .map_err(HttpError)
}

/// `POST /v1/sessions/{id}/resume`.
pub(crate) async fn resume(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, HttpError> {
    airlock_service::snapshots::resume_session(&state, &caller.0, id)
        .await
        .map(Json)
        .map_err(HttpError)
}

/// `POST /v1/sessions/{id}/fork`.
pub(crate) async fn fork(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let info = airlock_service::snapshots::fork_session(&state, &caller.0, id).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}
