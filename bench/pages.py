"""Page render times via Streamlit AppTest: median of several reruns after one warm-up run
(caches warm, as when a user moves a widget), then the views at scale.

    python -m bench.pages [--runs 5] [--traces DIR] [--skip-scale | --scale-only] [--no-100k]

Targets on the 2-core dev machine: each page's rerun < 300 ms on its default scenario;
< 1 s for a 2,000-request workload on the schedules and paging pages. Printed, never asserted.

Views at scale (issues 12, 29): the replay page opening a 10,000-request trace in a running app
(the trace picked in the selector) <= 3 s to its first chart; a 100,000-request trace opened from
its overview (core/analysis/overview.py; the first open builds it, reported, then a later open
with the caches cleared) <= 3 s and a cursor move on it <= 300 ms; the schedules page on the
10,000-request Poisson scenario <= 2 s on its first run and <= 500 ms on a rerun that does not change what is simulated.
The traces are DIR/t10k.parquet and DIR/t100k.parquet (DIR default /tmp/serving-explorer-bench),
simulated when missing with bench.scale's workload and flags (`python -m core simulate`,
continuous, 256 sequences, 8,192-token budget and chunk, affine 5 + 0.02/prefill token +
0.05/decoding sequence ms, KV events included).
"""
import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import streamlit
from streamlit.elements.plotly_chart import PlotlyMixin
from streamlit.testing.v1 import AppTest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
logging.disable(logging.WARNING)

CASES = [
    ("home", "home", {}, 0.3),
    ("schedules (chapter 31)", "schedules", {}, 0.3),
    ("kv memory & paging (default)", "kv", {}, 0.3),
    ("attention tiles", "tiles", {}, 0.3),
    ("speculative decoding", "speculative", {}, 0.3),
    ("roofline", "roofline", {}, 0.3),
    ("schedules, 2,000 requests", "schedules",
     {"sc": "Poisson 2000", "pol": ["continuous", "chunked"], "ms": "256", "tb": "8192", "ch": "512",
      "s_base": "5", "s_pp": "0.02", "s_pd": "0.05"}, 1.0),
    ("paging, 2,000 requests", "kv", {"pg_wl": "poisson2000", "pg_pool": "8192", "pg_ms": "256"}, 1.0),
]


class FirstChart:
    """Wall-clock time of the first st.plotly_chart call to return after `start()`: when the
    browser would have its first chart (Streamlit sends each element as it is made)."""

    def __init__(self):
        self.t0 = self.first = None
        orig_mixin, orig_st = PlotlyMixin.plotly_chart, streamlit.plotly_chart

        def wrap(orig):
            def chart(*a, **k):
                out = orig(*a, **k)
                if self.t0 is not None and self.first is None:
                    self.first = time.perf_counter() - self.t0
                return out
            return chart
        PlotlyMixin.plotly_chart = wrap(orig_mixin)
        streamlit.plotly_chart = wrap(orig_st)

    def start(self):
        self.t0, self.first = time.perf_counter(), None


def app(page: str, params: dict) -> AppTest:
    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=900)
    at.switch_page(f"pages/{page}.py")
    for k, v in params.items():
        at.query_params[k] = v
    return at


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def row(label, first, rerun, target, note="", first_target=None):
    """One line; `target` applies to the rerun median (to the first run when there is no rerun),
    `first_target` to the first run."""
    f = "—" if first is None else f"{first * 1000:8.0f} ms"
    r = "—" if rerun is None else f"{rerun * 1000:10.0f} ms"
    got = rerun if rerun is not None else first
    if target is None:
        print(f"{label:40} {f:>11} {r:>13} {'—':>12}  (no target) {note}", flush=True)
        return
    ok = "met" if got < target and (first_target is None or first < first_target) else "MISSED"
    t = f"{target * 1000:6.0f} ms" if first_target is None else f"{first_target:g} s/{target * 1000:.0f} ms"
    print(f"{label:40} {f:>11} {r:>13} {t:>12}  {ok} {note}", flush=True)


def page_cases(runs: int):
    for label, page, params, target in CASES:
        at = app(page, params)
        first = timed(at.run)
        if at.exception:
            print(f"{label:40} EXCEPTION {at.exception[0].message}")
            continue
        row(label, first, statistics.median(timed(at.run) for _ in range(runs)), target)


def ensure_trace(d: Path, name: str, n: int) -> Path:
    out = d / name
    if not out.exists():
        from bench.scale import FLAGS
        from bench.vs_vidur import write_workload_csv
        w = d / f"poisson{n}.csv"
        write_workload_csv(w, n, 50.0, 0)
        print(f"simulating {out} ({n:,} requests)…", flush=True)
        subprocess.run([sys.executable, "-m", "core", "simulate", str(w), *FLAGS, "--out", str(out)],
                       cwd=ROOT, check=True, capture_output=True)
    return out


def move_cursor(at: AppTest, frac: float):
    s = at.slider(key="rp_cursor")
    s.set_value(s.min + frac * (s.max - s.min)).run()


def scale_cases(runs: int, d: Path, with_100k: bool, fresh_overview: bool = True):
    d.mkdir(parents=True, exist_ok=True)
    ensure_trace(d, "t10k.parquet", 10_000)
    if with_100k:
        ensure_trace(d, "t100k.parquet", 100_000)
    os.environ["SERVING_EXPLORER_TRACES"] = str(d)
    probe = FirstChart()

    # schedules page, 10,000 requests, in a running app (chapter 31 open, then the scenario picked:
    # its preset: continuous and chunked, 256 sequences, 8,192-token budget, chunk 512, affine 5 ms
    # + 0.02 ms per prefill token + 0.05 ms per decoding sequence), simulation included; then reruns that
    # change no simulation input (a plain rerun; a new tariff)
    at = app("schedules", {})
    at.run()
    probe.start()
    first = timed(lambda: at.selectbox(key="sc").set_value("Poisson 10000").run())
    if at.exception:
        print(f"schedules 10k: EXCEPTION {at.exception[0].message}")
    else:
        row("schedules, 10,000 requests", first, statistics.median(timed(at.run) for _ in range(runs)), 0.5,
            f"(first chart {probe.first * 1000:.0f} ms)", first_target=2.0)
        usd = [timed(lambda v=v: at.number_input(key="usd").set_value(v).run()) for v in (3.0, 4.0, 5.0)]
        row("schedules, 10,000 requests: tariff", None, statistics.median(usd), 0.5)
    del at

    # replay page: the app already running (a bundled trace open), then the 10k trace picked
    at = app("replay", {})
    at.run()
    probe.start()
    t_open = timed(lambda: at.selectbox(key="tr").set_value("t10k.parquet").run())
    if at.exception:
        print(f"replay 10k: EXCEPTION {at.exception[0].message}")
    else:
        row("replay: open 10,000-request trace", probe.first, None, 3.0,
            f"(first chart; whole page {t_open * 1000:.0f} ms)")
        moves = [timed(lambda f=f: move_cursor(at, f)) for f in (0.3, 0.6, 0.45, 0.8, 0.1)[:max(runs, 3)]]
        row("replay 10k: cursor move", None, statistics.median(moves), 0.3)
    del at

    if with_100k:    # opened from its overview (core/analysis/overview.py): built on the first open, then read
        import shutil

        from core.analysis.overview import overview_dir
        t100k = d / "t100k.parquet"
        if fresh_overview:
            shutil.rmtree(overview_dir(t100k), ignore_errors=True)
        for k, when in enumerate((("first open: overview built, then the page" if fresh_overview else "an open"),
                                  "a later open")):
            if k:
                _clear_caches()    # the later open reads the overview from disk, as another process would
            at = app("replay", {})      # a running app (a bundled trace open), then the 100k trace picked
            at.run()
            probe.start()
            t_open = timed(lambda: at.selectbox(key="tr").set_value("t100k.parquet").run())
            if at.exception:
                print(f"replay 100k: EXCEPTION {at.exception[0].message}")
                return
            row(f"replay 100k: {when}", t_open, None, None if "built" in when else 3.0,
                f"(whole page; first chart {probe.first * 1000:.0f} ms)")
        moves = [timed(lambda f=f: move_cursor(at, f)) for f in (0.3, 0.6, 0.45, 0.8, 0.1)[:max(runs, 3)]]
        row("replay 100k: cursor move", None, statistics.median(moves), 0.3,
            "(" + ", ".join(f"{m * 1000:.0f}" for m in moves) + " ms)")


def _clear_caches():
    streamlit.cache_resource.clear()
    streamlit.cache_data.clear()

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--traces", default="/tmp/serving-explorer-bench",
                    help="folder of the scale traces t10k.parquet and t100k.parquet (simulated when missing)")
    ap.add_argument("--skip-scale", action="store_true", help="only the default cases")
    ap.add_argument("--scale-only", action="store_true", help="only the views at scale")
    ap.add_argument("--no-100k", action="store_true", help="skip the 100,000-request trace")
    ap.add_argument("--keep-overview", action="store_true",
                    help="keep the 100k trace's overview if it exists (default: removed, so the first open builds it)")
    args = ap.parse_args()
    print(f"{'page':40} {'first run':>11} {'rerun median':>13} {'target':>12}")
    if not args.scale_only:
        page_cases(args.runs)
    if not args.skip_scale:
        scale_cases(args.runs, Path(args.traces), not args.no_100k, not args.keep_overview)


if __name__ == "__main__":
    main()
