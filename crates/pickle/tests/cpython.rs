//! Against pickles CPython makes in the same run (tests/corpus.py): every benign one is `safe`
//! and decodes to exactly the data CPython pickled; every malicious one is `unsafe`. And
//! against what CPython's unpickler does with hand-made streams (tests/streams.py).

use std::process::Command;

use airlock_pickle::{decode, scan, Options, Verdict};
use base64::Engine as _;
use serde_json::{json, Value};

/// What Debian's CPython prints running `args`; it must succeed.
fn python(args: &[&str]) -> String {
    let out = Command::new("/usr/bin/python3")
        .args(args)
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn corpus() -> Vec<Value> {
    python(&[concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus.py")])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn bytes_of(case: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(case["pickle"].as_str().unwrap())
        .unwrap()
}

#[test]
fn benign_pickles_of_every_protocol_decode_to_what_cpython_pickled() {
    let opts = Options::default();
    let mut failures = Vec::new();
    let cases: Vec<Value> = corpus()
        .into_iter()
        .filter(|c| c["kind"] == "benign")
        .collect();
    assert!(cases.len() > 400, "the corpus is all there");
    for case in &cases {
        let data = bytes_of(case);
        let report = scan(&data, &opts);
        if report.verdict != Verdict::Safe {
            failures.push(format!("{}: {:?}", case["name"], report.verdict));
            continue;
        }
        match decode(&data, &opts) {
            Ok(v) if same(&v, &case["expected"]) => {}
            Ok(v) => failures.push(format!(
                "{}: decoded {v:.200}, CPython had {:.200}",
                case["name"], case["expected"]
            )),
            Err(e) => failures.push(format!("{}: {e}", case["name"])),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {}:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn every_malicious_pickle_is_unsafe_and_never_decoded() {
    let opts = Options::default();
    let mut failures = Vec::new();
    let cases: Vec<Value> = corpus()
        .into_iter()
        .filter(|c| c["kind"] == "malicious")
        .collect();
    assert!(cases.len() > 60);
    for case in &cases {
        let data = bytes_of(case);
        let report = scan(&data, &opts);
        match &report.verdict {
            Verdict::Unsafe { reasons } if !reasons.is_empty() => {}
            other => failures.push(format!("{}: {other:?}", case["name"])),
        }
        if decode(&data, &opts).is_ok() {
            failures.push(format!("{}: decoded", case["name"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_member_of_an_archive_is_scanned_whatever_its_name_or_its_oddities() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/archives.py");
    let out = python(&[script]);
    let mut failures = Vec::new();
    let mut n = 0;
    for line in out.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let data = base64::engine::general_purpose::STANDARD
            .decode(case["zip"].as_str().unwrap())
            .unwrap();
        let report = airlock_pickle::scan_file(&data, &Options::default());
        n += 1;
        if report.verdict().name() != case["verdict"] {
            failures.push(format!("{}: {:?}", case["name"], report.verdict()));
        }
    }
    assert!(n >= 10);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same JSON, dict keys in the same order; set items in any order (CPython iterates a set
/// in hash order, the decoder gives the order the pickle adds them).
fn same(a: &Value, b: &Value) -> bool {
    serde_json::to_string(&canonical(a)).unwrap() == serde_json::to_string(&canonical(b)).unwrap()
}

fn canonical(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, x) in map {
                let mut x = canonical(x);
                if map.len() == 1 && (k == "$set" || k == "$frozenset") {
                    if let Value::Array(items) = &mut x {
                        items.sort_by_cached_key(|i| serde_json::to_string(i).unwrap());
                    }
                }
                out.insert(k.clone(), x);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// Random hand-made streams, each loaded by CPython's own unpickler (behind a guard that
/// refuses globals outside the default allow-list before they are imported). What CPython
/// loads must be `safe` and decode to the same value, unless an allowed constructor was
/// called with arguments the scanner does not model (then `unsafe`); what it refuses must
/// never be `safe`; a global the guard refused must be `unsafe`. Where another reader may
/// read on differently (bytes after STOP, frames crossed) only `safe` is checked.
/// `AIRLOCK_TEST_PICKLE_SEED` and `AIRLOCK_TEST_PICKLE_CASES` choose other streams.
#[test]
fn hand_made_streams_get_the_verdict_cpython_gives_them() {
    let seed = std::env::var("AIRLOCK_TEST_PICKLE_SEED").unwrap_or_else(|_| "7".into());
    let cases = std::env::var("AIRLOCK_TEST_PICKLE_CASES").unwrap_or_else(|_| "20000".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/streams.py");
    let out = python(&[script, &seed, &cases]);
    let opts = Options::default();
    let mut failures = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for line in out.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let data = bytes_of(&case);
        let report = scan(&data, &opts);
        let outcome = case["outcome"].as_str().unwrap();
        *counts
            .entry(format!("{outcome} -> {}", report.verdict.name()))
            .or_default() += 1;
        let ambiguous = case["ambiguous"] == json!(true);
        let wrong = match (outcome, &report.verdict) {
            // Another reader may read on differently: anything but safe is right.
            (_, Verdict::Unsafe { .. } | Verdict::Malformed { .. }) if ambiguous => None,
            ("ok", Verdict::Safe) => match decode(&data, &opts) {
                Ok(v) if same(&v, &case["expected"]) => None,
                Ok(v) => Some(format!("decoded {v}, CPython loaded {}", case["expected"])),
                Err(e) => Some(format!("not decoded: {e}")),
            },
            ("ok", Verdict::Unsafe { .. }) if !report.calls.is_empty() => None,
            ("ok", v) => Some(format!("CPython loads it, the scan says {v:?}")),
            ("error", Verdict::Safe) => Some(format!(
                "CPython fails ({}), the scan says safe",
                case["error"]
            )),
            // Without a global nothing can be unsafe: what CPython refuses is malformed.
            ("error", Verdict::Unsafe { .. })
                if report.globals.is_empty() && report.calls.is_empty() =>
            {
                Some(format!(
                    "CPython fails ({}), the scan says {:?}",
                    case["error"], report.verdict
                ))
            }
            ("forbidden", Verdict::Unsafe { .. }) => None,
            ("forbidden", v) => Some(format!("names {}, the scan says {v:?}", case["error"])),
            _ => None,
        };
        if let Some(why) = wrong {
            failures.push(format!("{}: {why}", case["pickle"]));
        }
    }
    let total: usize = counts.values().sum();
    eprintln!("CPython's outcome -> the scan's verdict: {counts:?}");
    assert!(total >= 1000, "the streams are all there: {counts:?}");
    // Most streams must be judged for what they are, not merely refused.
    assert!(
        counts.get("ok -> safe").copied().unwrap_or(0) > total / 3,
        "{counts:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {total} ({counts:?}):\n{}",
        failures.len(),
        failures[..failures.len().min(40)].join("\n")
    );
}

/// The Python 2 names CPython maps below protocol 3 are the ones the scanner maps.
#[test]
fn compat_table_matches_cpython() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = python(&[&format!("{root}/scripts/gen-compat.py"), "--stdout"]);
    let committed = include_str!("../src/compat.rs");
    assert!(
        out == committed,
        "src/compat.rs is not what CPython says: rerun scripts/gen-compat.py"
    );
}
