//! The host's file routes on a leased volume: read, write, remove and list its files, each
//! resolved beneath its root (`openat2`), never through a link; an upload noted before it
//! makes anything, and undone at the next mount when a crash cut it short.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use serde::{Deserialize, Serialize};

use super::lease::Lease;
use super::volume::{io_err, VolumeError, OWNER_ID};
use crate::durable::sync_dir_of;
use crate::paths::check_relative_path;

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

    /// Written in place, not aside (`durable::write_aside`): a note cut short is one
    /// written before anything was made, and [`undo_pending`] passes it over.
    fn note(&self, at: &Path) -> Result<(), VolumeError> {
        write_synced(at, &serde_json::to_vec(self).expect("json"))
            .and_then(|()| sync_dir_of(at))
            .map_err(io_err("write", at))
    }
}

/// Writes `bytes` to the file `path` (made, mode 0600, if missing), synced.
pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
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

/// Undoes what the upload noted at `at` made, if it left a note (a crash cut it short): its
/// file under its temporary name, then the directories it made, deepest first, while they
/// are empty. A file it finished is kept, and so is any directory that holds one.
pub(super) fn undo_pending(root: BorrowedFd<'_>, at: &Path) {
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
/// it (see [`Open::names`](super::lease::Open::names)), and nothing but this upload writes the volume meanwhile.
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
    /// volume as it was: the file it would replace, and no directory it made. (Not
    /// `durable::write_aside`, which works by paths: here every step is taken beneath the
    /// volume's root, whose tree a sandbox makes, and the file has no name until it is whole.)
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
