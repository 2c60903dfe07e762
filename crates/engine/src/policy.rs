//! A sandbox as the engine builds it: what it looks like inside (where the code runs, its user
//! and host name, where pip installs, where an environment is mounted), and its policy: the
//! limits in the kernel's terms, and what egress and an environment add to its root.

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_api::Limits;
use airlock_sandbox::{Enforcement, Policy, RootEntry, Scratch};

use crate::config::{EngineConfig, Mechanism};
use crate::interpreter::Interpreter;

/// Where the code runs, inside the sandbox.
pub const WORKDIR: &str = "/work";
/// Writable directories, all on one tmpfs of `disk_mb`.
pub const SCRATCH_MOUNTS: [&str; 3] = ["/tmp", WORKDIR, "/dev/shm"];
pub(crate) const SANDBOX_UID: u32 = 1000;
pub(crate) const HOSTNAME: &str = "airlock";
/// Where the egress proxy listens on a sandbox's loopback (`HTTP_PROXY` points there).
pub const EGRESS_PORT: u16 = 3128;
/// Where `pip install` inside a sandbox puts packages (on the scratch file system).
pub(crate) const PIP_TARGET: &str = "/tmp/packages";
/// The host's CA certificates (Debian's bundle), mounted for sandboxes with egress.
pub(crate) const CA_BUNDLE: &str = airlock_egress::intercept::SYSTEM_BUNDLE;
/// Mounted for sandboxes with egress when the host has it.
const CURL: &str = "/usr/bin/curl";
/// Where an environment appears inside a sandbox.
pub const ENV_MOUNT: &str = "/env";
const MIB: u64 = 1 << 20;

/// An environment ready to mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvMount {
    pub name: String,
    pub hash: String,
    /// The host directory mounted at `/env`.
    pub source: PathBuf,
    /// Writable: a build in progress; read-only for everything else.
    pub writable: bool,
}

impl EnvMount {
    /// The site-packages directory inside the sandbox, for `python` (`major.minor`).
    pub fn site_packages(python: &str) -> String {
        format!("{ENV_MOUNT}/lib/python{python}/site-packages")
    }
}

/// The sandbox policy for one execution under `limits`, with `interpreter`'s paths as its
/// root.
pub(crate) fn for_limits(
    config: &EngineConfig,
    interpreter: &Interpreter,
    limits: &Limits,
) -> Policy {
    let enforce = |m| {
        if config.is_downgraded(m) {
            Enforcement::Disabled
        } else {
            Enforcement::Required
        }
    };
    let disk = limits.disk_mb * MIB;
    Policy {
        root: interpreter.root.clone(),
        scratch: Scratch {
            size_bytes: disk,
            // Enough for real work, not for millions of empty files.
            inodes: (limits.disk_mb * 256).clamp(1024, 1 << 20),
            mounts: SCRATCH_MOUNTS.iter().map(PathBuf::from).collect(),
        },
        workdir: PathBuf::from(WORKDIR),
        hostname: HOSTNAME.into(),
        uid: SANDBOX_UID,
        gid: SANDBOX_UID,
        limits: airlock_sandbox::Limits {
            wall_time: Duration::from_millis(limits.timeout_ms),
            cpu_time: Duration::from_millis(limits.cpu_ms),
            memory_bytes: limits.memory_mb * MIB,
            pids: limits.pids,
            open_files: config.open_files,
            file_size_bytes: disk,
            cpu_millicores: config.cpu_millicores,
        },
        seccomp: enforce(Mechanism::Seccomp),
        landlock: enforce(Mechanism::Landlock),
        cgroups: enforce(Mechanism::Cgroups),
        die_with_parent: true,
        egress_port: None,
        volumes: Vec::new(),
    }
}

/// A sandbox with egress gets the proxy's port and the host's CA certificates (public data:
/// TLS through the proxy is end to end, so the code verifies servers itself); one whose
/// requests may carry a credential gets them with its leash's own CA certificate added,
/// since the proxy ends TLS to those hosts itself.
pub(crate) fn with_egress_port(policy: &mut Policy, leash: &airlock_egress::Leash) {
    policy.egress_port = Some(EGRESS_PORT);
    // curl, for code that shells out to it (its libraries are the interpreter's already).
    if Path::new(CURL).is_file() {
        policy.root.push(RootEntry::ReadOnly {
            source: PathBuf::from(CURL),
            target: PathBuf::from(CURL),
        });
    }
    let source = match leash.interception() {
        Some(ix) => ix.trust_bundle().to_owned(),
        None if Path::new(CA_BUNDLE).is_file() => PathBuf::from(CA_BUNDLE),
        None => return,
    };
    policy.root.push(RootEntry::ReadOnly {
        source,
        target: PathBuf::from(CA_BUNDLE),
    });
}

/// Mounts `env` at `/env`: read-only, or writable for its own build.
pub(crate) fn with_environment(policy: &mut Policy, env: &EnvMount) {
    let (source, target) = (env.source.clone(), PathBuf::from(ENV_MOUNT));
    policy.root.push(if env.writable {
        RootEntry::Writable { source, target }
    } else {
        RootEntry::ReadOnly { source, target }
    });
}
