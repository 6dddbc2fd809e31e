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

What is held can always be written: each export is checked whole when it arrives and refused
whole (4xx, one line naming the span and field) unless every request span in it reads as the
trace will read it (otlp.add_span_requests): epoch times within PAST_S before the observer
started and AHEAD_S after the export arrived, token counts in range, time_to_first_token <=
e2e; a KV event batch with such a time is dropped and noted. Caps are checked before anything
is held: an export's values are counted on the wire before it is decoded (a gzip body of
millions of empty spans is refused holding nothing), its spans before they join the others.
A body must arrive within BODY_TIMEOUT_S, and on the stop signal open requests get
SHUTDOWN_GRACE_S before they are cut, so the last trace is always written.
"""
from __future__ import annotations

import asyncio
import functools
import math
import signal
import sys
import time
import zlib

from core.errors import InputError, TraceError, short
from core.trace.imports.otlp import LATENCY, PHASES, REQUEST_SPAN
from core.trace.imports.rows import MAX_IMPORT_TOKENS, count, finite
from core.workload import MAX_TIME_MS

MAX_OTLP_BODY = 32 << 20        # one export request, as sent and as inflated; larger: 413
MAX_OTLP_VALUES = 1_000_000     # values in one export (protobuf fields, JSON values), counted before decoding: 413
MAX_SPANS = 2_000_000           # spans held (an export that would pass it: 413)
MAX_KV_ROWS = 50_000_000        # KV event rows held (a batch that would pass it is dropped)
MAX_METRICS_PAGE = 16 << 20     # one /metrics page; the rest is not read
MAX_CONNECTIONS = 16            # open connections to the OTLP receiver; more get 503
BODY_TIMEOUT_S = 30.0           # an export's whole body must arrive within this (then 408)
SHUTDOWN_GRACE_S = 3.0          # on the stop signal, open requests get this long, then the trace is written
# Times must fit one trace clock (at most MAX_TIME_MS from its origin, the earliest time held):
# a recorded time may lie PAST_S before the observer started (a span that began before it
# listened, a replayed capture) and AHEAD_S after it arrived (two hosts' clocks); 10 years + a
# day + the observer's own run stays far below MAX_TIME_MS (31.7 years).
PAST_S = 10 * 365.25 * 86400.0
AHEAD_S = 86400.0
MAX_SECONDS = MAX_TIME_MS / 1000.0     # a latency attribute, seconds
TTFT, E2E = LATENCY + "time_to_first_token", LATENCY + "e2e"
PROMPT, COMPLETION, REQUEST_ID = "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "gen_ai.request.id"
_OTHER = {"name": None}          # a span that is not a request span: only counted (one shared dict)


class Refused(Exception):
    """An export refused whole: the HTTP status and one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Telemetry:
    """Receivers for a server's KV events, spans and /metrics, run in the caller's event loop
    until `stop` is set. Counts of what arrived (and of what was refused) are kept for the
    summary."""

    def __init__(self, kv_events: str | None = None, kv_topic: str = "", otlp_port: int | None = None,
                 metrics_url: str | None = None, metrics_interval: float = 0.5, otlp_host: str = "127.0.0.1",
                 kv_bind: bool = False):
        self.kv_endpoint, self.kv_topic, self.kv_bind = kv_events, kv_topic, kv_bind
        self.otlp_port, self.otlp_host = otlp_port, otlp_host
        self.metrics_url, self.metrics_interval = metrics_url, metrics_interval
        self.kv_rows: list[tuple] = []
        self.spans: list[dict] = []
        self.gauges: list[dict] = []
        self.counts = {"kv_messages": 0, "kv_bad": 0, "kv_seq_gaps": 0, "otlp_exports": 0, "otlp_bad": 0,
                       "metrics_pages": 0, "metrics_failed": 0}
        self.problems: list[str] = []
        self.started_ns = time.time_ns()
        self.tokens_held = 0             # completion tokens of the request spans held (the trace interpolates them)
        self._ids: set[str] = set()      # request ids held (each unique: the trace's request ids)
        self._decoding = asyncio.Lock()  # one export decoded at a time: memory is one export's worth
        self._last_seq = None
        self._server = None

    def window(self) -> tuple[int, int]:
        """The epoch ns a time received now may lie between (PAST_S, AHEAD_S)."""
        return int(self.started_ns - PAST_S * 1e9), int(time.time_ns() + AHEAD_S * 1e9)

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
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.kv_topic.encode())
        sock.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
        try:
            (sock.bind if self.kv_bind else sock.connect)(self.kv_endpoint)
        except zmq.ZMQError as e:
            self.problems.append(f"--kv-events {self.kv_endpoint}: {e}")
            ctx.term()
            return
        try:
            while not stop.is_set():
                if not await sock.poll(200):
                    continue
                self.take_kv_message(await sock.recv_multipart())
        finally:
            sock.close(0)
            ctx.term()

    def take_kv_message(self, frames: list[bytes]):
        """One KV event batch [topic, seq, payload]: its rows held, or the batch dropped whole and
        counted (kv_bad, the first reasons noted) when it does not decode, its ts is not a time
        on the observer's clock (window), or its rows would pass MAX_KV_ROWS."""
        from core.trace.imports.kv_events import decode_message
        self.counts["kv_messages"] += 1
        where = f"KV event message {self.counts['kv_messages']}"
        rows: list[tuple] = []
        try:
            ts = decode_message(frames, where, rows)
            lo, hi = self.window()
            if rows and not lo <= ts * 1e9 <= hi:
                raise TraceError(f"{where}: ts: expected seconds since the epoch from {PAST_S / 86400 / 365.25:g} "
                                 f"years before the observer started to a day after now, got {short(ts)}")
            if len(self.kv_rows) + len(rows) > MAX_KV_ROWS:
                raise TraceError(f"{where}: its {len(rows):,} rows would pass the {MAX_KV_ROWS:,} KV event rows "
                                 "held; dropped")
        except (TraceError, TypeError, ValueError, OverflowError, RecursionError) as e:
            # (a batch that breaks the decoder in a way it did not foresee is dropped like a malformed one:
            # one publisher's message must never end the observer and lose what it holds)
            self.counts["kv_bad"] += 1
            if self.counts["kv_bad"] <= 3:
                self.problems.append(str(e) if isinstance(e, TraceError) else f"{where}: {type(e).__name__}: {e}")
            return
        self.kv_rows.extend(rows)
        seq = int.from_bytes(frames[-2], "big")
        if self._last_seq is not None and seq != self._last_seq + 1:
            self.counts["kv_seq_gaps"] += 1
        self._last_seq = seq

    # ---- /metrics -------------------------------------------------------------------------
    async def _metrics(self, stop: asyncio.Event):
        import httpx
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
                    await asyncio.to_thread(self.take_metrics_page, t_ns, text)   # parsing off the event loop
                except (httpx.HTTPError, OSError):
                    self.counts["metrics_failed"] += 1
                try:
                    await asyncio.wait_for(stop.wait(), self.metrics_interval)
                except TimeoutError:
                    pass

    def take_metrics_page(self, t_ns: int, text: str):
        """One /metrics page as a gauge sample at t_ns; values that are not finite are left out
        (a sum over label sets can overflow to inf, which no trace can hold)."""
        from core.trace.gauges import gauge_from_text
        g = gauge_from_text(0.0, text)
        self.counts["metrics_pages"] += 1
        values = {k: v for k, v in (g or {}).items() if k not in ("t_ms", "type") and math.isfinite(v)}
        if values:
            self.gauges.append({"t_ns": t_ns, "type": "gauge", **values})

    # ---- OTLP/HTTP receiver ---------------------------------------------------------------
    def app(self):
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        async def traces(request: Request):
            ctype = request.headers.get("content-type", "application/x-protobuf")
            gzipped = request.headers.get("content-encoding", "").lower() == "gzip"
            try:
                data = await _read_body(request)
                async with self._decoding:
                    reqs, other = await asyncio.to_thread(export_spans, data, gzipped, ctype, *self.window())
                self.admit(reqs, other)
            except Refused as e:
                self.counts["otlp_bad"] += 1
                return JSONResponse({"error": str(e)}, status_code=e.status)
            self.counts["otlp_exports"] += 1
            if "json" in ctype:
                return JSONResponse({})
            return Response(b"", media_type="application/x-protobuf")   # an empty ExportTraceServiceResponse

        async def health(_):
            return JSONResponse({"status": "ok"})
        return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"]), Route("/health", health)])

    def admit(self, reqs: list[dict], other: int):
        """Hold one export's checked spans (export_spans), or refuse it whole (413) when it would
        pass MAX_SPANS or the completion tokens a trace holds; each request id is made unique
        among those held (id#1, id#2, ...)."""
        n = len(reqs) + other
        if len(self.spans) + n > MAX_SPANS:
            raise Refused(413, f"export refused: its {n:,} spans would pass the {MAX_SPANS:,} spans the observer "
                               f"holds ({len(self.spans):,} held)")
        tokens = sum(sp["attributes"][COMPLETION] for sp in reqs)
        if self.tokens_held + tokens > MAX_IMPORT_TOKENS:
            raise Refused(413, f"export refused: its spans' {COMPLETION} ({tokens:,}) would pass the "
                               f"{MAX_IMPORT_TOKENS:,} output tokens a trace holds ({self.tokens_held:,} held)")
        for sp in reqs:
            a = sp["attributes"]
            rid = a[REQUEST_ID] or f"span{len(self.spans)}"
            if rid in self._ids:
                k = 1
                while f"{rid}#{k}" in self._ids:
                    k += 1
                rid = f"{rid}#{k}"
            a[REQUEST_ID] = rid
            self._ids.add(rid)
            self.spans.append(sp)
        self.spans.extend([_OTHER] * other)
        self.tokens_held += tokens

    async def _otlp(self, stop: asyncio.Event):
        import uvicorn
        cfg = uvicorn.Config(self.app(), host=self.otlp_host, port=self.otlp_port, log_level="warning",
                             lifespan="off", timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                             limit_concurrency=MAX_CONNECTIONS)
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
                         f"{self.kv_endpoint}" + ("" if self.counts["kv_messages"] else f" (nothing received"
                                                  f"{kv_hint(self.kv_endpoint, self.kv_bind)})"))
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


async def _read_body(request) -> bytes:
    """The request's body, at most MAX_OTLP_BODY bytes, whole within BODY_TIMEOUT_S."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_OTLP_BODY:
        raise Refused(413, f"export body of {int(size):,} bytes is over {MAX_OTLP_BODY >> 20} MiB")
    body = bytearray()

    async def read():
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > MAX_OTLP_BODY:
                raise Refused(413, f"export body over {MAX_OTLP_BODY >> 20} MiB")
    try:      # a body that never arrives whole must not hold a connection (nor the shutdown)
        await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except TimeoutError:
        raise Refused(408, f"the export body did not arrive within {BODY_TIMEOUT_S:g} s") from None
    return bytes(body)


def _gunzip(data: bytes) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, MAX_OTLP_BODY + 1)
    if len(out) > MAX_OTLP_BODY or d.unconsumed_tail:
        raise ValueError(f"gzip body inflates past {MAX_OTLP_BODY >> 20} MiB")
    return out


def export_spans(data: bytes, gzipped: bool, content_type: str, lo_ns: int, hi_ns: int) -> tuple[list[dict], int]:
    """One OTLP/HTTP export body -> (its request spans, checked: request_span; how many other
    spans), or Refused naming what is wrong. Its values are counted before it is decoded."""
    from core.trace.imports.otlp import otlp_json, spans_of
    try:
        if gzipped:
            data = _gunzip(data)
        n = export_values(data, content_type, MAX_OTLP_VALUES)
        if n > MAX_OTLP_VALUES:
            raise Refused(413, f"export refused: more than {MAX_OTLP_VALUES:,} values in one export (split it)")
        doc = otlp_json(data, content_type)
    except (TraceError, ValueError, OSError, zlib.error) as e:
        raise Refused(400, f"not an OTLP trace export: {e}") from None
    reqs, other = [], 0
    for k, sp in enumerate(spans_of(doc)):
        if sp.get("name") != REQUEST_SPAN:
            other += 1
            continue
        try:
            reqs.append(request_span(sp, f"span {k}", lo_ns, hi_ns))
        except TraceError as e:
            raise Refused(400, f"export refused (nothing of it kept): {e}") from None
    return reqs, other


def _epoch_ns(v, where: str, key: str, lo_ns: int, hi_ns: int) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = None
    if n is None or not lo_ns <= n <= hi_ns:
        raise TraceError(f"{where}: {key}: expected nanoseconds since the epoch from {PAST_S / 86400 / 365.25:g} "
                         f"years before the observer started to a day after the export arrived, got {short(v)}")
    return n


def request_span(sp: dict, where: str, lo_ns: int, hi_ns: int) -> dict:
    """One llm_request span (otlp.spans_of) checked as otlp.add_span_requests will read it, or
    TraceError naming the field: start and end on the epoch clock within [lo_ns, hi_ns] and end
    >= start; prompt and completion tokens in 0..MAX_TOKENS; latencies in 0..MAX_SECONDS seconds,
    time_to_first_token <= e2e (or the span's duration) and start + e2e <= hi_ns; the request id
    valid text. Returns what the trace reads of it (times as integers), so building the trace
    from it cannot fail."""
    a = sp.get("attributes") or {}
    start = _epoch_ns(sp.get("start_ns"), where, "startTimeUnixNano", lo_ns, hi_ns)
    end = _epoch_ns(sp.get("end_ns"), where, "endTimeUnixNano", start, hi_ns)
    kept = {key: count(a.get(key, 0), where, key) for key in (PROMPT, COMPLETION)}
    for key in (LATENCY + k for k in ("time_to_first_token", "e2e", *PHASES.values())):
        v = a.get(key)
        if v is None:
            continue
        if not (finite(v) and 0 <= v <= MAX_SECONDS):
            raise TraceError(f"{where}: {key}: expected seconds in 0..{MAX_SECONDS:g}, got {short(v)}")
        kept[key] = float(v)
    e2e = kept.get(E2E, (end - start) / 1e9)
    if kept[COMPLETION] and TTFT in kept and kept[TTFT] > e2e:
        raise TraceError(f"{where}: expected {TTFT} <= {E2E} (or the span's duration), got {kept[TTFT]!r} and {e2e!r}")
    if start + e2e * 1e9 > hi_ns:
        raise TraceError(f"{where}: {E2E}: {e2e:g} s from the span's start ends more than a day after the export "
                         "arrived")
    rid = a.get(REQUEST_ID) or sp.get("span_id")
    rid = "" if rid is None else str(rid)
    try:
        rid.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TraceError(f"{where}: {REQUEST_ID}: not valid Unicode text (a lone surrogate at character "
                         f"{e.start})") from None
    kept[REQUEST_ID] = rid
    return {"name": REQUEST_SPAN, "start_ns": start, "end_ns": end, "span_id": None, "attributes": kept}


def export_values(data: bytes, content_type: str, limit: int) -> int:
    """How many values one export body holds at most, counted without decoding it (more than
    `limit`: some number past it). JSON: its commas and opening brackets (every value after the
    first follows a comma, every container opens with a bracket); protobuf: the fields on the
    wire, submessages' included (protobuf_fields)."""
    if "json" in content_type:
        return data.count(b",") + data.count(b"{") + data.count(b"[") + 1
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    return protobuf_fields(data, ExportTraceServiceRequest.DESCRIPTOR, limit)


@functools.cache
def _submessages(desc) -> dict:
    """{field number: message type} of a protobuf message type's message-valued fields."""
    return {f.number: f.message_type for f in desc.fields if f.message_type is not None}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while pos < len(data) and shift < 70:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return n, pos
    return -1, len(data)       # cut short: the parser says what is wrong


def protobuf_fields(data: bytes, desc, limit: int, max_depth: int = 100) -> int:
    """The fields on the wire of `data`, a protobuf message of type `desc` (a descriptor), its
    submessages' fields included (which fields hold messages is read from the descriptors),
    counted without decoding anything, depth first (memory: one entry per level); counting
    stops past `limit`. Malformed data is counted as far as it reads (the parser refuses it)."""
    n, parents = 0, []                 # parents: where each enclosing message resumes
    pos, end, subs = 0, len(data), _submessages(desc)
    while True:
        if pos >= end:
            if not parents:
                return n
            pos, end, subs = parents.pop()
            continue
        tag, pos = _varint(data, pos)
        n += 1
        if n > limit or tag < 0:
            return n
        wire = tag & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            size, pos = _varint(data, pos)
            if size < 0 or pos + size > end:
                return n
            sub = subs.get(tag >> 3)
            if sub is not None and len(parents) < max_depth:
                parents.append((pos + size, end, subs))
                end, subs = pos + size, _submessages(sub)
            else:
                pos += size
        else:
            return n           # groups (not in OTLP) or garbage: left to the parser


def kv_hint(endpoint: str, bound: bool) -> str:
    """Why a KV-event subscription may hear nothing: vLLM's publisher binds only `*`, ipc:// and
    inproc:// endpoints and CONNECTS to a host address, so a server given tcp://127.0.0.1:PORT and a
    subscriber connecting to the same address never meet."""
    if bound or not endpoint.startswith("tcp://") or "*" in endpoint:
        return ""
    return (": a vLLM given this host address connects to it rather than binding it, so both sides connected; "
            "give --kv-bind, or have vLLM publish on ipc:///PATH or tcp://*:PORT (vllm/distributed/kv_events.py)")


def add_telemetry_flags(p, metrics_default: bool = True):
    p.add_argument("--kv-events", metavar="tcp://HOST:PORT",
                   help="subscribe to a vLLM KV-event publisher (its --kv-events-config endpoint: ipc:///PATH or "
                        "tcp://*:PORT, which vLLM binds; for tcp://127.0.0.1:PORT, which vLLM connects to, add "
                        "--kv-bind)")
    p.add_argument("--kv-bind", action="store_true",
                   help="bind the --kv-events endpoint instead of connecting to it (a vLLM given a host address "
                        "such as tcp://127.0.0.1:PORT connects to it)")
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
    tel = Telemetry(a.kv_events, a.kv_topic, a.otlp_port, a.metrics, a.metrics_interval, kv_bind=a.kv_bind)
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
                try:
                    await asyncio.to_thread(write)      # the trace so far, replaced whole
                except InputError as e:   # (a full disk): the last file stays; tried again at the next flush
                    print(f"note: {e}", file=sys.stderr)
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
