"""airlock_client.pickle against the corpus the guard's own tests and the CLI's use: every benign
pickle loads to what CPython's unpickler gives, every malicious one is refused without running,
every malformed one is refused with the guard's offset and reason; and seed 002's exploit,
which CPython would run, is refused by the `deserialize` it asked for.

CPython's `pickle.loads` is the oracle here for the benign corpus only, which is known safe;
anything else is loaded by CPython only in a child process, to prove a payload would run."""

from __future__ import annotations

import ast
import base64
import collections
import datetime
import io
import json
import math
import os
import pathlib
import pickle
import random
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airlock_client import _pickle
from airlock_client import pickle as safe_pickle
from airlock_client.pickle import (
    Call,
    GlobalRef,
    MalformedPickle,
    PickleError,
    ScanReport,
    UnrepresentablePickle,
    UnsafePickle,
)

ROOT = pathlib.Path(__file__).resolve().parents[3]
GUARD_TESTS = ROOT / "crates" / "pickle" / "tests"
PYTHON = "/usr/bin/python3"


def python_lines(script: pathlib.Path) -> list[dict[str, Any]]:
    """The JSON lines one of the guard's corpus scripts prints, run as its tests run it."""
    out = subprocess.run([PYTHON, str(script)], capture_output=True, check=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def corpus() -> list[dict[str, Any]]:
    return python_lines(GUARD_TESTS / "corpus.py")


def blob(case: dict[str, Any], key: str = "pickle") -> bytes:
    return base64.b64decode(case[key])


def same(got: object, expected: object) -> bool:
    """Equal and of the same types all the way down (1 == 1.0 == True would hide a bug); NaN is
    NaN and -0.0 is not 0.0. An OrderedDict is a dict in its order: what the guard gives."""
    if type(expected) is collections.OrderedDict:
        expected = dict(expected)
    if type(got) is not type(expected):
        return False
    if isinstance(got, float):
        assert isinstance(expected, float)
        if math.isnan(got):
            return math.isnan(expected)
        return got == expected and math.copysign(1, got) == math.copysign(1, expected)
    if isinstance(got, complex):
        assert isinstance(expected, complex)
        return same(got.real, expected.real) and same(got.imag, expected.imag)
    if isinstance(got, (list, tuple)):
        assert isinstance(expected, (list, tuple))
        return len(got) == len(expected) and all(map(same, got, expected))
    if isinstance(got, dict):
        assert isinstance(expected, dict)
        return len(got) == len(expected) and all(
            same(gk, ek) and same(gv, ev)
            for (gk, gv), (ek, ev) in zip(got.items(), expected.items())
        )
    if isinstance(got, (set, frozenset)):
        assert isinstance(expected, (set, frozenset))
        types = collections.Counter(type(x) for x in got)
        return got == expected and types == collections.Counter(type(x) for x in expected)
    return got == expected


def canonical(form: object) -> str:
    """A decoder JSON form as text, set items sorted (CPython iterates a set in hash order, the
    guard in the order the pickle adds them)."""

    def walk(v: object) -> object:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            out = {k: walk(x) for k, x in v.items()}
            for tag in ("$set", "$frozenset"):
                items = out.get(tag)
                if len(out) == 1 and isinstance(items, list):
                    out[tag] = sorted(items, key=json.dumps)
            return out
        return v

    return json.dumps(walk(form))


def test_benign_corpus_loads_as_cpython_loads_it(corpus: list[dict[str, Any]]) -> None:
    cases = [c for c in corpus if c["kind"] == "benign"]
    assert len(cases) > 400, "the corpus is all there"
    failures = []
    for case in cases:
        data = blob(case)
        report = safe_pickle.scan(data)
        if report.verdict != "safe" or report.reasons or report.offset is not None:
            failures.append(f"{case['name']}: {report.verdict} {report.reasons} {report.reason}")
            continue
        # The JSON form is `airlock pickle decode`'s, exactly.
        text = _pickle.decode(data, [], safe_pickle.DEFAULT_MAX_BYTES, 200)
        if canonical(json.loads(text)) != canonical(case["expected"]):
            failures.append(f"{case['name']}: decoded {text:.200}")
        expected = pickle.loads(data)  # the benign corpus only: known safe
        if isinstance(expected, int) and abs(expected) >= 10**4300:
            # Past CPython's default 4300 digits the decoder gives the marked repr results give.
            with pytest.raises(UnrepresentablePickle, match="more than 4300 digits"):
                safe_pickle.loads(data)
            continue
        got = safe_pickle.loads(data)
        if not same(got, expected):
            failures.append(f"{case['name']}: loads gave {got!r:.200}, CPython {expected!r:.200}")
    assert not failures, f"{len(failures)} of {len(cases)}:\n" + "\n".join(failures)


def test_malicious_corpus_is_unsafe_and_never_loaded(corpus: list[dict[str, Any]]) -> None:
    cases = [c for c in corpus if c["kind"] == "malicious"]
    assert len(cases) > 60
    failures = []
    for case in cases:
        data = blob(case)
        report = safe_pickle.scan(data)
        if report.verdict != "unsafe" or not report.reasons:
            failures.append(f"{case['name']}: scan says {report.verdict}")
        try:
            value = safe_pickle.loads(data)
        except UnsafePickle as e:
            if e.reasons != report.reasons:
                failures.append(f"{case['name']}: loads says {e.reasons}, scan {report.reasons}")
        except PickleError as e:
            failures.append(f"{case['name']}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{case['name']}: loaded {value!r:.100}")
    assert not failures, "\n".join(failures)


# crates/pickle/tests/malformed.rs: the stream, the offset, what the reason says.
MALFORMED: list[tuple[bytes, int, str]] = [
    (b"\x80\x04X\xff\xff\xff\xffabc.", 2, "4294967295"),  # the CLI's broken.pkl
    (b"\x80\x04X\xff\xff\xff\xffabcdefghijklm.", 2, "4294967295"),
    (b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffx.", 2, "declares"),
    (b"\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xffx.", 2, "declares"),
    (b"\x80\x04K\x01", 4, "the pickle ends without STOP"),
    (b"", 0, "the pickle ends without STOP"),
    (b"\x80\x04\xff.", 2, "unknown opcode 0xff"),
    (b"\x80\x04h\x07.", 2, "memo 7 was never stored"),
    (b"\x80\x04j\xff\xff\xff\xff.", 2, "memo 4294967295 was never stored"),
    (b"\x80\x04a.", 2, "stack underflow"),
    (b"\x80\x04(.", 3, "stack underflow"),
    (b"\x80\x04K\x01t.", 4, "no MARK to pop to"),
    (b"\x80\x09N.", 0, "protocol 9"),
    (b"Ixyz\n.", 0, "INT"),
    (b"S'unterminated\n.", 0, "STRING"),
    (b"\x80\x04K\x01K\x02a.", 6, "an int, which has no extend or append"),
]


@pytest.mark.parametrize(("data", "offset", "reason"), MALFORMED)
def test_malformed_streams_are_refused_with_the_offset_and_reason(
    data: bytes, offset: int, reason: str
) -> None:
    report = safe_pickle.scan(data)
    assert (report.verdict, report.offset) == ("malformed", offset), report
    assert report.reason is not None and reason in report.reason
    with pytest.raises(MalformedPickle) as e:
        safe_pickle.loads(data)
    assert (e.value.offset, e.value.reason) == (report.offset, report.reason)
    assert str(e.value) == f"malformed at offset {offset}: {report.reason}"
    assert isinstance(e.value, PickleError) and isinstance(e.value, ValueError)


def test_every_pickle_in_the_data_is_scanned_and_what_ran_before_a_break_counts() -> None:
    # What follows STOP is ignored, as CPython ignores it...
    report = safe_pickle.scan(b"\x80\x04N.garbage")
    assert (report.verdict, report.pickles, report.trailing_bytes) == ("safe", 1, 7)
    assert safe_pickle.loads(b"\x80\x04N.garbage") is None
    # ...unless it is another pickle: pickle.loads would return None, and a reader that reads
    # on would run os.system.
    with pytest.raises(UnsafePickle):
        safe_pickle.loads(b"\x80\x04N.\x80\x02cos\nsystem\n.")
    # A stream that breaks after a call is unsafe, not merely malformed.
    with pytest.raises(UnsafePickle) as e:
        safe_pickle.loads(b"\x80\x02cos\nsystem\nVid\n\x85R\xff")
    assert any("malformed at offset" in r for r in e.value.reasons), e.value.reasons


def test_random_bytes_are_refused_or_loaded_never_anything_else() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        data = rng.randbytes(rng.randrange(64))
        try:
            safe_pickle.loads(data)
        except PickleError:
            pass
        assert safe_pickle.scan(data).verdict in ("safe", "unsafe", "malformed")


# --- Payloads that would run -------------------------------------------------------------


class Reduce:
    def __init__(self, fn: Callable[..., object], *args: object) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return (self.fn, self.args)


def payloads(canary: pathlib.Path) -> dict[str, object]:
    """Values whose unpickling creates `canary`, each through another door."""
    touch = f"open({str(canary)!r}, 'w').close()"
    return {
        "os.system": Reduce(os.system, f"touch {canary}"),
        "subprocess.call": Reduce(subprocess.call, ["touch", str(canary)]),
        "eval": Reduce(eval, touch),
        "exec": Reduce(exec, touch),
        "inside data": {"rows": [1, 2, {"k": Reduce(os.system, f"touch {canary}")}]},
    }


def cpython_loads_in_a_child(data: bytes) -> None:
    """What the code seed 002 fixes did: CPython's unpickler, here in a child process."""
    subprocess.run(
        [PYTHON, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
        input=data,
        check=False,
        capture_output=True,
    )


@pytest.mark.parametrize("door", ["os.system", "subprocess.call", "eval", "exec", "inside data"])
def test_payloads_are_refused_and_never_run(tmp_path: pathlib.Path, door: str) -> None:
    canary = tmp_path / "payload-ran"
    value = payloads(canary)[door]
    # The canary is live: CPython loading the pickle runs the payload.
    cpython_loads_in_a_child(pickle.dumps(value, protocol=2))
    assert canary.exists(), "the payload does not work: this test would prove nothing"
    canary.unlink()
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(value, protocol=protocol)
        assert safe_pickle.scan(data).verdict == "unsafe"
        with pytest.raises(UnsafePickle) as e:
            safe_pickle.loads(data)
        assert e.value.reasons
        with pytest.raises(UnsafePickle):
            safe_pickle.load(io.BytesIO(data))
        assert not canary.exists(), f"protocol {protocol}: the payload ran"


# --- Seed 002: Modal's client-side `deserialize` -------------------------------------------


def deserialize(s: bytes, client: object = None) -> object:
    """Seed 002's client-side `deserialize`, after: airlock's guard instead of `Unpickler`, and
    no fallback whatever happens."""
    return safe_pickle.loads(s)


def test_seed_002_before_and_after(tmp_path: pathlib.Path) -> None:
    canary = tmp_path / "modal_exploit_test.txt"

    class SimpleExploit:
        def __reduce__(self) -> tuple[Callable[..., object], tuple[str]]:
            # The seed's payload: curl to the attacker; here, a file that must never appear.
            return (os.system, (f'echo "EXPLOITED" > {canary}',))

    exploit = pickle.dumps({"output": SimpleExploit()})
    # Before: the client unpickled it, and the sandbox's code ran on the client's machine.
    cpython_loads_in_a_child(exploit)
    assert canary.read_text() == "EXPLOITED\n"
    canary.unlink()
    # After: refused, for what it is, and nothing ran.
    with pytest.raises(UnsafePickle) as e:
        deserialize(exploit, client=None)
    assert any("posix.system" in r for r in e.value.reasons), e.value.reasons
    assert not canary.exists()
    # The seed's safe data still comes back as it was sent.
    safe_data = {
        "result": {
            "numbers": [1, 2, 3],
            "strings": ["hello", "world"],
            "nested": {"key": "value"},
            "boolean": True,
            "none": None,
        }
    }
    assert same(deserialize(pickle.dumps(safe_data)), safe_data)


# --- The CLI's files, archives, paths and bounds -------------------------------------------

DATE = b"\x80\x02cdatetime\ndate\nM\xe8\x07K\x01K\x02\x87R."


@pytest.fixture
def cli_files(tmp_path: pathlib.Path) -> Iterator[dict[str, pathlib.Path]]:
    """crates/cli/tests/it/pickle.rs's files, made the same way."""
    canary = tmp_path / "payload-ran"
    evil = pickle.dumps(Reduce(os.system, f"touch {canary}"), protocol=2)
    files = {
        "data": pickle.dumps({"a": [1, 2.5, None], "b": b"\x00"}, protocol=4),
        "evil": evil,
        "broken": b"\x80\x04X\xff\xff\xff\xffabc.",
        "date": DATE,
    }
    paths = {name: tmp_path / f"{name}.pkl" for name in files}
    for name, data in files.items():
        paths[name].write_bytes(data)
    paths["model"] = tmp_path / "model.pt"
    with zipfile.ZipFile(paths["model"], "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps([1, 2], protocol=2))
        z.writestr("archive/version", evil)
    yield paths
    assert not canary.exists(), "the payload ran"


def test_the_cli_s_files_get_the_cli_s_verdicts(cli_files: dict[str, pathlib.Path]) -> None:
    data = safe_pickle.scan(cli_files["data"])
    assert (data.kind, data.verdict, data.safe, data.protocol) == ("pickle", "safe", True, 4)
    evil = safe_pickle.scan(str(cli_files["evil"]))
    assert evil.verdict == "unsafe"
    assert "global posix.system is not allowed" in evil.reasons
    assert evil.globals[0].qualified == "posix.system" and not evil.globals[0].allowed
    assert evil.calls[0].opcode == "REDUCE" and evil.calls[0].target == "posix.system"
    broken = safe_pickle.scan(os.fsencode(cli_files["broken"]).decode())
    assert (broken.verdict, broken.offset) == ("malformed", 2)

    assert safe_pickle.loads(cli_files["data"].read_bytes()) == {"a": [1, 2.5, None], "b": b"\x00"}
    with open(cli_files["data"], "rb") as f:
        assert safe_pickle.load(f) == {"a": [1, 2.5, None], "b": b"\x00"}
    with pytest.raises(UnsafePickle):
        safe_pickle.loads(cli_files["evil"].read_bytes())
    with pytest.raises(MalformedPickle):
        safe_pickle.loads(cli_files["broken"].read_bytes())
    # An archive holds pickles; it is none (`airlock pickle decode` exits 2).
    with pytest.raises(MalformedPickle, match="a ZIP archive"):
        safe_pickle.loads(cli_files["model"].read_bytes())
    with pytest.raises(FileNotFoundError):
        safe_pickle.scan(cli_files["data"].with_name("nonexistent.pkl"))


def test_an_archive_is_scanned_member_by_member(cli_files: dict[str, pathlib.Path]) -> None:
    for report in (safe_pickle.scan(cli_files["model"]), safe_pickle.scan(cli_files["model"].read_bytes())):
        assert (report.kind, report.verdict) == ("zip", "unsafe")
        assert [m.name for m in report.members] == ["archive/data.pkl", "archive/version"]
        first, second = report.members
        assert first.pickle is not None and first.pickle.verdict == "safe" and first.error is None
        assert second.pickle is not None and second.pickle.verdict == "unsafe"
        assert any(r.startswith("archive/version: ") for r in report.reasons), report.reasons
        # The archive's own fields are its members'; a lone pickle's are empty.
        assert (report.protocol, report.opcodes, report.globals) == (None, 0, ())


def test_the_guard_s_archives_get_its_verdicts() -> None:
    cases = python_lines(GUARD_TESTS / "archives.py")
    assert len(cases) >= 10
    wrong = [
        (c["name"], verdict, c["verdict"])
        for c in cases
        if (verdict := safe_pickle.scan(blob(c, "zip")).verdict) != c["verdict"]
    ]
    assert not wrong, wrong


def test_the_report_is_the_cli_s_json(cli_files: dict[str, pathlib.Path]) -> None:
    for name in ("data", "evil", "broken", "model"):
        data = cli_files[name].read_bytes()
        text = _pickle.scan(data, [], safe_pickle.DEFAULT_MAX_BYTES)
        assert ScanReport.from_json(json.loads(text)) == safe_pickle.scan(data)
    with pytest.raises(ValueError, match=r"\$.size: expected int"):
        ScanReport.from_json({"kind": "pickle", "verdict": "safe", "size": "1"})
    with pytest.raises(ValueError, match="not a scan report"):
        ScanReport.from_json({"verdict": "fine"})


def test_size_is_bounded(tmp_path: pathlib.Path) -> None:
    # crates/cli/tests/it/pickle.rs: 5 000 bytes of BINBYTES8 against a bound of 4 096.
    data = b"\x80\x04\x8e" + (5000).to_bytes(8, "little") + bytes(5000) + b"."
    report = safe_pickle.scan(data, max_bytes=4096)
    assert report.verdict == "malformed"
    assert report.reason is not None and "more than the 4096" in report.reason
    with pytest.raises(MalformedPickle, match="more than the 4096"):
        safe_pickle.loads(data, max_bytes=4096)
    assert safe_pickle.loads(data, max_bytes=len(data)) == bytes(5000)
    # An archive's members inflate to at most max_bytes together.
    path = tmp_path / "big.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", data)
    assert safe_pickle.scan(path, max_bytes=4096).verdict == "malformed"
    assert safe_pickle.scan(path).verdict == "safe"

    # load() reads no more than max_bytes and one byte, however large the file.
    class Endless(io.RawIOBase):
        taken = 0

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            n = len(b)
            b[:n] = bytes(n)
            self.taken += n
            return n

    endless = Endless()
    with pytest.raises(MalformedPickle, match="more than the 4096"):
        safe_pickle.load(endless, max_bytes=4096)
    assert endless.taken == 4097


def test_scanning_and_decoding_let_other_threads_run() -> None:
    data = pickle.dumps([[i, str(i)] for i in range(300_000)], protocol=4)
    for native in (
        lambda: _pickle.scan(data, [], len(data)),
        lambda: _pickle.decode(data, [], len(data), 200),
    ):
        done = threading.Event()

        def run(native: Callable[[], str] = native) -> None:
            native()
            done.set()

        thread = threading.Thread(target=run)
        stamps = [time.perf_counter()]
        thread.start()
        # Holding the interpreter, the guard would stop this loop for the whole call.
        while not done.is_set():
            stamps.append(time.perf_counter())
        thread.join()
        took = stamps[-1] - stamps[0]
        longest = max(b - a for a, b in zip(stamps, stamps[1:]))
        assert took > 0.05, "too fast to tell: make the pickle larger"
        assert longest < took / 2, (longest, took)


# --- Values --------------------------------------------------------------------------------


def test_values_are_python_values() -> None:
    value = {
        "none": None,
        "bools": [True, False],
        "ints": [0, -1, 2**63, 2**64, -(2**70), 10**4300 - 1, -(10**4300) + 1],  # up to 4300 digits
        "floats": [1.5, -0.0, math.inf, -math.inf, 5e-324],
        "str": "é日本😀\udc80",
        "bytes": b"\x00\xff",
        "bytearray": bytearray(b"ab"),
        "tuple": (1, (2,), ()),
        "keys": {1: "a", (1, 2): "b", frozenset({3}): "c", None: "d", "$x": "e", "\ud800": "f"},
        "set": {1, "a", (2, 3)},
        "frozenset": frozenset({b"x"}),
        "complex": complex(1, -math.inf),
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
    }
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        got = safe_pickle.loads(pickle.dumps(value, protocol=protocol))
        assert same(got, value), (protocol, got)
    nan = safe_pickle.loads(pickle.dumps(math.nan))
    assert isinstance(nan, float) and math.isnan(nan)
    # Past CPython's default 4300 digits (a binary LONG4 carries any size), an int is the
    # marked repr execution results give it, which is no value to load.
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        with pytest.raises(UnrepresentablePickle, match="more than 4300 digits"):
            safe_pickle.loads(pickle.dumps([10**4300], protocol=protocol))
    # Keys Python deems equal are one, the first's place and the last value, as CPython has it.
    assert same(safe_pickle.loads(b"\x80\x02}(K\x01U\x01aG?\xf0\x00\x00\x00\x00\x00\x00U\x01bu."), {1: "b"})
    for data in (bytearray(pickle.dumps([1])), memoryview(pickle.dumps([1]))):
        assert safe_pickle.loads(data) == [1]
        assert safe_pickle.scan(data).safe


def test_the_default_globals_are_themselves() -> None:
    assert set(safe_pickle.DEFAULT_ALLOW) == set(safe_pickle._DEFAULT_OBJECTS)
    things = [set, frozenset, bytearray, bytes, complex, collections.OrderedDict]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert safe_pickle.loads(pickle.dumps(things, protocol=protocol)) == things


def test_globals_allowed_beyond_the_defaults_are_never_imported() -> None:
    # Not allowed: unsafe, as `airlock pickle scan` says without --allow.
    with pytest.raises(UnsafePickle, match="datetime.date"):
        safe_pickle.loads(DATE)
    # Only exact names: a module allows nothing.
    with pytest.raises(UnsafePickle):
        safe_pickle.loads(DATE, allow=["datetime"])
    assert safe_pickle.scan(DATE, allow=["datetime.date"]).safe
    # As names: the call, marked, never made; equal only to itself.
    call = safe_pickle.loads(DATE, allow=["datetime.date"])
    assert isinstance(call, Call) and (call.name, call.args) == ("datetime.date", (2024, 1, 2))
    assert call != Call("datetime.date", (2024, 1, 2))
    # As a mapping: the caller's own constructor, with the checked arguments.
    assert safe_pickle.loads(DATE, allow={"datetime.date": datetime.date}) == datetime.date(2024, 1, 2)
    # Named as a value.
    ref = b"\x80\x02cdatetime\ndate\n."
    assert safe_pickle.loads(ref, allow=("datetime.date",)) == GlobalRef("datetime.date")
    assert safe_pickle.loads(ref, allow={"datetime.date": datetime.date}) is datetime.date
    # Everything the pickle made: two calls are two objects, in a set too.
    both = pickle.dumps({datetime.date(2024, 1, 2), datetime.date(2024, 1, 3)}, protocol=2)
    calls = safe_pickle.loads(both, allow=["datetime.date"])
    assert isinstance(calls, set) and len(calls) == 2
    # A constructor that refuses the arguments: a PickleError that says so.
    bad = b"\x80\x02cdatetime\ndate\nM\xe8\x07K\x0dK\x02\x87R."
    with pytest.raises(PickleError, match="datetime.date refused") as e:
        safe_pickle.loads(bad, allow={"datetime.date": datetime.date})
    assert isinstance(e.value.__cause__, ValueError)
    # One that returns something unhashable where a key must be.
    with pytest.raises(UnrepresentablePickle):
        safe_pickle.loads(both, allow={"datetime.date": lambda *a: list(a)})


def test_what_the_guard_cannot_represent_is_refused() -> None:
    # A list that contains itself (CPython can load it; a copy of it would never end).
    with pytest.raises(UnrepresentablePickle, match="contains itself"):
        safe_pickle.loads(b"\x80\x02]q\x00h\x00a.")
    deep = b"\x80\x02" + b"]" * 300 + b"a" * 299 + b"."
    assert safe_pickle.scan(deep).safe
    with pytest.raises(UnrepresentablePickle, match="nested too deeply"):
        safe_pickle.loads(deep)
    value = safe_pickle.loads(deep, max_depth=301)
    for _ in range(299):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == []
    with pytest.raises(ValueError, match="max_depth is at most"):
        safe_pickle.loads(deep, max_depth=1 << 20)
    # Nesting the guard follows but Python's own JSON parser does not (a tuple is two levels
    # of JSON, and its parser is bounded by the recursion limit).
    tuples = b"\x80\x02)" + b"\x85" * 900 + b"."
    with pytest.raises(UnrepresentablePickle, match="JSON parser"):
        safe_pickle.loads(tuples, max_depth=1000)
    # Shared parts: copied, equal, not the same object.
    shared = safe_pickle.loads(b"\x80\x02(]q\x00h\x00l.")
    assert shared == [[], []]
    assert isinstance(shared, list) and shared[0] is not shared[1]


def test_deep_values_never_overflow_a_small_thread_stack() -> None:
    # {1: {1: ... {}}} 999 deep: three levels of JSON each, serialized and dropped recursively.
    data = b"\x80\x02" + b"}K\x01" * 999 + b"}" + b"s" * 999 + b"."
    answers: list[object] = []

    def run() -> None:
        answers.append(len(_pickle.decode(data, [], len(data), 1000)))

    previous = threading.stack_size(256 << 10)
    try:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    finally:
        threading.stack_size(previous)
    assert answers == [15986]
    # Python's own JSON parser stops at its recursion limit.
    with pytest.raises(UnrepresentablePickle, match="JSON parser"):
        safe_pickle.loads(data, max_depth=1000)


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError):
        safe_pickle.loads("\x80\x04N.")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not one name"):
        safe_pickle.loads(DATE, allow="datetime.date")
    with pytest.raises(TypeError):
        safe_pickle.scan(DATE, allow=[b"datetime.date"])  # type: ignore[list-item]


def test_errors_carry_their_parts_and_survive_a_copy() -> None:
    import copy

    for error in (UnsafePickle(["a", "b"]), MalformedPickle(3, "why"), UnrepresentablePickle("x")):
        again = copy.deepcopy(error)
        assert type(again) is type(error) and str(again) == str(error)
    assert UnsafePickle(["a", "b"]).reasons == ("a", "b")
    assert str(UnsafePickle(["a", "b"])) == "unsafe: a; b"


def test_the_module_never_imports_an_unpickler() -> None:
    source = pathlib.Path(safe_pickle.__file__).read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= {
        "__future__", "base64", "binascii", "codecs", "collections", "collections.abc",
        "dataclasses", "json", "os", "stat", "typing", "airlock_client", "airlock_client.decode",
    }, imported
    assert sys.modules["airlock_client._pickle"] is _pickle


def test_colliding_set_items_and_keys_are_refused_before_they_cost_quadratic_time() -> None:
    collide = (1 << 61) - 1  # every multiple hashes to 0
    many = [i * collide for i in range(1, 2001)]
    for value in (set(many), frozenset(many), {k: 1 for k in many}):
        data = pickle.dumps(value, protocol=4)
        assert safe_pickle.scan(data).verdict == "safe"
        with pytest.raises(safe_pickle.UnrepresentablePickle, match="share a hash"):
            safe_pickle.loads(data)
    few = set(many[:64])
    assert safe_pickle.loads(pickle.dumps(few, protocol=4)) == few


def test_builders_are_given_plain_data_only() -> None:
    # defaultdict(codecs.encode): the builder would get a function to call later.
    data = b"\x80\x02ccollections\ndefaultdict\nc_codecs\nencode\n\x85R."
    with pytest.raises(safe_pickle.UnsafePickle, match="not plain data"):
        safe_pickle.loads(data, allow={"collections.defaultdict": collections.defaultdict})
    # Nor another builder, named as a value.
    nested = b"\x80\x02ccollections\ndefaultdict\ncdatetime\ndate\n\x85R."
    builders = {"collections.defaultdict": collections.defaultdict, "datetime.date": datetime.date}
    with pytest.raises(safe_pickle.UnsafePickle, match="not plain data"):
        safe_pickle.loads(nested, allow=builders)
    assert safe_pickle.loads(b"\x80\x02cdatetime\ndate\nM\xe8\x07K\x01K\x02\x87R.",
                             allow={"datetime.date": datetime.date}) == datetime.date(2024, 1, 2)


def test_a_path_that_is_no_regular_file_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(safe_pickle.PickleError, match="not a regular file"):
        safe_pickle.scan("/dev/zero")
    with pytest.raises(safe_pickle.PickleError, match="not a regular file"):
        safe_pickle.scan(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # Refused at once: not left waiting for a writer, which could then write forever.
    with pytest.raises(safe_pickle.PickleError, match="not a regular file"):
        safe_pickle.scan(fifo)
