"""How well the simulator, fitted on some real vLLM runs, predicts the others: per-request TTFT and
E2E against vLLM's own measurement of each request (its OTLP spans, on its front end's clock).

    python -m bench.vllm_log_fidelity [--json] [--sets NAME,...]     # ~6 min on the 2-core VM

Runs: data/imports/vllm_telemetry (vLLM 0.32.0's CPU build serving the tiny byte model; MADE.md):
run1/run2 made 2026-12-01 on one server, run3..run9 made 2026-12-04, one server each. Each fit set
is fitted jointly (core.fit.calibrate: the front end from the spans' phases, the step model to the
engine core's view of each request, every run under its own flags read from its server log), then
every run outside the set is predicted under its own flags (held out). Two predictions per run:
- as fitted;
- at the run's speed (`--speed-from-log`, core.fit.calibrate.at_speed_over_time / at_speed): the
  run's logged steps against the fitted forward pass, over the fit runs' own, per 5 s of the run
  (one number where the run has no spans); read from the predicted run's own iteration log: this
  VM's speed drifts between servers started minutes apart.
Error = |predicted - measured| / measured per request; median and p90 over the run's requests.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from core.fit.calibrate import at_speed, calibrate, compare, predict, reference_step_ms, summary
from core.fit.runs import load_run

ROOT = Path(__file__).resolve().parents[1] / "data" / "imports" / "vllm_telemetry"
ALL = ["run1_c4_p128_o32", "run2_poisson4_p192_o48", "run3_c8_p256_o64", "run4_poisson8_p128_o32",
       "run5_poisson20_p192_o48", "run6_noprefix_poisson4_p192_o48", "run7_bs64_poisson6_p256_o32",
       "run8_seqs4_c12_p128_o64", "run9_poisson2_p64_o128"]
# fit sets: (name, fit runs, runs to predict)
SETS = {
    "dec01": (["run1_c4_p128_o32"], ["run2_poisson4_p192_o48"]),
    "closed": (["run3_c8_p256_o64", "run8_seqs4_c12_p128_o64"],
               ["run4_poisson8_p128_o32", "run5_poisson20_p192_o48", "run6_noprefix_poisson4_p192_o48",
                "run7_bs64_poisson6_p256_o32", "run9_poisson2_p64_o128"]),
    "poisson": (["run4_poisson8_p128_o32", "run9_poisson2_p64_o128"],
                ["run3_c8_p256_o64", "run5_poisson20_p192_o48", "run6_noprefix_poisson4_p192_o48",
                 "run7_bs64_poisson6_p256_o32", "run8_seqs4_c12_p128_o64"]),
}


def main() -> int:
    names = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--sets=")), list(SETS))
    runs = {n: load_run(ROOT / n) for n in ALL}
    for r in runs.values():          # run2's log starts mid-server (split from run1's): run1's flags
        if r.config is None:
            r.config = runs["run1_c4_p128_o32"].config
    rows = []
    for name in names:
        fit_on, targets = SETS[name]
        cal = calibrate([runs[n] for n in fit_on])
        for t in targets:
            r = runs[t]
            for variant in ("as fitted", "at its speed"):
                use, f = at_speed(cal, r) if variant == "at its speed" else (cal, None)
                s = summary(compare(predict(use, r), r))
                rows.append({"set": name, "fit_on": fit_on, "predict": t, "variant": variant, "speed_factor": f,
                             "step_model": use.step_model.describe(), "front_end": use.front_end.describe(),
                             "reference_step_ms": reference_step_ms(r), **s})
        print(f"# {name}: fitted on {', '.join(fit_on)}: {cal.describe()}", file=sys.stderr)
    if "--json" in sys.argv:
        print(json.dumps(rows))
        return 0
    print(f"{'set':<8} {'predict (held out)':<34} {'variant':<13} {'speed':>6} {'TTFT p50':>9} {'p90':>7} "
          f"{'E2E p50':>8} {'p90':>7} {'E2E mean pred/meas':>20}  largest part")
    for r in rows:
        t, e = r["ttft_ms"], r["e2e_ms"]
        f = "" if r["speed_factor"] is None else f"x{r['speed_factor']:.2f}"
        print(f"{r['set']:<8} {r['predict']:<34} {r['variant']:<13} {f:>6} {t['p50']:>9.1%} {t['p90']:>7.1%} "
              f"{e['p50']:>8.1%} {e['p90']:>7.1%} {e['predicted_mean']:>9.2f}/{e['measured_mean']:<10.2f} "
              f"{r['largest_part']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
