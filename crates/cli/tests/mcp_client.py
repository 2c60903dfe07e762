"""An MCP client for crates/cli/tests/it/mcp.rs, on the official Python SDK (`mcp`).

It drives `airlock mcp` (stdio) or `airlock serve`'s /mcp (streamable HTTP) through a scenario
and prints one JSON object of what it saw, step by step; the Rust test judges it. Nothing is
checked here, so a wrong answer is reported as it came, not hidden.

    mcp_client.py stdio AIRLOCK_BINARY STATE_DIR SCENARIO
    mcp_client.py http URL KEY SCENARIO

Scenarios: `code_mode` (list_tool_apis, and run_python calling an upstream tool), `tools` (initialize, list the tools, run_python, charts, timeouts, eval_expression,
protocol errors), `session` (a session's round trip), `abandon` (a session left open),
`connect` (initialize only), `approval` (run_python calling a tool that needs an approval,
which this client's user gives by elicitation once, then declines), `approval_unasked` (the
same from a client that does not take elicitations), `approval_hidden` (a call whose arguments
hide a nested `to` behind a long note and hold a right-to-left override, approved), `progress` (a 30 s run_python with a
progress callback: each notification with the time it came), `logs` (a call without a
progress token, then the logging level set and the output as log messages, then a session's
cell with a progress callback).

Over stdio, `AIRLOCK_CONFIG`, `AIRLOCK_MCP__*` and `TEST_TOOL_*` of this process's environment
reach airlock.
"""

import base64
import json
import os
import sys
import time
from contextlib import asynccontextmanager

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def content(result):
    """A tool result as plain data: each block's kind and text, or an image's facts."""
    blocks = []
    for c in result.content:
        if c.type == "text":
            blocks.append({"type": "text", "text": c.text})
        elif c.type == "image":
            raw = base64.b64decode(c.data)
            blocks.append(
                {
                    "type": "image",
                    "mime_type": c.mime_type,
                    "bytes": len(raw),
                    "png_signature": raw[:8] == b"\x89PNG\r\n\x1a\n",
                }
            )
        else:
            blocks.append({"type": c.type})
    return {"is_error": result.is_error, "content": blocks, "structured": result.structured_content}


async def call(session, name, arguments, progress_callback=None):
    """A tool call's result, or the JSON-RPC error it got. The SDK checks a result's
    structured content against the tool's output schema; an error result is checked here too,
    and a mismatch is reported as `schema_error`."""
    try:
        result = await session.call_tool(name, arguments, progress_callback=progress_callback)
    except MCPError as e:
        return {"jsonrpc_error": {"code": e.code, "message": e.message}}
    except RuntimeError as e:
        return {"schema_error": str(e)}
    seen = content(result)
    if result.is_error:
        try:
            await session.validate_tool_result(name, result)
        except RuntimeError as e:
            seen["schema_error"] = str(e)
    return seen


async def tools(session):
    seen = {}
    listed = await session.list_tools()
    seen["tools"] = {
        t.name: {"description": t.description, "input_schema": t.input_schema, "output_schema": t.output_schema}
        for t in listed.tools
    }
    seen["print"] = await call(
        session, "run_python", {"code": "import sys\nprint('hello from the sandbox')\nprint('oops', file=sys.stderr)\n6 * 7"}
    )
    seen["exact"] = await call(
        session, "run_python", {"code": "import math\n[math.factorial(25), float('nan'), -float('inf'), {'x': 2**70}]"}
    )
    seen["chart"] = await call(
        session,
        "run_python",
        {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\nprint('drawn')"},
    )
    seen["timeout"] = await call(
        session, "run_python", {"code": "print('started', flush=True)\nwhile True:\n    pass", "timeout_seconds": 1}
    )
    seen["memory"] = await call(
        session,
        "run_python",
        {"code": "x = bytearray(768 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1"},
    )
    seen["forbidden_syscall"] = await call(
        session,
        "run_python",
        {"code": "import ctypes\nprint('calling', flush=True)\nctypes.CDLL(None).syscall(321, 0, 0, 0, 0, 0)\nprint('survived')"},
    )
    seen["exception"] = await call(session, "run_python", {"code": "raise ValueError('bad value')"})
    seen["network"] = await call(
        session,
        "run_python",
        {"code": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)"},
    )
    seen["eval"] = await call(session, "eval_expression", {"expression": "(1 + 2 + 3) * 2 ** 10"})
    seen["eval_exact"] = await call(session, "eval_expression", {"expression": "[2 ** 70, 1e500 - 1e500]"})
    seen["eval_error"] = await call(session, "eval_expression", {"expression": "1 / 0"})
    seen["eval_call"] = await call(session, "eval_expression", {"expression": "__import__('os')"})
    seen["unknown_tool"] = await call(session, "no_such_tool", {})
    seen["bad_arguments"] = await call(session, "run_python", {"source": "print(1)"})
    seen["wrong_type"] = await call(session, "run_python", {"code": 5})
    seen["above_ceiling"] = await call(
        session, "run_python", {"code": "print(1)", "timeout_seconds": 10**6}
    )
    seen["zero_timeout"] = await call(session, "run_python", {"code": "print(1)", "timeout_seconds": 0})
    # What the code prints cannot pass for the status.
    seen["forged"] = await call(
        session, "run_python", {"code": "print('status: ok')\nraise SystemExit(3)"}
    )
    seen["long_expression"] = await call(session, "eval_expression", {"expression": "1+" * 6000 + "1"})
    return seen


async def code_mode(session):
    """MCP to airlock to MCP: run_python's code calls an upstream tool."""
    seen = {}
    listed = await session.list_tools()
    seen["tools"] = {t.name: t.description for t in listed.tools}
    seen["apis"] = await call(session, "list_tool_apis", {})
    seen["run"] = await call(
        session,
        "run_python",
        {"code": "import tools\nc = tools.crm.find_customer(customer_id=2)\nprint(c['name'], sum(tools.crm.list_orders(customer_id=2)['orders']))"},
    )
    return seen


async def session_round_trip(session):
    seen = {}
    seen["create"] = await call(session, "create_session", {})
    text = seen["create"]["content"][0]["text"]
    sid = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("session_id: "))
    seen["session_id"] = sid
    seen["cell1"] = await call(
        session,
        "run_in_session",
        {
            "session_id": sid,
            "code": "import os\nos.makedirs('out', exist_ok=True)\nopen('out/notes.txt', 'w').write('kept between cells')\ncounter = 41\nprint('first cell')",
        },
    )
    seen["cell2"] = await call(
        session, "run_in_session", {"session_id": sid, "code": "counter += 1\nprint('counter is', counter)\ncounter"}
    )
    seen["files"] = await call(session, "list_session_files", {"session_id": sid})
    seen["read"] = await call(session, "read_session_file", {"session_id": sid, "path": "out/notes.txt"})
    seen["read_missing"] = await call(session, "read_session_file", {"session_id": sid, "path": "nope.txt"})
    seen["read_escape"] = await call(session, "read_session_file", {"session_id": sid, "path": "../etc/passwd"})
    seen["close"] = await call(session, "close_session", {"session_id": sid})
    seen["after_close"] = await call(session, "run_in_session", {"session_id": sid, "code": "counter"})
    return seen


def progress_recorder(into):
    """A progress callback that notes each notification and when it came (seconds since the
    recorder was made, i.e. since just before the call)."""
    started = time.monotonic()

    async def on_progress(progress, total, message):
        into.append(
            {"at": round(time.monotonic() - started, 3), "progress": progress, "total": total, "message": message}
        )

    return on_progress, started


# About 30 s: a line printed every 7.5 s, without flush (a pipe is block-buffered unless the
# server line-buffers it).
PROGRESS_CODE = "import time\nfor i in range(4):\n    print('line', i, 'x' * 100)\n    time.sleep(7.5)\n"


async def progress(session):
    seen = {"notifications": []}
    on_progress, started = progress_recorder(seen["notifications"])
    seen["run"] = await call(
        session, "run_python", {"code": PROGRESS_CODE, "timeout_seconds": 90}, progress_callback=on_progress
    )
    seen["ended_at"] = round(time.monotonic() - started, 3)
    seen["other_notifications"] = NOTIFIED
    return seen


NOTIFIED = []
LOGGED = []


async def note_message(message):
    """Every notification the session surfaces besides progress callbacks (and any transport
    error), by method."""
    NOTIFIED.append(getattr(message, "method", type(message).__name__))


async def note_log(params):
    LOGGED.append({"level": params.level, "logger": params.logger, "data": params.data})


async def logs(session):
    seen = {}
    # No progress callback (so no token) and no logging level yet: nothing should come.
    seen["quiet"] = await call(session, "run_python", {"code": "import time\nprint('quiet')\ntime.sleep(2.5)"})
    seen["quiet_notified"] = list(NOTIFIED)
    seen["quiet_logged"] = list(LOGGED)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        await session.set_logging_level("info")
    NOTIFIED.clear()
    code = (
        "import sys, time\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\ntime.sleep(1.5)\n"
        "print('later ' + '\u00e9' * 3)\ntime.sleep(1.5)"
    )
    seen["logged_run"] = await call(session, "run_python", {"code": code})
    seen["logged"] = list(LOGGED)
    seen["create"] = await call(session, "create_session", {})
    sid = seen["create"]["structured"]["session_id"]
    notes = []
    on_progress, started = progress_recorder(notes)
    seen["cell"] = await call(
        session,
        "run_in_session",
        {"session_id": sid, "code": "import time\nprint('cell')\ntime.sleep(3.5)"},
        progress_callback=on_progress,
    )
    seen["cell_ended_at"] = round(time.monotonic() - started, 3)
    seen["cell_progress"] = notes
    seen["close"] = await call(session, "close_session", {"session_id": sid})
    return seen


@asynccontextmanager
async def connect(argv):
    mode = argv[0]
    if mode == "stdio":
        binary, state_dir = argv[1], argv[2]
        params = StdioServerParameters(
            command=binary,
            args=["mcp", "--state-dir", state_dir],
            env={"AIRLOCK_POOL__SIZE": "0",
                 **{k: v for k, v in os.environ.items()
                    if k == "AIRLOCK_CONFIG" or k.startswith(("TEST_TOOL_", "AIRLOCK_MCP__"))}},
        )
        async with stdio_client(params) as (read, write):
            yield read, write
    else:
        url, key = argv[1], argv[2]
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0)) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                yield read, write


ELICITED = []


async def answer_elicitation(context, params):
    """The host's user: approves the first call it is asked about, declines the next."""
    import mcp_types

    schema = params.requested_schema
    if not isinstance(schema, dict):
        schema = schema.model_dump(by_alias=True, exclude_none=True)
    ELICITED.append({"message": params.message, "schema": schema})
    if len(ELICITED) == 1:
        return mcp_types.ElicitResult(action="accept", content={"approve": True, "reason": "looks fine"})
    return mcp_types.ElicitResult(action="decline")


async def answer_late(context, params):
    """A host's user who takes long: the dialog stays open until answered or cancelled."""
    import mcp_types

    entry = {"message": params.message, "cancelled": True}
    ELICITED.append(entry)
    try:
        await anyio.sleep(8)
        entry["cancelled"] = False
        return mcp_types.ElicitResult(action="accept", content={"approve": True})
    finally:
        entry["ended_after"] = round(time.monotonic() - STARTED[0], 1)


STARTED = [0.0]


async def approval_stale(session):
    """A call withdrawn with its execution (killed at 2 s) while its dialog is open."""
    STARTED[0] = time.monotonic()
    code = "import tools\ntools.crm.write_note(text='stale')"
    seen = {"run": await call(session, "run_python", {"code": code, "timeout_seconds": 2})}
    await anyio.sleep(3)
    seen["elicited"] = ELICITED
    return seen


async def approval(session):
    seen = {}
    code = "import tools\ntry:\n    out = ['ok', tools.crm.write_note(text=%r)]\nexcept tools.ToolError as e:\n    out = [e.kind, str(e)]\nprint(out)"
    seen["first"] = await call(session, "run_python", {"code": code % "by elicitation"})
    seen["second"] = await call(session, "run_python", {"code": code % "declined"})
    seen["elicited"] = ELICITED
    return seen


async def approval_hidden(session):
    code = (
        "import tools\nout = tools.crm.send_money(to='bob\\u202e', amount=1, "
        "meta={'note': 'x' * 20000, 'to': 'mallory', 'amount': 1000000})\nprint(out)"
    )
    seen = {"first": await call(session, "run_python", {"code": code})}
    seen["elicited"] = ELICITED
    return seen


async def background(session):
    """start_python, get_execution (at once, then waiting) and cancel_execution."""
    seen = {}
    code = "import time\nprint('begun', flush=True)\ntime.sleep(2)\nprint('done')\n6 * 7"
    seen["start"] = await call(session, "start_python", {"code": code, "timeout_seconds": 1200})
    eid = seen["start"]["structured"]["id"]
    seen["now"] = await call(session, "get_execution", {"id": eid})
    seen["waited"] = await call(session, "get_execution", {"id": eid, "wait_seconds": 30})
    seen["long"] = await call(session, "start_python", {"code": "import time\ntime.sleep(600)"})
    lid = seen["long"]["structured"]["id"]
    seen["cancel"] = await call(session, "cancel_execution", {"id": lid})
    seen["after_cancel"] = await call(session, "get_execution", {"id": lid})
    seen["wait_too_long"] = await call(session, "get_execution", {"id": eid, "wait_seconds": 61})
    seen["unknown"] = await call(session, "get_execution", {"id": "ex_0123"})
    return seen


async def main(argv):
    scenario = argv[3]
    out = {}
    callback = {"approval": answer_elicitation, "approval_hidden": answer_elicitation, "approval_stale": answer_late}.get(
        scenario
    )
    try:
        async with connect(argv) as (read, write):
            async with ClientSession(
                read, write, elicitation_callback=callback, message_handler=note_message, logging_callback=note_log
            ) as session:
                init = await session.initialize()
                out["server"] = {"name": init.server_info.name, "instructions": init.instructions}
                out["protocol_version"] = init.protocol_version
                if scenario == "tools":
                    out.update(await tools(session))
                elif scenario == "code_mode":
                    out.update(await code_mode(session))
                elif scenario == "session":
                    out.update(await session_round_trip(session))
                elif scenario in ("approval", "approval_unasked"):
                    out.update(await approval(session))
                elif scenario == "approval_hidden":
                    out.update(await approval_hidden(session))
                elif scenario == "approval_stale":
                    out.update(await approval_stale(session))
                elif scenario == "progress":
                    out.update(await progress(session))
                elif scenario == "logs":
                    out.update(await logs(session))
                elif scenario == "background":
                    out.update(await background(session))
                elif scenario == "abandon":
                    # A session left open when the client goes.
                    out["create"] = await call(session, "create_session", {})
                    sid = out["create"]["content"][0]["text"].split("\n")[0].split(": ", 1)[1]
                    out["cell"] = await call(session, "run_in_session", {"session_id": sid, "code": "x = 1"})
    except BaseException as e:  # noqa: BLE001 - reported, for the test to judge
        out["failed"] = describe(e)
    print(json.dumps(out))


def describe(e):
    """An exception, with those an exception group holds."""
    if isinstance(e, BaseExceptionGroup):
        return {"type": type(e).__name__, "inner": [describe(x) for x in e.exceptions]}
    seen = {"type": type(e).__name__, "message": str(e)}
    if isinstance(e, MCPError):
        seen["code"] = e.code
        seen["data"] = e.error.data
    return seen


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
