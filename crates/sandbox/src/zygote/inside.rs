//! A zygote from the inside, in the order one child comes to be:
//!
//! 1. **template init** ([`template_init`]): PID 1 of the template jail, built like any
//!    sandbox's init but keeping its privileges inside the template's user namespace, which
//!    maps a block of host ids. It starts the zygote, then builds one jail per child on the
//!    zygote's request ([`serve_jails`]): a fork of itself, small, cloned into new user, mount,
//!    PID, network, IPC, UTS and cgroup namespaces, whose uid is a host id of the block that no
//!    sibling has.
//! 2. **jail init** ([`jail_init`]): PID 1 of the child's PID namespace. It joins the child's
//!    cgroup (v1; on v2 it is cloned into it), builds the child's root with the same [`build_root`] as a cold sandbox, drops
//!    every capability, and reaps orphans until it is killed.
//! 3. **zygote** (`next`, `forked`): the interpreter with its modules loaded, which never runs
//!    user code. Per child it asks the template init for a jail, enters the jail's PID
//!    namespace for its next child only, and forks (with the interpreter's own fork hooks
//!    around it; on v2 a `clone3` into the child's cgroup). It reaps the child and reports how
//!    it ended.
//! 4. **child** (`child`): joins the jail's cgroup (v1) and namespaces, takes the jail's uid, keeps
//!    only its own descriptors, and confines itself with the same `confine` as a cold
//!    program, seccomp last; then the Python it is returns to run the program.

use std::convert::Infallible;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Mutex;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{setns, CloneFlags};
use nix::sys::prctl;
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::{self, Gid, Uid};
use serde::{Deserialize, Serialize};

use crate::init::{self, build_root, confine, fail, sys_err, InitError, FIRST_EXTRA_FD};
use crate::policy::Policy;
use crate::proto::{self, InitRequest, Report};
use crate::seccomp::Filters;
use crate::sys::{self, ForkResult};

/// Where the zygote finds the host's control socket and its template init's.
pub(crate) const HOST_FD: RawFd = 3;
pub(crate) const JAILS_FD: RawFd = 4;

/// The namespaces of a child's jail, in the order the child enters them (user first: it gives
/// the rights over the others). The jail's init makes the cgroup namespace itself, once in the
/// child's cgroup, so that the namespace's root is that cgroup; the others come with it.
const JAIL_NAMESPACES: [(&str, CloneFlags); 6] = [
    ("user", CloneFlags::CLONE_NEWUSER),
    ("mnt", CloneFlags::CLONE_NEWNS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
];

/// Host to zygote, one per child. Descriptors: the status socket, stdin, stdout, stderr,
/// [`join_cgroup`] cgroup files opened for writing, then the program's own.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ChildRequest {
    pub policy: Policy,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub join_cgroup: u32,
    /// The one cgroup descriptor is the directory of the child's cgroup (v2), which the
    /// jail's init and the child are cloned into (`CLONE_INTO_CGROUP`).
    pub into_cgroup: bool,
    pub extra_fds: u32,
}

/// Zygote to host, once: its modules are loaded and it takes requests.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ZygoteReady {
    /// What each child copies of the zygote's memory before its program runs (`survey`).
    pub prefault_bytes: u64,
    /// Whether a child can be cloned straight into its cgroup (see [`ZygoteState::clone_into`]).
    pub clones_into_cgroups: bool,
}

/// At most this much of the zygote's memory is recorded by `survey`.
const SURVEY_MAX_BYTES: usize = 64 << 20;
/// How much a child copies between two looks at its stdin (`prefault`).
const PREFAULT_CHUNK: usize = 128 << 10;
/// How much a child copies ahead even when its request is already waiting: copying a page
/// ahead costs about 2 µs, a fault on it about 4-5 (on this VM), so copying what a small
/// request writes (the lean zygote's survey is about 1.4 MiB) pays even on the request's
/// path; more (a first chart's pages) is copied only while the child waits.
const PREFAULT_EAGER: usize = 2 << 20;

/// Zygote to template init: build a jail. Descriptors: the cgroup files to join, or the
/// directory of the cgroup to clone the jail's init into (`into_cgroup`).
#[derive(Debug, Serialize, Deserialize)]
struct JailRequest {
    policy: Policy,
    into_cgroup: bool,
}

/// Template init to zygote. Descriptors when built: a pidfd for the jail's init, then its
/// namespaces as in `JAIL_NAMESPACES`, then its PID namespace.
#[derive(Debug, Serialize, Deserialize)]
enum JailReply {
    Built,
    Failed { error: String },
}

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
    init::close_from_except(4 + n, status_fd)?;
    let status = sys::take_inherited_fd(status_fd).map_err(|source| InitError::Sys {
        call: "status socket",
        source,
    })?;
    unistd::setsid().map_err(sys_err("setsid"))?;
    prctl::set_no_new_privs().map_err(sys_err("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    let landlock = crate::proto::LandlockReport {
        state: crate::proto::LandlockState::Disabled,
        abi: None,
    };
    proto::send_msg(&status, &Report::Ready { landlock }).map_err(|source| InitError::Sys {
        call: "send",
        source,
    })?;
    let (program, args, env) = init::exec_strings(req)?;
    let err = unistd::execve(&program, &args, &env).unwrap_err();
    Err(InitError::Exec {
        program: req.program.clone(),
        source: err.into(),
    })
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
    // Slot 0 is the template's own root; children take 1.. (their host ids are the block's).
    let mut free: Vec<u32> = (1..super::ZYGOTE_IDS).rev().collect();
    let mut jails: Vec<Jail> = Vec::new();
    let mut building: std::collections::VecDeque<Building> = std::collections::VecDeque::new();
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
            let report = init::reap_until(zygote);
            let _ = proto::send_msg(status, &report);
            sys::exit_immediately(0)
        }
        // Jails whose init died: reap, and their slot is free again.
        let mut i = 0;
        jails.retain(|j| {
            let done = ready[3 + i] && matches!(sys::wait_child_nohang(j.pid), Ok(Some(_)));
            i += 1;
            if done {
                free.push(j.slot);
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
                        free.push(slot);
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
        let Some(slot) = free.pop() else {
            let error = "every uid of the zygote's block is in use".to_owned();
            building.push_back(Building::Refused(error));
            continue;
        };
        match start_jail(&req.policy, join, req.into_cgroup, slot) {
            Ok(started) => building.push_back(started),
            Err(e) => {
                free.push(slot);
                building.push_back(Building::Refused(e.to_string()));
            }
        }
    }
}

/// Starts one child's jail: its init cloned into new namespaces (and with `into_cgroup`, into
/// the child's cgroup, whose directory `join` holds), its uid mapped, told to build its root
/// (which it does by itself; see [`finish_jail`]).
fn start_jail(
    policy: &Policy,
    join: Vec<OwnedFd>,
    into_cgroup: bool,
    slot: u32,
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
    // The cgroup namespace the jail's init makes itself, once in the child's cgroup.
    let namespaces = JAIL_NAMESPACES
        .iter()
        .filter(|(_, flag)| *flag != CloneFlags::CLONE_NEWCGROUP)
        .fold(CloneFlags::CLONE_NEWPID, |all, (_, flag)| all | *flag);
    let forked = sys::fork_into_namespaces(namespaces.bits() as u64, into).map_err(|source| {
        InitError::Sys {
            call: "clone3",
            source,
        }
    })?;
    let Some((pid, pidfd)) = forked else {
        drop((go_w, done_r));
        // Already in its cgroup when cloned into it.
        let join = if into_cgroup { Vec::new() } else { join };
        jail_init(policy, join, go_r, done_w)
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
            .map_err(init::path_err("open", &pid_path))?
            .into();
        for name in JAIL_NAMESPACES
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n != "cgroup")
        {
            let path = proc.join("ns").join(name);
            passed.push(
                fs::File::open(&path)
                    .map_err(init::path_err("open", &path))?
                    .into(),
            );
        }
        // The policy's uid and gid, and nothing else, map onto the slot's ids of the block.
        let write = |name: &str, contents: String| {
            let path = proc.join(name);
            fs::write(&path, contents).map_err(init::path_err("write", &path))
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

/// A jail's init to the template's: its root is built (with its cgroup namespace), or why not.
#[derive(Debug, Serialize, Deserialize)]
enum JailBuilt {
    Ready,
    Failed { error: String },
}

// ---- 2. a jail's init -------------------------------------------------------------------

/// PID 1 of one child's jail. Says `R` on `done` once the root is built (or why not), then
/// only reaps: the child, a fork of the zygote, is not its child, but every orphan in the
/// namespace is. It dies with the template's init, or when the zygote kills it after the
/// child ended, which takes whatever the child left behind.
fn jail_init(policy: &Policy, join: Vec<OwnedFd>, go: OwnedFd, done: OwnedFd) -> ! {
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
        let sources: Vec<Option<OwnedFd>> = policy.root.iter().map(|_| None).collect();
        build_root(policy, &sources)?;
        unistd::sethostname(&policy.hostname).map_err(sys_err("sethostname"))?;
        let cgroup_ns: OwnedFd = fs::File::open("/proc/self/ns/cgroup")
            .map_err(init::path_err("open", Path::new("/proc/self/ns/cgroup")))?
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

fn join_cgroup(files: &[OwnedFd]) -> Result<(), InitError> {
    for file in files {
        unistd::write(file, b"0").map_err(sys_err("joining the sandbox cgroup"))?;
    }
    Ok(())
}

// ---- 3. the zygote ----------------------------------------------------------------------

/// The zygote process's own state, inside it (the host's handle on it is [`super::Zygote`]).
struct ZygoteState {
    /// [`None`] once the host has closed it: the zygote then only reaps its last children.
    host: Option<OwnedFd>,
    jails: OwnedFd,
    /// Our own PID namespace, to return to after each fork.
    own_pid_ns: OwnedFd,
    filters: Filters,
    /// The interpreter's own fork, for `serve`.
    fork: sys::PythonFork,
    /// What a fork by `clone3` must redo of glibc's, when the kernel says (see `clone_into`).
    glibc: Option<sys::ForkAsLibc>,
    /// Requests whose jails are asked for, oldest first.
    asked: std::collections::VecDeque<Asked>,
    pending: Option<Pending>,
    live: Vec<Live>,
    /// The zygote's pages a child writes, as (start, length): see `survey`.
    surveyed: Vec<(usize, usize)>,
}

/// A request whose jail the template's init builds. Requests are boxed: where they are moved
/// (out of this queue, out of the state) leaves a pointer behind, not a copy of their numbers.
struct Asked {
    request: Box<ChildRequest>,
    fds: Vec<OwnedFd>,
}

/// A child being made: its request and descriptors, and its jail.
struct Pending {
    request: Box<ChildRequest>,
    fds: Vec<OwnedFd>,
    /// The jail init's pidfd, then its namespaces (`JAIL_NAMESPACES`, then PID).
    jail: Vec<OwnedFd>,
    /// Cloned into its cgroup: nothing to join.
    placed: bool,
}

/// A child that runs.
struct Live {
    pid: i32,
    pidfd: OwnedFd,
    status: OwnedFd,
    jail_init: OwnedFd,
}

static ZYGOTE: Mutex<Option<ZygoteState>> = Mutex::new(None);

fn zygote_state() -> std::sync::MutexGuard<'static, Option<ZygoteState>> {
    ZYGOTE.lock().unwrap_or_else(|e| e.into_inner())
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
            asked: std::collections::VecDeque::new(),
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
    let clones_into_cgroups = z.glibc.is_some_and(|g| g.alone());
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
/// (a first chart where charts are preloaded, the program's rehearsal of a small request)
/// and stopped (`surveyed`). The pages it wrote (present in it and no longer shared with us:
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
    let expected = 4 + request.join_cgroup as usize + request.extra_fds as usize;
    if fds.len() != expected {
        if let Some(status) = fds.first() {
            report_failed(status, "zygote", "the request's descriptors are missing");
        }
        return Ok(());
    }
    let join: Vec<RawFd> = fds[4..4 + request.join_cgroup as usize]
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
    if jail.len() != 2 + JAIL_NAMESPACES.len() {
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
        let dir = pending.fds.get(4)?.try_clone().ok()?;
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

fn report_failed(status: &OwnedFd, stage: &str, error: &str) {
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

// ---- 4. the child -----------------------------------------------------------------------

/// In the child, right after the fork: enters its jail and confines itself. On success
/// writes the program's arguments and environment into `out` (NUL-separated: the number of
/// arguments, the arguments, then `KEY=VALUE` entries) and returns their length; on failure
/// reports why to the host and exits.
pub(crate) fn child(out: &mut [u8]) -> usize {
    let Some(mut z) = zygote_state().take() else {
        sys::exit_immediately(127)
    };
    let Some(pending) = z.pending.take() else {
        sys::exit_immediately(127)
    };
    // The siblings' descriptors go first (those running, and those whose jails are being
    // built): a sibling's host sees its end only when every copy of its status socket is closed, and what follows can take milliseconds (a join through
    // `cgroup.procs` waits for an RCU grace period; with both cores busy, 10-30 ms here).
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
        report_failed(&status, "program", &e.to_string());
        sys::exit_immediately(127)
    }
    let encoded = encode_program(&request);
    if encoded.len() > out.len() {
        report_failed(&status, "program", "arguments and environment too large");
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
    let mut budget = usize::try_from(policy.limits.memory_bytes / 4).unwrap_or(usize::MAX);
    let mut copied = 0;
    for &(start, len) in ranges {
        let end = start + len.min(budget);
        budget -= end - start;
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
        if budget == 0 {
            return;
        }
    }
}

fn encode_program(request: &ChildRequest) -> Vec<u8> {
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
    out
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
    let joins = &fds[4..4 + request.join_cgroup as usize];
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
    let extras = &fds[4 + request.join_cgroup as usize..];
    let n = extras.len() as RawFd;
    let floor = 3 + n;
    sys::place_fds(fds[1..4].iter().chain(extras).map(AsFd::as_fd), 0).map_err(|source| {
        InitError::Sys {
            call: "placing the program's descriptors",
            source,
        }
    })?;
    init::close_from_except(floor, status.as_raw_fd())?;
    unistd::chdir(&policy.workdir).map_err(init::path_errno("chdir", &policy.workdir))?;

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
