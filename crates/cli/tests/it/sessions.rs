//! Sessions through the real server: state kept across cells, one owner, limits over the whole
//! session, verdicts that end it clearly, reaping, files in and out without following what the
//! sandbox planted, and nothing left on the host.

use crate::common;

use std::time::{Duration, Instant};

use common::http::{request, Server, KEY};
use common::*;
use serde_json::{json, Value};

const OTHER_KEY: &str = "other-key-0123456789abcdef";

fn with_other_key(extra: &str) -> String {
    let hash = format!("sha256:{}", airlock_api::sha256_hex(OTHER_KEY.as_bytes()));
    format!("{extra}\n[[keys]]\nname = \"other\"\nhash = \"{hash}\"\n")
}

fn call(
    server: &Server,
    key: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    json: bool,
) -> common::http::Response {
    call_at(server.addr, key, method, path, body, json)
}

fn call_at(
    addr: std::net::SocketAddr,
    key: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    json: bool,
) -> common::http::Response {
    let mut headers = vec![("Authorization".to_owned(), format!("Bearer {key}"))];
    if json {
        headers.push(("Content-Type".to_owned(), "application/json".to_owned()));
    }
    request(addr, method, path, &headers, body)
}

fn create(server: &Server, body: Value) -> String {
    let r = server.call("POST", "/v1/sessions", Some(&body));
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["id"].as_str().unwrap().to_owned()
}

fn cell(server: &Server, id: &str, body: Value) -> Value {
    let r = server.call("POST", &format!("/v1/sessions/{id}/execute"), Some(&body));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn a_session_keeps_variables_imports_and_files_between_cells() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let id = create(
        &server,
        json!({"env": {"MODE": "fast"}, "files": [{"path": "data/in.txt", "content": "seed"}]}),
    );
    let r = cell(
        &server,
        &id,
        json!({"code": "import math\nx = 41\nopen('made.txt', 'w').write(open('data/in.txt').read())\nprint('one')"}),
    );
    assert_eq!(
        (&r["status"], &r["stdout"], &r["session_ended"]),
        (&json!("ok"), &json!("one\n"), &json!(false)),
        "{r}"
    );
    assert!(r["id"].as_str().unwrap().starts_with("ex_"));
    // The next cell sees all of it; its own output only.
    let r = cell(
        &server,
        &id,
        json!({"code": "import os\nprint('two')\n[x + 1, math.floor(2.5), open('made.txt').read(), os.environ['MODE']]"}),
    );
    assert_eq!(r["result"], json!([42, 2, "seed", "fast"]), "{r}");
    assert_eq!(r["stdout"], "two\n");
    // Function mode, an exception (which does not end the session), a chart.
    let r = cell(
        &server,
        &id,
        json!({"code": "def add(a):\n    return a + x", "entrypoint": "add", "inputs": {"a": 1}}),
    );
    assert_eq!(r["result"], 42, "{r}");
    let r = cell(&server, &id, json!({"code": "1 / 0"}));
    assert_eq!(
        (&r["status"], &r["error"]["type"], &r["session_ended"]),
        (&json!("error"), &json!("ZeroDivisionError"), &json!(false))
    );
    assert!(
        r["error"]["traceback"]
            .as_str()
            .unwrap()
            .contains("cell4.py"),
        "{r}"
    );
    let r = cell(
        &server,
        &id,
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nx"}),
    );
    assert_eq!(
        (&r["result"], &r["outputs"][0]["type"]),
        (&json!(41), &json!("image/png")),
        "{r}"
    );
    // Its state, as its owner sees it; the sandbox is the same throughout.
    let info = server
        .call("GET", &format!("/v1/sessions/{id}"), None)
        .json();
    assert_eq!(
        (&info["cells"], &info["ended"]),
        (&json!(5), &Value::Null),
        "{info}"
    );
    assert_eq!(info["limits"]["timeout_ms"], 30000);
    let list = server.call("GET", "/v1/sessions", None).json();
    assert_eq!(list["sessions"][0]["id"], id.as_str());
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1);
    // One request at a time: another gets 409 while a cell runs.
    let path = format!("/v1/sessions/{id}/execute");
    std::thread::scope(|s| {
        let addr = server.addr;
        let slow_path = path.clone();
        let slow = s.spawn(move || {
            let body = br#"{"code": "import time\ntime.sleep(1.5)\n'slow'"}"#;
            call_at(addr, KEY, "POST", &slow_path, Some(body.as_slice()), true).json()
        });
        std::thread::sleep(Duration::from_millis(500));
        let r = server.call("POST", &path, Some(&json!({"code": "1"})));
        assert_eq!(
            (r.status, r.error_code()),
            (409, "session_busy".into()),
            "{}",
            r.text()
        );
        assert_eq!(slow.join().unwrap()["result"], "slow");
    });
    let metrics = server.call("GET", "/metrics", None).text();
    assert!(metrics.contains("airlock_sessions_open 1\n"), "{metrics}");
    assert!(
        metrics.contains("airlock_sessions_started_total 1\n"),
        "{metrics}"
    );
    // Closed: gone, and its sandbox with it, before the answer.
    let r = server.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(r.status, 204);
    assert!(sandbox_processes().is_empty(), "{:#?}", sandbox_processes());
    assert_eq!(
        server
            .call("GET", &format!("/v1/sessions/{id}"), None)
            .status,
        404
    );
    let metrics = server.call("GET", "/metrics", None).text();
    assert!(metrics.contains("airlock_sessions_open 0\n"), "{metrics}");
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after the session and the server");
}

#[test]
fn a_session_is_its_key_s_alone() {
    let _g = serial();
    let server = Server::start(&with_other_key(""), &[]);
    let id = create(&server, json!({}));
    let path = format!("/v1/sessions/{id}");
    for (method, route, body) in [
        ("GET", path.clone(), None),
        ("DELETE", path.clone(), None),
        (
            "POST",
            format!("{path}/execute"),
            Some(br#"{"code": "1"}"#.as_slice()),
        ),
        ("GET", format!("{path}/files"), None),
        ("GET", format!("{path}/files/x"), None),
        ("PUT", format!("{path}/files/x"), Some(b"data".as_slice())),
    ] {
        let r = call(&server, OTHER_KEY, method, &route, body, method == "POST");
        assert_eq!(r.status, 404, "{method} {route}: {}", r.text());
    }
    let theirs = call(&server, OTHER_KEY, "GET", "/v1/sessions", None, false).json();
    assert_eq!(theirs["sessions"], json!([]));
    // Still there for its owner.
    let r = cell(&server, &id, json!({"code": "'mine'"}));
    assert_eq!(r["result"], "mine");
    // Without a key: 401, as everywhere.
    let r = request(server.addr, "GET", "/v1/sessions", &[], None);
    assert_eq!(r.status, 401);
    let _ = KEY;
}

#[test]
fn idle_and_expired_sessions_are_closed_and_their_sandboxes_destroyed() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let idle = create(&server, json!({"idle_timeout_ms": 1000}));
    let old = create(
        &server,
        json!({"max_lifetime_ms": 3000, "idle_timeout_ms": 60000}),
    );
    // Kept busy, the second still dies at its lifetime.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut idle_gone = false;
    loop {
        let r = server.call("GET", &format!("/v1/sessions/{old}"), None);
        if r.status == 404 {
            break;
        }
        idle_gone |= server
            .call("GET", &format!("/v1/sessions/{idle}"), None)
            .status
            == 404;
        assert!(
            Instant::now() < deadline,
            "the session outlived its lifetime"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        idle_gone,
        "the idle session was not closed before the old one"
    );
    // Their sandboxes are gone too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sandbox_processes().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(sandbox_processes().is_empty(), "{:#?}", sandbox_processes());
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after reaping");
}

#[test]
fn limits_cover_the_whole_session_and_a_limit_ends_it_clearly() {
    let _g = serial();
    let server = Server::start("", &[]);
    // Memory: 100 MB kept by one cell and 100 MB more in the next exceed 160 MB together.
    let id = create(&server, json!({"limits": {"memory_mb": 160}}));
    let r = cell(
        &server,
        &id,
        json!({"code": "a = bytearray(100 << 20)\nlen(a)"}),
    );
    assert_eq!(r["status"], "ok", "{r}");
    let r = cell(
        &server,
        &id,
        json!({"code": "b = bytearray(100 << 20)\nlen(b)"}),
    );
    assert_eq!(
        (&r["status"], &r["session_ended"]),
        (&json!("memory_limit"), &json!(true)),
        "{r}"
    );
    assert!(r["limits_hit"]
        .as_array()
        .unwrap()
        .contains(&json!("memory")));
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(&json!({"code": "1"})),
    );
    assert_eq!(
        (r.status, r.error_code()),
        (409, "session_ended".into()),
        "{}",
        r.text()
    );
    assert!(r.text().contains("memory_limit"));
    let info = server
        .call("GET", &format!("/v1/sessions/{id}"), None)
        .json();
    assert_eq!(info["ended"], "memory_limit");
    server.call("DELETE", &format!("/v1/sessions/{id}"), None);

    // Disk: files of earlier cells count against the same tmpfs.
    let id = create(&server, json!({"limits": {"disk_mb": 8}}));
    let r = cell(
        &server,
        &id,
        json!({"code": "open('a', 'wb').write(b'x' * (5 << 20))"}),
    );
    assert_eq!(r["status"], "ok", "{r}");
    let r = cell(
        &server,
        &id,
        json!({"code": "open('b', 'wb').write(b'x' * (5 << 20))"}),
    );
    assert_eq!(r["error"]["type"], "OSError", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("No space"),
        "{r}"
    );
    assert_eq!(r["session_ended"], false);

    // A cell's wall clock: reaching it ends the session with `timeout`.
    let r = cell(
        &server,
        &id,
        json!({"code": "import time\ntime.sleep(30)", "timeout_ms": 300}),
    );
    assert_eq!(
        (
            &r["status"],
            &r["session_ended"],
            &r["limits"]["timeout_ms"]
        ),
        (&json!("timeout"), &json!(true), &json!(300)),
        "{r}"
    );
    server.call("DELETE", &format!("/v1/sessions/{id}"), None);

    // sys.exit() ends the interpreter, so the session, with its code.
    let id = create(&server, json!({}));
    let r = cell(&server, &id, json!({"code": "import sys\nsys.exit(3)"}));
    assert_eq!(
        (&r["status"], &r["exit_code"], &r["session_ended"]),
        (&json!("error"), &json!(3), &json!(true)),
        "{r}"
    );
}

#[test]
fn files_go_in_and_out_and_planted_links_are_never_followed() {
    let _g = serial();
    let server = Server::start("", &[]);
    let id = create(&server, json!({}));
    let files = format!("/v1/sessions/{id}/files");
    let blob: Vec<u8> = (0..=255).cycle().take(100_000).collect();
    let r = call(
        &server,
        KEY,
        "PUT",
        &format!("{files}/in/blob.bin"),
        Some(&blob),
        false,
    );
    assert_eq!(r.status, 204, "{}", r.text());
    // The code sees it, and writes its own.
    let r = cell(
        &server,
        &id,
        json!({"code": "data = open('in/blob.bin', 'rb').read()\nopen('out.txt', 'w').write(str(len(data)))\nimport os\nos.symlink('/etc/passwd', 'passwd')\nos.mkdir('real')\nos.symlink('real', 'dirlink')\nos.mkfifo('fifo')\nlen(data)"}),
    );
    assert_eq!(r["result"], 100_000, "{r}");
    let r = call(
        &server,
        KEY,
        "GET",
        &format!("{files}/in/blob.bin"),
        None,
        false,
    );
    assert_eq!((r.status, r.body == blob), (200, true));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    let r = call(
        &server,
        KEY,
        "GET",
        &format!("{files}/out.txt"),
        None,
        false,
    );
    assert_eq!((r.status, r.text()), (200, "100000".to_owned()));
    // The listing shows links as links, never what they point to.
    let list = server.call("GET", &files, None).json();
    let entries: Vec<(String, String)> = list["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for want in [
        ("passwd", "link"),
        ("dirlink", "link"),
        ("fifo", "other"),
        ("in/blob.bin", "file"),
        ("real", "dir"),
    ] {
        assert!(
            entries.contains(&(want.0.into(), want.1.into())),
            "{want:?} in {entries:?}"
        );
    }
    // Planted links and special files: refused, not followed, not opened.
    for path in ["passwd", "dirlink/x", "fifo", "real"] {
        let r = call(&server, KEY, "GET", &format!("{files}/{path}"), None, false);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    let r = call(
        &server,
        KEY,
        "PUT",
        &format!("{files}/passwd"),
        Some(b"x"),
        false,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = call(
        &server,
        KEY,
        "PUT",
        &format!("{files}/dirlink/new"),
        Some(b"x"),
        false,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = cell(
        &server,
        &id,
        json!({"code": "import os\nsorted(os.listdir('real'))"}),
    );
    assert_eq!(r["result"], json!([]), "a write went through the link: {r}");
    // Paths that leave the working directory never reach the sandbox.
    for path in ["../etc/passwd", "%2e%2e/x", "a/../../b", "/etc/passwd"] {
        let r = call(&server, KEY, "GET", &format!("{files}/{path}"), None, false);
        assert!(
            r.status == 400 || r.status == 404,
            "{path}: {} {}",
            r.status,
            r.text()
        );
    }
    let r = call(
        &server,
        KEY,
        "GET",
        &format!("{files}/missing"),
        None,
        false,
    );
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn a_key_s_sessions_are_bounded() {
    let _g = serial();
    let server = Server::start("[sessions]\nmax_open_per_key = 2\n", &[]);
    create(&server, json!({}));
    create(&server, json!({}));
    let r = server.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(
        (r.status, r.error_code()),
        (429, "rate_limited".into()),
        "{}",
        r.text()
    );
    // Settings a request may only lower.
    let r = server.call(
        "POST",
        "/v1/sessions",
        Some(&json!({"idle_timeout_ms": 999_999_999})),
    );
    assert_eq!(r.status, 400);
    // A lifetime too short for its interpreter to start is the request's error, not a 503;
    // so is an idle timeout that could end it before the request after its creation
    // (schemathesis made one of 1 ms, then found the session gone).
    for (field, ms) in [
        ("max_lifetime_ms", 2),
        ("idle_timeout_ms", 1),
        ("idle_timeout_ms", 999),
    ] {
        let r = server.call("POST", "/v1/sessions", Some(&json!({ field: ms })));
        assert_eq!(
            (
                r.status,
                r.error_code(),
                r.json()["error"]["field"].as_str()
            ),
            (400, "invalid_request".into(), Some(field)),
            "{}",
            r.text()
        );
    }
    let r = server.call(
        "POST",
        "/v1/sessions",
        Some(&json!({"limits": {"memory_mb": 1_000_000}})),
    );
    assert_eq!(r.status, 400);
    drop(server);
    // The server's own cap; a session that has ended counts for neither.
    let server = Server::start("[sessions]\nmax_open = 1\n", &[]);
    let first = create(&server, json!({}));
    let r = server.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(
        (r.status, r.error_code()),
        (503, "overloaded".into()),
        "{}",
        r.text()
    );
    let r = cell(&server, &first, json!({"code": "import sys\nsys.exit(0)"}));
    assert_eq!(r["session_ended"], true, "{r}");
    create(&server, json!({}));
}

#[test]
fn a_client_that_leaves_mid_cell_closes_its_session_and_shutdown_closes_the_rest() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let id = create(&server, json!({}));
    let kept = create(&server, json!({}));
    let body = json!({"code": "import time\ntime.sleep(60)"}).to_string();
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    use std::io::Write;
    write!(
        s,
        "POST /v1/sessions/{id}/execute HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = server
            .call("GET", &format!("/v1/sessions/{id}"), None)
            .json();
        if !info["ended"].is_null() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the session outlived its client: {info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The other session still works; then the server stops with it open.
    assert_eq!(cell(&server, &kept, json!({"code": "2 + 2"}))["result"], 4);
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after shutdown with a session open");
}

#[test]
fn hostile_cells_cannot_outlast_their_deadline_or_blur_their_verdict() {
    let _g = serial();
    let server = Server::start("", &[]);
    // Writers faster than the host reads: the deadline still holds.
    let id = create(&server, json!({"limits": {"output_bytes": 1024}}));
    let flood = "import os, threading\n\
                 def spam():\n    while True:\n        os.write(1, b'x' * 4096)\n\
                 for _ in range(4):\n    threading.Thread(target=spam, daemon=True).start()\n\
                 spam()";
    let r = cell(&server, &id, json!({"code": flood, "timeout_ms": 500}));
    assert_eq!(
        (&r["status"], &r["session_ended"], &r["stdout_truncated"]),
        (&json!("timeout"), &json!(true), &json!(true)),
        "{}",
        r["status"]
    );
    assert!(
        r["usage"]["wall_ms"].as_u64().unwrap() < 10_000,
        "{}",
        r["usage"]
    );

    // A child killed at the memory limit is reported, the session goes on; a later
    // self-inflicted SIGKILL is a crash, not that earlier memory kill.
    let id = create(&server, json!({"limits": {"memory_mb": 160}}));
    let r = cell(
        &server,
        &id,
        json!({"code": "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'bytearray(300 << 20)']).returncode"}),
    );
    assert_eq!(
        (&r["status"], &r["result"], &r["session_ended"]),
        (&json!("ok"), &json!(-9), &json!(false)),
        "{r}"
    );
    assert_eq!(r["limits_hit"], json!(["memory"]), "{r}");
    let r = cell(&server, &id, json!({"code": "'fine'"}));
    assert_eq!(
        (&r["result"], &r["limits_hit"]),
        (&json!("fine"), &json!([]))
    );
    let r = cell(
        &server,
        &id,
        json!({"code": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"}),
    );
    assert_eq!(
        (&r["status"], &r["signal"], &r["session_ended"]),
        (&json!("crashed"), &json!(9), &json!(true)),
        "{r}"
    );

    // Outputs, then sys.exit(): the exit decides, and ends the session.
    let id = create(&server, json!({}));
    let r = cell(
        &server,
        &id,
        json!({"code": "display('shown')\nimport sys\nsys.exit(3)"}),
    );
    assert_eq!(
        (&r["status"], &r["exit_code"], &r["session_ended"]),
        (&json!("error"), &json!(3), &json!(true)),
        "{r}"
    );

    // The code closes the channel and lives on: its own error, the session ended.
    let id = create(&server, json!({}));
    let r = cell(
        &server,
        &id,
        json!({"code": "import os, time\nos.close(3)\ntime.sleep(30)"}),
    );
    assert_eq!(
        (&r["status"], &r["error"]["type"], &r["session_ended"]),
        (&json!("error"), &json!("ResultError"), &json!(true)),
        "{r}"
    );

    // Inputs are counted before they are parsed.
    let many = format!("[{}]", vec!["[]"; 60_000].join(","));
    let body =
        format!(r#"{{"code": "def f(a): pass", "entrypoint": "f", "inputs": {{"a": {many}}}}}"#);
    let r = call(
        &server,
        KEY,
        "POST",
        "/v1/execute",
        Some(body.as_bytes()),
        true,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("more than 50000"), "{}", r.text());
}

#[test]
fn cpu_time_covers_the_session_while_output_and_the_clock_are_per_cell() {
    let _g = serial();
    let server = Server::start("", &[]);
    // CPU time: 1.5 s for the whole session; two cells of about 1 s each exceed it.
    let id = create(
        &server,
        json!({"limits": {"cpu_ms": 1500, "output_bytes": 10}}),
    );
    let burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass\n'burnt'";
    let r = cell(&server, &id, json!({"code": burn}));
    assert_eq!(r["result"], "burnt", "{r}");
    // Output: each cell has its own limit.
    let r = cell(&server, &id, json!({"code": "print('x' * 20)"}));
    assert_eq!(
        (&r["stdout"], &r["stdout_truncated"]),
        (&json!("xxxxxxxxxx"), &json!(true))
    );
    let r = cell(&server, &id, json!({"code": "print('short')"}));
    assert_eq!(
        (&r["stdout"], &r["stdout_truncated"]),
        (&json!("short\n"), &json!(false))
    );
    // No standard input: EOF at once.
    let r = cell(
        &server,
        &id,
        json!({"code": "import sys\nsys.stdin.read()"}),
    );
    assert_eq!(r["result"], "", "{r}");
    // A cell's own clock may not pass the key's ceiling.
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(&json!({"code": "1", "timeout_ms": 999_999_999})),
    );
    assert_eq!(
        (r.status, r.error_code()),
        (400, "limit_above_ceiling".into()),
        "{}",
        r.text()
    );
    let r = cell(&server, &id, json!({"code": burn}));
    assert_eq!(
        (&r["status"], &r["session_ended"]),
        (&json!("cpu_limit"), &json!(true)),
        "{r}"
    );

    // What background work prints between cells reaches the next cell.
    let id = create(&server, json!({}));
    let r = cell(
        &server,
        &id,
        json!({"code": "import threading, time\ndef later():\n    time.sleep(0.3)\n    print('from the background', flush=True)\nthreading.Thread(target=later).start()"}),
    );
    assert_eq!(r["stdout"], "", "{r}");
    let r = cell(
        &server,
        &id,
        json!({"code": "import time\ntime.sleep(0.6)\nprint('mine')"}),
    );
    assert_eq!(r["stdout"], "from the background\nmine\n", "{r}");
}
