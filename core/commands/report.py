"""python -m core metrics | compare | overview | export: what a trace (or another tool's file) says, side by side,
for the replay page, or in another format."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from core.cli import add_slo_flags, check_writable, write_output
from core.cli import finite_float as _finite_float
from core.cli import nonneg_float as _nonneg_float
from core.cli import nonneg_int as _nonneg_int
from core.commands import common
from core.commands.common import fmt_num, parquet_rows_of, read_any, save_trace, slo_from_args
from core.errors import MAX_DECOMPRESSED_BYTES, InputError


def add_parsers(sub) -> None:
    """This group's subcommands."""
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
                        f"{common.OUT_OF_CORE_ROWS:,} rows is by default (core/analysis/outofcore.py)")

    c = sub.add_parser("compare", help="two traces side by side: key metrics with difference and ratio, and where "
                                       "their workloads differ (out of core for large Parquet traces)")
    c.add_argument("first", help="a trace or an engine's result file")
    c.add_argument("second", help="another trace of the same workload")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--out-of-core", action="store_true",
                   help="summarise Parquet traces where the data lives (DuckDB), as one of more than "
                        f"{common.OUT_OF_CORE_ROWS:,} rows is by default")

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
                        f"{common.OUT_OF_CORE_ROWS:,} rows by default")

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
    rows = parquet_rows_of(path)
    if out_of_core or (rows is not None and rows > common.OUT_OF_CORE_ROWS):
        if rows is None and not (Path(path).suffix == ".parquet" or Path(path).is_dir()):
            raise InputError(f"{path}: --out-of-core reads Parquet traces (a .parquet file or a directory of parts)")
        from core.analysis.outofcore import request_table_parquet, summarize_parquet
        out = summarize_parquet(path)
        return out["summary"], request_table_parquet(path), out["computed"]
    got = read_any(path)
    tr = got.trace if isinstance(got, Imported) else got
    if tr is None:
        raise InputError(f"{path}: only summary fields; nothing per request to compare")
    return summarize(tr, per_request=False, client_window_too=False)["summary"], tr.requests, {"out_of_core": False}

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
    rows = parquet_rows_of(a.trace)
    if a.out_of_core or (rows is not None and rows > common.OUT_OF_CORE_ROWS):
        return _metrics_out_of_core(a, rows)
    got = read_any(a.trace)
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
        print(f"{r['id'][-10:]:>10} {r['arrival_ms']:>10.3f} {fmt_num(r['ttft_ms']):>10} {fmt_num(r['tpot_ms']):>10} "
              f"{fmt_num(r['e2e_ms']):>10} {r['output_tokens']:>7}")
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
              f"{st['busy_ms']:,.3f} ms ({fmt_num(st['busy_fraction'])}); duration mean {fmt_num(d['mean'])} ms, p50 "
              f"{fmt_num(d['median'])}, p99 {fmt_num(d['p99'])}{tokens}")
    kv = s.get("kv_events")
    if kv:
        print(f"engine prefix cache (KV events): {kv['stored_blocks']:,} blocks stored, {kv['removed_blocks']:,} "
              f"removed, {kv['cleared']} clear(s), at most {kv['peak_cached_blocks']:,} cached at once")
    if s.get("fleet"):
        _print_fleet(s["fleet"])
    for row in out.get("tool_comparison", []):
        rel = row["relative_difference"]
        print(f"{out['tool']} {row['metric']} {row['stat']}: file {fmt_num(row['file'])}, ours {fmt_num(row['ours'])}"
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
        lat = f"; TTFT p50 {fmt_num(t['p50'])} p99 {fmt_num(t['p99'])} ms, E2E p50 {fmt_num(e['p50'])} p99 " \
              f"{fmt_num(e['p99'])} ms" if t["n"] else ""
        hits = "" if r["prefix_hit_blocks"] is None else \
            f", {r['prefix_hit_blocks']:,} prefix-hit blocks ({r['prefix_hit_blocks_source']}" + (
                "" if r["prefix_hit_rate"] is None else f"; on first admission {r['prefix_hit_blocks_first']:,} of "
                f"{r['prompt_blocks']:,} prompt blocks routed, {r['prefix_hit_rate']:.1%}") + ")"
        if r.get("prefix_hit_tokens") is not None:     # the server's own counters (a vLLM fleet)
            q = r.get("prefix_query_tokens")
            hits += f", prefix-cache hits {r['prefix_hit_tokens']:,}" + (f" of {q:,}" if q else "") + \
                " prompt tokens (the server's own counters)"
        elif r["prefix_hit_blocks"] is None:
            hits = ", prefix-cache hits unknown (no KV rows, no counters)"
        print(f"  replica {r['replica']} ({r['role']}{sm}): {r['routed']} routed, {r['requests']} finished, "
              f"{r['prefilled']} prefilled{lat}; {r['steps']:,} steps, busy {fmt_num(r['busy_fraction'])}{hits}")
    ro = f["router"]
    stale = "" if ro["staleness_ms"] is None else f", staleness {ro['staleness_ms']:g} ms"
    dec = f", decode {fmt_num(ro['imbalance_decode'])}" if "imbalance_decode" in ro else ""
    print(f"  router {ro['policy'] or '(policy not recorded)'}{stale}: imbalance (max/mean routed, from "
          f"{ro['routed_from']}) {fmt_num(ro['imbalance'])}{dec}; {ro['rejected']} rejected")
    pc = f.get("prefix_cache") or {}
    if pc.get("hit_rate") is not None:
        print(f"  prefix hit rate {pc['hit_rate']:.1%}: {pc['hit_blocks_first']:,} hit blocks on first admission of "
              f"{pc['prompt_blocks']:,} full prompt blocks routed ({pc['hit_blocks_all']:,} hit blocks in all, "
              "re-admissions after preemptions included)")
    x = f.get("transfers")
    if x is not None:
        print(f"  KV transfers: {x['count']:,}, {x['bytes']:,} bytes; time mean {fmt_num(x['mean_ms'])} ms, p99 "
              f"{fmt_num(x['p99_ms'])} ms; waited on the link mean {fmt_num(x['waited_ms_mean'])} ms, then for decode "
              f"admission mean {fmt_num(x['decode_admit_wait_ms_mean'])} ms")
    for n in f["notes"]:
        print(f"  note: {n}")

def _print_request_summary(s):
    w0, w1 = s["window_ms"]
    print(f"output throughput: {s['output_tokens']} tokens / {(w1 - w0) / 1000:g} s = "
          f"{fmt_num(s['output_tok_per_s'])} tok/s over the {s['window_kind']} window [{w0:g}, {w1:g}] ms")
    if s["cost_usd"] is not None:
        per_1k = s["cost_per_1k_output_usd"]
        print(f"cost at USD {s['usd_per_hour']:g}/h over that window: {s['cost_usd']:.9f} USD per run, "
              f"{'—' if per_1k is None else f'{per_1k:.6f}'} USD per 1,000 output tokens")
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[k]
        print(f"{k:>8}: n={d['n']} mean={fmt_num(d['mean'])} median={fmt_num(d['median'])} "
              f"p90={fmt_num(d['p90'])} p99={fmt_num(d['p99'])}")
    print(f"percentile estimator: {s['percentile_estimator']}")
    if "slo" in s:
        o, v = s["slo"], s["slo"]["violations"]
        bounds = ", ".join(f"{k.split('_')[0].upper()} <= {o[k]:g} ms" for k in ("ttft_ms", "tpot_ms", "e2e_ms")
                           if o[k] is not None)
        print(f"SLOs ({bounds}): {o['met']} of {o['requests']} requests met them "
              f"(attainment {fmt_num(o['attainment'])}); goodput {fmt_num(o['goodput_req_per_s'])} req/s, "
              f"{fmt_num(o['goodput_tok_per_s'])} tok/s; violations: "
              + ", ".join(f"{k} {n}" for k, n in v.items() if n is not None))
    ll = s["littles_law"]
    print(f"Little's law: L = {fmt_num(ll['L'])} requests in system, lambda W = {fmt_num(ll['lambda_W'])} "
          f"(lambda = {fmt_num(ll['arrival_rate_per_s'])} req/s, W = {fmt_num(ll['W_ms'])} ms)")
    u = s["utilisation"]
    peak = "_peak" if "replicas" not in (u or {}) else "_peak_one_replica"   # a fleet: means of all, peaks of one
    if u is not None and u[f"running{peak}"] is not None:
        one = "" if peak == "_peak" else " on one replica"
        whole = "" if peak == "_peak" else f" (all {u['replicas']} replicas together)"
        kv = (f"; KV blocks in use: mean {fmt_num(u['kv_used_blocks_mean'])}, peak{one} {u[f'kv_used_blocks{peak}']}"
              + (f" of {u['kv_blocks']}" if "kv_blocks" in u else ""))
        print(f"running sequences{whole}: mean {fmt_num(u['running_mean'])}, peak{one} {u[f'running{peak}']}{kv}")

def cmd_export(a) -> int:
    from core.analysis.export import chrome_trace_json, metrics_csv
    from core.trace import Imported
    if not (a.chrome or a.csv or a.trace_out):
        raise InputError("export: give at least one of --chrome, --csv, --trace-out")
    for flag, path in (("--chrome", a.chrome), ("--csv", a.csv), ("--trace-out", a.trace_out)):
        if path:
            check_writable(path, flag, directory_ok=flag == "--trace-out")   # only a trace can be parts
    rows = parquet_rows_of(a.trace)
    if a.out_of_core or (rows is not None and rows > common.OUT_OF_CORE_ROWS):
        return _export_out_of_core(a, rows)
    got = read_any(a.trace)
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
