//! The proxy that serves one sandbox's egress listener (a socket inside the sandbox's network
//! namespace, held by the host): HTTP `CONNECT` tunnels for TLS, never intercepted, and plain
//! HTTP requests forwarded by their absolute URI or `Host`, one per connection (exactly its
//! head and body go upstream, nothing the client sends after them: see [`crate::framing`]).
//! Every connection is checked twice (the name asked for, then each address the proxy itself
//! resolved), connected to the checked address only (so a name cannot re-resolve between check
//! and connect), counted against the budgets of whoever owned the leash when it was accepted
//! (an execution, a session's cell, or a session's time between cells) and reported to an
//! [`Observer`] once it ends.
//!
//! Blocking threads, one per connection and direction: an execution has a few connections,
//! never thousands ([`Settings::max_connections`]).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::credentials::{Credential, CredentialRecord};
use crate::framing::{self, Body};
use crate::head::{Head, Role};
use crate::intercept::{self, Interception, Meter, Prefixed, Relay, Side, Stop};
use crate::policy::{self, Denied, Target};
use crate::scrub::Scrubber;
use airlock_api::egress::{normalize, EgressPolicy, Usage};

/// The whole head must arrive within this, however slowly it trickles.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest host name or detail an audit line carries.
const MAX_AUDITED: usize = 256;
const BUFFER: usize = 32 * 1024;
/// How long, and how many bytes, a plain connection's end waits for the client to close
/// (what it sends meanwhile is dropped).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: u64 = 1 << 20;

/// The operator's budgets and resolution overrides, the same for every execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Connections one execution may open (denied ones count too).
    pub max_connections: u32,
    /// Bytes one execution may send, over all its connections.
    pub max_bytes_out: u64,
    /// Bytes one execution may receive, over all its connections.
    pub max_bytes_in: u64,
    pub connect_timeout_ms: u64,
    /// A connection with no byte either way for this long is closed.
    pub idle_timeout_ms: u64,
    /// Fixed answers for names (like curl's `--resolve`): the proxy uses these addresses
    /// instead of asking the host's resolver. The address checks apply to them all the same.
    pub resolve: BTreeMap<String, Vec<IpAddr>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_connections: 64,
            max_bytes_out: 16 << 20,
            max_bytes_in: 512 << 20,
            connect_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            resolve: BTreeMap::new(),
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), String> {
        for (name, zero) in [
            ("max_connections", self.max_connections == 0),
            ("max_bytes_out", self.max_bytes_out == 0),
            ("max_bytes_in", self.max_bytes_in == 0),
            ("connect_timeout_ms", self.connect_timeout_ms == 0),
            ("idle_timeout_ms", self.idle_timeout_ms == 0),
        ] {
            if zero {
                return Err(format!("egress.{name} must be greater than zero"));
            }
        }
        for name in self.resolve.keys() {
            if normalize(name).as_deref() != Some(name.as_str()) {
                return Err(format!(
                    "egress.resolve: {name:?} is not a lower-case host name"
                ));
            }
        }
        Ok(())
    }
}

/// One connection, as the audit log and metrics see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConnectionRecord {
    pub event: &'static str,
    /// The execution (or session cell) that opened it; `None` for one a session's code
    /// opened while none of its cells ran.
    pub execution_id: Option<String>,
    /// The session it was opened in, for a session's connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Opened while none of the session's cells ran (by a thread or process a cell left).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub between_cells: bool,
    pub key: String,
    /// `CONNECT`, or the plain request's method.
    pub method: String,
    pub host: String,
    pub port: u16,
    /// The address connected to (or refused), once the name was resolved.
    pub address: Option<String>,
    /// `allowed`, `denied` (the policy or a budget said no) or `failed` (allowed, but the
    /// target could not be reached, or the request was not one the proxy speaks).
    pub outcome: &'static str,
    pub reason: Option<&'static str>,
    /// What went wrong, in words, for a connection that was not allowed or was cut; or what
    /// of a plain connection was not relayed (bytes after its one request).
    pub detail: Option<String>,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub duration_ms: u64,
    /// The credential the proxy set on this connection's requests (it ended the code's TLS
    /// and opened its own): each request has an audit line of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// Requests relayed on a connection that carried a credential.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
}

/// Told about every connection once it ends.
pub trait Observer: Send + Sync + std::fmt::Debug {
    fn connection(&self, record: &ConnectionRecord);

    /// A connection refused past the connection budget after the first such refusal of its
    /// execution (which [`Observer::connection`] was told): counted, never recorded one by
    /// one, so that a loop of connections cannot flood the audit log.
    fn budget_refusal(&self) {}

    /// A request that carried a credential, once its answer was relayed (or cut).
    fn credential(&self, _record: &CredentialRecord) {}
}

/// What one account (an execution, a session's cell, or a session's time between cells)
/// used, against its budgets. A connection counts in the account it was opened under, to
/// its end.
#[derive(Debug, Default)]
struct Tally {
    opened: AtomicU64,
    /// A refusal for the connection budget was audited already (the rest are only counted).
    budget_audited: AtomicBool,
    connections: AtomicU64,
    denied: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    credential_requests: AtomicU64,
}

impl Tally {
    fn usage(&self) -> Usage {
        Usage {
            connections: self.connections.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            credential_requests: self.credential_requests.load(Ordering::Relaxed),
        }
    }
}

/// Whom the connections opened now belong to, and the account they count in.
#[derive(Clone, Debug, Default)]
struct Owner {
    /// The execution or cell; `None` between a session's cells.
    execution_id: Option<String>,
    session_id: Option<String>,
    tally: Arc<Tally>,
}

/// The egress of one execution, or of one session: each of its cells begins anew, and the
/// time between them has an account of its own for the session's whole life.
#[derive(Debug)]
pub struct Leash {
    policy: EgressPolicy,
    settings: Arc<Settings>,
    key: String,
    owner: Mutex<Owner>,
    /// A session's time between cells ([`Leash::for_session`]).
    between_cells: OnceLock<Owner>,
    /// Connections open now (each holds threads on the host), across a session's cells.
    live: AtomicU64,
    observer: Option<Arc<dyn Observer>>,
    /// The credentials its connections may carry, with the CA that ends their TLS.
    interception: Option<Arc<Interception>>,
}

impl Leash {
    pub fn new(
        policy: EgressPolicy,
        settings: Arc<Settings>,
        key: impl Into<String>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Self {
        Leash {
            policy,
            settings,
            key: key.into(),
            owner: Mutex::new(Owner {
                execution_id: Some(String::new()),
                ..Owner::default()
            }),
            between_cells: OnceLock::new(),
            live: AtomicU64::new(0),
            observer,
            interception: None,
        }
    }

    /// Lets this leash's connections to a credential's hosts carry it (see
    /// [`crate::intercept`]).
    pub fn with_interception(mut self, interception: Arc<Interception>) -> Self {
        self.interception = Some(interception);
        self
    }

    pub fn interception(&self) -> Option<&Arc<Interception>> {
        self.interception.as_ref()
    }

    pub fn policy(&self) -> &EgressPolicy {
        &self.policy
    }

    fn owner(&self) -> std::sync::MutexGuard<'_, Owner> {
        self.owner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes this the leash of session `session_id` (before its sandbox starts): connections
    /// opened while none of its cells runs belong to the session, and count in one account
    /// for its whole life, under the same budgets as one execution.
    pub fn for_session(&self, session_id: &str) {
        let between = self.between_cells.get_or_init(|| Owner {
            execution_id: None,
            session_id: Some(session_id.to_owned()),
            tally: Arc::default(),
        });
        *self.owner() = between.clone();
    }

    /// Names the execution (or cell) the connections that follow belong to, with budgets of
    /// its own.
    pub fn begin(&self, execution_id: &str) {
        *self.owner() = Owner {
            execution_id: Some(execution_id.to_owned()),
            session_id: self.between_cells.get().and_then(|b| b.session_id.clone()),
            tally: Arc::default(),
        };
    }

    /// A session's cell is over: what it used. Connections opened from now until the next
    /// [`Leash::begin`] are the session's, between cells.
    pub fn end_cell(&self) -> Usage {
        let mut owner = self.owner();
        let used = owner.tally.usage();
        if let Some(between) = self.between_cells.get() {
            *owner = between.clone();
        }
        used
    }

    /// What the current execution (or cell) used so far.
    pub fn usage(&self) -> Usage {
        self.owner().tally.usage()
    }

    /// What a session's code used while none of its cells ran, over its whole life so far;
    /// `None` for a leash that is not a session's.
    pub fn between_cells(&self) -> Option<Usage> {
        self.between_cells.get().map(|b| b.tally.usage())
    }

    /// Serves `listener` on a thread of its own until [`Serving::finish`].
    pub fn serve(self: &Arc<Self>, listener: TcpListener) -> io::Result<Serving> {
        let shared = Arc::new(Shared {
            leash: self.clone(),
            open: Mutex::new(Open::default()),
            closed: AtomicBool::new(false),
        });
        let ours = listener.try_clone()?;
        let accepting = shared.clone();
        let thread = std::thread::Builder::new()
            .name("egress-accept".into())
            .spawn(move || accept_loop(&accepting, &listener))?;
        Ok(Serving {
            shared,
            listener: ours,
            thread: Some(thread),
        })
    }
}

/// A listener being served. Dropping it finishes it.
#[derive(Debug)]
pub struct Serving {
    shared: Arc<Shared>,
    listener: TcpListener,
    thread: Option<JoinHandle<()>>,
}

impl Serving {
    /// Stops accepting, cuts every open connection and returns what was used.
    pub fn finish(mut self) -> Usage {
        self.stop();
        self.shared.leash.usage()
    }

    fn stop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        // A listening socket shut down for reading makes a blocked accept() return at once.
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&self.listener.as_fd()),
            nix::sys::socket::Shutdown::Read,
        );
        let open = std::mem::take(&mut *self.shared.open());
        for stream in open.streams.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    streams: BTreeMap<u64, TcpStream>,
}

#[derive(Debug)]
struct Shared {
    leash: Arc<Leash>,
    /// Every socket of a live connection, to cut them all when the sandbox is gone.
    open: Mutex<Open>,
    closed: AtomicBool,
}

impl Shared {
    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a clone of `stream` to cut at the end; [`None`] once finished (cut it now).
    fn register(&self, stream: &TcpStream) -> Option<u64> {
        let mut open = self.open();
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        let clone = stream.try_clone().ok()?;
        open.next += 1;
        let id = open.next;
        open.streams.insert(id, clone);
        Some(id)
    }

    fn unregister(&self, id: u64) {
        self.open().streams.remove(&id);
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    loop {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if shared.closed.load(Ordering::SeqCst) {
            return;
        }
        // The budget is counted here, before a thread exists: a sandbox can never hold more
        // than `max_connections` connections (and their threads) open, however it opens them.
        // The connection belongs to whoever owns the leash now, to its end.
        let leash = &shared.leash;
        let owner = leash.owner().clone();
        let max = u64::from(leash.settings.max_connections);
        let opened = owner.tally.opened.fetch_add(1, Ordering::Relaxed) + 1;
        if opened > max || leash.live.load(Ordering::Relaxed) >= max {
            refuse_over_budget(shared, owner, client, max);
            continue;
        }
        leash.live.fetch_add(1, Ordering::Relaxed);
        let conn = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("egress-conn".into())
            .spawn(move || {
                Connection::new(&conn, owner).run(client);
                conn.leash.live.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            // Out of threads: the connection is dropped, the code sees a reset.
            leash.live.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Answers a connection past the budget at once, from the accept loop. Each counts; only the
/// first such refusal of an account is told to the observer as a connection, the rest as
/// [`Observer::budget_refusal`] (a loop of them must not flood the audit log).
fn refuse_over_budget(shared: &Shared, owner: Owner, mut client: TcpStream, max: u64) {
    let leash = &shared.leash;
    owner.tally.denied.fetch_add(1, Ordering::Relaxed);
    let whose = if owner.execution_id.is_some() {
        "this execution"
    } else {
        "this session between cells"
    };
    let detail = format!("{whose} may have {max} connections");
    let body = format!("airlock egress denied: {detail} (connection_budget)\n");
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\n\
         X-Airlock-Egress: denied; reason=connection_budget\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    // Read what the request sent so far (closing with unread data would reset the connection
    // before the answer is read), answer, and give the client a moment to read it. This holds
    // only this sandbox's accept loop, briefly.
    let mut sink = [0u8; 4096];
    let _ = client.set_read_timeout(Some(Duration::from_millis(50)));
    let _ = client.set_write_timeout(Some(Duration::from_millis(50)));
    let _ = client.read(&mut sink);
    let _ = client.write_all(answer.as_bytes());
    let _ = client.shutdown(Shutdown::Write);
    let _ = client.read(&mut sink);
    let Some(observer) = &leash.observer else {
        return;
    };
    if owner.tally.budget_audited.swap(true, Ordering::Relaxed) {
        observer.budget_refusal();
        return;
    }
    let mut conn = Connection::new(shared, owner);
    conn.record.outcome = "denied";
    conn.record.reason = Some("connection_budget");
    conn.record.detail = Some(format!(
        "{detail}; further refusals are counted, not audited one by one"
    ));
    observer.connection(&conn.record);
}

/// What one connection asked for.
#[derive(Debug)]
struct Request {
    method: String,
    host: String,
    port: u16,
    /// For plain HTTP: the head to send upstream (origin-form, `Connection: close`) and
    /// where its body ends; `None` for a `CONNECT` tunnel.
    plain: Option<(Vec<u8>, Body)>,
    /// Bytes read past the head (a body's start, or a client's first TLS bytes).
    rest: Vec<u8>,
}

/// Why the proxy answers with an error instead of a tunnel.
struct Refusal {
    status: &'static str,
    outcome: &'static str,
    reason: &'static str,
    detail: String,
}

impl Refusal {
    fn denied(d: &Denied) -> Self {
        Refusal {
            status: "403 Forbidden",
            outcome: "denied",
            reason: d.reason(),
            detail: d.to_string(),
        }
    }

    fn failed(status: &'static str, reason: &'static str, detail: String) -> Self {
        Refusal {
            status,
            outcome: "failed",
            reason,
            detail,
        }
    }

    /// The HTTP answer the code reads.
    fn answer(&self) -> String {
        let body = format!(
            "airlock egress {}: {} ({})\n",
            self.outcome, self.detail, self.reason
        );
        format!(
            "HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\n\
             X-Airlock-Egress: {}; reason={}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.status,
            self.outcome,
            self.reason,
            body.len()
        )
    }
}

struct Connection<'a> {
    shared: &'a Shared,
    started: Instant,
    record: ConnectionRecord,
    ids: Vec<u64>,
    /// The account it counts in: its owner's when it was accepted.
    tally: Arc<Tally>,
}

impl<'a> Connection<'a> {
    fn new(shared: &'a Shared, owner: Owner) -> Self {
        let leash = &shared.leash;
        Connection {
            shared,
            started: Instant::now(),
            record: ConnectionRecord {
                event: "egress",
                between_cells: owner.execution_id.is_none(),
                execution_id: owner.execution_id.clone(),
                session_id: owner.session_id.clone(),
                key: leash.key.clone(),
                method: String::new(),
                host: String::new(),
                port: 0,
                address: None,
                outcome: "failed",
                reason: None,
                detail: None,
                bytes_out: 0,
                bytes_in: 0,
                duration_ms: 0,
                credential: None,
                requests: None,
            },
            ids: Vec::new(),
            tally: owner.tally,
        }
    }

    fn settings(&self) -> &Settings {
        &self.shared.leash.settings
    }

    fn run(mut self, mut client: TcpStream) {
        if let Some(id) = self.shared.register(&client) {
            self.ids.push(id);
            if let Err(refusal) = self.serve(&mut client) {
                if refusal.outcome == "denied" {
                    self.tally.denied.fetch_add(1, Ordering::Relaxed);
                }
                let answer = refusal.answer();
                let _ = client.write_all(answer.as_bytes());
                self.record.outcome = refusal.outcome;
                self.record.reason = Some(refusal.reason);
                self.record.detail = Some(refusal.detail);
                linger(&mut client);
            }
        } else {
            self.record.outcome = "failed";
            self.record.reason = Some("sandbox_gone");
        }
        let _ = client.shutdown(Shutdown::Both);
        for id in &self.ids {
            self.shared.unregister(*id);
        }
        self.record.duration_ms = self.started.elapsed().as_millis() as u64;
        cut_to(&mut self.record.host, MAX_AUDITED);
        if let Some(detail) = &mut self.record.detail {
            cut_to(detail, MAX_AUDITED);
        }
        if let Some(observer) = &self.shared.leash.observer {
            observer.connection(&self.record);
        }
    }

    fn serve(&mut self, client: &mut TcpStream) -> Result<(), Refusal> {
        let request = read_request(client)?;
        self.record.method = request.method.clone();
        self.record.host = request.host.clone();
        self.record.port = request.port;

        let leash = &self.shared.leash;
        let target = policy::check_target(&leash.policy, &request.host, request.port)
            .map_err(|d| Refusal::denied(&d))?;
        let upstream = self.connect(&target, request.port)?;
        // Bytes go on as they come: a relay must not add Nagle's wait to the code's own.
        let _ = upstream.set_nodelay(true);
        let _ = client.set_nodelay(true);
        self.tally.connections.fetch_add(1, Ordering::Relaxed);
        self.record.outcome = "allowed";
        let Some(id) = self.shared.register(&upstream) else {
            self.record.reason = Some("sandbox_gone");
            return Ok(());
        };
        self.ids.push(id);
        let credential = match (&target, leash.interception.as_ref()) {
            (Target::Name(name), Some(ix)) if request.plain.is_none() => ix
                .credential_for(name, request.port)
                .map(|(c, scrubber)| (name.clone(), ix.clone(), c.clone(), scrubber.clone())),
            _ => None,
        };
        if let Some((name, ix, credential, scrubber)) = credential {
            return self.intercept(
                client,
                upstream,
                &ix,
                &credential,
                &scrubber,
                &name,
                request.port,
                &request.rest,
            );
        }
        match request.plain {
            None => {
                client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .map_err(|e| {
                        Refusal::failed("500 Internal Server Error", "client_gone", e.to_string())
                    })?;
                let (mut outbound, mut inbound) = (Shape::Raw, Shape::Raw);
                self.relay(
                    client,
                    upstream,
                    &[],
                    &request.rest,
                    &mut outbound,
                    &mut inbound,
                );
            }
            Some((head, body)) => {
                // One request per connection: exactly its head and body go upstream, the
                // answer comes back saying the connection closes, and whatever the client
                // sent after its request is read and dropped, never relayed.
                let mut outbound = Shape::Body { body, dropped: 0 };
                let mut inbound = Shape::Answer(framing::Answer::default());
                self.relay(
                    client,
                    upstream,
                    &head,
                    &request.rest,
                    &mut outbound,
                    &mut inbound,
                );
                let lingered = linger(client);
                // Bytes read at the end count as after the request once its body was whole
                // (before, they were the rest of a body the upstream no longer took).
                let dropped = match &outbound {
                    Shape::Body { body, dropped } if body.done() => dropped + lingered,
                    _ => 0,
                };
                if dropped > 0 && self.record.detail.is_none() {
                    self.record.detail = Some(format!(
                        "{dropped} bytes sent after the request were dropped (one request per \
                         connection)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// A `CONNECT` to a credential's host: TLS to the upstream first (a certificate that
    /// is not the checked name's is a 502 the code reads), then the tunnel's answer, the
    /// code's TLS ended with this leash's certificate, and its requests relayed one by one.
    #[allow(clippy::too_many_arguments)]
    fn intercept(
        &mut self,
        client: &mut TcpStream,
        upstream: TcpStream,
        ix: &Arc<Interception>,
        credential: &Arc<Credential>,
        scrubber: &Arc<Scrubber>,
        name: &str,
        port: u16,
        rest: &[u8],
    ) -> Result<(), Refusal> {
        self.record.credential = Some(credential.name.clone());
        let settings = self.settings().clone();
        let handshake = Some(Duration::from_millis(settings.connect_timeout_ms));
        let idle = Some(Duration::from_millis(settings.idle_timeout_ms));
        let _ = upstream.set_read_timeout(handshake);
        let _ = upstream.set_write_timeout(handshake);
        let upstream_tcp = upstream
            .try_clone()
            .map_err(|e| Refusal::failed("502 Bad Gateway", "connect_failed", e.to_string()))?;
        let up = intercept::open_upstream(credential, name, upstream).map_err(|e| {
            Refusal::failed(
                "502 Bad Gateway",
                "upstream_tls",
                format!("TLS to {name}:{port}: {e}"),
            )
        })?;
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .map_err(|e| {
                Refusal::failed("500 Internal Server Error", "client_gone", e.to_string())
            })?;
        let client_tcp = client.try_clone().map_err(|e| {
            Refusal::failed("500 Internal Server Error", "client_gone", e.to_string())
        })?;
        let _ = client_tcp.set_read_timeout(Some(HEAD_TIMEOUT));
        let _ = client_tcp.set_write_timeout(idle);
        let down =
            match intercept::accept_client(ix, name, Prefixed::new(rest.to_vec(), client_tcp)) {
                Ok(down) => down,
                Err(stop) => {
                    self.stopped(stop);
                    return Ok(());
                }
            };
        for socket in [&down.sock.stream, &upstream_tcp] {
            let _ = socket.set_read_timeout(idle);
            let _ = socket.set_write_timeout(idle);
        }
        let tally = self.tally.clone();
        let mut meter = Meter {
            bytes_out: &tally.bytes_out,
            bytes_in: &tally.bytes_in,
            max_out: settings.max_bytes_out,
            max_in: settings.max_bytes_in,
            idle: Duration::from_millis(settings.idle_timeout_ms),
            out: 0,
            inn: 0,
        };
        let observer = self.shared.leash.observer.clone();
        let mut requests = 0u64;
        let mut told = |record: CredentialRecord| {
            requests += 1;
            tally.credential_requests.fetch_add(1, Ordering::Relaxed);
            if let Some(observer) = &observer {
                observer.credential(&record);
            }
        };
        let mut relay = Relay {
            credential,
            scrubber,
            host: name,
            port,
            record: &mut told,
            template: CredentialRecord::template(
                self.record.execution_id.clone(),
                self.record.session_id.clone(),
                &self.record.key,
                &credential.name,
                name,
                port,
            ),
        };
        let mut down = Side::new(down);
        let mut up = Side::new(up);
        let result = relay.run(&mut down, &mut up, &mut meter);
        self.record.bytes_out = meter.out;
        self.record.bytes_in = meter.inn;
        drop(relay);
        self.record.requests = Some(requests);
        if let Err(mut stop) = result {
            // A detail may quote the upstream (a coding's name, a framing it sent): what the
            // code and the audit log read of it is scanned like an answer.
            if let Stop::Reply { detail, .. }
            | Stop::Cut {
                detail: Some(detail),
                ..
            } = &mut stop
            {
                *detail = scrubber.masked(detail);
            }
            if let Stop::Reply {
                status,
                denied,
                reason,
                detail,
            } = &stop
            {
                let refusal = Refusal {
                    status,
                    outcome: if *denied { "denied" } else { "failed" },
                    reason,
                    detail: detail.clone(),
                };
                let _ = down.io.write_all(refusal.answer().as_bytes());
            }
            self.stopped(stop);
        }
        down.io.conn.send_close_notify();
        let _ = down.io.flush();
        up.io.conn.send_close_notify();
        let _ = up.io.flush();
        Ok(())
    }

    /// Records why an intercepted connection stopped early.
    fn stopped(&mut self, stop: Stop) {
        let (denied, reason, detail) = match stop {
            Stop::Reply {
                denied,
                reason,
                detail,
                ..
            } => (denied, reason, Some(detail)),
            Stop::Cut {
                denied,
                reason,
                detail,
            } => (denied, reason, detail),
        };
        if reason == "closed" {
            return;
        }
        self.record.reason = Some(reason);
        self.record.detail = detail;
        if denied {
            self.record.outcome = "denied";
            self.tally.denied.fetch_add(1, Ordering::Relaxed);
        } else if reason != "idle_timeout" {
            self.record.outcome = "failed";
        }
    }

    /// Resolves (the proxy's own resolver, or the operator's fixed answers), checks each
    /// address and connects to the first allowed one that answers.
    fn connect(&mut self, target: &Target, port: u16) -> Result<TcpStream, Refusal> {
        let addrs: Vec<IpAddr> = match target {
            Target::Address(addr) => vec![*addr],
            Target::Name(name) => match self.settings().resolve.get(name) {
                Some(fixed) => fixed.clone(),
                // A name with a dot is resolved as it is, with a final dot, never under one of
                // the resolver's search domains; a single label (`localhost`, a name the
                // operator listed from its hosts file) as given.
                None => (absolute(name).as_str(), port)
                    .to_socket_addrs()
                    .map_err(|e| {
                        Refusal::failed("502 Bad Gateway", "resolve_failed", format!("{name}: {e}"))
                    })?
                    .map(|a| a.ip())
                    .collect(),
            },
        };
        let timeout = Duration::from_millis(self.settings().connect_timeout_ms);
        let mut refused = None;
        let mut failed = None;
        for addr in addrs {
            let addr = policy::unmap(addr);
            if let Err(d) = policy::check_address(&self.shared.leash.policy, addr, port) {
                self.record.address.get_or_insert_with(|| addr.to_string());
                refused.get_or_insert(d);
                continue;
            }
            self.record.address = Some(addr.to_string());
            match TcpStream::connect_timeout(&SocketAddr::new(addr, port), timeout) {
                Ok(stream) => return Ok(stream),
                Err(e) => failed = Some(e),
            }
        }
        Err(match (failed, refused) {
            (Some(e), _) => {
                let reason = if e.kind() == io::ErrorKind::TimedOut {
                    "connect_timeout"
                } else {
                    "connect_failed"
                };
                Refusal::failed("502 Bad Gateway", reason, e.to_string())
            }
            (None, Some(d)) => Refusal::denied(&d),
            (None, None) => Refusal::failed(
                "502 Bad Gateway",
                "resolve_failed",
                "the name has no address".into(),
            ),
        })
    }

    /// Copies both ways until both ends close (or the request's body ended and the answer
    /// did), a budget is spent, the connection idles past its timeout, or the sandbox is
    /// gone. `first` goes upstream as it is, then `rest` (read past the head) and what the
    /// client sends next as `outbound` shapes them; what the upstream sends as `inbound` does.
    fn relay(
        &mut self,
        client: &mut TcpStream,
        upstream: TcpStream,
        first: &[u8],
        rest: &[u8],
        outbound: &mut Shape,
        inbound: &mut Shape,
    ) {
        let settings = self.settings().clone();
        let idle = Duration::from_millis(settings.idle_timeout_ms);
        let activity = Arc::new(Activity::new());
        let cut: Arc<Mutex<Option<Cut>>> = Arc::default();
        let tally = self.tally.clone();
        let (Ok(client_r), Ok(upstream_w)) = (client.try_clone(), upstream.try_clone()) else {
            return;
        };
        let _ = client_r.set_read_timeout(Some(idle));
        let _ = upstream.set_read_timeout(Some(idle));
        let (out, inn) = std::thread::scope(|s| {
            let outbound = s.spawn(|| {
                let pipe = Pipe {
                    counter: &tally.bytes_out,
                    budget: settings.max_bytes_out,
                    budget_reason: "bytes_out_budget",
                    activity: &activity,
                    idle,
                    cut: &cut,
                };
                pipe.run(client_r, upstream_w, first, rest, outbound)
            });
            let pipe = Pipe {
                counter: &tally.bytes_in,
                budget: settings.max_bytes_in,
                budget_reason: "bytes_in_budget",
                activity: &activity,
                idle,
                cut: &cut,
            };
            let inn = match (upstream.try_clone(), client.try_clone()) {
                (Ok(from), Ok(to)) => pipe.run(from, to, &[], &[], inbound),
                _ => 0,
            };
            (outbound.join().unwrap_or(0), inn)
        });
        self.record.bytes_out = out;
        self.record.bytes_in = inn;
        let cut = cut.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(cut) = cut {
            self.record.reason = Some(cut.reason);
            if cut.reason.ends_with("_budget") {
                self.record.outcome = "denied";
                tally.denied.fetch_add(1, Ordering::Relaxed);
            } else if let Some(why) = cut.detail {
                self.record.outcome = "failed";
                self.record.detail = Some(why);
            }
        }
    }
}

/// Why a relay was cut short, once.
struct Cut {
    reason: &'static str,
    detail: Option<String>,
}

/// What one direction of a relay does with the bytes it reads.
enum Shape {
    /// Passes them as they are (a tunnel).
    Raw,
    /// A plain request's body: passes it to its end, then stops reading; the bytes read past
    /// it are dropped (and counted).
    Body { body: Body, dropped: u64 },
    /// The upstream's answer to a plain request: its head made to close the connection.
    Answer(framing::Answer),
}

impl Shape {
    /// Appends to `out` what goes on of `data`; whether this direction is done.
    fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<bool, framing::Malformed> {
        match self {
            Shape::Raw => out.extend_from_slice(data),
            Shape::Body { body, dropped } => {
                if body.done() {
                    *dropped += data.len() as u64;
                    return Ok(true);
                }
                let n = body.take(data)?;
                out.extend_from_slice(&data[..n]);
                if body.done() {
                    *dropped += (data.len() - n) as u64;
                    return Ok(true);
                }
            }
            Shape::Answer(answer) => answer.feed(data, out),
        }
        Ok(false)
    }

    /// The other end closed: what was held back goes on.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if let Shape::Answer(answer) = self {
            answer.finish(out);
        }
    }
}

/// Before a plain connection is closed: the end of the answer is sent, and whatever the
/// client sends after its request is read and dropped (closing with unread bytes would reset
/// the connection, and the client could lose the answer it has not read yet), for at most
/// `LINGER` and `LINGER_BYTES`. Returns the bytes dropped.
fn linger(client: &mut TcpStream) -> u64 {
    let _ = client.shutdown(Shutdown::Write);
    let deadline = Instant::now() + LINGER;
    let mut buf = [0u8; 4096];
    let mut dropped = 0u64;
    while dropped < LINGER_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let _ = client.set_read_timeout(Some(left));
        match client.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => dropped += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    dropped
}

/// Milliseconds since the connection started, at the last byte either way.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// One direction of a relay.
struct Pipe<'a> {
    counter: &'a AtomicU64,
    budget: u64,
    budget_reason: &'static str,
    activity: &'a Activity,
    idle: Duration,
    cut: &'a Mutex<Option<Cut>>,
}

impl Pipe<'_> {
    /// Returns the bytes copied: `first` as it is, then `rest` and what `from` sends as
    /// `shape` makes them. Ends the whole connection (both sockets, both ways) when a budget
    /// is spent, both directions idle too long, or `shape` finds the bytes malformed; stops
    /// reading, leaving `to` open, when `shape` says this direction is done; otherwise passes
    /// the end of its direction on (a half-close) and lets the other direction finish.
    fn run(
        &self,
        mut from: TcpStream,
        mut to: TcpStream,
        first: &[u8],
        rest: &[u8],
        shape: &mut Shape,
    ) -> u64 {
        let cut_all = |from: &TcpStream, to: &TcpStream, reason, detail| {
            self.cut
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(Cut { reason, detail });
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        };
        let mut copied = 0u64;
        let mut buf = vec![0u8; BUFFER];
        let mut pending = first.to_vec();
        let mut done = match shape.feed(rest, &mut pending) {
            Ok(done) => done,
            Err(e) => {
                cut_all(&from, &to, "bad_request", Some(e.to_string()));
                return 0;
            }
        };
        let mut ended = false;
        loop {
            if !pending.is_empty() {
                let n = pending.len() as u64;
                if self.counter.fetch_add(n, Ordering::Relaxed) + n > self.budget {
                    cut_all(&from, &to, self.budget_reason, None);
                    return copied;
                }
                if to.write_all(&pending).is_err() {
                    let _ = from.shutdown(Shutdown::Read);
                    return copied;
                }
                copied += n;
                self.activity.touch();
                pending.clear();
            }
            if done {
                return copied;
            }
            if ended {
                let _ = to.shutdown(Shutdown::Write);
                return copied;
            }
            match from.read(&mut buf) {
                Ok(0) => {
                    shape.finish(&mut pending);
                    ended = true;
                }
                Ok(n) => {
                    self.activity.touch();
                    match shape.feed(&buf[..n], &mut pending) {
                        Ok(d) => done = d,
                        Err(e) => {
                            cut_all(&from, &to, "bad_request", Some(e.to_string()));
                            return copied;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if self.activity.idle_for() >= self.idle {
                        cut_all(&from, &to, "idle_timeout", None);
                        return copied;
                    }
                }
                Err(_) => {
                    let _ = to.shutdown(Shutdown::Write);
                    return copied;
                }
            }
        }
    }
}

/// Reads and parses one request head.
fn read_request(client: &mut TcpStream) -> Result<Request, Refusal> {
    let bad = |detail: String| Refusal::failed("400 Bad Request", "bad_request", detail);
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + HEAD_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refusal::failed(
                "408 Request Timeout",
                "bad_request",
                format!("no whole request head within {HEAD_TIMEOUT:?}"),
            ));
        }
        let _ = client.set_read_timeout(Some(left));
        let n = match client.read(&mut chunk) {
            Ok(0) => return Err(bad("the connection closed before a request".into())),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(bad(format!("reading the request: {e}"))),
        };
        buf.extend_from_slice(&chunk[..n]);
        match Head::parse(Role::Request, &buf) {
            Ok(Some((len, head))) => return build_request(&head, &buf[len..]),
            Ok(None) if buf.len() < Role::Request.max_head() => {}
            Ok(None) => {
                return Err(Refusal::failed(
                    "431 Request Header Fields Too Large",
                    "bad_request",
                    format!("a request head over {} bytes", Role::Request.max_head()),
                ))
            }
            Err(e) => return Err(bad(format!("not an HTTP request: {e}"))),
        }
    }
}

fn build_request(req: &Head, rest: &[u8]) -> Result<Request, Refusal> {
    let bad = |detail: String| Refusal::failed("400 Bad Request", "bad_request", detail);
    let method = req.first.clone();
    let target = req.second.as_str();
    let headers = req.as_httparse();
    if method == "CONNECT" {
        let (host, port) = split_authority(target, None)
            .ok_or_else(|| bad(format!("CONNECT needs host:port, not {target:?}")))?;
        return Ok(Request {
            method,
            host,
            port,
            plain: None,
            rest: rest.to_vec(),
        });
    }
    let (authority, path) = if let Some(after) = target.strip_prefix("http://") {
        let end = after.find(['/', '?']).unwrap_or(after.len());
        let path = &after[end..];
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else if path.is_empty() {
            "/".to_owned()
        } else {
            path.to_owned()
        };
        (after[..end].to_owned(), path)
    } else if target.starts_with('/') {
        let host = req
            .get("host")
            .next()
            .and_then(|value| std::str::from_utf8(value).ok())
            .ok_or_else(|| bad("a request without a Host".into()))?;
        (host.to_owned(), target.to_owned())
    } else {
        return Err(Refusal::failed(
            "400 Bad Request",
            "bad_request",
            format!("{target:?}: only http:// requests and CONNECT tunnels (use https:// through CONNECT)"),
        ));
    };
    let (host, port) = split_authority(&authority, Some(80))
        .ok_or_else(|| bad(format!("{authority:?} is not host[:port]")))?;
    let body = Body::of(&headers).map_err(|e| bad(e.to_string()))?;
    // Upstream sees the origin form, the authority that was checked, and no proxy headers.
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\n").into_bytes();
    framing::end_head(
        &mut head,
        &headers,
        &[
            "host",
            "connection",
            "proxy-connection",
            "proxy-authorization",
            "keep-alive",
            "upgrade",
        ],
    );
    Ok(Request {
        method,
        host,
        port,
        plain: Some((head, body)),
        rest: rest.to_vec(),
    })
}

fn absolute(name: &str) -> String {
    if name.contains('.') {
        format!("{name}.")
    } else {
        name.to_owned()
    }
}

/// Shortens `text` to at most `max` bytes, on a character boundary.
fn cut_to(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

/// `host:port`, `[v6]:port`, or without the port when `default` is given. No user info.
fn split_authority(authority: &str, default: Option<u16>) -> Option<(String, u16)> {
    if authority.is_empty() || authority.contains(['@', '/', ' ']) {
        return None;
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return None,
        };
        (format!("[{v6}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0)?,
        None => default?,
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_time_between_cells_is_an_account_of_its_own() {
        let leash = Leash::new(EgressPolicy::default(), Arc::default(), "k", None);
        assert_eq!(leash.between_cells(), None, "not a session's");
        leash.for_session("se_a");
        let count = |n| {
            let owner = leash.owner().clone();
            owner.tally.connections.fetch_add(n, Ordering::Relaxed);
            (owner.execution_id, owner.session_id)
        };
        assert_eq!(count(2), (None, Some("se_a".into())));
        leash.begin("ex_1");
        assert_eq!(count(1), (Some("ex_1".into()), Some("se_a".into())));
        assert_eq!(leash.end_cell().connections, 1);
        // After the cell: the session's again, its count kept.
        assert_eq!(count(3), (None, Some("se_a".into())));
        leash.begin("ex_2");
        assert_eq!(leash.usage().connections, 0, "each cell begins anew");
        assert_eq!(leash.end_cell().connections, 0);
        assert_eq!(leash.between_cells().map(|u| u.connections), Some(5));
        // An execution's leash stays the execution's.
        let leash = Leash::new(EgressPolicy::default(), Arc::default(), "k", None);
        leash.begin("ex_3");
        leash.end_cell();
        assert_eq!(leash.owner().execution_id.as_deref(), Some("ex_3"));
    }

    #[test]
    fn authorities_split_strictly() {
        let s = |a: &str, d| split_authority(a, d);
        assert_eq!(s("pypi.org:443", None), Some(("pypi.org".into(), 443)));
        assert_eq!(s("[::1]:8080", None), Some(("[::1]".into(), 8080)));
        assert_eq!(s("example.com", Some(80)), Some(("example.com".into(), 80)));
        for bad in [
            "pypi.org",
            "user@pypi.org:443",
            "pypi.org:0",
            "pypi.org:x",
            "",
            "[::1]x",
        ] {
            assert_eq!(s(bad, None), None, "{bad}");
        }
    }
}
