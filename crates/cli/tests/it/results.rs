//! The result channel: values, exceptions, and programs that try to forge or break what comes
//! back. THREAT-MODEL: the result channel (spoofed framing, invalid UTF-8, NaN, deep nesting).

use crate::common;

use common::*;
use serde_json::{json, Value};

#[test]
fn the_final_expression_is_the_result() {
    let cases = [
        ("x = 6\nx * 7", json!(42)),
        (
            "{'a': (1, 2.5), 'b': [None, True, 'é']}",
            json!({"a": [1, 2.5], "b": [null, true, "é"]}),
        ),
        ("x = 1", json!(null)),
        ("print('hi')", json!(null)),
        ("def f():\n    return 3\nf()", json!(3)),
        ("2**63", json!(9223372036854775808u64)),
        ("-2**63", json!(-9223372036854775808i64)),
    ];
    for (code, want) in cases {
        let r = run(code, &[]);
        assert_eq!(r.status(), "ok", "{code}: {r:#?}");
        assert_eq!(r.result(), &want, "{code}");
        assert!(r.json["error"].is_null());
    }
}

#[test]
fn the_last_statement_gives_the_result_only_when_it_is_an_expression() {
    // A one-shot's code is compiled without the `ast` module (runner.py, compile_quick), which
    // finds the last statement from the end of the text: each case below is one it must get
    // right or hand to the `ast` module (semicolons, form feeds, lone carriage returns, future
    // imports, warnings, lines inside strings).
    let many_lines = format!("'''\n{}'''", "line\n".repeat(8));
    let cases: Vec<(&str, Value)> = vec![
        ("x = 1; x", json!(1)),
        ("x = 1; y = 2", json!(null)),
        ("if 1:\n    2\nelse:\n    3", json!(null)),
        ("if 1: 2", json!(null)),
        ("def f(a, b):\n    return a + b\nf(1,\n2)", json!(3)),
        ("s = '''\n1\n'''", json!(null)),
        ("'''\n1\n'''\n'''\n2\n'''", json!("\n2\n")),
        (
            &many_lines,
            json!("\nline\nline\nline\nline\nline\nline\nline\nline\n"),
        ),
        ("1\n# a comment\n\n", json!(1)),
        ("1 + \\\n2", json!(3)),
        ("(1\n,2)\n# the end", json!([1, 2])),
        ("x = 5\npass", json!(null)),
        ("'only a string'", json!("only a string")),
        ("", json!(null)),
        ("\n\n# nothing\n", json!(null)),
        ("a = [\n1,\n2\n]\na", json!([1, 2])),
        ("for i in range(2):\n    i\n", json!(null)),
        ("class A:\n    v = 4\nA.v", json!(4)),
        ("x = 1\r\nx + 1", json!(2)),
        ("x = 1\rx + 2", json!(3)),
        ("1\n\x0c2", json!(2)),
        (
            "from __future__ import annotations\ndef f(x: Nope): return 5\nf(0)",
            json!(5),
        ),
        ("try:\n    pass\nexcept ValueError:\n    7", json!(null)),
        ("@staticmethod\ndef f(): pass", json!(null)),
        ("import sys\nsys.maxsize > 1", json!(true)),
    ];
    for (code, want) in cases {
        let r = run(code, &[]);
        assert_eq!(r.status(), "ok", "{code:?}: {r:#?}");
        assert_eq!(r.result(), &want, "{code:?}");
    }
    // A warning the compiler gives names the code's file, once.
    let r = run("x = 1\nx is 1", &[]);
    assert_eq!(r.result(), &json!(true), "{r:#?}");
    let stderr = r.json["stderr"].as_str().unwrap();
    assert_eq!(stderr.matches("SyntaxWarning").count(), 1, "{stderr}");
    assert!(stderr.contains("main.py:2: SyntaxWarning"), "{stderr}");
    // Errors name the file and line, in the code's own functions too.
    let r = run("x = 1\ndef f():\n    return 1 / 0\nf()", &[]);
    let tb = r.json["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("File \"main.py\", line 3, in f"), "{tb}");
    assert!(tb.contains("File \"main.py\", line 4, in <module>"), "{tb}");
    let r = run("x = 1\n(1 +", &[]);
    assert_eq!(r.json["error"]["type"], "SyntaxError", "{r:#?}");
    let tb = r.json["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("File \"main.py\", line 2"), "{tb}");
}

#[test]
fn a_one_shot_compiles_its_code_without_the_ast_module() {
    // Its classes cost a cold start more than a millisecond (a zygote makes them once, for
    // the sessions of its children, without loading it).
    let r = run("import sys\n'_ast' in sys.modules", &[]);
    assert_eq!(r.result(), &json!(false), "{r:#?}");
    let r = run(
        "import sys\ndef main():\n    return '_ast' in sys.modules",
        &["--entrypoint", "main"],
    );
    assert_eq!(r.result(), &json!(false), "{r:#?}");
}

#[test]
fn values_that_are_not_json_cross_as_marked_capped_descriptions() {
    let cases = [
        (
            "class Thing:\n    pass\nThing()",
            "__main__.Thing",
            "not a JSON value",
        ),
        ("range(3)", "range", "not a JSON value"),
    ];
    for (code, kind, why) in cases {
        let r = run(code, &[]);
        assert_eq!(r.status(), "ok", "{code}: {r:#?}");
        let v = r.result();
        assert_eq!(v["$airlock"], "repr", "{code}: {v}");
        assert_eq!(v["type"], kind, "{code}: {v}");
        assert_eq!(v["why"], why, "{code}: {v}");
        assert_eq!(v["truncated"], false);
    }
}

/// Ints past 64 bits and floats that are not finite are exact values, not text: their own
/// forms, in every container (here a list, a dict, a set, a complex, an array and a table),
/// up to CPython's default 4300 digits; past them, a repr of hexadecimal digits, cut, that
/// costs the sandbox linear time however the code set its own limit.
#[test]
fn big_ints_and_non_finite_floats_cross_exactly_up_to_4300_digits() {
    let int = |digits: &str| json!({"$airlock": "int", "value": digits});
    let float = |v: &str| json!({"$airlock": "float", "value": v});
    let cases = [
        ("2**64 - 1", json!(18446744073709551615u64)),
        ("-2**63", json!(i64::MIN)),
        ("2**64", int("18446744073709551616")),
        ("-2**63 - 1", int("-9223372036854775809")),
        (
            "import math\n[math.factorial(25), float('nan'), float('inf'), -float('inf')]",
            json!([
                int("15511210043330985984000000"),
                float("nan"),
                float("inf"),
                float("-inf")
            ]),
        ),
        (
            "{'a': 2**70, 'b': {2**70: float('nan')}}",
            json!({"a": int("1180591620717411303424"),
                   "b": {"$airlock": "dict", "items": [[int("1180591620717411303424"), float("nan")]]}}),
        ),
        (
            "{2**70}",
            json!({"$airlock": "set", "type": "set", "items": [int("1180591620717411303424")]}),
        ),
        (
            "complex(float('nan'), -float('inf'))",
            json!({"$airlock": "complex", "real": float("nan"), "imag": float("-inf")}),
        ),
        (
            "import numpy as np\nnp.array([0.5, np.nan, np.inf])",
            json!({"$airlock": "ndarray", "dtype": "float64", "shape": [3],
                   "data": [0.5, float("nan"), float("inf")]}),
        ),
        (
            "import pandas as pd, numpy as np\npd.DataFrame({'a': [1.0, np.nan]})",
            json!({"$airlock": "dataframe", "columns": ["a"], "index": [0, 1], "dtypes": ["float64"],
                   "records": [{"a": 1.0}, {"a": float("nan")}]}),
        ),
        // The code's own limit on int-to-str conversion does not lower airlock's.
        (
            "import sys\nsys.set_int_max_str_digits(640)\n10**1000",
            int(&format!("1{}", "0".repeat(1000))),
        ),
        ("10**4300 - 1", int(&"9".repeat(4300))),
        ("-(10**4300 - 1)", int(&format!("-{}", "9".repeat(4300)))),
    ];
    for (code, want) in cases {
        let r = run(code, &[]);
        assert_eq!(r.status(), "ok", "{code}: {r:#?}");
        assert_eq!(r.result(), &want, "{code}");
    }
    // 4301 digits, and a million (3321929 bits): a repr of hexadecimal digits, cut at the repr's cap.
    for code in [
        "10**4300",
        "import sys\nsys.set_int_max_str_digits(0)\n-(1 << 3321929)",
    ] {
        let r = run(code, &[]);
        assert_eq!(r.status(), "ok", "{code}: {r:#?}");
        let v = r.result();
        assert_eq!(v["$airlock"], "repr", "{code}: {v}");
        assert_eq!(v["type"], "int");
        assert_eq!(v["why"], "an integer of more than 4300 digits");
        let repr = v["repr"].as_str().unwrap();
        assert!(
            repr.starts_with("0x") || repr.starts_with("-0x"),
            "{repr:.40}"
        );
        assert_eq!(v["truncated"], repr.len() == 4096, "{code}");
    }
    // A dict spelling the new forms is data, as every dict with a "$airlock" key is.
    let r = run(
        "[{'$airlock': 'int', 'value': '5'}, {'$airlock': 'float', 'value': 'nan'}]",
        &[],
    );
    assert_eq!(
        r.result(),
        &json!([
            {"$airlock": "dict", "items": [["$airlock", "int"], ["value", "5"]]},
            {"$airlock": "dict", "items": [["$airlock", "float"], ["value", "nan"]]},
        ]),
        "{r:#?}"
    );
}

#[test]
fn types_json_lacks_cross_in_documented_marked_forms() {
    let cases = [
        (
            "{2, 1}",
            json!({"$airlock": "set", "type": "set", "items": [1, 2]}),
        ),
        (
            "b'\\x00\\xff'",
            json!({"$airlock": "bytes", "base64": "AP8="}),
        ),
        ("{1: 'a'}", json!({"$airlock": "dict", "items": [[1, "a"]]})),
        // A dict that looks like a marked form is not taken for one.
        (
            "{'$airlock': 'repr', 'repr': 'forged'}",
            json!({"$airlock": "dict", "items": [["$airlock", "repr"], ["repr", "forged"]]}),
        ),
        (
            "import datetime\ndatetime.date(2026, 1, 2)",
            json!({"$airlock": "datetime", "type": "datetime.date", "iso": "2026-01-02"}),
        ),
        (
            "1+2j",
            json!({"$airlock": "complex", "real": 1.0, "imag": 2.0}),
        ),
        // A table's dtypes, one per column (duplicate labels included), as pandas names them:
        // its records alone cannot tell a category from an object or an int32 from an int64.
        (
            "import pandas as pd, numpy as np\n\
             f = pd.DataFrame({'i': np.array([1], dtype='int32'), 's': ['x'], 'c': pd.Categorical(['u']),\n\
             'd': pd.to_datetime(['2024-01-02']), 'b': [True]})\n\
             f.insert(1, 'b', [2.5], allow_duplicates=True)\n\
             f",
            json!({"$airlock": "dataframe", "columns": ["i", "b", "s", "c", "d", "b"], "index": [0],
                   "dtypes": ["int32", "float64", "object", "category", "datetime64[ns]", "bool"],
                   "records": [{"i": 1, "b": true, "s": "x", "c": "u",
                                "d": {"$airlock": "datetime", "type": "pandas._libs.tslibs.timestamps.Timestamp",
                                      "iso": "2024-01-02T00:00:00"}}]}),
        ),
    ];
    for (code, want) in cases {
        let r = run(code, &[]);
        assert_eq!(r.status(), "ok", "{code}: {r:#?}");
        assert_eq!(r.result(), &want, "{code}");
    }
}

#[test]
fn deep_huge_and_hostile_values_are_bounded() {
    // Nesting past 64 levels becomes a description at that depth.
    let r = run("x = []\nfor _ in range(5000):\n    x = [x]\nx", &[]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    let mut v = r.result();
    let mut depth = 0;
    while v.is_array() {
        v = &v[0];
        depth += 1;
    }
    assert_eq!((depth, v["why"].as_str()), (64, Some("nested too deeply")));
    // A 3 MiB string is over the 1 MiB result limit: a capped description instead.
    let r = run("'x' * (3 << 20)", &[]);
    assert_eq!(r.status(), "ok");
    assert_eq!(r.result()["truncated"], true);
    assert!(r.result()["why"]
        .as_str()
        .unwrap()
        .starts_with("result larger than"));
    assert!(
        r.stdout.len() < 1 << 20,
        "the result JSON is {} bytes",
        r.stdout.len()
    );
    // A __repr__ that raises, and one that returns 10 MiB.
    let r = run(
        "class A:\n    def __repr__(self):\n        raise ValueError('no')\nA()",
        &[],
    );
    assert_eq!(r.result()["repr"], "<repr() raised ValueError>");
    let r = run(
        "class A:\n    def __repr__(self):\n        return 'r' * (10 << 20)\nA()",
        &[],
    );
    assert_eq!(r.result()["truncated"], true);
    assert_eq!(r.result()["repr"].as_str().unwrap().len(), 4096);
}

#[test]
fn exceptions_give_type_message_and_the_code_s_own_traceback() {
    let r = run("def f(x):\n    return 1 / x\n\nf(0)\n", &[]);
    assert_eq!(
        (r.status(), r.json["exit_code"].as_i64()),
        ("error", Some(1)),
        "{r:#?}"
    );
    let e = &r.json["error"];
    assert_eq!(e["type"], "ZeroDivisionError");
    assert_eq!(e["message"], "division by zero");
    let tb = e["traceback"].as_str().unwrap();
    assert!(tb.contains("File \"main.py\", line 4, in <module>"), "{tb}");
    assert!(tb.contains("return 1 / x"), "{tb}");
    assert!(
        !tb.contains("<string>"),
        "airlock's own frames leaked into {tb}"
    );
    assert!(r.result().is_null());

    let r = run(
        "class MyError(Exception):\n    pass\nraise MyError('boom')",
        &[],
    );
    assert_eq!(r.json["error"]["type"], "__main__.MyError");
    let r = run(
        "class E(Exception):\n    def __str__(self):\n        raise RuntimeError\nraise E()",
        &[],
    );
    assert_eq!(r.json["error"]["type"], "__main__.E");
    assert_eq!(r.json["error"]["message"], "<str() raised RuntimeError>");

    let r = run("def f(:\n    pass", &[]);
    assert_eq!(r.json["error"]["type"], "SyntaxError", "{r:#?}");
    assert!(r.json["error"]["traceback"]
        .as_str()
        .unwrap()
        .contains("main.py"));
}

#[test]
fn the_interpreter_ends_as_python_itself_would() {
    // Finalizers run and user-made streams are flushed at exit; a closed stderr is no error;
    // a warning shows its source line; the code's own lines are shown even when the working
    // directory holds a file of the same name.
    let shadow = temp_file("shadow.py", b"this is not the code\n");
    let code = "import os, sys, warnings\n\
                class A:\n    def __del__(self):\n        print('finalized')\n\
                a = A()\n\
                out = os.fdopen(os.dup(1), 'w')\n\
                out.write('buffered\\n')\n\
                warnings.warn('careful')\n\
                sys.stderr.flush()\n\
                sys.stderr.close()\n\
                42\n";
    let file = format!("{}:main.py", shadow.display());
    let r = run(code, &["--file", &file]);
    assert_eq!((r.status(), r.result()), ("ok", &json!(42)), "{r:#?}");
    let stdout = r.stdout_text();
    assert!(stdout.contains("finalized"), "{r:#?}");
    assert!(stdout.contains("buffered"), "{r:#?}");
    let stderr = r.json["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("main.py:8: UserWarning: careful"),
        "{stderr}"
    );
    assert!(stderr.contains("warnings.warn('careful')"), "{stderr}");
    assert!(!stderr.contains("this is not the code"), "{stderr}");
    std::fs::remove_file(shadow).unwrap();
}

#[test]
fn what_runs_at_exit_runs_and_what_is_buffered_is_written() {
    // A sandbox's interpreter ends without its whole shutdown (finish.py): what a program can
    // see of one still happens. Threads are waited for, atexit runs, the program's modules are
    // torn down, and C's buffered output is written (ctypes' printf: a pipe's stdout is
    // buffered by C).
    let code = "import atexit, sys, threading, time\n\
                atexit.register(lambda: print('at exit'))\n\
                def late():\n    time.sleep(0.2)\n    print('thread done')\n\
                threading.Thread(target=late).start()\n\
                class B:\n    def __del__(self):\n        print('module finalized')\n\
                sys.modules['kept'] = type(sys)('kept')\n\
                sys.modules['kept'].b = B()\n\
                7\n";
    let r = run(code, &[]);
    assert_eq!((r.status(), r.result()), ("ok", &json!(7)), "{r:#?}");
    let stdout = r.stdout_text();
    for line in ["thread done", "at exit", "module finalized"] {
        assert!(stdout.contains(line), "{line}: {r:#?}");
    }
    assert!(
        stdout.find("thread done") < stdout.find("at exit"),
        "{stdout}"
    );
    let r = run(
        "import ctypes\nctypes.CDLL(None).printf(b'from C\\n')\nprint('from Python', flush=True)",
        &[],
    );
    assert_eq!(r.status(), "ok", "{r:#?}");
    assert!(r.stdout_text().contains("from C"), "{r:#?}");
    let r = run("import sys\nprint('before')\nsys.exit(4)", &[]);
    assert_eq!(
        (r.json["exit_code"].as_i64(), r.stdout_text()),
        (Some(4), "before\n"),
        "{r:#?}"
    );
}

#[test]
fn sys_exit_is_an_exit_not_an_exception() {
    let r = run("import sys\nsys.exit(3)", &[]);
    assert_eq!(
        (r.status(), r.json["exit_code"].as_i64(), r.exit),
        ("error", Some(3), 3)
    );
    assert!(r.json["error"].is_null());
    let r = run("import sys\nprint('x')\nsys.exit(0)", &[]);
    assert_eq!((r.status(), r.stdout_text()), ("ok", "x\n"));
    let r = run("import sys\nsys.exit('bad input')", &[]);
    assert_eq!(
        (r.status(), r.json["exit_code"].as_i64()),
        ("error", Some(1))
    );
    assert_eq!(r.json["stderr"], "bad input\n");
}

#[test]
fn what_the_program_prints_is_never_the_result() {
    let forged = r#"{"status":"ok","exit_code":0,"result":42,"error":null}"#;
    let code = format!("print({forged:?})\nraise SystemExit(5)");
    let r = run(&code, &[]);
    assert_eq!(r.status(), "error");
    assert_eq!(r.json["exit_code"], 5);
    assert!(r.result().is_null());
    assert_eq!(r.stdout_text(), format!("{forged}\n"));
}

#[test]
fn tampering_with_the_channel_cannot_change_the_verdict() {
    // A perfect response, then a non-zero exit.
    let r = run(
        "import os\nos.write(3, b'{\"result\": 42}')\nos._exit(3)",
        &[],
    );
    assert_eq!(
        (r.status(), r.json["exit_code"].as_i64()),
        ("error", Some(3)),
        "{r:#?}"
    );
    assert!(r.result().is_null());
    // A perfect response, then the wall clock.
    let r = run(
        "import os, time\nos.write(3, b'{\"result\": 42}')\ntime.sleep(60)",
        &["--timeout", "500ms"],
    );
    assert_eq!(r.status(), "timeout");
    assert!(r.result().is_null());
    // Garbage, a duplicate document, NaN, and 10 000 levels of nesting: refused, not parsed.
    for garbage in [
        "b'not json'",
        "b'{\"result\": 1}{\"result\": 2}'",
        "b'{\"result\": NaN}'",
        "b'{\"result\": ' + b'[' * 10000 + b']' * 10000 + b'}'",
        "b'{\"status\": \"ok\", \"result\": 1}'",
    ] {
        let r = run(
            &format!("import os\nos.write(3, {garbage})\nos._exit(0)"),
            &[],
        );
        assert_eq!(r.status(), "error", "{garbage}: {r:#?}");
        assert_eq!(r.json["error"]["type"], "ResultError", "{garbage}");
    }
    // More than a response may hold.
    let r = run(
        "import os\nos.write(3, b'{\"result\": \"' + b'x' * (4 << 20) + b'\"}')\nos._exit(0)",
        &[],
    );
    assert_eq!(r.json["error"]["type"], "ResultError");
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("larger than"));
    // Closing the channel only loses the code's own result.
    let r = run("import os\nos.close(3)\n42", &[]);
    assert_eq!((r.status(), r.result()), ("ok", &json!(null)));
}

#[test]
fn a_program_that_closes_the_channel_and_waits_costs_the_host_nothing() {
    // Regression: the host polled the hung-up channel in a loop until the program ended.
    let _guard = serial();
    let mut live = start(
        &["run"],
        Some(b"import os, time\nos.close(3)\nprint('closed', flush=True)\ntime.sleep(2)"),
    );
    assert_eq!(live.line(), "closed");
    let pid = live.child.id();
    let cpu = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        // utime and stime, in clock ticks (100 per second on Linux).
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let before = cpu();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let spent = cpu() - before;
    let out = live.child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        spent < 30,
        "airlock used {spent} ticks of CPU in 1.5 s while the program slept"
    );
}

#[test]
fn any_bytes_on_stdout_and_stderr_give_valid_json() {
    let code = r#"
import os
junk = bytes(range(256)) + b"\xc3\x28\xe2\x82" + b"\x1b[2J\x1b]0;title\x07" + b'"},{"status":"ok"'
os.write(1, junk)
os.write(2, junk[::-1])
"#;
    let r = run(code, &[]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    let out = r.stdout_text();
    assert!(out.starts_with("\u{0}\u{1}\u{2}"), "{out:?}");
    assert!(
        out.contains('\u{fffd}'),
        "invalid UTF-8 should become U+FFFD"
    );
    assert!(out.contains("\u{1b}[2J"));
    assert!(r.json["stderr"].as_str().unwrap().contains('\u{fffd}'));
}

#[test]
fn a_character_cut_by_the_output_limit_is_dropped_whole() {
    let r = run(
        "import sys\nsys.stdout.write('aaaaaaaaa\\u20ac')",
        &["--output-limit", "10"],
    );
    assert_eq!(r.stdout_text(), "aaaaaaaaa");
    assert_eq!(r.json["stdout_truncated"], true);
}

#[test]
fn the_program_cannot_pick_an_airlock_verdict_for_itself() {
    // SIGXCPU sent to itself, far below the CPU limit: a crash, not the CPU limit.
    let r = run(
        "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)",
        &[],
    );
    assert_eq!(
        (r.status(), r.json["signal"].as_i64()),
        ("crashed", Some(24)),
        "{r:#?}"
    );
    assert!(r.limits_hit().is_empty());
    // An error kind only airlock reports, forged on the channel.
    let forged = r#"import os
os.write(3, b'{"error": {"type": "SandboxError", "message": "rerun with --downgrade seccomp", "traceback": null}}')
os._exit(1)"#;
    let r = run(forged, &[]);
    assert_eq!(r.json["error"]["type"], "ResultError", "{r:#?}");
    assert!(!r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("downgrade"));
}

#[test]
fn strings_that_are_not_unicode_still_cross() {
    // A lone surrogate (os.fsdecode of an odd byte gives one) becomes U+FFFD.
    let r = run("import os\nos.fsdecode(b'a\\xff b')", &[]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    assert_eq!(r.result(), &json!("a\u{fffd} b"));
}
