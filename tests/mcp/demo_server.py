"""A remote MCP server for tests/tests/mcp.rs, written with the official MCP
Python SDK (`mcp` on PyPI, pinned in tests/tools/mcp.txt).

    demo_server.py HEADER_LOG REQUIRED_KEY

Serves streamable HTTP on 127.0.0.1 at a free port, prints `LISTENING <port>`
once it accepts connections, refuses (401) any request whose `X-Api-Key` is
not REQUIRED_KEY, and appends the `X-Api-Key` of every request to HEADER_LOG
(so the test can see what Kiln's worker sent) and, for every POST, its
`Mcp-Session-Id` to HEADER_LOG.sessions (an empty line: an `initialize`, a
connection made).

The tool `grow` adds a tool (`double`) and tells the client its tool list
changed (`notifications/tools/list_changed`).
"""

import asyncio
import socket
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations, ToolListChangedNotification

LONG_TOOL = "a_tool_whose_name_is_long_enough_to_need_cutting"

server = MCPServer("kiln-demo")


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description="Upper-cases a text.", annotations=ToolAnnotations(readOnlyHint=True))
def shout(text: str) -> str:
    return text.upper()


@server.tool(name=LONG_TOOL, description="Multiplies two integers.")
def multiply(a: int, b: int) -> int:
    return a * b


@server.tool(description="Returns a text of `size` bytes.")
def huge(size: int) -> str:
    return "x" * size


@server.tool(description="Sleeps, then answers.")
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"


@server.tool(description="Always fails (the SDK reports it as an error result).")
def boom() -> str:
    raise ValueError("boom went the tool")


def double(x: int) -> int:
    return 2 * x


@server.tool(description="Adds the tool `double` and says the tool list changed.")
async def grow(ctx: Context) -> str:
    if "double" not in [tool.name for tool in server._tool_manager.list_tools()]:
        server.add_tool(double, description="Doubles an integer.")
    # On the call's own stream, ahead of its result: the client has it
    # before the call returns.
    await ctx.session.send_notification(ToolListChangedNotification(), related_request_id=ctx.request_id)
    return "grown"


def guarded(app, log_path, key):
    """The SDK's app behind a check of the X-Api-Key header."""

    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            seen = headers.get(b"x-api-key", b"").decode("latin-1")
            with open(log_path, "a") as log:
                log.write(seen + "\n")
            if scope["method"] == "POST":
                with open(log_path + ".sessions", "a") as log:
                    log.write(headers.get(b"mcp-session-id", b"").decode("latin-1") + "\n")
            if seen != key:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"bad key"})
                return
        await app(scope, receive, send)

    return asgi


def main():
    log_path, key = sys.argv[1], sys.argv[2]
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on a
    # socket whose proto says TCP, and an accepted socket inherits it.
    # Without it the server's SSE answer (headers, then the event, in two
    # writes) waits in Nagle for the client's delayed ACK: ~40 ms a call.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    app = guarded(server.streamable_http_app(host="127.0.0.1"), log_path, key)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)

    async def serve():
        task = asyncio.create_task(uv.serve(sockets=[sock]))
        while not uv.started:
            await asyncio.sleep(0.01)
        print(f"LISTENING {port}", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
