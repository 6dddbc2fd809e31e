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

Each of these is written once, in the expression layer (core/analysis/definitions.py), and
evaluated here with numpy over a trace in memory (`InMemory`) and in core/analysis/outofcore.py
with DuckDB over Parquet files larger than memory; `summarize` builds its summary with
definitions.summary, as the out-of-core summary does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.analysis import definitions as d
from core.analysis import fleet as fl
from core.analysis.definitions import (  # noqa: F401  (the metrics' names, defined once there)
    COMPLETED,
    DEFAULT_PERCENTILES,
    EARLY_REASONS,
    ESTIMATOR,
    ESTIMATOR_LABEL,
    distribution_of,
    measurement_window,
    min_samples_for,
)
from core.analysis.expr import request_columns_np
from core.errors import InputError
from core.order import stable_order

distribution = d.numpy_distribution


class InMemory:
    """A trace in memory as a definitions evaluator (numpy). `m`: its request_metrics, when the
    caller has them; `spans`: (first, last, count) per request computed elsewhere (an overview)."""

    def __init__(self, trace, m: pd.DataFrame | None = None, spans=None):
        self.trace, self._m, self._spans = trace, m, spans
        self._req: dict | None = None
        self._rels: dict[str, tuple[dict, int]] = {}

    def _request_env(self) -> dict:
        if self._req is None:
            tr = self.trace
            req = tr.requests
            n = len(req)
            base = {"i": np.arange(n), "id": req["id"].to_numpy(),
                    "arrival_ms": req["arrival_ms"].to_numpy(dtype=float),
                    "max_output_tokens": req["max_output_tokens"].to_numpy()}
            given = {}
            if self._m is not None:
                given = {c: self._m[c].to_numpy() for c in d.REQUEST if c in self._m}
            elif self._spans is not None:
                given = dict(zip(("first_token_ms", "last_token_ms", "output_tokens"), self._spans))
            f = tr.finishes
            rows = {"token": {"req": tr.tokens["req"].to_numpy(), "t_ms": tr.tokens["t_ms"].to_numpy(dtype=float)},
                    "finish": {"req": f["req"].to_numpy(), "t_ms": f["t_ms"].to_numpy(dtype=float),
                               "reason": f["reason"].to_numpy(dtype=object)}}
            self._req = request_columns_np(d.REQUEST, base, rows, n, given)
        return self._req

    def relation(self, name: str) -> tuple[dict, int]:
        """A relation's columns (numpy, read from the trace's tables once) and its row count."""
        got = self._rels.get(name)
        if got is None:
            got = self._rels[name] = self._relation(name)
        return got

    def _relation(self, name: str) -> tuple[dict, int]:
        tr = self.trace
        if name == "request":
            return self._request_env(), len(tr.requests)
        if name == "token":
            tk = tr.tokens
            return {"t_ms": tk["t_ms"].to_numpy(dtype=float), "req": tk["req"].to_numpy()}, len(tk)
        if name == "token_request":
            env, _ = self.relation("token")
            return {**env, "__request__": self._request_env()}, len(tr.tokens)
        if name == "step":
            return _Columns(tr.steps), len(tr.steps)
        if name == "kv_event":
            kv = tr.kv_events
            return {"op": _str_objects(kv["op"]), "hash": kv["hash"].to_numpy()}, len(kv)
        return self._fleet_relation(name)

    def _fleet_relation(self, name: str) -> tuple[dict, int]:
        """core.analysis.fleet's relations (its docstring); replicas as floats (missing: NaN)."""
        tr = self.trace
        if name in ("replica_finish", "replica_step", "replica_kv"):
            df = {"replica_finish": tr.finishes, "replica_step": tr.steps, "replica_kv": tr.kv}[name]
            env = {"replica": df["replica"].to_numpy(dtype=float)}
            for c in {"replica_finish": ("t_ms", "req"), "replica_step": ("t_ms", "dur_ms"), "replica_kv": ()}[name]:
                env[c] = df[c].to_numpy(dtype=float) if c != "req" else df[c].to_numpy()
            if name == "replica_kv":
                env["op"] = _str_objects(df["op"])
            return env, len(df)
        if name == "replica_preempt":
            p = tr.preempts
            return {"t_ms": p["t_ms"].to_numpy(dtype=float), "req": p["req"].to_numpy(),
                    "replica": p["replica"].to_numpy(dtype=float)}, len(p)
        if name == "replica_hit":
            kv = tr.kv
            hit = (kv["op"] == "hit").to_numpy() & kv["req"].notna().to_numpy()
            env = {"t_ms": kv["t_ms"].to_numpy(dtype=float)[hit], "req": kv["req"].to_numpy()[hit].astype(np.int64),
                   "replica": kv["replica"].to_numpy(dtype=float)[hit],
                   "__request__": self.relation("fleet_request")[0]}
            return env, int(hit.sum())
        if name in fl.EVENT_FIELDS:
            return _event_relation(tr, name)
        if name == "fleet_request":
            rows = {rel: self.relation(rel)[0] for rel in ("replica_finish", "transfer", "replica_preempt")}
            return request_columns_np(fl.FLEET_REQUEST, self._request_env(), rows, len(tr.requests)), len(tr.requests)
        if name == "visit":
            env = _visits(tr)
            env["__request__"] = self.relation("fleet_request")[0]
            return env, len(env["req"])
        raise KeyError(name)

    def replicas_seen(self, records) -> set:
        """The distinct replica values of these record types' rows."""
        tables = {"token": "tokens", "finish": "finishes", "step": "steps", "kv": "kv", "preempt": "preempts"}
        out = set()
        for rec in records:
            v = getattr(self.trace, tables[rec])["replica"].to_numpy()
            if len(v):   # (all 0, a single engine's: without hashing the column)
                out |= {0} if v.min() == v.max() == 0 else {int(x) for x in pd.unique(v)}
        return out

    def columns(self, name: str) -> set:
        return set(self.trace.steps.columns) if name == "step" else set(self.relation(name)[0])

    def agg(self, name: str, aggs: dict, params: dict | None = None) -> dict:
        env, n = self.relation(name)
        if params:
            env = _Params(env, params)
        return {k: a.np(env, n) for k, a in aggs.items()}

    def request_column(self, expr, params: dict | None = None) -> np.ndarray:
        env = self._request_env()
        return np.asarray(expr.np({**env, **(params or {})}))

    def rows(self, name: str, cols: tuple, where) -> list[tuple]:
        env, _ = self.relation(name)
        idx = np.flatnonzero(np.asarray(where.np(env), dtype=bool))
        return list(zip(*(env[c][idx].tolist() for c in cols))) if len(idx) else []

    def distribution(self, what: str, name: str, percentiles, relation: str = "request", where=None) -> dict:
        if what == "itl":
            return distribution(itl_gaps(self.trace), name, percentiles)
        if what == "step_dur":
            return distribution(self.trace.steps["dur_ms"].to_numpy(dtype=float), name, percentiles)
        env, _ = self.relation(relation)
        v = np.asarray(env[what], dtype=float)
        if where is not None:
            v = v[np.asarray(where.np(env), dtype=bool)]
        return distribution(v, name, percentiles)

    def kv_event_peak(self) -> int:
        from core.analysis.kv_events import cached_blocks
        _, n = cached_blocks(self.trace.kv_events)
        return int(n.max()) if len(n) else 0

    def request_frame(self) -> pd.DataFrame:
        env = self._request_env()
        return pd.DataFrame({"id": env["id"], "arrival_ms": env["arrival_ms"],
                             **{c: env[c] for c in d.REQUEST_METRICS[2:-1]},
                             "finish_reason": pd.Series(env["finish_reason"], dtype=object)})  # object: None stays None


def _number(v) -> float:
    """A verbatim event's numeric field: NaN when it is not a number."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _event_relation(trace, kind: str) -> tuple[dict, int]:
    """The `kind` verbatim events as a relation (core.analysis.fleet.EVENT_FIELDS), in trace order;
    with a request column: only those whose req names a request, req its row."""
    events = trace.events_of(kind)
    if fl.EVENT_REQ[kind]:
        row_of = {rid: j for j, rid in enumerate(trace.requests["id"].tolist())}
        events = [e for e in events if isinstance(e.get("req"), str) and e["req"] in row_of]
    env = {c: np.array([_number(e.get(c)) for e in events], dtype=float) for c in fl.EVENT_FIELDS[kind]}
    if fl.EVENT_REQ[kind]:
        env["req"] = np.array([row_of[e["req"]] for e in events], dtype=np.int64)
    return env, len(events)


def _visits(trace) -> dict:
    """core.analysis.fleet's visit relation (without its request columns): per (request, replica)
    with batch entries there, the first entry's step start and the last entry's step end."""
    st = trace.steps.drop_duplicates("step", keep="first")
    b = trace.batch
    at = pd.Index(st["step"].to_numpy()).get_indexer(b["step"].to_numpy())
    ok = at >= 0
    t = st["t_ms"].to_numpy(dtype=float)[at[ok]]
    df = pd.DataFrame({"req": b["req"].to_numpy()[ok], "replica": st["replica"].to_numpy(dtype=float)[at[ok]],
                       "first_ms": t, "last_end_ms": t + st["dur_ms"].to_numpy(dtype=float)[at[ok]]})
    g = df.groupby(["req", "replica"], sort=True).agg(first_ms=("first_ms", "min"), last_end_ms=("last_end_ms", "max"))
    return {"req": g.index.get_level_values(0).to_numpy(dtype=np.int64),
            "replica": g.index.get_level_values(1).to_numpy(dtype=float),
            "first_ms": g["first_ms"].to_numpy(dtype=float), "last_end_ms": g["last_end_ms"].to_numpy(dtype=float)}


class _Params(dict):
    """A relation's columns and the params, without copying the columns (which may be read lazily)."""

    def __init__(self, env: dict, params: dict):
        super().__init__(params)
        self.env = env
        if "__request__" in env:
            self["__request__"] = {**env["__request__"], **params}

    def __missing__(self, key):
        return self.env[key]


class _Columns(dict):
    """A table's columns as numpy arrays, each read when first asked for (times as floats)."""

    def __init__(self, df: pd.DataFrame):
        super().__init__()
        self.df = df

    def __missing__(self, c):
        v = self[c] = self.df[c].to_numpy(dtype=float) if c in ("t_ms", "dur_ms") else self.df[c].to_numpy()
        return v


def token_spans(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request (trace order): first and last token time (NaN: none) and tokens emitted."""
    n = len(trace.requests)
    req, t = trace.tokens["req"].to_numpy(), trace.tokens["t_ms"].to_numpy(dtype=float)
    count = d.REQUEST["output_tokens"].per_request(req, t, n)
    return tuple(d.REQUEST[c].per_request(req, t, n, count) for c in ("first_token_ms", "last_token_ms")) + (count,)


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
    return InMemory(trace, spans=spans).request_frame()


def itl_gaps(trace) -> np.ndarray:
    """All inter-token gaps (ms), pooled over requests; one gap per new emission time."""
    tk = trace.tokens
    if len(tk) < 2:
        return np.empty(0)
    return itl_gaps_of(tk["req"].to_numpy(), tk["t_ms"].to_numpy())


def itl_gaps_of(req: np.ndarray, t: np.ndarray) -> np.ndarray:
    """itl_gaps over token rows given as (request, time) arrays: consecutive emissions of each
    request by time (then trace order), gaps > 0 (core/analysis/outofcore.py: the same in SQL)."""
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
    return d.drain_window(InMemory(trace))


def throughput(trace, window: tuple[float, float] | None = None) -> Throughput:
    """Output tokens per second over the drain window (default) or a fixed [start, end]."""
    ev = InMemory(trace)
    start, end, kind = measurement_window(window, d.drain_window(ev))
    return Throughput(d.emitted(ev, start, end), start, end, kind)


def cost_usd(tp: Throughput, usd_per_hour: float) -> tuple[float, float]:
    """(cost of the window, cost per 1,000 output tokens in it) under a flat tariff."""
    return d.cost_usd(tp.window_ms, tp.emitted_tokens, usd_per_hour)


def conservation(trace, m: pd.DataFrame | None = None) -> list[str]:
    """Token conservation (definitions.conservation). `m`: request_metrics(trace), when the caller has it."""
    return d.conservation(InMemory(trace, m))


def littles_law(trace, window: tuple[float, float] | None = None, m: pd.DataFrame | None = None) -> dict:
    """L = lambda * W over a window (definitions.littles_law); default: the drain window. Over the
    drain window of a finite workload the two sides agree exactly; a gap elsewhere says the window
    is not in steady state."""
    ev = InMemory(trace, m)
    start, end = d.drain_window(ev) if window is None else window
    return d.littles_law(ev, start, end)


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
    complete ("failed": error, abort, rejection, or no finish event). (definitions.slo_conditions)"""
    env = {c: m[c].to_numpy() for c in m.columns}
    env["finish_reason"] = m["finish_reason"].to_numpy(dtype=object)
    done, conds = d.slo_conditions(slo)
    done_v = np.asarray(done.np(env), dtype=bool)
    counts = {k: (int(np.count_nonzero(done_v & ~np.asarray(conds[k].np(env), dtype=bool))) if k in conds else None)
              for k in ("ttft", "tpot", "e2e")}
    counts["failed"] = int(np.count_nonzero(~done_v))
    return np.asarray(d.slo_met(slo).np(env), dtype=bool), counts


def slo_summary(trace, slo: SLO, m: pd.DataFrame | None = None,
                tp: Throughput | None = None) -> tuple[dict, np.ndarray]:
    """summary.slo (bounds, requests, met, attainment, goodput, violations) and the met mask."""
    ev = InMemory(trace, m)
    tp = throughput(trace) if tp is None else tp
    return d.slo_summary(ev, slo, tp.start_ms, tp.end_ms), ev.request_column(d.slo_met(slo)).astype(bool)


def utilisation(trace, window: tuple[float, float] | None = None) -> dict | None:
    """Running sequences and KV blocks in use (definitions.utilisation); default: the drain window."""
    ev = InMemory(trace)
    start, end = d.drain_window(ev) if window is None else (float(window[0]), float(window[1]))
    return d.utilisation(ev, start, end, trace.meta)


def step_summary(trace) -> dict | None:
    """The step events on their own (definitions.step_summary)."""
    return d.step_summary(InMemory(trace), trace.meta)


def summarize(trace, window=None, usd_per_hour=None, percentiles=DEFAULT_PERCENTILES, slo: SLO | None = None,
              per_request: bool = True, client_window_too: bool = True) -> dict:
    """The metrics of one trace as plain JSON-ready data (used by the CLI and pages). With
    SLO bounds given: summary.slo and a per-request slo_met. `per_request` False: no
    "requests" rows (callers that read only the summary; 10,000 rows cost ~0.1 s).
    `client_window_too` False: throughput over the drain window even where the trace records its
    client's own window (meta.client_window; a comparison of two traces takes both over their drain)."""
    ev = InMemory(trace)
    summary = d.summary(ev, window, usd_per_hour, percentiles, slo, trace.meta,
                        has_kv_events=bool(len(getattr(trace, "kv_events", ()))), client_window_too=client_window_too)
    fleet = fl.fleet_summary(ev, trace.meta)
    if fleet is not None:
        summary["fleet"] = fleet
    if not per_request:
        return {"source": trace.meta.get("source"), "label": trace.meta.get("label"), "summary": summary}
    m = ev.request_frame()
    met = ev.request_column(d.slo_met(slo)).astype(bool) if slo is not None and slo.given() else None

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


# ---- the engine's own clock beside the client's ------------------------------------------------

# The engine's per-request times, from its spans (core.trace.imports.otlp puts them in request_extra):
# summary key -> (request_extra field, name). Each is measured by the engine from the request's arrival
# at its front-end; the client's TTFT/E2E start at the send and end when a chunk reaches the client.
ENGINE_SIDE = {"ttft_ms": ("engine_ttft_ms", "engine TTFT"), "e2e_ms": ("engine_e2e_ms", "engine E2E"),
               "queue_ms": ("engine_queue_ms", "engine queue"), "prefill_ms": ("engine_prefill_ms", "engine prefill"),
               "decode_ms": ("engine_decode_ms", "engine decode")}
# A request's tokens reached the client "in a burst" when the client saw its first to last token in less
# than BURST_FRACTION of the time the engine spent decoding them (and the engine decoded for at least
# BURST_MIN_DECODE_MS): its client-side TPOT and ITL then measure the delivery, not the decoding.
BURST_FRACTION = 0.1
BURST_MIN_DECODE_MS = 5.0


def engine_values(trace, field: str) -> np.ndarray:
    """One request_extra field per request (NaN where a request has none)."""
    extra = getattr(trace, "request_extra", None) or []
    out = np.full(len(trace.requests), np.nan)
    for i, e in enumerate(extra[:len(out)]):
        v = e.get(field) if isinstance(e, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[i] = float(v)
    return out


def engine_side(trace, percentiles=d.DEFAULT_PERCENTILES) -> dict | None:
    """Distributions of the engine's own per-request times (ENGINE_SIDE), over the requests that have
    them; None when no request has any (no spans)."""
    out = {}
    for key, (field, name) in ENGINE_SIDE.items():
        v = engine_values(trace, field)
        v = v[np.isfinite(v)]
        if len(v):
            out[key] = distribution(v, name, percentiles)
    return out or None


def delivery_bursts(trace, metrics: pd.DataFrame | None = None) -> pd.DataFrame:
    """The requests whose tokens reached the client in a burst (BURST_FRACTION): id, output tokens, the
    client's first-to-last-token time, the engine's decode time (its span)."""
    m = request_metrics(trace) if metrics is None else metrics
    decode = engine_values(trace, "engine_decode_ms")
    client = (m["last_token_ms"] - m["first_token_ms"]).to_numpy(dtype=float)
    n = m["output_tokens"].to_numpy()
    with np.errstate(invalid="ignore"):
        burst = (n >= 2) & (decode >= BURST_MIN_DECODE_MS) & (client < BURST_FRACTION * decode)
    return pd.DataFrame({"id": m["id"].to_numpy()[burst], "output_tokens": n[burst],
                         "client first→last token ms": client[burst], "engine decode ms": decode[burst]})


def _str_objects(col) -> np.ndarray:
    """A column's values as an object array of str (missing: NaN), as `col.astype(str)` gives them;
    a categorical one by its codes, without a string per row."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        names = np.array([str(c) for c in col.cat.categories] + [np.nan], dtype=object)
        return names[col.cat.codes.to_numpy()]
    return col.astype(str).to_numpy(dtype=object)
