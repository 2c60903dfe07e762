//! Why an environment cannot be had: unknown, invalid, busy, corrupt, or its build failed.

use std::io;
use std::path::{Path, PathBuf};

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

pub(super) fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> EnvError + 'a {
    move |source| EnvError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}
