//! MCP, driven by the official Python SDK (`mcp`, in the venv that scripts/lib.sh's
//! `ensure_mcp_client` makes under target/): `airlock mcp` over stdio, and `/mcp` on the real
//! server over streamable HTTP. The client script (`mcp_client.py`) only reports what it saw;
//! every judgement is here. Also, with raw HTTP: who may reach `/mcp` at all (keys, scopes,
//! Origin, Host), and that one key's session is not another's.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::http::{read_response, request, Response, Server, KEY};
use common::*;
use serde_json::{json, Value};

const OTHER_KEY: &str = "other-key-0123456789abcdef";
const READER_KEY: &str = "reader-key-0123456789abcdef";

/// Runs the client script with `args`; what it printed, as JSON.
fn client(args: &[&str]) -> Value {
    client_with(args, &[])
}

/// As [`client`], with `env` added to the client's environment (over stdio it passes
/// `AIRLOCK_MCP__*` on to airlock).
fn client_with(args: &[&str], env: &[(&str, &str)]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
    let out = Command::new(mcp_python())
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run the MCP client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "the client printed no JSON ({e}):\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `airlock mcp` started by the client, with a state directory of its own.
fn over_stdio(scenario: &str) -> Value {
    over_stdio_with(scenario, &[])
}

/// As [`over_stdio`], with `env` (`AIRLOCK_MCP__*` settings) for airlock.
fn over_stdio_with(scenario: &str, env: &[(&str, &str)]) -> Value {
    let dir = std::env::temp_dir().join(format!("airlock-mcp-{}-{scenario}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let seen = client_with(
        &[
            "stdio",
            env!("CARGO_BIN_EXE_airlock"),
            dir.to_str().unwrap(),
            scenario,
        ],
        env,
    );
    let audit = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        scenario == "connect" || audit.contains("\"key\":\"stdio\""),
        "executions over stdio are audited: {audit}"
    );
    seen
}

fn over_http(server: &Server, key: &str, scenario: &str) -> Value {
    let url = format!("http://{}/mcp", server.addr);
    client(&["http", &url, key, scenario])
}

/// A tool result's text blocks, joined.
fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .unwrap_or_else(|| panic!("not a tool result: {result}"))
        .iter()
        .filter(|c| c["type"] == "text")
        .map(|c| c["text"].as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

fn ok(result: &Value) -> String {
    assert_eq!(result["is_error"], json!(false), "{result}");
    text(result)
}

fn failed(result: &Value) -> String {
    assert_eq!(result["is_error"], json!(true), "{result}");
    text(result)
}

fn check_tools(seen: &Value) {
    assert!(seen.get("failed").is_none(), "{seen:#}");
    assert_eq!(seen["server"]["name"], "airlock", "{seen:#}");
    let tools = seen["tools"].as_object().unwrap();
    let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "cancel_execution",
            "close_session",
            "create_session",
            "eval_expression",
            "get_execution",
            "list_session_files",
            "read_session_file",
            "run_in_session",
            "run_python",
            "start_python"
        ]
    );
    let run = &tools["run_python"];
    assert_eq!(run["input_schema"]["required"], json!(["code"]), "{run}");
    let props = run["input_schema"]["properties"].as_object().unwrap();
    assert!(props.contains_key("timeout_seconds"), "{run}");
    let description = run["description"].as_str().unwrap();
    for told in ["no network", "Limits: 30 s", "PNG"] {
        assert!(description.contains(told), "{told:?} in {description}");
    }

    // Every tool declares what its structured content is, and every result (ok, a verdict,
    // a refusal) matches it: the SDK checked each against the schema.
    for (name, tool) in tools {
        assert_eq!(tool["output_schema"]["type"], "object", "{name}: {tool}");
    }
    for (step, result) in seen.as_object().unwrap() {
        assert!(result.get("schema_error").is_none(), "{step}: {result}");
    }
    // The verdict, structured: no parsing of `status: ...` text.
    let s = &seen["print"]["structured"];
    assert_eq!(
        (&s["status"], &s["has_result"]),
        (&json!("ok"), &json!(true)),
        "{s}"
    );
    assert!(s["id"].as_str().unwrap().starts_with("ex_"), "{s}");
    assert_eq!(seen["timeout"]["structured"]["status"], "timeout");
    assert_eq!(
        seen["timeout"]["structured"]["limits_hit"],
        json!(["wall_time"])
    );
    assert_eq!(seen["memory"]["structured"]["status"], "memory_limit");
    assert_eq!(
        seen["exception"]["structured"]["error"],
        json!({"kind": "ValueError", "message": "bad value"})
    );
    assert_eq!(seen["eval"]["structured"]["repr"], "6144");
    // The SDK checked it against the tool's output schema (ResultValue's forms) too.
    assert_eq!(
        seen["eval_exact"]["structured"]["value"],
        json!([{"$airlock": "int", "value": "1180591620717411303424"}, {"$airlock": "float", "value": "nan"}])
    );
    assert_eq!(
        ok(&seen["eval_exact"]),
        "[1180591620717411303424, nan] (type: list)"
    );
    let refused = &seen["above_ceiling"]["structured"]["refused"];
    assert_eq!(refused["code"], "limit_above_ceiling", "{refused}");

    let t = ok(&seen["print"]);
    assert!(t.starts_with("status: ok\n"), "{t}");
    assert!(t.contains("stdout:\nhello from the sandbox\n"), "{t}");
    assert!(t.contains("stderr:\noops\n"), "{t}");
    assert!(t.contains("result: 42"), "{t}");
    // Big ints and non-finite floats as Python prints them, not their JSON forms.
    let t = ok(&seen["exact"]);
    assert!(
        t.contains(r#"result: [15511210043330985984000000,nan,-inf,{"x":1180591620717411303424}]"#),
        "{t}"
    );

    let chart = &seen["chart"];
    assert!(ok(chart).contains("drawn"), "{chart}");
    let images: Vec<&Value> = chart["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "image")
        .collect();
    assert_eq!(images.len(), 1, "{chart}");
    assert_eq!(images[0]["mime_type"], "image/png");
    assert_eq!(images[0]["png_signature"], json!(true), "{chart}");
    assert!(images[0]["bytes"].as_u64().unwrap() > 1000, "{chart}");

    // A verdict is a result the model reads, marked as an error; output before it is kept.
    let t = failed(&seen["timeout"]);
    assert!(t.starts_with("status: timeout"), "{t}");
    assert!(t.contains("1000 ms"), "{t}");
    assert!(t.contains("stdout:\nstarted\n"), "{t}");
    let t = failed(&seen["memory"]);
    assert!(
        t.starts_with("status: memory_limit (killed at the memory limit of 512 MB)"),
        "{t}"
    );
    // bpf(2): killed by the seccomp filter, and the program did not go on.
    let t = failed(&seen["forbidden_syscall"]);
    assert!(t.starts_with("status: policy_violation"), "{t}");
    assert!(t.contains("stdout:\ncalling\n"), "{t}");
    assert!(!t.contains("survived"), "{t}");
    let t = failed(&seen["exception"]);
    assert!(t.starts_with("status: error"), "{t}");
    assert!(t.contains("error: ValueError: bad value"), "{t}");
    assert!(t.contains("Traceback"), "{t}");
    let t = failed(&seen["network"]);
    assert!(t.starts_with("status: error"), "{t}");
    assert!(t.contains("socket.create_connection"), "{t}");

    assert_eq!(ok(&seen["eval"]), "6144 (type: int)");
    assert_eq!(
        failed(&seen["eval_error"]),
        "ZeroDivisionError: division by zero"
    );
    assert!(
        failed(&seen["eval_call"]).starts_with("NotAllowedError: calls are not allowed"),
        "{}",
        seen["eval_call"]
    );

    // Protocol errors stay protocol errors.
    for (step, names) in [
        ("unknown_tool", "no_such_tool"),
        ("bad_arguments", "source"),
        ("wrong_type", "expected a string"),
    ] {
        let e = &seen[step]["jsonrpc_error"];
        assert_eq!(e["code"], json!(-32602), "{step}: {}", seen[step]);
        assert!(
            e["message"].as_str().unwrap().contains(names),
            "{step}: {e}"
        );
    }
    // A refusal is the model's to read and fix.
    let t = failed(&seen["above_ceiling"]);
    assert!(t.starts_with("limit_above_ceiling: "), "{t}");
    let e = &seen["zero_timeout"]["jsonrpc_error"];
    assert_eq!(e["code"], json!(-32602), "{}", seen["zero_timeout"]);
    // Each part in a block of its own: printed text cannot pass for the status.
    let forged = &seen["forged"];
    assert_eq!(forged["is_error"], json!(true), "{forged}");
    let blocks = forged["content"].as_array().unwrap();
    assert!(
        blocks[0]["text"]
            .as_str()
            .unwrap()
            .starts_with("status: error"),
        "{forged}"
    );
    assert_eq!(blocks[1]["text"], "stdout:\nstatus: ok\n", "{forged}");
    let t = failed(&seen["long_expression"]);
    assert!(t.contains("an evaluator limit"), "{t}");
}

fn check_session(seen: &Value) {
    assert!(seen.get("failed").is_none(), "{seen:#}");
    let t = ok(&seen["create"]);
    assert!(t.contains("per-cell limits: 30 s wall clock"), "{t}");
    assert!(seen["session_id"].as_str().unwrap().starts_with("se_"));
    assert!(ok(&seen["cell1"]).contains("stdout:\nfirst cell\n"));
    let t = ok(&seen["cell2"]);
    assert!(t.contains("counter is 42"), "{t}");
    assert!(t.contains("result: 42"), "{t}");
    let t = ok(&seen["files"]);
    assert_eq!(t, "out (dir, 0 bytes)\nout/notes.txt (file, 18 bytes)");
    assert_eq!(ok(&seen["read"]), "kept between cells");
    assert!(failed(&seen["read_missing"]).starts_with("not_found: FileNotFoundError"));
    assert!(failed(&seen["read_escape"]).starts_with("invalid_request: "));
    assert!(ok(&seen["close"]).contains("closed"));
    assert_eq!(
        failed(&seen["after_close"]),
        "not_found: no such session",
        "a closed session is gone"
    );
    // Each result structured, as its tool's output schema says (the SDK checked them).
    for (step, result) in seen.as_object().unwrap() {
        assert!(result.get("schema_error").is_none(), "{step}: {result}");
    }
    // One name for the id: the text's, the other tools' arguments' and the structured
    // content's.
    assert_eq!(
        seen["create"]["structured"]["session_id"],
        seen["session_id"]
    );
    assert_eq!(seen["create"]["structured"].get("id"), None, "{seen:#}");
    assert_eq!(seen["create"]["structured"]["cells"], json!(0));
    assert_eq!(seen["cell2"]["structured"]["session_ended"], json!(false));
    assert_eq!(
        seen["files"]["structured"]["files"][1]["path"],
        "out/notes.txt"
    );
    assert_eq!(
        seen["read"]["structured"],
        json!({"path": "out/notes.txt", "bytes": 18, "shown_as": "text"})
    );
    assert_eq!(
        seen["close"]["structured"]["session_id"],
        seen["session_id"]
    );
    assert_eq!(
        seen["after_close"]["structured"]["refused"]["code"],
        "not_found"
    );
}

#[test]
fn stdio_serves_the_tools_with_verdicts_as_results_and_protocol_errors_as_errors() {
    let _g = serial();
    let before = HostState::now();
    let seen = over_stdio("tools");
    check_tools(&seen);
    HostState::now().assert_same_as(&before, &seen);
}

#[test]
fn stdio_session_keeps_variables_and_files_until_closed() {
    let _g = serial();
    let before = HostState::now();
    let seen = over_stdio("session");
    check_session(&seen);
    HostState::now().assert_same_as(&before, &seen);
}

#[test]
fn a_stdio_server_closes_the_sessions_left_open_when_the_client_goes() {
    let _g = serial();
    let before = HostState::now();
    let seen = over_stdio("abandon");
    assert!(seen.get("failed").is_none(), "{seen:#}");
    assert!(ok(&seen["create"]).contains("session_id: se_"));
    assert_eq!(seen["cell"]["is_error"], json!(false), "{seen:#}");
    // The client left without close_session: airlock must destroy that sandbox on its way out.
    HostState::now().assert_same_as(&before, &seen);
}

#[test]
fn http_serves_the_same_tools() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let seen = over_http(&server, KEY, "tools");
    check_tools(&seen);
    drop(server);
    HostState::now().assert_same_as(&before, &seen);
}

#[test]
fn http_session_keeps_variables_and_files_until_closed() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let seen = over_http(&server, KEY, "session");
    check_session(&seen);
    drop(server);
    HostState::now().assert_same_as(&before, &seen);
}

/// `start_python`, `get_execution` and `cancel_execution`, as the `background` scenario saw
/// them.
fn check_background(seen: &Value, how: &str) {
    assert!(seen.get("failed").is_none(), "{how}: {seen:#}");
    let started = ok(&seen["start"]);
    assert!(started.contains("get_execution"), "{how}: {started}");
    let state = &seen["start"]["structured"]["state"];
    assert!(state == "queued" || state == "running", "{how}: {seen:#}");
    let now = &seen["now"]["structured"]["state"];
    assert!(now == "queued" || now == "running", "{how}: {seen:#}");
    // Waited for: its output and value, as run_python gives them, with its state.
    let waited = ok(&seen["waited"]);
    assert_eq!(
        seen["waited"]["structured"]["state"], "finished",
        "{how}: {seen:#}"
    );
    assert_eq!(
        seen["waited"]["structured"]["outcome"]["status"], "ok",
        "{how}"
    );
    assert!(waited.contains("begun\ndone"), "{how}: {waited}");
    assert!(waited.contains("42"), "{how}: {waited}");
    assert_eq!(
        seen["cancel"]["structured"]["state"], "cancelled",
        "{how}: {seen:#}"
    );
    assert!(
        failed(&seen["after_cancel"]).contains("no such"),
        "{how}: {seen:#}"
    );
    assert!(
        seen["wait_too_long"]["jsonrpc_error"].is_object(),
        "{how}: {seen:#}"
    );
    assert!(
        failed(&seen["unknown"]).contains("no such"),
        "{how}: {seen:#}"
    );
}

#[test]
fn background_executions_are_started_polled_and_cancelled_over_stdio_and_http() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let url = format!("http://{}/mcp", server.addr);
    let http = std::thread::spawn(move || client(&["http", &url, KEY, "background"]));
    check_background(&over_stdio("background"), "stdio");
    check_background(&http.join().unwrap(), "http");
    drop(server);
    HostState::now().assert_same_as(&before, &"after background executions over MCP");
}

fn key_toml(name: &str, key: &str, scopes: &str) -> String {
    let hash = format!("sha256:{}", airlock_api::sha256_hex(key.as_bytes()));
    format!("[[keys]]\nname = \"{name}\"\nhash = \"{hash}\"\nscopes = {scopes}\n")
}

/// A raw JSON-RPC POST to `/mcp` (each one stands alone: the transport is stateless).
fn rpc(server: &Server, key: Option<&str>, extra: &[(&str, &str)], body: &Value) -> Response {
    let mut headers: Vec<(String, String)> = vec![
        ("Content-Type".into(), "application/json".into()),
        (
            "Accept".into(),
            "application/json, text/event-stream".into(),
        ),
    ];
    if let Some(key) = key {
        headers.push(("Authorization".into(), format!("Bearer {key}")));
    }
    headers.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let body = serde_json::to_vec(body).unwrap();
    request(server.addr, "POST", "/mcp", &headers, Some(&body))
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
}

fn tool_call(name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": name, "arguments": arguments}})
}

#[test]
fn http_refuses_wrong_keys_scopes_foreign_origins_and_hosts() {
    let _g = serial();
    let config = format!(
        "[cors]\nallowed_origins = [\"https://agents.example\"]\n{}",
        key_toml("reader", READER_KEY, "[\"read\"]")
    );
    let server = Server::start(&config, &[]);
    // The SDK with a wrong key gets nothing but an error.
    let seen = over_http(&server, "not-the-key", "connect");
    assert!(seen.get("server").is_none(), "{seen:#}");
    assert!(seen["failed"].to_string().contains("MCPError"), "{seen:#}");

    let init = initialize();
    let r = rpc(&server, Some("not-the-key"), &[], &init);
    assert_eq!((r.status, r.error_code()), (401, "unauthorized".into()));
    let r = rpc(&server, None, &[], &init);
    assert_eq!((r.status, r.error_code()), (401, "unauthorized".into()));
    let r = rpc(&server, Some(READER_KEY), &[], &init);
    assert_eq!((r.status, r.error_code()), (403, "forbidden".into()));
    assert!(r.text().contains("execute"), "{}", r.text());
    // A web page elsewhere cannot drive the tools through a visitor's browser...
    for origin in ["http://evil.example", "null", "http://localhost:1234"] {
        let r = rpc(&server, Some(KEY), &[("Origin", origin)], &init);
        assert_eq!(
            (r.status, r.error_code()),
            (403, "forbidden".into()),
            "{origin}"
        );
    }
    // ...nor through a name that resolves to this host (DNS rebinding).
    for host in [
        "evil.example:80",
        "[localhost]evil.example",
        "[::1]junk",
        "[::1",
    ] {
        let r = rpc(&server, Some(KEY), &[("Host", host)], &init);
        assert_eq!(r.status, 421, "{host}: {}", r.text());
    }
    // The transport's own rule: a client must take both JSON and event streams.
    let r = request(
        server.addr,
        "POST",
        "/mcp",
        &[
            ("Authorization".into(), format!("Bearer {KEY}")),
            ("Content-Type".into(), "application/json".into()),
            ("Accept".into(), "application/json".into()),
        ],
        Some(&serde_json::to_vec(&init).unwrap()),
    );
    assert_eq!(r.status, 406, "{}", r.text());
    // In the API's one error shape, as every other route's refusals.
    assert_eq!(r.json()["error"]["code"], "not_acceptable", "{}", r.text());
    assert!(r.json()["error"]["request_id"].is_string(), "{}", r.text());
    // What is configured, and the listen address without an Origin, are answered.
    let r = rpc(
        &server,
        Some(KEY),
        &[("Origin", "https://agents.example")],
        &init,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://agents.example")
    );
    let r = rpc(&server, Some(KEY), &[], &init);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["serverInfo"]["name"], "airlock");
    let r = rpc(
        &server,
        Some(KEY),
        &[("Host", &format!("localhost:{}", server.addr.port()))],
        &tool_call("eval_expression", json!({"expression": "2 ** 10"})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["content"][0]["text"], "1024 (type: int)");
}

#[test]
fn a_session_made_with_one_key_is_not_found_with_another() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start(&key_toml("other", OTHER_KEY, "[\"execute\"]"), &[]);
    let r = rpc(
        &server,
        Some(KEY),
        &[],
        &tool_call("create_session", json!({})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.json()["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let id = t
        .lines()
        .find_map(|l| l.strip_prefix("session_id: "))
        .unwrap()
        .to_owned();
    let cell = tool_call(
        "run_in_session",
        json!({"session_id": id, "code": "secret = 'mine'"}),
    );
    let theirs = rpc(&server, Some(OTHER_KEY), &[], &cell).json();
    assert_eq!(theirs["result"]["isError"], json!(true), "{theirs}");
    assert_eq!(
        theirs["result"]["content"][0]["text"],
        "not_found: no such session"
    );
    for tool in ["list_session_files", "close_session"] {
        let r = rpc(
            &server,
            Some(OTHER_KEY),
            &[],
            &tool_call(tool, json!({"session_id": id})),
        )
        .json();
        assert_eq!(r["result"]["isError"], json!(true), "{tool}: {r}");
    }
    // The owner's session is still there, and still the owner's.
    let mine = rpc(&server, Some(KEY), &[], &cell).json();
    assert_eq!(mine["result"]["isError"], json!(false), "{mine}");
    // The same session is visible over REST too: MCP and HTTP share one engine.
    let r = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!((r.status, &r.json()["cells"]), (200, &json!(1)));
    drop(server);
    HostState::now().assert_same_as(&before, &"cross-key session");
}

/// Issue 48: run_python and create_session mount the caller's volumes; the tools' description
/// names them; another key's volume is refused as not found.
#[test]
fn run_python_and_sessions_mount_the_caller_s_volumes() {
    let _g = serial();
    let server = Server::start(&key_toml("other", OTHER_KEY, "[\"execute\"]"), &[]);
    let made = server.call(
        "POST",
        "/v1/volumes",
        Some(&json!({"name": "notes", "size_bytes": 16 << 20})),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let listed = rpc(
        &server,
        Some(KEY),
        &[],
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    )
    .json();
    let run_python = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "run_python")
        .unwrap()
        .clone();
    assert!(
        run_python["description"]
            .as_str()
            .unwrap()
            .contains("Your volumes, directories that outlive every call (the volumes argument mounts them; one writer at a time): notes (16 MiB)."),
        "{run_python}"
    );
    assert!(run_python["inputSchema"]["properties"]["volumes"].is_object());
    let mount = json!([{"name": "notes", "path": "/work/notes"}]);
    let wrote = rpc(
        &server,
        Some(KEY),
        &[],
        &tool_call(
            "run_python",
            json!({"code": "open('/work/notes/n.txt', 'w').write('kept')", "volumes": mount}),
        ),
    )
    .json();
    assert_eq!(wrote["result"]["isError"], json!(false), "{wrote}");
    let r = rpc(
        &server,
        Some(KEY),
        &[],
        &tool_call("create_session", json!({"volumes": mount})),
    );
    let t = r.json()["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let id = t
        .lines()
        .find_map(|l| l.strip_prefix("session_id: "))
        .unwrap()
        .to_owned();
    let read = rpc(
        &server,
        Some(KEY),
        &[],
        &tool_call(
            "run_in_session",
            json!({"session_id": id, "code": "open('/work/notes/n.txt').read()"}),
        ),
    )
    .json();
    assert_eq!(read["result"]["isError"], json!(false), "{read}");
    assert!(text(&read["result"]).contains("result: \"kept\""), "{read}");
    // The session is the one writer now.
    let busy = rpc(
        &server,
        Some(KEY),
        &[],
        &tool_call("run_python", json!({"code": "1", "volumes": mount})),
    )
    .json();
    assert_eq!(busy["result"]["isError"], json!(true), "{busy}");
    assert!(text(&busy["result"]).starts_with("volume_busy: "), "{busy}");
    let theirs = rpc(
        &server,
        Some(OTHER_KEY),
        &[],
        &tool_call("run_python", json!({"code": "1", "volumes": mount})),
    )
    .json();
    assert_eq!(theirs["result"]["isError"], json!(true), "{theirs}");
    assert!(
        text(&theirs["result"]).starts_with("not_found: no volume named"),
        "{theirs}"
    );
}

#[test]
fn mcp_can_be_turned_off() {
    let _g = serial();
    let server = Server::start("[mcp]\nenabled = false\n", &[]);
    let r = rpc(&server, Some(KEY), &[], &initialize());
    assert_eq!((r.status, r.error_code()), (404, "not_found".into()));
}

#[test]
fn an_http_client_that_leaves_mid_call_takes_its_sandbox_with_it() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let mut s = server.connect();
    let body = tool_call(
        "run_python",
        json!({"code": "import time\ntime.sleep(60)", "timeout_seconds": 120}),
    )
    .to_string();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    server.wait_running(1);
    drop(s);
    // Well before the 60 s the code would sleep.
    server.wait_running(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sandbox_processes().len() > before.sandbox_processes().len() && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    HostState::now().assert_same_as(&before, &"after the MCP client left");
}

/// `airlock mcp ARGS` on pipes, for raw JSON-RPC (the warm pool off, its log in `dir/stderr`).
fn raw_stdio(
    args: &[&str],
    dir: &std::path::Path,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    BufReader<std::process::ChildStdout>,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .arg("mcp")
        .args(args)
        .env("AIRLOCK_POOL__SIZE", "0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdin, stdout)
}

/// Over stdio nothing but protocol messages reaches stdout (logs go to stderr), and a host
/// that closes stdin while a call runs takes its sandbox with it.
#[test]
fn stdio_writes_only_protocol_messages_and_a_closed_stdin_stops_what_runs() {
    let _g = serial();
    let before = HostState::now();
    let dir = scratch_dir("mcp-raw");
    let (mut child, mut stdin, mut stdout) =
        raw_stdio(&["--state-dir", dir.to_str().unwrap()], &dir);
    let send = |stdin: &mut std::process::ChildStdin, v: Value| writeln!(stdin, "{v}").unwrap();
    send(&mut stdin, initialize());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let answer: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["result"]["serverInfo"]["name"], "airlock", "{line}");
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    send(
        &mut stdin,
        tool_call(
            "run_python",
            json!({"code": "print('x', flush=True)\nimport time\ntime.sleep(60)",
                   "timeout_seconds": 120}),
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while sandbox_processes().len() <= before.sandbox_processes().len() {
        assert!(
            Instant::now() < deadline,
            "the call never started a sandbox"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    // Well before the 60 s the code would sleep.
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("airlock mcp did not stop when stdin closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    for line in rest.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a protocol message on stdout ({e}): {line}"));
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
    }
    let logs = std::fs::read_to_string(dir.join("stderr")).unwrap();
    assert!(
        logs.contains("serving MCP on stdio"),
        "logs go to stderr: {logs}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    HostState::now().assert_same_as(&before, &"after the host closed stdin");
}

/// A key over its rate limit is refused before its body is read (as on every route); GET has
/// no stream to give; with the default configuration any Origin is refused.
#[test]
fn http_limits_apply_before_the_body_is_read() {
    let _g = serial();
    let config = format!(
        "{}rate_per_minute = 1\n",
        key_toml("slow", OTHER_KEY, "[\"execute\"]")
    );
    let server = Server::start(&config, &[]);
    let r = rpc(&server, Some(OTHER_KEY), &[], &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    // Headers announcing 8 MB, and no body: the answer comes without waiting for it.
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {OTHER_KEY}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: 8000000\r\n\r\n"
    )
    .unwrap();
    let mut head = String::new();
    BufReader::new(&mut s).read_line(&mut head).unwrap();
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");

    let r = request(
        server.addr,
        "GET",
        "/mcp",
        &[
            ("Authorization".into(), format!("Bearer {KEY}")),
            ("Accept".into(), "text/event-stream".into()),
        ],
        None,
    );
    assert_eq!(r.status, 405, "{}", r.text());
    let r = rpc(
        &server,
        Some(KEY),
        &[("Origin", "http://127.0.0.1")],
        &initialize(),
    );
    assert_eq!((r.status, r.error_code()), (403, "forbidden".into()));
}

/// Over MCP too, a body counts in the memory budget until its call is admitted to run: with
/// the only slot busy, a queued 2 MB call (and both calls' answer reservations, 2.4 MiB each)
/// and 3 MB more from the same key pass its 8 MiB share; without the queued body they would
/// not.
#[test]
fn a_queued_call_holds_its_body_in_the_memory_budget() {
    let _g = serial();
    let server = Server::start(
        &format!(
            "[http]\nmax_body_bytes = 4000000\nmax_buffered_bytes_per_key = 8388608\n\
             max_buffered_bytes = 16777216\n[concurrency]\nmax_running = 1\n{}",
            common::http::SMALL_ANSWERS
        ),
        &[],
    );
    let call = |n: u32, pad: usize| {
        let addr = server.addr;
        let code = format!("import time\ntime.sleep(2)\n{n}");
        let mut body = vec![b' '; pad];
        body.extend(serde_json::to_vec(&tool_call("run_python", json!({"code": code}))).unwrap());
        std::thread::spawn(move || {
            let headers = [
                ("Content-Type".to_owned(), "application/json".to_owned()),
                (
                    "Accept".to_owned(),
                    "application/json, text/event-stream".to_owned(),
                ),
                ("Authorization".to_owned(), format!("Bearer {KEY}")),
            ];
            request(addr, "POST", "/mcp", &headers, Some(&body))
        })
    };
    let running = call(1, 0);
    server.wait_running(1);
    let queued = call(2, 2_000_000);
    std::thread::sleep(Duration::from_millis(700));
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: 4000000\r\n\r\n"
    )
    .unwrap();
    s.write_all(&vec![b' '; 3_000_000]).unwrap();
    let r = read_response(&mut s).expect("an answer before the body is all there");
    assert_eq!((r.status, r.error_code()), (429, "rate_limited".into()));
    for (t, n) in [(running, "1"), (queued, "2")] {
        let r = t.join().unwrap();
        let text = r.json()["result"]["content"].to_string();
        assert!(text.contains(&format!("result: {n}")), "{text}");
    }
}

/// Progress notifications as the SDK client's callback saw them: seconds since the call, the
/// progress value, and the bytes of output the message gives.
fn progress_seen(notes: &Value) -> Vec<(f64, f64, u64)> {
    notes
        .as_array()
        .unwrap_or_else(|| panic!("no notifications: {notes}"))
        .iter()
        .map(|n| {
            let message = n["message"].as_str().unwrap_or_else(|| panic!("{n}"));
            // "running for 12 s, 3456 bytes of output"
            let bytes = message
                .split(", ")
                .nth(1)
                .and_then(|b| b.strip_suffix(" bytes of output"))
                .and_then(|b| b.parse().ok())
                .unwrap_or_else(|| panic!("no output bytes in {message:?}"));
            assert!(message.starts_with("running for "), "{message}");
            assert!(n["total"].is_null(), "{n}");
            (
                n["at"].as_f64().unwrap(),
                n["progress"].as_f64().unwrap(),
                bytes,
            )
        })
        .collect()
}

/// Progress only grows, and the host never waits more than `max_gap` seconds to hear from
/// the call (from the call to the first notification, between two, from the last to the
/// result).
fn check_progress_timing(seen: &[(f64, f64, u64)], ended_at: f64, max_gap: f64, what: &str) {
    for pair in seen.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "{what}: progress must grow: {seen:?}"
        );
    }
    let mut times = vec![0.0];
    times.extend(seen.iter().map(|n| n.0));
    times.push(ended_at);
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] <= max_gap,
            "{what}: {} s without a notification: {seen:?} (ended at {ended_at})",
            pair[1] - pair[0]
        );
    }
}

/// The `progress` scenario: a 30 s run_python that prints a line every 7.5 s.
fn check_progress(seen: &Value, what: &str) {
    assert!(seen.get("failed").is_none(), "{what}: {seen:#}");
    let out = ok(&seen["run"]);
    assert!(out.contains("line 3"), "{what}: {out}");
    let notes = progress_seen(&seen["notifications"]);
    let ended_at = seen["ended_at"].as_f64().unwrap();
    assert!(ended_at >= 30.0, "{what}: the call took {ended_at} s");
    // Every 5 s by default: 5, 10, 15, 20, 25 (and maybe 30) s.
    assert!(notes.len() >= 3, "{what}: {notes:?}");
    check_progress_timing(&notes, ended_at, 10.0, what);
    // The output so far: the first line (printed at the start, not flushed: the server
    // line-buffers an observed call) by the first notification, more after later prints.
    let bytes: Vec<u64> = notes.iter().map(|n| n.2).collect();
    assert!(bytes[0] > 0, "{what}: {notes:?}");
    assert!(bytes.windows(2).all(|b| b[1] >= b[0]), "{what}: {notes:?}");
    assert!(bytes.last() > bytes.first(), "{what}: {notes:?}");
    // No logging level was set: no log messages.
    let others = seen["other_notifications"].to_string();
    assert!(
        !others.contains("notifications/message"),
        "{what}: {others}"
    );
}

/// A long call with a progress token keeps its host hearing from it, over stdio and over
/// streamable HTTP, run side by side (30 s for both).
#[test]
fn a_long_call_sends_progress_over_stdio_and_http() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let url = format!("http://{}/mcp", server.addr);
    let http = std::thread::spawn(move || client(&["http", &url, KEY, "progress"]));
    let stdio = over_stdio("progress");
    let http = http.join().unwrap();
    check_progress(&stdio, "stdio");
    check_progress(&http, "http");
    drop(server);
    HostState::now().assert_same_as(&before, &(stdio, http));
}

/// Over stdio: no progress without a token, no log messages before the host sets a level;
/// then each stream's output as `info` log messages, a character cut between two reads sent
/// whole; and a session's cell sends progress too.
#[test]
fn stdio_sends_nothing_unasked_and_the_output_as_log_messages_once_asked() {
    let _g = serial();
    let before = HostState::now();
    let seen = over_stdio_with("logs", &[("AIRLOCK_MCP__PROGRESS_INTERVAL_MS", "1000")]);
    assert!(seen.get("failed").is_none(), "{seen:#}");
    ok(&seen["quiet"]);
    assert_eq!(seen["quiet_notified"], json!([]), "{seen:#}");
    assert_eq!(seen["quiet_logged"], json!([]), "{seen:#}");
    ok(&seen["logged_run"]);
    let logged = seen["logged"].as_array().unwrap();
    let of = |logger: &str| -> String {
        logged
            .iter()
            .filter(|l| l["logger"] == logger)
            .map(|l| {
                assert_eq!(l["level"], "info", "{l}");
                l["data"].as_str().unwrap()
            })
            .collect()
    };
    assert_eq!(of("stdout"), "to stdout\nlater ééé\n", "{seen:#}");
    assert_eq!(of("stderr"), "to stderr\n", "{seen:#}");
    // Printed 1.5 s apart: two messages, not one at the end.
    assert!(logged.len() >= 3, "{seen:#}");
    assert!(ok(&seen["cell"]).contains("cell"));
    let notes = progress_seen(&seen["cell_progress"]);
    let ended_at = seen["cell_ended_at"].as_f64().unwrap();
    assert!(notes.len() >= 2, "{seen:#}");
    check_progress_timing(&notes, ended_at, 2.0, "cell");
    assert!(
        notes.iter().all(|n| n.2 == 5),
        "'cell\\n' printed: {notes:?}"
    );
    HostState::now().assert_same_as(&before, &seen);
}

fn tool_call_with_token(name: &str, arguments: Value, token: &str) -> Value {
    let mut call = tool_call(name, arguments);
    call["params"]["_meta"] = json!({"progressToken": token});
    call
}

/// The events of a server-sent events body, as JSON.
fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// Over HTTP a call answers as JSON unless it sends a notification first: a short call
/// with a progress token and a long one without get JSON; a long one with a token gets
/// server-sent events, progress then the result, whose reservation is given back once
/// written. A client that leaves such a stream takes its sandbox with it.
#[test]
fn over_http_a_call_answers_with_events_only_when_it_sends_progress() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("[mcp]\nprogress_interval_ms = 1000\n", &[]);
    let short = tool_call_with_token("run_python", json!({"code": "6 * 7"}), "tok-short");
    let r = rpc(&server, Some(KEY), &[], &short);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.text().contains("result: 42"), "{}", r.text());

    let long = json!({"code": "import time\nprint('a')\ntime.sleep(2.5)"});
    let r = rpc(
        &server,
        Some(KEY),
        &[],
        &tool_call("run_python", long.clone()),
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(!r.text().contains("notifications/"), "{}", r.text());

    let r = rpc(
        &server,
        Some(KEY),
        &[],
        &tool_call_with_token("run_python", long, "tok-long"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = events(&r.text());
    let (last, progress) = events.split_last().expect("events");
    assert!(progress.len() >= 2, "{events:?}");
    for p in progress {
        assert_eq!(p["method"], "notifications/progress", "{p}");
        assert_eq!(p["params"]["progressToken"], "tok-long", "{p}");
        assert!(
            p["params"]["message"]
                .as_str()
                .unwrap()
                .ends_with(", 2 bytes of output"),
            "{p}"
        );
    }
    assert_eq!(last["id"], 2, "{last}");
    assert!(
        last["result"]["content"]
            .to_string()
            .contains("stdout:\\na"),
        "{last}"
    );
    wait_for_memory_released(&server);

    // Gone after the first notification: the sandbox goes too.
    let mut s = server.connect();
    let body = tool_call_with_token(
        "run_python",
        json!({"code": "import time\ntime.sleep(60)", "timeout_seconds": 120}),
        "tok-gone",
    )
    .to_string();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    while !line.contains("notifications/progress") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "closed early");
    }
    drop(reader);
    server.wait_running(0);
    wait_for_memory_released(&server);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sandbox_processes().len() > before.sandbox_processes().len() && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(server);
    HostState::now().assert_same_as(&before, &"after the MCP client left a stream");
}

/// The answers' memory budget holds nothing once every answer is written (or dropped).
fn wait_for_memory_released(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("airlock_memory_held_bytes") != 0.0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes still held",
            server.metric("airlock_memory_held_bytes")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The names `tools/list` answers over stdio, from `airlock mcp` run with `config`.
fn stdio_tool_names(config: &str) -> Vec<String> {
    let dir = scratch_dir("mcp-tool-names");
    let config_path = dir.join("airlock.toml");
    std::fs::write(&config_path, config).unwrap();
    let state = dir.join("state");
    let (mut child, mut stdin, mut stdout) = raw_stdio(
        &[
            "--config",
            config_path.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &dir,
    );
    for message in [
        initialize(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    ] {
        writeln!(stdin, "{message}").unwrap();
    }
    let listed = loop {
        let mut line = String::new();
        let read = stdout.read_line(&mut line).unwrap();
        assert!(read > 0, "airlock mcp ended before it listed its tools");
        let answer: Value = serde_json::from_str(&line).unwrap();
        if answer["id"] == 2 {
            break answer;
        }
    };
    drop(stdin);
    assert!(child.wait().unwrap().success());
    listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {listed}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// `airlock mcp --help` names exactly the tools `tools/list` serves over stdio: all of them
/// where `[tools]` configures a tool server, and all but those it marks so otherwise.
#[test]
fn mcp_help_names_exactly_the_tools_it_serves() {
    let help = airlock().args(["mcp", "--help"]).output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    let listed: Vec<(&str, bool)> = help
        .lines()
        .skip_while(|l| *l != "Tools:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            let name = l.split_whitespace().next().unwrap();
            (name, l.contains("[tools]"))
        })
        .collect();
    let all: Vec<&str> = listed.iter().map(|(name, _)| *name).collect();
    let always: Vec<&str> = listed
        .iter()
        .filter(|(_, only_with_tools)| !only_with_tools)
        .map(|(name, _)| *name)
        .collect();

    let with_tools = format!(
        "[tools.servers.crm]\ncommand = \"{}\"\nargs = [\"{}\", \"stdio\"]\n",
        mcp_python().display(),
        tool_server_script()
    );
    assert_eq!(stdio_tool_names(&with_tools), all, "{help}");
    assert_eq!(stdio_tool_names(""), always, "{help}");
}
