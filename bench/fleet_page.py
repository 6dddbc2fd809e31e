"""The Fleet page's first draw against the Schedules page's, at the same workload size.

    python -m bench.fleet_page [--rounds 3] [--workload "Poisson 2000"]

Each measurement is a fresh Python process (cold caches, as a first visit to a new server
process: the simulation included) running the page through app.py in Streamlit's AppTest and
timing its first `run()`; the two pages alternate, --rounds times each, and the medians are
printed with their ratio. Schedules: its scenario selector (`sc`) on the workload; Fleet: its
workload selector (`fl_wl`) on the same one, every other setting at its default (4 replicas,
prefix-aware, arrivals x4 as fast, the policy tab open and running when small enough). The
machine must be otherwise idle.
"""
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import logging, sys, time
logging.disable(logging.WARNING)
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=900)
at.switch_page(f"pages/{sys.argv[2]}.py")
at.query_params[sys.argv[3]] = sys.argv[4]
t = time.perf_counter(); at.run(); dt = time.perf_counter() - t
assert not at.exception, at.exception
print(dt)
"""


def first_draw(page: str, key: str, value: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "app.py"), page, key, value], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workload", default="Poisson 2000")
    a = ap.parse_args(argv)
    got = {"schedules": [], "fleet": []}
    for _ in range(a.rounds):
        got["schedules"].append(first_draw("schedules", "sc", a.workload))
        got["fleet"].append(first_draw("fleet", "fl_wl", a.workload))
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"first draw, {a.workload}, fresh process each, {a.rounds} rounds alternating (seconds):")
    for k, v in got.items():
        print(f"  {k:>9}: median {med[k]:.2f}  ({', '.join(f'{x:.2f}' for x in v)})")
    print(f"  fleet / schedules: {med['fleet'] / med['schedules']:.2f}x")


if __name__ == "__main__":
    main()
