"""A git smart-HTTP server for tests: git http-backend (CGI) behind HTTP
basic auth, on loopback. Every request is logged to LOG (method, path,
whether it carried the right credentials) before anything else happens.

Usage: git_http_server.py ROOT USER TOKEN LOG [MODE]  (prints the port, then
serves). MODE, for tests of a remote that is down at first: `fail:N` answers
the first N requests 503; `hang:N` holds the first N requests open for ten
minutes, answering nothing.
"""
import base64
import http.server
import os
import subprocess
import sys
import threading
import time

root, user, token, log = sys.argv[1:5]
mode, _, count = (sys.argv[5] if len(sys.argv) > 5 else "ok:0").partition(":")
troubled = int(count or 0)
lock = threading.Lock()


def in_trouble():
    """Whether this request is one of the first `troubled`."""
    global troubled
    with lock:
        troubled -= 1
        return troubled >= 0
expected = "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def read_chunked(rfile):
    body = b""
    while True:
        size = int(rfile.readline().strip().split(b";")[0], 16)
        if size == 0:
            rfile.readline()
            return body
        body += rfile.read(size)
        rfile.readline()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.serve()

    def do_POST(self):
        self.serve()

    def log_message(self, *args):
        pass

    def serve(self):
        authorized = self.headers.get("Authorization") == expected
        with open(log, "a") as f:
            f.write(f"{self.command} {self.path} authorized={str(authorized).lower()}\n")
        if mode != "ok" and in_trouble():
            if mode == "hang":
                time.sleep(600)
                return
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if not authorized:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = read_chunked(self.rfile)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {
            "PATH": os.environ["PATH"],
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_PROJECT_ROOT": root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "QUERY_STRING": query,
            "PATH_INFO": path,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": user,
            "REMOTE_ADDR": "127.0.0.1",
        }
        for header, var in [("Git-Protocol", "GIT_PROTOCOL"), ("Content-Encoding", "HTTP_CONTENT_ENCODING")]:
            if self.headers.get(header):
                env[var] = self.headers[header]
        out = subprocess.run(
            ["/usr/lib/git-core/git-http-backend"], input=body, env=env, capture_output=True
        ).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.split(b"\r\n"):
            name, _, value = line.decode().partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
