"""What the synchronous and the asynchronous clients share: how requests are written, how
answers are read and bounded, the server-sent events parser, and the retry rule. No I/O here."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Generic, Mapping, Sequence, TypeVar

import httpx

from airlock_client.errors import (
    STATUS_OF_CODE,
    AirlockError,
    APIError,
    BackgroundNotFinished,
    NotFound,
    ProtocolError,
    TransportError,
    error_for,
)
from airlock_client.models import (
    Approval,
    ApprovalDetail,
    BackgroundError,
    BackgroundEvent,
    BackgroundInfo,
    BackgroundState,
    Decided,
    Environment,
    Evaluation,
    Execution,
    ExecutionRecord,
    FileEntry,
    OutputEvent,
    SessionInfo,
    StreamEvent,
    ToolList,
    TruncatedEvent,
    VolumeFiles,
    VolumeInfo,
    _Reader,
    read_approvals,
    read_environments,
    read_files,
    read_sessions,
    read_volume_files,
    read_volumes,
)

_T = TypeVar("_T", covariant=True)
_E = TypeVar("_E")

DEFAULT_URL = "http://127.0.0.1:8080"
# An answer's bytes the client takes at most (the JSON of a result, a file, a whole stream).
# airlock's defaults give answers of a few MiB; its ceilings up to 768 MiB (docs/http-api.md:
# "Answers and memory"): raise it for those. Parsed, JSON can take up to ~25 times its size in memory.
DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
# Executions may run for minutes, and a stream is silent while its program is: reads wait
# this long; connecting does not.
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
# The most one call may take, from sending it to the last byte of its answer: a server that
# trickles an answer a byte at a time cannot hold the caller longer (checked between reads).
DEFAULT_DEADLINE = 3600.0
USER_AGENT = "airlock-client/0.1.0"

Files = Mapping[str, "bytes | str"]
Limits = Mapping[str, int]
# The volumes an execution or a session mounts: `{"name", "path", "read_only"}` each, as
# `Volume.mount` makes them.
Mounts = Sequence[Mapping[str, object]]


_KEY = re.compile(r"[\x21-\x7e]{1,4096}")


@dataclass(frozen=True)
class Settings:
    url: str
    retries: int
    max_retry_wait: float
    max_response_bytes: int
    deadline: float
    api_key: str = field(repr=False, default="")

    @classmethod
    def make(
        cls,
        url: str | None,
        api_key: str | None,
        retries: int,
        max_retry_wait: float,
        max_response_bytes: int,
        deadline: float,
    ) -> Settings:
        url = url or os.environ.get("AIRLOCK_URL") or DEFAULT_URL
        key = api_key if api_key is not None else os.environ.get("AIRLOCK_API_KEY")
        if not key:
            raise ValueError("no API key: pass api_key= or set AIRLOCK_API_KEY")
        # Checked here, and never quoted: an HTTP library's error about a bad header would
        # quote the key, and such messages reach logs and models.
        if not _KEY.fullmatch(key):
            raise ValueError("the API key must be printable ASCII without spaces (check for a trailing newline)")
        if retries < 0 or max_retry_wait < 0 or max_response_bytes <= 0 or deadline <= 0:
            raise ValueError("retries and max_retry_wait must be >= 0, max_response_bytes and deadline > 0")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"the server's URL must be http:// or https://, not {url!r}")
        return cls(url.rstrip("/"), retries, max_retry_wait, max_response_bytes, deadline, key)

    def headers(self) -> dict[str, str]:
        # identity: airlock sends answers uncompressed, and a compressed one could inflate to
        # any size in one read before its bytes are counted.
        return {"Authorization": f"Bearer {self.api_key}", "User-Agent": USER_AGENT, "Accept-Encoding": "identity"}

    def redact(self, text: str) -> str:
        """`text` without the key, for messages about a failed request."""
        return text.replace(self.api_key, "<api key>")

    def wait_before_retry(self, error: APIError, attempt: int) -> float | None:
        """Seconds to wait before trying again, or None to raise. Only 429 and 503 with a
        `Retry-After` are retried: airlock sends them when it refused the request before
        running anything, so running it again cannot run it twice."""
        if attempt >= self.retries or error.status not in (429, 503) or error.retry_after is None:
            return None
        if error.retry_after > self.max_retry_wait:
            return None
        return error.retry_after


@dataclass(frozen=True)
class Request(Generic[_T]):
    """One call of the API: where, what, and how its answer becomes a value."""

    method: str
    path: str
    parse: Callable[[Answer], _T]
    json: object = None
    content: bytes | None = None
    stream: bool = False
    # The statuses that answer this call (`/readyz` says why it is not ready in its 503);
    # any other below 400 (a redirect, a proxy's 200 for a 201) is a ProtocolError.
    ok: tuple[int, ...] = (200,)
    # A background execution's events are resumed after this one's.
    last_event_id: int | None = None

    def headers(self) -> dict[str, str]:
        h = {"Accept": "text/event-stream" if self.stream else "application/json"}
        if self.last_event_id is not None:
            h["Last-Event-ID"] = str(self.last_event_id)
        if self.json is not None:
            h["Content-Type"] = "application/json"
        elif self.content is not None:
            h["Content-Type"] = "application/octet-stream"
        return h

    def body(self) -> bytes | None:
        if self.json is not None:
            return json.dumps(self.json, ensure_ascii=False, allow_nan=False).encode()
        return self.content


@dataclass(frozen=True)
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes


def segment(value: str, what: str) -> str:
    """One path segment, quoted (a hostile server's session id cannot reach another route:
    `.` and `..`, which URL normalisation would remove, are refused)."""
    if not isinstance(value, str) or value in ("", ".", ".."):
        raise ValueError(f"{what} must be a non-empty string other than '.' and '..'")
    return urllib.parse.quote(value, safe="")


def file_path(path: str, what: str = "a session file path") -> str:
    """A path below a session's working directory or a volume's root as the server takes it:
    relative, no `..`, `.` or empty parts (refused here too, so that no URL normalisation can
    change it)."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{what} is relative, without '..', '.' or empty parts: {path!r}")
    return "/".join(urllib.parse.quote(p, safe="") for p in parts)


def check_head(headers: httpx.Headers, limit: int) -> None:
    """Refuses, before reading it, an answer that is compressed (asked for none) or says it is
    longer than `limit`."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise ProtocolError(f"a compressed answer ({encoding[:40]!r}), though none was asked for")
    length = headers.get("content-length", "").strip()
    if re.fullmatch(r"[0-9]{1,20}", length) and int(length) > limit:
        raise ProtocolError(f"the answer is {int(length)} bytes, over the client's limit of {limit}")


class Budget:
    """What one answer may still take: bytes and, since the request was sent, time."""

    def __init__(self, settings: Settings) -> None:
        self.limit = settings.max_response_bytes
        self.ends = time.monotonic() + settings.deadline
        self.deadline = settings.deadline

    def add(self, buf: bytearray, chunk: bytes) -> None:
        buf += chunk
        if len(buf) > self.limit:
            raise ProtocolError(f"the answer is over the client's limit of {self.limit} bytes")
        self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.ends:
            raise TransportError(f"no whole answer within the client's deadline of {self.deadline:g} s")


def read_json(answer: Answer) -> object:
    """The answer's JSON value: `application/json` only, and parsed as data, never as code.
    Deep nesting and huge numbers end as a ProtocolError, not a crash."""
    media = answer.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ProtocolError(f"expected application/json, got {media or 'no content type'!r}")
    try:
        return json.loads(answer.body, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ProtocolError("the answer's JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"the answer is not valid JSON: {str(e)[:200]}") from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is too large for a float")
    return value


def execute_body(
    code: str,
    *,
    limits: Limits | None,
    files: Files | None,
    env: Mapping[str, str] | None,
    stdin: str | None,
    environment: str | None,
    egress: Mapping[str, object] | None,
    credentials: Sequence[str] | None,
    entrypoint: str | None,
    inputs: Mapping[str, object] | None,
    volumes: Mounts | None,
) -> dict[str, object]:
    body: dict[str, object] = {"code": code}
    if limits:
        body["limits"] = dict(limits)
    if files:
        body["files"] = [input_file(path, content) for path, content in files.items()]
    if env:
        body["env"] = dict(env)
    if stdin:
        body["stdin"] = stdin
    if environment is not None:
        body["environment"] = environment
    if egress is not None:
        body["egress"] = dict(egress)
    if credentials is not None:
        if isinstance(credentials, (str, bytes)):
            raise TypeError("credentials is a list of names: ['github']")
        body["credentials"] = list(credentials)
    if volumes:
        body["volumes"] = mounts(volumes)
    return function(body, entrypoint, inputs)


def mounts(volumes: Mounts) -> list[dict[str, object]]:
    """The `volumes` of a request: a mapping each (`Volume.mount` makes them)."""
    if isinstance(volumes, (str, bytes, Mapping)):
        raise TypeError("volumes is a list of mounts: [volume.mount('/work/data'), ...]")
    out: list[dict[str, object]] = []
    for v in volumes:
        if not isinstance(v, Mapping):
            raise TypeError(f"a volume mount is a mapping (volume.mount('/work/data')), not {type(v).__name__}")
        out.append(dict(v))
    return out


def mount(name: str, path: str, read_only: bool) -> dict[str, object]:
    """A volume mount for `volumes=`: `path` is absolute, below `/work` or `/tmp`."""
    return {"name": name, "path": path, "read_only": read_only}


def function(
    body: dict[str, object], entrypoint: str | None, inputs: Mapping[str, object] | None
) -> dict[str, object]:
    """Function mode's two fields, which go together."""
    if entrypoint is not None:
        body["entrypoint"] = entrypoint
        body["inputs"] = dict(inputs or {})
    elif inputs is not None:
        raise ValueError("inputs are the keyword arguments of an entrypoint: name one")
    return body


def session_body(
    *,
    limits: Limits | None,
    files: Files | None,
    env: Mapping[str, str] | None,
    environment: str | None,
    egress: Mapping[str, object] | None,
    credentials: Sequence[str] | None,
    idle_timeout_ms: int | None,
    max_lifetime_ms: int | None,
    volumes: Mounts | None,
) -> dict[str, object]:
    body = execute_body(
        "", limits=limits, files=files, env=env, stdin=None, environment=environment,
        egress=egress, credentials=credentials, entrypoint=None, inputs=None, volumes=volumes,
    )
    del body["code"]
    if idle_timeout_ms is not None:
        body["idle_timeout_ms"] = idle_timeout_ms
    if max_lifetime_ms is not None:
        body["max_lifetime_ms"] = max_lifetime_ms
    return body


def cell_body(
    code: str, *, timeout_ms: int | None, entrypoint: str | None, inputs: Mapping[str, object] | None
) -> dict[str, object]:
    body: dict[str, object] = {"code": code}
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    return function(body, entrypoint, inputs)


def input_file(path: str, content: bytes | str) -> dict[str, str]:
    if isinstance(content, str):
        return {"path": path, "content": content, "encoding": "utf8"}
    return {"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"}


def execution(answer: Answer) -> Execution:
    return Execution._read(read_json(answer))


def json_object(answer: Answer) -> dict[str, object]:
    value = read_json(answer)
    if not isinstance(value, dict):
        raise ProtocolError(f"$: expected an object, got {type(value).__name__}")
    return value


def raw(answer: Answer) -> bytes:
    return answer.body


def nothing(answer: Answer) -> None:
    return None


class _Fields(Generic[_E]):
    """Server-sent events' lines in, each event read by `take` as its blank line comes (so
    nothing may follow the last), bounded: `limit` bytes for the whole stream, or with
    `per_event` for each event (a stream followed for hours)."""

    def __init__(self, limit: int, per_event: bool = False) -> None:
        self.limit = limit
        self.per_event = per_event
        self.seen = 0
        self.buf = bytearray()
        self.event = ""
        self.data: list[str] = []
        self.id: str | None = None
        self.done = False

    def feed(self, chunk: bytes) -> list[_E]:
        if not self.per_event:
            self.seen += len(chunk)
            self.check(self.seen, "the stream")
        searched = len(self.buf)  # no newline before this: not searched again
        self.buf += chunk
        out: list[_E] = []
        while True:
            end = self.buf.find(b"\n", searched)
            if end < 0:
                break
            searched = 0
            line = bytes(self.buf[:end]).rstrip(b"\r")
            del self.buf[: end + 1]
            if self.per_event:
                self.seen += end + 1
                self.check(self.seen, "an event")
            dispatched = self.line(line)
            if dispatched is not None:
                out.append(dispatched)
            if self.per_event and (dispatched is not None or not line):
                self.seen = 0
        if self.per_event:
            self.check(self.seen + len(self.buf), "an event")
        return out

    def check(self, size: int, what: str) -> None:
        if size > self.limit:
            raise ProtocolError(f"{what} is over the client's limit of {self.limit} bytes")

    def finish(self) -> None:
        if not self.done:
            raise ProtocolError("the stream ended before its result")

    def take(self, event: str, data: str, id: str | None) -> _E:
        raise NotImplementedError

    def line(self, line: bytes) -> _E | None:
        try:
            text = line.decode()
        except UnicodeDecodeError:
            raise ProtocolError("an event that is not UTF-8") from None
        if self.done:
            raise ProtocolError("data after the stream's result")
        if text == "":
            if not self.data and not self.event:
                return None
            event, data = self.event or "message", "\n".join(self.data)
            self.event, self.data = "", []
            return self.take(event, data, self.id)
        if text.startswith(":"):
            return None
        name, _, value = text.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        elif name == "id":
            self.id = value
        elif name != "retry":
            raise ProtocolError(f"an unknown event field {name[:40]!r}")
        return None


def _output_event(event: str, body: dict[str, object]) -> OutputEvent | TruncatedEvent | Approval | None:
    """The events of a stream before its last, read; None for any other."""
    if event in ("stdout", "stderr"):
        text = body.get("text")
        if not isinstance(text, str) or set(body) != {"text"}:
            raise ProtocolError(f"a {event} event is {{\"text\": str}}")
        return OutputEvent(event, text)  # type: ignore[arg-type]
    if event == "truncated":
        stream, limit = body.get("stream"), body.get("limit")
        if stream not in ("stdout", "stderr") or not isinstance(limit, int) or isinstance(limit, bool):
            raise ProtocolError("a truncated event is {\"stream\": \"stdout\"|\"stderr\", \"limit\": int}")
        return TruncatedEvent(stream, limit)
    if event == "approval_requested":
        return Approval._read(_Reader(body, "$(approval_requested event)"))
    return None


class Events(_Fields[StreamEvent]):
    """Server-sent events in, StreamEvents out: the output events as they come, then the
    Execution with the streamed output put back into its stdout and stderr; an Approval for
    each `approval_requested`. Bounded: one stream carries at most `limit` bytes in all;
    anything but airlock's six events, or a stream that ends without its result, is a
    ProtocolError."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.out: dict[str, list[str]] = {"stdout": [], "stderr": []}

    def take(self, event: str, data: str, id: str | None) -> StreamEvent:
        body = _event_json(data, event)
        read = _output_event(event, body)
        if isinstance(read, OutputEvent):
            self.out[read.stream].append(read.text)
        if read is not None:
            return read
        if event == "result":
            self.done = True
            result = Execution._read(body, "$(result event)")
            if result.output_streamed:
                result = dataclasses.replace(
                    result,
                    stdout="".join(self.out["stdout"]) + result.stdout,
                    stderr="".join(self.out["stderr"]) + result.stderr,
                )
            return result
        if event == "error":
            self.done = True
            headers = httpx.Headers({"content-type": "application/json"})
            error = body.get("error")
            code = error.get("code") if isinstance(error, dict) else None
            status = STATUS_OF_CODE.get(code, 500) if isinstance(code, str) else 500
            raise error_for(status, headers, data.encode())
        raise ProtocolError(f"an unknown event {event[:40]!r}")


class LogEvents(_Fields["tuple[BackgroundEvent, int]"]):
    """A background execution's events log, read from the server-sent events of one
    connection: each event with its id (the offset to resume after). Nothing is kept between
    events (the output is the caller's), and each event may take `limit` bytes; the last is
    the Execution as sent (without its output) or a BackgroundError."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit, per_event=True)

    def take(self, event: str, data: str, id: str | None) -> tuple[BackgroundEvent, int]:
        if id is None or not re.fullmatch(r"[0-9]{1,20}", id):
            raise ProtocolError(f"a {event[:40]!r} event without an id that is a number")
        return self.read(event, data), int(id)

    def read(self, event: str, data: str) -> BackgroundEvent:
        body = _event_json(data, event)
        read = _output_event(event, body)
        if read is not None:
            return read
        if event == "result":
            self.done = True
            return Execution._read(body, "$(result event)")
        if event == "error":
            self.done = True
            return BackgroundError._read(_Reader(body, "$(error event)").child("error"))
        raise ProtocolError(f"an unknown event {event[:40]!r}")


def _event_json(data: str, event: str) -> dict[str, object]:
    try:
        value = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ProtocolError(f"a {event[:40]} event's JSON is nested too deeply") from None
    except ValueError as e:
        raise ProtocolError(f"a {event[:40]!r} event is not JSON: {str(e)[:200]}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"a {event[:40]!r} event is not a JSON object")
    return value


def check_stream(headers: httpx.Headers) -> None:
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "text/event-stream":
        raise ProtocolError(f"expected text/event-stream, got {media or 'no content type'!r}")
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise ProtocolError(f"a compressed stream ({encoding[:40]!r}), though none was asked for")


# The pauses of a follower of a background execution's events before it connects: the first
# time, again at once when a connection is lost, then longer while none brings an event
# (the server restarting); past them, it raises.
RECONNECT_PAUSES = (0.0, 0.0, 0.25, 0.5, 1.0, 2.0, 4.0)

# After an execution's last event, the pauses between reads of its state until it says it
# ended (it is written just after the event).
ENDING_PAUSES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 0.0)


class Expired(Exception):
    """A follower's time (`wait(timeout=...)`) is up; never seen by the caller."""


def outcome(info: BackgroundInfo) -> Execution:
    """The Execution of a background execution that ended: its result once `finished`;
    BackgroundNotFinished for any other end."""
    if info.state == "finished":
        if info.result is None:
            raise ProtocolError("$.result: missing where the state is finished")
        # The stored result leaves out its id: the execution's.
        return info.result if info.result.id is not None else dataclasses.replace(info.result, id=info.id)
    if not info.ended:
        raise ProtocolError(f"$.state: {info.state}, where it has ended")
    raise BackgroundNotFinished(info.id, info.state, info.error, info.result)


def deleted(info: BackgroundInfo) -> AirlockError:
    """What `wait()` raises for an execution its own handle deleted (`cancel()`)."""
    if info.state == "finished":
        return NotFound(404, "not_found", f"{info.id} finished and was deleted by cancel(); its result is gone")
    state: BackgroundState = info.state if info.ended else "cancelled"
    return BackgroundNotFinished(info.id, state, info.error, info.result)


def gone(execution_id: str, ending: BackgroundEvent | None, not_found: NotFound) -> AirlockError:
    """What `wait()` raises when the execution whose events it followed to their end is no
    longer there (deleted meanwhile): the end its last event told, or the NotFound."""
    if isinstance(ending, BackgroundError):
        state: BackgroundState = {"cancelled": "cancelled", "interrupted": "interrupted"}.get(  # type: ignore[assignment]
            ending.code, "failed"
        )
        return BackgroundNotFinished(execution_id, state, ending)
    return not_found


def with_read_timeout(timeout: httpx.Timeout, read: float | None) -> httpx.Timeout:
    """`timeout` with reads waiting at most `read` seconds."""
    if read is None:
        return timeout
    most = read if timeout.read is None else min(timeout.read, read)
    return httpx.Timeout(connect=timeout.connect, read=most, write=timeout.write, pool=timeout.pool)


def refusal(answer: Answer) -> APIError:
    """The error an answer that is not the call's stands for; a status below 400 that the call
    does not expect (a redirect, a proxy's page) is no answer of airlock's."""
    if answer.status < 400:
        raise ProtocolError(f"unexpected HTTP {answer.status} (redirects are not followed)")
    return error_for(answer.status, answer.headers, answer.body)

# The API's calls, one builder each, shared by both clients.


def run(body: dict[str, object], stream: bool = False) -> Request[Execution]:
    return Request("POST", "/v1/execute", execution, json=body, stream=stream)


def cell(session_id: str, body: dict[str, object], stream: bool = False) -> Request[Execution]:
    return Request("POST", f"/v1/sessions/{segment(session_id, 'session id')}/execute", execution, json=body, stream=stream)


def evaluate(expression: str) -> Request[Evaluation]:
    return Request("POST", "/v1/eval", lambda a: Evaluation._read(read_json(a)), json={"expression": expression})


def _execution(execution_id: str) -> str:
    return f"/v1/executions/{segment(execution_id, 'execution id')}"


def _background_info(a: Answer) -> BackgroundInfo:
    return BackgroundInfo._read(read_json(a))


def record(execution_id: str) -> Request[ExecutionRecord]:
    path = _execution(execution_id)

    def read(a: Answer) -> ExecutionRecord:
        body = read_json(a)
        if isinstance(body, dict) and body.get("background") is True:
            raise ProtocolError(
                f"{execution_id} is a background execution: its state and result come from "
                "background(id).refresh()"
            )
        return ExecutionRecord._read(body)

    return Request("GET", path, read)


def submit(body: dict[str, object]) -> Request[BackgroundInfo]:
    return Request("POST", "/v1/executions", _background_info, json=body, ok=(202,))


def background(execution_id: str) -> Request[BackgroundInfo]:
    return Request("GET", _execution(execution_id), _background_info)


def background_events(execution_id: str, after: int | None) -> Request[None]:
    return Request("GET", _execution(execution_id) + "/events", nothing, stream=True, last_event_id=after)


def cancel(execution_id: str) -> Request[BackgroundInfo]:
    return Request("DELETE", _execution(execution_id), _background_info, ok=(200, 202))


def open_session(body: dict[str, object]) -> Request[SessionInfo]:
    return Request("POST", "/v1/sessions", lambda a: SessionInfo._read(read_json(a)), json=body, ok=(201,))


def session_info(session_id: str) -> Request[SessionInfo]:
    return Request("GET", f"/v1/sessions/{segment(session_id, 'session id')}", lambda a: SessionInfo._read(read_json(a)))


def sessions() -> Request[list[SessionInfo]]:
    return Request("GET", "/v1/sessions", lambda a: read_sessions(read_json(a)))


def pause(session_id: str) -> Request[SessionInfo]:
    path = f"/v1/sessions/{segment(session_id, 'session id')}/pause"
    return Request("POST", path, lambda a: SessionInfo._read(read_json(a)))


def resume(session_id: str) -> Request[SessionInfo]:
    path = f"/v1/sessions/{segment(session_id, 'session id')}/resume"
    return Request("POST", path, lambda a: SessionInfo._read(read_json(a)))


def fork(session_id: str) -> Request[SessionInfo]:
    path = f"/v1/sessions/{segment(session_id, 'session id')}/fork"
    return Request("POST", path, lambda a: SessionInfo._read(read_json(a)), ok=(201,))


def close_session(session_id: str) -> Request[None]:
    return Request("DELETE", f"/v1/sessions/{segment(session_id, 'session id')}", nothing, ok=(204,))


def list_files(session_id: str) -> Request[list[FileEntry]]:
    return Request("GET", f"/v1/sessions/{segment(session_id, 'session id')}/files", lambda a: read_files(read_json(a)))


def download(session_id: str, path: str) -> Request[bytes]:
    return Request("GET", f"/v1/sessions/{segment(session_id, 'session id')}/files/{file_path(path)}", raw)


def upload(session_id: str, path: str, data: bytes | str) -> Request[None]:
    content = data.encode() if isinstance(data, str) else bytes(data)
    return Request(
        "PUT", f"/v1/sessions/{segment(session_id, 'session id')}/files/{file_path(path)}", nothing,
        content=content, ok=(204,),
    )


def tools() -> Request[ToolList]:
    return Request("GET", "/v1/tools", lambda a: ToolList._read(read_json(a)))


def approvals() -> Request[list[Approval]]:
    return Request("GET", "/v1/approvals", lambda a: read_approvals(read_json(a)))


def _approval(approval_id: str) -> str:
    return f"/v1/approvals/{segment(approval_id, 'approval id')}"


def approval(approval_id: str) -> Request[ApprovalDetail]:
    return Request("GET", _approval(approval_id), lambda a: ApprovalDetail._read(read_json(a)))


def decide(approval_id: str, decision: str, reason: str | None) -> Request[Decided]:
    body: dict[str, object] = {"decision": decision}
    if reason is not None:
        body["reason"] = reason
    return Request("POST", _approval(approval_id), lambda a: Decided._read(read_json(a)), json=body)


def environments() -> Request[list[Environment]]:
    return Request("GET", "/v1/environments", lambda a: read_environments(read_json(a)))


def environment(name: str) -> Request[Environment]:
    path = f"/v1/environments/{segment(name, 'environment name')}"
    return Request("GET", path, lambda a: Environment._read(read_json(a)))


def create_environment(name: str, requirements: list[str]) -> Request[Environment]:
    body = {"name": name, "requirements": list(requirements)}
    return Request("POST", "/v1/environments", lambda a: Environment._read(read_json(a)), json=body, ok=(201,))


def delete_environment(name: str) -> Request[None]:
    return Request("DELETE", f"/v1/environments/{segment(name, 'environment name')}", nothing, ok=(204,))


def create_volume(name: str, size_bytes: int, max_entries: int | None) -> Request[VolumeInfo]:
    body: dict[str, object] = {"name": name, "size_bytes": size_bytes}
    if max_entries is not None:
        body["max_entries"] = max_entries
    return Request("POST", "/v1/volumes", lambda a: VolumeInfo._read(read_json(a)), json=body, ok=(201,))


def volumes() -> Request[list[VolumeInfo]]:
    return Request("GET", "/v1/volumes", lambda a: read_volumes(read_json(a)))


def volume_info(name: str) -> Request[VolumeInfo]:
    return Request("GET", f"/v1/volumes/{segment(name, 'volume name')}", lambda a: VolumeInfo._read(read_json(a)))


def delete_volume(name: str) -> Request[None]:
    return Request("DELETE", f"/v1/volumes/{segment(name, 'volume name')}", nothing, ok=(204,))


def volume_files(name: str) -> Request[VolumeFiles]:
    path = f"/v1/volumes/{segment(name, 'volume name')}/files"
    return Request("GET", path, lambda a: read_volume_files(read_json(a)))


def _volume_file(name: str, path: str) -> str:
    return f"/v1/volumes/{segment(name, 'volume name')}/files/{file_path(path, 'a volume file path')}"


def volume_download(name: str, path: str) -> Request[bytes]:
    return Request("GET", _volume_file(name, path), raw)


def volume_upload(name: str, path: str, data: bytes | str) -> Request[None]:
    content = data.encode() if isinstance(data, str) else bytes(data)
    return Request("PUT", _volume_file(name, path), nothing, content=content, ok=(204,))


def volume_remove(name: str, path: str) -> Request[None]:
    return Request("DELETE", _volume_file(name, path), nothing, ok=(204,))


def scan_pickle(data: bytes) -> Request[dict[str, object]]:
    return Request("POST", "/v1/pickle/scan", json_object, content=bytes(data))


def ready() -> Request[dict[str, object]]:
    return Request("GET", "/readyz", json_object, ok=(200, 503))
