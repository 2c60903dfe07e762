//! A zygote's template, from the inside: its init and the jails it builds, one per child.
//!
//! 1. **template init** ([`template_init`]): PID 1 of the template jail, built like any
//!    sandbox's init (`init`: the same outer, the same root) but keeping its privileges inside
//!    the template's user namespace, which maps a block of host ids (`ids`). It starts the
//!    zygote, then builds one jail per child on the zygote's request ([`serve_jails`]): a fork
//!    of itself, small, cloned into new user, mount, PID, network, IPC, UTS and cgroup
//!    namespaces, whose uid is a host id of the block that no sibling has.
//! 2. **jail init** ([`jail_init`]): PID 1 of the child's PID namespace. It joins the child's
//!    cgroup (v1; on v2 it is cloned into it), enters the child's root: the read-only
//!    skeleton that the template built once ([`skeleton_for`]) with its own `/proc` and
//!    scratch added by the same `enter_root` as a cold sandbox's (or, for a policy the
//!    skeleton does not fit, the whole [`build_root`]), drops every capability, and reaps
//!    orphans until it is killed.
//!
//! The zygote itself is `state`, the child `child`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::CloneFlags;
use nix::sys::prctl;
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::{self, Gid, Uid};

use super::ids::ZYGOTE_IDS;
use super::messages::{JailBuilt, JailReply, JailRequest, JAIL_NAMESPACES};
use crate::jail::{
    build_jails_skeleton, build_root, close_from_except, enter_skeleton, exec_strings, fail,
    join_cgroup, make_mounts_private, path_err, reap_until, sys_err, InitError, SkeletonKey,
    FIRST_EXTRA_FD,
};
use crate::policy::Policy;
use crate::proto::{self, InitRequest, LandlockReport, LandlockState, Report};
use crate::sys::{self, ForkResult};

// ---- 1. the template's init -------------------------------------------------------------

/// Called by the template's init once its root is built: starts the zygote (the program,
/// unconfined but for `no_new_privs` and its own session) and serves it jails until it ends.
pub(crate) fn template_init(req: &InitRequest, status: &OwnedFd) -> Result<Infallible, InitError> {
    // Each jail's init is a fork of ours, and we write its id maps: /proc/<jail> must be
    // ours, so dumpable. (The zygote is root here anyway; it is not the program.)
    prctl::set_dumpable(true).map_err(sys_err("prctl(PR_SET_DUMPABLE)"))?;
    let (ours, theirs) = proto::seqpacket_pair().map_err(|source| InitError::Sys {
        call: "socketpair",
        source,
    })?;
    match sys::fork().map_err(sys_err("fork"))? {
        ForkResult::Child => {
            drop(ours);
            match start_zygote(req, status, theirs) {
                Ok(never) => match never {},
                Err(e) => fail(status, "zygote", &e),
            }
        }
        ForkResult::Parent { child } => {
            drop(theirs);
            let n = req.extra_fds as RawFd;
            let _ = sys::close_range(0, 2);
            let _ = sys::close_range(FIRST_EXTRA_FD, FIRST_EXTRA_FD + n - 1);
            // A mount namespace of our own (the zygote keeps the template's), where the
            // jails' skeleton is built, and which each jail's is a copy of.
            nix::sched::unshare(CloneFlags::CLONE_NEWNS)
                .map_err(sys_err("unshare(CLONE_NEWNS)"))?;
            make_mounts_private()?;
            serve_jails(child.as_raw(), ours, status)
        }
    }
}

/// The zygote's process: descriptors in place (the host's at 3.., the template init's after
/// them), a session of its own, `no_new_privs`, then the interpreter. It keeps its
/// capabilities inside the template: it enters each child's namespaces before the child does.
fn start_zygote(
    req: &InitRequest,
    status: &OwnedFd,
    jails: OwnedFd,
) -> Result<Infallible, InitError> {
    let n = req.extra_fds as RawFd;
    let dup = |call, r: io::Result<RawFd>| r.map_err(|source| InitError::Sys { call, source });
    let status_fd = dup(
        "fcntl(F_DUPFD_CLOEXEC)",
        sys::dup_cloexec_at_least(status.as_raw_fd(), FIRST_EXTRA_FD + n + 1),
    )?;
    let jails_fd = dup(
        "fcntl(F_DUPFD_CLOEXEC)",
        sys::dup_cloexec_at_least(jails.as_raw_fd(), status_fd + 1),
    )?;
    for i in 0..n {
        sys::move_fd(FIRST_EXTRA_FD + i, 3 + i).map_err(|source| InitError::Sys {
            call: "dup2",
            source,
        })?;
    }
    sys::move_fd(jails_fd, 3 + n).map_err(|source| InitError::Sys {
        call: "dup2",
        source,
    })?;
    close_from_except(4 + n, status_fd)?;
    let status = sys::take_inherited_fd(status_fd).map_err(|source| InitError::Sys {
        call: "status socket",
        source,
    })?;
    unistd::setsid().map_err(sys_err("setsid"))?;
    prctl::set_no_new_privs().map_err(sys_err("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    let landlock = LandlockReport {
        state: LandlockState::Disabled,
        abi: None,
    };
    proto::send_msg(&status, &Report::Ready { landlock }).map_err(|source| InitError::Sys {
        call: "send",
        source,
    })?;
    let (program, args, env) = exec_strings(req)?;
    let err = unistd::execve(&program, &args, &env).unwrap_err();
    Err(InitError::Exec {
        program: req.program.clone(),
        source: err.into(),
    })
}

/// The host ids a child's jail may take, as their offsets in the template's block (its
/// slots): 1.. (0 is the template's own root), each in one live jail at a time.
struct Slots(Vec<u32>);

impl Slots {
    fn new() -> Slots {
        Slots((1..ZYGOTE_IDS).rev().collect())
    }

    /// A free slot; [`None`] while every one is in use.
    fn take(&mut self) -> Option<u32> {
        self.0.pop()
    }

    /// `slot`'s jail is gone (or was never built).
    fn give_back(&mut self, slot: u32) {
        self.0.push(slot);
    }
}

/// What a jail's init is cloned into: a new PID namespace and each of `JAIL_NAMESPACES` but
/// the cgroup one, which it makes itself once in the child's cgroup.
fn jail_clone_flags() -> CloneFlags {
    JAIL_NAMESPACES
        .iter()
        .filter(|(_, flag)| *flag != CloneFlags::CLONE_NEWCGROUP)
        .fold(CloneFlags::CLONE_NEWPID, |all, (_, flag)| all | *flag)
}

struct Jail {
    pid: i32,
    pidfd: OwnedFd,
    slot: u32,
}

/// A jail asked for and not yet answered: its init builds its root, or it is refused.
enum Building {
    Started {
        jail: Jail,
        /// What the zygote gets, less the cgroup namespace its init sends and the PID one.
        passed: Vec<OwnedFd>,
        pid_ns: OwnedFd,
        /// Where its init says its root is built ([`JailBuilt`]).
        done: OwnedFd,
    },
    Refused(String),
}

/// Builds jails for the zygote until it ends, reaping each jail's init when it dies; then
/// reports how the zygote ended and exits, which takes the whole template with it. A request
/// is taken while earlier jails' inits build their roots (each in its own process), and
/// answered in the order asked.
fn serve_jails(zygote: i32, requests: OwnedFd, status: &OwnedFd) -> ! {
    let Ok(zygote_fd) = sys::pidfd_open(zygote) else {
        let _ = sys::wait_child(zygote);
        sys::exit_immediately(1)
    };
    let mut slots = Slots::new();
    let mut skeleton: Option<SkeletonKey> = None;
    let mut jails: Vec<Jail> = Vec::new();
    let mut building: VecDeque<Building> = VecDeque::new();
    let mut requests_open = true;
    loop {
        while let Some(Building::Refused(_)) = building.front() {
            if let Some(Building::Refused(error)) = building.pop_front() {
                let _ = proto::send_msg(&requests, &JailReply::Failed { error });
            }
        }
        let oldest = match building.front() {
            Some(Building::Started { done, .. }) => Some(done.as_fd()),
            _ => None,
        };
        let mut fds = vec![
            PollFd::new(zygote_fd.as_fd(), PollFlags::POLLIN),
            PollFd::new(
                requests.as_fd(),
                if requests_open {
                    PollFlags::POLLIN
                } else {
                    PollFlags::empty()
                },
            ),
            // Nothing to wait for: the zygote's pidfd again, with no events asked.
            PollFd::new(
                oldest.unwrap_or(zygote_fd.as_fd()),
                if oldest.is_some() {
                    PollFlags::POLLIN
                } else {
                    PollFlags::empty()
                },
            ),
        ];
        fds.extend(
            jails
                .iter()
                .map(|j| PollFd::new(j.pidfd.as_fd(), PollFlags::POLLIN)),
        );
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => sys::exit_immediately(1),
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if ready[0] {
            let report = reap_until(zygote);
            let _ = proto::send_msg(status, &report);
            sys::exit_immediately(0)
        }
        // Jails whose init died: reap, and their slot is free again.
        let mut i = 0;
        jails.retain(|j| {
            let done = ready[3 + i] && matches!(sys::wait_child_nohang(j.pid), Ok(Some(_)));
            i += 1;
            if done {
                slots.give_back(j.slot);
            }
            !done
        });
        // The oldest jail's init has said how its root went: the zygote waits for it.
        if ready[2] {
            if let Some(Building::Started {
                jail,
                passed,
                pid_ns,
                done,
            }) = building.pop_front()
            {
                let slot = jail.slot;
                match finish_jail(jail, passed, pid_ns, &done) {
                    Ok((jail, passed)) => {
                        let raw: Vec<RawFd> = passed.iter().map(|f| f.as_raw_fd()).collect();
                        let _ = proto::send_msg_with_fds(&requests, &JailReply::Built, &raw);
                        jails.push(jail);
                    }
                    Err(e) => {
                        slots.give_back(slot);
                        let error = e.to_string();
                        let _ = proto::send_msg(&requests, &JailReply::Failed { error });
                    }
                }
            }
        }
        if !ready[1] {
            continue;
        }
        let (req, join) = match proto::recv_msg_with_fds::<JailRequest>(&requests) {
            Ok(Some(got)) => got,
            Ok(None) | Err(_) => {
                requests_open = false;
                continue;
            }
        };
        let Some(slot) = slots.take() else {
            let error = "every uid of the zygote's block is in use".to_owned();
            building.push_back(Building::Refused(error));
            continue;
        };
        let on_skeleton = match skeleton_for(&mut skeleton, &req.policy) {
            Ok(on) => on,
            Err(e) => {
                slots.give_back(slot);
                building.push_back(Building::Refused(e.to_string()));
                continue;
            }
        };
        match start_jail(&req.policy, join, req.into_cgroup, slot, on_skeleton) {
            Ok(started) => building.push_back(started),
            Err(e) => {
                slots.give_back(slot);
                building.push_back(Building::Refused(e.to_string()));
            }
        }
    }
}

/// Whether a jail of `policy` can enter the skeleton built in this namespace, built now from
/// `policy` if there is none yet: the first jail's policy makes it, and a jail whose root,
/// scratch mount points or working directory differ builds a root of its own.
fn skeleton_for(built: &mut Option<SkeletonKey>, policy: &Policy) -> Result<bool, InitError> {
    if let Some(built) = built {
        return Ok(built.fits(policy));
    }
    build_jails_skeleton(policy)?;
    *built = Some(SkeletonKey::of(policy));
    Ok(true)
}

/// Starts one child's jail: its init cloned into new namespaces (and with `into_cgroup`, into
/// the child's cgroup, whose directory `join` holds), its uid mapped, told to build its root
/// (which it does by itself; see [`finish_jail`]).
fn start_jail(
    policy: &Policy,
    join: Vec<OwnedFd>,
    into_cgroup: bool,
    slot: u32,
    on_skeleton: bool,
) -> Result<Building, InitError> {
    let into = match (into_cgroup, join.as_slice()) {
        (false, _) => None,
        (true, [dir]) => Some(dir.as_fd()),
        (true, _) => {
            return Err(InitError::Request(io::Error::other(
                "a jail to clone into a cgroup comes with that cgroup's directory alone",
            )))
        }
    };
    let (go_r, go_w) = unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys_err("pipe2"))?;
    let (done_r, done_w) = proto::seqpacket_pair().map_err(|source| InitError::Sys {
        call: "socketpair",
        source,
    })?;
    let forked =
        sys::fork_into_namespaces(jail_clone_flags().bits() as u64, into).map_err(|source| {
            InitError::Sys {
                call: "clone3",
                source,
            }
        })?;
    let Some((pid, pidfd)) = forked else {
        drop((go_w, done_r));
        // Already in its cgroup when cloned into it.
        let join = if into_cgroup { Vec::new() } else { join };
        jail_init(policy, on_skeleton, join, go_r, done_w)
    };
    drop((go_r, done_w, join));
    let jail = Jail { pid, pidfd, slot };
    let opened = (|| {
        let proc = Path::new("/proc").join(pid.to_string());
        // Its namespaces, opened while the jail's init is still as we are (it makes itself
        // undumpable once its root is built, which hides them).
        let mut passed = vec![jail.pidfd.try_clone().map_err(|source| InitError::Sys {
            call: "dup",
            source,
        })?];
        let pid_path = proc.join("ns/pid");
        let pid_ns: OwnedFd = fs::File::open(&pid_path)
            .map_err(path_err("open", &pid_path))?
            .into();
        for name in JAIL_NAMESPACES
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n != "cgroup")
        {
            let path = proc.join("ns").join(name);
            passed.push(
                fs::File::open(&path)
                    .map_err(path_err("open", &path))?
                    .into(),
            );
        }
        // The policy's uid and gid, and nothing else, map onto the slot's ids of the block.
        let write = |name: &str, contents: String| {
            let path = proc.join(name);
            fs::write(&path, contents).map_err(path_err("write", &path))
        };
        write("uid_map", format!("{} {slot} 1\n", policy.uid))?;
        write("setgroups", "deny".to_owned())?;
        write("gid_map", format!("{} {slot} 1\n", policy.gid))?;
        unistd::write(&go_w, b"g").map_err(sys_err("write"))?;
        Ok((passed, pid_ns))
    })();
    drop(go_w);
    match opened {
        Ok((passed, pid_ns)) => Ok(Building::Started {
            jail,
            passed,
            pid_ns,
            done: done_r,
        }),
        Err(e) => {
            end_jail(&jail);
            Err(e)
        }
    }
}

/// Reads what the jail's init says once it has built its root (`done` is readable): the jail,
/// and what the zygote needs to enter it.
fn finish_jail(
    jail: Jail,
    mut passed: Vec<OwnedFd>,
    pid_ns: OwnedFd,
    done: &OwnedFd,
) -> Result<(Jail, Vec<OwnedFd>), InitError> {
    let failed = |error: String| InitError::Sys {
        call: "jail init",
        source: io::Error::other(error),
    };
    let built = match proto::recv_msg_with_fds::<JailBuilt>(done) {
        Ok(Some((JailBuilt::Ready, mut fds))) if fds.len() == 1 => {
            passed.append(&mut fds);
            Ok(())
        }
        Ok(Some((JailBuilt::Failed { error }, _))) => Err(failed(error)),
        Ok(Some(_)) => Err(failed("no cgroup namespace".into())),
        Ok(None) => Err(failed("ended before its root was built".into())),
        Err(e) => Err(failed(e.to_string())),
    };
    match built {
        Ok(()) => {
            passed.push(pid_ns);
            Ok((jail, passed))
        }
        Err(e) => {
            end_jail(&jail);
            Err(e)
        }
    }
}

fn end_jail(jail: &Jail) {
    let _ = sys::pidfd_send_signal(&jail.pidfd, libc::SIGKILL);
    let _ = sys::wait_child(jail.pid);
}

// ---- 2. a jail's init -------------------------------------------------------------------

/// PID 1 of one child's jail. Says on `done` once the root is built, [`JailBuilt`] (or why
/// not), then only reaps: the child, a fork of the zygote, is not its child, but every orphan in the
/// namespace is. It dies with the template's init, or when the zygote kills it after the
/// child ended, which takes whatever the child left behind.
fn jail_init(
    policy: &Policy,
    on_skeleton: bool,
    join: Vec<OwnedFd>,
    go: OwnedFd,
    done: OwnedFd,
) -> ! {
    let built = (|| {
        prctl::set_pdeathsig(Signal::SIGKILL).map_err(sys_err("prctl(PR_SET_PDEATHSIG)"))?;
        join_cgroup(&join)?;
        drop(join);
        // Rooted at the child's cgroup, now that we are in it (as a cold sandbox's, made
        // after its outer init joined).
        nix::sched::unshare(CloneFlags::CLONE_NEWCGROUP)
            .map_err(sys_err("unshare(CLONE_NEWCGROUP)"))?;
        let mut byte = [0u8; 1];
        if unistd::read(&go, &mut byte).map_err(sys_err("read"))? == 0 {
            return Err(InitError::ParentGone);
        }
        drop(go);
        // Our ids are the template's root's, which this namespace does not map: become the
        // policy's (the block's slot on the host). Capabilities in this namespace stay, as
        // the change is not one from its root.
        let gid = Gid::from_raw(policy.gid);
        unistd::setresgid(gid, gid, gid).map_err(sys_err("setresgid"))?;
        let uid = Uid::from_raw(policy.uid);
        unistd::setresuid(uid, uid, uid).map_err(sys_err("setresuid"))?;
        if on_skeleton {
            enter_skeleton(policy)?;
        } else {
            let sources: Vec<Option<OwnedFd>> = policy.root.iter().map(|_| None).collect();
            build_root(policy, &sources)?;
        }
        unistd::sethostname(&policy.hostname).map_err(sys_err("sethostname"))?;
        let cgroup_ns: OwnedFd = fs::File::open("/proc/self/ns/cgroup")
            .map_err(path_err("open", Path::new("/proc/self/ns/cgroup")))?
            .into();
        // The child has our uid: keep it out of /proc/1, as a cold sandbox's init does.
        prctl::set_dumpable(false).map_err(sys_err("prctl(PR_SET_DUMPABLE)"))?;
        sys::drop_all_capabilities().map_err(|source| InitError::Sys {
            call: "drop capabilities",
            source,
        })?;
        Ok(cgroup_ns)
    })();
    let _ = match &built {
        Ok(cgroup_ns) => {
            proto::send_msg_with_fds(&done, &JailBuilt::Ready, &[cgroup_ns.as_raw_fd()])
        }
        Err(e) => proto::send_msg(
            &done,
            &JailBuilt::Failed {
                error: e.to_string(),
            },
        ),
    };
    let failed = built.is_err();
    drop((built, done));
    let _ = sys::close_range(0, RawFd::MAX);
    if failed {
        sys::exit_immediately(1)
    }
    reap_forever()
}

fn reap_forever() -> ! {
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    if chld.thread_block().is_err() {
        sys::exit_immediately(1)
    }
    loop {
        while matches!(
            nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)),
            Ok(status) if status.pid().is_some()
        ) {}
        let _ = chld.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_hands_out_each_slot_but_its_own_once_until_it_is_given_back() {
        let mut slots = Slots::new();
        let mut taken: Vec<u32> = std::iter::from_fn(|| slots.take()).collect();
        assert_eq!(taken.len(), ZYGOTE_IDS as usize - 1);
        taken.sort_unstable();
        taken.dedup();
        assert_eq!(taken, (1..ZYGOTE_IDS).collect::<Vec<_>>());
        slots.give_back(7);
        assert_eq!(slots.take(), Some(7));
        assert_eq!(slots.take(), None);
    }

    #[test]
    fn a_jail_s_init_is_cloned_into_every_namespace_but_the_cgroup_one() {
        let flags = jail_clone_flags();
        for flag in [
            CloneFlags::CLONE_NEWUSER,
            CloneFlags::CLONE_NEWNS,
            CloneFlags::CLONE_NEWPID,
            CloneFlags::CLONE_NEWNET,
            CloneFlags::CLONE_NEWIPC,
            CloneFlags::CLONE_NEWUTS,
        ] {
            assert!(flags.contains(flag), "{flag:?}");
        }
        assert!(!flags.contains(CloneFlags::CLONE_NEWCGROUP));
        assert_eq!(flags.bits().count_ones(), 6);
    }
}
