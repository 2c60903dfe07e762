"""Adapters that give agent frameworks a Python tool backed by airlock: the model's code runs
in a sandbox on the airlock server, and the tool hands the model back text (what the code
printed, the value of its last expression, the traceback of its error, why it was stopped).
Nothing the sandbox returns is executed on this side.

Each adapter is its own module with its framework as an optional dependency, so importing this
package imports no framework:

- `airlock_client.adapters.langchain` (`pip install 'airlock-client[langchain]'`):
  `PythonTool` (a fresh sandbox per call) and `PythonREPLTool` (one session kept between calls,
  the safe replacement of langchain_experimental's `PythonREPLTool`), both `BaseTool`s.
- `airlock_client.adapters.openai_agents` (`pip install 'airlock-client[openai-agents]'`):
  `python_tool()`, a `FunctionTool`, and `PythonREPL`, whose `.tool` keeps a session.
- `airlock_client.adapters.pydantic_ai` (`pip install 'airlock-client[pydantic-ai]'`):
  `python_tool()`, a `Tool`, and `PythonREPL`, whose `.tool` keeps a session.
- `airlock_client.adapters.smolagents` (`pip install 'airlock-client[smolagents]'`):
  `AirlockExecutor`, a `RemotePythonExecutor` for `CodeAgent(executor=...)`: a session keeps the
  agent's variables between steps, and `final_answer()` ends the run.

Every tool takes `client` (an `Airlock`, an `AsyncAirlock` where the framework is async, or
nothing: one is made from `$AIRLOCK_URL` and `$AIRLOCK_API_KEY`), the sandbox's settings
(`limits`, `files`, `env`, `environment`, `egress`; `idle_timeout_ms` and `max_lifetime_ms` for
sessions) and `max_chars`, the most text the model is given back.

A sandbox's failure (an exception, a timeout, a memory kill) is the tool's answer: the model
reads the traceback and fixes its code. A refusal by the server (`AirlockError`: a bad key, a
rate limit, code too large) is raised the way the framework expects a tool to fail.
"""
