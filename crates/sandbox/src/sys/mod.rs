//! Every raw syscall and every `unsafe` block of airlock lives here, each with a `SAFETY:` line.
//! The rest of the crate (and every other crate) is `unsafe`-free.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

pub use nix::unistd::ForkResult;

mod abi;
mod wipe;

pub use wipe::{map_large_blocks, wipe_freed_memory};

/// `fork(2)`.
///
/// Only called by single-threaded processes, so that no lock can be held across the fork: the
/// sandbox's init processes (exec'd fresh for each sandbox, they never start a thread), and
/// a host forking an init ahead of its sandbox (`Prestarted::start`, which checks first).
pub fn fork() -> nix::Result<ForkResult> {
    // SAFETY: the caller is single-threaded (see above), so the child may run arbitrary code.
    unsafe { nix::unistd::fork() }
}

/// `_exit(2)`: leave without running atexit handlers or flushing stdio owned by the parent.
pub fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit takes no pointers and never returns.
    unsafe { libc::_exit(code) }
}

/// Takes ownership of a descriptor inherited by protocol (the parent placed it at `fd`).
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only inspects the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open (checked above) and, by protocol, owned by nobody else
    // in this process.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes ownership of a descriptor the kernel just installed for us (SCM_RIGHTS).
pub fn own_received_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: recvmsg installed this descriptor in our table moments ago and handed it only to
    // the caller.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `close_range(first, last, 0)`.
pub fn close_range(first: RawFd, last: RawFd) -> io::Result<()> {
    if first > last {
        return Ok(());
    }
    // SAFETY: close_range takes plain integers; closing descriptors owned by Rust objects would
    // be a logic error, and callers only close ranges they know hold nothing of theirs.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first as u32, last as u32, 0u32) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `dup2(src, dst)`; the copy at `dst` is inherited across exec.
pub fn move_fd(src: RawFd, dst: RawFd) -> io::Result<()> {
    if src == dst {
        return set_cloexec(src, false);
    }
    // SAFETY: dup2 takes plain integers and replaces `dst`, which the caller reserved.
    if unsafe { libc::dup2(src, dst) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`.
pub fn dup_cloexec_at_least(fd: RawFd, min: RawFd) -> io::Result<RawFd> {
    // SAFETY: fcntl F_DUPFD_CLOEXEC takes plain integers.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
    if new < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(new)
    }
}

/// Duplicates of `fds`, each at `floor` or above (close-on-exec): lifted above every
/// destination before descriptors are moved into place, so that no move replaces a source.
pub fn lift_fds<'a>(
    fds: impl IntoIterator<Item = BorrowedFd<'a>>,
    floor: RawFd,
) -> io::Result<Vec<OwnedFd>> {
    fds.into_iter()
        .map(|fd| take_inherited_fd(dup_cloexec_at_least(fd.as_raw_fd(), floor)?))
        .collect()
}

/// Puts duplicates of `fds` at `base`, `base + 1`, ... (without close-on-exec), whatever
/// numbers they have now. An original that sits on one of those numbers is replaced there:
/// its owner must not close it afterwards (close or forget it before, or never).
pub fn place_fds<'a>(fds: impl IntoIterator<Item = BorrowedFd<'a>>, base: RawFd) -> io::Result<()> {
    let fds: Vec<BorrowedFd<'a>> = fds.into_iter().collect();
    let lifted = lift_fds(fds.iter().copied(), base + fds.len() as RawFd)?;
    for (i, fd) in lifted.iter().enumerate() {
        move_fd(fd.as_raw_fd(), base + i as RawFd)?;
    }
    Ok(())
}

/// Sets or clears `FD_CLOEXEC`.
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    let flag = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: fcntl F_SETFD takes plain integers.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flag) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Arranges for the child of `cmd` to find each `(src, dst)` descriptor at `dst`.
/// Sources must not collide with destinations (callers pass fds above every destination).
pub fn place_fds_in_child(cmd: &mut std::process::Command, moves: Vec<(RawFd, RawFd)>) {
    let hook = move || {
        for &(src, dst) in &moves {
            // SAFETY: dup2 is async-signal-safe and the closure allocates nothing.
            if unsafe { libc::dup2(src, dst) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook runs between fork and exec and only calls dup2 (async-signal-safe).
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// `mount_setattr(2)` on `path`, setting `attr_set` (MOUNT_ATTR_*), optionally recursively.
pub fn mount_setattr(path: &Path, recursive: bool, attr_set: u64) -> io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let attr = libc::mount_attr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 } | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: c_path is a valid NUL-terminated string and attr a valid mount_attr whose size we
    // pass; the kernel reads both only during the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            flags as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `mount_setattr(2)` on a detached tree (from [`open_tree_clone`]), recursively: sets
/// `attr_set` and, with `idmap`, the user namespace whose mapping the tree's ids go through
/// (`MOUNT_ATTR_IDMAP`; the caller needs `CAP_SYS_ADMIN` where the file system was mounted).
pub fn mount_setattr_tree(
    tree: &OwnedFd,
    attr_set: u64,
    idmap: Option<BorrowedFd>,
) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set: attr_set
            | if idmap.is_some() {
                libc::MOUNT_ATTR_IDMAP
            } else {
                0
            },
        attr_clr: 0,
        propagation: 0,
        userns_fd: idmap.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    let flags = libc::AT_EMPTY_PATH | libc::AT_RECURSIVE;
    // SAFETY: a valid descriptor, an empty NUL-terminated path, and a valid mount_attr whose
    // size we pass; the kernel reads them only during the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The Landlock ABI version of the running kernel, or why there is none.
pub fn landlock_abi() -> Result<u32, io::Error> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute pointer and size 0 the call only returns the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v as u32)
    }
}

/// `prctl(PR_GET_SECCOMP)`: 0 when the caller runs without a filter.
pub fn seccomp_mode() -> io::Result<i32> {
    // SAFETY: PR_GET_SECCOMP takes no pointer arguments.
    let rc = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<()> {
    // SAFETY: every option used here takes integer arguments only.
    if unsafe { libc::prctl(option, arg2, 0, 0, 0) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Drops every capability for good: ambient and bounding sets emptied, securebits locked so
/// that neither uid 0 nor exec can bring capabilities back, then all three sets cleared.
pub fn drop_all_capabilities() -> io::Result<()> {
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    )?;
    let mut cap = 0;
    loop {
        match prctl(libc::PR_CAPBSET_DROP, cap) {
            Ok(()) => cap += 1,
            // EINVAL: past the last capability this kernel knows.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && cap > 0 => break,
            Err(e) => return Err(e),
        }
    }
    const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
    const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
    const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
    const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;
    prctl(
        libc::PR_SET_SECUREBITS,
        SECBIT_NOROOT
            | SECBIT_NOROOT_LOCKED
            | SECBIT_NO_SETUID_FIXUP
            | SECBIT_NO_SETUID_FIXUP_LOCKED
            | SECBIT_KEEP_CAPS_LOCKED
            | SECBIT_NO_CAP_AMBIENT_RAISE
            | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
    )?;
    clear_capability_sets()
}

/// `capset(2)` with empty effective, permitted and inheritable sets.
pub fn clear_capability_sets() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and data are valid, correctly laid out (version 3 takes two Data structs)
    // and only read by the kernel during the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// How a child ended, decoded from a raw wait status (nix cannot represent real-time signals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    Exited(i32),
    Signaled(i32),
}

/// `wait4(pid, &status, 0, &rusage)` (pid -1: any child), retried on `EINTR`; stops and
/// continues are not reported because `WUNTRACED` is not asked for. Also returns the CPU time
/// (user + system) the kernel counted for the child and the children it reaped.
pub fn wait_child(pid: i32) -> io::Result<(i32, Waited, std::time::Duration)> {
    wait4(pid, 0)?.ok_or_else(|| io::Error::from(io::ErrorKind::WouldBlock))
}

/// As [`wait_child`] for one child, without blocking: [`None`] while it runs.
pub fn wait_child_nohang(pid: i32) -> io::Result<Option<(Waited, std::time::Duration)>> {
    Ok(wait4(pid, libc::WNOHANG)?.map(|(_, how, cpu)| (how, cpu)))
}

fn wait4(pid: i32, flags: libc::c_int) -> io::Result<Option<(i32, Waited, std::time::Duration)>> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: rusage is plain old data; zeroes are a valid value.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: status and usage are valid, writable and live for the duration of the call.
        let got = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        if got == 0 {
            return Ok(None);
        }
        if got < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        let tv = |t: libc::timeval| {
            std::time::Duration::from_secs(t.tv_sec as u64)
                + std::time::Duration::from_micros(t.tv_usec as u64)
        };
        let cpu = tv(usage.ru_utime) + tv(usage.ru_stime);
        if libc::WIFEXITED(status) {
            return Ok(Some((got, Waited::Exited(libc::WEXITSTATUS(status)), cpu)));
        }
        if libc::WIFSIGNALED(status) {
            return Ok(Some((got, Waited::Signaled(libc::WTERMSIG(status)), cpu)));
        }
    }
}

/// `pidfd_open(pid, 0)`: a descriptor that names this process, immune to pid reuse.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes plain integers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`.
pub fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor, a signal number and a NULL siginfo pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Brings the network namespace's loopback interface up (`SIOCSIFFLAGS` on `lo`), which also
/// gives it 127.0.0.1 and ::1. Needs `CAP_NET_ADMIN` over the namespace.
pub fn loopback_up() -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: socket(2) takes plain integers.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: a valid socket and a pointer to an ifreq that lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS filled in the flags member of the union.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above; the kernel reads the name and the flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const OPEN_TREE_CLONE: u32 = 1;
const OPEN_TREE_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;

/// `open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | AT_RECURSIVE)`: a detached copy of the mount
/// tree at `path`, opened with the caller's rights, to attach later in another namespace.
pub fn open_tree_clone(path: &Path) -> io::Result<OwnedFd> {
    open_tree_clone_from(libc::AT_FDCWD, path.as_os_str().as_bytes())
}

/// The same, of the directory `name` under `dir` (a detached mount's, as `fsmount` gives).
pub fn open_tree_clone_at(dir: BorrowedFd, name: &str) -> io::Result<OwnedFd> {
    open_tree_clone_from(dir.as_raw_fd(), name.as_bytes())
}

fn open_tree_clone_from(dir: RawFd, path: &[u8]) -> io::Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as u32;
    // SAFETY: a descriptor or AT_FDCWD, a NUL-terminated path that lives across the call, and
    // plain integers.
    owned_fd(unsafe { libc::syscall(libc::SYS_open_tree, dir, c.as_ptr(), flags) })
}

/// `move_mount(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attaches a detached
/// tree from [`open_tree_clone`] at `target`.
pub fn move_mount_to(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let c = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let empty = c"";
    // SAFETY: a valid descriptor, NUL-terminated paths that live across the call, flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Takes ownership of a descriptor a syscall just returned (or its error).
fn owned_fd(rc: libc::c_long) -> io::Result<OwnedFd> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// `fsopen(fstype, FSOPEN_CLOEXEC)`: a new file system context, to configure with
/// [`fsconfig`] and mount with [`fsmount_detached`].
pub fn fsopen(fstype: &str) -> io::Result<OwnedFd> {
    let c = CString::new(fstype).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated string that lives across the call, and a flag.
    owned_fd(unsafe { libc::syscall(libc::SYS_fsopen, c.as_ptr(), libc::FSOPEN_CLOEXEC) })
}

/// `fsconfig(fs, FSCONFIG_SET_STRING, key, value)`, or `FSCONFIG_SET_FLAG` without a value.
pub fn fsconfig(fs: &OwnedFd, key: &str, value: Option<&str>) -> io::Result<()> {
    let invalid = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let key = CString::new(key).map_err(invalid)?;
    let value = value.map(CString::new).transpose().map_err(invalid)?;
    let (cmd, value_ptr) = match &value {
        Some(v) => (libc::FSCONFIG_SET_STRING, v.as_ptr()),
        None => (libc::FSCONFIG_SET_FLAG, std::ptr::null()),
    };
    // SAFETY: a valid descriptor, NUL-terminated strings (or null for a flag) that live across
    // the call, and plain integers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            cmd,
            key.as_ptr(),
            value_ptr,
            0,
        )
    };
    if rc < 0 {
        Err(with_fs_log(fs, io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

/// `fsconfig(fs, FSCONFIG_CMD_CREATE)`, then `fsmount(fs, FSMOUNT_CLOEXEC, attrs)`: the file
/// system as a detached mount, in no mount namespace's table, gone with its last descriptor.
pub fn fsmount_detached(fs: &OwnedFd, attrs: u64) -> io::Result<OwnedFd> {
    // SAFETY: a valid descriptor and plain integers; null key and value, as the command wants.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    };
    if rc < 0 {
        return Err(with_fs_log(fs, io::Error::last_os_error()));
    }
    // SAFETY: a valid descriptor and plain integers.
    owned_fd(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            attrs,
        )
    })
    .map_err(|e| with_fs_log(fs, e))
}

/// `error` with the messages the file system left on its context (`fsopen(2)`: "e ..." lines).
fn with_fs_log(fs: &OwnedFd, error: io::Error) -> io::Error {
    let mut said = Vec::new();
    let mut buf = [0u8; 512];
    for _ in 0..8 {
        // SAFETY: a valid descriptor and a buffer of the length we pass, owned by us.
        let n = unsafe { libc::read(fs.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        said.push(
            String::from_utf8_lossy(&buf[..n as usize])
                .trim()
                .to_owned(),
        );
    }
    if said.is_empty() {
        error
    } else {
        io::Error::new(error.kind(), format!("{error} ({})", said.join("; ")))
    }
}

/// `ioctl(LOOP_CTL_GET_FREE)` on `/dev/loop-control`: the number of a free loop device (made
/// if there was none).
pub fn loop_get_free(control: &std::fs::File) -> io::Result<u32> {
    const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
    // SAFETY: an ioctl that takes no argument on a descriptor we own.
    let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as u32)
    }
}

/// `struct loop_info64` (`linux/loop.h`).
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` (`linux/loop.h`, Linux 5.8).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// `ioctl(LOOP_CONFIGURE)`: backs the loop device `device` with `backing`, detached by the
/// kernel once its last user is gone (`LO_FLAGS_AUTOCLEAR`). `EBUSY`: another process took the
/// device meanwhile.
pub fn loop_configure_autoclear(device: &std::fs::File, backing: &std::fs::File) -> io::Result<()> {
    const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
    const LO_FLAGS_AUTOCLEAR: u32 = 4;
    let config = LoopConfig {
        fd: backing.as_raw_fd() as u32,
        block_size: 0,
        info: LoopInfo64 {
            device: 0,
            inode: 0,
            rdevice: 0,
            offset: 0,
            sizelimit: 0,
            number: 0,
            encrypt_type: 0,
            encrypt_key_size: 0,
            flags: LO_FLAGS_AUTOCLEAR,
            file_name: [0; 64],
            crypt_name: [0; 64],
            encrypt_key: [0; 32],
            init: [0; 2],
        },
        reserved: [0; 8],
    };
    // SAFETY: a descriptor we own and a pointer to a `loop_config` laid out as the kernel's,
    // which it only reads during the call.
    let rc = unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_CONFIGURE,
            &config as *const LoopConfig,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `clone_args` of `clone3(2)`, up to `cgroup` (Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Place the child in the cgroup whose directory is `clone_args.cgroup` (Linux 5.7, v2 only).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3` without a new stack, so that it returns twice, like `fork`: 0 in the child.
///
/// # Safety
/// Every pointer in `args` is valid for the call, and no other thread of the caller can hold
/// a lock the child would need (the caller is single-threaded, or the child only makes raw
/// syscalls).
unsafe fn clone3(args: &CloneArgs) -> io::Result<i32> {
    // SAFETY: as the caller promises; with no stack the child continues on a copy of ours.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid as i32)
    }
}

/// `clone3` into the new namespaces in `namespaces` (`CLONE_NEW*`) and, on cgroup v2, into
/// the cgroup whose directory `cgroup` is (by the caller's rights), with a pidfd for the
/// child: `Some((pid, pidfd))` in the parent, [`None`] in the child.
///
/// Only called from a zygote's template init, which is single-threaded like every init.
pub fn fork_into_namespaces(
    namespaces: u64,
    cgroup: Option<BorrowedFd>,
) -> io::Result<Option<(i32, OwnedFd)>> {
    let mut pidfd: libc::c_int = -1;
    let into = if cgroup.is_some() {
        CLONE_INTO_CGROUP
    } else {
        0
    };
    let args = CloneArgs {
        flags: namespaces | libc::CLONE_PIDFD as u64 | into,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.map_or(0, |fd| fd.as_raw_fd() as u64),
        ..CloneArgs::default()
    };
    // SAFETY: args is a valid clone_args and pidfd outlives the call; the caller is
    // single-threaded, so no lock can be held by a thread the child does not have.
    match unsafe { clone3(&args) }? {
        0 => Ok(None),
        // SAFETY: the kernel stored a new descriptor for the child in pidfd; nothing else
        // owns it.
        p => Ok(Some((p, unsafe { OwnedFd::from_raw_fd(pidfd) }))),
    }
}

/// What glibc's own fork keeps right in its child that a raw `clone3` must redo: where the
/// thread's descriptor holds its kernel thread id (which the kernel writes in the child, as
/// glibc's fork has it do) and the robust futex list (which a new process starts without).
#[derive(Clone, Copy, Debug)]
pub struct ForkAsLibc {
    tid_address: u64,
    robust_head: u64,
    robust_len: usize,
    /// glibc's `__libc_single_threaded`: true until the process first starts a thread.
    single_threaded: u64,
}

impl ForkAsLibc {
    /// Read from the calling thread, which must be the one that forks; an error where the
    /// kernel does not tell (`PR_GET_TID_ADDRESS` needs `CONFIG_CHECKPOINT_RESTORE`).
    pub fn of_this_thread() -> io::Result<ForkAsLibc> {
        let mut tid_address: u64 = 0;
        // SAFETY: PR_GET_TID_ADDRESS stores one pointer-sized value at the address given,
        // which is a live u64 of ours.
        let rc = unsafe { libc::prctl(libc::PR_GET_TID_ADDRESS, &mut tid_address as *mut u64) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut robust_head: u64 = 0;
        let mut robust_len: usize = 0;
        // SAFETY: get_robust_list(0, ...) stores the calling thread's list head and its
        // length at the two addresses given, both live locals.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_get_robust_list,
                0,
                &mut robust_head as *mut u64,
                &mut robust_len as *mut usize,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        if tid_address == 0 {
            return Err(io::Error::other("this thread has no thread-id address"));
        }
        // SAFETY: dlsym only looks a NUL-terminated name up among loaded objects.
        let single_threaded =
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__libc_single_threaded".as_ptr()) };
        if single_threaded.is_null() {
            return Err(io::Error::other("__libc_single_threaded not found"));
        }
        Ok(ForkAsLibc {
            tid_address,
            robust_head,
            robust_len,
            single_threaded: single_threaded as u64,
        })
    }

    /// Whether the calling thread is the process's only one, so that no lock can be held by
    /// a thread a child would not have (and only the caller could start another): glibc's
    /// own record that the process never started a thread, else the kernel's count.
    pub fn alone(&self) -> bool {
        // SAFETY: the address is glibc's `char __libc_single_threaded`, which lives as long as
        // the process and which only glibc writes.
        let never = unsafe { std::ptr::read_volatile(self.single_threaded as *const u8) != 0 };
        never || threads_now().is_ok_and(|n| n == 1)
    }

    /// The thread id this thread's descriptor holds (glibc's cached one).
    #[cfg(test)]
    pub fn cached_tid(&self) -> i32 {
        // SAFETY: the address is the calling thread's own `clear_child_tid`, which glibc
        // points at a live i32 in the thread's descriptor for the thread's whole life.
        unsafe { std::ptr::read_volatile(self.tid_address as *const i32) }
    }
}

/// How many threads the process has (`num_threads` of /proc/self/stat).
fn threads_now() -> io::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    stat.rsplit_once(')')
        .and_then(|(_, fields)| fields.split_whitespace().nth(17))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other("no thread count in /proc/self/stat"))
}

/// Forks as glibc's `fork` does, but with `clone3`, so that the child is born in the cgroup
/// whose directory `cgroup` is (cgroup v2, by the caller's rights): no later move, which
/// waits for an RCU grace period. 0 in the child, its pid in the parent.
///
/// glibc's `fork` also runs `pthread_atfork` handlers and resets its internal locks; neither
/// happens here, so only a single-threaded caller (no lock held by another thread) may use
/// it, from the thread `glibc` was read from.
pub fn fork_into_cgroup(cgroup: BorrowedFd, glibc: &ForkAsLibc) -> io::Result<i32> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP
            | libc::CLONE_CHILD_SETTID as u64
            | libc::CLONE_CHILD_CLEARTID as u64,
        child_tid: glibc.tid_address,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: args is a valid clone_args; child_tid is this thread's own descriptor's thread
    // id (where glibc's fork has the kernel write the child's id), and the caller is
    // single-threaded.
    let pid = unsafe { clone3(&args) }?;
    if pid == 0 && glibc.robust_len != 0 {
        // SAFETY: the head is this thread's robust list head, inherited with its memory; the
        // kernel only records where it is, as glibc's fork does in its child.
        unsafe {
            libc::syscall(
                libc::SYS_set_robust_list,
                glibc.robust_head,
                glibc.robust_len,
            )
        };
    }
    Ok(pid)
}

/// `madvise(MADV_POPULATE_WRITE)` over `[start, start + len)`: every page of the range made
/// present and writable, a copy-on-write page copied, as a write would, without writing.
pub fn populate_write(start: usize, len: usize) -> io::Result<()> {
    // SAFETY: MADV_POPULATE_WRITE changes no byte the process can read and maps nothing new:
    // it faults in pages of mappings that already exist, and fails (ENOMEM, EFAULT, EINVAL)
    // on a range that is not mapped, not writable, or on a kernel before 5.14.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `sync_file_range(fd, offset, len, SYNC_FILE_RANGE_WRITE)`: starts writing that range of
/// the file to disk, without waiting and without dropping it from the page cache.
pub fn start_writeback(fd: BorrowedFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: a valid descriptor and plain integers; the kernel reads nothing of ours.
    let rc = unsafe {
        libc::sync_file_range(
            fd.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether `fd` has something to read (or its writer is gone) right now.
pub fn readable_now(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd that lives on our stack for the call; a zero timeout never blocks.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    rc != 0
}

/// The fork hooks of the CPython that loaded us (`PyOS_BeforeFork`, `PyOS_AfterFork_Parent`,
/// `PyOS_AfterFork_Child`): what `os.fork()` calls around `fork(2)`.
#[derive(Clone, Copy)]
pub struct PythonFork {
    before: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
}

impl PythonFork {
    /// Finds the hooks among the symbols of the process (the interpreter exports them for its
    /// extension modules); an error when we are not inside a CPython.
    pub fn find() -> io::Result<PythonFork> {
        let hook = |name: &std::ffi::CStr| -> io::Result<unsafe extern "C" fn()> {
            // SAFETY: dlsym only looks a NUL-terminated name up among loaded objects.
            let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            if sym.is_null() {
                return Err(io::Error::other(format!(
                    "{name:?} not found: not in CPython"
                )));
            }
            // SAFETY: the three hooks are `void (void)` functions in CPython's C API.
            Ok(unsafe { std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn()>(sym) })
        };
        Ok(PythonFork {
            before: hook(c"PyOS_BeforeFork")?,
            parent: hook(c"PyOS_AfterFork_Parent")?,
            child: hook(c"PyOS_AfterFork_Child")?,
        })
    }

    /// Forks as `os.fork()` does: the interpreter's hooks run before, and after in each
    /// process (the child's reset the interpreter's locks and threads and run the hooks of
    /// `os.register_at_fork`, `random`'s reseeding among them). 0 in the child, the child's
    /// pid in the parent. With `into`, the child is born in that cgroup (v2; see
    /// [`fork_into_cgroup`], whose single thread this must be). Only for the interpreter's
    /// main thread with the GIL held: the zygote's loop, which Python enters through
    /// `ctypes.PyDLL`.
    pub fn fork(&self, into: Option<(BorrowedFd, &ForkAsLibc)>) -> io::Result<i32> {
        // SAFETY: called from a C function that CPython's main thread entered through
        // ctypes.PyDLL, which holds the GIL across the call, as os.fork requires of its caller;
        // the hooks run in the same order os.fork runs them.
        unsafe {
            (self.before)();
            let forked = match into {
                Some((cgroup, glibc)) => fork_into_cgroup(cgroup, glibc),
                None => match libc::fork() {
                    -1 => Err(io::Error::last_os_error()),
                    pid => Ok(pid),
                },
            };
            if matches!(forked, Ok(0)) {
                (self.child)();
            } else {
                (self.parent)();
            }
            forked
        }
    }
}

/// Makes OpenSSL's random generators of this process (in each copy of libcrypto it has
/// loaded: the system's, and any that a package bundles under a name of its own, found by the
/// names of the files it maps) uninstantiated: their state wiped, each instantiates itself
/// afresh from the OS's entropy when it is next drawn from. For a zygote, whose children are
/// copies of it: OpenSSL's own check for a fork, a change of pid, misses a child whose pid is
/// the zygote's number in another PID namespace. The default library context's primary,
/// public and private generators, made here when they are not yet. How many copies were
/// found; an error for a copy without OpenSSL 3's `EVP_RAND` (whose generators are not reached).
pub fn uninstantiate_openssl_generators() -> io::Result<usize> {
    type Get0 = unsafe extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
    type Uninstantiate = unsafe extern "C" fn(*mut libc::c_void) -> libc::c_int;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut paths: Vec<&str> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| {
            Path::new(path)
                .file_name()
                .is_some_and(|name| name.as_bytes().starts_with(b"libcrypto"))
        })
        .collect();
    paths.dedup();
    let mut done: Vec<usize> = Vec::new();
    for path in paths {
        let name = CString::new(path).map_err(io::Error::other)?;
        // SAFETY: RTLD_NOLOAD only looks the object up among those already loaded (no
        // constructor runs); the reference it takes is kept, so its symbols stay valid.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            continue;
        }
        let symbol = |name: &std::ffi::CStr| {
            // SAFETY: dlsym looks a NUL-terminated name up in a loaded object.
            let sym = unsafe { libc::dlsym(handle, name.as_ptr()) };
            (!sym.is_null()).then_some(sym)
        };
        let (Some(uninstantiate), Some(primary), Some(public), Some(private)) = (
            symbol(c"EVP_RAND_uninstantiate"),
            symbol(c"RAND_get0_primary"),
            symbol(c"RAND_get0_public"),
            symbol(c"RAND_get0_private"),
        ) else {
            return Err(io::Error::other(format!(
                "{path}: no OpenSSL 3 random generators to make fresh for each child"
            )));
        };
        // One library may be mapped under two names (a link): once is enough.
        if done.contains(&(uninstantiate as usize)) {
            continue;
        }
        done.push(uninstantiate as usize);
        // SAFETY: these are `int EVP_RAND_uninstantiate(EVP_RAND_CTX *)` and
        // `EVP_RAND_CTX *RAND_get0_*(OSSL_LIB_CTX *)` in OpenSSL 3's API.
        let uninstantiate =
            unsafe { std::mem::transmute::<*mut libc::c_void, Uninstantiate>(uninstantiate) };
        // All three first: making the public or private one (their first use) instantiates
        // the primary, which they draw their seeds from; then each is wiped, the primary last.
        let generators: Vec<*mut libc::c_void> = [public, private, primary]
            .into_iter()
            .map(|get0| {
                // SAFETY: as above.
                let get0 = unsafe { std::mem::transmute::<*mut libc::c_void, Get0>(get0) };
                // SAFETY: NULL names the default library context; the generator returned is
                // OpenSSL's own (the public and private ones the calling thread's), valid
                // while the library is loaded.
                unsafe { get0(std::ptr::null_mut()) }
            })
            .collect();
        for drbg in generators {
            // SAFETY: a generator of OpenSSL's just returned (or NULL, not passed on); OpenSSL
            // takes its own locks.
            if drbg.is_null() || unsafe { uninstantiate(drbg) } != 1 {
                return Err(io::Error::other(format!(
                    "{path}: an OpenSSL random generator cannot be made fresh"
                )));
            }
        }
    }
    Ok(done.len())
}

/// Moves the calling thread into a new mount namespace whose mounts receive the parent
/// namespace's events but send none back (`MS_SLAVE`, recursively).
pub fn private_mount_namespace() -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )?;
    Ok(())
}

/// Detaches the mount at `path` (`umount2(MNT_DETACH)`).
pub fn detach_mount(path: &str) -> io::Result<()> {
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH)?;
    Ok(())
}
