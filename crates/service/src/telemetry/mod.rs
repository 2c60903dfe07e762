//! OpenTelemetry traces (docs/telemetry.md), exported over OTLP when `[telemetry]
//! otlp_endpoint` is set; otherwise nothing here is started and each hook is one check.
//!
//! A request's span (the HTTP adapter makes it, continuing the caller's `traceparent`; the
//! pipeline finds it by the request's id) has a
//! child per phase of an execution: `admission_wait`, `sandbox_start`, `run`,
//! `result_parsing`, `answer_write`; `run` has one per tool call (`tool_call`, whose context
//! goes to the tool server in `_meta`) and per egress connection (`egress_connection`).
//! Attributes hold names, sizes, hashes and outcomes: never code, arguments, outputs,
//! credentials or their values.
//!
//! Spans are made as the SDK's `SpanData` directly, not through a `Tracer`: most phases are
//! timed elsewhere (the engine's [`airlock_engine::Timings`], the proxy's and the broker's
//! records) and known only once over, and a tool call's span id must exist before the call
//! goes upstream, neither of which the SDK's tracer can be given. The OTLP exporter is the
//! SDK's; the queue in front of it is ours ([`export`]), so that drops are counted.

mod context;
mod export;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData};

use crate::config::TelemetryConfig;

/// A request's span, as the pipeline carries it to the work the request started.
pub type Trace = SpanContext;
use crate::metrics::Metrics;

/// The traces of one server: off (`Default`), or a queue to the collector.
#[derive(Debug, Default)]
pub struct Telemetry {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    queue: export::Queue,
    ids: RandomIdGenerator,
    scope: InstrumentationScope,
    /// The spans of requests being served, by request id: the pipeline finds its request's
    /// there whichever task runs it (rmcp runs each MCP call in one of its own).
    requests: Mutex<HashMap<String, SpanContext>>,
    /// Executions running now, by id.
    running: Mutex<HashMap<String, Running>>,
}

/// Where an execution's spans go: its phases under its request's span; its tool calls and
/// connections under its `run` span, whose id is chosen when it starts and which is recorded
/// once it is over.
#[derive(Debug)]
struct Running {
    request: SpanContext,
    run: SpanContext,
    since: SystemTime,
    recorded: bool,
}

impl Telemetry {
    /// Starts the exporter when `config` names an endpoint; off otherwise, or (said in the
    /// log) when it cannot start.
    pub fn start(config: &TelemetryConfig, replica: Option<&str>, metrics: Arc<Metrics>) -> Self {
        if config.otlp_endpoint.is_none() {
            return Telemetry::default();
        }
        let mut resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if let Some(replica) = replica {
            resource =
                resource.with_attribute(KeyValue::new("service.instance.id", replica.to_owned()));
        }
        match export::start(config, resource.build(), metrics) {
            Ok(queue) => {
                tracing::info!(
                    url = config.traces_url().unwrap_or_default(),
                    "traces: exporting over OTLP"
                );
                Telemetry {
                    inner: Some(Arc::new(Inner {
                        queue,
                        ids: RandomIdGenerator::default(),
                        scope: InstrumentationScope::builder("airlock")
                            .with_version(env!("CARGO_PKG_VERSION"))
                            .build(),
                        requests: Mutex::default(),
                        running: Mutex::default(),
                    })),
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "traces: cannot export; none are recorded");
                Telemetry::default()
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// At shutdown: sends the spans still queued, waiting at most `within`; whether all went
    /// (true when traces are off).
    pub fn flush(&self, within: std::time::Duration) -> bool {
        self.inner.as_ref().is_none_or(|i| i.queue.flush(within))
    }

    /// Request `request_id`'s span (a server span named `name`), a child of the caller's
    /// `traceparent` when it sent a valid one, else the root of a new trace. Ends when
    /// dropped; [`Telemetry::request_span`] finds it meanwhile.
    pub fn request(
        &self,
        name: String,
        request_id: &str,
        (traceparent, tracestate): (Option<&str>, Option<&str>),
        attributes: Vec<KeyValue>,
    ) -> Option<Span> {
        let inner = self.inner.as_ref()?;
        let parent = traceparent.and_then(|t| context::parse(t, tracestate));
        let mut span = inner.start(parent.as_ref(), name.into(), SpanKind::Server, attributes);
        inner
            .requests()
            .insert(request_id.to_owned(), span.context.clone());
        span.request_id = Some(request_id.to_owned());
        Some(span)
    }

    /// The span of request `request_id`, while it is served and traced.
    pub fn request_span(&self, request_id: &str) -> Option<SpanContext> {
        self.inner.as_ref()?.requests().get(request_id).cloned()
    }

    /// A phase timed from now until the span is dropped, under `parent`.
    pub fn phase(&self, parent: Option<&SpanContext>, name: &'static str) -> Option<Span> {
        let inner = self.inner.as_ref()?;
        Some(inner.start(Some(parent?), name.into(), SpanKind::Internal, Vec::new()))
    }

    /// Execution `id` of the request whose span is `request` starts: its spans go there until
    /// the guard is dropped.
    pub fn execution(&self, id: &str, request: Option<&SpanContext>) -> Option<Registered> {
        let (inner, request) = (self.inner.as_ref()?, request?);
        let run = inner.child_context(request);
        let running = Running {
            request: request.clone(),
            run,
            since: SystemTime::now(),
            recorded: false,
        };
        inner.running().insert(id.to_owned(), running);
        Some(Registered {
            inner: inner.clone(),
            id: id.to_owned(),
        })
    }

    /// Execution `e` is over: its `sandbox_start`, `run` and `result_parsing` spans, as far
    /// as its timings go.
    pub fn executed(&self, e: Executed<'_>) {
        let Some(inner) = &self.inner else { return };
        let Some((request, run)) = inner.running_mut(e.id, |r| {
            r.recorded = true;
            (r.request.clone(), r.run.clone())
        }) else {
            return;
        };
        let t = e.timings;
        if let (Some(asked), Some(ready)) = (t.asked, t.ready) {
            let source = match (e.pooled, e.forked) {
                (true, _) => "pool",
                (false, true) => "zygote",
                (false, false) => "cold",
            };
            let attributes = vec![KeyValue::new("airlock.sandbox.source", source)];
            let id = inner.ids.new_span_id();
            inner.record(
                &request,
                id,
                "sandbox_start",
                wall(asked),
                wall(ready),
                attributes,
            );
        }
        if let (Some(ready), Some(ran)) = (t.ready.or(t.asked), t.ran) {
            let attributes = vec![
                KeyValue::new("airlock.execution.id", e.id.to_owned()),
                KeyValue::new("airlock.execution.status", e.status.to_owned()),
                KeyValue::new("airlock.code.bytes", e.code_bytes as i64),
                KeyValue::new("airlock.code.sha256", e.code_sha256.to_owned()),
            ];
            let id = run.span_id();
            inner.record(&request, id, "run", wall(ready), wall(ran), attributes);
        }
        if let (Some(ran), Some(parsed)) = (t.ran, t.parsed) {
            let id = inner.ids.new_span_id();
            inner.record(
                &request,
                id,
                "result_parsing",
                wall(ran),
                wall(parsed),
                vec![],
            );
        }
    }

    /// The context a tool call of execution `execution_id` goes upstream with: a span of its
    /// own under the execution's `run`, recorded when the call is ([`Telemetry::tool_call`]).
    pub fn tool_call_context(&self, execution_id: &str) -> Option<(String, Option<String>)> {
        let inner = self.inner.as_ref()?;
        let run = inner.running_mut(execution_id, |r| r.run.clone())?;
        Some(context::format(&inner.child_context(&run)))
    }

    /// A tool call is over.
    pub fn tool_call(&self, record: &airlock_tools::CallRecord) {
        let Some(inner) = &self.inner else { return };
        let Some(run) = inner.running_mut(&record.execution_id, |r| r.run.clone()) else {
            return;
        };
        // The id it was sent upstream with, when it went.
        let id = record
            .trace
            .as_ref()
            .and_then(|t| context::parse(&t.traceparent, None))
            .map_or_else(|| inner.ids.new_span_id(), |cx| cx.span_id());
        let (server, tool) = record.labels();
        let mut attributes = vec![
            KeyValue::new("mcp.method.name", "tools/call"),
            KeyValue::new("airlock.tool.server", server.to_owned()),
            KeyValue::new("airlock.tool.name", tool.to_owned()),
            KeyValue::new("airlock.tool.outcome", record.outcome.as_str()),
            KeyValue::new("airlock.tool.arguments.bytes", record.bytes_in as i64),
            KeyValue::new(
                "airlock.tool.arguments.sha256",
                record.arguments_sha256.clone(),
            ),
            KeyValue::new("airlock.tool.answer.bytes", record.bytes_out as i64),
            KeyValue::new("airlock.execution.id", record.execution_id.clone()),
        ];
        if let Some(reason) = record.reason {
            attributes.push(KeyValue::new("airlock.tool.reason", reason));
        }
        let end = SystemTime::now();
        let start = ago(end, record.duration_ms);
        let ok = record.outcome == airlock_tools::Outcome::Ok;
        let timed = Timed {
            name: "tool_call",
            kind: SpanKind::Client,
            times: (start, end),
            attributes,
            ok,
        };
        inner.record_timed(&run, id, timed);
    }

    /// An egress connection is over (refused ones too).
    pub fn connection(&self, record: &airlock_egress::ConnectionRecord) {
        let Some(inner) = &self.inner else { return };
        let Some(execution_id) = &record.execution_id else {
            return; // a session's code between cells: no request is there to join
        };
        let Some(run) = inner.running_mut(execution_id, |r| r.run.clone()) else {
            return;
        };
        let mut attributes = vec![
            KeyValue::new("server.address", record.host.clone()),
            KeyValue::new("server.port", i64::from(record.port)),
            KeyValue::new("airlock.egress.method", record.method.clone()),
            KeyValue::new("airlock.egress.outcome", record.outcome),
            KeyValue::new("airlock.egress.bytes_out", record.bytes_out as i64),
            KeyValue::new("airlock.egress.bytes_in", record.bytes_in as i64),
            KeyValue::new("airlock.execution.id", execution_id.clone()),
        ];
        if let Some(address) = &record.address {
            attributes.push(KeyValue::new("network.peer.address", address.clone()));
        }
        if let Some(reason) = record.reason {
            attributes.push(KeyValue::new("airlock.egress.reason", reason));
        }
        if let Some(credential) = &record.credential {
            // Its name in the configuration, never its value.
            attributes.push(KeyValue::new(
                "airlock.egress.credential",
                credential.clone(),
            ));
        }
        let end = SystemTime::now();
        let start = ago(end, record.duration_ms);
        let id = inner.ids.new_span_id();
        let timed = Timed {
            name: "egress_connection",
            kind: SpanKind::Internal,
            times: (start, end),
            attributes,
            ok: record.outcome == "allowed",
        };
        inner.record_timed(&run, id, timed);
    }
}

/// What [`Telemetry::executed`] records of an execution.
#[derive(Debug)]
pub struct Executed<'a> {
    pub id: &'a str,
    pub status: &'a str,
    pub code_sha256: &'a str,
    pub code_bytes: u64,
    pub pooled: bool,
    pub forked: bool,
    pub timings: &'a airlock_engine::Timings,
}

/// An execution's place in its request's trace, until dropped (when its `run` span is
/// recorded if it never ran to be: the tree stays whole).
#[derive(Debug)]
pub struct Registered {
    inner: Arc<Inner>,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let Some(running) = self.inner.running().remove(&self.id) else {
            return;
        };
        if !running.recorded {
            let timed = Timed {
                name: "run",
                kind: SpanKind::Internal,
                times: (running.since, SystemTime::now()),
                attributes: vec![KeyValue::new("airlock.execution.id", self.id.clone())],
                ok: false,
            };
            let (request, id) = (&running.request, running.run.span_id());
            self.inner.record_timed(request, id, timed);
        }
    }
}

impl Inner {
    fn requests(&self) -> std::sync::MutexGuard<'_, HashMap<String, SpanContext>> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running_mut<T>(&self, id: &str, f: impl FnOnce(&mut Running) -> T) -> Option<T> {
        self.running().get_mut(id).map(f)
    }

    /// A new span's context under `parent` (or at the root of a new trace, sampled).
    fn child_context(&self, parent: &SpanContext) -> SpanContext {
        SpanContext::new(
            parent.trace_id(),
            self.ids.new_span_id(),
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        )
    }

    fn start(
        self: &Arc<Self>,
        parent: Option<&SpanContext>,
        name: std::borrow::Cow<'static, str>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let context = match parent {
            Some(parent) => self.child_context(parent),
            None => SpanContext::new(
                self.ids.new_trace_id(),
                self.ids.new_span_id(),
                TraceFlags::SAMPLED,
                false,
                Default::default(),
            ),
        };
        // A parent the caller did not sample: the context goes on, nothing is recorded.
        let data = context.is_sampled().then(|| {
            let now = SystemTime::now();
            self.data(parent, context.clone(), name, kind, (now, now), attributes)
        });
        Span {
            inner: self.clone(),
            context,
            data,
            request_id: None,
        }
    }

    fn data(
        &self,
        parent: Option<&SpanContext>,
        context: SpanContext,
        name: std::borrow::Cow<'static, str>,
        kind: SpanKind,
        (start_time, end_time): (SystemTime, SystemTime),
        attributes: Vec<KeyValue>,
    ) -> SpanData {
        SpanData {
            span_context: context,
            parent_span_id: parent.map_or(SpanId::INVALID, SpanContext::span_id),
            parent_span_is_remote: parent.is_some_and(SpanContext::is_remote),
            span_kind: kind,
            name,
            start_time,
            end_time,
            attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: self.scope.clone(),
        }
    }

    /// An internal span timed elsewhere, under `parent`.
    fn record(
        &self,
        parent: &SpanContext,
        id: SpanId,
        name: &'static str,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
    ) {
        let timed = Timed {
            name,
            kind: SpanKind::Internal,
            times: (start, end),
            attributes,
            ok: true,
        };
        self.record_timed(parent, id, timed);
    }

    /// A span timed elsewhere, with id `id`, under `parent`.
    fn record_timed(&self, parent: &SpanContext, id: SpanId, span: Timed) {
        if !parent.is_sampled() {
            return;
        }
        let context = SpanContext::new(
            parent.trace_id(),
            id,
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        );
        let Timed {
            name,
            kind,
            times,
            attributes,
            ok,
        } = span;
        let mut data = self.data(Some(parent), context, name.into(), kind, times, attributes);
        if !ok {
            data.status = Status::error("");
        }
        self.queue.push(data);
    }
}

/// A span timed elsewhere, to be recorded.
struct Timed {
    name: &'static str,
    kind: SpanKind,
    times: (SystemTime, SystemTime),
    attributes: Vec<KeyValue>,
    /// False: its status is an error.
    ok: bool,
}

/// A span being timed: recorded (sent to the queue) when dropped.
#[derive(Debug)]
pub struct Span {
    inner: Arc<Inner>,
    context: SpanContext,
    /// None when its trace is not sampled.
    data: Option<SpanData>,
    /// A request's span: its entry in [`Inner::requests`], removed with it.
    request_id: Option<String>,
}

impl Span {
    pub fn context(&self) -> &SpanContext {
        &self.context
    }

    pub fn set(&mut self, attribute: KeyValue) {
        if let Some(data) = &mut self.data {
            data.attributes.push(attribute);
        }
    }

    /// Marks it failed (a 5xx answer, a client gone).
    pub fn fail(&mut self, why: &'static str) {
        if let Some(data) = &mut self.data {
            data.status = Status::error(why);
        }
    }

    /// Takes back [`Span::fail`].
    pub fn succeed(&mut self) {
        if let Some(data) = &mut self.data {
            data.status = Status::Unset;
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(id) = &self.request_id {
            self.inner.requests().remove(id);
        }
        if let Some(mut data) = self.data.take() {
            data.end_time = SystemTime::now();
            self.inner.queue.push(data);
        }
    }
}

/// `at` on the wall clock.
fn wall(at: Instant) -> SystemTime {
    let now = (Instant::now(), SystemTime::now());
    match now.0.checked_duration_since(at) {
        Some(ago) => now.1 - ago,
        None => now.1 + at.duration_since(now.0),
    }
}

fn ago(end: SystemTime, ms: u64) -> SystemTime {
    end - std::time::Duration::from_millis(ms)
}
