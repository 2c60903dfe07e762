//! Named environments through the real server and CLI, built by real pip from a local package
//! index on loopback (`make_index.py`, served by `python3 -m http.server`), and once from the
//! real package index: built inside a sandbox whose only egress is the index, stored sealed,
//! mounted read-only, refused when unknown or tampered with; a hostile package's build code
//! gains nothing; `pip install` in a session lands in the session's own scratch.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::http::{call_as, request, Response, Server};
use common::key_hash as hash;
use common::scratch_dir;
use serde_json::{json, Value};

const ADMIN: &str = "admin-key-0123456789abcdef";
const USER: &str = "user-key-0123456789abcdef";

/// `python3 -m http.server` over a directory, on a free loopback port.
struct Served {
    child: Child,
    port: u16,
}

impl Served {
    fn start(dir: &Path) -> Served {
        let mut child = Command::new("/usr/bin/python3")
            .args([
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        let port = line
            .split_whitespace()
            .skip_while(|w| *w != "port")
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        Served { child, port }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The local index (`make_index.py`), served; `other` is a port the hostile build tries.
fn local_index(dir: &Path, state_dir: &Path, other: u16, sleep_s: f64) -> Served {
    let made = Command::new("/usr/bin/python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/make_index.py"))
        .arg(dir)
        .arg(state_dir)
        .arg(other.to_string())
        .arg(sleep_s.to_string())
        .arg(state_dir.join("victim"))
        .status()
        .unwrap();
    assert!(made.success());
    Served::start(dir)
}

/// Builds from the index on `port`; the user key may also reach it (pip in a session).
fn config(port: u16) -> String {
    format!(
        r#"
[environments.build]
index_url = "http://127.0.0.1:{port}/simple/"
egress = {{ ranges = [{{ cidr = "127.0.0.1/32", ports = [{port}] }}] }}
timeout_ms = 120000

[[keys]]
name = "admin"
hash = "{admin}"
scopes = ["execute", "read", "metrics", "admin"]

[[keys]]
name = "user"
hash = "{user}"
egress = {{ ranges = [{{ cidr = "127.0.0.1/32", ports = [{port}] }}] }}
"#,
        admin = hash(ADMIN),
        user = hash(USER),
    )
}

fn call(server: &Server, key: &str, method: &str, path: &str, body: Option<&Value>) -> Response {
    call_as(server.addr, key, method, path, body)
}

fn create(server: &Server, key: &str, name: &str, requirements: &[&str]) -> Response {
    create_at(server.addr, key, name, requirements)
}

fn create_at(addr: std::net::SocketAddr, key: &str, name: &str, requirements: &[&str]) -> Response {
    call_as(
        addr,
        key,
        "POST",
        "/v1/environments",
        Some(&json!({"name": name, "requirements": requirements})),
    )
}

/// Runs as the admin key, which has no egress (an execution with egress starts cold).
fn execute(server: &Server, body: Value) -> Value {
    let r = call(server, ADMIN, "POST", "/v1/execute", Some(&body));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_environment_is_built_in_a_sandbox_and_mounted_read_only() {
    let _serial = common::serial();
    let dir = scratch_dir("build");
    let index = local_index(&dir.join("index"), &dir, 9, 0.0);
    // With the warm pool on: an environment in demand gets a pool of its own.
    let server = Server::start(&format!("[pool]\nsize = 1\n{}", config(index.port)), &[]);

    // Building needs the admin scope.
    let r = create(&server, USER, "tiny", &["tinyenv-pkg==1.0"]);
    assert_eq!(r.status, 403, "{}", r.text());
    let r = create(&server, ADMIN, "tiny", &["tinyenv-pkg==1.0"]);
    assert_eq!(r.status, 201, "{}", r.text());
    let built = r.json();
    assert_eq!(built["built"], true);
    assert_eq!(built["packages"], json!(["tinyenv_pkg==1.0"]));
    assert!(
        built["log_tail"]
            .to_string()
            .contains("Successfully installed tinyenv-pkg-1.0"),
        "{built:#}"
    );
    // The same requirements under another name reuse the stored build.
    let again = create(&server, ADMIN, "tiny2", &["tinyenv-pkg==1.0"]).json();
    assert_eq!(
        (&again["built"], &again["hash"]),
        (&json!(false), &built["hash"])
    );
    let listed = call(&server, USER, "GET", "/v1/environments", None).json();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["tiny", "tiny2"]);
    // The operator's, no key's: counted server-wide, each stored build once.
    let stored = || -> f64 {
        let text = call(&server, ADMIN, "GET", "/metrics", None).text();
        text.lines()
            .find_map(|l| l.strip_prefix("airlock_environments_stored_bytes "))
            .map_or(-1.0, |v| v.trim().parse().unwrap())
    };
    let size = built["size_bytes"].as_f64().unwrap();
    assert!(size > 0.0, "{built:#}");
    assert_eq!(stored(), size);

    // Named by a request: importable, first on the path, and read-only.
    let code = "import errno, sys, tinyenv_pkg\ntry:\n    open('/env/planted.py', 'w'); w = 'wrote'\nexcept OSError as e:\n    w = errno.errorcode[e.errno]\n[tinyenv_pkg.VALUE, tinyenv_pkg.__file__, w, sys.prefix]";
    let r = execute(&server, json!({"code": code, "environment": "tiny"}));
    assert_eq!(r["status"], "ok", "{r:#}");
    assert_eq!(r["result"][0], 42);
    assert_eq!(
        r["result"][1],
        "/env/lib/python3.11/site-packages/tinyenv_pkg/__init__.py"
    );
    assert_eq!(r["result"][2], "EROFS");
    // That first execution started the environment's pool; the next one takes from it.
    let hash = built["hash"].as_str().unwrap();
    let metric = |name: &str| -> f64 {
        let text = call(&server, ADMIN, "GET", "/metrics", None).text();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    };
    let idle = format!("airlock_environment_pool_idle_sandboxes{{hash=\"{hash}\"}}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while metric(&idle) < 1.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pooled = execute(&server, json!({"code": code, "environment": "tiny"}));
    assert_eq!(pooled["result"], r["result"], "{pooled:#}");
    let takes = format!("airlock_environment_pool_takes_total{{hash=\"{hash}\"}}");
    assert_eq!(
        metric(&takes),
        1.0,
        "{}",
        call(&server, ADMIN, "GET", "/metrics", None).text()
    );
    // The MCP tools take it as an argument, and list the environments there are.
    let mcp = |body: Value| {
        let headers = vec![
            ("Authorization".to_owned(), format!("Bearer {ADMIN}")),
            ("Content-Type".to_owned(), "application/json".to_owned()),
            (
                "Accept".to_owned(),
                "application/json, text/event-stream".to_owned(),
            ),
        ];
        let body = serde_json::to_vec(&body).unwrap();
        request(server.addr, "POST", "/mcp", &headers, Some(&body)).json()
    };
    let listed = mcp(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
    assert!(
        listed.to_string().contains(
            "Named environments with more packages (the environment argument): tiny, tiny2."
        ),
        "{listed:#}"
    );
    let called = mcp(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_python",
        "arguments": {"code": "import tinyenv_pkg\ntinyenv_pkg.VALUE", "environment": "tiny"}}}),
    );
    assert!(
        called["result"]["content"]
            .to_string()
            .contains("result: 42"),
        "{called:#}"
    );
    // Without it, the package does not exist.
    let r = execute(&server, json!({"code": "import tinyenv_pkg"}));
    assert_eq!(r["error"]["type"], "ModuleNotFoundError", "{r:#}");
    // A session names one too.
    let s = call(
        &server,
        USER,
        "POST",
        "/v1/sessions",
        Some(&json!({"environment": "tiny"})),
    );
    assert_eq!(s.status, 201, "{}", s.text());
    let id = s.json()["id"].as_str().unwrap().to_owned();
    let cell = call(
        &server,
        USER,
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(&json!({"code": "import tinyenv_pkg\ntinyenv_pkg.VALUE"})),
    )
    .json();
    assert_eq!(cell["result"], 42, "{cell:#}");

    // Unknown: a 400 naming it.
    let r = call(
        &server,
        USER,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "1", "environment": "nonesuch"})),
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("nonesuch"), "{}", r.text());

    // Deleted: gone for new requests; the stored tree stays while another name uses it.
    let store = server.state_dir().join("environments/store");
    assert_eq!(
        call(&server, USER, "DELETE", "/v1/environments/tiny", None).status,
        403
    );
    assert_eq!(
        call(&server, ADMIN, "DELETE", "/v1/environments/tiny", None).status,
        204
    );
    assert_eq!(
        call(&server, USER, "GET", "/v1/environments/tiny", None).status,
        404
    );
    assert_eq!(entries(&store).len(), 1);
    assert_eq!(stored(), size);
    assert_eq!(
        call(&server, ADMIN, "DELETE", "/v1/environments/tiny2", None).status,
        204
    );
    assert!(entries(&store).is_empty());
    assert_eq!(stored(), 0.0);
    let r = call(
        &server,
        USER,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "1", "environment": "tiny"})),
    );
    assert_eq!(r.status, 400);
}

#[test]
fn hostile_builds_gain_nothing_and_broken_or_tampered_environments_are_never_used() {
    let _serial = common::serial();
    let dir = scratch_dir("hostile");
    let other = Served::start(&dir);
    let index = local_index(&dir.join("index"), &dir, other.port, 3.0);
    let server = Server::start(&config(index.port), &[]);

    // Two builds of one name at once: one builds, the other is told so; nothing mixes.
    let addr = server.addr;
    let (a, b) = std::thread::scope(|s| {
        let first = s.spawn(|| create_at(addr, ADMIN, "evil", &["evilpkg==1.0"]));
        std::thread::sleep(std::time::Duration::from_millis(1000));
        let second = s.spawn(|| create_at(addr, ADMIN, "evil", &["evilpkg==1.0", "tinyenv-pkg"]));
        (first.join().unwrap(), second.join().unwrap())
    });
    assert_eq!(a.status, 201, "{}", a.text());
    assert_eq!(b.status, 409, "{}", b.text());
    let info = call(&server, USER, "GET", "/v1/environments/evil", None).json();
    assert_eq!(info["requirements"], json!(["evilpkg==1.0"]));

    // What the package's setup.py saw while pip built it: none of the host, the sandbox's
    // uid, no way around the proxy, and the proxy refusing everything but the index.
    let r = execute(
        &server,
        json!({"code": "import evilpkg.report\nevilpkg.report.REPORT", "environment": "evil"}),
    );
    let report = &r["result"];
    assert_eq!(report["uid"], 1000, "{r:#}");
    assert_eq!(report["/etc/shadow"], "ENOENT");
    assert_eq!(report["/root"], "ENOENT");
    assert_eq!(report[dir.to_str().unwrap()], "ENOENT");
    assert_eq!(report["/proc/1/environ"], "EACCES");
    assert_eq!(report["direct"], "EACCES");
    assert!(
        report["proxy"].as_str().unwrap().contains("403"),
        "{report}"
    );
    // ... and its connections are in the audit log under the build.
    let audit = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    let builds: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "egress" && v["key"] == "environment-build")
        .collect();
    assert!(
        builds.iter().any(|l| l["outcome"] == "allowed"),
        "{builds:#?}"
    );
    assert!(
        builds
            .iter()
            .any(|l| l["outcome"] == "denied" && l["host"] == "localhost"),
        "{builds:#?}"
    );

    // A build that fails leaves no name, no stored tree, no build directory.
    let envs = server.state_dir().join("environments");
    let stored_before = entries(&envs.join("store")).len();
    let r = create(&server, ADMIN, "broken", &["no-such-package==9"]);
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("log"), "{}", r.text());
    assert_eq!(
        call(&server, USER, "GET", "/v1/environments/broken", None).status,
        404
    );
    assert_eq!(entries(&envs.join("store")).len(), stored_before);
    assert!(entries(&envs.join("builds")).is_empty());

    // A build that plants a link where airlock writes its manifest (root would write through
    // it) and a sparse file fails, and the link's target is untouched.
    let victim = dir.join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    let r = create(&server, ADMIN, "plant", &["plantpkg==1.0"]);
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        r.text()
            .contains("left an entry named airlock-environment.json"),
        "{}",
        r.text()
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    assert!(entries(&envs.join("builds")).is_empty());

    // Requirements that are not requirements are refused before anything runs.
    for bad in [
        "--index-url http://evil.example/simple",
        "pkg @ https://evil.example/x.whl",
        "../x",
    ] {
        let r = create(&server, ADMIN, "bad", &[bad]);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }

    // A stored tree changed behind airlock's back is refused by a server that has not used
    // it yet.
    let hash = info["hash"].as_str().unwrap();
    let report = envs.join(format!(
        "store/{hash}/lib/python3.11/site-packages/evilpkg/report.py"
    ));
    let stopped = server.stop_keeping_state();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&report, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&report, "REPORT = 'planted'\n").unwrap();
    let server = Server::start_in(stopped, &config(index.port), &[], None);
    let r = call(
        &server,
        USER,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "import evilpkg.report", "environment": "evil"})),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("changed since it was built"),
        "{}",
        r.text()
    );
}

/// Issue 45: with `disk_mb = 64`, a package whose setup.py writes 8 x 60 MiB into `/env` wrote
/// it all onto the state directory's file system before the size was checked. The build's
/// file system now stops it while it writes: the build fails (ENOSPC), and the state
/// directory's file system (a tmpfs of its own here, so that nothing else writes to it) never
/// loses more than `disk_mb` and a little, sampled all through the build.
#[test]
fn a_build_that_writes_past_disk_mb_fails_and_never_fills_the_host_s_disk() {
    const MIB: u64 = 1 << 20;
    let _serial = common::serial();
    let dir = scratch_dir("hog");
    let index = local_index(&dir.join("index"), &dir, 9, 0.0);
    let tmpfs = common::TmpfsState::mount("hog", "1g");
    let (base, state) = (tmpfs.base.clone(), tmpfs.state.clone());
    let config =
        config(index.port).replace("timeout_ms = 120000", "timeout_ms = 120000\ndisk_mb = 64");
    // Under the systemd unit's umask: what the build leaves must still be readable.
    let umask = ["sh", "-c", "umask 077 && exec \"$0\" \"$@\""];
    let server = Server::start_under(&umask, base.clone(), &config, &[], None);

    let free = || {
        let st = nix::sys::statvfs::statvfs(&state).unwrap();
        st.blocks_available() as u64 * st.fragment_size() as u64
    };
    let before = free();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (r, least) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut least = u64::MAX;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                least = least.min(free());
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            least.min(free())
        });
        let r = create(&server, ADMIN, "hog", &["hogpkg==1.0"]);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (r, sampler.join().unwrap())
    });
    let lost = before.saturating_sub(least);
    eprintln!(
        "the state directory lost at most {} KiB during the build",
        lost / 1024
    );
    assert!(
        lost <= 64 * MIB + 8 * MIB,
        "the state directory's file system lost {} MiB during the build ({})",
        lost / MIB,
        r.text()
    );
    assert_eq!(r.status, 422, "{}", r.text());
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("ran out of space (No space left on device)")
            && message.contains("64 MiB each"),
        "{message}"
    );
    let logs = state.join("environments/logs");
    let log: String = entries(&logs)
        .iter()
        .map(|f| std::fs::read_to_string(logs.join(f)).unwrap())
        .collect();
    assert!(log.contains("No space left on device"), "{log}");
    // Nothing of it is left: no name, no stored tree, no build, and no more space taken.
    assert_eq!(
        call(&server, USER, "GET", "/v1/environments/hog", None).status,
        404
    );
    for sub in ["builds", "store"] {
        assert!(
            entries(&state.join("environments").join(sub)).is_empty(),
            "{sub}"
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while before.saturating_sub(free()) > MIB && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        before.saturating_sub(free()) <= MIB,
        "the build's image outlived it"
    );
    // A build of the same size that fits still succeeds, and checks out in a server that did
    // not build it (its digest is the stored tree's).
    let r = create(&server, ADMIN, "tiny", &["tinyenv-pkg==1.0"]);
    assert_eq!(r.status, 201, "{}", r.text());
    let stopped = server.stop_keeping_state();
    let server = Server::start_in(stopped, &config, &[], None);
    let r = execute(
        &server,
        json!({"code": "import tinyenv_pkg\ntinyenv_pkg.VALUE", "environment": "tiny"}),
    );
    assert_eq!(r["result"], 42, "{r:#}");
}

/// Issue 45: requirement lines carrying pip options (even after a marker) or naming a file
/// reached pip. The server answers 400 naming the line, and `airlock env create` exits 2
/// naming it, before any build starts.
#[test]
fn requirement_lines_that_are_not_pep_508_requirements_are_refused() {
    let _serial = common::serial();
    let dir = scratch_dir("refused");
    let server = Server::start(&config(9), &[]);
    let state = dir.join("state");
    for bad in [
        "tinypkg --global-option=--verbose --install-option=--no-compile",
        "pkg;os_name==\"posix\" -i x",
        "x.whl",
        "pkg @ https://evil.example/x.whl",
        "--index-url http://evil.example/simple",
    ] {
        let r = create(&server, ADMIN, "bad", &["tinyenv-pkg", bad]);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains(&format!("requirement {bad:?}")),
            "{bad}: {message}"
        );
        let file = dir.join("requirements.txt");
        std::fs::write(&file, format!("tinyenv-pkg\n{bad}\n")).unwrap();
        let out = common::airlock()
            .args(["env", "create", "bad", "-r"])
            .arg(&file)
            .arg("--state-dir")
            .arg(&state)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(
            stderr.contains(&format!("requirement {bad:?}")),
            "{bad}: {stderr}"
        );
    }
    // Nothing was built, or even logged.
    let envs = server.state_dir().join("environments");
    for sub in ["builds", "logs", "store"] {
        assert!(entries(&envs.join(sub)).is_empty(), "{sub}");
        assert!(
            entries(&state.join("environments").join(sub)).is_empty(),
            "{sub}"
        );
    }
}

#[test]
fn pip_install_in_a_session_is_importable_in_the_next_cell() {
    let _serial = common::serial();
    let dir = scratch_dir("session");
    let index = local_index(&dir.join("index"), &dir, 9, 0.0);
    // The config also defines an environment, which the server builds at start.
    let config = format!(
        "{}\n[environments.define]\ndefined = [\"tinyenv-pkg==1.0\"]\n",
        config(index.port)
    );
    let server = Server::start(&config, &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let r = call(&server, USER, "GET", "/v1/environments/defined", None);
        if r.status == 200 {
            assert_eq!(r.json()["packages"], json!(["tinyenv_pkg==1.0"]));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never built: {}",
            r.text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let s = call(&server, USER, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(s.status, 201, "{}", s.text());
    let id = s.json()["id"].as_str().unwrap().to_owned();
    let cell = |code: &str| {
        call(
            &server,
            USER,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(&json!({ "code": code })),
        )
        .json()
    };
    let install = cell(&format!(
        "import subprocess, sys\np = subprocess.run([sys.executable, '-m', 'pip', 'install', '--index-url', 'http://127.0.0.1:{}/simple/', 'sessionpkg'], capture_output=True, text=True)\n[p.returncode, p.stdout[-300:], p.stderr[-600:]]",
        index.port
    ));
    assert_eq!(install["result"][0], 0, "{install:#}");
    let used = cell("import os, sessionpkg\n[sessionpkg.VALUE, sessionpkg.__file__, os.statvfs('/tmp').f_bfree < os.statvfs('/tmp').f_blocks]");
    assert_eq!(
        used["result"],
        json!([
            "installed in a session",
            "/tmp/packages/sessionpkg/__init__.py",
            true
        ]),
        "{used:#}"
    );
    assert!(used["usage"]["egress"]["connections"] == 0);
}

/// `airlock env ARGS` on the state directory `state`, with a configuration file if given.
fn env_cli(args: &[&str], state: &Path, config: Option<&Path>) -> std::process::Output {
    let mut command = common::airlock();
    command.arg("env").args(args).arg("--state-dir").arg(state);
    if let Some(file) = config {
        command.arg("--config").arg(file);
    }
    command.output().unwrap()
}

/// Issue 51: a build pip refuses is the requirements' fault: `airlock env create` exits 1
/// (125 is airlock's own failure) with the end of pip's output; `env list` gives sizes as
/// `doctor` does (a 257 KiB environment was listed as `0 MB`).
#[test]
fn the_cli_says_a_refused_build_is_the_requirements_fault_and_lists_readable_sizes() {
    let _serial = common::serial();
    let dir = scratch_dir("cli-pip");
    let state = dir.join("state");
    let other = Served::start(&dir);
    let index = local_index(&dir.join("index"), &dir, other.port, 0.0);
    let file = dir.join("airlock.toml");
    std::fs::write(&file, config(index.port)).unwrap();
    let reqs = dir.join("requirements.txt");
    let env = |args: &[&str]| env_cli(args, &state, Some(&file));
    std::fs::write(&reqs, "no-such-package==9\n").unwrap();
    let out = env(&["create", "broken", "-r", reqs.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let said = stderr.lines().last().unwrap_or_default();
    assert!(
        stderr.contains(
            "airlock: building environment \"broken\" failed on its requirements: pip exited \
             with 1; the end of its output:\n"
        ),
        "{stderr}"
    );
    assert!(
        stderr.split("the end of its output:").nth(1).is_some_and(
            |tail| tail.contains("No matching distribution found for no-such-package==9")
        ),
        "{stderr}"
    );
    assert!(said.contains("(log: "), "{said}");
    assert!(out.stdout.is_empty());

    std::fs::write(&reqs, "tinyenv-pkg==1.0\n").unwrap();
    let out = env(&["create", "tiny", "-r", reqs.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bytes = info["size_bytes"].as_u64().unwrap();
    assert!(bytes < 1 << 20, "{info}");
    let list = String::from_utf8(env(&["list"]).stdout).unwrap();
    let fields: Vec<&str> = list.trim_end().split('\t').collect();
    assert_eq!(fields[0], "tiny", "{list}");
    assert_eq!(
        fields[3],
        format!("{} KiB", (bytes as f64 / 1024.0).round()),
        "{list}"
    );
}

#[test]
fn the_cli_builds_an_environment_from_the_real_package_index() {
    let _serial = common::serial();
    let dir = scratch_dir("pypi");
    let reqs = dir.join("requirements.txt");
    std::fs::write(&reqs, "tabulate\nrequests\nhttpx\n").unwrap();
    let state = dir.join("state");
    let env = |args: &[&str]| env_cli(args, &state, None);
    let out = env(&["create", "web", "-r", reqs.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("egress only to https://pypi.org/simple"),
        "{stderr}"
    );
    assert!(stderr.contains("Successfully installed"), "{stderr}");
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = info["packages"].to_string();
    for name in ["tabulate==", "requests==", "httpx=="] {
        assert!(packages.contains(name), "{name} missing from {info}");
    }

    // requests and httpx from it go through the proxy as they are, to a server on loopback.
    let site = Served::start(&dir);
    std::fs::write(dir.join("hello.txt"), "hello through the proxy").unwrap();
    let config = dir.join("airlock.toml");
    std::fs::write(
        &config,
        format!("state_dir = {:?}\n", state.to_str().unwrap()),
    )
    .unwrap();
    let (host, range) = (
        format!("localhost:{}", site.port),
        format!("127.0.0.0/8:{}", site.port),
    );
    let code = format!(
        "import httpx, requests, tabulate\nurl = 'http://localhost:{}/hello.txt'\n[requests.get(url, timeout=10).text, httpx.get(url, timeout=10).text, tabulate.tabulate([[1, 2]])]",
        site.port
    );
    let run = common::invoke(
        &[
            "run",
            "--json",
            "--environment",
            "web",
            "--config",
            config.to_str().unwrap(),
            "--allow",
            &host,
            "--allow",
            &range,
            "-",
        ],
        code.as_bytes(),
    );
    assert_eq!(run.status(), "ok", "{:?}", run.json);
    assert_eq!(
        run.result(),
        &json!([
            "hello through the proxy",
            "hello through the proxy",
            "-  -\n1  2\n-  -"
        ])
    );
    assert_eq!(run.json["usage"]["egress"]["connections"], 2);

    let list = env(&["list"]);
    assert!(String::from_utf8_lossy(&list.stdout).starts_with("web\t"));
    let show: Value = serde_json::from_slice(&env(&["show", "web"]).stdout).unwrap();
    assert_eq!(show["hash"], info["hash"]);
    assert!(env(&["delete", "web"]).status.success());
    assert_eq!(env(&["show", "web"]).status.code(), Some(2));
    assert!(entries(&state.join("environments/store")).is_empty());
}
