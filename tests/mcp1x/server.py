"""An mcp SDK 1.x server (FastMCP, run by .venv-mcp1's python, never importing the project) with the tools echo
and add, on Streamable HTTP at http://127.0.0.1:PORT/mcp until it is terminated.

Usage: server.py PORT NAME [--stateless-json]: NAME is the server's name, returned by add so a caller sees who
served it; --stateless-json serves without sessions, each answer plain JSON (FastMCP's stateless_http and
json_response), the other way MCP servers are deployed.
"""

from __future__ import annotations

import sys

from mcp.server.fastmcp import FastMCP


def server(port: int, name: str, stateless_json: bool) -> FastMCP:
    mcp = FastMCP(
        name,
        host="127.0.0.1",
        port=port,
        log_level="WARNING",
        stateless_http=stateless_json,
        json_response=stateless_json,
    )

    @mcp.tool(description="Echoes the text")
    def echo(text: str) -> str:
        return text

    @mcp.tool(description="Adds two integers")
    def add(a: int, b: int) -> dict[str, int | str]:
        return {"sum": a + b, "server": name}

    return mcp


if __name__ == "__main__":
    server(int(sys.argv[1]), sys.argv[2], "--stateless-json" in sys.argv[3:]).run(transport="streamable-http")
