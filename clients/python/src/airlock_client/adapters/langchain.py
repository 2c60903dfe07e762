"""LangChain tools that run the model's Python in airlock: `PythonTool`, a fresh sandbox for
each call, and `PythonREPLTool`, one session kept between calls (variables, imports and files
persist), the safe replacement of langchain_experimental's `PythonREPLTool`, which runs the
model's code with `exec()` in your process.

    from airlock_client import Airlock
    from airlock_client.adapters.langchain import PythonREPLTool

    with Airlock() as airlock, PythonREPLTool(client=airlock) as python:
        model = chat_model.bind_tools([python])
        ...  # your agent loop; ToolMessages carry the text, `.artifact` the Execution

Both are `BaseTool`s with one argument, `code`, and `response_format="content_and_artifact"`:
the content is the text the model reads, the artifact the whole `Execution` (charts, files,
the decoded result) for your program. A refusal by the server is raised as `ToolException`
(set `handle_tool_error=True` to hand its message to the model instead).

With an `AsyncAirlock` as `client`, call them with `ainvoke`; with an `Airlock` (or none, made
from `$AIRLOCK_URL` and `$AIRLOCK_API_KEY`), `invoke` and `ainvoke` both work (the latter in a
thread)."""

from __future__ import annotations

import asyncio
import dataclasses
from types import TracebackType
from typing import Any, Literal

from airlock_client.adapters import _sandbox
from airlock_client.adapters._text import (
    DEFAULT_MAX_CHARS,
    ONE_SHOT_DESCRIPTION,
    SESSION_DESCRIPTION,
    render,
    strip_fences,
)
from airlock_client.aio import AsyncAirlock
from airlock_client.client import Airlock
from airlock_client.errors import AirlockError
from airlock_client.models import Execution

try:
    from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
    from langchain_core.tools import BaseTool, ToolException
    from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
except ModuleNotFoundError as e:  # pragma: no cover - depends on what is installed
    if e.name not in ("langchain_core", "pydantic"):
        raise  # installed, but broken: its own error says more
    raise ImportError(
        "airlock_client.adapters.langchain needs langchain-core: "
        "pip install 'airlock-client[langchain]'"
    ) from e

__all__ = ["PythonInput", "PythonREPLTool", "PythonTool"]


class PythonInput(BaseModel):
    """The tools' one argument."""

    code: str = Field(description="The Python code to run.")


class _AirlockTool(BaseTool):
    """What both tools share: the client, the sandbox's settings, the answer's size."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    args_schema: type[BaseModel] = PythonInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"

    client: Airlock | AsyncAirlock | None = Field(default=None, exclude=True)
    """The client; None makes one from `$AIRLOCK_URL` and `$AIRLOCK_API_KEY`."""
    limits: dict[str, int] | None = None
    """`timeout_ms`, `memory_mb`, `cpu_ms`, ... (up to the server's ceilings)."""
    files: dict[str, bytes | str] | None = Field(default=None, exclude=True)
    """Files put in the sandbox's working directory before the code runs."""
    env: dict[str, str] | None = Field(default=None, exclude=True)
    environment: str | None = None
    """A named airlock environment (its packages)."""
    egress: dict[str, Any] | None = None
    """The hosts the code may reach, where the server allows it."""
    max_chars: int = DEFAULT_MAX_CHARS
    """The most characters of text the model is given back."""

    def _options(self) -> _sandbox.Options:
        return _sandbox.Options(
            limits=self.limits, files=self.files, env=self.env, environment=self.environment,
            egress=self.egress,
        )

    def _answer(self, execution: Execution, note: str | None = None) -> tuple[str, Execution]:
        return render(execution, max_chars=self.max_chars, note=note), execution


class PythonTool(_AirlockTool):
    """Runs each call's code in a fresh sandbox: nothing is kept between calls."""

    name: str = "python"
    description: str = ONE_SHOT_DESCRIPTION

    def _run(self, code: str, run_manager: CallbackManagerForToolRun | None = None) -> tuple[str, Execution]:
        if isinstance(self.client, AsyncAirlock):
            raise TypeError(f"{self.name} was given an AsyncAirlock: call it with ainvoke")
        try:
            return self._answer(_sandbox.run_once(self.client, strip_fences(code), self._options()))
        except AirlockError as e:
            raise ToolException(str(e)) from e

    async def _arun(
        self, code: str, run_manager: AsyncCallbackManagerForToolRun | None = None
    ) -> tuple[str, Execution]:
        try:
            return self._answer(await _sandbox.arun_once(self.client, strip_fences(code), self._options()))
        except AirlockError as e:
            raise ToolException(str(e)) from e


class PythonREPLTool(_AirlockTool):
    """Runs every call's code in one session, opened at the first call: variables, imports and
    files persist, as in a notebook. `close()` it (or use it as a context manager) to destroy
    the sandbox; an unclosed session ends at its idle timeout. If the session ends (idle
    timeout, lifetime, `exit()`, a memory kill), the next call opens a new one and tells the
    model that its variables are gone. Calls run one at a time."""

    name: str = "python_repl"
    description: str = SESSION_DESCRIPTION

    idle_timeout_ms: int | None = None
    """How long the session may sit unused (the server's default when None)."""
    max_lifetime_ms: int | None = None
    """How long the session may live in all (the server's default when None)."""

    _kernel: _sandbox.Kernel | _sandbox.AsyncKernel = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        options = dataclasses.replace(
            self._options(), idle_timeout_ms=self.idle_timeout_ms, max_lifetime_ms=self.max_lifetime_ms
        )
        if isinstance(self.client, AsyncAirlock):
            self._kernel = _sandbox.AsyncKernel(self.client, options)
        else:
            self._kernel = _sandbox.Kernel(self.client, options)

    def _run(self, code: str, run_manager: CallbackManagerForToolRun | None = None) -> tuple[str, Execution]:
        kernel = self._kernel
        if not isinstance(kernel, _sandbox.Kernel):
            raise TypeError(f"{self.name} was given an AsyncAirlock: call it with ainvoke")
        try:
            return self._answer(*kernel.run(strip_fences(code)))
        except AirlockError as e:
            raise ToolException(str(e)) from e

    async def _arun(
        self, code: str, run_manager: AsyncCallbackManagerForToolRun | None = None
    ) -> tuple[str, Execution]:
        kernel = self._kernel
        try:
            if isinstance(kernel, _sandbox.Kernel):
                # One session for invoke and ainvoke alike: the synchronous one, in a thread.
                return self._answer(*await asyncio.to_thread(kernel.run, strip_fences(code)))
            return self._answer(*await kernel.run(strip_fences(code)))
        except AirlockError as e:
            raise ToolException(str(e)) from e

    @property
    def session_id(self) -> str | None:
        """The id of the open session (None before the first call)."""
        return self._kernel.session_id

    def close(self) -> None:
        """Destroys the session's sandbox. With an AsyncAirlock, use `aclose()`."""
        kernel = self._kernel
        if isinstance(kernel, _sandbox.AsyncKernel):
            raise TypeError(f"{self.name} was given an AsyncAirlock: use aclose()")
        kernel.close()

    async def aclose(self) -> None:
        """Destroys the session's sandbox."""
        kernel = self._kernel
        if isinstance(kernel, _sandbox.AsyncKernel):
            await kernel.close()
        else:
            await asyncio.to_thread(kernel.close)

    def __enter__(self) -> PythonREPLTool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> PythonREPLTool:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
