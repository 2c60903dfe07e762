//! How the engine's sandboxes are started: the runner's command, then a zygote's child where
//! one serves it, or else a cold sandbox (with the runner compiled once, and an init started
//! ahead when there is one). The engine, its warm pools and its sessions share a `Launcher`:
//! none of them holds another.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_sandbox::{spawn, Child, Command, KillReason, Policy, Prestarted, SpawnError};

use crate::compiled::CompiledRunner;
use crate::error::EngineError;
use crate::interpreter::Interpreter;
use crate::policy::{EnvMount, CA_BUNDLE, ENV_MOUNT, PIP_TARGET, WORKDIR};
use crate::runner;
use crate::zygotes::Zygotes;

/// How long a sandbox's runner may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How the runner of a new sandbox starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Reads its request at once.
    Cold,
    /// Says it is ready, then waits for its request (the warm pool).
    Warm,
    /// Serves frames until the channel closes.
    Session,
}

/// What starts the engine's sandboxes. Cheap to clone: what it shares is behind an `Arc`.
#[derive(Clone, Debug)]
pub(crate) struct Launcher {
    pub(crate) interpreter: Interpreter,
    /// The runner compiled once, for cold sandboxes (see `Engine::use_compiled_runner`).
    pub(crate) compiled: Option<CompiledRunner>,
    /// An init started ahead for the next cold sandbox (see `Engine::use_prestarted`).
    pub(crate) prestarted: Arc<Mutex<Option<Prestarted>>>,
    /// Fresh sandboxes as forks of a zygote, where one serves them (see `zygotes`).
    pub(crate) zygotes: Option<Arc<Zygotes>>,
}

impl Launcher {
    pub(crate) fn new(interpreter: Interpreter) -> Self {
        Launcher {
            interpreter,
            compiled: None,
            prestarted: Arc::default(),
            zygotes: None,
        }
    }

    /// Whether `code` runs in a child of the zygote that preloads modules (see `zygotes`).
    pub(crate) fn wants_preloads(&self, code: &str) -> bool {
        self.zygotes
            .as_ref()
            .is_some_and(|z| z.wants_preloads(code))
    }

    /// Starts a sandbox with `policy` running the runner in `mode`, and returns it with the
    /// host's end of the runner's channel (and `tools`, the sandbox's end of the tool channel,
    /// at descriptor 4). A warm runner reports ready on the channel before it reads; a
    /// session's serves requests until the channel closes. `preload` asks for a child of the
    /// zygote that preloads modules.
    pub(crate) fn start(
        &self,
        policy: &Policy,
        mode: Mode,
        tools: Option<OwnedFd>,
        preload: bool,
    ) -> Result<(Child, UnixStream), EngineError> {
        let (control, theirs) = socket_pair()?;
        let tools_passed = tools.is_some();
        let mut command = self.command(policy, theirs, tools);
        match mode {
            Mode::Cold => {}
            // Built ahead of need: in the background until taken.
            Mode::Warm => command = command.arg("warm").background(),
            Mode::Session => command = command.arg("session"),
        }
        let Some(zygotes) = &self.zygotes else {
            return Ok((self.spawn_cold(command, policy)?, control));
        };
        let sys_path = || self.sys_path(policy);
        if mode == Mode::Warm && preload {
            return match zygotes.spawn_preloaded(command, policy, sys_path) {
                Some(child) => Ok((child?, control)),
                None => Err(EngineError::ZygoteNotReady),
            };
        }
        if mode == Mode::Cold {
            if tools_passed {
                zygotes.count_cold("tools");
                return Ok((self.spawn_cold(command, policy)?, control));
            }
            // Says it is ready first, so that a child that never started (its zygote died
            // meanwhile) is noticed before the request is sent, and the job starts cold.
            let command = command.arg("warm");
            return match zygotes.spawn(command, policy, preload, sys_path) {
                Ok(child) => {
                    if let Some(child) = ready_or_gone(child, &control) {
                        return Ok((child, control));
                    }
                    zygotes.count_cold("child_lost");
                    self.start_cold(policy)
                }
                Err(_) => self.start_cold(policy),
            };
        }
        match zygotes.spawn(command, policy, preload, sys_path) {
            Ok(child) => Ok((child, control)),
            Err(command) => Ok((self.spawn_cold(command, policy)?, control)),
        }
    }

    /// A cold sandbox whose runner reads its request at once, never a zygote's child.
    fn start_cold(&self, policy: &Policy) -> Result<(Child, UnixStream), EngineError> {
        let (control, theirs) = socket_pair()?;
        let command = self.command(policy, theirs, None);
        Ok((self.spawn_cold(command, policy)?, control))
    }

    /// Starts `command`, a runner's, cold: with the compiled runner when there is one, and
    /// the init started ahead when there is one.
    fn spawn_cold(&self, mut command: Command, policy: &Policy) -> Result<Child, SpawnError> {
        if let Some(compiled) = &self.compiled {
            if let Ok(fd) = compiled.descriptor() {
                let boot = compiled.boot(3 + command.passed_fds());
                if command.replace_arg(runner::source(), boot) {
                    command = command.pass_fd(fd);
                }
            }
        }
        let init = self
            .prestarted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(init) = init {
            command = command.prestarted(init);
        }
        spawn(command, policy)
    }

    /// The runner's command for a sandbox with `policy`, its channel at descriptor 3 (and the
    /// tool channel at 4, when given).
    fn command(&self, policy: &Policy, theirs: UnixStream, tools: Option<OwnedFd>) -> Command {
        let mut command = Command::new(self.interpreter.path.clone())
            .args(["-I", "-S", "-B", "-c", runner::source()])
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", WORKDIR)
            .env("LANG", "C.UTF-8")
            .env("TMPDIR", "/tmp")
            // Headless charts; matplotlib's caches in /tmp, not in the working directory, and
            // its settings from its data (Debian's build looks only in /etc otherwise).
            .env("MPLBACKEND", "Agg")
            .env("MPLCONFIGDIR", "/tmp/matplotlib")
            .env("MATPLOTLIBRC", "/usr/share/matplotlib/mpl-data")
            // `pip install` goes to the sandbox's own scratch (on sys.path; pip's check for a
            // system-managed interpreter does not apply to a target directory).
            .env("PIP_TARGET", PIP_TARGET)
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .env("PIP_NO_CACHE_DIR", "1")
            .pass_fd(OwnedFd::from(theirs));
        if let Some(fd) = tools {
            command = command.pass_fd(fd); // TOOLS_FD
        }
        if has_environment(policy) {
            command = command
                .env("PATH", format!("{}/bin:/usr/bin:/bin", ENV_MOUNT))
                .env("VIRTUAL_ENV", ENV_MOUNT);
        }
        if let Some(port) = policy.egress_port {
            // What pip, requests, httpx, urllib and curl all read.
            let proxy = format!("http://127.0.0.1:{port}");
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                command = command.env(name, proxy.clone());
            }
            if policy.root.iter().any(|e| e.path() == Path::new(CA_BUNDLE)) {
                for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT"] {
                    command = command.env(name, CA_BUNDLE);
                }
            }
        }
        command
    }

    /// Waits until the zygote that would make a sandbox with `policy` for `code` is ready
    /// (starting it if need be); errors say why it cannot be.
    pub(crate) fn wait_for_zygote(
        &self,
        policy: &Policy,
        code: &str,
        within: Duration,
    ) -> Result<(), String> {
        let zygotes = self.zygotes.as_ref().ok_or("zygotes are not started")?;
        let (_control, theirs) = socket_pair().map_err(|e| e.to_string())?;
        let command = self.command(policy, theirs, None).arg("warm");
        let preload = zygotes.wants_preloads(code);
        zygotes.wait_ready(&command, policy, preload, || self.sys_path(policy), within)
    }

    /// `sys.path` after the standard library in a sandbox with `policy`'s root: the
    /// environment's site-packages first, then the interpreter's own packages (a job's request
    /// adds where `pip install` puts packages, see `request::for_job`).
    pub(crate) fn sys_path(&self, policy: &Policy) -> Vec<String> {
        let mut path = Vec::new();
        if has_environment(policy) {
            path.push(EnvMount::site_packages(&self.interpreter.version));
        }
        path.extend(self.interpreter.extra_sys_path.iter().cloned());
        path
    }
}

/// Whether a sandbox with `policy` has an environment mounted at `/env`.
fn has_environment(policy: &Policy) -> bool {
    policy.root.iter().any(|e| e.path() == Path::new(ENV_MOUNT))
}

/// Whether a warm runner said it is ready (its one byte, `R`) within `READY_TIMEOUT`; its
/// channel blocks again after.
pub(crate) fn said_ready(control: &UnixStream) -> bool {
    let mut byte = [0u8; 1];
    control.set_read_timeout(Some(READY_TIMEOUT)).is_ok()
        && matches!((&*control).read(&mut byte), Ok(1))
        && byte[0] == b'R'
        && control.set_read_timeout(None).is_ok()
}

/// `child` once its runner said it is ready; [`None`] (the sandbox killed and gone) if it
/// never does.
fn ready_or_gone(child: Child, control: &UnixStream) -> Option<Child> {
    if said_ready(control) {
        return Some(child);
    }
    child.killer().kill(KillReason::Cancelled);
    if let Err(e) = child.wait() {
        tracing::debug!(error = %e, "a zygote's child never started");
    }
    None
}

/// A pair of connected sockets: a channel between the host and a sandbox.
pub(crate) fn socket_pair() -> Result<(UnixStream, UnixStream), EngineError> {
    UnixStream::pair().map_err(|source| EngineError::Io {
        what: "socketpair",
        source,
    })
}
