//! A build's tree: checked (only files, directories and links, within its bytes), copied
//! out of its bounded file system, sealed read-only to root with a manifest holding its
//! digest, digested again to be trusted, and removed.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const MANIFEST: &str = "airlock-environment.json";

/// The manifest stored with a built tree.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Manifest {
    pub(super) hash: String,
    pub(super) requirements: Vec<String>,
    pub(super) python: String,
    pub(super) created_at: String,
    pub(super) size_bytes: u64,
    pub(super) packages: Vec<String>,
    /// Digest of every entry of the tree but this manifest (see [`tree_digest`]).
    pub(super) tree: String,
}

pub(super) fn read_manifest(dir: &Path) -> Result<Manifest, String> {
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
pub(super) fn build_entries(max_bytes: u64) -> u64 {
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
pub(super) fn take_over(from: &Path, dir: &Path, max_bytes: u64) -> io::Result<()> {
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
pub(super) fn seal(
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
pub(super) fn tree_digest(dir: &Path) -> io::Result<(String, u64)> {
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
pub(super) fn remove_tree(dir: &Path) -> io::Result<()> {
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
    fn a_tampered_tree_changes_its_digest() {
        let dir = std::env::temp_dir().join(format!("airlock-envtest-{}", std::process::id()));
        let _ = remove_tree(&dir);
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
