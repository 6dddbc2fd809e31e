"""A capacity search (issue 29 part 3): which scheduler configuration of a grid meets the SLOs at a
given offered load, and at what cost per 1,000 good tokens.

Every configuration (the grid's product over SchedulerConfig options, on a base configuration)
simulates the same workload arriving as the same Poisson process (one seed), so the points
differ only by the configuration. A point's attainment, goodput and cost are those of
core.experiments.sweep.point_summary (definitions in core.analysis.metrics); cost per 1,000 good tokens =
the hourly price over the goodput in tokens per second. The answer: among the configurations
whose attainment reaches the target, the one with the lowest cost per 1,000 good tokens (without a
price: the highest goodput per replica, the same order at any price); ties go to the smaller
configuration (fewer replicas, then fewer KV blocks, then fewer sequences, then grid order).

Fleets (issue 37): the grid may also vary the fleet (FLEET_AXES: replicas, router, prefill_replicas,
decode_replicas), on a base fleet given as core.fleet.options.FleetFlags (the command line's fleet
flags); a configuration with a fleet is simulated by core.fleet.sim.simulate_fleet, its router
seeded with the arrivals' seed. `usd_per_hour` is one replica's price: a fleet of N replicas costs
N times that (disaggregated P prefill + D decode replicas: P + D times).

Early stopping: a configuration is first simulated on the workload's first quarter (at least
MIN_PREFIX requests). If more of those requests already miss the SLOs than the target allows of
the whole workload, the configuration is hopeless and is not simulated further. This relies on a
property of the step loop: requests that arrive later never help an earlier one meet its SLOs
(they only add contention; true of FCFS admission with prefill-first batching, and checked against
a brute-force run of every configuration in tests/test_search.py). `prune=False` simulates all.
A fleet of whole replicas keeps the property: the router decides each request at its arrival from
what happened before it, so the first quarter is routed as in the whole run, and each replica then
sees a first part of its own requests (its pool is sized for the whole workload in both runs;
tests/test_fleet_sweep.py checks it against a brute-force run). Disaggregated configurations are
always simulated in full: there a later request can help an earlier one (its prompt's blocks, already
on the decode replica, shorten the earlier one's KV transfer).

Bounded work (what a page may start): `simulated_tokens` bounds a search's work before it runs (the
step loop handles a request at most once per token it prefills or decodes, so configurations x the
workload's prompt and output tokens bounds the request-steps simulated), `check_work` refuses a grid
past a limit; `budget_s` stops starting configurations once that many seconds were spent (those
left are listed as not simulated, never guessed).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time

from core.analysis.metrics import SLO, request_metrics, slo_check
from core.config import SchedulerConfig, from_dict
from core.config import describe_options as describe
from core.errors import ConfigError
from core.experiments.sweep import point_summary, retimed
from core.fleet.options import (
    MAX_REPLICAS,
    FleetFlags,
    fleet_from_args,
    fleet_shape,
    kv_bytes_per_token,
    router_from_args,
    seeded,
)
from core.fleet.router import POLICIES, policy_setup
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Workload

MAX_CONFIGS = 4096
MIN_PREFIX = 50
PREFIX_FRACTION = 0.25
GRID_OPTIONS = ("policy", "max_seqs", "token_budget", "chunk", "block_size", "kv_blocks", "prefix_caching",
                "scheduling_policy", "kv_watermark", "queue_limit", "max_model_len")
FLEET_AXES = ("replicas", "router", "prefill_replicas", "decode_replicas")   # the fleet (core.fleet) a point runs on
PD_AXES = ("prefill_replicas", "decode_replicas")


def parse_grid(items: list[str]) -> dict[str, list]:
    """["max_seqs=8,16", "chunk=256,512", ...] -> {"max_seqs": [8, 16], ...}, values typed by the
    option (ints, floats, booleans, names; "none" for an option that may be unset). Refused with
    the option named: an unknown option, one given twice, an empty or malformed list, a fleet axis's
    bad value (a router not in core.fleet.router.POLICIES, a replica count not in 1..MAX_REPLICAS),
    replicas beside prefill_replicas/decode_replicas. (What needs the fleet flags too, such as
    prefill_replicas without any decode replicas, is refused by `search`: check_fleet_axes.)"""
    grid: dict[str, list] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ConfigError(f"grid: expected NAME=V1,V2,..., got {item!r}")
        if name not in GRID_OPTIONS + FLEET_AXES:
            raise ConfigError(f"grid: unknown option {name!r} (searchable: {', '.join(GRID_OPTIONS + FLEET_AXES)})")
        if name in grid:
            raise ConfigError(f"grid: {name} given twice")
        typed = []
        for v in values.split(","):
            v = v.strip()
            if not v:
                raise ConfigError(f"grid: {name}: an empty value in {values!r}")
            typed.append(_typed(name, v))
        if len(set(map(repr, typed))) != len(typed):
            raise ConfigError(f"grid: {name}: a value listed twice in {values!r}")
        grid[name] = typed
    if not grid:
        raise ConfigError("grid: give at least one NAME=V1,V2,...")
    if "replicas" in grid and any(k in grid for k in PD_AXES):
        raise ConfigError("grid: replicas (whole replicas) and prefill_replicas/decode_replicas (disaggregated): "
                          "give one or the other")
    n = math.prod(len(v) for v in grid.values())
    if n > MAX_CONFIGS:
        raise ConfigError(f"grid: {n:,} configurations; at most {MAX_CONFIGS:,} per search")
    return grid


def _typed(name: str, v: str):
    if name in FLEET_AXES:
        return _fleet_value(name, v)
    if v.lower() == "none":
        return None
    if name in ("policy", "scheduling_policy"):
        return v
    if name == "prefix_caching":
        if v.lower() in ("true", "on", "1", "yes"):
            return True
        if v.lower() in ("false", "off", "0", "no"):
            return False
        raise ConfigError(f"grid: prefix_caching: expected true or false, got {v!r}")
    try:
        return float(v) if name == "kv_watermark" else int(v)
    except ValueError:
        raise ConfigError(f"grid: {name}: expected {'a number' if name == 'kv_watermark' else 'an integer'}, "
                          f"got {v!r}") from None


def _fleet_value(name: str, v: str):
    if name == "router":
        if v not in POLICIES:
            raise ConfigError(f"grid: router: expected one of {', '.join(POLICIES)}, got {v!r}")
        return v
    try:
        n = int(v)
    except ValueError:
        n = None
    if n is None or not 1 <= n <= MAX_REPLICAS:
        raise ConfigError(f"grid: {name}: expected an integer in 1..{MAX_REPLICAS}, got {v!r}")
    return n


def _pd_flags(f: FleetFlags):
    """Whether the fleet flags ask for a disaggregated fleet (--prefill-replicas or --decode-replicas)."""
    return f.prefill_replicas or f.decode_replicas


def _replicas_axis_clash(grid: dict[str, list], f: FleetFlags) -> str | None:
    if "replicas" in grid and (_pd_flags(f) or f.replicas_file or f.replicas):
        return ("grid: replicas: the fleet is already given by "
                + ("--replicas-file" if f.replicas_file else "--replicas (the grid's axis would override "
                   "it)" if f.replicas else "--prefill-replicas/--decode-replicas") + "; drop one")
    return None


def _router_axis_clash(grid: dict[str, list], f: FleetFlags) -> str | None:
    if "router" in grid and f.router is not None:
        return f"grid: router: --router {f.router} is given too (the grid's axis would override it); drop one"
    return None


def _pd_axes_clash(grid: dict[str, list], f: FleetFlags) -> str | None:
    if any(k in grid for k in PD_AXES) and (f.replicas or f.replicas_file):
        return ("grid: prefill_replicas/decode_replicas: the fleet is already given by "
                + ("--replicas-file" if f.replicas_file else "--replicas") + "; drop one")
    return None


def _pd_half(grid: dict[str, list], f: FleetFlags) -> str | None:
    for k, flag, other, other_flag in (("prefill_replicas", f.prefill_replicas, "decode_replicas", f.decode_replicas),
                                       ("decode_replicas", f.decode_replicas, "prefill_replicas", f.prefill_replicas)):
        if (k in grid or flag) and not (other in grid or other_flag):
            return (f"grid: {k} needs {other} too (a grid axis or --{other.replace('_', '-')}): "
                    "disaggregated serving has both")
    return None


def _router_without_fleet(grid: dict[str, list], f: FleetFlags) -> str | None:
    if "router" in grid and not (any(k in grid for k in ("replicas", *PD_AXES)) or f.replicas or _pd_flags(f)
                                 or f.replicas_file):
        return ("grid: router needs a fleet: a replicas (or prefill_replicas and decode_replicas) axis, "
                "or --replicas, --prefill-replicas/--decode-replicas, --replicas-file")
    return None


def _fleet_flags_clash(grid: dict[str, list], f: FleetFlags) -> str | None:
    if f.replicas and _pd_flags(f):
        return "--replicas and --prefill-replicas/--decode-replicas: give one or the other"
    if f.replicas_file and (f.replicas or _pd_flags(f)):
        return ("--replicas-file and --replicas/--prefill-replicas/--decode-replicas: give one or the other "
                "(the file lists every replica)")
    return None


# check_fleet_axes' checks, in the order they are made: each returns why it refuses, or None
_FLEET_AXES_CHECKS = (_replicas_axis_clash, _router_axis_clash, _pd_axes_clash, _pd_half, _router_without_fleet,
                      _fleet_flags_clash)


def check_fleet_axes(grid: dict[str, list], flags: FleetFlags | None) -> None:
    """Refuse (one line) fleet axes that cannot go with each other or with the fleet flags."""
    f = flags or FleetFlags()
    for check in _FLEET_AXES_CHECKS:
        why = check(grid, f)
        if why is not None:
            raise ConfigError(why)


def uses_fleet(grid: dict[str, list], flags: FleetFlags | None) -> bool:
    """Whether a search's configurations run on fleets (a fleet axis, or fleet flags)."""
    f = flags or FleetFlags()
    return any(k in grid for k in FLEET_AXES) or bool(f.replicas or f.prefill_replicas or f.decode_replicas
                                                       or f.replicas_file)


def configurations(base: SchedulerConfig, grid: dict[str, list]) -> list[tuple[dict, SchedulerConfig | str]]:
    """(the grid point, its scheduler configuration or why it is invalid) for every point, in grid
    order (fleet axes are left to `fleets`)."""
    names = list(grid)
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
        point = dict(zip(names, values))
        try:
            cfg = from_dict(SchedulerConfig, {**base.to_dict(), **{k: v for k, v in point.items()
                                                                   if k not in FLEET_AXES}}, "grid point")
        except ConfigError as e:
            out.append((point, str(e)))
            continue
        out.append((point, cfg))
    return out


def fleets(configs: list[tuple[dict, SchedulerConfig | str]], step_model: StepModel, flags: FleetFlags | None,
           seed: int) -> list:
    """Per configuration: its FleetSpec (router seeded with `seed`), or None (no fleet, or an invalid
    scheduler configuration), or why the fleet is invalid (a string)."""
    f = flags or FleetFlags()
    bpt, model = kv_bytes_per_token(f if f.model else dataclasses.replace(f, model=step_model.model))
    out = []
    for point, cfg in configs:
        if not isinstance(cfg, SchedulerConfig):
            out.append(None)
            continue
        try:
            fl = fleet_from_args(f, cfg, step_model, bpt, model, replicas=point.get("replicas"),
                                 prefill=point.get("prefill_replicas"), decode=point.get("decode_replicas"),
                                 router=point.get("router"))
        except ConfigError as e:
            out.append(str(e))
            continue
        out.append(None if fl is None else seeded(fl, seed))
    return out


def simulated_tokens(workload: Workload, grid: dict[str, list]) -> int:
    """An upper bound on a search's work (module docstring): configurations x (prompt + output tokens);
    with disaggregated axes 2 more per request (the prefill replica's discarded token, the decode
    replica's recomputed one)."""
    n = math.prod(len(v) for v in grid.values())
    extra = 2 * len(workload) if any(k in grid for k in PD_AXES) else 0
    return n * (int(workload.prompt_tokens.sum() + workload.max_output_tokens.sum()) + extra)


def check_work(workload: Workload, grid: dict[str, list], limit: int, where: str = "") -> int:
    """simulated_tokens(workload, grid), or ConfigError when past `limit`."""
    work = simulated_tokens(workload, grid)
    if work > limit:
        n = math.prod(len(v) for v in grid.values())
        raise ConfigError(f"grid: {n:,} configurations x {work // n:,} tokens of {len(workload):,} requests = "
                          f"{work / 1e6:,.1f} M simulated tokens; at most {limit / 1e6:,.0f} M per search{where} "
                          "(fewer values, or `python -m core search` for larger grids)")
    return work


def _misses(trace, slo: SLO) -> int:
    met, _ = slo_check(request_metrics(trace), slo)
    return int(len(met) - met.sum())


def search_point(workload: Workload, config: SchedulerConfig, step_model: StepModel, slo: SLO, target: float,
                 usd_per_hour: float | None, prune: bool = True, fleet=None) -> dict:
    """One configuration on the (already retimed) workload: its point summary and cost, or
    {"pruned": ...} when its first quarter already misses too many (module docstring). `fleet`: a
    core.fleet.sim.FleetSpec that serves it instead of one engine (cost: `usd_per_hour` per replica)."""
    try:
        if fleet is not None:
            return _fleet_point(workload, fleet, slo, target, usd_per_hour, prune) | _fleet_cost(fleet, usd_per_hour)
        return _search_point(workload, config, step_model, slo, target, usd_per_hour, prune)
    except ConfigError as e:           # a configuration this workload cannot run under (a prompt over the budget)
        return {"invalid": str(e)} | ({} if fleet is None else _fleet_cost(fleet, usd_per_hour))


def _fleet_cost(fleet, usd_per_hour: float | None) -> dict:
    """A fleet configuration's {"fleet": its shape, "usd_per_hour": its replicas' price}."""
    shape = fleet_shape(fleet)
    return {"fleet": shape, "usd_per_hour": None if usd_per_hour is None else usd_per_hour * shape["replicas"]}


def _head_size(n: int, target: float) -> tuple[int, int]:
    """(misses the target allows of the whole run, requests in the first part simulated for early stopping)."""
    return math.floor((1 - target) * n + 1e-9), max(MIN_PREFIX, math.ceil(PREFIX_FRACTION * n))


def _priced(p: dict, usd_per_hour: float | None, target: float, replicas: int = 1) -> dict:
    good = p["slo"]["goodput_tok_per_s"]
    p["cost_per_1k_good_tokens_usd"] = (usd_per_hour * replicas / 3600.0 / good * 1000.0
                                        if usd_per_hour is not None and good else None)
    p["meets"] = p["slo"]["attainment"] is not None and p["slo"]["attainment"] >= target
    return p


def _fleet_point(workload: Workload, fleet, slo: SLO, target: float, usd_per_hour: float | None, prune: bool) -> dict:
    from core.fleet.sim import simulate_fleet, sized
    fleet = sized(fleet, workload)     # both runs: pools sized for the whole workload (module docstring)
    n = len(workload)
    allowed, k = _head_size(n, target)
    if prune and k < n and not fleet.disaggregated:
        head = Workload(workload.requests[:k], name=workload.name)
        misses = _misses(simulate_fleet(head, fleet, created="(search)", record_kv=False), slo)
        if misses > allowed:
            return {"pruned": True, "prefix_requests": k, "prefix_misses": misses,
                    "attainment_at_most": (n - misses) / n}
    tr = simulate_fleet(workload, fleet, created="(search)", record_kv=False)
    return _priced(point_summary(tr, slo), usd_per_hour, target, len(fleet.replicas))


def _search_point(workload, config, step_model, slo, target, usd_per_hour, prune) -> dict:
    n = len(workload)
    allowed, k = _head_size(n, target)
    if prune and k < n:
        from core.engine.admission import pool_blocks
        from core.engine.requests import RequestTable
        # the whole workload's checks and pool (an unsized pool is sized for every request of the
        # run, not of its first quarter: a smaller one would make the prefix slower than the run)
        pool = pool_blocks(config, RequestTable(workload))
        head = Workload(workload.requests[:k], name=workload.name)
        misses = _misses(simulate(head, dataclasses.replace(config, kv_blocks=pool), step_model, record_kv=False,
                                  created="(search)"), slo)
        if misses > allowed:
            return {"pruned": True, "prefix_requests": k, "prefix_misses": misses,
                    "attainment_at_most": (n - misses) / n}
    tr = simulate(workload, config, step_model, record_kv=False, created="(search)")
    return _priced(point_summary(tr, slo), usd_per_hour, target)


def _check_search_args(slo: SLO, target: float, rate: float) -> None:
    """Refuse (one line) a search without SLO bounds, an attainment target out of (0, 1], a rate not > 0."""
    if not slo.given():
        raise ConfigError("search: give at least one SLO bound (--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms)")
    if not 0 < target <= 1:
        raise ConfigError(f"attainment: expected a fraction in (0, 1], got {target!r}")
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ConfigError(f"rate: expected requests per second > 0, got {rate!r}")


def _with_fleets(configs: list[tuple[dict, SchedulerConfig | str]], step_model: StepModel, flags: FleetFlags | None,
                 seed: int) -> tuple[list[tuple[dict, SchedulerConfig | str]], dict[str, object]]:
    """(the configurations, a configuration whose fleet is invalid now saying why as a scheduler's does;
    {repr(grid point): its fleet, None or why it is invalid})."""
    specs = fleets(configs, step_model, flags, seed)
    configs = [(pt, s if isinstance(s, str) else c) for (pt, c), s in zip(configs, specs)]
    return configs, {repr(pt): s for (pt, _), s in zip(configs, specs)}


def _run_jobs(jobs: list[dict], workers: int | None, ray: str | None, results: str | None,
              budget_s: float | None) -> list[dict]:
    """search_point over the jobs: all of them (in processes, Ray tasks or via `results`), or as many
    as `budget_s` allows (here only)."""
    from core.sim.parallel import run_all
    if budget_s is None:
        return run_all(search_point, jobs, workers, ray, results, setup=policy_setup())
    if ray is not None or results is not None:
        raise ConfigError("search: a time budget runs here, not with --ray or --results")
    return _within_budget(jobs, budget_s, workers)


def _point_rows(configs: list[tuple[dict, SchedulerConfig | str]], by_point: dict[str, dict],
                spec_of: dict[str, object] | None, usd_per_hour: float | None) -> list[dict]:
    """One row per configuration, in grid order: {"config": the grid point} and why it is invalid or its
    run's answer (on fleets, `spec_of` given: and the fleet's shape and price)."""
    points = []
    for pt, c in configs:
        row = {"config": pt}
        if isinstance(c, str):
            row["invalid"] = c
        else:
            row.update(by_point[repr(pt)])
            if spec_of is not None:     # (a configuration not run has no worker's answer)
                row.update(_fleet_cost(spec_of[repr(pt)], usd_per_hour))
        points.append(row)
    return points


def _tally(points: list[dict]) -> dict[str, int]:
    """How many points were stopped early, simulated, not run (the budget spent)."""
    return {"pruned": sum(1 for p in points if p.get("pruned")), "simulated": sum(1 for p in points if "meets" in p),
            "not_run": sum(1 for p in points if "not_run" in p)}


def search(workload: Workload, base: SchedulerConfig, step_model: StepModel, grid: dict[str, list], rate: float,
           slo: SLO, target: float = 0.9, seed: int = 0, usd_per_hour: float | None = None,
           prune: bool = True, workers: int | None = None, ray: str | None = None,
           results: str | None = None, budget_s: float | None = None, fleet: FleetFlags | None = None) -> dict:
    """Every configuration of `grid` (on `base`) at `rate` req/s; the cheapest that meets the
    SLOs (module docstring). Runs go to up to `workers` processes (default one per CPU), or to
    Ray tasks (`ray`: "local", "auto" or "ray://HOST:PORT"; core.sim.rayrun). `budget_s`: no
    configuration is started after that many seconds (the rest: {"not_run": why}). `fleet`: the
    base fleet (the fleet flags; the grid's fleet axes override them); with a fleet, each point has
    "fleet" (core.fleet.options.fleet_shape) and "usd_per_hour" (its replicas' price), and the
    result "fleet" (the base router's settings)."""
    _check_search_args(slo, target, rate)
    check_fleet_axes(grid, fleet)
    configs = configurations(base, grid)
    on_fleets = uses_fleet(grid, fleet)
    spec_of = None
    if on_fleets:        # a configuration whose fleet is invalid is reported as such, as a scheduler's
        configs, spec_of = _with_fleets(configs, step_model, fleet, seed)
    timed = retimed(workload, rate, seed)
    valid = [(pt, c) for pt, c in configs if isinstance(c, SchedulerConfig)]
    if not valid:      # nothing to run (nor to write to --results, nor to read back from it)
        raise ConfigError(none_could_run(workload, [(pt, c) for pt, c in configs]))
    jobs = [dict(workload=timed, config=c, step_model=step_model, slo=slo, target=target, usd_per_hour=usd_per_hour,
                 prune=prune) for _, c in valid]
    if on_fleets:
        jobs = [j | {"fleet": spec_of[repr(pt)]} for j, (pt, _) in zip(jobs, valid)]
    results = _run_jobs(jobs, workers, ray, results, budget_s)
    points = _point_rows(configs, {repr(pt): r for (pt, _), r in zip(valid, results)}, spec_of, usd_per_hour)
    if all("invalid" in p for p in points):    # each ran into its limits with this workload (a pool too small...)
        raise ConfigError(none_could_run(workload, [(p["config"], p["invalid"]) for p in points]))
    out = {"workload": workload.name, "requests": len(workload), "rate": rate, "seed": seed,
           "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms}, "attainment": target,
           "usd_per_hour": usd_per_hour, "base": base.to_dict(), "step_model": step_model.to_dict(),
           "grid": grid, "points": points, "best": best_of(points, usd_per_hour), **_tally(points)}
    if on_fleets:
        f = dataclasses.replace(fleet or FleetFlags(), seed=seed)
        out["fleet"] = {"router": router_from_args(f).to_dict(), "replicas_file": f.replicas_file}
    return out


SHOWN_REASONS = 3     # invalid configurations named when none could run


def none_could_run(workload: Workload, why: list[tuple[dict, str]]) -> str:
    """The line for a search none of whose configurations can run: how many, and the first few reasons."""
    shown = "; ".join(f"{describe(pt)}: {reason}" for pt, reason in why[:SHOWN_REASONS])
    more = f"; and {len(why) - SHOWN_REASONS:,} more" if len(why) > SHOWN_REASONS else ""
    return (f"search: none of the grid's {len(why):,} configuration{'s' if len(why) != 1 else ''} can run "
            f"the workload{' ' + workload.name if workload.name else ''}: {shown}{more}")


def _within_budget(jobs: list[dict], budget_s: float, workers: int | None) -> list[dict]:
    """search_point over the jobs, a wave of one job per worker at a time, none started after `budget_s`
    seconds (a wave started in time runs to its end)."""
    from core.sim.parallel import cpus, run_all
    wave = max(1, min(workers or cpus(), cpus()))
    t0, out = time.perf_counter(), []
    for k in range(0, len(jobs), wave):
        if k and time.perf_counter() - t0 >= budget_s:
            why = f"not simulated: the search's budget of {budget_s:g} s was spent"
            return out + [{"not_run": why} for _ in jobs[k:]]
        out += run_all(search_point, jobs[k:k + wave], workers, setup=policy_setup())
    return out


def best_of(points: list[dict], usd_per_hour: float | None) -> dict | None:
    """The winning point (module docstring), or None when no configuration meets the target."""
    ok = [(i, p) for i, p in enumerate(points) if p.get("meets")]
    if not ok:
        return None

    def size(p):
        c = p["config"]
        return (replicas_of(p), c.get("kv_blocks") or 0, c.get("max_seqs") or 0)

    def key(item):
        i, p = item
        money = p["cost_per_1k_good_tokens_usd"] if usd_per_hour is not None else None
        good = p["slo"]["goodput_tok_per_s"] or 0.0
        return (money if money is not None else -good / replicas_of(p), *size(p), i)
    return min(ok, key=key)[1]


def replicas_of(p: dict) -> int:
    """The replicas a point runs on (1: one engine)."""
    return (p.get("fleet") or {}).get("replicas", 1)


