//! The one error type of the HTTP API: a status, a stable code, a clear message, the field at
//! fault, the request's id, and the headers some statuses need. The body is always
//! `{"error": {"code", "message", "field"?, "request_id"?}}`, on every route (MCP's JSON-RPC
//! answers aside, whose errors are JSON-RPC's own).

tokio::task_local! {
    /// The id of the request being answered, set by the guard around everything that answers
    /// it, so that an error made anywhere below carries it.
    pub static REQUEST_ID: String;
}

use airlock_api::{ApiError, ErrorBody};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone)]
pub struct Error {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    pub retry_after_secs: Option<u64>,
    pub close: bool,
    /// A 401 for a key that was presented and is not valid (RFC 6750's `invalid_token`).
    pub invalid_token: bool,
}

/// A 503's `Retry-After` unless its maker knows better: the second after which the audit
/// log's retry, the store's writer and the admission queue have each had another go.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u64 = crate::audit_lines::RETRY_EVERY.as_secs();

impl Error {
    /// An error; a 503 says when to come back (`Retry-After`, [`UNAVAILABLE_RETRY_AFTER_SECS`]),
    /// as every 503 of the API does: the Python client retries only answers that carry one.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Error {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after_secs: (status == StatusCode::SERVICE_UNAVAILABLE)
                .then_some(UNAVAILABLE_RETRY_AFTER_SECS),
            close: false,
            invalid_token: false,
        }
    }

    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs.max(1));
        self
    }

    /// Ask the client to close the connection (its request was not fully read, or was unsafe).
    pub fn close(mut self) -> Self {
        self.close = true;
        self
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::new(StatusCode::BAD_REQUEST, "invalid_request", message).field(field)
    }

    pub fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message).field(field)
    }

    /// 401: no key was presented.
    pub fn unauthorized(message: &str) -> Self {
        Error::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 401: a key was presented and is not valid.
    pub fn invalid_token(message: &str) -> Self {
        Error {
            invalid_token: true,
            ..Error::unauthorized(message)
        }
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Error::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn not_found() -> Self {
        Error::new(StatusCode::NOT_FOUND, "not_found", "no such resource")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// 503: the server is shutting down; come back in 5 s (another replica, or this one
    /// restarted).
    pub fn shutting_down() -> Self {
        Error::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        )
        .retry_after(5)
    }

    /// The body every error response has: `{"error": {...}}`.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ApiError {
                code: self.code.to_owned(),
                message: self.message.clone(),
                field: self.field.clone(),
                request_id: REQUEST_ID.try_with(Clone::clone).ok(),
            },
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 6750 3.1: no error code when no key was presented, `invalid_token` when it
            // was and is not valid.
            let challenge = if self.invalid_token {
                "Bearer realm=\"airlock\", error=\"invalid_token\", error_description=\"the API key is not valid\""
            } else {
                "Bearer realm=\"airlock\""
            };
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_503_says_when_to_come_back() {
        let outage = Error::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "down");
        let response = outage.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let shutting_down =
            Error::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "bye").retry_after(5);
        assert_eq!(
            shutting_down.into_response().headers()[header::RETRY_AFTER],
            "5"
        );
        // Other refusals say it only when their maker does.
        let missing = Error::not_found().into_response();
        assert!(!missing.headers().contains_key(header::RETRY_AFTER));
    }
}
