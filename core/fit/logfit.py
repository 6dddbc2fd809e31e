"""The step model fitted to measured runs' iteration logs (core.fit.calibrate's `method="log"`):
the forward pass each logged step times, plus what the engine's cycle holds beyond it, fitted so
that the fit runs simulated under their flags reproduce their spans (with the engine's wake-up
after a pause, core.fit.wake)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from core.errors import InputError
from core.fit.engineview import engine_view, has_phases
from core.fit.frontfit import samples
from core.fit.runs import Run
from core.sim.frontend import FrontEnd
from core.sim.stepmodel import StepModel

OVERHEAD_TERMS = ("base_ms",)   # what a cycle holds beyond the logged forward pass
# ... and its part per decoding sequence (the engine core's scheduling and output hand-over of each
# request: the logged forward pass hardly grows with the batch, the cycle does), fitted only where
# the fit runs decode at WIDTH_SPAN or more widths apart, each seen on MIN_CELL+ decode-only steps:
# a run decoding at one width (a closed loop) cannot tell it from the fixed part
PER_SEQ_TERMS = ("base_ms", "decode_ms_per_seq")
WIDTH_SPAN = 4


def decode_widths(logs) -> list[int]:
    """The decode-only batch sizes the iteration logs show on MIN_CELL or more steps each."""
    st = pd.concat([t.steps for t in logs], ignore_index=True)
    dec = st[(st["prefill_reqs"] == 0) & (st["decode_reqs"] > 0)]
    n = dec.groupby("decode_reqs").size()
    return sorted(int(k) for k in n[n >= MIN_CELL].index)


def log_fit(runs: list[Run], model: str, fe: FrontEnd | None = None, robust: float | None = None):
    """The step model fitted to the runs' iteration logs together (the forward pass each step
    logs), plus what the engine's cycle holds beyond it (scheduling, the output's processing and
    hand-over: a fixed part and a part per decoding sequence, OVERHEAD_TERMS), fitted so that the
    fit runs simulated under their flags reproduce their spans' engine-core view
    (core.fit.reqfit.fit_added_terms, with the soft-L1 scale `robust`), starting from the spans' median decode time per
    token minus the median logged decode-only step. Without spans, that start alone (or nothing).
    With spans, the engine's wake-up after a pause (core.fit.wake) is fitted first from the runs'
    TTFTs, the forward pass then priced on the steps of a busy engine (a prefill with nothing
    decoding beside it may be a first step after a pause), and the two are fitted in turn
    (WAKE_ROUNDS); where the runs cannot tell a wake-up (a closed loop), every step prices it."""
    from core.fit.stepfit import trace_features
    logs = [r.steps for r in runs if r.steps is not None and len(trace_features(r.steps)[2])]
    if not logs:
        raise InputError("fit: --method log needs step events: an iteration log (vLLM's server log with "
                         "--enable-logging-iteration-details) or a trace with steps, in a fit run")
    with_phases = [r for r in runs if has_phases(r)]
    # (with spans, a wake-up after pauses is fitted below: the forward pass is priced on a busy engine's steps)
    sm, quality = _log_forward(logs, model, busy_only=fe is not None and bool(with_phases))
    overhead = _overhead_start_ms(runs)
    if fe is None or not with_phases:
        sm = dataclasses.replace(sm, base_ms=sm.base_ms + overhead)
        return sm, {"fitted_on": "iteration logs", **quality, "overhead_ms": overhead}
    return _cycle_fit(logs, with_phases, model, fe, sm, quality, overhead, robust)


def _overhead_start_ms(runs: list[Run]) -> float:
    """Where the cycle beyond the logged forward pass starts: per run with a log of counted steps and
    spans, the spans' median decode time per token minus the median logged decode-only step; their
    median, at least 0 (0 without such runs)."""
    from core.fit.stepfit import counted_steps
    extra = []
    for r in runs:   # (the forward pass an iteration log times is not the engine's whole cycle)
        if r.steps is None or not counted_steps(r.steps) or not has_phases(r):
            continue
        s = samples(r.truth)
        many = s["output_tokens"] > 1
        per = ((s["inference_ms"] - s["prefill_ms"]) / (s["output_tokens"] - 1))[many]
        st = r.steps.steps
        dec = st[(st["prefill_reqs"] == 0) & (st["decode_reqs"] > 0)]["dur_ms"]
        if len(per) and len(dec):
            extra.append(float(per.median()) - float(dec.median()))
    return max(float(np.median(extra)), 0.0) if extra else 0.0


def _cycle_fit(logs, with_phases: list[Run], model: str, fe: FrontEnd, sm: StepModel, quality: dict,
               overhead: float, robust: float | None):
    """log_fit with spans: the wake-up after a pause and the cycle's added terms fitted in turn on
    the runs' engine-core view, from the forward pass `sm` and the added terms' start `overhead`."""
    from core.fit.reqfit import fit_added_terms
    from core.fit.wake import fit_wake
    terms, cycle_terms = _cycle_terms(decode_widths(logs))
    views, configs = [engine_view(r, fe) for r in with_phases], [r.config for r in with_phases]
    woke, wake = fit_wake(views, configs, dataclasses.replace(sm, base_ms=sm.base_ms + overhead))
    if woke.wake_ms > 0:
        sm = dataclasses.replace(sm, wake_ms=woke.wake_ms, wake_tau_ms=woke.wake_tau_ms)
    elif quality.get("busy_only"):   # (no wake-up to carry the slower steps after a pause: all steps price it)
        sm, quality = _log_forward(logs, model, busy_only=False)
    sm, added = fit_added_terms(views, configs, sm, terms, {"base_ms": overhead}, robust=robust)
    sm, added, wake = _wake_rounds(views, configs, sm, terms, added, wake, robust)
    return sm, {"fitted_on": "iteration logs + the cycle beyond them from the spans", **quality,
                "cycle_terms": cycle_terms, "overhead_ms": added["added"]["base_ms"], "overhead": added, "wake": wake}


def _cycle_terms(widths: list[int]) -> tuple[tuple[str, ...], str]:
    """(the cycle's added terms, in words why): a part per decoding sequence beside the fixed part
    where the decode-only widths (decode_widths) lie WIDTH_SPAN or more apart."""
    terms = PER_SEQ_TERMS if widths and widths[-1] - widths[0] >= WIDTH_SPAN else OVERHEAD_TERMS
    seen = f"widths {widths[0]}-{widths[-1]}" if widths else "no width"
    cycle_terms = (f"fixed and per decoding sequence (decode-only steps at {seen})" if len(terms) > 1 else
                   f"fixed only (decode-only steps at {seen}, {MIN_CELL}+ steps each: "
                   + (f"{widths[-1] - widths[0]} apart" if widths else "none")
                   + f"; a part per decoding sequence needs widths {WIDTH_SPAN}+ apart)")
    return terms, cycle_terms


def _wake_rounds(views, configs, sm: StepModel, terms, added: dict, wake: dict, robust: float | None):
    """The wake-up fitted again from the cycle the added terms left, then those terms again, for up
    to WAKE_ROUNDS - 1 more rounds while a wake-up is found: (step model, added terms, wake report)."""
    from core.fit.reqfit import fit_added_terms
    from core.fit.wake import fit_wake
    for _ in range(WAKE_ROUNDS - 1):
        if sm.wake_ms <= 0:
            break
        woke, again = fit_wake(views, configs, sm)
        if woke.wake_ms <= 0:
            break
        wake = again
        fwd = dataclasses.replace(sm, **{t: getattr(sm, t) - added["added"][t] for t in terms},
                                  wake_ms=woke.wake_ms, wake_tau_ms=woke.wake_tau_ms)
        sm, added = fit_added_terms(views, configs, fwd, terms, added["added"], robust=robust)
    return sm, added, wake


MIN_CELL = 20     # decode-only steps of one batch size for their median to count (_log_forward)
MIN_BUSY_PREFILLS = 5   # prefills beside decodes for the forward pass to be priced on those alone
WAKE_ROUNDS = 2   # the wake-up and the cycle's added terms fitted in turn (each leaves the other's share)


def _log_forward(logs, model: str, busy_only: bool = False):
    """The forward pass as the iteration logs time it: the cost per decoding sequence is the slope
    of the median decode-only step over the batch sizes seen at least MIN_CELL times (weighted by
    the square root of their counts; 0 when fewer than two such sizes or a falling slope: a run
    that decodes at one batch size cannot tell a step's fixed cost from its cost per sequence, and
    least squares over mixed steps then puts the noise of a few wide steps on that term); the other
    terms by non-negative least squares on what that leaves."""
    from core.fit.stepfit import feature_range, model_of, solve, trace_features
    from core.sim.stepmodel import FEATURES
    parts = [trace_features(t) for t in logs]
    X = np.vstack([p[1] for p in parts])
    y = np.concatenate([p[2] for p in parts])
    st = pd.concat([t.steps for t in logs], ignore_index=True)
    dec = st[(st["prefill_reqs"] == 0) & (st["decode_reqs"] > 0)]
    g = dec.groupby("decode_reqs")["dur_ms"].agg(["median", "size"])
    g = g[g["size"] >= MIN_CELL]
    slope = 0.0
    if len(g) >= 2:
        slope = max(float(np.polyfit(g.index.to_numpy(dtype=float), g["median"].to_numpy(), 1,
                                     w=np.sqrt(g["size"].to_numpy()))[0]), 0.0)
    k = FEATURES.index("decode_seqs")
    p = FEATURES.index("prefill_tokens")
    busy = ~((X[:, p] > 0) & (X[:, k] == 0))
    busy_only = busy_only and ((X[:, p] > 0) & busy).sum() >= MIN_BUSY_PREFILLS
    if busy_only:
        # (a prefill with nothing decoding beside it may be the first step after a pause, slower by
        # the engine's wake-up (core.fit.wake): the forward pass is priced on steps of a busy engine)
        X, y = X[busy], y[busy]
    rest = X.copy()
    rest[:, k] = 0.0
    coef, quality = solve(rest, y - slope * X[:, k], model)
    coef[k] = slope
    quality["range"] = feature_range(X)         # (the steps' own: the decode column was set aside above)
    quality["busy_only"] = busy_only
    quality["decode_ms_per_seq_from"] = (f"decode-only step medians at {len(g)} batch sizes" if len(g) >= 2 else
                                         f"{len(g)} batch size(s) with {MIN_CELL}+ decode-only steps: not separable "
                                         "from the fixed cost, 0")
    return model_of(model, coef), quality
