//! `airlock mcp`: the MCP tools on stdin and stdout, for an agent host that starts airlock as
//! a subprocess.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// What `--help` says after the options: the tools, from the server's own table of them.
fn after_help() -> String {
    let width = airlock_server::mcp::TOOL_NAMES
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0);
    let mut tools = String::new();
    for t in airlock_server::mcp::TOOL_NAMES {
        let only = if t.code_mode {
            " (where [tools] configures tool servers)"
        } else {
            ""
        };
        tools.push_str(&format!("  {:width$}  {}{only}\n", t.name, t.title));
    }
    format!(
        "Speaks the Model Context Protocol on stdin and stdout; logs go to stderr. Settings come
from the same places as for `airlock serve` (--config, AIRLOCK_CONFIG, AIRLOCK_* variables):
the engine's limits, concurrency, sessions and the evaluator's budgets apply; API keys do not
(the caller is the local user). Executions are recorded in the state directory's audit log.
The same tools are served over streamable HTTP at /mcp by `airlock serve`.

Tools:
{tools}"
    )
}

/// Serve the MCP tools over stdio.
#[derive(Args, Debug)]
#[command(after_help = after_help())]
pub struct McpArgs {
    /// A TOML configuration file (see airlock.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where the audit log is kept.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

pub fn main(args: McpArgs) -> ExitCode {
    let env = crate::serve::settings_env();
    let config =
        match crate::serve::serving_config(args.config.as_deref(), &env, None, args.state_dir) {
            Ok(c) => c,
            Err(status) => return status,
        };
    airlock_server::init_logging(config.log_format, crate::config::log_filter(&env));
    let config = crate::config::settle(config, &env);
    crate::serve::run_to_end(airlock_server::run_stdio(config))
}
