"""Measured replicas' traces as one fleet trace (the inverse of core.trace.one_replica).

A real fleet's replicas each record their own measured trace (`gpu_runner serve --trace-out`);
`merge_replicas` joins them into the fleet trace the simulator writes (core.fleet.sim): one
request table, a `replica` column on tokens, finishes, steps, KV block events and preemptions,
steps numbered fleet-wide in order of start (ties: the lower replica first), the router's
`route` and `transfer` events when the front end recorded them, and `meta.fleet`.

Clocks: replicas started on their own each have their own origin: they are placed on one clock
from what each trace records of its clock (core.fleet.clocks: one host's monotonic clock, epoch
origins, ...; a replica that cannot be placed is refused), or by `offsets_ms` (replica k's times
moved by offsets_ms[k]) when given; gpu_runner's fleet starts every engine process with the front
end's origin (`one_clock`: they are on one clock already). The merge never assumes offsets of 0;
meta.fleet.alignment says how each replica was placed.

Requests: given `requests` (the front end's own table: arrival = when the front end accepted the
request), every replica's rows are matched to it by id. Otherwise the table is the union of the
replicas' requests in order of arrival. Disaggregated (`roles` with prefill and decode): a
request on a prefill and a decode replica is one request — the prefill replica's copy (it asked
one token, discarded) contributes its steps, batch entries and KV events but no tokens or finish,
and the request's arrival is the prefill copy's. Replicas serving whole requests (role `both`)
that were started on their own number their requests alike (`req-0` on each): an id found on
more than one such replica names different requests there, and each is renamed `r{k}/{id}`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.errors import TraceError
from core.fleet.clocks import Placement, place_replicas
from core.fleet.records import fleet_step_numbers
from core.fleet.router import ROLES, check_roles
from core.trace.model import Trace
from core.trace.schema import REQUEST
from core.workload import MAX_TIME_MS

_TABLES = ("tokens", "finishes", "kv", "preempts")     # tables with a req column and a replica column


def merge_replicas(traces: list[Trace], *, roles: list[str] | None = None, requests: pd.DataFrame | None = None,
                   request_extra: list | None = None, other: list[dict] | None = None, fleet: dict | None = None,
                   label: str | None = None, offsets_ms: list[float] | None = None, names: list[str] | None = None,
                   one_clock: str | None = None) -> Trace:
    """One fleet trace from replica k's trace at traces[k] (see the module's docstring).
    `other`: the front end's verbatim events (route, transfer); `fleet`: meta.fleet's router and
    link parts (the replicas' part is built here from their traces); `names`: the files, for
    error messages; `one_clock`: how the replicas' times are known to be on one clock already."""
    n = len(traces)
    if n == 0:
        raise TraceError("fleet merge: no replica traces")
    names = names or [f"replica {k}" for k in range(n)]
    roles = list(roles or ["both"] * n)
    _check_replicas(traces, roles, offsets_ms, names)
    placed = _placement(traces, names, offsets_ms, one_clock)
    traces = _on_one_clock(traces, placed.offsets_ms, names)
    local_ids = _local_ids(traces, roles)
    table, extra = _request_table(traces, local_ids, roles, requests, request_extra, names)
    pos = {rid: i for i, rid in enumerate(table["id"].tolist())}
    out = _replica_tables(traces, local_ids, roles, pos)
    ev = _other_events(traces, local_ids, other, set(pos))
    meta = _meta(traces, roles, {**(fleet or {}), "alignment": placed.rows(names)}, label)
    if placed.clock is not None:
        meta["clock"] = placed.clock
    return Trace(meta=meta, requests=table, tokens=out["tokens"], finishes=out["finishes"], steps=out["steps"],
                 batch=out["batch"], kv=out["kv"], kv_events=out["kv_events"], preempts=out["preempts"], other=ev,
                 request_extra=extra, extra=dict(traces[0].extra))


def _check_replicas(traces: list[Trace], roles: list[str], offsets_ms, names: list[str]) -> None:
    """Roles, one source, one offset per replica, and each trace a replica's own."""
    n = len(traces)
    if len(roles) != n or any(r not in ROLES for r in roles):
        raise TraceError(f"fleet merge: expected {n} roles from {', '.join(ROLES)}, got {roles}")
    check_roles(roles, "fleet merge: roles")
    sources = [t.meta.get("source") for t in traces]
    if len(set(sources)) > 1:    # (one trace's numbers have one origin: a given and a measured one do not mix)
        raise TraceError("fleet merge: the replicas' traces come from different sources (" + ", ".join(
            f"{names[k]}: {src or 'not recorded'}" for k, src in enumerate(sources)) + "); merge replicas of one run")
    if offsets_ms is not None and len(offsets_ms) != n:
        raise TraceError(f"fleet merge: expected {n} clock offsets, got {len(offsets_ms)}")


def _placement(traces: list[Trace], names: list[str], offsets_ms, one_clock: str | None) -> Placement:
    if one_clock is not None:
        return Placement([0.0] * len(traces), 0.0, one_clock, None)
    if offsets_ms is not None:
        return Placement([float(x) for x in offsets_ms], None, "given (offsets_ms)", None)
    return place_replicas(traces, names)


def _on_one_clock(traces: list[Trace], offsets_ms, names: list[str]) -> list[Trace]:
    """Replica k's times moved by offsets_ms[k] (inside the times a trace holds); each must be a
    replica's own trace, not a fleet's."""
    traces = [_shifted(t, offsets_ms[k]) if offsets_ms and offsets_ms[k] else t for k, t in enumerate(traces)]
    if offsets_ms:
        for k, t in enumerate(traces):
            lo, hi = _time_span(t)
            if lo < 0 or hi > MAX_TIME_MS:
                raise TraceError(f"fleet merge: {names[k]} moved by {offsets_ms[k]:g} ms would span {lo:.6g}.."
                                 f"{hi:.6g} ms, outside the 0..{MAX_TIME_MS:g} ms a trace holds: check the offsets")
    for k, t in enumerate(traces):
        if (t.steps["replica"] != 0).any() or len(t.events_of("route")):
            raise TraceError(f"fleet merge: {names[k]} is already a fleet trace (give each replica's own trace)")
    return traces


def _renumbered(r: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A replica's request indexes as the merged table's rows (-1 stays -1)."""
    return np.where(r >= 0, rows[np.maximum(r, 0)] if len(rows) else -1, -1)


def _replica_tables(traces: list[Trace], local_ids, roles: list[str], pos: dict) -> dict[str, pd.DataFrame]:
    """The merged record tables: each replica's rows with the merged request rows, a replica column
    and fleet-wide step numbers, in time (steps, batch: step) order."""
    n = len(traces)
    step_no = fleet_step_numbers([{"step": {"t_ms": t.steps["t_ms"].to_numpy(), "step": t.steps["step"].to_numpy()}}
                                   if len(t.steps) else {} for t in traces]) if n > 1 else [None]
    parts: dict[str, list] = {name: [] for name in (*_TABLES, "steps", "batch", "kv_events")}
    for k, t in enumerate(traces):
        rows = np.asarray([pos[rid] for rid in local_ids[k]], dtype=np.int64)
        # a prefill replica runs copies only (its token is discarded; the decode replica, or the front
        # end when the handoff failed, gives the request's finish)
        copy = np.full(len(local_ids[k]), roles[k] == "prefill", dtype=bool)
        for name in _TABLES:
            df = getattr(t, name).copy()
            r = df["req"].to_numpy()
            if name in ("tokens", "finishes") and copy.any():
                keep = ~((r >= 0) & copy[np.maximum(r, 0)])
                df, r = df[keep], r[keep]
            df["req"] = _renumbered(r, rows)
            df["replica"] = k
            parts[name].append(df)
        st, b = t.steps.copy(), t.batch.copy()
        if step_no[k] is not None and len(st):
            st["step"] = step_no[k][st["step"].to_numpy()]
            b["step"] = step_no[k][b["step"].to_numpy()]
        st["replica"] = k
        b["req"] = _renumbered(b["req"].to_numpy(), rows)
        parts["steps"].append(st)
        parts["batch"].append(b)
        kv = t.kv_events.copy()
        kv["replica"] = k
        parts["kv_events"].append(kv)
    return {name: _concat(dfs, "step" if name in ("steps", "batch") else "t_ms") for name, dfs in parts.items()}


def _other_events(traces: list[Trace], local_ids, other: list[dict] | None, known: set) -> list[dict]:
    """The front end's events and each replica's own (its requests renamed as merged; events of a
    request the merged table does not hold are dropped), in time order."""
    ev = [dict(e) for e in (other or [])]
    for k, t in enumerate(traces):
        ren = dict(zip(t.requests["id"].tolist(), local_ids[k]))
        for e in t.other:
            e = dict(e)
            if isinstance(e.get("req"), str):
                e["req"] = ren.get(e["req"], e["req"])
                if e["req"] not in known:
                    continue
            e.setdefault("replica", k)
            ev.append(e)
    ev.sort(key=lambda e: e.get("t_ms", 0.0))
    return ev


def _time_span(t: Trace) -> tuple[float, float]:
    """The earliest and latest time of a trace's records (0, 0 for none)."""
    lo, hi = np.inf, -np.inf
    for name in ("requests", "tokens", "finishes", "steps", "kv", "kv_events", "preempts"):
        df = getattr(t, name)
        col = "arrival_ms" if name == "requests" else "t_ms"
        if len(df):
            v = df[col].to_numpy(dtype=float)
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    return (0.0, 0.0) if lo == np.inf else (lo, hi)


def _shifted(t: Trace, d: float) -> Trace:
    out = Trace(meta=dict(t.meta), requests=t.requests.copy(), tokens=t.tokens.copy(), finishes=t.finishes.copy(),
                steps=t.steps.copy(), batch=t.batch, kv=t.kv.copy(), kv_events=t.kv_events.copy(),
                preempts=t.preempts.copy(), other=[dict(e) for e in t.other], request_extra=t.request_extra,
                extra=t.extra)
    out.requests["arrival_ms"] = out.requests["arrival_ms"] + d
    for name in ("tokens", "finishes", "steps", "kv", "kv_events", "preempts"):
        getattr(out, name)["t_ms"] = getattr(out, name)["t_ms"] + d
    for e in out.other:
        if isinstance(e.get("t_ms"), (int, float)):
            e["t_ms"] += d
    return out


def _local_ids(traces: list[Trace], roles: list[str]) -> list[list[str]]:
    """Each replica's request ids as the merged trace names them: ids on more than one replica
    that serves whole requests are renamed r{k}/{id} there."""
    ids = [t.requests["id"].tolist() for t in traces]
    count: dict[str, int] = {}
    for k, lst in enumerate(ids):
        if roles[k] == "both":
            for rid in lst:
                count[rid] = count.get(rid, 0) + 1
    clash = {rid for rid, c in count.items() if c > 1}
    if not clash:
        return ids
    return [[f"r{k}/{rid}" if roles[k] == "both" and rid in clash else rid for rid in lst]
            for k, lst in enumerate(ids)]


def _first_and_body(traces, local_ids, roles) -> tuple[dict, dict]:
    """id -> (earliest arrival, replica, row); id -> (replica, row) whose fields describe the request
    (a prefill replica's copy asked one token, its decode replica's the client's count)."""
    first: dict[str, tuple] = {}
    body: dict[str, tuple] = {}
    for k, t in enumerate(traces):
        arr = t.requests["arrival_ms"].to_numpy()
        for j, rid in enumerate(local_ids[k]):
            got = first.get(rid)
            if got is None or arr[j] < got[0]:
                first[rid] = (float(arr[j]), k, j)
            if rid not in body or (roles[body[rid][0]] == "prefill" and roles[k] != "prefill"):
                body[rid] = (k, j)
    return first, body


def _front_end_table(traces, first: dict, requests: pd.DataFrame, request_extra):
    """The front end's own request table, every replica's request one it accepted."""
    given = set(requests["id"].tolist())
    missing = [rid for rid in first if rid not in given]
    if missing:
        raise TraceError(f"fleet merge: request {missing[0]!r} of a replica's trace is not one the front end "
                         f"accepted ({len(missing)} such)")
    table = requests.reset_index(drop=True)
    if request_extra is not None:
        return table, list(request_extra)
    extra = []    # each request's extras (prompt ids, ...) as the first replica that holds it recorded them
    for rid in table["id"].tolist():
        got = first.get(rid)
        ex = traces[got[1]].request_extra if got is not None else None
        extra.append(dict(ex[got[2]]) if ex else {})
    return table, extra


def _request_table(traces, local_ids, roles, requests, request_extra, names):
    """(request table, per-request extras): the front end's, or the union of the replicas' in order of arrival."""
    first, body = _first_and_body(traces, local_ids, roles)
    if requests is not None:
        return _front_end_table(traces, first, requests, request_extra)
    order = sorted(first.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[1][2]))
    cols = {c.name: [] for c in REQUEST.columns}
    extra = []
    for rid, (arrival, _, _) in order:
        k, j = body[rid]
        row = traces[k].requests.iloc[j]
        for c in REQUEST.columns:
            cols[c.name].append(rid if c.name == "id" else arrival if c.name == "arrival_ms" else row[c.name])
        extra.append(dict(traces[k].request_extra[j]) if traces[k].request_extra else {})
    table = pd.DataFrame(cols).astype({c: traces[0].requests[c].dtype for c in cols}) if order else \
        traces[0].requests.iloc[0:0].copy()
    for c in table.columns:   # (a text field missing on one replica's side came back as NaN: missing is None)
        if table[c].dtype == object and table[c].isna().any():
            table[c] = table[c].astype(object).where(table[c].notna(), None)
    return table, extra


def _concat(dfs: list[pd.DataFrame], key: str) -> pd.DataFrame:
    dfs = [d for d in dfs if len(d)] or dfs[:1]
    out = pd.concat(dfs, ignore_index=True) if len(dfs) > 1 else dfs[0].reset_index(drop=True)
    if key in out.columns and len(dfs) > 1:
        out = out.sort_values(key, kind="stable").reset_index(drop=True)
    for c in out.columns:     # (a text column all missing in one part came back as NaN: missing is None)
        if out[c].dtype == object and out[c].isna().any():
            out[c] = out[c].astype(object).where(out[c].notna(), None)
    return out


def _counted_hits(t: Trace) -> dict:
    """The server's own prefix-cache counters over the capture (vLLM's vllm:prefix_cache_hits and
    _queries, tokens, as its /metrics samples give them: the last sample less the first), where
    the replica's trace has them."""
    out = {}
    for key, name in (("prefix_cache_hits", "prefix_hit_tokens"), ("prefix_cache_queries", "prefix_query_tokens")):
        vals = [e[key] for e in t.other if e.get("type") == "gauge" and isinstance(e.get(key), (int, float))]
        if vals:
            out[name] = int(round(vals[-1] - vals[0]))
    return out


def _meta(traces: list[Trace], roles: list[str], fleet: dict | None, label: str | None) -> dict:
    m0 = traces[0].meta
    meta = {k: v for k, v in m0.items() if k not in ("stats", "label", "fleet")}
    reps, stats = [], {}
    for k, t in enumerate(traces):
        st = dict(t.meta.get("stats") or {})
        for key, v in st.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                stats[key] = stats.get(key, 0) + v
        # hit blocks from the replica's own KV rows; a server that records none (vLLM) has them unknown, never 0
        hits = int((t.kv["op"] == "hit").sum()) if len(t.kv) else None
        reps.append({"replica": k, "role": roles[k], "engine": t.meta.get("engine"), "step_model": None,
                     "kv_blocks": st.get("kv_blocks"), "drain_ms": None,
                     "stats": {"steps": len(t.steps), "requests": len(t.requests),
                               "preemptions": int(st.get("preemptions", 0)), "prefix_hit_blocks": hits,
                               **_counted_hits(t)}})
    meta["stats"] = stats
    meta["label"] = label or f"{len(traces)} replicas ({m0.get('source') or 'origin not recorded'})"
    meta["fleet"] = {"replicas": reps, **(fleet or {})}
    return meta
