"""Issue 48's costs, each measured side by side in one run (an idle machine; a table for
docs/benchmarks.md):

- Fleet page (AppTest, in process): a router change with the policy table cached without the
  sidebar's policy, against the same change with every cache cleared first (what each change
  cost when the table was keyed by the policy: every policy simulated again).
- Fleet page: the Lesson tab opened cold (its runs computed then) and after the page's prefetch.
- The request-level ("spans") fit's loss: one evaluation through core.sim.simulate.token_span_ms
  (what the search now compares) against simulate + request_metrics (what it compared), run1's
  workload under its flags, best of 5 each; and the whole fit of run1 (absolute).
- Memory (each a `python -m core` process of its own, VmHWM): a gzipped OTLP file of 30 M empty
  spans (refused), a 1 GiB --replicas-file (refused), 2,000 one-block requests on 4,096 replicas.

    python -m bench.hostile_costs [--skip-fit]
"""
import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def fleet_page() -> list[tuple[str, float, float]]:
    import streamlit as st

    from bench.helpers import open_page
    from ui import fleet as uf
    rows = []
    at = open_page("fleet")                                   # warm: the default view and its policy table
    cached = _timed(lambda: at.selectbox(key="fl_pol").set_value("least-requests").run(timeout=300))
    at.selectbox(key="fl_pol").set_value("prefix-aware").run(timeout=300)
    st.cache_resource.clear()
    cold = _timed(lambda: at.selectbox(key="fl_pol").set_value("least-requests").run(timeout=300))
    rows.append(("Fleet page: router change (s)", cached, cold))
    st.cache_resource.clear()
    uf._PREFETCH.clear()
    cold_lesson = _timed(lambda: open_page("fleet", {"fl_tab": "Lesson"}))
    st.cache_resource.clear()
    uf._PREFETCH.clear()
    open_page("fleet")
    uf._PREFETCH[0].join(600)
    warm_lesson = _timed(lambda: open_page("fleet", {"fl_tab": "Lesson"}))
    rows.append(("Fleet page: Lesson tab opened (s)", warm_lesson, cold_lesson))
    return rows


def spans_loss(fit: bool) -> list[tuple[str, float, float]]:
    from core.analysis.metrics import request_metrics
    from core.fit.calibrate import calibrate
    from core.lessons.vllm_runs import bundled_run
    from core.sim.simulate import simulate, token_span_ms
    from core.sim.stepmodel import StepModel
    run = bundled_run("run1_c4_p128_o32")
    sm = StepModel(kind="affine", base_ms=1.0, prefill_ms_per_token=0.034, decode_ms_per_seq=0.061)
    lean = min(_timed(lambda: token_span_ms(run.workload, run.config, sm)) for _ in range(5))
    full = min(_timed(lambda: request_metrics(simulate(run.workload, run.config, sm, record_kv=False)))
               for _ in range(5))
    rows = [("spans fit: one loss evaluation, run1 (s)", lean, full)]
    if fit:
        whole = _timed(lambda: calibrate([bundled_run("run1_c4_p128_o32")], "affine", "spans"))
        rows.append(("spans fit: calibrate(run1, spans), whole (s)", whole, float("nan")))
    return rows


def memory() -> list[tuple[str, float, float]]:
    from bench.helpers import peak_mib
    rows = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        bomb = d / "spans.jsonl.gz"
        bomb.write_bytes(gzip.compress(b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + b"{}," * 30_000_000
                                       + b'{}]}]}]}\n', 9))
        t = time.perf_counter()
        rc, _, mib = peak_mib(["metrics", str(bomb)])
        rows.append((f"30 M gzipped empty spans ({bomb.stat().st_size:,} B), refused rc {rc}: peak MiB / s", mib,
                     time.perf_counter() - t))
        big = d / "big.json"
        with open(big, "wb") as f:
            f.truncate(1 << 30)
        t = time.perf_counter()
        rc, _, mib = peak_mib(["simulate", str(ROOT / "data/workloads/burst5.json"), "--replicas-file", str(big),
                               "--out", str(d / "o.json")])
        rows.append((f"1 GiB --replicas-file, refused rc {rc}: peak MiB / s", mib, time.perf_counter() - t))
        w = d / "w.json"
        w.write_text(json.dumps({"name": "tiny", "requests": [
            {"id": f"q{i}", "arrival_ms": float(i), "prompt_tokens": 16, "output_tokens": 2} for i in range(2000)]}))
        t = time.perf_counter()
        rc, _, mib = peak_mib(["simulate", str(w), "--replicas", "4096", "--out", str(d / "t.parquet")])
        rows.append((f"2,000 requests on 4,096 replicas, rc {rc}: peak MiB / s", mib, time.perf_counter() - t))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-fit", action="store_true", help="leave out the whole spans fit (~20 s)")
    a = ap.parse_args(argv)
    print("| what | now | before (or the other path) | ratio |\n|---|---|---|---|")
    for name, now, other in fleet_page() + spans_loss(not a.skip_fit):
        ratio = other / now if now and other == other else float("nan")
        print(f"| {name} | {now:.3f} | {'—' if other != other else f'{other:.3f}'} | "
              f"{'—' if ratio != ratio else f'{ratio:.1f}x'} |")
    print("\n| memory case | peak MiB | seconds |\n|---|---|---|")
    for name, mib, s in memory():
        print(f"| {name.rsplit(':', 1)[0]} | {mib:,.0f} | {s:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
