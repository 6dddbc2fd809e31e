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


def import_per_request(doc: list, name: str, summary: dict | None = None) -> Imported:
    starts = [_s(r.get("start_time") if isinstance(r, dict) else None, f"{name}: request {k}", "start_time")
              for k, r in enumerate(doc)]
    t0 = min(starts)
    rows = RequestRows(name)
    for k, (r, s) in enumerate(zip(doc, starts)):
        where, rid, at = f"{name}: request {k}", f"req{k}", (s - t0) * 1000.0
        info = r.get("info") if isinstance(r.get("info"), dict) else {}
        rm = info.get("response_metrics") if isinstance(info.get("response_metrics"), dict) else {}
        n_in = count(info.get("input_tokens") or 0, where, "info.input_tokens")
        end = r.get("end_time")
        end_ms = (_s(end, where, "end_time") - t0) * 1000.0 if end is not None else None
        if r.get("error"):
            err = r["error"]
            msg = err if isinstance(err, str) else (f"{err.get('error_type') or err.get('type') or 'error'}: "
                                                   f"{err.get('error_msg') or err.get('message') or ''}"
                                                   if isinstance(err, dict) else short(err))
            rows.fail(rid, at, n_in, msg, index=k, t_ms=end_ms)
            continue
        times = rm.get("output_token_times") or rm.get("chunk_times") or []
        if not isinstance(times, list) or not all(finite(x) for x in times):
            raise TraceError(f"{where}: info.response_metrics.output_token_times: expected a list of seconds")
        n_out = count(rm.get("output_tokens", len(times)), where, "info.response_metrics.output_tokens")
        if not n_out or not times:
            rows.empty(rid, at, n_in, t_ms=end_ms)
            continue
        rows.add(rid, at, n_in, [(x - t0) * 1000.0 for x in times], n_out, where, end_ms=end_ms)
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
