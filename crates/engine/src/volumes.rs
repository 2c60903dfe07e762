//! Volumes: named directories owned by a key that outlive executions, sessions and restarts.
//! Each is a file system of its own in an image file ([`airlock_sandbox::BoundedDir`]), so
//! its bytes and entries are bounded by the kernel while they are written (ENOSPC inside the
//! sandbox), never by a check afterwards, and never by the host's disk filling.
//!
//! Layout of `<state>/volumes/<owner>/` (the owner is the key's fingerprint):
//! - `<name>.img`: the ext4 image, sparse, of the volume's size;
//! - `<name>.json`: its manifest, written last (atomically): a volume without one does not
//!   exist, and an image without one (a creation cut short) is removed at start;
//! - `<name>.upload`, while an upload changes the volume's tree (makes a directory, or puts a
//!   file in place of another): what it is about to make ([`Pending`]). One left by a crash is
//!   undone when the volume is next mounted, before anything reads or counts it.
//!
//! A volume is mounted (on the host, detached) while something holds a [`Lease`] on it: a
//! sandbox that mounts it, or a file route that reads or writes it. One mount at a time:
//! every lease shares it, and a new one waits out a mount that has not yet gone. At most one
//! writer holds it at a time; readers any number. Its files belong to uid 1000 on its own file
//! system, which each sandbox sees as itself (an idmapped mount); the host reaches them only
//! by `openat2` beneath its root, never following a link.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use airlock_sandbox::{BoundedDir, BoundedError, VolumeMount};
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use serde::{Deserialize, Serialize};

use crate::paths::check_relative_path;
use crate::policy::SANDBOX_UID;

/// Who owns the files on a volume's file system: the sandbox's uid and gid.
pub const OWNER_ID: u32 = SANDBOX_UID;
/// Longest volume name.
pub const MAX_NAME: usize = 64;
/// Smallest volume: room for ext4's journal and a few files.
pub const MIN_BYTES: u64 = 8 << 20;
/// How long a new lease waits for a mount of the same volume that has not yet gone.
const BUSY_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("no volume named {0:?}")]
    Unknown(String),
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("a volume named {0:?} already exists")]
    Exists(String),
    #[error("{0}")]
    Quota(String),
    #[error("volume {name:?} is being written by {holder}; one writer at a time")]
    Busy { name: String, holder: String },
    #[error("volume {name:?} is in use by {holders}")]
    InUse { name: String, holders: String },
    #[error("volumes are not available on this host: {0}")]
    Unavailable(String),
    #[error("no file {0:?} in the volume")]
    NoFile(String),
    #[error("{path:?} is a symbolic link or not a {wanted}; links in a volume are never followed")]
    NotA { path: String, wanted: &'static str },
    #[error("the volume is full (its bytes or its entries)")]
    Full,
    #[error("{what} {path:?}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> VolumeError + 'a {
    move |source| VolumeError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// A volume's manifest, and what `GET /v1/volumes/{name}` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeInfo {
    pub name: String,
    pub size_bytes: u64,
    pub max_entries: u64,
    pub created_at: String,
}

/// How much of a volume is used, read from its mounted file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub used_bytes: u64,
    pub used_entries: u64,
}

/// Bounds on one key's volumes (the server's `[volumes]`).
#[derive(Clone, Copy, Debug)]
pub struct Quota {
    /// The sum of the sizes of one key's volumes.
    pub max_bytes_per_key: u64,
    pub max_volumes_per_key: usize,
    /// Largest single volume.
    pub max_size_bytes: u64,
    /// Most entries a volume may be made with.
    pub max_entries: u64,
}

/// One file of a volume's listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeFile {
    pub path: String,
    /// `file`, `dir`, `link` (never followed) or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// Its name (or a directory's on its path) is not UTF-8: shown with U+FFFD, and not
    /// reachable by the file routes (a sandbox can rename or remove it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lossy: bool,
    /// It could not be looked at, or (a directory) its entries could not be read: what it
    /// holds is not listed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unreadable: bool,
}

/// A volume's listing: its entries, and whether there were more than it may hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub files: Vec<VolumeFile>,
    pub truncated: bool,
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The volumes under a state directory.
#[derive(Debug)]
pub struct Volumes {
    dir: PathBuf,
    /// Why volumes cannot be had here, when they cannot (no loop devices, not root).
    unavailable: Option<String>,
    /// Volumes mounted now, by owner and name: one slot each, whose own lock a lease (which
    /// may wait for a mount to go) and a deletion hold, so that neither waits behind another
    /// volume, and a volume is never deleted between a check and a lease.
    open: Mutex<HashMap<(String, String), Slot>>,
    /// Held while a volume is made (its quota counted).
    making: Mutex<()>,
}

type Slot = Arc<Mutex<Weak<Open>>>;

/// A mounted volume and who holds it.
#[derive(Debug)]
struct Open {
    dir: BoundedDir,
    holders: Mutex<Holders>,
    /// Where an upload notes what it is about to make (`<name>.upload`).
    pending: PathBuf,
    /// Held to read (a listing's walk) and to write (an upload's file linked under its
    /// temporary name and renamed over the old one): a listing never sees that name.
    names: RwLock<()>,
}

#[derive(Debug, Default)]
struct Holders {
    writer: Option<String>,
    readers: Vec<String>,
}

/// A hold on a mounted volume: while any exists, the volume stays mounted (one mount for
/// all). A writer's lease is the only writer's. Dropped only once whatever mounted it (a
/// sandbox) is gone.
#[derive(Debug)]
pub struct Lease {
    open: Arc<Open>,
    access: Access,
    holder: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut holders = self.open.holders.lock().unwrap_or_else(|e| e.into_inner());
        match self.access {
            Access::Write => holders.writer = None,
            Access::Read => {
                if let Some(i) = holders.readers.iter().position(|h| *h == self.holder) {
                    holders.readers.swap_remove(i);
                }
            }
        }
    }
}

/// A volume a job mounts: its lease (held as long as the job's sandbox lives) and where.
#[derive(Debug)]
pub struct JobVolume {
    pub lease: Lease,
    pub target: PathBuf,
}

impl JobVolume {
    pub(crate) fn mount(&self) -> VolumeMount {
        VolumeMount {
            source: self.lease.open.dir.bind_source(),
            target: self.target.clone(),
            read_only: self.lease.access == Access::Read,
        }
    }
}

/// Whether `name` may name a volume: 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a
/// letter or digit.
pub fn check_name(name: &str) -> Result<(), VolumeError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(VolumeError::Invalid {
            field: "name",
            message: format!(
                "invalid volume name {name:?}: 1 to {MAX_NAME} of a-z, 0-9, '-', '_' and '.', \
                 starting with a letter or a digit"
            ),
        })
    }
}

/// Whether `owner` (a key's fingerprint) may name a directory.
fn check_owner(owner: &str) -> Result<(), VolumeError> {
    if !owner.is_empty() && owner.len() <= 128 && owner.bytes().all(|b| b.is_ascii_alphanumeric()) {
        Ok(())
    } else {
        Err(VolumeError::Invalid {
            field: "owner",
            message: "invalid volume owner".into(),
        })
    }
}

impl Volumes {
    /// The volumes under `<state>/volumes`, made if missing; images left without a manifest
    /// (a creation cut short) are removed. Where the directory cannot be made, volumes are
    /// unavailable, and say why.
    pub fn open(state: &Path) -> Volumes {
        let dir = state.join("volumes");
        let made = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()));
        for owner in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(files) = fs::read_dir(owner.path()) else {
                continue;
            };
            for file in files.flatten() {
                let path = file.path();
                let orphan = path
                    .extension()
                    .is_some_and(|e| e == "img" || e == "upload")
                    && !path.with_extension("json").exists();
                let temporary = path.extension().is_some_and(|e| e == "tmp");
                if orphan || temporary {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        Volumes {
            dir,
            unavailable: made.err().or_else(unavailable),
            open: Mutex::new(HashMap::new()),
            making: Mutex::new(()),
        }
    }

    /// Held while a key's storage is counted and taken (a volume made, a snapshot kept), so
    /// that two at once never both fit where only one does.
    pub fn storage_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.making.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why volumes cannot be had here, if they cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    fn available(&self) -> Result<(), VolumeError> {
        match &self.unavailable {
            Some(why) => Err(VolumeError::Unavailable(why.clone())),
            None => Ok(()),
        }
    }

    fn owner_dir(&self, owner: &str) -> Result<PathBuf, VolumeError> {
        check_owner(owner)?;
        Ok(self.dir.join(owner))
    }

    /// The slot of `owner`'s volume `name`; slots of volumes nobody holds go meanwhile.
    fn slot(&self, owner: &str, name: &str) -> Slot {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, slot| {
            Arc::strong_count(slot) > 1 || slot.lock().map(|w| w.strong_count() > 0).unwrap_or(true)
        });
        open.entry((owner.to_owned(), name.to_owned()))
            .or_default()
            .clone()
    }

    /// Makes a volume of `size_bytes` and `max_entries` for `owner`, within `quota`, which
    /// also counts `elsewhere(owner)`: the key's other storage (its paused sessions), asked
    /// under [`Volumes::storage_lock`].
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        owner: &str,
        name: &str,
        size_bytes: u64,
        max_entries: u64,
        quota: &Quota,
        now: &str,
        elsewhere: &dyn Fn(&str) -> u64,
    ) -> Result<VolumeInfo, VolumeError> {
        check_name(name)?;
        self.available()?;
        if size_bytes < MIN_BYTES || size_bytes > quota.max_size_bytes {
            return Err(VolumeError::Invalid {
                field: "size_bytes",
                message: format!(
                    "size_bytes must be between {MIN_BYTES} and {} (volumes.max_size_bytes)",
                    quota.max_size_bytes
                ),
            });
        }
        // ext4 needs a few blocks per inode table: at most one entry per 4 KiB of size.
        if max_entries < 16 || max_entries > quota.max_entries || max_entries > size_bytes / 4096 {
            return Err(VolumeError::Invalid {
                field: "max_entries",
                message: format!(
                    "max_entries must be between 16 and {} (volumes.max_entries, and one per \
                     4 KiB of size_bytes)",
                    quota.max_entries.min(size_bytes / 4096)
                ),
            });
        }
        let dir = self.owner_dir(owner)?;
        let _making = self.making.lock().unwrap_or_else(|e| e.into_inner());
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_err("create", &dir))?;
        // Another process (the CLI beside the server) counts the same quota.
        let _owner = lock_owner(&dir)?;
        let existing = self.list(owner)?;
        if existing.iter().any(|v| v.name == name) {
            return Err(VolumeError::Exists(name.into()));
        }
        if existing.len() >= quota.max_volumes_per_key {
            return Err(VolumeError::Quota(format!(
                "this key has {} volumes, the most it may have (volumes.max_volumes_per_key)",
                existing.len()
            )));
        }
        let used: u64 = existing.iter().map(|v| v.size_bytes).sum::<u64>() + elsewhere(owner);
        if used.saturating_add(size_bytes) > quota.max_bytes_per_key {
            return Err(VolumeError::Quota(format!(
                "this key's storage (its volumes and paused sessions) holds {used} bytes; \
                 {size_bytes} more would pass its quota of {} (volumes.max_bytes_per_key)",
                quota.max_bytes_per_key
            )));
        }
        let image = dir.join(format!("{name}.img"));
        // An image without a manifest is a creation cut short: this one replaces it.
        let _ = fs::remove_file(&image);
        let _ = fs::remove_file(dir.join(format!("{name}.upload")));
        let bounded = BoundedDir::create_image(&image, size_bytes, max_entries)
            .map_err(|e| bounded_error(e, name))?;
        let root = bounded.path();
        std::os::unix::fs::chown(&root, Some(OWNER_ID), Some(OWNER_ID))
            .and_then(|()| fs::set_permissions(&root, fs::Permissions::from_mode(0o755)))
            .map_err(io_err("chown", &root))?;
        drop(bounded);
        let info = VolumeInfo {
            name: name.into(),
            size_bytes,
            max_entries,
            created_at: now.into(),
        };
        let manifest = dir.join(format!("{name}.json"));
        let made = write_atomically(&manifest, &serde_json::to_vec_pretty(&info).expect("json"));
        if let Err(e) = made {
            let _ = fs::remove_file(&image);
            return Err(e);
        }
        Ok(info)
    }

    /// `owner`'s volumes, by name.
    pub fn list(&self, owner: &str) -> Result<Vec<VolumeInfo>, VolumeError> {
        let dir = self.owner_dir(owner)?;
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("read", &dir)(e)),
        };
        let mut volumes: Vec<VolumeInfo> = entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| serde_json::from_slice(&fs::read(e.path()).ok()?).ok())
            .collect();
        volumes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(volumes)
    }

    /// One of `owner`'s volumes.
    pub fn get(&self, owner: &str, name: &str) -> Result<VolumeInfo, VolumeError> {
        check_name(name).map_err(|_| VolumeError::Unknown(name.into()))?;
        let manifest = self.owner_dir(owner)?.join(format!("{name}.json"));
        match fs::read(&manifest) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| VolumeError::Io {
                what: "parse",
                path: manifest,
                source: io::Error::other(e),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(VolumeError::Unknown(name.into())),
            Err(e) => Err(io_err("read", &manifest)(e)),
        }
    }

    /// Who holds a mounted volume, if anyone: for [`VolumeError::InUse`].
    fn holders_of(open: &Open) -> Option<String> {
        let holders = open.holders.lock().unwrap_or_else(|e| e.into_inner());
        let all: Vec<&str> = holders
            .writer
            .iter()
            .chain(holders.readers.iter())
            .map(String::as_str)
            .collect();
        (!all.is_empty()).then(|| all.join(", "))
    }

    /// Deletes a volume nothing holds; [`VolumeError::InUse`] naming its holders otherwise.
    pub fn delete(&self, owner: &str, name: &str) -> Result<VolumeInfo, VolumeError> {
        let info = self.get(owner, name)?;
        let dir = self.owner_dir(owner)?;
        let slot = self.slot(owner, name);
        let mounted = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = mounted.upgrade() {
            return Err(VolumeError::InUse {
                name: name.into(),
                holders: Self::holders_of(&open).unwrap_or_else(|| "a request".into()),
            });
        }
        let _owner = lock_owner(&dir)?;
        let image = dir.join(format!("{name}.img"));
        // A mount that outlived its holders (a descriptor a sandbox passed on, not yet
        // closed): its blocks would stay taken after the quota let them go.
        if BoundedDir::image_in_use(&image) {
            return Err(VolumeError::InUse {
                name: name.into(),
                holders: "a mount that has not yet gone".into(),
            });
        }
        // Mounted by another process (the server, while the CLI deletes): its lock says so.
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&image)
            .map_err(io_err("open", &image))?;
        let _locked = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| VolumeError::InUse {
                name: name.into(),
                holders: "another process (a server or a command that has it mounted)".into(),
            })?;
        let manifest = dir.join(format!("{name}.json"));
        fs::remove_file(&manifest).map_err(io_err("remove", &manifest))?;
        fs::remove_file(&image).map_err(io_err("remove", &image))?;
        let _ = fs::remove_file(dir.join(format!("{name}.upload")));
        Ok(info)
    }

    /// A lease on `owner`'s volume `name` for `holder` (an execution or session id, or a file
    /// route's request): one writer at a time ([`VolumeError::Busy`] names the one there is).
    pub fn lease(
        &self,
        owner: &str,
        name: &str,
        access: Access,
        holder: &str,
    ) -> Result<Lease, VolumeError> {
        self.get(owner, name)?;
        self.available()?;
        let slot = self.slot(owner, name);
        // Only this volume's leases wait here (for a mount of it that has not yet gone).
        let mut mounted_now = slot.lock().unwrap_or_else(|e| e.into_inner());
        let mounted = match mounted_now.upgrade() {
            Some(mounted) => mounted,
            None => {
                // Deleted meanwhile, by a request that held the slot.
                self.get(owner, name)?;
                let dir = self.owner_dir(owner)?;
                let mounted = Arc::new(Open {
                    dir: mount_when_free(&dir.join(format!("{name}.img")), name)?,
                    holders: Mutex::new(Holders::default()),
                    pending: dir.join(format!("{name}.upload")),
                    names: RwLock::new(()),
                });
                // Before anything reads or counts it.
                undo_pending(mounted.dir.root(), &mounted.pending);
                *mounted_now = Arc::downgrade(&mounted);
                mounted
            }
        };
        drop(mounted_now);
        {
            let mut holders = mounted.holders.lock().unwrap_or_else(|e| e.into_inner());
            match access {
                Access::Write => {
                    if let Some(writer) = &holders.writer {
                        return Err(VolumeError::Busy {
                            name: name.into(),
                            holder: writer.clone(),
                        });
                    }
                    holders.writer = Some(holder.to_owned());
                }
                Access::Read => holders.readers.push(holder.to_owned()),
            }
        }
        Ok(Lease {
            open: mounted,
            access,
            holder: holder.to_owned(),
        })
    }

    /// How much of `owner`'s volume `name` is used (mounting it for a moment if nothing
    /// holds it).
    pub fn usage(&self, owner: &str, name: &str) -> Result<Usage, VolumeError> {
        let lease = self.lease(owner, name, Access::Read, "a usage query")?;
        let root = lease.open.dir.path();
        let st =
            nix::sys::statvfs::statvfs(&root).map_err(|e| io_err("statvfs", &root)(e.into()))?;
        let block = st.fragment_size();
        Ok(Usage {
            used_bytes: (st.blocks() - st.blocks_free()) * block,
            // ext4 keeps inodes 1 to 10 (the root is inode 2) for itself.
            used_entries: (st.files() - st.files_free()).saturating_sub(10),
        })
    }
}

/// An exclusive lock on one owner's volumes (`<owner>/.lock`), for as long as it is held:
/// creating and deleting take it, in whichever process.
fn lock_owner(dir: &Path) -> Result<nix::fcntl::Flock<fs::File>, VolumeError> {
    let path = dir.join(".lock");
    let file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io_err("open", &path))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| io_err("flock", &path)(e.into()))
}

/// Mounts the image at `image`, waiting (a while) for a mount of it that has not yet gone.
fn mount_when_free(image: &Path, name: &str) -> Result<BoundedDir, VolumeError> {
    let deadline = Instant::now() + BUSY_WAIT;
    loop {
        match BoundedDir::open_image(image) {
            Err(BoundedError::Busy(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.map_err(|e| bounded_error(e, name)),
        }
    }
}

fn bounded_error(e: BoundedError, name: &str) -> VolumeError {
    match e {
        BoundedError::Busy(_) => VolumeError::InUse {
            name: name.into(),
            holders: "a mount that has not yet gone (a previous run's)".into(),
        },
        e => VolumeError::Io {
            what: "mount",
            path: PathBuf::from(name),
            source: io::Error::other(e.to_string()),
        },
    }
}

/// Why volumes cannot be had on this host, if they cannot: they need ext4 on loop devices,
/// and an idmapped mount, which only root can make.
fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("airlock does not run as root (a volume is an idmapped ext4 mount)".into());
    }
    match airlock_sandbox::BoundedKind::here() {
        (airlock_sandbox::BoundedKind::Ext4Loop, _) => None,
        (_, why) => Some(format!("a volume needs ext4 on a loop device; here: {why}")),
    }
}

/// Writes `bytes` to `path` by a temporary file renamed over it, synced.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), VolumeError> {
    let tmp = path.with_extension("tmp");
    let written = write_synced(&tmp, bytes)
        .and_then(|()| fs::rename(&tmp, path))
        .and_then(|()| sync_name_of(path));
    written.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err("write", path)(e)
    })
}

/// Writes `bytes` to the file `path` (made, mode 0600, if missing), synced.
fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Syncs the directory that holds `path`: its name there is kept.
fn sync_name_of(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

// ---- the host's file routes: beneath the root, never through a link ----------------------

/// The longest path given to the kernel at once, below `PATH_MAX` (4096 with its NUL): a
/// longer one (a tree made deeper by a sandbox, a piece at a time) is resolved in pieces, each
/// beneath the directory the last one reached.
const PATH_PIECE: usize = 4000;

/// `openat2` beneath `dir`: no `..` out, no symbolic link (nor magic link) anywhere on the
/// way, no other mount; a path of any length.
fn open_beneath(
    dir: impl AsFd,
    path: impl AsRef<std::ffi::OsStr>,
    flags: OFlag,
    mode: Mode,
) -> nix::Result<OwnedFd> {
    let how = |flags: OFlag, mode: Mode| {
        OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .mode(mode)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            )
    };
    let mut rest = path.as_ref().as_bytes();
    let mut reached: Option<OwnedFd> = None;
    while rest.len() > PATH_PIECE {
        let cut = rest[..=PATH_PIECE]
            .iter()
            .rposition(|&b| b == b'/')
            .filter(|&cut| cut > 0)
            .ok_or(nix::Error::ENAMETOOLONG)?;
        let piece = std::ffi::OsStr::from_bytes(&rest[..cut]);
        let at = reached.as_ref().map_or(dir.as_fd(), |fd| fd.as_fd());
        let directory = how(OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty());
        let next = nix::fcntl::openat2(at, piece, directory)?;
        reached = Some(next);
        rest = &rest[cut + 1..];
    }
    let at = reached.as_ref().map_or(dir.as_fd(), |fd| fd.as_fd());
    nix::fcntl::openat2(at, std::ffi::OsStr::from_bytes(rest), how(flags, mode))
}

fn kind_of(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => "file",
        SFlag::S_IFDIR => "dir",
        SFlag::S_IFLNK => "link",
        _ => "other",
    }
}

fn file_error<'a>(
    path: &'a str,
    wanted: &'static str,
) -> impl FnOnce(nix::Error) -> VolumeError + 'a {
    move |e| match e {
        nix::Error::ENOENT => VolumeError::NoFile(path.into()),
        nix::Error::ELOOP
        | nix::Error::ENOTDIR
        | nix::Error::EXDEV
        | nix::Error::ENXIO
        | nix::Error::ENODEV
        | nix::Error::EISDIR
        | nix::Error::EWOULDBLOCK => VolumeError::NotA {
            path: path.into(),
            wanted,
        },
        nix::Error::ENOSPC | nix::Error::EDQUOT => VolumeError::Full,
        e => VolumeError::Io {
            what: "open",
            path: PathBuf::from(path),
            source: e.into(),
        },
    }
}

fn check_path(path: &str) -> Result<(), VolumeError> {
    check_relative_path(path).map_err(|message| VolumeError::Invalid {
        field: "path",
        message,
    })
}

/// What an upload is about to make, noted (`<name>.upload`, synced) before it makes any of
/// it, and removed once it is done or undone: a crash between leaves this for the next mount
/// to undo.
#[derive(Debug, Serialize, Deserialize)]
struct Pending {
    /// The directory of the file, relative to the root (`""`: the root).
    dir: String,
    /// How many of `dir`'s parts were there before: the upload makes the rest.
    existing: usize,
    /// The name its file takes beside the one it replaces, until it is renamed over it.
    temporary: Option<String>,
}

impl Pending {
    fn parts(&self) -> Vec<&str> {
        if self.dir.is_empty() {
            Vec::new()
        } else {
            self.dir.split('/').collect()
        }
    }

    fn note(&self, at: &Path) -> Result<(), VolumeError> {
        write_synced(at, &serde_json::to_vec(self).expect("json"))
            .and_then(|()| sync_name_of(at))
            .map_err(io_err("write", at))
    }
}

/// Undoes what the upload noted at `at` made, if it left a note (a crash cut it short): its
/// file under its temporary name, then the directories it made, deepest first, while they
/// are empty. A file it finished is kept, and so is any directory that holds one.
fn undo_pending(root: BorrowedFd<'_>, at: &Path) {
    let Ok(noted) = fs::read(at) else {
        return;
    };
    // A note cut short was written before anything was made.
    if let Ok(pending) = serde_json::from_slice::<Pending>(&noted) {
        let parts = pending.parts();
        let dir = |n: usize| match n {
            0 => open_beneath(root, ".", OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()),
            n => open_beneath(
                root,
                parts[..n].join("/"),
                OFlag::O_PATH | OFlag::O_DIRECTORY,
                Mode::empty(),
            ),
        };
        if pending.dir.is_empty() || check_relative_path(&pending.dir).is_ok() {
            if let (Some(name), Ok(fd)) = (&pending.temporary, dir(parts.len())) {
                remove_file_named(&fd, name);
            }
            for n in (pending.existing..parts.len()).rev() {
                let removed = dir(n).and_then(|fd| {
                    nix::unistd::unlinkat(&fd, parts[n], nix::unistd::UnlinkatFlags::RemoveDir)
                });
                // One it never got to make is not there: the ones above it may be. One that
                // is not empty holds more than the upload: so do those above it.
                match removed {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(_) => break,
                }
            }
        }
    }
    let _ = fs::remove_file(at);
}

/// Removes the regular file `name` of `dir`, if it is one.
fn remove_file_named(dir: &OwnedFd, name: &str) {
    let st = nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
    if st.is_ok_and(|st| kind_of(&st) == "file") {
        let _ = nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
}

/// A name for an upload's file beside the one it replaces, free in `dir`: no listing shows
/// it (see [`Open::names`]), and nothing but this upload writes the volume meanwhile.
fn temporary_name(dir: &OwnedFd) -> Result<String, VolumeError> {
    loop {
        let mut random = [0u8; 16];
        getrandom::fill(&mut random)
            .map_err(|e| io_err("getrandom", Path::new("."))(io::Error::other(e.to_string())))?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!(".airlock-upload-{hex}");
        match nix::sys::stat::fstatat(dir, name.as_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        {
            Err(nix::Error::ENOENT) => return Ok(name),
            Ok(_) => continue,
            Err(e) => return Err(file_error(".", "directory")(e)),
        }
    }
}

/// A write's error: no room is [`VolumeError::Full`].
fn write_error(path: &str) -> impl FnOnce(io::Error) -> VolumeError + '_ {
    move |e| match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => VolumeError::Full,
        _ => io_err("write", Path::new(path))(e),
    }
}

impl Lease {
    /// The volume's root, as a descriptor to resolve beneath.
    fn root(&self) -> BorrowedFd<'_> {
        self.open.dir.root()
    }

    /// The regular file at `path`, at most `max_bytes` of it (more is an error).
    pub fn read_file(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, VolumeError> {
        check_path(path)?;
        let root = self.root();
        // Non-blocking, so that a FIFO left there cannot hold the request.
        let fd = open_beneath(
            root,
            path,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .map_err(file_error(path, "file"))?;
        let st = nix::sys::stat::fstat(&fd).map_err(file_error(path, "file"))?;
        if kind_of(&st) != "file" {
            return Err(VolumeError::NotA {
                path: path.into(),
                wanted: "file",
            });
        }
        if st.st_size as u64 > max_bytes {
            return Err(VolumeError::Invalid {
                field: "path",
                message: format!(
                    "{path:?} is {} bytes, more than the {max_bytes} a download may hold",
                    st.st_size
                ),
            });
        }
        let mut data = Vec::with_capacity(st.st_size as usize);
        fs::File::from(fd)
            .take(max_bytes + 1)
            .read_to_end(&mut data)
            .map_err(|e| io_err("read", Path::new(path))(e))?;
        if data.len() as u64 > max_bytes {
            return Err(VolumeError::Invalid {
                field: "path",
                message: format!("{path:?} grew past the {max_bytes} a download may hold"),
            });
        }
        Ok(data)
    }

    /// Writes `data` to `path`, owned by the sandbox's uid: written whole into a file no
    /// directory names (`O_TMPFILE`), then the missing directories made, then linked at `path`
    /// or, where a file is, renamed over it (keeping its permissions). A write refused or
    /// failed at any step ([`VolumeError::Full`] where the volume has no room) leaves the
    /// volume as it was: the file it would replace, and no directory it made.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<(), VolumeError> {
        check_path(path)?;
        let (parent, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (parent, name),
            None => ("", path),
        };
        let parts: Vec<&str> = parent.split('/').filter(|p| !p.is_empty()).collect();
        // The directories there are; the rest are made once the bytes are written.
        let mut dir = open_beneath(
            self.root(),
            ".",
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .map_err(file_error(".", "directory"))?;
        let mut existing = 0;
        for part in &parts {
            match open_beneath(
                &dir,
                part,
                OFlag::O_PATH | OFlag::O_DIRECTORY,
                Mode::empty(),
            ) {
                Ok(next) => dir = next,
                Err(nix::Error::ENOENT) => break,
                Err(e) => return Err(file_error(path, "directory")(e)),
            }
            existing += 1;
        }
        // The file it replaces: a regular file only, never a link, a directory or a FIFO.
        let replaced = if existing < parts.len() {
            None
        } else {
            match nix::sys::stat::fstatat(&dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if kind_of(&st) == "file" => Some(st),
                Ok(_) => {
                    return Err(VolumeError::NotA {
                        path: path.into(),
                        wanted: "file",
                    })
                }
                Err(nix::Error::ENOENT) => None,
                Err(e) => return Err(file_error(path, "file")(e)),
            }
        };

        let file = open_beneath(
            &dir,
            ".",
            OFlag::O_TMPFILE | OFlag::O_WRONLY,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(file_error(path, "file"))?;
        nix::unistd::fchown(&file, Some(OWNER_ID.into()), Some(OWNER_ID.into()))
            .map_err(file_error(path, "file"))?;
        if let Some(old) = &replaced {
            // Its permission bits; never a set-id bit.
            nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(old.st_mode & 0o777))
                .map_err(file_error(path, "file"))?;
        }
        let mut file = fs::File::from(file);
        file.write_all(data)
            .and_then(|()| file.sync_all())
            .map_err(write_error(path))?;

        let pending = Pending {
            dir: parent.to_owned(),
            existing,
            temporary: replaced
                .is_some()
                .then(|| temporary_name(&dir))
                .transpose()?,
        };
        // Only what leaves a name behind needs noting: a new file linked where its
        // directory was is there whole or not at all.
        let noted = existing < parts.len() || pending.temporary.is_some();
        if noted {
            pending.note(&self.open.pending)?;
        }
        let placed = self.place(&file, dir, &parts[existing..], name, &pending);
        if noted {
            let _ = fs::remove_file(&self.open.pending);
        }
        placed.map_err(|e| match e {
            nix::Error::ENOSPC | nix::Error::EDQUOT => VolumeError::Full,
            e => io_err("write", Path::new(path))(e.into()),
        })
    }

    /// Makes the directories `missing` below `dir`, then links `file` there as `name` (by way
    /// of its temporary name, renamed over the file it replaces, where there is one). On any
    /// error, undoes what it made.
    fn place(
        &self,
        file: &fs::File,
        mut dir: OwnedFd,
        missing: &[&str],
        name: &str,
        pending: &Pending,
    ) -> nix::Result<()> {
        let mut made: Vec<(OwnedFd, &str)> = Vec::new();
        let undo = |made: &[(OwnedFd, &str)]| {
            for (parent, part) in made.iter().rev() {
                let removed =
                    nix::unistd::unlinkat(parent, *part, nix::unistd::UnlinkatFlags::RemoveDir);
                if removed.is_err() {
                    break;
                }
            }
        };
        for part in missing {
            let made_one = nix::sys::stat::mkdirat(&dir, *part, Mode::from_bits_truncate(0o755))
                .and_then(|()| {
                    let child = open_beneath(
                        &dir,
                        part,
                        OFlag::O_PATH | OFlag::O_DIRECTORY,
                        Mode::empty(),
                    );
                    nix::unistd::fchownat(
                        &dir,
                        *part,
                        Some(OWNER_ID.into()),
                        Some(OWNER_ID.into()),
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .and(child)
                });
            match made_one {
                Ok(child) => {
                    made.push((dir, part));
                    dir = child;
                }
                Err(e) => {
                    // A directory made but not opened is still this upload's.
                    let _ =
                        nix::unistd::unlinkat(&dir, *part, nix::unistd::UnlinkatFlags::RemoveDir);
                    undo(&made);
                    return Err(e);
                }
            }
        }
        let unnamed = format!("/proc/self/fd/{}", file.as_raw_fd());
        let link = |to: &str| {
            nix::unistd::linkat(
                nix::fcntl::AT_FDCWD,
                unnamed.as_str(),
                &dir,
                to,
                nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
            )
        };
        let linked = match &pending.temporary {
            None => link(name),
            Some(temporary) => {
                let _listings_wait = self.open.names.write().unwrap_or_else(|e| e.into_inner());
                link(temporary).and_then(|()| {
                    nix::fcntl::renameat(&dir, temporary.as_str(), &dir, name).inspect_err(|_| {
                        let _ = nix::unistd::unlinkat(
                            &dir,
                            temporary.as_str(),
                            nix::unistd::UnlinkatFlags::NoRemoveDir,
                        );
                    })
                })
            }
        };
        if let Err(e) = linked {
            undo(&made);
            return Err(e);
        }
        // The new name, durable before the upload is said to be written.
        open_beneath(
            &dir,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .and_then(|d| nix::unistd::fsync(&d))
    }

    /// Removes the file, link or empty directory at `path` (a link itself, never its target).
    pub fn remove(&self, path: &str) -> Result<(), VolumeError> {
        check_path(path)?;
        let root = self.root();
        let (dir, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (
                open_beneath(
                    root,
                    parent,
                    OFlag::O_PATH | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )
                .map_err(file_error(path, "directory"))?,
                name,
            ),
            None => (
                open_beneath(root, ".", OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
                    .map_err(file_error(path, "directory"))?,
                path,
            ),
        };
        let st = nix::sys::stat::fstatat(&dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(file_error(path, "file"))?;
        let how = if kind_of(&st) == "dir" {
            nix::unistd::UnlinkatFlags::RemoveDir
        } else {
            nix::unistd::UnlinkatFlags::NoRemoveDir
        };
        nix::unistd::unlinkat(&dir, name, how).map_err(|e| match e {
            nix::Error::ENOTEMPTY => VolumeError::Invalid {
                field: "path",
                message: format!("{path:?} is a directory that is not empty"),
            },
            e => file_error(path, "file")(e),
        })
    }

    /// Entries of the volume, depth first, links listed and never followed: at most `max`
    /// of them and `max_bytes` of paths (each directory read as it goes, never whole), then
    /// `truncated`. Paths of any length are listed (a deep tree is walked a piece at a time).
    /// A name that is not UTF-8 is listed with U+FFFD in its place and `lossy`; an entry that
    /// cannot be looked at, or a directory whose entries cannot be read, is listed
    /// `unreadable` (and what it holds is not).
    pub fn list_files(&self, max: usize, max_bytes: usize) -> Result<Listing, VolumeError> {
        let _no_upload_renames = self.open.names.read().unwrap_or_else(|e| e.into_inner());
        let root = self.root();
        let mut out: Vec<VolumeFile> = Vec::new();
        let mut bytes = 0usize;
        // Directories still to read: raw path, path shown, lossy, and their entry in `out`.
        let mut stack: Vec<(Vec<u8>, String, bool, Option<usize>)> =
            vec![(Vec::new(), String::new(), false, None)];
        let mut truncated = false;
        'walk: while let Some((raw_prefix, prefix, prefix_lossy, entry)) = stack.pop() {
            let at: &[u8] = if raw_prefix.is_empty() {
                b"."
            } else {
                &raw_prefix
            };
            let opened = open_beneath(
                root,
                std::ffi::OsStr::from_bytes(at),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            );
            // Each entry is looked at from its own directory's descriptor: a directory
            // swapped for a link meanwhile leads nowhere.
            let entries = opened.map_err(io::Error::from).and_then(|fd| {
                let listing = format!("/proc/self/fd/{}", fd.as_raw_fd());
                fs::read_dir(listing).map(|entries| (fd, entries))
            });
            let (fd, entries) = match (entries, entry) {
                (Ok(read), _) => read,
                (Err(_), Some(i)) => {
                    out[i].unreadable = true;
                    continue;
                }
                (Err(e), None) => return Err(io_err("read", Path::new("."))(e)),
            };
            for read in entries {
                let Ok(dirent) = read else {
                    if let Some(i) = entry {
                        out[i].unreadable = true;
                    }
                    break;
                };
                let name = dirent.file_name();
                let lossy = prefix_lossy || name.to_str().is_none();
                let shown = name.to_string_lossy();
                let path = if prefix.is_empty() {
                    shown.to_string()
                } else {
                    format!("{prefix}/{shown}")
                };
                let looked = nix::sys::stat::fstatat(
                    &fd,
                    name.as_os_str(),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                );
                let st = match looked {
                    Ok(st) => Some(st),
                    // Removed meanwhile.
                    Err(nix::Error::ENOENT) => continue,
                    Err(_) => None,
                };
                if out.len() >= max || bytes + path.len() > max_bytes {
                    truncated = true;
                    break 'walk;
                }
                bytes += path.len();
                let kind = st.as_ref().map_or("other", kind_of);
                if kind == "dir" {
                    let mut raw = raw_prefix.clone();
                    if !raw.is_empty() {
                        raw.push(b'/');
                    }
                    raw.extend_from_slice(name.as_bytes());
                    stack.push((raw, path.clone(), lossy, Some(out.len())));
                }
                out.push(VolumeFile {
                    path,
                    kind: kind.into(),
                    size: match &st {
                        Some(st) if kind == "file" => st.st_size as u64,
                        _ => 0,
                    },
                    lossy,
                    unreadable: st.is_none(),
                });
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Listing {
            files: out,
            truncated,
        })
    }
}
