//! `airlock doctor`: can this host run sandboxes, and what will a default run enforce?

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::process::ExitCode;

use airlock_engine::{Engine, EngineConfig, PoolConfig};
use airlock_sandbox::{host_support, Layout, HOST_ID_BASE};
use clap::Args;
use serde::Serialize;

/// Check the host: namespaces, seccomp, Landlock, cgroups, the interpreter, and a real run.
/// Exits 0 only when a default run would be fully enforced.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// The host's Python interpreter to check.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/python3")]
    pub python: PathBuf,
    /// The `airlock serve` configuration whose worst-case memory to show (as `serve` reads
    /// it: this file or AIRLOCK_CONFIG, then AIRLOCK_* variables).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
    /// How to fix it, when it is not ok.
    fix: Option<String>,
}

#[derive(Serialize)]
struct Report {
    ok: bool,
    kernel: String,
    arch: String,
    running_as_root: bool,
    checks: Vec<Check>,
    /// What a default `airlock run` enforces on this host.
    enforced: Vec<String>,
    /// The most memory `airlock serve` can hold with the configuration, part by part.
    memory: Option<Memory>,
}

#[derive(Serialize)]
struct Memory {
    /// The configuration file read, if any.
    config: Option<PathBuf>,
    server: Vec<airlock_server::sizing::Part>,
    server_total_bytes: u64,
    sandboxes: airlock_server::sizing::Part,
}

fn check(name: &'static str, r: Result<String, String>, fix: &str) -> Check {
    match r {
        Ok(detail) => Check {
            name,
            ok: true,
            detail,
            fix: None,
        },
        Err(detail) => Check {
            name,
            ok: false,
            fix: Some(confined_fix(&detail).unwrap_or_else(|| fix.to_owned())),
            detail,
        },
    }
}

/// What a container (or a pod, or a service's sandboxing) withholds, recognised by the error
/// it causes, and the one relaxation that gives it back (docs/deploying.md "Kubernetes").
fn confined_fix(error: &str) -> Option<String> {
    let denied = error.contains("Operation not permitted");
    if error.contains("cgroups") && error.contains("Read-only file system") {
        return Some(
            "the cgroup file system is mounted read-only, as a container runtime mounts it: remount it writable in the container before airlock starts (`mount -o remount,rw` on each cgroup mount, which needs CAP_SYS_ADMIN; the pod's command in deploy/kubernetes does it): sandboxes' cgroups go beneath the container's own".into(),
        );
    }
    if error.contains("cgroups")
        && error.contains("Permission denied")
        && host_support().running_as_root
    {
        return Some(
            "CAP_DAC_OVERRIDE is missing: root without it is refused cgroup files and directories it does not own, and airlock writes them for each sandbox (in a pod: securityContext.capabilities.add DAC_OVERRIDE; with systemd: CapabilityBoundingSet, as deploy/systemd/airlock.service has it)".into(),
        );
    }
    if denied && (error.contains("open_tree") || error.contains("mount") && error.contains("outer"))
    {
        return Some(
            "CAP_SYS_ADMIN is missing: airlock needs it to build each sandbox's mounts (in a pod: securityContext.capabilities.add SYS_ADMIN; with systemd: CapabilityBoundingSet, as deploy/systemd/airlock.service has it)".into(),
        );
    }
    if denied && error.contains("mount proc") {
        let why = match airlock_sandbox::unmask_proc() {
            airlock_sandbox::ProcMasks::Kept(why) => why.clone(),
            other => format!("{other:?}"),
        };
        return Some(format!(
            "/proc is partly covered (a container runtime's masked and read-only paths): the \
             kernel lets a sandbox mount its own /proc only where the host's is fully visible. \
             airlock uncovers it in a mount namespace of its own when it runs as root with \
             CAP_SYS_ADMIN and no AppArmor profile forbids umount; here it could not ({why})"
        ));
    }
    if denied
        && (error.contains("setgroups")
            || error.contains("setresuid")
            || error.contains("setresgid"))
    {
        return Some(
            "CAP_SETUID or CAP_SETGID is missing: airlock as root needs both to map each sandbox's user namespace (in a pod: securityContext.capabilities.add SETUID, SETGID)".into(),
        );
    }
    if denied && error.contains("user namespace") {
        return Some(
            "creating a user namespace is refused: a seccomp profile without unshare and clone's namespace flags (Docker's and containerd's default allow them only with CAP_SYS_ADMIN), an AppArmor profile, or user.max_user_namespaces = 0".into(),
        );
    }
    None
}

fn describe_layout(layout: &Layout) -> String {
    match layout {
        Layout::V1 {
            memory,
            pids,
            cpu,
            cpuacct,
        } => format!(
            "v1: sandboxes go beneath memory {}, pids {}, cpu {}, cpuacct {}",
            memory.display(),
            pids.display(),
            cpu.display(),
            cpuacct.display()
        ),
        Layout::V2 { dir } => {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            format!(
                "v2: sandboxes go beneath {}; {}",
                dir.display(),
                match favors_dynamic_changes(&mountinfo, dir) {
                    Some(true) =>
                        "mounted with favordynmods: a cold sandbox's init is moved into its \
                                   cgroup without waiting for an RCU grace period (a zygote's \
                                   children are cloned into theirs)",
                    Some(false) =>
                        "a cold sandbox's init moved into its cgroup may wait for an RCU \
                                    grace period (milliseconds under load; a zygote's children \
                                    are cloned into theirs); mounting cgroup2 with \
                                    favordynmods (Linux 6.0+) spares it",
                    None => "mount options unknown",
                }
            )
        }
    }
}

/// Whether the cgroup2 mount holding `dir` has `favordynmods` among its options, from
/// `/proc/self/mountinfo` (the mount with the longest mount point above `dir`).
fn favors_dynamic_changes(mountinfo: &str, dir: &std::path::Path) -> Option<bool> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            let mut fs = right.split_whitespace();
            (fs.next()? == "cgroup2" && dir.starts_with(point))
                .then(|| (point.len(), fs.nth(1).unwrap_or("")))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, options)| options.split(',').any(|o| o == "favordynmods"))
}

pub fn main(args: DoctorArgs) -> ExitCode {
    let host = host_support();
    let mut checks = vec![
        check(
            "user namespaces",
            host.user_namespaces.clone().map(|()| "available".into()),
            "enable unprivileged user namespaces, or run airlock as root",
        ),
        check(
            "seccomp",
            host.seccomp
                .clone()
                .map(|()| format!("filters available; profile for {} compiles", host.arch)),
            "use a kernel built with CONFIG_SECCOMP_FILTER on x86_64",
        ),
        check(
            "landlock",
            host.landlock_abi
                .clone()
                .map(|abi| format!("ABI {abi} (airlock asks for ABI 6 rights)")),
            "use Linux 5.13+ with Landlock enabled (lsm=...,landlock); ABI 6+ for full enforcement",
        ),
        check(
            "cgroups",
            host.cgroup
                .as_ref()
                .map(describe_layout)
                .map_err(Clone::clone),
            "run as root, or in a delegated cgroup (v2: systemd-run --scope -p Delegate=yes); \
             memory, pids and cpu (+cpuacct on v1) controllers are needed",
        ),
    ];

    let config = EngineConfig {
        python: args.python.clone(),
        ..EngineConfig::default()
    };
    let defaults = config.defaults.clone();
    let engine = Engine::new(config);
    checks.push(check(
        "python",
        engine
            .as_ref()
            .map(|e| {
                format!(
                    "{} (Python {})",
                    e.interpreter().path.display(),
                    e.interpreter().version
                )
            })
            .map_err(|e| e.to_string()),
        "install Debian's python3 (apt-get install python3), or pass --python PATH",
    ));

    let mut enforced = Vec::new();
    let mechanisms_ok = checks.iter().all(|c| c.ok);
    // Only in a container (or wherever something covers part of /proc) is there a line; the
    // trial runs either way, and its error says what a covered /proc does to it.
    match airlock_sandbox::unmask_proc() {
        airlock_sandbox::ProcMasks::None => {}
        airlock_sandbox::ProcMasks::Removed(covers) => checks.push(check(
            "/proc",
            Ok(format!(
                "{} covered (a container's masks); uncovered in airlock's own mount namespace",
                covers.join(", ")
            )),
            "",
        )),
        airlock_sandbox::ProcMasks::Kept(why) => checks.push(check(
            "/proc",
            Err(format!(
                "partly covered, and airlock cannot uncover it: {why}"
            )),
            "run airlock as root with CAP_SYS_ADMIN, under no AppArmor profile that forbids mount \
             and umount (a pod: appArmorProfile Unconfined), which its sandboxes need anyway; \
             a runtime that leaves /proc unmasked (a pod: procMount: Unmasked) also does",
        )),
    }

    let run = match (&engine, mechanisms_ok) {
        (Ok(engine), true) => trial_run(engine, &mut enforced),
        (Ok(_), false) => Err("skipped: a mechanism above is missing".into()),
        (Err(_), _) => Err("skipped: no interpreter".into()),
    };
    let ran = run.is_ok();
    checks.push(check(
        "sandbox",
        run,
        "see the failures above; `airlock run` refuses to run until they are fixed",
    ));
    if let (Ok(engine), true) = (&engine, ran) {
        checks.push(check(
            "warm pool",
            trial_pool(engine),
            "see the error; `airlock serve` falls back to cold sandboxes while the pool fails \
             (pool.size = 0 turns it off)",
        ));
        checks.push(check(
            "zygote",
            trial_zygote(engine),
            "see the error; `airlock serve` starts every sandbox cold without zygotes \
             (zygote.enabled = false turns them off); they need airlock to run as root and \
             libairlock_sandbox.so beside the binary (cargo build --workspace) or zygote.library",
        ));
        checks.push(check(
            "environment builds",
            trial_bounded_dir(host.running_as_root),
            "environment builds write into a file system of their own, which needs root with \
             CAP_SYS_ADMIN: ext4 on a loop device (/dev/loop-control and mkfs.ext4, from e2fsprogs), \
             else a tmpfs",
        ));
        checks.push(check(
            "volumes",
            trial_volume(engine),
            "a volume is an ext4 image on a loop device, mounted into each sandbox through an \
             idmapped mount: airlock must run as root with CAP_SYS_ADMIN, /dev/loop-control and \
             mkfs.ext4 (e2fsprogs)",
        ));
    }
    if enforced.is_empty() {
        enforced.push("nothing: airlock run refuses to start on this host".into());
    } else {
        enforced.push(format!(
            "limits by default: wall {} ms, CPU {} ms, memory {} MiB (swap off), {} pids, \
             disk {} MiB, output {} bytes per stream",
            defaults.timeout_ms,
            defaults.cpu_ms,
            defaults.memory_mb,
            defaults.pids,
            defaults.disk_mb,
            defaults.output_bytes
        ));
    }

    let env = crate::serve::settings_env();
    let memory = match crate::config::load(args.config.as_deref(), &env, None, None) {
        Ok(config) => {
            if let Err(e) = airlock_server::sizing::check(&config) {
                checks.push(check(
                    "configuration",
                    Err(e),
                    "fix the configuration; `airlock serve --print-config` shows what is read",
                ));
            }
            checks.extend(tool_servers(&config));
            checks.extend(credentials(&config));
            checks.extend(traces(&config));
            let server = airlock_server::sizing::worst_case(&config);
            Some(Memory {
                // The file read: named, or found in the user's or the system's place.
                config: crate::config::config_file(args.config.as_deref(), &env),
                server_total_bytes: server.iter().map(|p| p.bytes).sum(),
                server,
                sandboxes: airlock_server::sizing::sandboxes(&config),
            })
        }
        Err(e) => {
            checks.push(check(
                "configuration",
                Err(e.to_string()),
                "fix the configuration; `airlock serve --print-config` shows what is read",
            ));
            None
        }
    };
    let report = Report {
        ok: checks.iter().all(|c| c.ok),
        kernel: host.kernel_release.clone(),
        arch: host.arch.into(),
        running_as_root: host.running_as_root,
        checks,
        enforced,
        memory,
    };
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print_report(&report);
    }
    ExitCode::from(if report.ok { 0 } else { 1 })
}

/// Runs real code in a real sandbox with the default policy and checks what it reports.
fn trial_run(engine: &Engine, enforced: &mut Vec<String>) -> Result<String, String> {
    let r = engine.self_test()?;
    let i = &r.isolation;
    enforced.push(format!(
        "namespaces: {} (uid {} inside)",
        i.namespaces.join(", "),
        i.uid
    ));
    enforced.push(
        "filesystem: read-only root of the interpreter's paths, fresh /proc, minimal /dev, \
         tmpfs /tmp and /work"
            .into(),
    );
    enforced.push("network: none (empty network namespace)".into());
    enforced.push(format!("seccomp: {}", i.seccomp));
    let abi = i.landlock_abi.map_or("?".into(), |a| a.to_string());
    enforced.push(format!("landlock: {} (ABI {abi})", i.landlock));
    enforced.push(format!("cgroup: {}", i.cgroup));
    enforced.push(
        "no_new_privs, no capabilities, new session without a terminal, environment cleared".into(),
    );
    let full = i.seccomp == "enforced"
        && i.landlock == "fully_enforced"
        && i.cgroup != "disabled"
        && i.downgraded.is_empty();
    if !full {
        return Err(format!(
            "the trial run was not fully enforced: seccomp {}, landlock {}, cgroup {}",
            i.seccomp, i.landlock, i.cgroup
        ));
    }
    Ok(format!(
        "ran Python in a sandbox in {} ms; everything above enforced",
        r.usage.wall_ms
    ))
}

/// Starts a one-sandbox warm pool as `airlock serve` would, measures what an idle pooled
/// sandbox costs, and runs the trial through it.
fn trial_pool(engine: &Engine) -> Result<String, String> {
    let mut engine = engine.clone();
    let defaults = PoolConfig::default();
    let pool = engine.start_pool(PoolConfig {
        size: 1,
        max_size: 1,
        workers: 1,
        preloaded: 0,
        ..defaults.clone()
    })?;
    let started = std::time::Instant::now();
    while pool.status().idle == 0 {
        if let Some(e) = pool.status().last_error {
            return Err(format!("a pooled sandbox failed to start: {e}"));
        }
        if started.elapsed() > std::time::Duration::from_secs(10) {
            return Err("no pooled sandbox was ready within 10 s".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let ready = started.elapsed();
    let pss_kib: u64 = pool
        .idle_processes()
        .iter()
        .flatten()
        .map(|pid| pss_kib(*pid))
        .sum();
    let r = engine.self_test()?;
    let taken = pool.status().takes;
    pool.close();
    if taken != 1 {
        return Err("the trial run did not get the pooled sandbox".into());
    }
    Ok(format!(
        "a pooled sandbox was ready in {} ms and holds {:.1} MiB (PSS) idle; a run through it \
         took {} ms; `airlock serve` keeps {} ready (pool.size), up to {} on demand",
        ready.as_millis(),
        pss_kib as f64 / 1024.0,
        r.usage.wall_ms,
        defaults.size,
        defaults.max_size
    ))
}

/// Starts a lean zygote as `airlock serve` would and runs the trial as its child.
fn trial_zygote(engine: &Engine) -> Result<String, String> {
    let mut engine = engine.clone();
    let config = airlock_engine::ZygoteConfig::default();
    engine.start_zygotes(airlock_engine::ZygoteConfig {
        preload: Vec::new(),
        ..config.clone()
    });
    let started = std::time::Instant::now();
    let job = engine.self_test_job()?;
    engine.wait_for_zygote(&job, std::time::Duration::from_secs(60))?;
    let ready = started.elapsed();
    let cloning = engine.zygote_status().is_some_and(|s| s.cloning > 0);
    let execution = engine.self_test_execution()?;
    engine.close_pools();
    if !execution.forked {
        return Err("the trial run did not get a zygote's child".into());
    }
    let placed = match host_support().cgroup.as_ref().map(Layout::version) {
        Ok(airlock_sandbox::CgroupVersion::V2) if cloning => {
            "each child is cloned straight into its cgroup (cgroup v2, CLONE_INTO_CGROUP)"
        }
        Ok(airlock_sandbox::CgroupVersion::V2) => {
            "each child joins its cgroup through cgroup.procs (cgroup v2; the zygote has a \
             thread of its own, so it forks rather than clones)"
        }
        _ => "each child joins its cgroup through tasks (cgroup v1)",
    };
    Ok(format!(
        "a zygote was ready in {} ms and a run as its child took {} ms; {placed}; `airlock \
         serve` forks fresh sandboxes from zygotes (one lean, one preloading {}), and starts \
         cold those it does not serve: with egress, with tools, with seccomp downgraded, or \
         while a zygote starts (airlock_cold_starts_total says which)",
        ready.as_millis(),
        execution.result.usage.wall_ms,
        config.preload.join(", ")
    ))
}

/// Makes a small bounded file system of the kind environment builds get here, and says which
/// (`docs/environments.md`); without root there is none, and nothing else needs one.
fn trial_bounded_dir(root: bool) -> Result<String, String> {
    let (kind, how) = airlock_sandbox::BoundedKind::here();
    if !root {
        return Ok(format!(
            "would be bounded by {how}, which needs root: `airlock env create` and \
             POST /v1/environments refuse to build without it"
        ));
    }
    let dir = std::env::temp_dir().join(format!("airlock-doctor-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let made = airlock_sandbox::BoundedDir::create_as(kind, &dir, 16 << 20, 1024);
    let _ = std::fs::remove_dir(&dir);
    made.map(|_| format!("bounded while they write by {how}"))
        .map_err(|e| e.to_string())
}

/// Makes a volume in a directory of its own, has a sandbox write a file into it and reads the
/// file back as the file routes do (`docs/volumes.md`). Where volumes cannot be had, says why
/// (nothing else needs them).
fn trial_volume(engine: &Engine) -> Result<String, String> {
    use airlock_engine::volumes::{Access, JobVolume, Quota, Volumes};
    let dir = std::env::temp_dir().join(format!("airlock-doctor-volume-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let tried = (|| {
        let volumes = Volumes::open(&dir);
        if let Some(why) = volumes.unavailable() {
            return Ok(format!(
                "unavailable: {why}; POST /v1/volumes answers 422 volumes_unavailable"
            ));
        }
        let quota = Quota {
            max_volumes_per_key: 1,
            max_size_bytes: 8 << 20,
            max_entries: 64,
        };
        let storage = airlock_engine::storage::Storage::open(
            &dir,
            airlock_engine::storage::Quotas {
                stored: 8 << 20,
                background: 0,
            },
        );
        let e = |e: airlock_engine::volumes::VolumeError| e.to_string();
        volumes
            .create("doctor", "trial", 8 << 20, 64, &quota, "now", &storage)
            .map_err(e)?;
        let lease = volumes
            .lease("doctor", "trial", Access::Write, "airlock doctor")
            .map_err(e)?;
        let mut job = engine.self_test_job()?;
        job.code = "import os\nopen('/work/v/written', 'w').write('by a sandbox')\n\
                    os.stat('/work/v/written').st_uid"
            .into();
        job.volumes = vec![JobVolume {
            lease,
            target: "/work/v".into(),
        }];
        let ran = engine
            .execute(job, &mut airlock_engine::Discard)
            .map_err(|e| e.to_string())?;
        if ran.result.result != Some(serde_json::json!(1000)) {
            return Err(format!(
                "a sandbox could not write a volume as its own uid: {:?} {}",
                ran.result.status, ran.result.stderr
            ));
        }
        let lease = volumes
            .lease("doctor", "trial", Access::Read, "airlock doctor")
            .map_err(e)?;
        let read = lease.read_file("written", 64).map_err(e)?;
        if read != b"by a sandbox" {
            return Err("the file a sandbox wrote did not read back".into());
        }
        Ok("a sandbox wrote a volume through an idmapped ext4 mount, read back on the host".into())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    tried
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Proportional set size of a process, in KiB (0 when unreadable).
fn pss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Starts each configured tool server (code mode) as `airlock serve` would, lists its tools,
/// and checks every key's grants against them; one check per server.
fn tool_servers(config: &airlock_server::config::Config) -> Vec<Check> {
    if config.tools.servers.is_empty() {
        return Vec::new();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return vec![check("tool servers", Err(e.to_string()), "")],
    };
    let registry = airlock_tools::Registry::start(config.tools.clone(), runtime.handle().clone());
    let _ = runtime.block_on(registry.started());
    let mut checks: Vec<Check> = registry
        .statuses()
        .into_iter()
        .map(|s| {
            let detail = match s.state {
                airlock_tools::SourceState::Ready => {
                    Ok(format!("{}: {}, {} tools", s.name, s.transport, s.tools))
                }
                _ => Err(format!("{}: {}", s.name, s.error.unwrap_or_default())),
            };
            check(
                "tool server",
                detail,
                "see the error (a stdio server's stderr is in airlock's log); `airlock serve` \
                 does not start while a tool server cannot",
            )
        })
        .collect();
    // Grants are checked against the tools listed, once every server could list them.
    let listed = registry
        .statuses()
        .iter()
        .all(|s| s.state == airlock_tools::SourceState::Ready);
    for key in config.keys.iter().filter(|_| listed) {
        let checked =
            airlock_tools::Grants::parse(&key.tools).and_then(|g| registry.check_grants(&g));
        if let Err(e) = checked {
            checks.push(check(
                "tool grants",
                Err(format!("key `{}`: {e}", key.name)),
                "grant only servers and tools that exist (`server.tool`, `*` for any characters)",
            ));
        }
    }
    registry.shutdown();
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    checks
}

/// Reads each credential's values and CA certificates as `airlock serve` would: one check
/// per credential, naming where a value was looked for, never the value.
fn credentials(config: &airlock_server::config::Config) -> Vec<Check> {
    config
        .credentials
        .iter()
        .map(|(name, c)| {
            let detail = airlock_server::read_credential(name, c).map(|cred| {
                let hosts: Vec<String> = cred
                    .hosts
                    .iter()
                    .map(|h| format!("{}:{:?}", h.host, h.ports))
                    .collect();
                let headers: Vec<&str> = cred.headers.iter().map(|h| h.name.as_str()).collect();
                format!(
                    "credential {name}: sets {} on {}",
                    headers.join(", "),
                    hosts.join(", ")
                )
            });
            check(
                "credential",
                detail.map_err(|e| format!("credential {name}: {e}")),
                "set the variable or create the file in the environment `airlock serve` runs                  in; `airlock serve` does not start without it",
            )
        })
        .collect()
}

/// Where traces go, when they are on, and whether the collector takes a connection now. Never
/// a failure: spans that cannot be sent are dropped and counted, executions run on.
fn traces(config: &airlock_server::config::Config) -> Option<Check> {
    use std::net::{TcpStream, ToSocketAddrs};
    let t = &config.telemetry;
    let url = t.traces_url()?;
    let reached = t.collector().and_then(|(host, port)| {
        let addr = (host.as_str(), port).to_socket_addrs().ok()?.next()?;
        TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)).ok()
    });
    let now = if reached.is_some() {
        "the collector takes connections"
    } else {
        "the collector cannot be reached now: spans are dropped (airlock_telemetry_spans_dropped_total) until it can"
    };
    Some(check(
        "traces",
        Ok(format!(
            "OTLP/HTTP to {url} as service {}; {now}",
            t.service_name
        )),
        "",
    ))
}

fn print_report(r: &Report) {
    outln!("airlock doctor: kernel {} ({})", r.kernel, r.arch);
    if r.running_as_root {
        outln!("  running as root: each sandbox runs as host uid {HOST_ID_BASE:#x}+pid, which owns nothing");
    } else {
        outln!("  running unprivileged: sandboxes run as your uid outside their user namespace");
    }
    outln!();
    for c in &r.checks {
        let mark = if c.ok { "ok" } else { "MISSING" };
        outln!("  [{mark:^7}] {:<16} {}", c.name, c.detail);
        if let Some(fix) = &c.fix {
            outln!("            {:<16} fix: {fix}", "");
        }
    }
    outln!();
    outln!("A default `airlock run` enforces:");
    for line in &r.enforced {
        outln!("  - {line}");
    }
    if let Some(m) = &r.memory {
        let from = m
            .config
            .as_ref()
            .map_or("the default configuration".to_owned(), |p| {
                p.display().to_string()
            });
        outln!();
        outln!("Memory `airlock serve` can hold at most, with {from}:");
        for p in &m.server {
            outln!("  - {:<22} {:>10}  {}", p.name, mib(p.bytes), p.how);
        }
        outln!("  = {:<22} {:>10}", "in all", mib(m.server_total_bytes));
        outln!(
            "  and the sandboxes, outside it: {}  {}",
            mib(m.sandboxes.bytes),
            m.sandboxes.how
        );
    }
    outln!();
    if r.ok {
        outln!("Everything is enforced.");
    } else {
        outln!("Not fully enforced: `airlock run` refuses to start until the above is fixed");
        outln!("(or a mechanism is explicitly switched off with --downgrade NAME).");
    }
}

#[cfg(test)]
mod tests {
    use super::favors_dynamic_changes;
    use std::path::Path;

    #[test]
    fn the_cgroup2_mount_options_are_read_from_the_mount_above_the_directory() {
        let info = "\
25 1 0:22 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
31 30 0:27 / /sys/fs/cgroup/other rw - cgroup2 cgroup2 rw,nsdelegate,favordynmods
";
        let dir = |d: &str| favors_dynamic_changes(info, Path::new(d));
        assert_eq!(dir("/sys/fs/cgroup/airlock"), Some(false));
        assert_eq!(dir("/sys/fs/cgroup/other/airlock"), Some(true));
        assert_eq!(dir("/somewhere/else"), None);
        // A v1 hierarchy is no cgroup2 mount.
        let v1 = "32 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            favors_dynamic_changes(v1, Path::new("/sys/fs/cgroup/memory/airlock")),
            None
        );
    }
}
