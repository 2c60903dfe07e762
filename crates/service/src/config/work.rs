//! `[sessions]`, `[background]`, `[volumes]` and `[environments]`: the work that outlives one
//! request.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Sessions: long-lived sandboxes, each owned by the key that made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Sessions open at once, all keys together; past it, 429.
    pub max_open: usize,
    /// Sessions open at once per key.
    pub max_open_per_key: usize,
    /// A session unused for this long is closed (a request may ask for less).
    pub idle_timeout_ms: u64,
    /// No session lives longer (a request may ask for less).
    pub max_lifetime_ms: u64,
    /// Where paused sessions are kept, their snapshots and records (default
    /// `<state_dir>/sessions`). Replicas that share it resume each other's paused sessions.
    pub snapshot_dir: Option<PathBuf>,
    /// Largest state one snapshot may hold, as the sandbox writes it; it also counts against
    /// the key's storage (`volumes.max_bytes_per_key`).
    pub max_snapshot_bytes: u64,
    /// When set, a session unused for this long is paused instead of closed (its idle
    /// timeout no longer closes it), so that it can live for days at the cost of its
    /// snapshot on disk.
    pub pause_after_idle_ms: Option<u64>,
    /// How long a paused session is kept before it is deleted.
    pub paused_retention_ms: u64,
    /// Paused sessions one key may have at once (each also counts against its storage).
    pub max_paused_per_key: usize,
    /// How long a snapshot (or a restore) may take before the session is ended.
    pub snapshot_timeout_ms: u64,
    /// `each_cell`: a session's state is written to its snapshot after each cell, so that a
    /// server killed (or restarted) while it is open brings it back from its last cell;
    /// `none` (the default): only a pause keeps it.
    pub checkpoint: Checkpoint,
}

/// When an open session's state is written to its snapshot (`sessions.checkpoint`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Checkpoint {
    #[default]
    None,
    EachCell,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            max_open: 16,
            max_open_per_key: 4,
            idle_timeout_ms: 600_000,
            max_lifetime_ms: 3_600_000,
            snapshot_dir: None,
            max_snapshot_bytes: 2 << 30,
            pause_after_idle_ms: None,
            paused_retention_ms: 7 * 24 * 3_600_000,
            max_paused_per_key: 10_000,
            snapshot_timeout_ms: 120_000,
            checkpoint: Checkpoint::None,
        }
    }
}

/// `[background]`: executions that outlive their request (`POST /v1/executions`). They take
/// the same running slots as every execution (`[concurrency]`), at most `max_running` of them
/// at once so that requests answered in place always find some.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackgroundConfig {
    /// Ceiling of `limits.timeout_ms` and `limits.cpu_ms` for background work (the engine's
    /// ceilings hold for every other limit).
    pub max_timeout_ms: u64,
    /// `limits.timeout_ms` and `limits.cpu_ms` when a submission leaves them out.
    pub default_timeout_ms: u64,
    /// Background executions running at once, all keys together; below
    /// `concurrency.max_running`, so that requests answered in place always find a slot
    /// (with one slot in all, none runs in the background).
    pub max_running: usize,
    /// Per key, unless the key sets `max_background_running`.
    pub max_running_per_key: usize,
    /// Submitted and not yet running, per key, unless the key sets `max_background_queued`;
    /// past it a submission is 429.
    pub max_queued_per_key: usize,
    /// Ended executions kept per key; past it a submission is 429 until some are deleted or
    /// expire.
    pub max_kept_per_key: usize,
    /// How long an ended execution's result and events are kept.
    pub retention_ms: u64,
    /// Bytes one key's background executions may store (their events, results, and the jobs
    /// of those waiting); past it a submission is 429, and one that runs is stopped.
    pub max_bytes_per_key: u64,
}

impl Default for BackgroundConfig {
    fn default() -> Self {
        BackgroundConfig {
            max_timeout_ms: 4 * 3600 * 1000,
            default_timeout_ms: 3600 * 1000,
            max_running: 1,
            max_running_per_key: 1,
            max_queued_per_key: 16,
            max_kept_per_key: 100,
            retention_ms: 24 * 3600 * 1000,
            max_bytes_per_key: 4 << 30,
        }
    }
}

/// `[volumes]`: what one key's volumes may take. A volume's size is counted in full against
/// its key's quota from its creation (its image may grow to it), whatever it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VolumesConfig {
    /// The sum of the sizes of one key's volumes.
    pub max_bytes_per_key: u64,
    pub max_volumes_per_key: usize,
    /// Largest single volume.
    pub max_size_bytes: u64,
    /// Most entries (files, directories, links) a volume may be made with.
    pub max_entries: u64,
}

impl Default for VolumesConfig {
    fn default() -> Self {
        VolumesConfig {
            max_bytes_per_key: 4 << 30,
            max_volumes_per_key: 16,
            max_size_bytes: 2 << 30,
            max_entries: 1 << 20,
        }
    }
}

impl VolumesConfig {
    pub fn quota(&self) -> airlock_engine::volumes::Quota {
        airlock_engine::volumes::Quota {
            max_volumes_per_key: self.max_volumes_per_key,
            max_size_bytes: self.max_size_bytes,
            max_entries: self.max_entries,
        }
    }
}

/// `[environments]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvironmentsConfig {
    /// The index, the build's egress and its limits.
    pub build: airlock_engine::environments::BuildSettings,
    /// Environments built at start when missing or different: name to requirements.
    pub define: BTreeMap<String, Vec<String>>,
}
