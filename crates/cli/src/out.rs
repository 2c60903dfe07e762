//! Our stdout. A reader that goes away (`airlock pickle scan … | head`) is no error: what
//! can no longer be written is dropped and the command ends with the status it would have
//! had. Any other failure to write is reported once and ends the command with
//! [`EXIT_AIRLOCK`](crate::EXIT_AIRLOCK).

use std::fmt;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicU8, Ordering};

/// `println!` to our stdout, dropped once its reader is gone.
macro_rules! outln {
    () => {
        $crate::out::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never fails: with stderr gone there is nowhere to say so.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `print!` to our stdout, dropped once its reader is gone.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*))
    };
}

const OPEN: u8 = 0;
const GONE: u8 = 1;
const FAILED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(OPEN);

/// Writes to stdout unless it is gone; `outln!` and `out!` call this.
pub fn write(args: fmt::Arguments) {
    if STATE.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args) {
        settle(e);
    }
}

/// Writes raw bytes to stdout and flushes them (a program's output as it arrives).
pub fn write_bytes(bytes: &[u8]) {
    if STATE.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        settle(e);
    }
}

/// Flushes what is buffered; the command's last step before its status.
pub fn flush() {
    if STATE.load(Ordering::Relaxed) == OPEN {
        if let Err(e) = std::io::stdout().lock().flush() {
            settle(e);
        }
    }
}

/// Records a failed write: a closed pipe quietly, anything else on stderr.
pub fn settle(e: std::io::Error) {
    if e.kind() == ErrorKind::BrokenPipe {
        STATE.store(GONE, Ordering::Relaxed);
    } else if STATE.swap(FAILED, Ordering::Relaxed) != FAILED {
        errln!("airlock: cannot write to stdout: {e}");
    }
}

/// Whether writing failed for another reason than a reader gone.
pub fn failed() -> bool {
    STATE.load(Ordering::Relaxed) == FAILED
}
