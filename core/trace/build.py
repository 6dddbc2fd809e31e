"""Traces made in this process: from the scheduler's StepLog (simulator and runner), from
emission times given per request (teaching scenarios), or empty for a workload.

The StepLog interface (core/scheduler.py), read by position so that plain tuples and
NamedTuples both work:
  steps        (step, t_ms, dur_ms, running, waiting, kv_used_blocks, kv_free_blocks): scalars
               for one step, or arrays for a fast-forwarded run of steps
  batch_parts  (step or array of steps, reqs, num_tokens, is_prefill)
  token_parts  (reqs, index, t_ms scalar or per token, token_ids or None); token_sources:
               per part, codes into TOKEN_SOURCES or None (all sampled)
  finishes     (req, t_ms, reason);  preempts (req, t_ms, reason, freed_blocks)
  kv           core.paging.KVLog;     other: verbatim events (spec, tiles)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.paging import KV_OPS
from core.trace.model import Trace, frame
from core.trace.schema import BATCH, FINISH, KINDS, KV, PREEMPT, REQUEST, STEP, TOKEN, TOKEN_SOURCES
from core.trace.validate import trace_from_doc
from core.workload import Workload

LOG_STEP_FIELDS = ("step", "t_ms", "dur_ms", "running", "waiting", "kv_used_blocks", "kv_free_blocks")
STEP_DTYPES = {f.name: (float if f.type == "time" else np.int64) for f in STEP.columns}


def new_trace(meta: dict, workload: Workload) -> Trace:
    """An empty trace for a workload (events are added by builders)."""
    n = len(workload)
    requests = frame(REQUEST, {"id": workload.ids, "arrival_ms": workload.arrival_ms,
                               "prompt_tokens": workload.prompt_tokens,
                               "max_output_tokens": workload.max_output_tokens,
                               "tenant": [r.tenant for r in workload.requests] if not workload.plain else None})
    if workload.plain:
        extras = [{} for _ in range(n)]
    else:
        extras = []
        for r in workload.requests:
            e = dict(r.extra) if r.extra else {}
            if r.prompt_ids is not None:
                e["prompt_ids"] = list(r.prompt_ids)
            if r.abort_at_ms is not None:
                e["abort_at_ms"] = r.abort_at_ms
            extras.append(e)
    return Trace(meta=dict(meta), requests=requests, request_extra=extras)


def _steps(entries: list) -> dict:
    # Entries are single steps (scalars) or runs (arrays), in order; consecutive singles are
    # gathered into one part.
    parts, singles = [], []
    for e in entries:
        if not isinstance(e[0], np.ndarray):
            singles.append(e)
            continue
        if singles:
            parts.append(list(zip(*singles)))
            singles = []
        parts.append(e)
    if singles:
        parts.append(list(zip(*singles)))
    return {name: np.concatenate([np.asarray(p[i], dtype=STEP_DTYPES[name]) for p in parts])
            for i, name in enumerate(LOG_STEP_FIELDS)}


def log_records(log) -> dict:
    """What the StepLog holds, as columns per record type: {rtype: {field: values}} for
    token, finish, step, batch, kv and preempt (types with no rows are left out). Enum fields
    are Categoricals; a KV hash column of None means no block was hashed."""
    out = {}
    if log.token_parts:
        parts = log.token_parts
        reqs = np.concatenate([p[0] for p in parts])
        # A part's time is one scalar (a step) or one per token (a fast-forwarded run of steps).
        lens = np.fromiter((len(p[0]) for p in parts), np.int64, len(parts))
        scalar_t = [np.ndim(p[2]) == 0 for p in parts]
        if all(scalar_t):
            t = np.repeat(np.fromiter((p[2] for p in parts), np.float64, len(parts)), lens)
        else:
            t = np.concatenate([np.full(len(p[0]), p[2], dtype=float) if s else p[2] for s, p in zip(scalar_t, parts)])
        tid = (np.concatenate([p[3] if p[3] is not None else np.full(len(p[0]), -1) for p in parts])
               if any(p[3] is not None for p in parts) else np.full(len(t), -1, dtype=np.int64))
        src = getattr(log, "token_sources", None)
        codes = (np.concatenate([np.zeros(len(p[0]), dtype=np.int8) if c is None else c for c, p in zip(src, parts)])
                 if src and any(c is not None for c in src) else np.zeros(len(reqs), dtype=np.int8))
        out["token"] = {"t_ms": t, "req": reqs, "index": np.concatenate([p[1] for p in parts]),
                        "source": pd.Categorical.from_codes(codes, TOKEN_SOURCES), "token_id": tid}
    if log.finishes:
        req, t, reason = (list(c) for c in zip(*log.finishes))
        out["finish"] = {"t_ms": np.array(t, dtype=float), "req": np.array(req, dtype=np.int64), "reason": reason}
    if log.steps:
        out["step"] = _steps(log.steps)
        # A part's step is one index, or an array of steps that all ran the same batch.
        bp = log.batch_parts
        lens = np.fromiter((len(p[1]) for p in bp), np.int64, len(bp))
        scalar = [np.ndim(p[0]) == 0 for p in bp]
        if all(scalar):
            step = np.repeat(np.fromiter((p[0] for p in bp), np.int64, len(bp)), lens)
            tile = lambda k: np.concatenate([p[k] for p in bp])
        else:
            step = np.concatenate([np.full(len(p[1]), p[0], dtype=np.int64) if s else np.repeat(p[0], len(p[1]))
                                   for s, p in zip(scalar, bp)])
            tile = lambda k: np.concatenate([p[k] if s else np.tile(p[k], len(p[0])) for s, p in zip(scalar, bp)])
        out["batch"] = {"step": step, "req": tile(1), "tokens": tile(2),
                        "kind": pd.Categorical.from_codes(tile(3).astype(np.int8), KINDS)}
    if len(log.kv):
        c = log.kv.columns()
        out["kv"] = c | {"op": pd.Categorical.from_codes(c["op"], KV_OPS)}
    if log.preempts:
        req, t, reason, freed = (list(c) for c in zip(*log.preempts))
        out["preempt"] = {"t_ms": np.array(t, dtype=float), "req": np.array(req, dtype=np.int64), "reason": reason,
                          "freed_blocks": np.array(freed, dtype=np.int64)}
    return out


_RECORDS = {r.type: r for r in (TOKEN, FINISH, STEP, BATCH, KV, PREEMPT)}


def trace_from_log(workload: Workload, log, meta: dict) -> Trace:
    """Turn a scheduler StepLog (simulator or runner) into a Trace."""
    tr = new_trace(meta, workload)
    for rtype, cols in log_records(log).items():
        rec = _RECORDS[rtype]
        setattr(tr, rec.table, frame(rec, cols))
    tr.other = list(getattr(log, "other", []) or [])
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
    return trace_from_doc(tr.to_doc(), meta.get("label", "given"))  # validate on the way out
