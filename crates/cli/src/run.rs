//! `airlock run`: one program, one fresh sandbox.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use airlock_api::{ExecutionResult, LimitsRequest, Status};
use airlock_engine::{
    Cancel, Discard, Engine, EngineConfig, InputFile, Job, Mechanism, OutputSink, Stdin, Stream,
};
use clap::Args;

use crate::units::{parse_duration, parse_mib, parse_size};
use crate::{EXIT_AIRLOCK, EXIT_USAGE};

pub const EXIT_POLICY_VIOLATION: u8 = 121;
pub const EXIT_CPU_LIMIT: u8 = 122;
pub const EXIT_MEMORY_LIMIT: u8 = 123;
pub const EXIT_TIMEOUT: u8 = 124;

const AFTER_HELP: &str = "\
Exit status:
  0-255    the program's own exit code (1 for an uncaught exception)
  128+N    the program was killed by signal N (status crashed)
  121      killed by the seccomp filter (status policy_violation)
  122      CPU-time limit (status cpu_limit)
  123      memory limit (status memory_limit)
  124      wall-clock limit (status timeout)
  125      airlock failed, or cannot enforce the policy on this host (see `airlock doctor`)
  2        invalid options or input; nothing ran
A program can exit with any of these codes itself: use --json for an unambiguous status.

Defaults: --timeout 30s --cpu-time 30s --memory 512M --pids 64 --disk 256M
--output-limit 1M --max-code-size 1M. Nothing of your environment is passed in.

Examples:
  echo 'print(6 * 7)' | airlock run
  airlock run --json --timeout 2s script.py
  airlock run --file data.csv --env MODE=fast analyse.py
  airlock run --entrypoint main --inputs args.json tool.py   # prints main(**args) as JSON";

/// Run Python code in a fresh sandbox that is destroyed afterwards.
#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct RunArgs {
    /// Python file to run; standard input when absent or `-`.
    pub file: Option<PathBuf>,
    /// Print one JSON result object instead of the program's output.
    #[arg(long)]
    pub json: bool,
    /// Wall-clock limit, e.g. 5s or 500ms.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Option<std::time::Duration>,
    /// CPU-time limit of all the program's processes together.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub cpu_time: Option<std::time::Duration>,
    /// Memory limit of the whole sandbox, files it writes included, e.g. 256M or 1G.
    #[arg(long, value_parser = parse_mib, value_name = "SIZE")]
    pub memory: Option<u64>,
    /// Most processes and threads at once.
    #[arg(long, value_name = "N")]
    pub pids: Option<u32>,
    /// Size of the writable tmpfs (/tmp and the working directory), e.g. 512M.
    #[arg(long, value_parser = parse_mib, value_name = "SIZE")]
    pub disk: Option<u64>,
    /// Output kept per stream; the rest is dropped and marked as truncated.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub output_limit: Option<u64>,
    /// Largest code accepted.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_code_size: Option<u64>,
    /// Set an environment variable inside the sandbox (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Copy a host file into the working directory (repeatable).
    #[arg(long = "file", value_name = "HOST_PATH[:SANDBOX_PATH]")]
    pub files: Vec<String>,
    /// Function mode: call this function of the code (`name` or `Class.method`) once the code
    /// has run; its return value is the result.
    #[arg(long, value_name = "NAME")]
    pub entrypoint: Option<String>,
    /// The entrypoint's keyword arguments: a file holding one JSON object (`-` for stdin).
    #[arg(long, value_name = "FILE.json", requires = "entrypoint")]
    pub inputs: Option<PathBuf>,
    /// File to feed to the program's standard input (default: empty).
    #[arg(long, value_name = "FILE")]
    pub stdin: Option<PathBuf>,
    /// The host's Python interpreter to use.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/python3")]
    pub python: PathBuf,
    /// Switch off one protection by name (seccomp, landlock, cgroups); results say so.
    #[arg(long = "downgrade", value_name = "MECHANISM")]
    pub downgrade: Vec<Mechanism>,
    /// Code mode: a config file (`airlock serve`'s) whose `[tools]` servers the code may
    /// call, started for this run (`import tools` inside).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// With --config: a tool the code may call, as `server.tool` (`*` matches any characters
    /// and reaches only read-only tools); repeatable. Default: every read-only tool.
    #[arg(long = "tool", value_name = "SERVER.TOOL", requires = "config")]
    pub tools: Vec<String>,
    /// Let the code connect to this host and port through airlock's egress proxy
    /// (`HTTPS_PROXY` inside): `pypi.org:443`, `*.pythonhosted.org:443`, or an address range
    /// opened explicitly, `127.0.0.0/8:8080`; repeatable. Default: no network at all.
    #[arg(long = "allow", value_name = "HOST:PORT")]
    pub allow: Vec<String>,
    /// A named environment (`airlock env create`) whose packages the code may import; from
    /// the state directory of --config's server, or the default one.
    #[arg(long, value_name = "NAME")]
    pub environment: Option<String>,
    /// Run the code as the child of a zygote, a pre-imported interpreter forked into a fresh
    /// jail (what `airlock serve` does for most sandboxes), started for this one run: slower
    /// here, to see what a served execution sees. Needs root.
    #[arg(long)]
    pub zygote: bool,
    /// Modules the zygote imports first, comma-separated (code that names one of them runs
    /// in a child of a zygote that has them loaded). Default: the server's.
    #[arg(
        long,
        value_name = "MODULES",
        requires = "zygote",
        value_delimiter = ','
    )]
    pub preload: Option<Vec<String>>,
}

/// The named environment, from the state directory `airlock serve` would use.
fn environment(
    name: &str,
    config: Option<&Path>,
) -> Result<airlock_engine::environments::EnvMount, String> {
    let env = crate::serve::settings_env();
    let config = crate::config::load(config, &env, None, None)
        .map(|c| crate::config::settle(c, &env))
        .map_err(|e| format!("--config: {e}"))?;
    let store = airlock_engine::environments::Environments::open(&config.state_dir())
        .map_err(|e| e.to_string())?;
    store
        .resolve(name)
        .map_err(|e| format!("--environment: {e}"))
}

/// `--allow` values as an egress policy, checked.
fn egress_policy(allow: &[String]) -> Result<airlock_egress::EgressPolicy, String> {
    let mut policy = airlock_egress::EgressPolicy::default();
    for spec in allow {
        let bad = || format!("--allow {spec:?}: expected HOST:PORT or CIDR:PORT");
        let (host, port) = spec.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.contains('/') {
            policy.ranges.push(airlock_egress::RangeRule {
                cidr: host.to_owned(),
                ports: vec![port],
            });
        } else {
            policy.hosts.push(airlock_egress::HostRule {
                host: host.to_ascii_lowercase(),
                ports: vec![port],
            });
        }
    }
    policy.validate().map_err(|m| format!("--allow: {m}"))?;
    Ok(policy)
}

/// Says on stderr which connections the proxy refused or could not make.
#[derive(Debug)]
struct EgressNotes;

impl airlock_egress::Observer for EgressNotes {
    fn connection(&self, r: &airlock_egress::ConnectionRecord) {
        if r.outcome != "allowed" || r.reason.is_some() {
            errln!(
                "airlock: egress {} {}:{} ({}{})",
                r.outcome,
                r.host,
                r.port,
                r.reason.unwrap_or(""),
                r.detail
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            );
        }
    }
}

/// A run that gives no result: a line on stderr and, with `--json`, the API's error body on
/// stdout (`{"error": {"code", "message"}}`), so that `--json` always prints one object.
fn refuse(json: bool, code: &str, message: impl std::fmt::Display, exit: u8) -> ExitCode {
    errln!("airlock: {message}");
    if json {
        print_error_body(code, &message.to_string());
    }
    ExitCode::from(exit)
}

/// The API's error body (`{"error": {"code", "message"}}`) as `run --json`'s one object.
pub(crate) fn print_error_body(code: &str, message: &str) {
    let body = airlock_api::ErrorBody {
        error: airlock_api::ApiError {
            code: code.to_owned(),
            message: message.to_owned(),
            field: None,
            request_id: None,
        },
    };
    outln!("{}", serde_json::json!(body));
}

fn read_capped(mut r: impl Read, cap: u64, what: &str, hint: &str) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    r.by_ref()
        .take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading {what}: {e}"))?;
    if buf.len() as u64 > cap {
        return Err(format!("{what} is over the limit of {cap} bytes{hint}"));
    }
    Ok(buf)
}

fn open_regular(path: &Path, what: &str) -> Result<(File, std::fs::Metadata), String> {
    let file = File::open(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if meta.is_dir() {
        return Err(format!("{what} {} is a directory", path.display()));
    }
    Ok((file, meta))
}

/// `--inputs`: one JSON object, from a file or standard input, at most `cap` bytes.
fn read_inputs(
    path: &Path,
    cap: u64,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let data = if path == Path::new("-") {
        read_capped(std::io::stdin().lock(), cap, "--inputs", "")?
    } else {
        let (file, _) = open_regular(path, "--inputs")?;
        read_capped(file, cap, &format!("--inputs {}", path.display()), "")?
    };
    match serde_json::from_slice(&data) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(format!(
            "--inputs {}: expected a JSON object (the keyword arguments)",
            path.display()
        )),
        Err(e) => Err(format!("--inputs {}: not JSON: {e}", path.display())),
    }
}

struct Prepared {
    engine: Engine,
    job: Job,
    /// The tool servers of --config, and the runtime their clients run on.
    tools: Option<(tokio::runtime::Runtime, Arc<airlock_tools::Registry>)>,
}

/// The runtime and registry of started tool servers, and the run's tool set.
type StartedTools = (
    tokio::runtime::Runtime,
    Arc<airlock_tools::Registry>,
    Arc<airlock_tools::ToolSet>,
);

/// Starts the `[tools]` servers of a config file and makes the run's tool set; [`None`] when
/// the file configures none and no `--tool` asked for one.
fn start_tools(path: &Path, patterns: &[String]) -> Result<Option<StartedTools>, String> {
    let env = crate::serve::settings_env();
    let config = crate::config::load(Some(path), &env, None, None)
        .map_err(|e| format!("--config {}: {e}", path.display()))?;
    if config.tools.servers.is_empty() {
        if patterns.is_empty() {
            return Ok(None);
        }
        return Err(format!(
            "--config {}: no tool server is configured ([tools.servers])",
            path.display()
        ));
    }
    let patterns = if patterns.is_empty() {
        vec!["*.*".to_owned()]
    } else {
        patterns.to_vec()
    };
    let grants = airlock_tools::Grants::parse(&patterns).map_err(|e| format!("--tool: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tool clients: {e}"))?;
    let registry = airlock_tools::Registry::start(config.tools, runtime.handle().clone());
    let checked = runtime.block_on(registry.started()).and_then(|()| {
        registry
            .check_grants(&grants)
            .map_err(|e| format!("--tool: {e}"))
    });
    match checked {
        Ok(warnings) => {
            for w in warnings {
                errln!("airlock: {w}");
            }
        }
        Err(e) => {
            registry.shutdown();
            return Err(e);
        }
    }
    let set = registry.tool_set("local", &grants, "run", Arc::new(airlock_tools::NoObserver));
    Ok(Some((runtime, registry, set)))
}

fn prepare(args: RunArgs, cancel: &Cancel) -> Result<Prepared, String> {
    let config = EngineConfig {
        python: args.python.clone(),
        downgrade: args.downgrade.clone(),
        ..EngineConfig::default()
    };
    let limits = config
        .resolve_limits(&LimitsRequest {
            timeout_ms: args.timeout.map(|d| d.as_millis() as u64),
            memory_mb: args.memory,
            cpu_ms: args.cpu_time.map(|d| d.as_millis() as u64),
            pids: args.pids,
            disk_mb: args.disk,
            output_bytes: args.output_limit,
        })
        .map_err(|e| e.to_string())?;
    let max_code = config
        .code_limit(args.max_code_size)
        .map_err(|e| e.to_string())?;

    let from_stdin = args.file.as_deref().is_none_or(|f| f == Path::new("-"));
    if from_stdin && args.stdin.as_deref() == Some(Path::new("-")) {
        return Err("the code already comes from standard input; --stdin - is not possible".into());
    }
    if from_stdin && args.inputs.as_deref() == Some(Path::new("-")) {
        return Err(
            "the code already comes from standard input; --inputs - is not possible".into(),
        );
    }
    if args.stdin.as_deref() == Some(Path::new("-"))
        && args.inputs.as_deref() == Some(Path::new("-"))
    {
        return Err("--stdin - and --inputs - cannot both read standard input".into());
    }
    let hint = " (raise it with --max-code-size)";
    let (code, filename) = if from_stdin {
        (
            read_capped(std::io::stdin().lock(), max_code, "code", hint)?,
            "main.py".to_owned(),
        )
    } else {
        let path = args.file.as_deref().unwrap_or(Path::new("-"));
        let (file, _) = open_regular(path, "code file")?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or("main.py".into());
        (read_capped(file, max_code, "code", hint)?, name)
    };
    let code = String::from_utf8(code).map_err(|_| "the code is not valid UTF-8".to_owned())?;

    let stdin = match &args.stdin {
        None => Stdin::Empty,
        Some(p) if p == Path::new("-") => {
            Stdin::File(File::open("/dev/stdin").map_err(|e| format!("--stdin -: {e}"))?)
        }
        Some(p) => {
            let (file, meta) = open_regular(p, "--stdin file")?;
            if meta.is_file() && meta.len() > config.max_stdin_bytes {
                return Err(format!(
                    "--stdin file {} is {} bytes, over the limit of {} bytes",
                    p.display(),
                    meta.len(),
                    config.max_stdin_bytes
                ));
            }
            Stdin::File(file)
        }
    };

    let mut env = Vec::new();
    for pair in &args.env {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("--env {pair:?}: expected KEY=VALUE"))?;
        env.push((k.to_owned(), v.to_owned()));
    }

    let mut files = Vec::new();
    let mut total = 0u64;
    for spec in &args.files {
        let (host, inside) = match spec.split_once(':') {
            Some((h, s)) => (PathBuf::from(h), s.to_owned()),
            None => {
                let h = PathBuf::from(spec);
                let name = h
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (h, name)
            }
        };
        airlock_engine::check_relative_path(&inside)
            .map_err(|e| format!("--file {spec:?}: {e}"))?;
        let (file, meta) = open_regular(&host, "--file")?;
        if !meta.is_file() {
            return Err(format!("--file {}: not a regular file", host.display()));
        }
        let room = config.max_files_bytes.saturating_sub(total);
        let data = read_capped(
            file,
            room,
            &format!("--file {}", host.display()),
            " (input files together)",
        )?;
        total += data.len() as u64;
        files.push(InputFile { path: inside, data });
    }

    let entrypoint = match &args.entrypoint {
        None => None,
        Some(name) => {
            let inputs = match &args.inputs {
                None => serde_json::Map::new(),
                Some(path) => read_inputs(path, config.max_code_bytes)?,
            };
            let entry = airlock_engine::Entrypoint {
                name: name.clone(),
                inputs,
            };
            airlock_engine::check_entrypoint(&entry)
                .map_err(|(field, m)| format!("--{field}: {m}"))?;
            Some(entry)
        }
    };

    let policy = egress_policy(&args.allow)?;
    let egress = (!policy.allows_nothing()).then(|| {
        let notes: Option<Arc<dyn airlock_egress::Observer>> =
            (!args.json).then(|| Arc::new(EgressNotes) as Arc<dyn airlock_egress::Observer>);
        Arc::new(airlock_egress::Leash::new(
            policy,
            Arc::new(airlock_egress::Settings::default()),
            "cli",
            notes,
        ))
    });
    let mut engine = Engine::new(config).map_err(|e| e.to_string())?;
    // The runner compiled once and kept where `airlock serve` keeps its state; without it
    // the sandbox compiles the runner's source, as before.
    let cache = crate::config::settle(
        airlock_server::config::Config::default(),
        &crate::serve::settings_env(),
    )
    .state_dir();
    let _ = engine.use_compiled_runner(&cache.join("runner"));
    if args.zygote {
        let mut zygote = airlock_engine::ZygoteConfig::default();
        if let Some(preload) = &args.preload {
            zygote.preload = preload.iter().filter(|m| !m.is_empty()).cloned().collect();
        }
        engine.start_zygotes(zygote);
    }
    let (tools, bridge) = match &args.config {
        Some(path) => match start_tools(path, &args.tools)? {
            Some((runtime, registry, set)) => (
                Some((runtime, registry)),
                Some(set as Arc<dyn airlock_engine::ToolBridge>),
            ),
            None => (None, None),
        },
        None => (None, None),
    };
    let job = Job {
        code,
        filename,
        stdin,
        env,
        files,
        entrypoint,
        limits,
        max_code_bytes: max_code,
        stream: !args.json,
        echo_traceback: !args.json,
        cancel: Some(cancel.clone()),
        tools: bridge,
        egress,
        environment: match &args.environment {
            Some(name) => Some(environment(name, args.config.as_deref())?),
            None => None,
        },
        volumes: Vec::new(),
    };
    engine.check(&job).map_err(|e| e.to_string())?;
    if args.zygote {
        engine
            .wait_for_zygote(&job, std::time::Duration::from_secs(120))
            .map_err(|e| format!("--zygote: {e}"))?;
    }
    Ok(Prepared { engine, job, tools })
}

/// Stops the tool servers of --config when dropped.
struct ToolServers {
    runtime: Option<tokio::runtime::Runtime>,
    registry: Arc<airlock_tools::Registry>,
}

impl Drop for ToolServers {
    fn drop(&mut self) {
        self.registry.shutdown();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(2));
        }
    }
}

/// Copies the program's output to ours as it arrives.
struct Passthrough;

impl OutputSink for Passthrough {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        // A closed stdout of ours must not stop the program; drop what cannot be written.
        match stream {
            Stream::Stdout => crate::out::write_bytes(chunk),
            Stream::Stderr => {
                let _ = std::io::stderr().lock().write_all(chunk);
            }
        }
    }

    fn truncated(&mut self, stream: Stream, limit: u64) {
        let name = match stream {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        };
        errln!("\n[airlock: {name} truncated at {limit} bytes; the rest is discarded]");
    }
}

fn exit_code(result: &ExecutionResult) -> u8 {
    match result.status {
        Status::Ok | Status::Error => result.exit_code.map_or(1, |c| (c & 0xff) as u8),
        Status::Crashed => result
            .signal
            .map_or(EXIT_AIRLOCK, |s| (128 + s).clamp(0, 255) as u8),
        Status::Timeout => EXIT_TIMEOUT,
        Status::MemoryLimit => EXIT_MEMORY_LIMIT,
        Status::CpuLimit => EXIT_CPU_LIMIT,
        Status::PolicyViolation => EXIT_POLICY_VIOLATION,
        Status::InternalError => EXIT_AIRLOCK,
    }
}

/// One line on stderr for verdicts the program's own output does not explain.
fn describe(result: &ExecutionResult) -> Option<String> {
    let l = &result.limits;
    Some(match result.status {
        Status::Ok => return None,
        Status::Error => match &result.error {
            Some(e) if e.kind == "ResultError" => format!("airlock: {}", e.message),
            _ => return None,
        },
        Status::Timeout => format!(
            "airlock: timeout: killed at the wall-clock limit of {} ms",
            l.timeout_ms
        ),
        Status::MemoryLimit => format!(
            "airlock: memory_limit: killed at the memory limit of {} MiB",
            l.memory_mb
        ),
        Status::CpuLimit => format!(
            "airlock: cpu_limit: killed at the CPU-time limit of {} ms",
            l.cpu_ms
        ),
        Status::PolicyViolation => {
            "airlock: policy_violation: killed by the seccomp filter for a forbidden system call"
                .into()
        }
        Status::Crashed => format!(
            "airlock: crashed: killed by signal {}",
            result.signal.unwrap_or(0)
        ),
        Status::InternalError => format!(
            "airlock: internal_error: {}",
            result
                .error
                .as_ref()
                .map_or("unknown", |e| e.message.as_str())
        ),
    })
}

/// Waits, when dropped, until the signal thread has removed the cgroups of crashed runs.
struct LeftoversGone(std::sync::mpsc::Receiver<()>);

impl Drop for LeftoversGone {
    fn drop(&mut self) {
        // Sent, or the sender dropped (done, or the thread never started).
        let _ = self.0.recv();
    }
}

pub fn main(args: RunArgs) -> ExitCode {
    let json = args.json;
    let zygote = args.zygote;
    let function_mode = args.entrypoint.is_some();
    // The sandbox's init starts now, while the code, the interpreter and the host are read:
    // its own start overlaps ours. Without it, the sandbox starts one, as always.
    let init = (!zygote)
        .then(airlock_sandbox::Prestarted::start)
        .and_then(Result::ok);
    let cancel = Cancel::default();
    let signal = Arc::new(AtomicI32::new(0));
    let (gone, leftovers) = std::sync::mpsc::channel();
    // Declared before the work that follows, so dropped after it.
    let _leftovers = LeftoversGone(leftovers);
    if let Err(e) = watch_signals(&cancel, &signal, gone) {
        let why = format!("cannot handle signals: {e}");
        return refuse(json, "internal", why, EXIT_AIRLOCK);
    }
    let Prepared { engine, job, tools } = match prepare(args, &cancel) {
        Ok(p) => p,
        // Nothing ran: the command or its input is at fault.
        Err(e) => return refuse(json, "invalid_request", e, EXIT_USAGE),
    };
    if let Some(init) = init {
        engine.use_prestarted(init);
    }
    // The tool servers stop with the run (their clients' runtime goes when this does).
    let _tools = tools.map(|(runtime, registry)| ToolServers {
        runtime: Some(runtime),
        registry,
    });
    let result = if json {
        engine.execute(job, &mut Discard)
    } else {
        engine.execute(job, &mut Passthrough)
    };
    let result = match result {
        Ok(r) if zygote && !r.forked => {
            let why = "--zygote: the sandbox started cold: the zygote could not make it";
            return refuse(json, "internal", why, EXIT_AIRLOCK);
        }
        Ok(r) => r.result,
        Err(e) => return refuse(json, "internal", e, EXIT_AIRLOCK),
    };
    let sig = signal.load(Ordering::SeqCst);
    if cancel.is_cancelled() && sig != 0 {
        let why = format!("interrupted by signal {sig}; the sandbox was destroyed");
        return refuse(json, "interrupted", why, (128 + sig).clamp(0, 255) as u8);
    }
    if json {
        match serde_json::to_vec(&result) {
            Ok(mut json) => {
                json.push(b'\n');
                crate::out::write_bytes(&json);
            }
            Err(e) => {
                errln!("airlock: {e}");
                return ExitCode::from(EXIT_AIRLOCK);
            }
        }
    } else if let Some(line) = describe(&result) {
        errln!("{line}");
    } else if function_mode && result.status == Status::Ok {
        // What the function returned, after what it printed: one line of JSON.
        let value = result.result.as_ref().unwrap_or(&serde_json::Value::Null);
        outln!("{value}");
    }
    if !json && !result.outputs.is_empty() {
        let mut kinds: Vec<&str> = result.outputs.iter().map(|o| o.mime.as_str()).collect();
        kinds.dedup();
        errln!(
            "airlock: {} rich output(s) ({}) are in the result of --json",
            result.outputs.len(),
            kinds.join(", ")
        );
    }
    ExitCode::from(exit_code(&result))
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT destroy the sandbox and end airlock with 128+signal.
/// (Were airlock killed outright, its sandbox would still die with it: PR_SET_PDEATHSIG.)
///
/// The same thread first probes the host (the seccomp filters compiled, the cgroup layout read)
/// while the code, the interpreter and the limits are read on the main one, then removes the
/// cgroups of crashed runs (ours carries our pid: never one) and says so on `gone`: one thread
/// started where two cost a fifth of a millisecond each here. A signal caught meanwhile waits
/// in signal-hook's pipe until then.
fn watch_signals(
    cancel: &Cancel,
    seen: &Arc<AtomicI32>,
    gone: std::sync::mpsc::Sender<()>,
) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])?;
    let cancel = cancel.clone();
    let seen = seen.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(layout) = &airlock_sandbox::host_support().cgroup {
                airlock_sandbox::remove_leftovers(layout);
            }
            drop(gone);
            if let Some(sig) = signals.forever().next() {
                seen.store(sig, Ordering::SeqCst);
                cancel.cancel();
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: Status, exit_code: Option<i32>, signal: Option<i32>) -> ExecutionResult {
        serde_json::from_value(serde_json::json!({
            "status": status, "exit_code": exit_code, "signal": signal,
            "stdout": "", "stderr": "", "stdout_truncated": false, "stderr_truncated": false,
            "result": null, "error": null,
            "usage": {"wall_ms": 1, "cpu_ms": null, "memory_peak_bytes": null},
            "limits": {"timeout_ms": 1, "memory_mb": 1, "cpu_ms": 1, "pids": 1, "disk_mb": 1, "output_bytes": 1},
            "limits_hit": [],
            "isolation": {"namespaces": [], "uid": 1000, "network": "none", "filesystem": "read_only",
                "seccomp": "enforced", "landlock": "fully_enforced", "landlock_abi": 6, "cgroup": "v1",
                "no_new_privs": true, "capabilities": [], "downgraded": []}
        }))
        .unwrap()
    }

    #[test]
    fn exit_codes_are_distinct_per_verdict() {
        assert_eq!(exit_code(&result(Status::Ok, Some(0), None)), 0);
        assert_eq!(exit_code(&result(Status::Error, Some(3), None)), 3);
        assert_eq!(exit_code(&result(Status::Crashed, None, Some(11))), 139);
        assert_eq!(
            exit_code(&result(Status::Timeout, None, None)),
            EXIT_TIMEOUT
        );
        assert_eq!(
            exit_code(&result(Status::MemoryLimit, None, Some(9))),
            EXIT_MEMORY_LIMIT
        );
        assert_eq!(
            exit_code(&result(Status::CpuLimit, None, Some(24))),
            EXIT_CPU_LIMIT
        );
        assert_eq!(
            exit_code(&result(Status::PolicyViolation, None, Some(31))),
            EXIT_POLICY_VIOLATION
        );
        assert_eq!(
            exit_code(&result(Status::InternalError, None, None)),
            EXIT_AIRLOCK
        );
    }
}
