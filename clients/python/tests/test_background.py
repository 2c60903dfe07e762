"""Background executions against the real server (conftest.py): `submit` and `wait` give what
`run` gives, `events()` resumes after dropped connections with every byte once (and from a
kept id, elsewhere), `cancel` kills and deletes, and every other ending raises what it is
(`interrupted` by a crash: test_client.py's crash test, and here a follower that goes on
across it)."""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest

from airlock_client import (
    Airlock,
    AsyncAirlock,
    BackgroundError,
    BackgroundEvent,
    BackgroundExecution,
    BackgroundNotFinished,
    BadRequest,
    Execution,
    NotFound,
    OutputEvent,
    ProtocolError,
    WaitTimeout,
)
from airlock_client._wire import LogEvents
from conftest import KEY, OTHER, Server, launch, stop

# 50 lines over about 2.5 s on stdout, every fifth echoed on stderr; characters of 1 to 4 bytes.
CHATTY = (
    "import sys, time\n"
    "for i in range(50):\n"
    "    print(f'out {i} é€😀', flush=True)\n"
    "    if i % 5 == 0:\n"
    "        sys.stderr.write(f'err {i}\\n'); sys.stderr.flush()\n"
    "    time.sleep(0.05)\n"
    "'done'"
)
CHATTY_OUT = "".join(f"out {i} é€😀\n" for i in range(50))
CHATTY_ERR = "".join(f"err {i}\n" for i in range(0, 50, 5))
LONG = "import time\nprint('started', flush=True)\ntime.sleep(600)"


@pytest.fixture
def client(server: Server) -> Iterator[Airlock]:
    with Airlock(server.url, KEY) as c:
        yield c


class Cutter:
    """Cuts the first `times` connections to a background execution's events after `chunks`
    chunks and half of the next (mid-event, most likely), as a network that drops would;
    records the `Last-Event-ID` each connection sent."""

    def __init__(self, times: int = 8, chunks: int = 2) -> None:
        self.times = times
        self.chunks = chunks
        self.sent: list[str | None] = []
        self.cuts = 0

    def cut(self, request: httpx.Request) -> bool:
        if not request.url.path.endswith("/events"):
            return False
        self.sent.append(request.headers.get("last-event-id"))
        return len(self.sent) <= self.times


class _CutStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, cutter: Cutter) -> None:
        self.inner, self.cutter, self.chunks = inner, cutter, cutter.chunks

    def __iter__(self) -> Iterator[bytes]:
        for i, chunk in enumerate(self.inner):
            if i == self.chunks:
                yield chunk[: len(chunk) // 2]
                self.cutter.cuts += 1
                raise httpx.ReadError("cut by the test")
            yield chunk

    def close(self) -> None:
        self.inner.close()


class CuttingTransport(httpx.HTTPTransport):
    def __init__(self, cutter: Cutter) -> None:
        super().__init__()
        self.cutter = cutter

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not self.cutter.cut(request):
            return response
        assert isinstance(response.stream, httpx.SyncByteStream)
        stream = _CutStream(response.stream, self.cutter)
        return httpx.Response(response.status_code, headers=response.headers, stream=stream, extensions=response.extensions)


class _AsyncCutStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, cutter: Cutter) -> None:
        self.inner, self.cutter, self.chunks = inner, cutter, cutter.chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        i = 0
        async for chunk in self.inner:
            if i == self.chunks:
                yield chunk[: len(chunk) // 2]
                self.cutter.cuts += 1
                raise httpx.ReadError("cut by the test")
            yield chunk
            i += 1

    async def aclose(self) -> None:
        await self.inner.aclose()


class AsyncCuttingTransport(httpx.AsyncHTTPTransport):
    def __init__(self, cutter: Cutter) -> None:
        super().__init__()
        self.cutter = cutter

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if not self.cutter.cut(request):
            return response
        assert isinstance(response.stream, httpx.AsyncByteStream)
        stream = _AsyncCutStream(response.stream, self.cutter)
        return httpx.Response(response.status_code, headers=response.headers, stream=stream, extensions=response.extensions)


def texts(events: list[BackgroundEvent], stream: str) -> str:
    return "".join(e.text for e in events if isinstance(e, OutputEvent) and e.stream == stream)


def test_submit_then_wait_gives_what_run_gives(client: Airlock) -> None:
    code = "import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n{'x': [1, 2.5, None], 'b': b'\\x00'}"
    ran = client.run(code)
    h = client.submit(code, limits={"memory_mb": 256})
    assert h.info is not None and h.info.state in ("queued", "running") and h.info.result is None
    assert h.info.limits.memory_mb == 256 and h.info.limits.timeout_ms == 3_600_000  # the background default
    e = h.wait()
    assert isinstance(e, Execution) and e.id == h.id and not e.output_streamed
    for field in ("status", "stdout", "stderr", "result", "result_json", "error", "exit_code", "limits_hit"):
        assert getattr(e, field) == getattr(ran, field), field
    assert e.result == {"x": [1, 2.5, None], "b": b"\x00"}
    # Ended: its state has the result; a handle by id from anywhere waits no more.
    info = h.refresh()
    assert info.state == "finished" and info.started_at and info.ended_at and info.error is None
    assert client.background(h.id).wait() == e
    # The audit record's call names what the id is rather than misreading it.
    with pytest.raises(ProtocolError, match="background execution"):
        client.execution(h.id)
    # Refusals raise as run's do, before anything is kept.
    for submit in (client.run, client.submit):
        with pytest.raises(BadRequest) as bad:
            submit("1", limits={"memory_mb": 10**9})
        assert (bad.value.code, bad.value.field) == ("limit_above_ceiling", "limits.memory_mb")
    h.cancel()


def test_events_resume_after_dropped_connections_with_every_byte_once(server: Server) -> None:
    cutter = Cutter()
    http = httpx.Client(transport=CuttingTransport(cutter), timeout=30)
    with Airlock(server.url, KEY, http_client=http) as c:
        h = c.submit(CHATTY)
        began = time.monotonic()
        seen: list[BackgroundEvent] = []
        ids: list[int] = []
        with h.events() as events:
            for event in events:
                seen.append(event)
                assert events.last_event_id is not None
                ids.append(events.last_event_id)
            reconnections = events.reconnections
        assert time.monotonic() - began >= 1.5, "followed while it ran"
    assert texts(seen, "stdout") == CHATTY_OUT and texts(seen, "stderr") == CHATTY_ERR
    assert ids == sorted(set(ids)), "ids grow, each once"
    last = seen[-1]
    assert isinstance(last, Execution) and last.ok and last.result == "done"
    assert last.output_streamed and last.stdout == "" and last.id == h.id
    # Every connection after the first resumed after an event it had given, with its id.
    assert reconnections == cutter.cuts >= 3 and len(cutter.sent) == reconnections + 1, (reconnections, cutter.sent)
    assert cutter.sent[0] is None
    assert all(sent is not None and int(sent) in ids for sent in cutter.sent[1:])

    # Another process, from a kept id: the rest once, then nothing after the last.
    with Airlock(server.url, KEY) as other:
        again = other.background(h.id)
        half = len(ids) // 2
        rest = list(again.events(after=ids[half - 1]))
        assert len(rest) == len(seen) - half
        assert texts(seen[:half], "stdout") + texts(rest, "stdout") == CHATTY_OUT
        assert texts(seen[:half], "stderr") + texts(rest, "stderr") == CHATTY_ERR
        assert list(again.events(after=ids[-1])) == []
        with pytest.raises(BadRequest) as bad:
            next(iter(again.events(after=ids[-1] - 1)))
        assert bad.value.field == "Last-Event-ID"
        e = again.wait()
        assert (e.stdout, e.stderr, e.result) == (CHATTY_OUT, CHATTY_ERR, "done")
        again.cancel()


def test_cancel_kills_a_long_run_and_deletes_it(client: Airlock) -> None:
    running = client.submit(LONG)
    queued = client.submit("print('never')")  # one runs at a time: this one waits
    with running.events() as events:
        assert next(events) == OutputEvent("stdout", "started\n")
    assert queued.refresh().state == "queued"
    # A waiter elsewhere sees it end.
    ended: list[BaseException] = []
    waiter = threading.Thread(target=lambda: _catch(client.background(running.id).wait, ended))
    waiter.start()
    time.sleep(0.3)  # it follows the events by now

    info = queued.cancel()
    assert info.state == "cancelled" and info.started_at is None
    assert info.error is not None and info.error.code == "cancelled"
    began = time.monotonic()
    info = running.cancel()
    assert info.state == "cancelled" and info.ended_at is not None
    assert time.monotonic() - began < 5
    assert running.cancel() is info, "cancelled once"
    waiter.join(10)
    assert not waiter.is_alive()
    [error] = ended
    # The waiter read its last event, then found it cancelled or already deleted.
    assert isinstance(error, (BackgroundNotFinished, NotFound)), error
    if isinstance(error, BackgroundNotFinished):
        assert error.state == "cancelled"

    # Gone: its state, events and result, from any handle.
    for h in (running, queued, client.background(running.id)):
        with pytest.raises(NotFound):
            h.refresh()
    with pytest.raises(NotFound):
        next(iter(client.background(running.id).events()))
    with pytest.raises(NotFound):
        client.background(running.id).cancel()
    # Its own handle says how it ended.
    with pytest.raises(BackgroundNotFinished) as stopped:
        running.wait()
    assert stopped.value.state == "cancelled" and "cancelled" in str(stopped.value)
    with pytest.raises(BackgroundNotFinished) as stopped:
        queued.wait()
    assert stopped.value.error is not None and stopped.value.error.code == "cancelled"
    assert client.run("1").result == 1


def _catch(f: Any, into: list[BaseException]) -> None:
    try:
        f()
    except BaseException as e:  # noqa: BLE001 (the test looks at it)
        into.append(e)


def test_wait_times_out_without_touching_it_and_another_key_sees_nothing(server: Server, client: Airlock) -> None:
    h = client.submit(LONG)
    began = time.monotonic()
    with pytest.raises(WaitTimeout) as late:
        h.wait(timeout=0.5)
    assert 0.5 <= time.monotonic() - began < 3
    assert isinstance(late.value, TimeoutError) and late.value.id == h.id
    assert h.refresh().state in ("queued", "running"), "it goes on"
    with Airlock(server.url, OTHER) as other:
        theirs = other.background(h.id)
        for call in (theirs.refresh, theirs.wait, theirs.cancel, lambda: next(iter(theirs.events()))):
            with pytest.raises(NotFound):
                call()
    assert h.refresh().state in ("queued", "running")
    assert h.cancel().state == "cancelled"


def test_the_async_client_s_background_executions(server: Server) -> None:
    async def main() -> None:
        cutter = Cutter()
        http = httpx.AsyncClient(transport=AsyncCuttingTransport(cutter), timeout=30)
        async with AsyncAirlock(server.url, KEY, http_client=http) as c:
            h = await c.submit(CHATTY)
            seen: list[BackgroundEvent] = []
            async with h.events() as events:
                async for event in events:
                    seen.append(event)
                assert events.reconnections == cutter.cuts >= 3 and events.last_event_id is not None
            assert all(sent is not None for sent in cutter.sent[1:])
            assert texts(seen, "stdout") == CHATTY_OUT and texts(seen, "stderr") == CHATTY_ERR
            e = await h.wait()
            assert (e.stdout, e.stderr, e.result, e.id) == (CHATTY_OUT, CHATTY_ERR, "done", h.id)
            assert (await c.background(h.id).refresh()).state == "finished"
            assert (await h.cancel()).state == "finished"
            with pytest.raises(NotFound):
                await h.wait()  # its result went with it

            long = await c.submit(LONG)
            with pytest.raises(WaitTimeout):
                await long.wait(timeout=0.3)
            assert (await long.cancel()).state == "cancelled"
            with pytest.raises(BackgroundNotFinished) as stopped:
                await long.wait()
            assert stopped.value.state == "cancelled"
            with pytest.raises(NotFound):
                await c.background(long.id).refresh()

    asyncio.run(main())


def test_events_need_ids_and_each_is_bounded() -> None:
    log = LogEvents(100)
    assert log.feed(b'id: 40\nevent: stdout\ndata: {"text": "a"}\n\n: keep-alive\n\n') == [(OutputEvent("stdout", "a"), 40)]
    # Each event is bounded, not the stream: a follower may follow for hours.
    for _ in range(10):
        log.feed(b'id: 41\nevent: stdout\ndata: {"text": "' + b"x" * 40 + b'"}\n\n')
    with pytest.raises(ProtocolError, match="an event is over"):
        log.feed(b'id: 42\nevent: stdout\ndata: {"text": "' + b"x" * 100)
    with pytest.raises(ProtocolError, match="without an id"):
        LogEvents(100).feed(b'event: stdout\ndata: {"text": "a"}\n\n')
    end = LogEvents(1000)
    [(error, _)] = end.feed(b'id: 9\nevent: error\ndata: {"error": {"code": "interrupted", "message": "m"}}\n\n')
    assert error == BackgroundError("interrupted", "m") and end.done
    with pytest.raises(ProtocolError, match="after the stream's result"):
        LogEvents(1000).feed(b'id: 9\nevent: error\ndata: {"error": {"code": "x", "message": "m"}}\n\nid: 10\n')


def test_a_handle_by_id_asks_nothing_until_used(client: Airlock) -> None:
    h = client.background("ex_nothing_here")
    assert isinstance(h, BackgroundExecution) and h.info is None and repr(h) == "BackgroundExecution('ex_nothing_here')"
    with pytest.raises(ValueError):
        client.background("..")
    with pytest.raises(NotFound):
        h.wait()


def test_wait_on_one_that_failed_raises_with_the_server_s_reason(server: Server) -> None:
    # 10 MiB of output against a key's 8 MiB of stored background work: stopped, `failed`.
    with Airlock(server.url, OTHER) as other:
        h = other.submit(
            "import sys\nfor _ in range(160):\n    sys.stdout.write('z' * 65536); sys.stdout.flush()",
            limits={"output_bytes": 16 << 20},
        )
        with pytest.raises(BackgroundNotFinished) as failed:
            h.wait(timeout=60)
        assert failed.value.state == "failed"
        assert failed.value.error is not None and failed.value.error.code == "storage_full"
        assert "max_bytes_per_key" in str(failed.value)
        assert h.refresh().state == "failed"
        h.cancel()


def test_a_follower_goes_on_across_a_crash_and_restart(tmp_path: pathlib.Path) -> None:
    proc, url = launch(tmp_path)
    try:
        with Airlock(url, KEY) as c:
            h = c.submit(LONG)
            events = h.events()
            assert next(events) == OutputEvent("stdout", "started\n")
            kept = events.last_event_id
            proc.kill()  # SIGKILL: the server cleans up nothing
            proc.wait()
            # Back on the same address, from the same state, before the follower reads on.
            proc, again = launch(tmp_path, url.removeprefix("http://"))
            assert again == url
            # The same iterator: its connection lost, it reconnects after the last event it
            # gave, and the execution's log ends with how it ended.
            rest = list(events)
            assert events.reconnections >= 1 and events.last_event_id != kept
            [error] = rest
            assert isinstance(error, BackgroundError) and error.code == "interrupted", rest
            with pytest.raises(BackgroundNotFinished) as stopped:
                h.wait()
            assert stopped.value.state == "interrupted" and stopped.value.error == error
    finally:
        if proc.poll() is None:
            stop(proc)


def test_a_wait_s_timeout_holds_while_output_flows(client: Airlock) -> None:
    h = client.submit("import time\nfor i in range(1200):\n    print(i, flush=True)\n    time.sleep(0.05)")
    with pytest.raises(WaitTimeout):
        h.wait(timeout=1.0)
    # It gave up while the execution still ran (a minute of output), not at its end.
    assert h.refresh().state == "running"
    assert h.cancel().state == "cancelled"


def test_a_follower_outlives_its_connections_deadlines_on_a_quiet_execution(tmp_path: pathlib.Path) -> None:
    # Keep-alives every 100 ms, and each connection given 0.3 s: a silent execution of 11 s
    # takes dozens of connections, none of them a failure.
    proc, url = launch(tmp_path, extra="[http]\nsse_keep_alive_ms = 100\n")
    try:
        with Airlock(url, KEY, deadline=0.3) as c:
            h = c.submit("import time\ntime.sleep(11)\nprint('late')")
            with h.events() as events:
                assert next(events) == OutputEvent("stdout", "late\n")
                assert events.reconnections >= 20
    finally:
        stop(proc)


def test_the_async_wait_s_timeout_holds_while_output_flows(server: Server) -> None:
    async def main() -> None:
        async with AsyncAirlock(server.url, KEY) as c:
            h = await c.submit("import time\nfor i in range(1200):\n    print(i, flush=True)\n    time.sleep(0.05)")
            with pytest.raises(WaitTimeout):
                await h.wait(timeout=1.0)
            assert (await h.refresh()).state == "running"
            assert (await h.cancel()).state == "cancelled"

    asyncio.run(main())
