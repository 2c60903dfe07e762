//! `airlock`: run untrusted code in a real Linux sandbox and get back only data.
#![forbid(unsafe_code)]

// Before the others: its macros are theirs.
#[macro_use]
mod out;

mod doctor;
mod env;
mod eval;
mod mcp;
mod pickle;
mod run;
mod serve;
mod units;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

/// Exit code for bad input: nothing ran.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when airlock itself failed or cannot enforce the policy.
pub const EXIT_AIRLOCK: u8 = 125;

fn main() -> ExitCode {
    // The sandbox's init is this binary re-executed; it must not get past this line.
    airlock_sandbox::run_if_init();
    let cli = Cli::parse();
    // Before any thread starts, for the commands that build sandboxes: in a container,
    // /proc's covers go from airlock's own view (docs/deploying.md "Kubernetes").
    if !matches!(cli.command, Commands::Eval(_) | Commands::Pickle(_)) {
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
    };
    out::flush();
    if out::failed() {
        ExitCode::from(EXIT_AIRLOCK)
    } else {
        code
    }
}
