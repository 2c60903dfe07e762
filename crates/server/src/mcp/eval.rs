//! `eval_expression`: a literal expression evaluated natively, as `POST /v1/eval` does.

use airlock_api::EvalResponse;
use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::mcp::call::{Arguments, Call};
use airlock_service::error::Error;
use airlock_service::eval;
use airlock_service::execution::refuse_if_unavailable;

/// `eval_expression`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EvalExpression {
    /// A Python expression of literals and operators, e.g. `(1 + 2 + 3) * 2 ** 10`.
    expression: String,
}

impl Arguments for EvalExpression {}

pub(super) async fn eval_expression(
    call: Call<'_>,
    a: EvalExpression,
) -> Result<CallToolResult, Error> {
    refuse_if_unavailable(call.state)?;
    let r = eval::evaluate(call.state, a.expression).await?;
    // As for POST /v1/eval, the body counts until the evaluation is done.
    drop(call.received);
    Ok(eval_result(r))
}

fn eval_result(r: EvalResponse) -> CallToolResult {
    let structured = serde_json::to_value(&r).ok();
    let mut result = match (r.ok, r.error) {
        (true, _) => CallToolResult::success(vec![ContentBlock::text(format!(
            "{} (type: {})",
            r.repr.unwrap_or_default(),
            r.type_name.unwrap_or_default()
        ))]),
        (false, Some(e)) => {
            let limit = if e.limit {
                " (an evaluator limit, not a Python error)"
            } else {
                ""
            };
            CallToolResult::error(vec![ContentBlock::text(format!(
                "{}: {}{limit}",
                e.kind, e.message
            ))])
        }
        (false, None) => CallToolResult::error(vec![ContentBlock::text("evaluation failed")]),
    };
    result.structured_content = structured;
    result
}
