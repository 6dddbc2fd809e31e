"""The record of a run: `StepLog` observes an engine core's EngineOutputs (`record`) and keeps
them as typed rows, turned into columns per record type by `log_records` (core.trace makes the
trace's tables of them, or a TraceWriter streams them). The scheduler writes nothing here: what is
recorded is exactly what the engine reported.

A simulator's decoders are not listed step by step (core.engine.scheduler): the log keeps each
one's membership span instead (request r decodes at decode counter values [a, b), its output
indices from e0) and the step each counter value ran in; `log_records` expands them into the same
batch and token rows stepping would have listed, merged with the listed entries by step and
running order (each entry's join number).
"""
from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from core.engine.kvlog import KVLog, spread
from core.engine.outputs import EngineOutputs, Finish, StepRecord
from core.engine.outputs import Preemption as PreemptRecord


class StepLog:
    """Columnar record of what the scheduler did (turned into a trace by core.trace)."""

    def __init__(self, record_kv: bool = True):
        self.kv = KVLog() if record_kv else None   # None: KV block events are not recorded
        self.open: dict[int, tuple[int, int, int]] = {}   # decoder -> (join number, first counter value, e0)
        self.counter0 = 0                           # the decode counter's value at counter_step[0]
        self.clear()

    def clear(self):
        """Forget every record (a streaming writer has taken them); the run continues (open
        decoder spans go on from where the records end)."""
        self.steps: list[StepRecord] = []
        # per step with listed entries: (step, reqs, num_tokens, is_prefill, join numbers or None where
        # decoders are not counted) and (reqs, output index, t_ms, token ids or None: simulated, step,
        # each token's request's join number or None)
        self.batch_parts: list[tuple] = []
        self.token_parts: list[tuple] = []
        self.finishes: list[Finish] = []
        self.preempts: list[PreemptRecord] = []
        self.token_sources: list = []            # per token part: codes into TOKEN_SOURCES, or None (sampled)
        self.other: list[dict] = []              # verbatim events (spec, tiles)
        self.spans: list[tuple[int, int, int, int, int]] = []   # closed: (req, join, a, b, e0)
        if getattr(self, "counter_step", None):
            d = self.counter0 + len(self.counter_step)
            self.open = {r: (j, d, e0 + d - a) for r, (j, a, e0) in self.open.items()}
            self.counter0 = d
        self.counter_step: list[int] = []        # step of each counter value from counter0
        self.counter_end: list[float] = []       # ... its end
        if self.kv is not None:
            self.kv.clear()

    def record(self, out: EngineOutputs):
        """Observe one EngineOutputs (an engine core calls this for each): its step, batch,
        tokens, finishes, preemptions, decoders that started or stopped, KV block events and
        verbatim events."""
        if out.finished:
            self.finishes += out.finished
        if out.preempted:
            self.preempts += out.preempted
        if out.kv_events and self.kv is not None:
            self.kv.extend(out.kv_events)
        if out.left:
            for r, end, _ in out.left:
                j, a, e0 = self.open.pop(r)
                if end > a:
                    self.spans.append((r, j, a, end, e0))
        rec: Any = out.record
        if rec is not None:
            b: Any = out.step   # (a record comes with its step)
            self.steps.append(rec)
            if out.decoded is not None:
                if type(rec.step) is list:   # a run of decode steps (Scheduler.advance)
                    self.counter_step.extend(rec.step)
                    self.counter_end.extend([t + d for t, d in zip(rec.t_ms, rec.dur_ms)])
                else:
                    self.counter_step.append(rec.step)
                    self.counter_end.append(out.t_ms)
            if len(b.reqs):
                self.batch_parts.append((rec.step, b.reqs, b.num_tokens, b.is_prefill, b.join_no))
            if len(out.token_reqs):
                joins = None
                if b.join_no is not None:   # (each listed token's request's join number: running order)
                    jm = dict(zip(b.reqs, b.join_no))
                    joins = [jm[r] for r in out.token_reqs]
                self.token_parts.append((out.token_reqs, out.token_index, out.t_ms, out.token_ids, rec.step, joins))
                self.token_sources.append(out.token_sources)
            if out.events:
                self.other.extend(out.events)
        if out.entered:
            for r, j, a, e0 in out.entered:
                self.open[r] = (j, a, e0)

    def decoder_rows(self, width: int) -> tuple[np.ndarray, ...] | None:
        """The decoders' rows as stepping would list them, in step order then running order (the key
        step x `width` + join number, ascending): (key, step, req, output index, time) per token;
        None without decoders. Open spans count up to the counter's value now. The rows are built
        span by span and put in key order by one stable argsort (no search per row)."""
        spans = list(self.spans)
        d_now = self.counter0 + len(self.counter_step)
        spans += [(r, j, a, d_now, e0) for r, (j, a, e0) in self.open.items() if d_now > a]
        if not spans:
            return None
        sp = np.array(spans, dtype=np.int64)
        sp = sp[np.lexsort((sp[:, 2], sp[:, 1]))]         # by join number, then first counter value
        k = sp[:, 3] - sp[:, 2]
        cs = np.array(self.counter_step, dtype=np.int64)
        s = np.repeat(np.arange(len(sp)), k)              # each row's span
        d = (sp[:, 2] - self.counter0 - (np.cumsum(k) - k))[s] + np.arange(len(s))   # its counter value - counter0
        key = cs[d] * width + sp[s, 1]
        order = np.argsort(key, kind="stable")   # (runs already in order, span by span: quick)
        key, d, s = key[order], d[order], s[order]
        idx = (sp[:, 4] - sp[:, 2] + self.counter0)[s] + d
        return key, cs[d], sp[s, 0], idx, np.array(self.counter_end, dtype=np.float64)[d]


LOG_STEP_FIELDS = ("step", "t_ms", "dur_ms", "running", "waiting", "kv_used_blocks", "kv_free_blocks")
STEP_DTYPES = {name: (float if name in ("t_ms", "dur_ms") else np.int64) for name in LOG_STEP_FIELDS}


def _steps(entries: list) -> dict:
    """Entries are single steps (scalars) or runs of decode steps (lists, one per field), in order:
    each field flattened into one list, then one array."""
    cols: list[list] = [[] for _ in LOG_STEP_FIELDS]
    for e in entries:
        if type(e[0]) is list:
            for c, v in zip(cols, e):
                c.extend(v)
        else:
            for c, v in zip(cols, e):
                c.append(v)
    return {name: np.array(c, dtype=STEP_DTYPES[name]) for name, c in zip(LOG_STEP_FIELDS, cols)}


def _with_decoders(listed: dict, key: np.ndarray, dec: dict, dkey: np.ndarray) -> dict:
    """The listed rows (their keys step x width + join number, ascending) placed among the decoders'
    rows (already in key order): each column once, by insertion."""
    at = np.searchsorted(dkey, key)
    return {k: np.insert(dec[k], at, listed[k]) for k in listed}


def log_records(log) -> dict:
    """What the StepLog holds, as columns per record type: {rtype: {field: values}} for
    token, finish, step, batch, kv and preempt (types with no rows are left out). Enum fields
    are int8 codes into the field's values (schema.py); a KV hash column of None means no
    block was hashed. Builds nothing per row in Python (core.trace turns it into tables, or a
    TraceWriter streams it)."""
    out: dict[str, Any] = {}
    joins_seen = [j for _, j, *_ in log.spans] + [j for j, _, _ in log.open.values()] if hasattr(log, "spans") else []
    width = 0
    if joins_seen:
        width = max(joins_seen) + 2
        for p in log.batch_parts:
            if p[4] is not None and len(p[4]):
                width = max(width, max(p[4]) + 2)
    dec = log.decoder_rows(width) if width else None
    batch = tokens = None
    if log.batch_parts:
        step, reqs, n, pre, joins = zip(*log.batch_parts)
        lens = np.fromiter(map(len, reqs), np.int64, len(reqs))
        batch = {"step": np.repeat(np.array(step, dtype=np.int64), lens), "req": np.concatenate(reqs),
                 "tokens": np.concatenate(n), "kind": np.concatenate(pre).astype(np.int8)}
        if dec is not None:
            batch_joins = np.concatenate([np.asarray(j, dtype=np.int64) if j is not None else np.full(m, -1, np.int64)
                                          for j, m in zip(joins, lens.tolist())])
    if log.token_parts:
        reqs, index, t, ids, tstep, _ = zip(*log.token_parts)
        lens = np.fromiter(map(len, reqs), np.int64, len(reqs))
        n_tok = int(lens.sum())
        tid = (spread([-1 if x is None else x for x in ids], lens, np.int64) if any(x is not None for x in ids)
               else np.full(n_tok, -1, dtype=np.int64))
        src = getattr(log, "token_sources", None)
        codes = (spread([0 if c is None else c for c in src], lens, np.int8) if src and any(c is not None for c in src)
                 else np.zeros(n_tok, dtype=np.int8))
        tokens = {"t_ms": spread(list(t), lens, np.float64), "req": np.concatenate(reqs),
                  "index": np.concatenate(index), "source": codes, "token_id": tid}
        token_step = np.repeat(np.array(tstep, dtype=np.int64), lens)
    if dec is not None:
        d_key, d_step, d_req, d_idx, d_t = dec
        m = len(d_key)
        d_batch = {"step": d_step, "req": d_req, "tokens": np.ones(m, np.int64), "kind": np.zeros(m, np.int8)}
        batch = d_batch if batch is None else _with_decoders(batch, batch["step"] * width + batch_joins, d_batch,
                                                             d_key)
        d_tok = {"t_ms": d_t, "req": d_req, "index": d_idx, "source": np.zeros(m, np.int8),
                 "token_id": np.full(m, -1, np.int64)}
        if tokens is None:
            tokens = d_tok
        else:
            tj = np.fromiter(chain.from_iterable(p[5] for p in log.token_parts), np.int64, len(token_step))
            tokens = _with_decoders(tokens, token_step * width + tj, d_tok, d_key)
    if tokens is not None:
        out["token"] = tokens
    if log.finishes:
        f_req, f_t, f_why = (list(c) for c in list(zip(*log.finishes))[:3])   # (req, t_ms, reason, ...)
        out["finish"] = {"t_ms": np.array(f_t, dtype=float), "req": np.array(f_req, dtype=np.int64), "reason": f_why}
    if log.steps:
        out["step"] = _steps(log.steps)
        if batch is not None:
            out["batch"] = batch
    if log.kv is not None and len(log.kv):
        out["kv"] = log.kv.columns()
    if log.preempts:
        p_req, p_t, p_why, freed = (list(c) for c in zip(*log.preempts))
        out["preempt"] = {"t_ms": np.array(p_t, dtype=float), "req": np.array(p_req, dtype=np.int64), "reason": p_why,
                          "freed_blocks": np.array(freed, dtype=np.int64)}
    return out
