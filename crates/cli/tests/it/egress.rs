//! Egress on a leash through the real server: sandboxed code reaches an HTTP and an HTTPS
//! server on the host's loopback only through airlock's proxy, only where its key's policy
//! (and the operator's explicit range for loopback) allows, within its budgets, with every
//! connection in the audit log and metrics. The hostile cases speak to the proxy directly.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::http::{Response, Server};
use common::key_hash as hash;
use serde_json::{json, Value};

/// Reaches localhost on the targets' ports, with 127.0.0.0/8 opened explicitly.
const OPEN: &str = "open-key-0123456789abcdef";
/// The same host rules without the range: loopback is refused after resolution.
const CLOSED: &str = "closed-key-0123456789abcdef";
/// No egress at all.
const NONE: &str = "none-key-0123456789abcdef";

/// The HTTP and HTTPS servers of `egress_server.py`, with a fresh self-signed certificate
/// for `localhost`.
struct Targets {
    child: Child,
    http: u16,
    https: u16,
    /// A listener whose full queue makes the kernel drop connection attempts.
    stalled: u16,
    /// An upstream that reads and records every request sent on a connection.
    recorder: u16,
    cert_pem: String,
}

impl Targets {
    fn start() -> Targets {
        let dir = std::env::temp_dir().join(format!("airlock-egress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=DNS:localhost",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(Stdio::null())
            .status()
            .expect("openssl");
        assert!(made.success());
        let mut child = Command::new("/usr/bin/python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/egress_server.py"
            ))
            .arg(&cert)
            .arg(&key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut port = || -> u16 { lines.next().unwrap().unwrap().trim().parse().unwrap() };
        let (http, https, stalled, recorder) = (port(), port(), port(), port());
        let cert_pem = std::fs::read_to_string(&cert).unwrap();
        // The server loaded both before it printed its ports.
        let _ = std::fs::remove_dir_all(&dir);
        Targets {
            child,
            http,
            https,
            stalled,
            recorder,
            cert_pem,
        }
    }

    /// What the recorder received so far, asked directly (not through a proxy).
    fn recorded(&self) -> Vec<Value> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.recorder)).unwrap();
        s.write_all(b"GET /recorded HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8(answer).unwrap();
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        serde_json::from_str(body).unwrap()
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Host rules for localhost and the names `[egress.resolve]` answers (to the metadata
/// address, a private one, an IPv4-mapped loopback one) on both ports.
fn host_rules(t: &Targets) -> String {
    let ports = format!("[{}, {}, {}, {}]", t.http, t.https, t.stalled, t.recorder);
    ["localhost", "metadata.test", "inside.test", "mapped.test"]
        .iter()
        .map(|h| format!("{{ host = \"{h}\", ports = {ports} }}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn config(t: &Targets, budgets: &str) -> String {
    let hosts = host_rules(t);
    format!(
        r#"
[egress]
{budgets}
[egress.resolve]
"metadata.test" = ["169.254.169.254"]
"inside.test" = ["10.1.2.3"]
"mapped.test" = ["::ffff:127.0.0.1"]

[[keys]]
name = "open"
hash = "{open}"
egress = {{ hosts = [{hosts}], ranges = [{{ cidr = "127.0.0.0/8", ports = [{http}, {https}, {stalled}, {recorder}] }}] }}

[[keys]]
name = "closed"
hash = "{closed}"
egress = {{ hosts = [{hosts}] }}

[[keys]]
name = "none"
hash = "{none}"
"#,
        open = hash(OPEN),
        closed = hash(CLOSED),
        none = hash(NONE),
        http = t.http,
        https = t.https,
        stalled = t.stalled,
        recorder = t.recorder,
    )
}

fn call(server: &Server, key: &str, method: &str, path: &str, body: Option<&Value>) -> Response {
    common::http::call_as(server.addr, key, method, path, body)
}

/// Runs a request body as `key`; the whole result, which must be `ok`.
fn run(server: &Server, key: &str, body: Value) -> Value {
    let r = call(server, key, "POST", "/v1/execute", Some(&body));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    assert_eq!(r["status"], "ok", "{r:#}");
    r
}

/// Python that fetches `url` with urllib through the proxy (the sandbox's `HTTP(S)_PROXY`),
/// trusting only the targets' certificate: `[status, body]`, or `["error", why]`.
const FETCH: &str = r#"
import ssl, urllib.request, urllib.error
def fetch(url, data=None):
    ctx = ssl.create_default_context(cafile="/work/cert.pem")
    try:
        with urllib.request.urlopen(url, data=data, timeout=10, context=ctx) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.headers.get("X-Airlock-Egress")]
    except Exception as e:
        return ["error", str(e)]
"#;

fn fetch_body(t: &Targets, calls: &str) -> Value {
    json!({
        "code": format!("{FETCH}\n{calls}"),
        "files": [{"path": "cert.pem", "content": t.cert_pem}],
    })
}

/// The audit log's egress lines.
fn egress_lines(server: &Server) -> Vec<Value> {
    std::fs::read_to_string(server.state_dir().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "egress")
        .collect()
}

/// Waits until the audit log holds at least `n` egress lines (each is written when its
/// connection ends, which may be just after the execution's answer).
fn wait_egress_lines(server: &Server, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let lines = egress_lines(server);
        if lines.len() >= n || std::time::Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn loopback_servers_are_reached_through_the_proxy_only_where_the_range_is_listed() {
    let _serial = common::serial();
    let t = Targets::start();
    let server = Server::start(&config(&t, ""), &[]);
    let calls = format!(
        "[fetch('http://localhost:{h}/hello'), fetch('https://localhost:{s}/hello')]",
        h = t.http,
        s = t.https
    );
    let r = run(&server, OPEN, fetch_body(&t, &calls));
    // HTTPS is a tunnel: the code verified the server's own certificate, nothing in between.
    assert_eq!(
        r["result"],
        json!([[200, "hello from http"], [200, "hello from https"]]),
        "{r:#}"
    );
    assert_eq!(r["isolation"]["network"], "egress_proxy");
    assert_eq!(
        r["isolation"]["egress"]["ranges"],
        json!([{"cidr": "127.0.0.0/8", "ports": [t.http, t.https, t.stalled, t.recorder]}])
    );
    let usage = &r["usage"]["egress"];
    assert_eq!(
        (usage["connections"].as_u64(), usage["denied"].as_u64()),
        (Some(2), Some(0))
    );
    assert!(usage["bytes_in"].as_u64().unwrap() > 0, "{usage}");

    // One connection each in the audit log, with the address actually connected to.
    let lines = wait_egress_lines(&server, 2);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    for line in &lines {
        assert_eq!(line["execution_id"], r["id"], "{line}");
        assert_eq!(line["key"], "open");
        assert_eq!(line["host"], "localhost");
        assert_eq!(line["address"], "127.0.0.1");
        assert_eq!(line["outcome"], "allowed");
        assert!(line["bytes_in"].as_u64().unwrap() > 0, "{line}");
    }
    let methods: Vec<&str> = lines
        .iter()
        .map(|l| l["method"].as_str().unwrap())
        .collect();
    assert!(
        methods.contains(&"CONNECT") && methods.contains(&"GET"),
        "{methods:?}"
    );

    // The same requests under the same host rules, without the range: refused once resolved.
    let r = run(&server, CLOSED, fetch_body(&t, &calls));
    let result = r["result"].to_string();
    assert!(
        result.contains("denied; reason=special_address") && result.contains("403"),
        "{result}"
    );
    assert_eq!(r["usage"]["egress"]["denied"], 2);
    let denied = wait_egress_lines(&server, 4);
    assert!(denied[2..]
        .iter()
        .all(|l| l["outcome"] == "denied" && l["reason"] == "special_address"));

    // A key without egress: no proxy, no variable, no network, and the result says so.
    let r = run(
        &server,
        NONE,
        json!({"code": "import os, socket\ns = socket.socket()\ntry:\n    s.connect(('127.0.0.1', 3128)); out = 'connected'\nexcept OSError as e:\n    out = e.errno\n[os.environ.get('HTTPS_PROXY'), out]"}),
    );
    assert_eq!(r["result"], json!([null, 13]));
    assert_eq!(r["isolation"]["network"], "none");
    assert!(r["isolation"].get("egress").is_none() && r["usage"].get("egress").is_none());

    let metrics = call(&server, OPEN, "GET", "/metrics", None).text();
    for series in [
        "airlock_egress_connections_total{outcome=\"allowed\",reason=\"\"} 2",
        "airlock_egress_connections_total{outcome=\"denied\",reason=\"special_address\"} 2",
    ] {
        assert!(metrics.contains(series), "{series} missing");
    }
    assert!(metrics.contains("airlock_egress_bytes_total{direction=\"in\"}"));
}

/// Python that speaks to the proxy by hand: sends `head` and returns the status line and the
/// `X-Airlock-Egress` header of its answer.
const RAW: &str = r#"
import socket
def raw(head):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(head.encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    lines = data.decode(errors="replace").split("\r\n")
    reason = [l.split(": ", 1)[1] for l in lines if l.lower().startswith("x-airlock-egress:")]
    return [lines[0], reason[0] if reason else None]
"#;

#[test]
fn hostile_targets_are_refused_by_name_address_and_port() {
    let _serial = common::serial();
    let t = Targets::start();
    let server = Server::start(&config(&t, ""), &[]);
    let p = t.http;
    let cases = [
        // Listed names whose answers are special addresses outside the listed range.
        (
            format!("CONNECT metadata.test:{p} HTTP/1.1\r\n\r\n"),
            "special_address",
        ),
        (
            format!("CONNECT inside.test:{p} HTTP/1.1\r\n\r\n"),
            "special_address",
        ),
        (
            format!("GET http://inside.test:{p}/ HTTP/1.1\r\nHost: inside.test\r\n\r\n"),
            "special_address",
        ),
        // Suffix and prefix confusion, case and a final dot do not widen a rule.
        (
            format!("CONNECT localhost.evil.example:{p} HTTP/1.1\r\n\r\n"),
            "host_not_listed",
        ),
        (
            format!("CONNECT evil-localhost:{p} HTTP/1.1\r\n\r\n"),
            "host_not_listed",
        ),
        (
            format!("CONNECT pypi.org.localhost:{p} HTTP/1.1\r\n\r\n"),
            "host_not_listed",
        ),
        // IP literals outside the listed range, in every spelling.
        (
            format!("CONNECT 169.254.169.254:{p} HTTP/1.1\r\n\r\n"),
            "ip_literal",
        ),
        (
            format!("CONNECT 10.0.0.1:{p} HTTP/1.1\r\n\r\n"),
            "ip_literal",
        ),
        (format!("CONNECT [::1]:{p} HTTP/1.1\r\n\r\n"), "ip_literal"),
        (
            format!("CONNECT [::ffff:169.254.169.254]:{p} HTTP/1.1\r\n\r\n"),
            "ip_literal",
        ),
        (
            format!("GET http://[fd00::1]:{p}/ HTTP/1.1\r\n\r\n"),
            "ip_literal",
        ),
        // A listed host on a port it is not listed for.
        (
            "CONNECT localhost:22 HTTP/1.1\r\n\r\n".to_owned(),
            "port_not_listed",
        ),
        (
            "GET http://localhost/ HTTP/1.1\r\n\r\n".to_owned(),
            "port_not_listed",
        ),
        // What the proxy does not speak.
        (
            format!("GET https://localhost:{p}/ HTTP/1.1\r\n\r\n"),
            "bad_request",
        ),
        (
            format!("CONNECT user@localhost:{p} HTTP/1.1\r\n\r\n"),
            "bad_request",
        ),
        ("hello\r\n\r\n".to_owned(), "bad_request"),
        // Framing two readers could read differently (request smuggling).
        (
            format!("POST http://localhost:{p}/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "bad_request",
        ),
        (
            format!("POST http://localhost:{p}/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 30\r\n\r\n"),
            "bad_request",
        ),
    ];
    let heads: Vec<&str> = cases.iter().map(|(h, _)| h.as_str()).collect();
    let code = format!(
        "{RAW}\n[raw(h) for h in {}]",
        serde_json::to_string(&heads).unwrap()
    );
    let r = run(&server, OPEN, json!({ "code": code }));
    let answers = r["result"].as_array().unwrap();
    for ((head, reason), answer) in cases.iter().zip(answers) {
        let header = answer[1].as_str().unwrap_or("");
        assert!(
            header.ends_with(&format!("reason={reason}")),
            "{head:?} -> {answer}"
        );
        let status = answer[0].as_str().unwrap();
        let expected = if *reason == "bad_request" {
            " 400 "
        } else {
            " 403 "
        };
        assert!(status.contains(expected), "{head:?} -> {answer}");
    }
    // The IPv4-mapped answer is the loopback address, which the range covers: allowed.
    let mapped = run(
        &server,
        OPEN,
        json!({"code": format!("{RAW}\nraw('CONNECT mapped.test:{p} HTTP/1.1\\r\\n\\r\\n')")}),
    );
    assert_eq!(
        mapped["result"],
        json!(["HTTP/1.1 200 Connection established", null])
    );
    let lines = wait_egress_lines(&server, cases.len() + 1);
    let last = lines.last().unwrap();
    assert_eq!(
        (&last["host"], &last["address"]),
        (&json!("mapped.test"), &json!("127.0.0.1"))
    );

    // Everything but the proxy fails at once: other ports (Landlock), no resolver, UDP and
    // raw sockets.
    let code = r#"
import errno, socket
out = {}
for port in (22, 80, 3129):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2); out[str(port)] = "connected"
    except OSError as e:
        out[str(port)] = errno.errorcode[e.errno]
try:
    socket.getaddrinfo("pypi.org", 443); out["dns"] = "resolved"
except OSError as e:
    out["dns"] = "failed"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("8.8.8.8", 53)); out["udp"] = "sent"
except OSError as e:
    out["udp"] = errno.errorcode[e.errno]
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); out["raw"] = "opened"
except OSError as e:
    out["raw"] = errno.errorcode[e.errno]
out
"#;
    let r = run(&server, OPEN, json!({ "code": code }));
    assert_eq!(
        r["result"],
        json!({"22": "EACCES", "80": "EACCES", "3129": "EACCES", "dns": "failed", "udp": "ENETUNREACH", "raw": "EPERM"}),
        "{r:#}"
    );
}

/// Python that speaks to the proxy by hand about the recorder's port `P`: requests followed
/// on the same connection by a second one (pipelined, or after the first answer, as a
/// keep-alive client does) to a name the policy refuses, with proxy headers; and a client
/// that reuses its connection as keep-alive clients do.
const ONE_REQUEST: &str = r#"
import http.client, socket
def answer(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            return [data.decode(errors="replace"), None, None, b""]
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    fields = dict((k.strip().lower(), v.strip()) for k, v in (l.split(":", 1) for l in lines[1:]))
    n = int(fields.get("content-length", "0"))
    while len(body) < n:
        chunk = s.recv(4096)
        if not chunk:
            break
        body += chunk
    return [lines[0], fields.get("connection"), body[:n].decode(), body[n:]]
def after(s, rest):
    # What comes after the answer: nothing but the connection's end.
    s.settimeout(5)
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return rest.decode(errors="replace")
            rest += chunk
    except OSError as e:
        return type(e).__name__
def first(name, extra=""):
    return (f"GET http://localhost:{P}/{name} HTTP/1.1\r\nHost: localhost:{P}\r\n"
            f"Proxy-Authorization: Basic c2VjcmV0\r\n{extra}\r\n").encode()
def second(name):
    return (f"GET http://inside.test:{P}/{name} HTTP/1.1\r\nHost: inside.test\r\n"
            "Proxy-Authorization: Basic c2VjcmV0\r\n\r\n").encode()
def pipelined(request, name):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(request + second(name))
    got = answer(s)
    return got[:3] + [after(s, got[3])]
def kept():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(first("kept", "Connection: keep-alive\r\n"))
    got = answer(s)
    s.sendall(second("kept-second"))
    return got[:3] + [after(s, got[3])]
def reused():
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
    out = []
    for name in ("reused-1", "reused-2"):
        c.request("GET", f"http://localhost:{P}/{name}")
        r = c.getresponse()
        out.append([r.status, r.read().decode()])
    return out
post = f"POST http://localhost:{P}/posted HTTP/1.1\r\nHost: localhost:{P}\r\nContent-Length: 5\r\n\r\nhello"
chunked = (f"POST http://localhost:{P}/chunked HTTP/1.1\r\nHost: localhost:{P}\r\n"
           "Transfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n")
{
    "piped": pipelined(first("piped"), "piped-second"),
    "posted": pipelined(post.encode(), "posted-second"),
    "chunked": pipelined(chunked.encode(), "chunked-second"),
    "kept": kept(),
    "reused": reused(),
}
"#;

#[test]
fn plain_http_relays_one_request_per_connection_and_nothing_after_it() {
    let _serial = common::serial();
    let t = Targets::start();
    let server = Server::start(&config(&t, ""), &[]);
    let code = format!("P = {}\n{ONE_REQUEST}", t.recorder);
    let r = run(&server, OPEN, json!({ "code": code }));
    // Each answer says the connection closes, and nothing follows it: the second request
    // was never answered.
    let ok = |path: &str, method: &str| {
        json!([
            "HTTP/1.1 200 OK",
            "close",
            format!("recorded {method} /{path} HTTP/1.1"),
            ""
        ])
    };
    assert_eq!(r["result"]["piped"], ok("piped", "GET"), "{r:#}");
    assert_eq!(r["result"]["posted"], ok("posted", "POST"), "{r:#}");
    assert_eq!(r["result"]["chunked"], ok("chunked", "POST"), "{r:#}");
    assert_eq!(r["result"]["kept"], ok("kept", "GET"), "{r:#}");
    // A client that reuses its connection opens a new one, as the answer told it to.
    assert_eq!(
        r["result"]["reused"],
        json!([
            [200, "recorded GET /reused-1 HTTP/1.1"],
            [200, "recorded GET /reused-2 HTTP/1.1"]
        ]),
        "{r:#}"
    );

    // The upstream received exactly the six first requests, one per connection, each as the
    // proxy checked and rewrote it, with its whole body: no second request, no byte after.
    let recorded = t.recorded();
    let lines: Vec<&str> = recorded
        .iter()
        .map(|q| q["line"].as_str().unwrap_or("(leftover bytes)"))
        .collect();
    assert_eq!(
        lines,
        [
            "GET /piped HTTP/1.1",
            "POST /posted HTTP/1.1",
            "POST /chunked HTTP/1.1",
            "GET /kept HTTP/1.1",
            "GET /reused-1 HTTP/1.1",
            "GET /reused-2 HTTP/1.1"
        ],
        "{recorded:#?}"
    );
    let mut connections: Vec<u64> = recorded
        .iter()
        .map(|q| q["connection"].as_u64().unwrap())
        .collect();
    connections.dedup();
    assert_eq!(connections.len(), 6, "{recorded:#?}");
    for q in &recorded {
        let headers: Vec<(&str, &str)> = q["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h[0].as_str().unwrap(), h[1].as_str().unwrap()))
            .collect();
        assert!(headers.contains(&("connection", "close")), "{q}");
        assert!(
            headers.contains(&("host", &format!("localhost:{}", t.recorder))),
            "{q}"
        );
        assert!(!headers.iter().any(|(k, _)| k.starts_with("proxy-")), "{q}");
    }
    assert_eq!(recorded[1]["body"], "hello");
    assert_eq!(recorded[2]["body"], "hello");

    // Each audit line says what was dropped: the four connections a second request followed.
    let lines = wait_egress_lines(&server, 6);
    let dropped = lines
        .iter()
        .filter(|l| {
            l["detail"]
                .as_str()
                .is_some_and(|d| d.ends_with("were dropped (one request per connection)"))
        })
        .count();
    assert_eq!(dropped, 4, "{lines:#?}");
    assert!(
        lines.iter().all(|l| l["outcome"] == "allowed"),
        "{lines:#?}"
    );
}

#[test]
fn connections_between_cells_belong_to_the_session_and_its_own_budget() {
    let _serial = common::serial();
    let t = Targets::start();
    let server = Server::start(&config(&t, "max_connections = 4"), &[]);
    let r = call(&server, OPEN, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(r.status, 201, "{}", r.text());
    let session = r.json()["id"].as_str().unwrap().to_owned();
    let path = |rest: &str| format!("/v1/sessions/{session}{rest}");
    let cell = |code: String| {
        let r = call(
            &server,
            OPEN,
            "POST",
            &path("/execute"),
            Some(&json!({ "code": code })),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let r = r.json();
        assert_eq!(r["status"], "ok", "{r:#}");
        r
    };
    // Cell 1 leaves a thread behind that waits for a file, then makes five requests: all of
    // them after the cell has ended.
    let first = cell(format!(
        r#"
import json, os, threading, time, urllib.error, urllib.request
def later():
    while not os.path.exists("/work/go"):
        time.sleep(0.02)
    out = []
    for _ in range(5):
        try:
            with urllib.request.urlopen("http://localhost:{h}/hello", timeout=10) as r:
                out.append(r.status)
        except urllib.error.HTTPError as e:
            out.append(e.code)
        except Exception as e:
            out.append(str(e))
    with open("/work/done.json", "w") as f:
        json.dump(out, f)
threading.Thread(target=later, daemon=True).start()
"#,
        h = t.http
    ));
    let none = json!({"connections": 0, "denied": 0, "bytes_out": 0, "bytes_in": 0});
    assert_eq!(first["usage"]["egress"], none, "{first:#}");
    let r = call(&server, OPEN, "PUT", &path("/files/go"), Some(&json!("go")));
    assert!(r.status < 300, "{}", r.text());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let done = loop {
        let r = call(&server, OPEN, "GET", &path("/files/done.json"), None);
        if r.status == 200 {
            break r.json();
        }
        assert!(std::time::Instant::now() < deadline, "{}", r.text());
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // The session's time between cells has one budget of its own: four connections.
    assert_eq!(done, json!([200, 200, 200, 200, 429]));
    let info = call(&server, OPEN, "GET", &path(""), None).json();
    let between = &info["egress_between_cells"];
    assert_eq!(
        (&between["connections"], &between["denied"]),
        (&json!(4), &json!(1)),
        "{info:#}"
    );
    assert!(between["bytes_in"].as_u64().unwrap() > 0, "{info:#}");

    // Audited as the session's, between cells, never as cell 1's.
    let lines = wait_egress_lines(&server, 5);
    assert_eq!(lines.len(), 5, "{lines:#?}");
    for line in &lines {
        assert_eq!(line["session_id"], json!(session), "{line}");
        assert_eq!(line["between_cells"], true, "{line}");
        assert_eq!(line["execution_id"], Value::Null, "{line}");
    }
    let outcomes: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["outcome"].as_str().unwrap(),
                l["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == ("allowed", "")).count(),
        4,
        "{lines:#?}"
    );
    assert!(
        outcomes.contains(&("denied", "connection_budget")),
        "{lines:#?}"
    );

    // The next cell has its own budget and id; the session's account is left as it was.
    let second = cell(format!(
        "import urllib.request\nurllib.request.urlopen('http://localhost:{}/hello', timeout=10).status",
        t.http
    ));
    assert_eq!(second["result"], 200, "{second:#}");
    assert_eq!(second["usage"]["egress"]["connections"], 1, "{second:#}");
    let lines = wait_egress_lines(&server, 6);
    let last = &lines[5];
    assert_eq!(
        (
            &last["execution_id"],
            &last["session_id"],
            last.get("between_cells")
        ),
        (&second["id"], &json!(session), None),
        "{last}"
    );
    let info = call(&server, OPEN, "GET", &path(""), None).json();
    assert_eq!(info["egress_between_cells"], *between, "{info:#}");
    let r = call(&server, OPEN, "DELETE", &path(""), None);
    assert!(r.status < 300, "{}", r.text());
}

#[test]
fn budgets_cut_connections_and_say_why() {
    let _serial = common::serial();
    let t = Targets::start();
    let budgets = "max_connections = 4\nmax_bytes_in = 1048576\nmax_bytes_out = 262144\nidle_timeout_ms = 1500\nconnect_timeout_ms = 1000";
    let server = Server::start(&config(&t, budgets), &[]);
    let h = t.http;
    // Connections: the fifth is refused, with its own status.
    let code = format!("[fetch('http://localhost:{h}/hello')[0] for _ in range(6)]");
    let r = run(&server, OPEN, fetch_body(&t, &code));
    assert_eq!(r["result"], json!([200, 200, 200, 200, 429, 429]), "{r:#}");
    assert_eq!(r["usage"]["egress"]["connections"], 4);
    assert_eq!(r["usage"]["egress"]["denied"], 2);
    // Refused at accept, before any thread: only the first refusal is audited.
    let lines = wait_egress_lines(&server, 5);
    let refused: Vec<&Value> = lines
        .iter()
        .filter(|l| l["reason"] == "connection_budget")
        .collect();
    assert_eq!(refused.len(), 1, "{lines:#?}");
    assert!(
        refused[0]["detail"]
            .as_str()
            .unwrap()
            .ends_with("further refusals are counted, not audited one by one"),
        "{refused:?}"
    );
    // Every refusal counts in the metric, audited or not.
    let metrics = call(&server, OPEN, "GET", "/metrics", None).text();
    let series =
        "airlock_egress_connections_total{outcome=\"denied\",reason=\"connection_budget\"} 2\n";
    assert!(metrics.contains(series), "{series} missing");

    // Connections that never send a request hold at most the budget's worth of threads: the
    // rest are answered at accept.
    let code = r#"
import socket
held = [socket.create_connection(("127.0.0.1", 3128), timeout=10) for _ in range(20)]
answers = []
for s in held:
    s.settimeout(1.5)
    try:
        answers.append(s.recv(64).split(b"\r\n")[0].decode())
    except socket.timeout:
        answers.append("waiting")
[answers.count("waiting"), answers.count("HTTP/1.1 429 Too Many Requests")]
"#;
    let r = run(&server, OPEN, json!({ "code": code }));
    assert_eq!(r["result"], json!([4, 16]), "{r:#}");

    // Bytes in: a 2 MiB answer is cut at the 1 MiB budget; bytes out: a 512 KiB upload too.
    let code = format!(
        r#"
import socket
def pull(n):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"GET http://localhost:{h}/big?n=%d HTTP/1.1\r\nHost: localhost\r\n\r\n" % n)
    got = 0
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += len(chunk)
def push(n):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    try:
        s.sendall(b"POST http://localhost:{h}/sink HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % n + b"y" * n)
        return s.recv(4096).decode().split("\r\n")[0] or "closed"
    except OSError as e:
        return "closed"
[pull(2 << 20), push(512 << 10)]
"#
    );
    let r = run(&server, OPEN, json!({ "code": code }));
    let got = r["result"][0].as_u64().unwrap();
    assert!(got > 0 && got <= 1 << 20, "{r:#}");
    assert_eq!(r["result"][1], "closed", "{r:#}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let reasons: Vec<String> = loop {
        let reasons: Vec<String> = egress_lines(&server)
            .iter()
            .filter(|l| l["execution_id"] == r["id"])
            .map(|l| l["reason"].as_str().unwrap_or("").to_owned())
            .collect();
        if reasons.len() >= 2 || std::time::Instant::now() > deadline {
            break reasons;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let reasons: Vec<&str> = reasons.iter().map(String::as_str).collect();
    assert!(
        reasons.contains(&"bytes_in_budget") && reasons.contains(&"bytes_out_budget"),
        "{reasons:?}"
    );

    // A target that never completes the connection: 502 once the connect timeout passes.
    let code = format!(
        "{RAW}\nimport time\nt = time.monotonic()\n[raw('CONNECT localhost:{} HTTP/1.1\\r\\n\\r\\n'), round(time.monotonic() - t, 1)]",
        t.stalled
    );
    let r = run(&server, OPEN, json!({ "code": code }));
    assert_eq!(
        r["result"][0],
        json!(["HTTP/1.1 502 Bad Gateway", "failed; reason=connect_timeout"]),
        "{r:#}"
    );
    let waited = r["result"][1].as_f64().unwrap();
    assert!((0.9..5.0).contains(&waited), "{r:#}");

    // A tunnel nobody uses is closed after the idle timeout.
    let code = r#"
import socket, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT localhost:%d HTTP/1.1\r\n\r\n" % PORT)
s.recv(4096)
start = time.monotonic()
rest = s.recv(10)
[rest, round(time.monotonic() - start)]
"#
    .replace("PORT", &h.to_string());
    let r = run(&server, OPEN, json!({ "code": code }));
    assert_eq!(
        r["result"][0],
        json!({"$airlock": "bytes", "base64": ""}),
        "{r:#}"
    );
    let waited = r["result"][1].as_u64().unwrap();
    assert!((1..=4).contains(&waited), "{r:#}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !egress_lines(&server)
        .iter()
        .any(|l| l["execution_id"] == r["id"] && l["reason"] == "idle_timeout")
    {
        assert!(std::time::Instant::now() < deadline, "no idle_timeout line");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_request_narrows_its_keys_policy_and_never_widens_it() {
    let _serial = common::serial();
    let t = Targets::start();
    let server = Server::start(&config(&t, ""), &[]);
    let (h, s) = (t.http, t.https);
    let narrow = json!({
        "hosts": [{"host": "localhost", "ports": [h]}],
        "ranges": [{"cidr": "127.0.0.1/32", "ports": [h]}],
    });
    let mut body = fetch_body(
        &t,
        &format!("[fetch('http://localhost:{h}/hello')[0], fetch('https://localhost:{s}/hello')]"),
    );
    body["egress"] = narrow.clone();
    let r = run(&server, OPEN, body);
    assert_eq!(r["result"][0], 200, "{r:#}");
    assert!(r["result"][1].to_string().contains("403"), "{r:#}");
    assert_eq!(r["isolation"]["egress"], narrow);
    let lines = wait_egress_lines(&server, 2);
    // Each connection's line is written when it is decided or ends, in either order.
    let refused = lines.iter().find(|l| l["port"] == s);
    assert_eq!(
        refused.map(|l| &l["reason"]),
        Some(&json!("port_not_listed")),
        "{lines:#?}"
    );

    // Wider than the key (another host, another port, a wider range), or any egress for a
    // key without: 403 naming the field, before anything runs.
    for (key, wider) in [
        (
            OPEN,
            json!({"hosts": [{"host": "pypi.org", "ports": [443]}]}),
        ),
        (
            OPEN,
            json!({"hosts": [{"host": "localhost", "ports": [22]}]}),
        ),
        (
            OPEN,
            json!({"ranges": [{"cidr": "0.0.0.0/0", "ports": [h]}]}),
        ),
        (
            CLOSED,
            json!({"ranges": [{"cidr": "127.0.0.1/32", "ports": [h]}]}),
        ),
        (
            NONE,
            json!({"hosts": [{"host": "localhost", "ports": [h]}]}),
        ),
    ] {
        let r = call(
            &server,
            key,
            "POST",
            "/v1/execute",
            Some(&json!({"code": "1", "egress": wider})),
        );
        assert_eq!(r.status, 403, "{wider} {}", r.text());
        assert_eq!(r.json()["error"]["field"], "egress");
    }
    // A malformed policy is a 400.
    let r = call(
        &server,
        OPEN,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "1", "egress": {"hosts": [{"host": "*", "ports": [h]}]}})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn one_sandbox_never_reaches_another_ones_proxy() {
    let _serial = common::serial();
    let t = Targets::start();
    let server = Server::start(&config(&t, ""), &[]);
    // A session of the open key keeps its sandbox (and its proxy) alive meanwhile.
    let r = call(&server, OPEN, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(r.status, 201, "{}", r.text());
    let session = r.json()["id"].as_str().unwrap().to_owned();
    let cell = |code: String| {
        let r = call(
            &server,
            OPEN,
            "POST",
            &format!("/v1/sessions/{session}/execute"),
            Some(&json!({ "code": code })),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let setup = cell(format!(
        "{}\nopen('/work/cert.pem', 'w').write({:?})\nfetch('http://localhost:{}/hello')",
        FETCH, t.cert_pem, t.http
    ));
    assert_eq!(
        setup["result"],
        json!([200, "hello from http"]),
        "{setup:#}"
    );
    assert_eq!(setup["usage"]["egress"]["connections"], 1);

    // Another key's sandbox finds its own proxy at the same address, under its own policy.
    let r = run(
        &server,
        CLOSED,
        fetch_body(&t, &format!("fetch('http://localhost:{}/hello')", t.http)),
    );
    assert!(r["result"].to_string().contains("special_address"), "{r:#}");
    // And the session's next cell starts its budgets afresh, under its own id.
    let again = cell(format!("fetch('http://localhost:{}/hello')", t.http));
    assert_eq!(again["usage"]["egress"]["connections"], 1, "{again:#}");
    let lines = wait_egress_lines(&server, 3);
    assert_eq!(lines[2]["execution_id"], again["id"]);
    assert_ne!(lines[0]["execution_id"], lines[2]["execution_id"]);
    let r = call(
        &server,
        OPEN,
        "DELETE",
        &format!("/v1/sessions/{session}"),
        None,
    );
    assert!(r.status < 300, "{}", r.text());
}

#[test]
fn a_target_that_dies_is_an_error_for_the_code_and_nothing_more() {
    let _serial = common::serial();
    let before = common::HostState::now();
    let mut t = Targets::start();
    let server = Server::start(&config(&t, ""), &[]);
    // An upload, a chunk every 50 ms for 5 s: the target dies a second in.
    let code = format!(
        r#"
import time, urllib.request
def body():
    for _ in range(100):
        time.sleep(0.05)
        yield b"x" * 65536
req = urllib.request.Request("http://localhost:{port}/upload", data=body(), method="POST",
                             headers={{"Content-Length": str(100 * 65536)}})
t = time.time()
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        out = [r.status, r.read().decode()]
except Exception as e:
    out = ["error", type(e).__name__]
[out, time.time() - t]
"#,
        port = t.http
    );
    let addr = server.addr;
    let running = std::thread::spawn(move || {
        common::http::call_as(
            addr,
            OPEN,
            "POST",
            "/v1/execute",
            Some(&json!({ "code": code })),
        )
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    let _ = t.child.kill();
    let _ = t.child.wait();
    let r = running.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    // The code saw the connection end, soon; its execution ended as it chose.
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["result"][0][0], "error", "{r:#}");
    assert!(r["result"][1].as_f64().unwrap() < 4.0, "{r:#}");
    // A target now gone: refused, as an answer the code can read.
    let calls = format!("fetch('http://localhost:{}/hello')", t.http);
    let r = run(&server, OPEN, fetch_body(&t, &calls));
    assert_ne!(r["result"][0], 200, "{r:#}");
    // Nothing else noticed: other executions run and the server is ready.
    assert_eq!(run(&server, NONE, json!({"code": "6 * 7"}))["result"], 42);
    assert_eq!(call(&server, OPEN, "GET", "/readyz", None).status, 200);
    let lines = wait_egress_lines(&server, 2);
    assert!(lines.iter().all(|l| l["key"] == "open"), "{lines:#?}");
    assert!(server.stop().success());
    common::HostState::now().assert_same_as(&before, &"after the target died");
}
