"""A capacity search (issue 29 part 3): which scheduler configuration of a grid meets the SLOs at a
given offered load, and at what cost per 1,000 good tokens.

Every configuration (the grid's product over SchedulerConfig options, on a base configuration)
simulates the same workload arriving as the same Poisson process (one seed), so the points
differ only by the configuration. A point's attainment, goodput and cost are those of
core.sim.sweep.point_summary (definitions in core.analysis.metrics); cost per 1,000 good tokens =
the hourly price over the goodput in tokens per second. The answer: among the configurations
whose attainment reaches the target, the one with the lowest cost per 1,000 good tokens (without a
price: the highest goodput, the same order at one price); ties go to the smaller configuration
(fewer KV blocks, then fewer sequences, then grid order).

Early stopping: a configuration is first simulated on the workload's first quarter (at least
MIN_PREFIX requests). If more of those requests already miss the SLOs than the target allows of
the whole workload, the configuration is hopeless and is not simulated further. This relies on a
property of the step loop: requests that arrive later never help an earlier one meet its SLOs
(they only add contention; true of FCFS admission with prefill-first batching, and checked against
a brute-force run of every configuration in tests/test_search.py). `prune=False` simulates all.

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
from core.errors import ConfigError
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.sim.sweep import point_summary, retimed
from core.workload import Workload

MAX_CONFIGS = 4096
MIN_PREFIX = 50
PREFIX_FRACTION = 0.25
GRID_OPTIONS = ("policy", "max_seqs", "token_budget", "chunk", "block_size", "kv_blocks", "prefix_caching",
                "scheduling_policy", "kv_watermark", "queue_limit", "max_model_len")


def parse_grid(items: list[str]) -> dict[str, list]:
    """["max_seqs=8,16", "chunk=256,512", ...] -> {"max_seqs": [8, 16], ...}, values typed by the
    option (ints, floats, booleans, names; "none" for an option that may be unset). Refused with
    the option named: an unknown option, one given twice, an empty or malformed list."""
    grid: dict[str, list] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ConfigError(f"grid: expected NAME=V1,V2,..., got {item!r}")
        if name not in GRID_OPTIONS:
            raise ConfigError(f"grid: unknown option {name!r} (searchable: {', '.join(GRID_OPTIONS)})")
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
    n = math.prod(len(v) for v in grid.values())
    if n > MAX_CONFIGS:
        raise ConfigError(f"grid: {n:,} configurations; at most {MAX_CONFIGS:,} per search")
    return grid


def _typed(name: str, v: str):
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


def configurations(base: SchedulerConfig, grid: dict[str, list]) -> list[tuple[dict, SchedulerConfig | str]]:
    """(the grid point, its configuration or why it is invalid) for every point, in grid order."""
    names = list(grid)
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
        point = dict(zip(names, values))
        try:
            cfg = from_dict(SchedulerConfig, {**base.to_dict(), **point}, "grid point")
        except ConfigError as e:
            out.append((point, str(e)))
            continue
        out.append((point, cfg))
    return out


def simulated_tokens(workload: Workload, grid: dict[str, list]) -> int:
    """An upper bound on a search's work (module docstring): configurations x (prompt + output tokens)."""
    n = math.prod(len(v) for v in grid.values())
    return n * int(workload.prompt_tokens.sum() + workload.max_output_tokens.sum())


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
                 usd_per_hour: float | None, prune: bool = True) -> dict:
    """One configuration on the (already retimed) workload: its point summary and cost, or
    {"pruned": ...} when its first quarter already misses too many (module docstring)."""
    try:
        return _search_point(workload, config, step_model, slo, target, usd_per_hour, prune)
    except ConfigError as e:           # a configuration this workload cannot run under (a prompt over the budget)
        return {"invalid": str(e)}


def _search_point(workload, config, step_model, slo, target, usd_per_hour, prune) -> dict:
    n = len(workload)
    allowed = math.floor((1 - target) * n + 1e-9)        # misses the target allows of the whole run
    k = max(MIN_PREFIX, math.ceil(PREFIX_FRACTION * n))
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
    p = point_summary(tr, slo)
    good = p["slo"]["goodput_tok_per_s"]
    p["cost_per_1k_good_tokens_usd"] = (usd_per_hour / 3600.0 / good * 1000.0
                                        if usd_per_hour is not None and good else None)
    p["meets"] = p["slo"]["attainment"] is not None and p["slo"]["attainment"] >= target
    return p


def search(workload: Workload, base: SchedulerConfig, step_model: StepModel, grid: dict[str, list], rate: float,
           slo: SLO, target: float = 0.9, seed: int = 0, usd_per_hour: float | None = None,
           prune: bool = True, workers: int | None = None, ray: str | None = None,
           results: str | None = None, budget_s: float | None = None) -> dict:
    """Every configuration of `grid` (on `base`) at `rate` req/s; the cheapest that meets the
    SLOs (module docstring). Runs go to up to `workers` processes (default one per CPU), or to
    Ray tasks (`ray`: "local", "auto" or "ray://HOST:PORT"; core.sim.rayrun). `budget_s`: no
    configuration is started after that many seconds (the rest: {"not_run": why})."""
    from core.sim.parallel import run_all
    if not slo.given():
        raise ConfigError("search: give at least one SLO bound (--slo-ttft-ms, --slo-tpot-ms, --slo-e2e-ms)")
    if not 0 < target <= 1:
        raise ConfigError(f"attainment: expected a fraction in (0, 1], got {target!r}")
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ConfigError(f"rate: expected requests per second > 0, got {rate!r}")
    configs = configurations(base, grid)
    timed = retimed(workload, rate, seed)
    valid = [(pt, c) for pt, c in configs if isinstance(c, SchedulerConfig)]
    jobs = [dict(workload=timed, config=c, step_model=step_model, slo=slo, target=target, usd_per_hour=usd_per_hour,
                 prune=prune) for _, c in valid]
    if budget_s is None:
        results = run_all(search_point, jobs, workers, ray, results)
    else:
        if ray is not None or results is not None:
            raise ConfigError("search: a time budget runs here, not with --ray or --results")
        results = _within_budget(jobs, budget_s, workers)
    by_point = {repr(pt): r for (pt, _), r in zip(valid, results)}
    points = []
    for pt, c in configs:
        row = {"config": pt}
        if isinstance(c, str):
            row["invalid"] = c
        else:
            row.update(by_point[repr(pt)])
        points.append(row)
    return {"workload": workload.name, "requests": len(workload), "rate": rate, "seed": seed,
            "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms}, "attainment": target,
            "usd_per_hour": usd_per_hour, "base": base.to_dict(), "step_model": step_model.to_dict(),
            "grid": grid, "points": points, "best": best_of(points, usd_per_hour),
            "pruned": sum(1 for p in points if p.get("pruned")), "simulated": sum(1 for p in points if "meets" in p),
            "not_run": sum(1 for p in points if "not_run" in p)}


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
        out += run_all(search_point, jobs[k:k + wave], workers)
    return out


def best_of(points: list[dict], usd_per_hour: float | None) -> dict | None:
    """The winning point (module docstring), or None when no configuration meets the target."""
    ok = [(i, p) for i, p in enumerate(points) if p.get("meets")]
    if not ok:
        return None

    def size(p):
        c = p["config"]
        return (c.get("kv_blocks") or 0, c.get("max_seqs") or 0)

    def key(item):
        i, p = item
        money = p["cost_per_1k_good_tokens_usd"] if usd_per_hour is not None else None
        good = p["slo"]["goodput_tok_per_s"] or 0.0
        return (money if money is not None else -good, *size(p), i)
    return min(ok, key=key)[1]


def describe(config: dict) -> str:
    """A grid point in words ("max_seqs 16, kv_blocks none")."""
    return ", ".join(f"{k} {'none' if v is None else v}" for k, v in config.items())
