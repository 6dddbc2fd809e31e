"""Page render times via Streamlit AppTest: median of several reruns after one warm-up run
(caches warm, as when a user moves a widget).

    python -m bench.pages [--runs 5]

Targets on the 2-core dev machine: each page's rerun < 300 ms on its default scenario;
< 1 s for a 2,000-request workload on the schedules and paging pages. Printed, never asserted.
"""
import argparse
import logging
import os
import statistics
import time

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"{'page':34} {'first run':>10} {'rerun median':>13} {'target':>8}")
    for label, page, params, target in CASES:
        at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=300)
        at.switch_page(f"pages/{page}.py")
        for k, v in params.items():
            at.query_params[k] = v
        t0 = time.perf_counter()
        at.run()
        first = time.perf_counter() - t0
        if at.exception:
            print(f"{label:34} EXCEPTION {at.exception[0].message}")
            continue
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            at.run()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        ok = "met" if med < target else "MISSED"
        print(f"{label:34} {first * 1000:8.0f} ms {med * 1000:10.0f} ms {target * 1000:6.0f} ms  {ok}")


if __name__ == "__main__":
    main()
