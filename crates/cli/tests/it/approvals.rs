//! Tool calls that wait for an approval (docs/approvals.md), through the real server and a
//! real upstream MCP server (`tool_server.py` over stdio): a call runs only once a key with
//! the `approve` scope approves it, a denial and a timeout are `ToolError`s, one decision
//! decides one call, keys without the scope or not named by `approves` see nothing, calls of
//! an execution that ends are withdrawn and never run, concurrent calls each wait for their
//! own approval, a stream says a call waits, and an MCP host decides by elicitation.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::http::{call_as, request, Response, Server};
use common::key_hash as hash;
use common::mcp_python;
use common::scratch_dir;
use common::tool_server_script as script;
use serde_json::{json, Value};

const AGENT: &str = "agent-key-0123456789abcdef";
const BOSS: &str = "boss-key-0123456789abcdef";
/// Has the approve scope, for another key's calls only.
const ELSEWHERE: &str = "elsewhere-key-0123456789abcdef";

/// `crm` from tool_server.py over stdio, `write_note`, `slow` and `send_money` needing an approval; the
/// agent may call them, the boss decides the agent's calls, `elsewhere` only the boss's.
fn config(settings: &str) -> String {
    format!(
        r#"
[tools]
{settings}
[tools.servers.crm]
command = "{python}"
args = ["{script}", "stdio"]
env = {{ TOOL_LOG = {{ env = "TEST_TOOL_LOG" }} }}
approval = ["write_note", "sl*", "send_money"]

[[keys]]
name = "agent"
hash = "{agent}"
tools = ["crm.*", "crm.write_note", "crm.send_money"]

[[keys]]
name = "boss"
hash = "{boss}"
scopes = ["approve"]
approves = ["agent"]

[[keys]]
name = "elsewhere"
hash = "{elsewhere}"
scopes = ["approve", "execute"]
approves = ["boss"]
"#,
        python = mcp_python().display(),
        script = script(),
        agent = hash(AGENT),
        boss = hash(BOSS),
        elsewhere = hash(ELSEWHERE),
    )
}

fn start(dir: &Path, settings: &str) -> Server {
    let log = dir.join("tool.log");
    Server::start(
        &config(settings),
        &[("TEST_TOOL_LOG", log.to_str().unwrap())],
    )
}

fn call(server: &Server, key: &str, method: &str, path: &str, body: Option<&Value>) -> Response {
    call_as(server.addr, key, method, path, body)
}

/// Runs `code` as the agent on a thread of its own (it waits for approvals); its result.
fn run_later(server: &Server, code: &str, timeout_ms: u64) -> std::thread::JoinHandle<Value> {
    let addr = server.addr;
    let body = json!({"code": code, "limits": {"timeout_ms": timeout_ms}});
    std::thread::spawn(move || {
        let r = call_as(addr, AGENT, "POST", "/v1/execute", Some(&body));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    })
}

/// Runs `code` as the agent, streamed, on a thread of its own; the stream as it came.
fn stream_later(server: &Server, code: &str) -> std::thread::JoinHandle<String> {
    let addr = server.addr;
    let body = json!({"code": code}).to_string();
    std::thread::spawn(move || {
        let headers = [
            ("Authorization".to_owned(), format!("Bearer {AGENT}")),
            ("Content-Type".to_owned(), "application/json".to_owned()),
            ("Accept".to_owned(), "text/event-stream".to_owned()),
        ];
        request(addr, "POST", "/v1/execute", &headers, Some(body.as_bytes())).text()
    })
}

/// Code that calls `call` and ends with `[kind, message]` of its `ToolError`, or
/// `["ok", value]`; the call is on line 3.
fn attempt(call: &str) -> String {
    format!(
        "import tools\ntry:\n    out = ['ok', {call}]\nexcept tools.ToolError as e:\n    out = [e.kind, str(e)]\nout"
    )
}

/// The calls waiting that `key` sees.
fn pending(server: &Server, key: &str) -> Vec<Value> {
    let r = call(server, key, "GET", "/v1/approvals", None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["approvals"].as_array().unwrap().clone()
}

/// Waits (up to 20 s) until the boss sees `n` calls waiting.
fn wait_pending(server: &Server, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = pending(server, BOSS);
        if seen.len() == n {
            return seen;
        }
        assert!(Instant::now() < deadline, "never saw {n} waiting: {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn decide(server: &Server, key: &str, id: &str, decision: &str, reason: Option<&str>) -> Response {
    let mut body = json!({"decision": decision});
    if let Some(reason) = reason {
        body["reason"] = json!(reason);
    }
    call(
        server,
        key,
        "POST",
        &format!("/v1/approvals/{id}"),
        Some(&body),
    )
}

/// The audit log's lines of `event`.
fn audited(dir: &Path, event: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["event"] == event)
        .collect()
}

/// Waits (up to 10 s) for the approval lines of `id` to include `outcome`; all of them.
fn wait_audited(server: &Server, id: &str, outcome: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines: Vec<Value> = audited(&server.state_dir(), "tool_approval")
            .into_iter()
            .filter(|l| l["approval_id"] == id)
            .collect();
        if lines.iter().any(|l| l["outcome"] == outcome) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "no {outcome} for {id}: {lines:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What reached the tool server: its calls of `tool`, as it logged them.
fn reached(dir: &Path, tool: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join("tool.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["tool"] == tool)
        .collect()
}

/// What reached the tool server: the texts of its `write_note` calls.
fn notes(dir: &Path) -> Vec<String> {
    reached(dir, "write_note")
        .iter()
        .map(|e| e["text"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_call_runs_only_once_approved_and_each_decision_decides_one_call() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-decide");
    let server = start(&dir, "");
    let running = run_later(
        &server,
        &attempt("tools.crm.write_note(text='hello')"),
        60_000,
    );
    let seen = wait_pending(&server, 1);
    let a = &seen[0];
    let id = a["id"].as_str().unwrap();
    assert!(id.starts_with("ap_") && id.len() == 35, "{id}");
    assert_eq!(a["key"], "agent");
    assert_eq!(
        (&a["server"], &a["tool"]),
        (&json!("crm"), &json!("write_note"))
    );
    assert_eq!(a["arguments"], json!({"text": "hello"}));
    assert_eq!(a["line"], 3, "the code's line: {a}");
    assert!(a["execution_id"].as_str().unwrap().starts_with("ex_"));
    // Waiting, it has not reached the tool server.
    std::thread::sleep(Duration::from_millis(300));
    assert!(notes(&dir).is_empty(), "ran before its approval");
    // A key without the scope is refused; one whose `approves` does not name the agent sees
    // nothing and decides nothing; the agent cannot approve its own call.
    assert_eq!(
        call(&server, AGENT, "GET", "/v1/approvals", None).status,
        403
    );
    assert_eq!(decide(&server, AGENT, id, "approve", None).status, 403);
    assert!(pending(&server, ELSEWHERE).is_empty());
    assert_eq!(decide(&server, ELSEWHERE, id, "approve", None).status, 404);
    assert_eq!(
        decide(&server, BOSS, "ap_0123", "approve", None).status,
        404
    );
    let bad = decide(&server, BOSS, id, "maybe", None);
    assert_eq!(bad.status, 400, "{}", bad.text());
    let ok = decide(&server, BOSS, id, "approve", Some("fine"));
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["decided_by"], "boss");
    assert_eq!(ok.json()["approval"]["id"], id);
    // Decided once: a second decision, either way, finds nothing.
    assert_eq!(decide(&server, BOSS, id, "approve", None).status, 404);
    assert_eq!(decide(&server, BOSS, id, "deny", None).status, 404);
    let r = running.join().unwrap();
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["result"], json!(["ok", "written"]));
    assert_eq!(notes(&dir), ["hello"]);
    let lines = wait_audited(&server, id, "approved");
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["requested", "approved"]);
    assert_eq!(lines[1]["by"], "boss");
    assert_eq!(lines[1]["reason"], "fine");

    // Denied: the code gets ToolError(kind="denied") with the reason; nothing ran.
    let running = run_later(
        &server,
        &attempt("tools.crm.write_note(text='never')"),
        60_000,
    );
    let id = wait_pending(&server, 1)[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        decide(&server, BOSS, &id, "deny", Some("not on a Friday")).status,
        200
    );
    let r = running.join().unwrap();
    assert_eq!(r["result"][0], "denied", "{r:#}");
    assert!(
        r["result"][1].as_str().unwrap().contains("not on a Friday"),
        "{r:#}"
    );
    assert_eq!(notes(&dir), ["hello"]);
    let lines = wait_audited(&server, &id, "denied");
    assert_eq!(lines.last().unwrap()["by"], "boss");
    let calls = audited(&server.state_dir(), "tool_call");
    let denied = calls.iter().find(|c| c["reason"] == "approval_denied");
    assert_eq!(
        denied.map(|c| &c["outcome"]),
        Some(&json!("denied")),
        "{calls:?}"
    );
    // A tool the server's `approval` does not name runs at once.
    let r = run_later(&server, &attempt("tools.crm.add(a=1)"), 30_000)
        .join()
        .unwrap();
    assert_eq!(r["result"], json!(["ok", 2]));
    let metrics = call(&server, AGENT, "GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_tool_approvals_total{outcome=\"approved\"} 1"),
        "{metrics}"
    );
}

#[test]
fn an_undecided_call_times_out_and_the_execution_goes_on() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-timeout");
    let server = start(&dir, "approval_timeout_ms = 1500");
    let code = format!(
        "{}\nprint('went on')\nout",
        attempt("tools.crm.write_note(text='late')")
    );
    let running = run_later(&server, &code, 30_000);
    let id = wait_pending(&server, 1)[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = running.join().unwrap();
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["result"][0], "timeout", "{r:#}");
    assert!(r["stdout"].as_str().unwrap().contains("went on"));
    assert!(pending(&server, BOSS).is_empty());
    assert_eq!(decide(&server, BOSS, &id, "approve", None).status, 404);
    wait_audited(&server, &id, "timed_out");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        notes(&dir).is_empty(),
        "a timed-out call ran: {:?}",
        notes(&dir)
    );
}

#[test]
fn an_execution_that_ends_withdraws_its_waiting_calls_and_they_never_run() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-withdrawn");
    let server = start(&dir, "");
    // The execution's wall clock runs while its call waits: at 2 s it is killed.
    let started = Instant::now();
    let running = run_later(
        &server,
        &attempt("tools.crm.write_note(text='orphan')"),
        2000,
    );
    let id = wait_pending(&server, 1)[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = running.join().unwrap();
    assert_eq!(r["status"], "timeout", "{r:#}");
    assert!(started.elapsed() < Duration::from_secs(15));
    // Withdrawn by the time its answer came.
    assert!(pending(&server, BOSS).is_empty());
    assert_eq!(decide(&server, BOSS, &id, "approve", None).status, 404);
    wait_audited(&server, &id, "withdrawn");

    // A session closed while its cell's call waits.
    let created = call(&server, AGENT, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(created.status, 201, "{}", created.text());
    let session = created.json()["id"].as_str().unwrap().to_owned();
    let addr = server.addr;
    let path = format!("/v1/sessions/{session}/execute");
    let cell = std::thread::spawn(move || {
        let body = json!({"code": attempt("tools.crm.write_note(text='cell')")});
        call_as(addr, AGENT, "POST", &path, Some(&body))
    });
    let id = wait_pending(&server, 1)[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let closed = call(
        &server,
        AGENT,
        "DELETE",
        &format!("/v1/sessions/{session}"),
        None,
    );
    assert_eq!(closed.status, 204, "{}", closed.text());
    assert!(pending(&server, BOSS).is_empty(), "withdrawn at once");
    assert_eq!(decide(&server, BOSS, &id, "approve", None).status, 404);
    let _ = cell.join().unwrap();
    wait_audited(&server, &id, "withdrawn");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        notes(&dir).is_empty(),
        "a withdrawn call ran: {:?}",
        notes(&dir)
    );

    // A session's thread that calls once its cell is over: no execution to wait within, so
    // the call never waits for (or runs on) anyone's approval; the thread gets `cancelled`.
    let created = call(&server, AGENT, "POST", "/v1/sessions", Some(&json!({})));
    let session = created.json()["id"].as_str().unwrap().to_owned();
    let cell = |code: &str| {
        let r = call(
            &server,
            AGENT,
            "POST",
            &format!("/v1/sessions/{session}/execute"),
            Some(&json!({"code": code})),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let first = cell(
        "import threading, time, tools\nout = []\ndef later():\n    time.sleep(1.0)\n    try:\n        out.append(['ok', tools.crm.write_note(text='between cells')])\n    except tools.ToolError as e:\n        out.append([e.kind, str(e)])\nthreading.Thread(target=later).start()\n'started'",
    );
    assert_eq!(first["status"], "ok", "{first:#}");
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        pending(&server, BOSS).is_empty(),
        "a call waits between cells"
    );
    let second = cell("out");
    assert_eq!(second["result"][0][0], "cancelled", "{second:#}");
    assert!(
        second["result"][0][1].as_str().unwrap().contains("no cell"),
        "{second:#}"
    );
    assert!(notes(&dir).is_empty(), "{:?}", notes(&dir));
}

#[test]
fn concurrent_calls_each_wait_for_their_own_approval() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-concurrent");
    let server = start(&dir, "");
    let code = "import tools, threading\nout = {}\ndef one(i):\n    try:\n        out[i] = tools.crm.write_note(text='note %d' % i)\n    except tools.ToolError as e:\n        out[i] = e.kind\nts = [threading.Thread(target=one, args=(i,)) for i in range(3)]\n[t.start() for t in ts]\n[t.join() for t in ts]\n[out[i] for i in range(3)]";
    let running = run_later(&server, code, 60_000);
    let seen = wait_pending(&server, 3);
    let by_text = |text: &str| {
        seen.iter()
            .find(|a| a["arguments"]["text"] == text)
            .unwrap_or_else(|| panic!("{text}: {seen:?}"))["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let ids = [by_text("note 0"), by_text("note 1"), by_text("note 2")];
    assert_eq!(
        ids.iter().collect::<std::collections::BTreeSet<_>>().len(),
        3,
        "one approval per call"
    );
    assert!(seen.iter().all(|a| a["line"] == 5), "{seen:?}");
    assert_eq!(decide(&server, BOSS, &ids[1], "deny", None).status, 200);
    assert_eq!(decide(&server, BOSS, &ids[0], "approve", None).status, 200);
    assert_eq!(pending(&server, BOSS).len(), 1, "the third still waits");
    assert_eq!(decide(&server, BOSS, &ids[2], "approve", None).status, 200);
    let r = running.join().unwrap();
    assert_eq!(
        r["result"],
        json!(["written", "denied", "written"]),
        "{r:#}"
    );
    let mut ran = notes(&dir);
    ran.sort();
    assert_eq!(ran, ["note 0", "note 2"]);
}

#[test]
fn a_stream_says_when_a_call_waits() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-stream");
    let server = start(&dir, "");
    let streaming = stream_later(&server, &attempt("tools.crm.write_note(text='streamed')"));
    let id = wait_pending(&server, 1)[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(decide(&server, BOSS, &id, "approve", None).status, 200);
    let text = streaming.join().unwrap();
    let event = text
        .split("event: approval_requested\ndata: ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("no approval_requested event: {text}"));
    let event: Value = serde_json::from_str(event).unwrap();
    assert_eq!(event["id"], id.as_str());
    assert_eq!(event["arguments"], json!({"text": "streamed"}));
    let (asked, result) = (
        text.find("event: approval_requested").unwrap(),
        text.find("event: result")
            .unwrap_or_else(|| panic!("{text}")),
    );
    assert!(asked < result, "{text}");
    assert!(text.contains("written"), "{text}");
}

/// `airlock mcp` with this file's tools, driven by the official SDK's client in `scenario`.
fn over_stdio(dir: &Path, scenario: &str, settings: &str) -> (Value, Vec<Value>) {
    let config = dir.join("airlock.toml");
    let toml = format!(
        "[mcp]\nstdio_tools = [\"crm.write_note\", \"crm.send_money\"]\n{}",
        config_for_stdio(settings)
    );
    std::fs::write(&config, toml).unwrap();
    let state = dir.join("state");
    let out = std::process::Command::new(mcp_python())
        .args([
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py"),
            "stdio",
            env!("CARGO_BIN_EXE_airlock"),
            state.to_str().unwrap(),
            scenario,
        ])
        .env("AIRLOCK_CONFIG", &config)
        .env("TEST_TOOL_LOG", dir.join("tool.log"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seen: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr)));
    assert!(seen.get("failed").is_none(), "{seen:#}");
    (seen, audited(&state, "tool_approval"))
}

/// The server config without keys (`airlock mcp` has its one local caller).
fn config_for_stdio(settings: &str) -> String {
    let full = config(settings);
    full[..full.find("[[keys]]").unwrap()].to_owned()
}

/// What the code printed in an MCP run_python result.
fn printed(result: &Value) -> String {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn an_mcp_host_decides_by_elicitation_and_one_without_it_is_refused_at_once() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-mcp");
    let (seen, lines) = over_stdio(&dir, "approval", "");
    let elicited = seen["elicited"].as_array().unwrap();
    assert_eq!(elicited.len(), 2, "{seen:#}");
    let message = elicited[0]["message"].as_str().unwrap();
    assert!(
        message.contains("crm.write_note") && message.contains("by elicitation"),
        "{message}"
    );
    assert_eq!(elicited[0]["schema"]["required"], json!(["approve"]));
    assert!(
        printed(&seen["first"]).contains("['ok', 'written']"),
        "{seen:#}"
    );
    let second = printed(&seen["second"]);
    assert!(
        second.contains("['denied'") && second.contains("declined"),
        "{second}"
    );
    assert_eq!(notes(&dir), ["by elicitation"]);
    let decided: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["outcome"] != "requested")
        .map(|l| (l["outcome"].as_str().unwrap(), l["by"].as_str().unwrap()))
        .collect();
    assert_eq!(decided, [("approved", "mcp_host"), ("denied", "mcp_host")]);

    // A host that takes no elicitation, and no HTTP approvals: nobody could approve.
    let dir = scratch_dir("approvals-mcp-unasked");
    let started = Instant::now();
    let (seen, lines) = over_stdio(&dir, "approval_unasked", "");
    let first = printed(&seen["first"]);
    assert!(
        first.contains("['denied'") && first.contains("nobody can give one"),
        "{first}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(lines.is_empty(), "{lines:?}");
    assert!(notes(&dir).is_empty());

    // A call withdrawn with its execution (killed at 2 s) while the host's dialog is open:
    // the dialog is cancelled then, not left to be answered for nothing; the call never ran.
    let dir = scratch_dir("approvals-mcp-stale");
    let (seen, lines) = over_stdio(&dir, "approval_stale", "");
    let elicited = seen["elicited"].as_array().unwrap();
    assert_eq!(elicited.len(), 1, "{seen:#}");
    assert_eq!(elicited[0]["cancelled"], true, "{seen:#}");
    let ended = elicited[0]["ended_after"].as_f64().unwrap();
    assert!(ended < 6.0, "the dialog stayed open {ended} s: {seen:#}");
    // The code's text reaches the dialog as printable ASCII, the line as the sandbox's word.
    let message = elicited[0]["message"].as_str().unwrap();
    assert!(
        message.is_ascii() && message.contains("as the sandbox says"),
        "{message}"
    );
    assert!(
        lines.iter().any(|l| l["outcome"] == "withdrawn"),
        "{lines:?}"
    );
    assert!(notes(&dir).is_empty());
}

/// A call whose long note would push a nested `to` and `amount` out of sight.
const HIDDEN: &str = "tools.crm.send_money(to='bob', amount=1, meta={'note': 'x' * 20000, 'to': 'mallory', 'amount': 1000000})";

#[test]
fn an_approver_sees_every_nested_value_and_can_read_the_whole_arguments() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-leaves");
    let server = start(&dir, "");
    let running = run_later(&server, &attempt(HIDDEN), 60_000);
    let a = wait_pending(&server, 1).remove(0);
    let id = a["id"].as_str().unwrap().to_owned();
    // Over `approval_shown_bytes` (16 KiB): not whole, but every key at every depth and
    // every value but the long note is in the preview, which stays within the bound.
    assert_eq!(a["arguments"], Value::Null, "{a}");
    let preview = a["arguments_preview"].as_str().unwrap();
    for leaf in [
        r#""to":"mallory""#,
        r#""amount":1000000"#,
        r#"{"to":"bob","amount":1,"meta":{"note":"xxxx"#,
    ] {
        assert!(preview.contains(leaf), "{leaf} is not in {preview}");
    }
    assert!(preview.len() <= 16384, "{} bytes", preview.len());
    assert!(preview.contains("\"...(3711 more bytes),"), "{preview}");
    assert_eq!(a["arguments_shown"], "cut", "{a}");
    // The whole arguments, exactly as the tool will get them, to a key that may decide.
    let path = format!("/v1/approvals/{id}");
    let whole = call(&server, BOSS, "GET", &path, None);
    assert_eq!(whole.status, 200, "{}", whole.text());
    let body = whole.json();
    assert_eq!(body["approval"], a);
    let sent = json!({"to": "bob", "amount": 1, "meta": {"note": "x".repeat(20000), "to": "mallory", "amount": 1000000}});
    assert_eq!(body["arguments"], sent);
    let text = whole.text();
    let raw = text
        .rsplit_once(r#","arguments":"#)
        .and_then(|(_, raw)| raw.strip_suffix('}'))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(raw, sent.to_string(), "the bytes the tool gets");
    assert_eq!(a["arguments_bytes"], raw.len());
    // Anyone else gets what an id that never was gets; a key without the scope, 403.
    let never = call(&server, BOSS, "GET", "/v1/approvals/ap_0123", None);
    let elsewhere = call(&server, ELSEWHERE, "GET", &path, None);
    assert_eq!((never.status, elsewhere.status), (404, 404));
    let error = |r: &Response| {
        (
            r.json()["error"]["code"].clone(),
            r.json()["error"]["message"].clone(),
        )
    };
    assert_eq!(error(&never), error(&elsewhere));
    assert_eq!(call(&server, AGENT, "GET", &path, None).status, 403);
    assert_eq!(decide(&server, BOSS, &id, "approve", None).status, 200);
    assert_eq!(call(&server, BOSS, "GET", &path, None).status, 404);
    let r = running.join().unwrap();
    assert_eq!(r["result"], json!(["ok", "sent"]), "{r:#}");
    let paid = reached(&dir, "send_money");
    assert_eq!(paid.len(), 1);
    assert_eq!(
        paid[0]["meta"]["to"], "mallory",
        "what was shown is what ran"
    );
}

/// Whether every byte is printable ASCII or a line break (of server-sent events).
fn plain(text: &str) -> bool {
    text.bytes()
        .all(|b| b == b'\n' || (0x20..0x7f).contains(&b))
}

#[test]
fn bidi_and_control_characters_reach_no_approver_raw() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-bidi");
    let server = start(&dir, "");
    // Two calls, of a streamed execution: one small enough to be shown whole, one not.
    let code = format!(
        "import tools\nout = []\nout.append(tools.crm.send_money(to='bob\\u202e', amount=1, \
         meta={{'\\u2066k': 'a\\x1b[2Kb\\rc\\x7f\\u200bd\\u061c\\u00e9'}}))\nout.append({})\nout",
        HIDDEN.replace("'mallory'", "'mallory\\u2067'")
    );
    let streaming = stream_later(&server, &code);
    let mut previews = vec![];
    for _ in 0..2 {
        wait_pending(&server, 1);
        let listed = call(&server, BOSS, "GET", "/v1/approvals", None);
        assert!(
            plain(&listed.text()),
            "raw in the listing: {}",
            listed.text()
        );
        let a = listed.json()["approvals"][0].clone();
        assert_eq!(a["arguments"], Value::Null, "shown raw: {a}");
        assert_eq!(a["arguments_escaped"], true, "{a}");
        let id = a["id"].as_str().unwrap().to_owned();
        // The whole arguments are exact JSON (the characters themselves); what is shown of
        // them is not.
        let whole = call(&server, BOSS, "GET", &format!("/v1/approvals/{id}"), None).json();
        assert_eq!(whole["approval"], a);
        previews.push((a["arguments_preview"].as_str().unwrap().to_owned(), whole));
        assert_eq!(decide(&server, BOSS, &id, "approve", None).status, 200);
    }
    assert_eq!(
        previews[0].0,
        r#"{"to":"bob\u{202e}","amount":1,"meta":{"\u{2066}k":"a\u001b[2Kb\rc\u{7f}\u{200b}d\u{61c}\u{e9}"}}"#
    );
    assert_eq!(
        previews[0].1["arguments"],
        json!({"to": "bob\u{202e}", "amount": 1, "meta": {"\u{2066}k": "a\u{1b}[2Kb\rc\u{7f}\u{200b}d\u{61c}\u{e9}"}})
    );
    assert!(
        previews[1]
            .0
            .contains(r#""to":"mallory\u{2067}","amount":1000000"#),
        "{}",
        previews[1].0
    );
    assert_eq!(previews[1].1["arguments"]["meta"]["to"], "mallory\u{2067}");
    let text = streaming.join().unwrap();
    assert_eq!(
        text.matches("event: approval_requested").count(),
        2,
        "{text}"
    );
    assert!(plain(&text), "raw in the stream: {text}");
    assert!(text.contains(r#"\\u{202e}"#), "{text}");

    // An MCP host is shown the same text, every nested value in it.
    let dir = scratch_dir("approvals-mcp-hidden");
    let (seen, _) = over_stdio(&dir, "approval_hidden", "");
    let elicited = seen["elicited"].as_array().unwrap();
    assert_eq!(elicited.len(), 1, "{seen:#}");
    let message = elicited[0]["message"].as_str().unwrap();
    assert!(plain(message), "{message}");
    for leaf in [
        r#"{"to":"bob\u{202e}","amount":1,"meta":{"note":"xxxx"#,
        r#""to":"mallory","amount":1000000}}"#,
    ] {
        assert!(message.contains(leaf), "{leaf} is not in {message}");
    }
    assert!(printed(&seen["first"]).contains("sent"), "{seen:#}");
    assert_eq!(reached(&dir, "send_money")[0]["meta"]["to"], "mallory");
}

#[test]
fn bad_approval_configs_are_refused_at_start() {
    let _serial = common::serial();
    let dir = scratch_dir("approvals-config");
    let serve = |toml: &str| {
        let path = dir.join("bad.toml");
        std::fs::write(&path, toml).unwrap();
        let out = common::airlock()
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .env("TEST_TOOL_LOG", dir.join("tool.log"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let base = config("");
    let e = serve(&base.replace(
        "approval = [\"write_note\", \"sl*\", \"send_money\"]",
        "approval = [\"crm.write_note\"]",
    ));
    assert!(e.contains("has no tool `crm.write_note`"), "{e}");
    let e = serve(&base.replace(
        "approval = [\"write_note\", \"sl*\", \"send_money\"]",
        "approval = \"maybe\"",
    ));
    assert!(e.contains("\"required\", \"none\""), "{e}");
    let e = serve(&base.replace("approves = [\"agent\"]\n", ""));
    assert!(e.contains("the approve scope needs `approves`"), "{e}");
    let e = serve(&base.replace("approves = [\"agent\"]", "approves = [\"boss\"]"));
    assert!(e.contains("never decides its own calls"), "{e}");
    let e = serve(&base.replace("approves = [\"agent\"]", "approves = [\"agnet\"]"));
    assert!(e.contains("agnet"), "{e}");
}
