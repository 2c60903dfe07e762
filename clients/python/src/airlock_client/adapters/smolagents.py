"""A smolagents remote executor that runs a `CodeAgent`'s code in airlock, as the E2B, Docker
and Modal executors do in theirs: `AirlockExecutor`.

    from smolagents import CodeAgent, InferenceClientModel
    from airlock_client import Airlock
    from airlock_client.adapters.smolagents import AirlockExecutor

    with Airlock() as airlock, AirlockExecutor(client=airlock) as executor:
        agent = CodeAgent(tools=[], model=InferenceClientModel(), executor=executor)
        agent.run("What is the 20th Fibonacci number?")

The agent's steps run as cells of one airlock session, so variables and imports persist
between steps as with the local executor; the agent's tools are defined in the session (their
code runs in the sandbox, as with the other remote executors), and `final_answer()` ends the
run with its value read back as data (airlock's JSON result, never a pickle). An error in a
step is raised as `AgentError` with the traceback, which the agent hands to the model. If the
session ends (idle timeout, lifetime, `exit()`, a memory kill), the next step opens a new one,
defines the tools again and tells the model that its variables are gone.

Packages cannot be installed in a sandbox (it has no pip and no network): they come from the
server's environments. `additional_imports` (and the tools' requirements) are checked there,
and those missing are logged; pass `environment=` to use a named airlock environment."""

from __future__ import annotations

import inspect
import types
from types import TracebackType
from typing import Any, Mapping

from airlock_client.adapters import _sandbox
from airlock_client.adapters._text import DEFAULT_MAX_CHARS, clip, render
from airlock_client.client import Airlock, Session
from airlock_client.decode import Repr
from airlock_client.models import Execution

try:
    from smolagents.local_python_executor import CodeOutput
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.utils import AgentError, get_source
except ModuleNotFoundError as e:  # pragma: no cover - depends on what is installed
    if e.name not in ("smolagents",):
        raise  # installed, but broken: its own error says more
    raise ImportError(
        "airlock_client.adapters.smolagents needs smolagents: pip install 'airlock-client[smolagents]'"
    ) from e

__all__ = ["AirlockExecutor"]

# Where final_answer() leaves its value in the session, for the executor to read back.
_ANSWER = "_airlock_final_answer"
_CHECK_IMPORTS = "import importlib.util\n[n for n in {names!r} if importlib.util.find_spec(n) is None]\n"


def _final_answer_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    # Runs in the sandbox, as FinalAnswerTool.forward: the answer stays in the session's
    # namespace and the exception ends the step; the executor reads the answer back as data.
    class FinalAnswerException(BaseException):
        pass

    globals()["_airlock_final_answer"] = self._forward(*args, **kwargs)
    raise FinalAnswerException("final_answer() was called")


class AirlockExecutor(RemotePythonExecutor):  # type: ignore[misc]  # smolagents is untyped
    """Runs a CodeAgent's code in an airlock session: `CodeAgent(..., executor=AirlockExecutor())`.

    `client` is an `Airlock` (None: one is made from `$AIRLOCK_URL` and `$AIRLOCK_API_KEY`);
    `limits`, `files`, `env`, `environment`, `egress`, `idle_timeout_ms` and `max_lifetime_ms`
    set up the session; `max_chars` bounds the text of a step's output or error the model
    reads. `logger` defaults to a new `AgentLogger`. Use it as a context manager, or call
    `cleanup()` (the agent's own `cleanup()` and `with CodeAgent(...)` do)."""

    def __init__(
        self,
        additional_imports: list[str] | None = None,
        logger: AgentLogger | None = None,
        *,
        client: Airlock | None = None,
        limits: Mapping[str, int] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        env: Mapping[str, str] | None = None,
        environment: str | None = None,
        egress: Mapping[str, object] | None = None,
        idle_timeout_ms: int | None = None,
        max_lifetime_ms: int | None = None,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        # allow_pickle stays False: nothing is ever unpickled here.
        super().__init__(list(additional_imports or []), logger or AgentLogger(level=LogLevel.INFO))
        options = _sandbox.Options(
            limits=limits, files=files, env=env, environment=environment, egress=egress,
            idle_timeout_ms=idle_timeout_ms, max_lifetime_ms=max_lifetime_ms,
        )
        self.max_chars = max_chars
        self._kernel = _sandbox.Kernel(client, options, setup=self._replay)
        # The code that defined the tools and the agent's variables, run again in a session
        # that replaces an ended one; and what send_tools/send_variables is sending now.
        self._setup: dict[str, str] = {}
        self._sending: str | None = None
        self._checked = False

    @property
    def session_id(self) -> str | None:
        """The id of the open session (None before the first step)."""
        return self._kernel.session_id

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Runs `code` as the session's next cell. Returns its result (the value of the last
        expression) and printed output; `is_final_answer` with the answer when it called
        `final_answer()`; raises AgentError with the traceback when it failed."""
        execution, note = self._kernel.run(code)
        logs = clip(_logs(execution, note), self.max_chars)
        if not execution.ok:
            error = execution.error
            # Its type is qualified (`FinalAnswerTool.forward.<locals>.FinalAnswerException`).
            if error is not None and error.type.rsplit(".", 1)[-1] == "FinalAnswerException":
                return CodeOutput(output=self._final_answer(), logs=logs, is_final_answer=True)
            raise AgentError(render(execution, max_chars=self.max_chars, note=note), self.logger)
        if self._sending is not None:
            self._setup[self._sending] = code
        return CodeOutput(output=_output(execution.result), logs=logs, is_final_answer=False)

    def send_tools(self, tools: dict[str, Any]) -> None:
        if not self._checked:
            self.installed_packages += self.install_packages(self.additional_imports)
            self._checked = True
        self._sending = "tools"
        try:
            super().send_tools(tools)
        finally:
            self._sending = None

    def send_variables(self, variables: dict[str, Any]) -> None:
        self._setup.pop("variables", None)
        self._sending = "variables"
        try:
            super().send_variables(variables)
        finally:
            self._sending = None

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Installs nothing (a sandbox has no pip and no network): checks which of these
        modules the sandbox's environment has, logs the others and returns those it has."""
        names = sorted({m.split(".")[0] for m in additional_imports if m.split(".")[0] not in ("", "*")})
        if not names:
            return []
        execution, _ = self._kernel.run(_CHECK_IMPORTS.format(names=names))
        missing = execution.result if execution.ok and isinstance(execution.result, list) else names
        if missing:
            self.logger.log(
                f"Not in the airlock sandbox's environment: {', '.join(map(str, missing))}. Packages "
                "cannot be installed there; build an airlock environment with them and pass environment=.",
                level=LogLevel.INFO,
            )
        return [n for n in names if n not in missing]

    def cleanup(self) -> None:
        """Destroys the session's sandbox."""
        self._kernel.close()

    def delete(self) -> None:
        self.cleanup()

    def __enter__(self) -> AirlockExecutor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    def _patch_final_answer_with_exception(self, final_answer_tool: Any) -> None:
        """Makes the final_answer tool end the step with its value left in the session (the
        other remote executors carry it in the exception's message, which airlock cuts at
        8 KiB, and may unpickle it). Patched once: agents send their tools at every run."""
        cls = type(final_answer_tool)
        if getattr(cls.forward, "_airlock", False):
            return
        original = cls.forward
        answer = types.FunctionType(
            original.__code__, original.__globals__, "_forward", original.__defaults__, original.__closure__
        )
        answer.__source__ = get_source(original).replace(  # type: ignore[attr-defined]
            "def forward(", "def _forward(", 1
        )
        forward = types.FunctionType(
            _final_answer_forward.__code__, _final_answer_forward.__globals__, "forward"
        )
        forward.__source__ = inspect.getsource(_final_answer_forward).replace(  # type: ignore[attr-defined]
            "def _final_answer_forward(", "def forward(", 1
        )
        forward._airlock = True  # type: ignore[attr-defined]
        # smolagents sends the class as source: its own body is empty, the methods come after.
        source = f"class {cls.__name__}({cls.__name__}):\n    pass\n"
        patched = type(cls.__name__, (cls,), {"forward": forward, "_forward": answer, "__source__": source})
        final_answer_tool.__class__ = patched

    def _final_answer(self) -> object:
        execution, _ = self._kernel.run(f"globals().pop({_ANSWER!r})")
        if not execution.ok:
            raise AgentError(
                "final_answer() was not called the usual way: "
                + render(execution, max_chars=self.max_chars),
                self.logger,
            )
        return _output(execution.result)

    def _replay(self, session: Session) -> None:
        # A new session replacing an ended one: the tools and variables again, before the step.
        for key in ("tools", "variables"):
            code = self._setup.get(key)
            if code is not None:
                execution = session.run(code)
                if not execution.ok:
                    text = render(execution, max_chars=self.max_chars)
                    raise AgentError(f"Setting up a new airlock session failed: {text}", self.logger)


def _logs(execution: Execution, note: str | None) -> str:
    parts = [f"[{note}]\n"] if note else []
    parts.append(execution.stdout)
    if execution.stdout_truncated:
        parts.append("\n[stdout was cut at the sandbox's output limit]\n")
    if execution.stderr:
        parts.append(execution.stderr)
    if execution.stderr_truncated:
        parts.append("\n[stderr was cut at the sandbox's output limit]\n")
    if execution.session_ended:
        parts.append("\n[the session's interpreter has ended: the next code starts a fresh one, "
                     "without the earlier variables]\n")
    return "".join(parts)


def _output(value: object) -> object:
    # A value JSON cannot carry comes as its repr: the agent prints it as the sandbox would.
    return value.repr if isinstance(value, Repr) else value
