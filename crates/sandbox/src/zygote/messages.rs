//! What a zygote's processes say to one another, and the descriptors that travel with each
//! message: the host and the zygote ([`ChildRequest`], [`ZygoteReady`]), the zygote and its
//! template's init ([`JailRequest`], [`JailReply`]), a jail's init and the template's
//! ([`JailBuilt`]). One JSON document per `SOCK_SEQPACKET` datagram, as `proto` sends them.

use std::os::fd::RawFd;

use nix::sched::CloneFlags;
use serde::{Deserialize, Serialize};

use crate::policy::Policy;

/// Where the zygote finds the host's control socket and its template init's.
pub(crate) const HOST_FD: RawFd = 3;
pub(crate) const JAILS_FD: RawFd = 4;

/// The namespaces of a child's jail, in the order the child enters them (user first: it gives
/// the rights over the others). The jail's init makes the cgroup namespace itself, once in the
/// child's cgroup, so that the namespace's root is that cgroup; the others come with it. So
/// the cgroup namespace is last: its descriptor comes after the others' (see [`JailReply`]).
pub(crate) const JAIL_NAMESPACES: [(&str, CloneFlags); 6] = [
    ("user", CloneFlags::CLONE_NEWUSER),
    ("mnt", CloneFlags::CLONE_NEWNS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
];

/// Host to zygote, one per child. Descriptors: the status socket, stdin, stdout, stderr,
/// [`join_cgroup`](Self::join_cgroup) cgroup descriptors, then the program's own.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ChildRequest {
    pub policy: Policy,
    /// The program's arguments after the zygote's own `python <flags> -c <code>` (which
    /// [`Zygote::serves`](super::Zygote::serves) found the same): the code is not sent
    /// again with every child.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// cgroup v1 `tasks` files opened for writing, or (with `into_cgroup`) the one directory
    /// of the child's cgroup.
    pub join_cgroup: u32,
    /// The one cgroup descriptor is the directory of the child's cgroup (v2), which the
    /// jail's init and the child are cloned into (`CLONE_INTO_CGROUP`).
    pub into_cgroup: bool,
    pub extra_fds: u32,
}

/// Where each descriptor of a [`ChildRequest`] is among those that came with it.
impl ChildRequest {
    /// The status socket, stdin, stdout and stderr come first.
    pub const STDIO_FDS: usize = 4;

    /// How many descriptors come with the request.
    pub fn descriptors(&self) -> usize {
        Self::STDIO_FDS + self.join_cgroup as usize + self.extra_fds as usize
    }

    /// The cgroup's, among `fds` (which [`descriptors`](Self::descriptors) counted).
    pub fn cgroup_fds<'a, T>(&self, fds: &'a [T]) -> &'a [T] {
        &fds[Self::STDIO_FDS..Self::STDIO_FDS + self.join_cgroup as usize]
    }

    /// The program's own, among `fds`.
    pub fn program_fds<'a, T>(&self, fds: &'a [T]) -> &'a [T] {
        &fds[Self::STDIO_FDS + self.join_cgroup as usize..]
    }
}

/// Zygote to host, once: its modules are loaded and it takes requests.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ZygoteReady {
    /// What each child copies of the zygote's memory before its program runs (`survey`).
    pub prefault_bytes: u64,
    /// Whether a child can be cloned straight into its cgroup (see `ZygoteState::clone_into`).
    pub clones_into_cgroups: bool,
}

/// Zygote to template init: build a jail. Descriptors: the cgroup files to join, or the
/// directory of the cgroup to clone the jail's init into (`into_cgroup`).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct JailRequest {
    pub policy: Policy,
    pub into_cgroup: bool,
}

/// Template init to zygote, in the order the jails were asked for. Descriptors when built:
/// a pidfd for the jail's init, then its namespaces as in [`JAIL_NAMESPACES`], then its PID
/// namespace ([`JailReply::BUILT_FDS`] in all).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum JailReply {
    Built,
    Failed { error: String },
}

impl JailReply {
    /// The descriptors that come with [`JailReply::Built`].
    pub const BUILT_FDS: usize = 2 + JAIL_NAMESPACES.len();
}

/// A jail's init to the template's: its root is built (with its cgroup namespace's descriptor),
/// or why not.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum JailBuilt {
    Ready,
    Failed { error: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_request_s_descriptors_are_stdio_then_the_cgroup_s_then_the_program_s() {
        let request = ChildRequest {
            policy: Policy::default(),
            args: Vec::new(),
            env: Vec::new(),
            join_cgroup: 2,
            into_cgroup: false,
            extra_fds: 3,
        };
        assert_eq!(request.descriptors(), 9);
        let fds: Vec<u32> = (0..9).collect();
        assert_eq!(request.cgroup_fds(&fds), [4, 5]);
        assert_eq!(request.program_fds(&fds), [6, 7, 8]);
        let none = ChildRequest {
            join_cgroup: 0,
            extra_fds: 0,
            ..request
        };
        assert_eq!(none.descriptors(), 4);
        assert!(none.cgroup_fds(&fds[..4]).is_empty());
        assert!(none.program_fds(&fds[..4]).is_empty());
    }

    #[test]
    fn a_jail_s_namespaces_are_entered_user_first_and_cgroup_last() {
        // User first: it gives the rights over the others. Cgroup last: the template's init
        // opens the others from /proc and appends the cgroup one its jail's init sends, and
        // the child enters them in the order they came.
        let names: Vec<&str> = JAIL_NAMESPACES.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["user", "mnt", "net", "ipc", "uts", "cgroup"]);
        let all = JAIL_NAMESPACES
            .iter()
            .fold(CloneFlags::empty(), |all, (_, f)| all | *f);
        assert_eq!(all.bits().count_ones(), 6, "one flag each");
        assert_eq!(JailReply::BUILT_FDS, 8);
    }
}
