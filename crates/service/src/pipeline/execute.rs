//! Steps 4 to 8, written once for answers in place and background work alike: the answer's
//! reservation and a running slot, then on one blocking thread that nothing cancels the
//! `started` line, the engine, and the record. Where the two differ (no room: refused, or
//! waited for; the output and the end: the client's, or the events log) [`execute`] asks its
//! [`Recipient`] (`recipients.rs` has the three).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use airlock_api::{CellResponse, ExecuteResponse, Limits};
use airlock_engine::{Cancel, Job, OutputSink};

use crate::admission::Admitted;
use crate::answer::Form;
use crate::background::Live;
use crate::budget::Share;
use crate::error::Error;
use crate::execution::{
    audit_start, finish, record_unrun, refuse_if_unavailable, rejection, reserve_answer, Context,
};
use crate::keys::Key;
use crate::lifecycle::Tracked;
use crate::open_sessions::OpenSession;
use crate::services::SharedServices;
use crate::sessions::PreparedCell;
use crate::stream::EventStream;
use crate::telemetry::Trace;

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
    pub(super) fn result_mut(&mut self) -> &mut airlock_api::ExecutionResult {
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

/// The work checked and ready to run (step 3). One lives per request, moved a few times:
/// boxing the job would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Ready {
    Execute(Job),
    Cell(PreparedCell),
}

impl Ready {
    pub(super) fn limits(&self) -> &Limits {
        match self {
            Ready::Execute(job) => &job.limits,
            Ready::Cell(cell) => cell.limits(),
        }
    }

    /// Its record, as execution `id` of `caller`, starting now (hashes the code: CPU work for
    /// a large one); a cell's session is told which of its cells runs.
    pub(super) fn context(&self, caller: &Key, request_id: String, id: String) -> Context {
        match self {
            Ready::Execute(job) => Context::for_job(caller, request_id, job, id),
            Ready::Cell(cell) => {
                let ctx = Context::for_code(caller, request_id, cell.code(), cell.limits(), id);
                cell.begin(caller, &ctx.id);
                ctx
            }
        }
    }
}

/// Where work checked and ready is answered, and what it does when there is no room for it:
/// the points where an answer in place and background work differ. The steps themselves are
/// [`execute`]'s, written once; it calls these as it goes (`recipients.rs`).
pub(super) trait Recipient: Send + 'static {
    /// What the one who waits for the work is given when it ends.
    type Answer: Send + 'static;

    /// Steps 4 and 5 when there is no room: refused at once, or waited for.
    fn room(&self) -> Room<'_>;

    /// What cancels its job (a background execution's `DELETE` holds it too).
    fn cancel(&self) -> Cancel;

    /// Whether its output is taken as it comes: then line-buffered, so that `print()` is seen
    /// as it happens.
    fn watched(&self) -> bool;

    /// Step 6: its record, as a new execution (a background execution was named when it was
    /// submitted).
    fn context(
        &self,
        state: &SharedServices,
        caller: &Key,
        request_id: String,
        ready: &Ready,
    ) -> Context {
        ready.context(caller, request_id, state.held_id("ex_"))
    }

    /// Its `started` line is written: where its output and its approvals go while it runs,
    /// and the events its client takes from now when it is streamed. `answer` is its
    /// answer's reservation; `stop` stops it.
    fn started(&mut self, ctx: &Context, answer: Share, stop: &Stopper) -> Started<'_>;

    /// Step 8 is done: its answer, or `None` when its events carried it.
    fn end(
        self,
        state: &SharedServices,
        done: Result<Finished, Error>,
        request_id: &str,
    ) -> Option<Result<Self::Answer, Error>>;
}

/// What work does when its answer's reservation or a running slot is not to be had now.
#[derive(Clone, Copy)]
pub(super) enum Room<'a> {
    /// It is refused: its client hears so at once (429, 503), and when to come back. The
    /// answer's form sets what it reserves.
    Refuse(Form),
    /// It waits as long as it takes, until `live` is cancelled or the server stops:
    /// background work, whose bounds were met when it was submitted. It reserves `bytes`.
    Wait { bytes: u64, live: &'a Live },
}

/// Where a running execution's output and approvals go.
pub(super) struct Started<'a> {
    pub(super) sink: &'a mut dyn OutputSink,
    pub(super) approvals: Option<airlock_tools::Watcher>,
    /// A streamed execution's events, for its client.
    pub(super) events: Option<EventStream>,
}

/// Steps 4 to 8 of work checked and ready, for an answer in place and background work alike:
/// `to` says what it does without room, and where its output and its end go. `body` is the
/// share of the request's body, held until the work is admitted.
pub(super) async fn execute<R: Recipient>(
    state: &SharedServices,
    caller: Arc<Key>,
    request_id: String,
    ready: Ready,
    body: Option<Share>,
    trace: Option<Trace>,
    mut to: R,
) -> Result<Outcome<R::Answer>, Error> {
    // 4. reserve, and 5. admit.
    let without_room = to.room();
    let (answer, admitted) =
        room(state, &caller, ready.limits(), without_room, trace.as_ref()).await?;
    // The job leaves the queue for its sandbox: its body no longer waits here.
    drop(body);
    // Shutdown may have begun while it waited.
    refuse_if_unavailable(state)?;
    // What stops the work if its client goes: the sandbox killed, or the session closed.
    let (ready, stop, tracked) = match ready {
        Ready::Execute(mut job) => {
            let cancel = to.cancel();
            job.cancel = Some(cancel.clone());
            job.stream = to.watched();
            let tracked = state.lifecycle.track(cancel.clone());
            (Ready::Execute(job), Stop::Cancel(cancel), Some(tracked))
        }
        Ready::Cell(cell) => {
            let session = cell.session();
            (Ready::Cell(cell), Stop::Session(session), None)
        }
    };
    let answered = Arc::new(AtomicBool::new(false));
    let stopper = Stopper {
        stop,
        answered: answered.clone(),
    };
    let mut on_drop = StopOnDrop(Some(stopper.clone()));
    // Steps 6 to 8 on one blocking thread, to their end even if the client goes: a `started`
    // line always gets its record.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let st = state.clone();
    let task = tokio::task::spawn_blocking(move || {
        let state = &st;
        // 6. audit.
        let ctx = to.context(state, &caller, request_id, &ready);
        if let Err(e) = audit_start(state, &ctx) {
            drop((admitted, tracked));
            let _ = started_tx.send(Err(e));
            return None;
        }
        let _traced = state.telemetry.execution(&ctx.id, trace.as_ref());
        let request_id = ctx.request_id.clone();
        let Started {
            sink,
            approvals,
            events,
        } = to.started(&ctx, answer, &stopper);
        // Dropped before the last event: a stream's sender would keep it open.
        let watching = approvals.and_then(|w| crate::approvals::watch(state, &ctx.id, w));
        // A client gone meanwhile drops the stream, which stops the work: it still gets its
        // record.
        let _ = started_tx.send(Ok(events));
        // 7 and 8.
        let done = engine_and_finish(state, ctx, ready, sink, admitted, tracked, &answered);
        drop(watching);
        to.end(state, done, &request_id)
    });
    let outcome = match started_rx.await {
        Err(_) => Err(task_failed(task.await.err())),
        Ok(Err(e)) => Err(e),
        Ok(Ok(Some(events))) => Ok(Outcome::Streamed(events)),
        Ok(Ok(None)) => match task.await {
            Ok(Some(done)) => done.map(Outcome::Done),
            Ok(None) => Err(task_failed(None)),
            Err(e) => Err(task_failed(Some(e))),
        },
    };
    // Answered, refused by the audit log, or handed to its stream (whose end stops it).
    on_drop.0 = None;
    outcome
}

/// Steps 4 and 5: the most its answer can hold, reserved from now until it is written out;
/// then a running slot. Refused when there is no room, or waited for.
async fn room(
    state: &SharedServices,
    caller: &Key,
    limits: &Limits,
    room: Room<'_>,
    trace: Option<&Trace>,
) -> Result<(Share, Admitted), Error> {
    let answer = match room {
        Room::Refuse(form) => reserve_answer(state, caller, limits, form)?,
        Room::Wait { bytes, live } => tokio::select! {
            biased;
            () = live.cancelled() => return Err(Error::shutting_down()),
            () = state.shutdown_begun() => return Err(Error::shutting_down()),
            share = state.memory.reserve_waiting(caller, bytes) => share,
        },
    };
    let waiting = state.telemetry.phase(trace, "admission_wait");
    let admitted = match room {
        Room::Refuse(_) => state.admission.admit(caller).await,
        // Only closing (shutdown) refuses it.
        Room::Wait { live, .. } => tokio::select! {
            biased;
            () = live.cancelled() => return Err(Error::shutting_down()),
            admitted = state.admission.admit_waiting(caller) => admitted,
        },
    };
    drop(waiting);
    Ok((answer, admitted.map_err(rejection)?))
}

/// An execution's blocking task that ended without an outcome (it panicked).
fn task_failed(e: Option<tokio::task::JoinError>) -> Error {
    tracing::error!(error = ?e, "an execution's task failed");
    Error::internal("the execution failed inside airlock")
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
pub(super) struct Stopper {
    stop: Stop,
    answered: Arc<AtomicBool>,
}

#[derive(Clone)]
enum Stop {
    Cancel(Cancel),
    Session(Arc<OpenSession>),
}

impl Stopper {
    pub(super) fn stop(&self) {
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
struct StopOnDrop(Option<Stopper>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(stopper) = self.0.take() {
            stopper.stop();
        }
    }
}
