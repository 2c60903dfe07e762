//! A background execution's job while it waits for its turn, which may take hours: what is
//! large in it (its code, environment, files, an entrypoint's inputs and stdin) is written to
//! its directory at submission and taken out of memory, and read back when its turn comes,
//! stdin as a file the program reads from as it goes. What stays in memory is small: limits,
//! leases, handles.
//!
//! The file is airlock's own (mode 0600 in a directory of mode 0700), read back by the process
//! that wrote it; each length is still checked against what is left of it before anything is
//! read. It is not synced: after a restart what was queued is interrupted, and the file
//! removed.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use airlock_engine::{Entrypoint, InputFile, Job, Stdin};

/// What a parked job's file opens with (and the version of what follows).
const MAGIC: &[u8] = b"airlock parked job 1\n";

/// Bytes `job`'s file will hold ([`park`]), known before it is written.
pub fn size(job: &Job) -> u64 {
    let part = |bytes: usize| 8 + bytes as u64;
    let env: u64 = job
        .env
        .iter()
        .map(|(k, v)| part(k.len()) + part(v.len()))
        .sum();
    let files: u64 = job
        .files
        .iter()
        .map(|f| part(f.path.len()) + part(f.data.len()))
        .sum();
    let entrypoint = job
        .entrypoint
        .as_ref()
        .map_or(0, |e| part(e.name.len()) + part(json_len(&e.inputs)));
    let stdin = match &job.stdin {
        Stdin::Bytes(b) => b.len() as u64,
        _ => 0,
    };
    MAGIC.len() as u64 + part(job.code.len()) + 8 + env + 8 + files + 1 + entrypoint + 1 + stdin
}

fn json_len(inputs: &serde_json::Map<String, serde_json::Value>) -> usize {
    struct Count(usize);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, inputs);
    count.0
}

/// Writes what is large in `job` to a new file at `path` and takes it out of `job`; the bytes
/// written. A file cut short is removed. Written in place, neither aside nor synced
/// (`durable::write_aside` is for what outlives a restart): only this process reads it back,
/// and a restart removes it.
pub fn park(job: &mut Job, path: &Path) -> std::io::Result<u64> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let written = write(job, BufWriter::new(file));
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

fn write(job: &mut Job, mut w: BufWriter<File>) -> std::io::Result<u64> {
    w.write_all(MAGIC)?;
    put(&mut w, std::mem::take(&mut job.code).as_bytes())?;
    let env = std::mem::take(&mut job.env);
    w.write_all(&(env.len() as u64).to_le_bytes())?;
    for (k, v) in env {
        put(&mut w, k.as_bytes())?;
        put(&mut w, v.as_bytes())?;
    }
    let files = std::mem::take(&mut job.files);
    w.write_all(&(files.len() as u64).to_le_bytes())?;
    for f in files {
        put(&mut w, f.path.as_bytes())?;
        put(&mut w, &f.data)?;
    }
    match job.entrypoint.take() {
        Some(e) => {
            w.write_all(&[1])?;
            put(&mut w, e.name.as_bytes())?;
            put(&mut w, &serde_json::to_vec(&e.inputs)?)?;
        }
        None => w.write_all(&[0])?,
    }
    // Only stdin given as bytes is parked: it is the rest of the file.
    match std::mem::replace(&mut job.stdin, Stdin::Empty) {
        Stdin::Bytes(b) => {
            w.write_all(&[1])?;
            w.write_all(&b)?;
        }
        other => {
            job.stdin = other;
            w.write_all(&[0])?;
        }
    }
    let file = w.into_inner().map_err(|e| e.into_error())?;
    Ok(file.metadata()?.len())
}

fn put(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)
}

/// Puts back into `job` what [`park`] wrote to `path`: stdin, if it was parked, as the file
/// itself, read from where it begins as the program takes it.
pub fn unpark(job: &mut Job, path: &Path) -> std::io::Result<()> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut r = Reader {
        inner: BufReader::new(file),
        at: 0,
        len,
    };
    let mut magic = [0u8; MAGIC.len()];
    r.exact(&mut magic)?;
    if magic != MAGIC {
        return Err(invalid("not a parked job"));
    }
    job.code = r.text()?;
    let n = r.count()?;
    let mut env = Vec::new();
    for _ in 0..n {
        env.push((r.text()?, r.text()?));
    }
    job.env = env;
    let n = r.count()?;
    let mut files = Vec::new();
    for _ in 0..n {
        let path = r.text()?;
        let data = r.bytes()?;
        files.push(InputFile { path, data });
    }
    job.files = files;
    if r.flag()? {
        let name = r.text()?;
        let inputs = serde_json::from_slice(&r.bytes()?)?;
        job.entrypoint = Some(Entrypoint { name, inputs });
    }
    if r.flag()? {
        let at = r.at;
        let mut file = r.inner.into_inner();
        file.seek(SeekFrom::Start(at))?;
        job.stdin = Stdin::File(file);
    }
    Ok(())
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// A parked job's file read part by part, each length checked against what is left.
struct Reader {
    inner: BufReader<File>,
    at: u64,
    len: u64,
}

impl Reader {
    fn exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact(buf)?;
        self.at += buf.len() as u64;
        Ok(())
    }

    /// Bytes left of the file as it was opened (none if it grew since).
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.at)
    }

    fn u64(&mut self) -> std::io::Result<u64> {
        let mut n = [0u8; 8];
        self.exact(&mut n)?;
        Ok(u64::from_le_bytes(n))
    }

    /// A count of parts, each at least 16 bytes (two lengths).
    fn count(&mut self) -> std::io::Result<u64> {
        let n = self.u64()?;
        if n > self.left() / 16 {
            return Err(invalid("a count past the end of the file"));
        }
        Ok(n)
    }

    fn flag(&mut self) -> std::io::Result<bool> {
        let mut b = [0u8; 1];
        self.exact(&mut b)?;
        Ok(b[0] == 1)
    }

    fn bytes(&mut self) -> std::io::Result<Vec<u8>> {
        let n = self.u64()?;
        if n > self.left() {
            return Err(invalid("a length past the end of the file"));
        }
        let mut buf = vec![0u8; n as usize];
        self.exact(&mut buf)?;
        Ok(buf)
    }

    fn text(&mut self) -> std::io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| invalid("text that is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a_job(code: &str) -> Job {
        Job {
            code: code.into(),
            filename: "main.py".into(),
            stdin: Stdin::Empty,
            env: Vec::new(),
            files: Vec::new(),
            entrypoint: None,
            limits: airlock_api::Limits {
                timeout_ms: 1000,
                memory_mb: 64,
                cpu_ms: 1000,
                pids: 8,
                disk_mb: 8,
                output_bytes: 1024,
            },
            max_code_bytes: 1 << 20,
            stream: false,
            echo_traceback: false,
            cancel: None,
            tools: None,
            egress: None,
            environment: None,
            volumes: Vec::new(),
        }
    }

    #[test]
    fn a_parked_job_comes_back_as_it_was() {
        let dir = std::env::temp_dir().join(format!("airlock-parked-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("job");
        let mut inputs = serde_json::Map::new();
        inputs.insert("n".into(), serde_json::json!([1, 2.5, {"é": null}]));
        let mut job = a_job("print(input())\n€");
        job.env = vec![("A".into(), "1".into()), ("B".into(), String::new())];
        job.files = vec![InputFile {
            path: "d/x.bin".into(),
            data: vec![0, 255, 10],
        }];
        job.entrypoint = Some(Entrypoint {
            name: "f".into(),
            inputs: inputs.clone(),
        });
        job.stdin = Stdin::Bytes(b"line\n".repeat(1000));
        let expected = size(&job);
        assert_eq!(park(&mut job, &path).unwrap(), expected);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), expected);
        assert!(job.code.is_empty() && job.env.is_empty() && job.files.is_empty());
        assert!(job.entrypoint.is_none() && matches!(job.stdin, Stdin::Empty));

        unpark(&mut job, &path).unwrap();
        assert_eq!(job.code, "print(input())\n€");
        assert_eq!(
            job.env,
            [("A".into(), "1".into()), ("B".into(), String::new())]
        );
        assert_eq!(
            (job.files[0].path.as_str(), &job.files[0].data[..]),
            ("d/x.bin", &[0, 255, 10][..])
        );
        let e = job.entrypoint.as_ref().unwrap();
        assert_eq!((e.name.as_str(), &e.inputs), ("f", &inputs));
        let Stdin::File(mut f) = std::mem::replace(&mut job.stdin, Stdin::Empty) else {
            panic!("stdin is not the file");
        };
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"line\n".repeat(1000));

        // Cut anywhere before its stdin, it is refused, never read past its end.
        let whole = std::fs::read(&path).unwrap();
        let stdin_at = whole.len() - 5000;
        for cut in [0, 5, MAGIC.len() + 3, stdin_at - 20, stdin_at - 1] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            assert!(unpark(&mut a_job(""), &path).is_err(), "{cut}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
