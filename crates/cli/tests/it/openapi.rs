//! The real server fuzzed from its own `/openapi.json` by schemathesis (its venv comes from
//! `ensure_schemathesis` in scripts/lib.sh): no 5xx, every answer as the document says (status,
//! content type, headers, body schema), requests the document forbids refused, keys enforced;
//! afterwards nothing is left on the host.
//!
//! Not checked: `positive_data_acceptance` (that every request the document allows is
//! accepted). The document cannot say everything the server checks: `inputs` only with an
//! `entrypoint`, the files' total size, and a JSON Schema `integer` includes `1.0`, which a
//! limit refuses.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::http::{Server, KEY};
use common::*;

/// The fuzzing's time budget; the examples and coverage phases run first, whole.
const SECONDS: &str = "40";

#[test]
fn the_api_answers_as_its_openapi_document_says_under_schemathesis() {
    let _g = serial();
    let st =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/schemathesis/bin/schemathesis");
    assert!(
        st.exists(),
        "schemathesis is not installed at {}: run `bash -c '. scripts/lib.sh && \
         ensure_schemathesis'` from the repository (scripts/test.sh does)",
        st.display()
    );
    let before = HostState::now();
    let server = Server::start("", &[]);
    let doc = server.call("GET", "/openapi.json", None);
    assert_eq!(doc.status, 200);
    let schema = server.dir.join("openapi.json");
    std::fs::write(&schema, doc.text()).unwrap();
    let out = Command::new(&st)
        .arg("run")
        .arg(&schema)
        .args(["--url", &format!("http://{}", server.addr)])
        .args(["--header", &format!("Authorization: Bearer {KEY}")])
        .args([
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
        ])
        .args([
            "--max-time",
            SECONDS,
            "--request-timeout",
            "30",
            "--seed",
            "20",
        ])
        .args(["--workers", "2", "--no-color"])
        .current_dir(&server.dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found failures:\n{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("generated"), "{said}");
    // Whatever the fuzzing ran was cleaned up by the server, which exits cleanly.
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"after schemathesis");
}
