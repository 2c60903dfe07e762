//! Zygotes through the real `airlock serve`: a zygote's child is the same sandbox as a cold
//! one, code that names a preloaded package finds it loaded, a zygote that dies is replaced
//! while executions keep running, zygotes are recycled, and the switch turns them off.
//! (The jail, kernel and limits tests run once more through `airlock run --zygote`, see
//! `scripts/test.sh`; the sandbox crate's own `tests/zygote.rs` checks what children leave.)

use crate::common;

use std::time::{Duration, Instant};

use common::http::{call_as, Server, KEY};
use common::*;
use serde_json::{json, Value};

/// No warm pool: every execution asks for a sandbox, so the zygote makes each one.
const NO_POOL: &str = "[pool]\nsize = 0\n[zygote]\nenabled = true\n";

fn zygote_status(server: &Server) -> Value {
    server.call("GET", "/readyz", None).json()["zygote"].clone()
}

/// Runs `code` until the zygote that serves it is ready (the first executions start cold
/// while it starts), then returns the first result that came from it.
fn from_a_zygote(server: &Server, code: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Until no zygote is starting, an execution may start cold and another one's child
        // be counted meanwhile.
        while zygote_status(server)["starting"] != 0 {
            assert!(Instant::now() < deadline, "{}", zygote_status(server));
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = server.metric("airlock_zygote_children_total");
        let r = server.execute(json!({"code": code}));
        assert_eq!(r.status, 200, "{}", r.text());
        if server.metric("airlock_zygote_children_total") > before {
            return r.json();
        }
        assert!(
            Instant::now() < deadline,
            "no zygote became ready: {}",
            zygote_status(server)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn cold_reason(server: &Server, reason: &str) -> f64 {
    server.metric(&format!("airlock_cold_starts_total{{reason=\"{reason}\"}}"))
}

#[test]
fn a_zygote_s_child_is_the_same_sandbox_as_a_cold_one() {
    let _g = serial();
    let cold = run_unlocked(SANDBOX_PROBE, &[]);
    assert_eq!(cold.status(), "ok", "{cold:#?}");
    let server = Server::start(NO_POOL, &[]);
    let child = from_a_zygote(&server, SANDBOX_PROBE);
    assert_eq!(child["status"], "ok", "{child}");
    let seen = |v: &Value| -> Value { serde_json::from_str(v.as_str().unwrap()).unwrap() };
    let (cold_seen, child_seen) = (seen(&cold.json["stdout"]), seen(&child["stdout"]));
    for (field, value) in cold_seen.as_object().unwrap() {
        assert_eq!(
            &child_seen[field], value,
            "{field} differs between a zygote's child and a cold sandbox"
        );
    }
    assert_eq!(cold_seen, child_seen);
    assert_eq!(child["isolation"], cold.json["isolation"]);
    // A lean zygote's child: the runner's modules and nothing preloaded.
    assert!(!child_seen["modules"]
        .as_array()
        .unwrap()
        .contains(&json!("pandas")));
    drop(server);
}

/// The lean zygote surveys the runner's rehearsal of a small request (what every execution
/// writes), for its pooled children to copy while they wait. A survey is of a rehearsal run
/// to its end or of nothing: one that the runner's own request no longer fits (a key it
/// lacks) surveys nothing, and this fails.
#[test]
fn the_lean_zygote_surveys_the_runner_s_rehearsal() {
    let _g = serial();
    let server = Server::start("[zygote]\nenabled = true\npreload = []\n", &[]);
    let r = from_a_zygote(&server, "print(1)");
    assert_eq!(r["stdout"], "1\n", "{r}");
    let status = zygote_status(&server);
    let surveyed = status["prefault_bytes"].as_u64().unwrap();
    assert!(surveyed >= 256 << 10, "{status}");
    drop(server);
}

#[test]
fn code_that_names_a_preloaded_package_finds_it_loaded() {
    let _g = serial();
    let server = Server::start(NO_POOL, &[]);
    let chart = r#"
import sys, time
loaded = 'pandas' in sys.modules and 'matplotlib.pyplot' in sys.modules
t = time.perf_counter()
import pandas as pd
import matplotlib.pyplot as plt
df = pd.DataFrame({'x': range(10), 'y': [v * v for v in range(10)]})
df.plot(x='x', y='y')
plt.savefig('/work/chart.png')
(loaded, round(time.perf_counter() - t, 3))
"#;
    let r = from_a_zygote(&server, chart);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["result"][0], true, "{r}");
    // Loaded before the code ran: the chart costs only itself.
    assert!(r["result"][1].as_f64().unwrap() < 5.0, "{r}");
    assert_eq!(r["outputs"][0]["type"], "image/png", "{r}");
    // pyplot was imported before the request: `plt.show()` still shows, in order.
    let shown = from_a_zygote(
        &server,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\ndisplay('after')",
    );
    let kinds: Vec<&Value> = shown["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| &o["type"])
        .collect();
    assert_eq!(
        kinds,
        [&json!("image/png"), &json!("text/plain")],
        "{shown}"
    );
    // Code that names none of them runs in a lean zygote's child.
    let lean = from_a_zygote(&server, "import sys\nsorted(sys.modules)");
    assert_eq!(lean["status"], "ok", "{lean}");
    assert!(!lean["result"].as_array().unwrap().contains(&json!("numpy")));
    let status = zygote_status(&server);
    assert!(status["ready"].as_u64() >= Some(2));
    // What their children copy while they wait includes a first chart's pages, which the
    // engine's warm-up draws in the preloading zygote and again in the fork it surveys:
    // megabytes (about 14 MiB here), against about 3 MiB for both runners' rehearsals alone.
    assert!(
        status["prefault_bytes"].as_u64() > Some(8 << 20),
        "{status}"
    );
    // Both keep to one thread (one BLAS thread; matplotlib's font-cache timer ended), so on
    // cgroup v2 their children are cloned straight into their cgroups.
    assert_eq!(status["cloning"], status["ready"], "{status}");
}

/// What a lean zygote's child draws (code that names no preloaded package).
const DRAW_LEAN: &str = r#"
import random, tempfile, uuid
fd, path = tempfile.mkstemp()
{'random': random.getrandbits(64), 'uuid4': str(uuid.uuid4()), 'mkstemp': path,
 'tempfile': next(tempfile._get_candidate_names())}
"#;

/// What a preloading zygote's child draws: the same, numpy's global generator and a fresh
/// one, rows that pandas samples, and OpenSSL's generator.
const DRAW_PRELOADED: &str = r#"
import random, ssl, tempfile, uuid
import numpy as np
import pandas as pd
fd, path = tempfile.mkstemp()
{'random': random.getrandbits(64), 'uuid4': str(uuid.uuid4()), 'mkstemp': path,
 'tempfile': next(tempfile._get_candidate_names()),
 'numpy': int(np.random.randint(1 << 62)), 'default_rng': int(np.random.default_rng().integers(1 << 62)),
 'sample': pd.Series(range(1 << 20)).sample(4).tolist(), 'openssl': ssl.RAND_bytes(16).hex()}
"#;

/// 30 children of each default zygote, made for two keys in turn: no two draw alike.
#[test]
fn children_of_each_zygote_draw_their_own_random_numbers() {
    let _g = serial();
    const OTHER_KEY: &str = "other-key-0123456789abcdef";
    let hash = airlock_api::sha256_hex(OTHER_KEY.as_bytes());
    let server = Server::start(
        &format!("{NO_POOL}[[keys]]\nname = \"other\"\nhash = \"sha256:{hash}\"\n"),
        &[],
    );
    from_a_zygote(&server, DRAW_LEAN);
    from_a_zygote(&server, DRAW_PRELOADED);
    let children = server.metric("airlock_zygote_children_total");
    let n = 30;
    let mut draws: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for code in [DRAW_LEAN, DRAW_PRELOADED] {
        for i in 0..n {
            let key = if i % 2 == 0 { KEY } else { OTHER_KEY };
            let r = call_as(
                server.addr,
                key,
                "POST",
                "/v1/execute",
                Some(&json!({"code": code})),
            );
            assert_eq!(r.json()["status"], "ok", "{}", r.text());
            for (kind, value) in r.json()["result"].as_object().unwrap() {
                draws
                    .entry(kind.clone())
                    .or_default()
                    .push(value.to_string());
            }
        }
    }
    // Every one was a zygote's child.
    assert_eq!(
        server.metric("airlock_zygote_children_total") - children,
        2.0 * n as f64
    );
    for (kind, values) in &draws {
        let mut distinct = values.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            values.len(),
            "children drew alike from {kind}: {values:?}"
        );
    }
    assert_eq!(draws["random"].len(), 2 * n);
    assert_eq!(draws["numpy"].len(), n);
}

#[test]
fn a_child_of_the_preloading_zygote_waits_in_the_pool_for_code_that_names_its_packages() {
    let _g = serial();
    let server = Server::start(
        "[pool]\nsize = 1\nmax_size = 1\npreloaded = 1\n[zygote]\nenabled = true\n",
        &[],
    );
    let code = "import sys\nloaded = 'pandas' in sys.modules\nimport pandas\nloaded";
    let takes = || server.metric("airlock_pool_preloaded_takes_total");
    let idle = || server.call("GET", "/readyz", None).json()["pool_preloaded"]["idle"].clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The pool waits for the zygote (a cold sandbox in its place would hold no preloads): the
    // first child it holds is already one of the preloading zygote's.
    while idle() != 1 {
        assert!(Instant::now() < deadline, "{}", zygote_status(&server));
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = takes();
    let r = server.execute(json!({"code": code}));
    assert_eq!(r.json()["status"], "ok", "{}", r.text());
    assert_eq!(
        takes(),
        before + 1.0,
        "not taken from the pool: {}",
        r.text()
    );
    assert_eq!(
        r.json()["result"],
        true,
        "a cold sandbox was pooled: {}",
        r.text()
    );
    let pool = server.call("GET", "/readyz", None).json()["pool_preloaded"].clone();
    assert_eq!(
        pool["failures"], 0,
        "waiting for the zygote is no failure: {pool}"
    );
    // Code that names no preloaded package takes a lean one, never this pool's.
    while idle() != 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = takes();
    let r = server.execute(json!({"code": "import sys\n'pan' + 'das' in sys.modules"}));
    assert_eq!(r.json()["result"], false, "{}", r.text());
    assert_eq!(takes(), before);
    drop(server);

    let server = Server::start(
        "[pool]\nsize = 1\npreloaded = 0\n[zygote]\nenabled = true\n",
        &[],
    );
    let ready = server.call("GET", "/readyz", None).json();
    assert!(ready.get("pool_preloaded").is_none(), "{ready}");
    assert_eq!(server.metric("airlock_pool_preloaded_idle_sandboxes"), 0.0);
}

/// Host pids of the server's zygote processes (the Python of each zygote).
fn zygote_pythons() -> Vec<i32> {
    let mut pids = Vec::new();
    for dir in sandbox_cgroups() {
        if !dir.to_string_lossy().contains("-zygote-") {
            continue;
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "python3" && !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// Issue 51: `ps` shows a zygote and each of its children as `python3 -I -S -B
/// /.zygote/zygote.py [preloads]`: their command line held the zygote's whole Python source
/// and the runner's (~50 KB).
#[test]
fn a_zygote_s_command_line_is_short_and_says_what_it_is() {
    let _g = serial();
    let server = Server::start(NO_POOL, &[]);
    let code = "[a.decode() for a in open('/proc/self/cmdline', 'rb').read().split(b'\\0')[:-1]]";
    let child = from_a_zygote(&server, code);
    let argv: Vec<&str> = child["result"]
        .as_array()
        .unwrap_or_else(|| panic!("{child}"))
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        argv[1..],
        ["-I", "-S", "-B", "/.zygote/zygote.py"],
        "a lean zygote's child: {argv:?}"
    );
    assert!(argv[0].ends_with("python3"), "{argv:?}");
    // The zygotes themselves, as the host's `ps` reads them; the preloading one names what
    // it preloads.
    let code = "import pandas\n1";
    assert_eq!(from_a_zygote(&server, code)["result"], 1);
    let pythons = zygote_pythons();
    assert_eq!(pythons.len(), 2, "{pythons:?}");
    let mut preloads = Vec::new();
    for pid in pythons {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(cmdline.len() < 256, "{}", String::from_utf8_lossy(&cmdline));
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert_eq!(args[4], "/.zygote/zygote.py", "{args:?}");
        preloads.push(args.get(5).cloned().unwrap_or_default());
    }
    preloads.sort();
    assert_eq!(preloads[0], "", "{preloads:?}");
    assert!(
        preloads[1].split(',').any(|p| p == "pandas"),
        "{preloads:?}"
    );
    drop(server);
}

#[test]
fn a_zygote_that_dies_is_replaced_and_executions_keep_running() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start(NO_POOL, &[]);
    from_a_zygote(&server, "print(1)");
    let starts = server.metric("airlock_zygote_starts_total");
    let pythons = zygote_pythons();
    assert_eq!(pythons.len(), 1, "{pythons:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pythons[0]),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    // Every execution from now on runs: cold until another zygote is ready, then its.
    for i in 0..5 {
        let r = server.execute(json!({"code": "6 * 7"}));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["result"], 42, "execution {i}: {}", r.text());
    }
    from_a_zygote(&server, "print(1)");
    assert!(server.metric("airlock_zygote_starts_total") > starts);
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after the zygotes' server stopped");
}

#[test]
fn zygotes_are_recycled_and_can_be_turned_off() {
    let _g = serial();
    let server = Server::start("[pool]\nsize = 0\n[zygote]\nrecycle_after = 2\n", &[]);
    from_a_zygote(&server, "print(1)");
    for _ in 0..8 {
        let r = server.execute(json!({"code": "print(1)"}));
        assert_eq!(r.json()["status"], "ok");
    }
    // Every second child asks for a replacement; the old one ends once its children have.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.metric("airlock_zygote_starts_total") < 3.0 {
        assert!(Instant::now() < deadline, "{}", zygote_status(&server));
        server.execute(json!({"code": "print(1)"}));
    }
    // The retired ones end once their children have.
    while zygote_pythons().len() != 1 {
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "retired zygotes linger: {:?}",
            zygote_pythons()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(server);

    let server = Server::start("[pool]\nsize = 0\n[zygote]\nenabled = false\n", &[]);
    for _ in 0..3 {
        let r = server.execute(json!({"code": "print(1)"}));
        assert_eq!(r.json()["status"], "ok");
    }
    assert!(cold_reason(&server, "disabled") >= 3.0);
    assert_eq!(server.metric("airlock_zygote_children_total"), 0.0);
    assert!(zygote_pythons().is_empty());
}

#[test]
fn a_session_is_a_child_of_the_preloading_zygote() {
    let _g = serial();
    let before = HostState::now();
    let server = Server::start(NO_POOL, &[]);
    // The first session starts the zygote and is cold; once it is ready, sessions are its
    // children, with the preloads there before any cell imports them.
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = loop {
        let before = server.metric("airlock_zygote_children_total");
        let r = server.call("POST", "/v1/sessions", Some(&json!({})));
        assert_eq!(r.status, 201, "{}", r.text());
        let id = r.json()["id"].as_str().unwrap().to_owned();
        if server.metric("airlock_zygote_children_total") > before {
            break id;
        }
        server.call("DELETE", &format!("/v1/sessions/{id}"), None);
        assert!(Instant::now() < deadline, "{}", zygote_status(&server));
        std::thread::sleep(Duration::from_millis(200));
    };
    let cell = |code: &str| {
        let r = server.call(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(&json!({"code": code})),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    assert_eq!(cell("import sys\n'pandas' in sys.modules")["result"], true);
    cell("x = 41");
    assert_eq!(cell("x + 1")["result"], 42);
    let r = server.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after the zygotes' sessions");
}

#[test]
fn no_child_finds_another_s_environment_or_code_in_its_memory() {
    let _g = serial();
    let server = Server::start(NO_POOL, &[]);
    from_a_zygote(&server, "print(1)");
    // The secret travels as one execution's environment and code; the next child scans all
    // the memory it has (a copy of the zygote's) for it, knowing only its digest.
    let secret = format!(
        "zyg-secret-{:016x}",
        std::process::id() as u64 * 0x9E37_79B9
    );
    let r = server.execute(json!({
        "code": format!("import os\nlen(os.environ['PROBE']) + len('{secret}')"),
        "env": {"PROBE": secret},
    }));
    assert_eq!(r.json()["status"], "ok", "{}", r.text());
    let digest = { airlock_api::sha256_hex(secret.as_bytes()) };
    let scan = format!(
        r#"
import ctypes, hashlib, re
prefix = b"zyg-" + b"secret-"
found, scanned = False, 0
# Our own memory, read in place (a sandbox is not dumpable: /proc/self/mem is closed to it).
for line in open("/proc/self/maps").read().splitlines():
    fields = line.split()
    if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]")):
        continue
    start, end = (int(x, 16) for x in fields[0].split("-"))
    chunk = ctypes.string_at(start, end - start)
    scanned += len(chunk)
    for m in re.finditer(re.escape(prefix) + rb"[0-9a-f]{{16}}", chunk):
        if hashlib.sha256(m.group(0)).hexdigest() == "{digest}":
            found = True
[found, scanned > 1 << 20]
"#
    );
    // The scan finds the secret where it is: in the execution that was given it.
    let r = server.execute(json!({"code": scan, "env": {"PROBE": secret}}));
    assert_eq!(r.json()["result"], json!([true, true]), "{}", r.text());
    for _ in 0..3 {
        let r = server.execute(json!({"code": scan}));
        assert_eq!(r.json()["status"], "ok", "{}", r.text());
        assert_eq!(r.json()["result"], json!([false, true]), "{}", r.text());
    }
}

/// How long a zygote is given to become ready before its start is given up (`START_WAIT_MS`
/// in the sandbox crate): what a shutdown that waits for a start in progress may wait.
const ZYGOTE_START_WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_zygote_still_starting_at_shutdown_is_killed_not_waited_for() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let _g = serial();
    let before = HostState::now();
    let mut server = Server::start(NO_POOL, &[]);
    // The first session starts the preloading zygote (and is cold meanwhile).
    let r = server.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(r.status, 201, "{}", r.text());
    // Its Python, stopped before it is ready: the start cannot end by itself before its
    // timeout, as a slow import on a loaded host holds it (`airlock mcp` is killed by an MCP
    // host that waits 2 s for it to exit, leaving the zygote to die alone).
    let deadline = Instant::now() + Duration::from_secs(30);
    let python = loop {
        let found = zygote_pythons().into_iter().find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.contains("numpy"))
        });
        if let Some(pid) = found {
            break pid;
        }
        assert!(Instant::now() < deadline, "{}", zygote_status(&server));
        std::thread::sleep(Duration::from_millis(5));
    };
    kill(Pid::from_raw(python), Signal::SIGSTOP).unwrap();
    let status = zygote_status(&server);
    assert_eq!(
        status["starting"], 1,
        "the zygote was ready before it could be stopped: {status}"
    );
    kill(Pid::from_raw(server.child.id() as i32), Signal::SIGTERM).unwrap();
    // Well within the start's own timeout: a server that waited for it would still be there.
    let deadline = Instant::now() + ZYGOTE_START_WAIT / 2;
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "the server waits for the zygote it was starting"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}");
    drop(server);
    HostState::now().assert_same_as(&before, &"after a zygote still starting at shutdown");
}
