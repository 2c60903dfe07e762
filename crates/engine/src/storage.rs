//! The one owner of what keys keep on this server's disk, and of what is held for what is
//! being written. A key keeps bytes in two accounts, each within its quota:
//! - [`Account::Stored`]: its volumes and its paused sessions (snapshots and records,
//!   checkpoints, and a fork's snapshot while it is read back), within
//!   `volumes.max_bytes_per_key`;
//! - [`Account::Background`]: its background executions' events, results and waiting jobs,
//!   within `background.max_bytes_per_key`.
//!
//! The operator's environments are no key's (built under the `admin` scope, named for
//! every key): they are counted server-wide ([`Storage::operator_bytes`]), within no quota but
//! each build's own bound while it writes.
//!
//! Reserve, write, keep, give back: what writes for a key first holds the bytes it will write
//! ([`Storage::reserve`], [`Reservation::hold`]), within what the account's quota leaves
//! beside all the key keeps and every other reservation; once what it wrote is kept (a
//! volume's manifest, a session's record), its store counts it, and the reservation is
//! dropped. A reservation refused while others of the key's are being made waits for its
//! turn ([`Reservation::wait_for_turn`]). What is kept is counted by the store that keeps it
//! ([`Kept`]: volumes from their manifests, which `airlock volume` makes beside the server;
//! paused sessions from their index), or here as it is written, for what only this process
//! writes ([`Storage::count`]: background executions'). No one else adds bytes up.
//!
//! One lock: a key's account is counted and taken in one step, under this process's lock and,
//! for the stored account, which processes beside the server take from too (`airlock volume
//! create`), the key's `<state>/storage/<owner>/.lock` (`flock`), which each of them takes.
//! Each reservation of that account is also a file there, `stored.<16 hex digits>`, its bytes
//! (8, little-endian) `flock`ed by its holder while it lives, so that the others count it; one
//! that a killed process left is no longer locked, counts no more, and is removed. A store
//! shared by replicas (a database) would keep the same accounts behind the same calls.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use nix::fcntl::{Flock, FlockArg};

use crate::durable::open_lock_file;

/// Where a key's bytes count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Account {
    /// Its volumes and paused sessions (`volumes.max_bytes_per_key`).
    Stored,
    /// Its background executions (`background.max_bytes_per_key`).
    Background,
}

impl Account {
    fn name(self) -> &'static str {
        match self {
            Account::Stored => "stored",
            Account::Background => "background",
        }
    }

    /// Whether processes beside this one take from it too (`airlock volume create`): then
    /// its reservations are files, and it is taken under the key's lock file.
    fn is_shared(self) -> bool {
        self == Account::Stored
    }
}

/// Each account's quota, per key.
#[derive(Clone, Copy, Debug)]
pub struct Quotas {
    pub stored: u64,
    pub background: u64,
}

impl Quotas {
    fn of(&self, account: Account) -> u64 {
        match account {
            Account::Stored => self.stored,
            Account::Background => self.background,
        }
    }
}

/// Whose bytes a store is asked for.
#[derive(Clone, Copy, Debug)]
pub enum Whose<'a> {
    /// A key's, by its fingerprint.
    Key(&'a str),
    /// The operator's, which are no key's.
    Operator,
}

/// A store that counts the bytes it keeps itself (from its disk or its index).
pub trait Kept: Send + Sync {
    fn kept(&self, whose: Whose<'_>) -> u64;
}

/// Past the account's quota: what the key held (kept and reserved, but what was asked),
/// what was asked, and the quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub used: u64,
    pub needed: u64,
    pub quota: u64,
}

/// The most a growing reservation holds beyond what it was asked for (an eighth of that, up
/// to this), so that the account is not counted again for each piece of a large write, nor
/// held far ahead of a small one.
const HOLD_AHEAD: u64 = 8 << 20;

/// The bytes keys keep, and hold for what is being written.
pub struct Storage {
    /// `<state>/storage`, where reservations are files; `None` where it cannot be made (then
    /// only this process counts them).
    dir: Option<PathBuf>,
    quotas: Quotas,
    stores: Vec<(Account, Arc<dyn Kept>)>,
    operator: Vec<Arc<dyn Kept>>,
    ledger: Mutex<Ledger>,
    room_freed: Condvar,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("dir", &self.dir)
            .field("quotas", &self.quotas)
            .finish()
    }
}

#[derive(Default)]
struct Ledger {
    keys: HashMap<String, KeyLedger>,
}

/// One key's part of the ledger.
#[derive(Default)]
struct KeyLedger {
    /// Bytes counted here, by account and item (a background execution's id).
    counted: HashMap<(Account, String), u64>,
    /// This process's reservations, by place (in the order they began).
    held: BTreeMap<u64, Held>,
    next: u64,
    /// The names of their files, which a count of other processes' passes over.
    files: HashSet<String>,
}

impl KeyLedger {
    fn is_empty(&self) -> bool {
        self.counted.is_empty() && self.held.is_empty()
    }
}

#[derive(Clone, Copy)]
struct Held {
    account: Account,
    bytes: u64,
    /// Writing now, or refused and waiting for its turn to try again.
    writing: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `owner` (a key's fingerprint) may name a directory.
fn names_a_directory(owner: &str) -> bool {
    !owner.is_empty() && owner.len() <= 128 && owner.bytes().all(|b| b.is_ascii_alphanumeric())
}

impl Storage {
    /// The storage of the state directory `state`: reservations' files in `state/storage`
    /// (made, private, if missing); quotas per key.
    pub fn open(state: &std::path::Path, quotas: Quotas) -> Storage {
        let dir = state.join("storage");
        let made = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir);
        if let Err(e) = &made {
            tracing::warn!(dir = %dir.display(), error = %e, "reservations cannot be files: processes beside this one will not count them");
        }
        Storage {
            dir: made.ok().map(|()| dir),
            quotas,
            stores: Vec::new(),
            operator: Vec::new(),
            ledger: Mutex::new(Ledger::default()),
            room_freed: Condvar::new(),
        }
    }

    /// With `store`'s bytes counted in `account`.
    pub fn counting(mut self, account: Account, store: Arc<dyn Kept>) -> Storage {
        self.stores.push((account, store));
        self
    }

    /// With `store`'s bytes counted as the operator's.
    pub fn counting_operator(mut self, store: Arc<dyn Kept>) -> Storage {
        self.operator.push(store);
        self
    }

    /// What the operator keeps, server-wide.
    pub fn operator_bytes(&self) -> u64 {
        self.operator.iter().map(|s| s.kept(Whose::Operator)).sum()
    }

    /// What `owner` holds in `account`: all it keeps, and every reservation.
    pub fn used(&self, owner: &str, account: Account) -> u64 {
        let (mut ledger, _key_lock) = self.lock_key(owner, account);
        self.count_all(&mut ledger, owner, account, None)
    }

    /// What `account`'s quota leaves beside what `owner` keeps: the room its reservations
    /// share.
    pub fn room(&self, owner: &str, account: Account) -> u64 {
        let (ledger, _key_lock) = self.lock_key(owner, account);
        let kept = self.kept(&ledger, owner, account);
        self.quotas.of(account).saturating_sub(kept)
    }

    /// A reservation of `owner`'s `account` holding nothing yet, which grows as it is asked
    /// ([`Reservation::hold`], a little ahead): its place among the key's follows those begun
    /// before it.
    pub fn reservation(&self, owner: &str, account: Account) -> Reservation<'_> {
        let place = {
            let mut ledger = lock(&self.ledger);
            let key = ledger.keys.entry(owner.to_owned()).or_default();
            let place = key.next;
            key.next += 1;
            key.held.insert(
                place,
                Held {
                    account,
                    bytes: 0,
                    writing: true,
                },
            );
            place
        };
        Reservation {
            storage: self,
            owner: owner.to_owned(),
            account,
            place,
            held: 0,
            ahead: true,
            file: None,
        }
    }

    /// `bytes` of `owner`'s `account` held, exactly, if they fit.
    pub fn reserve(
        &self,
        owner: &str,
        account: Account,
        bytes: u64,
    ) -> Result<Reservation<'_>, Refused> {
        let mut reservation = self.reservation(owner, account);
        reservation.ahead = false;
        reservation.hold(bytes)?;
        Ok(reservation)
    }

    /// Counts `bytes` more of `owner`'s `account` for `item`, written already; refused when
    /// the account is now past its quota (they are counted all the same).
    pub fn count(
        &self,
        owner: &str,
        account: Account,
        item: &str,
        bytes: u64,
    ) -> Result<(), Refused> {
        self.add(owner, account, item, bytes, true)
    }

    /// Counts `bytes` more of `owner`'s `account` for `item`, about to be written, if they
    /// fit; refused, nothing counted, if not.
    pub fn count_within(
        &self,
        owner: &str,
        account: Account,
        item: &str,
        bytes: u64,
    ) -> Result<(), Refused> {
        self.add(owner, account, item, bytes, false)
    }

    /// Counts `bytes` more for `item` if they fit, or `anyway`; refused if they do not.
    fn add(
        &self,
        owner: &str,
        account: Account,
        item: &str,
        bytes: u64,
        anyway: bool,
    ) -> Result<(), Refused> {
        let (mut ledger, _key_lock) = self.lock_key(owner, account);
        let used = self.count_all(&mut ledger, owner, account, None);
        let quota = self.quotas.of(account);
        let fits = used.saturating_add(bytes) <= quota;
        if fits || anyway {
            let key = ledger.keys.entry(owner.to_owned()).or_default();
            *key.counted.entry((account, item.to_owned())).or_default() += bytes;
        }
        if fits {
            Ok(())
        } else {
            Err(Refused {
                used,
                needed: bytes,
                quota,
            })
        }
    }

    /// Counts `bytes` fewer of `owner`'s `account` for `item` (some of what it wrote removed).
    pub fn uncount(&self, owner: &str, account: Account, item: &str, bytes: u64) {
        let mut ledger = lock(&self.ledger);
        if let Some(key) = ledger.keys.get_mut(owner) {
            let id = (account, item.to_owned());
            if let Some(n) = key.counted.get_mut(&id) {
                *n = n.saturating_sub(bytes);
            }
        }
        drop(ledger);
        self.room_freed.notify_all();
    }

    /// Counts nothing more of `owner`'s `account` for `item` (all it wrote removed).
    pub fn forget(&self, owner: &str, account: Account, item: &str) {
        let mut ledger = lock(&self.ledger);
        if let Some(key) = ledger.keys.get_mut(owner) {
            key.counted.remove(&(account, item.to_owned()));
            if key.is_empty() {
                ledger.keys.remove(owner);
            }
        }
        drop(ledger);
        self.room_freed.notify_all();
    }

    /// For a shared account, `owner`'s lock file's lock where there is one (others' files are
    /// counted, and one's own made, only under it), then this process's. In that order: what
    /// waits for another process (an `airlock volume` stopped at the wrong time, say) waits
    /// without this process's lock, and holds up that key's account alone.
    fn lock_key(
        &self,
        owner: &str,
        account: Account,
    ) -> (MutexGuard<'_, Ledger>, Option<Flock<File>>) {
        let shared = account.is_shared().then(|| self.key_dir(owner)).flatten();
        let key_lock = shared.and_then(|dir| {
            let made = fs::DirBuilder::new().mode(0o700).create(&dir);
            if let Err(e) = made {
                if e.kind() != io::ErrorKind::AlreadyExists {
                    return None;
                }
            }
            let file = open_lock_file(&dir.join(".lock")).ok()?;
            Flock::lock(file, FlockArg::LockExclusive).ok()
        });
        (lock(&self.ledger), key_lock)
    }

    fn key_dir(&self, owner: &str) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        names_a_directory(owner).then(|| dir.join(owner))
    }

    /// What `owner` keeps in `account`: its stores' bytes and those counted here.
    fn kept(&self, ledger: &Ledger, owner: &str, account: Account) -> u64 {
        let stores: u64 = self
            .stores
            .iter()
            .filter(|(a, _)| *a == account)
            .map(|(_, s)| s.kept(Whose::Key(owner)))
            .sum();
        let counted: u64 = ledger.keys.get(owner).map_or(0, |k| {
            k.counted
                .iter()
                .filter(|((a, _), _)| *a == account)
                .map(|(_, n)| n)
                .sum()
        });
        stores + counted
    }

    /// All `owner` holds in `account` (under both locks): what it keeps, this process's
    /// reservations but `but`, and those of processes beside it.
    fn count_all(
        &self,
        ledger: &mut Ledger,
        owner: &str,
        account: Account,
        but: Option<u64>,
    ) -> u64 {
        let kept = self.kept(ledger, owner, account);
        let ours: u64 = ledger.keys.get(owner).map_or(0, |k| {
            k.held
                .iter()
                .filter(|(place, h)| h.account == account && Some(**place) != but)
                .map(|(_, h)| h.bytes)
                .sum()
        });
        if !account.is_shared() {
            return kept + ours;
        }
        let own_files = ledger.keys.get(owner).map(|k| &k.files);
        kept + ours + self.others_held(owner, account, own_files)
    }

    /// The bytes other processes' live reservations of `owner`'s `account` hold (under the
    /// key's lock file); those left by a process that is gone are removed.
    fn others_held(&self, owner: &str, account: Account, own: Option<&HashSet<String>>) -> u64 {
        let Some(dir) = self.key_dir(owner) else {
            return 0;
        };
        let Ok(entries) = fs::read_dir(&dir) else {
            return 0;
        };
        let prefix = format!("{}.", account.name());
        let mut held = 0u64;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&prefix) || own.is_some_and(|own| own.contains(&name)) {
                continue;
            }
            let path = entry.path();
            let Ok(file) = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&path)
            else {
                continue;
            };
            match Flock::lock(file, FlockArg::LockSharedNonblock) {
                // No one holds it: its process is gone.
                Ok(_) => {
                    let _ = fs::remove_file(&path);
                }
                Err((mut file, _)) => {
                    let mut bytes = [0u8; 8];
                    if file.read_exact(&mut bytes).is_ok() {
                        held = held.saturating_add(u64::from_le_bytes(bytes));
                    }
                }
            }
        }
        held
    }
}

/// Bytes of a key's account held for what is being written, before it is written: counted
/// with all the key keeps. Given back when dropped (what was written kept, and counted by its
/// store, or removed).
pub struct Reservation<'a> {
    storage: &'a Storage,
    owner: String,
    account: Account,
    /// Its place among the key's reservations in this process.
    place: u64,
    held: u64,
    /// Whether it holds a little ahead of what it is asked.
    ahead: bool,
    /// Its file, for processes beside this one, once it holds anything.
    file: Option<HeldFile>,
}

struct HeldFile {
    name: String,
    path: PathBuf,
    lock: Flock<File>,
}

impl std::fmt::Debug for Reservation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("owner", &self.owner)
            .field("account", &self.account)
            .field("held", &self.held)
            .finish()
    }
}

impl Reservation<'_> {
    pub fn held(&self) -> u64 {
        self.held
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Holds `bytes` in all, if the account has room for them beside everything else the
    /// key holds; else nothing more, and why.
    pub fn hold(&mut self, bytes: u64) -> Result<(), Refused> {
        if bytes <= self.held {
            return Ok(());
        }
        let storage = self.storage;
        let (mut ledger, _key_lock) = storage.lock_key(&self.owner, self.account);
        let others = storage.count_all(&mut ledger, &self.owner, self.account, Some(self.place));
        let quota = storage.quotas.of(self.account);
        let room = quota.saturating_sub(others);
        if bytes > room {
            return Err(Refused {
                used: others,
                needed: bytes,
                quota,
            });
        }
        let want = if self.ahead {
            (bytes + (bytes / 8).min(HOLD_AHEAD)).min(room)
        } else {
            bytes
        };
        self.write_file(want);
        let key = ledger.keys.entry(self.owner.clone()).or_default();
        if let Some(file) = &self.file {
            key.files.insert(file.name.clone());
        }
        key.held.insert(
            self.place,
            Held {
                account: self.account,
                bytes: want,
                writing: true,
            },
        );
        self.held = want;
        Ok(())
    }

    /// Says `bytes` in its file (made on first use), for processes beside this one; one that
    /// cannot be written leaves it this process's alone.
    fn write_file(&mut self, bytes: u64) {
        if self.file.is_none() {
            if bytes == 0 || !self.account.is_shared() {
                return;
            }
            let Some(dir) = self.storage.key_dir(&self.owner) else {
                return;
            };
            let mut random = [0u8; 8];
            if getrandom::fill(&mut random).is_err() {
                return;
            }
            let name = format!(
                "{}.{:016x}",
                self.account.name(),
                u64::from_le_bytes(random)
            );
            let path = dir.join(&name);
            let made = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&path);
            let locked = made.map_err(|e| (None, e)).and_then(|file| {
                Flock::lock(file, FlockArg::LockExclusiveNonblock)
                    .map_err(|(_, e)| (Some(()), io::Error::from(e)))
            });
            match locked {
                Ok(lock) => self.file = Some(HeldFile { name, path, lock }),
                Err((made, e)) => {
                    if made.is_some() {
                        let _ = fs::remove_file(&path);
                    }
                    tracing::warn!(path = %path.display(), error = %e, "a reservation's file cannot be made: processes beside this one will not count it");
                    return;
                }
            }
        }
        if let Some(file) = &self.file {
            if let Err(e) = file.lock.write_all_at(&bytes.to_le_bytes(), 0) {
                tracing::warn!(path = %file.path.display(), error = %e, "a reservation's file cannot be written");
            }
        }
    }

    /// Gives back what it holds, to try again in its turn ([`Reservation::wait_for_turn`]).
    pub fn give_back(&mut self) {
        let storage = self.storage;
        {
            let (mut ledger, _key_lock) = storage.lock_key(&self.owner, self.account);
            self.write_file(0);
            if let Some(h) = ledger
                .keys
                .get_mut(&self.owner)
                .and_then(|k| k.held.get_mut(&self.place))
            {
                h.bytes = 0;
                h.writing = false;
            }
        }
        self.held = 0;
        storage.room_freed.notify_all();
    }

    /// Refused for want of room (and holding nothing now), waits for its turn to try again,
    /// and says whether it has one. Those of the key's account that began before it go
    /// first: it waits until they are done. The first waits until those after it stop
    /// writing (refused in turn, they wait for it), then has the room they held. With none
    /// before it and none after it writing, the room was never there: no turn. At most until
    /// `until`.
    pub fn wait_for_turn(&self, until: Instant) -> bool {
        let storage = self.storage;
        let mut ledger = lock(&storage.ledger);
        let mut waited = false;
        loop {
            let (before, after_writing) =
                ledger.keys.get(&self.owner).map_or((false, false), |k| {
                    let mine = |(_, h): &(&u64, &Held)| h.account == self.account;
                    (
                        k.held.range(..self.place).any(|e| mine(&e)),
                        k.held
                            .range(self.place + 1..)
                            .any(|e| mine(&e) && e.1.writing),
                    )
                });
            if !(before || after_writing) {
                return waited;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            waited = true;
            ledger = storage
                .room_freed
                .wait_timeout(ledger, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let storage = self.storage;
        {
            let mut ledger = lock(&storage.ledger);
            if let Some(key) = ledger.keys.get_mut(&self.owner) {
                key.held.remove(&self.place);
                if let Some(file) = &self.file {
                    key.files.remove(&file.name);
                }
                if key.is_empty() {
                    ledger.keys.remove(&self.owner);
                }
            }
            // Removed while still locked: a count that opens it meanwhile finds it held.
            if let Some(file) = self.file.take() {
                let _ = fs::remove_file(&file.path);
                drop(file.lock);
            }
        }
        storage.room_freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn state(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "airlock-storage-test-{}-{name}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// A store that keeps what the test says, for one key.
    struct Fixed(u64);

    impl Kept for Fixed {
        fn kept(&self, whose: Whose<'_>) -> u64 {
            match whose {
                Whose::Key("k1") => self.0,
                Whose::Key(_) => 0,
                Whose::Operator => 7,
            }
        }
    }

    const QUOTAS: Quotas = Quotas {
        stored: 100 << 20,
        background: 1000,
    };

    #[test]
    fn a_reservation_holds_within_what_the_key_keeps_and_gives_back_when_dropped() {
        let d = state("holds");
        let storage =
            Storage::open(&d, QUOTAS).counting(Account::Stored, Arc::new(Fixed(40 << 20)));
        assert_eq!(storage.used("k1", Account::Stored), 40 << 20);
        let volume = storage.reserve("k1", Account::Stored, 50 << 20).unwrap();
        assert_eq!(volume.held(), 50 << 20);
        assert_eq!(storage.used("k1", Account::Stored), 90 << 20);
        // Another key's account is its own.
        assert_eq!(storage.used("k2", Account::Stored), 0);
        let refused = storage
            .reserve("k1", Account::Stored, 11 << 20)
            .unwrap_err();
        assert_eq!(
            refused,
            Refused {
                used: 90 << 20,
                needed: 11 << 20,
                quota: 100 << 20
            }
        );
        // Growing, it holds a little ahead, within the room there is.
        let mut snapshot = storage.reservation("k1", Account::Stored);
        snapshot.hold(1 << 20).unwrap();
        assert_eq!(snapshot.held(), (1 << 20) + (1 << 17));
        snapshot.hold(9 << 20).unwrap();
        assert_eq!(snapshot.held(), 10 << 20);
        assert!(snapshot.hold((10 << 20) + 1).is_err());
        assert_eq!(snapshot.held(), 10 << 20);
        assert_eq!(storage.room("k1", Account::Stored), 60 << 20);
        drop(volume);
        assert_eq!(storage.used("k1", Account::Stored), 50 << 20);
        drop(snapshot);
        assert_eq!(storage.used("k1", Account::Stored), 40 << 20);
        assert_eq!(storage.operator_bytes(), 0);
        let storage = storage.counting_operator(Arc::new(Fixed(0)));
        assert_eq!(storage.operator_bytes(), 7);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn processes_beside_each_other_count_each_other_s_reservations() {
        let d = state("beside");
        // Two storages on one state directory: two processes, as far as `flock` can tell.
        let server = Storage::open(&d, QUOTAS);
        let cli = Storage::open(&d, QUOTAS);
        let held = server.reserve("k1", Account::Stored, 60 << 20).unwrap();
        assert_eq!(cli.used("k1", Account::Stored), 60 << 20);
        assert!(cli.reserve("k1", Account::Stored, 41 << 20).is_err());
        let beside = cli.reserve("k1", Account::Stored, 40 << 20).unwrap();
        assert_eq!(server.used("k1", Account::Stored), 100 << 20);
        drop(held);
        assert_eq!(cli.used("k1", Account::Stored), 40 << 20);
        drop(beside);
        assert_eq!(server.used("k1", Account::Stored), 0);
        // One left by a process that is gone (its file, no longer locked) counts no more.
        let left = d.join("storage/k1/stored.00000000000000ff");
        fs::write(&left, (90u64 << 20).to_le_bytes()).unwrap();
        assert_eq!(cli.used("k1", Account::Stored), 0);
        assert!(!left.exists());
        let names: Vec<_> = fs::read_dir(d.join("storage/k1"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, [".lock"]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_refused_reservation_waits_for_those_before_it_and_has_no_turn_alone() {
        let d = state("turns");
        let storage = Storage::open(&d, QUOTAS);
        let mut alone = storage.reservation("k1", Account::Stored);
        assert!(alone.hold(101 << 20).is_err());
        alone.give_back();
        let soon = Instant::now() + Duration::from_secs(10);
        assert!(!alone.wait_for_turn(soon));
        drop(alone);
        let mut first = storage.reservation("k1", Account::Stored);
        first.hold(60 << 20).unwrap();
        let mut second = storage.reservation("k1", Account::Stored);
        assert!(second.hold(60 << 20).is_err());
        second.give_back();
        std::thread::scope(|s| {
            let waiting = s.spawn(|| {
                let turn = second.wait_for_turn(soon);
                (turn, second.hold(60 << 20).is_ok())
            });
            std::thread::sleep(Duration::from_millis(50));
            drop(first);
            assert_eq!(waiting.join().unwrap(), (true, true));
        });
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn what_is_counted_as_written_is_refused_past_the_quota_and_forgotten_whole() {
        let d = state("counted");
        let storage = Storage::open(&d, QUOTAS);
        storage
            .count_within("k1", Account::Background, "ex_1", 600)
            .unwrap();
        let refused = storage
            .count_within("k1", Account::Background, "ex_2", 500)
            .unwrap_err();
        assert_eq!(refused.used, 600);
        assert_eq!(storage.used("k1", Account::Background), 600);
        // Written already: counted, and said to be past.
        assert!(storage
            .count("k1", Account::Background, "ex_1", 500)
            .is_err());
        assert_eq!(storage.used("k1", Account::Background), 1100);
        storage.uncount("k1", Account::Background, "ex_1", 100);
        assert_eq!(storage.used("k1", Account::Background), 1000);
        // Its own account: the stored one is untouched.
        assert_eq!(storage.used("k1", Account::Stored), 0);
        storage.forget("k1", Account::Background, "ex_1");
        assert_eq!(storage.used("k1", Account::Background), 0);
        fs::remove_dir_all(&d).unwrap();
    }
}
