"""Exports: Chrome Trace Event JSON (opens in Perfetto / chrome://tracing) and CSV.

Chrome trace layout:
- process 1 "scheduler": one complete slice ("X") per step on thread 1, named by its batch
  composition; counter tracks ("C") running, waiting, kv_used_blocks;
- process 3 "server (sampled /metrics)": counter tracks of the trace's `gauge` events (a capture
  client's scrapes of the server's /metrics: running and waiting requests, KV-cache usage in %,
  preemptions and prefix-cache queries and hits so far), each a value where it was sampled;
- process 2 "requests": one thread per request with slices "queued" (arrival -> first
  scheduled step), or "waiting for first token" without step events (arrival -> first
  token), "prefill" (first step -> first token), "decode" (first -> last token), and an
  instant ("i") per token;
- process 4 "engine prefix cache (KV events)": a counter track of the blocks in the engine's own
  prefix cache after each KV event (core.analysis.kv_events), an instant per clear;
- process 5 "engine (spans)": per request with an engine-side view (its span), slices "queued",
  "prefill", "decode" from its arrival at the engine;
- steps that carry counts instead of batch entries (an engine's iteration log) are named by them;
- names through metadata events ("M": process_name, thread_name, thread_sort_index).
Timestamps are microseconds on the trace's clock.
"""
from __future__ import annotations

import io
import json

import numpy as np

from core.analysis.metrics import request_metrics, request_spans
from core.errors import InputError

SCHED_PID, REQ_PID, GAUGE_PID, CACHE_PID, ENGINE_PID = 1, 2, 3, 4, 5
# gauge fields -> (counter track, series, scale): fields sampled together share a track
GAUGE_TRACKS = {"running": ("requests", "running", 1.0), "waiting": ("requests", "waiting", 1.0),
                "kv_usage": ("kv_cache_usage_%", "kv_cache_usage_%", 100.0),
                "preemptions": ("preemptions_total", "preemptions_total", 1.0),
                "prefix_cache_queries": ("prefix_cache_tokens_total", "queries", 1.0),
                "prefix_cache_hits": ("prefix_cache_tokens_total", "hits", 1.0)}


def gauge_counters(trace) -> list[dict]:
    """Counter events ("C") of the trace's gauge samples, one per sample and track (a field a
    sample lacks is left out of its event, not drawn as 0)."""
    us, out = 1000.0, []
    gauges = trace.events_of("gauge")
    if gauges:
        out.append({"ph": "M", "pid": GAUGE_PID, "name": "process_name", "args": {"name": "server (sampled /metrics)"}})
    for g in gauges:
        tracks: dict[str, dict] = {}
        for field, (track, series, scale) in GAUGE_TRACKS.items():
            v = g.get(field)
            if v is not None:
                tracks.setdefault(track, {})[series] = float(v) * scale
        out += [{"ph": "C", "pid": GAUGE_PID, "name": track, "ts": float(g["t_ms"]) * us, "args": args}
                for track, args in tracks.items()]
    return out


def prefix_cache_counters(trace) -> list[dict]:
    """The engine's prefix cache (kv_event rows): cached blocks after each row, clears as instants."""
    if not len(trace.kv_events):
        return []
    from core.analysis.kv_events import cached_blocks
    t, n = cached_blocks(trace.kv_events)
    us = 1000.0
    out = [{"ph": "M", "pid": CACHE_PID, "name": "process_name", "args": {"name": "engine prefix cache (KV events)"}}]
    ops = trace.kv_events["op"].astype(str).tolist()
    for k, (x, c) in enumerate(zip(t.tolist(), n.tolist())):
        if k + 1 < len(t) and t[k + 1] == x:
            continue                       # one value per time: the state after the batch
        out.append({"ph": "C", "pid": CACHE_PID, "name": "cached_blocks", "ts": x * us, "args": {"cached_blocks": c}})
    out += [{"ph": "i", "s": "p", "pid": CACHE_PID, "name": "all blocks cleared", "ts": x * us}
            for x, op in zip(t.tolist(), ops) if op == "cleared"]
    return out


ENGINE_PHASES = (("engine_queue_ms", "queued"), ("engine_prefill_ms", "prefill"), ("engine_decode_ms", "decode"))


def engine_phase_slices(trace) -> list[dict]:
    """Each request's phases inside the engine (its span), on a thread of its own."""
    us, out = 1000.0, []
    arr = trace.requests["arrival_ms"].to_numpy()
    for i, (rid, ex) in enumerate(zip(trace.ids, trace.request_extra)):
        if not any(k in ex for k, _ in ENGINE_PHASES):
            continue
        if not out:
            out.append({"ph": "M", "pid": ENGINE_PID, "name": "process_name", "args": {"name": "engine (spans)"}})
        out.append({"ph": "M", "pid": ENGINE_PID, "tid": i + 1, "name": "thread_name",
                    "args": {"name": f"request {rid}"}})
        t = float(ex.get("engine_arrival_ms", arr[i]))
        for key, name in ENGINE_PHASES:
            d = ex.get(key)
            if isinstance(d, (int, float)) and d > 0:
                out.append({"ph": "X", "pid": ENGINE_PID, "tid": i + 1, "name": name, "ts": t * us, "dur": d * us})
                t += d
    return out


def _step_events(trace) -> list[dict]:
    """The scheduler's steps: a slice per step named by its batch (or its counts, for an iteration
    log), and the running/waiting and KV-blocks counters where recorded."""
    us, ev = 1000.0, []
    st, b = trace.steps, trace.batch
    if not len(st):
        return ev
    pre = b[b["kind"] == "prefill"].groupby("step")["tokens"].sum()
    dec = b[b["kind"] == "decode"].groupby("step")["req"].count()
    steps = st["step"].to_numpy()
    n_pre = pre.reindex(steps, fill_value=0).to_numpy()
    n_dec = dec.reindex(steps, fill_value=0).to_numpy()
    if not len(b) and (st["prefill_tokens"].to_numpy() >= 0).all():   # counted steps (an iteration log)
        n_pre, n_dec = st["prefill_tokens"].to_numpy(), st["decode_reqs"].to_numpy()
    for s, t, d, ru, wa, used, p, dcount in zip(steps.tolist(), st["t_ms"].tolist(), st["dur_ms"].tolist(),
                                                 st["running"].tolist(), st["waiting"].tolist(),
                                                 st["kv_used_blocks"].tolist(), n_pre.tolist(), n_dec.tolist()):
        ev.append({"ph": "X", "pid": SCHED_PID, "tid": 1, "name": f"step {s}: {p} prefill tok, {dcount} decode",
                   "ts": t * us, "dur": d * us, "args": {"step": s, "prefill_tokens": p, "decode_seqs": dcount}})
        if ru >= 0:
            ev.append({"ph": "C", "pid": SCHED_PID, "name": "sequences", "ts": t * us,
                       "args": {"running": ru, "waiting": wa}})
        if used >= 0:
            ev.append({"ph": "C", "pid": SCHED_PID, "name": "kv_used_blocks", "ts": t * us,
                       "args": {"kv_used_blocks": used}})
    return ev


def _request_events(trace) -> list[dict]:
    """A thread per request with its queued (or waiting for first token), prefill and decode slices."""
    us, ev = 1000.0, []
    sp = request_spans(trace)
    has_steps = bool(len(trace.steps))
    for i, rid in enumerate(trace.ids):
        tid = i + 1
        ev.append({"ph": "M", "pid": REQ_PID, "tid": tid, "name": "thread_name", "args": {"name": f"request {rid}"}})
        ev.append({"ph": "M", "pid": REQ_PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
        a, s0, f, last = sp["arrival"][i], sp["scheduled"][i], sp["first"][i], sp["last"][i]
        q_end = s0 if has_steps and not np.isnan(s0) else f
        if not np.isnan(q_end) and q_end > a:    # named as the replay page's timeline names it
            ev.append({"ph": "X", "pid": REQ_PID, "tid": tid, "name": "queued" if has_steps and not np.isnan(s0)
                       else "waiting for first token", "ts": a * us, "dur": (q_end - a) * us})
        if has_steps and not np.isnan(s0) and not np.isnan(f) and f > s0:
            ev.append({"ph": "X", "pid": REQ_PID, "tid": tid, "name": "prefill", "ts": s0 * us, "dur": (f - s0) * us})
        if not np.isnan(f) and last > f:
            ev.append({"ph": "X", "pid": REQ_PID, "tid": tid, "name": "decode", "ts": f * us, "dur": (last - f) * us})
    return ev


def _instant_events(trace) -> list[dict]:
    """An instant per token, then one per preemption, on their requests' threads."""
    us, ev = 1000.0, []
    tk = trace.tokens
    for r, k, t in zip(tk["req"].tolist(), tk["index"].tolist(), tk["t_ms"].tolist()):
        ev.append({"ph": "i", "s": "t", "pid": REQ_PID, "tid": r + 1, "name": f"token {k}", "ts": t * us})
    for r, t, reason in zip(trace.preempts["req"].tolist(), trace.preempts["t_ms"].tolist(),
                            trace.preempts["reason"].tolist()):
        ev.append({"ph": "i", "s": "t", "pid": REQ_PID, "tid": r + 1, "name": f"preempted ({reason})", "ts": t * us})
    return ev


def chrome_trace(trace) -> dict:
    """The trace as a Chrome Trace Event document (the layout in the module docstring)."""
    ev: list[dict] = [
        {"ph": "M", "pid": SCHED_PID, "name": "process_name", "args": {"name": "scheduler"}},
        {"ph": "M", "pid": SCHED_PID, "tid": 1, "name": "thread_name", "args": {"name": "steps"}},
        {"ph": "M", "pid": REQ_PID, "name": "process_name", "args": {"name": "requests"}},
    ]
    ev += _step_events(trace) + _request_events(trace) + _instant_events(trace)
    ev += gauge_counters(trace) + prefix_cache_counters(trace) + engine_phase_slices(trace)
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"source": trace.source, "label": trace.label, "created": str(trace.meta.get("created", ""))}}


def chrome_trace_json(trace) -> str:
    return json.dumps(chrome_trace(trace), separators=(",", ":"), allow_nan=False)


def metrics_csv(trace) -> str:
    """Per-request metrics as CSV; a missing TPOT is an empty cell, never 0."""
    return metrics_frame_csv(request_metrics(trace))


def metrics_frame_csv(m) -> str:
    """metrics.request_metrics' table as CSV (metrics_csv's format)."""
    return csv_text(m, float_format="%.6f")


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")   # what a spreadsheet may read as the start of a formula


def csv_cell(v):
    """A text cell made inert for spreadsheets (OWASP, CSV injection): one that starts with = + - @ tab
    or carriage return gets a leading single quote, so it is shown as the text it is, never evaluated
    (a request id "=HYPERLINK(...)" from another tool's file). Other values are returned as they are."""
    return "'" + v if isinstance(v, str) and v.startswith(FORMULA_START) else v


def csv_text(df, **to_csv) -> str:
    """Every CSV this project writes: a data frame's text and category cells and its column names
    through csv_cell (numbers untouched), lines ended by CRLF so that a cell holding a line break is
    quoted (RFC 4180; Python's csv quotes a cell holding any character of the line terminator)."""
    import pandas as pd
    safe = df.rename(columns=lambda c: csv_cell(str(c)))
    for k, (_, col) in enumerate(safe.items()):
        if col.dtype == object or pd.api.types.is_string_dtype(col) or isinstance(col.dtype, pd.CategoricalDtype):
            safe.isetitem(k, col.astype(object).map(csv_cell))
    buf = io.StringIO()
    safe.to_csv(buf, index=False, lineterminator="\r\n", **to_csv)
    return buf.getvalue()


USER_META_LIMITS = {"device": 200, "engine": 200, "notes": 2000}


def with_run_metadata(trace, device: str = "", engine: str = "", notes: str = ""):
    """A copy of `trace` whose meta carries run details a user supplied for an uploaded file
    (the trace itself is shared and never changed): device, engine (its name/version text,
    kept beside an engine dict the file had) and notes. Empty fields leave the file's own."""
    import dataclasses
    meta = dict(trace.meta)
    for name, value in (("device", device), ("engine", engine), ("notes", notes)):
        value = (value or "").strip()
        if len(value) > USER_META_LIMITS[name]:
            raise InputError(f"{name}: at most {USER_META_LIMITS[name]} characters, got {len(value)}")
        if not value:
            continue
        if name == "engine":
            old = meta.get("engine")
            meta["engine"] = {**old, "described_by_user": value} if isinstance(old, dict) else {"name": value}
        else:
            meta[name] = value
    return dataclasses.replace(trace, meta=meta)
