"""A tiny MCP server over stdio, with the Python standard library only (the
sandbox image has python3 and nothing else). One JSON-RPC message per line.

Tools: `add` (a + b), `whoami` (uid and pid), `sleep` (writes
/tmp/mcp-sleeping, then sleeps: a call to kill it in), `flood` (writes one
line of `size` bytes: a message over the client's cap), and one `echo`-like
tool for each name in the file `mcp-extra-tools` of its working directory,
read when it starts (a server whose tools differ after a restart).
"""
import json
import os
import sys
import time

TOOLS = [
    {"name": "add", "description": "Adds two integers.",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["a", "b"]}},
    {"name": "whoami", "description": "The server's uid and pid.",
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "sleep", "description": "Sleeps.",
     "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "flood", "description": "Answers with one huge line.",
     "inputSchema": {"type": "object", "properties": {"size": {"type": "integer"}}}},
]

EXTRA = []
if os.path.exists("mcp-extra-tools"):
    with open("mcp-extra-tools") as f:
        EXTRA = [name for name in f.read().split() if name]
TOOLS += [{"name": name, "description": "Echoes its text.",
           "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}} for name in EXTRA]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(value):
    return {"content": [{"type": "text", "text": str(value)}]}


def call(name, args):
    if name == "add":
        return text(args["a"] + args["b"])
    if name == "whoami":
        return text(f"uid={os.getuid()} pid={os.getpid()}")
    if name == "sleep":
        with open("/tmp/mcp-sleeping", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(float(args.get("seconds", 60)))
        return text("slept")
    if name in EXTRA:
        return text(args.get("text", ""))
    if name == "flood":
        sys.stdout.write("x" * int(args["size"]))
        sys.stdout.flush()
        time.sleep(60)
    return {"content": [{"type": "text", "text": f"no tool {name}"}], "isError": True}


for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        continue  # a notification
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "stdio-demo", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = call(msg["params"]["name"], msg["params"].get("arguments") or {})
    elif method == "ping":
        result = {}
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"no method {method}"}})
        continue
    send({"jsonrpc": "2.0", "id": mid, "result": result})
