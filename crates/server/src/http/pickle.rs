//! `POST /v1/pickle/scan`: the body is the file itself, any content type.

use axum::extract::{Request, State};
use axum::{Extension, Json};

use crate::caller::Caller;
use crate::error::Error;
use crate::http::body::body_of;
use crate::service::pickle;
use crate::SharedState;

pub(crate) async fn scan(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Json<serde_json::Value>, Error> {
    pickle::from_body(&state, &caller.0, body_of(req))
        .await
        .map(Json)
}
