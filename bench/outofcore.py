"""`python -m core metrics X.parquet --json` on large simulated traces, out of core (DuckDB over
the Parquet file, core/analysis/outofcore.py) beside the in-memory path (the trace loaded, then
core.analysis.metrics.summarize), each a fresh process: wall time and peak resident memory.

    python -m bench.outofcore [--dir DIR] [--sizes 10000,100000,1000000] [--in-memory-up-to 100000]

The traces are DIR/t{n}.parquet (DIR default /tmp/ooc-bench), simulated when missing from
bench.vs_vidur's Poisson workload (50 req/s) with bench.scale's flags. Issue 29's targets: the
100k-request trace <= 10 s and <= 1.5 GB; the 1M-request trace <= 90 s and <= 2 GB. The two
paths' summaries are compared field by field where both ran (tests/test_outofcore.py does this
on bundled traces)."""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ensure(d: Path, n: int) -> Path:
    out = d / f"t{n}.parquet"
    if not out.exists():
        from bench.scale import FLAGS
        from bench.vs_vidur import write_workload_csv
        w = d / f"poisson{n}.csv"
        if not w.exists():
            write_workload_csv(w, n, 50.0, 0)
        print(f"simulating {out} ({n:,} requests)…", flush=True)
        subprocess.run([sys.executable, "-m", "core", "simulate", str(w), *FLAGS, "--out", str(out)], cwd=ROOT,
                       check=True, capture_output=True)
    return out


def timed(args: list[str]) -> tuple[float, float, dict | None, str]:
    """(seconds, peak RSS in GB, the JSON printed or None, stderr tail) of `python -m core ...`."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as tf, tempfile.NamedTemporaryFile("w+") as out:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", tf.name, sys.executable, "-m", "core", *args],
                           cwd=ROOT, stdout=out, stderr=subprocess.PIPE, text=True)
        secs, kb = Path(tf.name).read_text().split()[-2:]
        text = Path(out.name).read_text()
    got = json.loads(text) if p.returncode == 0 and text.strip() else None
    return float(secs), int(kb) / 2**20, got, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/ooc-bench")
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--in-memory-up-to", type=int, default=100_000)
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    from bench.helpers import comparable, differences
    print(f"{'requests':>10} {'rows':>12} {'path':>12} {'seconds':>8} {'peak GB':>8}  result")
    for n in (int(x) for x in a.sizes.split(",")):
        trace = ensure(d, n)
        import pyarrow.parquet as pq
        rows = pq.ParquetFile(trace).metadata.num_rows
        s1, m1, ooc, err1 = timed(["metrics", str(trace), "--json", "--out-of-core"])
        print(f"{n:>10,} {rows:>12,} {'out of core':>12} {s1:>8.1f} {m1:>8.2f}  "
              + ("ok" if ooc else f"FAILED: {err1}"), flush=True)
        if n <= a.in_memory_up_to:
            import core.commands.common as cli
            limit = max(cli.OUT_OF_CORE_ROWS, rows + 1)
            code = (f"import sys, core.commands.common as c, core.__main__ as m; c.OUT_OF_CORE_ROWS = {limit}; "
                    f"sys.exit(m.main(['metrics', {str(trace)!r}, '--json']))")
            with tempfile.NamedTemporaryFile("r", suffix=".txt") as tf, tempfile.NamedTemporaryFile("w+") as out:
                p = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", tf.name, sys.executable, "-c", code],
                                   cwd=ROOT, stdout=out, stderr=subprocess.PIPE, text=True)
                s2, kb = Path(tf.name).read_text().split()[-2:]
                text = Path(out.name).read_text()
            mem = json.loads(text) if p.returncode == 0 and text.strip() else None
            same = "" if not (mem and ooc) else ("; summaries equal" if not differences(
                comparable(mem["summary"]), comparable(ooc["summary"])) else "; summaries DIFFER")
            print(f"{'':>10} {'':>12} {'in memory':>12} {float(s2):>8.1f} {int(kb) / 2**20:>8.2f}  "
                  + ("ok" if mem else f"FAILED (exit {p.returncode})") + same
                  + (f"; out of core {float(s2) / s1:.1f}x faster, {int(kb) / 2**20 / m1:.1f}x less memory"
                     if mem and ooc else ""), flush=True)


if __name__ == "__main__":
    main()
