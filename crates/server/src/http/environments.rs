//! Named environments over HTTP: listing them (any key that may execute), building and
//! deleting them (keys with the `admin` scope, as the route table says), over the
//! environment service.

use airlock_engine::environments::EnvironmentInfo;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::caller::Caller;
use crate::error::Error;
use crate::http::body::body_of;
use crate::service::environments;
use crate::SharedState;

/// `GET /v1/environments`.
pub(crate) async fn list(
    State(state): State<SharedState>,
) -> Result<Json<Vec<EnvironmentInfo>>, Error> {
    environments::list(&state).await.map(Json)
}

/// `GET /v1/environments/{name}`.
pub(crate) async fn get(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Json<EnvironmentInfo>, Error> {
    environments::get(&state, &name).map(Json)
}

/// `POST /v1/environments`: builds (or reuses) and names an environment; answers when done.
pub(crate) async fn create(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Response, Error> {
    let created = environments::create(&state, &caller.0, body_of(req)).await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// `DELETE /v1/environments/{name}`.
pub(crate) async fn delete(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    environments::delete(&state, name).await?;
    Ok(StatusCode::NO_CONTENT)
}
