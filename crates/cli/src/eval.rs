//! `airlock eval`: Python literal expressions evaluated natively, without an
//! interpreter or a sandbox.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::{mpsc, Mutex};

use airlock_pyeval::{evaluate, evaluate_json, Limits};

/// Evaluate a Python literal expression natively (no interpreter, no sandbox).
///
/// Prints `str()` of the value, or `ExceptionType: message` on stderr (exit
/// 1). Without EXPR, reads one expression per line from stdin and writes one
/// line per expression, in order (a large batch shared between the CPUs); the
/// exit code is 1 if any of them failed.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The expression (`<expr>` or `result = <expr>`).
    expr: Option<String>,
    /// Print one JSON object per expression: {"ok": true, "type", "repr",
    /// "str", "value"} or {"ok": false, "error": {"type", "message"}}.
    #[arg(long)]
    json: bool,
}

pub fn main(args: EvalArgs) -> ExitCode {
    let failed = match &args.expr {
        Some(expr) => {
            let mut out = std::io::stdout().lock();
            let mut part = Part::default();
            one(expr, args.json, &Limits::default(), &mut part);
            if let Err(e) = part.write_to(&mut out).and_then(|()| out.flush()) {
                crate::out::settle(e); // says a failure once, however often it comes
            }
            part.failed
        }
        None => match batch(args.json) {
            Ok(failed) => failed,
            Err(e) => {
                errln!("airlock eval: {e}");
                return ExitCode::from(crate::EXIT_AIRLOCK);
            }
        },
    };
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Lines a job holds at most: few enough that a batch is shared between the workers, enough
/// that handing a job over costs nothing per line.
const JOB_LINES: usize = 256;
/// Output a worker holds for one job before it hands it over and waits for it to be written:
/// what bounds memory when answers are large (`'x' * 10**6` prints a megabyte).
const PART_BYTES: usize = 1 << 20;

/// Complete lines of stdin, in order.
struct Job {
    seq: u64,
    lines: Result<String, String>,
}

/// Answers to a job's lines, or part of them.
#[derive(Default)]
struct Part {
    seq: u64,
    out: Vec<u8>,
    /// Errors for stderr (text mode), each after `out[..at]`.
    errs: Vec<(usize, String)>,
    failed: bool,
    /// The job's last part: the writer goes on to the next job.
    last: bool,
    /// Told once the part is written (a part that is not the job's last).
    written: Option<mpsc::SyncSender<()>>,
    /// Reading stdin failed here: nothing after it.
    fatal: Option<String>,
}

impl Part {
    fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut from = 0;
        for (at, message) in &self.errs {
            out.write_all(&self.out[from..*at])?;
            out.flush()?;
            errln!("{message}");
            from = *at;
        }
        out.write_all(&self.out[from..])
    }
}

/// One expression's answer, appended to `part`.
fn one(expr: &str, json: bool, limits: &Limits, part: &mut Part) {
    if json {
        let (ok, _) = evaluate_json(expr, limits, &mut part.out); // a Vec takes every write
        part.out.push(b'\n');
        part.failed |= !ok;
    } else {
        match evaluate(expr, limits) {
            Ok(v) => {
                part.out.extend_from_slice(v.str.as_bytes());
                part.out.push(b'\n');
            }
            Err(e) => {
                part.errs.push((part.out.len(), e.to_string()));
                part.failed = true;
            }
        }
    }
}

/// One expression per line of stdin, one answer per line of stdout, in order. Jobs of lines
/// are evaluated on every core the process may use; whatever has been answered is flushed
/// whenever the answers catch up with the input, so a caller that writes a line and waits for
/// its answer gets it. Returns whether any expression failed.
fn batch(json: bool) -> Result<bool, String> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let (job_tx, job_rx) = mpsc::sync_channel::<Job>(workers);
    let job_rx = Mutex::new(job_rx);
    let (part_tx, part_rx) = mpsc::channel::<Part>();
    // Jobs read but not yet written, at most: the answers waiting for their turn are bounded.
    let in_flight = 2 * workers + 2;
    let (permit_tx, permit_rx) = mpsc::sync_channel::<()>(in_flight);
    for _ in 0..in_flight {
        let _ = permit_tx.send(());
    }
    std::thread::scope(|scope| {
        scope.spawn(move || read_jobs(&job_tx, &permit_rx));
        for _ in 0..workers {
            let (job_rx, part_tx) = (&job_rx, part_tx.clone());
            scope.spawn(move || work(job_rx, &part_tx, json));
        }
        drop(part_tx);
        write_parts(&part_rx, &permit_tx)
    })
}

fn read_jobs(jobs: &mpsc::SyncSender<Job>, permits: &mpsc::Receiver<()>) {
    let mut seq = 0;
    let mut send = |lines: Result<String, String>| {
        // No permit: the writer is gone, and nothing read would be written.
        permits.recv().is_ok() && {
            seq += 1;
            jobs.send(Job {
                seq: seq - 1,
                lines,
            })
            .is_ok()
        }
    };
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; 64 << 10];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                send(Err(e.to_string()));
                return;
            }
        };
        // What is pending holds no newline: only the new bytes need looking at, so a long
        // line read in many pieces is not scanned again with each.
        let Some(end) = buf[..n].iter().rposition(|b| *b == b'\n') else {
            pending.extend_from_slice(&buf[..n]);
            continue;
        };
        let end = pending.len() + end;
        pending.extend_from_slice(&buf[..n]);
        let rest = pending.split_off(end + 1);
        if !send_lines(std::mem::replace(&mut pending, rest), &mut send) {
            return;
        }
    }
    if !pending.is_empty() {
        send_lines(pending, &mut send);
    }
}

/// Sends `bytes` (whole lines) as jobs of at most [`JOB_LINES`] lines; invalid UTF-8 ends
/// the input at its line. Returns whether to go on.
fn send_lines(bytes: Vec<u8>, send: &mut impl FnMut(Result<String, String>) -> bool) -> bool {
    let (text, bad) = match String::from_utf8(bytes) {
        Ok(text) => (text, false),
        Err(e) => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            // The lines before the one that holds the bad byte are answered.
            let cut = bytes[..valid]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            bytes.truncate(cut);
            (String::from_utf8(bytes).unwrap_or_default(), true)
        }
    };
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let cut = rest
            .match_indices('\n')
            .nth(JOB_LINES - 1)
            .map_or(rest.len(), |(i, _)| i + 1);
        if !send(Ok(rest[..cut].to_string())) {
            return false;
        }
        rest = &rest[cut..];
    }
    !bad || {
        send(Err("stream did not contain valid UTF-8".to_string()));
        false
    }
}

fn work(jobs: &Mutex<mpsc::Receiver<Job>>, parts: &mpsc::Sender<Part>, json: bool) {
    let limits = Limits::default();
    let (written_tx, written_rx) = mpsc::sync_channel::<()>(1);
    loop {
        let job = match jobs.lock() {
            Ok(jobs) => jobs.recv(),
            Err(_) => return,
        };
        let Ok(Job { seq, lines }) = job else { return };
        let mut part = Part {
            seq,
            ..Part::default()
        };
        match lines {
            Err(e) => part.fatal = Some(e),
            Ok(lines) => {
                for line in lines.split_inclusive('\n') {
                    let expr = line.strip_suffix('\n').unwrap_or(line);
                    one(
                        expr.strip_suffix('\r').unwrap_or(expr),
                        json,
                        &limits,
                        &mut part,
                    );
                    if part.out.len() >= PART_BYTES {
                        let next = Part {
                            seq,
                            ..Part::default()
                        };
                        let full = Part {
                            written: Some(written_tx.clone()),
                            ..std::mem::replace(&mut part, next)
                        };
                        if parts.send(full).is_err() || written_rx.recv().is_err() {
                            return;
                        }
                    }
                }
            }
        }
        part.last = true;
        if parts.send(part).is_err() {
            return;
        }
    }
}

/// Writes the parts in order of their jobs; returns whether an expression failed, or the
/// read error that ended the input.
fn write_parts(
    parts: &mpsc::Receiver<Part>,
    permits: &mpsc::SyncSender<()>,
) -> Result<bool, String> {
    // Buffered: a line of input is often a line of output, and a syscall each is slow.
    let mut out = std::io::BufWriter::with_capacity(64 << 10, std::io::stdout().lock());
    let mut waiting: HashMap<u64, VecDeque<Part>> = HashMap::new();
    let mut next = 0;
    let mut failed = false;
    let settle = |written: std::io::Result<()>| {
        if let Err(e) = written {
            crate::out::settle(e); // says a failure once, however often it comes
        }
    };
    loop {
        let Some(part) = waiting.get_mut(&next).and_then(VecDeque::pop_front) else {
            // Nothing to write yet: what is written goes out before waiting.
            let part = match parts.try_recv() {
                Ok(part) => part,
                Err(mpsc::TryRecvError::Empty) => {
                    settle(out.flush());
                    match parts.recv() {
                        Ok(part) => part,
                        Err(_) => break,
                    }
                }
                Err(mpsc::TryRecvError::Disconnected) => break,
            };
            waiting.entry(part.seq).or_default().push_back(part);
            continue;
        };
        if let Some(e) = part.fatal {
            settle(out.flush());
            return Err(e);
        }
        failed |= part.failed;
        settle(part.write_to(&mut out));
        if let Some(written) = &part.written {
            let _ = written.send(());
        }
        if part.last {
            waiting.remove(&next);
            next += 1;
            let _ = permits.send(());
        }
    }
    settle(out.flush());
    Ok(failed)
}
