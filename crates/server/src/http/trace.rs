//! A request's span, for the guard: begun with the request (continuing the caller's W3C
//! `traceparent`), found by the request's id while its handler runs
//! (`Telemetry::request_span`), and ended once its answer is written out, with the
//! `answer_write` phase from the handler's answer to there.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use opentelemetry::KeyValue;

use airlock_service::telemetry::Span;
use airlock_service::SharedServices;

/// Routes left untraced: probes and scrapes would be most spans and tell nothing.
const UNTRACED: &[&str] = &["/healthz", "/readyz", "/metrics"];

/// The request's span, when traces are on: named `METHOD route` (the route's template).
pub fn begin(state: &SharedServices, req: &Request, route: &str, request_id: &str) -> Option<Span> {
    if !state.telemetry.enabled() || UNTRACED.contains(&route) {
        return None;
    }
    let headers = req.headers();
    // Two `traceparent`s are no parent (which one would be?); `tracestate`s are one list.
    let mut parents = headers.get_all("traceparent").iter();
    let traceparent = match (parents.next(), parents.next()) {
        (Some(v), None) => v.to_str().ok(),
        _ => None,
    };
    let states: Vec<&str> = headers
        .get_all("tracestate")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let tracestate = (!states.is_empty()).then(|| states.join(","));
    let method = req.method().as_str();
    let mut span = state.telemetry.request(
        format!("{method} {route}"),
        request_id,
        (traceparent, tracestate.as_deref()),
        vec![
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("http.route", route.to_owned()),
            KeyValue::new("airlock.request_id", request_id.to_owned()),
        ],
    )?;
    // What it ends with if its client goes before the answer (the log's 499).
    span.fail("client gone");
    Some(span)
}

/// The answer carries the request's span until it is written out.
pub fn answered(state: &SharedServices, span: Option<Span>, response: Response) -> Response {
    let Some(mut span) = span else {
        return response;
    };
    let status = response.status().as_u16();
    span.set(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    // A server span fails on a 5xx only (OpenTelemetry's HTTP conventions).
    span.succeed();
    if status >= 500 {
        span.fail("server error");
    }
    let writing = state.telemetry.phase(Some(span.context()), "answer_write");
    response.map(|body| {
        Body::new(Traced {
            body,
            writing,
            request: Some(span),
            written: false,
        })
    })
}

/// A body that ends its spans when it is dropped: once written out, or with its connection.
struct Traced {
    body: Body,
    writing: Option<Span>,
    request: Option<Span>,
    written: bool,
}

impl http_body::Body for Traced {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.body.is_end_stream() {
            self.written = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if let Some(mut writing) = self.writing.take() {
            // An empty body (a 204) is dropped unpolled once hyper sees it ended: written.
            if !self.written && !http_body::Body::is_end_stream(&self.body) {
                writing.fail("not written out");
            }
            // The phase ends before its request.
            drop(writing);
        }
        drop(self.request.take());
    }
}
