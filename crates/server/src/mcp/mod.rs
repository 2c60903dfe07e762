//! MCP: airlock's tools for agents, over stdio (`airlock mcp`, mounted by `stdio.rs`) and
//! over streamable HTTP (`POST /mcp`, mounted by `http/mcp.rs`). One handler serves both; it
//! parses the arguments and hands them to the same services as the REST routes: executions
//! and cells go through the one pipeline (`airlock_service::pipeline`), so a tool call is checked,
//! limited and recorded exactly like the request it stands for.
//!
//! Over HTTP the caller is the key the guard authenticated (the route needs the `execute`
//! scope), and the message's arrival (its place in the key's queue, its body's memory) is
//! handed to the call ([`Handover`]); over stdio it is one local key with every scope, under
//! the engine's own ceilings, and each call takes its own place.
//! Sandbox verdicts (an exception, a timeout, a memory limit...) and refusals (a limit above
//! the ceiling, a busy session...) come back as tool results with `isError: true`, which the
//! model reads; an unknown tool or arguments that do not fit the schema are JSON-RPC errors.
//!
//! The tools are a table ([`tools`]: each tool once, with its name, schemas, description,
//! annotations and handler), from which `tools/list`, the dispatch of `tools/call` and
//! [`TOOL_NAMES`] are made. A call goes to its handler through [`call`] (its arguments read
//! and checked, its caller found); the handlers are grouped by what they serve
//! ([`executions`], [`sessions`], [`eval`], [`tool_apis`]), and answer in the forms of
//! [`results`]. The descriptions share the words of [`prose`]; a running call tells its host
//! of its progress ([`progress`]) and asks it for approvals ([`elicit`]).

mod call;
mod elicit;
mod eval;
mod executions;
mod progress;
mod prose;
mod results;
mod sessions;
mod tool_apis;
mod tools;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use crate::mcp::call::{caller, Incoming};
use crate::mcp::results::refusal;
use airlock_service::keys::Key;
use airlock_service::SharedServices;

pub(crate) use crate::mcp::call::Handover;
pub use crate::mcp::tools::{ToolName, TOOL_NAMES};

/// The tools, for one transport. Cheap to clone: the HTTP transport makes one per request.
#[derive(Clone, Debug)]
pub struct Tools {
    state: SharedServices,
    /// The caller over stdio; over HTTP each request carries its own (and this is [`None`]).
    local: Option<Arc<Key>>,
    /// Whether the host set a logging level that takes `info` (`logging/setLevel`, stdio
    /// only: a stateless POST has no session to remember it): then the output of each call
    /// is sent as log messages while it runs.
    logs: Arc<AtomicBool>,
}

const INSTRUCTIONS: &str = "airlock runs Python in a locked-down Linux sandbox and returns only \
data. Use run_python for a one-off computation (each call starts from nothing), \
eval_expression for plain arithmetic on literals (instant, no interpreter), and the session \
tools (create_session, run_in_session, list_session_files, read_session_file, close_session) \
when later code needs the variables, imports or files of earlier code. The sandbox has no \
network and cannot see the host's files; it has the standard library, plus numpy, pandas and \
matplotlib where the host installed them. Close sessions you no longer need.";

impl Tools {
    /// Tools for callers that the HTTP guard authenticated.
    pub fn for_http(state: SharedServices) -> Tools {
        Tools {
            state,
            local: None,
            logs: Arc::default(),
        }
    }

    /// Tools for the one local caller of `airlock mcp`.
    pub fn for_stdio(state: SharedServices, key: Arc<Key>) -> Tools {
        Tools {
            state,
            local: Some(key),
            logs: Arc::default(),
        }
    }
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder().enable_tools();
        // Log messages over stdio only: over stateless HTTP no level outlives its POST.
        #[allow(deprecated)] // MCP's logging (SEP-2577); hosts still read it.
        let capabilities = match self.local {
            Some(_) => capabilities.enable_logging().build(),
            None => capabilities.build(),
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let caller = caller(self.local.as_ref(), &context)
            .ok()
            .map(|(key, _)| key);
        Ok(ListToolsResult::with_all_items(tools::list(
            &self.state,
            caller.as_deref(),
        )))
    }

    /// Over stdio, a level of `debug` or `info` asks for the output of later calls as log
    /// messages; a higher one, for none (airlock sends nothing else as a log message).
    #[allow(deprecated)] // MCP's logging (SEP-2577); hosts still read it.
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        use rmcp::model::{LoggingLevel, SetLevelRequestMethod};
        if self.local.is_none() {
            return Err(ErrorData::method_not_found::<SetLevelRequestMethod>());
        }
        let wanted = matches!(request.level, LoggingLevel::Debug | LoggingLevel::Info);
        self.logs.store(wanted, Ordering::Relaxed);
        Ok(())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools::list(&self.state, None)
            .into_iter()
            .find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let incoming = Incoming {
            state: &self.state,
            local: self.local.as_ref(),
            logs: self.logs.load(Ordering::Relaxed),
            tool: &request.name,
            context: &context,
        };
        // rmcp runs each handler in a task of its own and only signals cancellation (a client
        // that sent notifications/cancelled, or left the HTTP request, or closed stdin):
        // dropping the call is what kills its sandbox, as for a REST client that goes away.
        let ct = context.ct.clone();
        let result = tokio::select! {
            result = tools::call(incoming, args) => result?,
            () = ct.cancelled() => {
                return Err(ErrorData::internal_error("the call was cancelled", None));
            }
        };
        Ok(result.unwrap_or_else(refusal).into())
    }
}
