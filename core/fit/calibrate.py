"""Fit an engine on measured runs, predict other runs, and show where each prediction goes wrong.

    cal = calibrate([load_run(a), load_run(b)])          # step model + front end, fitted jointly
    pred = predict(cal, run)                             # the run's workload, under its own flags
    rows = compare(pred, run)                            # per request: measured, predicted, by part
    summary(rows)                                        # median / p90 errors, error by part

Two terms, each fitted to what it explains (core.fit.frontfit has the equations):
- the front end (core.sim.frontend: the way in, the way out), from what the engine's spans leave
  between their TTFT / E2E and the core's own phases;
- the step model, to the core's own view of each request (`engine_view`: arriving at the core,
  its first and last token when the core had them — the spans' queue, prefill and inference
  times), by simulating the fit runs' workloads under their own flags (core.fit.reqfit: several
  runs jointly separate a step's fixed cost from its per-sequence cost, which one narrow run
  cannot). `method="log"` fits the step model to the engine's iteration log instead (its
  elapsed times, plus the per-step time the log leaves out, from the spans: core.fit.logfit).

A prediction's error splits exactly by part, per request: E2E = front end (in + out of the last
token) + queue + prefill + decode, TTFT = front end (in + out of the first) + queue + prefill; each
part's predicted minus measured adds up to the request's error (`PARTS`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.errors import InputError
from core.fit.engineview import engine_view, has_phases
from core.fit.frontfit import fit_front_end, samples
from core.fit.runs import Run
from core.sim.frontend import FrontEnd
from core.sim.stepmodel import Speed, StepModel

PARTS = ("front end", "queue", "prefill", "decode")
COEFFICIENTS = ("step_ms", "base_ms", "prefill_ms_per_token", "decode_ms_per_seq", "prefill_ms_per_kpos",
                "decode_ms_per_kpos", "prefill_ms_per_chunk", "wake_ms")
# The step fit's soft-L1 scale (core.fit.reqfit): a request off by much more than 15% (a stalled
# 2-core machine, a cold engine) counts as its error, not its square
ROBUST = 0.15
METHODS = ("spans", "log")


@dataclass
class Calibration:
    step_model: StepModel
    front_end: FrontEnd
    fit_runs: list[str]
    report: dict
    speed: Speed | None = None    # the predicted run's machine speed over time (at_speed_over_time), or None

    def describe(self) -> str:
        return f"step model {self.step_model.describe()}; front end {self.front_end.describe()}"

    def cycle_note(self) -> str | None:
        """What the engine's cycle was priced with beyond the logged forward pass (log method with
        spans): a fixed part, and a part per decoding sequence where the fit runs decode at widths far
        enough apart (a calibration run); None otherwise."""
        q = self.report.get("step_model") or {}
        if not q.get("cycle_terms"):
            return None
        added = (q.get("overhead") or {}).get("added", {})
        parts = " + ".join(f"{v:.3f} ms" + (" per decoding sequence" if k == "decode_ms_per_seq" else "")
                           for k, v in added.items())
        return f"cycle beyond the logged forward pass: {parts}; {q['cycle_terms']}"

    def wake_note(self) -> str | None:
        """How the wake-up after a pause was fitted (core.fit.wake), or why none was; None when the
        method does not fit one (spans)."""
        w = (self.report.get("step_model") or {}).get("wake")
        if not w:
            return None
        seen = w.get("idle_range_ms")
        where = (f"{w['idle_starts']} of {w['requests']} requests found the engine idle"
                 + (f" (pauses {seen[0]:.0f}-{seen[1]:,.0f} ms)" if seen else ""))
        if w.get("wake_ms", 0) > 0:
            return (f"wake-up after a pause: {w['wake_ms']:.2f} ms x (1 - exp(-idle / {w['wake_tau_ms']:.0f} ms)), "
                    f"fitted where {where}")
        return f"no wake-up after a pause: {w.get('why', where)}"


WAIT_ROUNDS = 2      # front-end refits with the step-boundary waits of the fit runs' simulation


def boundary_waits(runs: list[Run], sm: StepModel, fe: FrontEnd) -> dict:
    """Each fit run's requests' wait for the step boundary (core.sim.frontend.engine_phases), as
    the runs simulated under their own flags with `sm` and `fe` have it: request id -> ms."""
    from core.sim.simulate import simulate
    out = {}
    for r in runs:
        pred = simulate(r.workload, r.config, sm, front_end=fe, record_kv=False)
        out.update({i: e.get("engine_wait_ms", 0.0) for i, e in zip(pred.ids, pred.request_extra)})
    return out


def calibrate(runs: list[Run], model: str = "affine", method: str = "spans") -> Calibration:
    """The front end and the step model, fitted on `runs` together (each under its own flags)."""
    _check_fit_runs(runs, method)
    with_phases = [r for r in runs if has_phases(r)]
    names = ", ".join(r.name for r in with_phases)
    if with_phases:
        fe, fe_report = fit_front_end([r.truth for r in with_phases], names)
    else:
        fe, fe_report = FrontEnd(), {"split": "no engine phases (spans) in the fit runs: no front end fitted"}
    if method == "spans" and len(with_phases) < len(runs):
        bad = [r.name for r in runs if r not in with_phases]
        raise InputError(f"fit: {', '.join(bad)} has no engine phases per request (vLLM's OTLP spans); "
                         "use --method log (the iteration log) or leave it out")
    sm, step_report = _step_fit(runs, fe, model, method)
    if with_phases:
        # the front end's share of TTFT holds each request's wait for the step boundary, which the
        # simulation makes itself: take the simulated waits out and fit again (a few rounds), then
        # the step model once more on the engine's view under that front end
        for _ in range(WAIT_ROUNDS):
            fe, fe_report = fit_front_end([r.truth for r in with_phases], names,
                                          waits=boundary_waits(with_phases, sm, fe))
        sm, step_report = _step_fit(runs, fe, model, method)
    return Calibration(sm, fe, [r.name for r in runs],
                       {"method": method, "model": model, "front_end": fe_report, "step_model": step_report,
                        **_references(runs, sm, step_report)})


def _check_fit_runs(runs: list[Run], method: str) -> None:
    """InputError for an unknown method, no runs, or runs without engine flags."""
    if method not in METHODS:
        raise InputError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if not runs:
        raise InputError("fit: no runs given")
    missing = [r for r in runs if r.config is None]
    if missing:
        unread = [n for r in missing for n in r.notes if n.startswith("not read: ")]
        raise InputError(f"fit: no engine flags for {', '.join(r.name for r in missing)} (its files do not state "
                         "them" + (f"; {'; '.join(unread[:2])}" if unread else "") + "): give them with --flags "
                         "'{\"max_seqs\": 16, \"token_budget\": 2048, ...}'")


def _references(runs: list[Run], sm: StepModel, step_report: dict) -> dict:
    """The fit runs' machine speed, for scaling to another run's: the median of their reference steps
    (reference_step_ms) and of their logged steps over the fitted forward pass (logged_ratios);
    None where they have none."""
    refs = [x for x in (reference_step_ms(r) for r in runs) if x is not None]
    logs = [r.steps for r in runs if r.steps is not None and "decode_reqs" in r.steps.steps
            and sm.kind in ("affine", "features")]
    out: dict = {"reference_step_ms": float(np.median(refs)) if refs else None}
    for key, prefill in (("reference_ratio", False), ("reference_ratio_prefill", True)):
        ratios = [logged_ratios(forward_model(sm, step_report), log, prefill)[1] for log in logs]
        ratios = np.concatenate(ratios) if ratios else np.zeros(0)
        out[key] = float(np.median(ratios)) if len(ratios) else None
    return out


def forward_model(sm: StepModel, step_report: dict) -> StepModel:
    """The forward pass an iteration log times: the step model less the cycle's added terms (log
    method) and the wake-up."""
    added = (step_report.get("overhead") or {}).get("added") or {}
    return dataclasses.replace(sm, wake_ms=0.0, **{k: max(getattr(sm, k) - v, 0.0) for k, v in added.items()})


def logged_ratios(fwd: StepModel, log, prefill: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(step numbers, logged duration / the forward pass's price) of a log's steps that both price
    (`prefill`: only the steps that compute prompt tokens)."""
    from core.fit.stepfit import trace_features
    from core.sim.stepmodel import FEATURES
    steps_no, X, y = trace_features(log)
    model_ms = X @ fwd.coefficients()
    ok = (model_ms > 0) & (y > 0)
    if prefill:
        ok &= X[:, FEATURES.index("prefill_tokens")] > 0
    return steps_no[ok], y[ok] / model_ms[ok]


def _step_fit(runs: list[Run], fe: FrontEnd, model: str, method: str):
    if method == "spans":
        from core.fit.reqfit import fit_from_requests
        return fit_from_requests([engine_view(r, fe) for r in runs], [r.config for r in runs], model, robust=ROBUST)
    from core.fit.logfit import log_fit
    return log_fit(runs, model, fe, robust=ROBUST)


def reference_step_ms(run: Run) -> float | None:
    """The run's machine speed, in one number from its iteration log: the logged duration of a
    decode-only step of one sequence: the median of those steps, or (fewer than 20) from a line
    through the medians per batch size of its decode-only steps; None without a log of at least
    10 such steps."""
    if run.steps is None or "decode_reqs" not in run.steps.steps:
        return None
    st = run.steps.steps
    dec = st[(st["prefill_reqs"] == 0) & (st["decode_reqs"] > 0)]
    if len(dec) < 10:
        return None
    g = dec.groupby("decode_reqs")["dur_ms"].agg(["median", "size"])
    if 1 in g.index and g.loc[1, "size"] >= 20:
        return float(g.loc[1, "median"])
    g = g[g["size"] >= 5]
    if len(g) < 2:
        return float(dec["dur_ms"].median())
    slope, icept = np.polyfit(g.index.to_numpy(dtype=float), g["median"].to_numpy(), 1, w=np.sqrt(g["size"]))
    return float(icept + max(slope, 0.0))   # (medians per batch size: a stalled step moves none of them)


def at_speed(cal: Calibration, run: Run) -> tuple[Calibration, float]:
    """The calibration scaled to the predicted run's machine speed, one number for the whole run:
    its logged steps against the fitted forward pass for their batches (logged_ratios), the median,
    over the same on the fit runs' own steps (reference_ratio; a closed loop's steps that compute
    prompt tokens, _speed_ratios); every step-model and front-end term
    times it (read from the predicted run's own iteration log: the prediction is then no longer
    wholly held out, and says so). For a run without spans to align its log by; at_speed_over_time
    otherwise. Returns (scaled calibration, factor). (A closed loop of 4 never decodes one
    sequence alone: a reference step of one sequence would price it by extrapolation, 4-8x off.)"""
    ref = cal.report.get("reference_ratio")
    if not ref or run.steps is None or "decode_reqs" not in run.steps.steps \
            or cal.step_model.kind not in ("affine", "features"):
        raise InputError(f"{run.name}: scaling to the run's speed needs iteration logs in the fit runs and in it")
    _, ratio, which = _speed_ratios(cal, run)
    f = float(np.median(ratio))
    sm = dataclasses.replace(cal.step_model, **{k: getattr(cal.step_model, k) * f for k in COEFFICIENTS})
    return Calibration(sm, _scaled(cal.front_end, f), cal.fit_runs,
                       {**cal.report, "speed_factor": f, "speed_from": which}), f


def _speed_ratios(cal: Calibration, run: Run) -> tuple[np.ndarray, np.ndarray, str]:
    """(step numbers, speed ratio, which steps) of the run's logged steps: each step's logged duration over
    the fitted forward pass's price for its batch, over the same on the fit runs' own (reference_ratio;
    1 where the calibration has none). A closed loop's (run.clients) from its steps that compute
    prompt tokens, over the fit runs' own such steps (reference_ratio_prefill), where it logged at
    least SPEED_MIN_STEPS: the loop keeps the engine busy, and its decode steps share the two cores
    with the API server and the client streaming every sequence's token, so their logged forward pass
    stretches where its cycle hardly does (docs/fidelity.md, "A closed loop's speed from the steps that
    compute prompt tokens"). The rule assumes open-loop fit runs (the calibration run): a fit run that is
    itself a closed loop puts its stretched decode steps into reference_ratio. InputError with fewer
    than SPEED_MIN_STEPS steps in all."""
    fwd = forward_model(cal.step_model, cal.report.get("step_model") or {})
    ref_pre = cal.report.get("reference_ratio_prefill")
    if run.clients and ref_pre:
        steps_no, ratio = logged_ratios(fwd, run.steps, prefill=True)
        if len(ratio) >= SPEED_MIN_STEPS:
            return steps_no, ratio / ref_pre, "its steps that compute prompt tokens (a closed loop)"
    steps_no, ratio = logged_ratios(fwd, run.steps)
    if len(ratio) < SPEED_MIN_STEPS:
        raise InputError(f"{run.name}: fewer than {SPEED_MIN_STEPS} logged steps to read its speed from")
    which = "its logged steps" + (f" (a closed loop with fewer than {SPEED_MIN_STEPS} that compute prompt tokens)"
                                  if run.clients and ref_pre else "")
    return steps_no, ratio / (cal.report.get("reference_ratio") or 1.0), which


def _scaled(fe: FrontEnd, f: float) -> FrontEnd:
    return FrontEnd(**{k: v * f for k, v in fe.to_dict().items()})


# The machine's speed read per 5 s of the run: a client's phases last seconds, while a factor read per
# half second also takes in the batches the model misprices there, and a simulated run put under it
# queues, widens its batches and falls further behind (s4's fit predicting s7 wK r2: E2E p50 35.1%
# per 500 ms, 30.7% per 2 s, 9.1% per 5 s; docs/fidelity.md)
SPEED_WINDOW_MS = 5000.0
SPEED_MIN_STEPS = 5       # logged steps in a window for its own factor (else the window before's)


def at_speed_over_time(cal: Calibration, run: Run, window_ms: float = SPEED_WINDOW_MS) -> tuple[Calibration, Speed]:
    """The calibration at the predicted run's machine speed as it went over the run: each logged
    step's duration against the fitted forward pass for its batch (forward_model), over the same
    ratio on the fit runs' own steps (reference_ratio; a closed loop's steps that compute prompt
    tokens, _speed_ratios); its median per `window_ms` of the run (5 s,
    SPEED_WINDOW_MS; the log aligned to the run's spans, core.trace.imports.vllm_log.align_steps)
    is a factor on every simulated step that starts in that window (core.sim.stepmodel.Speed); the
    front end's terms are times the median over the run. A machine whose client takes more of its
    cores in one phase than in another (guidellm's sweep against a 2-core vLLM: one-sequence decode
    steps 1.4 ms under `vllm bench serve`, 3.5 ms beside guidellm, 10 ms at 3 wide in its
    constant-rate phase) is then priced phase by phase. Like at_speed, the prediction reads the
    run's own log and says so."""
    from core.trace.imports.vllm_log import align_steps
    log, truth = run.steps, run.truth
    clock = (truth.meta.get("clock") or {}) if truth is not None else {}
    if log is None or "decode_reqs" not in log.steps or not isinstance(clock.get("t0_s"), (int, float)) \
            or not has_phases(run):
        raise InputError(f"{run.name}: its speed over the run needs its iteration log and its request spans")
    if cal.step_model.kind not in ("affine", "features"):
        raise InputError(f"{run.name}: its speed over the run needs an affine or features step model")
    steps_no, ratio, which = _speed_ratios(cal, run)
    aligned, _, _, unc, _ = align_steps(log, truth, 0.0, float(clock["t0_s"]))
    t_of = dict(zip(aligned["step"].to_numpy().tolist(), aligned["t_ms"].to_numpy(dtype=float).tolist()))
    t0 = float(np.nanmin(truth.requests["arrival_ms"].to_numpy(dtype=float)))   # (the workload's time 0)
    t = np.array([t_of[int(k)] for k in steps_no]) - t0
    order = np.argsort(t, kind="stable")
    t, ratio = t[order], ratio[order]
    whole = float(np.median(ratio))
    edges = np.arange(np.floor(t[0] / window_ms) * window_ms, t[-1] + window_ms, window_ms)
    k = np.searchsorted(edges, t, side="right") - 1
    factors, last = [], whole
    for w in range(len(edges)):
        sel = ratio[k == w]
        if len(sel) >= SPEED_MIN_STEPS:
            last = float(np.median(sel))
        factors.append(last)
    speed = Speed(tuple(edges.tolist()), tuple(np.clip(factors, 0.05, 50.0).tolist()),
                  f"{run.name}: {which} against the fitted forward pass, median per {window_ms:.0f} ms "
                  f"(log aligned to its spans within {unc:.1f} ms)")
    return (Calibration(cal.step_model, _scaled(cal.front_end, whole), cal.fit_runs,
                        {**cal.report, "speed_factor": whole, "speed_from": which}, speed), speed)


def predict(cal: Calibration, run: Run, config=None):
    """The run's workload simulated under its own flags (or `config`) with the calibration."""
    from core.sim.simulate import simulate
    cfg = config or run.config
    if cfg is None:
        unread = [n for n in run.notes if n.startswith("not read: ")]
        raise InputError(f"{run.name}: no engine flags (its files do not state them"
                         + (f"; {'; '.join(unread[:2])}" if unread else "") + "): give them with --flags")
    if run.clients:
        return _predict_closed(cal, run, cfg)
    return simulate(run.workload, cfg, cal.step_model, label=f"{run.name} (predicted)",
                    front_end=cal.front_end, speed=cal.speed)


def _predict_closed(cal: Calibration, run: Run, cfg):
    """A closed loop of run.clients predicted as one (replaying its measured send times would hand
    a simulation slower than the run more requests than the loop keeps in flight): the first
    sends as measured, each later request sent after a simulated finish plus that replacement's
    measured round trip (the client's, core.fit.predict.round_trips_ms, on the front end's clock),
    the front end's way out of the finished request and way in of the new one around it."""
    from core.analysis.metrics import request_metrics
    from core.experiments.sweep import simulate_closed
    from core.fit.predict import round_trips_ms
    from core.sim.frontend import at_front_end
    from core.workload import Workload
    fe, c, w = cal.front_end, run.clients, run.workload
    m = request_metrics(run.truth)
    ok = np.isfinite(m["e2e_ms"].to_numpy(dtype=float))
    arrival, e2e = m["arrival_ms"].to_numpy(dtype=float)[ok], m["e2e_ms"].to_numpy(dtype=float)[ok]
    trips = round_trips_ms(arrival, e2e, c)
    outs = m["output_tokens"].to_numpy(dtype=float)[ok][np.argsort(arrival + e2e, kind="stable")]
    n = len(w.requests)
    in_flight = np.minimum(np.arange(n), c - 1)
    way_in = fe.way_in(w.prompt_tokens, in_flight)
    k = np.arange(max(n - c, 0))
    delays = (trips[np.minimum(k, len(trips) - 1)] if len(trips) else np.zeros(len(k)))
    delays = delays + fe.way_out(np.maximum(outs[np.minimum(k, len(outs) - 1)] - 1, 0)) + way_in[c:]
    inner = Workload([dataclasses.replace(r, arrival_ms=float(r.arrival_ms + way_in[i]))
                      for i, r in enumerate(w.requests)], name=w.name)
    tr, _ = simulate_closed(inner, cfg, cal.step_model, c, delay_ms=delays if len(delays) else 0.0,
                            first_as_given=True, speed=cal.speed)
    sent = dict(zip(tr.ids, tr.requests["arrival_ms"].to_numpy(dtype=float)))   # (at the engine)
    front = Workload([dataclasses.replace(r, arrival_ms=float(sent[r.id] - way_in[i]))
                      for i, r in enumerate(w.requests)], name=w.name)
    tr = at_front_end(tr, front, fe)
    tr.meta["label"] = f"{run.name} (predicted, a closed loop of {c})"
    tr.meta["load"] = {"kind": "closed", "concurrency": c, "first_sends": "as measured",
                       "round_trip_ms_median": float(np.median(trips)) if len(trips) else 0.0}
    return tr


def compare(pred, run: Run) -> pd.DataFrame:
    """Per request of the run: measured and predicted TTFT and E2E (ms, on the run's clock), their
    relative errors (predicted / measured - 1), and each part's measured and predicted ms (NaN
    where the run does not measure it)."""
    p = samples(pred).set_index("id")
    m = samples(run.truth).set_index("id")
    ids = [i for i in run.ids if i in p.index and i in m.index]
    p, m = p.loc[ids], m.loc[ids]
    out = pd.DataFrame({"id": ids, "prompt_tokens": m["prompt_tokens"].to_numpy(),
                        "output_tokens": m["output_tokens"].to_numpy()})
    for k in ("ttft_ms", "e2e_ms"):
        out[f"{k}_measured"] = m[k].to_numpy()
        out[f"{k}_predicted"] = p[k].to_numpy()
        out[f"{k}_error"] = out[f"{k}_predicted"] / out[f"{k}_measured"] - 1.0
    for side, df in (("measured", m), ("predicted", p)):
        out[f"front end_{side}"] = df["front_last_ms"].to_numpy()
        out[f"front end first_{side}"] = df["front_first_ms"].to_numpy()
        out[f"queue_{side}"] = df["queue_ms"].to_numpy()
        out[f"prefill_{side}"] = df["prefill_ms"].to_numpy()
        out[f"decode_{side}"] = (df["inference_ms"] - df["prefill_ms"]).to_numpy()
    return out


def summary(rows: pd.DataFrame) -> dict:
    """Median and p90 of |relative error| of TTFT and E2E, the means, and where E2E's error comes
    from: per part, the mean of (predicted - measured) and of its absolute value, in ms."""
    out = {"requests": int(len(rows))}
    for k in ("ttft_ms", "e2e_ms"):
        e = np.abs(rows[f"{k}_error"].to_numpy(dtype=float))
        e = e[np.isfinite(e)]
        out[k] = {"p50": float(np.median(e)) if len(e) else None,
                  "p90": float(np.percentile(e, 90)) if len(e) else None,
                  "predicted_mean": float(rows[f"{k}_predicted"].mean()),
                  "measured_mean": float(rows[f"{k}_measured"].mean())}
    parts = {}
    for part in PARTS:
        d = (rows[f"{part}_predicted"] - rows[f"{part}_measured"]).to_numpy(dtype=float)
        d = d[np.isfinite(d)]
        parts[part] = {"mean_ms": float(d.mean()) if len(d) else None,
                       "mean_abs_ms": float(np.abs(d).mean()) if len(d) else None}
    out["e2e_error_by_part"] = parts
    known = {k: v["mean_abs_ms"] for k, v in parts.items() if v["mean_abs_ms"] is not None}
    out["largest_part"] = max(known, key=known.get) if known else None
    return out


def evaluate(cal: Calibration, run: Run, fitted: set[str], model: str = "affine", speed_from_log: bool = False,
             pred=None) -> dict:
    """One predicted run as the fidelity command and the Prediction vs measurement page both report
    it: `held_out` (the run is not among the `fitted` ones: its errors are out of sample), the
    speed factor (speed_from_log: over the run, at_speed_over_time, where the run has an iteration log
    and spans, `speed` describing it; else the one number of at_speed), per-request `rows` (compare),
    the `summary`, and `outside`:
    the prediction's steps outside the range the step model was fitted on (None when all inside;
    core.fit.stepfit.outside_range), with `outside_note` in words."""
    from core.fit.stepfit import describe_outside, outside_range
    use, factor, speed = cal, None, None
    if speed_from_log:
        try:        # (over the run where its log and spans allow; else the one number)
            use, sp = at_speed_over_time(cal, run)
            factor, speed = use.report["speed_factor"], sp.describe()
        except InputError:
            use, factor = at_speed(cal, run)
    pred = predict(use, run) if pred is None else pred
    rows = compare(pred, run)
    outside = outside_range(pred, {**cal.report["step_model"], "model": model})
    notes = [f"{describe_outside(outside)}: the prediction extrapolates there"] if outside else []
    busy = front_end_outside(cal, run)
    if busy:
        notes.append(busy)
    return {"held_out": run.name not in fitted, "speed_factor": factor, "speed": speed, "rows": rows,
            "summary": summary(rows),
            "outside": outside, "outside_note": "; ".join(notes) or None}


def front_end_outside(cal: Calibration, run: Run) -> str | None:
    """In words, where the run's requests had more (or fewer) others in flight at the front end than
    the fit runs' requests did, when the fitted front end prices requests in flight: its term is then
    extrapolated (a run that never had more than one in flight cannot say what four cost). None
    when inside, or when the term is 0."""
    per = cal.front_end.in_ms_per_in_flight
    lo, hi = (cal.report.get("front_end") or {}).get("in_flight_range", (None, None))
    if not per or lo is None:
        return None
    s = samples(run.truth)
    busy = s["in_flight"].to_numpy()
    out = int(((busy < lo) | (busy > hi)).sum())
    if not out:
        return None
    return (f"{out:,} of {len(busy):,} requests arrived with {int(busy.min())}–{int(busy.max())} others in flight at "
            f"the front end (fitted {lo}–{hi}): its {per:.3g} ms per request in flight is extrapolated there")


def step_comparison(cal: Calibration, run: Run) -> pd.DataFrame | None:
    """Per step of the run's iteration log (or its trace's steps): its logged duration (vLLM logs the
    forward pass) and the step model's for the same step (prefill tokens, decoding sequences, and
    the features model's other terms; the model prices the engine's whole cycle, so it sits above
    vLLM's log by the per-step time the log leaves out). None without steps."""
    from core.fit.stepfit import trace_features
    from core.sim.stepmodel import FEATURE_COEFFICIENTS
    if run.steps is None:
        return None
    steps, X, y = trace_features(run.steps)
    if not len(y):
        return None
    sm = cal.step_model
    coef = np.array([getattr(sm, k) for k in FEATURE_COEFFICIENTS], dtype=float)
    t = dict(zip(run.steps.steps["step"].to_numpy().tolist(), run.steps.steps["t_ms"].to_numpy(dtype=float)))
    return pd.DataFrame({"step": steps, "t_ms": [t[int(s)] for s in steps],
                         "prefill_tokens": X[:, 1].astype(np.int64), "decode_reqs": X[:, 2].astype(np.int64),
                         "logged_ms": y, "predicted_ms": X @ coef})
