//! The steps of a jail that every init takes, whichever builds it: a cold sandbox's (`init`)
//! and a zygote's template and child (`zygote::template`, `zygote::child`). The root assembled
//! and pivoted into ([`build_root`]: its read-only skeleton, [`build_skeleton`], which a
//! zygote's template builds once for all its jails, then each one's own part, [`enter_root`]), the program's process confined ([`confine`]: a new
//! session, the OOM killer's first choice, rlimits, `no_new_privs`, no capabilities, Landlock;
//! seccomp comes after, last, from the caller), its descriptors kept ([`close_from_except`]),
//! its exec's strings ([`exec_strings`]), and the error type they share. The order the steps
//! come in is each init's own, and reads top to bottom there.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::prctl;
use nix::sys::resource::{setrlimit, Resource};
use nix::unistd;

use crate::policy::{Policy, RootEntry};
use crate::proto::{self, InitRequest, LandlockReport, LandlockState, Report};
use crate::seccomp::SeccompError;
use crate::sys;

/// The first descriptor passed through to the program; it finds them from 3 on.
pub(crate) const FIRST_EXTRA_FD: RawFd = 4;
/// Processes of the sandbox's own (outer and init) in its pids cgroup.
pub(crate) const INIT_PROCESSES: u32 = 2;

/// Directory of the host that the new root is assembled on. The mount happens in the new
/// mount namespace only; the host's own directory is untouched.
const NEW_ROOT: &str = "/tmp";
/// A directory of the old root (every host has one, as every root airlock builds) where the
/// scratch file system's own mount waits to leave with the old root (see [`enter_root`]).
const PARKED_SCRATCH: &str = "/proc";
const DEV_NODES: [(&str, bool); 5] = [
    ("null", true),
    ("zero", true),
    ("full", true),
    ("random", false),
    ("urandom", false),
];
/// The Landlock ABI whose rights airlock asks for; older kernels give `partially_enforced`.
const LANDLOCK_ABI: ABI = ABI::V6;

/// Why a step of a jail failed: the call (and the path) it failed at, with the errno.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InitError {
    #[error("reading the request: {0}")]
    Request(io::Error),
    #[error("the host process is gone")]
    ParentGone,
    #[error("{call}: {source}")]
    Sys {
        call: &'static str,
        source: io::Error,
    },
    #[error("{call} {path:?}: {source}")]
    Path {
        call: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{resource} rlimit: {source}")]
    Rlimit {
        resource: &'static str,
        source: io::Error,
    },
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("landlock is required but the kernel did not enforce it")]
    LandlockNotEnforced,
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    #[error("execve {program:?}: {source}")]
    Exec { program: PathBuf, source: io::Error },
    #[error("volumes: {0}")]
    Volumes(String),
}

pub(crate) fn sys_err(call: &'static str) -> impl FnOnce(Errno) -> InitError {
    move |e| InitError::Sys {
        call,
        source: e.into(),
    }
}

pub(crate) fn path_err<'a>(
    call: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> InitError + 'a {
    move |source| InitError::Path {
        call,
        path: path.to_owned(),
        source,
    }
}

pub(crate) fn path_errno<'a>(
    call: &'static str,
    path: &'a Path,
) -> impl FnOnce(Errno) -> InitError + 'a {
    move |e| InitError::Path {
        call,
        path: path.to_owned(),
        source: e.into(),
    }
}

/// Reports why a step failed on the status socket, and exits.
pub(crate) fn fail(status: impl AsFd, stage: &str, err: &InitError) -> ! {
    let report = Report::Failed {
        stage: stage.to_owned(),
        error: err.to_string(),
    };
    let _ = proto::send_msg(status, &report);
    sys::exit_immediately(1)
}

/// Reaps every process that ends (orphans are re-parented to us) until `main` does.
pub(crate) fn reap_until(main: i32) -> Report {
    loop {
        let (pid, how, cpu) = match sys::wait_child(-1) {
            Ok(waited) => waited,
            Err(e) => {
                return Report::Failed {
                    stage: "init".into(),
                    error: format!("wait: {e}"),
                }
            }
        };
        if pid != main {
            continue;
        }
        return Report::exited(how, cpu);
    }
}

/// Assembles the new root at [`NEW_ROOT`] and pivots into it (the old root detached): its
/// shared, read-only part ([`build_skeleton`]), then what is each sandbox's own
/// ([`enter_root`]).
/// `sources` holds the root entries' sources, then the volumes' idmapped trees (see
/// `init::open_volumes`).
pub(crate) fn build_root(policy: &Policy, sources: &[Option<OwnedFd>]) -> Result<(), InitError> {
    make_mounts_private()?;
    let root = Path::new(NEW_ROOT);
    let (entries, volumes) = sources.split_at(policy.root.len().min(sources.len()));
    build_skeleton(root, policy, entries)?;
    enter_root(root, policy, volumes)
}

/// Enters a root whose read-only part a zygote's template built once for every jail of
/// `policy` ([`build_skeleton`] at [`NEW_ROOT`], in the mount namespace this one is a copy
/// of): a recursive bind of that copy onto itself (the copy is locked to this user namespace,
/// read-only; the bind on top is what this jail pivots into), then [`enter_root`].
pub(crate) fn enter_skeleton(policy: &Policy) -> Result<(), InitError> {
    make_mounts_private()?;
    let root = Path::new(NEW_ROOT);
    mount(
        Some(root),
        root,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(path_errno("bind mount", root))?;
    enter_root(root, policy, &[])
}

/// In a zygote's template, in the mount namespace of its own that each jail's is a copy of:
/// the skeleton that jails of `policy` enter ([`enter_skeleton`]), built by path at
/// [`NEW_ROOT`]. If it cannot be built, what was is detached.
pub(crate) fn build_jails_skeleton(policy: &Policy) -> Result<(), InitError> {
    let root = Path::new(NEW_ROOT);
    let sources: Vec<Option<OwnedFd>> = policy.root.iter().map(|_| None).collect();
    let built = build_skeleton(root, policy, &sources);
    if built.is_err() {
        let _ = umount2(root, MntFlags::MNT_DETACH);
    }
    built
}

/// What a skeleton built from one policy may serve: a jail of a policy with the same root,
/// the same scratch mount points and the same working directory.
#[derive(Debug)]
pub(crate) struct SkeletonKey {
    root: Vec<RootEntry>,
    mounts: Vec<PathBuf>,
    workdir: PathBuf,
}

impl SkeletonKey {
    pub(crate) fn of(policy: &Policy) -> SkeletonKey {
        SkeletonKey {
            root: policy.root.clone(),
            mounts: policy.scratch.mounts.clone(),
            workdir: policy.workdir.clone(),
        }
    }

    /// Whether a jail of `policy` fits the skeleton built from this key's policy (compared in
    /// place: asked once a jail, nothing is copied).
    pub(crate) fn fits(&self, policy: &Policy) -> bool {
        self.root == policy.root
            && self.mounts == policy.scratch.mounts
            && self.workdir == policy.workdir
    }
}

/// Nothing we mount may propagate back to the host (or to the template).
pub(crate) fn make_mounts_private() -> Result<(), InitError> {
    let none = None::<&str>;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(sys_err("mount(/, MS_REC|MS_PRIVATE)"))
}

/// The part of a root that holds nothing of one sandbox's, made read-only at `root`: a small
/// tmpfs with bind mounts of the policy's entries (from `sources`, when the host opened them,
/// else by path), a minimal `/dev`, and the empty directories that [`enter_root`] mounts a
/// fresh `/proc` and the scratch file system on.
pub(crate) fn build_skeleton(
    root: &Path,
    policy: &Policy,
    sources: &[Option<OwnedFd>],
) -> Result<(), InitError> {
    let none = None::<&str>;
    mount_tmpfs(root, "size=4m,nr_inodes=4096,mode=0755", MsFlags::empty())?;

    for (entry, fd) in policy.root.iter().zip(sources) {
        let target = inside(root, entry.path());
        match entry {
            RootEntry::ReadOnly { source, .. } | RootEntry::Writable { source, .. } => {
                if let Some(fd) = fd {
                    let via = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                    let meta = fs::metadata(&via).map_err(path_err("stat", source))?;
                    make_mount_point(&target, meta.is_dir())?;
                    sys::move_mount_to(fd, &target).map_err(path_err("bind mount", source))?;
                } else {
                    let meta = fs::metadata(source).map_err(path_err("stat", source))?;
                    make_mount_point(&target, meta.is_dir())?;
                    mount(
                        Some(source.as_path()),
                        &target,
                        none,
                        MsFlags::MS_BIND | MsFlags::MS_REC,
                        none,
                    )
                    .map_err(path_errno("bind mount", source))?;
                }
                let mut attrs = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
                if matches!(entry, RootEntry::ReadOnly { .. }) {
                    attrs |= libc::MOUNT_ATTR_RDONLY;
                }
                sys::mount_setattr(&target, true, attrs)
                    .map_err(path_err("mount_setattr", &target))?;
            }
            RootEntry::Symlink { target: link, .. } => {
                make_parent(&target)?;
                symlink(link, &target).map_err(path_err("symlink", &target))?;
            }
            RootEntry::File { contents, .. } => {
                make_parent(&target)?;
                fs::write(&target, contents).map_err(path_err("write", &target))?;
                fs::set_permissions(&target, fs::Permissions::from_mode(0o444))
                    .map_err(path_err("chmod", &target))?;
            }
        }
    }
    make_mount_point(&root.join("proc"), true)?;

    // A minimal /dev: a few harmless character devices bound from the host, and links.
    let dev = root.join("dev");
    make_mount_point(&dev, true)?;
    mount_tmpfs(&dev, "size=64k,nr_inodes=64,mode=0755", MsFlags::MS_NOEXEC)?;
    for (name, _) in DEV_NODES {
        let node = dev.join(name);
        let host = Path::new("/dev").join(name);
        make_mount_point(&node, false)?;
        mount(Some(host.as_path()), &node, none, MsFlags::MS_BIND, none)
            .map_err(path_errno("bind mount", &host))?;
        sys::mount_setattr(
            &node,
            false,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
        )
        .map_err(path_err("mount_setattr", &node))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = dev.join(link);
        symlink(target, &path).map_err(path_err("symlink", &path))?;
    }
    for mount_point in &policy.scratch.mounts {
        make_mount_point(&inside(root, mount_point), true)?;
    }
    // A working directory on no scratch mount is the skeleton's (one below one is made on it).
    if !policy
        .scratch
        .mounts
        .iter()
        .any(|m| policy.workdir.starts_with(m))
    {
        let workdir = inside(root, &policy.workdir);
        make_dirs(&workdir)?;
    }

    let ro = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    for path in [dev.as_path(), root] {
        sys::mount_setattr(path, false, ro).map_err(path_err("mount_setattr", path))?;
    }
    Ok(())
}

/// What is one sandbox's own in a root whose skeleton is at `root`, then the pivot into it: a
/// fresh `/proc` for our PID namespace, with only the per-process entries (no /proc/sys,
/// /proc/kcore, /proc/sysrq-trigger, ...); one new tmpfs for every writable directory, so
/// that one size and inode budget covers them all; then `pivot_root(2)` with the old root
/// detached, so not even a path to the host remains.
pub(crate) fn enter_root(
    root: &Path,
    policy: &Policy,
    volumes: &[Option<OwnedFd>],
) -> Result<(), InitError> {
    // Only a cold sandbox's init, root on the host until its user namespace exists, makes
    // the idmapped trees a volume needs: a jail without them never starts.
    if volumes.len() != policy.volumes.len() || volumes.iter().any(Option::is_none) {
        return Err(InitError::Volumes(
            "no idmapped mount was made for the volumes (only a cold sandbox of a host \
             running as root mounts volumes)"
                .into(),
        ));
    }
    let proc = root.join("proc");
    let proc_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("proc"),
        &proc,
        Some("proc"),
        proc_flags,
        Some("subset=pid"),
    )
    .map_err(path_errno("mount proc", &proc))?;

    // Detached (`fsmount`), so that it needs no directory of its own in the read-only root.
    let scratch = (|| {
        let fs = sys::fsopen("tmpfs")?;
        sys::fsconfig(&fs, "size", Some(&policy.scratch.size_bytes.to_string()))?;
        sys::fsconfig(&fs, "nr_inodes", Some(&policy.scratch.inodes.to_string()))?;
        sys::fsconfig(&fs, "mode", Some("0755"))?;
        sys::fsmount_detached(
            &fs,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOEXEC,
        )
    })()
    .map_err(|source| InitError::Sys {
        call: "mount tmpfs (scratch)",
        source,
    })?;
    for (i, mount_point) in policy.scratch.mounts.iter().enumerate() {
        let dir = i.to_string();
        nix::sys::stat::mkdirat(
            &scratch,
            dir.as_str(),
            nix::sys::stat::Mode::from_bits_truncate(0o755),
        )
        .map_err(sys_err("mkdirat (scratch)"))?;
        let target = inside(root, mount_point);
        sys::open_tree_clone_at(scratch.as_fd(), &dir)
            .and_then(|tree| sys::move_mount_to(&tree, &target))
            .map_err(path_err("bind mount", &target))?;
    }
    // On the scratch file system, which holds their mount points.
    for (volume, tree) in policy.volumes.iter().zip(volumes.iter().flatten()) {
        let target = inside(root, &volume.target);
        make_dirs(&target)?;
        sys::move_mount_to(tree, &target).map_err(path_err("mount a volume", &target))?;
    }
    // Its own mount, parked on the old root's /proc, leaves with the old root in the one
    // unmount below: closed detached, it would be unmounted apart, and each unmount waits
    // for an expedited RCU grace period.
    sys::move_mount_to(&scratch, Path::new(PARKED_SCRATCH)).map_err(path_err(
        "park the scratch mount",
        Path::new(PARKED_SCRATCH),
    ))?;
    drop(scratch);
    make_dirs(&inside(root, &policy.workdir))?;

    unistd::chdir(root).map_err(path_errno("chdir", root))?;
    unistd::pivot_root(".", ".").map_err(sys_err("pivot_root"))?;
    // The old root is stacked on the new one now; detaching it leaves the new one.
    umount2(".", MntFlags::MNT_DETACH).map_err(sys_err("umount (old root)"))?;
    unistd::chdir("/").map_err(sys_err("chdir /"))?;
    Ok(())
}

fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn mount_tmpfs(target: &Path, options: &str, extra: MsFlags) -> Result<(), InitError> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | extra;
    mount(Some("tmpfs"), target, Some("tmpfs"), flags, Some(options))
        .map_err(path_errno("mount tmpfs", target))
}

fn make_parent(path: &Path) -> Result<(), InitError> {
    match path.parent() {
        Some(parent) => make_dirs(parent),
        None => Ok(()),
    }
}

fn make_dirs(path: &Path) -> Result<(), InitError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(path_err("mkdir", path))
}

fn make_mount_point(path: &Path, dir: bool) -> Result<(), InitError> {
    make_parent(path)?;
    let made = if dir {
        fs::DirBuilder::new().mode(0o755).create(path)
    } else {
        fs::File::create(path).map(drop)
    };
    match made {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(path_err("create", path)(e)),
        _ => Ok(()),
    }
}

/// Closes every descriptor from `first` on but `keep` (the status socket, above the
/// program's own).
pub(crate) fn close_from_except(first: RawFd, keep: RawFd) -> Result<(), InitError> {
    let close = |first, last| {
        sys::close_range(first, last).map_err(|source| InitError::Sys {
            call: "close_range",
            source,
        })
    };
    close(first, keep - 1)?;
    close(keep + 1, RawFd::MAX)
}

/// The program, its arguments and its environment as `execve` takes them.
pub(crate) fn exec_strings(
    req: &InitRequest,
) -> Result<(CString, Vec<CString>, Vec<CString>), InitError> {
    let to_c = |s: &str| {
        CString::new(s).map_err(|e| InitError::Exec {
            program: req.program.clone(),
            source: io::Error::other(e),
        })
    };
    let program = to_c(&req.program.to_string_lossy())?;
    let args = req.args.iter().map(|a| to_c(a)).collect::<Result<_, _>>()?;
    let env = req
        .env
        .iter()
        .map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect::<Result<_, _>>()?;
    Ok((program, args, env))
}

/// Confines the calling process, the program's, for what it runs next: a new session, the
/// OOM killer's first choice, rlimits, `no_new_privs`, no capabilities, Landlock. Seccomp
/// comes after, last. The same steps for a cold sandbox's program and a zygote's child.
pub(crate) fn confine(policy: &Policy) -> Result<LandlockReport, InitError> {
    // No controlling terminal: nothing to push input into (TIOCSTI) or to hang up.
    unistd::setsid().map_err(sys_err("setsid"))?;
    // At the memory limit the OOM killer takes the program (and what it starts) first,
    // however large the sandbox's own processes are: they must live to report the verdict
    // and reap. Raising one's own score needs no privilege, but a process that changed its
    // uid is not dumpable and its /proc files are not its own: dumpable only for the write.
    prctl::set_dumpable(true).map_err(sys_err("prctl(PR_SET_DUMPABLE)"))?;
    let raised = std::fs::write("/proc/self/oom_score_adj", "1000");
    prctl::set_dumpable(false).map_err(sys_err("prctl(PR_SET_DUMPABLE)"))?;
    raised.map_err(|source| InitError::Sys {
        call: "write /proc/self/oom_score_adj",
        source,
    })?;
    apply_rlimits(policy)?;
    prctl::set_no_new_privs().map_err(sys_err("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    sys::drop_all_capabilities().map_err(|source| InitError::Sys {
        call: "drop capabilities",
        source,
    })?;

    let landlock = if policy.landlock.is_required() {
        apply_landlock(policy)?
    } else {
        LandlockReport {
            state: LandlockState::Disabled,
            abi: sys::landlock_abi().ok(),
        }
    };
    Ok(landlock)
}

fn apply_rlimits(policy: &Policy) -> Result<(), InitError> {
    let l = &policy.limits;
    // SIGXCPU at the limit, SIGKILL a second later if the program handles SIGXCPU.
    let cpu = l.cpu_time.as_secs() + u64::from(l.cpu_time.subsec_nanos() > 0);
    let mut limits = vec![
        (Resource::RLIMIT_CPU, "cpu", cpu, cpu + 1),
        (
            Resource::RLIMIT_NOFILE,
            "nofile",
            l.open_files,
            l.open_files,
        ),
        (
            Resource::RLIMIT_FSIZE,
            "fsize",
            l.file_size_bytes,
            l.file_size_bytes,
        ),
        // 1, not 0: a core_pattern that pipes to a helper ignores 0 and would start that
        // helper as root on the host; 1 makes the kernel refuse the dump.
        (Resource::RLIMIT_CORE, "core", 1, 1),
    ];
    if !policy.cgroups.is_required() {
        // Backstops only: without cgroups nothing covers the sandbox as a whole.
        limits.push((Resource::RLIMIT_AS, "as", l.memory_bytes, l.memory_bytes));
        // Counted per uid in the user namespace, so the two init processes count too.
        let procs = u64::from(l.pids) + u64::from(INIT_PROCESSES);
        limits.push((Resource::RLIMIT_NPROC, "nproc", procs, procs));
    }
    for (resource, name, soft, hard) in limits {
        setrlimit(resource, soft, hard).map_err(|e| InitError::Rlimit {
            resource: name,
            source: e.into(),
        })?;
    }
    Ok(())
}

/// Landlock as a second wall inside the mount namespace: reading everywhere the root shows,
/// executing only from the read-only host paths, writing only to scratch and a few devices,
/// no TCP bind, no TCP connect but to the egress port when there is one, no abstract unix sockets or signals outside the sandbox.
fn apply_landlock(policy: &Policy) -> Result<LandlockReport, InitError> {
    let abi = LANDLOCK_ABI;
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let read_exec = AccessFs::from_read(abi);
    let mut write_no_exec = AccessFs::from_all(abi);
    write_no_exec.remove(AccessFs::Execute);
    let file_rights = AccessFs::ReadFile
        | AccessFs::WriteFile
        | AccessFs::Execute
        | AccessFs::Truncate
        | AccessFs::IoctlDev;

    let mut rules: Vec<(PathBuf, landlock::BitFlags<AccessFs>)> = vec![(PathBuf::from("/"), read)];
    for entry in &policy.root {
        match entry {
            RootEntry::ReadOnly { target, .. } => rules.push((target.clone(), read_exec)),
            RootEntry::Writable { target, .. } => {
                rules.push((target.clone(), AccessFs::from_all(abi)));
            }
            RootEntry::Symlink { .. } | RootEntry::File { .. } => {}
        }
    }
    for mount_point in &policy.scratch.mounts {
        rules.push((mount_point.clone(), write_no_exec));
    }
    for (name, writable) in DEV_NODES {
        let access = if writable {
            AccessFs::ReadFile | AccessFs::WriteFile
        } else {
            AccessFs::ReadFile.into()
        };
        rules.push((Path::new("/dev").join(name), access));
    }

    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?;
    if let Some(port) = policy.egress_port {
        // The proxy's port on loopback is the only TCP destination there is.
        ruleset = ruleset.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    for (path, mut access) in rules {
        let fd = PathFd::new(&path).map_err(|e| InitError::Path {
            call: "open",
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        // Of the descriptor, not the path again: one lookup a rule.
        let stat = nix::sys::stat::fstat(fd.as_fd()).map_err(path_errno("stat", &path))?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFDIR {
            access &= file_rights;
        }
        ruleset = ruleset.add_rule(PathBeneath::new(fd, access))?;
    }
    let status = ruleset.restrict_self()?;
    let state = match status.ruleset {
        RulesetStatus::FullyEnforced => LandlockState::FullyEnforced,
        RulesetStatus::PartiallyEnforced => LandlockState::PartiallyEnforced,
        RulesetStatus::NotEnforced => return Err(InitError::LandlockNotEnforced),
    };
    Ok(LandlockReport {
        state,
        abi: sys::landlock_abi().ok(),
    })
}

/// Moves this process into a cgroup: `0` written to each of its files (v1 `tasks`, or v2
/// `cgroup.procs`), opened by whoever could.
pub(crate) fn join_cgroup(files: &[OwnedFd]) -> Result<(), InitError> {
    for file in files {
        unistd::write(file, b"0").map_err(sys_err("joining the sandbox cgroup"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(args: &[&str], env: &[(&str, &str)]) -> InitRequest {
        InitRequest {
            policy: Policy::default(),
            program: "/usr/bin/python3".into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            extra_fds: 0,
            passed_sources: Vec::new(),
            passed_joins: 0,
            parent_pid: 1,
            join_cgroup: Vec::new(),
            zygote: false,
        }
    }

    #[test]
    fn the_exec_strings_are_the_program_its_arguments_and_key_value_entries() {
        let (program, args, env) =
            exec_strings(&request(&["python3", "-c", ""], &[("X", "a=b")])).unwrap();
        assert_eq!(program.as_bytes(), b"/usr/bin/python3");
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        assert_eq!(args, [&b"python3"[..], b"-c", b""]);
        assert_eq!(env.len(), 1);
        assert_eq!(env[0].as_bytes(), b"X=a=b");
    }

    #[test]
    fn a_nul_in_an_argument_or_the_environment_is_refused() {
        for bad in [
            request(&["python3", "a\0b"], &[]),
            request(&["python3"], &[("K", "a\0B=evil")]),
        ] {
            assert!(matches!(exec_strings(&bad), Err(InitError::Exec { .. })));
        }
    }
}
