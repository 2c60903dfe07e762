//! `GET /v1/tools`: the tools the calling key's code may call, with their Python signatures.

use crate::http::error::HttpError;
use axum::extract::State;
use axum::{Extension, Json};

use airlock_service::caller::Caller;
use airlock_service::tools;
use airlock_service::SharedServices;

pub(crate) async fn list(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<airlock_api::ToolsResponse>, HttpError> {
    Ok(Json(tools::listing(&state, &caller.0)))
}
