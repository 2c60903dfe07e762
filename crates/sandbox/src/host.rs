//! What the host kernel offers, probed once per process. `spawn` refuses to run a policy that
//! requires something missing here; `airlock doctor` prints the same facts.

use std::fs;
use std::sync::OnceLock;

use crate::cgroup::{self, Layout};
use crate::seccomp::Filters;
use crate::sys;

/// The mechanisms a sandbox can use on this host; each [`Err`] says what is missing and why.
#[derive(Clone, Debug)]
pub struct HostSupport {
    pub kernel_release: String,
    pub arch: &'static str,
    pub running_as_root: bool,
    pub user_namespaces: Result<(), String>,
    pub seccomp: Result<(), String>,
    pub landlock_abi: Result<u32, String>,
    pub cgroup: Result<Layout, String>,
}

static SUPPORT: OnceLock<HostSupport> = OnceLock::new();

/// Probes the host once; later calls return the same answer.
pub fn host_support() -> &'static HostSupport {
    SUPPORT.get_or_init(probe)
}

fn read_trimmed(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn probe() -> HostSupport {
    let running_as_root = nix::unistd::geteuid().is_root();
    HostSupport {
        kernel_release: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        arch: std::env::consts::ARCH,
        running_as_root,
        user_namespaces: probe_userns(running_as_root),
        seccomp: probe_seccomp(),
        landlock_abi: sys::landlock_abi().map_err(|e| match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => "Landlock is built into the kernel but not enabled: add \
                `landlock` to the `lsm=` kernel command line"
                .to_owned(),
            Some(libc::ENOSYS) => "the kernel has no Landlock (needs Linux 5.13+ built with \
                CONFIG_SECURITY_LANDLOCK)"
                .to_owned(),
            _ => format!("landlock_create_ruleset: {e}"),
        }),
        cgroup: cgroup::detect()
            .and_then(|layout| cgroup::check_writable(&layout).map(|()| layout))
            .and_then(|layout| cgroup::prepare(&layout).map(|()| layout))
            .map_err(|e| e.to_string()),
    }
}

fn probe_userns(root: bool) -> Result<(), String> {
    match read_trimmed("/proc/sys/user/max_user_namespaces").as_deref() {
        None => return Err("the kernel has no user namespaces (CONFIG_USER_NS)".into()),
        Some("0") => {
            return Err(
                "user namespaces are disabled: set `sysctl user.max_user_namespaces` \
                above 0"
                    .into(),
            )
        }
        _ => {}
    }
    // As root, each sandbox's processes are a user of their own (a block of root's uids),
    // which only CAP_KILL lets airlock signal: without it no sandbox could be killed.
    if root && !effective_capability(CAP_KILL) {
        return Err(
            "CAP_KILL is missing: as root, airlock runs each sandbox as a user of its \
            own and needs CAP_KILL to kill it at its time limit (in a pod: \
            securityContext.capabilities.add KILL; with systemd: CapabilityBoundingSet, as \
            deploy/systemd/airlock.service has it)"
                .into(),
        );
    }
    if !root && read_trimmed("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return Err("unprivileged user namespaces are disabled: `sysctl \
            kernel.unprivileged_userns_clone=1`, or run airlock as root"
            .into());
    }
    if !root
        && read_trimmed("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
            == Some("1")
    {
        return Err(
            "AppArmor restricts unprivileged user namespaces: run airlock as root or \
            give it an AppArmor profile that allows `userns`"
                .into(),
        );
    }
    Ok(())
}

const CAP_KILL: u32 = 5;

/// Whether this thread's effective set holds capability number `cap`.
fn effective_capability(cap: u32) -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| set & (1 << cap) != 0)
}

fn probe_seccomp() -> Result<(), String> {
    sys::seccomp_mode().map_err(|e| format!("the kernel has no seccomp (CONFIG_SECCOMP): {e}"))?;
    let actions = read_trimmed("/proc/sys/kernel/seccomp/actions_avail")
        .ok_or("the kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)")?;
    for needed in ["kill_process", "errno", "allow"] {
        if !actions.split_whitespace().any(|a| a == needed) {
            return Err(format!("the kernel's seccomp lacks the `{needed}` action"));
        }
    }
    Filters::shared().map(drop).map_err(|e| e.to_string())
}

/// What [`unmask_proc`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcMasks {
    /// Nothing covers part of /proc.
    None,
    /// These covers were removed in airlock's own mount namespace.
    Removed(Vec<String>),
    /// Covers are there and stay, for this reason: sandboxes cannot mount their /proc.
    Kept(String),
}

static PROC_MASKS: OnceLock<ProcMasks> = OnceLock::new();

/// This program's path, read before [`unmask_proc`] moves it to another mount namespace
/// (where /proc/self/exe may name it from the old one's root).
static OWN_EXE: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();

/// This program's path (for what lives beside it, such as the zygote's library).
pub fn own_exe() -> Option<std::path::PathBuf> {
    OWN_EXE.get_or_init(|| std::env::current_exe().ok()).clone()
}

/// A container runtime covers parts of /proc (masked paths such as /proc/kcore, a read-only
/// /proc/sys), and the kernel then refuses a user namespace a fresh /proc of its own, which
/// each sandbox's PID namespace needs. Run as root with CAP_SYS_ADMIN, airlock moves itself
/// into a mount namespace of its own (a slave of the container's, so nothing propagates
/// back) and removes the covers there: the container's other processes keep them, and a
/// sandbox still sees only its own `subset=pid` /proc. A mount namespace belongs to a
/// thread, so this runs before any thread starts; later calls return the first answer.
pub fn unmask_proc() -> &'static ProcMasks {
    PROC_MASKS.get_or_init(|| {
        own_exe();
        let covers = proc_covers();
        if covers.is_empty() {
            return ProcMasks::None;
        }
        if !nix::unistd::geteuid().is_root() {
            return ProcMasks::Kept(format!(
                "{} are covered, and only root can uncover them",
                covers.join(", ")
            ));
        }
        if let Err(e) = sys::private_mount_namespace() {
            return ProcMasks::Kept(format!("a mount namespace of airlock's own: {e}"));
        }
        let failed: Vec<String> = covers
            .iter()
            .rev() // deepest first: mountinfo lists a mount after the one it sits on
            .filter_map(|c| sys::detach_mount(c).err().map(|e| format!("{c}: {e}")))
            .collect();
        match (failed.is_empty(), proc_covers().is_empty()) {
            (true, true) => ProcMasks::Removed(covers),
            _ => ProcMasks::Kept(format!("unmounting {}", failed.join(", "))),
        }
    })
}

/// Mount points beneath /proc, in mountinfo's order; binfmt_misc (and its automount) sits
/// on an empty directory, which the kernel does not count as hiding anything.
fn proc_covers() -> Vec<String> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let point = l.split(' ').nth(4)?;
            let fstype = l.split(" - ").nth(1)?.split(' ').next()?;
            let hides = point.starts_with("/proc/") && !matches!(fstype, "autofs" | "binfmt_misc");
            hides.then(|| point.replace("\\040", " "))
        })
        .collect()
}
