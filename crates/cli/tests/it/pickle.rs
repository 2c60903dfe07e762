//! `airlock pickle` and `POST /v1/pickle/scan` through the real binary and the real server:
//! verdicts and exit codes, decoded data, and a payload that is never run.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::http::{request, Server, KEY};
use common::*;
use serde_json::Value;

/// Files CPython writes: data, a payload that would create `marker` if it ever ran, a broken
/// stream and an archive holding the payload under an innocent name.
fn files(dir: &Path, marker: &Path) -> [PathBuf; 4] {
    std::fs::create_dir_all(dir).unwrap();
    let script = format!(
        r#"
import os, pickle, zipfile
class Evil:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
d = {dir:?}
open(d + "/data.pkl", "wb").write(pickle.dumps({{"a": [1, 2.5, None], "b": b"\x00"}}, protocol=4))
open(d + "/evil.pkl", "wb").write(pickle.dumps(Evil(), protocol=2))
open(d + "/broken.pkl", "wb").write(b"\x80\x04X\xff\xff\xff\xffabc.")
with zipfile.ZipFile(d + "/model.pt", "w") as z:
    z.writestr("archive/data.pkl", pickle.dumps([1, 2], protocol=2))
    z.writestr("archive/version", pickle.dumps(Evil(), protocol=2))
"#,
        marker = marker.display(),
        dir = dir.display().to_string(),
    );
    let status = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(status.success());
    ["data.pkl", "evil.pkl", "broken.pkl", "model.pt"].map(|f| dir.join(f))
}

fn pickle_cli(args: &[&str]) -> (i32, String, String) {
    let out = airlock().arg("pickle").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn scan_and_decode_give_verdicts_and_data_and_never_run_the_payload() {
    let dir = std::env::temp_dir().join(format!("airlock-pickle-{}", std::process::id()));
    let marker = dir.join("payload-ran");
    let [data, evil, broken, model] = files(&dir, &marker);
    let s = |p: &PathBuf| p.to_str().unwrap().to_owned();

    let (code, out, _) = pickle_cli(&["scan", &s(&data)]);
    assert_eq!((code, out.trim()), (0, &*format!("{}: safe", s(&data))));
    let (code, out, _) = pickle_cli(&["scan", &s(&evil)]);
    assert_eq!(code, 1);
    assert!(
        out.contains("unsafe: global posix.system is not allowed"),
        "{out}"
    );
    let (code, out, _) = pickle_cli(&["scan", &s(&broken)]);
    assert_eq!(code, 3, "malformed: 3, not clap's 2 for bad arguments");
    assert!(out.contains("malformed at offset 2"), "{out}");
    // The worst verdict decides; one JSON object per file.
    let (code, out, _) = pickle_cli(&["scan", "--json", &s(&data), &s(&model)]);
    assert_eq!(code, 1);
    let reports: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reports[0]["verdict"], "safe");
    assert_eq!(reports[1]["kind"], "zip");
    assert_eq!(reports[1]["verdict"], "unsafe");
    assert_eq!(reports[1]["members"][1]["name"], "archive/version");
    let (code, _, err) = pickle_cli(&["scan", "/nonexistent/file.pkl"]);
    assert_eq!(code, 3);
    assert!(err.contains("cannot read"), "{err}");

    let (code, out, _) = pickle_cli(&["decode", &s(&data)]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        serde_json::json!({"a": [1, 2.5, null], "b": {"$bytes": "AA=="}})
    );
    let (code, out, err) = pickle_cli(&["decode", &s(&evil)]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.contains("unsafe"), "{err}");
    assert_eq!(pickle_cli(&["decode", &s(&broken)]).0, 3);
    assert_eq!(pickle_cli(&["decode", &s(&model)]).0, 3);
    // Bad arguments are clap's 2, which no verdict shares.
    assert_eq!(pickle_cli(&["scan", "--no-such-flag", &s(&data)]).0, 2);
    assert_eq!(pickle_cli(&["scan"]).0, 2);

    // More names can be allowed, exactly.
    let date = dir.join("date.pkl");
    std::fs::write(&date, b"\x80\x02cdatetime\ndate\nM\xe8\x07K\x01K\x02\x87R.").unwrap();
    assert_eq!(pickle_cli(&["scan", &s(&date)]).0, 1);
    assert_eq!(
        pickle_cli(&["scan", "--allow", "datetime.date", &s(&date)]).0,
        0
    );
    let (code, out, _) = pickle_cli(&["decode", "--allow", "datetime.date", &s(&date)]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        serde_json::json!({"$call": "datetime.date", "args": [2024, 1, 2]})
    );
    assert_eq!(pickle_cli(&["scan", "--allow", "datetime", &s(&date)]).0, 1);

    // The same files loaded by CPython would have run the payload; nothing here did.
    assert!(!marker.exists(), "the payload ran");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `airlock pickle scan … | head`: a reader gone is no error; every file is still scanned
/// and the status is the one the verdicts give.
#[test]
fn a_closed_stdout_ends_quietly_with_the_usual_status() {
    let dir = std::env::temp_dir().join(format!("airlock-pickle-epipe-{}", std::process::id()));
    let marker = dir.join("payload-ran");
    let [data, evil, broken, _] = files(&dir, &marker);
    // Enough lines that they cannot all sit in a pipe's buffer, the worst verdict last.
    let mut scan = airlock();
    scan.args(["pickle", "scan", "--json"]);
    for _ in 0..2_000 {
        scan.arg(&data);
    }
    scan.arg(&evil);
    let (status, stderr) = with_stdout_gone(scan, None);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stderr, "");

    let mut scan = airlock();
    scan.args(["pickle", "scan"]).arg(&data).arg(&broken);
    assert_eq!(with_stdout_gone(scan, None).0.code(), Some(3));
    let mut decode = airlock();
    decode.args(["pickle", "decode"]).arg(&data);
    let (status, stderr) = with_stdout_gone(decode, None);
    assert_eq!((status.code(), &*stderr), (Some(0), ""));
    assert!(!marker.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_service_scans_a_posted_file() {
    let _g = serial();
    let dir = std::env::temp_dir().join(format!("airlock-pickle-srv-{}", std::process::id()));
    let marker = dir.join("payload-ran");
    let [_, evil, _, model] = files(&dir, &marker);
    let date = dir.join("date.pkl");
    std::fs::write(&date, b"\x80\x02cdatetime\ndate\nM\xe8\x07K\x01K\x02\x87R.").unwrap();
    let server = Server::start(
        "[pool]\nsize = 0\nmax_size = 0\n[pickle]\nallow = [\"datetime.date\"]\nmax_bytes = 4096\n",
        &[],
    );
    let post = |path: &PathBuf, key: Option<&str>| {
        let body = std::fs::read(path).unwrap();
        let mut headers = vec![(
            "Content-Type".to_owned(),
            "application/octet-stream".to_owned(),
        )];
        if let Some(k) = key {
            headers.push(("Authorization".into(), format!("Bearer {k}")));
        }
        request(
            server.addr,
            "POST",
            "/v1/pickle/scan",
            &headers,
            Some(&body),
        )
    };
    let r = post(&evil, Some(KEY));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["kind"].as_str(), v["verdict"].as_str()),
        (Some("pickle"), Some("unsafe"))
    );
    assert_eq!(v["globals"][0]["module"], "posix");
    assert_eq!(v["calls"][0]["opcode"], "REDUCE");
    let v = post(&model, Some(KEY)).json();
    assert_eq!(
        (v["kind"].as_str(), v["verdict"].as_str()),
        (Some("zip"), Some("unsafe"))
    );
    // The configured allow-list applies.
    let v = post(&date, Some(KEY)).json();
    assert_eq!(v["verdict"], "safe", "{v}");
    assert_eq!(post(&evil, None).status, 401);
    // pickle.max_bytes bounds what a scan reads, however small the body.
    let big = dir.join("big.pkl");
    let mut data = b"\x80\x04\x8e".to_vec();
    data.extend_from_slice(&5000u64.to_le_bytes());
    data.extend(std::iter::repeat_n(0u8, 5000));
    data.push(b'.');
    std::fs::write(&big, &data).unwrap();
    let v = post(&big, Some(KEY)).json();
    assert_eq!(v["verdict"], "malformed", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("more than the 4096"),
        "{v}"
    );
    let metrics = server.call("GET", "/metrics", None).text();
    for line in [
        "airlock_pickle_scans_total{verdict=\"unsafe\"} 2",
        "airlock_pickle_scans_total{verdict=\"malformed\"} 1",
        "airlock_pickle_scans_total{verdict=\"safe\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(!marker.exists(), "the payload ran");
    let _ = std::fs::remove_dir_all(&dir);
}
