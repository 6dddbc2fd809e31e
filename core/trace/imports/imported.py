"""What an importer returns: the trace it could rebuild (or None), the file's own numbers, and
where every value was measured and how.

`Imported.stats` holds the tool's own statistics in our units, keyed `(metric, stat)`: metric
one of ttft_ms, tpot_ms, itl_ms, e2e_ms, latency_ms (finish - arrival), output_tok_per_s; stat
one of mean, p50, p90, p95, p99, std, min, max (output_tok_per_s: "value"). Pages and tests set
ours beside them (core.analysis.tools.tool_comparison, with the tool's own percentile estimator
and weighting); the mapping from the tool's names to ours is written once, in each importer,
and shown in `origin`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.errors import TraceError, short
from core.trace.model import BadColumn, Trace, frame
from core.trace.schema import REQUEST, TABLES


@dataclass
class Imported:
    trace: Trace | None                # None when the file has no per-request (or per-step) rows
    engine: str                        # the tool that wrote the file: "vllm", "aiperf", "guidellm", ...
    file_summary: dict                 # the file's own summary numbers, verbatim
    failed: list[dict] = field(default_factory=list)   # [{"index", "id", "error"}]
    notes: list[str] = field(default_factory=list)
    aligned_at_zero: bool = False      # no send times: every request starts at its own t = 0
    tool: str = ""                     # the tool and version as the file says ("AIPerf 0.13.0")
    what: str = ""                     # what the file holds ("per-request records", "summary", ...)
    stats: dict = field(default_factory=dict)         # {(metric, stat): value}, our units (module doc)
    origin: dict = field(default_factory=dict)        # quantity -> where and how it was measured
    runs: list[Imported] = field(default_factory=list)   # several runs in one file (a sweep); self is runs[0]
    run_label: str = ""                # this run's label within the file (e.g. "concurrent@4")
    estimator: str = "linear"          # the tool's percentile estimator (numpy's method name)
    weights: dict = field(default_factory=dict)       # metric -> "tokens-1": the tool weights its samples
    window_ms: tuple[float, float] | None = None      # the tool's throughput window on the trace's clock
    kind: str = ""                     # which importer read it (core.trace.imports.sniff.IMPORTERS)
    windows: list[dict] = field(default_factory=list)  # the tool's statistics per time window (AIPerf time
    #   slices): [{"index", "window_ms": (start, end) | None, "complete", "stats": {(metric, stat): value}}]

    @property
    def label(self) -> str:
        return f"{self.tool or self.engine} {self.what}".strip()


def epoch_offset(base_clock: dict, part_clock: dict) -> tuple[float, float, str]:
    """(offset ms, uncertainty ms, how) that moves a part on an epoch clock onto a base on one."""
    off = (part_clock["t0_s"] - base_clock["t0_s"]) * 1000.0
    unc = max(float(base_clock.get("resolution_ms") or 0), float(part_clock.get("resolution_ms") or 0))
    return off, unc, "both epoch clocks: the difference of their origins (one host, or hosts in clock sync)"


def checked(imp: Imported, name: str) -> Imported:
    """What an importer built, held to what every trace reader holds a trace to, for each run the
    file holds: each table's values against their declarations (model.frame's checks, as the JSON
    and Parquet readers make them) and the verbatim events' numbers finite, else one line naming
    the file and the field (a step of 1e400 ms was inf, and `metrics --json` then failed); the
    file's own numbers and the meta keep a non-finite value as its name ("inf": SGLang writes an
    unbounded request rate as Infinity), never as a number no JSON can hold."""
    for run in {id(r): r for r in (imp, *imp.runs)}.values():
        run.file_summary = finite_or_named(run.file_summary)
        run.stats = {k: v for k, v in run.stats.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        tr = run.trace
        if tr is None:
            continue
        n = len(tr.requests)
        for rec in TABLES:
            df = getattr(tr, rec.table)
            try:
                frame(rec, {f.name: df[f.name] for f in rec.columns}, 0 if rec is REQUEST else n)
            except BadColumn as e:
                raise TraceError(f"{name}: {rec.type} records: {e}") from None
        for k, e in enumerate(tr.other):
            bad = _non_finite(e)
            if bad is not None:
                raise TraceError(f"{name}: {e.get('type', 'an')} event {k} (t_ms {short(e.get('t_ms'))}): {bad[0]}: "
                                 f"expected a finite number, got {bad[1]}")
        tr.meta = finite_or_named(tr.meta)
        tr.request_extra = finite_or_named(tr.request_extra)
        tr.extra = finite_or_named(tr.extra)
    return imp


def _walk(x):
    """(container, key, value, path) of every item of a JSON-like value, depth first, without
    recursion (a file's value may nest as deep as its parser allows)."""
    stack = [(x, "")]
    while stack:
        c, path = stack.pop()
        for k, v in (c.items() if isinstance(c, dict) else enumerate(c)):
            at = f"{path}.{k}" if isinstance(c, dict) else f"{path}[{k}]"
            yield c, k, v, at
            if isinstance(v, (dict, list)):
                stack.append((v, at))


def _non_finite(x):
    """(where, value) of a non-finite number in a JSON-like value, or None."""
    if isinstance(x, float):
        return None if math.isfinite(x) else ("", x)
    if isinstance(x, (dict, list)):
        for _, _, v, at in _walk(x):
            if isinstance(v, float) and not math.isfinite(v):
                return at.lstrip("."), v
    return None


def finite_or_named(x):
    """A JSON-like value with each non-finite number replaced (in place) by its name as Python writes
    it ("inf", "-inf", "nan": what readers of the file's numbers already take for an unbounded rate)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (dict, list)):
        for c, k, v, _ in list(_walk(x)):
            if isinstance(v, float) and not math.isfinite(v):
                c[k] = str(v)
    return x
