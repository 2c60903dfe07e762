//! `airlock eval`: Python literal expressions evaluated natively, without an
//! interpreter or a sandbox.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use airlock_pyeval::{evaluate, outcome_json, Limits};

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
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut failed = false;
    let mut one = |expr: &str, out: &mut dyn Write| -> std::io::Result<()> {
        let outcome = evaluate(expr, &limits);
        failed |= outcome.is_err();
        if args.json {
            writeln!(out, "{}", outcome_json(&outcome))
        } else {
            match outcome {
                Ok(v) => writeln!(out, "{}", v.str),
                Err(e) => {
                    out.flush()?;
                    eprintln!("{e}");
                    Ok(())
                }
            }
        }
    };
    let written = match &args.expr {
        Some(expr) => one(expr, &mut out),
        None => (|| {
            for line in std::io::stdin().lock().lines() {
                one(&line?, &mut out)?;
            }
            Ok(())
        })(),
    };
    if let Err(e) = written.and_then(|()| out.flush()) {
        eprintln!("airlock eval: {e}");
        return ExitCode::from(crate::EXIT_AIRLOCK);
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
