//! `--background MINUTES`: one real background execution of that many minutes (issue 50: a
//! run of tens of minutes, beyond the ceiling of requests answered in place, kept out of CI).
//! The code prints a numbered line every 10 s after half a second of CPU work; a follower
//! reads its events and hangs up every few minutes, coming back with `Last-Event-ID`; while it
//! runs, `print(1)` is answered in place once a second. At the end: every line arrived exactly
//! once and in order, the stored result holds them all, and what the server's memory did.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::{ms, rss_kib, Series, Server, KEY};

/// How long the follower keeps one connection before it hangs up and resumes.
const HANG_UP_EVERY: Duration = Duration::from_secs(180);

/// What the follower saw.
#[derive(Default)]
struct Followed {
    text: String,
    events: usize,
    keep_alives: usize,
    reconnects: usize,
    last: Option<serde_json::Value>,
}

/// Reads `id`'s events from `after`, for at most `budget`; `Ok(true)` once the last event
/// came.
fn follow_once(
    addr: SocketAddr,
    id: &str,
    after: &mut Option<u64>,
    budget: Duration,
    seen: &mut Followed,
) -> Result<bool, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let last = after.map_or(String::new(), |l| format!("Last-Event-ID: {l}\r\n"));
    write!(
        s,
        "GET /v1/executions/{id}/events HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n{last}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.starts_with("HTTP/1.1 ") && !line.starts_with("HTTP/1.1 200") {
            return Err(format!("events: {line}"));
        }
        if line.trim_end().is_empty() {
            break;
        }
    }
    let started = Instant::now();
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let raw: Vec<u8> = buffer.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&raw).into_owned();
            if text.starts_with(':') {
                seen.keep_alives += 1;
                continue;
            }
            let (mut event_id, mut name, mut data) = (None, "", "");
            for l in text.lines() {
                if let Some(v) = l.strip_prefix("id: ") {
                    event_id = v.parse().ok();
                } else if let Some(v) = l.strip_prefix("event: ") {
                    name = v;
                } else if let Some(v) = l.strip_prefix("data: ") {
                    data = v;
                }
            }
            let value: serde_json::Value =
                serde_json::from_str(data).map_err(|e| format!("{e}: {data}"))?;
            seen.events += 1;
            *after = event_id;
            match name {
                "stdout" => seen.text.push_str(value["text"].as_str().unwrap_or("")),
                "result" | "error" => {
                    seen.last = Some(value);
                    return Ok(true);
                }
                _ => {}
            }
        }
        if started.elapsed() > budget {
            seen.reconnects += 1;
            return Ok(false);
        }
        let mut size = String::new();
        r.read_line(&mut size).map_err(|e| e.to_string())?;
        let n = usize::from_str_radix(size.trim(), 16).map_err(|e| format!("{e}: {size:?}"))?;
        if n == 0 {
            return Ok(true);
        }
        let mut chunk = vec![0; n + 2];
        r.read_exact(&mut chunk).map_err(|e| e.to_string())?;
        buffer.extend_from_slice(&chunk[..n]);
    }
}

pub fn measure(server: &Server, minutes: u64) -> Result<(), String> {
    let lines = minutes * 6;
    let code = format!(
        "import time\n\
         start = time.monotonic()\n\
         for i in range({lines}):\n\
         \x20   t = time.monotonic()\n\
         \x20   while time.monotonic() - t < 0.5:\n\
         \x20       sum(range(1000))\n\
         \x20   print(f'line {{i}} at {{time.monotonic() - start:.1f}} s', flush=True)\n\
         \x20   time.sleep(max(0, start + 10 * (i + 1) - time.monotonic()))\n\
         {lines}"
    );
    let timeout_ms = (minutes * 60 + 120) * 1000;
    let mut client = server.connect()?;
    let rss_before = rss_kib(server.child.id()).unwrap_or(0);
    let submitted = Instant::now();
    let body = serde_json::json!({"code": code, "limits": {"timeout_ms": timeout_ms}});
    let v = client.post("/v1/executions", &body, 202)?;
    let id = v["id"].as_str().ok_or("no id")?.to_owned();
    eprintln!("airlock-bench: background execution {id}, {minutes} min, {lines} lines");

    let addr = server.addr;
    let follower_id = id.clone();
    let follower = std::thread::spawn(move || -> Result<Followed, String> {
        let mut seen = Followed::default();
        let mut after = None;
        while !follow_once(addr, &follower_id, &mut after, HANG_UP_EVERY, &mut seen)? {}
        Ok(seen)
    });
    // Requests answered in place meanwhile, once a second.
    let mut in_place = Series::new("print(1) answered in place meanwhile");
    let mut max_rss = rss_before;
    while !follower.is_finished() {
        let t = Instant::now();
        client.execute("print(1)", None)?;
        in_place.samples.push(t.elapsed());
        max_rss = max_rss.max(rss_kib(server.child.id()).unwrap_or(0));
        std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
    }
    let seen = follower.join().map_err(|_| "the follower panicked")??;
    let took = submitted.elapsed();
    let record = client.get(&format!("/v1/executions/{id}"))?;
    let expected_lines: Vec<String> = (0..lines).map(|i| format!("line {i} at ")).collect();
    let got: Vec<&str> = seen.text.lines().collect();
    let exact = got.len() == expected_lines.len()
        && got
            .iter()
            .zip(&expected_lines)
            .all(|(g, e)| g.starts_with(e.as_str()));
    let stored = record["result"]["stdout"].as_str().unwrap_or("");
    println!("## Background execution: {minutes} minutes");
    println!(
        "state: {}, status: {}, value: {}",
        record["state"], record["result"]["status"], record["result"]["result"]
    );
    println!(
        "wall: {:.1} s from submission (the code's own: {} ms), CPU: {} ms",
        took.as_secs_f64(),
        record["result"]["usage"]["wall_ms"],
        record["result"]["usage"]["cpu_ms"]
    );
    println!(
        "events: {} ({} keep-alive comments), the follower hung up and resumed {} times",
        seen.events, seen.keep_alives, seen.reconnects
    );
    println!(
        "lines: {} of {lines}, each exactly once and in order: {exact}; the stored result holds the same text: {}",
        got.len(),
        stored == seen.text
    );
    println!(
        "{}: {} requests, p50 {} p99 {}",
        in_place.name,
        in_place.samples.len(),
        ms(in_place.quantile(0.5)),
        ms(in_place.quantile(0.99))
    );
    println!(
        "server RSS: {} MiB before, at most {} MiB while it ran",
        rss_before / 1024,
        max_rss / 1024
    );
    if !exact || stored != seen.text || record["state"] != "finished" {
        return Err("the background execution did not end as it should".into());
    }
    Ok(())
}
