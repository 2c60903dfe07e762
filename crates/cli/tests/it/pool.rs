//! The warm pool, through the real `airlock serve`: pooled sandboxes are the same sandboxes,
//! each serves one execution, nothing of one reaches the next, and the pool's state shows.
//! With zygotes on, these keep no children of the preloading zygote (`preloaded = 0`), so
//! that they count the lean pool's sandboxes alone; `zygote.rs` tests those.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::http::{request, Server, KEY};
use common::*;
use serde_json::{json, Value};

fn pool_status(server: &Server) -> Value {
    server.call("GET", "/readyz", None).json()["pool"].clone()
}

/// Waits until the pool holds at least `n` idle sandboxes.
fn wait_idle(server: &Server, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pool = pool_status(server);
        if pool["idle"].as_u64() >= Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never had {n} idle: {pool}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_pooled_sandbox_is_the_same_sandbox_as_a_cold_one() {
    let _g = serial();
    let cold = run_unlocked(SANDBOX_PROBE, &[]);
    assert_eq!(cold.status(), "ok", "{cold:#?}");

    let server = Server::start("[zygote]\n[pool]\npreloaded = 0\nsize = 1\n", &[]);
    wait_idle(&server, 1);
    let takes = server.metric("airlock_pool_takes_total");
    let r = server.execute(json!({"code": SANDBOX_PROBE}));
    assert_eq!(r.status, 200, "{}", r.text());
    let pooled = r.json();
    assert_eq!(server.metric("airlock_pool_takes_total"), takes + 1.0);
    assert_eq!(pooled["status"], "ok", "{pooled}");

    let seen = |v: &Value| -> Value { serde_json::from_str(v.as_str().unwrap()).unwrap() };
    let (cold_seen, pooled_seen) = (seen(&cold.json["stdout"]), seen(&pooled["stdout"]));
    // Field by field, for a readable failure.
    for (field, value) in cold_seen.as_object().unwrap() {
        assert_eq!(
            &pooled_seen[field], value,
            "{field} differs between a pooled and a cold sandbox"
        );
    }
    assert_eq!(cold_seen, pooled_seen);
    assert_eq!(
        cold_seen["write_usr"],
        json!(nix::errno::Errno::EROFS as i32)
    );
    assert_ne!(cold_seen["network"], "allowed");
    assert_eq!(pooled["isolation"], cold.json["isolation"]);
    assert_eq!(pooled["isolation"]["seccomp"], "enforced");
    drop(server);
}

#[test]
fn nothing_of_one_execution_reaches_the_next() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start(
        "[zygote]\n[pool]\npreloaded = 0\nsize = 1\nmax_size = 1\nworkers = 1\n",
        &[],
    );
    // Each run looks for what earlier runs left, then leaves all it can: files in every
    // writable place, a module attribute, an environment variable, a process that outlives
    // the program, and a SysV shared memory segment.
    let code = r#"
import ctypes, json, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
# A segment under a fixed key: creating it exclusively fails (EEXIST) if an earlier run made it.
made = libc.shmget(0x5EED, 4096, 0o1000 | 0o2000 | 0o600)
found = {
    'files': sorted(os.listdir('/tmp') + os.listdir('/work') + os.listdir('/dev/shm')),
    'module': getattr(json, 'planted', None),
    'env': os.environ.get('PLANTED'),
    'pids': sorted(p for p in os.listdir('/proc') if p.isdigit()),
    'shm': 'made' if made >= 0 else os.strerror(ctypes.get_errno()),
}
for d in ['/tmp', '/work', '/dev/shm']:
    open(d + '/planted', 'w').write('x')
json.planted = True
os.environ['PLANTED'] = '1'
subprocess.Popen(['/usr/bin/python3', '-c', 'import os, time\nos.setsid()\ntime.sleep(60)'],
                 start_new_session=True)
time.sleep(0.2)
found
"#;
    let runs = 5;
    // Counted from here: the server's start-up trial may have taken one.
    let takes = pool_status(&server)["takes"].as_u64().unwrap();
    for i in 0..runs {
        wait_idle(&server, 1);
        let r = server.execute(json!({"code": code}));
        assert_eq!(r.status, 200, "{}", r.text());
        let body = r.json();
        assert_eq!(body["status"], "ok", "run {i}: {body}");
        assert_eq!(
            body["result"],
            json!({"files": [], "module": null, "env": null, "pids": ["1", "2"], "shm": "made"}),
            "run {i} saw what an earlier run left"
        );
    }
    // Read once the last take's replacement is ready: a refill counts when it is made.
    wait_idle(&server, 1);
    let pool = pool_status(&server);
    assert_eq!(pool["takes"].as_u64().unwrap() - takes, runs, "{pool}");
    // Every take was replaced by a new sandbox: none ever went back.
    assert!(pool["refills"].as_u64().unwrap() > runs, "{pool}");
    // Used sandboxes are gone while the server runs (their cgroups are removed in the
    // background): what is left is the one idle sandbox.
    // Zygotes' own cgroups (`airlock-<pid>-zygote-<n>`) live as long as the server.
    let names = |dirs: &[std::path::PathBuf]| {
        dirs.iter()
            .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
            .filter(|n| !n.contains("-zygote-"))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while names(&sandbox_cgroups()) != names(before.sandbox_cgroups()) + 1 {
        assert!(Instant::now() < deadline, "{:?}", sandbox_cgroups());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after the pool's server stopped");
}

#[test]
fn the_clock_starts_when_the_work_is_handed_over() {
    let _g = serial();
    let server = Server::start(
        "[pool]\nsize = 1\n[engine.defaults]\ntimeout_ms = 1000\n",
        &[],
    );
    wait_idle(&server, 1);
    // Counted from here: the server's start-up trial may have taken one.
    let takes = |server: &Server| pool_status(server)["takes"].as_u64().unwrap();
    let before = takes(&server);
    // Idle for longer than the timeout: the sandbox still gets all of it.
    std::thread::sleep(Duration::from_millis(1500));
    let r = server
        .execute(json!({"code": "import time\ntime.sleep(0.6)\n'done'"}))
        .json();
    assert_eq!(
        (&r["status"], &r["result"]),
        (&json!("ok"), &json!("done")),
        "{r}"
    );
    assert_eq!(takes(&server), before + 1);
    // And it is enforced from there.
    wait_idle(&server, 1);
    let r = server
        .execute(json!({"code": "import time\ntime.sleep(5)"}))
        .json();
    assert_eq!(r["status"], "timeout", "{r}");
    // Killed a full timeout after the take, not at once for having sat idle past it.
    assert!(r["usage"]["wall_ms"].as_u64().unwrap() >= 1000, "{r}");
    assert_eq!(takes(&server), before + 2);
    // A longer timeout of its own is still served from the pool: only the host keeps time.
    wait_idle(&server, 1);
    let r = server
        .execute(json!({"code": "import time\ntime.sleep(1.2)\n1", "limits": {"timeout_ms": 3000}}))
        .json();
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(takes(&server), before + 3);
    drop(server);
}

/// `n` executions of `seconds` of sleep at once, each on its own connection: more than the
/// pool holds find it empty.
fn at_once(server: &Server, n: usize, seconds: f64) {
    let addr = server.addr;
    std::thread::scope(|s| {
        for _ in 0..n {
            s.spawn(move || {
                let body = json!({"code": format!("import time\ntime.sleep({seconds})\n1")});
                let headers = [
                    ("Authorization".to_owned(), format!("Bearer {KEY}")),
                    ("Content-Type".to_owned(), "application/json".to_owned()),
                ];
                let r = request(
                    addr,
                    "POST",
                    "/v1/execute",
                    &headers,
                    Some(body.to_string().as_bytes()),
                );
                assert_eq!(r.json()["status"], "ok", "{}", r.json());
            });
        }
    });
}

/// Three executions at once against a pool of one that waits `wait_ms` for a refill (and
/// `more` configuration): how much each of the pool's counters grew, and how many sandboxes
/// were made on the spot.
fn three_against_one(wait_ms: u64, more: &str) -> (impl Fn(&str) -> u64, u64) {
    let server = Server::start(
        &format!("[pool]\nsize = 1\nmax_size = 1\nwait_for_refill_ms = {wait_ms}\n{more}"),
        &[],
    );
    wait_idle(&server, 1);
    let made = server.metric("airlock_sandbox_made_duration_seconds_count");
    let before = pool_status(&server);
    at_once(&server, 3, 0.5);
    let after = pool_status(&server);
    assert_eq!(
        server.metric("airlock_pool_waits_total"),
        after["waits"].as_f64().unwrap()
    );
    let made = (server.metric("airlock_sandbox_made_duration_seconds_count") - made) as u64;
    drop(server);
    let grew = move |field: &str| {
        let (was, is) = (&before[field], &after[field]);
        is.as_u64().unwrap() - was.as_u64().unwrap()
    };
    (grew, made)
}

#[test]
fn an_execution_that_finds_the_pool_empty_gets_the_sandbox_a_refill_is_making_for_it() {
    let _g = serial();
    // A wait longer than any refill here, and a pool of one: one refill under way at a time.
    // The first takes the idle sandbox, the second waits for the refill's; the third makes
    // its own if it finds that one waited for, or, come once the refill is done, takes its
    // sandbox or waits for the next: never more waiting than refills under way, none made
    // but by a miss.
    let (grew, made) = three_against_one(10_000, "");
    assert!(grew("waits") >= 1);
    assert!(grew("takes") > grew("waits"));
    assert_eq!(grew("takes") + grew("misses_empty"), 3);
    assert!(grew("misses_empty") <= 1);
    assert_eq!(made, grew("misses_empty"));
    // A refill of a cold sandbox (zygotes off: 15-25 ms here) outlasts the three requests'
    // coming (a millisecond or two apart): the third finds the one refill waited for.
    let (grew, made) = three_against_one(10_000, "[zygote]\nenabled = false\n");
    assert_eq!(
        (grew("takes"), grew("waits"), grew("misses_empty"), made),
        (2, 1, 1, 1)
    );
    // Without the wait, those that find it empty make their own.
    let (grew, made) = three_against_one(0, "");
    assert_eq!(grew("waits"), 0);
    assert!(grew("misses_empty") >= 1);
    assert_eq!(made, grew("misses_empty"));
}

#[test]
fn the_pool_shows_in_metrics_and_readiness_and_goes_with_the_server() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start(
        "[pool]\nsize = 2\nmax_size = 4\nshrink_after_ms = 1500\nwait_for_refill_ms = 0\n",
        &[],
    );
    wait_idle(&server, 2);
    assert!(server.metric("airlock_pool_idle_sandboxes") >= 2.0);
    let pool = pool_status(&server);
    assert_eq!((&pool["size"], &pool["max_size"]), (&json!(2), &json!(4)));
    let takes = server.metric("airlock_pool_takes_total");
    let refills = server.metric("airlock_pool_refills_total");
    let (started, made) = (
        server.metric("airlock_sandbox_start_duration_seconds_count"),
        server.metric("airlock_sandbox_made_duration_seconds_count"),
    );

    let r = server.execute(json!({"code": "1"})).json();
    assert_eq!(r["status"], "ok");
    assert_eq!(server.metric("airlock_pool_takes_total"), takes + 1.0);
    // Every start is timed; only those that found no pooled sandbox as made on the spot.
    assert_eq!(
        server.metric("airlock_sandbox_start_duration_seconds_count"),
        started + 1.0
    );
    assert_eq!(
        server.metric("airlock_sandbox_made_duration_seconds_count"),
        made
    );
    // Other limits than the pool's: a cold sandbox, counted as a miss.
    let misses = server.metric("airlock_pool_misses_total{reason=\"limits\"}");
    let r = server
        .execute(json!({"code": "1", "limits": {"memory_mb": 128}}))
        .json();
    assert_eq!(
        (&r["status"], &r["limits"]["memory_mb"]),
        (&json!("ok"), &json!(128))
    );
    assert_eq!(
        server.metric("airlock_pool_misses_total{reason=\"limits\"}"),
        misses + 1.0
    );
    assert_eq!(server.metric("airlock_pool_takes_total"), takes + 1.0);
    assert_eq!(
        server.metric("airlock_sandbox_made_duration_seconds_count"),
        made + 1.0
    );
    // The log says which executions ran in a pooled sandbox (its lines are read as they
    // come: waited for).
    for pooled in ["pooled=true", "pooled=false"] {
        let lines = server.wait_log_lines(pooled, 1);
        assert!(!lines.is_empty(), "no {pooled}: {:#?}", server.log_lines());
    }
    wait_idle(&server, 2);
    // A refill runs on its own: the pool may show two idle (it had more) before it counts.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("airlock_pool_refills_total") <= refills {
        assert!(Instant::now() < deadline, "the pool never refilled");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.metric("airlock_pool_in_use_sandboxes"), 0.0);
    assert_eq!(server.metric("airlock_pool_failures_total"), 0.0);
    // Demand: executions that find the pool empty raise what it keeps ready, up to max_size.
    let target = pool_status(&server)["target"].as_u64().unwrap();
    at_once(&server, 6, 0.3);
    let pool = pool_status(&server);
    assert!(pool["misses_empty"].as_u64().unwrap() > 0, "{pool}");
    assert!(pool["target"].as_u64().unwrap() > target, "{pool}");
    assert!(pool["target"].as_u64().unwrap() <= 4, "{pool}");
    wait_idle(&server, pool["target"].as_u64().unwrap());
    // Without such misses the pool shrinks back to its size, destroying what is too many.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pool = pool_status(&server);
        if pool["target"] == 2 && pool["idle"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the pool never shrank: {pool}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.metric("airlock_pool_idle_sandboxes"), 2.0);
    // Idle sandboxes are real sandboxes on the host, until the server stops.
    assert!(sandbox_cgroups().len() >= before.sandbox_cgroups().len() + 2);
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after the server stopped");
}

/// The CPU weight of each sandbox of the server `pid` that holds processes: (cgroup, value)
/// for v1's `cpu.shares` or v2's `cpu.weight`.
fn sandbox_cpu_weights(pid: u32) -> Vec<(String, String)> {
    let prefix = format!("airlock-{pid}-");
    let mut found = Vec::new();
    let mut dirs = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains("-zygote-") {
                continue;
            }
            if !name.starts_with(&prefix) {
                if depth < 6 {
                    dirs.push((path, depth + 1));
                }
                continue;
            }
            // A cgroup the init has not joined yet may not have its weight yet.
            let procs = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
            for file in ["cpu.shares", "cpu.weight"] {
                if let Ok(v) = std::fs::read_to_string(path.join(file)) {
                    if !procs.trim().is_empty() {
                        found.push((name.clone(), v.trim().to_owned()));
                    }
                }
            }
        }
    }
    found.sort();
    found
}

#[test]
fn pooled_sandboxes_wait_at_the_lowest_cpu_weight_and_run_at_the_default() {
    let _g = serial();
    let server = Server::start(
        "[zygote]\n[pool]\npreloaded = 0\nsize = 2\nmax_size = 2\n",
        &[],
    );
    wait_idle(&server, 2);
    let pid = server.child.id();
    let (background, default) = if Path::new("/sys/fs/cgroup/cpu/cpu.shares").exists() {
        ("2", "1024")
    } else {
        ("1", "100")
    };
    let idle = sandbox_cpu_weights(pid);
    assert_eq!(idle.len(), 2, "{idle:?}");
    assert!(idle.iter().all(|(_, w)| w == background), "{idle:?}");

    let running = std::thread::scope(|s| {
        let addr = server.addr;
        let job = s.spawn(move || {
            let headers = [
                ("Authorization".to_owned(), format!("Bearer {KEY}")),
                ("Content-Type".to_owned(), "application/json".to_owned()),
            ];
            let body = json!({"code": "import time\ntime.sleep(1.5)\n'slept'"}).to_string();
            request(addr, "POST", "/v1/execute", &headers, Some(body.as_bytes())).json()
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool_status(&server)["in_use"] != 1 {
            assert!(Instant::now() < deadline, "{}", pool_status(&server));
            std::thread::sleep(Duration::from_millis(10));
        }
        let weights = sandbox_cpu_weights(pid);
        let r = job.join().unwrap();
        assert_eq!(
            (&r["status"], &r["result"]),
            (&json!("ok"), &json!("slept"))
        );
        weights
    });
    // The one running someone's code has the default weight, the waiting ones the lowest.
    let at_default: Vec<_> = running.iter().filter(|(_, w)| w == default).collect();
    assert_eq!(at_default.len(), 1, "{running:?}");
    assert!(
        running.iter().all(|(_, w)| w == default || w == background),
        "{running:?}"
    );
    assert!(running.len() >= 2, "{running:?}");
    drop(server);
}

#[test]
fn a_pooled_sandbox_that_died_idle_is_never_handed_out() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start(
        "[zygote]\n[pool]\npreloaded = 0\nsize = 1\nmax_size = 1\nworkers = 1\n",
        &[],
    );
    wait_idle(&server, 1);
    // Kill the waiting interpreter of the idle sandbox, as an OOM kill or an operator might.
    let mut killed = 0;
    for p in sandbox_processes() {
        if p.contains("python3") && p.trim_end().ends_with("warm") {
            let pid: i32 = p.split_whitespace().next().unwrap()["/proc/".len()..]
                .parse()
                .unwrap();
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            killed += 1;
        }
    }
    assert_eq!(killed, 1, "{:#?}", sandbox_processes());
    let start = pool_status(&server);
    std::thread::sleep(Duration::from_millis(200));
    let r = server.execute(json!({"code": "6 * 7"})).json();
    assert_eq!(
        (&r["status"], &r["result"]),
        (&json!("ok"), &json!(42)),
        "{r}"
    );
    let pool = pool_status(&server);
    assert_eq!(pool["failures"], 1, "{pool}");
    assert!(
        pool["last_error"].as_str().unwrap().contains("dead"),
        "{pool}"
    );
    // Never handed out: the only take, if any, is of the sandbox a refill made meanwhile.
    let grew = |field: &str| pool[field].as_u64().unwrap() - start[field].as_u64().unwrap();
    assert_eq!(grew("takes"), grew("waits"), "{start} {pool}");
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after the server stopped");
}

#[test]
fn a_pool_that_cannot_start_sandboxes_says_why_and_backs_off() {
    let _g = serial();
    let before = HostState::now();
    // No interpreter starts with four descriptors (its own 0-3 take them all).
    let server = Server::start(
        "[zygote]\n[pool]\npreloaded = 0\nsize = 2\n[engine]\nopen_files = 4\n",
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let pool = loop {
        let pool = pool_status(&server);
        if pool["failures"].as_u64() >= Some(2) {
            break pool;
        }
        assert!(Instant::now() < deadline, "no failure reported: {pool}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(pool["idle"], 0, "{pool}");
    assert!(
        pool["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("starting a sandbox")),
        "{pool}"
    );
    assert!(server.metric("airlock_pool_failures_total") >= 2.0);
    // Executions still get an answer (a cold sandbox, and its own verdict).
    let r = server.execute(json!({"code": "1"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(r.json()["status"], "ok");
    // Failed starts back off (0.5 s, doubling) instead of spinning.
    std::thread::sleep(Duration::from_millis(1500));
    let failures = pool_status(&server)["failures"].as_u64().unwrap();
    assert!(failures <= 10, "{failures} failed starts in about 2 s");
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after the server stopped");
}
