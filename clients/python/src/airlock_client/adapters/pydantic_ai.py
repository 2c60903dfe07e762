"""pydantic-ai tools that run the model's Python in airlock: `python_tool()`, a fresh sandbox
for each call, and `PythonREPL`, whose `.tool` keeps one session between calls (variables,
imports and files persist).

    from pydantic_ai import Agent
    from airlock_client import AsyncAirlock
    from airlock_client.adapters.pydantic_ai import PythonREPL

    async with AsyncAirlock() as airlock, PythonREPL(airlock) as python:
        agent = Agent("openai:gpt-5", tools=[python.tool])
        result = await agent.run("What is the 20th Fibonacci number?")

Both are `Tool`s taking one argument, `code`, and answering text: what the code printed, the
value of its last expression, the traceback of its error; the model reads a failure and fixes
its code. A refusal by the server (`AirlockError`) is raised from the tool and ends the run, as
any exception of a pydantic-ai tool does. Other keyword arguments go to `Tool`
(`requires_approval`, `timeout`, `max_retries`, ...). pydantic-ai awaits the tool: an
`AsyncAirlock` is awaited, an `Airlock` runs in a thread, and with no client one is made from
`$AIRLOCK_URL` and `$AIRLOCK_API_KEY`."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Mapping

from airlock_client.adapters import _sandbox
from airlock_client.adapters._text import (
    DEFAULT_MAX_CHARS,
    ONE_SHOT_DESCRIPTION,
    SESSION_DESCRIPTION,
    render,
    strip_fences,
)

try:
    from pydantic_ai import Tool
except ModuleNotFoundError as e:  # pragma: no cover - depends on what is installed
    if e.name not in ("pydantic_ai",):
        raise  # installed, but broken: its own error says more
    raise ImportError(
        "airlock_client.adapters.pydantic_ai needs pydantic-ai: pip install 'airlock-client[pydantic-ai]'"
    ) from e

__all__ = ["PythonREPL", "python_tool"]


def python_tool(
    client: _sandbox.AnyClient | None = None,
    *,
    name: str = "python",
    description: str = ONE_SHOT_DESCRIPTION,
    limits: Mapping[str, int] | None = None,
    files: Mapping[str, bytes | str] | None = None,
    env: Mapping[str, str] | None = None,
    environment: str | None = None,
    egress: Mapping[str, object] | None = None,
    max_chars: int = DEFAULT_MAX_CHARS,
    **tool_options: Any,
) -> Tool[Any]:
    """A tool that runs each call's code in a fresh sandbox."""
    options = _sandbox.Options(limits=limits, files=files, env=env, environment=environment, egress=egress)

    async def python(code: str) -> str:
        """Runs Python code.

        Args:
            code: The Python code to run.
        """
        execution = await _sandbox.arun_once(client, strip_fences(code), options)
        return render(execution, max_chars=max_chars)

    return Tool(python, takes_ctx=False, name=name, description=description, **tool_options)


class PythonREPL:
    """A session kept between the calls of its `.tool`, opened at the first: variables,
    imports and files persist, as in a notebook. Close it (`await repl.close()`, or
    `async with`) to destroy the sandbox; an unclosed session ends at its idle timeout. If the
    session ends (idle timeout, lifetime, `exit()`, a memory kill), the next call opens a new
    one and tells the model that its variables are gone. Calls run one at a time, in the order
    the model made them."""

    def __init__(
        self,
        client: _sandbox.AnyClient | None = None,
        *,
        name: str = "python_repl",
        description: str = SESSION_DESCRIPTION,
        limits: Mapping[str, int] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        env: Mapping[str, str] | None = None,
        environment: str | None = None,
        egress: Mapping[str, object] | None = None,
        idle_timeout_ms: int | None = None,
        max_lifetime_ms: int | None = None,
        max_chars: int = DEFAULT_MAX_CHARS,
        **tool_options: Any,
    ) -> None:
        options = _sandbox.Options(
            limits=limits, files=files, env=env, environment=environment, egress=egress,
            idle_timeout_ms=idle_timeout_ms, max_lifetime_ms=max_lifetime_ms,
        )
        self._kernel = _sandbox.AsyncKernel(client, options)
        kernel = self._kernel

        async def python_repl(code: str) -> str:
            """Runs Python code in the session.

            Args:
                code: The Python code to run.
            """
            execution, note = await kernel.run(strip_fences(code))
            return render(execution, max_chars=max_chars, note=note)

        self.tool: Tool[Any] = Tool(
            python_repl, takes_ctx=False, name=name, description=description, **tool_options
        )

    @property
    def session_id(self) -> str | None:
        """The id of the open session (None before the first call)."""
        return self._kernel.session_id

    async def close(self) -> None:
        """Destroys the session's sandbox."""
        await self._kernel.close()

    async def __aenter__(self) -> PythonREPL:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
