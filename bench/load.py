"""A classroom opening the app at once: N browser users, each on its own page with its own
query parameters, against one `streamlit run app.py` on loopback.

    python -m bench.load [--users 30] [--port 8599] [--settle 10]

Prints the time from navigation to the first drawn chart per user (p50, p95, max), errors
(exceptions shown or timeouts), and the server's resident memory: at start, peak while the
users load, and after they have left. Targets (issue 10): p95 <= 5 s, peak RSS <= 1.5 GB,
RSS back within 20% of the start after the users leave. Printed, never asserted.

One headless Chromium (/usr/bin/chromium, or $CHROMIUM) with one context per user, so the
browsers share a process tree; on a 2-core machine the browsers' own rendering competes
with the server, which inflates the times (state that when quoting numbers).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

# What a class clicks on: every page, with scenario parameters that differ between users.
PATHS = ["", "schedules?sc=Burst+5&pol=static&pol=continuous&ms={k}&s_kind=constant&s_step=1",
         "kv?kv_tokens={t}", "tiles", "speculative", "roofline",
         "replay?tr=chapter31_continuous.json", "schedules?sc=Chapter+31&ms={k}",
         "replay?tr=shared_prefix_caching_on.json.gz"]


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, MB (from /proc)."""
    total = 0
    pids = [pid]
    try:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        pids += [int(k) for k in kids]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def wait_healthy(url: str, timeout_s: float = 60):
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"server at {url} did not become healthy in {timeout_s:.0f} s")


async def one_user(browser, url: str, i: int, timeout_ms: int) -> tuple[float | None, str | None]:
    path = PATHS[i % len(PATHS)].format(k=2 + i % 5, t=1024 + 64 * i)
    ctx = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await ctx.new_page()
    t0 = time.perf_counter()
    try:
        await page.goto(f"{url}/{path}", timeout=timeout_ms)
        if path:   # every page but home draws a chart
            await page.wait_for_selector(".js-plotly-plot", timeout=timeout_ms)
        else:
            await page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning'] h1",
                                         timeout=timeout_ms)
        dt = time.perf_counter() - t0
        err = "exception shown" if await page.locator("[data-testid='stException']").count() else None
        return dt, err
    except Exception as e:  # a timeout or a navigation error is a failed user, reported, not raised
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    finally:
        await ctx.close()


async def run_users(url: str, users: int, timeout_ms: int, server_pid: int, sequential: bool = False):
    from playwright.async_api import async_playwright
    peak = [0.0]
    stop = asyncio.Event()

    async def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(server_pid))
            await asyncio.sleep(0.5)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"])
        sampler = asyncio.create_task(sample())
        if sequential:
            results = [await one_user(browser, url, i, timeout_ms) for i in range(users)]
        else:
            results = await asyncio.gather(*(one_user(browser, url, i, timeout_ms) for i in range(users)))
        stop.set()
        await sampler
        await browser.close()
    return results, peak[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=30)
    ap.add_argument("--port", type=int, default=8599)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a user waits for its first chart")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after the users leave before RSS is read")
    a = ap.parse_args()
    url = f"http://127.0.0.1:{a.port}"
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                               "--server.port", str(a.port), "--server.address", "127.0.0.1",
                               "--browser.gatherUsageStats", "false"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(url)
        rss_cold = rss_mb(server.pid)
        # Warm-up: one user opens every page once (imports, built-in scenarios cached per process);
        # the baseline that memory should return to is measured after it.
        asyncio.run(run_users(url, len(PATHS), int(a.timeout * 1000), server.pid, sequential=True))
        rss0 = rss_mb(server.pid)
        t0 = time.perf_counter()
        results, peak = asyncio.run(run_users(url, a.users, int(a.timeout * 1000), server.pid))
        wall = time.perf_counter() - t0
        time.sleep(a.settle)
        rss_after = rss_mb(server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    times = sorted(t for t, _ in results if t is not None)
    errors = [f"user {i}: {e}" for i, (_, e) in enumerate(results) if e]
    p95 = float(np.percentile(times, 95)) if times else float("nan")   # numpy 'linear', as core.metrics
    print(f"users: {a.users} (one Chromium, a context each), {os.cpu_count()} CPUs, wall {wall:.1f} s")
    if times:
        print(f"time to first chart: p50 {statistics.median(times):.2f} s, p95 {p95:.2f} s, "
              f"max {times[-1]:.2f} s   [target p95 <= 5 s: {'met' if p95 <= 5 else 'MISSED'}]")
    print(f"errors: {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
    print(f"server RSS: cold {rss_cold:.0f} MB, after a one-user warm-up {rss0:.0f} MB, "
          f"peak {peak:.0f} MB [target <= 1536 MB: {'met' if peak <= 1536 else 'MISSED'}], "
          f"{a.settle:g} s after the users left {rss_after:.0f} MB "
          f"({rss_after / rss0:.2f}x warm) [target <= 1.2x: {'met' if rss_after <= 1.2 * rss0 else 'MISSED'}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
