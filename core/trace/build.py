"""Traces made in this process: from a run's records (the engine's step log as columns per
record type: core.engine.steplog.log_records), from emission times given per request (teaching
scenarios), or empty for a workload."""
from __future__ import annotations

import pandas as pd

from core.trace.jsoncodec import to_doc
from core.trace.model import Trace, frame
from core.trace.schema import BATCH, FINISH, KV, PREEMPT, REQUEST, STEP, TOKEN
from core.trace.validate import trace_from_doc
from core.trace.writer import request_extras
from core.workload import Workload


def new_trace(meta: dict, workload: Workload) -> Trace:
    """An empty trace for a workload (events are added by builders)."""
    n = len(workload)
    requests = frame(REQUEST, {"id": workload.ids, "arrival_ms": workload.arrival_ms,
                               "prompt_tokens": workload.prompt_tokens,
                               "max_output_tokens": workload.max_output_tokens,
                               "tenant": [r.tenant for r in workload.requests] if not workload.plain else None})
    extras = [{} for _ in range(n)] if workload.plain else request_extras(workload)
    return Trace(meta=dict(meta), requests=requests, request_extra=extras)


_RECORDS = {r.type: r for r in (TOKEN, FINISH, STEP, BATCH, KV, PREEMPT)}


def trace_from_records(workload: Workload, records: dict, meta: dict, other: list | None = None) -> Trace:
    """A Trace of a run: `records` {record type: {field: column}} (enum fields as int8 codes
    into the field's values), `other` verbatim events (spec, tiles)."""
    tr = new_trace(meta, workload)
    for rtype, cols in records.items():
        rec = _RECORDS[rtype]
        for f in rec.columns:   # enum columns come as codes into the field's values
            if f.type == "enum":
                cols[f.name] = pd.Categorical.from_codes(cols[f.name], list(f.values))
        setattr(tr, rec.table, frame(rec, cols))
    tr.other = list(other or [])
    return tr


def given_trace(workload: Workload, emissions: dict[str, list[float]], meta: dict) -> Trace:
    """A trace from assigned emission times per request id (teaching scenarios)."""
    tr = new_trace({"source": "given", **meta}, workload)
    pos = {rid: i for i, rid in enumerate(tr.ids)}
    rows = [(pos[rid], k, float(t)) for rid, ts in emissions.items() for k, t in enumerate(ts)]
    req, idx, t = (list(c) for c in zip(*rows))
    tr.tokens = frame(TOKEN, {"t_ms": t, "req": req, "index": idx})
    last = {rid: max(ts) for rid, ts in emissions.items()}
    tr.finishes = frame(FINISH, {"t_ms": list(last.values()), "req": [pos[r] for r in last]})
    return trace_from_doc(to_doc(tr), meta.get("label", "given"))  # validate on the way out


def one_replica(trace: Trace, replica: int) -> Trace:
    """One replica of a fleet trace, as a trace of its own: its steps (their batch entries), KV
    block events, the prefix-cache events its engine published, preemptions, tokens and finishes,
    and the requests that ran there (a batch entry, a token or a finish on it), renumbered in the
    trace's order; the route and transfer events of those requests, its own gauge samples; meta as
    the fleet's (its engine: the replica's own where meta.fleet has it), labelled with the replica. A disaggregated
    prefill replica's requests have no tokens or finish there (their decode replica emits them)."""
    import numpy as np
    t = trace
    steps = t.steps[t.steps["replica"] == replica]
    batch = t.batch[t.batch["step"].isin(steps["step"])]
    parts = {name: getattr(t, name)[getattr(t, name)["replica"] == replica]
             for name in ("tokens", "finishes", "kv", "preempts")}
    n = len(t.requests)
    ran = np.zeros(n, dtype=bool)
    for df in (batch, parts["tokens"], parts["finishes"]):
        r = df["req"].to_numpy()
        ran[r[(r >= 0) & (r < n)]] = True
    keep = np.flatnonzero(ran)
    new = np.full(n + 1, -1, dtype=np.int64)       # old row -> new row (-1: gone; index n: a null req)
    new[keep] = np.arange(len(keep))

    def remap(df):
        df = df.copy()
        r = df["req"].to_numpy()
        df["req"] = np.where(r >= 0, new[np.where(r >= 0, r, n)], -1)
        return df.reset_index(drop=True)

    ids = set(t.requests["id"].iloc[keep].tolist())
    meta = dict(t.meta)
    meta["label"] = f"{t.label}, replica {replica}"
    reps = (t.meta.get("fleet") or {}).get("replicas") if isinstance(t.meta.get("fleet"), dict) else None
    own = reps[replica].get("engine") if isinstance(reps, list) and replica < len(reps) and \
        isinstance(reps[replica], dict) else None
    if isinstance(own, dict):
        meta["engine"] = own
    return Trace(meta=meta, requests=t.requests.iloc[keep].reset_index(drop=True),
                 tokens=remap(parts["tokens"]), finishes=remap(parts["finishes"]),
                 steps=steps.reset_index(drop=True), batch=remap(batch), kv=remap(parts["kv"]),
                 kv_events=t.kv_events[t.kv_events["replica"] == replica].reset_index(drop=True),
                 preempts=remap(parts["preempts"]),
                 other=[e for e in t.other if e.get("req") in ids
                        or (e.get("type") == "gauge" and e.get("replica", 0) == replica)],
                 request_extra=[t.request_extra[i] for i in keep.tolist()] if t.request_extra else [],
                 extra=dict(t.extra))
