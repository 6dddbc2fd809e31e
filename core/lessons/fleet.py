"""The routing lesson: why prefix-aware routing wins on shared prefixes, and loses when its
signals are stale or its load check is off. Four scenarios, each a few small fleet simulations
(core.fleet) with the affine step model below; every number in the text is filled in from them.

1. shared prefixes win: the Mooncake conversation slice (real prefix reuse between turns),
   arrivals compressed 10x, on 4 replicas with prefix caching: prefix-aware routing sends a
   conversation back to the replica that holds its history; round-robin and least-requests
   scatter it. Prefix-hit blocks, prefill tokens computed and TTFT side by side.
2. few prefixes: shared_prefix_200 holds only two system prompts. Round-robin warms every
   replica's cache after a handful of misses, so prefix-aware has little left to win; with its
   load check removed (balance_abs very large) it sends each tenant to one replica (skew) and
   two replicas sit idle.
3. stale signals: the router reads loads (and, precise, cache contents) as of 50-200 ms ago.
   Load-aware policies herd: while the signals stand still, every request goes to the replica
   that looked emptiest. Measured as the excess load at the chosen replica (`excess_load`).
4. drain before shutdown: a replica taken out of rotation receives nothing new, finishes what
   it holds, and nothing is lost.

`lesson_sections()` returns the four as dicts a page renders (text, table rows, the runs'
traces); the exercises (core.lessons.exercises) reuse the runs here.
"""
from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np

from core.analysis.metrics import summarize
from core.config import SchedulerConfig
from core.fleet.router import DEFAULT_PARAMS, NO_LOAD_CHECK, RouterConfig
from core.fleet.sim import FleetSpec, ReplicaSpec, simulate_fleet
from core.formulas.kv import MODELS
from core.lessons.scenarios import DATA
from core.sim.stepmodel import StepModel
from core.workload import Workload, load_workload

STEP_MODEL = StepModel(kind="affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
REPLICAS = 4
KV_BLOCKS = 2000                     # per replica
BLOCK_TOKENS = 16                    # the Mooncake slice read at 16 tokens per 512-token hash block
COMPRESS = 10                        # the Mooncake slice's arrivals, 10x closer together
MOONCAKE = DATA / "workloads" / "mooncake_conversation_500.jsonl"
SHARED = DATA / "workloads" / "shared_prefix_200.json"
STALENESS_MS = (0, 50, 100, 200)
NO_BALANCE = {"balance_abs": NO_LOAD_CHECK}   # prefix-aware with its load check off (the Fleet page's toggle)
DRAINED = 3                          # scenario 4: this replica drains ...
DRAIN_AT = 100                       # ... when this request (0-based, arrival order) arrives
PD_SHAPE = (1, 3)                    # the exercise's disaggregated fleet: P:D
PD_MIN_PROMPT = 300
PD_MODEL = "Llama-2-7B"


def config() -> SchedulerConfig:
    return SchedulerConfig(prefix_caching=True, kv_blocks=KV_BLOCKS)


def origin() -> str:
    return f"simulated (core.fleet; step model {STEP_MODEL.describe()})"


# ---- workloads and runs ------------------------------------------------------------------------
@cache
def mooncake() -> Workload:
    """The Mooncake conversation slice at 16 tokens a hash block, arrivals x 1/COMPRESS."""
    w = load_workload(MOONCAKE, block_tokens=BLOCK_TOKENS)
    reqs = [dataclasses.replace(r, arrival_ms=r.arrival_ms / COMPRESS) for r in w.requests]
    return Workload(reqs, name=f"{w.name}, arrivals {COMPRESS}x closer")


@cache
def shared() -> Workload:
    return load_workload(SHARED)


WORKLOADS = {"mooncake": mooncake, "shared": shared}


@cache
def run(workload: str, policy: str, staleness_ms: float = 0.0, no_balance: bool = False,
        drained: int | None = None, drain_at: int = DRAIN_AT):
    """The trace of WORKLOADS[workload] on REPLICAS uniform replicas (one of them drained at
    request `drain_at`'s arrival when `drained` is set)."""
    w = WORKLOADS[workload]()
    router = RouterConfig(policy, staleness_ms=staleness_ms, params=dict(NO_BALANCE) if no_balance else {})
    reps = [ReplicaSpec(config(), STEP_MODEL) for _ in range(REPLICAS)]
    if drained is not None:
        reps[drained] = ReplicaSpec(config(), STEP_MODEL, drain_ms=float(w.arrival_ms[drain_at]))
    return simulate_fleet(w, FleetSpec(reps, router=router), label=_label(policy, staleness_ms, no_balance))


@cache
def pd_run(workload: str = "shared", prefill: int = PD_SHAPE[0], decode: int = PD_SHAPE[1],
           pd_min_prompt: int = PD_MIN_PROMPT):
    """Disaggregated prefill/decode (least-requests, PD_MODEL's KV bytes per token, a 25 GB/s link)."""
    w = WORKLOADS[workload]()
    spec = FleetSpec.disagg(prefill, decode, config(), STEP_MODEL, router=RouterConfig("least-requests"),
                            kv_bytes_per_token=MODELS[PD_MODEL].kv_bytes_per_token(), model=PD_MODEL,
                            pd_min_prompt=pd_min_prompt)
    return simulate_fleet(w, spec, label=f"{prefill}P:{decode}D, prompts of {pd_min_prompt}+ tokens split")


def _label(policy: str, staleness_ms: float, no_balance: bool) -> str:
    return (policy + (" without its load check" if no_balance else "")
            + (f", signals {staleness_ms:g} ms old" if staleness_ms else ""))


# ---- what each run shows -----------------------------------------------------------------------
# The table columns, each defined once (a page shows these as the columns' help)
DEFINITIONS = {
    "prefix-hit blocks": "prompt blocks (16 tokens) found in the replica's prefix cache, summed over the fleet",
    "hit blocks per replica": "the same, replica by replica",
    "requests with no hit": "requests that found none of their prompt cached",
    "prefill tokens computed": "prompt tokens the replicas computed (recomputation after preemption included)",
    "requests per replica": "requests each replica finished",
    "TTFT mean ms": "time to first token (first token - arrival), mean over requests",
    "TTFT median ms": "the same, median", "TTFT p99 ms": "the same, 99th percentile",
    "E2E p99 ms": "last token - arrival, 99th percentile",
    "excess mean": "per routing decision: requests the chosen replica held minus the fewest any replica held "
                   "(by the trace's times, not the router's view), mean over decisions",
    "excess max": "the same, largest",
    "longest run to one replica": "most consecutive routing decisions to the same replica",
    # a drained replica (drain_numbers)
    "drain ms": "when the replica left the rotation", "routed": "requests routed to it in all",
    "last route ms": "when the last of them was routed", "routed after the drain": "requests routed to it after",
    "held at the drain": "requests routed to it and not finished at the drain", "finished": "requests it finished",
    "last finish ms": "when it finished its last request: from then it may stop",
    "requests": "requests in the workload", "finished in the fleet": "requests that ran to their end, on any replica",
    "rejected": "requests rejected at the router",
}
BALANCE_ABS = DEFAULT_PARAMS["prefix-aware"]["balance_abs"]
OVER = f"sent over {BALANCE_ABS:g} above the least loaded"
DEFINITIONS[OVER] = (f"routing decisions whose replica held more than {BALANCE_ABS:g} requests above the least "
                     "loaded (what prefix-aware's load check exists to prevent)")
def hit_blocks(tr) -> list[int]:
    """Prefix-hit blocks per replica (blocks of a prompt found in that replica's prefix cache)."""
    return [int(r["stats"]["prefix_hit_blocks"]) for r in tr.meta["fleet"]["replicas"]]


def numbers(tr) -> dict:
    """One run's row: prefix hits, prefill computed, requests per replica, latency."""
    s = summarize(tr, per_request=False)["summary"]
    b = tr.batch
    hits = hit_blocks(tr)
    hit_reqs = set(tr.kv.loc[tr.kv["op"] == "hit", "req"].tolist()) if len(tr.kv) else set()
    per_rep = np.bincount(tr.finishes["replica"].to_numpy()[tr.finishes["replica"].to_numpy() >= 0],
                          minlength=len(hits))
    # (the latencies the lesson's texts cite first: a narrow screen shows them without scrolling)
    return {"run": tr.meta.get("label"), "TTFT mean ms": s["ttft_ms"]["mean"], "TTFT median ms": s["ttft_ms"]["median"],
            "TTFT p99 ms": s["ttft_ms"]["p99"], "E2E p99 ms": s["e2e_ms"]["p99"],
            "prefix-hit blocks": sum(hits), "hit blocks per replica": hits,
            "requests with no hit": len(tr.requests) - len(hit_reqs),
            "prefill tokens computed": int(b.loc[b["kind"] == "prefill", "tokens"].sum()),
            "requests per replica": per_rep.tolist()}


def excess_load(route_t, route_replica, finish_t, finish_replica, replicas: int) -> np.ndarray:
    """Per routing decision (in order): the requests the chosen replica held at that moment minus
    the fewest any replica held (0: it went to a least loaded one). Held = routed there minus
    finished there by then, the truth the router's signals lag behind. Rejected routes (replica
    -1) count 0 and change nothing."""
    route_t, route_replica = np.asarray(route_t, float), np.asarray(route_replica, int)
    order = np.argsort(np.asarray(finish_t, float), kind="stable")
    ft, fr = np.asarray(finish_t, float)[order], np.asarray(finish_replica, int)[order]
    held = np.zeros(replicas, dtype=np.int64)
    out = np.zeros(len(route_t), dtype=np.int64)
    j = 0
    for k, (t, r) in enumerate(zip(route_t.tolist(), route_replica.tolist())):
        while j < len(ft) and ft[j] <= t:
            if fr[j] >= 0:
                held[fr[j]] -= 1
            j += 1
        if r >= 0:
            out[k] = held[r] - held.min()
            held[r] += 1
    return out


def longest_run(replicas) -> int:
    """The most consecutive routing decisions that went to the same replica."""
    r = np.asarray(replicas)
    if not len(r):
        return 0
    cuts = np.flatnonzero(np.diff(r) != 0)
    edges = np.concatenate([[-1], cuts, [len(r) - 1]])
    return int(np.diff(edges).max())


def herding(tr) -> dict:
    """How far routing strayed from the least loaded replica (excess_load) over a run."""
    routes = tr.events_of("route")
    n = len(tr.meta["fleet"]["replicas"])
    ex = excess_load([e["t_ms"] for e in routes], [e["replica"] for e in routes], tr.finishes["t_ms"].to_numpy(),
                     tr.finishes["replica"].to_numpy(), n)
    return {"excess mean": float(ex.mean()) if len(ex) else 0.0, "excess max": int(ex.max()) if len(ex) else 0,
            OVER: int((ex > BALANCE_ABS).sum()),
            "longest run to one replica": longest_run([e["replica"] for e in routes])}


def drain_numbers(tr, replica: int) -> dict:
    """What a drained replica did: its drain time, its last route, what it held at the drain,
    when it finished the last of them, and what the fleet lost."""
    drain = tr.meta["fleet"]["replicas"][replica]["drain_ms"]
    routes = [e for e in tr.events_of("route") if e["replica"] == replica]
    fin = tr.finishes[tr.finishes["replica"] == replica]
    fin_t = fin["t_ms"].to_numpy()
    return {"drain ms": drain, "routed": len(routes), "last route ms": max(e["t_ms"] for e in routes),
            "routed after the drain": sum(e["t_ms"] >= drain for e in routes),
            "held at the drain": len(routes) - int((fin_t <= drain).sum()),
            "finished": len(fin), "last finish ms": float(fin_t.max()),
            "requests": len(tr.requests), "finished in the fleet": int(tr.finishes["reason"].isin(
                ("length", "stop", "eos")).sum()), "rejected": int((tr.finishes["replica"] == -1).sum())}


# ---- words from numbers ------------------------------------------------------------------------
def _change(a: float, b: float, unit: str = " ms") -> str:
    """'from 59.5 to 57.3 ms (4% lower)' — the direction read from the numbers."""
    if a == b:
        return f"unchanged at {a:,.1f}{unit}"
    pct = abs(b - a) / a * 100 if a else float("inf")
    return f"from {a:,.1f} to {b:,.1f}{unit} ({pct:.0f}% {'lower' if b < a else 'higher'})"


def _times(a: float, b: float) -> str:
    return f"{b / a:.1f}x" if a else "infinitely many times"


def _per_replica(xs) -> str:
    return ", ".join(f"{x:,}" for x in xs)


def _more(a: float, b: float) -> str:
    """'(1% more)' / '(3% fewer)' / '(as many)': b against a."""
    if a == b:
        return "(as many)"
    return f"({abs(b - a) / a * 100:.0f}% {'more' if b > a else 'fewer'})" if a else "(from none)"


def _none(n: int) -> str:
    return "none" if n == 0 else f"{n:,}"


def _excess(n: int) -> str:
    return ("it always went to a least loaded replica" if n == 0 else
            f"the replica chosen held at most {n} request{'s' * (n != 1)} more than the least loaded")


# ---- the four sections -------------------------------------------------------------------------
def section_wins() -> dict:
    runs = {p: run("mooncake", p) for p in ("round-robin", "least-requests", "prefix-aware")}
    rows = {p: numbers(tr) for p, tr in runs.items()}
    rr, lr, pa = rows["round-robin"], rows["least-requests"], rows["prefix-aware"]
    w = mooncake()
    saved = rr["prefill tokens computed"] - pa["prefill tokens computed"]
    text = (
        f"**{len(w)} requests of a real conversation trace** (Mooncake; a conversation's next turn repeats its "
        f"history as the prompt's prefix), arrivals {COMPRESS}x closer, on {REPLICAS} replicas with prefix caching. "
        f"A prompt finds its prefix cached only on a replica that served the same prefix before. Round-robin and "
        f"least-requests ignore that: they found {rr['prefix-hit blocks']:,} and {lr['prefix-hit blocks']:,} "
        f"prompt blocks in a cache. Prefix-aware routing sends a prompt to the replica that already holds most of "
        f"it and found {pa['prefix-hit blocks']:,}, {_times(rr['prefix-hit blocks'], pa['prefix-hit blocks'])} "
        f"round-robin's. Every block found is {BLOCK_TOKENS} prompt tokens not computed again: "
        f"{abs(saved):,} {'fewer' if saved >= 0 else 'more'} prefill tokens computed in all. TTFT mean went "
        f"{_change(rr['TTFT mean ms'], pa['TTFT mean ms'])}, median "
        f"{_change(rr['TTFT median ms'], pa['TTFT median ms'])}, p99 "
        f"{_change(rr['TTFT p99 ms'], pa['TTFT p99 ms'])}. Prefix caching saves prefill only: the tokens each "
        f"request generates cost the same wherever it runs.")
    return {"key": "wins", "title": "Shared prefixes: prefix-aware routing wins",
            "question": "Where a conversation's history is cached, should its next turn go there?",
            "text": text, "rows": list(rows.values()), "origin": origin(), "workload": w.name,
            "setup": f"{REPLICAS} replicas x {KV_BLOCKS:,} KV blocks of 16 tokens, prefix caching",
            "traces": {tr.meta["label"]: tr for tr in runs.values()},
            "numbers": {"hits": {p: r["prefix-hit blocks"] for p, r in rows.items()}, "prefill_saved": saved}}


def section_skew() -> dict:
    runs = {"round-robin": run("shared", "round-robin"), "prefix-aware": run("shared", "prefix-aware"),
            "no load check": run("shared", "prefix-aware", no_balance=True)}
    rows = {k: numbers(tr) for k, tr in runs.items()}
    rr, pa, sk = rows["round-robin"], rows["prefix-aware"], rows["no load check"]
    w = shared()
    tenants = sorted({r.tenant for r in w.requests if r.tenant})
    idle = sum(x == 0 for x in sk["requests per replica"])
    cold = rr["requests with no hit"]
    first_only = cold == len(tenants) * REPLICAS
    text = (
        f"**{len(w)} requests sharing only {len(tenants)} system prompts** (tenants {', '.join(tenants)}). "
        f"Round-robin spreads each tenant over all {REPLICAS} replicas, and each replica's cache warms after a few "
        f"misses: {cold} of {len(w)} requests found nothing cached"
        + (" (the first of each tenant on each replica)" if first_only else "")
        + f". Round-robin reused {rr['prefix-hit blocks']:,} blocks, prefix-aware {pa['prefix-hit blocks']:,} "
        f"{_more(rr['prefix-hit blocks'], pa['prefix-hit blocks'])}. Remove prefix-aware's load check (balance_abs "
        f"{NO_BALANCE['balance_abs']:,.0f}) and it sends every request of a tenant to the one replica holding its "
        f"prompt (a tenant's blocks are never shared with the other: the cache key carries the tenant): requests per "
        f"replica {_per_replica(sk['requests per replica'])} ({_none(idle)} idle). It reused "
        f"{sk['prefix-hit blocks']:,} blocks {_more(rr['prefix-hit blocks'], sk['prefix-hit blocks'])}"
        f", but against round-robin TTFT mean went {_change(rr['TTFT mean ms'], sk['TTFT mean ms'])}, p99 "
        f"{_change(rr['TTFT p99 ms'], sk['TTFT p99 ms'])}, and E2E p99 {_change(rr['E2E p99 ms'], sk['E2E p99 ms'])}"
        f": the busy replicas run bigger batches, and every decoding sequence in a batch adds "
        f"{STEP_MODEL.decode_ms_per_seq:g} ms to the step (the step model). The load check (another replica when the "
        f"holder has more than {DEFAULT_PARAMS['prefix-aware']['balance_abs']:g} requests above the least loaded and "
        f"{DEFAULT_PARAMS['prefix-aware']['balance_rel']:g}x as many) keeps a popular prefix from becoming a hot spot.")
    return {"key": "skew", "title": "Few prefixes: little to win, and skew",
            "question": "When every replica's cache is warm anyway, what does prefix-aware routing cost?",
            "text": text, "rows": list(rows.values()), "origin": origin(), "workload": w.name,
            "setup": f"{REPLICAS} replicas x {KV_BLOCKS:,} KV blocks, prefix caching",
            "traces": {tr.meta["label"]: tr for tr in runs.values()},
            "numbers": {"cold": rr["requests with no hit"], "idle": idle,
                        "hits": {k: r["prefix-hit blocks"] for k, r in rows.items()}}}


def section_stale() -> dict:
    runs = {(p, s): run("mooncake", p, s) for p in ("least-requests", "prefix-aware") for s in STALENESS_MS}
    runs |= {("round-robin", s): run("mooncake", "round-robin", s) for s in (STALENESS_MS[0], STALENESS_MS[-1])}
    rows = {k: {"policy": k[0], "signals age ms": k[1], **numbers(tr), **herding(tr)} for k, tr in runs.items()}
    fresh, old = STALENESS_MS[0], STALENESS_MS[-1]
    lr0, lr1 = rows[("least-requests", fresh)], rows[("least-requests", old)]
    pa0, pa1 = rows[("prefix-aware", fresh)], rows[("prefix-aware", old)]
    rr0, rr1 = rows[("round-robin", fresh)], rows[("round-robin", old)]
    bound, over = BALANCE_ABS, OVER
    text = (
        f"**The router sees each replica as it was {STALENESS_MS[1]}-{old} ms ago** (the Mooncake slice above). "
        f"Least-requests sends each request to the replica that *looked* emptiest; while the signals stand still "
        f"that is the same replica every time. With fresh signals its longest run of consecutive requests to one "
        f"replica was {lr0['longest run to one replica']} and {_excess(lr0['excess max'])}; with {old} ms-old "
        f"signals the longest run was {lr1['longest run to one replica']} and {_excess(lr1['excess max'])}. "
        f"TTFT p99 went {_change(lr0['TTFT p99 ms'], lr1['TTFT p99 ms'])}. Prefix-aware's load check reads the same "
        f"old loads: the requests it sent to a replica holding more than {bound:g} above the least loaded (what the "
        f"check is there to prevent) went from {_none(pa0[over])} to {_none(pa1[over])}, and its TTFT p99 "
        f"{_change(pa0['TTFT p99 ms'], pa1['TTFT p99 ms'])}. Round-robin reads no signal: TTFT p99 "
        f"{rr0['TTFT p99 ms']:,.1f} ms at {fresh} ms and {rr1['TTFT p99 ms']:,.1f} ms at {old} ms.")
    return {"key": "stale", "title": "Stale signals: herding",
            "question": "What does a load-aware router do with loads that are 200 ms old?",
            "text": text, "rows": list(rows.values()), "origin": origin(), "workload": mooncake().name,
            "setup": f"{REPLICAS} replicas x {KV_BLOCKS:,} KV blocks, prefix caching; signals "
                     f"{', '.join(str(s) for s in STALENESS_MS)} ms old",
            "traces": {tr.meta["label"]: tr for tr in runs.values()},
            "numbers": {"lr_run": (lr0["longest run to one replica"], lr1["longest run to one replica"]),
                        "lr_p99": (lr0["TTFT p99 ms"], lr1["TTFT p99 ms"]), "pa_over": (pa0[over], pa1[over])}}


def section_drain() -> dict:
    tr = run("shared", "least-requests", drained=DRAINED)
    d = drain_numbers(tr, DRAINED)
    per = numbers(tr)["requests per replica"]
    lost = d["requests"] - d["finished in the fleet"]
    text = (
        f"**Drain a replica before shutting it down.** {REPLICAS} replicas behind a least-requests router; "
        f"replica {DRAINED} leaves the rotation at "
        f"{d['drain ms']:,.1f} ms (when request {shared().ids[DRAIN_AT]} arrives). Its last request was routed at "
        f"{d['last route ms']:,.1f} ms, {_none(d['routed after the drain'])} after the drain. It still held "
        f"{d['held at the drain']} unfinished requests then; it finished them, the last at "
        f"{d['last finish ms']:,.1f} ms ({d['last finish ms'] - d['drain ms']:,.1f} ms after the drain), and only then "
        f"may it stop. The other replicas took the rest (requests per replica {_per_replica(per)}): "
        f"{d['finished in the fleet']} of {d['requests']} requests completed, {_none(d['rejected'])} rejected, "
        f"{_none(lost)} lost. "
        f"Stopping it at the drain instead would have cut off {d['held at the drain']} requests mid-answer. "
        f"(Exercise \"Routing a fleet, 5\" asks the same of a round-robin router, which gives replica {DRAINED} "
        f"every {REPLICAS}th request until the drain, whatever the loads.)")
    return {"key": "drain", "title": "Draining a replica",
            "question": "How do you take a replica away without failing the requests it holds?",
            "text": text, "rows": [{"replica": DRAINED, **d}], "origin": origin(), "workload": shared().name,
            "setup": f"{REPLICAS} replicas, least-requests; replica {DRAINED} drained", "traces": {
                tr.meta["label"] + f", replica {DRAINED} drained": tr}, "numbers": d}


SECTIONS = (section_wins, section_skew, section_stale, section_drain)


def lesson_sections() -> list[dict]:
    """The lesson's four scenarios, each {key, title, question, text (markdown, every number computed),
    rows (one dict per run: the table; its columns defined in DEFINITIONS), origin, workload, setup,
    traces {label: Trace}, numbers}. The first call simulates (~4-9 s on one CPU); later ones reuse
    the cached runs."""
    return [f() for f in SECTIONS]
