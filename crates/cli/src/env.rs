//! `airlock env`: named Python environments in the state directory the server uses, built
//! in a sandbox whose only egress is the package index.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Subcommand};

use airlock_engine::environments::{parse_requirements, EnvironmentInfo, Environments};

use crate::{EXIT_AIRLOCK, EXIT_USAGE};

/// `env create`'s exit status when pip refused the requirements (the build ran): the
/// caller's to change, unlike 125 (airlock or the host failed).
pub const EXIT_REQUIREMENTS: u8 = 1;

#[derive(Args, Debug)]
pub struct EnvArgs {
    #[command(subcommand)]
    command: EnvCommand,
    /// The server's configuration file (its state directory, index and build limits).
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// The state directory, overriding the configuration's.
    #[arg(long, value_name = "DIR", global = true)]
    state_dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum EnvCommand {
    /// Build an environment from a requirements file and give it a name.
    Create {
        name: String,
        /// Requirement specifiers, one per line (`-` for stdin).
        #[arg(short = 'r', long = "requirements", value_name = "FILE")]
        requirements: PathBuf,
    },
    /// List the environments.
    List,
    /// Show one environment as JSON.
    Show { name: String },
    /// Remove an environment.
    Delete { name: String },
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    errln!("airlock: {message}");
    ExitCode::from(EXIT_USAGE)
}

fn failed(message: impl std::fmt::Display) -> ExitCode {
    errln!("airlock: {message}");
    ExitCode::from(EXIT_AIRLOCK)
}

fn print(info: &EnvironmentInfo) {
    outln!("{}", serde_json::to_string_pretty(info).unwrap_or_default());
}

pub fn main(args: EnvArgs) -> ExitCode {
    let env = crate::serve::settings_env();
    let config =
        match crate::config::load(args.config.as_deref(), &env, None, args.state_dir.clone()) {
            Ok(c) => crate::config::settle(c, &env),
            Err(e) => return usage(e),
        };
    let store = match Environments::open(&config.state_dir()) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    match args.command {
        EnvCommand::List => match store.list() {
            Ok(list) => {
                for info in list {
                    outln!(
                        "{}\t{}\t{} packages\t{}\t{}",
                        info.name,
                        &info.hash[..12],
                        info.packages.len(),
                        crate::units::human_size(info.size_bytes),
                        info.requirements.join(" ")
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => failed(e),
        },
        EnvCommand::Show { name } => match store.get(&name) {
            Ok(Some(info)) => {
                print(&info);
                ExitCode::SUCCESS
            }
            Ok(None) => usage(format!("no environment named {name:?}")),
            Err(e) => failed(e),
        },
        EnvCommand::Delete { name } => match store.delete(&name) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => usage(format!("no environment named {name:?}")),
            Err(e) => failed(e),
        },
        EnvCommand::Create { name, requirements } => {
            let text = if requirements.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
            } else {
                std::fs::read_to_string(&requirements)
            };
            let text = match text {
                Ok(t) => t,
                Err(e) => return usage(format!("{}: {e}", requirements.display())),
            };
            let reqs = match parse_requirements(&text) {
                Ok(r) => r,
                Err(e) => return usage(e),
            };
            let engine = match airlock_engine::Engine::new(config.engine.clone()) {
                Ok(e) => e,
                Err(e) => return failed(e),
            };
            let python = engine.interpreter().version.clone();
            let settings = &config.environments.build;
            let started = Instant::now();
            errln!(
                "airlock: building {name:?} ({} requirements) in a sandbox; egress only to {}",
                reqs.len(),
                settings.index_url
            );
            let egress = std::sync::Arc::new(config.egress.clone());
            let built = store.create(
                &name,
                &reqs,
                &python,
                settings.disk_mb << 20,
                &|mount, log| {
                    let egress = airlock_engine::environments::BuildEgress {
                        settings: egress.clone(),
                        observer: None,
                    };
                    engine.build_environment(mount, &reqs, settings, egress, log, &mut |line| {
                        errln!("  [{:>5.1}s] {line}", started.elapsed().as_secs_f64());
                    })
                },
            );
            match built {
                Ok((info, fresh)) => {
                    errln!(
                        "airlock: {} {:?} ({} packages, {}) in {:.1}s; log: {}",
                        if fresh {
                            "built"
                        } else {
                            "reused the stored build for"
                        },
                        info.name,
                        info.packages.len(),
                        crate::units::human_size(info.size_bytes),
                        started.elapsed().as_secs_f64(),
                        store.log_path(&info.hash).display()
                    );
                    print(&info);
                    ExitCode::SUCCESS
                }
                Err(e @ airlock_engine::environments::EnvError::Requirements { .. }) => {
                    errln!("airlock: {e}");
                    ExitCode::from(EXIT_REQUIREMENTS)
                }
                Err(e) => failed(e),
            }
        }
    }
}
