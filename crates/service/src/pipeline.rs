//! The execution pipeline: the one owner of the order every execution-like request takes,
//! whichever transport brought it and whatever it runs (a one-shot execution, function mode,
//! a session's cell; a session's opening takes the steps that apply to it):
//!
//! 1. **enter**: refused while shutting down or while the audit log cannot be written; a
//!    cell's session found (404 before a byte of body); a place among the key's requests in
//!    flight and under its rate limit (`Admission::enter`), before a byte of body;
//! 2. **body**: read within its size, its time and the memory budget for bodies, whose share
//!    it holds until it is admitted to run;
//! 3. **job**: parsed and checked, on a blocking thread unless the body is small (big bodies
//!    are CPU work): limits within the key's ceilings, then `Engine::check`
//!    (`execution::job_from`), or a cell's checks and its session claimed
//!    (`sessions::prepare_cell`);
//! 4. **reserve**: the most its answer can hold, before it queues (`reserve_answer`);
//! 5. **admit**: a running slot (`Admission::admit`); the body's share goes back;
//! 6. **audit**: the `started` line: nothing runs that the audit log has not heard of;
//! 7. **engine**: the sandbox runs, to its end even if the client goes (it is then cancelled,
//!    or the session closed, at once); the slot is held until the sandbox is gone;
//! 8. **finish**: metrics, the final record, the log line; the answer made within its
//!    reservation, or the stream's last event.
//!
//! Steps 6 to 8 run on one blocking thread that nothing cancels, so that every `started`
//! line gets its record. A background execution ([`submit`]) takes steps 1 to 3 while its
//! client waits, is answered, and takes the rest on a task of its own: its turn among
//! background work, then 4 (waited for rather than refused) to 8, its output into its events
//! log (`background.rs`). The pipeline takes a transport-free [`Request`] and yields a
//! transport-free [`Outcome`] or an [`Error`]; the adapters map them (HTTP: statuses and
//! server-sent events; MCP: tool results). A transport that must take in a whole message
//! before it knows the work it holds (MCP over HTTP) takes steps 1 and 2 for it with
//! [`receive`], and hands the result over ([`Received`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use airlock_api::{
    CellRequest, CellResponse, ExecuteRequest, ExecuteResponse, Limits, SessionInfo, SessionRequest,
};
use airlock_engine::{Cancel, Discard, Job, OutputSink};

use crate::admission::{Admitted, Entered};
use crate::answer::Form;
use crate::background::{self, Ended, Live};
use crate::body::{parse_json, read_body, Body};
use crate::budget::Share;
use crate::error::Error;
use crate::execution::{
    answer_size, audit_start, finish, job_from, record_unrun, refuse_if_unavailable, rejection,
    reserve_answer, Context, Lifetime,
};
use crate::keys::Key;
use crate::open_sessions::OpenSession;
use crate::parked;
use crate::services::{SharedServices, Tracked};
use crate::sessions::{self, PreparedCell};
use crate::stream::{self, EventStream};

/// An execution-like request, as the transport hands it over.
pub struct Request {
    pub caller: Arc<Key>,
    pub request_id: String,
    pub work: Work,
    /// Steps 1 and 2, when the transport took them ([`receive`]); the pipeline takes them
    /// otherwise.
    pub received: Option<Received>,
    /// Whether the caller takes the output as it comes ([`Outcome::Streamed`]).
    pub stream: bool,
    /// How the answer is made, which decides the most it can hold.
    pub form: Form,
    /// Told of each of its tool calls that waits for an approval (an MCP host asked by
    /// elicitation); a stream's client gets an `approval_requested` event anyway.
    pub approvals: Option<airlock_tools::Watcher>,
    /// Told of the output as it comes when the answer is not streamed (an MCP call's
    /// progress), in place of [`Discard`]; it must not block. The program's stdout is then
    /// line-buffered, as for a stream, so what it prints is seen as it is printed.
    pub observer: Option<Box<dyn OutputSink>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("request_id", &self.request_id)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

/// What a request asks to run. One lives per request, moved once or twice: boxing the
/// larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Work {
    /// A one-shot execution (function mode when it names an entrypoint).
    Execute(Input<ExecuteRequest>),
    /// A cell of one of the caller's sessions.
    Cell {
        session: String,
        input: Input<CellRequest>,
    },
}

/// Where the request's arguments are.
#[derive(Debug)]
pub enum Input<T> {
    /// In a JSON body still to be read (step 2).
    Body(Body),
    /// Already parsed by the transport (MCP's tool arguments).
    Given(T),
}

/// What a request holds from steps 1 and 2: its place among its key's requests in flight,
/// held until it is answered, and its body's memory, held until it is admitted to run.
#[derive(Debug)]
pub struct Received {
    _entered: Entered,
    body: Option<Share>,
}

/// What came of a request.
#[derive(Debug)]
pub enum Outcome<T> {
    /// It ran to its end: its answer, made by the transport's `present`.
    Done(T),
    /// It runs on: its events as they come, the result last. The stream holds the answer's
    /// reservation; dropping it stops the work.
    Streamed(EventStream),
}

/// What an execution-like request ran to: the record of one execution or of one cell.
#[derive(Debug)]
pub enum Finished {
    Execution(ExecuteResponse),
    Cell(CellResponse),
}

impl Finished {
    fn result_mut(&mut self) -> &mut airlock_api::ExecutionResult {
        match self {
            Finished::Execution(r) => &mut r.result,
            Finished::Cell(r) => &mut r.result,
        }
    }
}

impl serde::Serialize for Finished {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Finished::Execution(r) => r.serialize(s),
            Finished::Cell(r) => r.serialize(s),
        }
    }
}

/// Steps 1 (but the refusals, which are each piece of work's) and 2 for a whole message whose
/// work is not known yet: a place among the key's requests in flight, then the body.
pub async fn receive(
    state: &SharedServices,
    key: &Key,
    body: Body,
) -> Result<(Received, Vec<u8>), Error> {
    let mut received = enter(state, key)?;
    let read = read_body(state, key, body).await?;
    received.body = Some(read.share);
    Ok((received, read.bytes))
}

/// A place among the key's requests in flight, within its rate limit.
fn enter(state: &SharedServices, key: &Key) -> Result<Received, Error> {
    let entered = state.admission.enter(key).map_err(rejection)?;
    Ok(Received {
        _entered: entered,
        body: None,
    })
}

/// Steps 1 and 2: the place taken here unless the transport took it, then the body if the
/// arguments are in one.
async fn arrive<T>(
    state: &SharedServices,
    key: &Key,
    received: Option<Received>,
    input: Input<T>,
) -> Result<(Received, Arguments<T>), Error> {
    let mut received = match received {
        Some(received) => received,
        None => enter(state, key)?,
    };
    let arguments = match input {
        Input::Body(body) => {
            let read = read_body(state, key, body).await?;
            received.body = Some(read.share);
            Arguments::Json(read.bytes)
        }
        Input::Given(given) => Arguments::Given(given),
    };
    Ok((received, arguments))
}

/// A request's arguments after step 2: JSON to parse, or parsed.
enum Arguments<T> {
    Json(Vec<u8>),
    Given(T),
}

impl<T: serde::de::DeserializeOwned> Arguments<T> {
    fn parse(self, state: &SharedServices) -> Result<T, Error> {
        match self {
            Arguments::Json(bytes) => parse_json(state, &bytes),
            Arguments::Given(given) => Ok(given),
        }
    }
}

/// Bodies up to this size are parsed and checked on the async worker: a blocking thread's
/// hand-off (two threads woken, four context switches) costs more than that work does.
const INLINE_BYTES: usize = 16 << 10;

/// Step 3: `f` makes the work from the parsed arguments, on the async worker for a small body
/// that `on_disk` says reads nothing from the disk, else on a blocking thread (big bodies are
/// CPU work, and arguments the transport parsed may hold large files to decode).
async fn prepare<T, R>(
    state: &SharedServices,
    what: &str,
    arguments: Arguments<T>,
    on_disk: impl FnOnce(&T) -> bool,
    f: impl FnOnce(&SharedServices, T) -> Result<R, Error> + Send + 'static,
) -> Result<R, Error>
where
    T: serde::de::DeserializeOwned + Send + 'static,
    R: Send + 'static,
{
    let st = state.clone();
    match arguments {
        Arguments::Json(bytes) if bytes.len() <= INLINE_BYTES => {
            let parsed = parse_json(state, &bytes)?;
            if !on_disk(&parsed) {
                return f(state, parsed);
            }
            blocking(what, move || f(&st, parsed)).await
        }
        arguments => blocking(what, move || f(&st, arguments.parse(&st)?)).await,
    }
}

/// Runs `f` on a blocking thread: CPU work (parsing, checking, hashing) off the async
/// workers.
async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("{what}: {e}")))?
}

/// The work checked and ready to run (step 3). One lives per request, moved a few times:
/// boxing the job would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Ready {
    Execute(Job),
    Cell(PreparedCell),
}

impl Ready {
    fn limits(&self) -> &Limits {
        match self {
            Ready::Execute(job) => &job.limits,
            Ready::Cell(cell) => cell.limits(),
        }
    }
}

/// Runs `request` through every step in order. `present` makes the answer of work that ran
/// to its end from what it finished with and the answer's reservation, on the blocking
/// thread (serializing a large answer is CPU work); a streamed request's answer is its
/// events.
pub async fn run<T: Send + 'static>(
    state: &SharedServices,
    request: Request,
    present: impl FnOnce(Finished, Share) -> T + Send + 'static,
) -> Result<Outcome<T>, Error> {
    let Request {
        caller,
        request_id,
        work,
        received,
        stream,
        form,
        approvals: watcher,
        mut observer,
    } = request;
    let trace = state.telemetry.request_span(&request_id);
    let (mut received, ready) = arrive_and_prepare(
        state,
        &caller,
        &request_id,
        work,
        received,
        Lifetime::Request,
    )
    .await?;
    // 4. reserve: the most its answer can hold, from now until it is written out.
    let answer = reserve_answer(state, &caller, ready.limits(), form)?;
    // 5. admit; the job leaves the queue for its sandbox: its body no longer waits here.
    let waiting = state.telemetry.phase(trace.as_ref(), "admission_wait");
    let admitted = state.admission.admit(&caller).await.map_err(rejection)?;
    drop(waiting);
    received.body = None;
    // Shutdown may have begun while this request waited.
    refuse_if_unavailable(state)?;
    // What stops the work if its client goes: the sandbox killed, or the session closed.
    let answered = Arc::new(AtomicBool::new(false));
    let (ready, stop, tracked) = match ready {
        Ready::Execute(mut job) => {
            let cancel = Cancel::default();
            job.cancel = Some(cancel.clone());
            // Line-buffered when streamed or observed: print() is seen as it happens.
            job.stream = stream || observer.is_some();
            let tracked = state.track(cancel.clone());
            (Ready::Execute(job), Stop::Cancel(cancel), Some(tracked))
        }
        Ready::Cell(cell) => {
            let session = cell.session();
            (Ready::Cell(cell), Stop::Session(session), None)
        }
    };
    let stopper = Stopper {
        stop,
        answered: answered.clone(),
    };
    let mut on_drop = StopOnDrop(Some(stopper.clone()));
    // A stream's place travels with its execution; a plain answer's is held here.
    let (travelling, waiting) = if stream {
        (Some(received), None)
    } else {
        (None, Some(received))
    };
    // Steps 6 to 8 on one blocking thread, to their end even if the client goes: a `started`
    // line always gets its record.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let st = state.clone();
    let task = tokio::task::spawn_blocking(move || {
        let state = &st;
        // 6. audit.
        let ctx = match &ready {
            Ready::Execute(job) => Context::for_job(state, &caller, request_id, job),
            Ready::Cell(cell) => {
                let ctx = Context::for_code(state, &caller, request_id, cell.code(), cell.limits());
                cell.begin(&caller, &ctx.id);
                ctx
            }
        };
        if let Err(e) = audit_start(state, &ctx) {
            let _ = started_tx.send(Err(e));
            return None;
        }
        let _traced = state.telemetry.execution(&ctx.id, trace.as_ref());
        let execution_id = ctx.id.clone();
        let watch = |watcher: Option<airlock_tools::Watcher>| {
            watcher.and_then(|w| crate::approvals::watch(state, &execution_id, w))
        };
        if stream {
            let gone = stopper.clone();
            let (events, mut sink) = stream::channel(Arc::new(move || gone.stop()), answer);
            let aside = sink.aside();
            let event: airlock_tools::Watcher = Arc::new(move |_, approval| {
                let data = serde_json::to_value(&**approval).unwrap_or_default();
                aside.send("approval_requested", &data);
            });
            // Dropped before the last event: its sender would keep the stream open.
            let watching = watch(Some(event));
            // A client gone meanwhile drops the stream, which stops the work: it still gets
            // its record.
            let _ = started_tx.send(Ok(Some(events)));
            let request_id = ctx.request_id.clone();
            let done =
                engine_and_finish(state, ctx, ready, &mut sink, admitted, tracked, &answered);
            drop(watching);
            drop(travelling);
            sink.end(
                done.map(|mut finished| {
                    stream::without_output(finished.result_mut());
                    finished
                }),
                &request_id,
            );
            None
        } else {
            let _ = started_tx.send(Ok(None));
            let _watching = watch(watcher);
            let sink: &mut dyn OutputSink = match observer.as_deref_mut() {
                Some(observer) => observer,
                None => &mut Discard,
            };
            let done = engine_and_finish(state, ctx, ready, sink, admitted, tracked, &answered);
            Some(done.map(|finished| present(finished, answer)))
        }
    });
    let outcome = match started_rx.await {
        Err(_) => Err(Error::internal("the execution task failed")),
        Ok(Err(e)) => Err(e),
        Ok(Ok(Some(events))) => Ok(Outcome::Streamed(events)),
        Ok(Ok(None)) => match task.await {
            Ok(Some(done)) => done.map(Outcome::Done),
            Ok(None) => Err(Error::internal("the execution task failed")),
            Err(e) => Err(Error::internal(format!("the execution task failed: {e}"))),
        },
    };
    // Answered, refused by the audit log, or handed to its stream (whose end stops it).
    on_drop.0 = None;
    drop(waiting);
    outcome
}

/// A background execution (`POST /v1/executions`): steps 1 to 3 while its client waits, then
/// it is stored (its job too, read back when its turn comes) and answered at once; the rest
/// runs on a task of its own, to its end whether or not anyone listens: its turn among
/// background work (`[background]`), 4. its answer's
/// reservation (waited for, not refused: nobody waits on it), 5. a slot (waited for as long as
/// it takes), 6 to 8 as for any execution, its output into its events log. What it ran to is
/// stored by `background::Background::end`.
pub async fn submit(state: &SharedServices, request: Request) -> Result<background::Meta, Error> {
    let Request {
        caller,
        request_id,
        work,
        received,
        form,
        ..
    } = request;
    let (received, ready) = arrive_and_prepare(
        state,
        &caller,
        &request_id,
        work,
        received,
        Lifetime::Background,
    )
    .await?;
    let Ready::Execute(job) = ready else {
        return Err(Error::internal("only executions run in the background"));
    };
    // What it holds while it runs is a JSON answer's; the form it will be read in (an MCP
    // result, whole in memory) must fit the key's share too, or it could never be read.
    answer_size(state, &job.limits, form)?;
    let answer_bytes = answer_size(state, &job.limits, Form::Json)?;
    let st = state.clone();
    // Its spans join the submission's trace, after the 202.
    let trace = state.telemetry.request_span(&request_id);
    // From here it goes on whether or not its client waits for the answer: a task of its own,
    // so that nothing it stored is left without one.
    let (stored_tx, stored_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (bg, key, rid, id) = (
            st.clone(),
            caller.clone(),
            request_id.clone(),
            st.held_id("ex_"),
        );
        // Stored, and what is large in its job parked on the disk rather than held in memory
        // (it may wait for hours); sizing, writing and syncing off the async workers.
        let stored = blocking("storing the background execution", move || {
            let size = parked::size(&job);
            let live = bg.background.submit(&key, id, &rid, &job.limits, size)?;
            // Withdrawn unless parked, even by a panic: a submission no task waits for
            // would hold its key's turn for good.
            let mut unparked = Withdraw(Some((&bg, &live)));
            let job = live.park(job)?;
            unparked.0 = None;
            drop(unparked);
            Ok((live, job))
        })
        .await;
        let (live, job) = match stored {
            Ok(stored) => stored,
            Err(e) => {
                let _ = stored_tx.send(Err(e));
                return;
            }
        };
        let _ = stored_tx.send(Ok(live.meta()));
        in_background(&st, caller, request_id, job, &live, answer_bytes, trace).await;
    });
    let meta = stored_rx
        .await
        .map_err(|_| Error::internal("storing the background execution failed"))??;
    // Answered: its place among the key's requests and its body's memory are given back.
    drop(received);
    Ok(meta)
}

/// The steps of a background execution after its answer (see [`submit`]).
async fn in_background(
    state: &SharedServices,
    caller: Arc<Key>,
    request_id: String,
    job: Job,
    live: &Arc<Live>,
    answer_bytes: u64,
    trace: Option<crate::telemetry::Trace>,
) {
    let bg = &state.background;
    let stopped = |error: Error, had_turn: bool| {
        bg.end(live, Ended::Not(error), state.is_shutting_down(), had_turn);
    };
    let turn = tokio::select! {
        turn = bg.turn(live) => turn,
        () = state.shutdown_begun() => None,
    };
    let Some(turn) = turn else {
        return stopped(Error::shutting_down(), false);
    };
    let unparking = live.clone();
    let mut job = match blocking("reading the job back", move || unparking.unpark(job)).await {
        Ok(job) => job,
        Err(e) => return stopped(e, true),
    };
    // 4. reserve: the reservation waits for room; nobody is refused for it now.
    let answer = tokio::select! {
        biased;
        () = live.cancelled() => return stopped(Error::shutting_down(), true),
        () = state.shutdown_begun() => return stopped(Error::shutting_down(), true),
        share = state.memory.reserve_waiting(&caller, answer_bytes) => share,
    };
    // 5. admit, as long as it takes.
    let waiting = state.telemetry.phase(trace.as_ref(), "admission_wait");
    let admitted = tokio::select! {
        admitted = state.admission.admit_waiting(&caller) => admitted.map_err(rejection),
        () = live.cancelled() => Err(Error::shutting_down()),
    };
    drop(waiting);
    let admitted = match admitted.and_then(|a| refuse_if_unavailable(state).map(|()| a)) {
        Ok(admitted) => admitted,
        Err(e) => return stopped(e, true),
    };
    job.cancel = Some(live.cancel.clone());
    // Line-buffered: print() reaches the log as it happens.
    job.stream = true;
    let tracked = state.track(live.cancel.clone());
    // Output held back for the log is written a little later at most.
    let flushing = live.clone();
    let flusher = tokio::spawn(async move { flushing.flush_held().await });
    let (st, after) = (state.clone(), live.clone());
    let live = live.clone();
    let ran = tokio::task::spawn_blocking(move || {
        let state = &st;
        // 6. audit.
        let mut ctx = Context::for_job_as(&caller, request_id, &job, live.id.clone());
        let deleted = live.clone();
        ctx.cancelled = Some(Box::new(move || {
            deleted.is_cancelled().then(|| {
                format!(
                    "cancelled by its key (DELETE /v1/executions/{}) before it ended",
                    deleted.id
                )
            })
        }));
        if let Err(e) = audit_start(state, &ctx) {
            drop((admitted, tracked));
            state
                .background
                .end(&live, Ended::Not(e), state.is_shutting_down(), true);
            return;
        }
        live.running(&ctx.started_at);
        let _traced = state.telemetry.execution(&ctx.id, trace.as_ref());
        let aside = live.clone();
        let event: airlock_tools::Watcher = Arc::new(move |_, approval| {
            let data = serde_json::to_value(&**approval).unwrap_or_default();
            aside.event("approval_requested", &data);
        });
        let watching = crate::approvals::watch(state, &ctx.id, event);
        let mut sink = live.sink();
        let answered = AtomicBool::new(false);
        // 7 and 8.
        let done = engine_and_finish(
            state,
            ctx,
            Ready::Execute(job),
            &mut sink,
            admitted,
            Some(tracked),
            &answered,
        );
        sink.flush();
        drop(watching);
        let ended = match done {
            Ok(Finished::Execution(response)) => Ended::Ran(Box::new(response)),
            Ok(Finished::Cell(_)) => Ended::Not(Error::internal("a cell ran in the background")),
            Err(e) => Ended::Not(e),
        };
        state
            .background
            .end(&live, ended, state.is_shutting_down(), true);
        // Stored: the answer's memory is free.
        drop(answer);
    })
    .await;
    if let Err(e) = ran {
        tracing::error!(error = %e, "a background execution's task failed");
        // It still ends, its counts given back, rather than stay `running` until a restart.
        if !after.has_ended() {
            let error = Error::internal("the execution failed inside airlock");
            state
                .background
                .end(&after, Ended::Not(error), state.is_shutting_down(), true);
        }
    }
    flusher.abort();
    drop(turn);
}

/// Steps 1 to 3: enter, the body, the work checked and ready.
async fn arrive_and_prepare(
    state: &SharedServices,
    caller: &Arc<Key>,
    request_id: &str,
    work: Work,
    received: Option<Received>,
    lifetime: Lifetime,
) -> Result<(Received, Ready), Error> {
    // 1. enter, and 2. the body.
    refuse_if_unavailable(state)?;
    Ok(match work {
        Work::Execute(input) => {
            let (received, arguments) = arrive(state, caller, received, input).await?;
            // 3. the job (a named environment is looked up on the disk, a volume mounted).
            let key = caller.clone();
            let holder = format!("the execution of request {request_id}");
            let job = prepare(
                state,
                "preparing the request",
                arguments,
                |req: &ExecuteRequest| req.environment.is_some() || !req.volumes.is_empty(),
                move |st, req| job_from(st, &key, req, &holder, lifetime),
            )
            .await?;
            (received, Ready::Execute(job))
        }
        Work::Cell { session, input } => {
            // A paused session comes back first (before a byte of body is read).
            let (entry, resumed) =
                crate::snapshots::find_or_resume(state, caller, &session).await?;
            let (received, arguments) = arrive(state, caller, received, input).await?;
            // 3. the cell's checks, and its session claimed.
            let key = caller.clone();
            let cell = prepare(
                state,
                "preparing the cell",
                arguments,
                |_: &CellRequest| false,
                move |st, req| sessions::prepare_cell(st, &key, entry, req),
            )
            .await?
            .resumed(resumed);
            (received, Ready::Cell(cell))
        }
    })
}

/// Steps 7 and 8: the engine runs the work to its end; the slot is given back once the
/// sandbox is gone; then the metrics, the final record and the log line.
fn engine_and_finish(
    state: &SharedServices,
    ctx: Context,
    ready: Ready,
    sink: &mut dyn OutputSink,
    admitted: Admitted,
    tracked: Option<Tracked>,
    answered: &AtomicBool,
) -> Result<Finished, Error> {
    // 7. the engine.
    let (ran, cell) = match ready {
        Ready::Execute(job) => (Ran::Execution(state.engine.execute(job, sink)), None),
        Ready::Cell(mut cell) => (Ran::Cell(cell.execute(&ctx.id, sink)), Some(cell)),
    };
    let resumed = cell.as_ref().and_then(|c| c.take_resumed());
    // A cell's calls still waiting are withdrawn with it (a one-shot execution's went with
    // its sandbox already): no call waits on past its execution.
    crate::approvals::withdraw(state, &ctx.id);
    answered.store(true, Ordering::Release);
    drop((admitted, tracked));
    // 8. finish.
    let done = match ran {
        Ran::Execution(ran) => finish(state, ctx, ran).map(Finished::Execution),
        Ran::Cell(Ok((execution, ended))) => {
            if let Some(cell) = &cell {
                crate::snapshots::after_cell(state, &cell.session(), true);
            }
            finish(state, ctx, Ok(execution)).map(|r| {
                Finished::Cell(CellResponse {
                    id: r.id,
                    session_ended: ended,
                    resumed,
                    result: r.result,
                })
            })
        }
        Ran::Cell(Err(e)) => {
            if let Some(cell) = &cell {
                crate::snapshots::after_cell(state, &cell.session(), false);
            }
            // Its `started` line is written: it gets a final record all the same.
            record_unrun(state, &ctx);
            Err(e)
        }
    };
    // The session is free for its next request once this cell is recorded.
    drop(cell);
    done
}

/// What the engine gave back.
enum Ran {
    Execution(Result<airlock_engine::Execution, airlock_engine::EngineError>),
    Cell(Result<(airlock_engine::Execution, bool), Error>),
}

/// What a client that goes away stops: its execution's sandbox, or its session mid-cell
/// (whose state is unknown then). Nothing once the work is done.
#[derive(Clone)]
struct Stopper {
    stop: Stop,
    answered: Arc<AtomicBool>,
}

#[derive(Clone)]
enum Stop {
    Cancel(Cancel),
    Session(Arc<OpenSession>),
}

impl Stopper {
    fn stop(&self) {
        if self.answered.load(Ordering::Acquire) {
            return;
        }
        match &self.stop {
            Stop::Cancel(cancel) => cancel.cancel(),
            Stop::Session(session) => session.destroy(),
        }
    }
}

/// Stops the work if the request is dropped before it is answered (its client went away).
/// Withdraws a background submission when dropped, unless disarmed.
struct Withdraw<'a>(Option<(&'a SharedServices, &'a Arc<crate::background::Live>)>);

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some((state, live)) = self.0.take() {
            state.background.withdraw(live);
        }
    }
}

struct StopOnDrop(Option<Stopper>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(stopper) = self.0.take() {
            stopper.stop();
        }
    }
}

/// A session opened: steps 1 and 2, its job checked on a blocking thread (3), its sandbox
/// started (7), then it is registered and audited (8). A session takes no running slot and
/// no `started` line: its opening and closing are audit lines of their own, and each of its
/// cells goes through [`run`]. Its sandbox's start is the `sandbox_start` phase of request
/// `request_id`'s span.
pub async fn open_session(
    state: &SharedServices,
    caller: &Arc<Key>,
    request_id: &str,
    input: Input<SessionRequest>,
    received: Option<Received>,
) -> Result<SessionInfo, Error> {
    refuse_if_unavailable(state)?;
    let (received, arguments) = arrive(state, caller, received, input).await?;
    let (st, key) = (state.clone(), caller.clone());
    let opening = blocking("preparing the session", move || {
        sessions::prepare_open(&st, &key, arguments.parse(&st)?)
    })
    .await?;
    let trace = state.telemetry.request_span(request_id);
    let starting = state.telemetry.phase(trace.as_ref(), "sandbox_start");
    let info = sessions::start(state, caller, opening).await;
    if let (Some(mut span), Err(e)) = (starting, &info) {
        span.fail(e.code);
    }
    drop(received);
    info
}
