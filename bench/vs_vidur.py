"""Our simulator vs Vidur 0.0.26, end to end, on the same workloads and the same step model.

    python -m bench.vs_vidur [--requests 10000,100000] [--rate 50] [--repeat K]
                             [--venv /opt/vidur-venv] [--skip-vidur] [--keep DIR]

Workloads: N requests, prompt uniform 1..2,048, output uniform 1..512 tokens, Poisson arrivals
(bench.simulate.poisson_workload, seeded), written once as a CSV both simulators read (our
Vidur-style columns arrived_at/num_prefill_tokens/num_decode_tokens, plus the
Date/Time/PromptTokenCount/CompletionTokenCount columns Vidur 0.0.26's trace_replay generator reads).

Each side runs as its own process, timed end to end (interpreter start, loading the workload,
simulating, writing its output) under /usr/bin/time, which also reports its peak RSS:
  ours:  python -m core simulate W.csv --max-seqs 256 --token-budget 8192 --chunk 8192
             --step-model affine --base-ms 5 --prefill-ms-per-token 0.02 --decode-ms-per-seq 0.05
             --out OUT.parquet
  Vidur: <venv>/bin/python bench/vidur_launch.py run ...  (vLLM scheduler, 256 sequences,
         8,192 tokens per batch, block size 16, KV blocks never the limit, one replica, no
         parallelism, a synthetic profile giving the same affine step time; see that file).
Before timing, `vidur_launch.py prepare` (untimed, reported) trains Vidur's predictors once and
caches their predictions, as a warmed-up Vidur installation would have them; and our modules are
byte-compiled (`python -m compileall core`, untimed), as pip compiles an installed package's
modules, Vidur's included, at install time. (Python caches bytecode on first import by default;
a machine that sets PYTHONDONTWRITEBYTECODE=1, as this VM does, otherwise recompiles our modules
on every run, about 50 ms of a 10k run, and never Vidur's.)

The schedules differ by policy (ours: continuous batching with chunked prefill, prefill and
decode in one step; Vidur's vLLM scheduler: prefill-only or decode-only batches, whole prompts),
so the latency columns are a sanity check that both simulated the same workload, not a match.
This workload is overloaded (prefill alone needs ~1.02 s of step time per simulated second at
50 req/s), so latencies grow over the run and are very policy dependent.

GB = 10^9 bytes. Not run in CI; without the Vidur environment only our side runs.
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from bench.simulate import poisson_workload

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "bench" / "vidur_launch.py"
STEP = dict(base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
MAX_SEQS, TOKEN_BUDGET, BLOCK = 256, 8192, 16
TIME = "/usr/bin/time"


@contextmanager
def work_dir(keep: Path | None, prefix: str):
    """A temporary folder removed afterwards, or `keep` (made if missing) left in place."""
    work = Path(tempfile.mkdtemp(prefix=prefix)) if keep is None else keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        yield work
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept in {work}")


def write_workload_csv(path: Path, n: int, rate: float, seed: int) -> int:
    """The workload as CSV; returns the KV blocks needed to hold every request at once."""
    w = poisson_workload(n, rate, seed)
    blocks = 0
    with open(path, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens",
                     "Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for r in w.requests:
            t = repr(r.arrival_ms / 1000.0)
            wr.writerow([t, r.prompt_tokens, r.max_output_tokens,
                         "1970-01-01", t, r.prompt_tokens, r.max_output_tokens])
            blocks += -(-(r.prompt_tokens + r.max_output_tokens) // BLOCK)
    return blocks


def timed(cmd, log: Path, env=None, cwd: Path = REPO):
    """Run cmd under /usr/bin/time: (wall s, peak RSS GB, output, user CPU s, system CPU s).
    Raises RuntimeError on failure, with the end of the output."""
    tfile = log.with_suffix(".time")
    with open(log, "w") as out:
        p = subprocess.run([TIME, "-f", "%e %M %U %S", "-o", str(tfile), *map(str, cmd)],
                           stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    text = log.read_text()
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} ... exited {p.returncode}; last output:\n{text[-2000:]}")
    wall, kb, user, sys_s = tfile.read_text().strip().splitlines()[-1].split()
    return float(wall), int(kb) * 1024 / 1e9, text, float(user), float(sys_s)


def run_ours(csv_path: Path, out: Path, log: Path):
    cmd = [sys.executable, "-m", "core", "simulate", csv_path, "--max-seqs", MAX_SEQS,
           "--token-budget", TOKEN_BUDGET, "--chunk", TOKEN_BUDGET, "--step-model", "affine",
           "--base-ms", STEP["base_ms"], "--prefill-ms-per-token", STEP["prefill_ms_per_token"],
           "--decode-ms-per-seq", STEP["decode_ms_per_seq"], "--out", out]
    wall, gb, text, *_ = timed(cmd, log)
    preempt = [ln for ln in text.splitlines() if ln.startswith("wrote ")]
    return wall, gb, int(preempt[-1].split(" preemptions")[0].rsplit(" ", 1)[1]) if preempt else None


def our_stats(trace: Path, preemptions) -> dict:
    p = subprocess.run([sys.executable, "-m", "core", "metrics", str(trace), "--json"],
                       capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        print(f"  (python -m core metrics failed on {trace.name}: {p.stderr.strip()[-500:]})")
        return None
    s = json.loads(p.stdout)["summary"]
    return {"ttft_mean_s": s["ttft_ms"]["mean"] / 1e3, "ttft_p50_s": s["ttft_ms"]["median"] / 1e3,
            "e2e_mean_s": s["e2e_ms"]["mean"] / 1e3, "makespan_s": s["window_ms"][1] / 1e3,
            "completed": s["completed"], "restarts": preemptions}


def vidur_env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    return env


def vidur_prepare(py: Path, cache: Path, log: Path):
    return timed([py, LAUNCHER, "prepare", "--cache-dir", cache], log, env=vidur_env())


def run_vidur(py: Path, cache: Path, csv_path: Path, out_root: Path, blocks: int, log: Path):
    wall, gb, text, *_ = timed([py, LAUNCHER, "run", "--cache-dir", cache, "--trace", csv_path,
                            "--out-dir", out_root, "--num-blocks", blocks,
                            "--max-seqs", MAX_SEQS, "--token-budget", TOKEN_BUDGET,
                            "--base-ms", STEP["base_ms"],
                            "--prefill-ms-per-token", STEP["prefill_ms_per_token"],
                            "--decode-ms-per-seq", STEP["decode_ms_per_seq"]], log, env=vidur_env())
    lines = [ln for ln in text.splitlines() if ln.startswith("VIDUR_OUTPUT_DIR=")]
    end = [ln for ln in text.splitlines() if ln.startswith("VIDUR_SIM_END_S=")]
    makespan = float(end[-1].split("=", 1)[1])
    return wall, gb, Path(lines[-1].split("=", 1)[1]), makespan


def vidur_stats(out_dir: Path, makespan: float) -> dict:
    import pandas as pd
    m = pd.read_csv(out_dir / "request_metrics.csv")
    return {"ttft_mean_s": float(m["prefill_e2e_time"].mean()),
            "ttft_p50_s": float(m["prefill_e2e_time"].median()),
            "e2e_mean_s": float(m["request_e2e_time"].mean()), "makespan_s": makespan,
            "completed": int(len(m)), "restarts": int(m["request_num_restarts"].sum())}


def main():
    ap = argparse.ArgumentParser(description="our simulator vs Vidur 0.0.26, end to end")
    ap.add_argument("--requests", default="10000,100000", help="comma-separated workload sizes")
    ap.add_argument("--rate", type=float, default=50.0, help="arrivals per simulated second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="runs per side; best wall time is reported")
    ap.add_argument("--venv", type=Path, default=Path("/opt/vidur-venv"), help="Vidur 0.0.26 environment")
    ap.add_argument("--skip-vidur", action="store_true", help="only our side")
    ap.add_argument("--keep", type=Path, help="keep workloads, outputs and logs in this folder")
    a = ap.parse_args()
    sizes = [int(s.replace("_", "")) for s in a.requests.split(",") if s.strip()]
    if not Path(TIME).exists():
        sys.exit(f"{TIME} (GNU time) is needed to measure wall time and peak RSS")
    py = a.venv / "bin" / "python"
    skip = a.skip_vidur
    if not skip and not py.exists():
        print(f"Vidur environment not found ({py}); running our side only. "
              f"Create it as bench/vidur/README.md says, or pass --venv.")
        skip = True

    with work_dir(a.keep, "vs_vidur_") as work:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "core"], cwd=REPO, check=True)
        cache = work / "vidur_cache"
        if not skip:
            t, gb, *_ = vidur_prepare(py, cache, work / "vidur_prepare.log")
            print(f"Vidur prepare (profile + predictor training, untimed below): {t:.1f} s, {gb:.2f} GB")
        rows = []
        for n in sizes:
            csv_path = work / f"poisson{n}.csv"
            blocks = write_workload_csv(csv_path, n, a.rate, a.seed)
            ours, vid = [], []
            for k in range(a.repeat):
                out = work / f"ours{n}.parquet"
                wall, gb, preempt = run_ours(csv_path, out, work / f"ours{n}_{k}.log")
                ours.append((wall, gb))
                print(f"  {n:,} requests, run {k + 1}: ours {wall:.2f} s {gb:.2f} GB", flush=True)
                if not skip:
                    wall, gb, vdir, makespan = run_vidur(py, cache, csv_path, work / f"vidur{n}", blocks,
                                                         work / f"vidur{n}_{k}.log")
                    vid.append((wall, gb))
                    print(f"  {n:,} requests, run {k + 1}: Vidur {wall:.2f} s {gb:.2f} GB", flush=True)
            rows.append((n, min(ours), max(g for _, g in ours), our_stats(out, preempt),
                         (min(vid), max(g for _, g in vid), vidur_stats(vdir, makespan)) if vid else None))
        print()
        print(f"best of {a.repeat} run(s) per side; peak RSS = max over runs; GB = 10^9 bytes")
        print(f"{'workload':>16} {'ours s':>8} {'ours GB':>8} {'Vidur s':>8} {'Vidur GB':>9} {'Vidur/ours':>10}")
        for n, (ot, _), ogb, _, v in rows:
            vs = f"{v[0][0]:>8.2f} {v[1]:>9.2f} {v[0][0] / ot:>9.1f}x" if v else f"{'—':>8} {'—':>9} {'—':>10}"
            print(f"{f'poisson {n:,}':>16} {ot:>8.2f} {ogb:>8.2f} {vs}")
        print()
        print("schedule sanity (simulated seconds; policies differ, see the module docstring):")
        print(f"{'workload':>16} {'side':>6} {'done':>8} {'TTFT mean':>10} {'TTFT p50':>9} "
              f"{'E2E mean':>9} {'makespan':>9} {'preempt.':>9}")
        for n, _, _, os_, v in rows:
            for side, s in [("ours", os_)] + ([("Vidur", v[2])] if v else []):
                if s is None:
                    print(f"{f'poisson {n:,}':>16} {side:>6} {'(metrics unavailable)':>30}")
                    continue
                print(f"{f'poisson {n:,}':>16} {side:>6} {s['completed']:>8,} {s['ttft_mean_s']:>10.2f} "
                      f"{s['ttft_p50_s']:>9.2f} {s['e2e_mean_s']:>9.2f} {s['makespan_s']:>9.2f} "
                      f"{s['restarts'] if s['restarts'] is not None else '?':>9}")


if __name__ == "__main__":
    main()
