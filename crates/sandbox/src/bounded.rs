//! A directory whose bytes and entries the kernel bounds while it is written: a file system of
//! its own, of a fixed size and inode count, mounted detached (in no mount namespace's table,
//! so a crashed host leaves no mount behind). A sandbox writes into it through a bind mount
//! ([`BoundedDir::bind_source`] as a [`crate::RootEntry`]'s source); the host reads it through
//! [`BoundedDir::path`].
//!
//! Two kinds, chosen by [`BoundedKind::here`]:
//! - [`BoundedKind::Ext4Loop`]: ext4 (`mkfs.ext4 -m 0 -N inodes`) on a loop device backed by a
//!   sparse image file of the size, unlinked from its creation (`O_TMPFILE`) and detached by
//!   the kernel with the mount's last descriptor (`LO_FLAGS_AUTOCLEAR`). The image never
//!   takes more of the host's disk than its size. Nothing but the kernel's ext4 code writes
//!   the image: the sandbox writes files, never blocks.
//! - [`BoundedKind::Tmpfs`], where loop devices cannot be had (a container without
//!   `/dev/loop-control`) or `mkfs.ext4` is missing: a tmpfs with `size` and `nr_inodes`,
//!   whose pages are charged to the memory cgroup of the process that writes them.
//!
//! Never an unbounded directory: when neither can be made, [`BoundedDir::create`] fails.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::fcntl::Flock;

use crate::sys;

const LOOP_CONTROL: &str = "/dev/loop-control";
const MKFS_EXT4: [&str; 2] = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"];

/// Which file system bounds a [`BoundedDir`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundedKind {
    /// ext4 on a loop device over a sparse image file: counts against the host's disk.
    Ext4Loop,
    /// A size- and inode-capped tmpfs: counts against the writer's memory cgroup.
    Tmpfs,
}

impl BoundedKind {
    /// What this host offers, and why: ext4 on a loop device when `/dev/loop-control` opens
    /// for writing and `mkfs.ext4` is installed, else tmpfs.
    pub fn here() -> (BoundedKind, String) {
        let control = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(LOOP_CONTROL);
        match (control, mkfs_ext4()) {
            (Ok(_), Some(mkfs)) => (
                BoundedKind::Ext4Loop,
                format!(
                    "ext4 ({}) on a loop device over a sparse image",
                    mkfs.display()
                ),
            ),
            (Err(e), _) => (
                BoundedKind::Tmpfs,
                format!("a tmpfs: no loop devices ({LOOP_CONTROL}: {e})"),
            ),
            (Ok(_), None) => (
                BoundedKind::Tmpfs,
                "a tmpfs: no loop devices (mkfs.ext4, from e2fsprogs, is not installed)".into(),
            ),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BoundedKind::Ext4Loop => "ext4_loop",
            BoundedKind::Tmpfs => "tmpfs",
        }
    }
}

fn mkfs_ext4() -> Option<PathBuf> {
    MKFS_EXT4.iter().map(PathBuf::from).find(|p| p.is_file())
}

#[derive(Debug, thiserror::Error)]
pub enum BoundedError {
    #[error("a bounded file system: {call}: {source}")]
    Sys {
        call: &'static str,
        source: io::Error,
    },
    #[error("a bounded file system: {call} {path:?}: {source}")]
    Path {
        call: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("a bounded file system: mkfs.ext4 failed: {0}")]
    Mkfs(String),
    #[error("a bounded file system needs at least one byte and one entry")]
    Empty,
    #[error("{0:?} is mounted elsewhere (another process, or a mount not yet gone)")]
    Busy(PathBuf),
}

fn sys_err(call: &'static str) -> impl FnOnce(io::Error) -> BoundedError {
    move |source| BoundedError::Sys { call, source }
}

/// A detached file system of at most `bytes` and `inodes` entries; unmounted (and its image
/// and loop device released) when dropped and no sandbox holds a copy of the mount.
#[derive(Debug)]
pub struct BoundedDir {
    mount: OwnedFd,
    kind: BoundedKind,
    /// A kept image, locked (`flock`) while this is open: one mount of it at a time.
    _image: Option<Flock<File>>,
}

impl BoundedDir {
    /// Makes one of the kind [`BoundedKind::here`] names. `image_dir` holds the image file
    /// (unlinked from the start) of an ext4 one: a directory only root may enter. The root
    /// directory is mode 0777 (the sandbox's uid owns nothing), `nosuid` and `nodev`.
    pub fn create(image_dir: &Path, bytes: u64, inodes: u64) -> Result<BoundedDir, BoundedError> {
        Self::create_as(BoundedKind::here().0, image_dir, bytes, inodes)
    }

    /// As [`BoundedDir::create`], of the kind given.
    pub fn create_as(
        kind: BoundedKind,
        image_dir: &Path,
        bytes: u64,
        inodes: u64,
    ) -> Result<BoundedDir, BoundedError> {
        if bytes == 0 || inodes == 0 {
            return Err(BoundedError::Empty);
        }
        let mount = match kind {
            BoundedKind::Ext4Loop => ext4_on_loop(image_dir, bytes, inodes)?,
            BoundedKind::Tmpfs => {
                let fs = sys::fsopen("tmpfs").map_err(sys_err("fsopen(tmpfs)"))?;
                for (key, value) in [
                    ("size", bytes.to_string()),
                    ("nr_inodes", inodes.to_string()),
                    ("mode", "0777".to_owned()),
                ] {
                    sys::fsconfig(&fs, key, Some(&value)).map_err(sys_err("fsconfig(tmpfs)"))?;
                }
                sys::fsmount_detached(&fs, libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV)
                    .map_err(sys_err("fsmount(tmpfs)"))?
            }
        };
        let dir = BoundedDir {
            mount,
            kind,
            _image: None,
        };
        chmod_root(&dir)?;
        Ok(dir)
    }

    /// A bounded file system kept in the file `image`, made now (of `bytes` and `inodes`; the
    /// file must not exist) and mounted: a volume's, which outlives this process. Always ext4
    /// on a loop device, with a journal, so that a host that lost power finds it whole.
    pub fn create_image(image: &Path, bytes: u64, inodes: u64) -> Result<BoundedDir, BoundedError> {
        if bytes == 0 || inodes == 0 {
            return Err(BoundedError::Empty);
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(image)
            .map_err(|source| BoundedError::Path {
                call: "create",
                path: image.to_owned(),
                source,
            })?;
        let made = (|| {
            let file = lock_image(file, image)?;
            file.set_len(bytes).map_err(sys_err("sizing the image"))?;
            let (device, path) = loop_device(&file)?;
            mkfs(&path, inodes, true)?;
            let mount = mount_ext4(&path, device)?;
            let dir = BoundedDir {
                mount,
                kind: BoundedKind::Ext4Loop,
                _image: Some(file),
            };
            remove_lost_found(&dir)?;
            chmod_root(&dir)?;
            Ok(dir)
        })();
        if made.is_err() {
            let _ = fs::remove_file(image);
        }
        made
    }

    /// The bounded file system kept in `image` (made by [`BoundedDir::create_image`]), mounted
    /// again. [`BoundedError::Busy`] while it is mounted anywhere else: by another holder of
    /// its lock, or through a loop device still backed by it (a mount that has not yet gone).
    pub fn open_image(image: &Path) -> Result<BoundedDir, BoundedError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(image)
            .map_err(|source| BoundedError::Path {
                call: "open",
                path: image.to_owned(),
                source,
            })?;
        let file = lock_image(file, image)?;
        if backs_a_loop_device(image) {
            return Err(BoundedError::Busy(image.to_owned()));
        }
        let (device, path) = loop_device(&file)?;
        let mount = mount_ext4(&path, device)?;
        Ok(BoundedDir {
            mount,
            kind: BoundedKind::Ext4Loop,
            _image: Some(file),
        })
    }

    /// Whether a loop device is still attached to the kept image at `image`: a mount of it
    /// that has not yet gone, whoever holds it.
    pub fn image_in_use(image: &Path) -> bool {
        backs_a_loop_device(image)
    }

    pub fn kind(&self) -> BoundedKind {
        self.kind
    }

    /// The root, for this process: `/proc/self/fd/<mount>/` (the slash follows the descriptor's
    /// link to the directory). Paths below it are resolved as usual, a link among them
    /// followed: walk it without following links.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/", self.mount.as_raw_fd()))
    }

    /// The root, as a descriptor (the mount's own) to resolve paths beneath.
    pub fn root(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.mount.as_fd()
    }

    /// The root as a bind-mount source for a sandbox of this process: `/proc/<pid>/fd/<mount>`,
    /// which its init clones (`open_tree`) before it leaves the host's namespaces.
    pub fn bind_source(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.mount.as_raw_fd()
        ))
    }
}

/// ext4 on a fresh loop device over an unlinked sparse image of `bytes` in `image_dir`.
fn ext4_on_loop(image_dir: &Path, bytes: u64, inodes: u64) -> Result<OwnedFd, BoundedError> {
    let image = image_file(image_dir)?;
    image.set_len(bytes).map_err(sys_err("sizing the image"))?;
    let (device, path) = loop_device(&image)?;
    drop(image);
    mkfs(&path, inodes, false)?;
    let mount = mount_ext4(&path, device)?;
    let lost = PathBuf::from(format!("/proc/self/fd/{}/lost+found", mount.as_raw_fd()));
    fs::remove_dir(&lost).map_err(|source| BoundedError::Path {
        call: "rmdir",
        path: lost,
        source,
    })?;
    Ok(mount)
}

/// A free loop device attached to `image`, detached by the kernel once nothing holds it
/// (`LO_FLAGS_AUTOCLEAR`), with its path.
fn loop_device(image: &File) -> Result<(File, PathBuf), BoundedError> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(LOOP_CONTROL)
        .map_err(|source| BoundedError::Path {
            call: "open",
            path: LOOP_CONTROL.into(),
            source,
        })?;
    // Another process may take the free device between the two calls: ask again.
    let mut tries = 0;
    loop {
        let n = sys::loop_get_free(&control).map_err(sys_err("LOOP_CTL_GET_FREE"))?;
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let device = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| BoundedError::Path {
                call: "open",
                path: path.clone(),
                source,
            })?;
        match sys::loop_configure_autoclear(&device, image) {
            Ok(()) => return Ok((device, path)),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 16 => tries += 1,
            Err(source) => {
                return Err(BoundedError::Path {
                    call: "LOOP_CONFIGURE",
                    path,
                    source,
                })
            }
        }
    }
}

/// `mkfs.ext4` on `device`: no reserved blocks (the sandbox's uid is not root), `inodes`
/// entries, no discards at creation (the image is sparse); a journal only for a file system
/// that is kept (a build's is copied out or thrown away).
fn mkfs(device: &Path, inodes: u64, journal: bool) -> Result<(), BoundedError> {
    let mkfs =
        mkfs_ext4().ok_or_else(|| BoundedError::Mkfs("mkfs.ext4 is not installed".into()))?;
    let mut command = Command::new(&mkfs);
    command
        .args(["-q", "-F", "-m", "0", "-N"])
        .arg(inodes.to_string());
    if !journal {
        command.args(["-O", "^has_journal"]);
    }
    let out = command
        .args(["-E", "nodiscard,lazy_itable_init=1"])
        .arg(device)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| BoundedError::Mkfs(format!("{}: {e}", mkfs.display())))?;
    if !out.status.success() {
        return Err(BoundedError::Mkfs(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The ext4 file system on `device`, mounted detached; the mount holds the device from then
/// on, so that with ours closed its end detaches it.
fn mount_ext4(device: &Path, held: File) -> Result<OwnedFd, BoundedError> {
    let fs = sys::fsopen("ext4").map_err(sys_err("fsopen(ext4)"))?;
    sys::fsconfig(&fs, "source", Some(&device.to_string_lossy()))
        .map_err(sys_err("fsconfig(ext4, source)"))?;
    // The inode tables stay as mkfs left them (not zeroed in the background): what they
    // hold is known from the group descriptors.
    sys::fsconfig(&fs, "noinit_itable", None).map_err(sys_err("fsconfig(ext4, noinit_itable)"))?;
    let mount = sys::fsmount_detached(&fs, libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV)
        .map_err(sys_err("fsmount(ext4)"))?;
    drop(held);
    Ok(mount)
}

fn remove_lost_found(dir: &BoundedDir) -> Result<(), BoundedError> {
    let lost = dir.path().join("lost+found");
    fs::remove_dir(&lost).map_err(|source| BoundedError::Path {
        call: "rmdir",
        path: lost,
        source,
    })
}

/// The root, mode 0777: the sandbox's uid owns nothing of a build's (a volume's root is the
/// caller's to give its owner).
fn chmod_root(dir: &BoundedDir) -> Result<(), BoundedError> {
    let root = dir.path();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).map_err(|source| {
        BoundedError::Path {
            call: "chmod",
            path: root.clone(),
            source,
        }
    })
}

/// An exclusive `flock` on a kept image, held as long as the returned file is open.
fn lock_image(file: File, image: &Path) -> Result<Flock<File>, BoundedError> {
    match Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(locked),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(BoundedError::Busy(image.to_owned())),
        Err((_, e)) => Err(BoundedError::Path {
            call: "flock",
            path: image.to_owned(),
            source: e.into(),
        }),
    }
}

/// Whether a loop device is still attached to `image` (its mount not yet gone).
fn backs_a_loop_device(image: &Path) -> bool {
    let Ok(image) = fs::canonicalize(image) else {
        return false;
    };
    let Ok(devices) = fs::read_dir("/sys/block") else {
        return false;
    };
    devices.flatten().any(|d| {
        fs::read_to_string(d.path().join("loop/backing_file"))
            .is_ok_and(|f| Path::new(f.trim_end()) == image)
    })
}

/// A new file in `dir` that no path names: `O_TMPFILE`, or a named file unlinked at once
/// where the file system has no `O_TMPFILE`.
fn image_file(dir: &Path) -> Result<File, BoundedError> {
    let path_err = |call, path: &Path| {
        let path = path.to_owned();
        move |source| BoundedError::Path { call, path, source }
    };
    match OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)
    {
        Ok(file) => Ok(file),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            let mut name = [0u8; 8];
            File::open("/dev/urandom")
                .and_then(|mut f| io::Read::read_exact(&mut f, &mut name))
                .map_err(path_err("read", Path::new("/dev/urandom")))?;
            let name: String = name.iter().map(|b| format!("{b:02x}")).collect();
            let path = dir.join(format!("image-{name}"));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&path)
                .map_err(path_err("create", &path))?;
            fs::remove_file(&path).map_err(path_err("unlink", &path))?;
            Ok(file)
        }
        Err(e) => Err(path_err("open(O_TMPFILE)", dir)(e)),
    }
}
