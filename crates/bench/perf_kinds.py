# Where a run's CPU went, by kind of work, per execution: compares airlock's load with
# floor.py's (BENCHMARKS.md "Against floor.py, kind by kind"). Each sample of `perf record -a
# -g` goes to the first kind below with a kernel function on its call chain ("user" if none).
#
#   perf record -a -g -F 999 -o a.data -- sleep 8      # while airlock-bench --load 8 runs
#   perf script -i a.data -F comm,tid,ip,sym > a.txt
#   (the same while floor.py runs, into b.txt)
#   /usr/bin/python3 crates/bench/perf_kinds.py a.txt EXECUTIONS_A b.txt EXECUTIONS_B [--by-process]
#
# EXECUTIONS_*: how many executions the recording's seconds held (the rate times the seconds).
# At 999 Hz on each core a sample is about a millisecond of CPU, so samples per execution read
# as milliseconds per execution.
import collections
import sys

KINDS = [
    ("ns: network namespace made", ["copy_net_ns", "setup_net"]),
    ("ns: other namespaces made", ["create_new_namespaces", "copy_namespaces", "unshare_nsproxy_namespaces"]),
    ("exit: address space torn down", ["exit_mmap"]),
    ("exit: the rest", ["do_exit", "do_group_exit"]),
    ("fork: address space copied", ["dup_mmap", "copy_process"]),
    ("madvise (pages copied ahead)", ["__x64_sys_madvise"]),
    ("page faults", ["asm_exc_page_fault"]),
    ("mount, umount, pivot_root", ["__x64_sys_mount", "__x64_sys_umount", "__do_sys_pivot_root",
                                   "__x64_sys_mount_setattr", "__x64_sys_open_tree",
                                   "__x64_sys_move_mount", "__x64_sys_fsopen", "__x64_sys_fsmount",
                                   "__x64_sys_fsconfig"]),
    ("mkdir, rmdir, symlink", ["__x64_sys_mkdir", "__x64_sys_mkdirat", "__x64_sys_rmdir",
                               "__x64_sys_symlink", "__x64_sys_unlinkat", "__x64_sys_unlink"]),
    ("open", ["__x64_sys_openat", "__x64_sys_open"]),
    ("stat", ["__x64_sys_statx", "__x64_sys_newfstatat"]),
    ("close", ["__x64_sys_close"]),
    ("read, write", ["ksys_read", "ksys_write", "do_writev", "__x64_sys_pread64"]),
    ("sockets", ["__sys_sendmsg", "__sys_recvmsg", "__x64_sys_sendto", "__x64_sys_recvfrom",
                 "__x64_sys_socketpair"]),
    ("seccomp, Landlock, prctl", ["__do_sys_prctl", "__x64_sys_seccomp",
                                  "__x64_sys_landlock_restrict_self",
                                  "__x64_sys_landlock_create_ruleset",
                                  "__x64_sys_landlock_add_rule"]),
    ("execve", ["__x64_sys_execve", "__x64_sys_execveat"]),
    ("futex, poll, epoll, wait", ["__x64_sys_futex", "kernel_wait4", "do_sys_poll", "do_epoll_wait",
                                  "__x64_sys_waitid"]),
    ("other system calls", ["do_syscall_64"]),
    ("interrupts", ["handle_softirqs", "asm_sysvec_apic_timer_interrupt", "asm_common_interrupt"]),
    ("idle", ["cpuidle", "default_idle", "do_idle", "cpu_startup_entry"]),
    ("kernel threads", ["kthread"]),
]
NAMES = [name for name, _ in KINDS] + ["user"]


def samples(path):
    """(process name, call chain) of each sample of a `perf script` text."""
    found, current = [], None
    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            if current:
                found.append(current)
            current = None
        elif not line.startswith((" ", "\t")):
            current = (line.split()[0], set())
        elif current:
            parts = line.strip().split(None, 1)
            current[1].add((parts[1] if len(parts) > 1 else parts[0]).split("+0x")[0])
    if current:
        found.append(current)
    return found


def kind(chain):
    for name, functions in KINDS:
        if any(f in chain for f in functions):
            return name
    return "user"


def main():
    by_process = "--by-process" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--by-process"]
    runs = [(args[i], float(args[i + 1])) for i in range(0, len(args), 2)]
    counts = []
    for path, executions in runs:
        per = collections.defaultdict(collections.Counter)
        for process, chain in samples(path):
            per[process if by_process else ""][kind(chain)] += 1
        counts.append((per, executions))
    if by_process:
        for (per, executions), (path, _) in zip(counts, runs):
            print(f"== {path}")
            for process, c in sorted(per.items(), key=lambda p: -sum(p[1].values()))[:10]:
                top = ", ".join(f"{k} {v / executions:.2f}" for k, v in c.most_common(6))
                print(f"{process:16s} {sum(c.values()) / executions:6.2f}  {top}")
        return
    print(f"{'ms per execution':32s}" + "".join(f"{p[-20:]:>22s}" for p, _ in runs))
    totals = [0.0] * len(runs)
    for name in NAMES:
        row = [per[""][name] / executions for per, executions in counts]
        totals = [t + r for t, r in zip(totals, row)]
        print(f"{name:32s}" + "".join(f"{r:22.2f}" for r in row))
    print(f"{'total':32s}" + "".join(f"{t:22.2f}" for t in totals))


main()
