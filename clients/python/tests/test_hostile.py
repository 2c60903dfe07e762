"""The client against a hostile server (a small HTTP server on loopback in this process): deep
nesting, huge and compressed payloads, unknown forms, a pickle, wrong content types, broken
event streams. Each is refused with a ProtocolError (or the typed error it stands for),
within the client's bounds, and nothing in it is ever loaded as code."""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import math
import os
import pathlib
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import httpx
import pytest

from airlock_client import (
    Airlock,
    APIError,
    DecodeError,
    Execution,
    ProtocolError,
    RateLimited,
    ServiceUnavailable,
    BadRequest,
    EvaluationFailed,
    OutputEvent,
    SessionBusy,
    SessionEnded,
    TransportError,
    raise_for_status,
)

RESULT: dict[str, object] = {
    "id": "ex_1",
    "status": "ok",
    "exit_code": 0,
    "signal": None,
    "stdout": "",
    "stderr": "",
    "stdout_truncated": False,
    "stderr_truncated": False,
    "result": 1,
    "error": None,
    "outputs": [],
    "files": [],
    "usage": {"wall_ms": 1, "cpu_ms": 1, "memory_peak_bytes": 1, "tool_calls": 0},
    "limits": {"timeout_ms": 1, "memory_mb": 1, "cpu_ms": 1, "pids": 1, "disk_mb": 1, "output_bytes": 1},
    "limits_hit": [],
    "isolation": {
        "namespaces": ["user"], "uid": 1, "network": "none", "filesystem": "x", "seccomp": "x",
        "landlock": "x", "landlock_abi": None, "cgroup": "v1", "no_new_privs": True,
        "capabilities": [], "downgraded": [],
    },
}

# An answer: status, headers, and the body as bytes or as chunks made on demand.
Body = bytes | Callable[[], Iterator[bytes]]


@dataclass
class Hostile:
    url: str = ""
    answers: list[tuple[int, dict[str, str], Body]] = field(default_factory=list)
    seen: list[tuple[str, str]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def answer(self, status: int, body: Body, content_type: str = "application/json", **headers: str) -> None:
        self.answers.append((status, {"Content-Type": content_type, **headers}, body))

    def json(self, value: object, status: int = 200) -> None:
        self.answer(status, json.dumps(value).encode())

    def result(self, **changes: object) -> None:
        self.json({**RESULT, **changes})


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hostile: Hostile

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.hostile.seen.append((self.command, self.path))
        self.hostile.headers.append({k.lower(): v for k, v in self.headers.items()})
        if not self.hostile.answers:
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status, headers, body = self.hostile.answers.pop(0)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        try:
            if isinstance(body, bytes):
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in body():
                    self.wfile.write(chunk)
                    self.wfile.flush()
                self.close_connection = True
        except OSError:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = _any


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up on a hostile answer is what these tests want


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    state = Hostile()
    handler = type("Handler", (_Handler,), {"hostile": state})
    server = _Server(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def client(h: Hostile, **kw: Any) -> Airlock:
    return Airlock(h.url, "k", **kw)


def test_a_well_formed_answer_is_read(hostile: Hostile) -> None:
    hostile.result(result={"$airlock": "bytes", "base64": "aGk="})
    assert client(hostile).run("x").result == b"hi"
    assert hostile.seen == [("POST", "/v1/execute")]


def test_deep_nesting_is_refused(hostile: Hostile) -> None:
    hostile.answer(200, b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(ProtocolError, match="nested too deeply"):
        client(hostile).run("x")
    hostile.result(result=json.loads("[" * 500 + "]" * 500))
    with pytest.raises(DecodeError, match=r"\$\.result"):
        client(hostile).run("x")


def test_a_huge_answer_is_refused_by_its_length_before_it_is_read(hostile: Hostile) -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield b" " * 65536

    hostile.answer(200, endless, **{"Content-Length": str(10 << 30)})
    began = time.monotonic()
    with pytest.raises(ProtocolError, match="over the client's limit"):
        client(hostile, max_response_bytes=1 << 20).run("x")
    assert time.monotonic() - began < 5


def test_a_huge_answer_without_a_length_stops_at_the_limit(hostile: Hostile) -> None:
    sent = [0]

    def endless() -> Iterator[bytes]:
        while True:
            sent[0] += 65536
            yield b"[" + b" " * 65535

    hostile.answer(200, endless)
    with pytest.raises(ProtocolError, match="over the client's limit"):
        client(hostile, max_response_bytes=1 << 20).run("x")


@pytest.mark.parametrize("encoding", ["gzip", "gzip, gzip", "br", "deflate", "x-unknown"])
def test_a_compressed_answer_is_refused_before_it_is_inflated(hostile: Hostile, encoding: str) -> None:
    # 1 KiB of gzip that would be 64 MiB of spaces; with two layers, or Brotli, far more.
    bomb = gzip.compress(b" " * (64 << 20), compresslevel=9)
    hostile.answer(200, bomb, **{"Content-Encoding": encoding})
    with pytest.raises(ProtocolError, match="compressed"):
        client(hostile).run("x")
    assert hostile.headers[-1]["accept-encoding"] == "identity"
    hostile.answer(200, bomb, "text/event-stream", **{"Content-Encoding": encoding})
    with pytest.raises(ProtocolError, match="compressed"):
        client(hostile).stream("x")


@pytest.mark.parametrize("form", [
    {"$airlock": "pickle", "data": "gASVBQAAAAAAAACMAm9zlC4="},
    {"$airlock": "eval", "code": "__import__('os').system('id')"},
    {"$airlock": "bytes", "base64": "not base64!"},
    {"$airlock": "bytes"},
    {"$airlock": "ndarray", "dtype": "object", "shape": [1], "data": [{"$airlock": "nope"}]},
])
def test_unknown_or_broken_forms_are_refused(hostile: Hostile, form: object) -> None:
    hostile.result(result={"ok": [form]})
    with pytest.raises(DecodeError, match=r"^\$\.result\.ok\[0\]"):
        client(hostile).run("x")


class _Canary:
    """Unpickling this creates a file: the tests check it never appears."""

    path = ""

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str, str]]:
        return (pathlib.Path.write_text, (pathlib.Path(self.path), "pwned"))  # type: ignore[return-value]


def test_a_pickle_is_never_loaded(hostile: Hostile, tmp_path: pathlib.Path) -> None:
    canary = tmp_path / "canary"
    _Canary.path = str(canary)
    payload = pickle.dumps({"result": _Canary()})
    for content_type in ("application/python-pickle", "application/octet-stream", "application/json"):
        hostile.answer(200, payload, content_type)
        with pytest.raises(ProtocolError):
            client(hostile).run("x")
    hostile.result(result={"$airlock": "bytes", "base64": base64.b64encode(payload).decode()})
    assert client(hostile).run("x").result == payload
    assert not canary.exists()


@pytest.mark.parametrize(("body", "content_type", "match"), [
    (b"<html>hi</html>", "text/html", "expected application/json"),
    (json.dumps(RESULT).encode(), "", "expected application/json"),
    (b'{"status": "ok",', "application/json", "not valid JSON"),
    (b'{"a": NaN}', "application/json", "not valid JSON"),
    (b'{"a": ' + b"9" * 5000 + b"}", "application/json", "not valid JSON"),
    (b"\xff\xfe", "application/json", "not valid JSON"),
    (b"[1]", "application/json", "expected an object"),
    (json.dumps({**RESULT, "status": "fine"}).encode(), "application/json", "unknown status"),
    (json.dumps({**RESULT, "exit_code": "0"}).encode(), "application/json", r"\$\.exit_code: expected int"),
    (json.dumps({**RESULT, "stdout_truncated": 0}).encode(), "application/json", "expected bool"),
    (json.dumps({k: v for k, v in RESULT.items() if k != "usage"}).encode(), "application/json", r"\$\.usage: missing"),
    (json.dumps({**RESULT, "files": [{"path": "a", "size": 1, "base64": "*"}]}).encode(), "application/json", "not base64"),
])
def test_malformed_answers_are_refused(hostile: Hostile, body: bytes, content_type: str, match: str) -> None:
    hostile.answer(200, body, content_type)
    with pytest.raises(ProtocolError, match=match):
        client(hostile).run("x")


def test_redirects_are_not_followed(hostile: Hostile) -> None:
    hostile.answer(302, b"", Location=f"{hostile.url}/elsewhere")
    with pytest.raises(ProtocolError):
        client(hostile).run("x")
    assert hostile.seen == [("POST", "/v1/execute")]


def test_a_proxy_error_page_keeps_its_status(hostile: Hostile) -> None:
    hostile.answer(502, b"<html>" + b"bad gateway " * 100 + b"</html>", "text/html")
    with pytest.raises(APIError) as error:
        client(hostile).run("x")
    assert (error.value.status, error.value.code) == (502, "unknown")
    assert len(error.value.message) <= 201 and "bad gateway" in error.value.message


def test_retry_after_is_honoured_within_the_bound(hostile: Hostile) -> None:
    refusal = json.dumps({"error": {"code": "rate_limited", "message": "slow down"}}).encode()
    hostile.answer(429, refusal, **{"Retry-After": "1"})
    hostile.answer(503, refusal.replace(b"rate_limited", b"overloaded"), **{"Retry-After": "1"})
    hostile.result()
    began = time.monotonic()
    assert client(hostile, retries=2).run("x").ok
    assert time.monotonic() - began >= 2 and len(hostile.seen) == 3
    # No retries by default; and none past the bound or without Retry-After.
    hostile.answer(429, refusal, **{"Retry-After": "1"})
    with pytest.raises(RateLimited) as limited:
        client(hostile).run("x")
    assert limited.value.retry_after == 1 and limited.value.message == "slow down"
    hostile.answer(503, refusal.replace(b"rate_limited", b"overloaded"))
    with pytest.raises(ServiceUnavailable):
        client(hostile, retries=5).run("x")
    hostile.answer(429, refusal, **{"Retry-After": "120"})
    with pytest.raises(RateLimited):
        client(hostile, retries=5, max_retry_wait=10).run("x")
    assert len(hostile.seen) == 6


def test_a_silent_server_times_out(hostile: Hostile) -> None:
    def silent() -> Iterator[bytes]:
        time.sleep(3)
        yield b""

    hostile.answer(200, silent)
    with pytest.raises(TransportError):
        client(hostile, timeout=0.5).run("x")


def test_hostile_ids_cannot_reach_other_routes(hostile: Hostile) -> None:
    info = {"id": "../../execute?x=", "created_at": "t", "expires_at": "t", "idle_timeout_ms": 1,
            "max_lifetime_ms": 1, "cells": 0, "ended": None, "limits": RESULT["limits"]}
    hostile.json(info, 201)
    hostile.result()
    hostile.answer(200, b"file")
    c = client(hostile)
    s = c.session()
    s.run("x")
    assert s.download("a b/c.txt") == b"file"
    assert hostile.seen[1:] == [
        ("POST", "/v1/sessions/..%2F..%2Fexecute%3Fx%3D/execute"),
        ("GET", "/v1/sessions/..%2F..%2Fexecute%3Fx%3D/files/a%20b/c.txt"),
    ]


def sse(*events: tuple[str, object]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def test_a_well_formed_stream_is_read(hostile: Hostile) -> None:
    body = b": a comment\n\n" + sse(("stdout", {"text": "a"}), ("stderr", {"text": "b"}),
                                   ("result", {**RESULT, "output_streamed": True}))
    hostile.answer(200, body.replace(b"\n", b"\r\n"), "text/event-stream")
    events = list(client(hostile).stream("x"))
    last = events[-1]
    assert isinstance(last, Execution) and (last.stdout, last.stderr) == ("a", "b")


@pytest.mark.parametrize(("body", "match"), [
    (sse(("stdout", {"text": "a"})), "ended before its result"),
    (sse(("exploit", {"text": "a"})), "unknown event"),
    (sse(("stdout", {"text": 1})), "stdout event"),
    (sse(("stdout", {"text": "a", "more": 1})), "stdout event"),
    (sse(("truncated", {"stream": "stdin", "limit": 1})), "truncated event"),
    (b"event: stdout\ndata: {not json\n\n", "not JSON"),
    (b"event: stdout\ndata: " + b"[" * 100_000 + b"\n\n", "nested too deeply"),
    (b"evil: 1\n\n", "unknown event field"),
    (b"event: stdout\ndata: \xff\n\n", "not UTF-8"),
    (sse(("result", RESULT), ("stdout", {"text": "late"})), "after the stream's result"),
    (sse(("result", {**RESULT, "status": "great"})), "unknown status"),
])
def test_broken_streams_are_refused(hostile: Hostile, body: bytes, match: str) -> None:
    hostile.answer(200, body, "text/event-stream")
    with pytest.raises(ProtocolError, match=match):
        list(client(hostile).stream("x"))


def test_an_endless_stream_stops_at_the_limit(hostile: Hostile) -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield sse(("stdout", {"text": "x" * 60000}))

    hostile.answer(200, endless, "text/event-stream")
    with pytest.raises(ProtocolError, match="over the client's limit"):
        for _ in client(hostile, max_response_bytes=1 << 20).stream("x"):
            pass
    # One line that never ends is bounded the same way.
    hostile.answer(200, lambda: iter([b"data: " + b"x" * (2 << 20)]), "text/event-stream")
    with pytest.raises(ProtocolError, match="over the client's limit"):
        list(client(hostile, max_response_bytes=1 << 20).stream("x"))


def test_a_stream_s_error_event_is_the_typed_error(hostile: Hostile) -> None:
    hostile.answer(200, sse(("error", {"error": {"code": "unavailable", "message": "no sandbox"}})), "text/event-stream")
    with pytest.raises(ServiceUnavailable, match="no sandbox"):
        list(client(hostile).stream("x"))
    hostile.json(RESULT)
    with pytest.raises(ProtocolError, match="expected text/event-stream"):
        client(hostile).stream("x")


def test_nothing_was_written_by_any_payload() -> None:
    # The canary of test_a_pickle_is_never_loaded lives in its tmp_path; this checks the
    # working directory too, where a careless loader might write.
    assert not os.path.exists("canary")


def test_raise_for_status_maps_a_response_of_your_own(hostile: Hostile) -> None:
    hostile.json({"error": {"code": "session_busy", "message": "busy", "field": None}}, 409)
    response = httpx.post(f"{hostile.url}/v1/sessions/s/execute", json={"code": "1"})
    with pytest.raises(SessionBusy) as busy:
        raise_for_status(response)
    assert (busy.value.status, busy.value.message, busy.value.field) == (409, "busy", None)
    hostile.json({"ok": True})
    raise_for_status(httpx.get(f"{hostile.url}/v1/x"))


def test_a_stream_refused_with_retry_after_is_opened_again(hostile: Hostile) -> None:
    refusal = json.dumps({"error": {"code": "overloaded", "message": "full"}}).encode()
    hostile.answer(503, refusal, **{"Retry-After": "1"})
    hostile.answer(200, sse(("result", {**RESULT, "output_streamed": True})), "text/event-stream")
    assert client(hostile, retries=1).stream("x").finish().ok
    assert len(hostile.seen) == 2
    hostile.answer(503, refusal, **{"Retry-After": "1"})
    with pytest.raises(ServiceUnavailable):
        client(hostile).stream("x")


def test_a_key_that_is_not_a_header_is_refused_without_quoting_it(hostile: Hostile) -> None:
    for key in ("sk-SECRET\n", "sk-SECRET key", "sk-SECRÉT", ""):
        with pytest.raises(ValueError) as refused:
            Airlock(hostile.url, key)
        assert "SECR" not in str(refused.value)
    c = Airlock(hostile.url, "sk-SECRET")
    assert "SECRET" not in repr(c._settings)
    # A failed request's message never holds the key.
    with pytest.raises(TransportError) as failed:
        Airlock("http://127.0.0.1:9", "sk-SECRET", timeout=2).run("x")
    assert "SECRET" not in str(failed.value)


@pytest.mark.parametrize("value", ["\xb2", "9" * 5000, "-1", "1.5", "Wed, 21 Oct 2015 07:28:00 GMT", " 2 "])
def test_odd_retry_after_values_are_no_crash(hostile: Hostile, value: str) -> None:
    refusal = json.dumps({"error": {"code": "rate_limited", "message": "m"}}).encode()
    hostile.answer(429, refusal, **{"Retry-After": value})
    with pytest.raises(RateLimited) as limited:
        client(hostile, retries=1, max_retry_wait=0).run("x")
    assert limited.value.retry_after == (2.0 if value == " 2 " else None)


def test_ids_that_are_dots_are_refused(hostile: Hostile) -> None:
    c = client(hostile)
    for bad in (".", ".."):
        with pytest.raises(ValueError):
            c.execution(bad)
        with pytest.raises(ValueError):
            c.environment(bad)
    info = {"id": "..", "created_at": "t", "expires_at": "t", "idle_timeout_ms": 1,
            "max_lifetime_ms": 1, "cells": 0, "ended": None, "limits": RESULT["limits"]}
    hostile.json(info, 201)
    s = c.session()
    with pytest.raises(ValueError):
        s.run("x")
    with pytest.raises(ValueError):
        s.close()
    assert hostile.seen == [("POST", "/v1/sessions")]


def test_only_the_call_s_own_status_answers_it(hostile: Hostile) -> None:
    c = client(hostile)
    hostile.answer(302, json.dumps(RESULT).encode(), Location="/login")
    with pytest.raises(ProtocolError, match="unexpected HTTP 302"):
        c.run("x")
    info = {"id": "s1", "created_at": "t", "expires_at": "t", "idle_timeout_ms": 1,
            "max_lifetime_ms": 1, "cells": 0, "ended": None, "limits": RESULT["limits"]}
    hostile.json(info, 200)  # a create answers 201
    with pytest.raises(ProtocolError, match="unexpected HTTP 200"):
        c.session()
    hostile.json(info, 201)
    s = c.session()
    hostile.answer(302, b"<html>login</html>", "text/html", Location="/login")
    with pytest.raises(ProtocolError):
        s.download("a.txt")
    hostile.answer(200, b"")  # a close answers 204
    with pytest.raises(ProtocolError):
        s.close()
    assert not s.closed
    hostile.answer(204, b"", "")
    s.close()
    assert s.closed


def test_one_call_has_a_deadline_however_the_answer_trickles(hostile: Hostile) -> None:
    def trickle() -> Iterator[bytes]:
        body = json.dumps(RESULT).encode()
        for i in range(len(body)):
            time.sleep(0.2)
            yield body[i : i + 1]

    hostile.answer(200, trickle)
    began = time.monotonic()
    with pytest.raises(TransportError, match="deadline"):
        client(hostile, timeout=1, deadline=1).run("x")
    assert time.monotonic() - began < 5
    def comments() -> Iterator[bytes]:
        while True:
            time.sleep(0.2)
            yield b": keep-alive\n\n"

    hostile.answer(200, comments, "text/event-stream")
    with pytest.raises(TransportError, match="deadline"):
        client(hostile, timeout=1, deadline=1).stream("x").finish()


def test_a_stream_that_failed_or_was_closed_raises_airlock_errors(hostile: Hostile) -> None:
    hostile.answer(200, sse(("error", {"error": {"code": "session_ended", "message": "gone"}})), "text/event-stream")
    stream = client(hostile).stream("x")
    with pytest.raises(SessionEnded) as ended:
        list(stream)
    assert ended.value.status == 409
    with pytest.raises(ProtocolError, match="without its result"):
        stream.finish()
    hostile.answer(200, sse(("stdout", {"text": "a"})) + b"event: stdout\n", "text/event-stream")
    stream = client(hostile).stream("x")
    assert next(iter(stream)) == OutputEvent("stdout", "a")
    stream.close()
    with pytest.raises(TransportError, match="closed"):
        next(iter(stream))
    hostile.answer(200, sse(("error", {"error": {"code": "invalid_request", "message": "m", "field": "code"}})),
                   "text/event-stream")
    with pytest.raises(BadRequest) as bad:
        client(hostile).stream("x").finish()
    assert (bad.value.status, bad.value.field) == (400, "code")


def test_eval_values_are_decoded_strictly(hostile: Hostile) -> None:
    # The evaluator sends a value only when JSON holds it exactly, big ints and non-finite
    # floats in their forms; what a server sends is decoded as a result is, strictly.
    hostile.json({"ok": True, "type": "list", "repr": "...", "str": "...",
                  "value": [{"$airlock": "int", "value": "18446744073709551616"}, {"$airlock": "float", "value": "-inf"}]})
    assert client(hostile).eval("x").value == [2**64, -math.inf]
    for bad in ({"$airlock": "int", "value": "1e30"}, {"$airlock": "float", "value": "NaN"}, {"$airlock": "pickle"}):
        hostile.json({"ok": True, "type": "x", "repr": "...", "str": "...", "value": [bad]})
        with pytest.raises(DecodeError, match=r"^\$\.value\[0\]"):
            client(hostile).eval("x")
    hostile.json({"ok": False, "error": {"type": "ZeroDivisionError", "message": "division by zero"}})
    with pytest.raises(EvaluationFailed, match="ZeroDivisionError"):
        client(hostile).eval("1/0").raise_for_error()


def test_approvals_and_volume_listings_are_read_strictly(hostile: Hostile) -> None:
    approval = {
        "id": "ap_1", "execution_id": "ex_1", "key": "agent", "server": "crm", "tool": "t", "arguments": None,
        "arguments_preview": "{}", "arguments_shown": "whole", "arguments_escaped": False, "arguments_bytes": 2,
        "arguments_sha256": "0" * 64, "line": 1, "requested_at": "t", "expires_at": "t",
    }
    c = client(hostile)
    hostile.json({"approval": approval, "arguments": {"a": "\u202e"}})
    assert c.approval("ap_1").arguments == {"a": "\u202e"}
    wrong: list[tuple[dict[str, object], str]] = [
        ({"arguments_shown": "all"}, r"^\$\.approval\.arguments_shown: unknown value 'all'$"),
        ({"arguments_escaped": None}, r"^\$\.approval\.arguments_escaped: expected bool"),
        ({"arguments_preview": None}, r"^\$\.approval\.arguments_preview: expected str"),
    ]
    for changes, match in wrong:
        hostile.json({"approval": {**approval, **changes}, "arguments": {}})
        with pytest.raises(ProtocolError, match=match):
            c.approval("ap_1")
    hostile.json({"approval": approval, "arguments": [1]})
    with pytest.raises(ProtocolError, match=r"^\$\.arguments: expected dict"):
        c.approval("ap_1")
    with pytest.raises(ValueError):
        c.approval("..")
    assert hostile.seen == [("GET", "/v1/approvals/ap_1")] * 5
    for listing, match in [
        ({"files": []}, r"^\$\.truncated: missing$"),
        (
            {"files": [{"path": "a", "type": "file", "size": 1, "lossy": 1}], "truncated": False},
            r"^\$\.files\[0\]\.lossy: expected bool",
        ),
    ]:
        hostile.json(listing)
        with pytest.raises(ProtocolError, match=match):
            c.volume("v").files()


def test_infinite_numbers_and_control_characters_are_refused_or_cleaned(hostile: Hostile) -> None:
    hostile.answer(200, json.dumps({**RESULT, "usage": {"wall_ms": 1}}).replace('"wall_ms": 1', '"wall_ms": 1e999').encode())
    with pytest.raises(ProtocolError, match="too large"):
        client(hostile).run("x")
    hostile.json({"error": {"code": "invalid_request", "message": "bad\x1b[2J\x07", "field": "a\nb"}}, 400)
    with pytest.raises(BadRequest) as bad:
        client(hostile).run("x")
    assert bad.value.message == "bad [2J " and bad.value.field == "a b"


def test_proxies_from_the_environment_are_not_used(hostile: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    hostile.result()
    assert client(hostile).run("x").ok


def test_colliding_keys_are_refused_before_they_cost_quadratic_time(hostile: Hostile) -> None:
    collide = (1 << 61) - 1  # every multiple hashes to 0
    items = [i * collide for i in range(1, 2001)]
    hostile.result(result={"$airlock": "set", "type": "set", "items": items})
    with pytest.raises(DecodeError, match="share a hash"):
        client(hostile).run("x")
    hostile.result(result={"$airlock": "dict", "items": [[k, 1] for k in items]})
    with pytest.raises(DecodeError, match="share a hash"):
        client(hostile).run("x")
    few = items[:64]
    hostile.result(result={"$airlock": "set", "type": "set", "items": few})
    assert client(hostile).run("x").result == set(few)
