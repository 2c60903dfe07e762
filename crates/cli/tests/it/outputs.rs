//! Rich outputs: matplotlib figures and `display()` through the real server, headless, with
//! Debian's matplotlib inside the sandbox. The host checks every output it is handed.

use crate::common;

use base64::Engine as _;
use common::http::Server;
use common::*;
use serde_json::{json, Value};

/// Width and height of a PNG, from its IHDR chunk; panics on anything that is not a PNG.
fn png_size(b64: &Value) -> (u32, u32) {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.as_str().expect("PNG data is a string"))
        .expect("PNG data is base64");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn figures_shown_or_left_open_become_pngs_in_order_with_display_outputs() {
    let _g = serial();
    let server = Server::start("", &[]);
    let code = r#"
import matplotlib.pyplot as plt
display("first", {"n": 1})
fig, ax = plt.subplots(figsize=(4, 3), dpi=50)
ax.plot([1, 2, 3], [1, 4, 9])
plt.show()
import pandas as pd
display(pd.DataFrame({"x": [1, 2]}))
class Svg:
    def _repr_svg_(self):
        return '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'
display(Svg(), object.__new__(type("Plain", (), {"__repr__": lambda self: "<plain>"})))
display("<b>bold</b>", mime="text/html")
plt.figure(figsize=(2, 1), dpi=100)
plt.plot([0, 1])
"done"
"#;
    let r = server.execute(json!({"code": code})).json();
    assert_eq!(
        (&r["status"], &r["result"]),
        (&json!("ok"), &json!("done")),
        "{r}"
    );
    assert!(
        !r["stderr"].as_str().unwrap().contains("Warning"),
        "{}",
        r["stderr"]
    );
    let outputs = r["outputs"].as_array().unwrap();
    let kinds: Vec<&str> = outputs
        .iter()
        .map(|o| o["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "text/plain",
            "application/json",
            "image/png",
            "text/html",
            "image/svg+xml",
            "text/plain",
            "text/html",
            "image/png"
        ]
    );
    assert_eq!(outputs[0]["data"], "first");
    assert_eq!(outputs[1]["data"], json!({"n": 1}));
    // Shown with plt.show(): 4 x 3 inches at 50 dpi.
    assert_eq!(png_size(&outputs[2]["data"]), (200, 150));
    assert!(outputs[3]["data"].as_str().unwrap().contains("<table"));
    assert!(outputs[4]["data"].as_str().unwrap().starts_with("<svg"));
    assert_eq!(outputs[5]["data"], "<plain>");
    assert_eq!(outputs[6]["data"], "<b>bold</b>");
    // Left open at the end: 2 x 1 inches at 100 dpi.
    assert_eq!(png_size(&outputs[7]["data"]), (200, 100));
}

#[test]
fn outputs_come_with_an_error_and_are_bounded() {
    let _g = serial();
    let server = Server::start("", &[]);
    // A chart, then an exception: both reach the caller.
    let r = server
        .execute(json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1])\nraise ValueError('after the chart')"}))
        .json();
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["error"]["type"], "ValueError");
    assert_eq!(r["outputs"][0]["type"], "image/png");
    png_size(&r["outputs"][0]["data"]);
    // Outputs may take half of the 1 MiB result limit; the rest is dropped with a note, and
    // the result still arrives.
    let r = server
        .execute(json!({"code": "for i in range(100):\n    display('x' * 20000)\n'still here'"}))
        .json();
    assert_eq!(r["result"], "still here", "{}", r["status"]);
    let outputs = r["outputs"].as_array().unwrap();
    assert!(outputs.len() < 30, "{} outputs", outputs.len());
    let last = outputs.last().unwrap()["data"].as_str().unwrap();
    assert!(last.contains("were dropped"), "{last}");
    // More outputs than the host takes: the first 999 and a note, the result intact.
    let r = server
        .execute(json!({"code": "for i in range(1500):\n    display('')\n'many'"}))
        .json();
    assert_eq!(r["result"], "many", "{}", r["status"]);
    let outputs = r["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1000);
    assert!(outputs[999]["data"]
        .as_str()
        .unwrap()
        .contains("999 outputs were dropped"));
    // Bad display() calls are the code's own errors.
    let r = server
        .execute(json!({"code": "display(b'x', mime='text/javascript')"}))
        .json();
    assert_eq!(r["error"]["type"], "ValueError", "{r}");
    // Nothing but data comes back when nothing is displayed.
    let r = server.execute(json!({"code": "1"})).json();
    assert_eq!(r["outputs"], json!([]));
    // `airlock run` without --json says where they went.
    let r = invoke(&["run"], b"display('x')");
    assert!(
        r.stderr.contains("1 rich output(s) (text/plain)"),
        "{}",
        r.stderr
    );
}

#[test]
fn forged_outputs_are_refused_by_the_host() {
    for forged in [
        r#"{"result": 1, "outputs": [{"type": "text/javascript", "data": "alert(1)"}]}"#,
        r#"{"result": 1, "outputs": [{"type": "image/png", "data": {"not": "text"}}]}"#,
    ] {
        let code = format!("import os\nos.write(3, {forged:?}.encode())\nos._exit(0)");
        let r = run(&code, &[]);
        assert_eq!(r.status(), "error", "{r:#?}");
        assert_eq!(r.json["error"]["type"], "ResultError");
        assert_eq!(r.json["outputs"], json!([]));
    }
}

#[test]
fn files_left_in_outputs_come_back_and_planted_links_do_not() {
    let _g = serial();
    let server = Server::start("", &[]);
    let code = r#"
import os
os.makedirs("outputs/sub/deeper")
open("outputs/report.csv", "w").write("a,b\n1,2\n")
open("outputs/sub/deeper/blob.bin", "wb").write(bytes(range(256)))
os.symlink("/etc/passwd", "outputs/passwd")
os.symlink("/usr", "outputs/usr")
os.mkfifo("outputs/pipe")
open("outputs/big.bin", "wb").write(b"x" * (700 << 10))
"#;
    let r = server.execute(json!({"code": code})).json();
    assert_eq!(r["status"], "ok", "{r}");
    let files = r["files"].as_array().unwrap();
    let by_path = |p: &str| {
        files
            .iter()
            .find(|f| f["path"] == p)
            .unwrap_or_else(|| panic!("{p} missing from {files:?}"))
    };
    let decode = |f: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(f["base64"].as_str().unwrap())
            .unwrap()
    };
    assert_eq!(decode(by_path("report.csv")), b"a,b\n1,2\n");
    let blob = by_path("sub/deeper/blob.bin");
    assert_eq!(
        (decode(blob), blob["size"].as_u64()),
        ((0..=255).collect::<Vec<u8>>(), Some(256))
    );
    // Links are listed, never followed, and a FIFO is never opened (that would block).
    assert_eq!(by_path("passwd")["skipped"], "a symbolic link");
    assert!(by_path("passwd").get("base64").is_none());
    assert_eq!(by_path("usr")["skipped"], "a symbolic link");
    assert_eq!(by_path("pipe")["skipped"], "not a regular file");
    // Over what is left of half the 1 MiB result limit: listed with its size only.
    let big = by_path("big.bin");
    assert_eq!(
        (&big["skipped"], big["size"].as_u64()),
        (&json!("over the size limit"), Some(700 << 10))
    );
    assert_eq!(files.len(), 6, "{files:?}");

    // An outputs directory that is itself a link to elsewhere returns nothing.
    let r = server
        .execute(json!({"code": "import os\nos.symlink('/usr/lib', 'outputs')"}))
        .json();
    assert_eq!(
        (&r["status"], &r["files"]),
        (&json!("ok"), &json!([])),
        "{r}"
    );
    // More than 100 files: the first 100, then one line saying so.
    let r = server
        .execute(json!({"code": "import os\nos.mkdir('outputs')\nfor i in range(150):\n    open(f'outputs/f{i:03}', 'w').write('x')"}))
        .json();
    let files = r["files"].as_array().unwrap();
    assert_eq!(files.len(), 101, "{r}");
    assert_eq!(files[100]["skipped"], "more than 100 files");
}

#[test]
fn display_takes_figures_objects_that_draw_themselves_and_raw_png() {
    let _g = serial();
    let server = Server::start("", &[]);
    let code = r#"
import io
import matplotlib.pyplot as plt
fig = plt.figure(figsize=(1, 1), dpi=30)
display(fig)
plt.close(fig)
buf = io.BytesIO()
plt.figure(figsize=(2, 2), dpi=20).savefig(buf, format="png")
plt.close("all")
png = buf.getvalue()
class Drawn:
    def _repr_png_(self):
        return png
display(Drawn(), png)
display(png, mime="image/png")
"#;
    let r = server.execute(json!({"code": code})).json();
    assert_eq!(r["status"], "ok", "{r}");
    let outputs = r["outputs"].as_array().unwrap();
    let kinds: Vec<&str> = outputs
        .iter()
        .map(|o| o["type"].as_str().unwrap())
        .collect();
    // Raw bytes without a type are data, not an image.
    assert_eq!(
        kinds,
        ["image/png", "image/png", "text/plain", "image/png"],
        "{r}"
    );
    assert_eq!(png_size(&outputs[0]["data"]), (30, 30));
    assert_eq!(png_size(&outputs[1]["data"]), (40, 40));
    assert_eq!(png_size(&outputs[3]["data"]), (40, 40));
}
