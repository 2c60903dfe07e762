//! Paused sessions: a session's state written to a snapshot by its own sandbox, its sandbox
//! freed, and brought back in a fresh sandbox by its next request, or forked into a new
//! session. The snapshot is made and read only inside sandboxes of the session's key; to
//! the server it is opaque bytes, compressed and bound to the session and key by a MAC
//! (`airlock_engine::snapshot`). Paused sessions live on disk, in `sessions.snapshot_dir`
//! (`paused.rs`: each session's record and the snapshot it names, claims, tombstones), so a
//! restart, graceful or not, finds them. Each snapshot's bytes are held against its key's
//! storage before they are written (a `storage::Reservation`), and a snapshot becomes the session's
//! in one step, its record's rename ([`keep`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use airlock_api::{SessionInfo, SessionRequest, SnapshotInfo};
use airlock_engine::snapshot::{open_verified, Binding, Sealed, SnapshotWriter};
use airlock_engine::storage::{Account, Refused, Reservation};
use airlock_engine::{SessionError, SnapshotError, SnapshotReport};

use crate::error::{Error, Kind};
use crate::keys::Key;
use crate::open_sessions::OpenSession;
use crate::paused::{rfc, PausedRecord};
use crate::services::{Services, SharedServices};
use crate::sessions;

/// How long a snapshot or a restore may take (`sessions.snapshot_timeout_ms`).
fn snapshot_timeout(state: &Services) -> Duration {
    Duration::from_millis(state.config.sessions.snapshot_timeout_ms)
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
/// what its storage has left beside its volumes and its other paused sessions (the snapshots
/// being written share that room by their reservations).
fn room_for_snapshot(state: &Services, owner: &str) -> u64 {
    state
        .config
        .sessions
        .max_snapshot_bytes
        .min(state.storage.room(owner, Account::Stored))
}

/// Room a record takes beside its snapshot, held before either is written.
const RECORD_ROOM: u64 = 1 << 20;

fn over_quota(refused: Refused) -> Error {
    let Refused {
        used,
        needed,
        quota,
    } = refused;
    Error::new(
        Kind::TooLarge,
        "quota_exceeded",
        format!(
            "this key's storage (its volumes, its paused sessions and the snapshots being \
             written) holds {used} bytes; this snapshot's {needed} more would pass its quota \
             of {quota} (volumes.max_bytes_per_key); nothing was kept, and the session runs on"
        ),
    )
}

/// A snapshot file being written, or written and not yet kept, and the bytes held for it.
/// Dropped, the file is removed first, then the bytes are given back (fields drop in order).
struct Written<'a> {
    file: Temporary,
    reservation: Reservation<'a>,
}

/// Makes the snapshot `written` the session's, as `record` (which names it): the record's
/// rename is the switch, then the snapshot before is removed. Refused, and the snapshot
/// removed, when the session is no longer `wanted` (closed meanwhile) or was deleted, when
/// the key's storage has no room for it beside everything it holds (the snapshot it
/// replaces too, until that is removed), or when the key has its most paused sessions.
/// Under the session's claim (the caller's), its bytes held until its record counts them.
fn keep(
    state: &Services,
    mut written: Written,
    record: &PausedRecord,
    wanted: &dyn Fn() -> bool,
) -> Result<(), Error> {
    let paused = &state.paused;
    let id = &record.id;
    if !wanted() || paused.deleted(id) {
        return Err(Error::new(Kind::NotFound, "not_found", "no such session"));
    }
    written
        .reservation
        .hold(record.sealed.stored_bytes + RECORD_ROOM)
        .map_err(over_quota)?;
    paused.commit(record, state.config.sessions.max_paused_per_key)?;
    // Counted in the index now: the file stays, what was held goes back.
    written.file.keep();
    Ok(())
}

/// Writes `entry`'s state to a snapshot bound to `binding` at `path` (which must not
/// exist), its bytes held against the key's storage before they are written; what it
/// holds, and the file with the bytes held for it. Refused for want of room while other
/// snapshots of the key's were being written (pauses at once, say, that do not all fit),
/// it is taken again in its turn (`Reservation::wait_for_turn`: those that began first go
/// first), so that of those, the ones that fit are kept, and only the others refused.
fn take<'a>(
    state: &'a Services,
    owner: &str,
    entry: &OpenSession,
    path: &Path,
    binding: Binding,
) -> Result<(Sealed, SnapshotInfo, Written<'a>), Error> {
    // Each turn waited for is another's try, which its own timeout bounds: this is only a
    // bound should those never end.
    let until = std::time::Instant::now() + 4 * snapshot_timeout(state);
    let mut reservation = state.storage.reservation(owner, Account::Stored);
    loop {
        match take_once(state, entry, path, binding, &mut reservation) {
            Ok((sealed, info, file)) => return Ok((sealed, info, Written { file, reservation })),
            Err(Failed::NoRoom(error)) => {
                reservation.give_back();
                if !reservation.wait_for_turn(until) {
                    return Err(error);
                }
            }
            Err(Failed::Other(error)) => return Err(error),
        }
    }
}

/// Why one try of [`take`] failed.
enum Failed {
    /// The key's storage had no room for the snapshot (its file removed already).
    NoRoom(Error),
    Other(Error),
}

/// One try of [`take`], with what `reservation` holds.
fn take_once(
    state: &Services,
    entry: &OpenSession,
    path: &Path,
    binding: Binding,
    reservation: &mut Reservation,
) -> Result<(Sealed, SnapshotInfo, Temporary), Failed> {
    reservation
        .hold(RECORD_ROOM)
        .map_err(|r| Failed::NoRoom(over_quota(r)))?;
    let mut writer =
        SnapshotWriter::create(path, state.paused.key().map_err(Failed::Other)?, binding)
            .map_err(|e| Failed::Other(Error::internal(format!("{}: {e}", path.display()))))?;
    let mut file = Temporary(Some(path.to_path_buf()));
    let max = room_for_snapshot(state, reservation.owner());
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
        .map_err(|e| Failed::Other(Error::internal(format!("a snapshot's writer: {e}"))))?;
    // The state's bytes bound what is written (compressed, at most a few bytes more per
    // block, within the record's room).
    let mut received = 0u64;
    let mut refused = None;
    let mut writing = Some((tx, writing));
    let taken = entry.engine_session().snapshot(
        &mut |chunk| {
            received += chunk.len() as u64;
            if let Err(e) = reservation.hold(received + RECORD_ROOM) {
                refused = Some(over_quota(e));
                // Nothing more is written: the file is closed and removed now, while the
                // rest of the state is read and dropped.
                if let Some((tx, thread)) = writing.take() {
                    drop(tx);
                    let _ = thread.join();
                }
                drop(std::mem::replace(&mut file, Temporary(None)));
                return Err(std::io::Error::other("over the key's storage"));
            }
            match &writing {
                Some((tx, _)) => tx
                    .send(chunk)
                    .map_err(|_| std::io::Error::other("the snapshot's writer stopped")),
                None => Err(std::io::Error::other("the snapshot's writer stopped")),
            }
        },
        max,
        snapshot_timeout(state),
    );
    let done = match writing {
        Some((tx, thread)) => {
            drop(tx);
            thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the snapshot's writer failed")))
        }
        None => Err(std::io::Error::other("the snapshot's writer stopped")),
    };
    let (report, _) = match (taken, refused) {
        (Err(SnapshotError::Store(_)), Some(refused)) => return Err(Failed::NoRoom(refused)),
        (Ok(taken), _) => taken,
        (Err(e), _) => return Err(Failed::Other(snapshot_error(e))),
    };
    let sealed = done
        .and_then(SnapshotWriter::finish)
        .map_err(|e| Failed::Other(Error::internal(format!("{}: {e}", path.display()))))?;
    let info = snapshot_info(&sealed, entry.cells(), report);
    Ok((sealed, info, file))
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
pub fn pause(state: &SharedServices, key: &Key, id: &str) -> Result<SessionInfo, Error> {
    let entry = sessions::find(state, key, id)?;
    pause_entry(state, &entry)
}

/// Pauses the open sessions unused for `idle` (the reaper, with `pause_after_idle_ms`), each
/// on a blocking thread of its own so that none waits for another (nor the reaper for any);
/// one that cannot be paused runs on, and is tried again after another `idle`.
pub fn pause_idle(state: &SharedServices, idle: Duration) {
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

fn pause_entry(state: &SharedServices, entry: &Arc<OpenSession>) -> Result<SessionInfo, Error> {
    let id = entry.id();
    let claim = state.paused.claim(id)?;
    let busy = entry.claim()?;
    let (sealed, info, written) = take_own(state, entry)?;
    let mut session_info = entry.info();
    let record = PausedRecord::of_open(
        entry,
        id,
        entry.created_at(),
        sealed,
        info.clone(),
        &written,
    );
    // Deleted meanwhile (a DELETE closes the session, then waits for this claim): nothing
    // is kept.
    keep(state, written, &record, &|| !entry.is_closed())?;
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

/// Open session `entry`'s state written to a new snapshot file of its own (which no record
/// names yet), under its claim (the caller's).
fn take_own<'a>(
    state: &'a Services,
    entry: &OpenSession,
) -> Result<(Sealed, SnapshotInfo, Written<'a>), Error> {
    let (_, path) = state.paused.new_snapshot(entry.id());
    let binding = Binding {
        key_fingerprint: entry.owner(),
        session_id: entry.id(),
    };
    take(state, entry.owner(), entry, &path, binding)
}

/// After a cell of `entry` (`completed`: it ran to its answer): if it ended the session
/// (`sys.exit()`, a limit, a crash), the session's checkpoint goes at once, for an ended
/// session never comes back; otherwise, with `sessions.checkpoint = "each_cell"`, its state
/// is written to its snapshot.
pub fn after_cell(state: &SharedServices, entry: &Arc<OpenSession>, completed: bool) {
    if entry.has_ended() {
        state.paused.forget(entry.id());
    } else if completed && state.config.sessions.checkpoint == crate::config::Checkpoint::EachCell {
        checkpoint(state, entry);
    }
}

/// Writes an open session's state to its snapshot after a cell, the cell still holding the
/// session: a server killed later brings it back from here. Under the session's claim,
/// which a DELETE waits for: one that comes meanwhile finds the snapshot kept and removes
/// it, or closes the session first, and then nothing is kept. One that cannot be written
/// (over the quota, say) is logged; the one before stays.
fn checkpoint(state: &SharedServices, entry: &Arc<OpenSession>) {
    let id = entry.id();
    let kept = state
        .paused
        .claim_within(id, snapshot_timeout(state))
        .and_then(|_claim| {
            if entry.is_closed() {
                return Err(Error::new(Kind::NotFound, "not_found", "no such session"));
            }
            let (sealed, info, written) = take_own(state, entry)?;
            let record =
                PausedRecord::of_open(entry, id, entry.created_at(), sealed, info, &written);
            keep(state, written, &record, &|| !entry.is_closed())
        });
    match kept {
        Ok(()) => {}
        Err(_) if entry.is_closed() => {
            tracing::info!(session = %id, "a session closed while its checkpoint was written: nothing of it is kept");
        }
        Err(e) => {
            tracing::warn!(session = %id, error = %e.message, "a session's checkpoint could not be written; its last one stays");
        }
    }
}

/// Brings `key`'s paused session `id` back in a fresh sandbox (blocking): jailed as a new
/// session opened with the same request, the snapshot checked whole, then read in there.
/// The session is open again under its id; its snapshot is gone.
pub fn resume(
    state: &SharedServices,
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
        .ok_or_else(|| crate::services::not_here(state, id, "session"))?;
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
        &state.paused.snapshot_path(&record)?,
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
    state: &SharedServices,
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
    state: &SharedServices,
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
    fn keep(&mut self) {
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
/// `id` goes on as it was. The snapshot of an open one is written for the new session
/// (under its claim, its bytes held against the key's storage like any) and removed once
/// read back.
pub fn fork(state: &SharedServices, key: &Key, id: &str) -> Result<SessionInfo, Error> {
    let fingerprint = key.fingerprint();
    // The source is the caller's, open or paused, before anything is touched.
    let live = sessions::find(state, key, id).ok();
    if live.is_none() && !state.paused.holds(id, &fingerprint) {
        return Err(crate::services::not_here(state, id, "session"));
    }
    let new_id = state.held_id("se_");
    let claim = state.paused.claim(id)?;
    let new_claim = state.paused.claim(&new_id)?;
    let (opening, record, path, binding_id, written) = match live {
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
            let path = state.paused.fork_path(&new_id);
            let binding = Binding {
                key_fingerprint: &fingerprint,
                session_id: &new_id,
            };
            let (sealed, info, written) = take(state, &fingerprint, &entry, &path, binding)?;
            drop(busy);
            let record =
                PausedRecord::of_open(&entry, &new_id, SystemTime::now(), sealed, info, &written);
            (opening, record, path, new_id.clone(), Some(written))
        }
        None => {
            let record = state
                .paused
                .record(id, &fingerprint)
                .ok_or_else(|| crate::services::not_here(state, id, "session"))?;
            let opening = opening_for(
                state,
                key,
                &record.request,
                record.idle_timeout_ms,
                record.max_lifetime_ms,
                &new_id,
            )?;
            let path = state.paused.snapshot_path(&record)?;
            (opening, record, path, id.to_owned(), None)
        }
    };
    let binding = Binding {
        key_fingerprint: &fingerprint,
        session_id: &binding_id,
    };
    let brought = bring_back(state, key, opening, &path, binding, &record.sealed);
    drop(written);
    drop((new_claim, claim));
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
    /// The record of open session `entry`'s state, sealed as `sealed` in the snapshot file
    /// `written`, kept as session `id` (its own, or a fork's) first opened at `created_at`.
    fn of_open(
        entry: &OpenSession,
        id: &str,
        created_at: SystemTime,
        sealed: Sealed,
        snapshot: SnapshotInfo,
        written: &Written,
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
            snapshot_file: written
                .file
                .0
                .as_deref()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned()),
        }
    }
}

/// `POST /v1/sessions/{id}/pause`.
pub async fn pause_session(
    state: &SharedServices,
    key: &Arc<Key>,
    id: String,
) -> Result<SessionInfo, Error> {
    blocking(state, key, id, "pausing a session", pause).await
}

/// `POST /v1/sessions/{id}/resume`: a paused session brought back (one already open is
/// answered as it is).
pub async fn resume_session(
    state: &SharedServices,
    key: &Arc<Key>,
    id: String,
) -> Result<SessionInfo, Error> {
    crate::execution::refuse_if_unavailable(state)?;
    let (entry, resumed) = find_or_resume(state, key, &id).await?;
    let mut info = sessions::info(state, key, entry.id())?;
    info.resumed = resumed;
    Ok(info)
}

/// `POST /v1/sessions/{id}/fork`.
pub async fn fork_session(
    state: &SharedServices,
    key: &Arc<Key>,
    id: String,
) -> Result<SessionInfo, Error> {
    blocking(state, key, id, "forking a session", fork).await
}

/// `f` for `key`'s session `id` on a blocking thread, unless the server refuses work now.
async fn blocking(
    state: &SharedServices,
    key: &Arc<Key>,
    id: String,
    what: &'static str,
    f: fn(&SharedServices, &Key, &str) -> Result<SessionInfo, Error>,
) -> Result<SessionInfo, Error> {
    crate::execution::refuse_if_unavailable(state)?;
    let (st, key) = (state.clone(), key.clone());
    tokio::task::spawn_blocking(move || f(&st, &key, &id))
        .await
        .map_err(|e| Error::internal(format!("{what}: {e}")))?
}

/// The caller's session `id`, brought back first if it is paused (what came back, then). A
/// request that finds another bringing it back waits for it.
pub async fn find_or_resume(
    state: &SharedServices,
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
pub async fn bring_back_if_paused(
    state: &SharedServices,
    key: &Arc<Key>,
    id: &str,
) -> Result<(), Error> {
    find_or_resume(state, key, id).await.map(drop)
}

/// Runs the reaper until shutdown.
pub async fn reaper(state: SharedServices) {
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
            for (id, owner) in st.paused.expire() {
                sessions::audit_session(&st, &id, &owner, Some("expired"));
            }
            st.paused.sweep_tombstones();
        })
        .await;
        let st = state.clone();
        let reaped = tokio::task::spawn_blocking(move || {
            let reaped = st.sessions.reap();
            // Closed for good: their checkpoints go too.
            for r in &reaped {
                st.paused.forget(&r.id);
            }
            reaped
        })
        .await;
        for r in reaped.into_iter().flatten() {
            sessions::audit_session(&state, &r.id, &r.key_fingerprint, Some(r.why));
        }
    }
}
