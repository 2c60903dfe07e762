//! One side of an intercepted connection (the code's, or the upstream's): a stream with the
//! bytes read from it but not used yet, the lines and heads read off it, and how long a read
//! of the upstream may wait ([`Timed`]).

use std::io::{self, Read, Write};
use std::time::Duration;

use crate::head::{Head, Role};
use crate::stop::{Meter, Stop};

/// Longest chunk-size or trailer line of an answer.
const MAX_LINE: usize = 4096;
const BUFFER: usize = 32 * 1024;

/// An upstream whose reads can be made to give up sooner than its idle timeout: what the
/// scrubber holds goes on when it is due, even while the upstream is quiet.
pub(crate) trait Timed {
    fn read_timeout(&self, wait: Duration);
}

/// A side of the relay: a stream, with the bytes read from it but not used yet.
pub(crate) struct Side<S> {
    pub(crate) io: S,
    buf: Vec<u8>,
    at: usize,
}

impl<S: Read + Write> Side<S> {
    pub(crate) fn new(io: S) -> Self {
        Side {
            io,
            buf: Vec::with_capacity(BUFFER),
            at: 0,
        }
    }

    pub(crate) fn pending(&self) -> &[u8] {
        &self.buf[self.at..]
    }

    pub(crate) fn consume(&mut self, n: usize) {
        self.at += n;
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
    }

    /// Reads more; 0 at the end of the stream.
    pub(crate) fn fill(&mut self) -> io::Result<usize> {
        if self.at > 0 {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + BUFFER, 0);
        let n = loop {
            match self.io.read(&mut self.buf[len..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A peer that closes without close_notify ends the stream all the same.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(0),
                other => break other,
            }
        };
        self.buf.truncate(len + *n.as_ref().unwrap_or(&0));
        n
    }

    /// One line (CRLF or LF ended) of what was read, without its end, if it is all there;
    /// for chunk sizes and trailers.
    pub(crate) fn take_line(&mut self) -> Result<Option<Vec<u8>>, Stop> {
        if let Some(i) = self.pending().iter().position(|&b| b == b'\n') {
            let mut line = self.pending()[..i].to_vec();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.consume(i + 1);
            return Ok(Some(line));
        }
        if self.pending().len() > MAX_LINE {
            return Err(Stop::cut("bad_answer", "a chunk line over 4 KiB"));
        }
        Ok(None)
    }
}

/// Reads a head of `role` from `side`: [`None`] if the stream ended before its first byte.
pub(crate) fn read_head<S: Read + Write>(
    side: &mut Side<S>,
    role: Role,
    mut meter: Option<&mut Meter<'_>>,
) -> Result<Option<Head>, Stop> {
    let max = role.max_head();
    let what = match role {
        Role::Request => "request",
        Role::Answer => "answer",
    };
    loop {
        if !side.pending().is_empty() {
            match Head::parse(role, side.pending()) {
                Ok(Some((len, head))) => {
                    side.consume(len);
                    return Ok(Some(head));
                }
                Ok(None) => {}
                Err(e) if role == Role::Request => {
                    return Err(Stop::reply(
                        "400 Bad Request",
                        "bad_request",
                        format!("not an HTTP request: {e}"),
                    ))
                }
                Err(e) => return Err(Stop::cut("bad_answer", format!("not an HTTP answer: {e}"))),
            }
            if side.pending().len() > max {
                return Err(if role == Role::Request {
                    Stop::reply(
                        "431 Request Header Fields Too Large",
                        "bad_request",
                        format!("a request head over {max} bytes"),
                    )
                } else {
                    Stop::cut("bad_answer", format!("an answer head over {max} bytes"))
                });
            }
        }
        let was_empty = side.pending().is_empty();
        let n = side.fill().map_err(|e| {
            if role == Role::Request && was_empty {
                // Waiting for a next request that never comes is the end of the connection.
                Stop::Cut {
                    denied: false,
                    reason: "closed",
                    detail: None,
                }
            } else {
                Stop::io(e)
            }
        })?;
        if n == 0 {
            return if was_empty {
                Ok(None)
            } else {
                Err(Stop::cut(
                    "connection_lost",
                    format!("the {what} head was cut short"),
                ))
            };
        }
        if let Some(m) = meter.as_deref_mut() {
            m.received(n)?;
        }
    }
}
