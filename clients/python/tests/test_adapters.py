"""The framework adapters against a real `airlock serve` (conftest.py), each driven by its
framework's own agent loop and fake or test model (no network, no LLM): the model's code runs
in the sandbox (it sees another uid, no network, none of this host's files or environment),
state persists where the tool is a session, failures come back as text the model reads,
refusals as the framework's tool errors, and hostile code stays contained. Also the MetaGPT
`RunCode.run_text` snippet of docs/python.md (seed 001), verbatim.

The frameworks are test dependencies, pinned in requirements-adapters.txt."""

from __future__ import annotations

import asyncio
import json
import math
import os
import pathlib
import re
import secrets
import subprocess
import sys
import urllib.parse
from typing import Any, Iterator, Tuple

import pytest
from agents import Agent, FunctionTool, RunConfig, Runner, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, ToolException
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from smolagents import CodeAgent, tool
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import AgentLogger, LogLevel

from airlock_client import Airlock, AsyncAirlock, Execution, Repr, Unauthorized
from airlock_client.adapters import _text, openai_agents
from airlock_client.adapters import pydantic_ai as pydantic_ai_adapter
from airlock_client.adapters.langchain import PythonREPLTool, PythonTool
from airlock_client.adapters.smolagents import AirlockExecutor
from conftest import KEY, Server

# A secret in this process's environment (set before the server starts, so it inherits it
# too): code in the sandbox must never see it.
CANARY = "ADAPTER_TEST_CANARY"
os.environ[CANARY] = "canary-" + secrets.token_hex(8)
THIS_FILE = str(pathlib.Path(__file__).resolve())
FRAMEWORKS = ("langchain_core", "agents", "pydantic_ai", "smolagents")


def probe(server: Server) -> str:
    """Code that reports where it runs: its uid, whether it sees this test file, the canary,
    and whether it can reach the airlock server's own port on this host's loopback."""
    address = urllib.parse.urlsplit(server.url)
    return f"""
import json, os, socket
facts = {{"uid": os.getuid(), "sees_test_file": os.path.exists({THIS_FILE!r}),
         "canary": os.environ.get({CANARY!r})}}
try:
    socket.create_connection(({address.hostname!r}, {address.port}), timeout=2).close()
    facts["network"] = "open"
except OSError as e:
    facts["network"] = type(e).__name__
print("FACTS", json.dumps(facts))
"""


def hostile(marker: pathlib.Path) -> str:
    """Code that tries to get out: the host's shadow file, a shell writing a file on the host,
    the host's environment, this test file."""
    return f"""
import json, os
out = {{}}
try:
    out["shadow"] = open("/etc/shadow").read()[:40]
except OSError as e:
    out["shadow"] = type(e).__name__
out["system"] = __import__("os").system("echo pwned > {marker} 2>/dev/null")
out["canary"] = os.environ.get({CANARY!r})
try:
    open({THIS_FILE!r}).read()
    out["test_file"] = "read"
except OSError as e:
    out["test_file"] = type(e).__name__
print("HOSTILE", json.dumps(out))
"""


def reported(tag: str, text: str) -> dict[str, Any]:
    """The JSON object the probe printed after `tag`, found in a tool's text."""
    match = re.search(rf"^{tag} (\{{.*\}})$", text, re.MULTILINE)
    assert match, f"no {tag} line in:\n{text}"
    value = json.loads(match.group(1))
    assert isinstance(value, dict)
    return value


def assert_sandboxed(text: str) -> None:
    facts = reported("FACTS", text)
    assert facts["uid"] != 0
    assert facts["sees_test_file"] is False
    assert facts["canary"] is None
    assert facts["network"] != "open"


def assert_contained(text: str, marker: pathlib.Path) -> None:
    out = reported("HOSTILE", text)
    assert out["shadow"] in ("FileNotFoundError", "PermissionError")
    assert out["canary"] is None
    assert out["test_file"] in ("FileNotFoundError", "PermissionError")
    assert not marker.exists()


@pytest.fixture
def client(server: Server) -> Iterator[Airlock]:
    with Airlock(server.url, KEY) as airlock:
        yield airlock


@pytest.fixture
def marker(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "pwned"


def open_sessions(client: Airlock) -> set[str]:
    return {s.id for s in client.sessions()}


# --- what every adapter shares --------------------------------------------------------------


def test_importing_the_package_imports_no_framework() -> None:
    code = (
        "import sys, airlock_client.adapters._sandbox, airlock_client.adapters._text\n"
        f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "module, framework, extra",
    [
        ("langchain", "langchain_core", "langchain"),
        ("openai_agents", "agents", "openai-agents"),
        ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
        ("smolagents", "smolagents", "smolagents"),
    ],
)
def test_a_missing_framework_names_the_extra(module: str, framework: str, extra: str) -> None:
    # A finder that does not find the framework, as when it is not installed.
    code = (
        "import sys\n"
        "class NotInstalled:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {framework!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotInstalled())\n"
        f"import airlock_client.adapters.{module}\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert f"pip install 'airlock-client[{extra}]'" in out.stderr


def test_the_text_says_what_happened(client: Airlock) -> None:
    ok = _text.render(client.run("print('hello')\nprint('oops', file=__import__('sys').stderr)\n6 * 7"))
    assert ok == "stdout:\nhello\nstderr:\noops\nresult: 42"

    failed = _text.render(client.run("x = 1\n1 / x - 1 / 0"))
    assert failed.startswith("status: error\n")
    assert "Traceback (most recent call last)" in failed
    assert failed.endswith("ZeroDivisionError: division by zero")

    slow = _text.render(client.run("while True: pass", limits={"timeout_ms": 500}))
    assert slow.startswith("status: timeout")
    assert "500 ms" in slow

    big = _text.render(client.run("x = bytearray(2 ** 31)", limits={"memory_mb": 128}))
    assert big.startswith("status: memory_limit (limits hit: memory)")
    assert "128 MB" in big

    exited = _text.render(client.run("import sys; print('bye'); sys.exit(3)"))
    assert exited == "status: error: it exited with code 3\nstdout:\nbye"

    assert _text.render(client.run("x = 1")) == "(the code ran and printed nothing)"
    assert _text.render(client.run("object()")).startswith("result: <object object at 0x")
    # Big ints and non-finite floats as Python prints them.
    exact = _text.render(client.run("import math\n[math.factorial(25), float('nan'), -float('inf')]"))
    assert exact == "result: [15511210043330985984000000, nan, -inf]"


def test_the_text_is_bounded(client: Airlock) -> None:
    code = "print('a' * 2_000_000)\nraise ValueError('b' * 1000)"
    execution = client.run(code)
    assert execution.stdout_truncated
    text = _text.render(execution, max_chars=3000)
    assert len(text) <= 3000
    assert text.startswith("status: error (limits hit: output)\nstdout:\naaa")
    assert "characters cut" in text
    # The end of the traceback (the error itself) and the truncation note survive.
    assert "ValueError: bbb" in text
    assert text.endswith("[stdout was cut at the sandbox's output limit]")


def test_fences_are_stripped() -> None:
    assert _text.strip_fences("```python\nprint(1)\n```") == "print(1)"
    assert _text.strip_fences("  ```py\nx = 1\ny = 2\n```\n") == "x = 1\ny = 2"
    assert _text.strip_fences("print('```')") == "print('```')"


# --- LangChain ------------------------------------------------------------------------------


class ToolCallingFakeChatModel(GenericFakeChatModel):
    """LangChain's fake chat model, able to be bound to tools (it answers from its script)."""

    bound: list[dict[str, Any]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.bound = [convert_to_openai_tool(t) for t in tools]
        return self


def call(tool: str, code: str, n: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": tool, "args": {"code": code}, "id": f"call_{n}"}])


def langchain_agent(model: ToolCallingFakeChatModel, tools: list[BaseTool], task: str) -> list[BaseMessage]:
    """The usual tool-calling loop: ask the model, run the tools it calls, until it answers."""
    bound = model.bind_tools(tools)
    by_name = {t.name: t for t in tools}
    messages: list[BaseMessage] = [HumanMessage(task)]
    while True:
        answer = bound.invoke(messages)
        messages.append(answer)
        if not answer.tool_calls:
            return messages
        for tool_call in answer.tool_calls:
            messages.append(by_name[tool_call["name"]].invoke(tool_call))


def test_langchain_repl_runs_the_agent_loop_in_one_session(
    client: Airlock, server: Server, marker: pathlib.Path
) -> None:
    script = iter([
        call("python_repl", "x = 6 * 7\nprint('set')", 1),
        call("python_repl", probe(server) + "x", 2),
        call("python_repl", hostile(marker), 3),
        AIMessage(content="done"),
    ])
    model = ToolCallingFakeChatModel(messages=script)
    with PythonREPLTool(client=client) as python:
        messages = langchain_agent(model, [python], "probe the sandbox")
        session = python.session_id
        assert session in open_sessions(client)
    assert session not in open_sessions(client)

    assert model.bound[0]["function"]["name"] == "python_repl"
    assert model.bound[0]["function"]["parameters"]["required"] == ["code"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in results] == ["call_1", "call_2", "call_3"]
    assert results[0].content == "stdout:\nset"
    assert isinstance(results[1].content, str)
    assert_sandboxed(results[1].content)
    assert results[1].content.endswith("result: 42")  # x survived from the first call
    artifact = results[1].artifact
    assert isinstance(artifact, Execution) and artifact.isolation.network == "none"
    assert isinstance(results[2].content, str)
    assert_contained(results[2].content, marker)
    assert messages[-1].content == "done"


def test_langchain_one_shot_keeps_nothing_and_shows_errors(client: Airlock) -> None:
    python = PythonTool(client=client)
    assert python.invoke("```python\ny = 5\nprint(y)\n```") == "stdout:\n5"
    message = python.invoke({"type": "tool_call", "id": "c1", "name": "python", "args": {"code": "y"}})
    assert isinstance(message, ToolMessage)
    assert "NameError: name 'y' is not defined" in message.content
    assert isinstance(message.artifact, Execution) and message.artifact.status == "error"


def test_langchain_refusals_are_tool_exceptions(server: Server) -> None:
    with Airlock(server.url, "not-a-key-0123456789abcdef01234") as wrong:
        python = PythonTool(client=wrong)
        with pytest.raises(ToolException, match="401") as raised:
            python.invoke("1")
        assert isinstance(raised.value.__cause__, Unauthorized)

        handled = PythonTool(client=wrong, handle_tool_error=True)
        message = handled.invoke({"type": "tool_call", "id": "c1", "name": "python", "args": {"code": "1"}})
        assert isinstance(message, ToolMessage)
        assert message.status == "error" and "401" in str(message.content)


def test_langchain_repl_starts_again_when_its_session_ends(client: Airlock) -> None:
    with PythonREPLTool(client=client) as python:
        assert python.invoke("z = 1") == "(the code ran and printed nothing)"
        first = python.session_id
        ended = python.invoke("import os; os._exit(0)")
        assert "the session's interpreter has ended" in ended
        again = python.invoke("z")
        assert python.session_id != first
        assert "fresh interpreter" in again and "NameError" in again


def test_langchain_repl_replaces_an_expired_session(server: Server) -> None:
    async def main() -> tuple[str, str]:
        async with AsyncAirlock(server.url, KEY) as airlock:
            async with PythonREPLTool(client=airlock, idle_timeout_ms=1000) as python:
                await python.ainvoke("v = 1")
                # Past the idle timeout the server's reaper closes the session.
                for _ in range(100):
                    await asyncio.sleep(0.3)
                    if python.session_id not in {s.id for s in await airlock.sessions()}:
                        break
                expired = await python.ainvoke("v")
                return expired, await python.ainvoke("v = 2\nv")

    expired, after = asyncio.run(main())
    assert expired.startswith("[the previous session had ended")
    assert "NameError: name 'v' is not defined" in expired
    assert after == "result: 2"


def test_langchain_async_with_an_async_client(server: Server) -> None:
    async def main() -> tuple[str, str, str]:
        async with AsyncAirlock(server.url, KEY) as airlock:
            async with PythonREPLTool(client=airlock) as repl:
                await repl.ainvoke("n = 20")
                fib = await repl.ainvoke("a, b = 0, 1\nfor _ in range(n): a, b = b, a + b\na")
            once = await PythonTool(client=airlock).ainvoke("sum(range(10))")
        with Airlock(server.url, KEY) as sync_client, PythonREPLTool(client=sync_client) as threaded:
            await threaded.ainvoke("k = 3")
            in_thread = await threaded.ainvoke("k * 3")
        return fib, once, in_thread

    assert asyncio.run(main()) == ("result: 6765", "result: 45", "result: 9")


# --- OpenAI Agents SDK ----------------------------------------------------------------------


set_tracing_disabled(True)  # no trace export (it would need the network and an OpenAI key)
NO_TRACING = RunConfig(tracing_disabled=True)


def tool_outputs(call: ModelCall) -> list[str]:
    """The function call outputs the model was given, in order."""
    items = call.input if isinstance(call.input, list) else []
    return [
        str(i["output"]) for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]


async def run_agent(tool: FunctionTool, model: ScriptedModel) -> Any:
    return await Runner.run(Agent(name="analyst", model=model, tools=[tool]), "go", run_config=NO_TRACING)


def echo_last_output() -> ModelStep:
    """A final answer that repeats the last tool output, as a model summing up would."""
    return ModelStep.respond(lambda call: [assistant_message(tool_outputs(call)[-1])])


def test_openai_agents_repl_runs_in_one_session(server: Server, marker: pathlib.Path) -> None:
    async def main() -> tuple[Any, ScriptedModel]:
        model = ScriptedModel([
            [function_call("python_repl", {"code": "x = 6 * 7"}, call_id="c1")],
            [function_call("python_repl", {"code": probe(server) + "x"}, call_id="c2")],
            [function_call("python_repl", {"code": hostile(marker)}, call_id="c3")],
            ModelStep.respond(lambda call: [assistant_message("\n---\n".join(tool_outputs(call)))]),
        ])
        async with AsyncAirlock(server.url, KEY) as airlock, openai_agents.PythonREPL(airlock) as python:
            agent = Agent(name="analyst", model=model, tools=[python.tool])
            result = await Runner.run(agent, "probe the sandbox", run_config=NO_TRACING)
        return result.final_output, model

    final, model = asyncio.run(main())
    assert model.remaining_steps == 0
    tool = model.calls[0].tools[0]
    assert tool.name == "python_repl"
    assert isinstance(tool, FunctionTool)
    assert tool.params_json_schema["required"] == ["code"]
    first, second, third = str(final).split("\n---\n")
    assert first == "(the code ran and printed nothing)"
    assert_sandboxed(second)
    assert second.endswith("result: 42")
    assert_contained(third, marker)


def test_openai_agents_one_shot_with_a_sync_client(client: Airlock) -> None:
    model = ScriptedModel([
        [function_call("python", {"code": "y = 2 ** 10\ny"}, call_id="c1")],
        [function_call("python", {"code": "y"}, call_id="c2")],
        echo_last_output(),
    ])
    agent = Agent(name="analyst", model=model, tools=[openai_agents.python_tool(client)])
    result = asyncio.run(Runner.run(agent, "compute", run_config=NO_TRACING))
    outputs = tool_outputs(model.calls[-1])
    assert outputs[0] == "result: 1024"
    assert "NameError: name 'y' is not defined" in outputs[1]  # a fresh sandbox each call
    assert outputs[1].startswith("status: error")
    assert result.final_output == outputs[1]


def test_openai_agents_refusals_are_tool_failures(server: Server) -> None:
    def refusal(context: Any, error: Exception) -> str:
        return f"refused: {error}"

    with Airlock(server.url, "not-a-key-0123456789abcdef01234") as wrong:
        model = ScriptedModel([[function_call("python", {"code": "1"}, call_id="c1")], echo_last_output()])
        tool = openai_agents.python_tool(wrong, failure_error_function=refusal)
        result = asyncio.run(run_agent(tool, model))
        assert str(result.final_output).startswith("refused: 401 unauthorized")

        # The SDK's default: the model is told the tool failed, without the details.
        model = ScriptedModel([[function_call("python", {"code": "1"}, call_id="c1")], echo_last_output()])
        tool = openai_agents.python_tool(wrong)
        result = asyncio.run(run_agent(tool, model))
        assert "error occurred while running the tool" in str(result.final_output)


# --- pydantic-ai ----------------------------------------------------------------------------


def returns(messages: list[ModelMessage]) -> list[str]:
    """The tool results the model was given, in order."""
    return [
        str(part.content)
        for message in messages if isinstance(message, ModelRequest)
        for part in message.parts if isinstance(part, ToolReturnPart)
    ]


def scripted(tool: str, codes: list[str], seen: list[AgentInfo]) -> FunctionModel:
    """A model that calls `tool` with each of `codes` in turn, then answers with every result."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        done = returns(messages)
        if len(done) < len(codes):
            return ModelResponse(parts=[ToolCallPart(tool, {"code": codes[len(done)]}, f"c{len(done)}")])
        return ModelResponse(parts=[TextPart("\n---\n".join(done))])

    return FunctionModel(model)


def test_pydantic_ai_repl_runs_in_one_session(server: Server, marker: pathlib.Path) -> None:
    seen: list[AgentInfo] = []
    model = scripted("python_repl", ["x = 6 * 7", probe(server) + "x", hostile(marker)], seen)

    async def main() -> str:
        async with AsyncAirlock(server.url, KEY) as airlock:
            async with pydantic_ai_adapter.PythonREPL(airlock) as python:
                agent = PydanticAgent(model, tools=[python.tool])
                result = await agent.run("probe the sandbox")
                session = python.session_id
                assert session in {s.id for s in await airlock.sessions()}
            assert session not in {s.id for s in await airlock.sessions()}
            return result.output

    first, second, third = asyncio.run(main()).split("\n---\n")
    definition = seen[0].function_tools[0]
    assert definition.name == "python_repl"
    assert definition.parameters_json_schema["required"] == ["code"]
    assert first == "(the code ran and printed nothing)"
    assert_sandboxed(second)
    assert second.endswith("result: 42")
    assert_contained(third, marker)


def test_pydantic_ai_one_shot_with_a_sync_client(client: Airlock) -> None:
    seen: list[AgentInfo] = []
    model = scripted("python", ["y = 3\nprint(y * 'ab')", "y"], seen)
    agent = PydanticAgent(model, tools=[pydantic_ai_adapter.python_tool(client)])
    first, second = agent.run_sync("compute").output.split("\n---\n")
    assert first == "stdout:\nababab"
    assert "NameError: name 'y' is not defined" in second


def test_pydantic_ai_refusals_end_the_run(server: Server) -> None:
    with Airlock(server.url, "not-a-key-0123456789abcdef01234") as wrong:
        agent = PydanticAgent(scripted("python", ["1"], []), tools=[pydantic_ai_adapter.python_tool(wrong)])
        with pytest.raises(Unauthorized):
            agent.run_sync("go")


# --- smolagents -----------------------------------------------------------------------------


class ScriptModel(Model):  # type: ignore[misc]  # smolagents is untyped
    """A smolagents model that answers with fixed code blobs and records what it was shown."""

    def __init__(self, blobs: list[str]) -> None:
        super().__init__(model_id="script")
        self.blobs = list(blobs)
        self.seen: list[str] = []

    def generate(self, messages: list[Any], stop_sequences: Any = None, **kwargs: Any) -> Any:
        self.seen.append(json.dumps([m.dict() if hasattr(m, "dict") else m for m in messages], default=str))
        code = self.blobs.pop(0)
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: next.\n<code>\n{code}\n</code>")


@tool  # type: ignore[untyped-decorator]
def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


QUIET = AgentLogger(level=LogLevel.OFF)


def code_agent(model: ScriptModel, executor: AirlockExecutor, **kwargs: Any) -> Any:
    return CodeAgent(tools=[add], model=model, executor=executor, logger=QUIET, max_steps=6, **kwargs)


def test_smolagents_code_agent_runs_its_steps_in_a_session(
    client: Airlock, server: Server, marker: pathlib.Path
) -> None:
    model = ScriptModel([
        "x = add(40, 2)\nprint('x is', x)",
        probe(server),
        hostile(marker),
        "final_answer({'x': x, 'big': 'y' * 100_000})",
    ])
    with AirlockExecutor(client=client, logger=QUIET) as executor:
        agent = code_agent(model, executor)
        answer = agent.run("probe the sandbox")
        session = executor.session_id
        assert session in open_sessions(client)
    assert session not in open_sessions(client)

    # The tool ran in the sandbox, x persisted between steps, and the answer came back whole
    # (well over the 8 KiB an exception's message may carry).
    assert answer == {"x": 42, "big": "y" * 100_000}
    observations = [step.observations or "" for step in agent.memory.steps if hasattr(step, "observations")]
    assert "x is 42" in observations[0]
    assert_sandboxed(observations[1])
    assert_contained(observations[2], marker)


def test_smolagents_errors_reach_the_model_and_agents_run_again(client: Airlock) -> None:
    model = ScriptModel([
        "values = [3, 0]\nvalues[0] / values[1]",
        "final_answer(values[0] + 1)",
        "final_answer(add(2, 3))",
    ])
    with AirlockExecutor(client=client, logger=QUIET) as executor:
        agent = code_agent(model, executor)
        assert agent.run("divide") == 4
        # The model read the traceback before its second step.
        assert "ZeroDivisionError: division by zero" in model.seen[1]
        assert 'values[0] / values[1]' in model.seen[1]
        # A second run of the same agent and executor: final_answer still ends it.
        assert agent.run("add", reset=False) == 5


def test_smolagents_starts_a_new_session_when_one_ends(client: Airlock) -> None:
    model = ScriptModel([
        "import os\nos._exit(0)",
        "print(add(1, 1))\nprint(sorted(k for k in globals() if k == 'os'))",
        "final_answer('ok')",
    ])
    with AirlockExecutor(client=client, logger=QUIET) as executor:
        agent = code_agent(model, executor)
        assert agent.run("end the session") == "ok"
    steps = [step.observations or "" for step in agent.memory.steps if hasattr(step, "observations")]
    assert "interpreter has ended" in steps[0]
    assert "fresh interpreter" in steps[1]
    assert "2\n[]" in steps[1]  # the tools were defined again; the old variables are gone


def test_smolagents_checks_imports_instead_of_installing(client: Airlock) -> None:
    logged: list[str] = []

    class Recorder(AgentLogger):  # type: ignore[misc]
        def log(self, *args: Any, **kwargs: Any) -> None:
            logged.append(" ".join(map(str, args)))

    model = ScriptModel(["import numpy\nfinal_answer(int(numpy.arange(4).sum()))"])
    imports = ["numpy", "no_such_module_here.*"]
    with AirlockExecutor(imports, Recorder(level=LogLevel.OFF), client=client) as executor:
        assert code_agent(model, executor, additional_authorized_imports=["numpy"]).run("sum") == 6
    assert any("no_such_module_here" in line and "environment" in line for line in logged)
    assert executor.installed_packages == ["numpy"]


# --- MetaGPT (seed 001): RunCode.run_text ---------------------------------------------------

# docs/python.md's snippet, verbatim: MetaGPT's `RunCode.run_text` with `exec(code, namespace)`
# replaced (there it is a classmethod of RunCode; here a function).
async def run_text(code: str) -> Tuple[Any, str]:
    async with AsyncAirlock() as airlock:  # $AIRLOCK_URL, $AIRLOCK_API_KEY
        # `result = <literal expression>`: answered natively, no interpreter started.
        evaluation = await airlock.eval(code)
        if evaluation.ok and (evaluation.value is not None or evaluation.type == "NoneType"):
            return evaluation.value, ""
        error = evaluation.error
        if error is not None and not error.limit and error.type not in ("SyntaxError", "NotAllowedError"):
            return "", f"{error.type}: {error.message}"
        # Anything else is code: a fresh sandbox, and `result` read back as data.
        execution = await airlock.run(code + "\nglobals().get('result', '')")
    if execution.error is not None:
        return "", execution.error.traceback or f"{execution.error.type}: {execution.error.message}"
    if not execution.ok:
        return "", f"{execution.status}: {execution.stderr}"
    return execution.result, ""


@pytest.fixture
def airlock_env(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRLOCK_URL", server.url)
    monkeypatch.setenv("AIRLOCK_API_KEY", KEY)


@pytest.mark.usefixtures("airlock_env")
def test_metagpt_run_text_keeps_metagpt_own_tests() -> None:
    # tests/metagpt/actions/test_run_code.py::test_run_text, both versions of its assertion.
    assert asyncio.run(run_text("result = 1 + 1")) == (2, "")
    out, err = asyncio.run(run_text("result = 1 / 0"))
    assert out == "" and "division by zero" in err and "ZeroDivisionError" in err
    # ... and the earlier test_run_code: code, not a literal.
    code = "def add(a, b):\n    return a + b\nresult = add(1, 2)\n"
    assert asyncio.run(run_text(code)) == (3, "")
    out, err = asyncio.run(run_text("def add(a, b):\n    return a + b\nresult = add(1, '2')"))
    assert out == "" and "TypeError: unsupported operand type(s) for +" in err


@pytest.mark.usefixtures("airlock_env")
def test_metagpt_run_text_answers_as_exec_did() -> None:
    assert asyncio.run(run_text("result = 'helloworld'")) == ("helloworld", "")
    assert asyncio.run(run_text("result = [1, 2, 3]")) == ([1, 2, 3], "")
    assert asyncio.run(run_text("x = 1")) == ("", "")  # no `result`: MetaGPT's ""
    assert asyncio.run(run_text("result = None")) == (None, "")
    assert asyncio.run(run_text("result = (1, 2.5)")) == ([1, 2.5], "")  # tuples as arrays
    # Values plain JSON cannot hold go to the sandbox, which sends them as marked data.
    assert asyncio.run(run_text("result = {3, 1, 2}")) == ({1, 2, 3}, "")
    assert asyncio.run(run_text("result = 2 ** 70")) == (2**70, "")  # past 64 bits: exact
    nan, err = asyncio.run(run_text("result = 1e500 - 1e500"))
    assert err == "" and isinstance(nan, float) and math.isnan(nan)
    assert asyncio.run(run_text("result = 2 ** 200_000 % 1000")) == (376, "")  # over eval's budget


@pytest.mark.usefixtures("airlock_env")
def test_metagpt_run_text_contains_the_seed_attacks(tmp_path: pathlib.Path) -> None:
    # The attacks seed 001 names: the host environment, the host's files, a sandbox escape.
    before = dict(os.environ)
    code = f"import os\nos.environ['PWNED'] = '1'\nresult = os.environ.get({CANARY!r})"
    out, err = asyncio.run(run_text(code))
    assert (out, err) == (None, "")
    assert dict(os.environ) == before

    cwd, err = asyncio.run(run_text("result = __import__('os').getcwd()"))
    assert err == "" and cwd != os.getcwd()

    out, err = asyncio.run(run_text("result = ().__class__.__mro__[1].__subclasses__()"))
    assert err == "" and isinstance(out, list) and out
    assert all(isinstance(value, Repr) for value in out)  # the classes' reprs: text, not objects

    marker = tmp_path / "pwned"
    out, err = asyncio.run(run_text(f"import os\nresult = os.system('touch {marker}')"))
    assert err == "" and out != 0
    assert not marker.exists()

    out, err = asyncio.run(run_text("result = open('/etc/shadow').read()"))
    assert out == "" and ("FileNotFoundError" in err or "PermissionError" in err)
