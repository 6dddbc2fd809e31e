"""Command line: python -m core {simulate,metrics,export} ...  (run with -h for each command).

Bad input exits with code 2 and one line on stderr naming the problem.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.cli import Parser as _Parser
from core.cli import check_writable, write_output
from core.cli import finite_float as _finite_float
from core.cli import nonneg_float as _nonneg_float
from core.config import SchedulerConfig, add_flags, from_args
from core.errors import MAX_DECOMPRESSED_BYTES, InputError
from core.stepmodel import StepModel


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m core", description="Serving Explorer core: simulate schedules, compute metrics.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    s = sub.add_parser("simulate", help="run a workload through the core scheduler; write a trace")
    s.add_argument("workload", help="workload file: our JSON, Vidur CSV, LLMServingSim JSONL, or a trace")
    add_flags(s, SchedulerConfig)
    add_flags(s, StepModel)
    s.add_argument("--label", help="trace label (meta.label)")
    s.add_argument("--out", required=True,
                   help="trace to write: .json, .json.gz, .parquet (written while it is simulated), "
                        "or a name ending in / (a directory of Parquet parts)")

    m = sub.add_parser("metrics", help="per-request and summary metrics of a trace or a vLLM result file")
    gz = f"gzip input may inflate to at most {MAX_DECOMPRESSED_BYTES / 2**30:g} GiB, compressed once"
    m.add_argument("trace", help=f"serving-trace/1 (.json, .json.gz, .parquet) or a vLLM/SGLang result JSON; {gz}")
    m.add_argument("--window", nargs=2, type=_finite_float, metavar=("START_MS", "END_MS"),
                   help="fixed throughput window (default: drain window [first arrival, last emission])")
    m.add_argument("--usd-per-hour", type=_nonneg_float, help="flat resource tariff for cost figures")
    m.add_argument("--json", action="store_true", help="print one JSON object")

    e = sub.add_parser("export", help="convert a trace: Chrome/Perfetto JSON, per-request CSV, JSON, Parquet")
    e.add_argument("trace", help=f"serving-trace/1 or a vLLM/SGLang result JSON; {gz}")
    e.add_argument("--chrome", metavar="OUT.json", help="Chrome Trace Event JSON (open in ui.perfetto.dev)")
    e.add_argument("--csv", metavar="OUT.csv", help="per-request metrics")
    e.add_argument("--trace-out", metavar="OUT", help="the trace itself: .json, .json.gz or .parquet")
    return ap


def cmd_simulate(a) -> int:
    from core.simulate import simulate
    from core.workload import load_workload
    check_writable(a.out, "--out")
    w = load_workload(a.workload)
    cfg = from_args(SchedulerConfig, a)
    sm = from_args(StepModel, a)
    if a.out.endswith(".parquet"):  # streamed: the trace is written while it is simulated
        from core.simulate import reuse_freed_memory, simulate_to_parquet
        reuse_freed_memory()
        got = {}
        write_output(a.out, lambda p: got.update(zip(("meta", "counts"), simulate_to_parquet(
            w, cfg, str(p), sm, label=a.label))), "--out")
        st, n_tokens = got["meta"]["stats"], got["counts"].get("token", 0)
    else:
        tr = simulate(w, cfg, sm, label=a.label)
        write_output(a.out, tr.save, "--out")
        st, n_tokens = tr.meta["stats"], len(tr.tokens)
    print(f"wrote {a.out}: {len(w)} requests, {n_tokens} tokens, {st['steps']} steps, "
          f"{st['preemptions']} preemptions; step model {sm.describe()}")
    return 0


def _fmt(x, unit=""):
    return "—" if x is None else f"{x:,.3f}{unit}"


def _read(path):
    """A Trace, or a core.trace.Imported (an engine's benchmark result), from any supported file."""
    from core.trace import open_trace
    return open_trace(path)


def cmd_metrics(a) -> int:
    from core.metrics import summarize
    from core.trace import Imported
    got = _read(a.trace)
    imp = got if isinstance(got, Imported) else None
    tr = imp.trace if imp else got
    if imp and tr is None:
        out = {"source": "imported", "requests": [], "summary": {"failed": None}, "file_summary": imp.file_summary,
               "notes": imp.notes}
        if a.json:
            print(json.dumps(out, allow_nan=False))
        else:
            print(f"{a.trace}: {imp.notes[0]}")
            for k, v in imp.file_summary.items():
                print(f"  {k}: {v}")
        return 0
    out = summarize(tr, window=a.window, usd_per_hour=a.usd_per_hour)
    if imp:
        out["summary"]["failed"] = len(imp.failed)
        out["failed"] = imp.failed
        out["file_summary"] = imp.file_summary
        out["summary"]["notes"] = imp.notes + out["summary"]["notes"]
    if a.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    s = out["summary"]
    print(f"{a.trace}: source={out['source']} label={out['label']!r}")
    print(f"{'id':>10} {'arrival':>10} {'TTFT ms':>10} {'TPOT ms':>10} {'E2E ms':>10} {'tokens':>7}")
    for r in out["requests"][:50]:
        print(f"{r['id']:>10} {r['arrival_ms']:>10.3f} {_fmt(r['ttft_ms']):>10} {_fmt(r['tpot_ms']):>10} "
              f"{_fmt(r['e2e_ms']):>10} {r['output_tokens']:>7}")
    if len(out["requests"]) > 50:
        print(f"... {len(out['requests']) - 50} more requests (use --json for all)")
    w0, w1 = s["window_ms"]
    print(f"output throughput: {s['output_tokens']} tokens / {(w1 - w0) / 1000:g} s = "
          f"{_fmt(s['output_tok_per_s'])} tok/s over the {s['window_kind']} window [{w0:g}, {w1:g}] ms")
    if s["cost_usd"] is not None:
        per_1k = s["cost_per_1k_output_usd"]
        print(f"cost at USD {s['usd_per_hour']:g}/h over that window: {s['cost_usd']:.9f} USD per run, "
              f"{'—' if per_1k is None else f'{per_1k:.6f}'} USD per 1,000 output tokens")
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[k]
        print(f"{k:>8}: n={d['n']} mean={_fmt(d['mean'])} median={_fmt(d['median'])} "
              f"p90={_fmt(d['p90'])} p99={_fmt(d['p99'])}")
    print(f"percentile estimator: {s['percentile_estimator']}")
    for n in s["notes"] + s["conservation_problems"]:
        print(f"note: {n}")
    for f in out.get("failed", []):
        print(f"failed: request {f['id']} (#{f['index']}): {f['error']}")
    if "failed" in s:
        print(f"failed requests: {s['failed']}")
    return 0


def cmd_export(a) -> int:
    from core.export import chrome_trace_json, metrics_csv
    from core.trace import Imported
    if not (a.chrome or a.csv or a.trace_out):
        raise InputError("export: give at least one of --chrome, --csv, --trace-out")
    for flag, path in (("--chrome", a.chrome), ("--csv", a.csv), ("--trace-out", a.trace_out)):
        if path:
            check_writable(path, flag)
    got = _read(a.trace)
    tr = got.trace if isinstance(got, Imported) else got
    if tr is None:
        raise InputError(f"{a.trace}: only summary fields; nothing per request to export")
    for path, write in ((a.chrome, lambda p: Path(p).write_text(chrome_trace_json(tr))),
                        (a.csv, lambda p: Path(p).write_text(metrics_csv(tr))),
                        (a.trace_out, lambda p: tr.save(p))):
        if path:
            write_output(path, write)
            print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    from core.cli import run
    return run(build_parser(), {"simulate": cmd_simulate, "metrics": cmd_metrics, "export": cmd_export}, argv)


if __name__ == "__main__":
    sys.exit(main())
