//! An environment's build: pip in a sandbox of its own, with the environment's bounded file
//! system mounted writable at `/env` and egress only to the package index; its output logged,
//! and why it failed told apart (the requirements', or anything else's).

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::job::{InputFile, Job};
use crate::policy::EnvMount;
use crate::pump::{OutputSink, Stdin, Stream};

/// How environments are built: where pip looks, what the build may reach, its limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuildSettings {
    /// The package index pip uses (`--index-url`).
    pub index_url: String,
    /// The only places the build's sandbox may connect to: the index and where it keeps
    /// its files.
    pub egress: airlock_egress::EgressPolicy,
    /// Wall-clock limit of one build, in milliseconds.
    pub timeout_ms: u64,
    pub memory_mb: u64,
    /// Scratch space for pip's downloads and builds, and the size of the file system the
    /// environment is built into (with one entry per 4 KiB of it), enforced while it is
    /// written.
    pub disk_mb: u64,
    pub pids: u32,
}

impl Default for BuildSettings {
    fn default() -> Self {
        let host = |h: &str| airlock_egress::HostRule {
            host: h.to_owned(),
            ports: vec![443],
        };
        BuildSettings {
            index_url: "https://pypi.org/simple".into(),
            egress: airlock_egress::EgressPolicy {
                hosts: vec![host("pypi.org"), host("files.pythonhosted.org")],
                ranges: Vec::new(),
            },
            timeout_ms: 600_000,
            memory_mb: 2048,
            disk_mb: 2048,
            pids: 256,
        }
    }
}

impl BuildSettings {
    pub fn validate(&self) -> Result<(), String> {
        let url = &self.index_url;
        let ok = (url.starts_with("https://") || url.starts_with("http://"))
            && !url.contains(['@', ' ', '\n'])
            && url.len() < 2048;
        if !ok {
            return Err(format!(
                "environments.index_url {url:?}: an http(s) URL without user info"
            ));
        }
        self.egress
            .validate()
            .map_err(|m| format!("environments.egress: {m}"))?;
        if self.egress.allows_nothing() {
            return Err("environments.egress: list the index's hosts".into());
        }
        for (name, zero) in [
            ("timeout_ms", self.timeout_ms == 0),
            ("memory_mb", self.memory_mb == 0),
            ("disk_mb", self.disk_mb == 0),
            ("pids", self.pids == 0),
        ] {
            if zero {
                return Err(format!("environments.{name} must be greater than zero"));
            }
        }
        Ok(())
    }
}

/// The build, as the code its sandbox runs: a venv on the sandbox's interpreter at `/env`,
/// then pip (the interpreter's own) installing the requirements into its site-packages from
/// the configured index only. Source packages build with the interpreter's setuptools, inside
/// this same sandbox (no build isolation: nothing more is fetched to build them).
const BUILD_CODE: &str = r#"
import json, subprocess, sys
settings = json.load(open("/work/build.json"))
def step(argv):
    print("$ " + " ".join(argv), flush=True)
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit("%s exited with %d" % (argv[2], done.returncode))
step([sys.executable, "-m", "venv", "--without-pip", "/env"])
step([sys.executable, "-m", "pip", "install", "--no-input", "--progress-bar", "off",
      "--no-cache-dir", "--disable-pip-version-check", "--no-build-isolation",
      "--index-url", settings["index_url"], "--target", settings["site_packages"],
      "-r", "/work/requirements.txt"])
print("built", flush=True)
"#;

/// Why a build did not give an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// pip exited with an error: the requirements' fault. Its message ends with the end of
    /// pip's output.
    Requirements(String),
    /// Anything else: the sandbox, its limits, the host.
    Failed(String),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Requirements(why) | BuildError::Failed(why) => f.write_str(why),
        }
    }
}

/// How many of the build's last lines a failure on the requirements quotes.
const TAIL_LINES: usize = 12;

/// The operator's proxy settings for a build, and who hears of its connections.
#[derive(Debug)]
pub struct BuildEgress {
    pub settings: Arc<airlock_egress::Settings>,
    pub observer: Option<Arc<dyn airlock_egress::Observer>>,
}

/// Writes a build's output to its log and hands each line to `progress`.
struct BuildLog<'a> {
    file: fs::File,
    line: Vec<u8>,
    /// The last lines that were not empty, to say why a build failed.
    tail: std::collections::VecDeque<String>,
    /// A line said ENOSPC: the build filled its file system (or its scratch).
    full: bool,
    progress: &'a mut (dyn FnMut(&str) + Send),
}

impl OutputSink for BuildLog<'_> {
    fn output(&mut self, _: Stream, chunk: &[u8]) {
        let _ = self.file.write_all(chunk);
        for &b in chunk {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.line).into_owned();
                (self.progress)(&line);
                self.full |= line.contains("No space left on device");
                if !line.trim().is_empty() {
                    if self.tail.len() == TAIL_LINES {
                        self.tail.pop_front();
                    }
                    self.tail.push_back(line);
                }
                self.line.clear();
            } else if self.line.len() < 4096 {
                self.line.push(b);
            }
        }
    }

    fn truncated(&mut self, _: Stream, limit: u64) {
        let _ = writeln!(self.file, "[output past {limit} bytes not kept]");
    }
}

impl Engine {
    /// Runs one environment build in a sandbox: `mount` writable at `/env`, egress only under
    /// `settings.egress` with the operator's budgets and name answers (each connection told
    /// to `observer`), the output streamed to `log` and `progress`.
    pub fn build_environment(
        &self,
        mount: &EnvMount,
        requirements: &[String],
        settings: &BuildSettings,
        egress: BuildEgress,
        log: &Path,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), BuildError> {
        let failed = |e: &dyn std::fmt::Display| BuildError::Failed(e.to_string());
        let file = fs::File::create(log).map_err(|e| failed(&format!("{}: {e}", log.display())))?;
        let mut sink = BuildLog {
            file,
            line: Vec::new(),
            tail: std::collections::VecDeque::new(),
            full: false,
            progress,
        };
        let limits = self
            .config()
            .resolve_limits(&airlock_api::LimitsRequest::default())
            .map_err(|e| failed(&e))?;
        let limits = airlock_api::Limits {
            timeout_ms: settings.timeout_ms,
            cpu_ms: settings.timeout_ms,
            memory_mb: settings.memory_mb,
            disk_mb: settings.disk_mb,
            pids: settings.pids,
            output_bytes: limits.output_bytes.max(8 << 20),
        };
        let build = serde_json::json!({
            "index_url": settings.index_url,
            "site_packages": EnvMount::site_packages(&self.interpreter().version),
        });
        let egress = airlock_egress::Leash::new(
            settings.egress.clone(),
            egress.settings,
            "environment-build",
            egress.observer,
        );
        egress.begin(&format!("build:{}", mount.hash));
        let job = Job {
            code: BUILD_CODE.into(),
            filename: "build.py".into(),
            stdin: Stdin::Empty,
            env: Vec::new(),
            files: vec![
                InputFile {
                    path: "requirements.txt".into(),
                    data: (requirements.join("\n") + "\n").into_bytes(),
                },
                InputFile {
                    path: "build.json".into(),
                    data: build.to_string().into_bytes(),
                },
            ],
            entrypoint: None,
            limits,
            max_code_bytes: BUILD_CODE.len() as u64,
            stream: true,
            echo_traceback: true,
            cancel: None,
            tools: None,
            egress: Some(Arc::new(egress)),
            environment: Some(mount.clone()),
            volumes: Vec::new(),
        };
        let done = self.execute(job, &mut sink).map_err(|e| failed(&e))?;
        let r = done.result;
        let _ = writeln!(
            sink.file,
            "[airlock: the build ended with status {}]",
            r.status
        );
        if r.status == airlock_api::Status::Ok {
            return Ok(());
        }
        let last = sink.tail.back().map_or("", |l| l.trim());
        let why = match &r.error {
            Some(e) if e.kind != "SystemExit" => format!("{}: {}", e.kind, e.message),
            _ => format!("{} ({last})", r.status),
        };
        if sink.full {
            return Err(BuildError::Failed(format!(
                "it ran out of space (No space left on device): an environment and the \
                 build's scratch may hold {} MiB each (environments.build.disk_mb); {why}",
                settings.disk_mb
            )));
        }
        // BUILD_CODE's own words when pip itself failed: the requirements are at fault.
        // (`SystemExit` with a message: the exit status 1, no exception reported.)
        let pip = r.status == airlock_api::Status::Error
            && r.error.as_ref().is_none_or(|e| e.kind == "SystemExit")
            && last.starts_with("pip exited with ");
        if pip {
            let tail: Vec<&str> = sink.tail.iter().map(|l| l.trim_end()).collect();
            return Err(BuildError::Requirements(format!(
                "{last}; the end of its output:\n{}",
                tail[..tail.len() - 1].join("\n")
            )));
        }
        Err(BuildError::Failed(why))
    }
}
