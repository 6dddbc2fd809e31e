"""Regenerate the README screenshots with the project's own browser tooling
(Streamlit server + headless Chromium via Playwright, as in tests/helpers.py).

    python -m docs.screenshots        (from the repository root)
    python -m docs.screenshots replay_10000_requests     (only the shots named)

Besides one shot per page, two 10,000-request shots at a projector-size window (1280x800):
the Schedules page on the built-in "Poisson 10000" scenario (its preset in the link), and the
Trace replay page on a 10,000-request trace simulated here, into a temporary directory, with
`python -m core simulate` from the same workload. The Fleet page disaggregated (prefill
lanes, KV transfers, decode lanes). For the classroom: the four animations (the fourth: requests
flowing from the router to prefill and decode replicas)
paused mid-play (seats of static vs continuous batching on Burst 5, PagedAttention blocks
filling, the tile walk), every page in the dark theme, and one in presentation mode. And a real vLLM
from inside: its prefix cache over time beside the simulator's (KV page), and the merged vLLM
run on the replay page (its prefix cache, each request's phases, its logged steps).
"""
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers import CHROMIUM, CHROMIUM_ARGS, streamlit_server, wait_idle

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
PAGES = [("home", ""), ("schedules", "schedules"), ("kv", "kv"), ("tiles", "tiles"),
         ("speculative", "speculative"), ("roofline", "roofline"),
         ("replay", "replay?tr=shared_prefix_caching_on.json.gz&rp_cmp=shared_prefix_caching_off.json.gz"),
         ("load", "load"), ("pathologies", "pathologies"), ("fleet", "fleet")]

PROJECTOR = {"width": 1280, "height": 800}
# the "Poisson 10000" preset (core.lessons.scenarios.SCHEDULE_PRESETS); a link's parameters win over it
SCHEDULES_10K = ("schedules?sc=Poisson+10000&pol=continuous&pol=chunked&ms=256&tb=8192&ch=512"
                 "&s_kind=affine&s_base=5&s_pp=0.02&s_pd=0.05")
TRACE_10K = "poisson10000.parquet"
FLEET_VLLM = "fleet?fl_tab=Measured&fl_measured=vllm_fleet/fleet.json.gz"
VLLM_MERGED = "vLLM+0.32+(CPU)+run+2:+client+%2B+iteration+log+%2B+spans+%2B+KV+events,+merged"
SIMULATE_10K = ["--max-seqs", "256", "--token-budget", "8192", "--chunk", "8192", "--step-model", "affine",
                "--base-ms", "5", "--prefill-ms-per-token", "0.02", "--decode-ms-per-seq", "0.05"]


def settle(page, path: str, url: str):
    page.goto(f"{url}/{path}")
    wait_idle(page)
    if path:
        page.wait_for_selector(".js-plotly-plot .main-svg")
    page.wait_for_timeout(800)  # let plotly finish its transitions


def scroll_to(page, selector: str, below_px: int = 0):
    """Scroll the page's main area so `selector`'s first element starts `below_px` above the top."""
    page.locator(selector).first.evaluate(
        "(e, dy) => { e.scrollIntoView({block: 'start'}); "
        "let s = e.parentElement; "
        "while (s && !/auto|scroll/.test(getComputedStyle(s).overflowY)) s = s.parentElement; "
        "if (s) s.scrollTop += dy; }", below_px)
    page.wait_for_timeout(500)


def write_trace_10k(directory: Path) -> Path:
    """The Poisson 10000 workload as a Vidur-style CSV, simulated to a trace by the CLI."""
    from core.lessons.scenarios import load_scenario
    workload = directory / "poisson10000.csv"
    with open(workload, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        for r in load_scenario("poisson10000").requests:
            wr.writerow([repr(r.arrival_ms / 1000.0), r.prompt_tokens, r.max_output_tokens])
    trace = directory / "traces" / TRACE_10K
    trace.parent.mkdir()
    subprocess.run([sys.executable, "-m", "core", "simulate", str(workload), *SIMULATE_10K, "--out", str(trace)],
                   cwd=ROOT, check=True)
    return trace


# (name, page, play button, seconds of play) — each animation paused part-way, the chart alone
ANIMATIONS = [("anim_slots", "schedules?sc=Burst+5&pol=static&pol=continuous&ms=3&s_kind=constant&s_step=1",
               "▶ 4×", 1.6),
              ("anim_paging", "kv", "▶ 4×", 6.0),
              ("anim_tiles", "tiles", "▶ 1×", 1.2),
              ("anim_fleet", "fleet?fl_tab=Animation&fl_dis=true&fl_p=1&fl_d=3&fl_min=300&fl_wl=Shared+prefix+200",
               "▶ 1×", 4.0)]
# disaggregated prefill/decode on the Fleet page: prefill lanes, KV transfers, decode lanes (1280x800)
FLEET_PD = "fleet?fl_dis=true&fl_p=1&fl_d=3&fl_min=300&fl_load=1"
# every page in the dark theme too (1280x800, at its first chart); schedules on Burst 5's seats
DARK = [(f"{name}_dark", "schedules?sc=Burst+5&pol=static&pol=continuous&ms=3&s_kind=constant&s_step=1"
         if name == "schedules" else path) for name, path in PAGES]
PRESENTING = [("tiles_presentation", "tiles?present=True")]


def play_and_pause(page, button: str, seconds: float):
    chart = page.locator("[data-testid='stPlotlyChart']").filter(has=page.locator(".slider-container")).first
    chart.scroll_into_view_if_needed()
    chart.get_by_text(button).click()
    page.wait_for_timeout(int(seconds * 1000))
    chart.get_by_text("❚❚ pause").click()
    page.mouse.move(2, 2)             # no hover toolbar over the chart
    page.wait_for_timeout(700)
    return chart


def shoot(page, name: str):
    page.screenshot(path=str(OUT / f"{name}.png"))
    print("wrote", OUT / f"{name}.png")


def main(only: set[str] = frozenset()):
    """Every screenshot, or only the names in `only` (file names without .png)."""
    from playwright.sync_api import sync_playwright
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = (lambda name: not only or name in only)
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace_10k(Path(tmp)) if wanted("replay_10000_requests") else Path(tmp) / "traces" / TRACE_10K
        with streamlit_server({"SERVING_EXPLORER_TRACES": str(trace.parent)}) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.set_default_timeout(60_000)
            for name, path in PAGES:
                if wanted(name):
                    settle(page, path, url)
                    shoot(page, name)
            page.close()

            page = browser.new_page(viewport=PROJECTOR)
            page.set_default_timeout(120_000)
            if wanted("schedules_10000_requests"):
                settle(page, SCHEDULES_10K, url)
                scroll_to(page, ".js-plotly-plot")          # the aggregated timeline heatmap
                shoot(page, "schedules_10000_requests")
            if wanted("vllm_prefix_cache"):
                # a real vLLM's prefix cache over time (its KV events) beside the simulator's, KV page
                settle(page, "kv", url)
                page.get_by_text("A real engine's prefix cache").first.wait_for()
                scroll_to(page, "h2:has-text(\"A real engine's prefix cache\")", below_px=-20)
                shoot(page, "vllm_prefix_cache")
            if wanted("kv_tiers"):
                # the CPU tier under the prefix cache (KV page): the lesson's runs, occupancy by tier, copies
                settle(page, "kv", url)
                page.get_by_text("A CPU tier under the prefix cache").first.wait_for()
                scroll_to(page, "h2:has-text(\"A CPU tier under the prefix cache\")", below_px=-20)
                shoot(page, "kv_tiers")
            if wanted("kv_tier_animation"):
                settle(page, "kv", url)
                page.get_by_text("Blocks leaving for the CPU tier and coming back on a hit").first.click()
                chart = page.locator("[data-testid='stPlotlyChart']").filter(
                    has=page.locator(".slider-container")).filter(has_text="copy ").first
                chart.scroll_into_view_if_needed()
                chart.get_by_text("▶ 2×").click()
                page.wait_for_timeout(2500)
                chart.get_by_text("❚❚ pause").click()
                page.mouse.move(2, 2)
                chart.screenshot(path=str(OUT / "kv_tier_animation.png"))
            if wanted("replay_vllm_inside"):
                settle(page, "replay?tr=" + VLLM_MERGED, url)
                scroll_to(page, "text=The engine's prefix cache", below_px=-80)
                shoot(page, "replay_vllm_inside")
            if wanted("replay_10000_requests"):
                # the cursor starts mid-run; its value, the timeline, batch and KV charts in one screen
                settle(page, f"replay?tr={TRACE_10K}", url)
                scroll_to(page, "[data-testid='stSlider']", below_px=-60)
                shoot(page, "replay_10000_requests")
            if wanted("fleet_vllm_measured"):
                # a real vLLM fleet (two vLLM CPU servers behind sglang-router) from its servers' own files
                settle(page, FLEET_VLLM, url)
                scroll_to(page, "text=Fleets that really ran", below_px=760)   # its lanes' end, each replica
                shoot(page, "fleet_vllm_measured")
            if wanted("fleet_pd"):
                settle(page, FLEET_PD, url)
                scroll_to(page, "h3:has-text(\"Where each request went\")", below_px=-20)
                shoot(page, "fleet_pd")
            for name, path, button, seconds in ANIMATIONS:
                if wanted(name):
                    settle(page, path, url)
                    play_and_pause(page, button, seconds).screenshot(path=str(OUT / f"{name}.png"))
                    print("wrote", OUT / f"{name}.png")
            for name, path in PRESENTING:
                if wanted(name):
                    settle(page, path, url)
                    shoot(page, name)
            page.close()
            dark = browser.new_context(viewport=PROJECTOR, color_scheme="dark").new_page()
            dark.set_default_timeout(60_000)
            for name, path in DARK:
                if wanted(name):
                    settle(dark, path, url)
                    if name != "home_dark":           # home has no chart: its top
                        scroll_to(dark, ".js-plotly-plot", below_px=-60)
                    shoot(dark, name)
            browser.close()


if __name__ == "__main__":
    main(set(sys.argv[1:]))
