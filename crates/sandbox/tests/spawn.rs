//! The library on its own: spawn programs under a policy and read the outcome. This binary is
//! also the sandboxes' init, so it has its own `main` (no libtest harness).

mod support;

use std::io::Read;
use std::time::{Duration, Instant};

use airlock_sandbox::{
    run_if_init, spawn, Command, Exit, KillReason, Outcome, Policy, Prestarted, SpawnError,
    WaitError,
};

fn sh(script: &str) -> Command {
    Command::new("/usr/bin/sh").args(["-c", script])
}

fn outcome(cmd: Command, policy: &Policy) -> Outcome {
    spawn(cmd, policy).expect("spawn").wait().expect("wait")
}

fn exit_codes_and_signals_come_from_the_kernel() {
    let p = support::usr_policy();
    assert_eq!(outcome(sh("exit 0"), &p).exit, Some(Exit::Code(0)));
    assert_eq!(outcome(sh("exit 42"), &p).exit, Some(Exit::Code(42)));
    assert_eq!(
        outcome(sh("kill -SEGV $$"), &p).exit,
        Some(Exit::Signal(11))
    );
    assert_eq!(
        outcome(sh("kill -RTMIN $$"), &p).exit,
        Some(Exit::Signal(libc::SIGRTMIN()))
    );
}

fn the_wall_clock_and_the_killer_end_a_sandbox() {
    let mut p = support::usr_policy();
    p.limits.wall_time = Duration::from_millis(300);
    let o = outcome(sh("sleep 60"), &p);
    assert_eq!((o.killed, o.exit), (Some(KillReason::WallTime), None));

    p.limits.wall_time = Duration::from_secs(60);
    let child = spawn(sh("sleep 60"), &p).unwrap();
    let killer = child.killer();
    let started = Instant::now();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        killer.kill(KillReason::Cancelled);
    });
    let o = child.wait().unwrap();
    assert_eq!(o.killed, Some(KillReason::Cancelled));
    assert!(started.elapsed() < Duration::from_secs(30));
}

fn a_default_policy_shows_nothing_of_the_host() {
    // Nothing is mounted, so not even a shell exists: the exec fails and says so.
    let err = spawn(Command::new("/usr/bin/true"), &Policy::default())
        .unwrap()
        .wait()
        .unwrap_err();
    match err {
        WaitError::Setup { stage, error } => {
            assert_eq!(stage, "program");
            assert!(
                error.contains("execve") && error.contains("No such file"),
                "{error}"
            );
        }
        other => panic!("{other:?}"),
    }
}

fn descriptors_pass_through_at_3() {
    let (r, w) = nix::unistd::pipe().unwrap();
    let child = spawn(sh("echo through >&3").pass_fd(w), &support::usr_policy()).unwrap();
    let o = child.wait().unwrap();
    assert_eq!(o.exit, Some(Exit::Code(0)));
    let mut got = String::new();
    std::fs::File::from(r).read_to_string(&mut got).unwrap();
    assert_eq!(got, "through\n");
}

/// Host pids of this process's children that are sandbox inits (this binary, re-executed).
fn init_children() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...
        let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
        if after.split(' ').nth(1) == Some(me.as_str()) {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

fn an_init_started_ahead_gets_the_descriptors_with_its_request() {
    let policy = support::usr_policy();
    let before = init_children();
    // A fork of this process that makes itself an init: named so, with stdio on pipes and
    // its status socket, nothing else of ours open.
    let unused = Prestarted::start().unwrap();
    let new: Vec<String> = init_children()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(new.len(), 1);
    let proc = format!("/proc/{}", new[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let fds = loop {
        let comm = std::fs::read_to_string(format!("{proc}/comm")).unwrap();
        let fds: Vec<(i32, String)> = std::fs::read_dir(format!("{proc}/fd"))
            .unwrap()
            .flatten()
            .map(|e| {
                let n = e.file_name().to_string_lossy().parse().unwrap();
                (
                    n,
                    std::fs::read_link(e.path()).unwrap().display().to_string(),
                )
            })
            .collect();
        if comm == "airlock-sandbox\n" && fds.len() == 4 {
            break fds;
        }
        assert!(Instant::now() < deadline, "{comm:?} {fds:?}");
        std::thread::sleep(Duration::from_millis(5));
    };
    for (n, target) in &fds {
        let kind = if *n == 3 { "socket:" } else { "pipe:" };
        assert!(*n <= 3 && target.starts_with(kind), "{fds:?}");
    }
    // Unused, it is killed and reaped: nothing of it is left.
    drop(unused);
    assert_eq!(init_children(), before);

    // Used: the program's descriptors travel with the request and land at 3, 4, ... in
    // order, and nothing else of the host's is open in the program.
    // Close-on-exec, so the init inherits none of them: those it receives then take the
    // lowest free numbers, which are where they must go.
    let pipes: Vec<_> = (0..3)
        .map(|_| nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap())
        .collect();
    let mut cmd = sh("for fd in 3 4 5; do echo \"at $fd\" >&$fd; done; ls /proc/self/fd");
    let mut readers = Vec::new();
    for (r, w) in pipes {
        cmd = cmd.pass_fd(w);
        readers.push(r);
    }
    let mut child = spawn(cmd.prestarted(Prestarted::start().unwrap()), &policy).unwrap();
    let mut listed = String::new();
    child
        .take_stdout()
        .unwrap()
        .read_to_string(&mut listed)
        .unwrap();
    let o = child.wait().unwrap();
    assert_eq!(o.exit, Some(Exit::Code(0)));
    for (i, r) in readers.into_iter().enumerate() {
        let mut got = String::new();
        std::fs::File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, format!("at {}\n", i + 3));
    }
    // 0-2, the three passed, and the descriptor `ls` reads the directory with.
    assert_eq!(listed.split_whitespace().count(), 7, "{listed}");
    assert_eq!(init_children(), before);
}

fn namespace(pid: &str, ns: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// An init started ahead makes its user, mount, PID, network, IPC and UTS namespaces (and
/// drops the host's rights) before any request, while the host prepares; the cgroup
/// namespace only once the request has put it in the sandbox's cgroup. A sandbox made with it
/// is the one an executed init makes; a policy with other ids gets an executed init.
fn an_init_started_ahead_makes_its_namespaces_before_its_request() {
    let policy = support::usr_policy();
    let before = init_children();
    let init = Prestarted::start().unwrap();
    let pid = init_children()
        .into_iter()
        .find(|p| !before.contains(p))
        .unwrap();
    let me = std::process::id().to_string();
    let made = ["user", "mnt", "pid_for_children", "net", "ipc", "uts"];
    let deadline = Instant::now() + Duration::from_secs(10);
    while made
        .iter()
        .any(|ns| namespace(&pid, ns) == namespace(&me, ns))
    {
        assert!(Instant::now() < deadline, "no namespaces made ahead");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(namespace(&pid, "cgroup"), namespace(&me, "cgroup"));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(!uid.split_whitespace().skip(1).any(|u| u == "0"), "{uid}");

    // Its sandbox: in its own cgroup, with every process there (the init too), the cgroup
    // namespace rooted there, the policy's uid.
    let script = "cat /proc/self/cgroup; id -u; exec sleep 60";
    let mut child = spawn(sh(script).prestarted(init), &policy).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut pids = child.processes();
    // The outer init, PID 1 and `sleep` once `cat` and `id` are done.
    while pids.len() != 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        pids = child.processes();
    }
    assert_eq!(pids.len(), 3, "{pids:?}");
    assert!(pids.contains(&(child.id() as i32)), "{pids:?}");
    child.killer().kill(KillReason::Cancelled);
    let out = support::stdout_of(&mut child);
    child.wait().unwrap();
    let (cgroups, id) = out.trim_end().rsplit_once('\n').unwrap();
    assert_eq!(id, "1000");
    for line in cgroups.lines() {
        assert!(line.ends_with(":/"), "{out}");
    }
    assert_eq!(init_children(), before);

    // Other ids than the ones it mapped: an executed init instead, nothing of it left.
    let mut other = support::usr_policy();
    other.uid = 2000;
    other.gid = 2000;
    let mut child = spawn(
        sh("id -u; id -g").prestarted(Prestarted::start().unwrap()),
        &other,
    )
    .unwrap();
    let out = support::stdout_of(&mut child);
    assert_eq!(child.wait().unwrap().exit, Some(Exit::Code(0)));
    assert_eq!(out, "2000\n2000\n");
    assert_eq!(init_children(), before);
}

fn outcomes_report_usage_and_isolation() {
    let o = outcome(sh("exit 0"), &support::usr_policy());
    assert_eq!(o.isolation.namespaces.len(), 7);
    assert!(o.isolation.seccomp && o.isolation.no_new_privs && o.isolation.capabilities_dropped);
    assert!(o.isolation.downgraded.is_empty());
    assert!(o.usage.cpu.is_some() && o.usage.memory_peak_bytes.is_some());
}

fn every_process_of_a_sandbox_is_in_its_cgroup_once() {
    let child = spawn(sh("exec sleep 60"), &support::usr_policy()).unwrap();
    // The outer init, PID 1 and the program, each listed once though v1 has a directory per
    // controller; the outer init among them, however it got there.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut pids = child.processes();
    while pids.len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        pids = child.processes();
    }
    assert_eq!(pids.len(), 3, "{pids:?}");
    assert!(pids.contains(&(child.id() as i32)), "{pids:?}");
    let mut unique = pids.clone();
    unique.dedup();
    assert_eq!(unique, pids);
    child.killer().kill(KillReason::Cancelled);
    assert_eq!(child.wait().unwrap().killed, Some(KillReason::Cancelled));
}

/// The egress listener lives in the sandbox's namespace and is served by the host: the program
/// reaches it on its loopback, and no other TCP port at all (Landlock).
fn the_egress_listener_is_the_only_tcp_destination() {
    use std::io::Write;
    let mut p = support::usr_policy();
    p.egress_port = Some(3128);
    let script = [
        "import socket",
        "s = socket.create_connection(('127.0.0.1', 3128)); print(s.recv(16).decode())",
        "for port in (3129, 80):",
        "    try: socket.create_connection(('127.0.0.1', port), timeout=2)",
        "    except OSError as e: print(port, e.errno)",
    ]
    .join("\n");
    let mut child = spawn(
        Command::new("/usr/bin/python3").args(["-I", "-c", &script]),
        &p,
    )
    .unwrap();
    let listener = child.take_egress_listener().expect("a listener");
    assert!(child.take_egress_listener().is_none());
    let mut out = child.take_stdout().unwrap();
    let mut err = child.take_stderr().unwrap();
    // Never blocks past the sandbox's end: accept fails once the test drops its listener.
    std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok((mut conn, _)) = listener.accept() {
                conn.write_all(b"from the host").unwrap();
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let o = child.wait().unwrap();
    let mut errors = String::new();
    err.read_to_string(&mut errors).unwrap();
    let mut got = String::new();
    out.read_to_string(&mut got).unwrap();
    assert_eq!(o.exit, Some(Exit::Code(0)), "{got} {errors}");
    // EACCES from Landlock, before any packet: not ECONNREFUSED from an empty port.
    assert_eq!(got, "from the host\n3129 13\n80 13\n");
    // Without egress, not even the port: loopback is down and Landlock refuses every connect.
    let mut child = spawn(
        Command::new("/usr/bin/python3").args(["-I", "-c", "import socket\ntry: socket.create_connection(('127.0.0.1', 3128))\nexcept OSError as e: print(e.errno)"]),
        &support::usr_policy(),
    )
    .unwrap();
    assert!(child.take_egress_listener().is_none());
    let mut out = child.take_stdout().unwrap();
    child.wait().unwrap();
    let mut got = String::new();
    out.read_to_string(&mut got).unwrap();
    assert_eq!(got, "13\n");
}

fn invalid_policies_are_refused_before_anything_starts() {
    let mut p = support::usr_policy();
    p.uid = 0;
    assert!(matches!(
        spawn(sh("exit 0"), &p),
        Err(SpawnError::Policy(_))
    ));
}

/// Loop devices backed by a file below `dir` (`/sys/block/loop*/loop/backing_file`).
fn loops_backed_in(dir: &std::path::Path) -> usize {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|f| f.starts_with(&dir))
        })
        .count()
}

/// Issue 45: a bounded directory, bound writable into a sandbox, stops the sandbox's writes at
/// its size and entry count while they happen (ENOSPC), for both kinds; it never appears in the
/// host's mount table, and nothing of it (mount, loop device, image) outlives it.
fn a_bounded_dir_stops_a_sandbox_s_writes_at_its_bytes_and_entries() {
    use airlock_sandbox::{BoundedDir, BoundedKind, RootEntry};
    const MIB: u64 = 1 << 20;
    let dir = std::env::temp_dir().join(format!("airlock-bounded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mountinfo = || std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let before = mountinfo();
    for kind in [BoundedKind::Ext4Loop, BoundedKind::Tmpfs] {
        let bounded = BoundedDir::create_as(kind, &dir, 8 * MIB, 64).unwrap();
        assert_eq!(bounded.kind(), kind);
        assert_eq!(mountinfo(), before, "{kind:?} is in the host's mount table");
        let loops = usize::from(kind == BoundedKind::Ext4Loop);
        assert_eq!(loops_backed_in(&dir), loops, "{kind:?}");
        assert!(
            std::fs::read_dir(&dir).unwrap().next().is_none(),
            "the image has no name"
        );
        let mut policy = support::usr_policy();
        policy.root.push(RootEntry::Writable {
            source: bounded.bind_source(),
            target: "/out".into(),
        });
        // 12 MiB into 8 (under RLIMIT_FSIZE's 16), then empty files until refused.
        let script = "head -c 12582912 /dev/zero > /out/big; echo big=$?; \
                      echo size=$(stat -c %s /out/big); rm /out/big; i=0; \
                      while [ $i -lt 1000 ] && touch /out/f$i 2>/dev/null; do i=$((i+1)); done; \
                      echo files=$i";
        let mut child = spawn(sh(script), &policy).unwrap();
        let out = support::stdout_of(&mut child);
        assert_eq!(child.wait().unwrap().exit, Some(Exit::Code(0)), "{out}");
        let field = |name: &str| -> u64 {
            out.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{kind:?}: no {name} in {out}"))
        };
        assert_eq!(field("big"), 1, "{kind:?}: {out}");
        assert!(field("size") <= 8 * MIB, "{kind:?}: {out}");
        let files = field("files");
        assert!((16..64).contains(&files), "{kind:?}: {out}");
        // The host reads what the sandbox wrote through its descriptor.
        let seen = std::fs::read_dir(bounded.path()).unwrap().count() as u64;
        assert_eq!(seen, files, "{kind:?}");
        drop(bounded);
        let deadline = Instant::now() + Duration::from_secs(5);
        while loops_backed_in(&dir) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            loops_backed_in(&dir),
            0,
            "{kind:?}: its loop device outlived it"
        );
        assert_eq!(mountinfo(), before, "{kind:?}");
    }
    std::fs::remove_dir(&dir).unwrap();
}

/// Issue 48: a volume is a bounded file system kept in an image file, mounted by one holder at
/// a time; each sandbox (a host uid of its own) sees its files as its own through an idmapped
/// mount, writes them as uid 1000 on the volume, cannot exec from it, is stopped at its bytes
/// and entries, and cannot write it when it is mounted read-only. What was written is there
/// when the image is mounted again.
fn a_volume_is_kept_bounded_and_each_sandbox_sees_its_files_as_its_own() {
    use airlock_sandbox::{BoundedDir, BoundedError, PolicyError, VolumeMount};
    use std::os::unix::fs::MetadataExt;
    const MIB: u64 = 1 << 20;
    let dir = std::env::temp_dir().join(format!("airlock-volume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("image");
    let volume = BoundedDir::create_image(&image, 8 * MIB, 64).unwrap();
    std::os::unix::fs::chown(volume.path(), Some(1000), Some(1000)).unwrap();
    assert!(
        matches!(BoundedDir::open_image(&image), Err(BoundedError::Busy(_))),
        "a second mount of an open image"
    );
    let policy_with = |read_only: bool| {
        let mut policy = support::usr_policy();
        policy.volumes.push(VolumeMount {
            source: volume.bind_source(),
            target: "/tmp/data".into(),
            read_only,
        });
        policy
    };
    let run = |script: &str, read_only: bool| {
        let mut child = spawn(sh(script), &policy_with(read_only)).unwrap();
        let out = support::stdout_of(&mut child);
        assert_eq!(child.wait().unwrap().exit, Some(Exit::Code(0)), "{out}");
        out
    };
    let first = run(
        "cd /tmp/data && echo one > a && mkdir d && echo two > d/b && chmod 600 a && \
         stat -c '%u:%g %a' a",
        false,
    );
    assert_eq!(first.trim(), "1000:1000 600");
    // Another sandbox, another host uid: the files are its own.
    let second = run(
        "cd /tmp/data && cat a && echo three >> a && rm d/b && rmdir d && \
         cp /usr/bin/true t && ./t; echo exec=$?; \
         head -c 12582912 /dev/zero > big; echo big=$?; rm big; i=0; \
         while [ $i -lt 1000 ] && touch f$i 2>/dev/null; do i=$((i+1)); done; echo files=$i; \
         rm -f f* t",
        false,
    );
    assert!(second.starts_with("one\n"), "{second}");
    assert!(second.contains("exec=126"), "noexec: {second}");
    assert!(second.contains("big=1"), "bounded in bytes: {second}");
    let files: u64 = second
        .lines()
        .find_map(|l| l.strip_prefix("files="))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!((16..64).contains(&files), "bounded in entries: {second}");
    let ro = run(
        "cat /tmp/data/a; (echo x > /tmp/data/new) 2>/dev/null && echo wrote; \
         rm /tmp/data/a 2>/dev/null && echo removed; echo done",
        true,
    );
    assert_eq!(ro, "one\nthree\ndone\n", "read-only");
    // On the volume's own file system the owner is the policy's uid, not the host's.
    let meta = std::fs::metadata(volume.path().join("a")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    // A target that is not below a scratch mount point is refused before anything starts.
    let mut outside = policy_with(false);
    outside.volumes[0].target = "/usr/data".into();
    assert!(matches!(
        spawn(sh("true"), &outside),
        Err(SpawnError::Policy(PolicyError::VolumeTarget(_)))
    ));
    drop(volume);
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        match BoundedDir::open_image(&image) {
            Err(BoundedError::Busy(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(
        std::fs::read_to_string(again.path().join("a")).unwrap(),
        "one\nthree\n"
    );
    drop(again);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn main() {
    run_if_init();
    let tests: &[(&str, fn())] = &[
        (
            "exit_codes_and_signals_come_from_the_kernel",
            exit_codes_and_signals_come_from_the_kernel,
        ),
        (
            "the_wall_clock_and_the_killer_end_a_sandbox",
            the_wall_clock_and_the_killer_end_a_sandbox,
        ),
        (
            "a_default_policy_shows_nothing_of_the_host",
            a_default_policy_shows_nothing_of_the_host,
        ),
        (
            "descriptors_pass_through_at_3",
            descriptors_pass_through_at_3,
        ),
        (
            "an_init_started_ahead_gets_the_descriptors_with_its_request",
            an_init_started_ahead_gets_the_descriptors_with_its_request,
        ),
        (
            "an_init_started_ahead_makes_its_namespaces_before_its_request",
            an_init_started_ahead_makes_its_namespaces_before_its_request,
        ),
        (
            "the_egress_listener_is_the_only_tcp_destination",
            the_egress_listener_is_the_only_tcp_destination,
        ),
        (
            "outcomes_report_usage_and_isolation",
            outcomes_report_usage_and_isolation,
        ),
        (
            "every_process_of_a_sandbox_is_in_its_cgroup_once",
            every_process_of_a_sandbox_is_in_its_cgroup_once,
        ),
        (
            "invalid_policies_are_refused_before_anything_starts",
            invalid_policies_are_refused_before_anything_starts,
        ),
        (
            "a_bounded_dir_stops_a_sandbox_s_writes_at_its_bytes_and_entries",
            a_bounded_dir_stops_a_sandbox_s_writes_at_its_bytes_and_entries,
        ),
        (
            "a_volume_is_kept_bounded_and_each_sandbox_sees_its_files_as_its_own",
            a_volume_is_kept_bounded_and_each_sandbox_sees_its_files_as_its_own,
        ),
    ];
    support::run_tests(tests);
}
