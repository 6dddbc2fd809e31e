"""What the replay page reads of a trace, behind one interface (`TraceView`) that a trace in memory
(`InMemoryView`) and a trace too large to load (core.analysis.overview.Overview) both implement
(equal results: tests/test_overview.py); and what the page shows at a time cursor
(`cursor_panels`): which panels, for which requests, with which numbers at the cursor, decided
here so that the page only draws them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from core.analysis import cursor as cur
from core.analysis.metrics import request_metrics, summarize
from core.trace.model import Trace, counted_steps_of

NEAR_REQUESTS = 150      # a large trace's timeline draws the requests nearest the cursor
PHASE_REQUESTS = 16      # the engine-phases chart: requests nearest the cursor


class TraceView(Protocol):
    """What the cursor views read; the same calls on a trace in memory and on an overview."""
    skeleton: Trace          # the trace (an overview: without its token and batch rows)

    def summary(self) -> dict: ...
    def request_metrics(self) -> pd.DataFrame: ...
    def span(self) -> tuple[float, float]: ...
    def in_flight(self) -> pd.DataFrame: ...
    def window(self, req_idx) -> Trace: ...
    def step_at(self, t_ms: float) -> tuple[dict | None, pd.DataFrame]: ...
    def occupancy(self): ...
    def kv_counts_at(self, t_ms: float) -> dict: ...
    def counted_steps(self) -> bool: ...
    def prefix_cache(self): ...

    @property
    def has_kv(self) -> bool: ...


def _prefix_cache(trace: Trace):
    from core.analysis.kv_events import cache_over_time
    return cache_over_time(trace.kv_events)


def _occupancy(trace: Trace):
    from core.analysis.occupancy import block_states
    return block_states(trace, max_snapshots=160)


# Per-trace results that do not depend on the cursor, computed once per trace (the app caches them
# across sessions by passing its own `cache`)
DERIVED: dict[str, Callable[[Trace], Any]] = {
    "summary": lambda tr: summarize(tr, per_request=False), "requests": request_metrics,
    "in_flight": cur.in_flight_series, "rows": cur.row_index, "span": cur.time_range,
    "prefix_cache": _prefix_cache, "occupancy": _occupancy}


class InMemoryView:
    """A TraceView of a trace in memory. `big`: the step at the cursor is found through the rows'
    index (a large trace). `cache(trace, what)`: where the per-trace results come from (default:
    computed once here)."""

    def __init__(self, trace: Trace, big: bool, cache: Callable[[Trace, str], Any] | None = None):
        self.skeleton, self.big = trace, big
        self._cache = cache
        self._held: dict[str, Any] = {}

    def _get(self, what: str):
        if self._cache is not None:
            return self._cache(self.skeleton, what)
        if what not in self._held:
            self._held[what] = DERIVED[what](self.skeleton)
        return self._held[what]

    def summary(self) -> dict:
        return self._get("summary")

    def request_metrics(self) -> pd.DataFrame:
        return self._get("requests")

    def span(self) -> tuple[float, float]:
        return self._get("span")

    def in_flight(self) -> pd.DataFrame:
        return self._get("in_flight")

    def window(self, req_idx) -> Trace:
        return cur.subset(self.skeleton, req_idx, self._get("rows"))

    def step_at(self, t_ms: float):
        return cur.step_at(self.skeleton, t_ms, self._get("rows") if self.big else None)

    @property
    def has_kv(self) -> bool:
        return bool(len(self.skeleton.kv))

    def occupancy(self):
        return self._get("occupancy") if self.has_kv else None

    def kv_counts_at(self, t_ms: float) -> dict:
        """Blocks in each state at `t_ms` itself (the grid's snapshots fall where each trace's own events
        put them: two traces of one run, a fleet and its replicas, would say different things at one
        cursor); a large trace: at the snapshot at or before it."""
        occ = self.occupancy()
        if self.big:
            return occ.at(occ.index_at(t_ms))
        from core.analysis.occupancy import block_states
        return block_states(self.skeleton, [t_ms], num_blocks=occ.num_blocks).at(0)

    def counted_steps(self) -> bool:
        tr = self.skeleton
        return counted_steps_of(tr.steps, bool(len(tr.batch)))

    def prefix_cache(self):
        return self._get("prefix_cache") if len(self.skeleton.kv_events) else None


@dataclass
class CursorPanels:
    """What the replay page draws at a cursor.
    left: "counted_steps" (an engine's iteration log: counts per step) | "in_flight" (no steps) |
    "batch" (the step's batch entries); right: "kv" (block occupancy) | "gauges" (the server's own
    /metrics) | "none". The in-flight chart is drawn below when the left shows the step."""
    cursor_ms: float
    shown: Trace                          # the requests the timeline draws
    shown_note: str | None                # what part of the trace that is
    step: dict | None                     # the step at the cursor
    batch: pd.DataFrame                   # its batch entries
    left: str
    right: str
    occupancy: Any = None                 # core.analysis.occupancy.Occupancy (right == "kv")
    kv_index: int | None = None           # the snapshot at the cursor
    kv_counts: dict | None = None         # blocks per state at the cursor
    in_flight_below: bool = False
    flight_at: tuple[int, int] | None = None   # (running, waiting) at the cursor (a large trace's caption)
    gauges: list = field(default_factory=list)
    gauges_below: bool = False
    prefix_cache: Any = None              # core.analysis.kv_events cache_over_time (the engine's KV events)
    prefix_at: dict | None = None
    phase_requests: list[int] = field(default_factory=list)   # requests whose engine phases are drawn


def has_engine_phases(trace: Trace) -> bool:
    """Requests carry the engine's own phases (merged spans)."""
    return any("engine_prefill_ms" in e or "engine_queue_ms" in e for e in trace.request_extra[:200])


def cursor_panels(view: TraceView, t_ms: float, big: bool) -> CursorPanels:
    """Everything the cursor views show at `t_ms`; `big`: the timeline draws the NEAR_REQUESTS
    requests nearest the cursor and the large charts are drawn without the cursor line."""
    tr = view.skeleton
    shown, note = tr, None
    if big:
        idx = cur.requests_near(tr, t_ms, limit=NEAR_REQUESTS, metrics=view.request_metrics())
        shown = view.window(idx)
        note = f"the {len(idx)} of {len(tr.requests):,} requests nearest the cursor (in flight first)"
    row, batch = view.step_at(t_ms)
    left = "in_flight" if row is None else "counted_steps" if view.counted_steps() else "batch"
    gauges = tr.events_of("gauge")
    p = CursorPanels(t_ms, shown, note, row, batch, left, "kv" if view.has_kv else "gauges" if gauges else "none",
                     gauges=gauges, in_flight_below=row is not None, gauges_below=view.has_kv and bool(gauges))
    if p.right == "kv":
        p.occupancy = occ = view.occupancy()
        p.kv_index = occ.index_at(t_ms)
        p.kv_counts = view.kv_counts_at(t_ms)
    if p.in_flight_below and big:
        flight = view.in_flight()
        if len(flight):
            k = max(int(np.searchsorted(flight["t_ms"].to_numpy(), t_ms, side="right")) - 1, 0)
            p.flight_at = (int(flight["running"].iloc[k]), int(flight["waiting"].iloc[k]))
    prefix = view.prefix_cache()
    if prefix is not None:
        from core.analysis.kv_events import cache_at
        p.prefix_cache, p.prefix_at = prefix, cache_at(prefix, t_ms)
    if has_engine_phases(tr):
        p.phase_requests = sorted(cur.requests_near(tr, t_ms, limit=PHASE_REQUESTS,
                                                    metrics=view.request_metrics()).tolist())
    return p


OPTIONAL_VIEWS = (("spec", "speculative acceptance per position (`spec` events)"),
                  ("tiles", "per-tile attention statistics (`tiles` events)"))


def missing_views(trace: Trace) -> list[str]:
    """The optional views this trace has no events for (said on the page, not left blank)."""
    return [what for typ, what in OPTIONAL_VIEWS if not trace.events_of(typ)]
