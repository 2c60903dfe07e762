//! What the engine refuses, and why nothing ran: a job refused before any sandbox starts
//! (`Refusal`, naming the request's field), and every other reason (`EngineError`).

use airlock_sandbox::SpawnError;

use crate::config::LimitError;
use crate::interpreter::InterpreterError;

/// A job refused before any sandbox starts: the field of the request at fault, and why. The
/// engine is the one owner of these checks; the server and the CLI map them to their answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// As a request names it: `code`, `stdin`, `env`, `env.NAME`, `files`, `files[2].path`,
    /// `entrypoint`, `inputs.x`, `path`.
    pub field: String,
    pub kind: RefusalKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// Over a size or count limit.
    TooLarge,
    /// Not a value the field may hold.
    Invalid,
}

impl Refusal {
    pub(crate) fn too_large(field: impl Into<String>, message: String) -> Self {
        Refusal {
            field: field.into(),
            kind: RefusalKind::TooLarge,
            message,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Refusal {
            field: field.into(),
            kind: RefusalKind::Invalid,
            message: message.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Invalid(#[from] Refusal),
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error(transparent)]
    Interpreter(#[from] InterpreterError),
    #[error("cannot start a sandbox: {0}")]
    Spawn(#[from] SpawnError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the execution was cancelled before its sandbox started")]
    Cancelled,
    /// A pooled child of the preloading zygote was asked for while that zygote cannot serve:
    /// a cold sandbox in its place would hold none of its preloads, so the pool waits.
    #[error("the preloading zygote is not ready")]
    ZygoteNotReady,
}
