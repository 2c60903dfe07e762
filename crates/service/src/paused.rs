//! The snapshot directory (`sessions.snapshot_dir`): paused sessions' records and snapshots
//! on disk, the index of them in memory, the claims that let one request at a time touch a
//! session's files (in this process, and through `flock` in replicas sharing the directory),
//! and tombstones; what they keep of their keys' storage, counted there
//! (`airlock_engine::storage`, which also holds the bytes of snapshots being written). What
//! is done with them (pause, resume, fork, checkpoints, the reaper) is `snapshots.rs`'s.
//!
//! A session `<id>` has at most: its record `<id>.json` (the key's fingerprint, what the
//! session was opened with, the MAC, what it holds, and the name of its snapshot); its
//! snapshot `<id>.<16 hex digits>.snap`, a new name at each keep, so that a record and the
//! snapshot it names change together, by the record's rename (records written before
//! snapshots had a name of their own name `<id>.snap`); `<id>.lock` while it is claimed;
//! files being written (`.tmp`); and `<id>.deleted`, its tombstone, once deleted. A kill at
//! any point leaves a record and the snapshot it names, or neither; what else it leaves is
//! removed at the next start ([`Paused::tidy`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use airlock_api::{SessionInfo, SessionRequest, SnapshotInfo};
use airlock_engine::durable::{open_lock_file, write_aside, Place};
use airlock_engine::snapshot::{Sealed, SnapshotKey};
use airlock_engine::storage::{Kept, Whose};

use crate::config::SessionsConfig;
use crate::error::{Error, Kind};

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
    /// The file of its snapshot in the directory; records written before each keep had a
    /// name of its own have none, and name `<id>.snap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_file: Option<String>,
}

impl PausedRecord {
    /// The name of its snapshot's file, if it is one of its own session's.
    fn snapshot_name(&self) -> Option<String> {
        let name = self
            .snapshot_file
            .clone()
            .unwrap_or_else(|| format!("{}.snap", self.id));
        is_snapshot_of(&name, &self.id).then_some(name)
    }

    /// When its snapshot was taken: its retention counts from there.
    fn taken(&self) -> SystemTime {
        humantime::parse_rfc3339(&self.snapshot.taken_at).unwrap_or_else(|_| SystemTime::now())
    }

    /// The session as `GET /v1/sessions/{id}` shows it while paused: it is kept until
    /// `retention` after its snapshot was taken.
    pub fn info(&self, retention: Duration) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            created_at: self.created_at.clone(),
            expires_at: rfc(self.taken() + retention),
            idle_timeout_ms: self.idle_timeout_ms,
            max_lifetime_ms: self.max_lifetime_ms,
            cells: self.snapshot.cells,
            ended: None,
            limits: self.limits.clone(),
            egress_between_cells: None,
            paused: Some(self.snapshot.clone()),
            resumed: None,
        }
    }
}

/// Whether `name` is a snapshot file of session `id`: `<id>.snap`, or `<id>.<16 hex>.snap`.
fn is_snapshot_of(name: &str, id: &str) -> bool {
    let Some(rest) = name
        .strip_prefix(id)
        .and_then(|r| r.strip_prefix('.'))
        .and_then(|r| r.strip_suffix("snap"))
    else {
        return false;
    };
    rest.is_empty()
        || rest.strip_suffix('.').is_some_and(|hex| {
            hex.len() == 16
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
}

/// Whether `id` may name files of the snapshot directory (the server's ids always may).
pub fn valid_id(id: &str) -> bool {
    id.starts_with("se_")
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub fn rfc(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The paused sessions of a snapshot directory.
pub struct Paused {
    dir: PathBuf,
    key: Result<SnapshotKey, String>,
    /// How long a paused session is kept after its snapshot was taken.
    retention: Duration,
    /// How long a claim may wait for another (a snapshot being finished).
    claim_wait: Duration,
    /// How long a tombstone can matter ([`Paused::tombstone_life`]).
    tombstone_life: Duration,
    /// Id to what the index keeps of each: its key, its bytes on disk (snapshot and
    /// record), its snapshot's file, and the session as a listing shows it (without the
    /// names of its variables).
    index: Mutex<HashMap<String, Indexed>>,
    /// Ids claimed by this process, and the wake-up of claims waiting for one.
    claimed: Mutex<HashSet<String>>,
    given_back: Condvar,
    /// Held while a record is made a session's: a key's count of paused sessions is checked
    /// and the record written in one step.
    keeping: Mutex<()>,
    /// The tombstones this process knows of, oldest first: when each was made, and whose.
    tombstones: Mutex<VecDeque<(SystemTime, String)>>,
}

impl std::fmt::Debug for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paused").field("dir", &self.dir).finish()
    }
}

/// What tidying at start does to one session's files ([`Paused::tidying`]).
struct Tidying {
    /// Files to remove: left by a stop mid-way, or a deleted session's.
    leftovers: Vec<String>,
    /// Whether a lock file is there (removed by the claim, if nobody holds it).
    locked: bool,
    /// When its tombstone was made, if it has one, and whether that can no longer matter.
    made: Option<SystemTime>,
    spent: bool,
}

/// A paused session as the index holds it.
#[derive(Clone, Debug)]
struct Indexed {
    owner: String,
    bytes: u64,
    snapshot: String,
    taken: SystemTime,
    listed: SessionInfo,
}

impl Indexed {
    /// `record`'s entry, if its snapshot's name is its own.
    fn of(record: &PausedRecord, record_bytes: u64) -> Option<Indexed> {
        let mut listed = record.info(Duration::ZERO);
        if let Some(p) = listed.paused.as_mut() {
            p.variables = Vec::new();
            p.not_kept = Default::default();
        }
        Some(Indexed {
            owner: record.key_fingerprint.clone(),
            bytes: record.sealed.stored_bytes + record_bytes,
            snapshot: record.snapshot_name()?,
            taken: record.taken(),
            listed,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn not_found() -> Error {
    Error::new(Kind::NotFound, "not_found", "no such session")
}

fn busy() -> Error {
    Error::new(
        Kind::Conflict,
        "session_busy",
        "the session is being paused, resumed or forked by another request",
    )
}

impl Paused {
    /// The paused sessions in `dir` (made if missing, private), and the key of their MACs
    /// (`dir/.key`); nothing is removed (the server tidies at start: [`Paused::tidy`]). Where
    /// the directory or the key cannot be had, pausing is unavailable and says why.
    pub fn open(dir: &Path, config: &SessionsConfig) -> Paused {
        let made = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("{}: {e}", dir.display()));
        let key = made.and_then(|()| {
            SnapshotKey::load_or_create(&dir.join(".key"))
                .map_err(|e| format!("{}: {e}", dir.join(".key").display()))
        });
        let paused = Paused {
            dir: dir.to_path_buf(),
            key,
            retention: Duration::from_millis(config.paused_retention_ms),
            claim_wait: Duration::from_millis(config.snapshot_timeout_ms),
            tombstone_life: Self::tombstone_life(config),
            index: Mutex::new(HashMap::new()),
            claimed: Mutex::new(HashSet::new()),
            given_back: Condvar::new(),
            keeping: Mutex::new(()),
            tombstones: Mutex::new(VecDeque::new()),
        };
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if paused.deleted(id) {
                continue;
            }
            if paused.load(id).is_none() {
                tracing::warn!(path = %entry.path().display(), "a paused session's record cannot be read; left as it is");
            }
        }
        paused
    }

    /// How long a tombstone can matter: while a session open when it was deleted could
    /// still be kept (a replica sharing the directory holds it open at most
    /// `max_lifetime_ms`, and its last snapshot takes at most `snapshot_timeout_ms`), and
    /// while a copy of its record, written before the deletion, would still be within its
    /// retention (`paused_retention_ms` from its snapshot; past it, a record is never taken).
    fn tombstone_life(config: &SessionsConfig) -> Duration {
        Duration::from_millis(
            config
                .paused_retention_ms
                .max(config.max_lifetime_ms + config.snapshot_timeout_ms),
        )
    }

    /// Reads `id`'s record into the index; the record and whether it is past its retention.
    fn load(&self, id: &str) -> Option<(PausedRecord, bool)> {
        if !valid_id(id) {
            return None;
        }
        let bytes = fs::read(self.record_path(id)).ok()?;
        let record: PausedRecord = serde_json::from_slice(&bytes).ok()?;
        if record.id != id {
            return None;
        }
        let indexed = Indexed::of(&record, bytes.len() as u64)?;
        let expired = self.past_retention(indexed.taken);
        lock(&self.index).insert(record.id.clone(), indexed);
        Some((record, expired))
    }

    fn past_retention(&self, taken: SystemTime) -> bool {
        SystemTime::now()
            .duration_since(taken)
            .is_ok_and(|age| age > self.retention)
    }

    /// Removes what a process killed mid-way left (at start, before anything is served):
    /// files being written, snapshots no record names (a keep cut short before its record's
    /// rename), and locks nobody holds; for each tombstone, its session's files (copied
    /// back), and the tombstone itself once it can no longer matter. Each session's files
    /// are touched under its claim, so nothing a replica sharing the directory is writing.
    pub fn tidy(&self) {
        let mut by_id: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for entry in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some((id, _)) = name.split_once('.') {
                if valid_id(id) {
                    by_id.entry(id.to_owned()).or_default().push(name);
                }
            }
        }
        let mut tombstones = Vec::new();
        let now = SystemTime::now();
        for (id, names) in by_id {
            // Looked at once without the claim, to leave alone (unclaimed) what needs
            // nothing, then again under it: another replica may have changed it meanwhile.
            let Some(tidying) = self.tidying(&id, &names, now) else {
                continue;
            };
            let tidying = if tidying.leftovers.is_empty() && !tidying.spent && !tidying.locked {
                tidying
            } else {
                // Claimed elsewhere: in use, left as it is. The claim's lock goes with it.
                let Ok(_claim) = self.claim(&id) else {
                    continue;
                };
                if self.deleted(&id) || self.load(&id).is_none() {
                    self.index().remove(&id);
                }
                let Some(tidying) = self.tidying(&id, &names, now) else {
                    continue;
                };
                for name in &tidying.leftovers {
                    tracing::info!(file = %name, "removed at start: left by a stop mid-way, or a deleted session's");
                    let _ = fs::remove_file(self.dir.join(name));
                }
                if tidying.spent {
                    let _ = fs::remove_file(self.dir.join(format!("{id}.deleted")));
                }
                tidying
            };
            if !tidying.spent {
                tombstones.extend(tidying.made.map(|t| (t, id)));
            }
        }
        tombstones.sort();
        *lock(&self.tombstones) = tombstones.into();
    }

    /// What [`Paused::tidy`] would do to session `id`'s files `names`, as they are now; none
    /// when its record cannot be read (it is left as it is, with its snapshot).
    fn tidying(&self, id: &str, names: &[String], now: SystemTime) -> Option<Tidying> {
        let tombstone = format!("{id}.deleted");
        let record = format!("{id}.json");
        let made = self.dir.join(&tombstone).exists().then(|| {
            fs::metadata(self.dir.join(&tombstone))
                .and_then(|m| m.modified())
                .unwrap_or(now)
        });
        let named = match self.index().get(id) {
            _ if made.is_some() => None,
            Some(e) => Some(e.snapshot.clone()),
            None if self.dir.join(&record).exists() => return None,
            None => None,
        };
        let leftovers = names
            .iter()
            .filter(|name| {
                **name != tombstone
                    && !name.ends_with(".lock")
                    && named
                        .as_ref()
                        .is_none_or(|named| **name != record && *name != named)
            })
            .cloned()
            .collect();
        Some(Tidying {
            leftovers,
            locked: names.iter().any(|name| name.ends_with(".lock")),
            spent: made
                .is_some_and(|t| now.duration_since(t).unwrap_or_default() > self.tombstone_life),
            made,
        })
    }

    pub fn key(&self) -> Result<&SnapshotKey, Error> {
        self.key.as_ref().map_err(|why| {
            Error::new(
                Kind::Unprocessable,
                "snapshots_unavailable",
                format!("sessions cannot be paused here: {why}"),
            )
        })
    }

    fn index(&self) -> MutexGuard<'_, HashMap<String, Indexed>> {
        lock(&self.index)
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The path of `record`'s snapshot, if its name is one of its session's.
    pub fn snapshot_path(&self, record: &PausedRecord) -> Result<PathBuf, Error> {
        record
            .snapshot_name()
            .map(|name| self.dir.join(name))
            .ok_or_else(not_found)
    }

    /// A new snapshot file for session `id` (its name, its path); no record names it yet.
    pub fn new_snapshot(&self, id: &str) -> (String, PathBuf) {
        let mut random = [0u8; 8];
        let _ = getrandom::fill(&mut random);
        let name = format!("{id}.{:016x}.snap", u64::from_le_bytes(random));
        let path = self.dir.join(&name);
        (name, path)
    }

    /// Where a fork writes the snapshot of the session it is made from, for `new_id`.
    pub fn fork_path(&self, new_id: &str) -> PathBuf {
        self.dir.join(format!("{new_id}.snap.tmp"))
    }

    /// Whether `id` is a paused session of the key with `fingerprint`, within its
    /// retention. One paused by another replica sharing the directory since this one started
    /// is taken into the index from its record.
    pub fn holds(&self, id: &str, fingerprint: &str) -> bool {
        if let Some(e) = self.index().get(id) {
            return e.owner == fingerprint && !self.past_retention(e.taken);
        }
        if !valid_id(id) || self.deleted(id) {
            return false;
        }
        self.load(id)
            .is_some_and(|(r, expired)| r.key_fingerprint == fingerprint && !expired)
    }

    /// How many sessions are paused, all keys together.
    pub fn count(&self) -> usize {
        self.index().len()
    }

    /// The bytes on disk of paused session `id` and its snapshot's name, if there is one.
    pub fn kept(&self, id: &str) -> Option<(u64, String)> {
        self.index().get(id).map(|e| (e.bytes, e.snapshot.clone()))
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

    /// The record of paused session `id`, if it is the key's and within its retention.
    pub fn record(&self, id: &str, fingerprint: &str) -> Option<PausedRecord> {
        if !valid_id(id) || !self.holds(id, fingerprint) || self.deleted(id) {
            return None;
        }
        match self.load(id) {
            Some((record, false)) if record.key_fingerprint == fingerprint => Some(record),
            Some(_) => None,
            None => {
                // Resumed or deleted by another replica sharing the directory.
                self.index().remove(id);
                None
            }
        }
    }

    /// The key's paused sessions as a listing shows them (from memory: the names of their
    /// variables are for `GET /v1/sessions/{id}`), each kept until the retention after it was
    /// paused.
    pub fn listed_of(&self, fingerprint: &str) -> Vec<SessionInfo> {
        self.index()
            .values()
            .filter(|e| e.owner == fingerprint)
            .map(|e| {
                let mut info = e.listed.clone();
                info.expires_at = rfc(e.taken + self.retention);
                info
            })
            .collect()
    }

    /// Claims `id` for one request in this process, and, with an exclusive `flock` on
    /// `<id>.lock`, against other replicas sharing the directory; 409 if it is claimed.
    pub fn claim(&self, id: &str) -> Result<Claim<'_>, Error> {
        self.claim_within(id, Duration::ZERO)
    }

    /// As [`Paused::claim`], waiting up to `within` for a claim held now to be given back.
    pub fn claim_within(&self, id: &str, within: Duration) -> Result<Claim<'_>, Error> {
        // Never a path of the caller's making.
        if !valid_id(id) {
            return Err(not_found());
        }
        let deadline = Instant::now() + within;
        {
            let mut claimed = lock(&self.claimed);
            while claimed.contains(id) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(busy());
                }
                claimed = self
                    .given_back
                    .wait_timeout(claimed, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            claimed.insert(id.to_owned());
        }
        let mut claim = Claim {
            paused: self,
            id: id.to_owned(),
            lock: None,
            path: self.dir.join(format!("{id}.lock")),
        };
        loop {
            let file = open_lock_file(&claim.path)
                .map_err(|e| Error::internal(format!("{}: {e}", claim.path.display())))?;
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(held) => {
                    // Its holder before removes the file before it lets go: a lock on a file
                    // no longer at the path is no one's, and another may hold the new one.
                    let same = match (held.metadata(), fs::symlink_metadata(&claim.path)) {
                        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                        _ => false,
                    };
                    if same {
                        claim.lock = Some(held);
                        return Ok(claim);
                    }
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => return Err(busy()),
            }
        }
    }

    /// Makes `record` the session's, in one step: written aside, synced and renamed over
    /// the one before; then the snapshot the one before named, if another, is removed.
    /// Refused when the key has `most` paused sessions and this is not one of them. Under the
    /// session's claim, with the bytes of its snapshot and record held in the key's storage
    /// (the caller's). Its record's bytes.
    pub fn commit(&self, record: &PausedRecord, most: usize) -> Result<u64, Error> {
        let _one_at_a_time = lock(&self.keeping);
        if self.kept(&record.id).is_none() && self.count_of(&record.key_fingerprint) >= most {
            return Err(Error::new(
                Kind::TooLarge,
                "quota_exceeded",
                format!(
                    "this key has {most} paused sessions, its most (sessions.max_paused_per_key); \
                     nothing was kept, and the session runs on"
                ),
            ));
        }
        let path = self.record_path(&record.id);
        let before = self.named_on_disk(&record.id);
        let bytes = serde_json::to_vec(record)
            .map_err(|e| Error::internal(format!("a paused session's record: {e}")))?;
        write_aside(&path, &bytes, Place::Replace)
            .map_err(|e| Error::internal(format!("writing {}: {e}", path.display())))?;
        let record_bytes = bytes.len() as u64;
        let indexed = Indexed::of(record, record_bytes)
            .ok_or_else(|| Error::internal("a snapshot without a name of its session's"))?;
        let named = indexed.snapshot.clone();
        self.index().insert(record.id.clone(), indexed);
        for before in before.into_iter().filter(|before| *before != named) {
            let _ = fs::remove_file(self.dir.join(before));
        }
        Ok(record_bytes)
    }

    /// Deletes session `id`'s files for good, under its claim (the caller's): a tombstone
    /// (`<id>.deleted`) first, so that its record and snapshot, copied back, are never taken
    /// again while that could matter; then both.
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
        lock(&self.tombstones).push_back((SystemTime::now(), id.to_owned()));
        self.remove(id);
        Ok(())
    }

    pub fn deleted(&self, id: &str) -> bool {
        self.dir.join(format!("{id}.deleted")).exists()
    }

    /// Deletes session `id`'s snapshot for good if it has one (a session closed for good,
    /// or ended: its checkpoint). Whatever holds its claim (a checkpoint being finished)
    /// goes first; one that never lets go leaves the tombstone, which no keep passes.
    pub fn forget(&self, id: &str) {
        if !valid_id(id) {
            return;
        }
        match self.claim_within(id, self.claim_wait) {
            Ok(_claim) => {
                if self.index().contains_key(id) || self.record_path(id).exists() {
                    let _ = self.delete(id);
                }
            }
            Err(_) => {
                tracing::warn!(session = id, "a closed session's snapshot is held by another request; its tombstone is left, and its files go at the next start");
                let _ = fs::write(self.dir.join(format!("{id}.deleted")), b"");
                lock(&self.tombstones).push_back((SystemTime::now(), id.to_owned()));
                self.index().remove(id);
            }
        }
    }

    /// Deletes the key's paused session `id` for good (blocking), holding it meanwhile.
    pub fn delete_owned(&self, id: &str, fingerprint: &str) -> Result<(), Error> {
        let _claim = self.claim(id)?;
        if !self.holds(id, fingerprint) {
            return Err(not_found());
        }
        self.delete(id)
    }

    /// Forgets paused session `id`, under its claim (the caller's): its record, then the
    /// snapshot it named.
    pub fn remove(&self, id: &str) {
        if !valid_id(id) {
            return;
        }
        let named = self.named_on_disk(id);
        self.index().remove(id);
        let _ = fs::remove_file(self.record_path(id));
        for name in named {
            let _ = fs::remove_file(self.dir.join(name));
        }
    }

    /// The snapshots session `id`'s record on disk and its entry in the index name.
    fn named_on_disk(&self, id: &str) -> Vec<String> {
        let on_disk = fs::read(self.record_path(id))
            .ok()
            .and_then(|b| serde_json::from_slice::<PausedRecord>(&b).ok())
            .filter(|r| r.id == id)
            .and_then(|r| r.snapshot_name());
        let indexed = self.index().get(id).map(|e| e.snapshot.clone());
        let mut named: Vec<String> = on_disk.into_iter().chain(indexed).collect();
        named.dedup();
        named
    }

    /// Paused sessions kept longer than their retention, from when their snapshot was
    /// taken: removed (without a tombstone: a copy of their record is past its retention
    /// too, and never taken); their ids and keys.
    pub fn expire(&self) -> Vec<(String, String)> {
        let due: Vec<(String, String)> = self
            .index()
            .iter()
            .filter(|(_, e)| self.past_retention(e.taken))
            .map(|(id, e)| (id.clone(), e.owner.clone()))
            .collect();
        let mut gone = Vec::new();
        for (id, owner) in due {
            if let Ok(_claim) = self.claim(&id) {
                self.remove(&id);
                gone.push((id, owner));
            }
        }
        gone
    }

    /// Removes the tombstones that can no longer matter ([`Paused::tombstone_life`]), with
    /// whatever of their sessions was copied back meanwhile.
    pub fn sweep_tombstones(&self) {
        let now = SystemTime::now();
        loop {
            let (made, id) = {
                let mut tombstones = lock(&self.tombstones);
                match tombstones.front() {
                    Some((made, _))
                        if now.duration_since(*made).unwrap_or_default() > self.tombstone_life => {}
                    _ => return,
                }
                match tombstones.pop_front() {
                    Some(t) => t,
                    None => return,
                }
            };
            match self.claim(&id) {
                Ok(_claim) => {
                    self.remove(&id);
                    let _ = fs::remove_file(self.dir.join(format!("{id}.deleted")));
                }
                // In use now (it can hardly be): tried again at the next sweep.
                Err(_) => {
                    lock(&self.tombstones).push_back((made, id));
                    return;
                }
            }
        }
    }
}

/// The bytes on disk of a key's paused sessions (snapshots and records), from the index.
impl Kept for Paused {
    fn kept(&self, whose: Whose<'_>) -> u64 {
        match whose {
            Whose::Key(fingerprint) => self
                .index()
                .values()
                .filter(|e| e.owner == fingerprint)
                .map(|e| e.bytes)
                .sum(),
            Whose::Operator => 0,
        }
    }
}

/// The paused sessions of a snapshot directory as a process beside the server counts them
/// (`airlock volume create`): read from the disk at each count, since the server pauses,
/// resumes and deletes meanwhile.
#[derive(Debug)]
pub struct OnDisk {
    pub dir: PathBuf,
    pub config: SessionsConfig,
}

impl Kept for OnDisk {
    fn kept(&self, whose: Whose<'_>) -> u64 {
        Kept::kept(&Paused::open(&self.dir, &self.config), whose)
    }
}

/// A claim on one session id ([`Paused::claim`]).
#[derive(Debug)]
pub struct Claim<'a> {
    paused: &'a Paused,
    id: String,
    lock: Option<nix::fcntl::Flock<fs::File>>,
    /// The lock's file: removed while still locked, so none is left behind.
    path: PathBuf,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.lock.is_some() {
            let _ = fs::remove_file(&self.path);
        }
        drop(self.lock.take());
        lock(&self.paused.claimed).remove(&self.id);
        self.paused.given_back.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("airlock-paused-test-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_record_names_only_a_snapshot_of_its_own_session() {
        let id = "se_abc";
        for good in ["se_abc.snap", "se_abc.0123456789abcdef.snap"] {
            assert!(is_snapshot_of(good, id), "{good}");
        }
        for bad in [
            "se_abcd.snap",
            "se_ab.snap",
            "se_abc.0123456789ABCDEF.snap",
            "se_abc.0123456789abcde.snap",
            "se_abc.../x.snap",
            "../se_abc.snap",
            "se_abc.0123456789abcdef.snap.tmp",
            "se_abc.json",
            "se_abc..snap",
        ] {
            assert!(!is_snapshot_of(bad, id), "{bad}");
        }
    }

    #[test]
    fn a_claim_waits_for_the_one_before_and_leaves_no_lock() {
        let d = dir("claims");
        let paused = Paused::open(&d, &SessionsConfig::default());
        let first = paused.claim("se_one").unwrap();
        assert!(d.join("se_one.lock").exists());
        assert_eq!(paused.claim("se_one").err().unwrap().code, "session_busy");
        std::thread::scope(|s| {
            let waiting = s.spawn(|| {
                paused
                    .claim_within("se_one", Duration::from_secs(10))
                    .map(drop)
            });
            std::thread::sleep(Duration::from_millis(50));
            drop(first);
            waiting.join().unwrap().unwrap();
        });
        assert!(!d.join("se_one.lock").exists());
        // A lock file left by a process killed while it held it is no one's.
        fs::write(d.join("se_two.lock"), b"").unwrap();
        drop(paused.claim("se_two").unwrap());
        assert!(!d.join("se_two.lock").exists());
        assert_eq!(paused.claim("../x").err().unwrap().code, "not_found");
        fs::remove_dir_all(&d).unwrap();
    }
}
