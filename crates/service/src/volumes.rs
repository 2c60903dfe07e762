//! The volume service: a key's volumes made, listed, shown and deleted; their files written,
//! read, listed and removed without a sandbox; and the volumes an execution or a session
//! names, leased for as long as its sandbox lives. Each is audited.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use airlock_api::VolumeMountRequest;
use airlock_engine::volumes::{
    Access, JobVolume, Lease, Usage, VolumeError, VolumeFile, VolumeInfo,
};

use crate::body::{parse_json, read_body, read_body_as, Body};
use crate::error::{Error, Kind};
use crate::keys::Key;
use crate::services::refuse_if_unavailable;
use crate::services::SharedServices;

/// Most volumes one execution or session mounts.
pub const MAX_MOUNTS: usize = 8;
/// Where volumes may be mounted: below these scratch mount points.
const MOUNT_ROOTS: [&str; 2] = [airlock_engine::WORKDIR, "/tmp"];

/// `POST /v1/volumes`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or a digit.
    pub name: String,
    /// Its size: the most its files may hold (bounded while they are written), counted in
    /// full against the key's quota.
    pub size_bytes: u64,
    /// The most entries (files, directories, links) it may hold; default one per 16 KiB of
    /// its size, at least 1024.
    #[serde(default)]
    pub max_entries: Option<u64>,
}

/// `GET /v1/volumes/{name}`: the volume and what it holds now.
#[derive(Debug, Serialize)]
pub struct VolumeShown {
    #[serde(flatten)]
    pub info: VolumeInfo,
    #[serde(flatten)]
    pub usage: Usage,
}

/// Entries a listing holds at most, and bytes of their paths.
const MAX_LISTED: usize = 10_000;
const MAX_LISTED_BYTES: usize = 4 << 20;

/// `GET /v1/volumes/{name}/files`.
#[derive(Debug, Serialize)]
pub struct VolumeFiles {
    pub files: Vec<VolumeFile>,
    /// There were more entries than a listing holds (10,000, or 4 MiB of paths).
    pub truncated: bool,
}

#[derive(Serialize)]
struct VolumeEvent<'a> {
    event: &'static str,
    volume: &'a str,
    key_fingerprint: &'a str,
    #[serde(flatten)]
    details: Details<'a>,
    at: String,
}

/// What an audit line of a volume says besides what happened to which.
#[derive(Default, Serialize)]
struct Details<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    read_only: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size_bytes: Option<u64>,
}

fn audit(state: &SharedServices, key: &Key, event: &'static str, volume: &str, details: Details) {
    let line = VolumeEvent {
        event,
        volume,
        key_fingerprint: &key.fingerprint(),
        details,
        at: now(),
    };
    // A line that cannot be written is kept, and written when the log can be again.
    let _ = state.audit.append_event(&line);
}

fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

pub fn volume_error(e: VolumeError) -> Error {
    let message = e.to_string();
    match e {
        VolumeError::Unknown(_) | VolumeError::NoFile(_) => {
            Error::new(Kind::NotFound, "not_found", message)
        }
        VolumeError::Invalid { field, .. } => Error::invalid(field, message),
        VolumeError::NotA { .. } => Error::invalid("path", message),
        VolumeError::Exists(_) => Error::new(Kind::Conflict, "conflict", message),
        VolumeError::Busy { .. } => Error::new(Kind::Conflict, "volume_busy", message),
        VolumeError::InUse { .. } => Error::new(Kind::Conflict, "volume_in_use", message),
        VolumeError::Quota(_) => Error::new(Kind::TooLarge, "quota_exceeded", message),
        VolumeError::Full => Error::new(Kind::TooLarge, "volume_full", message),
        VolumeError::Unavailable(_) => {
            Error::new(Kind::Unprocessable, "volumes_unavailable", message)
        }
        VolumeError::Io { .. } => {
            tracing::error!(error = %message, "volume store");
            Error::internal(format!("the volume store failed: {message}"))
        }
    }
}

/// Runs `f` on a blocking thread (volumes are mounted, read and written there).
async fn blocking<T: Send + 'static>(
    state: &SharedServices,
    f: impl FnOnce(&SharedServices) -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let st = state.clone();
    tokio::task::spawn_blocking(move || f(&st))
        .await
        .map_err(|e| Error::internal(format!("a volume operation failed: {e}")))?
}

/// `POST /v1/volumes`.
pub async fn create(
    state: &SharedServices,
    key: &Arc<Key>,
    body: Body,
) -> Result<VolumeInfo, Error> {
    refuse_if_unavailable(state)?;
    let read = read_body(state, key, body).await?;
    let asked: CreateVolume = parse_json(state, &read.bytes)?;
    drop(read);
    let key = key.clone();
    blocking(state, move |state| {
        let entries = asked
            .max_entries
            .unwrap_or((asked.size_bytes / (16 << 10)).max(1024))
            .min(state.config.volumes.max_entries);
        let info = state
            .volumes
            .create(
                &key.fingerprint(),
                &asked.name,
                asked.size_bytes,
                entries,
                &state.config.volumes.quota(),
                &now(),
                &state.storage,
            )
            .map_err(volume_error)?;
        let details = Details {
            size_bytes: Some(info.size_bytes),
            ..Details::default()
        };
        audit(state, &key, "volume_created", &info.name, details);
        Ok(info)
    })
    .await
}

/// `GET /v1/volumes`.
pub async fn list(state: &SharedServices, key: &Key) -> Result<Vec<VolumeInfo>, Error> {
    let owner = key.fingerprint();
    blocking(state, move |state| {
        state.volumes.list(&owner).map_err(volume_error)
    })
    .await
}

/// `GET /v1/volumes/{name}`.
pub async fn get(state: &SharedServices, key: &Key, name: String) -> Result<VolumeShown, Error> {
    let owner = key.fingerprint();
    blocking(state, move |state| {
        let info = state.volumes.get(&owner, &name).map_err(volume_error)?;
        let usage = state.volumes.usage(&owner, &name).map_err(volume_error)?;
        Ok(VolumeShown { info, usage })
    })
    .await
}

/// `DELETE /v1/volumes/{name}`: refused while anything holds it.
pub async fn delete(state: &SharedServices, key: &Arc<Key>, name: String) -> Result<(), Error> {
    let key = key.clone();
    blocking(state, move |state| {
        let info = state
            .volumes
            .delete(&key.fingerprint(), &name)
            .map_err(volume_error)?;
        audit(
            state,
            &key,
            "volume_deleted",
            &info.name,
            Details::default(),
        );
        Ok(())
    })
    .await
}

/// A lease for a file route, named after the request.
fn lease_for_route(
    state: &SharedServices,
    key: &Key,
    name: &str,
    access: Access,
) -> Result<Lease, Error> {
    state
        .volumes
        .lease(&key.fingerprint(), name, access, "a file request")
        .map_err(volume_error)
}

/// `PUT /v1/volumes/{name}/files/{path}`: the body becomes the file (one writer at a time).
pub async fn put_file(
    state: &SharedServices,
    key: &Arc<Key>,
    name: String,
    path: String,
    body: Body,
) -> Result<(), Error> {
    refuse_if_unavailable(state)?;
    airlock_engine::check_relative_path(&path).map_err(|m| Error::invalid("path", m))?;
    state
        .volumes
        .get(&key.fingerprint(), &name)
        .map_err(volume_error)?; // 404 before the body is read
    let body = read_body_as(state, key, body, false).await?;
    let key = key.clone();
    blocking(state, move |state| {
        let lease = lease_for_route(state, &key, &name, Access::Write)?;
        lease.write_file(&path, &body.bytes).map_err(volume_error)?;
        drop(lease);
        let details = Details {
            path: Some(&path),
            size_bytes: Some(body.bytes.len() as u64),
            ..Details::default()
        };
        audit(state, &key, "volume_file_written", &name, details);
        Ok(())
    })
    .await
}

/// `GET /v1/volumes/{name}/files/{path}`: a regular file's contents, up to
/// `http.max_body_bytes`; a link is never followed.
pub async fn read_file(
    state: &SharedServices,
    key: &Key,
    name: String,
    path: String,
) -> Result<Vec<u8>, Error> {
    airlock_engine::check_relative_path(&path).map_err(|m| Error::invalid("path", m))?;
    let owner = key.fingerprint();
    blocking(state, move |state| {
        let lease = state
            .volumes
            .lease(&owner, &name, Access::Read, "a file request")
            .map_err(volume_error)?;
        lease
            .read_file(&path, state.config.http.max_body_bytes)
            .map_err(volume_error)
    })
    .await
}

/// `GET /v1/volumes/{name}/files`.
pub async fn files(state: &SharedServices, key: &Key, name: String) -> Result<VolumeFiles, Error> {
    let owner = key.fingerprint();
    blocking(state, move |state| {
        let lease = state
            .volumes
            .lease(&owner, &name, Access::Read, "a file request")
            .map_err(volume_error)?;
        let listing = lease
            .list_files(MAX_LISTED, MAX_LISTED_BYTES)
            .map_err(volume_error)?;
        Ok(VolumeFiles {
            files: listing.files,
            truncated: listing.truncated,
        })
    })
    .await
}

/// `DELETE /v1/volumes/{name}/files/{path}`: a file, a link or an empty directory.
pub async fn remove_file(
    state: &SharedServices,
    key: &Arc<Key>,
    name: String,
    path: String,
) -> Result<(), Error> {
    refuse_if_unavailable(state)?;
    airlock_engine::check_relative_path(&path).map_err(|m| Error::invalid("path", m))?;
    let key = key.clone();
    blocking(state, move |state| {
        let lease = lease_for_route(state, &key, &name, Access::Write)?;
        lease.remove(&path).map_err(volume_error)?;
        drop(lease);
        let details = Details {
            path: Some(&path),
            ..Details::default()
        };
        audit(state, &key, "volume_file_removed", &name, details);
        Ok(())
    })
    .await
}

/// The volumes a request names, checked and leased for `holder` (its execution or session):
/// each at most once, below `/work` or `/tmp`, apart from the others; a writer's lease is
/// the only one ([`VolumeError::Busy`], 409, names the holder). Blocking (a volume may be
/// mounted now).
pub fn mounts(
    state: &SharedServices,
    key: &Key,
    holder: &str,
    asked: &[VolumeMountRequest],
) -> Result<Vec<JobVolume>, Error> {
    if asked.is_empty() {
        return Ok(Vec::new());
    }
    if asked.len() > MAX_MOUNTS {
        return Err(Error::invalid(
            "volumes",
            format!(
                "{} volumes named; at most {MAX_MOUNTS} may be mounted",
                asked.len()
            ),
        ));
    }
    for (i, v) in asked.iter().enumerate() {
        let field = format!("volumes[{i}].path");
        let path = std::path::Path::new(&v.path);
        let below = MOUNT_ROOTS.iter().any(|root| {
            v.path
                .strip_prefix(root)
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|rest| airlock_engine::check_relative_path(rest).is_ok())
        });
        if !below || !path.is_absolute() {
            return Err(Error::invalid(
                field,
                format!(
                    "volume path {:?} must be an absolute path below /work or /tmp, without \
                     `.`, `..` or empty parts",
                    v.path
                ),
            ));
        }
        for (j, other) in asked[..i].iter().enumerate() {
            if other.name == v.name {
                return Err(Error::invalid(
                    format!("volumes[{i}].name"),
                    format!("volume {:?} is named twice (also volumes[{j}])", v.name),
                ));
            }
            let (a, b) = (std::path::Path::new(&other.path), path);
            if a.starts_with(b) || b.starts_with(a) {
                return Err(Error::invalid(
                    field,
                    format!("volume paths {:?} and {:?} overlap", other.path, v.path),
                ));
            }
        }
    }
    let owner = key.fingerprint();
    let mut leased = Vec::with_capacity(asked.len());
    for (i, v) in asked.iter().enumerate() {
        let access = if v.read_only {
            Access::Read
        } else {
            Access::Write
        };
        let lease = state
            .volumes
            .lease(&owner, &v.name, access, holder)
            .map_err(|e| volume_error(e).field(format!("volumes[{i}].name")))?;
        leased.push(JobVolume {
            lease,
            target: v.path.clone().into(),
        });
    }
    for v in asked {
        let details = Details {
            holder: Some(holder),
            path: Some(&v.path),
            read_only: Some(v.read_only),
            ..Details::default()
        };
        audit(state, key, "volume_mounted", &v.name, details);
    }
    Ok(leased)
}
