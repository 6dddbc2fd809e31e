"""`python -m core fidelity --fit RUN [RUN ...] --predict RUN [RUN ...] [--json]`: how well the
simulator, fitted on some measured runs, predicts others (core.fit.calibrate)."""
from __future__ import annotations

import json
import math

from core.fit.calibrate import PARTS, calibrate, evaluate
from core.fit.runs import load_run


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def run_fidelity(a) -> int:
    given = _flags(a.flags) if a.flags is not None else None    # ('' is refused there: not a JSON object)
    fit_runs = [load_run(p) for p in a.fit]
    targets = [load_run(p) for p in a.predict]
    flags = given or next((r.config for r in fit_runs if r.config is not None), None)
    notes = [f"{r.name}: {n}" for r in fit_runs + targets for n in r.notes]
    for r in fit_runs + targets:
        if r.config is None and flags is not None:   # (the same server's later run: its log has no start-up lines)
            r.config = flags
            notes.append(f"{r.name}: engine flags " + ("from --flags" if given else "taken from the fit runs' ")
                         + "(its own files do not state them)")
    cal = calibrate(fit_runs, a.model, a.method)
    fitted = {r.name for r in fit_runs}
    out = []
    for r in targets:
        ev = evaluate(cal, r, fitted, a.model, a.speed_from_log)
        if ev["outside_note"]:
            notes.append(f"{r.name}: {ev['outside_note']}")
        out.append({"run": r.name, "path": str(r.path), "held_out": ev["held_out"], "clock": r.clock,
                    "flags": r.config.to_dict(), "speed_factor": ev["speed_factor"],
                    "outside_fitted_range": ev["outside"], **ev["summary"], "rows": ev["rows"].to_dict("records")})
    if a.json:
        print(json.dumps(_clean({"fit": [str(r.path) for r in fit_runs], "calibration": {
            "step_model": cal.step_model.to_dict(), "front_end": cal.front_end.to_dict(), "report": cal.report},
            "predicted": out, "notes": notes}), allow_nan=False, default=str))
        return 0
    print(f"fitted on {', '.join(r.name for r in fit_runs)} ({cal.report['method']}): {cal.describe()}")
    print(f"  front end split: {cal.report['front_end'].get('split')}")
    print(f"{'run':<34} {'held out':>8} {'n':>4} {'TTFT p50':>9} {'p90':>7} {'E2E p50':>8} {'p90':>7} "
          f"{'TTFT mean pred/meas':>20} {'E2E mean pred/meas':>20}  largest E2E error")
    for o in out:
        t, e = o["ttft_ms"], o["e2e_ms"]
        part = o["largest_part"]
        mae = o["e2e_error_by_part"][part]["mean_abs_ms"] if part else None
        print(f"{o['run']:<34} {'yes' if o['held_out'] else 'no':>8} {o['requests']:>4} {_pct(t['p50']):>9} "
              f"{_pct(t['p90']):>7} {_pct(e['p50']):>8} {_pct(e['p90']):>7} "
              f"{t['predicted_mean']:>9.2f}/{t['measured_mean']:<10.2f} {e['predicted_mean']:>9.2f}/"
              f"{e['measured_mean']:<10.2f}  {part or '-'}"
              + (f" ({mae:.2f} ms mean |error|)" if mae is not None else ""))
    for o in out:
        if o["speed_factor"] is not None:
            print(f"{o['run']}: terms scaled x{o['speed_factor']:.3f} to its machine speed (its iteration log's "
                  "median one-sequence decode step against the fit runs')")
        print(f"{o['run']}: times on {o['clock']}; E2E error by part (mean predicted - measured, ms): "
              + ", ".join(f"{p} {_ms(o['e2e_error_by_part'][p]['mean_ms'])}" for p in PARTS))
        if a.per_request:
            for row in o["rows"]:
                print(f"  {row['id']}: TTFT {row['ttft_ms_predicted']:.2f} / {row['ttft_ms_measured']:.2f} ms "
                      f"({row['ttft_ms_error']:+.1%}), E2E {row['e2e_ms_predicted']:.2f} / "
                      f"{row['e2e_ms_measured']:.2f} ms ({row['e2e_ms_error']:+.1%})")
    for n in notes:
        print(f"note: {n}")
    return 0


def _flags(text: str):
    from core.config import SchedulerConfig, from_dict
    from core.errors import InputError
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:    # (nested too deeply: a RecursionError)
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise InputError(f"--flags: expected a JSON object of scheduler options, got {text[:80]!r} ({why})") from None
    if not isinstance(d, dict):
        raise InputError(f"--flags: expected a JSON object of scheduler options, got {type(d).__name__}")
    return from_dict(SchedulerConfig, {"policy": "vllm-v1", **d}, where="--flags")


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def _ms(x) -> str:
    return "-" if x is None else f"{x:+.2f}"
