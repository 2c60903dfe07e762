"""Targets for the egress tests, on loopback: one HTTP and one HTTPS server (the certificate
and key given as arguments), printing their ports on the first two lines of stdout, and on
the third the port of a listener whose accept queue is full, so that the kernel drops any
further connection attempt (a target whose connect never completes), and on the fourth the
port of a recorder.

The recorder is the upstream that sees everything: it reads every request on a connection,
ignoring `Connection: close` (as a careless or hostile server may), records each (its
connection, request line, headers and body) and answers it, keeping the connection until it
has been idle for 0.3 s. `GET /recorded` answers what it recorded, as JSON, and closes.

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


RECORDED = []
RECORDED_LOCK = threading.Lock()


def read_request(conn, buf):
    """One request from `buf` and what `conn` sends next: (request, rest), or (None, buf)
    once the connection closes or idles. Bodies by Content-Length or chunked."""

    def more():
        nonlocal buf
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        buf += data
        return bool(data)

    while b"\r\n\r\n" not in buf:
        if not more():
            return None, buf
    head, buf = buf.split(b"\r\n\r\n", 1)
    line, *fields = head.decode("latin-1").split("\r\n")
    headers = [f.split(":", 1) for f in fields]
    headers = [[k.strip().lower(), v.strip()] for k, v in headers]
    named = dict(headers)
    body = b""
    if named.get("transfer-encoding", "").lower() == "chunked":
        while True:
            while b"\r\n" not in buf:
                if not more():
                    return None, buf
            size, buf = buf.split(b"\r\n", 1)
            size = int(size, 16)
            while len(buf) < size + 2:
                if not more():
                    return None, buf
            body, buf = body + buf[:size], buf[size + 2 :]
            if size == 0:
                break
    else:
        n = int(named.get("content-length", "0"))
        while len(buf) < n:
            if not more():
                return None, buf
        body, buf = buf[:n], buf[n:]
    return {"line": line, "headers": headers, "body": body.decode("latin-1")}, buf


def record(conn, number):
    conn.settimeout(0.3)
    buf = b""
    with conn:
        while True:
            request, buf = read_request(conn, buf)
            if request is None:
                break
            if request["line"].split(" ")[1] == "/recorded":
                with RECORDED_LOCK:
                    body = json.dumps(RECORDED).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                return
            request["connection"] = number
            with RECORDED_LOCK:
                RECORDED.append(request)
            body = b"recorded " + request["line"].encode("latin-1")
            answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            try:
                conn.sendall(answer)
            except OSError:
                break
        if buf:
            with RECORDED_LOCK:
                RECORDED.append({"connection": number, "leftover": buf.decode("latin-1")})


def recorder():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def accept():
        number = 0
        while True:
            conn, _ = listener.accept()
            number += 1
            threading.Thread(target=record, args=(conn, number), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


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
    print(recorder(), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    del fillers


if __name__ == "__main__":
    main()
