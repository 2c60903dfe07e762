"""The pickle guard (crates/pyguard, Rust), built by maturin. Private: use airlock_client.pickle."""

def scan(data: bytes, allow: list[str], max_bytes: int) -> str:
    """The report as JSON text, as `airlock pickle scan --json` prints it (without `file`)."""

def decode(data: bytes, allow: list[str], max_bytes: int, max_depth: int) -> str:
    """A safe pickle's value as JSON text, as `airlock pickle decode` prints it."""

def default_allow() -> list[str]:
    """The globals allowed by default (airlock_pickle::DEFAULT_ALLOW)."""

class Unsafe(Exception):
    """args: (reasons: list[str],)"""

class Malformed(Exception):
    """args: (offset: int, reason: str)"""

class Unrepresentable(Exception):
    """args: (why: str,)"""

class Failed(Exception):
    """args: (where: str,): the guard itself failed (a bug), never a verdict."""
