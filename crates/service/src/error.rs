//! The one error of the API, as services and adapters make it: what kind of failure it is
//! ([`Kind`]), a stable code, a clear message, the field at fault, and when to come back. It
//! names no transport: HTTP makes each kind a status (`http/error.rs`, the one place), MCP a
//! refusal the model reads (`mcp.rs`). On the wire its body is always
//! `{"error": {"code", "message", "field"?, "request_id"?}}` ([`Error::body`]), on every
//! route (MCP's JSON-RPC answers aside, whose errors are JSON-RPC's own).

use airlock_api::{ApiError, ErrorBody};

/// What kind of failure an error is: what a transport needs to answer it (HTTP a status
/// each, MCP a refusal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The request is wrong: malformed, an unknown field, a value out of range.
    Invalid,
    /// No key was presented, or not a valid one.
    Unauthorized,
    /// The key may not do this, or the request came from a foreign origin.
    Forbidden,
    /// No such thing (or not the caller's).
    NotFound,
    /// The route does not take that method.
    MethodNotAllowed,
    /// The request does not accept what the route answers.
    NotAcceptable,
    /// The request did not arrive in time.
    Timeout,
    /// What it names is busy, or in a state that refuses it.
    Conflict,
    /// What it names existed and is lost for good.
    Gone,
    /// Too large: a body, code, files.
    TooLarge,
    /// A type of content the route does not take.
    UnsupportedMediaType,
    /// Addressed to a host this server does not answer for.
    Misdirected,
    /// Well formed, and what it asked for failed (an environment's build).
    Unprocessable,
    /// The key's own limits: its rate, concurrency, sessions or memory.
    RateLimited,
    /// airlock itself failed.
    Internal,
    /// The server cannot take it now: full, shutting down, the audit log or store down, a
    /// sandbox that cannot start. Always says when to come back.
    Unavailable,
}

#[derive(Debug, Clone)]
pub struct Error {
    pub kind: Kind,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    pub retry_after_secs: Option<u64>,
    /// The request was not read to its end, or was unsafe to go on with: a transport that
    /// keeps connections open closes this one.
    pub ends_connection: bool,
    /// A key was presented and is not valid (RFC 6750's `invalid_token`), rather than none.
    pub invalid_token: bool,
}

/// When to come back after an [`Kind::Unavailable`] unless its maker knows better: the
/// second after which the audit log's retry, the store's writer and the admission queue have
/// each had another go.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u64 = crate::audit_lines::RETRY_EVERY.as_secs();

impl Error {
    /// An error; an unavailable one says when to come back ([`UNAVAILABLE_RETRY_AFTER_SECS`]),
    /// as every 503 of the API does: the Python client retries only answers that carry one.
    pub fn new(kind: Kind, code: &'static str, message: impl Into<String>) -> Self {
        Error {
            kind,
            code,
            message: message.into(),
            field: None,
            retry_after_secs: (kind == Kind::Unavailable).then_some(UNAVAILABLE_RETRY_AFTER_SECS),
            ends_connection: false,
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

    /// The request was not fully read, or was unsafe: its connection must not serve another.
    pub fn ends_connection(mut self) -> Self {
        self.ends_connection = true;
        self
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::new(Kind::Invalid, "invalid_request", message).field(field)
    }

    pub fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::new(Kind::TooLarge, "payload_too_large", message).field(field)
    }

    /// No key was presented.
    pub fn unauthorized(message: &str) -> Self {
        Error::new(Kind::Unauthorized, "unauthorized", message)
    }

    /// A key was presented and is not valid.
    pub fn invalid_token(message: &str) -> Self {
        Error {
            invalid_token: true,
            ..Error::unauthorized(message)
        }
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Error::new(Kind::Forbidden, "forbidden", message)
    }

    pub fn not_found() -> Self {
        Error::new(Kind::NotFound, "not_found", "no such resource")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(Kind::Internal, "internal", message)
    }

    /// The server is shutting down: come back in 5 s (to another replica, or this one
    /// restarted).
    pub fn shutting_down() -> Self {
        Error::new(
            Kind::Unavailable,
            "shutting_down",
            "the server is shutting down",
        )
        .retry_after(5)
    }

    /// The body every error answer has: `{"error": {...}}`, with the request's id.
    pub fn body(&self, request_id: Option<String>) -> ErrorBody {
        ErrorBody {
            error: ApiError {
                code: self.code.to_owned(),
                message: self.message.clone(),
                field: self.field.clone(),
                request_id,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unavailable_error_says_when_to_come_back() {
        let outage = Error::new(Kind::Unavailable, "unavailable", "down");
        assert_eq!(outage.retry_after_secs, Some(1));
        assert_eq!(Error::shutting_down().retry_after_secs, Some(5));
        // Other refusals say it only when their maker does.
        assert_eq!(Error::not_found().retry_after_secs, None);
        let busy = Error::new(Kind::RateLimited, "rate_limited", "busy");
        assert_eq!(busy.retry_after_secs, None);
    }
}
