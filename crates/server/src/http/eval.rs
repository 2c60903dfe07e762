//! `POST /v1/eval`: a Python literal expression, evaluated natively (no sandbox).

use airlock_api::EvalResponse;
use axum::extract::{Request, State};
use axum::{Extension, Json};

use crate::caller::Caller;
use crate::error::Error;
use crate::http::body::body_of;
use crate::service::eval;
use crate::SharedState;

pub(crate) async fn eval(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Json<EvalResponse>, Error> {
    eval::from_body(&state, &caller.0, body_of(req))
        .await
        .map(Json)
}
