//! OpenTelemetry traces (docs/telemetry.md) through the real server, into a real OTLP/HTTP
//! receiver (`otlp_receiver.py`, OpenTelemetry's own protobuf classes from the venv
//! `ensure_otlp_receiver` makes): a request continues the caller's `traceparent`, its phases
//! are its children, a code-mode tool call and an egress connection are children of its run,
//! the tool server (`tool_server.py`) is called with the tool call's trace context, a call over
//! `/mcp` is traced as a REST one, and no span carries the code or a secret. With the collector down or not answering, executions run as
//! before and the dropped spans are counted.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::http::{request, Response, Server};
use common::key_hash as hash;
use common::{mcp_python, scratch_dir, tool_server_script};
use serde_json::{json, Value};

const AGENT: &str = "agent-key-0123456789abcdef";
/// In the code and in a tool call's arguments: never in a span.
const SECRET: &str = "trace-canary-7d3e91a0-secret";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// The venv's Python with opentelemetry-proto (`ensure_otlp_receiver`).
fn receiver_python() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/otlp-receiver/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run `bash -c '. scripts/lib.sh && ensure_otlp_receiver'`",
        p.display()
    );
    p
}

/// `otlp_receiver.py`, writing the spans it receives to `out` as JSON lines.
struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Receiver {
    fn start(dir: &Path) -> Receiver {
        let out = dir.join("spans.jsonl");
        let mut child = Command::new(receiver_python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/otlp_receiver.py"
            ))
            .arg(&out)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().strip_prefix("listening on ").unwrap().parse();
        Receiver {
            child,
            port: port.unwrap(),
            out,
        }
    }

    fn raw(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn spans(&self) -> Vec<Value> {
        self.raw()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The spans of `trace` received so far.
    fn of(&self, trace: &str) -> Vec<Value> {
        self.spans()
            .into_iter()
            .filter(|s| s["trace_id"] == trace)
            .collect()
    }

    /// The `[telemetry]` lines that send it spans only in batches a minute apart, or when a
    /// server exits: what it has then was sent at exit.
    fn only_at_exit(&self) -> String {
        format!(
            "otlp_endpoint = \"http://127.0.0.1:{}\"\nbatch_interval_ms = 60000",
            self.port
        )
    }

    /// The spans of `trace`, once `until` holds of them (up to 20 s).
    fn wait(&self, trace: &str, until: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.of(trace);
            if until(&spans) {
                return spans;
            }
            assert!(Instant::now() < deadline, "spans so far: {spans:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP server on loopback that answers every request with `hello`.
fn hello_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head);
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            );
        }
    });
    port
}

/// The agent may call `crm`'s read-only tools and reach localhost:`port`.
fn config(telemetry: &str, port: u16) -> String {
    format!(
        r#"
[telemetry]
{telemetry}

[tools.servers.crm]
command = "{python}"
args = ["{script}", "stdio"]
env = {{ TOOL_LOG = {{ env = "TEST_TOOL_LOG" }} }}

[[keys]]
name = "agent"
hash = "{agent}"
tools = ["crm.*"]
egress = {{ hosts = [{{ host = "localhost", ports = [{port}] }}], ranges = [{{ cidr = "127.0.0.0/8", ports = [{port}] }}] }}
"#,
        python = mcp_python().display(),
        script = tool_server_script(),
        agent = hash(AGENT),
    )
}

/// For a server whose tool calls nobody looks at.
const NO_LOG: &[(&str, &str)] = &[("TEST_TOOL_LOG", "/dev/null")];

/// `body` executed as the agent, with extra headers.
fn execute(server: &Server, body: &Value, headers: &[(&str, &str)]) -> Response {
    execute_at(server, "/v1/execute", body, headers)
}

/// `body` POSTed to `path` as the agent, with extra headers.
fn execute_at(server: &Server, path: &str, body: &Value, headers: &[(&str, &str)]) -> Response {
    let mut all = vec![
        ("Authorization".to_owned(), format!("Bearer {AGENT}")),
        ("Content-Type".to_owned(), "application/json".to_owned()),
    ];
    all.extend(
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    request(
        server.addr,
        "POST",
        path,
        &all,
        Some(body.to_string().as_bytes()),
    )
}

/// POSTs `body` to `path` as the agent, under trace `trace` (the caller's span `PARENT`).
fn post_traced(server: &Server, path: &str, trace: &str, body: &Value) -> Response {
    let traceparent = format!("00-{trace}-{PARENT}-01");
    execute_at(server, path, body, &[("traceparent", &traceparent)])
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn one<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "{name}: {spans:#?}");
    found[0]
}

#[test]
fn a_request_s_spans_continue_its_traceparent_down_to_tools_and_connections() {
    let _serial = common::serial();
    let dir = scratch_dir("telemetry");
    let receiver = Receiver::start(&dir);
    let port = hello_server();
    let endpoint = format!(
        "otlp_endpoint = \"http://127.0.0.1:{}\"\nbatch_interval_ms = 50",
        receiver.port
    );
    let tool_log = dir.join("tool.log");
    let server = Server::start(
        &config(&endpoint, port),
        &[("TEST_TOOL_LOG", tool_log.to_str().unwrap())],
    );
    let code = format!(
        r#"
import tools, urllib.request
secret = "{SECRET}"
echoed = tools.crm.echo(value=secret)["value"] == secret
with urllib.request.urlopen("http://localhost:{port}/", timeout=10) as r:
    body = r.read().decode()
[echoed, body]
"#
    );
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let r = execute(
        &server,
        &json!({"code": code}),
        &[
            ("traceparent", &traceparent),
            ("tracestate", "vendor=opaque"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["status"], "ok", "{answer:#}");
    assert_eq!(answer["result"], json!([true, "hello"]));

    let names = [
        "POST /v1/execute",
        "admission_wait",
        "sandbox_start",
        "run",
        "result_parsing",
        "answer_write",
        "tool_call",
        "egress_connection",
    ];
    let spans = receiver.wait(TRACE, |spans| {
        names.iter().all(|n| spans.iter().any(|s| s["name"] == *n))
    });

    // The request's span is the caller's span's child, in the caller's trace.
    let req = one(&spans, "POST /v1/execute");
    assert_eq!(req["parent_span_id"], PARENT);
    assert_eq!(req["kind"], 2, "a server span");
    assert_eq!(req["attributes"]["http.route"], "/v1/execute");
    assert_eq!(req["attributes"]["http.request.method"], "POST");
    assert_eq!(req["attributes"]["http.response.status_code"], 200);
    assert_eq!(
        req["attributes"]["airlock.request_id"],
        r.header("x-request-id").unwrap()
    );
    assert_eq!(req["resource"]["service.name"], "airlock");
    // Each phase is the request's child, and within it.
    for phase in [
        "admission_wait",
        "sandbox_start",
        "run",
        "result_parsing",
        "answer_write",
    ] {
        let s = one(&spans, phase);
        assert_eq!(s["parent_span_id"], req["span_id"], "{phase}");
        assert!(
            s["start"].as_u64() >= req["start"].as_u64()
                && s["end"].as_u64() <= req["end"].as_u64(),
            "{phase} outside its request: {s:#} {req:#}"
        );
    }
    let run = one(&spans, "run");
    assert_eq!(run["attributes"]["airlock.execution.status"], "ok");
    assert_eq!(run["attributes"]["airlock.execution.id"], answer["id"]);
    assert_eq!(
        run["attributes"]["airlock.code.bytes"],
        code.len() as u64,
        "{run:#}"
    );
    assert!(["pool", "zygote", "cold"].contains(
        &one(&spans, "sandbox_start")["attributes"]["airlock.sandbox.source"]
            .as_str()
            .unwrap()
    ));

    // The tool call is the run's child; the tool server got its context in `_meta`.
    let call = one(&spans, "tool_call");
    assert_eq!(call["parent_span_id"], run["span_id"]);
    assert_eq!(call["kind"], 3, "a client span");
    let a = &call["attributes"];
    assert_eq!(
        (
            &a["airlock.tool.server"],
            &a["airlock.tool.name"],
            &a["airlock.tool.outcome"]
        ),
        (&json!("crm"), &json!("echo"), &json!("ok"))
    );
    assert!(a["airlock.tool.arguments.bytes"].as_u64().unwrap() > SECRET.len() as u64);
    assert_eq!(
        a["airlock.tool.arguments.sha256"].as_str().unwrap().len(),
        64
    );
    let seen: Vec<Value> = std::fs::read_to_string(&tool_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &Value| e["tool"] == "echo")
        .collect();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let sent = format!("00-{TRACE}-{}-01", call["span_id"].as_str().unwrap());
    assert_eq!(seen[0]["traceparent"], sent.as_str());
    assert_eq!(seen[0]["tracestate"], "vendor=opaque");

    // The connection is the run's child, with its target and bytes.
    let conn = one(&spans, "egress_connection");
    assert_eq!(conn["parent_span_id"], run["span_id"]);
    let a = &conn["attributes"];
    assert_eq!(a["server.address"], "localhost");
    assert_eq!(a["server.port"], port);
    assert_eq!(a["airlock.egress.outcome"], "allowed");
    assert!(
        a["airlock.egress.bytes_out"].as_u64().unwrap() > 0,
        "{conn:#}"
    );
    assert!(
        a["airlock.egress.bytes_in"].as_u64().unwrap() > 0,
        "{conn:#}"
    );

    // Nothing of the code, its secret or what the tool answered is in any span.
    let raw = receiver.raw();
    for never in [SECRET, "urlopen", "tools.crm.echo", "hello\""] {
        assert!(!raw.contains(never), "a span holds {never:?}");
    }

    // Without a traceparent, a request starts a trace of its own.
    let r = execute(&server, &json!({"code": "1 + 1"}), &[]);
    assert_eq!(r.status, 200);
    let rid = r.header("x-request-id").unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    let root = loop {
        let found = receiver
            .spans()
            .into_iter()
            .find(|s| s["attributes"]["airlock.request_id"] == rid.as_str());
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < deadline, "no span for {rid}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(root["parent_span_id"], "");
    assert_ne!(root["trace_id"], TRACE);
    let own = receiver.wait(root["trace_id"].as_str().unwrap(), |s| {
        s.iter().any(|s| s["name"] == "answer_write")
    });
    assert!(own
        .iter()
        .filter(|s| s["name"] != "POST /v1/execute")
        .all(|s| s["parent_span_id"] == root["span_id"]));
    // A call over `/mcp` (which rmcp runs in a task of its own) is traced the same way.
    let mcp_trace = "5c0b8e3a2d1f4e6a9b7c8d0e1f2a3b4c";
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_python", "arguments": {"code": "3 * 7"}}});
    let headers = [
        ("Authorization".to_owned(), format!("Bearer {AGENT}")),
        ("Content-Type".to_owned(), "application/json".to_owned()),
        (
            "Accept".to_owned(),
            "application/json, text/event-stream".to_owned(),
        ),
        (
            "traceparent".to_owned(),
            format!("00-{mcp_trace}-{PARENT}-01"),
        ),
    ];
    let body = call.to_string();
    let r = request(server.addr, "POST", "/mcp", &headers, Some(body.as_bytes()));
    assert_eq!(r.status, 200, "{}", r.text());
    let spans = receiver.wait(mcp_trace, |s| {
        ["POST /mcp", "run", "answer_write"]
            .iter()
            .all(|n| s.iter().any(|s| s["name"] == *n))
    });
    let req = one(&spans, "POST /mcp");
    assert_eq!(req["parent_span_id"], PARENT);
    for phase in ["admission_wait", "sandbox_start", "run", "answer_write"] {
        assert_eq!(
            one(&spans, phase)["parent_span_id"],
            req["span_id"],
            "{phase}"
        );
    }
    // A background execution's phases join its submission's trace, after the 202.
    let bg_trace = "6d1c9f4b3e2a5f7b8c9d0e1f2a3b4c5d";
    let r = post_traced(
        &server,
        "/v1/executions",
        bg_trace,
        &json!({"code": "6 * 7"}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let spans = receiver.wait(bg_trace, |s| {
        ["POST /v1/executions", "admission_wait", "run"]
            .iter()
            .all(|n| s.iter().any(|s| s["name"] == *n))
    });
    let req = one(&spans, "POST /v1/executions");
    assert_eq!(req["parent_span_id"], PARENT);
    for phase in ["admission_wait", "run"] {
        assert_eq!(
            one(&spans, phase)["parent_span_id"],
            req["span_id"],
            "{phase}"
        );
    }
    // A session's sandbox starts under its creation's request; its cells have no start.
    let open_trace = "7e2d0a5c4f3b6a8c9d0e1f2a3b4c5d6e";
    let r = post_traced(&server, "/v1/sessions", open_trace, &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    let session = r.json()["id"].as_str().unwrap().to_owned();
    let spans = receiver.wait(open_trace, |s| {
        ["POST /v1/sessions", "sandbox_start", "answer_write"]
            .iter()
            .all(|n| s.iter().any(|s| s["name"] == *n))
    });
    let req = one(&spans, "POST /v1/sessions");
    let start = one(&spans, "sandbox_start");
    assert_eq!(start["parent_span_id"], req["span_id"]);
    assert!(
        start["start"].as_u64() >= req["start"].as_u64()
            && start["end"].as_u64() <= req["end"].as_u64()
    );
    assert_eq!(start["status"], 0, "unset: it started");
    let cell_trace = "8f3e1b6d5a4c7b9d0e1f2a3b4c5d6e7f";
    let path = format!("/v1/sessions/{session}/execute");
    let r = post_traced(&server, &path, cell_trace, &json!({"code": "6 * 7"}));
    assert_eq!(r.json()["result"], 42, "{}", r.text());
    let spans = receiver.wait(cell_trace, |s| {
        ["run", "answer_write"]
            .iter()
            .all(|n| s.iter().any(|s| s["name"] == *n))
    });
    assert!(named(&spans, "sandbox_start").is_empty(), "{spans:#?}");
    // An answer without a body (204) is written out all the same.
    let close_trace = "9a4f2c7e6b5d8c0e1f2a3b4c5d6e7f80";
    let headers = [
        ("Authorization".to_owned(), format!("Bearer {AGENT}")),
        (
            "traceparent".to_owned(),
            format!("00-{close_trace}-{PARENT}-01"),
        ),
    ];
    let r = request(
        server.addr,
        "DELETE",
        &format!("/v1/sessions/{session}"),
        &headers,
        None,
    );
    assert_eq!(r.status, 204, "{}", r.text());
    let spans = receiver.wait(close_trace, |s| !named(s, "answer_write").is_empty());
    assert_eq!(one(&spans, "answer_write")["status"], 0, "{spans:#?}");
    assert_eq!(one(&spans, "DELETE /v1/sessions/{id}")["status"], 0);
    // An unsampled caller: the context goes on, nothing is recorded.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let r = execute(
        &server,
        &json!({"code": "2"}),
        &[("traceparent", unsampled)],
    );
    assert_eq!(r.status, 200);
    server.stop();
    assert!(!receiver.raw().contains("0af7651916cd43dd8448eb211c80319c"));
}

/// Runs `n` executions one after another, each `ok`.
fn executions(server: &Server, n: usize) {
    for i in 0..n {
        let r = execute(server, &json!({"code": format!("{i} * 2")}), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["status"], "ok");
    }
}

#[test]
fn with_the_collector_down_executions_run_and_the_dropped_spans_are_counted() {
    let _serial = common::serial();
    let port = hello_server();
    // A port nothing listens on any more.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let telemetry = format!(
        "otlp_endpoint = \"http://127.0.0.1:{closed}\"\nmax_queued_spans = 4\nbatch_interval_ms = 20"
    );
    let server = Server::start(&config(&telemetry, port), NO_LOG);
    executions(&server, 10);
    let dropped = |reason: &str| {
        server.metric(&format!(
            "airlock_telemetry_spans_dropped_total{{reason=\"{reason}\"}}"
        ))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while dropped("export_failed") + dropped("queue_full") < 10.0 {
        assert!(
            Instant::now() < deadline,
            "{}",
            server.call("GET", "/metrics", None).text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(dropped("export_failed") > 0.0);
    assert_eq!(server.metric("airlock_telemetry_spans_exported_total"), 0.0);
}

#[test]
fn a_collector_that_never_answers_holds_up_no_execution() {
    let _serial = common::serial();
    let port = hello_server();
    // Takes connections and reads nothing: every export waits out its timeout.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_port = hole.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for conn in hole.incoming().take(8) {
            open.push(conn);
        }
        std::thread::sleep(Duration::from_secs(60));
    });
    let telemetry = format!(
        "otlp_endpoint = \"http://127.0.0.1:{hole_port}\"\nmax_queued_spans = 8\n\
         max_batch_spans = 4\nbatch_interval_ms = 10\nexport_timeout_ms = 60000"
    );
    let server = Server::start(&config(&telemetry, port), NO_LOG);
    executions(&server, 23);
    // The exporter is stuck on its first batch for a minute: the queue filled and the rest
    // was dropped, and every execution ran to its answer while that batch neither went
    // through nor failed. Had an execution waited on the exporter, it would have waited out
    // the minute, and the batch would have failed by then.
    let metric = |name: &str| server.metric(name);
    assert!(
        metric("airlock_telemetry_spans_dropped_total{reason=\"queue_full\"}") > 0.0,
        "nothing dropped"
    );
    assert_eq!(
        metric("airlock_telemetry_spans_dropped_total{reason=\"export_failed\"}"),
        0.0,
        "the first export ended before the executions did"
    );
    assert_eq!(metric("airlock_telemetry_spans_exported_total"), 0.0);
    drop(server);
    drop(held);
}

#[test]
fn spans_still_queued_at_shutdown_reach_the_collector() {
    let _serial = common::serial();
    let dir = scratch_dir("telemetry-flush");
    let receiver = Receiver::start(&dir);
    let server = Server::start(&config(&receiver.only_at_exit(), hello_server()), NO_LOG);
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let r = execute(
        &server,
        &json!({"code": "6 * 7"}),
        &[("traceparent", &traceparent)],
    );
    assert_eq!(r.json()["result"], 42, "{}", r.text());
    std::thread::sleep(Duration::from_millis(300));
    assert!(receiver.spans().is_empty(), "sent before the shutdown");
    assert!(server.stop().success());
    // Sent as the server stopped: there when it has exited.
    let spans = receiver.of(TRACE);
    let req = one(&spans, "POST /v1/execute");
    assert_eq!(req["parent_span_id"], PARENT);
    for phase in ["admission_wait", "run", "answer_write"] {
        assert_eq!(
            one(&spans, phase)["parent_span_id"],
            req["span_id"],
            "{phase}"
        );
    }
    assert_eq!(
        one(&spans, "run")["attributes"]["airlock.execution.status"],
        "ok"
    );
}

#[test]
fn stdio_mcp_continues_the_trace_a_host_puts_in_meta() {
    let _serial = common::serial();
    let dir = scratch_dir("telemetry-stdio");
    let receiver = Receiver::start(&dir);
    let file = dir.join("airlock.toml");
    std::fs::write(&file, config(&receiver.only_at_exit(), hello_server())).unwrap();
    let tool_log = dir.join("tool.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .arg("mcp")
        .arg("--config")
        .arg(&file)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("AIRLOCK_POOL__SIZE", "0")
        .env("TEST_TOOL_LOG", &tool_log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut answer = |stdin: &mut std::process::ChildStdin, message: Value| {
        writeln!(stdin, "{message}").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()
    };
    let init = answer(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    assert_eq!(init["result"]["serverInfo"]["name"], "airlock", "{init}");
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    let code = format!("import tools\ntools.crm.echo(value='{SECRET}')['value'] == '{SECRET}'");
    let called = answer(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_python", "arguments": {"code": code},
            "_meta": {"traceparent": format!("00-{TRACE}-{PARENT}-01"),
                      "tracestate": "vendor=opaque"}}}),
    );
    assert_eq!(
        called["result"]["content"][1]["text"], "result: true",
        "{called}"
    );
    drop(stdin);
    assert!(child.wait().unwrap().success());

    // Sent as `airlock mcp` exited.
    let spans = receiver.of(TRACE);
    let call = one(&spans, "tools/call run_python");
    assert_eq!(call["parent_span_id"], PARENT);
    assert_eq!(call["kind"], 2, "a server span");
    assert_eq!(call["attributes"]["gen_ai.tool.name"], "run_python");
    assert_eq!(call["status"], 0, "unset: answered");
    for phase in ["admission_wait", "sandbox_start", "run", "result_parsing"] {
        assert_eq!(
            one(&spans, phase)["parent_span_id"],
            call["span_id"],
            "{phase}"
        );
    }
    // The tool server was called within the same trace, under the run.
    let tool = one(&spans, "tool_call");
    assert_eq!(tool["parent_span_id"], one(&spans, "run")["span_id"]);
    let log = std::fs::read_to_string(&tool_log).unwrap();
    let seen: Value = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["tool"] == "echo")
        .unwrap();
    let sent = format!("00-{TRACE}-{}-01", tool["span_id"].as_str().unwrap());
    assert_eq!(seen["traceparent"], sent.as_str());
    assert_eq!(seen["tracestate"], "vendor=opaque");
    assert!(!receiver.raw().contains(SECRET), "a span holds the code");
}
