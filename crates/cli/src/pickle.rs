//! `airlock pickle`: scan and decode pickles without ever running them.

use std::process::ExitCode;

use airlock_pickle::{decode, scan_file, DecodeError, Options, Verdict};

/// Scan or decode Python pickles (and ZIP archives of them, PyTorch style) without running
/// them.
#[derive(clap::Args, Debug)]
pub struct PickleArgs {
    #[command(subcommand)]
    command: PickleCommand,
}

#[derive(clap::Subcommand, Debug)]
enum PickleCommand {
    /// Report globals, call sites and a verdict per file. Exit 0 if every file is safe, 1 if
    /// any is unsafe, 2 if any is malformed or unreadable.
    Scan {
        /// One JSON object per file.
        #[arg(long)]
        json: bool,
        /// Also allow this global, as an exact `module.qualname` (repeatable).
        #[arg(long = "allow", value_name = "MODULE.NAME")]
        allow: Vec<String>,
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Print a safe pickle's data as JSON; refuse anything else (exit 1 unsafe, 2 malformed).
    Decode {
        file: std::path::PathBuf,
        /// Also allow this global, as an exact `module.qualname` (repeatable); it decodes as
        /// `{"$call": name, "args": [...]}`.
        #[arg(long = "allow", value_name = "MODULE.NAME")]
        allow: Vec<String>,
    },
}

fn options(allow: Vec<String>) -> Options {
    let mut opts = Options::default();
    opts.allow.extend(allow);
    opts
}

pub fn main(args: PickleArgs) -> ExitCode {
    match args.command {
        PickleCommand::Scan { json, files, allow } => {
            let opts = options(allow);
            let mut worst = 0u8;
            for file in files {
                let shown = file.display().to_string();
                let data = match std::fs::read(&file) {
                    Ok(d) => d,
                    Err(e) => {
                        errln!("{shown}: cannot read: {e}");
                        worst = 2;
                        continue;
                    }
                };
                let report = scan_file(&data, &opts);
                let code = match report.verdict() {
                    Verdict::Safe => 0,
                    Verdict::Unsafe { .. } => 1,
                    Verdict::Malformed { .. } => 2,
                };
                worst = worst.max(code);
                if json {
                    let mut v = report.to_json();
                    v["file"] = shown.into();
                    outln!("{v}");
                } else {
                    match report.verdict() {
                        Verdict::Safe => outln!("{shown}: safe"),
                        Verdict::Unsafe { reasons } => {
                            outln!("{shown}: unsafe: {}", reasons.join("; "))
                        }
                        Verdict::Malformed { offset, reason } => {
                            outln!("{shown}: malformed at offset {offset}: {reason}")
                        }
                    }
                }
            }
            ExitCode::from(worst)
        }
        PickleCommand::Decode { file, allow } => {
            let opts = options(allow);
            let data = match std::fs::read(&file) {
                Ok(d) => d,
                Err(e) => {
                    errln!("{}: cannot read: {e}", file.display());
                    return ExitCode::from(2);
                }
            };
            if data.starts_with(b"PK\x03\x04") {
                errln!(
                    "{}: a ZIP archive; decode takes one pickle (scan the archive instead)",
                    file.display()
                );
                return ExitCode::from(2);
            }
            match decode(&data, &opts) {
                Ok(v) => {
                    outln!("{v}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    errln!("{}: {e}", file.display());
                    ExitCode::from(match e {
                        DecodeError::Unsafe(_) => 1,
                        _ => 2,
                    })
                }
            }
        }
    }
}
