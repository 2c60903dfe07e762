//! `POST /v1/eval`: a Python literal expression, evaluated natively (no sandbox).

use crate::http::error::HttpError;
use airlock_api::EvalResponse;
use axum::extract::{Request, State};
use axum::{Extension, Json};

use crate::http::body::body_of;
use airlock_service::caller::Caller;
use airlock_service::eval;
use airlock_service::SharedServices;

pub(crate) async fn eval(
    State(state): State<SharedServices>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Json<EvalResponse>, HttpError> {
    eval::from_body(&state, &caller.0, body_of(req))
        .await
        .map(Json)
        .map_err(HttpError)
}
