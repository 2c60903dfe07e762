//! The host's side of code mode. The [`Registry`] holds the supervised tool servers; a
//! [`ToolSet`] serves one execution's (or one session's) tool channel: every call frame is
//! checked again here (granted by exact name, counted, rated, sized, validated against the
//! tool's input schema), sent upstream with a time limit, audited, and answered. When the
//! sandbox goes, what is still running upstream is cancelled (MCP `notifications/cancelled`)
//! and its answer dropped.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_engine::channel::{self, Broken, Frame};
use airlock_engine::{tool_answer, ToolBridge, ToolCall as CallFrame, ToolValue};
use sha2::{Digest, Sha256};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::approvals::{self, Approvals, NoApprover, Opened, Resolution};
use crate::config::{ApprovalRule, ToolsConfig};
use crate::grants::Grants;
use crate::package::{self, Granted, ToolApi};
use crate::shown;
use crate::slots::Slots;
use crate::source::{Source, SourceStatus};

/// Room in a call frame beyond its arguments (id, names, JSON punctuation).
const FRAME_OVERHEAD: u64 = 64 * 1024;
/// Room in an answer frame beyond the result (id, marshal's headers).
const ANSWER_OVERHEAD: usize = 1024;
/// How long each call past the budget (after the first) waits for its refusal: a program
/// that keeps calling costs the host next to nothing, and is not audited call by call.
const FLOOD_PAUSE: Duration = Duration::from_millis(1);
/// The most of a name the sandbox sent that an audit line keeps.
const MAX_NAME_CHARS: usize = 128;

/// How one call ended, as the audit log and metrics name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    /// The tool's own error, arguments against its schema, a timeout, a server that is down
    /// or busy.
    Error,
    /// Not granted to the key.
    Denied,
    /// A bound: calls, rate, argument or result bytes.
    Limit,
    /// The sandbox ended while the call ran.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Denied => "denied",
            Outcome::Limit => "limit",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// One call, as it is audited: never its arguments or result unless the operator asks.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CallRecord {
    pub event: &'static str,
    pub execution_id: String,
    pub key: String,
    /// The names as the sandbox sent them, cut to 128 characters.
    pub server: String,
    pub tool: String,
    /// Whether the names are those of a tool its server lists (metrics label only those).
    pub known: bool,
    pub arguments_sha256: String,
    /// The arguments' JSON, as the sandbox sent it.
    pub bytes_in: u64,
    /// The answer sent back to the sandbox.
    pub bytes_out: u64,
    pub duration_ms: u64,
    pub outcome: Outcome,
    /// What refused or failed it: `not_granted`, `calls`, `rate`, `argument_bytes`,
    /// `result_bytes`, `schema`, `busy` (no slot of the server within `slot_wait_ms`),
    /// `timeout`, `unavailable`, `tool`, `not_sent`, `cancelled_upstream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The trace context the call was sent upstream with ([`Observer::trace`]), if it was.
    #[serde(skip)]
    pub trace: Option<TraceContext>,
}

impl CallRecord {
    /// The server and tool names to label it by: those a server lists, and `-` for names
    /// the sandbox made up (so that they make one series, not as many as it likes).
    pub fn labels(&self) -> (&str, &str) {
        if self.known {
            (&self.server, &self.tool)
        } else {
            ("-", "-")
        }
    }
}

/// A call's place in a trace, as it goes upstream in the request's `_meta` (W3C Trace
/// Context's `traceparent` and `tracestate`, as MCP's trace-context proposal, SEP-414, carries
/// them), so that the tool server's own spans join the execution's trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

/// Where call records go: the server's audit log and metrics.
pub trait Observer: Send + Sync + std::fmt::Debug {
    fn call(&self, record: &CallRecord);

    /// A call of execution `execution_id` is about to be sent upstream: the trace context to
    /// send with it, when its execution is traced. The record of the call carries it back.
    fn trace(&self, _execution_id: &str) -> Option<TraceContext> {
        None
    }

    /// A step of a call's approval: asked, decided, timed out, withdrawn.
    fn approval(&self, _record: &ApprovalRecord) {}
}

/// One step of a call's approval, as it is audited (never the arguments: their hash).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ApprovalRecord {
    pub event: &'static str,
    pub approval_id: String,
    pub execution_id: String,
    pub key: String,
    pub server: String,
    pub tool: String,
    pub arguments_sha256: String,
    /// `requested`, `approved`, `denied`, `timed_out` or `withdrawn`.
    pub outcome: &'static str,
    /// Who decided: the approving key's name, or `mcp_host`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Milliseconds since the call asked.
    pub waited_ms: u64,
}

/// Drops every record (the CLI without an audit log).
#[derive(Debug)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn call(&self, _: &CallRecord) {}
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The configured tool servers, supervised.
#[derive(Debug)]
pub struct Registry {
    config: ToolsConfig,
    sources: BTreeMap<String, Arc<Source>>,
    runtime: Handle,
    shutdown: CancellationToken,
    rates: Mutex<HashMap<String, Bucket>>,
    approvals: Arc<Approvals>,
}

impl Registry {
    /// Starts every server (in the background, on `runtime`); see [`Registry::started`].
    pub fn start(config: ToolsConfig, runtime: Handle) -> Arc<Registry> {
        let shutdown = CancellationToken::new();
        let start_timeout = Duration::from_millis(config.start_timeout_ms);
        // A result over the limit is refused anyway; the transport need not take more.
        let max_message = usize::try_from(config.max_result_bytes.saturating_mul(2))
            .unwrap_or(usize::MAX)
            .max(1 << 20);
        let sources: BTreeMap<String, Arc<Source>> = config
            .servers
            .iter()
            .map(|(name, c)| {
                let slots = Slots::new(config.max_concurrent_per_server, config.reserve());
                let source = Source::new(name.clone(), c.clone(), slots);
                (name.clone(), Arc::new(source))
            })
            .collect();
        for source in sources.values() {
            runtime.spawn(
                source
                    .clone()
                    .supervise(start_timeout, max_message, shutdown.clone()),
            );
        }
        Arc::new(Registry {
            config,
            sources,
            runtime,
            shutdown,
            rates: Mutex::new(HashMap::new()),
            approvals: Approvals::new(),
        })
    }

    /// The calls waiting for an approval.
    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.approvals
    }

    /// Checks each server's `approval` against its tools: a name that is not a tool is an
    /// error (a typo would leave a tool that writes unguarded); a pattern that matches
    /// nothing is a warning.
    pub fn check_approvals(&self) -> Result<Vec<String>, String> {
        let mut warnings = Vec::new();
        for (name, source) in &self.sources {
            let ApprovalRule::Tools(patterns) = &source.config.approval else {
                continue;
            };
            let tools = source.last_tools();
            for p in patterns {
                let matched = tools.iter().any(|t| crate::grants::glob(p, &t.name));
                if p.contains('*') {
                    if !matched {
                        warnings.push(format!(
                            "tools.servers.{name}.approval: `{p}` matches no tool"
                        ));
                    }
                } else if !matched {
                    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                    return Err(format!(
                        "tools.servers.{name}.approval: server `{name}` has no tool `{p}` \
                         (it has: {}; name tools without the server's name)",
                        names.join(", ")
                    ));
                }
            }
        }
        Ok(warnings)
    }

    /// Waits until every server has been tried once; the error names each that failed.
    pub async fn started(&self) -> Result<(), String> {
        let mut failed = Vec::new();
        for (name, source) in &self.sources {
            if let Err(e) = source.first_attempt().await {
                failed.push(format!("tool server `{name}` failed to start: {e}"));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }

    pub fn statuses(&self) -> Vec<SourceStatus> {
        self.sources.values().map(|s| s.status()).collect()
    }

    /// Stops supervising and kills every stdio server (its process group).
    pub fn shutdown(&self) {
        // Killed while their clients still hold them (unreaped: the group ids are theirs).
        for source in self.sources.values() {
            source.kill();
        }
        self.shutdown.cancel();
    }

    /// Checks a key's grants against the servers' tools: errors for unknown servers and
    /// tools, warnings for patterns that match nothing.
    pub fn check_grants(&self, grants: &Grants) -> Result<Vec<String>, String> {
        let catalog = self
            .sources
            .iter()
            .map(|(name, s)| (name.clone(), s.last_tools().to_vec()))
            .collect();
        grants.check(&catalog)
    }

    /// The tools `grants` reach among those the servers list now, in order.
    pub fn granted(&self, grants: &Grants) -> Vec<Granted> {
        let mut out = Vec::new();
        if grants.is_empty() {
            return out;
        }
        for (server, source) in &self.sources {
            let tools = source.tools();
            let names = package::function_names(&tools);
            for (tool, function) in tools.iter().zip(names) {
                if grants.allows(server, &tool.name, tool.read_only) {
                    out.push(Granted {
                        server: server.clone(),
                        tool: tool.clone(),
                        function,
                    });
                }
            }
        }
        out
    }

    /// The Python API of what `grants` reach.
    pub fn apis(&self, grants: &Grants) -> Vec<ToolApi> {
        self.granted(grants).iter().map(package::api).collect()
    }

    /// A tool set for one execution (or session) of `key`.
    pub fn tool_set(
        self: &Arc<Self>,
        key: &str,
        grants: &Grants,
        execution_id: &str,
        observer: Arc<dyn Observer>,
    ) -> Arc<ToolSet> {
        let granted = self.granted(grants);
        self.approvals.admit(execution_id);
        Arc::new(ToolSet {
            inner: Arc::new(Inner {
                registry: self.clone(),
                key: key.to_owned(),
                current: Mutex::new(Current {
                    execution_id: execution_id.to_owned(),
                    granted: Arc::new(granted),
                    calls: Arc::new(AtomicU64::new(0)),
                }),
                calls: AtomicU64::new(0),
                running: Arc::new(Semaphore::new(self.config.max_concurrent)),
                observer,
            }),
        })
    }

    /// Takes one call from `key`'s rate; false when it is spent.
    fn take_token(&self, key: &str) -> bool {
        let per_minute = self.config.rate_per_minute;
        if per_minute == 0 {
            return true;
        }
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let bucket = rates.entry(key.to_owned()).or_insert(Bucket {
            tokens: f64::from(per_minute),
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() * f64::from(per_minute) / 60.0;
        bucket.tokens = (bucket.tokens + refill).min(f64::from(per_minute));
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What a session's next cell runs with.
#[derive(Debug)]
struct Current {
    execution_id: String,
    granted: Arc<Vec<Granted>>,
    /// Calls counted against `max_calls` (of this execution, or this cell).
    calls: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Inner {
    registry: Arc<Registry>,
    key: String,
    current: Mutex<Current>,
    /// Every call received.
    calls: AtomicU64,
    running: Arc<Semaphore>,
    observer: Arc<dyn Observer>,
}

/// The tools one execution (or one session) may call, and the server of its channel.
#[derive(Debug)]
pub struct ToolSet {
    inner: Arc<Inner>,
}

impl ToolSet {
    /// A session's next cell: the key's grants as they are now, its own id, a fresh call
    /// budget.
    pub fn begin(&self, grants: &Grants, execution_id: &str) {
        let granted = self.inner.registry.granted(grants);
        self.inner.registry.approvals.admit(execution_id);
        let mut current = self.inner.current();
        *current = Current {
            execution_id: execution_id.to_owned(),
            granted: Arc::new(granted),
            calls: Arc::new(AtomicU64::new(0)),
        };
    }
}

impl Inner {
    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A call's answer, and what to audit of it.
struct Answer {
    value: Result<ToolValue, (&'static str, String)>,
    outcome: Outcome,
    reason: Option<&'static str>,
    /// What the call was sent upstream with, to be recorded.
    trace: Option<TraceContext>,
}

impl Answer {
    fn refuse(outcome: Outcome, reason: &'static str, kind: &'static str, message: String) -> Self {
        Answer {
            value: Err((kind, message)),
            outcome,
            reason: Some(reason),
            trace: None,
        }
    }
}

impl ToolBridge for ToolSet {
    fn package(&self) -> serde_json::Value {
        let granted = self.inner.current().granted.clone();
        package::package(&granted, self.inner.registry.config.max_argument_bytes)
    }

    fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    fn bind(&self, execution_id: &str) {
        let approvals = &self.inner.registry.approvals;
        let mut current = self.inner.current();
        approvals.withdraw_execution(&current.execution_id);
        approvals.admit(execution_id);
        current.execution_id = execution_id.to_owned();
    }

    fn serve(&self, channel: UnixStream, breach: &(dyn Fn(String) + Sync)) {
        let inner = &self.inner;
        let runtime = inner.registry.runtime.clone();
        let cap = inner.registry.config.max_argument_bytes + FRAME_OVERHEAD;
        let stop = CancellationToken::new();
        let (Ok(writer), Ok(probe)) = (channel.try_clone(), channel.try_clone()) else {
            breach("the tool channel could not be served".into());
            return;
        };
        let probe = Arc::new(probe);
        // Answers are whole frames, written under this lock by the reader (refusals) and by
        // the writer thread (answers from upstream).
        let writer = Mutex::new(writer);
        let write = |frame: &[u8]| {
            writer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_all(frame)
                .is_ok()
        };
        // Answers from upstream are made, audited and written by a thread of their own, off
        // the runtime: a sandbox that stops reading blocks it, never a worker. A call holds
        // its permit until its answer is written, so at most `max_concurrent` wait here.
        let (tx, rx) = std::sync::mpsc::channel::<Done>();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut open = true;
                for done in rx {
                    let frame = inner.finish(
                        &done.call,
                        done.answer,
                        done.arguments,
                        done.started,
                        &done.execution_id,
                        true,
                    );
                    if let Some(permit) = done.permit {
                        open = open && write(&frame);
                        drop(permit);
                    }
                }
            });
            let mut tasks = tokio::task::JoinSet::new();
            let mut reader = std::io::BufReader::new(&channel);
            loop {
                while tasks.try_join_next().is_some() {}
                let frame = match channel::read(&mut reader, cap) {
                    Frame::Data(frame) => frame,
                    Frame::End => break,
                    Frame::Broken(broken) => {
                        breach(breach_message(broken));
                        break;
                    }
                };
                let call: CallFrame = match serde_json::from_slice(&frame) {
                    Ok(call) => call,
                    Err(e) => {
                        breach(format!("the code sent a malformed tool call frame: {e}"));
                        break;
                    }
                };
                inner.calls.fetch_add(1, Ordering::Relaxed);
                let started = Instant::now();
                let execution_id = inner.current().execution_id.clone();
                match inner.check(&call) {
                    Err(refused) => {
                        // Refused here, at once, by this thread: a sandbox that floods the
                        // channel or stops reading holds back this thread, and only it.
                        let refused = *refused;
                        if refused.flood {
                            std::thread::sleep(FLOOD_PAUSE);
                        }
                        let frame = inner.finish(
                            &call,
                            refused.answer,
                            refused.arguments,
                            started,
                            &execution_id,
                            !refused.flood,
                        );
                        if !write(&frame) {
                            break;
                        }
                    }
                    Ok(checked) => {
                        let (inner, tx, stop, probe) =
                            (inner.clone(), tx.clone(), stop.clone(), probe.clone());
                        tasks.spawn_on(
                            async move {
                                let (answer, permit) = inner
                                    .run(&call, &checked, &execution_id, &stop, &probe)
                                    .await;
                                let _ = tx.send(Done {
                                    call,
                                    answer,
                                    arguments: checked.audit_args,
                                    started,
                                    execution_id,
                                    permit,
                                });
                            },
                            &runtime,
                        );
                    }
                }
            }
            // The channel is closed (the sandbox is gone) or broken: cancel what runs.
            stop.cancel();
            runtime.block_on(async { while tasks.join_next().await.is_some() {} });
            drop(tx);
        });
    }
}

/// A call that ran (or was cancelled), for the writer thread.
struct Done {
    call: CallFrame,
    answer: Answer,
    arguments: Option<serde_json::Value>,
    started: Instant,
    execution_id: String,
    /// None when nobody waits for the answer (the execution ended): audited, not written.
    permit: Option<OwnedSemaphorePermit>,
}

/// Whether the sandbox's end of the channel is gone (it died, or closed it): a call read
/// from what it wrote before must not start upstream.
fn sandbox_gone(channel: &UnixStream) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    // A unix socket whose peer closed (or died) reports POLLHUP, whatever is still unread.
    let mut fds = [PollFd::new(channel.as_fd(), PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) if n > 0 => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        _ => false,
    }
}

/// The execution's error for a call frame that broke the protocol.
fn breach_message(broken: Broken) -> String {
    match broken {
        Broken::TooLarge { len, cap } => {
            format!("the code sent a tool call frame of {len} bytes, over the limit of {cap} bytes")
        }
        Broken::Cut => "the tool channel closed in the middle of a call frame".to_owned(),
    }
}

/// A call that passed the host's checks, to be sent upstream.
struct Checked {
    granted: Granted,
    /// The server's `approval` names the tool: the call waits for one before it is sent.
    approval: bool,
    arguments: serde_json::Map<String, serde_json::Value>,
    /// The arguments, for the audit log, when the operator asked for them.
    audit_args: Option<serde_json::Value>,
}

/// What came of waiting for an approval.
enum Approved {
    Yes,
    /// Denied, timed out, withdrawn with its cell, or nobody to ask: this is its answer.
    No(Answer),
    /// The execution ended: nobody waits for an answer.
    Gone,
}

/// A call refused by the host's checks.
struct Refused {
    answer: Answer,
    arguments: Option<serde_json::Value>,
    /// A call past the budget after the first such: answered slowly and not audited.
    flood: bool,
}

impl Inner {
    /// What the host checks before anything goes upstream, in order: the budget (every frame
    /// counts, refused or not), the grant by exact name, the arguments' size, the key's rate,
    /// the tool's input schema.
    fn check(&self, call: &CallFrame) -> Result<Checked, Box<Refused>> {
        let config = &self.registry.config;
        let refuse = |outcome, reason, kind, message: String, arguments| {
            Box::new(Refused {
                answer: Answer::refuse(outcome, reason, kind, message),
                arguments,
                flood: false,
            })
        };
        let (granted, budget) = {
            let current = self.current();
            let found = current
                .granted
                .iter()
                .find(|g| g.server == call.server && g.tool.name == call.tool)
                .cloned();
            (found, current.calls.clone())
        };
        let made = budget.fetch_add(1, Ordering::Relaxed);
        if made >= config.max_calls {
            let message = format!("the execution's {} tool calls are spent", config.max_calls);
            let mut refused = refuse(Outcome::Limit, "calls", "limit", message, None);
            refused.flood = made > config.max_calls;
            return Err(refused);
        }
        let Some(granted) = granted else {
            let message = format!(
                "no tool `{}.{}` is granted to this execution",
                call.server, call.tool
            );
            return Err(refuse(
                Outcome::Denied,
                "not_granted",
                "denied",
                message,
                None,
            ));
        };
        let raw = call.arguments.get();
        if raw.len() as u64 > config.max_argument_bytes {
            let message = format!(
                "the arguments are {} bytes, over the limit of {} bytes",
                raw.len(),
                config.max_argument_bytes
            );
            return Err(refuse(
                Outcome::Limit,
                "argument_bytes",
                "limit",
                message,
                None,
            ));
        }
        if !self.registry.take_token(&self.key) {
            let message = format!(
                "this key's {} tool calls a minute are spent; try again later",
                config.rate_per_minute
            );
            return Err(refuse(Outcome::Limit, "rate", "limit", message, None));
        }
        let arguments = match serde_json::from_str(raw) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => {
                let message = "the arguments must be a JSON object".to_owned();
                return Err(refuse(Outcome::Error, "schema", "schema", message, None));
            }
        };
        let audit_args = config
            .audit_arguments
            .then(|| serde_json::Value::Object(arguments.clone()));
        let instance = serde_json::Value::Object(arguments);
        let problems: Vec<String> = granted
            .tool
            .validator
            .iter_errors(&instance)
            .take(3)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("at {at}: {e}")
                }
            })
            .collect();
        if !problems.is_empty() {
            let message = format!(
                "the arguments do not match the input schema of `{}.{}`: {}",
                call.server,
                granted.function,
                problems.join("; ")
            );
            return Err(refuse(
                Outcome::Error,
                "schema",
                "schema",
                message,
                audit_args,
            ));
        }
        let serde_json::Value::Object(arguments) = instance else {
            unreachable!("built as an object above")
        };
        let approval = self
            .registry
            .sources
            .get(&call.server)
            .is_some_and(|s| s.config.approval.requires(&granted.tool.name));
        Ok(Checked {
            granted,
            approval,
            arguments,
            audit_args,
        })
    }

    /// Sends a checked call upstream; its answer, and the permit it ran under (None when the
    /// execution ended first: nobody waits for an answer then).
    async fn run(
        &self,
        call: &CallFrame,
        checked: &Checked,
        execution_id: &str,
        stop: &CancellationToken,
        channel: &UnixStream,
    ) -> (Answer, Option<OwnedSemaphorePermit>) {
        let config = &self.registry.config;
        let cancelled = |sent: bool| {
            let message = "the execution ended".to_owned();
            let reason = if sent {
                "cancelled_upstream"
            } else {
                "not_sent"
            };
            Answer::refuse(Outcome::Cancelled, reason, "cancelled", message)
        };
        // Waiting for a slot counts against the execution's wall clock, as the call does.
        let permit = tokio::select! {
            p = self.running.clone().acquire_owned() => p.ok(),
            _ = stop.cancelled() => None,
        };
        let Some(permit) = permit else {
            return (cancelled(false), None);
        };
        // An approval is waited for under the execution's own permit (so one execution has at
        // most `max_concurrent` calls waiting) and before the server's slot: a call waiting
        // for a person holds nothing another key needs.
        if checked.approval {
            match self.approve(call, checked, execution_id, stop).await {
                Approved::Yes => {}
                Approved::No(answer) => return (answer, Some(permit)),
                Approved::Gone => return (cancelled(false), None),
            }
        }
        let unavailable =
            |message: String| Answer::refuse(Outcome::Error, "unavailable", "unavailable", message);
        // Granted tools are those of configured servers; this is only for completeness.
        let Some(source) = self.registry.sources.get(&call.server) else {
            let message = format!("no tool server `{}`", call.server);
            return (unavailable(message), Some(permit));
        };
        // The server's own slots, shared fairly by the keys (`slots.rs`); waiting for one is
        // bounded, so a server kept busy by others is a quick `unavailable`, never a stall.
        let wait = Duration::from_millis(config.slot_wait_ms);
        let slot = tokio::select! {
            s = source.slots.acquire(&self.key, wait) => s,
            _ = stop.cancelled() => return (cancelled(false), None),
        };
        let Some(slot) = slot else {
            let message = format!(
                "the tool server `{}` is busy: no slot for the call came free within {} ms; \
                 try again later",
                call.server, config.slot_wait_ms
            );
            let answer = Answer::refuse(Outcome::Error, "busy", "unavailable", message);
            return (answer, Some(permit));
        };
        if stop.is_cancelled() || sandbox_gone(channel) {
            return (cancelled(false), None);
        }
        let Some(peer) = source.peer() else {
            let message = format!(
                "the tool server `{}` is unavailable (it is being started again)",
                call.server
            );
            return (unavailable(message), Some(permit));
        };
        let timeout = Duration::from_millis(
            source
                .config
                .call_timeout_ms
                .unwrap_or(config.call_timeout_ms),
        );
        let mut params = rmcp::model::CallToolRequestParams::new(checked.granted.tool.name.clone())
            .with_arguments(checked.arguments.clone());
        let trace = self.observer.trace(execution_id);
        if let Some(trace) = &trace {
            let mut meta = rmcp::model::RequestMetaObject::new();
            meta.set_traceparent(trace.traceparent.clone());
            if let Some(state) = &trace.tracestate {
                meta.set_tracestate(state.clone());
            }
            params.meta = Some(meta);
        }
        let traced = |mut answer: Answer| {
            answer.trace = trace.clone();
            answer
        };
        // Dropping the call's future (a timeout, or the sandbox gone) makes rmcp send
        // notifications/cancelled upstream.
        let answered = tokio::select! {
            r = peer.call_tool(params) => r,
            _ = tokio::time::sleep(timeout) => {
                let message = format!(
                    "`{}.{}` did not answer within {} ms",
                    call.server, checked.granted.function, timeout.as_millis()
                );
                let answer = Answer::refuse(Outcome::Error, "timeout", "timeout", message);
                return (traced(answer), Some(permit));
            }
            _ = stop.cancelled() => return (traced(cancelled(true)), None),
        };
        drop(slot);
        let answer = traced(match answered {
            Ok(result) => match serde_json::to_value(&result) {
                Ok(v) => from_result(v, checked.granted.tool.wraps_result),
                Err(e) => Answer::refuse(
                    Outcome::Error,
                    "tool",
                    "tool",
                    format!("an unreadable result: {e}"),
                ),
            },
            Err(e) => {
                // The detail may name the server's address: the log has it, not the sandbox.
                tracing::warn!(server = %call.server, tool = %checked.granted.tool.name, "a tool call failed: {e}");
                Answer::refuse(
                    Outcome::Error,
                    "unavailable",
                    "unavailable",
                    format!("the tool server `{}` failed the call", call.server),
                )
            }
        });
        (answer, Some(permit))
    }

    /// Waits until the call is approved, denied, withdrawn or out of time. It is in the
    /// table of waiting calls from the moment it is audited as `requested` until one of
    /// those takes it out; whichever comes first decides, once.
    async fn approve(
        &self,
        call: &CallFrame,
        checked: &Checked,
        execution_id: &str,
        stop: &CancellationToken,
    ) -> Approved {
        let config = &self.registry.config;
        let function = format!("{}.{}", call.server, checked.granted.function);
        // What is shown, sized and hashed is what is sent: the arguments as parsed (a key
        // given twice once, the code's spacing gone), never the code's own text.
        let sent = serde_json::to_string(&checked.arguments).unwrap_or_default();
        let timeout = Duration::from_millis(config.approval_timeout_ms);
        let now = std::time::SystemTime::now();
        let Some(id) = approvals::new_id() else {
            let message = format!("`{function}` needs an approval, which cannot be asked now");
            return Approved::No(Answer::refuse(
                Outcome::Error,
                "unavailable",
                "unavailable",
                message,
            ));
        };
        let bound = usize::try_from(config.approval_shown_bytes).unwrap_or(usize::MAX);
        let preview = shown::preview(&checked.arguments, bound, &id);
        // Whole only when they read as they are: anything else is for the preview to show.
        let arguments = (preview.shown == airlock_api::Shown::Whole && !preview.escaped)
            .then(|| serde_json::Value::Object(checked.arguments.clone()));
        let approval = airlock_api::Approval {
            id,
            execution_id: execution_id.to_owned(),
            key: self.key.clone(),
            server: call.server.clone(),
            tool: checked.granted.tool.name.clone(),
            arguments,
            arguments_preview: preview.text,
            arguments_shown: preview.shown,
            arguments_escaped: preview.escaped,
            arguments_bytes: sent.len() as u64,
            arguments_sha256: hex(&Sha256::digest(sent.as_bytes())),
            line: call.line,
            requested_at: humantime::format_rfc3339_millis(now).to_string(),
            expires_at: humantime::format_rfc3339_millis(now + timeout).to_string(),
        };
        let hub = &self.registry.approvals;
        let Opened {
            approval,
            mut resolution,
            watcher,
        } = match hub.open(approval, sent.into()) {
            Ok(opened) => opened,
            Err(NoApprover) => {
                let message = format!(
                    "`{function}` needs an approval, and nobody can give one here (no HTTP \
                     approvals, and the MCP host does not support elicitation)"
                );
                return Approved::No(Answer::refuse(
                    Outcome::Denied,
                    "no_approver",
                    "denied",
                    message,
                ));
            }
        };
        // Asked after the call entered the table: an execution that ended before finds it
        // there and withdraws it, one that ends after is seen here (a session's thread that
        // calls once its cell is over has no execution to wait within).
        if !hub.is_live(execution_id) && hub.close(&approval.id) {
            let message = format!("`{function}` was not sent: no cell of the session is running");
            return Approved::No(Answer::refuse(
                Outcome::Cancelled,
                "not_sent",
                "cancelled",
                message,
            ));
        }
        let asked = Instant::now();
        let record = |outcome, by: Option<String>, reason: Option<String>| ApprovalRecord {
            event: "tool_approval",
            approval_id: approval.id.clone(),
            execution_id: approval.execution_id.clone(),
            key: approval.key.clone(),
            server: approval.server.clone(),
            tool: approval.tool.clone(),
            arguments_sha256: approval.arguments_sha256.clone(),
            outcome,
            by,
            reason,
            waited_ms: asked.elapsed().as_millis() as u64,
        };
        self.observer.approval(&record("requested", None, None));
        if let Some(watcher) = watcher {
            watcher(hub, &approval);
        }
        enum Ended {
            Resolved(Resolution),
            TimedOut,
            Stopped,
        }
        let ended = tokio::select! {
            r = &mut resolution => Ended::Resolved(r.unwrap_or(Resolution::Withdrawn)),
            _ = tokio::time::sleep(timeout) => Ended::TimedOut,
            _ = stop.cancelled() => Ended::Stopped,
        };
        // A timeout or the end that finds the call gone from the table lost to a decision or
        // a withdrawal, sent (or being sent) on `resolution`.
        let stopped = matches!(ended, Ended::Stopped) || stop.is_cancelled();
        let ended = match ended {
            Ended::TimedOut | Ended::Stopped if !hub.close(&approval.id) => {
                Ended::Resolved(resolution.await.unwrap_or(Resolution::Withdrawn))
            }
            ended => ended,
        };
        match ended {
            Ended::Resolved(Resolution::Decided {
                decision,
                by,
                reason,
            }) => {
                let approved = decision == airlock_api::Decision::Approve;
                let outcome = if approved { "approved" } else { "denied" };
                self.observer
                    .approval(&record(outcome, Some(by), reason.clone()));
                if stopped {
                    Approved::Gone
                } else if approved {
                    Approved::Yes
                } else {
                    let message = match reason {
                        Some(reason) => format!("`{function}` was denied: {reason}"),
                        None => format!("`{function}` was denied"),
                    };
                    Approved::No(Answer::refuse(
                        Outcome::Denied,
                        "approval_denied",
                        "denied",
                        message,
                    ))
                }
            }
            Ended::TimedOut => {
                self.observer.approval(&record("timed_out", None, None));
                let message = format!(
                    "nobody approved `{function}` within {} ms",
                    timeout.as_millis()
                );
                Approved::No(Answer::refuse(
                    Outcome::Error,
                    "approval_timeout",
                    "timeout",
                    message,
                ))
            }
            Ended::Resolved(Resolution::Withdrawn) | Ended::Stopped => {
                self.observer.approval(&record("withdrawn", None, None));
                if stopped {
                    Approved::Gone
                } else {
                    // Its cell is over but the session's sandbox lives on: the thread that
                    // made the call gets its answer rather than waiting forever.
                    let message = format!("`{function}` was withdrawn: its cell ended");
                    Approved::No(Answer::refuse(
                        Outcome::Cancelled,
                        "not_sent",
                        "cancelled",
                        message,
                    ))
                }
            }
        }
    }

    /// The answer's frame (a result over the limit becomes a `ToolError`); audits the call.
    fn finish(
        &self,
        call: &CallFrame,
        mut answer: Answer,
        arguments: Option<serde_json::Value>,
        started: Instant,
        execution_id: &str,
        audit: bool,
    ) -> Vec<u8> {
        let limit = self.registry.config.max_result_bytes;
        let trace = answer.trace.take();
        let encode =
            |a: &Answer| tool_answer(call.id, a.value.as_ref().map_err(|(k, m)| (*k, m.as_str())));
        let mut frame = encode(&answer);
        let too_big = match &frame {
            Ok(f) => f.len() > limit as usize + ANSWER_OVERHEAD,
            Err(_) => true,
        };
        let result = match (&answer.value, too_big) {
            (Ok(v), false) if self.registry.config.audit_arguments => Some(audit_value(v)),
            _ => None,
        };
        if too_big {
            let size = frame.as_ref().map_or(0, Vec::len);
            answer = Answer::refuse(
                Outcome::Limit,
                "result_bytes",
                "limit",
                format!(
                    "the result of `{}.{}` is {size} bytes, over the limit of {limit} bytes",
                    call.server, call.tool
                ),
            );
            frame = encode(&answer);
        }
        let frame = frame.unwrap_or_default();
        if audit {
            let bounded = |name: &str| name.chars().take(MAX_NAME_CHARS).collect::<String>();
            let known = self
                .registry
                .sources
                .get(&call.server)
                .is_some_and(|s| s.tools().iter().any(|t| t.name == call.tool));
            self.observer.call(&CallRecord {
                event: "tool_call",
                execution_id: execution_id.to_owned(),
                key: self.key.clone(),
                server: bounded(&call.server),
                tool: bounded(&call.tool),
                known,
                arguments_sha256: hex(&Sha256::digest(call.arguments.get().as_bytes())),
                bytes_in: call.arguments.get().len() as u64,
                bytes_out: frame.len() as u64,
                duration_ms: started.elapsed().as_millis() as u64,
                outcome: answer.outcome,
                reason: answer.reason,
                arguments,
                result,
                trace,
            });
        }
        frame
    }
}

use airlock_api::hex;

/// A result as the audit log shows it (bytes as their length).
fn audit_value(v: &ToolValue) -> serde_json::Value {
    match v {
        ToolValue::Json(j) => j.clone(),
        ToolValue::Bytes(b) => serde_json::json!({"bytes": b.len()}),
        ToolValue::List(items) => items.iter().map(audit_value).collect(),
    }
}

/// A `CallToolResult` (as JSON) as what the code gets: its structured content if any, else
/// its content (text parsed as JSON where it is JSON, images and audio as bytes), one item
/// as itself and several as a list. An error result raises `ToolError` with its text.
fn from_result(result: serde_json::Value, wrapped: bool) -> Answer {
    use base64::Engine as _;
    use serde_json::Value;
    let blocks = result
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if result.get("isError") == Some(&Value::Bool(true)) {
        let text: Vec<&str> = blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect();
        let message = if text.is_empty() {
            "the tool failed".to_owned()
        } else {
            text.join("\n")
        };
        return Answer::refuse(Outcome::Error, "tool", "tool", message);
    }
    if let Some(structured) = result.get("structuredContent") {
        let inner = structured.as_object().filter(|o| wrapped && o.len() == 1);
        let value = inner.and_then(|o| o.get("result")).unwrap_or(structured);
        return Answer {
            value: Ok(ToolValue::Json(value.clone())),
            outcome: Outcome::Ok,
            reason: None,
            trace: None,
        };
    }
    let decode = |data: &Value| {
        data.as_str()
            .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
    };
    let mut items = Vec::with_capacity(blocks.len());
    for block in blocks {
        let item = match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                ToolValue::Json(serde_json::from_str(text).unwrap_or_else(|_| Value::from(text)))
            }
            Some("image") | Some("audio") => match decode(&block["data"]) {
                Some(bytes) => ToolValue::Bytes(bytes),
                None => {
                    return Answer::refuse(
                        Outcome::Error,
                        "tool",
                        "tool",
                        "the tool sent an image that is not base64".into(),
                    )
                }
            },
            Some("resource") => {
                let r = &block["resource"];
                match (r.get("text"), r.get("blob")) {
                    (Some(Value::String(t)), _) => ToolValue::Json(Value::from(t.as_str())),
                    (_, Some(blob)) => match decode(blob) {
                        Some(bytes) => ToolValue::Bytes(bytes),
                        None => ToolValue::Json(r.clone()),
                    },
                    _ => ToolValue::Json(r.clone()),
                }
            }
            _ => ToolValue::Json(block),
        };
        items.push(item);
    }
    let value = match items.len() {
        0 => ToolValue::Json(Value::Null),
        1 => items.pop().unwrap_or(ToolValue::Json(Value::Null)),
        _ => ToolValue::List(items),
    };
    Answer {
        value: Ok(value),
        outcome: Outcome::Ok,
        reason: None,
        trace: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value(result: serde_json::Value) -> Result<ToolValue, String> {
        from_result(result, false).value.map_err(|(_, m)| m)
    }

    #[test]
    fn results_become_data() {
        assert_eq!(
            value(json!({"content": [{"type": "text", "text": "{\"a\": [1, 2]}"}]})),
            Ok(ToolValue::Json(json!({"a": [1, 2]})))
        );
        assert_eq!(
            value(json!({"content": [{"type": "text", "text": "plain words"}]})),
            Ok(ToolValue::Json(json!("plain words")))
        );
        assert_eq!(
            value(
                json!({"content": [{"type": "text", "text": "x"}], "structuredContent": {"n": 1}})
            ),
            Ok(ToolValue::Json(json!({"n": 1})))
        );
        assert_eq!(
            value(
                json!({"content": [{"type": "image", "data": "iVBORw==", "mimeType": "image/png"}, {"type": "text", "text": "7"}]})
            ),
            Ok(ToolValue::List(vec![
                ToolValue::Bytes(b"\x89PNG".to_vec()),
                ToolValue::Json(json!(7))
            ]))
        );
        assert_eq!(
            value(json!({"content": []})),
            Ok(ToolValue::Json(json!(null)))
        );
        let wrapped = json!({"content": [], "structuredContent": {"result": 42}});
        assert_eq!(
            from_result(wrapped.clone(), true).value.ok(),
            Some(ToolValue::Json(json!(42)))
        );
        assert_eq!(value(wrapped), Ok(ToolValue::Json(json!({"result": 42}))));
        assert_eq!(
            value(
                json!({"content": [{"type": "text", "text": "no such customer"}], "isError": true})
            ),
            Err("no such customer".into())
        );
    }

    #[test]
    fn frames_are_bounded() {
        let mut ok = &b"\x02\x00\x00\x00{}"[..];
        assert_eq!(channel::read(&mut ok, 10), Frame::Data(b"{}".to_vec()));
        assert_eq!(channel::read(&mut ok, 10), Frame::End);
        let breach = |mut bytes: &[u8]| match channel::read(&mut bytes, 10) {
            Frame::Broken(broken) => breach_message(broken),
            other => panic!("not a breach: {other:?}"),
        };
        assert!(breach(b"\xff\xff\xff\x7f").contains("over the limit"));
        assert!(breach(b"\x05\x00\x00\x00{}").contains("middle"));
    }
}
