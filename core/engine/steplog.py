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
        # A part's step is one index, or an array of steps that all ran the same batch.
        steps, reqs, tokens, prefill = zip(*log.batch_parts)
        runs = [isinstance(x, np.ndarray) for x in steps]
        if any(runs):  # a fast-forwarded run: its batch repeats once per step
            k = [len(x) if r else 1 for x, r in zip(steps, runs)]
            reqs, tokens, prefill = ([np.tile(v, j) if j > 1 or r else v for v, j, r in zip(col, k, runs)]
                                     for col in (reqs, tokens, prefill))
            steps = [np.repeat(x, len(v) // len(x)) if r else x for x, v, r in zip(steps, reqs, runs)]
        lens = np.fromiter(map(len, reqs), np.int64, len(reqs))
        out["batch"] = {"step": spread(list(steps), lens, np.int64), "req": np.concatenate(reqs),
                        "tokens": np.concatenate(tokens),
                        "kind": np.concatenate(prefill).astype(np.int8)}
    if log.kv is not None and len(log.kv):
        out["kv"] = log.kv.columns()
    if log.preempts:
        req, t, reason, freed = (list(c) for c in zip(*log.preempts))
        out["preempt"] = {"t_ms": np.array(t, dtype=float), "req": np.array(req, dtype=np.int64), "reason": reason,
                          "freed_blocks": np.array(freed, dtype=np.int64)}
    return out
