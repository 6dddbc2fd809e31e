"""Command line: python -m core {simulate,metrics,sweep,fit,export} ...  (run with -h for each command).

Bad input exits with code 2 and one line on stderr naming the problem.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from core.cli import Parser as _Parser
from core.cli import add_slo_flags, check_writable, write_output
from core.cli import finite_float as _finite_float
from core.cli import list_of as _list_of
from core.cli import nonneg_float as _nonneg_float
from core.cli import nonneg_int as _nonneg_int
from core.cli import positive_float as _positive_float
from core.cli import positive_int as _positive_int
from core.config import SchedulerConfig, add_flags, from_args
from core.errors import MAX_DECOMPRESSED_BYTES, InputError, TraceError
from core.fleet.options import add_fleet_flags, wants_fleet
from core.sim.stepmodel import StepModel

OUT_OF_CORE_ROWS = 20_000_000  # a Parquet trace larger than this is summarised out of core (DuckDB) by default


def _metrics_out_of_core(a, rows) -> int:
    from core.analysis.outofcore import summarize_parquet
    if a.run not in (None, 0):
        raise InputError(f"--run: {a.trace} holds one run (0), got {a.run}")
    if rows is None and not (Path(a.trace).suffix == ".parquet" or Path(a.trace).is_dir()):
        raise InputError(f"{a.trace}: --out-of-core reads Parquet traces (a .parquet file or a directory of parts)")
    # (a damaged .parquet file goes on to the reader, which names what is wrong with it)
    if not a.out_of_core:
        print(f"note: {rows:,} rows: summarised out of core (DuckDB over the Parquet file, no per-request rows; "
              "--out-of-core always does this)", file=sys.stderr)
    out = summarize_parquet(a.trace, window=a.window, usd_per_hour=a.usd_per_hour, slo=slo_from_args(a))
    if a.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    _print_metrics(a, {**out, "requests": []})
    return 0


def slo_from_args(a):
    from core.analysis.metrics import SLO
    return SLO(a.slo_ttft_ms, a.slo_tpot_ms, a.slo_e2e_ms)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m core", description="Serving Explorer core: simulate schedules, compute metrics.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    s = sub.add_parser("simulate", help="run a workload through the core scheduler; write a trace")
    s.add_argument("workload", help="workload file: our JSON, Vidur CSV, LLMServingSim JSONL, or a trace")
    add_flags(s, SchedulerConfig)
    add_flags(s, StepModel)
    _model_file_flag(s)
    add_fleet_flags(s)
    s.add_argument("--label", help="trace label (meta.label)")
    s.add_argument("--out", required=True,
                   help="trace to write: .json, .json.gz, .parquet (written while it is simulated), "
                        "or a name ending in / (a directory of Parquet parts)")

    m = sub.add_parser("metrics", help="per-request and summary metrics of a trace or another tool's file")
    gz = f"gzip input may inflate to at most {MAX_DECOMPRESSED_BYTES / 2**30:g} GiB, compressed once"
    m.add_argument("trace", help=f"serving-trace/1 (.json, .json.gz, .parquet), a benchmark client's file or "
                                 f"directory (vllm bench serve, SGLang, AIPerf, guidellm, inference-perf), vLLM's "
                                 f"iteration log, OTLP/JSON spans or recorded KV events (docs/imports.md); {gz}")
    m.add_argument("--run", type=_nonneg_int, help="a file with several runs (guidellm benchmarks): which one "
                                                   "(default 0)")
    m.add_argument("--window", nargs=2, type=_finite_float, metavar=("START_MS", "END_MS"),
                   help="fixed throughput window (default: drain window [first arrival, last emission])")
    m.add_argument("--usd-per-hour", type=_nonneg_float, help="flat resource tariff for cost figures")
    add_slo_flags(m)
    m.add_argument("--json", action="store_true", help="print one JSON object")
    m.add_argument("--out-of-core", action="store_true",
                   help="a Parquet trace (file or directory of parts): compute the summary where the data lives "
                        "(DuckDB, bounded memory; no per-request rows), as a trace of more than "
                        f"{OUT_OF_CORE_ROWS:,} rows is by default (core/analysis/outofcore.py)")

    w = sub.add_parser("sweep", help="simulate a workload at several offered loads; latency, throughput, SLOs")
    w.add_argument("workload", help="workload file (its requests' lengths and order are kept; arrivals are not)")
    load = w.add_mutually_exclusive_group(required=True)
    load.add_argument("--rates", type=_list_of(_rate, "requests per second in (0, 1e6]"), metavar="R1,R2,...",
                      help="open loop: Poisson arrivals at each rate (req/s)")
    load.add_argument("--concurrency", type=_list_of(_positive_int, "integers >= 1"), metavar="C1,C2,...",
                      help="closed loop: C clients, each sending its next request when its last one finishes")
    w.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of the Poisson arrivals and, with a fleet, of the router's random draws (default 0; "
                        "--repeats: each run's own seed for both)")
    w.add_argument("--repeats", type=_positive_int, default=1,
                   help="open loop: run each rate with seeds SEED..SEED+K-1; points report the first run and the "
                        "spread (min/mean/max); capacity needs the attainment in every run")
    _simulation_flags(w, "SLO attainment the capacity point must reach (default 0.9)")
    add_fleet_flags(w, seed=False)
    _fanout_flags(w, "points")

    q = sub.add_parser("search", help="capacity search: every scheduler configuration of a grid at one offered "
                                      "load; the cheapest that meets the SLOs (core/experiments/search.py)")
    q.add_argument("workload", help="workload file (its requests' lengths and order are kept; arrivals are not)")
    q.add_argument("--rate", type=_rate, required=True, help="offered load: Poisson arrivals at this rate (req/s)")
    q.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of the Poisson arrivals and, with a fleet, of the router's random draws (default 0)")
    q.add_argument("--grid", nargs="+", required=True, metavar="NAME=V1,V2",
                   help="options to search and their values, e.g. max_seqs=8,16,32 chunk=256,512 kv_blocks=2000,4000 "
                        "token_budget=2048,8192; the fleet: replicas=1,2,4 router=round-robin,prefix-aware "
                        "prefill_replicas=1,2 decode_replicas=2,4 (the other options: the flags below)")
    _simulation_flags(q, "SLO attainment a configuration must reach (default 0.9)")
    q.add_argument("--usd-per-hour", type=_nonneg_float,
                   help="price of the machine (with a fleet: of one replica; N replicas cost N times it): cost per "
                        "1,000 good tokens")
    q.add_argument("--no-prune", action="store_true",
                   help="simulate every configuration in full (default: stop one whose first quarter already "
                        "misses the SLOs too often; disaggregated fleets are always simulated in full)")
    add_fleet_flags(q, seed=False)
    _fanout_flags(q, "configurations")

    f = sub.add_parser("fit", help="fit a step model to a trace's step events (or, --from-requests, to its "
                                   "per-request TTFT and E2E); write it as a model file")
    f.add_argument("trace", help="a trace with step and batch events (simulated or measured), or an engine's "
                                 "iteration log (vLLM --enable-logging-iteration-details: counts per step, affine "
                                 "model); with --from-requests also a trace without steps or a client's result file "
                                 "with send times")
    f.add_argument("--model", choices=("affine", "features"),
                   help="affine: base + prefill tokens + decoding sequences; features: also attended positions of "
                        "prefill and decode, and prefill pieces (default features; with --from-requests and for "
                        "iteration logs affine)")
    f.add_argument("--out", metavar="MODEL.json", help="write the model file (for --step-model-file)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.add_argument("--out-of-core", action="store_true",
                   help="a Parquet trace: aggregate each step's features where the data lives (DuckDB), as a trace "
                        f"of more than {OUT_OF_CORE_ROWS:,} rows is by default (core/fit/outofcore.py)")
    f.add_argument("--from-requests", action="store_true",
                   help="fit an affine model to the requests' measured TTFT and E2E by simulating the workload under "
                        "the engine's scheduler settings (the flags below; default policy vllm-v1) instead of to "
                        "step events (core.fit.reqfit)")
    f.add_argument("--from-token-times", action="store_true",
                   help="fit to engine steps inferred from the streamed tokens' arrival times (each step's tokens "
                        "reach the client together; core.fit.stepinfer): for files without step events whose "
                        "per-token times are known, e.g. a vLLM result with itls; uses the flags below")
    f.add_argument("--search-rounds", type=_bounded_int(1, 1000), default=15,
                   help="--from-requests: rounds of the global search, 18 simulations each (default 15)")
    add_flags(f.add_argument_group("the engine's scheduler settings (with --from-requests / --from-token-times)"),
              SchedulerConfig,
              defaults={"policy": "vllm-v1"})

    g = sub.add_parser("merge", help="one run from several files: a client's file, the server's iteration log, "
                                     "spans, KV events, /metrics samples, joined by request and time")
    g.add_argument("files", nargs="+", help="files of one run (any format `metrics` reads, with a recorded clock)")
    g.add_argument("--out", required=True, help="the merged trace (.json, .json.gz, .parquet)")
    g.add_argument("--json", action="store_true", help="print how each file was aligned as one JSON object")
    g.add_argument("--run", type=_nonneg_int, help="a file with several runs (guidellm benchmarks): join only run K "
                                                   "(default: every run, on their common epoch clock)")

    fi = sub.add_parser("fidelity", help="fit the simulator (step model and front end) on measured runs and predict "
                                         "other runs: per-run and per-request TTFT / E2E errors, and where they arise")
    fi.add_argument("--fit", nargs="+", metavar="RUN",
                    help="runs to fit on, together: a directory of one run's files (vLLM's server log with iteration "
                         "details, its OTLP spans, KV events, the client's result, dataset.jsonl) or a trace file")
    fi.add_argument("--predict", nargs="+", metavar="RUN", help="runs to predict (each under its own engine flags, "
                                                               "read from its files, --server-log or --flags)")
    fi.add_argument("--repeats", nargs="+", metavar="RUN", action="append",
                    help="two or more repeats of one workload on one server (same prompts, seed and arrivals): "
                         "their per-request and run-level spread, the floor every error of a run of that workload "
                         "is printed against (core.fit.noise); once per workload; alone, only the floors are printed")
    fi.add_argument("--server-log", metavar="LOG",
                    help="a vLLM server log whose start-up lines state its flags (`non-default args: ...`), for the "
                         "runs whose own files do not (a server log cut into runs: pass the whole log here)")
    fi.add_argument("--model", choices=("affine", "features"), default="affine", help="step model (default affine)")
    fi.add_argument("--method", choices=("spans", "log"), default="spans",
                    help="fit the step model to the engine's own per-request phases (spans: default) or to its "
                         "iteration log plus the per-step time the log leaves out (log)")
    fi.add_argument("--speed-from-log", action="store_true",
                    help="each predicted run at its own machine speed, read from its iteration log: over the run "
                         "(each 5 s of logged steps against the fitted forward pass, the log aligned to the "
                         "run's spans: a client that takes more of the cores in one phase than another), or, without "
                         "spans, one number (the median of its logged steps against the fitted forward pass, over "
                         "the fit runs' own)")
    fi.add_argument("--flags", metavar="JSON",
                    help="the engine's scheduler options for runs whose files do not state them, as a JSON object of "
                         "SchedulerConfig fields, e.g. '{\"policy\": \"vllm-v1\", \"max_seqs\": 16, "
                         "\"token_budget\": 2048, \"block_size\": 32, \"kv_blocks\": 64, \"prefix_caching\": "
                         "true, \"kv_manager\": \"vllm-v1\"}'")
    fi.add_argument("--per-request", action="store_true", help="print every request's row")
    fi.add_argument("--json", action="store_true", help="print one JSON object (with every request's row)")

    fm = sub.add_parser("fleet-merge", help="replicas' own measured traces as one fleet trace (a replica column, "
                                            "steps numbered fleet-wide): e.g. gpu_runner serve replicas behind "
                                            "another router")
    fm.add_argument("files", nargs="+", help="replica k's trace is the k-th file (ours: gpu_runner serve --trace-out)")
    fm.add_argument("--out", required=True, help="the fleet trace (.json, .json.gz, .parquet)")
    fm.add_argument("--roles", help="each replica's role, comma-separated: both | prefill | decode (default: both "
                                    "for every one)")
    fm.add_argument("--offsets-ms", help="comma-separated ms added to each replica's times, when they were not "
                                         "recorded on one clock (default: none; gpu_runner fleet's replicas share "
                                         "the front end's clock)")
    fm.add_argument("--label", help="the merged trace's label")

    c = sub.add_parser("compare", help="two traces side by side: key metrics with difference and ratio, and where "
                                       "their workloads differ (out of core for large Parquet traces)")
    c.add_argument("first", help="a trace or an engine's result file")
    c.add_argument("second", help="another trace of the same workload")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--out-of-core", action="store_true",
                   help="summarise Parquet traces where the data lives (DuckDB), as one of more than "
                        f"{OUT_OF_CORE_ROWS:,} rows is by default")

    o = sub.add_parser("overview", help="build the overview the trace replay page opens a trace larger than memory "
                                        "from (written beside it: T.parquet.overview/; core/analysis/overview.py)")
    o.add_argument("trace", help="a Parquet trace (a .parquet file or a directory of parts)")
    o.add_argument("--out", metavar="DIR", help="write the overview here instead: a new or empty folder, or one this "
                                                "tool wrote (anything else is refused, left as it is); the page looks "
                                                "beside the trace, then in the user cache")

    e = sub.add_parser("export", help="convert a trace: Chrome/Perfetto JSON, per-request CSV, JSON, Parquet")
    e.add_argument("trace", help=f"serving-trace/1 or a vLLM/SGLang result JSON; {gz}")
    e.add_argument("--chrome", metavar="OUT.json", help="Chrome Trace Event JSON (open in ui.perfetto.dev)")
    e.add_argument("--csv", metavar="OUT.csv", help="per-request metrics")
    e.add_argument("--trace-out", metavar="OUT", help="the trace itself: .json, .json.gz or .parquet")
    e.add_argument("--out-of-core", action="store_true",
                   help="a Parquet trace: --csv computed where the data lives (DuckDB), as for a trace of more than "
                        f"{OUT_OF_CORE_ROWS:,} rows by default")
    return ap


def _bounded_int(lo: int, hi: int):
    def parse(s: str) -> int:
        v = _positive_int(s)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {s}")
        return v
    return parse


MAX_JSON_EVENTS = 5_000_000    # a JSON trace written in about 15 s; beyond it Parquet (streamed) is the way


def _rate(s: str) -> float:
    """A request rate: > 0 and at most a million per second (beyond it the offered load overflows)."""
    v = _positive_float(s)
    if v > 1e6:
        raise argparse.ArgumentTypeError(f"expected a rate of at most 1e6 requests per second, got {s}")
    return v


def _model_file_flag(p):
    p.add_argument("--step-model-file", metavar="MODEL.json",
                   help="the step model from a file written by `python -m core fit` (instead of the step model "
                        "flags); steps outside the range it was fitted on are reported")


def _simulation_flags(p, attainment_help: str):
    """The scheduler options, the step model (flags or a model file), the SLOs and the attainment
    target of a command that simulates many runs (sweep, search)."""
    add_flags(p, SchedulerConfig)
    add_flags(p, StepModel)
    _model_file_flag(p)
    add_slo_flags(p)
    p.add_argument("--attainment", type=_positive_float, default=0.9, help=attainment_help)


def _fanout_flags(p, runs: str):
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


def _step_model(a) -> tuple[StepModel, dict]:
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


def _warn_outside(tr, fit_report: dict):
    from core.fit.stepfit import describe_outside, outside_range
    o = outside_range(tr, fit_report) if fit_report else None
    if o:
        print(f"warning: {describe_outside(o)}; the durations there are extrapolated", file=sys.stderr)


def cmd_fit(a) -> int:
    from core.fit.stepfit import fit
    from core.trace import Imported
    if a.out:
        check_writable(a.out, "--out", directory_ok=False)
    if a.from_requests and a.from_token_times:
        raise InputError("fit: choose one of --from-requests and --from-token-times")
    rows = _parquet_rows(a.trace)
    if a.out_of_core or (rows is not None and rows > OUT_OF_CORE_ROWS and not (a.from_requests or a.from_token_times)):
        if a.from_requests or a.from_token_times:
            raise InputError("fit: --out-of-core fits to step events; --from-requests and --from-token-times read the "
                             "trace in memory")
        if rows is None and not (Path(a.trace).suffix == ".parquet" or Path(a.trace).is_dir()):
            raise InputError(f"{a.trace}: --out-of-core reads Parquet traces (a .parquet file or a directory of parts)")
        # (a damaged .parquet file goes on to the reader, which names what is wrong with it)
        from core.fit.outofcore import fit_parquet
        sm, report = fit_parquet(a.trace, a.model or "features")
        return _fit_report(a, sm, report)
    tr = _read(a.trace)
    if a.from_token_times:
        from core.fit.stepinfer import fit_inferred
        if isinstance(tr, Imported) and (tr.trace is None or tr.aligned_at_zero):
            raise InputError(f"{a.trace}: inferring steps needs each request's send time and per-token times "
                             "(a vLLM result saved with --save-detailed and start_times)")
        sm, report = fit_inferred(tr.trace if isinstance(tr, Imported) else tr, from_args(SchedulerConfig, a),
                                  a.model or "affine")
    elif a.from_requests:
        from core.fit.reqfit import fit_from_requests
        if isinstance(tr, Imported) and tr.trace is None:
            raise InputError(f"{a.trace}: the file has only summary numbers, no per-request measurements to fit")
        sm, report = fit_from_requests(tr.trace if isinstance(tr, Imported) else tr, from_args(SchedulerConfig, a),
                                       a.model or "affine", search_rounds=a.search_rounds,
                                       send_times_known=not (isinstance(tr, Imported) and tr.aligned_at_zero))
    elif isinstance(tr, Imported) and (tr.trace is None or not len(tr.trace.steps)):
        raise InputError(f"{a.trace}: {tr.label} has no step events to fit a step model to; "
                         f"--from-token-times fits one to the steps inferred from its streamed tokens, "
                         f"--from-requests to its per-request TTFT and E2E; an engine's iteration log "
                         f"(vLLM --enable-logging-iteration-details) has its steps")
    else:
        from core.fit.stepfit import counted_steps
        steps_of = tr.trace if isinstance(tr, Imported) else tr
        sm, report = fit(steps_of, a.model or ("affine" if counted_steps(steps_of) else "features"))
    return _fit_report(a, sm, report)


def _fit_report(a, sm, report) -> int:
    from core.fit.stepfit import describe_identifiability, save
    if a.out:
        write_output(a.out, lambda p: save(p, sm, report), "--out")
    if a.json:
        print(json.dumps({"step_model": sm.to_dict(), "fit": report}, allow_nan=False))
        return 0
    if a.from_token_times:
        print(f"{a.trace}: " + "; ".join(report["notes"]))
    if a.from_requests:
        e = report["error"]
        print(f"{a.trace}: {report['requests']:,} requests, {report['simulations']} simulations; {sm.describe()}")
        print(f"fit ({report['scheduler']['policy']}): per-request |error| TTFT p50 {e['ttft_ms']['p50']:.1%}, "
              f"p90 {e['ttft_ms']['p90']:.1%}; E2E p50 {e['e2e_ms']['p50']:.1%}, p90 {e['e2e_ms']['p90']:.1%}")
    else:
        r2 = "—" if report["r2"] is None else f"{report['r2']:.4f}"
        print(f"{a.trace}: {report['steps']:,} steps; {sm.describe()}")
        print(f"fit: R^2 {r2}; |residual| p50 {report['residual_ms']['p50']:.4g} ms, p90 "
              f"{report['residual_ms']['p90']:.4g} ms, p99 {report['residual_ms']['p99']:.4g} ms; relative error "
              f"p50 {report['relative_error']['p50']:.2%}, p90 {report['relative_error']['p90']:.2%}")
        print("fitted range: " + ", ".join(f"{k} {lo:g}–{hi:g}" for k, (lo, hi) in report["range"].items()))
    for line in describe_identifiability(report.get("identifiability") or {},
                                         "requests" if a.from_requests else "steps"):
        print(f"note: {line}")
    if a.out:
        print(f"wrote {a.out}")
    return 0


def cmd_simulate(a) -> int:
    from core.sim.simulate import reuse_freed_memory, simulate
    from core.workload import load_workload
    check_writable(a.out, "--out")
    reuse_freed_memory()   # (one engine or a fleet, in memory or streamed: freed pages reused)
    w = load_workload(a.workload)
    cfg = from_args(SchedulerConfig, a)
    sm, fit_report = _step_model(a)
    if wants_fleet(a):
        return _simulate_fleet(a, w, cfg, sm, fit_report)
    _fleet_flags_unused(a, False)
    if a.out.endswith(".parquet"):  # streamed: the trace is written while it is simulated
        from core.sim.simulate import simulate_to_parquet
        got = {}
        write_output(a.out, lambda p: got.update(zip(("meta", "counts"), simulate_to_parquet(
            w, cfg, str(p), sm, label=a.label))), "--out")
        st, n_tokens = got["meta"]["stats"], got["counts"].get("token", 0)
        if fit_report:
            from core.trace import load_trace
            _warn_outside(load_trace(a.out), fit_report)
    else:
        tr = simulate(w, cfg, sm, label=a.label)
        events = len(tr.tokens) + len(tr.steps) + len(tr.batch) + len(tr.kv) + len(tr.finishes)
        if events > MAX_JSON_EVENTS:
            raise InputError(f"--out {a.out}: {events:,} events would take about {events / 300_000:,.0f} s to write as "
                             f"JSON (at most {MAX_JSON_EVENTS:,} here); write .parquet (streamed while simulated: "
                             "seconds) or a directory of Parquet parts (--out DIR/)")
        write_output(a.out, lambda p: save_trace(tr, p), "--out")
        st, n_tokens = tr.meta["stats"], len(tr.tokens)
        _warn_outside(tr, fit_report)
    print(f"wrote {a.out}: {len(w)} requests, {n_tokens} tokens, {st['steps']} steps, "
          f"{st['preemptions']} preemptions; step model {sm.describe()}")
    return 0


def _simulate_fleet(a, w, cfg, sm, fit_report) -> int:
    from core.fleet.options import fleet_from_args, kv_bytes_per_token
    from core.fleet.sim import simulate_fleet
    bpt, model = kv_bytes_per_token(a)
    fleet = fleet_from_args(a, cfg, sm, bpt, model)
    tr = simulate_fleet(w, fleet, label=a.label)
    events = len(tr.tokens) + len(tr.steps) + len(tr.batch) + len(tr.kv) + len(tr.finishes)
    if events > MAX_JSON_EVENTS and not a.out.endswith((".parquet", "/")):
        raise InputError(f"--out {a.out}: {events:,} events would take about {events / 300_000:,.0f} s to write as "
                         f"JSON (at most {MAX_JSON_EVENTS:,} here); write .parquet or a directory of Parquet parts")
    write_output(a.out, lambda p: save_trace(tr, p), "--out")
    st = tr.meta["stats"]
    _warn_outside(tr, fit_report)
    roles = [r["role"] for r in tr.meta["fleet"]["replicas"]]
    shape = (f"{roles.count('prefill')} prefill + {roles.count('decode')} decode replicas"
             if "prefill" in roles else f"{len(roles)} replicas")
    print(f"wrote {a.out}: {len(w)} requests, {len(tr.tokens)} tokens, {st['steps']} steps, "
          f"{st['preemptions']} preemptions; {shape}, router {fleet.router.policy}; step model {sm.describe()}")
    return 0


def _fmt(x, unit=""):
    return "—" if x is None else f"{x:,.3f}{unit}"


def _read(path):
    """A Trace, or a core.trace.Imported (an engine's benchmark result), from any supported file."""
    from core.trace import open_trace
    return open_trace(path)


def _parquet_rows(path) -> int | None:
    """Rows of a Parquet trace (file or directory of parts) from its footers, None for other files."""
    from core.analysis.outofcore import parquet_rows
    return parquet_rows(path)


def cmd_compare(a) -> int:
    from core.analysis.compare import summary_table, workload_differences_of
    sides = [_summary_and_requests(path, a.out_of_core) for path in (a.first, a.second)]
    diffs = workload_differences_of(sides[0][1], sides[1][1])
    table = summary_table(sides[0][0], sides[1][0], "first", "second")
    if a.json:
        rows = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
                for r in table.to_dict("records")]
        print(json.dumps({"first": a.first, "second": a.second, "workload_differences": diffs, "metrics": rows,
                          "computed": [c for _, _, c in sides]}, allow_nan=False))
        return 0
    print(f"first:  {a.first}\nsecond: {a.second}")
    for d in diffs:
        print(f"workloads differ: {d} (differences in metrics mix scheduling with workload)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.6g}"))
    return 0


def _summary_and_requests(path, out_of_core: bool):
    """(summary, request table, how it was computed) of one side of `compare`."""
    from core.analysis.metrics import summarize
    from core.trace import Imported
    rows = _parquet_rows(path)
    if out_of_core or (rows is not None and rows > OUT_OF_CORE_ROWS):
        if rows is None and not (Path(path).suffix == ".parquet" or Path(path).is_dir()):
            raise InputError(f"{path}: --out-of-core reads Parquet traces (a .parquet file or a directory of parts)")
        from core.analysis.outofcore import request_table_parquet, summarize_parquet
        out = summarize_parquet(path)
        return out["summary"], request_table_parquet(path), out["computed"]
    got = _read(path)
    tr = got.trace if isinstance(got, Imported) else got
    if tr is None:
        raise InputError(f"{path}: only summary fields; nothing per request to compare")
    return summarize(tr, per_request=False)["summary"], tr.requests, {"out_of_core": False}


def cmd_overview(a) -> int:
    import time

    from core.analysis.overview import build
    t = time.perf_counter()
    out = build(a.trace, Path(a.out) if a.out else None, progress=lambda m: print(f"  {m}…", file=sys.stderr))
    print(f"wrote {out} in {time.perf_counter() - t:.1f} s (the trace replay page opens {a.trace} from it)")
    return 0


def cmd_metrics(a) -> int:
    from core.analysis.metrics import summarize
    from core.trace import Imported
    rows = _parquet_rows(a.trace)
    if a.out_of_core or (rows is not None and rows > OUT_OF_CORE_ROWS):
        return _metrics_out_of_core(a, rows)
    got = _read(a.trace)
    imp = got if isinstance(got, Imported) else None
    if imp and imp.runs and a.run is not None:
        if not 0 <= a.run < len(imp.runs):
            raise InputError(f"--run: the file holds runs 0..{len(imp.runs) - 1}, got {a.run}")
        imp = imp.runs[a.run]
    elif a.run not in (None, 0):
        raise InputError(f"--run: {a.trace} holds one run (0), got {a.run}")
    tr = imp.trace if imp else got
    if imp and tr is None:
        out = {"source": "imported", "tool": imp.tool, "what": imp.what, "requests": [], "summary": {"failed": None},
               "file_summary": imp.file_summary, "notes": imp.notes}
        if a.json:
            print(json.dumps(out, allow_nan=False))
            return 0
        print(f"{a.trace}: {imp.notes[0]}")
        for k, v in imp.file_summary.items():
            print(f"  {k}: {v}")
        return 0
    out = summarize(tr, window=a.window, usd_per_hour=a.usd_per_hour, slo=slo_from_args(a))
    if imp:
        out.update(_imported_fields(imp))
        out["summary"]["failed"] = len(imp.failed)
        out["summary"]["notes"] = imp.notes + out["summary"]["notes"]
    if a.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    _print_metrics(a, out)
    return 0


def _imported_fields(imp) -> dict:
    """What metrics --json adds for another tool's file: the tool, its own numbers beside ours
    (computed its way), where each value was measured, and the runs the file holds."""
    from core.analysis.tools import tool_comparison
    cmp = tool_comparison(imp)
    out = {"tool": imp.tool, "what": imp.what, "failed": imp.failed, "file_summary": imp.file_summary,
           "provenance": imp.origin,
           "tool_comparison": [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
                               for row in cmp.to_dict("records")]}
    if imp.runs:
        out["runs"] = [r.run_label for r in imp.runs]
        out["run"] = imp.runs.index(imp)
    return out


def _print_requests(out):
    print(f"{'id':>10} {'arrival':>10} {'TTFT ms':>10} {'TPOT ms':>10} {'E2E ms':>10} {'tokens':>7}")
    for r in out["requests"][:50]:
        print(f"{r['id'][-10:]:>10} {r['arrival_ms']:>10.3f} {_fmt(r['ttft_ms']):>10} {_fmt(r['tpot_ms']):>10} "
              f"{_fmt(r['e2e_ms']):>10} {r['output_tokens']:>7}")
    if len(out["requests"]) > 50:
        print(f"... {len(out['requests']) - 50} more requests (use --json for all)")


def _print_metrics(a, out):
    s = out["summary"]
    print(f"{a.trace}: source={out['source']} label={out['label']!r}" + (f" tool={out['tool']!r}" if "tool" in out
                                                                          else ""))
    if "runs" in out:
        print("runs in the file: " + ", ".join(f"{k}: {r}" for k, r in enumerate(out["runs"]))
              + f" (showing {out['run']}; --run K for another)")
    if s["requests"]:
        _print_requests(out)
        _print_request_summary(s)
    else:
        print("no requests: the file holds engine-side records only (steps, KV events)")
    st = s.get("steps")
    if st:
        d = st["dur_ms"]
        tokens = "".join(f", {st[k]:,} {k.replace('_', ' ')}" for k in ("prefill_tokens", "decode_tokens") if k in st)
        print(f"steps: {st['steps']:,} over {(st['span_ms'][1] - st['span_ms'][0]) / 1000:,.3f} s, busy "
              f"{st['busy_ms']:,.3f} ms ({_fmt(st['busy_fraction'])}); duration mean {_fmt(d['mean'])} ms, p50 "
              f"{_fmt(d['median'])}, p99 {_fmt(d['p99'])}{tokens}")
    kv = s.get("kv_events")
    if kv:
        print(f"engine prefix cache (KV events): {kv['stored_blocks']:,} blocks stored, {kv['removed_blocks']:,} "
              f"removed, {kv['cleared']} clear(s), at most {kv['peak_cached_blocks']:,} cached at once")
    if s.get("fleet"):
        _print_fleet(s["fleet"])
    for row in out.get("tool_comparison", []):
        rel = row["relative_difference"]
        print(f"{out['tool']} {row['metric']} {row['stat']}: file {_fmt(row['file'])}, ours {_fmt(row['ours'])}"
              + ("" if rel is None else f" ({rel:+.3%})"))
    for n in s["notes"] + s["conservation_problems"]:
        print(f"note: {n}")
    for f in out.get("failed", []):
        print(f"failed: request {f['id']} (#{f['index']}): {f['error']}")
    if "failed" in s:
        print(f"failed requests: {s['failed']}")


def _print_fleet(f):
    """summary.fleet (core/analysis/fleet.py): a line per replica, the router, the KV transfers."""
    w0, w1 = f["window_ms"]
    models = {r["step_model"] for r in f["replicas"]}
    one = len(models) == 1 and None not in models
    print(f"fleet ({f['origin']}" + (f", step model {models.pop()}" if one else "") + f"): {len(f['replicas'])} "
          f"replicas; busy = step time / the drain window [{w0:g}, {w1:g}] ms")
    for r in f["replicas"]:
        t, e = r["ttft_ms"], r["e2e_ms"]
        sm = f", step model {r['step_model']}" if r["step_model"] and not one else ""
        lat = f"; TTFT p50 {_fmt(t['p50'])} p99 {_fmt(t['p99'])} ms, E2E p50 {_fmt(e['p50'])} p99 " \
              f"{_fmt(e['p99'])} ms" if t["n"] else ""
        hits = "" if r["prefix_hit_blocks"] is None else \
            f", {r['prefix_hit_blocks']:,} prefix-hit blocks ({r['prefix_hit_blocks_source']}" + (
                "" if r["prefix_hit_rate"] is None else f"; on first admission {r['prefix_hit_blocks_first']:,} of "
                f"{r['prompt_blocks']:,} prompt blocks routed, {r['prefix_hit_rate']:.1%}") + ")"
        print(f"  replica {r['replica']} ({r['role']}{sm}): {r['routed']} routed, {r['requests']} finished, "
              f"{r['prefilled']} prefilled{lat}; {r['steps']:,} steps, busy {_fmt(r['busy_fraction'])}{hits}")
    ro = f["router"]
    stale = "" if ro["staleness_ms"] is None else f", staleness {ro['staleness_ms']:g} ms"
    dec = f", decode {_fmt(ro['imbalance_decode'])}" if "imbalance_decode" in ro else ""
    print(f"  router {ro['policy'] or '(policy not recorded)'}{stale}: imbalance (max/mean routed, from "
          f"{ro['routed_from']}) {_fmt(ro['imbalance'])}{dec}; {ro['rejected']} rejected")
    pc = f.get("prefix_cache") or {}
    if pc.get("hit_rate") is not None:
        print(f"  prefix hit rate {pc['hit_rate']:.1%}: {pc['hit_blocks_first']:,} hit blocks on first admission of "
              f"{pc['prompt_blocks']:,} full prompt blocks routed ({pc['hit_blocks_all']:,} hit blocks in all, "
              "re-admissions after preemptions included)")
    x = f.get("transfers")
    if x is not None:
        print(f"  KV transfers: {x['count']:,}, {x['bytes']:,} bytes; time mean {_fmt(x['mean_ms'])} ms, p99 "
              f"{_fmt(x['p99_ms'])} ms; waited on the link mean {_fmt(x['waited_ms_mean'])} ms, then for decode "
              f"admission mean {_fmt(x['decode_admit_wait_ms_mean'])} ms")
    for n in f["notes"]:
        print(f"  note: {n}")


def _print_request_summary(s):
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
    if "slo" in s:
        o, v = s["slo"], s["slo"]["violations"]
        bounds = ", ".join(f"{k.split('_')[0].upper()} <= {o[k]:g} ms" for k in ("ttft_ms", "tpot_ms", "e2e_ms")
                           if o[k] is not None)
        print(f"SLOs ({bounds}): {o['met']} of {o['requests']} requests met them "
              f"(attainment {_fmt(o['attainment'])}); goodput {_fmt(o['goodput_req_per_s'])} req/s, "
              f"{_fmt(o['goodput_tok_per_s'])} tok/s; violations: "
              + ", ".join(f"{k} {n}" for k, n in v.items() if n is not None))
    ll = s["littles_law"]
    print(f"Little's law: L = {_fmt(ll['L'])} requests in system, lambda W = {_fmt(ll['lambda_W'])} "
          f"(lambda = {_fmt(ll['arrival_rate_per_s'])} req/s, W = {_fmt(ll['W_ms'])} ms)")
    u = s["utilisation"]
    peak = "_peak" if "replicas" not in (u or {}) else "_peak_one_replica"   # a fleet: means of all, peaks of one
    if u is not None and u[f"running{peak}"] is not None:
        one = "" if peak == "_peak" else " on one replica"
        whole = "" if peak == "_peak" else f" (all {u['replicas']} replicas together)"
        kv = (f"; KV blocks in use: mean {_fmt(u['kv_used_blocks_mean'])}, peak{one} {u[f'kv_used_blocks{peak}']}"
              + (f" of {u['kv_blocks']}" if "kv_blocks" in u else ""))
        print(f"running sequences{whole}: mean {_fmt(u['running_mean'])}, peak{one} {u[f'running{peak}']}{kv}")


def _fleet_flags_unused(a, has_fleet: bool):
    """Without a fleet, the fleet's flags are refused (core.fleet.options.check_no_fleet_flags)."""
    from core.fleet.options import check_no_fleet_flags
    if not has_fleet:
        check_no_fleet_flags(a)


def _sweep_fleet(a, cfg, sm):
    """The sweep's FleetSpec from the fleet flags (None: one engine)."""
    from core.fleet.options import fleet_from_args, kv_bytes_per_token
    _fleet_flags_unused(a, wants_fleet(a))
    if not wants_fleet(a):
        return None
    bpt, model = kv_bytes_per_token(a)
    return fleet_from_args(a, cfg, sm, bpt, model)


def cmd_sweep(a) -> int:
    from core.experiments.sweep import sweep
    from core.workload import load_workload
    w = load_workload(a.workload)
    sm, _ = _step_model(a)
    cfg = from_args(SchedulerConfig, a)
    fleet = _sweep_fleet(a, cfg, sm)
    out = sweep(w, cfg, sm, rates=a.rates, concurrency=a.concurrency,
                seed=a.seed, slo=slo_from_args(a), attainment=a.attainment, workers=a.workers, repeats=a.repeats,
                ray=a.ray, results=a.results, fleet=fleet)
    if a.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    key = "rate" if a.rates else "concurrency"
    kind = f"open loop (Poisson, seed {a.seed})" if a.rates else "closed loop"
    on = ""
    if fleet is not None:
        from core.fleet.options import describe_shape
        on = (f"; fleet of {describe_shape(out['fleet'])}, router {out['fleet']['router']['policy']} "
              f"(seeded as the arrivals)")
    print(f"{a.workload}: {len(w)} requests, {kind}; "
          f"simulated, step model {sm.describe()}{on}")
    head = f"{key:>11} {'offered/s':>10} {'done/s':>8} {'tok/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} " \
           f"{'TPOT p50':>9} {'TPOT p99':>9} {'E2E p99':>9} {'failed':>6}"
    print(head + (f" {'SLO met':>8} {'goodput/s':>9}" if out["points"] and "slo" in out["points"][0] else ""))
    for p in out["points"]:
        row = (f"{p[key]:>11g} {_fmt(p['offered_req_per_s']):>10} {_fmt(p['achieved_req_per_s']):>8} "
               f"{_fmt(p['output_tok_per_s']):>9} {_fmt(p['ttft_ms']['p50']):>9} {_fmt(p['ttft_ms']['p99']):>9} "
               f"{_fmt(p['tpot_ms']['p50']):>9} {_fmt(p['tpot_ms']['p99']):>9} {_fmt(p['e2e_ms']['p99']):>9} "
               f"{p['failed']:>6}")
        if "slo" in p:
            row += f" {_fmt(p['slo']['attainment']):>8} {_fmt(p['slo']['goodput_req_per_s']):>9}"
        print(row)
        if "repeats" in p:
            r = p["repeats"]
            print(f"{'':>11} over seeds {r['seeds'][0]}..{r['seeds'][-1]}: tok/s {r['output_tok_per_s']['min']:,.1f}"
                  f"..{r['output_tok_per_s']['max']:,.1f}, TTFT p99 {r['ttft_p99_ms']['min']:,.1f}.."
                  f"{r['ttft_p99_ms']['max']:,.1f}" + (f", SLO met {r['attainment']['min']:.3f}.."
                                                        f"{r['attainment']['max']:.3f}" if "attainment" in r else ""))
    if out["capacity"] is not None:
        c = out["capacity"]
        print(f"capacity: {key} {c[key]:g} is the highest swept load with SLO attainment >= {c['target']:g} "
              f"({c['attainment']:.3f})")
    elif slo_from_args(a).given():
        print(f"capacity: no swept load reaches SLO attainment {a.attainment:g}")
    print("latencies in ms; offered = arrivals per second over their span; done = completed requests per second "
          "of the drain window")
    return 0


def cmd_search(a) -> int:
    from core.experiments.search import check_fleet_axes, parse_grid, search, uses_fleet
    from core.fleet.options import FleetFlags
    from core.workload import load_workload
    grid = parse_grid(a.grid)
    flags = FleetFlags.from_args(a)
    check_fleet_axes(grid, flags)         # (before the workload is read: a bad grid is refused at once)
    _fleet_flags_unused(a, uses_fleet(grid, flags))
    w = load_workload(a.workload)
    sm, _ = _step_model(a)
    out = search(w, from_args(SchedulerConfig, a), sm, grid, a.rate, slo_from_args(a), target=a.attainment,
                 seed=a.seed, usd_per_hour=a.usd_per_hour, prune=not a.no_prune, workers=a.workers, ray=a.ray,
                 results=a.results, fleet=flags)
    if a.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    print(f"{a.workload}: {len(w)} requests at {a.rate:g} req/s (Poisson, seed {a.seed}); simulated, step model "
          f"{sm.describe()}; {len(out['points'])} configurations, {out['simulated']} simulated in full, "
          f"{out['pruned']} stopped early")
    if "fleet" in out:
        return _print_fleet_search(a, out)
    return _print_search(a, out)


def _print_search(a, out) -> int:
    from core.config import describe_options as describe
    cost = a.usd_per_hour is not None
    print(f"{'configuration':>44} {'SLO met':>8} {'goodput tok/s':>13} {'TTFT p99':>9} {'TPOT p99':>9}"
          + (f" {'USD/1k good':>11}" if cost else ""))
    for p in out["points"]:
        name = describe(p["config"])
        if "invalid" in p:
            print(f"{name:>44} invalid: {p['invalid']}")
        elif p.get("pruned"):
            print(f"{name:>44} {'<=' + format(p['attainment_at_most'], '.3f'):>8} stopped: {p['prefix_misses']} of "
                  f"the first {p['prefix_requests']} requests missed")
        else:
            print(f"{name:>44} {_fmt(p['slo']['attainment']):>8} {_fmt(p['slo']['goodput_tok_per_s']):>13} "
                  f"{_fmt(p['ttft_ms']['p99']):>9} {_fmt(p['tpot_ms']['p99']):>9}"
                  + (f" {p['cost_per_1k_good_tokens_usd'] or math.nan:>11.4g}" if cost else ""))
    b = out["best"]
    if b is None:
        print(f"best: no configuration reaches SLO attainment {a.attainment:g} at {a.rate:g} req/s")
    else:
        print(f"best: {describe(b['config'])} (SLO met {b['slo']['attainment']:.3f}, goodput "
              f"{b['slo']['goodput_tok_per_s']:,.1f} tok/s" + (f", USD {b['cost_per_1k_good_tokens_usd']:.6f} per "
                                                             "1,000 good tokens" if cost and
                                                             b['cost_per_1k_good_tokens_usd'] else "") + ")")
    return 0


def _print_fleet_search(a, out) -> int:
    """The search's table with the fleet's columns: replicas (N, or P+D disaggregated), router, and with a
    price the configuration's price per hour (one replica's times its replicas)."""
    from core.config import describe_options as describe
    from core.experiments.search import FLEET_AXES
    from core.fleet.options import describe_shape

    def shape(p):          # (an invalid scheduler configuration has no fleet: its axes', or the flags')
        if "fleet" in p:
            return describe_shape(p["fleet"])
        c = p["config"]
        n, pre, dec = (c.get("replicas", a.replicas), c.get("prefill_replicas", a.prefill_replicas),
                       c.get("decode_replicas", a.decode_replicas))
        return f"{pre}P+{dec}D" if pre or dec else describe_shape({"replicas": n}) if n else "—"

    engines = any(k not in FLEET_AXES for k in out["grid"])     # a scheduler axis: its column

    def engine(p):
        return f" {describe({k: v for k, v in p['config'].items() if k not in FLEET_AXES}):>36}" if engines else ""

    def router(p):
        return (p.get("fleet") or {}).get("router") or p["config"].get("router") or a.router or "round-robin"
    r = out["fleet"]["router"]
    print(f"fleet: router settings {', '.join(f'{k} {v}' for k, v in r.items() if k != 'policy')} (the router's "
          f"seed is the arrivals'); " + ("price per replica (given) USD "
                                         f"{a.usd_per_hour:g}/h, a configuration's is that times its replicas"
                                         if a.usd_per_hour is not None else "no price: ranked by goodput per replica"))
    cost = a.usd_per_hour is not None
    print(f"{'replicas':>11} {'router':>14}" + (f" {'configuration':>36}" if engines else "")
          + f" {'SLO met':>8} {'goodput tok/s':>13} "
          f"{'TTFT p99':>9} {'TPOT p99':>9}" + (f" {'USD/h':>7} {'USD/1k good':>11}" if cost else ""))
    for p in out["points"]:
        head = f"{shape(p):>11} {router(p):>14}{engine(p)}"
        if "invalid" in p:
            print(f"{head} invalid: {p['invalid']}")
        elif p.get("pruned"):
            print(f"{head} {'<=' + format(p['attainment_at_most'], '.3f'):>8} stopped: {p['prefix_misses']} of "
                  f"the first {p['prefix_requests']} requests missed")
        else:
            print(f"{head} {_fmt(p['slo']['attainment']):>8} {_fmt(p['slo']['goodput_tok_per_s']):>13} "
                  f"{_fmt(p['ttft_ms']['p99']):>9} {_fmt(p['tpot_ms']['p99']):>9}"
                  + (f" {p['usd_per_hour']:>7.4g} {p['cost_per_1k_good_tokens_usd'] or math.nan:>11.4g}"
                     if cost else ""))
    b = out["best"]
    if b is None:
        print(f"best: no configuration reaches SLO attainment {a.attainment:g} at {a.rate:g} req/s")
        return 0
    money = (f", USD {b['cost_per_1k_good_tokens_usd']:.6f} per 1,000 good tokens at USD {b['usd_per_hour']:g}/h"
             if cost and b["cost_per_1k_good_tokens_usd"] else "")
    where = f"{shape(b)}, router {router(b)}" + (f", {engine(b).lstrip()}" if engines else "")
    print(f"best: {where} (SLO met {b['slo']['attainment']:.3f}, goodput "
          f"{b['slo']['goodput_tok_per_s']:,.1f} tok/s{money})")
    return 0


def cmd_export(a) -> int:
    from core.analysis.export import chrome_trace_json, metrics_csv
    from core.trace import Imported
    if not (a.chrome or a.csv or a.trace_out):
        raise InputError("export: give at least one of --chrome, --csv, --trace-out")
    for flag, path in (("--chrome", a.chrome), ("--csv", a.csv), ("--trace-out", a.trace_out)):
        if path:
            check_writable(path, flag, directory_ok=flag == "--trace-out")   # only a trace can be parts
    rows = _parquet_rows(a.trace)
    if a.out_of_core or (rows is not None and rows > OUT_OF_CORE_ROWS):
        return _export_out_of_core(a, rows)
    got = _read(a.trace)
    tr = got.trace if isinstance(got, Imported) else got
    if tr is None:
        raise InputError(f"{a.trace}: only summary fields; nothing per request to export")
    for path, write in ((a.chrome, lambda p: Path(p).write_text(chrome_trace_json(tr))),
                        (a.csv, lambda p: Path(p).write_text(metrics_csv(tr))),
                        (a.trace_out, lambda p: save_trace(tr, p))):
        if path:
            write_output(path, write)
            print(f"wrote {path}")
    return 0


def _export_out_of_core(a, rows) -> int:
    from core.analysis.export import metrics_frame_csv
    from core.analysis.outofcore import request_metrics_parquet
    if rows is None and not (Path(a.trace).suffix == ".parquet" or Path(a.trace).is_dir()):
        raise InputError(f"{a.trace}: --out-of-core reads Parquet traces (a .parquet file or a directory of parts)")
    if a.chrome or a.trace_out:
        size = "" if rows is None else f" of {rows:,} rows"
        raise InputError(f"export: a trace{size} is exported out of core as per-request metrics (--csv) only: a "
                         "Chrome trace this large opens in no viewer, and the Parquet file is already the trace "
                         "(`python -m core overview` prepares it for the replay page)")
    m = request_metrics_parquet(a.trace)
    write_output(a.csv, lambda p: Path(p).write_text(metrics_frame_csv(m)))
    print(f"wrote {a.csv} ({len(m):,} requests, computed out of core)")
    return 0


def cmd_merge(a) -> int:
    from core.trace.imports.merge import merge
    if len(a.files) < 2:
        raise InputError("merge: give at least two files of one run (a client's file, the server log, spans, "
                         "KV events)")
    check_writable(a.out, "--out")
    parts = [_read(f) for f in a.files]
    try:
        tr, report = merge(parts, [str(f) for f in a.files], run=a.run)
    except TraceError as e:
        raise InputError(f"merge: {e}") from None
    write_output(a.out, lambda p: save_trace(tr, p), "--out")
    if a.json:
        print(json.dumps({"out": a.out, "files": report}, allow_nan=False))
        return 0
    for r in report:
        extra = (f"; matched {r['matched']}" if r["matched"] else "") + (
            f"; left out: {r['left_out']}" if r["left_out"] else "")
        print(f"{r['file']}: {r['role']}; offset {r['offset_ms']:+.3f} ms ± {r['uncertainty_ms']:.3f} ms ({r['how']})"
              + extra)
    print(f"wrote {a.out}: {len(tr.requests)} requests, {len(tr.steps)} steps, {len(tr.kv_events)} KV event rows, "
          f"{len(tr.events_of('gauge'))} gauge samples")
    return 0


def cmd_fleet_merge(a) -> int:
    from core.fleet.merge import merge_replicas
    from core.fleet.router import ROLES
    from core.trace import Trace
    check_writable(a.out, "--out")
    n = len(a.files)
    roles = None
    if a.roles:
        roles = [x.strip() for x in a.roles.split(",")]
        if len(roles) != n or any(r not in ROLES for r in roles):
            raise InputError(f"--roles: expected {n} of {', '.join(ROLES)} (one per file), got {a.roles!r}")
    offsets = None
    if a.offsets_ms:
        try:
            offsets = [float(x) for x in a.offsets_ms.split(",")]
        except ValueError:
            raise InputError(f"--offsets-ms: expected {n} comma-separated numbers, got {a.offsets_ms!r}") from None
        if len(offsets) != n or not all(math.isfinite(x) for x in offsets):
            raise InputError(f"--offsets-ms: expected {n} finite numbers (one per file), got {a.offsets_ms!r}")
    seen: dict = {}
    for f in a.files:     # the same replica twice would be read as two replicas
        key = Path(f).resolve()
        if key in seen:
            raise InputError(f"fleet-merge: {f} is given twice (as replica {seen[key]} and {len(seen)}); give each "
                             "replica's own trace once")
        seen[key] = len(seen)
    traces = []
    for f in a.files:
        tr = _read(f)
        if not isinstance(tr, Trace):
            raise InputError(f"{f}: expected a trace of one replica (serving-trace/1), got {type(tr).__name__}")
        traces.append(tr)
    try:
        tr = merge_replicas(traces, roles=roles, offsets_ms=offsets, label=a.label, names=list(a.files))
    except TraceError as e:
        raise InputError(str(e)) from None
    write_output(a.out, lambda p: save_trace(tr, p), "--out")
    served = tr.finishes.groupby("replica").size().to_dict() if len(tr.finishes) else {}
    print(f"wrote {a.out}: {len(tr.requests)} requests on {n} replicas (finished per replica: "
          + ", ".join(f"{k}: {served.get(k, 0)}" for k in range(n)) + f"), {len(tr.steps)} steps")
    return 0


def main(argv=None) -> int:
    from core.cli import run
    return run(build_parser(), {"simulate": cmd_simulate, "metrics": cmd_metrics, "sweep": cmd_sweep,
                                "search": cmd_search, "compare": cmd_compare, "overview": cmd_overview,
                                "fit": cmd_fit, "export": cmd_export, "merge": cmd_merge,
                                "fleet-merge": cmd_fleet_merge, "fidelity": cmd_fidelity}, argv)


def cmd_fidelity(a) -> int:
    from core.fit.fidelity_cli import run_fidelity
    return run_fidelity(a)


if __name__ == "__main__":
    sys.exit(main())
