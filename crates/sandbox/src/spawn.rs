//! The host side: start a sandbox from a [`Command`] and a [`Policy`], supervise it, and turn what
//! the kernel reports into an [`Outcome`].

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{ChildStderr, ChildStdin, ChildStdout, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::cgroup::{CgroupError, CgroupVersion, SandboxCgroup};
use crate::host::host_support;
use crate::init::{INIT_ARG, STATUS_FD};
use crate::jail::{FIRST_EXTRA_FD, INIT_PROCESSES};
use crate::policy::{Limits, Policy, PolicyError};
use crate::proto::{self, InitRequest, LandlockReport, LandlockState, Report};
use crate::sys;

/// The namespaces every sandbox gets; not configurable.
pub const NAMESPACES: [&str; 7] = ["user", "pid", "net", "mount", "ipc", "uts", "cgroup"];
/// How often the CPU time of the whole sandbox is checked, when it can matter.
const CPU_TICK: Duration = Duration::from_millis(50);
/// How long a killed sandbox may take to disappear before the cgroup is swept by hand.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// How long the outer init may take to hand over the egress listener.
const LISTENER_WAIT_MS: u16 = 10_000;

/// What to run inside the sandbox.
#[derive(Debug)]
pub struct Command {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: std::collections::BTreeMap<String, String>,
    pub(crate) fds: Vec<OwnedFd>,
    pub(crate) background: bool,
    /// Start a zygote's template (see [`crate::zygote`]).
    pub(crate) zygote: bool,
    /// An init started ahead, to be used instead of starting one (see [`Prestarted`]).
    pub(crate) init: Option<Box<Prestarted>>,
}

impl Command {
    /// `program` is a path inside the sandbox; it is also `argv[0]`.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        let program = program.into();
        let argv0 = program.to_string_lossy().into_owned();
        Command {
            program,
            args: vec![argv0],
            env: std::collections::BTreeMap::new(),
            fds: Vec::new(),
            background: false,
            zygote: false,
            init: None,
        }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets one environment variable. Nothing of the caller's environment is passed otherwise.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Passes a descriptor through; the program finds them at 3, 4, ... in the order given.
    pub fn pass_fd(mut self, fd: OwnedFd) -> Self {
        self.fds.push(fd);
        self
    }

    /// How many descriptors are passed so far: the next one is found at `3 + this`.
    pub fn passed_fds(&self) -> usize {
        self.fds.len()
    }

    /// Replaces the first argument equal to `from` with `to`; whether there was one.
    pub fn replace_arg(&mut self, from: &str, to: String) -> bool {
        match self.args.iter_mut().skip(1).find(|a| *a == from) {
            Some(arg) => {
                *arg = to;
                true
            }
            None => false,
        }
    }

    /// Starts the sandbox with `init`, an init started ahead, instead of starting one.
    pub fn prestarted(mut self, init: Prestarted) -> Self {
        self.init = Some(Box::new(init));
        self
    }

    /// A copy with the same descriptors duplicated (not a prestarted init), to try another
    /// way if one fails.
    pub fn try_clone(&self) -> std::io::Result<Command> {
        Ok(Command {
            program: self.program.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            fds: self
                .fds
                .iter()
                .map(OwnedFd::try_clone)
                .collect::<Result<_, _>>()?,
            background: self.background,
            zygote: self.zygote,
            init: None,
        })
    }

    /// Starts the sandbox with the lowest CPU weight, so that building it ahead of need
    /// never slows a sandbox that is running someone's code; [`Child::foreground`] gives it
    /// the default weight every other sandbox has. Without a cgroup this does nothing.
    pub fn background(mut self) -> Self {
        self.background = true;
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("invalid policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("{mechanism} is required by the policy but unavailable on this host: {reason} (see `airlock doctor`)")]
    Missing {
        mechanism: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("sandbox setup failed in {stage}: {error}")]
    Setup { stage: String, error: String },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(std::io::Error) -> SpawnError {
    move |source| SpawnError::Io { what, source }
}

/// Why the host killed a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KillReason {
    WallTime,
    CpuTime,
    Cancelled,
    /// The program broke the protocol of a channel the host serves (a malformed or
    /// oversized frame).
    Protocol,
}

/// How the program ended, as the kernel reported it to the sandbox's init.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub wall: Duration,
    /// CPU time of every process of the sandbox (cgroup), when cgroups were in force.
    pub cpu: Option<Duration>,
    /// CPU time of the program and the children it reaped (`wait4`), when it was reported.
    pub program_cpu: Option<Duration>,
    pub memory_peak_bytes: Option<u64>,
}

/// What was in force for one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    pub namespaces: Vec<String>,
    pub uid: u32,
    pub gid: u32,
    pub seccomp: bool,
    pub landlock: LandlockReport,
    pub cgroup: Option<CgroupVersion>,
    /// `no_new_privs` set and every capability (effective, permitted, inheritable, bounding,
    /// ambient) dropped before the program started.
    pub no_new_privs: bool,
    pub capabilities_dropped: bool,
    /// Mechanisms the caller explicitly disabled.
    pub downgraded: Vec<String>,
}

impl Isolation {
    /// What `policy` asks for, before the sandbox reports (Landlock's state comes from the
    /// kernel, once the program is confined).
    pub fn planned(policy: &Policy, cgroup: Option<CgroupVersion>) -> Isolation {
        let downgraded = [
            ("seccomp", policy.seccomp),
            ("landlock", policy.landlock),
            ("cgroups", policy.cgroups),
        ]
        .into_iter()
        .filter(|(_, e)| !e.is_required())
        .map(|(name, _)| name.to_owned())
        .collect();
        Isolation {
            namespaces: NAMESPACES.iter().map(|s| (*s).to_owned()).collect(),
            uid: policy.uid,
            gid: policy.gid,
            seccomp: policy.seccomp.is_required(),
            landlock: LandlockReport {
                state: LandlockState::NotEnforced,
                abi: None,
            },
            cgroup,
            no_new_privs: true,
            capabilities_dropped: true,
            downgraded,
        }
    }
}

/// Everything known once a sandbox is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// [`None`] when the program never reported (killed with its sandbox, or never started).
    pub exit: Option<Exit>,
    pub killed: Option<KillReason>,
    /// Processes the kernel's OOM killer killed inside the sandbox's memory cgroup.
    pub oom_kills: u64,
    /// Forks refused because the pids limit was reached.
    pub pids_limit_hits: u64,
    pub usage: Usage,
    pub isolation: Isolation,
    /// Time from `spawn` until the program was confined and about to exec.
    pub ready_after: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("sandbox setup failed in {stage}: {error}")]
    Setup { stage: String, error: String },
    #[error("sandbox status channel: {0}")]
    Protocol(String),
    #[error("cleaning up the sandbox: {0}")]
    Cleanup(#[from] CgroupError),
    #[error("the sandbox did not exit within {0:?} of being killed")]
    Stuck(Duration),
}

struct KillState {
    /// The outer init has been reaped: its pid may belong to someone else now.
    reaped: bool,
    reason: Option<KillReason>,
    /// The sandbox's PID 1, once the outer init has sent it.
    init: Option<OwnedFd>,
}

struct KillShared {
    outer_pid: i32,
    state: Mutex<KillState>,
    wake: OwnedFd,
}

/// Kills a sandbox from any thread.
///
/// The kill goes to the sandbox's PID 1 through a pidfd (immune to pid reuse); its death takes
/// the whole PID namespace, and the outer init then reaps it and exits. Killing the outer init
/// instead would orphan PID 1 to whatever init the host has, which may never reap it.
#[derive(Clone)]
pub struct Killer(Arc<KillShared>);

impl std::fmt::Debug for Killer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Killer")
            .field("outer_pid", &self.0.outer_pid)
            .finish()
    }
}

impl Killer {
    fn state(&self) -> MutexGuard<'_, KillState> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kills the sandbox. The first reason given is the one reported. Before the sandbox's
    /// PID 1 exists the kill is remembered and carried out the moment it does.
    pub fn kill(&self, reason: KillReason) {
        let mut state = self.state();
        if state.reaped || state.reason.is_some() {
            return;
        }
        state.reason = Some(reason);
        if let Some(init) = &state.init {
            let _ = sys::pidfd_send_signal(init, libc::SIGKILL);
        }
        let _ = nix::unistd::write(&self.0.wake, &[1]);
    }

    fn set_init(&self, init: OwnedFd) {
        let mut state = self.state();
        if state.reason.is_some() {
            let _ = sys::pidfd_send_signal(&init, libc::SIGKILL);
        }
        state.init = Some(init);
    }

    /// Last resort for a sandbox that did not die: SIGKILL the outer init itself.
    fn kill_outer(&self) {
        let state = self.state();
        if !state.reaped && self.0.outer_pid > 0 {
            let _ = kill(Pid::from_raw(self.0.outer_pid), Signal::SIGKILL);
        }
    }

    fn reason(&self) -> Option<KillReason> {
        self.state().reason
    }
}

/// A running sandbox.
#[derive(Debug)]
pub struct Child {
    /// The outer init; [`None`] for a zygote's child, whose processes are the zygote's.
    process: Option<OuterInit>,
    /// Until `finish` has run: nothing of the sandbox is left after it.
    running: bool,
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    status: OwnedFd,
    wake: OwnedFd,
    killer: Killer,
    cgroup: Option<SandboxCgroup>,
    started: Instant,
    /// Remove the emptied cgroup in the background (see `defer_cleanup`).
    defer_cleanup: bool,
    limits: Limits,
    isolation: Isolation,
    /// The isolation as the init reported it when the program started, for long-lived
    /// sandboxes whose owner cannot wait for the outcome (see [`Child::started_isolation`]).
    program_started: Arc<SetOnce<Isolation>>,
    /// The listener on the sandbox's loopback, until the host takes it to serve it.
    egress: Option<std::net::TcpListener>,
    /// Held while the sandbox lives: a zygote counts its children by these.
    lease: Option<Arc<()>>,
}

/// A value one thread sets and others wait for.
#[derive(Debug)]
pub struct SetOnce<T> {
    value: Mutex<Option<T>>,
    set: std::sync::Condvar,
}

impl<T> Default for SetOnce<T> {
    fn default() -> Self {
        SetOnce {
            value: Mutex::new(None),
            set: std::sync::Condvar::new(),
        }
    }
}

impl<T: Clone> SetOnce<T> {
    /// The value once it is set; [`None`] if that takes longer than `within`.
    pub fn wait(&self, within: Duration) -> Option<T> {
        let guard = self.value.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = self
            .set
            .wait_timeout_while(guard, within, |v| v.is_none())
            .unwrap_or_else(|e| e.into_inner());
        guard.clone()
    }

    pub fn is_set(&self) -> bool {
        self.value
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    pub fn set(&self, value: T) {
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        self.set.notify_all();
    }
}

/// Work a thread does while it waits for a sandbox ([`Child::wait_beside`]): moving its
/// input and output. Its descriptors go into the same poll as the sandbox's status, so it
/// must never block.
pub trait Beside {
    /// The descriptors to poll next, with the events wanted.
    fn fds(&self) -> Vec<(BorrowedFd<'_>, PollFlags)>;
    /// What that poll found, for each of them in order (none ready, on a timeout).
    fn polled(&mut self, events: &[PollFlags]);
}

/// Reads a sandbox's cgroup counters while it runs (CPU so far, peak memory); reads nothing
/// once the sandbox is gone.
#[derive(Debug)]
pub struct Probe(SandboxCgroup);

impl Probe {
    pub fn cpu(&self) -> Option<Duration> {
        self.0.cpu_usage()
    }

    pub fn stats(&self) -> crate::cgroup::Stats {
        self.0.stats()
    }
}

/// Starts `command` in a new sandbox built from `policy`.
///
/// The host process must call [`crate::run_if_init`] at the start of `main`: the sandbox's
/// init is this same binary, re-executed.
pub fn spawn(mut command: Command, policy: &Policy) -> Result<Child, SpawnError> {
    policy.validate()?;
    let host = host_support();
    let missing = |mechanism, reason: &String| SpawnError::Missing {
        mechanism,
        reason: reason.clone(),
    };
    host.user_namespaces
        .as_ref()
        .map_err(|r| missing("user namespaces", r))?;
    if policy.seccomp.is_required() {
        host.seccomp.as_ref().map_err(|r| missing("seccomp", r))?;
    }
    if policy.landlock.is_required() {
        host.landlock_abi
            .as_ref()
            .map_err(|r| missing("landlock", r))?;
    }
    let cgroup = if policy.cgroups.is_required() {
        let layout = host.cgroup.as_ref().map_err(|r| missing("cgroups", r))?;
        let cg = if command.zygote {
            SandboxCgroup::create_for_zygote(layout, &policy.limits, INIT_PROCESSES)?
        } else {
            SandboxCgroup::create(layout, &policy.limits, INIT_PROCESSES)?
        };
        if command.background {
            cg.set_cpu_weight(true)?;
        }
        Some(cg)
    } else {
        None
    };

    let n = command.fds.len() as RawFd;
    let prestarted = match command.init.take() {
        Some(init) if !command.zygote && init.serves(policy) => {
            ahead_parts(*init, policy, cgroup.as_ref(), command.fds.len())?
        }
        // Killed unused.
        _ => None,
    };
    let (process, host_end, stdio, pass, ahead) = match prestarted {
        // Its descriptors go with the request, the sources and cgroup files after them.
        Some(((process, host_end, stdio), sources, joins)) => {
            let mut pass = command.fds;
            let mask = sources.iter().map(Option::is_some).collect();
            pass.extend(sources.into_iter().flatten());
            let n_joins = joins.len() as u32;
            pass.extend(joins);
            (process, host_end, stdio, pass, Some((mask, n_joins)))
        }
        None => {
            let (host_end, init_end) = proto::seqpacket_pair().map_err(io_err("socketpair"))?;
            let (process, stdio) = start_init(&init_end, &command.fds)?;
            drop(init_end);
            drop(command.fds);
            (
                OuterInit::Spawned(process),
                host_end,
                stdio,
                Vec::new(),
                None,
            )
        }
    };

    let mut child = Child::assemble(Some(process), host_end, cgroup, policy, stdio)?;
    // The init waits for this request, so it is inside the cgroup before it does anything:
    // moved there by the host, or (v1) moving itself first thing.
    let mut join_cgroup = Vec::new();
    if let Some(cg) = &child.cgroup {
        match cg.self_join_files() {
            Some(_) if ahead.is_some() => {}
            Some(files) => join_cgroup = files,
            None => cg.add_process(child.id())?,
        }
    }
    let (passed_sources, passed_joins) = ahead.unwrap_or_default();
    let request = InitRequest {
        policy: policy.clone(),
        program: command.program,
        args: command.args,
        env: command.env.into_iter().collect(),
        extra_fds: n as u32,
        passed_sources,
        passed_joins,
        parent_pid: std::process::id() as i32,
        join_cgroup,
        zygote: command.zygote,
    };
    // Compiled once in this process; the init only installs them. Encoded before the request
    // goes: the init reads them right after it.
    let filters = if policy.seccomp.is_required() {
        let filters = crate::seccomp::Filters::shared().map_err(|e| SpawnError::Setup {
            stage: "seccomp".into(),
            error: e.to_string(),
        })?;
        Some(filters.encode())
    } else {
        None
    };
    let raw: Vec<RawFd> = pass.iter().map(AsRawFd::as_raw_fd).collect();
    proto::send_msg_with_fds(&child.status, &request, &raw)
        .map_err(io_err("sending the policy to the sandbox"))?;
    drop(pass);
    if let Some(filters) = filters {
        proto::send_raw(&child.status, &filters)
            .map_err(io_err("sending the seccomp filters to the sandbox"))?;
    }
    if policy.egress_port.is_some() {
        child.egress = Some(child.receive_listener()?);
    }
    Ok(child)
}

type Stdio3 = (Option<ChildStdin>, Option<ChildStdout>, Option<ChildStderr>);
type InitParts = (OuterInit, OwnedFd, Stdio3);
/// An init started ahead, the sources of its root's bind mounts and its cgroup `tasks` files.
type AheadParts = (InitParts, Vec<Option<OwnedFd>>, Vec<OwnedFd>);

/// What an init started ahead needs with its request that only the host can open: the
/// sources of the root's bind mounts (with the host's rights) and, on v1, the `tasks` files
/// of the sandbox's cgroup. [`None`] when they would not fit in one message with the program's
/// `program_fds` descriptors: the init is then killed unused and one is executed instead.
fn ahead_parts(
    init: Prestarted,
    policy: &Policy,
    cgroup: Option<&SandboxCgroup>,
    program_fds: usize,
) -> Result<Option<AheadParts>, SpawnError> {
    let sources = crate::init::open_sources(policy).map_err(|e| SpawnError::Setup {
        stage: "outer".into(),
        error: e.to_string(),
    })?;
    let joins = match cgroup {
        Some(cg) if cg.version() == crate::cgroup::CgroupVersion::V1 => cg.open_for_joining()?,
        _ => Vec::new(),
    };
    if program_fds + sources.iter().flatten().count() + joins.len() > proto::MAX_FDS {
        return Ok(None);
    }
    Ok(init.into_parts().map(|parts| (parts, sources, joins)))
}

/// Starts an outer init (this binary again, see `run_if_init`) with `status` as its status
/// socket and `fds` after it, where the init expects the program's descriptors.
fn start_init(
    status: &OwnedFd,
    fds: &[OwnedFd],
) -> Result<(std::process::Child, Stdio3), SpawnError> {
    let floor = FIRST_EXTRA_FD + fds.len() as RawFd;
    let lifted = sys::lift_fds(
        std::iter::once(status.as_fd()).chain(fds.iter().map(|f| f.as_fd())),
        floor,
    )
    .map_err(io_err("dup"))?;
    let moves: Vec<(RawFd, RawFd)> = lifted
        .iter()
        .enumerate()
        .map(|(i, fd)| {
            (
                fd.as_raw_fd(),
                if i == 0 {
                    STATUS_FD
                } else {
                    FIRST_EXTRA_FD + i as RawFd - 1
                },
            )
        })
        .collect();
    let mut std_cmd = std::process::Command::new(SELF);
    std_cmd
        .arg0("airlock-sandbox")
        .arg(INIT_ARG)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Terminal signals go to the host, which decides; the sandbox dies with it anyway.
        .process_group(0);
    sys::place_fds_in_child(&mut std_cmd, moves);
    let mut process = std_cmd
        .spawn()
        .map_err(io_err("starting the sandbox init"))?;
    let stdio = (
        process.stdin.take(),
        process.stdout.take(),
        process.stderr.take(),
    );
    Ok((process, stdio))
}

/// The host binary itself, as the init.
const SELF: &str = "/proc/self/exe";

/// A sandbox's outer init started before its sandbox is asked for, so that it is ready by
/// the time the host has prepared the rest: `airlock run` starts one first thing. It is a
/// fork of the host, made while the host is still single-threaded (no lock can be held
/// across the fork), that makes itself what an executed init is (stdio on pipes to the
/// host, the status socket at its place and nothing else open, its own process group, no
/// environment, named `airlock-sandbox`), makes what no request decides (it drops the host's
/// rights and makes its user namespace, mapping the default ids, and the mount, PID,
/// network, IPC and UTS namespaces) and then waits for the request that `spawn` sends it
/// with the program's descriptors and what it can no longer open itself. Forked, not
/// executed: an executed init spends a millisecond or two loading a binary before it can
/// listen. Dropped unused (or for a policy it does not serve), it is killed and reaped.
#[derive(Debug)]
pub struct Prestarted {
    process: Option<OuterInit>,
    status: Option<OwnedFd>,
    stdio: Stdio3,
}

impl Prestarted {
    /// Fails, starting nothing, when this process already runs more than one thread.
    pub fn start() -> Result<Prestarted, SpawnError> {
        let threads = std::fs::read_dir("/proc/self/task")
            .map_err(io_err("/proc/self/task"))?
            .count();
        if threads != 1 {
            return Err(SpawnError::Setup {
                stage: "init ahead".into(),
                error: format!("{threads} threads run here; a fork needs one"),
            });
        }
        let (host_end, init_end) = proto::seqpacket_pair().map_err(io_err("socketpair"))?;
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io_err("pipe2")(e.into()))
        };
        let (stdin_r, stdin_w) = pipe()?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let host = std::process::id() as i32;
        match sys::fork().map_err(|e| io_err("fork")(e.into()))? {
            nix::unistd::ForkResult::Child => {
                drop((host_end, stdin_w, stdout_r, stderr_r));
                crate::init::serve_forked([stdin_r, stdout_w, stderr_w, init_end], host)
            }
            nix::unistd::ForkResult::Parent { child } => Ok(Prestarted {
                process: Some(OuterInit::Forked {
                    pid: child.as_raw(),
                    reaped: false,
                }),
                status: Some(host_end),
                stdio: (
                    Some(ChildStdin::from(stdin_w)),
                    Some(ChildStdout::from(stdout_r)),
                    Some(ChildStderr::from(stderr_r)),
                ),
            }),
        }
    }

    /// Whether it can be the init of a sandbox with `policy`: it has made its user namespace
    /// already, mapping the default ids, and armed its parent-death signal.
    pub fn serves(&self, policy: &Policy) -> bool {
        crate::init::served_ahead(policy)
    }

    fn into_parts(mut self) -> Option<InitParts> {
        let stdio = std::mem::take(&mut self.stdio);
        Some((self.process.take()?, self.status.take()?, stdio))
    }
}

impl Drop for Prestarted {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
            process.wait();
        }
    }
}

/// A sandbox's outer init process.
#[derive(Debug)]
pub(crate) enum OuterInit {
    /// Executed for its sandbox ([`start_init`]).
    Spawned(std::process::Child),
    /// Forked ahead of its sandbox ([`Prestarted`]).
    Forked { pid: i32, reaped: bool },
}

impl OuterInit {
    fn id(&self) -> i32 {
        match self {
            OuterInit::Spawned(process) => process.id() as i32,
            OuterInit::Forked { pid, .. } => *pid,
        }
    }

    /// SIGKILL, unless it is reaped (its pid may be another process's by then).
    fn kill(&mut self) {
        match self {
            OuterInit::Spawned(process) => {
                let _ = process.kill();
            }
            OuterInit::Forked { pid, reaped: false } => {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            OuterInit::Forked { reaped: true, .. } => {}
        }
    }

    fn wait(&mut self) {
        match self {
            OuterInit::Spawned(process) => {
                let _ = process.wait();
            }
            OuterInit::Forked { pid, reaped } => {
                while !*reaped {
                    match nix::sys::wait::waitpid(Pid::from_raw(*pid), None) {
                        Err(nix::errno::Errno::EINTR) => continue,
                        _ => *reaped = true,
                    }
                }
            }
        }
    }
}

impl Child {
    /// The host's handle on a sandbox being started: `process` is its outer init (none for a
    /// zygote's child), `status` the host's end of its status socket.
    pub(crate) fn assemble(
        process: Option<OuterInit>,
        status: OwnedFd,
        cgroup: Option<SandboxCgroup>,
        policy: &Policy,
        stdio: (Option<ChildStdin>, Option<ChildStdout>, Option<ChildStderr>),
    ) -> Result<Child, SpawnError> {
        let (wake_r, wake_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(|e| SpawnError::Io {
                    what: "pipe2",
                    source: e.into(),
                })?;
        let killer = Killer(Arc::new(KillShared {
            outer_pid: process.as_ref().map_or(0, OuterInit::id),
            state: Mutex::new(KillState {
                reaped: false,
                reason: None,
                init: None,
            }),
            wake: wake_w,
        }));
        let isolation = Isolation::planned(policy, cgroup.as_ref().map(SandboxCgroup::version));
        Ok(Child {
            process,
            running: true,
            stdin: stdio.0,
            stdout: stdio.1,
            stderr: stdio.2,
            status,
            wake: wake_r,
            killer,
            cgroup,
            started: Instant::now(),
            defer_cleanup: false,
            limits: policy.limits.clone(),
            isolation,
            program_started: Arc::default(),
            egress: None,
            lease: None,
        })
    }

    pub(crate) fn set_lease(&mut self, lease: Arc<()>) {
        self.lease = Some(lease);
    }

    /// The outer init sends the egress listener first thing after creating the namespaces;
    /// anything else (a setup failure, an early end) means the sandbox cannot start.
    fn receive_listener(&mut self) -> Result<std::net::TcpListener, SpawnError> {
        let failed = |error: String| SpawnError::Setup {
            stage: "egress listener".into(),
            error,
        };
        let mut fds = [PollFd::new(self.status.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(LISTENER_WAIT_MS)) {
            Ok(0) => return Err(failed("the sandbox's init did not answer in time".into())),
            Ok(_) => {}
            Err(e) => return Err(failed(format!("poll: {e}"))),
        }
        match proto::recv_msg_with_fd::<Report>(&self.status) {
            Ok(Some((Report::Listener, Some(fd)))) => Ok(std::net::TcpListener::from(fd)),
            Ok(Some((Report::Failed { stage, error }, _))) => {
                Err(SpawnError::Setup { stage, error })
            }
            Ok(Some((other, _))) => Err(failed(format!("unexpected {other:?}"))),
            Ok(None) => Err(failed("the sandbox's init ended".into())),
            Err(e) => Err(failed(e.to_string())),
        }
    }

    /// The egress listener (see [`Policy::egress_port`]): a socket in the sandbox's network
    /// namespace, for the host to accept the program's connections on. Once only.
    pub fn take_egress_listener(&mut self) -> Option<std::net::TcpListener> {
        self.egress.take()
    }

    /// Gives a sandbox started in the [background](Command::background) the default CPU
    /// weight, the same as a sandbox started for its work.
    pub fn foreground(&self) -> Result<(), CgroupError> {
        match &self.cgroup {
            Some(cg) => cg.set_cpu_weight(false),
            None => Ok(()),
        }
    }

    /// The host pid of the sandbox's outer init.
    /// Whether this sandbox is a zygote's child (see [`crate::Zygote`]).
    pub fn is_zygote_child(&self) -> bool {
        self.process.is_none()
    }

    pub fn id(&self) -> u32 {
        self.killer.0.outer_pid as u32
    }

    pub fn killer(&self) -> Killer {
        self.killer.clone()
    }

    /// Readable once the sandbox has been killed (see [`Killer::kill`]): for a caller that
    /// waits for something else before it calls `wait`, which carries the kill out.
    pub(crate) fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Restarts the wall clock with `wall_time`: for a sandbox started ahead of its work (a
    /// warm pool), whose clock should run from when the work is handed to it. CPU time keeps
    /// counting from the start, as for any sandbox, so the two are billed alike. Every other
    /// limit stays as the policy set it.
    pub fn restart_clock(&mut self, wall_time: Duration) {
        self.started = Instant::now();
        self.limits.wall_time = wall_time;
    }

    /// Lets `wait` return once the sandbox's counters are read, leaving the removal of its
    /// cgroup to a background thread: once every process is gone, or, when the program ended
    /// by itself, with what is still on its way out (a zygote child's jail init, killed
    /// already, tearing down its namespaces) killed and waited for there. A process that uses
    /// this must call [`crate::settle`] before it exits.
    pub fn defer_cleanup(&mut self) {
        self.defer_cleanup = true;
    }

    /// Host pids of every process in the sandbox (from its cgroup; empty without one).
    /// Filled in when the program has started, by whichever thread waits for the sandbox.
    pub fn started_isolation(&self) -> Arc<SetOnce<Isolation>> {
        self.program_started.clone()
    }

    /// The sandbox's cgroup, read-only.
    pub(crate) fn cgroup_view(&self) -> Option<SandboxCgroup> {
        self.cgroup.as_ref().map(SandboxCgroup::view)
    }

    /// A reader of the cgroup's counters, when the sandbox has a cgroup.
    pub fn probe(&self) -> Option<Probe> {
        self.cgroup.as_ref().map(|cg| Probe(cg.view()))
    }

    pub fn processes(&self) -> Vec<i32> {
        self.cgroup
            .as_ref()
            .map(SandboxCgroup::pids)
            .unwrap_or_default()
    }

    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.stdout.take()
    }

    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.stderr.take()
    }

    /// Supervises the sandbox until it is gone: enforces the wall clock (and the sandbox-wide
    /// CPU time) by killing it, collects the program's exit and the cgroup's counters, and
    /// removes the cgroup. Nothing of the sandbox exists when this returns.
    pub fn wait(mut self) -> Result<Outcome, WaitError> {
        self.finish(None)
    }

    /// As [`wait`](Self::wait), doing `beside`'s work on this thread meanwhile: its
    /// descriptors are polled with the sandbox's own (it must never block).
    pub fn wait_beside(mut self, beside: &mut dyn Beside) -> Result<Outcome, WaitError> {
        self.finish(Some(beside))
    }

    fn finish(&mut self, mut beside: Option<&mut dyn Beside>) -> Result<Outcome, WaitError> {
        let deadline = self.started + self.limits.wall_time;
        let max_cpu = self
            .limits
            .wall_time
            .mul_f64(f64::from(self.limits.cpu_millicores) / 1000.0);
        let watch_cpu = self.cgroup.is_some() && self.limits.cpu_time < max_cpu;
        let mut exit = None;
        let mut program_cpu = None;
        let mut ready_after = None;
        let mut failure: Option<WaitError> = None;
        let mut killed_at: Option<Instant> = None;
        let mut stuck = false;
        loop {
            let now = Instant::now();
            if now >= deadline {
                self.killer.kill(KillReason::WallTime);
            }
            if watch_cpu
                && self.cgroup.as_ref().and_then(SandboxCgroup::cpu_usage)
                    >= Some(self.limits.cpu_time)
            {
                self.killer.kill(KillReason::CpuTime);
            }
            if self.killer.reason().is_some() && killed_at.is_none() {
                killed_at = Some(now);
            }
            let mut timeout = deadline.saturating_duration_since(now);
            if watch_cpu {
                timeout = timeout.min(CPU_TICK);
            }
            if let Some(at) = killed_at {
                let left = (at + KILL_GRACE).saturating_duration_since(now);
                if left.is_zero() {
                    stuck = true;
                    self.killer.kill_outer();
                    break;
                }
                timeout = timeout.max(Duration::from_millis(1)).min(left);
            }
            let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
            let theirs = beside.as_ref().map(|b| b.fds()).unwrap_or_default();
            let mut fds = vec![
                PollFd::new(self.status.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.wake.as_fd(), PollFlags::POLLIN),
            ];
            fds.extend(theirs.iter().map(|(fd, events)| PollFd::new(*fd, *events)));
            let polled = poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            );
            let events: Vec<PollFlags> = fds
                .iter()
                .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                .collect();
            drop((fds, theirs));
            match polled {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    failure = Some(WaitError::Protocol(format!("poll: {e}")));
                    self.killer.kill(KillReason::Cancelled);
                    continue;
                }
            }
            if let Some(b) = beside.as_mut() {
                b.polled(&events[2..]);
            }
            if !events[1].is_empty() {
                let mut buf = [0u8; 64];
                let _ = nix::unistd::read(&self.wake, &mut buf);
            }
            if events[0].is_empty() {
                continue;
            }
            match proto::recv_msg_with_fd::<Report>(&self.status) {
                Ok(None) => break,
                Ok(Some((Report::Started, Some(init)))) => self.killer.set_init(init),
                Ok(Some((Report::Started, None))) => {
                    failure.get_or_insert(WaitError::Protocol(
                        "no pidfd for the sandbox's init".into(),
                    ));
                }
                // Only ever sent first, and taken by `spawn`.
                Ok(Some((Report::Listener, _))) => {
                    failure.get_or_insert(WaitError::Protocol("a second egress listener".into()));
                }
                Ok(Some((Report::Ready { landlock }, _))) => {
                    self.isolation.landlock = landlock;
                    self.program_started.set(self.isolation.clone());
                    ready_after = Some(self.started.elapsed());
                }
                Ok(Some((
                    Report::Exited {
                        code,
                        signal,
                        cpu_us,
                    },
                    _,
                ))) => {
                    exit = code.map(Exit::Code).or(signal.map(Exit::Signal));
                    program_cpu = Some(Duration::from_micros(cpu_us));
                }
                Ok(Some((Report::Failed { stage, error }, _))) => {
                    failure.get_or_insert(WaitError::Setup { stage, error });
                }
                Err(e) => {
                    failure.get_or_insert(WaitError::Protocol(e.to_string()));
                    self.killer.kill(KillReason::Cancelled);
                }
            }
        }
        let wall = self.started.elapsed();
        self.reap();
        self.running = false;
        self.lease = None;
        let cgroup = self.cgroup.take();
        let stats = cgroup
            .as_ref()
            .map(SandboxCgroup::stats)
            .unwrap_or_default();
        if let Some(cg) = cgroup {
            // `remove` kills whatever it finds left. A zygote's child that ended by itself
            // leaves its jail's init, killed already, on its way out (its mount namespace's
            // teardown, a millisecond or more): the background waits for it. Anything else
            // goes there only once the cgroup is empty.
            let ended_by_itself =
                exit.is_some() && self.killer.reason().is_none() && failure.is_none();
            if self.defer_cleanup && (ended_by_itself || cg.kill_all()) {
                cg.remove_later()?;
            } else {
                cg.remove()?;
            }
        }
        if stuck {
            return Err(WaitError::Stuck(KILL_GRACE));
        }
        if let Some(err) = failure {
            return Err(err);
        }
        Ok(Outcome {
            exit,
            killed: self.killer.reason(),
            oom_kills: stats.oom_kills,
            pids_limit_hits: stats.pids_limit_hits,
            usage: Usage {
                wall,
                cpu: stats.cpu,
                program_cpu,
                memory_peak_bytes: stats.memory_peak_bytes,
            },
            isolation: self.isolation.clone(),
            ready_after,
        })
    }

    /// Reaps the outer init, holding the kill lock so no signal can reach a recycled pid.
    /// The status socket has reached EOF, so it has exited or is exiting.
    fn reap(&mut self) {
        let Some(mut process) = self.process.take() else {
            return;
        };
        process.wait();
        let mut state = self.killer.state();
        state.reaped = true;
        state.init = None;
    }
}

impl Drop for Child {
    /// A sandbox abandoned without `wait` is killed and cleaned up all the same.
    fn drop(&mut self) {
        if self.running {
            self.killer.kill(KillReason::Cancelled);
            let _ = self.finish(None);
        }
    }
}
