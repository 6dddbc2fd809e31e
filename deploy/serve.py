"""Serve a classroom: N Streamlit processes behind HAProxy with sticky sessions.

    python -m deploy.serve [--processes 2] [--port 8501] [--address 127.0.0.1]

One Streamlit process runs every user's script under one interpreter lock, so a process
uses about one core; N processes use N. Each listens on loopback (port+1 .. port+N) and
HAProxy (deploy/haproxy.cfg, `apt-get install haproxy`) listens on ADDRESS:PORT, sends each
new browser to the process with the fewest open connections and keeps it there by a cookie
(docs/deploy.md says why that is needed). Ctrl-C stops everything. Binds 127.0.0.1 unless
--address says otherwise (0.0.0.0 to let a class reach it: a deliberate choice).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from core.sim.parallel import cpus

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = Path(__file__).with_name("haproxy.cfg")


class DeployError(Exception):
    """A clear reason the cluster could not start (printed as one line, exit 2)."""


def haproxy_config(address: str, port: int, backends: list[int]) -> str:
    """deploy/haproxy.cfg with the listening address and one `server` line per process."""
    servers = "\n".join(f"    server st{i} 127.0.0.1:{p} check cookie st{i}" for i, p in enumerate(backends, 1))
    bind = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    return TEMPLATE.read_text().replace("{bind}", bind).replace("{servers}", servers)


def wait_healthy(url: str, timeout_s: float, procs: list[subprocess.Popen], path: str = "/_stcore/health") -> None:
    """Poll `url + path` until it answers 200; DeployError when a process in `procs` exits or
    the time is up (Streamlit by default; the runner's server answers /health)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                raise DeployError(f"{' '.join(map(str, p.args[:4]))}... exited with {p.returncode} while starting")
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise DeployError(f"{url} did not answer {path} within {timeout_s:.0f} s")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def cluster(processes: int = 2, port: int = 8501, address: str = "127.0.0.1", log_dir: Path | None = None,
            timeout_s: float = 90.0):
    """Start N Streamlit processes and HAProxy in front of them; yields (url, [pids]) once every
    process and the proxy answer /_stcore/health; stops them all on exit."""
    if processes < 1:
        raise DeployError(f"--processes must be at least 1, got {processes}")
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        raise DeployError("haproxy is not installed (Debian/Ubuntu: apt-get install haproxy)")
    backends = [port + i for i in range(1, processes + 1)]
    procs: list[subprocess.Popen] = []
    # each app process starts simulation workers (core.sim.parallel); N processes share the CPUs
    env = dict(os.environ)
    env.setdefault("SERVING_EXPLORER_WORKERS", str(max(1, cpus() // processes)))
    with tempfile.TemporaryDirectory(prefix="serving-explorer-deploy-") as tmp:
        logs = Path(log_dir or tmp)
        try:
            for b in backends:
                with open(logs / f"streamlit-{b}.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                         "--server.port", str(b), "--server.address", "127.0.0.1",
                         "--browser.gatherUsageStats", "false"],
                        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env))
            for b in backends:
                wait_healthy(f"http://127.0.0.1:{b}", timeout_s, procs)
            cfg = Path(tmp) / "haproxy.cfg"
            cfg.write_text(haproxy_config(address, port, backends))
            check = subprocess.run([haproxy, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
            if check.returncode != 0:
                raise DeployError(f"haproxy refused {cfg}: {(check.stderr or check.stdout).strip()[:300]}")
            with open(logs / "haproxy.log", "wb") as log:
                procs.append(subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stdout=log,
                                              stderr=subprocess.STDOUT))
            host = "127.0.0.1" if address in ("0.0.0.0", "::") else address
            url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
            wait_healthy(url, timeout_s, procs)
            yield url, [p.pid for p in procs]
        finally:
            _stop(procs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=max(1, min(os.cpu_count() or 1, 8)),
                    help="Streamlit processes (default: one per CPU, at most 8)")
    ap.add_argument("--port", type=int, default=8501, help="the proxy's port; processes use the next N ports")
    ap.add_argument("--address", default="127.0.0.1", help="the proxy's address (0.0.0.0: every interface)")
    a = ap.parse_args(argv)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        with cluster(a.processes, a.port, a.address) as (url, _):
            print(f"Serving Explorer: {url}  ({a.processes} Streamlit processes behind HAProxy; Ctrl-C stops)",
                  flush=True)
            while not stop:
                time.sleep(0.5)
    except DeployError as e:
        print(f"deploy.serve: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
