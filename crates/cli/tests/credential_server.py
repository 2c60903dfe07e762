"""HTTPS upstreams for the credential tests, on the host's loopback.

Usage: credential_server.py DIR TOKEN

Makes a test CA and two certificates with openssl in DIR, then serves:
- "good": a certificate for api.test and other.test (from the test CA). Every answer
  echoes the request back: its headers as JSON, and the Authorization header again in many
  forms (base64 at every alignment, base64url, percent-encoded, hex, JSON-escaped), in
  answer headers too, framed and coded as `?mode=` asks: plain, chunked (5-byte chunks),
  gzip, gzip-chunked, deflate, or br (a coding the proxy cannot scan). /redirect?to=URL
  answers 302; /simple/ and /files/ are a package index that needs `Bearer TOKEN`.
  /tail?g=G&mode=length|chunked|close answers `hello G`, in one write, framed as asked.
  /encoders?name=N answers the secret as Python's encoder N writes it; /encoders, the names
  (and the request's headers), keeping the forms in DIR/encoders.json for the test to
  compare, with what each encoder writes of an empty string.
  /stream?id=N sends one event, then waits for /go?id=N before the second and the end
  (&mode=trickle: sending an event every 20 ms meanwhile).
- "wrong": a certificate for evil.test only (from the same CA).
Prints the two ports, then DIR/ca.pem's path, one per line.
"""

import base64
import gzip
import html
import io
import json
import os
import ssl
import subprocess
import sys
import textwrap
import threading
import urllib.parse
import xml.sax.saxutils
import zipfile
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIR, TOKEN = sys.argv[1], sys.argv[2]


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def certificates():
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    p = lambda name: os.path.join(DIR, name)
    openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=airlock test CA",
            "-keyout", p("ca.key"), "-out", p("ca.pem"),
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, sans in [("good", "DNS:api.test,DNS:other.test"), ("wrong", "DNS:evil.test")]:
        ext = p(name + ".ext")
        with open(ext, "w") as f:
            f.write(f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n"
                    "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n")
        openssl("req", *ec, "-subj", "/CN=" + sans.split(",")[0][4:],
                "-keyout", p(name + ".key"), "-out", p(name + ".csr"))
        openssl("x509", "-req", "-in", p(name + ".csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
                "-CAcreateserial", "-days", "2", "-out", p(name + ".pem"), "-extfile", ext)


def wheel():
    """A wheel of one module, `airlock_probe`, that says it was installed."""
    buf = io.BytesIO()
    info = "airlock_probe-1.0.dist-info/"
    files = {
        "airlock_probe.py": "INSTALLED = 'through the credential proxy'\n",
        info + "METADATA": "Metadata-Version: 2.1\nName: airlock-probe\nVersion: 1.0\n",
        info + "WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + info + "RECORD,,\n"
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(info + "RECORD", record)
    return buf.getvalue()


WHEEL = wheel()
WHEEL_NAME = "airlock_probe-1.0-py3-none-any.whl"


def forms(value):
    raw = value.encode()
    out = {
        "url": urllib.parse.quote(value, safe=""),
        "url_lower": urllib.parse.quote(value, safe="").lower(),
        "hex": raw.hex(),
        "json": json.dumps(value).replace("/", "\\/"),
        "b64url": base64.urlsafe_b64encode(raw).decode(),
    }
    for i, prefix in enumerate([b"", b"x", b"xy"]):
        out[f"b64_{i}"] = base64.b64encode(prefix + raw + b"!").decode()
    return out


def encoders(secret):
    """The secret as each of Python's encoders writes it (base64 also inside longer values
    and wrapped as MIME, PEM and GitHub wrap it)."""
    q = urllib.parse.quote
    raw = secret.encode()
    b64 = lambda b: base64.b64encode(b).decode()
    wrap = lambda text, width: "\n".join(textwrap.wrap(text, width)) + "\n"
    mime = base64.encodebytes(raw).decode()
    return {
        "html.escape": html.escape(secret),
        "html.escape twice": html.escape(html.escape(secret)),
        "xml escape": xml.sax.saxutils.escape(secret, {'"': "&quot;", "'": "&apos;"}),
        "json": json.dumps(secret),
        "json twice": json.dumps(json.dumps(secret)),
        "json thrice": json.dumps(json.dumps(json.dumps(secret))),
        "json of html": json.dumps(html.escape(secret)),
        "html of json": html.escape(json.dumps(secret)),
        "quote": q(secret),
        "quote, nothing safe": q(secret, safe=""),
        "quote_plus": urllib.parse.quote_plus(secret),
        "quoted twice": q(q(secret, safe=""), safe=""),
        "urlencode": urllib.parse.urlencode({"t": secret})[2:],
        "quote of json": q(json.dumps(secret), safe=""),
        "quote of html": q(html.escape(secret), safe=""),
        "repr": repr(secret),
        "repr of json": repr(json.dumps(secret)),
        "unicode_escape of json": json.dumps(secret).encode("unicode_escape").decode(),
        "hex": raw.hex(),
        "base64": b64(raw),
        "base64 after x": b64(b"x" + raw + b"!"),
        "base64 after xy": b64(b"xy" + raw + b"!?"),
        "urlsafe base64": base64.urlsafe_b64encode(b"u:" + raw).decode(),
        "mime base64": mime,
        "json of mime base64": json.dumps(mime),
        "base64 wrapped at 64": wrap(b64(b"B" + raw), 64),
        "base64 wrapped at 60": wrap(b64(b"Be" + raw), 60),
    }


TAILS = {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.handle_any()

    def do_POST(self):
        self.handle_any()

    def do_HEAD(self):
        self.handle_any()

    def send(self, status, body, headers=(), chunks=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if chunks is None:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        else:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), chunks):
                piece = body[i:i + chunks]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\nX-Trailer: " + body[:16].replace(b"\r", b"").replace(b"\n", b"") + b"\r\n\r\n")
        self.wfile.flush()

    def tail(self, guess, mode):
        """`hello GUESS` in one write: what an API that quotes the request looks like."""
        body = ("hello " + guess).encode()
        if mode == "length":
            out = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        elif mode == "chunked":
            out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n%x\r\n%s\r\n0\r\n\r\n" % (
                len(body) - 6, body[6:])
        else:
            out = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
            self.close_connection = True
        self.wfile.write(out)
        self.wfile.flush()

    def stream(self, key, trickle):
        """An event, then (once /go?id= came) another and the end; with `trickle`, an event
        every 20 ms until then."""
        event = TAILS.setdefault(key, threading.Event())
        self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
        self.wfile.write(b"b\r\ndata: one\n\n\r\n")
        self.wfile.flush()
        while trickle and not event.wait(0.02):
            self.wfile.write(b"c\r\ndata: tick\n\n\r\n")
            self.wfile.flush()
        event.wait(60)
        self.wfile.write(b"b\r\ndata: two\n\n\r\n0\r\n\r\n")
        self.wfile.flush()

    def handle_any(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        auth = self.headers.get("Authorization", "")
        length = int(self.headers.get("Content-Length") or 0)
        body_in = self.rfile.read(length) if length else b""
        if url.path == "/redirect":
            return self.send(302, b"", [("Location", query["to"])])
        if url.path == "/tail":
            return self.tail(query["g"], query.get("mode", "length"))
        if url.path == "/encoders":
            written = encoders(auth[len("Bearer "):])
            if "name" in query:
                return self.send(200, written[query["name"]].encode(), [("Content-Type", "text/plain")])
            with open(os.path.join(DIR, "encoders.json"), "w") as f:
                json.dump({"forms": written, "empty": encoders("")}, f)
            return self.send(200, json.dumps({"names": list(written), "headers": dict(self.headers.items())}).encode(),
                             [("Content-Type", "application/json")])
        if url.path == "/stream":
            return self.stream(query["id"], query.get("mode") == "trickle")
        if url.path == "/go":
            TAILS.setdefault(query["id"], threading.Event()).set()
            return self.send(200, b"went\n")
        if url.path.startswith(("/simple/", "/files/")):
            if auth != "Bearer " + TOKEN:
                return self.send(401, b"no\n", [("WWW-Authenticate", "Bearer")])
            if url.path.startswith("/files/"):
                return self.send(200, WHEEL, [("Content-Type", "application/octet-stream")])
            page = f'<html><body><a href="/files/{WHEEL_NAME}">{WHEEL_NAME}</a></body></html>'
            return self.send(200, page.encode(), [("Content-Type", "text/html")])
        echo = {
            "method": self.command,
            "path": self.path,
            "host": self.headers.get("Host"),
            "sni": getattr(self.connection, "server_hostname", None),
            "headers": dict(self.headers.items()),
            "body": body_in.decode(errors="replace"),
            "forms": forms(auth) if auth else {},
            "auth_ok": auth == "Bearer " + TOKEN,
        }
        body = json.dumps(echo).encode()
        headers = [("Content-Type", "application/json"), ("X-Echo-Authorization", auth),
                   ("Set-Cookie", "seen=" + base64.b64encode(auth.encode()).decode())]
        mode = query.get("mode", "plain")
        if mode in ("gzip", "gzip-chunked"):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        elif mode == "deflate":
            body = zlib.compress(body)
            headers.append(("Content-Encoding", "deflate"))
        elif mode == "br":
            # A coding the proxy cannot scan, naming the secret too (an error detail quoting
            # it must not carry it back).
            headers.append(("Content-Encoding", "br, " + auth))
        chunks = 5 if mode in ("chunked", "gzip-chunked") else None
        self.send(200, body, headers, chunks)


def serve(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def sni(sock, name, _ctx):
        sock.server_hostname = name

    ctx.sni_callback = sni
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


certificates()
good = serve(os.path.join(DIR, "good.pem"), os.path.join(DIR, "good.key"))
wrong = serve(os.path.join(DIR, "wrong.pem"), os.path.join(DIR, "wrong.key"))
print(good, flush=True)
print(wrong, flush=True)
print(os.path.join(DIR, "ca.pem"), flush=True)
sys.stdin.read()
