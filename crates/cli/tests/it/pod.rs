//! airlock inside an OCI container with a pod's defaults, run by runc (Debian's): the
//! machine's own root file system bound read-only, the capabilities containerd gives a
//! container, a runtime's default seccomp profile (containers-common's, CRI-O's default),
//! masked and read-only `/proc` paths, `/sys/fs/cgroup` read-only, no_new_privs; then the
//! relaxations airlock needs: CAP_SYS_ADMIN, and the cgroups remounted writable. Without
//! each, `airlock doctor` names what fails and how to give it back; with both, doctor passes
//! and the jail tests pass inside, /proc masked as the runtime masks it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::{json, Value};

/// What a container runtime gives a Kubernetes container by default (containerd, CRI-O).
const DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

const STATEFULSET: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/kubernetes/base/statefulset.yaml"
);

/// The capabilities the StatefulSet adds (it drops all others), as `CAP_` names.
fn manifest_capabilities(statefulset: &str) -> Vec<String> {
    assert!(statefulset.contains("drop: [ALL]"));
    statefulset_capabilities(statefulset)
        .iter()
        .map(|c| format!("CAP_{c}"))
        .collect()
}

/// The StatefulSet's remount of the cgroup file system, as its command runs it.
fn manifest_remount() -> String {
    std::fs::read_to_string(STATEFULSET)
        .unwrap()
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("for m in $(findmnt"))
        .expect("the StatefulSet remounts the cgroups")
        .to_owned()
}

/// containers-common's default profile (Debian's golang-github-containers-common).
const RUNTIME_SECCOMP: &str = "/usr/share/containers/seccomp.json";

/// What the container is given beyond a pod's defaults.
#[derive(Clone, Copy, Default)]
struct Relaxations {
    /// The cgroup file system remounted writable by the container's command (which needs
    /// CAP_SYS_ADMIN): the StatefulSet's command.
    cgroups_writable: bool,
    /// The cgroup file system mounted writable by the runtime (what some runtimes can be
    /// told to do; Kubernetes cannot), so that the other checks are reached without it.
    runtime_cgroups_rw: bool,
    /// The capabilities the StatefulSet gives (all others dropped) instead of the runtime's
    /// defaults (which lack CAP_SYS_ADMIN).
    sys_admin: bool,
    /// No masked or read-only paths under /proc (what procMount: Unmasked asks for).
    proc_unmasked: bool,
    /// Not a relaxation: `umount2` refused by the seccomp profile, as an AppArmor profile
    /// that forbids umount (the container default) would refuse it; sandboxes need it too,
    /// so this only shows what doctor says.
    deny_umount: bool,
}

/// What airlock needs in a pod, as deploy/kubernetes/base/statefulset.yaml gives it: its five
/// capabilities, and the cgroups remounted writable. /proc stays masked: airlock uncovers it
/// in its own mount namespace.
const NEEDED: Relaxations = Relaxations {
    cgroups_writable: true,
    runtime_cgroups_rw: false,
    sys_admin: true,
    proc_unmasked: false,
    deny_umount: false,
};

/// The runtime's default profile for these capabilities, in the OCI form: each rule kept
/// when the capabilities and architecture it is conditioned on hold (as CRI-O does).
fn runtime_seccomp(caps: &[&str], deny_umount: bool) -> Value {
    let profile: Value = serde_json::from_str(
        &std::fs::read_to_string(RUNTIME_SECCOMP).expect("containers-common's seccomp.json"),
    )
    .unwrap();
    let has = |list: &Value| -> Vec<String> {
        list.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut rules = Vec::new();
    for rule in profile["syscalls"].as_array().unwrap() {
        let (inc, exc) = (&rule["includes"], &rule["excludes"]);
        let arches = has(&inc["arches"]);
        if !arches.is_empty() && !arches.iter().any(|a| a == "amd64") {
            continue;
        }
        if has(&exc["arches"]).iter().any(|a| a == "amd64") {
            continue;
        }
        if !has(&inc["caps"]).iter().all(|c| caps.contains(&c.as_str())) {
            continue;
        }
        if has(&exc["caps"]).iter().any(|c| caps.contains(&c.as_str())) {
            continue;
        }
        let names: Vec<&Value> = rule["names"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| !(deny_umount && matches!(n.as_str(), Some("umount2" | "umount"))))
            .collect();
        let mut r = json!({"names": names, "action": rule["action"]});
        if rule["args"].as_array().is_some_and(|a| !a.is_empty()) {
            r["args"] = rule["args"].clone();
        }
        if let Some(errno) = rule.get("errnoRet") {
            r["errnoRet"] = errno.clone();
        }
        rules.push(r);
    }
    if deny_umount {
        rules.push(
            json!({"names": ["umount2", "umount"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}),
        );
    }
    json!({
        "defaultAction": profile["defaultAction"],
        "defaultErrnoRet": profile.get("defaultErrnoRet").cloned().unwrap_or(json!(38)),
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules,
    })
}

/// The repository and the build tree, bound read-only into the container at their paths.
fn project_paths() -> Vec<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = Path::new(env!("CARGO_BIN_EXE_airlock"))
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let mut paths = vec![repo.canonicalize().unwrap(), target.canonicalize().unwrap()];
    paths.dedup();
    paths.retain(|p| !p.starts_with("/usr") && !p.starts_with("/etc"));
    paths
}

/// A bundle: a root of empty directories and the host's merged-/usr links, the host's /usr,
/// /etc and the project bound read-only, scratch space on tmpfs, and `args` as the command.
fn bundle(dir: &Path, relax: Relaxations, args: &[String]) {
    let root = dir.join("rootfs");
    std::fs::create_dir_all(&root).unwrap();
    for name in ["bin", "lib", "lib32", "lib64", "libx32", "sbin"] {
        if let Ok(link) = std::fs::read_link(Path::new("/").join(name)) {
            let _ = std::os::unix::fs::symlink(link, root.join(name));
        }
    }
    let spec = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(dir)
        .status()
        .expect("runc (Debian's)");
    assert!(spec.success());
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let statefulset = std::fs::read_to_string(STATEFULSET).unwrap();
    let caps: Vec<String> = if relax.sys_admin {
        manifest_capabilities(&statefulset)
    } else {
        DEFAULT_CAPS.iter().map(|c| (*c).to_owned()).collect()
    };
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    config["process"] = json!({
        "terminal": false,
        "user": {"uid": 0, "gid": 0},
        "args": args,
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"],
        "cwd": "/",
        "noNewPrivileges": true,
        "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
    });
    config["root"] = json!({"path": root, "readonly": true});
    config["hostname"] = json!("pod");
    let mounts = config["mounts"].as_array_mut().unwrap();
    // The runtime's own mounts stay as `runc spec` makes them (/sys/fs/cgroup read-only).
    if relax.runtime_cgroups_rw {
        for m in mounts
            .iter_mut()
            .filter(|m| m["destination"] == "/sys/fs/cgroup")
        {
            m["options"] = json!(["nosuid", "noexec", "nodev", "relatime", "rw"]);
        }
    }
    // Scratch space first: the project may live beneath one of these (a clone in /tmp),
    // and its bind must land on top.
    for path in ["/tmp", "/root", "/var/tmp", "/run"] {
        mounts.push(
            json!({"destination": path, "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777"]}),
        );
    }
    let mut binds: Vec<PathBuf> = vec!["/usr".into(), "/etc".into()];
    binds.extend(project_paths());
    for path in binds {
        mounts.push(json!({"destination": path, "type": "bind", "source": path,
            "options": ["rbind", "ro", "nosuid", "nodev"]}));
    }
    let linux = config["linux"].as_object_mut().unwrap();
    linux["namespaces"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "cgroup"}));
    if relax.proc_unmasked {
        linux.insert("maskedPaths".into(), json!([]));
        linux.insert("readonlyPaths".into(), json!([]));
    }
    linux.insert("seccomp".into(), runtime_seccomp(&caps, relax.deny_umount));
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

/// Runs `command` (a shell command) in a fresh container with `relax`.
fn in_pod(relax: Relaxations, command: &str) -> Output {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = scratch_dir(&format!("pod-bundle-{n}"));
    let remount = if relax.cgroups_writable {
        manifest_remount() + "\n"
    } else {
        String::new()
    };
    bundle(
        &dir,
        relax,
        &["/bin/sh".into(), "-c".into(), format!("{remount}{command}")],
    );
    let out = Command::new("runc")
        .args(["run", "--bundle"])
        .arg(&dir)
        .arg(format!("pod-test-{}-{n}", std::process::id()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn doctor(relax: Relaxations) -> Value {
    let out = in_pod(
        relax,
        &format!("exec {} doctor --json", env!("CARGO_BIN_EXE_airlock")),
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "doctor said no JSON: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The checks that failed, with their fix.
fn failed(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["fix"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[test]
fn in_a_container_with_a_pod_s_defaults_doctor_names_each_missing_relaxation() {
    let _g = serial();
    let before = HostState::now();
    let none = Relaxations::default();
    let report = doctor(none);
    let f = failed(&report);
    assert_eq!(f[0].0, "cgroups", "{report:#}");
    assert!(
        f[0].1.contains("mounted read-only") && f[0].1.contains("remount"),
        "{f:?}"
    );

    // CAP_SYS_ADMIN alone: the cgroups are still read-only.
    let f = failed(&doctor(Relaxations {
        sys_admin: true,
        ..none
    }));
    assert_eq!(f[0].0, "cgroups", "{f:?}");
    // The remount without CAP_SYS_ADMIN is refused: still read-only, the fix says it needs it.
    let f = failed(&doctor(Relaxations {
        cgroups_writable: true,
        proc_unmasked: true,
        ..none
    }));
    assert!(
        f[0].0 == "cgroups" && f[0].1.contains("CAP_SYS_ADMIN"),
        "{f:?}"
    );
    // Writable cgroups (from the runtime) but no CAP_SYS_ADMIN: sandboxes cannot be built.
    let report = doctor(Relaxations {
        runtime_cgroups_rw: true,
        proc_unmasked: true,
        ..none
    });
    let f = failed(&report);
    assert_eq!(f.len(), 1, "{report:#}");
    assert_eq!(f[0].0, "sandbox");
    assert!(f[0].1.contains("CAP_SYS_ADMIN is missing"), "{f:?}");
    // What airlock needs: every check passes, the zygote's included, with /proc masked as
    // the runtime masks it (doctor says it was uncovered in airlock's own view).
    let report = doctor(NEEDED);
    assert_eq!(report["ok"], true, "{report:#}");
    // No loop devices in a pod: environment builds are bounded by a tmpfs (and say so).
    let builds = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "environment builds");
    assert!(
        builds.is_some_and(|c| c["detail"]
            .as_str()
            .unwrap()
            .starts_with("bounded while they write by a tmpfs: no loop devices")),
        "{report:#}"
    );
    // Volumes need loop devices (an image kept on disk): unavailable, and said so.
    let volumes = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "volumes");
    assert!(
        volumes.is_some_and(|c| c["ok"] == true
            && c["detail"]
                .as_str()
                .unwrap()
                .starts_with("unavailable: a volume needs ext4 on a loop device")),
        "{report:#}"
    );
    let proc = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "/proc");
    assert!(
        proc.is_some_and(|c| c["detail"].as_str().unwrap().contains("/proc/sys")),
        "{report:#}"
    );
    // Where umount is refused (an AppArmor profile would), /proc stays covered: doctor
    // names it, and the sandbox's /proc cannot be mounted.
    let report = doctor(Relaxations {
        deny_umount: true,
        ..NEEDED
    });
    let f = failed(&report);
    assert_eq!(f[0].0, "/proc", "{report:#}");
    assert!(f[0].1.contains("procMount: Unmasked"), "{f:?}");
    assert!(
        f.iter()
            .any(|(name, fix)| name == "sandbox" && fix.contains("uncovers it")),
        "{f:?}"
    );
    HostState::now().assert_same_as(&before, &"doctor in containers");
}

#[test]
fn with_the_relaxations_the_jail_tests_pass_inside_the_container() {
    let _g = serial();
    let before = HostState::now();
    // This test binary's own modules, run inside the container.
    let bin = std::env::current_exe().unwrap();
    for name in ["jail", "kernel", "limits", "results", "outputs", "function"] {
        // The core-dump test sets the host's core_pattern, which a container cannot.
        let out = in_pod(
            NEEDED,
            &format!(
                "exec {} --test-threads=2 {name}:: --skip a_crash_starts_no_core_dump_helper_on_the_host",
                bin.display()
            ),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && text.contains("test result: ok")
                && !text.contains("test result: ok. 0 passed"),
            "{name} in the container: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    HostState::now().assert_same_as(&before, &"jail tests in containers");
}
