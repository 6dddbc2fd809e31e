"""PagedAttention step by step: every request's logical blocks filling token by token and the
physical blocks they map to, one frame per scheduled step, from a trace's kv, step and batch
events (the paging animation).

Frame k is the moment step k is scheduled (its start time): block tables hold what the block
manager gave out by then (including the blocks step k will fill); a request's blocks store the
full blocks it took from the prefix cache plus the tokens of its steps that ended by then (a
preemption drops its cache). A last frame shows the end of the run. Tables and computed tokens
follow the rules of core.analysis.occupancy.block_tables_at and tokens_in_cache_at, in one pass (tests
compare them at every frame); physical block states come from core.analysis.occupancy.block_states.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from core.analysis.occupancy import Occupancy, block_states, drawn_blocks

MAX_FRAMES = 240
MAX_ROWS = 24            # requests drawn (those that hold blocks first)
MAX_LOGICAL = 32         # logical blocks drawn per request
MAX_PHYSICAL = 256       # physical blocks drawn
_TABLE_OPS = ("alloc", "hit", "cow", "cache")


@dataclass(slots=True)
class PagingFrames:
    times_ms: np.ndarray     # [F] frame times
    steps: list[int | None]  # [F] the step scheduled at the frame (None: the end)
    reqs: list[int]          # request index of each row drawn
    block: np.ndarray        # [F, rows, cols] physical block of each logical block (-1: none)
    fill: np.ndarray         # [F, rows, cols] tokens in the cache in that logical block
    occupancy: Occupancy     # physical block state, ref count, owner at each frame
    stories: list[str]       # [F] what changed since the previous frame
    block_size: int
    total_steps: int
    more_requests: int       # requests holding blocks that are not drawn

    @property
    def truncated(self) -> bool:
        return self.steps[-1] is not None and len(self.steps) < self.total_steps + 1


def _frame_times(trace, max_frames: int) -> tuple[np.ndarray, list, int]:
    st = trace.steps.sort_values("step", kind="stable")
    t0 = st["t_ms"].to_numpy(dtype=float)
    steps = st["step"].to_numpy().tolist()
    if len(steps) + 1 <= max_frames:
        end = float((t0 + st["dur_ms"].to_numpy(dtype=float)).max())
        return np.append(t0, end), steps + [None], len(steps)
    return t0[:max_frames], steps[:max_frames], len(steps)


def paging_frames(trace, block_size: int, max_frames: int = MAX_FRAMES, max_rows: int = MAX_ROWS,
                  max_logical: int = MAX_LOGICAL) -> PagingFrames | None:
    """Frames of the paging animation (None without kv or step events)."""
    kv, st = trace.kv, trace.steps
    if not len(kv) or not len(st):
        return None
    times, steps, total = _frame_times(trace, max_frames)
    F = len(times)
    ids = trace.ids

    tables, stories = _tables_at(kv, times)
    held, by_step = _tokens_held(trace, times, len(ids))

    # rows: requests in order of first holding a block; columns: logical blocks
    first_seen: dict[int, int] = {}
    for f, tb in enumerate(tables):
        for (r, _) in tb:
            first_seen.setdefault(r, f)
    rows_all = sorted(first_seen, key=lambda r: (first_seen[r], r))
    rows = rows_all[:max_rows]
    row_of = {r: k for k, r in enumerate(rows)}
    cols = min(max_logical, 1 + max((lg for tb in tables for (_, lg) in tb), default=0))
    block = np.full((F, len(rows), cols), -1, dtype=np.int64)
    fill = np.zeros((F, len(rows), cols), dtype=np.int64)
    for f, tb in enumerate(tables):
        # tokens stored: full blocks taken from the prefix cache, then the tokens computed since
        # the last preemption (core.analysis.occupancy.tokens_in_cache_at counts only the latter)
        stored = held[f].copy()
        for (r, _), (_, hit) in tb.items():
            stored[r] += block_size if hit else 0
        for (r, lg), (p, _) in tb.items():
            if r in row_of and lg < cols:
                block[f, row_of[r], lg] = p
                fill[f, row_of[r], lg] = min(max(int(stored[r]) - lg * block_size, 0), block_size)

    nb = min(MAX_PHYSICAL, drawn_blocks(trace))
    occ = block_states(trace, times_ms=times, num_blocks=nb)
    texts = [_story(steps[f], times[f], stories[f], ids, by_step.get(steps[f])) for f in range(F)]
    return PagingFrames(times, steps, rows, block, fill, occ, texts, block_size, total,
                        len(rows_all) - len(rows))


def _tables_at(kv, times):
    """Block tables ({(request, logical block): (physical block, from the prefix cache)}) at
    each frame time, and what happened since the previous frame: one pass over the kv events."""
    t_kv = kv["t_ms"].to_numpy(dtype=float)
    op = kv["op"].astype(str).to_numpy()
    req, logical, blk = (kv[c].to_numpy() for c in ("req", "logical", "block"))
    tables: list[dict[tuple[int, int], int]] = []
    stories: list[Counter] = []
    cur: dict[tuple[int, int], int] = {}
    i = 0
    for T in times:
        said = Counter()
        while i < len(t_kv) and t_kv[i] <= T:
            o, r, lg = op[i], int(req[i]), int(logical[i])
            if r >= 0 and lg >= 0:
                if o in _TABLE_OPS:   # (block, whether it came from the prefix cache)
                    hit = o == "hit" or (o == "cache" and cur.get((r, lg), (0, False))[1])
                    cur[(r, lg)] = (int(blk[i]), hit)
                elif o == "free":
                    cur.pop((r, lg), None)
            if o != "cache":
                said[(o, r)] += 1
            i += 1
        tables.append(dict(cur))
        stories.append(said)

    return tables, stories


def _tokens_held(trace, times, n_requests: int):
    """Tokens in the cache per request at each frame time (steps ended by then, after the
    request's last preemption), and each step's batch (requests, tokens, is prefill)."""
    st = trace.steps
    # tokens in the cache: steps ended by each frame time, after the request's last preemption
    order = st.sort_values("step", kind="stable")
    ends = (order["t_ms"] + order["dur_ms"]).to_numpy(dtype=float)
    step_ids = order["step"].to_numpy()
    b = trace.batch
    by_step: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if len(b):
        bs_step, bs_req, bs_tok = b["step"].to_numpy(), b["req"].to_numpy(), b["tokens"].to_numpy()
        srt = np.argsort(bs_step, kind="stable")
        cuts = np.flatnonzero(np.diff(bs_step[srt])) + 1
        bs_pre = np.asarray(b["kind"]) == "prefill"
        for part in np.split(srt, cuts):
            if len(part):
                by_step[int(bs_step[part[0]])] = (bs_req[part], bs_tok[part], bs_pre[part])
    pre = trace.preempts.sort_values("t_ms", kind="stable")
    pre_t, pre_r = pre["t_ms"].to_numpy(dtype=float), pre["req"].to_numpy()
    # a preemption at time p drops what the steps ended by p computed; later steps count again
    tok = np.zeros(n_requests, dtype=np.int64)
    # at a tie the step ends first: a preemption at p drops the step that ended at p too
    events = sorted([(float(e), 0, int(s)) for e, s in zip(ends, step_ids)]
                    + [(float(p), 1, int(r)) for p, r in zip(pre_t, pre_r)])
    held = []
    j = 0
    for T in times:
        while j < len(events) and events[j][0] <= T:
            _, kind, x = events[j]
            if kind == 1:
                tok[x] = 0
            elif x in by_step:
                r, n, _ = by_step[x]
                np.add.at(tok, r, n)
            j += 1
        held.append(tok.copy())

    return held, by_step


def _story(step, t, said: Counter, ids, batch) -> str:
    head = f"step {step} scheduled at {t:g} ms" if step is not None else f"end of the run at {t:g} ms"
    parts = []
    if batch is not None:
        r, n, pre = batch
        if pre.any():
            parts.append("prefill: " + ", ".join(f"{ids[a]} ({k})" for a, k in zip(r[pre][:4], n[pre][:4]))
                         + (" …" if pre.sum() > 4 else ""))
        if (~pre).any():
            parts.append(f"decode: {int((~pre).sum())} sequence(s) +1 token")
    for o, verb in (("alloc", "new blocks"), ("hit", "prefix-cache hits"), ("cow", "copied on write"),
                    ("free", "freed"), ("evict", "evicted")):
        who = [(r, n) for (oo, r), n in sorted(said.items()) if oo == o]
        if who:
            parts.append(f"{verb}: " + ", ".join(f"{ids[r]} {n}" if r >= 0 else f"{n}" for r, n in who[:6])
                         + (" …" if len(who) > 6 else ""))
    return " · ".join([head] + parts)
