"""The client against a real `airlock serve` (conftest.py): every method, the decoded forms
compared with what the sandbox's Python made, streaming, sessions, files and error mapping."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import hashlib
import importlib
import json
import math
import pathlib
import subprocess
import threading
import time
import typing
from typing import Any

import httpx
import numpy
import pytest

from airlock_client import (
    Airlock,
    Approval,
    ApprovalDetail,
    ArgumentsShown,
    AsyncAirlock,
    AsyncVolume,
    BackgroundInfo,
    BackgroundNotFinished,
    BackgroundState,
    BadRequest,
    Conflict,
    DataFrame,
    Decided,
    Environment,
    EvalError,
    Evaluation,
    Execution,
    ExecutionError,
    ExecutionFailed,
    ExecutionRecord,
    FileEntry,
    Forbidden,
    Isolation,
    Limits,
    NotFound,
    Output,
    OutputEvent,
    OutputFile,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    Repr,
    Series,
    SessionBusy,
    SessionEnded,
    Session,
    SessionInfo,
    SessionLost,
    Snapshot,
    SnapshotFailed,
    SnapshotInvalid,
    Status,
    Tool,
    TransportError,
    TruncatedEvent,
    Unauthorized,
    Usage,
    Volume,
    VolumeBusy,
    VolumeFiles,
    VolumeFull,
    VolumeInfo,
    VolumeInUse,
    VolumesUnavailable,
)
from airlock_client._wire import Events
from airlock_client.errors import error_for
from conftest import APPROVER, EXECUTE_ONLY, KEY, SLOW, VOLUME_QUOTA, Server, launch, stop


@pytest.fixture
def client(server: Server) -> Any:
    with Airlock(server.url, KEY) as c:
        yield c


def test_run_returns_every_field_of_the_result(client: Airlock) -> None:
    code = 'print("hello")\nimport sys\nprint("warn", file=sys.stderr)\n6 * 7'
    e = client.run(code)
    assert e.ok and e.status == "ok" and e.exit_code == 0 and e.signal is None
    assert (e.stdout, e.stderr) == ("hello\n", "warn\n")
    assert e.result == 42 and e.result_json == 42 and e.error is None
    assert not e.stdout_truncated and not e.stderr_truncated and e.limits_hit == []
    assert e.id and e.usage.wall_ms >= 0 and e.limits.timeout_ms > 0
    assert e.isolation.network == "none" and e.isolation.no_new_privs and e.isolation.capabilities == []
    assert "user" in e.isolation.namespaces and e.outputs == [] and e.files == []
    record = client.execution(e.id)
    assert (record.id, record.status, record.key) == (e.id, "ok", "client")
    assert record.code_bytes == len(code)


def test_run_with_files_stdin_env_and_limits(client: Airlock) -> None:
    code = (
        "import os, sys\n"
        "data = open('data/in.bin', 'rb').read()\n"
        "os.makedirs('outputs', exist_ok=True)\n"
        "open('outputs/out.txt', 'w').write(open('notes.txt').read().upper())\n"
        "[len(data), data[:2].hex(), sys.stdin.read(), os.environ['GREETING']]"
    )
    e = client.run(
        code,
        files={"data/in.bin": b"\x00\xff" * 10, "notes.txt": "héllo"},
        stdin="from stdin",
        env={"GREETING": "hi"},
        limits={"timeout_ms": 20_000, "memory_mb": 256},
    )
    assert e.ok, e
    assert e.result == [20, "00ff", "from stdin", "hi"]
    assert e.limits.timeout_ms == 20_000 and e.limits.memory_mb == 256
    [out] = e.files
    assert (out.path, out.content, out.skipped) == ("out.txt", "HÉLLO".encode(), None)


def test_outputs_carry_charts_and_json(client: Airlock) -> None:
    e = client.run(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n"
        "display({'k': b'x'})\ndisplay('<b>x</b>', mime='text/html')"
    )
    assert e.ok, e
    kinds = [o.type for o in e.outputs]
    assert kinds == ["image/png", "application/json", "text/html"]
    assert e.outputs[0].bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert e.outputs[1].value() == {'k': b'x'}
    assert e.outputs[2].bytes() == b"<b>x</b>"


# Each case: code that makes the value in the sandbox, and the value made here.
FORMS: list[tuple[str, object]] = [
    ("b'\\x00hi'", b"\x00hi"),
    ("bytearray(b'ab')", b"ab"),
    ("{3, 1, 2}", {1, 2, 3}),
    ("frozenset({'a'})", frozenset({"a"})),
    ("{1: 'a', (2, 3): None}", {1: "a", (2, 3): None}),
    ("{'$airlock': 'pickle'}", {"$airlock": "pickle"}),
    ("import datetime\ndatetime.date(2024, 1, 2)", datetime.date(2024, 1, 2)),
    ("import datetime\ndatetime.datetime(2024, 1, 2, 3, 4, 5, 6, datetime.timezone.utc)",
     datetime.datetime(2024, 1, 2, 3, 4, 5, 6, datetime.timezone.utc)),
    ("import datetime\ndatetime.time(3, 4, 5)", datetime.time(3, 4, 5)),
    ("import datetime\ndatetime.timedelta(hours=1, microseconds=5000)",
     datetime.timedelta(hours=1, microseconds=5000)),
    ("import decimal\ndecimal.Decimal('1.10')", decimal.Decimal("1.10")),
    ("complex(1, -2)", complex(1, -2)),
    ("(1, [2.5, None, True], 'x')", [1, [2.5, None, True], "x"]),
    ("import numpy\nnumpy.float32(0.25)", 0.25),
]


@pytest.mark.parametrize(("code", "expected"), FORMS, ids=[c.split("\n")[-1][:30] for c, _ in FORMS])
def test_each_form_decodes_to_what_the_sandbox_made(client: Airlock, code: str, expected: object) -> None:
    e = client.run(code)
    assert e.ok, e
    assert e.result == expected and type(e.result) is type(expected), (e.result_json, e.result)


def test_arrays_tables_and_reprs(client: Airlock) -> None:
    e = client.run(
        "import numpy, pandas, math\n"
        "class Thing:\n    def __repr__(self): return 'Thing()'\n"
        "{'a': numpy.arange(6, dtype='int64').reshape(2, 3),\n"
        " 'f': numpy.array([0.5, 1.5], dtype='float32'),\n"
        " 'df': pandas.DataFrame({'x': [1, 2], 'y': ['a', 'b']}),\n"
        " 's': pandas.Series([1.5, 2.5], name='s'),\n"
        " 'big': 2 ** 80, 'nan': math.nan, 'thing': Thing()}"
    )
    assert e.ok, e
    r = e.result
    assert isinstance(r, dict)
    a = r["a"]
    assert isinstance(a, numpy.ndarray) and a.dtype == numpy.int64
    assert numpy.array_equal(a, numpy.arange(6).reshape(2, 3))
    assert isinstance(r["f"], numpy.ndarray) and r["f"].dtype == numpy.float32 and list(r["f"]) == [0.5, 1.5]
    assert r["df"] == DataFrame(columns=["x", "y"], index=[0, 1], records=[{"x": 1, "y": "a"}, {"x": 2, "y": "b"}],
                            dtypes=["int64", "object"])
    assert r["s"] == Series(name="s", index=[0, 1], data=[1.5, 2.5])
    big, nan, thing = r["big"], r["nan"], r["thing"]
    assert type(big) is int and big == 2**80
    assert type(nan) is float and math.isnan(nan)
    assert isinstance(thing, Repr) and thing.repr == "Thing()" and thing.type.endswith("Thing")


def exactly(got: object, want: object) -> bool:
    """Equal and of the same types all the way down, NaN equal to NaN."""
    if isinstance(want, float) and math.isnan(want):
        return type(got) is float and math.isnan(got)
    if type(got) is not type(want):
        return False
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple))
        return len(got) == len(want) and all(map(exactly, got, want))
    if isinstance(want, dict):
        assert isinstance(got, dict)
        return list(got) == list(want) and all(exactly(got[k], want[k]) for k in want)
    if isinstance(want, complex):
        assert isinstance(got, complex)
        return exactly(got.real, want.real) and exactly(got.imag, want.imag)
    return got == want


NAN, INF = float("nan"), float("inf")
# Values made in the sandbox, and the same values made here: big ints and non-finite floats
# alone and inside each container form.
EXACT: list[tuple[str, object]] = [
    ("2**70", 2**70),
    ("-(2**64)", -(2**64)),
    ("10**4300 - 1", 10**4300 - 1),
    ("[math.factorial(25), float('nan'), float('inf'), -float('inf')]",
     [math.factorial(25), NAN, INF, -INF]),
    ("(2**70, float('nan'))", [2**70, NAN]),
    ("{'n': {'big': -(2**70), 'x': [float('inf')]}}", {"n": {"big": -(2**70), "x": [INF]}}),
    ("{2**70: float('nan'), (1, 2**64): 'k'}", {2**70: NAN, (1, 2**64): "k"}),
    ("{2**70, -(2**70)}", {2**70, -(2**70)}),
    ("frozenset([2**64])", frozenset([2**64])),
    ("complex(float('nan'), -float('inf'))", complex(NAN, -INF)),
]


def test_big_ints_and_non_finite_floats_come_back_as_themselves(client: Airlock) -> None:
    for code, want in EXACT:
        e = client.run("import math\n" + code)
        assert e.ok, e
        assert exactly(e.result, want), (code, e.result_json)
    # A Decimal NaN stays a Decimal.
    nan = client.run("import decimal\ndecimal.Decimal('NaN')").result
    assert isinstance(nan, decimal.Decimal) and nan.is_nan()
    # numpy arrays keep their NaN cells and dtype; an object array keeps its big ints.
    arrays = client.run(
        "import numpy as np\n"
        "[np.array([0.5, np.nan, -np.inf], dtype='float32'), np.array([2**70, 1], dtype=object)]"
    ).result
    assert isinstance(arrays, list)
    floats, objects = arrays
    assert isinstance(floats, numpy.ndarray) and floats.dtype == numpy.float32
    assert numpy.array_equal(floats, numpy.array([0.5, NAN, -INF], dtype="float32"), equal_nan=True)
    assert isinstance(objects, numpy.ndarray) and objects.tolist() == [2**70, 1]
    # A table with a missing value round-trips to an equal pandas table; so does a series.
    pandas = importlib.import_module("pandas")  # Debian's (scripts/test.sh): never skipped
    made = "import pandas as pd, numpy as np\n"
    frame = client.run(made + "pd.DataFrame({'a': [1.0, np.nan], 'b': [2**70, 3], 'c': ['x', None]})").result
    assert isinstance(frame, DataFrame)
    want = pandas.DataFrame({"a": [1.0, NAN], "b": [2**70, 3], "c": ["x", None]})
    assert frame.to_pandas().equals(want), frame
    series = client.run(made + "pd.Series([np.nan, 2.5, np.inf], name='s')").result
    assert isinstance(series, Series)
    assert series.to_pandas().equals(pandas.Series([NAN, 2.5, INF], name="s")), series
    # Function mode and a session cell decode the same way.
    assert exactly(client.call("def f():\n    return 2**70", "f"), 2**70)
    with client.session() as s:
        s.run("import math\nx = [math.factorial(25), float('nan')]")
        assert exactly(s.run("x").result, [math.factorial(25), NAN])
    # Past 4300 digits, a marked repr; a dict spelling a form is data.
    past = client.run("10**4300").result
    assert isinstance(past, Repr) and past.type == "int" and past.why == "an integer of more than 4300 digits"
    forged = client.run("{'$airlock': 'int', 'value': '18446744073709551616'}").result
    assert forged == {"$airlock": "int", "value": "18446744073709551616"}


def test_call_returns_the_value_and_raises_on_failure(client: Airlock) -> None:
    code = "def add(a, b):\n    return {'sum': a + b, 'pair': (a, b)}\ndef boom():\n    raise KeyError('k')"
    assert client.call(code, "add", a=2, b=40) == {"sum": 42, "pair": [2, 40]}
    with pytest.raises(ExecutionFailed) as failed:
        client.call(code, "boom")
    e = failed.value.execution
    assert e.status == "error" and e.error is not None and e.error.type == "KeyError"
    assert "KeyError" in str(failed.value)
    # Positional-only: an input may be called `code` or `entrypoint`.
    assert client.call("def f(code, entrypoint):\n    return code + entrypoint", "f", code="a", entrypoint="b") == "ab"


def test_statuses_are_results_not_exceptions(client: Airlock) -> None:
    e = client.run("import time\ntime.sleep(5)", limits={"timeout_ms": 500})
    assert e.status == "timeout" and not e.ok and e.limits_hit == ["wall_time"]
    with pytest.raises(ExecutionFailed):
        e.raise_for_status()
    e = client.run("x = bytearray(400 << 20)", limits={"memory_mb": 128})
    assert e.status == "memory_limit" and e.limits_hit == ["memory"]


def test_eval(client: Airlock) -> None:
    v = client.eval("[1, 2] * 2 + [{'a': (3,)}]")
    assert v.ok and v.value == [1, 2, 1, 2, {"a": [3]}] and v.type == "list"
    assert v.repr == "[1, 2, 1, 2, {'a': (3,)}]"
    bad = client.eval("1 / 0")
    assert not bad.ok and bad.error is not None and bad.error.type == "ZeroDivisionError"
    with pytest.raises(ValueError, match="ZeroDivisionError"):
        bad.raise_for_error()
    assert client.eval("__import__('os')").error is not None
    # Big ints and non-finite floats are exact; an expression that spells a form has no value
    # (its repr says it), so it can never pass for one.
    big = client.eval("[2**70, -1e500, 1e500 - 1e500]").value
    assert isinstance(big, list) and big[:2] == [2**70, -math.inf] and math.isnan(big[2])
    forged = client.eval("{'$airlock': 'int', 'value': '18446744073709551616'}")
    assert forged.ok and forged.value is None and forged.repr == "{'$airlock': 'int', 'value': '18446744073709551616'}"


def test_stream_yields_output_then_the_execution(client: Airlock) -> None:
    code = "import sys, time\nfor i in range(3):\n    print(i)\n    time.sleep(0.2)\nprint('e', file=sys.stderr)\n'done'"
    arrived: list[tuple[float, object]] = []
    with client.stream(code) as events:
        for event in events:
            arrived.append((time.monotonic(), event))
    texts = [ev.text for _, ev in arrived if isinstance(ev, OutputEvent) and ev.stream == "stdout"]
    assert "".join(texts) == "0\n1\n2\n"
    last = arrived[-1][1]
    assert isinstance(last, Execution) and last.ok and last.result == "done"
    assert last.output_streamed and last.stdout == "0\n1\n2\n" and last.stderr == "e\n"
    # Output arrives as it is written, not all at the end.
    first = next(t for t, ev in arrived if isinstance(ev, OutputEvent))
    assert arrived[-1][0] - first >= 0.3


def test_stream_reports_truncation(client: Airlock) -> None:
    stream = client.stream("print('x' * 5000)", limits={"output_bytes": 1000})
    events = list(stream)
    assert TruncatedEvent("stdout", 1000) in events
    e = stream.finish()
    assert e.stdout_truncated and len(e.stdout) == 1000 and e.stdout == "x" * 1000


def test_closing_a_stream_early_kills_its_sandbox(client: Airlock) -> None:
    with client.stream("import time\nprint('started', flush=True)\ntime.sleep(60)") as events:
        first = next(iter(events))
        assert first == OutputEvent("stdout", "started\n")
    # The server has killed the sandbox; the next execution runs at once.
    assert client.run("1").result == 1


def test_sessions_keep_state_files_and_end(client: Airlock) -> None:
    with client.session(env={"X": "1"}, files={"seed.txt": "s"}) as s:
        assert s.info.cells == 0 and s.info.ended is None
        assert s.run("import os\nx = int(os.environ['X']) + 1").ok
        assert s.run("x * 10").result == 20
        assert s.call("def f(y):\n    return x + y", "f", y=5) == 7
        s.upload("data/in.txt", "hello")
        s.upload("raw.bin", b"\x00\x01")
        assert s.run("open('data/in.txt').read().upper()").result == "HELLO"
        s.run("open('made.txt', 'w').write('made')")
        assert s.download("made.txt") == b"made" and s.download("raw.bin") == b"\x00\x01"
        entries = {f.path: f for f in s.files()}
        assert {"seed.txt", "data", "data/in.txt", "raw.bin", "made.txt"} <= set(entries)
        assert entries["raw.bin"].type == "file" and entries["raw.bin"].size == 2
        with pytest.raises(NotFound):
            s.download("missing.txt")
        s.run("import os\nos.symlink('/etc/passwd', 'link')")
        with pytest.raises(BadRequest):
            s.download("link")
        with pytest.raises(ValueError):
            s.download("../etc/passwd")
        stream = s.stream("print(x)")
        assert stream.finish().stdout == "2\n"
        assert s.id in [i.id for i in client.sessions()]
        assert s.refresh().cells >= 6
        ended = s.run("import sys\nsys.exit(3)")
        assert ended.session_ended and ended.status == "error"
        with pytest.raises(SessionEnded):
            s.run("1")
        assert s.refresh().ended == "error"
    assert s.closed
    with pytest.raises(NotFound):
        s.refresh()
    s.close()  # twice is fine


def test_a_busy_session_answers_409(client: Airlock) -> None:
    with client.session() as s:
        slow = s.stream("import time\nprint('go', flush=True)\ntime.sleep(1.5)\n'slept'")
        assert next(iter(slow)) == OutputEvent("stdout", "go\n")
        with pytest.raises(SessionBusy) as busy:
            s.run("1")
        assert busy.value.status == 409 and busy.value.code == "session_busy"
        assert slow.finish().result == "slept"


# A session's state as the snapshot tests use it: data, a function and a class defined in
# cells, an alias, and what cannot be kept (a lock, a generator).
SNAPSHOT_STATE = """import threading, json as js
x = 42
rows = [1, 2, 3]
alias = rows
def f(n):
    return n + x
class Point:
    def __init__(self, a, b):
        self.a, self.b = a, b
    def norm(self):
        return f(self.a * self.a + self.b * self.b)
p = Point(3, 4)
lock = threading.Lock()
gen = (i for i in range(3))
open('/work/notes.txt', 'w').write('in work')
'ready'"""
SNAPSHOT_CHECK = """[x, rows, alias is rows, f(1), p.norm(), js.dumps([1]), open('/work/notes.txt').read(),
 'lock' in globals(), 'gen' in globals()]"""


def snapshot_of(server: Server, session_id: str) -> pathlib.Path:
    """The snapshot file a paused session's record names."""
    sessions = server.state / "sessions"
    record = json.loads((sessions / f"{session_id}.json").read_text())
    return sessions / str(record["snapshot_file"])


def nothing_kept_of(server: Server, session_id: str) -> bool:
    """Whether no record or snapshot of the session is left."""
    return not [p for p in (server.state / "sessions").glob(f"{session_id}.*") if not p.name.endswith(".deleted")]


def test_a_paused_session_comes_back_with_its_values(server: Server, client: Airlock) -> None:
    with client.session() as s:
        assert s.run(SNAPSHOT_STATE).result == "ready"
        before = s.run(SNAPSHOT_CHECK).result
        assert before == [42, [1, 2, 3], True, 43, 67, "[1]", "in work", True, True]
        info = s.pause()
        assert info is s.info and info.id == s.id and info.resumed is None
        snapshot = info.paused
        assert isinstance(snapshot, Snapshot) and snapshot.cells == 2
        assert {"x", "rows", "alias", "f", "Point", "p", "js", "threading"} <= set(snapshot.variables)
        # What cannot come back is named, per variable, with why.
        assert set(snapshot.not_kept) == {"lock", "gen"}, snapshot.not_kept
        assert "lock" in snapshot.not_kept["lock"] and "generator" in snapshot.not_kept["gen"]
        assert snapshot.stored_bytes > 0 and snapshot.state_bytes > 0 and snapshot.taken_at
        assert snapshot_of(server, s.id).is_file()
        # Shown and listed paused; the listing without the names.
        assert s.refresh().paused == snapshot
        listed = {i.id: i for i in client.sessions()}
        assert s.id in listed
        shown = listed[s.id].paused
        assert shown is not None and shown.cells == 2 and shown.variables == [] and shown.not_kept == {}
        # The next cell brings it back: every value equal but what could not be kept.
        back = s.run(SNAPSHOT_CHECK)
        assert back.ok and back.result == before[:-2] + [False, False], back
        assert back.resumed is not None and back.resumed.not_kept == snapshot.not_kept
        assert back.resumed.cells == 2 and back.resumed.variables == snapshot.variables
        assert s.refresh().paused is None and s.info.cells == 3
        # A cell of an open session brought nothing back; nor does `resume` of an open one.
        assert s.run("x").resumed is None and s.resume().resumed is None
        # `resume` brings a paused one back without a cell.
        s.pause()
        resumed = s.resume()
        assert resumed.paused is None and resumed.resumed is not None and resumed.resumed.cells == 4
        assert s.run("[x, f(1)]").result == [42, 43]


def test_a_fork_goes_its_own_way(client: Airlock) -> None:
    with client.session() as s:
        s.run(SNAPSHOT_STATE)
        with s.fork() as fork:
            assert isinstance(fork, Session) and fork.id != s.id and not fork.closed
            assert fork.info.resumed is not None and "rows" in fork.info.resumed.variables
            assert fork.info.paused is None
            assert fork.run("[x, rows, f(1)]").result == [42, [1, 2, 3], 43]
            fork.run("x = 1000\nrows.append(4)\nopen('/work/notes.txt', 'w').write('fork')")
            assert s.run("[f(1), rows, open('/work/notes.txt').read()]").result == [43, [1, 2, 3], "in work"]
            assert fork.run("[f(1), alias, open('/work/notes.txt').read()]").result == [1001, [1, 2, 3, 4], "fork"]
        assert fork.closed
        with pytest.raises(NotFound):
            fork.refresh()
        assert s.run("x").result == 42
        # A paused session forks too, and stays paused.
        s.pause()
        with s.fork() as second:
            assert second.run("rows").result == [1, 2, 3]
            assert s.refresh().paused is not None
        assert s.run("rows").result == [1, 2, 3]


def test_a_paused_session_is_found_by_id_and_deleted(server: Server, client: Airlock) -> None:
    s = client.session()
    s.run("kept = 'yes'")
    s.pause()
    same = client.session_by_id(s.id)
    assert isinstance(same, Session) and same.id == s.id
    assert same.info.paused is not None and same.info.paused.variables == ["kept"]
    snap = snapshot_of(server, s.id)
    assert snap.is_file()
    same.close()
    assert same.closed and not snap.exists() and nothing_kept_of(server, s.id)
    with pytest.raises(NotFound):
        client.session_by_id(s.id)
    with pytest.raises(NotFound):
        s.run("kept")
    assert s.id not in [i.id for i in client.sessions()]
    s.close()  # already deleted: not an error
    with pytest.raises(NotFound):
        client.session_by_id("se_nosuchsession")
    with pytest.raises(ValueError):
        client.session_by_id("..")


def test_snapshot_refusals(server: Server, client: Airlock) -> None:
    # An altered snapshot is refused, and nothing of it runs; put back, it comes back.
    with client.session() as s:
        s.run("marker = 'a'")
        s.pause()
        snap = snapshot_of(server, s.id)
        data = bytearray(snap.read_bytes())
        data[len(data) // 2] ^= 0x40
        snap.write_bytes(bytes(data))
        with pytest.raises(SnapshotInvalid) as invalid:
            s.run("marker")
        assert (invalid.value.status, invalid.value.code) == (422, "snapshot_invalid")
        with pytest.raises(SnapshotInvalid):
            s.resume()
        data[len(data) // 2] ^= 0x40
        snap.write_bytes(bytes(data))
        assert s.run("marker").result == "a"
    # A busy session is not paused; an ended one neither.
    with client.session() as s:
        slow = s.stream("import time\nprint('go', flush=True)\ntime.sleep(1.5)\n'slept'")
        assert next(iter(slow)) == OutputEvent("stdout", "go\n")
        with pytest.raises(SessionBusy):
            s.pause()
        assert slow.finish().result == "slept"
        assert s.run("import sys\nsys.exit(0)").session_ended
        with pytest.raises(SessionEnded):
            s.pause()
    # A state past the key's storage (its volumes' and paused sessions' bytes): refused at
    # pause, and the session runs on as it was.
    used = sum(v.size_bytes for v in client.volumes())
    used += sum(i.paused.stored_bytes for i in client.sessions() if i.paused is not None)
    filler = client.create_volume("client-snapshot-filler", VOLUME_QUOTA - used - 4 * MIB)
    try:
        with client.session() as s:
            s.run("import os\nblob = os.urandom(16_000_000)\nkept = 'yes'")
            with pytest.raises(QuotaExceeded) as over:
                s.pause()
            assert (over.value.status, over.value.code) == (413, "quota_exceeded")
            assert s.refresh().paused is None
            assert s.run("[kept, len(blob)]").result == ["yes", 16_000_000]
            assert nothing_kept_of(server, s.id)
            # Small enough, it is kept.
            s.run("del blob")
            assert s.pause().paused is not None
    finally:
        filler.delete()


def test_snapshot_error_codes_have_their_exceptions() -> None:
    json_type = {"content-type": "application/json"}
    for status, code, kind in [
        (422, "snapshot_invalid", SnapshotInvalid),
        (422, "snapshot_failed", SnapshotFailed),
        (413, "quota_exceeded", QuotaExceeded),
        (409, "session_busy", SessionBusy),
    ]:
        body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
        error = error_for(status, json_type, body)
        assert type(error) is kind and (error.status, error.code) == (status, code)
    # A stream's `error` event carries only the code: its status comes from it.
    events = Events(1 << 20)
    with pytest.raises(SnapshotInvalid) as invalid:
        events.feed(b'event: error\ndata: {"error": {"code": "snapshot_invalid", "message": "m"}}\n\n')
    assert invalid.value.status == 422


def test_a_paused_session_survives_a_restart(tmp_path: pathlib.Path) -> None:
    proc, url = launch(tmp_path)
    try:
        with Airlock(url, KEY) as c:
            s = c.session()
            s.run(SNAPSHOT_STATE)
            s.pause()
    finally:
        stop(proc)
    proc, url = launch(tmp_path)
    try:
        with Airlock(url, KEY) as c:
            with c.session_by_id(s.id) as same:
                assert same.info.paused is not None and same.info.paused.cells == 1
                back = same.run("[x, rows, f(1), p.norm()]")
                assert back.result == [42, [1, 2, 3], 43, 67], back
                assert back.resumed is not None and set(back.resumed.not_kept) == {"lock", "gen"}
            with pytest.raises(NotFound):
                c.session_by_id(s.id)
    finally:
        stop(proc)


def test_the_async_client_s_paused_sessions(server: Server) -> None:
    async def main() -> None:
        async with AsyncAirlock(server.url, KEY) as c:
            async with await c.session() as s:
                await s.run("rows = [1, 2, 3]")
                info = await s.pause()
                assert info is s.info and info.paused is not None and info.paused.variables == ["rows"]
                assert s.id in [i.id for i in await c.sessions() if i.paused is not None]
                same = await c.session_by_id(s.id)
                assert same.id == s.id and same.info.paused == info.paused
                back = await s.run("sum(rows)")
                assert back.result == 6 and back.resumed is not None and back.resumed.cells == 1
                async with await s.fork() as fork:
                    assert fork.id != s.id and fork.info.resumed is not None
                    await fork.run("rows.append(4)")
                    assert (await fork.run("rows")).result == [1, 2, 3, 4]
                    assert (await s.run("rows")).result == [1, 2, 3]
                assert fork.closed
                await s.pause()
                resumed = await s.resume()
                assert resumed.paused is None and resumed.resumed is not None
                await s.pause()
            # Closing a paused session deletes it.
            assert s.closed
            with pytest.raises(NotFound):
                await c.session_by_id(s.id)

    asyncio.run(main())


def test_tools_are_listed_and_callable(client: Airlock) -> None:
    listing = client.tools()
    names = {t.name for t in listing.tools}
    assert {"crm.add", "crm.find_customer"} <= names and "crm.write_note" not in names
    add = next(t for t in listing.tools if t.name == "crm.add")
    assert add.read_only and "a" in str(add.input_schema) and "def add" in listing.python
    e = client.run("import tools\ntools.crm.add(a=40, b=2)")
    assert e.ok and e.result == 42 and e.usage.tool_calls == 1


def test_approvals_are_listed_decided_once_and_announced_by_a_stream(server: Server) -> None:
    code = (
        "import tools\ntry:\n    out = ['ok', tools.crm.write_note(text=%r)]\n"
        "except tools.ToolError as e:\n    out = [e.kind, str(e)]\nout"
    )
    with Airlock(server.url, EXECUTE_ONLY) as agent, Airlock(server.url, APPROVER) as boss:
        with pytest.raises(Forbidden):
            agent.approvals()
        # A stream's on_approval is called as the call starts waiting; another key decides.
        seen: list[Approval] = []

        def on_approval(a: Approval) -> None:
            seen.append(a)
            decided = boss.approve(a.id, "fine")
            assert decided.decision == "approve" and decided.decided_by == "approver"

        with agent.stream(code % "streamed", on_approval=on_approval) as stream:
            events = list(stream)
        assert [a.arguments for a in seen] == [{"text": "streamed"}]
        # Small and printable ASCII: the preview is all of them, and they are given.
        assert seen[0].arguments_preview == '{"text":"streamed"}'
        assert seen[0].arguments_shown == "whole" and not seen[0].arguments_escaped
        assert seen[0].key == "execute-only" and seen[0].tool == "write_note" and seen[0].line == 3
        assert any(isinstance(e, Approval) for e in events)
        assert stream.execution is not None and stream.execution.result == ["ok", "written"]
        with pytest.raises(NotFound):
            boss.approve(seen[0].id)
        # Denied, from another thread while run() waits.
        done: list[Execution] = []
        runner = threading.Thread(target=lambda: done.append(agent.run(code % "denied")))
        runner.start()
        deadline = time.monotonic() + 20
        while not (waiting := boss.approvals()):
            assert time.monotonic() < deadline, "no call waited"
            time.sleep(0.05)
        assert waiting[0].arguments == {"text": "denied"}
        boss.deny(waiting[0].id, "not today")
        runner.join()
        result = done[0].result
        assert isinstance(result, list) and result[0] == "denied" and "not today" in result[1]
        assert boss.approvals() == []

    async def main() -> None:
        async with AsyncAirlock(server.url, APPROVER) as c:
            assert await c.approvals() == []
            with pytest.raises(NotFound):
                await c.deny("ap_0123", "gone")

    asyncio.run(main())


def test_one_approval_gives_the_arguments_whole_that_its_preview_cuts_and_escapes(server: Server) -> None:
    text = "\u202e" + "x" * 20000
    code = (
        f"import tools\ntry:\n    out = tools.crm.write_note(text={text!r})\n"
        "except tools.ToolError as e:\n    out = e.kind\nout"
    )
    with Airlock(server.url, EXECUTE_ONLY) as agent, Airlock(server.url, APPROVER) as boss:
        done: list[Execution] = []
        runner = threading.Thread(target=lambda: done.append(agent.run(code)))
        runner.start()
        try:
            deadline = time.monotonic() + 20
            while not (waiting := boss.approvals()):
                assert time.monotonic() < deadline, "no call waited"
                time.sleep(0.05)
            listed = waiting[0]
            # Too long to show whole, and a right-to-left override in it: the listing gives a
            # cut preview in printable ASCII, and not the arguments.
            assert listed.arguments is None
            assert listed.arguments_shown == "cut" and listed.arguments_escaped
            preview = listed.arguments_preview
            assert preview.startswith('{"text":"\\u{202e}xxx') and "more bytes)" in preview, preview[:80]
            assert preview.isascii() and preview.isprintable() and len(preview) <= 16384
            # One approval: as listed, with the arguments whole, the very bytes it names.
            one = boss.approval(listed.id)
            assert isinstance(one, ApprovalDetail) and one.approval == listed
            assert one.arguments == {"text": text}
            sent = json.dumps(one.arguments, separators=(",", ":"), ensure_ascii=False).encode()
            assert (len(sent), hashlib.sha256(sent).hexdigest()) == (listed.arguments_bytes, listed.arguments_sha256)

            async def main() -> ApprovalDetail:
                async with AsyncAirlock(server.url, APPROVER) as c:
                    with pytest.raises(NotFound):
                        await c.approval("ap_0123")
                    return await c.approval(listed.id)

            assert asyncio.run(main()) == one
            with pytest.raises(Forbidden):
                agent.approval(listed.id)  # not a key that approves
            boss.deny(listed.id, "no")
            with pytest.raises(NotFound):
                boss.approval(listed.id)  # decided
        finally:
            runner.join()
        assert done[0].result == "denied"


def test_error_mapping(server: Server, client: Airlock) -> None:
    with Airlock(server.url, "wrong-key") as stranger:
        with pytest.raises(Unauthorized) as unauthorized:
            stranger.run("1")
    assert unauthorized.value.status == 401 and unauthorized.value.request_id
    e = client.run("1")
    assert e.id is not None
    with Airlock(server.url, EXECUTE_ONLY) as limited:
        with pytest.raises(Forbidden):
            limited.execution(e.id)
    with pytest.raises(NotFound):
        client.execution("ex_does_not_exist")
    with pytest.raises(BadRequest) as bad:
        client.run("1", limits={"timeout_ms": 10**9})
    assert bad.value.code == "limit_above_ceiling" and bad.value.field == "limits.timeout_ms"
    with pytest.raises(BadRequest) as unknown:
        client.run("1", environment="no-such-environment")
    assert unknown.value.field == "environment"
    with pytest.raises(PayloadTooLarge):
        client.run("x = 1\n" * (3 << 20))
    with pytest.raises(ValueError):
        client.run("1", inputs={"a": 1})


def test_rate_limits_raise_with_retry_after_and_are_not_retried_past_the_bound(server: Server) -> None:
    with Airlock(server.url, SLOW, retries=3, max_retry_wait=2.0) as slow:
        assert slow.run("1").ok
        began = time.monotonic()
        with pytest.raises(RateLimited) as limited:
            slow.run("1")
    # The server asks for about a minute; the client does not wait that long, it raises.
    assert limited.value.retry_after is not None and limited.value.retry_after > 2
    assert limited.value.code == "rate_limited"
    assert time.monotonic() - began < 2


def test_a_server_that_is_gone_is_a_transport_error() -> None:
    with Airlock("http://127.0.0.1:9", KEY, timeout=2) as gone:
        with pytest.raises(TransportError):
            gone.run("1")


def test_key_and_url_from_the_environment(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRLOCK_URL", server.url)
    monkeypatch.setenv("AIRLOCK_API_KEY", KEY)
    with Airlock() as c:
        assert c.url == server.url and c.run("1").result == 1
    monkeypatch.delenv("AIRLOCK_API_KEY")
    with pytest.raises(ValueError, match="AIRLOCK_API_KEY"):
        Airlock()


def test_ready_and_pickle_scan(client: Airlock) -> None:
    assert client.ready()["ready"] is True
    report = client.scan_pickle(b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01\x85\x94.")
    assert report["verdict"] == "safe"
    evil = b"cos\nsystem\n(S'echo pwned'\ntR."
    assert client.scan_pickle(evil)["verdict"] == "unsafe"


def test_the_async_client_does_the_same(server: Server) -> None:
    async def main() -> None:
        async with AsyncAirlock(server.url, KEY) as c:
            e, value = await asyncio.gather(c.run("print('a')\n1 + 1"), c.call("def f(n):\n    return n * 2", "f", n=21))
            assert e.ok and e.stdout == "a\n" and e.result == 2 and value == 42
            assert (await c.eval("2 ** 10")).value == 1024
            assert (await c.execution(e.id or "")).status == "ok"
            texts = []
            async with await c.stream("for i in range(2):\n    print(i, flush=True)\n'x'") as events:
                async for ev in events:
                    texts.append(ev)
            assert isinstance(texts[-1], Execution) and texts[-1].stdout == "0\n1\n"
            async with await c.session() as s:
                await s.run("y = 5")
                await s.upload("a.txt", "A")
                assert await s.call("def g():\n    return y + len(open('a.txt').read())", "g") == 6
                assert await s.download("a.txt") == b"A"
                assert [f.path for f in await s.files()] == ["a.txt"]
                assert (await s.refresh()).cells == 2
                assert (await (await s.stream("print(y)")).finish()).stdout == "5\n"
            assert s.closed
            assert "crm.add" in {t.name for t in (await c.tools()).tools}
            with pytest.raises(ExecutionFailed):
                await c.call("def f():\n    raise ValueError()", "f")

    asyncio.run(main())


def test_concurrent_sync_use_from_threads(client: Airlock) -> None:
    results: list[object] = []

    def work(n: int) -> None:
        results.append(client.call("def f(n):\n    return n * n", "f", n=n))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 4, 9]  # type: ignore[type-var]


def test_environments(client: Airlock) -> None:
    listing = client.environments()
    assert listing == []
    with pytest.raises(NotFound):
        client.environment("numpy-extra")
    # Building and deleting need the `admin` scope, which keys lack unless it is listed.
    with pytest.raises(Forbidden):
        client.create_environment("numpy-extra", ["six"])
    with pytest.raises(Forbidden):
        client.delete_environment("numpy-extra")


def test_credentials_are_asked_for_by_name_and_only_those_granted(client: Airlock) -> None:
    # The test key is granted none: asking for one is a 403 naming the field, `[]` is fine.
    with pytest.raises(Forbidden) as refused:
        client.run("print(1)", credentials=["github"])
    assert refused.value.field == "credentials"
    assert client.run("print(1)", credentials=[]).stdout == "1\n"
    with pytest.raises(Forbidden):
        client.session(credentials=["github"])
    with pytest.raises(TypeError):
        client.run("print(1)", credentials="github")


MIB = 1 << 20


def test_volumes_keep_files_across_executions_and_file_routes(client: Airlock) -> None:
    data = client.create_volume("client-data", 16 * MIB)
    assert isinstance(data, Volume) and data.name == "client-data" and repr(data) == "Volume('client-data')"
    with pytest.raises(Conflict) as exists:
        client.create_volume("client-data", 16 * MIB)
    assert exists.value.code == "conflict" and type(exists.value) is Conflict
    [listed] = [v for v in client.volumes() if v.name == "client-data"]
    assert (listed.size_bytes, listed.max_entries, listed.used_bytes) == (16 * MIB, 1024, None) and listed.created_at

    data.upload("in/greeting.txt", "héllo")
    data.upload("raw.bin", b"\x00\xff")
    code = (
        "import os\n"
        "got = open('/work/data/in/greeting.txt').read()\n"
        "open('/work/data/out.txt', 'w').write('from the sandbox')\n"
        "[got, open('/work/data/raw.bin', 'rb').read().hex(), os.stat('/work/data/out.txt').st_uid]"
    )
    e = client.run(code, volumes=[data.mount("/work/data")])
    assert e.ok, e
    assert e.result == ["héllo", "00ff", 1000]
    # Written by the sandbox, read by the file routes; a handle made by name is the same volume.
    assert data.download("out.txt") == b"from the sandbox"
    assert client.volume("client-data").download("in/greeting.txt") == "héllo".encode()
    entries = {f.path: f for f in data.files()}
    assert list(entries) == ["in", "in/greeting.txt", "out.txt", "raw.bin"]
    assert entries["in"].type == "dir" and entries["raw.bin"] == FileEntry("raw.bin", "file", 2)
    info = data.info()
    assert (info.name, info.size_bytes, info.max_entries, info.used_entries) == ("client-data", 16 * MIB, 1024, 4)
    assert info.used_bytes is not None and info.used_bytes > 0

    # Streams and function mode mount volumes too; read-only is read-only.
    reading = [data.mount("/tmp/ro", read_only=True)]
    assert data.mount("/tmp/ro", read_only=True) == {"name": "client-data", "path": "/tmp/ro", "read_only": True}
    with client.stream("print(open('/tmp/ro/out.txt').read(), flush=True)", volumes=reading) as events:
        assert events.finish().stdout == "from the sandbox\n"
    refused = client.run(
        "import errno\ntry:\n    open('/tmp/ro/new', 'w')\n    r = 'wrote'\n"
        "except OSError as e:\n    r = errno.errorcode[e.errno]\nr",
        volumes=reading,
    )
    assert refused.result == "EROFS", refused
    size = "def size(path):\n    import os\n    return os.path.getsize(path)"
    called = client.run(size, entrypoint="size", inputs={"path": "/work/d/out.txt"}, volumes=[data.mount("/work/d")])
    assert called.raise_for_status().result == 16

    data.remove("raw.bin")
    with pytest.raises(NotFound):
        data.download("raw.bin")
    assert [f.path for f in data.files()] == ["in", "in/greeting.txt", "out.txt"]
    data.delete()
    assert "client-data" not in [v.name for v in client.volumes()]


def test_a_volume_has_one_writer_and_is_not_deleted_while_held(client: Airlock) -> None:
    shared = client.create_volume("client-shared", 8 * MIB, max_entries=64)
    assert shared.info().max_entries == 64
    with client.session(volumes=[shared.mount("/work/shared")]) as s:
        assert s.run("open('/work/shared/by-session.txt', 'w').write('kept')").ok
        # A second writer, by a run, a stream, a session or an upload, is refused naming the holder.
        with pytest.raises(VolumeBusy) as busy:
            client.run("1", volumes=[shared.mount("/work/shared")])
        assert (busy.value.status, busy.value.code, busy.value.field) == (409, "volume_busy", "volumes[0].name")
        assert s.id in busy.value.message and isinstance(busy.value, Conflict)
        with pytest.raises(VolumeBusy):
            client.stream("1", volumes=[shared.mount("/tmp/x")])
        with pytest.raises(VolumeBusy):
            client.session(volumes=[shared.mount("/work/shared")])
        with pytest.raises(VolumeBusy):
            shared.upload("x.txt", "x")
        # Readers share it with its writer.
        reader = client.run("open('/work/v/by-session.txt').read()", volumes=[shared.mount("/work/v", read_only=True)])
        assert reader.result == "kept", reader
        with pytest.raises(VolumeInUse) as in_use:
            shared.delete()
        assert (in_use.value.status, in_use.value.code) == (409, "volume_in_use") and s.id in in_use.value.message
    # Closed, the session holds it no more.
    shared.upload("x.txt", "x")
    assert shared.download("by-session.txt") == b"kept"
    shared.delete()
    with pytest.raises(NotFound):
        shared.info()


def test_volume_refusals(client: Airlock) -> None:
    with pytest.raises(QuotaExceeded) as over:
        client.create_volume("client-huge", VOLUME_QUOTA + 8 * MIB)
    assert (over.value.status, over.value.code) == (413, "quota_exceeded") and isinstance(over.value, PayloadTooLarge)
    with pytest.raises(BadRequest) as small:
        client.create_volume("client-small", MIB)
    assert small.value.field == "size_bytes"
    with pytest.raises(BadRequest) as named:
        client.create_volume("Not A Name", 8 * MIB)
    assert named.value.field == "name"
    assert not {"client-huge", "client-small"} & {v.name for v in client.volumes()}

    missing = client.volume("client-missing")
    for use in (missing.info, missing.files, missing.delete, lambda: missing.download("a"), lambda: missing.upload("a", "")):
        with pytest.raises(NotFound):
            use()
    with pytest.raises(NotFound) as unknown:
        client.run("1", volumes=[missing.mount("/work/m")])
    assert unknown.value.field == "volumes[0].name"

    tiny = client.create_volume("client-tiny", 8 * MIB)
    try:
        with pytest.raises(VolumeFull) as full:
            tiny.upload("big.bin", b"0" * (12 * MIB))
        assert (full.value.status, full.value.code) == (413, "volume_full")
        assert tiny.files() == []  # nothing of it left
        with pytest.raises(BadRequest) as outside:
            client.run("1", volumes=[tiny.mount("/usr/t")])
        assert outside.value.field == "volumes[0].path"
        # Refused here, before any request.
        with pytest.raises(ValueError):
            tiny.download("../etc/passwd")
        with pytest.raises(ValueError):
            client.volume("..")
        with pytest.raises(TypeError):
            client.run("1", volumes=tiny.mount("/work/t"))  # type: ignore[arg-type]
    finally:
        tiny.delete()


def test_a_volume_s_listing_marks_what_it_cannot_read_and_says_when_it_stops(server: Server, client: Airlock) -> None:
    vol = client.create_volume("client-marks", 16 * MIB)
    mount = [vol.mount("/work/v")]
    try:
        # More names than one listing gives (hard links take no entries of the volume).
        flood = (
            "import os\nopen('/work/v/one', 'w').close()\n"
            "for i in range(10050):\n    os.link('/work/v/one', f'/work/v/l{i:05}')\n'made'"
        )
        assert client.run(flood, volumes=mount).result == "made"
        listing = vol.files()
        assert isinstance(listing, VolumeFiles) and listing.truncated and len(listing) == 10_000
        # A name that is not UTF-8 is listed with U+FFFD in its place, marked lossy.
        odd = (
            "import os\nfor n in os.listdir('/work/v'):\n    os.remove('/work/v/' + n)\n"
            "os.mkdir(b'/work/v/\\xff')\nopen(b'/work/v/\\xff/inner', 'w').close()\n'made'"
        )
        assert client.run(odd, volumes=mount).result == "made"
        vol.upload("broken/inner.txt", "x")
        vol.upload("fine/ok.txt", "y")
        # A directory whose block is damaged on the disk, once nothing has the volume mounted.
        [image] = server.state.glob("volumes/*/client-marks.img")
        deadline = time.monotonic() + 10
        while any(str(image) in b.read_text() for b in pathlib.Path("/sys/block").glob("loop*/loop/backing_file")):
            assert time.monotonic() < deadline, "the volume stayed mounted"
            time.sleep(0.05)
        subprocess.run(["debugfs", "-w", "-R", "zap_block -f /broken 0", str(image)], check=True, capture_output=True)
        listing = vol.files()
        assert not listing.truncated
        assert [(f.path, f.type, f.lossy, f.unreadable) for f in listing] == [
            ("broken", "dir", False, True),
            ("fine", "dir", False, False),
            ("fine/ok.txt", "file", False, False),
            ("\ufffd", "dir", True, False),
            ("\ufffd/inner", "file", True, False),
        ]
    finally:
        vol.delete()


def test_volume_error_codes_have_their_exceptions() -> None:
    json_type = {"content-type": "application/json"}
    for status, code, kind in [
        (409, "volume_busy", VolumeBusy),
        (409, "volume_in_use", VolumeInUse),
        (413, "volume_full", VolumeFull),
        (413, "quota_exceeded", QuotaExceeded),
        (422, "volumes_unavailable", VolumesUnavailable),
    ]:
        body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
        error = error_for(status, json_type, body)
        assert type(error) is kind and (error.status, error.code) == (status, code)


def test_the_async_client_s_volumes(server: Server) -> None:
    async def main() -> None:
        async with AsyncAirlock(server.url, KEY) as c:
            vol = await c.create_volume("client-async", 8 * MIB)
            assert isinstance(vol, AsyncVolume) and c.volume("client-async").name == vol.name
            assert "client-async" in [v.name for v in await c.volumes()]
            await vol.upload("a.txt", "A")
            code = "p = '/work/a/a.txt'\ntext = open(p).read()\nopen(p, 'a').write('B')\ntext"
            e = await c.run(code, volumes=[vol.mount("/work/a")])
            assert e.result == "A", e
            assert await vol.download("a.txt") == b"AB"
            listing = await vol.files()
            assert listing == [FileEntry("a.txt", "file", 2)]
            assert isinstance(listing, VolumeFiles) and not listing.truncated
            assert (await vol.info()).used_entries == 1
            stream = await c.stream("print(open('/tmp/a/a.txt').read())", volumes=[vol.mount("/tmp/a", read_only=True)])
            assert (await stream.finish()).stdout == "AB\n"
            async with await c.session(volumes=[vol.mount("/work/a")]) as s:
                assert (await s.run("open('/work/a/b.txt', 'w').write('s')")).ok
                with pytest.raises(VolumeBusy):
                    await c.run("1", volumes=[vol.mount("/work/a")])
                with pytest.raises(VolumeInUse):
                    await vol.delete()
            assert await vol.download("b.txt") == b"s"
            await vol.remove("a.txt")
            await vol.remove("b.txt")
            assert await vol.files() == []
            await vol.delete()
            with pytest.raises(NotFound):
                await vol.info()

    asyncio.run(main())


def test_the_models_cover_the_openapi_document(server: Server) -> None:
    """Every property the server's own OpenAPI document gives a response type is a field of
    the client's model of it, and every required one is read; every value of a vocabulary the
    client checks is one it knows: a field or a value added or renamed on the server fails here."""
    doc = httpx.get(f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    schemas = doc["components"]["schemas"]

    def answer(path: str, method: str = "get", status: str = "200") -> dict[str, Any]:
        content: dict[str, Any] = doc["paths"][path][method]["responses"][status]["content"]
        schema: dict[str, Any] = content["application/json"]["schema"]
        return schema

    # The answers described in place rather than named among the components.
    schemas["Environment"] = answer("/v1/environments/{name}")
    schemas["Volume"] = answer("/v1/volumes/{name}")
    schemas["VolumeFiles"] = answer("/v1/volumes/{name}/files")
    schemas["VolumeFileEntry"] = schemas["VolumeFiles"]["properties"]["files"]["items"]
    schemas["Background"] = answer("/v1/executions", "post", "202")
    models: dict[str, type] = {
        "ExecuteResponse": Execution,
        "CellResponse": Execution,
        "ErrorInfo": ExecutionError,
        "Output": Output,
        "OutputFile": OutputFile,
        "Usage": Usage,
        "Limits": Limits,
        "Isolation": Isolation,
        "ExecutionRecord": ExecutionRecord,
        "SessionInfo": SessionInfo,
        "FileEntry": FileEntry,
        "VolumeFileEntry": FileEntry,
        "EvalResponse": Evaluation,
        "EvalError": EvalError,
        "ToolApi": Tool,
        "Approval": Approval,
        "ApprovalDetail": ApprovalDetail,
        "Decided": Decided,
        "Environment": Environment,
        "Volume": VolumeInfo,
        "VolumeFiles": VolumeFiles,
        "SnapshotInfo": Snapshot,
        "Background": BackgroundInfo,
    }
    # JSON names the models keep under another name.
    renamed = {("OutputFile", "base64"): "content"}
    # JSON names no model keeps, and why.
    unkept = {
        ("Background", "background"): "always true: what tells it from a record, which execution() refuses",
        ("Background", "events"): "the path of its events, which events() asks for itself",
    }
    missing = []
    for name, model in models.items():
        if dataclasses.is_dataclass(model):
            fields = {f.name for f in dataclasses.fields(model)}
        else:
            # A listing that is the list of its entries (`files`), with fields of its own.
            assert issubclass(model, list), model
            fields = {"files", *typing.get_type_hints(model)}
        schema = schemas[name]
        for prop in dict.fromkeys([*schema["properties"], *schema.get("required", [])]):
            if (name, prop) not in unkept and renamed.get((name, prop), prop) not in fields:
                missing.append(f"{name}.{prop} is not in {model.__name__}")
    assert not missing, "\n".join(missing)

    def values(schema: dict[str, Any]) -> set[str]:
        return set(schema.get("enum", [])) | {s["const"] for s in schema.get("oneOf", [])}

    for schema, vocabulary in [
        (schemas["Status"], Status),
        (schemas["Decision"], typing.get_type_hints(Decided)["decision"]),
        (schemas["Shown"], ArgumentsShown),
        (schemas["Background"]["properties"]["state"], BackgroundState),
    ]:
        assert values(schema) == set(typing.get_args(vocabulary)), vocabulary


def test_after_a_crash_sessions_are_lost_and_running_executions_recorded_as_interrupted(
    tmp_path: pathlib.Path,
) -> None:
    proc, url = launch(tmp_path)
    try:
        with Airlock(url, KEY) as c:
            s = c.session()
            s.run("x = 1")
            background = c.submit("import time\nprint('started', flush=True)\ntime.sleep(600)")
            with background.events() as events:
                assert next(events) == OutputEvent("stdout", "started\n")
                kept = events.last_event_id
            stream = c.stream("import time\nprint('running', flush=True)\ntime.sleep(60)")
            assert next(iter(stream)) == OutputEvent("stdout", "running\n")
            audit = (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
            running = [json.loads(line)["id"] for line in audit if '"event":"started"' in line][-1]
            proc.kill()  # SIGKILL: the server cleans up nothing
            proc.wait()
            with pytest.raises(TransportError):
                stream.finish()
    finally:
        if proc.poll() is None:
            proc.kill()
    proc, url = launch(tmp_path)
    try:
        with Airlock(url, KEY) as c:
            lost = Session(c, s.info)
            with pytest.raises(SessionLost) as gone:
                lost.run("x")
            assert (gone.value.status, gone.value.code) == (410, "session_lost")
            lost.close()  # a lost session closes quietly
            record = c.execution(running)
            assert record.interrupted and record.status == "internal_error"
            assert record.error is not None and record.error.type == "Interrupted"
            # A background execution is interrupted: its events end with the error, and
            # wait() raises it.
            again = c.background(background.id)
            info = again.refresh()
            assert info.state == "interrupted" and info.error is not None and info.result is None
            assert list(again.events(after=kept)) == [info.error]
            with pytest.raises(BackgroundNotFinished) as stopped:
                again.wait()
            assert stopped.value.state == "interrupted" and stopped.value.error == info.error
            assert "interrupted" in str(stopped.value) and "submit it again" in str(stopped.value)
            assert again.cancel().state == "interrupted"
    finally:
        stop(proc)
