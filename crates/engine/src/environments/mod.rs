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

mod build;
mod error;
mod requirements;
mod tree;

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::durable::{write_aside, Place};
pub use crate::policy::{EnvMount, ENV_MOUNT};
use crate::storage::{Kept, Whose};
pub use build::{BuildEgress, BuildError, BuildSettings};
use error::io_err;
pub use error::EnvError;
pub use requirements::{
    check_name, environment_hash, parse_requirements, MAX_REQUIREMENTS, MAX_REQUIREMENTS_BYTES,
};
use tree::{build_entries, read_manifest, remove_tree, seal, take_over, tree_digest};

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

/// The store of one state directory.
#[derive(Debug)]
pub struct Environments {
    root: PathBuf,
    /// Hashes whose tree this process checked.
    verified: Mutex<HashSet<String>>,
    /// One tree check at a time (a second asker then finds it done).
    verifying: Mutex<()>,
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
        let json = serde_json::to_vec_pretty(&info)
            .map_err(|e| io_err("writing", &path)(io::Error::other(e)))?;
        write_aside(&path, &json, Place::Replace).map_err(io_err("writing", &path))?;
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

/// The operator's, not a key's: environments are named for every key, and built and
/// deleted under the `admin` scope. Their stored trees, each once however many names
/// point at it.
impl Kept for Environments {
    fn kept(&self, whose: Whose<'_>) -> u64 {
        match whose {
            Whose::Operator => {
                let mut trees = std::collections::HashMap::new();
                for info in self.list().unwrap_or_default() {
                    trees.insert(info.hash, info.size_bytes);
                }
                trees.values().sum()
            }
            Whose::Key(_) => 0,
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
}
