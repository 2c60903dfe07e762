//! A real `airlock serve` on a loopback port, and a small HTTP/1.1 client over a plain TCP
//! socket (so that tests can also speak HTTP badly on purpose).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use super::airlock;

/// The key every test server accepts (through AIRLOCK_API_KEY), named "env".
pub const KEY: &str = "test-key-0123456789abcdef";

/// Engine settings for tests of the memory budget: 4 KiB of output and result, so that an
/// execution reserves 784 KiB for its answer (and an MCP call about 2.4 MiB) and budgets of a
/// few MiB can be tested.
pub const SMALL_ANSWERS: &str = "[engine]\nmax_result_bytes = 4096\n\
    [engine.defaults]\ntimeout_ms = 30000\nmemory_mb = 512\ncpu_ms = 30000\npids = 64\n\
    disk_mb = 256\noutput_bytes = 4096\n\
    [engine.ceilings]\ntimeout_ms = 600000\nmemory_mb = 8192\ncpu_ms = 600000\npids = 1024\n\
    disk_mb = 4096\noutput_bytes = 4096\n";

pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    /// Lines airlock writes on stderr (the log), as they come.
    log: mpsc::Receiver<String>,
    /// Log lines taken from `log` so far.
    seen: std::cell::RefCell<Vec<String>>,
    /// What airlock printed on stdout by the time it listened (a generated key, if any).
    pub stdout: String,
    /// Leave `dir` behind on drop (for a restart on the same state).
    keep_dir: bool,
}

impl Server {
    /// Waits (up to 20 s) until the metrics say `n` sandboxes run.
    pub fn wait_running(&self, n: i64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let m = self.call("GET", "/metrics", None).text();
            if m.contains(&format!("airlock_running_sandboxes {n}\n")) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never saw {n} running: {m}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `airlock serve` with `config` (TOML) and extra environment variables.
    pub fn start(config: &str, env: &[(&str, &str)]) -> Server {
        Self::start_with(config, env, true)
    }

    /// As `start`; `with_key: false` leaves AIRLOCK_API_KEY unset.
    pub fn start_with(config: &str, env: &[(&str, &str)], with_key: bool) -> Server {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "airlock-server-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self::start_in(dir, config, env, with_key.then_some(KEY))
    }

    /// Starts `airlock serve` in `dir` (config file and state directory), which may hold the
    /// state of an earlier server; `key` goes into AIRLOCK_API_KEY.
    pub fn start_in(dir: PathBuf, config: &str, env: &[(&str, &str)], key: Option<&str>) -> Server {
        Self::start_under(&[], dir, config, env, key)
    }

    /// As `start_in`, run by `wrapper` (`unshare --mount`, say), which must exec airlock.
    pub fn start_under(
        wrapper: &[&str],
        dir: PathBuf,
        config: &str,
        env: &[(&str, &str)],
        key: Option<&str>,
    ) -> Server {
        let with_key = key.is_some();
        let config_path = dir.join("airlock.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut cmd = match wrapper {
            [] => airlock(),
            [first, rest @ ..] => {
                let mut cmd = Command::new(first);
                cmd.args(rest)
                    .arg(env!("CARGO_BIN_EXE_airlock"))
                    .env("HOST_SECRET_CANARY", "host-secret-value");
                cmd
            }
        };
        // A test that needs a fixed port (a balancer in front) names it.
        let listen = env
            .iter()
            .find(|(k, _)| *k == "AIRLOCK_LISTEN")
            .map_or("127.0.0.1:0", |(_, v)| *v);
        cmd.args(["serve", "--listen", listen, "--config"])
            .arg(&config_path)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(key) = key {
            cmd.env("AIRLOCK_API_KEY", key);
        }
        // These tests count sandboxes, so the warm pool is off unless a test turns it on (the
        // pool's own tests, in pool.rs, do).
        if !config.contains("[pool]") {
            cmd.env("AIRLOCK_POOL__SIZE", "0");
        }
        // Likewise zygotes, whose processes live as long as the server (zygote.rs and the
        // pool's tests turn them on).
        if !config.contains("[zygote]") {
            cmd.env("AIRLOCK_ZYGOTE__ENABLED", "false");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start airlock serve");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("airlock serve did not start; it said: {seen:#?}"));
            if let Some(rest) = line.strip_prefix("airlock: listening on http://") {
                break rest.trim().parse().unwrap();
            }
            seen.push(line);
        };
        // Stdout holds at most the generated key, printed before listening is announced.
        let mut stdout = String::new();
        let out = child.stdout.take().unwrap();
        let (otx, orx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if otx.send(line).is_err() {
                    break;
                }
            }
        });
        while let Ok(line) =
            orx.recv_timeout(Duration::from_millis(if with_key { 10 } else { 500 }))
        {
            stdout.push_str(&line);
            stdout.push('\n');
        }
        Server {
            child,
            addr,
            dir,
            log: rx,
            seen: std::cell::RefCell::new(seen),
            stdout,
            keep_dir: false,
        }
    }

    /// Stops reading the server's stderr: the pipe closes at its next line, and every line
    /// after that meets a broken pipe.
    pub fn stop_reading_log(&mut self) {
        self.log = mpsc::channel().1;
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// A connection whose receive buffer is `bytes` (set before it connects, so the kernel
    /// takes little of an answer its client does not read).
    pub fn connect_small(&self, bytes: usize) -> TcpStream {
        use nix::sys::socket::{
            connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
        };
        use std::os::fd::AsRawFd;
        let SocketAddr::V4(v4) = self.addr else {
            panic!("the test server listens on IPv4")
        };
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )
        .unwrap();
        setsockopt(&fd, sockopt::RcvBuf, &bytes).unwrap();
        connect(fd.as_raw_fd(), &SockaddrIn::from(v4)).unwrap();
        let s = TcpStream::from(fd);
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// The value of a metric line of `/metrics` (`name` with its labels, as written).
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.call("GET", "/metrics", None).text();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    /// The server's resident memory (VmRSS), in bytes.
    pub fn rss(&self) -> u64 {
        rss_of(self.child.id())
    }

    /// A request with the test key.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Response {
        let mut headers = vec![("Authorization".to_owned(), format!("Bearer {KEY}"))];
        if body.is_some() {
            headers.push(("Content-Type".into(), "application/json".into()));
        }
        let body = body.map(|b| b.to_string().into_bytes());
        request(self.addr, method, path, &headers, body.as_deref())
    }

    pub fn execute(&self, body: Value) -> Response {
        self.call("POST", "/v1/execute", Some(&body))
    }

    /// Every log line so far, from the start.
    /// The log lines holding `what`, once there are at least `n` of them (up to 10 s): a
    /// request's log line is written when its answer is done, which the client may see first.
    pub fn wait_log_lines(&self, what: &str, n: usize) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let found: Vec<String> = self
                .log_lines()
                .into_iter()
                .filter(|l| l.contains(what))
                .collect();
            if found.len() >= n || std::time::Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_lines(&self) -> Vec<String> {
        let mut seen = self.seen.borrow_mut();
        seen.extend(self.log.try_iter());
        seen.clone()
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    /// As `stop`, keeping the directory for `start_in`.
    pub fn stop_keeping_state(mut self) -> PathBuf {
        self.keep_dir = true;
        assert!(self.terminate().success());
        self.dir.clone()
    }

    /// Kills the server outright (SIGKILL: it cleans up nothing) and keeps its directory.
    pub fn kill_keeping_state(mut self) -> PathBuf {
        self.keep_dir = true;
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.dir.clone()
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM);
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The error code of an error body.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }
}

/// Resident memory (VmRSS) of process `pid`, in bytes.
pub fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib * 1024
}

/// One request on a new connection (`Connection: close`), Host set to the server's address.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: Option<&[u8]>,
) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    if let Some(b) = body {
        s.write_all(b).unwrap();
    }
    read_response(&mut s).expect("a response")
}

/// Reads one response: head, then a body by Content-Length, chunks, or to EOF.
pub fn read_response(s: &mut impl Read) -> Option<Response> {
    let mut reader = BufReader::new(s);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).ok()?;
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':')?;
        headers
            .entry(k.trim().to_ascii_lowercase())
            .and_modify(|e: &mut String| {
                e.push_str(", ");
                e.push_str(v.trim());
            })
            .or_insert_with(|| v.trim().to_owned());
    }
    let mut body = Vec::new();
    if let Some(n) = headers
        .get("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        body.resize(n, 0);
        reader.read_exact(&mut body).ok()?;
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        while let Some(chunk) = read_chunk(&mut reader)? {
            body.extend_from_slice(&chunk);
        }
    } else {
        let _ = reader.read_to_end(&mut body);
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

/// The next chunk of a chunked body: `Some(None)` at its last (empty) chunk, `None` when the
/// body breaks off.
fn read_chunk(reader: &mut impl BufRead) -> Option<Option<Vec<u8>>> {
    let mut size = String::new();
    reader.read_line(&mut size).ok()?;
    let n = usize::from_str_radix(size.trim(), 16).ok()?;
    if n == 0 {
        return Some(None);
    }
    let mut chunk = vec![0; n + 2];
    reader.read_exact(&mut chunk).ok()?;
    chunk.truncate(n);
    Some(Some(chunk))
}

/// A response of server-sent events, read event by event from its chunked body as it comes.
pub struct EventStream {
    reader: BufReader<TcpStream>,
    buffer: Vec<u8>,
    /// Comment-only blocks (`: keep-alive`) seen so far: clients skip them.
    pub comments: usize,
    pub status: u16,
    pub content_type: String,
}

/// One event: its `id:` (if it had one), `event:` name and `data:` as JSON.
#[derive(Debug, PartialEq)]
pub struct SseEvent {
    pub id: Option<u64>,
    pub name: String,
    pub data: Value,
}

impl EventStream {
    /// Sends `request` (its head and body, whole) to `addr` and reads the answer's head.
    pub fn send(addr: SocketAddr, request: &str) -> EventStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut reader = BufReader::new(s);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).unwrap();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let mut content_type = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-type:") {
                content_type = v.trim().to_owned();
            }
        }
        EventStream {
            reader,
            buffer: Vec::new(),
            comments: 0,
            status,
            content_type,
        }
    }

    /// The next event; `None` at the end of the body.
    pub fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8(raw).expect("events are UTF-8");
                if text.lines().all(|l| l.is_empty() || l.starts_with(':')) {
                    self.comments += 1;
                    continue;
                }
                let (mut id, mut name, mut data) = (None, String::new(), String::new());
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        name = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                return Some(SseEvent {
                    id,
                    name,
                    data: serde_json::from_str(&data).unwrap(),
                });
            }
            let chunk = read_chunk(&mut self.reader)??;
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

/// Whether the server closed `s` (EOF or reset) within `within`.
pub fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // a response before closing (408, 503) is fine
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// A request as `key` (a bearer token), with a JSON body when there is one.
pub fn call_as(
    addr: std::net::SocketAddr,
    key: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Response {
    let mut headers = vec![("Authorization".to_owned(), format!("Bearer {key}"))];
    if body.is_some() {
        headers.push(("Content-Type".into(), "application/json".into()));
    }
    let body = body.map(|b| b.to_string().into_bytes());
    request(addr, method, path, &headers, body.as_deref())
}
