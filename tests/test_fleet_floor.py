"""Fleet runs held against each other (core.fit.noise on fleet traces: requests paired by id) and the
fleet simulator fitted on one fleet run, predicting another (core.fit.fleet.predict_fleet(fits=))."""
import numpy as np
import pytest

from core.analysis.metrics import request_metrics
from core.errors import ConfigError
from core.fit.fleet import fit_fleet, fleet_run, predict_fleet
from core.fit.noise import repeat_floor, same_workload
from core.trace import load_trace
from tests.conftest import ROOT

RR = ROOT / "data" / "traces" / "fleet_prefix_round_robin.json.gz"
PA = ROOT / "data" / "traces" / "fleet_prefix_prefix_aware.json.gz"
PD = ROOT / "data" / "traces" / "fleet_pd.json.gz"


def test_two_fleet_runs_of_one_workload_are_paired_request_by_request():
    a, b = fleet_run(RR), fleet_run(PA)
    floor = repeat_floor([a, b])
    # (each prompt sent once, Poisson: the front end numbered the requests alike in both runs)
    assert floor["key"] == "prompt" and floor["paired"] == 120
    ma = request_metrics(load_trace(RR)).set_index("id")
    mb = request_metrics(load_trace(PA)).set_index("id")
    for m in ("ttft_ms", "e2e_ms"):      # by hand: each ordered pair's median relative difference
        x, y = ma[m], mb[m].reindex(ma.index)
        want = float(np.median([np.median(np.abs(x - y) / y), np.median(np.abs(y - x) / x)]))
        assert floor[m]["p50"] == pytest.approx(want)
    assert same_workload(a, floor) and same_workload(b, floor)


def test_a_fleet_fitted_on_one_run_predicts_another_and_names_a_missing_role():
    fits = fit_fleet(load_trace(RR))
    _, rep, table = predict_fleet(load_trace(PA), fits=fits)
    assert rep["routing_agreement"] == 1.0 and len(table) == 120
    _, own, _ = predict_fleet(load_trace(PA))
    assert rep["step_models"] != own["step_models"]   # (the other run's models, not its own)
    with pytest.raises(ConfigError, match="prefill"):
        predict_fleet(load_trace(PD), fits=fits)


REP = ROOT / "data" / "imports" / "fleet_repeats"


def test_closed_loop_repeats_are_paired_by_prompt_not_by_the_servers_ids():
    runs = [fleet_run(REP / f"closed_r{i}.json.gz") for i in (1, 2, 3)]
    floor = repeat_floor(runs)
    assert floor["key"] == "prompt" and floor["paired"] == 96
    # by hand: request ids are the front end's arrival numbers, which differ between the repeats
    a, b = (load_trace(REP / f"closed_r{i}.json.gz") for i in (1, 2))
    pa = {tuple(r.prompt_ids): r.id for r in a.workload().requests}
    pb = {tuple(r.prompt_ids): r.id for r in b.workload().requests}
    assert pa.keys() == pb.keys() and sum(pa[k] != pb[k] for k in pa) > 0
    ma, mb = request_metrics(a).set_index("id"), request_metrics(b).set_index("id")
    want = np.median([abs(mb.loc[pb[k], "e2e_ms"] - ma.loc[pa[k], "e2e_ms"]) / ma.loc[pa[k], "e2e_ms"] for k in pa])
    assert any(p["p50"] == pytest.approx(want) for p in floor["e2e_ms"]["pairs"])


def test_the_dispatch_hop_is_the_median_wait_of_requests_that_found_their_replica_idle():
    from core.fit.fleet import dispatch_ms
    tr = load_trace(REP / "rr_r1.json.gz")
    st, b = tr.steps, tr.batch
    arrival = dict(zip(range(len(tr.requests)), tr.requests["arrival_ms"].to_numpy()))
    waits = []
    for req, step in b.groupby("req")["step"].min().items():
        row = st[st["step"] == step].iloc[0]
        mine = st[(st["replica"] == row["replica"]) & (st["t_ms"] < row["t_ms"])]
        last_end = (mine["t_ms"] + mine["dur_ms"]).max() if len(mine) else -np.inf
        if last_end <= arrival[req]:
            waits.append(row["t_ms"] - arrival[req])
    assert dispatch_ms(tr) == pytest.approx(float(np.median(waits)))
    assert 0 < dispatch_ms(tr) < 5


def test_a_term_seen_on_few_busy_steps_is_not_fitted_on_them():
    """PD's decode replica: its one-token prefills after each KV handoff mostly follow a pause; the
    wake-up path would price them from a handful of busy rows, so the plain fit stands."""
    from core.fit.fleet import fit_replica
    from core.fit.stepfit import fit
    from core.trace import one_replica
    tr = load_trace(PD)
    sm, report = fit_replica(tr, 1, gap=False)
    plain, _ = fit(one_replica(tr, 1), "features")
    assert "wake" not in report and sm.prefill_ms_per_kpos == plain.prefill_ms_per_kpos
