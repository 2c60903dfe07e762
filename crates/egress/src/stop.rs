//! How an intercepted connection ends before its natural end: why ([`Stop`]: an answer the
//! code reads first, or both ends closed now), and the meter of its bytes against the budgets
//! that can end it ([`Meter`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Why an intercepted connection stopped before its natural end.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Answer the code with this (no byte of an answer was sent yet), then close.
    Reply {
        status: &'static str,
        denied: bool,
        reason: &'static str,
        detail: String,
    },
    /// Close both ends now.
    Cut {
        denied: bool,
        reason: &'static str,
        detail: Option<String>,
    },
}

impl Stop {
    pub(crate) fn reply(
        status: &'static str,
        reason: &'static str,
        detail: impl Into<String>,
    ) -> Stop {
        Stop::Reply {
            status,
            denied: false,
            reason,
            detail: detail.into(),
        }
    }

    pub(crate) fn denied(
        status: &'static str,
        reason: &'static str,
        detail: impl Into<String>,
    ) -> Stop {
        Stop::Reply {
            status,
            denied: true,
            reason,
            detail: detail.into(),
        }
    }

    pub(crate) fn cut(reason: &'static str, detail: impl Into<String>) -> Stop {
        Stop::Cut {
            denied: false,
            reason,
            detail: Some(detail.into()),
        }
    }

    pub(crate) fn io(e: io::Error) -> Stop {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Stop::Cut {
                denied: false,
                reason: "idle_timeout",
                detail: None,
            },
            _ => Stop::cut("connection_lost", e.to_string()),
        }
    }
}

/// The byte counts, budgets and idle timeout an intercepted connection is relayed under.
pub(crate) struct Meter<'a> {
    pub bytes_out: &'a AtomicU64,
    pub bytes_in: &'a AtomicU64,
    pub max_out: u64,
    pub max_in: u64,
    /// Longest wait for the upstream's next bytes.
    pub idle: Duration,
    /// This connection's own counts.
    pub out: u64,
    pub inn: u64,
}

impl Meter<'_> {
    pub(crate) fn sent(&mut self, n: usize) -> Result<(), Stop> {
        self.out += n as u64;
        spend(self.bytes_out, n as u64, self.max_out, "bytes_out_budget")
    }

    pub(crate) fn received(&mut self, n: usize) -> Result<(), Stop> {
        self.inn += n as u64;
        spend(self.bytes_in, n as u64, self.max_in, "bytes_in_budget")
    }
}

/// Counts `n` bytes in `account`; past `max`, the connection is cut for `reason`.
fn spend(account: &AtomicU64, n: u64, max: u64, reason: &'static str) -> Result<(), Stop> {
    if account.fetch_add(n, Ordering::Relaxed) + n > max {
        return Err(Stop::Cut {
            denied: true,
            reason,
            detail: None,
        });
    }
    Ok(())
}
