//! MCP: airlock's tools for agents, over stdio (`airlock mcp`, mounted by `stdio.rs`) and
//! over streamable HTTP (`POST /mcp`, mounted by `http/mcp.rs`). One handler serves both; it
//! parses the arguments and hands them to the same services as the REST routes: executions
//! and cells go through the one pipeline (`service/pipeline.rs`), so a tool call is checked,
//! limited and recorded exactly like the request it stands for.
//!
//! Over HTTP the caller is the key the guard authenticated (the route needs the `execute`
//! scope), and the message's arrival (its place in the key's queue, its body's memory) is
//! handed to the call ([`Handover`]); over stdio it is one local key with every scope, under
//! the engine's own ceilings, and each call takes its own place.
//! Sandbox verdicts (an exception, a timeout, a memory limit...) and refusals (a limit above
//! the ceiling, a busy session...) come back as tool results with `isError: true`, which the
//! model reads; an unknown tool or arguments that do not fit the schema are JSON-RPC errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use airlock_api::{
    CellRequest, EvalResponse, ExecuteRequest, ExecutionResult, LimitsRequest, SessionRequest,
    Status,
};
use base64::Engine as _;
use opentelemetry::KeyValue;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use airlock_service::answer::{Form, Reserved};
use airlock_service::caller::{Caller, RequestId};
use airlock_service::error::Error;
use airlock_service::execution::refuse_if_unavailable;
use airlock_service::keys::{random_id, Key};
use airlock_service::pipeline::{self, Finished, Input, Received, Work};
use airlock_service::SharedServices;
use airlock_service::{approvals, eval, sessions, tools};

mod progress;

/// One of the tools: its name and title, and whether only a server with the operator's tools
/// (`[tools]`) serves it.
#[derive(Clone, Copy, Debug)]
pub struct ToolName {
    pub name: &'static str,
    pub title: &'static str,
    pub code_mode: bool,
}

/// Every tool, in the order `tools/list` gives them. Each tool takes its title from here, and
/// `airlock mcp --help` lists them from here, so the two name the same tools.
pub const TOOL_NAMES: [ToolName; 11] = [
    named("run_python", "Run Python 3 code"),
    named("eval_expression", "Evaluate a Python literal expression"),
    named("create_session", "Start a Python session"),
    named("run_in_session", "Run code in a session"),
    named("start_python", "Start Python 3 code in the background"),
    named("get_execution", "A background execution's state and result"),
    named("cancel_execution", "Cancel a background execution"),
    named("list_session_files", "List a session's files"),
    named("read_session_file", "Read a session's file"),
    named("close_session", "Close a session"),
    ToolName {
        code_mode: true,
        ..named("list_tool_apis", "List the tools code can call")
    },
];

const fn named(name: &'static str, title: &'static str) -> ToolName {
    ToolName {
        name,
        title,
        code_mode: false,
    }
}

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

/// `run_python`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunPython {
    /// The Python 3 source to run, as a script. The value of a final bare expression is
    /// returned as `result`.
    code: String,
    /// Wall-clock limit for this run, in seconds (default and maximum: see the description).
    #[schemars(range(min = 1))]
    timeout_seconds: Option<u64>,
    /// A named environment whose packages the code may import (the operator lists them).
    environment: Option<String>,
    /// Your volumes to mount (directories that outlive the call), each below /work or /tmp:
    /// `[{"name": "data", "path": "/work/data", "read_only": false}]`.
    #[serde(default)]
    volumes: Vec<airlock_api::VolumeMountRequest>,
}

/// `eval_expression`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct EvalExpression {
    /// A Python expression of literals and operators, e.g. `(1 + 2 + 3) * 2 ** 10`.
    expression: String,
}

/// `create_session`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateSession {
    /// A named environment for the session (the operator lists them).
    environment: Option<String>,
    /// Your volumes the session mounts while it lives, each below /work or /tmp.
    #[serde(default)]
    volumes: Vec<airlock_api::VolumeMountRequest>,
}

/// `run_in_session`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunInSession {
    /// The id `create_session` returned.
    session_id: String,
    /// Python 3 source, run in the session's interpreter like a notebook cell.
    code: String,
    /// Wall-clock limit for this cell, in seconds.
    #[schemars(range(min = 1))]
    timeout_seconds: Option<u64>,
}

/// `get_execution`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetExecution {
    /// The id `start_python` returned.
    id: String,
    /// Wait up to this many seconds (at most 60) for it to end before answering; 0 or absent:
    /// answer at once.
    #[schemars(range(max = 60))]
    wait_seconds: Option<u64>,
}

/// `cancel_execution`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecutionId {
    /// The id `start_python` returned.
    id: String,
}

/// What `start_python`, `get_execution` and `cancel_execution` say of a background execution.
#[derive(Debug, Serialize, JsonSchema)]
struct Background {
    /// What `get_execution` and `cancel_execution` take.
    id: String,
    state: airlock_service::background::State,
    /// RFC 3339.
    submitted_at: String,
    started_at: Option<String>,
    ended_at: Option<String>,
    /// Why it ended without a result (failed, cancelled, interrupted).
    error: Option<OutcomeError>,
    /// Once it ran: what `run_python` would have answered (the output is in the text),
    /// passed on as that call made it.
    #[schemars(with = "Option<Outcome>")]
    outcome: Option<serde_json::Value>,
}

/// Arguments naming a session only.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SessionId {
    /// The id `create_session` returned.
    session_id: String,
}

/// `list_tool_apis` takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListToolApis {}

/// `read_session_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadSessionFile {
    /// The id `create_session` returned.
    session_id: String,
    /// A path relative to the session's working directory, as `list_session_files` shows it.
    path: String,
}

/// What `run_python` and `run_in_session` give as structured content: the verdict, without
/// the output and the value, which the text blocks carry (as structured data they would be
/// held in memory once more, beyond what the call reserved for its answer).
#[derive(Debug, Serialize, JsonSchema)]
struct Outcome {
    /// The execution's id (`GET /v1/executions/{id}` has its record).
    id: String,
    status: Status,
    exit_code: Option<i32>,
    signal: Option<i32>,
    /// The exception's type and message, when one was raised (the traceback is in the text).
    error: Option<OutcomeError>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    limits_hit: Vec<airlock_api::LimitKind>,
    usage: airlock_api::Usage,
    /// Whether a final bare expression gave a value (shown in the text as `result: ...`).
    has_result: bool,
    /// Rich outputs (charts as images, `display()`), in the content blocks.
    outputs: usize,
    /// For a session's cell: whether it ended the session.
    #[serde(skip_serializing_if = "Option::is_none")]
    session_ended: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
struct OutcomeError {
    kind: String,
    message: String,
}

/// `read_session_file`'s structured content: what the content block holds.
#[derive(Debug, Serialize, JsonSchema)]
struct FileRead {
    path: String,
    bytes: u64,
    /// `text` (UTF-8), `image` (PNG) or `base64` (anything else).
    shown_as: String,
}

/// `create_session`'s structured content: the session as `GET /v1/sessions/{id}` gives it,
/// its id named `session_id`, as the text and every other session tool name it.
#[derive(Debug, Serialize, JsonSchema)]
struct CreatedSession {
    /// What `run_in_session`, `list_session_files`, `read_session_file` and `close_session`
    /// take.
    session_id: String,
    /// RFC 3339.
    created_at: String,
    /// When it will be closed at the latest, RFC 3339.
    expires_at: String,
    idle_timeout_ms: u64,
    max_lifetime_ms: u64,
    /// Cells run so far.
    cells: u64,
    /// `null` while it can run cells; else the status of the cell that ended it.
    ended: Option<Status>,
    limits: airlock_api::Limits,
}

impl From<airlock_api::SessionInfo> for CreatedSession {
    fn from(info: airlock_api::SessionInfo) -> Self {
        // A new session has had no time between cells: `egress_between_cells` is for
        // `GET /v1/sessions/{id}` later.
        let airlock_api::SessionInfo {
            id,
            created_at,
            expires_at,
            idle_timeout_ms,
            max_lifetime_ms,
            cells,
            ended,
            limits,
            egress_between_cells: _,
            paused: _,
            resumed: _,
        } = info;
        CreatedSession {
            session_id: id,
            created_at,
            expires_at,
            idle_timeout_ms,
            max_lifetime_ms,
            cells,
            ended,
            limits,
        }
    }
}

/// `close_session`'s structured content.
#[derive(Debug, Serialize, JsonSchema)]
struct Closed {
    session_id: String,
}

/// A call refused before or instead of running (a limit above the ceiling, no such session,
/// a busy one, too many requests): the same fields as the HTTP API's error.
#[derive(Debug, Serialize, JsonSchema)]
struct Refusal {
    refused: RefusalDetail,
}

#[derive(Debug, Serialize, JsonSchema)]
struct RefusalDetail {
    code: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
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

    /// What asks the host's user, by MCP elicitation, about each of the execution's tool
    /// calls that waits for an approval: only over stdio (the HTTP transport is stateless,
    /// with no way back to the client in the middle of a call) and only when the host said
    /// it takes form elicitations. None otherwise: the call waits for a key's decision over
    /// HTTP (`GET /v1/approvals`), and `airlock mcp`, which has none, refuses it at once.
    fn elicitation(&self, context: &RequestContext<RoleServer>) -> Option<airlock_tools::Watcher> {
        use rmcp::service::ElicitationMode;
        self.local.as_ref()?;
        let peer = context.peer.clone();
        if !peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
        {
            return None;
        }
        let wait = std::time::Duration::from_millis(self.state.config.tools.approval_timeout_ms);
        Some(Arc::new(move |approvals, approval| {
            let (peer, approvals, approval) = (peer.clone(), approvals.clone(), approval.clone());
            tokio::spawn(async move {
                use rmcp::model::{ClientResult, ElicitRequest, ServerRequest};
                // Gone from the table already (decided, withdrawn): nothing to ask.
                let Some(finished) = approvals.finished(&approval.id) else {
                    return;
                };
                let request = ServerRequest::ElicitRequest(ElicitRequest::new(elicit(&approval)));
                // Bounded by the approval's own time: past it the call failed as a timeout,
                // and a late answer decides nothing.
                let options = rmcp::service::PeerRequestOptions::with_timeout(wait);
                let handle = match peer.send_request_with_option(request, options).await {
                    Ok(handle) => handle,
                    Err(e) => {
                        tracing::warn!(approval = %approval.id, "the MCP host could not be asked: {e}");
                        return;
                    }
                };
                let id = handle.id.clone();
                tokio::select! {
                    answer = handle.await_response() => match answer {
                        Ok(ClientResult::ElicitResult(answer)) => {
                            let (decision, reason) = host_decision(&answer);
                            approvals::decide_for_host(&approvals, &approval.id, decision, reason);
                        }
                        Ok(_) => tracing::warn!(approval = %approval.id, "the MCP host answered an elicitation with something else"),
                        // The call waits on until it times out or its execution ends.
                        Err(e) => tracing::warn!(approval = %approval.id, "the MCP host did not answer an elicitation: {e}"),
                    },
                    // Decided over HTTP, withdrawn with its execution, or out of time: the
                    // host's dialog is closed, not left open to be answered for nothing.
                    () = finished.cancelled() => {
                        let _ = peer
                            .notify_cancelled(rmcp::model::CancelledNotificationParam::new(
                                Some(id),
                                Some("the call was decided, withdrawn or timed out".into()),
                            ))
                            .await;
                    }
                }
            });
        }))
    }

    /// The caller and a request id: the HTTP request's, or the local key's.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<(Arc<Key>, String), Error> {
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let (key, request_id) = match (parts, &self.local) {
            (Some(parts), None) => {
                // The guard put it there; without it the request was not authenticated.
                let key = parts
                    .extensions
                    .get::<Caller>()
                    .map(|c| c.0.clone())
                    .ok_or_else(|| Error::internal("an MCP request without a caller"))?;
                let id = parts.extensions.get::<RequestId>().map(|r| r.0.clone());
                (key, id.unwrap_or_else(|| random_id("rq_")))
            }
            (None, Some(key)) => (key.clone(), random_id("rq_")),
            _ => return Err(Error::internal("an MCP request from an unknown transport")),
        };
        Ok((key, request_id))
    }

    /// The tools, with `run_python` saying which of the operator's tools the caller's code
    /// may call (none when the caller is not known).
    fn tools(&self, caller: Option<&Key>) -> Vec<Tool> {
        let engine = self.state.engine.config();
        let d = &engine.defaults;
        let c = &engine.ceilings;
        let secs = |ms: u64| ms.div_ceil(1000);
        let limits = format!(
            "Limits: {} s of wall clock by default (timeout_seconds, at most {} s), {} MB of \
             memory, {} processes, {} MB of disk, {} bytes of output per stream (cut beyond).",
            secs(d.timeout_ms),
            // Whole seconds within the ceiling: what is advertised is accepted.
            (c.timeout_ms / 1000).max(1),
            d.memory_mb,
            d.pids,
            d.disk_mb,
            d.output_bytes
        );
        let egress = caller
            .map(|k| &k.config.egress)
            .filter(|e| !e.allows_nothing());
        let network = match egress {
            None => "no network".to_owned(),
            Some(policy) => {
                let mut allowed: Vec<String> = policy
                    .hosts
                    .iter()
                    .map(|h| format!("{}:{:?}", h.host, h.ports))
                    .collect();
                allowed.extend(
                    policy
                        .ranges
                        .iter()
                        .map(|r| format!("{}:{:?}", r.cidr, r.ports)),
                );
                format!(
                    "no network but HTTP and HTTPS through a proxy (HTTPS_PROXY is set; pip and \
                     requests use it) to {} only, with no DNS inside",
                    allowed.join(", ")
                )
            }
        };
        let environments: Vec<String> = self
            .state
            .environments
            .list()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.name)
            .collect();
        let environments = if environments.is_empty() {
            String::new()
        } else {
            format!(
                " Named environments with more packages (the environment argument): {}.",
                environments.join(", ")
            )
        };
        let volumes: Vec<String> = caller
            .and_then(|k| self.state.volumes.list(&k.fingerprint()).ok())
            .unwrap_or_default()
            .into_iter()
            .map(|v| format!("{} ({} MiB)", v.name, v.size_bytes >> 20))
            .collect();
        let volumes = if volumes.is_empty() {
            String::new()
        } else {
            format!(
                " Your volumes, directories that outlive every call (the volumes argument \
                 mounts them; one writer at a time): {}.",
                volumes.join(", ")
            )
        };
        let sandbox = format!(
            "It runs in a fresh Linux sandbox: {network}, none of the host's files, an \
             unprivileged user, a private writable working directory.{environments}{volumes}"
        );
        let verdicts = "The answer says the status (ok, error, timeout, memory_limit, \
                        cpu_limit, policy_violation, crashed), stdout, stderr, the value of a \
                        final bare expression (result) and any exception with its traceback; \
                        matplotlib figures (shown or left open) come back as PNG images. Any \
                        status but ok is marked as an error.";
        let session = format!(
            "A session is one sandboxed Python interpreter kept between calls: variables, \
             imports and files stay. It is closed after {} s unused or {} s in all, and when a \
             cell ends it by a limit. One call at a time per session.",
            secs(self.state.config.sessions.idle_timeout_ms),
            secs(self.state.config.sessions.max_lifetime_ms)
        );
        let code_mode = match (caller, &self.state.tools) {
            (Some(key), Some(registry)) => {
                let mut modules: Vec<String> = Vec::new();
                for api in registry.apis(&key.grants) {
                    let (server, function) = api.name.split_once('.').unwrap_or(("", ""));
                    match modules.last_mut() {
                        Some(m) if m.starts_with(&format!("tools.{server} ")) => {
                            m.insert_str(m.len() - 1, &format!(", {function}"));
                        }
                        _ => modules.push(format!("tools.{server} ({function})")),
                    }
                }
                if modules.is_empty() {
                    String::new()
                } else {
                    format!(
                        " The code can call the operator's tools through `import tools` \
                         (the credentials stay outside the sandbox): {}. Call list_tool_apis \
                         for their Python signatures before writing code; \
                         tools.search(\"words\") finds tools from the code; a failed call \
                         raises tools.ToolError.",
                        modules.join("; ")
                    )
                }
            }
            _ => String::new(),
        };
        let mut tools = vec![
            tool::<RunPython, Outcome>(
                "run_python",
                format!(
                    "Run Python 3 code and get back its output. {sandbox} Each call starts from \
                     nothing: nothing is kept between calls (use a session for that). \
                     {verdicts} {limits}{code_mode}"
                ),
                false,
            ),
            tool::<EvalExpression, EvalResponse>(
                "eval_expression",
                format!(
                    "Evaluate one Python expression made only of literals (numbers, strings, \
                     bytes, lists, tuples, dicts, sets, True/False/None) and operators \
                     (arithmetic, comparisons, boolean logic, indexing, slicing), with the \
                     answer CPython 3.11 gives. Names, function calls, attributes, lambdas and \
                     comprehensions are refused. Evaluated natively, without an interpreter: \
                     instant, and bounded ({} bytes of input, {} bits per integer, {} ms). \
                     Returns the value's repr and type, or the Python exception it raises.",
                    self.state.config.eval.max_input_bytes,
                    self.state.config.eval.max_int_bits,
                    self.state.config.eval.timeout_ms
                ),
                true,
            ),
            tool::<CreateSession, CreatedSession>(
                "create_session",
                format!(
                    "Start a Python session and return its session_id. {session} {sandbox} \
                     {limits}"
                ),
                false,
            ),
            tool::<RunInSession, Outcome>(
                "run_in_session",
                format!(
                    "Run Python 3 code in a session's interpreter, like a notebook cell: it \
                     sees the variables, imports and files earlier cells left. {verdicts} A \
                     timeout or memory limit ends the session (the answer says so)."
                ),
                false,
            ),
            tool::<RunPython, Background>(
                "start_python",
                format!(
                    "Start Python 3 code that may run long (training a model, a large join) \
                     and return at once with its id; it runs to its end whether or not you \
                     wait. Call get_execution with the id for its state and, once it ended, \
                     its output and result as run_python gives them. timeout_seconds may reach \
                     {} s here (default {} s). {sandbox} {verdicts}{code_mode}",
                    (self.state.config.background.max_timeout_ms / 1000).max(1),
                    secs(self.state.config.background.default_timeout_ms),
                ),
                false,
            ),
            tool::<GetExecution, Background>(
                "get_execution",
                "The state of an execution start_python started (queued, running, finished, \
                 failed, cancelled, interrupted) and, once it ran, its output and result. \
                 wait_seconds (up to 60) waits for it to end first."
                    .to_owned(),
                true,
            ),
            tool::<ExecutionId, Background>(
                "cancel_execution",
                "Cancel an execution start_python started, if it still runs, and remove it \
                 with its output: read what you need first."
                    .to_owned(),
                false,
            ),
            tool::<SessionId, airlock_api::FileList>(
                "list_session_files",
                "List the files and directories below a session's working directory, with \
                 their sizes."
                    .to_owned(),
                true,
            ),
            tool::<ReadSessionFile, FileRead>(
                "read_session_file",
                "Read one file of a session's working directory. Text (UTF-8) comes back as \
                 text, PNG as an image, anything else as base64."
                    .to_owned(),
                true,
            ),
            tool::<SessionId, Closed>(
                "close_session",
                "Close a session: its sandbox, variables and files are destroyed.".to_owned(),
                false,
            ),
        ];
        if self.state.tools.is_some() {
            tools.push(tool::<ListToolApis, airlock_api::ToolsResponse>(
                "list_tool_apis",
                "The Python API of the operator's tools that code run here may call \
                 (`import tools`, then tools.<server>.<function>(...)): each function's \
                 signature and docstring, as Python stubs. Read it before writing code that \
                 calls them."
                    .to_owned(),
                true,
            ));
        }
        tools
    }

    async fn call(
        &self,
        name: &str,
        args: JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<Result<CallToolResult, Error>, ErrorData> {
        // Arguments are checked before anything else: a call that does not fit the schema is
        // a protocol error whoever makes it. So is a call without a caller (never expected:
        // the route and the stdio server both give one).
        let call = match name {
            "run_python" => Call::RunPython(arguments(args)?),
            "eval_expression" => Call::Eval(arguments(args)?),
            "create_session" => {
                let CreateSession {
                    environment,
                    volumes,
                } = arguments(args)?;
                Call::CreateSession(environment, volumes)
            }
            "run_in_session" => Call::RunInSession(arguments(args)?),
            "start_python" => Call::StartPython(arguments(args)?),
            "get_execution" => {
                let a: GetExecution = arguments(args)?;
                if a.wait_seconds.is_some_and(|w| w > 60) {
                    return Err(ErrorData::invalid_params(
                        "invalid arguments: wait_seconds must be at most 60",
                        None,
                    ));
                }
                Call::GetExecution(a)
            }
            "cancel_execution" => Call::CancelExecution(arguments(args)?),
            "list_session_files" => Call::ListFiles(arguments(args)?),
            "read_session_file" => Call::ReadFile(arguments(args)?),
            "close_session" => Call::Close(arguments(args)?),
            "list_tool_apis" if self.state.tools.is_some() => {
                let ListToolApis {} = arguments(args)?;
                Call::ListToolApis
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool: {other}"),
                    None,
                ))
            }
        };
        if let Call::RunPython(RunPython {
            timeout_seconds, ..
        })
        | Call::StartPython(RunPython {
            timeout_seconds, ..
        })
        | Call::RunInSession(RunInSession {
            timeout_seconds, ..
        }) = &call
        {
            if *timeout_seconds == Some(0) {
                return Err(ErrorData::invalid_params(
                    "invalid arguments: timeout_seconds must be at least 1",
                    None,
                ));
            }
        }
        let (key, request_id) = self
            .caller(context)
            .map_err(|e| ErrorData::internal_error(e.message, None))?;
        let mut span = self.stdio_span(name, &request_id, context);
        let received = handed_over(context);
        let slot = answer_slot(context);
        let result = match call {
            Call::RunPython(a) => {
                self.told(context, |told| {
                    self.run_python(&key, request_id, received, slot, a, told)
                })
                .await
            }
            Call::Eval(a) => self.eval_expression(received, a).await,
            Call::CreateSession(environment, volumes) => {
                self.create_session(&key, &request_id, received, environment, volumes)
                    .await
            }
            Call::RunInSession(a) => {
                self.told(context, |told| {
                    self.run_in_session(&key, request_id, received, slot, a, told)
                })
                .await
            }
            Call::StartPython(a) => self.start_python(&key, request_id, received, a).await,
            Call::GetExecution(a) => self.get_execution(&key, slot, a).await,
            Call::CancelExecution(a) => self.cancel_execution(&key, a).await,
            Call::ListFiles(a) => self.list_session_files(&key, a).await,
            Call::ReadFile(a) => self.read_session_file(&key, a).await,
            Call::Close(a) => self.close_session(&key, a).await,
            Call::ListToolApis => {
                let listing = tools::listing(&self.state, &key);
                let text = if listing.tools.is_empty() {
                    "No tools are granted to this caller: `import tools` fails.".to_owned()
                } else {
                    listing.python.clone()
                };
                let result = CallToolResult::success(vec![ContentBlock::text(text)]);
                Ok(with_structured(result, &listing))
            }
        };
        if let Some(span) = &mut span {
            span.succeed();
            if let Err(e) = &result {
                span.fail(e.code);
            }
        }
        Ok(result)
    }

    /// Runs a call that runs code (`run_python`, `run_in_session`) with its host told what it
    /// asked for: progress and log messages from now until the answer, and approvals by
    /// elicitation.
    async fn told<F: std::future::Future>(
        &self,
        context: &RequestContext<RoleServer>,
        call: impl FnOnce(Told) -> F,
    ) -> F::Output {
        let every = std::time::Duration::from_millis(self.state.config.mcp.progress_interval_ms);
        let logs = self.logs.load(Ordering::Relaxed);
        let (output, reporter) = progress::watch(context, every, logs).unzip();
        let told = Told {
            approvals: self.elicitation(context),
            output,
        };
        let result = call(told).await;
        if let Some(reporter) = reporter {
            reporter.finish().await;
        }
        result
    }

    /// Over stdio, where no HTTP request carries one, the call's own span (a server span
    /// named `tools/call <tool>`), continuing the trace context the host put in the call's
    /// `_meta` (SEP-414); the pipeline finds it by `request_id`. Ends when dropped: failed
    /// if the call is dropped unanswered (cancelled).
    fn stdio_span(
        &self,
        tool: &str,
        request_id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Option<airlock_service::telemetry::Span> {
        if self.local.is_none() || !self.state.telemetry.enabled() {
            return None;
        }
        let meta = &context.meta;
        let mut span = self.state.telemetry.request(
            format!("tools/call {tool}"),
            request_id,
            (meta.get_traceparent(), meta.get_tracestate()),
            vec![
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
                KeyValue::new("airlock.request_id", request_id.to_owned()),
            ],
        )?;
        span.fail("cancelled");
        Some(span)
    }

    /// The request `run_python` and `start_python` make of their arguments.
    fn python_request(a: RunPython) -> ExecuteRequest {
        ExecuteRequest {
            code: a.code,
            language: Default::default(),
            stdin: String::new(),
            env: Default::default(),
            files: Vec::new(),
            limits: LimitsRequest {
                timeout_ms: a.timeout_seconds.map(|s| s.saturating_mul(1000)),
                ..Default::default()
            },
            entrypoint: None,
            inputs: None,
            egress: None,
            credentials: None,
            environment: a.environment,
            volumes: a.volumes,
        }
    }

    async fn start_python(
        &self,
        key: &Arc<Key>,
        request_id: String,
        received: Option<Received>,
        a: RunPython,
    ) -> Result<CallToolResult, Error> {
        let request = pipeline::Request {
            caller: key.clone(),
            request_id,
            work: Work::Execute(Input::Given(Self::python_request(a))),
            received,
            stream: false,
            // get_execution answers it whole in memory, as run_python would.
            form: Form::Mcp,
            approvals: None,
            observer: None,
        };
        let meta = pipeline::submit(&self.state, request).await?;
        let text = format!(
            "execution {} started in the background ({}). Call get_execution with this id \
             (wait_seconds up to 60) for its state, and its output once it ended.",
            meta.id,
            meta.state.as_str()
        );
        Ok(background_result(&meta, text, None))
    }

    /// A background execution's state; once it ran, its outcome as `run_python` gives it,
    /// read from the disk within the caller's memory budget.
    async fn get_execution(
        &self,
        key: &Arc<Key>,
        slot: Option<Reserved>,
        a: GetExecution,
    ) -> Result<CallToolResult, Error> {
        let wait = std::time::Duration::from_secs(a.wait_seconds.unwrap_or(0));
        let meta = self
            .state
            .background
            .wait_ended(key, &a.id, wait)
            .await
            .ok_or_else(|| {
                airlock_service::services::not_here(&self.state, &a.id, "background execution")
            })?;
        let head = match (&meta.error, meta.state) {
            (Some(e), s) => format!("execution {} is {}: {}", meta.id, s.as_str(), e.message),
            (None, s) => format!("execution {} is {}", meta.id, s.as_str()),
        };
        let (st, m, k) = (self.state.clone(), meta.clone(), key.clone());
        let stored = tokio::task::spawn_blocking(move || -> Result<_, Error> {
            if !m.has_result {
                return Ok(None);
            }
            // Whole in memory as text blocks and rmcp's JSON of them, as run_python's answer
            // is, and reserved as it is (its limits are the execution's).
            let bytes =
                airlock_service::answer::answer_bytes(st.engine.config(), &m.limits, Form::Mcp);
            let share = st
                .memory
                .reserve(&k, bytes)
                .map_err(|over| airlock_service::answer::over_budget(over, "answers"))?;
            Ok(st.background.result(&m)?.map(|result| (result, share)))
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
        let Some((result, share)) = stored else {
            return Ok(background_result(&meta, head, None));
        };
        let ran = execution_result(&meta.id, &result, None, "");
        drop(result);
        if let Some(slot) = &slot {
            slot.keep(share);
        }
        Ok(background_result(&meta, head, Some(ran)))
    }

    async fn cancel_execution(&self, key: &Key, a: ExecutionId) -> Result<CallToolResult, Error> {
        let meta = self
            .state
            .background
            .delete(key, &a.id, std::time::Duration::from_secs(10))
            .await
            .ok_or_else(|| {
                airlock_service::services::not_here(&self.state, &a.id, "background execution")
            })?;
        let text = format!(
            "execution {} is {}; its result and output are removed",
            meta.id,
            meta.state.as_str()
        );
        Ok(background_result(&meta, text, None))
    }

    async fn run_python(
        &self,
        key: &Arc<Key>,
        request_id: String,
        received: Option<Received>,
        slot: Option<Reserved>,
        a: RunPython,
        told: Told,
    ) -> Result<CallToolResult, Error> {
        let asked = Self::python_request(a);
        let request = pipeline::Request {
            caller: key.clone(),
            request_id,
            work: Work::Execute(Input::Given(asked)),
            received,
            stream: false,
            form: Form::Mcp,
            approvals: told.approvals,
            observer: told.output,
        };
        self.execute(request, slot).await
    }

    /// Runs an execution or a cell through the pipeline; its result is made (off the async
    /// workers) within the reservation, which is kept for the answer rmcp writes of it.
    async fn execute(
        &self,
        request: pipeline::Request,
        slot: Option<Reserved>,
    ) -> Result<CallToolResult, Error> {
        let present = move |finished: Finished, share| {
            let result = match &finished {
                Finished::Execution(r) => execution_result(&r.id, &r.result, None, ""),
                Finished::Cell(r) => {
                    let note = if r.session_ended {
                        "\nThe session has ended because of this cell; close it and create another."
                    } else {
                        ""
                    };
                    execution_result(&r.id, &r.result, Some(r.session_ended), note)
                }
            };
            drop(finished);
            // Over stdio there is no slot: rmcp writes the answer to stdout, and the
            // reservation ends with the call.
            if let Some(slot) = &slot {
                slot.keep(share);
            }
            result
        };
        match pipeline::run(&self.state, request, present).await? {
            pipeline::Outcome::Done(result) => Ok(result),
            pipeline::Outcome::Streamed(_) => Err(Error::internal("an MCP call is never streamed")),
        }
    }

    async fn eval_expression(
        &self,
        received: Option<Received>,
        a: EvalExpression,
    ) -> Result<CallToolResult, Error> {
        refuse_if_unavailable(&self.state)?;
        let r = eval::evaluate(&self.state, a.expression).await?;
        // As for POST /v1/eval, the body counts until the evaluation is done.
        drop(received);
        Ok(eval_result(r))
    }

    async fn create_session(
        &self,
        key: &Arc<Key>,
        request_id: &str,
        received: Option<Received>,
        environment: Option<String>,
        volumes: Vec<airlock_api::VolumeMountRequest>,
    ) -> Result<CallToolResult, Error> {
        let asked = SessionRequest {
            environment,
            volumes,
            ..SessionRequest::default()
        };
        let info =
            pipeline::open_session(&self.state, key, request_id, Input::Given(asked), received)
                .await?;
        let l = &info.limits;
        let result = CallToolResult::success(vec![ContentBlock::text(format!(
            "session_id: {}\nexpires_at: {}\nidle_timeout_seconds: {}\nper-cell limits: {} s \
             wall clock, {} bytes of output per stream; for the whole session: {} MB memory, \
             {} processes, {} MB disk",
            info.id,
            info.expires_at,
            info.idle_timeout_ms / 1000,
            l.timeout_ms.div_ceil(1000),
            l.output_bytes,
            l.memory_mb,
            l.pids,
            l.disk_mb
        ))]);
        Ok(with_structured(result, &CreatedSession::from(info)))
    }

    async fn run_in_session(
        &self,
        key: &Arc<Key>,
        request_id: String,
        received: Option<Received>,
        slot: Option<Reserved>,
        a: RunInSession,
        told: Told,
    ) -> Result<CallToolResult, Error> {
        let asked = CellRequest {
            code: a.code,
            entrypoint: None,
            inputs: None,
            timeout_ms: a.timeout_seconds.map(|s| s.saturating_mul(1000)),
        };
        let request = pipeline::Request {
            caller: key.clone(),
            request_id,
            work: Work::Cell {
                session: a.session_id,
                input: Input::Given(asked),
            },
            received,
            stream: false,
            form: Form::Mcp,
            approvals: told.approvals,
            observer: told.output,
        };
        self.execute(request, slot).await
    }

    async fn list_session_files(
        &self,
        key: &Arc<Key>,
        a: SessionId,
    ) -> Result<CallToolResult, Error> {
        airlock_service::snapshots::bring_back_if_paused(&self.state, key, &a.session_id).await?;
        let list = sessions::files(&self.state, key, &a.session_id).await?;
        let text = if list.files.is_empty() {
            "(no files)".to_owned()
        } else {
            list.files
                .iter()
                .map(|f| format!("{} ({}, {} bytes)", f.path, f.kind, f.size))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let result = CallToolResult::success(vec![ContentBlock::text(text)]);
        Ok(with_structured(result, &list))
    }

    async fn read_session_file(
        &self,
        key: &Arc<Key>,
        a: ReadSessionFile,
    ) -> Result<CallToolResult, Error> {
        let path = a.path.clone();
        airlock_service::snapshots::bring_back_if_paused(&self.state, key, &a.session_id).await?;
        let data = sessions::read_file(&self.state, key, &a.session_id, a.path).await?;
        let bytes = data.len() as u64;
        let (content, shown_as) = if data.starts_with(PNG_SIGNATURE) {
            let png = base64::engine::general_purpose::STANDARD.encode(&data);
            (ContentBlock::image(png, "image/png"), "image")
        } else {
            match String::from_utf8(data) {
                Ok(text) => (ContentBlock::text(text), "text"),
                Err(e) => (
                    ContentBlock::text(format!(
                        "(binary file, {} bytes, base64:)\n{}",
                        e.as_bytes().len(),
                        base64::engine::general_purpose::STANDARD.encode(e.as_bytes())
                    )),
                    "base64",
                ),
            }
        };
        let read = FileRead {
            path,
            bytes,
            shown_as: shown_as.to_owned(),
        };
        Ok(with_structured(
            CallToolResult::success(vec![content]),
            &read,
        ))
    }

    async fn close_session(&self, key: &Key, a: SessionId) -> Result<CallToolResult, Error> {
        sessions::close(&self.state, key, &a.session_id).await?;
        let result = CallToolResult::success(vec![ContentBlock::text(format!(
            "session {} closed",
            a.session_id
        ))]);
        Ok(with_structured(
            result,
            &Closed {
                session_id: a.session_id,
            },
        ))
    }
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// A background execution's tool result: its state in a text block, then `ran`'s blocks (the
/// outcome of one that ran), with both as structured content.
fn background_result(
    meta: &airlock_service::background::Meta,
    head: String,
    ran: Option<CallToolResult>,
) -> CallToolResult {
    let (mut content, outcome, is_error) = match ran {
        Some(ran) => (
            ran.content,
            ran.structured_content,
            ran.is_error.unwrap_or(false),
        ),
        None => (
            Vec::new(),
            None,
            matches!(
                meta.state,
                airlock_service::background::State::Failed
                    | airlock_service::background::State::Interrupted
            ),
        ),
    };
    content.insert(0, ContentBlock::text(head));
    let result = if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    let state = Background {
        id: meta.id.clone(),
        state: meta.state,
        submitted_at: meta.submitted_at.clone(),
        started_at: meta.started_at.clone(),
        ended_at: meta.ended_at.clone(),
        error: meta.error.as_ref().map(|e| OutcomeError {
            kind: e.code.clone(),
            message: e.message.clone(),
        }),
        outcome,
    };
    with_structured(result, &state)
}

/// What the host is told of while an execution or a cell runs: its tool calls that wait for
/// an approval (by elicitation), and its output (progress and log messages).
struct Told {
    approvals: Option<airlock_tools::Watcher>,
    output: Option<Box<dyn airlock_engine::OutputSink>>,
}

/// A tool call whose arguments fit the tool's schema.
enum Call {
    RunPython(RunPython),
    Eval(EvalExpression),
    CreateSession(Option<String>, Vec<airlock_api::VolumeMountRequest>),
    RunInSession(RunInSession),
    StartPython(RunPython),
    GetExecution(GetExecution),
    CancelExecution(ExecutionId),
    ListFiles(SessionId),
    ReadFile(ReadSessionFile),
    Close(SessionId),
    ListToolApis,
}

/// A message's arrival over HTTP (its place among the key's requests in flight, its body's
/// memory), handed by the route that took it in (`http/mcp.rs`) to the call it carries, which
/// holds it as a REST request would (the body's memory until the call is admitted to run).
/// What no call takes is let go once the message is answered.
#[derive(Clone)]
pub(crate) struct Handover(Arc<std::sync::Mutex<Option<Received>>>);

impl Handover {
    pub(crate) fn new(received: Received) -> Handover {
        Handover(Arc::new(std::sync::Mutex::new(Some(received))))
    }

    pub(crate) fn take(&self) -> Option<Received> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

fn handed_over(context: &RequestContext<RoleServer>) -> Option<Received> {
    let parts = context.extensions.get::<axum::http::request::Parts>()?;
    parts.extensions.get::<Handover>()?.take()
}

/// Where a call over HTTP leaves the reservation its answer holds: the route hands it on
/// with the response, which counts it until it is written (`http/answer.rs`).
fn answer_slot(context: &RequestContext<RoleServer>) -> Option<Reserved> {
    let parts = context.extensions.get::<axum::http::request::Parts>()?;
    parts.extensions.get::<Reserved>().cloned()
}

/// A type's JSON Schema as a plain object (hosts want no meta-schema line).
fn schema_of<T: JsonSchema>() -> JsonObject {
    match serde_json::to_value(schemars::schema_for!(T)) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.remove("$schema");
            map
        }
        _ => JsonObject::new(),
    }
}

/// A tool's output schema: its result `O`, or a [`Refusal`]. The definitions both use sit at
/// the root, where their `$ref`s point.
fn output_schema<O: JsonSchema>() -> JsonObject {
    let mut defs = JsonObject::new();
    let mut branch = |mut schema: JsonObject| {
        if let Some(serde_json::Value::Object(d)) = schema.remove("$defs") {
            defs.extend(d);
        }
        serde_json::Value::Object(schema)
    };
    let branches = vec![branch(schema_of::<O>()), branch(schema_of::<Refusal>())];
    let mut root = JsonObject::new();
    root.insert("type".into(), "object".into());
    root.insert("anyOf".into(), serde_json::Value::Array(branches));
    if !defs.is_empty() {
        root.insert("$defs".into(), serde_json::Value::Object(defs));
    }
    root
}

/// A tool's description, its JSON Schema made from its argument type `T`, and its output
/// schema from its structured result `O`.
/// The tool `name` of [`TOOL_NAMES`], titled there.
fn tool<T: JsonSchema, O: JsonSchema>(name: &'static str, description: String, read: bool) -> Tool {
    let title = TOOL_NAMES
        .iter()
        .find(|t| t.name == name)
        .map_or(name, |t| t.title);
    let mut tool = Tool::new(name, description, schema_of::<T>());
    tool.output_schema = Some(Arc::new(output_schema::<O>()));
    tool.title = Some(title.to_owned());
    // Nothing here reaches beyond the sandbox: a closed world.
    tool.annotations = Some(
        ToolAnnotations::with_title(title)
            .read_only(read)
            .destructive(name == "close_session" || name == "cancel_execution")
            .open_world(false),
    );
    tool
}

/// The arguments of a call, or a JSON-RPC "invalid params" error naming what is wrong.
fn arguments<T: DeserializeOwned>(args: JsonObject) -> Result<T, ErrorData> {
    serde_json::from_value(serde_json::Value::Object(args))
        .map_err(|e| ErrorData::invalid_params(format!("invalid arguments: {e}"), None))
}

/// A refusal (a limit above the ceiling, no such session, a busy session, too many requests)
/// as a result the model can read and act on.
fn refusal(e: Error) -> CallToolResult {
    let mut text = format!("{}: {}", e.code, e.message);
    if let Some(field) = &e.field {
        text.push_str(&format!(" [field: {field}]"));
    }
    if let Some(secs) = e.retry_after_secs {
        text.push_str(&format!(" [retry after {secs} s]"));
    }
    let structured = Refusal {
        refused: RefusalDetail {
            code: e.code.to_owned(),
            message: e.message,
            field: e.field,
            retry_after_seconds: e.retry_after_secs,
        },
    };
    with_structured(
        CallToolResult::error(vec![ContentBlock::text(text)]),
        &structured,
    )
}

/// `result` with `value` as its structured content (the tool's output schema describes it).
fn with_structured(mut result: CallToolResult, value: &impl Serialize) -> CallToolResult {
    result.structured_content = serde_json::to_value(value).ok();
    result
}

/// What a verdict means, for a reader who did not see the limits.
fn verdict(r: &ExecutionResult) -> String {
    let l = &r.limits;
    match r.status {
        Status::Ok => "ok".to_owned(),
        Status::Error => "error (the code raised an exception or exited non-zero)".to_owned(),
        Status::Timeout => format!(
            "timeout (killed at the wall-clock limit of {} ms)",
            l.timeout_ms
        ),
        Status::MemoryLimit => format!(
            "memory_limit (killed at the memory limit of {} MB)",
            l.memory_mb
        ),
        Status::CpuLimit => format!("cpu_limit (killed at the CPU limit of {} ms)", l.cpu_ms),
        Status::PolicyViolation => {
            "policy_violation (killed for a system call the sandbox forbids)".to_owned()
        }
        Status::Crashed => format!(
            "crashed (killed by signal {})",
            r.signal.map_or_else(|| "?".to_owned(), |s| s.to_string())
        ),
        Status::InternalError => "internal_error (airlock itself failed)".to_owned(),
    }
}

/// An execution's result for the model: the status first, then each part in a text block of
/// its own (what the code printed cannot pass for the status or another part), charts as
/// images; an error unless `ok`.
fn execution_result(
    id: &str,
    r: &ExecutionResult,
    session_ended: Option<bool>,
    note: &str,
) -> CallToolResult {
    let mut status = format!("status: {}", verdict(r));
    if let Some(code) = r.exit_code.filter(|c| *c != 0) {
        status.push_str(&format!("\nexit_code: {code}"));
    }
    status.push_str(note);
    let mut content = vec![ContentBlock::text(status)];
    for (name, s, cut) in [
        ("stdout", &r.stdout, r.stdout_truncated),
        ("stderr", &r.stderr, r.stderr_truncated),
    ] {
        if !s.is_empty() || cut {
            let cut = if cut {
                format!("\n[{name} cut at the output limit]")
            } else {
                String::new()
            };
            content.push(ContentBlock::text(format!("{name}:\n{s}{cut}")));
        }
    }
    // None, as a final print() gives, is no result to show (as in Python's REPL).
    if let Some(value) = r.result.as_ref().filter(|v| !v.is_null()) {
        content.push(ContentBlock::text(format!(
            "result: {}",
            airlock_api::value_text(value)
        )));
    }
    if let Some(e) = &r.error {
        let mut text = format!("error: {}: {}", e.kind, e.message);
        if let Some(tb) = &e.traceback {
            text.push_str(&format!("\ntraceback:\n{tb}"));
        }
        content.push(ContentBlock::text(text));
    }
    let mut images = Vec::new();
    for o in &r.outputs {
        match (o.mime.as_str(), &o.data) {
            ("image/png", serde_json::Value::String(b64)) => {
                images.push(ContentBlock::image(b64.clone(), "image/png"));
            }
            (mime, serde_json::Value::String(s)) => {
                content.push(ContentBlock::text(format!("display ({mime}):\n{s}")));
            }
            (mime, value) => content.push(ContentBlock::text(format!("display ({mime}): {value}"))),
        }
    }
    for f in &r.files {
        let why = f.skipped.as_deref().unwrap_or("returned");
        content.push(ContentBlock::text(format!(
            "output file: {} ({} bytes, {why})",
            f.path, f.size
        )));
    }
    content.extend(images);
    let outcome = Outcome {
        id: id.to_owned(),
        status: r.status,
        exit_code: r.exit_code,
        signal: r.signal,
        error: r.error.as_ref().map(|e| OutcomeError {
            kind: e.kind.clone(),
            message: e.message.clone(),
        }),
        stdout_truncated: r.stdout_truncated,
        stderr_truncated: r.stderr_truncated,
        limits_hit: r.limits_hit.clone(),
        usage: r.usage.clone(),
        has_result: r.result.as_ref().is_some_and(|v| !v.is_null()),
        outputs: r.outputs.len(),
        session_ended,
    };
    let result = if r.status == Status::Ok {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    };
    with_structured(result, &outcome)
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
        let caller = self.caller(&context).ok().map(|(key, _)| key);
        Ok(ListToolsResult::with_all_items(
            self.tools(caller.as_deref()),
        ))
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
        self.tools(None).into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        // rmcp runs each handler in a task of its own and only signals cancellation (a client
        // that sent notifications/cancelled, or left the HTTP request, or closed stdin):
        // dropping the call is what kills its sandbox, as for a REST client that goes away.
        let ct = context.ct.clone();
        let result = tokio::select! {
            result = self.call(&request.name, args, &context) => result?,
            () = ct.cancelled() => {
                return Err(ErrorData::internal_error("the call was cancelled", None));
            }
        };
        Ok(result.unwrap_or_else(refusal).into())
    }
}

/// The elicitation that asks the host's user whether one waiting call may run: what the
/// code asks, the arguments as every approver is shown them (bounded, every key, escaped),
/// and a form of one required yes/no and an optional reason.
fn elicit(approval: &airlock_api::Approval) -> rmcp::model::ElicitRequestParams {
    use airlock_api::Shown;
    use rmcp::model::{ElicitRequestParams, ElicitationSchema};
    let (bytes, sha256) = (approval.arguments_bytes, &approval.arguments_sha256);
    let arguments = match approval.arguments_shown {
        Shown::Whole => format!("the arguments {}", approval.arguments_preview),
        Shown::Cut => format!(
            "the arguments {} (long strings cut; {bytes} bytes in all, SHA-256 {sha256})",
            approval.arguments_preview
        ),
        // The preview names an HTTP route, which `airlock mcp` does not serve.
        Shown::TooLarge => format!(
            "arguments too large to show here ({bytes} bytes, SHA-256 {sha256}): their keys \
             and short values alone are over what is shown"
        ),
    };
    let line = approval
        .line
        .map(|l| format!(" (at line {l} of its code, as the sandbox says)"))
        .unwrap_or_default();
    // What the code chose is escaped already; the tool's name is the tool server's.
    let message = airlock_tools::printable(&format!(
        "The sandboxed code of execution {} wants to call the tool `{}.{}`{line} with \
         {arguments}. Approve this one call?",
        approval.execution_id, approval.server, approval.tool
    ));
    let schema = ElicitationSchema::builder()
        .required_bool("approve")
        .optional_string("reason")
        .build()
        .unwrap_or_else(|_| ElicitationSchema::new(Default::default()));
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    }
}

/// What the host's answer decides: approved only when its user accepted the form with
/// `approve` true; declined, cancelled or anything else is a denial.
fn host_decision(answer: &rmcp::model::ElicitResult) -> (airlock_api::Decision, Option<String>) {
    use rmcp::model::ElicitationAction;
    let content = answer.content.as_ref();
    let reason = content
        .and_then(|c| c.get("reason"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    let approved = answer.action == ElicitationAction::Accept
        && content.and_then(|c| c.get("approve")) == Some(&serde_json::Value::Bool(true));
    match (approved, &answer.action) {
        (true, _) => (airlock_api::Decision::Approve, reason),
        (false, ElicitationAction::Accept) => (airlock_api::Decision::Deny, reason),
        (false, ElicitationAction::Decline) => (
            airlock_api::Decision::Deny,
            reason.or(Some("the MCP host's user declined".into())),
        ),
        (false, _) => (
            airlock_api::Decision::Deny,
            reason.or(Some("the MCP host's user cancelled".into())),
        ),
    }
}

#[cfg(test)]
mod tests {
    use airlock_api::{Approval, Shown};

    fn message(preview: &str, shown: Shown) -> String {
        let approval = Approval {
            id: "ap_x".into(),
            execution_id: "ex_x".into(),
            key: "agent".into(),
            server: "crm".into(),
            tool: "send\u{202e}".into(),
            arguments: None,
            arguments_preview: preview.into(),
            arguments_shown: shown,
            arguments_escaped: true,
            arguments_bytes: 70000,
            arguments_sha256: "ab".into(),
            line: Some(3),
            requested_at: String::new(),
            expires_at: String::new(),
        };
        match super::elicit(&approval) {
            rmcp::model::ElicitRequestParams::FormElicitationParams { message, .. } => message,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_dialog_shows_the_preview_every_approver_is_shown_and_nothing_raw() {
        let m = message(r#"{"to":"bob\u{202e}"}"#, Shown::Whole);
        assert!(m.contains(r#"`crm.send\u{202e}` (at line 3"#), "{m}");
        assert!(
            m.contains(r#"with the arguments {"to":"bob\u{202e}"}. Approve"#),
            "{m}"
        );
        let m = message(r#"{"a":"xx"...(9 more bytes)}"#, Shown::Cut);
        assert!(
            m.contains("long strings cut; 70000 bytes in all, SHA-256 ab"),
            "{m}"
        );
        // The preview's sentence names an HTTP route `airlock mcp` does not serve.
        let m = message("(not shown: ... GET /v1/approvals/ap_x)", Shown::TooLarge);
        assert!(
            m.contains("too large to show here (70000 bytes") && !m.contains("GET"),
            "{m}"
        );
    }
}
