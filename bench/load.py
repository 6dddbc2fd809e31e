"""A classroom opening the app at once: N users, each on its own page with its own query
parameters, all started together against one server on loopback.

    python -m bench.load [--users 30] [--client ws|browser] [--processes N] [--settle 10]

Prints the time from the first request to the first chart per user (p50, p95, max; the home
page, which draws none, counts when its script finishes), errors (an exception element, a
timeout, a refused connection), and the server's resident memory: at start, peak while the
users load, and after they have left. Targets (issue 10 item 19): p95 <= 5 s, peak RSS <=
1.5 GB, RSS back within 20% of the start after the users leave. Printed, never asserted.

Clients:
- `ws` (default): what a browser asks of the server, without a browser. Each user fetches
  the page's HTML and every script, stylesheet and font it references (gzip accepted), then
  opens Streamlit's websocket (`/_stcore/stream`), sends the same first `rerun_script`
  message the frontend sends (page name, query string, time zone) and reads the protobuf
  messages until the script finishes. Server cost is the same as a browser's first load;
  the client costs little CPU, so on a 2-core machine the times are the server's.
- `browser`: one headless Chromium (/usr/bin/chromium, or $CHROMIUM), a context per user.
  The browsers render on the same cores as the server, which inflates the times (state it
  when quoting numbers).

`--processes N` measures the deployment in docs/deploy.md instead: N Streamlit processes
behind HAProxy with sticky sessions (`python -m deploy.serve`); RSS is summed over them.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
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


async def _get(url: str, cookies: dict[str, str]) -> bytes:
    """GET as a browser would (gzip accepted, its cookies sent); cookies set by the answer are kept
    (a proxy's sticky-session cookie among them)."""
    def fetch():
        headers = {"Accept-Encoding": "gzip"}
        if cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as r:
            for c in r.headers.get_all("Set-Cookie") or []:
                name, _, value = c.split(";", 1)[0].partition("=")
                cookies[name.strip()] = value.strip()
            return r.read()
    return await asyncio.to_thread(fetch)


async def ws_user(url: str, i: int, timeout_s: float) -> tuple[float | None, str | None]:
    """One user as the server sees a browser: HTML and its assets over HTTP, then one script run
    over the websocket. Returns (seconds to the first chart, error or None)."""
    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    page, _, query = PATHS[i % len(PATHS)].format(k=2 + i % 5, t=1024 + 64 * i).partition("?")
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            cookies: dict[str, str] = {}
            html = (await _get(f"{url}/{page}", cookies)).decode("utf-8", "replace")
            assets = sorted(set(re.findall(r'(?:src|href)="\./(static/[^"]+\.(?:js|css|woff2))"', html)))
            await asyncio.gather(*(_get(f"{url}/{a}", cookies) for a in assets))
            headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())} if cookies else None
            async with websockets.connect(f"ws{url[4:]}/_stcore/stream", subprotocols=["streamlit"],
                                          origin=url, max_size=2**28, additional_headers=headers) as ws:
                msg = BackMsg()
                msg.rerun_script.query_string = query
                msg.rerun_script.page_name = page
                msg.rerun_script.context_info.timezone = "UTC"
                await ws.send(msg.SerializeToString())
                first = None
                async for data in ws:
                    fwd = ForwardMsg()
                    fwd.ParseFromString(data)
                    kind = fwd.WhichOneof("type")
                    if kind == "delta" and fwd.delta.WhichOneof("type") == "new_element":
                        element = fwd.delta.new_element.WhichOneof("type")
                        if element == "exception":
                            return None, "exception shown: " + fwd.delta.new_element.exception.type
                        if element == "plotly_chart" and first is None:
                            first = time.perf_counter() - t0
                    if kind == "script_finished" and fwd.script_finished != ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                        break   # (a run that ends early for a rerun is followed by the rerun)
        return (first if first is not None else time.perf_counter() - t0), None
    except Exception as e:  # a timeout or a refused connection is a failed user, reported, not raised
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"


async def browser_user(browser, url: str, i: int, timeout_s: float) -> tuple[float | None, str | None]:
    path = PATHS[i % len(PATHS)].format(k=2 + i % 5, t=1024 + 64 * i)
    timeout_ms = int(timeout_s * 1000)
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


async def run_users(url: str, users: int, timeout_s: float, pids: list[int], client: str,
                    sequential: bool = False):
    peak = [0.0]
    stop = asyncio.Event()

    async def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], sum(rss_mb(p) for p in pids))
            await asyncio.sleep(0.5)

    async def all_users(one):
        if sequential:
            return [await one(i) for i in range(users)]
        return await asyncio.gather(*(one(i) for i in range(users)))

    sampler = asyncio.create_task(sample())
    if client == "ws":
        results = await all_users(lambda i: ws_user(url, i, timeout_s))
    else:
        from playwright.async_api import async_playwright
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"])
            results = await all_users(lambda i: browser_user(browser, url, i, timeout_s))
            await browser.close()
    stop.set()
    await sampler
    return results, peak[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=30)
    ap.add_argument("--client", choices=["ws", "browser"], default="ws",
                    help="ws: HTTP + Streamlit's websocket protocol, no rendering; browser: headless Chromium")
    ap.add_argument("--processes", type=int, default=0,
                    help="0: one `streamlit run app.py`; N: N processes behind HAProxy (python -m deploy.serve)")
    ap.add_argument("--port", type=int, default=8599)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a user waits for its first chart")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after the users leave before RSS is read")
    a = ap.parse_args()
    with contextlib.ExitStack() as stack:
        if a.processes:
            from deploy.serve import DeployError, cluster
            try:
                url, pids = stack.enter_context(cluster(a.processes, a.port))
            except DeployError as e:
                print(f"bench.load: {e}", file=sys.stderr)
                return 2
            pids = pids[:-1]   # the Streamlit processes; the proxy's memory is not the app's
        else:
            url = f"http://127.0.0.1:{a.port}"
            server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless",
                                       "true", "--server.port", str(a.port), "--server.address", "127.0.0.1",
                                       "--browser.gatherUsageStats", "false"], cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            stack.callback(_stop, server)
            pids = [server.pid]
            from deploy.serve import DeployError, wait_healthy
            try:
                wait_healthy(url, 60, [server])
            except DeployError as e:
                print(f"bench.load: {e}", file=sys.stderr)
                return 2
        rss_cold = sum(rss_mb(p) for p in pids)
        # Warm-up: one user opens every page once per process (imports, built-in scenarios cached
        # per process); the baseline that memory should return to is measured after it.
        for _ in range(max(1, a.processes)):
            asyncio.run(run_users(url, len(PATHS), a.timeout, pids, a.client, sequential=True))
        rss0 = sum(rss_mb(p) for p in pids)
        t0 = time.perf_counter()
        results, peak = asyncio.run(run_users(url, a.users, a.timeout, pids, a.client))
        wall = time.perf_counter() - t0
        time.sleep(a.settle)
        rss_after = sum(rss_mb(p) for p in pids)
    times = sorted(t for t, _ in results if t is not None)
    errors = [f"user {i}: {e}" for i, (_, e) in enumerate(results) if e]
    p95 = float(np.percentile(times, 95)) if times else float("nan")   # numpy 'linear', as core.analysis.metrics
    client = "websocket clients (HTML + assets + one script run)" if a.client == "ws" else \
        "one Chromium, a context each"
    server_kind = f"{a.processes} Streamlit processes behind HAProxy" if a.processes else "one Streamlit process"
    print(f"users: {a.users} ({client}) against {server_kind}; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, wall {wall:.1f} s")
    if times:
        print(f"time to first chart: p50 {statistics.median(times):.2f} s, p95 {p95:.2f} s, "
              f"max {times[-1]:.2f} s   [target p95 <= 5 s: {'met' if p95 <= 5 else 'MISSED'}]")
    print(f"errors: {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
    print(f"server RSS: cold {rss_cold:.0f} MB, after a one-user warm-up {rss0:.0f} MB, "
          f"peak {peak:.0f} MB [target <= 1536 MB: {'met' if peak <= 1536 else 'MISSED'}], "
          f"{a.settle:g} s after the users left {rss_after:.0f} MB "
          f"({rss_after / rss0:.2f}x warm) [target <= 1.2x: {'met' if rss_after <= 1.2 * rss0 else 'MISSED'}]")
    return 0


def _stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


if __name__ == "__main__":
    sys.exit(main())
