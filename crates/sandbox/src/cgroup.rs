//! cgroup v1 and v2: one cgroup per sandbox, created beneath the cgroup airlock itself runs in
//! (never by writing into a hierarchy's root), limited before the sandbox's first process
//! enters it, read for the verdict, and removed afterwards.
//!
//! v2 is used when the unified hierarchy offers `memory`, `pids` and `cpu` to our cgroup;
//! otherwise v1, when `memory`, `pids`, `cpu` and `cpuacct` hierarchies are all mounted.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

use crate::policy::Limits;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

const V1_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "cpuacct"];
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// On v2 a cgroup with processes cannot hand controllers to children, so airlock moves itself
/// into this leaf of its own cgroup first.
const V2_SUPERVISOR_LEAF: &str = "airlock-supervisor";
/// Prefix of every sandbox cgroup, so that leftovers of a crashed run can be found.
pub const SANDBOX_PREFIX: &str = "airlock-";
/// On v2, the leaf of a zygote's tree where its own processes live (see
/// [`SandboxCgroup::create_for_zygote`]).
const ZYGOTE_TEMPLATE_LEAF: &str = "template";
/// On v1, the file through which a thread moves itself into a cgroup (see
/// [`SandboxCgroup::self_join_files`]).
const JOIN_FILE_V1: &str = "tasks";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("no usable cgroup hierarchy: {0}")]
    Unusable(String),
    #[error("creating cgroup {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error(
        "cannot create cgroups beneath {path}: {source}; run as root or in a delegated cgroup"
    )]
    NotWritable { path: PathBuf, source: io::Error },
    #[error("removing cgroup {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
    #[error("writing {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error(
        "cgroup v2: airlock's cgroup {0} holds other processes, so it cannot hand controllers to \
         sandboxes; run airlock in a cgroup of its own (for example `systemd-run --scope -p \
         Delegate=yes airlock ...`)"
    )]
    SharedV2Cgroup(PathBuf),
}

/// Where airlock's own cgroups are, per version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Our cgroup directory in each needed v1 hierarchy (`cpu` and `cpuacct` may coincide).
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        cpuacct: PathBuf,
    },
    /// Our cgroup directory in the unified hierarchy.
    V2 { dir: PathBuf },
}

impl Layout {
    pub fn version(&self) -> CgroupVersion {
        match self {
            Layout::V1 { .. } => CgroupVersion::V1,
            Layout::V2 { .. } => CgroupVersion::V2,
        }
    }

    /// The directories sandbox cgroups are created in.
    pub fn parents(&self) -> Vec<PathBuf> {
        let mut dirs = match self {
            Layout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => {
                vec![memory.clone(), pids.clone(), cpu.clone(), cpuacct.clone()]
            }
            Layout::V2 { dir } => vec![dir.clone()],
        };
        dirs.dedup();
        dirs
    }
}

/// One line of /proc/self/mountinfo, the fields we need.
#[derive(Debug, PartialEq, Eq)]
struct MountEntry {
    root: String,
    mount_point: PathBuf,
    fs_type: String,
    super_options: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let fs_type = right.next()?.to_owned();
            let _source = right.next()?;
            let super_options = right.next()?.split(',').map(str::to_owned).collect();
            Some(MountEntry {
                root: unescape(left.get(3)?),
                mount_point: PathBuf::from(unescape(left.get(4)?)),
                fs_type,
                super_options,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// One line of /proc/self/cgroup: hierarchy id, controllers, path.
fn parse_proc_cgroup(text: &str) -> Vec<(String, Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?.to_owned();
            let controllers = parts
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            Some((id, controllers, parts.next()?.to_owned()))
        })
        .collect()
}

/// Joins a cgroup path (relative to the namespace root) onto the mount of its hierarchy.
fn locate(mount: &MountEntry, cgroup_path: &str) -> PathBuf {
    let relative = cgroup_path
        .strip_prefix(mount.root.as_str())
        .unwrap_or(cgroup_path);
    let relative = relative.trim_start_matches('/');
    if relative.is_empty() {
        mount.mount_point.clone()
    } else {
        mount.mount_point.join(relative)
    }
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_owned(),
        source,
    })
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_owned(),
        value: value.to_owned(),
        source,
    })
}

/// Finds airlock's own cgroups from /proc/self/mountinfo and /proc/self/cgroup.
pub fn detect() -> Result<Layout, CgroupError> {
    let mountinfo = read(Path::new("/proc/self/mountinfo"))?;
    let own = read(Path::new("/proc/self/cgroup"))?;
    detect_from(
        &parse_mountinfo(&mountinfo),
        &parse_proc_cgroup(&own),
        |p| fs::read_to_string(p).ok(),
    )
}

fn detect_from(
    mounts: &[MountEntry],
    own: &[(String, Vec<String>, String)],
    read_file: impl Fn(&Path) -> Option<String>,
) -> Result<Layout, CgroupError> {
    let mut why_not_v2 = String::from("no cgroup2 mount");
    if let (Some(mount), Some((_, _, path))) = (
        mounts.iter().find(|m| m.fs_type == "cgroup2"),
        own.iter().find(|(id, c, _)| id == "0" && c.is_empty()),
    ) {
        let mut dir = locate(mount, path);
        if dir.file_name().is_some_and(|n| n == V2_SUPERVISOR_LEAF) {
            dir.pop();
        }
        let available = read_file(&dir.join("cgroup.controllers")).unwrap_or_default();
        let available: Vec<&str> = available.split_whitespace().collect();
        let missing: Vec<&str> = V2_CONTROLLERS
            .iter()
            .copied()
            .filter(|c| !available.contains(c))
            .collect();
        if missing.is_empty() {
            return Ok(Layout::V2 { dir });
        }
        why_not_v2 = format!(
            "cgroup v2 at {} lacks {}",
            dir.display(),
            missing.join(", ")
        );
    }
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for controller in V1_CONTROLLERS {
        let mount = mounts
            .iter()
            .find(|m| m.fs_type == "cgroup" && m.super_options.iter().any(|o| o == controller));
        let path = own
            .iter()
            .find(|(_, c, _)| c.iter().any(|c| c == controller));
        match (mount, path) {
            (Some(mount), Some((_, _, path))) => found.push(locate(mount, path)),
            _ => missing.push(controller),
        }
    }
    if !missing.is_empty() {
        return Err(CgroupError::Unusable(format!(
            "{why_not_v2}; cgroup v1 lacks {}",
            missing.join(", ")
        )));
    }
    let mut it = found.into_iter();
    let mut next = || it.next().unwrap_or_default();
    Ok(Layout::V1 {
        memory: next(),
        pids: next(),
        cpu: next(),
        cpuacct: next(),
    })
}

/// On v2, make sure our cgroup hands the controllers down, moving ourselves into a leaf first.
pub fn prepare(layout: &Layout) -> Result<(), CgroupError> {
    let Layout::V2 { dir } = layout else {
        return Ok(());
    };
    let subtree = dir.join("cgroup.subtree_control");
    let enabled = read(&subtree)?;
    let enabled: Vec<&str> = enabled.split_whitespace().collect();
    let wanted: Vec<String> = V2_CONTROLLERS
        .iter()
        .filter(|c| !enabled.contains(c))
        .map(|c| format!("+{c}"))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let leaf = dir.join(V2_SUPERVISOR_LEAF);
    match fs::create_dir(&leaf) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(CgroupError::Create {
                path: leaf,
                source: e,
            })
        }
        _ => {}
    }
    write(&leaf.join("cgroup.procs"), &std::process::id().to_string())?;
    match fs::write(&subtree, wanted.join(" ")) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            Err(CgroupError::SharedV2Cgroup(dir.clone()))
        }
        Err(source) => Err(CgroupError::Write {
            path: subtree,
            value: wanted.join(" "),
            source,
        }),
    }
}

/// Sandbox cgroups can only be made where we may write.
pub fn check_writable(layout: &Layout) -> Result<(), CgroupError> {
    use nix::unistd::{access, AccessFlags};
    for dir in layout.parents() {
        access(&dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
            CgroupError::NotWritable {
                path: dir.clone(),
                source: io::Error::from(e),
            }
        })?;
    }
    Ok(())
}

/// A new directory `<prefix><n>` in `parent` (made by `at`: `parent` itself or a
/// directory in it), `n` the next of the sequence not taken (a name left by an earlier
/// airlock that had our pid is skipped).
fn fresh_dir(at: impl Fn(&str) -> Dir, prefix: &str) -> Result<Dir, CgroupError> {
    loop {
        let dir = at(&format!(
            "{prefix}{}",
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        match dir.make() {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(source) => {
                return Err(CgroupError::Create {
                    path: dir.path,
                    source,
                })
            }
        }
    }
}

/// The memory limit, the pids limit and the CPU quota per 100 ms period, as cgroup files
/// take them.
fn limit_values(limits: &Limits, extra_pids: u32) -> (String, String, u64) {
    let pids = (u64::from(limits.pids) + u64::from(extra_pids)).to_string();
    let quota = u64::from(limits.cpu_millicores) * 100;
    (limits.memory_bytes.to_string(), pids, quota)
}

/// A small file's text, read without the `stat` that `fs::read_to_string` makes first to size
/// its buffer (a cgroup file's size is 0 anyway).
fn read_small(mut file: fs::File) -> io::Result<String> {
    use std::io::Read;
    let (mut text, mut chunk) = (Vec::new(), [0u8; 512]);
    loop {
        match file.read(&mut chunk)? {
            0 => break,
            n => text.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A descriptor of `dir`, opened once for the whole process (sandbox cgroups are made in a
/// few directories only: airlock's own in each hierarchy, and its zygotes' trees' parent);
/// None when it cannot be opened, and the paths are walked instead.
fn parent_fd(dir: &Path) -> Option<Arc<OwnedFd>> {
    use nix::fcntl::{open, OFlag};
    static OPENED: Mutex<Vec<(PathBuf, Arc<OwnedFd>)>> = Mutex::new(Vec::new());
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, fd)) = opened.iter().find(|(p, _)| p == dir) {
        return Some(fd.clone());
    }
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let fd = Arc::new(open(dir, flags, Mode::empty()).ok()?);
    opened.push((dir.to_owned(), fd.clone()));
    Some(fd)
}

/// One cgroup directory. It is made and removed, and its files opened, relative to a
/// descriptor of the directory it was made in: a walk from `/` revalidates each of the path's
/// kernfs components (about 8 µs an open on this host's four-level memory hierarchy, against
/// 3 µs from the parent), and an execution on v1 makes 14 opens, 4 `mkdir`s and 4 `rmdir`s.
#[derive(Clone, Debug)]
struct Dir {
    /// Its path, for errors and for processes that open its files by name.
    path: PathBuf,
    /// The parent's descriptor and the path from there; None for a directory reached by its
    /// path only (a crashed run's leftovers found by a walk).
    at: Option<(Arc<OwnedFd>, PathBuf)>,
}

impl Dir {
    fn by_path(path: PathBuf) -> Dir {
        Dir { path, at: None }
    }

    /// `name` in `parent`, reached through `parent`'s descriptor.
    fn beneath(parent: &Path, name: &str) -> Dir {
        Dir {
            path: parent.join(name),
            at: parent_fd(parent).map(|fd| (fd, PathBuf::from(name))),
        }
    }

    /// `name` in this directory, reached through the same descriptor.
    fn child(&self, name: &str) -> Dir {
        Dir {
            path: self.path.join(name),
            at: self
                .at
                .as_ref()
                .map(|(fd, rel)| (fd.clone(), rel.join(name))),
        }
    }

    fn make(&self) -> io::Result<()> {
        match &self.at {
            Some((fd, rel)) => nix::sys::stat::mkdirat(fd, rel, Mode::from_bits_truncate(0o777))
                .map_err(io::Error::from),
            None => fs::create_dir(&self.path),
        }
    }

    fn remove(&self) -> io::Result<()> {
        use nix::unistd::{unlinkat, UnlinkatFlags};
        match &self.at {
            Some((fd, rel)) => unlinkat(fd, rel, UnlinkatFlags::RemoveDir).map_err(io::Error::from),
            None => fs::remove_dir(&self.path),
        }
    }

    /// The directory itself (`file` empty) or one of its files, opened with `flags`.
    fn open(&self, file: &str, flags: nix::fcntl::OFlag) -> io::Result<OwnedFd> {
        use nix::fcntl::{open, openat, OFlag};
        let flags = flags | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(0o666);
        match &self.at {
            Some((fd, rel)) if file.is_empty() => openat(fd, rel, flags, mode),
            Some((fd, rel)) => openat(fd, &rel.join(file), flags, mode),
            None => open(&self.path.join(file), flags, mode),
        }
        .map_err(io::Error::from)
    }

    fn read(&self, file: &str) -> io::Result<String> {
        read_small(self.open(file, nix::fcntl::OFlag::O_RDONLY)?.into())
    }

    /// Writes `value` to `file` as `fs::write` would (a regular file, in tests, is made).
    fn write(&self, file: &str, value: &str) -> Result<(), CgroupError> {
        use nix::fcntl::OFlag;
        self.write_flags(file, value, OFlag::O_CREAT | OFlag::O_TRUNC)
            .map(drop)
    }

    /// Writes `value` to `file` if there is such a file; whether there was.
    fn write_if_there(&self, file: &str, value: &str) -> Result<bool, CgroupError> {
        self.write_flags(file, value, nix::fcntl::OFlag::empty())
    }

    fn write_flags(
        &self,
        file: &str,
        value: &str,
        flags: nix::fcntl::OFlag,
    ) -> Result<bool, CgroupError> {
        use std::io::Write;
        let written = match self.open(file, nix::fcntl::OFlag::O_WRONLY | flags) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && !flags.is_empty() => Err(e),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            opened => opened.and_then(|fd| fs::File::from(fd).write_all(value.as_bytes())),
        };
        written.map(|()| true).map_err(|source| CgroupError::Write {
            path: self.path.join(file),
            value: value.to_owned(),
            source,
        })
    }

    /// Gives `file` to the host ids `id` (uid and gid).
    fn chown(&self, file: &str, id: u32) -> Result<(), CgroupError> {
        use nix::unistd::{fchownat, Gid, Uid};
        let (uid, gid) = (Some(Uid::from_raw(id)), Some(Gid::from_raw(id)));
        let flag = nix::fcntl::AtFlags::empty();
        match &self.at {
            Some((fd, rel)) => fchownat(fd, &rel.join(file), uid, gid, flag),
            None => nix::unistd::chown(&self.path.join(file), uid, gid),
        }
        .map_err(|e| CgroupError::Write {
            path: self.path.join(file),
            value: format!("owner {id}"),
            source: e.into(),
        })
    }
}

/// What the kernel counted for one sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub cpu: Option<Duration>,
    pub memory_peak_bytes: Option<u64>,
    pub oom_kills: u64,
    pub pids_limit_hits: u64,
}

/// One sandbox's cgroup (one directory per v1 hierarchy). Dropping it kills what is left
/// inside and removes the directories.
#[derive(Debug)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    dirs: Vec<Dir>,
    /// v2, a zygote's: the tree the directory is a leaf of, removed with the last leaf.
    tree: Option<Dir>,
    removed: bool,
}

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

impl SandboxCgroup {
    /// Creates the cgroup and writes every limit before any process enters it.
    pub fn create(layout: &Layout, limits: &Limits, extra_pids: u32) -> Result<Self, CgroupError> {
        Self::create_tagged(layout, limits, extra_pids, "")
    }

    /// As `create`, named `airlock-<pid>-<tag><n>` (a zygote's template: `zygote-`).
    pub(crate) fn create_tagged(
        layout: &Layout,
        limits: &Limits,
        extra_pids: u32,
        tag: &str,
    ) -> Result<Self, CgroupError> {
        loop {
            let name = format!(
                "{SANDBOX_PREFIX}{}-{tag}{}",
                std::process::id(),
                SEQUENCE.fetch_add(1, Ordering::Relaxed)
            );
            let mut cg = SandboxCgroup {
                version: layout.version(),
                dirs: Vec::new(),
                tree: None,
                removed: false,
            };
            let mut taken = false;
            for parent in layout.parents() {
                let dir = Dir::beneath(&parent, &name);
                match dir.make() {
                    Ok(()) => cg.dirs.push(dir),
                    // Left by an earlier airlock that had our pid: take the next name. `cg`
                    // removes what this attempt made.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        taken = true;
                        break;
                    }
                    Err(source) => {
                        return Err(CgroupError::Create {
                            path: dir.path,
                            source,
                        })
                    }
                }
            }
            if !taken {
                cg.set_limits(layout, limits, extra_pids)?;
                return Ok(cg);
            }
        }
    }

    /// A zygote's template's cgroup. On v1, as any sandbox's. On v2, a tree of its own,
    /// `airlock-<pid>-zygote-<n>`, that hands the controllers down, with the template in its
    /// leaf `template` (carrying `limits`) and each child in a leaf beside it
    /// ([`SandboxCgroup::create_in_tree`]): the tree is the nearest common ancestor of the
    /// zygote's cgroup and its children's, so that, delegated to the template's ids
    /// ([`SandboxCgroup::delegate`]), the zygote can clone each child straight into its
    /// cgroup (`CLONE_INTO_CGROUP`) and into none outside the tree.
    pub(crate) fn create_for_zygote(
        layout: &Layout,
        limits: &Limits,
        extra_pids: u32,
    ) -> Result<Self, CgroupError> {
        let Layout::V2 { dir: parent } = layout else {
            return Self::create_tagged(layout, limits, extra_pids, "zygote-");
        };
        let prefix = format!("{SANDBOX_PREFIX}{}-zygote-", std::process::id());
        let tree = fresh_dir(|name| Dir::beneath(parent, name), &prefix)?;
        let controllers: Vec<String> = V2_CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
        let cg = Self::tree_with_leaf(tree, &controllers.join(" "), ZYGOTE_TEMPLATE_LEAF)?;
        cg.set_limits_v2(limits, extra_pids)?;
        Ok(cg)
    }

    /// Makes `tree` (just created) hand `controllers` down (`+memory +pids ...`, none when
    /// empty), and its first leaf `leaf`: the leaf's cgroup, which removes both.
    fn tree_with_leaf(tree: Dir, controllers: &str, leaf: &str) -> Result<Self, CgroupError> {
        let mut cg = SandboxCgroup {
            version: CgroupVersion::V2,
            dirs: Vec::new(),
            tree: Some(tree.clone()),
            removed: false,
        };
        if !controllers.is_empty() {
            tree.write("cgroup.subtree_control", controllers)?;
        }
        let leaf = tree.child(leaf);
        leaf.make().map_err(|source| CgroupError::Create {
            path: leaf.path.clone(),
            source,
        })?;
        cg.dirs.push(leaf);
        Ok(cg)
    }

    /// A leaf beside this one in its zygote's tree (v2), with `limits`: a child's cgroup.
    pub(crate) fn create_in_tree(
        &self,
        limits: &Limits,
        extra_pids: u32,
    ) -> Result<Self, CgroupError> {
        let cg = self.leaf_in_tree()?;
        cg.set_limits_v2(limits, extra_pids)?;
        Ok(cg)
    }

    fn leaf_in_tree(&self) -> Result<Self, CgroupError> {
        let Some(tree) = &self.tree else {
            return Err(CgroupError::Unusable(
                "not a zygote's cgroup v2 tree".into(),
            ));
        };
        Ok(SandboxCgroup {
            version: CgroupVersion::V2,
            dirs: vec![fresh_dir(|name| tree.child(name), "child-")?],
            tree: Some(tree.clone()),
            removed: false,
        })
    }

    /// The zygote tree this cgroup is a leaf of (v2).
    pub(crate) fn tree(&self) -> Option<&Path> {
        self.tree.as_ref().map(|t| t.path.as_path())
    }

    /// Gives the host ids `id` (uid and gid) the right to move processes into this cgroup:
    /// its `cgroup.procs`, and nothing else of it (limits stay root's).
    pub(crate) fn delegate(&self, id: u32) -> Result<(), CgroupError> {
        self.dirs
            .iter()
            .try_for_each(|d| d.chown("cgroup.procs", id))
    }

    /// Gives the host ids `id` what the kernel asks of whoever moves a process between two
    /// leaves of this cgroup's zygote tree (v2), besides the right to the destination: the
    /// right to the tree's `cgroup.procs`.
    pub(crate) fn delegate_tree(&self, id: u32) -> Result<(), CgroupError> {
        self.tree
            .iter()
            .try_for_each(|d| d.chown("cgroup.procs", id))
    }

    /// The cgroup's directory (v2), opened for `CLONE_INTO_CGROUP`.
    pub(crate) fn open_dir(&self) -> Result<OwnedFd, CgroupError> {
        use nix::fcntl::OFlag;
        let dir = &self.dirs[0];
        dir.open("", OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|source| CgroupError::Read {
                path: dir.path.clone(),
                source,
            })
    }

    fn set_limits_v2(&self, limits: &Limits, extra_pids: u32) -> Result<(), CgroupError> {
        let dir = &self.dirs[0];
        let (mem, pids, quota) = limit_values(limits, extra_pids);
        dir.write("memory.max", &mem)?;
        // Swap off, where the kernel accounts swap (else there is no such file).
        dir.write_if_there("memory.swap.max", "0")?;
        dir.write("pids.max", &pids)?;
        dir.write("cpu.max", &format!("{quota} 100000"))
    }

    fn set_limits(
        &self,
        layout: &Layout,
        limits: &Limits,
        extra_pids: u32,
    ) -> Result<(), CgroupError> {
        let Layout::V1 {
            memory,
            pids: pids_dir,
            cpu,
            ..
        } = layout
        else {
            return self.set_limits_v2(limits, extra_pids);
        };
        let (mem, pids, quota) = limit_values(limits, extra_pids);
        let here = |parent: &Path| {
            self.dirs
                .iter()
                .find(|d| d.path.parent() == Some(parent))
                .ok_or_else(|| CgroupError::Unusable(format!("no cgroup in {}", parent.display())))
        };
        let memory = here(memory)?;
        memory.write("memory.limit_in_bytes", &mem)?;
        // Swap off: memory+swap capped at the memory limit. Without swap accounting,
        // swappiness 0 keeps anonymous memory out of swap.
        // Whether the kernel accounts swap is the same for every cgroup: looked up once.
        static SWAP_ACCOUNTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let memsw = "memory.memsw.limit_in_bytes";
        let accounted = SWAP_ACCOUNTED.get_or_init(|| memory.path.join(memsw).exists());
        if *accounted {
            memory.write(memsw, &mem)?;
        } else {
            memory.write("memory.swappiness", "0")?;
        }
        here(pids_dir)?.write("pids.max", &pids)?;
        // The period is a new cgroup's default, 100 ms (`limit_values` counts on it).
        here(cpu)?.write("cpu.cfs_quota_us", &quota.to_string())?;
        Ok(())
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// On v1, the `tasks` files through which a single-threaded process moves itself into
    /// the cgroup by writing `0`. The kernel skips its global lock for a thread that moves
    /// itself, where moving another process (`cgroup.procs`) waits for an RCU grace period:
    /// 7-22 ms here, the largest part of starting a sandbox. On v2 moving oneself takes the
    /// same lock, so there the host moves the process.
    pub(crate) fn self_join_files(&self) -> Option<Vec<PathBuf>> {
        (self.version == CgroupVersion::V1).then(|| {
            self.dirs
                .iter()
                .map(|d| d.path.join(JOIN_FILE_V1))
                .collect()
        })
    }

    /// The files through which a process joins the cgroup by writing `0` (on v1 each
    /// hierarchy's `tasks`, see [`SandboxCgroup::self_join_files`]; on v2 `cgroup.procs`),
    /// opened for writing by the host for a process without the rights to open them.
    pub(crate) fn open_for_joining(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        let file = match self.version {
            CgroupVersion::V1 => JOIN_FILE_V1,
            CgroupVersion::V2 => "cgroup.procs",
        };
        self.dirs
            .iter()
            .map(|d| {
                d.open(file, nix::fcntl::OFlag::O_WRONLY)
                    .map_err(|source| CgroupError::Write {
                        path: d.path.join(file),
                        value: "(opening it to join)".into(),
                        source,
                    })
            })
            .collect()
    }

    /// Sets the sandbox's CPU weight against everything else on the host: the lowest there is
    /// (`background`), or the kernel's default, which every other sandbox keeps. The quota
    /// (`cpu_millicores`) is unchanged either way.
    pub fn set_cpu_weight(&self, background: bool) -> Result<(), CgroupError> {
        let (name, value) = match (self.version, background) {
            (CgroupVersion::V1, true) => ("cpu.shares", "2"),
            (CgroupVersion::V1, false) => ("cpu.shares", "1024"),
            (CgroupVersion::V2, true) => ("cpu.weight", "1"),
            (CgroupVersion::V2, false) => ("cpu.weight", "100"),
        };
        // Said as the controller's own directory answered, if no other has the file.
        let mut first_error = None;
        for dir in self.by_controller(name) {
            match dir.write(name, value) {
                Ok(()) => return Ok(()),
                Err(e) => drop(first_error.get_or_insert(e)),
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The same directories, read-only: dropping the view removes nothing.
    pub(crate) fn view(&self) -> SandboxCgroup {
        SandboxCgroup {
            version: self.version,
            dirs: self.dirs.clone(),
            tree: self.tree.clone(),
            removed: true,
        }
    }

    /// Moves a process (and so everything it will start) into the cgroup.
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        for dir in &self.dirs {
            dir.write("cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// A counter file's text. Opened at once, first in the directory whose path names the
    /// file's controller (`memory.peak`: `.../memory/...`), then in the others: no `stat` of
    /// each candidate first, as counters are read several times an execution.
    fn read_file(&self, name: &str) -> Option<String> {
        self.by_controller(name)
            .into_iter()
            .find_map(|d| d.read(name).ok())
    }

    /// The directories, those whose path names the controller of file `name` first (v1 keeps
    /// each controller's files in that controller's hierarchy).
    fn by_controller(&self, name: &str) -> Vec<&Dir> {
        let controller = format!("/{}", name.split('.').next().unwrap_or(name));
        let named = |d: &&Dir| d.path.to_str().is_some_and(|s| s.contains(&controller));
        let (mut first, rest): (Vec<&Dir>, Vec<&Dir>) = self.dirs.iter().partition(named);
        first.extend(rest);
        first
    }

    fn read_value(&self, name: &str) -> Option<u64> {
        self.read_file(name)?.trim().parse().ok()
    }

    fn read_keyed(&self, name: &str, key: &str) -> Option<u64> {
        let text = self.read_file(name)?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// CPU time used so far by every process of the sandbox.
    pub fn cpu_usage(&self) -> Option<Duration> {
        match self.version {
            CgroupVersion::V1 => self.read_value("cpuacct.usage").map(Duration::from_nanos),
            CgroupVersion::V2 => self
                .read_keyed("cpu.stat", "usage_usec")
                .map(Duration::from_micros),
        }
    }

    pub fn stats(&self) -> Stats {
        let (peak, oom) = match self.version {
            CgroupVersion::V1 => (
                self.read_value("memory.max_usage_in_bytes"),
                self.read_keyed("memory.oom_control", "oom_kill"),
            ),
            CgroupVersion::V2 => (
                self.read_value("memory.peak"),
                self.read_keyed("memory.events", "oom_kill"),
            ),
        };
        Stats {
            cpu: self.cpu_usage(),
            memory_peak_bytes: peak,
            oom_kills: oom.unwrap_or(0),
            pids_limit_hits: self.read_keyed("pids.events", "max").unwrap_or(0),
        }
    }

    /// Every process in the cgroup, once (on v1 each hierarchy lists them all).
    pub fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs
            .iter()
            .filter_map(|d| d.read("cgroup.procs").ok())
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// SIGKILLs every process still inside, until none is left; true when none is.
    pub fn kill_all(&self) -> bool {
        if self.version == CgroupVersion::V2 {
            if let Some(dir) = self.dirs.first() {
                if dir.write_if_there("cgroup.kill", "1").unwrap_or(false) {
                    return self.pids().is_empty();
                }
            }
        }
        // v1 (and v2 before 5.14): a sandbox's processes live in a PID namespace whose init
        // dying takes them all, so a few rounds always suffice; a fork bomb cannot outrun it.
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return true;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.pids().is_empty()
    }

    /// Kills what is left and removes the directories.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.remove_dirs(0)
    }

    /// Removes the directories, retrying while they are busy; from the `kill_from`th try on
    /// (and every tenth after), kills what is left first. A cgroup whose last process is on
    /// its way out (its PID namespace's teardown) needs no kill, only a few more tries:
    /// `kill_all` reads every hierarchy's process list each millisecond meanwhile.
    fn remove_dirs(&mut self, kill_from: usize) -> Result<(), CgroupError> {
        if self.removed {
            return Ok(());
        }
        let mut last = None;
        for attempt in 0..500 {
            last = None;
            for dir in &self.dirs {
                match dir.remove() {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => last = Some((dir.path.clone(), e)),
                }
            }
            if last.is_none() {
                break;
            }
            if attempt >= kill_from && attempt % 10 == kill_from % 10 {
                self.kill_all();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.removed = true;
        if let (None, Some(tree)) = (&last, &self.tree) {
            // Fails while a sibling leaf is left: the last leaf's removal takes the tree.
            let _ = tree.remove();
        }
        match last {
            None => Ok(()),
            Some((path, source)) => Err(CgroupError::Remove { path, source }),
        }
    }
}

impl Drop for SandboxCgroup {
    fn drop(&mut self) {
        let _ = self.remove_dirs(0);
    }
}

/// Removal of empty sandbox cgroups off an execution's critical path: `rmdir` of a v1 memory
/// cgroup waits for an RCU grace period, several milliseconds that the answer need not wait
/// for. Only cgroups whose processes are all gone are handed over; what a crash leaves behind
/// is swept by [`remove_leftovers`] at the next start.
struct Janitor {
    state: std::sync::Mutex<JanitorState>,
    done: std::sync::Condvar,
}

struct JanitorState {
    /// None when its thread could not be started: removal then happens in line.
    queue: Option<std::sync::mpsc::Sender<SandboxCgroup>>,
    pending: usize,
}

/// How many times the background tries to remove a cgroup before it kills what is inside.
const RETRIES_BEFORE_KILL: usize = 10;

/// Beyond this many waiting removals, removal happens in line again (back-pressure).
const MAX_PENDING_REMOVALS: usize = 64;

static JANITOR: std::sync::OnceLock<Janitor> = std::sync::OnceLock::new();
static CLEANUP_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Cgroups the background removal failed to remove (swept at the next start instead).
pub fn cleanup_failures() -> u64 {
    CLEANUP_FAILURES.load(Ordering::Relaxed)
}

fn janitor() -> &'static Janitor {
    JANITOR.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SandboxCgroup>();
        let spawned = std::thread::Builder::new()
            .name("airlock-cgroup-janitor".into())
            .spawn(move || {
                for mut cg in rx {
                    // Only empty cgroups, or ones whose last process is already killed,
                    // come here: killing is for one still busy after ~10 tries (20 ms).
                    if cg.remove_dirs(RETRIES_BEFORE_KILL).is_err() {
                        CLEANUP_FAILURES.fetch_add(1, Ordering::Relaxed);
                    }
                    let j = janitor();
                    j.state.lock().unwrap_or_else(|e| e.into_inner()).pending -= 1;
                    j.done.notify_all();
                }
            });
        Janitor {
            state: std::sync::Mutex::new(JanitorState {
                queue: spawned.ok().map(|_| tx),
                pending: 0,
            }),
            done: std::sync::Condvar::new(),
        }
    })
}

impl SandboxCgroup {
    /// Removes the (empty) cgroup in the background; in line when the background is busy or
    /// unavailable.
    pub(crate) fn remove_later(self) -> Result<(), CgroupError> {
        let mut state = janitor().state.lock().unwrap_or_else(|e| e.into_inner());
        let room = state.pending < MAX_PENDING_REMOVALS;
        let sent = match &state.queue {
            Some(tx) if room => tx.send(self).map_err(|back| back.0),
            _ => Err(self),
        };
        match sent {
            Ok(()) => {
                state.pending += 1;
                Ok(())
            }
            Err(cg) => {
                drop(state);
                cg.remove()
            }
        }
    }
}

/// Waits until every cgroup handed to the background has been removed: call before exiting.
pub fn settle() {
    let Some(j) = JANITOR.get() else {
        return;
    };
    let mut state = j.state.lock().unwrap_or_else(|e| e.into_inner());
    while state.pending > 0 {
        state = j.done.wait(state).unwrap_or_else(|e| e.into_inner());
    }
}

/// Removes sandbox cgroups that a crashed airlock left behind beneath `layout`: those whose
/// name carries a pid that is no longer an airlock process. Returns the paths removed.
pub fn remove_leftovers(layout: &Layout) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for parent in layout.parents() {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(owner) = name
                .strip_prefix(SANDBOX_PREFIX)
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if Path::new(&format!("/proc/{owner}")).exists() {
                continue;
            }
            // A zygote's tree (v2) goes leaves first.
            let mut dirs = Vec::new();
            dirs_beneath(&entry.path(), &mut dirs);
            dirs.push(entry.path());
            let mut cg = SandboxCgroup {
                version: layout.version(),
                dirs: dirs.into_iter().map(Dir::by_path).collect(),
                tree: None,
                removed: false,
            };
            if cg.remove_dirs(0).is_ok() {
                removed.push(entry.path());
            }
        }
    }
    removed
}

/// How a new process can come to be in a cgroup v2, timed by [`time_v2_placements`].
#[cfg(feature = "bench")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Forked, then moves itself by writing `0` to the cgroup's `cgroup.procs` (what a
    /// zygote's child does when its zygote has a thread of its own).
    ForkAndJoin,
    /// Born there: `clone3` with `CLONE_INTO_CGROUP` (what a zygote does on v2).
    CloneInto,
    /// A plain fork that stays where it is, for comparison.
    Fork,
}

/// For the bench: on the cgroup2 mount `mount` (which needs no controller for this), makes a
/// leaf and times each [`Placement`] `rounds` times, interleaved, `gap` apart (a join waits
/// for an RCU grace period unless another began just before: an agent's requests come
/// apart), from the call until the child, which only exits, has been waited for.
#[cfg(feature = "bench")]
pub fn time_v2_placements(
    mount: &Path,
    rounds: usize,
    gap: Duration,
) -> Result<Vec<(Placement, Vec<Duration>)>, CgroupError> {
    use std::os::fd::AsFd;
    let prefix = format!("{SANDBOX_PREFIX}{}-placements-", std::process::id());
    let tree = fresh_dir(|name| Dir::beneath(mount, name), &prefix)?;
    let leaf = SandboxCgroup::tree_with_leaf(tree, "", "leaf")?;
    let dir = leaf.open_dir()?;
    let procs = leaf.open_for_joining()?.remove(0);
    let failed = |e: io::Error| CgroupError::Unusable(format!("timing placements: {e}"));
    let mut times = [
        (Placement::ForkAndJoin, Vec::new()),
        (Placement::CloneInto, Vec::new()),
        (Placement::Fork, Vec::new()),
    ];
    for _ in 0..rounds {
        for (how, samples) in &mut times {
            std::thread::sleep(gap);
            let started = std::time::Instant::now();
            // The children make raw calls only: the caller may have other threads.
            let pid = match how {
                Placement::CloneInto => {
                    match crate::sys::fork_into_namespaces(0, Some(dir.as_fd())).map_err(failed)? {
                        None => crate::sys::exit_immediately(0),
                        Some((pid, _)) => pid,
                    }
                }
                Placement::ForkAndJoin | Placement::Fork => {
                    match crate::sys::fork().map_err(|e| failed(e.into()))? {
                        nix::unistd::ForkResult::Child => {
                            let joined =
                                *how == Placement::Fork || nix::unistd::write(&procs, b"0").is_ok();
                            crate::sys::exit_immediately(if joined { 0 } else { 1 })
                        }
                        nix::unistd::ForkResult::Parent { child } => child.as_raw(),
                    }
                }
            };
            match crate::sys::wait_child(pid).map_err(failed)?.1 {
                crate::sys::Waited::Exited(0) => samples.push(started.elapsed()),
                how => return Err(failed(io::Error::other(format!("the child: {how:?}")))),
            }
        }
    }
    drop(leaf);
    Ok(times.into())
}

/// Every cgroup beneath `dir`, deepest first.
fn dirs_beneath(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            dirs_beneath(&entry.path(), found);
            found.push(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    const V1_MOUNTINFO: &str = "\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";

    const V1_OWN: &str = "\
8:pids:/
4:memory:/process_api/abc
1:cpu,cpuacct:/user.slice
0::/";

    fn detect_text(
        mountinfo: &str,
        own: &str,
        v2_controllers: &str,
    ) -> Result<Layout, CgroupError> {
        let ctl = v2_controllers.to_owned();
        detect_from(
            &parse_mountinfo(mountinfo),
            &parse_proc_cgroup(own),
            move |_| Some(ctl.clone()),
        )
    }

    #[test]
    fn v1_when_unified_lacks_controllers() {
        let layout = detect_text(V1_MOUNTINFO, V1_OWN, "hugetlb").unwrap();
        assert_eq!(
            layout,
            Layout::V1 {
                memory: "/sys/fs/cgroup/memory/process_api/abc".into(),
                pids: "/sys/fs/cgroup/pids".into(),
                cpu: "/sys/fs/cgroup/cpu,cpuacct/user.slice".into(),
                cpuacct: "/sys/fs/cgroup/cpu,cpuacct/user.slice".into(),
            }
        );
        assert_eq!(
            layout.parents().len(),
            3,
            "co-mounted cpu,cpuacct counted once"
        );
    }

    #[test]
    fn v2_when_unified_has_controllers() {
        let mountinfo = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate";
        let own = "0::/system.slice/airlock.service";
        let layout = detect_text(mountinfo, own, "cpuset cpu io memory pids").unwrap();
        assert_eq!(
            layout,
            Layout::V2 {
                dir: "/sys/fs/cgroup/system.slice/airlock.service".into()
            }
        );
    }

    #[test]
    fn v2_supervisor_leaf_maps_back_to_its_parent() {
        let mountinfo = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
        let own = "0::/app.scope/airlock-supervisor";
        let layout = detect_text(mountinfo, own, "memory pids cpu").unwrap();
        assert_eq!(
            layout,
            Layout::V2 {
                dir: "/sys/fs/cgroup/app.scope".into()
            }
        );
    }

    #[test]
    fn cgroup_namespace_roots_are_stripped() {
        let mountinfo = "30 1 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
        let own = "0::/kubepods/pod1/ctr";
        let layout = detect_text(mountinfo, own, "memory pids cpu").unwrap();
        assert_eq!(
            layout,
            Layout::V2 {
                dir: "/sys/fs/cgroup/ctr".into()
            }
        );
    }

    #[test]
    fn missing_controllers_are_named() {
        let mountinfo = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory";
        let err = detect_text(mountinfo, "4:memory:/", "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no cgroup2 mount"), "{err}");
        assert!(err.contains("pids, cpu, cpuacct"), "{err}");
    }

    /// 64 MiB, 10 processes (12 with the two of the sandbox's own), 1.5 CPUs.
    fn test_limits() -> Limits {
        Limits {
            memory_bytes: 64 << 20,
            pids: 10,
            cpu_millicores: 1500,
            ..Limits::default()
        }
    }

    #[test]
    fn v1_limits_are_what_this_host_s_kernel_reads_back() {
        // The real hierarchies, where there are v1 ones and we may make cgroups in them.
        let Ok(layout @ Layout::V1 { .. }) = detect() else {
            return;
        };
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let limits = test_limits();
        let cg = SandboxCgroup::create(&layout, &limits, 2).unwrap();
        let read = |name: &str| {
            cg.read_file(name)
                .unwrap_or_else(|| panic!("{name} unreadable"))
                .trim()
                .to_owned()
        };
        assert_eq!(read("memory.limit_in_bytes"), (64u64 << 20).to_string());
        assert_eq!(read("pids.max"), "12");
        // 1.5 CPUs: 150 ms of every 100 ms period (the period is a new cgroup's default).
        assert_eq!(read("cpu.cfs_quota_us"), "150000");
        assert_eq!(read("cpu.cfs_period_us"), "100000");
        // Made, written and removed through the parents' descriptors, which no program
        // started from here inherits.
        for dir in &cg.dirs {
            let (fd, rel) = dir.at.as_ref().expect("a parent's descriptor");
            assert_eq!(rel, Path::new(dir.path.file_name().unwrap()));
            let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
            assert_ne!(flags & libc::FD_CLOEXEC, 0);
        }
        let paths: Vec<PathBuf> = cg.dirs.iter().map(|d| d.path.clone()).collect();
        assert!(paths.iter().all(|p| p.is_dir()));
        cg.remove().unwrap();
        assert!(paths.iter().all(|p| !p.exists()), "{paths:?}");
    }

    /// A directory laid out like a cgroup v2 node: the controller files the kernel would have.
    fn fake_v2_node(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("airlock-cg-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for (file, contents) in files {
            fs::write(dir.join(file), contents).unwrap();
        }
        dir
    }

    #[test]
    fn v2_limits_and_counters_use_the_kernel_s_file_formats() {
        let parent = fake_v2_node("limits", &[]);
        let layout = Layout::V2 {
            dir: parent.clone(),
        };
        let limits = test_limits();
        // A real cgroup directory comes with its files; create the sandbox node the same way.
        let cg = SandboxCgroup::create(&layout, &limits, 2).unwrap();
        let dir = cg.dirs[0].path.clone();
        assert!(
            dir.starts_with(&parent)
                && dir
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with(SANDBOX_PREFIX)
        );
        let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(read("memory.max"), (64u64 << 20).to_string());
        assert_eq!(read("pids.max"), "12");
        assert_eq!(read("cpu.max"), "150000 100000");
        cg.set_cpu_weight(true).unwrap();
        assert_eq!(read("cpu.weight"), "1");
        cg.set_cpu_weight(false).unwrap();
        assert_eq!(read("cpu.weight"), "100");
        cg.add_process(4242).unwrap();
        assert_eq!(read("cgroup.procs"), "4242");
        fs::write(
            dir.join("cpu.stat"),
            "usage_usec 1500000\nuser_usec 1000000\n",
        )
        .unwrap();
        fs::write(dir.join("memory.peak"), "123456\n").unwrap();
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        )
        .unwrap();
        fs::write(dir.join("pids.events"), "max 7\n").unwrap();
        assert_eq!(
            cg.stats(),
            Stats {
                cpu: Some(Duration::from_millis(1500)),
                memory_peak_bytes: Some(123456),
                oom_kills: 1,
                pids_limit_hits: 7
            }
        );
        // Dropping it would kill the pids in cgroup.procs (4242 is some real process here).
        std::mem::forget(cg);
        fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn a_name_left_by_an_earlier_airlock_with_our_pid_is_skipped() {
        let parent = fake_v2_node("taken", &[]);
        let next = SEQUENCE.load(Ordering::Relaxed);
        for n in next..next + 3 {
            fs::create_dir(parent.join(format!("{SANDBOX_PREFIX}{}-{n}", std::process::id())))
                .unwrap();
        }
        let cg = SandboxCgroup::create(
            &Layout::V2 {
                dir: parent.clone(),
            },
            &Limits::default(),
            2,
        )
        .unwrap();
        let name = cg.dirs[0]
            .path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let seq: u64 = name.rsplit('-').next().unwrap().parse().unwrap();
        assert!(seq >= next + 3, "{name} reuses a taken name");
        std::mem::forget(cg);
        fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn v2_delegation_moves_airlock_into_a_leaf_then_enables_controllers() {
        let dir = fake_v2_node("delegate", &[("cgroup.subtree_control", "")]);
        prepare(&Layout::V2 { dir: dir.clone() }).unwrap();
        let moved = fs::read_to_string(dir.join(V2_SUPERVISOR_LEAF).join("cgroup.procs")).unwrap();
        assert_eq!(moved, std::process::id().to_string());
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids +cpu"
        );
        // Already delegated: nothing is touched.
        let done = fake_v2_node(
            "delegated",
            &[("cgroup.subtree_control", "cpu memory pids")],
        );
        prepare(&Layout::V2 { dir: done.clone() }).unwrap();
        assert!(!done.join(V2_SUPERVISOR_LEAF).exists());
        fs::remove_dir_all(&dir).unwrap();
        fs::remove_dir_all(&done).unwrap();
    }

    #[test]
    fn a_zygote_s_v2_tree_hands_the_controllers_down_and_holds_its_leaves() {
        let parent = fake_v2_node("zygote", &[]);
        let layout = Layout::V2 {
            dir: parent.clone(),
        };
        let limits = Limits {
            memory_bytes: 64 << 20,
            pids: 10,
            ..Limits::default()
        };
        let template = SandboxCgroup::create_for_zygote(&layout, &limits, 2).unwrap();
        let tree = template.tree().unwrap().to_owned();
        let name = tree.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.starts_with(&format!("{SANDBOX_PREFIX}{}-zygote-", std::process::id())));
        assert_eq!(tree.parent(), Some(parent.as_path()));
        let read = |p: PathBuf| fs::read_to_string(p).unwrap();
        assert_eq!(
            read(tree.join("cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        assert_eq!(template.dirs[0].path, tree.join(ZYGOTE_TEMPLATE_LEAF));
        assert_eq!(read(template.dirs[0].path.join("pids.max")), "12");
        // A child's leaf beside it, with the child's limits.
        let small = Limits { pids: 3, ..limits };
        let child = template.create_in_tree(&small, 1).unwrap();
        assert_eq!(child.dirs[0].path.parent(), Some(tree.as_path()));
        assert_eq!(child.tree(), Some(tree.as_path()));
        assert_eq!(read(child.dirs[0].path.join("pids.max")), "4");
        assert_eq!(
            read(child.dirs[0].path.join("memory.max")),
            (64u64 << 20).to_string()
        );
        // v1 has no tree: a zygote's cgroup is any sandbox's.
        let v1 = SandboxCgroup::create(&layout, &limits, 2).unwrap();
        assert!(v1.tree().is_none() && v1.create_in_tree(&limits, 1).is_err());
        for cg in [template, child, v1] {
            std::mem::forget(cg);
        }
        fs::remove_dir_all(&parent).unwrap();
    }

    /// The cgroup2 mount, where this host has one (here it carries no controller, which
    /// moving processes does not need).
    fn cgroup2_mount() -> PathBuf {
        let mounts = parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo").unwrap());
        mounts
            .into_iter()
            .find(|m| m.fs_type == "cgroup2")
            .expect("a cgroup2 mount")
            .mount_point
    }

    /// A tree on the real cgroup2 mount, as a zygote's but without controllers or limits.
    fn real_tree(name: &str) -> SandboxCgroup {
        let tree = cgroup2_mount().join(format!(
            "{SANDBOX_PREFIX}{}-zygote-test-{name}",
            std::process::id()
        ));
        let _ = fs::remove_dir(tree.join(ZYGOTE_TEMPLATE_LEAF));
        let _ = fs::remove_dir(&tree);
        fs::create_dir(&tree).unwrap();
        let name = tree.file_name().unwrap().to_str().unwrap().to_owned();
        let tree = Dir::beneath(&cgroup2_mount(), &name);
        SandboxCgroup::tree_with_leaf(tree, "", ZYGOTE_TEMPLATE_LEAF).unwrap()
    }

    /// From a process in `from`'s cgroup with host ids `id`, clones a child into the cgroup
    /// whose directory is `into`: what the child's /proc/self/cgroup says, or clone3's errno.
    /// (The forked processes make raw calls only: this test process has other threads.)
    fn clone_as(from: &SandboxCgroup, id: u32, into: &SandboxCgroup) -> Result<String, i32> {
        use nix::unistd::{read, write};
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(from.dirs[0].path.join("cgroup.procs"))
            .unwrap();
        let dir = into.open_dir().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        match crate::sys::fork().unwrap() {
            nix::unistd::ForkResult::Child => {
                drop(r);
                let ok = write(&procs, b"0").is_ok()
                    && nix::unistd::setgroups(&[]).is_ok()
                    && nix::unistd::setresgid(id.into(), id.into(), id.into()).is_ok()
                    && nix::unistd::setresuid(id.into(), id.into(), id.into()).is_ok();
                if !ok {
                    crate::sys::exit_immediately(2)
                }
                match crate::sys::fork_into_namespaces(0, Some(dir.as_fd())) {
                    Ok(Some((pid, _))) => {
                        let _ = crate::sys::wait_child(pid);
                    }
                    Ok(None) => {
                        let mut buf = [0u8; 2048];
                        let file = nix::fcntl::open(
                            c"/proc/self/cgroup",
                            nix::fcntl::OFlag::O_RDONLY,
                            nix::sys::stat::Mode::empty(),
                        );
                        if let Ok(n) = file.and_then(|f| read(&f, &mut buf)) {
                            let _ = write(&w, &buf[..n]);
                        }
                    }
                    Err(e) => {
                        let errno = e.raw_os_error().unwrap_or(0) as u8;
                        let _ = write(&w, &[b'E', errno]);
                    }
                }
                crate::sys::exit_immediately(0)
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(w);
                let mut got = Vec::new();
                let mut buf = [0u8; 2048];
                while let Ok(n @ 1..) = read(&r, &mut buf) {
                    got.extend_from_slice(&buf[..n]);
                }
                let waited = crate::sys::wait_child(child.as_raw()).unwrap().1;
                assert!(
                    matches!(waited, crate::sys::Waited::Exited(0)),
                    "{waited:?}"
                );
                match got.as_slice() {
                    [b'E', errno] => Err(i32::from(*errno)),
                    text => Ok(String::from_utf8_lossy(text).into_owned()),
                }
            }
        }
    }

    /// Where the kernel says a process is on cgroup v2, from its /proc/<pid>/cgroup.
    fn v2_path(proc_cgroup: &str) -> &str {
        proc_cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or_default()
    }

    #[test]
    fn on_cgroup2_a_zygote_s_ids_clone_into_its_children_s_cgroups_and_no_other() {
        let mount = cgroup2_mount();
        let relative = |cg: &SandboxCgroup| {
            format!(
                "/{}",
                cg.dirs[0].path.strip_prefix(&mount).unwrap().display()
            )
        };
        let ours = 3_000_000_000 + std::process::id() * 2;
        let theirs = ours + 1;
        let (a, b) = (real_tree("a"), real_tree("b"));
        a.delegate_tree(ours).unwrap();
        b.delegate_tree(theirs).unwrap();
        let child = a.leaf_in_tree().unwrap();
        child.delegate(ours).unwrap();
        let not_given = a.leaf_in_tree().unwrap();
        let other = b.leaf_in_tree().unwrap();
        other.delegate(theirs).unwrap();
        // The zygote's ids, from its leaf: into its child's cgroup, born there.
        let seen = clone_as(&a, ours, &child).expect("cloned into the child's cgroup");
        assert_eq!(v2_path(&seen), relative(&child), "{seen}");
        // Not into a leaf of its tree that is not given to it, nor into another zygote's
        // child, nor with a child's ids (the block's next) into its own child's.
        assert_eq!(clone_as(&a, ours, &not_given), Err(libc::EACCES));
        assert_eq!(clone_as(&a, ours, &other), Err(libc::EACCES));
        assert_eq!(clone_as(&a, ours + 1, &child), Err(libc::EACCES));
        // The other zygote, into its own.
        let seen = clone_as(&b, theirs, &other).expect("the other zygote's own");
        assert_eq!(v2_path(&seen), relative(&other));
        // A tree goes with its last leaf, whichever that is.
        let (tree_a, tree_b) = (a.tree().unwrap().to_owned(), b.tree().unwrap().to_owned());
        drop((a, not_given));
        assert!(tree_a.exists(), "a child's leaf is left");
        drop(child);
        assert!(!tree_a.exists());
        drop(other);
        assert!(tree_b.exists(), "the template's leaf is left");
        drop(b);
        assert!(!tree_b.exists());
    }

    #[test]
    fn fork_into_cgroup_births_the_child_there_with_its_own_thread_id_in_glibc() {
        let mount = cgroup2_mount();
        let tree = real_tree("fork");
        let glibc = crate::sys::ForkAsLibc::of_this_thread().unwrap();
        assert_eq!(glibc.cached_tid(), nix::unistd::gettid().as_raw());
        let dir = tree.open_dir().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let (go_r, go_w) = nix::unistd::pipe().unwrap();
        let pid = crate::sys::fork_into_cgroup(dir.as_fd(), &glibc).unwrap();
        if pid == 0 {
            // Raw calls only (see `clone_as`).
            drop((r, go_w));
            let mut ids = [0u8; 8];
            ids[..4].copy_from_slice(&glibc.cached_tid().to_le_bytes());
            ids[4..].copy_from_slice(&nix::unistd::gettid().as_raw().to_le_bytes());
            let _ = nix::unistd::write(&w, &ids);
            let _ = nix::unistd::read(&go_r, &mut ids);
            crate::sys::exit_immediately(0)
        }
        drop((w, go_r));
        let mut ids = [0u8; 8];
        assert_eq!(nix::unistd::read(&r, &mut ids), Ok(8));
        let cached = i32::from_le_bytes(ids[..4].try_into().unwrap());
        let real = i32::from_le_bytes(ids[4..].try_into().unwrap());
        assert_eq!((cached, real), (pid, pid), "glibc's thread id in the child");
        let seen = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let leaf = &tree.dirs[0].path;
        assert_eq!(
            v2_path(&seen),
            format!("/{}", leaf.strip_prefix(&mount).unwrap().display())
        );
        drop(go_w);
        let waited = crate::sys::wait_child(pid).unwrap().1;
        assert!(
            matches!(waited, crate::sys::Waited::Exited(0)),
            "{waited:?}"
        );
        // Ours is as it was.
        assert_eq!(glibc.cached_tid(), nix::unistd::gettid().as_raw());
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b\134c"), r"/a b\c");
        assert_eq!(unescape(r"/x\0"), r"/x\0");
    }
}
