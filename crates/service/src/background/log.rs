//! A background execution's events log (`events`): its events as server-sent events, appended
//! as they happen, each with an `id:` that is the byte offset just past it, so a client
//! resumes after any event it got (`Last-Event-ID`) and is sent every byte of output exactly
//! once. An event's data is one line of JSON, so a blank line only ever ends one. Output is
//! held back and joined into events of at most [`COALESCE_BYTES`] of text ([`Held`]), so that
//! the log's size follows from the output limits (each stream's output once, JSON-escaped, in
//! events of at least a byte).

use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use airlock_engine::Stream;

/// Output held back for the log joins one event up to this many bytes, the most an event holds.
pub(super) const COALESCE_BYTES: usize = 16 << 10;

/// How long output is held back for the log at most while an execution runs.
pub(super) const FLUSH_EVERY: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One server-sent event as the log holds it, `at` bytes into the log: its `id:` is the
/// offset just past it.
pub(super) fn record(at: u64, name: &str, data: &str) -> Vec<u8> {
    let body = format!("event: {name}\ndata: {data}\n\n");
    let mut digits = 1;
    let end = loop {
        let end = at + 5 + digits + body.len() as u64;
        if end.to_string().len() as u64 == digits {
            break end;
        }
        digits += 1;
    };
    let mut out = format!("id: {end}\n").into_bytes();
    out.extend_from_slice(body.as_bytes());
    debug_assert_eq!(at + out.len() as u64, end);
    out
}

/// The events log being written: the file (gone once the last event is in, or once it could
/// not be written), its length, and a watch of how much of it is written whole and whether
/// the last event is among it, which followers wait on.
#[derive(Debug)]
pub(super) struct EventsLog {
    file: Mutex<(Option<File>, u64)>,
    written: tokio::sync::watch::Sender<(u64, bool)>,
}

impl EventsLog {
    pub(super) fn new(file: File) -> EventsLog {
        EventsLog {
            file: Mutex::new((Some(file), 0)),
            written: tokio::sync::watch::Sender::new((0, false)),
        }
    }

    /// Appends one event: the bytes written, or why it could not be (what part of it went in
    /// is taken back, if the disk lets us, and nothing more is written); `None` once closed.
    pub(super) fn append(
        &self,
        name: &str,
        data: &serde_json::Value,
    ) -> Option<std::io::Result<u64>> {
        let mut log = lock(&self.file);
        let whole = log.1;
        let bytes = record(whole, name, &data.to_string());
        let file = log.0.as_mut()?;
        if let Err(e) = file.write_all(&bytes) {
            let _ = file.set_len(whole);
            log.0 = None;
            return Some(Err(e));
        }
        log.1 += bytes.len() as u64;
        let len = log.1;
        drop(log);
        self.written.send_modify(|w| w.0 = len);
        Some(Ok(bytes.len() as u64))
    }

    /// Its last event is in: nothing more is written, and followers read to the end.
    pub(super) fn close(&self) {
        lock(&self.file).0 = None;
        self.written.send_modify(|w| w.1 = true);
    }

    /// Whether its last event is written.
    pub(super) fn has_ended(&self) -> bool {
        self.written.borrow().1
    }

    /// How far it is written whole, and whether its last event is in, as it changes.
    pub(super) fn subscribe(&self) -> tokio::sync::watch::Receiver<(u64, bool)> {
        self.written.subscribe()
    }
}

/// Output text held back for the log: joined with what follows it on the same stream until
/// [`COALESCE_BYTES`] are held, the other stream writes, or it is flushed (on a clock of
/// [`FLUSH_EVERY`], while it runs). A program that flushes a byte at a time
/// makes a few events a second, not one per byte: the log stays within a few times the
/// output limits. No event holds more than [`COALESCE_BYTES`] of text: a longer write is cut
/// between characters.
#[derive(Debug, Default)]
pub(super) struct Held {
    stream: Option<Stream>,
    text: String,
}

impl Held {
    /// Takes in `text` of `s`; `write` is given each event's text due now.
    pub(super) fn push(&mut self, s: Stream, text: &str, mut write: impl FnMut(Stream, &str)) {
        if self.stream != Some(s) && !self.text.is_empty() {
            if let Some(stream) = self.stream {
                write(stream, &std::mem::take(&mut self.text));
            }
        }
        self.stream = Some(s);
        self.text.push_str(text);
        let mut at = 0;
        while self.text.len() - at >= COALESCE_BYTES {
            let end = char_floor(&self.text, at + COALESCE_BYTES);
            write(s, &self.text[at..end]);
            at = end;
        }
        self.text.drain(..at);
    }

    /// What is held, taken out.
    pub(super) fn take(&mut self) -> Option<(Stream, String)> {
        if self.text.is_empty() {
            return None;
        }
        Some((self.stream?, std::mem::take(&mut self.text)))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// The largest `i <= at` where a character of `text` begins (`at` within `text`).
fn char_floor(text: &str, at: usize) -> usize {
    (0..=at)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0)
}

/// Whether `at` is where an event of the log ends (or its start): the two bytes before it
/// end an event, and an event (or the end) follows. An event's data is one line, so a blank
/// line only ever ends one.
pub(super) fn at_event_end(file: &File, at: u64, len: u64) -> bool {
    use std::os::unix::fs::FileExt;
    if at == 0 {
        return true;
    }
    if at < 2 {
        return false;
    }
    let mut before = [0u8; 2];
    if file.read_exact_at(&mut before, at - 2).is_err() || &before != b"\n\n" {
        return false;
    }
    if at == len {
        return true;
    }
    let mut next = [0u8; 4];
    file.read_exact_at(&mut next, at).is_ok() && &next == b"id: "
}

/// The length of `file`'s first `len` bytes up to the end of its last whole event (0 when
/// none is whole): past the last blank line, which only ever ends an event.
fn whole_events_len(file: &File, len: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    const STEP: u64 = 64 << 10;
    let mut end = len;
    let mut block = vec![0u8; STEP as usize + 1];
    while end >= 2 {
        // One byte of overlap, so that a blank line across two blocks is seen.
        let start = end.saturating_sub(STEP + 1);
        let piece = &mut block[..(end - start) as usize];
        if file.read_exact_at(piece, start).is_err() {
            return 0;
        }
        if let Some(i) = piece.windows(2).rposition(|w| w == b"\n\n") {
            return start + i as u64 + 2;
        }
        if start == 0 {
            break;
        }
        end = start + 1;
    }
    0
}

/// The log of an execution the server stopped while it ran (`events` in `dir`), ended with an
/// `error` event of `data`: an event cut short by the stop (events are not synced one by one)
/// is cut off first, so that the error follows whole events.
pub(super) fn end_interrupted(dir: &std::path::Path, id: &str, data: &serde_json::Value) {
    let Ok(mut events) = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(dir.join("events"))
    else {
        return;
    };
    let written = events.metadata().map_or(0, |m| m.len());
    let len = whole_events_len(&events, written);
    if len < written {
        tracing::warn!(execution = %id, cut = written - len, "a background execution's last event was cut short by the stop; it is removed");
        let _ = events.set_len(len);
    }
    let _ = events.write_all(&record(len, "error", &data.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_s_id_is_the_offset_just_past_it() {
        let mut log = Vec::new();
        for (name, data) in [("stdout", "{\"text\":\"a\"}"), ("stderr", &"x".repeat(100))] {
            let r = record(log.len() as u64, name, data);
            log.extend_from_slice(&r);
            let text = String::from_utf8(r).unwrap();
            let id: u64 = text[4..text.find('\n').unwrap()].parse().unwrap();
            assert_eq!(id, log.len() as u64);
        }
        // Across a change in the number of digits.
        let r = record(9_990, "stdout", "{}");
        let text = String::from_utf8(r.clone()).unwrap();
        let id: u64 = text[4..text.find('\n').unwrap()].parse().unwrap();
        assert_eq!(id, 9_990 + r.len() as u64);
    }

    #[test]
    fn only_ends_of_events_are_positions_to_resume_from() {
        let dir = std::env::temp_dir().join(format!("airlock-bg-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("events");
        let mut log = record(0, "stdout", "{\"text\":\"a\\n\\nb\"}");
        let first = log.len() as u64;
        log.extend(record(first, "result", "{}"));
        std::fs::write(&path, &log).unwrap();
        let file = File::open(&path).unwrap();
        let len = log.len() as u64;
        assert!(at_event_end(&file, 0, len));
        assert!(at_event_end(&file, first, len));
        assert!(at_event_end(&file, len, len));
        for bad in [1, 2, 5, first - 1, first + 1, len - 1] {
            assert!(!at_event_end(&file, bad, len), "{bad}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_log_cut_short_is_cut_back_to_its_last_whole_event() {
        let dir = std::env::temp_dir().join(format!("airlock-bg-cut-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("events");
        // Events larger than a block, so that the search crosses blocks.
        let big = format!("{{\"text\":\"{}\"}}", "x".repeat(150 << 10));
        let mut log = record(0, "stdout", &big);
        let first = log.len() as u64;
        log.extend(record(first, "stdout", &big));
        let whole = log.len() as u64;
        std::fs::write(&path, &log).unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(whole_events_len(&file, whole), whole);
        // Every cut inside the second event goes back to the first's end.
        for cut in [first + 1, first + 70_000, whole - 2, whole - 1] {
            assert_eq!(whole_events_len(&file, cut), first, "{cut}");
        }
        for cut in [0, 1, 5, first - 1] {
            assert_eq!(whole_events_len(&file, cut), 0, "{cut}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
