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

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from core.errors import TraceError, WorkloadError, short
from core.trace.build import new_trace
from core.trace.model import Trace, frame
from core.trace.schema import FINISH, TOKEN
from core.workload import MAX_TIME_MS, MAX_TOKENS, Request, Workload

VLLM_ARRAY_KEYS = ("ttfts", "itls", "input_lens", "output_lens")
VLLM_SUMMARY_KEYS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                     "output_throughput", "total_token_throughput")
METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
MAX_IMPORT_TOKENS = 100_000_000  # output tokens in one file (~2.5 GB of token rows): checked before allocating


@dataclass
class Imported:
    trace: Trace | None                # None when the file has only summary fields
    engine: str                        # "vllm" (also SGLang's compatible format)
    file_summary: dict                 # the file's own summary numbers, verbatim
    failed: list[dict] = field(default_factory=list)   # [{"index", "error"}]
    notes: list[str] = field(default_factory=list)
    aligned_at_zero: bool = False      # no send times: every request starts at its own t = 0


def looks_like_vllm(doc: Any) -> bool:
    if not isinstance(doc, dict) or "schema" in doc:
        return False
    return any(k in doc for k in VLLM_ARRAY_KEYS) or any(f"mean_{m}_ms" in doc for m in METRIC_NAMES)


def _num_list(doc, key, name) -> list:
    v = doc.get(key)
    if not isinstance(v, list):
        raise TraceError(f"{name}: {key}: expected a list")
    return v


def _finite(x) -> bool:
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:
        return False


def _count(v, where: str, key: str) -> int:
    if not (_finite(v) and float(v).is_integer() and 0 <= v <= MAX_TOKENS):
        raise TraceError(f"{where}: {key}: expected an integer in 0..{MAX_TOKENS}, got {short(v)}")
    return int(v)


def import_vllm(doc: dict, name: str = "vllm result") -> Imported:
    try:
        return _import_vllm(doc, name)
    except WorkloadError as e:  # a request the checks above missed: still name the file
        raise TraceError(f"{name}: {e}") from None


def _import_vllm(doc: dict, name: str) -> Imported:
    summary = {k: v for k, v in doc.items()
               if k in VLLM_SUMMARY_KEYS or k in ("failed", "num_prompts", "request_rate", "max_concurrency",
                                                    "model_id", "backend", "date", "burstiness")
               or any(k.startswith(f"{s}_{m}_ms") for s in ("mean", "median", "std") for m in METRIC_NAMES)
               or any(k.startswith("p") and k.endswith(f"_{m}_ms") for m in METRIC_NAMES)}
    meta = {"source": "imported", "label": f"{name} (vLLM benchmark result)",
            "created": str(doc.get("date", "")) or "unknown",
            "engine": {"name": str(doc.get("backend") or "vllm"), "model": doc.get("model_id"),
                       "request_rate": doc.get("request_rate"), "max_concurrency": doc.get("max_concurrency")},
            "device": "not recorded in the result file", "notes": ""}
    if not all(k in doc for k in ("ttfts", "itls", "output_lens")):
        return Imported(None, "vllm", summary, notes=[
            "This file has only summary fields; per-request views need the detailed arrays "
            "(ttfts, itls, input_lens, output_lens, errors: vLLM writes them with --save-detailed)."])
    cols = _vllm_columns(doc, name)
    arrival_ms, aligned, notes = _vllm_arrivals(doc, len(cols["ttfts"]), name)
    rows = _VllmRows(name, arrival_ms)
    for i in range(len(arrival_ms)):
        rows.add(i, *(cols[k][i] for k in ("ttfts", "itls", "output_lens", "input_lens", "errors")))
    if rows.merged:
        notes.append(f"{rows.merged} request(s) streamed more chunks than output tokens; their extra chunk times "
                     "were merged, so their ITL gaps differ from the file's.")
    if rows.failed:
        notes.append(f"{len(rows.failed)} failed request(s) (non-empty errors) are kept with no tokens and a "
                     "finish reason 'error'; they are excluded from latency statistics, as vLLM does.")
    meta["notes"] = " ".join(notes)
    if not rows.reqs:
        raise TraceError(f"{name}: the file lists no requests")
    return Imported(rows.trace(meta), "vllm", summary, rows.failed, notes, aligned)


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
        cols[key] = [_count(v, f"{name}: request {i}", key) for i, v in enumerate(cols[key])]
    if sum(cols["output_lens"]) > MAX_IMPORT_TOKENS:
        raise TraceError(f"{name}: output_lens: {sum(cols['output_lens'])} output tokens in all, more than the "
                         f"{MAX_IMPORT_TOKENS} an import holds")
    return cols


def _vllm_arrivals(doc: dict, n: int, name: str) -> tuple[np.ndarray, bool, list[str]]:
    """Arrival times (ms from the first send), whether every request starts at 0 (no send times
    in the file), and notes on how they were read."""
    for key in ("start_times", "request_submit_times"):
        if isinstance(doc.get(key), list) and len(doc[key]) == n and all(_finite(x) for x in doc[key]):
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
    if isinstance(qt, list) and len(qt) == n and all(_finite(x) and x >= 0 for x in qt):
        q = np.asarray(qt, dtype=float) * 1000.0
        notes.append(f"Arrival = the benchmark's send time ({key}). Before sending, requests waited in the "
                     f"client for a concurrency slot (queue_times): mean {q.mean():.3f} ms, max "
                     f"{q.max():.3f} ms; as in vLLM's own statistics that wait is not part of TTFT or E2E.")
    return arrival_ms, False, notes


class _VllmRows:
    """Requests, token times and finishes of an imported vLLM result, one request at a time."""

    def __init__(self, name: str, arrival_ms: np.ndarray):
        self.name, self.arrival_ms = name, arrival_ms
        self.reqs, self.tok_req, self.tok_idx, self.tok_t, self.failed, self.finishes = [], [], [], [], [], []
        self.merged = 0

    def add(self, i, ttft, gaps, nout, nin, err):
        rid, where, at = f"req{i}", f"{self.name}: request {i}", float(self.arrival_ms[i])
        ok = err is None or err == ""    # vLLM writes "" for a request that succeeded
        if not ok:
            self.failed.append({"index": i, "id": rid, "error": str(err)})
        if not isinstance(gaps, list) or not all(_finite(g) and g >= 0 for g in gaps):
            raise TraceError(f"{where}: itls: expected a list of gaps >= 0 (seconds)")
        if not ok or nout == 0:
            self.reqs.append(Request(rid, at, max(nin, 1), 1, extra={"error": str(err)} if not ok else {}))
            self.finishes.append((len(self.reqs) - 1, at, "error" if not ok else "stop"))
            return
        if not (_finite(ttft) and ttft >= 0):
            raise TraceError(f"{where}: ttfts: expected a number of seconds >= 0, got {short(ttft)}")
        with np.errstate(over="ignore"):  # an overflow to inf is refused just below
            chunk_t = at + (ttft + np.concatenate([[0.0], np.cumsum(gaps)])) * 1000.0
        if not chunk_t[-1] <= MAX_TIME_MS:  # times grow along the request (gaps >= 0); inf fails too
            raise TraceError(f"{where}: ttfts + itls: the last token at {chunk_t[-1]:g} ms is beyond the "
                             f"latest time {MAX_TIME_MS:g} ms")
        if nout >= len(chunk_t):
            counts = np.ones(len(chunk_t), dtype=np.int64)
            counts[-1] += nout - len(chunk_t)
        else:  # more stream chunks than tokens: keep the first n-1 chunk times and the last
            self.merged += 1
            chunk_t = np.concatenate([chunk_t[: nout - 1], chunk_t[-1:]])
            counts = np.ones(nout, dtype=np.int64)
        times = np.repeat(chunk_t, counts)
        j = len(self.reqs)
        self.reqs.append(Request(rid, at, max(nin, 1), nout))
        self.tok_req.append(np.full(nout, j)); self.tok_idx.append(np.arange(nout)); self.tok_t.append(times)
        self.finishes.append((j, float(times[-1]), "length"))

    def trace(self, meta: dict) -> Trace:
        tr = new_trace(meta, Workload(self.reqs, name=self.name))
        # Workload() sorted by arrival (stable); map our request index -> position in trace.
        pos = {rid: k for k, rid in enumerate(tr.ids)}
        order = np.array([pos[r.id] for r in self.reqs])
        if self.tok_req:
            tr.tokens = frame(TOKEN, {"t_ms": np.concatenate(self.tok_t), "req": order[np.concatenate(self.tok_req)],
                                      "index": np.concatenate(self.tok_idx)})
        fin = self.finishes
        tr.finishes = frame(FINISH, {"t_ms": [f[1] for f in fin], "req": order[[f[0] for f in fin]],
                                     "reason": [f[2] for f in fin]})
        err_of = {f["id"]: f["error"] for f in self.failed}
        for k, rid in enumerate(tr.ids):
            if rid in err_of:
                tr.request_extra[k]["error"] = err_of[rid]
        return tr


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
    ours_key = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
    for m in METRIC_NAMES:
        for stat in ("mean", "median", "p50", "p90", "p95", "p99", "std"):
            k = f"{stat}_{m}_ms"
            if k in imp.file_summary:
                ours_stat = ours["summary"][ours_key[m]].get("median" if stat == "p50" else stat)
                rows.append({"metric": k, "file": imp.file_summary[k], "ours": ours_stat})
    return pd.DataFrame(rows)
