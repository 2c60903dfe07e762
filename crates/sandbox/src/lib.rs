//! A Linux jail for running untrusted programs, built from a plain-data [`Policy`].
//!
//! # Quick start
//!
//! ```no_run
//! use airlock_sandbox::{spawn, Command, Policy, RootEntry};
//!
//! fn main() {
//!     // The sandbox's init is this binary, re-executed: this must come first.
//!     airlock_sandbox::run_if_init();
//!
//!     let mut policy = Policy::default();
//!     policy.root.push(RootEntry::ReadOnly { source: "/usr".into(), target: "/usr".into() });
//!     let child = spawn(Command::new("/usr/bin/true"), &policy).unwrap();
//!     let outcome = child.wait().unwrap();
//!     println!("{:?}", outcome.exit);
//! }
//! ```
//!
//! # What is enforced
//!
//! - New user, PID, network, mount, IPC, UTS and cgroup namespaces; one unprivileged uid and
//!   gid mapped inside (as root on the host, a host uid unique to the sandbox and owning
//!   nothing).
//! - A read-only root holding only what the policy lists, a fresh `/proc` (per-process entries
//!   only), a minimal `/dev`, and one size- and inode-capped tmpfs for the writable directories.
//!   The host's root is detached after `pivot_root`.
//! - An empty network namespace.
//! - A new session (no controlling terminal), `no_new_privs`, every capability dropped and the
//!   securebits locked, descriptors closed but the program's own.
//! - Landlock (ABI 6 rights: file system, TCP, abstract unix sockets and signals scoped).
//! - seccomp: a default-deny allow-list with an architecture check and x32 rejection, kept as
//!   data in `seccomp/x86_64.json` (see [`seccomp`]).
//! - cgroup v2 or v1 limits on memory (swap off), pids and CPU; rlimits on CPU time, open
//!   files, file size and core dumps; a wall clock enforced from outside by killing the
//!   sandbox's PID namespace.
//! - Fail closed: a mechanism the policy requires but the host lacks is an error, never a
//!   silent skip; it is skipped only when the policy says [`Enforcement::Disabled`], and the
//!   outcome's [`Isolation`] says so.

mod bounded;
mod cgroup;
mod host;
mod init;
mod jail;
mod policy;
mod proto;
pub mod seccomp;
// Also compiled into build.rs; here only the tests use its compiler.
#[cfg_attr(not(test), allow(dead_code))]
mod seccomp_profile;
mod spawn;
mod sys;
mod zygote;

pub use bounded::{BoundedDir, BoundedError, BoundedKind};
pub use cgroup::{
    cleanup_failures, remove_leftovers, settle, CgroupError, CgroupVersion, Layout, SANDBOX_PREFIX,
};
/// Large blocks mapped on their own, given back to the system when freed (a server's).
pub use sys::map_large_blocks;
/// Starts writing a range of a file to disk without waiting (snapshots use it so that their
/// final sync waits for the last piece only).
pub use sys::start_writeback;
// For airlock-bench alone (the `bench` feature): how long each way into a cgroup v2 takes.
#[cfg(feature = "bench")]
pub use cgroup::{time_v2_placements, Placement};
pub use host::{host_support, own_exe, unmask_proc, HostSupport, ProcMasks};
pub use init::{run_if_init, HOST_ID_BASE, INIT_ARG};
pub use policy::{Enforcement, Limits, Policy, PolicyError, RootEntry, Scratch, VolumeMount};
pub use proto::{LandlockReport, LandlockState};
pub use spawn::{
    spawn, Beside, Child, Command, Exit, Isolation, KillReason, Killer, Outcome, Prestarted, Probe,
    SetOnce, SpawnError, Usage, WaitError, NAMESPACES,
};
pub use zygote::{library_beside, Zygote, ZygoteSpec, FINISH_PY, LIBRARY_NAME};
