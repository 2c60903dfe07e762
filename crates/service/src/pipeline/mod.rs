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
//! log (`background/`). Steps 4 to 8 are written once for both (`execute.rs`); where they
//! differ, they ask the work's recipient (`recipients.rs`). The pipeline takes a transport-free [`Request`] and yields a
//! transport-free [`Outcome`] or an [`Error`]; the adapters map them (HTTP: statuses and
//! server-sent events; MCP: tool results). A transport that must take in a whole message
//! before it knows the work it holds (MCP over HTTP) takes steps 1 and 2 for it with
//! [`receive`], and hands the result over ([`Received`]).

mod execute;
mod recipients;

use std::sync::Arc;

use airlock_api::{CellRequest, ExecuteRequest, SessionInfo, SessionRequest};
use airlock_engine::{Job, OutputSink};

use crate::admission::Entered;
use crate::answer::Form;
use crate::background::{self, Ended, Live};
use crate::body::{parse_json, read_body, Body};
use crate::budget::Share;
use crate::error::Error;
use crate::execution::{answer_size, job_from, refuse_if_unavailable, rejection, Lifetime};
use crate::keys::Key;
use crate::parked;
use crate::services::SharedServices;
use crate::sessions;
use crate::telemetry::Trace;

use execute::{execute, Ready};
pub use execute::{Finished, Outcome};
use recipients::{Answered, Logged, Streamed};

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
    /// progress), in place of [`Discard`](airlock_engine::Discard); it must not block. The
    /// program's stdout is then line-buffered, as for a stream, so what it prints is seen as
    /// it is printed.
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
    entered: Entered,
    body: Option<Share>,
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
        entered,
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
        approvals,
        observer,
    } = request;
    let trace = state.telemetry.request_span(&request_id);
    let (received, ready) = arrive_and_prepare(
        state,
        &caller,
        &request_id,
        work,
        received,
        Lifetime::Request,
    )
    .await?;
    let Received { entered, body } = received;
    if stream {
        // Its place travels with its execution, until the last event.
        let to = Streamed::new(form, entered);
        return match execute(state, caller, request_id, ready, body, trace, to).await? {
            Outcome::Streamed(events) => Ok(Outcome::Streamed(events)),
            Outcome::Done(never) => match never {},
        };
    }
    let to = Answered::new(form, observer, approvals, present);
    let outcome = execute(state, caller, request_id, ready, body, trace, to).await;
    // Answered (or refused): its place among its key's requests is given back.
    drop(entered);
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
        in_background(&st, caller, request_id, job, live, answer_bytes, trace).await;
    });
    let meta = stored_rx
        .await
        .map_err(|_| Error::internal("storing the background execution failed"))??;
    // Answered: its place among the key's requests and its body's memory are given back.
    drop(received);
    Ok(meta)
}

/// The steps of a background execution after its answer (see [`submit`]): its turn among
/// background work, its job read back, then 4 to 8 as for any execution, into its events log.
async fn in_background(
    state: &SharedServices,
    caller: Arc<Key>,
    request_id: String,
    job: Job,
    live: Arc<Live>,
    answer_bytes: u64,
    trace: Option<Trace>,
) {
    let bg = &state.background;
    let turn = tokio::select! {
        turn = bg.turn(&live) => turn,
        () = state.shutdown_begun() => None,
    };
    let Some(turn) = turn else {
        let error = Error::shutting_down();
        return bg.end(&live, Ended::Not(error), state.is_shutting_down(), false);
    };
    let unparking = live.clone();
    let ran = match blocking("reading the job back", move || unparking.unpark(job)).await {
        Ok(job) => {
            let to = Logged::new(live.clone(), answer_bytes);
            let ready = Ready::Execute(job);
            execute(state, caller, request_id, ready, None, trace, to).await
        }
        Err(e) => Err(e),
    };
    // Stopped before it ran (cancelled, the server stopping, the audit log), or its task
    // failed: it still ends, its counts given back, rather than stay `running` until a
    // restart.
    if let Err(e) = ran {
        if !live.has_ended() {
            bg.end(&live, Ended::Not(e), state.is_shutting_down(), true);
        }
    }
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

/// Withdraws a background submission when dropped, unless disarmed.
struct Withdraw<'a>(Option<(&'a SharedServices, &'a Arc<crate::background::Live>)>);

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some((state, live)) = self.0.take() {
            state.background.withdraw(live);
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
