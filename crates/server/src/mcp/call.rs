//! A tool call on its way from `tools/call` to its tool's handler ([`Incoming::run`]): its
//! arguments read as the tool's type and checked (a call that does not fit the schema is a
//! protocol error whoever makes it), then its caller, its span over stdio, and what the HTTP
//! route handed over with it ([`Handover`], the answer's slot), given to the handler as one
//! [`Call`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use opentelemetry::KeyValue;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::de::DeserializeOwned;

use airlock_service::answer::Reserved;
use airlock_service::caller::{Caller, RequestId};
use airlock_service::error::Error;
use airlock_service::keys::{random_id, Key};
use airlock_service::pipeline::Received;
use airlock_service::SharedServices;

/// What a tool call comes to: a protocol error (unknown tool, arguments that do not fit), or
/// the tool's result or refusal, which the model reads.
pub(super) type Answer = Result<Result<CallToolResult, Error>, ErrorData>;

/// A handler's run, boxed so that the tool table holds one type for every tool.
pub(super) type Running<'a> = Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

/// A call as it arrives, before its arguments are read.
pub(super) struct Incoming<'a> {
    pub state: &'a SharedServices,
    /// The caller over stdio; over HTTP each request carries its own (and this is [`None`]).
    pub local: Option<&'a Arc<Key>>,
    /// Whether the host asked for the output of each call as log messages (stdio only).
    pub logs: bool,
    /// The tool's name, as the call gave it.
    pub tool: &'a str,
    pub context: &'a RequestContext<RoleServer>,
}

/// A call whose arguments fit its tool: what its handler is given.
pub(super) struct Call<'a> {
    pub state: &'a SharedServices,
    pub key: Arc<Key>,
    pub request_id: String,
    /// Over HTTP, the message's arrival ([`Handover`]), held as a REST request holds its own.
    pub received: Option<Received>,
    /// Over HTTP, where the answer's reservation is left ([`answer_slot`]).
    pub slot: Option<Reserved>,
    /// Whether the call came over stdio, from the one local caller.
    pub stdio: bool,
    /// Whether the host asked for the output as log messages.
    pub logs: bool,
    pub context: &'a RequestContext<RoleServer>,
}

/// A tool's arguments: read from the call's JSON by serde, then checked for what the schema
/// says and serde does not (a misfit is a protocol error either way).
pub(super) trait Arguments: DeserializeOwned + Send {
    fn check(&self) -> Result<(), ErrorData> {
        Ok(())
    }
}

/// `timeout_seconds` as the schema bounds it: absent, or at least 1.
pub(super) fn at_least_a_second(timeout_seconds: Option<u64>) -> Result<(), ErrorData> {
    if timeout_seconds == Some(0) {
        return Err(ErrorData::invalid_params(
            "invalid arguments: timeout_seconds must be at least 1",
            None,
        ));
    }
    Ok(())
}

impl<'a> Incoming<'a> {
    /// Reads the arguments as `A`, checks them, then runs `handler` for the caller. Arguments
    /// are checked before anything else; so is a call without a caller (never expected: the
    /// route and the stdio server both give one). Over stdio the call has a span of its own.
    pub(super) fn run<A, F, R>(self, args: JsonObject, handler: F) -> Running<'a>
    where
        A: Arguments + 'a,
        F: FnOnce(Call<'a>, A) -> R + Send + 'a,
        R: Future<Output = Result<CallToolResult, Error>> + Send + 'a,
    {
        Box::pin(async move {
            let arguments: A = arguments(args)?;
            arguments.check()?;
            let (key, request_id) = caller(self.local, self.context)
                .map_err(|e| ErrorData::internal_error(e.message, None))?;
            let mut span = self.stdio_span(&request_id);
            let call = Call {
                state: self.state,
                key,
                request_id,
                received: handed_over(self.context),
                slot: answer_slot(self.context),
                stdio: self.local.is_some(),
                logs: self.logs,
                context: self.context,
            };
            let result = handler(call, arguments).await;
            if let Some(span) = &mut span {
                span.succeed();
                if let Err(e) = &result {
                    span.fail(e.code);
                }
            }
            Ok(result)
        })
    }

    /// Over stdio, where no HTTP request carries one, the call's own span (a server span
    /// named `tools/call <tool>`), continuing the trace context the host put in the call's
    /// `_meta` (SEP-414); the pipeline finds it by `request_id`. Ends when dropped: failed
    /// if the call is dropped unanswered (cancelled).
    fn stdio_span(&self, request_id: &str) -> Option<airlock_service::telemetry::Span> {
        if self.local.is_none() || !self.state.telemetry.enabled() {
            return None;
        }
        let (tool, meta) = (self.tool, &self.context.meta);
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
}

/// The arguments of a call, or a JSON-RPC "invalid params" error naming what is wrong.
fn arguments<T: DeserializeOwned>(args: JsonObject) -> Result<T, ErrorData> {
    serde_json::from_value(serde_json::Value::Object(args))
        .map_err(|e| ErrorData::invalid_params(format!("invalid arguments: {e}"), None))
}

/// The caller and a request id: the HTTP request's, or the local key's (`local`, over stdio).
pub(super) fn caller(
    local: Option<&Arc<Key>>,
    context: &RequestContext<RoleServer>,
) -> Result<(Arc<Key>, String), Error> {
    let parts = context.extensions.get::<axum::http::request::Parts>();
    let (key, request_id) = match (parts, local) {
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
