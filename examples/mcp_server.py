"""An MCP server to add to the mesh (the official mcp SDK's MCPServer over Streamable HTTP):
`python examples/mcp_server.py --port 8000`, then `agentreach mcp add http://127.0.0.1:8000/mcp --service calc`."""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")


@server.tool(description="Adds two integers")
def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


@server.tool(description="Says back what it is given")
def echo(text: str) -> dict[str, Any]:
    return {"echo": text}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    port = parser.parse_args().port
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
