//! One tool server: started (stdio) or reached (streamable HTTP) with rmcp's client, its tools
//! listed, and supervised: when it dies it is started again, with a backoff, and its state is
//! there for `/readyz`, `airlock doctor`, metrics and logs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::service::{Peer, RoleClient, RunningService};
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use crate::config::SourceConfig;
use crate::slots::Slots;

/// First wait before a restart, doubled after each failure up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A server that stayed up this long starts its backoff afresh when it dies.
const STABLE: Duration = Duration::from_secs(60);
/// Longest line of a server's stderr copied to airlock's log.
const LOG_LINE: usize = 1024;

/// One tool as its server lists it, with its input schema compiled.
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    pub input_schema: serde_json::Value,
    /// The tool's annotations say `readOnlyHint: true`.
    pub read_only: bool,
    /// Its output schema is one required property `result`: the SDKs' wrapping of a result
    /// that is not an object, which the code gets unwrapped.
    pub wraps_result: bool,
    pub(crate) validator: jsonschema::Validator,
}

impl std::fmt::Debug for ToolInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolInfo")
            .field("name", &self.name)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// Where a server is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceState {
    Starting,
    Ready,
    /// Stopped or failed; a restart is on its way.
    Down,
}

/// A server's state, as `/readyz` and `airlock doctor` show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SourceStatus {
    pub name: String,
    pub transport: &'static str,
    pub state: SourceState,
    pub tools: usize,
    pub restarts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug)]
struct Inner {
    state: SourceState,
    tools: Arc<Vec<Arc<ToolInfo>>>,
    peer: Option<Peer<RoleClient>>,
    restarts: u64,
    error: Option<String>,
    /// Attempts to start it so far.
    attempts: u64,
}

#[derive(Debug)]
pub(crate) struct Source {
    pub name: String,
    pub config: SourceConfig,
    inner: Mutex<Inner>,
    changed: tokio::sync::Notify,
    /// Calls running on this server at once, shared fairly by the keys.
    pub slots: Arc<Slots>,
    /// The process group of the stdio server running now, to kill at shutdown (a server
    /// that ignores the end of its input would outlive airlock otherwise).
    group: Mutex<Option<i32>>,
}

impl Source {
    pub fn new(name: String, config: SourceConfig, slots: Arc<Slots>) -> Self {
        Source {
            name,
            config,
            inner: Mutex::new(Inner {
                state: SourceState::Starting,
                tools: Arc::new(Vec::new()),
                peer: None,
                restarts: 0,
                error: None,
                attempts: 0,
            }),
            changed: tokio::sync::Notify::new(),
            slots,
            group: Mutex::new(None),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn transport(&self) -> &'static str {
        if self.config.url.is_some() {
            "streamable_http"
        } else {
            "stdio"
        }
    }

    pub fn status(&self) -> SourceStatus {
        let inner = self.inner();
        SourceStatus {
            name: self.name.clone(),
            transport: self.transport(),
            state: inner.state,
            tools: inner.tools.len(),
            restarts: inner.restarts,
            error: inner.error.clone(),
        }
    }

    /// The tools it lists now (none while it is down).
    pub fn tools(&self) -> Arc<Vec<Arc<ToolInfo>>> {
        let inner = self.inner();
        match inner.state {
            SourceState::Ready => inner.tools.clone(),
            _ => Arc::new(Vec::new()),
        }
    }

    /// The tools it listed last, up or not (to check grants against).
    pub fn last_tools(&self) -> Arc<Vec<Arc<ToolInfo>>> {
        self.inner().tools.clone()
    }

    pub fn peer(&self) -> Option<Peer<RoleClient>> {
        let inner = self.inner();
        (inner.state == SourceState::Ready)
            .then(|| inner.peer.clone())
            .flatten()
    }

    /// Waits until the first attempt to start it is over; its error, if it failed.
    pub async fn first_attempt(&self) -> Result<(), String> {
        loop {
            let notified = self.changed.notified();
            {
                let inner = self.inner();
                if inner.attempts > 0 && inner.state != SourceState::Starting {
                    return match inner.state {
                        SourceState::Ready => Ok(()),
                        _ => Err(inner.error.clone().unwrap_or_default()),
                    };
                }
            }
            notified.await;
        }
    }

    /// Kills the stdio server's whole process group, if one runs.
    pub fn kill(&self) {
        let group = self.group.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(pgid) = group {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    fn set(&self, f: impl FnOnce(&mut Inner)) {
        f(&mut self.inner());
        self.changed.notify_waiters();
    }

    /// Starts the server, keeps it running, and starts it again when it stops, until
    /// `shutdown`.
    pub async fn supervise(
        self: Arc<Self>,
        start_timeout: Duration,
        max_message_bytes: usize,
        shutdown: CancellationToken,
    ) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let began = Instant::now();
            self.set(|i| {
                i.state = SourceState::Starting;
                if i.attempts > 0 {
                    i.restarts += 1;
                }
            });
            let started = tokio::select! {
                r = tokio::time::timeout(start_timeout, self.connect(max_message_bytes)) => {
                    r.unwrap_or_else(|_| Err(format!(
                        "did not start and list its tools within {} ms",
                        start_timeout.as_millis()
                    )))
                }
                _ = shutdown.cancelled() => return,
            };
            match started {
                Ok((service, tools)) => {
                    let count = tools.len();
                    let peer = service.peer().clone();
                    let pinged = self.config.url.is_some().then(|| peer.clone());
                    self.set(|i| {
                        i.attempts += 1;
                        i.state = SourceState::Ready;
                        i.tools = Arc::new(tools);
                        i.peer = Some(peer);
                        i.error = None;
                    });
                    tracing::info!(server = %self.name, tools = count, "tool server ready");
                    let why = tokio::select! {
                        quit = service.waiting() => format!("{quit:?}"),
                        why = health(pinged) => why,
                        _ = shutdown.cancelled() => return,
                    };
                    // Reaped by now, or about to be: its group id may be reused.
                    *self.group.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    let error = format!("the server stopped ({why})");
                    tracing::warn!(server = %self.name, "{error}; starting it again");
                    self.set(|i| {
                        i.state = SourceState::Down;
                        i.peer = None;
                        i.error = Some(error);
                    });
                    if began.elapsed() > STABLE {
                        backoff = FIRST_BACKOFF;
                    }
                }
                Err(error) => {
                    tracing::warn!(server = %self.name, "tool server failed to start: {error}");
                    self.set(|i| {
                        i.attempts += 1;
                        i.state = SourceState::Down;
                        i.peer = None;
                        i.error = Some(error);
                    });
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn connect(
        &self,
        max_message_bytes: usize,
    ) -> Result<(RunningService<RoleClient, ()>, Vec<Arc<ToolInfo>>), String> {
        let service = match (&self.config.command, &self.config.url) {
            (Some(command), _) => self.start_stdio(command).await?,
            (None, Some(url)) => self.reach_http(url, max_message_bytes).await?,
            (None, None) => return Err("neither `command` nor `url` is set".into()),
        };
        let listed = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| format!("listing its tools failed: {e}"))?;
        let mut tools = Vec::with_capacity(listed.len());
        for tool in listed {
            let schema = serde_json::Value::Object((*tool.input_schema).clone());
            let validator = match input_validator(&schema) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(
                        server = %self.name, tool = %tool.name,
                        "the tool's input schema does not compile, so it cannot be called: {e}"
                    );
                    continue;
                }
            };
            tools.push(Arc::new(ToolInfo {
                name: tool.name.to_string(),
                description: tool.description.as_deref().unwrap_or("").to_owned(),
                input_schema: schema,
                read_only: tool
                    .annotations
                    .as_ref()
                    .and_then(|a| a.read_only_hint)
                    .unwrap_or(false),
                wraps_result: tool.output_schema.as_deref().is_some_and(wraps_result),
                validator,
            }));
        }
        Ok((service, tools))
    }

    async fn start_stdio(
        &self,
        command: &std::path::Path,
    ) -> Result<RunningService<RoleClient, ()>, String> {
        use rmcp::transport::TokioChildProcess;
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(&self.config.args).env_clear();
        for (var, secret) in &self.config.env {
            cmd.env(var, secret.read().map_err(|e| format!("{var}: {e}"))?);
        }
        if let Some(dir) = &self.config.cwd {
            cmd.current_dir(dir);
        }
        // A group of its own: it and whatever it starts are killed together.
        cmd.process_group(0);
        let (transport, stderr) = TokioChildProcess::builder(cmd)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", command.display()))?;
        // Not reaped while the transport holds it: the pid is the group's until then.
        *self.group.lock().unwrap_or_else(|e| e.into_inner()) =
            transport.id().and_then(|id| i32::try_from(id).ok());
        if let Some(stderr) = stderr {
            let name = self.name.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let line: String = line.chars().take(LOG_LINE).collect();
                    tracing::info!(server = %name, "tool server: {line}");
                }
            });
        }
        ().serve(transport)
            .await
            .map_err(|e| format!("the MCP handshake failed: {e}"))
    }

    async fn reach_http(
        &self,
        url: &str,
        max_message_bytes: usize,
    ) -> Result<RunningService<RoleClient, ()>, String> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        let mut headers = std::collections::HashMap::new();
        for (name, secret) in &self.config.headers {
            let value = secret.read().map_err(|e| format!("header {name}: {e}"))?;
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| format!("header {name}: {e}"))?;
            let value = reqwest::header::HeaderValue::from_str(&value)
                .map_err(|_| format!("header {name}: the value is not a valid header value"))?;
            headers.insert(name, value);
        }
        let mut config = StreamableHttpClientTransportConfig::with_uri(url);
        config.custom_headers = headers;
        config.max_json_response_size = max_message_bytes;
        config.max_sse_event_size = max_message_bytes;
        // No redirects: a header is for the configured server only.
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        let transport = StreamableHttpClientTransport::with_client(client, config);
        ().serve(transport).await.map_err(|e| {
            format!(
                "the MCP handshake with {url} failed: {}",
                redact(&e.to_string())
            )
        })
    }
}

/// A tool's input schema compiled as the broker checks arguments against it, its `format`s
/// asserted: JSON Schema makes them annotations only (from draft 2019-09 on, the default for
/// a schema naming no draft), and a server that trusts its schema would get an `email` that
/// is none. The formats the `jsonschema` crate knows are checked (docs/tools.md lists them);
/// a name it does not know stays an annotation.
pub(crate) fn input_validator(
    schema: &serde_json::Value,
) -> Result<jsonschema::Validator, jsonschema::ValidationError<'static>> {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
}

/// An output schema with exactly one property, `result`, which is required.
fn wraps_result(schema: &serde_json::Map<String, serde_json::Value>) -> bool {
    let one = |v: Option<&serde_json::Value>, f: &dyn Fn(&serde_json::Value) -> Option<usize>| {
        v.and_then(f) == Some(1)
    };
    let props = schema.get("properties");
    one(props, &|p| p.as_object().map(|o| o.len()))
        && props.and_then(|p| p.get("result")).is_some()
        && schema.get("required") == Some(&serde_json::json!(["result"]))
}

/// How often a streamable HTTP server is pinged: it has no connection whose end says it
/// stopped, so a ping that fails twice in a row does.
const PING_EVERY: Duration = Duration::from_secs(5);

/// Returns when the server stops answering pings; never without a peer to ping (a stdio
/// server, whose process ending ends its service).
async fn health(peer: Option<Peer<RoleClient>>) -> String {
    let Some(peer) = peer else {
        return std::future::pending().await;
    };
    let mut failed = 0;
    loop {
        tokio::time::sleep(PING_EVERY).await;
        let ping = rmcp::model::ClientRequest::PingRequest(Default::default());
        match tokio::time::timeout(PING_EVERY, peer.send_request(ping)).await {
            Ok(Ok(_)) => failed = 0,
            _ => failed += 1,
        }
        if failed >= 2 {
            return "it stopped answering pings".into();
        }
    }
}

/// An error's text without anything after a `?` in a URL it quotes (a query may carry a
/// token; the configured URL has none, but a redirect's target might).
fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_query = false;
    for c in text.chars() {
        match c {
            '?' if !in_query => {
                in_query = true;
                out.push_str("?...");
            }
            c if in_query && (c.is_whitespace() || c == ')' || c == '"') => {
                in_query = false;
                out.push(c);
            }
            _ if in_query => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every format docs/tools.md says is checked: one value that is and one that is not.
    const FORMATS: [(&str, &str, &str); 19] = [
        ("date", "2024-02-29", "2023-02-29"),
        ("date-time", "2024-01-01T12:00:00Z", "2024-01-01 12:00"),
        ("duration", "P3DT4H", "3 days"),
        ("email", "ada@example.com", "not-an-email"),
        ("hostname", "example.com", "exa mple.com"),
        ("idn-email", "ada@例え.jp", "not-an-email"),
        ("idn-hostname", "例え.jp", "例え..jp"),
        ("ipv4", "192.0.2.1", "256.0.2.1"),
        ("ipv6", "2001:db8::1", "2001:db8:::1"),
        ("iri", "https://例え.jp/パス", "パス"),
        ("iri-reference", "/パス?q", "\\\\WINDOWS\\share"),
        ("json-pointer", "/a/b", "a/b"),
        ("regex", "^a+$", "(unclosed"),
        ("relative-json-pointer", "1/a", "/a"),
        ("time", "12:00:00Z", "25:00:00Z"),
        ("uri", "https://example.com/x", "no scheme"),
        ("uri-reference", "/x?y#z", "\\\\WINDOWS\\share"),
        ("uri-template", "/users/{id}", "/users/{id"),
        (
            "uuid",
            "2eb8aa08-aa98-11ea-b4aa-73b441d16380",
            "2eb8aa08aa9811eab4aa",
        ),
    ];

    #[test]
    fn the_formats_of_an_input_schema_are_checked() {
        let docs = include_str!("../../../docs/tools.md");
        for (format, good, bad) in FORMATS {
            let v = input_validator(&json!({
                "type": "object",
                "properties": {"x": {"type": "string", "format": format}}
            }))
            .unwrap();
            assert!(v.is_valid(&json!({"x": good})), "{format}: {good}");
            assert!(!v.is_valid(&json!({"x": bad})), "{format}: {bad}");
            assert!(
                docs.contains(&format!("`{format}`")),
                "docs/tools.md names {format}"
            );
        }
        // A format the crate does not know constrains nothing, as JSON Schema says.
        let v = input_validator(&json!({"properties": {"x": {"format": "phone"}}})).unwrap();
        assert!(v.is_valid(&json!({"x": "anything"})));
    }
}
