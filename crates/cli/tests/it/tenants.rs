//! Between executions: nothing persists from one to the next, and two at once share nothing.
//! THREAT-MODEL: persistence between runs (planted sitecustomize.py/.pth), between tenants.

use crate::common;

use std::io::Write;

use common::*;
use serde_json::json;

const PLANT: &str = r#"
import os, ctypes
libc = ctypes.CDLL(None, use_errno=True)
for path in ["/tmp/planted", "/work/sitecustomize.py", "/work/usercustomize.py", "/tmp/evil.pth",
             "/dev/shm/planted", "/work/json.py"]:
    with open(path, "w") as f:
        f.write("import os\nos.system('touch /tmp/pwned')\n")
assert libc.shmget(0x41524c4b, 4096, 0o1666) >= 0
assert libc.semget(0x41524c4b, 1, 0o1666) >= 0
assert libc.msgget(0x41524c4b, 0o1666) >= 0
print("planted")
"#;

const LOOK: &str = r#"
import os, ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
found = [p for p in ["/tmp/planted", "/work/sitecustomize.py", "/work/usercustomize.py",
                     "/tmp/evil.pth", "/dev/shm/planted", "/work/json.py", "/tmp/pwned"]
         if os.path.exists(p)]
ipc = [libc.shmget(0x41524c4b, 0, 0), libc.semget(0x41524c4b, 0, 0), libc.msgget(0x41524c4b, 0)]
print(json.dumps({"found": found, "ipc": ipc, "listing": sorted(os.listdir("/tmp") + os.listdir("/work")),
                  "site": "sitecustomize" in sys.modules or "usercustomize" in sys.modules}))
"#;

#[test]
fn nothing_of_one_execution_is_visible_to_the_next() {
    let r = run(PLANT, &[]);
    assert_eq!((r.status(), r.stdout_text()), ("ok", "planted\n"), "{r:#?}");
    let seen = probe(LOOK);
    assert_eq!(
        seen,
        json!({"found": [], "ipc": [-1, -1, -1], "listing": [], "site": false})
    );
}

#[test]
fn two_executions_at_once_share_no_file_ipc_socket_or_signal() {
    let _guard = serial();
    let before = HostState::now();
    // A plants everything it can, listens on an abstract socket, then waits for a line on
    // its stdin (the test's go-ahead) and reports whether it is still whole.
    let tenant_a = format!(
        "{PLANT}\nimport socket, sys\n\
         s = socket.socket(socket.AF_UNIX)\ns.bind('\\0airlock-tenant')\ns.listen(1)\n\
         print('ready', flush=True)\nsys.stdin.readline()\n\
         s.setblocking(False)\n\
         try:\n    s.accept()\n    print('contacted')\nexcept BlockingIOError:\n    print('alone')\n"
    );
    let script = std::env::temp_dir().join(format!("airlock-tenant-a-{}.py", std::process::id()));
    std::fs::write(&script, tenant_a).unwrap();
    let mut a = start(&["run", "--stdin", "-", script.to_str().unwrap()], None);
    assert_eq!(a.line(), "planted");
    assert_eq!(a.line(), "ready");

    // B, while A runs: sees none of A's files or IPC objects, cannot reach its socket, and its
    // kill(-1, SIGKILL) reaches only itself and its own children.
    let b = format!(
        "{LOOK}\nimport socket, signal\ns = socket.socket(socket.AF_UNIX)\n\
         try:\n    s.connect('\\0airlock-tenant')\n    print('reached A')\nexcept OSError as e:\n    print('refused', e.errno)\n\
         print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n\
         print('inotify', libc.inotify_init1(0), ctypes.get_errno())\n\
         try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError as e:\n    print('kill -1:', e.errno)\n"
    );
    let rb = invoke(&["run", "--json"], b.as_bytes());
    assert_eq!(rb.status(), "ok", "{rb:#?}");
    let lines: Vec<&str> = rb.stdout_text().lines().collect();
    let seen: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(
        seen,
        json!({"found": [], "ipc": [-1, -1, -1], "listing": [], "site": false})
    );
    assert_eq!(lines[1], "refused 111", "B reached A's abstract socket");
    assert_eq!(lines[2], "['1', '2']", "B sees processes beyond its own");
    assert_eq!(lines[3], "inotify -1 38", "B could watch the files A opens");
    assert_eq!(lines[4], "kill -1: 3", "kill(-1) found someone to kill");

    a.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(a.line(), "alone");
    let status = a.child.wait().unwrap();
    assert!(status.success(), "A did not survive B: {status:?}");
    std::fs::remove_file(&script).unwrap();
    HostState::now().assert_same_as(&before, &status);
}
