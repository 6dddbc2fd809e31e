"""Sweeps and capacity searches over fleets (issue 37): `sweep`/`search` take the fleet flags, the
search grid takes replicas, router, prefill_replicas and decode_replicas axes, and a configuration's
cost counts its replicas.

The hand model: every request has a 20-token prompt and 10 output tokens; one sequence at a time
(max_seqs 1) and constant 1 ms steps, so a replica serves a request in exactly 10 ms (one prefill
step that emits the first token, nine decode steps) and is a first-come-first-served single server
with deterministic service: start_k = max(arrival_k, finish of the one before), TTFT = start + 1 ms -
arrival, E2E = start + 10 ms - arrival (Lindley's recursion). Round-robin over two identical replicas
sends requests 0, 2, 4... to one and 1, 3, 5... to the other. Arrivals: the documented Poisson process
(gaps exponential, mean 1000 / rate ms, numpy's default_rng(seed); first arrival at 0)."""
import json

import numpy as np
import pytest

from core.__main__ import main
from core.analysis.metrics import SLO
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.experiments.search import configurations, fleets, parse_grid, search
from core.experiments.sweep import point_summary, retimed, sweep
from core.fleet.options import FleetFlags
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSpec, simulate_fleet
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

N, PROMPT, OUT, SERVICE_MS = 120, 20, 10, 10.0
CFG = SchedulerConfig("continuous", max_seqs=1)
UNIT = StepModel()        # constant 1 ms per step


def lengths_workload(n=N):
    return Workload([Request(f"r{i}", 0.0, PROMPT, OUT) for i in range(n)], name="fixed")


def arrivals(rate, seed=0, n=N):
    return np.concatenate([[0.0], np.cumsum(np.random.default_rng(seed).exponential(1.0, n - 1) * 1000.0 / rate)])


def single_server(a):
    """(TTFT, E2E) per request of a FCFS server with SERVICE_MS per request (Lindley's recursion)."""
    out, free = [], -np.inf
    for t in a:
        start = max(t, free)
        free = start + SERVICE_MS
        out.append((start + 1.0 - t, free - t))
    return np.array(out)


def round_robin(a, replicas):
    out = np.empty((len(a), 2))
    for r in range(replicas):
        out[r::replicas] = single_server(a[r::replicas])
    return out


def test_two_replicas_serve_a_rate_one_engine_cannot_with_latencies_computed_by_hand():
    rate = 150.0       # one engine: at most 1000 / 10 = 100 req/s; two: 200 req/s
    a = arrivals(rate)
    got = {n: sweep(lengths_workload(), CFG, UNIT, rates=[rate], slo=SLO(e2e_ms=40.0), workers=1,
                    fleet=FleetSpec.uniform(n, CFG, UNIT))["points"][0] for n in (1, 2)}
    for n, hand in ((1, single_server(a)), (2, round_robin(a, 2))):
        assert got[n]["ttft_ms"]["mean"] == pytest.approx(hand[:, 0].mean(), abs=1e-9)
        assert got[n]["e2e_ms"]["mean"] == pytest.approx(hand[:, 1].mean(), abs=1e-9)
        assert got[n]["slo"]["attainment"] == pytest.approx((hand[:, 1] <= 40.0).mean(), abs=1e-12)
    # a simpler bound: one engine serving one request at a time finishes request k no earlier than (k + 1) x 10 ms
    bound = ((np.arange(1, N + 1) * SERVICE_MS) - a).clip(min=SERVICE_MS).mean()
    assert a[-1] < 0.8 * N * SERVICE_MS and bound > 150       # the arrivals end long before the work can
    assert got[1]["e2e_ms"]["mean"] >= bound
    assert got[2]["e2e_ms"]["mean"] < got[1]["e2e_ms"]["mean"] / 5
    assert got[2]["ttft_ms"]["p99"] < got[1]["ttft_ms"]["p50"]
    # one replica behind a router is the single engine
    one = sweep(lengths_workload(), CFG, UNIT, rates=[rate], slo=SLO(e2e_ms=40.0), workers=1)["points"][0]
    assert one == got[1]


def test_a_fleet_sweep_in_worker_processes_equals_one_here_and_seeds_the_router_with_each_runs_seed():
    w = lengths_workload(60)
    fleet = FleetSpec.uniform(3, CFG, UNIT, router=RouterConfig("random"))
    kw = dict(rates=[100.0, 200.0], seed=5, repeats=2, fleet=fleet)
    here, there = sweep(w, CFG, UNIT, workers=1, **kw), sweep(w, CFG, UNIT, workers=2, **kw)
    assert here == there and here["fleet"]["router"] == {"policy": "random", "staleness_ms": 0.0, "seed": 5}
    assert here["fleet"]["replicas"] == 3
    # the run with seed 6: arrivals of seed 6 and the router's draws of seed 6
    tr = simulate_fleet(retimed(w, 200.0, 6), FleetSpec.uniform(3, CFG, UNIT, router=RouterConfig("random", seed=6)),
                        record_kv=False)
    p99 = point_summary(tr, None)["ttft_ms"]["p99"]
    spread = here["points"][1]["repeats"]["ttft_p99_ms"]
    assert p99 in (spread["min"], spread["max"]) and here["points"][1]["seed"] == 5


def test_a_closed_loop_sweep_refuses_a_fleet():
    with pytest.raises(ConfigError, match="closed loop.*one engine.*--rates"):
        sweep(lengths_workload(10), CFG, UNIT, concurrency=[1, 2], fleet=FleetSpec.uniform(2, CFG, UNIT))


@pytest.mark.parametrize("rate,want", [(150.0, 2), (30.0, 1)])
def test_the_search_picks_the_cheapest_fleet_that_meets_the_slo_and_two_replicas_cost_twice(rate, want):
    usd = 3.6
    slo = SLO(e2e_ms=40.0)
    got = search(lengths_workload(), CFG, UNIT, {"replicas": [1, 2]}, rate, slo, target=0.9, usd_per_hour=usd,
                 workers=1)
    a = arrivals(rate)
    hand = {1: single_server(a), 2: round_robin(a, 2)}
    meets = {n: (h[:, 1] <= 40.0).mean() >= 0.9 for n, h in hand.items()}
    assert meets == {1: rate < 100, 2: True}
    assert got["best"]["config"] == {"replicas": want} and got["best"]["fleet"] == {"replicas": want,
                                                                                     "router": "round-robin"}
    for p in got["points"]:
        n = p["config"]["replicas"]
        assert p["usd_per_hour"] == usd * n
        if p.get("pruned"):       # stopped early: it would have missed
            assert not meets[n]
            continue
        h = hand[n]
        good = h[:, 1] <= 40.0
        last_emission = (a + h[:, 1]).max()
        goodput = good.sum() * OUT / (last_emission / 1000.0)
        assert p["slo"]["goodput_tok_per_s"] == pytest.approx(goodput, rel=1e-12)
        assert p["cost_per_1k_good_tokens_usd"] == pytest.approx(usd * n / 3600.0 / goodput * 1000.0, rel=1e-12)
    # without a price: the most goodput per replica, the same answer
    free = search(lengths_workload(), CFG, UNIT, {"replicas": [1, 2]}, rate, slo, target=0.9, workers=1)
    assert free["best"]["config"] == {"replicas": want}


def mixed(n=160, seed=3):
    rng = np.random.default_rng(seed)
    return Workload([Request(f"m{i}", 0.0, int(rng.integers(32, 600)), int(rng.integers(8, 80))) for i in range(n)],
                    name="mixed")


AFFINE = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.4)


@pytest.mark.parametrize("rate", [20.0, 45.0])
def test_early_stopping_on_fleets_never_drops_one_that_would_meet_the_target(rate):
    grid = {"replicas": [1, 2, 3], "router": ["random", "least-requests"], "max_seqs": [2, 16]}
    slo = SLO(ttft_ms=300.0, tpot_ms=12.0)
    kw = dict(target=0.9, usd_per_hour=1.0, workers=1)
    pruned = search(mixed(), SchedulerConfig("continuous"), AFFINE, grid, rate, slo, **kw)
    full = search(mixed(), SchedulerConfig("continuous"), AFFINE, grid, rate, slo, prune=False, **kw)
    assert pruned["pruned"] >= 1 and full["pruned"] == 0
    for p, f in zip(pruned["points"], full["points"]):
        assert p["config"] == f["config"]
        if p.get("pruned"):
            assert not f["meets"] and p["attainment_at_most"] >= f["slo"]["attainment"] - 1e-12
        else:
            assert p == f
    assert pruned["best"] == full["best"]


def test_disaggregated_configurations_are_simulated_in_full():
    grid = {"prefill_replicas": [1], "decode_replicas": [1, 2], "max_seqs": [2]}
    got = search(mixed(), SchedulerConfig("continuous"), AFFINE, grid, 45.0, SLO(ttft_ms=50.0), target=0.99,
                 usd_per_hour=2.0, workers=1)
    assert got["pruned"] == 0 and got["simulated"] == 2
    assert [p["fleet"] for p in got["points"]] == [{"replicas": 2, "prefill": 1, "decode": 1, "router": "round-robin"},
                                                   {"replicas": 3, "prefill": 1, "decode": 2, "router": "round-robin"}]
    assert [p["usd_per_hour"] for p in got["points"]] == [4.0, 6.0]


def test_fleet_points_written_to_a_shared_location_come_back_the_same(tmp_path):
    import duckdb
    args = (lengths_workload(60), CFG, UNIT, {"replicas": [1, 3]}, 150.0, SLO(e2e_ms=40.0))
    here = search(*args, usd_per_hour=2.0, workers=1)
    shared = search(*args, usd_per_hour=2.0, workers=1, results=str(tmp_path / "runs"))
    assert shared["points"] == here["points"] and shared["best"] == here["best"]
    rows = duckdb.connect().execute(f"SELECT job, usd_per_hour FROM read_parquet('{tmp_path}/runs/*.parquet') "
                                    "ORDER BY job").fetchall()
    assert rows == [(0, 2.0), (1, 6.0)]


def test_a_replicas_file_fleet_costs_its_replicas(tmp_path):
    f = tmp_path / "fleet.json"
    f.write_text(json.dumps([{"max_seqs": 4}, {"max_seqs": 8}, {}]))
    got = search(lengths_workload(40), CFG, UNIT, {"router": ["round-robin", "least-requests"]}, 50.0,
                 SLO(e2e_ms=100.0), usd_per_hour=1.0, workers=1, fleet=FleetFlags(replicas_file=str(f)))
    assert [p["fleet"]["replicas"] for p in got["points"]] == [3, 3]
    assert [p["usd_per_hour"] for p in got["points"]] == [3.0, 3.0]


def test_fleet_axes_are_read_and_refused_in_one_line():
    assert parse_grid(["replicas=1,2,4", "router=round-robin,prefix-aware"]) == \
        {"replicas": [1, 2, 4], "router": ["round-robin", "prefix-aware"]}
    assert parse_grid(["prefill_replicas=1,2", "decode-replicas=3"]) == {"prefill_replicas": [1, 2],
                                                                         "decode_replicas": [3]}
    for bad, said in ((["router=fastest"], "grid: router: expected one of round-robin, random"),
                      (["replicas=0"], r"grid: replicas: expected an integer in 1\.\.4096, got '0'"),
                      (["replicas=two"], "grid: replicas: expected an integer"),
                      (["replicas=none"], "grid: replicas: expected an integer"),
                      (["decode_replicas=-1"], "grid: decode_replicas: expected an integer"),
                      (["replicas=1,2", "prefill_replicas=1"], "replicas .* and prefill_replicas/decode_replicas")):
        with pytest.raises(ConfigError, match=said):
            parse_grid(bad)
    w, slo = lengths_workload(10), SLO(e2e_ms=50.0)
    for grid, flags, said in (({"prefill_replicas": [1]}, None, "prefill_replicas needs decode_replicas too"),
                              ({"decode_replicas": [1]}, None, "decode_replicas needs prefill_replicas too"),
                              ({"router": ["random"]}, None, "router needs a fleet"),
                              ({"replicas": [2]}, FleetFlags(prefill_replicas=1, decode_replicas=1),
                               "already given by --prefill-replicas"),
                              ({"prefill_replicas": [1], "decode_replicas": [1]}, FleetFlags(replicas=2),
                               "already given by --replicas")):
        with pytest.raises(ConfigError, match=said):
            search(w, CFG, UNIT, grid, 10.0, slo, workers=1, fleet=flags)
    # a decode count from the flags completes a prefill axis
    ok = search(w, CFG, UNIT, {"prefill_replicas": [1]}, 10.0, slo, workers=1, fleet=FleetFlags(decode_replicas=1))
    assert ok["points"][0]["fleet"]["replicas"] == 2


def test_a_router_axis_keeps_the_flags_parameters_for_the_flags_policy_only():
    flags = FleetFlags(replicas=2, router="prefix-aware", router_param=("balance_abs=64",), router_staleness_ms=5.0)
    grid = {"router": ["prefix-aware", "least-requests"]}
    specs = fleets(configurations(CFG, grid), UNIT, flags, seed=7)
    assert [s.router.policy for s in specs] == ["prefix-aware", "least-requests"]
    assert specs[0].router.params == {"cache_threshold": 0.3, "balance_abs": 64.0, "balance_rel": 1.5}
    assert specs[1].router.params == {} and {s.router.seed for s in specs} == {7}
    assert {s.router.staleness_ms for s in specs} == {5.0}


@pytest.fixture
def wfile(tmp_path):
    p = tmp_path / "w.json"
    p.write_text(json.dumps({"requests": [{"id": f"r{i}", "arrival_ms": 0, "prompt_tokens": PROMPT,
                                           "max_output_tokens": OUT} for i in range(N)]}))
    return str(p)


def test_the_command_lines(wfile, capsys):
    base = ["--max-seqs", "1", "--workers", "1"]
    assert main(["sweep", wfile, "--rates", "150", "--replicas", "2", "--slo-e2e-ms", "40", "--json", *base]) == 0
    out = json.loads(capsys.readouterr().out)
    hand = round_robin(arrivals(150.0), 2)
    assert out["points"][0]["e2e_ms"]["mean"] == pytest.approx(hand[:, 1].mean(), abs=1e-9)
    assert out["fleet"] == {"replicas": 2, "router": {"policy": "round-robin", "staleness_ms": 0.0, "seed": 0}}
    assert main(["sweep", wfile, "--rates", "150", "--replicas", "2", *base]) == 0
    assert "fleet of 2 replicas, router round-robin" in capsys.readouterr().out
    assert main(["sweep", wfile, "--concurrency", "2", "--replicas", "2", *base]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "closed loop" in err

    search_args = ["search", wfile, "--rate", "150", "--slo-e2e-ms", "40", "--usd-per-hour", "3.6", *base]
    assert main([*search_args, "--grid", "replicas=1,2", "router=round-robin,least-requests"]) == 0
    text = capsys.readouterr().out
    assert "replicas" in text.splitlines()[2] and "router" in text.splitlines()[2]
    assert "best: 2 replicas, router round-robin" in text and "at USD 7.2/h" in text
    for grid, said in ((["router=fastest"], "grid: router: expected one of"),
                       (["replicas=0"], "grid: replicas: expected an integer in 1..4096"),
                       (["prefill_replicas=1,2"], "grid: prefill_replicas needs decode_replicas too"),
                       (["router=random"], "grid: router needs a fleet")):
        assert main([*search_args, "--grid", *grid]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
