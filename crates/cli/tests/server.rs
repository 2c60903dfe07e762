//! `airlock serve`, started for real on a loopback port and driven over HTTP: results, every
//! hardening item, concurrency overflow and shutdown. THREAT-MODEL: HTTP; seed 003's HTTP items.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::http::{closed_within, read_response, request, Server, KEY};
use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn h(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

fn auth() -> (String, String) {
    h("Authorization", &format!("Bearer {KEY}"))
}

fn json_type() -> (String, String) {
    h("Content-Type", "application/json")
}

/// A second key for the tests that need two: its plaintext and its config entry.
const OTHER_KEY: &str = "other-key-0123456789abcdef";

fn other_key_toml(extra: &str) -> String {
    let hash = format!("sha256:{:x}", Sha256::digest(OTHER_KEY.as_bytes()));
    format!("[[keys]]\nname = \"other\"\nhash = \"{hash}\"\n{extra}\n")
}

fn as_other(
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> common::http::Response {
    let mut headers = vec![h("Authorization", &format!("Bearer {OTHER_KEY}"))];
    if body.is_some() {
        headers.push(json_type());
    }
    let body = body.map(|b| b.to_string().into_bytes());
    request(server.addr, method, path, &headers, body.as_deref())
}

#[test]
fn an_execution_returns_its_result_with_an_id_and_leaves_an_audit_record() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let code = "import os\nprint('hi')\nos.environ['SECRET']";
    let r = server.execute(json!({
        "code": code,
        "env": {"SECRET": "environment-value-9f3"},
        "stdin": "",
        "files": [{"path": "data/in.txt", "content": "aGVsbG8=", "encoding": "base64"}],
        "limits": {"timeout_ms": 5000, "memory_mb": 128, "output_bytes": 4096}
    }));
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(
        (body["status"].as_str(), body["stdout"].as_str()),
        (Some("ok"), Some("hi\n"))
    );
    assert_eq!(body["result"], "environment-value-9f3");
    assert_eq!(body["limits"]["memory_mb"], 128);
    assert_eq!(body["isolation"]["network"], "none");
    let id = body["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("ex_"));
    assert!(r.header("x-request-id").unwrap().starts_with("rq_"));

    let record = server.call("GET", &format!("/v1/executions/{id}"), None);
    assert_eq!(record.status, 200);
    let record = record.json();
    assert_eq!(record["key"], "env");
    assert_eq!(record["status"], "ok");
    assert_eq!(
        record["code_sha256"],
        format!("{:x}", Sha256::digest(code.as_bytes()))
    );
    assert_eq!(record["request_id"], r.header("x-request-id").unwrap());
    let audit = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    assert!(audit.contains(&id));
    for secret in [KEY, "environment-value-9f3", "print('hi')"] {
        assert!(!audit.contains(secret), "the audit log holds {secret:?}");
    }
    assert!(!server
        .log_lines()
        .iter()
        .any(|l| l.contains(KEY) || l.contains("environment-value-9f3")));
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"server");
}

#[test]
fn a_sandbox_verdict_is_a_200_with_its_status() {
    let _g = serial();
    let server = Server::start("", &[]);
    let r = server.execute(json!({"code": "while True:\n    pass", "limits": {"timeout_ms": 500}}));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "timeout");
    let r = server
        .execute(json!({"code": "import ctypes\nctypes.CDLL(None).syscall(101, 0, 0, 0, 0)"}));
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (200, Some("policy_violation"))
    );
    let hog = "x = bytearray(256 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1";
    let r = server.execute(json!({"code": hog, "limits": {"memory_mb": 32}}));
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (200, Some("memory_limit"))
    );
    let metrics = server.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_executions_total{status=\"timeout\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("airlock_security_events_total{kind=\"seccomp_kill\"} 1"));
    assert!(metrics.contains("airlock_security_events_total{kind=\"timeout\"} 1"));
    assert!(metrics.contains("airlock_security_events_total{kind=\"memory_kill\"} 1"));
    assert!(metrics.contains("airlock_sandbox_start_seconds_count 3"));
}

#[test]
fn every_route_but_healthz_needs_a_valid_key() {
    let _g = serial();
    let server = Server::start("", &[]);
    let health = request(server.addr, "GET", "/healthz", &[], None);
    assert_eq!(
        (health.status, health.json()),
        (200, json!({"status": "ok"}))
    );
    let wrong = "wrong-key-that-must-never-be-logged";
    for (method, path) in airlock_server::ROUTES {
        if *path == "/healthz" {
            continue;
        }
        let path = path.replace("{id}", "ex_0");
        for headers in [
            vec![],
            vec![h("Authorization", &format!("Bearer {wrong}"))],
            vec![h("Authorization", KEY)],
        ] {
            let r = request(server.addr, method, &path, &headers, None);
            assert_eq!(r.status, 401, "{method} {path} with {headers:?}");
            assert_eq!(
                r.header("www-authenticate"),
                Some("Bearer realm=\"airlock\"")
            );
            assert_eq!(r.error_code(), "unauthorized");
        }
    }
    let metrics = server.call("GET", "/metrics", None).text();
    let failures = 3 * (airlock_server::ROUTES.len() - 1);
    assert!(
        metrics.contains(&format!(
            "airlock_security_events_total{{kind=\"auth_failure\"}} {failures}"
        )),
        "{metrics}"
    );
    let log = server.log_lines().join("\n");
    assert!(log.contains("authentication failed"), "{log}");
    assert!(!log.contains(wrong), "a presented key was logged");
}

#[test]
fn scopes_are_enforced_and_records_belong_to_their_key() {
    let _g = serial();
    let server = Server::start(&other_key_toml("scopes = [\"execute\"]"), &[]);
    let mine = server.execute(json!({"code": "1"})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let theirs = as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "2"})));
    assert_eq!(theirs.status, 200);
    let theirs = theirs.json()["id"].as_str().unwrap().to_owned();
    // The other key may execute, but not read records or metrics.
    assert_eq!(
        as_other(&server, "GET", &format!("/v1/executions/{theirs}"), None).status,
        403
    );
    assert_eq!(as_other(&server, "GET", "/metrics", None).status, 403);
    // Another key's record is as absent as a record that never was.
    assert_eq!(
        server
            .call("GET", &format!("/v1/executions/{theirs}"), None)
            .status,
        404
    );
    assert_eq!(
        server
            .call("GET", &format!("/v1/executions/{mine}"), None)
            .status,
        200
    );
    assert_eq!(
        server.call("GET", "/v1/executions/ex_missing", None).status,
        404
    );
}

#[test]
fn cors_is_off_by_default_and_exact_when_configured() {
    let _g = serial();
    let server = Server::start("", &[]);
    for origin in ["https://evil.example", "null"] {
        let r = request(
            server.addr,
            "GET",
            "/readyz",
            &[auth(), h("Origin", origin)],
            None,
        );
        assert_eq!(r.status, 403, "{origin}");
        assert!(r.header("access-control-allow-origin").is_none());
    }
    let plain = server.call("GET", "/readyz", None);
    assert!(
        plain
            .headers
            .keys()
            .all(|k| !k.starts_with("access-control")),
        "CORS headers while CORS is off"
    );
    drop(server);

    let server = Server::start(
        "[cors]\nallowed_origins = [\"https://app.example\"]\nallow_credentials = true\n",
        &[],
    );
    let preflight = |origin: &str| {
        request(
            server.addr,
            "OPTIONS",
            "/v1/execute",
            &[
                h("Origin", origin),
                h("Access-Control-Request-Method", "POST"),
                h(
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
            ],
            None,
        )
    };
    let ok = preflight("https://app.example");
    assert_eq!(ok.status, 204);
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(ok.header("access-control-allow-credentials"), Some("true"));
    assert!(ok.header("vary").unwrap().contains("Origin"));
    assert!(ok
        .header("access-control-allow-headers")
        .unwrap()
        .contains("authorization"));
    for origin in [
        "https://evil.example",
        "null",
        "https://app.example.evil.example",
    ] {
        let r = preflight(origin);
        assert_eq!(r.status, 403, "{origin}");
        assert!(
            r.headers
                .keys()
                .all(|k| !k.starts_with("access-control-allow")),
            "{origin}: {:?}",
            r.headers
        );
    }
    let real = request(
        server.addr,
        "GET",
        "/readyz",
        &[auth(), h("Origin", "https://app.example")],
        None,
    );
    assert_eq!(real.status, 200);
    assert_eq!(
        real.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(real.header("vary").unwrap().contains("Origin"));
    // `*` is never accepted, so it can never be sent with credentials.
    let refused = invoke(&["serve", "--print-config"], b"");
    assert_eq!(refused.exit, 0);
    let bad = airlock()
        .args(["serve", "--print-config"])
        .env("AIRLOCK_CORS__ALLOWED_ORIGINS", "[\"*\"]")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("never accepted"));
}

#[test]
fn only_json_bodies_are_read() {
    let _g = serial();
    let server = Server::start("", &[]);
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let r = request(
            server.addr,
            "POST",
            "/v1/execute",
            &[auth(), h("Content-Type", ct)],
            Some(b"{\"code\": \"1\"}"),
        );
        assert_eq!(
            (r.status, r.error_code()),
            (415, "unsupported_media_type".into()),
            "{ct}"
        );
    }
    let r = request(
        server.addr,
        "POST",
        "/v1/execute",
        &[auth()],
        Some(b"{\"code\": \"1\"}"),
    );
    assert_eq!(r.status, 415, "no Content-Type at all");
    let r = request(
        server.addr,
        "POST",
        "/v1/execute",
        &[auth(), h("Content-Type", "application/json; charset=utf-8")],
        Some(b"{\"code\": \"1\"}"),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn foreign_host_headers_are_refused() {
    let _g = serial();
    let server = Server::start("allowed_hosts = [\"airlock.internal\"]\n", &[]);
    let port = server.addr.port();
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "127.0.0.2",
        "localhost.evil.example",
        "",
    ] {
        let r = request(
            server.addr,
            "GET",
            "/readyz",
            &[auth(), h("Host", host)],
            None,
        );
        assert_eq!(
            (r.status, r.error_code()),
            (421, "misdirected_request".into()),
            "{host:?}"
        );
    }
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "LOCALHOST".into(),
        "airlock.internal".into(),
        format!("[::1]:{port}"),
    ] {
        let r = request(
            server.addr,
            "GET",
            "/readyz",
            &[auth(), h("Host", &host)],
            None,
        );
        assert_eq!(r.status, 200, "{host}");
    }
    let metrics = server.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_security_events_total{kind=\"foreign_host\"} 5"),
        "{metrics}"
    );
}

#[test]
fn bodies_are_capped_on_what_arrives() {
    let _g = serial();
    let server = Server::start("[http]\nmax_body_bytes = 1000\n", &[]);
    // A huge declared length is refused at once, before any of it is sent.
    let mut s = server.connect();
    write!(s, "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n").unwrap();
    let r = read_response(&mut s).unwrap();
    assert_eq!(
        (r.status, r.error_code()),
        (413, "payload_too_large".into())
    );
    // A chunked body is counted as it arrives.
    let mut s = server.connect();
    write!(s, "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
    let chunk = "x".repeat(400);
    for _ in 0..4 {
        let _ = write!(s, "{:x}\r\n{chunk}\r\n", chunk.len());
    }
    let _ = write!(s, "0\r\n\r\n");
    let r = read_response(&mut s).unwrap();
    assert_eq!(
        (r.status, r.error_code()),
        (413, "payload_too_large".into())
    );
    // Just under the limit is read and parsed (and found to be bad JSON).
    let r = request(
        server.addr,
        "POST",
        "/v1/execute",
        &[auth(), json_type()],
        Some("x".repeat(999).as_bytes()),
    );
    assert_eq!(r.status, 400);
}

#[test]
fn slow_clients_are_cut_off_and_connections_are_capped() {
    let _g = serial();
    let server = Server::start(
        "[http]\nheader_timeout_ms = 500\nbody_timeout_ms = 500\nmax_connections = 4\n",
        &[],
    );
    // Headers that never finish: closed after the header timeout.
    let mut slow_head = server.connect();
    slow_head
        .write_all(b"POST /v1/execute HTTP/1.1\r\nHost: local")
        .unwrap();
    assert!(
        closed_within(&mut slow_head, Duration::from_secs(5)),
        "a slowloris connection stayed open"
    );
    // A body that never finishes: 408, then closed.
    let mut slow_body = server.connect();
    write!(slow_body, "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"code\"").unwrap();
    let r = read_response(&mut slow_body).unwrap();
    assert_eq!((r.status, r.error_code()), (408, "timeout".into()));
    // Four open connections are the cap: the fifth is told so and closed.
    let held: Vec<_> = (0..4)
        .map(|_| {
            let mut s = server.connect();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut fifth = server.connect();
    let r = read_response(&mut fifth).unwrap();
    assert_eq!((r.status, r.header("retry-after")), (503, Some("1")));
    drop(held);
    // Once they are closed (by the header timeout), connections are accepted again.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        request(server.addr, "GET", "/healthz", &[], None).status,
        200
    );
}

#[test]
fn transfer_encoding_with_content_length_is_refused() {
    let _g = serial();
    let server = Server::start("", &[]);
    let mut s = server.connect();
    // A smuggling attempt: a proxy reading Content-Length would see a second request.
    write!(
        s,
        "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n\
         Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    .unwrap();
    let r = read_response(&mut s).unwrap();
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (400, Some("headers"))
    );
    assert!(
        closed_within(&mut s, Duration::from_secs(5)),
        "the connection stayed open after a smuggling attempt"
    );
    let metrics = server.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_security_events_total{kind=\"smuggling\"} 1"),
        "{metrics}"
    );
    // A plain keep-alive connection carries several requests.
    let mut s = server.connect();
    for _ in 0..3 {
        write!(s, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        assert_eq!(read_response(&mut s).unwrap().status, 200);
    }
}

/// Starts `code` as an execution on its own thread; returns the thread's handle.
fn in_background(
    server: &Server,
    code: &str,
    key: &'static str,
) -> std::thread::JoinHandle<common::http::Response> {
    let addr = server.addr;
    let body = json!({"code": code}).to_string();
    std::thread::spawn(move || {
        request(
            addr,
            "POST",
            "/v1/execute",
            &[h("Authorization", &format!("Bearer {key}")), json_type()],
            Some(body.as_bytes()),
        )
    })
}

fn wait_running(server: &Server, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = server.call("GET", "/metrics", None).text();
        if m.contains(&format!("airlock_running_sandboxes {n}\n")) {
            return;
        }
        assert!(Instant::now() < deadline, "never saw {n} running: {m}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_configured_concurrency_is_the_enforced_concurrency() {
    let _g = serial();
    let server = Server::start("[concurrency]\nmax_running = 2\nmax_queue = 0\n", &[]);
    let sleepers: Vec<_> = (0..2)
        .map(|_| in_background(&server, "import time\ntime.sleep(1.5)", KEY))
        .collect();
    wait_running(&server, 2);
    let third = server.execute(json!({"code": "1"}));
    assert_eq!(
        (third.status, third.error_code()),
        (503, "overloaded".into())
    );
    assert_eq!(third.header("retry-after"), Some("1"));
    for t in sleepers {
        assert_eq!(t.join().unwrap().json()["status"], "ok");
    }
    assert_eq!(
        server.execute(json!({"code": "1"})).status,
        200,
        "slots are given back"
    );
    drop(server);

    // With a queue, the third waits for a slot instead.
    let server = Server::start("[concurrency]\nmax_running = 1\nmax_queue = 1\n", &[]);
    let first = in_background(&server, "import time\ntime.sleep(1)", KEY);
    wait_running(&server, 1);
    let queued = in_background(&server, "2", KEY);
    std::thread::sleep(Duration::from_millis(200));
    let m = server.call("GET", "/metrics", None).text();
    assert!(m.contains("airlock_queue_depth 1\n"), "{m}");
    let overflow = server.execute(json!({"code": "3"}));
    assert_eq!(overflow.status, 503, "the queue is bounded");
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(queued.join().unwrap().json()["result"], 2);
}

#[test]
fn per_key_concurrency_and_rate_limits_answer_429() {
    let _g = serial();
    let server = Server::start(
        &other_key_toml("max_concurrency = 1\nmax_queue = 0\nrate_per_minute = 3"),
        &[],
    );
    let busy = in_background(&server, "import time\ntime.sleep(1)", OTHER_KEY);
    wait_running(&server, 1);
    let r = as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "1"})));
    assert_eq!(
        (r.status, r.error_code(), r.header("retry-after")),
        (429, "rate_limited".into(), Some("1"))
    );
    // The test key is not affected by the other key's limits.
    assert_eq!(server.execute(json!({"code": "1"})).status, 200);
    assert_eq!(busy.join().unwrap().status, 200);
    // Three requests a minute: the fourth is limited (two were used above).
    assert_eq!(
        as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "1"}))).status,
        200
    );
    let limited = as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "1"})));
    assert_eq!(limited.status, 429);
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
}

#[test]
fn limits_above_a_ceiling_are_refused_with_the_ceiling_named() {
    let _g = serial();
    let server = Server::start(
        &other_key_toml("ceilings = { memory_mb = 128, timeout_ms = 2000 }"),
        &[],
    );
    let r = as_other(
        &server,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "1", "limits": {"memory_mb": 256}})),
    );
    assert_eq!(r.status, 400);
    let e = r.json()["error"].clone();
    assert_eq!(
        (e["code"].as_str(), e["field"].as_str()),
        (Some("limit_above_ceiling"), Some("limits.memory_mb"))
    );
    assert!(e["message"].as_str().unwrap().contains("ceiling of 128"));
    // Defaults above the key's ceiling come down to it.
    let ok = as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "1"})));
    assert_eq!(
        (
            ok.json()["limits"]["memory_mb"].as_u64(),
            ok.json()["limits"]["timeout_ms"].as_u64()
        ),
        (Some(128), Some(2000))
    );
    // The engine's ceilings hold for every key.
    let r = server.execute(json!({"code": "1", "limits": {"pids": 100000}}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (400, Some("limits.pids"))
    );
}

#[test]
fn bad_input_is_a_clear_error_naming_the_field() {
    let _g = serial();
    let server = Server::start("[engine]\nmax_code_bytes = 1000\n", &[]);
    let raw = |body: &[u8]| {
        request(
            server.addr,
            "POST",
            "/v1/execute",
            &[auth(), json_type()],
            Some(body),
        )
    };
    let cases: Vec<(Vec<u8>, u16, &str, Option<&str>)> = vec![
        (b"{\"code\": ".to_vec(), 400, "invalid_json", None),
        (b"[1, 2]".to_vec(), 400, "invalid_json", None),
        (br#"{"code": "1", "timeout": 5}"#.to_vec(), 400, "invalid_json", Some("timeout")),
        (br#"{"code": 1}"#.to_vec(), 400, "invalid_json", Some("code")),
        (br#"{"code": "1", "language": "ruby"}"#.to_vec(), 400, "invalid_json", Some("language")),
        (br#"{"code": "1", "limits": {"memory_mb": "lots"}}"#.to_vec(), 400, "invalid_json", Some("limits.memory_mb")),
        (br#"{"code": "1", "files": [{"path": "a", "content": "x", "mode": 7}]}"#.to_vec(), 400, "invalid_json", Some("files[0].mode")),
        (format!(r#"{{"code": "{}"}}"#, "#".repeat(1001)).into_bytes(), 413, "payload_too_large", Some("code")),
        (br#"{"code": "1", "files": [{"path": "/etc/passwd", "content": "x"}]}"#.to_vec(), 400, "invalid_request", Some("files[0].path")),
        (br#"{"code": "1", "files": [{"path": "ok", "content": "x"}, {"path": "a/../../b", "content": "x"}]}"#.to_vec(), 400, "invalid_request", Some("files[1].path")),
        (br#"{"code": "1", "files": [{"path": "a", "content": "x"}, {"path": "a", "content": "y"}]}"#.to_vec(), 400, "invalid_request", Some("files[1].path")),
        (br#"{"code": "1", "files": [{"path": "a", "content": "not base64!", "encoding": "base64"}]}"#.to_vec(), 400, "invalid_request", Some("files[0].content")),
        (br#"{"code": "1", "env": {"A=B": "x"}}"#.to_vec(), 400, "invalid_request", Some("env.A=B")),
        (br#"{"code": "1", "limits": {"timeout_ms": 0}}"#.to_vec(), 400, "invalid_request", Some("limits.timeout_ms")),
    ];
    for (body, status, code, field) in cases {
        let r = raw(&body);
        let shown = String::from_utf8_lossy(&body)
            .chars()
            .take(80)
            .collect::<String>();
        assert_eq!(r.status, status, "{shown}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["code"], code, "{shown}");
        if let Some(field) = field {
            assert_eq!(e["field"], field, "{shown}: {e}");
        }
        assert!(!e["message"].as_str().unwrap().is_empty());
    }
    // Garbage on the wire does not hurt the next client.
    let mut s = server.connect();
    s.write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n")
        .unwrap();
    let _ = closed_within(&mut s, Duration::from_secs(5));
    assert_eq!(
        server.execute(json!({"code": "40 + 2"})).json()["result"],
        42
    );
    let m = server.call("GET", "/metrics", None).text();
    assert!(
        m.contains("airlock_security_events_total{kind=\"rejected_input\"}"),
        "{m}"
    );
}

#[test]
fn metrics_openapi_and_readiness() {
    let _g = serial();
    let server = Server::start("", &[]);
    server.execute(json!({"code": "print('x' * 100)", "limits": {"output_bytes": 10}}));
    let m = server.call("GET", "/metrics", None);
    assert_eq!(m.status, 200);
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = m.text();
    for needle in [
        "airlock_executions_total{status=\"ok\"} 1",
        "airlock_execution_duration_seconds_count 1",
        "airlock_queue_depth 0",
        "airlock_running_sandboxes 0",
        "airlock_security_events_total{kind=\"output_truncated\"} 1",
        "airlock_http_requests_total{route=\"/v1/execute\",code=\"200\"} 1",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    let doc = server.call("GET", "/openapi.json", None).json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
    assert_eq!(paths.len(), airlock_server::ROUTES.len());
    let ready = server.call("GET", "/readyz", None);
    assert_eq!(
        (ready.status, ready.json()),
        (200, json!({"ready": true, "reasons": []}))
    );
    drop(server);
    // Metrics can be opened to scrapers without a key.
    let open = Server::start("[metrics]\nrequire_auth = false\n", &[]);
    assert_eq!(request(open.addr, "GET", "/metrics", &[], None).status, 200);
    assert_eq!(request(open.addr, "GET", "/readyz", &[], None).status, 401);
}

#[test]
fn the_readme_api_section_matches_the_openapi_document() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = readme
        .split("## HTTP API")
        .nth(1)
        .expect("README has an HTTP API section");
    let section = section.split("\n## ").next().unwrap();
    let mut listed: Vec<String> = section
        .lines()
        .filter_map(|l| {
            l.strip_prefix("| `")
                .and_then(|r| r.split('`').next())
                .map(str::to_owned)
        })
        .filter(|r| r.starts_with("GET ") || r.starts_with("POST "))
        .collect();
    listed.sort();
    let mut routes: Vec<String> = airlock_server::ROUTES
        .iter()
        .map(|(m, p)| format!("{m} {p}"))
        .collect();
    routes.sort();
    assert_eq!(listed, routes);
    let doc = airlock_server::openapi();
    for (method, path) in airlock_server::ROUTES {
        assert!(doc["paths"][path][method.to_lowercase()].is_object());
    }
}

#[test]
fn sigterm_lets_running_executions_finish_then_kills_what_outlives_the_grace() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("shutdown_grace_ms = 3000\n", &[]);
    let quick = in_background(&server, "import time\ntime.sleep(1)\n'done'", KEY);
    let stuck = in_background(&server, "import time\ntime.sleep(60)", KEY);
    wait_running(&server, 2);
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    let asked = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        std::net::TcpStream::connect(server.addr).is_err(),
        "still accepting after SIGTERM"
    );
    let quick = quick.join().unwrap();
    assert_eq!(
        (quick.status, quick.json()["result"].as_str()),
        (200, Some("done")),
        "a short run was cut off"
    );
    let stuck = stuck.join().unwrap();
    let waited = asked.elapsed();
    assert_eq!(stuck.json()["status"], "internal_error", "{}", stuck.text());
    assert!(
        waited < Duration::from_secs(30),
        "the grace period was not enforced"
    );
    let mut server = server;
    assert!(server.child.wait().unwrap().success());
    HostState::now().assert_same_as(&before, &"after shutdown");
}

#[test]
fn a_client_that_goes_away_takes_its_sandbox_with_it() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let mut s = server.connect();
    let body = json!({"code": "import time\ntime.sleep(60)"}).to_string();
    write!(s, "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    wait_running(&server, 1);
    drop(s);
    wait_running(&server, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let gone = || {
        sandbox_processes().len() <= before.sandbox_processes().len()
            && sandbox_cgroups().len() <= before.sandbox_cgroups().len()
    };
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    HostState::now().assert_same_as(&before, &"after the client left");
    drop(server);
}

#[test]
fn leftovers_of_a_crashed_run_are_removed_at_start() {
    let _g = serial();
    let before = HostState::now();
    let layout = airlock_sandbox::host_support()
        .cgroup
        .clone()
        .expect("cgroups");
    // A pid that cannot be running: above the kernel's pid_max.
    let dead = "airlock-4194304-7";
    for parent in layout.parents() {
        std::fs::create_dir(parent.join(dead)).unwrap();
    }
    let server = Server::start("", &[]);
    for parent in layout.parents() {
        assert!(
            !parent.join(dead).exists(),
            "{} was left",
            parent.join(dead).display()
        );
    }
    assert!(server
        .log_lines()
        .iter()
        .any(|l| l.contains("removed sandbox cgroups left by an earlier airlock")));
    drop(server);
    HostState::now().assert_same_as(&before, &"sweep");
}

#[test]
fn a_key_is_made_on_first_start_shown_once_and_only_its_hash_kept() {
    let _g = serial();
    let first = Server::start_with("", &[], false);
    let key = first
        .stdout
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_owned();
    assert!(
        key.starts_with("ak_") && key.len() == 67,
        "{:?}",
        first.stdout
    );
    let auth = (String::from("Authorization"), format!("Bearer {key}"));
    assert_eq!(
        request(
            first.addr,
            "GET",
            "/readyz",
            std::slice::from_ref(&auth),
            None
        )
        .status,
        200
    );
    let stored = std::fs::read_to_string(first.state_dir().join("keys.json")).unwrap();
    assert!(!stored.contains(&key), "the key itself was stored");
    assert!(stored.contains(&format!("sha256:{:x}", Sha256::digest(key.as_bytes()))));
    // The same state directory on the next start: no new key, and the old one works.
    let state = first.state_dir();
    let mut first = first;
    let pid = nix::unistd::Pid::from_raw(first.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).unwrap();
    first.child.wait().unwrap();
    let again = airlock()
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let pid = nix::unistd::Pid::from_raw(again.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).unwrap();
    let out = again.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "a key was shown again"
    );
}

#[test]
fn print_config_shows_the_effective_configuration() {
    let out = airlock()
        .args(["serve", "--print-config", "--listen", "127.0.0.1:9999"])
        .env("AIRLOCK_CONCURRENCY__MAX_RUNNING", "3")
        .env("AIRLOCK_API_KEY", KEY)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("listen = \"127.0.0.1:9999\""), "{text}");
    assert!(text.contains("max_running = 3"), "{text}");
    assert!(!text.contains(KEY), "the key was printed");
    let typo = airlock()
        .args(["serve", "--print-config"])
        .env("AIRLOCK_CONCURENCY__MAX_RUNNING", "3")
        .output()
        .unwrap();
    assert_eq!(typo.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&typo.stderr)
        .contains("AIRLOCK_CONCURENCY__MAX_RUNNING does not name a setting"));
    // The example configuration is a valid one.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../airlock.example.toml");
    let ok = airlock()
        .args(["serve", "--print-config", "--config", example])
        .output()
        .unwrap();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

#[test]
fn json_logs_carry_the_request_id() {
    let _g = serial();
    let server = Server::start("log_format = \"json\"\n", &[]);
    let r = server.execute(json!({"code": "1"}));
    let rid = r.header("x-request-id").unwrap().to_owned();
    std::thread::sleep(Duration::from_millis(100));
    let lines = server.log_lines();
    let entries: Vec<Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        entries
            .iter()
            .any(|e| e["request_id"] == rid.as_str() && e["message"] == "execution"),
        "{lines:#?}"
    );
    assert!(entries.iter().any(|e| e["request_id"] == rid.as_str()
        && e["message"] == "request"
        && e["status"] == 200));
}
