//! `POST /v1/eval`: a Python literal expression, evaluated natively. No sandbox process is
//! involved: the evaluator parses and computes within its own budgets (`[eval]`).

use airlock_api::{EvalError, EvalRequest, EvalResponse};
use axum::extract::{Request, State};
use axum::{Extension, Json};

use crate::config::Scope;
use crate::error::Error;
use crate::guard::Caller;
use crate::routes::{parse_json, read_body, require, ReadBody};
use crate::SharedState;

pub(crate) async fn eval(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Json<EvalResponse>, Error> {
    require(&caller, Scope::Execute)?;
    if state.is_shutting_down() {
        return Err(crate::routes::shutting_down());
    }
    let ReadBody { bytes, share } = read_body(&state, &caller.0, req).await?;
    // A bounded number at once, each bounded in time: floods wait, they do not pile up CPU.
    state.metrics.evaluations_waiting.inc();
    let turn = state.eval_slots.acquire().await;
    state.metrics.evaluations_waiting.dec();
    let _turn = turn.map_err(|_| crate::routes::shutting_down())?;
    let st = state.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let request: EvalRequest = parse_json(&st, &bytes)?;
        Ok::<_, Error>(airlock_pyeval::evaluate(
            &request.expression,
            &st.config.eval.limits(),
        ))
    })
    .await
    .map_err(|e| Error::internal(format!("evaluating: {e}")))??;
    drop(share);
    let response = match outcome {
        Ok(v) => {
            state.metrics.evaluations.add(&["ok"]);
            EvalResponse {
                ok: true,
                type_name: Some(v.type_name.to_string()),
                repr: Some(v.repr),
                str: Some(v.str),
                value: v.value,
                error: None,
            }
        }
        Err(e) => {
            state.metrics.evaluations.add(&[e.kind.as_str()]);
            EvalResponse {
                ok: false,
                type_name: None,
                repr: None,
                str: None,
                value: None,
                error: Some(EvalError {
                    kind: e.kind.as_str().to_string(),
                    message: e.message,
                    limit: e.limit,
                }),
            }
        }
    };
    Ok(Json(response))
}
