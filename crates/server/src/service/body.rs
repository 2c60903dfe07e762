//! Request bodies as the services read them: within the size, the time and the memory
//! budget for bodies ([`read_body`]), and parsed as JSON naming the field at fault
//! ([`parse_json`]).

use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use crate::answer::over_budget;
use crate::budget::Share;
use crate::error::Error;
use crate::keys::Key;
use crate::metrics::event;
use crate::SharedState;

/// A request body, and its share of the memory budget for bodies.
pub(crate) struct ReadBody {
    pub bytes: Vec<u8>,
    pub share: Share,
}

/// Reads a JSON body's bytes: `application/json` only, no more than the configured bytes
/// (counted as they arrive, chunked or not), within the body timeout, and within the memory
/// budget for bodies (all requests', and the key's own share).
pub(crate) async fn read_body(
    state: &SharedState,
    key: &Key,
    req: Request,
) -> Result<ReadBody, Error> {
    read_body_as(state, key, req, true).await
}

/// As [`read_body`]; `json: false` takes any content type (file uploads).
pub(crate) async fn read_body_as(
    state: &SharedState,
    key: &Key,
    req: Request,
    json: bool,
) -> Result<ReadBody, Error> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if json && !mime.eq_ignore_ascii_case("application/json") {
        state.metrics.security_events.add(&[event::REJECTED_INPUT]);
        return Err(Error::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be Content-Type: application/json",
        )
        .close());
    }
    let limit = state.config.http.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        state.metrics.security_events.add(&[event::REJECTED_INPUT]);
        Error::too_large("body", format!("the body is larger than {limit} bytes")).close()
    };
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large()); // before reading a byte of it
    }
    let timeout = Duration::from_millis(state.config.http.body_timeout_ms);
    let read = async {
        let mut body = req.into_body();
        // Memory is reserved as bytes arrive, not on the sender's word.
        let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(64 << 10) as usize);
        let mut share = state.memory.share(Some(key));
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| Error::invalid("body", format!("reading the body: {e}")).close())?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let total = bytes.len() as u64 + data.len() as u64;
            if total > limit {
                return Err(too_large());
            }
            share
                .cover(total)
                .map_err(|over| over_budget(over, "request bodies and answers").close())?;
            bytes.extend_from_slice(&data);
        }
        Ok((bytes, share))
    };
    // A body still arriving when shutdown begins will not be run: no need to wait for it.
    let read = async {
        tokio::select! {
            read = read => read,
            () = state.shutdown_begun() => Err(Error::shutting_down().close()),
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Err(_) => Err(Error::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            "the body did not arrive in time",
        )
        .close()),
        Ok(Err(e)) => Err(e),
        Ok(Ok((bytes, share))) => Ok(ReadBody { bytes, share }),
    }
}

/// Parses a JSON body; errors name the field at fault.
pub(crate) fn parse_json<T: DeserializeOwned>(
    state: &SharedState,
    bytes: &[u8],
) -> Result<T, Error> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        state.metrics.security_events.add(&[event::REJECTED_INPUT]);
        let path = e.path().to_string();
        let err = Error::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            e.inner().to_string(),
        );
        if path == "." {
            err
        } else {
            err.field(path)
        }
    })
}
