"""Interactions in a real browser (issue 36, item 26): how long each takes from the user's input to an
idle app with its charts drawn, in an older revision and in this checkout side by side (each its own
Streamlit server on 127.0.0.1, one after the other, the same headless Chromium, 1280x800).

- KV page load: a new browser context (empty cache) opens /kv; the server's caches warm (the second
  visit of the run is timed; the first warms them).
- replay "step ▶": the first click on the default trace's step button after the page opened, and the
  next ones (the median of clicks 2-4).
- replay Play off: Play on for two ticks, then off; the time from the click that turns it off.
- replay "Upload a file…": choosing the upload entry of the trace list.
- Fleet page, Poisson 10000 (issue 50): the router policy changed to one this server has not run yet
  (its simulation and every chart of the page included), after the page opened on that workload;
  timed from the choice in the open list (the server's one-off lesson runs finished first).
- exports (CSV): the sidebar's "Slides and handouts" CSV zip of the replay view (SVG/PNG render every
  figure in Chromium through kaleido: timed too, reported apart).

    python -m bench.interactions [--base REV] [--repeat 3] [--only kv,step,steps,play,upload,csv,svg,fleet]

Needs Playwright and /usr/bin/chromium. Timings need an otherwise idle machine.
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.replay_cursor import serve
from bench.revisions import REPO, worktree

VIEWPORT = {"width": 1280, "height": 800}
# the app's script state, logged with the browser's clock: an interaction ends at the first
# 'notRunning' after it, with every chart drawn
WATCH = """window.__state = [];
const watch = () => { const a = document.querySelector('[data-testid=stApp]'); if (!a) return setTimeout(watch, 5);
  new MutationObserver(() => window.__state.push([a.getAttribute('data-test-script-state'), performance.now()]))
    .observe(a, {attributes: true, attributeFilter: ['data-test-script-state']}); };
watch();"""
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
DONE_AFTER = """(t0) => window.__state.some(([s, t]) => s === 'running' && t >= t0)
  && window.__state.length && window.__state[window.__state.length - 1][0] === 'notRunning'
  && [...document.querySelectorAll("[data-testid='stPlotlyChart']")].every(c => c.querySelector('.main-svg'))"""


def _open(browser, url: str):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(180_000)
    page.add_init_script(WATCH)
    return context, page


def _settled(page):
    page.wait_for_selector(IDLE)
    page.wait_for_function("""() => [...document.querySelectorAll("[data-testid='stPlotlyChart']")]
                              .every(c => c.querySelector('.main-svg'))""")


def _timed(page, action) -> float:
    """Seconds from `action` (a user input) to the end of the rerun it starts, charts drawn."""
    t0 = page.evaluate("performance.now()")
    start = time.perf_counter()
    action()
    page.wait_for_function(DONE_AFTER, arg=t0)
    return time.perf_counter() - start


def kv_load(browser, url):
    context, page = _open(browser, url)
    start = time.perf_counter()
    page.goto(f"{url}/kv")
    page.wait_for_selector("[data-testid='stMain']")
    page.wait_for_function("() => window.__state.some(([s]) => s === 'notRunning')")
    _settled(page)
    took = time.perf_counter() - start
    context.close()
    return took


def replay_page(browser, url):
    context, page = _open(browser, url)
    page.goto(f"{url}/replay")
    _settled(page)
    return context, page


def step(browser, url):
    """The first click on a freshly opened page."""
    context, page = replay_page(browser, url)
    took = _timed(page, lambda: page.get_by_role("button", name="step ▶").click())
    context.close()
    return took


def steps_after(browser, url):
    """The median of the 2nd to 4th clicks (the first one mounts the views' charts again)."""
    context, page = replay_page(browser, url)
    _timed(page, lambda: page.get_by_role("button", name="step ▶").click())
    took = sorted(_timed(page, lambda: page.get_by_role("button", name="step ▶").click()) for _ in range(3))[1]
    context.close()
    return took


def play_off(browser, url):
    context, page = replay_page(browser, url)
    switch = page.locator("[data-testid='stCheckbox'], [data-testid='stToggle']").filter(has_text="Play").first
    switch.locator("label").first.click()
    # two of Play's ticks (0.8 s apart) after the rerun that turned it on
    t0 = page.evaluate("performance.now()")
    page.wait_for_function("(t0) => window.__state.filter(([s, t]) => s === 'notRunning' && t > t0).length >= 3",
                           arg=t0)
    took = _timed(page, lambda: switch.locator("label").first.click())
    context.close()
    return took


def upload_choice(browser, url):
    context, page = replay_page(browser, url)
    box = page.locator(".st-key-tr").get_by_role("combobox")

    def choose():
        box.click()
        box.fill("Upload a file")
        page.get_by_role("option", name="Upload a file…", exact=True).click()
    took = _timed(page, choose)
    context.close()
    return took


def export(fmt: str):
    def run(browser, url):
        context, page = replay_page(browser, url)
        page.get_by_text("Slides and handouts").click()
        label = fmt.upper()
        took = _timed(page, lambda: page.locator(f".st-key-export_{fmt}").get_by_role("button", name=label).click())
        page.get_by_role("button", name=f"Download {'tables as CSV' if fmt == 'csv' else 'figures as ' + label}")\
            .first.wait_for()
        context.close()
        return took
    return run


# routers a fleet case switches to, one not run yet on this server each time (the page starts on prefix-aware)
FLEET_ROUTERS = ["least-requests", "least-kv", "round-robin", "power-of-two", "random", "weighted"]
FLEET_PAGE = "/fleet?fl_wl=Poisson+10000"
_fleet_runs = {}


def _fleet_page(browser, url, params: str = ""):
    context, page = _open(browser, url)
    page.goto(f"{url}{FLEET_PAGE}{params}")
    page.wait_for_selector("[data-testid='stMain']")
    page.wait_for_function("() => window.__state.some(([s]) => s === 'notRunning')")
    _settled(page)
    return context, page


def fleet_warm(browser, url):
    """The Fleet page's first visit starts the lesson's runs in a thread (ui.fleet.prefetch_lesson); its
    Lesson tab waits on them: open it so that the machine is idle again before a router change is timed."""
    context, page = _fleet_page(browser, url, "&fl_tab=Lesson")
    context.close()


def fleet_router(browser, url):
    """From choosing another router in the open list to the page idle with its charts drawn (opening the
    list and typing the name are not timed: the browser alone, still busy drawing the page it opened)."""
    context, page = _fleet_page(browser, url)
    k = _fleet_runs[url] = _fleet_runs.get(url, -1) + 1
    name = FLEET_ROUTERS[k % len(FLEET_ROUTERS)]
    box = page.locator(".st-key-fl_pol").get_by_role("combobox")
    box.click()
    box.fill(name)
    option = page.get_by_role("option", name=name, exact=True)
    option.wait_for()
    took = _timed(page, option.click)
    context.close()
    return took


CASES = {"kv": ("KV page load", kv_load), "step": ("replay step ▶ (first)", step),
         "steps": ("replay step ▶ (next ones)", steps_after), "play": ("replay Play off", play_off),
         "upload": ("replay 'Upload a file…'", upload_choice), "csv": ("export tables (CSV zip)", export("csv")),
         "svg": ("export figures (SVG zip)", export("svg")),
         "fleet": ("Fleet page: router change", fleet_router)}


def measure(browser, url: str, cases: list[str], repeat: int) -> dict:
    kv_load(browser, url)                  # the server's caches warm for every case
    step(browser, url)
    if "fleet" in cases:
        fleet_warm(browser, url)
    return {c: [CASES[c][1](browser, url) for _ in range(repeat)] for c in cases}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="637dbd9", help="the older revision (default: before issue 36)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=",".join(CASES))
    a = ap.parse_args()
    cases = a.only.split(",")
    from playwright.sync_api import sync_playwright
    results = {}
    with tempfile.TemporaryDirectory() as tmp, worktree(a.base, Path(tmp) / "base") as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        for name, tree in ((a.base, base), ("this checkout", REPO)):
            proc, url = serve(tree, Path(tmp) / "no-extra-traces")
            try:
                results[name] = measure(browser, url, cases, a.repeat)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        browser.close()
    (old_name, old), (new_name, new) = results.items()
    print(f"input to idle app with charts drawn, 1280x800, median of {a.repeat} (seconds):")
    print(f"{'':>28} {old_name:>14} {new_name:>14} {'old/new':>8}")
    for c in cases:
        o, n = statistics.median(old[c]), statistics.median(new[c])
        print(f"{CASES[c][0]:>28} {o:14.2f} {n:14.2f} {o / n:8.2f}")


if __name__ == "__main__":
    main()
