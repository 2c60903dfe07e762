//! Any input: an answer or a Python-style error, never a panic, a hang or a
//! stack overflow. Small budgets keep each run short.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let limits = airlock_pyeval::Limits {
        max_memory_bytes: 1 << 20,
        max_int_bits: 4096,
        max_result_bytes: 1 << 16,
        timeout: Duration::from_millis(50),
        ..airlock_pyeval::Limits::default()
    };
    match airlock_pyeval::evaluate(text, &limits) {
        Ok(v) => assert!(!v.repr.is_empty() && !v.type_name.is_empty()),
        Err(e) => assert!(!e.kind.as_str().is_empty()),
    }
});
