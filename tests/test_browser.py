"""The app in a real browser: headless Chromium against `streamlit run app.py`."""
import re
from pathlib import Path

import pytest

from tests.helpers import SHOTS, streamlit_server, wait_idle

pytestmark = pytest.mark.browser

PAGES = [("", "home", "Serving Explorer"), ("schedules", "schedules", "Schedules"),
         ("kv", "kv", "KV memory & paging"), ("tiles", "tiles", "Attention tiles"),
         ("speculative", "speculative", "Speculative decoding"), ("roofline", "roofline", "Roofline"),
         ("replay?tr=shared_prefix_caching_on.json.gz", "replay", "Trace replay"),
         ("load", "load", "Load & SLOs"), ("pathologies", "pathologies", "Serving pathologies"),
         ("calibration", "calibration", "Prediction vs measurement")]


def test_home_renders_without_exception(server, page):
    from playwright.sync_api import expect
    page.goto(server)
    wait_idle(page)
    expect(page.get_by_text("16.667 tok/s")).to_be_visible()
    expect(page.get_by_text("30.000 tok/s")).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0


@pytest.mark.parametrize("path,shot,title", PAGES[1:], ids=[p[1] for p in PAGES[1:]])
def test_every_page_draws_a_chart(server, page, path, shot, title):
    from playwright.sync_api import expect
    page.goto(f"{server}/{path}")
    wait_idle(page)
    expect(page.get_by_role("heading", name=title).first).to_be_visible()
    expect(page.locator(".js-plotly-plot").first).to_be_visible()
    page.wait_for_selector(".js-plotly-plot .main-svg")
    assert page.locator("[data-testid='stException']").count() == 0
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)


def test_load_page_shows_capacity_and_the_exercise_6_verdict(server, page):
    from playwright.sync_api import expect
    page.goto(f"{server}/load?ld_kind=closed&ld_loads=1,4,16")
    wait_idle(page)
    expect(page.get_by_text("capacity", exact=False).first).to_be_visible()
    expect(page.get_by_text("has not improved", exact=False)).to_be_visible()
    # the closed-loop captures of vLLM and the runner are drawn on the same axes
    expect(page.locator(".js-plotly-plot .legendtext", has_text="measured: vllm_cpu_tiny_loadgen.json.gz")
           .first).to_be_attached()
    assert page.locator("[data-testid='stException']").count() == 0


def test_query_parameters_restore_a_scenario(server, page):
    from playwright.sync_api import expect
    page.goto(f"{server}/schedules?sc=Burst+5&pol=static&pol=continuous&ms=3&s_kind=constant&s_step=1")
    wait_idle(page)
    expect(page.get_by_text("Burst of five, outputs [5, 20, 10, 15, 10]").first).to_be_visible()
    # Static vs continuous with 3 slots: 35 vs 20 unit steps, restored purely from the link.
    expect(page.get_by_text("Forward steps taken: simulated static 35, simulated continuous 20.")).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=str(SHOTS / "schedules_burst5_link.png"), full_page=True)


def test_upload_a_trace_and_move_the_cursor(server, page):
    from playwright.sync_api import expect

    from tests.conftest import DATA
    page.goto(f"{server}/replay?tr=Upload+a+file%E2%80%A6")
    wait_idle(page)
    page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(
        str(DATA / "traces" / "shared_prefix_caching_on.json.gz"))
    expect(page.get_by_text("shared prefix, prefix caching on (simulated)").first).to_be_visible(timeout=60_000)
    wait_idle(page)
    step_title = re.compile(r"^Step \d+ at")
    title = page.locator(".gtitle", has_text=step_title).first
    expect(title).to_be_visible()
    before = title.text_content()
    thumb = page.get_by_role("slider").first
    thumb.focus()
    for _ in range(40):
        page.keyboard.press("ArrowLeft")
    wait_idle(page)
    expect(page.locator(".gtitle", has_text=step_title).first).not_to_have_text(before, timeout=30_000)
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=str(SHOTS / "replay_upload.png"), full_page=True)


def test_an_overlong_link_parameter_is_dropped_and_navigation_still_works(server, page):
    """Issue 10 item 15: a parameter over 4,096 characters is dropped with a notice and the rest of
    the link applies. Left in the address bar, a long link is sent twice on the next navigation
    (request line and Referer) and used to fail there; after the drop the address is short, so
    reloading and navigating work."""
    from playwright.sync_api import expect
    url = f"{server}/schedules?sc={'x' * 20_000}&ms=3"
    for _ in range(2):   # the second navigation is the one that used to fail
        page.goto(url)
        wait_idle(page)
        expect(page.get_by_text("20,000 characters, at most 4,096").first).to_be_visible(timeout=60_000)
        expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
        assert page.locator("[data-testid='stException']").count() == 0
        assert len(page.url) < 1000 and "ms=3" in page.url    # the rest of the link is kept
    page.goto(f"{server}/kv")
    wait_idle(page)
    expect(page.get_by_role("heading", name="KV memory & paging").first).to_be_visible(timeout=60_000)


def test_a_link_beyond_the_http_limit_is_refused_at_once(server):
    """A 200,000-character link never reaches the app: the HTTP parser (httptools, pinned)
    answers 400 at once instead of leaving the page loading."""
    import http.client
    host, port = server.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)   # a hang fails here
    conn.request("GET", f"/schedules?sc={'x' * 200_000}")
    resp = conn.getresponse()
    assert resp.status == 400 and b"Invalid HTTP request" in resp.read()
    conn.close()


def test_live_replay_advances_without_a_click(tmp_path, page):
    """Issue 11 part 3: with Live on, a trace file rewritten on disk (as `serve --trace-out` and
    `loadgen --out` do) shows up in the page by itself within a few seconds."""
    from playwright.sync_api import expect

    from tests.helpers import growing
    path = tmp_path / "growing.json"
    growing(path, 1)
    with streamlit_server({"SERVING_EXPLORER_TRACES": str(tmp_path)}) as url:
        page.goto(f"{url}/replay?tr=growing.json")
        wait_idle(page)
        page.get_by_text("Live: follow the file").click()
        so_far = page.locator("[data-testid='stMetric']", has_text="requests so far")
        expect(so_far).to_contain_text("1", timeout=60_000)
        growing(path, 3)
        expect(so_far).to_contain_text("3", timeout=30_000)      # no click: the live fragment re-read it
        assert page.locator("[data-testid='stException']").count() == 0


def test_replay_cursor_timeline_batch_and_kv_fit_one_projector_screen(server, page):
    """At 1280x800 the time cursor, the timeline and the batch and KV views below it fit in one
    screen (issue 12): scrolled so the cursor is at the top, the KV chart ends inside the window."""
    from playwright.sync_api import expect
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        page.goto(f"{server}/replay?tr=shared_prefix_caching_on.json.gz")
        wait_idle(page)
        kv = page.locator(".gtitle", has_text="KV block occupancy over time").first
        expect(kv).to_be_visible(timeout=60_000)
        # the cursor's label at the window's top (Streamlit scrolls its main block, not the window)
        page.get_by_text("Time cursor (ms)").first.evaluate("e => e.scrollIntoView({block: 'start'})")
        wait_idle(page)
        cursor_top = page.get_by_text("Time cursor (ms)").first.bounding_box()["y"]
        charts = page.locator("[data-testid='stPlotlyChart']")
        bottoms = [charts.nth(i).bounding_box() for i in range(charts.count())]
        kv_box = next(b for i, b in enumerate(bottoms)
                      if charts.nth(i).locator(".gtitle", has_text="KV block occupancy").count())
        # (scrollIntoView may leave the top a fraction of a pixel above 0)
        assert cursor_top >= -1 and kv_box["y"] + kv_box["height"] <= 800, (cursor_top, kv_box)
        page.screenshot(path=str(SHOTS / "replay_1280x800.png"))
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})


def test_titles_start_near_the_top_at_projector_size(server, page):
    # issue 14: ~120 px of empty header above every title at 1280x800
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{server}/load")
    wait_idle(page)
    top = page.get_by_role("heading", name="Load & SLOs").first.bounding_box()["y"]
    assert top < 80, top


def test_replay_step_buttons_move_the_cursor(server, page):
    from playwright.sync_api import expect
    page.goto(f"{server}/replay?tr=shared_prefix_caching_on.json.gz")
    wait_idle(page)
    value = page.locator("[data-testid='stSliderThumbValue']").first   # the time cursor, as shown
    before = value.inner_text()
    page.get_by_role("button", name="step ▶").click()
    wait_idle(page)
    expect(value).not_to_have_text(before)
    after = value.inner_text()
    assert float(after.replace(",", "")) > float(before.replace(",", ""))   # the next scheduler step
    # the slider and the batch view show the same step (issue 28: the view moved, the slider did not);
    # the chart is redrawn a moment after the slider's label changes: wait for it (up to 15 s)
    def batch_at():
        title = next(x for x in page.locator(".gtitle").all_text_contents() if x.startswith("Step "))
        return title, float(title.split(" at ")[1].split(" ms")[0].replace(",", ""))
    for _ in range(60):
        title, shown_at = batch_at()
        if abs(shown_at - float(after.replace(",", ""))) < 1e-3:
            break
        page.wait_for_timeout(250)
    assert abs(shown_at - float(after.replace(",", ""))) < 1e-3, (title, after)
    page.get_by_role("button", name="◀ step").click()
    wait_idle(page)
    expect(value).not_to_have_text(after)


def test_link_to_this_view_restores_it(server, page):
    page.goto(f"{server}/schedules?sc=Burst+5&ms=3&s_kind=constant&s_step=1")
    wait_idle(page)
    page.get_by_text("Link to this view").click()
    link = page.locator("[data-testid='stCode']").last.inner_text().strip()
    assert link.startswith(server) and "/schedules?" in link and "sc=Burst+5" in link and "s_step=1" in link
    page.goto(link)                       # a fresh load of the shared link shows the same view
    wait_idle(page)
    from playwright.sync_api import expect
    expect(page.get_by_text("simulated static").first).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0


def test_an_upload_can_be_described_and_downloaded(server, page):
    import gzip
    import json

    from playwright.sync_api import expect

    from tests.conftest import DATA
    page.goto(f"{server}/replay?tr=Upload+a+file%E2%80%A6")
    wait_idle(page)
    page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(
        str(DATA / "traces" / "vllm_cpu_tiny_loadgen.json.gz"))
    expect(page.get_by_text("Run details for this upload").first).to_be_visible(timeout=60_000)
    page.get_by_text("Run details for this upload").first.click()
    box = page.locator("input[aria-label='Engine and version']")
    box.fill("vLLM 0.32.0 CPU, 1 thread")
    box.press("Enter")
    # Wait for the state the download depends on: the page says the details are in it (the rerun
    # that Enter starts has replaced the button by then), then one click.
    expect(page.get_by_text("engine “vLLM 0.32.0 CPU, 1 thread”")).to_be_visible(
        timeout=60_000)
    wait_idle(page)
    with page.expect_download(timeout=60_000) as got:
        page.get_by_role("button", name="Trace with these details (JSON, gzip)").click()
    doc = json.loads(gzip.decompress(Path(got.value.path()).read_bytes()))
    assert doc["meta"]["engine"]["described_by_user"] == "vLLM 0.32.0 CPU, 1 thread"
    assert page.locator("[data-testid='stException']").count() == 0


def test_the_seat_animation_plays_in_the_browser_without_a_rerun(server, page):
    """Play advances the slot grid's frames client-side: the slider's current step moves while
    the browser sends nothing to the server (a rerun starts with a message on the websocket)."""
    sent = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(payload)))
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{server}/schedules?sc=Burst+5&ms=3&s_kind=constant&s_step=1")
    wait_idle(page)
    chart = page.locator("[data-testid='stPlotlyChart']").filter(has=page.locator(".slider-container")).first
    chart.scroll_into_view_if_needed()
    current = chart.locator("text.slider-label", has_text="step ")     # the slider's current value
    assert current.text_content().strip() == "step 0"
    before = len(sent)
    chart.get_by_text("▶ 4×").click()
    page.wait_for_timeout(1500)
    moved = current.text_content().strip()
    chart.get_by_text("❚❚ pause").click()
    assert int(moved.split()[-1]) >= 5, moved      # 20 frames/s at 4x: well past step 5 after 1.5 s
    assert len(sent) == before                     # no rerun
    page.screenshot(path=str(SHOTS / "slots_animation.png"))
    assert page.locator("[data-testid='stException']").count() == 0


def test_the_paging_animation_plays_on_the_kv_page(server, page):
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{server}/kv")
    wait_idle(page)
    chart = page.locator("[data-testid='stPlotlyChart']").filter(has=page.locator(".slider-container")).first
    chart.scroll_into_view_if_needed()
    current = chart.locator("text.slider-label", has_text="frame ")
    assert current.text_content().strip() == "frame 0"
    chart.get_by_text("▶ 4×").click()
    page.wait_for_timeout(1500)
    chart.get_by_text("❚❚ pause").click()
    assert int(current.text_content().split()[-1]) >= 5
    chart.screenshot(path=str(SHOTS / "paging_animation.png"))


def test_the_cpu_tier_lesson_and_its_animation_on_the_kv_page(server, page):
    """Issue 54: the KV page's CPU tier section (occupancy by tier, the lesson's numbers) and the animation
    of blocks leaving for the CPU tier and coming back on a hit, played in Chromium."""
    from playwright.sync_api import expect
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{server}/kv")
    wait_idle(page)
    head = page.get_by_role("heading", name="A CPU tier under the prefix cache")
    head.scroll_into_view_if_needed()
    expect(page.get_by_text("When does offloading pay?")).to_be_visible()
    expect(page.get_by_text("loading pays above")).to_be_visible()
    occ = page.locator("[data-testid='stPlotlyChart']").filter(has_text="KV blocks by tier over time").first
    occ.scroll_into_view_if_needed()
    expect(occ.locator(".main-svg").first).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0
    page.get_by_text("Blocks leaving for the CPU tier and coming back on a hit").click()
    chart = page.locator("[data-testid='stPlotlyChart']").filter(has=page.locator(".slider-container")) \
        .filter(has_text="copy ").first
    chart.scroll_into_view_if_needed()
    current = chart.locator("text.slider-label", has_text="copy ")
    assert current.text_content().strip() == "copy 0"
    chart.get_by_text("▶ 2×").click()
    page.wait_for_timeout(2500)
    chart.get_by_text("❚❚ pause").click()
    assert int(current.text_content().split()[-1]) >= 3
    chart.screenshot(path=str(SHOTS / "kv_tier_animation.png"))
    page.set_viewport_size({"width": 1280, "height": 1400})
    head.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "kv_tiers.png"))


def export(page, fmt: str, download: str, tries: int = 3):
    """Ask for an export until its download button shows (under load a click can land while the
    page is still settling; asking again builds the same zip)."""
    from playwright.sync_api import expect
    for k in range(tries):
        page.get_by_role("button", name=fmt, exact=True).click()
        wait_idle(page)
        try:
            expect(page.get_by_role("button", name=download)).to_be_visible(timeout=30_000)
            return
        except AssertionError:
            if k == tries - 1:
                raise


def test_a_view_exports_its_tables_and_figures_for_slides(server, page):
    import zipfile
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{server}/schedules?sc=Burst+5&ms=3&s_kind=constant&s_step=1")
    wait_idle(page)
    page.get_by_text("Slides and handouts").click()
    export(page, "CSV", "Download tables as CSV")
    with page.expect_download() as d:
        page.get_by_role("button", name="Download tables as CSV").click()
    assert "sched_summary.csv" in zipfile.ZipFile(d.value.path()).namelist()
    export(page, "SVG", "Download figures as SVG")
    with page.expect_download() as d:
        page.get_by_role("button", name="Download figures as SVG").click()
    names = zipfile.ZipFile(d.value.path()).namelist()
    assert "sched_timeline.svg" in names and "sched_slots.svg" in names
    assert page.locator("[data-testid='stException']").count() == 0


def test_presentation_links_open_with_large_figure_fonts_and_the_sidebar_collapsed(server, page):
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{server}/tiles?present=True")
    wait_idle(page)
    box = page.locator("[data-testid='stSidebar']").bounding_box()
    assert box is None or box["x"] + box["width"] <= 1 or box["width"] <= 1     # collapsed: off screen
    chart = page.locator("[data-testid='stPlotlyChart']").first
    chart.scroll_into_view_if_needed()
    sizes = chart.locator("g.xtick text").evaluate_all(
        "els => els.map(e => parseFloat(getComputedStyle(e).fontSize))")
    assert sizes and min(sizes) >= 16
    page.screenshot(path=str(SHOTS / "presentation_tiles.png"))


def test_every_page_renders_in_the_dark_theme(server, page):
    """The browser asks for dark: each page draws its first chart with no exception."""
    context = page.context.browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="dark")
    try:
        dark = context.new_page()
        dark.set_default_timeout(60_000)
        for path, _, _ in PAGES[1:]:
            dark.goto(f"{server}/{path}")
            wait_idle(dark)
            dark.wait_for_selector(".js-plotly-plot .main-svg")
            assert dark.locator("[data-testid='stException']").count() == 0, path
            bg = dark.locator("[data-testid='stApp']").evaluate("e => getComputedStyle(e).backgroundColor")
            rgb = [int(x) for x in re.findall(r"\d+", bg)[:3]]
            assert sum(rgb) < 150, (path, bg)                  # a dark background
    finally:
        context.close()


def test_the_link_follows_a_slider_inside_an_experiment_tab(server, page):
    """Issue 48 item 3: a widget inside a fragment (the P:D experiment's TTFT SLO) reruns only the
    fragment; the sidebar's link stayed at the last full run's value (fl_ttft=200 after 60 was set),
    so the shared link reopened another goodput. The fragment's rerun now redraws the link."""
    from urllib.parse import parse_qs, urlsplit

    from playwright.sync_api import expect
    page.goto(f"{server}/fleet?fl_tab=Experiment%3A+the+P%3AD+split&fl_n=2")
    wait_idle(page)
    expect(page.get_by_text("SLO: TTFT ≤ ms").first).to_be_visible()
    slider = page.get_by_role("slider", name="SLO: TTFT ≤ ms")
    slider.focus()
    for _ in range(14):                 # 200 -> 60 ms in steps of 10
        page.keyboard.press("ArrowLeft")
    wait_idle(page)
    expect(slider).to_have_attribute("aria-valuetext", "60")
    wait_idle(page)
    page.get_by_text("Link to this view").click()
    link = page.locator("[data-testid='stCode']").last.inner_text().strip()
    query = parse_qs(urlsplit(link).query)
    assert query.get("fl_ttft") == ["60"], link
    assert query.get("fl_n") == ["2"], link            # a widget outside the fragment keeps its value
    assert page.locator("[data-testid='stException']").count() == 0


def test_every_fleet_tab_is_in_sight_at_1024_px(server, browser):
    """Issue 48 item 15: at 1024x768 the Fleet page's last tabs hid behind a scroll arrow."""
    from playwright.sync_api import expect
    page = browser.new_page(viewport={"width": 1024, "height": 768})
    try:
        page.set_default_timeout(60_000)
        page.goto(f"{server}/fleet?fl_n=2&fl_load=1")
        wait_idle(page)
        tabs = page.get_by_role("tab")
        expect(tabs.first).to_be_visible()
        right = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').getBoundingClientRect().right")
        names = tabs.all_inner_texts()
        assert [n.strip() for n in names] == ["Policies", "Stale router", "P:D split", "Animation", "Lesson",
                                              "Tiers", "Measured"]
        for k in range(tabs.count()):
            box = tabs.nth(k).bounding_box()
            assert box is not None and box["x"] + box["width"] <= right, names[k]
    finally:
        page.close()
