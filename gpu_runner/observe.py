"""Record what a running server emits, without sending it load: its KV-cache events (a ZMQ SUB
socket connected to vLLM's publisher), its OpenTelemetry request spans (an OTLP/HTTP receiver
on 127.0.0.1 for /v1/traces, protobuf or JSON bodies, gzip or not) and its /metrics (sampled
into gauge events), all on one epoch clock, into one trace (core.trace.imports.telemetry).

    python -m gpu_runner observe --kv-events tcp://127.0.0.1:5557 --otlp-port 4318 \\
        --metrics http://127.0.0.1:8000/metrics --out observed.json.gz --duration 60

The trace is written atomically, rewritten every --flush-interval seconds while it runs, and
complete on Ctrl-C, SIGTERM or after --duration. Endpoints that never answer leave a valid
trace with nothing in it, and the summary line says which source sent nothing. `loadgen` takes
the same flags (Telemetry) and records both sides into one trace.
"""
from __future__ import annotations

import asyncio
import signal
import sys
import time
import zlib

from core.errors import InputError

MAX_OTLP_BODY = 32 << 20        # one export request; larger: 413
MAX_METRICS_PAGE = 16 << 20     # one /metrics page; the rest is not read
MAX_SPANS = 2_000_000


class Telemetry:
    """Receivers for a server's KV events, spans and /metrics, run in the caller's event loop
    until `stop` is set. Counts of what arrived (and of what was refused) are kept for the
    summary."""

    def __init__(self, kv_events: str | None = None, kv_topic: str = "", otlp_port: int | None = None,
                 metrics_url: str | None = None, metrics_interval: float = 0.5, otlp_host: str = "127.0.0.1"):
        self.kv_endpoint, self.kv_topic = kv_events, kv_topic
        self.otlp_port, self.otlp_host = otlp_port, otlp_host
        self.metrics_url, self.metrics_interval = metrics_url, metrics_interval
        self.kv_rows: list[tuple] = []
        self.spans: list[dict] = []
        self.gauges: list[dict] = []
        self.counts = {"kv_messages": 0, "kv_bad": 0, "kv_seq_gaps": 0, "otlp_exports": 0, "otlp_bad": 0,
                       "metrics_pages": 0, "metrics_failed": 0}
        self.problems: list[str] = []
        self._last_seq = None
        self._server = None

    def any_source(self) -> bool:
        return bool(self.kv_endpoint or self.otlp_port or self.metrics_url)

    async def run(self, stop: asyncio.Event):
        tasks = []
        if self.kv_endpoint:
            tasks.append(asyncio.create_task(self._kv(stop)))
        if self.metrics_url:
            tasks.append(asyncio.create_task(self._metrics(stop)))
        if self.otlp_port:
            tasks.append(asyncio.create_task(self._otlp(stop)))
        await asyncio.gather(*tasks)

    # ---- KV events -----------------------------------------------------------------------
    async def _kv(self, stop: asyncio.Event):
        import zmq
        import zmq.asyncio

        from core.errors import TraceError
        from core.trace.imports.kv_events import decode_message
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.kv_topic.encode())
        sock.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
        try:
            sock.connect(self.kv_endpoint)
        except zmq.ZMQError as e:
            self.problems.append(f"--kv-events {self.kv_endpoint}: {e}")
            ctx.term()
            return
        try:
            while not stop.is_set():
                if not await sock.poll(200):
                    continue
                frames = await sock.recv_multipart()
                self.counts["kv_messages"] += 1
                try:
                    decode_message(frames, f"KV event message {self.counts['kv_messages']}", self.kv_rows)
                except TraceError as e:
                    self.counts["kv_bad"] += 1
                    if self.counts["kv_bad"] <= 3:
                        self.problems.append(str(e))
                    continue
                seq = int.from_bytes(frames[-2], "big")
                if self._last_seq is not None and seq != self._last_seq + 1:
                    self.counts["kv_seq_gaps"] += 1
                self._last_seq = seq
        finally:
            sock.close(0)
            ctx.term()

    # ---- /metrics -------------------------------------------------------------------------
    async def _metrics(self, stop: asyncio.Event):
        import httpx

        from core.trace.gauges import gauge_from_text
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=2.0)) as client:
            while not stop.is_set():
                t_ns = time.time_ns()
                try:
                    async with client.stream("GET", self.metrics_url) as r:
                        body = bytearray()
                        async for chunk in r.aiter_bytes():
                            body += chunk
                            if len(body) > MAX_METRICS_PAGE:
                                break
                    text = bytes(body[:MAX_METRICS_PAGE]).decode("utf-8", "replace")
                    g = await asyncio.to_thread(gauge_from_text, 0.0, text)   # parsing off the event loop
                    self.counts["metrics_pages"] += 1
                    if g is not None:
                        g.pop("t_ms")
                        self.gauges.append({"t_ns": t_ns, **g})
                except (httpx.HTTPError, OSError):
                    self.counts["metrics_failed"] += 1
                try:
                    await asyncio.wait_for(stop.wait(), self.metrics_interval)
                except TimeoutError:
                    pass

    # ---- OTLP/HTTP receiver ---------------------------------------------------------------
    def app(self):
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        from core.errors import TraceError
        from core.trace.imports.otlp import otlp_json, spans_of

        async def traces(request: Request):
            ctype = request.headers.get("content-type", "application/x-protobuf")
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_OTLP_BODY:
                    return JSONResponse({"error": f"export body over {MAX_OTLP_BODY >> 20} MiB"}, status_code=413)
            data = bytes(body)
            try:
                if request.headers.get("content-encoding", "").lower() == "gzip":
                    data = _gunzip(data)
                doc = otlp_json(data, ctype)
            except (TraceError, ValueError, OSError, zlib.error) as e:
                self.counts["otlp_bad"] += 1
                return JSONResponse({"error": f"not an OTLP trace export: {e}"}, status_code=400)
            self.counts["otlp_exports"] += 1
            if len(self.spans) < MAX_SPANS:
                self.spans.extend(spans_of(doc))
            if "json" in ctype:
                return JSONResponse({})
            return Response(b"", media_type="application/x-protobuf")   # an empty ExportTraceServiceResponse

        async def health(_):
            return JSONResponse({"status": "ok"})
        return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"]), Route("/health", health)])

    async def _otlp(self, stop: asyncio.Event):
        import uvicorn
        cfg = uvicorn.Config(self.app(), host=self.otlp_host, port=self.otlp_port, log_level="warning",
                             lifespan="off")
        server = uvicorn.Server(cfg)
        server.install_signal_handlers = lambda: None     # the observer owns SIGINT / SIGTERM
        self._server = server
        serving = asyncio.create_task(server.serve())
        await stop.wait()
        server.should_exit = True
        await serving
        if not server.started:
            self.problems.append(f"--otlp-port {self.otlp_port}: could not listen on {self.otlp_host}")

    # ---- the trace ------------------------------------------------------------------------
    def summary(self) -> str:
        parts = []
        if self.kv_endpoint:
            parts.append(f"{self.counts['kv_messages']} KV event batches ({len(self.kv_rows)} rows) from "
                         f"{self.kv_endpoint}" + ("" if self.counts["kv_messages"] else " (nothing received)"))
        if self.otlp_port:
            n = sum(1 for s in self.spans if s.get("name") == "llm_request")
            parts.append(f"{self.counts['otlp_exports']} OTLP exports ({n} request spans) on port {self.otlp_port}"
                         + ("" if self.counts["otlp_exports"] else " (nothing received)"))
        if self.metrics_url:
            parts.append(f"{self.counts['metrics_pages']} /metrics pages from {self.metrics_url}"
                         + (f" ({self.counts['metrics_failed']} failed)" if self.counts["metrics_failed"] else ""))
        return "; ".join(parts)

    def trace(self, t0_ns: int, label: str):
        from core.engine.core import now_iso
        from core.trace.imports.telemetry import telemetry_trace
        notes = [f"observed by gpu_runner observe: {self.summary()}."]
        if self.counts["kv_seq_gaps"]:
            notes.append(f"{self.counts['kv_seq_gaps']} gap(s) in the KV event batch numbers (missed batches).")
        notes += self.problems[:5]
        meta = {"source": "measured", "label": label, "created": now_iso(),
                "device": "the observed server (its own times)", "engine": {"name": "observed server"}}
        spans, rows, gauges = list(self.spans), list(self.kv_rows), list(self.gauges)
        # the clock starts at the observer's start, or earlier when the server sent older times
        # (a span that began before we listened, a replayed capture)
        starts = [t0_ns] + [int(s["start_ns"]) for s in spans if s.get("name") == "llm_request"
                            and str(s.get("start_ns", "")).isdigit()] + [int(r[0] * 1e9) for r in rows[:1]] \
            + [g["t_ns"] for g in gauges[:1]]
        return telemetry_trace(min(starts), spans, rows, gauges, meta, notes)


def _gunzip(data: bytes) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, MAX_OTLP_BODY + 1)
    if len(out) > MAX_OTLP_BODY or d.unconsumed_tail:
        raise ValueError(f"gzip body inflates past {MAX_OTLP_BODY >> 20} MiB")
    return out


def add_telemetry_flags(p, metrics_default: bool = True):
    p.add_argument("--kv-events", metavar="tcp://HOST:PORT",
                   help="subscribe to a vLLM KV-event publisher (--kv-events-config endpoint tcp://*:PORT)")
    p.add_argument("--kv-topic", default="", help="topic prefix to subscribe to (default: all)")
    p.add_argument("--otlp-port", type=int, help="receive OpenTelemetry spans (OTLP/HTTP, /v1/traces) on "
                   "127.0.0.1:PORT (vLLM: --otlp-traces-endpoint http://127.0.0.1:PORT/v1/traces)")
    if metrics_default:
        p.add_argument("--metrics", metavar="URL", help="sample this /metrics page into gauge events")
        p.add_argument("--metrics-interval", type=float, default=0.5, help="seconds between /metrics samples")


def check_flags(a):
    if a.kv_events and not a.kv_events.startswith(("tcp://", "ipc://", "inproc://")):
        raise InputError(f"--kv-events: expected a ZMQ endpoint such as tcp://127.0.0.1:5557, got {a.kv_events!r}")
    if a.otlp_port is not None and not 0 < a.otlp_port < 65536:
        raise InputError(f"--otlp-port: expected a port in 1..65535, got {a.otlp_port}")
    if getattr(a, "metrics_interval", 1.0) is not None and not a.metrics_interval > 0:
        raise InputError(f"--metrics-interval: expected seconds > 0, got {a.metrics_interval}")


def main_observe(a) -> int:
    from core.cli import check_writable, write_output
    from core.trace import save_trace
    check_flags(a)
    if a.duration is not None and not a.duration > 0:
        raise InputError(f"--duration: expected seconds > 0, got {a.duration}")
    if not a.flush_interval > 0:
        raise InputError(f"--flush-interval: expected seconds > 0, got {a.flush_interval}")
    tel = Telemetry(a.kv_events, a.kv_topic, a.otlp_port, a.metrics, a.metrics_interval)
    if not tel.any_source():
        raise InputError("observe: give at least one of --kv-events, --otlp-port, --metrics")
    check_writable(a.out, "--out")
    t0_ns = time.time_ns()
    label = f"observed {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0_ns / 1e9))} UTC"

    def write():
        tr = tel.trace(t0_ns, label)
        write_output(a.out, lambda p: save_trace(tr, p), "--out")
        return tr

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        recv = asyncio.create_task(tel.run(stop))
        t_end = None if a.duration is None else time.monotonic() + a.duration
        while not stop.is_set():
            wait = a.flush_interval if t_end is None else min(a.flush_interval, max(t_end - time.monotonic(), 0))
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except TimeoutError:
                pass
            if t_end is not None and time.monotonic() >= t_end:
                stop.set()
            if not stop.is_set():
                await asyncio.to_thread(write)      # the trace so far, replaced whole
        await recv
    print(f"observing ({tel.summary() or 'nothing'}); writing {a.out}" +
          (f" for {a.duration:g} s" if a.duration else "; Ctrl-C to stop"), file=sys.stderr)
    asyncio.run(main())
    tr = write()
    empty = not (len(tr.requests) or len(tr.kv_events) or tr.other)
    print(f"wrote {a.out}: {len(tr.requests)} request spans, {len(tr.kv_events)} KV event rows, {len(tr.other)} "
          f"gauge samples; {tel.summary()}" + (" — nothing was received: the trace is empty" if empty else ""))
    for p in tel.problems[:5]:
        print(f"note: {p}", file=sys.stderr)
    return 0
