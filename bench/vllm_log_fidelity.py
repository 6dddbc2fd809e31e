"""The payoff of reading vLLM's own telemetry: fit a step model to vLLM's iteration log of one
run and predict another run's per-request TTFT and E2E, against what vLLM measured itself (its
spans), beside the fit to the client's streamed token times (core.fit.stepinfer).

    python -m bench.vllm_log_fidelity          # both directions over the bundled runs

Runs: data/imports/vllm_telemetry (vLLM 0.32.0 CPU build, the tiny model; MADE.md). Each
prediction simulates the predicted run's workload (its prompts, output lengths and arrivals at
vLLM's front-end: core.lessons.vllm_runs.run_workload) under vLLM's flags (VLLM_CONFIG) and
compares every request with its span: error = |predicted - measured| / measured. Fits:
- log: affine, fitted to the fit run's logged step durations (python -m core fit LOG);
- log + spans: the same plus, per step, what the log's elapsed time leaves out (scheduling,
  sampling, output processing), measured in the fit run's spans (vllm_runs.calibrated_step_model);
- token times: affine, fitted to the steps inferred from the fit run's client file
  (python -m core fit RESULT.json --from-token-times).
"""
from __future__ import annotations

import json
import sys

import numpy as np

from core.analysis.metrics import request_metrics
from core.fit.stepfit import fit
from core.fit.stepinfer import fit_inferred
from core.lessons.vllm_runs import RUNS, VLLM_CONFIG, calibrated_step_model, engine_view, run_dir, run_workload
from core.sim.simulate import simulate
from core.trace import open_trace


def models(run: str) -> dict:
    d = run_dir(run)
    client = next(d.glob("vllm_bench_*.json"))
    return {"log": fit(open_trace(d / "server.log").trace, "affine")[0],
            "log + spans": calibrated_step_model(run)[0],
            "token times": fit_inferred(open_trace(client).trace, VLLM_CONFIG, "affine")[0]}


def errors(sm, run: str) -> dict:
    pred = request_metrics(simulate(run_workload(run), VLLM_CONFIG, sm)).set_index("id")
    real = engine_view(run)
    out = {}
    for k in ("ttft_ms", "e2e_ms"):
        e = (np.abs(pred.loc[real.index, k] - real[k]) / real[k]).to_numpy()
        out[k] = {"p50": float(np.median(e)), "p90": float(np.percentile(e, 90)),
                  "predicted_mean": float(pred[k].mean()), "measured_mean": float(real[k].mean())}
    return out


def main() -> int:
    runs = list(RUNS)
    rows = []
    for src in runs:
        for name, sm in models(src).items():
            for dst in runs:
                rows.append({"fit_on": src, "fit": name, "predict": dst, "held_out": dst != src,
                             "step_model": sm.describe(), **errors(sm, dst)})
    if "--json" in sys.argv:
        print(json.dumps(rows))
        return 0
    print(f"{'fit on':<24} {'fit':<12} {'predict':<24} {'TTFT p50':>9} {'p90':>7} {'E2E p50':>8} {'p90':>7} "
          f"{'TTFT mean pred/meas':>20} {'E2E mean pred/meas':>20}")
    for r in rows:
        t, e = r["ttft_ms"], r["e2e_ms"]
        print(f"{r['fit_on']:<24} {r['fit']:<12} {r['predict']:<24} {t['p50']:>9.1%} {t['p90']:>7.1%} "
              f"{e['p50']:>8.1%} {e['p90']:>7.1%} {t['predicted_mean']:>9.2f}/{t['measured_mean']:<10.2f} "
              f"{e['predicted_mean']:>9.2f}/{e['measured_mean']:<10.2f}")
    for src in runs:
        print(f"{src}: " + "; ".join(f"{name}: {sm.describe()}" for name, sm in models(src).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
