//! `--rss ANSWERS`: what the server's memory does after large answers (issue 68). Half the
//! answers are answered in place (`POST /v1/execute`, three clients at once), half run in the
//! background (`POST /v1/executions`, all submitted at once, each result fetched whole once
//! it ended, then deleted); each prints 10 MB. The server's RSS at the start, at most while
//! they ran, after the answers, after the deletes, and again after some idle seconds: what the
//! allocator gives back and when.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::snapshots::call;
use crate::{mib, rss_kib, Server};

/// The output of each answer.
const OUTPUT: usize = 10_000_000;
/// Clients answered in place at once.
const IN_PLACE_CLIENTS: usize = 3;
/// How long the server is left idle before the last reading.
const IDLE: Duration = Duration::from_secs(10);

/// The server's RSS (KiB) at each step.
struct Readings {
    start: u64,
    peak: u64,
    answered: u64,
    deleted: u64,
    idle: u64,
}

pub fn measure(server: &Server, answers: usize) -> Result<(), String> {
    let pid = server.child.id();
    let rss = || rss_kib(pid).ok_or_else(|| format!("no VmRSS for {pid}"));
    let code = format!("import sys\nsys.stdout.write('x' * {OUTPUT})");
    let in_place = answers / 2;
    let background = answers - in_place;
    let start = rss()?;
    let peak = AtomicU64::new(start);
    let done = AtomicBool::new(false);
    let took = Instant::now();
    let ids = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid).unwrap_or(0), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let answered = answer_in_place(server, &code, in_place)
            .and_then(|()| run_in_background(server, &code, background));
        done.store(true, Ordering::Relaxed);
        answered
    })?;
    let took = took.elapsed();
    let answered = rss()?;
    let mut client = server.connect()?;
    for id in &ids {
        let (status, v) = call(&mut client, "DELETE", &format!("/v1/executions/{id}"), None)?;
        if status != 200 {
            return Err(format!("DELETE {id}: {status} {v}"));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let deleted = rss()?;
    // An allocator that gives memory back after a delay does it on its own clock, or on
    // the next allocations: a few small requests meanwhile, as a server idling has.
    let idle_until = Instant::now() + IDLE;
    while Instant::now() < idle_until {
        client.execute("print(1)", None)?;
        std::thread::sleep(Duration::from_millis(500));
    }
    let idle = rss()?;
    report(
        answers,
        (in_place, background),
        took,
        &Readings {
            start,
            peak: peak.into_inner(),
            answered,
            deleted,
            idle,
        },
    );
    Ok(())
}

/// `n` executions answered in place, from `IN_PLACE_CLIENTS` clients at once.
fn answer_in_place(server: &Server, code: &str, n: usize) -> Result<(), String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..IN_PLACE_CLIENTS)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    let mut client = server.connect()?;
                    while next.fetch_add(1, Ordering::Relaxed) < n {
                        let v = client.execute(code, Some(OUTPUT))?;
                        check_output(&v)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| "a client panicked".to_owned())?)
    })
}

/// `n` background executions submitted at once, each result fetched whole once it ended;
/// their ids.
fn run_in_background(server: &Server, code: &str, n: usize) -> Result<Vec<String>, String> {
    let mut client = server.connect()?;
    let body = json!({"code": code, "limits": {"output_bytes": OUTPUT}});
    let ids: Vec<String> = (0..n)
        .map(|_| {
            let v = client.post("/v1/executions", &body, 202)?;
            v["id"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("no id in {v}"))
        })
        .collect::<Result<_, _>>()?;
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, v) = call(&mut client, "GET", &format!("/v1/executions/{id}"), None)?;
            if status != 200 {
                return Err(format!("GET {id}: {status} {v}"));
            }
            match v["state"].as_str() {
                Some("queued" | "running") if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Some("finished") => {
                    check_output(&v["result"])?;
                    break;
                }
                _ => return Err(format!("{id} did not finish: {}", v["state"])),
            }
        }
    }
    Ok(ids)
}

fn check_output(result: &serde_json::Value) -> Result<(), String> {
    match result["stdout"].as_str().map(str::len) {
        Some(OUTPUT) => Ok(()),
        other => Err(format!("an answer with {other:?} bytes of output")),
    }
}

fn report(answers: usize, (in_place, background): (usize, usize), took: Duration, r: &Readings) {
    let grown = |kib: u64| mib(kib) - mib(r.start);
    println!("## The server's memory after {answers} large answers\n");
    println!(
        "{in_place} answered in place ({IN_PLACE_CLIENTS} clients at once) and {background} in the background (fetched whole, then deleted), each printing {} MB, in {:.1} s. The server's RSS:\n",
        OUTPUT / 1_000_000,
        took.as_secs_f64()
    );
    println!("| when | RSS MiB | grown MiB |\n|---|---:|---:|");
    for (when, kib) in [
        ("at the start (pool full, after warm-up)", r.start),
        ("at most while they ran", r.peak),
        ("after the answers", r.answered),
        ("after the deletes", r.deleted),
        (
            &format!("{} s later, a small request every 0.5 s", IDLE.as_secs()) as &str,
            r.idle,
        ),
    ] {
        println!("| {when} | {:.1} | {:+.1} |", mib(kib), grown(kib));
    }
}
