"""The exceptions the client raises: one class per HTTP status airlock answers with (its error
codes refine some), one for answers that are not what airlock sends, one for the network, and
one for executions that did not end `ok` when a value was asked for."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import httpx

    from airlock_client.models import Execution

__all__ = [
    "AirlockError",
    "APIError",
    "BadRequest",
    "BuildFailed",
    "Conflict",
    "ExecutionFailed",
    "Forbidden",
    "InternalServerError",
    "MethodNotAllowed",
    "MisdirectedRequest",
    "NotFound",
    "PayloadTooLarge",
    "ProtocolError",
    "RateLimited",
    "RequestTimeout",
    "ServiceUnavailable",
    "SessionBusy",
    "SessionEnded",
    "TransportError",
    "Unauthorized",
    "UnsupportedMediaType",
    "error_for",
    "raise_for_status",
]

# The most of an unexpected body an error message quotes.
_QUOTE = 200


class AirlockError(Exception):
    """Everything this client raises on purpose derives from this."""


class TransportError(AirlockError):
    """The server could not be reached, or the connection failed or timed out mid-request.
    The request may or may not have been run; `__cause__` is httpx's exception."""


class ProtocolError(AirlockError, ValueError):
    """An answer that is not what airlock sends: wrong content type, malformed or oversized
    JSON, a missing field, an unknown form. Nothing in it was used."""


class APIError(AirlockError):
    """The server refused or failed a request: its HTTP `status`, airlock's stable `code`
    (`invalid_request`, `rate_limited`, ...), the `message`, the request `field` at fault, the
    server's `request_id` (its log and audit lines carry it) and `retry_after` seconds when
    the server said when to come back."""

    status: int = 0

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.request_id = request_id
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.status} {self.code}: {self.message}{where}"


class BadRequest(APIError):
    """400: `invalid_json`, `invalid_request` or `limit_above_ceiling`, with the `field`."""


class Unauthorized(APIError):
    """401: no key, or a key the server does not know."""


class Forbidden(APIError):
    """403: the key lacks the scope the route needs."""


class NotFound(APIError):
    """404: no such execution, session, environment or file for this key."""


class MethodNotAllowed(APIError):
    """405."""


class RequestTimeout(APIError):
    """408: the request's body did not arrive in time."""


class Conflict(APIError):
    """409."""


class SessionBusy(Conflict):
    """409 `session_busy`: another request of the session is running."""


class SessionEnded(Conflict):
    """409 `session_ended`: a cell ended the session (its answer said `session_ended`)."""


class PayloadTooLarge(APIError):
    """413: a body, a file or inputs over the server's limits."""


class UnsupportedMediaType(APIError):
    """415."""


class MisdirectedRequest(APIError):
    """421: the Host header names no address this server answers for."""


class BuildFailed(APIError):
    """422 `build_failed`: an environment's packages did not install."""


class RateLimited(APIError):
    """429: the key's rate, concurrency or memory share is used up; `retry_after` says when."""


class InternalServerError(APIError):
    """500: airlock itself failed."""


class ServiceUnavailable(APIError):
    """503: `overloaded`, `shutting_down` or `unavailable` (sandboxes cannot start, the audit
    log cannot be written); `retry_after` says when to come back."""


class ExecutionFailed(AirlockError):
    """An execution that did not end `ok` where its value was asked for (`call`,
    `Execution.raise_for_status`): the whole `execution` is attached."""

    def __init__(self, execution: Execution) -> None:
        super().__init__(execution)
        self.execution = execution

    def __str__(self) -> str:
        e = self.execution
        if e.error is not None:
            return f"{e.status}: {e.error.type}: {e.error.message}"
        return f"{e.status} (exit code {e.exit_code}, signal {e.signal}, limits hit {e.limits_hit})"


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    421: MisdirectedRequest,
    422: BuildFailed,
    429: RateLimited,
    500: InternalServerError,
    503: ServiceUnavailable,
}

_BY_CODE: dict[str, type[APIError]] = {
    "session_busy": SessionBusy,
    "session_ended": SessionEnded,
}


def retry_after(headers: Mapping[str, str]) -> float | None:
    """`Retry-After` in seconds when it is a plain number of them (airlock sends only that);
    None otherwise."""
    value = headers.get("retry-after")
    if value is None or not value.strip().isdigit():
        return None
    return float(min(int(value.strip()), 86_400))


def error_for(status: int, headers: Mapping[str, str], body: bytes) -> APIError:
    """The exception for an error answer. airlock's `{"error": {"code", "message", "field"}}`
    gives the code; anything else (a proxy's HTML page) keeps the status with code `unknown`
    and the start of the body as message."""
    code, message, field = "unknown", _quote(body), None
    if headers.get("content-type", "").split(";")[0].strip() == "application/json":
        try:
            error = json.loads(body)["error"]
            if isinstance(error, dict) and isinstance(error.get("code"), str):
                code = error["code"]
                message = str(error.get("message", ""))
                field = error.get("field") if isinstance(error.get("field"), str) else None
        except (ValueError, KeyError, TypeError, RecursionError):
            pass
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, APIError)
    return cls(
        status,
        code,
        message,
        field=field,
        request_id=headers.get("x-request-id"),
        retry_after=retry_after(headers),
    )


def raise_for_status(response: httpx.Response) -> None:
    """Raises the typed exception for an airlock error answer, as httpx's own
    `raise_for_status` would a generic one; does nothing for 1xx-3xx. For code that calls the
    HTTP API with httpx directly (the response must have been read)."""
    if response.status_code >= 400:
        raise error_for(response.status_code, response.headers, response.content)


def _quote(body: bytes) -> str:
    text = body[: _QUOTE * 4].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else " " for c in text)
    return text[:_QUOTE] + ("…" if len(text) > _QUOTE or len(body) > _QUOTE * 4 else "")
