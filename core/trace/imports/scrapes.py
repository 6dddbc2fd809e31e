"""A server's /metrics pages recorded over time ({"t_ns", "text"} per line: `gpu_runner observe`'s
and bench/vllm_cpu/record_telemetry.py's raw scrapes) as `gauge` events (core.trace.gauges), and
the gauge-only trace every scrape reader builds."""
from __future__ import annotations

from core.errors import TraceError, short
from core.trace.gauges import gauge_from_text
from core.trace.imports.imported import Imported
from core.trace.model import Trace, frame
from core.trace.schema import REQUEST


def looks_like_scrape(doc) -> bool:
    """A scrape line: its body, or the error the recorder met (the server not up yet)."""
    return isinstance(doc, dict) and "t_ns" in doc and (isinstance(doc.get("text"), str)
                                                         or isinstance(doc.get("error"), str))


def gauge_trace(events: list[dict], t0_s: float, label: str, notes: list[str], how: str) -> Trace:
    meta = {"source": "imported", "label": label, "created": "unknown", "device": "not recorded",
            "notes": " ".join(notes), "clock": {"kind": "epoch", "t0_s": t0_s, "resolution_ms": 1e-6, "how": how},
            "provenance": {"gauges": "server: its own /metrics (Prometheus text), sampled by the recorder"}}
    return Trace(meta=meta, requests=frame(REQUEST, {f.name: [] for f in REQUEST.columns}), other=events)


def import_scrapes(lines: list[dict], name: str) -> Imported:
    ts = []
    for k, ln in enumerate(lines):
        t = ln.get("t_ns") if isinstance(ln, dict) else None
        if not (isinstance(t, int) and 0 < t < 1 << 63):
            raise TraceError(f"{name}: line {k + 1}: t_ns: expected epoch nanoseconds, got {short(t)}")
        ts.append(t)
    pages = [(t, ln["text"]) for t, ln in zip(ts, lines) if isinstance(ln.get("text"), str)]
    if not pages:
        raise TraceError(f"{name}: none of its {len(lines):,} scrapes got a page (each line records the error "
                         f"met, e.g. {short(lines[0].get('error'), 80)}): was the server up?")
    t0 = min(t for t, _ in pages)
    events = [g for t, text in pages if (g := gauge_from_text((t - t0) / 1e6, text)) is not None]
    notes = [f"{len(pages)} /metrics pages -> {len(events)} gauge events (requests running / waiting, KV-cache "
             "usage, preemptions, prefix-cache counters); no requests."]
    if len(pages) < len(lines):
        notes.append(f"{len(lines) - len(pages):,} scrape(s) got no page (the recorder wrote the error met: the "
                     "server not up yet, or gone): left out.")
    tr = gauge_trace(events, t0 / 1e9, f"{name} (/metrics scrapes)", notes, "the first answered scrape's t_ns")
    counts = {"scrapes": len(pages), "failed_scrapes": len(lines) - len(pages), "gauge_events": len(events)}
    return Imported(tr, "metrics", counts, notes=notes,
                    tool="Prometheus /metrics", what="recorded scrapes", origin=tr.meta["provenance"])
