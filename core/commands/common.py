"""What the commands share: flags built the same way, the step model from flags or a file, a trace read or saved."""
from __future__ import annotations

import argparse
import sys

from core.cli import add_slo_flags
from core.cli import positive_float as _positive_float
from core.cli import positive_int as _positive_int
from core.config import SchedulerConfig, add_flags, from_args
from core.errors import InputError
from core.sim.stepmodel import StepModel

OUT_OF_CORE_ROWS = 20_000_000  # a Parquet trace larger than this is summarised (metrics) or fitted (fit) out of core


def slo_from_args(a):
    from core.analysis.metrics import SLO
    return SLO(a.slo_ttft_ms, a.slo_tpot_ms, a.slo_e2e_ms)

def bounded_int(lo: int, hi: int):
    def parse(s: str) -> int:
        v = _positive_int(s)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {s}")
        return v
    return parse

def rate_arg(s: str) -> float:
    """A request rate: > 0 and at most a million per second (beyond it the offered load overflows)."""
    v = _positive_float(s)
    if v > 1e6:
        raise argparse.ArgumentTypeError(f"expected a rate of at most 1e6 requests per second, got {s}")
    return v

def model_file_flag(p):
    p.add_argument("--step-model-file", metavar="MODEL.json",
                   help="the step model from a file written by `python -m core fit` (instead of the step model "
                        "flags); steps outside the range it was fitted on are reported")

def simulation_flags(p, attainment_help: str):
    """The scheduler options, the step model (flags or a model file), the SLOs and the attainment
    target of a command that simulates many runs (sweep, search)."""
    add_flags(p, SchedulerConfig)
    add_flags(p, StepModel)
    model_file_flag(p)
    add_slo_flags(p)
    p.add_argument("--attainment", type=_positive_float, default=0.9, help=attainment_help)

def fanout_flags(p, runs: str):
    """Where the runs go (local processes or Ray) and --json."""
    p.add_argument("--workers", type=_positive_int, help=f"processes to run {runs} in (default: one per CPU)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run as Ray tasks: no address = a local Ray started for the call; auto or ray://HOST:PORT = "
                        "an existing cluster (Ray is optional: docs/scale.md)")
    p.add_argument("--results", metavar="DIR_OR_URI",
                   help=f"each of the {runs} writes its result row as a Parquet part here (a new or empty local "
                        "directory or a pyarrow filesystem URI such as s3://bucket/prefix, shared by a cluster's "
                        "nodes; claimed for this run before any work), read back as one dataset and kept "
                        "(core/sim/shared.py)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

def save_trace(tr, path):
    """core.trace.save_trace, imported when a command writes a trace (it brings pandas and the JSON
    codec: 0.24 s of a 1.5 s 10,000-request `simulate` to Parquet that never needed them)."""
    from core.trace import save_trace as save
    return save(tr, path)

def step_model_of(a) -> tuple[StepModel, dict]:
    """The step model of the flags, or of --step-model-file (with its fit report)."""
    if not getattr(a, "step_model_file", None):
        return from_args(StepModel, a), {}
    from core.fit.stepfit import load
    defaults = StepModel()
    given = [f"--{k.replace('_', '-')}" for k in ("kind", "step_ms", "base_ms", "prefill_ms_per_token",
                                                  "decode_ms_per_seq", "prefill_ms_per_kpos", "decode_ms_per_kpos",
                                                  "prefill_ms_per_chunk")
             if getattr(a, k, None) != getattr(defaults, k)]
    if given:
        flag = given[0].replace("--kind", "--step-model")
        raise InputError(f"--step-model-file: the model comes from the file; drop {flag}")
    return load(a.step_model_file)

def warn_outside(tr, fit_report: dict):
    from core.fit.stepfit import describe_outside, outside_range
    o = outside_range(tr, fit_report) if fit_report else None
    if o:
        print(f"warning: {describe_outside(o)}; the durations there are extrapolated", file=sys.stderr)

def fmt_num(x, unit=""):
    return "—" if x is None else f"{x:,.3f}{unit}"

def read_any(path):
    """A Trace, or a core.trace.Imported (an engine's benchmark result), from any supported file."""
    from core.trace import open_trace
    return open_trace(path)

def parquet_rows_of(path) -> int | None:
    """Rows of a Parquet trace (file or directory of parts) from its footers, None for other files."""
    from core.analysis.parquet_source import parquet_rows
    return parquet_rows(path)
