//! Limits, tried by programs that try hard to exceed them. THREAT-MODEL: processes and time,
//! memory and disk. Every run also checks that nothing is left on the host afterwards.

use crate::common;

use std::io::Write;
use std::process::Stdio;

use common::*;

#[test]
fn the_wall_clock_kills_a_busy_loop() {
    let r = run("while True:\n    pass\n", &["--timeout", "1s"]);
    assert_eq!(r.status(), "timeout", "{r:#?}");
    assert_eq!(r.limits_hit(), ["wall_time"]);
    assert!(r.json["usage"]["wall_ms"].as_u64().unwrap() >= 1000);
    assert_eq!(r.exit, 124);
}

#[test]
fn ignoring_sigterm_stopping_itself_and_double_forking_do_not_escape_the_clock() {
    let code = r#"
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            pass
    os._exit(0)
print("parked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"#;
    let r = run(code, &["--timeout", "1s"]);
    assert_eq!(r.status(), "timeout", "{r:#?}");
    assert_eq!(r.stdout_text(), "parked\n");
    // `run` has checked that no process of the sandbox is left on the host.
}

#[test]
fn orphans_do_not_outlive_the_program() {
    let code = r#"
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3600)
    os._exit(0)
print("parent done")
"#;
    let r = run(code, &[]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    assert!(
        r.json["usage"]["wall_ms"].as_u64().unwrap() < 30_000,
        "it waited for the orphan"
    );
}

#[test]
fn the_memory_limit_kills_with_its_own_status() {
    let code = "x = bytearray(256 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n";
    let r = run(code, &["--memory", "64M"]);
    assert_eq!(r.status(), "memory_limit", "{r:#?}");
    assert_eq!(r.limits_hit(), ["memory"]);
    assert_eq!(r.json["signal"], 9);
    let peak = r.json["usage"]["memory_peak_bytes"].as_u64().unwrap();
    assert!(peak <= 64 << 20, "peak {peak} over the limit");
    assert_eq!(r.exit, 123);
}

#[test]
fn files_in_ram_count_against_memory() {
    // tmpfs, /dev/shm, memfd and SysV shared memory all live in RAM: each is charged to the
    // sandbox, so none of them is a way around the memory limit.
    let writers = [
        ("tmpfs", "f = open('/tmp/big', 'wb')\nfor _ in range(160):\n    f.write(b'x' * (1 << 20))\n"),
        ("dev_shm", "f = open('/dev/shm/big', 'wb')\nfor _ in range(160):\n    f.write(b'x' * (1 << 20))\n"),
        (
            "memfd",
            "import os\nfd = os.memfd_create('x', os.MFD_CLOEXEC | 8)\nfor _ in range(160):\n    os.write(fd, b'x' * (1 << 20))\n",
        ),
        (
            "sysv",
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
             shmid = libc.shmget(0, 160 << 20, 0o1600)\n\
             libc.shmat.restype = ctypes.c_void_p\n\
             addr = libc.shmat(shmid, None, 0)\n\
             ctypes.memset(addr, 1, 160 << 20)\n",
        ),
    ];
    for (what, code) in writers {
        let r = run(code, &["--memory", "64M", "--disk", "512M"]);
        assert_eq!(r.status(), "memory_limit", "{what}: {r:#?}");
    }
}

#[test]
fn swap_is_off_for_the_sandbox_cgroup() {
    let _guard = serial();
    let before = HostState::now();
    // The program waits on its stdin, held open until the cgroup has been read: its cgroup is
    // gone the moment it ends.
    let script = temp_file(
        "swap.py",
        b"import sys\nprint('ready', flush=True)\nsys.stdin.read()\n",
    );
    let mut live = start(
        &[
            "run",
            "--memory",
            "96M",
            "--stdin",
            "-",
            script.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(live.line(), "ready");
    // Only this run's own: another test's sandbox may end (its cgroup gone) while we read.
    let own = format!("{}{}-", airlock_sandbox::SANDBOX_PREFIX, live.child.id());
    let cgroups: Vec<_> = sandbox_cgroups()
        .into_iter()
        .filter(|d| d.file_name().unwrap().to_string_lossy().starts_with(&own))
        .collect();
    let read = |name: &str| {
        cgroups
            .iter()
            .map(|d| d.join(name))
            .find(|p| p.exists())
            .map(|p| std::fs::read_to_string(p).unwrap().trim().to_owned())
    };
    let limit = 96u64 << 20;
    match (read("memory.limit_in_bytes"), read("memory.max")) {
        (Some(v1), _) => {
            assert_eq!(v1, limit.to_string());
            assert_eq!(
                read("memory.memsw.limit_in_bytes").as_deref(),
                Some(v1.as_str()),
                "memory+swap"
            );
        }
        (None, Some(v2)) => {
            assert_eq!(v2, limit.to_string());
            assert_eq!(read("memory.swap.max").as_deref(), Some("0"));
        }
        _ => panic!("no memory cgroup among {cgroups:?}"),
    }
    drop(live.child.stdin.take()); // its stdin closed, the program ends
    let status = live.child.wait().unwrap();
    assert!(status.success());
    std::fs::remove_file(&script).unwrap();
    HostState::now().assert_same_as(&before, &status);
}

#[test]
fn a_fork_bomb_is_contained() {
    let code = r#"
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"#;
    let r = run(code, &["--pids", "16", "--timeout", "2s"]);
    assert_eq!(r.status(), "timeout", "{r:#?}");
    assert!(r.limits_hit().contains(&"pids".to_owned()), "{r:#?}");
}

#[test]
fn a_thread_bomb_is_contained() {
    let code = r#"
import threading, time
n = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        n += 1
except RuntimeError as e:
    print(n, e)
"#;
    let r = run(code, &["--pids", "16"]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    assert!(
        r.stdout_text().starts_with("15 can't start new thread"),
        "{}",
        r.stdout_text()
    );
    assert_eq!(r.limits_hit(), ["pids"]);
}

#[test]
fn cpu_time_is_limited_per_process_and_for_the_whole_sandbox() {
    // One busy process: RLIMIT_CPU's SIGXCPU. Without the cgroup, whose sandbox-wide count
    // (the inits' CPU included) would otherwise race it to the kill.
    let r = run(
        "while True:\n    pass\n",
        &[
            "--cpu-time",
            "1s",
            "--timeout",
            "20s",
            "--downgrade",
            "cgroups",
        ],
    );
    assert_eq!(r.status(), "cpu_limit", "{r:#?}");
    assert_eq!(r.json["signal"], 24);
    assert_eq!(r.exit, 122);
    // A program that ignores SIGXCPU and splits the work over several processes: the cgroup's
    // total is what counts.
    let code = r#"
import os, signal
signal.signal(signal.SIGXCPU, signal.SIG_IGN)
for _ in range(3):
    if os.fork() == 0:
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        while True:
            pass
while True:
    pass
"#;
    let r = run(code, &["--cpu-time", "1s", "--timeout", "20s"]);
    assert_eq!(r.status(), "cpu_limit", "{r:#?}");
    assert!(r.limits_hit().contains(&"cpu_time".to_owned()));
    assert!(r.json["usage"]["cpu_ms"].as_u64().unwrap() >= 1000);
}

#[test]
fn one_sandbox_gets_at_most_one_core() {
    let code = r#"
import os, time
end = time.monotonic() + 1.0
for _ in range(3):
    if os.fork() == 0:
        while time.monotonic() < end:
            pass
        os._exit(0)
while time.monotonic() < end:
    pass
for _ in range(3):
    os.wait()
"#;
    let r = run(code, &[]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    let cpu = r.json["usage"]["cpu_ms"].as_u64().unwrap() as f64;
    let wall = r.json["usage"]["wall_ms"].as_u64().unwrap() as f64;
    // Four busy processes on a two-core host, held to one core's bandwidth.
    assert!(cpu < wall * 1.3, "cpu {cpu} ms in {wall} ms of wall time");
}

#[test]
fn open_files_file_size_and_sparse_files_are_capped() {
    let seen = probe(
        r#"
import os, json, errno
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    opened, err = len(fds), errno.errorcode[e.errno]
for fd in fds:
    os.close(fd)
f = open("/tmp/sparse", "wb")
try:
    f.truncate(1 << 40)
    sparse = "created"
except OSError as e:
    sparse = errno.errorcode[e.errno]
print(json.dumps({"opened": opened, "err": err, "sparse": sparse}))
"#,
    );
    assert_eq!(seen["err"], "EMFILE");
    let opened = seen["opened"].as_u64().unwrap();
    assert!((240..=256).contains(&opened), "{seen}");
    assert_eq!(seen["sparse"], "EFBIG", "a 1 TiB sparse file was allowed");
}

#[test]
fn the_disk_fills_up_at_its_size_and_inode_count() {
    let seen = probe_with(
        r#"
import os, json, errno
written, part = 0, 0
try:
    while True:  # 1 MiB files: one file as large as the disk would meet RLIMIT_FSIZE first
        with open("/tmp/fill%d" % part, "wb") as f:
            for _ in range(16):
                f.write(b"x" * 65536)
                f.flush()
                written += 65536
        part += 1
except OSError as e:
    fill_err = errno.errorcode[e.errno]
for p in range(part + 1):
    os.remove("/tmp/fill%d" % p)
count = 0
try:
    while True:
        open("/work/f%d" % count, "w").close()
        count += 1
except OSError as e:
    inode_err = errno.errorcode[e.errno]
print(json.dumps({"written": written, "fill_err": fill_err, "files": count, "inode_err": inode_err}))
"#,
        &["--disk", "16M"],
    );
    assert_eq!(seen["fill_err"], "ENOSPC");
    assert!(seen["written"].as_u64().unwrap() <= 16 << 20, "{seen}");
    assert_eq!(seen["inode_err"], "ENOSPC");
    // 16 MiB of disk gives 4096 inodes, a few of them already used by the directories.
    assert!(
        (4000..4096).contains(&seen["files"].as_u64().unwrap()),
        "{seen}"
    );
}

fn probe_with(code: &str, args: &[&str]) -> serde_json::Value {
    let r = run(code, args);
    assert_eq!(r.status(), "ok", "{r:#?}");
    r.printed()
}

#[test]
fn output_is_truncated_at_its_limit_and_never_buffered_whole() {
    // 64 MiB on stdout; airlock keeps 1 MiB and throws the rest away as it arrives. GNU time
    // reports airlock's peak memory.
    let _guard = serial();
    let before = HostState::now();
    let code = "import sys\nchunk = 'y' * 65535 + '\\n'\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n";
    let mut child = std::process::Command::new("/usr/bin/time")
        .args([
            "-f",
            "maxrss_kib=%M",
            env!("CARGO_BIN_EXE_airlock"),
            "run",
            "--json",
            "--output-limit",
            "1M",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("GNU time (scripts/test.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(code.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    HostState::now().assert_same_as(&before, &out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["status"], "ok");
    assert_eq!(json["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(json["stdout_truncated"], true);
    assert_eq!(json["limits_hit"], serde_json::json!(["output"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rss: u64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("maxrss_kib="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        rss < 48 * 1024,
        "airlock held {rss} KiB for 1 MiB of kept output"
    );
}

#[test]
fn the_plain_mode_marks_truncation_on_stderr() {
    let _guard = serial();
    let r = invoke(
        &["run", "--output-limit", "10"],
        b"print('0123456789abcdef')",
    );
    assert_eq!(r.exit, 0);
    assert_eq!(r.stdout, "0123456789");
    assert!(
        r.stderr.contains("[airlock: stdout truncated at 10 bytes"),
        "{}",
        r.stderr
    );
}

/// Sets `kernel.core_pattern` for the length of a test and puts the old one back, even when
/// the test fails.
struct CorePattern(String);

impl CorePattern {
    fn set(pattern: &str) -> Self {
        let old = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
        std::fs::write("/proc/sys/kernel/core_pattern", pattern).unwrap();
        CorePattern(old.trim_end().to_owned())
    }
}

impl Drop for CorePattern {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/core_pattern", &self.0);
    }
}

#[test]
fn a_crash_starts_no_core_dump_helper_on_the_host() {
    // With a core_pattern that pipes to a program, the kernel starts that program as root on
    // the host for every crash, whatever RLIMIT_CORE says -- unless it is 1.
    let _guard = serial();
    let before = HostState::now();
    let dir = std::env::temp_dir().join(format!("airlock-core-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let helper = dir.join("helper.sh");
    let marker = dir.join("ran");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\necho \"$1\" >> {}\ncat > /dev/null\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let pattern = CorePattern::set(&format!("|{} %P", helper.display()));

    // Control: a host process with RLIMIT_CORE 0 does start the helper.
    let status = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import os, resource\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\nos.abort()",
        ])
        .status()
        .unwrap();
    assert!(!status.success());
    let waited = std::time::Instant::now();
    while !marker.exists() && waited.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        marker.exists(),
        "the control crash did not start the helper: the test proves nothing"
    );
    std::fs::remove_file(&marker).unwrap();

    let r = run_unlocked("import os\nfor _ in range(3):\n    if os.fork() == 0:\n        os.abort()\n    os.wait()\nos.abort()", &[]);
    assert_eq!(
        (r.status(), r.json["signal"].as_i64()),
        ("crashed", Some(6)),
        "{r:#?}"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    drop(pattern);
    let ran = marker.exists();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        !ran,
        "a crash in the sandbox started the host's core dump helper"
    );
    HostState::now().assert_same_as(&before, &r);
}
