"""How well does the simulator predict the runner? Fit a step model on one captured run,
simulate a different workload under the same scheduler options, and compare per-request TTFT
and E2E with that workload's captured run (issue 15's first target).

    python -m bench.fidelity [--threads 1,2] [--requests 48]

Workloads (prompt ids from the bundled corpus, greedy decoding on the bundled tiny model):
  fit:     Poisson arrivals at 80 req/s, prompts 16-64 or 512-768 tokens (bimodal: context
           length varies independently of batch size), outputs 4-64 (a queue, so that its
           batches span nearly the range the other workload reaches);
  predict: a burst of half the requests at t = 0, the rest at 15 req/s, prompts 96-480,
           outputs 4-40 (another mix and another arrival process).
Scheduler: continuous, 16 sequences, 1,024-token budget, chunk 256, block size 16. Before the
measured runs at each thread count, both workloads run once unmeasured (warm-up). Each
model (affine, features) is fitted by python -m core fit's code (core.fit.stepfit) on the fit run
and priced the predict run's workload; errors are |predicted - measured| / measured per
request. The fit workload is also run a second time and predicted from the first run's fit:
that error is the machine's noise floor (the same workload, the same engine, minutes apart).
Also in-sample: the fit run predicted from its own fit. "affine/requests" is fitted
without step events, from the fit run's per-request TTFT and E2E alone (core.fit.reqfit, as for an
engine's result file). Prints; asserts nothing.
"""
import argparse
import platform

import numpy as np
import torch

from bench.runner import CORPUS, serve
from core.analysis.metrics import request_metrics
from core.config import SchedulerConfig
from core.fit.reqfit import fit_from_requests
from core.fit.stepfit import describe_outside, fit, outside_range, trace_features
from core.sim.simulate import simulate
from core.workload import Request, Workload
from gpu_runner import checkpoint

SCHED = dict(policy="continuous", max_seqs=16, token_budget=1024, chunk=256, block_size=16)


def mixed(n, prompt, output, seed, arrivals):
    rng = np.random.default_rng(seed)
    reqs = []
    for i, t in enumerate(arrivals(rng, n)):
        lo_hi = prompt[int(rng.integers(len(prompt)))] if isinstance(prompt, list) else prompt   # a mix of ranges
        p = int(rng.integers(*lo_hi))
        s = int(rng.integers(0, len(CORPUS) - p))
        reqs.append(Request(f"r{i}", float(t), p, int(rng.integers(*output)), prompt_ids=tuple(CORPUS[s:s + p])))
    return Workload(reqs)


def poisson(rate):
    return lambda rng, n: np.round(np.cumsum(rng.exponential(1000.0 / rate, n)), 3)


def burst_then(rate):
    def arrivals(rng, n):
        k = n // 2
        return np.concatenate([np.zeros(k), np.round(np.cumsum(rng.exponential(1000.0 / rate, n - k)), 3)])
    return arrivals


def errors(pred, meas) -> dict:
    mp, mm = request_metrics(pred).set_index("id"), request_metrics(meas).set_index("id")
    out = {}
    for k in ("ttft_ms", "e2e_ms"):
        e = ((mp[k] - mm[k]).abs() / mm[k]).to_numpy()
        out[k] = (float(np.median(e)), float(np.percentile(e, 90)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--requests", type=int, default=48)
    a = ap.parse_args()
    model = checkpoint.load_bundled(checkpoint.BUNDLED["tiny"])
    fit_w = mixed(a.requests, [(16, 64), (512, 768)], (4, 64), 11, poisson(80.0))
    test_w = mixed(a.requests, (96, 480), (4, 40), 12, burst_then(15.0))
    print(f"model: tiny ({model.num_params():,} params, float32) on CPU {platform.machine()}, "
          f"torch {torch.__version__}; scheduler {SCHED}; {a.requests} requests per workload")
    for threads in [int(x) for x in a.threads.split(",")]:
        torch.set_num_threads(threads)
        # warm-up: both workloads once, unmeasured, so that both measured runs find the engine in
        # the same steady state (kernels for every batch shape already chosen and cached)
        serve(model, fit_w, **SCHED)
        serve(model, test_w, **SCHED)
        fit_tr, _, _ = serve(model, fit_w, **SCHED)
        test_tr, _, _ = serve(model, test_w, **SCHED)
        again_tr, _, _ = serve(model, fit_w, **SCHED)
        print(f"\nthreads {threads}: fit run {len(fit_tr.steps)} steps, predict run {len(test_tr.steps)} steps")
        # the noise floor: the fit workload run a second time, predicted by the first run's fit
        sm, _ = fit(fit_tr, "features")
        e = errors(simulate(fit_w, SchedulerConfig(**SCHED), sm), again_tr)
        print(f"  noise floor (the fit workload again, predicted from its first run, features): TTFT median "
              f"{100 * e['ttft_ms'][0]:.1f}% p90 {100 * e['ttft_ms'][1]:.1f}%, E2E median {100 * e['e2e_ms'][0]:.1f}% "
              f"p90 {100 * e['e2e_ms'][1]:.1f}%")
        print(f"  {'model':15} {'R^2':>6} {'in-sample TTFT/E2E med':>24} {'predict TTFT med/p90':>22} "
              f"{'predict E2E med/p90':>21}  steps outside the fitted range")
        for kind in ("affine", "features", "affine/requests"):
            if kind == "affine/requests":
                sm, rep = fit_from_requests(fit_tr, SchedulerConfig(**SCHED))
                rep["r2"] = float("nan")
            else:
                sm, rep = fit(fit_tr, kind)
            own = errors(simulate(fit_w, SchedulerConfig(**SCHED), sm), fit_tr)
            pred = simulate(test_w, SchedulerConfig(**SCHED), sm)
            e = errors(pred, test_tr)
            o = outside_range(pred, rep)
            print(f"  {kind:15} {rep['r2']:6.3f} {100 * own['ttft_ms'][0]:10.1f}% / {100 * own['e2e_ms'][0]:5.1f}%"
                  f"      {100 * e['ttft_ms'][0]:8.1f}% / {100 * e['ttft_ms'][1]:5.1f}%"
                  f"    {100 * e['e2e_ms'][0]:7.1f}% / {100 * e['e2e_ms'][1]:5.1f}%"
                  f"   {0 if o is None else o['steps']} of {len(pred.steps)}")
            # the model on the predict run's own measured batches: separates step-time error (the
            # machine ran that run faster or slower than the model says) from scheduling error
            _, X, y = trace_features(test_tr)
            ratio = y / (X @ sm.coefficients())
            print(f"            {sm.describe()}")
            print(f"            predict run's steps, measured / model on their own batches: median "
                  f"{np.median(ratio):.3f}, p10 {np.percentile(ratio, 10):.3f}, p90 {np.percentile(ratio, 90):.3f}")
            if o:
                print(f"            {describe_outside(o)}")


if __name__ == "__main__":
    main()
