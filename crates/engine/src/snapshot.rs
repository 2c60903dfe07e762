//! Snapshot files: a session's state as its runner wrote it ([`crate::Session::snapshot`]),
//! kept by the host as opaque bytes. The host never parses them: it compresses them (zstd),
//! and binds them to their key and session with an HMAC-SHA256 under a key only the server
//! holds (`<dir>/.key`), over the stored bytes, its domain, the key's fingerprint and the
//! session's id. Before a byte of one reaches a sandbox ([`open_verified`]) the whole file is
//! checked against the MAC its session's record holds: a file altered, cut short, swapped
//! between two sessions or two keys, or made by anyone without the server's key is refused,
//! and nothing of it runs.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hmac::{KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = hmac::Hmac<Sha256>;

/// What every MAC covers first.
const DOMAIN: &[u8] = b"airlock-snapshot-1\0";
/// zstd's level: the fastest of the normal ones (state is mostly numbers, which compress
/// little; the time is the user's).
const LEVEL: i32 = -4;

/// The server's key for snapshot MACs.
pub struct SnapshotKey([u8; 32]);

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotKey(..)")
    }
}

impl SnapshotKey {
    /// The key at `path`, made (32 random bytes, mode 0600) if there is none. Replicas that
    /// share a snapshot directory share it.
    pub fn load_or_create(path: &Path) -> io::Result<SnapshotKey> {
        match fs::read(path) {
            Ok(bytes) => {
                let key: [u8; 32] = bytes.try_into().map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the snapshot key is not 32 bytes",
                    )
                })?;
                Ok(SnapshotKey(key))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).map_err(|e| io::Error::other(e.to_string()))?;
                let tmp = path.with_extension("new");
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&key)?;
                f.sync_all()?;
                // Another process may have made one meanwhile: the first one stays.
                match fs::hard_link(&tmp, path) {
                    Ok(()) => {
                        let _ = fs::remove_file(&tmp);
                        Ok(SnapshotKey(key))
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        let _ = fs::remove_file(&tmp);
                        Self::load_or_create(path)
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    fn mac(&self, binding: &Binding) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0).expect("any key length");
        mac.update(DOMAIN);
        for part in [binding.key_fingerprint, binding.session_id] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }
}

/// What a snapshot is bound to.
#[derive(Clone, Copy, Debug)]
pub struct Binding<'a> {
    pub key_fingerprint: &'a str,
    pub session_id: &'a str,
}

/// A snapshot file made and synced: its MAC (hex) and sizes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sealed {
    pub mac: String,
    /// On disk (compressed).
    pub stored_bytes: u64,
    /// As the runner wrote it.
    pub state_bytes: u64,
}

/// Writes what passes through it, and adds it to a MAC.
struct MacWriter {
    out: BufWriter<File>,
    mac: HmacSha256,
    written: u64,
}

impl Write for MacWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.mac.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A snapshot file being written.
pub struct SnapshotWriter {
    encoder: zstd::stream::write::Encoder<'static, MacWriter>,
    state_bytes: u64,
}

impl std::fmt::Debug for SnapshotWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("state_bytes", &self.state_bytes)
            .finish()
    }
}

impl SnapshotWriter {
    /// A new file at `path` (which must not exist), for a snapshot bound to `binding`.
    pub fn create(path: &Path, key: &SnapshotKey, binding: Binding) -> io::Result<Self> {
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)?;
        let out = MacWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            mac: key.mac(&binding),
            written: 0,
        };
        let encoder = zstd::stream::write::Encoder::new(out, LEVEL)?;
        Ok(SnapshotWriter {
            encoder,
            state_bytes: 0,
        })
    }

    pub fn write(&mut self, chunk: &[u8]) -> io::Result<()> {
        self.state_bytes += chunk.len() as u64;
        self.encoder.write_all(chunk)
    }

    /// Ends the file and syncs it; its MAC and sizes.
    pub fn finish(self) -> io::Result<Sealed> {
        let mut out = self.encoder.finish()?;
        out.flush()?;
        let file = out.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_data()?;
        Ok(Sealed {
            mac: hex(&out.mac.finalize().into_bytes()),
            stored_bytes: out.written,
            state_bytes: self.state_bytes,
        })
    }
}

/// Why a snapshot file was refused.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("the snapshot was altered, cut short, or is not this session's")]
    Forged,
    #[error("the snapshot's file: {0}")]
    Io(#[from] io::Error),
}

/// The snapshot at `path`, checked whole against `sealed` under `binding`, then read back
/// as its runner wrote it (at most `sealed.state_bytes`).
pub fn open_verified(
    path: &Path,
    key: &SnapshotKey,
    binding: Binding,
    sealed: &Sealed,
) -> Result<impl Read, VerifyError> {
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    let mut mac = key.mac(&binding);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        mac.update(&buf[..n]);
        total += n as u64;
    }
    let expected = unhex(&sealed.mac).ok_or(VerifyError::Forged)?;
    if total != sealed.stored_bytes || mac.verify_slice(&expected).is_err() {
        return Err(VerifyError::Forged);
    }
    file.seek(SeekFrom::Start(0))?;
    let decoder =
        zstd::stream::read::Decoder::with_buffer(BufReader::with_capacity(1 << 20, file))?;
    // No more than was written, whatever the file says it holds.
    Ok(decoder.take(sealed.state_bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "airlock-snapshot-test-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn rand_suffix() -> u64 {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).unwrap();
        u64::from_le_bytes(b)
    }

    fn write(path: &Path, key: &SnapshotKey, binding: Binding, data: &[u8]) -> Sealed {
        let mut w = SnapshotWriter::create(path, key, binding).unwrap();
        for chunk in data.chunks(1000) {
            w.write(chunk).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn a_snapshot_reads_back_only_whole_under_its_own_binding_and_key() {
        let d = dir();
        let key = SnapshotKey::load_or_create(&d.join(".key")).unwrap();
        let again = SnapshotKey::load_or_create(&d.join(".key")).unwrap();
        assert_eq!(key.0, again.0, "the key is kept");
        let mine = Binding {
            key_fingerprint: "aaaa",
            session_id: "se_1",
        };
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let path = d.join("se_1.snap");
        let sealed = write(&path, &key, mine, &data);
        assert_eq!(sealed.state_bytes, data.len() as u64);
        assert!(sealed.stored_bytes < sealed.state_bytes / 4, "{sealed:?}");
        let mut back = Vec::new();
        open_verified(&path, &key, mine, &sealed)
            .unwrap()
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, data);

        let refused = |path: &Path, key: &SnapshotKey, b: Binding, s: &Sealed| {
            matches!(open_verified(path, key, b, s), Err(VerifyError::Forged))
        };
        // Another session, another key's fingerprint, another server's key.
        for other in [
            Binding {
                key_fingerprint: "aaaa",
                session_id: "se_2",
            },
            Binding {
                key_fingerprint: "bbbb",
                session_id: "se_1",
            },
            // The fields' boundary is in the MAC too.
            Binding {
                key_fingerprint: "aaaas",
                session_id: "e_1",
            },
        ] {
            assert!(refused(&path, &key, other, &sealed));
        }
        let stranger = SnapshotKey::load_or_create(&dir().join(".key")).unwrap();
        assert!(refused(&path, &stranger, mine, &sealed));
        // One byte changed, or cut short, or a byte added.
        let stored = fs::read(&path).unwrap();
        let mut altered = stored.clone();
        altered[stored.len() / 2] ^= 1;
        fs::write(&path, &altered).unwrap();
        assert!(refused(&path, &key, mine, &sealed));
        fs::write(&path, &stored[..stored.len() - 1]).unwrap();
        assert!(refused(&path, &key, mine, &sealed));
        let mut longer = stored.clone();
        longer.push(0);
        fs::write(&path, &longer).unwrap();
        assert!(refused(&path, &key, mine, &sealed));
        // Another session's file in this one's place.
        let theirs = Binding {
            key_fingerprint: "aaaa",
            session_id: "se_2",
        };
        let other_path = d.join("se_2.snap");
        let other = write(&other_path, &key, theirs, b"theirs");
        fs::copy(&other_path, &path).unwrap();
        assert!(refused(&path, &key, mine, &sealed));
        assert!(refused(&path, &key, mine, &other));
        fs::remove_dir_all(&d).unwrap();
    }
}
