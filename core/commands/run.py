"""python -m core simulate | sweep | search: a workload through the simulator (one engine or a fleet), at one load,
at several, or over a grid of configurations."""
from __future__ import annotations

import json
import math

from core.cli import check_writable, write_output
from core.cli import list_of as _list_of
from core.cli import nonneg_float as _nonneg_float
from core.cli import nonneg_int as _nonneg_int
from core.cli import positive_int as _positive_int
from core.commands.common import (
    fanout_flags,
    fmt_num,
    model_file_flag,
    rate_arg,
    save_trace,
    simulation_flags,
    slo_from_args,
    step_model_of,
    warn_outside,
)
from core.config import SchedulerConfig, add_flags, from_args
from core.errors import InputError
from core.fleet.options import add_fleet_flags, wants_fleet
from core.sim.stepmodel import StepModel

MAX_JSON_EVENTS = 5_000_000    # a JSON trace written in about 15 s; beyond it Parquet (streamed) is the way


def add_parsers(sub) -> None:
    """This group's subcommands."""
    s = sub.add_parser("simulate", help="run a workload through the core scheduler; write a trace")
    s.add_argument("workload", help="workload file: our JSON, Vidur CSV, LLMServingSim JSONL, or a trace")
    add_flags(s, SchedulerConfig)
    add_flags(s, StepModel)
    model_file_flag(s)
    add_fleet_flags(s)
    s.add_argument("--label", help="trace label (meta.label)")
    s.add_argument("--out", required=True,
                   help="trace to write: .json, .json.gz, .parquet (written while it is simulated), "
                        "or a name ending in / (a directory of Parquet parts)")

    w = sub.add_parser("sweep", help="simulate a workload at several offered loads; latency, throughput, SLOs")
    w.add_argument("workload", help="workload file (its requests' lengths and order are kept; arrivals are not)")
    load = w.add_mutually_exclusive_group(required=True)
    load.add_argument("--rates", type=_list_of(rate_arg, "requests per second in (0, 1e6]"), metavar="R1,R2,...",
                      help="open loop: Poisson arrivals at each rate (req/s)")
    load.add_argument("--concurrency", type=_list_of(_positive_int, "integers >= 1"), metavar="C1,C2,...",
                      help="closed loop: C clients, each sending its next request when its last one finishes")
    w.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of the Poisson arrivals and, with a fleet, of the router's random draws (default 0; "
                        "--repeats: each run's own seed for both)")
    w.add_argument("--repeats", type=_positive_int, default=1,
                   help="open loop: run each rate with seeds SEED..SEED+K-1; points report the first run and the "
                        "spread (min/mean/max); capacity needs the attainment in every run")
    simulation_flags(w, "SLO attainment the capacity point must reach (default 0.9)")
    add_fleet_flags(w, seed=False)
    fanout_flags(w, "points")

    q = sub.add_parser("search", help="capacity search: every scheduler configuration of a grid at one offered "
                                      "load; the cheapest that meets the SLOs (core/experiments/search.py)")
    q.add_argument("workload", help="workload file (its requests' lengths and order are kept; arrivals are not)")
    q.add_argument("--rate", type=rate_arg, required=True, help="offered load: Poisson arrivals at this rate (req/s)")
    q.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of the Poisson arrivals and, with a fleet, of the router's random draws (default 0)")
    q.add_argument("--grid", nargs="+", required=True, metavar="NAME=V1,V2",
                   help="options to search and their values, e.g. max_seqs=8,16,32 chunk=256,512 kv_blocks=2000,4000 "
                        "token_budget=2048,8192; the fleet: replicas=1,2,4 router=round-robin,prefix-aware "
                        "prefill_replicas=1,2 decode_replicas=2,4 (the other options: the flags below)")
    simulation_flags(q, "SLO attainment a configuration must reach (default 0.9)")
    q.add_argument("--usd-per-hour", type=_nonneg_float,
                   help="price of the machine (with a fleet: of one replica; N replicas cost N times it): cost per "
                        "1,000 good tokens")
    q.add_argument("--no-prune", action="store_true",
                   help="simulate every configuration in full (default: stop one whose first quarter already "
                        "misses the SLOs too often; disaggregated fleets are always simulated in full)")
    add_fleet_flags(q, seed=False)
    fanout_flags(q, "configurations")

def cmd_simulate(a) -> int:
    from core.sim.simulate import reuse_freed_memory, simulate
    from core.workload import load_workload
    check_writable(a.out, "--out")
    reuse_freed_memory()   # (one engine or a fleet, in memory or streamed: freed pages reused)
    w = load_workload(a.workload)
    cfg = from_args(SchedulerConfig, a)
    sm, fit_report = step_model_of(a)
    if wants_fleet(a):
        return _simulate_fleet(a, w, cfg, sm, fit_report)
    _fleet_flags_unused(a, False)
    if a.out.endswith(".parquet"):  # streamed: the trace is written while it is simulated
        from core.sim.simulate import simulate_to_parquet
        got = {}
        write_output(a.out, lambda p: got.update(zip(("meta", "counts"), simulate_to_parquet(
            w, cfg, str(p), sm, label=a.label))), "--out")
        st, n_tokens = got["meta"]["stats"], got["counts"].get("token", 0)
        if fit_report:
            from core.trace import load_trace
            warn_outside(load_trace(a.out), fit_report)
    else:
        tr = simulate(w, cfg, sm, label=a.label)
        events = len(tr.tokens) + len(tr.steps) + len(tr.batch) + len(tr.kv) + len(tr.finishes)
        if events > MAX_JSON_EVENTS:
            raise InputError(f"--out {a.out}: {events:,} events would take about {events / 300_000:,.0f} s to write as "
                             f"JSON (at most {MAX_JSON_EVENTS:,} here); write .parquet (streamed while simulated: "
                             "seconds) or a directory of Parquet parts (--out DIR/)")
        write_output(a.out, lambda p: save_trace(tr, p), "--out")
        st, n_tokens = tr.meta["stats"], len(tr.tokens)
        warn_outside(tr, fit_report)
    print(f"wrote {a.out}: {len(w)} requests, {n_tokens} tokens, {st['steps']} steps, "
          f"{st['preemptions']} preemptions; step model {sm.describe()}")
    return 0

def _simulate_fleet(a, w, cfg, sm, fit_report) -> int:
    from core.fleet.options import fleet_from_args, kv_bytes_per_token
    from core.fleet.sim import simulate_fleet
    bpt, model = kv_bytes_per_token(a)
    fleet = fleet_from_args(a, cfg, sm, bpt, model)
    tr = simulate_fleet(w, fleet, label=a.label)
    events = len(tr.tokens) + len(tr.steps) + len(tr.batch) + len(tr.kv) + len(tr.finishes)
    if events > MAX_JSON_EVENTS and not a.out.endswith((".parquet", "/")):
        raise InputError(f"--out {a.out}: {events:,} events would take about {events / 300_000:,.0f} s to write as "
                         f"JSON (at most {MAX_JSON_EVENTS:,} here); write .parquet or a directory of Parquet parts")
    write_output(a.out, lambda p: save_trace(tr, p), "--out")
    st = tr.meta["stats"]
    warn_outside(tr, fit_report)
    roles = [r["role"] for r in tr.meta["fleet"]["replicas"]]
    shape = (f"{roles.count('prefill')} prefill + {roles.count('decode')} decode replicas"
             if "prefill" in roles else f"{len(roles)} replicas")
    print(f"wrote {a.out}: {len(w)} requests, {len(tr.tokens)} tokens, {st['steps']} steps, "
          f"{st['preemptions']} preemptions; {shape}, router {fleet.router.policy}; step model {sm.describe()}")
    return 0

def _fleet_flags_unused(a, has_fleet: bool):
    """Without a fleet, the fleet's flags are refused (core.fleet.options.check_no_fleet_flags)."""
    from core.fleet.options import check_no_fleet_flags
    if not has_fleet:
        check_no_fleet_flags(a)

def _sweep_fleet(a, cfg, sm):
    """The sweep's FleetSpec from the fleet flags (None: one engine)."""
    from core.fleet.options import fleet_from_args, kv_bytes_per_token
    _fleet_flags_unused(a, wants_fleet(a))
    if not wants_fleet(a):
        return None
    bpt, model = kv_bytes_per_token(a)
    return fleet_from_args(a, cfg, sm, bpt, model)

def cmd_sweep(a) -> int:
    from core.experiments.sweep import sweep
    from core.workload import load_workload
    w = load_workload(a.workload)
    sm, _ = step_model_of(a)
    cfg = from_args(SchedulerConfig, a)
    fleet = _sweep_fleet(a, cfg, sm)
    out = sweep(w, cfg, sm, rates=a.rates, concurrency=a.concurrency,
                seed=a.seed, slo=slo_from_args(a), attainment=a.attainment, workers=a.workers, repeats=a.repeats,
                ray=a.ray, results=a.results, fleet=fleet)
    if a.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    key = "rate" if a.rates else "concurrency"
    kind = f"open loop (Poisson, seed {a.seed})" if a.rates else "closed loop"
    on = ""
    if fleet is not None:
        from core.fleet.options import describe_shape
        on = (f"; fleet of {describe_shape(out['fleet'])}, router {out['fleet']['router']['policy']} "
              f"(seeded as the arrivals)")
    print(f"{a.workload}: {len(w)} requests, {kind}; "
          f"simulated, step model {sm.describe()}{on}")
    head = f"{key:>11} {'offered/s':>10} {'done/s':>8} {'tok/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} " \
           f"{'TPOT p50':>9} {'TPOT p99':>9} {'E2E p99':>9} {'failed':>6}"
    print(head + (f" {'SLO met':>8} {'goodput/s':>9}" if out["points"] and "slo" in out["points"][0] else ""))
    for p in out["points"]:
        row = (f"{p[key]:>11g} {fmt_num(p['offered_req_per_s']):>10} {fmt_num(p['achieved_req_per_s']):>8} "
               f"{fmt_num(p['output_tok_per_s']):>9} {fmt_num(p['ttft_ms']['p50']):>9} "
               f"{fmt_num(p['ttft_ms']['p99']):>9} "
               f"{fmt_num(p['tpot_ms']['p50']):>9} {fmt_num(p['tpot_ms']['p99']):>9} {fmt_num(p['e2e_ms']['p99']):>9} "
               f"{p['failed']:>6}")
        if "slo" in p:
            row += f" {fmt_num(p['slo']['attainment']):>8} {fmt_num(p['slo']['goodput_req_per_s']):>9}"
        print(row)
        if "repeats" in p:
            r = p["repeats"]
            print(f"{'':>11} over seeds {r['seeds'][0]}..{r['seeds'][-1]}: tok/s {r['output_tok_per_s']['min']:,.1f}"
                  f"..{r['output_tok_per_s']['max']:,.1f}, TTFT p99 {r['ttft_p99_ms']['min']:,.1f}.."
                  f"{r['ttft_p99_ms']['max']:,.1f}" + (f", SLO met {r['attainment']['min']:.3f}.."
                                                        f"{r['attainment']['max']:.3f}" if "attainment" in r else ""))
    if out["capacity"] is not None:
        c = out["capacity"]
        print(f"capacity: {key} {c[key]:g} is the highest swept load with SLO attainment >= {c['target']:g} "
              f"({c['attainment']:.3f})")
    elif slo_from_args(a).given():
        print(f"capacity: no swept load reaches SLO attainment {a.attainment:g}")
    print("latencies in ms; offered = arrivals per second over their span; done = completed requests per second "
          "of the drain window")
    return 0

def cmd_search(a) -> int:
    from core.experiments.search import check_fleet_axes, parse_grid, search, uses_fleet
    from core.fleet.options import FleetFlags
    from core.workload import load_workload
    grid = parse_grid(a.grid)
    flags = FleetFlags.from_args(a)
    check_fleet_axes(grid, flags)         # (before the workload is read: a bad grid is refused at once)
    _fleet_flags_unused(a, uses_fleet(grid, flags))
    w = load_workload(a.workload)
    sm, _ = step_model_of(a)
    out = search(w, from_args(SchedulerConfig, a), sm, grid, a.rate, slo_from_args(a), target=a.attainment,
                 seed=a.seed, usd_per_hour=a.usd_per_hour, prune=not a.no_prune, workers=a.workers, ray=a.ray,
                 results=a.results, fleet=flags)
    if a.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    print(f"{a.workload}: {len(w)} requests at {a.rate:g} req/s (Poisson, seed {a.seed}); simulated, step model "
          f"{sm.describe()}; {len(out['points'])} configurations, {out['simulated']} simulated in full, "
          f"{out['pruned']} stopped early")
    if "fleet" in out:
        return _print_fleet_search(a, out)
    return _print_search(a, out)

def _print_search(a, out) -> int:
    from core.config import describe_options as describe
    cost = a.usd_per_hour is not None
    print(f"{'configuration':>44} {'SLO met':>8} {'goodput tok/s':>13} {'TTFT p99':>9} {'TPOT p99':>9}"
          + (f" {'USD/1k good':>11}" if cost else ""))
    for p in out["points"]:
        name = describe(p["config"])
        if "invalid" in p:
            print(f"{name:>44} invalid: {p['invalid']}")
        elif p.get("pruned"):
            print(f"{name:>44} {'<=' + format(p['attainment_at_most'], '.3f'):>8} stopped: {p['prefix_misses']} of "
                  f"the first {p['prefix_requests']} requests missed")
        else:
            print(f"{name:>44} {fmt_num(p['slo']['attainment']):>8} {fmt_num(p['slo']['goodput_tok_per_s']):>13} "
                  f"{fmt_num(p['ttft_ms']['p99']):>9} {fmt_num(p['tpot_ms']['p99']):>9}"
                  + (f" {p['cost_per_1k_good_tokens_usd'] or math.nan:>11.4g}" if cost else ""))
    b = out["best"]
    if b is None:
        print(f"best: no configuration reaches SLO attainment {a.attainment:g} at {a.rate:g} req/s")
    else:
        print(f"best: {describe(b['config'])} (SLO met {b['slo']['attainment']:.3f}, goodput "
              f"{b['slo']['goodput_tok_per_s']:,.1f} tok/s" + (f", USD {b['cost_per_1k_good_tokens_usd']:.6f} per "
                                                             "1,000 good tokens" if cost and
                                                             b['cost_per_1k_good_tokens_usd'] else "") + ")")
    return 0

def _print_fleet_search(a, out) -> int:
    """The search's table with the fleet's columns: replicas (N, or P+D disaggregated), router, and with a
    price the configuration's price per hour (one replica's times its replicas)."""
    from core.config import describe_options as describe
    from core.experiments.search import FLEET_AXES
    from core.fleet.options import describe_shape

    def shape(p):          # (an invalid scheduler configuration has no fleet: its axes', or the flags')
        if "fleet" in p:
            return describe_shape(p["fleet"])
        c = p["config"]
        n, pre, dec = (c.get("replicas", a.replicas), c.get("prefill_replicas", a.prefill_replicas),
                       c.get("decode_replicas", a.decode_replicas))
        return f"{pre}P+{dec}D" if pre or dec else describe_shape({"replicas": n}) if n else "—"

    engines = any(k not in FLEET_AXES for k in out["grid"])     # a scheduler axis: its column

    def engine(p):
        return f" {describe({k: v for k, v in p['config'].items() if k not in FLEET_AXES}):>36}" if engines else ""

    def router(p):
        return (p.get("fleet") or {}).get("router") or p["config"].get("router") or a.router or "round-robin"
    r = out["fleet"]["router"]
    print(f"fleet: router settings {', '.join(f'{k} {v}' for k, v in r.items() if k != 'policy')} (the router's "
          f"seed is the arrivals'); " + ("price per replica (given) USD "
                                         f"{a.usd_per_hour:g}/h, a configuration's is that times its replicas"
                                         if a.usd_per_hour is not None else "no price: ranked by goodput per replica"))
    cost = a.usd_per_hour is not None
    print(f"{'replicas':>11} {'router':>14}" + (f" {'configuration':>36}" if engines else "")
          + f" {'SLO met':>8} {'goodput tok/s':>13} "
          f"{'TTFT p99':>9} {'TPOT p99':>9}" + (f" {'USD/h':>7} {'USD/1k good':>11}" if cost else ""))
    for p in out["points"]:
        head = f"{shape(p):>11} {router(p):>14}{engine(p)}"
        if "invalid" in p:
            print(f"{head} invalid: {p['invalid']}")
        elif p.get("pruned"):
            print(f"{head} {'<=' + format(p['attainment_at_most'], '.3f'):>8} stopped: {p['prefix_misses']} of "
                  f"the first {p['prefix_requests']} requests missed")
        else:
            print(f"{head} {fmt_num(p['slo']['attainment']):>8} {fmt_num(p['slo']['goodput_tok_per_s']):>13} "
                  f"{fmt_num(p['ttft_ms']['p99']):>9} {fmt_num(p['tpot_ms']['p99']):>9}"
                  + (f" {p['usd_per_hour']:>7.4g} {p['cost_per_1k_good_tokens_usd'] or math.nan:>11.4g}"
                     if cost else ""))
    b = out["best"]
    if b is None:
        print(f"best: no configuration reaches SLO attainment {a.attainment:g} at {a.rate:g} req/s")
        return 0
    money = (f", USD {b['cost_per_1k_good_tokens_usd']:.6f} per 1,000 good tokens at USD {b['usd_per_hour']:g}/h"
             if cost and b["cost_per_1k_good_tokens_usd"] else "")
    where = f"{shape(b)}, router {router(b)}" + (f", {engine(b).lstrip()}" if engines else "")
    print(f"best: {where} (SLO met {b['slo']['attainment']:.3f}, goodput "
          f"{b['slo']['goodput_tok_per_s']:,.1f} tok/s{money})")
    return 0
