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


def test_two_fleet_runs_of_one_workload_are_paired_by_request_id():
    a, b = fleet_run(RR), fleet_run(PA)
    floor = repeat_floor([a, b])
    assert floor["key"] == "id" and floor["paired"] == 120
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
