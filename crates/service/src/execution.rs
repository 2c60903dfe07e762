//! The execution service: what each step of an execution does, whichever adapter it came
//! from; the order is the pipeline's (`pipeline/`). Limits within the key's ceilings
//! ([`resolve_limits`]) and jobs ([`job_from`]), refusals ([`refuse_if_unavailable`],
//! [`rejection`]), the answer's reservation ([`reserve_answer`]), the audit log's `started`
//! line ([`audit_start`]), the record, metrics and log line ([`finish`]); and the record read
//! back ([`record`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use airlock_api::{
    ExecuteRequest, ExecuteResponse, ExecutionRecord, Limits, LimitsRequest, Status,
};
use airlock_engine::{
    check_entrypoint, EngineError, Entrypoint, Execution, InputFile, Job, LimitError, Stdin,
};
use base64::Engine as _;

use crate::admission::Rejection;
use crate::answer::{answer_bytes, over_budget, Form};
use crate::budget::Share;
use crate::error::{Error, Kind};
use crate::keys::Key;
use crate::metrics::event;
use crate::services::SharedServices;

/// The ceilings for one key: its own where it has them, never above the engine's.
fn key_ceilings(global: &Limits, key: &LimitsRequest) -> Limits {
    Limits {
        timeout_ms: key
            .timeout_ms
            .map_or(global.timeout_ms, |k| k.min(global.timeout_ms)),
        memory_mb: key
            .memory_mb
            .map_or(global.memory_mb, |k| k.min(global.memory_mb)),
        cpu_ms: key.cpu_ms.map_or(global.cpu_ms, |k| k.min(global.cpu_ms)),
        pids: key.pids.map_or(global.pids, |k| k.min(global.pids)),
        disk_mb: key
            .disk_mb
            .map_or(global.disk_mb, |k| k.min(global.disk_mb)),
        output_bytes: key
            .output_bytes
            .map_or(global.output_bytes, |k| k.min(global.output_bytes)),
    }
}

/// The limits for one request: what it asks for, within the key's ceilings; what it leaves
/// out takes the defaults, brought down to the key's ceilings.
pub fn resolve_limits(
    state: &SharedServices,
    key: &Key,
    asked: &LimitsRequest,
) -> Result<Limits, Error> {
    let engine = state.engine.config();
    let c = key_ceilings(&engine.ceilings, &key.config.ceilings);
    let checks = [
        ("timeout_ms", asked.timeout_ms, c.timeout_ms),
        ("memory_mb", asked.memory_mb, c.memory_mb),
        ("cpu_ms", asked.cpu_ms, c.cpu_ms),
        ("pids", asked.pids.map(u64::from), u64::from(c.pids)),
        ("disk_mb", asked.disk_mb, c.disk_mb),
        ("output_bytes", asked.output_bytes, c.output_bytes),
    ];
    for (name, value, ceiling) in checks {
        if let Some(v) = value.filter(|v| *v > ceiling) {
            state.metrics.security_events.add(&[event::REJECTED_INPUT]);
            return Err(Error::new(
                Kind::Invalid,
                "limit_above_ceiling",
                format!("limits.{name} = {v} is above the ceiling of {ceiling} for this key"),
            )
            .field(format!("limits.{name}")));
        }
    }
    let r = engine.resolve_limits(asked).map_err(|e| {
        let name = match &e {
            LimitError::Zero { name } | LimitError::AboveCeiling { name, .. } => *name,
        };
        Error::invalid(format!("limits.{name}"), e.to_string())
    })?;
    Ok(Limits {
        timeout_ms: r.timeout_ms.min(c.timeout_ms),
        memory_mb: r.memory_mb.min(c.memory_mb),
        cpu_ms: r.cpu_ms.min(c.cpu_ms),
        pids: r.pids.min(c.pids),
        disk_mb: r.disk_mb.min(c.disk_mb),
        output_bytes: r.output_bytes.min(c.output_bytes),
    })
}

/// The limits of a background execution: its time and CPU within `[background]`'s ceiling
/// (its default when left out, CPU defaulting to the time), every other limit as for any
/// request. The key's own ceilings on time and CPU are for requests answered in place.
pub fn resolve_background_limits(
    state: &SharedServices,
    key: &Key,
    asked: &LimitsRequest,
) -> Result<Limits, Error> {
    let b = &state.config.background;
    for (name, value) in [("timeout_ms", asked.timeout_ms), ("cpu_ms", asked.cpu_ms)] {
        match value {
            Some(0) => {
                let zero = LimitError::Zero { name };
                return Err(Error::invalid(format!("limits.{name}"), zero.to_string()));
            }
            Some(v) if v > b.max_timeout_ms => {
                state.metrics.security_events.add(&[event::REJECTED_INPUT]);
                return Err(Error::new(
                    Kind::Invalid,
                    "limit_above_ceiling",
                    format!(
                        "limits.{name} = {v} is above the ceiling of {} for background \
                         executions (background.max_timeout_ms)",
                        b.max_timeout_ms
                    ),
                )
                .field(format!("limits.{name}")));
            }
            _ => {}
        }
    }
    let others = LimitsRequest {
        timeout_ms: None,
        cpu_ms: None,
        ..asked.clone()
    };
    let mut limits = resolve_limits(state, key, &others)?;
    limits.timeout_ms = asked.timeout_ms.unwrap_or(b.default_timeout_ms);
    limits.cpu_ms = asked.cpu_ms.unwrap_or(limits.timeout_ms);
    Ok(limits)
}

/// How long a job may run: as a request answered in place, or in the background.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    Request,
    Background,
}

/// Turns a request into a job, naming the field at fault for anything wrong with it; the
/// volumes it names are leased last, for `holder`, once nothing else can refuse it.
pub fn job_from(
    state: &SharedServices,
    key: &Key,
    mut req: ExecuteRequest,
    holder: &str,
    lifetime: Lifetime,
) -> Result<Job, Error> {
    let asked_volumes = std::mem::take(&mut req.volumes);
    let cfg = state.engine.config();
    let reject = |e: Error| {
        state.metrics.security_events.add(&[event::REJECTED_INPUT]);
        e
    };
    // Too many variables or files: refused before anything of them is decoded.
    state
        .engine
        .check_counts(req.env.len(), req.files.len())
        .map_err(|r| reject(refusal(r)))?;
    let entrypoint = entrypoint_from(req.entrypoint, req.inputs).map_err(reject)?;
    let limits = match lifetime {
        Lifetime::Request => resolve_limits(state, key, &req.limits)?,
        Lifetime::Background => resolve_background_limits(state, key, &req.limits)?,
    };
    let egress =
        crate::egress::for_request(state, key, req.egress, req.credentials).map_err(reject)?;
    let environment = crate::environments::for_request(state, req.environment.as_deref())?;
    // What only a request can get wrong (its encoding, a path given twice) is checked here;
    // sizes, counts, names and paths are the engine's to check (`Engine::check`).
    let mut seen = std::collections::HashSet::with_capacity(req.files.len());
    let mut files = Vec::with_capacity(req.files.len());
    for (i, f) in req.files.into_iter().enumerate() {
        if !seen.insert(f.path.clone()) {
            return Err(reject(Error::invalid(
                format!("files[{i}].path"),
                format!("{:?} is given twice", f.path),
            )));
        }
        let data = match f.encoding {
            airlock_api::Encoding::Utf8 => f.content.into_bytes(),
            airlock_api::Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(f.content.as_bytes())
                .map_err(|e| {
                    reject(Error::invalid(
                        format!("files[{i}].content"),
                        format!("not base64: {e}"),
                    ))
                })?,
        };
        files.push(InputFile { path: f.path, data });
    }
    let mut job = Job {
        code: req.code,
        filename: "main.py".into(),
        stdin: Stdin::Bytes(req.stdin.into_bytes()),
        env: req.env.into_iter().collect(),
        files,
        entrypoint,
        limits,
        max_code_bytes: cfg.max_code_bytes,
        stream: false,
        echo_traceback: false,
        cancel: None,
        tools: crate::tools::for_key(state, key).map(|t| t as Arc<dyn airlock_engine::ToolBridge>),
        egress,
        environment,
        volumes: Vec::new(),
    };
    state.engine.check(&job).map_err(|e| match e {
        EngineError::Invalid(r) => reject(refusal(r)),
        e => Error::internal(e.to_string()),
    })?;
    job.volumes = crate::volumes::mounts(state, key, holder, &asked_volumes)?;
    Ok(job)
}

/// The engine's refusal of a job, as the API answers it.
pub fn refusal(r: airlock_engine::Refusal) -> Error {
    match r.kind {
        airlock_engine::RefusalKind::TooLarge => Error::too_large(r.field, r.message),
        airlock_engine::RefusalKind::Invalid => Error::invalid(r.field, r.message),
    }
}

/// Function mode from a request's `entrypoint` and `inputs`, checked (no inputs without an
/// entrypoint, a dotted name, bounded nesting).
pub fn entrypoint_from(
    name: Option<String>,
    inputs: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<Option<Entrypoint>, Error> {
    let entrypoint = match (name, inputs) {
        (Some(name), inputs) => Entrypoint {
            name,
            inputs: inputs.unwrap_or_default(),
        },
        (None, Some(_)) => {
            return Err(Error::invalid(
                "inputs",
                "inputs are the keyword arguments of an entrypoint: name one",
            ))
        }
        (None, None) => return Ok(None),
    };
    check_entrypoint(&entrypoint).map_err(|(field, m)| Error::invalid(field, m))?;
    Ok(Some(entrypoint))
}

pub fn rejection(r: Rejection) -> Error {
    match r {
        Rejection::RateLimited(secs) => Error::new(
            Kind::RateLimited,
            "rate_limited",
            "this key's rate limit is reached",
        )
        .retry_after(secs),
        Rejection::KeyBusy => Error::new(
            Kind::RateLimited,
            "rate_limited",
            "this key already runs and queues as many executions as it may",
        )
        .retry_after(1),
        Rejection::Overloaded => Error::new(
            Kind::Unavailable,
            "overloaded",
            "every slot and the queue are full",
        )
        .retry_after(1),
        Rejection::QueueTimeout => Error::new(
            Kind::Unavailable,
            "overloaded",
            "waited too long for a free slot",
        )
        .retry_after(1),
        Rejection::ShuttingDown => Error::shutting_down(),
    }
}

pub use crate::services::refuse_if_unavailable;

/// What the audit record needs besides the result.
pub struct Context {
    pub id: String,
    pub request_id: String,
    pub key: String,
    pub key_fingerprint: String,
    pub started_at: String,
    pub code_sha256: String,
    pub code_bytes: u64,
    /// The limits its `started` line gives, for a final record when it never ran.
    pub limits: Limits,
    /// Who cancelled it, if anyone the record should name did (a background execution's
    /// `DELETE`): asked when its record is written, which then says so beside its
    /// `internal_error`.
    pub cancelled: Option<Box<dyn Fn() -> Option<String> + Send>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("id", &self.id)
            .field("request_id", &self.request_id)
            .field("key_fingerprint", &self.key_fingerprint)
            .field("code_sha256", &self.code_sha256)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Execution `id` of `job` by `key`, starting now (hashes the code: CPU work for a large
    /// one, so called off the async workers); its tool calls are audited under its id.
    pub fn for_job(key: &Key, request_id: String, job: &Job, id: String) -> Context {
        let sha = airlock_api::sha256_hex(job.code.as_bytes());
        let ctx = Context::new(id, key, request_id, sha, job.code.len() as u64, &job.limits);
        if let Some(tools) = &job.tools {
            tools.bind(&ctx.id);
        }
        if let Some(egress) = &job.egress {
            egress.begin(&ctx.id);
        }
        ctx
    }

    /// Execution `id` of `code` by `key` under `limits`, starting now (hashes the code).
    pub fn for_code(
        key: &Key,
        request_id: String,
        code: &str,
        limits: &Limits,
        id: String,
    ) -> Context {
        let sha = airlock_api::sha256_hex(code.as_bytes());
        Context::new(id, key, request_id, sha, code.len() as u64, limits)
    }

    /// A new execution of `key`, starting now.
    fn new(
        id: String,
        key: &Key,
        request_id: String,
        code_sha256: String,
        code_bytes: u64,
        limits: &Limits,
    ) -> Context {
        Context {
            id,
            request_id,
            key: key.name().to_owned(),
            key_fingerprint: key.fingerprint(),
            started_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            code_sha256,
            code_bytes,
            limits: limits.clone(),
            cancelled: None,
        }
    }
}

/// Reserves what an execution's answer can hold (429 or 503 when it does not fit the key's
/// share or everyone's), before it queues: what a key has in flight and unread never holds
/// more than its share.
pub fn reserve_answer(
    state: &SharedServices,
    key: &Key,
    limits: &Limits,
    form: Form,
) -> Result<Share, Error> {
    let bytes = answer_size(state, limits, form)?;
    state.memory.reserve(key, bytes).map_err(|over| {
        state
            .metrics
            .security_events
            .add(&[event::ANSWER_OVER_BUDGET]);
        over_budget(over, "answers")
    })
}

/// The most an answer under `limits` can hold; refused when that would never fit a key's
/// share, however long the client waited (a session's cells at 64 MiB of output, over MCP):
/// the error says what to change.
pub fn answer_size(state: &SharedServices, limits: &Limits, form: Form) -> Result<u64, Error> {
    let bytes = answer_bytes(state.engine.config(), limits, form);
    let share = state.config.http.max_buffered_bytes_per_key;
    if bytes > share {
        return Err(Error::new(
            Kind::Invalid,
            "limit_above_ceiling",
            format!(
                "limits.output_bytes = {} makes an answer that may hold {bytes} bytes, more than \
                 this key's share of {share} (http.max_buffered_bytes_per_key)",
                limits.output_bytes
            ),
        )
        .field("limits.output_bytes"));
    }
    Ok(bytes)
}

/// The audit log's `started` line; when it cannot be written, the execution is refused and
/// so is every later one.
pub fn audit_start(state: &SharedServices, ctx: &Context) -> Result<(), Error> {
    use std::borrow::Cow::Borrowed;
    let started = crate::audit_lines::StartedLine {
        event: Borrowed("started"),
        id: Borrowed(&ctx.id),
        request_id: Borrowed(&ctx.request_id),
        key: Borrowed(&ctx.key),
        key_fingerprint: Borrowed(&ctx.key_fingerprint),
        started_at: Borrowed(&ctx.started_at),
        code_sha256: Borrowed(&ctx.code_sha256),
        code_bytes: ctx.code_bytes,
        limits: Borrowed(&ctx.limits),
    };
    state.audit.append_started(&started).map_err(|e| {
        tracing::warn!(request_id = %ctx.request_id, error = %e, "refused: the audit log cannot be written");
        crate::services::audit_unavailable(&e.to_string())
    })
}

/// Why an execution the audit log has a `started` line for did not run, as the client hears it.
fn engine_error(ctx: &Context, e: EngineError) -> Error {
    match e {
        EngineError::Cancelled => Error::shutting_down(),
        // The host's fault, not the request's (too few open files, the interpreter gone):
        // named, and worth a retry.
        e @ (EngineError::Spawn(_) | EngineError::Io { .. }) => {
            tracing::error!(request_id = %ctx.request_id, error = %e, "cannot start a sandbox");
            Error::new(Kind::Unavailable, "unavailable", e.to_string())
        }
        EngineError::Invalid(r) => refusal(r),
        e => {
            tracing::error!(request_id = %ctx.request_id, error = %e, "execution failed");
            Error::internal("the execution failed inside airlock")
        }
    }
}

/// The final record of an execution that never ran (refused by the engine, cancelled before
/// its sandbox started, or a sandbox that could not start): `internal_error`, nothing used.
pub fn record_unrun(state: &SharedServices, ctx: &Context) {
    tracing::warn!(
        request_id = %ctx.request_id,
        execution = %ctx.id,
        key = %ctx.key,
        status = %Status::InternalError,
        "execution ended before its sandbox ran"
    );
    append_record(
        state,
        ctx,
        Status::InternalError,
        (None, None),
        &ctx.limits,
        &[],
        &airlock_api::Usage::default(),
    );
}

/// What the record of an execution cancelled by someone it names says of it.
fn cancelled(ctx: &Context, status: Status) -> Option<airlock_api::ErrorInfo> {
    if status != Status::InternalError {
        return None;
    }
    let message = ctx.cancelled.as_ref()?()?;
    Some(airlock_api::ErrorInfo {
        kind: "Cancelled".into(),
        message,
        traceback: None,
    })
}

/// Appends an execution's final record; a failed write stops every later execution.
fn append_record(
    state: &SharedServices,
    ctx: &Context,
    status: Status,
    (exit_code, signal): (Option<i32>, Option<i32>),
    limits: &Limits,
    limits_hit: &[airlock_api::LimitKind],
    usage: &airlock_api::Usage,
) {
    let record = ExecutionRecord {
        id: ctx.id.clone(),
        request_id: ctx.request_id.clone(),
        key: ctx.key.clone(),
        key_fingerprint: ctx.key_fingerprint.clone(),
        started_at: ctx.started_at.clone(),
        code_sha256: ctx.code_sha256.clone(),
        code_bytes: ctx.code_bytes,
        status,
        exit_code,
        signal,
        limits: limits.clone(),
        limits_hit: limits_hit.to_vec(),
        usage: usage.clone(),
        interrupted: false,
        error: cancelled(ctx, status),
    };
    // The result is the client's all the same: a record that cannot be written is kept (and
    // served by id) until the log can be written again; nothing new runs meanwhile.
    let _ = state.audit.append(&record);
}

/// Metrics, the audit record and the log line for one execution; the response.
pub fn finish(
    state: &SharedServices,
    ctx: Context,
    ran: Result<Execution, EngineError>,
) -> Result<ExecuteResponse, Error> {
    let execution = match ran {
        Ok(execution) => execution,
        Err(e) => {
            if let EngineError::Spawn(_) | EngineError::Io { .. } = &e {
                state.lifecycle.sandboxes_failed(&e.to_string());
            }
            // Its `started` line is written: it gets a final record all the same.
            record_unrun(state, &ctx);
            return Err(engine_error(&ctx, e));
        }
    };
    // Its sandbox could not be built (a path it mounts is gone): the host's fault. A cancelled
    // execution (its client went away) says nothing about the host either way.
    if execution.setup_failed {
        let why = execution
            .result
            .error
            .as_ref()
            .map_or("", |e| e.message.as_str());
        state.lifecycle.sandboxes_failed(why);
    } else if execution.result.status != Status::InternalError {
        state.lifecycle.sandboxes_work();
    }
    state.telemetry.executed(crate::telemetry::Executed {
        id: &ctx.id,
        status: execution.result.status.as_str(),
        code_sha256: &ctx.code_sha256,
        code_bytes: ctx.code_bytes,
        pooled: execution.pooled,
        forked: execution.forked,
        timings: &execution.timings,
    });
    let (result, pooled, forked) = (execution.result, execution.pooled, execution.forked);
    let m = &state.metrics;
    m.executions.add(&[result.status.as_str()]);
    m.execution_seconds
        .observe(Duration::from_millis(result.usage.wall_ms));
    if let Some(ready) = execution.sandbox_ready {
        m.sandbox_start_seconds.observe(ready);
        if !pooled {
            m.sandbox_made_seconds.observe(ready);
        }
    }
    let kind = match result.status {
        Status::PolicyViolation => Some(event::SECCOMP_KILL),
        Status::MemoryLimit => Some(event::MEMORY_KILL),
        Status::Timeout => Some(event::TIMEOUT),
        _ => None,
    };
    if let Some(kind) = kind {
        m.security_events.add(&[kind]);
    }
    if result.stdout_truncated || result.stderr_truncated {
        m.security_events.add(&[event::OUTPUT_TRUNCATED]);
    }
    append_record(
        state,
        &ctx,
        result.status,
        (result.exit_code, result.signal),
        &result.limits,
        &result.limits_hit,
        &result.usage,
    );
    tracing::info!(
        request_id = %ctx.request_id,
        execution = %ctx.id,
        key = %ctx.key,
        status = %result.status,
        wall_ms = result.usage.wall_ms,
        pooled,
        forked,
        "execution"
    );
    Ok(ExecuteResponse { id: ctx.id, result })
}

/// How long a record read may wait for the database.
const READ_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn store_unreadable(why: &str) -> Error {
    tracing::warn!(error = %why, "cannot read a record");
    Error::new(
        Kind::Unavailable,
        "unavailable",
        format!("the record cannot be read now: {why}"),
    )
    .retry_after(1)
}

/// `key`'s record of execution `id` (`GET /v1/executions/{id}`).
pub async fn record(state: &SharedServices, key: &Key, id: &str) -> Result<ExecutionRecord, Error> {
    // Another key's execution is as absent as one that never was.
    // The PostgreSQL store may query the database.
    let (st, wanted) = (state.clone(), id.to_owned());
    let read = tokio::task::spawn_blocking(move || st.audit.get(&wanted));
    // A database that stops answering makes this a 503, not a request that never ends.
    let found = match tokio::time::timeout(READ_WAIT, read).await {
        Ok(Ok(Ok(found))) => found,
        Ok(Ok(Err(e))) => return Err(store_unreadable(&e.to_string())),
        Ok(Err(e)) => return Err(Error::internal(format!("reading a record: {e}"))),
        Err(_) => {
            let why = format!("PostgreSQL did not answer in {} s", READ_WAIT.as_secs());
            return Err(store_unreadable(&why));
        }
    };
    match found {
        Some(record) if record.key_fingerprint == key.fingerprint() => Ok(record),
        _ => Err(no_record(state, id)),
    }
}

/// What [`record`] answers for an id it holds no record of for the caller.
pub fn no_record(state: &SharedServices, id: &str) -> Error {
    // With a shared store every replica holds every record: a miss is just a miss.
    if state.config.store.url.is_some() {
        Error::not_found()
    } else {
        crate::services::not_here(state, id, "execution")
    }
}
