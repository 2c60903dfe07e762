//! `GET /v1/approvals`, `GET /v1/approvals/{id}` and `POST /v1/approvals/{id}` (keys with
//! the `approve` scope, as the route table says), over the approvals service.

use crate::http::error::HttpError;
use airlock_api::{ApprovalDetail, ApprovalList, Decided};
use axum::extract::{Path, Request, State};
use axum::{Extension, Json};

use crate::http::body::body_of;
use airlock_service::approvals;
use airlock_service::caller::Caller;
use airlock_service::SharedServices;

/// `GET /v1/approvals`.
pub(crate) async fn list(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
) -> Json<ApprovalList> {
    Json(approvals::list(&state, &caller.0))
}

/// `GET /v1/approvals/{id}`.
pub(crate) async fn get(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ApprovalDetail>, HttpError> {
    approvals::get(&state, &caller.0, &id)
        .map(Json)
        .map_err(HttpError)
}

/// `POST /v1/approvals/{id}`.
pub(crate) async fn decide(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Json<Decided>, HttpError> {
    approvals::decide(&state, &caller.0, &id, body_of(req))
        .await
        .map(Json)
        .map_err(HttpError)
}
