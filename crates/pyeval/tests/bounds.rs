//! Bad input gets a clear error, never a hang, a crash or a stack overflow.

use std::time::Duration;

use airlock_pyeval::{evaluate, Error, ErrorKind, Limits};

/// Default limits with a slow clock: these tests are about the other budgets
/// (debug builds are slow).
fn limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(30),
        ..Limits::default()
    }
}

fn refused(expr: &str, limits: &Limits) -> Error {
    match evaluate(expr, limits) {
        Ok(v) => panic!("{expr:.60} evaluated to {:.60}", v.repr),
        Err(e) => e,
    }
}

#[test]
fn huge_results_are_refused_by_the_budgets() {
    let limits = limits();
    for expr in [
        "9**9**9",
        "10**10**6",
        "2**(2**40)",
        "'a' * 10**10",
        "[0] * 10**9",
        "b'x' * 10**9",
        "(1,) * 10**9",
        "1 << 10**10",
        "1 << 10**100",
        "[[0] * 10**4] * 10**4 + [1]",
        "10**1000 * 10**100000",
        // 207 744 bits: the width of a power is bounded before it is computed.
        "3**131072 % 7",
    ] {
        let e = refused(expr, &limits);
        assert_eq!(e.kind, ErrorKind::MemoryError, "{expr:.60}: {e}");
        assert!(
            e.limit,
            "{expr:.60} is refused by a budget, not by Python: {e}"
        );
    }
}

#[test]
fn powers_just_inside_the_int_budget_are_computed() {
    let v = evaluate("3**82000 % 1000", &limits()).unwrap();
    assert_eq!(
        v.repr, "1",
        "3**82000 is 129 967 bits wide; 3**82000 % 1000 == 1"
    );
}

#[test]
fn a_repr_longer_than_the_result_limit_is_refused() {
    let e = refused("'a' * 2_000_000", &limits());
    assert_eq!(e.kind, ErrorKind::MemoryError);
    assert!(e.message.contains("result too large"), "{e}");
    // Shared structure is small in memory and huge in print.
    let e = refused("[[[0] * 1000] * 1000] * 1000", &limits());
    assert!(e.message.contains("result too large"), "{e}");
}

#[test]
fn long_computations_stop_at_the_deadline() {
    let limits = Limits {
        timeout: Duration::from_millis(50),
        ..Limits::default()
    };
    // Four levels of shared lists: 100 million element comparisons.
    let e = refused(
        "[[[[0] * 100] * 100] * 100] * 100 == [[[[0] * 100] * 100] * 100] * 100",
        &limits,
    );
    assert_eq!(e.kind, ErrorKind::TimeoutError, "{e}");
    assert!(e.limit);
    let e = refused(
        "[[[[0] * 100] * 100] * 100] * 100 < [[[[0] * 100] * 100] * 100] * 100",
        &limits,
    );
    assert_eq!(e.kind, ErrorKind::TimeoutError, "{e}");
    let e = refused(
        "([[[[0] * 100] * 100] * 100] * 100) in [[[[[0] * 100] * 100] * 100] * 100]",
        &limits,
    );
    assert_eq!(e.kind, ErrorKind::TimeoutError, "{e}");
}

#[test]
fn searches_take_linear_time_whatever_the_pattern() {
    // A naive search would compare 4 001 bytes at each of 8 million places.
    for expr in [
        "b'a' * 4000 + b'b' in b'a' * 8_000_000",
        "'a' * 4000 + 'b' in 'a' * 8_000_000",
    ] {
        let v = evaluate(expr, &limits()).expect(expr);
        assert_eq!(v.repr, "False", "{expr}");
    }
}

#[test]
fn the_input_length_is_capped() {
    let limits = Limits::default();
    let long = format!("1{}", " + 1".repeat(2_500));
    let e = refused(&long, &limits);
    assert_eq!(e.kind, ErrorKind::NotAllowedError);
    assert!(e.limit && e.message.contains("too long"), "{e}");
    // The configured length cannot exceed the hard ceiling.
    let e = refused(
        &"1".repeat(Limits::MAX_INPUT + 1),
        &Limits {
            max_input_bytes: usize::MAX,
            ..limits
        },
    );
    assert!(e.message.contains("too long"), "{e}");
}

/// Runs on a thread with a small stack: deep input must still not overflow.
fn on_small_stack(exprs: Vec<String>, limits: Limits) -> Vec<Result<String, Error>> {
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            exprs
                .iter()
                .map(|e| {
                    // What `airlock eval --json` writes takes the same care.
                    let (ok, _) = airlock_pyeval::evaluate_json(e, &limits, &mut std::io::sink());
                    let outcome = evaluate(e, &limits).map(|v| v.repr);
                    assert_eq!(ok, outcome.is_ok(), "{e:.40}");
                    outcome
                })
                .collect()
        })
        .expect("spawn")
        .join()
        .expect("no stack overflow")
}

#[test]
fn deep_nesting_never_overflows_the_stack() {
    // This is about the stack, not the clock.
    let limits = Limits {
        max_input_bytes: Limits::MAX_INPUT,
        timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let n = 60_000;
    let exprs = vec![
        format!("{}1{}", "(".repeat(200), ")".repeat(200)),
        format!("{}1{}", "[".repeat(200), "]".repeat(200)),
        format!("{}1{}", "(".repeat(201), ")".repeat(201)),
        format!("{}1", "-".repeat(n)),
        format!("{}1", "~".repeat(n)),
        format!("{}1", "not ".repeat(n / 4)),
        format!("1{}", "+1".repeat(n / 2)),
        format!("1{}", " if 1 else 1".repeat(n / 12)),
        format!("[1]{}", "[0]".repeat(n / 3)),
        format!("{}1", "2**".repeat(n / 3)),
        format!("1{}", " < 1".repeat(n / 4)),
        format!("x{}", ".a".repeat(n / 2)),
        format!("{}0", "lambda: ".repeat(n / 8)),
        format!("{}1{}", "f(".repeat(n / 4), ")".repeat(n / 4)),
    ];
    let results = on_small_stack(exprs, limits);
    assert_eq!(results[0].as_deref(), Ok("1"));
    assert_eq!(
        results[1].as_deref(),
        Ok(&*format!("{}1{}", "[".repeat(200), "]".repeat(200)))
    );
    let e = results[2].clone().unwrap_err();
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::SyntaxError, "too many nested parentheses")
    );
    assert_eq!(results[3].as_deref(), Ok("1"));
    assert_eq!(results[4].as_deref(), Ok("1"));
    assert_eq!(results[5].as_deref(), Ok("True"));
    assert_eq!(results[6].as_deref(), Ok(&*(n / 2 + 1).to_string()));
    assert_eq!(results[7].as_deref(), Ok("1"));
    assert_eq!(results[8].as_ref().unwrap_err().kind, ErrorKind::TypeError);
    assert_eq!(
        results[9].as_ref().unwrap_err().kind,
        ErrorKind::MemoryError
    );
    assert_eq!(results[10].as_deref(), Ok("False"));
    for r in &results[11..13] {
        assert_eq!(
            r.as_ref().unwrap_err().kind,
            ErrorKind::NotAllowedError,
            "{r:?}"
        );
    }
    assert_eq!(
        results[13].as_ref().unwrap_err().kind,
        ErrorKind::SyntaxError
    );
}

#[test]
fn refused_syntax_is_named_before_anything_runs() {
    let limits = Limits::default();
    for (expr, what) in [
        ("x + 1", "names are not allowed"),
        ("[1/0, __import__('os')]", "calls are not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("print(1)", "calls are not allowed"),
        ("(lambda: 1)", "lambda is not allowed"),
        ("[i for i in ()]", "comprehensions are not allowed"),
        ("{i: 1 for i in ()}", "comprehensions are not allowed"),
        ("f'{1}'", "f-strings are not allowed"),
        ("(y := 1)", "assignment expressions (:=) are not allowed"),
        ("1 is 1", "identity comparison (`is`) is not allowed"),
        ("[*()]", "starred expressions are not allowed"),
        ("{**{}}", "dict unpacking (**) is not allowed"),
        ("1 if x else 2", "names are not allowed"),
        ("'%d' % 1", "printf-style formatting"),
        ("'\\ud800'", "lone surrogates"),
        ("'ok' '\\U0000dfff'", "lone surrogates"),
    ] {
        let e = refused(expr, &limits);
        assert_eq!(e.kind, ErrorKind::NotAllowedError, "{expr}: {e}");
        assert!(e.message.contains(what), "{expr}: {e}");
    }
    // 1/0 would raise first if anything ran before the check.
    let e = refused("[1/0, x]", &limits);
    assert_eq!(e.kind, ErrorKind::NotAllowedError);
}

#[test]
fn both_accepted_forms_and_errors_read_like_python() {
    let limits = Limits::default();
    assert_eq!(evaluate("result = 6 * 7", &limits).unwrap().str, "42");
    assert_eq!(evaluate("  result=6*7  ", &limits).unwrap().str, "42");
    assert_eq!(
        evaluate("result == 1", &limits).unwrap_err().kind,
        ErrorKind::NotAllowedError
    );
    assert_eq!(
        evaluate("1 +", &limits).unwrap_err().kind,
        ErrorKind::SyntaxError
    );
    assert_eq!(
        evaluate("1; 2", &limits).unwrap_err().kind,
        ErrorKind::SyntaxError
    );
    assert_eq!(
        evaluate("import os", &limits).unwrap_err().kind,
        ErrorKind::SyntaxError
    );
    assert_eq!(
        evaluate("{'a': 1}['b']", &limits).unwrap_err().to_string(),
        "KeyError: 'b'"
    );
    let v = evaluate("'it''s'", &limits).unwrap();
    assert_eq!(
        (v.type_name, v.repr.as_str(), v.str.as_str()),
        ("str", "'its'", "its")
    );
}
