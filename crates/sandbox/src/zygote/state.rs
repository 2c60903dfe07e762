//! The zygote, from the inside: the interpreter with its modules loaded, which never runs
//! user code. Its Python (`zygote.py`) calls in here through the C ABI (`sys::abi`): [`start`]
//! takes its descriptors and installs the seccomp filters its children inherit, [`survey`]
//! records which of its pages a child writes, [`ready`] tells the host, and [`serve`] is the
//! loop that makes children. Per child it asks the template's init for a jail as soon as the
//! request comes, enters the jail's PID namespace for its next child only, and forks (with the
//! interpreter's own fork hooks around it; on v2 a `clone3` into the child's cgroup). It reaps
//! each child and reports how it ended. What a child does next is `child`.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{setns, CloneFlags};
use nix::sys::signal::Signal;
use nix::unistd;

use super::messages::{ChildRequest, JailReply, JailRequest, ZygoteReady, HOST_FD, JAILS_FD};
use crate::proto::{self, Report};
use crate::seccomp::Filters;
use crate::sys;

/// At most this much of the zygote's memory is recorded by `survey`.
const SURVEY_MAX_BYTES: usize = 64 << 20;

/// The zygote process's own state, inside it (the host's handle on it is [`super::Zygote`]).
pub(super) struct ZygoteState {
    /// [`None`] once the host has closed it: the zygote then only reaps its last children.
    pub(super) host: Option<OwnedFd>,
    jails: OwnedFd,
    /// Our own PID namespace, to return to after each fork.
    own_pid_ns: OwnedFd,
    pub(super) filters: Filters,
    /// The interpreter's own fork, for `serve`.
    fork: sys::PythonFork,
    /// What a fork by `clone3` must redo of glibc's, when the kernel says (see `clone_into`).
    glibc: Option<sys::ForkAsLibc>,
    /// Requests whose jails are asked for, oldest first.
    pub(super) asked: VecDeque<Asked>,
    pub(super) pending: Option<Pending>,
    pub(super) live: Vec<Live>,
    /// The zygote's pages a child writes, as (start, length): see `survey`.
    pub(super) surveyed: Vec<(usize, usize)>,
}

/// A request whose jail the template's init builds. Requests are boxed: where they are moved
/// (out of this queue, out of the state) leaves a pointer behind, not a copy of their numbers.
pub(super) struct Asked {
    request: Box<ChildRequest>,
    fds: Vec<OwnedFd>,
}

/// A child being made: its request and descriptors, and its jail.
pub(super) struct Pending {
    pub(super) request: Box<ChildRequest>,
    /// As the request says ([`ChildRequest::descriptors`]).
    pub(super) fds: Vec<OwnedFd>,
    /// The jail init's pidfd, then its namespaces (`JAIL_NAMESPACES`, then PID).
    pub(super) jail: Vec<OwnedFd>,
    /// Cloned into its cgroup: nothing to join.
    pub(super) placed: bool,
}

/// A child that runs.
pub(super) struct Live {
    pid: i32,
    pidfd: OwnedFd,
    status: OwnedFd,
    jail_init: OwnedFd,
}

static ZYGOTE: Mutex<Option<ZygoteState>> = Mutex::new(None);

fn zygote_state() -> MutexGuard<'static, Option<ZygoteState>> {
    ZYGOTE.lock().unwrap_or_else(|e| e.into_inner())
}

/// In a new child: the zygote's state, which is the child's to take apart.
pub(super) fn take() -> Option<ZygoteState> {
    zygote_state().take()
}

/// Never `eprintln!`: its panic on a closed stderr would abort the zygote.
fn complain(what: &str, err: impl std::fmt::Display) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "airlock zygote: {what}: {err}");
}

/// Takes the descriptors the template's init placed, and compiles the seccomp profile once
/// for every child. 0 on success.
pub(crate) fn start() -> i32 {
    // Every child is a copy of our memory: what we free of the requests we handle (other
    // executions', for each child) is zeroed first.
    sys::wipe_freed_memory(true);
    let started = (|| -> Result<ZygoteState, String> {
        let host = sys::take_inherited_fd(HOST_FD).map_err(|e| e.to_string())?;
        let jails = sys::take_inherited_fd(JAILS_FD).map_err(|e| e.to_string())?;
        for fd in [&host, &jails] {
            sys::set_cloexec(fd.as_raw_fd(), true).map_err(|e| e.to_string())?;
        }
        // Before the filters: they leave `prctl` no such option.
        let glibc = sys::ForkAsLibc::of_this_thread().ok();
        let own_pid_ns = fs::File::open("/proc/self/ns/pid")
            .map_err(|e| format!("/proc/self/ns/pid: {e}"))?
            .into();
        // Installed once here, so that children inherit them (and the preloads run under
        // them); each child adds the last one after joining its jail.
        let filters = Filters::compile().map_err(|e| e.to_string())?;
        filters.install_inherited().map_err(|e| e.to_string())?;
        let fork = sys::PythonFork::find().map_err(|e| e.to_string())?;
        Ok(ZygoteState {
            host: Some(host),
            jails,
            own_pid_ns,
            filters,
            fork,
            glibc,
            asked: VecDeque::new(),
            pending: None,
            live: Vec::new(),
            surveyed: Vec::new(),
        })
    })();
    match started {
        Ok(z) => {
            *zygote_state() = Some(z);
            0
        }
        Err(e) => {
            complain("starting", e);
            -1
        }
    }
}

/// The zygote's modules are loaded: it tells the host it takes requests. 0 on success.
pub(crate) fn ready() -> i32 {
    let guard = zygote_state();
    let Some(z) = guard.as_ref() else { return -1 };
    // Where the modules loaded OpenSSL, the generators it may have drawn from are wiped: a
    // child that draws makes its own (at no cost to one that does not).
    if let Err(e) = sys::uninstantiate_openssl_generators() {
        complain("OpenSSL's random generators", e);
        return -1;
    }
    let Some(host) = z.host.as_ref() else {
        return -1;
    };
    let prefault_bytes = z.surveyed.iter().map(|(_, len)| *len as u64).sum();
    // A thread the program joined may still be leaving (Python's join returns before the
    // thread's last steps in the kernel): it gets 50 ms to be gone before the zygote settles
    // for forking.
    let clones_into_cgroups = z.glibc.is_some_and(|g| {
        (0..50).any(|_| {
            g.alone() || {
                std::thread::sleep(std::time::Duration::from_millis(1));
                false
            }
        })
    });
    let ready = ZygoteReady {
        prefault_bytes,
        clones_into_cgroups,
    };
    match proto::send_msg(host, &ready) {
        Ok(()) => 0,
        Err(e) => {
            complain("saying it is ready", e);
            -1
        }
    }
}

/// In a fork of the zygote that has done what a child does: stops, to be surveyed and killed.
pub(crate) fn surveyed() {
    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
    sys::exit_immediately(0)
}

/// In the zygote, before its first child: `pid` is a fork of it that did what a child does
/// (the rehearsals, `__zygote_rehearse__`, of its warm-up and its program: a first chart, a
/// small request) and stopped (`surveyed`). The pages it wrote (present in it and no longer shared with us:
/// copies of ours, or new in our mappings) are the ones every child would copy, one fault
/// each; recorded, each child copies them while it waits for its request (`prefault`).
/// The fork is killed and reaped; `ready` tells the host how much was recorded.
pub(crate) fn survey(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let pid = unistd::Pid::from_raw(pid);
    let waited = waitpid(pid, Some(WaitPidFlag::WUNTRACED));
    let stopped = matches!(waited, Ok(WaitStatus::Stopped(..)));
    // Whatever became of it, it goes (unless it is already reaped: its pid may be another's).
    let reaped = matches!(
        waited,
        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
    );
    let pages = if stopped {
        written_pages(pid.as_raw()).unwrap_or_else(|e| {
            complain("surveying a child's pages", e);
            Vec::new()
        })
    } else {
        Vec::new()
    };
    if !reaped {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
    }
    if let Some(z) = zygote_state().as_mut() {
        z.surveyed = pages;
    }
}

/// The pages of our private writable mappings that `pid`, a fork of ours, has written, from
/// its `/proc/<pid>/pagemap` (bit 63: present; bit 56: mapped by it alone), as ranges.
fn written_pages(pid: i32) -> io::Result<Vec<(usize, usize)>> {
    use std::os::unix::fs::FileExt;
    let page = 4096usize;
    let maps = fs::read_to_string("/proc/self/maps")?;
    let pagemap = fs::File::open(format!("/proc/{pid}/pagemap"))?;
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut total = 0usize;
    let mut entries = vec![0u8; 8 * 1024];
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(span), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let perms = perms.as_bytes();
        if perms.get(1) != Some(&b'w') || perms.get(3) != Some(&b'p') {
            continue;
        }
        let Some((lo, hi)) = span.split_once('-') else {
            continue;
        };
        let parse = |hex| usize::from_str_radix(hex, 16).map_err(io::Error::other);
        let (lo, hi) = (parse(lo)?, parse(hi)?);
        let mut at = lo;
        while at < hi && total < SURVEY_MAX_BYTES {
            let pages = ((hi - at) / page).min(entries.len() / 8);
            let chunk = &mut entries[..pages * 8];
            pagemap.read_exact_at(chunk, (at / page * 8) as u64)?;
            for entry in chunk.chunks_exact(8) {
                let bits = u64::from_le_bytes(entry.try_into().expect("8 bytes"));
                if bits >> 63 & 1 == 1 && bits >> 56 & 1 == 1 && total < SURVEY_MAX_BYTES {
                    match ranges.last_mut() {
                        Some((start, len)) if *start + *len == at => *len += page,
                        _ => ranges.push((at, page)),
                    }
                    total += page;
                }
                at += page;
            }
        }
    }
    Ok(ranges)
}

/// Waits for the next child to make, reaping children that end meanwhile. 1: fork now (the
/// next child is born in its jail's PID namespace); 0: the host closed the control socket and
/// the last child has ended; -1: the template's init is gone.
///
/// Each request's jail is asked for as soon as the request comes, so that the template's init
/// builds the next jails while this one's child is forked and set up (a jail takes a
/// millisecond or more, mostly in the kernel, and each jail's init builds its root by
/// itself); jails come back in the order asked.
fn next() -> i32 {
    let mut guard = zygote_state();
    let Some(z) = guard.as_mut() else { return -1 };
    loop {
        if z.host.is_none() && z.live.is_empty() && z.asked.is_empty() {
            return 0;
        }
        let (host, jail) = match poll_reaping(z) {
            Ok(ready) => ready,
            Err(e) => {
                complain("poll", e);
                return -1;
            }
        };
        if host {
            if let Err(e) = ask_for_a_jail(z) {
                complain("asking for a jail", e);
                return -1;
            }
        }
        if jail {
            match take_a_jail(z) {
                Ok(true) => return 1,
                Ok(false) => {}
                Err(e) => {
                    complain("taking a jail", e);
                    return -1;
                }
            }
        }
    }
}

/// Reads the host's next request and asks the template's init for its jail (a request
/// without its descriptors is refused here). Errs only when the template's init is gone.
fn ask_for_a_jail(z: &mut ZygoteState) -> Result<(), String> {
    let Some(host) = z.host.as_ref() else {
        return Ok(());
    };
    let (request, fds) = match proto::recv_msg_with_fds::<ChildRequest>(host) {
        Ok(Some(got)) => got,
        Ok(None) => {
            z.host = None;
            return Ok(());
        }
        Err(e) => {
            complain("reading a request", e);
            z.host = None;
            return Ok(());
        }
    };
    if fds.len() != request.descriptors() {
        if let Some(status) = fds.first() {
            report_failed(status, "zygote", "the request's descriptors are missing");
        }
        return Ok(());
    }
    let join: Vec<RawFd> = request
        .cgroup_fds(&fds)
        .iter()
        .map(|f| f.as_raw_fd())
        .collect();
    let jail_request = JailRequest {
        policy: request.policy.clone(),
        into_cgroup: request.into_cgroup,
    };
    proto::send_msg_with_fds(&z.jails, &jail_request, &join).map_err(|e| e.to_string())?;
    z.asked.push_back(Asked {
        request: Box::new(request),
        fds,
    });
    Ok(())
}

/// Takes the template init's answer to the oldest request: true when its child is to be
/// forked now (we are in its jail's PID namespace), false when it was refused (its host is
/// told why). Errs only when the template's init is gone or out of step.
fn take_a_jail(z: &mut ZygoteState) -> Result<bool, String> {
    let (reply, jail) = match proto::recv_msg_with_fds::<JailReply>(&z.jails) {
        Ok(Some(got)) => got,
        Ok(None) | Err(_) => return Err("the template's init is gone".into()),
    };
    let Some(Asked { request, fds }) = z.asked.pop_front() else {
        if let Some(init) = jail.first() {
            let _ = sys::pidfd_send_signal(init, libc::SIGKILL);
        }
        return Err("a jail nobody asked for".into());
    };
    let status = &fds[0];
    if let JailReply::Failed { error } = reply {
        report_failed(status, "jail", &error);
        return Ok(false);
    }
    if jail.len() != JailReply::BUILT_FDS {
        // Whatever came is the jail's init first: it must not outlive the refusal.
        if let Some(init) = jail.first() {
            let _ = sys::pidfd_send_signal(init, libc::SIGKILL);
        }
        report_failed(status, "jail", "the jail's descriptors are missing");
        return Ok(false);
    }
    let started = proto::send_msg_with_fd(status, &Report::Started, Some(&jail[0]));
    let entered = setns(&jail[jail.len() - 1], CloneFlags::CLONE_NEWPID);
    if started.is_err() || entered.is_err() {
        let _ = sys::pidfd_send_signal(&jail[0], libc::SIGKILL);
        if let Err(e) = entered {
            report_failed(status, "zygote", &format!("setns(pid): {e}"));
        }
        return Ok(false);
    }
    z.pending = Some(Pending {
        request,
        fds,
        jail,
        placed: false,
    });
    Ok(true)
}

/// The zygote's loop: each next child forked as `os.fork()` forks (the interpreter's hooks
/// around it), with no Python run between children. Python in the zygote would write to its
/// objects (reference counts, allocations) after every fork and so copy each page it touches
/// again, a hundred or so a child; here only this loop's own state is written. 1 in a new
/// child; 0 when the host is gone and the last child has ended; -1 on a fatal error.
pub(crate) fn serve() -> i32 {
    loop {
        let got = next();
        if got <= 0 {
            return got;
        }
        // Copied out: the state's lock is not held across the fork.
        let Some((fork, into)) = zygote_state().as_ref().map(|z| (z.fork, z.clone_into())) else {
            return -1;
        };
        wipe_stack();
        match fork.fork(into.as_ref().map(|(dir, glibc)| (dir.as_fd(), glibc))) {
            Ok(0) => {
                if into.is_some() {
                    if let Some(p) = zygote_state().as_mut().and_then(|z| z.pending.as_mut()) {
                        p.placed = true;
                    }
                }
                return 1;
            }
            Ok(pid) => forked(pid),
            Err(e) => forked(-e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

/// How much of the stack below `serve`'s frame [`wipe_stack`] zeroes: more than taking a
/// request and a jail uses (at most 24 KiB in a debug build, measured).
const STACK_WIPE: usize = 64 << 10;

/// Zeroes the stack below the caller's frame, where taking requests left copies of what they
/// hold (a policy's numbers: limits, ids), before a fork copies it into a child.
#[inline(never)]
fn wipe_stack() {
    let mut below = [0u8; STACK_WIPE];
    std::hint::black_box(&mut below);
}

impl ZygoteState {
    /// The pending child's cgroup directory, when it is to be cloned straight into it: its
    /// request says so (v2), and a `clone3` can stand in for glibc's fork here, this thread
    /// being the process's only one (another's locks glibc's fork would take first) and the
    /// kernel having said where glibc keeps the thread's id. Otherwise the child is forked
    /// and joins by itself.
    fn clone_into(&self) -> Option<(OwnedFd, sys::ForkAsLibc)> {
        let pending = self.pending.as_ref().filter(|p| p.request.into_cgroup)?;
        let glibc = self.glibc.filter(|g| g.alone())?;
        let dir = pending
            .request
            .cgroup_fds(&pending.fds)
            .first()?
            .try_clone()
            .ok()?;
        Some((dir, glibc))
    }
}

/// Polls once for the host's next request, the template init's next jail (while one is
/// asked for) and the end of any live child; reaps and reports the children that ended, and
/// says whether a request and a jail are there to read.
fn poll_reaping(z: &mut ZygoteState) -> nix::Result<(bool, bool)> {
    let mut fds: Vec<PollFd> = Vec::with_capacity(2 + z.live.len());
    let has_host = z.host.is_some();
    if let Some(host) = z.host.as_ref() {
        fds.push(PollFd::new(host.as_fd(), PollFlags::POLLIN));
    }
    let waits_for_jail = !z.asked.is_empty();
    if waits_for_jail {
        fds.push(PollFd::new(z.jails.as_fd(), PollFlags::POLLIN));
    }
    let first_child = fds.len();
    fds.extend(
        z.live
            .iter()
            .map(|l| PollFd::new(l.pidfd.as_fd(), PollFlags::POLLIN)),
    );
    match poll(&mut fds, PollTimeout::NONE) {
        Ok(_) | Err(Errno::EINTR) => {}
        Err(e) => return Err(e),
    }
    let ready: Vec<bool> = fds
        .iter()
        .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
        .collect();
    drop(fds);
    if ready[first_child..].iter().any(|r| *r) {
        reap_ended(z);
    }
    let host_ready = has_host && ready[0];
    let jail_ready = waits_for_jail && ready[usize::from(has_host)];
    Ok((host_ready, jail_ready))
}

/// Reaps the children that ended: each one's exit goes to the host, and its jail's init is
/// killed, which ends whatever the child left in the namespace.
fn reap_ended(z: &mut ZygoteState) {
    let mut still = Vec::with_capacity(z.live.len());
    for live in z.live.drain(..) {
        match sys::wait_child_nohang(live.pid) {
            Ok(None) => still.push(live),
            Ok(Some((how, cpu))) => {
                let report = Report::exited(how, cpu);
                let _ = sys::pidfd_send_signal(&live.jail_init, libc::SIGKILL);
                let _ = proto::send_msg(&live.status, &report);
            }
            Err(_) => {
                let _ = sys::pidfd_send_signal(&live.jail_init, libc::SIGKILL);
            }
        }
    }
    z.live = still;
}

pub(super) fn report_failed(status: &OwnedFd, stage: &str, error: &str) {
    let report = Report::Failed {
        stage: stage.to_owned(),
        error: error.to_owned(),
    };
    let _ = proto::send_msg(status, &report);
}

/// In the zygote after its fork: back to its own PID namespace, and the child is watched.
/// `pid` < 0 is the fork's failure, `-errno`.
fn forked(pid: i32) {
    let mut guard = zygote_state();
    let Some(z) = guard.as_mut() else { return };
    if let Err(e) = setns(&z.own_pid_ns, CloneFlags::CLONE_NEWPID) {
        // Every later child would be born in this jail: nothing more can be made safely.
        complain("returning to our PID namespace", e);
        sys::exit_immediately(1)
    }
    let Some(pending) = z.pending.take() else {
        return;
    };
    let mut jail = pending.jail.into_iter();
    let jail_init = jail.next().expect("checked in next");
    let status = pending.fds.into_iter().next().expect("checked in next");
    if pid < 0 {
        let error = io::Error::from_raw_os_error(-pid);
        report_failed(&status, "zygote", &format!("fork: {error}"));
        let _ = sys::pidfd_send_signal(&jail_init, libc::SIGKILL);
        return;
    }
    match sys::pidfd_open(pid) {
        Ok(pidfd) => z.live.push(Live {
            pid,
            pidfd,
            status,
            jail_init,
        }),
        Err(e) => {
            complain("pidfd_open", e);
            let _ = sys::pidfd_send_signal(&jail_init, libc::SIGKILL);
            let _ = sys::wait_child(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fork of ours writes two of four pages it shares with us, reads the other two, and
    /// stops: the survey finds the two it wrote and neither of the others.
    #[test]
    fn the_survey_finds_the_pages_a_fork_wrote_and_none_it_only_read() {
        const PAGE: usize = 4096;
        // Four whole pages of our own, each present in us (written) before the fork.
        let mut block = vec![1u8; 6 * PAGE];
        let offset = (block.as_ptr() as usize).next_multiple_of(PAGE) - block.as_ptr() as usize;
        let pages = &mut block[offset..offset + 4 * PAGE];
        let at = |i: usize| pages.as_ptr() as usize + i * PAGE;
        let (first, second, third, fourth) = (at(0), at(1), at(2), at(3));
        let pid = match sys::fork().unwrap() {
            sys::ForkResult::Child => {
                // Memory and a stop only: the test harness has other threads.
                let read = pages[0] + pages[2 * PAGE];
                pages[PAGE] = read;
                pages[3 * PAGE] = read;
                std::hint::black_box(&pages);
                surveyed();
                unreachable!()
            }
            sys::ForkResult::Parent { child } => child,
        };
        let waited = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WUNTRACED));
        let written = written_pages(pid.as_raw());
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
        assert!(
            matches!(waited, Ok(nix::sys::wait::WaitStatus::Stopped(..))),
            "{waited:?}"
        );
        let written = written.unwrap();
        let found = |page: usize| {
            written
                .iter()
                .any(|&(start, len)| start <= page && page < start + len)
        };
        assert!(found(second) && found(fourth), "{written:x?}");
        assert!(!found(first) && !found(third), "{written:x?}");
        assert!(written
            .iter()
            .all(|&(start, len)| start % PAGE == 0 && len % PAGE == 0));
        drop(block);
    }
}
