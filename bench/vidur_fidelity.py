"""Our `vllm-v0` policy vs Vidur 0.0.26's vLLM scheduler: the same workload, the same step time,
per-request TTFT and E2E compared (issue 15's Vidur target: p50 within 5%).

    python -m bench.vidur_fidelity [--requests 10000] [--rate 5] [--kv-blocks none,7424]
                                   [--venv /opt/vidur-venv] [--keep DIR]

Workload: bench.simulate.poisson_workload (prompt 1..2,048, output 1..512, Poisson arrivals,
seeded), written once as the CSV both read (bench.vs_vidur.write_workload_csv). Both sides: 256
sequences, 8,192 tokens per step, 16-token blocks, the affine step time of bench.vs_vidur (5 ms
+ 0.02 ms per prompt token + 0.05 ms per decoding sequence; Vidur: its synthetic profile, see
bench/vidur_launch.py). Ours runs `python -m core simulate --policy vllm-v0` (prefill-only steps
whenever the queue's head fits, 1% watermark) and, for contrast, `--policy vllm-v1` (our default
continuous batching, chunked by the budget). "vllm-v0+rounding" also adds Vidur's prefill
rounding in expectation (see ROUNDING_MS). Each pool size is a run: "none" = enough blocks for
every request at once. Not run in CI (it needs the Vidur environment, bench/vidur/README.md).
"""
import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from bench.vs_vidur import (
    BLOCK,
    MAX_SEQS,
    REPO,
    STEP,
    TOKEN_BUDGET,
    run_vidur,
    vidur_prepare,
    work_dir,
    write_workload_csv,
)

# Vidur looks a prefill's time up at its length rounded up to a multiple of 32 tokens: on average
# 15.5 tokens more, 0.31 ms at 0.02 ms/token. "+rounding" adds that per prefill piece (the
# features model's prefill_ms_per_chunk), to show how much of the difference it explains.
ROUNDING_MS = 15.5 * STEP["prefill_ms_per_token"]
VARIANTS = {"vllm-v0": ("vllm-v0", 0.0), "vllm-v0+rounding": ("vllm-v0", ROUNDING_MS), "vllm-v1": ("vllm-v1", 0.0)}


def run_ours(csv_path: Path, variant: str, blocks: int, out: Path) -> pd.DataFrame:
    policy, per_piece = VARIANTS[variant]
    cmd = [sys.executable, "-m", "core", "simulate", str(csv_path), "--policy", policy,
           "--max-seqs", str(MAX_SEQS), "--token-budget", str(TOKEN_BUDGET), "--block-size", str(BLOCK),
           "--kv-blocks", str(blocks), "--step-model", "features", "--base-ms", str(STEP["base_ms"]),
           "--prefill-ms-per-token", str(STEP["prefill_ms_per_token"]),
           "--decode-ms-per-seq", str(STEP["decode_ms_per_seq"]), "--prefill-ms-per-chunk", str(per_piece),
           "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        sys.exit(f"ours ({policy}) failed: {p.stderr[-2000:]}")
    from core.analysis.metrics import request_metrics
    from core.trace import load_trace
    tr = load_trace(out)
    m = request_metrics(tr)
    return pd.DataFrame({"ttft_s": m["ttft_ms"].to_numpy() / 1e3, "e2e_s": m["e2e_ms"].to_numpy() / 1e3,
                         "restarts": tr.meta["stats"]["preemptions"]}, index=m["id"].astype(int).to_numpy())


def vidur_table(out_dir: Path) -> pd.DataFrame:
    m = pd.read_csv(out_dir / "request_metrics.csv")
    return pd.DataFrame({"ttft_s": m["prefill_e2e_time"].to_numpy(), "e2e_s": m["request_e2e_time"].to_numpy(),
                         "restarts": int(m["request_num_restarts"].sum())}, index=m["Request Id"].to_numpy())


def compare(ours: pd.DataFrame, vid: pd.DataFrame) -> dict:
    both = ours.merge(vid, left_index=True, right_index=True, suffixes=("_o", "_v"))
    out = {"requests": len(both)}
    for k in ("ttft_s", "e2e_s"):
        o, v = both[f"{k}_o"].to_numpy(), both[f"{k}_v"].to_numpy()
        out[k] = (float(np.median(o)), float(np.median(v)), float(np.median(o) / np.median(v) - 1),
                  float(np.mean(o) / np.mean(v) - 1), float(np.median(np.abs(o - v) / v)))
    out["restarts"] = (int(ours["restarts"].iloc[0]), int(vid["restarts"].iloc[0]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--rate", type=float, default=5.0, help="arrivals per simulated second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-blocks", default="none,7424", help="comma-separated pool sizes ('none': enough for all)")
    ap.add_argument("--venv", type=Path, default=Path("/opt/vidur-venv"))
    ap.add_argument("--keep", type=Path)
    a = ap.parse_args()
    py = a.venv / "bin" / "python"
    if not py.exists():
        sys.exit(f"Vidur environment not found ({py}): see bench/vidur/README.md")
    with work_dir(a.keep, "vidur_fid_") as work:
        vidur_prepare(py, work / "cache", work / "prepare.log")
        csv_path = work / "w.csv"
        enough = write_workload_csv(csv_path, a.requests, a.rate, a.seed)
        print(f"{a.requests:,} requests at {a.rate:g}/s (seed {a.seed}); p50 and mean: ours vs Vidur; "
              f"|diff| = median over requests of |ours - Vidur| / Vidur")
        print(f"{'pool':>8} {'ours policy':>16} {'metric':>6} {'ours p50 s':>10} {'Vidur p50 s':>11} "
              f"{'p50 diff':>9} {'mean diff':>9} {'|diff|':>7} {'restarts ours/Vidur':>20}")
        for pool in [s.strip() for s in a.kv_blocks.split(",") if s.strip()]:
            blocks = enough if pool == "none" else int(pool)
            _, _, vdir, _ = run_vidur(py, work / "cache", csv_path, work / f"vidur_{pool}", blocks,
                                      work / f"vidur_{pool}.log")
            vid = vidur_table(vdir)
            for policy in VARIANTS:
                c = compare(run_ours(csv_path, policy, blocks, work / f"ours_{policy}_{pool}.parquet"), vid)
                for k in ("ttft_s", "e2e_s"):
                    o50, v50, d50, dmean, dabs = c[k]
                    print(f"{pool:>8} {policy:>16} {k[:-2].upper():>6} {o50:>10.4f} {v50:>11.4f} {d50:>+9.1%} "
                          f"{dmean:>+9.1%} {dabs:>7.1%} {c['restarts'][0]:>10} / {c['restarts'][1]}", flush=True)


if __name__ == "__main__":
    main()
