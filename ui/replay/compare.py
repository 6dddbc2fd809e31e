"""The replay page's comparisons: the trace beside another trace or the simulator's prediction, and
how good the simulator is on it (a step model fitted on part of the run, or on another run of the
same engine, predicting it request by request)."""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from core.analysis.compare import compare_table, distinct_labels, workload_differences
from core.analysis.routing import has_replicas
from core.config import POLICIES, SchedulerConfig
from core.errors import InputError
from core.figures.latency import cdf_figure
from core.figures.timeline import schedule_timeline
from core.fit.predict import describe_request_prediction, prediction_methods
from core.fit.stepfit import MIN_STEPS, describe_identifiability, describe_outside
from ui import (
    bound,
    cached_fidelity,
    cached_prediction,
    cached_request_prediction,
    derived,
    md,
    show_chart,
    show_table,
)
from ui.fleet import fleet_prediction_panel
from ui.replay.opening import UPLOAD, Replay, get_trace

PREDICT = "Predicted by the simulator"
FIRST_HALF = "this run's first half (forward in time)"
NO_PEER = "(choose another run)"
FIDELITY_AUTO_REQUESTS = 2000   # above: "How good is the simulator?" runs when asked
TIMELINE_BOTH = 60              # both traces this small: their schedules side by side


@dataclass
class Prediction:
    """How the simulator predicts this trace: from its step events (settings None) or, without them,
    from the engine's scheduler settings as stated and a step time fitted by `method`."""
    settings: dict | None = None
    method: str | None = None


def _predict():
    st.session_state["rp_cmp"] = PREDICT


def prediction_settings(r: Replay) -> Prediction:
    """The button that predicts the trace, and (no step events) the engine's settings to predict it under."""
    methods = prediction_methods(r.tr, not r.aligned_at_zero)
    if not methods:
        st.button("Predict this trace with the simulator (step model fitted to its step durations)",
                  on_click=_predict, key="rp_predict")
        return Prediction()
    with st.expander("Predict with the simulator (no step events): the engine's scheduler settings"):
        method = st.segmented_control(
            "Fit the step time to", methods, default=methods[0], key="rp_rf_method",
            help="token times: the engine's steps read off the streamed tokens (a step's tokens reach the "
                 "client together; core/fit/stepinfer.py); requests: each request's TTFT and E2E, by simulating "
                 "the workload under these settings (core/fit/reqfit.py)") or methods[0]
        st.caption("The simulator replays this workload (send times, or the closed loop of a benchmark run with a "
                   "fixed number of clients; prompt and output lengths) under these settings with an affine step "
                   "time fitted as chosen.")
        e1, e2, e3, e4, e5 = st.columns(5)
        settings = dict(
            policy=e1.selectbox("Policy", POLICIES, index=POLICIES.index("vllm-v1"), key="rp_rf_policy"),
            max_seqs=e2.number_input("max_num_seqs", 1, 1_000_000, 256, key="rp_rf_ms"),
            token_budget=e3.number_input("max_num_batched_tokens", 1, 10_000_000, 2048, key="rp_rf_tb"),
            block_size=e4.number_input("block_size", 1, 4096, 16, key="rp_rf_bs"),
            kv_blocks=e5.number_input("KV blocks (0 = enough)", 0, 100_000_000, 0, key="rp_rf_kb") or None)
        st.button("Fit and predict", on_click=_predict, key="rp_predict_requests")
    return Prediction(settings, method)


def _predicted(r: Replay, pred: Prediction):
    """(the simulator's prediction of the trace, its report or None); the page stops on an error."""
    try:
        if pred.settings is None:
            other = cached_prediction(r.tr)
            st.caption(f"Prediction: core simulator, {other.meta['step_model']['description']}.")
            return other, None
        cfg = SchedulerConfig(**pred.settings)
        other, rep = cached_request_prediction(r.tr, cfg, not r.aligned_at_zero, pred.method)
        st.caption(describe_request_prediction(rep, cfg.policy, other))
        for line in describe_identifiability(rep.get("identifiability") or {},
                                             "inferred steps" if rep["method"] == "token times" else "requests"):
            st.info(md(line))
        for line in rep.get("degenerate") or []:
            st.warning(md(line[0].upper() + line[1:] + "."))
        return other, rep
    except InputError as e:
        st.error(f"Cannot predict: {md(e)}")
        st.stop()


def _side_by_side(r: Replay, other, this_label: str, other_label: str, closed_prediction: bool) -> None:
    tr = r.tr
    for d in workload_differences(tr, other, arrivals=not closed_prediction):
        st.warning(f"The two workloads differ: {md(d)}. Differences in metrics mix scheduling with workload.")
    show_table(compare_table(tr, other, this_label, other_label), hide_index=True, key="rp_compare",
               column_config={c: st.column_config.NumberColumn(format="%.6g")
                              for c in (this_label, other_label, "difference", "ratio")})
    ma, mb = derived(tr, "requests"), derived(other, "requests")
    c1, c2, c3 = st.columns(3)
    for col, metric, key in ((c1, "TTFT", "ttft_ms"), (c2, "TPOT", "tpot_ms"), (c3, "E2E", "e2e_ms")):
        show_chart(cdf_figure({this_label: ma[key], other_label: mb[key]}, metric), key=f"rp_cdf_{key}", where=col)
    if len(tr.requests) <= TIMELINE_BOTH and len(other.requests) <= TIMELINE_BOTH:
        show_chart(schedule_timeline([(this_label, tr), (other_label, other)]), key="rp_both")


def compare_section(r: Replay) -> Prediction:
    """Compare with another trace or the simulator's prediction; the settings a prediction uses.
    A trace of engine-side records only (no requests) has nothing to compare: the page stops."""
    if not len(r.tr.requests):
        st.caption("This file holds engine-side records only (steps, KV events, gauges), no requests: to compare and "
                   "predict, merge it with the run's client file and spans (`python -m core merge FILE... --out T`, "
                   "docs/imports.md).")
        st.stop()
    st.header("Compare")
    pred = prediction_settings(r)
    prev_main = st.session_state.get("_rp_main")     # a new main trace: the comparison picked for the old one goes
    if prev_main is not None and prev_main != r.choice and \
            st.session_state.get("rp_cmp") not in (None, "(none)", PREDICT):
        st.session_state["rp_cmp"] = "(none)"
    st.session_state["_rp_main"] = r.choice
    other_choice = st.selectbox("Compare with", ["(none)", PREDICT] + list(r.files) + [UPLOAD], **bound("rp_cmp"))
    if other_choice == "(none)":
        return pred
    rep = None
    if other_choice == PREDICT:
        other, rep = _predicted(r, pred)
        other_label = "predicted (simulated)"
    else:
        other, _, other_label = get_trace(r.files, other_choice, "rp_cmp")
        if other is None:
            st.stop()
        other_label = f"{other_label} ({other.source})"
    # (a trace compared with itself, or two of one label: told apart in the table, the CDFs, the timeline)
    this_label, other_label = distinct_labels(f"{r.label} ({r.tr.source})", other_label)
    # a closed loop's prediction sends each request when one finishes in the simulation: its
    # arrival times are predicted, not the workload's (the caption above says so)
    closed_prediction = rep is not None and bool(rep.get("clients"))
    _side_by_side(r, other, this_label, other_label, closed_prediction)
    return pred


@dataclass
class _FidelityChoice:
    fit_tr: object = None                 # the run to fit on (None: this run's first half)
    config: SchedulerConfig | None = None   # an engine's result file: the settings stated above
    method: str | None = None
    model: str = "affine"


def _result_file_fit(r: Replay, pred: Prediction) -> _FidelityChoice:
    """An engine's result file: held out against a model fitted on another run of the same engine."""
    st.header("How good is the simulator?")
    st.caption("Fit a step model on another run of this engine (a result file of another workload or load), "
               "replay this run with the core scheduler under the settings above as its clients sent it, and "
               "compare request by request: error = |predicted − measured| / measured (core/fit/fidelity.py). "
               "Every request is held out.")
    peers = [f for f, path in r.files.items() if f != r.choice and "imports" in path.parts]
    fit_choice = st.selectbox("Fit on", [NO_PEER] + peers + [UPLOAD], key="rp_fid_peer",
                              help="a result file of the same engine with send times (and per-token times to fit "
                                   "by token times)")
    if fit_choice == NO_PEER:
        st.stop()
    fit_tr, _, _ = get_trace(r.files, fit_choice, "rp_fid")
    if fit_tr is None:
        st.stop()
    return _FidelityChoice(fit_tr, SchedulerConfig(**pred.settings), pred.method)


def _step_fit(r: Replay) -> _FidelityChoice:
    """A trace with steps: fit on its first half or on another run with step events."""
    st.header("How good is the simulator?")
    st.caption("Fit a step model on part of this run (or on another run), predict the whole run with the core "
               "scheduler under this trace's own settings, and compare request by request: error = |predicted "
               "− measured| / measured (core/fit/fidelity.py).")
    # engines' result files (data/imports) never have step events to fit
    others = [f for f, path in r.files.items() if f != r.choice and path.parent.name != "imports"]
    f1, f2 = st.columns(2)
    fit_choice = f1.selectbox("Fit on", [FIRST_HALF] + others, key="rp_fid_on",
                              help="another run needs step events (a runner capture or a simulation)")
    counted_only = r.views.counted_steps()    # an engine's iteration log: counts, no attended positions
    model = f2.segmented_control("Step model", ["affine"] if counted_only else ["affine", "features"],
                                 default="affine" if counted_only else "features", required=True,
                                 key="rp_fid_model",
                                 help="an iteration log has counts per step, not attended positions: "
                                      "affine" if counted_only else None)
    fit_tr = None
    if fit_choice != FIRST_HALF:
        fit_tr, _, _ = get_trace(r.files, fit_choice, "rp_fid")
    return _FidelityChoice(fit_tr, model=model)


def _fidelity_report(r: Replay, fid) -> None:
    r2 = fid.fit_report.get("r2")
    st.caption(f"Fitted on {md(fid.fit_on)}: {fid.step_model.describe()}"
               + ("" if r2 is None else f" (R² {r2:.3f} on the fitted steps)") + ". Predicted numbers: simulated.")
    for line in describe_identifiability(fid.fit_report.get("identifiability") or {},
                                         "requests" if fid.fit_report.get("fitted_on") == "requests" else "steps"):
        st.info(md(line))
    show_table(fid.summary(), hide_index=True, key="rp_fid_summary",
               column_config={c: st.column_config.NumberColumn(format="percent")
                              for c in ("median error", "p90 error", "max error")})
    held = fid.requests[fid.requests["held_out"]] if fid.requests["held_out"].any() else fid.requests
    which = "held-out" if fid.requests["held_out"].any() else "all"
    c1, c2 = st.columns(2)
    for col, key, name in ((c1, "ttft_ms", "TTFT"), (c2, "e2e_ms", "E2E")):
        show_chart(cdf_figure({f"{which} requests": 100 * held[f"{key}_error"]}, f"{name} error", unit="%"),
                   key=f"rp_fid_cdf_{key}", where=col)
    if fid.outside:
        r.notice(f"{md(describe_outside(fid.outside))}: the prediction extrapolates there.", ":material/warning:",
                 fid.outside["steps"] / max(1, fid.outside["of"]))
        with st.expander("The predicted steps outside the fitted range"):
            show_table(fid.outside_table, hide_index=True, key="rp_fid_outside")
    else:
        st.caption("Every predicted step lies inside the range the model was fitted on.")
    st.subheader("The requests it misses most")
    show_table(fid.worst(10), hide_index=True, key="rp_fid_worst",
               column_config={c: st.column_config.NumberColumn(format="percent")
                              for c in ("ttft_ms_error", "e2e_ms_error")})


def fidelity_section(r: Replay, pred: Prediction) -> None:
    """How good is the simulator on this trace (when it has enough steps to fit, or is an engine's
    result file with settings stated); a whole fleet: the fleet simulator on its own workload."""
    tr = r.tr
    if not r.large and r.fleet_tr is None and has_replicas(tr):
        st.header("How good is the simulator?")
        st.caption("A fleet is predicted as a fleet: the fleet simulator with this run's router and replicas, each "
                   "role's step model fitted on its first replica (as on the Fleet page's measured tab); pick one "
                   "replica above to compare that engine alone.")
        fleet_prediction_panel(tr, str(r.files[r.choice]) if r.choice in r.files else None, "rp_fleet_fid")
        return
    if len(tr.steps) < MIN_STEPS and pred.settings is not None and not r.aligned_at_zero:
        choice = _result_file_fit(r, pred)
    elif len(tr.steps) >= MIN_STEPS:
        choice = _step_fit(r)
    else:
        return
    if len(tr.requests) > FIDELITY_AUTO_REQUESTS and not st.toggle("Fit and predict", value=False, key="rp_fid_run"):
        st.caption(f"{len(tr.requests):,} requests: the check fits the run's steps and simulates the whole run "
                   f"(seconds at this size), so it runs when you switch it on.")
        st.stop()
    try:
        fid = cached_fidelity(tr, choice.model, choice.fit_tr, choice.config, choice.method or "token times")
    except InputError as e:
        st.error(f"Cannot test the simulator on this: {md(e)}")
        st.stop()
    _fidelity_report(r, fid)
