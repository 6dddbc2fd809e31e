"""Production-sized simulations end to end, this checkout beside an older revision, in one run.

    python -m bench.scale [--requests 10000,100000] [--old-rev REV] [--repeat K] [--keep DIR]

Each size: the workload of bench.simulate (prompt 1..2,048, output 1..512 tokens, Poisson
arrivals at 50 req/s, seeded) written once as a Vidur-style CSV; then, alternating,
`python -m core simulate W.csv --max-seqs 256 --token-budget 8192 --chunk 8192
--step-model affine --base-ms 5 --prefill-ms-per-token 0.02 --decode-ms-per-seq 0.05
--out OUT.parquet` in this checkout and in a git worktree of --old-rev (default: the last
commit before the streaming writer), each under /usr/bin/time (wall clock, peak RSS, user and
system CPU), best of --repeat. The two traces are then read back and compared (same
events, row for row) when both fit in memory (--compare, sizes <= 100k).

`--old-rev none` runs this checkout only (e.g. for 1,000,000 requests, which the old code
cannot finish within this machine's memory). GB = 10^9 bytes. Not a test: nothing is asserted.
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.vs_vidur import timed, write_workload_csv

REPO = Path(__file__).resolve().parents[1]
OLD_REV = "24f1dea"   # main before issue 12's streaming writer
FLAGS = ["--max-seqs", "256", "--token-budget", "8192", "--chunk", "8192", "--step-model", "affine",
         "--base-ms", "5", "--prefill-ms-per-token", "0.02", "--decode-ms-per-seq", "0.05"]


def run(tree: Path, csv_path: Path, out: Path, log: Path):
    return timed([sys.executable, "-m", "core", "simulate", str(csv_path), *FLAGS, "--out", str(out)],
                 log, cwd=tree)


def same_trace(a: Path, b: Path) -> bool:
    code = ("import sys; from core.trace import load_trace; x, y = (load_trace(p) for p in sys.argv[1:3]); "
            "[x.meta.pop('created'), y.meta.pop('created')]; "
            "print(all(getattr(x, t).equals(getattr(y, t)) for t in "
            "('requests', 'tokens', 'finishes', 'steps', 'batch', 'kv', 'preempts')) and x.meta == y.meta)")
    got = subprocess.run([sys.executable, "-c", code, str(a), str(b)], cwd=REPO, capture_output=True, text=True)
    return got.stdout.strip() == "True"


def _trees(d: Path, old_rev: str) -> dict[str, Path]:
    """This checkout, and a git worktree of old_rev in d (made unless there) when it is not "none"."""
    trees = {"new": REPO}
    if old_rev != "none":
        old = d / "old-tree"
        if not old.exists():
            subprocess.run(["git", "worktree", "add", "--detach", str(old), old_rev], cwd=REPO, check=True,
                           capture_output=True)
        trees["old"] = old
    return trees


def _best_runs(trees: dict[str, Path], w: Path, d: Path, n: int, repeat: int) -> dict:
    """Each tree's best of `repeat` simulations of workload w (n requests), alternating, each printed:
    {tree: (wall s, peak GB, user s, system s)}; a failed run is printed and left out."""
    best = {}
    for k in range(repeat):
        for name, tree in trees.items():
            out = d / f"{name}{n}.parquet"
            try:
                wall, gb, _, user, sys_s = run(tree, w, out, d / f"{name}{n}-{k}.log")
            except RuntimeError as e:
                print(f"{name} {n}: failed ({str(e).splitlines()[0]})")
                continue
            if name not in best or wall < best[name][0]:
                best[name] = (wall, gb, user, sys_s)
            print(f"{name:>3} {n:>9,} requests: {wall:7.2f} s wall, {gb:5.2f} GB peak, "
                  f"{user:6.2f} s user, {sys_s:5.2f} s system", flush=True)
    return best


def _print_table(rows: list) -> None:
    print("\n| requests | old s / GB | new s / GB | old / new time | same trace |")
    print("|---|---|---|---|---|")
    for n, best, same in rows:
        o, nw = best.get("old"), best.get("new")
        fmt = lambda x: f"{x[0]:.2f} s / {x[1]:.2f} GB" if x else "—"
        ratio = f"{o[0] / nw[0]:.1f}x" if o and nw else "—"
        print(f"| {n:,} | {fmt(o)} | {fmt(nw)} | {ratio} | {'—' if same is None else same} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", default="10000,100000")
    ap.add_argument("--old-rev", default=OLD_REV)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--compare", action="store_true", help="read both traces back and compare them")
    ap.add_argument("--keep", help="directory for workloads, traces and logs (default: a temporary one)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.requests.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(a.keep or tmp)
        d.mkdir(parents=True, exist_ok=True)
        trees = _trees(d, a.old_rev)
        rows = []
        try:
            for n in sizes:
                w = d / f"poisson{n}.csv"
                write_workload_csv(w, n, 50.0, 0)
                best = _best_runs(trees, w, d, n, a.repeat)
                same = same_trace(d / f"new{n}.parquet", d / f"old{n}.parquet") \
                    if a.compare and len(best) == 2 and n <= 100_000 else None
                rows.append((n, best, same))
        finally:
            if "old" in trees and not a.keep:
                subprocess.run(["git", "worktree", "remove", "--force", str(trees["old"])], cwd=REPO,
                               capture_output=True)
        _print_table(rows)


if __name__ == "__main__":
    main()
