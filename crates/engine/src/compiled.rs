//! The runner compiled once, for cold sandboxes. A cold sandbox's Python otherwise compiles
//! the runner's source before anything else (about 4 ms in a fresh interpreter); given the
//! code object marshalled by the same interpreter, it only loads it. Zygotes keep the source:
//! it is their program, compiled once in each anyway.
//!
//! The code object is made by the interpreter in a sandbox of its own (no user code in it),
//! and kept in the state directory so that a one-shot `airlock run` pays for it once: keyed by
//! the interpreter's identity and the runner's source, and checked on every read (owned by
//! us, writable by no one else, its digest).

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use airlock_sandbox::{spawn, Command, Exit, Policy};
use sha2::{Digest, Sha256};

use crate::durable::{write_aside, Place};

/// Run in the sandbox: the runner's source on stdin, its code object on stdout.
const COMPILE: &str = "import marshal, sys\n\
sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.buffer.read(), '<string>', 'exec')))\n";
/// What the runner's code object can weigh (about 18 KiB).
const MAX_BYTES: usize = 1 << 20;
const HEADER: &[u8] = b"airlock compiled runner 1\n";

/// The runner's code object, marshalled, in a sealed memfd that cold sandboxes read.
#[derive(Debug, Clone)]
pub(crate) struct CompiledRunner {
    memfd: Arc<OwnedFd>,
    len: usize,
}

impl CompiledRunner {
    /// The code that replaces the runner's source after `-c`, with the code object at `fd`:
    /// loaded, the descriptor closed before anything of the runner runs, then run as the
    /// source would be (the same globals, the same file name).
    pub(crate) fn boot(&self, fd: usize) -> String {
        format!(
            "import marshal, posix\n_c = marshal.loads(posix.pread({fd}, {}, 0))\nposix.close({fd})\nexec(_c)\n",
            self.len
        )
    }

    /// A descriptor of the sealed memfd for one sandbox (no one can change what it holds).
    pub(crate) fn descriptor(&self) -> std::io::Result<OwnedFd> {
        self.memfd.try_clone()
    }

    /// The runner for `python` (the source `runner`), from the cache in `dir` or compiled in
    /// a sandbox with `policy` and kept there.
    pub(crate) fn load(
        python: &Path,
        runner: &str,
        policy: &Policy,
        dir: &Path,
    ) -> Result<CompiledRunner, String> {
        let path = dir.join(format!("{}.bin", key(python, runner)?));
        let code = match read_checked(dir, &path) {
            Ok(Some(code)) => code,
            Ok(None) | Err(_) => {
                // Only where it can be kept: a one-shot run would pay for it every time.
                make_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                let code = compile_in_sandbox(python, runner, policy)?;
                store(dir, &path, &code).map_err(|e| format!("{}: {e}", path.display()))?;
                code
            }
        };
        sealed(&code).map(|memfd| CompiledRunner {
            memfd: Arc::new(memfd),
            len: code.len(),
        })
    }
}

/// The interpreter's identity (its resolved path, size, modification time and inode) and the
/// runner's source: a new interpreter or runner is a new key.
fn key(python: &Path, runner: &str) -> Result<String, String> {
    let real = std::fs::canonicalize(python).map_err(|e| format!("{}: {e}", python.display()))?;
    let meta = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
    let mut h = Sha256::new();
    h.update(real.as_os_str().as_encoded_bytes());
    h.update([0]);
    for n in [
        meta.len(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
        meta.ino(),
    ] {
        h.update(n.to_le_bytes());
    }
    h.update(runner.as_bytes());
    Ok(hex(&h.finalize()[..16]))
}

use airlock_api::hex;

/// Whether `meta` is ours and writable by no one else.
fn ours(meta: &std::fs::Metadata) -> bool {
    meta.uid() == nix::unistd::geteuid().as_raw() && meta.permissions().mode() & 0o022 == 0
}

/// The cached code object, if there is one we can trust: in a directory and a file of ours
/// that no one else can write, its digest right. [`None`] when there is none or it is not so.
fn read_checked(dir: &Path, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let dir_meta = std::fs::symlink_metadata(dir)?;
    if !dir_meta.is_dir() || !ours(&dir_meta) {
        return Ok(None);
    }
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() || !ours(&meta) || meta.len() as usize > MAX_BYTES + 128 {
        return Ok(None);
    }
    let mut all = Vec::new();
    file.read_to_end(&mut all)?;
    let Some(rest) = all.strip_prefix(HEADER) else {
        return Ok(None);
    };
    let Some(newline) = rest.iter().position(|b| *b == b'\n') else {
        return Ok(None);
    };
    let (digest, code) = (&rest[..newline], &rest[newline + 1..]);
    if code.is_empty() || digest != hex(&Sha256::digest(code)).as_bytes() {
        return Ok(None);
    }
    Ok(Some(code.to_vec()))
}

/// The cache's directory, made if missing; an error unless it is ours alone to write.
fn make_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.is_dir() && ours(&meta) {
        Ok(())
    } else {
        Err(std::io::Error::other("not a directory of ours alone"))
    }
}

/// Writes the cache entry whole or not at all.
fn store(dir: &Path, path: &Path, code: &[u8]) -> std::io::Result<()> {
    make_dir(dir)?;
    let mut entry = HEADER.to_vec();
    entry.extend_from_slice(hex(&Sha256::digest(code)).as_bytes());
    entry.push(b'\n');
    entry.extend_from_slice(code);
    write_aside(path, &entry, Place::Replace)
}

/// The interpreter compiles the runner's source in a sandbox and writes the code object.
fn compile_in_sandbox(python: &Path, runner: &str, policy: &Policy) -> Result<Vec<u8>, String> {
    let command = Command::new(python.to_path_buf())
        .args(["-I", "-S", "-B", "-c", COMPILE])
        .env("LANG", "C.UTF-8");
    let mut child = spawn(command, policy).map_err(|e| e.to_string())?;
    let mut stdin = child.take_stdin().ok_or("no stdin")?;
    let mut stdout = child.take_stdout().ok_or("no stdout")?;
    let source = runner.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(source.as_bytes()));
    let mut code = Vec::new();
    let read = (&mut stdout)
        .take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut code);
    drop(stdout);
    let _ = writer.join();
    let outcome = child.wait().map_err(|e| e.to_string())?;
    read.map_err(|e| e.to_string())?;
    if outcome.exit != Some(Exit::Code(0)) || code.is_empty() || code.len() > MAX_BYTES {
        return Err(format!(
            "compiling the runner: {:?}, {} bytes",
            outcome.exit,
            code.len()
        ));
    }
    Ok(code)
}

/// A memfd holding `code`, sealed against any change.
fn sealed(code: &[u8]) -> Result<OwnedFd, String> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create(
        c"airlock-runner",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|e| format!("memfd_create: {e}"))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(code).map_err(|e| e.to_string())?;
    let seals = SealFlag::F_SEAL_SEAL
        | SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_WRITE;
    fcntl(&file, FcntlArg::F_ADD_SEALS(seals)).map_err(|e| format!("sealing: {e}"))?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_entry_is_used_only_when_it_is_ours_and_whole() {
        let dir = std::env::temp_dir().join(format!("airlock-compiled-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("k.bin");
        store(&dir, &path, b"code").unwrap();
        assert_eq!(read_checked(&dir, &path).unwrap(), Some(b"code".to_vec()));
        // A changed byte: the digest no longer matches.
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() = b'x';
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read_checked(&dir, &path).unwrap(), None);
        // Whole again, but writable by others: not trusted.
        store(&dir, &path, b"code").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(read_checked(&dir, &path).unwrap(), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(read_checked(&dir, &path).unwrap(), None);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        // A link in its place is not followed.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert!(read_checked(&dir, &path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_new_interpreter_or_runner_is_a_new_key() {
        let python = Path::new("/bin/sh");
        let a = key(python, "print(1)").unwrap();
        assert_eq!(a, key(python, "print(1)").unwrap());
        assert_ne!(a, key(python, "print(2)").unwrap());
        assert_ne!(a, key(Path::new("/bin/ls"), "print(1)").unwrap());
    }

    #[test]
    fn the_sealed_runner_cannot_be_changed() {
        let fd = sealed(b"abc").unwrap();
        let mut file = std::fs::File::from(fd);
        assert!(file.write_all(b"x").is_err());
        assert!(file.set_len(1).is_err());
        let mut back = String::new();
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(0)).unwrap();
        file.read_to_string(&mut back).unwrap();
        assert_eq!(back, "abc");
    }
}
