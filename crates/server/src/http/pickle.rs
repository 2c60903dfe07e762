//! `POST /v1/pickle/scan`: the body is the file itself, any content type.

use crate::http::error::HttpError;
use axum::extract::{Request, State};
use axum::{Extension, Json};

use crate::http::body::body_of;
use airlock_service::caller::Caller;
use airlock_service::pickle;
use airlock_service::SharedServices;

pub(crate) async fn scan(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Json<serde_json::Value>, HttpError> {
    pickle::from_body(&state, &caller.0, body_of(req))
        .await
        .map(Json)
        .map_err(HttpError)
}
