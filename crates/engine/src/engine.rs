//! The engine: runs jobs, each in a fresh sandbox (cold, a zygote's child, or taken from a
//! warm pool), and turns what happened into one result (see `verdict`).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_api::{ExecutionResult, Limits, Status};
use airlock_sandbox::Policy;

use crate::config::EngineConfig;
use crate::error::{EngineError, Refusal};
use crate::interpreter::Interpreter;
use crate::job::{check_counts, Cancel, Job};
use crate::launcher::{socket_pair, Launcher, Mode};
use crate::policy::{self, EnvMount, HOSTNAME, SANDBOX_UID};
use crate::pool::{self, EnvPools, Pool, PoolConfig, PoolStatus};
use crate::pump::{self, Discard, OutputSink, Stdin};
use crate::tools::{self, ToolBridge};
use crate::verdict::{self, Verdict};
use crate::zygotes::{self, ZygoteConfig, ZygoteStatus};
use crate::{compiled, isolation, request, runner, volumes};

/// One execution's result, and how long its sandbox took to be ready.
#[derive(Debug)]
pub struct Execution {
    pub result: ExecutionResult,
    /// From starting the sandbox to its program being confined and about to run; for a
    /// sandbox from the warm pool, the time it took to take it.
    pub sandbox_ready: Option<Duration>,
    /// Whether the sandbox came from the warm pool.
    pub pooled: bool,
    /// Whether the sandbox was a zygote's child (see `zygotes`); a cold one otherwise.
    pub forked: bool,
    /// The sandbox could not be built (its `internal_error`, a `SandboxError`): the host's
    /// fault, such as a path it mounts gone, never the program's or its client's.
    pub setup_failed: bool,
    /// When its steps ended, for the server's traces.
    pub timings: Timings,
}

/// When an execution's steps ended (`None`: not taken, or not known), for the server's
/// traces: the sandbox asked for, it was ready, the program was over, its response parsed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// A sandbox asked for: taken from a pool, forked by a zygote or started cold.
    pub asked: Option<Instant>,
    /// The program about to run.
    pub ready: Option<Instant>,
    /// The program ended, its output and response read.
    pub ran: Option<Instant>,
    /// The response parsed into the result.
    pub parsed: Option<Instant>,
}

/// Runs jobs. Cheap to share between threads.
#[derive(Clone, Debug)]
pub struct Engine {
    config: EngineConfig,
    /// What starts sandboxes, the pools' too (see `launcher`).
    launcher: Launcher,
    pool: Option<Arc<Pool>>,
    /// Children of the preloading zygote, ready (see [`PoolConfig::preloaded`]).
    preloaded_pool: Option<Arc<Pool>>,
    /// Pools per environment, started when one is first asked for (see `env_pool`).
    env_pools: Option<Arc<EnvPools>>,
    defer_cleanup: bool,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Result<Self, EngineError> {
        let interpreter = Interpreter::detect(&config.python)?;
        Ok(Engine {
            config,
            launcher: Launcher::new(interpreter),
            pool: None,
            preloaded_pool: None,
            env_pools: None,
            defer_cleanup: false,
        })
    }

    /// Cold sandboxes load the runner compiled once (see `compiled`) instead of compiling its
    /// source, kept in `cache_dir` (made if missing). On failure they keep the source.
    pub fn use_compiled_runner(&mut self, cache_dir: &Path) -> Result<(), String> {
        let policy = self.policy(&self.config.defaults);
        let python = &self.launcher.interpreter.path;
        let runner = compiled::CompiledRunner::load(python, runner::source(), &policy, cache_dir)?;
        self.launcher.compiled = Some(runner);
        Ok(())
    }

    /// The next cold sandbox starts with `init`, an init started ahead (see
    /// [`airlock_sandbox::Prestarted`]); one never used is killed with the engine.
    pub fn use_prestarted(&self, init: airlock_sandbox::Prestarted) {
        *self
            .launcher
            .prestarted
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(init);
    }

    /// Makes fresh sandboxes forks of zygotes from now on, where a zygote serves them (this
    /// engine and its clones made from now on). Start before the pool, so that it uses them.
    pub fn start_zygotes(&mut self, config: ZygoteConfig) {
        self.launcher.zygotes = Some(zygotes::Zygotes::new(config));
    }

    /// What the zygotes do; [`None`] when they were never started.
    pub fn zygote_status(&self) -> Option<ZygoteStatus> {
        self.launcher.zygotes.as_ref().map(|z| z.status())
    }

    /// Answers as soon as a sandbox's processes are gone, leaving the removal of its empty
    /// cgroup to a background thread (a long-running server; [`airlock_sandbox::settle`] must
    /// be called before exiting).
    pub fn defer_cleanup(&mut self) {
        self.defer_cleanup = true;
    }

    /// Starts a warm pool (see `pool`) that this engine, and its clones made from now on,
    /// take sandboxes from.
    pub fn start_pool(&mut self, config: PoolConfig) -> Result<Arc<Pool>, String> {
        let policy = self.policy(&self.config.defaults);
        let pool = Arc::new(Pool::start_for(
            &self.launcher,
            config.clone(),
            policy,
            false,
        )?);
        self.pool = Some(pool.clone());
        let preloads = self.launcher.zygotes.as_ref().is_some_and(|z| z.preloads());
        if config.size > 0 && config.preloaded > 0 && preloads {
            // Children of the preloading zygote, for code that names its packages: they
            // have no fork and jail to wait for, as the lean ones.
            let preloaded = PoolConfig {
                size: config.preloaded,
                max_size: config.preloaded,
                workers: 1,
                ..config.clone()
            };
            let policy = self.policy(&self.config.defaults);
            let pool = Pool::start_for(&self.launcher, preloaded, policy, true)?;
            self.preloaded_pool = Some(Arc::new(pool));
        }
        if config.size > 0 {
            // An environment keeps one sandbox ready once asked for, more while in demand.
            let config = PoolConfig {
                size: 1,
                max_size: config.max_size.clamp(1, 4),
                workers: 1,
                // Its sandboxes start cold (tens of milliseconds): one barely begun would
                // rarely be ready within a wait meant for a zygote's child.
                wait_for_refill_ms: 0,
                ..config
            };
            self.env_pools = Some(Arc::new(EnvPools::new(config)));
        }
        Ok(pool)
    }

    /// The pool of `env`'s sandboxes, started now if it was not running (see `EnvPools`).
    fn env_pool(&self, env: &EnvMount) -> Option<Arc<Pool>> {
        let pools = self.env_pools.as_ref()?;
        pools.get(&self.launcher, env, || self.policy(&self.config.defaults))
    }

    /// Closes the pool of the environment stored as `hash`, if it has one.
    pub fn close_environment_pool(&self, hash: &str) {
        if let Some(pools) = &self.env_pools {
            pools.close(hash);
        }
    }

    /// The pools of environments, with how many sandboxes each holds ready.
    pub fn environment_pools(&self) -> Vec<(String, PoolStatus)> {
        self.env_pools
            .as_ref()
            .map_or_else(Vec::new, |pools| pools.status())
    }

    /// Closes every pool: the default one and the environments'.
    pub fn close_pools(&self) {
        if let Some(pools) = &self.env_pools {
            pools.close_all();
        }
        for pool in [&self.pool, &self.preloaded_pool].into_iter().flatten() {
            pool.close();
        }
        if let Some(zygotes) = &self.launcher.zygotes {
            zygotes.close();
        }
    }

    pub fn pool(&self) -> Option<&Arc<Pool>> {
        self.pool.as_ref()
    }

    /// The pool of the preloading zygote's children (see [`PoolConfig::preloaded`]).
    pub fn preloaded_pool(&self) -> Option<&Arc<Pool>> {
        self.preloaded_pool.as_ref()
    }

    /// Waits until the zygote that would make `job`'s sandbox is ready (starting it if need
    /// be), for a caller that wants its one execution to be a zygote's child (`airlock run
    /// --zygote`). Errors say why it cannot be.
    pub fn wait_for_zygote(&self, job: &Job, within: Duration) -> Result<(), String> {
        let policy = self.job_policy(job);
        self.launcher.wait_for_zygote(&policy, &job.code, within)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The most memory one execution's result can hold, under `limits` (see
    /// [`EngineConfig::result_bytes`]).
    pub fn result_bytes(&self, limits: &Limits) -> u64 {
        self.config.result_bytes(limits)
    }

    pub fn interpreter(&self) -> &Interpreter {
        &self.launcher.interpreter
    }

    /// What starts this engine's sandboxes, for a session's.
    pub(crate) fn launcher(&self) -> &Launcher {
        &self.launcher
    }

    /// The counts of environment variables and input files alone (part of [`Engine::check`]):
    /// a request with too many can be refused before anything of it is decoded.
    pub fn check_counts(&self, env: usize, files: usize) -> Result<(), Refusal> {
        check_counts(env, files)
    }

    /// Checks a job before anything runs.
    pub fn check(&self, job: &Job) -> Result<(), EngineError> {
        Ok(job.check(&self.config)?)
    }

    /// The sandbox policy for one execution.
    pub fn policy(&self, limits: &Limits) -> Policy {
        policy::for_limits(&self.config, &self.launcher.interpreter, limits)
    }

    /// The policy for `job`: its limits, and the egress listener and environment it asks for.
    pub(crate) fn job_policy(&self, job: &Job) -> Policy {
        let mut policy = self.policy(&job.limits);
        if let Some(leash) = &job.egress {
            policy::with_egress_port(&mut policy, leash);
        }
        if let Some(env) = &job.environment {
            policy::with_environment(&mut policy, env);
        }
        policy.volumes = job.volumes.iter().map(volumes::JobVolume::mount).collect();
        policy
    }

    /// The runner's request for `job`, whose sandbox has `policy` (see `request::for_job`).
    pub(crate) fn runner_request(
        &self,
        job: &Job,
        policy: &Policy,
        more: bool,
    ) -> Result<Vec<u8>, EngineError> {
        let sys_path = self.launcher.sys_path(policy);
        request::for_job(job, sys_path, self.config.max_result_bytes, more)
    }

    /// The most a runner's response may hold: the result limit, and room for an error's
    /// message and traceback.
    pub(crate) fn response_limit(&self) -> u64 {
        self.config.response_limit()
    }

    /// Runs one job in a fresh sandbox. Errors mean nothing ran (bad input, or a host that
    /// cannot enforce the policy); anything that happens once the sandbox exists is a result.
    pub fn execute(
        &self,
        mut job: Job,
        sink: &mut dyn OutputSink,
    ) -> Result<Execution, EngineError> {
        self.check(&job)?;
        let policy = self.job_policy(&job);
        // Encoded before a sandbox is taken, so that a request that cannot be is refused
        // without one; again with the runner's on-demand part for a cold sandbox.
        let mut request = self.runner_request(&job, &policy, false)?;
        if job.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
            return Err(EngineError::Cancelled);
        }
        let asked = Instant::now();
        // A job with tools has a channel of its own, the sandbox's end at descriptor 4.
        let (tools, tools_theirs) = match &job.tools {
            Some(bridge) => {
                let (ours, theirs) = socket_pair()?;
                (Some((bridge.clone(), ours)), Some(OwnedFd::from(theirs)))
            }
            None => (None, None),
        };
        // Held until the execution ends: the pool counts its sandbox in use meanwhile.
        let (sandbox, in_use) = self.sandbox_for(&job, &policy, tools_theirs)?;
        let pooled = in_use.is_some();
        let taken = pooled.then(|| asked.elapsed());
        let forked = sandbox.child.is_zygote_child();
        if !forked {
            request = self.runner_request(&job, &policy, true)?;
        }
        let stdin = std::mem::replace(&mut job.stdin, Stdin::Empty);
        let ran = self.run(sandbox, &job, stdin, request, tools, sink)?;
        let mut timings = Timings {
            asked: Some(asked),
            ran: Some(Instant::now()),
            ..Timings::default()
        };
        let io = ran.io;
        let outcome = match ran.waited {
            Ok(outcome) => outcome,
            Err(e) => {
                let mut iso = isolation::planned(&policy);
                isolation::with_egress(&mut iso, job.egress.as_deref());
                let usage = airlock_api::Usage::default();
                let result = Verdict::setup_failed(e.to_string())
                    .into_result(io.streams, usage, job.limits, iso);
                drop(in_use);
                return Ok(Execution {
                    result,
                    sandbox_ready: None,
                    pooled,
                    forked,
                    setup_failed: true,
                    timings,
                });
            }
        };
        let response =
            verdict::parse_response(&io.response, io.response_overflow, self.response_limit());
        let mut v = verdict::verdict(&outcome, response, &job.limits, io.streams.truncated());
        ran.breach.explain(outcome.killed, &mut v);
        let usage = airlock_api::Usage {
            wall_ms: outcome.usage.wall.as_millis() as u64,
            cpu_ms: outcome
                .usage
                .cpu
                .or(outcome.usage.program_cpu)
                .map(|d| d.as_millis() as u64),
            memory_peak_bytes: outcome.usage.memory_peak_bytes,
            tool_calls: ran.tool_calls,
            egress: ran.egress,
        };
        let mut iso = isolation::reported(&outcome.isolation);
        isolation::with_egress(&mut iso, job.egress.as_deref());
        let result = v.into_result(io.streams, usage, job.limits, iso);
        timings.parsed = Some(Instant::now());
        drop(in_use);
        let sandbox_ready = taken.or(outcome.ready_after);
        timings.ready = sandbox_ready.map(|d| asked + d);
        Ok(Execution {
            result,
            sandbox_ready,
            pooled,
            forked,
            setup_failed: false,
            timings,
        })
    }

    /// A sandbox for `job`: one from a pool that holds one built alike (with its count of
    /// sandboxes in use), or one started now (with `tools`, the tool channel's end, when the
    /// job has tools).
    fn sandbox_for(
        &self,
        job: &Job,
        policy: &Policy,
        tools: Option<OwnedFd>,
    ) -> Result<(Sandbox, Option<pool::InUse>), EngineError> {
        // Pooled sandboxes are lean zygotes' children (or cold): code that names a preloaded
        // package takes a child of the zygote that has it loaded instead.
        let preload = self.launcher.wants_preloads(&job.code);
        // A pooled sandbox has no tool channel and no egress listener: a job with tools or
        // egress starts its own.
        // Nor volumes.
        let pool = match (&tools, &job.egress, &job.environment) {
            _ if !job.volumes.is_empty() => None,
            (None, None, None) if preload => self.preloaded_pool.clone(),
            _ if preload => None,
            (None, None, None) => self.pool.clone(),
            (None, None, Some(env)) if !env.writable => self.env_pool(env),
            _ => None,
        };
        if let Some((warm, in_use)) = pool.and_then(|p| p.take(policy)) {
            let mut child = warm.child;
            child.restart_clock(policy.limits.wall_time);
            let sandbox = Sandbox {
                child,
                control: warm.control,
            };
            return Ok((sandbox, Some(in_use)));
        }
        let (child, control) = self.launcher.start(policy, Mode::Cold, tools, preload)?;
        Ok((Sandbox { child, control }, None))
    }

    /// Runs `sandbox` to its end: the request in, the output and the response out (`pump`),
    /// with the egress proxy and the tool bridge beside it and the job's cancel attached.
    fn run(
        &self,
        sandbox: Sandbox,
        job: &Job,
        stdin: Stdin,
        request: Vec<u8>,
        tools: Option<(Arc<dyn ToolBridge>, UnixStream)>,
        sink: &mut dyn OutputSink,
    ) -> Result<Ran, EngineError> {
        let Sandbox { mut child, control } = sandbox;
        if self.defer_cleanup {
            child.defer_cleanup();
        }
        let serving = match (&job.egress, child.take_egress_listener()) {
            (Some(leash), Some(listener)) => {
                Some(leash.serve(listener).map_err(|source| EngineError::Io {
                    what: "serving the egress listener",
                    source,
                })?)
            }
            _ => None,
        };
        if let Some(c) = &job.cancel {
            c.attach(child.killer());
        }
        // The output is pumped by the thread that waits for the sandbox, unless the sink may
        // block (a slow reader must never hold up the limits' enforcement): then by a thread
        // of its own, told by `stop` that the sandbox is gone.
        let stop = if sink.may_block() {
            Some(
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| EngineError::Io {
                    what: "pipe2",
                    source: e.into(),
                })?,
            )
        } else {
            None
        };
        let pump = pump::Pump {
            stdin: child.take_stdin(),
            stdin_source: stdin,
            stdin_limit: self.config.max_stdin_bytes,
            control,
            request,
            stdout: child.take_stdout(),
            stderr: child.take_stderr(),
            output_limit: job.limits.output_bytes,
            response_limit: self.response_limit(),
            sink,
        };
        let killer = child.killer();
        let breach = tools::Breach::default();
        let (waited, io) = std::thread::scope(|s| {
            let served = tools.as_ref().map(|(bridge, channel)| {
                let (breach, killer) = (&breach, &killer);
                s.spawn(move || breach.serve(bridge.as_ref(), channel.try_clone(), killer))
            });
            let (waited, pumped) = match stop {
                Some((stop_r, stop_w)) => {
                    let io = s.spawn(move || pump.run(stop_r));
                    let waited = child.wait();
                    let _ = nix::unistd::write(&stop_w, &[1]);
                    (waited, Err(io))
                }
                None => {
                    let mut pumping = pump.start();
                    let waited = child.wait_beside(&mut pumping);
                    (waited, Ok(pumping.finish()))
                }
            };
            if let Some(served) = served {
                // The sandbox is gone: the bridge reads the end of its channel and cancels
                // what is still running upstream.
                if let Some((_, channel)) = &tools {
                    let _ = channel.shutdown(std::net::Shutdown::Both);
                }
                let _ = served.join();
            }
            (waited, pumped.or_else(|io| io.join().map_err(drop)))
        });
        let tool_calls = tools.as_ref().map_or(0, |(bridge, _)| bridge.calls());
        let egress = serving.map(airlock_egress::Serving::finish);
        if let Some(c) = &job.cancel {
            c.detach();
        }
        let io = io.map_err(|_| EngineError::Io {
            what: "output pump",
            source: std::io::Error::other("panicked"),
        })?;
        Ok(Ran {
            waited,
            io,
            tool_calls,
            egress,
            breach,
        })
    }
}

/// A sandbox whose runner waits for its request on `control`.
struct Sandbox {
    child: airlock_sandbox::Child,
    control: UnixStream,
}

/// What running a sandbox to its end gave.
struct Ran {
    /// How it ended, or why that is unknown (it could not be built).
    waited: Result<airlock_sandbox::Outcome, airlock_sandbox::WaitError>,
    io: pump::Collected,
    tool_calls: u64,
    egress: Option<airlock_egress::Usage>,
    /// Why the tool channel was cut, if the code broke its protocol.
    breach: tools::Breach,
}

impl Engine {
    /// Runs real code in a real sandbox with the default limits and checks what it sees: the
    /// unprivileged uid, its own hostname, and only its init and itself in `/proc`. Whether
    /// every mechanism was in force is in the result's `isolation`, for the caller to judge.
    pub fn self_test(&self) -> Result<ExecutionResult, String> {
        Ok(self.self_test_execution()?.result)
    }

    /// The trial job of `self_test`.
    pub fn self_test_job(&self) -> Result<Job, String> {
        let limits = self
            .config
            .resolve_limits(&airlock_api::LimitsRequest::default())
            .map_err(|e| e.to_string())?;
        Ok(Job {
            code: "import os, socket\n[os.getuid(), socket.gethostname(), sorted(p for p in os.listdir('/proc') if p.isdigit())]".into(),
            filename: "self_test.py".into(),
            stdin: Stdin::Empty,
            env: Vec::new(),
            files: Vec::new(),
            entrypoint: None,
            limits,
            max_code_bytes: self.config.max_code_bytes,
            stream: false,
            echo_traceback: false,
            cancel: None,
            tools: None,
            egress: None,
            environment: None,
            volumes: Vec::new(),
        })
    }

    /// As `self_test`, with how the sandbox came to be (pooled, a zygote's child).
    pub fn self_test_execution(&self) -> Result<Execution, String> {
        let job = self.self_test_job()?;
        let execution = self.execute(job, &mut Discard).map_err(|e| e.to_string())?;
        let r = &execution.result;
        if r.status != Status::Ok {
            let why = r
                .error
                .as_ref()
                .map(|e| format!("{}: {}", e.kind, e.message))
                .unwrap_or_default();
            return Err(format!(
                "a trial run ended with status {}: {why} {}",
                r.status,
                r.stderr.to_string_lossy().trim()
            ));
        }
        let expected = serde_json::json!([SANDBOX_UID, HOSTNAME, ["1", "2"]]);
        if r.result.as_ref() != Some(&expected) {
            return Err(format!(
                "a trial run saw {:?}, expected {expected}",
                r.result
            ));
        }
        Ok(execution)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mechanism;
    use crate::error::RefusalKind;
    use crate::job::{Entrypoint, InputFile, MAX_ENV_BYTES, MAX_ENV_VARS, MAX_FILES};
    use airlock_sandbox::Enforcement;

    const MIB: u64 = 1 << 20;

    #[test]
    fn inputs_are_bounded_before_anything_runs() {
        let engine = Engine::new(EngineConfig::default()).expect("an engine");
        let job = |env: Vec<(String, String)>, files: usize| Job {
            code: "1".into(),
            filename: "main.py".into(),
            stdin: Stdin::Bytes(Vec::new()),
            env,
            files: (0..files)
                .map(|i| InputFile {
                    path: format!("f{i}"),
                    data: Vec::new(),
                })
                .collect(),
            entrypoint: None,
            limits: engine.config().defaults.clone(),
            max_code_bytes: 1000,
            stream: false,
            echo_traceback: false,
            cancel: None,
            tools: None,
            egress: None,
            environment: None,
            volumes: Vec::new(),
        };
        let refused = |j: Job| match engine.check(&j) {
            Err(EngineError::Invalid(r)) => r.message,
            other => panic!("accepted: {other:?}"),
        };
        assert!(engine.check(&job(Vec::new(), MAX_FILES)).is_ok());
        assert!(refused(job(Vec::new(), MAX_FILES + 1)).contains("input files"));
        let many = (0..=MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert!(refused(job(many, 0)).contains("environment variables"));
        let big = vec![("V".to_owned(), "x".repeat(MAX_ENV_BYTES))];
        assert!(refused(job(big, 0)).contains("bytes"));

        // Each refusal names the request's field and its kind, which the server answers with
        // (413 or 400, `field`): the engine is the only place these checks are made.
        let field_of = |j: Job| match engine.check(&j) {
            Err(EngineError::Invalid(r)) => (r.field, r.kind),
            other => panic!("accepted: {other:?}"),
        };
        use RefusalKind::{Invalid, TooLarge};
        let long = Job {
            code: "#".repeat(1001),
            ..job(Vec::new(), 0)
        };
        assert_eq!(field_of(long), ("code".into(), TooLarge));
        let named = job(vec![("A=B".into(), "x".into())], 0);
        assert_eq!(field_of(named), ("env.A=B".into(), Invalid));
        let mut escaping = job(Vec::new(), 2);
        escaping.files[1].path = "a/../../b".into();
        assert_eq!(field_of(escaping), ("files[1].path".into(), Invalid));
        assert_eq!(
            field_of(job(Vec::new(), MAX_FILES + 1)),
            ("files".into(), TooLarge)
        );
        let mut heavy = job(Vec::new(), 1);
        heavy.files[0].data = vec![0; (engine.config().max_files_bytes + 1) as usize];
        assert_eq!(field_of(heavy), ("files".into(), TooLarge));
        let stdin = Job {
            stdin: Stdin::Bytes(vec![0; engine.config().max_stdin_bytes as usize + 1]),
            ..job(Vec::new(), 0)
        };
        assert_eq!(field_of(stdin), ("stdin".into(), TooLarge));
        let entry = Job {
            entrypoint: Some(Entrypoint {
                name: "not a name".into(),
                inputs: Default::default(),
            }),
            ..job(Vec::new(), 0)
        };
        assert_eq!(field_of(entry), ("entrypoint".into(), Invalid));
    }

    #[test]
    fn policy_follows_limits_and_downgrades() {
        let Ok(engine) = Engine::new(EngineConfig {
            downgrade: vec![Mechanism::Landlock],
            ..EngineConfig::default()
        }) else {
            panic!("/usr/bin/python3 is required by the test suite");
        };
        let limits = engine.config().defaults.clone();
        let p = engine.policy(&limits);
        p.validate().unwrap();
        assert_eq!(p.limits.memory_bytes, limits.memory_mb * MIB);
        assert_eq!(p.scratch.size_bytes, limits.disk_mb * MIB);
        assert_eq!(p.landlock, Enforcement::Disabled);
        assert_eq!(p.seccomp, Enforcement::Required);
        assert_eq!(p.cgroups, Enforcement::Required);
        assert_eq!(
            isolation::planned(&p).downgraded,
            vec!["landlock".to_owned()]
        );
    }
}
