import dataclasses
import datetime
import decimal
import importlib
import json
import pathlib
import sys
import time
from typing import Any

import pytest

from airlock_client import DataFrame, DecodeError, Repr, Series, decode

# `airlock_client.decode` is the function (re-exported by the package); this is the module.
decode_module = importlib.import_module("airlock_client.decode")


def same(got: object, expected: object) -> bool:
    """Equal, and of the same types all the way down (1 == 1.0 == True would hide a bug)."""
    if type(got) is not type(expected):
        return False
    if isinstance(got, (list, tuple)):
        assert isinstance(expected, (list, tuple))
        return len(got) == len(expected) and all(map(same, got, expected))
    if isinstance(got, dict):
        assert isinstance(expected, dict)
        return list(got) == list(expected) and all(same(got[k], expected[k]) for k in got)
    if dataclasses.is_dataclass(got):
        fields = [field.name for field in dataclasses.fields(got)]
        return all(same(getattr(got, name), getattr(expected, name)) for name in fields)
    if isinstance(got, (datetime.datetime, datetime.time)):
        assert isinstance(expected, (datetime.datetime, datetime.time))
        return got == expected and got.utcoffset() == expected.utcoffset()
    if isinstance(got, decimal.Decimal):
        return str(got) == str(expected)
    return got == expected


# The table both clients' tests read (clients/forms.json): each form as the server sends it,
# the value it decodes to in a notation of its own, and the forms each client must refuse.
TABLE = json.loads((pathlib.Path(__file__).resolve().parents[2] / "forms.json").read_text("utf-8"))


def value_of(notation: Any) -> Any:
    """The Python value a value of the table's notation stands for (see its "notation")."""
    if notation is None or type(notation) in (bool, int, float, str):
        return notation
    if type(notation) is list:
        return [value_of(item) for item in notation]
    assert type(notation) is dict and len(notation) == 1, notation
    [(tag, body)] = notation.items()
    if tag == "object":
        return {key: value_of(item) for key, item in body.items()}
    if tag == "tuple":
        return tuple(value_of(item) for item in body)
    if tag == "int":
        return int(body)
    if tag == "float":
        return float(body)
    if tag == "bytes":
        return bytes.fromhex(body)
    if tag in ("set", "frozenset"):
        return (set if tag == "set" else frozenset)(value_of(item) for item in body)
    if tag == "dict":
        return {value_of(key): value_of(item) for key, item in body}
    if tag == "date":
        return datetime.date(*body)
    if tag == "datetime":
        year, month, day, hour, minute, second, nanosecond, offset = body
        return datetime.datetime(year, month, day, hour, minute, second, nanosecond // 1000, zone(offset))
    if tag == "time":
        hour, minute, second, nanosecond, offset = body
        return datetime.time(hour, minute, second, nanosecond // 1000, zone(offset))
    if tag == "timedelta":
        days, seconds, microseconds = body
        return datetime.timedelta(days=days, seconds=seconds, microseconds=microseconds)
    if tag == "decimal":
        return decimal.Decimal(body)
    if tag == "complex":
        real, imag = (value_of(part) for part in body)
        assert isinstance(real, (int, float)) and isinstance(imag, (int, float))
        return complex(real, imag)
    if tag == "repr":
        return Repr(*body)
    if tag == "dataframe":
        columns = [value_of(label) for label in body["columns"]]
        records = [dict(zip(columns, value_of(row))) for row in body["rows"]]
        return DataFrame(columns, [value_of(label) for label in body["index"]], records, body["dtypes"])
    if tag == "series":
        return Series(value_of(body["name"]), value_of(body["index"]), value_of(body["data"]))
    if tag == "ndarray":  # as decoded without numpy: the cells, nested by the shape
        return value_of(body["data"])
    raise AssertionError(f"unknown notation {tag!r}")


def zone(offset: int | None) -> datetime.tzinfo | None:
    return None if offset is None else datetime.timezone(datetime.timedelta(seconds=offset))


FORMS = [(entry["json"], value_of(entry["value"])) for entry in TABLE["forms"]]


def test_the_table_is_read() -> None:
    assert len(FORMS) >= 45 and len(TABLE["malformed"]) >= 90 and len(TABLE["malformed_cells"]) >= 16


@pytest.mark.parametrize(("text", "expected"), FORMS)
def test_forms(text: str, expected: object) -> None:
    got = decode(json.loads(text))
    assert same(got, expected), got


def test_nan_is_a_float_nan() -> None:
    got = decode([{"$airlock": "float", "value": "nan"}])
    assert isinstance(got, list) and type(got[0]) is float and got[0] != got[0]


def test_a_float_form_s_value_is_a_string() -> None:
    # JSON text cannot carry this one (the table's "malformed" holds the other number forms).
    with pytest.raises(DecodeError) as refused:
        decode({"x": [{"$airlock": "float", "value": float("nan")}]})
    assert refused.value.path == "$.x[0].value", refused.value


def test_decimal_keeps_its_digits() -> None:
    assert str(decode({"$airlock": "decimal", "value": "1.10"})) == "1.10"


def test_repr_is_frozen() -> None:
    value = decode({"$airlock": "repr", "type": "t", "repr": "r", "truncated": False, "why": "w"})
    assert isinstance(value, Repr)
    with pytest.raises(AttributeError):
        value.repr = "changed"  # type: ignore[misc]  # checking the runtime refuses it too


NDARRAYS = [(json.loads(entry["json"]), value_of(entry["value"])) for entry in TABLE["ndarrays"]]


@pytest.mark.parametrize(("value", "expected"), NDARRAYS)
def test_ndarray_without_numpy(monkeypatch: pytest.MonkeyPatch, value: object, expected: object) -> None:
    monkeypatch.setattr(decode_module, "_numpy", lambda: None)
    got = decode(value)
    assert same(got, expected), got


def test_ndarray_with_numpy() -> None:
    import numpy as np  # Debian's, which scripts/test.sh installs: never skipped

    def array(value: object) -> Any:
        got = decode(value)
        assert isinstance(got, np.ndarray)
        return got

    got = array({"$airlock": "ndarray", "dtype": "int64", "shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]})
    assert got.dtype == np.dtype("int64") and got.shape == (2, 3)
    assert got.tolist() == [[1, 2, 3], [4, 5, 6]]

    nan = {"$airlock": "float", "value": "nan"}
    got = array({"$airlock": "ndarray", "dtype": "float32", "shape": [3], "data": [0.5, nan, 1]})
    assert got.dtype == np.dtype("float32") and got[0] == 0.5 and np.isnan(got[1]) and got[2] == 1

    got = array({"$airlock": "ndarray", "dtype": "float64", "shape": [], "data": 0.25})
    assert got.shape == () and got.item() == 0.25

    got = array({"$airlock": "ndarray", "dtype": "int64", "shape": [0, 3], "data": []})
    assert got.shape == (0, 3)

    got = array({"$airlock": "ndarray", "dtype": "complex128", "shape": [1],
                 "data": [{"$airlock": "complex", "real": 1.0, "imag": -1.0}]})
    assert got.tolist() == [complex(1, -1)]

    got = array({"$airlock": "ndarray", "dtype": "<U2", "shape": [2], "data": ["ab", "c"]})
    assert got.dtype == np.dtype("<U2") and got.tolist() == ["ab", "c"]

    got = array({"$airlock": "ndarray", "dtype": "datetime64[us]", "shape": [2], "data": [
        {"$airlock": "datetime", "type": "datetime.datetime", "iso": "2024-01-02T03:04:05"}, None]})
    assert got[0] == np.datetime64("2024-01-02T03:04:05") and np.isnat(got[1])

    # An object array's cells may be lists: deeper than the shape, kept as cells.
    got = array({"$airlock": "ndarray", "dtype": "object", "shape": [2], "data": [[1, 2], "x"]})
    assert got.shape == (2,) and got[0] == [1, 2] and got[1] == "x"


def test_numpy_is_not_loaded_without_arrays() -> None:
    decode_module._numpy.cache_clear()
    decode({"a": [1]})
    assert decode_module._numpy.cache_info().misses == 0


def error(value: object, **limits: int) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        decode(value, **limits)
    return caught.value


# What no JSON text holds: the rest are the table's "malformed".
MALFORMED: list[tuple[object, str]] = [
    ({1: 2}, "$"),
    ((1, 2), "$"),
    ([{1, 2}], "$[0]"),
    ([object()], "$[0]"),
    ({"x": float("nan")}, "$.x"),
    ([float("inf")], "$[0]"),
] + [(json.loads(entry["json"]), entry["path"]) for entry in TABLE["malformed"]]


@pytest.mark.parametrize(("value", "path"), MALFORMED)
def test_malformed(value: object, path: str) -> None:
    e = error(value)
    assert isinstance(e, ValueError)
    assert e.path == path, str(e)
    assert str(e).startswith(path + ": ") and e.reason


# Malformed only where numpy checks the dtype and the cells.
NUMPY_MALFORMED = [(json.loads(entry["json"]), entry["path"]) for entry in TABLE["malformed_cells"]]


@pytest.mark.parametrize(("value", "path"), NUMPY_MALFORMED)
def test_malformed_with_numpy(value: object, path: str) -> None:
    import numpy  # noqa: F401  (Debian's, which scripts/test.sh installs: never skipped)

    assert error(value).path == path


def test_ndarray_without_numpy_keeps_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_module, "_numpy", lambda: None)
    for value, _ in NUMPY_MALFORMED:
        assert isinstance(decode(value), (int, list))


def nested(depth: int, wrap: str) -> object:
    """`depth` containers, one in another, built without recursion."""
    value: object = 1
    for _ in range(depth):
        if wrap == "list":
            value = [value]
        elif wrap == "object":
            value = {"k": value}
        elif wrap == "set":
            value = {"$airlock": "set", "type": "frozenset", "items": [value]}
        else:
            value = {"$airlock": "dict", "items": [["k", value]]}
    return value


@pytest.mark.parametrize("wrap", ["list", "object", "set", "dict"])
def test_depth(wrap: str) -> None:
    decode(nested(128, wrap))
    assert error(nested(129, wrap)).reason == "nested more than 128 deep"
    assert error(nested(3, wrap), max_depth=2).reason == "nested more than 2 deep"
    assert decode(1, max_depth=0) == 1


@pytest.mark.parametrize("wrap", ["list", "object", "set", "dict"])
def test_depth_bomb(wrap: str) -> None:
    bomb = nested(10_000, wrap)
    start = time.perf_counter()
    e = error(bomb)  # a RecursionError would fail this
    assert time.perf_counter() - start < 1.0
    assert e.path.startswith("$") and "nested more than 128 deep" in str(e)


def test_items() -> None:
    assert decode([1, 2], max_items=3) == [1, 2]
    assert error([1, 2, 3], max_items=3).path == "$[2]"
    assert error({"$airlock": "set", "type": "set", "items": [1, 2, 3]}, max_items=3).path == "$.items[2]"
    assert error({"a": {"b": 1}}, max_items=2).path == "$.a.b"


def test_item_bomb() -> None:
    e = error([0] * 1_000_000)
    assert e.path == "$[999999]" and e.reason == "more than 1000000 values"


def test_nothing_named_is_imported() -> None:
    name = "airlock_client_canary"
    value = {"$airlock": "datetime", "type": f"{name}.Thing", "iso": "2024-01-02"}
    assert error(value).path == "$.type"
    for kind in ("set", "repr"):
        error({"$airlock": kind, "type": name, "items": [], "repr": "", "truncated": False})
    assert name not in sys.modules
