//! A lease: a hold on a mounted volume (one mount for all its holders, one writer at a time),
//! and the volume a job mounts with its lease.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use airlock_sandbox::{BoundedDir, VolumeMount};

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// A mounted volume and who holds it.
#[derive(Debug)]
pub(super) struct Open {
    pub(super) dir: BoundedDir,
    pub(super) holders: Mutex<Holders>,
    /// Where an upload notes what it is about to make (`<name>.upload`).
    pub(super) pending: PathBuf,
    /// Held to read (a listing's walk) and to write (an upload's file linked under its
    /// temporary name and renamed over the old one): a listing never sees that name.
    pub(super) names: RwLock<()>,
}

#[derive(Debug, Default)]
pub(super) struct Holders {
    pub(super) writer: Option<String>,
    pub(super) readers: Vec<String>,
}

/// A hold on a mounted volume: while any exists, the volume stays mounted (one mount for
/// all). A writer's lease is the only writer's. Dropped only once whatever mounted it (a
/// sandbox) is gone.
#[derive(Debug)]
pub struct Lease {
    pub(super) open: Arc<Open>,
    pub(super) access: Access,
    pub(super) holder: String,
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
