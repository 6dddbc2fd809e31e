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
    assert shown["TTFT median error, held out"] == f"{s['ttft_ms']['p50']:.1%}"
    assert shown["E2E p90 error, held out"] == f"{s['e2e_ms']['p90']:.1%}"
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
    assert {m.label: m.value for m in at.metric}["E2E median error, held out"] == f"{s['e2e_ms']['p50']:.1%}"
    at.button_group(key="cal_fit").set_value([]).run()
    assert any("at least one run" in i.value for i in at.info)


def test_the_view_also_reads_the_runners_own_capture():
    # our runner's bundled capture, fitted on its own steps (in sample): the numbers a direct computation
    # gives; its front end's part is only each request's wait for the step boundary (its arrivals are the
    # engine's, and the engine takes new requests in between steps)
    from core.lessons.vllm_runs import RUNNER_CAPTURES
    name = next(iter(RUNNER_CAPTURES))
    at = open_page("calibration", {"cal_run": name})
    run = load_run(ROOT.parents[1] / "traces" / RUNNER_CAPTURES[name])
    cal = calibrate([run], "affine", "log")
    rows = compare(predict(cal, run), run)
    s = summary(rows)
    shown = {m.label: m.value for m in at.metric}
    assert shown["E2E median error, in sample"] == f"{s['e2e_ms']['p50']:.1%}"
    assert shown["TTFT p90 error, in sample"] == f"{s['ttft_ms']['p90']:.1%}"
    st, req = run.truth.steps, run.truth.requests.set_index("id")
    wait = []
    for rid in rows["id"]:
        a = req.loc[rid, "arrival_ms"]
        during = st[(st["t_ms"] <= a) & (a < st["t_ms"] + st["dur_ms"])]
        wait.append(float((during["t_ms"] + during["dur_ms"]).max() - a) if len(during) else 0.0)
    assert np.allclose(rows["front end_measured"], wait)
    assert any("in sample" in m.value for m in at.markdown)


def test_the_link_keeps_the_fit_method():
    """Issue 48 item 4: the method was not in the link, which reopened on the iteration log."""
    from ui.urls import URL_KEYS
    at = open_page("calibration", {"cal_run": "run5_poisson20_p96_o64"})
    assert ("cal_method", "iteration log") in at.session_state["_view_query"]
    assert URL_KEYS["cal_method"].page == "calibration"


def test_the_range_warning_the_cli_prints_is_on_the_page(capsys):
    """Issue 48 item 7: `python -m core fidelity` notes the steps outside the fitted range; the page
    showed nothing. Fit on run1 (4 clients), predict run3 (8 clients: larger batches)."""
    from core.__main__ import main
    run, fit = "run3_c8_p256_o64", "run1_c4_p128_o32"
    assert main(["fidelity", "--fit", str(ROOT / fit), "--predict", str(ROOT / run), "--method", "log"]) == 0
    said = [ln.split(": ", 2)[2] for ln in capsys.readouterr().out.splitlines()
            if ln.startswith(f"note: {run}: ") and "outside the range" in ln]
    assert said, "the CLI gives no range note for this pair: choose another"
    at = open_page("calibration", {"cal_run": run, "cal_fit": [fit]})
    assert any(said[0] in c.value.replace("\\", "") for c in at.caption), said[0]   # (markdown escapes dropped)


def test_the_step_model_line_breaks_where_the_engine_was_idle():
    """Issue 48 item 13: the step model's line was drawn across idle gaps as long diagonal ramps."""
    import pandas as pd

    from core.figures.calibration import steps_vs_model
    steps = pd.DataFrame({"t_ms": [0.0, 10.0, 20.0, 10_000.0, 10_010.0], "logged_ms": [10.0] * 5,
                          "predicted_ms": [9.0, 9.0, 9.0, 30.0, 30.0], "prefill_tokens": [0] * 5,
                          "decode_reqs": [1] * 5})
    line = steps_vs_model(steps).to_plotly_json()["data"][1]
    assert list(line["x"]) == [0.0, 10.0, 20.0, None, 10_000.0, 10_010.0]


def test_a_repeated_run_shows_its_repeat_floor_beside_every_error():
    """Issue 49: the floor (how close the engine's own repeats came) beside each error, computed here from
    the repeats' per-request times by hand, and per request in the table."""
    from core.fit.frontfit import samples
    from core.fit.runs import server_log_flags
    rep = ROOT.parent / "vllm_repeats" / "s1"
    run, fit = "s1/wB_c4_p128_o32_r2", "s1/wA_poisson8_p192_o48_r1"
    at = open_page("calibration", {"cal_run": run, "cal_fit": [fit]})
    flags = server_log_flags(rep / "server_start.log")
    times = {k: samples(load_run(rep / f"wB_c4_p128_o32_r{k}", flags).truth).set_index("id") for k in (1, 2, 3)}

    def by_index(df, col):
        return {int(i.rsplit("-", 2)[1]): v for i, v in zip(df.index, df[col])}

    def floor(col, q):   # each repeat as another's prediction: the median (or p90) of |a - b| / b, then the median
        per = {k: by_index(t, col) for k, t in times.items()}
        vals = []
        for a in per:
            for b in per:
                if a != b:
                    e = [abs(per[a][i] - per[b][i]) / per[b][i] for i in per[b]]
                    vals.append(np.median(e) if q == "p50" else np.percentile(e, 90))
        return float(np.median(vals))

    cal = calibrate([load_run(rep / "wA_poisson8_p192_o48_r1", flags)], "affine", "log")
    target = load_run(rep / "wB_c4_p128_o32_r2", flags)
    s = summary(compare(predict(cal, target), target))
    shown = {m.label: m.value for m in at.metric}
    assert shown["TTFT median error, held out"] == f"{s['ttft_ms']['p50']:.1%}"
    captions = [c.value for c in at.caption]
    for col, q in (("ttft_ms", "p50"), ("ttft_ms", "p90"), ("e2e_ms", "p50"), ("e2e_ms", "p90")):
        f = floor(col, q)
        want = f"repeat floor {f:.1%} (measured): this error is **{s[col][q] / f:.1f}×** it"
        assert want in captions, (want, captions[:6])
    table = next(df.value for df in at.dataframe if "E2E err." in df.value.columns)
    mine = by_index(times[2], "ttft_ms")
    others = [by_index(times[k], "ttft_ms") for k in (1, 3)]
    first = int(table["request"].iloc[0].split("-")[0])
    assert table["TTFT repeat |Δ|"].iloc[0] == pytest.approx(
        np.median([abs(o[first] - mine[first]) / mine[first] for o in others]))


def test_a_run_made_once_says_so_and_shows_the_repeats_range():
    at = open_page("calibration", {"cal_run": "run4_poisson8_p128_o32", "cal_fit": ["run9_poisson2_p64_o128"]})
    from core.fit.noise import repeat_floor
    from core.fit.runs import server_log_flags
    floors = []
    for session in sorted(p for p in (ROOT.parent / "vllm_repeats").iterdir() if p.is_dir()):
        flags = server_log_flags(session / "server_start.log")
        groups = {}
        for d in sorted(p for p in session.iterdir() if p.is_dir()):
            groups.setdefault(d.name.rsplit("_r", 1)[0], []).append(load_run(d, flags))
        floors += [repeat_floor(g) for g in groups.values() if len(g) >= 2]
    lo = {m: min(f[m]["p50"] for f in floors) for m in ("ttft_ms", "e2e_ms")}
    hi = {m: max(f[m]["p50"] for f in floors) for m in ("ttft_ms", "e2e_ms")}
    said = [c.value for c in at.caption if "made once" in c.value]
    assert said and f"TTFT {lo['ttft_ms']:.1%}–{hi['ttft_ms']:.1%}" in said[0]
    assert f"E2E {lo['e2e_ms']:.1%}–{hi['e2e_ms']:.1%}" in said[0]


def test_the_page_predicts_a_run_at_its_own_speed_as_the_cli_does():
    """s7's inference-perf run, fitted on the same server's closed loop, at the run's own speed over
    the run: the page's errors equal core.fit.calibrate.evaluate with speed_from_log, and it says
    how fast the run's steps went against the fit's."""
    from core.fit.calibrate import evaluate
    from core.fit.runs import server_log_flags
    run, fit = "s7/wF_ip_stages_p64_o32_r1", "s7/wB_c4_p128_o32_r1"
    at = open_page("calibration", {"cal_run": run, "cal_fit": [fit], "cal_speed": "true"})
    d = ROOT.parent / "vllm_repeats" / "s7"
    flags = server_log_flags(d / "server_start.log")
    target, fitted = load_run(d / run.split("/")[1], flags), load_run(d / fit.split("/")[1], flags)
    cal = calibrate([fitted], "affine", "log")
    ev = evaluate(cal, target, {fitted.name}, "affine", speed_from_log=True)
    shown = {m.label: m.value for m in at.metric}
    assert shown["E2E median error, held out"] == f"{ev['summary']['e2e_ms']['p50']:.1%}"
    said = [c.value for c in at.caption if "own speed over the run" in c.value]
    assert said and f"median {ev['speed']['factor_median']:.2f}" in said[0]
    from core.fit.calibrate import at_speed
    rel = at_speed(cal, target)[1]          # (the one-number caption reads the same ratio)
    assert any(f"took {rel:.2f}× what the fit runs' took" in c.value for c in at.caption)
    plain = evaluate(cal, target, {fitted.name}, "affine")
    assert plain["summary"]["e2e_ms"]["p50"] != ev["summary"]["e2e_ms"]["p50"]
