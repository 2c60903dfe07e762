//! The limits an evaluation runs under, and the meter that enforces them.

use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};

/// Bounds on one evaluation. [`Default`] is what the CLI and the service use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest accepted expression, in bytes (at most [`Limits::MAX_INPUT`]).
    pub max_input_bytes: usize,
    /// Bytes of values the evaluation may create, in total.
    pub max_memory_bytes: usize,
    /// Widest integer the evaluation may create, in bits.
    pub max_int_bits: u64,
    /// Longest `repr()` of the result, in bytes.
    pub max_result_bytes: usize,
    /// Wall-clock time for parsing and evaluating.
    pub timeout: Duration,
}

impl Limits {
    /// The ceiling for `max_input_bytes`, whatever the configuration says.
    pub const MAX_INPUT: usize = 64 << 10;
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_input_bytes: 10_000,
            max_memory_bytes: 16 << 20,
            max_int_bits: 1 << 17,
            max_result_bytes: 1 << 20,
            timeout: Duration::from_millis(100),
        }
    }
}

/// Counts what an evaluation spends. Work is metered in steps; the clock is
/// read every 1024 steps.
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) limits: Limits,
    memory: usize,
    steps: u64,
    deadline: Instant,
}

impl Budget {
    pub(crate) fn new(limits: &Limits) -> Budget {
        Budget {
            limits: limits.clone(),
            memory: 0,
            steps: 0,
            deadline: Instant::now() + limits.timeout,
        }
    }

    pub(crate) fn tick(&mut self) -> Result<()> {
        self.ticks(1)
    }

    pub(crate) fn ticks(&mut self, n: u64) -> Result<()> {
        let before = self.steps >> 10;
        self.steps += n;
        if self.steps >> 10 != before && Instant::now() > self.deadline {
            return Err(Error::limit(
                ErrorKind::TimeoutError,
                format!(
                    "evaluation took longer than {} ms",
                    self.limits.timeout.as_millis()
                ),
            ));
        }
        Ok(())
    }

    /// Accounts for a value of `bytes` about to be created, before creating it.
    pub(crate) fn alloc(&mut self, bytes: usize) -> Result<()> {
        self.memory = self.memory.saturating_add(bytes);
        if self.memory > self.limits.max_memory_bytes {
            return Err(Error::limit(
                ErrorKind::MemoryError,
                format!(
                    "the expression needs more than {} bytes of values",
                    self.limits.max_memory_bytes
                ),
            ));
        }
        // Copying memory costs time too: one step per 64 bytes.
        self.ticks(bytes as u64 / 64)
    }

    /// Accounts for an integer of `bits` about to be created.
    pub(crate) fn int_bits(&mut self, bits: u64) -> Result<()> {
        if bits > self.limits.max_int_bits {
            return Err(Error::limit(
                ErrorKind::MemoryError,
                format!(
                    "integer too large: about {bits} bits, the limit is {}",
                    self.limits.max_int_bits
                ),
            ));
        }
        self.alloc((bits / 8) as usize)
    }
}
