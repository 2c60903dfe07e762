//! `list_tool_apis`: the Python API of the operator's tools that the caller's code may call
//! (served only where `[tools]` configures tool servers).

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::mcp::call::{Arguments, Call};
use crate::mcp::results::with_structured;
use airlock_service::error::Error;
use airlock_service::tools;

/// `list_tool_apis` takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ListToolApis {}

impl Arguments for ListToolApis {}

pub(super) async fn list_tool_apis(
    call: Call<'_>,
    ListToolApis {}: ListToolApis,
) -> Result<CallToolResult, Error> {
    let listing = tools::listing(call.state, &call.key);
    let text = if listing.tools.is_empty() {
        "No tools are granted to this caller: `import tools` fails.".to_owned()
    } else {
        listing.python.clone()
    };
    let result = CallToolResult::success(vec![ContentBlock::text(text)]);
    Ok(with_structured(result, &listing))
}
