"""The app's simulation workers, home-made pool vs a loky ProcessPoolExecutor, side by side (issue 29):
the Schedules page's first run on the Poisson 10,000 scenario (its two policies simulated in the
workers, their traces shipped back through /dev/shm), in AppTest, each run in a fresh process,
alternating an older revision (a git worktree; default f78e7de, the last with core.sim.worker's
pool) and this checkout.

    python -m bench.executor [--old-rev REV] [--repeat 3] [--settle 3]

Each process opens the page on chapter 31 (which starts the workers in the background, as a
browser's first visit does), waits `--settle` seconds, then picks Poisson 10000 (timed: the whole
rerun) and changes the tariff three times (reruns that simulate nothing). Needs an otherwise idle
machine. Printed, never asserted.
"""
import argparse
import statistics
import tempfile
from pathlib import Path

from bench.revisions import REPO, run_worker, worktree

CODE = r"""
import json, os, sys, time
from streamlit.testing.v1 import AppTest
args = json.loads(sys.argv[1])
at = AppTest.from_file(os.path.join(os.getcwd(), "app.py"), default_timeout=900)
at.switch_page("pages/schedules.py")
at.run()
time.sleep(args["settle"])
t = time.perf_counter()
at.selectbox(key="sc").set_value("Poisson 10000").run()
first = time.perf_counter() - t
if at.exception:
    raise SystemExit(at.exception[0].message)
reruns = []
for v in (3.0, 4.0, 5.0):
    t = time.perf_counter()
    at.number_input(key="usd").set_value(v).run()
    reruns.append(time.perf_counter() - t)
print(json.dumps({"first": first, "rerun": sorted(reruns)[1]}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-rev", default="f78e7de", help="the revision with the home-made pool")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds between opening the page and the scenario")
    a = ap.parse_args()
    got = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp, worktree(a.old_rev, Path(tmp) / "old") as old:
        for k in range(a.repeat):
            for side, tree in (("old", old), ("new", REPO)) if k % 2 == 0 else (("new", REPO), ("old", old)):
                r = run_worker(tree, CODE, {"settle": a.settle})
                got[side].append(r)
                print(f"run {k + 1} {side}: first {r['first']:.2f} s, rerun {r['rerun'] * 1000:.0f} ms", flush=True)
    print(f"\nSchedules page, Poisson 10,000 (two policies in the workers), {a.repeat} runs each, alternating:")
    print(f"{'workers':34} {'first run s (min–max, median)':>32} {'rerun ms (median)':>18}")
    for side, name in (("old", f"home-made pool ({a.old_rev})"), ("new", "loky ProcessPoolExecutor (this)")):
        f = [r["first"] for r in got[side]]
        print(f"{name:34} {min(f):9.2f}–{max(f):.2f}, {statistics.median(f):.2f}"
              f" {statistics.median(r['rerun'] for r in got[side]) * 1000:18.0f}")


if __name__ == "__main__":
    main()
