"""The Prediction vs measurement page (pages/calibration.py): its numbers equal a direct computation
with core.fit.calibrate on the same bundled runs, and it follows its pickers."""
import numpy as np
import pytest

from core.fit.calibrate import calibrate, compare, predict, summary
from core.fit.runs import load_run
from core.lessons.vllm_runs import ROOT
from tests.helpers import arr, charts, open_page


def direct(run: str, fit_on: list[str]):
    # read the runs afresh (not through the page's caches); run2's log starts mid-server: run1's flags
    runs = {n: load_run(ROOT / n) for n in {run, *fit_on, "run1_c4_p128_o32"}}
    for r in runs.values():
        r.config = r.config or runs["run1_c4_p128_o32"].config
    cal = calibrate([runs[n] for n in fit_on], "affine", "log")
    rows = compare(predict(cal, runs[run]), runs[run])
    return rows, summary(rows)


def test_the_calibration_view_shows_what_a_direct_computation_gives():
    at = open_page("calibration")
    rows, s = direct("run2_poisson4_p192_o48", ["run1_c4_p128_o32"])
    shown = {m.label: m.value for m in at.metric}
    assert shown["TTFT median error"] == f"{s['ttft_ms']['p50']:.1%}"
    assert shown["E2E p90 error"] == f"{s['e2e_ms']['p90']:.1%}"
    table = next(df.value for df in at.dataframe if "E2E err." in df.value.columns)
    assert table["request"].tolist() == [i.split("-", 3)[3] for i in rows["id"]]   # cmpl-bench-<run>-<i>-0
    assert np.allclose(table["E2E pred."], rows["e2e_ms_predicted"])
    assert np.allclose(table["E2E err."], rows["e2e_ms_predicted"] / rows["e2e_ms_measured"] - 1)
    # every request's error splits into its parts: the table's columns add up
    parts = sum(table[f"Δ {p}"] for p in ("front end", "queue", "prefill", "decode"))
    assert np.allclose(parts, table["E2E pred."] - table["E2E meas."])
    figs = charts(at)
    scatter = next(f for f in figs if "E2E: predicted vs measured" in str(f["layout"].get("title")))
    assert np.allclose(arr(scatter["data"][0]["x"]), rows["e2e_ms_measured"])
    bars = next(f for f in figs if "Where the E2E error arises" in str(f["layout"].get("title")))
    assert arr(bars["data"][0]["y"])[list(arr(bars["data"][0]["x"])).index("decode")] == pytest.approx(
        s["e2e_error_by_part"]["decode"]["mean_ms"])


def test_the_view_follows_its_pickers():
    at = open_page("calibration", {"cal_run": "run9_poisson2_p64_o128", "cal_fit": ["run4_poisson8_p128_o32"]})
    _, s = direct("run9_poisson2_p64_o128", ["run4_poisson8_p128_o32"])
    assert {m.label: m.value for m in at.metric}["E2E median error"] == f"{s['e2e_ms']['p50']:.1%}"
    at.button_group(key="cal_fit").set_value([]).run()
    assert any("at least one run" in i.value for i in at.info)


def test_the_view_also_reads_the_runners_own_capture():
    # our runner's bundled capture, fitted on its own steps (in sample): the numbers a direct computation
    # gives; the front end's part is 0 (its arrivals are the engine's)
    from core.lessons.vllm_runs import RUNNER_CAPTURES
    name = next(iter(RUNNER_CAPTURES))
    at = open_page("calibration", {"cal_run": name})
    run = load_run(ROOT.parents[1] / "traces" / RUNNER_CAPTURES[name])
    cal = calibrate([run], "affine", "log")
    s = summary(compare(predict(cal, run), run))
    shown = {m.label: m.value for m in at.metric}
    assert shown["E2E median error"] == f"{s['e2e_ms']['p50']:.1%}"
    assert shown["TTFT p90 error"] == f"{s['ttft_ms']['p90']:.1%}"
    assert abs(s["e2e_error_by_part"]["front end"]["mean_abs_ms"]) < 1e-9
    assert any("in sample" in m.value for m in at.markdown)
