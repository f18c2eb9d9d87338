"""An MCP server over stdio with a calculator tool (add), for examples/mcp_tools_sums.yaml."""

from mcp.server import MCPServer

server = MCPServer("calculator")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    server.run("stdio")
