//! A background execution's result (`result.json`): the result with its output, written once
//! it ran and read back from the disk, never held in memory (but for an answer made whole, as
//! MCP's are, whose memory the caller reserved).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use super::meta::private_file;
use super::tail::{gone_or, read_piece};
use crate::error::Error;

/// Writes `result` to `dir`'s `result.json`, synced; its size. Nothing is left of it when it
/// cannot be written.
pub(super) fn store(dir: &Path, result: &airlock_api::ExecutionResult) -> std::io::Result<u64> {
    let path = dir.join("result.json");
    let stored = private_file(&path).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        serde_json::to_writer(&mut w, result).map_err(std::io::Error::other)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_data()?;
        Ok(f.metadata()?.len())
    });
    if stored.is_err() {
        // Not counted in the key's bytes, so not left to be subtracted later.
        let _ = std::fs::remove_file(&path);
    }
    stored
}

/// The result at `path`, parsed.
pub(super) fn read(path: &Path) -> Result<airlock_api::ExecutionResult, Error> {
    let file = File::open(path).map_err(|e| gone_or(e, "reading a result"))?;
    serde_json::from_reader(std::io::BufReader::new(file))
        .map_err(|e| Error::internal(format!("reading a result: {e}")))
}

/// A stored result, read from the disk as it is sent.
#[derive(Debug)]
pub struct Stored {
    file: Arc<File>,
    at: u64,
    pub len: u64,
}

impl Stored {
    /// The result at `path`, to be read piece by piece.
    pub(super) fn open(path: &Path) -> Result<Stored, Error> {
        let file = File::open(path).map_err(|e| gone_or(e, "reading a result"))?;
        let len = file
            .metadata()
            .map_err(|e| Error::internal(format!("reading a result: {e}")))?
            .len();
        Ok(Stored {
            file: Arc::new(file),
            at: 0,
            len,
        })
    }

    /// Its next piece (at most [`CHUNK`](super::tail::CHUNK) bytes), and the rest; `None` at its end.
    pub async fn next(mut self) -> Option<(Vec<u8>, Stored)> {
        if self.at >= self.len {
            return None;
        }
        let read = read_piece(&self.file, self.at, self.len).await.ok()?;
        self.at += read.len() as u64;
        Some((read, self))
    }
}
