//! `GET /v1/approvals`, `GET /v1/approvals/{id}` and `POST /v1/approvals/{id}` (keys with
//! the `approve` scope, as the route table says), over the approvals service.

use airlock_api::{ApprovalDetail, ApprovalList, Decided};
use axum::extract::{Path, Request, State};
use axum::{Extension, Json};

use crate::caller::Caller;
use crate::error::Error;
use crate::http::body::body_of;
use crate::service::approvals;
use crate::SharedState;

/// `GET /v1/approvals`.
pub(crate) async fn list(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
) -> Json<ApprovalList> {
    Json(approvals::list(&state, &caller.0))
}

/// `GET /v1/approvals/{id}`.
pub(crate) async fn get(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ApprovalDetail>, Error> {
    approvals::get(&state, &caller.0, &id).map(Json)
}

/// `POST /v1/approvals/{id}`.
pub(crate) async fn decide(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Json<Decided>, Error> {
    approvals::decide(&state, &caller.0, &id, body_of(req))
        .await
        .map(Json)
}
