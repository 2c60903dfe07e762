//! `airlock volume`: one key's volumes in the state directory the server uses (docs/volumes.md).
//! The same store and rules as `/v1/volumes`: made within the key's quota, files reached
//! beneath the volume's root and never through a link. A volume the server holds mounted
//! (an execution, a session or a file request uses it) is refused here until it is free.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use airlock_engine::volumes::{Access, VolumeError, Volumes};

use crate::{EXIT_AIRLOCK, EXIT_USAGE};

#[derive(Args, Debug)]
pub struct VolumeArgs {
    #[command(subcommand)]
    command: VolumeCommand,
    /// The server's configuration file (its state directory, keys and `[volumes]` quota).
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// The state directory, overriding the configuration's.
    #[arg(long, value_name = "DIR", global = true)]
    state_dir: Option<PathBuf>,
    /// The key (by its configured name) whose volumes these are; needed when the server has
    /// more than one (`env` is AIRLOCK_API_KEY's, `default` the generated one's).
    #[arg(long, value_name = "NAME", global = true)]
    key: Option<String>,
}

#[derive(Subcommand, Debug)]
enum VolumeCommand {
    /// Make a volume of SIZE (e.g. 64M, 1G), bounded in bytes and entries while written.
    Create {
        name: String,
        #[arg(long, value_parser = crate::units::parse_size)]
        size: u64,
        /// The most files, directories and links (default one per 16 KiB, at least 1024).
        #[arg(long)]
        entries: Option<u64>,
    },
    /// List the key's volumes.
    Ls,
    /// Show one volume, with what it holds, as JSON.
    Show { name: String },
    /// List a volume's files (links are listed, never followed).
    Files { name: String },
    /// Delete a volume and everything in it.
    Rm { name: String },
    /// Copy one file into or out of a volume: `cp local VOLUME:path` or `cp VOLUME:path local`
    /// (`-` is stdin or stdout).
    Cp { from: String, to: String },
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    errln!("airlock: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// The caller's mistakes (a name, a path, a quota, a busy volume) are usage errors; the
/// host's are airlock's.
fn failed(e: VolumeError) -> ExitCode {
    errln!("airlock: {e}");
    match e {
        VolumeError::Io { .. } | VolumeError::Unavailable(_) => ExitCode::from(EXIT_AIRLOCK),
        _ => ExitCode::from(EXIT_USAGE),
    }
}

/// The owner of the volumes: the fingerprint of the key named `--key` (or of the only key).
fn owner(config: &airlock_server::config::Config, name: Option<&str>) -> Result<String, String> {
    let env_key = std::env::var("AIRLOCK_API_KEY").ok();
    let state_dir = config.state_dir();
    // Resolving keys with none configured makes one: only a server may, which shows it.
    if config.keys.is_empty() && env_key.is_none() && !state_dir.join("keys.json").exists() {
        return Err(format!(
            "no keys: configure [[keys]], set AIRLOCK_API_KEY, or start `airlock serve` once \
             with --state-dir {} to make one",
            state_dir.display()
        ));
    }
    let resolved =
        airlock_server::keys::KeyStore::resolve(&config.keys, env_key.as_deref(), &state_dir)
            .map_err(|e| e.to_string())?;
    let keys = resolved.store.keys();
    let names: Vec<&str> = keys.iter().map(|k| k.name()).collect();
    let key = match name {
        Some(name) => keys.iter().find(|k| k.name() == name),
        None if keys.len() == 1 => keys.first(),
        None => {
            return Err(format!(
                "--key names whose volumes these are: one of {}",
                names.join(", ")
            ))
        }
    };
    key.map(|k| k.fingerprint()).ok_or_else(|| {
        format!(
            "no key named {:?}: one of {}",
            name.unwrap_or(""),
            names.join(", ")
        )
    })
}

pub fn main(args: VolumeArgs) -> ExitCode {
    let env = crate::serve::settings_env();
    let config =
        match crate::config::load(args.config.as_deref(), &env, None, args.state_dir.clone()) {
            Ok(c) => crate::config::settle(c, &env),
            Err(e) => return usage(e),
        };
    let owner = match owner(&config, args.key.as_deref()) {
        Ok(owner) => owner,
        Err(e) => return usage(e),
    };
    let volumes = std::sync::Arc::new(Volumes::open(&config.state_dir()));
    match args.command {
        VolumeCommand::Create {
            name,
            size,
            entries,
        } => {
            let quota = config.volumes.quota();
            let entries = entries
                .unwrap_or((size / (16 << 10)).max(1024))
                .min(quota.max_entries);
            let now = humantime_now();
            // The key's storage as the server counts it: its paused sessions too, and what
            // the server holds for what it is writing.
            let storage = airlock_server::storage_beside_the_server(&config, volumes.clone());
            match volumes.create(&owner, &name, size, entries, &quota, &now, &storage) {
                Ok(info) => {
                    print_json(&info);
                    ExitCode::SUCCESS
                }
                Err(e) => failed(e),
            }
        }
        VolumeCommand::Ls => match volumes.list(&owner) {
            Ok(list) => {
                for v in list {
                    outln!(
                        "{}\t{}\t{} entries\t{}",
                        v.name,
                        crate::units::human_size(v.size_bytes),
                        v.max_entries,
                        v.created_at
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => failed(e),
        },
        VolumeCommand::Show { name } => {
            let shown = volumes.get(&owner, &name).and_then(|info| {
                let usage = volumes.usage(&owner, &name)?;
                Ok(serde_json::json!({
                    "name": info.name, "size_bytes": info.size_bytes,
                    "max_entries": info.max_entries, "created_at": info.created_at,
                    "used_bytes": usage.used_bytes, "used_entries": usage.used_entries,
                }))
            });
            match shown {
                Ok(v) => {
                    print_json(&v);
                    ExitCode::SUCCESS
                }
                Err(e) => failed(e),
            }
        }
        VolumeCommand::Files { name } => {
            let listed = volumes
                .lease(&owner, &name, Access::Read, "airlock volume files")
                .and_then(|lease| lease.list_files(1_000_000, 256 << 20));
            match listed {
                Ok(listing) => {
                    for f in listing.files {
                        outln!("{}\t{}\t{}", f.kind, f.size, f.path);
                        if f.unreadable {
                            errln!(
                                "airlock: {} could not be read: what it holds is not listed",
                                f.path
                            );
                        }
                    }
                    if listing.truncated {
                        errln!("airlock: more entries than a listing holds (1,000,000, or 256 MiB of paths)");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => failed(e),
            }
        }
        VolumeCommand::Rm { name } => match volumes.delete(&owner, &name) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => failed(e),
        },
        VolumeCommand::Cp { from, to } => copy(&volumes, &owner, &config, &from, &to),
    }
}

/// `VOLUME:path`, when `arg` is one (a local path with a colon is written `./a:b`).
fn in_volume(arg: &str) -> Option<(&str, &str)> {
    if arg.starts_with('.') || arg.starts_with('/') {
        return None;
    }
    arg.split_once(':')
}

fn copy(
    volumes: &Volumes,
    owner: &str,
    config: &airlock_server::config::Config,
    from: &str,
    to: &str,
) -> ExitCode {
    use std::io::{Read, Write};
    match (in_volume(from), in_volume(to)) {
        (None, Some((name, path))) => {
            let mut data = Vec::new();
            let read = if from == "-" {
                std::io::stdin().read_to_end(&mut data)
            } else {
                std::fs::File::open(from).and_then(|mut f| f.read_to_end(&mut data))
            };
            if let Err(e) = read {
                return usage(format!("{from}: {e}"));
            }
            let written = volumes
                .lease(owner, name, Access::Write, "airlock volume cp")
                .and_then(|lease| lease.write_file(path, &data));
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failed(e),
            }
        }
        (Some((name, path)), None) => {
            // The most one file may be; the volume bounds it anyway.
            let max = config.volumes.max_size_bytes;
            let read = volumes
                .lease(owner, name, Access::Read, "airlock volume cp")
                .and_then(|lease| lease.read_file(path, max));
            let data = match read {
                Ok(data) => data,
                Err(e) => return failed(e),
            };
            let written = if to == "-" {
                crate::out::flush();
                std::io::stdout().write_all(&data)
            } else {
                std::fs::write(to, &data)
            };
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => usage(format!("{to}: {e}")),
            }
        }
        _ => {
            usage("cp copies between a local file and VOLUME:path: exactly one side names a volume")
        }
    }
}

fn humantime_now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

fn print_json(value: &impl serde::Serialize) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}
