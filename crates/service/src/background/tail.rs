//! Reading an events log from a position on (`GET /v1/executions/{id}/events`, with
//! `Last-Event-ID` to resume), following it while its execution runs: up to what the log's
//! watch says is written whole, then waiting on the watch for more.

use std::fs::File;
use std::sync::Arc;
use std::time::Duration;

use super::log::at_event_end;
use crate::error::Error;

/// Bytes of the log read at once.
pub const CHUNK: usize = 32 << 10;

/// An events log read from a position on, following it while its execution runs.
#[derive(Debug)]
pub struct Tail {
    file: Arc<File>,
    at: u64,
    /// How far the log is written whole, and whether its last event is in.
    written: (u64, bool),
    watch: Option<tokio::sync::watch::Receiver<(u64, bool)>>,
}

/// What a [`Tail`] gives next.
#[derive(Debug)]
pub enum Next {
    Bytes(Vec<u8>),
    /// Nothing new for the time asked.
    Silent,
    End,
}

impl Tail {
    /// The log at `path` after `after` (a `Last-Event-ID`, or 0 for all), followed through
    /// `watch` while its execution runs (`None`: it ended, the file is whole). `Err` names a
    /// position that is not the end of an event.
    pub(super) fn open(
        path: &std::path::Path,
        after: u64,
        watch: Option<tokio::sync::watch::Receiver<(u64, bool)>>,
    ) -> Result<Tail, Error> {
        let file = File::open(path).map_err(|e| gone_or(e, "reading events"))?;
        let written = match &watch {
            Some(rx) => *rx.borrow(),
            None => (file.metadata().map_or(0, |m| m.len()), true),
        };
        if after > written.0 || !at_event_end(&file, after, written.0) {
            return Err(Error::invalid(
                "Last-Event-ID",
                format!("{after} is not the id of one of this execution's events"),
            ));
        }
        Ok(Tail {
            file: Arc::new(file),
            at: after,
            written,
            watch,
        })
    }

    /// The next bytes of whole events, waiting up to `quiet` (if any) for more while it runs.
    pub async fn next(&mut self, quiet: Option<Duration>) -> std::io::Result<Next> {
        loop {
            if self.at < self.written.0 {
                let read = read_piece(&self.file, self.at, self.written.0).await?;
                self.at += read.len() as u64;
                return Ok(Next::Bytes(read));
            }
            if self.written.1 {
                return Ok(Next::End);
            }
            let Some(watch) = self.watch.as_mut() else {
                return Ok(Next::End);
            };
            let changed = match quiet {
                Some(quiet) => tokio::time::timeout(quiet, watch.changed()).await,
                None => Ok(watch.changed().await),
            };
            match changed {
                Err(_) => return Ok(Next::Silent),
                Ok(Err(_)) => {
                    // Its writer is gone: what it wrote whole is all there is.
                    self.written.1 = true;
                    self.written.0 = self.file.metadata().map_or(self.written.0, |m| m.len());
                }
                Ok(Ok(())) => self.written = *watch.borrow_and_update(),
            }
        }
    }
}

/// The piece of `file` from `at` (at most [`CHUNK`] bytes, none past `end`), read off the
/// async workers.
pub(super) async fn read_piece(file: &Arc<File>, at: u64, end: u64) -> std::io::Result<Vec<u8>> {
    let want = end.saturating_sub(at).min(CHUNK as u64) as usize;
    let file = file.clone();
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0; want];
        file.read_exact_at(&mut buf, at).map(|()| buf)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// A file of an execution deleted meanwhile is as absent as the execution.
pub(super) fn gone_or(e: std::io::Error, doing: &str) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        Error::not_found()
    } else {
        Error::internal(format!("{doing}: {e}"))
    }
}
