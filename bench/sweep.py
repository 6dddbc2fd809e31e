"""A 20-point load sweep of 2,000 requests, end to end through the command line, with the
points in two processes beside the same sweep in one, alternating, in one run.

    python -m bench.sweep [--requests 2000] [--repeat 2] [--keep DIR]

Workload: bench.simulate's distribution (prompt 1-2,048, output 1-512 tokens), written once as
a Vidur-style CSV; `python -m core sweep W.csv --rates 2,4,...,40 --max-seqs 256
--token-budget 8192 --chunk 8192 --step-model affine --base-ms 5 --prefill-ms-per-token 0.02
--decode-ms-per-seq 0.05 --slo-ttft-ms 1000 --slo-tpot-ms 50 --json --workers K`, timed under
/usr/bin/time (wall, peak RSS of the parent). Issue 13's target: <= 10 s on the 2-core dev
machine. Printed, never asserted.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.vs_vidur import timed, write_workload_csv

REPO = Path(__file__).resolve().parents[1]
RATES = ",".join(str(r) for r in range(2, 41, 2))
FLAGS = ["--max-seqs", "256", "--token-budget", "8192", "--chunk", "8192", "--step-model", "affine",
         "--base-ms", "5", "--prefill-ms-per-token", "0.02", "--decode-ms-per-seq", "0.05",
         "--slo-ttft-ms", "1000", "--slo-tpot-ms", "50", "--json"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", help="directory for the workload and outputs (default: a temporary one)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(a.keep or tmp)
        d.mkdir(parents=True, exist_ok=True)
        csv_path = d / f"w{a.requests}.csv"
        write_workload_csv(csv_path, a.requests, 20.0, 0)
        best = {}
        for i in range(a.repeat):
            for workers in (2, 1):
                cmd = [sys.executable, "-m", "core", "sweep", str(csv_path), "--rates", RATES, *FLAGS,
                       "--workers", str(workers)]
                wall, gb, text, user, sys_s = timed(cmd, d / f"sweep_w{workers}.log", cwd=REPO)
                print(f"  run {i + 1}, {workers} process(es): {wall:.2f} s wall, {user + sys_s:.2f} s CPU "
                      f"(parent), {gb:.2f} GB", flush=True)
                best[workers] = min(best.get(workers, wall), wall)
                if workers == 2:
                    got = json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1])
        print(f"\n{a.requests} requests x {len(got['points'])} points (best of {a.repeat}): "
              f"2 processes {best[2]:.2f} s, 1 process {best[1]:.2f} s ({best[1] / best[2]:.2f}x); "
              f"target <= 10 s: {'met' if best[2] <= 10 else 'MISSED'}")
        cap = got["capacity"]
        print("capacity:", "none" if cap is None else f"{cap['rate']:g} req/s (attainment {cap['attainment']:.3f})")
        for p in got["points"][::4]:
            print(f"  rate {p['rate']:>4g}: {p['achieved_req_per_s']:.2f} done/s, "
                  f"TTFT p99 {p['ttft_ms']['p99']:.0f} ms, attainment {p['slo']['attainment']:.3f}")


if __name__ == "__main__":
    main()
