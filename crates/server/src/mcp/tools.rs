//! The tool table: every tool once ([`TABLE`]), with its name and title, its arguments' and
//! its result's schemas, its description, its annotations, whether only a server with the
//! operator's tools serves it, and its handler. `tools/list` ([`list`]), the dispatch of
//! `tools/call` ([`call`]) and [`TOOL_NAMES`], which `airlock mcp --help` lists, are all
//! made from it.

use std::sync::Arc;

use airlock_api::EvalResponse;
use rmcp::model::{JsonObject, ToolAnnotations};
use rmcp::ErrorData;
use schemars::JsonSchema;

use crate::mcp::call::{Answer, Incoming, Running};
use crate::mcp::eval::{self, EvalExpression};
use crate::mcp::executions::{self, Background, ExecutionId, GetExecution, RunPython};
use crate::mcp::prose::{secs, Prose};
use crate::mcp::results::{Outcome, Refusal};
use crate::mcp::sessions::{
    self, Closed, CreateSession, CreatedSession, FileRead, ReadSessionFile, RunInSession, SessionId,
};
use crate::mcp::tool_apis::{self, ListToolApis};
use airlock_service::keys::Key;
use airlock_service::Services;

/// One tool.
pub(super) struct Tool {
    name: &'static str,
    title: &'static str,
    /// Whether only a server with the operator's tools (`[tools]`) serves it.
    code_mode: bool,
    /// What it does to what it names, as its annotations tell the host.
    effect: Effect,
    /// Its arguments' JSON Schema (`inputSchema`), of the type its handler reads them as.
    input: fn() -> JsonObject,
    /// Its structured result's JSON Schema, or a refusal's (`outputSchema`).
    output: fn() -> JsonObject,
    /// What the model is told of it, in its own words around the shared ones.
    description: fn(&Prose) -> String,
    /// Reads its arguments and runs it ([`Incoming::run`] with the tool's handler).
    handler: for<'a> fn(Incoming<'a>, JsonObject) -> Running<'a>,
}

/// What a tool does to what it names (MCP's `readOnlyHint` and `destructiveHint`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// It only reads.
    Reads,
    /// It runs code or makes something, and destroys nothing.
    Changes,
    /// It destroys what it names.
    Destroys,
}

/// Every tool, in the order `tools/list` gives them.
pub(super) const TABLE: &[Tool] = &[
    Tool {
        name: "run_python",
        title: "Run Python 3 code",
        code_mode: false,
        effect: Effect::Changes,
        input: schema_of::<RunPython>,
        output: output_schema::<Outcome>,
        description: |p| {
            format!(
                "Run Python 3 code and get back its output. {sandbox} Each call starts from \
                 nothing: nothing is kept between calls (use a session for that). \
                 {verdicts} {limits}{code_mode}",
                sandbox = p.sandbox,
                verdicts = p.verdicts,
                limits = p.limits,
                code_mode = p.code_mode,
            )
        },
        handler: |call, args| call.run(args, executions::run_python),
    },
    Tool {
        name: "eval_expression",
        title: "Evaluate a Python literal expression",
        code_mode: false,
        effect: Effect::Reads,
        input: schema_of::<EvalExpression>,
        output: output_schema::<EvalResponse>,
        description: |p| {
            format!(
                "Evaluate one Python expression made only of literals (numbers, strings, \
                 bytes, lists, tuples, dicts, sets, True/False/None) and operators \
                 (arithmetic, comparisons, boolean logic, indexing, slicing), with the \
                 answer CPython 3.11 gives. Names, function calls, attributes, lambdas and \
                 comprehensions are refused. Evaluated natively, without an interpreter: \
                 instant, and bounded ({} bytes of input, {} bits per integer, {} ms). \
                 Returns the value's repr and type, or the Python exception it raises.",
                p.config.eval.max_input_bytes, p.config.eval.max_int_bits, p.config.eval.timeout_ms
            )
        },
        handler: |call, args| call.run(args, eval::eval_expression),
    },
    Tool {
        name: "create_session",
        title: "Start a Python session",
        code_mode: false,
        effect: Effect::Changes,
        input: schema_of::<CreateSession>,
        output: output_schema::<CreatedSession>,
        description: |p| {
            format!(
                "Start a Python session and return its session_id. {session} {sandbox} \
                 {limits}",
                session = p.session,
                sandbox = p.sandbox,
                limits = p.limits,
            )
        },
        handler: |call, args| call.run(args, sessions::create_session),
    },
    Tool {
        name: "run_in_session",
        title: "Run code in a session",
        code_mode: false,
        effect: Effect::Changes,
        input: schema_of::<RunInSession>,
        output: output_schema::<Outcome>,
        description: |p| {
            format!(
                "Run Python 3 code in a session's interpreter, like a notebook cell: it \
                 sees the variables, imports and files earlier cells left. {verdicts} A \
                 timeout or memory limit ends the session (the answer says so).",
                verdicts = p.verdicts,
            )
        },
        handler: |call, args| call.run(args, sessions::run_in_session),
    },
    Tool {
        name: "start_python",
        title: "Start Python 3 code in the background",
        code_mode: false,
        effect: Effect::Changes,
        input: schema_of::<RunPython>,
        output: output_schema::<Background>,
        description: |p| {
            format!(
                "Start Python 3 code that may run long (training a model, a large join) \
                 and return at once with its id; it runs to its end whether or not you \
                 wait. Call get_execution with the id for its state and, once it ended, \
                 its output and result as run_python gives them. timeout_seconds may reach \
                 {} s here (default {} s). {sandbox} {verdicts}{code_mode}",
                (p.config.background.max_timeout_ms / 1000).max(1),
                secs(p.config.background.default_timeout_ms),
                sandbox = p.sandbox,
                verdicts = p.verdicts,
                code_mode = p.code_mode,
            )
        },
        handler: |call, args| call.run(args, executions::start_python),
    },
    Tool {
        name: "get_execution",
        title: "A background execution's state and result",
        code_mode: false,
        effect: Effect::Reads,
        input: schema_of::<GetExecution>,
        output: output_schema::<Background>,
        description: |_| {
            "The state of an execution start_python started (queued, running, finished, \
             failed, cancelled, interrupted) and, once it ran, its output and result. \
             wait_seconds (up to 60) waits for it to end first."
                .to_owned()
        },
        handler: |call, args| call.run(args, executions::get_execution),
    },
    Tool {
        name: "cancel_execution",
        title: "Cancel a background execution",
        code_mode: false,
        effect: Effect::Destroys,
        input: schema_of::<ExecutionId>,
        output: output_schema::<Background>,
        description: |_| {
            "Cancel an execution start_python started, if it still runs, and remove it \
             with its output: read what you need first."
                .to_owned()
        },
        handler: |call, args| call.run(args, executions::cancel_execution),
    },
    Tool {
        name: "list_session_files",
        title: "List a session's files",
        code_mode: false,
        effect: Effect::Reads,
        input: schema_of::<SessionId>,
        output: output_schema::<airlock_api::FileList>,
        description: |_| {
            "List the files and directories below a session's working directory, with \
             their sizes."
                .to_owned()
        },
        handler: |call, args| call.run(args, sessions::list_session_files),
    },
    Tool {
        name: "read_session_file",
        title: "Read a session's file",
        code_mode: false,
        effect: Effect::Reads,
        input: schema_of::<ReadSessionFile>,
        output: output_schema::<FileRead>,
        description: |_| {
            "Read one file of a session's working directory. Text (UTF-8) comes back as \
             text, PNG as an image, anything else as base64."
                .to_owned()
        },
        handler: |call, args| call.run(args, sessions::read_session_file),
    },
    Tool {
        name: "close_session",
        title: "Close a session",
        code_mode: false,
        effect: Effect::Destroys,
        input: schema_of::<SessionId>,
        output: output_schema::<Closed>,
        description: |_| {
            "Close a session: its sandbox, variables and files are destroyed.".to_owned()
        },
        handler: |call, args| call.run(args, sessions::close_session),
    },
    Tool {
        name: "list_tool_apis",
        title: "List the tools code can call",
        code_mode: true,
        effect: Effect::Reads,
        input: schema_of::<ListToolApis>,
        output: output_schema::<airlock_api::ToolsResponse>,
        description: |_| {
            "The Python API of the operator's tools that code run here may call \
             (`import tools`, then tools.<server>.<function>(...)): each function's \
             signature and docstring, as Python stubs. Read it before writing code that \
             calls them."
                .to_owned()
        },
        handler: |call, args| call.run(args, tool_apis::list_tool_apis),
    },
];

/// One of the tools: its name and title, and whether only a server with the operator's tools
/// (`[tools]`) serves it.
#[derive(Clone, Copy, Debug)]
pub struct ToolName {
    pub name: &'static str,
    pub title: &'static str,
    pub code_mode: bool,
}

/// Every tool, in the order `tools/list` gives them, from the table: `airlock mcp --help`
/// lists them from here, so the two name the same tools.
pub const TOOL_NAMES: [ToolName; TABLE.len()] = {
    let mut names = [ToolName {
        name: "",
        title: "",
        code_mode: false,
    }; TABLE.len()];
    let mut i = 0;
    while i < TABLE.len() {
        names[i] = ToolName {
            name: TABLE[i].name,
            title: TABLE[i].title,
            code_mode: TABLE[i].code_mode,
        };
        i += 1;
    }
    names
};

impl Tool {
    /// Whether this server serves it.
    fn served(&self, state: &Services) -> bool {
        !self.code_mode || state.tools.is_some()
    }

    /// The tool as `tools/list` gives it. Nothing here reaches beyond the sandbox: a closed
    /// world.
    fn listed(&self, prose: &Prose) -> rmcp::model::Tool {
        let mut tool = rmcp::model::Tool::new(self.name, (self.description)(prose), (self.input)());
        tool.output_schema = Some(Arc::new((self.output)()));
        tool.title = Some(self.title.to_owned());
        tool.annotations = Some(
            ToolAnnotations::with_title(self.title)
                .read_only(self.effect == Effect::Reads)
                .destructive(self.effect == Effect::Destroys)
                .open_world(false),
        );
        tool
    }
}

/// The tools this server serves, with `run_python` saying which of the operator's tools the
/// caller's code may call (none when the caller is not known).
pub(super) fn list(state: &Services, caller: Option<&Key>) -> Vec<rmcp::model::Tool> {
    let prose = Prose::new(state, caller);
    TABLE
        .iter()
        .filter(|t| t.served(state))
        .map(|t| t.listed(&prose))
        .collect()
}

/// Runs the call of the tool it names; a tool this server does not serve is a protocol error.
pub(super) async fn call(incoming: Incoming<'_>, args: JsonObject) -> Answer {
    let Some(tool) = TABLE
        .iter()
        .find(|t| t.name == incoming.tool && t.served(incoming.state))
    else {
        return Err(ErrorData::invalid_params(
            format!("unknown tool: {}", incoming.tool),
            None,
        ));
    };
    (tool.handler)(incoming, args).await
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A name twice would be listed twice and dispatched to the first.
    #[test]
    fn each_tool_is_in_the_table_once() {
        let mut names = std::collections::BTreeSet::new();
        for tool in TABLE {
            assert!(names.insert(tool.name), "{} twice", tool.name);
        }
    }
}
