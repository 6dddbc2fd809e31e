"""How good is the simulator? Fit a step model on one part of a measured run (or on another
run), predict the run with the core scheduler under the options its metadata records, and
compare request by request.

- Fit on the run's first part: the step model is fitted (core.fit.stepfit) to the steps that
  start before a split time; requests first scheduled after it are "held out" (none of their
  steps was fitted; the prediction still replays the whole run, so this is a forward-in-time
  test within one run, not an independent one). Errors are reported for held-out and in-sample requests
  separately.
- Fit on another run (another workload or another day): every request is held out.
- A run without step events (an engine's benchmark result file): fit on another such run of
  the same engine, to its steps read off the streamed token times (core.fit.stepinfer) or to its
  requests' TTFT and E2E (core.fit.reqfit), under the scheduler settings given, and replay this
  run as its clients sent it (core.fit.predict.replayed_run); every request is held out.

A request's error is |predicted - measured| / measured, of TTFT and of E2E (core.analysis.metrics
definitions). The predicted schedule's batches are checked against the range the model was
fitted on (core.fit.stepfit.outside_range): where they leave it, the step times are extrapolated.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from core.analysis.metrics import first_scheduled_ms, request_metrics
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.fit.predict import scheduler_options
from core.fit.stepfit import MIN_STEPS, fit, outside_range, outside_steps
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import Trace

METRICS = (("ttft_ms", "TTFT"), ("e2e_ms", "E2E"))


@dataclass
class Fidelity:
    step_model: StepModel
    fit_report: dict
    fit_on: str                  # in words
    requests: pd.DataFrame       # per request: id, prompt/output tokens, held_out, measured/predicted/error per metric
    outside: dict | None         # the prediction's steps outside the fitted range (core.fit.stepfit.outside_range)
    predicted: Trace

    @cached_property
    def outside_table(self) -> pd.DataFrame:
        """The predicted steps outside the fitted range (core.fit.stepfit.outside_steps), computed once."""
        return outside_steps(self.predicted, self.fit_report) if self.outside else pd.DataFrame()

    def summary(self) -> pd.DataFrame:
        """Median, p90 and max error per metric, for held-out and in-sample requests."""
        rows = []
        for held, name in ((True, "held out"), (False, "in sample")):
            part = self.requests[self.requests["held_out"] == held]
            for key, label in METRICS:
                e = part[f"{key}_error"].to_numpy(dtype=float)
                e = e[np.isfinite(e)]
                if len(e):
                    rows.append({"requests": name, "metric": label, "n": len(e), "median error": float(np.median(e)),
                                 "p90 error": float(np.percentile(e, 90)), "max error": float(e.max())})
        return pd.DataFrame(rows)

    def worst(self, k: int = 10, metric: str = "e2e_ms") -> pd.DataFrame:
        """The k held-out requests (all, if none is held out) the prediction misses most."""
        d = self.requests[self.requests["held_out"]] if self.requests["held_out"].any() else self.requests
        return d.sort_values(f"{metric}_error", ascending=False, na_position="last").head(k)


def how_good(target: Trace, model: str = "features", fit_on: Trace | None = None,
             split: float = 0.5, config: SchedulerConfig | None = None, method: str = "token times") -> Fidelity:
    """Fit on `fit_on` (or on `target`'s steps before `split` of its step span) and predict
    `target`. A target without step events needs `fit_on` (a run of the same engine) and the
    engine's scheduler `config`; it is fitted by `method` ("token times" or "requests").
    Raises ConfigError when either has too few steps to fit."""
    if len(target.steps) < MIN_STEPS and config is not None:
        return _without_steps(target, fit_on, config, method)
    if len(target.steps) < MIN_STEPS:
        raise ConfigError(f"the trace needs step events to predict (at least {MIN_STEPS} steps, has "
                          f"{len(target.steps)})")
    measured = request_metrics(target)
    if fit_on is None:
        if not 0 < split < 1:
            raise ConfigError(f"split: expected a fraction in (0, 1), got {split!r}")
        t = target.steps["t_ms"].to_numpy(dtype=float)
        until = float(t.min() + split * (t.max() - t.min()))
        sm, report = fit(target, model, until_ms=until)
        held, desc = _held_out_after(target, until)
        desc = f"this run's {report['steps']:,} steps before {until:,.0f} ms ({split:.0%} of its span); " + desc
    else:
        sm, report = fit(fit_on, model)
        held = np.ones(len(measured), dtype=bool)
        desc = f"{fit_on.label} ({report['steps']:,} steps); held out: every request of this run"
    pred = simulate(target.workload(), scheduler_options(target), sm, label=f"predicted for {target.label}",
                    record_kv=False)
    return _compared(target, measured, held, sm, report, desc, pred)


def _held_out_after(target: Trace, until: float) -> tuple[np.ndarray, str]:
    """Which requests none of the fitted steps (those before `until`) computed: those first scheduled at
    or after it. Where the trace does not say which steps computed a request (an engine's iteration log
    names no requests), its arrival stands in: a request that arrives after `until` cannot be in a
    step before it (one that arrived before and waited is counted in sample, the cautious side)."""
    first = np.asarray(first_scheduled_ms(target), dtype=float)
    known = np.isfinite(first)
    start = np.where(known, first, target.requests["arrival_ms"].to_numpy(dtype=float))
    held = start >= until
    n = int(held.sum())
    by = ("first scheduled" if known.all() else
          "arriving (the trace does not say which steps computed each request)" if not known.any() else
          f"first scheduled (arriving, for the {int((~known).sum()):,} whose steps the trace does not name)")
    desc = f"held out: the {n:,} requests {by} at or after it"
    if n == 0:
        desc += (f" — none: every request started before {until:,.0f} ms, so this split holds nothing out; "
                 "raise the split's fraction of the run or fit on another run (every request held out)")
    return held, desc


def _without_steps(target: Trace, fit_on: Trace | None, config: SchedulerConfig, method: str) -> Fidelity:
    from core.fit.predict import replayed_run
    from core.fit.reqfit import fit_from_requests
    from core.fit.stepinfer import fit_inferred
    if fit_on is None:
        raise ConfigError("the trace has no step events: fit on another run of the same engine (a result file with "
                          "per-token times or send times)")
    if method == "token times":
        sm, report = fit_inferred(fit_on, config, "affine")
        how = f"{report['steps']:,} steps inferred from its token times"
    elif method == "requests":
        sm, report = fit_from_requests(fit_on, config)
        how = f"its {report['requests']:,} requests' TTFT and E2E"
    else:
        raise ConfigError(f"method: expected 'token times' or 'requests', got {method!r}")
    pred, clients = replayed_run(target, config, sm)
    measured = request_metrics(target)
    desc = (f"{fit_on.label} ({how}); replayed "
            + (f"as a closed loop of {clients} clients" if clients else "at its send times")
            + "; held out: every request of this run")
    return _compared(target, measured, np.ones(len(measured), dtype=bool), sm, report, desc, pred)


def _compared(target, measured, held, sm, report, desc, pred) -> Fidelity:
    p = request_metrics(pred).set_index("id")
    out = pd.DataFrame({"id": measured["id"], "prompt_tokens": target.requests["prompt_tokens"].to_numpy(),
                        "output_tokens": measured["output_tokens"], "held_out": held})
    for key, _ in METRICS:
        m = measured[key].to_numpy(dtype=float)
        q = p[key].reindex(measured["id"]).to_numpy(dtype=float)
        out[f"{key}_measured"], out[f"{key}_predicted"] = m, q
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"{key}_error"] = np.where(m > 0, np.abs(q - m) / m, np.nan)
    return Fidelity(sm, report, desc, out, outside_range(pred, report), pred)
