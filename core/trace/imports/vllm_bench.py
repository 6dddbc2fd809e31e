"""Import results written by existing engines' serving benchmarks.

vLLM (`vllm bench serve --save-result`, formerly benchmarks/benchmark_serving.py) writes one
JSON object with summary fields (`duration`, `completed`, `mean_ttft_ms`, `p99_tpot_ms`, ...)
and, with details, per-request arrays in seconds: `ttfts`, `itls` (gaps between streamed
chunks), `input_lens`, `output_lens`, `errors` ("" when the request succeeded). SGLang's
bench_serving writes the same arrays and may add `start_times`.

Per request we rebuild a timeline: send time (from `start_times` / `request_submit_times`
when present, else 0 for every request, each aligned at its own send), first token at
send + TTFT, then one emission per ITL gap. The request's output tokens are spread over
those emissions (one each, the remainder released with the last chunk), so core.analysis.metrics
gives vLLM's own TTFT, TPOT = (E2E - TTFT)/(n - 1), ITL and E2E = TTFT + sum(ITL).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from core.errors import TraceError, WorkloadError, short
from core.trace.imports.imported import Imported
from core.trace.imports.rows import MAX_IMPORT_TOKENS, TOKEN_ROW_BYTES, RequestRows, count, finite, import_budget
from core.workload import MAX_TIME_MS

VLLM_ARRAY_KEYS = ("ttfts", "itls", "input_lens", "output_lens")
VLLM_SUMMARY_KEYS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                     "output_throughput", "total_token_throughput")
METRIC_NAMES = ("ttft", "tpot", "itl", "e2el", "e2e_latency")      # e2e_latency: SGLang's name for E2E
_OURS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms", "e2e_latency": "e2e_ms"}
SGLANG_KEYS = ("server_info", "mean_e2e_latency_ms", "total_output_tokens_retokenized", "accept_length")


def is_sglang(doc: dict) -> bool:
    return any(k in doc for k in SGLANG_KEYS)
_STATS = {"mean": "mean", "median": "p50", "std": "std", "p90": "p90", "p95": "p95", "p99": "p99"}


def looks_like_vllm(doc: Any) -> bool:
    if not isinstance(doc, dict) or "schema" in doc:
        return False
    return any(k in doc for k in VLLM_ARRAY_KEYS) or any(f"mean_{m}_ms" in doc for m in METRIC_NAMES)


def _num_list(doc, key, name) -> list:
    v = doc.get(key)
    if not isinstance(v, list):
        raise TraceError(f"{name}: {key}: expected a list")
    return v


def import_vllm(doc: dict, name: str = "vllm result") -> Imported:
    try:
        return _import_vllm(doc, name)
    except WorkloadError as e:  # a request the checks above missed: still name the file
        raise TraceError(f"{name}: {e}") from None


_SUMMARY_EXTRA_KEYS = ("failed", "num_prompts", "request_rate", "max_concurrency", "model_id", "backend", "date",
                       "burstiness")


def _is_summary_key(k: str) -> bool:
    """A key of the file's summary: a summary field, a run setting, or a metric's statistic."""
    return (k in VLLM_SUMMARY_KEYS or k in _SUMMARY_EXTRA_KEYS
            or any(k.startswith(f"{s}_{m}_ms") for s in ("mean", "median", "std") for m in METRIC_NAMES)
            or any(k.startswith("p") and k.endswith(f"_{m}_ms") for m in METRIC_NAMES))


def _vllm_meta(doc: dict, name: str, sglang: bool) -> dict:
    return {"source": "imported", "label": f"{name} ({'SGLang' if sglang else 'vLLM'} benchmark result)",
            "created": str(doc.get("date", "")) or "unknown",
            "engine": {"name": str(doc.get("backend") or "vllm"), "model": doc.get("model_id"),
                       "request_rate": doc.get("request_rate"), "max_concurrency": doc.get("max_concurrency")},
            "device": "not recorded in the result file", "notes": ""}


def _import_vllm(doc: dict, name: str) -> Imported:
    summary = {k: v for k, v in doc.items() if _is_summary_key(k)}
    sglang = is_sglang(doc)
    meta = _vllm_meta(doc, name, sglang)
    if not all(k in doc for k in ("ttfts", "itls", "output_lens")):
        return Imported(None, "vllm", summary, notes=[
            "This file has only summary fields; per-request views need the detailed arrays "
            "(ttfts, itls, input_lens, output_lens, errors: vLLM writes them with --save-detailed)."])
    cols = _vllm_columns(doc, name)
    arrival_ms, aligned, notes = _vllm_arrivals(doc, len(cols["ttfts"]), name)
    if not aligned:
        key = "start_times" if isinstance(doc.get("start_times"), list) else "request_submit_times"
        meta["clock"] = {"kind": "perf_counter", "t0_s": float(min(doc[key])), "resolution_ms": 1e-6,
                         "how": f"the benchmark's {key} (time.perf_counter of the client, seconds)"}
    meta["provenance"] = ORIGIN
    prefix = _sent_id_prefix(doc, name)
    if prefix is not None:
        meta["client_ids"] = {"sent": True, "how": f"vllm bench serve --request-id-prefix {prefix!r} (the file's "
                              f"request_id_prefix, written by --metadata): request i's X-Request-Id is {prefix}i"}
    rows = RequestRows(name)
    for i in range(len(arrival_ms)):
        _add_row(rows, name, arrival_ms, i, *(cols[k][i] for k in ("ttfts", "itls", "output_lens", "input_lens",
                                                                   "errors")), prefix=prefix)
    notes += rows.notes()      # merged chunks, failed requests (excluded from latency statistics, as vLLM does)
    meta["notes"] = " ".join(notes)
    tr = rows.trace(meta)
    window = None     # its duration runs from just before the first send: the window's length is exact
    if not aligned and finite(doc.get("duration")) and doc["duration"] > 0:
        window = (0.0, float(doc["duration"]) * 1000.0)
    stats = _stats(doc)
    if aligned:      # no send times: no shared window to compare throughput over
        stats.pop(("output_tok_per_s", "value"), None)
    return Imported(tr, "sglang" if sglang else "vllm", summary, rows.failed, notes, aligned,
                    tool="SGLang bench_serving" if sglang else "vllm bench serve",
                    what="result (--output-details)" if sglang else "result (--save-detailed)", stats=stats,
                    origin=SGLANG_ORIGIN if sglang else ORIGIN, window_ms=window)


ORIGIN = {"clock": "the client's perf_counter (start_times, seconds); not wall-clock time",
          "ttft_ms": "client: send to the first streamed chunk with text (ttfts)",
          "tpot_ms": "client: (latency - ttft) / (output tokens - 1) per request (tpot)",
          "itl_ms": "client: gaps between streamed chunks (itls), one per chunk, not per token",
          "e2e_ms": "client: send to the last chunk (latencies)",
          "output_tok_per_s": "client: total output tokens / the benchmark's duration (output_throughput; ours over "
                              "[first send, first send + duration])",
          "token_times": "per streamed chunk: ttft then the itls gaps; a chunk's extra tokens with the last one"}


SGLANG_ORIGIN = {**ORIGIN, "clock": "none in the file (SGLang bench_serving writes no send times): each request from "
                                     "its own send",
                 "e2e_ms": "client: send to the end of the stream, [DONE] (e2e_latency; ours: the last chunk)",
                 "tpot_ms": "client: (e2e_latency - ttft) / (output tokens - 1)"}


def _stats(doc: dict) -> dict:
    out = {}
    for m, ours in _OURS.items():
        for stat, our_stat in _STATS.items():
            v = doc.get(f"{stat}_{m}_ms")
            if finite(v):
                out[(ours, our_stat)] = float(v)
    if finite(doc.get("output_throughput")):
        out[("output_tok_per_s", "value")] = float(doc["output_throughput"])
    return out


def _vllm_columns(doc: dict, name: str) -> dict:
    """The per-request arrays, of one length, lengths checked (before anything is allocated)."""
    ttfts = _num_list(doc, "ttfts", name)
    n = len(ttfts)
    cols = {"ttfts": ttfts, "itls": _num_list(doc, "itls", name), "output_lens": _num_list(doc, "output_lens", name),
            "input_lens": doc.get("input_lens") if isinstance(doc.get("input_lens"), list) else [0] * n,
            "errors": doc.get("errors") if isinstance(doc.get("errors"), list) else [""] * n}
    for key in ("itls", "output_lens", "input_lens", "errors"):
        if len(cols[key]) != n:
            raise TraceError(f"{name}: {key} has {len(cols[key])} entries but ttfts has {n}")
    for key in ("output_lens", "input_lens"):
        cols[key] = [count(v, f"{name}: request {i}", key) for i, v in enumerate(cols[key])]
    total = sum(cols["output_lens"])
    if total > MAX_IMPORT_TOKENS:       # counted in bytes of the rows they would take, before allocating them
        raise TraceError(f"{name}: output_lens: {total:,} output tokens in all ({total * TOKEN_ROW_BYTES / 2**30:.1f} "
                         f"GiB of token rows), more than {import_budget()}")
    return cols


def _vllm_arrivals(doc: dict, n: int, name: str) -> tuple[np.ndarray, bool, list[str]]:
    """Arrival times (ms from the first send), whether every request starts at 0 (no send times
    in the file), and notes on how they were read."""
    for key in ("start_times", "request_submit_times"):
        if isinstance(doc.get(key), list) and len(doc[key]) == n and all(finite(x) for x in doc[key]):
            starts = np.asarray(doc[key], dtype=float)
            break
    else:
        return np.zeros(n), True, ["No send times in the file: every request is drawn from its own send time 0 "
                                   "(timelines overlap; throughput over a shared window is not meaningful)."]
    notes = []
    arrival_ms = (starts - starts.min()) * 1000.0
    if not arrival_ms.max() <= MAX_TIME_MS:
        raise TraceError(f"{name}: {key}: send times span more than the latest time {MAX_TIME_MS:g} ms")
    qt = doc.get("queue_times")
    if isinstance(qt, list) and len(qt) == n and all(finite(x) and x >= 0 for x in qt):
        q = np.asarray(qt, dtype=float) * 1000.0
        notes.append(f"Arrival = the benchmark's send time ({key}). Before sending, requests waited in the "
                     f"client for a concurrency slot (queue_times): mean {q.mean():.3f} ms, max "
                     f"{q.max():.3f} ms; as in vLLM's own statistics that wait is not part of TTFT or E2E.")
    return arrival_ms, False, notes


def _sent_id_prefix(doc: dict, name: str) -> str | None:
    """The X-Request-Id prefix the client sent, when the file records it: `vllm bench serve` numbers
    its requests prefix + index in the order of its dataset (its outputs keep that order) but writes
    the prefix only where asked (`--metadata request_id_prefix=P`, beside `--request-id-prefix P`)."""
    p = doc.get("request_id_prefix")
    if p is None:
        return None
    if not isinstance(p, str) or not 0 < len(p) <= 100 or not p.isprintable():
        raise TraceError(f"{name}: request_id_prefix: expected the printable prefix of the request ids sent "
                         f"(vllm bench serve --metadata request_id_prefix=P), got {short(p)}")
    return p


def _add_row(rows: RequestRows, name: str, arrival_ms: np.ndarray, i, ttft, gaps, nout, nin, err,
             prefix: str | None = None):
    rid, where, at = (f"req{i}" if prefix is None else f"{prefix}{i}"), f"{name}: request {i}", float(arrival_ms[i])
    ok = err is None or err == ""    # vLLM writes "" for a request that succeeded
    if not isinstance(gaps, list) or not all(finite(g) and g >= 0 for g in gaps):
        raise TraceError(f"{where}: itls: expected a list of gaps >= 0 (seconds)")
    if not ok:
        rows.fail(rid, at, nin, str(err), index=i)
        return
    if nout == 0:
        rows.empty(rid, at, nin)
        return
    if not (finite(ttft) and ttft >= 0):
        raise TraceError(f"{where}: ttfts: expected a number of seconds >= 0, got {short(ttft)}")
    with np.errstate(over="ignore"):  # an overflow to inf is refused by rows.add
        chunk_t = at + (ttft + np.concatenate([[0.0], np.cumsum(gaps)])) * 1000.0
    if not chunk_t[-1] <= MAX_TIME_MS:  # times grow along the request (gaps >= 0); inf fails too
        raise TraceError(f"{where}: ttfts + itls: the last token at {chunk_t[-1]:g} ms is beyond the "
                         f"latest time {MAX_TIME_MS:g} ms")
    rows.add(rid, at, nin, chunk_t, nout, where)


def file_window_comparison(imp: Imported, ours: dict) -> pd.DataFrame:
    """The file's own throughput and duration beside ours, each with how it is computed. They
    differ by their window, not by their counts: the benchmark divides by its whole duration
    (from before the first send until the last response, client overhead included), we by the
    drain window [first send, last token]. Without send times in the file there is no shared
    window, and ours is left empty."""
    fs, s = imp.file_summary, ours["summary"]
    lo, hi = s["window_ms"]
    win_s = (hi - lo) / 1000 if hi > lo else None
    meaningful = not any("No send times" in n for n in imp.notes)
    rows = []
    for key, label, mine, how in (
            ("duration", "duration (s)", win_s, "file: the benchmark's wall time; ours: drain window length"),
            ("output_throughput", "output throughput (tok/s)", s["output_tok_per_s"],
             "file: total output tokens / duration; ours: emitted tokens / drain window"),
            ("request_throughput", "request throughput (req/s)",
             s["requests"] / win_s if win_s else None, "file: completed requests / duration; "
             "ours: requests / drain window")):
        if key in fs:
            rows.append({"metric": label, "file": fs[key], "ours": mine if meaningful else None, "how": how})
    return pd.DataFrame(rows)


def file_summary_comparison(imp: Imported, ours: dict) -> pd.DataFrame:
    """The file's own mean/median/p99 of TTFT, TPOT, ITL, E2E next to ours (ms)."""
    rows = []
    ours_key = _OURS
    for m in METRIC_NAMES:
        for stat in ("mean", "median", "p50", "p90", "p95", "p99", "std"):
            k = f"{stat}_{m}_ms"
            if k in imp.file_summary:
                ours_stat = ours["summary"][ours_key[m]].get("median" if stat == "p50" else stat)
                rows.append({"metric": k, "file": imp.file_summary[k], "ours": ours_stat})
    return pd.DataFrame(rows)


def sweep_runs(d) -> list:
    """The run files of a `vllm bench sweep serve` output directory (<point>/run=N.json), in
    point and run order; [] when `d` is not one."""
    from pathlib import Path
    d = Path(d)
    files = sorted(d.glob("*/run=*.json"), key=lambda p: (p.parent.name, int(p.stem.split("=")[1])
                                                         if p.stem.split("=")[1].isdigit() else 0))
    return files[:2000]


def _point_label(point: str, doc: dict) -> str:
    """'SERVE--max_seqs=2-BENCH--max_concurrency=1' -> 'max_seqs=2, max_concurrency=1'."""
    parts = [p for p in point.replace("SERVE-", "").replace("BENCH-", "").split("-") if p]
    return ", ".join(parts) or point


def import_sweep(d, files: list, read) -> Imported:
    """A `vllm bench sweep serve` directory: every point's every run (vllm bench results with the
    sweep's parameters added) as one run of the Imported. Each run's load: its request_rate when
    finite (an open loop, max_concurrency a cap), else its max_concurrency (a closed loop)."""
    runs = []
    for f in files:
        doc = read(f)
        if not looks_like_vllm(doc):
            raise TraceError(f"{f}: expected a vllm bench serve result in the sweep directory")
        imp = import_vllm(doc, f"{f.parent.name}/{f.name}")
        imp.run_label = f"{_point_label(f.parent.name, doc)}, run {doc.get('run_number', f.stem.split('=')[1])}"
        rate, conc = doc.get("request_rate"), doc.get("max_concurrency")
        if imp.trace is not None:
            if finite(rate) and rate > 0:
                imp.trace.meta["load"] = {"kind": "open", "rate": float(rate)}
            elif finite(conc) and conc > 0:
                imp.trace.meta["load"] = {"kind": "closed", "concurrency": int(conc)}
            imp.trace.meta["label"] = f"{d.name}: {imp.run_label} (vllm bench sweep)"
        runs.append(imp)
    if not runs:
        raise TraceError(f"{d}: no run=N.json files")
    for r in runs:
        r.runs = runs
        r.tool, r.what = "vllm bench sweep", "sweep directory"
        r.notes.insert(0, f"{d.name} holds {len(runs)} runs of a vllm bench sweep ({len({f.parent for f in files})} "
                          f"points); this is {r.run_label}.")
    return runs[0]
