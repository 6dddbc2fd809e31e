"""The fleet questions answered by simulation (core.fleet), not by wall-clock timing: every number
printed is `simulated`, under the affine step model and engine stated in the output. Deterministic
(router seed 0; the workloads' own arrival times, divided by a compression factor).

    python -m bench.fleet_routing [--quick]

(a) every routing policy side by side at 4 replicas with prefix caching, on shared_prefix_200 and
    the Mooncake conversation slice (hash blocks of 16 tokens), at two loads and two KV pools
    per replica (a tight one where preemption happens, a roomy one);
(b) the staleness curve: round-robin, least-requests, prefix-aware (its default approximate
    prefix knowledge, and precise), weighted, at staleness 0 ... 500 ms, on each workload at the
    load and pool of (a) where prefix-aware's mean TTFT is lowest relative to round-robin's;
(c) prefill:decode splits of 4 replicas (1:3, 2:2, 3:1, and 4 whole replicas) on shared_prefix_200,
    Llama-2-7B's KV bytes per token, over a 25 GB/s, a 5 GB/s and a 1 GB/s link (0.05 ms latency).

Tables are printed as Markdown (docs/fleet.md pastes them). `--quick`: a small subset (a smoke test).

Metrics, per run (the trace's own tables; TTFT, TPOT, E2E and goodput by core.analysis.metrics):
- hit blocks (all): kv rows with op "hit" (= the replicas' prefix_hit_blocks); they include the
  blocks a request hits again when it is re-admitted after a preemption;
- hit blocks (1st admission): the kv "hit" rows of a request before its first preemption (all of
  them for a request never preempted): what routing bought, without re-admissions;
- hit rate: hit blocks (1st admission) / the full prompt blocks routed (sum of prompt // 16 over
  the requests the router placed): core.analysis.fleet's prefix_cache, as the Fleet page and
  `python -m core metrics` give it;
- imbalance: core.analysis.definitions.imbalance (max / mean of the requests routed to each replica).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from datetime import date

import numpy as np

from core.analysis.fleet import prefix_cache
from core.analysis.metrics import SLO, InMemory, distribution, request_metrics, slo_summary
from core.analysis.routing import fleet_numbers
from core.config import SchedulerConfig
from core.errors import InputError
from core.fleet.link import Link
from core.fleet.router import POLICIES, RouterConfig
from core.fleet.sim import FleetSpec, simulate_fleet
from core.formulas.kv import MODELS
from core.sim.stepmodel import StepModel
from core.workload import Workload, load_workload

REPLICAS = 4
BLOCK = 16
STEP_MODEL = StepModel(kind="affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
ENGINE = {"max_seqs": 32, "token_budget": 2048, "chunk": 512}     # continuous batching, chunked prefill
SHARED = "data/workloads/shared_prefix_200.json"
MOONCAKE = "data/workloads/mooncake_conversation_500.jsonl"
# workload -> (loads as arrival compression factors, KV pools per replica in blocks: tight, roomy).
# Mooncake's tight pool is 300, not 100: its longest request needs 241 blocks (prompt + output).
GRID = {"shared_prefix_200": ((1, 4), (100, 2000)), "mooncake": ((10, 30), (300, 2000))}
STALENESS_MS = (0, 5, 10, 20, 50, 100, 200, 500)
# (b)'s policies: (label, policy, prefix knowledge (None: the policy's default))
CURVE = (("round-robin", "round-robin", None), ("least-requests", "least-requests", None),
         ("prefix-aware", "prefix-aware", None), ("prefix-aware precise", "prefix-aware", "precise"),
         ("weighted", "weighted", None))
PD_MODEL = "Llama-2-7B"
PD_LOAD = 4                      # shared_prefix_200 at 4x its arrival rate
PD_POOL = 2000                   # roomy: no preemption, so the split and the link are what differ
PD_ROUTER = "least-requests"
PD_SLO = SLO(ttft_ms=200.0, tpot_ms=15.0)
PD_SPLITS = ((1, 3), (2, 2), (3, 1))
LINKS = ((25.0, 0.05), (5.0, 0.05), (1.0, 0.05))     # (GB/s, latency ms)


def workloads() -> dict[str, Workload]:
    return {"shared_prefix_200": load_workload(SHARED),
            "mooncake": load_workload(MOONCAKE, block_tokens=BLOCK)}


def compressed(w: Workload, factor: float) -> Workload:
    """The workload with every arrival time divided by `factor` (factor x the offered load)."""
    if factor == 1:
        return w
    return Workload([dataclasses.replace(r, arrival_ms=r.arrival_ms / factor) for r in w.requests],
                    f"{w.name} x{factor:g}")


def engine(pool_blocks: int) -> SchedulerConfig:
    return SchedulerConfig(prefix_caching=True, kv_blocks=pool_blocks, block_size=BLOCK, **ENGINE)


def setup_lines() -> list[str]:
    eng = ", ".join(f"{k} {v}" for k, v in ENGINE.items())
    return [f"All numbers simulated (core.fleet), step model {STEP_MODEL.describe()}.",
            f"Each replica: continuous batching, {eng}, block {BLOCK} tokens, prefix caching on; router seed 0."]


# ---- per-run numbers -------------------------------------------------------------------------------
def hit_blocks(tr) -> tuple[int, int, int]:
    """(all hit blocks, hit blocks on first admission, full prompt blocks routed): core.analysis.fleet's
    prefix cache, the definition the Fleet page and `metrics` use."""
    n = len(tr.meta["fleet"]["replicas"])
    _, pc = prefix_cache(InMemory(tr), tr.meta, list(range(n)))
    stats = sum(r["stats"]["prefix_hit_blocks"] for r in tr.meta["fleet"]["replicas"])
    if pc["hit_blocks_all"] != stats:   # two counts of one thing: the trace's rows and the replicas' counters
        raise RuntimeError(f"kv hit rows {pc['hit_blocks_all']} != replicas' prefix_hit_blocks {stats}")
    return pc["hit_blocks_all"], pc["hit_blocks_first"], pc["prompt_blocks"]


def run_numbers(w: Workload, tr) -> dict:
    m = request_metrics(tr)
    ttft = distribution(m["ttft_ms"], "TTFT", (50, 99))
    n_all, n_first, full = hit_blocks(tr)
    return {"hits": n_all, "hits_first": n_first, "hit_rate": n_first / full if full else float("nan"),
            "preemptions": len(tr.preempts), "ttft_mean": ttft["mean"], "ttft_p50": ttft["p50"],
            "ttft_p99": ttft["p99"], "e2e_mean": distribution(m["e2e_ms"], "E2E")["mean"],
            "imbalance": fleet_numbers(tr)["imbalance"]}


def simulate(w: Workload, pool: int, policy: str, staleness_ms: float = 0, prefix: str | None = None):
    rc = RouterConfig(policy, staleness_ms=staleness_ms, seed=0, prefix=prefix)
    return simulate_fleet(w, FleetSpec.uniform(REPLICAS, engine(pool), STEP_MODEL, router=rc))


# ---- (a) policies side by side -------------------------------------------------------------------
def policies_rows(ws: dict[str, Workload], grid: dict, policies=POLICIES) -> list[dict]:
    rows = []
    for name, (loads, pools) in grid.items():
        for load in loads:
            w = compressed(ws[name], load)
            for pool in pools:
                for p in policies:
                    rows.append({"workload": name, "load": load, "pool": pool, "policy": p,
                                 **run_numbers(w, simulate(w, pool, p))})
    return rows


def policies_table(rows: list[dict]) -> str:
    head = ["workload", "load", "KV pool", "policy", "hit blocks (all)", "hit blocks (1st adm.)", "hit rate",
            "preempt", "TTFT mean", "TTFT p50", "TTFT p99", "E2E mean", "imbalance"]
    body = [[r["workload"], f"{r['load']:g}x", r["pool"], r["policy"], r["hits"], r["hits_first"],
             f"{r['hit_rate']:.3f}", r["preemptions"], ms(r["ttft_mean"]), ms(r["ttft_p50"]), ms(r["ttft_p99"]),
             ms(r["e2e_mean"]), f"{r['imbalance']:.2f}"] for r in rows]
    return markdown(head, body)


def best_cell(rows: list[dict], workload: str) -> tuple[float, int, float]:
    """(load, pool, ratio) of (a)'s cell where prefix-aware's mean TTFT / round-robin's is lowest."""
    by = {(r["load"], r["pool"], r["policy"]): r["ttft_mean"] for r in rows if r["workload"] == workload}
    cells = sorted({(load, pool) for load, pool, _ in by})
    ratios = [(by[(load, pool, "prefix-aware")] / by[(load, pool, "round-robin")], load, pool)
              for load, pool in cells]
    ratio, load, pool = min(ratios)
    return load, pool, ratio


# ---- (b) staleness ------------------------------------------------------------------------------
def staleness_rows(w: Workload, pool: int, staleness=STALENESS_MS, curve=CURVE) -> list[dict]:
    rows = []
    for st in staleness:
        row = {"staleness_ms": st}
        for label, policy, prefix in curve:
            row[label] = run_numbers(w, simulate(w, pool, policy, st, prefix))
        rows.append(row)
    return rows


def staleness_table(rows: list[dict], curve=CURVE) -> str:
    labels = [c[0] for c in curve]
    head = ["staleness ms"] + labels + ["RR - PA: TTFT mean", "RR - PA: TTFT p99"]
    body = []
    for r in rows:
        cells = [f"{ms(r[k]['ttft_mean'])} / {ms(r[k]['ttft_p99'])} / {r[k]['hits_first']}" for k in labels]
        rr, pa = r["round-robin"], r["prefix-aware"]
        body.append([r["staleness_ms"], *cells, signed(rr["ttft_mean"] - pa["ttft_mean"]),
                     signed(rr["ttft_p99"] - pa["ttft_p99"])])
    return markdown(head, body)


# ---- (c) prefill:decode splits ------------------------------------------------------------------
def pd_rows(w: Workload, splits=PD_SPLITS, links=LINKS, pool: int = PD_POOL, slo: SLO = PD_SLO,
            whole: bool = True) -> list[dict]:
    kv_bytes = MODELS[PD_MODEL].kv_bytes_per_token(2.0)
    cfg, rc = engine(pool), RouterConfig(PD_ROUTER, seed=0)
    runs = []
    if whole:
        runs.append(("4 whole", None, simulate_fleet(w, FleetSpec.uniform(REPLICAS, cfg, STEP_MODEL, router=rc))))
    for gbps, lat in links:
        for p, d in splits:
            f = FleetSpec.disagg(p, d, cfg, STEP_MODEL, router=rc, kv_bytes_per_token=kv_bytes, model=PD_MODEL,
                                 link_gbps=gbps, link_latency_ms=lat)
            runs.append((f"{p}P:{d}D", (gbps, lat), simulate_fleet(w, f)))
    return [pd_numbers(split, link, tr, slo) for split, link, tr in runs]


def pd_numbers(split: str, link, tr, slo: SLO) -> dict:
    m = request_metrics(tr)
    s, _ = slo_summary(tr, slo, m)
    ttft = distribution(m["ttft_ms"], "TTFT", (50, 99))
    xs = tr.events_of("transfer")
    dur = distribution([x["dur_ms"] for x in xs], "transfer", (99,))
    nbytes = np.asarray([x["bytes"] for x in xs], dtype=float)
    out = {"split": split, "link": link, "goodput": s["goodput_req_per_s"], "met": s["met"],
           "requests": s["requests"], "ttft_p50": ttft["p50"], "ttft_p99": ttft["p99"],
           "tpot_p50": distribution(m["tpot_ms"], "TPOT", (50,))["p50"], "transfers": len(xs),
           "dur_mean": dur["mean"], "dur_p99": dur["p99"], "bytes_mean": float(nbytes.mean()) if len(xs) else None}
    if link is not None:
        lk = Link(*link)
        out["per_kb_ms"] = lk.duration_alone_ms(1024)
        out["alone_mean_ms"] = lk.duration_alone_ms(out["bytes_mean"]) if len(xs) else None
    return out


def pd_table(rows: list[dict]) -> str:
    head = ["link", "split", "goodput req/s", "met", "TTFT p50", "TTFT p99", "TPOT p50", "transfers",
            "dur mean", "dur p99", "MB / transfer", "mean transfer alone", "1 KB alone"]
    body = []
    for r in rows:
        link = "-" if r["link"] is None else f"{r['link'][0]:g} GB/s, {r['link'][1]:g} ms"
        mb = "-" if r["bytes_mean"] is None else f"{r['bytes_mean'] / 1e6:.1f}"
        body.append([link, r["split"], f"{r['goodput']:.1f}", f"{r['met']}/{r['requests']}", ms(r["ttft_p50"]),
                     ms(r["ttft_p99"]), ms(r["tpot_p50"], 2), r["transfers"], ms(r["dur_mean"]), ms(r["dur_p99"]),
                     mb, ms(r.get("alone_mean_ms")), ms(r.get("per_kb_ms"), 6)])
    return markdown(head, body)


# ---- printing -----------------------------------------------------------------------------------
def ms(v, digits: int = 1) -> str:
    return "-" if v is None or v != v else f"{v:,.{digits}f}"


def signed(v: float) -> str:
    return f"{v:+,.1f}"


def markdown(head: list, body: list[list]) -> str:
    lines = ["| " + " | ".join(str(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small subset (a smoke test)")
    a = ap.parse_args(argv)
    try:
        ws = workloads()
    except InputError as e:
        print(f"fleet_routing: {e}", file=sys.stderr)
        return 2
    grid = {"shared_prefix_200": ((1,), (100,))} if a.quick else GRID
    policies = ("round-robin", "prefix-aware") if a.quick else POLICIES
    print(f"# bench.fleet_routing{' --quick' if a.quick else ''} ({date.today().isoformat()})\n")
    print("\n".join(setup_lines()))
    print(f"\n## (a) routing policies, {REPLICAS} replicas, prefix caching on\n")
    print("Load: arrival times divided by the factor. KV pool: blocks per replica. Hit rate: hit blocks on "
          "first admission / prompt full blocks. TTFT, E2E in ms.\n")
    rows = policies_rows(ws, grid, policies)
    print(policies_table(rows))
    print("\n## (b) staleness: TTFT mean / TTFT p99 (ms) / hit blocks on first admission\n")
    for name in grid:
        load, pool, ratio = best_cell(rows, name)
        print(f"{name} at {load:g}x, KV pool {pool} (the cell of (a) where prefix-aware's mean TTFT / round-robin's "
              f"is lowest: {ratio:.2f}). RR - PA: round-robin's minus prefix-aware's (approximate); > 0: "
              "prefix-aware ahead.\n")
        st = (0, 50) if a.quick else STALENESS_MS
        print(staleness_table(staleness_rows(compressed(ws[name], load), pool, st)) + "\n")
    print(f"## (c) prefill:decode splits of {REPLICAS} replicas, shared_prefix_200 at {PD_LOAD}x\n")
    kvb = MODELS[PD_MODEL].kv_bytes_per_token(2.0)
    print(f"KV pool {PD_POOL} blocks per replica, router {PD_ROUTER}, every prompt disaggregated (pd_min_prompt 0); "
          f"{PD_MODEL}: {kvb:,} KV bytes per token (fp16), {kvb * BLOCK / 1e6:.2f} MB per block. "
          f"Goodput: requests/s meeting TTFT <= {PD_SLO.ttft_ms:g} ms and TPOT <= {PD_SLO.tpot_ms:g} ms over the "
          "drain window. Transfer times in ms; 'alone' = latency + bytes / bandwidth (no sharing).\n")
    splits, links = (((1, 3),), LINKS[:1]) if a.quick else (PD_SPLITS, LINKS)
    print(pd_table(pd_rows(compressed(ws["shared_prefix_200"], PD_LOAD), splits, links)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
