"""Prediction vs measurement: a real vLLM run beside the simulator's prediction of it, request by
request and step by step, with the error split by where it arises (core.fit.calibrate)."""
import pandas as pd
import streamlit as st

from core.errors import InputError
from core.figures.calibration import error_by_part, predicted_vs_measured, steps_vs_model
from core.fit.calibrate import PARTS, at_speed
from core.fit.noise import describe as describe_floor
from core.lessons.vllm_runs import (
    RUNNER_CAPTURES,
    bundled_run,
    bundled_runs,
    floor_range,
    repeat_runs,
    repeats_of,
    request_floor,
    run_floor,
    session_date,
)
from ui import bound, cached_calibration, ensure_app_frame, md, show_chart, show_table

ensure_app_frame()
st.title("Prediction vs measurement")
st.markdown("Fit the simulator on some real runs, predict another, and see request by request where the "
            "prediction goes wrong. The same is `python -m core fidelity --fit RUN --predict RUN`.")

runs = bundled_runs()
repeated = repeat_runs()


c1, c3 = st.columns([3, 2])
run = c1.selectbox("Measured run to predict", runs + repeated + list(RUNNER_CAPTURES),
                   index=runs.index("run2_poisson4_p192_o48"), **bound("cal_run"),
                   help="run1–run9: vLLM 0.32 CPU, one run per server; s1/…, s2/…: vLLM 0.32 CPU, each workload "
                        "repeated on one server start (the repeats measure the engine's own noise, the floor every "
                        "error is held against); runner: our gpu_runner's own capture (data/traces), fitted on "
                        "itself: in sample")
runner = run in RUNNER_CAPTURES
in_repeats = run in repeated
if runner:   # one capture of our engine: fitted on its own steps, predicted in sample
    fit_on = [run]
    st.markdown(f"**{md(run)}** is **measured**: our own engine (`gpu_runner`) serving the bundled tiny model, its "
                "every step and token recorded in its trace (data/traces). The prediction is **simulated**: its "
                "requests through the core scheduler with a step model fitted on **this capture's own steps** — "
                "**in sample**, so the errors below say how well the model reproduces the run it was fitted on, not "
                "how it predicts another. The capture has no front end between arrival and the engine, so that "
                "part is 0.")
elif in_repeats:
    session, name = run.split("/")
    st.markdown(f"**{md(run)}** is **measured**: vLLM 0.32.0's CPU build serving the bundled tiny model on this "
                f"project's 2-core VM on {session_date(session) or 'a date its files do not give'}, server start "
                f"**{session}**, workload **{md(name[:-3])}** sent "
                f"{len(repeats_of(run))} times the same way (`bench/vllm_repeats.sh`; how: "
                "data/imports/vllm_repeats/MADE.md). Each request's truth is vLLM's own measurement of it (its OTLP "
                "span). The prediction is **simulated**: its requests through the core scheduler under the flags its "
                "server's start-up line states, with a step model and a front end fitted on the runs chosen below.")
    others = [r for r in repeated if r != run]
    default_fit = "s1/wA_poisson8_p192_o48_r1" if run != "s1/wA_poisson8_p192_o48_r1" else "s1/wB_c4_p128_o32_r1"
    fit_on = st.pills("Fit on these runs", others, selection_mode="multi", default=[default_fit], **bound("cal_fit"),
                      help="the step model and the front end are fitted on these; the run predicted is not among "
                           "them (held out); a repeat of the same workload is the easiest case. s4–s6 hold a "
                           "calibration run (wK: a Poisson stream ramped from 1/s to 24/s, mixed lengths): fitted on "
                           "its two repeats, the cycle's cost per decoding sequence is priced too (docs/fidelity.md; "
                           "about 2 minutes). s7 holds it beside other clients (AIPerf chat, a guidellm sweep, "
                           "inference-perf stages)")
else:
    st.markdown("The runs are **measured**: vLLM 0.32.0's CPU build serving the bundled tiny model on this project's "
                "2-core VM (run1–run2 on 2026-12-01, run3–run9 on 2026-12-04; how each was made: "
                "data/imports/vllm_telemetry/MADE.md). Each request's truth is vLLM's own measurement of it (its "
                "OTLP span: TTFT and E2E from its front end's arrival to the token reaching the front end). The "
                "prediction is **simulated**: the run's requests, arriving when vLLM's front end received them, "
                "through the core scheduler under that run's own flags (read from its server log), with a step "
                "model and a front end fitted on the runs chosen below — never on the run predicted, so its "
                "errors are **held out**.")
    others = [r for r in runs if r != run]
    fit_on = st.pills("Fit on these runs", others, selection_mode="multi",
                      default=["run1_c4_p128_o32"] if run != "run1_c4_p128_o32" else ["run2_poisson4_p192_o48"],
                      **bound("cal_fit"), help="the step model and the front end are fitted on these; the run "
                                               "predicted is not among them (held out)")
method = "iteration log" if runner else c3.segmented_control(
                              "Step model fitted to", ["iteration log", "spans"], default="iteration log",
                              required=True, **bound("cal_method"),
                              help="iteration log: least squares on vLLM's logged step times, plus the per-step "
                                   "time the log leaves out (from the spans), in a blink; spans: the engine core's "
                                   "own view of each request, by simulating the fit runs (robust loss; tens of "
                                   "seconds per run)")
own_speed = not runner and st.toggle(
    "At the predicted run's own speed", False, **bound("cal_speed"),
    help="its machine speed over the run, read from its iteration log: each 5 s of its logged steps against the "
         "fitted forward pass, over the fit runs' own (a server started on a slower VM, a benchmark client that "
         "takes more of the two cores in one phase than another; a closed loop: its steps that compute prompt "
         "tokens); the prediction then reads the run's own log. "
         "`python -m core fidelity --speed-from-log` does the same")
if not fit_on:
    st.info("Choose at least one run to fit on.")
    st.stop()
try:
    cal, ev, steps, notes = cached_calibration(run, tuple(sorted(fit_on)),
                                               "log" if method == "iteration log" else "spans", bool(own_speed))
except InputError as e:
    if not own_speed:
        raise
    st.warning(f"Not at the run's own speed: {md(str(e))}. As fitted instead.")
    cal, ev, steps, notes = cached_calibration(run, tuple(sorted(fit_on)),
                                               "log" if method == "iteration log" else "spans")
rows, summ = ev["rows"], ev["summary"]
sample = "held out" if ev["held_out"] else "in sample"

st.caption(f"Fitted on {md(', '.join(sorted(fit_on)))}: step model {md(cal.step_model.describe())}; front end "
           f"{md(cal.front_end.describe())} ({md(cal.report['front_end'].get('split', ''))})."
           + "".join(f" {md(n[0].upper() + n[1:])}." for n in (cal.cycle_note(), cal.wake_note()) if n))
t, e = summ["ttft_ms"], summ["e2e_ms"]
floor = run_floor(run) if in_repeats else None
cols = st.columns(4)
for col, (metric, q, label) in zip(cols, [("ttft_ms", "p50", "TTFT median"), ("ttft_ms", "p90", "TTFT p90"),
                                          ("e2e_ms", "p50", "E2E median"), ("e2e_ms", "p90", "E2E p90")]):
    err = summ[metric][q]
    col.metric(f"{label} error, {sample}", f"{err:.1%}",
               help=f"|predicted − measured| / measured, {'median' if q == 'p50' else '90th percentile'} over the "
                    f"run's {summ['requests']} requests; {sample}: "
                    + ("the run was not fitted on" if ev["held_out"] else "the run was fitted on itself"))
    if floor is not None and floor[metric][q]:
        col.caption(f"repeat floor {floor[metric][q]:.1%} (measured): this error is "
                    f"**{err / floor[metric][q]:.1f}×** it")
if floor is not None:
    st.caption(f"The repeat floor: how close a repeat of the same workload on the same server came to this run, "
               f"request by request (core.fit.noise; measured): {md(describe_floor(floor))}. 1× is as close as the "
               "engine came to itself; `python -m core fidelity --repeats` prints the same.")
elif not runner:
    rng = floor_range()
    if rng:
        (tl, th), (el, eh) = rng["ttft_ms"], rng["e2e_ms"]
        sessions = ", ".join(sorted({n.split("/")[0] for n in repeated}))
        st.caption(f"This run was made once: it has no repeat floor of its own. Repeats made on 2026-12-05 on the "
                   f"same machine with the same engine ({sessions}; measured) came within TTFT {tl:.1%}–{th:.1%} and "
                   f"E2E {el:.1%}–{eh:.1%} of each other (per-request medians, per workload): errors below those are "
                   "within what the engine repeats.")
st.caption(f"Means, predicted / measured: TTFT {t['predicted_mean']:.2f} / {t['measured_mean']:.2f} ms, E2E "
           f"{e['predicted_mean']:.2f} / {e['measured_mean']:.2f} ms (simulated / measured).")
if ev["outside_note"]:
    st.caption(f":material/warning: {md(ev['outside_note'])}.")
sp = ev.get("speed")
if sp:
    st.caption(f"At the run's own speed over the run (from its iteration log, measured): every simulated step times "
               f"{sp['factor_min']:.2f}–{sp['factor_max']:.2f} (median {sp['factor_median']:.2f}) over "
               f"{sp['windows']} windows of 5 s, the front end times {ev['speed_factor']:.2f}; {md(sp['how'])}.")
elif ev.get("speed_factor") is not None:
    st.caption(f"At the run's own speed (from its iteration log, measured): every term times "
               f"{ev['speed_factor']:.2f}.")

c1, c2 = st.columns(2)
show_chart(predicted_vs_measured(rows, "ttft_ms", "TTFT"), key="cal_ttft", where=c1)
show_chart(predicted_vs_measured(rows, "e2e_ms", "E2E"), key="cal_e2e", where=c2)

st.subheader("Where it goes wrong")
parts = summ["e2e_error_by_part"]
show_chart(error_by_part(parts), key="cal_parts")
worst = summ["largest_part"]
st.markdown(f"Each request's E2E is its front end's share (the way in, and out of the last token) + its time "
            f"queued in the engine + prefill + decode, in vLLM's spans and in the simulation alike, so each part's "
            f"error adds up to the request's. Here the largest is **{worst}** "
            f"({parts[worst]['mean_abs_ms']:.2f} ms mean |error|): distrust that term first.")
try:     # (the same ratio --speed-from-log reads: a closed loop never decodes one sequence alone)
    _, rel = at_speed(cal, bundled_run(run))
except InputError:
    rel = None
if rel is not None:
    st.caption(f"The machine's speed, in one number from the iteration logs (measured): this run's logged steps took "
               f"{rel:.2f}× what the fit runs' took for the same batches (the median of each step against the fitted "
               "forward pass; a closed loop's steps that compute prompt tokens, as its decode steps share the cores "
               "with the streaming API server and client). A step model fitted on one server's runs carries that "
               "server's speed; on this 2-core VM it drifts between servers started minutes apart, and a "
               "benchmark client beside it takes more of the cores in one phase than another (`python -m core "
               "fidelity --speed-from-log` prices each predicted run at its own speed over the run, read from its "
               "iteration log).")

if steps is not None:
    st.subheader("Step by step")
    show_chart(steps_vs_model(steps), key="cal_steps")
    gap = float((steps["predicted_ms"] - steps["logged_ms"]).median())
    if runner:
        st.caption(f"{len(steps):,} steps of this capture (measured: each step's whole duration on the runner) "
                   f"against the step model fitted to them (simulated). Median gap {gap:+.2f} ms per step.")
    else:
        st.caption(f"{len(steps):,} logged steps of this run (measured: vLLM's iteration log, the forward pass "
                   f"only) against the step model for the same counts (simulated: the engine's whole cycle). "
                   f"Median gap {gap:+.2f} ms per step: what the model adds for scheduling, sampling and output "
                   "processing, plus its error.")

st.subheader("Every request")
spread = request_floor(run) if in_repeats else {}
view = pd.DataFrame({"request": rows["id"].str.replace(r"^cmpl-bench-[0-9a-f]+-", "", regex=True),
                     "TTFT meas.": rows["ttft_ms_measured"], "TTFT pred.": rows["ttft_ms_predicted"],
                     "TTFT err.": rows["ttft_ms_error"],
                     **({"TTFT repeat |Δ|": [spread.get(i, {}).get("ttft_ms") for i in rows["id"]]} if spread else {}),
                     "E2E meas.": rows["e2e_ms_measured"], "E2E pred.": rows["e2e_ms_predicted"],
                     "E2E err.": rows["e2e_ms_error"],
                     **({"E2E repeat |Δ|": [spread.get(i, {}).get("e2e_ms") for i in rows["id"]]} if spread else {}),
                     **{f"Δ {p}": rows[f"{p}_predicted"] - rows[f"{p}_measured"] for p in PARTS}})
percent = ("TTFT err.", "E2E err.") + (("TTFT repeat |Δ|", "E2E repeat |Δ|") if spread else ())
show_table(view, hide_index=True, key="cal_rows", export=rows,
           column_config={c: st.column_config.NumberColumn(format="percent") for c in percent})
st.caption("ms; err. = predicted / measured − 1; Δ part = its predicted − measured ms (they add up to E2E's; the "
           "front end's part holds the wait for the step boundary, where vLLM's engine takes new requests in). "
           + ("Repeat |Δ| = how far this request's repeats came from it (the median over the other repeats of "
              "|theirs − its| / its; measured): the floor beside its error. " if spread else "")
           + "The CSV export has every column, measured and predicted, per part.")
for n in sorted(set(notes)):
    st.caption(f"Note: {md(n)}")
