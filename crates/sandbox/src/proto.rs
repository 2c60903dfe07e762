//! Messages between the host and the sandbox's init processes, one JSON document per
//! `SOCK_SEQPACKET` datagram. Only airlock's own code writes to this socket: the program
//! never holds it (it is close-on-exec and closed before the program's code runs).

use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::policy::Policy;

/// Largest message either side sends or accepts: a zygote's request carries its Python and the
/// program's (airlock's runner, about 70 KB as JSON); under the 208 KB a datagram can have with
/// the default socket buffer (`net.core.wmem_default`).
pub(crate) const MAX_MESSAGE: usize = 128 * 1024;
/// Most descriptors one message carries.
pub(crate) const MAX_FDS: usize = 64;

/// Host to init, once: what to build and what to run.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct InitRequest {
    pub policy: Policy,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Descriptors the host placed at 4.. for the program, which finds them at 3.. (an init
    /// started ahead receives them with this request, first).
    pub extra_fds: u32,
    /// For an init started ahead, which has dropped the host's rights before its request:
    /// the entries of `policy.root` whose source (`open_tree`, opened by the host) is passed
    /// with the request, in order after the program's descriptors.
    #[serde(default)]
    pub passed_sources: Vec<bool>,
    /// For an init started ahead: how many cgroup v1 `tasks` files, opened by the host, follow
    /// the sources; it writes `0` to each (as `join_cgroup`, which it could not open).
    #[serde(default)]
    pub passed_joins: u32,
    /// The host's pid, to notice a host that died before `PR_SET_PDEATHSIG` took effect.
    pub parent_pid: i32,
    /// cgroup v1 `tasks` files the init writes `0` to before anything else, moving itself
    /// into the sandbox's cgroup (see `SandboxCgroup::self_join_files`); empty when the host
    /// moved it already.
    pub join_cgroup: Vec<PathBuf>,
    /// Build a zygote's template jail instead (see [`crate::zygote`]): the init keeps its
    /// privileges in the sandbox's user namespace (which maps a block of host ids) to build
    /// one jail per child, and the program is the zygote, unconfined within the template.
    #[serde(default)]
    pub zygote: bool,
}

/// Init to host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum Report {
    /// The sandbox's PID 1 exists; a pidfd for it travels with this message (SCM_RIGHTS).
    Started,
    /// The egress listener on the sandbox's loopback travels with this message; sent before
    /// `Started`, and only when the policy asks for one.
    Listener,
    /// The program's process is confined and about to exec.
    Ready { landlock: LandlockReport },
    /// The program ended, as the kernel reported it to the sandbox's init (`wait4`): how,
    /// and the CPU time of the program and of the children it reaped, in microseconds.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        cpu_us: u64,
    },
    /// Setting up the sandbox failed; nothing of the program ran.
    Failed { stage: String, error: String },
}

impl Report {
    /// How the program ended, as `wait4` said.
    pub(crate) fn exited(how: crate::sys::Waited, cpu: std::time::Duration) -> Report {
        let cpu_us = cpu.as_micros() as u64;
        match how {
            crate::sys::Waited::Exited(code) => Report::Exited {
                code: Some(code),
                signal: None,
                cpu_us,
            },
            crate::sys::Waited::Signaled(sig) => Report::Exited {
                code: None,
                signal: Some(sig),
                cpu_us,
            },
        }
    }
}

/// What Landlock enforced, as `landlock_restrict_self` reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockReport {
    pub state: LandlockState,
    /// The kernel's Landlock ABI version, when it has one.
    pub abi: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LandlockState {
    FullyEnforced,
    PartiallyEnforced,
    NotEnforced,
    /// Explicitly downgraded by the caller.
    Disabled,
}

/// A connected pair of `SOCK_SEQPACKET` sockets, close-on-exec: one message per datagram.
pub(crate) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)
}

/// Sends one datagram of raw bytes (the compiled seccomp filters, after the [`InitRequest`]).
pub(crate) fn send_raw(fd: impl AsFd, bytes: &[u8]) -> io::Result<()> {
    loop {
        match nix::sys::socket::send(fd.as_fd().as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one datagram of raw bytes, at most `max`; [`None`] at end of stream.
pub(crate) fn recv_raw(fd: impl AsFd, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; max + 1];
    loop {
        match nix::sys::socket::recv(fd.as_fd().as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(0) => return Ok(None),
            Ok(n) if n > max => return Err(io::Error::other("datagram too large")),
            Ok(n) => {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Largest compiled filter set accepted (it is about 20 KiB).
pub(crate) const MAX_FILTERS: usize = 1 << 20;

pub(crate) fn send_msg<T: Serialize>(fd: impl AsFd, msg: &T) -> io::Result<()> {
    send_msg_with_fd(fd, msg, None)
}

/// Sends one message, optionally passing a descriptor along with it.
pub(crate) fn send_msg_with_fd<T: Serialize>(
    fd: impl AsFd,
    msg: &T,
    pass: Option<&OwnedFd>,
) -> io::Result<()> {
    let raw: Vec<RawFd> = pass.iter().map(|f| f.as_raw_fd()).collect();
    send_msg_with_fds(fd, msg, &raw)
}

/// Sends one message with any number of descriptors (the kernel takes up to 253).
pub(crate) fn send_msg_with_fds<T: Serialize>(
    fd: impl AsFd,
    msg: &T,
    raw: &[RawFd],
) -> io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(io::Error::other(format!(
            "message of {} bytes is too large",
            bytes.len()
        )));
    }
    let iov = [IoSlice::new(&bytes)];
    let cmsgs: Vec<ControlMessage<'_>> = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(raw)]
    };
    loop {
        match sendmsg::<()>(
            fd.as_fd().as_raw_fd(),
            &iov,
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one message and any descriptor passed with it; [`None`] at end of stream.
pub(crate) fn recv_msg_with_fd<T: DeserializeOwned>(
    fd: impl AsFd,
) -> io::Result<Option<(T, Option<OwnedFd>)>> {
    Ok(recv_msg_with_fds(fd)?.map(|(m, fds)| (m, fds.into_iter().next())))
}

thread_local! {
    /// Each thread's receive buffer, made once. A zygote that allocated, zeroed and freed a
    /// buffer of the largest message for every message wrote to pages its live children share
    /// (a copy of each) and made glibc consolidate its free lists, touching more of them.
    /// What a message wrote is zeroed once it is decoded: a zygote's children are copies of
    /// its memory, and must not find there the requests it received for others.
    static RECEIVED: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; MAX_MESSAGE + 1]);
}

/// Receives one message and every descriptor passed with it; [`None`] at end of stream.
pub(crate) fn recv_msg_with_fds<T: DeserializeOwned>(
    fd: impl AsFd,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    RECEIVED.with_borrow_mut(|buf| recv_into(fd, buf))
}

fn recv_into<T: DeserializeOwned>(
    fd: impl AsFd,
    buf: &mut [u8],
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (n, passed) = loop {
        let mut iov = [IoSliceMut::new(buf)];
        let flags = MsgFlags::MSG_CMSG_CLOEXEC;
        match recvmsg::<()>(fd.as_fd().as_raw_fd(), &mut iov, Some(&mut cmsg), flags) {
            Ok(msg) => {
                let mut passed: Vec<OwnedFd> = Vec::new();
                for c in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        passed.extend(fds.into_iter().map(crate::sys::own_received_fd));
                    }
                }
                if msg.flags.contains(MsgFlags::MSG_TRUNC) {
                    buf.fill(0);
                    return Err(io::Error::other("message too large"));
                }
                break (msg.bytes, passed);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if n == 0 {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[..n]).map_err(io::Error::other);
    buf[..n].fill(0);
    Ok(Some((msg?, passed)))
}

/// Receives one message; [`None`] when the peer has closed its end.
pub(crate) fn recv_msg<T: DeserializeOwned>(fd: impl AsFd) -> io::Result<Option<T>> {
    Ok(recv_msg_with_fd(fd)?.map(|(m, _)| m))
}
