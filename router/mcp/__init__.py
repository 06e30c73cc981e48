"""The mesh as an MCP server (Model Context Protocol, Streamable HTTP at ``/mcp``): each capability a caller
may call is a tool, and a tool call is an ATP call through the same Router as /atp (docs/mcp.md)."""
