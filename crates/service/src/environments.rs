//! The environment service: named environments listed, built (from a request or the
//! config's `[environments.define]`), deleted, and resolved for the request that names one.

use serde::{Deserialize, Serialize};

use airlock_engine::environments::{EnvError, EnvMount, EnvironmentInfo};

use crate::body::{parse_json, read_body, Body};
use crate::error::{Error, Kind};
use crate::keys::Key;
use crate::services::SharedServices;

/// `POST /v1/environments`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnvironment {
    pub name: String,
    /// Requirement specifiers, one per item (as lines of a requirements file).
    pub requirements: Vec<String>,
}

/// What `POST /v1/environments` answers.
#[derive(Debug, Serialize)]
pub struct Created {
    #[serde(flatten)]
    pub info: EnvironmentInfo,
    /// False when an identical build was stored already and reused.
    pub built: bool,
    /// The build's last lines of output.
    pub log_tail: Vec<String>,
}

pub fn env_error(e: EnvError) -> Error {
    match e {
        EnvError::Unknown(_) | EnvError::Invalid(_) => Error::invalid("environment", e.to_string()),
        EnvError::Busy(_) => Error::new(Kind::Conflict, "conflict", e.to_string()),
        EnvError::BuildFailed { .. } | EnvError::Requirements { .. } => {
            Error::new(Kind::Unprocessable, "build_failed", e.to_string())
        }
        EnvError::Corrupt { .. } | EnvError::Io { .. } => {
            tracing::error!(error = %e, "environment store");
            Error::new(Kind::Unavailable, "unavailable", e.to_string())
        }
    }
}

/// The environment a request names, checked and ready to mount.
pub fn for_request(state: &SharedServices, name: Option<&str>) -> Result<Option<EnvMount>, Error> {
    let Some(name) = name else {
        return Ok(None);
    };
    state
        .environments
        .resolve(name)
        .map(Some)
        .map_err(env_error)
}

/// Builds `requirements` as `name` on a blocking thread, logging each line of the build.
pub async fn build(
    state: &SharedServices,
    name: String,
    requirements: Vec<String>,
) -> Result<Created, Error> {
    let st = state.clone();
    tokio::task::spawn_blocking(move || {
        let envs = &st.environments;
        let settings = &st.config.environments.build;
        let python = st.engine.interpreter().version.clone();
        let reqs = airlock_engine::environments::parse_requirements(&requirements.join("\n"))
            .map_err(env_error)?;
        let started = std::time::Instant::now();
        let label = name.clone();
        let (info, built) = envs
            .create(&name, &reqs, &python, settings.disk_mb << 20, &|mount, log| {
                let audit = crate::egress::observer(&st);
                let egress = airlock_engine::environments::BuildEgress {
                    settings: st.egress.clone(),
                    observer: Some(audit),
                };
                st.engine.build_environment(mount, &reqs, settings, egress, log, &mut |line| {
                    tracing::info!(environment = %label, elapsed_ms = started.elapsed().as_millis() as u64, "build: {line}");
                })
            })
            .map_err(env_error)?;
        let log = std::fs::read_to_string(envs.log_path(&info.hash)).unwrap_or_default();
        let lines: Vec<String> = log.lines().map(str::to_owned).collect();
        let log_tail = lines[lines.len().saturating_sub(20)..].to_vec();
        tracing::info!(environment = %info.name, hash = %info.hash, built, "environment ready");
        Ok(Created {
            info,
            built,
            log_tail,
        })
    })
    .await
    .map_err(|e| Error::internal(format!("building an environment: {e}")))?
}

/// Every named environment.
pub async fn list(state: &SharedServices) -> Result<Vec<EnvironmentInfo>, Error> {
    let st = state.clone();
    tokio::task::spawn_blocking(move || st.environments.list())
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_err(env_error)
}

/// The environment named `name`.
pub fn get(state: &SharedServices, name: &str) -> Result<EnvironmentInfo, Error> {
    match state.environments.get(name).map_err(env_error)? {
        Some(info) => Ok(info),
        None => Err(Error::not_found()),
    }
}

/// Builds (or reuses) and names the environment a request body asks for; done when built.
pub async fn create(state: &SharedServices, key: &Key, body: Body) -> Result<Created, Error> {
    let body = read_body(state, key, body).await?;
    let asked: CreateEnvironment = parse_json(state, &body.bytes)?;
    drop(body);
    build(state, asked.name, asked.requirements).await
}

/// Deletes the environment named `name` and closes its pooled sandboxes.
pub async fn delete(state: &SharedServices, name: String) -> Result<(), Error> {
    let st = state.clone();
    let removed = tokio::task::spawn_blocking(move || {
        let hash = st.environments.get(&name).ok().flatten().map(|i| i.hash);
        let removed = st.environments.delete(&name);
        // Its pooled sandboxes hold the tree: they go too (a pool starts again on demand).
        if let (Ok(true), Some(hash)) = (&removed, hash) {
            st.engine.close_environment_pool(&hash);
        }
        removed
    })
    .await
    .map_err(|e| Error::internal(e.to_string()))?
    .map_err(env_error)?;
    if removed {
        Ok(())
    } else {
        Err(Error::not_found())
    }
}

/// Builds the environments the config defines that are missing or differ, one after the
/// other, in the background (a request naming one before it is ready gets a 400).
pub async fn build_defined(state: SharedServices) {
    let defined = state.config.environments.define.clone();
    for (name, requirements) in defined {
        let current = state.environments.get(&name).ok().flatten();
        let python = state.engine.interpreter().version.clone();
        let wanted = airlock_engine::environments::parse_requirements(&requirements.join("\n"))
            .map(|r| airlock_engine::environments::environment_hash(&python, &r));
        if let (Some(info), Ok(hash)) = (&current, &wanted) {
            if &info.hash == hash {
                continue;
            }
        }
        if let Err(e) = build(&state, name.clone(), requirements).await {
            tracing::error!(environment = %name, error = %e.message, "cannot build a configured environment");
        }
    }
}
