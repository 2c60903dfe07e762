"""`AsyncAirlock`: the asyncio client of airlock's HTTP API (the same calls as `Airlock`)."""

from __future__ import annotations

import asyncio
import collections
import time
from types import TracebackType
from typing import Callable, AsyncIterator, Mapping, Sequence, TypeVar

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

__all__ = [
    "AsyncAirlock",
    "AsyncBackgroundEvents",
    "AsyncBackgroundExecution",
    "AsyncSession",
    "AsyncStream",
    "AsyncVolume",
]

_T = TypeVar("_T")

# Answers larger than this are parsed in a thread.
_OFF_LOOP_BYTES = 1 << 20


class AsyncAirlock:
    """An asyncio client of one airlock server; see `Airlock` for the arguments.

    `url` defaults to `$AIRLOCK_URL`, then `http://127.0.0.1:8080`; `api_key` to
    `$AIRLOCK_API_KEY`. With `retries` > 0, a request refused with 429 or 503 and a
    `Retry-After` of at most `max_retry_wait` seconds is sent again after that wait, up to
    `retries` times (airlock refuses those before running anything). An answer larger than
    `max_response_bytes` is refused. Use it as a context manager, or `close()` it.
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
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._settings = Settings.make(url, api_key, retries, max_retry_wait, max_response_bytes, deadline)
        self._http = http_client or httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False)

    @property
    def url(self) -> str:
        return self._settings.url

    async def run(
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
        return await self._do(_wire.run(body))

    async def call(self, code: str, entrypoint: str, /, **inputs: object) -> object:
        """Function mode: runs `code` as a module, calls `entrypoint(**inputs)` and returns
        its value, decoded; raises ExecutionFailed (with the Execution) unless it ended ok."""
        return (await self.run(code, entrypoint=entrypoint, inputs=inputs)).raise_for_status().result

    async def stream(
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
    ) -> AsyncStream:
        """As `run`, with the output as it is written: iterate the Stream for OutputEvents
        (and a TruncatedEvent when a stream reaches its limit), the Execution last. Refusals
        raise here, before any event."""
        body = _wire.execute_body(
            code, limits=limits, files=files, env=env, stdin=stdin, environment=environment,
            egress=egress, credentials=credentials, entrypoint=entrypoint, inputs=inputs,
            volumes=volumes,
        )
        return await self._stream(_wire.run(body, stream=True), on_approval)

    async def submit(
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
    ) -> AsyncBackgroundExecution:
        """As `run`, in the background: answered at once (see `Airlock.submit`)."""
        body = _wire.execute_body(
            code, limits=limits, files=files, env=env, stdin=stdin, environment=environment,
            egress=egress, credentials=credentials, entrypoint=entrypoint, inputs=inputs,
            volumes=volumes,
        )
        info = await self._do(_wire.submit(body))
        return AsyncBackgroundExecution(self, info.id, info)

    def background(self, execution_id: str) -> AsyncBackgroundExecution:
        """A handle on this key's background execution `execution_id`; no request yet."""
        return AsyncBackgroundExecution(self, execution_id)

    async def eval(self, expression: str) -> Evaluation:
        """Evaluates a Python literal expression natively on the server (no sandbox)."""
        return await self._do(_wire.evaluate(expression))

    async def execution(self, execution_id: str) -> ExecutionRecord:
        """The audit record of one of this key's executions."""
        return await self._do(_wire.record(execution_id))

    async def session(
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
    ) -> AsyncSession:
        """Starts a session (one sandbox and interpreter for many cells); close it, or use it
        as a context manager. Its `volumes` stay mounted (a writable one held) until it ends."""
        body = _wire.session_body(
            limits=limits, files=files, env=env, environment=environment, egress=egress,
            credentials=credentials,
            idle_timeout_ms=idle_timeout_ms, max_lifetime_ms=max_lifetime_ms, volumes=volumes,
        )
        return AsyncSession(self, await self._do(_wire.open_session(body)))

    async def session_by_id(self, session_id: str) -> AsyncSession:
        """A handle on this key's session `session_id`, open or paused (see
        `Airlock.session_by_id`); raises NotFound when there is none."""
        return AsyncSession(self, await self._do(_wire.session_info(session_id)))

    async def sessions(self) -> list[SessionInfo]:
        """This key's sessions, open and paused (see `Airlock.sessions`)."""
        return await self._do(_wire.sessions())

    async def tools(self) -> ToolList:
        """The operator's tools this key's code may call, with their Python signatures."""
        return await self._do(_wire.tools())

    async def approvals(self) -> list[Approval]:
        """Tool calls waiting for an approval that this key (scope `approve`) may decide:
        those of the keys its `approves` names, never its own; oldest first."""
        return await self._do(_wire.approvals())

    async def approval(self, approval_id: str) -> ApprovalDetail:
        """One waiting call that this key may decide, as listed, with its arguments whole:
        what the tool will get, however long, and whatever characters it holds (show a person
        `approval.arguments_preview`). Raises NotFound as `approve` does."""
        return await self._do(_wire.approval(approval_id))

    async def approve(self, approval_id: str, reason: str | None = None) -> Decided:
        """Lets the one waiting call `approval_id` run. Raises NotFound when it waits no more
        (decided, timed out, withdrawn) or is not this key's to decide."""
        return await self._do(_wire.decide(approval_id, "approve", reason))

    async def deny(self, approval_id: str, reason: str | None = None) -> Decided:
        """Fails the one waiting call `approval_id`: the code gets ToolError(kind="denied")
        with `reason`. Raises NotFound as `approve` does."""
        return await self._do(_wire.decide(approval_id, "deny", reason))

    async def environments(self) -> list[Environment]:
        """The named environments."""
        return await self._do(_wire.environments())

    async def environment(self, name: str) -> Environment:
        return await self._do(_wire.environment(name))

    async def create_environment(self, name: str, requirements: list[str]) -> Environment:
        """Builds an environment (scope `admin`); answers when the build is done."""
        return await self._do(_wire.create_environment(name, requirements))

    async def delete_environment(self, name: str) -> None:
        await self._do(_wire.delete_environment(name))

    async def create_volume(self, name: str, size_bytes: int, *, max_entries: int | None = None) -> AsyncVolume:
        """Makes a volume (see `Airlock.create_volume`)."""
        await self._do(_wire.create_volume(name, size_bytes, max_entries))
        return AsyncVolume(self, name)

    async def volumes(self) -> list[VolumeInfo]:
        """This key's volumes (without their usage: see `AsyncVolume.info`)."""
        return await self._do(_wire.volumes())

    def volume(self, name: str) -> AsyncVolume:
        """A handle on the volume `name`; nothing is asked of the server until it is used."""
        return AsyncVolume(self, name)

    async def scan_pickle(self, data: bytes) -> dict[str, object]:
        """The server's scan report of a pickle (or a ZIP of pickles); never loads it."""
        return await self._do(_wire.scan_pickle(data))

    async def ready(self) -> dict[str, object]:
        """`/readyz`: `ready`, and `reasons` when it is not."""
        return await self._do(_wire.ready())

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncAirlock:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _do(self, request: Request[_T]) -> _T:
        answer = await self._exchange(request, Budget(self._settings))
        assert isinstance(answer, Answer)
        if len(answer.body) > _OFF_LOOP_BYTES:
            # Parsing and decoding a large answer takes a while: not on the event loop.
            return await asyncio.to_thread(request.parse, answer)
        return request.parse(answer)

    async def _stream(
        self, request: Request[object], on_approval: Callable[[Approval], object] | None = None
    ) -> AsyncStream:
        budget = Budget(self._settings)
        response = await self._exchange(request, budget)
        assert isinstance(response, httpx.Response)
        return AsyncStream(response, budget, self._settings, on_approval)

    async def _exchange(
        self, request: Request[object], budget: Budget, read_timeout: float | None = None
    ) -> Answer | httpx.Response:
        """As `Airlock._exchange`."""
        attempt = 0
        while True:
            response = await self._open(request, read_timeout)
            if request.stream and response.status_code == 200:
                try:
                    _wire.check_stream(response.headers)
                except ProtocolError:
                    await response.aclose()
                    raise
                return response
            try:
                answer = await self._read(response, budget)
            finally:
                await response.aclose()
            if answer.status in request.ok and not request.stream:
                return answer
            error = _wire.refusal(answer)
            wait = self._settings.wait_before_retry(error, attempt)
            if wait is None:
                raise error
            await asyncio.sleep(wait)
            attempt += 1

    async def _open(self, request: Request[object], read_timeout: float | None = None) -> httpx.Response:
        built = self._http.build_request(
            request.method,
            self._settings.url + request.path,
            headers={**self._settings.headers(), **request.headers()},
            content=request.body(),
            timeout=_wire.with_read_timeout(self._http.timeout, read_timeout),
        )
        try:
            return await self._http.send(built, stream=True)
        except httpx.HTTPError as e:
            raise TransportError(self._settings.redact(f"{request.method} {request.path}: {e}")) from None

    async def _read(self, response: httpx.Response, budget: Budget) -> Answer:
        _wire.check_head(response.headers, budget.limit)
        body = bytearray()
        try:
            async for chunk in response.aiter_raw():
                budget.add(body, chunk)
        except httpx.HTTPError as e:
            raise TransportError(self._settings.redact(f"reading the answer: {e}")) from None
        return Answer(response.status_code, response.headers, bytes(body))


class AsyncStream:
    """The events of one streamed execution, iterated with `async for` (see `Stream`)."""

    def __init__(
        self,
        response: httpx.Response,
        budget: Budget,
        settings: Settings,
        on_approval: Callable[[Approval], object] | None = None,
    ) -> None:
        self._response = response
        self._on_approval = on_approval
        self._chunks = response.aiter_raw()
        self._budget = budget
        self._settings = settings
        self._events = Events(budget.limit)
        self._pending: collections.deque[StreamEvent] = collections.deque()
        self._closed = False
        self.execution: Execution | None = None

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self

    async def __anext__(self) -> StreamEvent:
        while not self._pending:
            if self._events.done:
                await self.close()
                raise StopAsyncIteration
            if self._closed:
                raise TransportError("the stream was closed before its result")
            try:
                chunk = await self._chunks.__anext__()
                self._pending.extend(self._events.feed(chunk))
                self._budget.check_time()
            except StopAsyncIteration:
                await self.close()
                self._events.finish()
                raise
            except (httpx.HTTPError, httpx.StreamError) as e:
                await self.close()
                raise TransportError(self._settings.redact(f"reading the stream: {e}")) from None
            except BaseException:
                await self.close()
                raise
        event = self._pending.popleft()
        if isinstance(event, Execution):
            self.execution = event
        elif isinstance(event, Approval) and self._on_approval is not None:
            # Called as the event is read: a call waits, and another key may decide it now.
            self._on_approval(event)
        return event

    async def finish(self) -> Execution:
        """Reads the rest of the stream and returns the Execution."""
        async for _ in self:
            pass
        if self.execution is None:
            raise ProtocolError("the stream ended without its result")
        return self.execution

    async def close(self) -> None:
        self._closed = True
        await self._response.aclose()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class AsyncBackgroundExecution:
    """A background execution of an AsyncAirlock (see `BackgroundExecution`)."""

    def __init__(self, client: AsyncAirlock, execution_id: str, info: BackgroundInfo | None = None) -> None:
        _wire.segment(execution_id, "execution id")
        self._client = client
        self.id = execution_id
        self.info = info
        self._deleted: BackgroundInfo | None = None

    async def refresh(self) -> BackgroundInfo:
        """Its state now, with the whole result once it has one."""
        self.info = await self._client._do(_wire.background(self.id))
        return self.info

    def events(self, after: int | None = None) -> AsyncBackgroundEvents:
        """Its events, followed with `async for` (see `BackgroundExecution.events`)."""
        return AsyncBackgroundEvents(self._client, self.id, after)

    async def wait(self, timeout: float | None = None) -> Execution:
        """Follows it to its end and returns its Execution (see `BackgroundExecution.wait`)."""
        if self._deleted is not None:
            raise _wire.deleted(self._deleted)
        until = None if timeout is None else time.monotonic() + timeout
        info = await self.refresh()
        if info.ended:
            return _wire.outcome(info)
        ending: BackgroundEvent | None = None
        try:
            async with AsyncBackgroundEvents(self._client, self.id, None, until) as events:
                async for ending in events:
                    pass
        except _wire.Expired:
            raise WaitTimeout(self.id, info.state, timeout or 0.0) from None
        try:
            # Its last event is written just before its state: read again until it ended.
            for pause in _wire.ENDING_PAUSES:
                info = await self.refresh()
                if info.ended:
                    break
                await asyncio.sleep(pause)
            return _wire.outcome(info)
        except NotFound as e:
            raise _wire.gone(self.id, ending, e) from None

    async def cancel(self) -> BackgroundInfo:
        """Cancels and deletes it (see `BackgroundExecution.cancel`)."""
        if self._deleted is None:
            self._deleted = await self._client._do(_wire.cancel(self.id))
            self.info = self._deleted
        return self._deleted

    def __repr__(self) -> str:
        return f"AsyncBackgroundExecution({self.id!r})"


class AsyncBackgroundEvents:
    """The events of a background execution, followed with `async for` and resumed by
    itself after a dropped connection (see `BackgroundEvents`)."""

    def __init__(self, client: AsyncAirlock, execution_id: str, after: int | None, until: float | None = None) -> None:
        self._client = client
        self.id = execution_id
        self.last_event_id = after
        self._read_id = after
        self._until = until
        self._response: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._budget = Budget(client._settings)
        self._log = LogEvents(client._settings.max_response_bytes)
        self._pending: collections.deque[tuple[BackgroundEvent, int]] = collections.deque()
        self._quiet = 0
        self._got = False  # whether this connection brought any event
        self._closed = False
        self.reconnections = 0

    def __aiter__(self) -> AsyncIterator[BackgroundEvent]:
        return self

    async def __anext__(self) -> BackgroundEvent:
        while not self._pending:
            if self._log.done:
                await self.close()
                raise StopAsyncIteration
            if self._closed:
                raise TransportError("the events were closed before the last")
            if self._response is None or self._chunks is None:
                await self._connect()
                continue
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                if not self._got:
                    # Ended whole with nothing after the event it resumed after: there is
                    # nothing more (the last event was given already).
                    self._log.done = True
                    continue
                await self._lost()  # ended before the last event: a proxy's doing
                continue
            except (httpx.HTTPError, httpx.StreamError):
                await self._lost()
                continue
            try:
                events = self._log.feed(chunk)
            except BaseException:
                await self.close()
                raise
            self._quiet = 0  # the server is there: a keep-alive says so as well as an event
            if events:
                self._got = True
                self._read_id = events[-1][1]
                self._pending.extend(events)
            if self._until is not None and time.monotonic() >= self._until:
                await self.close()  # a wait's timeout, however much still comes
                raise _wire.Expired()
            if time.monotonic() > self._budget.ends:
                await self._lost(failed=False)  # one connection's deadline: the next has its own
        event, self.last_event_id = self._pending.popleft()
        return event

    async def _connect(self) -> None:
        while True:
            if self._quiet >= len(_wire.RECONNECT_PAUSES):
                await self.close()
                raise TransportError(f"the events of {self.id} were lost, and reconnecting failed")
            pause = _wire.RECONNECT_PAUSES[self._quiet]
            if self._until is not None and time.monotonic() + pause >= self._until:
                await self.close()
                raise _wire.Expired()
            await asyncio.sleep(pause)
            read = None if self._until is None else max(self._until - time.monotonic(), 0.001)
            budget = Budget(self._client._settings)
            try:
                response = await self._client._exchange(_wire.background_events(self.id, self._read_id), budget, read)
            except (TransportError, ServiceUnavailable):
                self._quiet += 1
                continue
            except BaseException:
                await self.close()
                raise
            assert isinstance(response, httpx.Response)
            self._response, self._chunks, self._budget = response, response.aiter_raw(), budget
            self._got = False
            # What a lost connection left of an event is read again, whole.
            self._log = LogEvents(self._client._settings.max_response_bytes)
            return

    async def _lost(self, failed: bool = True) -> None:
        """The connection is gone; `failed` unless it reached its own deadline, which is no
        sign of trouble and so does not bring the follower closer to giving up."""
        if self._response is not None:
            await self._response.aclose()
        self._response = None
        if self._until is not None and time.monotonic() >= self._until:
            await self.close()
            raise _wire.Expired()
        if failed:
            self._quiet += 1
        self.reconnections += 1

    async def close(self) -> None:
        self._closed = True
        if self._response is not None:
            await self._response.aclose()

    async def __aenter__(self) -> AsyncBackgroundEvents:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class AsyncSession:
    """A session of an AsyncAirlock (see `Session`); `async with` closes it."""

    def __init__(self, client: AsyncAirlock, info: SessionInfo) -> None:
        self._client = client
        self.id = info.id
        self.info = info
        self.closed = False

    async def run(self, code: str, *, timeout_ms: int | None = None) -> Execution:
        body = _wire.cell_body(code, timeout_ms=timeout_ms, entrypoint=None, inputs=None)
        return await self._client._do(_wire.cell(self.id, body))

    async def call(self, code: str, entrypoint: str, /, **inputs: object) -> object:
        body = _wire.cell_body(code, timeout_ms=None, entrypoint=entrypoint, inputs=inputs)
        return (await self._client._do(_wire.cell(self.id, body))).raise_for_status().result

    async def stream(self, code: str, *, timeout_ms: int | None = None) -> AsyncStream:
        body = _wire.cell_body(code, timeout_ms=timeout_ms, entrypoint=None, inputs=None)
        return await self._client._stream(_wire.cell(self.id, body, stream=True))

    async def upload(self, path: str, data: bytes | str) -> None:
        await self._client._do(_wire.upload(self.id, path, data))

    async def download(self, path: str) -> bytes:
        return await self._client._do(_wire.download(self.id, path))

    async def files(self) -> list[FileEntry]:
        return await self._client._do(_wire.list_files(self.id))

    async def refresh(self) -> SessionInfo:
        self.info = await self._client._do(_wire.session_info(self.id))
        return self.info

    async def pause(self) -> SessionInfo:
        """Writes the session's state to a snapshot and frees its sandbox (see `Session.pause`)."""
        self.info = await self._client._do(_wire.pause(self.id))
        return self.info

    async def resume(self) -> SessionInfo:
        """Brings a paused session back (see `Session.resume`)."""
        self.info = await self._client._do(_wire.resume(self.id))
        return self.info

    async def fork(self) -> AsyncSession:
        """A new session with this one's state (see `Session.fork`); `async with` closes it."""
        return AsyncSession(self._client, await self._client._do(_wire.fork(self.id)))

    async def close(self) -> None:
        if self.closed:
            return
        try:
            await self._client._do(_wire.close_session(self.id))
        except (NotFound, SessionLost):
            pass
        self.closed = True

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class AsyncVolume:
    """A volume of an AsyncAirlock (see `Volume`)."""

    def __init__(self, client: AsyncAirlock, name: str) -> None:
        _wire.segment(name, "volume name")
        self._client = client
        self.name = name

    def mount(self, path: str, read_only: bool = False) -> dict[str, object]:
        """The mount for `volumes=`: the volume at `path`, absolute, below `/work` or `/tmp`."""
        return _wire.mount(self.name, path, read_only)

    async def info(self) -> VolumeInfo:
        return await self._client._do(_wire.volume_info(self.name))

    async def upload(self, path: str, data: bytes | str) -> None:
        await self._client._do(_wire.volume_upload(self.name, path, data))

    async def download(self, path: str) -> bytes:
        return await self._client._do(_wire.volume_download(self.name, path))

    async def files(self) -> VolumeFiles:
        return await self._client._do(_wire.volume_files(self.name))

    async def remove(self, path: str) -> None:
        await self._client._do(_wire.volume_remove(self.name, path))

    async def delete(self) -> None:
        await self._client._do(_wire.delete_volume(self.name))

    def __repr__(self) -> str:
        return f"AsyncVolume({self.name!r})"
