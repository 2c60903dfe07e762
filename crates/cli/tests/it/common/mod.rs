//! Helpers for tests that drive the real `airlock` binary on the real kernel.
//!
//! Every sandbox a test binary starts goes through [`run`], which holds [`SERIAL`] and compares
//! the host before and after: no process of a sandbox uid, no sandbox cgroup, no mount, no SysV
//! IPC object and no file owned by a sandbox uid may be left behind. [`invoke`], which checks
//! nothing, shares [`SERIAL`] with other such calls, so that none of its sandboxes is running
//! while a test that holds it compares the host.
#![allow(dead_code)]

pub mod http;

use std::cell::Cell;
use std::fs;
use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde_json::Value;

/// Held alone by a test that compares the host before and after ([`serial`]), shared by the
/// calls that start sandboxes without comparing ([`invoke`]).
pub static SERIAL: RwLock<()> = RwLock::new(());

thread_local! {
    /// This thread holds [`SERIAL`] alone: its own calls need no share of it.
    static HOLDS_SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// [`SERIAL`], held alone until dropped.
pub struct Serial(#[allow(dead_code)] RwLockWriteGuard<'static, ()>);

impl Drop for Serial {
    fn drop(&mut self) {
        HOLDS_SERIAL.with(|h| h.set(false));
    }
}

pub fn serial() -> Serial {
    own();
    let guard = SERIAL.write().unwrap_or_else(|e| e.into_inner());
    HOLDS_SERIAL.with(|h| h.set(true));
    Serial(guard)
}

/// A share of [`SERIAL`] for a call that starts sandboxes, unless this thread holds it alone.
fn shared() -> Option<RwLockReadGuard<'static, ()>> {
    (!HOLDS_SERIAL.with(Cell::get)).then(|| SERIAL.read().unwrap_or_else(|e| e.into_inner()))
}

/// A key as `[[keys]]` stores it: `sha256:` and its hex SHA-256.
pub fn key_hash(key: &str) -> String {
    format!("sha256:{}", airlock_api::sha256_hex(key.as_bytes()))
}

pub fn airlock() -> Command {
    own();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock"));
    cmd.env("HOST_SECRET_CANARY", "host-secret-value");
    cmd
}

/// One finished `airlock` invocation.
#[derive(Debug)]
pub struct Run {
    pub exit: i32,
    pub stdout: String,
    pub stderr: String,
    pub json: Value,
}

impl Run {
    pub fn status(&self) -> &str {
        self.json["status"].as_str().unwrap_or("<none>")
    }

    pub fn stdout_text(&self) -> &str {
        self.json["stdout"].as_str().unwrap_or("")
    }

    pub fn result(&self) -> &Value {
        &self.json["result"]
    }

    pub fn limits_hit(&self) -> Vec<String> {
        self.json["limits_hit"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The program's stdout parsed as JSON (payloads print their findings with json.dumps).
    pub fn printed(&self) -> Value {
        serde_json::from_str(self.stdout_text().trim())
            .unwrap_or_else(|e| panic!("payload output is not JSON ({e}): {self:#?}"))
    }
}

fn finish(out: Output, json: bool) -> Run {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = if json {
        serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!("not one JSON object ({e}):\nstdout: {stdout}\nstderr: {stderr}")
        })
    } else {
        Value::Null
    };
    Run {
        exit: out.status.code().unwrap_or(-1),
        stdout,
        stderr,
        json,
    }
}

/// An `airlock` still running, its stdout read line by line.
pub struct Live {
    pub child: Child,
    pub lines: Lines<BufReader<ChildStdout>>,
}

impl Live {
    /// The next line airlock printed.
    pub fn line(&mut self) -> String {
        self.lines
            .next()
            .expect("airlock ended")
            .expect("read airlock's stdout")
    }
}

/// `airlock ARGS` with all three standard streams piped.
fn piped(args: &[&str]) -> Child {
    piped_env(args, &[])
}

fn piped_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Child {
    airlock()
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start airlock")
}

/// Starts `airlock ARGS`. With `code`, it is written to airlock's stdin, which is then closed;
/// without, stdin stays open in `child.stdin` for the test to feed.
pub fn start(args: &[&str], code: Option<&[u8]>) -> Live {
    let mut child = piped(args);
    if let Some(code) = code {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(code)
            .expect("write the code");
    }
    let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    Live { child, lines }
}

/// Runs `airlock ARGS` with `stdin` as its standard input, without the host checks.
pub fn invoke(args: &[&str], stdin: &[u8]) -> Run {
    invoke_env(args, stdin, &[])
}

/// As [`invoke`], with these environment variables set for airlock.
pub fn invoke_env(args: &[&str], stdin: &[u8], env: &[(&str, &std::ffi::OsStr)]) -> Run {
    let _shared = shared();
    let mut child = piped_env(args, env);
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait for airlock");
    let _ = writer.join();
    finish(out, args.contains(&"--json"))
}

/// A file or directory in the temporary directory, named after this test process, removed
/// when dropped: no test leaves anything behind.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    fn named(name: &str) -> Scratch {
        Scratch(std::env::temp_dir().join(format!("airlock-test-{}-{name}", std::process::id())))
    }

    /// The path, for an owner that removes it itself (a `Server`, its directory).
    pub fn into_path(mut self) -> PathBuf {
        std::mem::take(&mut self.0)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = fs::remove_dir_all(&self.0);
        } else if !self.0.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.0);
        }
    }
}

/// A file in the temporary directory, named after this test process.
pub fn temp_file(name: &str, contents: &[u8]) -> Scratch {
    let file = Scratch::named(name);
    fs::write(&file.0, contents).unwrap();
    file
}

/// An empty directory in the temporary directory, named after this test process.
pub fn scratch_dir(name: &str) -> Scratch {
    let dir = Scratch::named(name);
    let _ = fs::remove_dir_all(&dir.0);
    fs::create_dir_all(&dir.0).unwrap();
    dir
}

/// Runs `code` with `airlock run --json ARGS`, checking that the host is unchanged afterwards.
pub fn run(code: &str, args: &[&str]) -> Run {
    let _guard = serial();
    run_unlocked(code, args)
}

/// Set (by `scripts/test.sh`, for the jail, kernel and limits tests): every `run` goes
/// through `airlock run --zygote`, so that the same attacks meet a zygote's child.
pub const VIA_ZYGOTE: &str = "TEST_VIA_ZYGOTE";

pub fn via_zygote() -> bool {
    std::env::var_os(VIA_ZYGOTE).is_some()
}

/// As [`run`], for callers that already hold [`SERIAL`].
pub fn run_unlocked(code: &str, args: &[&str]) -> Run {
    let before = HostState::now();
    let mut all = vec!["run", "--json"];
    if via_zygote() {
        all.push("--zygote");
    }
    all.extend_from_slice(args);
    let run = invoke(&all, code.as_bytes());
    HostState::now().assert_same_as(&before, &run);
    run
}

/// Runs `code` and expects it to end with status `ok`, returning what it printed as JSON.
pub fn probe(code: &str) -> Value {
    let r = run(code, &[]);
    assert_eq!(r.status(), "ok", "{r:#?}");
    r.printed()
}

/// The first uid a sandbox can have on the host (see airlock_sandbox::HOST_ID_BASE).
const SANDBOX_UID_MIN: u32 = airlock_sandbox::HOST_ID_BASE;

/// A directory `base/state` on a tmpfs of its own of `size` (`mount -o size=`), for a test
/// that fills a state directory or measures its free space; unmounted, and `base` removed,
/// when dropped.
pub struct TmpfsState {
    pub base: PathBuf,
    pub state: PathBuf,
}

impl TmpfsState {
    pub fn mount(name: &str, size: &str) -> TmpfsState {
        let base = std::env::temp_dir().join(format!("airlock-{name}-{}", std::process::id()));
        let state = base.join("state");
        fs::create_dir_all(&state).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("airlock-test")
            .arg(&state)
            .status()
            .unwrap();
        assert!(mounted.success(), "mount tmpfs (the suite runs as root)");
        TmpfsState { base, state }
    }
}

impl Drop for TmpfsState {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.state).status();
        let _ = fs::remove_dir_all(&self.base);
    }
}

/// What must not change on the host because of a sandbox.
#[derive(Debug)]
pub struct HostState {
    sandbox_processes: Vec<String>,
    sandbox_cgroups: Vec<PathBuf>,
    mountinfo: String,
    sysv_ipc: Vec<String>,
    sandbox_owned_files: Vec<PathBuf>,
}

fn uid_of_status(status: &str) -> Option<u32> {
    status.lines().find_map(|l| {
        l.strip_prefix("Uid:")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// What tells the sandboxes of the airlock processes this test process starts from another
/// airlock's (see [`own`]).
struct Own {
    /// This process's own pids cgroup (cgroup v1), beneath which its airlocks make theirs.
    pids: Option<PathBuf>,
}

/// A test counts only the sandboxes of the airlock processes it started, whatever becomes of
/// another airlock's (a server beside the suite, one killed outright whose sandboxes are still
/// dying, another test binary's). Before it starts anything ([`serial`], [`airlock`],
/// [`HostState::now`]) this process makes sure the kernel keeps the difference:
/// - processes: it becomes a child subreaper, so what a process it started leaves when it
///   dies is handed to it instead of the host's PID 1. A process is this test's exactly when
///   this process is among its ancestors: its airlocks' orphans always, another airlock's
///   never.
/// - cgroups, on v1: it moves into a pids cgroup of its own beneath the one it was in. An
///   airlock makes its sandbox cgroups beneath its own, so those of the airlocks this process
///   starts have their pids part there, whatever became of those airlocks, and no other
///   airlock's has. Only `pids`, which only counts tasks: no limit, charge or CPU share
///   changes. Where it cannot (v2, a container's read-only cgroups), a sandbox cgroup is
///   someone else's while a live airlock this process did not start has it.
fn own() -> &'static Own {
    static OWN: std::sync::OnceLock<Own> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        nix::sys::prctl::set_child_subreaper(true).expect("prctl(PR_SET_CHILD_SUBREAPER)");
        Own {
            pids: own_pids_cgroup(),
        }
    })
}

/// Where [`own`] has this process move, beside its sandboxes' cgroups: `<prefix><pid>`.
const OWN_PIDS_PREFIX: &str = "airlock_tests_";

/// This process's own pids cgroup (see [`own`]), where it has one.
pub fn own_pids_cgroup_dir() -> Option<&'static Path> {
    own().pids.as_deref()
}

/// Moves this process into a pids cgroup of its own (see [`own`]) and returns it, where
/// `pids` has a cgroup v1 hierarchy to itself and this process may write there.
fn own_pids_cgroup() -> Option<PathBuf> {
    let here = v1_pids_cgroup()?;
    remove_stale_own_cgroups(&here);
    let own = here.join(format!("{OWN_PIDS_PREFIX}{}", std::process::id()));
    fs::create_dir(&own).ok()?;
    if fs::write(own.join("cgroup.procs"), std::process::id().to_string()).is_err() {
        let _ = fs::remove_dir(&own);
        return None;
    }
    Some(own)
}

/// This process's directory in a cgroup v1 hierarchy of `pids` alone (one of the hierarchies
/// airlock uses on v1, and the only one that holds it: on v2, none).
fn v1_pids_cgroup() -> Option<PathBuf> {
    // `<id>:<controllers>:<path>`: a v1 hierarchy names every controller it holds.
    let path = fs::read_to_string("/proc/self/cgroup")
        .ok()?
        .lines()
        .find_map(|l| Some(l.split_once(":pids:")?.1.to_owned()))?;
    fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let fs: Vec<&str> = fs.split(' ').collect();
            let options = fs.get(2)?.split(',');
            if fs[0] != "cgroup" || !options.clone().any(|o| o == "pids") {
                return None;
            }
            let mount: Vec<&str> = mount.split(' ').collect();
            let below = Path::new(&path).strip_prefix(mount.get(3)?).ok()?;
            Some(Path::new(mount.get(4)?).join(below))
        })
}

/// Removes what earlier test processes left of their own pids cgroups (no airlock works
/// beneath them once they are gone): empty sandbox cgroups, then the directory. A live test
/// process's stays, and so does a cgroup that still holds a process.
fn remove_stale_own_cgroups(here: &Path) {
    for entry in fs::read_dir(here).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(OWN_PIDS_PREFIX) else {
            continue;
        };
        let in_use = fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
            c.lines()
                .any(|l| l.contains(":pids:") && l.ends_with(&format!("/{name}")))
        });
        if in_use {
            continue;
        }
        for sandbox in fs::read_dir(entry.path()).into_iter().flatten().flatten() {
            if sandbox.path().is_dir() {
                let _ = fs::remove_dir(sandbox.path());
            }
        }
        let _ = fs::remove_dir(entry.path());
    }
}

/// `pid`'s state (`R`, `S`, `Z`...) and parent, from /proc/<pid>/stat.
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: the comm may hold spaces and parentheses.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Whether this test process is among `pid`'s ancestors (it is PID 1 where the pod test runs
/// it in a container).
fn descends_from_here(pid: u32) -> bool {
    let here = std::process::id();
    // An ancestor that was reaped while the chain was read handed its children on (to this
    // process or to their PID namespace's init) before it went: the chain is read again.
    'again: for _ in 0..16 {
        let mut at = pid;
        for _ in 0..256 {
            let Some((_, parent)) = state_and_parent(at) else {
                if at == pid {
                    return false;
                }
                continue 'again;
            };
            if parent == here {
                return true;
            }
            if parent == 0 {
                return false;
            }
            at = parent;
        }
        return false;
    }
    false
}

fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default()
}

/// A live airlock this test process did not start.
fn someone_elses_airlock(pid: u32) -> bool {
    comm(pid) == "airlock\n" && !descends_from_here(pid)
}

/// The airlock that made a sandbox cgroup named `airlock-<pid>-...`.
fn cgroup_creator(name: &str) -> Option<u32> {
    name.strip_prefix(airlock_sandbox::SANDBOX_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

fn sandbox_uid(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| uid_of_status(&s))
        .is_some_and(|u| u >= SANDBOX_UID_MIN)
}

/// Reaps the ended sandbox processes that were handed to this process (see
/// [`own`]), as the host's PID 1 would have. A sandbox's zombie whose own parent
/// lives is that parent's to reap, and still counts. No test starts a process with a sandbox's
/// uid itself, so none of these is a `Child` a test waits for.
fn reap_handed_over() {
    let here = std::process::id();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if state_and_parent(pid) == Some(('Z', here)) && sandbox_uid(pid) {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
    }
}

/// The processes of a sandbox uid that this test process's airlocks made (see
/// [`own`]), as `/proc/<pid> <command line>`.
pub fn sandbox_processes() -> Vec<String> {
    own();
    reap_handed_over();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if sandbox_uid(pid) && descends_from_here(pid) {
            let cmd = fs::read_to_string(path.join("cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
            found.push(format!("{} {}", path.display(), cmd));
        }
    }
    found.sort();
    found
}

/// Processes that are a sandbox's outer init (`airlock-sandbox __airlock-sandbox-init`), run
/// as root on the host, so not among `sandbox_processes`.
pub fn sandbox_inits() -> Vec<String> {
    own();
    reap_handed_over();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmd = fs::read_to_string(entry.path().join("cmdline")).unwrap_or_default();
        let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let pid = entry.file_name().to_string_lossy().parse().unwrap_or(0);
        // Executed as one, or forked ahead by `airlock run` and named so.
        if (cmd.split('\0').nth(1) == Some("__airlock-sandbox-init") || comm == "airlock-sandbox\n")
            && descends_from_here(pid)
        {
            found.push(entry.path().display().to_string());
        }
    }
    found.sort();
    found
}

/// The sandbox cgroups of the airlocks this test process started (see [`own`]): on v1 those
/// whose pids part is beneath this process's own, in every hierarchy; elsewhere every
/// `airlock-<pid>-<n>` beneath the cgroups this process runs in, but those of a live airlock it
/// did not start.
pub fn sandbox_cgroups() -> Vec<PathBuf> {
    let own = own();
    let Ok(layout) = &airlock_sandbox::host_support().cgroup else {
        return Vec::new();
    };
    let sandbox = |name: &str| {
        name.starts_with(airlock_sandbox::SANDBOX_PREFIX) && name != "airlock-supervisor"
    };
    let mut found = Vec::new();
    if let Some(pids) = &own.pids {
        assert!(
            layout.parents().contains(pids),
            "the host was probed before this process moved to {}",
            pids.display()
        );
        let names: Vec<String> = fs::read_dir(pids)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| sandbox(n))
            .collect();
        for parent in layout.parents() {
            found.extend(names.iter().map(|n| parent.join(n)).filter(|d| d.is_dir()));
        }
    } else {
        for parent in layout.parents() {
            for entry in fs::read_dir(&parent).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if sandbox(&name) && !cgroup_creator(&name).is_some_and(someone_elses_airlock) {
                    found.push(entry.path());
                }
            }
        }
    }
    found.sort();
    found
}

fn files_owned_by_sandboxes(dirs: &[&str]) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    for dir in dirs {
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.metadata().is_ok_and(|m| m.uid() >= SANDBOX_UID_MIN) {
                found.push(entry.path());
            }
        }
    }
    found
}

impl HostState {
    pub fn sandbox_processes(&self) -> &[String] {
        &self.sandbox_processes
    }

    pub fn sandbox_cgroups(&self) -> &[PathBuf] {
        &self.sandbox_cgroups
    }

    pub fn now() -> Self {
        own();
        let sysv_ipc = ["shm", "sem", "msg"]
            .iter()
            .map(|k| {
                // Each object's key and id only: attach counts and times change while another
                // program (a test's PostgreSQL) uses its own.
                fs::read_to_string(Path::new("/proc/sysvipc").join(k))
                    .unwrap_or_default()
                    .lines()
                    .skip(1)
                    .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" ") + "\n")
                    .collect()
            })
            .collect();
        HostState {
            sandbox_processes: sandbox_processes(),
            sandbox_cgroups: sandbox_cgroups(),
            mountinfo: fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            sysv_ipc,
            sandbox_owned_files: files_owned_by_sandboxes(&[
                "/tmp", "/var/tmp", "/dev/shm", "/root",
            ]),
        }
    }

    /// This test's sandbox processes now that were not there `before`.
    pub fn new_sandbox_processes(&self, before: &HostState) -> Vec<&String> {
        let was = &before.sandbox_processes;
        self.sandbox_processes
            .iter()
            .filter(|p| !was.contains(p))
            .collect()
    }

    /// This test's sandbox cgroups now that were not there `before`.
    pub fn new_sandbox_cgroups(&self, before: &HostState) -> Vec<&PathBuf> {
        let was = &before.sandbox_cgroups;
        self.sandbox_cgroups
            .iter()
            .filter(|c| !was.contains(c))
            .collect()
    }

    pub fn assert_same_as(&self, before: &HostState, context: &impl std::fmt::Debug) {
        // Compared with the state before, not with nothing: only what came since is this
        // test's doing.
        let new = self.new_sandbox_processes(before);
        assert!(
            new.is_empty(),
            "sandbox processes left: {new:?}\n{context:#?}"
        );
        let cgroups = self.new_sandbox_cgroups(before);
        assert!(
            cgroups.is_empty(),
            "sandbox cgroups left: {cgroups:?}\n{context:#?}"
        );
        // Processes and cgroups may only have gone (the host reaped old zombies meanwhile).
        assert_eq!(
            self.mountinfo, before.mountinfo,
            "mounts changed\n{context:#?}"
        );
        assert_eq!(
            self.sysv_ipc, before.sysv_ipc,
            "SysV IPC objects changed\n{context:#?}"
        );
        assert_eq!(
            self.sandbox_owned_files, before.sandbox_owned_files,
            "files of a sandbox uid\n{context:#?}"
        );
    }
}

/// A Python prelude for payloads that call the kernel directly.
pub const LIBC: &str = "import ctypes, os, json\nlibc = ctypes.CDLL(None, use_errno=True)\n";

/// What `cmd` does when its stdout is a pipe nobody reads (`… | head` once head is done): the
/// read end is closed before it starts, so every write it makes meets EPIPE.
pub fn with_stdout_gone(
    mut cmd: Command,
    stdin: Option<&str>,
) -> (std::process::ExitStatus, String) {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = cmd
        .stdout(writer)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Dropped at once: our own copy of the write end must not be what is left open.
    drop(cmd);
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        let _ = input.write_all(text.as_bytes());
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.signal(), None, "killed by a signal: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status, stderr)
}

/// The Python of the venv with the official MCP SDK (AIRLOCK_TEST_MCP_PYTHON overrides it): the
/// client of mcp.rs and the tool servers of tools.rs.
#[allow(dead_code)] // not every test binary speaks MCP
/// The MCP tool server the tools and approvals tests start (`crm`, over stdio or HTTP).
pub fn tool_server_script() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tool_server.py")
}

pub fn mcp_python() -> PathBuf {
    if let Some(p) = std::env::var_os("AIRLOCK_TEST_MCP_PYTHON") {
        return p.into();
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/mcp-client/bin/python");
    assert!(
        p.exists(),
        "the MCP SDK is not installed at {}: run `bash -c '. scripts/lib.sh && \
         ensure_mcp_client'` from the repository (scripts/test.sh does)",
        p.display()
    );
    p
}

/// What a program can see of its sandbox, with nothing that differs between two sandboxes
/// built alike (pids are namespaced, so they are the same too): how a pooled sandbox or a
/// zygote's child is compared with a cold one, field by field.
pub const SANDBOX_PROBE: &str = r#"
import json, os, resource, socket, sys
def status(field):
    for line in open('/proc/self/status'):
        if line.startswith(field + ':'):
            return line.split(':', 1)[1].strip()
def attempt(f):
    try:
        f()
        return 'allowed'
    except OSError as e:
        return e.errno
mounts = []
for line in open('/proc/self/mountinfo'):
    left, right = line.split(' - ')
    f = left.split()
    # Without the owner's ids, which are each sandbox's own host ids.
    options = ','.join(o for o in right.split()[2].split(',') if not o.startswith(('uid=', 'gid=')))
    mounts.append([f[4], f[5], right.split()[0], options])
# In mount order, which says how the root was assembled, not what it holds.
mounts.sort()
limits = {name: resource.getrlimit(getattr(resource, name)) for name in
          ['RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_NPROC', 'RLIMIT_CORE']}
def connect():
    s = socket.socket()
    s.settimeout(1)
    s.connect(('127.0.0.1', 1))
print(json.dumps({
    'ids': [os.getuid(), os.getgid(), os.getgroups()],
    'hostname': socket.gethostname(),
    'pids': sorted(p for p in os.listdir('/proc') if p.isdigit()),
    'root': sorted(os.listdir('/')),
    'cwd': os.getcwd(),
    'interfaces': attempt(socket.if_nameindex),
    'caps': [status(f) for f in ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb']],
    'no_new_privs': status('NoNewPrivs'),
    'seccomp': [status('Seccomp'), status('Seccomp_filters')],
    'mounts': mounts,
    'rlimits': limits,
    'env': sorted(os.environ.items()),
    'modules': sorted(sys.modules),
    'write_usr': attempt(lambda: open('/usr/airlock-probe', 'w')),
    'network': attempt(connect),
    'cgroup': open('/proc/self/cgroup').read(),
}, sort_keys=True))
"#;

/// The capabilities deploy/kubernetes's StatefulSet adds (`add: [A, B]`), without `CAP_`.
pub fn statefulset_capabilities(statefulset: &str) -> Vec<&str> {
    statefulset
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: ["))
        .and_then(|rest| rest.strip_suffix(']'))
        .expect("the StatefulSet adds capabilities")
        .split(", ")
        .collect()
}
