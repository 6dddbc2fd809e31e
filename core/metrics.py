"""Serving metrics, each defined once (definitions match vLLM's serving benchmark, so
numbers computed on imported results agree with the file's own summary):

- TTFT  = first token time - arrival
- E2E   = last token time - arrival
- TPOT  = (E2E - TTFT) / (n - 1) for n >= 2 output tokens; missing (None/NaN), never 0,
          for one-token outputs
- ITL   = gaps between successive emission times of a request; tokens released together
          (same timestamp, e.g. accepted speculative tokens) count as one emission
- output throughput = output tokens emitted inside a window / window length; the window is
  always stated: "drain" = [first arrival, last emission], or a fixed [start, end]
  (both ends inclusive)
- cost = USD/hour x window hours; per 1,000 output tokens = cost / tokens x 1000
- percentiles: numpy's 'linear' estimator (Hyndman-Fan type 7)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.errors import InputError
from core.order import stable_order

ESTIMATOR = "linear"
ESTIMATOR_LABEL = "numpy 'linear' (Hyndman-Fan type 7)"
DEFAULT_PERCENTILES = (50, 90, 95, 99)


def token_spans(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request (trace order): first and last token time (NaN: none) and tokens emitted."""
    n = len(trace.requests)
    tk = trace.tokens
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    count = np.zeros(n, dtype=np.int64)
    if len(tk):
        req, t = tk["req"].to_numpy(), tk["t_ms"].to_numpy(dtype=float)
        count = np.bincount(req, minlength=n).astype(np.int64)
        first = np.full(n, np.inf)
        last = np.full(n, -np.inf)
        np.minimum.at(first, req, t)
        np.maximum.at(last, req, t)
        first[count == 0] = np.nan
        last[count == 0] = np.nan
    return first, last, count


def first_scheduled_ms(trace) -> np.ndarray:
    """Per request: start of the first step that computed any of its tokens (NaN without
    step events). Queue wait = this - arrival."""
    out = np.full(len(trace.requests), np.nan)
    if len(trace.batch):
        step_t = trace.steps.set_index("step")["t_ms"]
        req, step = trace.batch["req"].to_numpy(), trace.batch["step"].to_numpy()
        fb = np.full(len(out), np.iinfo(np.int64).max)
        np.minimum.at(fb, req, step)
        has = fb != np.iinfo(np.int64).max
        out[has] = step_t.reindex(fb[has]).to_numpy()
    return out


def request_metrics(trace) -> pd.DataFrame:
    """One row per request (in trace order): id, arrival_ms, first_token_ms, last_token_ms,
    output_tokens (emitted), ttft_ms, tpot_ms (NaN when n < 2), e2e_ms, finish_reason (None:
    no finish event, e.g. an interrupted capture)."""
    req = trace.requests
    n = len(req)
    first, last, count = token_spans(trace)
    arrival = req["arrival_ms"].to_numpy(dtype=float)
    ttft = first - arrival
    e2e = last - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(count >= 2, (last - first) / np.maximum(count - 1, 1), np.nan)
    reason = np.full(n, None, dtype=object)
    if len(trace.finishes):
        f = trace.finishes
        reason[f["req"].to_numpy()] = f["reason"].to_numpy()
    return pd.DataFrame({"id": req["id"].to_numpy(), "arrival_ms": arrival, "first_token_ms": first,
                         "last_token_ms": last, "output_tokens": count, "ttft_ms": ttft,
                         "tpot_ms": tpot, "e2e_ms": e2e,
                         "finish_reason": pd.Series(reason, dtype=object)})  # object: None stays None


def itl_gaps(trace) -> np.ndarray:
    """All inter-token gaps (ms), pooled over requests; one gap per new emission time."""
    tk = trace.tokens
    if len(tk) < 2:
        return np.empty(0)
    req = tk["req"].to_numpy()
    t = tk["t_ms"].to_numpy()
    # by request, then time: rows already in time order (every recorded trace) need only a
    # stable sort by request
    order = stable_order(req) if bool((t[1:] >= t[:-1]).all()) else np.lexsort((t, req))
    r, t = req[order], t[order]
    same = r[1:] == r[:-1]
    gaps = t[1:] - t[:-1]
    keep = same & (gaps > 0)
    return gaps[keep]


@dataclass(slots=True)
class Throughput:
    emitted_tokens: int      # tokens emitted inside the window
    start_ms: float
    end_ms: float
    kind: str                # "drain" or "fixed"

    @property
    def window_ms(self) -> float:
        return self.end_ms - self.start_ms

    @property
    def tok_per_s(self) -> float:
        return self.emitted_tokens * 1000.0 / self.window_ms if self.window_ms > 0 else math.nan

    def describe(self) -> str:
        what = "drain window [first arrival, last emission]" if self.kind == "drain" else "fixed window"
        return f"{what} {self.start_ms:g}–{self.end_ms:g} ms"


def drain_window(trace) -> tuple[float, float]:
    start = float(trace.requests["arrival_ms"].min()) if len(trace.requests) else 0.0
    end = float(trace.tokens["t_ms"].max()) if len(trace.tokens) else start
    return start, end


def throughput(trace, window: tuple[float, float] | None = None) -> Throughput:
    """Output tokens per second over the drain window (default) or a fixed [start, end]."""
    if window is None:
        start, end = drain_window(trace)
        kind = "drain"
    else:
        start, end = float(window[0]), float(window[1])
        if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
            raise InputError(f"window: expected START_MS < END_MS, got [{start}, {end}]")
        kind = "fixed"
    t = trace.tokens["t_ms"].to_numpy()
    inside = int(np.count_nonzero((t >= start) & (t <= end)))
    return Throughput(inside, start, end, kind)


def cost_usd(tp: Throughput, usd_per_hour: float) -> tuple[float, float]:
    """(cost of the window, cost per 1,000 output tokens in it) under a flat tariff."""
    if not (math.isfinite(usd_per_hour) and usd_per_hour >= 0):
        raise InputError(f"usd_per_hour: expected a number >= 0, got {usd_per_hour}")
    cost = usd_per_hour * tp.window_ms / 3_600_000.0
    per_1k = cost / tp.emitted_tokens * 1000.0 if tp.emitted_tokens else math.nan
    return cost, per_1k


def min_samples_for(q: float) -> int:
    """Smallest sample size for which the q-th percentile is not simply the max: a tail
    estimate needs at least 1/(1 - q/100) observations (p99 -> 100)."""
    return math.ceil(100.0 / (100.0 - q) - 1e-9) if q < 100 else math.inf


def distribution(values, name: str, percentiles=DEFAULT_PERCENTILES) -> dict:
    """mean/median/std/percentiles with the estimator named, ignoring missing values, and a
    note for each percentile that has too few samples to be a tail estimate."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    out = {"n": int(len(v)), "estimator": ESTIMATOR}
    if len(v) == 0:
        out.update({"mean": None, "median": None, "std": None, "min": None, "max": None})
        out.update({f"p{q:g}": None for q in percentiles})
        out["notes"] = [f"{name}: no samples"]
        return out
    out.update({"mean": float(v.mean()), "median": float(np.median(v)), "std": float(v.std()),
                "min": float(v.min()), "max": float(v.max())})
    qs = np.percentile(v, list(percentiles), method=ESTIMATOR)
    thin = []
    for q, x in zip(percentiles, qs):
        out[f"p{q:g}"] = float(x)
        if q > 50 and len(v) < min_samples_for(q):
            thin.append(q)
    out["notes"] = []
    if thin:
        needs = ", ".join(f"p{q:g} >= {min_samples_for(q)}" for q in thin)
        out["notes"].append(f"{name}: {', '.join(f'p{q:g}' for q in thin)} from only {len(v)} samples "
                            f"(a tail estimate needs {needs}); treat them as a choice among the observations")
    return out


def conservation(trace) -> list[str]:
    """Token conservation: each request emits exactly max_output_tokens tokens unless it
    finished early for a stated reason (abort, stop, error). Returns problems found."""
    m = request_metrics(trace)
    maxo = trace.requests["max_output_tokens"].to_numpy()
    problems = []
    for rid, n, mx, reason in zip(m["id"], m["output_tokens"], maxo, m["finish_reason"]):
        early_ok = reason in ("abort", "stop", "error", "eos")
        if n > mx:
            problems.append(f"request {rid!r}: {n} tokens emitted, more than max_output_tokens {mx}")
        elif n < mx and not early_ok:
            problems.append(f"request {rid!r}: {n} of {mx} tokens emitted and no abort/stop finish")
    return problems


def littles_law(trace, window: tuple[float, float] | None = None) -> dict:
    """L = lambda * W over a window: L = time-average requests in system (arrival to last
    token), lambda = arrivals per ms in the window, W = mean E2E of those arrivals. Over the
    drain window of a finite workload the two sides agree exactly; a gap elsewhere says the
    window is not in steady state."""
    m = request_metrics(trace)
    start, end = drain_window(trace) if window is None else window
    T = end - start
    a = m["arrival_ms"].to_numpy()
    e = m["last_token_ms"].to_numpy()
    done = ~np.isnan(e)
    inside = (np.clip(e[done], start, end) - np.clip(a[done], start, end)).sum()
    L = inside / T if T > 0 else math.nan
    arr = done & (a >= start) & (a <= end)
    lam = arr.sum() / T if T > 0 else math.nan
    W = float(np.mean(e[arr] - a[arr])) if arr.any() else math.nan
    return {"L": float(L), "lambda_per_ms": float(lam), "W_ms": W, "lambda_W": float(lam * W),
            "window_ms": [start, end]}


def _none_if_nan(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def summarize(trace, window=None, usd_per_hour=None, percentiles=DEFAULT_PERCENTILES) -> dict:
    """The metrics of one trace as plain JSON-ready data (used by the CLI and pages)."""
    m = request_metrics(trace)
    tp = throughput(trace, window)
    cost = per_1k = None
    if usd_per_hour is not None:
        cost, per_1k = cost_usd(tp, usd_per_hour)
    dists = {
        "ttft_ms": distribution(m["ttft_ms"], "TTFT", percentiles),
        "tpot_ms": distribution(m["tpot_ms"], "TPOT", percentiles),
        "itl_ms": distribution(itl_gaps(trace), "ITL", percentiles),
        "e2e_ms": distribution(m["e2e_ms"], "E2E", percentiles),
    }
    notes = [n for d in dists.values() for n in d.pop("notes")]
    single = int((m["output_tokens"] == 1).sum())
    if single:
        notes.append(f"{single} request(s) with one output token have no TPOT (missing, not 0)")
    unfinished = int(m["finish_reason"].isna().sum())
    if unfinished:
        notes.append(f"{unfinished} request(s) have no finish event (finish_reason null): "
                     "the capture ended before they finished")
    summary = {
        "requests": int(len(m)),
        "completed": int((m["output_tokens"] > 0).sum()),
        "unfinished": unfinished,                     # requests without a finish event
        "output_tokens": tp.emitted_tokens,
        "window_ms": [tp.start_ms, tp.end_ms],
        "window_kind": tp.kind,
        "output_tok_per_s": _none_if_nan(tp.tok_per_s),
        "usd_per_hour": usd_per_hour,
        "cost_usd": _none_if_nan(cost),
        "cost_per_1k_output_usd": _none_if_nan(per_1k),
        "percentile_estimator": ESTIMATOR_LABEL,
        **dists,
        "conservation_problems": conservation(trace),
        "notes": notes,
    }
    def col(name):   # plain Python values, NaN as None
        return [None if x != x else x for x in m[name].to_numpy(dtype=float).tolist()]

    names = ("id", "arrival_ms", "first_token_ms", "last_token_ms", "output_tokens", "ttft_ms", "tpot_ms", "e2e_ms",
             "finish_reason")
    cols = [m["id"].tolist(), m["arrival_ms"].to_numpy(dtype=float).tolist(), col("first_token_ms"),
            col("last_token_ms"), m["output_tokens"].to_numpy(dtype=np.int64).tolist(), col("ttft_ms"),
            col("tpot_ms"), col("e2e_ms"), [x if isinstance(x, str) else None for x in m["finish_reason"].tolist()]]
    rows = [dict(zip(names, r)) for r in zip(*cols)]
    return {"source": trace.meta.get("source"), "label": trace.meta.get("label"),
            "requests": rows, "summary": summary}
