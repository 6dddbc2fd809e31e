"""Serving metrics, each defined once (definitions match vLLM's serving benchmark, so
numbers computed on imported results agree with the file's own summary):

- TTFT  = first token time - arrival
- E2E   = last token time - arrival
- request latency = finish time - arrival, for requests with output: the end of the response,
  which a client may see after its last token (inference-perf's request_latency); equal to
  E2E when the finish is recorded at the last token
- TPOT  = (E2E - TTFT) / (n - 1) for n >= 2 output tokens; missing (None/NaN), never 0,
          for one-token outputs
- ITL   = gaps between successive emission times of a request; tokens released together
          (same timestamp, e.g. accepted speculative tokens) count as one emission
- output throughput = output tokens emitted inside a window / window length; the window is
  always stated: "drain" = [first arrival, last emission], or a fixed [start, end]
  (both ends inclusive)
- cost = USD/hour x window hours; per 1,000 output tokens = cost / tokens x 1000
- percentiles: numpy's 'linear' estimator (Hyndman-Fan type 7)
- SLOs (service-level objectives: bounds on TTFT, TPOT and E2E, each optional) are gates,
  not preferences. A request MEETS them when it completed (finish reason length, stop or
  eos: not failed, aborted, rejected or unfinished) and every given bound holds (value <=
  bound). A one-token request has no TPOT and cannot violate a TPOT bound; a completed
  request with no token has no TTFT/E2E and violates those bounds.
  attainment = requests that met / all requests (failed ones included)
- goodput = the requests that met the SLOs and finished inside the throughput window, per
  second of that window (goodput_req_per_s), and those requests' output tokens emitted
  inside it, per second (goodput_tok_per_s): the same window as output throughput
- Little's law over a window: L = time-average number of requests in the system (arrival to
  last token), lambda = arrivals per second, W = mean E2E of those arrivals; L = lambda W
  over the drain window of a finished workload
- utilisation: running sequences and KV blocks in use, time-averaged over the window (idle
  time counts as 0) and peak, from the step events
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
        step_t = trace.steps.groupby("step")["t_ms"].min()   # a step number twice (a hostile file): its first
        req, step = trace.batch["req"].to_numpy(), trace.batch["step"].to_numpy()
        fb = np.full(len(out), np.iinfo(np.int64).max)
        np.minimum.at(fb, req, step)
        has = fb != np.iinfo(np.int64).max
        out[has] = step_t.reindex(fb[has]).to_numpy()
    return out


def request_metrics(trace, spans=None) -> pd.DataFrame:
    """One row per request (in trace order): id, arrival_ms, first_token_ms, last_token_ms,
    output_tokens (emitted), ttft_ms, tpot_ms (NaN when n < 2), e2e_ms, latency_ms (finish -
    arrival; NaN without output or without a finish event), finish_reason (None: no finish
    event, e.g. an interrupted capture). `spans`: `token_spans(trace)` computed elsewhere (a
    trace whose token rows are not in memory: core/analysis/overview.py)."""
    req = trace.requests
    n = len(req)
    first, last, count = token_spans(trace) if spans is None else spans
    arrival = req["arrival_ms"].to_numpy(dtype=float)
    ttft = first - arrival
    e2e = last - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(count >= 2, (last - first) / np.maximum(count - 1, 1), np.nan)
    reason = np.full(n, None, dtype=object)
    finish = np.full(n, np.nan)
    if len(trace.finishes):
        f = trace.finishes
        reason[f["req"].to_numpy()] = f["reason"].to_numpy()
        finish[f["req"].to_numpy()] = f["t_ms"].to_numpy(dtype=float)
    latency = np.where(count > 0, finish - arrival, np.nan)
    return pd.DataFrame({"id": req["id"].to_numpy(), "arrival_ms": arrival, "first_token_ms": first,
                         "last_token_ms": last, "output_tokens": count, "ttft_ms": ttft,
                         "tpot_ms": tpot, "e2e_ms": e2e, "latency_ms": latency,
                         "finish_reason": pd.Series(reason, dtype=object)})  # object: None stays None


def itl_gaps(trace) -> np.ndarray:
    """All inter-token gaps (ms), pooled over requests; one gap per new emission time."""
    tk = trace.tokens
    if len(tk) < 2:
        return np.empty(0)
    return itl_gaps_of(tk["req"].to_numpy(), tk["t_ms"].to_numpy())


def itl_gaps_of(req: np.ndarray, t: np.ndarray) -> np.ndarray:
    """itl_gaps over token rows given as (request, time) arrays."""
    if len(t) < 2:
        return np.empty(0)
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


def measurement_window(window: tuple[float, float] | None, drain: tuple[float, float]) -> tuple[float, float, str]:
    """(start, end, kind) of a throughput window: the drain window given (kind "drain") when `window` is
    None, else the fixed [start, end] checked (kind "fixed")."""
    if window is None:
        return drain[0], drain[1], "drain"
    start, end = float(window[0]), float(window[1])
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InputError(f"window: expected START_MS < END_MS, got [{start}, {end}]")
    return start, end, "fixed"


def throughput(trace, window: tuple[float, float] | None = None) -> Throughput:
    """Output tokens per second over the drain window (default) or a fixed [start, end]."""
    start, end, kind = measurement_window(window, drain_window(trace))
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
    if len(v) == 0:
        return distribution_of(0, name, percentiles)
    qs = np.percentile(v, list(percentiles), method=ESTIMATOR)
    return distribution_of(len(v), name, percentiles, float(v.mean()), float(np.median(v)), float(v.std()),
                           float(v.min()), float(v.max()), [float(x) for x in qs])


def distribution_of(n: int, name: str, percentiles, mean=None, median=None, std=None, lo=None, hi=None,
                    quantiles=()) -> dict:
    """distribution's fields from statistics computed elsewhere (numpy here, DuckDB out of core):
    `quantiles` in the order of `percentiles`; n = 0: no samples."""
    out = {"n": int(n), "estimator": ESTIMATOR}
    if n == 0:
        out.update({"mean": None, "median": None, "std": None, "min": None, "max": None})
        out.update({f"p{q:g}": None for q in percentiles})
        out["notes"] = [f"{name}: no samples"]
        return out
    out.update({"mean": mean, "median": median, "std": std, "min": lo, "max": hi})
    thin = []
    for q, x in zip(percentiles, quantiles):
        out[f"p{q:g}"] = float(x)
        if q > 50 and n < min_samples_for(q):
            thin.append(q)
    out["notes"] = []
    if thin:
        needs = ", ".join(f"p{q:g} >= {min_samples_for(q)}" for q in thin)
        out["notes"].append(f"{name}: {', '.join(f'p{q:g}' for q in thin)} from only {n} samples "
                            f"(a tail estimate needs {needs}); treat them as a choice among the observations")
    return out


EARLY_REASONS = ("abort", "stop", "error", "eos", "rejected", "deadline")   # finishes that end a request early


def conservation(trace, m: pd.DataFrame | None = None) -> list[str]:
    """Token conservation: each request emits exactly max_output_tokens tokens unless it
    finished early for a stated reason (EARLY_REASONS: abort, stop, error, eos, rejected,
    deadline). Returns problems found (`m`: request_metrics(trace), when the caller has it)."""
    m = request_metrics(trace) if m is None else m
    maxo = trace.requests["max_output_tokens"].to_numpy()
    n = m["output_tokens"].to_numpy()
    early_ok = m["finish_reason"].isin(EARLY_REASONS).to_numpy()
    problems = []
    for i in np.flatnonzero((n > maxo) | ((n < maxo) & ~early_ok)):   # only the requests with a problem
        rid, k, mx = m["id"].iat[i], int(n[i]), int(maxo[i])
        problems.append(f"request {rid!r}: {k} tokens emitted, more than max_output_tokens {mx}" if k > mx
                        else f"request {rid!r}: {k} of {mx} tokens emitted and no finish that ends a request early "
                             f"({', '.join(EARLY_REASONS)})")
    return problems


def littles_law(trace, window: tuple[float, float] | None = None, m: pd.DataFrame | None = None) -> dict:
    """L = lambda * W over a window: L = time-average requests in system (arrival to last
    token), lambda = arrivals per ms in the window, W = mean E2E of those arrivals. Over the
    drain window of a finite workload the two sides agree exactly; a gap elsewhere says the
    window is not in steady state."""
    m = request_metrics(trace) if m is None else m
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
    return {"L": _none_if_nan(float(L)), "lambda_per_ms": _none_if_nan(float(lam)),
            "arrival_rate_per_s": _none_if_nan(float(lam) * 1000.0), "W_ms": _none_if_nan(W),
            "lambda_W": _none_if_nan(float(lam * W)), "window_ms": [start, end]}


COMPLETED = ("length", "stop", "eos")   # finish reasons of a request that ran to its end


@dataclass(frozen=True, slots=True)
class SLO:
    """Bounds in ms; None: not part of the contract."""
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self):
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"slo {name}: expected a number > 0 (ms), got {v!r}")

    def given(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


def slo_check(m: pd.DataFrame, slo: SLO) -> tuple[np.ndarray, dict]:
    """Per request of request_metrics `m`: (met mask, violation counts). Counts: completed
    requests over each given bound (None for a bound not given), and requests that did not
    complete ("failed": error, abort, rejection, or no finish event)."""
    done = m["finish_reason"].isin(COMPLETED).to_numpy()
    met = done.copy()
    counts = {}
    for key, name in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("e2e", "e2e_ms")):
        bound = getattr(slo, name)
        if bound is None:
            counts[key] = None
            continue
        v = m[name].to_numpy(dtype=float)
        ok = np.isnan(v) if key == "tpot" else np.zeros(len(v), dtype=bool)   # no TPOT: nothing to violate
        with np.errstate(invalid="ignore"):
            ok |= v <= bound
        counts[key] = int(np.count_nonzero(done & ~ok))
        met &= ok
    counts["failed"] = int(np.count_nonzero(~done))
    return met, counts


def slo_summary(trace, slo: SLO, m: pd.DataFrame | None = None,
                tp: Throughput | None = None) -> tuple[dict, np.ndarray]:
    """summary.slo (bounds, requests, met, attainment, goodput, violations) and the met mask."""
    m = request_metrics(trace) if m is None else m
    tp = throughput(trace) if tp is None else tp
    met, violations = slo_check(m, slo)
    n = len(m)
    last = m["last_token_ms"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        good = met & (last >= tp.start_ms) & (last <= tp.end_ms)
    tk = trace.tokens
    t = tk["t_ms"].to_numpy()
    good_tokens = int(np.count_nonzero(met[tk["req"].to_numpy()] & (t >= tp.start_ms) & (t <= tp.end_ms))) if n else 0
    secs = tp.window_ms / 1000.0
    per_s = (lambda x: x / secs) if secs > 0 else (lambda x: None)
    return {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms, "requests": n,
            "met": int(met.sum()), "attainment": float(met.sum() / n) if n else None,
            "goodput_req_per_s": per_s(int(good.sum())), "goodput_tok_per_s": per_s(good_tokens),
            "violations": violations}, met


def utilisation(trace, window: tuple[float, float] | None = None) -> dict | None:
    """Running sequences and KV blocks in use: time-average over the window (idle time
    counts as 0) and peak, from step events (None without them)."""
    st = trace.steps
    if not len(st):
        return None
    start, end = drain_window(trace) if window is None else (float(window[0]), float(window[1]))
    t0 = st["t_ms"].to_numpy(dtype=float)
    t1 = t0 + st["dur_ms"].to_numpy(dtype=float)
    overlap = np.clip(np.minimum(t1, end) - np.maximum(t0, start), 0.0, None)
    span = end - start
    out = {"window_ms": [start, end]}
    recorded = False
    for key, col in (("running", "running"), ("kv_used_blocks", "kv_used_blocks")):
        v = st[col].to_numpy(dtype=float)
        if (v < 0).all():          # -1: not recorded (an engine's iteration log)
            out[f"{key}_mean"] = out[f"{key}_peak"] = None
            continue
        recorded = True
        out[f"{key}_mean"] = float((v * overlap).sum() / span) if span > 0 else None
        out[f"{key}_peak"] = int(v.max())
    if not recorded:
        return None
    total = trace.meta.get("stats", {}).get("kv_blocks")
    if total:
        out["kv_blocks"] = int(total)
        mean = out["kv_used_blocks_mean"]
        out["kv_used_fraction_mean"] = None if mean is None else mean / total
        out["kv_used_fraction_peak"] = out["kv_used_blocks_peak"] / total
    return out


def step_summary(trace) -> dict | None:
    """The step events on their own (None without them): how many, their span [first start,
    last end], busy time (the sum of durations) and its share of the span, the duration
    distribution, and, for steps that carry counts (an engine's iteration log), the prefill and
    decode tokens they computed."""
    st = trace.steps
    if not len(st):
        return None
    t0 = st["t_ms"].to_numpy(dtype=float)
    dur = st["dur_ms"].to_numpy(dtype=float)
    lo, hi = float(t0.min()), float((t0 + dur).max())
    d = distribution(dur, "step duration")
    d.pop("notes")
    out = {"steps": int(len(st)), "span_ms": [lo, hi], "busy_ms": float(dur.sum()),
           "busy_fraction": float(dur.sum() / (hi - lo)) if hi > lo else None, "dur_ms": d}
    for col in ("prefill_tokens", "decode_tokens"):
        v = st[col].to_numpy() if col in st else np.empty(0)
        if len(v) and (v >= 0).all():
            out[col] = int(v.sum())
    return out


def _none_if_nan(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def summarize(trace, window=None, usd_per_hour=None, percentiles=DEFAULT_PERCENTILES, slo: SLO | None = None,
              per_request: bool = True) -> dict:
    """The metrics of one trace as plain JSON-ready data (used by the CLI and pages). With
    SLO bounds given: summary.slo and a per-request slo_met. `per_request` False: no
    "requests" rows (callers that read only the summary; 10,000 rows cost ~0.1 s)."""
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
        "latency_ms": distribution(m["latency_ms"], "request latency", percentiles),
    }
    dists["latency_ms"].pop("notes")    # the same samples as E2E's notes (or none: no finish events)
    notes = [n for d in dists.values() for n in d.pop("notes", ())] if len(m) else []   # no requests: no notes
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
        "conservation_problems": conservation(trace, m),
        "notes": notes,
        "littles_law": littles_law(trace, None if window is None else (tp.start_ms, tp.end_ms), m),
        "utilisation": utilisation(trace, None if window is None else (tp.start_ms, tp.end_ms)),
    }
    if len(trace.steps):
        summary["steps"] = step_summary(trace)
    if len(getattr(trace, "kv_events", ())):
        from core.analysis.kv_events import kv_event_summary
        summary["kv_events"] = kv_event_summary(trace.kv_events)
    met = None
    if slo is not None and slo.given():
        summary["slo"], met = slo_summary(trace, slo, m, tp)
    if not per_request:
        return {"source": trace.meta.get("source"), "label": trace.meta.get("label"), "summary": summary}

    def col(name):   # plain Python values, NaN as None
        return [None if x != x else x for x in m[name].to_numpy(dtype=float).tolist()]

    names = ("id", "arrival_ms", "first_token_ms", "last_token_ms", "output_tokens", "ttft_ms", "tpot_ms", "e2e_ms",
             "finish_reason")
    cols = [m["id"].tolist(), m["arrival_ms"].to_numpy(dtype=float).tolist(), col("first_token_ms"),
            col("last_token_ms"), m["output_tokens"].to_numpy(dtype=np.int64).tolist(), col("ttft_ms"),
            col("tpot_ms"), col("e2e_ms"), [x if isinstance(x, str) else None for x in m["finish_reason"].tolist()]]
    if met is not None:
        names += ("slo_met",)
        cols.append(met.tolist())
    rows = [dict(zip(names, r)) for r in zip(*cols)]
    return {"source": trace.meta.get("source"), "label": trace.meta.get("label"),
            "requests": rows, "summary": summary}


def request_spans(trace) -> dict[str, np.ndarray]:
    """Per request: arrival, first scheduled step start (NaN without step events), first and
    last token times, tokens emitted."""
    arrival = trace.requests["arrival_ms"].to_numpy(dtype=float)
    first, last, num_emitted = token_spans(trace)
    return {"arrival": arrival, "scheduled": first_scheduled_ms(trace), "first": first, "last": last,
            "num_emitted": num_emitted}
