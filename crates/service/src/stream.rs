//! A streamed execution's events: the program's output as it is produced, then the result,
//! queued for whichever transport sends them (over HTTP, server-sent events: `http/sse.rs`).
//!
//! Events, each with one line of JSON as its data:
//! - `stdout` / `stderr`: `{"text": "..."}`, UTF-8 (a character split between two reads is
//!   held until it is whole; invalid bytes become U+FFFD, as in the result);
//! - `truncated`: `{"stream": "stdout", "limit": N}`, once, when a stream reaches the output
//!   limit (the rest is dropped, as in the result);
//! - `result`: the same object a plain request gets, last, but for the output the events
//!   already carried: `result.stdout` and `result.stderr` are empty, and
//!   `"output_streamed": true` says so (each byte reaches the client once);
//! - `error`: `{"error": {...}}` instead of `result` when airlock itself failed;
//! - `approval_requested`: a tool call of the execution waits for an approval (the object
//!   `GET /v1/approvals` lists, docs/approvals.md), sent from the call's side ([`Aside`]).
//!
//! The events wait for the client in a queue of at most [`QUEUE_BYTES`]; the stream holds
//! its execution's answer reservation (`budget.rs`) until it is written out or dropped. A
//! client that goes away, or leaves events unread for [`STALLED`], stops the work at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use airlock_api::ExecutionResult;
use airlock_engine::{OutputSink, Stream};
use tokio::sync::mpsc;

use crate::budget::Share;
use crate::error::Error;

/// How long a client may leave events unread before its execution is cancelled: the same
/// bound as for a client that will not read a plain answer.
pub const STALLED: Duration = Duration::from_secs(10);
const QUEUE: usize = 64;
/// Bytes of events (names and data) that may wait for the client (one larger event may wait
/// alone).
pub const QUEUE_BYTES: usize = 1 << 20;

/// One event: its name, and its data, one line of JSON.
#[derive(Debug, PartialEq, Eq)]
pub struct Event {
    pub name: &'static str,
    pub data: String,
}

impl Event {
    /// What it counts for in the queue.
    fn size(&self) -> usize {
        self.name.len() + self.data.len()
    }
}

/// The sending half, used from the execution's blocking thread.
pub struct Events {
    tx: mpsc::Sender<Event>,
    /// Bytes in the queue, not yet taken by the transport.
    queued: Arc<AtomicUsize>,
    /// What to stop when the client is gone: the execution, or the session.
    on_gone: OnGone,
    /// Bytes of an unfinished UTF-8 character, per stream.
    pending: Whole,
    gone: bool,
    /// Dropped with the events: stops the watcher, whose sender would keep the stream open.
    _done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("queued", &self.queued)
            .field("gone", &self.gone)
            .finish_non_exhaustive()
    }
}

/// Stops what a stream's client was waiting for.
pub type OnGone = Arc<dyn Fn() + Send + Sync>;

/// The receiving half, for the transport: the events as they come, until the execution drops
/// its sender. It holds the execution's answer reservation until it is dropped.
#[derive(Debug)]
pub struct EventStream {
    rx: mpsc::Receiver<Event>,
    queued: Arc<AtomicUsize>,
    _share: Share,
}

impl EventStream {
    /// The next event; `None` once the execution has sent its last.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(event)) = &polled {
            self.queued.fetch_sub(event.size(), Ordering::AcqRel);
        }
        polled
    }
}

/// A stream and the sender that feeds it. A client that goes away (the stream dropped) stops
/// the work at once (`on_gone`), even while the program prints nothing. The stream holds
/// `share` until it is dropped. Called on the async runtime, which watches for the client.
pub fn channel(on_gone: OnGone, share: Share) -> (EventStream, Events) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let queued = Arc::new(AtomicUsize::new(0));
    let (watched, on_close) = (tx.clone(), on_gone.clone());
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            () = watched.closed() => on_close(),
            _ = finished => {} // the execution is over: let the stream end
        }
    });
    let stream = EventStream {
        rx,
        queued: queued.clone(),
        _share: share,
    };
    let events = Events {
        tx,
        queued,
        on_gone,
        pending: Whole::default(),
        gone: false,
        _done: Some(done),
    };
    (stream, events)
}

impl Events {
    /// Sends one event; a client that went away or stopped reading cancels the execution.
    pub fn send(&mut self, name: &'static str, data: &serde_json::Value) {
        if self.gone {
            return;
        }
        let mut event = Event {
            name,
            data: data.to_string(),
        };
        let len = event.size();
        let deadline = Instant::now() + STALLED;
        loop {
            let queued = self.queued.load(Ordering::Acquire);
            let room = queued == 0 || queued + len <= QUEUE_BYTES;
            let sent = if room {
                self.queued.fetch_add(len, Ordering::AcqRel);
                self.tx.try_send(event).inspect_err(|_| {
                    self.queued.fetch_sub(len, Ordering::AcqRel);
                })
            } else {
                Err(mpsc::error::TrySendError::Full(event))
            };
            match sent {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(back)) if Instant::now() < deadline => {
                    event = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => {
                    self.gone = true;
                    (self.on_gone)();
                    return;
                }
            }
        }
    }

    fn text(&mut self, stream: Stream, chunk: &[u8]) {
        if let Some(text) = self.pending.text(stream, chunk) {
            self.send(name(stream), &serde_json::json!({ "text": text }));
        }
    }

    /// The last events: what is still held, then the answer (whose output the events
    /// carried: see [`without_output`]) or the error's body, with the request's id.
    pub fn end<T: serde::Serialize>(mut self, done: Result<T, Error>, request_id: &str) {
        self.flush();
        let (event, value) = match done {
            Ok(answer) => ("result", streamed_result(answer)),
            Err(e) => (
                "error",
                serde_json::to_value(e.body(Some(request_id.to_owned()))).unwrap_or_default(),
            ),
        };
        self.send(event, &value);
    }

    /// Whatever is still held (an incomplete character at the very end), as U+FFFD.
    pub fn flush(&mut self) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            if let Some(text) = self.pending.rest(stream) {
                self.send(name(stream), &serde_json::json!({ "text": text }));
            }
        }
    }
}

/// A stream's `result` event: the answer (its output already sent as events), saying so.
pub fn streamed_result(answer: impl serde::Serialize) -> serde_json::Value {
    let mut value = serde_json::to_value(answer).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.insert("output_streamed".into(), true.into());
    }
    value
}

/// Output held back while a UTF-8 character is split between two reads, per stream: each
/// event's text is whole characters (invalid bytes become U+FFFD, as in the result).
#[derive(Debug, Default)]
pub struct Whole([Vec<u8>; 2]);

impl Whole {
    /// The text `chunk` completes, with what was held before it; an incomplete character at
    /// its end (at most 3 bytes) is held.
    pub fn text(&mut self, stream: Stream, chunk: &[u8]) -> Option<String> {
        let held = &mut self.0[stream as usize];
        held.extend_from_slice(chunk);
        let cut = match std::str::from_utf8(held) {
            Ok(_) => held.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => held.len(),
        };
        let rest = held.split_off(cut);
        let text = String::from_utf8_lossy(&std::mem::replace(held, rest)).into_owned();
        (!text.is_empty()).then_some(text)
    }

    /// What is still held (an incomplete character at the very end), as U+FFFD.
    pub fn rest(&mut self, stream: Stream) -> Option<String> {
        let held = std::mem::take(&mut self.0[stream as usize]);
        (!held.is_empty()).then(|| String::from_utf8_lossy(&held).into_owned())
    }

    /// Forgets what is held: a character cut by the output limit is dropped whole.
    pub fn cut(&mut self, stream: Stream) {
        self.0[stream as usize].clear();
    }
}

/// Sends events from beside the execution's thread (a tool call that waits for an approval),
/// into the same queue; the stream ends only once these are dropped too.
#[derive(Debug)]
pub struct Aside {
    tx: mpsc::Sender<Event>,
    queued: Arc<AtomicUsize>,
}

impl Events {
    /// A sender of events from elsewhere than the execution's thread.
    pub fn aside(&self) -> Aside {
        Aside {
            tx: self.tx.clone(),
            queued: self.queued.clone(),
        }
    }
}

impl Aside {
    /// Sends one event without blocking its caller (an async task): a full queue is waited
    /// for on a task of its own. A client that stopped reading is the execution's to notice.
    pub fn send(&self, name: &'static str, data: &serde_json::Value) {
        let event = Event {
            name,
            data: data.to_string(),
        };
        let len = event.size();
        self.queued.fetch_add(len, Ordering::AcqRel);
        match self.tx.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                let (tx, queued) = (self.tx.clone(), self.queued.clone());
                tokio::spawn(async move {
                    if tx.send(event).await.is_err() {
                        queued.fetch_sub(len, Ordering::AcqRel);
                    }
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.queued.fetch_sub(len, Ordering::AcqRel);
            }
        }
    }
}

/// Empties the output of a result whose output the stream's events already carried.
pub fn without_output(result: &mut ExecutionResult) {
    result.stdout = Default::default();
    result.stderr = Default::default();
}

/// The event that carries `stream`'s output.
pub fn name(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    }
}

impl OutputSink for Events {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        self.text(stream, chunk);
    }

    fn truncated(&mut self, stream: Stream, limit: u64) {
        // A character cut by the limit is dropped whole, as in the result.
        self.pending.cut(stream);
        self.send(
            "truncated",
            &serde_json::json!({ "stream": name(stream), "limit": limit }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(on_gone: OnGone) -> (mpsc::Receiver<Event>, Events) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let events = Events {
            tx,
            queued: Arc::default(),
            on_gone,
            pending: Whole::default(),
            gone: false,
            _done: None,
        };
        (rx, events)
    }

    fn drain(rx: &mut mpsc::Receiver<Event>) -> Vec<(&'static str, String)> {
        let mut all = Vec::new();
        while let Ok(e) = rx.try_recv() {
            all.push((e.name, e.data));
        }
        all
    }

    #[test]
    fn characters_split_between_reads_arrive_whole() {
        let (mut rx, mut events) = events(Arc::new(|| {}));
        let euro = "€".as_bytes();
        events.output(Stream::Stdout, &[b'a', euro[0]]);
        events.output(Stream::Stdout, &euro[1..]);
        events.output(Stream::Stderr, b"\xff!");
        events.output(Stream::Stdout, &euro[..2]);
        events.flush();
        let text = |t: &str| serde_json::json!({ "text": t }).to_string();
        assert_eq!(
            drain(&mut rx),
            [
                ("stdout", text("a")),
                ("stdout", text("€")),
                ("stderr", text("\u{fffd}!")),
                ("stdout", text("\u{fffd}")),
            ]
        );
    }

    #[test]
    fn a_client_that_went_away_cancels_the_execution() {
        let cancel = airlock_engine::Cancel::default();
        let stop = cancel.clone();
        let (rx, mut events) = events(Arc::new(move || stop.cancel()));
        drop(rx);
        events.output(Stream::Stdout, b"x");
        assert!(cancel.is_cancelled());
    }
}
