//! cgroup v1 and v2: one cgroup per sandbox, created beneath the cgroup airlock itself runs in
//! (never by writing into a hierarchy's root), limited before the sandbox's first process
//! enters it, read for the verdict, and removed afterwards.
//!
//! v2 is used when the unified hierarchy offers `memory`, `pids` and `cpu` to our cgroup;
//! otherwise v1, when `memory`, `pids`, `cpu` and `cpuacct` hierarchies are all mounted.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    dirs: Vec<PathBuf>,
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
                removed: false,
            };
            let mut taken = false;
            for parent in layout.parents() {
                let dir = parent.join(&name);
                match fs::create_dir(&dir) {
                    Ok(()) => cg.dirs.push(dir),
                    // Left by an earlier airlock that had our pid: take the next name. `cg`
                    // removes what this attempt made.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        taken = true;
                        break;
                    }
                    Err(source) => return Err(CgroupError::Create { path: dir, source }),
                }
            }
            if !taken {
                cg.set_limits(layout, limits, extra_pids)?;
                return Ok(cg);
            }
        }
    }

    fn set_limits(
        &self,
        layout: &Layout,
        limits: &Limits,
        extra_pids: u32,
    ) -> Result<(), CgroupError> {
        let pids = (u64::from(limits.pids) + u64::from(extra_pids)).to_string();
        let mem = limits.memory_bytes.to_string();
        let quota = u64::from(limits.cpu_millicores) * 100; // per 100 ms period
        let here = |parent: &Path| parent.join(self.dirs[0].file_name().unwrap_or_default());
        match layout {
            Layout::V1 {
                memory,
                pids: pids_dir,
                cpu,
                ..
            } => {
                let memory = here(memory);
                write(&memory.join("memory.limit_in_bytes"), &mem)?;
                // Swap off: memory+swap capped at the memory limit. Without swap accounting,
                // swappiness 0 keeps anonymous memory out of swap.
                let memsw = memory.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, &mem)?;
                } else {
                    write(&memory.join("memory.swappiness"), "0")?;
                }
                write(&here(pids_dir).join("pids.max"), &pids)?;
                let cpu = here(cpu);
                write(&cpu.join("cpu.cfs_period_us"), "100000")?;
                write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
            }
            Layout::V2 { .. } => {
                let dir = &self.dirs[0];
                write(&dir.join("memory.max"), &mem)?;
                let swap = dir.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                }
                write(&dir.join("pids.max"), &pids)?;
                write(&dir.join("cpu.max"), &format!("{quota} 100000"))?;
            }
        }
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
        (self.version == CgroupVersion::V1)
            .then(|| self.dirs.iter().map(|d| d.join("tasks")).collect())
    }

    /// The `cgroup.procs` file of each directory, where a process writes `0` to join.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
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
        let path = self.file(name).unwrap_or_else(|| self.dirs[0].join(name));
        write(&path, value)
    }

    /// The same directories, read-only: dropping the view removes nothing.
    pub(crate) fn view(&self) -> SandboxCgroup {
        SandboxCgroup {
            version: self.version,
            dirs: self.dirs.clone(),
            removed: true,
        }
    }

    /// Moves a process (and so everything it will start) into the cgroup.
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        for dir in &self.dirs {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// v1 keeps each controller's files in that controller's hierarchy.
    fn file(&self, name: &str) -> Option<PathBuf> {
        self.dirs.iter().map(|d| d.join(name)).find(|p| p.exists())
    }

    fn read_value(&self, name: &str) -> Option<u64> {
        fs::read_to_string(self.file(name)?)
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn read_keyed(&self, name: &str, key: &str) -> Option<u64> {
        let text = fs::read_to_string(self.file(name)?).ok()?;
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
            .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
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
            if let Some(kill) = self.dirs.first().map(|d| d.join("cgroup.kill")) {
                if fs::write(&kill, "1").is_ok() {
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
        self.remove_dirs()
    }

    fn remove_dirs(&mut self) -> Result<(), CgroupError> {
        if self.removed {
            return Ok(());
        }
        let mut last = None;
        for attempt in 0..500 {
            last = None;
            for dir in &self.dirs {
                match fs::remove_dir(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => last = Some((dir.clone(), e)),
                }
            }
            if last.is_none() {
                break;
            }
            if attempt % 10 == 0 {
                self.kill_all();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.removed = true;
        match last {
            None => Ok(()),
            Some((path, source)) => Err(CgroupError::Remove { path, source }),
        }
    }
}

impl Drop for SandboxCgroup {
    fn drop(&mut self) {
        let _ = self.remove_dirs();
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
                for cg in rx {
                    if cg.remove().is_err() {
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
            let mut cg = SandboxCgroup {
                version: layout.version(),
                dirs: vec![entry.path()],
                removed: false,
            };
            if cg.remove_dirs().is_ok() {
                removed.push(entry.path());
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let limits = Limits {
            memory_bytes: 64 << 20,
            pids: 10,
            cpu_millicores: 1500,
            ..Limits::default()
        };
        // A real cgroup directory comes with its files; create the sandbox node the same way.
        let cg = SandboxCgroup::create(&layout, &limits, 2).unwrap();
        let dir = cg.dirs[0].clone();
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
        let name = cg.dirs[0].file_name().unwrap().to_str().unwrap().to_owned();
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
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b\134c"), r"/a b\c");
        assert_eq!(unescape(r"/x\0"), r"/x\0");
    }
}
