//! Answers written out as they are sent, and counted until they are.
//!
//! An execution's answer is JSON around its captured output. [`Answer::json`] serializes
//! everything but the output (small: the result is bounded by `max_result_bytes`), keeps the
//! output as the bytes the program wrote, and escapes them piece by piece as the client takes
//! them: the server holds the captured bytes plus a window, never an escaped copy (a control
//! byte takes six as `\u00XX`). The length is known ahead, so the answer has a
//! `Content-Length`.
//!
//! Every answer holds a [`Share`] of the memory budget until it is written out or its
//! connection is gone; [`count`] gives one to the answers made whole in memory (errors,
//! lists, reports), and [`Counted`] marks the ones that carry their own (the JSON answers
//! here, the event streams of `sse.rs`).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use airlock_api::Text;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::Response;

use crate::http::error::IntoHttp;
use http_body::{Frame, SizeHint};

use airlock_service::answer::{over_budget, Reserved, WINDOW};
use airlock_service::budget::Share;
use airlock_service::error::Error;
use airlock_service::keys::Key;
use airlock_service::SharedServices;

/// Bytes of output escaped per piece (at most 6 times as many are sent in it).
const PIECE: usize = 32 << 10;

/// A response that counts its own memory: `count` leaves it alone.
#[derive(Clone, Copy, Debug)]
pub struct Counted;

/// A JSON answer: serialized parts, and texts escaped as they are sent.
pub struct Answer {
    parts: VecDeque<Segment>,
    left: u64,
    share: Share,
}

enum Segment {
    Json(Bytes),
    Text { text: Text, at: usize },
}

impl Answer {
    /// `value` as JSON whose texts are written as they are sent, holding `share` (resized to
    /// what the answer holds, plus the window) until it is written. CPU work for large
    /// output: call it off the async workers.
    pub fn json<T: serde::Serialize + ?Sized>(value: &T, mut share: Share) -> Response {
        let deferred = match airlock_api::write_deferring_texts(value) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot serialize an answer");
                return Error::internal("the answer could not be serialized").into_http();
            }
        };
        let json = Bytes::from(deferred.json);
        let mut parts = VecDeque::with_capacity(deferred.texts.len() * 2 + 1);
        let (mut at, mut held, mut left) = (0, json.len() as u64, json.len() as u64);
        for (offset, text) in deferred.texts {
            // Up to and with the opening quote; the closing one starts the next part.
            parts.push_back(Segment::Json(json.slice(at..offset + 1)));
            at = offset + 1;
            held += text.len() as u64;
            left += text.json_len() - 2;
            parts.push_back(Segment::Text { text, at: 0 });
        }
        parts.push_back(Segment::Json(json.slice(at..)));
        share.set(held + WINDOW);
        let answer = Answer { parts, left, share };
        let mut response = Response::new(Body::new(answer));
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(left));
        response.extensions_mut().insert(Counted);
        response
    }
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        loop {
            let Some(part) = this.parts.front_mut() else {
                this.share.set(0);
                return Poll::Ready(None);
            };
            let piece = match part {
                Segment::Json(bytes) if bytes.is_empty() => {
                    this.parts.pop_front();
                    continue;
                }
                Segment::Json(bytes) => bytes.split_to(bytes.len().min(6 * PIECE)),
                Segment::Text { text, at } if *at >= text.len() => {
                    // Written: its memory is free (the bytes are not shared elsewhere).
                    let done = text.len() as u64;
                    this.parts.pop_front();
                    let now = this.share.bytes().saturating_sub(done);
                    this.share.set(now);
                    continue;
                }
                Segment::Text { text, at } => {
                    let mut out = Vec::with_capacity(PIECE + PIECE / 2);
                    *at = text.escape_from(*at, PIECE, &mut out);
                    Bytes::from(out)
                }
            };
            this.left -= piece.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// Counts an answer made whole in memory, from now until it is written out: against the
/// caller's share (with the reservation its handler made, if any) and everyone's. One that
/// does not fit is replaced by a short 429 or 503: the key (or the server) holds too many
/// answers nobody has read.
pub fn count(state: &SharedServices, key: Option<&Key>, mut response: Response) -> Response {
    if response.extensions().get::<Counted>().is_some() {
        return response;
    }
    let reserved = response
        .extensions_mut()
        .remove::<Reserved>()
        .and_then(|r| r.take());
    let Some(size) = http_body::Body::size_hint(response.body()).exact() else {
        return response; // a stream of unknown length counts its own
    };
    let share = match (reserved, key) {
        (Some(mut share), _) => {
            // The reservation was made for this answer: it is held, room or not.
            share.set(size);
            share
        }
        (None, Some(key)) => {
            let mut share = state.memory.share(Some(key));
            match share.cover(size) {
                Ok(()) => share,
                Err(over) => {
                    state
                        .metrics
                        .security_events
                        .add(&[airlock_service::metrics::event::ANSWER_OVER_BUDGET]);
                    tracing::warn!(
                        key = key.name(),
                        bytes = size,
                        "an answer did not fit in the memory budget"
                    );
                    let error = over_budget(over, "answers").into_http();
                    return count(state, None, error);
                }
            }
        }
        (None, None) => {
            // Short answers before a key is known (errors, health): counted, never refused.
            let mut share = state.memory.share(None);
            share.set(size);
            share
        }
    };
    response.map(|inner| {
        Body::new(Held {
            inner,
            piece: Bytes::new(),
            share,
            slot: None,
        })
    })
}

/// Holds an answer of unknown length whose handler leaves its reservation in `slot` while
/// it is sent (an MCP call answered as server-sent events, its notifications first, its
/// result when the call ends): the slot is kept, and the body handed to hyper in pieces,
/// until its last piece is taken.
pub fn hold_stream(
    state: &SharedServices,
    key: &Key,
    response: Response,
    slot: Reserved,
) -> Response {
    let share = state.memory.share(Some(key));
    let mut response = response.map(|inner| {
        Body::new(Held {
            inner,
            piece: Bytes::new(),
            share,
            slot: Some(slot),
        })
    });
    response.extensions_mut().insert(Counted);
    response
}

/// A body and the share of memory it holds until it is written out. Its frames go to hyper
/// in pieces: hyper asks for the next one only once it has room to write it (its buffer is
/// `MAX_HEAD`), so a frame made whole in memory is counted until its last piece is taken,
/// not freed from the count the moment hyper has it.
struct Held {
    inner: Body,
    piece: Bytes,
    share: Share,
    /// Where a stream's reservation is left, held as long as the share.
    slot: Option<Reserved>,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if !self.piece.is_empty() {
            let n = self.piece.len().min(PIECE);
            let piece = self.piece.split_to(n);
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    self.piece = data;
                    let n = self.piece.len().min(PIECE);
                    let piece = self.piece.split_to(n);
                    Poll::Ready(Some(Ok(Frame::data(piece))))
                }
                Err(other) => Poll::Ready(Some(Ok(other))),
            },
            Poll::Ready(None) => {
                self.share.set(0);
                drop(self.slot.take().and_then(|slot| slot.take()));
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.piece.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let piece = self.piece.len() as u64;
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + piece);
        }
        hint.set_lower(inner.lower() + piece);
        hint
    }
}

/// The next piece of a body made as it is sent, and what makes the one after it.
pub type Step<T> = Pin<Box<dyn std::future::Future<Output = Option<(Bytes, T)>> + Send + 'static>>;

/// A body whose pieces come from an async source (a file read as it is sent, an events log
/// followed while it grows): each call of `next` gives a piece and the source for the rest,
/// or the end. It holds `share` (what a piece and the window take) until it ends.
pub struct Unfolded<T> {
    source: Option<T>,
    step: Option<Step<T>>,
    next: fn(T) -> Step<T>,
    left: Option<u64>,
    share: Share,
}

impl<T: Send + 'static> Unfolded<T> {
    /// A response of `source`'s pieces, with an exact length when `len` is known; counted
    /// by `share`.
    pub fn response(source: T, next: fn(T) -> Step<T>, len: Option<u64>, share: Share) -> Response {
        let body = Unfolded {
            source: Some(source),
            step: None,
            next,
            left: len,
            share,
        };
        let mut response = Response::new(Body::new(body));
        if let Some(len) = len {
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        response.extensions_mut().insert(Counted);
        response
    }
}

// The source is moved in and out, never pinned.
impl<T> Unpin for Unfolded<T> {}

impl<T: Send + 'static> http_body::Body for Unfolded<T> {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let step = match &mut this.step {
            Some(step) => step,
            None => match this.source.take() {
                Some(source) => this.step.insert((this.next)(source)),
                None => return Poll::Ready(None),
            },
        };
        match step.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                this.step = None;
                this.share.set(0);
                match this.left {
                    // Cut short (the file changed under it): the client must not take it whole.
                    Some(left) if left > 0 => Poll::Ready(Some(Err(std::io::Error::other(
                        "the body ended before its length",
                    )))),
                    _ => Poll::Ready(None),
                }
            }
            Poll::Ready(Some((piece, source))) => {
                this.step = None;
                this.source = Some(source);
                if let Some(left) = &mut this.left {
                    *left = left.saturating_sub(piece.len() as u64);
                }
                Poll::Ready(Some(Ok(Frame::data(piece))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_service::budget::MemoryBudget;
    use airlock_service::config::KeyConfig;
    use airlock_service::keys::{hash_key, KeyStore};
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_body_made_whole_is_counted_until_its_last_piece_is_taken() {
        let store =
            KeyStore::new(vec![KeyConfig::new("a", hash_key("key-for-tests-000a"))]).unwrap();
        let budget = MemoryBudget::new(16 << 20, 8 << 20, &store.keys());
        let size = 5 * PIECE + 3;
        let share = budget.reserve(&store.keys()[0], size as u64).unwrap();
        let mut body = Held {
            inner: Body::from(vec![7u8; size]),
            piece: Bytes::new(),
            share,
            slot: None,
        };
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(size as u64));
        let mut taken = 0;
        while let Some(frame) = body.frame().await {
            let n = frame.unwrap().into_data().unwrap().len();
            assert!(n <= PIECE);
            taken += n;
            // Held in full until hyper comes back after the last piece.
            assert_eq!(budget.used_by("a"), size as u64);
        }
        assert_eq!((taken, budget.used_by("a")), (size, 0));
    }

    #[tokio::test]
    async fn a_stream_holds_the_reservation_left_in_its_slot_until_it_ends() {
        let store =
            KeyStore::new(vec![KeyConfig::new("a", hash_key("key-for-tests-000a"))]).unwrap();
        let budget = MemoryBudget::new(16 << 20, 8 << 20, &store.keys());
        let slot = Reserved::default();
        let mut body = Held {
            inner: Body::from(vec![7u8; 3 * PIECE]),
            piece: Bytes::new(),
            share: budget.share(Some(&store.keys()[0])),
            slot: Some(slot.clone()),
        };
        // Left by the handler after the response began, then the handler is done.
        slot.keep(budget.reserve(&store.keys()[0], 1000).unwrap());
        drop(slot);
        while let Some(frame) = body.frame().await {
            frame.unwrap();
            assert_eq!(budget.used_by("a"), 1000);
        }
        assert_eq!(budget.used_by("a"), 0);
    }

    #[derive(serde::Serialize)]
    struct Sample {
        id: &'static str,
        stdout: Text,
        stderr: Text,
        value: serde_json::Value,
    }

    #[tokio::test]
    async fn an_answer_streamed_in_pieces_is_the_json_of_the_whole() {
        let mut big: Vec<u8> = (0..=255u8).cycle().take(3 * PIECE + 17).collect();
        big.extend_from_slice("é€\u{1F600}".as_bytes());
        for (out, err) in [
            (big.clone(), Vec::new()),
            (Vec::new(), Vec::new()),
            (vec![1u8; 7 * PIECE], b"\xff\"\\".to_vec()),
        ] {
            let sample = Sample {
                id: "ex_1",
                stdout: Text::from(out),
                stderr: Text::from(err),
                value: serde_json::json!({"stdout": "\"\"", "n": [1, 2.5, null]}),
            };
            let expected = serde_json::to_vec(&sample).unwrap();
            let store =
                KeyStore::new(vec![KeyConfig::new("a", hash_key("key-for-tests-000a"))]).unwrap();
            let budget = MemoryBudget::new(1 << 30, 1 << 30, &store.keys());
            let share = budget.reserve(&store.keys()[0], 1).unwrap();
            let response = Answer::json(&sample, share);
            // What it holds: the texts as written, the JSON around them, the window.
            let raw = sample.stdout.len() + sample.stderr.len();
            let around = serde_json::to_vec(&Sample {
                stdout: Text::default(),
                stderr: Text::default(),
                ..sample
            })
            .unwrap()
            .len();
            assert_eq!(budget.used(), (raw + around) as u64 + WINDOW);
            assert_eq!(
                response.headers()[header::CONTENT_LENGTH],
                expected.len().to_string()
            );
            let mut body = response.into_body();
            let mut got = Vec::new();
            let mut pieces = 0;
            while let Some(frame) = body.frame().await {
                let data = frame.unwrap().into_data().unwrap();
                assert!(data.len() <= 6 * PIECE, "a piece of {} bytes", data.len());
                got.extend_from_slice(&data);
                pieces += 1;
            }
            assert_eq!(got, expected);
            assert!(pieces >= 1);
            assert_eq!(budget.used(), 0, "given back once written");
        }
    }
}
