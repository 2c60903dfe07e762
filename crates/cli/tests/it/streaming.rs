//! `Accept: text/event-stream` on `POST /v1/execute`, against the real server: output arrives
//! while the program still runs, limits and truncation hold on the stream, the result is last.

use crate::common;

use std::time::Duration;

use common::http::{EventStream, Server, SseEvent, KEY};
use common::*;
use serde_json::{json, Value};

/// `body` POSTed to `/v1/execute` for a stream of events.
fn stream(server: &Server, body: &Value) -> EventStream {
    stream_at(server, "/v1/execute", body)
}

/// `body` POSTed to `path` for a stream of events.
fn stream_at(server: &Server, path: &str, body: &Value) -> EventStream {
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nAccept: text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        server.addr,
        body.len()
    );
    EventStream::send(server.addr, &request)
}

fn running(server: &Server) -> String {
    let text = server.call("GET", "/metrics", None).text();
    text.lines()
        .find(|l| l.starts_with("airlock_running_sandboxes "))
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn output_arrives_while_the_program_runs_and_the_result_comes_last() {
    let _g = serial();
    let server = Server::start("", &[]);
    let code = "import sys, time\nprint('first')\nsys.stderr.write('oops\\n')\ntime.sleep(3)\nprint('second')\n'done'";
    let mut events = stream(&server, &json!({"code": code}));
    assert_eq!(
        (events.status, events.content_type.as_str()),
        (200, "text/event-stream")
    );
    let first = events.next().unwrap();
    assert_eq!(
        (first.name.as_str(), &first.data),
        ("stdout", &json!({"text": "first\n"}))
    );
    // The program is still sleeping: it has not finished, yet its output is here.
    assert_eq!(running(&server), "airlock_running_sandboxes 1");
    let mut seen = Vec::new();
    while let Some(event) = events.next() {
        seen.push(event);
    }
    let names: Vec<&str> = seen.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["stderr", "stdout", "result"], "{seen:?}");
    assert_eq!(seen[0].data, json!({"text": "oops\n"}));
    assert_eq!(seen[1].data, json!({"text": "second\n"}));
    let result = &seen[2].data;
    // The output came in its events: the result does not repeat it, and says so.
    assert_eq!(
        (
            &result["status"],
            &result["result"],
            &result["stdout"],
            &result["stderr"],
            &result["output_streamed"]
        ),
        (
            &json!("ok"),
            &json!("done"),
            &json!(""),
            &json!(""),
            &json!(true)
        )
    );
    assert!(result["id"].as_str().unwrap().starts_with("ex_"));
    assert_eq!(running(&server), "airlock_running_sandboxes 0");
}

/// A program silent for longer than `http.sse_keep_alive_ms` still keeps its stream busy, so
/// that a proxy's idle timeout does not cut it; the events around it are unchanged.
#[test]
fn a_silent_program_s_stream_carries_keep_alive_comments() {
    let _g = serial();
    let code = "import time\ntime.sleep(1.5)\nprint('late')";
    let server = Server::start("[http]\nsse_keep_alive_ms = 200\n", &[]);
    let mut events = stream(&server, &json!({"code": code}));
    let late = events.next().unwrap();
    assert_eq!(
        (late.name.as_str(), &late.data),
        ("stdout", &json!({"text": "late\n"}))
    );
    // 1.5 s of silence at one comment per 200 ms: some slack for the sandbox's start.
    assert!(events.comments >= 4, "{} comments", events.comments);
    let before = events.comments;
    assert_eq!(events.next().unwrap().name, "result");
    assert!(events.next().is_none());
    assert!(events.comments <= before + 1);
    drop(server);
    // The default interval (15 s) says nothing during a short silence.
    let server = Server::start("", &[]);
    let mut events = stream(&server, &json!({"code": code}));
    while events.next().is_some() {}
    assert_eq!(events.comments, 0);
}

#[test]
fn limits_and_truncation_hold_on_the_stream() {
    let _g = serial();
    let server = Server::start("", &[]);
    let body = json!({"code": "print('é' * 100)\nimport time\ntime.sleep(60)",
                      "limits": {"output_bytes": 9, "timeout_ms": 1000}});
    let mut events = stream(&server, &body);
    let mut seen = Vec::new();
    while let Some(event) = events.next() {
        seen.push(event);
    }
    let names: Vec<&str> = seen.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["stdout", "truncated", "result"], "{seen:?}");
    // Nine bytes: four whole characters; the fifth, cut, is dropped whole.
    assert_eq!(seen[0].data, json!({"text": "éééé"}));
    assert_eq!(seen[1].data, json!({"stream": "stdout", "limit": 9}));
    let result = &seen[2].data;
    assert_eq!(result["status"], "timeout", "{result}");
    assert_eq!(result["stdout_truncated"], true);
    assert_eq!(result["limits_hit"], json!(["wall_time", "output"]));
}

#[test]
fn refusals_stay_plain_errors_and_a_client_that_leaves_a_stream_kills_its_sandbox() {
    let _g = serial();
    let server = Server::start("", &[]);
    let events = stream(&server, &json!({"code": 1}));
    assert_eq!(events.status, 400);
    assert_eq!(events.content_type, "application/json");
    // A client that leaves mid-stream: its sandbox is killed, the slot freed.
    let mut events = stream(
        &server,
        &json!({"code": "print('x')\nimport time\ntime.sleep(60)"}),
    );
    assert_eq!(events.next().unwrap().name, "stdout");
    drop(events);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while running(&server) != "airlock_running_sandboxes 0" {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox outlived its client"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_session_cell_streams_too() {
    let _g = serial();
    let server = Server::start("", &[]);
    let r = server.call("POST", "/v1/sessions", Some(&json!({})));
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/sessions/{id}/execute");
    let code = "import time\nx = 7\nprint('first')\ntime.sleep(2)\nprint('second')\nx";
    let mut events = stream_at(&server, &path, &json!({"code": code}));
    assert_eq!(events.status, 200);
    let first = events.next().unwrap();
    assert_eq!(
        (first.name.as_str(), &first.data),
        ("stdout", &json!({"text": "first\n"}))
    );
    assert_eq!(running(&server), "airlock_running_sandboxes 1");
    let mut seen = Vec::new();
    while let Some(event) = events.next() {
        seen.push(event);
    }
    assert_eq!(
        (seen[0].name.as_str(), &seen[0].data),
        ("stdout", &json!({"text": "second\n"}))
    );
    let result = &seen[1].data;
    assert_eq!(seen[1].name, "result");
    assert_eq!(
        (
            &result["result"],
            &result["session_ended"],
            &result["stdout"]
        ),
        (&json!(7), &json!(false), &json!(""))
    );
    assert_eq!(result["output_streamed"], true);
    // The session goes on.
    let r = server.call("POST", &path, Some(&json!({"code": "x * 6"})));
    assert_eq!(r.json()["result"], 42);
}

/// Each byte of output reaches a streaming client once, in order, whatever it is: through
/// the stdout and stderr events, never again in the result.
#[test]
fn streaming_clients_get_each_byte_once() {
    let _g = serial();
    let server = Server::start("", &[]);
    // 600 KB of every byte value (control characters, quotes, invalid UTF-8), in writes
    // that split multi-byte characters, and a line on stderr between them.
    let code = [
        "import sys",
        "chunk = bytes(range(256)) * 40 + 'é€'.encode()",
        "for i in range(60):",
        "    sys.stdout.buffer.write(chunk[:7] if i % 7 == 0 else chunk)",
        "    sys.stdout.flush()",
        "    if i == 30:",
        "        sys.stderr.write('half\\n')",
        "        sys.stderr.flush()",
    ]
    .join("\n");
    let mut events = stream(&server, &json!({"code": code}));
    assert_eq!(events.status, 200);
    let (mut stdout, mut stderr, mut result) = (String::new(), String::new(), None);
    while let Some(SseEvent { name, data, .. }) = events.next() {
        match name.as_str() {
            "stdout" => stdout.push_str(data["text"].as_str().unwrap()),
            "stderr" => stderr.push_str(data["text"].as_str().unwrap()),
            "result" => result = Some(data),
            other => panic!("unexpected event {other}: {data}"),
        }
    }
    let mut chunk: Vec<u8> = (0..=255u8).cycle().take(256 * 40).collect();
    chunk.extend_from_slice("é€".as_bytes());
    let mut written = Vec::new();
    for i in 0..60 {
        written.extend_from_slice(if i % 7 == 0 { &chunk[..7] } else { &chunk });
    }
    assert_eq!(stdout, String::from_utf8_lossy(&written));
    assert_eq!(stderr, "half\n");
    let result = result.expect("a result event");
    assert_eq!(
        (&result["status"], &result["stdout"], &result["stderr"]),
        (&json!("ok"), &json!(""), &json!(""))
    );
    assert_eq!(result["output_streamed"], true);
}
