//! The inside of a sandbox, in the order it is built (compare firecracker's `Env::run` and
//! nsjail's `containProc`). Three processes take part, all airlock code until the last exec:
//!
//! 1. **outer** — our own binary re-executed by the host (`INIT_ARG`), fresh and
//!    single-threaded, already placed in the sandbox's cgroup. It drops host root to an
//!    unprivileged uid of its own, creates the user namespace (mapping that uid to the policy's
//!    uid), then the mount, PID, network, IPC, UTS and cgroup namespaces, and forks:
//! 2. **init** — PID 1 of the new PID namespace. It builds the root file system, pivots into
//!    it, forks the program and reaps every process until the program ends, then reports the
//!    program's wait status and exits; the kernel then kills whatever is left in the namespace.
//!    The host kills a sandbox by sending it SIGKILL through a pidfd (`spawn::Killer`); it
//!    also dies with `outer` (`PR_SET_PDEATHSIG`), so a host that dies takes it along.
//! 3. **program** — a new session, the OOM killer's first choice, rlimits, only its own
//!    descriptors, `no_new_privs`, no capabilities at all, Landlock, seccomp last, then `execve`.
//!
//! The steps themselves (the root, the confinement, the exec's strings) are `jail`'s, which a
//! zygote's processes take too. A zygote's template is built by the same outer and init (the
//! outer mapping a block of host ids, `zygote::ids`); its init then serves the zygote
//! (`zygote::template`) instead of forking a program.

use std::convert::Infallible;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{unshare, CloneFlags};
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::unistd::{self, Gid, Uid};

use crate::jail::{
    build_root, close_from_except, confine, exec_strings, fail, join_cgroup, path_err, path_errno,
    reap_until, sys_err, InitError, FIRST_EXTRA_FD,
};
use crate::policy::{Policy, RootEntry};
use crate::proto::{self, InitRequest, Report};
use crate::seccomp::Filters;
use crate::sys::{self, ForkResult};
use crate::zygote::{ids, template};

/// The argument that turns our own binary into a sandbox's init (see [`run_if_init`]).
pub const INIT_ARG: &str = "__airlock-sandbox-init";
/// The status socket, as the host places it in `outer`.
pub(crate) const STATUS_FD: RawFd = 3;
/// When the host runs as root, each sandbox gets host uid/gid `HOST_ID_BASE + pid of outer`:
/// unique among live sandboxes, owning nothing on the host, and mapped to the policy's uid.
pub const HOST_ID_BASE: u32 = 0x7000_0000;
// Below every zygote's block of host ids, whatever the pid.
const _: () = assert!(HOST_ID_BASE + ids::PID_MAX < ids::ZYGOTE_ID_BASE);

/// Where the init's own score for the OOM killer is.
const OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";

/// Runs a sandbox's init if this process was started as one, and never returns then.
/// Binaries that spawn sandboxes call this first thing in `main`.
pub fn run_if_init() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(OsStr::new(INIT_ARG)) {
        let Ok(status) = sys::take_inherited_fd(STATUS_FD) else {
            sys::exit_immediately(1)
        };
        serve(&status)
    }
}

fn serve(status: &OwnedFd) -> ! {
    match outer(status, None) {
        Ok(never) => match never {},
        Err(e) => fail(status, "outer", &e),
    }
}

/// An init forked ahead of its sandbox (`Prestarted`) by the host `parent`: first made what
/// an executed one is, given `fds` (stdin, stdout, stderr and the status socket): those at 0
/// to 3 and nothing else open, its own process group, no environment, named as an init. Then
/// it makes its namespaces while the host prepares the request (see [`ahead`]).
pub(crate) fn serve_forked(fds: [OwnedFd; 4], parent: i32) -> ! {
    let made = sys::place_fds(fds.iter().map(AsFd::as_fd), 0).and_then(|()| {
        // Those that sat on 0 to 3 were replaced there; the rest are closed just below.
        std::mem::forget(fds);
        sys::close_range(STATUS_FD + 1, RawFd::MAX)?;
        nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0))?;
        nix::sys::prctl::set_name(c"airlock-sandbox")?;
        Ok(())
    });
    if made.is_err() {
        sys::exit_immediately(1)
    }
    // The host's environment is nobody's business here: the program gets the request's.
    for (key, _) in std::env::vars_os() {
        std::env::remove_var(key);
    }
    let Ok(status) = sys::take_inherited_fd(STATUS_FD) else {
        sys::exit_immediately(1)
    };
    // A failure is the request's answer, when it comes.
    let made = ahead(parent);
    match outer(&status, Some(made)) {
        Ok(never) => match never {},
        Err(e) => fail(&status, "outer", &e),
    }
}

/// Whether an init started ahead can build a sandbox with `policy`: it has mapped
/// [`Policy::default`]'s ids and armed its parent-death signal before any request named
/// them (the host asks first, `Prestarted::serves`, and the init checks again).
pub(crate) fn served_ahead(policy: &Policy) -> bool {
    let ahead = Policy::default();
    // A volume's idmapped tree is made as root on the host, which such an init no longer is.
    policy.die_with_parent
        && (policy.uid, policy.gid) == (ahead.uid, ahead.gid)
        && policy.volumes.is_empty()
}

/// What an init started ahead does before its request, while the host prepares the rest:
/// every step that no request decides. It drops the host's rights, arms the parent-death
/// signal and makes its user namespace (mapping [`Policy::default`]'s ids) and the mount, PID, network,
/// IPC and UTS namespaces. The cgroup namespace waits for the request: it must be made once
/// the sandbox's cgroup, which the host creates meanwhile, is joined, or the sandbox would
/// see the host's cgroup paths. The kernel memory of these namespaces is charged to the
/// host's cgroup rather than the sandbox's: a fixed amount made by airlock, not the program.
fn ahead(parent: i32) -> Result<(), InitError> {
    let (host_uid, host_gid) = drop_host_root()?;
    // After the last change of credentials, as in `outer`.
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(sys_err("prctl(PR_SET_PDEATHSIG)"))?;
    if unistd::getppid().as_raw() != parent {
        return Err(InitError::ParentGone);
    }
    unshare(CloneFlags::CLONE_NEWUSER).map_err(sys_err("unshare(CLONE_NEWUSER)"))?;
    let ids = Policy::default();
    write_id_maps(ids.uid, ids.gid, host_uid, host_gid)?;
    unshare(NAMESPACES - CloneFlags::CLONE_NEWCGROUP).map_err(sys_err("unshare(namespaces)"))
}

/// Every namespace a sandbox gets besides its user namespace.
const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWCGROUP);

/// Puts descriptors received with the request where an init started for its sandbox finds
/// them: `FIRST_EXTRA_FD`, `FIRST_EXTRA_FD + 1`, ..., without the close-on-exec flag.
fn place_passed_fds(passed: Vec<OwnedFd>, expected: u32) -> Result<(), InitError> {
    if passed.len() != expected as usize {
        return Err(InitError::Request(io::Error::other(format!(
            "{} descriptors passed with the request, which names {expected}",
            passed.len()
        ))));
    }
    let failed = |source| InitError::Sys {
        call: "placing the program's descriptors",
        source,
    };
    // Received at the lowest free numbers, which are the destinations: out of the way first.
    let floor = FIRST_EXTRA_FD + passed.len() as RawFd;
    let lifted = sys::lift_fds(passed.iter().map(AsFd::as_fd), floor).map_err(failed)?;
    drop(passed);
    sys::place_fds(lifted.iter().map(AsFd::as_fd), FIRST_EXTRA_FD).map_err(failed)
}

/// The outer init: from the request on, the sandbox's namespaces and its PID 1. `ahead` is
/// what an init started ahead made before the request ([`None`] for an executed init).
fn outer(status: &OwnedFd, ahead: Option<Result<(), InitError>>) -> Result<Infallible, InitError> {
    let (req, mut passed): (InitRequest, _) = proto::recv_msg_with_fds(status)
        .map_err(InitError::Request)?
        .ok_or_else(|| InitError::Request(io::ErrorKind::UnexpectedEof.into()))?;
    let ahead = match ahead {
        Some(made) => {
            made?;
            true
        }
        None => false,
    };
    if ahead && (req.zygote || !served_ahead(&req.policy)) {
        return Err(InitError::Request(io::Error::other(
            "an init started ahead serves no zygote, other ids or a sandbox that outlives us",
        )));
    }
    // An executed init found the program's descriptors in place and opens its sources itself.
    let program_fds = if ahead { req.extra_fds as usize } else { 0 };
    let source_fds = req.passed_sources.iter().filter(|&&p| p).count();
    if passed.len() != program_fds + source_fds + req.passed_joins as usize
        || (!ahead && !passed.is_empty())
    {
        return Err(InitError::Request(io::Error::other(format!(
            "{} descriptors passed with the request, which names {} and {source_fds} and {}",
            passed.len(),
            req.extra_fds,
            req.passed_joins
        ))));
    }
    let floor = FIRST_EXTRA_FD + req.extra_fds as RawFd;
    let lift = |fds: Vec<OwnedFd>| {
        sys::lift_fds(fds.iter().map(AsFd::as_fd), floor).map_err(|source| InitError::Sys {
            call: "placing the passed descriptors",
            source,
        })
    };
    // Above the program's places before those are filled.
    let joins = lift(passed.split_off(program_fds + source_fds))?;
    let mut host_sources = lift(passed.split_off(program_fds))?.into_iter();
    if ahead {
        place_passed_fds(passed, req.extra_fds)?;
    }
    // The host compiled the filters; they follow the request.
    let filters = if req.policy.seccomp.is_required() {
        let bytes = proto::recv_raw(status, proto::MAX_FILTERS)
            .map_err(InitError::Request)?
            .ok_or_else(|| InitError::Request(io::ErrorKind::UnexpectedEof.into()))?;
        Some(Filters::decode(&bytes)?)
    } else {
        None
    };
    // Into the sandbox's cgroup before anything runs in it: still single-threaded here, and
    // root on the host unless started ahead, which writes to files the host opened.
    for tasks in &req.join_cgroup {
        std::fs::write(tasks, "0").map_err(|source| InitError::Path {
            call: "joining the sandbox cgroup",
            path: tasks.clone(),
            source,
        })?;
    }
    join_cgroup(&joins)?;
    drop(joins);
    if ahead {
        // Rooted at the sandbox's cgroup, joined just now.
        unshare(CloneFlags::CLONE_NEWCGROUP).map_err(sys_err("unshare(CLONE_NEWCGROUP)"))?;
    }
    let first_unused = FIRST_EXTRA_FD + req.extra_fds as RawFd;
    let sources = if ahead {
        // Opened by the host (we no longer have its rights), for the entries it marked. An
        // init forked ahead closed everything else of the host's at its start.
        req.policy
            .root
            .iter()
            .enumerate()
            .map(|(i, _)| {
                req.passed_sources
                    .get(i)
                    .copied()
                    .unwrap_or(false)
                    .then(|| host_sources.next())
                    .flatten()
            })
            .collect()
    } else {
        // Nothing but stdio, the status socket and the program's own descriptors stays open.
        sys::close_range(first_unused, RawFd::MAX).map_err(|source| InitError::Sys {
            call: "close_range",
            source,
        })?;
        // Bind-mount sources are opened with the caller's rights, before those are dropped:
        // the mounts then use these descriptors, not paths an unprivileged uid must be able
        // to reach (and not paths that could be swapped meanwhile).
        let mut sources = open_sources(&req.policy)?;
        sources.extend(open_volumes(&req.policy)?);
        // A zygote's template maps a block of host ids (one per child), which only a process
        // that stays root on the host can write: a helper forked before we drop root.
        let host_ids = if req.zygote {
            let writer = ids::IdWriter::fork()?;
            ids::drop_host_root_to_block()?;
            HostIds::Block(writer)
        } else {
            let (uid, gid) = drop_host_root()?;
            HostIds::Own { uid, gid }
        };
        // After the last change of credentials: the kernel clears the parent-death signal
        // whenever the effective uid or gid changes.
        if req.policy.die_with_parent {
            prctl::set_pdeathsig(Signal::SIGKILL).map_err(sys_err("prctl(PR_SET_PDEATHSIG)"))?;
            if unistd::getppid().as_raw() != req.parent_pid {
                return Err(InitError::ParentGone);
            }
        }
        unshare(CloneFlags::CLONE_NEWUSER).map_err(sys_err("unshare(CLONE_NEWUSER)"))?;
        match host_ids {
            HostIds::Block(writer) => writer.write_maps()?,
            HostIds::Own { uid, gid } => write_id_maps(req.policy.uid, req.policy.gid, uid, gid)?,
        }
        // A zygote's template keeps its host's cgroup namespace: the zygote clones each child
        // into a cgroup beside its own, which the kernel refuses (with `nsdelegate`) to a
        // caller whose cgroup namespace does not reach both. Each child's jail has its own.
        let namespaces = if req.zygote {
            NAMESPACES - CloneFlags::CLONE_NEWCGROUP
        } else {
            NAMESPACES
        };
        unshare(namespaces).map_err(sys_err("unshare(namespaces)"))?;
        sources
    };
    if let Some(port) = req.policy.egress_port {
        // Before the fork, so that neither init nor the program ever holds it.
        let listener = egress_listener(port)?;
        proto::send_msg_with_fd(status, &Report::Listener, Some(&listener)).map_err(|source| {
            InitError::Sys {
                call: "sending the egress listener",
                source,
            }
        })?;
    }

    // `init` watches the read end: if we die before its PR_SET_PDEATHSIG is armed, it sees EOF.
    let (alive_r, alive_w) =
        unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys_err("pipe2"))?;
    match sys::fork().map_err(sys_err("fork"))? {
        ForkResult::Child => {
            drop(alive_w);
            match init(&req, status, alive_r, filters.as_ref(), sources) {
                Ok(never) => match never {},
                Err(e) => fail(status, "init", &e),
            }
        }
        ForkResult::Parent { child } => {
            drop(alive_r);
            // The host kills the sandbox through this pidfd, never by killing us: init must
            // stay our child so that we, and no init that might not reap, collect it.
            let started = sys::pidfd_open(child.as_raw())
                .and_then(|pidfd| proto::send_msg_with_fd(status, &Report::Started, Some(&pidfd)));
            if let Err(source) = started {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                let _ = sys::wait_child(child.as_raw());
                return Err(InitError::Sys {
                    call: "pidfd_open",
                    source,
                });
            }
            let _ = sys::close_range(0, 2);
            let _ = sys::close_range(FIRST_EXTRA_FD, first_unused - 1);
            let _ = sys::wait_child(child.as_raw());
            drop(alive_w);
            sys::exit_immediately(0)
        }
    }
}

/// The egress proxy's listening socket, on the new network namespace's loopback. We are root
/// in the user namespace that owns it, so we may bring `lo` up and bind any port.
fn egress_listener(port: u16) -> Result<OwnedFd, InitError> {
    sys::loopback_up().map_err(|source| InitError::Sys {
        call: "bringing up loopback",
        source,
    })?;
    let listener =
        std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).map_err(|source| {
            InitError::Sys {
                call: "binding the egress listener",
                source,
            }
        })?;
    Ok(OwnedFd::from(listener))
}

/// The host ids the outer init's user namespace maps.
enum HostIds {
    /// One uid and gid of its own (see [`drop_host_root`]), which the init maps itself.
    Own { uid: u32, gid: u32 },
    /// A zygote's template: a block of them, whose maps a helper that stayed root writes.
    Block(ids::IdWriter),
}

/// As root on the host, become a uid and gid that own nothing; otherwise keep our own.
fn drop_host_root() -> Result<(u32, u32), InitError> {
    let euid = unistd::geteuid();
    if !euid.is_root() {
        return Ok((euid.as_raw(), unistd::getegid().as_raw()));
    }
    let id = own_host_id();
    unistd::setgroups(&[]).map_err(sys_err("setgroups"))?;
    let gid = Gid::from_raw(id);
    unistd::setresgid(gid, gid, gid).map_err(sys_err("setresgid"))?;
    let uid = Uid::from_raw(id);
    unistd::setresuid(uid, uid, uid).map_err(sys_err("setresuid"))?;
    // Changing credentials made us non-dumpable, which hands /proc/self (and its uid_map) to
    // root. Nothing outside can reach this process: its uid is unique and unused.
    prctl::set_dumpable(true).map_err(sys_err("prctl(PR_SET_DUMPABLE)"))?;
    Ok((id, id))
}

/// The host uid and gid a sandbox whose outer init we are gets, when the host is root.
fn own_host_id() -> u32 {
    HOST_ID_BASE + unistd::getpid().as_raw() as u32
}

/// Each volume's tree (`open_tree`), made `nosuid`, `nodev`, `noexec` (and read-only where
/// asked) and idmapped so that the policy's uid and gid on the volume's file system are this
/// sandbox's host ids: every sandbox sees the files as its own, and writes them as the
/// policy's ids. Done as root on the host (the kernel allows idmapping a file system only to
/// whoever may administer the namespace it was mounted in), before we drop it.
fn open_volumes(policy: &Policy) -> Result<Vec<Option<OwnedFd>>, InitError> {
    if policy.volumes.is_empty() {
        return Ok(Vec::new());
    }
    if !unistd::geteuid().is_root() {
        return Err(InitError::Volumes(
            "mounting a volume needs airlock to run as root on the host (each sandbox sees \
             its files as its own through an idmapped mount)"
                .into(),
        ));
    }
    let id = own_host_id();
    let userns = mapping_namespace(policy.uid, policy.gid, id, id)?;
    policy
        .volumes
        .iter()
        .map(|volume| {
            let tree = sys::open_tree_clone(&volume.source)
                .map_err(path_err("open_tree (volume)", &volume.source))?;
            let mut attrs =
                libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC;
            if volume.read_only {
                attrs |= libc::MOUNT_ATTR_RDONLY;
            }
            sys::mount_setattr_tree(&tree, attrs, Some(userns.as_fd()))
                .map_err(path_err("idmapping a volume", &volume.source))?;
            Ok(Some(tree))
        })
        .collect()
}

/// A user namespace whose one mapping is `uid` to `host_uid` and `gid` to `host_gid`: a
/// child unshares it and waits while we (root on the host) write its maps and open it.
fn mapping_namespace(
    uid: u32,
    gid: u32,
    host_uid: u32,
    host_gid: u32,
) -> Result<OwnedFd, InitError> {
    let pipe = || unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys_err("pipe2"));
    let (ready_r, ready_w) = pipe()?;
    let (hold_r, hold_w) = pipe()?;
    match sys::fork().map_err(sys_err("fork"))? {
        ForkResult::Child => {
            drop((ready_r, hold_w));
            let made = unshare(CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = unistd::write(&ready_w, &[u8::from(made)]);
            // Until the parent is done with us (or gone).
            let _ = unistd::read(&hold_r, &mut [0u8; 1]);
            sys::exit_immediately(0)
        }
        ForkResult::Parent { child } => {
            drop((ready_w, hold_r));
            let opened = (|| {
                let mut made = [0u8; 1];
                if unistd::read(&ready_r, &mut made).map_err(sys_err("read"))? != 1 || made[0] != 1
                {
                    return Err(InitError::Volumes(
                        "a user namespace for the volumes' idmapping could not be made".into(),
                    ));
                }
                let proc = Path::new("/proc").join(child.as_raw().to_string());
                for (file, line) in [
                    ("uid_map", format!("{uid} {host_uid} 1\n")),
                    ("gid_map", format!("{gid} {host_gid} 1\n")),
                ] {
                    let path = proc.join(file);
                    fs::write(&path, line).map_err(path_err("write", &path))?;
                }
                let ns = proc.join("ns/user");
                fs::File::open(&ns)
                    .map(OwnedFd::from)
                    .map_err(path_err("open", &ns))
            })();
            drop(hold_w);
            let _ = sys::wait_child(child.as_raw());
            opened
        }
    }
}

/// Maps exactly one uid and gid: the policy's, onto our host ids. `setgroups` is denied so
/// that supplementary groups can never be dropped to get around a group-based permission.
fn write_id_maps(uid: u32, gid: u32, host_uid: u32, host_gid: u32) -> Result<(), InitError> {
    let write = |file: &'static str, contents: String| {
        let path = Path::new(file);
        fs::write(path, contents).map_err(path_err("write", path))
    };
    write("/proc/self/uid_map", format!("{uid} {host_uid} 1\n"))?;
    write("/proc/self/setgroups", "deny".to_owned())?;
    write("/proc/self/gid_map", format!("{gid} {host_gid} 1\n"))
}

/// PID 1 of the sandbox.
fn init(
    req: &InitRequest,
    status: &OwnedFd,
    alive: OwnedFd,
    filters: Option<&Filters>,
    sources: Vec<Option<OwnedFd>>,
) -> Result<Infallible, InitError> {
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(sys_err("prctl(PR_SET_PDEATHSIG)"))?;
    let mut fds = [PollFd::new(alive.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).map_err(sys_err("poll"))?;
    if fds[0]
        .revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLIN))
    {
        return Err(InitError::ParentGone);
    }
    drop(alive);
    // Whatever the host's own score, the program must stay killable by the OOM killer.
    let oom = Path::new(OOM_SCORE_ADJ);
    let score: i32 = fs::read_to_string(oom)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if score < 0 {
        fs::write(oom, "0").map_err(path_err("write", oom))?;
    }

    build_root(&req.policy, &sources)?;
    drop(sources);
    unistd::sethostname(&req.policy.hostname).map_err(sys_err("sethostname"))?;
    unistd::chdir(&req.policy.workdir).map_err(path_errno("chdir", &req.policy.workdir))?;
    // Keeps the program (same uid) out of /proc/1: no ptrace-style access to our memory,
    // descriptors or status socket.
    prctl::set_dumpable(false).map_err(sys_err("prctl(PR_SET_DUMPABLE)"))?;
    if req.zygote {
        return template::template_init(req, status);
    }

    match sys::fork().map_err(sys_err("fork"))? {
        ForkResult::Child => program(req, status, filters),
        ForkResult::Parent { child } => {
            let n = req.extra_fds as RawFd;
            let _ = sys::close_range(0, 2);
            let _ = sys::close_range(FIRST_EXTRA_FD, FIRST_EXTRA_FD + n - 1);
            sys::drop_all_capabilities().map_err(|source| InitError::Sys {
                call: "drop capabilities",
                source,
            })?;
            let report = reap_until(child.as_raw());
            let _ = proto::send_msg(status, &report);
            // Exiting as PID 1 makes the kernel kill everything left in the namespace.
            sys::exit_immediately(0)
        }
    }
}

/// A detached copy of the source of each bind mount of the root (`open_tree`), in policy
/// order: made with the caller's rights, attached inside the sandbox's mount namespace. Only
/// root may clone mounts of the host's namespace; an unprivileged caller gets [`None`] and binds
/// by path from inside, so its sources must be reachable by its own uid.
pub(crate) fn open_sources(policy: &Policy) -> Result<Vec<Option<OwnedFd>>, InitError> {
    let root = unistd::geteuid().is_root();
    policy
        .root
        .iter()
        .map(|entry| match entry {
            RootEntry::ReadOnly { source, .. } | RootEntry::Writable { source, .. } if root => {
                sys::open_tree_clone(source)
                    .map(Some)
                    .map_err(path_err("open_tree", source))
            }
            _ => Ok(None),
        })
        .collect()
}

/// The program's process: confine, then exec. Never returns.
fn program(req: &InitRequest, status: &OwnedFd, filters: Option<&Filters>) -> ! {
    // The status socket moves above the program's descriptors, which then slide down to 3..
    let n = req.extra_fds as RawFd;
    let status_fd = match sys::dup_cloexec_at_least(status.as_raw_fd(), FIRST_EXTRA_FD + n) {
        Ok(fd) => fd,
        Err(source) => fail(
            status,
            "program",
            &InitError::Sys {
                call: "fcntl(F_DUPFD_CLOEXEC)",
                source,
            },
        ),
    };
    let status = match sys::take_inherited_fd(status_fd) {
        Ok(fd) => fd,
        Err(_) => sys::exit_immediately(1),
    };
    match confine_and_exec(req, &status, filters) {
        Ok(never) => match never {},
        Err(e) => {
            let report = Report::Failed {
                stage: "program".into(),
                error: e.to_string(),
            };
            let _ = proto::send_msg(&status, &report);
            sys::exit_immediately(127)
        }
    }
}

fn confine_and_exec(
    req: &InitRequest,
    status: &OwnedFd,
    filters: Option<&Filters>,
) -> Result<Infallible, InitError> {
    let policy = &req.policy;
    let n = req.extra_fds as RawFd;
    for i in 0..n {
        sys::move_fd(FIRST_EXTRA_FD + i, 3 + i).map_err(|source| InitError::Sys {
            call: "dup2",
            source,
        })?;
    }
    close_from_except(3 + n, status.as_raw_fd())?;

    let landlock = confine(policy)?;
    proto::send_msg(status, &Report::Ready { landlock }).map_err(|source| InitError::Sys {
        call: "send",
        source,
    })?;

    let (program, args, env) = exec_strings(req)?;

    // Last, so that nothing above runs under the filter; execve itself is allowed.
    if let Some(filters) = filters {
        filters.install()?;
    }
    let err = unistd::execve(&program, &args, &env).unwrap_err();
    Err(InitError::Exec {
        program: req.program.clone(),
        source: err.into(),
    })
}
