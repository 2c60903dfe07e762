//! The audit log: JSON lines appended to `audit.jsonl` in the state directory (mode 0600).
//! Each execution has two: `{"event": "started", ...}` before its sandbox starts (an execution
//! whose line cannot be written does not run), then its record with the verdict. They hold
//! who, when, what code (its SHA-256, never the code), the limits and the verdict; never a
//! key, never the sandbox's environment or output.
//! The most recent records are also kept in memory for `GET /v1/executions/{id}`.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use airlock_api::ExecutionRecord;

pub const AUDIT_FILE: &str = "audit.jsonl";
/// Records served by id; older ones stay in the file.
const RECENT: usize = 10_000;
/// A record is well under 2 KiB; reading this much of the tail finds the recent ones.
const TAIL_BYTES: u64 = RECENT as u64 * 2048;

#[derive(Debug)]
struct Inner {
    file: File,
    recent: HashMap<String, ExecutionRecord>,
    order: VecDeque<String>,
}

#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    inner: Mutex<Inner>,
}

impl AuditLog {
    /// Opens (or creates) the log and loads the most recent records.
    pub fn open(state_dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(state_dir)?;
        let path = state_dir.join(AUDIT_FILE);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)?;
        let mut inner = Inner {
            file,
            recent: HashMap::new(),
            order: VecDeque::new(),
        };
        let mut reader = File::open(&path)?;
        let len = reader.metadata()?.len();
        let start = len.saturating_sub(TAIL_BYTES);
        reader.seek(SeekFrom::Start(start))?;
        let mut lines = BufReader::new(reader).lines();
        if start > 0 {
            lines.next(); // a partial line
        }
        for line in lines.map_while(Result::ok) {
            if let Ok(record) = serde_json::from_str::<ExecutionRecord>(&line) {
                remember(&mut inner, record);
            }
        }
        Ok(AuditLog {
            path,
            inner: Mutex::new(inner),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one execution's record, with its verdict.
    pub fn append(&self, record: &ExecutionRecord) -> std::io::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        write_line(&mut inner.file, record)?;
        remember(&mut inner, record.clone());
        Ok(())
    }

    /// Appends the line written before an execution starts: if it cannot be written, the
    /// execution does not run.
    pub fn append_started(&self, started: &Started<'_>) -> std::io::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        write_line(&mut inner.file, started)
    }

    /// Appends another event's line (a tool call, `{"event": "tool_call", ...}`).
    pub fn append_event(&self, event: &impl serde::Serialize) -> std::io::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        write_line(&mut inner.file, event)
    }

    pub fn get(&self, id: &str) -> Option<ExecutionRecord> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recent
            .get(id)
            .cloned()
    }
}

/// One JSON line in a single write, so lines never interleave; on failure the file is cut
/// back, so no torn line is left for the next one to be glued to.
fn write_line(file: &mut File, value: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let before = file.metadata()?.len();
    if let Err(e) = file.write_all(&line) {
        let _ = file.set_len(before);
        return Err(e);
    }
    Ok(())
}

/// The line written when an execution is about to start (`"event": "started"`); the
/// record with the verdict follows when it ends.
#[derive(Debug, serde::Serialize)]
pub struct Started<'a> {
    pub event: &'static str,
    pub id: &'a str,
    pub request_id: &'a str,
    pub key: &'a str,
    pub key_fingerprint: &'a str,
    pub started_at: &'a str,
    pub code_sha256: &'a str,
    pub code_bytes: u64,
    pub limits: &'a airlock_api::Limits,
}

fn remember(inner: &mut Inner, record: ExecutionRecord) {
    inner.order.push_back(record.id.clone());
    inner.recent.insert(record.id.clone(), record);
    while inner.order.len() > RECENT {
        if let Some(old) = inner.order.pop_front() {
            inner.recent.remove(&old);
        }
    }
}

/// Reads every record of a log file (for tests and tools).
pub fn read_all(path: &Path) -> std::io::Result<Vec<ExecutionRecord>> {
    let mut text = String::new();
    File::open(path)?.read_to_string(&mut text)?;
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_api::{Limits, Status, Usage};

    fn record(id: &str) -> ExecutionRecord {
        ExecutionRecord {
            id: id.into(),
            request_id: "rq_1".into(),
            key: "alice".into(),
            key_fingerprint: "0123456789abcdef".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            code_sha256: "0".repeat(64),
            code_bytes: 1,
            status: Status::Ok,
            exit_code: Some(0),
            signal: None,
            limits: Limits {
                timeout_ms: 1,
                memory_mb: 1,
                cpu_ms: 1,
                pids: 1,
                disk_mb: 1,
                output_bytes: 1,
            },
            limits_hit: vec![],
            usage: Usage::default(),
        }
    }

    #[test]
    fn records_survive_a_restart_and_the_file_is_private() {
        let dir = std::env::temp_dir().join(format!("airlock-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log = AuditLog::open(&dir).unwrap();
        log.append(&record("ex_a")).unwrap();
        log.append(&record("ex_b")).unwrap();
        drop(log);
        let log = AuditLog::open(&dir).unwrap();
        assert_eq!(log.get("ex_a").unwrap().key, "alice");
        assert!(log.get("ex_c").is_none());
        assert_eq!(read_all(log.path()).unwrap().len(), 2);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(log.path()).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
