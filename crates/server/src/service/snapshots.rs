//! Paused sessions: a session's state written to a snapshot by its own sandbox, its sandbox
//! freed, and brought back in a fresh sandbox by its next request, or forked into a new
//! session. The snapshot is made and read only inside sandboxes of the session's key; to
//! the server it is opaque bytes, compressed and bound to the session and key by a MAC
//! (`airlock_engine::snapshot`). Paused sessions live on disk, in `sessions.snapshot_dir`:
//! `<id>.snap` (the snapshot) and `<id>.json` (its record: the key's fingerprint, what the
//! session was opened with, the MAC, what it holds), so a restart, graceful or not, finds
//! them. In memory each is an entry of an index (id, key, size).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use airlock_api::{SessionInfo, SessionRequest, SnapshotInfo};
use airlock_engine::snapshot::{open_verified, Binding, Sealed, SnapshotKey, SnapshotWriter};
use airlock_engine::{SessionError, SnapshotError, SnapshotReport};

use crate::error::{Error, Kind};
use crate::keys::Key;
use crate::service::sessions::{self, OpenSession};
use crate::{AppState, SharedState};

/// How long a snapshot or a restore may take (`sessions.snapshot_timeout_ms`).
fn snapshot_timeout(state: &AppState) -> Duration {
    Duration::from_millis(state.config.sessions.snapshot_timeout_ms)
}

/// A paused session's record.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PausedRecord {
    pub id: String,
    pub key_fingerprint: String,
    /// When the session was first opened, RFC 3339.
    pub created_at: String,
    pub idle_timeout_ms: u64,
    pub max_lifetime_ms: u64,
    /// What it was opened with, its files aside (they are in the snapshot).
    pub request: SessionRequest,
    /// Its cells' limits, as `GET /v1/sessions/{id}` shows them.
    pub limits: airlock_api::Limits,
    pub sealed: Sealed,
    pub snapshot: SnapshotInfo,
}

/// The paused sessions of a snapshot directory.
pub struct Paused {
    dir: PathBuf,
    key: Result<SnapshotKey, String>,
    /// Id to what the index keeps of each: its key, its bytes on disk (snapshot and record),
    /// and the session as a listing shows it (without the names of its variables).
    index: Mutex<HashMap<String, Indexed>>,
    /// Ids being paused, resumed or forked by this process.
    claimed: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paused").field("dir", &self.dir).finish()
    }
}

/// A paused session as the index holds it.
#[derive(Clone, Debug)]
struct Indexed {
    owner: String,
    bytes: u64,
    listed: SessionInfo,
}

impl Indexed {
    fn of(record: &PausedRecord, record_bytes: u64) -> Indexed {
        let mut listed = paused_info(record, Duration::ZERO);
        if let Some(p) = listed.paused.as_mut() {
            p.variables = Vec::new();
            p.not_kept = Default::default();
        }
        Indexed {
            owner: record.key_fingerprint.clone(),
            bytes: record.sealed.stored_bytes + record_bytes,
            listed,
        }
    }
}

/// Whether `id` may name files of the snapshot directory (the server's ids always may).
fn valid_id(id: &str) -> bool {
    id.starts_with("se_")
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn rfc(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

impl Paused {
    /// The paused sessions in `dir` (made if missing, private), and the key of their MACs
    /// (`dir/.key`); leftovers of a pause cut short are removed. Where the directory or the
    /// key cannot be had, pausing is unavailable and says why.
    pub fn open(dir: &Path) -> Paused {
        let made = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("{}: {e}", dir.display()));
        let key = made.and_then(|()| {
            SnapshotKey::load_or_create(&dir.join(".key"))
                .map_err(|e| format!("{}: {e}", dir.join(".key").display()))
        });
        let mut index = HashMap::new();
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            let bytes = fs::read(&path).ok();
            let record = bytes
                .as_deref()
                .and_then(|b| serde_json::from_slice::<PausedRecord>(b).ok());
            let record_bytes = bytes.map_or(0, |b| b.len() as u64);
            let deleted = dir.join(format!("{id}.deleted")).exists();
            match record {
                Some(_) if deleted => {
                    tracing::warn!(path = %path.display(), "a deleted session's record is back; it is never resumed");
                }
                Some(r) if r.id == id && valid_id(id) => {
                    index.insert(r.id.clone(), Indexed::of(&r, record_bytes));
                }
                _ => {
                    tracing::warn!(path = %path.display(), "a paused session's record cannot be read; left as it is")
                }
            }
        }
        Paused {
            dir: dir.to_path_buf(),
            key,
            index: Mutex::new(index),
            claimed: Mutex::new(HashSet::new()),
        }
    }

    fn key(&self) -> Result<&SnapshotKey, Error> {
        self.key.as_ref().map_err(|why| {
            Error::new(
                Kind::Unprocessable,
                "snapshots_unavailable",
                format!("sessions cannot be paused here: {why}"),
            )
        })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<String, Indexed>> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snap_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.snap"))
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Whether `id` is a paused session of the key with `fingerprint`.
    pub fn holds(&self, id: &str, fingerprint: &str) -> bool {
        if let Some(e) = self.index().get(id) {
            return e.owner == fingerprint;
        }
        // Paused by another replica sharing the directory since this one started: taken
        // into the index from its record.
        if !valid_id(id) || self.deleted(id) {
            return false;
        }
        let Ok(bytes) = fs::read(self.record_path(id)) else {
            return false;
        };
        match serde_json::from_slice::<PausedRecord>(&bytes) {
            Ok(r) if r.id == id => {
                let owned = r.key_fingerprint == fingerprint;
                self.index()
                    .insert(r.id.clone(), Indexed::of(&r, bytes.len() as u64));
                owned
            }
            _ => false,
        }
    }

    /// How many sessions are paused, all keys together.
    pub fn count(&self) -> usize {
        self.index().len()
    }

    /// The bytes on disk of the key's paused sessions (snapshots and records).
    pub fn stored_bytes_of(&self, fingerprint: &str) -> u64 {
        self.index()
            .values()
            .filter(|e| e.owner == fingerprint)
            .map(|e| e.bytes)
            .sum()
    }

    /// The bytes on disk of paused session `id`, if there is one.
    fn bytes_of(&self, id: &str) -> Option<u64> {
        self.index().get(id).map(|e| e.bytes)
    }

    /// How many paused sessions the key has.
    pub fn count_of(&self, fingerprint: &str) -> usize {
        self.index()
            .values()
            .filter(|e| e.owner == fingerprint)
            .count()
    }

    /// Paused sessions and their bytes on disk, all keys together (for `/metrics`).
    pub fn totals(&self) -> (usize, u64) {
        let index = self.index();
        (index.len(), index.values().map(|e| e.bytes).sum())
    }

    /// The record of paused session `id`, if it is the key's.
    pub fn record(&self, id: &str, fingerprint: &str) -> Option<PausedRecord> {
        if !valid_id(id) || !self.holds(id, fingerprint) || self.deleted(id) {
            return None;
        }
        let Ok(bytes) = fs::read(self.record_path(id)) else {
            // Resumed or deleted by another replica sharing the directory.
            self.index().remove(id);
            return None;
        };
        let record: PausedRecord = serde_json::from_slice(&bytes).ok()?;
        (record.id == id && record.key_fingerprint == fingerprint).then_some(record)
    }

    /// The key's paused sessions as a listing shows them (from memory: the names of their
    /// variables are for `GET /v1/sessions/{id}`), each kept until `retention` after it was
    /// paused.
    pub fn listed_of(&self, fingerprint: &str, retention: Duration) -> Vec<SessionInfo> {
        self.index()
            .values()
            .filter(|e| e.owner == fingerprint)
            .map(|e| {
                let mut info = e.listed.clone();
                if let Some(taken) = info
                    .paused
                    .as_ref()
                    .and_then(|p| humantime::parse_rfc3339(&p.taken_at).ok())
                {
                    info.expires_at = rfc(taken + retention);
                }
                info
            })
            .collect()
    }

    /// Claims `id` for one pause, resume or fork in this process, and, with an exclusive
    /// `flock` on `<id>.lock`, against other replicas sharing the directory.
    fn claim(&self, id: &str) -> Result<Claim<'_>, Error> {
        // Never a path of the caller's making.
        if !valid_id(id) {
            return Err(Error::new(Kind::NotFound, "not_found", "no such session"));
        }
        let busy = || {
            Error::new(
                Kind::Conflict,
                "session_busy",
                "the session is being paused, resumed or forked by another request",
            )
        };
        if !self
            .claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned())
        {
            return Err(busy());
        }
        let mut claim = Claim {
            paused: self,
            id: id.to_owned(),
            lock: None,
            path: None,
        };
        let path = self.dir.join(format!("{id}.lock"));
        claim.path = Some(path.clone());
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| Error::internal(format!("{}: {e}", path.display())))?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                claim.lock = Some(lock);
                Ok(claim)
            }
            Err(_) => Err(busy()),
        }
    }

    fn save(&self, record: &PausedRecord) -> Result<(), Error> {
        let path = self.record_path(&record.id);
        let tmp = self.dir.join(format!("{}.json.tmp", record.id));
        let written = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            fs::File::open(&self.dir)?.sync_all()?;
            Ok::<u64, std::io::Error>(bytes.len() as u64)
        })();
        let record_bytes = written.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::internal(format!("writing {}: {e}", path.display()))
        })?;
        self.index()
            .insert(record.id.clone(), Indexed::of(record, record_bytes));
        Ok(())
    }

    /// Deletes paused session `id` for good: a tombstone (`<id>.deleted`, kept) first, so
    /// that its record and snapshot, copied back, are never taken again; then both.
    pub fn delete(&self, id: &str) -> Result<(), Error> {
        if !valid_id(id) {
            return Ok(());
        }
        let tombstone = self.dir.join(format!("{id}.deleted"));
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&tombstone)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::internal(format!("{}: {e}", tombstone.display())))?;
        self.remove(id);
        Ok(())
    }

    fn deleted(&self, id: &str) -> bool {
        self.dir.join(format!("{id}.deleted")).exists()
    }

    /// Deletes `id`'s snapshot for good if it has one (a session closed for good: its
    /// checkpoint).
    pub fn forget(&self, id: &str) {
        if self.index().contains_key(id) {
            let _ = self.delete(id);
        }
    }

    /// Deletes the key's paused session `id` for good (blocking), holding it meanwhile.
    pub fn delete_owned(&self, id: &str, fingerprint: &str) -> Result<(), Error> {
        let _claim = self.claim(id)?;
        if !self.holds(id, fingerprint) {
            return Err(Error::new(Kind::NotFound, "not_found", "no such session"));
        }
        self.delete(id)
    }

    /// Forgets paused session `id`: its record, then its snapshot.
    pub fn remove(&self, id: &str) {
        if !valid_id(id) {
            return;
        }
        self.index().remove(id);
        let _ = fs::remove_file(self.record_path(id));
        let _ = fs::remove_file(self.snap_path(id));
    }

    /// Paused sessions kept longer than `retention`: removed; their ids and keys.
    pub fn expire(&self, retention: Duration) -> Vec<(String, String)> {
        let now = SystemTime::now();
        let ids: Vec<(String, String)> = self
            .index()
            .iter()
            .map(|(id, e)| (id.clone(), e.owner.clone()))
            .collect();
        let mut gone = Vec::new();
        for (id, owner) in ids {
            let old = fs::metadata(self.record_path(&id))
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > retention);
            if old {
                if let Ok(_claim) = self.claim(&id) {
                    if self.delete(&id).is_ok() {
                        gone.push((id, owner));
                    }
                }
            }
        }
        gone
    }
}

/// A claim on one session id ([`Paused::claim`]).
struct Claim<'a> {
    paused: &'a Paused,
    id: String,
    lock: Option<nix::fcntl::Flock<fs::File>>,
    /// The lock's file: removed while still locked, so none is left behind.
    path: Option<PathBuf>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let (Some(path), Some(_)) = (&self.path, &self.lock) {
            let _ = fs::remove_file(path);
        }
        drop(self.lock.take());
        self.paused
            .claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

fn snapshot_error(e: SnapshotError) -> Error {
    match e {
        SnapshotError::TooLarge { limit } => Error::new(
            Kind::TooLarge,
            "quota_exceeded",
            format!(
                "the session's state is over {limit} bytes, the most its snapshot may hold \
                 (sessions.max_snapshot_bytes, and the key's storage, volumes.max_bytes_per_key); \
                 nothing was kept and the session runs on"
            ),
        ),
        SnapshotError::Refused { kind, message } => Error::new(
            Kind::Unprocessable,
            "snapshot_failed",
            format!("the session's sandbox could not take or read its snapshot: {kind}: {message}"),
        ),
        SnapshotError::Store(e) => Error::internal(format!("a snapshot's file: {e}")),
        SnapshotError::Session(SessionError::Ended(status)) => Error::new(
            Kind::Conflict,
            "session_ended",
            format!("the session has ended ({status}); close it and start another"),
        ),
        SnapshotError::Session(e) => Error::internal(e.to_string()),
    }
}

/// How many state bytes a snapshot of the key's may hold now: the configured most, within
/// what its storage has left after its volumes and its other paused sessions.
fn room_for_snapshot(state: &AppState, owner: &str) -> u64 {
    let used = storage_used(state, owner);
    state
        .config
        .sessions
        .max_snapshot_bytes
        .min(state.config.volumes.max_bytes_per_key.saturating_sub(used))
}

/// What the key's storage holds: its volumes' sizes and its paused sessions' bytes.
fn storage_used(state: &AppState, owner: &str) -> u64 {
    let volumes: u64 = state
        .volumes
        .list(owner)
        .unwrap_or_default()
        .iter()
        .map(|v| v.size_bytes)
        .sum();
    volumes + state.paused.stored_bytes_of(owner)
}

/// Room a record takes beside its snapshot, counted before it is written.
const RECORD_ROOM: u64 = 1 << 20;

/// Keeps the snapshot written at `tmp` as `record`'s: within the key's storage and its most
/// paused sessions, counted under the storage lock (two at once never both fit where one
/// does); else it is removed, and the answer says why.
fn keep(state: &AppState, tmp: &Path, record: &PausedRecord) -> Result<(), Error> {
    let temporary = Temporary(Some(tmp.to_path_buf()));
    let _storage = state.volumes.storage_lock();
    let owner = &record.key_fingerprint;
    let replaced = state.paused.bytes_of(&record.id);
    let used = storage_used(state, owner).saturating_sub(replaced.unwrap_or(0));
    let needed = record.sealed.stored_bytes + RECORD_ROOM;
    let quota = state.config.volumes.max_bytes_per_key;
    if used.saturating_add(needed) > quota {
        return Err(Error::new(
            Kind::TooLarge,
            "quota_exceeded",
            format!(
                "this key's storage (its volumes and paused sessions) holds {used} bytes; this \
                 snapshot's {needed} more would pass its quota of {quota} \
                 (volumes.max_bytes_per_key); nothing was kept, and the session runs on"
            ),
        ));
    }
    let most = state.config.sessions.max_paused_per_key;
    if replaced.is_none() && state.paused.count_of(owner) >= most {
        return Err(Error::new(
            Kind::TooLarge,
            "quota_exceeded",
            format!(
                "this key has {most} paused sessions, its most (sessions.max_paused_per_key); \
                 nothing was kept, and the session runs on"
            ),
        ));
    }
    fs::rename(tmp, state.paused.snap_path(&record.id))
        .map_err(|e| Error::internal(format!("keeping a snapshot: {e}")))?;
    temporary.keep();
    state.paused.save(record)
}

/// Writes `entry`'s state to a snapshot bound to `binding` at `path` (which must not exist).
fn take(
    state: &AppState,
    owner: &str,
    entry: &OpenSession,
    path: &Path,
    binding: Binding,
) -> Result<(Sealed, SnapshotInfo), Error> {
    let mut writer = SnapshotWriter::create(path, state.paused.key()?, binding)
        .map_err(|e| Error::internal(format!("{}: {e}", path.display())))?;
    let max = room_for_snapshot(state, owner);
    // Compressed, MACed and written by a thread of its own while the channel is read.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(8);
    let writing = std::thread::Builder::new()
        .name("airlock-snapshot".into())
        .spawn(move || -> std::io::Result<SnapshotWriter> {
            for chunk in rx {
                writer.write(&chunk)?;
            }
            Ok(writer)
        })
        .map_err(|e| Error::internal(format!("a snapshot's writer: {e}")))?;
    let taken = entry.engine_session().snapshot(
        &mut |chunk| {
            tx.send(chunk)
                .map_err(|_| std::io::Error::other("the snapshot's writer stopped"))
        },
        max,
        snapshot_timeout(state),
    );
    drop(tx);
    let written = writing
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the snapshot's writer failed")));
    let (report, _) = match taken {
        Ok(taken) => taken,
        Err(e) => {
            let _ = fs::remove_file(path);
            return Err(snapshot_error(e));
        }
    };
    let sealed = written.and_then(SnapshotWriter::finish).map_err(|e| {
        let _ = fs::remove_file(path);
        Error::internal(format!("{}: {e}", path.display()))
    })?;
    let info = snapshot_info(&sealed, entry.cells(), report);
    Ok((sealed, info))
}

fn snapshot_info(sealed: &Sealed, cells: u64, report: SnapshotReport) -> SnapshotInfo {
    SnapshotInfo {
        taken_at: rfc(SystemTime::now()),
        cells,
        stored_bytes: sealed.stored_bytes,
        state_bytes: sealed.state_bytes,
        variables: report.variables,
        not_kept: report.not_kept,
    }
}

/// Pauses `key`'s live session `id` (blocking): its state to a snapshot, then its sandbox
/// closed. Refused, the session running on, when the state is over what may be kept.
pub(crate) fn pause(state: &SharedState, key: &Key, id: &str) -> Result<SessionInfo, Error> {
    let entry = sessions::find(state, key, id)?;
    pause_entry(state, &entry)
}

/// Pauses the open sessions unused for `idle` (the reaper, with `pause_after_idle_ms`), each
/// on a blocking thread of its own so that none waits for another (nor the reaper for any);
/// one that cannot be paused runs on, and is tried again after another `idle`.
pub(crate) fn pause_idle(state: &SharedState, idle: Duration) {
    for entry in state.sessions.all() {
        if !entry.idle_for(idle) {
            continue;
        }
        // Not idle for the next rounds while this one is under way.
        entry.touch();
        let st = state.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = pause_entry(&st, &entry) {
                tracing::warn!(session = entry.id(), error = %e.message, "an idle session could not be paused");
                entry.touch();
            }
        });
    }
}

fn pause_entry(state: &SharedState, entry: &Arc<OpenSession>) -> Result<SessionInfo, Error> {
    let id = entry.id().to_owned();
    let id = id.as_str();
    let owner = entry.owner().to_owned();
    let claim = state.paused.claim(id)?;
    let busy = entry.claim()?;
    let binding = Binding {
        key_fingerprint: &owner,
        session_id: id,
    };
    let tmp = state.paused.dir.join(format!("{id}.snap.tmp"));
    let _ = fs::remove_file(&tmp);
    let (sealed, info) = take(state, &owner, entry, &tmp, binding)?;
    let mut session_info = entry.info();
    let record = PausedRecord::of_open(entry, id, entry.created_at(), sealed, info.clone());
    keep(state, &tmp, &record)?;
    // Closed meanwhile (a DELETE does not wait for a pause): what was kept goes.
    if entry.is_closed() {
        let _ = state.paused.delete(id);
        return Err(Error::new(Kind::NotFound, "not_found", "no such session"));
    }
    drop(busy);
    sessions::unregister(state, entry, "paused");
    drop(claim);
    tracing::info!(
        session = id,
        stored_bytes = record.sealed.stored_bytes,
        state_bytes = record.sealed.state_bytes,
        not_kept = record.snapshot.not_kept.len(),
        "paused a session"
    );
    session_info.paused = Some(info);
    Ok(session_info)
}

/// Writes an open session's state to its snapshot after a cell (`sessions.checkpoint =
/// "each_cell"`), the cell still holding the session: a server killed later brings it back
/// from here. One that cannot be written (over the quota, say) is logged; the one before
/// stays.
pub(crate) fn checkpoint(state: &SharedState, entry: &Arc<OpenSession>) {
    let id = entry.id().to_owned();
    let owner = entry.owner().to_owned();
    let tmp = state.paused.dir.join(format!("{id}.snap.tmp"));
    let _ = fs::remove_file(&tmp);
    let binding = Binding {
        key_fingerprint: &owner,
        session_id: &id,
    };
    let kept = take(state, &owner, entry, &tmp, binding).and_then(|(sealed, info)| {
        let record = PausedRecord::of_open(entry, &id, entry.created_at(), sealed, info);
        keep(state, &tmp, &record)
    });
    if let Err(e) = kept {
        let _ = fs::remove_file(&tmp);
        tracing::warn!(session = %id, error = %e.message, "a session's checkpoint could not be written; its last one stays");
    }
}

/// Brings `key`'s paused session `id` back in a fresh sandbox (blocking): jailed as a new
/// session opened with the same request, the snapshot checked whole, then read in there.
/// The session is open again under its id; its snapshot is gone.
pub(crate) fn resume(
    state: &SharedState,
    key: &Key,
    id: &str,
) -> Result<(Arc<OpenSession>, SnapshotInfo), Error> {
    let fingerprint = key.fingerprint();
    let claim = state.paused.claim(id)?;
    // Resumed meanwhile by another request (which held the claim): it is open now.
    if let Ok(entry) = sessions::find(state, key, id) {
        drop(claim);
        return Err(already_open(entry));
    }
    let record = state
        .paused
        .record(id, &fingerprint)
        .ok_or_else(|| crate::service::not_here(state, id, "session"))?;
    let binding = Binding {
        key_fingerprint: &fingerprint,
        session_id: id,
    };
    let opening = opening_for(
        state,
        key,
        &record.request,
        record.idle_timeout_ms,
        record.max_lifetime_ms,
        id,
    )?;
    let (entry, report) = bring_back(
        state,
        key,
        opening,
        &state.paused.snap_path(id),
        binding,
        &record.sealed,
    )?;
    let created_at = humantime::parse_rfc3339(&record.created_at).unwrap_or(SystemTime::now());
    let entry = entry.resumed_as(created_at, record.snapshot.cells);
    sessions::register(state, key, entry.clone())?;
    state.paused.remove(id);
    drop(claim);
    let mut info = record.snapshot;
    info.variables = report.variables;
    info.not_kept.extend(report.not_kept);
    tracing::info!(session = id, "resumed a session");
    Ok((entry, info))
}

/// A resume that found the session open: the caller goes on with it.
fn already_open(_entry: Arc<OpenSession>) -> Error {
    Error::new(
        Kind::Conflict,
        "session_busy",
        "the session was resumed by another request meanwhile; send this one again",
    )
}

/// The opening of a session for `record`'s request under `id` (its volumes leased now: a
/// writer the source still is gets 409 before any state is taken).
fn opening_for(
    state: &SharedState,
    key: &Key,
    request: &SessionRequest,
    idle_timeout_ms: u64,
    max_lifetime_ms: u64,
    id: &str,
) -> Result<sessions::Opening, Error> {
    let mut request = request.clone();
    request.idle_timeout_ms = Some(idle_timeout_ms);
    request.max_lifetime_ms = Some(max_lifetime_ms);
    sessions::prepare_open_as(state, key, request, id.to_owned())
}

/// A fresh session from `opening`, with the snapshot at `path` (bound to `binding`, sealed
/// as `sealed`) checked whole, then read into it; not yet registered.
fn bring_back(
    state: &SharedState,
    key: &Key,
    opening: sessions::Opening,
    path: &Path,
    binding: Binding,
    sealed: &Sealed,
) -> Result<(Arc<OpenSession>, SnapshotReport), Error> {
    let mut source =
        open_verified(path, state.paused.key()?, binding, sealed).map_err(|e| match e {
            airlock_engine::snapshot::VerifyError::Forged => Error::new(
                Kind::Unprocessable,
                "snapshot_invalid",
                "the session's snapshot was altered, cut short, or is not this session's: \
                 it is refused, and nothing of it runs",
            ),
            airlock_engine::snapshot::VerifyError::Io(e) => {
                Error::internal(format!("reading a snapshot: {e}"))
            }
        })?;
    let entry = sessions::launch(state, &key.fingerprint(), opening)?;
    match entry
        .engine_session()
        .restore(&mut source, snapshot_timeout(state))
    {
        Ok(report) => Ok((entry, report)),
        Err(e) => {
            entry.destroy();
            Err(snapshot_error(e))
        }
    }
}

/// Removes a file when dropped, unless kept.
struct Temporary(Option<PathBuf>);

impl Temporary {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// A new session of `key`'s with the state of its session `id`, open or paused (blocking);
/// `id` goes on as it was.
pub(crate) fn fork(state: &SharedState, key: &Key, id: &str) -> Result<SessionInfo, Error> {
    let fingerprint = key.fingerprint();
    // The source is the caller's, open or paused, before anything is touched.
    let live = sessions::find(state, key, id).ok();
    if live.is_none() && !state.paused.holds(id, &fingerprint) {
        return Err(crate::service::not_here(state, id, "session"));
    }
    let new_id = state.held_id("se_");
    let claim = state.paused.claim(id)?;
    let (opening, record, path, binding_id, temporary) = match live {
        Some(entry) => {
            let busy = entry.claim()?;
            let now = entry.info();
            let opening = opening_for(
                state,
                key,
                entry.request(),
                now.idle_timeout_ms,
                now.max_lifetime_ms,
                &new_id,
            )?;
            let tmp = state.paused.dir.join(format!("{new_id}.snap.tmp"));
            let temporary = Temporary(Some(tmp.clone()));
            let binding = Binding {
                key_fingerprint: &fingerprint,
                session_id: &new_id,
            };
            let (sealed, info) = take(state, &fingerprint, &entry, &tmp, binding)?;
            drop(busy);
            let record = PausedRecord::of_open(&entry, &new_id, SystemTime::now(), sealed, info);
            (opening, record, tmp, new_id.clone(), Some(temporary))
        }
        None => {
            let record = state
                .paused
                .record(id, &fingerprint)
                .ok_or_else(|| crate::service::not_here(state, id, "session"))?;
            let opening = opening_for(
                state,
                key,
                &record.request,
                record.idle_timeout_ms,
                record.max_lifetime_ms,
                &new_id,
            )?;
            (
                opening,
                record,
                state.paused.snap_path(id),
                id.to_owned(),
                None,
            )
        }
    };
    let binding = Binding {
        key_fingerprint: &fingerprint,
        session_id: &binding_id,
    };
    let brought = bring_back(state, key, opening, &path, binding, &record.sealed);
    drop(temporary);
    drop(claim);
    let (entry, report) = brought?;
    let entry = entry.resumed_as(SystemTime::now(), record.snapshot.cells);
    sessions::register(state, key, entry.clone())?;
    let mut info = entry.info();
    let mut snapshot = record.snapshot;
    snapshot.variables = report.variables;
    snapshot.not_kept.extend(report.not_kept);
    info.resumed = Some(snapshot);
    tracing::info!(session = %new_id, from = id, "forked a session");
    Ok(info)
}

impl PausedRecord {
    /// The record of open session `entry`'s state, sealed as `sealed`, kept as session `id`
    /// (its own, or a fork's) first opened at `created_at`.
    fn of_open(
        entry: &OpenSession,
        id: &str,
        created_at: SystemTime,
        sealed: Sealed,
        snapshot: SnapshotInfo,
    ) -> PausedRecord {
        let now = entry.info();
        PausedRecord {
            id: id.to_owned(),
            key_fingerprint: entry.owner().to_owned(),
            created_at: rfc(created_at),
            idle_timeout_ms: now.idle_timeout_ms,
            max_lifetime_ms: now.max_lifetime_ms,
            request: entry.request().clone(),
            limits: now.limits,
            sealed,
            snapshot,
        }
    }

    /// The session as `GET /v1/sessions/{id}` shows it while paused.
    pub(crate) fn info(&self, retention: Duration) -> SessionInfo {
        paused_info(self, retention)
    }
}

/// A paused session as `GET /v1/sessions/{id}` shows it: it is kept until `retention` after
/// its snapshot was taken.
fn paused_info(record: &PausedRecord, retention: Duration) -> SessionInfo {
    let expires = humantime::parse_rfc3339(&record.snapshot.taken_at)
        .map(|t| rfc(t + retention))
        .unwrap_or_default();
    SessionInfo {
        id: record.id.clone(),
        created_at: record.created_at.clone(),
        expires_at: expires,
        idle_timeout_ms: record.idle_timeout_ms,
        max_lifetime_ms: record.max_lifetime_ms,
        cells: record.snapshot.cells,
        ended: None,
        limits: record.limits.clone(),
        egress_between_cells: None,
        paused: Some(record.snapshot.clone()),
        resumed: None,
    }
}

/// `POST /v1/sessions/{id}/pause`.
pub(crate) async fn pause_session(
    state: &SharedState,
    key: &Arc<Key>,
    id: String,
) -> Result<SessionInfo, Error> {
    blocking(state, key, id, "pausing a session", pause).await
}

/// `POST /v1/sessions/{id}/resume`: a paused session brought back (one already open is
/// answered as it is).
pub(crate) async fn resume_session(
    state: &SharedState,
    key: &Arc<Key>,
    id: String,
) -> Result<SessionInfo, Error> {
    crate::service::execution::refuse_if_unavailable(state)?;
    let (entry, resumed) = find_or_resume(state, key, &id).await?;
    let mut info = sessions::info(state, key, entry.id())?;
    info.resumed = resumed;
    Ok(info)
}

/// `POST /v1/sessions/{id}/fork`.
pub(crate) async fn fork_session(
    state: &SharedState,
    key: &Arc<Key>,
    id: String,
) -> Result<SessionInfo, Error> {
    blocking(state, key, id, "forking a session", fork).await
}

/// `f` for `key`'s session `id` on a blocking thread, unless the server refuses work now.
async fn blocking(
    state: &SharedState,
    key: &Arc<Key>,
    id: String,
    what: &'static str,
    f: fn(&SharedState, &Key, &str) -> Result<SessionInfo, Error>,
) -> Result<SessionInfo, Error> {
    crate::service::execution::refuse_if_unavailable(state)?;
    let (st, key) = (state.clone(), key.clone());
    tokio::task::spawn_blocking(move || f(&st, &key, &id))
        .await
        .map_err(|e| Error::internal(format!("{what}: {e}")))?
}

/// The caller's session `id`, brought back first if it is paused (what came back, then). A
/// request that finds another bringing it back waits for it.
pub(crate) async fn find_or_resume(
    state: &SharedState,
    key: &Arc<Key>,
    id: &str,
) -> Result<(Arc<OpenSession>, Option<airlock_api::SnapshotInfo>), Error> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let missing = match sessions::find(state, key, id) {
            Ok(entry) => return Ok((entry, None)),
            Err(e) => e,
        };
        if !state.paused.holds(id, &key.fingerprint()) {
            return Err(missing);
        }
        let (st, k, i) = (state.clone(), key.clone(), id.to_owned());
        let resumed = tokio::task::spawn_blocking(move || resume(&st, &k, &i))
            .await
            .map_err(|e| Error::internal(format!("resuming a session: {e}")))?;
        match resumed {
            Ok((entry, info)) => return Ok((entry, Some(info))),
            Err(e) if e.code == "session_busy" && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Brings `key`'s session `id` back if it is paused (for the routes that then use it).
pub(crate) async fn bring_back_if_paused(
    state: &SharedState,
    key: &Arc<Key>,
    id: &str,
) -> Result<(), Error> {
    find_or_resume(state, key, id).await.map(drop)
}

/// Runs the reaper until shutdown.
pub async fn reaper(state: SharedState) {
    let mut shutdown = state.shutdown_signal();
    loop {
        tokio::select! {
            () = tokio::time::sleep(sessions::REAP_EVERY) => {}
            _ = shutdown.changed() => return,
        }
        if let Some(after) = state.config.sessions.pause_after_idle_ms {
            pause_idle(&state, Duration::from_millis(after));
        }
        let st = state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let retention = Duration::from_millis(st.config.sessions.paused_retention_ms);
            for (id, owner) in st.paused.expire(retention) {
                sessions::audit_session(&st, &id, &owner, Some("expired"));
            }
        })
        .await;
        let st = state.clone();
        if let Ok(reaped) = tokio::task::spawn_blocking(move || st.sessions.reap()).await {
            for r in reaped {
                state.paused.forget(&r.id);
                sessions::audit_session(&state, &r.id, &r.key_fingerprint, Some(r.why));
            }
        }
    }
}
