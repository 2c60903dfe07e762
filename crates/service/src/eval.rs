//! The evaluation service: a Python literal expression, evaluated natively. No sandbox
//! process is involved: the evaluator parses and computes within its own budgets (`[eval]`),
//! a bounded number at once.

use airlock_api::{EvalError, EvalRequest, EvalResponse};

use crate::body::{parse_json, read_body, Body, ReadBody};
use crate::error::Error;
use crate::keys::Key;
use crate::services::SharedServices;

/// Evaluates the expression a request body holds (`POST /v1/eval`).
pub async fn from_body(
    state: &SharedServices,
    key: &Key,
    body: Body,
) -> Result<EvalResponse, Error> {
    if state.is_shutting_down() {
        return Err(Error::shutting_down());
    }
    let ReadBody { bytes, share } = read_body(state, key, body).await?;
    let st = state.clone();
    let response = evaluate_with(state, move || {
        let request: EvalRequest = parse_json(&st, &bytes)?;
        Ok(request.expression)
    })
    .await;
    drop(share);
    response
}

/// Evaluates `expression` within the `[eval]` budgets, waiting for a turn first.
pub async fn evaluate(state: &SharedServices, expression: String) -> Result<EvalResponse, Error> {
    let limits = state.config.eval.limits();
    if expression.len() > limits.max_input_bytes {
        // Refused at once, by its length: it need not wait for a turn, holding its bytes.
        return Ok(response(
            state,
            airlock_pyeval::evaluate(&expression, &limits),
        ));
    }
    evaluate_with(state, move || Ok(expression)).await
}

/// Waits for a turn, then takes the expression from `parse` and evaluates it, both off the
/// async workers (parsing a large body is CPU work too).
async fn evaluate_with(
    state: &SharedServices,
    parse: impl FnOnce() -> Result<String, Error> + Send + 'static,
) -> Result<EvalResponse, Error> {
    // A bounded number at once, each bounded in time: floods wait, they do not pile up CPU.
    state.metrics.evaluations_waiting.inc();
    let turn = state.eval_slots.acquire().await;
    state.metrics.evaluations_waiting.dec();
    let _turn = turn.map_err(|_| Error::shutting_down())?;
    let limits = state.config.eval.limits();
    let outcome = tokio::task::spawn_blocking(move || {
        Ok::<_, Error>(airlock_pyeval::evaluate(&parse()?, &limits))
    })
    .await
    .map_err(|e| Error::internal(format!("evaluating: {e}")))??;
    Ok(response(state, outcome))
}

/// The answer to an evaluation, counted in the metrics.
fn response(
    state: &SharedServices,
    outcome: Result<airlock_pyeval::Evaluated, airlock_pyeval::Error>,
) -> EvalResponse {
    match outcome {
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
    }
}
