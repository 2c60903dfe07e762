//! Files that outlive a crash and a power loss: written whole beside their place, synced, put
//! in place in one step (a rename, or a link where nothing may be replaced), and their
//! directory synced. A reader finds the file as it was or as it is now, never a part of it,
//! and what was said written stays written. Every small file airlock keeps is written so: the
//! snapshot key, paused sessions' records, volumes' manifests, background executions' states,
//! environments' names, the runner's compiled code. And the lock files by which processes
//! sharing those files take turns ([`open_lock_file`]).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// How a file written aside takes its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Renamed over whatever is there.
    Replace,
    /// Linked there only if nothing is ([`io::ErrorKind::AlreadyExists`] otherwise): what
    /// another process put there first stays.
    New,
}

/// Writes `bytes` to `path`, whole or not at all: into a new file beside it
/// (`<name>.<16 hex digits>.tmp`, mode 0600, never through a link), synced, put at `path` as
/// `place` says, then `path`'s directory synced. On an error the file beside it is removed;
/// one a crash left there ends in `.tmp`, for whoever tidies the directory.
pub fn write_aside(path: &Path, bytes: &[u8], place: Place) -> io::Result<()> {
    let aside = aside_of(path)?;
    let written = write_new(&aside, bytes).and_then(|()| match place {
        Place::Replace => fs::rename(&aside, path),
        Place::New => fs::hard_link(&aside, path).and_then(|()| fs::remove_file(&aside)),
    });
    if let Err(e) = written {
        let _ = fs::remove_file(&aside);
        return Err(e);
    }
    sync_dir_of(path)
}

/// A name beside `path` that no other writer takes at the same time.
fn aside_of(path: &Path) -> io::Result<PathBuf> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random)
        .map_err(|e| io::Error::other(format!("the kernel gave no random bytes: {e}")))?;
    let mut name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a path without a name"))?
        .to_os_string();
    name.push(format!(".{:016x}.tmp", u64::from_le_bytes(random)));
    Ok(path.with_file_name(name))
}

/// Writes `bytes` to the new file `path` (mode 0600), synced.
fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// The lock file at `path` (made, mode 0600, if missing; never through a link), to `flock`.
pub fn open_lock_file(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

/// Syncs the directory that holds `path`: its name there is kept.
pub fn sync_dir_of(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => fs::File::open(dir)?.sync_all(),
        _ => fs::File::open(".")?.sync_all(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "airlock-durable-test-{}-{name}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_is_replaced_whole_and_nothing_is_left_beside_it() {
        let d = dir("replace");
        let path = d.join("meta.json");
        write_aside(&path, b"first", Place::Replace).unwrap();
        write_aside(&path, b"second", Place::Replace).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(names(&d), ["meta.json"]);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_new_file_never_replaces_one_that_is_there() {
        let d = dir("new");
        let path = d.join(".key");
        write_aside(&path, b"first", Place::New).unwrap();
        let again = write_aside(&path, b"second", Place::New).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&path).unwrap(), b"first");
        assert_eq!(names(&d), [".key"]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_write_that_fails_leaves_the_file_as_it_was() {
        let d = dir("fails");
        let path = d.join("name.json");
        write_aside(&path, b"kept", Place::Replace).unwrap();
        // A directory where the file would go: the rename fails, and nothing is left beside.
        let blocked = d.join("blocked");
        fs::create_dir_all(blocked.join("inside")).unwrap();
        assert!(write_aside(&blocked, b"new", Place::Replace).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"kept");
        assert_eq!(names(&d), ["blocked", "name.json"]);
        fs::remove_dir_all(&d).unwrap();
    }
}
