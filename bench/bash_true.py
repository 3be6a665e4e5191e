#!/usr/bin/env python3
"""One `bash true` call: through the toolbox (one long-lived process, framed
requests over one attached `docker exec`, as the worker does) against a fresh
`docker exec <c> true` through the CLI per call. Same image, same container,
same hardening as Kiln's sandboxes. Prints median and p95 over N runs and
the ratio.

    bench/bash_true.py [--runs 20] [--toolbox target/debug/kiln-toolbox] [--image kiln-sandbox:latest]

The toolbox side measures request written -> response read by this script
over the docker CLI's attach stream (the same Docker attach transport the
worker's bollard client uses), not through the worker itself.
"""
import argparse
import json
import statistics
import struct
import subprocess
import time


def frame(obj):
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def read_exact(f, n):
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError("toolbox closed its output")
        buf += chunk
    return buf


def read_frame(f):
    (n,) = struct.unpack(">I", read_exact(f, 4))
    return json.loads(read_exact(f, n))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def summary(name, xs):
    print(f"{name:<28} median {statistics.median(xs):8.2f} ms   p95 {pct(xs, 95):8.2f} ms   (n={len(xs)})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--toolbox", default="target/debug/kiln-toolbox")
    ap.add_argument("--image", default="kiln-sandbox:latest")
    args = ap.parse_args()

    run = ["docker", "run", "-d", "--init", "--network", "none", "--cap-drop", "ALL",
           "--security-opt", "no-new-privileges:true", "--pids-limit", "256", "--memory", "1g",
           "--memory-swap", "1g", "--cpus", "1", "-u", "65534:65534", "-w", "/workspace",
           "--label", "dev.kiln.bench=true", args.image, "sleep", "infinity"]
    container = subprocess.check_output(run, text=True).strip()
    try:
        subprocess.check_call(["docker", "cp", args.toolbox, f"{container}:/tmp/kiln-toolbox"])
        tb = subprocess.Popen(["docker", "exec", "-i", "-u", "1000:1000", "-w", "/workspace", container,
                               "/tmp/kiln-toolbox"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        hello = read_frame(tb.stdout)
        assert hello["type"] == "hello", hello

        def toolbox_true(i):
            t = time.perf_counter()
            tb.stdin.write(frame({"id": i, "type": "exec", "command": "true"}))
            tb.stdin.flush()
            while True:
                msg = read_frame(tb.stdout)
                if msg["type"] == "response" and msg["id"] == i:
                    assert msg["result"]["exit_code"] == 0, msg
                    return (time.perf_counter() - t) * 1000

        def toolbox_ping(i):
            t = time.perf_counter()
            tb.stdin.write(frame({"id": i, "type": "ping"}))
            tb.stdin.flush()
            while read_frame(tb.stdout).get("id") != i:
                pass
            return (time.perf_counter() - t) * 1000

        def cli_true():
            t = time.perf_counter()
            subprocess.check_call(["docker", "exec", "-u", "1000:1000", container, "true"])
            return (time.perf_counter() - t) * 1000

        toolbox_true(10_000)  # warm-up: first exec sets up the session state
        cli_true()
        kiln = [toolbox_true(i) for i in range(1, args.runs + 1)]
        # The transport alone, to tell it apart from starting bash.
        ping = [toolbox_ping(i) for i in range(20_000, 20_000 + args.runs)]
        cli = [cli_true() for _ in range(args.runs)]
        tb.stdin.close()
        tb.wait(timeout=10)
    finally:
        subprocess.call(["docker", "rm", "-f", container], stdout=subprocess.DEVNULL)

    summary("toolbox exec `true`", kiln)
    summary("toolbox ping (transport)", ping)
    summary("docker exec <c> true (CLI)", cli)
    ratio = statistics.median(kiln) / statistics.median(cli)
    print(f"ratio toolbox/CLI (median): {ratio:.4f}   goal <= 0.05: {'met' if ratio <= 0.05 else 'NOT met'}")


if __name__ == "__main__":
    main()
