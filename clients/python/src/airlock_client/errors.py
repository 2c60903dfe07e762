"""The exceptions the client raises: one class per HTTP status airlock answers with (its error
codes refine some), one for answers that are not what airlock sends, one for the network, and
one for executions that did not end `ok` when a value was asked for."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import httpx

    from airlock_client.models import BackgroundError, BackgroundState, Execution

__all__ = [
    "AirlockError",
    "APIError",
    "BackgroundNotFinished",
    "BadRequest",
    "BuildFailed",
    "Conflict",
    "EvaluationFailed",
    "ExecutionFailed",
    "Forbidden",
    "InternalServerError",
    "MethodNotAllowed",
    "MisdirectedRequest",
    "NotFound",
    "PayloadTooLarge",
    "ProtocolError",
    "QuotaExceeded",
    "RateLimited",
    "RequestTimeout",
    "ServiceUnavailable",
    "SessionBusy",
    "SessionEnded",
    "SessionLost",
    "SnapshotFailed",
    "SnapshotInvalid",
    "TransportError",
    "Unauthorized",
    "UnsupportedMediaType",
    "VolumeBusy",
    "VolumeFull",
    "VolumeInUse",
    "VolumesUnavailable",
    "WaitTimeout",
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
    """404: no such execution, session, environment, volume or file for this key."""


class MethodNotAllowed(APIError):
    """405."""


class RequestTimeout(APIError):
    """408: the request's body did not arrive in time."""


class Conflict(APIError):
    """409."""


class SessionBusy(Conflict):
    """409 `session_busy`: another request of the session is running (a cell, or a pause,
    resume or fork)."""


class SessionEnded(Conflict):
    """409 `session_ended`: a cell ended the session (its answer said `session_ended`)."""


class VolumeBusy(Conflict):
    """409 `volume_busy`: another execution, session or file request writes the volume (one
    writer at a time); the `message` names the holder. Mount it `read_only`, or wait."""


class VolumeInUse(Conflict):
    """409 `volume_in_use`: the volume cannot be deleted while an execution, a session or a
    file request holds it; the `message` names the holders."""


class SessionLost(APIError):
    """410 `session_lost`: the session was open when the server stopped (was restarted or
    killed); open sessions do not survive a restart (paused ones do: `Session.pause`).
    Start another."""


class PayloadTooLarge(APIError):
    """413: a body, a file or inputs over the server's limits."""


class VolumeFull(PayloadTooLarge):
    """413 `volume_full`: the upload does not fit in the volume's bytes or entries; nothing of
    it was left."""


class QuotaExceeded(PayloadTooLarge):
    """413 `quota_exceeded`: a new volume, or a session's snapshot at `pause`, would pass the
    key's quota (its total bytes, its number of volumes or of paused sessions). A session
    refused a pause runs on as it was."""


class UnsupportedMediaType(APIError):
    """415."""


class MisdirectedRequest(APIError):
    """421: the Host header names no address this server answers for."""


class BuildFailed(APIError):
    """422 `build_failed`: an environment's packages did not install."""


class VolumesUnavailable(APIError):
    """422 `volumes_unavailable`: this server cannot make or mount volumes (it does not run as
    root, or the host has no loop devices); the `message` says why."""


class SnapshotFailed(APIError):
    """422 `snapshot_failed`: the session's sandbox could not take or read its snapshot; the
    `message` says why."""


class SnapshotInvalid(APIError):
    """422 `snapshot_invalid`: a paused session's snapshot was altered, cut short or is not
    this session's; it was refused, and nothing of it ran."""


class RateLimited(APIError):
    """429: the key's rate, concurrency or memory share is used up; `retry_after` says when."""


class InternalServerError(APIError):
    """500: airlock itself failed."""


class ServiceUnavailable(APIError):
    """503: `overloaded`, `shutting_down` or `unavailable` (sandboxes cannot start, the audit
    log cannot be written); `retry_after` says when to come back."""


class EvaluationFailed(AirlockError, ValueError):
    """`Evaluation.raise_for_error` on an expression the evaluator refused or that raised:
    `type` and `message` are the Python-style error's (`ZeroDivisionError`, `NotAllowedError`)."""

    def __init__(self, type: str, message: str) -> None:
        super().__init__(type, message)
        self.type = type
        self.message = message

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


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


class BackgroundNotFinished(AirlockError):
    """`wait()` on a background execution that ended without finishing: its `state`
    (`failed`, `cancelled` or `interrupted`), the server's `error` (code and message) when it
    gave one, and the `execution` when it was killed while it ran (a cancelled one)."""

    def __init__(
        self,
        id: str,
        state: BackgroundState,
        error: BackgroundError | None,
        execution: Execution | None = None,
    ) -> None:
        super().__init__(id, state, error)
        self.id = id
        self.state = state
        self.error = error
        self.execution = execution

    def __str__(self) -> str:
        why = ""
        if self.error is not None:
            why = f": {self.error.code}: {self.error.message}"
        elif self.execution is not None and self.execution.error is not None:
            why = f": {self.execution.status}: {self.execution.error.message}"
        return f"background execution {self.id} {self.state}{why}"


class WaitTimeout(AirlockError, TimeoutError):
    """`wait(timeout=...)` passed its timeout; the execution goes on (`state` as last seen)."""

    def __init__(self, id: str, state: str, timeout: float) -> None:
        super().__init__(id, state, timeout)
        self.id = id
        self.state = state
        self.timeout = timeout

    def __str__(self) -> str:
        return f"background execution {self.id} still {self.state} after {self.timeout:g} s (it goes on)"


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    410: SessionLost,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    421: MisdirectedRequest,
    422: BuildFailed,
    429: RateLimited,
    500: InternalServerError,
    503: ServiceUnavailable,
}

# The status each of airlock's error codes comes with: an `error` event of a stream (whose
# own status was 200) stands for it.
STATUS_OF_CODE: dict[str, int] = {
    "invalid_json": 400,
    "invalid_request": 400,
    "limit_above_ceiling": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "timeout": 408,
    "conflict": 409,
    "session_busy": 409,
    "session_ended": 409,
    "cancelled": 409,
    "volume_busy": 409,
    "volume_in_use": 409,
    "session_lost": 410,
    "payload_too_large": 413,
    "volume_full": 413,
    "quota_exceeded": 413,
    "unsupported_media_type": 415,
    "misdirected_request": 421,
    "build_failed": 422,
    "volumes_unavailable": 422,
    "snapshot_failed": 422,
    "snapshot_invalid": 422,
    "rate_limited": 429,
    "internal": 500,
    "overloaded": 503,
    "shutting_down": 503,
    "interrupted": 503,
    "unavailable": 503,
}

_BY_CODE: dict[str, type[APIError]] = {
    "session_busy": SessionBusy,
    "session_ended": SessionEnded,
    "volume_busy": VolumeBusy,
    "volume_in_use": VolumeInUse,
    "volume_full": VolumeFull,
    "quota_exceeded": QuotaExceeded,
    "volumes_unavailable": VolumesUnavailable,
    "snapshot_failed": SnapshotFailed,
    "snapshot_invalid": SnapshotInvalid,
}


def retry_after(headers: Mapping[str, str]) -> float | None:
    """`Retry-After` in seconds when it is a plain number of them (airlock sends only that);
    None otherwise."""
    value = headers.get("retry-after", "").strip()
    if not re.fullmatch(r"[0-9]{1,9}", value):
        return None
    return float(min(int(value), 86_400))


def error_for(status: int, headers: Mapping[str, str], body: bytes) -> APIError:
    """The exception for an error answer. airlock's `{"error": {"code", "message", "field"}}`
    gives the code; anything else (a proxy's HTML page) keeps the status with code `unknown`
    and the start of the body as message."""
    code, message, field = "unknown", _quote(body), None
    if headers.get("content-type", "").split(";")[0].strip() == "application/json":
        try:
            error = json.loads(body)["error"]
            if isinstance(error, dict) and isinstance(error.get("code"), str):
                code = _printable(error["code"], 64)
                message = _printable(str(error.get("message", "")), 2000)
                field = _printable(error["field"], 200) if isinstance(error.get("field"), str) else None
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


def _printable(text: str, most: int) -> str:
    """A server's text as a message may show it: control characters (a terminal's commands)
    as spaces, and bounded."""
    text = "".join(c if c.isprintable() else " " for c in text[: most + 1])
    return text[:most] + ("…" if len(text) > most else "")


def _quote(body: bytes) -> str:
    text = body[: _QUOTE * 4].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else " " for c in text)
    return text[:_QUOTE] + ("…" if len(text) > _QUOTE or len(body) > _QUOTE * 4 else "")
