"""A minimal OpenTelemetry trace collector for bench/vllm_cpu.sh: receives OTLP/HTTP
(protobuf) exports on 127.0.0.1 and writes one JSON line per span.

    python otlp_collector.py --port 4318 --out spans.jsonl

Runs in the vLLM virtual environment (its opentelemetry-proto decodes the exports). vLLM
started with `--otlp-traces-endpoint http://127.0.0.1:PORT/v1/traces` and
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf sends one `llm_request` span per finished
request: start = the request's arrival at vLLM's engine front-end (wall clock, ns), and the
latencies vLLM measured itself (gen_ai.latency.*: time to first token, end to end, time in
queue, in prefill, in decode; seconds) with the prompt and completion token counts. Each line:
{"name", "start_ns", "end_ns", "attributes": {...}}. /health answers "ok" (for start_server).
"""
import argparse
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_BODY = 64 << 20


def value(v):
    kind = v.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=4318)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    lock = threading.Lock()
    with open(a.out, "a", buffering=1) as out:
        serve(a.port, out, lock)


def serve(port, out, lock):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = b"ok" if self.path == "/health" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            if self.path != "/v1/traces" or not 0 < n <= MAX_BODY:
                self.send_response(400)
                self.end_headers()
                return
            body = self.rfile.read(n)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            lines = []
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        lines.append(json.dumps({"name": s.name, "start_ns": s.start_time_unix_nano,
                                                 "end_ns": s.end_time_unix_nano,
                                                 "attributes": {kv.key: value(kv.value) for kv in s.attributes}}))
            with lock:
                for line in lines:
                    out.write(line + "\n")
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
