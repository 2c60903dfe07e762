//! A zygote's child, from the inside, right after its fork: it closes what the zygote holds
//! for its siblings, joins its jail's cgroup (v1) and namespaces, takes the jail's uid, keeps
//! only its own descriptors, and confines itself with the same `confine` as a cold program,
//! seccomp last; then it copies the pages the zygote surveyed ([`prefault`]) and the Python it
//! is returns to run the program.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use nix::sched::setns;
use nix::unistd::{self, Gid, Uid};

use super::messages::{ChildRequest, JAIL_NAMESPACES};
use super::state::{self, Pending};
use crate::jail::{close_from_except, confine, join_cgroup, path_errno, sys_err, InitError};
use crate::policy::Policy;
use crate::proto::{self, Report};
use crate::seccomp::Filters;
use crate::sys;

/// How much a child copies between two looks at its stdin (`prefault`).
const PREFAULT_CHUNK: usize = 128 << 10;
/// How much a child copies ahead even when its request is already waiting: copying a page
/// ahead costs about 2 µs, a fault on it about 4-5 (on this VM), so copying what a small
/// request writes (the lean zygote's survey is about 1.4 MiB) pays even on the request's
/// path; more (a first chart's pages) is copied only while the child waits.
const PREFAULT_EAGER: usize = 2 << 20;

/// In the child, right after the fork: enters its jail and confines itself. On success
/// writes the program's arguments and environment into `out` (NUL-separated: the number of
/// arguments, the arguments, then `KEY=VALUE` entries) and returns their length; on failure
/// reports why to the host and exits.
pub(crate) fn child(out: &mut [u8]) -> usize {
    let Some(mut z) = state::take() else {
        sys::exit_immediately(127)
    };
    let Some(pending) = z.pending.take() else {
        sys::exit_immediately(127)
    };
    // The siblings' descriptors go first (those running, and those whose jails are being
    // built): a sibling's host sees its end only when every copy of its status socket is
    // closed, and what follows can take milliseconds (a join through `cgroup.procs` waits for
    // an RCU grace period; with both cores busy, 10-30 ms here).
    // Their requests are wiped as they go (the zygote's allocator, inherited); from then on
    // what this process frees is its own.
    z.live.clear();
    drop(std::mem::take(&mut z.asked));
    z.host = None;
    sys::wipe_freed_memory(false);
    let Pending {
        request,
        fds,
        jail,
        placed,
    } = pending;
    // Above every destination (stdio, then the program's descriptors), so that no move
    // below can replace it.
    let floor = 4 + request.extra_fds as RawFd;
    let Ok(status) =
        sys::dup_cloexec_at_least(fds[0].as_raw_fd(), floor).and_then(sys::take_inherited_fd)
    else {
        sys::exit_immediately(127)
    };
    let entered = enter(&request, &fds, &jail, placed, &z.filters, &status);
    let surveyed = std::mem::take(&mut z.surveyed);
    // Everything the zygote held is closed by now, with every other descriptor: nothing
    // may close those numbers again later, when they may name the program's own files.
    std::mem::forget((z, fds, jail));
    if let Err(e) = entered {
        state::report_failed(&status, "program", &e.to_string());
        sys::exit_immediately(127)
    }
    let encoded = match encode_program(&request) {
        Ok(encoded) => encoded,
        Err(e) => {
            state::report_failed(&status, "program", &e.to_string());
            sys::exit_immediately(127)
        }
    };
    if encoded.len() > out.len() {
        state::report_failed(&status, "program", "arguments and environment too large");
        sys::exit_immediately(127)
    }
    out[..encoded.len()].copy_from_slice(&encoded);
    // Its stdin and its own descriptors: a request comes on one of them.
    let inputs: Vec<RawFd> = std::iter::once(0)
        .chain((0..request.extra_fds as RawFd).map(|i| 3 + i))
        .collect();
    prefault(&surveyed, &request.policy, &inputs);
    encoded.len()
}

/// Copies the zygote's pages that `survey` found a child writes, before the program runs, so
/// that it does not fault on each once its request has come: the first `PREFAULT_EAGER` bytes
/// always, the rest while nothing waits to be read on `inputs` (a pooled child has the time;
/// one made for a waiting request goes on), and at most a quarter of the memory limit, as the
/// copies are charged to its cgroup.
fn prefault(ranges: &[(usize, usize)], policy: &Policy, inputs: &[RawFd]) {
    let budget = usize::try_from(policy.limits.memory_bytes / 4).unwrap_or(usize::MAX);
    let mut copied = 0;
    for (start, len) in within_budget(ranges, budget) {
        let end = start + len;
        let mut at = start;
        while at < end {
            if copied >= PREFAULT_EAGER && inputs.iter().any(|fd| sys::readable_now(*fd)) {
                return;
            }
            let n = (end - at).min(PREFAULT_CHUNK);
            if sys::populate_write(at, n).is_err() {
                return;
            }
            at += n;
            copied += n;
        }
    }
}

/// `ranges`, in order, cut to their first `budget` bytes in all.
fn within_budget(
    ranges: &[(usize, usize)],
    budget: usize,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    ranges.iter().scan(budget, |left, &(start, len)| {
        let len = len.min(*left);
        *left -= len;
        (len > 0).then_some((start, len))
    })
}

/// The program's arguments (those after the zygote's own command line) and environment as
/// `zygote.py` reads them: NUL-separated, the number of arguments, the arguments, then
/// `KEY=VALUE` entries. One that holds a NUL itself
/// is refused, as `execve` refuses it to a cold sandbox's program (`exec_strings`).
fn encode_program(request: &ChildRequest) -> Result<Vec<u8>, InitError> {
    let mut strings = request
        .args
        .iter()
        .chain(request.env.iter().flat_map(|(key, value)| [key, value]));
    if strings.any(|s| s.contains('\0')) {
        return Err(InitError::Request(io::Error::other(
            "an argument or an environment entry holds a NUL byte",
        )));
    }
    let mut out = Vec::new();
    out.extend_from_slice(request.args.len().to_string().as_bytes());
    for arg in &request.args {
        out.push(0);
        out.extend_from_slice(arg.as_bytes());
    }
    for (key, value) in &request.env {
        out.push(0);
        out.extend_from_slice(format!("{key}={value}").as_bytes());
    }
    Ok(out)
}

/// Joins the jail and confines the process, reporting `Ready` on `status`, which then is the
/// only descriptor left besides stdio and the program's own (close-on-exec, and dropped
/// before the program's code runs).
fn enter(
    request: &ChildRequest,
    fds: &[OwnedFd],
    jail: &[OwnedFd],
    placed: bool,
    filters: &Filters,
    status: &OwnedFd,
) -> Result<(), InitError> {
    let policy = &request.policy;
    let joins = request.cgroup_fds(fds);
    match (request.into_cgroup, joins) {
        (false, _) => join_cgroup(joins)?,
        (true, _) if placed => {}
        // Forked, not cloned into it: joins through the directory's `cgroup.procs`, which
        // the template's ids may write.
        (true, [dir]) => {
            let procs = nix::fcntl::openat(
                dir,
                "cgroup.procs",
                nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(sys_err("opening the sandbox cgroup"))?;
            join_cgroup(&[procs])?;
        }
        (true, _) => {
            return Err(InitError::Request(io::Error::other(
                "no cgroup directory with the request",
            )))
        }
    }
    for ((name, flag), fd) in JAIL_NAMESPACES.iter().zip(&jail[1..]) {
        setns(fd, *flag).map_err(|e| InitError::Sys {
            call: name_of_setns(name),
            source: e.into(),
        })?;
    }
    let gid = Gid::from_raw(policy.gid);
    unistd::setresgid(gid, gid, gid).map_err(sys_err("setresgid"))?;
    let uid = Uid::from_raw(policy.uid);
    unistd::setresuid(uid, uid, uid).map_err(sys_err("setresuid"))?;

    // Descriptors: stdio at 0..2, the program's own at 3.., the status socket above them,
    // nothing else. Each is lifted above every destination first.
    let extras = request.program_fds(fds);
    let n = extras.len() as RawFd;
    let floor = 3 + n;
    let stdio = &fds[1..ChildRequest::STDIO_FDS];
    sys::place_fds(stdio.iter().chain(extras).map(AsFd::as_fd), 0).map_err(|source| {
        InitError::Sys {
            call: "placing the program's descriptors",
            source,
        }
    })?;
    close_from_except(floor, status.as_raw_fd())?;
    unistd::chdir(&policy.workdir).map_err(path_errno("chdir", &policy.workdir))?;

    let landlock = confine(policy)?;
    proto::send_msg(status, &Report::Ready { landlock }).map_err(|source| InitError::Sys {
        call: "send",
        source,
    })?;
    // Last, so that nothing above runs under the filter.
    if policy.seccomp.is_required() {
        filters.install_last()?;
    }
    Ok(())
}

fn name_of_setns(name: &str) -> &'static str {
    match name {
        "user" => "setns(user)",
        "mnt" => "setns(mnt)",
        "net" => "setns(net)",
        "ipc" => "setns(ipc)",
        "uts" => "setns(uts)",
        _ => "setns(cgroup)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(args: &[&str], env: &[(&str, &str)]) -> ChildRequest {
        ChildRequest {
            policy: Policy::default(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            join_cgroup: 0,
            into_cgroup: false,
            extra_fds: 0,
        }
    }

    #[test]
    fn the_program_is_encoded_as_zygote_py_reads_it() {
        let encoded = encode_program(&request(
            &["python3", "-c", "print(1)", "", "a b"],
            &[("PATH", "/usr/bin"), ("X", "a=b")],
        ))
        .unwrap();
        assert_eq!(
            encoded,
            b"5\0python3\0-c\0print(1)\0\0a b\0PATH=/usr/bin\0X=a=b"
        );
        // No arguments, no environment: the count alone.
        assert_eq!(encode_program(&request(&[], &[])).unwrap(), b"0");
    }

    #[test]
    fn a_nul_in_an_argument_or_the_environment_is_refused_as_execve_refuses_it() {
        // Split on it, the count would no longer say where the arguments end.
        for bad in [
            request(&["python3", "a\0b"], &[]),
            request(&["python3"], &[("K", "a\0B=evil")]),
            request(&["python3"], &[("K\0B", "v")]),
        ] {
            assert!(encode_program(&bad).is_err(), "{:?}", bad.args);
        }
    }

    #[test]
    fn the_copies_stop_at_the_budget_in_order() {
        let ranges = [(0x1000, 0x3000), (0x10000, 0x2000), (0x20000, 0x1000)];
        let within = |budget| within_budget(&ranges, budget).collect::<Vec<_>>();
        assert_eq!(within(usize::MAX), ranges);
        assert_eq!(within(0x6000), ranges);
        assert_eq!(within(0x4000), [(0x1000, 0x3000), (0x10000, 0x1000)]);
        assert_eq!(within(0x3000), [(0x1000, 0x3000)]);
        assert_eq!(within(0x800), [(0x1000, 0x800)]);
        assert!(within(0).is_empty());
    }
}
