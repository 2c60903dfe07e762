//! `airlock run` and `airlock doctor` as a user meets them: options, bad input, exit codes,
//! streaming, and failing closed on a host that cannot enforce the policy.

use crate::common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;

use common::*;
use serde_json::{json, Value};

#[test]
fn bad_input_is_refused_in_one_line_before_anything_runs() {
    let _guard = serial();
    let dir = std::env::temp_dir();
    let big = "#".repeat((1 << 20) + 1);
    let not_utf8 = temp_file("latin1.py", b"print('\xe9')");
    let cases: Vec<(Vec<String>, &[u8], &str)> = vec![
        (vec!["--timeout".into(), "5x".into()], b"1", "unknown unit"),
        (vec!["--timeout".into(), "5".into()], b"1", "needs a unit"),
        (
            vec!["--memory".into(), "1500K".into()],
            b"1",
            "whole number of MiB",
        ),
        (
            vec!["--memory".into(), "9T".into()],
            b"1",
            "above the operator's ceiling",
        ),
        (
            vec!["--pids".into(), "0".into()],
            b"1",
            "must be greater than zero",
        ),
        (
            vec!["--pids".into(), "5000".into()],
            b"1",
            "ceiling of 1024",
        ),
        (
            vec!["--output-limit".into(), "1Q".into()],
            b"1",
            "unknown unit",
        ),
        (vec!["/nonexistent/code.py".into()], b"", "No such file"),
        (
            vec![dir.to_string_lossy().into_owned()],
            b"",
            "is a directory",
        ),
        (vec![], big.as_bytes(), "raise it with --max-code-size"),
        (
            vec!["--max-code-size".into(), "17M".into()],
            b"1",
            "ceiling",
        ),
        (
            vec!["--env".into(), "NOEQUALS".into()],
            b"1",
            "expected KEY=VALUE",
        ),
        (
            vec!["--env".into(), "=x".into()],
            b"1",
            "invalid environment variable",
        ),
        (
            (0..300)
                .flat_map(|i| ["--env".into(), format!("V{i}=x")])
                .collect(),
            b"1",
            "over the limit of 256",
        ),
        (
            vec!["--env".into(), format!("BIG={}", "x".repeat(70_000))],
            b"1",
            "over the limit of 65536",
        ),
        (
            vec!["--file".into(), "/nonexistent".into()],
            b"1",
            "No such file",
        ),
        (
            vec!["--file".into(), "/etc/hostname:/abs".into()],
            b"1",
            "must be relative",
        ),
        (
            vec!["--file".into(), "/etc/hostname:../up".into()],
            b"1",
            "must be relative",
        ),
        (
            vec!["--stdin".into(), "-".into()],
            b"1",
            "already comes from standard input",
        ),
        (
            vec!["--downgrade".into(), "network".into()],
            b"1",
            "unknown mechanism",
        ),
        (vec!["--python".into(), "/bin/sh".into()], b"1", "pythonX.Y"),
        (
            vec![not_utf8.to_string_lossy().into_owned()],
            b"",
            "not valid UTF-8",
        ),
    ];
    for (args, stdin, expect) in cases {
        let before = HostState::now();
        let inits = sandbox_inits();
        let mut all = vec!["run".to_owned()];
        all.extend(args.iter().cloned());
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let r = invoke(&all, stdin);
        HostState::now().assert_same_as(&before, &r);
        // The init started ahead of the sandbox that never came is gone with airlock.
        assert_eq!(sandbox_inits(), inits, "{args:?}");
        assert_eq!(r.exit, 2, "{args:?}: {r:#?}");
        assert!(
            r.stderr.contains(expect),
            "{args:?}: expected {expect:?} in {:?}",
            r.stderr
        );
        assert!(r.stdout.is_empty(), "{args:?} printed {:?}", r.stdout);
        let first = r.stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("airlock: ") || first.starts_with("error: "),
            "{args:?}: {:?}",
            r.stderr
        );
    }
    std::fs::remove_file(&not_utf8).unwrap();
    // With --json the refusal is one JSON object on stdout too, the API's error body, whether
    // airlock or the argument parser refused.
    for (args, expect) in [
        (vec!["--timeout", "5x"], "unknown unit"),
        (vec!["--pids", "5000"], "ceiling of 1024"),
        (vec!["/nonexistent/code.py"], "No such file"),
        (vec!["--no-such-flag"], "--no-such-flag"),
    ] {
        let mut all = vec!["run", "--json"];
        all.extend(args.iter().copied());
        let r = invoke(&all, b"1");
        assert_eq!(r.exit, 2, "{args:?}: {r:#?}");
        assert_eq!(r.stdout.lines().count(), 1, "{args:?}: {r:#?}");
        let body: Value = serde_json::from_str(&r.stdout).unwrap();
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(expect), "{args:?}: {message:?}");
        assert!(r.stderr.contains(expect), "{args:?}: {:?}", r.stderr);
    }
    // Help is no refusal, even with --json.
    let help = airlock()
        .args(["run", "--json", "--help"])
        .output()
        .unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage"));
    // Raised on purpose, the same code runs.
    let r = invoke(&["run", "--json", "--max-code-size", "2M"], big.as_bytes());
    assert_eq!(r.status(), "ok", "{r:#?}");
}

#[test]
fn files_stdin_and_environment_reach_the_program() {
    let data = temp_file("data.csv", b"a,b\n1,2\n");
    let input = temp_file("input.txt", b"line one\nline two\n");
    let name = data.file_name().unwrap().to_str().unwrap().to_owned();
    let code = r#"
import os, sys, json
print(json.dumps({"nested": open("inputs/data.csv").read(), "plain": open(os.environ["NAME"]).read(),
                  "stdin": sys.stdin.read(),
                  "env": {k: os.environ.get(k) for k in ["A", "B", "HOST_SECRET_CANARY"]}}))
"#;
    let nested = format!("{}:inputs/data.csv", data.display());
    let plain = data.display().to_string();
    let r = run(
        code,
        &[
            "--file",
            &nested,
            "--file",
            &plain,
            "--stdin",
            input.to_str().unwrap(),
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--env",
            &format!("NAME={name}"),
        ],
    );
    std::fs::remove_file(&input).unwrap();
    std::fs::remove_file(&data).unwrap();
    assert_eq!(r.status(), "ok", "{r:#?}");
    let seen = r.printed();
    assert_eq!(seen["nested"], "a,b\n1,2\n");
    assert_eq!(
        seen["plain"], "a,b\n1,2\n",
        "a --file without a target lands under its own name"
    );
    assert_eq!(seen["stdin"], "line one\nline two\n");
    assert_eq!(
        seen["env"],
        json!({"A": "1", "B": "x=y", "HOST_SECRET_CANARY": null})
    );
}

/// A one-shot cold sandbox's runner loads no more than it needs before the code (`os`, with
/// its dependencies, would be more than a millisecond of every run); code that imports `os`
/// gets a working module, with the job's environment in it.
#[test]
fn a_cold_run_leaves_os_to_the_code_that_imports_it() {
    let code = "import sys\nbefore = 'os' in sys.modules\nimport os\n\
                (before, os.environ.get('A'), os.path.basename(os.getcwd()))";
    let r = run(code, &[]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    if !via_zygote() {
        assert_eq!(r.result(), &json!([false, null, "work"]), "{r:#?}");
    }
    // With an environment to apply, the runner applies it through os.environ (putenv too).
    let r = run(code, &["--env", "A=1"]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    assert_eq!(r.result(), &json!([true, "1", "work"]), "{r:#?}");
}

#[test]
fn exit_codes_follow_the_verdict() {
    let _guard = serial();
    let cases: &[(&[&str], &str, i32, &str)] = &[
        (&[], "print('fine')", 0, ""),
        (&[], "import sys\nsys.exit(7)", 7, ""),
        (&[], "1/0", 1, "ZeroDivisionError: division by zero"),
        (
            &["--timeout", "500ms"],
            "while True:\n    pass",
            124,
            "airlock: timeout",
        ),
        (
            &["--memory", "32M"],
            "x = bytearray(256 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1",
            123,
            "airlock: memory_limit",
        ),
        (
            &["--cpu-time", "500ms"],
            "while True:\n    pass",
            122,
            "airlock: cpu_limit",
        ),
        (
            &[],
            "import ctypes\nctypes.CDLL(None).syscall(101, 0, 0, 0, 0)",
            121,
            "airlock: policy_violation",
        ),
        (
            &[],
            "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
            139,
            "airlock: crashed: killed by signal 11",
        ),
    ];
    for (args, code, want, stderr) in cases {
        let before = HostState::now();
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        let r = invoke(&all, code.as_bytes());
        HostState::now().assert_same_as(&before, &r);
        assert_eq!(r.exit, *want, "{code}: {r:#?}");
        assert!(r.stderr.contains(stderr), "{code}: {:?}", r.stderr);
    }
    let help = invoke(&["run", "--help"], b"");
    for documented in ["124", "123", "122", "121", "125", "128+N", "--json"] {
        assert!(
            help.stdout.contains(documented),
            "--help does not document {documented}"
        );
    }
}

#[test]
fn plain_mode_streams_output_as_it_is_printed() {
    let _guard = serial();
    let before = HostState::now();
    let script = temp_file(
        "stream.py",
        b"import sys\nprint('first', flush=True)\nsys.stdin.readline()\nprint('second')\n",
    );
    let mut live = start(&["run", "--stdin", "-", script.to_str().unwrap()], None);
    // "first" arrives while the program is still waiting for its input.
    assert_eq!(live.line(), "first");
    assert!(
        live.child.try_wait().unwrap().is_none(),
        "the program ended before its output arrived"
    );
    live.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(live.line(), "second");
    assert!(live.child.wait().unwrap().success());
    std::fs::remove_file(&script).unwrap();
    HostState::now().assert_same_as(&before, &"streaming");
}

#[test]
fn doctor_reports_full_enforcement_on_this_host() {
    let _guard = serial();
    let r = invoke(&["doctor", "--json"], b"");
    assert_eq!(r.exit, 0, "{}\n{}", r.stdout, r.stderr);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(report["ok"], true);
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "user namespaces",
            "seccomp",
            "landlock",
            "cgroups",
            "python",
            "sandbox",
            "warm pool",
            "zygote",
            "environment builds",
            "volumes"
        ]
    );
    // Volumes too: a sandbox writes one through an idmapped mount (docs/volumes.md).
    let volumes = report["checks"][9]["detail"].as_str().unwrap();
    assert!(volumes.starts_with("a sandbox wrote a volume"), "{volumes}");
    // This host has loop devices and e2fsprogs (docs/environments.md).
    let builds = report["checks"][8]["detail"].as_str().unwrap();
    assert!(
        builds.starts_with("bounded while they write by ext4"),
        "{builds}"
    );
    let zygote = report["checks"][7]["detail"].as_str().unwrap();
    assert!(zygote.contains("a run as its child took"), "{zygote}");
    let pool = report["checks"][6]["detail"].as_str().unwrap();
    assert!(
        pool.starts_with("a pooled sandbox was ready in") && pool.contains("MiB (PSS) idle"),
        "{pool}"
    );
    let cgroup = &report["checks"][3]["detail"];
    assert!(
        cgroup.as_str().unwrap().starts_with("v1:") || cgroup.as_str().unwrap().starts_with("v2:")
    );
    let enforced = report["enforced"].to_string();
    for item in [
        "seccomp: enforced",
        "landlock: fully_enforced",
        "network: none",
    ] {
        assert!(enforced.contains(item), "{item} missing from {enforced}");
    }
    let text = invoke(&["doctor"], b"");
    assert_eq!(text.exit, 0);
    assert!(
        text.stdout.contains("Everything is enforced."),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .contains("Memory `airlock serve` can hold at most, with the default configuration:"),
        "{}",
        text.stdout
    );
}

/// `airlock doctor --config` sizes the server for that configuration: every part of its
/// worst-case memory, from the settings that bound it.
/// `airlock … | head`: once the reader is gone, what is left to print is dropped and the
/// command ends with the status it would have had, never a panic or a signal.
#[test]
fn a_closed_stdout_ends_quietly_with_the_usual_status() {
    let _guard = serial();
    let before = HostState::now();
    let program = "print('x' * 200_000)\nimport sys\nsys.exit(3)\n";
    let cases: &[(&[&str], &str, i32)] = &[
        (&["run"], program, 3),
        (&["run", "--json"], program, 3),
        (
            &["run", "--entrypoint", "f"],
            "def f():\n    return 'y' * 200_000\n",
            0,
        ),
        (
            &["run", "--entrypoint", "f"],
            "def f():\n    return 1 / 0\n",
            1,
        ),
    ];
    for (args, code, want) in cases {
        let mut cmd = airlock();
        cmd.args(*args);
        let (status, stderr) = with_stdout_gone(cmd, Some(code));
        assert_eq!(status.code(), Some(*want), "{args:?}: {stderr}");
    }
    HostState::now().assert_same_as(&before, &"runs with stdout gone");
    let normal = invoke(&["doctor"], b"").exit;
    let mut doctor = airlock();
    doctor.arg("doctor");
    assert_eq!(with_stdout_gone(doctor, None).0.code(), Some(normal));
}

#[test]
fn doctor_states_the_worst_case_memory_of_a_configuration() {
    let _guard = serial();
    let config = temp_file(
        "sizing.toml",
        b"[http]\nmax_buffered_bytes = 2147483648\nmax_connections = 100\n\
          [concurrency]\nmax_running = 2\n[pickle]\nmax_bytes = 1048576\nmax_running = 1\n",
    );
    let r = invoke(
        &["doctor", "--json", "--config", config.to_str().unwrap()],
        b"",
    );
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    let memory = &report["memory"];
    let part = |name: &str| {
        memory["server"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {memory}"))
            .clone()
    };
    assert_eq!(part("bodies and answers")["bytes"], 2u64 << 30);
    assert_eq!(part("pickle scans")["bytes"], 128u64 << 20);
    assert_eq!(
        part("results being parsed")["bytes"],
        2 * 72 * ((1u64 << 20) + (128 << 10))
    );
    let connections = part("connections");
    assert!(connections["how"]
        .as_str()
        .unwrap()
        .contains("http.max_connections = 100"));
    let total: u64 = memory["server"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(memory["server_total_bytes"], total);
    assert_eq!(memory["config"], config.to_str().unwrap());
    // No file named: the one found in the user's place is read, and doctor says which.
    let home = common::scratch_dir("airlock-xdg-config");
    let found = home.join("airlock/airlock.toml");
    std::fs::create_dir_all(found.parent().unwrap()).unwrap();
    std::fs::copy(&config, &found).unwrap();
    let out = airlock()
        .args(["doctor", "--json"])
        .env("XDG_CONFIG_HOME", &*home)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["memory"]["config"], found.to_str().unwrap());
    assert_eq!(
        report["memory"]["server"][0]["bytes"], memory["server"][0]["bytes"],
        "the found file's settings apply"
    );
    // A configuration that could never admit an execution at the ceilings says so.
    let bad = temp_file(
        "too-small.toml",
        b"[http]\nmax_buffered_bytes_per_key = 33554432\n",
    );
    let r = invoke(
        &["doctor", "--json", "--config", bad.to_str().unwrap()],
        b"",
    );
    assert_eq!(r.exit, 1);
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    let failed = report["checks"].to_string();
    assert!(
        failed.contains("max_buffered_bytes_per_key = 33554432 is less than"),
        "{failed}"
    );
    // A server refuses to start on it, as on any invalid configuration: the usage status.
    for command in ["serve", "mcp"] {
        let r = invoke(&[command, "--config", bad.to_str().unwrap()], b"");
        assert_eq!(r.exit, 2, "{command}: {}", r.stderr);
        assert!(
            r.stderr.contains("invalid configuration: ")
                && r.stderr
                    .contains("max_buffered_bytes_per_key = 33554432 is less than"),
            "{command}: {}",
            r.stderr
        );
    }
}

/// The airlock binary, copied where an unprivileged user can run it.
fn binary_for_nobody() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("airlock-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("airlock");
    std::fs::copy(env!("CARGO_BIN_EXE_airlock"), &bin).unwrap();
    bin
}

fn as_nobody(bin: &PathBuf, args: &[&str], stdin: &[u8]) -> Run {
    let mut child = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin)
        .args(args)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv from util-linux");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = if args.contains(&"--json") && args[0] == "run" {
        serde_json::from_str(&stdout).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    Run {
        exit: out.status.code().unwrap_or(-1),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        json,
    }
}

#[test]
fn without_a_required_mechanism_airlock_refuses_unless_it_is_downgraded_by_name() {
    // An unprivileged user may not create cgroups here: a real host missing a mechanism.
    let _guard = serial();
    let before = HostState::now();
    let bin = binary_for_nobody();
    let r = as_nobody(&bin, &["run", "--json"], b"print('ran')");
    assert_eq!(r.exit, 125, "{r:#?}");
    // Nothing ran: --json's one object is the refusal, not a result.
    assert_eq!(
        r.json["error"]["code"], "internal",
        "something ran: {}",
        r.stdout
    );
    assert!(
        r.json.get("status").is_none(),
        "something ran: {}",
        r.stdout
    );
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("cgroups is required"), "{message}");
    assert!(r.stderr.contains("cgroups is required"), "{}", r.stderr);
    assert!(r.stderr.contains("airlock doctor"), "{}", r.stderr);

    let doctor = as_nobody(&bin, &["doctor", "--json"], b"");
    assert_eq!(doctor.exit, 1, "{doctor:#?}");
    let report: Value = serde_json::from_str(&doctor.stdout).unwrap();
    let cg = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "cgroups")
        .unwrap();
    assert_eq!(cg["ok"], false);
    assert!(cg["fix"].as_str().unwrap().contains("delegated"), "{cg}");

    let r = as_nobody(
        &bin,
        &["run", "--json", "--downgrade", "cgroups"],
        b"import os\nprint('ran')\nos.getuid()",
    );
    assert_eq!(r.json["status"], "ok", "{r:#?}");
    assert_eq!(r.json["result"], 1000);
    assert_eq!(r.json["isolation"]["cgroup"], "disabled");
    assert_eq!(r.json["isolation"]["downgraded"], json!(["cgroups"]));
    assert_eq!(r.json["isolation"]["seccomp"], "enforced");
    // No cgroup: no peak memory; CPU is the program's own, from wait4.
    assert!(r.json["usage"]["memory_peak_bytes"].is_null(), "{r:#?}");
    assert!(r.json["usage"]["cpu_ms"].is_u64(), "{r:#?}");
    // Without cgroups the rlimit backstops still stop a fork bomb.
    let bomb = b"import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time\n            time.sleep(30)\n        n += 1\nexcept OSError:\n    print(n)";
    let r = as_nobody(
        &bin,
        &[
            "run",
            "--json",
            "--downgrade",
            "cgroups",
            "--pids",
            "8",
            "--timeout",
            "3s",
        ],
        bomb,
    );
    assert_eq!(r.json["stdout"], "7\n", "{r:#?}");
    std::fs::remove_dir_all(bin.parent().unwrap()).unwrap();
    HostState::now().assert_same_as(&before, &r);
}

/// `airlock run --json -` with `code` on stdin and its state directory under `data`.
fn run_with_data_home(data: &std::path::Path, code: &str) -> Value {
    let env = [("XDG_DATA_HOME", data.as_os_str())];
    invoke_env(&["run", "--json", "-"], code.as_bytes(), &env).json
}

#[test]
fn a_cold_sandbox_loads_the_runner_compiled_once_and_never_sees_it() {
    let _g = serial();
    let before = HostState::now();
    let data = scratch_dir("runner");
    // What the program sees of its own start: its descriptors, and whether the runner came
    // compiled (the code after -c is then the loader, not the runner's source).
    let probe = "import os, sys\n\
        print(sorted(os.listdir('/proc/self/fd')), sys.orig_argv[5].startswith('import marshal, posix\\n_c = '))\n\
        1 / 0";
    let compiled = run_with_data_home(&data, probe);
    // A state directory that cannot be made: the sandbox compiles the source, as before.
    let source = run_with_data_home(std::path::Path::new("/proc/airlock-none"), probe);
    let seen = |r: &Value| r["stdout"].as_str().unwrap_or_default().to_owned();
    assert_eq!(
        seen(&compiled),
        "['0', '1', '2', '3', '4'] True\n",
        "{compiled}"
    );
    assert_eq!(
        seen(&source),
        "['0', '1', '2', '3', '4'] False\n",
        "{source}"
    );
    // The same answer either way, the traceback included.
    assert_eq!(compiled["error"], source["error"]);
    assert_eq!(compiled["status"], "error", "{compiled}");
    // Kept, and used again only while it is whole: a changed entry is made again.
    let dir = data.join("airlock/runner");
    let entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let kept = std::fs::read(&entries[0]).unwrap();
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let mut spoiled = kept.clone();
    let last = spoiled.len() - 1;
    spoiled[last] ^= 0xff;
    std::fs::write(&entries[0], &spoiled).unwrap();
    let again = run_with_data_home(&data, probe);
    assert_eq!(seen(&again), seen(&compiled), "{again}");
    let remade = std::fs::read(&entries[0]).unwrap();
    assert!(remade != spoiled && remade.starts_with(b"airlock compiled runner 1\n"));
    let answer = run_with_data_home(&data, "6 * 7");
    assert_eq!(answer["result"], 42, "{answer}");
    HostState::now().assert_same_as(&before, &answer);
    std::fs::remove_dir_all(&data).unwrap();
}

/// What the outer init of `airlock run`'s sandbox was, read while its code ran.
#[derive(Debug)]
struct OuterInit {
    exe: PathBuf,
    cmdline: String,
    comm: String,
    /// Its open descriptors and what they are.
    fds: Vec<(String, String)>,
    /// What airlock's own stdin, stdout and stderr are (pipes of this test).
    airlock_stdio: Vec<String>,
}

/// Runs code that sleeps and reads its sandbox's outer init meanwhile.
fn outer_init_of_a_run() -> OuterInit {
    let before = sandbox_inits();
    let running = sandbox_processes().len();
    let mut child = airlock()
        .args(["run", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let code = b"import time\ntime.sleep(1.5)\nprint('done')";
    child.stdin.take().unwrap().write_all(code).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // Once the code runs, the outer init of its sandbox is airlock's only child that is an
    // init.
    let airlock_pid = child.id().to_string();
    let parent_of = |p: &String| {
        let stat = std::fs::read_to_string(format!("{p}/stat")).unwrap_or_default();
        let after = stat
            .rsplit_once(") ")
            .map_or("", |(_, rest)| rest)
            .to_owned();
        after.split(' ').nth(1).unwrap_or_default().to_owned()
    };
    let init = loop {
        let new: Vec<String> = sandbox_inits()
            .into_iter()
            .filter(|p| !before.contains(p) && parent_of(p) == airlock_pid)
            .collect();
        if sandbox_processes().len() > running && new.len() == 1 {
            let p = &new[0];
            let fds = std::fs::read_dir(format!("{p}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| {
                    let target = std::fs::read_link(e.path()).unwrap_or_default();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        target.display().to_string(),
                    )
                })
                .collect();
            if let Ok(exe) = std::fs::read_link(format!("{p}/exe")) {
                break OuterInit {
                    exe,
                    cmdline: std::fs::read_to_string(format!("{p}/cmdline")).unwrap_or_default(),
                    comm: std::fs::read_to_string(format!("{p}/comm")).unwrap_or_default(),
                    fds,
                    airlock_stdio: (0..3)
                        .map(|n| {
                            let link = format!("/proc/{airlock_pid}/fd/{n}");
                            std::fs::read_link(link).unwrap().display().to_string()
                        })
                        .collect(),
                };
            }
        }
        assert!(std::time::Instant::now() < deadline, "no sandbox init seen");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let out = child.wait_with_output().unwrap();
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        r["status"],
        "ok",
        "{r} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(r["stdout"], "done\n", "{r}");
    init
}

/// `airlock run` forks its sandbox's outer init first thing (no binary loaded again), which
/// holds nothing of airlock's: named as an init, with its status socket, pipes and what it
/// opened for the sandbox.
#[test]
fn airlock_run_forks_its_init_ahead_and_it_holds_nothing_of_airlock_s() {
    let _g = serial();
    let before = HostState::now();
    let init = outer_init_of_a_run();
    assert_eq!(
        init.exe,
        std::path::Path::new(env!("CARGO_BIN_EXE_airlock"))
    );
    // A fork: airlock's own command line, not an executed init's.
    assert!(init.cmdline.split('\0').any(|a| a == "run"), "{init:?}");
    assert_eq!(init.comm, "airlock-sandbox\n");
    // Nothing airlock had open when it forked (its stdio, here this test's pipes), and no
    // terminal: only what the init opened itself (its socket and pipes, the sources of the
    // sandbox's mounts, ...).
    assert_eq!(init.airlock_stdio.len(), 3);
    for (_, target) in &init.fds {
        assert!(
            !init.airlock_stdio.contains(target) && !target.starts_with("/dev/pts"),
            "{init:?}"
        );
    }
    HostState::now().assert_same_as(&before, &"after a run with an init forked ahead");
}

/// Completions a shell loads and completes with, and a manual page that renders cleanly.
#[test]
fn completions_load_in_bash_and_the_manual_renders() {
    let bin = env!("CARGO_BIN_EXE_airlock");
    let complete = |line: &str| -> Vec<String> {
        let words: Vec<&str> = line.split(' ').collect();
        let script = format!(
            "source <('{bin}' completions bash) || exit 9\n\
             complete -p airlock >/dev/null || exit 8\n\
             COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT={point}\n\
             _airlock airlock '{cur}' '{prev}'\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            words = words.join(" "),
            cword = words.len() - 1,
            point = line.len(),
            cur = words[words.len() - 1],
            prev = words[words.len() - 2],
        );
        let out = std::process::Command::new("bash")
            .args(["--norc", "--noprofile", "-c", &script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(complete("airlock ru"), ["run"]);
    assert!(complete("airlock pickle s").contains(&"scan".to_owned()));
    assert!(complete("airlock run --ti").contains(&"--timeout".to_owned()));

    let man = airlock().arg("man").output().unwrap();
    assert!(man.status.success());
    let page = String::from_utf8(man.stdout).unwrap();
    assert!(
        page.starts_with(".ie") || page.contains(".TH airlock 1"),
        "{page}"
    );
    // groff renders it with every warning on, and none comes.
    let mut groff = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-ww"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    groff
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let shown = groff.wait_with_output().unwrap();
    let (text, warnings) = (
        String::from_utf8_lossy(&shown.stdout),
        String::from_utf8_lossy(&shown.stderr),
    );
    assert!(shown.status.success() && warnings.is_empty(), "{warnings}");
    assert!(text.contains("Run untrusted code"), "{text}");
    for command in [
        "run",
        "serve",
        "doctor",
        "eval",
        "pickle",
        "mcp",
        "env",
        "completions",
    ] {
        assert!(text.contains(command), "{command} missing from the manual");
    }
}

/// The repository's root.
fn repo() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Issue 51: `./scripts/start.sh run --json my.py` printed `==> building airlock (release)`
/// on stdout before the JSON. Run from a copy of the scripts, with a `cargo` that says what
/// it builds on stdout and a built `airlock` that answers one JSON object: stdout is that
/// object alone, whatever installing and building say.
#[test]
fn start_sh_keeps_stdout_for_airlock_s_answer() {
    let dir = scratch_dir("start-sh");
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    std::fs::create_dir_all(dir.join("target/release")).unwrap();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    for script in ["start.sh", "lib.sh"] {
        std::fs::copy(
            repo().join("scripts").join(script),
            dir.join("scripts").join(script),
        )
        .unwrap();
    }
    let executable = |path: PathBuf, text: &str| {
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    executable(
        dir.join("bin/cargo"),
        "#!/bin/sh\necho \"   Compiling airlock v0.1.0\"\necho \"    Finished release\"\n",
    );
    executable(
        dir.join("target/release/airlock"),
        "#!/bin/sh\necho '{\"status\": \"ok\", \"args\": \"'\"$*\"'\"}'\n",
    );
    let path = format!(
        "{}:{}",
        dir.join("bin").display(),
        std::env::var("PATH").unwrap()
    );
    let out = std::process::Command::new("bash")
        .arg(dir.join("scripts/start.sh"))
        .args(["run", "--json", "my.py"])
        .env("PATH", path)
        .env_remove("SCRIPTS_STEP_CLOCK")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let answer: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout:?}"));
    assert_eq!(answer, json!({"status": "ok", "args": "run --json my.py"}));
    assert!(
        stderr.contains("==> building airlock (release)"),
        "{stderr}"
    );
    assert!(stderr.contains("Compiling airlock"), "{stderr}");
}

/// Issue 51: the README and docs/mcp.md say `airlock` and `/usr/local/bin/airlock`;
/// `scripts/install.sh` puts it there (here under a prefix of the test's, from the build the
/// tests run), with the library its zygotes load beside it: the installed binary's doctor
/// starts a zygote.
#[test]
fn install_sh_puts_airlock_and_its_zygote_library_on_path() {
    let _guard = serial();
    let prefix = scratch_dir("install-sh");
    let built = std::path::Path::new(env!("CARGO_BIN_EXE_airlock"))
        .parent()
        .unwrap()
        .to_owned();
    let out = std::process::Command::new("bash")
        .arg(repo().join("scripts/install.sh"))
        .arg("--prefix")
        .arg(&*prefix)
        .arg("--from")
        .arg(&built)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = prefix.join("bin");
    assert!(
        stdout.contains(&format!("installed {}/airlock", bin.display())),
        "{stdout}"
    );
    // The installed binary's doctor: its zygote check, which starts a zygote.
    let zygote_check = || -> Value {
        let out = std::process::Command::new(bin.join("airlock"))
            .args(["doctor", "--json"])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        let checks = report["checks"].as_array().unwrap();
        let zygote = checks.iter().find(|c| c["name"] == "zygote");
        zygote.unwrap_or_else(|| panic!("{report:#}")).clone()
    };
    let zygote = zygote_check();
    assert_eq!(zygote["ok"], true, "{zygote}");
    // Without the library beside it, the same binary's zygote cannot start: the check above
    // is the library's doing.
    std::fs::remove_file(bin.join("libairlock_sandbox.so")).unwrap();
    let zygote = zygote_check();
    assert_eq!(zygote["ok"], false, "{zygote}");
}

/// Issue 51: a script another one runs (fuzz.sh under test.sh) counts its steps on from its
/// caller's clock: the fuzz step read `[0s]` after `[548s]`.
#[test]
fn a_script_s_steps_count_on_from_its_caller_s_clock() {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(
            "SECONDS=40; . scripts/lib.sh; step outer; \
             bash -c '. scripts/lib.sh; step inner'",
        )
        .current_dir(repo())
        .env_remove("SCRIPTS_STEP_CLOCK")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seconds: Vec<u64> = stdout
        .lines()
        .map(|l| {
            l.split(['[', 's'])
                .nth(1)
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("{stdout}"))
        })
        .collect();
    assert_eq!(seconds.len(), 2, "{stdout}");
    assert!(seconds[0] >= 40 && seconds[1] >= seconds[0], "{stdout}");
}
