"""A real fleet measured, and the fleet simulator held against it (issue 38).

    python -m bench.fleet_real [--quick] [--bundle DIR] [--json OUT]

Every run starts real processes on 127.0.0.1 (`python -m gpu_runner serve` or `python -m
gpu_runner fleet`, the bundled tiny model, float32 CPU) and drives them with our capture client
(`python -m gpu_runner loadgen`: streams, ignore_eos, greedy), one run at a time. Prompts are token
ids from the bundled corpus. Four experiments:

  scale    one `serve` replica (2 torch threads) vs a fleet of two (1 thread each), round-robin, the
           same closed loop (16 in flight, 96 requests, prompts 96-160, outputs 24-40): output tok/s
           and TTFT p50/p99 as the client measured them. The machine has 2 cores: two replicas
           split them, so the fleet can only win by overlapping one replica's Python with the
           other's kernels — not what a fleet on separate GPUs gains.
  prefix   two replicas with prefix caching on a tight pool (64 blocks of 16 each), a shared-prefix
           workload (four system prompts of 192 tokens, one drawn at random per request, user turns of
           24-56, outputs 16, Poisson arrivals), prefix-aware (approximate, sglang's cache_aware) vs
           round-robin: prefix-hit blocks (the fleet trace's KV `hit` rows) and TTFT p50/p99 from the
           fleet trace.
  pd       1 prefill + 1 decode replica, prompts 32-1,536 tokens: each KV handoff (bytes, start,
           end) from the fleet trace; the time per KB on loopback (least squares: latency + bytes /
           bandwidth, over the transfers).
  fidelity the fleet simulator on each fleet run's own workload (the front end's arrival times,
           the prompts' token ids), the same router policy and replicas, a step model fitted on that
           run's replica 0 (python -m core fit's code, `features`; PD: each role's own replica) —
           per request: routing decisions that agree (%), TTFT and E2E error |sim - measured| /
           measured (median, p90); PD: each transfer's predicted duration vs measured (a link
           fitted on the even transfers, errors of the odd ones).

Prints a table; --json writes the numbers; --bundle DIR copies the fleet traces there. Asserts
nothing (numbers go to docs/benchmarks.md and docs/fidelity.md with this command).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BOUND_S = 600


def corpus_ids() -> list[int]:
    from gpu_runner.tokenizer import ByteTokenizer
    return ByteTokenizer().encode((ROOT / "data" / "corpus" / "pydoc_topics.txt").read_text())


def write_workload(path: Path, reqs: list[dict]):
    path.write_text(json.dumps({"name": path.stem, "requests": reqs}))


def closed_workload(n, prompt, output, seed) -> list[dict]:
    c, rng = corpus_ids(), np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(rng.integers(*prompt))
        s = int(rng.integers(0, len(c) - p))
        out.append({"id": f"c{i}", "arrival_ms": 0.0, "prompt_ids": c[s:s + p],
                    "output_tokens": int(rng.integers(*output))})
    return out


def shared_prefix_workload(n, rate, seed) -> list[dict]:
    c, rng = corpus_ids(), np.random.default_rng(seed)
    systems = [c[k:k + 192] for k in (1000, 5000, 9000, 13000)]
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(1000.0 / rate))
        u = int(rng.integers(24, 56))
        s = int(rng.integers(20000, len(c) - u))
        system = systems[int(rng.integers(len(systems)))]     # drawn: round-robin cannot follow it by luck
        out.append({"id": f"s{i}", "arrival_ms": round(t, 3), "prompt_ids": system + c[s:s + u],
                    "output_tokens": 16})
    return out


CAL_STAGES = ((2.0, 24), (6.0, 32), (15.0, 40), (35.0, 48), (70.0, 48), (140.0, 48))   # (req/s, requests)


def calibration_workload(seed, stages=CAL_STAGES) -> list[dict]:
    """A fleet's calibration run (issue 49, item 5): Poisson sends in stages of rising rate
    (`stages`: (req/s, requests) each), so each replica sees lone prefills after pauses (its
    wake-up, its first uses of a batch size) and every width up to and past what the closed loop
    of 16 runs (8 a replica), each on enough steps to price it; prompts 32-320 tokens, half behind
    one of four 192-token system prompts (prefix caching has hits), outputs 8-64."""
    c, rng = corpus_ids(), np.random.default_rng(seed)
    systems = [c[k:k + 192] for k in (1000, 5000, 9000, 13000)]
    t, out = 0.0, []
    for rate, n in stages:
        for _ in range(n):
            t += float(rng.exponential(1000.0 / rate))
            if rng.random() < 0.5:
                u = int(rng.integers(16, 128))
                s = int(rng.integers(20000, len(c) - u))
                prompt = systems[int(rng.integers(len(systems)))] + c[s:s + u]
            else:
                p = int(rng.integers(32, 320))
                s = int(rng.integers(20000, len(c) - p))
                prompt = c[s:s + p]
            out.append({"id": f"k{len(out)}", "arrival_ms": round(t, 3), "prompt_ids": prompt,
                        "output_tokens": int(rng.integers(8, 65))})
    return out


def pd_workload(n, rate, seed) -> list[dict]:
    c, rng = corpus_ids(), np.random.default_rng(seed)
    t, out = 0.0, []
    sizes = np.geomspace(32, 1536, n).astype(int)
    rng.shuffle(sizes)
    for i, p in enumerate(sizes.tolist()):
        t += float(rng.exponential(1000.0 / rate))
        s = int(rng.integers(0, len(c) - p))
        out.append({"id": f"d{i}", "arrival_ms": round(t, 3), "prompt_ids": c[s:s + p], "output_tokens": 16})
    return out


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], url: str, log: Path) -> subprocess.Popen:
    from deploy.serve import wait_healthy
    with open(log, "w") as f:      # (the child keeps its own copy of the descriptor)
        proc = subprocess.Popen([sys.executable, "-m", "gpu_runner", *cmd], cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_healthy(url, BOUND_S, [proc], path="/health")
    except Exception:
        proc.kill()
        raise SystemExit(f"{' '.join(cmd[:3])} did not start: {log.read_text()[-2000:]}") from None
    return proc


def stop(proc: subprocess.Popen):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()


def drive(url: str, workload: Path, out: Path, *flags: str):
    r = subprocess.run([sys.executable, "-m", "gpu_runner", "loadgen", "--url", url, "--workload", str(workload),
                        "--out", str(out), *flags], cwd=ROOT, capture_output=True,
                       text=True, timeout=BOUND_S)
    if r.returncode != 0:
        raise SystemExit(f"loadgen failed: {r.stdout[-1000:]} {r.stderr[-2000:]}")


def client_numbers(trace_path: Path) -> dict:
    from core.analysis.metrics import request_metrics
    from core.trace import load_trace
    tr = load_trace(trace_path)
    m = request_metrics(tr)
    tok = tr.tokens["t_ms"].to_numpy()
    span = (tok.max() - tr.requests["arrival_ms"].min()) / 1000.0
    return {"requests": len(tr.requests), "output_tok_s": len(tok) / span,
            "ttft_p50_ms": float(np.percentile(m["ttft_ms"], 50)),
            "ttft_p99_ms": float(np.percentile(m["ttft_ms"], 99)),
            "e2e_p50_ms": float(np.percentile(m["e2e_ms"], 50))}


def fleet_numbers(tr) -> dict:
    from core.analysis.metrics import request_metrics
    m = request_metrics(tr)
    hits = tr.kv[tr.kv["op"] == "hit"]
    return {"ttft_p50_ms": float(np.nanpercentile(m["ttft_ms"], 50)),
            "ttft_p99_ms": float(np.nanpercentile(m["ttft_ms"], 99)),
            "e2e_p50_ms": float(np.nanpercentile(m["e2e_ms"], 50)), "hit_blocks": int(len(hits)),
            "per_replica": tr.finishes.groupby("replica").size().to_dict()}


def run_fleet(tmp: Path, name: str, flags: list[str], workload: Path, drive_flags: list[str]):
    from core.trace import load_trace
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp / f"{name}.json.gz"
    proc = start(["fleet", "--port", str(port), "--trace-out", str(out), "--threads", "1", *flags], url,
                 tmp / f"{name}.log")
    try:
        drive(url, workload, tmp / f"{name}.client.json.gz", *drive_flags)
    finally:
        stop(proc)
    return load_trace(out), out


# ---- the fleet simulator against a run (core.fit.fleet) -------------------------------------------
def predict(tr, link: tuple[float, float] | None = None, held_out: set | None = None) -> dict:
    from core.fit.fleet import predict_fleet
    _, rep, _ = predict_fleet(tr, "features", True, link, held_out)
    _, only, _ = predict_fleet(tr, "features", False, link, held_out)   # what the step log alone predicts
    rep["steps_only"] = {k: only[k] for k in ("ttft", "e2e")}
    return rep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--bundle", help="copy the fleet traces (and their replicas' traces) into this directory")
    ap.add_argument("--json", help="write the numbers here")
    ap.add_argument("--only", choices=("scale", "prefix", "pd"), action="append",
                    help="run only these experiments (repeatable; default all)")
    a = ap.parse_args(argv)
    only = set(a.only or ("scale", "prefix", "pd"))
    q = a.quick
    tmp = Path(tempfile.mkdtemp(prefix="fleet_real_"))
    res: dict = {"machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d")}

    res["fidelity"] = {}
    if "scale" in only:
        scale(tmp, q, res)
    if "prefix" in only:
        prefix(tmp, q, res)
    if "pd" in only:
        pd_run(tmp, q, res)
    if a.bundle:
        dst = Path(a.bundle)
        dst.mkdir(parents=True, exist_ok=True)
        for f in ("two", "prefix_round-robin", "prefix_prefix-aware", "pd"):
            if (tmp / f"{f}.json.gz").exists():
                shutil.copy(tmp / f"{f}.json.gz", dst / f"fleet_{f.replace('-', '_')}.json.gz")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


def scale(tmp: Path, q: bool, res: dict):
    """1 replica vs 2."""
    wl = tmp / "closed.json"
    write_workload(wl, closed_workload(24 if q else 96, (96, 160), (24, 40), 1))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["serve", "--port", str(port), "--threads", "2", "--kv-blocks", "512"], url, tmp / "serve.log")
    try:
        drive(url, wl, tmp / "one.client.json.gz", "--concurrency", "16")
    finally:
        stop(proc)
    res["scale"] = {"1 replica (serve, 2 threads)": client_numbers(tmp / "one.client.json.gz")}
    tr2, p2 = run_fleet(tmp, "two", ["--replicas", "2", "--router", "round-robin", "--kv-blocks", "512"], wl,
                        ["--concurrency", "16"])
    res["scale"]["2 replicas (fleet, 1 thread each)"] = client_numbers(tmp / "two.client.json.gz")
    res["fidelity"]["scale: 2 replicas round-robin"] = predict(tr2)


def prefix(tmp: Path, q: bool, res: dict):
    """prefix-aware vs round-robin on a tight pool."""
    wl = tmp / "shared.json"
    write_workload(wl, shared_prefix_workload(30 if q else 120, 12.0, 2))
    res["prefix"] = {}
    for pol in ("round-robin", "prefix-aware"):
        tr, p = run_fleet(tmp, f"prefix_{pol}", ["--replicas", "2", "--router", pol, "--prefix-caching",
                                                 "--kv-blocks", "64"], wl, [])
        res["prefix"][pol] = fleet_numbers(tr)
        res["fidelity"][f"prefix: {pol}"] = predict(tr)


def pd_run(tmp: Path, q: bool, res: dict):
    """1P:1D, transfer sizes spread."""
    wl = tmp / "pd.json"
    write_workload(wl, pd_workload(16 if q else 48, 4.0, 3))
    tr, p = run_fleet(tmp, "pd", ["--prefill-replicas", "1", "--decode-replicas", "1", "--router", "round-robin",
                                  "--kv-blocks", "512"], wl, [])
    xf = [e for e in tr.events_of("transfer") if e.get("dur_ms") is not None]
    from core.fit.fleet import link_fit
    lat, gbps = link_fit(xf)
    per_kb = [e["dur_ms"] / (e["bytes"] / 1024) for e in xf]
    res["pd"] = {"transfers": len(xf), "bytes_min": min(e["bytes"] for e in xf),
                 "bytes_max": max(e["bytes"] for e in xf),
                 "dur_ms_median": float(np.median([e["dur_ms"] for e in xf])),
                 "ms_per_kb_median": float(np.median(per_kb)), "fit_latency_ms": lat, "fit_gbps": gbps,
                 "copy_out_ms_median": float(np.median([e["copy_ms"] for e in xf])), **fleet_numbers(tr)}
    even, odd = xf[0::2], xf[1::2]
    fid = predict(tr, link_fit(even), {e["req"] for e in odd})
    fid["transfer_link"] = "fitted on the even transfers, errors of the odd ones"
    res["fidelity"]["pd: 1P:1D round-robin"] = fid


if __name__ == "__main__":
    main()
