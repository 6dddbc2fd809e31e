"""The Fleet page and the replay page's fleet views, headless (AppTest), and the fleet figures.
Expectations are computed here from a fleet run made directly with core.fleet (the page's
defaults written out by hand) or from the trace's own tables: the router's route events, kv rows
counted by replica, first tokens minus arrivals."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from core.config import SchedulerConfig
from core.fleet.router import RouterConfig
from core.fleet.sim import FleetSpec, simulate_fleet
from core.formulas.kv import MODELS
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload, load_workload
from tests.conftest import DATA
from tests.helpers import arr, charts, fleet_e2e_error_median, open_page

# the page's defaults: shared_prefix_200 arriving 4x as fast, 4 replicas, prefix-aware, prefix caching, enough KV
AFFINE = StepModel(kind="affine", base_ms=5.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2)
CONFIG = SchedulerConfig(prefix_caching=True)


def four_times_as_fast() -> Workload:
    w = load_workload(DATA / "workloads" / "shared_prefix_200.json")
    return Workload([dataclasses.replace(r, arrival_ms=r.arrival_ms / 4) for r in w.requests], w.name)


@pytest.fixture(scope="module")
def default_run():
    return simulate_fleet(four_times_as_fast(), FleetSpec.uniform(4, CONFIG, AFFINE,
                                                                  router=RouterConfig("prefix-aware")))


def routed(trace) -> dict[str, tuple[int, int]]:
    """Request id -> (replica, decode replica or -1), from the route events."""
    return {e["req"]: (e["replica"], e.get("decode", -1)) for e in trace.events_of("route")}


def figure(at, title_start):
    for f in charts(at):
        if (f["layout"].get("title") or {}).get("text", "").startswith(title_start):
            return f
    raise AssertionError(f"no figure titled {title_start!r}")


def ttft_by_hand(trace) -> np.ndarray:
    first = trace.tokens.groupby("req")["t_ms"].min()
    return first.to_numpy() - trace.requests["arrival_ms"].to_numpy()[first.index.to_numpy()]


def test_the_page_with_defaults_draws_what_the_fleet_did(default_run):
    at = open_page("fleet")
    assert not at.error
    said = " ".join(m.value for m in at.markdown)
    assert ":orange-badge[simulated]" in said and "affine" in said and "5 ms + 0.05 ms x prefill tokens" in said
    # lanes: each replica's bars hold exactly the requests the router sent there
    lanes = figure(at, "Requests by replica")
    drawn = {}
    for t in lanes["data"]:
        if t["type"] == "bar" and t["name"].startswith("replica "):
            for rid, rep, *_ in t["customdata"]:
                drawn[rid] = int(rep)
                assert int(t["name"].split()[1]) == int(rep)
    assert drawn == {rid: rep for rid, (rep, _) in routed(default_run).items()}
    # the hover carries the router's reason
    marks = next(t for t in lanes["data"] if t["name"] == "routed here")
    reasons = {e["req"]: e["reason"] for e in default_run.events_of("route")}
    for (rid, _), text in zip(marks["customdata"], marks["hovertext"]):
        assert f"why: {reasons[rid]}" in text
    # hit bars: kv rows with op "hit", counted by replica
    hits = figure(at, "Prefix-cache hits per replica")
    kv = default_run.kv
    expect = kv[kv["op"] == "hit"].groupby("replica").size().reindex(range(4), fill_value=0).tolist()
    assert arr(hits["data"][0]["y"]) == expect
    # running per replica: the first points of each replica's line are its first steps' running counts
    signals = figure(at, "Each replica over time")
    for r in range(4):
        line = next(t for t in signals["data"] if t["name"] == f"r{r}" and t.get("yaxis", "y") == "y")
        steps = default_run.steps[default_run.steps["replica"] == r]
        assert arr(line["y"])[0] == steps["running"].iloc[0] and arr(line["x"])[0] == steps["t_ms"].iloc[0]
    # the headline numbers and the policy table's own row for the chosen policy
    metrics = {m.label: m.value for m in at.metric}
    p99 = np.percentile(ttft_by_hand(default_run), 99)
    assert float(metrics["TTFT p99 ms"].replace(",", "")) == pytest.approx(p99, abs=1e-3)
    assert not len(default_run.preempts)      # (enough KV: every hit is on a first admission)
    hit_rate = len(kv[kv["op"] == "hit"]) / sum(e["prompt_blocks"] for e in default_run.events_of("route"))
    assert metrics["prefix hit rate"] == f"{hit_rate:.1%}"
    table = next(d.value for d in at.dataframe if "policy" in d.value.columns).set_index("policy")
    assert table.loc["prefix-aware", "TTFT p99 ms"] == pytest.approx(p99)
    counts = np.bincount([rep for rep, _ in routed(default_run).values()], minlength=4)
    assert table.loc["prefix-aware", "imbalance"] == pytest.approx(counts.max() / counts.mean())
    from core.fleet.router import POLICIES
    assert sorted(table.index) == sorted(POLICIES) and len(POLICIES) == 8   # every registered policy, once


def test_disaggregated_lanes_put_prefill_and_decode_on_the_routed_replicas():
    at = open_page("fleet", {"fl_dis": "true", "fl_p": "1", "fl_d": "2", "fl_pol": "least-requests"})
    assert not at.error
    w = four_times_as_fast()
    spec = FleetSpec.disagg(1, 2, CONFIG, AFFINE, router=RouterConfig("least-requests"),
                            kv_bytes_per_token=MODELS["Llama-2-7B"].kv_bytes_per_token(2), model="Llama-2-7B")
    tr = simulate_fleet(w, spec)
    routes = routed(tr)
    lanes = figure(at, "Requests by replica")
    by_name = {t["name"]: t for t in lanes["data"]}
    prefill = {rid: int(rep) for rid, rep, _ in by_name["prefill"]["customdata"]}
    decode = {rid: int(rep) for rid, rep, _ in by_name["decode"]["customdata"]}
    assert prefill == {rid: p for rid, (p, _) in routes.items()}
    assert decode == {rid: d for rid, (_, d) in routes.items()}
    xfer = {e["req"]: e for e in tr.events_of("transfer")}
    bars = by_name["KV transfer"]
    axis = max(float(x) for t in lanes["data"] if t["type"] == "bar" for x in arr(t["base"]) + arr(t["x"]))
    for (rid, rep, dur), base, drawn in zip(bars["customdata"], arr(bars["base"]), arr(bars["x"])):
        assert int(rep) == xfer[rid]["dst"]
        assert base == pytest.approx(xfer[rid]["t_ms"]) and float(dur) == pytest.approx(xfer[rid]["dur_ms"])
        # issue 48 item 10: a transfer of a few ms on a seconds-long axis is drawn wide enough to see
        assert drawn >= max(float(dur), axis / 150)
    assert figure(at, "KV transfers: 200")


def test_a_drained_replica_gets_no_requests_after_the_drain():
    at = open_page("fleet", {"fl_drain": "true", "fl_dr": "1", "fl_dt": "1000"})
    lanes = figure(at, "Requests by replica")
    assert any(s.get("type") == "line" and s.get("x0") == 1000 for s in lanes["layout"]["shapes"])
    marks = next(t for t in lanes["data"] if t["name"] == "routed here")
    late = [rid for (rid, rep), x in zip(marks["customdata"], arr(marks["x"])) if int(rep) == 1 and x > 1000]
    early = [rid for (rid, rep), x in zip(marks["customdata"], arr(marks["x"])) if int(rep) == 1 and x <= 1000]
    assert late == [] and early
    assert any("Replica 1 left rotation at 1000 ms" in c.value and "**0** requests" in c.value for c in at.caption)


def test_a_drain_replica_outside_the_fleet_is_a_clear_message():
    at = open_page("fleet", {"fl_drain": "true", "fl_dr": "6", "fl_n": "4"})
    assert [e.value for e in at.error] == ["Fleet settings: drain\\: replica 6 is not in this fleet of 4 "
                                           "(replicas 0..3)"]
    assert not charts(at)


def test_the_experiments_run_in_their_tabs(default_run):
    at = open_page("fleet", {"fl_tab": "Stale router", "fl_s_max": "50"})
    fig = figure(at, "TTFT p99 as the router")
    lines = {t["name"]: t for t in fig["data"]}
    assert set(lines) == {"prefix-aware (the sidebar's)", "round-robin", "least-requests"}
    assert list(lines["round-robin"]["x"]) == ["0", "5", "10", "20", "50"]
    # round-robin never reads the signals: staleness changes nothing; at 0 ms prefix-aware is the page's own run
    assert len(set(arr(lines["round-robin"]["y"]))) == 1
    assert arr(lines["prefix-aware (the sidebar's)"]["y"])[0] == \
        pytest.approx(np.percentile(ttft_by_hand(default_run), 99))
    at = open_page("fleet", {"fl_tab": "P:D split", "fl_t": "3"})
    fig = figure(at, "Goodput by prefill:decode split")
    assert list(fig["data"][0]["x"]) == ["1P:2D", "2P:1D", "3 whole"]
    table = next(d.value for d in at.dataframe if "split" in d.value.columns)
    assert (table["SLO met"] <= 1).all() and (table["goodput req/s"] >= 0).all()


def test_the_replay_page_shows_the_fleet_views_of_a_fleet_trace(tmp_path, monkeypatch, default_run):
    from core.trace import save_trace
    save_trace(default_run, tmp_path / "fleet4.json.gz")
    monkeypatch.setenv("SERVING_EXPLORER_TRACES", str(tmp_path))
    at = open_page("replay", {"tr": "fleet4.json.gz"})
    assert any(h.value == "Fleet" for h in at.header)
    assert any("4 replicas; router prefix-aware" in m.value for m in at.markdown)
    lanes = figure(at, "Requests by replica")
    drawn = {rid: int(rep) for t in lanes["data"] if t["name"].startswith("replica ")
             for rid, rep, *_ in t["customdata"]}
    assert drawn == {rid: rep for rid, (rep, _) in routed(default_run).items()}
    kv = default_run.kv
    assert arr(figure(at, "Prefix-cache hits per replica")["data"][0]["y"]) == \
        kv[kv["op"] == "hit"].groupby("replica").size().reindex(range(4), fill_value=0).tolist()
    # one replica picked: the page's metrics are that replica's requests (counted here from the routes)
    at.selectbox(key="rp_replica").set_value("replica 2 (both)").run()
    assert not at.exception, at.exception
    mine = sorted(rid for rid, (rep, _) in routed(default_run).items() if rep == 2)
    table = at.dataframe[[k for k, df in enumerate(at.dataframe) if "ttft_ms" in df.value][0]].value
    assert sorted(table["id"]) == mine
    at = open_page("replay", {"tr": "chapter31_continuous.json"})     # one engine: no fleet views
    assert not any(h.value == "Fleet" for h in at.header)
    assert not [s for s in at.selectbox if s.key == "rp_replica"]


# ---- the figures on their own ---------------------------------------------------------------------

def test_past_max_lanes_a_heatmap_counts_every_route_per_replica():
    from core.figures.fleet import fleet_lanes
    reqs = [Request(f"r{i}", 2.0 * i, 8 + i % 5, 3) for i in range(320)]
    tr = simulate_fleet(Workload(reqs), FleetSpec.uniform(3, SchedulerConfig(), StepModel("constant", step_ms=1.0),
                                                          router=RouterConfig("random", seed=1)))
    fig = fleet_lanes(tr)
    heat = fig.data[0]
    assert heat.type == "heatmap" and list(heat.y) == ["r0", "r1", "r2"]
    routed_per_replica = np.asarray(heat.customdata)[:, :, 1].sum(axis=1)
    assert routed_per_replica.tolist() == np.bincount([e["replica"] for e in tr.events_of("route")]).tolist()


def test_bin_averages_of_running_requests_by_hand():
    from core.figures.fleet import _running_average
    # 2 running for 5 ms from 0, nothing, then 4 running for 5 ms from 10: bins [0, 10) and [10, 20)
    got = _running_average(np.array([0.0, 10.0]), np.array([5.0, 5.0]), np.array([2.0, 4.0]),
                           np.array([0.0, 10.0, 20.0]))
    assert got.tolist() == [1.0, 2.0]


def test_fleet_numbers_on_a_trace_without_kv_rows_read_the_replicas_own_counts(default_run):
    from core.analysis.routing import fleet_numbers
    spec = FleetSpec.uniform(4, CONFIG, AFFINE, router=RouterConfig("prefix-aware"))
    lean = simulate_fleet(four_times_as_fast(), spec, record_kv=False)
    assert not len(lean.kv)
    a, b = fleet_numbers(default_run), fleet_numbers(lean)
    assert a == b
    kv = default_run.kv
    assert a["hit_blocks"] == int((kv["op"] == "hit").sum())
    assert a["per_replica"] == pd.Series([e["replica"] for e in default_run.events_of("route")]).value_counts() \
        .reindex(range(4), fill_value=0).tolist()


def test_a_trace_with_replica_columns_but_no_router_events_still_has_its_replicas(default_run):
    """An imported fleet trace may carry only the replica columns: each request's replica is then
    the one its tokens came from, which for whole requests is the router's choice."""
    from core.analysis.routing import has_replicas, request_replicas
    bare = dataclasses.replace(default_run, meta={k: v for k, v in default_run.meta.items() if k != "fleet"},
                               other=[e for e in default_run.other if e.get("type") != "route"])
    assert has_replicas(bare)
    got = dict(zip(bare.requests["id"], request_replicas(bare)["replica"].tolist()))
    assert got == {rid: rep for rid, (rep, _) in routed(default_run).items()}
    one = dataclasses.replace(bare, tokens=bare.tokens.assign(replica=0), finishes=bare.finishes.assign(replica=0),
                              steps=bare.steps.assign(replica=0), kv=bare.kv.assign(replica=0))
    assert not has_replicas(one)


def test_animation_tab_plays_the_pages_run(default_run):
    at = open_page("fleet", {"fl_tab": "Animation"})
    fig = charts(at)[-1]
    assert 1 < len(fig["frames"]) <= 200 and fig["layout"]["meta"]["mode"] == "requests"
    # the frame before the last (which shows them leaving) is the run's end: the last finish
    assert fig["layout"]["meta"]["t_ms"][-2] == pytest.approx(float(default_run.finishes["t_ms"].max()), rel=1e-6)


def test_lesson_tab_tables_are_the_lessons_runs():
    from core.lessons.fleet import lesson_sections
    at = open_page("fleet", {"fl_tab": "Lesson"})
    sections = lesson_sections()
    assert len(at.dataframe) == len(sections)
    wins = next(s for s in sections if s["key"] == "wins")
    shown = at.dataframe[0].value
    for row, tr in zip(shown.to_dict("records"), wins["traces"].values()):
        assert row["prefix-hit blocks"] == int((tr.kv["op"] == "hit").sum())   # counted here from the trace


def test_measured_fleets_tab_shows_a_real_fleet_and_the_simulator_beside_it():
    """The bundled gpu_runner fleet runs: the error table's numbers are computed here from the
    trace and the simulated trace (not read from the page's own report), and each point of the
    E2E scatter is one request's (measured, simulated) pair."""
    from core.analysis.metrics import request_metrics
    from core.fit.fleet import predict_fleet
    from core.trace import load_trace
    at = open_page("fleet", {"fl_tab": "Measured"})
    pick = at.selectbox(key="fl_measured")
    assert pick.value.startswith("gpu_runner fleet: ")
    path = DATA / "traces" / f"fleet_{pick.value.removeprefix('gpu_runner fleet: ').replace(' ', '_')}.json.gz"
    tr = load_trace(path)
    sim, _, _ = predict_fleet(tr)
    m, s = request_metrics(tr), request_metrics(sim)
    s_e2e = dict(zip(s["id"], s["e2e_ms"]))
    err = np.array([abs(s_e2e[r] - e) / e for r, e in zip(m["id"], m["e2e_ms"])])
    row = at.dataframe[0].value.to_dict("records")[0]
    assert row["E2E error median"] == f"{np.median(err):.1%}"
    agree = np.mean([(e["replica"], e.get("decode")) == (f["replica"], f.get("decode"))
                     for e, f in zip(tr.events_of("route"), sim.events_of("route"))])
    assert row["routing agreement"] == f"{agree:.0%}"
    fig = figure(at, "E2E per request: simulated vs measured")
    pts = sorted((x, y) for t in fig["data"][1:] for x, y in zip(arr(t["x"]), arr(t["y"])))
    assert len(pts) == len(tr.requests)
    assert pts == pytest.approx(sorted(zip(m["e2e_ms"], [s_e2e[r] for r in m["id"]])))
    # issue 48 item 14: each point is labelled by the replica that served the request (disaggregated: the
    # decode replica, where its tokens came from), and the decode replica's fitted terms are explained
    served = {e["req"]: (e["decode"] if e.get("decode", -1) >= 0 else e["replica"]) for e in tr.events_of("route")}
    roles = [r["role"] for r in tr.meta["fleet"]["replicas"]]
    for t in fig["data"][1:]:
        k = int(t["name"].split()[1])
        assert {served[c[0]] for c in t["customdata"]} == {k}
        assert roles[k] == "both" or f"({roles[k]})" in t["name"]
    if "decode" in roles:
        assert any("cost of taking one in" in c.value for c in at.caption)
    # a fleet behind another router: its views, no simulation (its decisions are not in the trace)
    names = [o for o in pick.options if o.startswith("sglang-router")]
    if names:
        at = pick.set_value(names[0]).run()
        assert not at.exception
        assert any("was not ours" in c.value for c in at.caption)


def test_a_repeated_fleet_run_shows_its_errors_as_multiples_of_its_repeat_floor():
    """Issue 49 item 5: a bundled run with repeats (data/imports/fleet_repeats): the TTFT error and the
    floor, both computed here — the floor pairing the three repeats' requests by prompt by hand."""
    import itertools

    from core.analysis.metrics import request_metrics
    from core.fit.fleet import predict_fleet
    from core.trace import load_trace
    at = open_page("fleet", {"fl_tab": "Measured"})
    at = at.selectbox(key="fl_measured").set_value("gpu_runner fleet, repeated: rr r1").run()
    assert not at.exception
    rep = DATA / "imports" / "fleet_repeats"
    traces = [load_trace(rep / f"rr_r{i}.json.gz") for i in (1, 2, 3)]
    by_prompt = []
    for tr in traces:
        ttft = dict(zip(request_metrics(tr)["id"], request_metrics(tr)["ttft_ms"]))
        by_prompt.append({tuple(r.prompt_ids): ttft[r.id] for r in tr.workload().requests})
    pair = [np.median([abs(a[k] - b[k]) / b[k] for k in b]) for a, b in itertools.permutations(by_prompt, 2)]
    floor = float(np.median(pair))
    sim, _, _ = predict_fleet(traces[0])
    m, s = request_metrics(traces[0]), request_metrics(sim)
    s_ttft = dict(zip(s["id"], s["ttft_ms"]))
    err = float(np.median([abs(s_ttft[r] - t) / t for r, t in zip(m["id"], m["ttft_ms"])]))
    row = at.dataframe[0].value.to_dict("records")[0]
    assert row["TTFT error median"] == f"{err:.1%}"
    assert row["TTFT x floor"] == f"{err / floor:.1f}x"
    assert any(f"TTFT {floor:.1%}" in c.value for c in at.caption)


def test_the_replica_picked_on_the_replay_page_is_in_the_link():
    """Issue 48 item 6: the replica picker was not in the URL, so a link reopened the whole fleet."""
    at = open_page("replay", {"tr": "fleet_two.json.gz"})
    at.selectbox(key="rp_replica").set_value("replica 1 (both)").run()
    assert ("rp_replica", "replica 1 (both)") in at.session_state["_view_query"]
    again = open_page("replay", dict(at.session_state["_view_query"]))
    assert again.selectbox(key="rp_replica").value == "replica 1 (both)"
    assert not again.exception


def test_the_whole_fleet_cursor_views_add_up_the_replicas():
    """Issue 48 item 2: on fleet_two.json.gz at 5,000 ms the whole-fleet KV view said "421 free, 91 owned" of
    512 blocks while replica 0 held 37 and replica 1 95 of their own 512 each, and the running line
    zigzagged between the replicas' counts. The whole fleet's numbers are now the replicas' added up:
    the KV caption at the cursor, and the running / waiting series (each replica's last value, summed)."""
    import re

    from core.analysis.cursor import fleet_as_one, in_flight_series
    from core.trace import load_trace, one_replica

    def kv_at(at):
        said = next(c.value for c in at.caption if c.value.startswith("At the cursor: ") and "blocks" in c.value)
        return {k: int(v) for v, k in re.findall(r"(\d+) ([a-z-]+)", said)}
    counts = {}
    for pick in ("the whole fleet", "replica 0 (both)", "replica 1 (both)"):
        at = open_page("replay", {"tr": "fleet_two.json.gz", "rp_replica": pick, "rp_cursor": "5000"})
        assert not at.exception, at.exception
        counts[pick] = kv_at(at)
    whole, r0, r1 = counts.values()
    assert whole["owned"] > 0
    assert whole == {k: r0[k] + r1[k] for k in whole}
    # running: at each time, the replicas' last step values summed (computed here from each replica's steps)
    tr = load_trace(DATA / "traces" / "fleet_two.json.gz")
    series = in_flight_series(fleet_as_one(tr), max_points=10**9)
    for t in (1500.0, 3000.0, 5000.0, 6500.0):
        want = 0
        for k in (0, 1):
            st = one_replica(tr, k).steps
            before = st[st["t_ms"] <= t]
            want += int(before["running"].iloc[-1]) if len(before) else 0
        seen = series[series["t_ms"] <= t]["running"]
        got = int(seen.iloc[-1]) if len(seen) else 0
        assert got == want, (t, got, want)
    assert series["running"].max() > max(one_replica(tr, k).steps["running"].max() for k in (0, 1))


def test_a_link_names_a_measured_fleet_by_its_file_and_an_unknown_one_is_said():
    """Issue 52 item 6: `?fl_measured=<file name>` opens that bundled fleet (it was ignored); a
    name that is no bundled fleet is dropped with a notice, not silently."""
    at = open_page("fleet", {"fl_measured": "rr_r2.json.gz"})      # (its tab opens with it)
    assert not at.exception
    assert at.selectbox(key="fl_measured").value == "gpu_runner fleet, repeated: rr r2"
    at = open_page("fleet", {"fl_tab": "Measured", "fl_measured": "cache_aware/fleet.json.gz"})
    assert at.selectbox(key="fl_measured").value == "sglang-router in front of serve replicas: cache aware"
    at = open_page("fleet", {"fl_tab": "Measured", "fl_measured": "no_such_fleet.json.gz"})
    assert not at.exception
    assert any("such" in w.value and "is not one of" in w.value and "measured fleet" in w.value for w in at.warning)


def test_an_uploaded_fleet_trace_opens_beside_the_simulators_prediction():
    """Issue 52 item 6: the Measured tab opens an uploaded fleet trace (here a bundled one's bytes,
    predicted independently below) and refuses a single engine's trace in one line."""
    from core.trace import load_trace
    path = DATA / "traces" / "fleet_pd.json.gz"
    if not path.exists():
        path = sorted((DATA / "traces").glob("fleet_*.json.gz"))[0]
    at = open_page("fleet", {"fl_tab": "Measured", "fl_measured": "upload"})
    at.file_uploader(key="fl_meas_upload").set_value(("mine.json.gz", path.read_bytes(), "application/gzip")).run()
    assert not at.exception and not at.error
    err = fleet_e2e_error_median(load_trace(path))
    row = at.dataframe[0].value.to_dict("records")[0]
    assert row["E2E error median"] == f"{err:.1%}"
    one = DATA / "traces" / "shared_prefix_caching_on.json.gz"
    at.file_uploader(key="fl_meas_upload").set_value(("one.json.gz", one.read_bytes(), "application/gzip")).run()
    assert not at.exception
    assert any("is not a fleet trace" in e.value for e in at.error)
