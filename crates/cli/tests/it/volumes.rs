//! Volumes (issue 48): named directories owned by a key, bounded in bytes and entries while
//! they are written, mounted by executions and sessions (one writer at a time), reached by
//! file routes without a sandbox, never through a link, audited, and kept across restarts.

use crate::common;

use common::http::{call_as, request, Server, KEY};
use common::*;
use serde_json::{json, Value};

const OTHER_KEY: &str = "other-key-for-volumes-0123456789";

fn other_key_toml(extra: &str) -> String {
    format!(
        "[[keys]]\nname = \"other\"\nhash = \"{}\"\n{extra}\n",
        key_hash(OTHER_KEY)
    )
}

fn create(server: &Server, name: &str, size_bytes: u64) -> common::http::Response {
    server.call(
        "POST",
        "/v1/volumes",
        Some(&json!({"name": name, "size_bytes": size_bytes})),
    )
}

fn put(server: &Server, volume: &str, path: &str, data: &[u8]) -> common::http::Response {
    request(
        server.addr,
        "PUT",
        &format!("/v1/volumes/{volume}/files/{path}"),
        &[("Authorization".into(), format!("Bearer {KEY}"))],
        Some(data),
    )
}

fn mounting(code: &str, volumes: Value) -> Value {
    json!({"code": code, "volumes": volumes})
}

fn audit_events(server: &Server, event: &str) -> Vec<Value> {
    std::fs::read_to_string(server.state_dir().join("audit.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

const MIB: u64 = 1 << 20;

#[test]
fn a_volume_is_written_by_routes_and_sandboxes_alike_and_is_its_key_s_alone() {
    let _g = serial();
    let server = Server::start(&other_key_toml(""), &[]);
    let made = create(&server, "data", 32 * MIB);
    assert_eq!(made.status, 201, "{}", made.text());
    assert_eq!(made.json()["size_bytes"], 32 * MIB);
    assert_eq!(create(&server, "data", 32 * MIB).status, 409);
    let bad = create(&server, "../x", 32 * MIB);
    assert_eq!(
        (bad.status, bad.json()["error"]["field"].clone()),
        (400, json!("name"))
    );
    let small = create(&server, "small", MIB);
    assert_eq!(
        (small.status, small.json()["error"]["field"].clone()),
        (400, json!("size_bytes"))
    );

    assert_eq!(
        put(&server, "data", "in/greeting.txt", b"hello").status,
        204
    );
    let code = "import os\n\
                got = open('/work/data/in/greeting.txt').read()\n\
                open('/work/data/out.txt', 'w').write('from the sandbox')\n\
                os.makedirs('/work/data/deep/er')\n\
                [got, os.stat('/work/data/out.txt').st_uid, os.stat('/work/data/in').st_uid]";
    let r = server.execute(mounting(
        code,
        json!([{"name": "data", "path": "/work/data"}]),
    ));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["result"],
        json!(["hello", 1000, 1000]),
        "{}",
        r.text()
    );
    let got = server.call("GET", "/v1/volumes/data/files/out.txt", None);
    assert_eq!((got.status, got.text()), (200, "from the sandbox".into()));
    let listed = server.call("GET", "/v1/volumes/data/files", None).json();
    let paths: Vec<&str> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["deep", "deep/er", "in", "in/greeting.txt", "out.txt"]
    );
    let shown = server.call("GET", "/v1/volumes/data", None).json();
    assert_eq!(shown["used_entries"], 5, "{shown}");
    assert_eq!(
        server.call("GET", "/v1/volumes", None).json()["volumes"][0]["name"],
        "data"
    );

    // Another key sees none of it, and cannot mount it.
    for path in ["/v1/volumes/data", "/v1/volumes/data/files/out.txt"] {
        assert_eq!(
            call_as(server.addr, OTHER_KEY, "GET", path, None).status,
            404
        );
    }
    assert_eq!(
        call_as(server.addr, OTHER_KEY, "GET", "/v1/volumes", None).json()["volumes"],
        json!([])
    );
    let theirs = call_as(
        server.addr,
        OTHER_KEY,
        "POST",
        "/v1/execute",
        Some(&mounting(
            "1",
            json!([{"name": "data", "path": "/work/data"}]),
        )),
    );
    assert_eq!(
        (theirs.status, theirs.json()["error"]["field"].clone()),
        (404, json!("volumes[0].name")),
        "{}",
        theirs.text()
    );

    // A session holds it writable: a second writer gets 409 naming the session; readers
    // see what the session wrote; it cannot be deleted meanwhile.
    let session = server.call(
        "POST",
        "/v1/sessions",
        Some(&json!({"volumes": [{"name": "data", "path": "/work/data"}]})),
    );
    assert_eq!(session.status, 201, "{}", session.text());
    let sid = session.json()["id"].as_str().unwrap().to_owned();
    let cell = server.call(
        "POST",
        &format!("/v1/sessions/{sid}/execute"),
        Some(&json!({"code": "open('/work/data/session.txt', 'w').write('kept')\n'ok'"})),
    );
    assert_eq!(cell.json()["result"], "ok", "{}", cell.text());
    let second = server.execute(mounting(
        "1",
        json!([{"name": "data", "path": "/work/data"}]),
    ));
    assert_eq!(
        (second.status, second.error_code()),
        (409, "volume_busy".into())
    );
    assert!(second.text().contains(&sid), "{}", second.text());
    assert_eq!(put(&server, "data", "x", b"x").status, 409);
    let reader = server.execute(mounting(
        "import os\nopen('/work/v/session.txt').read()",
        json!([{"name": "data", "path": "/work/v", "read_only": true}]),
    ));
    assert_eq!(reader.json()["result"], "kept", "{}", reader.text());
    let deleting = server.call("DELETE", "/v1/volumes/data", None);
    assert_eq!(
        (deleting.status, deleting.error_code()),
        (409, "volume_in_use".into())
    );
    assert!(deleting.text().contains(&sid), "{}", deleting.text());
    assert_eq!(
        server
            .call("DELETE", &format!("/v1/sessions/{sid}"), None)
            .status,
        204
    );
    assert_eq!(put(&server, "data", "x", b"x").status, 204);
    assert_eq!(server.call("DELETE", "/v1/volumes/data", None).status, 204);
    assert_eq!(server.call("GET", "/v1/volumes/data", None).status, 404);
    // Nothing of it is left but its owner's lock file.
    assert!(std::fs::read_dir(server.state_dir().join("volumes"))
        .unwrap()
        .flatten()
        .all(|owner| std::fs::read_dir(owner.path())
            .unwrap()
            .flatten()
            .all(|f| f.file_name() == ".lock")));

    // Each of it audited.
    assert_eq!(audit_events(&server, "volume_created").len(), 1);
    assert_eq!(audit_events(&server, "volume_deleted").len(), 1);
    let mounted = audit_events(&server, "volume_mounted");
    assert_eq!(mounted.len(), 3, "{mounted:?}");
    assert!(mounted
        .iter()
        .any(|m| m["holder"] == format!("session {sid}") && m["read_only"] == false));
    assert_eq!(audit_events(&server, "volume_file_written").len(), 2);
}

#[test]
fn a_volume_is_bounded_while_written_and_never_followed_through_a_link() {
    let _g = serial();
    let server = Server::start(
        "[volumes]\nmax_bytes_per_key = 33554432\nmax_volumes_per_key = 3\n",
        &[],
    );
    assert_eq!(
        server
            .call(
                "POST",
                "/v1/volumes",
                Some(&json!({"name": "v", "size_bytes": 8 * MIB, "max_entries": 64}))
            )
            .status,
        201
    );
    // Bytes and entries, refused while written.
    let code = "import errno\n\
                out = {}\n\
                try:\n    open('/work/v/big', 'wb').write(b'0' * (12 << 20))\n\
                except OSError as e:\n    out['big'] = errno.errorcode[e.errno]\n\
                import os\nos.remove('/work/v/big')\n\
                n = 0\n\
                try:\n    \
                    while n < 1000:\n        open(f'/work/v/f{n}', 'w').close(); n += 1\n\
                except OSError as e:\n    out['files'] = [n, errno.errorcode[e.errno]]\n\
                for i in range(n): os.remove(f'/work/v/f{i}')\n\
                out";
    let r = server.execute(mounting(code, json!([{"name": "v", "path": "/work/v"}])));
    let result = r.json()["result"].clone();
    assert_eq!(result["big"], "ENOSPC", "{}", r.text());
    let files = result["files"][0].as_u64().unwrap();
    assert!((16..64).contains(&files), "{result}");
    assert_eq!(result["files"][1], "ENOSPC");
    // An upload that does not fit leaves nothing behind.
    let big = put(&server, "v", "big", &vec![7u8; (12 * MIB) as usize]);
    assert_eq!((big.status, big.error_code()), (413, "volume_full".into()));
    assert_eq!(
        server.call("GET", "/v1/volumes/v/files", None).json()["files"],
        json!([])
    );

    // The key's quota: 32 MiB and three volumes.
    assert_eq!(create(&server, "w", 16 * MIB).status, 201);
    let over = create(&server, "x", 16 * MIB);
    assert_eq!(
        (over.status, over.error_code()),
        (413, "quota_exceeded".into())
    );
    assert_eq!(create(&server, "x", 8 * MIB).status, 201);
    let many = create(&server, "y", 8 * MIB);
    assert_eq!(
        (many.status, many.error_code()),
        (413, "quota_exceeded".into())
    );

    // Links planted by code are listed, never followed: not by a download, an upload, a
    // removal or a listing.
    let plant = "import os\n\
                 os.symlink('/etc/passwd', '/work/v/passwd')\n\
                 os.symlink('/', '/work/v/root')\n\
                 os.mkdir('/work/v/d')\n\
                 os.symlink('../..', '/work/v/d/up')\n\
                 os.mkfifo('/work/v/fifo')\n\
                 'planted'";
    let r = server.execute(mounting(plant, json!([{"name": "v", "path": "/work/v"}])));
    assert_eq!(r.json()["result"], "planted", "{}", r.text());
    for path in ["passwd", "root/etc/passwd", "d/up/etc/passwd", "fifo"] {
        let got = server.call("GET", &format!("/v1/volumes/v/files/{path}"), None);
        assert_eq!(got.status, 400, "{path}: {}", got.text());
        assert!(!got.text().contains("root:x:0:0"), "{path}");
    }
    for path in ["root/tmp/planted-by-a-volume", "d/up/x", "passwd"] {
        let r = put(&server, "v", path, b"x");
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    assert!(!std::path::Path::new("/tmp/planted-by-a-volume").exists());
    assert_ne!(std::fs::read("/etc/passwd").unwrap(), b"x");
    let listed = server.call("GET", "/v1/volumes/v/files", None).json();
    let kinds: Vec<(String, String)> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let pair = |p: &str, k: &str| (p.to_owned(), k.to_owned());
    assert_eq!(
        kinds,
        [
            pair("d", "dir"),
            pair("d/up", "link"),
            pair("fifo", "other"),
            pair("passwd", "link"),
            pair("root", "link")
        ]
    );
    // Removing a link removes the link.
    assert_eq!(
        server
            .call("DELETE", "/v1/volumes/v/files/root", None)
            .status,
        204
    );
    assert!(std::path::Path::new("/etc/passwd").exists());
    // Mounted in another sandbox, a link leads within that sandbox's own view (`d/up` is
    // `/tmp`, where the volume is `m`).
    let r = server.execute(mounting(
        "import os\n[os.readlink('/tmp/m/passwd'), \
         open('/tmp/m/passwd').read() == open('/etc/passwd').read(), os.listdir('/tmp/m/d/up')]",
        json!([{"name": "v", "path": "/tmp/m", "read_only": true}]),
    ));
    assert_eq!(
        r.json()["result"],
        json!(["/etc/passwd", true, ["m"]]),
        "{}",
        r.text()
    );

    // Read-only means read-only; paths are checked.
    let r = server.execute(mounting(
        "import errno\ntry:\n    open('/work/v/new', 'w')\n    r = 'wrote'\n\
         except OSError as e:\n    r = errno.errorcode[e.errno]\nr",
        json!([{"name": "v", "path": "/work/v", "read_only": true}]),
    ));
    assert_eq!(r.json()["result"], "EROFS", "{}", r.text());
    for (volumes, field) in [
        (json!([{"name": "v", "path": "/usr/v"}]), "volumes[0].path"),
        (json!([{"name": "v", "path": "/work"}]), "volumes[0].path"),
        (
            json!([{"name": "v", "path": "/work/a/../b"}]),
            "volumes[0].path",
        ),
        (
            json!([{"name": "v", "path": "/work/a"}, {"name": "w", "path": "/work/a/b"}]),
            "volumes[1].path",
        ),
        (
            json!([{"name": "v", "path": "/work/a"}, {"name": "v", "path": "/work/b"}]),
            "volumes[1].name",
        ),
    ] {
        let r = server.execute(mounting("1", volumes.clone()));
        assert_eq!(
            (r.status, r.json()["error"]["field"].clone()),
            (400, json!(field)),
            "{volumes}: {}",
            r.text()
        );
    }
}

#[test]
fn volumes_outlive_a_server_killed_while_a_session_writes_them() {
    let _g = serial();
    let server = Server::start("", &[]);
    assert_eq!(create(&server, "kept", 16 * MIB).status, 201);
    let r = server.execute(mounting(
        "open('/work/k/a.txt', 'w').write('written before')",
        json!([{"name": "kept", "path": "/work/k"}]),
    ));
    assert_eq!(r.status, 200, "{}", r.text());
    let session = server.call(
        "POST",
        "/v1/sessions",
        Some(&json!({"volumes": [{"name": "kept", "path": "/work/k"}]})),
    );
    let sid = session.json()["id"].as_str().unwrap().to_owned();
    let cell = server.call(
        "POST",
        &format!("/v1/sessions/{sid}/execute"),
        Some(&json!({"code": "open('/work/k/b.txt', 'w').write('written by the session')"})),
    );
    assert_eq!(cell.status, 200, "{}", cell.text());
    let dir = server.kill_keeping_state();

    let server = Server::start_in(dir, "", &[], Some(KEY));
    assert_eq!(
        server.call("GET", "/v1/volumes", None).json()["volumes"][0]["name"],
        "kept"
    );
    // Writable again at once: the killed server's mount went with its sandboxes.
    let r = server.execute(mounting(
        "import os\n[open('/work/k/a.txt').read(), open('/work/k/b.txt').read()]",
        json!([{"name": "kept", "path": "/work/k"}]),
    ));
    assert_eq!(
        r.json()["result"],
        json!(["written before", "written by the session"]),
        "{}",
        r.text()
    );
    assert_eq!(put(&server, "kept", "c.txt", b"after").status, 204);
    let dir = server.stop_keeping_state();
    let server = Server::start_in(dir, "", &[], Some(KEY));
    let got = server.call("GET", "/v1/volumes/kept/files/c.txt", None);
    assert_eq!((got.status, got.text()), (200, "after".into()));
}

/// `airlock volume` on the state directory the server uses: the same volumes, rules and quota,
/// and refused while the server holds a volume mounted.
#[test]
fn the_cli_makes_fills_and_empties_the_volumes_the_server_serves() {
    let _g = serial();
    let server = Server::start("", &[]);
    let state = server.state_dir();
    let cli = |args: &[&str], stdin: &[u8]| {
        use std::io::Write;
        let mut child = airlock()
            .arg("volume")
            .arg("--state-dir")
            .arg(&state)
            .args(args)
            .env("AIRLOCK_API_KEY", KEY)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = cli(&["create", "notes", "--size", "16M"], b"");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["size_bytes"],
        16 * MIB
    );
    assert_eq!(
        cli(&["cp", "-", "notes:a/b.txt"], b"from the cli").0,
        Some(0)
    );
    // The server serves what the CLI wrote, to the same key.
    let got = server.call("GET", "/v1/volumes/notes/files/a/b.txt", None);
    assert_eq!((got.status, got.text()), (200, "from the cli".into()));
    let r = server.execute(mounting(
        "open('/work/n/c.txt', 'w').write('from a sandbox')",
        json!([{"name": "notes", "path": "/work/n"}]),
    ));
    assert_eq!(r.status, 200, "{}", r.text());
    let (code, out, _) = cli(&["cp", "notes:c.txt", "-"], b"");
    assert_eq!((code, out.as_str()), (Some(0), "from a sandbox"));
    let (_, listed, _) = cli(&["files", "notes"], b"");
    assert_eq!(listed, "dir\t0\ta\nfile\t12\ta/b.txt\nfile\t14\tc.txt\n");
    assert!(cli(&["ls"], b"").1.starts_with("notes\t16"));
    let (_, shown, _) = cli(&["show", "notes"], b"");
    assert_eq!(
        serde_json::from_str::<Value>(&shown).unwrap()["used_entries"],
        3
    );
    // Bad names and quota are the caller's (2); the quota is the server's configuration.
    assert_eq!(cli(&["create", "../x", "--size", "16M"], b"").0, Some(2));
    let (code, _, err) = cli(&["create", "huge", "--size", "64G"], b"");
    assert_eq!(code, Some(2));
    assert!(err.contains("size_bytes"), "{err}");
    // While a session of the server holds it, the CLI neither writes nor deletes it.
    let session = server.call(
        "POST",
        "/v1/sessions",
        Some(&json!({"volumes": [{"name": "notes", "path": "/work/n"}]})),
    );
    assert_eq!(session.status, 201, "{}", session.text());
    let (code, _, err) = cli(&["rm", "notes"], b"");
    assert_eq!(code, Some(2));
    assert!(err.contains("in use"), "{err}");
    let sid = session.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        server
            .call("DELETE", &format!("/v1/sessions/{sid}"), None)
            .status,
        204
    );
    assert_eq!(cli(&["rm", "notes"], b"").0, Some(0));
    assert_eq!(server.call("GET", "/v1/volumes/notes", None).status, 404);
}

/// The hostile review's findings: a listing is bounded however many names code made (hard
/// links take no entries); a descriptor passed on a session's channel by code that then
/// ends its sandbox does not keep the volume's mount (nor its lease) once the sandbox is
/// gone; names that are not UTF-8 are listed, not hidden; special files and impossible
/// sizes are the caller's errors, not the server's.
#[test]
fn a_volume_holds_up_against_pinning_link_floods_and_odd_names() {
    let _g = serial();
    let server = Server::start("", &[]);
    assert_eq!(create(&server, "v", 64 * MIB).status, 201);
    let mount = json!([{"name": "v", "path": "/work/v"}]);
    let flood = "import os\n\
                 open('/work/v/one', 'w').close()\n\
                 for i in range(12000):\n    os.link('/work/v/one', f'/work/v/l{i:05}')\n\
                 os.mkdir(b'/work/v/\\xff')\n\
                 open(b'/work/v/\\xff/inner', 'w').close()\n\
                 os.mkfifo('/work/v/fifo')\n\
                 'made'";
    let r = server.execute(mounting(flood, mount.clone()));
    assert_eq!(r.json()["result"], "made", "{}", r.text());
    let listed = server.call("GET", "/v1/volumes/v/files", None).json();
    assert_eq!(listed["files"].as_array().unwrap().len(), 10_000, "bounded");
    assert_eq!(listed["truncated"], true);
    // Odd names are listed (with U+FFFD, and `lossy`), not hidden.
    let r = server.execute(mounting(
        "import os\nfor n in os.listdir('/work/v'):\n    \
         n.startswith('l') and os.remove('/work/v/' + n)\n'ok'",
        mount.clone(),
    ));
    assert_eq!(r.json()["result"], "ok", "{}", r.text());
    let listed = server.call("GET", "/v1/volumes/v/files", None).json();
    let lossy: Vec<&Value> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["lossy"] == true)
        .collect();
    assert_eq!(lossy.len(), 2, "{listed}");
    assert!(
        lossy.iter().any(|f| f["path"] == "\u{fffd}/inner"),
        "{listed}"
    );
    assert_eq!(listed["truncated"], false);
    // A FIFO in the way of an upload is a 400; so is a volume of more entries than its size holds.
    assert_eq!(put(&server, "v", "fifo", b"x").status, 400);
    let r = server.call(
        "POST",
        "/v1/volumes",
        Some(&json!({"name": "tiny", "size_bytes": 8 * MIB, "max_entries": 1 << 20})),
    );
    assert_eq!(
        (r.status, r.json()["error"]["field"].clone()),
        (400, json!("max_entries"))
    );

    // A session whose code passes a descriptor of the volume on its channel, then ends its
    // own sandbox.
    let session = server.call("POST", "/v1/sessions", Some(&json!({"volumes": mount})));
    let sid = session.json()["id"].as_str().unwrap().to_owned();
    let pin = "import os, socket, threading, time\n\
               def later():\n    time.sleep(0.5)\n    \
               fd = os.open('/work/v/one', os.O_RDONLY)\n    \
               s = socket.socket(fileno=3)\n    \
               s.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, 'little'))])\n    \
               os._exit(0)\n\
               threading.Thread(target=later).start()\n'armed'";
    let r = server.call(
        "POST",
        &format!("/v1/sessions/{sid}/execute"),
        Some(&json!({"code": pin})),
    );
    assert_eq!(r.json()["result"], "armed", "{}", r.text());
    // Once the sandbox is gone, the volume is free again: a new writer mounts it, and it
    // can be deleted (its blocks with it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = server.execute(mounting("'free'", mount.clone()));
        if r.status == 200 && r.json()["result"] == "free" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", r.text());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let loops = || {
        std::fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter(|d| {
                std::fs::read_to_string(d.path().join("loop/backing_file"))
                    .is_ok_and(|f| f.contains(&*server.state_dir().to_string_lossy()))
            })
            .count()
    };
    assert_eq!(server.call("DELETE", "/v1/volumes/v", None).status, 204);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while loops() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a loop device outlived the volume"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn files_of(server: &Server, volume: &str) -> Value {
    let r = server.call("GET", &format!("/v1/volumes/{volume}/files"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// What a volume holds by the kernel's count: its bytes and entries.
fn used(server: &Server, volume: &str) -> (Value, Value) {
    let shown = server
        .call("GET", &format!("/v1/volumes/{volume}"), None)
        .json();
    (shown["used_bytes"].clone(), shown["used_entries"].clone())
}

/// An upload refused for any reason (no room for its bytes or its entry, a name no file
/// system takes, a path through a file) leaves the file it would have replaced as it was and
/// makes no directory; one with room replaces the file whole, keeping its permissions.
#[test]
fn a_refused_upload_leaves_the_file_it_would_replace_and_makes_no_directory() {
    let _g = serial();
    let server = Server::start("", &[]);
    let made = server.call(
        "POST",
        "/v1/volumes",
        Some(&json!({"name": "v", "size_bytes": 8 * MIB, "max_entries": 64})),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    assert_eq!(put(&server, "v", "keep.txt", b"the original").status, 204);
    assert_eq!(put(&server, "v", "d/kept.txt", b"kept").status, 204);
    let unchanged = |before: &(Value, Value, Value), what: &str| {
        let got = server.call("GET", "/v1/volumes/v/files/keep.txt", None);
        assert_eq!(
            (got.status, got.text()),
            (200, "the original".into()),
            "{what}"
        );
        assert_eq!(files_of(&server, "v"), before.0, "{what}");
        assert_eq!(
            used(&server, "v"),
            (before.1.clone(), before.2.clone()),
            "{what}"
        );
    };
    let now = || {
        let (bytes, entries) = used(&server, "v");
        (files_of(&server, "v"), bytes, entries)
    };
    // Refused as `status` `code` (naming `field`), the volume as it was `before`.
    let refused = |path: &str, data: &[u8], before, (status, code, field): (u16, &str, Value)| {
        let r = put(&server, "v", path, data);
        assert_eq!(
            (r.status, r.error_code(), r.json()["error"]["field"].clone()),
            (status, code.to_owned(), field),
            "{path}: {}",
            r.text()
        );
        unchanged(before, path);
    };
    let full = || (413, "volume_full", Value::Null);

    // More bytes than the volume has room for.
    let before = now();
    let big = vec![7u8; (12 * MIB) as usize];
    for path in ["keep.txt", "new/sub/big", "d/new/big"] {
        refused(path, &big, &before, full());
    }
    // A name longer than a file system takes (255 bytes), or a path through a file: the
    // caller's error, found before anything is made.
    let long = "n".repeat(256);
    for path in [
        long.clone(),
        format!("fresh/deeper/{long}"),
        format!("d/{long}/x"),
        "d/kept.txt/new/x".into(),
        "keep.txt/x".into(),
    ] {
        refused(
            &path,
            b"x",
            &before,
            (400, "invalid_request", json!("path")),
        );
    }

    // No entry left: a replacement needs one beside the file it replaces until it takes its
    // place, and a path needs one for each directory it makes.
    let mount = json!([{"name": "v", "path": "/work/v"}]);
    let fill = "import os\nos.chmod('/work/v/keep.txt', 0o600)\nn = 0\n\
                try:\n    while n < 1000:\n        open(f'/work/v/f{n}', 'w').close(); n += 1\n\
                except OSError:\n    pass\nn";
    let r = server.execute(mounting(fill, mount.clone()));
    let filled = r.json()["result"].as_u64().unwrap();
    assert!((10..64).contains(&filled), "{}", r.text());
    let before = now();
    for path in ["keep.txt", "d/kept.txt", "a/b/c/new.txt"] {
        refused(path, b"replaced", &before, full());
    }
    let got = server.call("GET", "/v1/volumes/v/files/d/kept.txt", None);
    assert_eq!(got.text(), "kept");
    // Two entries free: the new file and one directory, not three.
    let r = server.execute(mounting(
        "import os\nos.remove('/work/v/f0'); os.remove('/work/v/f1')\n'freed'",
        mount.clone(),
    ));
    assert_eq!(r.json()["result"], "freed", "{}", r.text());
    let before = now();
    refused("a/b/c/new.txt", b"new", &before, full());

    // With room, the new file takes the old one's place whole, and its permissions.
    assert_eq!(put(&server, "v", "keep.txt", b"replaced").status, 204);
    let got = server.call("GET", "/v1/volumes/v/files/keep.txt", None);
    assert_eq!(got.text(), "replaced");
    assert_eq!(used(&server, "v").1, before.2, "no entry more");
    let r = server.execute(mounting(
        "import os\nst = os.stat('/work/v/keep.txt')\n[oct(st.st_mode & 0o7777), st.st_uid]",
        mount,
    ));
    assert_eq!(r.json()["result"], json!(["0o600", 1000]), "{}", r.text());
}

/// The reproduction: a sandbox makes 17 nested directories of 250-character names
/// (paths past PATH_MAX, 4096 bytes); the volume still lists, whole, and the file routes
/// reach its deepest file. A path part longer than a name may be (255 bytes) is a 400 on
/// every route that takes a path.
#[test]
fn a_tree_deeper_than_a_path_may_be_long_lists_whole_and_long_names_are_the_caller_s() {
    let _g = serial();
    let server = Server::start("", &[]);
    assert_eq!(create(&server, "v", 16 * MIB).status, 201);
    let mount = json!([{"name": "v", "path": "/work/v"}]);
    let deep = "import os\nos.chdir('/work/v')\n\
                for i in range(17):\n    n = chr(97 + i) * 250\n    os.mkdir(n)\n    os.chdir(n)\n\
                open('bottom.txt', 'w').write('deep down')\n'made'";
    let r = server.execute(mounting(deep, mount.clone()));
    assert_eq!(r.json()["result"], "made", "{}", r.text());
    let listed = files_of(&server, "v");
    let files = listed["files"].as_array().unwrap();
    assert_eq!(files.len(), 18, "{listed}");
    assert_eq!(listed["truncated"], false);
    let dirs: Vec<String> = (0..17u8)
        .map(|i| char::from(b'a' + i).to_string().repeat(250))
        .collect();
    let bottom = format!("{}/bottom.txt", dirs.join("/"));
    assert!(bottom.len() > 4096);
    let found = files
        .iter()
        .find(|f| f["path"] == bottom.as_str())
        .unwrap_or_else(|| panic!("the deepest file is not listed"));
    assert_eq!(
        (found["type"].clone(), found["size"].clone()),
        (json!("file"), json!(9))
    );
    assert!(
        files.iter().all(|f| f.get("unreadable").is_none()),
        "{listed}"
    );

    let route = format!("/v1/volumes/v/files/{bottom}");
    let got = server.call("GET", &route, None);
    assert_eq!((got.status, got.text()), (200, "deep down".into()));
    assert_eq!(put(&server, "v", &bottom, b"replaced").status, 204);
    assert_eq!(server.call("GET", &route, None).text(), "replaced");
    assert_eq!(server.call("DELETE", &route, None).status, 204);
    assert_eq!(server.call("GET", &route, None).status, 404);

    // 255 bytes is a name; 256 is not, on any route.
    let longest = "y".repeat(255);
    assert_eq!(put(&server, "v", &longest, b"x").status, 204);
    let long = "x".repeat(256);
    for path in [long.clone(), format!("a/{long}"), format!("{long}/b")] {
        let route = format!("/v1/volumes/v/files/{path}");
        for r in [
            server.call("GET", &route, None),
            put(&server, "v", &path, b"x"),
            server.call("DELETE", &route, None),
        ] {
            assert_eq!(
                (r.status, r.json()["error"]["field"].clone()),
                (400, json!("path")),
                "{path}: {}",
                r.text()
            );
        }
    }
    let r = server.execute(mounting(
        "1",
        json!([{"name": "v", "path": format!("/work/{long}")}]),
    ));
    assert_eq!(
        (r.status, r.json()["error"]["field"].clone()),
        (400, json!("volumes[0].path")),
        "{}",
        r.text()
    );
}

/// Loop devices still backed by an image under `state`.
fn loops_of(state: &std::path::Path) -> usize {
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter(|d| {
            std::fs::read_to_string(d.path().join("loop/backing_file"))
                .is_ok_and(|f| f.contains(&*state.to_string_lossy()))
        })
        .count()
}

/// The image of the key's volume `name`.
fn image_of(server: &Server, name: &str) -> std::path::PathBuf {
    let owners = server.state_dir().join("volumes");
    let owner = std::fs::read_dir(&owners)
        .unwrap()
        .flatten()
        .next()
        .unwrap();
    owner.path().join(format!("{name}.img"))
}

/// A directory whose entries cannot be read (its block damaged on the disk) is listed,
/// marked `unreadable`; the rest of the volume is listed as ever.
#[test]
fn a_directory_that_cannot_be_read_is_listed_marked_with_the_rest() {
    let _g = serial();
    let server = Server::start("", &[]);
    assert_eq!(create(&server, "v", 16 * MIB).status, 201);
    assert_eq!(put(&server, "v", "broken/inner.txt", b"x").status, 204);
    assert_eq!(put(&server, "v", "fine/ok.txt", b"y").status, 204);
    // Nothing holds it now: once its mount has gone, its image is ours to damage.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while loops_of(&server.state_dir()) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the volume stayed mounted"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let zapped = std::process::Command::new("debugfs")
        .args(["-w", "-R", "zap_block -f /broken 0"])
        .arg(image_of(&server, "v"))
        .output()
        .expect("debugfs (e2fsprogs, which volumes need for mkfs.ext4)");
    assert!(zapped.status.success(), "{zapped:?}");

    let listed = files_of(&server, "v");
    let entries: Vec<(String, bool)> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["unreadable"] == true,
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("broken".to_owned(), true),
            ("fine".to_owned(), false),
            ("fine/ok.txt".to_owned(), false)
        ],
        "{listed}"
    );
    assert_eq!(listed["truncated"], false);
}

/// Sends a PUT of `data` to `path` of volume `v` with strace attached to the server, which
/// kills it (SIGKILL, nothing cleaned up) at the `nth` `syscall` of its: the moment a
/// finished upload would be linked into its directory (`linkat`) or renamed over the file it
/// replaces (`renameat`), or one of the directories it makes (`mkdirat`). The server must
/// die without answering.
fn put_killed_at(server: &Server, syscall: &str, nth: u32, path: &str, data: &[u8]) {
    use std::io::{BufRead, Read, Write};
    let mut strace = std::process::Command::new("strace")
        .args(["-f", "-o", "/dev/null", "-e"])
        .arg(format!("trace={syscall}"))
        .arg("-e")
        .arg(format!("inject={syscall}:error=EIO:signal=KILL:when={nth}"))
        .arg("-p")
        .arg(server.child.id().to_string())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("strace, to kill the server at a chosen system call");
    let mut said = std::io::BufReader::new(strace.stderr.take().unwrap());
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    assert!(line.contains("attached"), "strace: {line}");
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    write!(
        s,
        "PUT /v1/volumes/v/files/{path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        server.addr,
        data.len()
    )
    .unwrap();
    s.write_all(data).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let _ = strace.kill();
    let _ = strace.wait();
    assert_eq!(
        answer, "",
        "the server answered instead of dying at {syscall}"
    );
}

/// A server killed while it uploads leaves nothing of the upload: not the new file beside
/// the old one it would replace, not the directories it made for a new one. The next start
/// finds the volume as it was before the upload, counted as it was.
#[test]
fn an_upload_cut_short_by_a_crash_leaves_the_volume_as_it_was() {
    let _g = serial();
    let server = Server::start("", &[]);
    assert_eq!(create(&server, "v", 16 * MIB).status, 201);
    assert_eq!(put(&server, "v", "keep.txt", b"the original").status, 204);
    assert_eq!(put(&server, "v", "d/kept.txt", b"kept").status, 204);
    let listed = files_of(&server, "v");
    let counted = used(&server, "v");

    let mut server = server;
    for (syscall, nth, path) in [
        ("renameat", 1, "keep.txt"),
        ("renameat", 1, "d/kept.txt"),
        ("linkat", 1, "new/sub/file.txt"),
        ("linkat", 1, "d/new/file.txt"),
        // Killed between the two directories it makes: the one made goes.
        ("mkdirat", 2, "x/y/file.txt"),
    ] {
        put_killed_at(&server, syscall, nth, path, b"the replacement");
        let dir = server.kill_keeping_state();
        server = Server::start_in(dir, "", &[], Some(KEY));
        assert_eq!(files_of(&server, "v"), listed, "after {syscall} of {path}");
        assert_eq!(used(&server, "v"), counted, "after {syscall} of {path}");
        let got = server.call("GET", "/v1/volumes/v/files/keep.txt", None);
        assert_eq!(got.text(), "the original");
    }
    // Nothing of them is left beside the volume either.
    let owner = image_of(&server, "v").parent().unwrap().to_owned();
    let mut beside: Vec<String> = std::fs::read_dir(owner)
        .unwrap()
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .collect();
    beside.sort();
    assert_eq!(beside, [".lock", "v.img", "v.json"]);
}
