"""python -m core fit | merge | fidelity | fleet-merge: measured runs: a step model fitted, files joined into one
run, the simulator held against runs, replicas' traces joined into one fleet trace."""
from __future__ import annotations

import json
import math
from pathlib import Path

from core.cli import check_writable, write_output
from core.cli import nonneg_int as _nonneg_int
from core.commands import common
from core.commands.common import bounded_int, parquet_rows_of, read_any, save_trace
from core.config import SchedulerConfig, add_flags, from_args
from core.errors import InputError, TraceError


def add_parsers(sub) -> None:
    """This group's subcommands."""
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
                        f"of more than {common.OUT_OF_CORE_ROWS:,} rows is by default (core/fit/outofcore.py)")
    f.add_argument("--from-requests", action="store_true",
                   help="fit an affine model to the requests' measured TTFT and E2E by simulating the workload under "
                        "the engine's scheduler settings (the flags below; default policy vllm-v1) instead of to "
                        "step events (core.fit.reqfit)")
    f.add_argument("--from-token-times", action="store_true",
                   help="fit to engine steps inferred from the streamed tokens' arrival times (each step's tokens "
                        "reach the client together; core.fit.stepinfer): for files without step events whose "
                        "per-token times are known, e.g. a vLLM result with itls; uses the flags below")
    f.add_argument("--search-rounds", type=bounded_int(1, 1000), default=15,
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
                         "the fit runs' own); a closed loop's from its steps that compute prompt tokens")
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
    fm.add_argument("files", nargs="+", help="replica k is the k-th: its trace (ours: gpu_runner serve --trace-out), "
                                             "or a folder of its server's own files (vLLM: the server log, OTLP "
                                             "spans, KV events, /metrics scrapes), or one such file")
    fm.add_argument("--client", metavar="FILE", help="the benchmark client's file for the whole fleet (vllm bench "
                                                      "serve, AIPerf, guidellm, ...): its requests joined to the "
                                                      "replicas' by the X-Request-Id each sent (by time only where "
                                                      "no id matches; core.fleet.client)")
    fm.add_argument("--out", required=True, help="the fleet trace (.json, .json.gz, .parquet)")
    fm.add_argument("--roles", help="each replica's role, comma-separated: both | prefill | decode (default: both "
                                    "for every one)")
    fm.add_argument("--offsets-ms", help="comma-separated ms added to each replica's times (default: from the clock "
                                         "each trace records: one host's monotonic clock, epoch origins; a replica "
                                         "that cannot be placed is refused)")
    fm.add_argument("--label", help="the merged trace's label")

def cmd_fit(a) -> int:
    if a.out:
        check_writable(a.out, "--out", directory_ok=False)
    if a.from_requests and a.from_token_times:
        raise InputError("fit: choose one of --from-requests and --from-token-times")
    rows = parquet_rows_of(a.trace)
    big = rows is not None and rows > common.OUT_OF_CORE_ROWS
    if a.out_of_core or (big and not (a.from_requests or a.from_token_times)):
        sm, report = _fit_out_of_core(a, rows)
    else:
        sm, report = _fit_in_memory(a, read_any(a.trace))
    return _fit_report(a, sm, report)

def _fit_out_of_core(a, rows: int | None):
    """(step model, report) fitted to a Parquet trace's step events where the data lives (--out-of-core)."""
    if a.from_requests or a.from_token_times:
        raise InputError("fit: --out-of-core fits to step events; --from-requests and --from-token-times read the "
                         "trace in memory")
    if rows is None and not (Path(a.trace).suffix == ".parquet" or Path(a.trace).is_dir()):
        raise InputError(f"{a.trace}: --out-of-core reads Parquet traces (a .parquet file or a directory of parts)")
    # (a damaged .parquet file goes on to the reader, which names what is wrong with it)
    from core.fit.outofcore import fit_parquet
    return fit_parquet(a.trace, a.model or "features")

def _fit_in_memory(a, tr):
    """(step model, report) fitted to the trace read: to its inferred steps (--from-token-times), its
    requests (--from-requests), or its step events."""
    from core.trace import Imported
    if a.from_token_times:
        from core.fit.stepinfer import fit_inferred
        if isinstance(tr, Imported) and (tr.trace is None or tr.aligned_at_zero):
            raise InputError(f"{a.trace}: inferring steps needs each request's send time and per-token times "
                             "(a vLLM result saved with --save-detailed and start_times)")
        return fit_inferred(tr.trace if isinstance(tr, Imported) else tr, from_args(SchedulerConfig, a),
                            a.model or "affine")
    if a.from_requests:
        from core.fit.reqfit import fit_from_requests
        if isinstance(tr, Imported) and tr.trace is None:
            raise InputError(f"{a.trace}: the file has only summary numbers, no per-request measurements to fit")
        return fit_from_requests(tr.trace if isinstance(tr, Imported) else tr, from_args(SchedulerConfig, a),
                                 a.model or "affine", search_rounds=a.search_rounds,
                                 send_times_known=not (isinstance(tr, Imported) and tr.aligned_at_zero))
    return _fit_steps(a, tr)

def _fit_steps(a, tr):
    """(step model, report) fitted to the trace's step events (affine for an iteration log's counted steps)."""
    from core.fit.stepfit import counted_steps, fit
    from core.trace import Imported
    if isinstance(tr, Imported) and (tr.trace is None or not len(tr.trace.steps)):
        raise InputError(f"{a.trace}: {tr.label} has no step events to fit a step model to; "
                         f"--from-token-times fits one to the steps inferred from its streamed tokens, "
                         f"--from-requests to its per-request TTFT and E2E; an engine's iteration log "
                         f"(vLLM --enable-logging-iteration-details) has its steps")
    steps_of = tr.trace if isinstance(tr, Imported) else tr
    return fit(steps_of, a.model or ("affine" if counted_steps(steps_of) else "features"))

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

def cmd_merge(a) -> int:
    from core.trace.imports.merge import merge
    if len(a.files) < 2:
        raise InputError("merge: give at least two files of one run (a client's file, the server log, spans, "
                         "KV events)")
    check_writable(a.out, "--out")
    parts = [read_any(f) for f in a.files]
    fleets = [k for k, x in enumerate(parts) if _is_fleet(x)]
    if fleets:
        return _merge_with_fleet(a, parts, fleets)
    tr, report = _merged(a, lambda: merge(parts, [str(f) for f in a.files], run=a.run))
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

def _merged(a, make):
    """(trace, report) of `make`, written to --out; its TraceError as the merge's one-line error."""
    try:
        tr, report = make()
    except TraceError as e:
        raise InputError(f"merge: {e}") from None
    write_output(a.out, lambda p: save_trace(tr, p), "--out")
    return tr, report


def _is_fleet(x) -> bool:
    """A trace of several replicas (meta.fleet, or replicas named in its records)."""
    from core.trace import Trace
    return isinstance(x, Trace) and (isinstance(x.meta.get("fleet"), dict) or bool(len(x.finishes) and (
        x.finishes["replica"] > 0).any()) or bool(len(x.steps) and (x.steps["replica"] > 0).any()))


def _merge_with_fleet(a, parts, fleets) -> int:
    """A client's file with a fleet's trace: joined by the ids the client sent (core.fleet.client),
    never paired across replicas by time where ids exist."""
    from core.fleet.client import join_client
    if len(fleets) > 1 or len(parts) != 2:
        raise InputError(f"merge: {a.files[fleets[0]]} is a fleet's trace: give it with its client's file alone "
                         "(or each replica's files to python -m core fleet-merge, with --client)")
    f = fleets[0]
    client = _client_trace(a.files[1 - f], a.run)
    tr, joined = _merged(a, lambda: join_client(parts[f], client, a.files[1 - f]))
    if a.json:
        print(json.dumps({"out": a.out, "client": joined}, allow_nan=False))
        return 0
    _print_join(joined)
    print(f"wrote {a.out}: {len(tr.requests)} requests, {len(tr.steps)} steps (the fleet's, on the client's clock)")
    return 0


def _print_alignment(tr) -> None:
    """How each replica was placed on the fleet's clock (core.fleet.clocks)."""
    for r in tr.meta["fleet"].get("alignment") or ():
        unc = "" if r["uncertainty_ms"] is None else f" ± {r['uncertainty_ms']:.3g} ms"
        print(f"{r['file']}: replica {r['replica']}, offset {r['offset_ms']:+.3f} ms{unc} ({r['how']})")


def _client_trace(path: str, run: int | None = None):
    """The client's requests (a file of several runs: run `run`, else refused)."""
    from core.trace import Imported, Trace
    x = read_any(path)
    window = None
    if isinstance(x, Imported):
        if len(x.runs) > 1 and run is not None:
            if not 0 <= run < len(x.runs):
                raise InputError(f"--run {run}: {path} holds runs 0..{len(x.runs) - 1}")
            x = x.runs[run]
        elif len(x.runs) > 1:
            raise InputError(f"{path}: holds {len(x.runs)} runs; a fleet's client file is one run (merge --run K)")
        window = x.window_ms
        x = x.trace
    if not isinstance(x, Trace) or not len(x.requests):
        raise InputError(f"--client {path}: no per-request records to join (a summary only?)")
    if window is not None:
        x.meta["client_window"] = {"start_ms": float(window[0]), "end_ms": float(window[1]),
                                   "how": f"{path}: the client's own throughput window (its duration)"}
    return x


def _print_join(r: dict) -> None:
    how = (f"{r['by_id']} by the ids it sent" if r["by_id"] else
           f"{r['by_time']} by time in order of arrival, {r['ambiguous']} of them ambiguous")
    print(f"{r['file']}: client requests joined: {how}; {r['unmatched']} on no replica"
          + (f"; {r['twice']} ids on two replicas (the finished copy taken)" if r["twice"] else "")
          + f"; {r['engine_only']} engine requests not the client's; the fleet's times moved "
          f"{r['offset_ms']:+.3f} ms ± {r['uncertainty_ms']:.3f} ms ({r['how']})")


def cmd_fleet_merge(a) -> int:
    from core.fleet.client import join_client
    from core.fleet.merge import merge_replicas
    from core.fleet.replica_files import replica_trace
    from core.fleet.router import ROLES
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
    traces, made = [], []
    for f in a.files:
        tr, how = replica_trace(f)
        traces.append(tr)
        made.append(how)
    client = _client_trace(a.client) if a.client else None
    try:
        tr = merge_replicas(traces, roles=roles, offsets_ms=offsets, label=a.label, names=list(a.files))
        if client is not None:
            tr, joined = join_client(tr, client, a.client)
    except TraceError as e:
        raise InputError(str(e)) from None
    write_output(a.out, lambda p: save_trace(tr, p), "--out")
    for k, (f, how) in enumerate(zip(a.files, made)):
        if how != "its own trace":
            print(f"replica {k}: {f}: {how}")
    _print_alignment(tr)
    if client is not None:
        _print_join(joined)
    served = tr.finishes.groupby("replica").size().to_dict() if len(tr.finishes) else {}
    nowhere = f"; on no replica's files: {served[-1]}" if served.get(-1) else ""
    print(f"wrote {a.out}: {len(tr.requests)} requests on {n} replicas (finished per replica: "
          + ", ".join(f"{k}: {served.get(k, 0)}" for k in range(n)) + f"{nowhere}), {len(tr.steps)} steps")
    return 0

def cmd_fidelity(a) -> int:
    from core.fit.fidelity_cli import run_fidelity
    return run_fidelity(a)
