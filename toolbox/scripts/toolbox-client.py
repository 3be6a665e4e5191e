#!/usr/bin/env python3
"""Minimal client for manual checks of kiln-toolbox: sends each JSON request
given on the command line as a frame, prints every frame received until all
requests have a response, then closes stdin.

    toolbox-client.py -- target/toolbox/kiln-toolbox '{"id":1,"type":"ping"}'
    toolbox-client.py -- docker exec -i -u 1000 CONTAINER /tmp/kiln-toolbox '{"id":1,"type":"ping"}'
"""
import json
import struct
import subprocess
import sys
import time


def read_exact(f, n):
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(f):
    header = read_exact(f, 4)
    if header is None:
        return None
    (length,) = struct.unpack(">I", header)
    return json.loads(read_exact(f, length))


def main():
    args = sys.argv[1:]
    if "--" not in args:
        sys.exit(__doc__)
    split = args.index("--")
    rest = args[split + 1:]
    cmd = [a for a in rest if not a.startswith("{")]
    requests = [json.loads(a) for a in rest if a.startswith("{")]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    for req in requests:
        body = json.dumps(req).encode()
        proc.stdin.write(struct.pack(">I", len(body)) + body)
    proc.stdin.flush()
    pending = {r["id"] for r in requests}
    while True:
        msg = read_frame(proc.stdout)
        if msg is None:
            break
        print(f"{(time.monotonic() - start) * 1000:8.1f} ms  {json.dumps(msg)}")
        if msg.get("type") == "response":
            pending.discard(msg["id"])
        if not pending:
            break
    proc.stdin.close()
    sys.exit(proc.wait())


if __name__ == "__main__":
    main()
