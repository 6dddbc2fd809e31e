"""`python -m core fidelity --fit RUN [RUN ...] --predict RUN [RUN ...] [--json]`: how well the
simulator, fitted on some measured runs, predicts others (core.fit.calibrate)."""
from __future__ import annotations

import json
import math

from core.errors import InputError
from core.fit.calibrate import PARTS, calibrate, evaluate
from core.fit.noise import METRICS, describe, repeat_floor, same_workload, times_floor
from core.fit.runs import load_run, server_log_flags


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def run_fidelity(a) -> int:
    given = _given_flags(a)
    floors = [repeat_floor([load_run(p) for p in group]) for group in (a.repeats or [])]
    if not a.fit:
        _print_floors(floors, a.json)
        return 0
    fit_runs = [load_run(p) for p in a.fit]
    targets = [load_run(p) for p in a.predict]
    _use_given(fit_runs + targets, given, a)
    notes = list(dict.fromkeys(f"{r.name}: {n}" for r in fit_runs + targets for n in r.notes))
    _refuse_unflagged(targets)
    cal = calibrate(fit_runs, a.model, a.method)
    out = _predictions(cal, fit_runs, targets, floors, notes, a)
    if not floors:
        notes.append("no repeats given (--repeats): the errors are not held against the engine's own repeat noise")
    if a.json:
        print(json.dumps(_clean({"fit": [str(r.path) for r in fit_runs], "calibration": {
            "step_model": cal.step_model.to_dict(), "front_end": cal.front_end.to_dict(), "report": cal.report},
            "repeat_floors": floors, "predicted": out, "notes": notes}), allow_nan=False, default=str))
        return 0
    _print_report(cal, fit_runs, floors, out, notes, a.per_request)
    return 0


def _print_report(cal, fit_runs: list, floors: list[dict], out: list[dict], notes: list, per_request: bool) -> None:
    """The calibration, the repeat floors, the predicted runs and the notes, in words."""
    print(f"fitted on {', '.join(r.name for r in fit_runs)} ({cal.report['method']}): {cal.describe()}")
    print(f"  front end split: {cal.report['front_end'].get('split')}")
    for note in (cal.cycle_note(), cal.wake_note()):
        if note:
            print(f"  {note}")
    for floor in floors:
        print(describe(floor))
    _print_table(out)
    _print_runs(out, per_request)
    for n in notes:
        print(f"note: {n}")


def _print_floors(floors: list[dict], as_json: bool) -> None:
    """The repeat floors alone (--repeats without --fit)."""
    if as_json:
        print(json.dumps(_clean({"repeat_floors": floors}), allow_nan=False, default=str))
        return
    for floor in floors:
        print(describe(floor))
        _print_pairs(floor)


def _use_given(runs: list, given, a) -> None:
    """The given flags (--flags or --server-log) for the runs whose files do not state them, with a
    note saying so (never another run's flags: a run whose files do not state them is refused)."""
    if given is None:
        return
    for r in runs:
        if r.config is None:
            r.config = given
            r.notes = [n for n in r.notes if "no engine flags" not in n] + [
                "engine flags from " + ("--flags" if a.flags is not None else f"--server-log {a.server_log}")
                + " (its own files do not state them)"]


def _refuse_unflagged(targets: list) -> None:
    """InputError naming the runs to predict that have no engine flags."""
    unflagged = [r for r in targets if r.config is None]
    if unflagged:
        unread = [n for r in unflagged for n in r.notes if n.startswith("not read: ")]
        raise InputError(f"predict: no engine flags for {', '.join(r.name for r in unflagged)} (its files do not "
                         "state them" + (f"; {'; '.join(unread[:2])}" if unread else "") + "; another run's are "
                         "never assumed): give them with --flags '{\"max_seqs\": 16, ...}' or "
                         "--server-log LOG (the server's whole log, whose start-up lines state them)")


def _predictions(cal, fit_runs: list, targets: list, floors: list[dict], notes: list, a) -> list[dict]:
    """Each target run predicted with the calibration and held against its workload's repeat floor
    (notes added where a prediction extrapolates or has no floor)."""
    fitted = {r.name for r in fit_runs}
    out = []
    for r in targets:
        ev = evaluate(cal, r, fitted, a.model, a.speed_from_log)
        if ev["outside_note"]:
            notes.append(f"{r.name}: {ev['outside_note']}")
        summ = ev["summary"]
        floor = next((f for f in floors if same_workload(r, f)), None)
        if floors and floor is None:
            notes.append(f"{r.name}: no repeats of its workload given (--repeats): its errors are not held against "
                         "a floor")
        out.append({"run": r.name, "path": str(r.path), "held_out": ev["held_out"], "clock": r.clock,
                    "flags": r.config.to_dict(), "speed_factor": ev["speed_factor"], "speed": ev["speed"],
                    "repeat_floor": floor and {m: floor[m]["p50"] for m in METRICS},
                    "floor_runs": floor and floor["runs"],
                    "times_floor": {m: times_floor(summ[m]["p50"], floor, m) for m in METRICS},
                    "outside_fitted_range": ev["outside"], **summ, "rows": ev["rows"].to_dict("records")})
    return out


def _given_flags(a):
    """The flags given for runs whose files do not state them (--flags or --server-log), after the
    arguments' checks."""
    if bool(a.fit) != bool(a.predict):
        raise InputError("fidelity: --fit and --predict go together (runs to fit on, runs to predict)")
    if not a.fit and not a.repeats:
        raise InputError("fidelity: give --fit RUN ... --predict RUN ... (and --repeats RUN RUN ... for the floor "
                         "the errors are held against), or --repeats alone (the floor only)")
    if a.flags is not None and a.server_log is not None:
        raise InputError("fidelity: give the engine flags one way: --flags or --server-log, not both")
    if a.server_log is not None:
        return server_log_flags(a.server_log)
    return _flags(a.flags) if a.flags is not None else None


def _print_table(out: list[dict]) -> None:
    print(f"{'run':<34} {'held out':>8} {'n':>4} {'TTFT p50':>9} {'xfloor':>6} {'p90':>7} {'E2E p50':>8} "
          f"{'xfloor':>6} {'p90':>7} {'TTFT mean pred/meas':>20} {'E2E mean pred/meas':>20}  largest E2E error")
    for o in out:
        t, e = o["ttft_ms"], o["e2e_ms"]
        part = o["largest_part"]
        mae = o["e2e_error_by_part"][part]["mean_abs_ms"] if part else None
        xt, xe = o["times_floor"]["ttft_ms"], o["times_floor"]["e2e_ms"]
        print(f"{o['run']:<34} {'yes' if o['held_out'] else 'no':>8} {o['requests']:>4} {_pct(t['p50']):>9} "
              f"{_x(xt):>6} {_pct(t['p90']):>7} {_pct(e['p50']):>8} {_x(xe):>6} {_pct(e['p90']):>7} "
              f"{t['predicted_mean']:>9.2f}/{t['measured_mean']:<10.2f} {e['predicted_mean']:>9.2f}/"
              f"{e['measured_mean']:<10.2f}  {part or '-'}"
              + (f" ({mae:.2f} ms mean |error|)" if mae is not None else ""))


def _print_runs(out: list[dict], per_request: bool) -> None:
    for o in out:
        sp = o.get("speed")
        if sp:
            print(f"{o['run']}: at its machine speed over the run (from its iteration log): steps "
                  f"x{sp['factor_min']:.2f}-{sp['factor_max']:.2f} (median {sp['factor_median']:.2f}) in "
                  f"{sp['windows']} windows, the front end x{o['speed_factor']:.2f}; {sp['how']}")
        elif o["speed_factor"] is not None:
            print(f"{o['run']}: terms scaled x{o['speed_factor']:.3f} to its machine speed (its logged steps "
                  "against the fitted forward pass, the median, over the fit runs' own)")
        print(f"{o['run']}: times on {o['clock']}; E2E error by part (mean predicted - measured, ms): "
              + ", ".join(f"{p} {_ms(o['e2e_error_by_part'][p]['mean_ms'])}" for p in PARTS))
        within = [w for m, w in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E"))
                  if o["times_floor"][m] is not None and o["times_floor"][m] <= 1.0]
        if within:
            print(f"{o['run']}: {' and '.join(within)} within the repeat floor (as close as a repeat of the run came)")
        if per_request:
            for row in o["rows"]:
                print(f"  {row['id']}: TTFT {row['ttft_ms_predicted']:.2f} / {row['ttft_ms_measured']:.2f} ms "
                      f"({row['ttft_ms_error']:+.1%}), E2E {row['e2e_ms_predicted']:.2f} / "
                      f"{row['e2e_ms_measured']:.2f} ms ({row['e2e_ms_error']:+.1%})")


def _print_pairs(floor: dict) -> None:
    for m, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
        f = floor[m]
        print(f"{name}: run medians " + ", ".join(f"{x:.2f}" for x in f["run_medians"]) + " ms; per pair (one "
              "repeat as the other's prediction): " + ", ".join(f"{p['as_prediction']}->{p['of']} {_pct(p['p50'])}"
                                                             for p in f["pairs"]))


def _x(x) -> str:
    return "-" if x is None else f"{x:.1f}x"


def _flags(text: str):
    from core.config import SchedulerConfig, from_dict
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
