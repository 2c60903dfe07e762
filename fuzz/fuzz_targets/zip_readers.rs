//! Archive bytes, mutated from ZIP and tar archives the tests make: whatever miniz (the
//! reader under torch.load, built by scripts/miniz-reader.sh into $AIRLOCK_TEST_MINIZ_READER),
//! zipfile or tarfile would hand to the unpickler from an archive the scan calls `safe` must
//! have been scanned exactly as that reader extracts it, and be safe on its own.
#![no_main]

#[path = "../../crates/pickle/tests/readers/mod.rs"]
mod readers;

use std::path::PathBuf;
use std::sync::Mutex;

use airlock_pickle::{scan_file, Options};
use libfuzzer_sys::fuzz_target;
use readers::{check, Reader};

/// The two reader processes, started once and fed one input after another.
static READERS: Mutex<Option<(Reader, Reader)>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let opts = Options::default();
    let report = scan_file(data, &opts);
    let mut readers = READERS.lock().unwrap_or_else(|e| e.into_inner());
    let (miniz, python) = readers.get_or_insert_with(|| {
        let binary = std::env::var_os("AIRLOCK_TEST_MINIZ_READER")
            .map(PathBuf::from)
            .expect("AIRLOCK_TEST_MINIZ_READER names the miniz reader (scripts/fuzz.sh builds it)");
        (Reader::miniz(&binary), Reader::python())
    });
    let mut seen = miniz.read(data);
    seen.extend(python.read(data));
    if let Err(why) = check(&report, &seen, &opts) {
        panic!("{why}");
    }
});
