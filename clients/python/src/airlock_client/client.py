"""`Airlock`: the synchronous client of airlock's HTTP API."""

from __future__ import annotations

import collections
import time
from types import TracebackType
from typing import Callable, Iterator, Mapping, Sequence, TypeVar

import httpx

from airlock_client import _wire
from airlock_client._wire import Answer, Budget, Events, Files, Limits, LogEvents, Mounts, Request, Settings
from airlock_client.errors import (
    NotFound,
    ProtocolError,
    ServiceUnavailable,
    SessionLost,
    TransportError,
    WaitTimeout,
)
from airlock_client.models import (
    Approval,
    ApprovalDetail,
    BackgroundEvent,
    BackgroundInfo,
    Decided,
    Environment,
    Evaluation,
    Execution,
    ExecutionRecord,
    FileEntry,
    SessionInfo,
    StreamEvent,
    ToolList,
    VolumeFiles,
    VolumeInfo,
)

__all__ = ["Airlock", "BackgroundEvents", "BackgroundExecution", "Session", "Stream", "Volume"]

_T = TypeVar("_T")


class Airlock:
    """A client of one airlock server.

    `url` defaults to `$AIRLOCK_URL`, then `http://127.0.0.1:8080`; `api_key` to
    `$AIRLOCK_API_KEY`. With `retries` > 0, a request refused with 429 or 503 and a
    `Retry-After` of at most `max_retry_wait` seconds is sent again after that wait, up to
    `retries` times (airlock refuses those before running anything). An answer larger than
    `max_response_bytes` is refused, and one call may take `deadline` seconds in all (each
    read `timeout`). Proxies from the environment are not used (pass `http_client` for one).
    Use it as a context manager, or `close()` it.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = _wire.DEFAULT_TIMEOUT,
        retries: int = 0,
        max_retry_wait: float = 30.0,
        max_response_bytes: int = _wire.DEFAULT_MAX_RESPONSE_BYTES,
        deadline: float = _wire.DEFAULT_DEADLINE,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._settings = Settings.make(url, api_key, retries, max_retry_wait, max_response_bytes, deadline)
        # No proxy from the environment unless the caller's own client has one: the key goes
        # only where the URL says.
        self._http = http_client or httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False)

    @property
    def url(self) -> str:
        return self._settings.url

    def run(
        self,
        code: str,
        *,
        limits: Limits | None = None,
        files: Files | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        environment: str | None = None,
        egress: Mapping[str, object] | None = None,
        credentials: Sequence[str] | None = None,
        entrypoint: str | None = None,
        inputs: Mapping[str, object] | None = None,
        volumes: Mounts | None = None,
    ) -> Execution:
        """Runs `code` in a fresh sandbox. Every ending is an Execution (see its `status`);
        only refusals raise. `files` maps paths below the working directory to contents;
        `volumes` lists the volumes to mount (`[volume.mount("/work/data")]`). With an
        `entrypoint`, function mode: `call` with these options."""
        body = _wire.execute_body(
            code, limits=limits, files=files, env=env, stdin=stdin, environment=environment,
            egress=egress, credentials=credentials, entrypoint=entrypoint, inputs=inputs,
            volumes=volumes,
        )
        return self._do(_wire.run(body))

    def call(self, code: str, entrypoint: str, /, **inputs: object) -> object:
        """Function mode: runs `code` as a module, calls `entrypoint(**inputs)` and returns
        its value, decoded; raises ExecutionFailed (with the Execution) unless it ended ok."""
        return self.run(code, entrypoint=entrypoint, inputs=inputs).raise_for_status().result

    def stream(
        self,
        code: str,
        *,
        limits: Limits | None = None,
        files: Files | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        environment: str | None = None,
        egress: Mapping[str, object] | None = None,
        credentials: Sequence[str] | None = None,
        entrypoint: str | None = None,
        inputs: Mapping[str, object] | None = None,
        volumes: Mounts | None = None,
        on_approval: Callable[[Approval], object] | None = None,
    ) -> Stream:
        """As `run`, with the output as it is written: iterate the Stream for OutputEvents
        (and a TruncatedEvent when a stream reaches its limit), the Execution last. Refusals
        raise here, before any event."""
        body = _wire.execute_body(
            code, limits=limits, files=files, env=env, stdin=stdin, environment=environment,
            egress=egress, credentials=credentials, entrypoint=entrypoint, inputs=inputs,
            volumes=volumes,
        )
        return self._stream(_wire.run(body, stream=True), on_approval)

    def submit(
        self,
        code: str,
        *,
        limits: Limits | None = None,
        files: Files | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        environment: str | None = None,
        egress: Mapping[str, object] | None = None,
        credentials: Sequence[str] | None = None,
        entrypoint: str | None = None,
        inputs: Mapping[str, object] | None = None,
        volumes: Mounts | None = None,
    ) -> BackgroundExecution:
        """As `run`, in the background: answered at once, and it runs on the server whether
        or not anyone follows it (`limits.timeout_ms` up to the server's background ceiling,
        4 hours by default). Refusals raise here, as `run`'s do."""
        body = _wire.execute_body(
            code, limits=limits, files=files, env=env, stdin=stdin, environment=environment,
            egress=egress, credentials=credentials, entrypoint=entrypoint, inputs=inputs,
            volumes=volumes,
        )
        info = self._do(_wire.submit(body))
        return BackgroundExecution(self, info.id, info)

    def background(self, execution_id: str) -> BackgroundExecution:
        """A handle on this key's background execution `execution_id` (submitted here or
        elsewhere); nothing is asked of the server until it is used."""
        return BackgroundExecution(self, execution_id)

    def eval(self, expression: str) -> Evaluation:
        """Evaluates a Python literal expression natively on the server (no sandbox)."""
        return self._do(_wire.evaluate(expression))

    def execution(self, execution_id: str) -> ExecutionRecord:
        """The audit record of one of this key's executions."""
        return self._do(_wire.record(execution_id))

    def session(
        self,
        *,
        limits: Limits | None = None,
        files: Files | None = None,
        env: Mapping[str, str] | None = None,
        environment: str | None = None,
        egress: Mapping[str, object] | None = None,
        credentials: Sequence[str] | None = None,
        idle_timeout_ms: int | None = None,
        max_lifetime_ms: int | None = None,
        volumes: Mounts | None = None,
    ) -> Session:
        """Starts a session (one sandbox and interpreter for many cells); close it, or use it
        as a context manager. Its `volumes` stay mounted (a writable one held) until it ends."""
        body = _wire.session_body(
            limits=limits, files=files, env=env, environment=environment, egress=egress,
            credentials=credentials,
            idle_timeout_ms=idle_timeout_ms, max_lifetime_ms=max_lifetime_ms, volumes=volumes,
        )
        return Session(self, self._do(_wire.open_session(body)))

    def session_by_id(self, session_id: str) -> Session:
        """A handle on this key's session `session_id`, open or paused (a paused one is kept
        across server restarts): its `info` as the server holds it now. Raises NotFound when
        there is none. Its first cell, file request or `resume` brings a paused one back."""
        return Session(self, self._do(_wire.session_info(session_id)))

    def sessions(self) -> list[SessionInfo]:
        """This key's sessions, open and paused (a paused one's `paused.variables` and
        `paused.not_kept` are empty here: `Session.refresh` has them)."""
        return self._do(_wire.sessions())

    def tools(self) -> ToolList:
        """The operator's tools this key's code may call, with their Python signatures."""
        return self._do(_wire.tools())

    def approvals(self) -> list[Approval]:
        """Tool calls waiting for an approval that this key (scope `approve`) may decide:
        those of the keys its `approves` names, never its own; oldest first."""
        return self._do(_wire.approvals())

    def approval(self, approval_id: str) -> ApprovalDetail:
        """One waiting call that this key may decide, as listed, with its arguments whole:
        what the tool will get, however long, and whatever characters it holds (show a person
        `approval.arguments_preview`). Raises NotFound as `approve` does."""
        return self._do(_wire.approval(approval_id))

    def approve(self, approval_id: str, reason: str | None = None) -> Decided:
        """Lets the one waiting call `approval_id` run. Raises NotFound when it waits no more
        (decided, timed out, withdrawn) or is not this key's to decide."""
        return self._do(_wire.decide(approval_id, "approve", reason))

    def deny(self, approval_id: str, reason: str | None = None) -> Decided:
        """Fails the one waiting call `approval_id`: the code gets ToolError(kind="denied")
        with `reason`. Raises NotFound as `approve` does."""
        return self._do(_wire.decide(approval_id, "deny", reason))

    def environments(self) -> list[Environment]:
        """The named environments."""
        return self._do(_wire.environments())

    def environment(self, name: str) -> Environment:
        return self._do(_wire.environment(name))

    def create_environment(self, name: str, requirements: list[str]) -> Environment:
        """Builds an environment (scope `admin`); answers when the build is done."""
        return self._do(_wire.create_environment(name, requirements))

    def delete_environment(self, name: str) -> None:
        self._do(_wire.delete_environment(name))

    def create_volume(self, name: str, size_bytes: int, *, max_entries: int | None = None) -> Volume:
        """Makes a volume: a directory of this key's that executions and sessions mount, kept
        across restarts, of at most `size_bytes` (8 MiB or more) and `max_entries` files,
        directories and links (the server's default: one per 16 KiB). Raises Conflict when
        it exists, QuotaExceeded past the key's quota."""
        self._do(_wire.create_volume(name, size_bytes, max_entries))
        return Volume(self, name)

    def volumes(self) -> list[VolumeInfo]:
        """This key's volumes (without their usage: see `Volume.info`)."""
        return self._do(_wire.volumes())

    def volume(self, name: str) -> Volume:
        """A handle on the volume `name`; nothing is asked of the server until it is used."""
        return Volume(self, name)

    def scan_pickle(self, data: bytes) -> dict[str, object]:
        """The server's scan report of a pickle (or a ZIP of pickles); never loads it."""
        return self._do(_wire.scan_pickle(data))

    def ready(self) -> dict[str, object]:
        """`/readyz`: `ready`, and `reasons` when it is not."""
        return self._do(_wire.ready())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Airlock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _do(self, request: Request[_T]) -> _T:
        answer = self._exchange(request, Budget(self._settings))
        assert isinstance(answer, Answer)
        return request.parse(answer)

    def _stream(
        self, request: Request[object], on_approval: Callable[[Approval], object] | None = None
    ) -> Stream:
        budget = Budget(self._settings)
        response = self._exchange(request, budget)
        assert isinstance(response, httpx.Response)
        return Stream(response, budget, self._settings, on_approval)

    def _exchange(
        self, request: Request[object], budget: Budget, read_timeout: float | None = None
    ) -> Answer | httpx.Response:
        """The answer, read whole, or for a stream the open response; refusals raise, or are
        sent again when the settings say so."""
        attempt = 0
        while True:
            response = self._open(request, read_timeout)
            if request.stream and response.status_code == 200:
                try:
                    _wire.check_stream(response.headers)
                except ProtocolError:
                    response.close()
                    raise
                return response
            try:
                answer = self._read(response, budget)
            finally:
                response.close()
            if answer.status in request.ok and not request.stream:
                return answer
            error = _wire.refusal(answer)
            wait = self._settings.wait_before_retry(error, attempt)
            if wait is None:
                raise error
            time.sleep(wait)
            attempt += 1

    def _open(self, request: Request[object], read_timeout: float | None = None) -> httpx.Response:
        built = self._http.build_request(
            request.method,
            self._settings.url + request.path,
            headers={**self._settings.headers(), **request.headers()},
            content=request.body(),
            timeout=_wire.with_read_timeout(self._http.timeout, read_timeout),
        )
        try:
            return self._http.send(built, stream=True)
        except httpx.HTTPError as e:
            raise TransportError(self._settings.redact(f"{request.method} {request.path}: {e}")) from None

    def _read(self, response: httpx.Response, budget: Budget) -> Answer:
        _wire.check_head(response.headers, budget.limit)
        body = bytearray()
        try:
            for chunk in response.iter_raw():
                budget.add(body, chunk)
        except httpx.HTTPError as e:
            raise TransportError(self._settings.redact(f"reading the answer: {e}")) from None
        return Answer(response.status_code, response.headers, bytes(body))


class Stream:
    """The events of one streamed execution: OutputEvents as the program writes, a
    TruncatedEvent when a stream reaches its limit, an Approval when one of its tool calls
    waits for one (`on_approval` is called with it as it is read), and the Execution last
    (its stdout and stderr put back together from the events). Closing it early (leaving a `with` block,
    `close()`) disconnects, which kills the sandbox."""

    def __init__(
        self,
        response: httpx.Response,
        budget: Budget,
        settings: Settings,
        on_approval: Callable[[Approval], object] | None = None,
    ) -> None:
        self._response = response
        self._on_approval = on_approval
        self._chunks = response.iter_raw()
        self._budget = budget
        self._settings = settings
        self._events = Events(budget.limit)
        self._pending: collections.deque[StreamEvent] = collections.deque()
        self._closed = False
        self.execution: Execution | None = None

    def __iter__(self) -> Iterator[StreamEvent]:
        return self

    def __next__(self) -> StreamEvent:
        while not self._pending:
            if self._events.done:
                self.close()
                raise StopIteration
            if self._closed:
                raise TransportError("the stream was closed before its result")
            try:
                chunk = next(self._chunks)
                self._pending.extend(self._events.feed(chunk))
                self._budget.check_time()
            except StopIteration:
                self.close()
                self._events.finish()
                raise
            except (httpx.HTTPError, httpx.StreamError) as e:
                self.close()
                raise TransportError(self._settings.redact(f"reading the stream: {e}")) from None
            except BaseException:
                self.close()
                raise
        event = self._pending.popleft()
        if isinstance(event, Execution):
            self.execution = event
        elif isinstance(event, Approval) and self._on_approval is not None:
            # Called as the event is read: a call waits, and another key may decide it now.
            self._on_approval(event)
        return event

    def finish(self) -> Execution:
        """Reads the rest of the stream and returns the Execution."""
        for _ in self:
            pass
        if self.execution is None:
            raise ProtocolError("the stream ended without its result")
        return self.execution

    def close(self) -> None:
        self._closed = True
        self._response.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class BackgroundExecution:
    """A background execution of this key's, by `id` (`Airlock.submit`, `Airlock.background`):
    it runs on the server whether or not anyone follows it. `info` is its state as last read
    (None until then, for a handle made by id)."""

    def __init__(self, client: Airlock, execution_id: str, info: BackgroundInfo | None = None) -> None:
        _wire.segment(execution_id, "execution id")
        self._client = client
        self.id = execution_id
        self.info = info
        self._deleted: BackgroundInfo | None = None

    def refresh(self) -> BackgroundInfo:
        """Its state now (`GET /v1/executions/{id}`), with the whole result once it has one.
        Raises NotFound when there is none of this key's (or it was deleted)."""
        self.info = self._client._do(_wire.background(self.id))
        return self.info

    def events(self, after: int | None = None) -> BackgroundEvents:
        """Its events, from the first or after the one whose id is `after` (a `last_event_id`
        kept from an earlier follower, in any process), followed to its end: see
        BackgroundEvents."""
        return BackgroundEvents(self._client, self.id, after)

    def wait(self, timeout: float | None = None) -> Execution:
        """Follows it to its end and returns its Execution, as `run` would have (the whole
        output, read once more at the end). Raises BackgroundNotFinished when it ended
        `failed`, `cancelled` or `interrupted`, NotFound when it was deleted meanwhile, and
        WaitTimeout after `timeout` seconds (the execution goes on)."""
        if self._deleted is not None:
            raise _wire.deleted(self._deleted)
        until = None if timeout is None else time.monotonic() + timeout
        info = self.refresh()
        if info.ended:
            return _wire.outcome(info)
        ending: BackgroundEvent | None = None
        try:
            with BackgroundEvents(self._client, self.id, None, until) as events:
                for ending in events:
                    pass
        except _wire.Expired:
            raise WaitTimeout(self.id, info.state, timeout or 0.0) from None
        try:
            # Its last event is written just before its state: read again until it ended.
            for pause in _wire.ENDING_PAUSES:
                info = self.refresh()
                if info.ended:
                    break
                time.sleep(pause)
            return _wire.outcome(info)
        except NotFound as e:
            raise _wire.gone(self.id, ending, e) from None

    def cancel(self) -> BackgroundInfo:
        """Cancels it if it is queued or running (its sandbox is killed) and deletes it, its
        result and events with it: read what you need first. Its last state: `cancelled`, or
        how it had ended (`running` when it was still ending after 10 s; it is deleted once
        it ends). Raises NotFound when there is none of this key's."""
        if self._deleted is None:
            self._deleted = self._client._do(_wire.cancel(self.id))
            self.info = self._deleted
        return self._deleted

    def __repr__(self) -> str:
        return f"BackgroundExecution({self.id!r})"


class BackgroundEvents:
    """The events of a background execution, from its log on the server: OutputEvents and
    TruncatedEvents as its program wrote, an Approval when one of its tool calls waits for
    one, and last the Execution (without its output, which came as events: `wait()` has it
    whole) or, when it ended without a result, a BackgroundError. It follows the execution
    while it runs, and after a dropped connection reconnects by itself with `Last-Event-ID`
    (at once, then for a few seconds while nothing comes), so that each event comes exactly
    once. `last_event_id` is the id of the last event given: `events(after=...)` resumes
    there, from any process. Closing it only stops following."""

    def __init__(self, client: Airlock, execution_id: str, after: int | None, until: float | None = None) -> None:
        self._client = client
        self.id = execution_id
        self.last_event_id = after
        self._read_id = after
        self._until = until
        self._response: httpx.Response | None = None
        self._chunks: Iterator[bytes] = iter(())
        self._budget = Budget(client._settings)
        self._log = LogEvents(client._settings.max_response_bytes)
        self._pending: collections.deque[tuple[BackgroundEvent, int]] = collections.deque()
        self._quiet = 0
        self._got = False  # whether this connection brought any event
        self._closed = False
        # Connections opened again after one was lost.
        self.reconnections = 0

    def __iter__(self) -> Iterator[BackgroundEvent]:
        return self

    def __next__(self) -> BackgroundEvent:
        while not self._pending:
            if self._log.done:
                self.close()
                raise StopIteration
            if self._closed:
                raise TransportError("the events were closed before the last")
            if self._response is None:
                self._connect()
                continue
            try:
                chunk = next(self._chunks)
            except StopIteration:
                if not self._got:
                    # Ended whole with nothing after the event it resumed after: there is
                    # nothing more (the last event was given already).
                    self._log.done = True
                    continue
                self._lost()  # ended before the last event: a proxy's doing
                continue
            except (httpx.HTTPError, httpx.StreamError):
                self._lost()
                continue
            try:
                events = self._log.feed(chunk)
            except BaseException:
                self.close()
                raise
            self._quiet = 0  # the server is there: a keep-alive says so as well as an event
            if events:
                self._got = True
                self._read_id = events[-1][1]
                self._pending.extend(events)
            if self._until is not None and time.monotonic() >= self._until:
                self.close()  # a wait's timeout, however much still comes
                raise _wire.Expired()
            if time.monotonic() > self._budget.ends:
                self._lost(failed=False)  # one connection's deadline: the next has its own
        event, self.last_event_id = self._pending.popleft()
        return event

    def _connect(self) -> None:
        while True:
            if self._quiet >= len(_wire.RECONNECT_PAUSES):
                self.close()
                raise TransportError(f"the events of {self.id} were lost, and reconnecting failed")
            pause = _wire.RECONNECT_PAUSES[self._quiet]
            if self._until is not None and time.monotonic() + pause >= self._until:
                self.close()
                raise _wire.Expired()
            time.sleep(pause)
            read = None if self._until is None else max(self._until - time.monotonic(), 0.001)
            budget = Budget(self._client._settings)
            try:
                response = self._client._exchange(_wire.background_events(self.id, self._read_id), budget, read)
            except (TransportError, ServiceUnavailable):
                self._quiet += 1
                continue
            except BaseException:
                self.close()
                raise
            assert isinstance(response, httpx.Response)
            self._response, self._chunks, self._budget = response, response.iter_raw(), budget
            self._got = False
            # What a lost connection left of an event is read again, whole.
            self._log = LogEvents(self._client._settings.max_response_bytes)
            return

    def _lost(self, failed: bool = True) -> None:
        """The connection is gone; `failed` unless it reached its own deadline, which is no
        sign of trouble and so does not bring the follower closer to giving up."""
        if self._response is not None:
            self._response.close()
        self._response = None
        if self._until is not None and time.monotonic() >= self._until:
            self.close()
            raise _wire.Expired()
        if failed:
            self._quiet += 1
        self.reconnections += 1

    def close(self) -> None:
        self._closed = True
        if self._response is not None:
            self._response.close()

    def __enter__(self) -> BackgroundEvents:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Session:
    """One sandbox and interpreter kept for many cells: variables, imports and files persist.
    Closing it (or leaving its `with` block) destroys the sandbox before returning, or the
    snapshot of a paused one. `pause` frees its sandbox and keeps its state; `fork` makes
    another session with the same state."""

    def __init__(self, client: Airlock, info: SessionInfo) -> None:
        self._client = client
        self.id = info.id
        self.info = info
        self.closed = False

    def run(self, code: str, *, timeout_ms: int | None = None) -> Execution:
        """Runs a cell. Its `session_ended` says whether the cell ended the session; its
        `resumed`, whether it brought the paused session back first."""
        body = _wire.cell_body(code, timeout_ms=timeout_ms, entrypoint=None, inputs=None)
        return self._client._do(_wire.cell(self.id, body))

    def call(self, code: str, entrypoint: str, /, **inputs: object) -> object:
        """Runs `code` as a cell, then returns `entrypoint(**inputs)`, decoded; raises
        ExecutionFailed unless it ended ok."""
        body = _wire.cell_body(code, timeout_ms=None, entrypoint=entrypoint, inputs=inputs)
        return self._client._do(_wire.cell(self.id, body)).raise_for_status().result

    def stream(self, code: str, *, timeout_ms: int | None = None) -> Stream:
        """As `run`, with the output as it is written (see `Airlock.stream`)."""
        body = _wire.cell_body(code, timeout_ms=timeout_ms, entrypoint=None, inputs=None)
        return self._client._stream(_wire.cell(self.id, body, stream=True))

    def upload(self, path: str, data: bytes | str) -> None:
        """Writes a file below the session's working directory (`str` as UTF-8)."""
        self._client._do(_wire.upload(self.id, path, data))

    def download(self, path: str) -> bytes:
        """A regular file's contents (links, FIFOs and devices are refused by the server)."""
        return self._client._do(_wire.download(self.id, path))

    def files(self) -> list[FileEntry]:
        """Everything below the working directory (links listed, never followed)."""
        return self._client._do(_wire.list_files(self.id))

    def refresh(self) -> SessionInfo:
        """The session as the server holds it now (cells run, whether a cell ended it)."""
        self.info = self._client._do(_wire.session_info(self.id))
        return self.info

    def pause(self) -> SessionInfo:
        """Writes the session's state (variables, functions, classes, imported modules, the
        files of `/work` and `/tmp`) to a snapshot in its own sandbox, then frees the sandbox;
        its next cell, file request or `resume` brings it back in a fresh one. `paused` says
        what the snapshot holds, and in `not_kept` what could not be kept (a lock, a
        generator, an open file), per variable with why. Raises QuotaExceeded when the state
        is over what the key may keep (nothing was, and the session runs on as it was),
        SessionBusy while another request of it runs, SnapshotFailed when its sandbox could
        not write the snapshot."""
        self.info = self._client._do(_wire.pause(self.id))
        return self.info

    def resume(self) -> SessionInfo:
        """Brings a paused session back in a fresh sandbox (its next cell would too):
        `resumed` says what came back and what could not; None when it was open. Raises
        SnapshotInvalid when its snapshot was altered or is not this session's (nothing of
        it ran)."""
        self.info = self._client._do(_wire.resume(self.id))
        return self.info

    def fork(self) -> Session:
        """A new session with this one's state (open or paused; this one goes on as it was,
        and a paused one stays paused): a handle of its own, to close or use as a context
        manager. Its `info.resumed` says what it holds."""
        return Session(self._client, self._client._do(_wire.fork(self.id)))

    def close(self) -> None:
        """Destroys the sandbox, or deletes a paused session's snapshot. Closing twice, or a
        session the server already closed (idle, expired) or lost (it was restarted while
        open), is not an error."""
        if self.closed:
            return
        try:
            self._client._do(_wire.close_session(self.id))
        except (NotFound, SessionLost):
            pass
        self.closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Volume:
    """A handle on one of this key's volumes, by `name`: its files are read and written here
    without a sandbox, and `mount(path)` makes what `run`, `stream` and `session` take as
    `volumes=` to mount it. A writable mount or a write here is the volume's one writer at a
    time (VolumeBusy names the holder); `read_only` mounts share it."""

    def __init__(self, client: Airlock, name: str) -> None:
        _wire.segment(name, "volume name")
        self._client = client
        self.name = name

    def mount(self, path: str, read_only: bool = False) -> dict[str, object]:
        """The mount for `volumes=`: the volume at `path`, absolute, below `/work` or `/tmp`."""
        return _wire.mount(self.name, path, read_only)

    def info(self) -> VolumeInfo:
        """The volume as the server holds it, with `used_bytes` and `used_entries`."""
        return self._client._do(_wire.volume_info(self.name))

    def upload(self, path: str, data: bytes | str) -> None:
        """Writes a file of the volume (`str` as UTF-8; missing directories are made). Raises
        VolumeBusy while another writer holds it, VolumeFull when it does not fit."""
        self._client._do(_wire.volume_upload(self.name, path, data))

    def download(self, path: str) -> bytes:
        """A regular file's contents (links are refused, never followed)."""
        return self._client._do(_wire.volume_download(self.name, path))

    def files(self) -> VolumeFiles:
        """Everything in the volume (links listed, never followed), up to 10,000 entries or
        4 MiB of paths (then `truncated`); entries it could not read are marked `unreadable`,
        names that are not UTF-8 `lossy`."""
        return self._client._do(_wire.volume_files(self.name))

    def remove(self, path: str) -> None:
        """Removes a file, a link (never its target) or an empty directory of the volume."""
        self._client._do(_wire.volume_remove(self.name, path))

    def delete(self) -> None:
        """Deletes the volume and everything in it. Raises VolumeInUse while an execution, a
        session or a file request holds it."""
        self._client._do(_wire.delete_volume(self.name))

    def __repr__(self) -> str:
        return f"Volume({self.name!r})"
