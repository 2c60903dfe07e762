"""An upstream MCP server for the code-mode tests, written with the official Python SDK.

    tool_server.py stdio           serves on stdin/stdout (airlock starts it)
    tool_server.py http PORT       serves streamable HTTP on 127.0.0.1:PORT, and refuses any
                                   request whose X-Api-Key header is not $TOOL_HEADER_SECRET

It writes what it saw to the JSON-lines file $TOOL_LOG (calls, cancellations, the trace
context `echo` was called with), so that tests can check what reached it. $TOOL_CANARY is a secret only the server holds.
"""

import asyncio
import json
import os
import sys
import time
from typing import Annotated

from pydantic import Field

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import ToolAnnotations

READ = ToolAnnotations(readOnlyHint=True)
WRITE = ToolAnnotations(readOnlyHint=False, destructiveHint=True)
server = MCPServer("airlock-test-tools")
running = {"now": 0, "most": 0}


def log(**event):
    path = os.environ.get("TOOL_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")


@server.tool(annotations=READ)
def add(a: int, b: int = 1) -> int:
    """Adds two integers."""
    log(tool="add", a=a, b=b)
    return a + b


@server.tool(annotations=READ)
def echo(value: object, ctx: Context) -> dict:
    """Gives back what it was given, nested JSON included."""
    # The trace context airlock sent in `_meta` (never the value).
    meta = ctx.request_context.meta or {}
    log(tool="echo", traceparent=meta.get("traceparent"), tracestate=meta.get("tracestate"))
    return {"value": value}


@server.tool(annotations=READ, structured_output=False)
def greet(name: str) -> str:
    """Greets someone, as plain text."""
    return "hello " + name


@server.tool(annotations=READ)
def pixel() -> Image:
    """A PNG image (the 8-byte PNG signature and a tag)."""
    return Image(data=b"\x89PNG\r\n\x1a\nairlock", format="png")


@server.tool(annotations=READ)
def find_customer(customer_id: int) -> dict:
    """Finds a customer by id."""
    customers = {1: {"name": "Ada", "country": "UK"}, 2: {"name": "Grace", "country": "US"}}
    if customer_id not in customers:
        raise ValueError("no customer %d" % customer_id)
    return {"id": customer_id, **customers[customer_id]}


@server.tool(annotations=READ)
def list_orders(customer_id: int) -> dict:
    """Lists a customer's orders."""
    orders = {1: [120.0, 80.5], 2: [42.0]}
    return {"orders": orders.get(customer_id, [])}


@server.tool(annotations=READ)
def holds_canary() -> bool:
    """Whether this server was given its secret (it never says the secret itself)."""
    return bool(os.environ.get("TOOL_CANARY"))


@server.tool(annotations=READ)
def contact(
    email: Annotated[str, Field(json_schema_extra={"format": "email"})],
    day: Annotated[str, Field(json_schema_extra={"format": "date"})] = "2024-01-01",
) -> str:
    """Books a call. The schema says `format`, but this server checks nothing itself."""
    log(tool="contact", email=email, day=day)
    return "booked " + email + " " + day


@server.tool(annotations=WRITE)
def write_note(text: str) -> str:
    """Writes a note (a tool that is not read-only)."""
    log(tool="write_note", text=text)
    return "written"


@server.tool(annotations=WRITE)
def send_money(to: str, amount: int, meta: dict | None = None) -> str:
    """Sends money (a tool that writes, with nested arguments)."""
    log(tool="send_money", to=to, amount=amount, meta=meta)
    return "sent"


@server.tool(annotations=READ)
async def slow(seconds: float, tag: str = "") -> str:
    """Sleeps, then answers; says so in the log if it is cancelled first."""
    running["now"] += 1
    running["most"] = max(running["most"], running["now"])
    log(tool="slow", tag=tag, state="started", running=running["now"])
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        log(tool="slow", tag=tag, state="cancelled")
        raise
    finally:
        running["now"] -= 1
    log(tool="slow", tag=tag, state="done")
    return "slept " + tag


@server.tool(annotations=READ)
def most_at_once() -> int:
    """The most `slow` calls that ran at once."""
    return running["most"]


@server.tool(annotations=READ)
def big(n: int) -> str:
    """A text of n bytes."""
    return "x" * n


@server.tool(annotations=READ)
def die() -> str:
    """Ends the server's process in the middle of the call."""
    log(tool="die")
    os._exit(3)


@server.tool(annotations=READ)
def garbage() -> str:
    """Writes bytes that are not JSON-RPC where the answer should be, then never answers."""
    os.write(1, b"\x00\xffthis is not json\n{\"jsonrpc\": \"2.0\", \"id\": \"nope\"}\n")
    time.sleep(3600)
    return "unreachable"


@server.tool(annotations=READ)
def fail(message: str) -> str:
    """Always fails with the given message."""
    raise ToolError(message)


@server.tool(name="aio", annotations=READ)
def named_aio(x: int = 1) -> int:
    """A tool whose name is the awaitable form's attribute."""
    return x


@server.tool(name="_airlock_defaults", annotations=READ)
def named_like_internals(y: int = 2) -> int:
    """A tool named like the package's own internals."""
    return y


def main():
    if sys.argv[1:2] == ["http"]:
        import uvicorn
        from starlette.responses import PlainTextResponse

        app = server.streamable_http_app(stateless_http=True, json_response=True)
        secret = os.environ["TOOL_HEADER_SECRET"]

        async def guarded(scope, receive, send):
            if scope["type"] == "http":
                headers = dict(scope["headers"])
                if headers.get(b"x-api-key", b"").decode() != secret:
                    await PlainTextResponse("bad key", status_code=401)(scope, receive, send)
                    return
            await app(scope, receive, send)

        uvicorn.run(guarded, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
