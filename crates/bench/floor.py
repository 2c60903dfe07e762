# The least work a fresh sandbox for `print(1)` can cost on this machine: each step that
# issue 18 asks of a zygote's child, done once, by the shortest path, with nothing else.
# No server, no HTTP, no JSON request, no pool, no separate reaper, no zygote apart from the
# worker itself, one seccomp filter of a few instructions, one Landlock rule. Needs root;
# `airlock-bench --load N` runs it after airlock's own load, or by hand:
#
#   /usr/bin/python3 -I -S crates/bench/floor.py WORKERS SECONDS [STEPS]
#
# WORKERS processes, each a lean Python that has loaded what airlock's runner loads and then
# loops: a cgroup in each v1 hierarchy (or one on v2) with memory and pids limits; a fork; the
# fork joins it, takes an unprivileged uid, makes new user, mount, PID, network, IPC, UTS and
# cgroup namespaces and maps uid 1000 in; a fork again (PID 1 of the new PID namespace)
# builds the root airlock builds (a tmpfs, the interpreter's read-only binds, /proc, a /dev
# of five nodes, one scratch tmpfs bound at /tmp, /work and /dev/shm, pivot_root,
# read-only), sets rlimits, no_new_privs, drops every capability, applies Landlock and
# seccomp, compiles and runs `print(1)` with stdout on a pipe, writes a JSON answer on
# another, and exits. The worker reads the answer and the output, reads the cgroup's
# counters, removes it.
#
# STEPS (optional) is a comma-separated list of steps to leave out, to price each one:
# cgroup, netns, mounts, confine, python (no Python work in the fork), namespaces (none at
# all, and so no mounts), intermediate (with namespaces left out: one fork, which runs the
# program itself: a bare fork of a lean Python doing what `print(1)` needs).
#
# It prints the executions per second, the busy CPU per execution (all processes, from
# /proc/stat, as `airlock-bench --load` does, so the two compare), split into user and
# system time, and the forks' page faults per execution.
#
#   /usr/bin/python3 -I -S crates/bench/floor.py closed REQUESTS [POOL]
#
# The closed loop instead: one client, each request sent as soon as the last is answered, and
# sandboxes made ahead (POOL of them, 8 by default, as airlock's pool): a request takes one
# that is ready (or the next to be, waiting for it), tells it to run, reads its answer, output
# and exit and the cgroup's counters, and that is its latency; the sandbox that replaces it is
# forked after the answer (off the clock, where a server would have forked it on another core)
# and its cgroup removed then. Every step of the throughput loop, each done once. It prints
# p50 and p99 against a bare `python3 -I -S -c pass` timed in the same run, 40 times before
# the sandboxes are made and 40 after they are gone, and the loop's own rate and the time
# from one request's start to the next's (p50, p99): the work off the clock makes the loop
# slower than one request per p50, so it does not sustain its p50.
import _ast
import _json
import ctypes
import gc
import marshal
import os
import resource
import sys
import time

CLOSED = sys.argv[1] == "closed"
if CLOSED:
    REQUESTS, POOL, SKIP = int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 8, set()
else:
    WORKERS, SECONDS = int(sys.argv[1]), float(sys.argv[2])
    SKIP = set(sys.argv[3].split(",")) if len(sys.argv) > 3 and sys.argv[3] else set()

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT, SYS_CAPSET, SYS_SECCOMP = 155, 126, 317
SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD, SYS_LANDLOCK_RESTRICT = 444, 445, 446
PR_SET_NO_NEW_PRIVS = 38

BINDS = ["/usr/bin/python3.11", "/usr/lib/python3.11", "/usr/lib/python3/dist-packages",
         "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/share/zoneinfo", "/usr/share/matplotlib",
         "/etc/ld.so.cache"]
DEVS = ["null", "zero", "full", "random", "urandom"]
ROOT = b"/mnt"


def check(ret, what):
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))
    return ret


def mount(src, dst, fstype, flags, data=None):
    check(libc.mount(src, dst, fstype, flags, data), "mount %s" % dst)


def cgroup_dirs(name):
    if os.path.isdir("/sys/fs/cgroup/memory"):
        return ["/sys/fs/cgroup/%s/%s" % (c, name) for c in ("memory", "pids", "cpu", "cpuacct")]
    return ["/sys/fs/cgroup/" + name]


def make_cgroup(name):
    dirs = cgroup_dirs(name)
    for d in dirs:
        os.mkdir(d)
    v1 = len(dirs) > 1
    with open(dirs[0] + ("/memory.limit_in_bytes" if v1 else "/memory.max"), "w") as f:
        f.write(str(512 << 20))
    with open(dirs[1 if v1 else 0] + "/pids.max", "w") as f:
        f.write("64")
    return dirs


def read_counters(dirs):
    v1 = len(dirs) > 1
    names = ([dirs[0] + "/memory.max_usage_in_bytes", dirs[0] + "/memory.oom_control",
              dirs[1] + "/pids.events", dirs[3] + "/cpuacct.usage"] if v1 else
             [dirs[0] + "/memory.peak", dirs[0] + "/memory.events", dirs[0] + "/pids.events",
              dirs[0] + "/cpu.stat"])
    for n in names:
        with open(n, "rb") as f:
            f.read()


def build_root():
    mount(None, b"/", None, MS_REC | MS_PRIVATE)
    mount(b"tmpfs", ROOT, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=4m,nr_inodes=4096,mode=0755")
    for src in BINDS:
        if not os.path.exists(src):
            continue
        dst = ROOT + src.encode()
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.isdir(src):
            os.mkdir(dst)
        else:
            open(dst, "wb").close()
        mount(src.encode(), dst, None, MS_BIND | MS_REC)
        mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for link, to in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        os.symlink(to, ROOT + b"/" + link.encode())
    os.mkdir(ROOT + b"/proc")
    mount(b"proc", ROOT + b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"subset=pid")
    os.mkdir(ROOT + b"/dev")
    mount(b"tmpfs", ROOT + b"/dev", b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=64k,nr_inodes=64,mode=0755")
    for d in DEVS:
        node = ROOT + b"/dev/" + d.encode()
        open(node, "wb").close()
        mount(b"/dev/" + d.encode(), node, None, MS_BIND)
    os.symlink("/proc/self/fd", ROOT + b"/dev/fd")
    scratch = ROOT + b"/.scratch"
    os.mkdir(scratch)
    mount(b"tmpfs", scratch, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=256m,nr_inodes=16384,mode=0755")
    for i, point in enumerate((b"/tmp", b"/work", b"/dev/shm")):
        os.mkdir(scratch + b"/%d" % i)
        os.mkdir(ROOT + point)
        mount(scratch + b"/%d" % i, ROOT + point, None, MS_BIND)
    check(libc.umount2(scratch, MNT_DETACH), "umount scratch")
    os.mkdir(ROOT + b"/.old")
    check(libc.syscall(SYS_PIVOT_ROOT, ROOT, ROOT + b"/.old"), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", MNT_DETACH), "umount old")
    os.rmdir("/.old")
    mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_program():
    # Kill on the wrong architecture; EPERM for ptrace, mount, unshare, setns; allow the rest.
    ld_arch, ld_nr, jeq, ret = 0x20 | 0x00, 0x20 | 0x00, 0x15 | 0x00, 0x06
    prog = [(ld_arch, 0, 0, 4), (jeq, 1, 0, 0xC000003E), (ret, 0, 0, 0), (ld_nr, 0, 0, 0)]
    denied = [101, 165, 272, 308]
    for i, nr in enumerate(denied):
        prog.append((jeq, len(denied) - i, 0, nr))
    prog.append((ret, 0, 0, 0x7FFF0000))
    prog.append((ret, 0, 0, 0x00050000 | 1))
    arr = (SockFilter * len(prog))(*[SockFilter(*p) for p in prog])
    return SockFprog(len(prog), arr), arr


PROG, _PROG_ARRAY = seccomp_program()


def landlock():
    # Every filesystem right handled; reading and executing allowed beneath /usr only.
    attr = ctypes.c_uint64 * 3
    ruleset = attr((1 << 16) - 1, 0, 0)
    fd = check(libc.syscall(SYS_LANDLOCK_CREATE, ctypes.byref(ruleset), 16, 0), "landlock_create_ruleset")

    class Beneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    usr = os.open("/usr", os.O_PATH | os.O_CLOEXEC)
    rule = Beneath(1 | 4 | 8, usr)
    check(libc.syscall(SYS_LANDLOCK_ADD, fd, 1, ctypes.byref(rule), 0), "landlock_add_rule")
    os.close(usr)
    check(libc.syscall(SYS_LANDLOCK_RESTRICT, fd, 0), "landlock_restrict_self")
    os.close(fd)


def confine():
    for lim, value in ((resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_FSIZE, 256 << 20),
                       (resource.RLIMIT_CORE, 0), (resource.RLIMIT_STACK, 8 << 20)):
        resource.setrlimit(lim, (value, value))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    hdr, data = CapHeader(0x20080522, 0), (CapData * 2)()
    check(libc.syscall(SYS_CAPSET, ctypes.byref(hdr), ctypes.byref(data)), "capset")
    landlock()
    check(libc.syscall(SYS_SECCOMP, 1, 0, ctypes.byref(PROG)), "seccomp")


ENCODE = _json.make_encoder(None, None, _json.encode_basestring, None, ":", ",", False, False, False)


def program(out_w, answer_w):
    # What the runner does for print(1): compile (through the AST, for a last expression's
    # value), run with stdout on a pipe, answer in JSON.
    os.dup2(out_w, 1)
    sys.stdout = open(1, "w", closefd=False)
    code = "print(1)\n"
    tree = compile(code, "<string>", "exec", _ast.PyCF_ONLY_AST)
    exec(compile(tree, "<string>", "exec"), {"__name__": "__main__"})
    sys.stdout.flush()
    os.write(answer_w, "".join(ENCODE({"result": None}, 0)).encode())
    os._exit(0)


def contained(out_w, answer_w, mounts, go_r=None):
    # The sandboxed process: its root (with `mounts`), its confinement, its Python work (in
    # the closed loop once its request comes, a byte on `go_r`).
    try:
        if mounts and "mounts" not in SKIP:
            build_root()
        if "confine" not in SKIP:
            confine()
        if go_r is not None and os.read(go_r, 1) != b"g":
            os._exit(5)
        if "python" in SKIP:
            os.write(answer_w, b'{"result":null}')
            os._exit(0)
        program(out_w, answer_w)
    except BaseException as e:
        os.write(2, ("floor: %r\n" % (e,)).encode())
        os._exit(3)


def in_fork(run):
    # `run` in a fork of this process, which waits for it and ends as it ended.
    pid = os.fork()
    if pid == 0:
        run()
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status))


def jail(slot, out_w, answer_w, go_r=None):
    # The fork that makes the namespaces (its own fork is PID 1 in them).
    if "intermediate" in SKIP:
        # No namespaces and no second process: the fork runs the program itself.
        contained(out_w, answer_w, False)
    if "namespaces" in SKIP:
        in_fork(lambda: contained(out_w, answer_w, False))
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    if "netns" in SKIP:
        flags &= ~CLONE_NEWNET
    os.setresgid(slot, slot, slot)
    os.setresuid(slot, slot, slot)
    check(libc.prctl(4, 1, 0, 0, 0), "dumpable")  # a uid change makes /proc/self root's
    check(libc.unshare(flags), "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write("1000 %d 1" % slot)
    with open("/proc/self/gid_map", "w") as f:
        f.write("1000 %d 1" % slot)
    in_fork(lambda: contained(out_w, answer_w, True, go_r))


def forked_jail(name, ahead=False):
    # A cgroup (unless left out) and a fork that joins it and builds a jail, whose program
    # runs at once or, `ahead`, once a byte comes on the pipe whose write end is returned:
    # (pid, cgroup dirs, output's read end, answer's read end, that write end or None).
    dirs = make_cgroup(name) if "cgroup" not in SKIP else []
    out_r, out_w = os.pipe()
    answer_r, answer_w = os.pipe()
    go_r, go_w = os.pipe() if ahead else (None, None)
    pid = os.fork()
    if pid == 0:
        try:
            if go_w is not None:
                os.close(go_w)
            for d in dirs[:4]:
                with open(d + "/cgroup.procs", "w") as f:
                    f.write("0")
            jail(0x7100_0000 + os.getpid(), out_w, answer_w, go_r)
        except BaseException as e:
            os.write(2, ("floor: %r\n" % (e,)).encode())
        os._exit(4)
    for fd in (out_w, answer_w, go_r):
        if fd is not None:
            os.close(fd)
    return pid, dirs, out_r, answer_r, go_w


def worker(index, deadline, report):
    gc.freeze()
    done, n, faults = 0, 0, 0
    while time.monotonic() < deadline:
        n += 1
        pid, dirs, out_r, answer_r, _ = forked_jail("airlock-floor-%d-%d-%d" % (os.getpid(), index, n))
        answer = read_all(answer_r)
        output = os.read(out_r, 65536)
        os.close(answer_r)
        os.close(out_r)
        _, status, usage = os.wait4(pid, 0)
        faults += usage.ru_minflt
        if status != 0 or answer != b'{"result":null}' or ("python" not in SKIP and output != b"1\n"):
            sys.stderr.write("floor: bad run: status %d answer %r output %r\n" % (status, answer, output))
            os._exit(1)
        if dirs:
            read_counters(dirs)
            for d in dirs:
                os.rmdir(d)
        done += 1
    os.write(report, b"%d %d\n" % (done, faults))
    os._exit(0)


def made_ahead(n):
    # A sandbox made ahead: forked now, it builds its jail and waits for its request.
    return forked_jail("airlock-floor-%d-closed-%d" % (os.getpid(), n), True)


def read_all(fd):
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk


def bare_start():
    t = time.perf_counter()
    pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", "-c", "pass"], {})
    os.waitpid(pid, 0)
    return time.perf_counter() - t


def closed():
    gc.freeze()
    bare = [bare_start() for _ in range(40)]
    pool = [made_ahead(n) for n in range(POOL)]
    latencies, starts = [], []
    for n in range(POOL, POOL + REQUESTS):
        pid, dirs, out_r, answer_r, go_w = pool.pop(0)
        t = time.perf_counter()
        starts.append(t)
        os.write(go_w, b"g")
        answer, output = read_all(answer_r), read_all(out_r)
        _, status = os.waitpid(pid, 0)
        read_counters(dirs)
        latencies.append(time.perf_counter() - t)
        for fd in (go_w, out_r, answer_r):
            os.close(fd)
        if status != 0 or answer != b'{"result":null}' or output != b"1\n":
            sys.exit("floor: bad run: status %d answer %r output %r" % (status, answer, output))
        for d in dirs:
            os.rmdir(d)
        pool.append(made_ahead(n))
    starts.append(time.perf_counter())
    loop_rate = REQUESTS / (starts[-1] - starts[0])
    # From one request's start to the next's: a client's latency had the work off the clock
    # been on it.
    periods = sorted(b - a for a, b in zip(starts, starts[1:]))
    for pid, dirs, out_r, answer_r, go_w in pool:
        os.write(go_w, b"x")  # it exits without running anything
        os.waitpid(pid, 0)
        for d in dirs:
            os.rmdir(d)
    bare += [bare_start() for _ in range(40)]
    latencies.sort()
    bare.sort()
    base = bare[len(bare) // 2]
    p50, p99 = latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)]
    print("floor, closed loop, %d requests, %d made ahead: p50 %.2f ms, p99 %.2f ms; bare python %.2f ms"
          " (p50 of %d, before and after): p50 %.2f x, p99 %.2f x; the loop, the work off the clock"
          " included, %.0f/s, a request every p50 %.2f ms, p99 %.2f ms"
          % (REQUESTS, POOL, p50 * 1e3, p99 * 1e3, base * 1e3, len(bare), p50 / base, p99 / base,
             loop_rate, periods[len(periods) // 2] * 1e3,
             periods[min(len(periods) - 1, len(periods) * 99 // 100)] * 1e3))


def jiffies():
    # (user, system) over all CPUs: user and nice; system, irq and softirq.
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[0] + fields[1], fields[2] + fields[5] + fields[6]


def main():
    r, w = os.pipe()
    start_user, start_sys = jiffies()
    t0 = time.monotonic()
    deadline = t0 + SECONDS
    pids = []
    for i in range(WORKERS):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            worker(i, deadline, w)
        pids.append(pid)
    os.close(w)
    bad = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        bad += status != 0
    elapsed = time.monotonic() - t0
    end_user, end_sys = jiffies()
    counts = [int(x) for x in os.read(r, 65536).split()]
    done, faults = sum(counts[0::2]), sum(counts[1::2])
    if bad or not done:
        sys.exit("floor: %d workers failed" % bad)
    hz = os.sysconf("SC_CLK_TCK")
    user_ms = (end_user - start_user) * 1000 / hz / done
    sys_ms = (end_sys - start_sys) * 1000 / hz / done
    print("floor, %d workers, %.1f s%s: %d executions, %.0f/s, %.2f ms of busy CPU each (all processes;"
          " user %.2f, system %.2f), %d page faults each (the forks)"
          % (WORKERS, elapsed, " without " + ",".join(sorted(SKIP)) if SKIP else "", done, done / elapsed,
             user_ms + sys_ms, user_ms, sys_ms, faults // done))


closed() if CLOSED else main()
