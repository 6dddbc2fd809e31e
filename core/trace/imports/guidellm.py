"""guidellm's reports (`guidellm run --output kind=json|yaml`): `benchmarks.json` / `.yaml`.

One file holds one or more benchmarks (a sweep, or one per concurrency / rate); each becomes a
run. A benchmark's `requests` are split into successful, incomplete (cancelled after they
started) and errored lists; a request record has request_id, prompt_tokens, output_tokens, the
computed time_to_first_token_ms, inter_token_latency_ms, time_per_output_token_ms and
request_latency (s), and `info.timings` (epoch seconds): request_start, first_token_iteration,
last_token_iteration, request_end, ...

guidellm keeps no per-token times: a request's tokens are placed at its first token and evenly
up to its last ("token times interpolated", as guidellm itself does for its rates), so TTFT and
TPOT = (last - first) / (n - 1) are exact and ITL is each request's average gap. Names mapped:
guidellm's inter_token_latency_ms is our TPOT; its time_per_output_token_ms (latency / tokens,
TTFT included) has no counterpart here; its request_latency (to request_end, after the stream's
end) is our request latency, not our E2E (to the last token). guidellm's percentiles are
nearest-rank ('inverted_cdf') over samples weighted as it weights them (ITL: output tokens - 1).
"""
from __future__ import annotations

from core.errors import TraceError, short
from core.trace.imports.imported import Imported
from core.trace.imports.rows import RequestRows, count, finite

OURS = {"ttft_ms": ("time_to_first_token_ms", 1.0), "tpot_ms": ("inter_token_latency_ms", 1.0),
        "latency_ms": ("request_latency", 1000.0)}
STATS = {"mean": "mean", "median": "p50", "std_dev": "std", "min": "min", "max": "max"}
PCTS = {"p90": "p90", "p95": "p95", "p99": "p99"}
NAMED_RUNS = 5          # benchmarks named in each benchmark's note
MAX_BENCHMARKS = 1_000  # in one report (a sweep has tens; each becomes a run held in memory, ~90 KB with one request)
PROVENANCE = {"clock": "epoch seconds (info.timings, the client's time.time())",
              "arrival_ms": "client: info.timings.request_start (request headers written)",
              "ttft_ms": "client: guidellm time_to_first_token_ms (first_token_iteration - request_start)",
              "tpot_ms": "client: guidellm inter_token_latency_ms ((last - first token) / (tokens - 1))",
              "e2e_ms": "client: last_token_iteration - request_start",
              "latency_ms": "client: guidellm request_latency (request_end - request_start)",
              "output_tok_per_s": "client: guidellm output_tokens_per_second, total, mean (tokens / the "
                                  "benchmark's measured window)",
              "token_times": "interpolated: guidellm records only the first and last token times"}


def looks_like_report(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list) and (
        "guidellm_version" in (doc.get("metadata") or {}) or any(
            isinstance(b, dict) and isinstance(b.get("requests"), dict) for b in doc["benchmarks"][:1]))


def _t(timings: dict, key: str, where: str) -> float | None:
    v = timings.get(key)
    if v is None:
        return None
    if not (finite(v) and v > 0):
        raise TraceError(f"{where}: info.timings.{key}: expected epoch seconds, got {short(v)}")
    return float(v)


def _label(b: dict, k: int) -> str:
    st = ((b.get("config") or {}).get("strategy") or {}) if isinstance(b.get("config"), dict) else {}
    kind = st.get("type_") or "benchmark"
    for key in ("streams", "rate", "max_concurrency"):
        if st.get(key) is not None:
            return f"{kind}@{st[key]:g}" if isinstance(st[key], (int, float)) else f"{kind}@{st[key]}"
    return f"{kind} #{k}"


def import_report(doc: dict, name: str) -> Imported:
    version = str((doc.get("metadata") or {}).get("guidellm_version", ""))
    benches = [b for b in doc["benchmarks"] if isinstance(b, dict)]
    if not benches:
        raise TraceError(f"{name}: benchmarks: the report lists no benchmarks")
    if len(benches) > MAX_BENCHMARKS:
        raise TraceError(f"{name}: benchmarks: {len(benches):,} benchmarks, more than the {MAX_BENCHMARKS:,} one "
                         "report may hold (a sweep has tens); split the report")
    runs = [_benchmark(b, k, name, version) for k, b in enumerate(benches)]
    if len(runs) > 1:
        # each run's note names a few runs, not all of them (a note per run naming every run is
        # quadratic: 10,000 benchmarks made 2.4 GB of notes)
        shown = ", ".join(x.run_label for x in runs[:NAMED_RUNS])
        more = f", and {len(runs) - NAMED_RUNS:,} more" if len(runs) > NAMED_RUNS else ""
        for k, r in enumerate(runs):
            r.runs = runs
            r.notes.insert(0, f"{name} holds {len(runs):,} benchmarks ({shown}{more}); this is benchmark {k}, "
                              f"{r.run_label}.")
    return runs[0]


def _records(b: dict, where0: str) -> list[tuple[str, dict]]:
    """The benchmark's request records, (kind, record), successful first."""
    reqs = b.get("requests")
    if not isinstance(reqs, dict):
        raise TraceError(f"{where0}.requests: expected an object with successful, incomplete, errored lists")
    records = [(kind, r) for kind in ("successful", "incomplete", "errored")
               for r in (reqs.get(kind) or []) if isinstance(r, dict)]
    if not records:
        raise TraceError(f"{where0}.requests: no request records (guidellm keeps them unless sampled away)")
    return records


def _started(records: list[tuple[str, dict]], where0: str) -> list[tuple]:
    """Each record as (kind, record, info.timings, start in epoch s, where)."""
    parsed = []
    for j, (kind, r) in enumerate(records):
        where = f"{where0}.requests.{kind}[{j}]"
        tm = (r.get("info") or {}).get("timings") or {}
        start = _t(tm, "request_start", where) or (r.get("request_start_time") if finite(r.get("request_start_time"))
                                                   else None)
        if start is None:
            raise TraceError(f"{where}: info.timings.request_start: missing (the request never started)")
        parsed.append((kind, r, tm, float(start), where))
    return parsed


def _add_request(rows: RequestRows, t0: float, rid: str, kind: str, r: dict, tm: dict, start: float, where: str):
    """One request record's row: interpolated tokens, or an empty or failed request."""
    at = (start - t0) * 1000.0
    n_in = count(r.get("prompt_tokens") or 0, where, "prompt_tokens")
    end = _t(tm, "request_end", where)
    end_ms = None if end is None else (end - t0) * 1000.0
    first, last = _t(tm, "first_token_iteration", where), _t(tm, "last_token_iteration", where)
    n_out = count(r.get("output_tokens") or 0, where, "output_tokens")
    err = (r.get("info") or {}).get("error")
    reason = {"successful": "length", "incomplete": "abort", "errored": "error"}[kind]
    if first is None or last is None or n_out == 0:
        if kind == "successful":
            rows.empty(rid, at, n_in, t_ms=end_ms)
        else:
            rows.fail(rid, at, n_in, str(err or kind), t_ms=end_ms, reason=reason)
        return
    rows.add_interpolated(rid, at, n_in, (first - t0) * 1000.0, (last - t0) * 1000.0, n_out, where,
                          reason=reason, end_ms=end_ms, error=str(err or kind) if kind != "successful" else None)


def _meta(b: dict, name: str, label: str, version: str, t0: float, notes: list[str]) -> dict:
    meta = {"source": "imported", "label": f"{name} [{label}] (guidellm{' ' + version if version else ''})",
            "created": "unknown", "engine": {"name": "unknown (an OpenAI-compatible server driven by guidellm)",
                                             "strategy": ((b.get("config") or {}).get("strategy"))},
            "device": "not recorded by the client", "notes": " ".join(notes),
            "clock": {"kind": "epoch", "t0_s": t0, "resolution_ms": 1e-3,
                      "how": "guidellm's info.timings.request_start of the benchmark's first request"},
            "provenance": PROVENANCE}
    load = _load(b)
    if load:
        meta["load"] = load
    return meta


def _window(b: dict, t0: float) -> tuple[float, float] | None:
    """The benchmark's measured window, ms on the trace's clock."""
    if finite(b.get("start_time")) and finite(b.get("end_time")) and b["end_time"] > b["start_time"]:
        return (b["start_time"] - t0) * 1000.0, (b["end_time"] - t0) * 1000.0
    return None


def _benchmark(b: dict, k: int, name: str, version: str) -> Imported:
    label = _label(b, k)
    where0 = f"{name}: benchmarks[{k}]"
    records = _records(b, where0)
    parsed = _started(records, where0)
    t0 = min(p[3] for p in parsed)
    rows = RequestRows(f"{name} [{label}]")
    response_ids = {}
    for kind, r, tm, start, where in parsed:
        rid = str(r.get("request_id") or f"req{len(rows.reqs)}")
        if isinstance(r.get("response_id"), str):
            response_ids[rid] = r["response_id"]
        _add_request(rows, t0, rid, kind, r, tm, start, where)
    stats, fs = _stats(b)
    notes = [f"{len(records):,} requests of guidellm benchmark {label} (client-side, epoch seconds); token times "
             "interpolated between each request's first and last token (guidellm keeps no per-token times)."]
    notes += rows.notes()
    tr = rows.trace(_meta(b, name, label, version, t0, notes))
    for k, rid in enumerate(tr.ids):       # the server's id for it (merge pairs requests with spans by it)
        if rid in response_ids:
            tr.request_extra[k]["response_id"] = response_ids[rid]
    return Imported(tr, "guidellm", fs, rows.failed, notes, tool=f"guidellm {version}".strip(),
                    what="benchmark report", stats=stats, origin=PROVENANCE, run_label=label,
                    estimator="inverted_cdf", weights={"tpot_ms": "tokens-1"}, window_ms=_window(b, t0))


def _load(b: dict) -> dict | None:
    """Where the benchmark sits on a load sweep's axis (core.lessons.load.run_load): concurrent
    and synchronous strategies are closed loops, constant and poisson open ones."""
    st = ((b.get("config") or {}).get("strategy") or {}) if isinstance(b.get("config"), dict) else {}
    kind = st.get("type_")
    if kind == "synchronous":
        return {"kind": "closed", "concurrency": 1}
    if kind == "concurrent" and finite(st.get("streams")) and st["streams"] >= 1:
        return {"kind": "closed", "concurrency": int(st["streams"])}
    if kind in ("constant", "poisson") and finite(st.get("rate")) and st["rate"] > 0:
        return {"kind": "open", "rate": float(st["rate"])}
    return None


def _stats(b: dict) -> tuple[dict, dict]:
    stats, fs = {}, {}
    m = b.get("metrics") if isinstance(b.get("metrics"), dict) else {}
    for ours, (theirs, scale) in OURS.items():
        d = ((m.get(theirs) or {}).get("successful")) if isinstance(m.get(theirs), dict) else None
        if not isinstance(d, dict):
            continue
        for a, s in STATS.items():
            if finite(d.get(a)):
                stats[(ours, s)] = float(d[a]) * scale
                fs[f"{theirs}.successful.{a}"] = d[a]
        for a, s in PCTS.items():
            v = (d.get("percentiles") or {}).get(a)
            if finite(v):
                stats[(ours, s)] = float(v) * scale
                fs[f"{theirs}.successful.{a}"] = v
    tput = (m.get("output_tokens_per_second") or {}).get("total") if isinstance(m.get("output_tokens_per_second"),
                                                                                  dict) else None
    if isinstance(tput, dict) and finite(tput.get("mean")):
        stats[("output_tok_per_s", "value")] = float(tput["mean"])
        fs["output_tokens_per_second.total.mean"] = tput["mean"]
    totals = m.get("request_totals")
    if isinstance(totals, dict):
        fs.update({f"requests.{k}": v for k, v in totals.items()})
    if finite(b.get("duration")):
        fs["duration"] = b["duration"]
    return stats, fs
