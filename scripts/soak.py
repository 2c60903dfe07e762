"""The soak: many executions over HTTP at a fixed concurrency, a tenth of them hostile, mixed
with sessions and streamed executions, while the server is killed (SIGKILL) and restarted at
random moments. Run by scripts/soak.sh with the Python client's venv; see its header.

Checks, and fails (exit 1) unless all hold:
- every execution the audit log says started has exactly one final record, and every answer a
  client got has its record, with the same status;
- every benign execution that finished gave the right answer;
- after the last stop no sandbox process, cgroup, mount, temporary directory or System V IPC
  object is left;
- the server's RSS and open descriptors stay bounded;
- the p99 of benign executions while hostile ones run is within 3x of their p99 without them
  (with at least 1000 of each: the short variant reports it only).
Writes its figures (Markdown) to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import airlock_client as al

SANDBOX_UID_MIN = 1_000_000_000  # airlock_sandbox::HOST_ID_BASE


def now() -> float:
    return time.perf_counter()


# What hostile programs do, each under the hostile key (one running at a time, as the tenant's
# `max_concurrency` allows: a sandbox may use a core, and this machine may have only two) and
# its limits.
HOSTILE: dict[str, tuple[str, dict[str, int]]] = {
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", {"timeout_ms": 1000}),
    "memory_hog": ("b = []\nwhile True:\n    b.append(bytearray(16 << 20))", {"memory_mb": 128, "timeout_ms": 2000}),
    "output_flood": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", {"timeout_ms": 1000}),
    "sleep_past_timeout": ("import time\ntime.sleep(60)", {"timeout_ms": 500}),
    "forbidden_syscall": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.syscall(165, b'none', b'/tmp', b'tmpfs', 0, None))\n"  # mount(2)
        "print(libc.syscall(101, 16, 1, 0, 0))",  # ptrace(PTRACE_ATTACH, 1)
        {"timeout_ms": 2000},
    ),
    "disk_fill": (
        "with open('fill', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))",
        {"timeout_ms": 2000},
    ),
    "channel_abuse": (
        "import os\nos.write(3, b'{\"result\": ' + b'[' * 100000)\nos.write(3, b'not json' * 100000)\nos._exit(0)",
        {"timeout_ms": 2000},
    ),
}


@dataclasses.dataclass
class Server:
    binary: Path
    dir: Path
    port: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    epoch: int = 0  # incremented at each start
    started_at: list[float] = dataclasses.field(default_factory=list)  # time.monotonic() of each start
    samples: list[tuple[float, int, int, int]] = dataclasses.field(default_factory=list)  # (t, epoch, rss, fds)
    up: threading.Event = dataclasses.field(default_factory=threading.Event)

    def start(self) -> None:
        log = open(self.dir / f"server-{self.epoch + 1}.log", "wb")
        self.proc = subprocess.Popen(
            [str(self.binary), "serve", "--listen", f"127.0.0.1:{self.port}",
             "--config", str(self.dir / "airlock.toml"), "--state-dir", str(self.dir / "state")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env,
        )
        self.epoch += 1
        self.started_at.append(time.monotonic())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited at start: see {log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                self.up.set()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("the server did not start within 60 s")

    def kill(self) -> None:
        assert self.proc is not None
        self.up.clear()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        assert self.proc is not None
        self.up.clear()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def sample(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None or not self.up.is_set():
            return
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) * 1024
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        except (OSError, StopIteration):
            return
        self.samples.append((time.monotonic(), self.epoch, rss, fds))


@dataclasses.dataclass
class Outcome:
    kind: str
    hostile: bool
    phase: str
    seconds: float
    ids: list[tuple[str, str]]  # (execution id, status) of every answer
    error: str | None  # a wrong answer, or a failure not explained by a kill
    interrupted: bool  # a kill fell inside it
    refused: str | None = None  # a refusal (429/503) that retries did not get past
    started: float = 0.0  # time.monotonic() at its start


class Soak:
    def __init__(self, args: argparse.Namespace, server: Server, keys: dict[str, str]) -> None:
        self.args = args
        self.server = server
        self.keys = keys
        self.url = f"http://127.0.0.1:{server.port}"
        self.local = threading.local()
        self.lock = threading.Lock()
        self.outcomes: list[Outcome] = []
        self.problems: list[str] = []  # of the soak itself (tasks lost, kills missed)

    def client(self, who: str) -> al.Airlock:
        clients = getattr(self.local, "clients", None)
        if clients is None:
            clients = self.local.clients = {}
        if who not in clients:
            clients[who] = al.Airlock(self.url, self.keys[who], retries=20, max_retry_wait=30, timeout=120, deadline=300)
        c: al.Airlock = clients[who]
        return c

    def task(self, kind: str, hostile: bool, phase: str) -> Outcome:
        epoch = self.server.epoch
        ids: list[tuple[str, str]] = []
        started = now()
        started_at = time.monotonic()
        error: str | None = None
        refused: str | None = None
        try:
            if hostile:
                error = self.hostile(kind, ids)
            else:
                error = getattr(self, f"benign_{kind}")(ids)
        except (al.TransportError, al.SessionLost) as e:
            if self.server.epoch == epoch and self.server.up.is_set():
                error = f"{type(e).__name__}: {e}"
        except (al.RateLimited, al.ServiceUnavailable) as e:
            if self.server.epoch == epoch and self.server.up.is_set():
                refused = f"{type(e).__name__}: {e}"
        except al.AirlockError as e:
            error = f"{type(e).__name__}: {e}"
        seconds = now() - started
        interrupted = self.server.epoch != epoch or not self.server.up.is_set()
        if interrupted:
            error = None
        return Outcome(kind, hostile, phase, seconds, ids, error, interrupted, refused, started_at)

    def hostile(self, kind: str, ids: list[tuple[str, str]]) -> str | None:
        code, limits = HOSTILE[kind]
        r = self.client("hostile").run(code, limits=limits)
        ids.append((r.id or "", r.status))
        if r.status == "internal_error":
            return f"{kind}: internal_error: {r.error}"
        return None

    def benign_oneshot(self, ids: list[tuple[str, str]]) -> str | None:
        a, b = random.randrange(1000), random.randrange(1000)
        r = self.client("agents").run(f"a, b = {a}, {b}\nprint(a + b)\na * b")
        ids.append((r.id or "", r.status))
        if (r.status, r.stdout, r.result) != ("ok", f"{a + b}\n", a * b):
            return f"oneshot {a},{b}: {r.status} {r.stdout!r} {r.result!r} {r.error}"
        return None

    def benign_call(self, ids: list[tuple[str, str]]) -> str | None:
        a, b = random.randrange(1000), random.randrange(1000)
        r = self.client("agents").run("def f(a, b):\n    return {'sum': a + b, 'pair': [a, b]}", entrypoint="f", inputs={"a": a, "b": b})
        ids.append((r.id or "", r.status))
        if (r.status, r.result) != ("ok", {"sum": a + b, "pair": [a, b]}):
            return f"call {a},{b}: {r.status} {r.result!r} {r.error}"
        return None

    def benign_stream(self, ids: list[tuple[str, str]]) -> str | None:
        n = random.randrange(2, 6)
        seen = []
        with self.client("agents").stream(f"for i in range({n}):\n    print(i, flush=True)\n{n}") as s:
            for event in s:
                if isinstance(event, al.OutputEvent):
                    seen.append(event.text)
        r = s.execution
        if r is None:
            return "stream: no result"
        ids.append((r.id or "", r.status))
        want = "".join(f"{i}\n" for i in range(n))
        if (r.status, r.stdout, "".join(seen), r.result) != ("ok", want, want, n):
            return f"stream {n}: {r.status} {r.stdout!r} {seen!r} {r.result!r}"
        return None

    def benign_session(self, ids: list[tuple[str, str]]) -> str | None:
        with self.client("agents").session() as s:
            s.run("x = 0")
            for i in range(1, 4):
                r = s.run("x += 1\nx")
                ids.append((r.id or "", r.status))
                if (r.status, r.result) != ("ok", i):
                    return f"session cell {i}: {r.status} {r.result!r} {r.error}"
        return None


BENIGN = ["oneshot"] * 6 + ["call"] * 2 + ["stream", "session"]


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def run_phase(soak: Soak, name: str, count: int, hostile_share: float, kills_at: list[int],
              stand_ins: dict[str, float] | None = None) -> None:
    """Runs `count` tasks on `concurrency` workers, a `hostile_share` of them hostile. With
    `stand_ins`, a hostile task is replaced by the worker sleeping as long as one of its kind
    took: the same load of benign tasks, without the hostile executions."""
    next_task = iter(range(count))
    lock = threading.Lock()
    done = [0]
    kills = sorted(kills_at)

    stood_in = [0]
    counted = len([o for o in soak.outcomes if o.phase == name])

    def worker() -> None:
        while True:
            with lock:
                i = next(next_task, None)
            if i is None:
                return
            kind, hostile = "?", False
            try:
                if not soak.server.up.wait(timeout=120):
                    raise RuntimeError("the server stayed down")
                if random.random() < hostile_share:
                    kind, hostile = random.choice(list(HOSTILE)), True
                    if stand_ins is not None:
                        time.sleep(stand_ins[kind])
                        with lock:
                            stood_in[0] += 1
                        continue
                else:
                    kind, hostile = random.choice(BENIGN), False
                outcome = soak.task(kind, hostile, name)
            except Exception as e:  # anything else is a failure of the soak, never silent
                outcome = Outcome(kind, hostile, name, 0.0, [], f"{type(e).__name__}: {e}", False)
            with soak.lock:
                soak.outcomes.append(outcome)
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(soak.args.concurrency)]
    for t in threads:
        t.start()
    last = now()
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        soak.server.sample()
        if kills and done[0] >= kills[0]:
            kills.pop(0)
            time.sleep(random.uniform(0, 0.5))
            print(f"soak: kill -9 of the server after {done[0]} {name} tasks", flush=True)
            soak.server.kill()
            time.sleep(random.uniform(0.1, 1.0))
            soak.server.start()
        if now() - last > 10:
            last = now()
            print(f"soak: {name}: {done[0]}/{count}", flush=True)
    ran = len([o for o in soak.outcomes if o.phase == name]) - counted
    if ran + stood_in[0] != count:
        soak.problems.append(f"{name}: {count} tasks, {ran} outcomes and {stood_in[0]} stand-ins")
    if kills:
        soak.problems.append(f"{name}: kills after {kills} tasks never happened")


def host_state() -> dict[str, list[str]]:
    def sandbox_processes() -> list[str]:
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                comm = Path(f"/proc/{pid}/comm").read_text()
            except OSError:
                continue
            uid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:")), 0)
            if uid >= SANDBOX_UID_MIN or "__airlock-sandbox-init" in cmd or comm == "airlock-sandbox\n":
                found.append(f"{pid} {cmd}")
        return sorted(found)

    cgroups = []
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        for d in dirs:
            if d.startswith("airlock-") and d != "airlock-supervisor":
                cgroups.append(os.path.join(root, d))
    tmp = []
    for d in ["/tmp", "/var/tmp", "/dev/shm"]:
        for entry in os.scandir(d):
            try:
                if entry.stat(follow_symlinks=False).st_uid >= SANDBOX_UID_MIN or (
                        entry.name.startswith("airlock-") and not entry.name.startswith("airlock-soak-")):
                    tmp.append(entry.path)
            except OSError:
                pass
    mounts = [" ".join(line.split()[3:5]) for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    ipc = [Path(f"/proc/sysvipc/{k}").read_text() for k in ("shm", "sem", "msg")]
    return {"processes": sandbox_processes(), "cgroups": sorted(cgroups), "tmp": sorted(tmp), "mounts": sorted(mounts), "ipc": ipc}


def audit_check(state: Path, outcomes: list[Outcome]) -> tuple[list[str], dict[str, int]]:
    problems: list[str] = []
    started: list[str] = []
    records: dict[str, list[dict[str, object]]] = {}
    events: Counter[str] = Counter()
    for line in (state / "audit.jsonl").read_text().splitlines():
        value = json.loads(line)
        event = value.get("event")
        if event is None:
            records.setdefault(str(value["id"]), []).append(value)
        else:
            events[str(event)] += 1
            if event == "started":
                started.append(str(value["id"]))
    for i in started:
        n = len(records.get(i, []))
        if n != 1:
            problems.append(f"execution {i} started and has {n} final records")
    for o in outcomes:
        for i, status in o.ids:
            got = records.get(i, [])
            if len(got) != 1 or got[0]["status"] != status:
                problems.append(f"{o.kind}: answered {i} {status}, records {got}")
    interrupted = sum(1 for r in records.values() for v in r if v.get("interrupted"))
    figures = {"started": len(started), "records": sum(len(v) for v in records.values()), "interrupted": interrupted,
               "sessions_opened": events["session_opened"], "sessions_closed": events["session_closed"]}
    return problems, figures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--airlock", type=Path, required=True)
    ap.add_argument("--executions", type=int, default=10_000, help="tasks in all (a session is one task of 4 cells)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--hostile", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--outcomes", type=Path, help="also write every task's outcome here (JSON)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    random.seed(seed)

    before = host_state()
    work = Path(tempfile.mkdtemp(prefix="airlock-soak-"))
    keys = {who: "ak_" + secrets.token_hex(24) for who in ("agents", "hostile")}
    digest = {who: "sha256:" + hashlib.sha256(k.encode()).hexdigest() for who, k in keys.items()}
    # The hostile tenant runs one execution at a time, as a key's max_concurrency allows: the
    # isolation of tenants this measures.
    # Every worker may hold a session at once.
    (work / "airlock.toml").write_text(
        f'[sessions]\nmax_open_per_key = {args.concurrency}\n\n'
        f'[[keys]]\nname = "agents"\nhash = "{digest["agents"]}"\nscopes = ["execute", "read", "metrics"]\n\n'
        f'[[keys]]\nname = "hostile"\nhash = "{digest["hostile"]}"\nscopes = ["execute", "read"]\nmax_concurrency = 1\n'
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRLOCK_")}
    server = Server(args.airlock, work, port, env)
    server.start()
    soak = Soak(args, server, keys)

    # Enough benign one-shot executions without hostile ones for a p99 to mean something.
    baseline = max(300, args.executions // 5)
    mixed = args.executions - baseline
    kills_at = sorted(random.sample(range(mixed // 10, mixed * 9 // 10), args.kills)) if args.kills else []
    print(f"soak: seed {seed}; {mixed} tasks with {args.hostile:.0%} hostile and kills after {kills_at}, then {baseline} without", flush=True)
    # Warm-up (zygotes and the pool start, pages fault in): audited, not measured.
    run_phase(soak, "warmup", 20 * args.concurrency, 0.0, [])
    rss_baseline = max((s[2] for s in server.samples), default=0)
    fds_baseline = max((s[3] for s in server.samples), default=0)
    t0 = now()
    run_phase(soak, "mixed", mixed, args.hostile, kills_at)
    t1 = now()
    # The same again without the hostile executions: each replaced by its worker waiting as
    # long as one of its kind took, so that as many benign tasks run at once as before.
    stand_ins = {kind: statistics.median([o.seconds for o in soak.outcomes if o.kind == kind and o.hostile and not o.interrupted] or [1.0])
                 for kind in HOSTILE}
    # Tasks that start in the 5 s after a restart are not measured (below): a kill late in the
    # mixed phase would leave a fast baseline phase nothing to measure, so it waits them out.
    settle = max((r + 5 - now() for r in server.started_at[1:]), default=0.0)
    if settle > 0:
        time.sleep(settle)
    run_phase(soak, "baseline", baseline, args.hostile, [], stand_ins)
    t2 = now()
    stopped = server.stop()
    time.sleep(0.5)
    after = host_state()

    problems: list[str] = list(soak.problems)
    if stopped != 0:
        problems.append(f"the server exited {stopped} on SIGTERM")
    for what in before:
        new = sorted(set(after[what]) - set(before[what])) if what != "ipc" else ([] if after[what] == before[what] else ["changed"])
        if new:
            problems.append(f"left after the last stop: {what}: {new[:10]}")
    audit_problems, audit = audit_check(work / "state", soak.outcomes)
    problems += audit_problems
    wrong = [o for o in soak.outcomes if o.error]
    problems += [f"{o.phase} {o.kind}: {o.error}" for o in wrong[:20]]
    if len(wrong) > 20:
        problems.append(f"... and {len(wrong) - 20} more wrong answers")
    refused = [o for o in soak.outcomes if o.refused]
    if refused:
        problems.append(f"{len(refused)} tasks refused (429/503) after retries; the limits allow this load")
    # A restarted server warms up again (zygotes, the pool, pages), as before the baseline:
    # tasks that started in the 5 s after a restart are not measured.
    restarts = server.started_at[1:]

    def measured(o: Outcome, phase: str) -> bool:
        return (o.phase == phase and not o.hostile and o.kind == "oneshot" and not o.interrupted
                and not o.error and not o.refused and not any(0 <= o.started - r < 5 for r in restarts))

    lat = {phase: [o.seconds for o in soak.outcomes if measured(o, phase)] for phase in ("baseline", "mixed")}
    if args.outcomes:
        args.outcomes.write_text(json.dumps({"restarts": restarts, "outcomes": [dataclasses.asdict(o) for o in soak.outcomes]}))
    p99_base, p99_mixed = p99(lat["baseline"]), p99(lat["mixed"])
    ratio = p99_mixed / p99_base
    # A p99 of fewer than 1000 samples is one of the last few: noise, not a measure (the
    # short variant reports it without checking it).
    ratio_checked = min(len(lat["baseline"]), len(lat["mixed"])) >= 1000
    if ratio_checked and not ratio <= 3.0:
        problems.append(f"benign p99 with hostile executions {p99_mixed * 1000:.0f} ms is {ratio:.1f}x the {p99_base * 1000:.0f} ms without")
    rss_max = max(s[2] for s in server.samples)
    fds_max = max(s[3] for s in server.samples)
    rss_bound = max(2 * rss_baseline, rss_baseline + (64 << 20))
    if rss_max > rss_bound:
        problems.append(f"server RSS grew to {rss_max >> 20} MiB (after the warm-up: {rss_baseline >> 20} MiB)")
    if fds_max > fds_baseline + 64:
        problems.append(f"server descriptors grew to {fds_max} (after the warm-up: {fds_baseline})")

    kinds = Counter((("hostile " if o.hostile else "") + o.kind) for o in soak.outcomes)
    statuses: Counter[str] = Counter()
    for o in soak.outcomes:
        for _, st in o.ids:
            statuses[("hostile " if o.hostile else "benign ") + st] += 1
    interrupted_tasks = sum(1 for o in soak.outcomes if o.interrupted)
    lines = [
        "# Soak figures",
        "",
        f"`scripts/soak.sh` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"binary `{args.airlock}`, seed {seed}. {args.executions} tasks at concurrency {args.concurrency} "
        f"(a session is one task of 4 cells): {mixed} with {args.hostile:.0%} hostile, the server killed with SIGKILL "
        f"{args.kills} times (after {kills_at} of them) and restarted; then {baseline} without hostile ones, each hostile task "
        f"replaced by its worker waiting as long as one of its kind took (so as many benign tasks run at once).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| wall time | {t2 - t0:.0f} s (with hostile {t1 - t0:.0f} s, without {t2 - t1:.0f} s) |",
        f"| tasks | {dict(sorted(kinds.items()))} |",
        f"| answers | {dict(sorted(statuses.items()))} |",
        f"| tasks a kill fell inside | {interrupted_tasks} |",
        f"| refused after retries (429/503) | {len(refused)} |",
        f"| audit | {audit['started']} started, {audit['records']} final records, {audit['interrupted']} recorded as interrupted; sessions {audit['sessions_opened']} opened, {audit['sessions_closed']} closed |",
        f"| benign one-shot p50 / p99, no hostile | {statistics.median(lat['baseline']) * 1000:.0f} / {p99_base * 1000:.0f} ms ({len(lat['baseline'])}) |",
        f"| benign one-shot p50 / p99, with hostile | {statistics.median(lat['mixed']) * 1000:.0f} / {p99_mixed * 1000:.0f} ms ({len(lat['mixed'])}) |",
        f"| p99 ratio (limit 3) | {ratio:.2f}{'' if ratio_checked else ' (not checked: under 1000 samples)'} |",
        f"| server RSS after the warm-up / max | {rss_baseline >> 20} / {rss_max >> 20} MiB |",
        f"| server descriptors after the warm-up / max | {fds_baseline} / {fds_max} |",
        f"| left after the last stop | {'nothing' if not any('left after' in p for p in problems) else 'see problems'} |",
        "",
    ] + [f"- refused: {o.phase} {o.kind}: {o.refused}" for o in refused[:5]] + [
        "",
        "Problems: " + ("none." if not problems else ""),
    ] + [f"- {p}" for p in problems]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    if not problems:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    else:
        print(f"soak: kept {work} (server logs, state)", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
