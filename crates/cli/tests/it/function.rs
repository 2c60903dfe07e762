//! Function mode (seed 002: a block that returns a value): `entrypoint` + `inputs` through the
//! real server and `airlock run`. The return value is converted to JSON inside the sandbox;
//! nothing is ever pickled, and inputs arrive as plain data.

use crate::common;

use common::http::Server;
use common::*;
use serde_json::{json, Value};

/// Returns one value of every kind the conversion knows, by name.
const VALUES: &str = r#"
import datetime, decimal
import numpy as np, pandas as pd

class Thing:
    def __repr__(self):
        return "<Thing>"

def values():
    return {
        "native": {"a": [1, 2.5, None, True, "é"], "t": (1, 2), "empty": []},
        "set": {3, 1, 2},
        "frozenset": frozenset(["b", "a"]),
        "bytes": b"\x00\xffhi",
        "bytearray": bytearray(b"ab"),
        "int_keys": {1: "a", (2, 3): "b"},
        "forged": {"$airlock": "bytes", "base64": "AAAA"},
        "datetime": datetime.datetime(2024, 5, 6, 7, 8, 9),
        "date": datetime.date(2024, 1, 2),
        "time": datetime.time(1, 2, 3),
        "timestamp": pd.Timestamp("2024-01-02 03:04:05"),
        "big_frame": pd.DataFrame(np.zeros((400, 300))),
        "timedelta": datetime.timedelta(hours=1, milliseconds=5),
        "decimal": decimal.Decimal("1.10"),
        "complex": 1 + 2j,
        "ndarray": np.arange(6).reshape(2, 3),
        "float_array": np.array([0.5, np.nan]),
        "np_float": np.float32(0.25),
        "np_int": np.int64(7),
        "np_bool": np.bool_(True),
        "dataframe": pd.DataFrame({"x": [1, 2], "y": ["a", None]}),
        "series": pd.Series([1.5, 2.5], name="s"),
        "custom": Thing(),
        "nan": float("nan"),
        "inf": float("inf"),
        "huge": 10**30,
        "big_array": np.zeros(200_000),
    }

def pick(kind):
    return values()[kind]

def everything():
    return values()
"#;

fn nan(kind: &str) -> Value {
    json!({"$airlock": "float", "value": kind})
}

#[test]
fn each_kind_of_return_value_crosses_in_its_documented_form() {
    let _g = serial();
    let server = Server::start("", &[]);
    let r = server.execute(json!({"code": VALUES, "entrypoint": "everything"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    assert_eq!(r["status"], "ok", "{r}");
    let v = &r["result"];
    let want = json!({
        "native": {"a": [1, 2.5, null, true, "é"], "t": [1, 2], "empty": []},
        "set": {"$airlock": "set", "type": "set", "items": [1, 2, 3]},
        "frozenset": {"$airlock": "set", "type": "frozenset", "items": ["a", "b"]},
        "bytes": {"$airlock": "bytes", "base64": "AP9oaQ=="},
        "bytearray": {"$airlock": "bytes", "base64": "YWI="},
        "int_keys": {"$airlock": "dict", "items": [[1, "a"], [[2, 3], "b"]]},
        "forged": {"$airlock": "dict", "items": [["$airlock", "bytes"], ["base64", "AAAA"]]},
        "datetime": {"$airlock": "datetime", "type": "datetime.datetime", "iso": "2024-05-06T07:08:09"},
        "date": {"$airlock": "datetime", "type": "datetime.date", "iso": "2024-01-02"},
        "time": {"$airlock": "datetime", "type": "datetime.time", "iso": "01:02:03"},
        "timestamp": {"$airlock": "datetime", "type": "pandas._libs.tslibs.timestamps.Timestamp",
                      "iso": "2024-01-02T03:04:05"},
        "timedelta": {"$airlock": "timedelta", "seconds": 3600.005},
        "decimal": {"$airlock": "decimal", "value": "1.10"},
        "complex": {"$airlock": "complex", "real": 1.0, "imag": 2.0},
        "ndarray": {"$airlock": "ndarray", "dtype": "int64", "shape": [2, 3],
                    "data": [[0, 1, 2], [3, 4, 5]]},
        "float_array": {"$airlock": "ndarray", "dtype": "float64", "shape": [2],
                        "data": [0.5, nan("nan")]},
        "np_float": 0.25,
        "np_int": 7,
        "np_bool": true,
        "dataframe": {"$airlock": "dataframe", "columns": ["x", "y"], "index": [0, 1], "dtypes": ["int64", "object"],
                      "records": [{"x": 1, "y": "a"}, {"x": 2, "y": null}]},
        "series": {"$airlock": "series", "name": "s", "index": [0, 1], "data": [1.5, 2.5]},
        "custom": {"$airlock": "repr", "type": "__main__.Thing", "repr": "<Thing>",
                   "truncated": false, "why": "not a JSON value"},
        "nan": nan("nan"),
        "inf": nan("inf"),
        "huge": {"$airlock": "int", "value": "1000000000000000000000000000000"},
        "big_array": {"$airlock": "repr", "type": "numpy.ndarray",
                      "repr": "array([0., 0., 0., ..., 0., 0., 0.])", "truncated": false,
                      "why": "array of more than 100000 cells"},
    });
    // Kind by kind, for a readable failure.
    for (kind, expected) in want.as_object().unwrap() {
        assert_eq!(&v[kind], expected, "{kind}");
    }
    // A table past 100 000 cells: pandas' own summary, marked.
    let big = v["big_frame"].clone();
    assert_eq!(
        (&big["$airlock"], &big["type"], &big["why"]),
        (
            &json!("repr"),
            &json!("pandas.core.frame.DataFrame"),
            &json!("table of more than 100000 cells")
        ),
        "{big}"
    );
    let mut v = v.clone();
    v.as_object_mut().unwrap().remove("big_frame");
    assert_eq!(v, want);

    // The same value alone, with inputs as keyword arguments.
    let r = server
        .execute(json!({"code": VALUES, "entrypoint": "pick", "inputs": {"kind": "ndarray"}}))
        .json();
    assert_eq!(r["result"], want["ndarray"], "{r}");
}

#[test]
fn inputs_are_plain_data_and_arrive_exactly() {
    let _g = serial();
    let server = Server::start("", &[]);
    let code = r#"
def describe(**kwargs):
    def walk(v):
        if isinstance(v, dict):
            # Keys prefixed: a key "$airlock" would make the answer a marked form.
            return {"type": "dict", "items": {"k:" + k: walk(x) for k, x in v.items()}}
        if isinstance(v, list):
            return {"type": "list", "items": [walk(x) for x in v]}
        return {"type": type(v).__name__, "repr": repr(v)}
    return walk(kwargs)
"#;
    let inputs = json!({
        "text": "é\u{0}", "n": 7, "big": u64::MAX, "neg": i64::MIN, "x": 0.1, "nothing": null,
        "flag": false, "nested": [[1, {"k": []}]],
        // Shapes an unpickler or a JSON object hook might turn into objects: still dicts.
        "reduce": {"__reduce__": ["os.system", ["echo pwned"]], "__class__": "os._wrap_close",
                   "$airlock": "bytes", "base64": "AA=="},
    });
    let r = server
        .execute(json!({"code": code, "entrypoint": "describe", "inputs": inputs}))
        .json();
    assert_eq!(r["status"], "ok", "{r}");
    let v = &r["result"]["items"];
    let leaf = |t: &str, repr: &str| json!({"type": t, "repr": repr});
    assert_eq!(v["k:text"], leaf("str", "'é\\x00'"));
    assert_eq!(v["k:n"], leaf("int", "7"));
    assert_eq!(v["k:big"], leaf("int", "18446744073709551615"));
    assert_eq!(v["k:neg"], leaf("int", "-9223372036854775808"));
    assert_eq!(v["k:x"], leaf("float", "0.1"));
    assert_eq!(v["k:nothing"], leaf("NoneType", "None"));
    assert_eq!(v["k:flag"], leaf("bool", "False"));
    assert_eq!(
        v["k:nested"]["items"][0]["items"][1]["items"]["k:k"]["type"],
        "list"
    );
    assert_eq!(v["k:reduce"]["type"], "dict");
    assert_eq!(v["k:reduce"]["items"]["k:$airlock"], leaf("str", "'bytes'"));
    assert_eq!(
        v["k:reduce"]["items"]["k:__class__"],
        leaf("str", "'os._wrap_close'")
    );
    assert!(r["stdout"].as_str().unwrap().is_empty());
}

#[test]
fn entrypoints_that_are_missing_wrong_or_failing_are_the_code_s_errors() {
    let _g = serial();
    let server = Server::start("", &[]);
    let code = "x = 5\nclass Tool:\n    @staticmethod\n    def run(a):\n        return 1 / a\n\
                async def later(n):\n    return n + 1\nprint('loaded')\n";
    let call = |entrypoint: &str, inputs: Value| {
        server
            .execute(json!({"code": code, "entrypoint": entrypoint, "inputs": inputs}))
            .json()
    };
    // A method, and an async function run to its end.
    assert_eq!(call("Tool.run", json!({"a": 4}))["result"], 0.25);
    let r = call("later", json!({"n": 41}));
    assert_eq!(
        (&r["status"], &r["result"]),
        (&json!("ok"), &json!(42)),
        "{r}"
    );
    // The code ran first, as a module: its output is there.
    assert_eq!(r["stdout"], "loaded\n");
    // The function's own exception, with its own frames only.
    let r = call("Tool.run", json!({"a": 0}));
    assert_eq!(r["status"], "error");
    assert_eq!(r["error"]["type"], "ZeroDivisionError");
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("line 5, in run"), "{tb}");
    assert!(!tb.contains("<string>"), "airlock's frames leaked: {tb}");
    // Not defined, not callable, wrong arguments: Python's own errors, clearly worded.
    let r = call("main", json!({}));
    assert_eq!(r["error"]["type"], "NameError", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("'main'"),
        "{r}"
    );
    let r = call("x", json!({}));
    assert_eq!(r["error"]["type"], "TypeError", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a function"),
        "{r}"
    );
    let r = call("Tool.run", json!({"b": 1}));
    assert_eq!(r["error"]["type"], "TypeError", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("'b'"),
        "{r}"
    );
}

#[test]
fn bad_function_mode_requests_are_refused_before_anything_runs() {
    let _g = serial();
    let server = Server::start("", &[]);
    let refused = |body: Value, field: &str| {
        let r = server.execute(body);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["field"], field, "{}", r.text());
    };
    refused(json!({"code": "1", "inputs": {"a": 1}}), "inputs");
    for name in ["", "os.system()", "a b", "1x", "a..b", "__import__('os')"] {
        refused(json!({"code": "1", "entrypoint": name}), "entrypoint");
    }
    // 64 levels of inputs are taken, 65 are not.
    let nested = |levels: usize| {
        let mut deep = json!(1);
        for _ in 1..levels {
            deep = json!([deep]);
        }
        deep
    };
    refused(
        json!({"code": "1", "entrypoint": "f", "inputs": {"d": nested(65)}}),
        "inputs",
    );
    let r = server.execute(
        json!({"code": "def f(d):\n    return 'taken'", "entrypoint": "f",
                                  "inputs": {"d": nested(64)}}),
    );
    assert_eq!(r.json()["result"], "taken", "{}", r.text());
    // Not an object: keyword arguments have names.
    let r = server.execute(json!({"code": "1", "entrypoint": "f", "inputs": [1]}));
    assert_eq!(r.status, 400, "{}", r.text());
    // Nothing ran but the one taken.
    assert_eq!(server.wait_log_lines(" execution ", 1).len(), 1);
}

#[test]
fn airlock_run_calls_an_entrypoint_and_prints_what_it_returns() {
    let code = temp_file(
        "tool.py",
        b"def main(a, b):\n    print('adding')\n    return {'sum': a + b}\n",
    );
    let inputs = temp_file("inputs.json", br#"{"a": 2, "b": 40}"#);
    let (code, inputs) = (code.to_str().unwrap(), inputs.to_str().unwrap());
    let r = invoke(
        &["run", "--entrypoint", "main", "--inputs", inputs, code],
        b"",
    );
    assert_eq!(r.exit, 0, "{r:#?}");
    assert_eq!(r.stdout, "adding\n{\"sum\":42}\n");
    let r = invoke(
        &[
            "run",
            "--json",
            "--entrypoint",
            "main",
            "--inputs",
            inputs,
            code,
        ],
        b"",
    );
    assert_eq!(r.result(), &json!({"sum": 42}), "{r:#?}");
    // Inputs from standard input, when the code comes from a file.
    let r = invoke(
        &[
            "run",
            "--json",
            "--entrypoint",
            "main",
            "--inputs",
            "-",
            code,
        ],
        br#"{"a": 1, "b": 1}"#,
    );
    assert_eq!(r.result(), &json!({"sum": 2}), "{r:#?}");
    // Usage errors, before anything runs.
    let list = temp_file("list.json", b"[1, 2]");
    for (args, says) in [
        (
            vec![
                "run",
                "--entrypoint",
                "main",
                "--inputs",
                list.to_str().unwrap(),
                code,
            ],
            "JSON object",
        ),
        (vec!["run", "--inputs", inputs, code], "--entrypoint"),
        (vec!["run", "--entrypoint", "a-b", code], "not a name"),
    ] {
        let r = invoke(&args, b"");
        assert_eq!(r.exit, 2, "{args:?}: {r:#?}");
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
}
