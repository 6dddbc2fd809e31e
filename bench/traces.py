"""Trace I/O and replay speed on a 10,000-request simulated trace (~1,000,000 events).

    python -m bench.traces [--requests 10000] [--skip-page]

Prints: event count, file sizes, load + validate + metrics time for the JSON and the
Parquet form, and the replay page's rerun time when the time cursor moves (AppTest).
Targets on the 2-core dev machine: JSON < 3 s, Parquet < 1 s, cursor move < 500 ms.
"""
import argparse
import logging
import os
import statistics
import tempfile
import time

from core.analysis.metrics import summarize
from core.config import SchedulerConfig
from core.lessons.scenarios import poisson_workload
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import load_trace, save_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_trace(n):
    w = poisson_workload(n, rate_per_s=40.0, seed=1, max_prompt=512, max_output=100)
    return simulate(w, SchedulerConfig("continuous", max_seqs=128, token_budget=4096, chunk=512, block_size=16),
                    StepModel("affine", base_ms=5, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05),
                    label=f"bench {n} requests", created="bench")


def timed(fn, repeat=3):
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--skip-page", action="store_true")
    args = ap.parse_args()
    tr = make_trace(args.requests)
    n_events = len(tr.tokens) + len(tr.finishes) + len(tr.steps) + len(tr.kv) + len(tr.preempts) + len(tr.other)
    print(f"trace: {args.requests} requests, {n_events:,} events "
          f"({len(tr.tokens):,} token, {len(tr.steps):,} step, {len(tr.kv):,} kv)")
    d = tempfile.mkdtemp()
    paths = {k: os.path.join(d, f"bench.{k}") for k in ("json", "json.gz", "parquet")}
    for p in paths.values():
        save_trace(tr, p)
    for kind, p in paths.items():
        size = os.path.getsize(p) / 2**20
        t, _ = timed(lambda: summarize(load_trace(p)))
        target = 1.0 if kind == "parquet" else 3.0
        print(f"{kind:8} {size:8.1f} MiB  load + validate + metrics {t:6.3f} s  "
              f"[target < {target:g} s: {'met' if t < target else 'MISSED'}]")
    if args.skip_page:
        return
    logging.disable(logging.WARNING)
    from streamlit.testing.v1 import AppTest
    os.environ["SERVING_EXPLORER_TRACES"] = paths["parquet"]
    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=300)
    at.switch_page("pages/replay.py")
    at.query_params["tr"] = "bench.parquet"
    t0 = time.perf_counter()
    at.run()
    first = time.perf_counter() - t0
    if at.exception:
        print("replay page exception:", at.exception[0].message)
        return
    shown = at.selectbox(key="tr").value
    assert shown == "bench.parquet", f"the page opened {shown!r}, not the benchmark trace"
    slider = at.slider(key="rp_cursor")
    lo, hi = slider.min, slider.max
    times = []
    for k in range(1, 8):
        v = lo + (hi - lo) * k / 8
        t0 = time.perf_counter()
        at.slider(key="rp_cursor").set_value(v).run()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"replay page: first run {first:.2f} s; cursor move median {med * 1000:.0f} ms "
          f"[target < 500 ms: {'met' if med < 0.5 else 'MISSED'}]")


if __name__ == "__main__":
    main()
