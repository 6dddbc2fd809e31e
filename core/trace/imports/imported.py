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

from dataclasses import dataclass, field

from core.trace.model import Trace

OUR_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "latency_ms", "output_tok_per_s")


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

    @property
    def label(self) -> str:
        return f"{self.tool or self.engine} {self.what}".strip()


def epoch_offset(base_clock: dict, part_clock: dict) -> tuple[float, float, str]:
    """(offset ms, uncertainty ms, how) that moves a part on an epoch clock onto a base on one."""
    off = (part_clock["t0_s"] - base_clock["t0_s"]) * 1000.0
    unc = max(float(base_clock.get("resolution_ms") or 0), float(part_clock.get("resolution_ms") or 0))
    return off, unc, "both epoch clocks: the difference of their origins (one host, or hosts in clock sync)"
