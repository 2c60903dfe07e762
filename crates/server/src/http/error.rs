//! The API's errors as HTTP answers them, in one place: the status of each [`Kind`], the
//! headers some need (`WWW-Authenticate`, `Retry-After`, `Connection: close`) and the body,
//! which carries the request's id.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use airlock_service::error::{Error, Kind};

tokio::task_local! {
    /// The id of the request being answered, set by the guard around everything that answers
    /// it, so that an error made anywhere below carries it.
    pub static REQUEST_ID: String;
}

/// The status an error of `kind` is answered with.
pub(crate) fn status(kind: Kind) -> StatusCode {
    match kind {
        Kind::Invalid => StatusCode::BAD_REQUEST,
        Kind::Unauthorized => StatusCode::UNAUTHORIZED,
        Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Kind::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
        Kind::Timeout => StatusCode::REQUEST_TIMEOUT,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::Gone => StatusCode::GONE,
        Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Kind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Kind::Misdirected => StatusCode::MISDIRECTED_REQUEST,
        Kind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        Kind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The kind of an error status another library answered with (rmcp's own refusals), so that
/// it is answered in the API's one shape with the same status.
pub(crate) fn kind_of(status: StatusCode) -> Kind {
    const KINDS: [Kind; 16] = [
        Kind::Invalid,
        Kind::Unauthorized,
        Kind::Forbidden,
        Kind::NotFound,
        Kind::MethodNotAllowed,
        Kind::NotAcceptable,
        Kind::Timeout,
        Kind::Conflict,
        Kind::Gone,
        Kind::TooLarge,
        Kind::UnsupportedMediaType,
        Kind::Misdirected,
        Kind::Unprocessable,
        Kind::RateLimited,
        Kind::Internal,
        Kind::Unavailable,
    ];
    match KINDS.into_iter().find(|k| self::status(*k) == status) {
        Some(kind) => kind,
        None if status.is_server_error() => Kind::Internal,
        None => Kind::Invalid,
    }
}

/// An [`Error`] as the HTTP adapter answers it: the one place an error becomes a status.
#[derive(Debug)]
pub(crate) struct HttpError(pub(crate) Error);

impl From<Error> for HttpError {
    fn from(error: Error) -> Self {
        HttpError(error)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let HttpError(error) = self;
        error.into_http()
    }
}

/// The response of an [`Error`].
pub(crate) trait IntoHttp {
    fn into_http(self) -> Response;
}

impl IntoHttp for Error {
    fn into_http(self) -> Response {
        let status = status(self.kind);
        let body = self.body(REQUEST_ID.try_with(Clone::clone).ok());
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if self.kind == Kind::Unauthorized {
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
        if self.ends_connection {
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
        let outage = Error::new(Kind::Unavailable, "unavailable", "down");
        let response = outage.into_http();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let shutting_down = Error::shutting_down();
        assert_eq!(
            shutting_down.into_http().headers()[header::RETRY_AFTER],
            "5"
        );
        // Other refusals say it only when their maker does.
        let missing = Error::not_found().into_http();
        assert!(!missing.headers().contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn each_kind_has_its_own_status_and_back() {
        for code in [
            400, 401, 403, 404, 405, 406, 408, 409, 410, 413, 415, 421, 422, 429, 500, 503,
        ] {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(super::status(kind_of(status)), status, "{code}");
        }
        assert_eq!(kind_of(StatusCode::BAD_GATEWAY), Kind::Internal);
        assert_eq!(kind_of(StatusCode::IM_A_TEAPOT), Kind::Invalid);
    }
}
