//! Volumes over HTTP: `/v1/volumes` and below, over the volume service. Every route is the
//! caller's own volumes only (another key's are 404).

use crate::http::error::HttpError;
use airlock_engine::volumes::VolumeInfo;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::http::body::body_of;
use airlock_service::caller::Caller;
use airlock_service::volumes::{self, VolumeFiles, VolumeShown};
use airlock_service::SharedServices;

/// `POST /v1/volumes`.
pub(crate) async fn create(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Response, HttpError> {
    let info = volumes::create(&state, &caller.0, body_of(req)).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// `GET /v1/volumes`.
pub(crate) async fn list(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<serde_json::Value>, HttpError> {
    let list: Vec<VolumeInfo> = volumes::list(&state, &caller.0).await?;
    Ok(Json(serde_json::json!({ "volumes": list })))
}

/// `GET /v1/volumes/{name}`.
pub(crate) async fn get(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<VolumeShown>, HttpError> {
    volumes::get(&state, &caller.0, name)
        .await
        .map(Json)
        .map_err(HttpError)
}

/// `DELETE /v1/volumes/{name}`.
pub(crate) async fn delete(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<StatusCode, HttpError> {
    volumes::delete(&state, &caller.0, name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/volumes/{name}/files`.
pub(crate) async fn list_files(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<VolumeFiles>, HttpError> {
    volumes::files(&state, &caller.0, name)
        .await
        .map(Json)
        .map_err(HttpError)
}

/// `GET /v1/volumes/{name}/files/{*path}`.
pub(crate) async fn get_file(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path((name, path)): Path<(String, String)>,
) -> Result<Response, HttpError> {
    let data = volumes::read_file(&state, &caller.0, name, path).await?;
    let mut response = Response::new(Body::from(data));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// `PUT /v1/volumes/{name}/files/{*path}`.
pub(crate) async fn put_file(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path((name, path)): Path<(String, String)>,
    req: Request,
) -> Result<StatusCode, HttpError> {
    volumes::put_file(&state, &caller.0, name, path, body_of(req)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/volumes/{name}/files/{*path}`.
pub(crate) async fn delete_file(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path((name, path)): Path<(String, String)>,
) -> Result<StatusCode, HttpError> {
    volumes::remove_file(&state, &caller.0, name, path).await?;
    Ok(StatusCode::NO_CONTENT)
}
