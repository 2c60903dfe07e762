//! `airlock`: run untrusted code in a real Linux sandbox and get back only data.
#![forbid(unsafe_code)]

// Before the others: its macros are theirs.
#[macro_use]
mod out;

mod config;
mod doctor;
mod env;
mod eval;
mod mcp;
mod pickle;
mod run;
mod serve;
mod units;
mod volume;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "airlock",
    version,
    about = "Run untrusted code in a real Linux sandbox and get back only data."
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    Run(Box<run::RunArgs>),
    Serve(serve::ServeArgs),
    Doctor(doctor::DoctorArgs),
    Eval(eval::EvalArgs),
    Pickle(pickle::PickleArgs),
    Mcp(mcp::McpArgs),
    /// Named Python environments: build, list, show, delete.
    Env(env::EnvArgs),
    /// A key's volumes: create, list, show, list files, delete, copy files in and out.
    Volume(volume::VolumeArgs),
    /// Print a shell's completion script: `source <(airlock completions bash)`.
    Completions {
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `airlock man | man -l -`.
    Man,
}

/// Exit code for bad input: nothing ran.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when airlock itself failed or cannot enforce the policy.
pub const EXIT_AIRLOCK: u8 = 125;

/// Arguments clap refused (or help and version, which are no refusal). `run --json` promises
/// one JSON object on stdout: a refusal is the API's error body there too.
fn refused_arguments(e: clap::Error) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json_run = args.first().is_some_and(|a| a == "run") && args.iter().any(|a| a == "--json");
    if json_run && e.use_stderr() {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        run::print_error_body("invalid_request", first.trim_start_matches("error: "));
        // `exit` below ends the process without flushing ours.
        out::flush();
    }
    e.exit()
}

fn main() -> ExitCode {
    // The sandbox's init is this binary re-executed; it must not get past this line.
    airlock_sandbox::run_if_init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return refused_arguments(e),
    };
    // Before any thread starts, for the commands that build sandboxes: in a container,
    // /proc's covers go from airlock's own view (docs/deploying.md "Kubernetes").
    if !matches!(
        cli.command,
        Commands::Eval(_) | Commands::Pickle(_) | Commands::Completions { .. } | Commands::Man
    ) {
        airlock_sandbox::unmask_proc();
    }
    let code = match cli.command {
        Commands::Run(args) => run::main(*args),
        Commands::Serve(args) => serve::main(args),
        Commands::Doctor(args) => doctor::main(args),
        Commands::Eval(args) => eval::main(args),
        Commands::Pickle(args) => pickle::main(args),
        Commands::Mcp(args) => mcp::main(args),
        Commands::Env(args) => env::main(args),
        Commands::Volume(args) => volume::main(args),
        Commands::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "airlock", &mut out);
            out::write_bytes(&out);
            ExitCode::SUCCESS
        }
        Commands::Man => {
            let mut out = Vec::new();
            match clap_mangen::Man::new(Cli::command()).render(&mut out) {
                Ok(()) => {
                    out::write_bytes(&out);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    errln!("airlock: {e}");
                    ExitCode::from(EXIT_AIRLOCK)
                }
            }
        }
    };
    out::flush();
    if out::failed() {
        ExitCode::from(EXIT_AIRLOCK)
    } else {
        code
    }
}
