//! Answers, on the real server over loopback. THREAT-MODEL, "Answers": a client that asks for
//! large output and never reads the answer, or reads it a byte at a time. The memory of every
//! answer counts in its key's share until it is written out, answers are streamed from the
//! captured bytes (never built whole as escaped JSON), and slow readers are cut off.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http::{read_response, request, Server, KEY, SMALL_ANSWERS};
use common::*;
use serde_json::{json, Value};

const OTHER_KEY: &str = "other-key-0123456789abcdef";
const MIB: u64 = 1 << 20;

fn other_key_toml() -> String {
    let hash = format!("sha256:{}", airlock_api::sha256_hex(OTHER_KEY.as_bytes()));
    format!("[[keys]]\nname = \"other\"\nhash = \"{hash}\"\n")
}

/// Sends a request on `s` without reading anything back.
fn send(s: &mut TcpStream, key: &str, method: &str, path: &str, body: Option<&Value>) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    if path == "/mcp" {
        head.push_str("Accept: application/json, text/event-stream\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
}

/// A JSON-RPC call of an MCP tool.
fn tool_call(name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

/// The status code of the answer waiting on `s`, read without taking it (`peek`), once one
/// is there.
fn peek_status(s: &TcpStream, within: Duration) -> Option<u16> {
    let deadline = Instant::now() + within;
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 12];
    while Instant::now() < deadline {
        if let Ok(12) = s.peek(&mut buf) {
            return std::str::from_utf8(&buf[9..12]).ok()?.parse().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Reads what `s` holds until the server closes it; the bytes read.
fn drain(s: &mut TcpStream, within: Duration) -> Option<u64> {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(n),
            Ok(k) => n += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(n),
            Err(_) => return None,
        }
    }
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "never saw: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's RSS, sampled every 20 ms until dropped; the highest seen.
struct Peak {
    high: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Peak {
    fn watch(server: &Server) -> Peak {
        let pid = server.child.id();
        let (high, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (h, s) = (high.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                h.fetch_max(common::http::rss_of(pid), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Peak {
            high,
            stop,
            thread: Some(thread),
        }
    }

    fn high(&self) -> u64 {
        self.high.load(Ordering::SeqCst)
    }
}

impl Drop for Peak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The issue's scenario: a key asks for 64 MiB of output, writes 64 MiB of `\x01` to stdout
/// and to stderr (each would be ~400 MB once escaped as JSON), and never reads its answers.
/// Its answers hold no more than its share; further ones are refused; another key's work goes
/// on; the held connections are closed once the deadline passes, and the memory comes back.
#[test]
fn unread_answers_hold_no_more_than_their_share_and_are_cut_off() {
    let _g = serial();
    let share = 280 * MIB; // two hostile answers (131 MiB reserved each), not three
    let config = format!(
        "[http]\nmax_buffered_bytes = {}\nmax_buffered_bytes_per_key = {share}\n\
         answer_timeout_ms = 3000\nanswer_min_bytes_per_second = 65536\n\
         [concurrency]\nmax_running = 3\n{}",
        768 * MIB,
        other_key_toml()
    );
    let server = Server::start(&config, &[]);
    let peak = Peak::watch(&server);
    let quick = || {
        let t = Instant::now();
        let r = request(
            server.addr,
            "POST",
            "/v1/execute",
            &[
                ("Authorization".into(), format!("Bearer {OTHER_KEY}")),
                ("Content-Type".into(), "application/json".into()),
            ],
            Some(br#"{"code": "print(6 * 7)"}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["stdout"], "42\n");
        t.elapsed()
    };
    let usual = (0..3).map(|_| quick()).max().unwrap();

    let code = "import sys\nb = b'\\x01' * (64 << 20)\nsys.stdout.buffer.write(b)\n\
                sys.stdout.flush()\nsys.stderr.buffer.write(b)\n";
    let body = json!({"code": code, "limits": {"output_bytes": 64 * MIB, "memory_mb": 1024}});
    let mut hostile: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = server.connect_small(4096);
            send(&mut s, KEY, "POST", "/v1/execute", Some(&body));
            std::thread::sleep(Duration::from_millis(150));
            s
        })
        .collect();
    // Two fit the key's share; the others are refused at once, before running anything.
    let statuses: Vec<Option<u16>> = hostile
        .iter()
        .map(|s| peek_status(s, Duration::from_secs(60)))
        .collect();
    let mut sorted = statuses.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [Some(200), Some(200), Some(429), Some(429)],
        "{statuses:?}"
    );
    // Both answers are made and wait, unread: the key holds about its two answers.
    wait_for("no sandbox running", Duration::from_secs(60), || {
        server.metric("airlock_running_sandboxes") == 0.0
    });
    let held = server.metric("airlock_memory_held_bytes") as u64;
    assert!(
        held > 200 * MIB && held <= share,
        "{held} bytes held for two unread answers"
    );
    // Another key is served as usual meanwhile (a liveness check, with a wide margin: the
    // held answers must not stall the server).
    for _ in 0..3 {
        let took = quick();
        assert!(
            took < usual * 20 + Duration::from_secs(2),
            "took {took:?} against a usual {usual:?}"
        );
    }
    // The deadline: 3 s without taking 64 KiB a second. The connections are closed, the
    // memory given back.
    wait_for("two slow readers cut off", Duration::from_secs(30), || {
        server.metric("airlock_security_events_total{kind=\"slow_reader\"}") == 2.0
    });
    wait_for("the memory given back", Duration::from_secs(10), || {
        server.metric("airlock_memory_held_bytes") == 0.0
    });
    for (s, status) in hostile.iter_mut().zip(&statuses) {
        let read = drain(s, Duration::from_secs(20)).expect("the server closed the connection");
        if *status == Some(200) {
            assert!(read < 128 * MIB, "{read} bytes: the answer was not cut off");
        }
    }
    assert_eq!(
        server.metric("airlock_security_events_total{kind=\"answer_over_budget\"}"),
        2.0
    );
    // Everything the server held stayed within the key's share, plus what a server with
    // nothing to do holds and room for the other key's work and the allocator.
    let high = peak.high();
    eprintln!(
        "peak RSS {} MiB (share {} MiB), usual {usual:?}",
        high / MIB,
        share / MIB
    );
    assert!(
        high < share + 128 * MIB,
        "peak RSS {high} bytes against a share of {share}"
    );
    drop(peak);
    assert!(server
        .log_lines()
        .iter()
        .any(|l| l.contains("closed a connection whose client did not take its answer")));
}

/// What 8 MiB of every byte value looks like sent: U+FFFD for invalid bytes, escapes.
fn pattern(len: usize) -> Vec<u8> {
    (0..=255u8).cycle().take(len).collect()
}

const PATTERN_CODE: &str = "import sys, os\nn = int(os.environ['N'])\n\
    sys.stdout.buffer.write((bytes(range(256)) * (n // 256 + 1))[:n])\n\
    sys.stderr.write('done')\n";

/// A client that reads steadily above the minimum rate gets the whole answer, however long
/// it takes; one that takes a byte at a time is cut off.
#[test]
fn a_steady_reader_gets_its_answer_and_a_dribbling_one_is_cut_off() {
    let _g = serial();
    let server = Server::start(
        "[http]\nanswer_timeout_ms = 1000\nanswer_min_bytes_per_second = 65536\n",
        &[],
    );
    let n = 4 << 20;
    let body = json!({"code": PATTERN_CODE, "env": {"N": n.to_string()},
                      "limits": {"output_bytes": n}});
    // Steady: a read every 10 ms (of at most what a 16 KiB buffer holds), for several
    // deadlines' worth.
    let mut s = server.connect_small(16 << 10);
    send(&mut s, KEY, "POST", "/v1/execute", Some(&body));
    struct Steady(TcpStream);
    impl Read for Steady {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            std::thread::sleep(Duration::from_millis(10));
            let n = buf.len().min(32 << 10);
            self.0.read(&mut buf[..n])
        }
    }
    let started = Instant::now();
    let r = read_response(&mut Steady(s)).expect("the whole answer");
    let took = started.elapsed();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some(&*r.body.len().to_string()));
    let v = r.json();
    assert_eq!(
        v["stdout"].as_str().unwrap(),
        String::from_utf8_lossy(&pattern(n))
    );
    assert_eq!(v["stderr"], "done");
    eprintln!("{} bytes read steadily in {took:?}", r.body.len());
    assert!(
        took > Duration::from_secs(2),
        "read in {took:?}: too fast to have met the deadline"
    );
    // A byte a second: cut off.
    let mut s = server.connect_small(4096);
    send(&mut s, KEY, "POST", "/v1/execute", Some(&body));
    assert_eq!(peek_status(&s, Duration::from_secs(30)), Some(200));
    let mut byte = [0u8; 1];
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("airlock_security_events_total{kind=\"slow_reader\"}") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the dribbling reader was not cut off"
        );
        s.read_exact(&mut byte).unwrap();
        std::thread::sleep(Duration::from_secs(1));
    }
    let read = drain(&mut s, Duration::from_secs(20)).expect("closed");
    assert!(read < (10 << 20), "{read}: the answer was not cut off");
}

/// A large answer that is read arrives whole, correct, valid JSON, with its length known
/// ahead: 64 MiB of every byte value (control characters escaped, invalid bytes as U+FFFD).
#[test]
fn a_large_answer_read_arrives_whole() {
    let _g = serial();
    let server = Server::start("", &[]);
    let n = 64 << 20;
    let r = server.execute(json!({"code": PATTERN_CODE, "env": {"N": n.to_string()},
                                  "limits": {"output_bytes": n, "memory_mb": 1024}}));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("content-length"), Some(&*r.body.len().to_string()));
    let v = r.json();
    assert_eq!(v["status"], "ok", "{}", v["stderr"]);
    let expected = String::from_utf8_lossy(&pattern(n)).into_owned();
    let got = v["stdout"].as_str().unwrap();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "the output differs");
    assert_eq!(v["stdout_truncated"], false);
    eprintln!("a {} MiB answer", r.body.len() as u64 / MIB);
}

/// Answers made whole in memory count too (here evaluations answered with 1.2 MB of JSON,
/// made and not taken): one past the key's share is refused with 429, and once the unread
/// ones are cut off for not reading, the memory is back and the next one is served.
#[test]
fn other_answers_count_in_the_memory_budget() {
    let _g = serial();
    let config = format!(
        "[http]\nmax_body_bytes = 65536\nmax_buffered_bytes_per_key = {}\n\
         max_buffered_bytes = {}\nanswer_timeout_ms = 2000\n{SMALL_ANSWERS}",
        3 * MIB,
        64 * MIB
    );
    let server = Server::start(&config, &[]);
    let body = json!({"expression": "'a' * 400000"}); // its repr, str and value
    let unread: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = server.connect_small(4096);
            send(&mut s, KEY, "POST", "/v1/eval", Some(&body));
            assert_eq!(peek_status(&s, Duration::from_secs(10)), Some(200));
            s
        })
        .collect();
    let held = server.metric("airlock_memory_held_bytes");
    assert!(held >= 2.4e6, "{held} bytes held for two answers of 1.2 MB");
    // 1.2 MB more would pass the key's 3 MiB share.
    let r = server.call("POST", "/v1/eval", Some(&body));
    assert_eq!((r.status, r.error_code()), (429, "rate_limited".into()));
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("answers"));
    wait_for(
        "the unread answers cut off",
        Duration::from_secs(20),
        || server.metric("airlock_memory_held_bytes") == 0.0,
    );
    let r = server.call("POST", "/v1/eval", Some(&body));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["repr"].as_str().unwrap().len(), 400_002);
    drop(unread);
}

/// An MCP tool result is counted from the reservation its call made: its whole JSON (here
/// 1 MiB of control bytes, 6 MiB once escaped) while unread, and nothing once cut off.
#[test]
fn an_unread_mcp_answer_is_counted_until_it_is_cut_off() {
    let _g = serial();
    let server = Server::start("[http]\nanswer_timeout_ms = 2000\n", &[]);
    let call = tool_call(
        "run_python",
        json!({"code": "import sys\nsys.stdout.write(chr(1) * (1 << 20))"}),
    );
    let mut s = server.connect_small(4096);
    send(&mut s, KEY, "POST", "/mcp", Some(&call));
    assert_eq!(peek_status(&s, Duration::from_secs(30)), Some(200));
    let held = server.metric("airlock_memory_held_bytes");
    assert!(held >= 6e6, "{held} bytes held for a 6 MiB answer");
    wait_for("the unread answer cut off", Duration::from_secs(20), || {
        server.metric("airlock_memory_held_bytes") == 0.0
    });
    assert!(drain(&mut s, Duration::from_secs(10)).expect("closed") < 6 << 20);
}

/// The same over server-sent events (a call with a progress token that outlasts the
/// interval): the stream holds the result's reservation until it is written or cut off.
#[test]
fn an_unread_mcp_answer_sent_as_events_is_counted_until_it_is_cut_off() {
    let _g = serial();
    let server = Server::start(
        "[http]\nanswer_timeout_ms = 2000\n[mcp]\nprogress_interval_ms = 500\n",
        &[],
    );
    let mut call = tool_call(
        "run_python",
        json!({"code": "import sys, time\ntime.sleep(1.5)\nsys.stdout.write(chr(1) * (1 << 20))"}),
    );
    call["params"]["_meta"] = json!({"progressToken": 1});
    let mut s = server.connect_small(4096);
    send(&mut s, KEY, "POST", "/mcp", Some(&call));
    assert_eq!(peek_status(&s, Duration::from_secs(30)), Some(200));
    server.wait_running(0);
    let held = server.metric("airlock_memory_held_bytes");
    assert!(held >= 6e6, "{held} bytes held for a 6 MiB answer");
    wait_for("the unread answer cut off", Duration::from_secs(20), || {
        server.metric("airlock_memory_held_bytes") == 0.0
    });
    assert!(drain(&mut s, Duration::from_secs(10)).expect("closed") < 6 << 20);
}

/// A stream whose program is silent for longer than the deadline owes nothing meanwhile: the
/// client, reading all the while, is not cut off.
#[test]
fn a_stream_waiting_for_its_program_is_not_cut_off() {
    let _g = serial();
    let server = Server::start("[http]\nanswer_timeout_ms = 500\n", &[]);
    let code = "import time\nprint('a', flush=True)\ntime.sleep(3)\nprint('b')";
    let body = json!({"code": code}).to_string();
    let mut s = server.connect();
    write!(
        s,
        "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    assert!(all.contains("event: result"), "{all}");
    assert!(all.contains(r#"{"text":"b\n"}"#), "{all}");
    assert_eq!(
        server.metric("airlock_security_events_total{kind=\"slow_reader\"}"),
        0.0
    );
}

/// An answer that could never fit the key's share is refused at once, saying what to change,
/// rather than waiting for room that cannot come: here cells of 64 MiB of output, over MCP
/// (whose answers are built whole).
#[test]
fn an_answer_that_could_never_fit_is_refused_with_what_to_change() {
    let _g = serial();
    let server = Server::start("", &[]);
    let r = server.call(
        "POST",
        "/v1/sessions",
        Some(&json!({"limits": {"output_bytes": 64 * MIB}})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let call = tool_call("run_in_session", json!({"session_id": id, "code": "1"}));
    let mut s = server.connect();
    send(&mut s, KEY, "POST", "/mcp", Some(&call));
    let r = read_response(&mut s).expect("an answer");
    let result = &r.json()["result"];
    assert_eq!(result["isError"], true, "{result}");
    assert!(
        result
            .to_string()
            .contains("http.max_buffered_bytes_per_key"),
        "{result}"
    );
    // Over REST the same cell fits (its answer is streamed, not built whole).
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(&json!({"code": "1"})),
    );
    assert_eq!(r.json()["result"], 1, "{}", r.text());
}
