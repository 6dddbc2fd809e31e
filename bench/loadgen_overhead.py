"""The capture client's own cost: CPU seconds per request of `gpu_runner loadgen`.

    python -m bench.loadgen_overhead [--requests 200] [--concurrency 16]

Starts `gpu_runner serve` (tiny model, 1 thread) on loopback, runs `loadgen` against it in a
child process, and reads the child's CPU time (user + system, getrusage) — the client's
overhead per request, to compare with the server's per-request cost. Printed, never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy.serve import DeployError, wait_healthy

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--port", type=int, default=8733)
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "gpu_runner", "serve", "--port", str(a.port), "--threads", "1",
                               "--max-seqs", "16"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{a.port}"
        try:
            wait_healthy(url, 120, [server], path="/health")
        except DeployError as e:
            raise SystemExit(f"the server did not start: {e}") from None
        with tempfile.TemporaryDirectory() as tmp:
            wl = Path(tmp) / "w.json"
            wl.write_text(json.dumps({"requests": [{"id": f"r{k}", "arrival_ms": 0, "prompt_tokens": 64,
                                                    "output_tokens": a.output_tokens} for k in range(a.requests)]}))
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", "import gpu_runner.__main__, gpu_runner.loadgen, core.trace, "
                            "core.workload, core.cli"], cwd=ROOT, env=env, check=True)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            startup = (before.ru_utime - r0.ru_utime) + (before.ru_stime - r0.ru_stime)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "gpu_runner", "loadgen", "--url", url, "--workload", str(wl),
                            "--concurrency", str(a.concurrency), "--out", str(Path(tmp) / "t.json")],
                           cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        server.terminate()
        server.wait(30)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    run = cpu - startup
    print(f"loadgen: {a.requests} requests x {a.output_tokens} tokens, concurrency {a.concurrency}, wall {wall:.1f} s; "
          f"client CPU {cpu:.2f} s in all, of which {startup:.2f} s interpreter start and imports (measured alone); "
          f"the rest {run:.2f} s = {1000 * run / a.requests:.1f} ms per request, "
          f"{1e6 * run / (a.requests * a.output_tokens):.0f} us per streamed token; "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
