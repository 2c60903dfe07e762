//! The paths a request names inside a sandbox (input files, a session's files, the files a
//! program returns, a volume's): relative to the working directory, plain parts only, each a
//! name a file system takes.

use std::path::{Component, Path};

/// The most bytes one part of a path may have: the longest name Linux takes (`NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// `path` must stay inside the working directory: relative, normal components only, each a
/// name a file system takes.
pub fn check_relative_path(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    let normal = !path.is_empty()
        && !path.contains('\0')
        && !path.ends_with('/')
        && p.components().all(|c| matches!(c, Component::Normal(_)))
        && !path.split('/').any(|c| c.is_empty() || c == ".");
    if !normal {
        return Err(format!(
            "invalid file path {path:?}: must be relative, without `.`, `..` or empty parts"
        ));
    }
    match path.split('/').find(|c| c.len() > MAX_NAME_BYTES) {
        Some(long) => Err(format!(
            "invalid file path: a part of it is {} bytes long, more than the {MAX_NAME_BYTES} \
             a file name may have",
            long.len()
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_only() {
        let longest = "n".repeat(MAX_NAME_BYTES);
        for ok in [
            "a.txt",
            "data/x.csv",
            "a/b/c",
            &longest,
            &format!("a/{longest}/b"),
        ] {
            assert!(check_relative_path(ok).is_ok(), "{ok}");
        }
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        for bad in [&long, &format!("a/{long}"), &format!("{long}/a")] {
            assert!(check_relative_path(bad).is_err(), "{bad}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "./a",
            "a//b",
            "a/",
            "a/./b",
            "a\0b",
        ] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
    }
}
