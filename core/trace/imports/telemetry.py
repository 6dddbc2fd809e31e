"""One trace of what a server emitted while it was observed (gpu_runner observe, loadgen's
engine-side flags): its request spans, its KV-cache events and its /metrics samples, on one
clock (epoch nanoseconds from t0_ns)."""
from __future__ import annotations

from core.trace.imports import otlp
from core.trace.imports.kv_events import kv_event_frame
from core.trace.imports.rows import RequestRows
from core.trace.model import Trace, frame
from core.trace.schema import REQUEST

PROVENANCE = {**otlp.PROVENANCE,
              "kv_events": "engine: its KV-cache events (ZMQ), received as published",
              "gauges": "server: its own /metrics, sampled by the observer"}


def telemetry_trace(t0_ns: int, spans: list[dict], kv_rows: list[tuple], gauges: list[dict], meta: dict,
                    notes: list[str]) -> Trace:
    """spans: OTLP span dicts (otlp.spans_of); kv_rows: kv_events.decode_payload rows (epoch s);
    gauges: gauge events with t_ns instead of t_ms. Times before t0_ns are left out."""
    reqs, other = otlp.request_spans(spans, "spans")
    reqs = [sp for sp in reqs if int(sp["start_ns"]) >= t0_ns]
    rows = RequestRows("observed")
    phases = otlp.add_span_requests(rows, reqs, t0_ns, "spans") if reqs else {}
    if reqs:
        notes = notes + otlp.span_notes(len(reqs), other, "OTLP/HTTP, received live")
    meta = {**meta, "clock": {"kind": "epoch", "t0_s": t0_ns / 1e9, "resolution_ms": 1e-6,
                              "how": "the observer's start (time.time_ns()); spans, KV events and samples carry "
                                     "epoch times of the same host"},
            "provenance": PROVENANCE, "notes": " ".join(notes)}
    if reqs:
        tr = rows.trace(meta)
        for k, rid in enumerate(tr.ids):
            tr.request_extra[k].update(phases.get(rid, {}))
    else:
        tr = Trace(meta=meta, requests=frame(REQUEST, {f.name: [] for f in REQUEST.columns}))
    kv = [r for r in kv_rows if r[0] * 1e9 >= t0_ns]
    tr.kv_events = kv_event_frame(kv, t0_ns / 1e9)
    tr.other = [{**{k: v for k, v in g.items() if k != "t_ns"}, "t_ms": (g["t_ns"] - t0_ns) / 1e6}
                for g in gauges if g["t_ns"] >= t0_ns]
    return tr
