//! The native evaluator against seed 001's fix (a fresh `/usr/bin/python3` per expression that
//! checks the AST and evaluates `result = <expr>`), on a mixed corpus, in the same run.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{ms, Client, Series, PYTHON};

/// A mix of what agents send: arithmetic, containers, strings, comparisons, errors.
pub const CORPUS: &[&str] = &[
    "1 + 1",
    "2 ** 100 - 1",
    "7 / 3",
    "(3.5 * 2 - 1) / 4",
    "10 // 3 + 10 % 3",
    "-2 ** 0.5",
    "[1, 2, 3] + [4]",
    "(1, 'a', None, True)",
    "{'a': 1, 'b': [2, 3]}['b'][1]",
    "{3, 1, 2} | {4}",
    "'abc' * 3",
    "'hello world'[::-1]",
    "1 < 2 <= 3 != 4",
    "not (1 and 0) or 5",
    "1 if 2 > 3 else 'no'",
    "[x for x in (1, 2)]",
    "1 / 0",
    "{'k': 'v'}['missing']",
    "0.1 + 0.2",
    "(1 + 2j) * (3 - 4j)",
    "b'abc' + b'def'",
    "[[1, 2], [3, 4]][1][0] * 10",
    "123456789 * 987654321",
    "result = 6 * 7",
];

/// Seed 001's wrapper: code on stdin, `ast.parse` in exec mode, an allow-list walk, then exec
/// and the result's str() as JSON.
const SEED_WRAPPER: &str = r#"
import ast, json, sys
ALLOWED = (ast.Module, ast.Assign, ast.Name, ast.Store, ast.Load, ast.Expr, ast.Constant,
           ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.List, ast.Tuple,
           ast.Set, ast.Dict, ast.Subscript, ast.Slice, ast.operator, ast.unaryop, ast.boolop,
           ast.cmpop)
src = sys.stdin.read()
if not src.lstrip().startswith("result"):
    src = "result = " + src
try:
    tree = ast.parse(src, mode="exec")
    for node in ast.walk(tree):
        if not isinstance(node, ALLOWED):
            raise ValueError("unsupported expression")
    ns = {"__builtins__": {}}
    exec(compile(tree, "<text>", "exec"), ns)
    print(json.dumps({"result": str(ns.get("result"))}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"#;

fn seed_once(expr: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut child = Command::new(PYTHON)
        .args(["-c", SEED_WRAPPER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{PYTHON}: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(expr.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let elapsed = t.elapsed();
    if out.stdout.is_empty() {
        return Err(format!("the seed wrapper printed nothing for {expr:?}"));
    }
    Ok(elapsed)
}

/// Median of many calls, one sample per expression and round.
fn native_once(expr: &str, limits: &airlock_pyeval::Limits) -> Duration {
    const CALLS: u32 = 2_000;
    let t = Instant::now();
    for _ in 0..CALLS {
        std::hint::black_box(airlock_pyeval::evaluate(std::hint::black_box(expr), limits).is_ok());
    }
    t.elapsed() / CALLS
}

pub struct EvalReport {
    pub native: Series,
    pub http: Series,
    pub seed: Series,
    /// `airlock eval --json` over a batch on stdin: time per expression, one sample a batch.
    pub batch: Series,
    /// The same batches' CPU time (all the process's threads) per expression.
    pub batch_cpu: Series,
}

/// Expressions per `airlock eval --json` batch.
const BATCH: usize = 100_000;

/// CPU time (user and system) of the children waited for so far.
fn children_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(Duration::ZERO, |u| {
        let (user, system) = (u.user_time(), u.system_time());
        let micros =
            |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
        Duration::from_micros(micros(user) + micros(system))
    })
}

/// One `airlock eval --json` over `BATCH` expressions of the corpus on stdin, per expression
/// (the process's own start included, spread over the batch): the wall time, and the CPU time
/// of all its threads.
fn batch_once(airlock: &std::path::Path) -> Result<(Duration, Duration), String> {
    let input: String = CORPUS
        .iter()
        .cycle()
        .take(BATCH)
        .flat_map(|e| [*e, "\n"])
        .collect();
    let cpu = children_cpu();
    let t = Instant::now();
    let mut child = Command::new(airlock)
        .args(["eval", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", airlock.display()))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let elapsed = t.elapsed();
    let cpu = children_cpu().saturating_sub(cpu);
    let _ = writer.join();
    let lines = out.stdout.iter().filter(|b| **b == b'\n').count();
    if lines != BATCH {
        return Err(format!(
            "airlock eval --json answered {lines} of {BATCH} lines"
        ));
    }
    Ok((elapsed / BATCH as u32, cpu / BATCH as u32))
}

/// Interleaves, round by round and expression by expression: the native call, `POST /v1/eval`
/// on a kept-alive connection, and the seed's subprocess.
pub fn measure(
    rounds: usize,
    client: &mut Client,
    airlock: &std::path::Path,
) -> Result<EvalReport, String> {
    let limits = airlock_pyeval::Limits::default();
    let mut batch = Series::new("`airlock eval --json`, a batch on stdin, per expression");
    let mut batch_cpu = Series::new("the same batch, CPU time of all its threads per expression");
    let mut native = Series::new("native `evaluate()`, in process");
    let mut http = Series::new("`POST /v1/eval`, kept-alive connection");
    let mut seed = Series::new("seed 001: fresh `python3` + AST check per expression");
    eprintln!(
        "airlock-bench: eval, {rounds} rounds of {} expressions",
        CORPUS.len()
    );
    for _ in 0..rounds {
        for expr in CORPUS {
            native.samples.push(native_once(expr, &limits));
            let t = Instant::now();
            post_eval(client, expr)?;
            http.samples.push(t.elapsed());
            seed.samples.push(seed_once(expr)?);
        }
        let (wall, cpu) = batch_once(airlock)?;
        batch.samples.push(wall);
        batch_cpu.samples.push(cpu);
    }
    Ok(EvalReport {
        native,
        http,
        seed,
        batch,
        batch_cpu,
    })
}

fn post_eval(client: &mut Client, expr: &str) -> Result<(), String> {
    let body = serde_json::json!({ "expression": expr }).to_string();
    let head = format!(
        "POST /v1/eval HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        crate::KEY,
        body.len()
    );
    match client.call(head.as_bytes(), body.as_bytes())? {
        (200, _) => Ok(()),
        (status, text) => Err(format!(
            "/v1/eval: {status} {}",
            String::from_utf8_lossy(&text)
        )),
    }
}

fn us(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}

pub fn print(report: &EvalReport) {
    let base = report.seed.quantile(0.5).as_secs_f64();
    println!(
        "\n## Native evaluation of literal expressions ({} expressions, mixed)\n",
        CORPUS.len()
    );
    println!("| series | p50 µs | p99 µs | seed 001 p50 ÷ p50 |");
    println!("|---|---:|---:|---:|");
    for s in [
        &report.native,
        &report.batch,
        &report.batch_cpu,
        &report.http,
        &report.seed,
    ] {
        println!(
            "| {} | {} | {} | {:.0}× |",
            s.name,
            us(s.quantile(0.5)),
            us(s.quantile(0.99)),
            base / s.quantile(0.5).as_secs_f64()
        );
    }
    println!(
        "\nseed 001 p50 = {} ms; native p50 = {} µs.",
        ms(report.seed.quantile(0.5)),
        us(report.native.quantile(0.5))
    );
}
