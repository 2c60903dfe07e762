//! The relay of a tunnel's bytes, or of a plain request's and its answer's: a pipe per
//! direction, each on a thread of its own, counted against the budgets and cut together when
//! one is spent, the connection idles or the bytes are malformed. What a direction passes on
//! is its [`Shape`]'s: all as it comes (a tunnel), a request's body to its end and nothing
//! after it, or an answer with its head made to close the connection.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::framing::{self, Body};
use crate::leash::{Settings, Tally};

const BUFFER: usize = 32 * 1024;
/// How long, and how many bytes, a plain connection's end waits for the client to close
/// (what it sends meanwhile is dropped).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: u64 = 1 << 20;

/// What a relay did: the bytes it copied each way, and why it was cut short, if it was.
pub(crate) struct Relayed {
    pub(crate) out: u64,
    pub(crate) inn: u64,
    pub(crate) cut: Option<Cut>,
}

/// Copies both ways until both ends close (or the request's body ended and the answer
/// did), a budget is spent, the connection idles past its timeout, or the sandbox is
/// gone. `first` goes upstream as it is, then `rest` (read past the head) and what the
/// client sends next as `outbound` shapes them; what the upstream sends as `inbound` does.
/// The bytes count in `tally`, under `settings`' budgets.
pub(crate) fn relay(
    client: &mut TcpStream,
    upstream: TcpStream,
    (first, rest): (&[u8], &[u8]),
    (outbound, inbound): (&mut Shape, &mut Shape),
    settings: &Settings,
    tally: &Tally,
) -> Relayed {
    let idle = Duration::from_millis(settings.idle_timeout_ms);
    let activity = Arc::new(Activity::new());
    let cut: Arc<Mutex<Option<Cut>>> = Arc::default();
    let (Ok(client_r), Ok(upstream_w)) = (client.try_clone(), upstream.try_clone()) else {
        return Relayed {
            out: 0,
            inn: 0,
            cut: None,
        };
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
    let cut = cut.lock().unwrap_or_else(|e| e.into_inner()).take();
    Relayed { out, inn, cut }
}

/// Why a relay was cut short, once.
pub(crate) struct Cut {
    pub(crate) reason: &'static str,
    pub(crate) detail: Option<String>,
}

/// What one direction of a relay does with the bytes it reads.
pub(crate) enum Shape {
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
pub(crate) fn linger(client: &mut TcpStream) -> u64 {
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
