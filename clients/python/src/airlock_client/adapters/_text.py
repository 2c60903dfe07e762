"""An Execution as text for a model to read: what the code printed, its result, the error with
its traceback, why it stopped when it did not end well, and what was cut. Bounded: a model's
context is small, and a program can print megabytes."""

from __future__ import annotations

import re

from airlock_client.decode import DataFrame, Repr, Series
from airlock_client.models import Execution

__all__ = [
    "DEFAULT_MAX_CHARS",
    "ONE_SHOT_DESCRIPTION",
    "SESSION_DESCRIPTION",
    "clip",
    "render",
    "show",
    "strip_fences",
]

# What the model is told of the tools.
ONE_SHOT_DESCRIPTION = (
    "Runs Python 3 code in a fresh, isolated sandbox and returns what it printed, the value of "
    "its last expression (as `result:`) and any error with its traceback. Nothing is kept "
    "between calls. No network unless the operator allowed it. Use print() for anything else "
    "you want to see."
)
SESSION_DESCRIPTION = (
    "A Python 3 shell in an isolated sandbox that keeps its state between calls, like a "
    "notebook: variables, imports and files persist. Returns what the code printed, the value "
    "of its last expression (as `result:`) and any error with its traceback. No network unless "
    "the operator allowed it. Use print() for anything else you want to see."
)

# Characters of a tool's answer at most: about 5000 tokens, what smolagents keeps of an
# observation (its MAX_LENGTH_TRUNCATE_CONTENT is 20 000).
DEFAULT_MAX_CHARS = 20_000
# The least a long part keeps of itself when others crowd it.
_MIN_SHARE = 200
# Rows of a DataFrame or Series shown.
_ROWS = 20

_WHY = {
    "timeout": "it ran longer than its time limit ({timeout_ms} ms) and was killed",
    "cpu_limit": "it used more than its CPU time limit ({cpu_ms} ms) and was killed",
    "memory_limit": "it used more than its memory limit ({memory_mb} MB) and was killed",
    "policy_violation": "the sandbox refused something it tried to do (a forbidden system call)",
    "crashed": "the Python process crashed",
    "internal_error": "the sandbox service failed; this is not the code's fault, try again",
}


def render(execution: Execution, *, max_chars: int = DEFAULT_MAX_CHARS, note: str | None = None) -> str:
    """The execution as a model should read it: stdout, stderr, `result:` (the repr of the last
    expression's value), the error's traceback, `status:` with why when it did not end ok, and
    bracketed notes for truncated output, charts and files. At most `max_chars` characters:
    long parts keep their beginning and end."""
    e = execution
    head: list[str] = []
    if note:
        head.append(f"[{note}]")
    if not e.ok:
        head.append(_status_line(e))

    parts: list[tuple[str, str]] = []  # (label, body), the long parts that share the budget
    if e.stdout:
        parts.append(("stdout:\n", e.stdout.rstrip("\n")))
    if e.stderr:
        parts.append(("stderr:\n", e.stderr.rstrip("\n")))
    if e.result_json is not None:
        parts.append(("result: ", show(e.result)))
    if e.error is not None:
        trace = (e.error.traceback or "").rstrip("\n")
        last = f"{e.error.type}: {e.error.message}" if e.error.message else e.error.type
        parts.append(("", trace if trace else last))

    tail: list[str] = []
    if e.stdout_truncated:
        tail.append("[stdout was cut at the sandbox's output limit]")
    if e.stderr_truncated:
        tail.append("[stderr was cut at the sandbox's output limit]")
    if e.outputs:
        kinds = ", ".join(sorted({o.type for o in e.outputs}))
        tail.append(f"[{len(e.outputs)} display output(s) not shown here: {kinds}]")
    if e.files:
        names = ", ".join(f.path for f in e.files[:20]) + (", ..." if len(e.files) > 20 else "")
        tail.append(f"[files left in ./outputs: {names}]")
    if e.session_ended:
        tail.append("[the session's interpreter has ended: the next code starts a fresh one, "
                    "without the earlier variables and files]")
    if not parts and not head:
        head.append("(the code ran and printed nothing)")

    fixed = sum(len(x) + 1 for x in head + tail) + sum(len(label) + 1 for label, _ in parts)
    shares = _share([len(body) for _, body in parts], max(max_chars - fixed, _MIN_SHARE * len(parts)))
    body = [label + clip(text, n) for (label, text), n in zip(parts, shares)]
    return clip("\n".join(head + body + tail), max_chars)


def show(value: object) -> str:
    """A result's value as the sandbox would have printed it, as near as its data allows."""
    if isinstance(value, Repr):
        return value.repr + (" [repr cut]" if value.truncated else "")
    if isinstance(value, DataFrame):
        rows = [f"{i!r}: {r!r}" for i, r in zip(value.index[:_ROWS], value.records[:_ROWS])]
        more = [f"... ({len(value.records)} rows)"] if len(value.records) > _ROWS else []
        return "\n".join([f"DataFrame, columns {value.columns!r}", *rows, *more])
    if isinstance(value, Series):
        rows = [f"{i!r}: {v!r}" for i, v in zip(value.index[:_ROWS], value.data[:_ROWS])]
        more = [f"... ({len(value.data)} values)"] if len(value.data) > _ROWS else []
        return "\n".join([f"Series {value.name!r}", *rows, *more])
    return repr(value)


_FENCE_INFO = re.compile(r"[A-Za-z0-9_+-]*[ \t]*")


def strip_fences(code: str) -> str:
    """The code inside a Markdown fence (```python ... ```) when the whole input is one; models
    add them to tool arguments often. Anything else is returned as it is. (String operations,
    not one regular expression: a model's input must not cost quadratic time.)"""
    text = code.strip()
    if len(text) < 6 or not text.startswith("```") or not text.endswith("```"):
        return code
    info, newline, rest = text[3:-3].partition("\n")
    if not newline or not _FENCE_INFO.fullmatch(info):
        return code
    return rest.rstrip(" \t").removesuffix("\n")


def _status_line(e: Execution) -> str:
    limits = {
        "timeout_ms": e.limits.timeout_ms,
        "cpu_ms": e.limits.cpu_ms,
        "memory_mb": e.limits.memory_mb,
    }
    why = _WHY.get(e.status, "").format(**limits)
    if e.status == "crashed" and e.signal is not None:
        why += f" (signal {e.signal})"
    if e.status == "error" and e.error is None:
        why = f"it exited with code {e.exit_code}" if e.exit_code is not None else ""
    hit = f" (limits hit: {', '.join(e.limits_hit)})" if e.limits_hit else ""
    return f"status: {e.status}{hit}" + (f": {why}" if why else "")


def _share(lengths: list[int], budget: int) -> list[int]:
    """Splits `budget` between parts of these lengths: short parts keep all of theirs, long
    ones share the rest equally (water-filling)."""
    shares = [0] * len(lengths)
    left = budget
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for k, i in enumerate(order):
        fair = left // (len(order) - k)
        shares[i] = max(min(lengths[i], fair), _MIN_SHARE)
        left -= shares[i]
    return shares


def clip(text: str, limit: int) -> str:
    """`text` whole if it fits, else its beginning and end around a note of what was cut."""
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters cut ...]\n"
    room = max(limit - len(marker.format(len(text))), 0)
    head = room // 2
    tail = room - head
    return text[:head] + marker.format(len(text) - room) + (text[-tail:] if tail else "")
