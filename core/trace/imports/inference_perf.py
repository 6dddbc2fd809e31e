"""kubernetes-sigs inference-perf's reports (`report: request_lifecycle: per_request: true`):

- `per_request_lifecycle_metrics.json`: a JSON list, one object per request: start_time and
  end_time (the client's perf_counter, seconds), request and response (verbatim text), info
  {input_tokens, response_metrics {output_tokens, output_token_times [s], chunk_times [s],
  server_usage}}, error (null, or what went wrong);
- `summary_lifecycle_metrics.json` and `stage_N_lifecycle_metrics.json`: successes {count,
  latency {request_latency, time_to_first_token, inter_token_latency, time_per_output_token,
  normalized_time_per_output_token: {mean, median, pNN, min, max} in seconds}, throughput
  {output_tokens_per_sec, ...}}, failures {count, ...}.

inference-perf records a time per output token (output_token_times), so token times are its
own: TTFT = the first token's time - start_time, ITL = gaps between tokens, TPOT = (last - first)
/ (n - 1); its request_latency runs to end_time (the end of the response), which our E2E (the
last token) does not include: the difference is the stream's tail after the last token.
"""
from __future__ import annotations

from core.errors import TraceError, short
from core.trace.imports.imported import Imported
from core.trace.imports.rows import RequestRows, count, finite

STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "min": "min", "max": "max"}
OURS = {"ttft_ms": "time_to_first_token", "tpot_ms": "time_per_output_token", "itl_ms": "inter_token_latency",
        "latency_ms": "request_latency"}
PROVENANCE = {"clock": "the client's perf_counter (seconds; not wall-clock time)",
              "arrival_ms": "client: start_time",
              "ttft_ms": "client: the first output_token_times entry - start_time",
              "tpot_ms": "client: inference-perf time_per_output_token",
              "itl_ms": "client: inference-perf inter_token_latency (gaps between output_token_times)",
              "e2e_ms": "client: the last output_token_times entry - start_time",
              "latency_ms": "client: inference-perf request_latency = end_time - start_time (to the response's end, "
                            "after the last token)",
              "output_tok_per_s": "client: inference-perf output_tokens_per_sec (output tokens / (the last end_time - "
                                  "the first start_time))",
              "token_times": "client: output_token_times (one per output token)"}


def looks_like_per_request(doc) -> bool:
    return isinstance(doc, list) and bool(doc) and isinstance(doc[0], dict) and \
        {"start_time", "end_time", "info"} <= doc[0].keys()


def looks_like_summary(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("successes"), dict) and "load_summary" in doc


def _s(v, where, key) -> float:
    if not finite(v):
        raise TraceError(f"{where}: {key}: expected a number of seconds, got {short(v)}")
    return float(v)


def _failure(err) -> str:
    """What went wrong with a failed request, in a few words."""
    if isinstance(err, str):
        return err
    if isinstance(err, dict):
        return (f"{err.get('error_type') or err.get('type') or 'error'}: "
                f"{err.get('error_msg') or err.get('message') or ''}")
    return short(err)


def _add_request(rows: RequestRows, k: int, r: dict, s: float, t0: float, name: str):
    """Request k's row (its start_time s, seconds): its output_token_times, or an empty or failed request."""
    where, rid, at = f"{name}: request {k}", f"req{k}", (s - t0) * 1000.0
    info = r.get("info") if isinstance(r.get("info"), dict) else {}
    rm = info.get("response_metrics") if isinstance(info.get("response_metrics"), dict) else {}
    n_in = count(info.get("input_tokens") or 0, where, "info.input_tokens")
    end = r.get("end_time")
    end_ms = (_s(end, where, "end_time") - t0) * 1000.0 if end is not None else None
    if r.get("error"):
        rows.fail(rid, at, n_in, _failure(r["error"]), index=k, t_ms=end_ms)
        return
    times = rm.get("output_token_times") or rm.get("chunk_times") or []
    if not isinstance(times, list) or not all(finite(x) for x in times):
        raise TraceError(f"{where}: info.response_metrics.output_token_times: expected a list of seconds")
    n_out = count(rm.get("output_tokens", len(times)), where, "info.response_metrics.output_tokens")
    if not n_out or not times:
        rows.empty(rid, at, n_in, t_ms=end_ms)
        return
    rows.add(rid, at, n_in, [(x - t0) * 1000.0 for x in times], n_out, where, end_ms=end_ms)


def import_per_request(doc: list, name: str, summary: dict | None = None) -> Imported:
    starts = [_s(r.get("start_time") if isinstance(r, dict) else None, f"{name}: request {k}", "start_time")
              for k, r in enumerate(doc)]
    t0 = min(starts)
    rows = RequestRows(name)
    for k, (r, s) in enumerate(zip(doc, starts)):
        _add_request(rows, k, r, s, t0, name)
    stats, fs = summary_stats(summary) if summary else ({}, {})
    notes = [f"{len(doc):,} requests from inference-perf's per-request lifecycle metrics (client-side "
             "perf_counter seconds); token times are its output_token_times."]
    if not summary:
        notes.append("No summary_lifecycle_metrics.json beside it: inference-perf's own statistics are not shown.")
    notes += rows.notes()
    meta = {"source": "imported", "label": f"{name} (inference-perf)", "created": "unknown",
            "engine": {"name": "unknown (an OpenAI-compatible server driven by inference-perf)"},
            "device": "not recorded by the client", "notes": " ".join(notes),
            "clock": {"kind": "perf_counter", "t0_s": t0, "resolution_ms": 1e-6,
                      "how": "inference-perf's start_time of the first request (time.perf_counter, seconds)"},
            "provenance": PROVENANCE}
    ends = [r["end_time"] for r in doc if isinstance(r, dict) and finite(r.get("end_time"))]
    window = (0.0, (max(ends) - t0) * 1000.0) if ends else None    # its own: first start to last end
    return Imported(rows.trace(meta), "inference-perf", fs, rows.failed, notes, tool="inference-perf",
                    what="per-request lifecycle metrics", stats=stats, origin=PROVENANCE, window_ms=window)


def summary_stats(doc: dict) -> tuple[dict, dict]:
    stats, fs = {}, {}
    succ = doc.get("successes") if isinstance(doc.get("successes"), dict) else {}
    lat = succ.get("latency") if isinstance(succ.get("latency"), dict) else {}
    for ours, theirs in OURS.items():
        m = lat.get(theirs)
        if isinstance(m, dict):
            for a, b in STATS.items():
                if finite(m.get(a)):
                    stats[(ours, b)] = float(m[a]) * 1000.0
                    fs[f"{theirs}.{a}"] = m[a]
    tp = succ.get("throughput") if isinstance(succ.get("throughput"), dict) else {}
    if finite(tp.get("output_tokens_per_sec")):
        stats[("output_tok_per_s", "value")] = float(tp["output_tokens_per_sec"])
        fs["output_tokens_per_sec"] = tp["output_tokens_per_sec"]
    for key in ("benchmark_time_seconds",):
        if finite(doc.get(key)):
            fs[key] = doc[key]
    fs["successes"] = succ.get("count")
    fail = doc.get("failures")
    fs["failures"] = fail.get("count") if isinstance(fail, dict) else None
    return stats, fs


def import_summary(doc: dict, name: str) -> Imported:
    stats, fs = summary_stats(doc)
    return Imported(None, "inference-perf", fs, notes=[
        f"{name} is inference-perf's summary: its own statistics only, no per-request rows. Per-request data is in "
        "per_request_lifecycle_metrics.json beside it (written with report.request_lifecycle.per_request: true)."],
        tool="inference-perf", what="summary lifecycle metrics", stats=stats, origin=PROVENANCE)


# ---- the stage report (inference-perf.partial.stage_N.yaml) ---------------------------------------
#
# The benchmark report inference-perf writes per stage ("BR 0.2": version 0.2.x): run {uid, eid, time
# {start, end, duration}}, results.request_performance.aggregate {requests {total, failures, ...},
# latency {time_to_first_token, time_per_output_token, inter_token_latency, request_latency,
# normalized_time_per_output_token: {units, mean, stddev, min, p0p1, p1, ..., p99, p99p9, max}},
# throughput {output_token_rate, request_rate, ...: {units, mean}}} (reportgen/br/v0_2/adapter.py;
# a real one: data/imports/inference_perf/ip_rate4_p64_o32/inference-perf.partial.stage_0.yaml).

BR_STATS = {"mean": "mean", "p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "min": "min", "max": "max"}
BR_UNIT_MS = {"s": 1000.0, "s/token": 1000.0, "ms": 1.0, "ms/token": 1.0}


def looks_like_stage_report(doc) -> bool:
    res = doc.get("results") if isinstance(doc, dict) else None
    return isinstance(res, dict) and isinstance(res.get("request_performance"), dict) and isinstance(doc.get("run"),
                                                                                                  dict)


def import_stage_report(doc: dict, name: str) -> Imported:
    """The stage's own statistics in our units (no per-request rows: a summary, like
    summary_lifecycle_metrics.json)."""
    where = "results.request_performance.aggregate"
    agg = doc["results"]["request_performance"].get("aggregate")
    if not isinstance(agg, dict):
        raise TraceError(f"{name}: {where}: expected the stage's aggregate statistics, got {short(agg)}")
    stats, fs = {}, {"version": doc.get("version")}
    lat = agg.get("latency") if isinstance(agg.get("latency"), dict) else {}
    for ours, theirs in OURS.items():
        m = lat.get(theirs)
        if not isinstance(m, dict):
            continue
        scale = BR_UNIT_MS.get(m.get("units"))
        if scale is None:
            raise TraceError(f"{name}: {where}.latency.{theirs}.units: expected one of {', '.join(BR_UNIT_MS)}, got "
                             f"{short(m.get('units'))}")
        for a, b in BR_STATS.items():
            if finite(m.get(a)):
                stats[(ours, b)] = float(m[a]) * scale
                fs[f"{theirs}.{a}"] = m[a]
    tp = agg.get("throughput") if isinstance(agg.get("throughput"), dict) else {}
    out_rate = tp.get("output_token_rate") if isinstance(tp.get("output_token_rate"), dict) else {}
    if finite(out_rate.get("mean")):
        stats[("output_tok_per_s", "value")] = float(out_rate["mean"])
        fs["output_token_rate"] = out_rate["mean"]
    reqs = agg.get("requests") if isinstance(agg.get("requests"), dict) else {}
    fs.update({f"requests.{k}": reqs.get(k) for k in ("total", "failures") if k in reqs})
    t = doc["run"].get("time") if isinstance(doc["run"].get("time"), dict) else {}
    fs.update({f"run.time.{k}": str(t[k]) for k in ("start", "end", "duration") if k in t})
    return Imported(None, "inference-perf", fs, notes=[
        f"{name} is inference-perf's report of one stage (benchmark report {doc.get('version')}): its own "
        "statistics only, no per-request rows. Per-request data is in per_request_lifecycle_metrics.json beside it "
        "(written with report.request_lifecycle.per_request: true)."],
        tool="inference-perf", what="stage report (inference-perf.partial.stage_N.yaml)", stats=stats,
        origin=PROVENANCE)
