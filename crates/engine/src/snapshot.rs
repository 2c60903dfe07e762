//! Snapshot files: a session's state as its runner wrote it ([`crate::Session::snapshot`]),
//! kept by the host as opaque bytes. The host never parses them: it compresses them (zstd),
//! and binds them to their key and session with an HMAC-SHA256 under a key only the server
//! holds (`<dir>/.key`), over its domain, the key's fingerprint, the session's id, the stored
//! bytes' length and the SHA-256 of each 4 MiB piece of them in order (the pieces hashed on
//! several threads: one SHA-256 is slower than the disk). Before a byte of one reaches a sandbox ([`open_verified`]) the whole file is
//! checked against the MAC its session's record holds: a file altered, cut short, swapped
//! between two sessions or two keys, or made by anyone without the server's key is refused,
//! and nothing of it runs.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hmac::{KeyInit, Mac};

use crate::durable::{write_aside, Place};
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
                // Another process may have made one meanwhile: the first one stays.
                match write_aside(path, &key, Place::New) {
                    Ok(()) => Ok(SnapshotKey(key)),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        Self::load_or_create(path)
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The MAC of stored bytes of `length` whose pieces hash to `digests`, under `binding`.
    fn mac(&self, binding: &Binding, length: u64, digests: &[[u8; 32]]) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0).expect("any key length");
        mac.update(DOMAIN);
        for part in [binding.key_fingerprint, binding.session_id] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part.as_bytes());
        }
        mac.update(&length.to_le_bytes());
        for d in digests {
            mac.update(d);
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

/// The stored bytes are hashed in pieces of this size, each on its own, in parallel.
const PIECE: usize = 4 << 20;

/// Writes what passes through it, and hands it in pieces to a thread that hashes them.
struct MacWriter {
    out: BufWriter<File>,
    piece: Vec<u8>,
    pieces: Option<std::sync::mpsc::SyncSender<Vec<u8>>>,
    hashing: Option<std::thread::JoinHandle<Vec<[u8; 32]>>>,
    written: u64,
    /// Up to where the disk has been asked to write what is in the file.
    flushed: u64,
}

/// How much is written before the disk is asked to start writing it (so that the sync at the
/// end waits for the last piece only, not for the whole file).
const WRITEBACK_EVERY: u64 = 32 << 20;

impl MacWriter {
    fn new(file: File) -> io::Result<MacWriter> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
        let hashing = std::thread::Builder::new()
            .name("airlock-snapshot-hash".into())
            .spawn(move || rx.into_iter().map(|p| digest(&p)).collect())?;
        Ok(MacWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            piece: Vec::with_capacity(PIECE),
            pieces: Some(tx),
            hashing: Some(hashing),
            written: 0,
            flushed: 0,
        })
    }

    fn send_piece(&mut self) -> io::Result<()> {
        let piece = std::mem::replace(&mut self.piece, Vec::with_capacity(PIECE));
        self.pieces
            .as_ref()
            .and_then(|tx| tx.send(piece).ok())
            .ok_or_else(|| io::Error::other("the snapshot's hashing stopped"))
    }

    /// Every piece's digest, once the last is hashed.
    fn digests(&mut self) -> io::Result<Vec<[u8; 32]>> {
        if !self.piece.is_empty() {
            self.send_piece()?;
        }
        drop(self.pieces.take());
        self.hashing
            .take()
            .and_then(|h| h.join().ok())
            .ok_or_else(|| io::Error::other("the snapshot's hashing failed"))
    }
}

fn digest(piece: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    Sha256::digest(piece).into()
}

impl Write for MacWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        let mut left = &buf[..n];
        while !left.is_empty() {
            let take = left.len().min(PIECE - self.piece.len());
            self.piece.extend_from_slice(&left[..take]);
            left = &left[take..];
            if self.piece.len() == PIECE {
                self.send_piece()?;
            }
        }
        self.written += n as u64;
        if self.written - self.flushed >= WRITEBACK_EVERY {
            self.out.flush()?;
            // The disk starts on it now; the pages stay cached (a resume reads them back).
            use std::os::fd::AsFd;
            let _ = airlock_sandbox::start_writeback(
                self.out.get_ref().as_fd(),
                self.flushed,
                self.written - self.flushed,
            );
            self.flushed = self.written;
        }
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
    key: SnapshotKey,
    binding: (String, String),
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
        let encoder = zstd::stream::write::Encoder::new(MacWriter::new(file)?, LEVEL)?;
        Ok(SnapshotWriter {
            encoder,
            state_bytes: 0,
            key: SnapshotKey(key.0),
            binding: (binding.key_fingerprint.into(), binding.session_id.into()),
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
        let digests = out.digests()?;
        let written = out.written;
        let file = out.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_data()?;
        let key = &self.key;
        let binding = Binding {
            key_fingerprint: &self.binding.0,
            session_id: &self.binding.1,
        };
        Ok(Sealed {
            mac: hex(&key.mac(&binding, written, &digests).finalize().into_bytes()),
            stored_bytes: written,
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
    let length = file.metadata()?.len();
    if length != sealed.stored_bytes {
        return Err(VerifyError::Forged);
    }
    let digests = digests_of(&file, length)?;
    let expected = unhex(&sealed.mac).ok_or(VerifyError::Forged)?;
    if key
        .mac(&binding, length, &digests)
        .verify_slice(&expected)
        .is_err()
    {
        return Err(VerifyError::Forged);
    }
    file.seek(SeekFrom::Start(0))?;
    let decoder =
        zstd::stream::read::Decoder::with_buffer(BufReader::with_capacity(1 << 20, file))?;
    // No more than was written, whatever the file says it holds.
    Ok(decoder.take(sealed.state_bytes))
}

/// The digest of each piece of the file's `length` bytes, hashed on as many threads as
/// there are cores (at most four).
fn digests_of(file: &File, length: u64) -> io::Result<Vec<[u8; 32]>> {
    use std::os::unix::fs::FileExt;
    let pieces = length.div_ceil(PIECE as u64) as usize;
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, 4)
        .min(pieces.max(1));
    let mut digests = vec![[0u8; 32]; pieces];
    std::thread::scope(|scope| -> io::Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || -> io::Result<Vec<(usize, [u8; 32])>> {
                    let mut buf = vec![0u8; PIECE];
                    let mut out = Vec::new();
                    for i in (t..pieces).step_by(threads) {
                        let at = (i * PIECE) as u64;
                        let n = (length - at).min(PIECE as u64) as usize;
                        file.read_exact_at(&mut buf[..n], at)?;
                        out.push((i, digest(&buf[..n])));
                    }
                    Ok(out)
                })
            })
            .collect();
        for worker in workers {
            let done = worker
                .join()
                .map_err(|_| io::Error::other("a snapshot's hashing failed"))??;
            for (i, d) in done {
                digests[i] = d;
            }
        }
        Ok(())
    })?;
    Ok(digests)
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

        // Many pieces (hashed on several threads): a byte changed in any of them is seen.
        let mut x = 7u64;
        let noise: Vec<u8> = (0..(11 << 20) / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        let big = d.join("big.snap");
        let sealed = write(&big, &key, mine, &noise);
        assert!(sealed.stored_bytes > 2 * PIECE as u64, "{sealed:?}");
        let mut back = Vec::new();
        open_verified(&big, &key, mine, &sealed)
            .unwrap()
            .read_to_end(&mut back)
            .unwrap();
        assert!(back == noise);
        let stored = fs::read(&big).unwrap();
        for at in [0, PIECE + 17, stored.len() - 1] {
            let mut altered = stored.clone();
            altered[at] ^= 0x80;
            fs::write(&big, &altered).unwrap();
            assert!(refused(&big, &key, mine, &sealed), "byte {at}");
        }
        fs::remove_dir_all(&d).unwrap();
    }
}
