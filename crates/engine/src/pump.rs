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
    /// Whether `output` may wait (for a slow reader): then the output is pumped on a thread
    /// of its own, never on the one that enforces the sandbox's limits.
    fn may_block(&self) -> bool {
        true
    }
}

/// A sink that keeps nothing (the result carries the output anyway).
#[derive(Debug, Default)]
pub struct Discard;

impl OutputSink for Discard {
    fn output(&mut self, _: Stream, _: &[u8]) {}
    fn truncated(&mut self, _: Stream, _: u64) {}
    fn may_block(&self) -> bool {
        false
    }
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

/// A pump under way: what it has collected, and how far each direction has got. Driven by
/// [`Pump::run`] on a thread of its own, or by the thread that waits for the sandbox (as its
/// [`airlock_sandbox::Beside`]); [`Pumping::finish`] takes what is left once it is gone.
pub(crate) struct Pumping<'a> {
    pump: Pump<'a>,
    out: Collected,
    buf: Vec<u8>,
    request_at: usize,
    request_open: bool,
    response_open: bool,
    stdin_buf: Vec<u8>,
    stdin_at: usize,
    stdin_sent: u64,
}

impl<'a> Pump<'a> {
    /// Every descriptor made non-blocking, standard input's source taken.
    pub fn start(mut self) -> Pumping<'a> {
        let mut stdin_buf: Vec<u8> = Vec::new();
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
        Pumping {
            pump: self,
            out: Collected::default(),
            buf: vec![0u8; 64 * 1024],
            request_at: 0,
            request_open: true,
            response_open: true,
            stdin_buf,
            stdin_at: 0,
            stdin_sent: 0,
        }
    }

    /// Runs until the sandbox has closed every stream, or until `stop` is readable (the
    /// sandbox is gone); then drains what is left and returns.
    pub fn run(self, stop: OwnedFd) -> Collected {
        let mut p = self.start();
        loop {
            if p.done() {
                return p.out;
            }
            let wanted = p.interest();
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(5);
            for (fd, events) in wanted.iter().flatten() {
                fds.push(PollFd::new(*fd, *events));
            }
            fds.push(PollFd::new(stop.as_fd(), PollFlags::POLLIN));
            let polled = poll(&mut fds, PollTimeout::NONE);
            let events: Vec<PollFlags> = fds
                .iter()
                .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                .collect();
            drop(fds);
            let present = wanted.map(|w| w.is_some());
            match polled {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return p.finish(),
            }
            if events.last().is_some_and(|e| !e.is_empty()) {
                // The sandbox is gone; take what is buffered and finish.
                return p.finish();
            }
            p.step(present, &events);
        }
    }
}

impl Pumping<'_> {
    /// Every stream closed and the response read to its end.
    fn done(&self) -> bool {
        self.pump.stdout.is_none() && self.pump.stderr.is_none() && !self.response_open
    }

    /// The descriptors to wait on, and for what: stdout, stderr, the control channel,
    /// standard input (or its source).
    fn interest(&self) -> [Option<(std::os::fd::BorrowedFd<'_>, PollFlags)>; 4] {
        let mut ctl = PollFlags::empty();
        if self.request_open {
            ctl |= PollFlags::POLLOUT;
        }
        if self.response_open {
            ctl |= PollFlags::POLLIN;
        }
        let p = &self.pump;
        [
            p.stdout.as_ref().map(|s| (s.as_fd(), PollFlags::POLLIN)),
            p.stderr.as_ref().map(|s| (s.as_fd(), PollFlags::POLLIN)),
            // Once both directions are done the socket must leave the set: a hung-up
            // descriptor is always ready, and the loop would spin until the program
            // ends (a program that closes the channel and sleeps would burn a core).
            (!ctl.is_empty()).then(|| (p.control.as_fd(), ctl)),
            match (&p.stdin, &p.stdin_source) {
                (None, _) => None,
                (Some(s), _) if self.stdin_at < self.stdin_buf.len() => {
                    Some((s.as_fd(), PollFlags::POLLOUT))
                }
                (Some(_), Stdin::File(f)) => Some((f.as_fd(), PollFlags::POLLIN)),
                (Some(s), _) => Some((s.as_fd(), PollFlags::POLLOUT)),
            },
        ]
    }

    /// One pass after a poll: `present` says which of [`interest`](Self::interest)'s
    /// descriptors were polled, `events` what each of those (in order) had. Reads are
    /// non-blocking: a spurious pass costs nothing.
    fn step(&mut self, present: [bool; 4], events: &[PollFlags]) {
        let mut ready = [false; 4];
        let mut at = 0;
        for (slot, polled) in present.iter().enumerate() {
            if *polled {
                ready[slot] = events.get(at).is_some_and(|e| !e.is_empty());
                at += 1;
            }
        }
        if ready[3] {
            self.pump.feed_stdin(
                &mut self.stdin_buf,
                &mut self.stdin_at,
                &mut self.stdin_sent,
            );
        }
        if ready[2] && self.request_open {
            let p = &mut self.pump;
            match write_some(&mut p.control, &p.request[self.request_at..]) {
                Some(n) => self.request_at += n,
                None => self.request_at = p.request.len(),
            }
            if self.request_at >= p.request.len() {
                self.request_open = false;
                let _ = p.control.shutdown(std::net::Shutdown::Write);
            }
        }
        self.collect(false);
    }

    /// What is left once the sandbox is gone: every stream and the response read to its end.
    pub fn finish(mut self) -> Collected {
        self.collect(true);
        self.out
    }

    /// Output and response read as far as they go now (`all`: to their end).
    fn collect(&mut self, all: bool) {
        let (p, buf) = (&mut self.pump, &mut self.buf);
        p.drain(Stream::Stdout, buf, &mut self.out.streams.stdout, all);
        p.drain(Stream::Stderr, buf, &mut self.out.streams.stderr, all);
        if !self.response_open {
            return;
        }
        loop {
            match read_some(&mut p.control, buf) {
                Progress::Data(n) => {
                    let room = (p.response_limit as usize).saturating_sub(self.out.response.len());
                    self.out.response.extend_from_slice(&buf[..n.min(room)]);
                    if n > room {
                        self.out.response_overflow = true;
                    }
                    if !all {
                        break;
                    }
                }
                Progress::Eof => {
                    self.response_open = false;
                    break;
                }
                Progress::Blocked => {
                    if all {
                        self.response_open = false;
                    }
                    break;
                }
            }
        }
    }
}

impl airlock_sandbox::Beside for Pumping<'_> {
    fn fds(&self) -> Vec<(std::os::fd::BorrowedFd<'_>, PollFlags)> {
        self.interest().into_iter().flatten().collect()
    }

    fn polled(&mut self, events: &[PollFlags]) {
        let present = self.interest().map(|w| w.is_some());
        self.step(present, events);
    }
}

impl Pump<'_> {
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
