//! Any bytes: a verdict, never a panic, a hang or an allocation the input merely claims.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = airlock_pickle::Options {
        max_bytes: 1 << 20,
        ..airlock_pickle::Options::default()
    };
    let report = airlock_pickle::scan_file(data, &opts);
    let decoded = airlock_pickle::decode(data, &opts);
    // Decoding succeeds only for what the scan calls safe.
    if decoded.is_ok() {
        assert_eq!(airlock_pickle::scan(data, &opts).verdict, airlock_pickle::Verdict::Safe);
    }
    let _ = report.to_json();
});
