//! `airlock eval` and `POST /v1/eval`: Python literal expressions evaluated natively, through
//! the real binary and the real server on loopback.

use crate::common;

use std::io::Write;
use std::process::Stdio;

use common::http::{request, Server};
use common::*;
use serde_json::{json, Value};

/// `airlock eval ARGS` with stdin, stdout and stderr on pipes.
fn eval_child(args: &[&str]) -> std::process::Child {
    airlock()
        .arg("eval")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn eval_cli(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = eval_child(args);
    let mut input = child.stdin.take().unwrap();
    // From a thread: a large input is answered while it is written.
    let text = stdin.unwrap_or("").to_owned();
    let writer = std::thread::spawn(move || input.write_all(text.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_cli_prints_str_or_the_error_and_exits_accordingly() {
    assert_eq!(
        eval_cli(&["{3, 1, 2} | {0}"], None),
        (0, "{0, 1, 2, 3}\n".into(), String::new())
    );
    assert_eq!(
        eval_cli(&["'a' + 'b'"], None),
        (0, "ab\n".into(), String::new())
    );
    assert_eq!(
        eval_cli(&["result = 2**0.5"], None),
        (0, "1.4142135623730951\n".into(), String::new())
    );
    assert_eq!(
        eval_cli(&["1/0"], None),
        (
            1,
            String::new(),
            "ZeroDivisionError: division by zero\n".into()
        )
    );
    let (code, out, err) = eval_cli(&["__import__('os').system('id')"], None);
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(
        err.starts_with("NotAllowedError: calls are not allowed"),
        "{err}"
    );
}

#[test]
fn errors_say_what_is_accepted_and_the_limit_an_expression_cannot_raise() {
    // A statement: the error says what would have been evaluated.
    let (code, out, err) = eval_cli(&["x = 1 + 1"], None);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        "SyntaxError: Unexpected token at the end of an expression (at offset 2); one \
         expression is evaluated, or `result = <expression>`\n"
    );
    // An int too long to write: the limit, not advice no expression can follow.
    let (code, _, err) = eval_cli(&["10**5000"], None);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "ValueError: Exceeds the limit (4300 digits) for integer string conversion; an int \
         is written with at most 4300 decimal digits (CPython's default, which an expression \
         cannot change)\n"
    );
    let literal = "9".repeat(4301);
    let (code, _, err) = eval_cli(&[&literal], None);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("SyntaxError: Exceeds the limit (4300 digits)"),
        "{err}"
    );
    assert!(
        err.contains("a hexadecimal literal has no such limit"),
        "{err}"
    );
    assert!(!err.contains("set_int_max_str_digits"), "{err}");
    // Which a hexadecimal literal indeed is not held to.
    let hex = format!("0x{} > 0", "f".repeat(4400));
    assert_eq!(eval_cli(&[&hex], None), (0, "True\n".into(), String::new()));
}

#[test]
fn the_cli_evaluates_one_expression_per_line_in_batch_mode() {
    let (code, out, err) = eval_cli(&[], Some("1 + 1\n{'a': 1}['b']\n[1, 2][::-1]\n"));
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (1, "2\n[2, 1]\n", "KeyError: 'b'\n")
    );
    let (code, out, _) = eval_cli(&["--json"], Some("(1, 2.5)\n2**64\n1 +\n'x' * 10**10\n"));
    assert_eq!(code, 1);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[0],
        json!({"ok": true, "type": "tuple", "repr": "(1, 2.5)", "str": "(1, 2.5)", "value": [1, 2.5]})
    );
    // Beyond 64 bits an int is exact in the form execution results use.
    assert_eq!(
        lines[1],
        json!({"ok": true, "type": "int", "repr": "18446744073709551616", "str": "18446744073709551616",
               "value": {"$airlock": "int", "value": "18446744073709551616"}})
    );
    assert_eq!(lines[2]["ok"], false);
    assert_eq!(lines[2]["error"]["type"], "SyntaxError");
    assert_eq!(lines[3]["error"]["type"], "MemoryError");
    assert_eq!(lines[3]["error"]["limit"], true);
    assert_eq!(lines.len(), 4);
    // Non-finite floats too, inside containers; a dict with the forms' key has no exact JSON.
    let (code, out, _) = eval_cli(
        &["--json"],
        Some(
            "[1e500, -1e500, 1e500 - 1e500, -2**70]\n{'$airlock': 'int', 'value': '5'}\n10**4299\n",
        ),
    );
    assert_eq!(code, 0, "{out}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[0]["value"],
        json!([{"$airlock": "float", "value": "inf"}, {"$airlock": "float", "value": "-inf"},
               {"$airlock": "float", "value": "nan"},
               {"$airlock": "int", "value": "-1180591620717411303424"}])
    );
    assert_eq!(
        lines[0]["repr"],
        "[inf, -inf, nan, -1180591620717411303424]"
    );
    assert!(lines[1].get("value").is_none(), "{}", lines[1]);
    assert_eq!(lines[1]["repr"], "{'$airlock': 'int', 'value': '5'}");
    assert_eq!(
        lines[2]["value"],
        json!({"$airlock": "int", "value": format!("1{}", "0".repeat(4299))})
    );
    // All good: exit 0.
    let (code, out, _) = eval_cli(&["--json"], Some("1\n2\n"));
    assert_eq!((code, out.lines().count()), (0, 2));
}

/// `airlock eval … | head`: quiet, every expression still evaluated for the status.
#[test]
fn a_closed_stdout_ends_quietly_with_the_usual_status() {
    let mut one = airlock();
    one.args(["eval", "[1, 2] * 3"]);
    assert_eq!(with_stdout_gone(one, None).0.code(), Some(0));
    let lines = "'x' * 100\n".repeat(5_000);
    let mut batch = airlock();
    batch.args(["eval", "--json"]);
    let (status, stderr) = with_stdout_gone(batch, Some(&format!("{lines}1/0\n")));
    assert_eq!((status.code(), &*stderr), (Some(1), ""));
}

/// A batch is shared between worker threads; the answers still come in the order of the
/// lines, one each, however the work was split.
#[test]
fn a_large_batch_is_answered_line_for_line_in_order() {
    let lines: String = (0..30_000u64)
        .map(|i| {
            if i % 7 == 3 {
                format!("{i} / 0\n")
            } else {
                format!("{i} * 3\n")
            }
        })
        .collect();
    let (code, out, err) = eval_cli(&["--json"], Some(&lines));
    assert_eq!((code, err.as_str()), (1, ""));
    let answers: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 30_000);
    for (i, answer) in answers.iter().enumerate() {
        if i % 7 == 3 {
            assert_eq!(answer["error"]["type"], "ZeroDivisionError", "line {i}");
        } else {
            assert_eq!(answer["value"], json!(i * 3), "line {i}");
        }
    }
    // Text mode: answers on stdout, errors on stderr, each in its order.
    let (code, out, err) = eval_cli(&[], Some(&lines));
    assert_eq!(code, 1);
    let expected: Vec<String> = (0..30_000u64)
        .filter(|i| i % 7 != 3)
        .map(|i| (i * 3).to_string())
        .collect();
    assert_eq!(out.lines().collect::<Vec<_>>(), expected);
    assert_eq!(
        err.lines().count(),
        (0..30_000).filter(|i| i % 7 == 3).count()
    );
}

/// A caller that writes an expression and waits for its answer before the next gets it: the
/// answers are flushed whenever they catch up with the input, not only at the end.
#[test]
fn each_line_is_answered_before_the_next_is_written() {
    use std::io::{BufRead, BufReader};
    let mut child = eval_child(&["--json"]);
    let mut input = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    for i in 0..5u64 {
        writeln!(input, "{i} + 1").unwrap();
        input.flush().unwrap();
        let answer = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("no answer to a line before the next one");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["value"], json!(i + 1));
    }
    drop(input);
    assert!(child.wait().unwrap().success());
}

/// Answers of a megabyte each, read slowly: what waits in the process stays bounded (a part
/// of a job is held until it is written), whatever the batch's size.
#[test]
fn large_answers_read_slowly_keep_the_process_small() {
    use std::io::Read;
    const LINES: usize = 120;
    let mut child = std::process::Command::new("/usr/bin/time")
        .args(["-f", "maxrss_kib=%M"])
        .arg(env!("CARGO_BIN_EXE_airlock"))
        .args(["eval"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let _ = input.write_all("'x' * 10**6\n".repeat(LINES).as_bytes());
    });
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0;
    loop {
        let n = stdout.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(total, LINES * 1_000_001);
    let err = String::from_utf8(out.stderr).unwrap();
    let kib: u64 = err
        .trim()
        .strip_prefix("maxrss_kib=")
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("no maximum RSS in {err:?}"));
    // 120 MB of answers; the process holds a few parts of about a megabyte at a time.
    assert!(kib < 48 << 10, "airlock eval grew to {kib} KiB");
}

fn post_eval(server: &Server, key: Option<&str>, body: &[u8]) -> common::http::Response {
    let mut headers = vec![("Content-Type".to_owned(), "application/json".to_owned())];
    if let Some(k) = key {
        headers.push(("Authorization".into(), format!("Bearer {k}")));
    }
    request(server.addr, "POST", "/v1/eval", &headers, Some(body))
}

/// The server's child processes (sandboxes are its children).
fn children(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(list.split_whitespace().map(str::to_owned));
    }
    out
}

#[test]
fn the_service_evaluates_for_a_key_counts_and_never_starts_a_sandbox() {
    let _g = serial();
    // No warm pool: any sandbox would be a child started for this request.
    let server = Server::start(
        "[pool]\nsize = 0\nmax_size = 0\n[eval]\nmax_int_bits = 256\n",
        &[],
    );
    // The start-up trial run's sandbox is gone once the server answers.
    let before = children(server.child.id());
    let r = post_eval(
        &server,
        Some(common::http::KEY),
        br#"{"expression": "[1, 2.5, 'x', None]"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"ok": true, "type": "list", "repr": "[1, 2.5, 'x', None]", "str": "[1, 2.5, 'x', None]", "value": [1, 2.5, "x", null]})
    );
    let r = post_eval(
        &server,
        Some(common::http::KEY),
        br#"{"expression": "1 // 0"}"#,
    );
    assert_eq!(
        r.json(),
        json!({"ok": false, "error": {"type": "ZeroDivisionError", "message": "integer division or modulo by zero"}})
    );
    // The configured budget applies.
    let r = post_eval(
        &server,
        Some(common::http::KEY),
        br#"{"expression": "2**300"}"#,
    );
    assert_eq!(r.json()["error"]["type"], "MemoryError");
    assert_eq!(r.json()["error"]["limit"], true);
    assert_eq!(
        children(server.child.id()),
        before,
        "no process was started"
    );

    // Authenticated like everything else; the body is checked like everything else.
    assert_eq!(
        post_eval(&server, None, br#"{"expression": "1"}"#).status,
        401
    );
    assert_eq!(
        post_eval(&server, Some("wrong-key"), br#"{"expression": "1"}"#).status,
        401
    );
    let r = post_eval(
        &server,
        Some(common::http::KEY),
        br#"{"expression": "1", "code": "x"}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = post_eval(&server, Some(common::http::KEY), br#"{"expr": "1"}"#);
    assert_eq!(r.status, 400, "{}", r.text());

    let metrics = server.call("GET", "/metrics", None).text();
    for line in [
        "airlock_evaluations_total{outcome=\"ok\"} 1",
        "airlock_evaluations_total{outcome=\"ZeroDivisionError\"} 1",
        "airlock_evaluations_total{outcome=\"MemoryError\"} 1",
        "airlock_http_requests_total{route=\"/v1/eval\",code=\"200\"} 3",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    // Every status's series exists from the start, at zero: none counted one.
    let counted: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("airlock_executions_total{") && !l.ends_with(" 0"))
        .collect();
    assert!(counted.is_empty(), "no execution ran: {counted:?}");
    assert!(metrics.contains("airlock_executions_total{status=\"ok\"} 0\n"));
    let spec = server.call("GET", "/openapi.json", None).json();
    assert!(spec["paths"]["/v1/eval"]["post"].is_object());
}

#[test]
fn expressions_beyond_max_running_wait_their_turn() {
    let _g = serial();
    let server = Server::start(
        "[pool]\nsize = 0\nmax_size = 0\n[eval]\nmax_running = 1\ntimeout_ms = 3000\n",
        &[],
    );
    // Each compares 100 million shared elements: it holds its turn until its clock runs out.
    let slow = br#"{"expression": "[[[[0] * 100] * 100] * 100] * 100 == [[[[0] * 100] * 100] * 100] * 100"}"#;
    let addr = server.addr;
    let send = move || {
        let headers = vec![
            ("Content-Type".to_owned(), "application/json".to_owned()),
            (
                "Authorization".to_owned(),
                format!("Bearer {}", common::http::KEY),
            ),
        ];
        request(addr, "POST", "/v1/eval", &headers, Some(slow)).json()
    };
    let first = std::thread::spawn(send);
    let second = std::thread::spawn(send);
    // One of them waits while the other runs.
    let mut saw_waiting = false;
    for _ in 0..200 {
        let metrics = server.call("GET", "/metrics", None).text();
        if metrics.contains("airlock_evaluations_waiting 1") {
            saw_waiting = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(saw_waiting, "the second expression waited for the first");
    for answer in [first.join().unwrap(), second.join().unwrap()] {
        assert_eq!(answer["error"]["type"], "TimeoutError", "{answer}");
    }
    let metrics = server.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_evaluations_waiting 0"),
        "{metrics}"
    );
}
