//! Credentials kept on the host, through the real server: the egress proxy sets a
//! configured header on requests to its host (ending the sandbox's TLS with a CA of the
//! execution's own, opening its own TLS to the real server with the real certificate
//! checked), and the secret reaches neither the sandbox nor the audit log, whatever the
//! upstream echoes and however it frames or compresses it. The hostile cases speak to the
//! proxy with raw sockets from inside the sandbox. THREAT-MODEL: credentials.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use common::http::{Response, Server};
use common::key_hash as hash;
use serde_json::{json, Value};

const GRANTED: &str = "granted-key-0123456789abcdef";
const UNGRANTED: &str = "ungranted-key-0123456789abcdef";
/// The secret, with bytes that percent-encoding, JSON and base64 all change.
const SECRET: &str = "tok_Zq9/x+Y=abc123SECRETvalue";

/// `credential_server.py`: the good upstream (api.test, other.test) and the one whose
/// certificate is for another name, with the test CA that signed both.
struct Upstreams {
    secret: &'static str,
    child: Child,
    good: u16,
    wrong: u16,
    ca_pem: String,
    dir: std::path::PathBuf,
}

impl Upstreams {
    fn start() -> Upstreams {
        Upstreams::with_secret(SECRET)
    }

    fn with_secret(secret: &'static str) -> Upstreams {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("airlock-cred-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new("/usr/bin/python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/credential_server.py"
            ))
            .arg(&dir)
            .arg(secret)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut line = || lines.next().unwrap().unwrap().trim().to_owned();
        let (good, wrong) = (line().parse().unwrap(), line().parse().unwrap());
        let ca_pem = std::fs::read_to_string(line()).unwrap();
        Upstreams {
            secret,
            child,
            good,
            wrong,
            ca_pem,
            dir,
        }
    }

    fn config(&self) -> String {
        let (g, w) = (self.good, self.wrong);
        let egress = format!(
            "egress = {{ hosts = [{{ host = \"api.test\", ports = [{g}, {w}] }}, \
             {{ host = \"other.test\", ports = [{g}] }}], \
             ranges = [{{ cidr = \"127.0.0.0/8\", ports = [{g}, {w}] }}] }}"
        );
        format!(
            r#"
[engine.ceilings]
output_bytes = 8388608

[egress.resolve]
"api.test" = ["127.0.0.1"]
"other.test" = ["127.0.0.1"]

[credentials.api]
hosts = [{{ host = "api.test", ports = [{g}, {w}] }}]
ca_file = "{ca}"
[credentials.api.headers]
Authorization = {{ env = "AIRLOCK_TEST_API_TOKEN", format = "Bearer {{}}" }}

[[keys]]
name = "granted"
hash = "{granted}"
{egress}
credentials = ["api"]

[[keys]]
name = "ungranted"
hash = "{ungranted}"
{egress}
"#,
            ca = self.dir.join("ca.pem").display(),
            granted = hash(GRANTED),
            ungranted = hash(UNGRANTED),
        )
    }

    fn server(&self) -> Server {
        Server::start(&self.config(), &[("AIRLOCK_TEST_API_TOKEN", self.secret)])
    }
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn call(server: &Server, key: &str, body: &Value) -> Response {
    common::http::call_as(server.addr, key, "POST", "/v1/execute", Some(body))
}

/// Runs `code` as `key` with the test CA at `/work/test-ca.pem`; its stdout as JSON.
fn run(server: &Server, up: &Upstreams, key: &str, code: &str) -> (Value, Value) {
    let code = format!(
        "GOOD, WRONG = {}, {}\nAPI = f'https://api.test:{{GOOD}}'\n\
         OTHER = f'https://other.test:{{GOOD}}'\n{code}",
        up.good, up.wrong
    );
    let r = call(
        server,
        key,
        &json!({
            "code": code,
            "files": [{"path": "test-ca.pem", "content": up.ca_pem}],
            "limits": {"timeout_ms": 60000, "output_bytes": 8388608},
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    assert_eq!(r["status"], "ok", "{r:#}");
    let out: Value = serde_json::from_str(r["stdout"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {r:#}"));
    (out, r)
}

/// Every form of the secret a reply could carry: as it is, percent-encoded, hex, JSON with
/// `\/`, and the characters of base64 and base64url that depend on the secret alone, at
/// each alignment.
fn traces() -> Vec<String> {
    let mut t = vec![
        SECRET.to_owned(),
        SECRET
            .replace('/', "%2F")
            .replace('+', "%2B")
            .replace('=', "%3D"),
        SECRET
            .replace('/', "%2f")
            .replace('+', "%2b")
            .replace('=', "%3d"),
        SECRET.replace('/', "\\/"),
        SECRET.replace('/', "\\\\/"),
        SECRET.bytes().map(|b| format!("{b:02x}")).collect(),
        "SECRETvalue".to_owned(),
    ];
    for engine in [
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for offset in 0..3usize {
            let mut bytes = vec![b'x'; offset];
            bytes.extend_from_slice(SECRET.as_bytes());
            let text = engine.encode(&bytes);
            let skip = [0, 2, 3][offset];
            let end = text.len() - usize::from(bytes.len() % 3 != 0);
            t.push(text[skip..end].to_owned());
        }
    }
    t
}

/// Looks in any ASCII case: an echo may change it.
fn assert_no_trace(what: &str, text: &str) {
    let text = text.to_ascii_lowercase();
    for trace in traces() {
        assert!(
            !text.contains(&trace.to_ascii_lowercase()),
            "{what} holds a form of the secret ({trace}): {text}"
        );
    }
}

/// The audit log's lines of one event.
fn audit(server: &Server, event: &str) -> Vec<Value> {
    std::fs::read_to_string(server.state_dir().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

/// Each HTTP client of the sandbox, each framing and coding of the echo: the header
/// arrives exactly (the upstream says so), the code finds it masked wherever the upstream
/// echoed it, and nothing of the secret is in the sandbox's environment, files or
/// processes, nor in the audit log.
const CLIENTS: &str = r#"
import asyncio, json, os, subprocess, sys
import requests, httpx, aiohttp, urllib.request
out = {}
for mode in ["plain", "chunked", "gzip", "gzip-chunked", "deflate"]:
    r = requests.post(f"{API}/echo?mode={mode}", data="hello", timeout=20)
    out["requests " + mode] = [r.status_code, dict(r.headers), r.text]
with httpx.Client(timeout=20) as c:
    r = c.get(f"{API}/echo?mode=chunked")
    out["httpx"] = [r.status_code, dict(r.headers), r.text]
with urllib.request.urlopen(f"{API}/echo?mode=plain", timeout=20) as r:
    out["urllib"] = [r.status, dict(r.headers), r.read().decode()]
async def aio():
    async with aiohttp.ClientSession(trust_env=True) as s:
        async with s.get(f"{API}/echo?mode=gzip-chunked") as r:
            return [r.status, dict(r.headers), await r.text()]
out["aiohttp"] = asyncio.run(aio())
c = subprocess.run(["curl", "-sS", "--compressed", "-D", "-", f"{API}/echo?mode=gzip"],
                   capture_output=True, text=True, timeout=30)
out["curl"] = [c.returncode, c.stderr, c.stdout]
p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir",
                    "--index-url", f"{API}/simple/", "--target", "/tmp/probe", "airlock-probe"],
                   capture_output=True, text=True, timeout=120)
sys.path.insert(0, "/tmp/probe")
try:
    import airlock_probe
    out["pip"] = [p.returncode, airlock_probe.INSTALLED]
except ImportError as e:
    out["pip"] = [p.returncode, p.stdout + p.stderr]
# Everything of the sandbox's own the secret could be in.
seen = [json.dumps(dict(os.environ))]
for root in ["/proc"]:
    for pid in os.listdir(root):
        for name in ["environ", "cmdline"]:
            try:
                seen.append(open(f"/proc/{pid}/{name}", "rb").read().decode(errors="replace"))
            except OSError:
                pass
for top in ["/etc", "/work", "/tmp", "/dev/shm", "/root", "/home"]:
    for d, _, files in os.walk(top):
        if d.startswith("/etc/alternatives"):
            continue  # shared libraries (the host's, read-only)
        for f in files:
            if f == "ca-certificates.crt":
                continue
            try:
                with open(os.path.join(d, f), "rb") as fh:
                    seen.append(fh.read(1 << 20).decode(errors="replace"))
            except OSError:
                pass
out["seen"] = "\n".join(seen)
bundle = open("/etc/ssl/certs/ca-certificates.crt").read()
out["bundle_last"] = "-----BEGIN CERTIFICATE-----" + bundle.split("-----BEGIN CERTIFICATE-----")[-1]
out["private_key_in_bundle"] = "PRIVATE KEY" in bundle
print(json.dumps(out))
"#;

#[test]
fn a_credential_reaches_its_host_and_never_the_sandbox() {
    // Its servers' sandboxes would be someone else's to the tests that compare the host.
    let _serial = common::serial();
    let up = Upstreams::start();
    let server = up.server();
    let (out, result) = run(&server, &up, GRANTED, CLIENTS);
    let text = out.to_string();
    assert_no_trace("what the code read", &text);
    for (name, answer) in out.as_object().unwrap() {
        if [
            "seen",
            "bundle_last",
            "private_key_in_bundle",
            "pip",
            "curl",
        ]
        .contains(&name.as_str())
        {
            continue;
        }
        assert_eq!(answer[0], 200, "{name}: {answer}");
        let echo: Value = serde_json::from_str(answer[2].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}: {answer}"));
        assert_eq!(
            echo["auth_ok"], true,
            "{name}: the upstream got the header: {echo}"
        );
        let masked = echo["headers"]["Authorization"].as_str().unwrap();
        assert!(
            masked.starts_with("Bearer ") && masked[7..].bytes().all(|b| b == b'*'),
            "{name}: {masked}"
        );
        assert_eq!(
            answer[1]["X-Echo-Authorization"]
                .as_str()
                .or(answer[1]["x-echo-authorization"].as_str()),
            Some(masked),
            "{name}: headers are masked too"
        );
    }
    // curl: exit 0, the answer decoded from gzip by the proxy, the header masked.
    assert_eq!(out["curl"][0], 0, "{}", out["curl"]);
    let curl = out["curl"][2].as_str().unwrap();
    assert!(curl.contains("\"auth_ok\": true"), "{curl}");
    assert_eq!(
        out["pip"],
        json!([0, "through the credential proxy"]),
        "pip installs from an index that needs the credential"
    );
    assert_eq!(out["private_key_in_bundle"], false);
    assert!(
        out["seen"].as_str().unwrap().len() > 1000,
        "the scan read something"
    );

    // Each use audited, the secret in no line; counted in usage and the metrics.
    let lines = audit(&server, "credential");
    assert!(lines.len() >= 10, "{lines:#?}");
    let first = &lines[0];
    assert_eq!(first["credential"], "api");
    assert_eq!(first["host"], "api.test");
    assert_eq!(first["key"], "granted");
    assert!(first["execution_id"].as_str().unwrap().starts_with("ex_"));
    assert!(
        lines.iter().any(|l| l["path"] == "/echo"
            && l["status"] == 200
            && l["method"] == "POST"
            && l["scrubbed"].as_u64() > Some(0)),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| !l["path"].as_str().unwrap().contains('?')),
        "no query"
    );
    let log = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    assert_no_trace("the audit log", &log);
    assert!(
        result["usage"]["egress"]["credential_requests"].as_u64() >= Some(10),
        "{:#}",
        result["usage"]
    );
    assert!(
        server.metric("airlock_credential_requests_total{credential=\"api\",status=\"2xx\"}")
            >= 10.0
    );
    let tunnels: Vec<Value> = audit(&server, "egress")
        .into_iter()
        .filter(|l| l["credential"] == "api")
        .collect();
    assert!(
        !tunnels.is_empty() && tunnels.iter().all(|l| l["outcome"] == "allowed"),
        "{tunnels:#?}"
    );

    // Another execution has a CA of its own.
    let (again, _) = run(&server, &up, GRANTED, "import json\nb = open('/etc/ssl/certs/ca-certificates.crt').read()\nprint(json.dumps({'bundle_last': '-----BEGIN CERTIFICATE-----' + b.split('-----BEGIN CERTIFICATE-----')[-1]}))");
    assert_ne!(again["bundle_last"], out["bundle_last"]);
}

/// Raw sockets to the proxy from inside the sandbox: every way of pointing a request that
/// carries the credential somewhere else is refused, and the hosts without one get a plain
/// tunnel and no header.
const HOSTILE: &str = r#"
import json, socket, ssl, requests
P = ("127.0.0.1", 3128)
BOTH = "/tmp/both.pem"
open(BOTH, "w").write(open("/etc/ssl/certs/ca-certificates.crt").read() + open("/work/test-ca.pem").read())

def tunnel(target):
    s = socket.create_connection(P, timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b:
            break
        head += b
    return s, head.decode(errors="replace").split("\r\n")[0]

def read_all(t):
    data = b""
    try:
        while True:
            b = t.recv(65536)
            if not b:
                break
            data += b
    except (socket.timeout, ssl.SSLError, OSError) as e:
        data += f"<{type(e).__name__}>".encode()
    return data.decode(errors="replace")

def exchange(target, sni, payload, cafile=None, verify=True):
    s, status = tunnel(target)
    if "200" not in status:
        return status
    if verify:
        ctx = ssl.create_default_context(cafile=cafile)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        t = ctx.wrap_socket(s, server_hostname=sni)
        t.sendall(payload.encode())
    except (ssl.SSLError, OSError) as e:
        return f"<{type(e).__name__}: {e}>"
    return read_all(t)

def get(path, host, extra="", close=True):
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}" + ("Connection: close\r\n" if close else "") + "\r\n"

A = f"api.test:{GOOD}"
out = {}
out["host_mismatch"] = exchange(A, "api.test", get("/echo", f"other.test:{GOOD}"))
out["two_hosts"] = exchange(A, "api.test", f"GET /echo HTTP/1.1\r\nHost: {A}\r\nHost: other.test:{GOOD}\r\n\r\n")
out["absolute"] = exchange(A, "api.test", get(f"https://other.test:{GOOD}/echo", A))
out["absolute_http"] = exchange(A, "api.test", get(f"http://api.test:{GOOD}/echo", A))
out["sni"] = exchange(A, "other.test", get("/echo", A), verify=False)
out["pipelined"] = exchange(A, "api.test", get("/echo?n=1", A, close=False) + get("/echo?n=2", A, close=False) + get("/echo?n=3", A))
out["pipelined_then_elsewhere"] = exchange(A, "api.test", get("/echo?n=1", A, close=False) + get("/echo?n=2", f"other.test:{GOOD}"))
out["smuggled"] = exchange(A, "api.test", f"POST /echo HTTP/1.1\r\nHost: {A}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
out["ip_literal"] = exchange(f"127.0.0.1:{GOOD}", "api.test", get("/echo", A), cafile="/work/test-ca.pem")
out["unscannable"] = exchange(A, "api.test", get("/echo?mode=br", A))
out["upgrade"] = exchange(A, "api.test", get("/echo", A, "Upgrade: websocket\r\n"))
out["connect_inside"] = exchange(A, "api.test", f"CONNECT other.test:{GOOD} HTTP/1.1\r\nHost: {A}\r\n\r\n")
r = requests.get(f"{OTHER}/echo", verify=BOTH, timeout=20)
out["other_host"] = r.text
r = requests.get(f"{API}/redirect?to={OTHER}/echo", verify=BOTH, timeout=20)
out["redirect"] = [r.url, r.text, [h.status_code for h in r.history]]
try:
    requests.get(f"https://api.test:{WRONG}/echo", timeout=20)
    out["wrong_certificate"] = "reached"
except requests.exceptions.ProxyError as e:
    out["wrong_certificate"] = str(e)
print(json.dumps(out))
"#;

#[test]
fn hostile_requests_never_carry_the_credential_elsewhere() {
    // Its servers' sandboxes would be someone else's to the tests that compare the host.
    let _serial = common::serial();
    let up = Upstreams::start();
    let server = up.server();
    let (out, _) = run(&server, &up, GRANTED, HOSTILE);
    assert_no_trace("what the code read", &out.to_string());
    let s = |k: &str| {
        out[k]
            .as_str()
            .unwrap_or_else(|| panic!("{k}: {out:#}"))
            .to_owned()
    };
    for k in ["host_mismatch", "absolute", "absolute_http"] {
        assert!(s(k).starts_with("HTTP/1.1 421 "), "{k}: {}", s(k));
        assert!(s(k).contains("reason=host_mismatch"), "{k}: {}", s(k));
        assert!(
            !s(k).contains("auth_ok"),
            "{k}: nothing reached the upstream"
        );
    }
    assert!(
        s("two_hosts").starts_with("HTTP/1.1 400 "),
        "{}",
        s("two_hosts")
    );
    assert!(!s("sni").contains("auth_ok"), "{}", s("sni"));
    // Pipelined requests are each answered, each carrying the credential.
    assert_eq!(
        s("pipelined").matches("\"auth_ok\": true").count(),
        3,
        "{}",
        s("pipelined")
    );
    for n in 1..=3 {
        assert!(s("pipelined").contains(&format!("/echo?n={n}")));
    }
    let p = s("pipelined_then_elsewhere");
    assert_eq!(p.matches("\"auth_ok\": true").count(), 1, "{p}");
    assert!(p.contains("HTTP/1.1 421 "), "{p}");
    assert!(
        s("smuggled").starts_with("HTTP/1.1 400 "),
        "{}",
        s("smuggled")
    );
    // An address instead of the name: a plain tunnel, no credential.
    let ip = s("ip_literal");
    assert!(
        ip.contains("\"auth_ok\": false") && !ip.contains("\"Authorization\""),
        "{ip}"
    );
    let br = s("unscannable");
    assert!(
        br.starts_with("HTTP/1.1 502 ") && br.contains("reason=unscannable_encoding"),
        "{br}"
    );
    assert!(
        s("upgrade").starts_with("HTTP/1.1 501 "),
        "{}",
        s("upgrade")
    );
    assert!(
        s("connect_inside").starts_with("HTTP/1.1 405 "),
        "{}",
        s("connect_inside")
    );
    let other: Value = serde_json::from_str(&s("other_host")).unwrap();
    assert_eq!(other["auth_ok"], false);
    assert!(other["headers"].get("Authorization").is_none(), "{other}");
    let redirect = &out["redirect"];
    assert_eq!(redirect[2], json!([302]), "{redirect}");
    let landed: Value = serde_json::from_str(redirect[1].as_str().unwrap()).unwrap();
    assert_eq!(landed["host"], format!("other.test:{}", up.good));
    assert!(landed["headers"].get("Authorization").is_none(), "{landed}");
    let wrong = s("wrong_certificate");
    assert!(wrong.contains("502"), "{wrong}");

    let egress = audit(&server, "egress");
    let refused = |reason: &str| egress.iter().any(|l| l["reason"] == reason);
    assert!(refused("upstream_tls"), "{egress:#?}");
    assert!(
        refused("host_mismatch") && refused("sni_mismatch"),
        "{egress:#?}"
    );
    assert!(refused("unscannable_encoding"), "{egress:#?}");
    assert!(egress
        .iter()
        .any(|l| l["reason"] == "host_mismatch" && l["outcome"] == "denied"));
    let log = std::fs::read_to_string(server.state_dir().join("audit.jsonl")).unwrap();
    assert_no_trace("the audit log", &log);
}

#[test]
fn only_a_granted_key_gets_the_credential_and_a_request_may_drop_it() {
    // Its servers' sandboxes would be someone else's to the tests that compare the host.
    let _serial = common::serial();
    let up = Upstreams::start();
    let server = up.server();
    let echo = r#"
import json, requests
open("/tmp/both.pem", "w").write(open("/etc/ssl/certs/ca-certificates.crt").read() + open("/work/test-ca.pem").read())
print(json.dumps(requests.get(f"{API}/echo", verify="/tmp/both.pem", timeout=20).json()))
"#;
    for (key, credentials) in [(UNGRANTED, None), (GRANTED, Some(json!([])))] {
        let mut body = json!({
            "code": format!("GOOD = {}\nAPI = f'https://api.test:{{GOOD}}'\n{echo}", up.good),
            "files": [{"path": "test-ca.pem", "content": up.ca_pem}],
        });
        if let Some(c) = credentials {
            body["credentials"] = c;
        }
        let r = call(&server, key, &body).json();
        assert_eq!(r["status"], "ok", "{r:#}");
        let got: Value = serde_json::from_str(r["stdout"].as_str().unwrap()).unwrap();
        assert_eq!(got["auth_ok"], false, "{got}");
        assert!(got["headers"].get("Authorization").is_none(), "{got}");
        assert_eq!(
            got["sni"], "api.test",
            "the code's own TLS reached the upstream"
        );
    }
    let r = call(
        &server,
        UNGRANTED,
        &json!({"code": "print(1)", "credentials": ["api"]}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["error"]["field"], "credentials", "{}", r.text());
    assert!(audit(&server, "credential").is_empty());

    // SIGHUP reads keys only: a key granted a credential added with it keeps the keys as
    // they were (the credential's values were never read).
    let added = up.config().replacen(
        "credentials = [\"api\"]",
        &format!(
            "credentials = [\"api\"]\n\n[credentials.other]\nhosts = [{{ host = \"other.test\", \
             ports = [{}] }}]\n[credentials.other.headers]\nX-Token = {{ env = \
             \"AIRLOCK_TEST_OTHER_TOKEN\" }}\n",
            up.good
        ),
        1,
    );
    let added = added.replacen(
        "name = \"ungranted\"",
        "name = \"ungranted\"\ncredentials = [\"other\"]",
        1,
    );
    std::fs::write(server.dir.join("airlock.toml"), added).unwrap();
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::SIGHUP).unwrap();
    let stayed = server.wait_log_lines("keys stay as they were", 1);
    assert!(stayed[0].contains("needs a restart"), "{stayed:?}");
    let r = call(&server, UNGRANTED, &json!({"code": "print(1)"}));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_missing_secret_stops_the_server_and_doctor_names_it() {
    // Its servers' sandboxes would be someone else's to the tests that compare the host.
    let _serial = common::serial();
    let up = Upstreams::start();
    let dir = std::env::temp_dir().join(format!("airlock-cred-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("airlock.toml");
    std::fs::write(&config, up.config()).unwrap();
    let serve = common::airlock()
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env_remove("AIRLOCK_TEST_API_TOKEN")
        .output()
        .unwrap();
    assert!(!serve.status.success());
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert!(
        stderr.contains("credentials.api.headers.Authorization")
            && stderr.contains("AIRLOCK_TEST_API_TOKEN is not set"),
        "{stderr}"
    );
    let doctor = |env: Option<&str>| {
        let mut c = common::airlock();
        c.args(["doctor", "--config"]).arg(&config);
        match env {
            Some(v) => c.env("AIRLOCK_TEST_API_TOKEN", v),
            None => c.env_remove("AIRLOCK_TEST_API_TOKEN"),
        };
        let o = c.output().unwrap();
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
    };
    let missing = doctor(None);
    assert!(
        missing.contains("credential api") && missing.contains("AIRLOCK_TEST_API_TOKEN is not set"),
        "{missing}"
    );
    let present = doctor(Some(SECRET));
    assert!(present.contains("credential api"), "{present}");
    assert!(
        !present.contains("AIRLOCK_TEST_API_TOKEN is not set"),
        "{present}"
    );
    assert_no_trace("doctor's report", &present);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The code's attack on the scrubber's hold-back, from inside the sandbox: keep-alive
/// requests over the proxy's TLS whose answers end with a guess (`hello GUESS`), reading the
/// size of each TLS record of the body. A guess that is a prefix of the secret must look
/// exactly like any other of its length, whatever the answer's framing.
const GUESSES: &str = r#"
import json, socket, ssl
P = ("127.0.0.1", 3128)
A = f"api.test:{GOOD}"

def connect():
    s = socket.create_connection(P, timeout=20)
    s.sendall(f"CONNECT {A} HTTP/1.1\r\nHost: {A}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert b" 200 " in head.split(b"\r\n")[0], head
    return ssl.create_default_context().wrap_socket(s, server_hostname="api.test")

def pieces(t, guess, mode):
    t.sendall(f"GET /tail?g={guess}&mode={mode} HTTP/1.1\r\nHost: {A}\r\n\r\n".encode())
    got, sizes = b"", []
    while True:
        piece = t.recv(65536)  # one TLS record at most
        if not piece:
            break
        if b"\r\n\r\n" in got or b"\r\n\r\n" in piece:
            sizes.append(len(piece))
        got += piece
        body = got.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in got else b""
        if mode == "length" and len(body) >= 6 + len(guess):
            break
        if mode == "chunked" and body.endswith(b"0\r\n\r\n"):
            break
    return sizes, got.decode(errors="replace")

out = {}
for mode in ["length", "chunked", "close"]:
    for guess in GUESSES:
        runs = []
        t = connect()
        for _ in range(3):
            if mode == "close":
                t.close()
                t = connect()
            runs.append(pieces(t, guess, mode))
        t.close()
        out[f"{mode} {guess}"] = runs
print(json.dumps(out))
"#;

#[test]
fn a_guess_s_pieces_tell_nothing_of_the_secret() {
    // Its servers' sandboxes would be someone else's to the tests that compare the host.
    let _serial = common::serial();
    let up = Upstreams::start();
    let server = up.server();
    let prefixes = [&SECRET[..4], &SECRET[..9]];
    let others = ["zzzz", "zzzzzzzzz"];
    let code = format!(
        "GUESSES = {}\n{GUESSES}",
        serde_json::to_string(&[prefixes[0], others[0], prefixes[1], others[1]]).unwrap()
    );
    let (out, _) = run(&server, &up, GRANTED, &code);
    for mode in ["length", "chunked", "close"] {
        for (prefix, other) in prefixes.iter().zip(others) {
            let pattern = |guess: &str| -> Vec<Value> {
                let runs = out[format!("{mode} {guess}")].as_array().unwrap();
                for run in runs {
                    assert!(
                        run[1].as_str().unwrap().contains(&format!("hello {guess}")),
                        "{mode}: {run}"
                    );
                }
                runs.iter().map(|r| r[0].clone()).collect()
            };
            assert_eq!(
                pattern(prefix),
                pattern(other),
                "{mode}: the pieces of an answer ending with a prefix of the secret ({prefix:?}) \
                 differ from another guess's ({other:?})"
            );
        }
    }
}

/// A secret with every printable symbol, in a GitHub fine-grained token's length.
const SYMBOLS: &str =
    "gh!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ Zq9xY0abcd1234EFGH5678ijkl90MNOPqrst12UVWXyz34ABCDef56GHIJk7LmN";

/// Every encoder of Python's the upstream writes the secret with, read by the code: each
/// form arrives masked whole (a base64 form but for the few characters that hold other
/// bytes' bits). Requests' `Range` and `If-Range` never reach the upstream.
#[test]
fn every_encoder_s_form_of_a_secret_with_every_symbol_is_masked() {
    // Its servers' sandboxes would be someone else's to the tests that compare the host.
    let _serial = common::serial();
    assert_eq!(SYMBOLS.len(), 98);
    let up = Upstreams::with_secret(SYMBOLS);
    let server = up.server();
    let code = r#"
import json, requests
open("/tmp/both.pem", "w").write(open("/etc/ssl/certs/ca-certificates.crt").read() + open("/work/test-ca.pem").read())
s = requests.Session()
s.verify = "/tmp/both.pem"
r = s.get(f"{API}/encoders", headers={"Range": "bytes=0-9", "If-Range": "x"}, timeout=20)
out = {"status": r.status_code, "headers": r.json()["headers"], "forms": {}}
for name in r.json()["names"]:
    out["forms"][name] = s.get(f"{API}/encoders", params={"name": name}, timeout=20).content.decode()
print(json.dumps(out))
"#;
    let (out, _) = run(&server, &up, GRANTED, code);
    assert_eq!(out["status"], 200, "{out}");
    let seen = &out;
    let headers = seen["headers"].as_object().unwrap();
    assert!(
        !headers
            .keys()
            .any(|k| k.eq_ignore_ascii_case("range") || k.eq_ignore_ascii_case("if-range")),
        "{headers:?}"
    );
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(up.dir.join("encoders.json")).unwrap())
            .unwrap();
    let forms = written["forms"].as_object().unwrap();
    assert!(forms.len() >= 25, "{forms:?}");
    for (name, form) in forms {
        let form = form.as_str().unwrap();
        let got = seen["forms"][name]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {seen}"));
        assert_eq!(got.len(), form.len(), "{name}: lengths stay true");
        let left = got.replace('*', "");
        if name.contains("base64") {
            // Left unmasked: the characters that carry the bytes on either side too,
            // padding and line ends.
            let left: String = left.chars().filter(|c| !"=\n\\\"".contains(*c)).collect();
            assert!(
                left.len() <= 6,
                "{name}: {left:?} left of {form:?}, seen as {got:?}"
            );
        } else {
            // All of the secret is masked, and only what the encoder wraps it in is left.
            assert_eq!(
                left,
                written["empty"][name].as_str().unwrap(),
                "{name}: {form:?} seen as {got:?}"
            );
        }
    }
    let scrubbed: u64 = audit(&server, "credential")
        .iter()
        .map(|l| l["scrubbed"].as_u64().unwrap())
        .sum();
    assert!(scrubbed >= forms.len() as u64, "{scrubbed}");
}

/// A streamed answer goes on while the upstream is quiet, and while it never pauses for
/// long: the code reads the first event, and only then asks the upstream (on another
/// connection) for the rest.
#[test]
fn a_streamed_answer_goes_on_while_the_upstream_waits() {
    // Its servers' sandboxes would be someone else's to the tests that compare the host.
    let _serial = common::serial();
    let up = Upstreams::start();
    let server = up.server();
    let code = r#"
import json, requests
open("/tmp/both.pem", "w").write(open("/etc/ssl/certs/ca-certificates.crt").read() + open("/work/test-ca.pem").read())
s = requests.Session()
s.verify = "/tmp/both.pem"
out = {}
for mode in ["quiet", "trickle"]:
    events = []
    with s.get(f"{API}/stream?id={mode}&mode={mode}", stream=True, timeout=20) as r:
        lines = r.iter_lines(chunk_size=1)
        events.append(next(lines).decode())
        requests.get(f"{API}/go?id={mode}", verify="/tmp/both.pem", timeout=20)
        events.extend(l.decode() for l in lines if l)
    out[mode] = events
print(json.dumps(out))
"#;
    let (out, _) = run(&server, &up, GRANTED, code);
    assert_eq!(out["quiet"], json!(["data: one", "data: two"]));
    let trickle: Vec<&str> = out["trickle"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(trickle.first(), Some(&"data: one"), "{trickle:?}");
    assert_eq!(trickle.last(), Some(&"data: two"), "{trickle:?}");
    assert!(
        trickle[1..trickle.len() - 1]
            .iter()
            .all(|e| *e == "data: tick"),
        "{trickle:?}"
    );
}
