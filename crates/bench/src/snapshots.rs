//! `--snapshots`: sessions paused, brought back and forked (issue 48's targets): a session
//! holding a 10 MB DataFrame, one holding 1 GB of state, and many paused sessions at once
//! (the server's memory for each, then all of them brought back in a shuffled order). The
//! baseline in the same run: a fresh session's first cell.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{rss_kib, Client, Series, Server, KEY};

/// A 10 MB DataFrame (1,310,720 random floats) and a few things beside it.
const TEN_MB: &str = "import numpy as np, pandas as pd\n\
df = pd.DataFrame({'a': np.random.default_rng(1).random(1_310_720)})\n\
x = 42\n\
def f(n):\n    return n + x\n\
'ready'";

/// 1 GiB of random floats (they compress to nothing less).
const ONE_GB: &str = "import numpy as np\n\
big = np.random.default_rng(2).random(134_217_728)\n\
'ready'";

pub(crate) fn call(
    client: &mut Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (status, text) = client.call(head.as_bytes(), body.as_bytes())?;
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&text).map_err(|e| format!("{path}: {e}"))?
    };
    Ok((status, v))
}

fn expect(got: (u16, Value), want: u16, what: &str) -> Result<Value, String> {
    if got.0 != want {
        return Err(format!("{what}: {} {}", got.0, got.1));
    }
    Ok(got.1)
}

/// `POST /v1/sessions/{id}/{what}`, answered `want`.
fn act(client: &mut Client, id: &str, what: &str, want: u16, label: &str) -> Result<Value, String> {
    expect(
        call(client, "POST", &format!("/v1/sessions/{id}/{what}"), None)?,
        want,
        label,
    )
}

fn open(client: &mut Client, body: Value) -> Result<String, String> {
    let v = expect(
        call(client, "POST", "/v1/sessions", Some(&body))?,
        201,
        "open",
    )?;
    v["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no id: {v}"))
}

fn cell(client: &mut Client, id: &str, code: &str) -> Result<Value, String> {
    let v = expect(
        call(
            client,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(&json!({"code": code})),
        )?,
        200,
        "cell",
    )?;
    if v["status"] != "ok" {
        return Err(format!("cell: {v}"));
    }
    Ok(v)
}

fn timed<T>(f: impl FnOnce() -> Result<T, String>) -> Result<(T, Duration), String> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed()))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn line(s: &Series) -> String {
    format!(
        "| {} | {:.1} ms | {:.1} ms | {} |",
        s.name,
        ms(s.quantile(0.5)),
        ms(s.quantile(0.95)),
        s.samples.len()
    )
}

/// The whole series; `paused` sessions for the many-paused figure (0: left out).
pub fn measure(server: &Server, rounds: usize, paused: usize, one_gb: bool) -> Result<(), String> {
    let mut client = server.connect()?;
    let mut fresh = Series::new("fresh session + first cell (baseline)");
    let mut pause = Series::new("pause, 10 MB DataFrame");
    let mut resume = Series::new("resume: first cell's answer after a pause");
    let mut fork = Series::new("fork, 10 MB DataFrame (open session)");
    let mut stored = 0u64;
    for _ in 0..rounds {
        let (id, t) = timed(|| {
            let id = open(&mut client, json!({}))?;
            cell(&mut client, &id, "1")?;
            Ok(id)
        })?;
        fresh.samples.push(t);
        call(&mut client, "DELETE", &format!("/v1/sessions/{id}"), None)?;

        let id = open(&mut client, json!({}))?;
        cell(&mut client, &id, TEN_MB)?;
        let (v, t) = timed(|| act(&mut client, &id, "pause", 200, "pause"))?;
        pause.samples.push(t);
        stored = v["paused"]["stored_bytes"].as_u64().unwrap_or(0);
        let (v, t) = timed(|| cell(&mut client, &id, "[len(df), f(1)]"))?;
        if v["result"] != json!([1_310_720, 43]) {
            return Err(format!("resumed wrongly: {v}"));
        }
        resume.samples.push(t);
        let (v, t) = timed(|| act(&mut client, &id, "fork", 201, "fork"))?;
        fork.samples.push(t);
        let forked = v["id"].as_str().unwrap_or_default().to_owned();
        call(
            &mut client,
            "DELETE",
            &format!("/v1/sessions/{forked}"),
            None,
        )?;
        call(&mut client, "DELETE", &format!("/v1/sessions/{id}"), None)?;
    }
    println!("### Sessions paused, resumed and forked ({rounds} rounds)\n");
    println!("| series | p50 | p95 | n |\n|---|---|---|---|");
    for s in [&fresh, &pause, &resume, &fork] {
        println!("{}", line(s));
    }
    println!(
        "\nThe 10 MB DataFrame's snapshot: {:.1} MiB on disk.\n",
        stored as f64 / (1 << 20) as f64
    );

    if one_gb {
        let id = open(
            &mut client,
            json!({"limits": {"memory_mb": 4096, "timeout_ms": 120000}}),
        )?;
        cell(&mut client, &id, ONE_GB)?;
        let (v, t_pause) = timed(|| act(&mut client, &id, "pause", 200, "pause 1 GB"))?;
        let state = v["paused"]["state_bytes"].as_u64().unwrap_or(0);
        let (_, t_resume) = timed(|| cell(&mut client, &id, "big.size"))?;
        call(&mut client, "DELETE", &format!("/v1/sessions/{id}"), None)?;
        println!(
            "1 GB of state ({:.2} GiB as written): pause {:.2} s, resume (first cell's answer) {:.2} s\n",
            state as f64 / (1u64 << 30) as f64,
            t_pause.as_secs_f64(),
            t_resume.as_secs_f64()
        );
    }

    if paused > 0 {
        many_paused(server, paused)?;
    }
    Ok(())
}

/// `n` sessions paused at once: the server's memory for each, then each brought back, in a
/// shuffled order, by eight clients.
fn many_paused(server: &Server, n: usize) -> Result<(), String> {
    let clients = 8;
    let before = rss_kib(server.child.id()).unwrap_or(0);
    let started = Instant::now();
    let ids = std::sync::Mutex::new(Vec::with_capacity(n));
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| -> Result<(), String> {
        let mut handles = Vec::new();
        for _ in 0..clients {
            handles.push(scope.spawn(|| -> Result<(), String> {
                let mut client = server.connect()?;
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                    let id = open(&mut client, json!({}))?;
                    cell(&mut client, &id, "import os\nmine = os.urandom(16).hex()")?;
                    act(&mut client, &id, "pause", 200, "pause")?;
                    ids.lock().unwrap().push(id);
                }
                Ok(())
            }));
        }
        for h in handles {
            h.join().map_err(|_| "a client panicked".to_string())??;
        }
        Ok(())
    })?;
    let made = started.elapsed();
    // The reaper and the allocator settle.
    std::thread::sleep(Duration::from_secs(2));
    let after = rss_kib(server.child.id()).unwrap_or(0);
    let mut ids = ids.into_inner().unwrap();
    // A shuffle from a fixed seed (xorshift): any order, the same each run.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..ids.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ids.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    let started = Instant::now();
    let queue = std::sync::Mutex::new(ids);
    let resumed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| -> Result<(), String> {
        let mut handles = Vec::new();
        for _ in 0..clients {
            handles.push(scope.spawn(|| -> Result<(), String> {
                let mut client = server.connect()?;
                loop {
                    let Some(id) = queue.lock().unwrap().pop() else {
                        return Ok(());
                    };
                    let v = cell(&mut client, &id, "len(mine)")?;
                    if v["result"] != 32 || v["resumed"].is_null() {
                        return Err(format!("{id} came back wrongly: {v}"));
                    }
                    call(&mut client, "DELETE", &format!("/v1/sessions/{id}"), None)?;
                    resumed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }));
        }
        for h in handles {
            h.join().map_err(|_| "a client panicked".to_string())??;
        }
        Ok(())
    })?;
    let back = started.elapsed();
    let per = (after.saturating_sub(before) as f64 * 1024.0) / n as f64;
    println!(
        "{n} sessions paused at once ({:.0} s to make and pause with {clients} clients): the \
         server's resident memory grew by {} KiB, {per:.0} bytes per paused session; all {} \
         brought back in a shuffled order in {:.0} s ({:.1} per second)\n",
        made.as_secs_f64(),
        after.saturating_sub(before),
        resumed.load(std::sync::atomic::Ordering::Relaxed),
        back.as_secs_f64(),
        n as f64 / back.as_secs_f64()
    );
    Ok(())
}
