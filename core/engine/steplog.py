"""The record of a run: `StepLog` observes an engine core's EngineOutputs (`record`) and keeps
them as typed rows (or, for a fast-forwarded run of steps, rows whose fields are arrays), turned
into columns per record type by `log_records` (core.trace makes the trace's tables of them, or a
TraceWriter streams them). The scheduler writes nothing here: what is recorded is exactly what
the engine reported.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from core.engine.kvlog import KVLog, spread
from core.engine.outputs import EngineOutputs, StepRecord
from core.engine.outputs import Preemption as PreemptRecord

StepRun = StepRecord  # a fast-forwarded run: the same fields, one array each


class BatchPart(NamedTuple):
    step: int | np.ndarray          # one step, or (fast-forward) the steps the same batch repeats in
    reqs: np.ndarray
    num_tokens: np.ndarray
    is_prefill: np.ndarray


class TokenPart(NamedTuple):
    reqs: np.ndarray
    index: np.ndarray               # output position of each token
    t_ms: float | np.ndarray
    token_ids: np.ndarray | None    # None: ids unknown (simulated)


class FinishRecord(NamedTuple):   # (core.engine.outputs.Finish is one too: the same first fields)
    req: int
    t_ms: float
    reason: str                     # length | stop | abort | deadline | rejected


class StepLog:
    """Columnar record of what the scheduler did (turned into a trace by core.trace)."""

    def __init__(self, record_kv: bool = True):
        self.steps: list[StepRecord] = []
        self.batch_parts: list[BatchPart] = []
        self.token_parts: list[TokenPart] = []
        self.finishes: list[FinishRecord] = []
        self.preempts: list[PreemptRecord] = []
        self.kv = KVLog() if record_kv else None   # None: KV block events are not recorded
        self.token_sources: list = []            # per token part: codes into TOKEN_SOURCES, or None (sampled)
        self.other: list[dict] = []              # verbatim events (spec, tiles)

    def record(self, out: EngineOutputs):
        """Observe one EngineOutputs (an engine core calls this for each): its step or run of
        steps, batch, tokens, finishes, preemptions, KV block events and verbatim events."""
        if out.finished:
            self.finishes += out.finished
        if out.preempted:
            self.preempts += out.preempted
        if out.kv_events and self.kv is not None:
            self.kv.extend(out.kv_events)
        rec = out.record
        if rec is None:
            return
        b = out.step
        self.steps.append(rec)
        if type(rec.step) is np.ndarray and len(out.token_reqs) != len(rec.step) * len(b.reqs):
            # a run through finishes: each step's batch is the requests still decoding, one token
            # each (its tokens, step by step)
            k = len(out.token_reqs)
            self.batch_parts.append(BatchPart(PerRow(np.repeat(rec.step, rec.running)), out.token_reqs,
                                              np.ones(k, dtype=np.int64), np.zeros(k, dtype=bool)))
        else:
            self.batch_parts.append(BatchPart(rec.step, b.reqs, b.num_tokens, b.is_prefill))
        self.token_parts.append(TokenPart(out.token_reqs, out.token_index,
                                          out.t_ms if out.token_t_ms is None else out.token_t_ms, out.token_ids))
        self.token_sources.append(out.token_sources)
        if out.events:
            self.other.extend(out.events)

    def clear(self):
        """Forget every record (a streaming writer has taken them); the run continues."""
        self.steps, self.batch_parts, self.token_parts = [], [], []
        self.finishes, self.preempts, self.token_sources, self.other = [], [], [], []
        if self.kv is not None:
            self.kv.clear()


LOG_STEP_FIELDS = ("step", "t_ms", "dur_ms", "running", "waiting", "kv_used_blocks", "kv_free_blocks")
STEP_DTYPES = {name: (float if name in ("t_ms", "dur_ms") else np.int64) for name in LOG_STEP_FIELDS}


# Fast-forwarded runs are expanded one by one (numpy calls per run) when a log has few of them
# for its size, all together with whole-column gathers (work per row) when it has many: a serial
# or static policy has thousands, and one np.tile each cost a third of building its trace. The
# ratios are the measured costs of the two ways (bench.engine_core).
ROWS_PER_RUN = 1000       # batch rows that cost as much to gather as one run's np.tile calls
ENTRIES_PER_RUN = 10      # step entries that cost as much to spread as one run's own part


def _steps(entries: list) -> dict:
    # Entries are single steps (scalars) or runs (arrays), in order.
    lens = [len(e[0]) if type(e[0]) is np.ndarray else 1 for e in entries]
    if (len(entries) - lens.count(1)) * ENTRIES_PER_RUN > len(entries):   # many runs: each field spread once
        lens = np.array(lens, dtype=np.int64)
        return {name: spread([e[i] for e in entries], lens, STEP_DTYPES[name])
                for i, name in enumerate(LOG_STEP_FIELDS)}
    parts, singles = [], []   # few: consecutive singles gathered into one part
    for e in entries:
        if type(e[0]) is not np.ndarray:
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


class PerRow(NamedTuple):
    """A BatchPart's `step` when its rows are of several steps, one each (a run through finishes:
    each step's batch is the requests still decoding)."""
    steps: np.ndarray


def _batch_rows(parts) -> dict:
    """The batch columns of the step log's parts: a part is one step's batch, or (a fast-forwarded
    run) the same batch over an array of steps, repeated once per step, or rows with a step each
    (PerRow)."""
    steps, reqs, tokens, prefill = zip(*parts)
    is_run = [type(s) is np.ndarray for s in steps]
    per_row = [type(s) is PerRow for s in steps]
    k = np.fromiter((len(s) if r else 1 for s, r in zip(steps, is_run)), np.int64, len(parts))
    m = np.fromiter(map(len, reqs), np.int64, len(parts))             # rows of each part's batch
    rows = m * k
    if any(per_row):
        steps = [s.steps if p else s for s, p in zip(steps, per_row)]
    if sum(is_run) * ROWS_PER_RUN < int(rows.sum()):
        if any(is_run):
            reqs, tokens, prefill = ([np.tile(v, j) if r else v for v, j, r in zip(col, k.tolist(), is_run)]
                                     for col in (reqs, tokens, prefill))
            steps = [np.repeat(x, len(v) // len(x)) if r else x for x, v, r in zip(steps, reqs, is_run)]
        lens = np.fromiter(map(len, reqs), np.int64, len(reqs))
        return {"step": spread(list(steps), lens, np.int64), "req": np.concatenate(reqs),
                "tokens": np.concatenate(tokens), "kind": np.concatenate(prefill).astype(np.int8)}
    pid = np.repeat(np.arange(len(parts)), rows)                      # each output row's part
    pos = np.arange(int(rows.sum())) - np.repeat(np.cumsum(rows) - rows, rows)   # its place in the part
    m_of = m[pid]
    idx = (np.cumsum(m) - m)[pid] + pos % m_of                        # the batch entry it repeats
    src = [s if type(s) is np.ndarray else np.array([s]) for s in steps]
    n_src = np.fromiter(map(len, src), np.int64, len(src))
    at = pos // m_of
    if any(per_row):   # (a per-row part's rows each read their own step)
        at = np.where(np.array(per_row)[pid], pos, at)
    all_steps = np.concatenate(src).astype(np.int64)
    return {"step": all_steps[(np.cumsum(n_src) - n_src)[pid] + at], "req": np.concatenate(reqs)[idx],
            "tokens": np.concatenate(tokens)[idx], "kind": np.concatenate(prefill)[idx].astype(np.int8)}


def log_records(log) -> dict:
    """What the StepLog holds, as columns per record type: {rtype: {field: values}} for
    token, finish, step, batch, kv and preempt (types with no rows are left out). Enum fields
    are int8 codes into the field's values (schema.py); a KV hash column of None means no
    block was hashed. Builds nothing per row in Python (core.trace turns it into tables, or a
    TraceWriter streams it)."""
    out = {}
    if log.token_parts:
        reqs, index, t, ids = zip(*log.token_parts)
        lens = np.fromiter(map(len, reqs), np.int64, len(reqs))
        n = int(lens.sum())
        # A part's time is one scalar (a step) or one per token (a fast-forwarded run of steps).
        tid = (spread([-1 if x is None else x for x in ids], lens, np.int64) if any(x is not None for x in ids)
               else np.full(n, -1, dtype=np.int64))
        src = getattr(log, "token_sources", None)
        codes = (spread([0 if c is None else c for c in src], lens, np.int8) if src and any(c is not None for c in src)
                 else np.zeros(n, dtype=np.int8))
        out["token"] = {"t_ms": spread(list(t), lens, np.float64), "req": np.concatenate(reqs),
                        "index": np.concatenate(index), "source": codes,
                        "token_id": tid}
    if log.finishes:
        req, t, reason = (list(c) for c in list(zip(*log.finishes))[:3])   # (req, t_ms, reason, ...)
        out["finish"] = {"t_ms": np.array(t, dtype=float), "req": np.array(req, dtype=np.int64), "reason": reason}
    if log.steps:
        out["step"] = _steps(log.steps)
        out["batch"] = _batch_rows(log.batch_parts)
    if log.kv is not None and len(log.kv):
        out["kv"] = log.kv.columns()
    if log.preempts:
        req, t, reason, freed = (list(c) for c in zip(*log.preempts))
        out["preempt"] = {"t_ms": np.array(t, dtype=float), "req": np.array(req, dtype=np.int64), "reason": reason,
                          "freed_blocks": np.array(freed, dtype=np.int64)}
    return out
