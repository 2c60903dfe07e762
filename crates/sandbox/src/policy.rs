//! The sandbox policy: plain data, no behaviour.
//!
//! `Policy::default()` is the most restrictive policy this crate can express: nothing of the
//! host is visible, every mechanism is required, and the limits are small. Callers widen it
//! field by field; [`crate::init`] and the steps it shares with zygotes, [`crate::jail`], are
//! the private code that turns it into syscalls.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Everything the sandbox may see and use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// What the read-only root holds besides `/proc`, `/dev` and the scratch mounts.
    pub root: Vec<RootEntry>,
    /// The one writable, size-capped tmpfs and where it appears.
    pub scratch: Scratch,
    /// The program's working directory (inside the sandbox).
    pub workdir: PathBuf,
    /// Hostname seen inside the UTS namespace.
    pub hostname: String,
    /// The unprivileged uid and gid the program runs as inside the user namespace.
    pub uid: u32,
    pub gid: u32,
    pub limits: Limits,
    pub seccomp: Enforcement,
    pub landlock: Enforcement,
    pub cgroups: Enforcement,
    /// Kill the sandbox when the thread that spawned it dies.
    pub die_with_parent: bool,
    /// Egress through the host: a TCP listener on the sandbox's own loopback (127.0.0.1) at
    /// this port, created inside its network namespace and handed to the host, which serves
    /// it (the egress proxy). Landlock then allows TCP connects to this port only. [`None`]:
    /// loopback stays down and no TCP connect is allowed at all.
    pub egress_port: Option<u16>,
    /// Host directories (each the root of a file system of its own: a volume) mounted below a
    /// scratch mount point, after it. Their files belong to `uid` and `gid` on that file
    /// system; each sandbox sees them as its own through an idmapped mount, which only a host
    /// running as root can make.
    pub volumes: Vec<VolumeMount>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            root: Vec::new(),
            scratch: Scratch::default(),
            workdir: PathBuf::from("/tmp"),
            hostname: "sandbox".to_owned(),
            uid: 1000,
            gid: 1000,
            limits: Limits::default(),
            seccomp: Enforcement::Required,
            landlock: Enforcement::Required,
            cgroups: Enforcement::Required,
            die_with_parent: true,
            egress_port: None,
            volumes: Vec::new(),
        }
    }
}

/// A volume's mount: the host directory `source` at `target`, read-only or writable, always
/// `nosuid`, `nodev` and `noexec`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    pub source: PathBuf,
    /// Strictly below one of the scratch mount points, and neither below nor above another
    /// volume's target.
    pub target: PathBuf,
    pub read_only: bool,
}

/// One entry of the sandbox's root file system.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RootEntry {
    /// A host file or directory, bind-mounted read-only, nosuid and nodev (recursively).
    ReadOnly { source: PathBuf, target: PathBuf },
    /// A host directory, bind-mounted writable, nosuid and nodev (recursively), for a sandbox
    /// whose product outlives it (an environment's build). What the program leaves there is
    /// as untrusted as the program: the caller must check it before using it.
    Writable { source: PathBuf, target: PathBuf },
    /// A symbolic link at `path` pointing to `target`.
    Symlink { target: PathBuf, path: PathBuf },
    /// A small file with fixed contents, written before the root is made read-only.
    File { path: PathBuf, contents: String },
}

impl RootEntry {
    /// Where the entry appears inside the sandbox.
    pub fn path(&self) -> &Path {
        match self {
            RootEntry::ReadOnly { target, .. } | RootEntry::Writable { target, .. } => target,
            RootEntry::Symlink { path, .. } | RootEntry::File { path, .. } => path,
        }
    }
}

/// The writable tmpfs. All mount points share one size and inode budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scratch {
    pub size_bytes: u64,
    pub inodes: u64,
    /// Directories of the scratch file system, each mounted at this path.
    pub mounts: Vec<PathBuf>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self {
            size_bytes: 16 << 20,
            inodes: 4096,
            mounts: vec![PathBuf::from("/tmp")],
        }
    }
}

/// Resource limits. cgroup limits cover the whole sandbox; rlimits are per process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall clock from spawn; enforced from outside by killing the whole sandbox.
    #[serde(with = "millis")]
    pub wall_time: Duration,
    /// CPU time of all processes together (cgroup), with `RLIMIT_CPU` as a per-process backstop.
    #[serde(with = "millis")]
    pub cpu_time: Duration,
    /// Memory of the whole sandbox, files in its tmpfs included; swap is off.
    pub memory_bytes: u64,
    /// Processes and threads the program may have at once (the sandbox's own init not counted).
    pub pids: u32,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
    /// `RLIMIT_FSIZE`: the largest file a process may write.
    pub file_size_bytes: u64,
    /// CPU bandwidth in thousandths of a core (1000 = one core).
    pub cpu_millicores: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            wall_time: Duration::from_secs(10),
            cpu_time: Duration::from_secs(10),
            memory_bytes: 128 << 20,
            pids: 16,
            open_files: 64,
            file_size_bytes: 16 << 20,
            cpu_millicores: 1000,
        }
    }
}

/// Whether a protection mechanism must be in force. There is no "if available": a mechanism
/// is either required (and a host without it refuses to run), or explicitly disabled by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    Required,
    Disabled,
}

impl Enforcement {
    pub fn is_required(self) -> bool {
        self == Enforcement::Required
    }
}

/// A policy that cannot be applied as written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("{what} path {path:?} must be absolute and normal (no `.` or `..`)")]
    BadPath { what: &'static str, path: PathBuf },
    #[error("{path:?} is reserved for the sandbox's own {what}")]
    Reserved { path: PathBuf, what: &'static str },
    #[error("limit {name} must be greater than zero")]
    ZeroLimit { name: &'static str },
    #[error("uid and gid inside the sandbox must not be 0")]
    RootInside,
    #[error("hostname {0:?} is not a valid host name")]
    Hostname(String),
    #[error("the scratch file system needs at least one mount point")]
    NoScratch,
    #[error("workdir {0:?} is not one of the scratch mount points")]
    Workdir(PathBuf),
    #[error("the egress port must not be 0")]
    EgressPort,
    #[error(
        "volume mount {0:?} must be below a scratch mount point and apart from every other volume"
    )]
    VolumeTarget(PathBuf),
}

impl Policy {
    /// Checks everything that can be checked without touching the host.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for entry in &self.root {
            let path = entry.path();
            check_path("root entry", path)?;
            for reserved in ["/proc", "/dev"] {
                if path.starts_with(reserved) {
                    return Err(PolicyError::Reserved {
                        path: path.to_owned(),
                        what: reserved,
                    });
                }
            }
            if let RootEntry::ReadOnly { source, .. } | RootEntry::Writable { source, .. } = entry {
                check_path("bind mount source", source)?;
            }
        }
        if self.scratch.mounts.is_empty() {
            return Err(PolicyError::NoScratch);
        }
        for mount in &self.scratch.mounts {
            check_path("scratch mount", mount)?;
            if mount.starts_with("/proc") || mount == Path::new("/dev") {
                return Err(PolicyError::Reserved {
                    path: mount.clone(),
                    what: "/proc or /dev",
                });
            }
        }
        if !self
            .scratch
            .mounts
            .iter()
            .any(|m| self.workdir.starts_with(m))
        {
            return Err(PolicyError::Workdir(self.workdir.clone()));
        }
        check_path("workdir", &self.workdir)?;
        for (i, volume) in self.volumes.iter().enumerate() {
            check_path("volume source", &volume.source)?;
            check_path("volume mount", &volume.target)?;
            let below_scratch = self
                .scratch
                .mounts
                .iter()
                .any(|m| volume.target.starts_with(m) && volume.target != *m);
            let apart = self.volumes[..i].iter().all(|other| {
                !other.target.starts_with(&volume.target)
                    && !volume.target.starts_with(&other.target)
            });
            if !below_scratch || !apart {
                return Err(PolicyError::VolumeTarget(volume.target.clone()));
            }
        }
        if self.uid == 0 || self.gid == 0 {
            return Err(PolicyError::RootInside);
        }
        if self.egress_port == Some(0) {
            return Err(PolicyError::EgressPort);
        }
        let valid_host = !self.hostname.is_empty()
            && self.hostname.len() <= 64
            && self
                .hostname
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid_host {
            return Err(PolicyError::Hostname(self.hostname.clone()));
        }
        let l = &self.limits;
        for (name, zero) in [
            ("wall_time", l.wall_time.is_zero()),
            ("cpu_time", l.cpu_time.is_zero()),
            ("memory_bytes", l.memory_bytes == 0),
            ("pids", l.pids == 0),
            ("open_files", l.open_files == 0),
            ("file_size_bytes", l.file_size_bytes == 0),
            ("cpu_millicores", l.cpu_millicores == 0),
            ("scratch.size_bytes", self.scratch.size_bytes == 0),
            ("scratch.inodes", self.scratch.inodes == 0),
        ] {
            if zero {
                return Err(PolicyError::ZeroLimit { name });
            }
        }
        Ok(())
    }
}

fn check_path(what: &'static str, path: &Path) -> Result<(), PolicyError> {
    let mut components = path.components();
    let normal = components.next() == Some(Component::RootDir)
        && components.all(|c| matches!(c, Component::Normal(_)));
    if normal && path != Path::new("/") {
        Ok(())
    } else {
        Err(PolicyError::BadPath {
            what,
            path: path.to_owned(),
        })
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_most_restrictive() {
        let p = Policy::default();
        p.validate().unwrap();
        assert!(p.root.is_empty(), "nothing of the host by default");
        assert!(p.seccomp.is_required() && p.landlock.is_required() && p.cgroups.is_required());
        assert_ne!(p.uid, 0);
        assert!(p.die_with_parent);
    }

    #[test]
    fn round_trips_through_json() {
        let mut p = Policy::default();
        p.root.push(RootEntry::ReadOnly {
            source: "/usr".into(),
            target: "/usr".into(),
        });
        p.root.push(RootEntry::Symlink {
            target: "usr/lib".into(),
            path: "/lib".into(),
        });
        p.limits.wall_time = Duration::from_millis(1500);
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains("\"wall_time\":1500"));
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<Policy>(r#"{"network": true}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    #[test]
    fn rejects_relative_dotdot_and_reserved_paths() {
        let bad = |entry| {
            let mut p = Policy::default();
            p.root.push(entry);
            p.validate().unwrap_err()
        };
        let ro = |s: &str, t: &str| RootEntry::ReadOnly {
            source: s.into(),
            target: t.into(),
        };
        assert!(matches!(
            bad(ro("usr", "/usr")),
            PolicyError::BadPath { .. }
        ));
        assert!(matches!(
            bad(ro("/usr", "/usr/../etc")),
            PolicyError::BadPath { .. }
        ));
        assert!(matches!(bad(ro("/usr", "/")), PolicyError::BadPath { .. }));
        assert!(matches!(
            bad(ro("/proc", "/proc/1")),
            PolicyError::Reserved { .. }
        ));
        assert!(matches!(
            bad(ro("/dev/sda", "/dev/sda")),
            PolicyError::Reserved { .. }
        ));
    }

    #[test]
    fn rejects_root_uid_zero_limits_and_stray_workdir() {
        let mut p = Policy {
            uid: 0,
            ..Policy::default()
        };
        assert_eq!(p.validate(), Err(PolicyError::RootInside));
        p.uid = 1000;
        p.limits.pids = 0;
        assert_eq!(p.validate(), Err(PolicyError::ZeroLimit { name: "pids" }));
        p.limits.pids = 1;
        p.workdir = "/home".into();
        assert_eq!(p.validate(), Err(PolicyError::Workdir("/home".into())));
        p.workdir = "/tmp".into();
        p.hostname = "a b".into();
        assert!(matches!(p.validate(), Err(PolicyError::Hostname(_))));
    }
}
