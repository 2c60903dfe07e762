//! The proxy that serves one sandbox's egress listener (a socket inside the sandbox's network
//! namespace, held by the host), and one connection's life through it, in the order it is
//! lived: accepted and counted against the budgets of whoever owned the leash then (an
//! execution, a session's cell, or a session's time between cells); its first head read
//! ([`crate::request`]): an HTTP `CONNECT` for a tunnel, or a plain HTTP request forwarded
//! by its absolute URI or `Host`, one per connection (exactly its head and body go upstream,
//! nothing the client sends after them: see [`crate::framing`]); checked twice (the name
//! asked for, then each address the proxy itself resolved, [`crate::policy`]) and connected
//! to the checked address only (so a name cannot re-resolve between check and connect);
//! then relayed ([`crate::pipe`]; a tunnel is never intercepted), or, to a credential's host,
//! intercepted ([`crate::intercept`], [`crate::relay`]); and reported to the leash's
//! [`Observer`](crate::leash::Observer) once it ends.
//!
//! Blocking threads, one per connection and direction: an execution has a few connections,
//! never thousands ([`Settings::max_connections`]).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use airlock_api::egress::Usage;

use crate::credentials::{Credential, CredentialRecord};
use crate::framing;
use crate::intercept::{self, Interception, Prefixed};
use crate::leash::{ConnectionRecord, Leash, Owner, Settings, Tally};
use crate::pipe::{self, linger, Shape};
use crate::policy::{self, Checks, Target};
use crate::relay::Relay;
use crate::request::{read_request, Refusal, HEAD_TIMEOUT};
use crate::scrub::Scrubber;
use crate::side::Side;
use crate::stop::{Meter, Stop};

/// Longest host name or detail an audit line carries.
const MAX_AUDITED: usize = 256;

impl Leash {
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
/// [`Observer::budget_refusal`](crate::leash::Observer::budget_refusal) (a loop of them must
/// not flood the audit log).
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

/// One connection through the proxy, from its accept to its audit line.
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
        let target = leash
            .policy
            .check_target(&request.host, request.port)
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
        // A tunnel to a host with a credential is intercepted; anything else is relayed as
        // it is.
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
                    (&[], &request.rest),
                    (&mut outbound, &mut inbound),
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
                    (&head, &request.rest),
                    (&mut outbound, &mut inbound),
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
            if let Err(d) = self.shared.leash.policy.check_address(addr, port) {
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

    /// Relays both ways (see [`pipe::relay`]) and records what went through, and why it was
    /// cut short if it was.
    fn relay(
        &mut self,
        client: &mut TcpStream,
        upstream: TcpStream,
        (first, rest): (&[u8], &[u8]),
        shapes: (&mut Shape, &mut Shape),
    ) {
        let settings = &self.shared.leash.settings;
        let relayed = pipe::relay(
            client,
            upstream,
            (first, rest),
            shapes,
            settings,
            &self.tally,
        );
        self.record.bytes_out = relayed.out;
        self.record.bytes_in = relayed.inn;
        if let Some(cut) = relayed.cut {
            self.record.reason = Some(cut.reason);
            if cut.reason.ends_with("_budget") {
                self.record.outcome = "denied";
                self.tally.denied.fetch_add(1, Ordering::Relaxed);
            } else if let Some(why) = cut.detail {
                self.record.outcome = "failed";
                self.record.detail = Some(why);
            }
        }
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
