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
    /// any is unsafe, 3 if any is malformed or unreadable (2 is a usage error).
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
    /// Print a safe pickle's data as JSON; refuse anything else (exit 1 unsafe, 3 malformed or
    /// unreadable; 2 is a usage error).
    Decode {
        file: std::path::PathBuf,
        /// Also allow this global, as an exact `module.qualname` (repeatable); it decodes as
        /// `{"$call": name, "args": [...]}`.
        #[arg(long = "allow", value_name = "MODULE.NAME")]
        allow: Vec<String>,
    },
}

/// Exit code: a file is unsafe.
const EXIT_UNSAFE: u8 = 1;
/// Exit code: a file is malformed or cannot be read (2, `EXIT_USAGE`, is clap's for bad
/// arguments: a script can tell "fix the command" from "this file is broken").
const EXIT_MALFORMED: u8 = 3;

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
                        worst = EXIT_MALFORMED;
                        continue;
                    }
                };
                let report = scan_file(&data, &opts);
                let code = match report.verdict() {
                    Verdict::Safe => 0,
                    Verdict::Unsafe { .. } => EXIT_UNSAFE,
                    Verdict::Malformed { .. } => EXIT_MALFORMED,
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
                    return ExitCode::from(EXIT_MALFORMED);
                }
            };
            if data.starts_with(b"PK\x03\x04") {
                errln!(
                    "{}: a ZIP archive; decode takes one pickle (scan the archive instead)",
                    file.display()
                );
                return ExitCode::from(EXIT_MALFORMED);
            }
            match decode(&data, &opts) {
                Ok(v) => {
                    outln!("{v}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    errln!("{}: {e}", file.display());
                    ExitCode::from(match e {
                        DecodeError::Unsafe(_) => EXIT_UNSAFE,
                        _ => EXIT_MALFORMED,
                    })
                }
            }
        }
    }
}
