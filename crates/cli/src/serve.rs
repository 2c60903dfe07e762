//! `airlock serve`: the HTTP API.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{self, ENV_API_KEY};
use clap::Args;

use crate::{EXIT_AIRLOCK, EXIT_USAGE};

const AFTER_HELP: &str = "\
With no configuration at all the server listens on 127.0.0.1:8080, makes an API key on first
start (printed once; only its hash is kept in the state directory) and runs executions with
the same defaults as `airlock run`. Every setting can come from a TOML file (--config, or
AIRLOCK_CONFIG) or an AIRLOCK_* variable named after its path, e.g.
AIRLOCK_CONCURRENCY__MAX_RUNNING=8; see airlock.example.toml. AIRLOCK_API_KEY=<key> configures
one key without a file. --print-config shows the result.";

/// Serve the HTTP API.
#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct ServeArgs {
    /// A TOML configuration file (see airlock.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:8080 (port 0: any free port).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Where the generated key's hash and the audit log are kept.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// The environment as settings read it: variables that are not Unicode cannot be settings;
/// they are left out, not misread.
pub(crate) fn settings_env() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Runs a server (`airlock serve` or `airlock mcp`) to its end; its result is the exit status.
pub(crate) fn run_to_end<E: std::fmt::Display>(
    serve: impl std::future::Future<Output = Result<(), E>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("airlock: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_AIRLOCK);
        }
    };
    let served = runtime.block_on(serve);
    // Sandboxes were killed and answered by now; a task still blocked (a read of stdin) must
    // not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("airlock: {e}");
            ExitCode::from(EXIT_AIRLOCK)
        }
    }
}

/// The configuration a server (`airlock serve`, `airlock mcp`) runs with: loaded, and able to
/// admit an execution at the ceilings (`sizing::check`); else the usage error's status.
pub(crate) fn serving_config(
    file: Option<&std::path::Path>,
    env: &BTreeMap<String, String>,
    listen: Option<std::net::SocketAddr>,
    state_dir: Option<std::path::PathBuf>,
) -> Result<airlock_server::config::Config, ExitCode> {
    let loaded = config::load(file, env, listen, state_dir).map_err(|e| e.to_string());
    loaded
        .and_then(|c| {
            airlock_server::sizing::check(&c)
                .map(|()| c)
                .map_err(|e| format!("invalid configuration: {e}"))
        })
        .map_err(|e| {
            errln!("airlock: {e}");
            ExitCode::from(EXIT_USAGE)
        })
}

pub fn main(args: ServeArgs) -> ExitCode {
    let env = settings_env();
    let config = match serving_config(
        args.config.as_deref(),
        &env,
        args.listen,
        args.state_dir.clone(),
    ) {
        Ok(c) => c,
        Err(status) => return status,
    };
    if args.print_config {
        out!("{}", config::to_toml(&config));
        return ExitCode::SUCCESS;
    }
    airlock_server::init_logging(config.log_format, config::log_filter(&env));
    let config = config::settle(config, &env);
    let key = env.get(ENV_API_KEY).cloned();
    // SIGHUP reads the same file and environment again, for the keys.
    let (file, listen, state_dir) = (args.config.clone(), args.listen, args.state_dir.clone());
    let reload: airlock_server::Reload = Box::new(move || {
        config::load(file.as_deref(), &env, listen, state_dir.clone())
            .map(|c| config::settle(c, &env))
            .map_err(|e| e.to_string())
    });
    run_to_end(airlock_server::run(config, key, reload, |_| {}))
}
