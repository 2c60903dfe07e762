"""A small CRM as an MCP server (the official Python SDK): what an operator would run.

It holds its own credential (CRM_TOKEN, given by airlock from the host's environment); the
sandboxed code that calls its tools never sees it.
"""

import os

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

READ = ToolAnnotations(readOnlyHint=True)
server = MCPServer("crm")

CUSTOMERS = {
    1: {"name": "Ada Lovelace", "country": "UK", "plan": "enterprise"},
    2: {"name": "Grace Hopper", "country": "US", "plan": "team"},
    3: {"name": "Katherine Johnson", "country": "US", "plan": "team"},
}


def authorised():
    if not os.environ.get("CRM_TOKEN"):
        raise PermissionError("CRM_TOKEN is not set")


@server.tool(annotations=READ)
def list_customers(country: str | None = None) -> list[dict]:
    """Lists customers, optionally those of one country (ISO code)."""
    authorised()
    return [{"id": i, **c} for i, c in CUSTOMERS.items() if country in (None, c["country"])]


@server.tool(annotations=ToolAnnotations(readOnlyHint=False))
def add_note(customer_id: int, text: str) -> str:
    """Adds a note to a customer (writes: granted only by name)."""
    authorised()
    return "noted"


if __name__ == "__main__":
    server.run("stdio")
