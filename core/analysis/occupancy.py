"""Block states over time from a trace's `kv` events (occupancy views), and the KV
accounting the paging page shows (block tables, slots held vs reserved, op counts).

Each physical block is, at any moment, one of
    FREE      - unreferenced, holds nothing worth keeping
    CACHED    - unreferenced but still holds a cached prefix (a later hit can revive it)
    OWNED     - referenced by exactly one sequence
    SHARED    - referenced by more than one sequence (prefix hit or fork)
The state of a block at time t is decided by its last kv event at or before t (events at
the same time keep their recorded order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.formulas.kv import Reservation
from core.order import stable_order
from core.trace.schema import MAX_KV_BLOCKS

FREE, CACHED, OWNED, SHARED = 0, 1, 2, 3
STATE_NAMES = ("free", "cached-free", "owned", "shared")


@dataclass(slots=True)
class Occupancy:
    times_ms: np.ndarray     # [S] snapshot times
    state: np.ndarray        # [B, S] one of FREE/CACHED/OWNED/SHARED
    ref: np.ndarray          # [B, S] reference count
    owner: np.ndarray        # [B, S] request index of the last sequence to take the block (-1 none)
    num_blocks: int

    def at(self, j: int) -> dict:
        """Counts of each state at snapshot j."""
        s = self.state[:, j]
        return {name: int((s == k).sum()) for k, name in enumerate(STATE_NAMES)}

    def busiest(self) -> int:
        """The first snapshot with the most blocks held by sequences (a view's natural start:
        the last snapshot of a finished run has every block free)."""
        if not self.state.size:
            return 0
        return int(np.argmax((self.state >= OWNED).sum(axis=0)))

    def index_at(self, t_ms: float) -> int:
        """The last snapshot at or before t (the first one before any)."""
        j = int(np.searchsorted(self.times_ms, t_ms, side="right")) - 1
        return min(max(j, 0), max(len(self.times_ms) - 1, 0))

    def refs_at(self, j: int) -> dict[int, int]:
        """Reference count of every block at snapshot j."""
        return dict(enumerate(self.ref[:, j].tolist()))


def snapshot_times(trace, max_snapshots: int = 200) -> np.ndarray:
    """Step start times (or kv event times if there are no steps), thinned evenly."""
    if len(trace.steps):
        t = trace.steps["t_ms"].to_numpy()
    else:
        t = np.unique(trace.kv["t_ms"].to_numpy())
    return thinned_snapshots(t, trace.tokens["t_ms"].max() if len(trace.tokens) else None, max_snapshots)


def thinned_snapshots(t: np.ndarray, last_token_ms: float | None, max_snapshots: int) -> np.ndarray:
    """snapshot_times from the candidate times (step starts, or kv event times) and the last token's."""
    if last_token_ms is not None:
        t = np.append(t, last_token_ms)
    t = np.unique(t)
    if len(t) > max_snapshots:
        t = t[np.linspace(0, len(t) - 1, max_snapshots).round().astype(int)]
    return t


# Blocks x snapshots held at once (state, ref count, owner: ~13 bytes a cell, ~110 MB): two
# snapshots of the largest pool a trace may name (core.trace.schema.MAX_KV_BLOCKS).
MAX_CELLS = 2 * MAX_KV_BLOCKS


MAX_POOL_DRAWN = 512     # a pool this small is drawn whole, its never-used blocks free


def drawn_blocks(trace, limit: int = MAX_POOL_DRAWN) -> int:
    """How many physical blocks a view of the trace's pool draws: the whole pool when the trace
    records its size (`meta.engine.kv_blocks`) and it is at most `limit` blocks, so a pool of 64
    is drawn as 64 even when a run touched 33; otherwise only the blocks ever touched (with a huge
    or unsized pool the rest stay free forever, and the allocator hands out the lowest ids first)."""
    kv = trace.kv
    return blocks_drawn(int(kv["block"].max() + 1) if len(kv) else 0, trace.meta, limit)


def blocks_drawn(touched: int, meta, limit: int = MAX_POOL_DRAWN) -> int:
    """drawn_blocks from the number of blocks touched and the trace's meta (a fleet seen as one,
    core.analysis.cursor.fleet_as_one: its replicas' drawn blocks side by side, meta.kv_blocks_drawn)."""
    fleet = meta.get("kv_blocks_drawn") if isinstance(meta, dict) else None
    if isinstance(fleet, int) and not isinstance(fleet, bool) and fleet >= touched:
        return fleet
    engine = meta.get("engine") if isinstance(meta, dict) else None
    pool = engine.get("kv_blocks") if isinstance(engine, dict) else None
    if isinstance(pool, int) and not isinstance(pool, bool) and touched <= pool <= limit:
        return pool
    return touched


def block_states(trace, times_ms=None, num_blocks: int | None = None, max_snapshots: int = 200) -> Occupancy:
    """Each block's state, ref count and owner at each snapshot time (default: `snapshot_times`)."""
    kv = trace.kv
    times = snapshot_times(trace, max_snapshots) if times_ms is None else np.asarray(times_ms, dtype=float)
    grid = OccupancyGrid(times, drawn_blocks(trace) if num_blocks is None else num_blocks)
    if len(kv):
        # op as category codes: comparing 3 M Python strings cost more than the rest together
        op_cat = kv["op"].astype("category")
        grid.add(kv["block"].to_numpy(), kv["ref"].to_numpy(), kv["req"].to_numpy(), kv["t_ms"].to_numpy(),
                 op_cat.cat.codes.to_numpy(), list(op_cat.cat.categories), kv["hash"].notna().to_numpy())
    return grid.occupancy()


class OccupancyGrid:
    """Block states at snapshot times, filled from kv events given in recorded order, all at
    once or in consecutive chunks (a trace larger than memory: core/analysis/overview.py): the
    cell (block, snapshot) takes its block's last event at or before the snapshot, so a later
    chunk's event overwrites an earlier chunk's, and a block's owner (the last sequence to take
    it) carries from one chunk to the next."""

    def __init__(self, times_ms, num_blocks: int):
        times = np.asarray(times_ms, dtype=float)
        if num_blocks * len(times) > MAX_CELLS and len(times) > 2:
            # Bounded memory (~13 bytes a cell): fewer snapshots, evenly spread, first and last kept.
            keep = np.unique(np.linspace(0, len(times) - 1, max(2, MAX_CELLS // max(num_blocks, 1)))
                             .round().astype(int))
            times = times[keep]
        self.times, self.B = times, num_blocks
        B, S = num_blocks, len(times)
        self.state = np.zeros((B, S), dtype=np.int8)
        self.ref = np.zeros((B, S), dtype=np.int32)
        self.owner = np.full((B, S), -1, dtype=np.int64)
        self.taker = np.full(B, -1, dtype=np.int64)      # request of each block's last take so far (-1 none)
        by_time = np.argsort(times, kind="stable")       # times as given may be in any order
        self._sorted = times[by_time]
        self._rank = np.empty(S, dtype=np.int64)
        self._rank[by_time] = np.arange(S)

    def add(self, blk, r, req, t, op, op_names: list, has_hash):
        """Events in recorded order (after every event added before): block, ref count, request,
        time, op as codes into `op_names`, whether the event names a hash."""
        B, S = self.B, len(self.times)
        if not len(blk) or not S or not B:
            return
        code = {c: i for i, c in enumerate(op_names)}
        is_op = lambda *names: np.isin(op, [code[n] for n in names if n in code])
        takes = is_op("alloc", "hit", "cow", "cache")
        ev_state = np.where(r > 1, SHARED, np.where(r == 1, OWNED, np.where(has_hash & is_op("free"), CACHED, FREE)))
        ev_state[is_op("evict")] = FREE
        order = stable_order(blk)    # by block, then recorded order
        blk_s = blk[order]
        # One search for every (block, snapshot): events keyed by (block, the first snapshot at or
        # after the event); the last event at or before snapshot s is the last whose key is <= the
        # key (block, s).
        span = S + 1
        key = blk_s.astype(np.int64) * span + np.searchsorted(self._sorted, t[order], side="left")
        bb = np.arange(B, dtype=np.int64)
        q = bb[:, None] * span + self._rank[None, :]
        last = np.searchsorted(key, q.ravel(), side="right") - 1
        # the cell has an event when that last event is its own block's (not an earlier block's)
        ok = last >= np.repeat(np.searchsorted(blk_s, bb, side="left"), S)
        cells = np.flatnonzero(ok)                        # row-major (block, snapshot) cells with an event
        lo = last[cells]                                  # events in block order: gathers stay local
        st = ev_state[order].astype(np.int8)[lo]
        self.state.reshape(-1)[cells] = st
        self.ref.reshape(-1)[cells] = r[order].astype(np.int32)[lo]
        # owner: the last taking event (alloc/hit/cow/cache) of the same block up to each event;
        # a block's first event here is a mark too, so a take is found only within its block, and
        # before its first take here the block's owner is the one carried from earlier events
        takes_s = takes[order]
        req_s = req[order]
        n = len(order)
        first = np.r_[True, blk_s[1:] != blk_s[:-1]]
        mark = np.maximum.accumulate(np.where(takes_s | first, np.arange(n), -1))
        took = np.where(takes_s[np.maximum(mark, 0)] & (mark >= 0), mark, -1)
        carried = self.taker[np.minimum(blk_s, B - 1)]   # (events of blocks past B fill no cell)
        who = np.where(took >= 0, req_s[np.maximum(took, 0)], carried)
        o = who[lo]
        self.owner.reshape(-1)[cells] = np.where(st >= OWNED, o, -1)
        ends = np.r_[np.flatnonzero(blk_s[1:] != blk_s[:-1]), n - 1]     # each block's last event here
        inside = blk_s[ends] < B
        self.taker[blk_s[ends][inside]] = who[ends][inside]

    def occupancy(self) -> Occupancy:
        return Occupancy(self.times, self.state, self.ref, self.owner, self.B)


def block_tables_at(trace, t_ms: float) -> dict[int, list[int]]:
    """Each sequence's block table (logical -> physical) at time t, from kv events: the last
    event for each (sequence, logical block) decides; a `free` means it is gone."""
    kv = trace.kv
    if not len(kv):
        return {}
    keep = (kv["t_ms"].to_numpy() <= t_ms) & (kv["req"].to_numpy() >= 0) & (kv["logical"].to_numpy() >= 0)
    ev = kv.loc[keep, ["op", "req", "logical", "block"]]
    ev = ev[ev["op"].isin(["alloc", "hit", "cow", "cache", "free"])]
    last = ev.drop_duplicates(subset=["req", "logical"], keep="last")
    last = last[last["op"] != "free"].sort_values(["req", "logical"])
    out: dict[int, list[int]] = {}
    for r, g in last.groupby("req", sort=True)["block"]:
        out[int(r)] = g.tolist()
    return out


def tokens_in_cache_at(trace, t_ms: float) -> dict[int, int]:
    """Tokens each sequence has computed into KV by time t: the tokens of its steps that ended
    by t, counting only steps after its last preemption (a preemption drops its cache)."""
    st, b = trace.steps, trace.batch
    if not len(st):
        return {}
    ended = st.loc[(st["t_ms"] + st["dur_ms"]) <= t_ms, ["step", "t_ms"]]
    done = b.merge(ended, on="step", how="inner")
    pre = trace.preempts[trace.preempts["t_ms"] <= t_ms]
    if len(pre):
        last_pre = pre.groupby("req")["t_ms"].max()
        cut = last_pre.reindex(done["req"]).to_numpy()
        done = done[~(done["t_ms"].to_numpy() < np.nan_to_num(cut, nan=-1.0))]
    sums = done.groupby("req")["tokens"].sum()
    return {int(r): int(n) for r, n in sums.items()}


# ---- KV accounting for the paging page ------------------------------------------------------

KV_OPS = ("alloc", "hit", "cache", "evict", "cow")


@dataclass(slots=True)
class SlotsHeld:
    """KV slots (token positions) held at one time by up to `limit` sequences holding blocks. For each:
    slots = its blocks x block_size; stored = the tokens whose KV is in them (full blocks taken from the
    prefix cache, then the tokens its finished steps computed since its last preemption); writing = slots
    handed out for the tokens of the step running at that time (allocated at the step's start, filled at
    its end); the rest of the slots are the last block's empty tail."""
    reqs: list[int]                 # request indices, ascending
    tables: dict[int, list[int]]    # request index -> physical blocks
    tokens: list[int]               # tokens stored per sequence (prefix-cache hits + computed; <= its slots)
    from_cache: list[int]           # of which in blocks taken from the prefix cache
    writing: list[int]              # empty slots the running step is filling
    paged_slots: list[int]          # blocks held x block_size per sequence
    max_len: int                    # contiguous reservation per sequence: longest prompt + max output
    totals: Reservation             # over the same sequences

    @property
    def tail_empty(self) -> int:
        """Empty slots not being written by a running step (the last blocks' unused tails)."""
        return sum(p - t - w for p, t, w in zip(self.paged_slots, self.tokens, self.writing))


def cached_blocks_at(trace, t_ms: float) -> dict[int, int]:
    """Per sequence: how many blocks of its table at time t it took from the prefix cache (the last
    alloc/hit/cow/free event of each of its logical blocks is a hit)."""
    kv = trace.kv
    if not len(kv):
        return {}
    keep = (kv["t_ms"].to_numpy() <= t_ms) & (kv["req"].to_numpy() >= 0) & (kv["logical"].to_numpy() >= 0)
    ev = kv.loc[keep, ["op", "req", "logical"]]
    ev = ev[ev["op"].isin(["alloc", "hit", "cow", "free"])].drop_duplicates(subset=["req", "logical"], keep="last")
    hits = ev[ev["op"] == "hit"].groupby("req").size()
    return {int(r): int(n) for r, n in hits.items()}


def tokens_in_flight_at(trace, t_ms: float) -> dict[int, int]:
    """Tokens each sequence has in the step running at time t (started by t, ending after it)."""
    st, b = trace.steps, trace.batch
    if not len(st):
        return {}
    t0 = st["t_ms"].to_numpy(dtype=float)
    running = st.loc[(t0 <= t_ms) & (t0 + st["dur_ms"].to_numpy(dtype=float) > t_ms), ["step"]]
    sums = b.merge(running, on="step", how="inner").groupby("req")["tokens"].sum()
    return {int(r): int(n) for r, n in sums.items()}


def slots_held_at(trace, t_ms: float, block_size: int, limit: int = 24) -> SlotsHeld:
    tables = block_tables_at(trace, t_ms)
    computed = tokens_in_cache_at(trace, t_ms)
    hits = cached_blocks_at(trace, t_ms)
    flying = tokens_in_flight_at(trace, t_ms)
    reqs = sorted(tables)[:limit]
    req = trace.requests
    max_len = int((req["prompt_tokens"] + req["max_output_tokens"]).max()) if len(req) else 0
    slots = [len(tables[r]) * block_size for r in reqs]
    cached = [min(hits.get(r, 0) * block_size, s) for r, s in zip(reqs, slots)]
    tokens = [min(c + computed.get(r, 0), s) for r, c, s in zip(reqs, cached, slots)]
    writing = [min(flying.get(r, 0), s - n) for r, n, s in zip(reqs, tokens, slots)]
    total = Reservation(sum(tokens), sum(slots), max_len * len(reqs))
    return SlotsHeld(reqs, {r: tables[r] for r in reqs}, tokens, cached, writing, slots, max(max_len, 0), total)


def kv_op_counts(trace) -> dict[str, int]:
    """Number of kv events of each op in KV_OPS, plus preemptions."""
    counts = trace.kv["op"].value_counts()
    return {**{op: int(counts.get(op, 0)) for op in KV_OPS}, "preemptions": len(trace.preempts)}


def prefill_tokens(trace) -> tuple[int, int]:
    """(prompt tokens computed by prefill steps, prompt tokens of all requests). Computed can be
    fewer (prefix-cache hits) or more (recomputation after preemption)."""
    b = trace.batch
    computed = int(b.loc[b["kind"] == "prefill", "tokens"].sum()) if len(b) else 0
    return computed, int(trace.requests["prompt_tokens"].sum())


def evictions_and_preemptions(trace, max_rows: int = 200) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(preemptions with request ids, the first `max_rows` evict/cow kv events)."""
    ids, pre = trace.ids, trace.preempts
    preempts = pd.DataFrame({"t_ms": pre["t_ms"], "request": [ids[r] for r in pre["req"]],
                             "freed blocks": pre["freed_blocks"]})
    return preempts, trace.kv[trace.kv["op"].isin(["evict", "cow"])].head(max_rows)
