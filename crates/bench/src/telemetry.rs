//! `--telemetry`: what traces cost an execution (issue 50: exporting never slows or fails
//! one). The real `airlock serve`, four ways in turns: traces off; to a collector that takes
//! every batch (a sink of this process answering 200); to a closed port; to a black hole that
//! takes connections and never answers (each export waits out its 2 s timeout). Each way: one
//! client's `print(1)` back to back (p50, p90), then four clients at once (executions a
//! second), and what the server's counters say of its spans.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{median, metrics_text, ms, series, Client, Series, Server};

const MODES: [&str; 4] = ["off", "collector up", "collector down", "black hole"];
/// Back-to-back executions per turn, and the clients and seconds of the load.
const SEQUENTIAL: usize = 200;
const CLIENTS: usize = 4;
const LOAD: Duration = Duration::from_secs(5);

/// A collector that takes every batch: reads each request whole and answers 200.
fn sink(batches: Arc<AtomicU64>) -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let batches = batches.clone();
            std::thread::spawn(move || serve_batches(conn, &batches));
        }
    });
    Ok(port)
}

/// Answers each request on `conn` (kept alive) once its body is read.
fn serve_batches(mut conn: TcpStream, batches: &AtomicU64) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < end + 4 + length {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + 4 + length);
        batches.fetch_add(1, Ordering::Relaxed);
        let answer =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if conn.write_all(answer).is_err() {
            return;
        }
    }
}

/// Takes connections and never reads or answers them.
fn black_hole() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    Ok(port)
}

/// A port nothing listens on.
fn closed_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// The value of an unlabelled or labelled counter in `/metrics`.
fn metric(client: &mut Client, name: &str) -> u64 {
    metrics_text(client)
        .ok()
        .and_then(|text| series(&text, name))
        .map_or(0, |v| v as u64)
}

struct Mode {
    sequential: Series,
    rates: Vec<f64>,
    exported: u64,
    dropped: u64,
}

pub fn measure(airlock: &Path, turns: usize) -> Result<(), String> {
    let batches = Arc::new(AtomicU64::new(0));
    let endpoints = [
        None,
        Some(sink(batches.clone())?),
        Some(closed_port()?),
        Some(black_hole()?),
    ];
    let mut modes: Vec<Mode> = MODES
        .iter()
        .map(|name| Mode {
            sequential: Series::new(*name),
            rates: Vec::new(),
            exported: 0,
            dropped: 0,
        })
        .collect();
    eprintln!(
        "airlock-bench --telemetry: {turns} turns of {} modes",
        MODES.len()
    );
    for turn in 0..turns {
        for (i, port) in endpoints.iter().enumerate() {
            let state = std::env::temp_dir().join(format!(
                "airlock-bench-telemetry-{}-{turn}-{i}",
                std::process::id()
            ));
            let endpoint = port.map(|p| format!("http://127.0.0.1:{p}"));
            let env: Vec<(&str, &str)> = endpoint
                .iter()
                .map(|e| ("AIRLOCK_TELEMETRY__OTLP_ENDPOINT", e.as_str()))
                .collect();
            let server = Server::start_with(airlock, &state, &env)?;
            std::thread::sleep(Duration::from_secs(1));
            let mut client = server.connect()?;
            for _ in 0..20 {
                client.execute("print(1)", None)?;
            }
            crate::settle();
            let mode = &mut modes[i];
            for _ in 0..SEQUENTIAL {
                let t = Instant::now();
                client.execute("print(1)", None)?;
                mode.sequential.samples.push(t.elapsed());
            }
            mode.rates.push(load(&server)?);
            // The last batch is sent (or given up) within the interval and the timeout.
            std::thread::sleep(Duration::from_millis(2500));
            mode.exported += metric(&mut client, "airlock_telemetry_spans_exported_total");
            mode.dropped += ["queue_full", "export_failed"]
                .iter()
                .map(|r| {
                    metric(
                        &mut client,
                        &format!("airlock_telemetry_spans_dropped_total{{reason=\"{r}\"}}"),
                    )
                })
                .sum::<u64>();
            drop(client);
            drop(server);
            let _ = std::fs::remove_dir_all(&state);
        }
    }
    let off_p50 = modes[0].sequential.quantile(0.5);
    let off_rate = median(&modes[0].rates);
    println!(
        "traces, {turns} turns: {SEQUENTIAL} sequential `print(1)` then {CLIENTS} clients for {} s, per mode",
        LOAD.as_secs()
    );
    println!(
        "| mode | p50 ms | p90 ms | p50 / off | exec/s, {CLIENTS} clients | / off | spans exported | dropped |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for m in &modes {
        let p50 = m.sequential.quantile(0.5);
        let rate = median(&m.rates);
        println!(
            "| {} | {} | {} | {:.3} | {rate:.0} | {:.3} | {} | {} |",
            m.sequential.name,
            ms(p50),
            ms(m.sequential.quantile(0.9)),
            p50.as_secs_f64() / off_p50.as_secs_f64(),
            rate / off_rate,
            m.exported,
            m.dropped,
        );
    }
    println!(
        "the collector took {} batches",
        batches.load(Ordering::Relaxed)
    );
    Ok(())
}

/// `print(1)` from `CLIENTS` clients for `LOAD`: executions a second.
fn load(server: &Server) -> Result<f64, String> {
    let mut conns = (0..CLIENTS)
        .map(|_| server.connect())
        .collect::<Result<Vec<_>, _>>()?;
    let done = AtomicU64::new(0);
    let start = Instant::now();
    let stop = start + LOAD;
    std::thread::scope(|s| {
        for c in conns.iter_mut() {
            let done = &done;
            s.spawn(move || {
                while Instant::now() < stop {
                    if c.execute("print(1)", None).is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    Ok(done.into_inner() as f64 / start.elapsed().as_secs_f64())
}
