//! Python-style errors: an exception type and a message.

use std::fmt;

/// What went wrong, named as CPython names its exceptions, plus the kinds
/// that are ours (`NotAllowedError` for syntax we refuse; `MemoryError` and
/// `TimeoutError` carry our budgets' messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    SyntaxError,
    NotAllowedError,
    TypeError,
    ValueError,
    ZeroDivisionError,
    OverflowError,
    IndexError,
    KeyError,
    MemoryError,
    TimeoutError,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::SyntaxError => "SyntaxError",
            ErrorKind::NotAllowedError => "NotAllowedError",
            ErrorKind::TypeError => "TypeError",
            ErrorKind::ValueError => "ValueError",
            ErrorKind::ZeroDivisionError => "ZeroDivisionError",
            ErrorKind::OverflowError => "OverflowError",
            ErrorKind::IndexError => "IndexError",
            ErrorKind::KeyError => "KeyError",
            ErrorKind::MemoryError => "MemoryError",
            ErrorKind::TimeoutError => "TimeoutError",
        }
    }
}

/// An evaluation error: `Display` gives `Type: message` like a traceback's
/// last line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    /// Set when one of the evaluator's budgets (not Python) refused the work.
    pub limit: bool,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            limit: false,
        }
    }

    pub(crate) fn limit(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            limit: true,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(self.kind.as_str())
        } else {
            write!(f, "{}: {}", self.kind.as_str(), self.message)
        }
    }
}

impl std::error::Error for Error {}

pub(crate) type Result<T> = std::result::Result<T, Error>;

pub(crate) fn type_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::TypeError, message)
}

pub(crate) fn value_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::ValueError, message)
}

pub(crate) fn zero_division(message: &str) -> Error {
    Error::new(ErrorKind::ZeroDivisionError, message)
}

pub(crate) fn overflow(message: &str) -> Error {
    Error::new(ErrorKind::OverflowError, message)
}
