//! Moves bytes between the host and a running sandbox: stdin in, the request in and the
//! response out on the control channel, stdout and stderr out. Every buffer is capped; output
//! past its cap is read and thrown away so the program never blocks on a full pipe.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{ChildStderr, ChildStdin, ChildStdout};

use airlock_api::Text;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Which output stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Receives output as it is produced (only the part within the limit).
pub trait OutputSink: Send {
    fn output(&mut self, stream: Stream, chunk: &[u8]);
    /// The stream reached its limit; what follows is discarded.
    fn truncated(&mut self, stream: Stream, limit: u64);
}

/// A sink that keeps nothing (the result carries the output anyway).
#[derive(Debug, Default)]
pub struct Discard;

impl OutputSink for Discard {
    fn output(&mut self, _: Stream, _: &[u8]) {}
    fn truncated(&mut self, _: Stream, _: u64) {}
}

/// Where the program's standard input comes from.
#[derive(Debug)]
pub enum Stdin {
    Empty,
    Bytes(Vec<u8>),
    /// Streamed, never read whole into memory; capped at the engine's stdin limit.
    File(File),
}

#[derive(Debug, Default)]
pub(crate) struct Captured {
    pub data: Vec<u8>,
    pub truncated: bool,
    /// Bytes read past the output limit and thrown away.
    pub discarded: u64,
}

/// How much past its output limit a stream is still read (and thrown away): `DISCARD_FACTOR`
/// times the limit, at least `MIN_DISCARD`; then its pipe is closed, and the program's next
/// write fails (EPIPE). A program that overshoots by that much still ends as it would; one
/// that writes forever cannot make the host spend a core reading what it throws away.
const DISCARD_FACTOR: u64 = 64;
/// Reading 64 MiB to throw it away costs the host about 30 ms of CPU here.
const MIN_DISCARD: u64 = 64 << 20;

/// What a stream with output limit `limit` may still be read past it.
pub(crate) fn discard_budget(limit: u64) -> u64 {
    limit.saturating_mul(DISCARD_FACTOR).max(MIN_DISCARD)
}

/// What a program wrote on its two streams, as kept.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    pub stdout: Captured,
    pub stderr: Captured,
}

impl Streams {
    pub fn of(&mut self, stream: Stream) -> &mut Captured {
        match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        }
    }

    /// Either stream was cut at its limit.
    pub fn truncated(&self) -> bool {
        self.stdout.truncated || self.stderr.truncated
    }
}

#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub streams: Streams,
    pub response: Vec<u8>,
    /// The program sent more on the control channel than a response may hold.
    pub response_overflow: bool,
}

pub(crate) struct Pump<'a> {
    pub stdin: Option<ChildStdin>,
    pub stdin_source: Stdin,
    pub stdin_limit: u64,
    pub control: UnixStream,
    pub request: Vec<u8>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    pub stop: OwnedFd,
    pub output_limit: u64,
    pub response_limit: u64,
    pub sink: &'a mut dyn OutputSink,
}

pub(crate) fn set_nonblocking(fd: impl AsFd) -> io::Result<()> {
    let flags = fcntl(&fd, FcntlArg::F_GETFL)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(&fd, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

pub(crate) enum Progress {
    Data(usize),
    Eof,
    Blocked,
}

pub(crate) fn read_some(r: &mut impl Read, buf: &mut [u8]) -> Progress {
    loop {
        match r.read(buf) {
            Ok(0) => return Progress::Eof,
            Ok(n) => return Progress::Data(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::Blocked,
            Err(_) => return Progress::Eof,
        }
    }
}

/// Writes what it can; [`None`] when the reader is gone.
pub(crate) fn write_some(w: &mut impl Write, data: &[u8]) -> Option<usize> {
    loop {
        match w.write(data) {
            Ok(n) => return Some(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(0),
            Err(_) => return None,
        }
    }
}

impl Pump<'_> {
    /// Runs until the sandbox has closed every stream, or until `stop` is readable (the
    /// sandbox is gone); then drains what is left and returns.
    pub fn run(mut self) -> Collected {
        let mut out = Collected::default();
        let mut buf = vec![0u8; 64 * 1024];
        let mut request_at = 0usize;
        let mut request_open = true;
        let mut response_open = true;
        let mut stdin_buf: Vec<u8> = Vec::new();
        let mut stdin_at = 0usize;
        let mut stdin_sent = 0u64;
        match std::mem::replace(&mut self.stdin_source, Stdin::Empty) {
            Stdin::Empty => self.stdin = None, // EOF right away
            Stdin::Bytes(bytes) => stdin_buf = bytes,
            Stdin::File(f) => {
                // A pipe or terminal must not stall the loop while it has nothing to give.
                let _ = set_nonblocking(&f);
                self.stdin_source = Stdin::File(f);
            }
        }
        let _ = set_nonblocking(&self.control);
        if let Some(s) = &self.stdin {
            let _ = set_nonblocking(s);
        }
        if let Some(s) = &self.stdout {
            let _ = set_nonblocking(s);
        }
        if let Some(s) = &self.stderr {
            let _ = set_nonblocking(s);
        }

        let mut stopping = false;
        loop {
            if self.stdout.is_none() && self.stderr.is_none() && !response_open {
                break;
            }
            if !stopping {
                let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(5);
                let mut slots = [usize::MAX; 5];
                let mut ctl = PollFlags::empty();
                if request_open {
                    ctl |= PollFlags::POLLOUT;
                }
                if response_open {
                    ctl |= PollFlags::POLLIN;
                }
                let wanted = [
                    self.stdout.as_ref().map(|s| (s.as_fd(), PollFlags::POLLIN)),
                    self.stderr.as_ref().map(|s| (s.as_fd(), PollFlags::POLLIN)),
                    // Once both directions are done the socket must leave the set: a hung-up
                    // descriptor is always ready, and the loop would spin until the program
                    // ends (a program that closes the channel and sleeps would burn a core).
                    (!ctl.is_empty()).then(|| (self.control.as_fd(), ctl)),
                    match (&self.stdin, &self.stdin_source) {
                        (None, _) => None,
                        (Some(s), _) if stdin_at < stdin_buf.len() => {
                            Some((s.as_fd(), PollFlags::POLLOUT))
                        }
                        (Some(_), Stdin::File(f)) => Some((f.as_fd(), PollFlags::POLLIN)),
                        (Some(s), _) => Some((s.as_fd(), PollFlags::POLLOUT)),
                    },
                    Some((self.stop.as_fd(), PollFlags::POLLIN)),
                ];
                for (slot, entry) in wanted.into_iter().enumerate() {
                    if let Some((fd, events)) = entry {
                        slots[slot] = fds.len();
                        fds.push(PollFd::new(fd, events));
                    }
                }
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => stopping = true,
                }
                let ready = |slot: usize| {
                    slots[slot] != usize::MAX
                        && fds[slots[slot]].revents().is_some_and(|r| !r.is_empty())
                };
                if ready(4) {
                    // The sandbox is gone; take what is buffered and finish.
                    stopping = true;
                }
                let write_ready = ready(3);
                let ctl_ready = ready(2);
                drop(fds);
                if write_ready {
                    self.feed_stdin(&mut stdin_buf, &mut stdin_at, &mut stdin_sent);
                }
                if ctl_ready && request_open {
                    match write_some(&mut self.control, &self.request[request_at..]) {
                        Some(n) => request_at += n,
                        None => request_at = self.request.len(),
                    }
                    if request_at >= self.request.len() {
                        request_open = false;
                        let _ = self.control.shutdown(std::net::Shutdown::Write);
                    }
                }
            }
            // Reads are non-blocking: a spurious pass costs nothing.
            self.drain(Stream::Stdout, &mut buf, &mut out.streams.stdout, stopping);
            self.drain(Stream::Stderr, &mut buf, &mut out.streams.stderr, stopping);
            if response_open {
                loop {
                    match read_some(&mut self.control, &mut buf) {
                        Progress::Data(n) => {
                            let room =
                                (self.response_limit as usize).saturating_sub(out.response.len());
                            out.response.extend_from_slice(&buf[..n.min(room)]);
                            if n > room {
                                out.response_overflow = true;
                            }
                            if !stopping {
                                break;
                            }
                        }
                        Progress::Eof => {
                            response_open = false;
                            break;
                        }
                        Progress::Blocked => {
                            if stopping {
                                response_open = false;
                            }
                            break;
                        }
                    }
                }
            }
            if stopping {
                break;
            }
        }
        out
    }

    /// Moves standard input along: refills the buffer from the source when it is empty
    /// (never blocking), writes what the program will take, closes its stdin at the end.
    fn feed_stdin(&mut self, buf: &mut Vec<u8>, at: &mut usize, sent: &mut u64) {
        if self.stdin.is_none() {
            return;
        }
        if *at >= buf.len() {
            buf.clear();
            *at = 0;
            let mut finished = true;
            if let Stdin::File(f) = &mut self.stdin_source {
                let room = self.stdin_limit.saturating_sub(*sent).min(64 * 1024) as usize;
                if room > 0 {
                    buf.resize(room, 0);
                    match read_some(f, buf) {
                        Progress::Data(n) => {
                            buf.truncate(n);
                            finished = false;
                        }
                        Progress::Blocked => {
                            buf.clear();
                            return;
                        }
                        Progress::Eof => buf.clear(),
                    }
                }
            }
            if finished {
                self.stdin = None; // all of it sent, or the cap reached: EOF for the program
                return;
            }
        }
        let Some(stdin) = self.stdin.as_mut() else {
            return;
        };
        match write_some(stdin, &buf[*at..]) {
            Some(n) => {
                *at += n;
                *sent += n as u64;
            }
            None => self.stdin = None, // the program closed its stdin
        }
    }

    fn drain(&mut self, stream: Stream, buf: &mut [u8], cap: &mut Captured, all: bool) {
        loop {
            let progress = match stream {
                Stream::Stdout => self.stdout.as_mut().map(|r| read_some(r, buf)),
                Stream::Stderr => self.stderr.as_mut().map(|r| read_some(r, buf)),
            };
            match progress {
                None => return,
                Some(Progress::Data(n)) => {
                    let room = (self.output_limit as usize).saturating_sub(cap.data.len());
                    let keep = n.min(room);
                    if keep > 0 {
                        cap.data.extend_from_slice(&buf[..keep]);
                        self.sink.output(stream, &buf[..keep]);
                    }
                    if n > keep && !cap.truncated {
                        cap.truncated = true;
                        self.sink.truncated(stream, self.output_limit);
                    }
                    cap.discarded += (n - keep) as u64;
                    if cap.discarded > discard_budget(self.output_limit) {
                        match stream {
                            Stream::Stdout => self.stdout = None,
                            Stream::Stderr => self.stderr = None,
                        }
                        return;
                    }
                    if !all {
                        return;
                    }
                }
                Some(Progress::Eof) => {
                    match stream {
                        Stream::Stdout => self.stdout = None,
                        Stream::Stderr => self.stderr = None,
                    }
                    return;
                }
                Some(Progress::Blocked) => {
                    if all {
                        match stream {
                            Stream::Stdout => self.stdout = None,
                            Stream::Stderr => self.stderr = None,
                        }
                    }
                    return;
                }
            }
        }
    }
}

/// Captured output as the result holds it: the bytes themselves (invalid ones become U+FFFD
/// only as the text is sent); when the capture was cut at its limit, a multi-byte character
/// split by the cut is dropped rather than mangled.
pub(crate) fn decode_output(mut bytes: Vec<u8>, truncated: bool) -> Text {
    let mut end = bytes.len();
    if truncated {
        for i in (end.saturating_sub(3)..end).rev() {
            let needed = match bytes[i] {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => continue,
            };
            if i + needed > end {
                end = i;
            }
            break;
        }
    }
    bytes.truncate(end);
    Text::from(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        assert_eq!(
            decode_output(b"ok \xff\xfe end".to_vec(), false),
            "ok \u{fffd}\u{fffd} end"
        );
    }

    #[test]
    fn a_character_split_by_the_limit_is_dropped() {
        let euro = "\u{20ac}".as_bytes(); // 3 bytes
        assert_eq!(decode_output(vec![b'a', euro[0], euro[1]], true), "a");
        assert_eq!(
            decode_output(vec![b'a', euro[0], euro[1], euro[2]], true),
            "a\u{20ac}"
        );
        // Not cut by us: the program really wrote a broken sequence.
        assert_eq!(
            decode_output(vec![b'a', euro[0], euro[1]], false),
            "a\u{fffd}"
        );
    }
}
