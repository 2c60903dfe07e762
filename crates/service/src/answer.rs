//! What an answer may hold, counted before it is made: the most memory an execution's answer
//! can take ([`answer_bytes`]), reserved before it queues; the reservation a handler hands on
//! to the answer it makes ([`Reserved`]); and the refusal of what does not fit
//! ([`over_budget`]). Writing answers out, and counting each until it is written, is the HTTP
//! adapter's (`http/answer.rs`).

use crate::budget::{OverBudget, Share};
use crate::error::{Error, Kind};

/// Counted besides what an answer holds: the piece being written and what hyper and the
/// socket layer buffer of it.
pub const WINDOW: u64 = 512 << 10;

/// How an execution's answer is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// JSON whose output is escaped as it is written, or a stream of events.
    Json,
    /// An MCP tool result: the output decoded into text blocks, then rmcp's JSON of them,
    /// both whole in memory while it is serialized (up to 3 and 6 bytes per byte written).
    Mcp,
}

/// The most memory an execution's answer can hold under `limits`, sent as `form`.
pub fn answer_bytes(
    engine: &airlock_engine::EngineConfig,
    limits: &airlock_api::Limits,
    form: Form,
) -> u64 {
    let result = engine.result_bytes(limits);
    match form {
        Form::Json => result.saturating_add(WINDOW),
        Form::Mcp => result.saturating_mul(7).saturating_add(WINDOW),
    }
}

/// A reservation a handler made for its answer, for the answer to hold once it is made (and
/// to resize to what it holds).
#[derive(Clone, Debug, Default)]
pub struct Reserved(pub std::sync::Arc<std::sync::Mutex<Option<Share>>>);

impl Reserved {
    /// Keeps `share` for the answer: added to what is already kept.
    pub fn keep(&self, share: Share) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match held.as_mut() {
            Some(kept) => kept.absorb(share),
            None => *held = Some(share),
        }
    }

    /// What is kept, taken.
    pub fn take(&self) -> Option<Share> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The error for a request or answer that does not fit a memory budget.
pub fn over_budget(over: OverBudget, what: &str) -> Error {
    match over {
        OverBudget::Key => Error::new(
            Kind::RateLimited,
            "rate_limited",
            format!("this key has too many {what} in memory at once"),
        )
        .retry_after(1),
        OverBudget::All => Error::new(
            Kind::Unavailable,
            "overloaded",
            format!("too many {what} are in memory at once"),
        )
        .retry_after(1),
    }
}
