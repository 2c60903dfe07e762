//! Zygotes: one interpreter started once, with its modules loaded, whose forks become fresh
//! sandboxes. Each child gets its own jail, built by the same code as a cold sandbox (`jail`):
//! new user, PID, mount, network, IPC, UTS and cgroup namespaces, a uid of its own, a root
//! (its read-only part built once per template and shared, its `/proc` and scratch tmpfs its
//! own), its own cgroup, rlimits, `no_new_privs`, no capabilities,
//! Landlock and seccomp.
//!
//! This module is the host's side ([`Zygote`]). The inside, in the order one child comes to
//! be, one module per process:
//! 1. `template`: the template jail's init (built by `init` as any sandbox's, its outer
//!    mapping a block of host ids, `ids`), which starts the zygote and builds one jail per
//!    child, and each jail's init;
//! 2. `state`: the zygote, which asks for a child's jail, forks the child into it and reaps
//!    it (its Python, `zygote.py`, calls in through `sys::abi`);
//! 3. `child`: the child, which enters its jail and confines itself.
//!
//! `messages` is what they say to one another.
//!
//! What children share by construction, being forks of one process: the address-space layout
//! (ASLR is per zygote, not per child), the stack canary, the hash seed and the preloads' state,
//! but for their generators of random numbers, reseeded in each child (`zygote.py`) or wiped
//! in the zygote (OpenSSL's). Callers bound that by retiring a zygote after a number of
//! children or an age (see [`Zygote::retire`]). What the zygote receives for one child
//! (policies, arguments, environments) is wiped before the next is forked (`state`, `child`).

pub(crate) mod child;
pub(crate) mod ids;
mod messages;
pub(crate) mod state;
pub(crate) mod template;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, ChildStdin, ChildStdout};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd;

use crate::cgroup::SandboxCgroup;
use crate::host::host_support;
use crate::policy::{Policy, RootEntry};
use crate::proto;
use crate::spawn::{spawn, Child, Command, SpawnError};
use ids::{block_base, ZYGOTE_IDS};
use messages::{ChildRequest, ZygoteReady};

/// The zygote's Python: how its children end (`finish.py`), then the zygote.
const ZYGOTE_PY: &str = concat!(include_str!("finish.py"), include_str!("zygote.py"));
/// How a sandbox's Python ends without the interpreter's whole shutdown, as a zygote's
/// children do: Python that defines `_finish(status, loaded)` and its helpers, for a program
/// that ends its cold sandboxes the same way (airlock's runner).
pub const FINISH_PY: &str = include_str!("finish.py");
/// Where the zygote finds airlock's library inside its template (children never see it).
const LIBRARY_TARGET: &str = "/.zygote/libairlock_sandbox.so";
/// The zygote's Python, a file in its template's root: on its command line it was the ~50 KB
/// that `ps` showed for the zygote and each of its children.
const SCRIPT_TARGET: &str = "/.zygote/zygote.py";
/// Its arguments but the preloads (which stay on its command line, to tell zygotes apart in
/// `ps`), NUL-separated: the library, the program, the preloads' `sys.path`, whether to
/// prepare, what more to run then, the warm-up (`zygote.py` reads them).
const ARGUMENTS_TARGET: &str = "/.zygote/arguments";
/// The library's file name, as cargo builds it next to the binaries.
pub const LIBRARY_NAME: &str = "libairlock_sandbox.so";
/// How long a zygote may take to load its modules.
const START_WAIT_MS: u16 = 60_000;
/// How much of the zygote's own output is kept, for the reason it failed.
const LOG_BYTES: usize = 8 << 10;

/// What a zygote runs: `python <flags> -c <code>`, with `preload` imported first.
#[derive(Clone, Debug)]
pub struct ZygoteSpec {
    pub python: PathBuf,
    /// Interpreter options before `-c`, the same for the zygote and its children.
    pub flags: Vec<String>,
    pub code: String,
    /// Modules imported once in the zygote (a failed import is logged, not fatal).
    pub preload: Vec<String>,
    /// Python run once in the zygote right after the preloads, in a namespace of its own and
    /// while `sys_path` is still on `sys.path`: what each child would otherwise pay the first
    /// time it uses a preload (a first chart's fonts and caches). A `__zygote_rehearse__` it
    /// defines runs again, before the program's own, in the fork the zygote surveys (see
    /// [`Zygote::prefault_bytes`]). One that raises is logged, and its rehearsal skipped.
    pub warm_up: String,
    /// The zygote's environment (each child gets the one it is spawned with; one spawned with
    /// this one has nothing to change).
    pub env: BTreeMap<String, String>,
    /// More environment for the zygote's preloads, warm-up and preparation only (what a
    /// library reads as it loads: its thread counts), unset before its first child.
    pub preload_env: BTreeMap<String, String>,
    /// airlock's library on the host ([`LIBRARY_NAME`], built from this crate).
    pub library: PathBuf,
    /// Directories on `sys.path` while the preloads are imported (and only then: the program
    /// sets its own).
    pub sys_path: Vec<String>,
    /// The program, run with the one argument `--zygote`, only defines things, among them a
    /// function `__zygote_start__` that does the rest: the zygote runs it so once, and each
    /// child only calls that function.
    pub prepare: bool,
    /// Run in the program's namespace right after it, when `prepare` is set: definitions the
    /// program would otherwise load on demand in every child. Children are served by `code`.
    pub prepare_more: String,
}

impl ZygoteSpec {
    /// The zygote for children that run `command` (`python <flags> -c <code> ...`); [`None`]
    /// for any other command.
    pub fn for_command(
        command: &Command,
        preload: Vec<String>,
        sys_path: Vec<String>,
        library: PathBuf,
    ) -> Option<ZygoteSpec> {
        let c = command.args.iter().position(|a| a == "-c")?;
        let code = command.args.get(c + 1)?.clone();
        Some(ZygoteSpec {
            python: command.program.clone(),
            flags: command.args[1..c].to_vec(),
            code,
            preload,
            warm_up: String::new(),
            env: command.env.clone(),
            preload_env: BTreeMap::new(),
            library,
            sys_path,
            prepare: false,
            prepare_more: String::new(),
        })
    }
}

/// A running zygote. Its children are ordinary [`Child`]ren. Dropping it kills it with
/// every child it has; [`Zygote::retire`] lets the children finish first.
#[derive(Debug)]
pub struct Zygote {
    control: Mutex<Option<OwnedFd>>,
    template: Mutex<Option<Child>>,
    /// The policy root its template holds, which every child's must equal.
    root: Vec<RootEntry>,
    argv: Vec<String>,
    spawned: AtomicU64,
    started: Instant,
    log: Arc<Mutex<Vec<u8>>>,
    /// One clone per live child (see [`Zygote::children`]).
    leases: Arc<()>,
    /// Kills the template (and with it every child), wherever its [`Child`] is being waited for.
    killer: crate::Killer,
    /// Set once the template has been waited for: nothing of the zygote is left.
    ended: Arc<crate::SetOnce<bool>>,
    prefault_bytes: u64,
    /// The template's cgroup when it is a leaf of a tree of the zygote's own (v2), where
    /// each child's cgroup is made beside it (see [`SandboxCgroup::create_for_zygote`]).
    tree: Option<SandboxCgroup>,
    /// The template's block of host ids: its first, the template's root's.
    block: u32,
    clones_into_cgroups: bool,
}

impl Zygote {
    /// Starts a zygote whose children will have `policy`'s root. Needs root on the host: the
    /// template maps a block of host ids, one per child.
    pub fn start(spec: &ZygoteSpec, policy: &Policy) -> Result<Zygote, SpawnError> {
        Self::start_watched(spec, policy, |_| {})
    }

    /// As [`Zygote::start`], handing `started` the template's killer as soon as it runs:
    /// whoever no longer wants the zygote (a server shutting down) can end its start, which
    /// then fails, instead of waiting until it is ready or given up.
    pub fn start_watched(
        spec: &ZygoteSpec,
        policy: &Policy,
        started: impl FnOnce(crate::Killer),
    ) -> Result<Zygote, SpawnError> {
        if !unistd::geteuid().is_root() {
            return Err(SpawnError::Missing {
                mechanism: "zygote",
                reason: "only a host process running as root can map a block of uids".into(),
            });
        }
        if policy.egress_port.is_some() || !policy.seccomp.is_required() {
            // Its seccomp filters are the children's (installed once, inherited).
            return Err(SpawnError::Setup {
                stage: "zygote".into(),
                error: "a zygote serves sandboxes with seccomp and without egress only".into(),
            });
        }
        std::fs::metadata(&spec.library).map_err(|source| SpawnError::Io {
            what: "the zygote library",
            source,
        })?;
        if let Some(name) = spec.preload_env.keys().find(|name| {
            name.is_empty() || name.contains(['=', '\n', '\0']) || spec.env.contains_key(*name)
        }) {
            return Err(SpawnError::Setup {
                stage: "zygote".into(),
                error: format!("{name:?} cannot be a variable of the preloads' environment"),
            });
        }
        let preload_env = spec
            .preload_env
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n");
        let arguments = [
            LIBRARY_TARGET,
            &spec.code,
            &spec.sys_path.join("\n"),
            if spec.prepare { "1" } else { "0" },
            &spec.prepare_more,
            &spec.warm_up,
            &preload_env,
        ];
        if arguments.iter().any(|a| a.contains('\0')) {
            return Err(SpawnError::Setup {
                stage: "zygote".into(),
                error: "its program, preload path, preparation or warm-up holds a NUL byte".into(),
            });
        }
        let mut template = policy.clone();
        template.root.extend([
            RootEntry::ReadOnly {
                source: spec.library.clone(),
                target: LIBRARY_TARGET.into(),
            },
            RootEntry::File {
                path: SCRIPT_TARGET.into(),
                contents: ZYGOTE_PY.to_owned(),
            },
            RootEntry::File {
                path: ARGUMENTS_TARGET.into(),
                contents: arguments.join("\0"),
            },
        ]);
        // The zygote lives until retired; what it may use is its own, apart from children's.
        template.limits.wall_time = Duration::from_secs(400 * 24 * 3600);
        template.limits.cpu_time = template.limits.wall_time;
        template.limits.memory_bytes = template.limits.memory_bytes.max(2 << 30);
        template.limits.pids = template.limits.pids.max(256);
        let (ours, theirs) = proto::seqpacket_pair().map_err(|source| SpawnError::Io {
            what: "socketpair",
            source,
        })?;
        let mut argv = vec![spec.python.to_string_lossy().into_owned()];
        argv.extend(spec.flags.iter().cloned());
        argv.extend(["-c".to_owned(), spec.code.clone()]);
        // `ps` shows `python3 -I -S -B /.zygote/zygote.py numpy,pandas,...` (or no preloads:
        // the lean zygote), for the zygote and each of its children.
        let preloads = (!spec.preload.is_empty()).then(|| spec.preload.join(","));
        let mut command = Command::new(spec.python.clone())
            .args(spec.flags.iter().cloned())
            .args(std::iter::once(SCRIPT_TARGET.to_owned()).chain(preloads))
            .pass_fd(theirs);
        for (key, value) in spec.env.iter().chain(&spec.preload_env) {
            command = command.env(key.clone(), value.clone());
        }
        command.zygote = true;
        let mut child = spawn(command, &template)?;
        started(child.killer());
        // On v2 the zygote clones each child into its cgroup by its own ids (the block's
        // first): the tree is theirs to move processes within, each child's cgroup too.
        let block = block_base(child.id() as i32);
        let tree = child.cgroup_view().filter(|cg| cg.tree().is_some());
        if let Some(tree) = &tree {
            tree.delegate_tree(block)?;
        }
        let log = Arc::new(Mutex::new(Vec::new()));
        drop(child.take_stdin());
        if let Some(out) = child.take_stdout() {
            keep_tail(out, Arc::clone(&log));
        }
        if let Some(err) = child.take_stderr() {
            keep_tail(err, Arc::clone(&log));
        }
        // Ready once its modules are loaded; or it failed, and the template says why; or it
        // was killed (`started`'s killer), which only `wait` carries out.
        let mut fds = [
            PollFd::new(ours.as_fd(), PollFlags::POLLIN),
            PollFd::new(child.wake_fd(), PollFlags::POLLIN),
        ];
        let waited = poll(&mut fds, PollTimeout::from(START_WAIT_MS));
        let killed = fds[1].any().unwrap_or(false);
        let ready = match waited {
            Ok(n) if n > 0 && !killed => proto::recv_msg::<ZygoteReady>(&ours).ok().flatten(),
            _ => None,
        };
        let Some(ready) = ready else {
            child.killer().kill(crate::KillReason::Cancelled);
            let why = match child.wait() {
                _ if killed => "killed before it was ready".to_owned(),
                Err(crate::WaitError::Setup { stage, error }) => format!("{stage}: {error}"),
                _ if waited == Ok(0) => "not ready in time".to_owned(),
                _ => "ended before it was ready".to_owned(),
            };
            std::thread::sleep(Duration::from_millis(50));
            let tail = String::from_utf8_lossy(&log.lock().unwrap_or_else(|e| e.into_inner()))
                .into_owned();
            return Err(SpawnError::Setup {
                stage: "zygote".into(),
                error: format!(
                    "{why}{}{}",
                    if tail.is_empty() { "" } else { ": " },
                    tail.trim()
                ),
            });
        };
        Ok(Zygote {
            prefault_bytes: ready.prefault_bytes,
            clones_into_cgroups: ready.clones_into_cgroups,
            tree,
            block,
            control: Mutex::new(Some(ours)),
            killer: child.killer(),
            ended: Arc::default(),
            template: Mutex::new(Some(child)),
            root: policy.root.clone(),
            argv,
            spawned: AtomicU64::new(0),
            started: Instant::now(),
            log,
            leases: Arc::new(()),
        })
    }

    /// Whether a sandbox with `policy` running `command` can be a child of this zygote: the
    /// same root, the same interpreter and program, seccomp (the zygote's filters are its
    /// children's), no egress listener.
    pub fn serves(&self, command: &Command, policy: &Policy) -> bool {
        policy.root == self.root
            && policy.egress_port.is_none()
            && policy.seccomp.is_required()
            && command.program.to_string_lossy() == self.argv[0]
            && command.args.len() >= self.argv.len()
            && command.args[1..self.argv.len()] == self.argv[1..]
    }

    /// How much of the zygote's memory each child copies before its program runs, while no
    /// request waits for it: the pages a child writes (the `__zygote_rehearse__` of its
    /// warm-up and of its program, where they define one), found once when the zygote
    /// started; 0 when it surveys nothing.
    pub fn prefault_bytes(&self) -> u64 {
        self.prefault_bytes
    }

    /// Whether the zygote can clone a child straight into its cgroup (`clone3` with
    /// `CLONE_INTO_CGROUP`) rather than fork it and move it, which on cgroup v2 waits for an
    /// RCU grace period: it can when it is single-threaded and the kernel says where glibc
    /// keeps its thread id. On v1 children join through `tasks` either way.
    pub fn clones_into_cgroups(&self) -> bool {
        self.clones_into_cgroups
    }

    /// Whether the zygote still takes requests.
    pub fn is_alive(&self) -> bool {
        let guard = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let Some(control) = guard.as_ref() else {
            return false;
        };
        let mut fds = [PollFd::new(control.as_fd(), PollFlags::empty())];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => true,
            Ok(_) => !fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
            Err(_) => false,
        }
    }

    /// Host pids of the zygote's own processes (its template's init, the zygote, the
    /// jails' inits until they join their children's cgroups).
    pub fn processes(&self) -> Vec<i32> {
        self.template
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Child::processes)
            .unwrap_or_default()
    }

    /// Children alive now.
    pub fn children(&self) -> usize {
        Arc::strong_count(&self.leases) - 1
    }

    /// Children made so far.
    pub fn spawned(&self) -> u64 {
        self.spawned.load(Ordering::Relaxed)
    }

    pub fn age(&self) -> Duration {
        self.started.elapsed()
    }

    /// The end of what the zygote wrote (its errors, a failed preload).
    pub fn log_tail(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// Starts `command` as a child of the zygote, in a jail built from `policy` (which
    /// [`Zygote::serves`] must accept). The child is supervised like any sandbox.
    pub fn spawn(&self, command: Command, policy: &Policy) -> Result<Child, SpawnError> {
        policy.validate()?;
        if !self.serves(&command, policy) {
            return Err(SpawnError::Setup {
                stage: "zygote".into(),
                error: "this zygote does not serve that policy or program".into(),
            });
        }
        // One host id of the block per child, the template's root's excepted.
        if self.children() + 1 >= ZYGOTE_IDS as usize {
            return Err(SpawnError::Setup {
                stage: "zygote".into(),
                error: "every uid of the zygote's block is in use".into(),
            });
        }
        let host = host_support();
        let cgroup = if policy.cgroups.is_required() {
            let layout = host.cgroup.as_ref().map_err(|r| SpawnError::Missing {
                mechanism: "cgroups",
                reason: r.clone(),
            })?;
            // The jail's init is in it too.
            let cg = match &self.tree {
                Some(tree) => {
                    let cg = tree.create_in_tree(&policy.limits, 1)?;
                    cg.delegate(self.block)?;
                    cg
                }
                None => SandboxCgroup::create(layout, &policy.limits, 1)?,
            };
            if command.background {
                cg.set_cpu_weight(true)?;
            }
            Some(cg)
        } else {
            None
        };
        let io = |what: &'static str| {
            move |e: nix::errno::Errno| SpawnError::Io {
                what,
                source: e.into(),
            }
        };
        // On v2 the jail's init and the child are cloned into the cgroup (its directory is
        // passed); on v1 each joins by itself, a fresh fork and so one thread, through
        // `tasks`. Either spares the join an RCU grace period waited for under the cgroup
        // lock (a stall for everything else that takes it).
        let (joins, into_cgroup): (Vec<OwnedFd>, bool) = match &cgroup {
            Some(cg) if cg.tree().is_some() => (vec![cg.open_dir()?], true),
            Some(cg) => (cg.open_for_joining()?, false),
            None => (Vec::new(), false),
        };
        let (status, theirs) = proto::seqpacket_pair().map_err(|source| SpawnError::Io {
            what: "socketpair",
            source,
        })?;
        let pipe = || unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io("pipe2"));
        let (stdin_r, stdin_w) = pipe()?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let mut child_policy = policy.clone();
        // The child's root is built from the template's, where each entry is already mounted.
        for entry in &mut child_policy.root {
            if let RootEntry::ReadOnly { source, target } | RootEntry::Writable { source, target } =
                entry
            {
                source.clone_from(target);
            }
        }
        let request = ChildRequest {
            policy: child_policy,
            args: command.args[self.argv.len()..].to_vec(),
            env: command.env.into_iter().collect(),
            join_cgroup: joins.len() as u32,
            into_cgroup,
            extra_fds: command.fds.len() as u32,
        };
        let mut raw: Vec<RawFd> = vec![
            theirs.as_raw_fd(),
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
        ];
        raw.extend(joins.iter().map(|f| f.as_raw_fd()));
        raw.extend(command.fds.iter().map(|f| f.as_raw_fd()));
        {
            let guard = self.control.lock().unwrap_or_else(|e| e.into_inner());
            let control = guard.as_ref().ok_or_else(|| SpawnError::Setup {
                stage: "zygote".into(),
                error: "the zygote is retired".into(),
            })?;
            proto::send_msg_with_fds(control, &request, &raw).map_err(|source| SpawnError::Io {
                what: "asking the zygote for a child",
                source,
            })?;
        }
        self.spawned.fetch_add(1, Ordering::Relaxed);
        let stdio = (
            Some(ChildStdin::from(stdin_w)),
            Some(ChildStdout::from(stdout_r)),
            Some(ChildStderr::from(stderr_r)),
        );
        let mut child = Child::assemble(None, status, cgroup, policy, stdio)?;
        child.set_lease(Arc::clone(&self.leases));
        Ok(child)
    }

    /// Closes the control socket (the zygote takes no more children and ends once those it
    /// has are gone) and hands over the template to wait for, unless someone has it already.
    fn stop_taking_children(&self) -> Option<Child> {
        drop(
            self.control
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        self.template
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Kills the zygote and every child it has, and waits until they are gone.
    pub fn shutdown(&self) {
        let template = self.stop_taking_children();
        self.killer.kill(crate::KillReason::Cancelled);
        match template {
            Some(template) => {
                let _ = template.wait();
                self.ended.set(true);
            }
            // Retiring: its waiter says when it is gone.
            None => {
                self.ended.wait(Duration::from_secs(10));
            }
        }
    }

    /// Takes no more children (whoever else holds the zygote), and waits until it has ended,
    /// its children having finished first.
    pub fn retire(&self) {
        if let Some(template) = self.stop_taking_children() {
            let _ = template.wait();
            self.ended.set(true);
        }
    }
}

/// Keeps the last `LOG_BYTES` of a stream in `log`, from a thread, until it ends.
fn keep_tail(mut stream: impl Read + Send + 'static, log: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.extend_from_slice(&buf[..n]);
            let over = log.len().saturating_sub(LOG_BYTES);
            log.drain(..over);
        }
    });
}

/// Where cargo puts the library for a binary at `exe`: beside it (or one directory up, for
/// test binaries in `deps/`).
pub fn library_beside(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    [dir.join(LIBRARY_NAME), dir.parent()?.join(LIBRARY_NAME)]
        .into_iter()
        .find(|p| p.is_file())
}
