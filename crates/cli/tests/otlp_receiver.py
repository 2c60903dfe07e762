"""A real OTLP/HTTP receiver for crates/cli/tests/it/telemetry.rs: decodes each
ExportTraceServiceRequest POSTed (protobuf) on /v1/traces with OpenTelemetry's own classes
(the opentelemetry-proto package) and writes every span as one JSON line to OUT: its trace,
span and parent ids in hex, name, kind, times, status and attributes, with the resource's.

    otlp_receiver.py OUT      prints "listening on PORT" once it listens on 127.0.0.1
"""

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]
lock = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = []
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(
                        json.dumps(
                            {
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "name": s.name,
                                "kind": s.kind,
                                "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                                "status": s.status.code,
                                "attributes": attributes(s.attributes),
                                "resource": resource,
                                "scope": ss.scope.name,
                            }
                        )
                    )
        with lock, open(OUT, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening on {server.server_address[1]}", flush=True)
server.serve_forever()
