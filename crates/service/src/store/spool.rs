//! The spool: lines the database has not confirmed, kept on the local disk and synced, and
//! committed once it can be written again.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::db::Db;
use super::rows::{insert, Row, BATCH};
use crate::audit_lines::cut_torn_tail;

/// The spool's file in the state directory.
pub const SPOOL_FILE: &str = "store-spool.jsonl";

/// Lines the database has not confirmed, on the local disk: `store-spool.jsonl` in the state
/// directory (mode 0600), one JSON object a line (`replica`, `key`: the row's `line_key`,
/// `line`), synced before anyone relies on it. See the module's docs for what goes there.
/// Replaying adds nothing twice: a line already committed has its `line_key` taken. Every
/// process with this state directory and store (`airlock serve`, an `airlock mcp` beside it)
/// shares the file: each change to it holds an exclusive `flock`, so that one's replay never
/// empties a line another has just appended.
#[derive(Debug)]
pub(super) struct Spool {
    pub(super) path: PathBuf,
    file: Mutex<SpoolFile>,
}

#[derive(Debug)]
pub(super) struct SpoolFile {
    file: File,
}

/// The spool's file locked against the other processes that share it, until dropped: a
/// `flock` on a second descriptor of the same open file.
fn exclusive(file: &File) -> std::io::Result<nix::fcntl::Flock<File>> {
    nix::fcntl::Flock::lock(file.try_clone()?, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::from(e))
}

/// One spooled line as read back.
#[derive(serde::Deserialize)]
struct Spooled<'a> {
    replica: String,
    key: String,
    #[serde(borrow)]
    line: &'a serde_json::value::RawValue,
}

impl Spool {
    /// Opens (or creates) the spool in `dir`, a last line cut short (a crash mid-write: no
    /// answer waited on it) cut off.
    pub(super) fn open(dir: &Path) -> std::io::Result<Spool> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(SPOOL_FILE);
        let named = |e: std::io::Error| {
            std::io::Error::new(
                e.kind(),
                format!("the store's spool {}: {e}", path.display()),
            )
        };
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(named)?;
        let held = exclusive(&file).map_err(named)?;
        let torn = cut_torn_tail(&mut file).map_err(named)?;
        drop(held);
        if torn > 0 {
            tracing::warn!(bytes = torn, path = %path.display(), "cut a torn last line off the store's spool");
        }
        Ok(Spool {
            path,
            file: Mutex::new(SpoolFile { file }),
        })
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, SpoolFile> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `rows` in one write and syncs them.
    pub(super) fn append(
        spool: &mut SpoolFile,
        replica: &str,
        rows: &[Row],
    ) -> std::io::Result<()> {
        let mut text = Vec::new();
        for row in rows {
            let key = row.key.as_deref().unwrap_or_default();
            // `line` is JSON already (a row's line is what jsonb takes): kept as it is.
            writeln!(
                text,
                "{{\"replica\":{},\"key\":{},\"line\":{}}}",
                serde_json::Value::from(replica),
                serde_json::Value::from(key),
                row.line
            )?;
        }
        let _held = exclusive(&spool.file)?;
        let before = spool.file.metadata()?.len();
        if let Err(e) = (&spool.file).write_all(&text) {
            let _ = spool.file.set_len(before);
            return Err(e);
        }
        spool.file.sync_data()
    }

    /// Every line it holds, with the replica that wrote it, oldest first.
    pub(super) fn read(&self) -> std::io::Result<Vec<(String, Row)>> {
        let text = std::fs::read_to_string(&self.path)?;
        let mut rows = Vec::new();
        for line in text.lines() {
            let read = serde_json::from_str::<Spooled<'_>>(line)
                .map_err(std::io::Error::other)
                .and_then(|s| {
                    let row = Row::of(0, Some(s.key), s.line.get().as_bytes().to_vec())?;
                    Ok((s.replica, row))
                });
            match read {
                Ok(row) => rows.push(row),
                Err(e) => {
                    tracing::error!(error = %e, "a line of the store's spool cannot be read; skipped")
                }
            }
        }
        Ok(rows)
    }

    /// Commits every spooled line through `db`, in order, then empties the spool; how many.
    pub(super) fn replay(&self, db: &mut Db) -> std::io::Result<u64> {
        let spool = self.lock();
        let _held = exclusive(&spool.file)?;
        if spool.file.metadata()?.len() == 0 {
            return Ok(0);
        }
        let rows = self.read()?;
        for batch in rows.chunks(BATCH) {
            for same in batch.chunk_by(|a, b| a.0 == b.0) {
                let replica = &same[0].0;
                let rows: Vec<&Row> = same.iter().map(|(_, row)| row).collect();
                db.run("replaying the spool", async |c| {
                    insert(c, replica, &rows).await
                })?;
            }
        }
        spool.file.set_len(0)?;
        spool.file.sync_data()?;
        let replayed = rows.len() as u64;
        tracing::warn!(
            lines = replayed,
            "audit lines kept in the store's spool are committed to PostgreSQL"
        );
        Ok(replayed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spool_gives_back_what_was_synced_and_cuts_a_line_torn_by_a_crash() {
        let dir = std::env::temp_dir().join(format!(
            "airlock-spool-{}-{}",
            std::process::id(),
            crate::keys::random_id("")
        ));
        let spool = Spool::open(&dir).unwrap();
        let record = br#"{"id":"ex_r0_1","status":"ok","key_fingerprint":"f"}"#;
        let rows = [
            Row::of(3, Some("run_a:3".into()), record.to_vec()).unwrap(),
            Row::of(
                4,
                Some("run_a:4".into()),
                br#"{"event":"not_run","execution_id":"ex_r0_2"}"#.to_vec(),
            )
            .unwrap(),
        ];
        Spool::append(&mut spool.lock(), "r0", &rows).unwrap();
        drop(spool);
        // A crash in the middle of the next write leaves a torn line: cut at the next open.
        let path = dir.join(SPOOL_FILE);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"replica":"r0","key":"run_a:5","li"#)
            .unwrap();
        let spool = Spool::open(&dir).unwrap();
        let back = spool.read().unwrap();
        let got: Vec<_> = back
            .iter()
            .map(|(replica, r)| {
                (
                    replica.as_str(),
                    r.key.as_deref(),
                    r.event.as_str(),
                    r.execution_id.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("r0", Some("run_a:3"), "record", Some("ex_r0_1")),
                ("r0", Some("run_a:4"), "not_run", Some("ex_r0_2")),
            ]
        );
        assert_eq!(back[0].1.key_fingerprint.as_deref(), Some("f"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two processes on one state directory (the server and an `airlock mcp`) open the spool
    /// each on its own: a change by one waits while the other holds the file, so a replay
    /// never empties what the other was appending.
    #[test]
    fn the_spool_s_file_is_changed_by_one_opening_at_a_time() {
        let dir = std::env::temp_dir().join(format!(
            "airlock-spool-{}-{}",
            std::process::id(),
            crate::keys::random_id("")
        ));
        let (one, other) = (Spool::open(&dir).unwrap(), Spool::open(&dir).unwrap());
        let held = exclusive(&one.lock().file).unwrap();
        let row = Row::of(
            1,
            Some("run_b:1".into()),
            br#"{"id":"ex_r1_1","status":"ok"}"#.to_vec(),
        )
        .unwrap();
        let appending = std::thread::spawn(move || {
            Spool::append(&mut other.lock(), "r1", &[row]).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !appending.is_finished(),
            "appended while the other held the file"
        );
        assert!(one.read().unwrap().is_empty());
        drop(held);
        appending.join().unwrap();
        let back = one.read().unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].1.key.as_deref(), Some("run_b:1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
