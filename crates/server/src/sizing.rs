//! The most memory `airlock serve` can hold under a configuration, part by part, so that an
//! operator can size a host (`airlock doctor --config`, and a line at start-up).

use serde::Serialize;

use airlock_service::answer::{answer_bytes, Form};
use airlock_service::config::Config;

/// One part of the server's worst-case memory.
#[derive(Clone, Debug, Serialize)]
pub struct Part {
    pub name: &'static str,
    pub bytes: u64,
    /// How it is bounded, with the settings that bound it.
    pub how: String,
}

/// Memory of a connection besides what the budget counts: hyper's read buffer and the wire
/// guard's copy of a head (`MAX_HEAD` each), hyper's write buffer and the piece being
/// written (an answer's piece is at most 192 KiB).
const PER_CONNECTION: u64 = 2 * crate::wire::MAX_HEAD as u64 + (64 << 10) + (192 << 10);
/// Bytes of memory per byte of the sandbox's response while it is parsed: a list of one-digit
/// numbers is two bytes of JSON per 72-byte [`serde_json::Value`], in a vector that may have
/// grown to twice its length.
const PARSED_PER_BYTE: u64 = 72;
/// What the pickle scanner may hold per byte it reads (see `[pickle] max_bytes`).
const PICKLE_PER_BYTE: u64 = 128;
/// The server itself: code, runtime, tables, logs.
const BASE: u64 = 32 << 20;

/// Whether one execution's answer at the ceilings (and one MCP call's at the defaults) fits
/// a key's share of the memory budget: were it larger, such an execution could never be
/// admitted. Checked where the budget is built (`airlock serve`, `airlock mcp`) and by
/// `airlock doctor`.
pub fn check(config: &Config) -> Result<(), String> {
    let e = &config.engine;
    let share = config.http.max_buffered_bytes_per_key;
    for (what, bytes) in [
        (
            "an execution at engine.ceilings",
            answer_bytes(e, &e.ceilings, Form::Json),
        ),
        (
            "an MCP call at engine.defaults",
            answer_bytes(e, &e.defaults, Form::Mcp),
        ),
    ] {
        if bytes > share {
            return Err(format!(
                "http.max_buffered_bytes_per_key = {share} is less than the {bytes} bytes the \
                 answer of {what} may hold (both output streams at output_bytes, the result, a \
                 write window): raise it, or lower output_bytes"
            ));
        }
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The server's worst case under `config`, part by part (the sandboxes' own memory is in
/// their cgroups, outside the server: see [`sandboxes`]).
pub fn worst_case(config: &Config) -> Vec<Part> {
    let h = &config.http;
    let e = &config.engine;
    let running = config.concurrency.max_running as u64;
    let response = e.max_result_bytes + (128 << 10);
    let eval_running = airlock_service::services::eval_slots(config) as u64;
    let ev = &config.eval;
    let eval_each = ev.max_memory_bytes as u64 + 8 * ev.max_result_bytes as u64;
    vec![
        Part {
            name: "bodies and answers",
            bytes: h.max_buffered_bytes,
            how: format!(
                "http.max_buffered_bytes: request bodies, what each execution in flight \
                 reserves for its answer ({} at the ceilings, {} at the defaults, {} for an MCP \
                 call), answers not yet written out; one key holds at most \
                 http.max_buffered_bytes_per_key = {}",
                mib(answer_bytes(e, &e.ceilings, Form::Json)),
                mib(answer_bytes(e, &e.defaults, Form::Json)),
                mib(answer_bytes(e, &e.defaults, Form::Mcp)),
                mib(h.max_buffered_bytes_per_key)
            ),
        },
        Part {
            name: "connections",
            bytes: h.max_connections as u64 * PER_CONNECTION,
            how: format!(
                "http.max_connections = {} x {} of buffers each",
                h.max_connections,
                mib(PER_CONNECTION)
            ),
        },
        Part {
            name: "results being parsed",
            bytes: running * PARSED_PER_BYTE * response,
            how: format!(
                "concurrency.max_running = {running} x up to {PARSED_PER_BYTE} bytes per byte of \
                 a sandbox's response (engine.max_result_bytes + 128 KiB = {}), for a moment \
                 as each execution ends",
                mib(response)
            ),
        },
        Part {
            name: "pickle scans",
            bytes: config.pickle.max_running as u64 * PICKLE_PER_BYTE * config.pickle.max_bytes,
            how: format!(
                "pickle.max_running = {} x up to {PICKLE_PER_BYTE} bytes per byte of \
                 pickle.max_bytes = {}",
                config.pickle.max_running,
                mib(config.pickle.max_bytes)
            ),
        },
        Part {
            name: "evaluations",
            bytes: eval_running * eval_each,
            how: format!(
                "eval.max_running = {eval_running} x (eval.max_memory_bytes + 8 x \
                 eval.max_result_bytes) = {} each",
                mib(eval_each)
            ),
        },
        Part {
            name: "the server itself",
            bytes: BASE,
            how: "code, runtime, tables".into(),
        },
    ]
}

/// The sandboxes' memory, each in its own cgroup: executions running and sessions open, at
/// the ceilings' memory limit.
pub fn sandboxes(config: &Config) -> Part {
    let n = config.concurrency.max_running as u64 + config.sessions.max_open as u64;
    let each = config.engine.ceilings.memory_mb << 20;
    Part {
        name: "sandboxes",
        bytes: n.saturating_mul(each),
        how: format!(
            "(concurrency.max_running = {} + sessions.max_open = {}) x \
             engine.ceilings.memory_mb = {} MiB, each in its own cgroup; idle pooled sandboxes \
             add 6-10 MiB each (pool.max_size = {})",
            config.concurrency.max_running,
            config.sessions.max_open,
            config.engine.ceilings.memory_mb,
            config.pool.max_size
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_the_largest_part_of_a_default_server() {
        let config = Config::default();
        let parts = worst_case(&config);
        assert_eq!(parts[0].bytes, config.http.max_buffered_bytes);
        // 131 MiB of answer for one execution at the ceilings (64 MiB per stream).
        assert!(
            parts[0].how.contains("130.8 MiB at the ceilings"),
            "{}",
            parts[0].how
        );
        let total: u64 = parts.iter().map(|p| p.bytes).sum();
        assert!(total < 8 << 30, "{total}");
    }
}
