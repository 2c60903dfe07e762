//! The jail, probed from inside by real programs: namespaces, the file system, the network and
//! the process's own attributes. THREAT-MODEL: reading the host, writing the host, network.

use crate::common;

use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::process::Stdio;

use common::*;
use serde_json::{json, Value};

fn sorted(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

#[test]
fn every_namespace_is_new() {
    let inside = probe(
        r#"
import os, json
print(json.dumps({n: os.readlink("/proc/self/ns/" + n)
                  for n in ["user", "pid", "net", "mnt", "ipc", "uts", "cgroup"]}))
"#,
    );
    for (name, link) in inside.as_object().unwrap() {
        let host = std::fs::read_link(format!("/proc/self/ns/{name}")).unwrap();
        assert_ne!(
            link.as_str().unwrap(),
            host.to_str().unwrap(),
            "{name} namespace is shared"
        );
    }
}

#[test]
fn unprivileged_uid_own_hostname_and_only_its_own_processes() {
    let seen = probe(
        r#"
import os, json, socket
child = os.fork()
if child == 0:
    os.pause()
procs = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
os.kill(child, 9)
os.waitpid(child, 0)
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
                  "groups": os.getgroups(), "host": socket.gethostname(), "pid": os.getpid(),
                  "ppid": os.getppid(), "procs": procs,
                  "uid_map": open("/proc/self/uid_map").read().split()}))
"#,
    );
    assert_eq!(
        (
            seen["uid"].clone(),
            seen["euid"].clone(),
            seen["gid"].clone()
        ),
        (json!(1000), json!(1000), json!(1000))
    );
    assert_eq!(seen["host"], "airlock");
    // PID 1 is the sandbox's init, 2 the program, 3 its child: nothing else exists. A
    // zygote's child has the zygote for parent, outside its PID namespace: its ppid is 0.
    assert_eq!(seen["procs"], json!([1, 2, 3]));
    let ppid = if via_zygote() { 0 } else { 1 };
    assert_eq!(
        (seen["pid"].clone(), seen["ppid"].clone()),
        (json!(2), json!(ppid))
    );
    // Exactly one uid is mapped, and on the host it is an unprivileged one of its own.
    let map = seen["uid_map"].as_array().unwrap();
    assert_eq!(map.len(), 3, "{map:?}");
    assert_eq!(map[0], "1000");
    let outer: u32 = map[1].as_str().unwrap().parse().unwrap();
    if via_zygote() {
        // Mapped onto one id of the zygote's block (slot 0 is the zygote's own root); the
        // block is host ids of its own (`sandboxes_run_as_a_host_uid_of_their_own...`).
        assert!((1..256).contains(&outer), "zygote slot {outer}");
    } else {
        assert!(outer >= airlock_sandbox::HOST_ID_BASE, "host uid {outer}");
    }
}

#[test]
fn the_root_holds_only_what_the_interpreter_needs_and_is_read_only() {
    let seen = probe(
        r#"
import os, json, errno
def try_write(path):
    try:
        open(path, "w")
        return "written"
    except OSError as e:
        return errno.errorcode[e.errno]
print(json.dumps({"root": os.listdir("/"), "etc": os.listdir("/etc"), "dev": os.listdir("/dev"),
                  "usr": os.listdir("/usr"), "usr_bin": os.listdir("/usr/bin"),
                  "usr_lib": os.listdir("/usr/lib"),
                  "usr_share": os.listdir("/usr/share"),
                  "alternatives": {n: os.readlink("/etc/alternatives/" + n)
                                   for n in os.listdir("/etc/alternatives")},
                  "writes": {p: try_write(p) for p in ["/x", "/usr/x", "/etc/passwd", "/etc/x",
                                                       "/usr/lib/x", "/dev/x", "/proc/x",
                                                       "/usr/bin/python3"]}}))
"#,
    );
    assert_eq!(
        sorted(&seen["root"]),
        ["bin", "dev", "etc", "lib", "lib64", "proc", "tmp", "usr", "work"]
    );
    // /etc/alternatives holds only the links libraries go through (the test script installs
    // numpy, whose BLAS is one), each to a library inside the sandbox anyway.
    assert_eq!(
        sorted(&seen["etc"]),
        ["alternatives", "group", "hosts", "ld.so.cache", "passwd"]
    );
    let alternatives = seen["alternatives"].as_object().unwrap();
    assert!(
        alternatives.contains_key("libblas.so.3-x86_64-linux-gnu"),
        "{alternatives:?}"
    );
    for (name, target) in alternatives {
        let target = target.as_str().unwrap();
        assert!(
            target.starts_with("/usr/lib/x86_64-linux-gnu/"),
            "{name} -> {target}"
        );
    }
    assert_eq!(sorted(&seen["usr_share"]), ["matplotlib", "zoneinfo"]);
    assert_eq!(
        sorted(&seen["dev"]),
        ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"]
    );
    assert_eq!(sorted(&seen["usr"]), ["bin", "lib", "lib64", "share"]);
    assert_eq!(sorted(&seen["usr_bin"]), ["python3", "python3.11"]);
    assert_eq!(
        sorted(&seen["usr_lib"]),
        ["python3", "python3.11", "x86_64-linux-gnu"]
    );
    for (path, outcome) in seen["writes"].as_object().unwrap() {
        let refused = ["EROFS", "EACCES", "ENOENT"].contains(&outcome.as_str().unwrap());
        assert!(refused, "{path} could be written: {outcome}");
    }
}

#[test]
fn host_secrets_and_other_processes_are_unreachable() {
    let root_canary = format!("/root/airlock-canary-{}", std::process::id());
    let tmp_canary = format!("/tmp/airlock-canary-{}", std::process::id());
    std::fs::write(&root_canary, "secret").unwrap();
    std::fs::write(&tmp_canary, "secret").unwrap();
    let r = run(
        r#"
import os, json, errno
out = {}
paths = ["/etc/shadow", "/root", os.environ["ROOT_CANARY"], os.environ["TMP_CANARY"], "/home",
         "/sys", "/boot", "/var", "/run", "/proc/1/environ", "/proc/1/root/etc", "/proc/1/cwd",
         "/proc/1/exe", "/proc/1/mem", "/proc/1/fd", "/proc/1/maps", "/proc/sys", "/proc/kcore",
         "/proc/sysrq-trigger", "/proc/kallsyms", "/dev/vda", "/dev/mem", "/dev/kmsg"]
for p in paths:
    try:
        out[p] = os.listdir(p) if os.path.isdir(p) else open(p, "rb").read(64).decode("latin1")
    except OSError as e:
        out[p] = errno.errorcode[e.errno]
environs = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            environs.append(open("/proc/%s/environ" % p, "rb").read().decode("latin1"))
        except OSError:
            pass
print(json.dumps({"paths": out, "env": dict(os.environ), "environs": environs}))
"#,
        &[
            "--env",
            &format!("ROOT_CANARY={root_canary}"),
            "--env",
            &format!("TMP_CANARY={tmp_canary}"),
        ],
    );
    std::fs::remove_file(&root_canary).unwrap();
    std::fs::remove_file(&tmp_canary).unwrap();
    assert_eq!(r.status(), "ok", "{r:#?}");
    let seen = r.printed();
    for (path, got) in seen["paths"].as_object().unwrap() {
        let denied = got
            .as_str()
            .is_some_and(|e| ["ENOENT", "EACCES", "EPERM"].contains(&e));
        assert!(denied, "{path} was readable: {got}");
    }
    let env = seen["env"].as_object().unwrap();
    let mut names: Vec<&str> = env.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "HOME",
            "LANG",
            "MATPLOTLIBRC",
            "MPLBACKEND",
            "MPLCONFIGDIR",
            "PATH",
            "PIP_DISABLE_PIP_VERSION_CHECK",
            "PIP_NO_CACHE_DIR",
            "PIP_TARGET",
            "ROOT_CANARY",
            "TMPDIR",
            "TMP_CANARY"
        ]
    );
    assert!(
        !seen.to_string().contains("host-secret-value"),
        "the caller's environment leaked: {seen}"
    );
}

#[test]
fn writable_directories_are_one_capped_noexec_tmpfs() {
    let r = run(
        r#"
import os, json, errno, shutil
out = {}
for d in ["/tmp", "/work", "/dev/shm"]:
    st = os.statvfs(d)
    out[d] = [st.f_blocks * st.f_frsize, os.stat(d).st_dev]
    open(d + "/probe", "w").write("x")
shutil.copy("/usr/bin/python3", "/tmp/py")
os.chmod("/tmp/py", 0o755)
try:
    os.execv("/tmp/py", ["py", "-c", "pass"])
except OSError as e:
    out["exec"] = errno.errorcode[e.errno]
out["cwd"] = os.getcwd()
out["mounts"] = [l.split()[4] + " " + l.split()[5] for l in open("/proc/self/mountinfo")
                 if l.split()[4] in ("/tmp", "/work", "/dev/shm")]
# Every mount of the scratch file system, wherever it is: its own (parked on the old root's
# /proc while the root was built) must have left with the old root.
scratch = [l.split()[2] for l in open("/proc/self/mountinfo") if l.split()[4] == "/tmp"][0]
out["scratch_mounts"] = sorted(l.split()[3] + " " + l.split()[4] for l in open("/proc/self/mountinfo")
                               if l.split()[2] == scratch)
print(json.dumps(out))
"#,
        &["--disk", "32M"],
    );
    assert_eq!(r.status(), "ok", "{r:#?}");
    let out = r.printed();
    for d in ["/tmp", "/work", "/dev/shm"] {
        assert_eq!(out[d][0], 32u64 << 20, "{d} is not the 32 MiB tmpfs: {out}");
        assert_eq!(
            out[d][1], out["/tmp"][1],
            "{d} is not the same file system as /tmp"
        );
    }
    assert_eq!(
        out["exec"], "EACCES",
        "a file written in the sandbox could be executed"
    );
    assert_eq!(out["cwd"], "/work");
    assert_eq!(out["mounts"].as_array().unwrap().len(), 3);
    assert_eq!(
        out["scratch_mounts"],
        serde_json::json!(["/0 /tmp", "/1 /work", "/2 /dev/shm"]),
        "the scratch file system is mounted elsewhere too"
    );
    for m in out["mounts"].as_array().unwrap() {
        let opts = m.as_str().unwrap();
        for flag in ["nosuid", "nodev", "noexec"] {
            assert!(opts.contains(flag), "{opts} lacks {flag}");
        }
    }
}

#[test]
fn the_network_namespace_is_empty() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let tcp6 = TcpListener::bind("[::1]:0").expect("IPv6 loopback");
    tcp6.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let abstract_name = format!("airlock-test-{}", std::process::id());
    let abstract_listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        UnixListener::bind_addr(&addr).unwrap()
    };
    abstract_listener.set_nonblocking(true).unwrap();
    let env = |k: &str, v: String| format!("{k}={v}");
    let args = [
        "--env".to_owned(),
        env("TCP", tcp.local_addr().unwrap().port().to_string()),
        "--env".to_owned(),
        env("TCP6", tcp6.local_addr().unwrap().port().to_string()),
        "--env".to_owned(),
        env("UDP", udp.local_addr().unwrap().port().to_string()),
        "--env".to_owned(),
        env("ABSTRACT", abstract_name),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run(
        r#"
import socket, json, errno, os
# (socket.if_nameindex() would need netlink, which the filter refuses.)
out = {"interfaces": [l.split(":")[0].strip() for l in open("/proc/self/net/dev").readlines()[2:]]}
def attempt(name, fn):
    try:
        fn()
        out[name] = "connected"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
env = os.environ
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", int(env["TCP"])), timeout=2))
attempt("tcp6", lambda: socket.create_connection(("::1", int(env["TCP6"])), timeout=2))
attempt("metadata", lambda: socket.create_connection(("169.254.169.254", 80), timeout=2))
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", ("127.0.0.1", int(env["UDP"])))
attempt("udp", udp)
def abstract():
    s = socket.socket(socket.AF_UNIX)
    s.connect("\0" + env["ABSTRACT"])
attempt("abstract", abstract)
print(json.dumps(out))
"#,
        &args,
    );
    assert_eq!(r.status(), "ok", "{r:#?}");
    let out = r.printed();
    assert_eq!(out["interfaces"], json!(["lo"]), "{out}");
    for key in ["tcp", "tcp6", "metadata", "dns", "udp", "abstract"] {
        assert_ne!(out[key], "connected", "{key} reached the host: {out}");
    }
    assert!(
        tcp.accept().is_err(),
        "the host's TCP listener got a connection"
    );
    assert!(
        tcp6.accept().is_err(),
        "the host's TCP6 listener got a connection"
    );
    let mut buf = [0u8; 8];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "the host's UDP socket got a datagram"
    );
    assert!(
        abstract_listener.accept().is_err(),
        "the host's abstract socket got a connection"
    );
}

#[test]
fn no_privileges_no_terminal_and_only_its_own_descriptors() {
    // airlock itself holds an extra inherited descriptor (7) and runs under a pseudo-terminal,
    // as an interactive user's shell would have it.
    let _guard = serial();
    let before = HostState::now();
    let code = r#"
import os, json
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
try:
    open("/dev/tty")
    tty = "opened"
except OSError as e:
    tty = e.errno
keys = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"]
print(json.dumps({**{k: status[k].strip() for k in keys}, "fds": fds, "tty_nr": int(stat[4]),
                  "sid_is_pid": os.getsid(0) == os.getpid(), "dev_tty": tty,
                  "oom_score_adj": open("/proc/self/oom_score_adj").read().strip()}))
"#;
    let script = std::env::temp_dir().join(format!("airlock-tty-{}.py", std::process::id()));
    std::fs::write(&script, code).unwrap();
    let shell = format!(
        "exec 7</etc/hostname; exec {} run --json {}",
        env!("CARGO_BIN_EXE_airlock"),
        script.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &shell, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script(1) from util-linux");
    std::fs::remove_file(&script).unwrap();
    HostState::now().assert_same_as(&before, &out);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("{text}"));
    let result: Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(result["status"], "ok", "{result}");
    let seen: Value = serde_json::from_str(result["stdout"].as_str().unwrap().trim()).unwrap();
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(seen[cap], "0000000000000000", "{cap}: {seen}");
    }
    assert_eq!(seen["NoNewPrivs"], "1");
    assert_eq!(seen["Seccomp"], "2", "seccomp filter mode");
    // The OOM killer's first choice, before the sandbox's own processes that report.
    assert_eq!(seen["oom_score_adj"], "1000");
    // 0, 1, 2, the protocol's channel 3, and the descriptor listing /proc/self/fd itself.
    assert_eq!(seen["fds"], json!([0, 1, 2, 3, 4]), "{seen}");
    assert_eq!(seen["tty_nr"], 0, "the program has a controlling terminal");
    assert_eq!(
        seen["sid_is_pid"], true,
        "the program is not in a session of its own"
    );
    assert_eq!(seen["dev_tty"], 2, "/dev/tty should not exist (ENOENT)");
}

#[test]
fn sandboxes_run_as_a_host_uid_of_their_own_and_die_with_airlock() {
    use nix::sys::signal::{SIGINT, SIGQUIT, SIGTERM};
    for signal in [SIGTERM, SIGINT, SIGQUIT] {
        let _guard = serial();
        let before = HostState::now();
        let mut live = start(
            &["run", "-"],
            Some(b"import time\nprint('ready', flush=True)\ntime.sleep(60)\n"),
        );
        assert_eq!(live.line(), "ready");
        let procs: Vec<String> = sandbox_processes()
            .into_iter()
            .filter(|p| !before.sandbox_processes().contains(p))
            .collect();
        let uids: Vec<u32> = procs
            .iter()
            .map(|p| {
                let dir = p.split_whitespace().next().unwrap();
                let status = std::fs::read_to_string(format!("{dir}/status")).unwrap();
                let line = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
                line.split_whitespace().next().unwrap().parse().unwrap()
            })
            .collect();
        // The outer init, PID 1 and the program: one unprivileged host uid for all three.
        assert_eq!(uids.len(), 3, "{procs:?}");
        assert!(
            uids.iter()
                .all(|&u| u == uids[0] && u >= airlock_sandbox::HOST_ID_BASE),
            "{uids:?}"
        );
        assert!(!sandbox_cgroups().is_empty(), "the sandbox has no cgroup");
        let pid = nix::unistd::Pid::from_raw(live.child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        let status = live.child.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(128 + signal as i32),
            "airlock should exit 128+{signal}"
        );
        HostState::now().assert_same_as(&before, &status);
    }
}

#[test]
fn a_sandbox_dies_even_when_airlock_is_killed_outright() {
    let _guard = serial();
    // Orphans of the killed airlock come to this process (see `common::own`), which
    // reaps those that ended as it counts them: what is left is what still lives.
    let before = HostState::now();
    let mut live = start(
        &["run", "--timeout", "60s", "-"],
        Some(b"import time\nprint('ready', flush=True)\ntime.sleep(60)\n"),
    );
    assert_eq!(live.line(), "ready");
    assert_eq!(
        sandbox_processes().len(),
        before.sandbox_processes().len() + 3
    );
    live.child.kill().unwrap(); // SIGKILL: airlock cannot clean up anything
    live.child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sandbox_processes() != before.sandbox_processes() && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        sandbox_processes(),
        before.sandbox_processes(),
        "the sandbox outlived airlock"
    );
    // Nothing could remove its cgroup; the next airlock sweeps it away.
    let left: Vec<_> = sandbox_cgroups()
        .into_iter()
        .filter(|c| !before.sandbox_cgroups().contains(c))
        .collect();
    assert!(!left.is_empty(), "the killed airlock's cgroup is gone");
    let r = invoke(&["run", "--json"], b"1");
    assert_eq!(r.status(), "ok");
    HostState::now().assert_same_as(&before, &r);
}

/// The host check counts what this test left, whatever became of the airlock that made it,
/// and nothing of another airlock's (one killed beside the suite, whose sandboxes die
/// reparented and whose cgroups stay): a process of a sandbox uid whose parent ended is
/// handed to this process and counts; on cgroup v1 a sandbox cgroup counts beneath this
/// process's own pids cgroup and not beside it, where another airlock makes its.
#[test]
fn the_host_check_counts_this_test_s_leftovers_and_no_other_airlock_s() {
    use nix::sys::signal::{kill, SIGKILL};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};
    let _guard = serial();
    let before = HostState::now();
    // No sandbox has this uid: it is above every pid an outer init can have.
    let uid = airlock_sandbox::HOST_ID_BASE + (1 << 22) + 1;
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "setpriv --reuid={uid} --regid={uid} --clear-groups sleep 600 \
             </dev/null >/dev/null 2>&1 & echo $!"
        ))
        .output()
        .unwrap();
    let orphan: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    struct Killed(i32);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = kill(Pid::from_raw(self.0), SIGKILL);
        }
    }
    let killed = Killed(orphan as i32);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = || std::fs::read_to_string(format!("/proc/{orphan}/status")).unwrap();
    while !status().contains(&format!("\nUid:\t{uid}\t")) {
        assert!(Instant::now() < deadline, "{}", status());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        status().contains(&format!("\nPPid:\t{}\n", std::process::id())),
        "the orphan was not handed to this process: {}",
        status()
    );
    let now = HostState::now();
    let left = now.new_sandbox_processes(&before);
    assert!(
        left.iter()
            .any(|p| p.starts_with(&format!("/proc/{orphan} "))),
        "{left:?}"
    );
    if let Some(own) = own_pids_cgroup_dir() {
        let layout = airlock_sandbox::host_support()
            .cgroup
            .clone()
            .expect("cgroups");
        // Named after this process, which no airlock sweeps away while it lives.
        let ours = format!("airlock-{}-70", std::process::id());
        let theirs = format!("airlock-{}-71", std::process::id());
        let mut made = Vec::new();
        for parent in layout.parents() {
            // Where this test's airlocks make theirs, and where another airlock makes its.
            let elsewhere = if parent == own {
                own.parent().unwrap().to_owned()
            } else {
                parent.clone()
            };
            for dir in [parent.join(&ours), elsewhere.join(&theirs)] {
                std::fs::create_dir(&dir).unwrap();
                made.push(dir);
            }
        }
        let found = sandbox_cgroups();
        let count = |name: &str| found.iter().filter(|d| d.ends_with(name)).count();
        let counted = (count(&ours), count(&theirs));
        for dir in made.iter().rev() {
            std::fs::remove_dir(dir).unwrap();
        }
        assert_eq!(counted, (layout.parents().len(), 0), "{found:#?}");
    }
    drop(killed);
    // Its zombie is this process's to reap, which counting does.
    while !HostState::now().new_sandbox_processes(&before).is_empty() {
        assert!(Instant::now() < deadline, "{:?}", sandbox_processes());
        std::thread::sleep(Duration::from_millis(10));
    }
    HostState::now().assert_same_as(&before, &"after the orphan");
}
