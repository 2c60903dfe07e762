import datetime
import decimal
import importlib
import json
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
    return got == expected


FORMS: list[tuple[str, object]] = [
    ('{"a": [1, 2.5, null, true, "x", []], "b": {}}',
     {"a": [1, 2.5, None, True, "x", []], "b": {}}),
    ('{"$airlock": "bytes", "base64": "aGk="}', b"hi"),
    ('{"$airlock": "bytes", "base64": ""}', b""),
    ('{"$airlock": "set", "type": "set", "items": [1, "a", [2, [3]]]}', {1, "a", (2, (3,))}),
    ('{"$airlock": "set", "type": "frozenset", "items": []}', frozenset()),
    ('{"$airlock": "dict", "items": [[1, "a"], [[1, 2], [3]], [null, {"k": 1}]]}',
     {1: "a", (1, 2): [3], None: {"k": 1}}),
    ('{"$airlock": "dict", "items": [["$airlock", "pickle"]]}', {"$airlock": "pickle"}),
    ('{"$airlock": "dict", "items": [[{"$airlock": "set", "type": "frozenset", "items": [1]}, 2]]}',
     {frozenset({1}): 2}),
    ('{"$airlock": "datetime", "type": "datetime.date", "iso": "2024-01-02"}', datetime.date(2024, 1, 2)),
    ('{"$airlock": "datetime", "type": "datetime.datetime", "iso": "2024-01-02T03:04:05.000006+01:00"}',
     datetime.datetime(2024, 1, 2, 3, 4, 5, 6, datetime.timezone(datetime.timedelta(hours=1)))),
    ('{"$airlock": "datetime", "type": "datetime.time", "iso": "03:04:05"}', datetime.time(3, 4, 5)),
    ('{"$airlock": "datetime", "type": "pandas._libs.tslibs.timestamps.Timestamp",'
     ' "iso": "2024-01-02T03:04:05.000000007+00:00"}',
     datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)),
    ('{"$airlock": "datetime", "type": "pandas.Timestamp", "iso": "2024-01-02T00:00:00"}',
     datetime.datetime(2024, 1, 2)),
    ('{"$airlock": "timedelta", "seconds": 3600.005}', datetime.timedelta(hours=1, milliseconds=5)),
    ('{"$airlock": "timedelta", "seconds": -1}', datetime.timedelta(seconds=-1)),
    ('{"$airlock": "decimal", "value": "1.10"}', decimal.Decimal("1.10")),
    ('{"$airlock": "complex", "real": 1.0, "imag": 2}', complex(1, 2)),
    ('{"$airlock": "complex", "real": 0.5, "imag": {"$airlock": "float", "value": "-inf"}}',
     complex(0.5, float("-inf"))),
    ('{"$airlock": "float", "value": "inf"}', float("inf")),
    ('{"$airlock": "float", "value": "-inf"}', float("-inf")),
    ('{"$airlock": "int", "value": "18446744073709551616"}', 2**64),
    ('{"$airlock": "int", "value": "-9223372036854775809"}', -(2**63) - 1),
    ('[{"$airlock": "int", "value": "' + "9" * 4300 + '"}]', [10**4300 - 1]),
    ('{"$airlock": "dict", "items": [[{"$airlock": "int", "value": "1180591620717411303424"},'
     ' {"$airlock": "float", "value": "-inf"}]]}', {2**70: float("-inf")}),
    ('{"$airlock": "set", "type": "set", "items": [{"$airlock": "int", "value": "-1180591620717411303424"}]}',
     {-(2**70)}),
    ('{"$airlock": "repr", "type": "int", "repr": "0x1", "truncated": true, "why": "an integer of more than 4300 digits"}',
     Repr("int", "0x1", True, "an integer of more than 4300 digits")),
    ('{"$airlock": "repr", "type": "os._wrap_close", "repr": "__import__(\'os\').system(\'x\')",'
     ' "truncated": true, "why": "not a JSON value", "later": 1}',
     Repr("os._wrap_close", "__import__('os').system('x')", True, "not a JSON value")),
    ('{"$airlock": "dataframe", "columns": ["a", "b"], "index": [0, 1],'
     ' "records": [{"a": 1, "b": "x"}, {"a": 2, "b": {"$airlock": "decimal", "value": "3"}}]}',
     DataFrame(["a", "b"], [0, 1], [{"a": 1, "b": "x"}, {"a": 2, "b": decimal.Decimal(3)}])),
    # MultiIndex columns: labels are tuples, and the records, keyed by them, are "dict" forms.
    ('{"$airlock": "dataframe", "columns": [["a", 1]], "index": ["r"],'
     ' "records": [{"$airlock": "dict", "items": [[["a", 1], null]]}]}',
     DataFrame([("a", 1)], ["r"], [{("a", 1): None}])),
    ('{"$airlock": "series", "name": "s", "index": [{"$airlock": "datetime", "type": "datetime.date",'
     ' "iso": "2024-01-02"}], "data": [[1, 2]]}',
     Series("s", [datetime.date(2024, 1, 2)], [[1, 2]])),
    ('{"$airlock": "series", "name": null, "index": [], "data": [], "extra": true}', Series(None, [], [])),
    ('{"result": [0, {"$airlock": "set", "type": "set", "items": [{"$airlock": "bytes", "base64": "AA=="}]}]}',
     {"result": [0, {b"\0"}]}),
]


@pytest.mark.parametrize(("text", "expected"), FORMS)
def test_forms(text: str, expected: object) -> None:
    got = decode(json.loads(text))
    assert same(got, expected), got


def test_nan_is_a_float_nan() -> None:
    got = decode([{"$airlock": "float", "value": "nan"}])
    assert isinstance(got, list) and type(got[0]) is float and got[0] != got[0]


@pytest.mark.parametrize("form", [
    {"$airlock": "int", "value": "1" + "0" * 4300},  # 4301 digits: a repr is sent instead
    {"$airlock": "int", "value": "5"},  # within 64 bits: a JSON number is sent instead
    {"$airlock": "int", "value": "18446744073709551615"},
    {"$airlock": "int", "value": "0x10000000000000000"},
    {"$airlock": "int", "value": "1_000_000_000_000_000_000_000"},
    {"$airlock": "int", "value": " 18446744073709551616"},
    {"$airlock": "int", "value": "+18446744073709551616"},
    {"$airlock": "int", "value": "018446744073709551616"},
    {"$airlock": "int", "value": "١٨٤٤٦٧٤٤٠٧٣٧٠٩٥٥١٦١٦"},
    {"$airlock": "int", "value": 18446744073709551616},
    {"$airlock": "int"},
    {"$airlock": "float", "value": "NaN"},
    {"$airlock": "float", "value": "1.5"},
    {"$airlock": "float", "value": "infinity"},
    {"$airlock": "float", "value": float("nan")},
])
def test_number_forms_are_exactly_what_airlock_sends(form: dict[str, object]) -> None:
    with pytest.raises(DecodeError) as refused:
        decode({"x": [form]})
    assert refused.value.path.startswith("$.x[0]"), refused.value


def test_decimal_keeps_its_digits() -> None:
    assert str(decode({"$airlock": "decimal", "value": "1.10"})) == "1.10"


def test_repr_is_frozen() -> None:
    value = decode({"$airlock": "repr", "type": "t", "repr": "r", "truncated": False, "why": "w"})
    assert isinstance(value, Repr)
    with pytest.raises(AttributeError):
        value.repr = "changed"  # type: ignore[misc]  # checking the runtime refuses it too


NDARRAYS: list[tuple[object, object]] = [
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]},
     [[1, 2, 3], [4, 5, 6]]),
    ({"$airlock": "ndarray", "dtype": "float64", "shape": [], "data": 0.25}, 0.25),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [0, 3], "data": []}, []),
    ({"$airlock": "ndarray", "dtype": "complex128", "shape": [1],
      "data": [{"$airlock": "complex", "real": 1.0, "imag": -1.0}]}, [complex(1, -1)]),
]


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


REPR = {"$airlock": "repr", "type": "t", "repr": "r", "truncated": False, "why": "w"}

MALFORMED: list[tuple[object, str]] = [
    ({"$airlock": "pickle", "data": "gASVAAAA"}, '$["$airlock"]'),
    ({"$airlock": "eval", "code": "1"}, '$["$airlock"]'),
    ({"$airlock": "Bytes", "base64": ""}, '$["$airlock"]'),
    ({"$airlock": 1}, '$["$airlock"]'),
    ({"$airlock": None}, '$["$airlock"]'),
    ({1: 2}, "$"),
    ((1, 2), "$"),
    ([{1, 2}], "$[0]"),
    ([object()], "$[0]"),
    ({"x": float("nan")}, "$.x"),
    ([float("inf")], "$[0]"),
    ({"$airlock": "bytes"}, "$"),
    ({"$airlock": "bytes", "base64": 5}, "$.base64"),
    ({"$airlock": "bytes", "base64": "aGk"}, "$.base64"),
    ({"$airlock": "bytes", "base64": "aGk=aGk="}, "$.base64"),
    ({"$airlock": "bytes", "base64": "a!Gk="}, "$.base64"),
    ({"$airlock": "bytes", "base64": "é"}, "$.base64"),
    ({"$airlock": "set", "type": "list", "items": []}, "$.type"),
    ({"$airlock": "set", "items": []}, "$"),
    ({"$airlock": "set", "type": "set", "items": {}}, "$.items"),
    ({"$airlock": "set", "type": "set", "items": [1, {"a": 1}]}, "$.items[1]"),
    ({"$airlock": "set", "type": "set", "items": [{"$airlock": "set", "type": "set", "items": []}]},
     "$.items[0]"),
    ({"$airlock": "dict", "items": [[1]]}, "$.items[0]"),
    ({"$airlock": "dict", "items": [[1, 2, 3]]}, "$.items[0]"),
    ({"$airlock": "dict", "items": [1]}, "$.items[0]"),
    ({"$airlock": "dict", "items": {"a": 1}}, "$.items"),
    ({"$airlock": "dict", "items": [[[1, {}], 2]]}, "$.items[0][0]"),
    ({"$airlock": "dict", "items": [[{"$airlock": "decimal", "value": "sNaN"}, 2]]}, "$.items[0][0]"),
    ({"$airlock": "dict", "items": [[1, {"$airlock": "nope"}]]}, '$.items[0][1]["$airlock"]'),
    ({"$airlock": "datetime", "type": "datetime.date", "iso": "2024-13-01"}, "$.iso"),
    ({"$airlock": "datetime", "type": "datetime.date", "iso": "2024-01-02T03:04:05"}, "$.iso"),
    ({"$airlock": "datetime", "type": "datetime.time", "iso": "2024-01-02"}, "$.iso"),
    ({"$airlock": "datetime", "type": "datetime.datetime", "iso": 20240102}, "$.iso"),
    ({"$airlock": "datetime", "type": "os.system", "iso": "2024-01-02"}, "$.type"),
    ({"$airlock": "datetime", "type": "pandas.Timedelta", "iso": "2024-01-02"}, "$.type"),
    ({"$airlock": "datetime", "iso": "2024-01-02"}, "$"),
    ({"$airlock": "timedelta", "seconds": "1"}, "$.seconds"),
    ({"$airlock": "timedelta", "seconds": True}, "$.seconds"),
    ({"$airlock": "timedelta", "seconds": 1e20}, "$.seconds"),
    ({"$airlock": "timedelta", "seconds": REPR}, "$.seconds"),
    ({"$airlock": "timedelta"}, "$"),
    ({"$airlock": "decimal", "value": "abc"}, "$.value"),
    ({"$airlock": "decimal", "value": 1.1}, "$.value"),
    ({"$airlock": "complex", "real": "1", "imag": 0}, "$.real"),
    ({"$airlock": "complex", "real": 1}, "$"),
    ({"$airlock": "complex", "real": 1, "imag": REPR}, "$.imag"),
    ({"$airlock": "complex", "real": 10**400, "imag": 0}, "$.real"),
    ({"$airlock": "repr", "type": "t", "repr": "r", "truncated": "no", "why": "w"}, "$.truncated"),
    ({"$airlock": "repr", "type": "t", "repr": "r", "truncated": 0, "why": "w"}, "$.truncated"),
    ({"$airlock": "repr", "type": "t", "repr": "r", "truncated": False}, "$"),
    ({"$airlock": "repr", "type": "t", "repr": None, "truncated": False, "why": "w"}, "$.repr"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [2, 3], "data": [[1, 2, 3], [4, 5]]}, "$.data[1]"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [2], "data": [[1], [2]]}, "$.data[0]"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [1], "data": 1}, "$.data"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [], "data": [1]}, "$.data"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [-1], "data": []}, "$.shape[0]"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [True], "data": [1]}, "$.shape[0]"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": "2", "data": [1, 2]}, "$.shape"),
    ({"$airlock": "ndarray", "dtype": 8, "shape": [], "data": 1}, "$.dtype"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": []}, "$"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [1], "data": [{"$airlock": "bytes", "base64": "*"}]},
     "$.data[0].base64"),
    ({"$airlock": "dataframe", "columns": ["a"], "index": [0], "records": {"a": 1}}, "$.records"),
    ({"$airlock": "dataframe", "columns": ["a"], "index": [0], "records": [[1]]}, "$.records[0]"),
    ({"$airlock": "dataframe", "columns": ["a"], "index": [0, 1], "records": [{"a": 1}]}, "$.records"),
    ({"$airlock": "dataframe", "index": [0], "records": [{"a": 1}]}, "$"),
    ({"$airlock": "dataframe", "columns": "a", "index": [0], "records": [{"a": 1}]}, "$.columns"),
    ({"$airlock": "series", "index": [0], "data": [1]}, "$"),
    ({"$airlock": "series", "name": "s", "index": [0], "data": [1, 2]}, "$.data"),
    ({"$airlock": "series", "name": "s", "index": 0, "data": [1]}, "$.index"),
    ({"result": [0, 1, {"$airlock": "set", "type": "set", "items": [{"$airlock": "bytes", "base64": "!"}]}]},
     "$.result[2].items[0].base64"),
    ({"a b": {"$airlock": "decimal", "value": "x"}}, '$["a b"].value'),
]


@pytest.mark.parametrize(("value", "path"), MALFORMED)
def test_malformed(value: object, path: str) -> None:
    e = error(value)
    assert isinstance(e, ValueError)
    assert e.path == path, str(e)
    assert str(e).startswith(path + ": ") and e.reason


# Malformed only where numpy checks the dtype and the cells.
NUMPY_MALFORMED: list[tuple[object, str]] = [
    ({"$airlock": "ndarray", "dtype": "not-a-dtype", "shape": [], "data": 1}, "$.dtype"),
    ({"$airlock": "ndarray", "dtype": "[('a', '<i4')]", "shape": [], "data": [1]}, "$.dtype"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [2], "data": [1, "3"]}, "$.data[1]"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [2], "data": [1, 2.5]}, "$.data[1]"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [1], "data": [True]}, "$.data[0]"),
    ({"$airlock": "ndarray", "dtype": "int8", "shape": [1], "data": [300]}, "$.data[0]"),
    ({"$airlock": "ndarray", "dtype": "float64", "shape": [1], "data": [REPR]}, "$.data[0]"),
    ({"$airlock": "ndarray", "dtype": "int64", "shape": [0] * 40, "data": []}, "$.shape"),
    # 100 cells of a gigabyte each, refused before numpy is asked for them.
    ({"$airlock": "ndarray", "dtype": "U1000000000", "shape": [100], "data": ["a"] * 100}, "$.dtype"),
]


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
