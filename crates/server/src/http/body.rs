//! An HTTP request's body handed to the services as theirs ([`airlock_service::body::Body`]):
//! its declared type and length from the headers, its data frames as they arrive (trailers
//! are skipped).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{header, HeaderMap};

use airlock_service::body::{Body, Chunks};

/// The body of `req`, for a service to read.
pub(crate) fn body_of(req: Request) -> Body {
    let (parts, body) = req.into_parts();
    from_parts(&parts.headers, body)
}

/// A body and the headers that describe it.
pub(crate) fn from_parts(headers: &HeaderMap, body: axum::body::Body) -> Body {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let declared_len = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    Body {
        content_type,
        declared_len,
        chunks: Box::pin(Frames(body)),
    }
}

/// The data frames of a body.
struct Frames(axum::body::Body);

impl Chunks for Frames {
    fn poll_chunk(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, String>>> {
        loop {
            let frame = match http_body::Body::poll_frame(Pin::new(&mut self.0), cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.to_string()))),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                return Poll::Ready(Some(Ok(data)));
            }
        }
    }
}
