//! Faults of the host while the server runs: each gives clear errors to the requests it
//! touches, `/readyz` says why, and the server recovers by itself once the fault is gone.
//! (A full or read-only state directory: `server.rs`; a tool server that dies: `tools.rs`.)

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::http::{call_as, Server, KEY};
use common::*;
use serde_json::json;

fn sh(argv: &[&str]) {
    let status = Command::new(argv[0]).args(&argv[1..]).status().unwrap();
    assert!(status.success(), "{argv:?}: {status}");
}

/// Waits (up to 15 s) for `/readyz` to answer `status`; its body.
fn wait_readyz(server: &Server, status: u16) -> String {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let r = server.call("GET", "/readyz", None);
        if r.status == status {
            return r.text();
        }
        assert!(
            Instant::now() < until,
            "/readyz never answered {status}: {}",
            r.text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The fault gone: ready again by itself, executions run, and the server leaves nothing.
fn recovered(server: Server, before: &HostState, context: &str) {
    wait_readyz(&server, 200);
    assert_eq!(
        server.execute(json!({"code": "6 * 7"})).json()["result"],
        42
    );
    assert!(server.stop().success());
    HostState::now().assert_same_as(before, &context);
}

#[test]
fn the_interpreter_gone_while_the_server_runs_fails_executions_clearly_until_it_is_back() {
    let _g = serial();
    let before = HostState::now();
    // The server in a mount namespace of its own, where the test can take /usr/bin away.
    let dir = std::env::temp_dir().join(format!("airlock-faults-python-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let server = Server::start_under(
        &["unshare", "--mount", "--propagation", "private"],
        dir,
        "",
        &[],
        Some(KEY),
    );
    let pid = server.child.id().to_string();
    assert_eq!(server.execute(json!({"code": "1"})).json()["status"], "ok");
    assert_eq!(server.call("GET", "/readyz", None).status, 200);

    sh(&[
        "nsenter", "-t", &pid, "-m", "mount", "-t", "tmpfs", "gone", "/usr/bin",
    ]);
    // Its sandbox cannot be built: an `internal_error` that names what is missing.
    let r = server.execute(json!({"code": "1"})).json();
    assert_eq!(
        (r["status"].as_str(), r["error"]["type"].as_str()),
        (Some("internal_error"), Some("SandboxError")),
        "{r}"
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/usr/bin/python3"),
        "{r}"
    );
    let why = wait_readyz(&server, 503);
    assert!(
        why.contains("sandboxes cannot start") || why.contains("trial run"),
        "{why}"
    );
    assert!(why.contains("python3"), "{why}");

    // Back: ready again by itself (no execution needed), and executions run.
    // umount itself is in /usr/bin: a copy outside it (its libraries are under /usr/lib).
    let umount = server.dir.join("umount");
    std::fs::copy("/usr/bin/umount", &umount).unwrap();
    sh(&[
        "nsenter",
        "-t",
        &pid,
        "-m",
        umount.to_str().unwrap(),
        "/usr/bin",
    ]);
    recovered(server, &before, "after the interpreter came back");
}

#[test]
fn a_low_open_files_limit_fails_what_it_must_clearly_and_the_server_recovers() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let pid = server.child.id();
    assert_eq!(server.execute(json!({"code": "1"})).json()["status"], "ok");
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    // The soft limit only: root here cannot raise a hard limit again (no CAP_SYS_RESOURCE).
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let nofile: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    let (soft, hard) = (nofile[3], nofile[4]);
    // A few descriptors more than it holds: connections still come in, sandboxes do not.
    let limit = (open + 6).to_string();
    let nofile = |soft: &str| format!("--nofile={soft}:{hard}");
    sh(&["prlimit", "--pid", &pid.to_string(), &nofile(&limit)]);
    let answers: Vec<_> = (0..4)
        .map(|_| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let body = json!({"code": "import time\ntime.sleep(0.5)\n1"});
                call_as(addr, KEY, "POST", "/v1/execute", Some(&body))
            })
        })
        .collect();
    let mut failed = 0;
    for a in answers {
        let r = a.join().unwrap();
        if r.status != 200 {
            assert_eq!(
                (r.status, r.error_code()),
                (503, "unavailable".into()),
                "{}",
                r.text()
            );
            assert!(r.text().contains("Too many open files"), "{}", r.text());
            failed += 1;
        }
    }
    assert!(failed > 0, "the limit was never reached");
    let why = wait_readyz(&server, 503);
    assert!(why.contains("Too many open files"), "{why}");

    sh(&["prlimit", "--pid", &pid.to_string(), &nofile(soft)]);
    recovered(server, &before, "after the open-files limit was raised");
}

#[test]
fn cgroup_names_already_taken_are_skipped() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start("", &[]);
    let pid = server.child.id();
    // The names the server's next sandboxes would take, taken (as a crashed airlock that had
    // the same pid would leave them), in every hierarchy it uses.
    let parents = airlock_sandbox::host_support()
        .cgroup
        .as_ref()
        .expect("cgroups")
        .parents();
    let mut taken = Vec::new();
    for parent in &parents {
        for n in 0..64 {
            let dir = parent.join(format!("{}{pid}-{n}", airlock_sandbox::SANDBOX_PREFIX));
            if std::fs::create_dir(&dir).is_ok() {
                taken.push(dir);
            }
        }
    }
    for _ in 0..3 {
        let r = server.execute(json!({"code": "6 * 7"}));
        assert_eq!(r.json()["result"], 42, "{}", r.text());
    }
    assert!(server.stop().success());
    for dir in taken {
        let _ = std::fs::remove_dir(dir);
    }
    HostState::now().assert_same_as(&before, &"after taken cgroup names");
}

/// The server's own CPU time (user and system), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's closing parenthesis: fields 3.. ; utime and stime are 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn a_program_writing_forever_past_its_output_limit_costs_the_server_next_to_nothing() {
    let _g = serial();
    let server = Server::start("", &[]);
    let pid = server.child.id();
    for (code, stream) in [
        (
            "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
            "stdout",
        ),
        (
            "import os\nwhile True:\n    try:\n        os.write(2, b'x' * 65536)\n    except OSError:\n        pass",
            "stderr",
        ),
    ] {
        let before = cpu_ticks(pid);
        let r = server.execute(json!({"code": code, "limits": {"timeout_ms": 2000, "output_bytes": 4096}}));
        let ticks = cpu_ticks(pid) - before;
        let r = r.json();
        assert_eq!(r[format!("{stream}_truncated")], true, "{r}");
        assert_eq!(r[stream].as_str().unwrap().len(), 4096);
        // Reading all of it took the server ~1.8 s of CPU in 2 s: now it stops reading after
        // 64 MiB past the limit, and the program's writes fail.
        assert!(ticks < 30, "{stream}: the server spent {ticks} ticks: {r}");
    }
    // Overshooting a little still ends as it would.
    let r = server.execute(json!({
        "code": "print('y' * 100_000)\n6 * 7",
        "limits": {"output_bytes": 4096},
    }));
    let r = r.json();
    assert_eq!(
        (r["status"].as_str(), r["result"].as_i64()),
        (Some("ok"), Some(42)),
        "{r}"
    );
    assert_eq!(r["stdout_truncated"], true);
}

#[test]
fn a_session_cell_writing_forever_past_its_output_limit_costs_the_server_next_to_nothing() {
    let _g = serial();
    let server = Server::start("", &[]);
    let pid = server.child.id();
    let session = server.call(
        "POST",
        "/v1/sessions",
        Some(&json!({"limits": {"output_bytes": 4096}})),
    );
    assert_eq!(session.status, 201, "{}", session.text());
    let id = session.json()["id"].as_str().unwrap().to_owned();
    let before = cpu_ticks(pid);
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(&json!({
            "code": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
            "timeout_ms": 2000,
        })),
    );
    let ticks = cpu_ticks(pid) - before;
    let r = r.json();
    assert_eq!(r["stdout_truncated"], true, "{r}");
    // The cell reads at most 64 MiB past the limit, then leaves the pipe full until its
    // deadline: before, the server read all of it (a core for the cell's whole clock).
    assert!(ticks < 30, "the server spent {ticks} ticks: {r}");
    assert!(server.stop().success());
}
