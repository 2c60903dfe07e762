//! `[http]`, `[cors]`, `[concurrency]`, `[metrics]` and `[mcp]`: how requests come in, and how
//! many run at once.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Largest request body, counted on the bytes received (chunked bodies included).
    pub max_body_bytes: u64,
    /// Time allowed to send a request's headers; idle keep-alive connections close after it.
    pub header_timeout_ms: u64,
    /// Time allowed to send a request's body.
    pub body_timeout_ms: u64,
    /// Open connections at once. At the cap, a new connection closes one that is not in the
    /// middle of a request (idle, or still sending its head): from the address with the most
    /// connections, anonymous before authenticated, oldest first.
    pub max_connections: usize,
    /// Memory for request bodies and answers, all requests together: bodies received (or
    /// parsed and waiting for a slot), what each execution in flight reserves for its answer
    /// (both output streams at `output_bytes`, the result, a write window), and answers made
    /// but not yet written out. Past it, 503.
    pub max_buffered_bytes: u64,
    /// The share of `max_buffered_bytes` one key may hold; past it, 429. It must hold the
    /// answer of one execution at the ceilings.
    pub max_buffered_bytes_per_key: u64,
    /// A client must take its answer at `answer_min_bytes_per_second` or more, over every
    /// stretch of this long in which the answer waits for it; otherwise its connection is
    /// closed and the answer's memory freed (the `slow_reader` security event).
    pub answer_timeout_ms: u64,
    /// See `answer_timeout_ms`. 0 cuts off only clients that take nothing at all.
    pub answer_min_bytes_per_second: u64,
    /// `GET /readyz` without a key answers `{"ready": ...}` and its status, nothing else (a
    /// key still gets the reasons): for probes that cannot hold a key, such as Kubernetes'.
    pub readyz_without_key: bool,
    /// A streamed answer (`text/event-stream`) sends a comment line after this long without
    /// an event, so that a proxy's idle timeout does not cut a silent program's stream. 0:
    /// never.
    pub sse_keep_alive_ms: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 16 << 20,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            max_connections: 256,
            max_buffered_bytes: 1 << 30,
            max_buffered_bytes_per_key: 256 << 20,
            answer_timeout_ms: 10_000,
            answer_min_bytes_per_second: 16 << 10,
            readyz_without_key: false,
            sse_keep_alive_ms: 15_000,
        }
    }
}

/// Cross-origin access for browsers. Off (no CORS headers at all) unless origins are listed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Exact origins (`https://app.example:8443`); `*` and `null` are refused.
    pub allowed_origins: Vec<String>,
    /// Send `Access-Control-Allow-Credentials: true` to the listed origins.
    pub allow_credentials: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConcurrencyConfig {
    /// Executions running at once, for all keys together; a slot given back goes to the
    /// waiting key that started one least recently.
    pub max_running: usize,
    /// Executions waiting for a slot, for all keys together; past it, 503.
    pub max_queue: usize,
    /// Longest wait in the queue before 503.
    pub queue_timeout_ms: u64,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        ConcurrencyConfig {
            max_running: 4,
            max_queue: 64,
            queue_timeout_ms: 30_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `GET /metrics` needs a key with the `metrics` scope.
    pub require_auth: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { require_auth: true }
    }
}

/// The MCP endpoint (`/mcp`). It answers like every other route: only for the Host names in
/// `allowed_hosts` (and localhost and the listen address), only to browsers on the origins in
/// `cors.allowed_origins` (none by default), and only to keys with the `execute` scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Serve `/mcp`; when false it is 404 like any unknown route.
    pub enabled: bool,
    /// The tools the code of `airlock mcp` (stdio, one local user) may call: `server.tool`
    /// patterns as in a key's `tools`. Default: every read-only tool.
    pub stdio_tools: Vec<String>,
    /// How often a `run_python` or `run_in_session` call whose host gave a progress token
    /// sends `notifications/progress` while it runs, in ms (1 to 10000: hosts with short
    /// timeouts wait on while they hear from the call at least every 10 s).
    pub progress_interval_ms: u64,
}

/// The longest `mcp.progress_interval_ms`: the MCP hosts that give up on a silent call do so
/// after tens of seconds, so every 10 s keeps them waiting.
pub const MAX_PROGRESS_INTERVAL_MS: u64 = 10_000;

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            enabled: true,
            stdio_tools: vec!["*.*".into()],
            progress_interval_ms: 5000,
        }
    }
}
