"""First visits in a real browser (issue 28 item 12): a fresh browser context (no cache) opening a
page by its link, the time to the page shell, to its first chart and to an idle app, with when the
Plotly chunk finished loading and when the server's first run ended, so the server's part and the
browser's part can be told apart. Each page twice: the second visit is a new context too (the
browser cache empty again) but the server's caches warm.

    python -m bench.first_visit [--pages schedules,kv,replay]

Needs Playwright and /usr/bin/chromium. Timings need an idle machine.
"""
import argparse
import time

from bench.replay_cursor import serve
from bench.revisions import REPO

IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
WATCH = """window.__state = []; window.__chart = null;
const watch = () => { const a = document.querySelector('[data-testid=stApp]'); if (!a) return setTimeout(watch, 10);
  new MutationObserver(() => window.__state.push([a.getAttribute('data-test-script-state'), performance.now()]))
    .observe(a, {attributes: true, attributeFilter: ['data-test-script-state']}); };
watch();
new MutationObserver(() => { if (window.__chart === null && document.querySelector('.js-plotly-plot .main-svg'))
  window.__chart = performance.now(); }).observe(document, {subtree: true, childList: true});"""
PAGES = {"home": "", "schedules": "schedules", "kv": "kv", "replay": "replay?tr=shared_prefix_caching_on.json.gz",
         "load": "load"}


def visit(browser, url: str) -> dict:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.add_init_script(WATCH)
    t = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("[data-testid='stMain']")
    shell = time.perf_counter() - t
    page.wait_for_selector(IDLE)
    page.wait_for_timeout(1500)        # charts drawn after the run ends
    out = page.evaluate("""() => ({chart: window.__chart, state: window.__state,
        plotly: (performance.getEntriesByType('resource').find(e => e.name.includes('PlotlyChart')) || {}).responseEnd
                || null})""")
    context.close()
    done = [s for s, _ in out["state"]]
    ran = [t for s, t in out["state"] if s == "notRunning"]
    return {"shell_s": shell, "chart_s": out["chart"] / 1000 if out["chart"] else None,
            "plotly_s": out["plotly"] / 1000 if out["plotly"] else None,
            "server_done_s": ran[0] / 1000 if ran else None, "states": done}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", default=",".join(PAGES))
    a = ap.parse_args()
    import tempfile
    from pathlib import Path

    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        proc, url = serve(REPO, Path(tmp))
        try:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium")
            print(f"{'page':>10} {'visit':>6} {'shell':>7} {'first run done':>15} {'Plotly JS':>10} "
                  f"{'first chart':>12}")
            for name in a.pages.split(","):
                for k in (1, 2):
                    r = visit(browser, f"{url}/{PAGES[name]}")
                    f = (lambda x: "—" if x is None else f"{x:.2f} s")
                    print(f"{name:>10} {k:>6} {f(r['shell_s']):>7} {f(r['server_done_s']):>15} {f(r['plotly_s']):>10} "
                          f"{f(r['chart_s']):>12}", flush=True)
            browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
