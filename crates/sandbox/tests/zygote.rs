//! Zygotes on their own: children are sandboxes like cold ones, and nothing of one reaches
//! another. This binary is also the sandboxes' init, so it has its own `main`.

mod support;

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use airlock_sandbox::{
    library_beside, run_if_init, spawn, Command, Exit, KillReason, Outcome, Policy, RootEntry,
    Zygote, ZygoteSpec,
};

const PYTHON: &str = "/usr/bin/python3";
const FLAGS: [&str; 3] = ["-I", "-S", "-B"];

fn policy() -> Policy {
    let mut policy = support::usr_policy();
    policy.root.push(RootEntry::ReadOnly {
        source: "/etc/alternatives".into(),
        target: "/etc/alternatives".into(),
    });
    policy.limits.memory_bytes = 256 << 20;
    policy
}

fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    library_beside(&exe).expect("libairlock_sandbox.so beside the test binary (cargo build)")
}

/// The program every child runs: its code comes as `-c`, the request as an argument.
const PROGRAM: &str = "import sys\nexec(sys.argv[1])\n";

fn spec(preload: &[&str]) -> ZygoteSpec {
    ZygoteSpec {
        python: PYTHON.into(),
        flags: FLAGS.iter().map(|s| s.to_string()).collect(),
        code: PROGRAM.into(),
        preload: preload.iter().map(|s| s.to_string()).collect(),
        warm_up: String::new(),
        env: [("PATH".to_string(), "/usr/bin".to_string())].into(),
        preload_env: Default::default(),
        library: library(),
        sys_path: vec!["/usr/lib/python3/dist-packages".into()],
        prepare: false,
        prepare_more: String::new(),
    }
}

fn command(script: &str) -> Command {
    Command::new(PYTHON)
        .args(FLAGS)
        .args(["-c", PROGRAM, script])
        .env("PATH", "/usr/bin:/bin")
}

fn run(zygote: &Zygote, script: &str) -> (Outcome, String, String) {
    run_command(zygote, command(script))
}

fn run_command(zygote: &Zygote, command: Command) -> (Outcome, String, String) {
    run_with(zygote, command, &policy())
}

fn run_with(zygote: &Zygote, command: Command, policy: &Policy) -> (Outcome, String, String) {
    let mut child = zygote.spawn(command, policy).expect("spawn");
    let mut out = child.take_stdout().unwrap();
    let mut err = child.take_stderr().unwrap();
    drop(child.take_stdin());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).unwrap();
    let outcome = child.wait().expect("wait");
    (outcome, stdout, reader.join().unwrap())
}

fn cold(script: &str) -> (Outcome, String) {
    let mut child = spawn(command(script), &policy()).expect("spawn");
    let mut out = child.take_stdout().unwrap();
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).unwrap();
    (child.wait().unwrap(), stdout)
}

fn a_child_runs_and_reports() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    let (o, out, err) = run(&zygote, "print(6 * 7)");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        out,
        "42\n",
        "{o:?} stderr: {err}\nzygote: {}",
        zygote.log_tail()
    );
    assert_eq!(o.exit, Some(Exit::Code(0)));
    let (o, _, _) = run(&zygote, "import sys; sys.exit(3)");
    assert_eq!(o.exit, Some(Exit::Code(3)));
    let (o, _, _) = run(
        &zygote,
        "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
    );
    assert_eq!(o.exit, Some(Exit::Signal(11)));
}

const PROBE: &str = r#"
import json, os, resource, socket, sys
def status(field):
    for line in open('/proc/self/status'):
        if line.startswith(field + ':'):
            return line.split(':', 1)[1].strip()
mounts = []
for line in open('/proc/self/mountinfo'):
    left, right = line.split(' - ')
    f = left.split()
    options = ','.join(o for o in right.split()[2].split(',') if not o.startswith(('uid=', 'gid=')))
    mounts.append([f[4], f[5], right.split()[0], options])
print(json.dumps({
    'ids': [os.getuid(), os.getgid(), os.getgroups()],
    'hostname': socket.gethostname(),
    'pids': sorted(p for p in os.listdir('/proc') if p.isdigit()),
    'root': sorted(os.listdir('/')),
    'cwd': os.getcwd(),
    'caps': [status(f) for f in ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb']],
    'no_new_privs': status('NoNewPrivs'),
    'seccomp': [status('Seccomp'), status('Seccomp_filters')],
    'mounts': sorted(mounts),
    'rlimits': {n: resource.getrlimit(getattr(resource, n)) for n in ['RLIMIT_CPU', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE', 'RLIMIT_CORE']},
    'env': sorted(os.environ.items()),
    'argv': sys.argv,
    'orig_argv': sys.orig_argv,
    'fds': sorted(os.listdir('/proc/self/fd')),
    'cgroup': open('/proc/self/cgroup').read(),
}, sort_keys=True))
"#;

fn a_child_is_the_same_sandbox_as_a_cold_one() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    let (o, out, err) = run(&zygote, PROBE);
    assert_eq!(o.exit, Some(Exit::Code(0)), "{err}\n{}", zygote.log_tail());
    let (co, cold_out) = cold(PROBE);
    assert_eq!(co.exit, Some(Exit::Code(0)));
    let child: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cold: serde_json::Value = serde_json::from_str(&cold_out).unwrap();
    for (field, value) in cold.as_object().unwrap() {
        assert_eq!(
            &child[field], value,
            "{field} differs between a zygote child and a cold sandbox"
        );
    }
    assert_eq!(o.isolation, co.isolation);
}

/// What a program's environment is: as it sees it (in its order), as a process it starts
/// inherits it (the C library's), and what the zygote's warm-up saw.
const ENVIRONMENT: &str = r#"
import json, os, subprocess, sys
inherited = subprocess.run([sys.executable, '-I', '-S', '-c', 'import os; print(sorted(os.environ.items()))'],
                           capture_output=True, text=True).stdout
print(json.dumps({'env': list(os.environ.items()), 'inherited': inherited, 'seen': getattr(json, 'seen', None)}))
"#;

/// The preloads' environment is theirs: the warm-up sees it, no child does. Each child's
/// environment is the one it is spawned with, in its order, as a cold sandbox's is: the
/// zygote's own (nothing to change), one value changed, a variable more, the same keys in
/// another order than the zygote's, none at all.
fn the_preloads_environment_is_theirs_and_each_child_gets_the_one_it_is_given() {
    let mut spec = spec(&[]);
    spec.preload_env
        .insert("AIRLOCK_TEST_PRELOAD".into(), "for the preloads".into());
    spec.warm_up = "import json, os\njson.seen = os.environ.get('AIRLOCK_TEST_PRELOAD')\n".into();
    let zygote = Zygote::start(&spec, &policy()).expect("zygote");
    let with = |env: &[(&str, &str)]| {
        env.iter().fold(
            Command::new(PYTHON)
                .args(FLAGS)
                .args(["-c", PROGRAM, ENVIRONMENT]),
            |command, (key, value)| command.env(*key, *value),
        )
    };
    let environments: [&[(&str, &str)]; 5] = [
        &[("PATH", "/usr/bin")],
        &[("PATH", "/usr/bin:/bin")],
        &[("LANG", "C.UTF-8"), ("PATH", "/usr/bin")],
        // The zygote's interpreter added LC_CTYPE after PATH (its locale coercion).
        &[("LC_CTYPE", "C.UTF-8"), ("PATH", "/usr/bin")],
        &[],
    ];
    for env in environments {
        let (o, out, err) = run_command(&zygote, with(env));
        assert_eq!(o.exit, Some(Exit::Code(0)), "{err}\n{}", zygote.log_tail());
        let mut cold = spawn(with(env), &policy()).expect("spawn");
        let mut cold_out = String::new();
        cold.take_stdout()
            .unwrap()
            .read_to_string(&mut cold_out)
            .unwrap();
        assert_eq!(cold.wait().unwrap().exit, Some(Exit::Code(0)));
        let child: serde_json::Value = serde_json::from_str(&out).unwrap();
        let cold: serde_json::Value = serde_json::from_str(&cold_out).unwrap();
        assert_eq!(child["env"], cold["env"], "spawned with {env:?}");
        assert_eq!(
            child["inherited"], cold["inherited"],
            "spawned with {env:?}"
        );
        assert!(!out.contains("AIRLOCK_TEST_PRELOAD"), "{out}");
        assert_eq!(child["seen"], "for the preloads");
    }
}

/// Each run looks for what an earlier child left, then leaves all it can: files in every
/// writable place, an attribute on a preloaded module, an environment variable, a process
/// that outlives the program, a SysV shared memory segment; and says its random draw.
const LEAVE_TRACES: &str = r#"
import ctypes, json, os, random, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
made = libc.shmget(0x5EED, 4096, 0o1000 | 0o2000 | 0o600)
found = {
    'files': sorted(os.listdir('/tmp') + os.listdir('/work') + os.listdir('/dev/shm')),
    'module': getattr(json, 'planted', None),
    'imported': 'csv' in sys.modules,
    'env': os.environ.get('PLANTED'),
    'pids': sorted(p for p in os.listdir('/proc') if p.isdigit()),
    'shm': 'made' if made >= 0 else os.strerror(ctypes.get_errno()),
    'random': random.random(),
}
for d in ['/tmp', '/work', '/dev/shm']:
    open(d + '/planted', 'w').write('x')
json.planted = True
import csv
os.environ['PLANTED'] = '1'
subprocess.Popen(['/usr/bin/sleep', '60'], start_new_session=True)
time.sleep(0.1)
print(json.dumps(found))
"#;

fn policy_with_work() -> Policy {
    let mut p = policy();
    p.scratch.mounts = vec!["/tmp".into(), "/work".into(), "/dev/shm".into()];
    p.workdir = "/work".into();
    p
}

fn nothing_of_one_child_reaches_the_next() {
    // `random` preloaded: the zygote's state is every child's unless the interpreter's fork
    // hooks reseed it in each (`random` registers one), as os.fork() runs them.
    let zygote = Zygote::start(&spec(&["json", "random"]), &policy_with_work()).expect("zygote");
    let mut draws = Vec::new();
    for i in 0..4 {
        let mut child = zygote
            .spawn(command(LEAVE_TRACES), &policy_with_work())
            .expect("spawn");
        let out = support::stdout_of(&mut child);
        let o = child.wait().unwrap();
        assert_eq!(
            o.exit,
            Some(Exit::Code(0)),
            "run {i}: {out} {}",
            zygote.log_tail()
        );
        let mut found: serde_json::Value = serde_json::from_str(&out).unwrap();
        draws.push(found["random"].take());
        assert_eq!(
            found,
            serde_json::json!({"files": [], "module": null, "imported": false, "env": null,
                               "pids": ["1", "2"], "shm": "made", "random": null}),
            "run {i} saw what an earlier child left"
        );
    }
    draws.sort_by(|a, b| a.as_f64().partial_cmp(&b.as_f64()).unwrap());
    draws.dedup();
    assert_eq!(
        draws.len(),
        4,
        "children drew the same random numbers: {draws:?}"
    );
}

/// What a child's root is made of: the file system (its device) of `/`, `/dev` and each
/// writable place, when `/` was made (device numbers are reused, times are not), whether `/` takes a new file, how many `/proc`s are mounted, and whether
/// `/tmp` is empty of what the last child left there.
const ROOT_PARTS: &str = r#"
import json, os
devices = {p: os.stat(p).st_dev for p in ['/', '/dev', '/tmp', '/work', '/dev/shm'] if os.path.isdir(p)}
try:
    open('/planted', 'w')
    root = 'written'
except OSError as e:
    root = os.strerror(e.errno)
procs = sum(1 for line in open('/proc/self/mountinfo') if line.split(' - ')[1].split()[0] == 'proc')
fresh = not os.path.exists('/tmp/mine')
open('/tmp/mine', 'w').write('x')
print(json.dumps({'devices': devices, 'root': root, 'procs': procs, 'cwd': os.getcwd(), 'fresh': fresh,
                  'root_made': os.stat('/').st_ctime_ns}))
"#;

fn jails_share_one_read_only_skeleton_and_a_policy_that_differs_gets_a_root_of_its_own() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    let parts = |policy: &Policy| {
        let (o, out, err) = run_with(&zygote, command(ROOT_PARTS), policy);
        assert_eq!(o.exit, Some(Exit::Code(0)), "{err}\n{}", zygote.log_tail());
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let first = parts(&policy());
    let other = parts(&policy_with_work());
    let again = parts(&policy());
    for (name, seen) in [("first", &first), ("other", &other), ("again", &again)] {
        assert_eq!(seen["root"], "Read-only file system", "{name}: {seen}");
        assert_eq!(
            seen["procs"], 1,
            "{name}: one /proc, the jail's own: {seen}"
        );
        assert_eq!(seen["fresh"], true, "{name}: {seen}");
    }
    // The read-only parts are one file system for every jail of the zygote's policy...
    assert_eq!(first["devices"]["/"], again["devices"]["/"]);
    assert_eq!(first["root_made"], again["root_made"]);
    assert_eq!(first["devices"]["/dev"], again["devices"]["/dev"]);
    // ...and the scratch is each jail's own (`fresh` above: device numbers are reused).
    assert_ne!(first["devices"]["/tmp"], first["devices"]["/"]);
    // Other scratch mounts and working directory: a root built for that jail alone.
    assert_ne!(other["devices"]["/"], first["devices"]["/"]);
    assert_ne!(other["root_made"], first["root_made"]);
    assert_eq!(other["cwd"], "/work");
    for place in ["/work", "/dev/shm"] {
        assert_eq!(other["devices"][place], other["devices"]["/tmp"], "{other}");
        assert!(
            first["devices"].get(place).is_none() || place == "/work",
            "{first}"
        );
    }
}

/// Scans every readable mapping of the child's own memory (read in place: a sandbox is not
/// dumpable) for requests' markers: texts `zyg-mark-` and 16 hex digits, and file-size limits
/// with the high half 0x5A17C0DE, as their 8 bytes or as a request's JSON.
const SCAN_FOR_MARKERS: &str = r#"
import ctypes, json, re
texts, numbers = set(), set()
high = (0x5A17C0DE).to_bytes(4, 'little')
for line in open('/proc/self/maps').read().splitlines():
    fields = line.split()
    if 'r' not in fields[1] or (len(fields) > 5 and fields[5] in ('[vvar]', '[vsyscall]', '[vvar_vclock]')):
        continue
    start, end = (int(x, 16) for x in fields[0].split('-'))
    chunk = ctypes.string_at(start, end - start)
    texts.update(m.decode() for m in re.findall(rb'zyg-mark-[0-9a-f]{16}', chunk))
    numbers.update(int(m) for m in re.findall(rb'"file_size_bytes":([0-9]{19})', chunk))
    at = chunk.find(high, 4)
    while at >= 0:
        numbers.add(int.from_bytes(chunk[at - 4:at + 4], 'little'))
        at = chunk.find(high, at + 1)
print(json.dumps({'texts': sorted(texts), 'numbers': sorted(numbers)}))
"#;

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    u64::from_le_bytes(bytes)
}

/// Requests sent together: each child is forked while the zygote holds the others' (queued,
/// or received and done with). Each request has its markers in its environment, an argument,
/// its hostname and its file-size limit; a child scanning all of its memory finds its own
/// text and nothing of any other's.
fn no_child_finds_another_s_request_in_its_memory() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    for round in 0..2 {
        let n = 6;
        let markers: Vec<(String, u64)> = (0..n)
            .map(|_| {
                let r = random_u64();
                (
                    format!("zyg-mark-{r:016x}"),
                    0x5A17_C0DE_0000_0000 | (r & 0xFFFF_FFFF),
                )
            })
            .collect();
        let mut children: Vec<_> = markers
            .iter()
            .map(|(text, number)| {
                let mut p = policy();
                p.hostname = text.clone();
                p.limits.file_size_bytes = *number;
                let command = command(SCAN_FOR_MARKERS)
                    .arg(text.clone())
                    .env("MARKER", text.clone());
                zygote.spawn(command, &p).expect("spawn")
            })
            .collect();
        for (i, child) in children.iter_mut().enumerate() {
            let out = support::stdout_of(child);
            let found: serde_json::Value = serde_json::from_str(&out)
                .unwrap_or_else(|_| panic!("child {i}: {out:?} {}", zygote.log_tail()));
            let own_text = &markers[i].0;
            let texts: Vec<&str> = found["texts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect();
            assert!(
                texts.contains(&own_text.as_str()),
                "round {round}, child {i} cannot find its own marker: the scan is blind"
            );
            let numbers: Vec<u64> = found["numbers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
                .collect();
            for (j, (text, number)) in markers.iter().enumerate() {
                if j == i {
                    continue;
                }
                assert!(
                    !texts.contains(&text.as_str()),
                    "round {round}: child {i} found child {j}'s environment, argument or hostname"
                );
                assert!(
                    !numbers.contains(number),
                    "round {round}: child {i} found child {j}'s limit"
                );
            }
        }
        for child in children {
            assert_eq!(child.wait().unwrap().exit, Some(Exit::Code(0)));
        }
    }
}

/// Generators of random numbers made in the zygote, each a kind of its own: the program's own
/// `random.Random`s (one referenced only from a list, one of the C type, which the collector
/// does not track), numpy's legacy global one and generators of each bit generator, tempfile's
/// name sequence, OpenSSL's generator (drawn from once), and multiprocessing's authentication
/// key (preloaded: made at import).
const MAKE_GENERATORS: &str = r#"
import _random, random, ssl, tempfile
import numpy
OWN = random.Random(7)
HELD = [random.Random(8)]
BARE = _random.Random(9)
PCG = numpy.random.default_rng(1)
MT = numpy.random.Generator(numpy.random.MT19937(2))
PHILOX = numpy.random.Philox(3)
numpy.random.seed(4)
next(tempfile._get_candidate_names())
ssl.RAND_bytes(16)
"#;

/// What a child draws from each of them (and from `random`'s own, and a fresh numpy one).
const DRAW: &str = r#"
import json, multiprocessing, random, ssl, tempfile, uuid
import numpy
print(json.dumps({
    'own': OWN.random(), 'held': HELD[0].random(), 'bare': BARE.random(),
    'random': random.random(), 'pcg': int(PCG.integers(1 << 62)),
    'mt': int(MT.integers(1 << 62)), 'philox': int(PHILOX.random_raw()),
    'legacy': int(numpy.random.randint(1 << 62)), 'gauss': numpy.random.standard_normal(),
    'fresh': int(numpy.random.default_rng().integers(1 << 62)),
    'tempfile': next(tempfile._get_candidate_names()), 'uuid4': str(uuid.uuid4()),
    'openssl': ssl.RAND_bytes(16).hex(),
    'authkey': multiprocessing.current_process().authkey.hex(),
}))
"#;

/// Every generator of random numbers, or of secrets, that the zygote holds (its preloads', its
/// program's) is drawn from afresh in each child: no two children draw the same.
fn every_child_draws_its_own_random_numbers() {
    let program = "import sys\n\
        def __zygote_start__():\n    exec(sys.argv[1], globals())\n\
        if sys.argv[1:] != ['--zygote']:\n    __zygote_start__()\n";
    let mut spec = spec(&["multiprocessing", "numpy"]);
    spec.code = program.into();
    spec.prepare = true;
    spec.prepare_more = MAKE_GENERATORS.into();
    let zygote = Zygote::start(&spec, &policy()).expect("zygote");
    let mut draws: std::collections::BTreeMap<String, Vec<serde_json::Value>> = Default::default();
    let n = 5;
    for _ in 0..n {
        let command = Command::new(PYTHON)
            .args(FLAGS)
            .args(["-c", program, DRAW])
            .env("PATH", "/usr/bin:/bin");
        let (o, out, err) = run_command(&zygote, command);
        assert_eq!(o.exit, Some(Exit::Code(0)), "{err}\n{}", zygote.log_tail());
        let drawn: serde_json::Value = serde_json::from_str(&out).unwrap();
        for (kind, value) in drawn.as_object().unwrap() {
            draws.entry(kind.clone()).or_default().push(value.clone());
        }
    }
    let shared: Vec<(&String, &Vec<serde_json::Value>)> = draws
        .iter()
        .filter(|(_, values)| {
            let mut distinct: Vec<String> = values.iter().map(|v| v.to_string()).collect();
            distinct.sort();
            distinct.dedup();
            distinct.len() < n
        })
        .collect();
    assert!(
        shared.is_empty(),
        "children drew alike: {shared:?}\n{}",
        zygote.log_tail()
    );
}

fn host_uid(pid: i32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn children_cannot_reach_each_other_or_the_zygote() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    // The first waits; the second looks for it (and for anything else) from inside.
    let mut first = zygote
        .spawn(
            command("import time; print('up', flush=True); time.sleep(30)"),
            &policy(),
        )
        .expect("spawn");
    let mut out = first.take_stdout().unwrap();
    let mut up = [0u8; 3];
    out.read_exact(&mut up).unwrap();
    let probe = r#"
import json, os
seen = sorted(p for p in os.listdir('/proc') if p.isdigit())
tries = {}
for pid in range(1, 400):
    if str(pid) in seen:
        continue
    try:
        os.kill(pid, 0)
        tries[pid] = 'reached'
    except ProcessLookupError:
        pass
    except OSError as e:
        tries[pid] = e.errno
print(json.dumps({'seen': seen, 'reached': tries, 'uid': os.getuid()}))
"#;
    let (o, report, err) = run(&zygote, probe);
    assert_eq!(o.exit, Some(Exit::Code(0)), "{err}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["seen"], serde_json::json!(["1", "2"]));
    assert_eq!(
        report["reached"],
        serde_json::json!({}),
        "a child reached another process"
    );
    assert_eq!(report["uid"], 1000);

    // On the host: each child has a uid of its own, neither the zygote's nor a sibling's.
    let firsts = first.processes();
    let second = zygote
        .spawn(command("import time; time.sleep(30)"), &policy())
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let seconds = second.processes();
    assert!(!firsts.is_empty() && !seconds.is_empty());
    let a = host_uid(firsts[0]);
    let b = host_uid(seconds[0]);
    let z: Vec<u32> = zygote.processes().into_iter().map(host_uid).collect();
    assert_ne!(a, b, "two children share a host uid");
    assert!(
        !z.contains(&a) && !z.contains(&b),
        "a child has the zygote's uid: {z:?}"
    );
    assert!(firsts.iter().all(|p| host_uid(*p) == a));

    // Killing a child leaves the zygote and the other child alone.
    first.killer().kill(KillReason::Cancelled);
    let o = first.wait().unwrap();
    assert_eq!(o.killed, Some(KillReason::Cancelled));
    assert!(zygote.is_alive());
    let (o, out, _) = run(&zygote, "print('still here')");
    assert_eq!(
        (o.exit, out.as_str()),
        (Some(Exit::Code(0)), "still here\n")
    );
    second.killer().kill(KillReason::Cancelled);
    second.wait().unwrap();
}

fn pid_ns(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/pid"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Each child's network namespace is new, never one an earlier child had: a namespace that
/// outlives its sandbox keeps what no check can list (IPv6 flow labels linger a minute with
/// an address of the caller's choosing, a multicast join moves counters after the fact).
/// Told apart by cookie (`SO_NETNS_COOKIE`), which unlike an inode number is never reused.
fn every_child_has_a_network_namespace_no_earlier_child_had() {
    const COOKIE: &str = r#"
import socket
pair = socket.socketpair()
print(int.from_bytes(pair[0].getsockopt(socket.SOL_SOCKET, 71, 8), 'little'))
"#;
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..20 {
        let (o, out, err) = run(&zygote, COOKIE);
        assert_eq!(o.exit, Some(Exit::Code(0)), "{err}\n{}", zygote.log_tail());
        let cookie: u64 = out.trim().parse().unwrap();
        assert!(
            seen.insert(cookie),
            "child {i} has an earlier child's network namespace"
        );
        // Time for the template to reap the last jail's init before the next is asked for.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Requests sent together have their jails built side by side (the template's init takes the
/// next while earlier ones build their roots): each child must still get the jail made for its
/// own request, the one whose init joined its cgroup.
fn children_asked_for_together_each_get_their_own_jail() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    let n = 6;
    let mut children: Vec<_> = (0..n)
        .map(|i| {
            let script = format!("import sys; print({i}, flush=True); sys.stdin.read()");
            zygote.spawn(command(&script), &policy()).expect("spawn")
        })
        .collect();
    let mut namespaces = Vec::new();
    let mut uids = Vec::new();
    for (i, child) in children.iter_mut().enumerate() {
        let mut out = child.take_stdout().unwrap();
        let mut line = [0u8; 2];
        out.read_exact(&mut line).unwrap();
        assert_eq!(
            line,
            format!("{i}\n").as_bytes(),
            "child {i} ran another's request"
        );
        // Its cgroup holds its jail's init and itself: one PID namespace, one host uid.
        let pids = child.processes();
        assert_eq!(pids.len(), 2, "child {i}: {pids:?}");
        let ns: Vec<String> = pids.iter().map(|p| pid_ns(*p)).collect();
        let ids: Vec<u32> = pids.iter().map(|p| host_uid(*p)).collect();
        assert_eq!(
            ns[0], ns[1],
            "child {i} is not in the jail its cgroup's init made"
        );
        assert_eq!(ids[0], ids[1], "child {i} has another jail's uid");
        namespaces.push(ns[0].clone());
        uids.push(ids[0]);
    }
    namespaces.sort();
    namespaces.dedup();
    uids.sort_unstable();
    uids.dedup();
    assert_eq!(
        (namespaces.len(), uids.len()),
        (n, n),
        "two children share a jail"
    );
    for mut child in children {
        drop(child.take_stdin());
        let o = child.wait().unwrap();
        assert_eq!(o.exit, Some(Exit::Code(0)));
    }
    assert!(zygote.is_alive());
}

fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
    }
}

/// A server's wait for a child that ended by itself returns without waiting for its jail's
/// init to be gone (its teardown is left to the background with the cgroup's removal), yet
/// what the child left behind goes all the same.
fn what_a_child_leaves_goes_with_its_cgroup_after_the_wait() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    let script = "import os, sys, time\nif os.fork() == 0:\n    time.sleep(60)\nprint('forked', flush=True)\nsys.stdin.read()";
    let mut child = zygote.spawn(command(script), &policy()).expect("spawn");
    child.defer_cleanup();
    let mut out = child.take_stdout().unwrap();
    let mut line = [0u8; 7];
    out.read_exact(&mut line).unwrap();
    let pids = child.processes();
    assert_eq!(
        pids.len(),
        3,
        "its jail's init, itself and its fork: {pids:?}"
    );
    drop(child.take_stdin());
    let o = child.wait().unwrap();
    assert_eq!((o.exit, o.killed), (Some(Exit::Code(0)), None));
    airlock_sandbox::settle();
    let left: Vec<i32> = pids.into_iter().filter(|p| !gone(*p)).collect();
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(zygote.is_alive());
}

fn limits_hold_in_a_child() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    let mut p = policy();
    p.limits.wall_time = Duration::from_millis(500);
    let child = zygote
        .spawn(command("import time; time.sleep(30)"), &p)
        .unwrap();
    let o = child.wait().unwrap();
    assert_eq!(o.killed, Some(KillReason::WallTime));
    // Memory: the child's own pages count, and the OOM killer takes it.
    let mut p = policy();
    p.limits.memory_bytes = 64 << 20;
    let child = zygote
        .spawn(command("b = bytearray(512 << 20)\nprint(len(b))"), &p)
        .unwrap();
    let o = child.wait().unwrap();
    assert!(o.oom_kills > 0, "{o:?}");
    assert_eq!(o.exit, Some(Exit::Signal(9)), "{o:?}");
    // Every process it starts is in its cgroup, and none outlives it.
    let script = "import subprocess, time\n\
                  subprocess.Popen(['/usr/bin/sleep', '60'])\n\
                  print('ok', flush=True)\n\
                  time.sleep(0.5)";
    let mut child = zygote.spawn(command(script), &policy()).unwrap();
    let mut out = child.take_stdout().unwrap();
    let mut ok = [0u8; 2];
    out.read_exact(&mut ok).unwrap();
    let procs = child.processes();
    assert!(
        procs.len() >= 3,
        "jail init, the program and sleep: {procs:?}"
    );
    let o = child.wait().unwrap();
    assert_eq!(o.exit, Some(Exit::Code(0)));
    // Killed with the sandbox: gone (or dead and not yet reaped) within moments.
    let deadline = Instant::now() + Duration::from_secs(5);
    for pid in procs {
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") || stat.contains(") X ") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "process {pid} outlived its sandbox: {stat}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert!(zygote.is_alive());
}

fn a_zygote_that_dies_is_noticed() {
    let zygote = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    assert!(zygote.is_alive());
    let mut killed = 0;
    for pid in zygote.processes() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "python3" {
            kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
            killed += 1;
        }
    }
    assert_eq!(killed, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while zygote.is_alive() {
        assert!(
            Instant::now() < deadline,
            "the zygote's death went unnoticed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(zygote.spawn(command("print(1)"), &policy()).is_err());
}

/// A prepared program defines `__zygote_start__` once in the zygote; `prepare_more` runs in its
/// namespace after it, there and never in a child; children see both.
fn a_prepared_program_runs_once_in_the_zygote_and_its_more_with_it() {
    let program = "import sys\n\
        PREPARED_WITH = sys.argv[1:]\n\
        def __zygote_start__():\n    \
            print(PREPARED_WITH, MORE_WITH, sys.argv[1:])\n\
        if sys.argv[1:] != ['--zygote']:\n    __zygote_start__()\n";
    let mut spec = spec(&[]);
    spec.code = program.into();
    spec.prepare = true;
    spec.prepare_more = "MORE_WITH = sys.argv[1:] + [len(PREPARED_WITH)]\n".into();
    let zygote = Zygote::start(&spec, &policy()).expect("zygote");
    let command = Command::new(PYTHON)
        .args(FLAGS)
        .args(["-c", program, "x"])
        .env("PATH", "/usr/bin:/bin");
    let mut child = zygote.spawn(command, &policy()).expect("spawn");
    let mut out = child.take_stdout().unwrap();
    drop(child.take_stdin());
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).unwrap();
    let outcome = child.wait().expect("wait");
    assert_eq!(outcome.exit, Some(Exit::Code(0)), "{}", zygote.log_tail());
    // Both defined in the zygote (its argv there), the extra part after the program.
    assert_eq!(
        stdout.trim(),
        "['--zygote'] ['--zygote', 1] ['x']",
        "{}",
        zygote.log_tail()
    );
    assert!(zygote.clones_into_cgroups(), "{}", zygote.log_tail());
    drop(zygote);
    // One whose thread has ended clones as well (matplotlib's font cache is built with a
    // timer thread beside it); one with a thread that runs forks, never clones: glibc's fork
    // would take the locks that thread may hold. Its children run all the same.
    let thread = |run: &str| {
        format!("import threading, time\nt = threading.Thread(target=time.sleep, args=({run},), daemon=True)\nt.start()\nMORE_WITH = 0\n")
    };
    spec.prepare_more = format!("{}t.join()\n", thread("0"));
    let zygote = Zygote::start(&spec, &policy()).expect("zygote");
    assert!(zygote.clones_into_cgroups(), "{}", zygote.log_tail());
    drop(zygote);
    spec.prepare_more = thread("3600");
    let zygote = Zygote::start(&spec, &policy()).expect("zygote");
    assert!(!zygote.clones_into_cgroups());
    let (o, out, _) = run_command(
        &zygote,
        Command::new(PYTHON)
            .args(FLAGS)
            .args(["-c", program, "y"])
            .env("PATH", "/usr/bin:/bin"),
    );
    assert_eq!(
        (o.exit, out.trim()),
        (Some(Exit::Code(0)), "['--zygote'] 0 ['y']"),
        "{}",
        zygote.log_tail()
    );
    // A program whose extra part fails is refused at start, with the reason.
    spec.prepare_more = "raise ValueError('nope')".into();
    let err = Zygote::start(&spec, &policy()).expect_err("a failing prepare_more");
    assert!(err.to_string().contains("nope"), "{err}");
}

/// The kB the child has written of its own (`Private_Dirty`), as its program starts.
const PRIVATE_DIRTY: &str = "print(sum(int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('Private_Dirty')))";

/// Where a child's request is when it starts: nowhere yet (a pooled child waiting for it),
/// on its stdin, or on a descriptor passed to the program.
#[derive(Clone, Copy, PartialEq)]
enum Request {
    NotYet,
    OnStdin,
    OnItsOwnDescriptor,
}

/// Runs `PRIVATE_DIRTY` in a child of `zygote`, its request as `request` says; its stdin
/// stays open (and empty unless the request is there) until the program has ended.
fn private_dirty_kb(zygote: &Zygote, policy: &Policy, request: Request) -> u64 {
    private_dirty_kb_of(zygote, policy, request, command(PRIVATE_DIRTY))
}

fn private_dirty_kb_of(
    zygote: &Zygote,
    policy: &Policy,
    request: Request,
    command: Command,
) -> u64 {
    use std::io::Write;
    let mut command = command;
    if request == Request::OnItsOwnDescriptor {
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&w, b"request\n").unwrap();
        command = command.pass_fd(r);
    }
    let mut child = zygote.spawn(command, policy).expect("spawn");
    let mut stdin = child.take_stdin();
    if request == Request::OnStdin {
        stdin.as_mut().unwrap().write_all(b"request\n").unwrap();
    }
    let mut out = child.take_stdout().unwrap();
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).unwrap();
    drop(stdin);
    let outcome = child.wait().expect("wait");
    assert_eq!(outcome.exit, Some(Exit::Code(0)), "{}", zygote.log_tail());
    stdout.trim().parse().expect(&stdout)
}

/// A caller's warm-up where matplotlib is preloaded (airlock's engine has one like it): a
/// first chart drawn once in the zygote, and drawn again in the fork it surveys.
const CHART_WARM_UP: &str = r#"
import io, sys

def __zygote_rehearse__():
    plt = sys.modules["matplotlib.pyplot"]
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="x")
    ax.set_title("x")
    ax.legend()
    fig.savefig(io.BytesIO(), format="png")
    plt.close("all")

__zygote_rehearse__()
"#;

fn a_charting_zygote_s_children_copy_what_a_chart_writes_while_they_wait() {
    let lean = Zygote::start(&spec(&[]), &policy()).expect("zygote");
    assert_eq!(
        lean.prefault_bytes(),
        0,
        "only a zygote that rehearses surveys"
    );
    drop(lean);
    let mut charting = spec(&["matplotlib.pyplot"]);
    charting.warm_up = CHART_WARM_UP.into();
    // Its font cache built in the zygote's scratch, its defaults from /usr (not /etc).
    for (key, value) in [
        ("MPLCONFIGDIR", "/tmp"),
        ("MATPLOTLIBRC", "/usr/share/matplotlib/mpl-data"),
        ("MPLBACKEND", "Agg"),
    ] {
        charting.env.insert(key.into(), value.into());
    }
    let zygote = Zygote::start(&charting, &policy()).expect("zygote");
    // matplotlib started no thread: on cgroup v2 its children are cloned into their cgroups.
    assert!(zygote.clones_into_cgroups(), "{}", zygote.log_tail());
    let surveyed_kb = zygote.prefault_bytes() / 1024;
    // A first chart writes megabytes of the zygote's pages (its heap's reference counts).
    assert!(
        surveyed_kb > 2048,
        "surveyed {surveyed_kb} kB: {}",
        zygote.log_tail()
    );
    let waited = private_dirty_kb(&zygote, &policy(), Request::NotYet);
    let went_on = private_dirty_kb(&zygote, &policy(), Request::OnStdin);
    let went_on_too = private_dirty_kb(&zygote, &policy(), Request::OnItsOwnDescriptor);
    // Waiting, it copied them; with a request waiting, it went on after the first 2 MiB.
    for went_on in [went_on, went_on_too] {
        assert!(
            waited >= went_on + surveyed_kb / 2,
            "waited {waited} kB, went on {went_on} kB, surveyed {surveyed_kb} kB"
        );
    }
    // Never more than a quarter of its memory limit.
    let mut small = policy();
    small.limits.memory_bytes = (16 << 20) + surveyed_kb * 1024 / 2;
    let budget_kb = small.limits.memory_bytes / 4 / 1024;
    let capped = private_dirty_kb(&zygote, &small, Request::NotYet);
    // (What went on copied first, at most 2 MiB, is part of both.)
    assert!(
        capped <= went_on + budget_kb + 512 && capped + 2048 >= went_on + budget_kb / 2,
        "capped {capped} kB, went on {went_on} kB, budget {budget_kb} kB"
    );
}

/// A prepared program's `__zygote_rehearse__` is what the zygote surveys when it draws no
/// chart: here it writes 8 MiB of the zygote's memory, which every waiting child copies; a
/// child whose request is already there copies the first 2 MiB of it all the same (copying a
/// page ahead costs less than a fault on it) and goes on.
fn a_program_s_rehearsal_is_surveyed_and_its_pages_copied_by_waiting_children() {
    let program = |rehearsal: &str| {
        format!(
            "import sys\n\
            BLOCK = bytearray(b'x' * (8 << 20))\n\
            def __zygote_rehearse__():\n    {rehearsal}\n\
            def __zygote_start__():\n    \
                exec(sys.argv[1], globals())\n\
            if sys.argv[1:] != ['--zygote']:\n    __zygote_start__()\n"
        )
    };
    let writes = program("for i in range(0, len(BLOCK), 4096): BLOCK[i] = 121");
    let idle = program("pass");
    let start = |program: &str| {
        let mut spec = spec(&[]);
        spec.code = program.into();
        spec.prepare = true;
        Zygote::start(&spec, &policy()).expect("zygote")
    };
    let command = || {
        Command::new(PYTHON)
            .args(FLAGS)
            .env("PATH", "/usr/bin:/bin")
    };
    let dirty = |zygote: &Zygote, program: &str, request| {
        private_dirty_kb_of(
            zygote,
            &policy(),
            request,
            command().args(["-c", program, PRIVATE_DIRTY]),
        )
    };
    let plain = start(&idle);
    let went_on_plain = dirty(&plain, &idle, Request::OnStdin);
    drop(plain);
    let zygote = start(&writes);
    let surveyed_kb = zygote.prefault_bytes() / 1024;
    assert!(
        surveyed_kb >= 8192,
        "surveyed {surveyed_kb} kB: {}",
        zygote.log_tail()
    );
    let waited = dirty(&zygote, &writes, Request::NotYet);
    let went_on = dirty(&zygote, &writes, Request::OnStdin);
    assert!(
        waited >= went_on + 4096,
        "waited {waited} kB, went on {went_on} kB, surveyed {surveyed_kb} kB"
    );
    assert!(
        went_on >= went_on_plain + 1536,
        "went on {went_on} kB, without a rehearsal that writes {went_on_plain} kB"
    );
    // The rehearsal ran in a fork of the zygote only: its children see the block unwritten.
    let script = "print(bytes(BLOCK[:1]), BLOCK.count(121))";
    let (o, out, _) = run_command(&zygote, command().args(["-c", &writes, script]));
    assert_eq!(o.exit, Some(Exit::Code(0)), "{}", zygote.log_tail());
    assert_eq!(out.trim(), "b'x' 0");
}

/// The warm-up runs once in the zygote, after the preloads and before any child: what it
/// leaves in a module, children find. One that raises is logged and its rehearsal, defined
/// before it raised, is not surveyed; the zygote serves all the same.
fn a_warm_up_runs_once_in_the_zygote_and_one_that_raises_is_skipped() {
    let mut spec = spec(&[]);
    spec.warm_up = "import json\njson.warmed = getattr(json, 'warmed', 0) + 1\n".into();
    let zygote = Zygote::start(&spec, &policy()).expect("zygote");
    for _ in 0..2 {
        let (o, out, _) = run(&zygote, "import json; print(json.warmed)");
        assert_eq!(
            (o.exit, out.trim()),
            (Some(Exit::Code(0)), "1"),
            "{}",
            zygote.log_tail()
        );
    }
    assert_eq!(zygote.prefault_bytes(), 0, "no rehearsal, nothing surveyed");
    drop(zygote);
    spec.warm_up = "BLOCK = bytearray(8 << 20)\n\
                    def __zygote_rehearse__():\n    BLOCK[::4096] = b'y' * len(BLOCK[::4096])\n\
                    raise ValueError('too cold')\n"
        .into();
    let zygote = Zygote::start(&spec, &policy()).expect("zygote");
    let (o, out, _) = run(&zygote, "print(6 * 7)");
    assert_eq!((o.exit, out.as_str()), (Some(Exit::Code(0)), "42\n"));
    assert_eq!(zygote.prefault_bytes(), 0, "{}", zygote.log_tail());
    // The zygote's stderr is read by a thread of ours: it may come a little later.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !zygote
        .log_tail()
        .contains("warming up: ValueError('too cold')")
    {
        assert!(Instant::now() < deadline, "{}", zygote.log_tail());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    run_if_init();
    if std::env::var_os("ZYGOTE_TIMING").is_some() {
        timing();
        return;
    }
    let tests: &[(&str, fn())] = &[
        ("a_child_runs_and_reports", a_child_runs_and_reports),
        (
            "a_child_is_the_same_sandbox_as_a_cold_one",
            a_child_is_the_same_sandbox_as_a_cold_one,
        ),
        (
            "nothing_of_one_child_reaches_the_next",
            nothing_of_one_child_reaches_the_next,
        ),
        (
            "every_child_draws_its_own_random_numbers",
            every_child_draws_its_own_random_numbers,
        ),
        (
            "children_cannot_reach_each_other_or_the_zygote",
            children_cannot_reach_each_other_or_the_zygote,
        ),
        (
            "no_child_finds_another_s_request_in_its_memory",
            no_child_finds_another_s_request_in_its_memory,
        ),
        (
            "every_child_has_a_network_namespace_no_earlier_child_had",
            every_child_has_a_network_namespace_no_earlier_child_had,
        ),
        (
            "children_asked_for_together_each_get_their_own_jail",
            children_asked_for_together_each_get_their_own_jail,
        ),
        (
            "what_a_child_leaves_goes_with_its_cgroup_after_the_wait",
            what_a_child_leaves_goes_with_its_cgroup_after_the_wait,
        ),
        ("limits_hold_in_a_child", limits_hold_in_a_child),
        (
            "jails_share_one_read_only_skeleton_and_a_policy_that_differs_gets_a_root_of_its_own",
            jails_share_one_read_only_skeleton_and_a_policy_that_differs_gets_a_root_of_its_own,
        ),
        (
            "a_prepared_program_runs_once_in_the_zygote_and_its_more_with_it",
            a_prepared_program_runs_once_in_the_zygote_and_its_more_with_it,
        ),
        (
            "a_charting_zygote_s_children_copy_what_a_chart_writes_while_they_wait",
            a_charting_zygote_s_children_copy_what_a_chart_writes_while_they_wait,
        ),
        (
            "a_program_s_rehearsal_is_surveyed_and_its_pages_copied_by_waiting_children",
            a_program_s_rehearsal_is_surveyed_and_its_pages_copied_by_waiting_children,
        ),
        (
            "a_warm_up_runs_once_in_the_zygote_and_one_that_raises_is_skipped",
            a_warm_up_runs_once_in_the_zygote_and_one_that_raises_is_skipped,
        ),
        (
            "a_zygote_that_dies_is_noticed",
            a_zygote_that_dies_is_noticed,
        ),
        (
            "the_preloads_environment_is_theirs_and_each_child_gets_the_one_it_is_given",
            the_preloads_environment_is_theirs_and_each_child_gets_the_one_it_is_given,
        ),
    ];
    support::run_tests(tests);
}

/// `ZYGOTE_TIMING=1`: a quick look at sequential children against cold sandboxes (the
/// figures that count come from `airlock-bench`).
fn timing() {
    for preload in [&[][..], &["numpy", "pandas", "matplotlib.pyplot"][..]] {
        let zygote = Zygote::start(&spec(preload), &policy()).expect("zygote");
        let n = 50;
        let t = Instant::now();
        for _ in 0..n {
            let (o, out, _) = run(&zygote, "print(1)");
            assert_eq!(out, "1\n", "{o:?}");
        }
        println!("zygote {preload:?}: {:?} per child", t.elapsed() / n);
    }
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        cold("print(1)");
    }
    println!("cold: {:?} per sandbox", t.elapsed() / n);
}
