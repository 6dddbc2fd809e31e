"""Batch seats step by step: which request holds each seat of the running batch at every
forward step, from a trace's step, batch and preempt events (the slot-grid animation).

A request takes a seat at the first step that computes any of its tokens and keeps it
through its last step, or until it is preempted (its next step after a preemption starts a
new stay). A freed seat is given to the next request that starts, lowest seat number first,
so under continuous batching a finished request's seat is refilled at the next step; under
static batching the seats of finished requests stay empty until the whole batch is done.
Within a stay, a step that computes none of the request's tokens (a budget-limited step)
shows the seat as held but idle.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

EMPTY, PREFILL, DECODE, HELD = 0, 1, 2, 3
MAX_STEPS = 240        # steps (animation frames) shown; a longer run shows its first MAX_STEPS
MAX_SEATS = 64         # seats drawn; a larger batch is refused (the timeline views serve it)


@dataclass(slots=True)
class SlotGrid:
    steps: np.ndarray        # [S] step numbers shown (the run's first S steps)
    t_ms: np.ndarray         # [S] step start times
    dur_ms: np.ndarray       # [S] step durations
    req: np.ndarray          # [seats, S] request index in the seat (-1: empty)
    kind: np.ndarray         # [seats, S] EMPTY / PREFILL / DECODE / HELD
    tokens: np.ndarray       # [seats, S] tokens the seat's request computes in the step
    total_steps: int         # steps in the whole run
    capacity: int | None     # the engine's max running sequences, when the trace states it

    @property
    def seats(self) -> int:
        return self.req.shape[0]

    @property
    def truncated(self) -> bool:
        return len(self.steps) < self.total_steps

    def busy(self) -> np.ndarray:
        """Seats computing tokens at each step."""
        return ((self.kind == PREFILL) | (self.kind == DECODE)).sum(axis=0)

    def idle_fraction(self) -> float:
        """Share of seat-steps computing nothing (empty or held), over the steps shown and
        the seats drawn."""
        return 1.0 - float(self.busy().sum()) / self.kind.size if self.kind.size else 0.0


def _stays(req: np.ndarray, step: np.ndarray, step_t: np.ndarray, preempts) -> np.ndarray:
    """Per batch row, its stay number: how many times its request was preempted at or before
    the start of the row's step."""
    stay = np.zeros(len(req), dtype=np.int64)
    if preempts is None or not len(preempts):
        return stay
    p_req, p_t = preempts["req"].to_numpy(), preempts["t_ms"].to_numpy(dtype=float)
    for r in np.unique(p_req):
        rows = np.flatnonzero(req == r)
        stay[rows] = np.searchsorted(np.sort(p_t[p_req == r]), step_t[rows], side="right")
    return stay


def slot_grid(trace, max_steps: int = MAX_STEPS, max_seats: int = MAX_SEATS) -> SlotGrid | None:
    """The seats of `trace`'s first `max_steps` steps (None without step and batch events, or
    when more than `max_seats` seats would be needed)."""
    st, b = trace.steps, trace.batch
    if not len(st) or not len(b):
        return None
    order = np.argsort(st["step"].to_numpy(), kind="stable")
    all_steps = st["step"].to_numpy()[order]
    shown = all_steps[:max_steps]
    t = st["t_ms"].to_numpy(dtype=float)[order][: len(shown)]
    dur = st["dur_ms"].to_numpy(dtype=float)[order][: len(shown)]
    running = st["running"].to_numpy()[order][: len(shown)]
    if len(running) and int(running.max()) > max_seats:    # refused before touching the batch rows
        return None
    col_of = {int(s): j for j, s in enumerate(shown)}

    step = b["step"].to_numpy()
    keep = step <= shown[-1]                     # the shown steps are the first ones
    req, step = b["req"].to_numpy()[keep], step[keep]
    kind = np.where(np.asarray(b["kind"])[keep] == "prefill", PREFILL, DECODE)
    tokens = b["tokens"].to_numpy()[keep]
    col = np.array([col_of[int(s)] for s in step], dtype=np.int64)
    stay = _stays(req, step, t[col], trace.preempts)

    # one interval [first column, last column] per (request, stay), seated greedily in start order
    spans: dict[tuple[int, int], list[int]] = {}
    for r, k, c in zip(req.tolist(), stay.tolist(), col.tolist()):
        s = spans.setdefault((r, k), [c, c])
        s[0], s[1] = min(s[0], c), max(s[1], c)
    seat_of: dict[tuple[int, int], int] = {}
    free: list[int] = []
    busy: list[tuple[int, int]] = []        # (last column, seat)
    seats = 0
    for key, (c0, c1) in sorted(spans.items(), key=lambda kv: (kv[1][0], kv[0])):
        while busy and busy[0][0] < c0:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            seat = heapq.heappop(free)
        else:
            seat, seats = seats, seats + 1
            if seats > max_seats:
                return None
        seat_of[key] = seat
        heapq.heappush(busy, (c1, seat))

    capacity = (trace.meta.get("engine") or {}).get("max_seqs")
    capacity = int(capacity) if isinstance(capacity, int) and capacity > 0 else None
    rows = max(seats, capacity if capacity is not None and capacity <= max_seats else 0)
    S = len(shown)
    g_req = np.full((rows, S), -1, dtype=np.int64)
    g_kind = np.zeros((rows, S), dtype=np.int8)
    g_tok = np.zeros((rows, S), dtype=np.int64)
    for (r, k), (c0, c1) in spans.items():       # held through the stay, then the computed steps
        s = seat_of[(r, k)]
        g_req[s, c0:c1 + 1] = r
        g_kind[s, c0:c1 + 1] = HELD
    seat = np.array([seat_of[(r, k)] for r, k in zip(req.tolist(), stay.tolist())], dtype=np.int64)
    g_kind[seat, col] = kind
    g_tok[seat, col] = tokens
    return SlotGrid(shown, t, dur, g_req, g_kind, g_tok, len(all_steps), capacity)


def step_story(grid: SlotGrid, ids: list[str], j: int) -> str:
    """One line on what happens at column j: who is computed (prefill / decode), who took a
    seat, whose seat was freed after the previous step."""
    def names(mask) -> str:
        return ", ".join(ids[r] for r in grid.req[mask, j]) or "—"

    now = grid.req[:, j]
    before = grid.req[:, j - 1] if j else np.full(grid.seats, -1)
    started = (now >= 0) & (now != before)
    freed = (before >= 0) & ~np.isin(before, now)
    parts = [f"step {int(grid.steps[j])} at {grid.t_ms[j]:g} ms",
             f"prefill: {names(grid.kind[:, j] == PREFILL)}", f"decode: {names(grid.kind[:, j] == DECODE)}"]
    if started.any():
        parts.append(f"seated: {names(started)}")
    if freed.any():
        parts.append("freed: " + ", ".join(ids[r] for r in before[freed]))
    busy = int(((grid.kind[:, j] == PREFILL) | (grid.kind[:, j] == DECODE)).sum())
    parts.append(f"{busy}/{grid.seats} seats busy")
    return " · ".join(parts)
