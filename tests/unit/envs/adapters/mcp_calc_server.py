"""A tiny MCP server over stdio for the adapter tests: one calculator tool (``add``) and one that fails."""

from mcp.server import MCPServer

server = MCPServer("calculator")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always raises."""
    raise RuntimeError(reason)


if __name__ == "__main__":
    server.run("stdio")
