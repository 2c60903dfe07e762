//! A session's channel and pipes: one request and its answer, with the output the code writes
//! meanwhile read and kept within its limit (`exchange`), or frames streamed both ways, a
//! snapshot's or a restore's, with the output dropped (`stream_exchange`).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{ChildStderr, ChildStdout};
use std::time::{Duration, Instant};

use airlock_api::Status;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::channel::{self, Assembler, Broken, Frame};
use crate::error::EngineError;
use crate::pump::{self, OutputSink, Progress, Stream, Streams};

/// Reads of each stream once an answer is in: what the pipes hold then (background writers
/// could go on for ever).
const FINAL_READS: usize = 64;

/// The session's channel and pipes, held by one request at a time.
pub(super) struct Io {
    pub(super) control: UnixStream,
    pub(super) stdout: ChildStdout,
    pub(super) stderr: ChildStderr,
    /// Readable once the sandbox has ended.
    pub(super) ended: OwnedFd,
    pub(super) cells: u64,
    /// Set when a cell ended the session: its status, for later requests.
    pub(super) final_status: Option<Status>,
}

pub(super) fn io_error(what: &'static str, source: std::io::Error) -> EngineError {
    EngineError::Io { what, source }
}

/// A request (marshal) as the runner reads it: one frame.
pub(super) fn framed(request: Vec<u8>) -> Result<Vec<u8>, EngineError> {
    channel::frame(&request).map_err(|e| io_error("framing a request", std::io::Error::other(e)))
}

/// What one request/answer exchange on a session's channel gave.
pub(super) struct Exchange {
    /// The answer's payload (without its length).
    pub(super) reply: Option<Vec<u8>>,
    /// The answer announced more than an answer may hold.
    pub(super) overflow: bool,
    pub(super) streams: Streams,
    pub(super) timed_out: bool,
}

/// Sends `request`, then collects output until the answer is whole, the deadline passes or
/// the sandbox ends. Output that the pipes hold once the answer is in belongs to it too.
pub(super) fn exchange(
    io: &mut Io,
    request: &[u8],
    deadline: Instant,
    sink: &mut dyn OutputSink,
    output_limit: u64,
    response_limit: u64,
) -> Exchange {
    let mut ex = Exchange {
        reply: None,
        overflow: false,
        streams: Streams::default(),
        timed_out: false,
    };
    for fd in [io.control.as_fd(), io.stdout.as_fd(), io.stderr.as_fd()] {
        let _ = pump::set_nonblocking(fd);
    }
    let mut sent = 0usize;
    let mut answer = Assembler::new(response_limit);
    let mut buf = vec![0u8; 64 * 1024];
    let mut open = [true, true]; // stdout, stderr
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            ex.timed_out = true;
            break;
        }
        let (control_ready, ended) = wait(io, sent < request.len(), open, left);
        drain(io, &mut buf, &mut ex, &mut open, sink, output_limit, false);
        if control_ready {
            if sent < request.len() {
                match pump::write_some(&mut io.control, &request[sent..]) {
                    Some(n) => sent += n,
                    None => break, // the runner is gone
                }
            }
            let frame = loop {
                match pump::read_some(&mut io.control, &mut buf) {
                    Progress::Data(n) => {
                        answer.push(&buf[..n]);
                        if let Some(frame) = answer.frame() {
                            break Some(frame);
                        }
                    }
                    Progress::Eof => break Some(answer.end()),
                    Progress::Blocked => break None,
                }
            };
            match frame {
                Some(Frame::Data(reply)) => {
                    ex.reply = Some(reply);
                    drain(io, &mut buf, &mut ex, &mut open, sink, output_limit, true);
                    break;
                }
                Some(Frame::Broken(Broken::TooLarge { .. })) => {
                    ex.overflow = true;
                    ex.reply = Some(Vec::new());
                    break;
                }
                // The runner closed its channel, with no whole answer on it.
                Some(Frame::End | Frame::Broken(Broken::Cut)) => break,
                None => {}
            }
        }
        if ended {
            drain(io, &mut buf, &mut ex, &mut open, sink, output_limit, true);
            break;
        }
    }
    ex
}

/// Waits (at most `left`) for the channel to be readable (or writable, with `sending`), the
/// sandbox to end or an open output stream to be readable: whether the channel is ready, and
/// whether the sandbox has ended.
fn wait(io: &Io, sending: bool, open: [bool; 2], left: Duration) -> (bool, bool) {
    let mut ctl = PollFlags::POLLIN;
    if sending {
        ctl |= PollFlags::POLLOUT;
    }
    let mut fds = vec![
        PollFd::new(io.control.as_fd(), ctl),
        PollFd::new(io.ended.as_fd(), PollFlags::POLLIN),
    ];
    if open[0] {
        fds.push(PollFd::new(io.stdout.as_fd(), PollFlags::POLLIN));
    }
    if open[1] {
        fds.push(PollFd::new(io.stderr.as_fd(), PollFlags::POLLIN));
    }
    let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
    let _ = poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    );
    let ready = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
    (ready(0), ready(1))
}

/// Reads from stdout and stderr, keeping what fits the output limit: one read each while the
/// cell runs (so the deadline is looked at between reads, however fast the code writes), or
/// what they hold, up to `FINAL_READS` reads each, once the answer is in.
fn drain(
    io: &mut Io,
    buf: &mut [u8],
    ex: &mut Exchange,
    open: &mut [bool; 2],
    sink: &mut dyn OutputSink,
    limit: u64,
    last: bool,
) {
    let reads = if last { FINAL_READS } else { 1 };
    for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
        for _ in 0..reads {
            if !open[i] {
                break;
            }
            let got = match stream {
                Stream::Stdout => pump::read_some(&mut io.stdout, buf),
                Stream::Stderr => pump::read_some(&mut io.stderr, buf),
            };
            let n = match got {
                Progress::Data(n) => n,
                Progress::Eof => {
                    open[i] = false;
                    break;
                }
                Progress::Blocked => break,
            };
            let cap = ex.streams.of(stream);
            let room = (limit as usize).saturating_sub(cap.data.len());
            let keep = n.min(room);
            if keep > 0 {
                cap.data.extend_from_slice(&buf[..keep]);
                sink.output(stream, &buf[..keep]);
            }
            if n > keep && !cap.truncated && limit > 0 {
                cap.truncated = true;
                sink.truncated(stream, limit);
            }
            // Past the budget this cell reads the stream no more (the session keeps its
            // pipe): the program blocks on it instead of making the host read for nothing.
            cap.discarded += (n - keep) as u64;
            if cap.discarded > pump::discard_budget(limit) {
                open[i] = false;
                break;
            }
        }
    }
}

/// Whether a streamed exchange wants more frames.
pub(super) enum Flow {
    More,
    Done,
}

/// How a streamed exchange ended.
#[derive(Debug)]
pub(super) enum StreamEnd {
    /// The receiver had what it wanted.
    Done,
    TimedOut,
    /// The sandbox ended, closed its channel or broke a frame.
    Gone,
    /// What was to be sent could not be made.
    SourceFailed,
}

/// Sends what `outgoing` puts in the buffer it is given (its last one, to fill again; until
/// it says there is no more) while handing each frame that comes
/// back to `incoming`, until it says [`Flow::Done`], the deadline passes or the sandbox ends.
/// Output the sandbox writes meanwhile belongs to no cell: read and dropped.
pub(super) fn stream_exchange(
    io: &mut Io,
    outgoing: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<bool>,
    incoming: &mut dyn FnMut(&mut Vec<u8>) -> Flow,
    deadline: Instant,
    frame_cap: u64,
) -> StreamEnd {
    for fd in [io.control.as_fd(), io.stdout.as_fd(), io.stderr.as_fd()] {
        let _ = pump::set_nonblocking(fd);
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut sent = 0usize;
    let mut more_to_send = true;
    // Frames are read straight into `payload` (no copy but the kernel's): a 4-byte length,
    // then that many bytes.
    let mut head = [0u8; 4];
    let mut head_got = 0usize;
    let mut payload: Vec<u8> = Vec::new();
    let mut payload_got = 0usize;
    let mut in_payload = false;
    let mut buf = vec![0u8; 64 * 1024];
    let mut open = [true, true];
    loop {
        if sent == pending.len() && more_to_send {
            match outgoing(&mut pending) {
                Ok(true) => sent = 0,
                Ok(false) => {
                    more_to_send = false;
                    pending.clear();
                    sent = 0;
                }
                Err(_) => return StreamEnd::SourceFailed,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return StreamEnd::TimedOut;
        }
        let (control_ready, ended) = wait(io, sent < pending.len(), open, left);
        for (i, open) in open.iter_mut().enumerate() {
            if !*open {
                continue;
            }
            let got = if i == 0 {
                pump::read_some(&mut io.stdout, &mut buf)
            } else {
                pump::read_some(&mut io.stderr, &mut buf)
            };
            if matches!(got, Progress::Eof) {
                *open = false;
            }
        }
        if control_ready {
            if sent < pending.len() {
                match pump::write_some(&mut io.control, &pending[sent..]) {
                    Some(n) => sent += n,
                    None => return StreamEnd::Gone,
                }
            }
            // A bounded number of reads before the deadline is looked at again.
            for _ in 0..1024 {
                let target: &mut [u8] = if in_payload {
                    &mut payload[payload_got..]
                } else {
                    &mut head[head_got..]
                };
                let n = match pump::read_some(&mut io.control, target) {
                    Progress::Data(n) => n,
                    Progress::Eof => return StreamEnd::Gone,
                    Progress::Blocked => break,
                };
                if in_payload {
                    payload_got += n;
                } else {
                    head_got += n;
                    if head_got < head.len() {
                        continue;
                    }
                    let len = u32::from_le_bytes(head) as u64;
                    if len > frame_cap {
                        return StreamEnd::Gone;
                    }
                    payload.resize(len as usize, 0);
                    payload_got = 0;
                    in_payload = true;
                }
                if in_payload && payload_got == payload.len() {
                    in_payload = false;
                    head_got = 0;
                    if let Flow::Done = incoming(&mut payload) {
                        return StreamEnd::Done;
                    }
                }
            }
        }
        if ended {
            return StreamEnd::Gone;
        }
    }
}
