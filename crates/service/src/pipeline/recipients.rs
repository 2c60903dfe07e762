//! The three recipients of the pipeline's work ([`Recipient`]), side by side: a client that
//! waits for its answer ([`Answered`]), one that takes its events as they come ([`Streamed`]),
//! both refused when there is no room; and background work, which waits for room and whose
//! output and end go to its events log ([`Logged`]).

use std::sync::Arc;

use airlock_engine::{Cancel, Discard, OutputSink};

use super::execute::{Finished, Ready, Recipient, Room, Started, Stopper};
use crate::admission::Entered;
use crate::answer::Form;
use crate::background::{self, Ended, Live};
use crate::budget::Share;
use crate::error::Error;
use crate::execution::Context;
use crate::keys::Key;
use crate::services::SharedServices;
use crate::stream;

/// A client that waits for the answer: refused when there is no room; the answer made by
/// `present` from what the work finished with.
pub(super) struct Answered<P> {
    form: Form,
    cancel: Cancel,
    watched: bool,
    /// Told of the output as it comes (an MCP call's progress), or [`Discard`].
    output: Box<dyn OutputSink>,
    /// Told of each tool call that waits for an approval (an MCP host asked by elicitation).
    approvals: Option<airlock_tools::Watcher>,
    present: P,
    answer: Option<Share>,
}

impl<P> Answered<P> {
    pub(super) fn new(
        form: Form,
        observer: Option<Box<dyn OutputSink>>,
        approvals: Option<airlock_tools::Watcher>,
        present: P,
    ) -> Self {
        Answered {
            form,
            cancel: Cancel::default(),
            // Line-buffered when observed: print() is seen as it happens.
            watched: observer.is_some(),
            output: observer.unwrap_or_else(|| Box::new(Discard)),
            approvals,
            present,
            answer: None,
        }
    }
}

impl<T, P> Recipient for Answered<P>
where
    T: Send + 'static,
    P: FnOnce(Finished, Share) -> T + Send + 'static,
{
    type Answer = T;

    fn room(&self) -> Room<'_> {
        Room::Refuse(self.form)
    }

    fn cancel(&self) -> Cancel {
        self.cancel.clone()
    }

    fn watched(&self) -> bool {
        self.watched
    }

    fn started(&mut self, _: &Context, answer: Share, _: &Stopper) -> Started<'_> {
        self.answer = Some(answer);
        Started {
            sink: &mut *self.output,
            approvals: self.approvals.take(),
            events: None,
        }
    }

    fn end(
        self,
        _: &SharedServices,
        done: Result<Finished, Error>,
        _: &str,
    ) -> Option<Result<T, Error>> {
        let answer = self.answer.unwrap_or_default();
        Some(done.map(|finished| (self.present)(finished, answer)))
    }
}

/// A client that takes the work's events as they come: refused when there is no room; the
/// stream holds the answer's reservation, and the client's place among its key's requests
/// until the last event; dropping it stops the work.
pub(super) struct Streamed {
    form: Form,
    cancel: Cancel,
    travelling: Entered,
    events: Option<stream::Events>,
}

impl Streamed {
    pub(super) fn new(form: Form, travelling: Entered) -> Self {
        Streamed {
            form,
            cancel: Cancel::default(),
            travelling,
            events: None,
        }
    }
}

impl Recipient for Streamed {
    type Answer = std::convert::Infallible;

    fn room(&self) -> Room<'_> {
        Room::Refuse(self.form)
    }

    fn cancel(&self) -> Cancel {
        self.cancel.clone()
    }

    fn watched(&self) -> bool {
        true
    }

    fn started(&mut self, _: &Context, answer: Share, stop: &Stopper) -> Started<'_> {
        let gone = stop.clone();
        let (stream, events) = stream::channel(Arc::new(move || gone.stop()), answer);
        let aside = events.aside();
        let approvals: airlock_tools::Watcher = Arc::new(move |_, approval| {
            let data = serde_json::to_value(&**approval).unwrap_or_default();
            aside.send("approval_requested", &data);
        });
        Started {
            sink: self.events.insert(events),
            approvals: Some(approvals),
            events: Some(stream),
        }
    }

    fn end(
        self,
        _: &SharedServices,
        done: Result<Finished, Error>,
        request_id: &str,
    ) -> Option<Result<Self::Answer, Error>> {
        drop(self.travelling);
        if let Some(events) = self.events {
            let done = done.map(|mut finished| {
                stream::without_output(finished.result_mut());
                finished
            });
            events.end(done, request_id);
        }
        None
    }
}

/// Background work: it waits for room, as long as it takes, until it is cancelled; its
/// output, its approvals and its end go to its events log, its result to the disk.
pub(super) struct Logged {
    live: Arc<Live>,
    /// The most its answer holds while it runs: a JSON answer's.
    answer_bytes: u64,
    sink: Option<background::Sink>,
    answer: Option<Share>,
    /// Writes the output held back for the log a little later at most, while it runs.
    flusher: Option<tokio::task::JoinHandle<()>>,
}

impl Logged {
    pub(super) fn new(live: Arc<Live>, answer_bytes: u64) -> Self {
        Logged {
            live,
            answer_bytes,
            sink: None,
            answer: None,
            flusher: None,
        }
    }
}

impl Recipient for Logged {
    type Answer = ();

    fn room(&self) -> Room<'_> {
        Room::Wait {
            bytes: self.answer_bytes,
            live: &self.live,
        }
    }

    fn cancel(&self) -> Cancel {
        self.live.cancel.clone()
    }

    fn watched(&self) -> bool {
        // Line-buffered: print() reaches the log as it happens.
        true
    }

    fn context(
        &self,
        _: &SharedServices,
        caller: &Key,
        request_id: String,
        ready: &Ready,
    ) -> Context {
        let mut ctx = ready.context(caller, request_id, self.live.id.clone());
        let deleted = self.live.clone();
        ctx.cancelled = Some(Box::new(move || {
            deleted.is_cancelled().then(|| {
                format!(
                    "cancelled by its key (DELETE /v1/executions/{}) before it ended",
                    deleted.id
                )
            })
        }));
        ctx
    }

    fn started(&mut self, ctx: &Context, answer: Share, _: &Stopper) -> Started<'_> {
        self.live.running(&ctx.started_at);
        self.answer = Some(answer);
        let flushing = self.live.clone();
        self.flusher = Some(tokio::spawn(async move { flushing.flush_held().await }));
        let aside = self.live.clone();
        let approvals: airlock_tools::Watcher = Arc::new(move |_, approval| {
            let data = serde_json::to_value(&**approval).unwrap_or_default();
            aside.event("approval_requested", &data);
        });
        Started {
            sink: self.sink.insert(self.live.sink()),
            approvals: Some(approvals),
            events: None,
        }
    }

    fn end(
        mut self,
        state: &SharedServices,
        done: Result<Finished, Error>,
        _: &str,
    ) -> Option<Result<(), Error>> {
        if let Some(sink) = &mut self.sink {
            sink.flush();
        }
        let ended = match done {
            Ok(Finished::Execution(response)) => Ended::Ran(Box::new(response)),
            Ok(Finished::Cell(_)) => Ended::Not(Error::internal("a cell ran in the background")),
            Err(e) => Ended::Not(e),
        };
        state
            .background
            .end(&self.live, ended, state.is_shutting_down(), true);
        if let Some(flusher) = self.flusher {
            flusher.abort();
        }
        // Stored: the answer's memory is free.
        drop(self.answer);
        Some(Ok(()))
    }
}
