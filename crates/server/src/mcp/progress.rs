//! What a long `run_python` or `run_in_session` call tells its MCP host while it runs:
//! `notifications/progress` every `mcp.progress_interval_ms` when the host gave a progress
//! token (seconds so far, bytes of output so far), so that a host with a short timeout keeps
//! waiting; and, over stdio, once the host set a logging level of `info` or below, the output
//! printed so far as `notifications/message` (logger `stdout` or `stderr`).
//!
//! The execution never waits for the host: its output goes through [`Observer`], which counts
//! it and copies at most [`LOG_BUFFER`] bytes per stream for the next log message, dropping
//! (and counting) what does not fit while the host is slow. One task per call sends the
//! notifications ([`Reporter`]); it ends with the call, or is aborted when the call is
//! dropped (its client cancelled or went away).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_engine::{OutputSink, Stream};
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext};
use rmcp::RoleServer;
use tokio::time::Instant;

/// Output held for log messages, per stream: what was printed since the last message went.
/// Beyond it the output is dropped from the log messages (the result has all of it).
const LOG_BUFFER: usize = 16 << 10;

/// Log messages go at most this often, so a fast printer's output is sent in few of them:
/// at most `LOG_BUFFER` bytes per stream this often.
const LOG_EVERY: Duration = Duration::from_millis(250);

/// A call's output as it comes: counted, and kept for log messages when they are wanted.
#[derive(Debug)]
struct Seen {
    /// Bytes of output so far (both streams, within the output limit).
    bytes: AtomicU64,
    /// What waits for the next log message, when the host asked for them.
    logs: Option<Mutex<[Pending; 2]>>,
    /// Wakes the reporter when there is output to log.
    wake: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    /// Bytes left out since the last message, for want of room.
    dropped: u64,
}

/// The execution's output sink (`pipeline::Request::observer`): called on the thread that
/// enforces the sandbox's limits, so it only counts and copies, under a lock held for a copy
/// of at most [`LOG_BUFFER`] bytes.
#[derive(Debug)]
struct Observer(Arc<Seen>);

impl OutputSink for Observer {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        self.0
            .bytes
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        let Some(logs) = &self.0.logs else {
            return;
        };
        let mut logs = logs.lock().unwrap_or_else(|e| e.into_inner());
        let pending = &mut logs[index(stream)];
        let keep = LOG_BUFFER
            .saturating_sub(pending.bytes.len())
            .min(chunk.len());
        pending.bytes.extend_from_slice(&chunk[..keep]);
        pending.dropped += (chunk.len() - keep) as u64;
        drop(logs);
        self.0.wake.notify_one();
    }

    fn truncated(&mut self, _: Stream, _: u64) {}

    fn may_block(&self) -> bool {
        false
    }
}

fn index(stream: Stream) -> usize {
    match stream {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    }
}

const LOGGERS: [&str; 2] = ["stdout", "stderr"];

/// The task that sends a call's notifications. [`Reporter::finish`] sends what output is
/// left to log and ends it; dropped, it is aborted.
#[derive(Debug)]
pub(super) struct Reporter {
    task: Option<tokio::task::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Reporter {
    /// Ends the task once it has sent the output still waiting to be logged.
    pub(super) async fn finish(mut self) {
        drop(self.stop.take());
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The observer and reporter of a call whose host gave a progress token (`_meta`) or wants
/// log messages (`logs`); none otherwise, and nothing is sent.
pub(super) fn watch(
    context: &RequestContext<RoleServer>,
    every: Duration,
    logs: bool,
) -> Option<(Box<dyn OutputSink>, Reporter)> {
    let token = context.meta.get_progress_token();
    if token.is_none() && !logs {
        return None;
    }
    let seen = Arc::new(Seen {
        bytes: AtomicU64::new(0),
        logs: logs.then(Mutex::default),
        wake: tokio::sync::Notify::new(),
    });
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(report(
        context.peer.clone(),
        token,
        seen.clone(),
        every,
        stopped,
    ));
    let reporter = Reporter {
        task: Some(task),
        stop: Some(stop),
    };
    Some((Box::new(Observer(seen)), reporter))
}

/// Sends progress every `every` (with a token), and the output as it comes in log messages
/// at most every [`LOG_EVERY`] (when wanted), until `stopped`. A send that fails (the host
/// gone) ends it.
async fn report(
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
    seen: Arc<Seen>,
    every: Duration,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let start = Instant::now();
    let mut tick = tokio::time::interval_at(start + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = 0.0;
    let mut next_log = start;
    // The last bytes of a character cut between two messages, for the next one.
    let mut carry: [Vec<u8>; 2] = Default::default();
    loop {
        let sent = tokio::select! {
            _ = tick.tick(), if token.is_some() => {
                let Some(token) = &token else { return };
                let elapsed = start.elapsed();
                // Seconds so far, which only grow (the spec asks for a value that increases).
                let progress = (elapsed.as_millis() as f64 / 1000.0).max(last + 0.001);
                last = progress;
                let mut param = ProgressNotificationParam::new(token.clone(), progress);
                param.message = Some(format!(
                    "running for {} s, {} bytes of output",
                    elapsed.as_secs(),
                    seen.bytes.load(Ordering::Relaxed)
                ));
                peer.notify_progress(param).await.is_ok()
            }
            () = seen.wake.notified(), if seen.logs.is_some() => {
                tokio::time::sleep_until(next_log).await;
                next_log = Instant::now() + LOG_EVERY;
                log(&peer, &seen, &mut carry).await
            }
            _ = &mut stopped => {
                log(&peer, &seen, &mut carry).await;
                return;
            }
        };
        if !sent {
            return;
        }
    }
}

/// Sends the output waiting to be logged, one message per stream; false if the host is gone.
#[allow(deprecated)] // MCP's logging, deprecated by SEP-2577, is what hosts read today.
async fn log(peer: &Peer<RoleServer>, seen: &Seen, carry: &mut [Vec<u8>; 2]) -> bool {
    use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
    let Some(logs) = &seen.logs else {
        return true;
    };
    let taken = std::mem::take(&mut *logs.lock().unwrap_or_else(|e| e.into_inner()));
    for (i, pending) in taken.into_iter().enumerate() {
        let Some(text) = text(pending, &mut carry[i]) else {
            continue;
        };
        let param = LoggingMessageNotificationParam::new(LoggingLevel::Info, text.into())
            .with_logger(LOGGERS[i]);
        if peer.notify_logging_message(param).await.is_err() {
            return false;
        }
    }
    true
}

/// A log message's text: the bytes (after what `carry` held), as UTF-8 but for a character
/// cut at their end, which is carried to the next message; then what was left out, if any.
fn text(pending: Pending, carry: &mut Vec<u8>) -> Option<String> {
    let mut bytes = std::mem::take(carry);
    bytes.extend_from_slice(&pending.bytes);
    if pending.dropped == 0 {
        if let Err(e) = std::str::from_utf8(&bytes) {
            if e.error_len().is_none() {
                *carry = bytes.split_off(e.valid_up_to());
            }
        }
    }
    if bytes.is_empty() && pending.dropped == 0 {
        return None;
    }
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if pending.dropped > 0 {
        text.push_str(&format!(
            "\n[{} bytes left out of the log messages: the host takes them more slowly than the \
             code prints; the result has them all]",
            pending.dropped
        ));
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(bytes: &[u8], dropped: u64) -> Pending {
        Pending {
            bytes: bytes.to_vec(),
            dropped,
        }
    }

    #[test]
    fn a_character_cut_between_messages_is_sent_whole_in_the_next() {
        let euro = "€".as_bytes();
        let mut carry = Vec::new();
        let first = [b"a".as_slice(), &euro[..2]].concat();
        assert_eq!(text(pending(&first, 0), &mut carry).as_deref(), Some("a"));
        assert_eq!(carry, &euro[..2]);
        assert_eq!(
            text(pending(&euro[2..], 0), &mut carry).as_deref(),
            Some("€")
        );
        assert!(carry.is_empty());
        assert_eq!(text(pending(b"", 0), &mut carry), None);
    }

    #[test]
    fn output_left_out_is_said() {
        let mut carry = Vec::new();
        let said = text(pending(b"x\xff", 7), &mut carry).unwrap();
        assert!(said.starts_with("x\u{fffd}\n[7 bytes left out"), "{said}");
    }

    #[test]
    fn the_observer_counts_everything_and_keeps_a_bounded_part() {
        let seen = Arc::new(Seen {
            bytes: AtomicU64::new(0),
            logs: Some(Mutex::default()),
            wake: tokio::sync::Notify::new(),
        });
        let mut observer = Observer(seen.clone());
        assert!(!observer.may_block());
        observer.output(Stream::Stdout, &vec![b'x'; LOG_BUFFER - 1]);
        observer.output(Stream::Stdout, b"yz");
        observer.output(Stream::Stderr, b"e");
        assert_eq!(seen.bytes.load(Ordering::Relaxed), LOG_BUFFER as u64 + 2);
        let logs = seen.logs.as_ref().unwrap().lock().unwrap();
        assert_eq!(logs[0].bytes.len(), LOG_BUFFER);
        assert_eq!(logs[0].dropped, 1);
        assert_eq!(
            (logs[1].bytes.as_slice(), logs[1].dropped),
            (b"e".as_slice(), 0)
        );
    }
}
