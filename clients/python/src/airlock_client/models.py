"""What the API answers, as typed values. Each is read field by field with its type checked:
an answer with a missing field or a field of the wrong type is a ProtocolError naming it.
Fields a newer server adds are ignored, so an older client keeps working."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Iterable, Literal, TypeVar, Union

from airlock_client.decode import DecodeError, decode
from airlock_client.errors import EvaluationFailed, ExecutionFailed, ProtocolError

__all__ = [
    "Approval",
    "ApprovalDetail",
    "ArgumentsShown",
    "BackgroundError",
    "BackgroundEvent",
    "BackgroundInfo",
    "BackgroundState",
    "Decided",
    "Environment",
    "Evaluation",
    "EvalError",
    "Execution",
    "ExecutionError",
    "ExecutionRecord",
    "FileEntry",
    "Isolation",
    "Limits",
    "Output",
    "OutputEvent",
    "OutputFile",
    "SessionInfo",
    "Snapshot",
    "Status",
    "StreamEvent",
    "Tool",
    "ToolList",
    "TruncatedEvent",
    "Usage",
    "VolumeFiles",
    "VolumeInfo",
]

# The result vocabulary: how an execution ended.
Status = Literal[
    "ok", "error", "timeout", "memory_limit", "cpu_limit", "policy_violation", "crashed",
    "internal_error",
]
_STATUSES = frozenset(Status.__args__)  # type: ignore[attr-defined]

_T = TypeVar("_T")


class _Reader:
    """One JSON object of an answer, read with its place (`$.usage.wall_ms`) for errors."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        self.obj: dict[str, object] = value
        self.where = where

    def _get(self, name: str, kind: type[_T] | tuple[type, ...], optional: bool) -> object:
        if name not in self.obj:
            if optional:
                return None
            raise ProtocolError(f"{self.where}.{name}: missing")
        value = self.obj[name]
        if value is None and optional:
            return None
        # bool is an int in Python; a count is never a bool in airlock's answers.
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float))
        if not ok:
            raise ProtocolError(f"{self.where}.{name}: expected {_name(kind)}, got {type(value).__name__}")
        return value

    def text(self, name: str) -> str:
        return self._get(name, str, False)  # type: ignore[return-value]

    def opt_text(self, name: str) -> str | None:
        return self._get(name, str, True)  # type: ignore[return-value]

    def integer(self, name: str) -> int:
        return self._get(name, int, False)  # type: ignore[return-value]

    def opt_integer(self, name: str) -> int | None:
        return self._get(name, int, True)  # type: ignore[return-value]

    def flag(self, name: str, default: bool | None = None) -> bool:
        if default is not None and name not in self.obj:
            return default
        return self._get(name, bool, False)  # type: ignore[return-value]

    def array(self, name: str, default: list[object] | None = None) -> list[object]:
        if default is not None and name not in self.obj:
            return default
        return self._get(name, list, False)  # type: ignore[return-value]

    def texts(self, name: str) -> list[str]:
        items = self.array(name)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise ProtocolError(f"{self.where}.{name}[{i}]: expected str")
        return items  # type: ignore[return-value]

    def child(self, name: str) -> _Reader:
        return _Reader(self._get(name, dict, False), f"{self.where}.{name}")

    def opt_object(self, name: str) -> dict[str, object] | None:
        return self._get(name, dict, True)  # type: ignore[return-value]

    def any(self, name: str) -> object:
        return self.obj.get(name)

    def each(self, name: str, default: list[object] | None = None) -> list[_Reader]:
        return [_Reader(v, f"{self.where}.{name}[{i}]") for i, v in enumerate(self.array(name, default))]

    def snapshot(self, name: str) -> Snapshot | None:
        """An optional `Snapshot` field (`paused`, `resumed`)."""
        value = self.opt_object(name)
        return None if value is None else Snapshot._read(_Reader(value, f"{self.where}.{name}"))


def _name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def _b64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ProtocolError(f"{where}: not base64: {e}") from None


@dataclass(frozen=True)
class ExecutionError:
    """The program's uncaught exception (`type` is its class name), or airlock's own failure."""

    type: str
    message: str
    traceback: str | None

    @classmethod
    def _read(cls, r: _Reader) -> ExecutionError:
        return cls(r.text("type"), r.text("message"), r.opt_text("traceback"))


@dataclass(frozen=True)
class Limits:
    """The limits an execution ran under (after defaults and ceilings)."""

    timeout_ms: int
    memory_mb: int
    cpu_ms: int
    pids: int
    disk_mb: int
    output_bytes: int

    @classmethod
    def _read(cls, r: _Reader) -> Limits:
        return cls(*(r.integer(n) for n in ("timeout_ms", "memory_mb", "cpu_ms", "pids", "disk_mb", "output_bytes")))


@dataclass(frozen=True)
class Usage:
    """What the execution used; `egress` is the proxy's account when it had a network."""

    wall_ms: int
    cpu_ms: int | None
    memory_peak_bytes: int | None
    tool_calls: int
    egress: dict[str, object] | None

    @classmethod
    def _read(cls, r: _Reader) -> Usage:
        return cls(
            r.integer("wall_ms"),
            r.opt_integer("cpu_ms"),
            r.opt_integer("memory_peak_bytes"),
            r.opt_integer("tool_calls") or 0,
            r.opt_object("egress"),
        )


@dataclass(frozen=True)
class Isolation:
    """How the sandbox was built, as the server reports it (README: "What is enforced")."""

    namespaces: list[str]
    uid: int
    network: str
    filesystem: str
    seccomp: str
    landlock: str
    landlock_abi: int | None
    cgroup: str
    no_new_privs: bool
    capabilities: list[str]
    downgraded: list[str]
    egress: dict[str, object] | None

    @classmethod
    def _read(cls, r: _Reader) -> Isolation:
        return cls(
            r.texts("namespaces"),
            r.integer("uid"),
            r.text("network"),
            r.text("filesystem"),
            r.text("seccomp"),
            r.text("landlock"),
            r.opt_integer("landlock_abi"),
            r.text("cgroup"),
            r.flag("no_new_privs"),
            r.texts("capabilities"),
            r.texts("downgraded"),
            r.opt_object("egress"),
        )


@dataclass(frozen=True)
class Output:
    """A rich output (`display()`, a chart): its media `type` and `data` as sent (text, base64
    for PNG, JSON for `application/json`)."""

    type: str
    data: object

    def bytes(self) -> bytes:
        """The image of an `image/png` output, or the UTF-8 of a text one."""
        if not isinstance(self.data, str):
            raise ProtocolError(f"a {self.type} output holds no text")
        return _b64(self.data, f"output {self.type}") if self.type == "image/png" else self.data.encode()

    def value(self) -> object:
        """An `application/json` output's data, decoded like a result."""
        return decode(self.data)

    @classmethod
    def _read(cls, r: _Reader) -> Output:
        return cls(r.text("type"), r.any("data"))


@dataclass(frozen=True)
class OutputFile:
    """A file the code left in `./outputs`: its `content`, or why it was `skipped`."""

    path: str
    size: int
    content: bytes | None
    skipped: str | None

    @classmethod
    def _read(cls, r: _Reader) -> OutputFile:
        b64 = r.opt_text("base64")
        return cls(
            r.text("path"),
            r.integer("size"),
            None if b64 is None else _b64(b64, f"{r.where}.base64"),
            r.opt_text("skipped"),
        )


@dataclass(frozen=True)
class Snapshot:
    """A session's snapshot (docs/sessions.md): when it was `taken_at` (RFC 3339), after how
    many `cells`, its size on disk (`stored_bytes`, compressed) and as the sandbox wrote it
    (`state_bytes`), the `variables` it holds, and those it could not keep (a lock, a
    generator, an open file or socket), each with why: `not_kept` are gone from the session
    that comes back. In a listing of sessions, `variables` and `not_kept` are empty."""

    taken_at: str
    cells: int
    stored_bytes: int
    state_bytes: int
    variables: list[str]
    not_kept: dict[str, str]

    @classmethod
    def _read(cls, r: _Reader) -> Snapshot:
        not_kept = r.child("not_kept")
        for name, why in not_kept.obj.items():
            if not isinstance(why, str):
                raise ProtocolError(f"{not_kept.where}.{name[:40]}: expected str, got {type(why).__name__}")
        return cls(
            r.text("taken_at"),
            r.integer("cells"),
            r.integer("stored_bytes"),
            r.integer("state_bytes"),
            r.texts("variables"),
            dict(not_kept.obj),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class Execution:
    """One execution's outcome, every field of the result vocabulary. `result` is the value
    decoded into Python (`result_json` as sent); `id` is None for a session's cell when the
    server gave none. `output_streamed` is true when stdout and stderr came as events (the
    client put them back together here). `session_ended` is set for a session's cells;
    `resumed` when the cell brought its paused session back first (what came back, and what
    could not)."""

    id: str | None
    status: Status
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    result: object
    result_json: object
    error: ExecutionError | None
    outputs: list[Output]
    files: list[OutputFile]
    usage: Usage
    limits: Limits
    limits_hit: list[str]
    isolation: Isolation
    output_streamed: bool = False
    session_ended: bool | None = None
    resumed: Snapshot | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def raise_for_status(self) -> Execution:
        """Raises ExecutionFailed unless the status is `ok`; returns the execution."""
        if not self.ok:
            raise ExecutionFailed(self)
        return self

    @classmethod
    def _read(cls, value: object, where: str = "$") -> Execution:
        r = _Reader(value, where)
        status = r.text("status")
        if status not in _STATUSES:
            raise ProtocolError(f"{where}.status: unknown status {status[:40]!r}")
        error = r.opt_object("error")
        raw = r.any("result")
        try:
            result = decode(raw)
        except DecodeError as e:
            raise DecodeError(f"{where}.result{e.path[1:]}", e.reason) from None
        session_ended = r.obj.get("session_ended")
        return cls(
            id=r.opt_text("id"),
            status=status,  # type: ignore[arg-type]
            exit_code=r.opt_integer("exit_code"),
            signal=r.opt_integer("signal"),
            stdout=r.text("stdout"),
            stderr=r.text("stderr"),
            stdout_truncated=r.flag("stdout_truncated"),
            stderr_truncated=r.flag("stderr_truncated"),
            result=result,
            result_json=raw,
            error=None if error is None else ExecutionError._read(_Reader(error, f"{where}.error")),
            outputs=[Output._read(o) for o in r.each("outputs", [])],
            files=[OutputFile._read(f) for f in r.each("files", [])],
            usage=Usage._read(r.child("usage")),
            limits=Limits._read(r.child("limits")),
            limits_hit=r.texts("limits_hit"),
            isolation=Isolation._read(r.child("isolation")),
            output_streamed=r.flag("output_streamed", False),
            session_ended=r.flag("session_ended") if session_ended is not None else None,
            resumed=r.snapshot("resumed"),
        )


@dataclass(frozen=True)
class OutputEvent:
    """Text the program wrote on `stream` (stdout or stderr), as it wrote it."""

    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class TruncatedEvent:
    """`stream` reached the output limit (`limit` bytes); the rest was dropped."""

    stream: Literal["stdout", "stderr"]
    limit: int


# How much of a call's arguments `Approval.arguments_preview` shows: all of them, all but the
# ends of long strings, or nothing (a sentence says so).
ArgumentsShown = Literal["whole", "cut", "too_large"]
_ARGUMENTS_SHOWN = frozenset(ArgumentsShown.__args__)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Approval:
    """A tool call waiting for an approval (docs/approvals.md): as `approvals()` lists it, and
    as a stream's `approval_requested` event says one of its calls waits. Show a person
    `arguments_preview`: bounded, every key and every value but long strings, and nothing but
    printable ASCII (anything else written `\\u{...}`). `arguments_shown` says how much of
    the arguments it shows: `whole`, `cut` (long strings cut, each followed by `...(N more
    bytes)`) or `too_large` (none of them: a sentence says so). `arguments_escaped` is true
    when it escapes characters of theirs (a right-to-left override, an invisible or a control
    character): a screen could show those as something else. `arguments` is None unless the
    preview is all of them and escapes nothing; `approval(id)` gives them whole. `line` is the
    code's line as the sandbox reported it (where to look, not a proof)."""

    id: str
    execution_id: str
    key: str
    server: str
    tool: str
    arguments: dict[str, object] | None
    arguments_preview: str
    arguments_shown: ArgumentsShown
    arguments_escaped: bool
    arguments_bytes: int
    arguments_sha256: str
    line: int | None
    requested_at: str
    expires_at: str

    @classmethod
    def _read(cls, r: _Reader) -> Approval:
        shown = r.text("arguments_shown")
        if shown not in _ARGUMENTS_SHOWN:
            raise ProtocolError(f"{r.where}.arguments_shown: unknown value {shown[:40]!r}")
        return cls(
            r.text("id"), r.text("execution_id"), r.text("key"), r.text("server"), r.text("tool"),
            r.opt_object("arguments"), r.text("arguments_preview"), shown,  # type: ignore[arg-type]
            r.flag("arguments_escaped"), r.integer("arguments_bytes"), r.text("arguments_sha256"),
            r.opt_integer("line"), r.text("requested_at"), r.text("expires_at"),
        )


@dataclass(frozen=True)
class ApprovalDetail:
    """One waiting call as `approval(id)` gives it: the `approval` as listed, and its
    `arguments` whole, parsed: the JSON object the tool will get (`approval.arguments_bytes`
    and `arguments_sha256` are of its bytes as sent). Its strings are the call's exactly, a
    right-to-left override or a control character included: show a person
    `approval.arguments_preview`, not these strings as text."""

    approval: Approval
    arguments: dict[str, object]

    @classmethod
    def _read(cls, value: object) -> ApprovalDetail:
        r = _Reader(value, "$")
        return cls(Approval._read(r.child("approval")), r.child("arguments").obj)


@dataclass(frozen=True)
class Decided:
    """A decision made: the call as it was shown, `approve` or `deny`, and the deciding key."""

    approval: Approval
    decision: Literal["approve", "deny"]
    decided_by: str

    @classmethod
    def _read(cls, value: object) -> Decided:
        r = _Reader(value, "$")
        decision = r.text("decision")
        if decision not in ("approve", "deny"):
            raise ProtocolError(f"$.decision: expected approve or deny, got {decision[:40]!r}")
        return cls(Approval._read(r.child("approval")), decision, r.text("decided_by"))  # type: ignore[arg-type]


def read_approvals(value: object) -> list[Approval]:
    return [Approval._read(a) for a in _Reader(value, "$").each("approvals")]


# What a stream yields: output events as they come, an Approval when one of its tool calls
# waits for one, the Execution last.
StreamEvent = Union[OutputEvent, TruncatedEvent, Approval, Execution]

# Where a background execution is: `queued`, `running`, then `finished` (it ran: its result
# says how), `failed` (airlock could not run it), `cancelled` or `interrupted` (the server
# stopped while it waited or ran).
BackgroundState = Literal["queued", "running", "finished", "failed", "cancelled", "interrupted"]
_BACKGROUND_STATES = frozenset(BackgroundState.__args__)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class BackgroundError:
    """Why a background execution ended without a result, as the server says it: its `code`
    (`cancelled`, `interrupted`, or the code of the refusal that stopped it) and `message`.
    Also the last event of `events()` when it ended so."""

    code: str
    message: str
    request_id: str | None = None

    @classmethod
    def _read(cls, r: _Reader) -> BackgroundError:
        return cls(r.text("code"), r.text("message"), r.opt_text("request_id"))


@dataclass(frozen=True)
class BackgroundInfo:
    """A background execution as the server holds it (`GET /v1/executions/{id}`): its `state`,
    when it was submitted, started and ended (RFC 3339), its `limits`, the `error` when it
    ended without a result, and the whole `result` (output and all) once it has one."""

    id: str
    state: BackgroundState
    submitted_at: str
    started_at: str | None
    ended_at: str | None
    limits: Limits
    error: BackgroundError | None = None
    result: Execution | None = None

    @property
    def ended(self) -> bool:
        return self.state not in ("queued", "running")

    @classmethod
    def _read(cls, value: object) -> BackgroundInfo:
        r = _Reader(value, "$")
        state = r.text("state")
        if state not in _BACKGROUND_STATES:
            raise ProtocolError(f"$.state: unknown state {state[:40]!r}")
        error = r.opt_object("error")
        result = r.opt_object("result")
        return cls(
            r.text("id"),
            state,  # type: ignore[arg-type]
            r.text("submitted_at"),
            r.opt_text("started_at"),
            r.opt_text("ended_at"),
            Limits._read(r.child("limits")),
            None if error is None else BackgroundError._read(_Reader(error, "$.error")),
            None if result is None else Execution._read(result, "$.result"),
        )


# What `events()` of a background execution yields: its output and approval events, then the
# Execution (without its output, which came as events) or a BackgroundError.
BackgroundEvent = Union[OutputEvent, TruncatedEvent, Approval, Execution, BackgroundError]


@dataclass(frozen=True)
class EvalError:
    """A Python-style error of `eval`; `limit` when one of the evaluator's budgets refused."""

    type: str
    message: str
    limit: bool


@dataclass(frozen=True)
class Evaluation:
    """`eval`'s answer: `value` (plain JSON, present only when JSON holds it exactly), the
    value's `type` name, `repr` and `str` as CPython would print them; or the `error`."""

    ok: bool
    type: str | None
    repr: str | None
    str: str | None
    value: object
    error: EvalError | None

    def raise_for_error(self) -> Evaluation:
        """Raises EvaluationFailed (a ValueError) with the evaluator's error unless `ok`."""
        if not self.ok:
            error = self.error or EvalError("Error", "no error given", False)
            raise EvaluationFailed(error.type, error.message)
        return self

    @classmethod
    def _read(cls, value: object) -> Evaluation:
        r = _Reader(value, "$")
        error = r.opt_object("error")
        err = None
        if error is not None:
            e = _Reader(error, "$.error")
            err = EvalError(e.text("type"), e.text("message"), e.flag("limit", False))
        ok = r.flag("ok")
        if not ok and err is None:
            raise ProtocolError("$.error: missing where ok is false")
        # The evaluator's only forms are an int past 64 bits and a float that is not finite
        # (a dict with a "$airlock" key has no value), read as results are.
        try:
            value = decode(r.any("value"))
        except DecodeError as e:
            raise DecodeError(f"$.value{e.path[1:]}", e.reason) from None
        return cls(ok, r.opt_text("type"), r.opt_text("repr"), r.opt_text("str"), value, err)


@dataclass(frozen=True)
class SessionInfo:
    """A session as the server holds it. `ended` is the status of the cell that ended it;
    `egress_between_cells` the proxy's account of connections made while no cell ran (threads
    a cell left running), with an egress policy. `paused` is its snapshot while it is paused
    (its next request brings it back); `resumed` is set in the answer that brought it back
    (`Session.resume`, `Session.fork`)."""

    id: str
    created_at: str
    expires_at: str
    idle_timeout_ms: int
    max_lifetime_ms: int
    cells: int
    ended: Status | None
    limits: Limits
    egress_between_cells: dict[str, object] | None = None
    paused: Snapshot | None = None
    resumed: Snapshot | None = None

    @classmethod
    def _read(cls, value: object, where: str = "$") -> SessionInfo:
        r = _Reader(value, where)
        ended = r.opt_text("ended")
        if ended is not None and ended not in _STATUSES:
            raise ProtocolError(f"{where}.ended: unknown status {ended[:40]!r}")
        return cls(
            r.text("id"),
            r.text("created_at"),
            r.text("expires_at"),
            r.integer("idle_timeout_ms"),
            r.integer("max_lifetime_ms"),
            r.integer("cells"),
            ended,  # type: ignore[arg-type]
            Limits._read(r.child("limits")),
            r.opt_object("egress_between_cells"),
            r.snapshot("paused"),
            r.snapshot("resumed"),
        )


@dataclass(frozen=True)
class FileEntry:
    """An entry below a session's working directory or of a volume: `type` is `file`, `dir`,
    `link` or `other` (links are listed, never followed). A volume's listing marks an entry
    `lossy` when a name on its path is not UTF-8 (shown with U+FFFD; the file methods cannot
    name it, code in a sandbox can rename or remove it), and `unreadable` when it could not
    be looked at or, a directory, its entries could not be read (what it holds is not
    listed)."""

    path: str
    type: str
    size: int
    lossy: bool = False
    unreadable: bool = False

    @classmethod
    def _read(cls, r: _Reader) -> FileEntry:
        return cls(
            r.text("path"), r.text("type"), r.integer("size"), r.flag("lossy", False), r.flag("unreadable", False)
        )


class VolumeFiles(list[FileEntry]):
    """A volume's listing (`Volume.files()`): a list of its entries, and `truncated`, true when
    the volume held more than one listing gives (10,000 entries or 4 MiB of paths): what is
    listed is then not all of it. Compares as the list it is."""

    truncated: bool

    def __init__(self, entries: Iterable[FileEntry] = (), truncated: bool = False) -> None:
        super().__init__(entries)
        self.truncated = truncated

    def __repr__(self) -> str:
        return f"VolumeFiles({list.__repr__(self)}, truncated={self.truncated})"


@dataclass(frozen=True)
class Tool:
    """A tool this key's code may call: `name` as code calls it (`tools.crm.find`), the
    server's `tool`, its Python `signature` and the MCP `input_schema`."""

    name: str
    tool: str
    read_only: bool
    signature: str
    description: str
    input_schema: dict[str, object]

    @classmethod
    def _read(cls, r: _Reader) -> Tool:
        schema = r.opt_object("input_schema")
        if schema is None:
            raise ProtocolError(f"{r.where}.input_schema: missing")
        return cls(r.text("name"), r.text("tool"), r.flag("read_only"), r.text("signature"), r.text("description"), schema)


@dataclass(frozen=True)
class ToolList:
    """The key's tools, and `python`: the stub of the `tools` package its code imports."""

    tools: list[Tool]
    python: str

    @classmethod
    def _read(cls, value: object) -> ToolList:
        r = _Reader(value, "$")
        return cls([Tool._read(t) for t in r.each("tools")], r.text("python"))


@dataclass(frozen=True)
class ExecutionRecord:
    """The audit record of an execution (`GET /v1/executions/{id}`). `interrupted` when the
    server stopped before it ended (its record was written at the next start)."""

    id: str
    request_id: str
    key: str
    key_fingerprint: str
    started_at: str
    code_sha256: str
    code_bytes: int
    status: Status
    exit_code: int | None
    signal: int | None
    limits: Limits
    limits_hit: list[str]
    usage: Usage
    # The server stopped before the execution ended: recorded at its next start, status
    # `internal_error`, and `error` says so.
    interrupted: bool = False
    error: ExecutionError | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @classmethod
    def _read(cls, value: object) -> ExecutionRecord:
        r = _Reader(value, "$")
        status = r.text("status")
        if status not in _STATUSES:
            raise ProtocolError(f"$.status: unknown status {status[:40]!r}")
        known = set(cls.__dataclass_fields__)
        error = r.opt_object("error")
        return cls(
            r.text("id"),
            r.text("request_id"),
            r.text("key"),
            r.text("key_fingerprint"),
            r.text("started_at"),
            r.text("code_sha256"),
            r.integer("code_bytes"),
            status,  # type: ignore[arg-type]
            r.opt_integer("exit_code"),
            r.opt_integer("signal"),
            Limits._read(r.child("limits")),
            r.texts("limits_hit"),
            Usage._read(r.child("usage")),
            r.flag("interrupted", False),
            None if error is None else ExecutionError._read(_Reader(error, "$.error")),
            {k: v for k, v in r.obj.items() if k not in known},
        )


@dataclass(frozen=True)
class Environment:
    """A named set of packages built in a sandbox (`environment=` of `run` and `session`)."""

    name: str
    hash: str
    requirements: list[str]
    python: str
    created_at: str
    size_bytes: int
    packages: list[str]

    @classmethod
    def _read(cls, value: object, where: str = "$") -> Environment:
        r = _Reader(value, where)
        return cls(
            r.text("name"),
            r.text("hash"),
            r.texts("requirements"),
            r.text("python"),
            r.text("created_at"),
            r.integer("size_bytes"),
            r.texts("packages"),
        )


@dataclass(frozen=True)
class VolumeInfo:
    """A volume of this key's: a named directory kept across executions, sessions and server
    restarts, bounded while it is written to `size_bytes` (all of it counted against the key's
    quota) and `max_entries` files, directories and links. `used_bytes` and `used_entries`
    (what it holds now) are given by `Volume.info()` only; None in a listing."""

    name: str
    size_bytes: int
    max_entries: int
    created_at: str
    used_bytes: int | None = None
    used_entries: int | None = None

    @classmethod
    def _read(cls, value: object, where: str = "$") -> VolumeInfo:
        r = _Reader(value, where)
        return cls(
            r.text("name"),
            r.integer("size_bytes"),
            r.integer("max_entries"),
            r.text("created_at"),
            r.opt_integer("used_bytes"),
            r.opt_integer("used_entries"),
        )


def read_environments(value: object) -> list[Environment]:
    if not isinstance(value, list):
        raise ProtocolError(f"$: expected a list, got {type(value).__name__}")
    return [Environment._read(v, f"$[{i}]") for i, v in enumerate(value)]


def read_files(value: object) -> list[FileEntry]:
    return [FileEntry._read(f) for f in _Reader(value, "$").each("files")]


def read_volume_files(value: object) -> VolumeFiles:
    r = _Reader(value, "$")
    return VolumeFiles([FileEntry._read(f) for f in r.each("files")], r.flag("truncated"))


def read_sessions(value: object) -> list[SessionInfo]:
    r = _Reader(value, "$")
    return [SessionInfo._read(s.obj, s.where) for s in r.each("sessions")]


def read_volumes(value: object) -> list[VolumeInfo]:
    r = _Reader(value, "$")
    return [VolumeInfo._read(v.obj, v.where) for v in r.each("volumes")]
