//! Server-sent events for `Accept: text/event-stream`: a streamed execution's events
//! (`service/stream.rs`), each as `event: <name>` and one `data:` line. After
//! `http.sse_keep_alive_ms` without an event the body sends a comment line (`: keep-alive`),
//! which clients ignore and proxies count as traffic. (axum's `Sse` does the same; this body
//! is our own because the stream it sends counts its queue in the memory budget.)

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;

use crate::http::answer::Counted;
use airlock_service::pipeline::Outcome;
use airlock_service::stream::EventStream;
use airlock_service::Services;

/// Whether the request asked for a stream.
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.split(';').next().unwrap_or("").trim() == "text/event-stream")
}

/// The answer to a request that may have asked for a stream: its answer when it ran to its
/// end, or the stream.
pub(crate) fn respond(state: &Services, outcome: Outcome<Response>) -> Response {
    match outcome {
        Outcome::Done(answer) => answer,
        Outcome::Streamed(events) => response(
            events,
            Duration::from_millis(state.config.http.sse_keep_alive_ms),
        ),
    }
}

/// A 200 whose body is `events`, as server-sent events.
pub(crate) fn response(events: EventStream, keep_alive: Duration) -> Response {
    let body = EventBody {
        events,
        pieces: VecDeque::new(),
        keep_alive: (!keep_alive.is_zero())
            .then(|| (keep_alive, Box::pin(tokio::time::sleep(keep_alive)))),
    };
    let mut response = Response::new(Body::new(body));
    // The stream holds its execution's reservation: counted already.
    response.extensions_mut().insert(Counted);
    *response.status_mut() = StatusCode::OK;
    event_stream_headers(&mut response);
    response
}

/// The headers of a stream of events: its type, and neither cache nor proxy holds it back.
pub(crate) fn event_stream_headers(response: &mut Response) {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
}

/// The response body: events as the execution sends them, until it drops its sender.
struct EventBody {
    events: EventStream,
    /// What is left of the event being sent: its data, then the line that ends it.
    pieces: VecDeque<Bytes>,
    /// How long the stream may be silent, and when it next speaks if nothing comes.
    keep_alive: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
}

/// What a silent stream sends: an SSE comment, which clients skip.
pub(crate) const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

impl http_body::Body for EventBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(piece) = self.pieces.pop_front() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(piece))));
        }
        let polled = self.events.poll_event(cx);
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
        polled.map(|event| {
            event.map(|event| {
                // The data is sent as it was made, not copied into one frame with the rest.
                self.pieces.push_back(Bytes::from(event.data));
                self.pieces.push_back(Bytes::from_static(b"\n\n"));
                let head = format!("event: {}\ndata: ", event.name);
                Ok(http_body::Frame::data(Bytes::from(head)))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_engine::{OutputSink, Stream};
    use airlock_service::stream::channel;
    use http_body_util::BodyExt;
    use std::sync::Arc;

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

    #[tokio::test]
    async fn events_are_framed_as_server_sent_events() {
        let (stream, mut events) = channel(Arc::new(|| {}), Default::default());
        let response = response(stream, Duration::ZERO);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/event-stream"
        );
        events.output(Stream::Stdout, "a€".as_bytes());
        events.truncated(Stream::Stderr, 10);
        drop(events);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "event: stdout\ndata: {\"text\":\"a€\"}\n\n\
             event: truncated\ndata: {\"stream\":\"stderr\",\"limit\":10}\n\n"
        );
    }
}
