"""NVIDIA AIPerf's artifacts (`aiperf profile --artifact-dir D`):

- `profile_export.jsonl`, one request per line: `metadata` (x_request_id, request_start_ns,
  request_end_ns: epoch nanoseconds; was_cancelled, benchmark_phase) and `metrics`, each a
  `{value, unit}`: time_to_first_token (ms), inter_chunk_latency (a list, ms: the gaps between
  the streamed responses after the first), input/output_sequence_length (tokens),
  request_latency (ms); `error` {code, type, message} for a failed request;
- `profile_export_raw.jsonl` (`--export-level raw`): per request the same `metadata`, start_perf_ns
  and every response verbatim with its perf_ns (the client's perf_counter): token times are
  each content chunk's, the output tokens the last chunk's usage.completion_tokens;
- `server_metrics_export.jsonl`: its /metrics scrapes, one per line {endpoint_url, timestamp_ns,
  metrics {name: [{labels, value}]}} -> `gauge` events (with the records when in one directory);
- `profile_export_aiperf.json`, its summary: per metric {unit, avg, min, max, p1..p99, std,
  count}, plus benchmark_duration, start_time, end_time, aiperf_version, input_config.

A request's responses arrive at start + TTFT and then after each inter-chunk gap, so our TTFT,
E2E (= TTFT + the gaps = AIPerf's request_latency) and TPOT (= (E2E - TTFT) / (n - 1) =
AIPerf's inter_token_latency) are AIPerf's own. Its inter_chunk_latency is our ITL when one
response carries one token (the common case).
"""
from __future__ import annotations

import orjson

from core.errors import TraceError, short
from core.trace.gauges import gauge_event
from core.trace.imports.imported import Imported
from core.trace.imports.rows import RequestRows, count, finite

UNIT_MS = {"ms": 1.0, "milliseconds": 1.0, "ns": 1e-6, "us": 1e-3, "sec": 1000.0, "s": 1000.0, "seconds": 1000.0}
SUMMARY_STATS = {"avg": "mean", "p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "std": "std", "min": "min",
                 "max": "max"}
OURS = {"ttft_ms": "time_to_first_token", "tpot_ms": "inter_token_latency", "e2e_ms": "request_latency",
        "itl_ms": "inter_chunk_latency"}
PROVENANCE = {"clock": "epoch nanoseconds (metadata.request_start_ns), the client's wall clock",
              "arrival_ms": "client: metadata.request_start_ns",
              "ttft_ms": "client: AIPerf time_to_first_token (request start to the first response with content)",
              "tpot_ms": "client: AIPerf inter_token_latency = (request_latency - TTFT) / (output tokens - 1)",
              "itl_ms": "client: AIPerf inter_chunk_latency (gaps between responses; one token each here)",
              "e2e_ms": "client: AIPerf request_latency (request start to the last response)",
              "output_tok_per_s": "client: AIPerf output_token_throughput = output tokens / the profiling phase's "
                                  "time range (its start to its end, a few ms wider than the requests)",
              "token_times": "per streamed response: start + TTFT, then the inter_chunk_latency gaps"}


def looks_like_record(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("metadata"), dict) and isinstance(doc.get("metrics"), dict) \
        and "request_start_ns" in doc["metadata"]


def looks_like_raw(doc) -> bool:
    return looks_like_record_meta(doc) and isinstance(doc.get("responses"), list) and "start_perf_ns" in doc


def looks_like_record_meta(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("metadata"), dict) and "request_start_ns" in doc["metadata"]


def looks_like_scrape(doc) -> bool:
    return isinstance(doc, dict) and "timestamp_ns" in doc and isinstance(doc.get("metrics"), dict) \
        and "endpoint_url" in doc


def _scrape_ns(sc: dict, where: str) -> int:
    ts = sc.get("timestamp_ns")
    if not (isinstance(ts, int) and not isinstance(ts, bool) and 0 < ts < 1 << 63):
        raise TraceError(f"{where}: timestamp_ns: expected epoch nanoseconds (an integer), got {short(ts)}")
    return ts


def gauges(scrapes: list[dict], t0_ns: int, name: str) -> list[dict]:
    """gauge events of AIPerf's recorded /metrics scrapes, times in ms from t0_ns (epoch)."""
    out = []
    for k, sc in enumerate(scrapes):
        ts = _scrape_ns(sc, f"{name}: line {k + 1}")
        if ts < t0_ns:
            continue        # before the first request: outside the trace's clock
        samples = ((m, s.get("value")) for m, series in sc["metrics"].items() if isinstance(series, list)
                   for s in series if isinstance(s, dict) and "value" in s)
        g = gauge_event((ts - t0_ns) / 1e6, samples)
        if g is not None:
            out.append(g)
    return out


def import_scrapes(lines: list[dict], name: str) -> Imported:
    from core.trace.imports.scrapes import gauge_trace
    t0 = min(_scrape_ns(sc, f"{name}: line {k + 1}") for k, sc in enumerate(lines))
    ev = gauges(lines, t0, name)
    notes = [f"{len(lines)} /metrics scrapes recorded by AIPerf -> {len(ev)} gauge events (the server's own "
             "running / waiting / KV usage); no requests: profile_export.jsonl beside it has them."]
    tr = gauge_trace(ev, t0 / 1e9, f"{name} (AIPerf server metrics)", notes, "the first scrape's timestamp_ns")
    return Imported(tr, "aiperf", {"scrapes": len(lines)}, notes=notes, tool="AIPerf",
                    what="server metrics (server_metrics_export.jsonl)", origin=tr.meta["provenance"])


def _content(resp: dict) -> tuple[bool, int | None]:
    """(the response carries output text, usage.completion_tokens if it reports them)."""
    text, usage = False, None
    for pk in resp.get("packets") or ():
        v = pk.get("value") if isinstance(pk, dict) else None
        if not isinstance(v, str) or not v.startswith("{"):
            continue
        try:
            d = orjson.loads(v)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(d, dict):
            continue
        for ch in d.get("choices") or ():
            if isinstance(ch, dict) and (ch.get("text") or (ch.get("delta") or {}).get("content")):
                text = True
        u = d.get("usage")
        if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
            usage = u["completion_tokens"]
    return text, usage


def raw_to_records(raw: list[dict], name: str) -> list[dict]:
    """Raw records (--export-level raw) as profile-export-like records: TTFT and inter-chunk
    gaps from the content responses' perf_ns, output tokens from the stream's usage (else the
    content responses)."""
    out = []
    for k, r in enumerate(raw):
        where = f"{name}: line {k + 1}"
        start = r.get("start_perf_ns")
        if not isinstance(start, int):
            raise TraceError(f"{where}: start_perf_ns: expected nanoseconds, got {short(start)}")
        times, tokens = [], None
        for resp in r.get("responses") or ():
            if not isinstance(resp, dict) or not isinstance(resp.get("perf_ns"), int):
                raise TraceError(f"{where}: responses: expected {{perf_ns, packets}} entries")
            text, usage = _content(resp)
            if text:
                times.append((resp["perf_ns"] - start) / 1e6)
            if usage is not None:
                tokens = usage
        n = tokens if tokens is not None else len(times)
        m = {"output_sequence_length": {"value": n, "unit": "tokens"}}
        if times:
            m["time_to_first_token"] = {"value": times[0], "unit": "ms"}
            m["inter_chunk_latency"] = {"value": [b - a for a, b in zip(times, times[1:])], "unit": "ms"}
        rec = {"metadata": r["metadata"], "metrics": m}
        if r.get("error"):
            rec["error"] = r["error"]
        out.append(rec)
    return out


def looks_like_summary(doc) -> bool:
    return isinstance(doc, dict) and "aiperf_version" in doc and isinstance(doc.get("time_to_first_token")
                                                                             or doc.get("request_count"), dict)


def _ms(metrics: dict, key: str, where: str):
    """A metric's value in ms (None when absent); lists element-wise."""
    m = metrics.get(key)
    if m is None:
        return None
    if not isinstance(m, dict) or "value" not in m:
        raise TraceError(f"{where}: metrics.{key}: expected {{value, unit}}, got {short(m)}")
    scale = UNIT_MS.get(str(m.get("unit", "ms")))
    if scale is None:
        raise TraceError(f"{where}: metrics.{key}.unit: expected one of {', '.join(UNIT_MS)}, "
                         f"got {short(m.get('unit'))}")
    v = m["value"]
    if isinstance(v, list):
        if not all(finite(x) and x >= 0 for x in v):
            raise TraceError(f"{where}: metrics.{key}.value: expected a list of numbers >= 0")
        return [x * scale for x in v]
    if not (finite(v) and v >= 0):
        raise TraceError(f"{where}: metrics.{key}.value: expected a number >= 0, got {short(v)}")
    return v * scale


def _tokens(metrics: dict, key: str, where: str) -> int | None:
    m = metrics.get(key)
    return None if not isinstance(m, dict) else count(m.get("value"), where, f"metrics.{key}")


def _ns(meta: dict, key: str, where: str) -> int:
    v = meta.get(key)
    if not (isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 63):
        raise TraceError(f"{where}: metadata.{key}: expected epoch nanoseconds, got {short(v)}")
    return v


def phase_window(summary: dict | None, metrics_export: dict | None) -> tuple[int, int, str] | None:
    """(start_ns, end_ns, how) of the profiling phase: from server_metrics_export.json's
    phase_time_ranges (epoch ns), else from the summary's start_time / end_time (ISO, local time
    of the machine that ran AIPerf, microseconds)."""
    rng = (((metrics_export or {}).get("summary") or {}).get("phase_time_ranges") or {}).get("profiling")
    if isinstance(rng, dict) and isinstance(rng.get("start_ns"), int) and isinstance(rng.get("end_ns"), int):
        return rng["start_ns"], rng["end_ns"], "server_metrics_export.json's phase_time_ranges (epoch ns)"
    if summary and isinstance(summary.get("start_time"), str) and isinstance(summary.get("end_time"), str):
        from datetime import datetime
        try:
            a, b = (datetime.fromisoformat(summary[k]).timestamp() for k in ("start_time", "end_time"))
        except ValueError:
            return None
        return int(a * 1e9), int(b * 1e9), "the summary's start_time / end_time (read in this machine's time zone)"
    return None


def profiling_load(summary: dict | None) -> dict | None:
    """How the profiling phase sent (the summary's input_config.phases): {"kind": "closed",
    "concurrency": C} for a concurrency phase without a request rate (a closed loop: a request sent
    whenever one finishes), {"kind": "open", "rate": R} for one with a rate; None when not stated."""
    phases = ((summary or {}).get("input_config") or {}).get("phases")
    for ph in phases if isinstance(phases, list) else []:
        if not isinstance(ph, dict) or ph.get("kind") != "profiling":
            continue
        rate, conc = ph.get("request_rate"), ph.get("concurrency")
        if finite(rate) and rate > 0:
            return {"kind": "open", "rate": float(rate)}
        if ph.get("type") == "concurrency" and isinstance(conc, int) and not isinstance(conc, bool) and conc > 0:
            return {"kind": "closed", "concurrency": conc}
    return None


def _failure(err, md: dict) -> str:
    """What went wrong with a failed or cancelled request, in a few words."""
    if isinstance(err, dict):
        return f"{err.get('type') or 'error'} {err.get('code') or ''}: {err.get('message') or ''}".strip()
    return "cancelled" if md.get("was_cancelled") else str(err)


def _add_record(rows: RequestRows, k: int, r: dict, at: float, t0: int, name: str):
    """One profiling record's row, `at` ms after t0 (epoch ns)."""
    md, m, where = r["metadata"], r["metrics"], f"{name}: record {k + 1}"
    rid = str(md.get("x_request_id") or f"req{k}")
    end_ms = (_ns(md, "request_end_ns", where) - t0) / 1e6 if md.get("request_end_ns") else None
    n_in = _tokens(m, "input_sequence_length", where) or 0
    err = r.get("error")
    if err or md.get("was_cancelled"):
        rows.fail(rid, at, n_in, _failure(err, md), t_ms=end_ms, reason="abort" if md.get("was_cancelled") else "error")
        return
    ttft = _ms(m, "time_to_first_token", where)
    n_out = _tokens(m, "output_sequence_length", where)
    if ttft is None or not n_out:
        rows.empty(rid, at, n_in, t_ms=end_ms)
        return
    gaps = _ms(m, "inter_chunk_latency", where) or []
    chunk = [at + ttft]
    for g in gaps:
        chunk.append(chunk[-1] + g)
    rows.add(rid, at, n_in, chunk, n_out, where, end_ms=end_ms)


def _records_meta(name: str, version: str, t0: int, notes: list[str], summary: dict | None) -> dict:
    meta = {"source": "imported", "label": f"{name} (AIPerf{' ' + version if version else ''})", "created": "unknown",
            "engine": {"name": "unknown (an OpenAI-compatible server driven by AIPerf)"},
            "device": "not recorded by the client", "notes": " ".join(notes),
            "clock": {"kind": "epoch", "t0_s": t0 / 1e9, "resolution_ms": 1e-6,
                      "how": "AIPerf's metadata.request_start_ns of the first request"},
            "provenance": PROVENANCE}
    if summary and isinstance(summary.get("start_time"), str):
        meta["created"] = summary["start_time"]
    load = profiling_load(summary)
    if load:
        meta["load"] = load
    return meta


def import_records(records: list[dict], name: str, summary: dict | None = None,
                   scrapes: list[dict] | None = None, metrics_export: dict | None = None) -> Imported:
    profiling = [r for r in records if r.get("metadata", {}).get("benchmark_phase", "profiling") == "profiling"]
    warmup = len(records) - len(profiling)
    if not profiling:
        raise TraceError(f"{name}: no profiling-phase records (only {warmup} warm-up record(s))")
    starts = [_ns(r["metadata"], "request_start_ns", f"{name}: line {k + 1}") for k, r in enumerate(profiling)]
    t0 = min(starts)
    rows = RequestRows(name, id_field="metadata.x_request_id")
    for k, (r, s_ns) in enumerate(zip(profiling, starts)):
        _add_record(rows, k, r, (s_ns - t0) / 1e6, t0, name)
    stats, file_summary, version = {}, {}, ""
    if summary:
        stats, file_summary = summary_stats(summary)
        version = str(summary.get("aiperf_version", ""))
    notes = [f"{len(profiling):,} requests from AIPerf's profile export (client-side times, epoch ns); token "
             "times per streamed response (TTFT, then inter_chunk_latency)."]
    if warmup:
        notes.append(f"{warmup} warm-up record(s) left out (benchmark_phase not 'profiling').")
    if not summary:
        notes.append("No profile_export_aiperf.json beside it: AIPerf's own statistics are not shown.")
    notes += rows.notes()
    meta = _records_meta(name, version, t0, notes, summary)
    tr = rows.trace(meta)
    if scrapes:
        tr.other = gauges(scrapes, t0, name)
        notes.append(f"{len(tr.other)} gauge events from AIPerf's /metrics scrapes (server_metrics_export.jsonl).")
        meta["provenance"] = {**PROVENANCE, "gauges": "server: its /metrics, scraped by AIPerf"}
        tr.meta.update(notes=" ".join(notes), provenance=meta["provenance"])
    win = phase_window(summary, metrics_export)
    window = None
    if win is not None and win[1] > win[0]:
        window = ((win[0] - t0) / 1e6, (win[1] - t0) / 1e6)
        notes.append(f"AIPerf's throughput window: its profiling phase, from {win[2]}.")
    return Imported(tr, "aiperf", file_summary, rows.failed, notes, tool=f"AIPerf {version}".strip(),
                    what="per-request records (profile_export.jsonl)", stats=stats, origin=PROVENANCE,
                    window_ms=window)


def summary_stats(doc: dict) -> tuple[dict, dict]:
    """(stats in our units, the file's summary numbers) of profile_export_aiperf.json."""
    stats, fs = {}, {}
    for ours, theirs in OURS.items():
        m = doc.get(theirs)
        if not isinstance(m, dict):
            continue
        scale = UNIT_MS.get(str(m.get("unit", "ms")), 1.0)
        for a, b in SUMMARY_STATS.items():
            if finite(m.get(a)):
                stats[(ours, b)] = float(m[a]) * scale
                fs[f"{theirs}.{a}"] = m[a]
    tput = doc.get("output_token_throughput")
    if isinstance(tput, dict) and finite(tput.get("avg")):
        stats[("output_tok_per_s", "value")] = float(tput["avg"])
        fs["output_token_throughput"] = tput["avg"]
    for key in ("request_count", "benchmark_duration", "request_throughput", "total_osl", "total_isl"):
        m = doc.get(key)
        if isinstance(m, dict) and finite(m.get("avg")):
            fs[key] = m["avg"]
    for key in ("aiperf_version", "start_time", "end_time", "was_cancelled", "is_complete"):
        if key in doc:
            fs[key] = doc[key]
    return stats, fs


def import_summary(doc: dict, name: str) -> Imported:
    stats, fs = summary_stats(doc)
    return Imported(None, "aiperf", fs, notes=[
        f"{name} is AIPerf's summary: its own statistics only, no per-request rows. Per-request data is in "
        "profile_export.jsonl beside it (open the file, or the whole artifact directory)."],
        tool=f"AIPerf {doc.get('aiperf_version', '')}".strip(), what="summary (profile_export_aiperf.json)",
        stats=stats, origin=PROVENANCE)


# ---- time slices (`--slice-duration S`): each window's own statistics --------------------------------
#
# profile_export_aiperf_timeslices.json: {"timeslices": [{start_ns, end_ns, is_complete, <metric tag>:
# {unit, avg, min, max, p1..p99, std, ...}, ...}], "input_config": {...}}, one object per window in
# time order (AIPerf 0.13; older releases numbered them with timeslice_index instead of start_ns /
# end_ns). The CSV beside it holds the same, one row per statistic: Timeslice, Start_NS, End_NS,
# Metric (the metric's display header), Unit, Stat, Value (older: without Start_NS, End_NS).
# Learned from AIPerf 0.13.0's exporters/timeslice_metrics_{json,csv}_exporter.py; no file AIPerf
# wrote with --slice-duration is bundled here (tests build them in that documented shape).

HEADERS = {"Time to First Token": "time_to_first_token", "Inter Token Latency": "inter_token_latency",
           "Request Latency": "request_latency", "Inter Chunk Latency": "inter_chunk_latency",
           "Output Token Throughput": "output_token_throughput", "Request Throughput": "request_throughput",
           "Request Count": "request_count", "Output Sequence Length": "output_sequence_length",
           "Input Sequence Length": "input_sequence_length"}     # the CSV's metric names -> their JSON tags
_SLICE_KEYS = ("start_ns", "end_ns", "is_complete", "timeslice_index")
TIMESLICES_CSV = "Timeslice,"


def looks_like_timeslices(doc) -> bool:
    sl = doc.get("timeslices") if isinstance(doc, dict) else None
    if not (isinstance(sl, list) and sl and isinstance(sl[0], dict)):
        return False
    return any(k in sl[0] for k in _SLICE_KEYS) or any(isinstance(v, dict) and "unit" in v for v in sl[0].values())


def _slice_duration_s(cfg) -> float | None:
    """--slice-duration (seconds) wherever the dumped input_config keeps it."""
    if isinstance(cfg, dict):
        v = cfg.get("slice_duration")
        if finite(v) and v > 0:
            return float(v)
        for x in cfg.values():
            found = _slice_duration_s(x)
            if found:
                return found
    return None


def import_timeslices(doc: dict, name: str) -> Imported:
    """One window per time slice, each with AIPerf's own statistics in our units (`Imported.windows`,
    and one run per window: `metrics --run K` shows window K's numbers)."""
    slices = doc["timeslices"]
    if len(slices) > 100_000:
        raise TraceError(f"{name}: timeslices: {len(slices):,} windows; at most 100,000 are read")
    for k, s in enumerate(slices):
        if not isinstance(s, dict):
            raise TraceError(f"{name}: timeslices[{k}]: expected an object, got {short(s)}")
    starts = [s.get("start_ns") for s in slices]
    exact = all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 63 for v in starts + [
        s.get("end_ns") for s in slices])
    dur_s = None if exact else _slice_duration_s(doc.get("input_config"))
    t0 = min(starts) if exact else 0
    windows, runs, summary = [], [], {}
    for k, s in enumerate(slices):
        stats, fs = summary_stats(s)
        if exact:
            span = ((s["start_ns"] - t0) / 1e6, (s["end_ns"] - t0) / 1e6)
            if span[1] < span[0]:
                raise TraceError(f"{name}: timeslices[{k}]: end_ns {s['end_ns']} is before start_ns {s['start_ns']}")
        else:
            span = (k * dur_s * 1000.0, (k + 1) * dur_s * 1000.0) if dur_s else None
        label = f"slice {k}" + (f" [{span[0] / 1000:g}, {span[1] / 1000:g}] s" if span else "")
        complete = s.get("is_complete") is not False
        windows.append({"index": k, "window_ms": span, "complete": complete, "stats": stats})
        summary[label] = _slice_line(stats) + ("" if complete else " (a partial window)")
        runs.append(Imported(None, "aiperf", fs, notes=[f"{name}: {label} of {len(slices)} (AIPerf's own statistics "
                                                          "over that window)."], tool="AIPerf",
                             what="time slice (profile_export_aiperf_timeslices)", stats=stats, origin=PROVENANCE,
                             window_ms=span, run_label=label))
    how = ("each window's start_ns / end_ns (epoch ns), from the first window's start" if exact else
           f"window k spans k x the slice duration ({dur_s:g} s) as AIPerf numbers them (it aligns windows to "
           "wall-clock divisions, so the first may be shorter)" if dur_s else "no times in the file: windows by number")
    notes = [f"{name} is AIPerf's time-sliced statistics: {len(slices)} windows, each with AIPerf's own TTFT, ITL, "
             "latency and throughput over that window (no per-request rows: profile_export.jsonl beside it has "
             f"them). Window times: {how}."]
    out = Imported(None, "aiperf", summary, notes=notes, tool="AIPerf", what="time slices "
                   "(profile_export_aiperf_timeslices)", origin=PROVENANCE, runs=runs, windows=windows)
    for r in runs:
        r.runs, r.windows = runs, windows
    return out


def _slice_line(stats: dict) -> str:
    parts = []
    for metric, label, unit in (("ttft_ms", "TTFT", "ms"), ("tpot_ms", "TPOT", "ms"), ("itl_ms", "ITL", "ms"),
                                ("e2e_ms", "E2E", "ms")):
        mean, p99 = stats.get((metric, "mean")), stats.get((metric, "p99"))
        if mean is not None:
            parts.append(f"{label} mean {mean:,.3f} {unit}" + (f", p99 {p99:,.3f} {unit}" if p99 is not None else ""))
    tput = stats.get(("output_tok_per_s", "value"))
    if tput is not None:
        parts.append(f"{tput:,.3f} output tok/s")
    return "; ".join(parts) or "no latency statistics"


def timeslices_from_csv(text: str, name: str) -> dict:
    """The CSV form as the JSON form's document (metric names mapped back to their tags)."""
    import csv
    import io
    rows = csv.reader(io.StringIO(text))
    head = next(rows, [])
    cols = {c: k for k, c in enumerate(head)}
    if not {"Timeslice", "Metric", "Unit", "Stat", "Value"} <= cols.keys():
        raise TraceError(f"{name}: expected AIPerf's timeslices CSV header Timeslice,[Start_NS,End_NS,]Metric,Unit,"
                         f"Stat,Value, got {short(','.join(head), 80)}")
    slices: dict[int, dict] = {}
    for line, r in enumerate(rows, 2):
        if not r:
            continue
        if len(r) != len(head):
            raise TraceError(f"{name}: line {line}: {len(r)} fields, the header has {len(head)}")
        try:
            k = int(r[cols["Timeslice"]])
            s = slices.setdefault(k, {})
            for key in ("Start_NS", "End_NS"):
                if key in cols and r[cols[key]]:
                    s[key.lower()] = int(r[cols[key]])
            value = float(r[cols["Value"]])
        except ValueError:
            raise TraceError(f"{name}: line {line}: expected numbers in Timeslice, Start_NS, End_NS and Value, "
                             f"got {short(r, 80)}") from None
        if k < 0 or len(slices) > 100_000:
            raise TraceError(f"{name}: line {line}: Timeslice: expected a window number 0..99,999, got {k}")
        metric = r[cols["Metric"]]
        tag = HEADERS.get(metric, metric.lower().replace(" ", "_"))
        s.setdefault(tag, {"unit": r[cols["Unit"]]})[r[cols["Stat"]]] = value
    return {"timeslices": [slices[k] for k in sorted(slices)]}


def looks_like_phase_manifest(doc) -> bool:
    ph = doc.get("phases") if isinstance(doc, dict) else None
    return isinstance(ph, list) and "schema_version" in doc and bool(ph) and isinstance(ph[0], dict) and \
        "phase_kind" in ph[0]


def phase_manifest(doc: dict, name: str, path=None):
    """AIPerf's phase_manifest.json indexes a run's phases (counts, time range, the files each phase's
    statistics went to); the statistics and the requests are in other files: say which."""
    listed = [p.get("metrics_json") for p in doc["phases"] if isinstance(p, dict) and p.get("phase_kind") == "profiling"
              and isinstance(p.get("metrics_json"), str)]
    each = f" (e.g. {listed[0]})" if listed else ""
    raise TraceError(f"{name}: looks like AIPerf's phase_manifest.json (each phase's request counts, time range "
                     f"and artifact paths, no statistics); open profile_export.jsonl beside it (per-request records) "
                     f"or a phase's profile_export_aiperf.json{each}")
