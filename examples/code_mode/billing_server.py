"""Billing as an MCP server (the official Python SDK), holding its own API key."""

import os

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("billing")

INVOICES = {1: [1200.0, 800.0, 450.5], 2: [99.0, 99.0], 3: [310.0]}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def invoices(customer_id: int) -> list[float]:
    """The amounts invoiced to a customer, oldest first."""
    if not os.environ.get("BILLING_API_KEY"):
        raise PermissionError("BILLING_API_KEY is not set")
    return INVOICES.get(customer_id, [])


if __name__ == "__main__":
    server.run("stdio")
