//! Named environments over HTTP: listing them (any key that may execute), building and
//! deleting them (keys with the `admin` scope, as the route table says), over the
//! environment service.

use crate::http::error::HttpError;
use airlock_engine::environments::EnvironmentInfo;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::http::body::body_of;
use airlock_service::caller::Caller;
use airlock_service::environments;
use airlock_service::SharedServices;

/// `GET /v1/environments`.
pub(crate) async fn list(
    State(state): State<SharedServices>,
) -> Result<Json<Vec<EnvironmentInfo>>, HttpError> {
    environments::list(&state)
        .await
        .map(Json)
        .map_err(HttpError)
}

/// `GET /v1/environments/{name}`.
pub(crate) async fn get(
    State(state): State<SharedServices>,
    Path(name): Path<String>,
) -> Result<Json<EnvironmentInfo>, HttpError> {
    environments::get(&state, &name)
        .map(Json)
        .map_err(HttpError)
}

/// `POST /v1/environments`: builds (or reuses) and names an environment; answers when done.
pub(crate) async fn create(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Response, HttpError> {
    let created = environments::create(&state, &caller.0, body_of(req)).await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// `DELETE /v1/environments/{name}`.
pub(crate) async fn delete(
    State(state): State<SharedServices>,
    Path(name): Path<String>,
) -> Result<StatusCode, HttpError> {
    environments::delete(&state, name).await?;
    Ok(StatusCode::NO_CONTENT)
}
