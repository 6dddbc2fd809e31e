"""Replicas' traces placed on one clock, from what each records of its own (meta.clock), never
assumed: a fleet merge of replicas that ran apart (each `gpu_runner serve`, each vLLM server
merged with its own files) needs every replica's time 0 on a common clock.

What a trace's clock says (meta.clock: kind, t0_s, resolution_ms, and for a monotonic clock the
host's boot id and the wall-clock instant of its origin):
- one host's monotonic clock (kind perf_counter with the same boot_id): exact, the difference of
  the origins (gpu_runner serve on one host; two processes read the same CLOCK_MONOTONIC);
- epoch clocks (kind epoch, or a monotonic origin's epoch_t0_s): the difference of the epoch
  origins, as good as the hosts' clock sync (exact on one host);
- local wall clocks without a zone (kind wall-clock: vLLM's iteration log) only among themselves;
- simulated traces without a clock: one virtual clock whose 0 is the workload's start.
A replica that cannot be placed is refused in one line naming it and what it lacks."""
from __future__ import annotations

from dataclasses import dataclass

from core.errors import TraceError

EPOCH_HOW = ("epoch clocks: the difference of their origins (exact on one host; across hosts as good as their clock "
             "sync)")


@dataclass(frozen=True)
class Placement:
    """Where each replica's time 0 sits on the common clock (whose 0 is the earliest replica's)."""
    offsets_ms: list[float]
    uncertainty_ms: float | None     # None: not known (offsets given)
    how: str
    clock: dict | None          # the common clock (meta.clock of the merged trace), None: virtual
    own_ms: tuple[float, ...] = ()   # each replica's own files' alignment within it (a merged server's: its log's)

    def rows(self, names: list[str]) -> list[dict]:
        """One row per replica; its uncertainty: the placement's, or its own files' where larger."""
        own = list(self.own_ms) + [0.0] * (len(names) - len(self.own_ms))
        rows = []
        for k, (n, off) in enumerate(zip(names, self.offsets_ms)):
            unc, how = self.uncertainty_ms, self.how
            if unc is not None and own[k] > unc:
                unc = own[k]
                how = f"{how}; within it, its own files placed on its clock ± {unc:.3g} ms (its log by its spans)"
            rows.append({"replica": k, "file": n, "offset_ms": off, "how": how, "uncertainty_ms": unc})
        return rows


def _t0(c: dict, key: str = "t0_s") -> float | None:
    v = c.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _resolution(clocks: list[dict]) -> float:
    return max(float(c.get("resolution_ms") or 0.0) for c in clocks)


def _placed(origins: list[float], clocks: list[dict], how: str, base: dict) -> Placement:
    t0 = min(origins)
    k0 = origins.index(t0)
    clock = {**clocks[k0], **base, "t0_s": t0}
    return Placement([(o - t0) * 1000.0 for o in origins], _resolution(clocks), how, clock)


def _same_host(clocks: list[dict]) -> Placement | None:
    boots = {c.get("boot_id") for c in clocks}
    if all(c.get("kind") == "perf_counter" for c in clocks) and len(boots) == 1 and None not in boots:
        origins = [_t0(c) for c in clocks]
        if None not in origins:
            return _placed(origins, clocks, f"one host's monotonic clock (boot {next(iter(boots))}): the difference "
                           "of the origins", {})
    return None


def _epoch(clocks: list[dict]) -> Placement | None:
    origins = [_t0(c) if c.get("kind") == "epoch" else _t0(c, "epoch_t0_s") for c in clocks]
    if None in origins:
        return None
    return _placed(origins, clocks, EPOCH_HOW, {"kind": "epoch", "how": EPOCH_HOW})


def _wall(clocks: list[dict]) -> Placement | None:
    if not all(c.get("kind") == "wall-clock" for c in clocks):
        return None
    origins = [_t0(c) for c in clocks]
    if None in origins:
        return None
    return _placed(origins, clocks, "local wall clocks (no zone recorded: taken to be one zone)", {})


def _missing(c: dict | None) -> str:
    if not c:
        return "records no clock (meta.clock)"
    if c.get("kind") == "perf_counter" and not c.get("boot_id") and _t0(c, "epoch_t0_s") is None:
        return "records a monotonic clock without its host's boot id or an epoch origin"
    return f"records a {c.get('kind') or 'clock of no kind'} clock that the others' cannot be set against"


def own_uncertainty(t) -> float:
    """How well a replica's own events sit on its own clock: the largest uncertainty of the files
    merged into it (meta.merged_from: a vLLM server's iteration log placed by its spans, ...)."""
    rows = t.meta.get("merged_from") or []
    return max([float(r["uncertainty_ms"]) for r in rows if isinstance(r, dict)
                and isinstance(r.get("uncertainty_ms"), (int, float))] + [0.0])


def place_replicas(traces: list, names: list[str]) -> Placement:
    """Each replica's offset onto one clock (see the module's docstring); TraceError naming the first
    replica that cannot be placed."""
    import dataclasses
    got = _place(traces, names)
    return dataclasses.replace(got, own_ms=tuple(own_uncertainty(t) for t in traces))


def _place(traces: list, names: list[str]) -> Placement:
    n = len(traces)
    clocks = [t.meta.get("clock") for t in traces]
    if all(not c for c in clocks) and all(t.meta.get("source") == "simulated" for t in traces):
        return Placement([0.0] * n, 0.0, "one virtual clock (simulated: 0 is the workload's start)", None)
    if n == 1:
        return Placement([0.0], _resolution(clocks) if clocks[0] else 0.0, "one replica: its own clock",
                         dict(clocks[0]) if clocks[0] else None)
    if all(clocks):
        for rule in (_same_host, _epoch, _wall):
            got = rule(clocks)
            if got is not None:
                return got
    k = next((k for k, c in enumerate(clocks) if not c), None)
    if k is None:
        k = next((k for k, c in enumerate(clocks) if c.get("kind") != clocks[0].get("kind")), 0)
    raise TraceError(f"fleet merge: {names[k]} {_missing(clocks[k])}: its times cannot be placed beside the other "
                     "replicas' (give --offsets-ms, one per file, if you know them)")
