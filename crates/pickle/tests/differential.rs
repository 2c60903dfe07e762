//! The scan against the readers a victim loads archives with: miniz, the ZIP reader under
//! torch.load (built from its C source for this test), and Python's zipfile and tarfile.
//! Whatever a reader would hand to the unpickler from an archive the scan calls `safe` must
//! have been scanned exactly as that reader extracts it (`readers::check`).
//! `AIRLOCK_TEST_PICKLE_SEED` and `AIRLOCK_TEST_ZIP_CASES` choose other mutated archives.

mod readers;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use airlock_pickle::{scan, scan_file, Options, Verdict};
use base64::Engine as _;
use readers::{check, Extracted, Reader};
use serde_json::Value;

/// The miniz reader, built once per test binary.
fn miniz() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("miniz_read");
        readers::build_miniz(&out);
        out
    })
}

/// Archives a script of the tests writes, one JSON object per line.
fn archives(args: &[&str]) -> Vec<(String, Vec<u8>, Value)> {
    let out = Command::new("/usr/bin/python3")
        .args(args)
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
        .map(|l| {
            let case: Value = serde_json::from_str(l).unwrap();
            let data = base64::engine::general_purpose::STANDARD
                .decode(case["zip"].as_str().unwrap())
                .unwrap();
            (case["name"].as_str().unwrap().to_owned(), data, case)
        })
        .collect()
}

/// Every reader's view of `data`.
fn extract(miniz: &mut Reader, python: &mut Reader, data: &[u8]) -> Vec<Extracted> {
    let mut all = miniz.read(data);
    all.extend(python.read(data));
    all
}

fn tests_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests").to_owned()
}

#[test]
fn every_archive_the_tests_make_is_scanned_as_each_reader_extracts_it() {
    let opts = Options::default();
    let (mut mz, mut py) = (Reader::miniz(miniz()), Reader::python());
    let mut failures = Vec::new();
    let mut extracted = BTreeMap::<String, usize>::new();
    let mut views = BTreeMap::new();
    for (name, data, _) in archives(&[&format!("{}/archives.py", tests_dir())]) {
        let report = scan_file(&data, &opts);
        let seen = extract(&mut mz, &mut py, &data);
        for e in &seen {
            if e.bytes.is_ok() {
                *extracted.entry(e.reader.clone()).or_default() += 1;
            }
        }
        if let Err(why) = check(&report, &seen, &opts) {
            failures.push(format!("{name}: {why}"));
        }
        views.insert(name, (report, seen));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The oracles do read: every reader extracted members, and miniz extracts the whole
    // pickle of the stored member whose two sizes differ, a call zipfile never sees.
    eprintln!("members extracted, by reader: {extracted:?}");
    for reader in ["mem", "iter", "zipfile", "tarfile"] {
        assert!(
            extracted.get(reader).copied().unwrap_or(0) >= 3,
            "{reader}: {extracted:?}"
        );
    }
    let (report, seen) = &views["stored_sizes_differ"];
    assert!(matches!(report.verdict(), Verdict::Malformed { .. }));
    let by_miniz = seen
        .iter()
        .find(|e| e.reader == "mem")
        .and_then(|e| e.bytes.as_ref().ok())
        .expect("miniz extracts the member");
    assert!(matches!(
        scan(by_miniz, &opts).verdict,
        Verdict::Unsafe { .. }
    ));
    assert!(seen
        .iter()
        .any(|e| e.reader == "zipfile" && e.bytes.is_err()));
}

/// Header fields changed at random (`tests/mutations.py`): sizes, methods, times, flags,
/// CRCs, ZIP64 fields, offsets, end records, bytes before the archive, a cut end.
#[test]
fn mutated_headers_never_hide_what_a_reader_extracts() {
    let seed = std::env::var("AIRLOCK_TEST_PICKLE_SEED").unwrap_or_else(|_| "7".into());
    let cases = std::env::var("AIRLOCK_TEST_ZIP_CASES").unwrap_or_else(|_| "3000".into());
    let opts = Options::default();
    let (mut mz, mut py) = (Reader::miniz(miniz()), Reader::python());
    let mut failures = Vec::new();
    let mut counts = BTreeMap::<String, usize>::new();
    for (name, data, _) in archives(&[&format!("{}/mutations.py", tests_dir()), &seed, &cases]) {
        let report = scan_file(&data, &opts);
        let seen = extract(&mut mz, &mut py, &data);
        let read = seen.iter().any(|e| e.bytes.is_ok());
        *counts
            .entry(format!(
                "{} ({})",
                report.verdict().name(),
                if read {
                    "a reader extracts"
                } else {
                    "no reader extracts"
                }
            ))
            .or_default() += 1;
        if let Err(why) = check(&report, &seen, &opts) {
            failures.push(format!(
                "{name}: {why}\n  {}",
                base64::engine::general_purpose::STANDARD.encode(&data)
            ));
        }
    }
    eprintln!("verdicts of mutated archives: {counts:?}");
    let n: usize = counts.values().sum();
    assert!(n >= 1000, "the archives are all there: {counts:?}");
    // The mutations reach archives that readers load and the scan calls safe: the property
    // is tested where it matters, not only where everything is refused.
    assert!(
        counts.get("safe (a reader extracts)").copied().unwrap_or(0) > n / 20,
        "{counts:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {n}:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}
