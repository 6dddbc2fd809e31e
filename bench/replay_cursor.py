"""The replay page's time cursor in a real browser (issue 28 item 11): how long a slider move and
a "step ▶" click take from the input to the redrawn batch view, on a 500-request, 49,560-step
simulated run (data/workloads/poisson500_vidur.csv, vllm-v1, 16 sequences, constant 1 ms steps),
in this checkout and in an older revision side by side (each its own Streamlit server on
127.0.0.1, one after the other, the same headless Chromium).

    python -m bench.replay_cursor [--base REV] [--moves 6]

Needs Playwright and /usr/bin/chromium (the browser tests' setup). Timings need an idle machine.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.revisions import REPO, worktree

IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
TITLE_CHANGED = """(b) => { for (const t of document.querySelectorAll('.gtitle'))
  if (t.textContent.startsWith('Step ') && t.textContent !== b) return true; return false; }"""
BATCH_TITLE = """() => { for (const t of document.querySelectorAll('.gtitle'))
  if (t.textContent.startsWith('Step ')) return t.textContent; return null; }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tree: Path, traces: Path):
    port = free_port()
    env = {**os.environ, "SERVING_EXPLORER_TRACES": str(traces), "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false"], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the app in {tree} did not start")


def measure(browser, url: str, moves: int) -> dict:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(120_000)
    t = time.perf_counter()
    page.goto(f"{url}/replay?tr=p500.json.gz")
    page.wait_for_selector(IDLE)
    page.wait_for_function(TITLE_CHANGED, arg="")
    opened = time.perf_counter() - t
    slider = page.locator("input[type='range'][aria-label='Time cursor (ms)']")
    out = {"open_s": opened, "slider_s": [], "step_s": []}
    for what in ("slider", "step"):
        for k in range(moves):
            before = page.evaluate(BATCH_TITLE)
            t = time.perf_counter()
            if what == "slider":
                slider.focus()
                page.keyboard.press("PageUp" if k % 2 == 0 else "PageDown")
            else:
                page.get_by_role("button", name="step ▶").click()
            page.wait_for_function(TITLE_CHANGED, arg=before)
            page.wait_for_selector(IDLE)
            out[f"{what}_s"].append(time.perf_counter() - t)
    page.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="092c6be", help="the older revision (default: before the fix)")
    ap.add_argument("--moves", type=int, default=6)
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp) / "traces"
        traces.mkdir()
        subprocess.run([sys.executable, "-m", "core", "simulate", "data/workloads/poisson500_vidur.csv",
                        "--policy", "vllm-v1", "--max-seqs", "16", "--step-model", "constant", "--step-ms", "1",
                        "--out", str(traces / "p500.json.gz")], cwd=REPO, check=True, capture_output=True)
        results = {}
        with worktree(a.base, Path(tmp) / "base") as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium")
            for name, tree in ((a.base, base), ("this checkout", REPO)):
                proc, url = serve(tree, traces)
                try:
                    measure(browser, url, 1)                 # warm: the trace read and cached once
                    results[name] = measure(browser, url, a.moves)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
            browser.close()
    print("replay page, 500 requests / 49,560 steps, 1280x800, input to redrawn batch view (median of "
          f"{a.moves}):")
    print(f"{'':>16} {'slider move':>12} {'step ▶':>10}")
    for name, r in results.items():
        slider, step = statistics.median(r["slider_s"]) * 1000, statistics.median(r["step_s"]) * 1000
        print(f"{name:>16} {slider:10.0f} ms {step:8.0f} ms")
    (old, new) = results.values()
    for k, label in (("slider_s", "slider move"), ("step_s", "step ▶")):
        print(f"{label}: {statistics.median(old[k]) / statistics.median(new[k]):.1f}x faster")


if __name__ == "__main__":
    main()
