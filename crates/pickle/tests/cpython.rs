//! Against pickles CPython makes in the same run (tests/corpus.py): every benign one is `safe`
//! and decodes to exactly the data CPython pickled; every malicious one is `unsafe`.

use std::process::Command;

use airlock_pickle::{decode, scan, Options, Verdict};
use base64::Engine as _;
use serde_json::Value;

fn corpus() -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
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
            Ok(v) if v == case["expected"] => {}
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
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut failures = Vec::new();
    let mut n = 0;
    for line in String::from_utf8(out.stdout).unwrap().lines() {
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
