"""A fleet trace's routing read back as tables and numbers: which replicas each request went to
(its route events, or for a trace without them the replica of its first token), the requests each
replica was given, the numbers a comparison of fleet runs shows (fleet_numbers: TTFT, the prefix
cache as core.analysis.fleet defines it, imbalance as core.analysis.definitions defines it), the
replicas' roles and drains, the fleet in words, the KV transfers. Data only: core.figures.fleet
draws them, core.experiments.fleet compares runs with them."""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.analysis.definitions import FIRST_ROUTE_ROLES, imbalance
from core.analysis.fleet import prefix_cache
from core.analysis.metrics import SLO, InMemory, distribution, request_metrics, slo_summary


def has_replicas(trace) -> bool:
    """A fleet trace: meta.fleet, or a `replica` column with a value other than 0."""
    if isinstance(trace.meta.get("fleet"), dict):
        return True
    for table in (trace.tokens, trace.finishes, trace.steps, trace.kv):
        if "replica" in table and len(table) and bool((table["replica"].to_numpy() > 0).any()):
            return True
    return False


def replica_roles(trace) -> list[str]:
    """Each replica's role (both, prefill, decode), from meta.fleet; else as many whole replicas as
    the replica columns name."""
    reps = (trace.meta.get("fleet") or {}).get("replicas")
    if isinstance(reps, list) and reps and all(isinstance(r, dict) for r in reps):
        return [str(r.get("role", "both")) for r in reps]
    top = -1
    for table in (trace.tokens, trace.finishes, trace.steps, trace.kv):
        if "replica" in table and len(table):
            top = max(top, int(table["replica"].max()))
    return ["both"] * (top + 1)


def _first_by_request(n: int, req: np.ndarray, value: np.ndarray, fill=-1) -> np.ndarray:
    """Per request row: the value of its first row in (req, value) rows (fill where it has none)."""
    out = np.full(n, fill, dtype=value.dtype if len(value) else np.int64)
    ok = (req >= 0) & (req < n)
    req, value = req[ok], value[ok]
    first = np.unique(req, return_index=True)
    out[first[0]] = value[first[1]]
    return out


def request_replicas(trace) -> pd.DataFrame:
    """One row per request (trace order): `replica` (the router's choice: the whole request's, or
    the prefill replica; -1 rejected or unknown), `decode` (disaggregated: the decode replica, else
    -1), `stage` (whole, prefill, rejected), `routed_ms`, `reason`, `decode_reason`, `scores`,
    `signals`, `prompt_blocks`. From the route events; a trace without them (an imported one):
    the replica of each request's first token (or finish), stage whole, no reasons."""
    n = len(trace.requests)
    routes = trace.events_of("route")
    if routes:
        row_of = {rid: k for k, rid in enumerate(trace.requests["id"].tolist())}
        cols = {"replica": np.full(n, -1, np.int64), "decode": np.full(n, -1, np.int64),
                "stage": np.full(n, "", object), "routed_ms": np.full(n, np.nan), "reason": np.full(n, "", object),
                "decode_reason": np.full(n, "", object), "scores": np.full(n, None, object),
                "signals": np.full(n, None, object), "prompt_blocks": np.zeros(n, np.int64)}
        for e in routes:
            k = row_of.get(e.get("req"))
            if k is None:
                continue
            cols["replica"][k] = int(e.get("replica", -1))
            cols["decode"][k] = int(e["decode"]) if e.get("decode") is not None else -1
            cols["stage"][k] = str(e.get("stage", "whole"))
            cols["routed_ms"][k] = float(e.get("t_ms", np.nan))
            cols["reason"][k] = str(e.get("reason", ""))
            cols["decode_reason"][k] = str(e.get("decode_reason", ""))
            cols["scores"][k] = e.get("scores")
            cols["signals"][k] = e.get("signals")
            cols["prompt_blocks"][k] = int(e.get("prompt_blocks", 0) or 0)
        return pd.DataFrame(cols)
    tk = trace.tokens if len(trace.tokens) else trace.finishes
    replica = (_first_by_request(n, tk["req"].to_numpy(), tk["replica"].to_numpy())
               if "replica" in tk and len(tk) else np.zeros(n, np.int64))
    return pd.DataFrame({"replica": replica, "decode": np.full(n, -1, np.int64),
                         "stage": np.where(replica >= 0, "whole", "rejected").astype(object),
                         "routed_ms": trace.requests["arrival_ms"].to_numpy(dtype=float),
                         "reason": np.full(n, "", object), "decode_reason": np.full(n, "", object),
                         "scores": np.full(n, None, object), "signals": np.full(n, None, object),
                         "prompt_blocks": np.zeros(n, np.int64)})


def requests_per_replica(trace, routes: pd.DataFrame | None = None) -> np.ndarray:
    """Requests each replica was given by the router: a whole request counts on its replica, a
    disaggregated one on its prefill and on its decode replica; rejected ones on none."""
    routes = request_replicas(trace) if routes is None else routes
    n = len(replica_roles(trace))
    r, d = routes["replica"].to_numpy(), routes["decode"].to_numpy()
    return (np.bincount(r[(r >= 0) & (r < n)], minlength=n) + np.bincount(d[(d >= 0) & (d < n)], minlength=n))[:n]


def fleet_numbers(trace, slo: SLO | None = None) -> dict:
    """The numbers the policy comparison shows for one fleet run: TTFT p50/p99 (ms; request_metrics,
    the project's percentile estimator); the prefix cache as core.analysis.fleet defines it (hit
    blocks on first admission, all hit blocks, the full prompt blocks routed, the hit rate);
    requests per replica and their imbalance; requests rejected at the router; with an SLO, its
    attainment and goodput (core.analysis.metrics.slo_summary)."""
    m = request_metrics(trace)
    ttft = distribution(m["ttft_ms"].to_numpy(dtype=float), "TTFT", (50, 99))
    routes = request_replicas(trace)
    counts = requests_per_replica(trace, routes)
    _, pc = prefix_cache(InMemory(trace, m), trace.meta, list(range(len(counts))))
    out = {"requests": len(m), "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
           "tpot_p99_ms": distribution(m["tpot_ms"].to_numpy(dtype=float), "TPOT", (99,))["p99"],
           "hit_blocks": pc["hit_blocks_first"], "hit_blocks_all": pc["hit_blocks_all"],
           "prompt_blocks": pc["prompt_blocks"], "hit_rate": pc["hit_rate"],
           "per_replica": counts.tolist(),
           "imbalance": imbalance([c for c, r in zip(counts.tolist(), replica_roles(trace)) if r in FIRST_ROUTE_ROLES]),
           "rejected": int((routes["stage"] == "rejected").sum())}
    if slo is not None and slo.given():
        s, _ = slo_summary(trace, slo, m)
        out |= {"attainment": s["attainment"], "goodput_req_per_s": s["goodput_req_per_s"]}
    return out


def drains_of(trace) -> list[tuple[int, float]]:
    """[(replica, ms)] of the replicas meta.fleet says were taken out of rotation."""
    reps = (trace.meta.get("fleet") or {}).get("replicas") or []
    return [(int(r.get("replica", k)), float(r["drain_ms"])) for k, r in enumerate(reps)
            if isinstance(r, dict) and isinstance(r.get("drain_ms"), (int, float))]


def fleet_description(trace) -> str:
    """The fleet a trace ran on, in words, from meta.fleet (replicas and roles, router, link); a
    trace without it: how many replicas its replica columns name."""
    roles = replica_roles(trace)
    f = trace.meta.get("fleet")
    count = {r: roles.count(r) for r in dict.fromkeys(roles)}
    shape = (f"{len(roles)} replica{'s' if len(roles) != 1 else ''}" if set(count) <= {"both"} else
             " + ".join(f"{k} {r}" for r, k in count.items()) + " replicas")
    if not isinstance(f, dict):
        return shape + " (from the trace's replica columns; no router events)"
    rc = f.get("router") if isinstance(f.get("router"), dict) else None
    out = [shape, f"router {rc.get('policy', '?')}, staleness {rc.get('staleness_ms', 0):g} ms" if rc
           else _unrecorded_router(f)]
    link = f.get("link")
    if isinstance(link, dict):
        model = f" ({link['model']})" if link.get("model") else ""
        if isinstance(link.get("gbps"), (int, float)):
            out.append(f"KV link {link['gbps']:g} GB/s, {link.get('latency_ms', '?')} ms latency{model}")
        else:    # a real fleet's link: what it was, measured per transfer
            out.append(f"KV {link.get('kind') or 'link'}{model}")
    out += [f"replica {r} drained at {t:g} ms" for r, t in drains_of(trace)]
    return "; ".join(out)


def _unrecorded_router(f: dict) -> str:
    """What is known of another router's decisions: not its scores and reasons, but (a fleet merged
    from its replicas' own files) which replica served each request."""
    client = f.get("client") if isinstance(f.get("client"), dict) else {}
    if client.get("by_id"):
        return (f"another router (its scores and reasons not recorded); each request's replica from the replicas' "
                f"own files, {client['by_id']:,} joined to the client's requests by the X-Request-Id each carried")
    if f.get("alignment"):
        return ("another router (its scores and reasons not recorded); each request's replica from the replicas' "
                "own files")
    return "router not recorded (another router's decisions)"


def routes_after(trace, replica: int, t_ms: float) -> int:
    """Requests the router sent to `replica` (whole, prefill or decode) after `t_ms`."""
    routes = request_replicas(trace)
    to = (routes["replica"] == replica) | (routes["decode"] == replica)
    return int((to & (routes["routed_ms"] > t_ms)).sum())


def transfer_table(trace) -> pd.DataFrame:
    """The KV transfers (disaggregated serving): req (row), src, dst, start_ms, dur_ms, bytes, blocks."""
    ev = trace.events_of("transfer")
    row_of = {rid: k for k, rid in enumerate(trace.requests["id"].tolist())}
    rows = [{"req": row_of.get(e.get("req"), -1), "src": int(e.get("src", -1)), "dst": int(e.get("dst", -1)),
             "start_ms": float(e.get("t_ms", np.nan)), "dur_ms": float(e["dur_ms"]) if e.get("dur_ms") is not None
             else np.nan, "bytes": int(e.get("bytes", 0) or 0), "blocks": int(e.get("blocks", 0) or 0)} for e in ev]
    return pd.DataFrame(rows, columns=["req", "src", "dst", "start_ms", "dur_ms", "bytes", "blocks"])
