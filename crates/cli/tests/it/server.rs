//! `airlock serve`, started for real on a loopback port and driven over HTTP: results, every
//! hardening item, concurrency overflow and shutdown. THREAT-MODEL: HTTP; seed 003's HTTP items.

use crate::common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::http::{closed_within, read_response, request, Server, KEY};
use common::*;
use serde_json::{json, Value};

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
    let hash = format!("sha256:{}", airlock_api::sha256_hex(OTHER_KEY.as_bytes()));
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
        airlock_api::sha256_hex(code.as_bytes())
    );
    assert_eq!(record["request_id"], r.header("x-request-id").unwrap());
    let audit = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    let lines: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // A started line written before the sandbox ran, then the record with the verdict.
    assert_eq!(lines.len(), 2, "{audit}");
    assert_eq!(
        (&lines[0]["event"], &lines[0]["id"]),
        (&json!("started"), &json!(id))
    );
    assert_eq!(lines[0]["code_sha256"], record["code_sha256"]);
    assert_eq!(
        (&lines[1]["id"], &lines[1]["status"]),
        (&json!(id), &json!("ok"))
    );
    for secret in [KEY, "environment-value-9f3", "print('hi')", "hi\\n"] {
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
    assert!(metrics.contains("airlock_sandbox_start_duration_seconds_count 3"));
}

#[test]
fn every_route_but_healthz_and_openapi_needs_a_valid_key() {
    let _g = serial();
    let server = Server::start("", &[]);
    let health = request(server.addr, "GET", "/healthz", &[], None);
    assert_eq!(
        (health.status, health.json()),
        (200, json!({"status": "ok"}))
    );
    let wrong = "wrong-key-that-must-never-be-logged";
    // The two public routes say the same to everyone.
    let public = ["/healthz", "/openapi.json"];
    for (method, path) in airlock_server::ROUTES {
        if public.contains(path) {
            continue;
        }
        let path = path
            .replace("{id}", "ex_0")
            .replace("{path}", "x")
            .replace("{name}", "x");
        // RFC 6750: a key that was presented and is not valid is an `invalid_token`; none
        // presented (or not as a Bearer token) is a bare challenge.
        let invalid = "Bearer realm=\"airlock\", error=\"invalid_token\", error_description=\"the API key is not valid\"";
        for (headers, challenge) in [
            (vec![], "Bearer realm=\"airlock\""),
            (
                vec![h("Authorization", &format!("Bearer {wrong}"))],
                invalid,
            ),
            (vec![h("Authorization", KEY)], "Bearer realm=\"airlock\""),
        ] {
            let r = request(server.addr, method, &path, &headers, None);
            assert_eq!(r.status, 401, "{method} {path} with {headers:?}");
            assert_eq!(r.header("www-authenticate"), Some(challenge));
            assert_eq!(r.error_code(), "unauthorized");
        }
    }
    let metrics = server.call("GET", "/metrics", None).text();
    let failures = 3 * (airlock_server::ROUTES.len() - public.len());
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
    let reader = "reader-key-0123456789abcdef";
    let config = format!(
        "{}[[keys]]\nname = \"reader\"\nhash = \"sha256:{}\"\nscopes = [\"read\"]\n",
        other_key_toml("scopes = [\"execute\"]"),
        airlock_api::sha256_hex(reader.as_bytes())
    );
    let server = Server::start(&config, &[]);
    // Readiness for any key; the pool's counters (everyone's traffic) only with `metrics`.
    let ready = |key: &str| {
        let r = request(
            server.addr,
            "GET",
            "/readyz",
            &[h("Authorization", &format!("Bearer {key}"))],
            None,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    assert!(ready(reader).get("pool").is_none());
    assert!(ready(KEY).get("pool").is_some());
    // A key without the execute scope may not execute.
    let r = request(
        server.addr,
        "POST",
        "/v1/execute",
        &[h("Authorization", &format!("Bearer {reader}")), json_type()],
        Some(br#"{"code": "1"}"#),
    );
    assert_eq!((r.status, r.error_code()), (403, "forbidden".into()));
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
fn slow_clients_are_cut_off() {
    let _g = serial();
    let server = Server::start(
        "[http]\nheader_timeout_ms = 500\nbody_timeout_ms = 500\n",
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
}

#[test]
fn at_the_connection_cap_idle_connections_make_way_and_busy_ones_do_not() {
    let _g = serial();
    let server = Server::start(
        "[http]\nmax_connections = 4\n[concurrency]\nmax_running = 4\n",
        &[],
    );
    // Four connections that never finish a head fill the cap; a fifth still gets in, in
    // place of the oldest of them.
    let mut idle: Vec<_> = (0..4)
        .map(|_| {
            let mut s = server.connect();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
                .unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s
        })
        .collect();
    let r = request(server.addr, "GET", "/healthz", &[], None);
    assert_eq!(r.status, 200, "an idle connection held the last slot");
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(5)),
        "the oldest idle connection was not the one closed"
    );
    assert!(
        !closed_within(&mut idle[3], Duration::from_millis(200)),
        "a newer idle connection was closed instead of the oldest"
    );
    drop(idle);
    std::thread::sleep(Duration::from_millis(100));

    // Four connections each waiting for an execution are busy: a fifth is refused.
    let busy: Vec<_> = (0..4)
        .map(|_| in_background(&server, "import time\ntime.sleep(2)", KEY))
        .collect();
    wait_sandboxes(4);
    let r = request(server.addr, "GET", "/healthz", &[], None);
    assert_eq!((r.status, r.header("retry-after")), (503, Some("1")));
    for b in busy {
        assert_eq!(
            b.join().unwrap().json()["status"],
            "ok",
            "a busy connection was cut"
        );
    }
    let m = server.call("GET", "/metrics", None).text();
    // Every kind's series exists from the start: counted means above zero.
    assert!(
        server.metric("airlock_security_events_total{kind=\"connection_evicted\"}") > 0.0,
        "{m}"
    );
    assert!(
        m.contains("airlock_security_events_total{kind=\"connection_refused\"} 1"),
        "{m}"
    );
}

/// How hogs without a key hold connections.
#[derive(Clone, Copy, Debug)]
enum Hog {
    /// One byte of a head, never finished.
    PartialHead,
    /// A whole `GET /healthz`, answered, then the connection kept open.
    IdleAfterHealthz,
}

#[test]
fn clients_without_a_key_cannot_hog_the_connection_slots() {
    let _g = serial();
    let server = Server::start("[http]\nmax_connections = 8\n", &[]);
    for hog in [Hog::PartialHead, Hog::IdleAfterHealthz] {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // A client with a key, on one keep-alive connection the whole time.
        let mut keyed = server.connect();
        let ask = |s: &mut std::net::TcpStream| {
            write!(
                s,
                "GET /readyz HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\r\n"
            )
            .ok()?;
            read_response(s).map(|r| r.status)
        };
        assert_eq!(ask(&mut keyed), Some(200));
        // 32 hogs against 8 slots, reconnecting as soon as they are closed.
        let hogs: Vec<_> = (0..32)
            .map(|_| {
                let (addr, stop) = (server.addr, stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let Ok(mut s) = std::net::TcpStream::connect(addr) else {
                            continue;
                        };
                        match hog {
                            Hog::PartialHead => {
                                let _ = s.write_all(b"G");
                            }
                            Hog::IdleAfterHealthz => {
                                let _ = s
                                    .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
                                let _ = read_response(&mut s);
                            }
                        }
                        let _ = closed_within(&mut s, Duration::from_secs(1));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let (mut ok, mut failed, mut keyed_ok) = (0, 0, 0);
        for _ in 0..40 {
            // A new connection from a client that sends its request at once.
            let answered = std::net::TcpStream::connect(server.addr)
                .ok()
                .and_then(|mut s| {
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    s.write_all(
                        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                    )
                    .ok()?;
                    read_response(&mut s)
                });
            match answered {
                Some(r) if r.status == 200 => ok += 1,
                _ => failed += 1,
            }
            if ask(&mut keyed) == Some(200) {
                keyed_ok += 1;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for h in hogs {
            h.join().unwrap();
        }
        // Before eviction this was 0 of 40; with the newest connections evicted first, 16.
        assert!(
            ok >= 36,
            "{hog:?}: only {ok} of 40 requests got through the hogs ({failed} failed)"
        );
        assert_eq!(
            keyed_ok, 40,
            "{hog:?}: the keyed client's connection was cut"
        );
    }
}

#[test]
fn an_answer_being_written_is_not_cut_when_the_cap_fills() {
    let _g = serial();
    let server = Server::start("[http]\nmax_connections = 4\n", &[]);
    let size = 8_000_000;
    let body = json!({"code": format!("import sys\nsys.stdout.write('x' * {size})"),
                      "limits": {"output_bytes": size}})
    .to_string();
    // A client that reads its (large) answer slowly.
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::empty(),
        None,
    )
    .unwrap();
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &16384).unwrap();
    nix::sys::socket::connect(
        std::os::fd::AsRawFd::as_raw_fd(&socket),
        &nix::sys::socket::SockaddrIn::from(match server.addr {
            std::net::SocketAddr::V4(a) => a,
            std::net::SocketAddr::V6(_) => unreachable!(),
        }),
    )
    .unwrap();
    let mut slow = std::net::TcpStream::from(socket);
    write!(slow, "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut first = [0u8; 4096];
    let n = std::io::Read::read(&mut slow, &mut first).unwrap();
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    // Meanwhile clients without a key fill the table, each answered, then idle.
    let _idle: Vec<_> = (0..4)
        .map(|_| {
            let mut s = server.connect();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .unwrap();
            assert_eq!(read_response(&mut s).unwrap().status, 200);
            s
        })
        .collect();
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut slow, &mut rest).unwrap();
    let mut whole = first[..n].to_vec();
    whole.extend_from_slice(&rest);
    let r = read_response(&mut whole.as_slice()).expect("the whole answer");
    assert_eq!(r.json()["stdout"].as_str().map(str::len), Some(size));
}

#[test]
fn transfer_encoding_with_content_length_is_refused() {
    let _g = serial();
    let server = Server::start("", &[]);
    let smuggled = |s: &mut std::net::TcpStream, eol: &str| {
        // A smuggling attempt: a proxy reading Content-Length would frame it differently.
        let head = format!(
            "POST /v1/execute HTTP/1.1{eol}Host: localhost{eol}Authorization: Bearer {KEY}{eol}\
             Content-Type: application/json{eol}Content-Length: 60{eol}Transfer-Encoding: chunked{eol}{eol}"
        );
        let _ = s.write_all(head.as_bytes());
        std::thread::sleep(Duration::from_millis(300));
        let _ = s.write_all(b"f\r\n{\"code\":\"40+2\"}\r\n0\r\n\r\n");
        read_response(s)
    };
    let refused = |r: Option<common::http::Response>, what: &str| {
        if let Some(r) = r {
            assert_ne!(r.status, 200, "{what}: executed: {}", r.text());
            assert_eq!(r.status, 400, "{what}: {}", r.text());
            assert_eq!(r.json()["error"]["field"], "headers", "{what}");
        }
    };
    // CRLF and bare-LF line ends alike.
    for eol in ["\r\n", "\n"] {
        let mut s = server.connect();
        let r = smuggled(&mut s, eol);
        assert!(r.is_some(), "no answer with {eol:?}");
        refused(r, &format!("line end {eol:?}"));
        assert!(
            closed_within(&mut s, Duration::from_secs(5)),
            "the connection stayed open after a smuggling attempt"
        );
    }
    // After a large (but allowed) head on the same connection.
    let mut s = server.connect();
    let pad = "a".repeat(60_000);
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Pad: {pad}\r\n"
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    s.write_all(b"\r\n").unwrap();
    assert_eq!(read_response(&mut s).unwrap().status, 200);
    refused(smuggled(&mut s, "\r\n"), "after a 60 KB head");
    // A head over 64 KiB is refused, and nothing after it is read. (The server may close the
    // connection before the client has written it all.)
    let mut s = server.connect();
    let pad = "a".repeat(70_000);
    let _ = write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Pad: {pad}\r\n"
    );
    std::thread::sleep(Duration::from_millis(300));
    let _ = s.write_all(b"\r\n");
    if let Some(r) = read_response(&mut s) {
        assert_eq!(r.status, 431, "{}", r.text());
    }
    refused(smuggled(&mut s, "\r\n"), "after a head over 64 KiB");
    let metrics = server.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_security_events_total{kind=\"smuggling\"} 3"),
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

/// Waits until `n` sandboxes exist, seen on the host (not over HTTP: for when every
/// connection slot is taken).
fn wait_sandboxes(n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut names: Vec<_> = sandbox_cgroups()
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_owned()))
            .collect();
        names.sort();
        names.dedup();
        if names.len() >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never saw {n} sandboxes: {names:?}"
        );
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
    server.wait_running(2);
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
    server.wait_running(1);
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
    server.wait_running(1);
    let r = as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "1"})));
    assert_eq!(
        (r.status, r.error_code(), r.header("retry-after")),
        (429, "rate_limited".into(), Some("1"))
    );
    // The test key is not affected by the other key's limits.
    assert_eq!(server.execute(json!({"code": "1"})).status, 200);
    assert_eq!(busy.join().unwrap().status, 200);
    // Three requests a minute: one was used above (the refused one cost nothing).
    for _ in 0..2 {
        assert_eq!(
            as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "1"}))).status,
            200
        );
    }
    let limited = as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "1"})));
    assert_eq!(limited.status, 429);
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
}

/// Sends `code` as `key` to `/v1/execute` and leaves the answer unread: dropping the stream
/// is the client going away, which cancels it.
fn hold(server: &Server, key: &str, code: &str) -> std::net::TcpStream {
    let mut s = server.connect();
    let body = json!({ "code": code }).to_string();
    write!(
        s,
        "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// Waits until `n` requests wait for a running slot.
fn wait_queued(server: &Server, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("airlock_queue_depth") != n as f64 {
        assert!(Instant::now() < deadline, "never {n} queued");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_slot_given_back_goes_to_the_key_that_ran_least_recently() {
    let _g = serial();
    // Neither key has limits of its own: each may take every slot (4 by default).
    let server = Server::start(&other_key_toml(""), &[]);
    let holders: Vec<_> = (0..4)
        .map(|_| hold(&server, KEY, "import time\ntime.sleep(600)"))
        .collect();
    server.wait_running(4);
    // The test key queues two more, then the other key one.
    let code = |name: &str| format!("print({name:?})");
    let a1 = in_background(&server, &code("a1"), KEY);
    wait_queued(&server, 1);
    let a2 = in_background(&server, &code("a2"), KEY);
    wait_queued(&server, 2);
    let b1 = in_background(&server, &code("b1"), OTHER_KEY);
    wait_queued(&server, 3);
    // One slot is given back: the three run one after the other in it.
    let mut holders = holders.into_iter();
    drop(holders.next());
    for waiter in [a1, a2, b1] {
        assert_eq!(waiter.join().unwrap().status, 200);
    }
    // Their order is the order of their `started` lines.
    let names: std::collections::HashMap<String, &str> = ["a1", "a2", "b1"]
        .into_iter()
        .map(|n| (airlock_api::sha256_hex(code(n).as_bytes()), n))
        .collect();
    let audit = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    let order: Vec<&str> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["event"] == "started")
        .filter_map(|l| names.get(l["code_sha256"].as_str()?).copied())
        .collect();
    assert_eq!(
        order,
        ["b1", "a1", "a2"],
        "the other key waits behind one at most"
    );
    drop(holders);
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
    assert!(
        server.metric("airlock_security_events_total{kind=\"rejected_input\"}") > 0.0,
        "{}",
        server.call("GET", "/metrics", None).text()
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
    let methods: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_object().unwrap().len())
        .sum();
    assert_eq!(methods, airlock_server::ROUTES.len());
    let ready = server.call("GET", "/readyz", None);
    let body = ready.json();
    assert_eq!(
        (ready.status, &body["ready"], &body["reasons"]),
        (200, &json!(true), &json!([]))
    );
    assert_eq!(body["pool"]["size"], 0, "{body}");
    drop(server);
    // Metrics can be opened to scrapers without a key.
    let open = Server::start("[metrics]\nrequire_auth = false\n", &[]);
    assert_eq!(request(open.addr, "GET", "/metrics", &[], None).status, 200);
    assert_eq!(request(open.addr, "GET", "/readyz", &[], None).status, 401);
}

#[test]
fn the_api_page_matches_the_openapi_document() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/http-api.md"
    ))
    .unwrap();
    let section = page
        .split("# HTTP API")
        .nth(1)
        .expect("docs/http-api.md has its title");
    let section = section.split("\n## ").next().unwrap();
    let mut listed: Vec<String> = section
        .lines()
        .filter_map(|l| {
            l.strip_prefix("| `")
                .and_then(|r| r.split('`').next())
                .map(str::to_owned)
        })
        .filter(|r| {
            ["GET ", "POST ", "PUT ", "DELETE "]
                .iter()
                .any(|m| r.starts_with(m))
        })
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
    server.wait_running(2);
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

/// A log reader that goes away (a collector restarted, the `tee` of `airlock serve 2>&1 |
/// tee` killed) costs the log lines, never the server: it keeps answering, and SIGTERM still
/// ends it cleanly, its sandboxes gone.
#[test]
fn a_server_whose_log_reader_is_gone_keeps_serving_and_shuts_down_cleanly() {
    let _g = serial();
    let before = HostState::now();
    let mut server = Server::start("[pool]\nsize = 1\n", &[]);
    server.stop_reading_log();
    // The first answer's log line closes the pipe; the next ones meet it closed.
    for i in 0..3 {
        let r = server.execute(json!({"code": format!("'answer-{i}'")}));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["result"], format!("answer-{i}"), "{}", r.text());
    }
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).unwrap();
    let status = server.child.wait().unwrap();
    assert!(status.success(), "airlock serve ended with {status}");
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
    server.wait_running(1);
    drop(s);
    server.wait_running(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let gone = || {
        sandbox_processes().len() <= before.sandbox_processes().len()
            && sandbox_cgroups().len() <= before.sandbox_cgroups().len()
    };
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    HostState::now().assert_same_as(&before, &"after the client left");
    // It ran, so it is in the audit log and the request log, like any other.
    let deadline = Instant::now() + Duration::from_secs(10);
    let audit = server.state_dir().join("audit.jsonl");
    let record = loop {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let done = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|l| l.get("status").is_some());
        if let Some(record) = done {
            break record;
        }
        assert!(
            Instant::now() < deadline,
            "no audit record for the abandoned execution"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(record["status"], "internal_error");
    let log = server.log_lines();
    assert!(
        log.iter()
            .any(|l| l.contains("request abandoned by the client")),
        "{log:#?}"
    );
    assert!(
        log.iter()
            .any(|l| l.contains(" execution ") || l.contains("execution=")),
        "{log:#?}"
    );
    // A cancelled execution is the client's doing, not the host's: the server stays ready.
    let ready = server.call("GET", "/readyz", None);
    assert_eq!(ready.status, 200, "{}", ready.text());
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
    assert!(stored.contains(&format!(
        "sha256:{}",
        airlock_api::sha256_hex(key.as_bytes())
    )));
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

#[test]
fn one_key_configured_twice_is_refused_at_start() {
    let dir = std::env::temp_dir().join(format!("airlock-dupkey-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("airlock.toml");
    // The same key as AIRLOCK_API_KEY, under another name and with limits it would dodge.
    let hash = format!("sha256:{}", airlock_api::sha256_hex(KEY.as_bytes()));
    std::fs::write(
        &config,
        format!("[[keys]]\nname = \"limited\"\nhash = \"{hash}\"\nrate_per_minute = 1\n"),
    )
    .unwrap();
    let out = airlock()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("AIRLOCK_API_KEY", KEY)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("same key"), "{stderr}");
}

#[test]
fn records_belong_to_a_key_not_to_its_name() {
    let _g = serial();
    let server = Server::start("", &[]);
    let id = server.execute(json!({"code": "1"})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/executions/{id}");
    assert_eq!(server.call("GET", &path, None).status, 200);
    let dir = server.stop_keeping_state();
    // Another key under the same name (AIRLOCK_API_KEY is always "env").
    let other = "a-completely-different-key-999";
    let server = Server::start_in(dir, "", &[], Some(other));
    let r = request(
        server.addr,
        "GET",
        &path,
        &[h("Authorization", &format!("Bearer {other}"))],
        None,
    );
    assert_eq!(r.status, 404, "{}", r.text());
    // The key that ran it still reads it after a restart.
    let dir = server.stop_keeping_state();
    let server = Server::start_in(dir, "", &[], Some(KEY));
    assert_eq!(server.call("GET", &path, None).status, 200);
}

#[test]
fn executions_a_killed_server_was_running_get_their_final_record_at_the_next_start() {
    let _g = serial();
    let server = Server::start("", &[]);
    let done = server.execute(json!({"code": "1"})).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let running: Vec<_> = (0..3)
        .map(|_| in_background(&server, "import time\ntime.sleep(30)", KEY))
        .collect();
    server.wait_running(3);
    let audit = server.dir.join("state").join("audit.jsonl");
    let started_ids = || -> Vec<String> {
        std::fs::read_to_string(&audit)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| v["event"] == "started")
            .map(|v| v["id"].as_str().unwrap().to_owned())
            .collect()
    };
    // Admission counts an execution as running a step before its `started` line is
    // written: the kill waits for the lines.
    let deadline = Instant::now() + Duration::from_secs(20);
    while started_ids().len() < 4 {
        assert!(Instant::now() < deadline, "{:?}", started_ids());
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir = server.kill_keeping_state();
    for t in running {
        // The connection dies with the server: no response (the request helper panics).
        assert!(t.join().is_err());
    }
    let started = started_ids();
    assert_eq!(started.len(), 4, "{started:?}");

    let server = Server::start_in(dir, "", &[], Some(KEY));
    assert!(server
        .log_lines()
        .iter()
        .any(|l| l.contains("recorded as interrupted") && l.contains("count=3")));
    // Every started execution has exactly one final record, in the file and by id.
    let records: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("event").is_none())
        .collect();
    for id in &started {
        assert_eq!(records.iter().filter(|r| r["id"] == *id).count(), 1, "{id}");
        let r = server.call("GET", &format!("/v1/executions/{id}"), None);
        assert_eq!(r.status, 200, "{}", r.text());
        let record = r.json();
        if *id == done {
            assert_eq!(
                (record["status"].as_str(), record.get("interrupted")),
                (Some("ok"), None)
            );
        } else {
            assert_eq!(record["status"], "internal_error");
            assert_eq!(record["interrupted"], true);
            assert_eq!(record["error"]["type"], "Interrupted");
            assert!(record["error"]["message"]
                .as_str()
                .unwrap()
                .contains("server stopped"));
        }
    }
    // Another key does not see them.
    let other = request(
        server.addr,
        "GET",
        &format!("/v1/executions/{}", started[1]),
        &[h("Authorization", "Bearer another-key-0123456789abcdef")],
        None,
    );
    assert_eq!(other.status, 401);
    // A second start has nothing to add.
    let dir = server.stop_keeping_state();
    let server = Server::start_in(dir, "", &[], Some(KEY));
    assert!(!server
        .log_lines()
        .iter()
        .any(|l| l.contains("recorded as interrupted")));
}

#[test]
fn sessions_a_stopped_server_held_answer_session_lost_to_their_key() {
    let _g = serial();
    let config = other_key_toml("");
    let server = Server::start(&config, &[]);
    let open = |server: &Server| {
        let r = server.call("POST", "/v1/sessions", Some(&json!({})));
        assert_eq!(r.status, 201, "{}", r.text());
        r.json()["id"].as_str().unwrap().to_owned()
    };
    let (kept, closed, graceful) = (open(&server), open(&server), open(&server));
    assert_eq!(
        server
            .call("DELETE", &format!("/v1/sessions/{closed}"), None)
            .status,
        204
    );
    let dir = server.kill_keeping_state();

    let server = Server::start_in(dir, &config, &[], Some(KEY));
    for path in [
        format!("/v1/sessions/{kept}"),
        format!("/v1/sessions/{kept}/files"),
    ] {
        let r = server.call("GET", &path, None);
        assert_eq!(
            (r.status, r.error_code()),
            (410, "session_lost".into()),
            "{}",
            r.text()
        );
        assert!(r.text().contains("restart"), "{}", r.text());
        // Another key learns nothing: as absent as a session that never was.
        assert_eq!(as_other(&server, "GET", &path, None).status, 404);
    }
    let cell = server.call(
        "POST",
        &format!("/v1/sessions/{kept}/execute"),
        Some(&json!({"code": "1"})),
    );
    assert_eq!(cell.status, 410, "{}", cell.text());
    // The session its key closed is simply gone.
    let r = server.call("GET", &format!("/v1/sessions/{closed}"), None);
    assert_eq!((r.status, r.error_code()), (404, "not_found".into()));
    // A session open at a graceful stop is lost as well, and still after another restart.
    let fresh = open(&server);
    let dir = server.stop_keeping_state();
    let server = Server::start_in(dir, &config, &[], Some(KEY));
    for id in [&kept, &graceful, &fresh] {
        let r = server.call("GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(r.status, 410, "{id}: {}", r.text());
    }
    assert_eq!(
        server.call("GET", "/v1/sessions", None).json()["sessions"],
        json!([])
    );
}

/// A request head announcing a large body, and no body.
fn head_without_body(server: &Server, key: &str) -> Option<common::http::Response> {
    head_without_body_to(server, key, "/v1/execute")
}

fn head_without_body_to(server: &Server, key: &str, path: &str) -> Option<common::http::Response> {
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n").unwrap();
    read_response(&mut s)
}

/// An answer given before the request's body was read tells the client to close: the server
/// will not read that body, and a client reusing the connection would get no answer.
#[test]
fn an_answer_before_the_body_is_read_closes_the_connection() {
    let _g = serial();
    let server = Server::start("", &[]);
    let r = head_without_body_to(&server, KEY, "/v1/sessions/se_nope/execute")
        .expect("an answer before the body");
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));
    // One whose body was read keeps its connection.
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = r#"{"code": "1"}"#;
    write!(s, "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let r = read_response(&mut s).expect("an answer");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("connection"), None);
}

#[test]
fn a_throttled_key_is_refused_before_its_body_is_read() {
    let _g = serial();
    let server = Server::start(
        &other_key_toml("max_concurrency = 1\nmax_queue = 0\nrate_per_minute = 2"),
        &[],
    );
    let busy = in_background(&server, "import time\ntime.sleep(1.5)", OTHER_KEY);
    server.wait_running(1);
    // Its one slot is taken: refused on the head (the body timeout is 30 s; the answer does
    // not wait for a body that never comes), and without spending a token.
    let r = head_without_body(&server, OTHER_KEY).expect("an answer before the body");
    assert_eq!((r.status, r.error_code()), (429, "rate_limited".into()));
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(busy.join().unwrap().status, 200);
    assert_eq!(
        as_other(&server, "POST", "/v1/execute", Some(&json!({"code": "1"}))).status,
        200,
        "the refused request cost a token"
    );
    // Out of tokens: refused on the head too.
    let r = head_without_body(&server, OTHER_KEY).expect("an answer before the body");
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_some());
}

#[test]
fn bodies_in_memory_at_once_are_bounded() {
    let _g = serial();
    // Small answers (784 KiB reserved per execution), so that bodies decide.
    let config = format!(
        "[http]\nmax_body_bytes = 4000000\nmax_buffered_bytes_per_key = 5242880\n\
         max_buffered_bytes = 7340032\n[concurrency]\nmax_running = 1\n{}{}",
        common::http::SMALL_ANSWERS,
        other_key_toml("")
    );
    let server = Server::start(&config, &[]);
    let partial = |key: &str, n: usize| {
        let mut s = server.connect();
        write!(s, "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 4000000\r\n\r\n").unwrap();
        s.write_all(&vec![b' '; n]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        s
    };
    let refused = |mut s: std::net::TcpStream| {
        let r = read_response(&mut s).expect("an answer");
        (r.status, r.error_code())
    };
    // One key: 3 MB held; 3 MB more would pass its 5 MiB share.
    let first = partial(KEY, 3_000_000);
    assert_eq!(
        refused(partial(KEY, 3_000_000)),
        (429, "rate_limited".into())
    );
    // Another key still has room, until all bodies together pass 7 MiB.
    let other = partial(OTHER_KEY, 3_000_000);
    assert_eq!(
        refused(partial(OTHER_KEY, 2_200_000)),
        (503, "overloaded".into())
    );
    drop((first, other));
    std::thread::sleep(Duration::from_millis(300));
    // A body whose execution has started no longer counts (its answer's reservation does):
    // two 3 MB bodies of one key, the second waiting in the queue while the first runs.
    let padded = |n: u32| {
        let mut body = vec![b' '; 3_000_000];
        body.extend_from_slice(
            json!({"code": format!("import time\ntime.sleep(1)\n{n}")})
                .to_string()
                .as_bytes(),
        );
        body
    };
    let addr = server.addr;
    let first = padded(1);
    let running = std::thread::spawn(move || {
        request(
            addr,
            "POST",
            "/v1/execute",
            &[h("Authorization", &format!("Bearer {KEY}")), json_type()],
            Some(&first),
        )
    });
    server.wait_running(1);
    let queued = request(
        addr,
        "POST",
        "/v1/execute",
        &[h("Authorization", &format!("Bearer {KEY}")), json_type()],
        Some(&padded(2)),
    );
    assert_eq!(queued.json()["result"], 2, "{}", queued.text());
    assert_eq!(running.join().unwrap().json()["result"], 1);
}

#[test]
fn huge_env_and_file_lists_are_refused_and_hold_nothing() {
    let _g = serial();
    let server = Server::start("[concurrency]\nmax_running = 1\n", &[]);
    let env: serde_json::Map<String, Value> =
        (0..2000).map(|i| (format!("V{i}"), json!(""))).collect();
    let r = server.execute(json!({"code": "1", "env": env}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (413, Some("env"))
    );
    let files: Vec<_> = (0..2000)
        .map(|i| json!({"path": format!("f{i}"), "content": ""}))
        .collect();
    let r = server.execute(json!({"code": "1", "files": files}));
    assert_eq!(
        (r.status, r.json()["error"]["field"].as_str()),
        (413, Some("files"))
    );
    // Two large ones at once (a few MB each): refused, while the only slot serves others.
    let big: Vec<_> = (0..2)
        .map(|n| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let body = if n == 0 {
                    let env: serde_json::Map<String, Value> =
                        (0..300_000).map(|i| (format!("V{i}"), json!(""))).collect();
                    json!({"code": "1", "env": env})
                } else {
                    let mut files: Vec<_> = (0..300_000)
                        .map(|i| json!({"path": format!("{i}"), "content": ""}))
                        .collect();
                    files.push(json!({"path": "0", "content": ""}));
                    json!({"code": "1", "files": files})
                };
                let body = body.to_string();
                request(
                    addr,
                    "POST",
                    "/v1/execute",
                    &[auth(), json_type()],
                    Some(body.as_bytes()),
                )
            })
        })
        .collect();
    for _ in 0..5 {
        assert_eq!(server.execute(json!({"code": "6*7"})).json()["result"], 42);
    }
    for (b, field) in big.into_iter().zip(["env", "files"]) {
        let r = b.join().unwrap();
        assert_eq!(
            (r.status, r.json()["error"]["field"].as_str()),
            (413, Some(field))
        );
    }
}

#[test]
fn sigterm_refuses_queued_and_uploading_requests_and_exits_after_the_grace() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start(
        "shutdown_grace_ms = 1000\n[concurrency]\nmax_running = 1\nmax_queue = 4\n",
        &[],
    );
    let stuck = in_background(&server, "import time\ntime.sleep(60)", KEY);
    server.wait_running(1);
    let queued: Vec<_> = (0..2)
        .map(|_| in_background(&server, "print('must not run')", KEY))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !server
        .call("GET", "/metrics", None)
        .text()
        .contains("airlock_queue_depth 2\n")
    {
        assert!(Instant::now() < deadline, "the two never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut uploading = server.connect();
    write!(uploading, "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"code\"").unwrap();
    std::thread::sleep(Duration::from_millis(200));

    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    let asked = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).unwrap();
    for q in queued {
        let r = q.join().unwrap();
        assert_eq!((r.status, r.error_code()), (503, "shutting_down".into()));
    }
    let r = read_response(&mut uploading).expect("an answer to the upload");
    assert_eq!((r.status, r.error_code()), (503, "shutting_down".into()));
    assert_eq!(stuck.join().unwrap().json()["status"], "internal_error");
    let mut server = server;
    assert!(server.child.wait().unwrap().success());
    let took = asked.elapsed();
    // The grace is 1 s; before queues were closed at shutdown this took grace + 10 s.
    assert!(took < Duration::from_secs(8), "shutdown took {took:?}");
    // Only the execution that ran is in the audit log.
    let audit = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    let statuses: Vec<_> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l.get("event").is_none())
        .map(|l| l["status"].clone())
        .collect();
    assert_eq!(statuses, vec![json!("internal_error")], "{audit}");
    HostState::now().assert_same_as(&before, &"after shutdown");
}

#[test]
fn executions_stop_when_the_audit_log_cannot_be_written() {
    let _g = serial();
    // A small file system of its own for the state directory, to fill up.
    let tmpfs = TmpfsState::mount("audit-full", "256k");
    let (dir, state) = (tmpfs.base.clone(), tmpfs.state.clone());

    let server = Server::start_in(dir.clone(), "", &[], Some(KEY));
    assert_eq!(server.execute(json!({"code": "1"})).status, 200);
    let mut filler = std::fs::File::create(state.join("filler")).unwrap();
    while filler.write_all(&[0; 4096]).is_ok() {}
    // Lines still fit in the file's last page for a while. Executions at once, then one at a
    // time, until the server refuses: every execution that ran has its `started` line.
    let mut ran: Vec<String> = Vec::new();
    let refused = std::cell::Cell::new(0);
    let mut answer = |r: common::http::Response| {
        if r.status == 200 {
            ran.push(r.json()["id"].as_str().unwrap().to_owned());
        } else {
            assert_eq!(
                (r.status, r.error_code()),
                (503, "unavailable".into()),
                "{}",
                r.text()
            );
            assert!(r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("audit"));
            refused.set(refused.get() + 1);
        }
    };
    let at_once: Vec<_> = (0..4)
        .map(|_| in_background(&server, "import time\ntime.sleep(0.5)", KEY))
        .collect();
    for t in at_once {
        answer(t.join().unwrap());
    }
    for _ in 0..50 {
        if refused.get() > 0 {
            break;
        }
        answer(server.execute(json!({"code": "1"})));
    }
    assert!(refused.get() > 0, "the audit log never filled up");
    let r = server.execute(json!({"code": "3"}));
    assert_eq!((r.status, r.error_code()), (503, "unavailable".into()));
    let ready = server.call("GET", "/readyz", None);
    assert_eq!(ready.status, 503);
    assert!(ready.text().contains("audit log"), "{}", ready.text());
    assert!(server
        .log_lines()
        .iter()
        .any(|l| l.contains("cannot append to the audit log")));
    // No torn line, and a `started` line for every execution that ran.
    let audit = std::fs::read_to_string(state.join("audit.jsonl")).unwrap();
    let lines: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    for id in &ran {
        assert!(
            lines
                .iter()
                .any(|l| l["event"] == "started" && l["id"] == id.as_str()),
            "{id} ran without a started line:\n{audit}"
        );
    }

    // Room again: the server recovers by itself, and the records it could not write then
    // are written now. Every execution that ran has exactly one.
    drop(filler);
    std::fs::remove_file(state.join("filler")).unwrap();
    wait_ready(&server);
    let r = server.execute(json!({"code": "4"}));
    assert_eq!(r.status, 200, "{}", r.text());
    ran.push(r.json()["id"].as_str().unwrap().to_owned());
    let lines = audit_lines(&state);
    let resumed: Vec<_> = lines
        .iter()
        .filter(|l| l["event"] == "audit_resumed")
        .collect();
    assert_eq!(resumed.len(), 1, "{lines:?}");
    assert!(resumed[0]["failure"]
        .as_str()
        .unwrap()
        .contains("No space left"));
    for id in &ran {
        let records = lines
            .iter()
            .filter(|l| l.get("event").is_none() && l["id"] == id.as_str())
            .count();
        assert_eq!(records, 1, "{id}: {lines:?}");
        assert_eq!(
            server
                .call("GET", &format!("/v1/executions/{id}"), None)
                .status,
            200
        );
    }

    drop(server);
}

#[test]
fn executions_stop_while_the_state_directory_is_read_only_and_resume_once_it_is_writable() {
    let _g = serial();
    let dir = std::env::temp_dir().join(format!("airlock-audit-ro-{}", std::process::id()));
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    // An ext4 file system of its own that the kernel turns read-only on an error, as it does
    // for a failing disk (errors=remount-ro).
    let image = dir.join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    sh(&["mkfs.ext4", "-q", image.to_str().unwrap()]);
    sh(&[
        "mount",
        "-o",
        "loop,errors=remount-ro",
        image.to_str().unwrap(),
        state.to_str().unwrap(),
    ]);
    struct Unmount(std::path::PathBuf, std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            while std::process::Command::new("umount")
                .args(["-l", self.0.to_str().unwrap()])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {}
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _unmount = Unmount(state.clone(), dir.clone());
    let device = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == state.to_str())
        .and_then(|l| {
            l.rsplit(' ')
                .nth(1)
                .map(|d| d.trim_start_matches("/dev/").to_owned())
        })
        .unwrap();

    let server = Server::start_in(dir.clone(), "", &[], Some(KEY));
    let first = server.execute(json!({"code": "1"}));
    assert_eq!(first.status, 200);
    std::fs::write(
        format!("/sys/fs/ext4/{device}/trigger_fs_error"),
        "airlock test",
    )
    .unwrap();
    let r = server.execute(json!({"code": "2"}));
    assert_eq!((r.status, r.error_code()), (503, "unavailable".into()));
    // The write says EROFS, or the sync of the line before it EIO: either is named.
    let broken = |t: &str| t.contains("Read-only file system") || t.contains("Input/output error");
    assert!(broken(&r.text()), "{}", r.text());
    let ready = server.call("GET", "/readyz", None);
    assert_eq!(ready.status, 503);
    assert!(broken(&ready.text()), "{}", ready.text());
    // Reads still work: records already written are served.
    let id = first.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        server
            .call("GET", &format!("/v1/executions/{id}"), None)
            .status,
        200
    );

    // The operator moves the state to a sound file system: the server finds its log there
    // by itself and goes on.
    let saved = dir.join("saved");
    sh(&["cp", "-a", state.to_str().unwrap(), saved.to_str().unwrap()]);
    sh(&["umount", "-l", state.to_str().unwrap()]);
    sh(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=4m,mode=0700",
        "airlock-test",
        state.to_str().unwrap(),
    ]);
    sh(&[
        "cp",
        "-a",
        &format!("{}/.", saved.display()),
        state.to_str().unwrap(),
    ]);
    wait_ready(&server);
    let r = server.execute(json!({"code": "3"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let lines = audit_lines(&state);
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "audit_resumed" && broken(l["failure"].as_str().unwrap())),
        "{lines:?}"
    );
    for id in [id, r.json()["id"].as_str().unwrap().to_owned()] {
        let records = lines
            .iter()
            .filter(|l| l.get("event").is_none() && l["id"] == id.as_str())
            .count();
        assert_eq!(records, 1, "{id}: {lines:?}");
    }
    drop(server);
}

fn sh(argv: &[&str]) {
    let status = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .status()
        .unwrap();
    assert!(status.success(), "{argv:?}: {status}");
}

/// Waits (up to 10 s) for `/readyz` to answer 200.
fn wait_ready(server: &Server) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = server.call("GET", "/readyz", None);
        if r.status == 200 {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "never ready: {}",
            r.text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn audit_lines(state: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(state.join("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// logrotate's way: the log is moved away, SIGHUP, and the server continues in a new file at
/// the same path; nothing written before the signal is lost, nothing after goes to the old one.
#[test]
fn sighup_reopens_the_audit_log_for_logrotate() {
    let _g = serial();
    let server = Server::start("", &[]);
    let run = || {
        let r = server.call("POST", "/v1/execute", Some(&json!({"code": "print(7)"})));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["id"].as_str().unwrap().to_owned()
    };
    let before = run();
    let log = server.state_dir().join("audit.jsonl");
    let rotated = server.state_dir().join("audit.jsonl.1");
    std::fs::rename(&log, &rotated).unwrap();
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGHUP).unwrap();
    server.wait_log_lines("audit log reopened", 1);
    let after = run();
    let old = std::fs::read_to_string(&rotated).unwrap();
    let new = std::fs::read_to_string(&log).unwrap();
    assert_eq!(old.matches(&before).count(), 2, "{old}");
    assert!(!old.contains(&after), "{old}");
    assert_eq!(new.matches(&after).count(), 2, "{new}");
    assert!(!new.contains(&before), "{new}");
    // The record written before the rotation is still served.
    let r = server.call("GET", &format!("/v1/executions/{before}"), None);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn keys_are_read_again_on_sighup_and_a_bad_file_changes_nothing() {
    let _g = serial();
    let (first, second) = ("first-key-0123456789abcdef", "second-key-0123456789abcdef");
    let keys = |entries: &[(&str, &str, &str)]| -> String {
        entries
            .iter()
            .map(|(name, key, extra)| {
                format!(
                    "[[keys]]\nname = \"{name}\"\nhash = \"sha256:{}\"\n{extra}\n",
                    airlock_api::sha256_hex(key.as_bytes())
                )
            })
            .collect()
    };
    let server = Server::start_in(
        common::scratch_dir("airlock-sighup").into_path(),
        &keys(&[("first", first, "")]),
        &[],
        None,
    );
    let run = |key: &str| {
        common::http::call_as(
            server.addr,
            key,
            "POST",
            "/v1/execute",
            Some(&json!({"code": "print(7)"})),
        )
    };
    assert_eq!(run(first).status, 200);
    assert_eq!(run(second).status, 401);
    let hup = || {
        let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::SIGHUP).unwrap();
    };
    let config = server.dir.join("airlock.toml");

    // The second key replaces the first, with a rate limit of its own that holds at once.
    std::fs::write(&config, keys(&[("second", second, "rate_per_minute = 2")])).unwrap();
    hup();
    assert_eq!(
        server.wait_log_lines("keys reloaded", 1).len(),
        1,
        "{:#?}",
        server.log_lines()
    );
    // Only keys changed: nothing else is said to need a restart (the configuration read
    // again is settled as the start's was: its state directory, audit log and store password).
    assert!(
        !server
            .log_lines()
            .iter()
            .any(|l| l.contains("need a restart")),
        "{:#?}",
        server.log_lines()
    );
    assert_eq!(run(first).status, 401);
    let r = run(second);
    assert_eq!(
        (r.status, r.json()["stdout"].as_str()),
        (200, Some("7\n")),
        "{}",
        r.text()
    );
    assert_eq!(run(second).status, 200);
    assert_eq!(run(second).status, 429, "the reloaded key's rate limit");

    // A file that does not parse, or keys that are not valid, leave the keys as they were.
    std::fs::write(&config, "[[keys]\nname = ").unwrap();
    hup();
    assert_eq!(server.wait_log_lines("keys stay as they were", 1).len(), 1);
    std::fs::write(&config, keys(&[("a", first, ""), ("b", first, "")])).unwrap();
    hup();
    assert_eq!(server.wait_log_lines("keys stay as they were", 2).len(), 2);
    assert_eq!(run(first).status, 401);
    assert_eq!(
        run(second).status,
        429,
        "still the same key, and still its tokens"
    );

    // Another change than keys is not applied, and the log says so.
    std::fs::write(
        &config,
        "shutdown_grace_ms = 1\n".to_owned() + &keys(&[("first", first, "")]),
    )
    .unwrap();
    hup();
    assert_eq!(server.wait_log_lines("keys reloaded", 2).len(), 2);
    assert!(server
        .log_lines()
        .iter()
        .any(|l| l.contains("need a restart")));
    assert_eq!(run(first).status, 200);
    assert!(server.stop().success());
}

#[test]
fn readyz_answers_a_probe_without_a_key_only_when_configured_and_only_ready_or_not() {
    let _g = serial();
    let server = Server::start("", &[]);
    assert_eq!(
        request(server.addr, "GET", "/readyz", &[], None).status,
        401
    );
    drop(server);
    let server = Server::start("[http]\nreadyz_without_key = true\n", &[]);
    let probe = request(server.addr, "GET", "/readyz", &[], None);
    assert_eq!(probe.status, 200, "{}", probe.text());
    assert_eq!(probe.json(), json!({"ready": true}));
    // The kubelet sends the pod's address as Host: a keyless probe answers any Host.
    let kubelet = request(
        server.addr,
        "GET",
        "/readyz",
        &[h("Host", "10.1.2.3:8080")],
        None,
    );
    assert_eq!(kubelet.status, 200, "{}", kubelet.text());
    let keyed_foreign = request(
        server.addr,
        "GET",
        "/readyz",
        &[
            h("Host", "10.1.2.3:8080"),
            h("Authorization", &format!("Bearer {KEY}")),
        ],
        None,
    );
    assert_eq!(
        keyed_foreign.status, 421,
        "a request with a key still checks Host"
    );
    // A key gets the reasons; a wrong key is still refused; nothing else opens.
    let keyed = server.call("GET", "/readyz", None);
    assert_eq!(keyed.status, 200);
    assert!(keyed.json().get("reasons").is_some(), "{}", keyed.text());
    let wrong = request(
        server.addr,
        "GET",
        "/readyz",
        &[h("Authorization", "Bearer not-a-key-0123456789abcdef")],
        None,
    );
    assert_eq!(wrong.status, 401);
    for path in ["/metrics", "/v1/tools"] {
        assert_eq!(
            request(server.addr, "GET", path, &[], None).status,
            401,
            "{path}"
        );
    }
    // The API's description is public, as any client's generator needs it.
    let doc = request(server.addr, "GET", "/openapi.json", &[], None);
    assert_eq!(doc.status, 200);
    assert_eq!(doc.json()["openapi"], "3.1.0");
    drop(server);
    // Not ready says so, and why only to a key: every slot taken, no queue.
    let server = Server::start(
        "[http]\nreadyz_without_key = true\n[concurrency]\nmax_running = 1\nmax_queue = 0\n",
        &[],
    );
    let busy = in_background(&server, "import time\ntime.sleep(3)", KEY);
    server.wait_running(1);
    let probe = request(server.addr, "GET", "/readyz", &[], None);
    assert_eq!((probe.status, probe.json()), (503, json!({"ready": false})));
    let keyed = server.call("GET", "/readyz", None).json();
    assert!(
        keyed["reasons"][0].as_str().unwrap().contains("full"),
        "{keyed}"
    );
    let _ = busy.join();
}

/// A binary copied without `libairlock_sandbox.so` beside it makes every fresh sandbox a cold
/// one: it says so in its log at start, where the one built beside its library says nothing.
#[test]
fn a_server_without_its_library_says_its_zygotes_are_off() {
    use std::io::BufRead;
    let _g = serial();
    let dir = scratch_dir("no-library");
    let alone = dir.join("airlock");
    std::fs::copy(env!("CARGO_BIN_EXE_airlock"), &alone).unwrap();
    let state = dir.join("state");
    let mut child = std::process::Command::new(&alone)
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&state)
        .env("AIRLOCK_API_KEY", KEY)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let listening = line.contains("listening");
        lines.push(line);
        if listening {
            break;
        }
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM).unwrap();
    child.wait().unwrap();
    let warned = |lines: &[String]| {
        lines.iter().any(|l| {
            l.contains("WARN")
                && l.contains("zygotes are off")
                && l.contains("libairlock_sandbox.so")
        })
    };
    assert!(warned(&lines), "{lines:#?}");
    // Beside its library: no such line.
    let server = Server::start("", &[]);
    let r = server.execute(json!({"code": "print(1)"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!warned(&server.log_lines()), "{:#?}", server.log_lines());
}
