//! Which host paths the Python interpreter needs, mounted read-only and nothing else.

use std::fs;
use std::path::{Path, PathBuf};

use airlock_sandbox::RootEntry;

/// The interpreter as the sandbox sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// Path of the interpreter inside the sandbox (the same as on the host).
    pub path: PathBuf,
    /// `major.minor`.
    pub version: String,
    /// Read-only host paths, links and small files that make up the sandbox's root.
    pub root: Vec<RootEntry>,
    /// Directories to append to `sys.path` (the interpreter runs with `-I -S`).
    pub extra_sys_path: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    #[error("python interpreter {path:?}: {source}")]
    Missing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("python interpreter {0:?} is not named pythonX.Y once symbolic links are resolved")]
    Unrecognised(PathBuf),
    #[error("python interpreter {path:?}: its standard library {stdlib:?} is missing")]
    NoStdlib { path: PathBuf, stdlib: PathBuf },
}

/// The synthetic user database: programs that look themselves up find a name.
const PASSWD: &str = "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                      sandbox:x:1000:1000:airlock sandbox:/work:/usr/sbin/nologin\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n";
const HOSTS: &str = "127.0.0.1 localhost\n::1 localhost\n";

impl Interpreter {
    /// Works out the paths for a CPython laid out like Debian's (`<prefix>/bin/pythonX.Y`,
    /// `<prefix>/lib/pythonX.Y`, shared libraries in `/usr/lib/<multiarch>`), or one built
    /// into its own prefix such as `/opt/python`, which is then mounted whole.
    pub fn detect(python: &Path) -> Result<Self, InterpreterError> {
        let missing = |source| InterpreterError::Missing {
            path: python.to_owned(),
            source,
        };
        let real = fs::canonicalize(python).map_err(missing)?;
        let meta = fs::metadata(&real).map_err(missing)?;
        if !meta.is_file() {
            return Err(missing(std::io::ErrorKind::InvalidInput.into()));
        }
        let version = real
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("python"))
            .filter(|v| v.split('.').count() == 2 && v.split('.').all(|p| p.parse::<u32>().is_ok()))
            .ok_or_else(|| InterpreterError::Unrecognised(real.clone()))?
            .to_owned();
        let prefix = real
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/usr"))
            .to_owned();
        let stdlib = prefix.join("lib").join(format!("python{version}"));
        if !stdlib.is_dir() {
            return Err(InterpreterError::NoStdlib {
                path: python.to_owned(),
                stdlib,
            });
        }

        let mut root = Vec::new();
        let ro = |p: &Path| RootEntry::ReadOnly {
            source: p.to_owned(),
            target: p.to_owned(),
        };
        let mut extra_sys_path = Vec::new();
        if prefix == Path::new("/usr") {
            root.push(ro(&real));
            root.push(ro(&stdlib));
            let dist = prefix.join("lib/python3/dist-packages");
            if dist.is_dir() {
                root.push(ro(&dist));
                extra_sys_path.push(dist.to_string_lossy().into_owned());
            }
        } else {
            root.push(ro(&prefix));
        }
        // Shared libraries and the dynamic loader.
        let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
        for dir in [format!("/usr/lib/{multiarch}"), "/usr/lib64".to_owned()] {
            let dir = PathBuf::from(dir);
            if dir.is_dir() && !root.iter().any(|e| e.path() == dir) {
                root.push(ro(&dir));
            }
        }
        // Libraries chosen through Debian's alternatives (libblas.so.3 -> /etc/alternatives/
        // ... -> openblas, which numpy loads): the link in /etc/alternatives, when the library
        // it names is in the sandbox anyway. Nothing else of /etc comes in.
        root.extend(alternatives(&root));
        // Merged-/usr links (/lib -> usr/lib, ...), as the host has them.
        for link in ["/bin", "/lib", "/lib64"] {
            let link = Path::new(link);
            if let Ok(target) = fs::read_link(link) {
                root.push(RootEntry::Symlink {
                    target,
                    path: link.to_owned(),
                });
            } else if link == Path::new("/lib64") && link.is_dir() {
                root.push(ro(link));
            } else if link == Path::new("/lib") && link.join(&multiarch).is_dir() {
                root.push(ro(&link.join(&multiarch)));
            }
        }
        if python != real {
            let target = real
                .file_name()
                .map(PathBuf::from)
                .unwrap_or_else(|| real.clone());
            let same_dir = python.parent() == real.parent();
            let target = if same_dir { target } else { real.clone() };
            root.push(RootEntry::Symlink {
                target,
                path: python.to_owned(),
            });
        }
        // Public data the packages read: time zones (zoneinfo, pytz, pandas) and
        // matplotlib's fonts and styles.
        for data in ["/usr/share/zoneinfo", "/usr/share/matplotlib"] {
            let data = Path::new(data);
            if data.is_dir() {
                root.push(ro(data));
            }
        }
        if Path::new("/etc/ld.so.cache").is_file() {
            root.push(ro(Path::new("/etc/ld.so.cache")));
        }
        for (path, contents) in [
            ("/etc/passwd", PASSWD),
            ("/etc/group", GROUP),
            ("/etc/hosts", HOSTS),
        ] {
            root.push(RootEntry::File {
                path: path.into(),
                contents: contents.into(),
            });
        }
        Ok(Interpreter {
            path: python.to_owned(),
            version,
            root,
            extra_sys_path,
        })
    }
}

/// The `/etc/alternatives` links for shared libraries (`libblas.so.3-x86_64-linux-gnu`, ...)
/// whose targets are inside the read-only directories of `root`: a library link there may go
/// through one. Only names of shared objects are read, so that this stays cheap for every
/// `airlock run`.
fn alternatives(root: &[RootEntry]) -> Vec<RootEntry> {
    let alternatives = Path::new("/etc/alternatives");
    let dirs: Vec<&Path> = root
        .iter()
        .filter_map(|e| match e {
            RootEntry::ReadOnly { target, .. } if target.is_dir() => Some(target.as_path()),
            _ => None,
        })
        .collect();
    let mut links: Vec<(PathBuf, PathBuf)> = fs::read_dir(alternatives)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".so"))
        .filter_map(|e| {
            let target = fs::read_link(e.path()).ok()?;
            let inside = target.is_absolute() && dirs.iter().any(|d| target.starts_with(d));
            inside.then(|| (e.path(), target))
        })
        .collect();
    links.sort();
    links
        .into_iter()
        .map(|(path, target)| RootEntry::Symlink { target, path })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_python_gets_only_its_own_paths() {
        let Ok(interp) = Interpreter::detect(Path::new("/usr/bin/python3")) else {
            panic!("/usr/bin/python3 is required by the test suite (scripts/test.sh installs it)");
        };
        let paths: Vec<&Path> = interp.root.iter().map(RootEntry::path).collect();
        assert!(paths.contains(&Path::new("/usr/bin/python3")));
        assert!(paths.contains(&Path::new(&format!("/usr/lib/python{}", interp.version))));
        for forbidden in ["/usr", "/etc", "/root", "/home", "/usr/local", "/usr/bin"] {
            assert!(
                !paths.contains(&Path::new(forbidden)),
                "{forbidden} must not be mounted"
            );
        }
        for entry in &interp.root {
            if let RootEntry::ReadOnly { source, target } = entry {
                assert_eq!(source, target);
                assert!(!source.starts_with("/etc") || source == Path::new("/etc/ld.so.cache"));
            }
        }
    }

    #[test]
    fn unknown_interpreters_are_refused_clearly() {
        let err = Interpreter::detect(Path::new("/nonexistent/python3")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/python3"), "{err}");
        let err = Interpreter::detect(Path::new("/bin/sh")).unwrap_err();
        assert!(matches!(err, InterpreterError::Unrecognised(_)), "{err}");
    }
}
