"""Fleet metrics: per replica, the router and the KV transfers of a trace served by several
replicas (core.fleet), each defined once here in the expression layer (core.analysis.expr) and
evaluated by either evaluator of core.analysis.definitions: numpy over a trace in memory or
DuckDB over Parquet files (`fleet_summary(ev, meta)` gives summary.fleet from either).

A trace is a fleet trace when its meta has `fleet` or any token, finish, step, kv or preempt row
names a replica other than 0. Its replicas are meta.fleet.replicas (role both, prefill or
decode) together with every replica a row names (role "both" when meta does not give it).
FIELDS says what each field of summary.fleet means. The relations the definitions read, beside
definitions.REQUEST's (each evaluator builds them):
  replica_finish  t_ms, req, replica (-1: rejected at the router), in trace order
  replica_step    t_ms, dur_ms, replica
  replica_kv      op, replica (the simulator's physical KV block events)
  replica_preempt t_ms, req, replica (the preempt rows)
  replica_hit     t_ms, req, replica: the kv rows with op hit that name a request, with its
                  request's fleet_request columns (OfRequest)
  route           t_ms, replica, decode, prompt_blocks (the `route` events; a value that is not a
                  number: missing)
  transfer        t_ms, req, src, dst, bytes, blocks, dur_ms (the `transfer` events whose req names
                  a request; a value that is not a number: missing)
  fleet_request   the request relation with FLEET_REQUEST's columns
  visit           one row per (request, replica) the request has batch entries on: req, replica,
                  first_ms (its first entry's step start there), last_end_ms (its last entry's step
                  end there), with its request's fleet_request columns (OfRequest). A batch entry's
                  step is the first step record of its number (trace order).
"""
from __future__ import annotations

import math

from core.analysis import definitions as d
from core.analysis.expr import Agg, ByRequest, Col, IsNull, OfRequest

ROLES = ("both", "prefill", "decode")
REPLICA_RECORDS = ("token", "finish", "step", "kv", "preempt")   # record types with a replica column
PERCENTILES = (50, 90, 99)
# the verbatim events read as relations: their numeric fields (`req`: the request's id, made its row)
EVENT_FIELDS = {"route": ("t_ms", "replica", "decode", "prompt_blocks"),
                "transfer": ("t_ms", "src", "dst", "bytes", "blocks", "dur_ms")}
EVENT_REQ = {"route": False, "transfer": True}

# ---- per request, beside definitions.REQUEST (the relation fleet_request) --------------------------------
FLEET_REQUEST = {
    "finish_replica": ByRequest("last", "replica_finish", "replica"),   # the replica of its (last) finish
    "transfer_src": ByRequest("last", "transfer", "src"),
    "transfer_dst": ByRequest("last", "transfer", "dst"),
    "transfer_start_ms": ByRequest("last", "transfer", "t_ms"),
    "transfer_ms": ByRequest("last", "transfer", "dur_ms"),
    "transfer_end_ms": Col("transfer_start_ms") + Col("transfer_ms"),
    "first_preempt_ms": ByRequest("min", "replica_preempt", "t_ms"),   # missing: never preempted
}
_END = OfRequest(Col("transfer_end_ms"))
# A prefix-cache hit on a request's first admission: before its first preemption (a re-admission
# after a preemption hits its own blocks again; counting those would reward preemption).
FIRST_ADMISSION = IsNull(OfRequest(Col("first_preempt_ms"))) | (Col("t_ms") < OfRequest(Col("first_preempt_ms")))


def _finished_elsewhere(r: int):
    """(over fleet_request) the request finished on a replica other than r (not at the router)."""
    return (Col("finish_replica") >= 0) & ~Col("finish_replica").eq(r)


# ---- per replica r: relation -> {field: the Agg for replica r} ----------------------------------------------
PER_REPLICA = {
    "fleet_request": {"requests": lambda r: Agg("count", where=Col("finish_replica").eq(r))},
    "visit": {"prefilled": lambda r: Agg("count", where=Col("replica").eq(r) & OfRequest(_finished_elsewhere(r)))},
    "replica_step": {"steps": lambda r: Agg("count", where=Col("replica").eq(r)),
                     "busy_ms": lambda r: Agg("fsum", Col("dur_ms"), where=Col("replica").eq(r))},
    "replica_kv": {"prefix_hit_blocks": lambda r: Agg("count", where=Col("op").eq("hit") & Col("replica").eq(r))},
    "replica_hit": {"hit_blocks_first": lambda r: Agg("count", where=Col("replica").eq(r) & FIRST_ADMISSION)},
    # routed to r: as the request's replica (whole, or its prefill) or as its decode replica
    "route": {"routed": lambda r: Agg("count", where=Col("replica").eq(r) | Col("decode").eq(r)),
              # the full prompt blocks of those requests: what its prefix cache could have held for them
              "prompt_blocks": lambda r: Agg("fsum", Col("prompt_blocks"), where=(Col("replica").eq(r)
                                             | Col("decode").eq(r)) & ~IsNull(Col("prompt_blocks")))},
    "replica_finish": {"finished": lambda r: Agg("count", where=Col("replica").eq(r))},
}
PRESENT = {"replica_kv": {"n": Agg("count")}, "route": {"n": Agg("count")}, "replica_preempt": {"n": Agg("count")}}
REJECTED = {"rejected": Agg("count", where=Col("replica").eq(-1))}          # over replica_finish
TRANSFERS = {"count": Agg("count"), "bytes": Agg("sum", Col("bytes"), where=~IsNull(Col("bytes"))),
             "blocks": Agg("sum", Col("blocks"), where=~IsNull(Col("blocks")))}
_ON_SRC = Col("replica").eq(OfRequest(Col("transfer_src"))) & ~IsNull(_END)
_ON_DST = Col("replica").eq(OfRequest(Col("transfer_dst"))) & ~IsNull(_END)
WAITS = {  # over visit: a transferred request on its transfer's source (prefill) and destination (decode)
    "waited_ms_mean": Agg("mean", _END - Col("last_end_ms"), where=_ON_SRC),
    "decode_admit_wait_ms_mean": Agg("mean", Col("first_ms") - _END, where=_ON_DST),
}

FIELDS = {
    "origin": "the trace's meta.source (given, simulated, measured, imported): where every number here comes from",
    "window_ms": "the drain window [first arrival, last emission] busy_fraction is taken over",
    "replicas": "one row per replica, by index",
    "replicas[].replica": "the replica's index",
    "replicas[].role": "both (runs requests whole), prefill or decode (disaggregated); both when meta.fleet "
                       "does not say",
    "replicas[].step_model": "simulated traces: its step model as meta.fleet states it (null otherwise)",
    "replicas[].requests": "requests whose (last) finish is on it (disaggregated: the decode replica's)",
    "replicas[].prefilled": "requests with a batch entry on it that finished on another replica (disaggregated: "
                            "those it prefilled)",
    "replicas[].routed": "requests the router sent to it: route events naming it as the request's replica or "
                         "its decode replica (without route events: the finishes on it)",
    "replicas[].ttft_ms": "TTFT (first token - arrival) of the requests it finished: n, mean, p50, p90, p99",
    "replicas[].e2e_ms": "E2E (last token - arrival) of the requests it finished: n, mean, p50, p90, p99",
    "replicas[].steps": "its step records",
    "replicas[].busy_ms": "the sum of its steps' dur_ms",
    "replicas[].busy_fraction": "busy_ms / the drain window's length",
    "replicas[].prefix_hit_blocks": "prefix-cache hits: its kv rows with op hit (a trace without kv rows: "
                                    "meta.fleet.replicas[].stats.prefix_hit_blocks)",
    "replicas[].prefix_hit_blocks_source": "kv (the trace's kv rows), meta (meta.fleet's stats) or null (neither)",
    "replicas[].prefix_hit_blocks_first": "prefix-cache hits on first admission: its kv hit rows of each request "
                                          "before that request's first preemption (re-admissions left out: they "
                                          "would reward preemption); without kv rows, meta.fleet's stats."
                                          "prefix_hit_blocks_first, else prefix_hit_blocks when the trace has no "
                                          "preemption (null otherwise)",
    "replicas[].prompt_blocks": "full prompt blocks of the requests routed to it (route events' prompt_blocks; a "
                                "disaggregated request counts at its prefill and at its decode replica); null "
                                "without route events",
    "replicas[].prefix_hit_rate": "prefix_hit_blocks_first / prompt_blocks (0..1; null without either)",
    "replicas[].prefix_hit_tokens": "prefix-cache hit tokens by the server's own counter over the capture (vLLM's "
                                    "vllm:prefix_cache_hits: its last /metrics sample less its first; "
                                    "meta.fleet.replicas[].stats.prefix_hit_tokens); null where its counters were "
                                    "not sampled",
    "replicas[].prefix_query_tokens": "prompt tokens looked up in the prefix cache by the same counters "
                                      "(vllm:prefix_cache_queries); null where not sampled",
    "prefix_cache": "the fleet's prefix cache: the replicas' sums (hit_blocks_first, prompt_blocks, "
                    "hit_blocks_all; hit_tokens and query_tokens by the servers' own counters) and hit_rate = "
                    "hit_blocks_first / prompt_blocks, the one prefix hit rate the app, the CLI and docs/fleet.md show",
    "router": "the router",
    "router.policy": "meta.fleet.router.policy",
    "router.staleness_ms": "meta.fleet.router.staleness_ms: how old the replica signals it routed on were",
    "router.routed_from": "route events, or finishes (a trace without route events)",
    "router.imbalance": "max / mean of `routed` over the replicas a request's first route goes to (role both; "
                        "disaggregated: prefill); 1 is even, null when none was routed",
    "router.imbalance_decode": "disaggregated: max / mean of `routed` over the decode replicas",
    "router.rejected": "finishes at the router (replica -1): requests no replica took",
    "transfers": "disaggregated: the KV transfers from prefill to decode replicas (transfer events)",
    "transfers.count": "transfer events",
    "transfers.bytes": "bytes moved, summed",
    "transfers.blocks": "KV blocks moved, summed",
    "transfers.mean_ms": "mean transfer time (dur_ms: link latency + bytes / bandwidth, longer when the link "
                         "is shared)",
    "transfers.p99_ms": "p99 of dur_ms",
    "transfers.waited_ms_mean": "mean over transferred requests of transfer end - prefill end (the end of its "
                                "last step on the source replica): the time its first token waited on the link",
    "transfers.decode_admit_wait_ms_mean": "mean over transferred requests of the start of its first step on "
                                           "the destination replica - transfer end: the wait to be admitted there",
    "notes": "what the numbers leave out or could not read",
}


def _plain_dist(dist: dict) -> dict:
    return {k: dist[k] for k in ("n", "mean", *(f"p{q}" for q in PERCENTILES))}


def _thin_note(rows: list[dict]) -> list[str]:
    """One note for the replicas whose tail percentiles come from too few requests."""
    thin = [q for q in PERCENTILES if q > 50]
    few = [f"{r['replica']} ({r['ttft_ms']['n']})" for r in rows
           if 0 < r["ttft_ms"]["n"] < d.min_samples_for(max(thin))]
    if not few:
        return []
    needs = ", ".join(f"p{q} >= {d.min_samples_for(q)}" for q in thin)
    return [f"per-replica TTFT and E2E tails from few requests (a tail estimate needs {needs}): replica "
            f"(requests) {', '.join(few)}; treat those percentiles as a choice among the observations"]


def meta_replicas(meta: dict) -> tuple[dict | None, list[str]]:
    """({replica: {role, step_model, stats}} from meta.fleet, or None without it; notes on entries
    it could not read (left out))."""
    f = meta.get("fleet")
    if f is None:
        return None, []
    if not isinstance(f, dict):
        return None, ["meta.fleet: not an object (ignored)"]
    reps, notes = {}, []
    listed = f.get("replicas")
    if listed is not None and not isinstance(listed, list):
        notes.append("meta.fleet.replicas: not a list (ignored)")
    for k, e in enumerate(listed if isinstance(listed, list) else []):
        r = e.get("replica") if isinstance(e, dict) else None
        if isinstance(r, bool) or not isinstance(r, int) or r < 0 or r in reps:
            notes.append(f"meta.fleet.replicas[{k}]: expected {{replica: a new integer >= 0, role, ...}} (left out)")
            continue
        role = e.get("role", "both")
        if role not in ROLES:
            notes.append(f"meta.fleet.replicas[{k}].role: expected one of {', '.join(ROLES)}, got {role!r} "
                         "(taken as both)")
            role = "both"
        sm = e.get("step_model")
        desc = sm.get("description") if isinstance(sm, dict) else None
        reps[r] = {"role": role, "step_model": desc if isinstance(desc, str) else None,
                   "stats": e.get("stats") if isinstance(e.get("stats"), dict) else {}}
    return reps, notes


def _per_replica(ev, reps: list[int]) -> dict:
    """{field: {replica: value}} of PER_REPLICA, one pass over each relation."""
    out: dict = {}
    for rel, fields in PER_REPLICA.items():
        got = ev.agg(rel, {f"{name}|{r}": fn(r) for name, fn in fields.items() for r in reps})
        for key, v in got.items():
            name, r = key.split("|")
            out.setdefault(name, {})[int(r)] = v
    return out


def _meta_hits(info: dict, key: str = "prefix_hit_blocks") -> int | None:
    v = info["stats"].get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _hits_row(per: dict, present: dict, info: dict, r: int) -> dict:
    """A replica's prefix-cache fields (FIELDS: replicas[].prefix_*, prompt_blocks)."""
    if present["replica_kv"]:
        hits, src, first = int(per["prefix_hit_blocks"][r]), "kv", int(per["hit_blocks_first"][r])
    else:
        hits, src = _meta_hits(info), "meta"
        first = _meta_hits(info, "prefix_hit_blocks_first")
        if first is None and not present["replica_preempt"]:
            first = hits
    blocks = int(per["prompt_blocks"][r]) if present["route"] else None
    return {"prefix_hit_blocks": hits, "prefix_hit_blocks_source": src if hits is not None else None,
            "prefix_hit_blocks_first": first, "prompt_blocks": blocks,
            "prefix_hit_rate": first / blocks if first is not None and blocks else None,
            "prefix_hit_tokens": _meta_hits(info, "prefix_hit_tokens"),
            "prefix_query_tokens": _meta_hits(info, "prefix_query_tokens")}


def _hit_totals(rows: list[dict]) -> dict:
    """FIELDS' prefix_cache: the replicas' sums and the fleet's hit rate (null where a replica's
    count is unknown)."""
    def total(key):
        vals = [x[key] for x in rows]
        return None if any(v is None for v in vals) else sum(vals)
    first, blocks = total("prefix_hit_blocks_first"), total("prompt_blocks")
    return {"hit_blocks_first": first, "prompt_blocks": blocks, "hit_blocks_all": total("prefix_hit_blocks"),
            "hit_rate": first / blocks if first is not None and blocks else None,
            "hit_tokens": total("prefix_hit_tokens"), "query_tokens": total("prefix_query_tokens")}


def prefix_cache(ev, meta: dict, reps: list[int]) -> tuple[list[dict], dict]:
    """Only the prefix-cache part of fleet_summary (its rows' prefix fields and prefix_cache) for
    replicas `reps`: what a page comparing many runs reads, without the rest of the summary."""
    known, _ = meta_replicas(meta)
    info = {r: (known or {}).get(r, {"role": "both", "step_model": None, "stats": {}}) for r in reps}
    present = {rel: ev.agg(rel, aggs)["n"] for rel, aggs in PRESENT.items()}
    per: dict = {}
    for rel, name in (("replica_kv", "prefix_hit_blocks"), ("replica_hit", "hit_blocks_first"),
                      ("route", "prompt_blocks")):
        fn = PER_REPLICA[rel][name]
        got = ev.agg(rel, {str(r): fn(r) for r in reps})
        per[name] = {int(k): v for k, v in got.items()}
    rows = [{"replica": r, **_hits_row(per, present, info[r], r)} for r in reps]
    return rows, _hit_totals(rows)


def fleet_summary(ev, meta: dict) -> dict | None:
    """summary.fleet (FIELDS) of a fleet trace; None for a single-engine one."""
    known, notes = meta_replicas(meta)
    seen = ev.replicas_seen(REPLICA_RECORDS)
    if known is None and not seen - {0, -1}:
        return None
    known = known or {}
    reps = sorted(set(known) | {r for r in seen if r >= 0})
    info = {r: known.get(r, {"role": "both", "step_model": None, "stats": {}}) for r in reps}
    start, end = d.drain_window(ev)
    span = end - start
    per = _per_replica(ev, reps)
    present = {rel: ev.agg(rel, aggs)["n"] for rel, aggs in PRESENT.items()}
    rows = []
    for r in reps:
        row = {"replica": r, "role": info[r]["role"], "step_model": info[r]["step_model"],
               "requests": int(per["requests"][r]), "prefilled": int(per["prefilled"][r]),
               "routed": int(per["routed" if present["route"] else "finished"][r])}
        for key, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
            dist = ev.distribution(key, f"replica {r} {name}", PERCENTILES, relation="fleet_request",
                                   where=Col("finish_replica").eq(r))
            row[key] = _plain_dist(dist)
        busy = float(per["busy_ms"][r])
        row.update({"steps": int(per["steps"][r]), "busy_ms": busy, "busy_fraction": busy / span if span > 0 else None,
                    **_hits_row(per, present, info[r], r)})
        rows.append(row)
    out = {"origin": meta.get("source"), "window_ms": [start, end], "replicas": rows,
           "prefix_cache": _hit_totals(rows), "router": _router(ev, meta, rows, bool(present["route"]))}
    transfers = _transfers(ev)
    if transfers is not None or any(row["role"] != "both" for row in rows):
        out["transfers"] = transfers or _transfers(ev, empty=True)
    out["notes"] = notes + _thin_note(rows)
    return out


def _router(ev, meta: dict, rows: list[dict], from_routes: bool) -> dict:
    f = meta.get("fleet") if isinstance(meta.get("fleet"), dict) else {}
    rc = f.get("router") if isinstance(f.get("router"), dict) else {}
    policy, stale = rc.get("policy"), rc.get("staleness_ms")
    out = {"policy": policy if isinstance(policy, str) else None,
           "staleness_ms": float(stale) if isinstance(stale, (int, float)) and not isinstance(stale, bool) else None,
           "routed_from": "route events" if from_routes else "finishes",
           "imbalance": d.imbalance([x["routed"] for x in rows if x["role"] in d.FIRST_ROUTE_ROLES])}
    if any(x["role"] == "decode" for x in rows):
        out["imbalance_decode"] = d.imbalance([x["routed"] for x in rows if x["role"] == "decode"])
    out["rejected"] = int(ev.agg("replica_finish", REJECTED)["rejected"])
    return out


def _transfers(ev, empty: bool = False) -> dict | None:
    """summary.fleet.transfers; None without transfer events (unless `empty`: the zero row)."""
    t = ev.agg("transfer", TRANSFERS)
    if not t["count"] and not empty:
        return None
    dist = ev.distribution("dur_ms", "KV transfer time", PERCENTILES, relation="transfer")
    w = ev.agg("visit", WAITS) if t["count"] else {k: None for k in WAITS}
    num = lambda x: None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
    return {"count": int(t["count"]), "bytes": int(t["bytes"] or 0), "blocks": int(t["blocks"] or 0),
            "mean_ms": dist["mean"], "p99_ms": dist["p99"],
            **{k: num(v) for k, v in w.items()}}


def fields_markdown() -> str:
    """FIELDS as the table docs/metrics.md shows (tests/test_fleet_metrics.py rewrites it)."""
    rows = [f"| `{k}` | {v.replace('|', '/')} |" for k, v in FIELDS.items()]
    return "\n".join(["| field | meaning |", "|---|---|", *rows]) + "\n"
