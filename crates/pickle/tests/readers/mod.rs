//! The readers a victim may load an archive with, as oracles for the scan: miniz, the ZIP
//! reader under torch.load (its C source built by `scripts/miniz-reader.sh`), and Python's
//! zipfile and tarfile (`readers.py`, tarfile as torch's legacy loader opens it). Shared by
//! `tests/differential.rs` and the `zip_readers` fuzz target.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use airlock_pickle::{scan, FileReport, Options, Report, Verdict};

/// The repository's root: the crate's tests and the fuzz crate both include this file.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("scripts/miniz-reader.sh").is_file())
        .expect("the repository holds scripts/miniz-reader.sh")
        .to_path_buf()
}

/// Builds the miniz reader into `out` (`scripts/miniz-reader.sh`).
pub fn build_miniz(out: &Path) {
    let status = Command::new("bash")
        .arg(root().join("scripts/miniz-reader.sh"))
        .arg(out)
        .status()
        .expect("run scripts/miniz-reader.sh");
    assert!(status.success(), "building the miniz reader failed");
}

/// What one reader made of one member: its local (or tar) header's offset, and the bytes it
/// would hand to the unpickler, or why it refused.
#[derive(Debug, Clone)]
pub struct Extracted {
    pub reader: String,
    pub offset: Option<usize>,
    pub bytes: Result<Vec<u8>, String>,
}

/// A reader running as a child process, fed archives one after another. miniz 2.0 reads
/// out of bounds on some extra fields and may crash: a reader that dies has extracted
/// nothing from that archive, and is started again.
pub struct Reader {
    program: PathBuf,
    args: Vec<PathBuf>,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

fn spawn(program: &Path, args: &[PathBuf]) -> (Child, ChildStdin, BufReader<ChildStdout>) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
    let stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdin, stdout)
}

impl Reader {
    pub fn start(program: &Path, args: &[&Path]) -> Reader {
        let args: Vec<PathBuf> = args.iter().map(|a| a.to_path_buf()).collect();
        let (child, stdin, stdout) = spawn(program, &args);
        Reader {
            program: program.to_path_buf(),
            args,
            child,
            stdin,
            stdout,
        }
    }

    pub fn miniz(binary: &Path) -> Reader {
        Reader::start(binary, &[])
    }

    pub fn python() -> Reader {
        let script = root().join("crates/pickle/tests/readers/readers.py");
        Reader::start(Path::new("/usr/bin/python3"), &[&script])
    }

    /// Every member the reader extracts (or fails to) from `archive`.
    pub fn read(&mut self, archive: &[u8]) -> Vec<Extracted> {
        match self.try_read(archive) {
            Some(out) => out,
            None => {
                let status = self.child.wait().ok();
                assert!(
                    status.is_some_and(|s| !s.success()),
                    "{} stopped answering without failing",
                    self.program.display()
                );
                let _ = self.child.kill();
                (self.child, self.stdin, self.stdout) = spawn(&self.program, &self.args);
                vec![Extracted {
                    reader: self.program.display().to_string(),
                    offset: None,
                    bytes: Err(format!("died reading it: {status:?}")),
                }]
            }
        }
    }

    fn try_read(&mut self, archive: &[u8]) -> Option<Vec<Extracted>> {
        self.stdin
            .write_all(&(archive.len() as u64).to_le_bytes())
            .and_then(|()| self.stdin.write_all(archive))
            .and_then(|()| self.stdin.flush())
            .ok()?;
        let mut out = Vec::new();
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end();
            if line == "." {
                return Some(out);
            }
            let mut parts = line.splitn(4, ' ');
            let (reader, offset, outcome, rest) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            if reader == "I" {
                continue; // the archive does not open: nothing extracted
            }
            let bytes = match outcome {
                "ok" => Ok(unhex(rest)),
                _ => Err(rest.to_owned()),
            };
            out.push(Extracted {
                reader: reader.to_owned(),
                offset: offset.parse().ok(),
                bytes,
            });
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Bytes whose very first opcode fails: CPython loading them stops there (the scan's "data").
fn no_pickle(r: &Report) -> bool {
    matches!(r.verdict, Verdict::Malformed { offset: 0, .. }) && r.opcodes <= 1
}

/// Whether a `safe` verdict holds for what the readers extracted: each member a reader hands
/// to the unpickler must have been scanned, at its header, as exactly as many bytes, and
/// those bytes must be safe (or no pickle at all) read on their own. Any other verdict
/// already refuses the file.
pub fn check(report: &FileReport, extracted: &[Extracted], opts: &Options) -> Result<(), String> {
    if *report.verdict() != Verdict::Safe {
        return Ok(());
    }
    // A pickle that also holds a safe archive is reported as the pickle: its members are
    // checked for safety only.
    let members = match report {
        FileReport::Zip { members, .. } | FileReport::Tar { members, .. } => Some(&members[..]),
        FileReport::Pickle(_) => None,
    };
    for e in extracted {
        let Ok(bytes) = &e.bytes else { continue };
        let alone = scan(bytes, opts);
        if alone.verdict != Verdict::Safe && !no_pickle(&alone) {
            return Err(format!(
                "safe, yet {} extracts a member at {:?} that is {:?}",
                e.reader, e.offset, alone.verdict
            ));
        }
        let Some(members) = members else { continue };
        let scanned = members
            .iter()
            .find(|m| Some(m.offset) == e.offset && m.error.is_none());
        match scanned {
            Some(m) if m.size == bytes.len() => {}
            Some(m) => {
                return Err(format!(
                    "safe, yet {} extracts {} bytes at {:?} where the scan read {}",
                    e.reader,
                    bytes.len(),
                    e.offset,
                    m.size
                ))
            }
            None => {
                return Err(format!(
                    "safe, yet {} extracts a member at {:?} the scan did not read",
                    e.reader, e.offset
                ))
            }
        }
    }
    Ok(())
}
