//! Request bodies as the services read them, whatever carries them: what the sender says of
//! a body and its bytes as they arrive ([`Body`], which each transport makes), read within
//! the size, the time and the memory budget for bodies ([`read_body`]), and parsed as JSON
//! naming the field at fault ([`parse_json`]).

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::answer::over_budget;
use crate::budget::Share;
use crate::error::{Error, Kind};
use crate::keys::Key;
use crate::metrics::event;
use crate::services::SharedServices;

/// A request's body as a transport hands it over.
pub struct Body {
    /// The content type the sender declared (`application/json; charset=utf-8`), or empty.
    pub content_type: String,
    /// The length the sender declared, if it did: a body declared too large is refused
    /// before a byte of it is read.
    pub declared_len: Option<u64>,
    /// The bytes, as they arrive.
    pub chunks: Pin<Box<dyn Chunks>>,
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body")
            .field("content_type", &self.content_type)
            .field("declared_len", &self.declared_len)
            .finish_non_exhaustive()
    }
}

/// A body's bytes as they arrive.
pub trait Chunks: Send {
    /// The next piece; `None` at the end; an error when the transport could not read it.
    fn poll_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, String>>>;
}

/// A request body, and its share of the memory budget for bodies.
#[derive(Debug)]
pub struct ReadBody {
    pub bytes: Vec<u8>,
    pub share: Share,
}

/// Reads a JSON body's bytes: `application/json` only, no more than the configured bytes
/// (counted as they arrive, whatever their framing), within the body timeout, and within the
/// memory budget for bodies (all requests', and the key's own share).
pub async fn read_body(state: &SharedServices, key: &Key, body: Body) -> Result<ReadBody, Error> {
    read_body_as(state, key, body, true).await
}

/// As [`read_body`]; `json: false` takes any content type (file uploads).
pub async fn read_body_as(
    state: &SharedServices,
    key: &Key,
    body: Body,
    json: bool,
) -> Result<ReadBody, Error> {
    let Body {
        content_type,
        declared_len,
        mut chunks,
    } = body;
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if json && !mime.eq_ignore_ascii_case("application/json") {
        state.metrics.security_events.add(&[event::REJECTED_INPUT]);
        return Err(Error::new(
            Kind::UnsupportedMediaType,
            "unsupported_media_type",
            "the body must be Content-Type: application/json",
        )
        .ends_connection());
    }
    let limit = state.config.http.max_body_bytes;
    let too_large = || {
        state.metrics.security_events.add(&[event::REJECTED_INPUT]);
        Error::too_large("body", format!("the body is larger than {limit} bytes")).ends_connection()
    };
    if declared_len.is_some_and(|n| n > limit) {
        return Err(too_large()); // before reading a byte of it
    }
    let timeout = Duration::from_millis(state.config.http.body_timeout_ms);
    let read = async {
        // Memory is reserved as bytes arrive, not on the sender's word.
        let mut bytes = Vec::with_capacity(declared_len.unwrap_or(0).min(64 << 10) as usize);
        let mut share = state.memory.share(Some(key));
        while let Some(chunk) = poll_fn(|cx| chunks.as_mut().poll_chunk(cx)).await {
            let data = chunk.map_err(|e| {
                Error::invalid("body", format!("reading the body: {e}")).ends_connection()
            })?;
            let total = bytes.len() as u64 + data.len() as u64;
            if total > limit {
                return Err(too_large());
            }
            share.cover(total).map_err(|over| {
                over_budget(over, "request bodies and answers").ends_connection()
            })?;
            bytes.extend_from_slice(&data);
        }
        Ok((bytes, share))
    };
    // A body still arriving when shutdown begins will not be run: no need to wait for it.
    let read = async {
        tokio::select! {
            read = read => read,
            () = state.shutdown_begun() => Err(Error::shutting_down().ends_connection()),
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Err(_) => Err(
            Error::new(Kind::Timeout, "timeout", "the body did not arrive in time")
                .ends_connection(),
        ),
        Ok(Err(e)) => Err(e),
        Ok(Ok((bytes, share))) => Ok(ReadBody { bytes, share }),
    }
}

/// Parses a JSON body; errors name the field at fault.
pub fn parse_json<T: DeserializeOwned>(state: &SharedServices, bytes: &[u8]) -> Result<T, Error> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        state.metrics.security_events.add(&[event::REJECTED_INPUT]);
        let path = e.path().to_string();
        let err = Error::new(Kind::Invalid, "invalid_json", e.inner().to_string());
        if path == "." {
            err
        } else {
            err.field(path)
        }
    })
}
