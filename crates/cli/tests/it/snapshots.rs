//! Session snapshots (issue 48): a session paused (its state written to a snapshot by its own
//! sandbox, the sandbox freed), brought back in a fresh sandbox, forked, found again after a
//! restart; snapshots that are altered, cut, swapped or replayed refused.

use crate::common;

use common::http::{call_as, Server, KEY};
use common::*;
use serde_json::{json, Value};

const OTHER_KEY: &str = "other-key-for-snapshots-0123456789";

fn other_key_toml(extra: &str) -> String {
    format!(
        "{extra}\n[[keys]]\nname = \"other\"\nhash = \"{}\"\n",
        key_hash(OTHER_KEY)
    )
}

fn open(server: &Server, body: Value) -> String {
    let r = server.call("POST", "/v1/sessions", Some(&body));
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["id"].as_str().unwrap().to_owned()
}

fn cell(server: &Server, id: &str, code: &str) -> Value {
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(&json!({"code": code})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "ok", "{v}");
    v
}

fn post(server: &Server, id: &str, what: &str) -> common::http::Response {
    server.call("POST", &format!("/v1/sessions/{id}/{what}"), None)
}

/// A wheel of one module, made in the sandbox and installed there by pip (no index).
const PIP_INSTALL: &str = r#"import zipfile, subprocess, sys
with zipfile.ZipFile('/work/tinypkg-1.0-py3-none-any.whl', 'w') as z:
    z.writestr('tinypkg/__init__.py', 'ANSWER = 42\n')
    z.writestr('tinypkg-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n')
    z.writestr('tinypkg-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
    z.writestr('tinypkg-1.0.dist-info/RECORD', '')
done = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-index', '--no-deps',
    '--no-cache-dir', '--disable-pip-version-check', '--target', '/tmp/packages',
    '/work/tinypkg-1.0-py3-none-any.whl'], capture_output=True, text=True)
assert done.returncode == 0, done.stderr
import importlib
importlib.invalidate_caches()
import tinypkg
tinypkg.ANSWER"#;

/// The session's state, as one cell sees it: every kind the issue names.
const STATE: &str = r#"import numpy as np, pandas as pd, threading, json as js
df = pd.DataFrame({'a': np.arange(100_000), 'b': np.linspace(0, 1, 100_000)})
arr = np.arange(12).reshape(3, 4) * 1.5
x = 42
def f(n):
    return n + x
class Point:
    def __init__(self, a, b):
        self.a, self.b = a, b
    def norm(self):
        return f(self.a * self.a + self.b * self.b)
p = Point(3, 4)
twice = lambda v: v * 2 + x
shared = [1, 2]
alias = shared
lock = threading.Lock()
gen = (i for i in range(3))
open('/work/notes.txt', 'w').write('in work')
open('/tmp/scratch.txt', 'w').write('in tmp')
'ready'"#;

/// What the state gives back; `x` set again first, so functions must see the session's
/// globals as they are now.
const CHECK: &str = r#"x = 43
import tinypkg
[int(df['a'].sum()), float(df['b'].iloc[-1]), arr.tolist(), f(1), p.norm(), twice(1),
 alias is shared, js.dumps([1]), tinypkg.ANSWER, open('/work/notes.txt').read(),
 open('/tmp/scratch.txt').read(), 'lock' in globals(), 'gen' in globals()]"#;

/// What a session's sandbox is, seen from inside, field by field: ids, capabilities,
/// `no_new_privs`, seccomp (mode and filters), rlimits, hostname, mounts (without their ids
/// and the sandbox's own host uid), its processes, what it may reach.
const PROBE: &str = r#"import os, re, resource, socket
keys = ('Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb',
        'NoNewPrivs', 'Seccomp', 'Seccomp_filters')
status = {l.split(':')[0]: l.split(':', 1)[1].strip() for l in open('/proc/self/status')
          if l.split(':')[0] in keys}
limits = {n: resource.getrlimit(getattr(resource, n)) for n in
          ('RLIMIT_NOFILE', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_CPU', 'RLIMIT_CORE',
           'RLIMIT_AS', 'RLIMIT_STACK')}
# Each sandbox is a host uid of its own (the rule): the mounts' owner is that uid.
mounts = sorted(re.sub(r'(uid|gid)=[0-9]+', r'\1=N', ' '.join(l.split()[3:]))
                for l in open('/proc/self/mountinfo'))
def refused(f):
    try:
        f()
        return 'allowed'
    except OSError as e:
        return type(e).__name__
reach = [refused(lambda: socket.create_connection(('127.0.0.1', 22), timeout=1)),
         refused(lambda: open('/etc/shadow')), refused(lambda: open('/usr/x', 'w'))]
[status, limits, socket.gethostname(), mounts, sorted(os.listdir('/proc'))[:3], reach,
 os.getcwd(), sorted(os.environ)]"#;

fn expected() -> Value {
    json!([
        4999950000u64,
        1.0,
        [
            [0.0, 1.5, 3.0, 4.5],
            [6.0, 7.5, 9.0, 10.5],
            [12.0, 13.5, 15.0, 16.5]
        ],
        44,
        68,
        45,
        true,
        "[1]",
        42,
        "in work",
        "in tmp",
        false,
        false
    ])
}

#[test]
fn a_paused_session_comes_back_whole_in_a_fresh_jail_and_a_fork_goes_its_own_way() {
    let _g = serial();
    let server = Server::start("", &[]);
    let id = open(&server, json!({}));
    assert_eq!(cell(&server, &id, PIP_INSTALL)["result"], 42);
    assert_eq!(cell(&server, &id, STATE)["result"], "ready");
    let fresh_isolation = cell(&server, &id, "1")["isolation"].clone();
    let fresh_probe = cell(&server, &id, PROBE)["result"].clone();

    let paused = post(&server, &id, "pause");
    assert_eq!(paused.status, 200, "{}", paused.text());
    let snapshot = paused.json()["paused"].clone();
    assert_eq!(snapshot["cells"], 4);
    for name in ["df", "arr", "f", "Point", "p", "twice", "np", "pd", "x"] {
        assert!(
            snapshot["variables"]
                .as_array()
                .unwrap()
                .contains(&json!(name)),
            "{name}: {snapshot}"
        );
    }
    // What cannot come back is named, per variable.
    let not_kept = &snapshot["not_kept"];
    assert!(
        not_kept["lock"].as_str().unwrap().contains("lock"),
        "{not_kept}"
    );
    assert!(
        not_kept["gen"].as_str().unwrap().contains("generator"),
        "{not_kept}"
    );
    assert!(snapshot["stored_bytes"].as_u64().unwrap() > 0);
    // Its sandbox is gone; it is listed, paused.
    assert_eq!(server.metric("airlock_sessions_open"), 0.0);
    let shown = server
        .call("GET", &format!("/v1/sessions/{id}"), None)
        .json();
    assert_eq!(shown["paused"]["cells"], 4, "{shown}");
    let listed = server.call("GET", "/v1/sessions", None).json();
    assert_eq!(listed["sessions"][0]["id"], id.as_str());

    // The next cell brings it back: every value equal, functions on the live globals.
    let back = cell(&server, &id, CHECK);
    assert_eq!(back["result"], expected(), "{back}");
    assert_eq!(back["resumed"]["not_kept"], *not_kept);
    // Jailed exactly as a fresh session: every field of `isolation`, and field by field
    // from inside.
    assert_eq!(back["isolation"], fresh_isolation);
    assert_eq!(cell(&server, &id, PROBE)["result"], fresh_probe);
    assert_eq!(server.metric("airlock_sessions_open"), 1.0);

    // A fork: the same state, then each its own way.
    let forked = post(&server, &id, "fork");
    assert_eq!(forked.status, 201, "{}", forked.text());
    let fork = forked.json()["id"].as_str().unwrap().to_owned();
    assert_ne!(fork, id);
    assert_eq!(cell(&server, &fork, CHECK)["result"], expected());
    cell(
        &server,
        &fork,
        "x = 1000\nshared.append(3)\nopen('/work/notes.txt', 'w').write('fork')",
    );
    cell(&server, &id, "x = 43");
    assert_eq!(
        cell(
            &server,
            &id,
            "[f(1), shared, open('/work/notes.txt').read()]"
        )["result"],
        json!([44, [1, 2], "in work"])
    );
    assert_eq!(
        cell(
            &server,
            &fork,
            "[f(1), shared, open('/work/notes.txt').read()]"
        )["result"],
        json!([1001, [1, 2, 3], "fork"])
    );
    // A paused session forks too, and stays paused.
    assert_eq!(post(&server, &id, "pause").status, 200);
    let second = post(&server, &id, "fork");
    assert_eq!(second.status, 201, "{}", second.text());
    let second = second.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(cell(&server, &second, CHECK)["result"], expected());
    let still = server
        .call("GET", &format!("/v1/sessions/{id}"), None)
        .json();
    assert!(still["paused"].is_object(), "{still}");
    // `resume` brings it back without a cell.
    let resumed = post(&server, &id, "resume");
    assert_eq!(resumed.status, 200, "{}", resumed.text());
    assert!(resumed.json()["resumed"].is_object());
    assert_eq!(cell(&server, &id, CHECK)["result"], expected());
    // The audit log: closed as paused, opened again.
    let audit = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    assert!(audit.contains("\"why\":\"paused\""), "{audit}");
}

#[test]
fn snapshots_altered_cut_swapped_replayed_or_over_quota_are_refused() {
    let _g = serial();
    let server = Server::start(
        &other_key_toml("[volumes]\nmax_bytes_per_key = 50000000\n"),
        &[],
    );
    let dir = server.state_dir().join("sessions");
    let paused_one = |marker: &str| {
        let id = open(&server, json!({}));
        cell(&server, &id, &format!("marker = {marker:?}"));
        assert_eq!(post(&server, &id, "pause").status, 200);
        id
    };
    let refused = |id: &str, why: &str| {
        let open_before = server.metric("airlock_sessions_open");
        let r = server.call(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(&json!({"code": "marker"})),
        );
        assert_eq!(
            (r.status, r.error_code()),
            (422, "snapshot_invalid".into()),
            "{why}: {}",
            r.text()
        );
        // Nothing of it runs: no session came back.
        assert_eq!(server.metric("airlock_sessions_open"), open_before, "{why}");
    };
    // The snapshot a session's record names.
    let snap = |id: &str| {
        let record: Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("{id}.json"))).unwrap())
                .unwrap();
        dir.join(record["snapshot_file"].as_str().unwrap())
    };

    // One byte altered.
    let a = paused_one("a");
    let mut bytes = std::fs::read(snap(&a)).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(snap(&a), &bytes).unwrap();
    refused(&a, "altered");
    bytes[middle] ^= 0x40;
    std::fs::write(snap(&a), &bytes).unwrap();
    assert_eq!(
        cell(&server, &a, "marker")["result"],
        "a",
        "restored, it comes back"
    );
    // Cut short.
    let b = paused_one("b");
    let whole = std::fs::read(snap(&b)).unwrap();
    std::fs::write(snap(&b), &whole[..whole.len() - 7]).unwrap();
    refused(&b, "truncated");
    std::fs::write(snap(&b), &whole).unwrap();
    // Swapped between two sessions of one key: both files, or only the snapshot.
    let c = paused_one("c");
    let d = paused_one("d");
    let (c_snap, d_snap) = (
        std::fs::read(snap(&c)).unwrap(),
        std::fs::read(snap(&d)).unwrap(),
    );
    std::fs::write(snap(&c), &d_snap).unwrap();
    refused(&c, "another session's snapshot");
    std::fs::write(snap(&c), &c_snap).unwrap();
    // Another key's session: its snapshot in this key's session's place.
    let theirs = call_as(
        server.addr,
        OTHER_KEY,
        "POST",
        "/v1/sessions",
        Some(&json!({})),
    );
    let theirs = theirs.json()["id"].as_str().unwrap().to_owned();
    call_as(
        server.addr,
        OTHER_KEY,
        "POST",
        &format!("/v1/sessions/{theirs}/execute"),
        Some(&json!({"code": "marker = 'theirs'"})),
    );
    let r = call_as(
        server.addr,
        OTHER_KEY,
        "POST",
        &format!("/v1/sessions/{theirs}/pause"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    std::fs::copy(snap(&theirs), snap(&d)).unwrap();
    refused(&d, "another key's snapshot");
    std::fs::write(snap(&d), &d_snap).unwrap();
    // Another key cannot resume, read or delete this key's paused session.
    for (method, path) in [
        ("GET", format!("/v1/sessions/{d}")),
        ("POST", format!("/v1/sessions/{d}/resume")),
        ("POST", format!("/v1/sessions/{d}/fork")),
        ("DELETE", format!("/v1/sessions/{d}")),
    ] {
        let r = call_as(server.addr, OTHER_KEY, method, &path, None);
        assert_eq!(r.status, 404, "{method} {path}: {}", r.text());
    }
    // Replayed after its session was deleted: its files copied back are never taken.
    let (d_record, d_bytes) = (
        std::fs::read(dir.join(format!("{d}.json"))).unwrap(),
        std::fs::read(snap(&d)).unwrap(),
    );
    assert_eq!(
        server
            .call("DELETE", &format!("/v1/sessions/{d}"), None)
            .status,
        204
    );
    assert_eq!(
        server
            .call("GET", &format!("/v1/sessions/{d}"), None)
            .status,
        404
    );
    std::fs::write(dir.join(format!("{d}.json")), &d_record).unwrap();
    std::fs::write(snap(&d), &d_bytes).unwrap();
    let dir_kept = server.stop_keeping_state();
    let server = Server::start_in(
        dir_kept,
        &other_key_toml("[volumes]\nmax_bytes_per_key = 50000000\n"),
        &[],
        Some(KEY),
    );
    assert_eq!(
        server
            .call("GET", &format!("/v1/sessions/{d}"), None)
            .status,
        404
    );
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{d}/execute"),
        Some(&json!({"code": "marker"})),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    // The others are still there after the restart.
    assert_eq!(cell(&server, &c, "marker")["result"], "c");

    // Code whose state is past the key's storage: refused at pause, the session running on.
    let big = open(&server, json!({"limits": {"memory_mb": 512}}));
    cell(
        &server,
        &big,
        "import os\nblob = os.urandom(60_000_000)\nkept = 'yes'",
    );
    let r = post(&server, &big, "pause");
    assert_eq!(
        (r.status, r.error_code()),
        (413, "quota_exceeded".into()),
        "{}",
        r.text()
    );
    assert_eq!(
        cell(&server, &big, "[kept, len(blob)]")["result"],
        json!(["yes", 60_000_000])
    );
    assert!(
        files_of(&dir, &big).is_empty(),
        "{:?}",
        files_of(&dir, &big)
    );
    assert!(std::fs::read_dir(server.state_dir().join("sessions"))
        .unwrap()
        .flatten()
        .all(|e| !e.file_name().to_string_lossy().ends_with(".tmp")));
}

#[test]
fn paused_sessions_outlive_a_killed_server_and_idle_ones_pause_by_themselves() {
    let _g = serial();
    let config = "[sessions]\npause_after_idle_ms = 1500\n";
    let server = Server::start(config, &[]);
    let quiet = open(&server, json!({}));
    cell(
        &server,
        &quiet,
        "import numpy as np\nv = np.arange(10) ** 2\nnote = 'quiet'",
    );
    let busy = open(&server, json!({}));
    cell(&server, &busy, "total = sum(range(10))");
    assert_eq!(post(&server, &busy, "pause").status, 200);
    // Left idle, it is paused, not closed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let shown = server
            .call("GET", &format!("/v1/sessions/{quiet}"), None)
            .json();
        if shown["paused"].is_object() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{shown}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let dir = server.kill_keeping_state();

    let server = Server::start_in(dir, config, &[], Some(KEY));
    assert_eq!(
        cell(&server, &quiet, "[v.tolist(), note]")["result"],
        json!([[0, 1, 4, 9, 16, 25, 36, 49, 64, 81], "quiet"])
    );
    assert_eq!(cell(&server, &busy, "total")["result"], 45);
    // A graceful restart too.
    assert_eq!(post(&server, &busy, "pause").status, 200);
    let dir = server.stop_keeping_state();
    let server = Server::start_in(dir, config, &[], Some(KEY));
    assert_eq!(cell(&server, &busy, "total * 2")["result"], 90);
}

/// `sessions.checkpoint = "each_cell"`: an open session's state is kept after each cell, so
/// a killed server brings it back from its last cell (and says which); a session closed for
/// good leaves nothing behind.
#[test]
fn checkpointed_sessions_come_back_from_their_last_cell_after_a_kill() {
    let _g = serial();
    let config = "[sessions]\ncheckpoint = \"each_cell\"\n";
    let server = Server::start(config, &[]);
    let kept = open(&server, json!({}));
    cell(&server, &kept, "import numpy as np\nsteps = ['one']");
    cell(&server, &kept, "steps.append('two')\narr = np.ones(4)");
    // While it is open, it is listed once, open.
    let listed = server.call("GET", "/v1/sessions", None).json();
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1, "{listed}");
    assert!(listed["sessions"][0]["paused"].is_null());
    let closed = open(&server, json!({}));
    cell(&server, &closed, "gone = True");
    assert_eq!(
        server
            .call("DELETE", &format!("/v1/sessions/{closed}"), None)
            .status,
        204
    );
    let dir = server.kill_keeping_state();
    let left = left_of(&dir.join("state/sessions"), &closed);
    assert!(left.is_empty(), "{left:?}");

    let server = Server::start_in(dir, config, &[], Some(KEY));
    let back = cell(
        &server,
        &kept,
        "steps.append('three')\n[steps, arr.tolist()]",
    );
    assert_eq!(
        back["result"],
        json!([["one", "two", "three"], [1.0, 1.0, 1.0, 1.0]])
    );
    // The answer says which cell it came back from.
    assert_eq!(back["resumed"]["cells"], 2, "{back}");
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{closed}/execute"),
        Some(&json!({"code": "gone"})),
    );
    assert_eq!(r.status, 404, "{}", r.text());
}

/// The hostile review's findings: ids that are paths touch nothing; a fork or a pause that
/// fails leaves nothing behind; a snapshot that never ends is cut at its deadline (the
/// session ended); a forged, oversized report is refused (the session ended, nothing kept);
/// volumes and snapshots share the key's storage, also when pauses race; requests that find
/// a session being brought back wait for it rather than answer 404.
#[test]
fn snapshots_hold_up_against_paths_floods_forged_reports_and_races() {
    let _g = serial();
    let config = "[sessions]\nsnapshot_timeout_ms = 3000\nmax_open_per_key = 8\n\
                  [volumes]\nmax_bytes_per_key = 60000000\n";
    let server = Server::start(config, &[]);
    let dir = server.state_dir().join("sessions");
    let leftovers = || -> Vec<String> {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp") || n.ends_with(".lock"))
            .collect()
    };
    // An id that is a path, for each route that takes one.
    for what in ["fork", "pause", "resume"] {
        let r = server.call(
            "POST",
            &format!("/v1/sessions/..%2F..%2F..%2Ftmp%2Fairlock-pwned-{what}/{what}"),
            None,
        );
        assert_eq!(r.status, 404, "{what}: {}", r.text());
        assert!(!std::path::Path::new(&format!("/tmp/airlock-pwned-{what}.lock")).exists());
        assert_eq!(post(&server, "se_nosuchsession", what).status, 404);
    }
    assert!(leftovers().is_empty(), "{:?}", leftovers());

    // A snapshot that never ends: cut at its deadline, the session ended, nothing kept.
    let flood = open(&server, json!({}));
    cell(
        &server,
        &flood,
        "import os\nclass Flood:\n    def __reduce__(self):\n        \
         chunk = b'\\x01\\x00\\x00\\x00X' * 50000\n        \
         while True:\n            os.write(3, chunk)\nflood = Flood()",
    );
    let started = std::time::Instant::now();
    let r = post(&server, &flood, "pause");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.error_code(), "session_ended", "{}", r.text());
    // A forged report, far over what a record may hold: refused, the session ended.
    let forged = open(&server, json!({}));
    cell(
        &server,
        &forged,
        "import os, json, time\nclass Liar:\n    def __reduce__(self):\n        \
         os.write(3, b'\\x00\\x00\\x00\\x00')\n        \
         reply = json.dumps({'result': {'variables': ['v' * 100 + str(i) for i in range(9999)], 'not_kept': {}}}).encode()\n        \
         os.write(3, len(reply).to_bytes(4, 'little') + reply)\n        \
         time.sleep(30)\nliar = Liar()",
    );
    let r = post(&server, &forged, "pause");
    assert_eq!(r.error_code(), "session_ended", "{}", r.text());
    assert_eq!(server.metric("airlock_sessions_paused"), 0.0);
    assert!(leftovers().is_empty(), "{:?}", leftovers());

    // Volumes and snapshots share the key's storage (60 MB): a 30 MB snapshot, then a
    // 32 MiB volume does not fit.
    let big = open(&server, json!({}));
    cell(&server, &big, "import os\nblob = os.urandom(30_000_000)");
    assert_eq!(post(&server, &big, "pause").status, 200);
    let r = server.call(
        "POST",
        "/v1/volumes",
        Some(&json!({"name": "v", "size_bytes": 32 << 20})),
    );
    assert_eq!(r.error_code(), "quota_exceeded", "{}", r.text());
    assert_eq!(
        server
            .call("DELETE", &format!("/v1/sessions/{big}"), None)
            .status,
        204
    );
    // Four pauses of 20 MB at once in 60 MB: never all four.
    let ids: Vec<String> = (0..4)
        .map(|_| {
            let id = open(&server, json!({}));
            cell(&server, &id, "import os\nblob = os.urandom(20_000_000)");
            id
        })
        .collect();
    let addr = server.addr;
    let answers: Vec<u16> = ids
        .iter()
        .map(|id| {
            let path = format!("/v1/sessions/{id}/pause");
            std::thread::spawn(move || call_as(addr, KEY, "POST", &path, None).status)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let kept = answers.iter().filter(|s| **s == 200).count();
    assert!((1..=2).contains(&kept), "{answers:?}");
    assert!(
        answers.iter().all(|s| *s == 200 || *s == 413),
        "{answers:?}"
    );
    assert!(server.metric("airlock_sessions_paused_bytes") <= 60_000_000.0);

    // Three requests at once for one paused session: none is told it is gone.
    let paused: Vec<&String> = ids
        .iter()
        .zip(&answers)
        .filter(|(_, s)| **s == 200)
        .map(|(id, _)| id)
        .collect();
    let id = paused[0].clone();
    let statuses: Vec<u16> = (0..3)
        .map(|_| {
            let path = format!("/v1/sessions/{id}/execute");
            std::thread::spawn(move || {
                call_as(
                    addr,
                    KEY,
                    "POST",
                    &path,
                    Some(&json!({"code": "len(blob)"})),
                )
                .status
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 409),
        "{statuses:?}"
    );
    assert!(leftovers().is_empty(), "{:?}", leftovers());
}

/// Replicas that share `sessions.snapshot_dir`: a session paused by one is brought back by
/// the other (the lock lets only one do it), and is then gone from the directory.
#[test]
fn a_session_paused_by_one_replica_is_resumed_by_another_sharing_the_directory() {
    let _g = serial();
    let shared =
        std::env::temp_dir().join(format!("airlock-shared-snapshots-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&shared);
    let config = format!(
        "[sessions]\nsnapshot_dir = {:?}\n",
        shared.display().to_string()
    );
    let first = Server::start(&config, &[]);
    let second = Server::start(&config, &[]);
    let id = open(&first, json!({}));
    cell(
        &first,
        &id,
        "where = 'first'\nimport numpy as np\nv = np.arange(5)",
    );
    assert_eq!(post(&first, &id, "pause").status, 200);
    // The second replica started before the pause: it finds the session on disk.
    let back = cell(&second, &id, "[where, v.tolist()]");
    assert_eq!(back["result"], json!(["first", [0, 1, 2, 3, 4]]));
    assert!(back["resumed"].is_object(), "{back}");
    assert!(
        files_of(&shared, &id).is_empty(),
        "{:?}",
        files_of(&shared, &id).keys()
    );
    // The first no longer holds it paused.
    let r = post(&first, &id, "resume");
    assert_eq!(r.status, 404, "{}", r.text());
    drop((first, second));
    let _ = std::fs::remove_dir_all(&shared);
}

/// State with a value that pickles but cannot be unpickled: an exception whose `__init__`
/// takes two arguments (`BaseException` pickles its `args`, one string here).
const UNPICKLABLE_BACK: &str = "class Boom(Exception):\n    def __init__(self, a, b):\n        \
     super().__init__(f'{a}-{b}')\nbad = Boom(1, 2)\nholds_bad = [bad, 'x']\ngood = 41\n\
     shared = [1, 2]\nalias = shared\nimport numpy as np\narr = np.arange(4) * 2";

/// What came back of `UNPICKLABLE_BACK`, asked by a cell.
const UNPICKLABLE_CHECK: &str = "['bad' in globals(), 'holds_bad' in globals(), good + 1, \
     alias is shared, arr.tolist(), Boom.__name__]";

fn unpickled_whole_but(resumed: &Value) {
    let not_kept = &resumed["not_kept"];
    for name in ["bad", "holds_bad"] {
        assert!(
            not_kept[name]
                .as_str()
                .is_some_and(|why| why.contains("missing 1 required positional argument")),
            "{name}: {resumed}"
        );
    }
    let variables = resumed["variables"].as_array().unwrap();
    for name in ["good", "shared", "alias", "arr", "Boom", "np"] {
        assert!(variables.contains(&json!(name)), "{name}: {resumed}");
    }
    assert!(!variables.contains(&json!("bad")), "{resumed}");
}

/// One value that cannot be made again loses only the variables that hold it: each is named
/// with why in `resumed.not_kept`, and every other comes back, after a pause asked for and
/// after one the server made of an idle session; later cells, pauses, resumes and forks work.
#[test]
fn a_value_that_cannot_come_back_is_named_and_every_other_comes_back() {
    let _g = serial();
    let config = "[sessions]\npause_after_idle_ms = 3000\n";
    let server = Server::start(config, &[]);
    let expected = json!([false, false, 42, true, [0, 2, 4, 6], "Boom"]);

    // Paused when asked: it pickled, so nothing is named at the pause.
    let asked = open(&server, json!({}));
    cell(&server, &asked, UNPICKLABLE_BACK);
    let paused = post(&server, &asked, "pause");
    assert_eq!(paused.status, 200, "{}", paused.text());
    assert_eq!(paused.json()["paused"]["not_kept"], json!({}));
    // A fork of the paused session, then the session itself, by a cell.
    let forked = post(&server, &asked, "fork");
    assert_eq!(forked.status, 201, "{}", forked.text());
    unpickled_whole_but(&forked.json()["resumed"]);
    let fork = forked.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(cell(&server, &fork, UNPICKLABLE_CHECK)["result"], expected);
    let back = cell(&server, &asked, UNPICKLABLE_CHECK);
    assert_eq!(back["result"], expected, "{back}");
    unpickled_whole_but(&back["resumed"]);
    // It goes on: a cell, a pause and a resume, a fork of it open.
    cell(&server, &asked, "good = good + 1");
    assert_eq!(post(&server, &asked, "pause").status, 200);
    let resumed = post(&server, &asked, "resume");
    assert_eq!(resumed.status, 200, "{}", resumed.text());
    assert_eq!(resumed.json()["resumed"]["not_kept"], json!({}));
    let live_fork = post(&server, &asked, "fork");
    assert_eq!(live_fork.status, 201, "{}", live_fork.text());
    let live_fork = live_fork.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(cell(&server, &live_fork, "good")["result"], 42);

    // Paused by the server, the session idle: the same.
    let idle = open(&server, json!({}));
    cell(&server, &idle, UNPICKLABLE_BACK);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !server
        .call("GET", &format!("/v1/sessions/{idle}"), None)
        .json()["paused"]
        .is_object()
    {
        assert!(std::time::Instant::now() < deadline, "never paused");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let resumed = post(&server, &idle, "resume");
    assert_eq!(resumed.status, 200, "{}", resumed.text());
    unpickled_whole_but(&resumed.json()["resumed"]);
    assert_eq!(cell(&server, &idle, UNPICKLABLE_CHECK)["result"], expected);
}

/// The files of session `id` in the snapshot directory `dir`, by name.
fn files_of(dir: &std::path::Path, id: &str) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{id}.")))
        .filter_map(|n| Some((n.clone(), std::fs::read(dir.join(&n)).ok()?)))
        .collect()
}

/// The files of session `id` left in `dir` but its tombstone.
fn left_of(dir: &std::path::Path, id: &str) -> Vec<String> {
    files_of(dir, id)
        .into_keys()
        .filter(|n| !n.ends_with(".deleted"))
        .collect()
}

/// Asserts that session `id` is gone: a GET, a cell and a resume each answer `status` with
/// `code`.
fn assert_gone(server: &Server, id: &str, status: u16, code: &str) {
    for (method, what) in [("GET", ""), ("POST", "/execute"), ("POST", "/resume")] {
        let r = server.call(
            method,
            &format!("/v1/sessions/{id}{what}"),
            Some(&json!({"code": "print('still here')"})),
        );
        assert_eq!(
            (r.status, r.error_code()),
            (status, code.to_owned()),
            "{id}: {method} {what}: {}",
            r.text()
        );
    }
}

/// The bytes of every file in `dir`, as its file system holds them.
fn bytes_in(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `sessions.checkpoint = "each_cell"`: a DELETE that comes while a cell's checkpoint is
/// being finished (its state all written, the file being synced and kept) wins, whether the
/// session had a checkpoint before or not: after its 204 the session never comes back, not
/// at its next request nor after a restart, and none of its files is left.
#[test]
fn a_delete_racing_a_checkpoint_wins_and_leaves_nothing() {
    let _g = serial();
    let config = "[sessions]\ncheckpoint = \"each_cell\"\nmax_open_per_key = 8\n";
    let server = Server::start(config, &[]);
    let dir = server.state_dir().join("sessions");
    let addr = server.addr;
    const STATE: u64 = 40_000_000;
    let mut deleted = Vec::new();
    for round in 0..6 {
        let id = open(&server, json!({"limits": {"memory_mb": 512}}));
        if round % 2 == 1 {
            // One checkpoint is there already.
            cell(&server, &id, "before = 1");
        }
        let path = format!("/v1/sessions/{id}/execute");
        let code = format!("import os\nsecret = 'round {round}'\nblob = os.urandom({STATE})");
        let running = std::thread::spawn(move || {
            call_as(addr, KEY, "POST", &path, Some(&json!({"code": code})))
        });
        // The new snapshot holds the whole state: its stream is over, it is being kept.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let written = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with(&format!("{id}.")) && n.contains(".snap")
                })
                .any(|e| e.metadata().is_ok_and(|m| m.len() >= STATE));
            if written {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: no checkpoint"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let r = server.call("DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(r.status, 204, "round {round}: {}", r.text());
        let _ = running.join().unwrap();
        assert_gone(&server, &id, 404, "not_found");
        assert!(
            left_of(&dir, &id).is_empty(),
            "round {round}: {:?}",
            left_of(&dir, &id)
        );
        deleted.push(id);
    }
    let state = server.kill_keeping_state();
    let server = Server::start_in(state, config, &[], Some(KEY));
    for id in &deleted {
        assert_gone(&server, id, 404, "not_found");
        assert!(
            left_of(&dir, id).is_empty(),
            "{id}: {:?}",
            left_of(&dir, id)
        );
    }
    assert_eq!(server.metric("airlock_sessions_paused"), 0.0);
}

/// `sessions.checkpoint = "each_cell"`: a session its code ends (`sys.exit`) has its
/// checkpoint removed at once; after a restart it is gone like any session the server held
/// when it stopped (410 `session_lost`), never paused, never resumed.
#[test]
fn a_session_its_code_ended_leaves_no_checkpoint_to_come_back_from() {
    let _g = serial();
    let config = "[sessions]\ncheckpoint = \"each_cell\"\n";
    let server = Server::start(config, &[]);
    let dir = server.state_dir().join("sessions");
    let id = open(&server, json!({}));
    cell(&server, &id, "kept = 'before the end'");
    assert!(!files_of(&dir, &id).is_empty(), "a checkpoint is kept");
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(&json!({"code": "import sys\nsys.exit(0)"})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["session_ended"], true, "{}", r.text());
    assert!(left_of(&dir, &id).is_empty(), "{:?}", left_of(&dir, &id));
    let shown = server
        .call("GET", &format!("/v1/sessions/{id}"), None)
        .json();
    assert!(shown["paused"].is_null(), "{shown}");
    assert_eq!(server.metric("airlock_sessions_paused"), 0.0);

    let state = server.kill_keeping_state();
    let server = Server::start_in(state, config, &[], Some(KEY));
    assert_gone(&server, &id, 410, "session_lost");
    // A fork finds nothing to fork, as of any session it does not hold.
    assert_eq!(post(&server, &id, "fork").status, 404);
    assert!(server.call("GET", "/v1/sessions", None).json()["sessions"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// A server killed while it kept a newer snapshot of a session (the new snapshot on disk,
/// the record still the one before) brings the session back as it was at the one before;
/// at start, snapshots no record names and stale locks are removed.
#[test]
fn a_kill_between_a_snapshot_and_its_record_keeps_the_snapshot_before() {
    let _g = serial();
    let server = Server::start("", &[]);
    let dir = server.state_dir().join("sessions");
    let id = open(&server, json!({}));
    cell(&server, &id, "marker = 'before'");
    assert_eq!(post(&server, &id, "pause").status, 200);
    let before = files_of(&dir, &id);
    cell(&server, &id, "marker = 'after'");
    assert_eq!(post(&server, &id, "pause").status, 200);
    let after = files_of(&dir, &id);
    let state = server.kill_keeping_state();

    // What a kill -9 leaves once the new snapshot is written where it goes and before its
    // record is: the files before, the new snapshot over them.
    for name in files_of(&dir, &id).keys() {
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    for (name, bytes) in before
        .iter()
        .chain(after.iter().filter(|(n, _)| n.contains(".snap")))
    {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    // Locks nobody holds, and a snapshot no record names.
    for name in [format!("{id}.lock"), "se_stalelock0000.lock".into()] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    std::fs::write(dir.join("se_orphan0000.snap"), b"no record names it").unwrap();

    let server = Server::start_in(state, "", &[], Some(KEY));
    let named: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let back = cell(&server, &id, "marker");
    assert_eq!(back["result"], "before", "{back}");
    assert_eq!(back["resumed"]["cells"], 1, "{back}");
    assert!(
        !named
            .iter()
            .any(|n| n.ends_with(".lock") || n.starts_with("se_orphan")),
        "{named:?}"
    );
    // One snapshot of the session was left: the one its record named.
    let snapshots = named
        .iter()
        .filter(|n| n.starts_with(&id) && n.contains(".snap"))
        .count();
    assert_eq!(snapshots, 1, "{named:?}");
}

/// A deleted session's tombstone keeps its files, copied back, from being taken while they
/// could matter (while the session could still be kept somewhere, and while a copy of its
/// record would still be within its retention), then goes: tombstones do not pile up, and
/// a record copied back later is past its retention, and never taken either.
#[test]
fn tombstones_last_while_they_matter_and_then_go() {
    let _g = serial();
    let config = "[sessions]\npaused_retention_ms = 4000\nmax_lifetime_ms = 2000\n\
                  snapshot_timeout_ms = 1000\n";
    let server = Server::start(config, &[]);
    let dir = server.state_dir().join("sessions");
    let id = open(&server, json!({}));
    cell(&server, &id, "marker = 'deleted'");
    assert_eq!(post(&server, &id, "pause").status, 200);
    let kept = files_of(&dir, &id);
    assert_eq!(
        server
            .call("DELETE", &format!("/v1/sessions/{id}"), None)
            .status,
        204
    );
    let tombstone = dir.join(format!("{id}.deleted"));
    assert!(tombstone.exists());
    let copy_back = || {
        for (name, bytes) in &kept {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    };
    copy_back();
    let gone = |server: &Server| assert_gone(server, &id, 404, "not_found");
    gone(&server);
    // Then it goes, with what was copied back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tombstone.exists() {
        assert!(std::time::Instant::now() < deadline, "the tombstone stays");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        files_of(&dir, &id).is_empty(),
        "{:?}",
        files_of(&dir, &id).keys()
    );
    // A copy now is past its retention.
    copy_back();
    gone(&server);
    let state = server.stop_keeping_state();
    let server = Server::start_in(state, config, &[], Some(KEY));
    gone(&server);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !files_of(&dir, &id).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            files_of(&dir, &id).keys()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Pauses and a fork at once near a small quota: each holds its bytes of the key's storage
/// before it writes them (a fork's snapshot, which it only reads back, too), so the
/// snapshot directory never holds more than the quota, and those that do not fit are
/// refused with 413 `quota_exceeded`, their sessions running on.
#[test]
fn concurrent_pauses_and_forks_never_hold_more_than_the_quota() {
    let _g = serial();
    const QUOTA: u64 = 50_000_000;
    let config =
        format!("[sessions]\nmax_open_per_key = 8\n[volumes]\nmax_bytes_per_key = {QUOTA}\n");
    let server = Server::start(&config, &[]);
    let dir = server.state_dir().join("sessions");
    let addr = server.addr;
    for round in 0..2 {
        let ids: Vec<String> = (0..4)
            .map(|_| {
                let id = open(&server, json!({"limits": {"memory_mb": 512}}));
                cell(
                    &server,
                    &id,
                    "import os\nblob = os.urandom(24_000_000)\nmine = 'yes'",
                );
                id
            })
            .collect();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (dir, done) = (dir.clone(), done.clone());
            std::thread::spawn(move || {
                let mut most = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    most = most.max(bytes_in(&dir));
                }
                most
            })
        };
        let answers: Vec<(String, common::http::Response)> = ids
            .iter()
            .zip(["pause", "pause", "pause", "fork"])
            .map(|(id, what)| {
                let path = format!("/v1/sessions/{id}/{what}");
                let id = id.clone();
                std::thread::spawn(move || (id, call_as(addr, KEY, "POST", &path, None)))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        done.store(true, std::sync::atomic::Ordering::Release);
        let most = sampler.join().unwrap();
        assert!(
            most <= QUOTA,
            "round {round}: {most} bytes stored, over {QUOTA}"
        );
        for (id, r) in &answers {
            match r.status {
                200 | 201 => {}
                413 => {
                    assert_eq!(r.error_code(), "quota_exceeded", "{}", r.text());
                    assert_eq!(cell(&server, id, "mine")["result"], "yes");
                }
                _ => panic!("round {round}: {}", r.text()),
            }
        }
        // Three pauses of 24 MB never all fit in 50 MB.
        assert!(
            answers[..3].iter().any(|(_, r)| r.status == 413),
            "round {round}: all fit"
        );
        // Room again for the next round.
        for (id, r) in &answers {
            let _ = server.call("DELETE", &format!("/v1/sessions/{id}"), None);
            if r.status == 201 {
                let fork = r.json()["id"].as_str().unwrap().to_owned();
                let _ = server.call("DELETE", &format!("/v1/sessions/{fork}"), None);
            }
        }
        assert!(
            bytes_in(&dir) < 1_000_000,
            "round {round}: {}",
            bytes_in(&dir)
        );
    }
}

/// `airlock volume` on `server`'s state directory and configuration, as its key, run by
/// `wrapper` (strace, say) when one is given.
fn volume_cli(server: &Server, wrapper: &[&str]) -> std::process::Command {
    let state = server.state_dir();
    let config = state.parent().unwrap().join("airlock.toml");
    let mut cmd = match wrapper {
        [] => airlock(),
        [first, rest @ ..] => {
            let mut cmd = std::process::Command::new(first);
            cmd.args(rest).arg(env!("CARGO_BIN_EXE_airlock"));
            cmd
        }
    };
    cmd.arg("volume")
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state)
        .env("AIRLOCK_API_KEY", KEY)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// `airlock volume create NAME --size SIZE` beside `server`: its exit code and stderr.
fn cli_create(server: &Server, name: &str, size: &str) -> (Option<i32>, String) {
    let out = volume_cli(server, &[])
        .args(["create", name, "--size", size])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The names in `dir` now (none if it is gone).
fn names_in(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Until `done`, every name that appears in `dir` beyond `before` (claims' `.lock` files
/// aside), however briefly.
fn watch_names(
    dir: std::path::PathBuf,
    before: std::collections::BTreeSet<String>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<std::collections::BTreeSet<String>> {
    std::thread::spawn(move || {
        let mut seen = std::collections::BTreeSet::new();
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            for name in names_in(&dir) {
                if !before.contains(&name) && !name.ends_with(".lock") {
                    seen.insert(name);
                }
            }
        }
        seen
    })
}

/// An `airlock volume create` held by strace where its image is about to be sized (its first
/// `ftruncate`, after the key's quota was counted), stopped there until [`Stopped::resume`];
/// killed if dropped before.
struct Stopped {
    strace: Option<std::process::Child>,
    pid: i32,
}

impl Stopped {
    fn create(server: &Server, name: &str, size: &str) -> Stopped {
        let trace = server.state_dir().parent().unwrap().join("cli.strace");
        let trace_arg = trace.to_string_lossy().into_owned();
        let mut cmd = volume_cli(
            server,
            &[
                "strace",
                "-f",
                "-o",
                &trace_arg,
                "-e",
                "trace=ftruncate",
                "-e",
                "inject=ftruncate:signal=STOP:when=1",
            ],
        );
        let strace = cmd
            .args(["create", name, "--size", size])
            .spawn()
            .expect("strace, to stop the CLI at a chosen system call");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut stopped = Stopped {
            pid: 0,
            strace: Some(strace),
        };
        loop {
            let said = std::fs::read_to_string(&trace).unwrap_or_default();
            if let Some(line) = said.lines().find(|l| l.contains("stopped by SIGSTOP")) {
                stopped.pid = line.split_whitespace().next().unwrap().parse().unwrap();
                return stopped;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the CLI never reached its image: {said}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Lets it go on; its exit code and stderr.
    fn resume(mut self) -> (Option<i32>, String) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGCONT,
        )
        .unwrap();
        let out = self.strace.take().unwrap().wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(mut strace) = self.strace.take() {
            if self.pid > 0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = strace.kill();
            let _ = strace.wait();
        }
    }
}

/// A volume being made by `airlock volume create` beside the server holds its bytes of the
/// key's storage before its image is made: a pause, a fork and a cell's checkpoint that find
/// no room beside it are refused before anything of their snapshots is written (no file of
/// theirs appears, not even for a moment), their sessions running on as they were; the
/// volume is made once its maker goes on.
#[test]
fn a_snapshot_without_room_beside_a_volume_being_made_writes_no_file() {
    let _g = serial();
    let config = format!(
        "[sessions]\nmax_open_per_key = 8\ncheckpoint = \"each_cell\"\n\
         [volumes]\nmax_bytes_per_key = {}\n",
        48u64 << 20
    );
    let server = Server::start(&config, &[]);
    let dir = server.state_dir().join("sessions");
    let a = open(&server, json!({}));
    cell(&server, &a, "mine = 'a'");
    let b = open(&server, json!({}));
    cell(&server, &b, "mine = 'b'");
    // Their checkpoints take a few KB of the 48 MiB: 47 MiB more fit, a snapshot's record
    // (1 MiB held before anything is written) beside them no longer does.
    let before = names_in(&dir);
    let making = Stopped::create(&server, "v", "47M");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = watch_names(dir.clone(), before.clone(), done.clone());
    let r = post(&server, &a, "pause");
    assert_eq!(
        (r.status, r.error_code()),
        (413, "quota_exceeded".into()),
        "a pause beside a volume being made: {}",
        r.text()
    );
    let r = post(&server, &a, "fork");
    assert_eq!(
        (r.status, r.error_code()),
        (413, "quota_exceeded".into()),
        "a fork beside a volume being made: {}",
        r.text()
    );
    // Each cell's checkpoint finds no room either; the one before stays.
    assert_eq!(cell(&server, &a, "mine")["result"], "a");
    assert_eq!(cell(&server, &b, "mine")["result"], "b");
    done.store(true, std::sync::atomic::Ordering::Release);
    let appeared = watch.join().unwrap();
    assert!(appeared.is_empty(), "written before refused: {appeared:?}");
    let now: std::collections::BTreeSet<String> = names_in(&dir)
        .into_iter()
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert_eq!(now, before);
    let (code, err) = making.resume();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(server.call("GET", "/v1/volumes/v", None).status, 200);
}

/// A fork's snapshot of an open session, written while its new session is made and removed
/// once read back, counts against the key's storage from its first byte to its removal, for
/// every process that counts that storage: `airlock volume create` beside the server is
/// refused while the volume would not fit beside it, and fits once the fork is done.
#[test]
fn a_fork_s_snapshot_counts_against_its_key_for_the_cli_while_it_is_written() {
    let _g = serial();
    let config = "[sessions]\nmax_open_per_key = 8\n[volumes]\nmax_bytes_per_key = 60000000\n";
    let server = Server::start(config, &[]);
    let dir = server.state_dir().join("sessions");
    // The session waits for the test's go-ahead, read from a volume of the key's (8 MiB of
    // its 60 MB), while its snapshot is being written: its 30 MB of files first, then its
    // variables, whose pickling waits.
    let r = server.call(
        "POST",
        "/v1/volumes",
        Some(&json!({"name": "flag", "size_bytes": 8 << 20})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let id = open(
        &server,
        json!({"limits": {"memory_mb": 512},
               "volumes": [{"name": "flag", "path": "/work/flag", "read_only": true}]}),
    );
    cell(
        &server,
        &id,
        "import os, time\nopen('/work/big', 'wb').write(os.urandom(30_000_000))\n\
         class Wait:\n    def __reduce__(self):\n        deadline = time.time() + 120\n        \
         while not os.path.exists('/work/flag/go') and time.time() < deadline:\n            \
         time.sleep(0.05)\n        return (int, ())\nwait = Wait()",
    );
    let fork = {
        let (addr, path) = (server.addr, format!("/v1/sessions/{id}/fork"));
        std::thread::spawn(move || call_as(addr, KEY, "POST", &path, None))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_dir(&dir).unwrap().flatten().any(|e| {
        e.file_name().to_string_lossy().ends_with(".snap.tmp")
            && e.metadata().is_ok_and(|m| m.len() >= 25_000_000)
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the fork's snapshot never reached 25 MB"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (code, err) = cli_create(&server, "v", "32M");
    assert_eq!(
        code,
        Some(2),
        "made beside a fork's 30 MB being written: {err}"
    );
    assert!(err.contains("max_bytes_per_key"), "{err}");
    let go = common::http::request(
        server.addr,
        "PUT",
        "/v1/volumes/flag/files/go",
        &[("Authorization".into(), format!("Bearer {KEY}"))],
        Some(b"go"),
    );
    assert_eq!(go.status, 204, "{}", go.text());
    let r = fork.join().unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    // Removed once read back: the room is there again.
    assert!(!names_in(&dir).iter().any(|n| n.ends_with(".tmp")));
    let (code, err) = cli_create(&server, "v", "32M");
    assert_eq!(code, Some(0), "{err}");
}
