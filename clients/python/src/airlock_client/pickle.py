"""Pickles checked, never run: airlock's pickle guard (crates/pickle), compiled into this
package, so it works offline with no server.

    from airlock_client import pickle as safe_pickle

    safe_pickle.scan("model.pt").verdict      # "safe", "unsafe" or "malformed"
    safe_pickle.loads(data)                   # the value of a safe pickle, or an exception

The guard reads the opcodes (protocols 0 to 5) and interprets the stack, the marks and the
memo symbolically: nothing is imported, called or unpickled, whatever the input, and there is
no fallback to the standard library's unpickler, ever. A global is allowed only as an exact
`module.qualname`: by default only what CPython uses to pickle plain data (`DEFAULT_ALLOW`).

`loads` gives real Python values: None, bool, int, float (NaN and the infinities too), str
(lone surrogates too), bytes, bytearray, list, tuple, dict (any hashable keys, in their order),
set, frozenset, complex, and the default globals themselves (`builtins.set` is `set`). What
differs from `pickle.loads`, and why:
- an OrderedDict is a dict in the same order (the guard's value has no other type);
- a value the pickle shares (the memo) is copied at each place, so identity is not kept, and
  a container that contains itself is refused (`UnrepresentablePickle`), as is nesting deeper
  than `max_depth` or shared parts repeated past the size bound;
- a global allowed beyond the defaults is never imported by its name: called, it gives a
  `Call` (its name and arguments, to build the value yourself), or, when `allow` maps the name
  to a callable, what that callable returns for those arguments; named as a value, it gives a
  `GlobalRef`, or the object `allow` maps it to.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import collections
import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, cast

from airlock_client import _pickle
from airlock_client.decode import MAX_SHARED_HASH, crowded, int_digits

__all__ = [
    "DEFAULT_ALLOW",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "Call",
    "CallSite",
    "Global",
    "GlobalRef",
    "MalformedPickle",
    "Member",
    "PickleError",
    "ScanReport",
    "UnrepresentablePickle",
    "UnsafePickle",
    "load",
    "loads",
    "scan",
]

#: The globals allowed by default, as exact `module.qualname` (the guard's own list).
DEFAULT_ALLOW: tuple[str, ...] = tuple(_pickle.default_allow())
#: The largest pickle accepted, in bytes (and what an archive's members may inflate to).
DEFAULT_MAX_BYTES = 64 << 20
#: The deepest nesting `loads` follows.
DEFAULT_MAX_DEPTH = 200

Verdict = Literal["safe", "unsafe", "malformed"]
Kind = Literal["pickle", "zip", "tar"]
Data = bytes | bytearray | memoryview
Allow = Iterable[str] | Mapping[str, Callable[..., object]]

_T = TypeVar("_T")


class PickleError(ValueError):
    """A pickle `loads` refused: unsafe, malformed, or not representable."""


class UnsafePickle(PickleError):
    """Loading it would call or import something not allowed; `reasons` says what."""

    def __init__(self, reasons: Iterable[str]) -> None:
        self.reasons: tuple[str, ...] = tuple(reasons)
        super().__init__(self.reasons)

    def __str__(self) -> str:
        return "unsafe: " + "; ".join(self.reasons)


class MalformedPickle(PickleError):
    """Not a pickle CPython could load: `reason`, at byte `offset`."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(offset, reason)

    def __str__(self) -> str:
        return f"malformed at offset {self.offset}: {self.reason}"


class UnrepresentablePickle(PickleError):
    """A safe pickle whose value cannot be given: a container that contains itself, nesting
    deeper than `max_depth`, shared parts repeated past the size bound, a key that is not
    hashable, an int longer than `sys.get_int_max_str_digits()` allows."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)

    def __str__(self) -> str:
        return f"not representable: {self.reason}"


@dataclass(frozen=True, eq=False)
class Call:
    """What calling a global allowed beyond the defaults would have returned: its name and
    arguments, never called. Equal only to itself, as the object it stands for would be."""

    name: str
    args: tuple[object, ...]


@dataclass(frozen=True)
class GlobalRef:
    """A global allowed beyond the defaults, named as a value: only its name, never imported."""

    name: str


# The objects the default globals are: fixed here, never looked up by a name from the data.
_DEFAULT_OBJECTS: Mapping[str, object] = {
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "builtins.bytearray": bytearray,
    "builtins.bytes": bytes,
    "builtins.complex": complex,
    "_codecs.encode": codecs.encode,
    "collections.OrderedDict": collections.OrderedDict,
}


# --- The report ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Global:
    """A global the pickle names, as CPython would import it."""

    module: str
    name: str
    #: The name as written, when CPython maps it (a Python 2 name below protocol 3).
    written: str | None
    #: Offset of the opcode that named it.
    offset: int
    allowed: bool

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class CallSite:
    """An opcode that calls, builds or looks something up (REDUCE, INST, OBJ, NEWOBJ, ...)."""

    opcode: str
    offset: int
    #: The callable's name, when it is a known global (cut at 1 000 characters).
    target: str | None


@dataclass(frozen=True)
class Member:
    """One member of an archive: its scan when its content is a pickle, or why it could not be
    read."""

    name: str
    #: Offset of its header in the file.
    offset: int
    #: Its size once decompressed.
    size: int
    pickle: ScanReport | None
    error: str | None


@dataclass(frozen=True)
class ScanReport:
    """What the scan saw: the object `airlock pickle scan --json` prints, as a dataclass.

    For a lone pickle (`kind` "pickle", and each archive member's `pickle`) every field is its
    own; for an archive (`kind` "zip" or "tar") the verdict is the members' worst, `members`
    lists them, and the per-pickle fields are empty (`protocol` None, counts 0)."""

    kind: Kind
    verdict: Verdict
    #: Why it is unsafe (empty unless `verdict` is "unsafe").
    reasons: tuple[str, ...] = ()
    #: Where and why it is malformed (None unless `verdict` is "malformed").
    offset: int | None = None
    reason: str | None = None
    #: The PROTO opcode's protocol, if any (protocols 0 and 1 have none).
    protocol: int | None = None
    size: int = 0
    #: Pickles one after another in the data (the first is the value; each is scanned).
    pickles: int = 0
    #: Bytes after the last pickle that are no pickle (CPython ignores them).
    trailing_bytes: int = 0
    opcodes: int = 0
    #: The first 10 000 globals named and call sites, and how many more there were.
    globals: tuple[Global, ...] = ()
    globals_omitted: int = 0
    calls: tuple[CallSite, ...] = ()
    calls_omitted: int = 0
    members: tuple[Member, ...] = ()

    @property
    def safe(self) -> bool:
        return self.verdict == "safe"

    @classmethod
    def from_json(cls, report: Mapping[str, object]) -> ScanReport:
        """A report from its JSON object (parsed): the guard's, or `POST /v1/pickle/scan`'s."""
        return _report(report, "$")


def _field(obj: Mapping[str, object], key: str, kind: type[_T], where: str) -> _T:
    value = obj.get(key)
    # bool is an int to isinstance: never take one for the other.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}.{key}: expected {kind.__name__}, got {value!r:.80}")
    return value


def _optional(obj: Mapping[str, object], key: str, kind: type[_T], where: str) -> _T | None:
    return None if obj.get(key) is None else _field(obj, key, kind, where)


def _objects(obj: Mapping[str, object], key: str, where: str) -> list[Mapping[str, object]]:
    items = _field(obj, key, list, where)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"{where}.{key}[{i}]: expected an object")
    return cast(list[Mapping[str, object]], items)


def _report(r: Mapping[str, object], where: str) -> ScanReport:
    kind = r.get("kind", "pickle")
    verdict = r.get("verdict")
    if kind not in ("pickle", "zip", "tar") or verdict not in ("safe", "unsafe", "malformed"):
        raise ValueError(f"{where}: not a scan report (kind {kind!r:.40}, verdict {verdict!r:.40})")
    reasons: tuple[object, ...] = ()
    offset = reason = None
    if verdict == "unsafe":
        reasons = tuple(_field(r, "reasons", list, where))
        if not all(isinstance(x, str) for x in reasons):
            raise ValueError(f"{where}.reasons: expected strings")
    elif verdict == "malformed":
        offset, reason = _field(r, "offset", int, where), _field(r, "reason", str, where)
    if kind != "pickle":
        return ScanReport(
            kind=kind,
            verdict=verdict,
            reasons=cast(tuple[str, ...], reasons),
            offset=offset,
            reason=reason,
            members=tuple(
                _member(m, f"{where}.members[{i}]")
                for i, m in enumerate(_objects(r, "members", where))
            ),
        )
    return ScanReport(
        kind="pickle",
        verdict=verdict,
        reasons=cast(tuple[str, ...], reasons),
        offset=offset,
        reason=reason,
        protocol=_optional(r, "protocol", int, where),
        size=_field(r, "size", int, where),
        pickles=_field(r, "pickles", int, where),
        trailing_bytes=_field(r, "trailing_bytes", int, where),
        opcodes=_field(r, "opcodes", int, where),
        globals=tuple(
            _global(g, f"{where}.globals[{i}]")
            for i, g in enumerate(_objects(r, "globals", where))
        ),
        globals_omitted=_field(r, "globals_omitted", int, where),
        calls=tuple(
            CallSite(
                opcode=_field(c, "opcode", str, at),
                offset=_field(c, "offset", int, at),
                target=_optional(c, "target", str, at),
            )
            for i, c in enumerate(_objects(r, "calls", where))
            for at in (f"{where}.calls[{i}]",)
        ),
        calls_omitted=_field(r, "calls_omitted", int, where),
    )


def _member(m: Mapping[str, object], at: str) -> Member:
    report = _optional(m, "pickle", dict, at)
    return Member(
        name=_field(m, "name", str, at),
        offset=_field(m, "offset", int, at),
        size=_field(m, "size", int, at),
        pickle=None if report is None else _report(report, f"{at}.pickle"),
        error=_optional(m, "error", str, at),
    )


def _global(g: Mapping[str, object], at: str) -> Global:
    return Global(
        module=_field(g, "module", str, at),
        name=_field(g, "name", str, at),
        written=_optional(g, "written", str, at),
        offset=_field(g, "offset", int, at),
        allowed=_field(g, "allowed", bool, at),
    )


# --- Scanning and loading ------------------------------------------------------------------


def scan(
    data_or_path: Data | str | os.PathLike[str] | os.PathLike[bytes],
    *,
    allow: Iterable[str] = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ScanReport:
    """Scans a pickle, or a ZIP or tar archive of them (PyTorch's `.pt`, `.pth`, `.ckpt`), given
    as bytes or as a path (a `str` is always a path). `allow` adds globals to the defaults, each
    an exact `module.qualname`; `max_bytes` bounds a pickle and what an archive's members may
    inflate to. Never raises for what the data holds: a bad file is a "malformed" report."""
    if isinstance(data_or_path, (str, os.PathLike)):
        # A device or a FIFO could be read forever (and opening a FIFO waits for a writer):
        # only a regular file, which has an end, is read.
        fd = os.open(data_or_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PickleError(f"{os.fsdecode(data_or_path)!r} is not a regular file")
            with open(fd, "rb", closefd=False) as f:
                data = f.read()
        finally:
            os.close(fd)
    else:
        data = _bytes(data_or_path)
    try:
        text = _pickle.scan(data, _names(allow), max_bytes)
    except _pickle.Failed as e:
        raise PickleError(f"the guard failed: {e.args[0]}") from None
    return ScanReport.from_json(cast(dict[str, object], json.loads(text)))


def loads(
    data: Data,
    *,
    allow: Allow = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> object:
    """The value of a safe pickle; raises `UnsafePickle`, `MalformedPickle` or
    `UnrepresentablePickle` (all `PickleError`, a `ValueError`) for anything else. Never falls
    back on another unpickler.

    `allow` adds globals to the defaults, each an exact `module.qualname`: as names, their
    calls come back as `Call` and the globals themselves as `GlobalRef`; as a mapping from names
    to callables (`{"datetime.date": datetime.date}`), each call is made with the callable given
    (the arguments are plain data the guard checked), and the global itself is that callable.

    `max_bytes` bounds the pickle's size; `max_depth` (at most 1 000) how deeply its containers
    may nest. Python's JSON parser, which reads the guard's answer, may stop sooner, near the
    recursion limit's thousand levels of JSON (a list is one, a tuple two, a dict whose keys are
    not all str three): that is refused as unrepresentable too."""
    text = _decode(_bytes(data), allow, max_bytes, max_depth)
    builders: Mapping[str, Callable[..., object]] = allow if isinstance(allow, Mapping) else {}
    try:
        return json.loads(text, object_pairs_hook=_Forms(builders).value)
    except RecursionError:
        raise UnrepresentablePickle(
            "nested too deeply for Python's JSON parser (lower max_depth)"
        ) from None


class _Reader(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


def load(
    file: _Reader,
    *,
    allow: Allow = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> object:
    """`loads` of what a binary file holds. Unlike `pickle.load`, it reads the file to its end
    (every pickle in it is scanned; the first one's value is returned), and no more than
    `max_bytes` and one byte: a longer file is refused as malformed, never read whole."""
    chunks: list[bytes] = []
    left = max_bytes + 1
    while left > 0:
        chunk = file.read(min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return loads(b"".join(chunks), allow=allow, max_bytes=max_bytes, max_depth=max_depth)


def _bytes(data: Data) -> bytes:
    # The scan runs with the interpreter released: it reads an immutable copy, never a buffer
    # another thread could change under it.
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"a pickle is bytes, bytearray or memoryview, not {type(data).__name__}")


def _names(allow: Iterable[str]) -> list[str]:
    if isinstance(allow, (str, bytes)):
        raise TypeError("allow is a collection of names, not one name")
    names = list(allow)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"allow holds names (str), not {type(name).__name__}")
    return names


def _decode(data: bytes, allow: Allow, max_bytes: int, max_depth: int) -> str:
    try:
        return _pickle.decode(data, _names(allow), max_bytes, max_depth)
    except _pickle.Unsafe as e:
        raise UnsafePickle(cast(list[str], e.args[0])) from None
    except _pickle.Malformed as e:
        raise MalformedPickle(cast(int, e.args[0]), cast(str, e.args[1])) from None
    except _pickle.Unrepresentable as e:
        raise UnrepresentablePickle(cast(str, e.args[0])) from None
    except _pickle.Failed as e:
        raise PickleError(f"the guard failed: {e.args[0]}") from None


class _Forms:
    """The decoder's JSON forms (docs/pickle.md) as Python values: `json.loads` hands
    `value` every object, innermost first, so each form's parts are already values."""

    def __init__(self, builders: Mapping[str, Callable[..., object]]) -> None:
        self.builders = builders

    def value(self, pairs: list[tuple[str, object]]) -> object:
        # The decoder writes a key starting with "$" only as a form's tag; every dict whose
        # keys are not all such strings is a "$dict".
        if not pairs or not pairs[0][0].startswith("$"):
            return dict(pairs)
        if pairs[0][0] == "$airlock":
            return self.marked(pairs)
        (tag, v), *rest = pairs
        if tag == "$call":
            if [k for k, _ in rest] != ["args"] or not isinstance(v, str):
                return _bad(pairs)
            return self.call(v, _list(rest[0][1], pairs))
        if rest:
            return _bad(pairs)
        try:
            return self.form(tag, v, pairs)
        except TypeError as e:
            # set(), frozenset() or a dict given an unhashable item (what a builder returned).
            raise UnrepresentablePickle(f"{tag}: {e}") from None

    def form(self, tag: str, v: object, pairs: list[tuple[str, object]]) -> object:
        match tag:
            case "$complex":
                re, im = _pair(v, pairs)
                return complex(_float(re, pairs), _float(im, pairs))
            case "$str":
                points = _list(v, pairs)
                if not all(type(p) is int and 0 <= p <= 0x10FFFF for p in points):
                    return _bad(pairs)
                return "".join(map(chr, cast(list[int], points)))
            case "$bytes":
                return _base64(v, pairs)
            case "$bytearray":
                return bytearray(_base64(v, pairs))
            case "$tuple":
                return tuple(_list(v, pairs))
            case "$set":
                return set(_uncrowded(_list(v, pairs), tag))
            case "$frozenset":
                return frozenset(_uncrowded(_list(v, pairs), tag))
            case "$dict":
                items = [_pair(kv, pairs) for kv in _list(v, pairs)]
                _uncrowded([k for k, _ in items], tag)
                return dict(items)
            case "$global" if isinstance(v, str):
                if v in self.builders:
                    return self.builders[v]
                if v in _DEFAULT_OBJECTS:
                    return _DEFAULT_OBJECTS[v]
                return GlobalRef(v)
        return _bad(pairs)

    def marked(self, pairs: list[tuple[str, object]]) -> object:
        """The forms shared with execution results: an int past 64 bits (decimal, at most 4300
        digits), a float that is not finite, or the repr of an int past 4300 digits."""
        form = dict(pairs)
        match form:
            case {"$airlock": "int", "value": str(text)} if len(form) == 2:
                try:
                    value = int_digits(text)
                except ValueError as e:
                    raise UnrepresentablePickle(str(e)) from None
                if value is not None:
                    return value
            case {"$airlock": "float", "value": "nan" | "inf" | "-inf" as text} if len(form) == 2:
                return float(text)
            case {"$airlock": "repr", "type": "int", "why": str(why)}:
                raise UnrepresentablePickle(why)
        return _bad(pairs)

    def call(self, name: str, args: list[object]) -> object:
        build = self.builders.get(name)
        if build is None:
            return Call(name, tuple(args))
        if not all(map(_plain, args)):
            # A global or another call as an argument (defaultdict(codecs.encode)) would hand
            # the builder something to call later.
            raise UnsafePickle([f"{name} is given a global or a call as an argument, not plain data"])
        try:
            return build(*args)
        except Exception as e:
            raise PickleError(f"{name} refused the pickle's arguments: {e!r}") from e


_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray)


def _plain(value: object) -> bool:
    """Whether `value` is data only: no callable, global or call anywhere in it."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, (list, tuple, set, frozenset)):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif not isinstance(v, _PLAIN):
            return False
    return True


def _uncrowded(items: list[object], tag: str) -> list[object]:
    try:
        crowd = crowded(items)
    except TypeError:
        return items  # an unhashable item: set() or dict() refuses it next
    if crowd:
        raise UnrepresentablePickle(f"{tag}: more than {MAX_SHARED_HASH} items share a hash")
    return items


def _bad(pairs: list[tuple[str, object]]) -> object:
    # The guard never writes one: a bug, reported as such rather than guessed around.
    raise PickleError(f"the guard gave an unknown form: {dict(pairs)!r:.200}")


def _list(v: object, pairs: list[tuple[str, object]]) -> list[object]:
    return cast(list[object], v) if isinstance(v, list) else cast(list[object], _bad(pairs))


def _pair(v: object, pairs: list[tuple[str, object]]) -> tuple[object, object]:
    items = _list(v, pairs)
    if len(items) != 2:
        _bad(pairs)
    return items[0], items[1]


def _float(v: object, pairs: list[tuple[str, object]]) -> float:
    if isinstance(v, float) or (type(v) is int):
        return float(v)
    return cast(float, _bad(pairs))


def _base64(v: object, pairs: list[tuple[str, object]]) -> bytes:
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True)
        except binascii.Error:
            pass
    return cast(bytes, _bad(pairs))
