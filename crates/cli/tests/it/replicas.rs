//! Several replicas behind one balancer, for real: a PostgreSQL server (Debian's) holds the
//! records and audit lines, three `airlock serve` replicas share it, and HAProxy (Debian's)
//! routes on the replica an id names and round-robins the rest, as docs/deploying.md "Several replicas"
//! says to. Sessions and records work through the balancer; a replica killed with SIGKILL and
//! started again loses no record.

use crate::common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http::{call_as, Server, KEY};
use common::*;
use serde_json::{json, Value};

const DB_PASSWORD: &str = "pg-test-password-0123";

/// A free loopback port (bound, then released for the program that takes it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A PostgreSQL cluster of its own in a scratch directory, run as the `postgres` user.
struct Postgres {
    child: Child,
    dir: PathBuf,
    port: u16,
}

/// `dir` and what it holds, owned by the `postgres` user (the server runs as it).
fn give_to_postgres(dir: &Path) {
    let chown = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .status()
        .unwrap();
    assert!(chown.success());
}

fn pg_bin(name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed (scripts/test.sh installs it)")
        .filter_map(|e| Some(e.ok()?.path().join("bin").join(name)))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found
        .pop()
        .unwrap_or_else(|| panic!("no {name} under /usr/lib/postgresql"))
}

impl Postgres {
    fn start() -> Postgres {
        Postgres::start_with(false)
    }

    /// With `tls`, the server offers TLS with a certificate for 127.0.0.1 signed by a CA of
    /// the test's own (`ca.crt` in its directory).
    fn start_with(tls: bool) -> Postgres {
        let dir = scratch_dir("airlock-pg").into_path();
        let data = dir.join("data");
        std::fs::write(dir.join("pw"), DB_PASSWORD).unwrap();
        give_to_postgres(&dir);
        let initdb = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_bin("initdb"))
            .args(["-U", "airlock", "-A", "scram-sha-256", "--pwfile"])
            .arg(dir.join("pw"))
            .arg("-D")
            .arg(&data)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(
            initdb.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        if tls {
            make_certificates(&dir);
            let conf = data.join("postgresql.conf");
            let mut text = std::fs::read_to_string(&conf).unwrap();
            text += &format!(
                "ssl = on\nssl_cert_file = '{0}/server.crt'\nssl_key_file = '{0}/server.key'\n",
                dir.display()
            );
            std::fs::write(&conf, text).unwrap();
            give_to_postgres(&dir);
        }
        let port = free_port();
        let child = Postgres::spawn(&dir, port);
        Postgres { child, dir, port }
    }

    fn spawn(dir: &Path, port: u16) -> Child {
        // setpriv execs the server itself, so that the signal at drop reaches it.
        let child = Command::new("setpriv")
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(pg_bin("postgres"))
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-c", "listen_addresses=127.0.0.1", "-p", &port.to_string()])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_port(port, "PostgreSQL");
        child
    }

    /// Stops the server (a fast shutdown: clients are disconnected), woken first if a test
    /// that failed left it stopped with SIGSTOP.
    fn stop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return; // stopped already
        }
        for pid in postgres_processes(self) {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGCONT);
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::SIGINT,
        );
        let _ = self.child.wait();
    }

    /// Starts it again on the same data and port.
    fn restart(&mut self) {
        self.child = Postgres::spawn(&self.dir, self.port);
    }

    fn url(&self) -> String {
        format!("postgres://airlock@127.0.0.1:{}/postgres", self.port)
    }

    /// One value from `psql`.
    fn query(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "airlock", "-d", "postgres", "-Atc", sql])
            .env("PGPASSWORD", DB_PASSWORD)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA and a server certificate for 127.0.0.1 it signs, in `dir`.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=airlock test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ]);
    std::fs::set_permissions(
        dir.join("server.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
}

/// HAProxy routing on the replica in `/v1/sessions/<id>` and `/v1/executions/<id>`, the
/// recipe of docs/deploying.md "Several replicas".
struct Haproxy {
    child: Child,
    port: u16,
    dir: PathBuf,
}

/// deploy/kubernetes/base/haproxy.cfg, the router the Kubernetes manifests run, with
/// loopback addresses for the replicas' names and the lines of replicas not started dropped.
fn haproxy_config(port: u16, replicas: &[(&str, u16)]) -> String {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes/base/haproxy.cfg"
    ))
    .unwrap();
    assert!(shipped.contains("\n    bind :8080\n"));
    let mut cfg = String::new();
    for line in shipped.lines() {
        let named = (0..8).find(|n| line.contains(&format!("airlock-{n}")));
        if named.is_some_and(|n| n >= replicas.len()) {
            continue;
        }
        let mut line = line.replace("bind :8080", &format!("bind 127.0.0.1:{port}"));
        for (name, p) in replicas {
            line = line.replace(
                &format!("{name}.airlock-replicas.airlock.svc.cluster.local:8080"),
                &format!("127.0.0.1:{p}"),
            );
        }
        cfg += &line;
        cfg.push('\n');
    }
    assert!(!cfg.contains("svc.cluster.local"), "{cfg}");
    cfg
}

impl Haproxy {
    fn start(replicas: &[(&str, u16)]) -> Haproxy {
        let dir = scratch_dir("airlock-haproxy").into_path();
        let port = free_port();
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, haproxy_config(port, replicas)).unwrap();
        let check = Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "haproxy -c: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_port(port, "HAProxy");
        Haproxy { child, port, dir }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn replica_config(name: &str, pg: &Postgres, password_file: Option<&Path>) -> String {
    // HAProxy checks /readyz without a key, as the Kubernetes configuration lets it.
    let mut cfg = format!(
        "replica = \"{name}\"\n[http]\nreadyz_without_key = true\n[store]\nurl = \"{}\"\n",
        pg.url()
    );
    if let Some(file) = password_file {
        cfg += &format!("password_file = \"{}\"\n", file.display());
    }
    cfg
}

/// Starts replica `name` on `port` in `dir` (kept across a restart).
fn start_replica(name: &str, port: u16, dir: PathBuf, pg: &Postgres) -> Server {
    // One replica reads the password from a file, the others from the environment.
    let listen = format!("127.0.0.1:{port}");
    if name == "airlock-0" {
        let file = pg.dir.join("pw");
        Server::start_in(
            dir,
            &replica_config(name, pg, Some(&file)),
            &[("AIRLOCK_LISTEN", &listen)],
            Some(KEY),
        )
    } else {
        Server::start_in(
            dir,
            &replica_config(name, pg, None),
            &[
                ("AIRLOCK_LISTEN", &listen),
                ("AIRLOCK_STORE_PASSWORD", DB_PASSWORD),
            ],
            Some(KEY),
        )
    }
}

fn replica_dir(name: &str) -> PathBuf {
    let dir = scratch_dir(&format!("airlock-replica-{name}")).into_path();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn call(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let r = call_as(addr, KEY, method, path, body);
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

/// `POST /v1/execute` of `code` at `addr`.
fn execute(addr: SocketAddr, code: &str) -> (u16, Value) {
    call(addr, "POST", "/v1/execute", Some(&json!({"code": code})))
}

#[test]
fn sessions_and_records_work_through_a_balancer_and_a_killed_replica_loses_no_record() {
    let _g = serial();
    let pg = Postgres::start(); // its shared memory segment is no sandbox's
    let before = HostState::now();
    let names = ["airlock-0", "airlock-1", "airlock-2"];
    let ports: Vec<u16> = names.iter().map(|_| free_port()).collect();
    let mut replicas: Vec<Option<Server>> = names
        .iter()
        .zip(&ports)
        .map(|(n, p)| Some(start_replica(n, *p, replica_dir(n), &pg)))
        .collect();
    let routes: Vec<(&str, u16)> = names.iter().copied().zip(ports.iter().copied()).collect();
    let lb = Haproxy::start(&routes);
    let via = lb.addr();

    // One-shot executions go anywhere; each record is then read through the balancer,
    // which routes on the replica its id names.
    let mut ids = Vec::new();
    for i in 0..9 {
        let (status, r) = call(
            via,
            "POST",
            "/v1/execute",
            Some(&json!({"code": format!("print({i} * 2)")})),
        );
        assert_eq!(
            (status, &r["stdout"]),
            (200, &json!(format!("{}\n", i * 2))),
            "{r}"
        );
        ids.push(r["id"].as_str().unwrap().to_owned());
    }
    for name in names {
        assert!(
            ids.iter().any(|id| id.starts_with(&format!("ex_{name}_"))),
            "round robin reached every replica: {ids:?}"
        );
    }
    for id in &ids {
        let (status, record) = call(via, "GET", &format!("/v1/executions/{id}"), None);
        assert_eq!(
            (status, record["id"].as_str()),
            (200, Some(id.as_str())),
            "{record}"
        );
        assert_eq!(record["status"], "ok");
    }
    // The store makes every record every replica's: asked directly, any replica has it.
    let (status, record) = call(
        replicas[2].as_ref().unwrap().addr,
        "GET",
        &format!("/v1/executions/{}", ids[0]),
        None,
    );
    assert_eq!((status, &record["id"]), (200, &json!(ids[0])), "{record}");
    assert_eq!(
        pg.query("SELECT count(*) FROM airlock_audit WHERE event = 'record'"),
        "9"
    );
    assert_eq!(pg.query("SELECT max(version) FROM airlock_migrations"), "1");

    // A session lives on one replica; its cells, through the balancer, all reach it.
    let (status, opened) = call(via, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{opened}");
    let session = opened["id"].as_str().unwrap().to_owned();
    let holder = names
        .iter()
        .position(|n| session.starts_with(&format!("se_{n}_")))
        .unwrap_or_else(|| panic!("the id names its replica: {session}"));
    let path = format!("/v1/sessions/{session}/execute");
    call(via, "POST", &path, Some(&json!({"code": "n = 0"})));
    for i in 1..=6 {
        let (status, r) = call(
            via,
            "POST",
            &path,
            Some(&json!({"code": "n += 1\nprint(n)"})),
        );
        assert_eq!(
            (status, &r["stdout"]),
            (200, &json!(format!("{i}\n"))),
            "{r}"
        );
    }
    // Sent straight to another replica, the request is refused and says where it belongs.
    let other = (holder + 1) % names.len();
    let (status, r) = call(
        replicas[other].as_ref().unwrap().addr,
        "POST",
        &path,
        Some(&json!({"code": "1"})),
    );
    assert_eq!(status, 404, "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("replica {}", names[holder])),
        "{r}"
    );
    let (status, _) = call(via, "DELETE", &format!("/v1/sessions/{session}"), None);
    assert_eq!(status, 204);

    // Nothing runs now: nothing is left of the executions and the session.
    HostState::now().assert_same_as(&before, &"three replicas, idle");

    // airlock-1 is killed in the middle of an execution, with a session open; the execution's
    // record is written by airlock-1 when it comes back, and the session is lost, not unknown.
    let r1 = replicas[1].take().unwrap();
    let (status, opened) = call(r1.addr, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{opened}");
    let lost = opened["id"].as_str().unwrap().to_owned();
    let addr = r1.addr;
    let runner = std::thread::spawn(move || {
        call(
            addr,
            "POST",
            "/v1/execute",
            Some(&json!({"code": "import time\ntime.sleep(60)"})),
        )
    });
    // Its `started` row is committed about a round trip after it starts.
    let unended = "SELECT coalesce(string_agg(execution_id, ','), '') FROM airlock_audit s \
        WHERE event = 'started' AND replica = 'airlock-1' AND NOT EXISTS (SELECT 1 FROM airlock_audit r \
        WHERE r.execution_id = s.execution_id AND r.event = 'record')";
    let deadline = Instant::now() + Duration::from_secs(20);
    while pg.query(unended).is_empty() {
        assert!(Instant::now() < deadline, "the execution never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300)); // in its sandbox, not before it
    let dir = r1.kill_keeping_state();
    let _ = runner.join();
    let open = pg.query(unended);
    assert!(
        open.starts_with("ex_airlock-1_"),
        "the killed execution has no record yet: {open:?}"
    );
    // Meanwhile the balancer's other replicas keep serving.
    let (status, _) = call(
        replicas[0].as_ref().unwrap().addr,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "1"})),
    );
    assert_eq!(status, 200);
    replicas[1] = Some(start_replica("airlock-1", ports[1], dir, &pg));
    // The killed replica's sandboxes die with it; their processes stay as zombies on a host
    // whose PID 1 does not reap orphans, so the final check compares with now.
    std::thread::sleep(Duration::from_secs(1));
    let before = HostState::now();
    let (status, record) = call(via, "GET", &format!("/v1/executions/{open}"), None);
    assert_eq!(status, 200, "{record}");
    assert_eq!(
        (&record["status"], &record["interrupted"]),
        (&json!("internal_error"), &json!(true)),
        "{record}"
    );
    let (status, r) = call(
        via,
        "POST",
        &format!("/v1/sessions/{lost}/execute"),
        Some(&json!({"code": "1"})),
    );
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (410, Some("session_lost")),
        "{r}"
    );

    // Every execution that started has exactly one record, the database says.
    assert_eq!(
        pg.query(
            "SELECT count(*) FROM airlock_audit s WHERE event = 'started' AND (SELECT count(*) \
             FROM airlock_audit r WHERE r.execution_id = s.execution_id AND r.event = 'record') <> 1"
        ),
        "0"
    );
    let started = pg.query("SELECT count(*) FROM airlock_audit WHERE event = 'started'");
    assert_eq!(
        started,
        pg.query("SELECT count(*) FROM airlock_audit WHERE event = 'record'")
    );

    for (name, r) in names.iter().zip(replicas.iter_mut()) {
        let r = r.take().unwrap();
        let log = r.log_lines();
        let status = r.stop();
        assert!(status.success(), "{name}: {status}: {log:#?}");
    }
    HostState::now().assert_same_as(&before, &"three replicas stopped");
}

/// `airlock serve` with `config` in a scratch directory, until it exits: its exit code and
/// what it said (for configurations that must not start).
fn start_once(config: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = replica_dir("once");
    std::fs::write(dir.join("airlock.toml"), config).unwrap();
    let out = airlock()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join("airlock.toml"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .envs(env.iter().copied())
        .env("AIRLOCK_API_KEY", KEY)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_replica_refuses_to_start_on_a_store_it_cannot_use() {
    let _g = serial();
    let pg = Postgres::start();
    let url = pg.url();
    // No replica name: the store could not tell its executions from another replica's.
    let (code, err) = start_once(&format!("[store]\nurl = \"{url}\"\n"), &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("replica"), "{err}");
    // A password in the URL would be printed by --print-config.
    let with_password = url.replace("airlock@", "airlock:secret@");
    let (code, err) = start_once(
        &format!("replica = \"r0\"\n[store]\nurl = \"{with_password}\"\n"),
        &[],
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("password_file"), "{err}");
    // A wrong password: the server's own message, and no start.
    let (code, err) = start_once(
        &format!("replica = \"r0\"\n[store]\nurl = \"{url}\"\n"),
        &[("AIRLOCK_STORE_PASSWORD", "wrong")],
    );
    assert_ne!(code, Some(0));
    assert!(
        err.contains("PostgreSQL") && err.contains("password"),
        "{err}"
    );
    // Another host without sslmode=require: TLS could be turned off on the path.
    let (code, err) = start_once(
        "replica = \"r0\"\n[store]\nurl = \"postgres://airlock@db.example:5432/airlock\"\n",
        &[],
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("sslmode=require"), "{err}");
    // A replica name that is no DNS label.
    let (code, err) = start_once("replica = \"R_1\"\n", &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("DNS label"), "{err}");
}

#[test]
fn while_the_database_is_down_executions_are_refused_and_no_line_is_lost() {
    let _g = serial();
    let mut pg = Postgres::start();
    let server = start_replica("airlock-0", free_port(), replica_dir("airlock-0"), &pg);
    let run = |code: &str| execute(server.addr, code);
    assert_eq!(run("print(1)").0, 200);

    pg.stop();
    // The first execution may start before the writer finds out; its lines are kept.
    let (status, r) = run("print(2)");
    assert!(status == 200 || status == 503, "{status} {r}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = call_as(
            server.addr,
            KEY,
            "POST",
            "/v1/execute",
            Some(&json!({"code": "print(3)"})),
        );
        let body = r.json();
        if r.status == 503 {
            assert_eq!(body["error"]["code"], "unavailable", "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("PostgreSQL"),
                "{body}"
            );
            // A refusal says when to come back: the second after which the writer has
            // tried again (the Python client retries only answers that say it).
            assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
            break;
        }
        assert_eq!(r.status, 200, "{body}");
        assert!(Instant::now() < deadline, "executions never refused");
        std::thread::sleep(Duration::from_millis(100));
    }
    let ready = call_as(server.addr, KEY, "GET", "/readyz", None);
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(
        ready.header("retry-after"),
        Some("1"),
        "{:?}",
        ready.headers
    );

    pg.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    while run("print(4)").0 != 200 {
        assert!(Instant::now() < deadline, "executions never resumed");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(call(server.addr, "GET", "/readyz", None).0, 200);
    // Every execution that started has exactly one record, and the gap is marked.
    assert!(server.stop().success());
    assert_eq!(
        pg.query(
            "SELECT count(*) FROM airlock_audit s WHERE event = 'started' AND (SELECT count(*) \
             FROM airlock_audit r WHERE r.execution_id = s.execution_id AND r.event = 'record') <> 1"
        ),
        "0"
    );
    assert_eq!(
        pg.query("SELECT count(*) FROM airlock_audit WHERE event = 'started'"),
        pg.query("SELECT count(*) FROM airlock_audit WHERE event = 'record'")
    );
    assert_eq!(
        pg.query("SELECT count(*) FROM airlock_audit WHERE event = 'audit_resumed'"),
        "1"
    );
}

#[test]
fn the_store_speaks_tls_verified_against_the_configured_ca_and_sslmode_require_refuses_less() {
    let _g = serial();
    let pg = Postgres::start_with(true);
    let ca = pg.dir.join("ca.crt");
    let url = format!("{}?sslmode=require", pg.url());
    let config =
        |extra: &str| format!("replica = \"airlock-0\"\n[store]\nurl = \"{url}\"\n{extra}");
    let env = [("AIRLOCK_STORE_PASSWORD", DB_PASSWORD)];
    // Verified against the test's CA: it works, and the server sees TLS.
    let server = Server::start_in(
        replica_dir("airlock-0"),
        &config(&format!("ca_file = \"{}\"\n", ca.display())),
        &env,
        Some(KEY),
    );
    let (status, r) = call(
        server.addr,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "print(5)"})),
    );
    assert_eq!((status, &r["stdout"]), (200, &json!("5\n")), "{r}");
    let encrypted = pg.query(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
         WHERE application_name = 'airlock' AND ssl",
    );
    assert_ne!(encrypted, "0");
    assert_eq!(
        pg.query(
            "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
             WHERE application_name = 'airlock' AND NOT ssl"
        ),
        "0"
    );
    assert!(server.stop().success());

    let refused = |config: &str| {
        let (code, err) = start_once(config, &env);
        assert_ne!(code, Some(0));
        err
    };
    // A certificate no known authority signed: refused, saying so.
    let err = refused(&config(""));
    assert!(err.contains("TLS") || err.contains("certificate"), "{err}");
    // sslmode=require against a server without TLS: refused, nothing sent in the clear.
    let plain = Postgres::start();
    let err = refused(&format!(
        "replica = \"airlock-0\"\n[store]\nurl = \"{}?sslmode=require\"\n",
        plain.url()
    ));
    assert!(err.contains("TLS") || err.contains("SSL"), "{err}");
}

/// A TCP relay to PostgreSQL that can lose one acknowledgement: told to, it drops the next
/// bytes the database sends that complete an INSERT (its `CommandComplete`, which the server
/// flushes with `ReadyForQuery`, after the commit) and closes both sides, as a network that
/// fails after a commit and before its acknowledgement arrives does.
struct Relay {
    port: u16,
    lose_next: Arc<AtomicBool>,
}

impl Relay {
    fn start(to: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let lose_next = Arc::new(AtomicBool::new(false));
        let lose = lose_next.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let (back, forth) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || relay(client, server, None));
                let lose = lose.clone();
                std::thread::spawn(move || relay(forth, back, Some(lose)));
            }
        });
        Relay { port, lose_next }
    }
}

fn relay(mut from: TcpStream, mut to: TcpStream, lose: Option<Arc<AtomicBool>>) {
    let mut buf = [0u8; 65536];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let completes_insert = buf[..n].windows(9).any(|w| w == b"INSERT 0 ");
        if completes_insert
            && lose
                .as_ref()
                .is_some_and(|l| l.swap(false, Ordering::SeqCst))
        {
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

fn count(pg: &Postgres, condition: &str) -> u64 {
    pg.query(&format!(
        "SELECT count(*) FROM airlock_audit WHERE {condition}"
    ))
    .parse()
    .unwrap()
}

/// `started` rows without exactly one row of the `events` (an SQL list) for their execution.
fn started_without_exactly_one(pg: &Postgres, events: &str) -> u64 {
    count(
        pg,
        &format!(
            "event = 'started' AND (SELECT count(*) FROM airlock_audit r WHERE \
             r.execution_id = airlock_audit.execution_id AND r.event IN ({events})) <> 1"
        ),
    )
}

#[test]
fn no_line_stops_or_doubles_the_others_refused_as_data_a_nul_a_lost_acknowledgement() {
    let _g = serial();
    let pg = Postgres::start();
    let relay = Relay::start(pg.port);
    // The key may call the tools of tool_server.py, so that a sandbox can name a tool.
    let config = format!(
        "replica = \"airlock-0\"\n[store]\nurl = \"postgres://airlock@127.0.0.1:{port}/postgres\"\n\
         [tools.servers.crm]\ncommand = \"{python}\"\nargs = [\"{script}\", \"stdio\"]\n\
         [[keys]]\nname = \"agent\"\nhash = \"{hash}\"\ntools = [\"crm.*\"]\n",
        port = relay.port,
        python = mcp_python().display(),
        script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tool_server.py"),
        hash = key_hash(KEY),
    );
    let server = Server::start_in(
        replica_dir("airlock-0"),
        &config,
        &[("AIRLOCK_STORE_PASSWORD", DB_PASSWORD)],
        None,
    );
    let run = |code: &str| execute(server.addr, code);
    let (status, r) = run("print(1)");
    assert_eq!(status, 200, "{r}");

    // A line the database refuses as data: a trigger refuses the record of any execution
    // that exits 7, standing for whatever a line might one day hold that it cannot store.
    pg.query(
        "CREATE FUNCTION refuse_exit_7() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.line->>'exit_code' = '7' THEN \
             RAISE EXCEPTION 'refused as data' USING ERRCODE = '22023'; \
           END IF; RETURN NEW; END $$; \
         CREATE TRIGGER refuse_exit_7 BEFORE INSERT ON airlock_audit \
           FOR EACH ROW EXECUTE FUNCTION refuse_exit_7()",
    );
    let (status, refused) = run("import sys\nsys.exit(7)");
    assert_eq!(
        (status, &refused["exit_code"]),
        (200, &json!(7)),
        "{refused}"
    );
    let (status, after) = run("print(8)");
    assert_eq!((status, &after["stdout"]), (200, &json!("8\n")), "{after}");
    assert_eq!(
        count(
            &pg,
            &format!(
                "event = 'audit_unstorable' AND execution_id = '{}' \
                 AND line->>'text' LIKE '%\"exit_code\":7%' \
                 AND line->>'error' LIKE '%refused as data%'",
                refused["id"].as_str().unwrap()
            )
        ),
        1
    );
    let record_of = |r: &Value| {
        format!(
            "event = 'record' AND execution_id = '{}'",
            r["id"].as_str().unwrap()
        )
    };
    assert_eq!(count(&pg, &record_of(&after)), 1);

    // A NUL in a tool's name, which the sandbox chooses and jsonb refuses: stored as U+FFFD.
    let (status, r) = run("import tools\n\
         call = tools.crm.add.__globals__['_airlock_call']\n\
         try:\n    call(('crm', 'a\\x00b'), (), {})\n\
         except tools.ToolError as e:\n    print(e.kind)\n");
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        count(
            &pg,
            "event = 'tool_call' AND line->>'tool' = 'a' || chr(65533) || 'b'"
        ),
        1
    );

    // A lost acknowledgement: the record's commit is made, its answer never arrives, the
    // writer connects again and sends the line again, which adds nothing.
    let started = count(&pg, "event = 'started'");
    let slow = std::thread::scope(|s| {
        let answer = s.spawn(|| run("import time\ntime.sleep(2)\nprint('slow')"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while count(&pg, "event = 'started'") == started {
            assert!(
                Instant::now() < deadline,
                "the slow execution never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Its `started` row's acknowledgement has long passed; the record's is next.
        std::thread::sleep(Duration::from_millis(500));
        relay.lose_next.store(true, Ordering::SeqCst);
        answer.join().unwrap()
    });
    assert_eq!(
        (slow.0, &slow.1["stdout"]),
        (200, &json!("slow\n")),
        "{slow:?}"
    );
    assert!(
        !relay.lose_next.load(Ordering::SeqCst),
        "an answer was lost"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while count(&pg, "event = 'audit_resumed'") == 0 {
        assert!(Instant::now() < deadline, "the writer never wrote again");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(count(&pg, &record_of(&slow.1)), 1);
    let (status, r) = run("print(9)");
    assert_eq!(status, 200, "{r}");
    assert!(server.stop().success());
    assert_eq!(count(&pg, "event = 'audit_resumed'"), 1);
    // Every execution has one `started` row and one record (or its unstorable stand-in).
    assert_eq!(
        started_without_exactly_one(&pg, "'record', 'audit_unstorable'"),
        0
    );
}

/// The PostgreSQL server's processes (the postmaster and its children).
fn postgres_processes(pg: &Postgres) -> Vec<nix::unistd::Pid> {
    let main = pg.child.id();
    let out = Command::new("pgrep")
        .args(["-P", &main.to_string()])
        .output()
        .unwrap();
    let mut pids = vec![nix::unistd::Pid::from_raw(main as i32)];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        pids.push(nix::unistd::Pid::from_raw(line.trim().parse().unwrap()));
    }
    pids
}

#[test]
fn a_database_that_stops_answering_fails_the_store_and_reads_answer_503_not_never() {
    let _g = serial();
    let pg = Postgres::start();
    let server = start_replica("airlock-0", free_port(), replica_dir("airlock-0"), &pg);
    let run = |code: &str| execute(server.addr, code);
    let (status, first) = run("print(1)");
    assert_eq!(status, 200, "{first}");

    // Stopped, the server's kernel still takes what is sent: only airlock's own clock can
    // tell that no commit is coming.
    let stopped = postgres_processes(&pg);
    for pid in &stopped {
        nix::sys::signal::kill(*pid, nix::sys::signal::SIGSTOP).unwrap();
    }
    let refused = call_as(
        server.addr,
        KEY,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "print(2)"})),
    );
    let r = refused.json();
    assert_eq!(refused.status, 503, "{r}");
    // The waiter's clock or the writer's deadline, whichever ends first: both are 10 s.
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("PostgreSQL") && message.contains("in 10 s"),
        "{r}"
    );
    assert_eq!(refused.header("retry-after"), Some("1"), "{r}");
    let ready = call_as(server.addr, KEY, "GET", "/readyz", None);
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.header("retry-after"), Some("1"));
    // A record this replica does not hold in memory is read from the database: 503.
    let foreign = || {
        call_as(
            server.addr,
            KEY,
            "GET",
            "/v1/executions/ex_airlock-1_0123456789abcdef",
            None,
        )
    };
    let read = foreign();
    assert_eq!(
        (read.status, &read.json()["error"]["code"]),
        (503, &json!("unavailable")),
        "{}",
        read.text()
    );
    assert_eq!(read.header("retry-after"), Some("1"));
    // The writer itself gives up on the frozen connection (its own deadline, which the
    // server's `statement_timeout` and TCP's timeouts are not while the server is stopped)
    // before the database wakes.
    let gave_up = server.wait_log_lines("writing audit lines: no answer in 10 s", 1);
    assert!(!gave_up.is_empty(), "{:#?}", server.log_lines());
    for pid in &stopped {
        nix::sys::signal::kill(*pid, nix::sys::signal::SIGCONT).unwrap();
    }

    let deadline = Instant::now() + Duration::from_secs(20);
    while run("print(3)").0 != 200 {
        assert!(Instant::now() < deadline, "executions never resumed");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(call(server.addr, "GET", "/readyz", None).0, 200);
    assert_eq!(foreign().status, 404);
    let (status, r) = call(
        server.addr,
        "GET",
        &format!("/v1/executions/{}", first["id"].as_str().unwrap()),
        None,
    );
    assert_eq!(
        (status, &r["id"], &r["status"]),
        (200, &first["id"], &json!("ok")),
        "{r}"
    );
    assert!(server.stop().success());
    // The writer saw the failure and recovered from it: the gap is marked, once.
    assert_eq!(count(&pg, "event = 'audit_resumed'"), 1);
    // The refused execution's `started` row reached the database once it woke; its `not_run`
    // row says it never ran, so a restart finds nothing interrupted.
    assert!(count(&pg, "event = 'not_run'") >= 1);
    let server = start_replica("airlock-0", free_port(), replica_dir("airlock-0"), &pg);
    assert!(server.stop().success());
    assert_eq!(count(&pg, INTERRUPTED_RECORD), 0);
    assert_eq!(started_without_exactly_one(&pg, "'record', 'not_run'"), 0);
}

/// The records a restart made for executions it found unfinished.
const INTERRUPTED_RECORD: &str = "event = 'record' AND (line->>'interrupted')::boolean";

/// The lines `server`'s spool holds (the store's, in its state directory).
fn spooled(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("state").join("store-spool.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Runs `code` on `server` in a thread; returns once its `started` row is committed.
fn start_running(
    pg: &Postgres,
    addr: SocketAddr,
    code: &str,
) -> std::thread::JoinHandle<(u16, Value)> {
    let started = count(pg, "event = 'started'");
    let code = code.to_owned();
    let running = std::thread::spawn(move || execute(addr, &code));
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(pg, "event = 'started'") == started {
        assert!(Instant::now() < deadline, "the execution never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    running
}

#[test]
fn an_execution_answered_while_the_database_is_down_keeps_its_record_through_a_kill() {
    let _g = serial();
    let mut pg = Postgres::start();
    let port = free_port();
    let server = start_replica("airlock-0", port, replica_dir("airlock-0"), &pg);
    let code = "import time\ntime.sleep(2)\nprint('done')";

    // Running when the database goes: its `started` row is committed, its record cannot be.
    let running = start_running(&pg, server.addr, code);
    pg.stop();
    let (status, answered) = running.join().unwrap();
    assert_eq!(
        (status, &answered["status"], &answered["stdout"]),
        (200, &json!("ok"), &json!("done\n")),
        "{answered}"
    );
    let id = answered["id"].as_str().unwrap().to_owned();
    // Killed before the database comes back: only the local disk has the record now.
    let dir = server.kill_keeping_state();
    let kept = spooled(&dir);
    assert!(
        kept.iter().any(|l| l["line"]["id"] == json!(id)),
        "{kept:#?}"
    );
    pg.restart();
    let server = start_replica("airlock-0", port, dir, &pg);
    // The restart stored what was answered, not `interrupted`.
    assert_eq!(count(&pg, INTERRUPTED_RECORD), 0);
    assert_eq!(
        count(
            &pg,
            &format!("event = 'record' AND execution_id = '{id}' AND line->>'status' = 'ok'")
        ),
        1
    );
    let (status, record) = call(server.addr, "GET", &format!("/v1/executions/{id}"), None);
    assert_eq!((status, &record["status"]), (200, &json!("ok")), "{record}");
    assert_ne!(record["interrupted"], json!(true), "{record}");
    assert_eq!(spooled(&server.dir), Vec::<Value>::new());

    // Down again, and back while the replica runs: the writer commits the spooled record
    // once (the spool and its memory both hold it) and empties the spool.
    let running = start_running(&pg, server.addr, code);
    pg.stop();
    let (status, answered) = running.join().unwrap();
    assert_eq!(
        (status, &answered["status"]),
        (200, &json!("ok")),
        "{answered}"
    );
    let id = answered["id"].as_str().unwrap().to_owned();
    let kept = spooled(&server.dir);
    assert!(
        kept.iter().any(|l| l["line"]["id"] == json!(id)),
        "{kept:#?}"
    );
    pg.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !spooled(&server.dir).is_empty() {
        assert!(Instant::now() < deadline, "the spool was never replayed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        count(&pg, &format!("event = 'record' AND execution_id = '{id}'")),
        1
    );
    assert!(server.stop().success());
    assert_eq!(count(&pg, "event = 'audit_resumed'"), 1);
    assert_eq!(count(&pg, INTERRUPTED_RECORD), 0);
    assert_eq!(started_without_exactly_one(&pg, "'record'"), 0);
}
