//! Named Python environments: a requirement list built into a venv by pip **inside an
//! airlock sandbox** (building a package runs its code), whose only egress is the package
//! index, then stored content-addressed under the state directory and mounted read-only at
//! `/env` into the executions that name it.
//!
//! Layout of `<state>/environments/`:
//! - `store/<hash>/`: finished environments, owned by root and read-only, each with the
//!   `airlock-environment.json` manifest (written last) holding the digest of its tree;
//! - `names/<name>.json`: which hash a name points at (replaced atomically), and
//!   `names/<name>.lock`, held while a build of that name runs;
//! - `builds/`: the image files of builds in progress (unlinked from their creation, see
//!   [`airlock_sandbox::BoundedDir`]) and `builds/<random>/`, a finished build copied out of
//!   its bounded file system to be sealed (never used; removed when it fails);
//! - `logs/<hash>.log`: the last build's output.
//!
//! A build writes into a file system of its own, bounded in bytes and entries by the kernel
//! while it writes. It is copied into `store/` only once it succeeded and its tree checked out
//! (regular files, directories and links only), so a half-built environment never has a hash.
//! The tree's digest is checked again the first time a process uses a hash, so a tampered one
//! is refused.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::Engine;
use crate::job::{InputFile, Job};
pub use crate::policy::{EnvMount, ENV_MOUNT};
use crate::pump::{OutputSink, Stdin, Stream};

const MANIFEST: &str = "airlock-environment.json";
/// Longest requirement list accepted, in lines and bytes.
pub const MAX_REQUIREMENTS: usize = 256;
pub const MAX_REQUIREMENTS_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("no environment named {0:?}")]
    Unknown(String),
    #[error("{0}")]
    Invalid(String),
    #[error("environment {0:?} is being built by another request")]
    Busy(String),
    #[error("environment {name:?} cannot be used: {why}")]
    Corrupt { name: String, why: String },
    #[error("building environment {name:?} failed: {why} (log: {log})")]
    BuildFailed {
        name: String,
        why: String,
        log: PathBuf,
    },
    /// pip ran and refused the requirements (one not found, a conflict, a package's own
    /// build failing): the caller's to change, with the end of pip's output to say why.
    #[error("building environment {name:?} failed on its requirements: {why} (log: {log})")]
    Requirements {
        name: String,
        why: String,
        log: PathBuf,
    },
    #[error("{what} {path:?}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> EnvError + 'a {
    move |source| EnvError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// What a name points at, and what was built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentInfo {
    pub name: String,
    /// SHA-256 of the interpreter and the sorted requirements.
    pub hash: String,
    pub requirements: Vec<String>,
    /// The interpreter it was built for (`major.minor` and its path).
    pub python: String,
    pub created_at: String,
    /// Bytes of the stored tree.
    pub size_bytes: u64,
    /// Packages installed, as `name==version`, from the build.
    pub packages: Vec<String>,
}

/// The manifest stored with a built tree.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    hash: String,
    requirements: Vec<String>,
    python: String,
    created_at: String,
    size_bytes: u64,
    packages: Vec<String>,
    /// Digest of every entry of the tree but this manifest (see [`tree_digest`]).
    tree: String,
}

/// The store of one state directory.
#[derive(Debug)]
pub struct Environments {
    root: PathBuf,
    /// Hashes whose tree this process checked.
    verified: Mutex<HashSet<String>>,
    /// One tree check at a time (a second asker then finds it done).
    verifying: Mutex<()>,
}

/// Names: letters, digits, `-`, `_` and `.`, starting with a letter or digit.
pub fn check_name(name: &str) -> Result<(), EnvError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(EnvError::Invalid(format!(
            "environment name {name:?}: 1-64 letters, digits, '-', '_' or '.', starting with a letter or digit"
        )))
    }
}

/// A requirements file's lines, checked: each one a PEP 508 requirement of a name, extras, a
/// version specifier and a marker, nothing else (no options such as `--index-url`, `-i` or
/// `--global-option`, even after a marker; no URLs; no names pip takes for a local file, such as
/// `x.whl`), sorted and without duplicates. Blank lines and `#` comments are left out.
pub fn parse_requirements(text: &str) -> Result<Vec<String>, EnvError> {
    if text.len() > MAX_REQUIREMENTS_BYTES {
        return Err(EnvError::Invalid(format!(
            "requirements over {MAX_REQUIREMENTS_BYTES} bytes"
        )));
    }
    let mut out = Vec::new();
    for raw in text.lines() {
        let line = raw.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        check_requirement(line).map_err(|why| {
            EnvError::Invalid(format!(
                "requirement {line:?}: {why}; only `name[extras] <version specifiers> ; <marker>` (PEP 508, no options, URLs or paths)"
            ))
        })?;
        out.push(line.to_owned());
    }
    if out.is_empty() {
        return Err(EnvError::Invalid("no requirements".into()));
    }
    if out.len() > MAX_REQUIREMENTS {
        return Err(EnvError::Invalid(format!(
            "more than {MAX_REQUIREMENTS} requirements"
        )));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// What pip takes for an archive file rather than a project name (`pip._internal.utils.
/// filetypes.ARCHIVE_EXTENSIONS`): `x.whl` alone installs the file `./x.whl`.
const ARCHIVE_SUFFIXES: [&str; 12] = [
    ".whl",
    ".zip",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tlz",
    ".tar.lz",
    ".tar.lzma",
];

/// One requirement line: parsed whole by a PEP 508 parser, and then narrower than PEP 508
/// where pip reads a line differently from the standard.
fn check_requirement(line: &str) -> Result<(), String> {
    // pip's requirements-file reader splits options off at a space followed by `-`, strips
    // `#` comments, expands `${VAR}` and joins lines ending in `\`; PEP 508 allows all of
    // these inside a marker's quoted string. None of them is needed to name a package.
    if let Some(c) = line
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || " \t-_.[],=<>!~;\"'()*".contains(*c)))
    {
        return Err(format!("the character {c:?} is not accepted"));
    }
    if line.split([' ', '\t']).any(|word| word.starts_with('-')) {
        return Err("options are not accepted".into());
    }
    let req = pep508_rs::Requirement::from_str(line).map_err(|e| {
        // The parser's message spans lines (the input and a caret under the fault).
        e.message.to_string()
    })?;
    if let Some(pep508_rs::VersionOrUrl::Url(_)) = req.version_or_url {
        return Err("URLs are not accepted".into());
    }
    let name = req.name.to_string().to_ascii_lowercase();
    let written = line
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    if ARCHIVE_SUFFIXES
        .iter()
        .any(|s| name.ends_with(s) || written.ends_with(s))
    {
        return Err("a name pip would take for a local archive file".into());
    }
    Ok(())
}

/// The content address of a build: the interpreter and the sorted requirements.
pub fn environment_hash(python: &str, requirements: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(b"airlock-environment-v1\0");
    h.update(python.as_bytes());
    for r in requirements {
        h.update(b"\0");
        h.update(r.as_bytes());
    }
    airlock_api::hex(&h.finalize())
}

impl Environments {
    /// The store below `state_dir`, created (mode 0700) if missing.
    pub fn open(state_dir: &Path) -> Result<Self, EnvError> {
        let root = state_dir.join("environments");
        for sub in ["", "store", "names", "builds", "logs"] {
            let dir = root.join(sub);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(io_err("creating", &dir))?;
        }
        Ok(Environments {
            root,
            verified: Mutex::new(HashSet::new()),
            verifying: Mutex::new(()),
        })
    }

    fn name_file(&self, name: &str) -> PathBuf {
        self.root.join("names").join(format!("{name}.json"))
    }

    fn stored(&self, hash: &str) -> PathBuf {
        self.root.join("store").join(hash)
    }

    pub fn log_path(&self, hash: &str) -> PathBuf {
        self.root.join("logs").join(format!("{hash}.log"))
    }

    /// Every named environment, by name.
    pub fn list(&self) -> Result<Vec<EnvironmentInfo>, EnvError> {
        let dir = self.root.join("names");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err("listing", &dir))? {
            let entry = entry.map_err(io_err("listing", &dir))?;
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some(name) = file.strip_suffix(".json") {
                if let Some(info) = self.get(name)? {
                    out.push(info);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// What `name` points at, if anything.
    pub fn get(&self, name: &str) -> Result<Option<EnvironmentInfo>, EnvError> {
        check_name(name)?;
        let path = self.name_file(name);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("reading", &path)(e)),
        };
        let info: EnvironmentInfo = serde_json::from_str(&text).map_err(|e| EnvError::Corrupt {
            name: name.to_owned(),
            why: format!("{}: {e}", path.display()),
        })?;
        Ok(Some(info))
    }

    /// The environment `name`, checked, ready to mount read-only.
    pub fn resolve(&self, name: &str) -> Result<EnvMount, EnvError> {
        let info = self
            .get(name)?
            .ok_or_else(|| EnvError::Unknown(name.to_owned()))?;
        let source = self.stored(&info.hash);
        let corrupt = |why: String| EnvError::Corrupt {
            name: name.to_owned(),
            why,
        };
        let seen = |hash: &str| {
            self.verified
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(hash)
        };
        let _one_at_a_time =
            (!seen(&info.hash)).then(|| self.verifying.lock().unwrap_or_else(|e| e.into_inner()));
        if !seen(&info.hash) {
            let manifest = read_manifest(&source).map_err(corrupt)?;
            if manifest.hash != info.hash {
                return Err(corrupt("its manifest names another build".into()));
            }
            let (digest, _) = tree_digest(&source).map_err(|e| corrupt(e.to_string()))?;
            if digest != manifest.tree {
                return Err(corrupt(
                    "its files changed since it was built (digest mismatch)".into(),
                ));
            }
            self.verified
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(info.hash.clone());
        }
        Ok(EnvMount {
            name: name.to_owned(),
            hash: info.hash,
            source,
            writable: false,
        })
    }

    /// Removes the name (the stored tree goes too when no other name points at it).
    pub fn delete(&self, name: &str) -> Result<bool, EnvError> {
        let Some(info) = self.get(name)? else {
            return Ok(false);
        };
        let _lock = self.lock(name)?;
        let _store = self.store_lock()?;
        let path = self.name_file(name);
        fs::remove_file(&path).map_err(io_err("removing", &path))?;
        let still_used = self.list()?.iter().any(|i| i.hash == info.hash);
        if !still_used {
            let stored = self.stored(&info.hash);
            let _ = remove_tree(&stored);
            self.verified
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&info.hash);
        }
        Ok(true)
    }

    /// Holds `store.lock` while names and stored trees change together (a name written for a
    /// tree, a tree removed once no name uses it), so those never interleave.
    fn store_lock(&self) -> Result<NameLock, EnvError> {
        let path = self.root.join("store.lock");
        lock_file(&path, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|e| io_err("locking", &path)(e.into()))
    }

    /// Holds `names/<name>.lock` for the duration of a build or a removal.
    fn lock(&self, name: &str) -> Result<NameLock, EnvError> {
        let path = self.root.join("names").join(format!("{name}.lock"));
        match lock_file(&path, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(lock),
            Err(nix::errno::Errno::EWOULDBLOCK) => Err(EnvError::Busy(name.to_owned())),
            Err(e) => Err(io_err("locking", &path)(e.into())),
        }
    }

    /// Builds `requirements` for `name` with `build` (which runs pip in a sandbox with a
    /// bounded file system of `max_bytes` mounted writable at `/env`) and points the name at
    /// the result. An identical build already stored is reused without running anything.
    pub fn create(
        &self,
        name: &str,
        requirements: &[String],
        python: &str,
        max_bytes: u64,
        build: &dyn Fn(&EnvMount, &Path) -> Result<(), BuildError>,
    ) -> Result<(EnvironmentInfo, bool), EnvError> {
        check_name(name)?;
        let _lock = self.lock(name)?;
        let hash = environment_hash(python, requirements);
        let stored = self.stored(&hash);
        let log = self.log_path(&hash);
        let stored_ok = || read_manifest(&stored).is_ok_and(|m| m.hash == hash);
        let mut built = None;
        if !stored_ok() {
            // The build writes into a file system of its own, of `max_bytes` and
            // `build_entries` entries, which the kernel enforces while it writes: a hostile
            // package cannot fill the disk that holds the audit log, keys and other
            // environments. Its image (if on disk) is in `builds/`, which only root may enter.
            let builds = self.root.join("builds");
            let bounded =
                airlock_sandbox::BoundedDir::create(&builds, max_bytes, build_entries(max_bytes))
                    .map_err(|e| EnvError::BuildFailed {
                    name: name.to_owned(),
                    why: e.to_string(),
                    log: log.clone(),
                })?;
            let mount = EnvMount {
                name: name.to_owned(),
                hash: hash.clone(),
                source: bounded.bind_source(),
                writable: true,
            };
            let dir = builds.join(random_name().map_err(io_err("naming a build in", &builds))?);
            let result = build(&mount, &log).and_then(|()| {
                take_over(&bounded.path(), &dir, max_bytes)
                    .and_then(|()| seal(&dir, &hash, requirements, python, max_bytes))
                    .map_err(|e| BuildError::Failed(e.to_string()))
            });
            drop(bounded);
            if let Err(e) = result {
                let _ = remove_tree(&dir);
                let name = name.to_owned();
                return Err(match e {
                    BuildError::Requirements(why) => EnvError::Requirements { name, why, log },
                    BuildError::Failed(why) => EnvError::BuildFailed { name, why, log },
                });
            }
            built = Some(dir);
        }
        // From here to the name's file, no removal of a tree can interleave.
        let _store = self.store_lock()?;
        let fresh = match built {
            // Stored meanwhile by a build of the same list under another name: the same.
            Some(dir) if stored_ok() => {
                let _ = remove_tree(&dir);
                false
            }
            Some(dir) => {
                fs::rename(&dir, &stored).map_err(|e| {
                    let _ = remove_tree(&dir);
                    io_err("storing", &stored)(e)
                })?;
                true
            }
            None => false,
        };
        let manifest = read_manifest(&stored).map_err(|why| EnvError::Corrupt {
            name: name.to_owned(),
            why,
        })?;
        let info = EnvironmentInfo {
            name: name.to_owned(),
            hash,
            requirements: manifest.requirements,
            python: manifest.python,
            created_at: manifest.created_at,
            size_bytes: manifest.size_bytes,
            packages: manifest.packages,
        };
        let path = self.name_file(name);
        let tmp = random_name().map_err(io_err("naming a new version of", &path))?;
        let tmp = path.with_extension(format!("json.{tmp}"));
        let write = || -> io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(&info).map_err(io::Error::other)?)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            io_err("writing", &path)(e)
        })?;
        if fresh {
            // Sealed just now by this process: its digest is the one it computed.
            self.verified
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(info.hash.clone());
        }
        Ok((info, fresh))
    }

    /// Removes what failed or interrupted builds left (at start, before anything builds).
    pub fn sweep(&self) {
        let dir = self.root.join("builds");
        if let Ok(entries) = fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let _ = remove_tree(&entry.path());
            }
        }
    }
}

struct NameLock(#[allow(dead_code)] nix::fcntl::Flock<fs::File>);

/// `flock` on a lock file, made if missing.
fn lock_file(path: &Path, how: nix::fcntl::FlockArg) -> Result<NameLock, nix::errno::Errno> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    nix::fcntl::Flock::lock(file, how)
        .map(NameLock)
        .map_err(|(_, e)| e)
}

/// 16 random hexadecimal digits, a name no other build or write takes at the same time: from
/// the kernel (`getrandom(2)`), or an error.
fn random_name() -> io::Result<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|e| io::Error::other(format!("the kernel gave no random bytes: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn read_manifest(dir: &Path) -> Result<Manifest, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(MANIFEST);
    let fail = |e: io::Error| format!("{}: {e}", path.display());
    // Never through a link a build may have left in its place.
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(fail)?;
    if !file.metadata().map_err(fail)?.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut text = String::new();
    (&mut file)
        .take(1 << 20)
        .read_to_string(&mut text)
        .map_err(fail)?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The most entries a build may leave (its file system has fewer inodes than this; the walk
/// of a tree stops past it).
const MAX_TREE_ENTRIES: usize = 200_000;

/// Inodes of a build's file system of `max_bytes`: enough for real packages (about one per
/// 4 KiB), not for millions of empty files.
fn build_entries(max_bytes: u64) -> u64 {
    (max_bytes / 4096).clamp(1024, MAX_TREE_ENTRIES as u64 - 1)
}

/// What a build may leave: no manifest of its own, only directories, regular files (not
/// sparse) and links, at most `max_bytes` in files.
fn check_tree(dir: &Path, entries: &[(PathBuf, fs::Metadata)], max_bytes: u64) -> io::Result<()> {
    if fs::symlink_metadata(dir.join(MANIFEST)).is_ok() {
        return Err(io::Error::other(format!(
            "the build left an entry named {MANIFEST}"
        )));
    }
    let mut total = 0u64;
    for (path, meta) in entries {
        let ft = meta.file_type();
        if !(ft.is_dir() || ft.is_file() || ft.is_symlink()) {
            return Err(io::Error::other(format!(
                "{} is neither a file, a directory nor a link",
                path.display()
            )));
        }
        if ft.is_file() {
            // A sparse file costs little disk and much reading: refused.
            if meta.blocks().saturating_mul(512) + 4096 < meta.len() {
                return Err(io::Error::other(format!(
                    "{} is a sparse file",
                    path.display()
                )));
            }
            total += meta.len();
        }
    }
    if total > max_bytes {
        return Err(io::Error::other(format!(
            "the build left {total} bytes, over the limit of {max_bytes}"
        )));
    }
    Ok(())
}

/// Copies a finished build out of its bounded file system (whose writers are all gone) into
/// `dir`, a new directory on the host, after [`check_tree`] passed there: so at most
/// `max_bytes` are copied. Links are copied as links, never followed. Every directory and
/// file is made readable by all (0755, or 0644 for a file its owner could not execute), set
/// with `chmod`: the build ran under the server's umask (0077 under the systemd unit), and
/// what it left must be readable by every sandbox's uid once sealed.
fn take_over(from: &Path, dir: &Path, max_bytes: u64) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let entries = walk(from)?;
    check_tree(from, &entries, max_bytes)?;
    let bits = |meta: &fs::Metadata| {
        let executable = meta.is_dir() || meta.mode() & 0o100 != 0;
        fs::Permissions::from_mode(if executable { 0o755 } else { 0o644 })
    };
    fs::DirBuilder::new().mode(0o700).create(dir)?;
    // Sealed to 0555, as a build directory always was.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    for (path, meta) in entries.iter().skip(1) {
        let rel = path.strip_prefix(from).map_err(io::Error::other)?;
        let to = dir.join(rel);
        let ft = meta.file_type();
        if ft.is_dir() {
            fs::DirBuilder::new().mode(0o700).create(&to)?;
            fs::set_permissions(&to, bits(meta))?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(path)?, &to)?;
        } else {
            let mut src = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)?;
            let mut dst = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&to)?;
            dst.set_permissions(bits(meta))?;
            let copied = io::copy(&mut io::Read::take(&mut src, meta.len()), &mut dst)?;
            if copied != meta.len() {
                return Err(io::Error::other(format!(
                    "{} changed while it was copied",
                    path.display()
                )));
            }
        }
    }
    Ok(())
}

/// Takes a finished build over (copied to the host by [`take_over`]): checks it again; gives
/// it all to root, read-only; writes the manifest with the tree's digest, never through a
/// link.
fn seal(
    dir: &Path,
    hash: &str,
    requirements: &[String],
    python: &str,
    max_bytes: u64,
) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let entries = walk(dir)?;
    let manifest_path = dir.join(MANIFEST);
    check_tree(dir, &entries, max_bytes)?;
    own_read_only(&entries)?;
    let (tree, size_bytes) = tree_digest(dir)?;
    let packages = installed_packages(dir, python, &entries);
    let manifest = Manifest {
        hash: hash.to_owned(),
        requirements: requirements.to_vec(),
        python: python.to_owned(),
        created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        size_bytes,
        packages,
        tree,
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&manifest_path)?;
    file.write_all(&serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?)?;
    file.sync_all()?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o555))?;
    Ok(())
}

/// `name==version` of every `*.dist-info` directory right in the site-packages directory,
/// from the entries walked (links were never followed), names of plain characters only.
fn installed_packages(
    dir: &Path,
    python: &str,
    entries: &[(PathBuf, fs::Metadata)],
) -> Vec<String> {
    let site = dir.join(format!("lib/python{python}/site-packages"));
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+' | b'!'))
    };
    let mut out: Vec<String> = entries
        .iter()
        .filter(|(path, meta)| meta.is_dir() && path.parent() == Some(site.as_path()))
        .filter_map(|(path, _)| {
            let name = path.file_name()?.to_str()?;
            let (pkg, version) = name.strip_suffix(".dist-info")?.split_once('-')?;
            (plain(pkg) && plain(version)).then(|| format!("{pkg}=={version}"))
        })
        .collect();
    out.sort();
    out
}

/// lchown to root and no write bits, for every entry (never following a link; the walk never
/// entered one, and nothing of the build runs any more to swap one in).
fn own_read_only(entries: &[(PathBuf, fs::Metadata)]) -> io::Result<()> {
    for (path, meta) in entries {
        std::os::unix::fs::lchown(path, Some(0), Some(0))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.mode() & 0o555;
        fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// SHA-256 over every entry below `dir` (the manifest excepted), in path order: its relative
/// path, type, permission bits, and contents or link target; and the total size.
fn tree_digest(dir: &Path) -> io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut size = 0u64;
    let mut entries = walk(dir)?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, meta) in entries {
        let rel = path.strip_prefix(dir).unwrap_or(&path);
        if rel == Path::new(MANIFEST) {
            continue;
        }
        h.update(rel.as_os_str().as_encoded_bytes());
        h.update(b"\0");
        h.update((meta.mode() & 0o7777).to_le_bytes());
        let ft = meta.file_type();
        if ft.is_symlink() {
            h.update(b"l");
            h.update(fs::read_link(&path)?.as_os_str().as_encoded_bytes());
        } else if ft.is_dir() {
            h.update(b"d");
        } else if ft.is_file() {
            h.update(b"f");
            let mut f = fs::File::open(&path)?;
            let mut fh = Sha256::new();
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match io::Read::read(&mut f, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                fh.update(&buf[..n]);
                size += n as u64;
            }
            h.update(fh.finalize());
        } else {
            return Err(io::Error::other(format!(
                "{} is neither a file, a directory nor a link",
                path.display()
            )));
        }
        h.update(b"\n");
    }
    Ok((airlock_api::hex(&h.finalize()), size))
}

/// Every entry below `dir` (itself included), without following links; at most
/// `MAX_TREE_ENTRIES` of them.
fn walk(dir: &Path) -> io::Result<Vec<(PathBuf, fs::Metadata)>> {
    let mut out = vec![(dir.to_owned(), fs::symlink_metadata(dir)?)];
    let mut i = 0;
    while i < out.len() {
        if out[i].1.is_dir() {
            let path = out[i].0.clone();
            for entry in fs::read_dir(&path)? {
                let entry = entry?;
                let p = entry.path();
                let m = fs::symlink_metadata(&p)?;
                out.push((p, m));
                if out.len() > MAX_TREE_ENTRIES {
                    return Err(io::Error::other(format!(
                        "more than {MAX_TREE_ENTRIES} entries"
                    )));
                }
            }
        }
        i += 1;
    }
    Ok(out)
}

/// Removes a tree whose directories may be read-only.
fn remove_tree(dir: &Path) -> io::Result<()> {
    if let Ok(entries) = walk(dir) {
        for (path, meta) in entries {
            if meta.is_dir() {
                let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o700));
            }
        }
    }
    fs::remove_dir_all(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_random_even_where_dev_urandom_gives_nothing() {
        use nix::mount::{mount, MsFlags};
        // In a mount namespace of this thread's own, where /dev/urandom reads as /dev/null
        // (empty): a name made of what it gave would be all zeros, the same every time.
        let names = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
                .expect("a mount namespace of its own (the tests run as root)");
            let none: Option<&str> = None;
            mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
                .expect("mounts made private to this namespace");
            mount(
                Some("/dev/null"),
                "/dev/urandom",
                none,
                MsFlags::MS_BIND,
                none,
            )
            .expect("/dev/null bound over /dev/urandom");
            assert!(fs::read("/dev/urandom").unwrap().is_empty());
            [random_name(), random_name()]
        })
        .join()
        .unwrap();
        let [a, b] = names.map(|n| n.expect("a random name"));
        assert_eq!(a.len(), 16);
        assert_ne!(a, "0".repeat(16));
        assert_ne!(a, b);
    }

    #[test]
    fn requirements_are_specifiers_only_sorted() {
        assert_eq!(
            parse_requirements(
                "tabulate==0.9.0\n# comment\n\nattrs>=22 ; python_version>'3'\ntabulate==0.9.0\n"
            )
            .unwrap(),
            vec![
                "attrs>=22 ; python_version>'3'".to_owned(),
                "tabulate==0.9.0".to_owned()
            ]
        );
        for bad in [
            "--index-url http://evil/simple",
            "-e .",
            "pkg @ https://evil/pkg.whl",
            "./local.whl",
            "/etc/passwd",
            "",
            "# only a comment",
        ] {
            assert!(parse_requirements(bad).is_err(), "{bad}");
        }
        for good in [
            "tabulate",
            "Django~=4.2",
            "numpy!=1.0,<2",
            "requests[security,tests] >= 2.8.1, == 2.8.* ; python_version > \"3.8\"",
            "zope.interface==6.0 ; os_name == 'posix' and python_version >= '3.8'",
            "pkg (>=1.0)",
        ] {
            assert_eq!(parse_requirements(good).unwrap(), vec![good.to_owned()]);
        }
    }

    /// Issue 45: options, paths and files got past the old character check to pip.
    #[test]
    fn requirements_refuse_options_urls_and_files() {
        // The issue's lines with options are not PEP 508 to begin with.
        for bad in [
            "tinypkg --global-option=--verbose --install-option=--no-compile",
            "pkg;os_name==\"posix\" -i x",
        ] {
            assert!(pep508_rs::Requirement::from_str(bad).is_err(), "{bad}");
        }
        for (bad, why) in [
            // Options after a name, after a marker, or inside one (pip's file reader splits
            // a line at a space followed by `-`).
            (
                "tinypkg --global-option=--verbose --install-option=--no-compile",
                "options",
            ),
            ("pkg;os_name==\"posix\" -i x", "options"),
            ("pkg ; os_name == \"posix -i x\"", "options"),
            ("pkg\t--hash=sha256:00", "options"),
            // pip installs these as local files.
            ("x.whl", "local archive file"),
            ("x.WHL[extra]", "local archive file"),
            ("x.tar.gz ; os_name == 'posix'", "local archive file"),
            ("x.zip==1.0", "local archive file"),
            // URLs and paths, in PEP 508's form or not.
            ("pkg @ https://evil.example/pkg.whl", "character"),
            ("pkg@file:///etc/passwd", "character"),
            ("./pkg", "character"),
            ("pkg ; os_name == \"${HOME}\"", "character"),
            ("pkg ; os_name == 'a#b'", "character"),
            ("pkg ; os_name == 'a #b'", "PEP 508"),
            // Not PEP 508: the parser refuses them.
            ("pkg ==", "PEP 508"),
            ("pkg >= 1 ; os_name", "PEP 508"),
            ("pkg[extra", "PEP 508"),
            ("pkg 1.0", "PEP 508"),
            ("pkg ; nonsense == 'x'", "PEP 508"),
            ("pkg >= 1 trailing", "PEP 508"),
        ] {
            let err = parse_requirements(bad).unwrap_err().to_string();
            // Named as read: a ` #` comment is left out first.
            let read = bad.split(" #").next().unwrap();
            assert!(err.contains(&format!("{read:?}")), "{bad}: {err}");
            if why != "PEP 508" {
                assert!(err.contains(why), "{bad}: {err}");
            }
        }
        for bad in ["", "-x", "a/b", "../x", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert!(check_name("datasci-2.0_x").is_ok());
    }

    #[test]
    fn the_hash_is_the_interpreter_and_the_sorted_requirements() {
        let a = environment_hash("3.11", &["a".into(), "b".into()]);
        assert_eq!(a, environment_hash("3.11", &["a".into(), "b".into()]));
        assert_ne!(a, environment_hash("3.12", &["a".into(), "b".into()]));
        assert_ne!(a, environment_hash("3.11", &["ab".into()]));
    }

    #[test]
    fn a_tampered_tree_changes_its_digest() {
        let dir = std::env::temp_dir().join(format!("airlock-envtest-{}", random_name().unwrap()));
        fs::create_dir_all(dir.join("lib")).unwrap();
        fs::write(dir.join("lib/x.py"), "x = 1").unwrap();
        let (d1, size) = tree_digest(&dir).unwrap();
        assert_eq!(size, 5);
        fs::write(dir.join("lib/x.py"), "x = 2").unwrap();
        assert_ne!(d1, tree_digest(&dir).unwrap().0);
        fs::write(dir.join("lib/x.py"), "x = 1").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.join("lib/y")).unwrap();
        assert_ne!(d1, tree_digest(&dir).unwrap().0);
        remove_tree(&dir).unwrap();
    }
}

/// How environments are built: where pip looks, what the build may reach, its limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuildSettings {
    /// The package index pip uses (`--index-url`).
    pub index_url: String,
    /// The only places the build's sandbox may connect to: the index and where it keeps
    /// its files.
    pub egress: airlock_egress::EgressPolicy,
    /// Wall-clock limit of one build, in milliseconds.
    pub timeout_ms: u64,
    pub memory_mb: u64,
    /// Scratch space for pip's downloads and builds, and the size of the file system the
    /// environment is built into (with one entry per 4 KiB of it), enforced while it is
    /// written.
    pub disk_mb: u64,
    pub pids: u32,
}

impl Default for BuildSettings {
    fn default() -> Self {
        let host = |h: &str| airlock_egress::HostRule {
            host: h.to_owned(),
            ports: vec![443],
        };
        BuildSettings {
            index_url: "https://pypi.org/simple".into(),
            egress: airlock_egress::EgressPolicy {
                hosts: vec![host("pypi.org"), host("files.pythonhosted.org")],
                ranges: Vec::new(),
            },
            timeout_ms: 600_000,
            memory_mb: 2048,
            disk_mb: 2048,
            pids: 256,
        }
    }
}

impl BuildSettings {
    pub fn validate(&self) -> Result<(), String> {
        let url = &self.index_url;
        let ok = (url.starts_with("https://") || url.starts_with("http://"))
            && !url.contains(['@', ' ', '\n'])
            && url.len() < 2048;
        if !ok {
            return Err(format!(
                "environments.index_url {url:?}: an http(s) URL without user info"
            ));
        }
        self.egress
            .validate()
            .map_err(|m| format!("environments.egress: {m}"))?;
        if self.egress.allows_nothing() {
            return Err("environments.egress: list the index's hosts".into());
        }
        for (name, zero) in [
            ("timeout_ms", self.timeout_ms == 0),
            ("memory_mb", self.memory_mb == 0),
            ("disk_mb", self.disk_mb == 0),
            ("pids", self.pids == 0),
        ] {
            if zero {
                return Err(format!("environments.{name} must be greater than zero"));
            }
        }
        Ok(())
    }
}

/// The build, as the code its sandbox runs: a venv on the sandbox's interpreter at `/env`,
/// then pip (the interpreter's own) installing the requirements into its site-packages from
/// the configured index only. Source packages build with the interpreter's setuptools, inside
/// this same sandbox (no build isolation: nothing more is fetched to build them).
const BUILD_CODE: &str = r#"
import json, subprocess, sys
settings = json.load(open("/work/build.json"))
def step(argv):
    print("$ " + " ".join(argv), flush=True)
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit("%s exited with %d" % (argv[2], done.returncode))
step([sys.executable, "-m", "venv", "--without-pip", "/env"])
step([sys.executable, "-m", "pip", "install", "--no-input", "--progress-bar", "off",
      "--no-cache-dir", "--disable-pip-version-check", "--no-build-isolation",
      "--index-url", settings["index_url"], "--target", settings["site_packages"],
      "-r", "/work/requirements.txt"])
print("built", flush=True)
"#;

/// Why a build did not give an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// pip exited with an error: the requirements' fault. Its message ends with the end of
    /// pip's output.
    Requirements(String),
    /// Anything else: the sandbox, its limits, the host.
    Failed(String),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Requirements(why) | BuildError::Failed(why) => f.write_str(why),
        }
    }
}

/// How many of the build's last lines a failure on the requirements quotes.
const TAIL_LINES: usize = 12;

/// The operator's proxy settings for a build, and who hears of its connections.
#[derive(Debug)]
pub struct BuildEgress {
    pub settings: Arc<airlock_egress::Settings>,
    pub observer: Option<Arc<dyn airlock_egress::Observer>>,
}

/// Writes a build's output to its log and hands each line to `progress`.
struct BuildLog<'a> {
    file: fs::File,
    line: Vec<u8>,
    /// The last lines that were not empty, to say why a build failed.
    tail: std::collections::VecDeque<String>,
    /// A line said ENOSPC: the build filled its file system (or its scratch).
    full: bool,
    progress: &'a mut (dyn FnMut(&str) + Send),
}

impl OutputSink for BuildLog<'_> {
    fn output(&mut self, _: Stream, chunk: &[u8]) {
        let _ = self.file.write_all(chunk);
        for &b in chunk {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.line).into_owned();
                (self.progress)(&line);
                self.full |= line.contains("No space left on device");
                if !line.trim().is_empty() {
                    if self.tail.len() == TAIL_LINES {
                        self.tail.pop_front();
                    }
                    self.tail.push_back(line);
                }
                self.line.clear();
            } else if self.line.len() < 4096 {
                self.line.push(b);
            }
        }
    }

    fn truncated(&mut self, _: Stream, limit: u64) {
        let _ = writeln!(self.file, "[output past {limit} bytes not kept]");
    }
}

impl Engine {
    /// Runs one environment build in a sandbox: `mount` writable at `/env`, egress only under
    /// `settings.egress` with the operator's budgets and name answers (each connection told
    /// to `observer`), the output streamed to `log` and `progress`.
    pub fn build_environment(
        &self,
        mount: &EnvMount,
        requirements: &[String],
        settings: &BuildSettings,
        egress: BuildEgress,
        log: &Path,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), BuildError> {
        let failed = |e: &dyn std::fmt::Display| BuildError::Failed(e.to_string());
        let file = fs::File::create(log).map_err(|e| failed(&format!("{}: {e}", log.display())))?;
        let mut sink = BuildLog {
            file,
            line: Vec::new(),
            tail: std::collections::VecDeque::new(),
            full: false,
            progress,
        };
        let limits = self
            .config()
            .resolve_limits(&airlock_api::LimitsRequest::default())
            .map_err(|e| failed(&e))?;
        let limits = airlock_api::Limits {
            timeout_ms: settings.timeout_ms,
            cpu_ms: settings.timeout_ms,
            memory_mb: settings.memory_mb,
            disk_mb: settings.disk_mb,
            pids: settings.pids,
            output_bytes: limits.output_bytes.max(8 << 20),
        };
        let build = serde_json::json!({
            "index_url": settings.index_url,
            "site_packages": EnvMount::site_packages(&self.interpreter().version),
        });
        let egress = airlock_egress::Leash::new(
            settings.egress.clone(),
            egress.settings,
            "environment-build",
            egress.observer,
        );
        egress.begin(&format!("build:{}", mount.hash));
        let job = Job {
            code: BUILD_CODE.into(),
            filename: "build.py".into(),
            stdin: Stdin::Empty,
            env: Vec::new(),
            files: vec![
                InputFile {
                    path: "requirements.txt".into(),
                    data: (requirements.join("\n") + "\n").into_bytes(),
                },
                InputFile {
                    path: "build.json".into(),
                    data: build.to_string().into_bytes(),
                },
            ],
            entrypoint: None,
            limits,
            max_code_bytes: BUILD_CODE.len() as u64,
            stream: true,
            echo_traceback: true,
            cancel: None,
            tools: None,
            egress: Some(Arc::new(egress)),
            environment: Some(mount.clone()),
            volumes: Vec::new(),
        };
        let done = self.execute(job, &mut sink).map_err(|e| failed(&e))?;
        let r = done.result;
        let _ = writeln!(
            sink.file,
            "[airlock: the build ended with status {}]",
            r.status
        );
        if r.status == airlock_api::Status::Ok {
            return Ok(());
        }
        let last = sink.tail.back().map_or("", |l| l.trim());
        let why = match &r.error {
            Some(e) if e.kind != "SystemExit" => format!("{}: {}", e.kind, e.message),
            _ => format!("{} ({last})", r.status),
        };
        if sink.full {
            return Err(BuildError::Failed(format!(
                "it ran out of space (No space left on device): an environment and the \
                 build's scratch may hold {} MiB each (environments.build.disk_mb); {why}",
                settings.disk_mb
            )));
        }
        // BUILD_CODE's own words when pip itself failed: the requirements are at fault.
        // (`SystemExit` with a message: the exit status 1, no exception reported.)
        let pip = r.status == airlock_api::Status::Error
            && r.error.as_ref().is_none_or(|e| e.kind == "SystemExit")
            && last.starts_with("pip exited with ");
        if pip {
            let tail: Vec<&str> = sink.tail.iter().map(|l| l.trim_end()).collect();
            return Err(BuildError::Requirements(format!(
                "{last}; the end of its output:\n{}",
                tail[..tail.len() - 1].join("\n")
            )));
        }
        Err(BuildError::Failed(why))
    }
}
