"""Strict decoding of an execution's result: plain JSON values as they are, and the objects
marked "$airlock" (README: "What comes back") as the Python values they stand for. Nothing in
a payload is evaluated, unpickled or imported; anything airlock would not send is refused
with a DecodeError that says where."""

from __future__ import annotations

import binascii
import collections
import datetime
import decimal
import functools
import importlib
import json
import math
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, NoReturn, TypeVar

from airlock_client.errors import ProtocolError

__all__ = ["DataFrame", "DecodeError", "Repr", "Series", "decode"]

MARK = "$airlock"

# Where a value sits, built as (parent, key or index) links and rendered only on error.
_Path = tuple["_Path", str | int] | None
_T = TypeVar("_T")


class DecodeError(ProtocolError):
    """A result that is not what airlock sends; `path` says where, as in `$.result[2].items[0]`."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class Repr:
    """A value JSON cannot carry, as the sandbox's repr() of it: text to read, never to evaluate."""

    type: str
    repr: str
    truncated: bool
    why: str


@dataclass(frozen=True)
class DataFrame:
    """A pandas DataFrame as sent: column labels, index labels, one dict per row and each
    column's dtype as pandas names it (`str(dtype)`: "int64", "category", "datetime64[ns]");
    `dtypes` is None for a table from a server older than the dtypes (a stored result)."""

    columns: list[object]
    index: list[object]
    records: list[dict[object, object]]
    dtypes: list[str] | None = None

    def to_pandas(self) -> Any:
        """This table as a `pandas.DataFrame` (pandas must be installed): a missing value that
        was NaN is NaN again, so a float column with one round-trips to an equal table."""
        pandas = importlib.import_module("pandas")
        return pandas.DataFrame(self.records, index=self.index, columns=self.columns)


@dataclass(frozen=True)
class Series:
    """A pandas Series as sent: its name, index labels and values."""

    name: object
    index: list[object]
    data: list[object]

    def to_pandas(self) -> Any:
        """This series as a `pandas.Series` (pandas must be installed)."""
        pandas = importlib.import_module("pandas")
        return pandas.Series(self.data, index=self.index, name=self.name)


# The most items of one set or keys of one dict that may share a hash. Each insertion compares
# with every item of the same hash, and Python's hashes of ints are not secret (every multiple
# of 2**61 - 1 hashes to 0), so many alike would cost quadratic time; real data has a few.
MAX_SHARED_HASH = 64


def crowded(items: list[object]) -> bool:
    """Whether more than MAX_SHARED_HASH of `items` (all hashable) share a hash."""
    counts = collections.Counter(map(hash, items))
    return bool(counts) and max(counts.values()) > MAX_SHARED_HASH


def decode(value: object, *, max_depth: int = 128, max_items: int = 1_000_000) -> object:
    """Turns a result parsed by `json.loads` into Python values. `max_depth` bounds how many
    lists and objects may hold one another (each level costs two or three Python frames: keep it
    well under the recursion limit), `max_items` how many values there may be in all."""
    return _Decoder(max_depth, max_items).value(value, None, 0)


@functools.cache
def _numpy() -> ModuleType | None:
    # Imported on the first array, not with this module: most results have none.
    try:
        return importlib.import_module("numpy")
    except ImportError:
        return None


_TIME_PARSERS: dict[str, Callable[[str], object]] = {
    "datetime.date": datetime.date.fromisoformat,
    "datetime.datetime": datetime.datetime.fromisoformat,
    "datetime.time": datetime.time.fromisoformat,
}

# The Python types numpy's tolist() gives for each dtype kind; numpy itself would quietly turn
# "3" or 3.7 into an int64 3. Object arrays ("O") hold anything.
_CELL_TYPES: dict[str, tuple[type, ...]] = {
    "b": (bool,),
    "i": (int,),
    "u": (int,),
    "f": (int, float),
    "c": (int, float, complex),
    "U": (str,),
    "S": (bytes,),
    "V": (bytes,),
    "M": (int, datetime.date, datetime.datetime, type(None)),
    "m": (int, datetime.timedelta, type(None)),
}

# The most an array may take once made: airlock sends at most 100 000 cells.
_MAX_ARRAY_BYTES = 256 << 20

# The floats JSON cannot carry, as the "float" form spells them; float() of these exact strings
# evaluates nothing.
_NON_FINITE = ("nan", "inf", "-inf")

# The "int" form: an integer past 64 bits, in decimal, of at most CPython's default 4300
# digits (larger ones come as a repr); int() accepts more spellings than airlock sends.
_INT_DIGITS = 4300
_INT_FORM = re.compile(r"-?(0|[1-9][0-9]*)\Z", re.ASCII)


def int_digits(text: str) -> int | None:
    """The int an "int" form's `value` spells, or None where it is not decimal digits as
    airlock writes them (at most 4300). ValueError if this process lowered its own limit
    (sys.set_int_max_str_digits)."""
    if not _INT_FORM.match(text) or len(text) - text.startswith("-") > _INT_DIGITS:
        return None
    return int(text)


def _render(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, step = path
        if isinstance(step, int):
            parts.append(f"[{step}]")
        elif step.isidentifier():
            parts.append(f".{step}")
        else:
            parts.append(f"[{json.dumps(step)}]")
    return "$" + "".join(reversed(parts))


def _label(raw: object) -> object:
    """A column label as sent, comparable: a string as itself, any other form as its JSON."""
    return raw if type(raw) is str else (json.dumps(raw),)


def _record_keys(raw: object) -> list[object]:
    """The keys of a record already decoded (an object, or a "dict" form's pairs), as sent."""
    assert isinstance(raw, dict)
    if MARK not in raw:
        return list(raw)
    items = raw["items"]
    assert isinstance(items, list)
    return [pair[0] for pair in items]


def _type_name(value: object) -> str:
    return type(value).__name__


class _Decoder:
    def __init__(self, max_depth: int, max_items: int) -> None:
        self.max_depth = max_depth
        self.max_items = max_items
        self.left = max_items
        self.forms: dict[str, Callable[[dict[str, object], _Path, int], object]] = {
            "bytes": self.bytes_,
            "set": self.set_,
            "dict": self.dict_,
            "datetime": self.datetime_,
            "timedelta": self.timedelta_,
            "decimal": self.decimal_,
            "complex": self.complex_,
            "int": self.int_,
            "float": self.float_,
            "ndarray": self.ndarray,
            "dataframe": self.dataframe,
            "series": self.series,
            "repr": self.repr_,
        }

    def fail(self, path: _Path, reason: str) -> NoReturn:
        raise DecodeError(_render(path), reason)

    def value(self, value: object, path: _Path, depth: int, key: bool = False) -> object:
        """`value` held by `depth` lists and objects; as a key (or set item, or label) its
        lists are tuples, which is what they were in the sandbox."""
        self.left -= 1
        if self.left < 0:
            self.fail(path, f"more than {self.max_items} values")
        if value is None or type(value) in (bool, int, str):
            return value
        if type(value) is float:
            if not math.isfinite(value):
                self.fail(path, "a non-finite number (airlock sends those as a \"float\" form)")
            return value
        if type(value) is not list and type(value) is not dict:
            self.fail(path, f"not a JSON value: {_type_name(value)}")
        if depth >= self.max_depth:
            self.fail(path, f"nested more than {self.max_depth} deep")
        if type(value) is list:
            items = [self.value(item, (path, i), depth + 1, key) for i, item in enumerate(value)]
            return tuple(items) if key else items
        assert type(value) is dict
        if MARK in value:
            kind_name = value[MARK]
            if not isinstance(kind_name, str):
                self.fail((path, MARK), f"expected a string, got {_type_name(kind_name)}")
            form = self.forms.get(kind_name)
            if form is None:
                self.fail((path, MARK), f"unknown form {kind_name!r}")
            return form(value, path, depth)
        out: dict[str, object] = {}
        for name, item in value.items():
            if type(name) is not str:
                self.fail(path, f"a key that is not a string: {_type_name(name)}")
            out[name] = self.value(item, (path, name), depth + 1)
        return out

    def field(self, obj: dict[str, object], name: str, kind: type[_T], path: _Path) -> _T:
        if name not in obj:
            self.fail(path, f"missing {name!r}")
        found = obj[name]
        if type(found) is not kind or not isinstance(found, kind):
            self.fail((path, name), f"expected {kind.__name__}, got {_type_name(found)}")
        return found

    def hashable(self, item: object, path: _Path) -> None:
        try:
            hash(item)
        except TypeError:
            self.fail(path, f"an unhashable {_type_name(item)} as a key or set item")

    def sequence(self, obj: dict[str, object], name: str, path: _Path, depth: int,
                 key: bool = False) -> list[object]:
        """Field `name`, a JSON array, decoded as a value held by the form."""
        decoded = self.value(self.field(obj, name, list, path), (path, name), depth + 1, key)
        assert isinstance(decoded, (list, tuple))
        return list(decoded)

    def number(self, obj: dict[str, object], name: str, path: _Path, depth: int) -> float:
        if name not in obj:
            self.fail(path, f"missing {name!r}")
        found = self.value(obj[name], (path, name), depth + 1)
        if type(found) is bool or not isinstance(found, (int, float)):
            self.fail((path, name), f"expected a number, got {_type_name(found)}")
        try:
            return float(found)
        except OverflowError:
            self.fail((path, name), "a number too large for a float")

    def bytes_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        text = self.field(obj, "base64", str, path)
        try:
            return binascii.a2b_base64(text, strict_mode=True)
        except ValueError as e:  # binascii.Error, or text that is not ASCII
            self.fail((path, "base64"), f"bad base64: {e}")

    def set_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        kind = self.field(obj, "type", str, path)
        if kind not in ("set", "frozenset"):
            self.fail((path, "type"), f"expected 'set' or 'frozenset', got {kind!r}")
        raw = self.field(obj, "items", list, path)
        items = []
        for i, item in enumerate(raw):
            item = self.value(item, ((path, "items"), i), depth + 1, key=True)
            self.hashable(item, ((path, "items"), i))
            items.append(item)
        if crowded(items):
            self.fail((path, "items"), f"more than {MAX_SHARED_HASH} items share a hash")
        return frozenset(items) if kind == "frozenset" else set(items)

    def dict_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        pairs: list[tuple[object, object]] = []
        for i, pair in enumerate(self.field(obj, "items", list, path)):
            here = ((path, "items"), i)
            if type(pair) is not list or len(pair) != 2:
                self.fail(here, "expected a [key, value] pair")
            key = self.value(pair[0], (here, 0), depth + 1, key=True)
            self.hashable(key, (here, 0))
            pairs.append((key, self.value(pair[1], (here, 1), depth + 1)))
        if crowded([k for k, _ in pairs]):
            self.fail((path, "items"), f"more than {MAX_SHARED_HASH} keys share a hash")
        return dict(pairs)

    def datetime_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        kind = self.field(obj, "type", str, path)
        iso = self.field(obj, "iso", str, path)
        parse = _TIME_PARSERS.get(kind)
        if parse is None and kind.startswith("pandas.") and kind.endswith(".Timestamp"):
            parse = datetime.datetime.fromisoformat  # nanoseconds are dropped
        if parse is None:
            self.fail((path, "type"), f"not a date, time or datetime type: {kind!r}")
        try:
            return parse(iso)
        except ValueError:
            self.fail((path, "iso"), f"not an ISO {kind}: {iso!r}")

    def timedelta_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        seconds = self.number(obj, "seconds", path, depth)
        try:
            return datetime.timedelta(seconds=seconds)
        except (ValueError, OverflowError) as e:
            self.fail((path, "seconds"), f"not a timedelta: {e}")

    def decimal_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        text = self.field(obj, "value", str, path)
        with decimal.localcontext() as context:
            # Else a context that does not trap it would read "abc" as NaN.
            context.traps[decimal.InvalidOperation] = True
            try:
                return decimal.Decimal(text)
            except decimal.InvalidOperation:
                self.fail((path, "value"), f"not a decimal: {text!r}")

    def complex_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        return complex(self.number(obj, "real", path, depth), self.number(obj, "imag", path, depth))

    def int_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        text = self.field(obj, "value", str, path)
        try:
            value = int_digits(text)
        except ValueError as e:
            self.fail((path, "value"), str(e))
        if value is None:
            self.fail((path, "value"), f"not the decimal digits of an int of at most {_INT_DIGITS}")
        if -(2**63) <= value < 2**64:
            self.fail((path, "value"), "an int within 64 bits comes as a JSON number")
        return value

    def float_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        text = self.field(obj, "value", str, path)
        if text not in _NON_FINITE:
            self.fail((path, "value"), f"expected one of {', '.join(_NON_FINITE)}, got {text!r}")
        return float(text)

    def ndarray(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        dtype_name = self.field(obj, "dtype", str, path)
        shape = self.field(obj, "shape", list, path)
        for i, size in enumerate(shape):
            if type(size) is not int or size < 0:
                self.fail(((path, "shape"), i), f"expected a size, got {size!r}")
        if "data" not in obj:
            self.fail(path, "missing 'data'")
        data = self.value(obj["data"], (path, "data"), depth + 1)
        # The cells, checked level by level against the shape (a 0-d array's data is its cell).
        cells: list[tuple[object, _Path]] = [(data, (path, "data"))]
        for size in shape:
            inner: list[tuple[object, _Path]] = []
            for item, here in cells:
                if type(item) is not list or len(item) != size:
                    self.fail(here, f"does not match shape {shape}: expected a list of {size}")
                inner.extend((cell, (here, j)) for j, cell in enumerate(item))
            cells = inner
        numpy = _numpy()
        if numpy is None:
            return data
        try:
            dtype = numpy.dtype(dtype_name)
        except (TypeError, ValueError):
            self.fail((path, "dtype"), f"not a numpy dtype: {dtype_name!r}")
        # A fixed-width dtype can ask for any size per cell ("U1000000000", whose size numpy
        # 1.x even wraps below zero): bounded first.
        if dtype.itemsize < 0 or len(cells) * dtype.itemsize > _MAX_ARRAY_BYTES:
            self.fail((path, "dtype"), f"{len(cells)} cells of {dtype} exceed {_MAX_ARRAY_BYTES} bytes")
        allowed = _CELL_TYPES.get(dtype.kind)
        # numpy 1.x only warns, and wraps, when an int does not fit.
        bounds = numpy.iinfo(dtype) if dtype.kind in "iu" else None
        array = numpy.empty(len(cells), dtype=dtype)
        for i, (cell, here) in enumerate(cells):
            if allowed is not None and type(cell) not in allowed:
                self.fail(here, f"a {_type_name(cell)} in an array of {dtype}")
            if bounds is not None and isinstance(cell, int) and not bounds.min <= cell <= bounds.max:
                self.fail(here, f"{cell} does not fit {dtype}")
            try:
                array[i] = cell
            except (TypeError, ValueError, OverflowError) as e:
                self.fail(here, f"does not fit {dtype}: {e}")
        try:
            return array.reshape(shape)
        except (ValueError, OverflowError) as e:
            self.fail((path, "shape"), str(e))

    def dataframe(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        columns = self.sequence(obj, "columns", path, depth, key=True)
        index = self.sequence(obj, "index", path, depth, key=True)
        records: list[dict[object, object]] = []
        for i, record in enumerate(self.sequence(obj, "records", path, depth)):
            if type(record) is not dict:
                self.fail(((path, "records"), i), f"expected an object, got {_type_name(record)}")
            records.append(record)
        if len(records) != len(index):
            self.fail((path, "records"), f"{len(records)} records for an index of {len(index)}")
        # Each record holds exactly the columns' labels (a label twice holds one value), as
        # their forms: a NaN label equals no decoded NaN, but its form equals its form.
        raw_columns, raw_records = obj["columns"], obj["records"]
        assert isinstance(raw_columns, list) and isinstance(raw_records, list)
        labels = {_label(label) for label in raw_columns}
        for i, raw in enumerate(raw_records):
            if {_label(key) for key in _record_keys(raw)} != labels:
                self.fail(((path, "records"), i), "keys that are not the columns' labels")
        return DataFrame(columns, index, records, self.dtypes(obj, len(columns), path, depth))

    def dtypes(self, obj: dict[str, object], count: int, path: _Path, depth: int) -> list[str] | None:
        if "dtypes" not in obj:
            return None
        dtypes: list[str] = []
        for i, dtype in enumerate(self.sequence(obj, "dtypes", path, depth)):
            if not isinstance(dtype, str):
                self.fail(((path, "dtypes"), i), f"expected a string, got {_type_name(dtype)}")
            dtypes.append(dtype)
        if len(dtypes) != count:
            self.fail((path, "dtypes"), f"{len(dtypes)} dtypes for {count} columns")
        return dtypes

    def series(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        if "name" not in obj:
            self.fail(path, "missing 'name'")
        name = self.value(obj["name"], (path, "name"), depth + 1, key=True)
        index = self.sequence(obj, "index", path, depth, key=True)
        data = self.sequence(obj, "data", path, depth)
        if len(data) != len(index):
            self.fail((path, "data"), f"{len(data)} values for an index of {len(index)}")
        return Series(name, index, data)

    def repr_(self, obj: dict[str, object], path: _Path, depth: int) -> object:
        return Repr(
            self.field(obj, "type", str, path),
            self.field(obj, "repr", str, path),
            self.field(obj, "truncated", bool, path),
            self.field(obj, "why", str, path),
        )
