"""Regenerate the README screenshots with the project's own browser tooling
(Streamlit server + headless Chromium via Playwright, as in tests/browser.py).

    python -m docs.screenshots        (from the repository root)
"""
from pathlib import Path

from tests.browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server, wait_idle

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
PAGES = [("home", ""), ("schedules", "schedules"), ("kv", "kv"), ("tiles", "tiles"),
         ("speculative", "speculative"), ("roofline", "roofline"),
         ("replay", "replay?tr=shared_prefix_caching_on.json.gz&rp_cmp=shared_prefix_caching_off.json.gz")]


def main():
    from playwright.sync_api import sync_playwright
    OUT.mkdir(parents=True, exist_ok=True)
    with streamlit_server() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        for name, path in PAGES:
            page.goto(f"{url}/{path}")
            wait_idle(page)
            if path:
                page.wait_for_selector(".js-plotly-plot .main-svg")
            page.wait_for_timeout(800)  # let plotly finish its transitions
            page.screenshot(path=str(OUT / f"{name}.png"))
            print("wrote", OUT / f"{name}.png")
        browser.close()


if __name__ == "__main__":
    main()
