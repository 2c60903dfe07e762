//! Code mode through the real server: sandboxed code calls tools of an upstream MCP server
//! written with the official Python SDK (`tool_server.py`, started by airlock over stdio, or
//! over streamable HTTP on loopback), through the host's broker. What round-trips, what is
//! granted, every bound, upstream faults, cancellation, audit and metrics, sessions, MCP to
//! airlock to MCP, and that the tool server's secrets never reach the sandbox.

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
const WRITER: &str = "writer-key-0123456789abcdef";
const NOBODY: &str = "nobody-key-0123456789abcdef";
/// The tests look for its middle part, which nothing else contains.
const CANARY: &str = "canary-4f1c9b7e-secret";

/// The config of a server whose `crm` tools come from tool_server.py over stdio, with
/// `settings` in `[tools]`: the agent key gets every read-only tool, the writer also
/// `write_note`, the third key nothing.
fn stdio_config(settings: &str) -> String {
    format!(
        r#"
[tools]
{settings}
[tools.servers.crm]
command = "{python}"
args = ["{script}", "stdio"]
env = {{ TOOL_CANARY = {{ env = "TEST_TOOL_CANARY" }}, TOOL_LOG = {{ env = "TEST_TOOL_LOG" }} }}

[[keys]]
name = "agent"
hash = "{agent}"
tools = ["crm.*"]

[[keys]]
name = "writer"
hash = "{writer}"
tools = ["crm.add", "crm.write_note"]

[[keys]]
name = "nobody"
hash = "{nobody}"
"#,
        python = mcp_python().display(),
        script = script(),
        agent = hash(AGENT),
        writer = hash(WRITER),
        nobody = hash(NOBODY),
    )
}

fn start(log: &Path, settings: &str) -> Server {
    let log_file = log.join("tool.log");
    Server::start(
        &stdio_config(settings),
        &[
            ("TEST_TOOL_CANARY", CANARY),
            ("TEST_TOOL_LOG", log_file.to_str().unwrap()),
        ],
    )
}

fn call(server: &Server, key: &str, method: &str, path: &str, body: Option<&Value>) -> Response {
    call_as(server.addr, key, method, path, body)
}

/// Runs `code` as `key`; the whole result.
fn run(server: &Server, key: &str, code: &str) -> Value {
    let r = call(
        server,
        key,
        "POST",
        "/v1/execute",
        Some(&json!({"code": code})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Runs `code` as `key`; its result value, which must be `ok`.
fn value(server: &Server, key: &str, code: &str) -> Value {
    let r = run(server, key, code);
    assert_eq!(r["status"], "ok", "{r:#}");
    r["result"].clone()
}

/// Runs one tool call (an expression) as `key`: `[kind, message]` of the `ToolError` it
/// raised, or `["ok", value]`.
fn attempt(server: &Server, key: &str, call: &str) -> Value {
    value(
        server,
        key,
        &format!(
            "import tools\ntry:\n    out = ['ok', {call}]\nexcept tools.ToolError as e:\n    out = [e.kind, str(e)]\nout"
        ),
    )
}

/// The tool server's log lines.
fn tool_log(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("tool.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The audit log's tool-call lines.
fn tool_calls(server: &Server) -> Vec<Value> {
    std::fs::read_to_string(server.state_dir().join("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["event"] == "tool_call")
        .collect()
}

/// Python that sends one hand-made frame on the tool channel and gives back the answer.
const RAW_FRAME: &str = r#"
import os, marshal, json
def raw(payload):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    os.write(4, len(data).to_bytes(4, "little") + data)
    head = os.read(4, 4)
    n = int.from_bytes(head, "little")
    body = b""
    while len(body) < n:
        body += os.read(4, n - len(body))
    return marshal.loads(body)
"#;

#[test]
fn values_round_trip_and_the_servers_secrets_stay_out() {
    let _serial = common::serial();
    let dir = scratch_dir("values");
    let server = start(&dir, "");
    let r = value(
        &server,
        AGENT,
        &r#"
import tools, os, json
out = {}
out["add"] = tools.crm.add(a=2, b=40)
# Tools named like the package's internals change nothing else.
out["odd_names"] = [tools.crm.aio(x=5), tools.crm._airlock_defaults(y=3), tools.crm.add(a=1)]
out["add_default"] = tools.crm.add(a=2)
out["echo"] = tools.crm.echo(value={"list": [1, 2.5, None, True, "é"], "big": 2**70})
out["text"] = tools.crm.greet(name="Ada")
image = tools.crm.pixel()
out["image"] = [type(image).__name__, image[:8] == b"\x89PNG\r\n\x1a\n"]
out["search"] = tools.search("customer")
out["dir"] = sorted(n for n in dir(tools.crm) if not n.startswith("_"))
out["doc"] = tools.crm.add.__doc__
import inspect
out["signature"] = str(inspect.signature(tools.crm.add))
try:
    tools.crm.fail(message="no such account")
except tools.ToolError as e:
    out["fail"] = [str(e), e.kind]
try:
    tools.crm.add(a="not a number")
except tools.ToolError as e:
    out["schema"] = [str(e), e.kind]
try:
    tools.crm.add(a=1, c=2)
except TypeError as e:
    out["unknown_arg"] = str(e)
try:
    tools.crm.echo(value=object())
except TypeError as e:
    out["not_json"] = str(e)
try:
    tools.crm.find_custmer
except AttributeError as e:
    out["typo"] = str(e)
out["holds_canary"] = tools.crm.holds_canary()
# Every place a secret could leak into the sandbox: the environment, /proc, the package.
seen = [json.dumps(dict(os.environ))]
for pid in os.listdir("/proc"):
    for name in ("environ", "cmdline"):
        try:
            seen.append(open("/proc/%s/%s" % (pid, name), "rb").read().decode("latin-1"))
        except OSError:
            pass
for module in [tools, tools.crm]:
    for name in dir(module):
        obj = getattr(module, name)
        seen.append(repr(obj) + str(getattr(obj, "__doc__", "")))
        seen.append(repr(getattr(obj, "__globals__", {}).get("_airlock_target")))
out["leaks"] = [s for s in seen if "4f1c9b7e" in s]
# The tool server's own files (its log, its program) are not in the sandbox's world.
out["files"] = []
for path in [TOOL_FILES]:
    try:
        open(path, "rb")
        out["files"].append(path)
    except OSError:
        pass
out
"#
        .replace(
            "TOOL_FILES",
            &format!(
                "{:?}, {:?}",
                dir.join("tool.log").display().to_string(),
                script()
            ),
        ),
    );
    assert_eq!(r["add"], 42);
    assert_eq!(r["odd_names"], json!([5, 3, 2]));
    assert_eq!(r["add_default"], 3);
    assert_eq!(
        r["echo"],
        json!({"value": {"list": [1, 2.5, null, true, "é"], "big": 2u128.pow(70).to_string().parse::<Value>().unwrap()}})
    );
    assert_eq!(r["text"], "hello Ada");
    assert_eq!(r["image"], json!(["bytes", true]));
    assert_eq!(
        r["search"],
        json!([
            {"name": "crm.find_customer", "description": "Finds a customer by id."},
            {"name": "crm.list_orders", "description": "Lists a customer's orders."}
        ]),
        "a match in the name ranks first"
    );
    let dir_names: Vec<&str> = r["dir"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        dir_names.contains(&"add") && dir_names.contains(&"find_customer"),
        "{dir_names:?}"
    );
    assert!(
        !dir_names.contains(&"write_note"),
        "a write tool needs its exact name: {dir_names:?}"
    );
    assert!(
        r["doc"].as_str().unwrap().starts_with("Adds two integers."),
        "{}",
        r["doc"]
    );
    assert_eq!(r["signature"], "(*, a: int, b: int = 1)");
    // The tool's own message, as its server sent it.
    assert_eq!(r["fail"][1], "tool");
    assert!(
        r["fail"][0].as_str().unwrap().ends_with("no such account"),
        "{}",
        r["fail"]
    );
    assert_eq!(r["schema"][1], "schema");
    assert!(
        r["schema"][0]
            .as_str()
            .unwrap()
            .contains("not of type \"integer\""),
        "{}",
        r["schema"]
    );
    assert!(
        r["unknown_arg"].as_str().unwrap().contains("'c'"),
        "{}",
        r["unknown_arg"]
    );
    assert!(
        r["not_json"].as_str().unwrap().contains("JSON"),
        "{}",
        r["not_json"]
    );
    assert!(
        r["typo"].as_str().unwrap().contains("'find_customer'"),
        "close matches are named: {}",
        r["typo"]
    );
    assert_eq!(
        r["holds_canary"], true,
        "the secret reached the tool server"
    );
    assert_eq!(
        r["leaks"],
        json!([]),
        "nothing of the tool server's environment is in the sandbox"
    );

    // The calls were audited (hash and sizes, never the arguments), counted and measured.
    let calls = tool_calls(&server);
    let add = calls
        .iter()
        .find(|c| c["tool"] == "add")
        .expect("an audited call");
    assert_eq!(add["key"], "agent");
    assert_eq!(add["server"], "crm");
    assert_eq!(add["outcome"], "ok");
    assert!(
        add["execution_id"].as_str().unwrap().starts_with("ex_"),
        "{add}"
    );
    assert_eq!(add["arguments_sha256"].as_str().unwrap().len(), 64);
    assert!(
        add.get("arguments").is_none(),
        "arguments are not audited by default"
    );
    let audit = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    assert!(!audit.contains("no such account") && !audit.contains(CANARY));
    assert!(calls
        .iter()
        .any(|c| c["tool"] == "add" && c["outcome"] == "error" && c["reason"] == "schema"));
    let metrics = server.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_tool_calls_total{server=\"crm\",tool=\"add\",outcome=\"ok\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("airlock_tool_server_up{server=\"crm\"} 1"),
        "{metrics}"
    );

    // An uncaught ToolError's traceback ends at the code's own line.
    let r = run(
        &server,
        AGENT,
        "import tools\n\ndef lookup():\n    return tools.crm.fail(message='gone')\n\nlookup()\n",
    );
    assert_eq!(r["status"], "error");
    assert_eq!(r["error"]["type"], "tools.ToolError");
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(!tb.contains("<tools.") && !tb.contains("<string>"), "{tb}");
    assert!(
        tb.contains("line 4, in lookup\n    return tools.crm.fail(message='gone')\n"),
        "{tb}"
    );
    assert!(
        tb.trim_end()
            .ends_with("tools.ToolError: Error executing tool fail: gone"),
        "{tb}"
    );

    // The execution's usage counts its calls.
    let r = run(
        &server,
        AGENT,
        "import tools\n[tools.crm.add(a=i) for i in range(3)]",
    );
    assert_eq!(r["usage"]["tool_calls"], 3);
    assert_eq!(r["result"], json!([1, 2, 3]));
    let r = run(&server, AGENT, "1");
    assert_eq!(r["usage"]["tool_calls"], 0);
}

#[test]
fn only_what_is_granted_exists_and_hand_made_frames_are_refused_on_the_host() {
    let _serial = common::serial();
    let dir = scratch_dir("grants");
    let server = start(&dir, "");
    // A key with no grant has no package and no channel.
    let r = value(
        &server,
        NOBODY,
        "import os\ntry:\n    import tools\n    out = 'imported'\nexcept ModuleNotFoundError as e:\n    out = str(e)\ntry:\n    os.fstat(4)\n    fd = 'open'\nexcept OSError:\n    fd = 'closed'\n[out, fd]",
    );
    assert_eq!(r, json!(["No module named 'tools'", "closed"]));

    // A write tool: absent for a glob grant, present for an exact one.
    let r = value(
        &server,
        AGENT,
        &format!(
            "{RAW_FRAME}\nimport tools\nout = {{'has': hasattr(tools.crm, 'write_note')}}\n\
             out['raw_write'] = raw({{'id': 1, 'server': 'crm', 'tool': 'write_note', 'arguments': {{'text': 'x'}}}})\n\
             out['raw_case'] = raw({{'id': 2, 'server': 'crm', 'tool': 'ADD', 'arguments': {{'a': 1}}}})\n\
             out['raw_lookalike'] = raw({{'id': 3, 'server': 'crm', 'tool': '\\u0430dd', 'arguments': {{'a': 1}}}})\n\
             out['raw_server'] = raw({{'id': 4, 'server': 'CRM', 'tool': 'add', 'arguments': {{'a': 1}}}})\n\
             out['raw_ok'] = raw({{'id': 5, 'server': 'crm', 'tool': 'add', 'arguments': {{'a': 1}}}})\n\
             out"
        ),
    );
    assert_eq!(r["has"], false);
    for name in ["raw_write", "raw_case", "raw_lookalike", "raw_server"] {
        assert_eq!(r[name]["kind"], "denied", "{name}: {}", r[name]);
    }
    assert_eq!(r["raw_ok"]["value"], 2);
    let r = value(
        &server,
        WRITER,
        "import tools\n[tools.crm.write_note(text='hello'), sorted(n for n in dir(tools.crm) if not n.startswith('_'))]",
    );
    assert_eq!(r, json!(["written", ["add", "write_note"]]));
    assert!(tool_log(&dir)
        .iter()
        .any(|e| e["tool"] == "write_note" && e["text"] == "hello"));
    assert!(
        !tool_log(&dir).iter().any(|e| e["text"] == "x"),
        "the refused frame never reached the server"
    );
    let denied = tool_calls(&server)
        .into_iter()
        .filter(|c| c["outcome"] == "denied")
        .count();
    assert_eq!(denied, 4);

    // GET /v1/tools lists each key's own.
    let listed = call(&server, WRITER, "GET", "/v1/tools", None).json();
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["crm.add", "crm.write_note"]);
    assert!(listed["python"]
        .as_str()
        .unwrap()
        .contains("def write_note(*, text: str)"));
    assert_eq!(
        call(&server, NOBODY, "GET", "/v1/tools", None).json()["tools"],
        json!([])
    );
    let spec = server.call("GET", "/openapi.json", None).json();
    assert!(spec["paths"]["/v1/tools"]["get"].is_object());
}

#[test]
fn every_bound_holds_and_a_broken_frame_ends_the_execution() {
    let _serial = common::serial();
    let dir = scratch_dir("bounds");
    let server = start(
        &dir,
        "max_calls = 6\nmax_concurrent = 2\nmax_argument_bytes = 2000\nmax_result_bytes = 4000\ncall_timeout_ms = 1500",
    );
    // Concurrency: four threads, two upstream at once; all answered.
    let r = value(
        &server,
        AGENT,
        "import tools, threading\nres = []\nts = [threading.Thread(target=lambda i=i: res.append(tools.crm.slow(seconds=0.4, tag=str(i)))) for i in range(4)]\n[t.start() for t in ts]\n[t.join() for t in ts]\n[sorted(res), tools.crm.most_at_once()]",
    );
    assert_eq!(r, json!([["slept 0", "slept 1", "slept 2", "slept 3"], 2]));
    // asyncio tasks too.
    let r = value(
        &server,
        AGENT,
        "import tools, asyncio, time\nasync def main():\n    t = time.monotonic()\n    got = await asyncio.gather(*(tools.crm.slow.aio(seconds=0.5, tag=str(i)) for i in range(2)))\n    return [got, time.monotonic() - t < 0.9]\nasyncio.run(main())",
    );
    assert_eq!(
        r,
        json!([["slept 0", "slept 1"], true]),
        "two calls ran at once"
    );

    // Calls: the seventh is refused, quickly, and the execution goes on.
    let r = value(
        &server,
        AGENT,
        "import tools\nout = []\nfor i in range(9):\n    try:\n        out.append(tools.crm.add(a=i))\n    except tools.ToolError as e:\n        out.append(e.kind)\nout",
    );
    assert_eq!(r, json!([1, 2, 3, 4, 5, 6, "limit", "limit", "limit"]));

    // A flood: refused once the budget is spent, audited once, and another key's execution
    // runs meanwhile.
    let before = tool_calls(&server).len();
    let addr = server.addr;
    let flood = std::thread::scope(|s| {
        let flood = s.spawn(move || {
            call_as(
                addr,
                AGENT,
                "POST",
                "/v1/execute",
                Some(&json!({"code":
                "import tools, threading\nkinds = {}\ndef go():\n    for i in range(300):\n        try:\n            tools.crm.add(a=i)\n            k = 'ok'\n        except tools.ToolError as e:\n            k = e.kind\n        kinds[k] = kinds.get(k, 0) + 1\nts = [threading.Thread(target=go) for _ in range(4)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nkinds"})),
            )
            .json()["result"]
                .clone()
        });
        assert_eq!(
            value(&server, WRITER, "import tools\ntools.crm.add(a=1)"),
            2
        );
        flood.join().unwrap()
    });
    assert_eq!(flood, json!({"ok": 6, "limit": 1194}));
    let audited = tool_calls(&server).len() - before;
    assert_eq!(
        audited,
        6 + 1 + 1,
        "the six calls, the first refusal, the other key's call"
    );

    // Bytes: arguments (checked in the sandbox, and again on the host for a hand-made
    // frame) and results; never cut, always an error.
    let r = value(
        &server,
        AGENT,
        &format!(
            "{RAW_FRAME}\nimport tools\nout = {{}}\ntry:\n    tools.crm.greet(name='x' * 3000)\nexcept tools.ToolError as e:\n    out['args'] = [e.kind, str(e)]\n\
             out['raw_args'] = raw({{'id': 1, 'server': 'crm', 'tool': 'greet', 'arguments': {{'name': 'x' * 3000}}}})\n\
             try:\n    tools.crm.big(n=10000)\nexcept tools.ToolError as e:\n    out['result'] = [e.kind, str(e)]\n\
             out['small'] = len(tools.crm.big(n=100))\nout"
        ),
    );
    assert_eq!(r["args"][0], "limit");
    assert!(
        r["args"][1]
            .as_str()
            .unwrap()
            .contains("over the limit of 2000"),
        "{}",
        r["args"]
    );
    assert_eq!(r["raw_args"]["kind"], "limit");
    assert_eq!(r["result"][0], "limit");
    assert!(
        r["result"][1]
            .as_str()
            .unwrap()
            .contains("over the limit of 4000"),
        "{}",
        r["result"]
    );
    assert_eq!(r["small"], 100);

    // A result of a hundred megabytes: refused (the transport drops a message past 16 MiB, so
    // the call times out), and the server never held it.
    let r = attempt(&server, AGENT, "tools.crm.big(n=100_000_000)");
    assert!(r[0] == "timeout" || r[0] == "limit", "{r}");
    let rss = server.rss();
    assert!(rss < 150 << 20, "the server holds {} MiB", rss >> 20);

    // Time: a call past its timeout is a ToolError; the execution goes on.
    let started = Instant::now();
    let r = attempt(&server, AGENT, "tools.crm.slow(seconds=30, tag='late')");
    assert_eq!(r[0], "timeout");
    assert!(r[1].as_str().unwrap().contains("within 1500 ms"), "{r}");
    assert!(started.elapsed() < Duration::from_secs(15));

    // A frame over the cap, and one that is not a call: the execution ends, clearly.
    for (payload, why) in [
        (
            "os.write(4, (10**8).to_bytes(4, 'little'))",
            "over the limit",
        ),
        (
            "os.write(4, (5).to_bytes(4, 'little') + b'hello')",
            "malformed",
        ),
    ] {
        let r = run(
            &server,
            AGENT,
            &format!("import os, time\n{payload}\ntime.sleep(20)\nprint('survived')"),
        );
        assert_eq!(r["status"], "policy_violation", "{r:#}");
        assert_eq!(r["error"]["type"], "ToolChannelError");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(why),
            "{}",
            r["error"]
        );
        assert!(r["usage"]["wall_ms"].as_u64().unwrap() < 10_000);
    }
    // The server still answers.
    assert_eq!(
        value(&server, AGENT, "import tools\ntools.crm.add(a=41)"),
        42
    );
}

#[test]
fn a_keys_rate_spans_its_executions() {
    let _serial = common::serial();
    let dir = scratch_dir("rate");
    let server = start(&dir, "rate_per_minute = 5");
    let first = value(
        &server,
        AGENT,
        "import tools\nout = []\nfor i in range(4):\n    out.append(tools.crm.add(a=i))\nout",
    );
    assert_eq!(first, json!([1, 2, 3, 4]));
    let second = value(
        &server,
        AGENT,
        "import tools\nout = []\nfor i in range(3):\n    try:\n        out.append(tools.crm.add(a=i))\n    except tools.ToolError as e:\n        out.append([e.kind, 'minute' in str(e)])\nout",
    );
    assert_eq!(second, json!([1, ["limit", true], ["limit", true]]));
    // Another key has its own.
    assert_eq!(
        value(&server, WRITER, "import tools\ntools.crm.add(a=1)"),
        2
    );
}

#[test]
fn formats_in_a_tools_schema_are_checked_before_the_server_sees_them() {
    let _serial = common::serial();
    let dir = scratch_dir("formats");
    let server = start(&dir, "");
    // `contact`'s schema says `"format": "email"` and `"format": "date"`; the server itself
    // takes any string. The hand-made frame goes first: once the package has called, its
    // reader thread takes every answer.
    let r = value(
        &server,
        AGENT,
        &format!(
            "{RAW_FRAME}\nimport tools\nout = {{}}\n\
             out['raw'] = raw({{'id': 1, 'server': 'crm', 'tool': 'contact', 'arguments': {{'email': 'still-not-one'}}}})\n\
             for name, args in [('email', {{'email': 'not-an-email'}}), ('date', {{'email': 'ada@example.com', 'day': '2024-02-30'}})]:\n\
             \x20   try:\n        tools.crm.contact(**args)\n        out[name] = 'sent'\n\
             \x20   except tools.ToolError as e:\n        out[name] = [e.kind, str(e)]\n\
             out['valid'] = tools.crm.contact(email='ada@example.com', day='2024-02-29')\nout"
        ),
    );
    assert_eq!(r["email"][0], "schema", "{r}");
    assert!(
        r["email"][1]
            .as_str()
            .unwrap()
            .contains("\"not-an-email\" is not a \"email\""),
        "{r}"
    );
    assert_eq!(r["date"][0], "schema", "{r}");
    assert!(
        r["date"][1]
            .as_str()
            .unwrap()
            .contains("\"2024-02-30\" is not a \"date\""),
        "{r}"
    );
    assert_eq!(r["raw"]["kind"], "schema", "a hand-made frame too: {r}");
    assert_eq!(r["valid"], "booked ada@example.com 2024-02-29");
    let seen: Vec<Value> = tool_log(&dir)
        .into_iter()
        .filter(|e| e["tool"] == "contact")
        .collect();
    assert_eq!(
        seen,
        [json!({"tool": "contact", "email": "ada@example.com", "day": "2024-02-29"})],
        "only the valid call reached the tool server"
    );
    let refused = tool_calls(&server)
        .into_iter()
        .filter(|c| c["tool"] == "contact" && c["reason"] == "schema")
        .count();
    assert_eq!(refused, 3);
}

/// Python for one key's side of the fairness tests: `threads` threads call `crm.slow` (each
/// `seconds` long); a call refused as `unavailable` is tried again until `retry_for` seconds
/// have passed. The result: `[kind, seconds]` of every attempt.
fn hog(threads: usize, seconds: f64, retry_for: f64) -> String {
    format!(
        "import tools, threading, time\nstart = time.monotonic()\nout = []\n\
         def go():\n    while True:\n        t = time.monotonic()\n        try:\n\
         \x20           tools.crm.slow(seconds={seconds}, tag='hog')\n            out.append(['ok', time.monotonic() - t])\n            return\n\
         \x20       except tools.ToolError as e:\n            out.append([e.kind, time.monotonic() - t])\n\
         \x20           if e.kind != 'unavailable' or time.monotonic() - start > {retry_for}:\n                return\n\
         ts = [threading.Thread(target=go) for _ in range({threads})]\n[t.start() for t in ts]\n[t.join() for t in ts]\nout"
    )
}

/// Python that times one quick call inside the sandbox: `[result, seconds]`.
const TIMED_ADD: &str =
    "import tools, time\nt = time.monotonic()\nr = tools.crm.add(a=1)\n[r, time.monotonic() - t]";

#[test]
fn one_key_cannot_starve_another_of_a_tool_server() {
    let _serial = common::serial();
    let dir = scratch_dir("fair");
    let log_file = dir.join("tool.log");
    // The default bounds: 16 slots a server, a quarter of them kept for keys that hold none,
    // a second of waiting for one. Five executions at once: four of the agent's, one other.
    let server = Server::start(
        &stdio_config(""),
        &[
            ("TEST_TOOL_CANARY", CANARY),
            ("TEST_TOOL_LOG", log_file.to_str().unwrap()),
            ("AIRLOCK_CONCURRENCY__MAX_RUNNING", "5"),
        ],
    );
    // The quick call's own time, nothing else running: the server's and the channel's.
    let idle = (0..3)
        .map(|_| value(&server, WRITER, TIMED_ADD)[1].as_f64().unwrap())
        .fold(0.0, f64::max);

    let addr = server.addr;
    let started = |log: &[Value]| {
        log.iter()
            .filter(|e| e["tag"] == "hog" && e["state"] == "started")
            .count()
    };
    let (hogs, during) = std::thread::scope(|s| {
        let code = hog(4, 5.0, 4.0);
        let hogs: Vec<_> = (0..4)
            .map(|_| {
                let code = code.clone();
                s.spawn(move || {
                    call_as(
                        addr,
                        AGENT,
                        "POST",
                        "/v1/execute",
                        Some(&json!({"code": code})),
                    )
                    .json()
                })
            })
            .collect();
        // Until the agent holds every slot it may (twelve), and its other calls have come
        // (all sixteen hold slots, without the reserve) or had time to.
        let deadline = Instant::now() + Duration::from_secs(20);
        while started(&tool_log(&dir)) < 12 {
            assert!(Instant::now() < deadline, "the agent's calls never started");
            std::thread::sleep(Duration::from_millis(50));
        }
        let settle = Instant::now() + Duration::from_millis(1500);
        while started(&tool_log(&dir)) < 16 && Instant::now() < settle {
            std::thread::sleep(Duration::from_millis(50));
        }
        let during = value(&server, WRITER, TIMED_ADD);
        let hogs: Vec<Value> = hogs.into_iter().map(|h| h.join().unwrap()).collect();
        (hogs, during)
    });
    assert_eq!(during[0], 2);
    let took = during[1].as_f64().unwrap();
    assert!(
        took < idle + 0.1,
        "the other key's call took {took:.3} s while the agent held the server ({idle:.3} s idle)"
    );

    // The agent held at most its share at once: twelve ran, each to its end; the rest were
    // refused after a second of waiting, each time, never sent.
    let most = tool_log(&dir)
        .iter()
        .filter(|e| e["tag"] == "hog")
        .filter_map(|e| e["running"].as_u64())
        .max();
    assert_eq!(most, Some(12), "{:?}", tool_log(&dir));
    let attempts: Vec<(String, f64)> = hogs
        .iter()
        .flat_map(|h| {
            assert_eq!(h["status"], "ok", "{h:#}");
            h["result"].as_array().unwrap().clone()
        })
        .map(|a| (a[0].as_str().unwrap().to_owned(), a[1].as_f64().unwrap()))
        .collect();
    let ok = attempts.iter().filter(|(k, _)| k == "ok").count();
    assert_eq!(ok, 12, "{attempts:?}");
    let refused: Vec<f64> = attempts
        .iter()
        .filter(|(k, _)| k != "ok")
        .map(|(k, t)| {
            assert_eq!(k, "unavailable", "{attempts:?}");
            *t
        })
        .collect();
    assert!(!refused.is_empty(), "{attempts:?}");
    assert!(
        refused.iter().all(|t| (0.95..2.5).contains(t)),
        "refused after the second of waiting: {attempts:?}"
    );
    let busy: Vec<Value> = tool_calls(&server)
        .into_iter()
        .filter(|c| c["reason"] == "busy")
        .collect();
    assert_eq!(busy.len(), refused.len(), "{busy:?}");
    assert!(busy
        .iter()
        .all(|c| c["key"] == "agent" && c["outcome"] == "error"));
}

#[test]
fn a_call_that_gets_no_slot_in_time_is_unavailable_at_once() {
    let _serial = common::serial();
    let dir = scratch_dir("slot-wait");
    // One slot, so nothing is reserved; the default wait of a second.
    let server = start(&dir, "max_concurrent_per_server = 1");
    let r = value(
        &server,
        AGENT,
        "import tools, threading, time\nout = {}\n\
         held = threading.Thread(target=lambda: out.update(held=tools.crm.slow(seconds=5, tag='held')))\n\
         held.start()\ntime.sleep(0.5)\nt = time.monotonic()\n\
         try:\n    tools.crm.add(a=1)\n    out['add'] = 'sent'\nexcept tools.ToolError as e:\n    out['add'] = [e.kind, str(e)]\n\
         out['waited'] = time.monotonic() - t\nheld.join()\nout",
    );
    assert_eq!(r["add"][0], "unavailable", "{r}");
    let message = r["add"][1].as_str().unwrap();
    assert!(
        message.contains("`crm` is busy") && message.contains("within 1000 ms"),
        "{message}"
    );
    let waited = r["waited"].as_f64().unwrap();
    assert!((0.95..2.5).contains(&waited), "refused after {waited:.3} s");
    assert_eq!(
        r["held"], "slept held",
        "the call that held the slot ran on"
    );
    assert!(
        !tool_log(&dir).iter().any(|e| e["tool"] == "add"),
        "the refused call never reached the server"
    );
    let busy: Vec<Value> = tool_calls(&server)
        .into_iter()
        .filter(|c| c["tool"] == "add")
        .collect();
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert_eq!(busy[0]["outcome"], "error");
    assert_eq!(busy[0]["reason"], "busy");
}

#[test]
fn upstream_faults_are_tool_errors_and_a_dead_server_is_started_again() {
    let _serial = common::serial();
    let dir = scratch_dir("faults");
    let server = start(&dir, "call_timeout_ms = 2000");
    // Dies mid-call.
    let r = attempt(&server, AGENT, "tools.crm.die()");
    assert!(r[0] == "unavailable" || r[0] == "timeout", "{r}");
    // It comes back (restarted with a backoff), and /readyz and the metrics said so.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = server.call("GET", "/readyz", None).json();
        let crm = &ready["tools"][0];
        if crm["state"] == "ready" && crm["restarts"].as_u64() >= Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "never restarted: {ready}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(server
        .call("GET", "/metrics", None)
        .text()
        .contains("airlock_tool_server_restarts_total{server=\"crm\"} 1"));
    assert!(!server.wait_log_lines("starting it again", 1).is_empty());
    assert_eq!(value(&server, AGENT, "import tools\ntools.crm.add(a=1)"), 2);

    // Answers garbage where JSON-RPC belongs, then nothing: a timeout, and the execution goes on.
    let r = attempt(&server, AGENT, "tools.crm.garbage()");
    assert!(r[0] == "timeout" || r[0] == "unavailable", "{r}");

    // That server now ignores the end of its input (a call sleeps in a thread): stopping
    // airlock still stops it.
    assert!(server.stop().success());
    let marker = dir.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&marker))
        })
        .map(|e| e.path().display().to_string())
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "tool server processes outlived airlock"
    );
}

#[test]
fn a_sandbox_killed_mid_call_cancels_it_upstream() {
    let _serial = common::serial();
    let dir = scratch_dir("cancel");
    let server = start(&dir, "");
    let r = call(
        &server,
        AGENT,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "import tools\ntools.crm.slow(seconds=60, tag='orphan')", "limits": {"timeout_ms": 2000}})),
    )
    .json();
    assert_eq!(r["status"], "timeout");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tool_log(&dir)
        .iter()
        .any(|e| e["tag"] == "orphan" && e["state"] == "cancelled")
    {
        assert!(
            Instant::now() < deadline,
            "the upstream call was never cancelled: {:?}",
            tool_log(&dir)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tool_calls(&server)
        .iter()
        .any(|c| c["outcome"] == "cancelled")
    {
        assert!(Instant::now() < deadline, "no cancelled call audited");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn nothing_starts_upstream_once_the_sandbox_is_gone() {
    let _serial = common::serial();
    let dir = scratch_dir("gone");
    let server = start(&dir, "max_concurrent = 1");
    // One slow call holds the only slot; three more wait for it; the sandbox exits at once.
    let r = run(
        &server,
        AGENT,
        &format!(
            "{RAW_FRAME}\nimport json\ndef send(i, tool, args):\n    data = json.dumps({{'id': i, 'server': 'crm', 'tool': tool, 'arguments': args}}).encode()\n    os.write(4, len(data).to_bytes(4, 'little') + data)\n\
             send(1, 'slow', {{'seconds': 2, 'tag': 'held'}})\nimport time\ntime.sleep(0.5)\n\
             for i in range(3):\n    send(2 + i, 'add', {{'a': 1000 + i}})\nos._exit(0)"
        ),
    );
    assert_eq!(r["status"], "ok", "{r:#}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let calls = loop {
        let calls = tool_calls(&server);
        if calls.len() >= 4 {
            break calls;
        }
        assert!(Instant::now() < deadline, "not all audited: {calls:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !tool_log(&dir).iter().any(|e| e["tool"] == "add"),
        "a call of a dead sandbox reached the server: {:?}",
        tool_log(&dir)
    );
    let reasons: Vec<&str> = calls
        .iter()
        .map(|c| c["reason"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == "not_sent").count(),
        3,
        "{calls:?}"
    );
    assert!(reasons.contains(&"cancelled_upstream"), "{calls:?}");
}

#[test]
fn a_sessions_cells_call_tools() {
    let _serial = common::serial();
    let dir = scratch_dir("session");
    let server = start(&dir, "max_calls = 2");
    let created = call(&server, AGENT, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(created.status, 201, "{}", created.text());
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let cell = |code: &str| {
        let r = call(
            &server,
            AGENT,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(&json!({"code": code})),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let one = cell("import tools\nfirst = tools.crm.add(a=1)\nfirst");
    assert_eq!(one["result"], 2);
    assert_eq!(one["usage"]["tool_calls"], 1);
    // Each cell has its own call budget, and earlier cells' names still work.
    let two = cell("[tools.crm.add(a=first), tools.crm.add(a=10)]");
    assert_eq!(two["result"], json!([3, 11]));
    assert_eq!(two["usage"]["tool_calls"], 2);
    let three = cell("import tools\ntry:\n    [tools.crm.add(a=1) for _ in range(3)]\nexcept tools.ToolError as e:\n    out = e.kind\nout");
    assert_eq!(three["result"], "limit");
    let ids: Vec<String> = tool_calls(&server)
        .iter()
        .map(|c| c["execution_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(ids.iter().all(|i| i.starts_with("ex_")), "{ids:?}");
    assert!(
        ids.iter().collect::<std::collections::BTreeSet<_>>().len() >= 3,
        "each cell is its own execution: {ids:?}"
    );
}

#[test]
fn streamable_http_tools_get_their_header_from_the_host() {
    let _serial = common::serial();
    let dir = scratch_dir("http");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut upstream = std::process::Command::new(mcp_python())
        .args([script(), "http", &port.to_string()])
        .env("TOOL_HEADER_SECRET", CANARY)
        .env("TOOL_LOG", dir.join("tool.log"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the HTTP tool server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let config = |var: &str| {
        format!(
            "[tools.servers.web]\nurl = \"http://127.0.0.1:{port}/mcp\"\nheaders = {{ X-Api-Key = {{ env = \"{var}\" }} }}\n\
             [[keys]]\nname = \"agent\"\nhash = \"{}\"\ntools = [\"web.*\"]\n",
            hash(AGENT)
        )
    };
    let server = Server::start(&config("TEST_HEADER"), &[("TEST_HEADER", CANARY)]);
    let r = value(
        &server,
        AGENT,
        "import tools, os\n[tools.web.add(a=1, b=2), tools.web.list_orders(customer_id=1), any('4f1c9b7e' in v for v in os.environ.values())]",
    );
    assert_eq!(r, json!([3, {"orders": [120.0, 80.5]}, false]));

    // The server goes away: calls fail at once with a message that names no address, and
    // pings tell /readyz.
    let _ = upstream.kill();
    let _ = upstream.wait();
    let r = attempt(&server, AGENT, "tools.web.add(a=1)");
    assert_eq!(r[0], "unavailable");
    assert!(!r[1].as_str().unwrap().contains("127.0.0.1"), "{r}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = server.call("GET", "/readyz", None).json();
        if ready["tools"][0]["state"] != "ready" {
            assert!(
                ready["degraded"][0].as_str().unwrap().contains("`web`"),
                "{ready}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead server still looks ready: {ready}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(server);
    let mut upstream = std::process::Command::new(mcp_python())
        .args([script(), "http", &port.to_string()])
        .env("TOOL_HEADER_SECRET", CANARY)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the HTTP tool server did not start again"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A wrong header: the tool server refuses, and airlock says so at start.
    let out = common::airlock()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg({
            let p = dir.join("bad.toml");
            std::fs::write(&p, config("TEST_HEADER")).unwrap();
            p
        })
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("TEST_HEADER", "wrong")
        .env("AIRLOCK_POOL__SIZE", "0")
        .env("AIRLOCK_TOOLS__START_TIMEOUT_MS", "5000")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tool server `web` failed to start"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("wrong"),
        "the header's value is never printed: {stderr}"
    );
    let _ = upstream.kill();
    let _ = upstream.wait();
}

#[test]
fn bad_tool_configs_are_refused_at_start() {
    let _serial = common::serial();
    let dir = scratch_dir("config");
    let serve = |config: &str| {
        let p = dir.join("airlock.toml");
        std::fs::write(&p, config).unwrap();
        let out = common::airlock()
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&p)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .env("AIRLOCK_POOL__SIZE", "0")
            .env("TEST_TOOL_CANARY", CANARY)
            .env("TEST_TOOL_LOG", dir.join("tool.log"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "started with {config}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let base = stdio_config("");
    let e = serve(&base.replace(
        "tools = [\"crm.add\", \"crm.write_note\"]",
        "tools = [\"crm.no_such_tool\"]",
    ));
    assert!(e.contains("server `crm` has no tool `no_such_tool`"), "{e}");
    let e = serve(&base.replace("tools = [\"crm.*\"]", "tools = [\"erp.*\"]"));
    assert!(e.contains("names no configured server `erp`"), "{e}");
    let e = serve(&base.replace(&mcp_python().display().to_string(), "/nonexistent/python"));
    assert!(
        e.contains("tool server `crm` failed to start") && e.contains("/nonexistent/python"),
        "{e}"
    );
    let e = serve(&base.replace("{ env = \"TEST_TOOL_CANARY\" }", "\"in clear\""));
    assert!(e.contains("TOOL_CANARY"), "{e}");
    let e = serve(&base.replace("[tools.servers.crm]", "[tools.servers.search]"));
    assert!(e.contains("module name"), "{e}");
}

#[test]
fn mcp_to_airlock_to_mcp() {
    let _serial = common::serial();
    let dir = scratch_dir("mcp");
    let server = start(&dir, "");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
    let run = |key: &str| {
        let url = format!("http://{}/mcp", server.addr);
        let out = std::process::Command::new(mcp_python())
            .args([script, "http", &url, key, "code_mode"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str::<Value>(stdout.trim())
            .unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr)))
    };
    let seen = run(AGENT);
    assert!(seen.get("failed").is_none(), "{seen:#}");
    let description = seen["tools"]["run_python"].as_str().unwrap();
    assert!(
        description.contains("tools.crm (") && description.contains("find_customer"),
        "{description}"
    );
    assert!(
        !description.contains("write_note"),
        "only what the caller may call: {description}"
    );
    let apis = seen["apis"]["content"][0]["text"].as_str().unwrap();
    assert!(
        apis.contains("def find_customer(*, customer_id: int)"),
        "{apis}"
    );
    assert_eq!(seen["run"]["is_error"], false, "{}", seen["run"]);
    let text: Vec<&str> = seen["run"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect();
    assert!(text.join("\n").contains("Grace 42.0"), "{text:?}");
    // A caller without grants is told there is nothing, and its run_python says nothing of tools.
    let none = run(NOBODY);
    assert!(!none["tools"]["run_python"]
        .as_str()
        .unwrap()
        .contains("import tools"));
    assert!(none["apis"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("No tools"));
}

#[test]
fn the_code_mode_example_joins_two_tools() {
    let _serial = common::serial();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let example = root.join("examples/code_mode");
    let config = std::fs::read_to_string(example.join("airlock.toml"))
        .unwrap()
        .replace(
            "target/mcp-client/bin/python",
            &mcp_python().display().to_string(),
        )
        .replace("examples/code_mode/", &format!("{}/", example.display()));
    let server = Server::start(
        &config,
        &[
            ("CRM_TOKEN", "crm-token"),
            ("BILLING_API_KEY", "billing-key"),
        ],
    );
    let code = std::fs::read_to_string(example.join("summary.py")).unwrap();
    let r = run(&server, "demo-key-0123456789abcdef", &code);
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["usage"]["tool_calls"], 3);
    assert_eq!(r["result"]["revenue"], 508.0);
    assert_eq!(r["result"]["top"], "Katherine Johnson");
    // The write tool needs its exact name, which the demo key lacks.
    let r = value(
        &server,
        "demo-key-0123456789abcdef",
        "import tools\nhasattr(tools.crm, 'add_note')",
    );
    assert_eq!(r, false);
}

#[test]
fn airlock_run_with_a_config_calls_tools() {
    let _serial = common::serial();
    let dir = scratch_dir("run");
    let config = dir.join("tools.toml");
    std::fs::write(
        &config,
        format!(
            "[tools.servers.crm]\ncommand = \"{}\"\nargs = [\"{}\", \"stdio\"]\n",
            mcp_python().display(),
            script()
        ),
    )
    .unwrap();
    let run = |extra: &[&str], code: &str| {
        let mut args = vec!["run", "--config", config.to_str().unwrap()];
        args.extend(extra);
        common::invoke(&args, code.as_bytes())
    };
    // Every read-only tool by default; a write tool only when named.
    let r = run(
        &["--json"],
        "import tools\n[tools.crm.add(a=1, b=2), hasattr(tools.crm, 'write_note')]",
    );
    assert_eq!(r.result(), &json!([3, false]), "{r:?}");
    assert_eq!(r.json["usage"]["tool_calls"], 1);
    let r = run(
        &["--json", "--tool", "crm.write_note"],
        "import tools\ntools.crm.write_note(text='x')",
    );
    assert_eq!(r.result(), "written", "{r:?}");
    let r = run(&["--tool", "crm.nope"], "1");
    assert_eq!(r.exit, 2);
    assert!(
        r.stderr.contains("server `crm` has no tool `nope`"),
        "{}",
        r.stderr
    );
}

#[test]
fn airlock_doctor_starts_the_tool_servers_and_checks_the_grants() {
    let _serial = common::serial();
    let dir = scratch_dir("doctor");
    let config = dir.join("airlock.toml");
    std::fs::write(&config, stdio_config("")).unwrap();
    let doctor = |env: &[(&str, &str)]| {
        let mut cmd = common::airlock();
        cmd.args(["doctor", "--config"]).arg(&config);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let log = dir.join("tool.log");
    let (code, out) = doctor(&[
        ("TEST_TOOL_CANARY", CANARY),
        ("TEST_TOOL_LOG", log.to_str().unwrap()),
    ]);
    assert!(
        out.contains("tool server      crm: stdio, 18 tools"),
        "{out}"
    );
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = doctor(&[("TEST_TOOL_LOG", log.to_str().unwrap())]);
    assert!(out.contains("[MISSING] tool server      crm: TOOL_CANARY: the environment variable TEST_TOOL_CANARY is not set"), "{out}");
    assert_eq!(code, Some(1));
}

#[test]
fn the_mcp_reference_server_is_a_tool_source() {
    let _serial = common::serial();
    let everything = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/mcp-everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        everything.exists(),
        "the MCP reference server is not installed at {}: run `bash -c '. scripts/lib.sh && \
         ensure_mcp_everything'` (scripts/test.sh does)",
        everything.display()
    );
    let node = ["/usr/bin/node", "/usr/local/bin/node"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("node is installed with the reference server");
    // Its get_env tool returns its whole environment: a tool that is not granted here.
    let config = format!(
        "[tools.servers.everything]\ncommand = \"{node}\"\nargs = [\"{}\", \"stdio\"]\n\
         env = {{ CANARY = {{ env = \"TEST_TOOL_CANARY\" }} }}\n\
         [[keys]]\nname = \"agent\"\nhash = \"{}\"\n\
         tools = [\"everything.echo\", \"everything.get-sum\", \"everything.get-tiny-image\", \"everything.get-structured-content\"]\n",
        everything.display(),
        hash(AGENT)
    );
    let server = Server::start(&config, &[("TEST_TOOL_CANARY", CANARY)]);
    let r = value(
        &server,
        AGENT,
        "import tools, os\nimage = tools.everything.get_tiny_image()\n[\n tools.everything.echo(message='héllo'),\n tools.everything.get_sum(a=2, b=3.5),\n [type(x).__name__ for x in image],\n any(isinstance(x, bytes) and x[:8] == b'\\x89PNG\\r\\n\\x1a\\n' for x in image),\n tools.everything.get_structured_content(location='New York'),\n hasattr(tools.everything, 'get_env'),\n any('4f1c9b7e' in v for v in os.environ.values()),\n]",
    );
    assert_eq!(r[0], "Echo: héllo");
    assert_eq!(r[1], "The sum of 2 and 3.5 is 5.5.");
    assert_eq!(r[2], json!(["str", "bytes", "str"]));
    assert_eq!(r[3], true);
    assert!(r[4]["temperature"].is_number(), "{}", r[4]);
    assert_eq!(r[5], false);
    assert_eq!(r[6], false);
}

#[test]
fn function_mode_and_streams_call_tools_too() {
    let _serial = common::serial();
    let dir = scratch_dir("modes");
    let server = start(&dir, "");
    // Function mode: the entrypoint calls the tools.
    let r = call(
        &server,
        AGENT,
        "POST",
        "/v1/execute",
        Some(&json!({
            "code": "import tools\ndef main(customer_id):\n    c = tools.crm.find_customer(customer_id=customer_id)\n    return {'name': c['name'], 'spent': sum(tools.crm.list_orders(customer_id=customer_id)['orders'])}",
            "entrypoint": "main",
            "inputs": {"customer_id": 1}
        })),
    )
    .json();
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["result"], json!({"name": "Ada", "spent": 200.5}));
    assert_eq!(r["usage"]["tool_calls"], 2);
    // A stream: the output as it comes, the result last with its tool calls.
    let body = json!({"code": "import tools\nprint(tools.crm.greet(name='stream'), flush=True)\ntools.crm.add(a=1)"}).to_string();
    let r = request(
        server.addr,
        "POST",
        "/v1/execute",
        &[
            ("Authorization".to_owned(), format!("Bearer {AGENT}")),
            ("Content-Type".to_owned(), "application/json".to_owned()),
            ("Accept".to_owned(), "text/event-stream".to_owned()),
        ],
        Some(body.as_bytes()),
    );
    let text = r.text();
    assert!(text.contains("hello stream"), "{text}");
    let result = text
        .split("event: result\ndata: ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("no result event: {text}"));
    let result: Value = serde_json::from_str(result).unwrap();
    assert_eq!(result["result"], 2, "{result}");
    assert_eq!(result["usage"]["tool_calls"], 2);
}
