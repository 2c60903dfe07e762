//! Server-sent events for `Accept: text/event-stream`: the program's output as it is
//! produced, then the result.
//!
//! Events, each one line of JSON in `data`:
//! - `stdout` / `stderr`: `{"text": "..."}`, UTF-8 (a character split between two reads is
//!   held until it is whole; invalid bytes become U+FFFD, as in the result);
//! - `truncated`: `{"stream": "stdout", "limit": N}`, once, when a stream reaches the output
//!   limit (the rest is dropped, as in the result);
//! - `result`: the same object a plain request gets, last, but for the output the events
//!   already carried: `result.stdout` and `result.stderr` are empty, and
//!   `"output_streamed": true` says so (each byte reaches the client once);
//! - `error`: `{"error": {...}}` instead of `result` when airlock itself failed.
//!
//! The events wait for the client in a queue of at most [`QUEUE_BYTES`]; the stream holds
//! its execution's answer reservation (`budget.rs`) until it is written out or dropped.
//! After `http.sse_keep_alive_ms` without an event the body sends a comment line
//! (`: keep-alive`), which clients ignore and proxies count as traffic. (axum's `Sse` does the
//! same; this body is our own because it counts its queue in the memory budget.)

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use airlock_api::ExecutionResult;
use airlock_engine::{OutputSink, Stream};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use tokio::sync::mpsc;

use crate::budget::Share;

/// How long a client may leave events unread before its execution is cancelled: the same
/// bound as for a client that will not read a plain answer.
const STALLED: Duration = Duration::from_secs(10);
const QUEUE: usize = 64;
/// Bytes of events that may wait for the client (one larger event may wait alone).
pub const QUEUE_BYTES: usize = 1 << 20;

/// Whether the request asked for a stream.
pub fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.split(';').next().unwrap_or("").trim() == "text/event-stream")
}

/// The sending half, used from the execution's blocking thread.
pub struct Events {
    tx: mpsc::Sender<Bytes>,
    /// Bytes in the queue, not yet taken by the body.
    queued: Arc<AtomicUsize>,
    /// What to stop when the client is gone: the execution, or the session.
    on_gone: OnGone,
    /// Bytes of an unfinished UTF-8 character, per stream.
    pending: [Vec<u8>; 2],
    gone: bool,
    /// Dropped with the events: stops the watcher, whose sender would keep the body open.
    _done: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Stops what a stream's client was waiting for.
pub type OnGone = Arc<dyn Fn() + Send + Sync>;

/// A response whose body is the stream, and the sender that feeds it. A client that goes
/// away stops the work at once (`on_gone`), even while the program prints nothing. The body
/// holds `share` until it is dropped.
pub fn channel(on_gone: OnGone, share: Share, keep_alive: Duration) -> (Response, Events) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let queued = Arc::new(AtomicUsize::new(0));
    let (watched, on_close) = (tx.clone(), on_gone.clone());
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            () = watched.closed() => on_close(),
            _ = finished => {} // the execution is over: let the body end
        }
    });
    let body = EventBody {
        rx,
        queued: queued.clone(),
        keep_alive: (!keep_alive.is_zero())
            .then(|| (keep_alive, Box::pin(tokio::time::sleep(keep_alive)))),
        _share: share,
    };
    let mut response = Response::new(Body::new(body));
    response.extensions_mut().insert(crate::answer::Counted);
    *response.status_mut() = StatusCode::OK;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    let events = Events {
        tx,
        queued,
        on_gone,
        pending: [Vec::new(), Vec::new()],
        gone: false,
        _done: Some(done),
    };
    (response, events)
}

impl Events {
    /// Sends one event; a client that went away or stopped reading cancels the execution.
    pub fn send(&mut self, event: &str, data: &serde_json::Value) {
        if self.gone {
            return;
        }
        let mut bytes = Bytes::from(format!("event: {event}\ndata: {data}\n\n"));
        let len = bytes.len();
        let deadline = Instant::now() + STALLED;
        loop {
            let queued = self.queued.load(Ordering::Acquire);
            let room = queued == 0 || queued + len <= QUEUE_BYTES;
            let sent = if room {
                self.queued.fetch_add(len, Ordering::AcqRel);
                self.tx.try_send(bytes).inspect_err(|_| {
                    self.queued.fetch_sub(len, Ordering::AcqRel);
                })
            } else {
                Err(mpsc::error::TrySendError::Full(bytes))
            };
            match sent {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(back)) if Instant::now() < deadline => {
                    bytes = back;
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
        let held = &mut self.pending[stream as usize];
        held.extend_from_slice(chunk);
        // Keep back an incomplete character at the end (at most 3 bytes).
        let cut = match std::str::from_utf8(held) {
            Ok(_) => held.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => held.len(),
        };
        let rest = held.split_off(cut);
        let text = String::from_utf8_lossy(&std::mem::replace(held, rest)).into_owned();
        if !text.is_empty() {
            self.send(name(stream), &serde_json::json!({ "text": text }));
        }
    }

    /// The last events: what is still held, then the answer (whose output the events
    /// carried: see [`without_output`]) or the error's body.
    pub fn end<T: serde::Serialize>(mut self, done: Result<T, crate::error::Error>) {
        self.flush();
        let (event, value) = match done {
            Ok(answer) => {
                let mut value = serde_json::to_value(answer).unwrap_or_default();
                if let Some(object) = value.as_object_mut() {
                    object.insert("output_streamed".into(), true.into());
                }
                ("result", value)
            }
            Err(e) => ("error", serde_json::to_value(e.body()).unwrap_or_default()),
        };
        self.send(event, &value);
    }

    /// Whatever is still held (an incomplete character at the very end), as U+FFFD.
    pub fn flush(&mut self) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let held = std::mem::take(&mut self.pending[stream as usize]);
            if !held.is_empty() {
                let text = String::from_utf8_lossy(&held).into_owned();
                self.send(name(stream), &serde_json::json!({ "text": text }));
            }
        }
    }
}

/// Empties the output of a result whose output the stream's events already carried.
pub fn without_output(result: &mut ExecutionResult) {
    result.stdout = Default::default();
    result.stderr = Default::default();
}

fn name(stream: Stream) -> &'static str {
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
        self.pending[stream as usize].clear();
        self.send(
            "truncated",
            &serde_json::json!({ "stream": name(stream), "limit": limit }),
        );
    }
}

/// The response body: events as the execution sends them, until it drops its sender.
struct EventBody {
    rx: mpsc::Receiver<Bytes>,
    queued: Arc<AtomicUsize>,
    /// How long the stream may be silent, and when it next speaks if nothing comes.
    keep_alive: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
    _share: Share,
}

/// What a silent stream sends: an SSE comment, which clients skip.
const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

impl http_body::Body for EventBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(bytes)) = &polled {
            self.queued.fetch_sub(bytes.len(), Ordering::AcqRel);
        }
        if let Some((every, sleep)) = &mut self.keep_alive {
            // Polling the timer registers its waker: a silent stream is woken at the deadline.
            let silent_too_long = polled.is_pending() && sleep.as_mut().poll(cx).is_ready();
            if polled.is_ready() || silent_too_long {
                sleep.as_mut().reset(tokio::time::Instant::now() + *every);
            }
            if silent_too_long {
                // The caller polls again after a frame, which arms the timer anew.
                let comment = Bytes::from_static(KEEP_ALIVE);
                return Poll::Ready(Some(Ok(http_body::Frame::data(comment))));
            }
        }
        polled.map(|event| event.map(|bytes| Ok(http_body::Frame::data(bytes))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(rx: &mut mpsc::Receiver<Bytes>) -> String {
        let mut all = String::new();
        while let Ok(b) = rx.try_recv() {
            all.push_str(std::str::from_utf8(&b).unwrap());
        }
        all
    }

    #[test]
    fn accept_headers_are_read_as_lists() {
        let mut h = HeaderMap::new();
        assert!(!wanted(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream;q=0.9"),
        );
        assert!(wanted(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-streams"),
        );
        assert!(!wanted(&h));
    }

    #[test]
    fn characters_split_between_reads_arrive_whole() {
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let mut events = Events {
            tx,
            queued: Arc::default(),
            on_gone: Arc::new(|| {}),
            pending: [Vec::new(), Vec::new()],
            gone: false,
            _done: None,
        };
        let euro = "€".as_bytes();
        events.output(Stream::Stdout, &[b'a', euro[0]]);
        events.output(Stream::Stdout, &euro[1..]);
        events.output(Stream::Stderr, b"\xff!");
        events.output(Stream::Stdout, &euro[..2]);
        events.flush();
        assert_eq!(
            drain(&mut rx),
            "event: stdout\ndata: {\"text\":\"a\"}\n\n\
             event: stdout\ndata: {\"text\":\"€\"}\n\n\
             event: stderr\ndata: {\"text\":\"\u{fffd}!\"}\n\n\
             event: stdout\ndata: {\"text\":\"\u{fffd}\"}\n\n"
        );
    }

    #[test]
    fn a_client_that_went_away_cancels_the_execution() {
        let (tx, rx) = mpsc::channel(QUEUE);
        let cancel = airlock_engine::Cancel::default();
        let stop = cancel.clone();
        let mut events = Events {
            tx,
            queued: Arc::default(),
            on_gone: Arc::new(move || stop.cancel()),
            pending: [Vec::new(), Vec::new()],
            gone: false,
            _done: None,
        };
        drop(rx);
        events.output(Stream::Stdout, b"x");
        assert!(cancel.is_cancelled());
    }
}
