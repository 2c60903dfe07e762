//! `GET /v1/tools`: the tools the calling key's code may call, with their Python signatures.

use axum::extract::State;
use axum::{Extension, Json};

use crate::caller::Caller;
use crate::error::Error;
use crate::service::tools;
use crate::SharedState;

pub(crate) async fn list(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<airlock_api::ToolsResponse>, Error> {
    Ok(Json(tools::listing(&state, &caller.0)))
}
