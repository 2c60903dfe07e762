//! `airlock eval`: Python literal expressions evaluated natively, without an
//! interpreter or a sandbox.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use airlock_pyeval::{evaluate, write_outcome_json, Limits};

/// Evaluate a Python literal expression natively (no interpreter, no sandbox).
///
/// Prints `str()` of the value, or `ExceptionType: message` on stderr (exit
/// 1). Without EXPR, reads one expression per line from stdin and writes one
/// line per expression; the exit code is 1 if any of them failed.
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
    let limits = Limits::default();
    // Buffered: a line of input is often a line of output, and a syscall each is slow.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut failed = false;
    // Once stdout is gone the expressions are still evaluated, for the exit status.
    let mut one = |expr: &str, out: &mut dyn Write| {
        let outcome = evaluate(expr, &limits);
        failed |= outcome.is_err();
        let written = if args.json {
            write_outcome_json(out, &outcome).and_then(|()| out.write_all(b"\n"))
        } else {
            match outcome {
                Ok(v) => writeln!(out, "{}", v.str),
                Err(e) => out.flush().map(|()| errln!("{e}")),
            }
        };
        if let Err(e) = written {
            crate::out::settle(e); // says a failure once, however often it comes
        }
    };
    match &args.expr {
        Some(expr) => one(expr, &mut out),
        None => {
            // One buffer for every line.
            let mut stdin = std::io::stdin().lock();
            let mut line = String::new();
            loop {
                line.clear();
                match stdin.read_line(&mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        let expr = line.strip_suffix('\n').unwrap_or(&line);
                        one(expr.strip_suffix('\r').unwrap_or(expr), &mut out);
                    }
                    Err(e) => {
                        errln!("airlock eval: {e}");
                        return ExitCode::from(crate::EXIT_AIRLOCK);
                    }
                }
            }
        }
    }
    if let Err(e) = out.flush() {
        crate::out::settle(e);
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
