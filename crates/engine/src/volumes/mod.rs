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
//!   file in place of another): what it is about to make (`Pending`, in `files.rs`). One left
//!   by a crash is undone when the volume is next mounted, before anything reads or counts it.
//!
//! A volume is mounted (on the host, detached) while something holds a [`Lease`] on it: a
//! sandbox that mounts it, or a file route that reads or writes it. One mount at a time:
//! every lease shares it, and a new one waits out a mount that has not yet gone. At most one
//! writer holds it at a time; readers any number. Its files belong to uid 1000 on its own file
//! system, which each sandbox sees as itself (an idmapped mount); the host reaches them only
//! by `openat2` beneath its root, never following a link.

mod files;
mod lease;
mod volume;

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use airlock_sandbox::{BoundedDir, BoundedError};

use crate::durable::{open_lock_file, write_aside, Place};
use crate::storage::{Account, Kept, Storage, Whose};
use files::undo_pending;
pub use files::{Listing, VolumeFile};
pub use lease::{Access, JobVolume, Lease};
use lease::{Holders, Open};
use volume::io_err;
pub use volume::{
    check_name, Quota, Usage, VolumeError, VolumeInfo, MAX_NAME, MIN_BYTES, OWNER_ID,
};

/// How long a new lease waits for a mount of the same volume that has not yet gone.
const BUSY_WAIT: Duration = Duration::from_secs(5);

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
}

type Slot = Arc<Mutex<Weak<Open>>>;

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
        }
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

    /// Makes a volume of `size_bytes` and `max_entries` for `owner`, within `quota`, its
    /// bytes held in the key's `storage` (beside its paused sessions) before its image is
    /// made, and counted from its manifest once that is written.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        owner: &str,
        name: &str,
        size_bytes: u64,
        max_entries: u64,
        quota: &Quota,
        now: &str,
        storage: &Storage,
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
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_err("create", &dir))?;
        // Another process (the CLI beside the server) makes the same key's volumes.
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
        let _held = storage
            .reserve(owner, Account::Stored, size_bytes)
            .map_err(|r| {
                VolumeError::Quota(format!(
                    "this key's storage (its volumes and paused sessions) holds {} bytes; \
                     {size_bytes} more would pass its quota of {} (volumes.max_bytes_per_key)",
                    r.used, r.quota
                ))
            })?;
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
        let json = serde_json::to_vec_pretty(&info).expect("json");
        if let Err(e) = write_aside(&manifest, &json, Place::Replace) {
            let _ = fs::remove_file(&image);
            return Err(io_err("write", &manifest)(e));
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

/// A key's volumes count in full from their manifests, which processes beside this one (the
/// CLI beside the server) write too: read at each count.
impl Kept for Volumes {
    fn kept(&self, whose: Whose<'_>) -> u64 {
        match whose {
            Whose::Key(owner) => self
                .list(owner)
                .unwrap_or_default()
                .iter()
                .map(|v| v.size_bytes)
                .sum(),
            Whose::Operator => 0,
        }
    }
}

/// An exclusive lock on one owner's volumes (`<owner>/.lock`), for as long as it is held:
/// creating and deleting take it, in whichever process.
fn lock_owner(dir: &Path) -> Result<nix::fcntl::Flock<fs::File>, VolumeError> {
    let path = dir.join(".lock");
    let file = open_lock_file(&path).map_err(io_err("open", &path))?;
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
