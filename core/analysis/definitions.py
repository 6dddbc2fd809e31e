"""Every serving metric, defined once (the definitions are in core/analysis/metrics.py's
docstring), written in the expression layer (core.analysis.expr) and evaluated wherever the data
lives: `InMemory` (numpy over a Trace; core.analysis.metrics) or DuckDB over Parquet files larger
than memory (core.analysis.outofcore.DuckDBTrace). `summary(ev, ...)` builds the whole summary
from one evaluator, so the two paths cannot disagree by construction.

An evaluator offers relations by name, each a table with the columns the expressions read:
  request        i, id, arrival_ms, max_output_tokens, then REQUEST's columns
  token          t_ms, req
  token_request  a token with its request's columns (goodput: tokens of requests that met the SLOs)
  step           t_ms, dur_ms, running, kv_used_blocks (and prefill_tokens, decode_tokens when recorded)
  kv_event       op, hash (the engine's KV events)
and `agg(relation, {name: Agg}, params)`, `request_column(expr, params)`, `distribution(what,
name, percentiles, relation="request", where=None)` (what: a column of the relation, over the rows
`where` selects, or "itl"), `rows(relation, columns, where)` (in trace order), `kv_event_peak()`
and `replicas_seen(record types)`. Fleet traces' metrics (per replica, router, KV transfers) are
in core.analysis.fleet, with the relations they read.
"""
from __future__ import annotations

import math

import numpy as np

from core.analysis.expr import Agg, ByRequest, Clip, Col, Greatest, If, In, IsNull, Least, OfRequest, Param, Where
from core.errors import InputError

ESTIMATOR = "linear"
ESTIMATOR_LABEL = "numpy 'linear' (Hyndman-Fan type 7)"
DEFAULT_PERCENTILES = (50, 90, 95, 99)
EARLY_REASONS = ("abort", "stop", "error", "eos", "rejected", "deadline")   # finishes that end a request early
COMPLETED = ("length", "stop", "eos")   # finish reasons of a request that ran to its end

# ---- per request: request_metrics' columns, in order (each may use the ones before it) ----------------
REQUEST = {
    "first_token_ms": ByRequest("min", "token", "t_ms"),
    "last_token_ms": ByRequest("max", "token", "t_ms"),
    "output_tokens": ByRequest("count", "token"),
    "finish_ms": ByRequest("last", "finish", "t_ms"),          # (a request finished twice: its last finish)
    "finish_reason": ByRequest("last", "finish", "reason"),
    "ttft_ms": Col("first_token_ms") - Col("arrival_ms"),
    "tpot_ms": Where(Col("output_tokens") >= 2,
                     (Col("last_token_ms") - Col("first_token_ms")) / (Col("output_tokens") - 1)),
    "e2e_ms": Col("last_token_ms") - Col("arrival_ms"),
    "latency_ms": Where(Col("output_tokens") > 0, Col("finish_ms") - Col("arrival_ms")),
}
# request_metrics' frame: these, in this order
REQUEST_METRICS = ("id", "arrival_ms", "first_token_ms", "last_token_ms", "output_tokens", "ttft_ms", "tpot_ms",
                   "e2e_ms", "latency_ms", "finish_reason")

START, END = Param("start"), Param("end")
_DONE = ~IsNull(Col("last_token_ms"))           # emitted at least one token
_ARRIVED_IN = (Col("arrival_ms") >= START) & (Col("arrival_ms") <= END)

COUNTS = {"requests": Agg("count"), "completed": Agg("count", where=Col("output_tokens") > 0),
          "unfinished": Agg("count", where=IsNull(Col("finish_reason"), text=True)),
          "single_token": Agg("count", where=Col("output_tokens").eq(1))}
DRAIN = {"first_arrival": Agg("min", Col("arrival_ms"))}
LAST_TOKEN = {"last_token": Agg("max", Col("t_ms"))}
EMITTED = {"emitted": Agg("count", where=(Col("t_ms") >= START) & (Col("t_ms") <= END))}
LITTLE = {"inside": Agg("fsum", Clip(Col("last_token_ms"), START, END) - Clip(Col("arrival_ms"), START, END),
                        where=_DONE),
          "arrivals": Agg("count", where=_DONE & _ARRIVED_IN),
          "w_mean": Agg("mean", Col("last_token_ms") - Col("arrival_ms"), where=_DONE & _ARRIVED_IN)}
CONSERVATION = (Col("output_tokens") > Col("max_output_tokens")) | (
    (Col("output_tokens") < Col("max_output_tokens")) & ~In(Col("finish_reason"), EARLY_REASONS))
# distributions: request columns (NaN/NULL left out) and the inter-token gaps
DISTRIBUTIONS = {"ttft_ms": ("ttft_ms", "TTFT"), "tpot_ms": ("tpot_ms", "TPOT"), "itl_ms": ("itl", "ITL"),
                 "e2e_ms": ("e2e_ms", "E2E"), "latency_ms": ("latency_ms", "request latency")}
_OVERLAP = Greatest(Least(Col("t_ms") + Col("dur_ms"), END) - Greatest(Col("t_ms"), START), 0.0)
STEPS = {"steps": Agg("count"), "first_start": Agg("min", Col("t_ms")),
         "last_end": Agg("max", Col("t_ms") + Col("dur_ms")), "busy": Agg("fsum", Col("dur_ms"))}
KV_EVENTS = {"stored_blocks": Agg("count", where=Col("op").eq("stored")),
             "removed_blocks": Agg("count", where=Col("op").eq("removed")),
             "cleared": Agg("count", where=Col("op").eq("cleared"))}


# ---- step-fit features (core.sim.stepmodel.FEATURES after the constant), per step: the sums of these
# over its batch entries. `start` is the tokens already in the entry's request's cache when the step
# began: the tokens its request computed in earlier steps since its last preemption, plus its
# prefix-cache hits of that stay times the block size (each evaluator computes it: a cumulative sum
# in core.fit.stepfit.entry_start_positions, a window sum in core.fit.outofcore).
PREFILL_ENTRY = Col("kind").eq("prefill")
ATTENDED = Col("tokens") * Col("start") + Col("tokens") * (Col("tokens") + 1) / 2    # positions the entry attends
STEP_FEATURES = {"prefill_tokens": If(PREFILL_ENTRY, Col("tokens"), 0.0), "decode_seqs": If(PREFILL_ENTRY, 0.0, 1.0),
                 "prefill_kpos": If(PREFILL_ENTRY, ATTENDED, 0.0) / 1000.0,
                 "decode_kpos": If(PREFILL_ENTRY, 0.0, ATTENDED) / 1000.0,
                 "prefill_chunks": If(PREFILL_ENTRY, 1.0, 0.0)}


FIRST_ROUTE_ROLES = ("both", "prefill")   # the replicas a request's first route goes to


def imbalance(routed) -> float | None:
    """A fleet's routing imbalance: max / mean of the requests routed to each replica of one set
    (1 = even; None when none was routed). The fleet's figure (core.analysis.fleet's
    router.imbalance, the policy comparison, bench/fleet_routing.py) is over the replicas of
    FIRST_ROUTE_ROLES, each counting the requests routed to it as their replica or their decode
    replica; a disaggregated fleet's decode replicas have their own (router.imbalance_decode)."""
    v = [float(x) for x in routed]
    if not v or not sum(v):
        return None
    return max(v) / (sum(v) / len(v))


def _none_if_nan(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def measurement_window(window: tuple[float, float] | None, drain: tuple[float, float]) -> tuple[float, float, str]:
    """(start, end, kind) of a throughput window: the drain window given (kind "drain") when `window` is
    None, else the fixed [start, end] checked (kind "fixed")."""
    if window is None:
        return drain[0], drain[1], "drain"
    start, end = float(window[0]), float(window[1])
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise InputError(f"window: expected START_MS < END_MS, got [{start}, {end}]")
    return start, end, "fixed"


def client_window(meta: dict | None) -> tuple[float, float] | None:
    """The benchmark client's own throughput window a trace records (meta.client_window: a client's
    file joined with a fleet's, e.g. vllm bench serve's duration from its first send), or None."""
    w = (meta or {}).get("client_window")
    if not isinstance(w, dict):
        return None
    a, b = w.get("start_ms"), w.get("end_ms")
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (a, b))
    return (float(a), float(b)) if ok and a < b else None


def drain_window(ev) -> tuple[float, float]:
    """[first arrival, last emission] (no requests: 0; no tokens: the first arrival)."""
    first = ev.agg("request", DRAIN)["first_arrival"]
    start = float(first) if first is not None else 0.0
    last = ev.agg("token", LAST_TOKEN)["last_token"]
    return start, float(last) if last is not None else start


def emitted(ev, start: float, end: float) -> int:
    """Output tokens emitted inside [start, end] (both ends inclusive)."""
    return int(ev.agg("token", EMITTED, {"start": start, "end": end})["emitted"])


def cost_usd(window_ms: float, tokens: int, usd_per_hour: float) -> tuple[float, float]:
    """(cost of the window, cost per 1,000 output tokens in it) under a flat tariff."""
    if not (math.isfinite(usd_per_hour) and usd_per_hour >= 0):
        raise InputError(f"usd_per_hour: expected a number >= 0, got {usd_per_hour}")
    cost = usd_per_hour * window_ms / 3_600_000.0
    return cost, (cost / tokens * 1000.0 if tokens else math.nan)


def conservation(ev) -> list[str]:
    """Token conservation: each request emits exactly max_output_tokens tokens unless it finished
    early for a stated reason (EARLY_REASONS). Returns the problems found."""
    out = []
    for rid, k, mx in ev.rows("request", ("id", "output_tokens", "max_output_tokens"), CONSERVATION):
        k, mx = int(k), int(mx)
        out.append(f"request {rid!r}: {k} tokens emitted, more than max_output_tokens {mx}" if k > mx
                   else f"request {rid!r}: {k} of {mx} tokens emitted and no finish that ends a request early "
                        f"({', '.join(EARLY_REASONS)})")
    return out


def littles_law(ev, start: float, end: float) -> dict:
    """L = lambda * W over a window: L = time-average requests in system (arrival to last token),
    lambda = arrivals per ms in the window, W = mean E2E of those arrivals."""
    r = ev.agg("request", LITTLE, {"start": start, "end": end})
    T = end - start
    L = (r["inside"] or 0.0) / T if T > 0 else math.nan
    lam = r["arrivals"] / T if T > 0 else math.nan
    W = float(r["w_mean"]) if r["w_mean"] is not None else math.nan
    return {"L": _none_if_nan(float(L)), "lambda_per_ms": _none_if_nan(float(lam)),
            "arrival_rate_per_s": _none_if_nan(float(lam) * 1000.0), "W_ms": _none_if_nan(W),
            "lambda_W": _none_if_nan(float(lam * W)), "window_ms": [start, end]}


def slo_conditions(slo) -> tuple[object, dict]:
    """(completed, {bound key: the expression a completed request must satisfy}) for the bounds
    given: a missing TTFT or E2E violates its bound; a missing TPOT (one token) violates nothing."""
    done = In(Col("finish_reason"), COMPLETED)
    conds = {}
    for key, col in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("e2e", "e2e_ms")):
        bound = getattr(slo, col)
        if bound is not None:
            ok = Col(col) <= float(bound)
            conds[key] = (IsNull(Col(col)) | ok) if key == "tpot" else ok
    return done, conds


def slo_met(slo):
    """The expression: a request met the SLOs (completed, every given bound holds)."""
    done, conds = slo_conditions(slo)
    met = done
    for c in conds.values():
        met = met & c
    return met


def slo_summary(ev, slo, start: float, end: float) -> dict:
    """summary.slo: bounds, requests, met, attainment, goodput (requests and tokens of those that
    met, inside the throughput window), violations (per bound among completed requests; failed)."""
    done, conds = slo_conditions(slo)
    met = slo_met(slo)
    aggs = {"n": Agg("count"), "met": Agg("count", where=met), "failed": Agg("count", where=~done),
            "good": Agg("count", where=met & (Col("last_token_ms") >= START) & (Col("last_token_ms") <= END))}
    aggs.update({f"v_{k}": Agg("count", where=done & ~c) for k, c in conds.items()})
    r = ev.agg("request", aggs, {"start": start, "end": end})
    n = r["n"]
    in_window = (Col("t_ms") >= START) & (Col("t_ms") <= END)
    good_tokens = ev.agg("token_request", {"g": Agg("count", where=OfRequest(met) & in_window)},
                         {"start": start, "end": end})["g"] if n else 0
    violations = {k: (int(r[f"v_{k}"]) if k in conds else None) for k in ("ttft", "tpot", "e2e")}
    violations["failed"] = int(r["failed"])
    secs = (end - start) / 1000.0
    return {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms, "requests": int(n),
            "met": int(r["met"]), "attainment": float(r["met"] / n) if n else None,
            "goodput_req_per_s": r["good"] / secs if secs > 0 else None,
            "goodput_tok_per_s": good_tokens / secs if secs > 0 else None, "violations": violations}


def _replicas(ev, meta: dict) -> int:
    """How many replicas the trace's steps ran on (a fleet trace: meta.fleet's, or the step rows'
    distinct replica values); 1 for one engine."""
    fleet = meta.get("fleet") if isinstance(meta, dict) else None
    listed = fleet.get("replicas") if isinstance(fleet, dict) else None
    if isinstance(listed, list) and listed:
        return len(listed)
    return max(1, len(ev.replicas_seen(("step",))))


def utilisation(ev, start: float, end: float, meta: dict) -> dict | None:
    """Running sequences and KV blocks in use: time-average over the window (idle time counts as
    0) and peak, from step events (None without them, or when neither was recorded: -1). A fleet
    (several replicas): the means are the whole fleet's (every replica's steps add up; the KV
    fraction is of every replica's pool together) and `replicas` says how many; a peak is then
    one replica's highest (its own steps' rows), reported as `*_peak_one_replica`, not a fleet
    total, and the KV peak fraction is left out (replicas' pools may differ; the fleet section
    of the summary has each replica's)."""
    cols = ev.columns("step")
    if not {"running", "kv_used_blocks", "dur_ms"} <= cols or not ev.agg("step", {"n": Agg("count")})["n"]:
        return None
    span = end - start
    n = _replicas(ev, meta)
    peak = "_peak" if n == 1 else "_peak_one_replica"
    out = {"window_ms": [start, end]} | ({"replicas": n} if n > 1 else {})
    recorded = False
    for key in ("running", "kv_used_blocks"):
        r = ev.agg("step", {"none": Agg("all", Col(key) < 0), "weighted": Agg("fsum", Col(key) * _OVERLAP),
                            "peak": Agg("max", Col(key))}, {"start": start, "end": end})
        if r["none"]:          # -1: not recorded (an engine's iteration log)
            out[f"{key}_mean"] = out[f"{key}{peak}"] = None
            continue
        recorded = True
        out[f"{key}_mean"] = float(r["weighted"]) / span if span > 0 else None
        out[f"{key}{peak}"] = int(r["peak"])
    if not recorded:
        return None
    total = (meta.get("stats") or {}).get("kv_blocks")
    if total:
        out["kv_blocks"] = int(total)
        mean = out["kv_used_blocks_mean"]
        out["kv_used_fraction_mean"] = None if mean is None else mean / total
        if n == 1 and out["kv_used_blocks_peak"] is not None:    # (None: running recorded, KV blocks not)
            out["kv_used_fraction_peak"] = out["kv_used_blocks_peak"] / total
    return out


def step_summary(ev, meta: dict | None = None) -> dict | None:
    """The step events on their own (None without them): how many, their span [first start, last
    end], busy time (the sum of durations) and its share of the span, the duration distribution,
    and, for steps that carry counts (an engine's iteration log), the prefill and decode tokens.
    A fleet: busy time is every replica's together and its share is of `replicas` x the span (the
    mean replica's busy fraction; each replica's is in the summary's fleet section)."""
    r = ev.agg("step", STEPS)
    if not r["steps"]:
        return None
    lo, hi, busy = float(r["first_start"]), float(r["last_end"]), float(r["busy"])
    d = ev.distribution("step_dur", "step duration", DEFAULT_PERCENTILES)
    d.pop("notes")
    n = _replicas(ev, meta or {})
    out = {"steps": int(r["steps"]), "span_ms": [lo, hi], "busy_ms": busy,
           "busy_fraction": busy / ((hi - lo) * n) if hi > lo else None, "dur_ms": d}
    if n > 1:
        out["replicas"] = n
    cols = ev.columns("step")
    for c in ("prefill_tokens", "decode_tokens"):
        if c in cols:
            s = ev.agg("step", {"neg": Agg("any", (Col(c) < 0) | IsNull(Col(c))), "total": Agg("sum", Col(c))})
            if not s["neg"]:
                out[c] = int(s["total"])
    return out


def kv_event_summary(ev) -> dict:
    """{stored_blocks, removed_blocks, cleared, peak_cached_blocks}: rows by op, and the most
    distinct blocks cached at once (replayed in recorded order)."""
    r = ev.agg("kv_event", KV_EVENTS)
    return {**{k: int(v) for k, v in r.items()}, "peak_cached_blocks": ev.kv_event_peak()}


def min_samples_for(q: float) -> int:
    """Smallest sample size for which the q-th percentile is not simply the max: a tail
    estimate needs at least 1/(1 - q/100) observations (p99 -> 100)."""
    return math.ceil(100.0 / (100.0 - q) - 1e-9) if q < 100 else math.inf


def distribution_of(n: int, name: str, percentiles, mean=None, median=None, std=None, lo=None, hi=None,
                    quantiles=()) -> dict:
    """A distribution's fields from statistics an evaluator computed: `quantiles` in the order of
    `percentiles` (type 7); n = 0: no samples. Notes each percentile with too few samples to be
    a tail estimate."""
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


def numpy_distribution(values, name: str, percentiles=DEFAULT_PERCENTILES) -> dict:
    """distribution_of by numpy (missing values left out)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return distribution_of(0, name, percentiles)
    qs = np.percentile(v, list(percentiles), method=ESTIMATOR)
    return distribution_of(len(v), name, percentiles, float(v.mean()), float(np.median(v)), float(v.std()),
                           float(v.min()), float(v.max()), [float(x) for x in qs])


def summary(ev, window=None, usd_per_hour=None, percentiles=DEFAULT_PERCENTILES, slo=None, meta=None,
            has_kv_events: bool = False, client_window_too: bool = True) -> dict:
    """The summary of one trace (metrics.summarize's "summary"), whichever evaluator holds it."""
    meta = meta or {}
    c = ev.agg("request", COUNTS)
    start, end, kind = measurement_window(window, drain_window(ev))
    if window is None and client_window_too and (cw := client_window(meta)) is not None:   # the client's own
        start, end, kind = cw[0], cw[1], "client"
    n_out = emitted(ev, start, end)
    span_ms = end - start
    tok_s = n_out * 1000.0 / span_ms if span_ms > 0 else math.nan
    cost = per_1k = None
    if usd_per_hour is not None:
        cost, per_1k = cost_usd(span_ms, n_out, usd_per_hour)
    dists = {key: ev.distribution(what, name, percentiles) for key, (what, name) in DISTRIBUTIONS.items()}
    dists["latency_ms"].pop("notes")    # the same samples as E2E's notes (or none: no finish events)
    notes = [n for d in dists.values() for n in d.pop("notes", ())] if c["requests"] else []   # no requests: none
    if c["single_token"]:
        notes.append(f"{c['single_token']} request(s) with one output token have no TPOT (missing, not 0)")
    if c["unfinished"]:
        notes.append(f"{c['unfinished']} request(s) have no finish event (finish_reason null): "
                     "the capture ended before they finished")
    out = {"requests": int(c["requests"]), "completed": int(c["completed"]), "unfinished": int(c["unfinished"]),
           "output_tokens": n_out, "window_ms": [start, end], "window_kind": kind,
           "output_tok_per_s": _none_if_nan(tok_s), "usd_per_hour": usd_per_hour, "cost_usd": _none_if_nan(cost),
           "cost_per_1k_output_usd": _none_if_nan(per_1k), "percentile_estimator": ESTIMATOR_LABEL, **dists,
           "conservation_problems": conservation(ev), "notes": notes, "littles_law": littles_law(ev, start, end),
           "utilisation": utilisation(ev, start, end, meta)}
    steps = step_summary(ev, meta)
    if steps is not None:
        out["steps"] = steps
    if has_kv_events:
        out["kv_events"] = kv_event_summary(ev)
    if slo is not None and slo.given():
        out["slo"] = slo_summary(ev, slo, start, end)
    return out
