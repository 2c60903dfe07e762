//! The kernel surface: the seccomp filter and Landlock, tried from inside with raw system calls
//! (ctypes), with the real kernel as the oracle. THREAT-MODEL: kernel surface, network.

use crate::common;

use common::*;
use serde_json::json;

/// x86_64 numbers of calls only an escape attempt makes; each must kill the program.
const KILLED: &[(&str, u32)] = &[
    ("ptrace", 101),
    ("syslog", 103),
    ("modify_ldt", 154),
    ("pivot_root", 155),
    ("chroot", 161),
    ("acct", 163),
    ("settimeofday", 164),
    ("mount", 165),
    ("umount2", 166),
    ("swapon", 167),
    ("reboot", 169),
    ("sethostname", 170),
    ("iopl", 172),
    ("ioperm", 173),
    ("init_module", 175),
    ("delete_module", 176),
    ("clock_settime", 227),
    ("kexec_load", 246),
    ("add_key", 248),
    ("request_key", 249),
    ("keyctl", 250),
    ("unshare", 272),
    ("perf_event_open", 298),
    ("name_to_handle_at", 303),
    ("open_by_handle_at", 304),
    ("setns", 308),
    ("process_vm_readv", 310),
    ("process_vm_writev", 311),
    ("finit_module", 313),
    ("bpf", 321),
    ("userfaultfd", 323),
    ("io_uring_setup", 425),
    ("io_uring_enter", 426),
    ("open_tree", 428),
    ("move_mount", 429),
    ("fsopen", 430),
    ("pidfd_getfd", 438),
];

#[test]
fn escape_syscalls_kill_the_program() {
    for (name, nr) in KILLED {
        let code = format!("{LIBC}print('calling', flush=True)\nlibc.syscall({nr}, 0, 0, 0, 0, 0)\nprint('survived')");
        let r = run(&code, &[]);
        assert_eq!(
            r.status(),
            "policy_violation",
            "{name} ({nr}) was not killed: {r:#?}"
        );
        assert_eq!(r.json["signal"], SIGSYS, "{name}");
        assert_eq!(r.stdout_text(), "calling\n", "{name}: the program went on");
    }
}

const SIGSYS: i32 = 31;

#[test]
fn clone_with_namespace_flags_is_killed_and_clone3_refused() {
    // clone(CLONE_NEWUSER | SIGCHLD): the flags are in a register, so the filter sees them.
    let r = run(
        &format!("{LIBC}libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)"),
        &[],
    );
    assert_eq!(r.status(), "policy_violation", "{r:#?}");
    // clone3 keeps its flags in memory the filter cannot read: refused as if unknown (ENOSYS),
    // so the C library falls back to clone.
    let seen = probe(&format!(
        "{LIBC}rc = libc.syscall(435, 0, 0)\nprint(json.dumps([rc, ctypes.get_errno()]))\n\
         import threading\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()"
    ));
    assert_eq!(seen, json!([-1, 38]));
}

#[test]
fn other_architectures_and_x32_numbers_are_killed() {
    // x32 getpid: the x86_64 number with bit 30 set.
    let r = run(&format!("{LIBC}libc.syscall(0x40000000 | 39)"), &[]);
    assert_eq!(r.status(), "policy_violation", "x32: {r:#?}");
    // i386 getpid through `int 0x80` from a 64-bit process: the filter's architecture check.
    let code = format!(
        "{LIBC}import mmap\n\
         code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])  # mov eax, 20; int 0x80; ret\n\
         buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n\
         buf.write(code)\n\
         addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))\n\
         print('calling', flush=True)\n\
         ctypes.CFUNCTYPE(ctypes.c_int)(addr)()\n\
         print('survived')"
    );
    let r = run(&code, &[]);
    assert_eq!(r.stdout_text(), "calling\n", "{r:#?}");
    assert_eq!(r.status(), "policy_violation", "int 0x80: {r:#?}");
}

#[test]
fn a_second_filter_cannot_loosen_the_first() {
    // The program installs its own filter that allows everything, then tries unshare.
    let code = format!(
        "{LIBC}class Filter(ctypes.Structure):\n\
        \x20   _fields_ = [('code', ctypes.c_ushort), ('jt', ctypes.c_ubyte), ('jf', ctypes.c_ubyte), ('k', ctypes.c_uint)]\n\
         class Prog(ctypes.Structure):\n\
        \x20   _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.POINTER(Filter))]\n\
         allow_all = (Filter * 1)(Filter(0x06, 0, 0, 0x7fff0000))\n\
         prog = Prog(1, allow_all)\n\
         rc = libc.prctl(22, 2, ctypes.byref(prog), 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER\n\
         print('installed', rc, flush=True)\n\
         libc.syscall(272, 0x10000000)  # unshare(CLONE_NEWUSER)\n\
         print('survived')"
    );
    let r = run(&code, &[]);
    assert_eq!(r.stdout_text(), "installed 0\n", "{r:#?}");
    assert_eq!(r.status(), "policy_violation", "{r:#?}");
}

#[test]
fn unlisted_calls_fail_with_enosys_while_listed_ones_reach_the_kernel() {
    // A bad pointer tells "reached the kernel" (EFAULT) from "filtered" (ENOSYS), as
    // bubblewrap's try-syscall does.
    let seen = probe(&format!(
        "{LIBC}def probe(nr, *args):\n\
        \x20   rc = libc.syscall(nr, *args)\n\
        \x20   return [rc, ctypes.get_errno() if rc < 0 else 0]\n\
         print(json.dumps({{\n\
        \x20   'uname': probe(63, 1),            # allowed: EFAULT\n\
        \x20   'statfs': probe(137, 1, 1),       # allowed: EFAULT\n\
        \x20   'io_setup': probe(206, 1, 1),     # not listed: ENOSYS\n\
        \x20   'sync': probe(162),               # not listed (host-wide I/O): ENOSYS\n\
        \x20   'personality': probe(135, 0xffffffff),\n\
        \x20   'fanotify_mark': probe(301, 0, 0, 0, 0, 0),\n\
         }}))"
    ));
    assert_eq!(seen["uname"], json!([-1, 14]));
    assert_eq!(seen["statfs"], json!([-1, 14]));
    for unlisted in ["io_setup", "sync", "personality", "fanotify_mark"] {
        assert_eq!(seen[unlisted], json!([-1, 38]), "{unlisted}: {seen}");
    }
}

#[test]
fn only_local_and_ip_sockets_exist_and_never_raw() {
    let seen = probe(
        r#"
import socket, json
out = {}
for name, fam, typ in [("netlink", socket.AF_NETLINK, socket.SOCK_RAW),
                       ("packet", socket.AF_PACKET, socket.SOCK_RAW),
                       ("vsock", 40, socket.SOCK_STREAM),
                       ("alg", 38, socket.SOCK_SEQPACKET),
                       ("bluetooth", 31, socket.SOCK_STREAM),
                       ("raw4", socket.AF_INET, socket.SOCK_RAW),
                       ("raw6", socket.AF_INET6, socket.SOCK_RAW),
                       ("packet4", socket.AF_INET, 10),
                       ("unix", socket.AF_UNIX, socket.SOCK_STREAM),
                       ("unix_seqpacket", socket.AF_UNIX, socket.SOCK_SEQPACKET),
                       ("tcp", socket.AF_INET, socket.SOCK_STREAM),
                       ("udp6", socket.AF_INET6, socket.SOCK_DGRAM)]:
    try:
        socket.socket(fam, typ).close()
        out[name] = "created"
    except OSError as e:
        out[name] = e.errno
# Protocols the kernel would create or try to load a module for: refused before it is asked.
for name, fam, typ, proto in [("udplite", 2, 2, 136), ("mptcp", 2, 1, 262), ("sctp", 2, 1, 132),
                              ("sctp6", 10, 5, 132), ("dccp", 2, 6, 0), ("udp_as_tcp", 2, 2, 6),
                              ("icmp", 2, 2, 1), ("tcp_explicit", 2, 1, 6), ("udp_explicit", 10, 2, 17)]:
    try:
        socket.socket(fam, typ, proto).close()
        out[name] = "created"
    except OSError as e:
        out[name] = e.errno
print(json.dumps(out))
"#,
    );
    for fam in ["netlink", "packet", "vsock", "alg", "bluetooth"] {
        assert_eq!(seen[fam], 97, "{fam}: {seen}"); // EAFNOSUPPORT
    }
    for raw in ["raw4", "raw6", "packet4"] {
        assert_eq!(seen[raw], 1, "{raw}: {seen}"); // EPERM
    }
    for proto in [
        "udplite",
        "mptcp",
        "sctp",
        "sctp6",
        "dccp",
        "udp_as_tcp",
        "icmp",
    ] {
        assert_eq!(seen[proto], 93, "{proto}: {seen}"); // EPROTONOSUPPORT
    }
    for ok in [
        "unix",
        "unix_seqpacket",
        "tcp",
        "udp6",
        "tcp_explicit",
        "udp_explicit",
    ] {
        assert_eq!(seen[ok], "created", "{ok}: {seen}");
    }
}

#[test]
fn tiocsti_is_killed_even_with_high_bits_set() {
    for request in ["0x5412", "0x100005412", "0x541C"] {
        let code = format!("{LIBC}libc.ioctl(0, ctypes.c_ulong({request}), ctypes.c_char_p(b'x'))\nprint('survived')");
        let r = run(&code, &[]);
        assert_eq!(r.status(), "policy_violation", "ioctl {request}: {r:#?}");
    }
}

#[test]
fn landlock_is_enforced_reported_and_adds_a_wall() {
    let code = r#"
import socket, json, errno, os
def connect():
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1)
        return "connected"
    except OSError as e:
        return errno.errorcode[e.errno]
def bind():
    try:
        socket.socket().bind(("127.0.0.1", 0))
        return "bound"
    except OSError as e:
        return errno.errorcode[e.errno]
def signal_init():
    # PID 1 is airlock's init, outside the program's Landlock domain.
    try:
        os.kill(1, 0)
        return "sent"
    except OSError as e:
        return errno.errorcode[e.errno]
print(json.dumps({"connect": connect(), "bind": bind(), "signal": signal_init()}))
"#;
    let r = run(code, &[]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    assert_eq!(r.json["isolation"]["landlock"], "fully_enforced");
    assert!(
        r.json["isolation"]["landlock_abi"].as_u64().unwrap() >= 6,
        "{}",
        r.json["isolation"]
    );
    // Landlock refuses TCP connect and bind outright (EACCES), and signals leaving the
    // program's domain (EPERM) ...
    assert_eq!(
        r.printed(),
        json!({"connect": "EACCES", "bind": "EACCES", "signal": "EPERM"})
    );
    // ... where the empty network namespace alone would only find no route, and a signal
    // to init would be delivered (and ignored).
    let r = run(code, &["--downgrade", "landlock"]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    assert_eq!(r.json["isolation"]["landlock"], "disabled");
    assert_eq!(r.json["isolation"]["downgraded"], json!(["landlock"]));
    assert_eq!(r.printed()["connect"], "ENETUNREACH");
    assert_eq!(r.printed()["signal"], "sent");
}

#[test]
fn seccomp_downgrade_is_explicit_and_reported() {
    let code = format!("{LIBC}print(libc.syscall(272, 0))");
    if via_zygote() {
        // A zygote's filters are its children's: it never makes a sandbox without them.
        let r = invoke(
            &["run", "--zygote", "--downgrade", "seccomp", "-"],
            code.as_bytes(),
        );
        assert_ne!(r.exit, 0, "{r:#?}");
        assert!(r.stderr.contains("seccomp_downgraded"), "{r:#?}");
        return;
    }
    let r = run(&code, &["--downgrade", "seccomp"]);
    assert_eq!(r.json["isolation"]["seccomp"], "disabled", "{r:#?}");
    assert_eq!(r.json["isolation"]["downgraded"], json!(["seccomp"]));
    // unshare(0) is harmless and, without the filter, simply succeeds.
    assert_eq!((r.status(), r.stdout_text()), ("ok", "0\n"));
}

#[test]
fn disk_and_cache_calls_never_reach_the_host() {
    // The durability and cache calls are answered without running: on descriptor -1 the real
    // calls would fail with EBADF.
    let seen = probe(&format!(
        "{LIBC}def call(nr, *args):\n\
        \x20   rc = libc.syscall(nr, *args)\n\
        \x20   return [rc, ctypes.get_errno() if rc < 0 else 0]\n\
         print(json.dumps({{\n\
        \x20   'fsync': call(74, -1), 'fdatasync': call(75, -1), 'syncfs': call(306, -1),\n\
        \x20   'sync_file_range': call(277, -1, 0, 0, 0), 'fadvise64': call(221, -1, 0, 0, 4),\n\
        \x20   'readahead': call(187, -1, 0, 4096),\n\
         }}))"
    ));
    for call in [
        "fsync",
        "fdatasync",
        "syncfs",
        "sync_file_range",
        "fadvise64",
        "readahead",
    ] {
        assert_eq!(
            seen[call],
            json!([0, 0]),
            "{call} reached the kernel: {seen}"
        );
    }
    let seen = probe(&format!(
        "{LIBC}import errno, fcntl\n\
         out = {{}}\n\
         def attempt(name, fn):\n\
        \x20   try:\n\
        \x20       fn(); out[name] = 'done'\n\
        \x20   except OSError as e:\n\
        \x20       out[name] = errno.errorcode[e.errno]\n\
         attempt('o_direct', lambda: os.open('/usr/bin/python3', os.O_RDONLY | os.O_DIRECT))\n\
         fd = os.open('/usr/bin/python3', os.O_RDONLY)\n\
         attempt('setfl_direct', lambda: fcntl.fcntl(fd, fcntl.F_SETFL, os.O_DIRECT))\n\
         attempt('notify', lambda: fcntl.fcntl(os.open('/usr/lib', os.O_RDONLY), 1026, 0x80000001))\n\
         attempt('lease', lambda: fcntl.fcntl(fd, 1024, 0))\n\
         buf = bytearray(16)\n\
         attempt('nowait', lambda: os.preadv(fd, [buf], 0, 8))  # RWF_NOWAIT\n\
         attempt('plain_read', lambda: os.preadv(fd, [buf], 0))\n\
         rc = libc.syscall(437, -100, b'/usr/bin/python3', None, 0)  # openat2\n\
         out['openat2'] = errno.errorcode[ctypes.get_errno()] if rc < 0 else 'done'\n\
         rc = libc.inotify_init1(0)\n\
         out['inotify'] = errno.errorcode[ctypes.get_errno()] if rc < 0 else 'done'\n\
         print(json.dumps(out))"
    ));
    assert_eq!(
        seen,
        json!({"o_direct": "EINVAL", "setfl_direct": "EINVAL", "notify": "EINVAL", "lease": "EINVAL",
               "nowait": "EINVAL", "plain_read": "done", "openat2": "ENOSYS", "inotify": "ENOSYS"})
    );
}

#[test]
fn the_sandbox_s_init_is_out_of_the_program_s_reach() {
    // init (PID 1) shares the program's uid; nothing may change its limits or scheduling.
    let seen = probe(
        r#"
import os, json, errno, resource
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
attempt("prlimit_init", lambda: resource.prlimit(1, resource.RLIMIT_CPU, (1, 1)))
attempt("affinity_init", lambda: os.sched_setaffinity(1, {0}))
attempt("sched_init", lambda: os.sched_setscheduler(1, os.SCHED_BATCH, os.sched_param(0)))
attempt("nice_init", lambda: os.setpriority(os.PRIO_PROCESS, 1, 10))
attempt("nice_user", lambda: os.setpriority(os.PRIO_USER, 0, 10))
attempt("prlimit_self", lambda: resource.prlimit(0, resource.RLIMIT_NOFILE, (100, 100)))
attempt("affinity_self", lambda: os.sched_setaffinity(0, {0}))
attempt("nice_self", lambda: os.nice(1))
print(json.dumps(out))
"#,
    );
    assert_eq!(
        seen,
        json!({"prlimit_init": "EPERM", "affinity_init": "EPERM", "sched_init": "EPERM",
               "nice_init": "EPERM", "nice_user": "EPERM",
               "prlimit_self": "done", "affinity_self": "done", "nice_self": "done"})
    );
}
