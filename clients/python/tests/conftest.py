"""A real `airlock serve` on a loopback port for the client's tests, with the keys they need:
`KEY` (every scope but admin, the crm tools of tool_server.py), `EXECUTE_ONLY` (no `read`),
`SLOW` (one request a minute, for 429 and `Retry-After`), `APPROVER` (scope `approve`, for
the calls of `EXECUTE_ONLY`, whose code may call `crm.write_note`, which needs an approval),
`OTHER` (a plain key, to see none of `KEY`'s); each key's volumes hold at most `VOLUME_QUOTA`
bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import queue
import signal
import subprocess
import tempfile
import threading
from typing import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
KEY = "client-test-key-0123456789abcdef"
EXECUTE_ONLY = "client-execute-only-0123456789ab"
SLOW = "client-slow-key-0123456789abcdef"
APPROVER = "client-approver-0123456789abcdef"
OTHER = "client-other-key-0123456789abcdef"
# Each key's volumes may hold this many bytes in all: small, so that a test passes it.
VOLUME_QUOTA = 256 << 20
# Each key's background executions may store this many bytes: a test fills it.
BACKGROUND_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class Server:
    url: str
    pid: int
    state: pathlib.Path


def _hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _binary() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("AIRLOCK_TEST_BIN", ROOT / "target" / "debug" / "airlock"))
    if not path.is_file():
        raise RuntimeError(f"{path} does not exist: build it (cargo build -p airlock) or set AIRLOCK_TEST_BIN")
    return path


def _tools_config() -> str:
    """The crm tool server of crates/cli/tests, run by the MCP SDK's venv (scripts/lib.sh
    ensure_mcp_client makes it)."""
    python = ROOT / "target" / "mcp-client" / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{python} is missing: run `. scripts/lib.sh && ensure_mcp_client`")
    script = ROOT / "crates" / "cli" / "tests" / "tool_server.py"
    return f'[tools.servers.crm]\ncommand = "{python}"\nargs = ["{script}", "stdio"]\napproval = ["write_note"]\n'


def config() -> str:
    return f"""
{_tools_config()}
[[keys]]
name = "client"
hash = "{_hash(KEY)}"
tools = ["crm.*"]

[[keys]]
name = "execute-only"
hash = "{_hash(EXECUTE_ONLY)}"
scopes = ["execute"]
tools = ["crm.write_note"]

[[keys]]
name = "approver"
hash = "{_hash(APPROVER)}"
scopes = ["approve"]
approves = ["execute-only"]

[[keys]]
name = "other"
hash = "{_hash(OTHER)}"

[[keys]]
name = "slow"
hash = "{_hash(SLOW)}"
rate_per_minute = 1

[volumes]
max_bytes_per_key = {VOLUME_QUOTA}

# What a key's background executions may store: room for every test's, and one that fills it.
[background]
max_bytes_per_key = {BACKGROUND_BYTES}
"""


def launch(dir: pathlib.Path, listen: str = "127.0.0.1:0", extra: str = "") -> tuple[subprocess.Popen[str], str]:
    """`airlock serve` with its config (and the TOML in `extra` before it) and state in `dir`
    (which may hold an earlier server's state), on `listen`; returns the process and its URL
    once it listens."""
    (dir / "airlock.toml").write_text(extra + config())
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRLOCK_")}
    # One warm sandbox and no zygote: enough for these tests, and quick to start.
    env["AIRLOCK_POOL__SIZE"] = "1"
    env["AIRLOCK_ZYGOTE__ENABLED"] = "false"
    proc = subprocess.Popen(
        [str(_binary()), "serve", "--listen", listen, "--config", str(dir / "airlock.toml"),
         "--state-dir", str(dir / "state")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    while True:
        line = lines.get(timeout=60)
        if line is None:
            raise RuntimeError("airlock serve exited:\n" + "".join(seen))
        seen.append(line)
        if line.startswith("airlock: listening on "):
            return proc, line.removeprefix("airlock: listening on ").strip()


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, and no cgroup of the server's left behind."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    left = [p for p in _cgroups() if p.name.startswith(f"airlock-{proc.pid}-")]
    assert not left, f"cgroups left behind: {left}"


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with tempfile.TemporaryDirectory(prefix="airlock-test-client-") as tmp:
        dir = pathlib.Path(tmp)
        proc, url = launch(dir)
        try:
            yield Server(url, proc.pid, dir / "state")
        finally:
            stop(proc)


def _cgroups() -> list[pathlib.Path]:
    root = pathlib.Path("/sys/fs/cgroup")
    found: list[pathlib.Path] = []
    for controller in [root, *root.iterdir()] if root.is_dir() else []:
        if controller.is_dir():
            found.extend(controller.glob("airlock-*"))
    return found
