"""Adding a routing policy is one class and its test (issue 51): this file's toy policy, declared
here and nowhere else, runs in the fleet simulator, in `gpu_runner fleet` (which imports this
module with --router-module: ROUTER_POLICIES) and on the Fleet page. The expectations are the toy's
rule itself: every request goes to the last replica in rotation. (Registered for each test and
taken out after it, so that the other tests see the registry as shipped.)"""
import pytest

from core.fleet.router import POLICIES, POLICY_WORDS, REGISTRY, Decision, Policy, register

NAME = "last-in-line"


class LastInLine(Policy):
    name = NAME
    words = "sends every request to the last replica in rotation (a toy: the test of adding a policy)."

    @staticmethod
    def choose(router, cands, prompt_blocks):
        c = cands[-1]
        return Decision(c.replica, "the last replica in rotation", {})


ROUTER_POLICIES = [LastInLine]


@pytest.fixture(autouse=True)
def registered():
    register(LastInLine)
    yield
    REGISTRY.pop(NAME, None)


def test_the_registry_lists_it_with_its_words():
    assert NAME in POLICIES and POLICIES[-1] == NAME
    assert POLICY_WORDS[NAME].startswith("sends every request to the last replica")
    REGISTRY.pop(NAME)
    assert NAME not in POLICIES and NAME not in POLICY_WORDS   # (live views: never a stale copy)


def test_a_policy_without_its_own_choice_is_refused():
    from core.errors import ConfigError

    class NoChoice(Policy):
        name, words = "no-choice", "never chooses."
    with pytest.raises(ConfigError, match="no-choice: it needs its own choose"):
        register(NoChoice)
    assert "no-choice" not in POLICIES


def test_it_runs_in_the_fleet_simulator():
    from core.config import SchedulerConfig
    from core.fleet.router import RouterConfig
    from core.fleet.sim import FleetSpec, simulate_fleet
    from core.sim.stepmodel import StepModel
    from core.workload import Request, Workload
    w = Workload([Request(f"r{i}", 5.0 * i, 16, 4) for i in range(9)])
    tr = simulate_fleet(w, FleetSpec.uniform(3, SchedulerConfig(), StepModel(step_ms=1.0),
                                             router=RouterConfig(NAME)))
    routes = tr.events_of("route")
    assert [e["replica"] for e in routes] == [2] * 9
    assert {e["reason"] for e in routes} == {"the last replica in rotation"}
    assert set(tr.finishes["replica"].tolist()) == {2} and tr.meta["fleet"]["router"]["policy"] == NAME


def test_it_runs_in_gpu_runner_fleet(tmp_path):
    import httpx

    from core.trace import load_trace
    from tests.helpers import BOUND_S, start_fleet, stop_process
    proc, url, out = start_fleet(tmp_path, "--replicas", "2", "--router", NAME, "--router-module", __name__)
    try:
        for p in ("The ", "A list is", "import "):
            r = httpx.post(f"{url}/v1/completions", json={"prompt": p, "max_tokens": 4, "temperature": 0},
                           timeout=BOUND_S)
            assert r.status_code == 200, r.text
    finally:
        stop_process(proc)
    tr = load_trace(out)
    assert [e["replica"] for e in tr.events_of("route")] == [1, 1, 1]
    assert set(tr.finishes["replica"].tolist()) == {1}


def test_an_unknown_router_module_is_refused_in_one_line(capsys):
    from core.__main__ import main
    assert main(["simulate", "x.json", "--replicas", "2", "--router-module", "no.such.module"]) == 2
    err = capsys.readouterr().err
    assert "--router-module no.such.module: cannot import it" in err and "Traceback" not in err


def test_it_runs_on_the_fleet_page():
    from tests.helpers import charts, open_page
    at = open_page("fleet", {"fl_pol": NAME})
    assert not at.error
    lanes = next(f for f in charts(at) if (f["layout"].get("title") or {}).get("text", "").startswith(
        "Requests by replica"))
    replicas = {int(rep) for t in lanes["data"] if t["type"] == "bar" and t["name"].startswith("replica ")
                for _, rep, *_ in t["customdata"]}
    assert replicas == {3}     # (the page's default fleet: 4 replicas)
    marks = next(t for t in lanes["data"] if t["name"] == "routed here")
    assert all("why: the last replica in rotation" in text for text in marks["hovertext"])


def test_a_fresh_worker_process_learns_it_from_policy_setup():
    """The Fleet page's comparisons, sweeps and searches run their jobs in worker processes (loky's,
    started fresh, in a server of several threads): core.sim.parallel.run_all's `setup` registers
    the policy there first (core.fleet.router.policy_setup)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from core.config import SchedulerConfig
    from core.experiments.fleet import FleetSetup, _numbers_job
    from core.fleet.router import load_policies, policy_setup
    from core.sim.parallel import _set_up_then
    from core.sim.stepmodel import StepModel
    from core.workload import Request, Workload
    assert policy_setup() == (load_policies, [__name__])
    w = Workload([Request(f"r{i}", 5.0 * i, 16, 4) for i in range(8)])
    setup = FleetSetup(SchedulerConfig(), StepModel(step_ms=1.0), replicas=4, policy=NAME)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        got = pool.submit(_set_up_then, _numbers_job, policy_setup(), dict(workload=w, setup=setup, slo=None)).result(
            timeout=300)
    assert got["per_replica"] == [0, 0, 0, 8]


def test_the_weighted_policys_scorers_and_weights_are_data(monkeypatch):
    """Issue 51 item 2: a scorer is an entry of core.fleet.router.SCORERS and its default weight an
    entry of Weighted.params; the decision is the weighted sum, computed here by hand."""
    from core.fleet import router as rt
    from core.fleet.router import Router, RouterConfig, Signals
    monkeypatch.setitem(rt.SCORERS, "odd", lambda cands, pb: [float(s.replica % 2) for s in cands])
    monkeypatch.setattr(rt.Weighted, "params", {**rt.Weighted.params, "odd": 0.0})
    cfg = RouterConfig("weighted", params={"odd": 5.0})
    assert cfg.params == {"prefix": 2.0, "queue": 1.0, "kv": 1.0, "odd": 5.0}
    cands = [Signals(r, requests=2, running=2, waiting=0, kv_used_blocks=10 * r, kv_blocks=100, prefix_blocks=0)
             for r in range(3)]
    d = Router(cfg, 3, [100] * 3).choose(cands, 4)
    by_hand = {r: 2.0 * 0 + 1.0 * 1.0 + 1.0 * (1 - r / 10) + 5.0 * (r % 2) for r in range(3)}
    assert d.replica == 1 and d.scores == pytest.approx(by_hand)


def test_a_live_view_reads_the_registry_once_per_question():
    """`name in PREFIX_POLICIES` reads the registry once (a router asks at every routing: read per
    item, 10k routings on 4 replicas took 2.3-2.8 s instead of 1.4-1.7 s)."""
    from core.fleet.router import _LiveMap, _LiveNames
    reads = []
    names = _LiveNames(lambda: reads.append(1) or ("a", "b", "c"))
    table = _LiveMap(lambda: reads.append(1) or {"a": 1})
    for ask, expected in ((lambda: "c" in names, True), (lambda: "z" in names, False), (lambda: "a" in table, True),
                          (lambda: [*iter(names)], ["a", "b", "c"]), (lambda: [*iter(table)], ["a"])):
        reads.clear()
        assert ask() == expected and len(reads) == 1
