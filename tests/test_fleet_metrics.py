"""Fleet metrics (core/analysis/fleet.py: summary.fleet): per replica, the router and the KV
transfers. Expectations are worked by hand from the schedule (constant 1 ms steps, round-robin:
the i-th arrival goes to replica i mod n), from the link's arithmetic (latency + bytes /
bandwidth, shared fairly), and from the scheduler's own counters; the out-of-core path (DuckDB
over Parquet) must give the in-memory numbers."""
import json
import math

import pytest

from core.__main__ import main
from core.analysis import fleet as fl
from core.analysis.expr import Agg, Col
from core.analysis.metrics import summarize
from core.config import SchedulerConfig
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSpec, ReplicaSpec, simulate_fleet
from core.formulas.kv import MODELS
from core.sim.stepmodel import StepModel
from core.trace import load_trace
from core.trace.parquet import to_parquet_bytes, write_parquet_parts
from core.workload import Request, Workload, load_workload
from tests.conftest import DATA

pytest.importorskip("duckdb")
from core.analysis.outofcore import summarize_parquet

ROOT = DATA.parent
AFFINE = StepModel(kind="affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
BPT = MODELS["Llama-2-7B"].kv_bytes_per_token()          # 2 x 32 layers x 32 heads x 128 x 2 bytes


def fleet_of(tr) -> dict | None:
    return summarize(tr, per_request=False)["summary"].get("fleet")


def differences(a, b, path=""):
    """Where two fleet objects differ (floats to 1e-9 relative: sums and quantiles taken in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only on one side" for k in set(a) ^ set(b)]
        return out + [x for k in set(a) & set(b) for x in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [x for i, (p, q) in enumerate(zip(a, b)) for x in differences(p, q, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        ok = a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        return [] if ok else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


# ---- a tiny fleet worked by hand ---------------------------------------------------------------

def tiny():
    # r_i arrives at i ms with a 4+i token prompt (one step of prefill) and 3+i output tokens
    w = Workload([Request(f"r{i}", float(i), 4 + i, 3 + i) for i in range(4)], name="tiny")
    return simulate_fleet(w, FleetSpec.uniform(2, SchedulerConfig(), StepModel(step_ms=1.0),
                                               router=RouterConfig("round-robin")))


def test_a_tiny_round_robin_fleet_by_hand():
    f = fleet_of(tiny())
    # replica 0 gets r0 (0 ms, 3 tokens at 1, 2, 3) and r2 (2 ms, 5 tokens at 3..7): steps [0, 7), 7 of them;
    # replica 1 gets r1 (1 ms, 4 tokens at 2..5) and r3 (3 ms, 6 tokens at 4..9): steps [1, 9), 8 of them.
    # TTFT is one prefill step for all; E2E: r0 3, r2 5 | r1 4, r3 6; the drain window is [0, 9] ms.
    assert f["origin"] == "simulated" and f["window_ms"] == [0.0, 9.0]
    want = {0: (7, [3.0, 5.0]), 1: (8, [4.0, 6.0])}
    assert [r["replica"] for r in f["replicas"]] == [0, 1]
    for r in f["replicas"]:
        steps, e2e = want[r["replica"]]
        lo, hi = e2e
        assert (r["role"], r["requests"], r["prefilled"], r["routed"]) == ("both", 2, 0, 2)
        assert r["ttft_ms"] == {"n": 2, "mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}
        # type 7 on two values: lo + q (hi - lo)
        assert r["e2e_ms"] == pytest.approx({"n": 2, "mean": (lo + hi) / 2, "p50": (lo + hi) / 2,
                                             "p90": lo + 0.9 * (hi - lo), "p99": lo + 0.99 * (hi - lo)})
        assert (r["steps"], r["busy_ms"]) == (steps, float(steps))
        assert r["busy_fraction"] == pytest.approx(steps / 9.0)
        assert (r["prefix_hit_blocks"], r["prefix_hit_blocks_source"]) == (0, "kv")
        assert r["step_model"] == "constant: every step 1 ms"
    assert f["router"] == {"policy": "round-robin", "staleness_ms": 0.0, "routed_from": "route events",
                           "imbalance": 1.0, "rejected": 0}
    assert "transfers" not in f


def test_the_text_output_has_a_line_per_replica_and_the_router(tmp_path, capsys):
    path = tmp_path / "tiny.parquet"
    path.write_bytes(to_parquet_bytes(tiny()))
    assert main(["metrics", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fleet (simulated, step model constant: every step 1 ms): 2 replicas" in out
    assert "  replica 0 (both): 2 routed, 2 finished, 0 prefilled; TTFT p50 1.000 p99 1.000 ms, E2E p50 4.000 " \
           "p99 4.980 ms; 7 steps, busy 0.778, 0 prefix-hit blocks (kv)" in out
    assert "  replica 1 (both): 2 routed, 2 finished, 0 prefilled; TTFT p50 1.000 p99 1.000 ms, E2E p50 5.000 " \
           "p99 5.980 ms; 8 steps, busy 0.889" in out
    assert "  router round-robin, staleness 0 ms: imbalance (max/mean routed, from route events) 1.000; " \
           "0 rejected" in out


# ---- the router ---------------------------------------------------------------------------------

def test_imbalance_of_a_known_routing():
    # 7 arrivals round-robin over 3 replicas: 3, 2, 2 routed; max / mean = 3 / (7 / 3)
    w = Workload([Request(f"r{i}", 10.0 * i, 8, 2) for i in range(7)], name="seven")
    f = fleet_of(simulate_fleet(w, FleetSpec.uniform(3, SchedulerConfig(), StepModel(step_ms=1.0),
                                                     router=RouterConfig("round-robin"))))
    assert [r["routed"] for r in f["replicas"]] == [3, 2, 2] == [r["requests"] for r in f["replicas"]]
    assert f["router"]["imbalance"] == pytest.approx(9 / 7)


def test_the_policy_comparison_and_the_fleet_summary_report_one_imbalance_on_a_disaggregated_fleet():
    """Worked by hand on the bundled PD fleet: its prefill replicas' routed counts (route events
    naming them), max / mean; the policy comparison (core.analysis.routing.fleet_numbers, which
    bench/fleet_routing.py prints) reports that same number, not the worst of the two roles."""
    from core.analysis.routing import fleet_numbers
    tr = load_trace(DATA / "traces" / "fleet_pd.json.gz")
    roles = [r["role"] for r in tr.meta["fleet"]["replicas"]]
    routed = [0] * len(roles)
    for e in tr.events_of("route"):
        for k in (e.get("replica"), e.get("decode")):
            if isinstance(k, int) and k >= 0:
                routed[k] += 1
    first = [c for c, r in zip(routed, roles) if r in ("both", "prefill")]
    want = max(first) / (sum(first) / len(first))
    assert fleet_of(tr)["router"]["imbalance"] == pytest.approx(want)
    assert fleet_numbers(tr)["imbalance"] == pytest.approx(want)


def test_rejections_at_the_router_and_routes_counted_from_finishes_without_route_events():
    # the only replica leaves rotation at 5 ms: b (10 ms) is rejected at the router
    w = Workload([Request("a", 0.0, 8, 2), Request("b", 10.0, 8, 2)], name="w")
    tr = simulate_fleet(w, FleetSpec([ReplicaSpec(SchedulerConfig(), drain_ms=5.0)]))
    f = fleet_of(tr)
    assert f["router"]["rejected"] == 1 and f["router"]["imbalance"] == 1.0
    assert [(r["replica"], r["routed"], r["requests"]) for r in f["replicas"]] == [(0, 1, 1)]
    tr.other = [e for e in tr.other if e.get("type") != "route"]
    f = fleet_of(tr)
    assert f["router"]["routed_from"] == "finishes" and f["replicas"][0]["routed"] == 1


# ---- disaggregated prefill/decode -------------------------------------------------------------------

def pd_trace():
    # one short prompt (under pd_min_prompt: runs whole on the decode replica, 200 tokens, keeping it busy in
    # 1 ms steps from 0 ms) and two 64-token prompts (4 blocks of 16, nothing shared) prefilled together on the
    # prefill replica in [0, 1) ms, then moved at once over a 1 GB/s link with 0.5 ms latency
    reqs = [Request("short", 0.0, 20, 200, prompt_ids=tuple(range(20)))] + [
        Request(f"long{i}", 0.0, 64, 4, prompt_ids=tuple(range(1000 * (i + 1), 1000 * (i + 1) + 64)))
        for i in range(2)]
    spec = FleetSpec.disagg(1, 1, SchedulerConfig(prefix_caching=True), StepModel(step_ms=1.0),
                            router=RouterConfig("round-robin"), kv_bytes_per_token=BPT, model="Llama-2-7B",
                            link_gbps=1.0, link_latency_ms=0.5, pd_min_prompt=50)
    return simulate_fleet(Workload(reqs, name="pd"), spec)


def test_transfer_stats_of_a_disaggregated_run_by_hand():
    f = fleet_of(pd_trace())
    nbytes = 4 * 16 * BPT
    dur = 0.5 + 2 * nbytes / 1e6        # equal transfers started together: each gets half of 1e6 bytes/ms
    x = f["transfers"]
    assert (x["count"], x["bytes"], x["blocks"]) == (2, 2 * nbytes, 8)
    assert x["mean_ms"] == pytest.approx(dur) and x["p99_ms"] == pytest.approx(dur)
    # the transfers start at the prefill's end (1 ms): the first token waited on the link for all of dur_ms
    assert x["waited_ms_mean"] == pytest.approx(dur)
    # they end at 1 + dur = 68.6 ms, inside the decode replica's [68, 69) step: admitted at 69 ms
    assert x["decode_admit_wait_ms_mean"] == pytest.approx(69.0 - (1.0 + dur))
    pre, dec = f["replicas"]
    assert (pre["role"], pre["routed"], pre["requests"], pre["prefilled"], pre["steps"]) == ("prefill", 2, 0, 2, 1)
    assert pre["ttft_ms"]["n"] == 0 and pre["ttft_ms"]["p50"] is None
    assert (dec["role"], dec["routed"], dec["requests"], dec["prefilled"]) == ("decode", 3, 3, 0)
    # TTFT: short 1 ms (its own prefill step); long ones: token 0 at the end of the 69 ms step = 70 ms.
    # E2E: short 200 tokens, the last at 200 ms; long 4 tokens at 70..73 ms
    assert dec["ttft_ms"]["mean"] == pytest.approx((1 + 70 + 70) / 3) and dec["ttft_ms"]["p50"] == 70.0
    assert dec["e2e_ms"]["mean"] == pytest.approx((200 + 73 + 73) / 3)
    assert dec["busy_fraction"] == 1.0 and pre["busy_fraction"] == pytest.approx(1 / 200)
    assert f["router"]["imbalance"] == 1.0 and f["router"]["imbalance_decode"] == 1.0


def test_prefix_hits_from_kv_rows_agree_with_the_schedulers_counters_and_stand_in_for_them():
    w = load_workload(ROOT / "data" / "workloads" / "shared_prefix_200.json")
    tr = simulate_fleet(w, FleetSpec.uniform(2, SchedulerConfig(prefix_caching=True), AFFINE,
                                             router=RouterConfig("prefix-aware")))
    counters = [r["stats"]["prefix_hit_blocks"] for r in tr.meta["fleet"]["replicas"]]
    assert min(counters) > 0
    f = fleet_of(tr)
    assert [(r["prefix_hit_blocks"], r["prefix_hit_blocks_source"]) for r in f["replicas"]] == \
        [(c, "kv") for c in counters]
    tr.kv = tr.kv.iloc[:0]
    assert [(r["prefix_hit_blocks"], r["prefix_hit_blocks_source"]) for r in fleet_of(tr)["replicas"]] == \
        [(c, "meta") for c in counters]


# ---- one definition, two evaluators ------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    w = load_workload(ROOT / "data" / "workloads" / "shared_prefix_200.json")
    cfg = SchedulerConfig(prefix_caching=True)
    out = {"uniform": simulate_fleet(w, FleetSpec.uniform(3, cfg, AFFINE, router=RouterConfig("least-kv"))),
           "pd": simulate_fleet(w, FleetSpec.disagg(1, 3, cfg, AFFINE, router=RouterConfig("least-requests"),
                                                    kv_bytes_per_token=BPT, model="Llama-2-7B", pd_min_prompt=300)),
           "tiny": tiny()}
    paths = {}
    for name, tr in out.items():
        d = tmp_path_factory.mktemp(name)
        (d / "t.parquet").write_bytes(to_parquet_bytes(tr))
        write_parquet_parts(tr, d / "parts", rows_per_part=997)
        paths[name] = (tr, d / "t.parquet", d / "parts")
    return paths


@pytest.mark.parametrize("name", ("uniform", "pd", "tiny"))
def test_out_of_core_equals_in_memory(fleets, name):
    tr, file, parts = fleets[name]
    want = fleet_of(tr)
    assert want is not None and ("transfers" in want) == (name == "pd")
    for where in (file, parts):
        assert differences(want, summarize_parquet(where)["summary"]["fleet"]) == [], (name, where.name)


def test_the_cli_json_in_memory_equals_out_of_core(fleets, capsys):
    _, file, _ = fleets["pd"]
    got = []
    for extra in ([], ["--out-of-core"]):
        assert main(["metrics", str(file), "--json", *extra]) == 0
        got.append(json.loads(capsys.readouterr().out)["summary"]["fleet"])
    assert got[0]["transfers"]["count"] > 0 and differences(*got) == []


def test_a_fleet_metric_is_defined_once_for_both_paths(fleets, monkeypatch):
    """Change a definition in core/analysis/fleet.py and both evaluators follow."""
    tr, file, _ = fleets["pd"]
    before = fleet_of(tr)
    monkeypatch.setitem(fl.PER_REPLICA["replica_step"], "busy_ms",
                        lambda r: Agg("fsum", 2.0 * Col("dur_ms"), where=Col("replica").eq(r)))
    monkeypatch.setitem(fl.FLEET_REQUEST, "transfer_end_ms", Col("transfer_start_ms") + Col("transfer_ms") + 1.0)
    for after in (fleet_of(tr), summarize_parquet(file)["summary"]["fleet"]):
        for a, b in zip(after["replicas"], before["replicas"]):
            assert a["busy_ms"] == pytest.approx(2 * b["busy_ms"], rel=1e-12)
        x, y = after["transfers"], before["transfers"]
        assert x["waited_ms_mean"] == pytest.approx(y["waited_ms_mean"] + 1.0, rel=1e-12)
        assert x["decode_admit_wait_ms_mean"] == pytest.approx(y["decode_admit_wait_ms_mean"] - 1.0, rel=1e-12)


# ---- what is not a fleet, and what a fleet trace may hold badly ---------------------------------------------

def test_a_single_engine_trace_has_no_fleet_object(capsys):
    path = DATA / "traces" / "chapter31_continuous.json"
    assert "fleet" not in summarize(load_trace(path))["summary"]
    assert main(["metrics", str(path)]) == 0
    assert "fleet" not in capsys.readouterr().out


def test_a_trace_whose_rows_name_replicas_is_a_fleet_without_meta():
    tr = tiny()
    del tr.meta["fleet"]
    f = fleet_of(tr)
    assert [(r["replica"], r["role"], r["step_model"], r["requests"]) for r in f["replicas"]] == \
        [(0, "both", None, 2), (1, "both", None, 2)]
    assert f["router"]["policy"] is None and f["router"]["imbalance"] == 1.0


def test_unreadable_fleet_fields_are_noted_or_missing_the_same_way_on_both_paths(tmp_path, capsys):
    tr = pd_trace()
    tr.meta["fleet"]["replicas"][1]["role"] = "sideways"
    tr.meta["fleet"]["router"]["staleness_ms"] = "soon"
    tr.meta["fleet"]["replicas"].append({"replica": "x"})
    for e in tr.other:
        if e.get("type") == "route" and e["req"] == "long0":
            e["replica"] = "zero"              # not a number: missing (routed to nobody)
        if e.get("type") == "transfer" and e["req"] == "long1":
            e["bytes"] = True                  # not a number: missing
    f = fleet_of(tr)
    assert f["replicas"][1]["role"] == "both" and f["replicas"][0]["routed"] == 1
    assert f["transfers"]["bytes"] == 4 * 16 * BPT
    assert any("role" in n and "sideways" in n for n in f["notes"])
    assert any("meta.fleet.replicas[2]" in n for n in f["notes"])
    assert f["router"]["staleness_ms"] is None
    path = tmp_path / "odd.parquet"
    path.write_bytes(to_parquet_bytes(tr))
    assert differences(f, summarize_parquet(path)["summary"]["fleet"]) == []
    assert main(["metrics", str(path)]) == 0
    assert "  router round-robin: imbalance" in capsys.readouterr().out


BEGIN, END = "<!-- fleet fields: begin -->", "<!-- fleet fields: end -->"


def test_every_field_is_defined_once_and_documented(fleets):
    def paths(x, prefix=""):
        for k, v in x.items():
            p = f"{prefix}{k}"
            yield p
            if isinstance(v, dict) and k in ("router", "transfers"):
                yield from paths(v, p + ".")
            if k == "replicas":
                for row in v:
                    yield from (f"replicas[].{q}" for q in row)
    assert set(paths(fleet_of(fleets["pd"][0]))) == set(fl.FIELDS)
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert "## Fleet metrics" in doc
    got = doc[doc.index(BEGIN) + len(BEGIN):doc.index(END)].strip()
    assert got == fl.fields_markdown().strip(), \
        "docs/metrics.md is stale: regenerate its fleet table with python -m tests.test_fleet_metrics"


if __name__ == "__main__":  # rewrite the fleet table in docs/metrics.md
    path = ROOT / "docs" / "metrics.md"
    doc = path.read_text()
    path.write_text(doc[:doc.index(BEGIN) + len(BEGIN)] + "\n" + fl.fields_markdown() + doc[doc.index(END):])


def test_a_fleets_step_summary_and_utilisation_say_what_they_add_up():
    """A fleet's busy fraction is the mean replica's (never over 1), its peaks are one replica's (named so)."""
    from core.analysis.metrics import step_summary, utilisation
    from core.config import SchedulerConfig
    from core.fleet.sim import FleetSpec, simulate_fleet
    from core.sim.stepmodel import StepModel
    from core.workload import Request, Workload
    # two replicas, round-robin, two identical requests at t=0: each replica busy for the same 4 steps of 1 ms
    w = Workload([Request("a", 0.0, 8, 4), Request("b", 0.0, 8, 4)], name="two")
    tr = simulate_fleet(w, FleetSpec.uniform(2, SchedulerConfig(), StepModel(step_ms=1.0)))
    st = step_summary(tr)
    assert (st["steps"], st["busy_ms"], st["replicas"]) == (8, 8.0, 2)
    assert st["busy_fraction"] == pytest.approx(8.0 / (4.0 * 2))      # both replicas busy all 4 ms: 1.0
    u = utilisation(tr)
    assert u["replicas"] == 2 and u["running_peak_one_replica"] == 1 and "running_peak" not in u
    assert u["running_mean"] == pytest.approx(2.0)                     # the fleet holds 2 all along
    assert "kv_used_fraction_peak" not in u
