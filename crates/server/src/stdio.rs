//! `airlock mcp`: the MCP tools ([`crate::mcp`]) served on stdin and stdout, started beside
//! the HTTP service ([`crate::serve`]) from the same parts.

use std::sync::Arc;

use airlock_api::LimitsRequest;

use crate::serve::{
    flush_traces, make_state_dir, open_environments, start_engine, stop_everything, ServeError,
};
use airlock_service::config::Scope;
use airlock_service::keys::KeyStore;
use airlock_service::SharedServices;

/// `airlock mcp`: serves the tools on stdin and stdout (nothing else is written to stdout;
/// logs go to stderr) until the client closes stdin, or SIGTERM or SIGINT; then kills what
/// still runs and closes every session. The caller is the local user: one key with every
/// scope, under the engine's defaults and ceilings and the server's concurrency and session
/// caps; executions are in the audit log of the state directory like the service's.
pub async fn run_stdio(config: airlock_service::config::Config) -> Result<(), ServeError> {
    use rmcp::ServiceExt;
    use tokio::signal::unix::{signal, SignalKind};
    crate::sizing::check(&config).map_err(ServeError::Config)?;
    crate::serve::give_back_large_blocks();
    let state_dir = make_state_dir(&config)?;
    // A key nobody holds: it only names the local caller in logs, metrics and the audit log.
    let secret = airlock_service::keys::generate_key()
        .map_err(|e| ServeError::Mcp(format!("making the local key: {e}")))?;
    let keys = KeyStore::new(vec![airlock_service::config::KeyConfig {
        name: "stdio".into(),
        hash: airlock_service::keys::hash_key(&secret),
        scopes: Scope::ALL.to_vec(),
        max_concurrency: None,
        max_queue: None,
        rate_per_minute: 0,
        ceilings: LimitsRequest::default(),
        tools: if config.tools.servers.is_empty() {
            Vec::new()
        } else {
            config.mcp.stdio_tools.clone()
        },
        egress: Default::default(),
        credentials: Vec::new(),
        approves: Vec::new(),
        max_background_running: None,
        max_background_queued: None,
    }])?;
    let (engine, audit) = start_engine(&config, &state_dir)?;
    let tools = airlock_service::tools::start(&config, &keys)
        .await
        .map_err(ServeError::Tools)?;
    let environments = open_environments(&state_dir)?;
    let state: SharedServices = Arc::new(airlock_service::Services::new(
        config,
        engine,
        keys,
        audit,
        tools,
        environments,
    ));
    let key = state.keys.keys()[0].clone();
    tokio::spawn(airlock_service::snapshots::reaper(state.clone()));
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Signals)?;
    tracing::info!(state_dir = %state_dir.display(), "serving MCP on stdio");
    let tools = crate::mcp::Tools::for_stdio(state.clone(), key);
    let served = tokio::select! {
        served = async {
            let running = tools
                .serve(rmcp::transport::io::stdio_pipes())
                .await
                .map_err(|e| ServeError::Mcp(e.to_string()))?;
            running.waiting().await.map_err(|e| ServeError::Mcp(e.to_string()))?;
            Ok(())
        } => served,
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    };
    state.begin_shutdown();
    stop_everything(&state).await;
    flush_traces(&state).await;
    tracing::info!("stopped");
    served
}
