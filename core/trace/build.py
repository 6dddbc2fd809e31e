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
