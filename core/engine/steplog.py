"""What the scheduler recorded: `StepLog`, the columnar record of a run: typed rows (or, for a
fast-forwarded run of steps, rows whose fields are arrays), turned into columns per record type
by `log_records` (core.trace makes the trace's tables of them, or a TraceWriter streams them).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from core.engine.kvlog import KVLog, spread


# Step-log records. Each is a row, or (StepRun and parts built from arrays) a run of rows.
class StepRecord(NamedTuple):
    step: int | np.ndarray
    t_ms: float | np.ndarray        # step start
    dur_ms: float | np.ndarray
    running: int | np.ndarray
    waiting: int | np.ndarray
    kv_used_blocks: int | np.ndarray
    kv_free_blocks: int | np.ndarray


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


class PreemptRecord(NamedTuple):
    req: int
    t_ms: float
    reason: str
    freed_blocks: int


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

    def clear(self):
        """Forget every record (a streaming writer has taken them); the run continues."""
        self.steps, self.batch_parts, self.token_parts = [], [], []
        self.finishes, self.preempts, self.token_sources, self.other = [], [], [], []
        if self.kv is not None:
            self.kv.clear()


LOG_STEP_FIELDS = ("step", "t_ms", "dur_ms", "running", "waiting", "kv_used_blocks", "kv_free_blocks")
STEP_DTYPES = {name: (float if name in ("t_ms", "dur_ms") else np.int64) for name in LOG_STEP_FIELDS}


def _steps(entries: list) -> dict:
    # Entries are single steps (scalars) or runs (arrays), in order: each field is spread once.
    lens = np.fromiter((len(e[0]) if type(e[0]) is np.ndarray else 1 for e in entries), np.int64, len(entries))
    return {name: spread([e[i] for e in entries], lens, STEP_DTYPES[name]) for i, name in enumerate(LOG_STEP_FIELDS)}


def _batch_rows(parts) -> dict:
    """The batch columns of the step log's parts: a part is one step's batch, or (a fast-forwarded
    run) the same batch over an array of steps, repeated once per step; done with whole-column
    gathers, not per part."""
    steps, reqs, tokens, prefill = zip(*parts)
    m = np.fromiter(map(len, reqs), np.int64, len(parts))             # rows of each part's batch
    k = np.fromiter((len(s) if type(s) is np.ndarray else 1 for s in steps), np.int64, len(parts))
    req, tok, pre = np.concatenate(reqs), np.concatenate(tokens), np.concatenate(prefill)
    if (k == 1).all():
        return {"step": np.repeat(np.array(steps, dtype=np.int64), m), "req": req, "tokens": tok,
                "kind": pre.astype(np.int8)}
    rows = m * k
    total = int(rows.sum())
    pid = np.repeat(np.arange(len(parts)), rows)                      # each output row's part
    pos = np.arange(total) - np.repeat(np.cumsum(rows) - rows, rows)   # its place within the part's rows
    m_of = m[pid]
    idx = (np.cumsum(m) - m)[pid] + pos % m_of                        # the batch entry it repeats
    all_steps = np.concatenate([s if type(s) is np.ndarray else np.array([s]) for s in steps]).astype(np.int64)
    step = all_steps[(np.cumsum(k) - k)[pid] + pos // m_of]
    return {"step": step, "req": req[idx], "tokens": tok[idx], "kind": pre[idx].astype(np.int8)}


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
