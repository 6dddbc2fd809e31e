"""The record of a run: `StepLog` observes an engine core's EngineOutputs (`record`) and keeps
them as typed rows, turned into columns per record type by `log_records` (core.trace makes the
trace's tables of them, or a TraceWriter streams them). The scheduler writes nothing here: what is
recorded is exactly what the engine reported.

A simulator's decoders are not listed step by step: the log keeps each one's membership span
(request r decodes at decode counter values [a, b), output indices from e0) and the step each
counter value ran in; `log_records` turns them into span rows (core.trace.spans), expanded into
the rows stepping would have listed (placed by step and join number), or kept for a Parquet file.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from core.engine.kvlog import KVLog, spread
from core.engine.outputs import EngineOutputs, Finish, Preemption, StepRecord
from core.trace.spans import expand, order_key, span_rows


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
        # decoders are not counted) and (reqs, output index, t_ms, token ids or None: simulated, step)
        self.batch_parts: list[tuple] = []
        self.token_parts: list[tuple] = []
        self.finishes: list[Finish] = []
        self.preempts: list[Preemption] = []
        self.token_sources: list = []            # per token part: codes into TOKEN_SOURCES, or None (sampled)
        self.other: list[dict] = []              # verbatim events (spec, tiles)
        self.spans: list[tuple[int, int, int, int, int]] = []   # closed: (req, join, a, b, e0)
        if getattr(self, "counter_step", None):
            d = self.counter0 + len(self.counter_step)
            self.open = {r: (j, d, e0 + d - a) for r, (j, a, e0) in self.open.items()}
            self.counter0 = d
        self.counter_step: list[int] = []        # step of each counter value from counter0
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
                if type(rec.step) is range:   # a run of decode steps (Scheduler.advance)
                    self.counter_step.extend(rec.step)
                else:
                    self.counter_step.append(rec.step)
            if len(b.reqs):
                self.batch_parts.append((rec.step, b.reqs, b.num_tokens, b.is_prefill, b.join_no))
            if len(out.token_reqs):
                self.token_parts.append((out.token_reqs, out.token_index, out.t_ms, out.token_ids, rec.step))
                self.token_sources.append(out.token_sources)
            if out.events:
                self.other.extend(out.events)
        if out.entered:
            for r, j, a, e0 in out.entered:
                self.open[r] = (j, a, e0)


def _steps(entries: list) -> dict:
    """Entries are single steps or runs of decode steps (StepRecord), in order: starts, durations,
    running and KV used flattened; step numbers, waiting and the pool's size repeated by numpy."""
    cols: list[list] = [[], [], [], []]
    first, lens, wait, size = [], [], [], []   # per entry
    for e in entries:
        s, many = e[0], type(e[0]) is range
        for c, v in zip(cols, (e[1], e[2], e[3], e[5])):
            if many:
                c.extend(v)
            else:
                c.append(v)
        first.append(s.start if many else s)
        lens.append(len(s) if many else 1)
        size.append(e[6] if many else e[6] + e[5])   # the pool's size (free + used; -1 - used: not recorded)
        wait.append(e[4])
    n = np.array(lens, dtype=np.int64)
    t, d, run, used = (np.array(c, dtype=np.float64 if k < 2 else np.int64) for k, c in enumerate(cols))
    steps = np.repeat(np.array(first, dtype=np.int64) - (np.cumsum(n) - n), n) + np.arange(len(t))   # first + j
    return {"step": steps, "t_ms": t, "dur_ms": d, "running": run, "waiting": np.repeat(np.array(wait, np.int64), n),
            "kv_used_blocks": used, "kv_free_blocks": np.repeat(np.array(size, dtype=np.int64), n) - used}


def _token_columns(log, batch: dict | None, keyed: bool) -> dict:
    """The token rows' columns (keyed: each listed token's step, and join number from the batch's)."""
    reqs, index, t, ids, tstep = zip(*log.token_parts)
    lens = np.fromiter(map(len, reqs), np.int64, len(reqs))
    n_tok = int(lens.sum())
    tid = (spread([-1 if x is None else x for x in ids], lens, np.int64) if any(x is not None for x in ids)
           else np.full(n_tok, -1, dtype=np.int64))
    src = getattr(log, "token_sources", None)
    codes = (spread([0 if c is None else c for c in src], lens, np.int8) if src and any(c is not None for c in src)
             else np.zeros(n_tok, dtype=np.int8))
    tokens = {"t_ms": spread(list(t), lens, np.float64), "req": np.concatenate(reqs),
              "index": np.concatenate(index), "source": codes, "token_id": tid}
    if keyed:   # (a listed token's join number: its request's batch entry in that step)
        tokens["step"] = np.repeat(np.array(tstep, dtype=np.int64), lens)
        bkey = order_key(batch["step"], batch["req"])   # type: ignore[index]
        by = np.argsort(bkey, kind="stable")
        tokens["join"] = batch["join"][by][np.searchsorted(bkey[by], order_key(tokens["step"], tokens["req"]))]  # type: ignore[index]
    return tokens


def log_records(log, spans: bool = False) -> dict:
    """What the StepLog holds, as columns per record type: {rtype: {field: values}} for
    token, finish, step, batch, kv and preempt (types with no rows are left out). Enum fields
    are int8 codes into the field's values (schema.py); a KV hash column of None means no
    block was hashed. The decoders' rows are expanded (core.trace.spans.expand), or with `spans`
    kept as span rows beside the listed rows (their step and join numbers added: a Parquet file's
    decode spans). Builds nothing per row in Python."""
    out: dict[str, Any] = {}
    d_now = log.counter0 + len(log.counter_step)
    span = span_rows(log.spans + [(r, j, a, d_now, e0) for r, (j, a, e0) in log.open.items() if d_now > a],
                     log.counter0, log.counter_step)
    batch = tokens = None
    keyed = spans or span is not None   # (the listed rows' step and join numbers: their place among the spans)
    if log.batch_parts:
        step, reqs, n, pre, joins = zip(*log.batch_parts)
        lens = np.fromiter(map(len, reqs), np.int64, len(reqs))
        batch = {"step": np.repeat(np.array(step, dtype=np.int64), lens), "req": np.concatenate(reqs),
                 "tokens": np.concatenate(n), "kind": np.concatenate(pre).astype(np.int8)}
        if keyed:
            batch["join"] = np.concatenate([np.asarray(j, dtype=np.int64) if j is not None else np.full(m, -1, np.int64)
                                            for j, m in zip(joins, lens.tolist())])
    if log.token_parts:
        tokens = _token_columns(log, batch, keyed)
    steps = _steps(log.steps) if log.steps else None
    if span is not None:
        if spans:
            out["span"] = span
        else:
            tokens, batch = expand(span, steps, tokens, batch, "step log")   # type: ignore[arg-type]
    if tokens is not None:
        out["token"] = tokens
    if log.finishes:
        f_req, f_t, f_why = (list(c) for c in list(zip(*log.finishes))[:3])   # (req, t_ms, reason, ...)
        out["finish"] = {"t_ms": np.array(f_t, dtype=float), "req": np.array(f_req, dtype=np.int64), "reason": f_why}
    if steps is not None:
        out["step"] = steps
        if batch is not None:
            out["batch"] = batch
    if log.kv is not None and not log.kv.empty():
        out["kv"] = log.kv.columns()
    if log.preempts:
        p_req, p_t, p_why, freed = (list(c) for c in zip(*log.preempts))
        out["preempt"] = {"t_ms": np.array(p_t, dtype=float), "req": np.array(p_req, dtype=np.int64), "reason": p_why,
                          "freed_blocks": np.array(freed, dtype=np.int64)}
    return out
