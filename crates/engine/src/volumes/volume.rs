//! A volume as the store keeps it: its name, manifest, size and quota, the errors every
//! part of the volumes answers with.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::policy::SANDBOX_UID;

/// Who owns the files on a volume's file system: the sandbox's uid and gid.
pub const OWNER_ID: u32 = SANDBOX_UID;
/// Longest volume name.
pub const MAX_NAME: usize = 64;
/// Smallest volume: room for ext4's journal and a few files.
pub const MIN_BYTES: u64 = 8 << 20;

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

pub(super) fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> VolumeError + 'a {
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

/// Bounds on one key's volumes (the server's `[volumes]`; the sum of their sizes is the
/// key's storage's, `storage::Quotas::stored`).
#[derive(Clone, Copy, Debug)]
pub struct Quota {
    pub max_volumes_per_key: usize,
    /// Largest single volume.
    pub max_size_bytes: u64,
    /// Most entries a volume may be made with.
    pub max_entries: u64,
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
