//! `[eval]` and `[pickle]`: what is answered without a sandbox, and its budgets.

use serde::{Deserialize, Serialize};

/// The pickle scanner (`POST /v1/pickle/scan`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PickleConfig {
    /// Globals allowed besides the built-in list, as exact `module.qualname`.
    pub allow: Vec<String>,
    /// Largest pickle scanned, and most an archive's members may inflate to together: the
    /// scan holds up to about 128 bytes of memory per byte it reads.
    pub max_bytes: u64,
    /// Scans at once; others wait.
    pub max_running: usize,
}

impl Default for PickleConfig {
    fn default() -> Self {
        PickleConfig {
            allow: Vec::new(),
            max_bytes: 16 << 20,
            max_running: 2,
        }
    }
}

impl PickleConfig {
    pub fn options(&self) -> airlock_pickle::Options {
        let mut opts = airlock_pickle::Options::default();
        opts.allow.extend(self.allow.iter().cloned());
        opts.max_bytes = usize::try_from(self.max_bytes).unwrap_or(usize::MAX);
        opts
    }
}

/// The native evaluator's budgets, per expression (`POST /v1/eval`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Longest expression, in bytes (at most 65536).
    pub max_input_bytes: usize,
    /// Bytes of values one expression may create.
    pub max_memory_bytes: usize,
    /// Widest integer one expression may create, in bits.
    pub max_int_bits: u64,
    /// Longest repr of a result, in bytes.
    pub max_result_bytes: usize,
    /// Wall clock for parsing and evaluating one expression.
    pub timeout_ms: u64,
    /// Expressions evaluated at once (0: one per CPU); more wait their turn.
    pub max_running: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        let l = airlock_pyeval::Limits::default();
        EvalConfig {
            max_input_bytes: l.max_input_bytes,
            max_memory_bytes: l.max_memory_bytes,
            max_int_bits: l.max_int_bits,
            max_result_bytes: l.max_result_bytes,
            timeout_ms: l.timeout.as_millis() as u64,
            max_running: 0,
        }
    }
}

impl EvalConfig {
    pub fn limits(&self) -> airlock_pyeval::Limits {
        airlock_pyeval::Limits {
            max_input_bytes: self.max_input_bytes,
            max_memory_bytes: self.max_memory_bytes,
            max_int_bits: self.max_int_bits,
            max_result_bytes: self.max_result_bytes,
            timeout: std::time::Duration::from_millis(self.timeout_ms),
        }
    }
}
