"""Targets for the egress tests, on loopback: one HTTP and one HTTPS server (the certificate
and key given as arguments), printing their ports on the first two lines of stdout, and on
the third the port of a listener whose accept queue is full, so that the kernel drops any
further connection attempt (a target whose connect never completes).

GET /hello      -> "hello from http" or "hello from https"
GET /headers    -> the request's headers as JSON (what the proxy forwarded)
GET /big?n=N    -> N bytes
POST /sink      -> reads the body, answers how many bytes it read
"""

import http.server
import json
import socket
import ssl
import sys
import threading
import urllib.parse


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, body, kind="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/hello":
            self.answer(f"hello from {self.server.scheme}".encode())
        elif url.path == "/headers":
            self.answer(json.dumps(dict(self.headers.items())).encode(), "application/json")
        elif url.path == "/big":
            n = int(urllib.parse.parse_qs(url.query)["n"][0])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * 65536
            try:
                while n > 0:
                    self.wfile.write(chunk[: min(n, len(chunk))])
                    n -= len(chunk)
            except OSError:
                pass
        else:
            self.send_error(404)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        got = 0
        try:
            while got < n:
                data = self.rfile.read(min(65536, n - got))
                if not data:
                    break
                got += len(data)
        except OSError:
            return
        self.answer(str(got).encode())


def serve(scheme, context=None):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.scheme = scheme
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def main():
    cert, key = sys.argv[1], sys.argv[2]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    print(serve("http"), flush=True)
    print(serve("https", context), flush=True)
    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(0)
    port = stalled.getsockname()[1]
    # Never accepted: one connection fills a queue of 0, and later SYNs are dropped.
    fillers = [socket.create_connection(("127.0.0.1", port), timeout=5)]
    print(port, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    del fillers


if __name__ == "__main__":
    main()
