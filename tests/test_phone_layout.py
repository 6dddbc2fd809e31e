"""Every page's layout at a phone's viewport (390x844) and a projector's (1280x800), in the light
and dark themes, in headless Chromium: nothing wider than the screen, no figure legend over a
figure or subplot title, no text cut short (metric values and labels, page links, badges: any
element that clips its text with an ellipsis), every table's columns within the page at 1280 px,
and table cells and metrics at WCAG AA contrast (4.5:1) against what is behind them."""
import pytest

from tests.helpers import SHOTS, wait_idle

pytestmark = pytest.mark.browser

PAGES = [("", "home"), ("schedules", "schedules"), ("kv", "kv"), ("tiles", "tiles"),
         ("speculative", "speculative"), ("roofline", "roofline"), ("load", "load"),
         ("pathologies", "pathologies"), ("exercises", "exercises"),
         ("replay?tr=shared_prefix_caching_on.json.gz", "replay"), ("fleet", "fleet"),
         ("calibration", "calibration")]
PHONE = {"width": 390, "height": 844}
PROJECTOR = {"width": 1280, "height": 800}

# Elements of the main block that stick out of the viewport, unless an ancestor inside the
# viewport clips or scrolls them (a wide table scrolling inside its frame is fine; an SVG clips
# its own text), and unless they are invisible (toolbars that appear on hover).
OVERFLOW_JS = r"""
(vw) => {
  const main = document.querySelector("[data-testid='stMain']") || document.body;
  const block = document.querySelector("[data-testid='stMainBlockContainer']") || main;
  const contained = (el) => {
    for (let a = el.parentElement; a && a !== main; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.opacity === "0" || s.visibility === "hidden") return true;
      if (s.overflowX !== "visible") {
        const r = a.getBoundingClientRect();
        if (r.left >= -1 && r.right <= vw + 1) return true;
      }
    }
    return false;
  };
  const name = (el) => {
    const id = el.getAttribute("data-testid");
    const cls = typeof el.className === "string" ? el.className.split(" ")[0] : "";
    return el.tagName.toLowerCase() + (id ? `[data-testid=${id}]` : "") + (cls ? "." + cls : "");
  };
  const wide = [];
  for (const el of block.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.left < -1 || r.right > vw + 1) {
      const s = getComputedStyle(el);
      if (s.opacity === "0" || s.visibility === "hidden" || contained(el)) continue;
      const path = [];
      for (let a = el; a && a !== block && path.length < 5; a = a.parentElement) path.push(name(a));
      wide.push(`${path.join(" < ")}: x ${Math.round(r.left)}..${Math.round(r.right)} ` +
                `"${(el.textContent || "").trim().slice(0, 50)}"`);
    }
  }
  return {scrollWidth: document.documentElement.scrollWidth, mainScroll: main.scrollWidth - main.clientWidth,
          wide: wide.slice(0, 10)};
}
"""

# Per visible Plotly chart: every legend box against the figure title and every annotation
# (subplot titles are annotations), as [chart title, legend item texts, overlapped text]; subplot
# titles against tick labels; an animation's play buttons against its slider.
LEGEND_JS = r"""
() => {
  const visible = (root, sel) => [...root.querySelectorAll(sel)]
    .map(e => [e, e.getBoundingClientRect()]).filter(([e, r]) => r.width > 0 && r.height > 0);
  const meet = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
                         a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const hits = [];
  let charts = 0;
  for (const chart of document.querySelectorAll("[data-testid='stPlotlyChart']")) {
    if (chart.getBoundingClientRect().width === 0) continue;
    charts++;
    const title = (chart.querySelector(".gtitle") || {}).textContent || "";
    const texts = visible(chart, ".gtitle").concat(visible(chart, ".annotation-text"));
    for (const [legend, lr] of visible(chart, "g.legend"))
      for (const [e, r] of texts)
        if (meet(lr, r)) hits.push([title, [...legend.querySelectorAll(".legendtext")].map(t => t.textContent)
                                              .slice(0, 4).join(", "), e.textContent]);
    // a subplot title on the tick labels of the panel above it
    for (const [a, ar] of visible(chart, ".annotation-text"))
      for (const [t, tr] of visible(chart, ".xtick text, .ytick text"))
        if (meet(ar, tr)) hits.push([title, "subplot title over tick labels", a.textContent + " / " + t.textContent]);
    // two axis titles on each other (a short subplot's y title reaching into the one above)
    const axisTitles = visible(chart, ".g-ytitle text, [class*='g-y'][class$='title'] text");
    for (let i = 0; i < axisTitles.length; i++)
      for (let j = i + 1; j < axisTitles.length; j++)
        if (axisTitles[i][0] !== axisTitles[j][0] && meet(axisTitles[i][1], axisTitles[j][1]))
          hits.push([title, "axis titles overlap",
                     axisTitles[i][0].textContent + " / " + axisTitles[j][0].textContent]);
    // an animation's play buttons on its slider
    for (const [b, br] of visible(chart, ".updatemenu-button"))
      for (const [sl, sr] of visible(chart, ".slider-rail-rect, .slider-grip-rect, .slider-label"))
        if (meet(br, sr)) hits.push([title, "play controls over the slider", b.textContent]);
  }
  return {charts, hits};
}
"""


# Text an element clips (text-overflow: ellipsis, or nowrap with hidden overflow) that does not fit
# its box; and data frames (canvas grids) whose columns scroll beyond their frame.
FIT_JS = r"""
() => {
  const block = document.querySelector("[data-testid='stMainBlockContainer']") || document.body;
  const cut = [];
  for (const el of block.querySelectorAll('*')) {
    if (!el.textContent.trim() || el.children.length > 3) continue;
    const s = getComputedStyle(el);
    if (s.display === 'none' || s.visibility === 'hidden' || el.getBoundingClientRect().width === 0) continue;
    const clips = s.textOverflow === 'ellipsis' || (s.overflowX === 'hidden' && s.whiteSpace === 'nowrap');
    if (clips && el.scrollWidth > el.clientWidth + 1) {
      const id = el.closest('[data-testid]');
      cut.push(`${id ? id.getAttribute('data-testid') : el.tagName}: "${el.textContent.trim().slice(0, 60)}" ` +
               `${el.scrollWidth} > ${el.clientWidth} px`);
    }
  }
  const grids = [...block.querySelectorAll("[data-testid='stDataFrame']")].map(df => {
    const sc = df.querySelector('.dvn-scroller');
    return sc && sc.getBoundingClientRect().width > 0 && sc.scrollWidth > sc.clientWidth + 1
      ? `a table ${sc.scrollWidth} px wide in a ${sc.clientWidth} px frame` : null; }).filter(Boolean);
  return {cut: [...new Set(cut)], grids};
}
"""

# Table cells and metrics whose text contrast against the composited background is under 4.5:1
CONTRAST_JS = r"""
() => {
  const block = document.querySelector("[data-testid='stMainBlockContainer']") || document.body;
  const parse = c => { const m = c.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const app = parse(getComputedStyle(document.querySelector("[data-testid='stApp']")).backgroundColor);
  const behind = el => { const layers = [];
    for (let a = el; a; a = a.parentElement) { const c = parse(getComputedStyle(a).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; } }
    let base = app.slice(0, 3);
    for (const c of layers.reverse()) base = base.map((v, i) => v * (1 - c[3]) + c[i] * c[3]);
    return base; };
  const lum = rgb => { const f = v => { v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(rgb[0]) + 0.7152 * f(rgb[1]) + 0.0722 * f(rgb[2]); };
  const low = []; let n = 0;
  for (const el of block.querySelectorAll("td, th, [data-testid='stMetricValue'], [data-testid='stMetricLabel']")) {
    if (!el.textContent.trim()) continue;
    const s = getComputedStyle(el); if (s.display === 'none' || s.visibility === 'hidden') continue;
    n++;
    const fg = parse(s.color), bg = behind(el), t = bg.map((v, i) => v * (1 - fg[3]) + fg[i] * fg[3]);
    const a = lum(t), b = lum(bg), ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5)
      low.push(`${el.tagName.toLowerCase()} "${el.textContent.trim().slice(0, 30)}" ${ratio.toFixed(2)}:1`);
  }
  return {checked: n, low};
}
"""


def check_text(page, viewport: dict, tables_fit: bool):
    fit = page.evaluate(FIT_JS)
    assert not fit["cut"], (viewport, fit["cut"])
    if tables_fit:
        assert not fit["grids"], (viewport, fit["grids"])
    contrast = page.evaluate(CONTRAST_JS)
    assert not contrast["low"], (viewport, contrast["low"])
    return contrast["checked"]


def open_at(page, url: str, viewport: dict):
    page.set_viewport_size(viewport)
    page.goto(url)
    wait_idle(page)
    assert page.locator("[data-testid='stException']").count() == 0
    # every chart drawn, and its automargin redraws (title, legend) settled
    page.wait_for_function("""() => [...document.querySelectorAll("[data-testid='stPlotlyChart']")]
                                     .every(c => c.querySelector('.main-svg'))""", timeout=30_000)
    last = None
    for _ in range(20):
        now = page.evaluate(LEGEND_JS)
        if now == last:
            return now
        last = now
        page.wait_for_timeout(250)
    return last


def full_page_shot(page, path, viewport: dict):
    """Streamlit scrolls its main block, not the document: a window as tall as the page."""
    height = page.evaluate("() => (document.querySelector(\"[data-testid='stMain']\") || document.body).scrollHeight")
    page.set_viewport_size({"width": viewport["width"], "height": max(viewport["height"], height)})
    page.wait_for_timeout(500)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(viewport)


@pytest.mark.parametrize("path,name", PAGES, ids=[n for _, n in PAGES])
def test_phone_nothing_wider_than_the_screen_and_legends_clear_of_titles(server, page, path, name):
    legends = open_at(page, f"{server}/{path}", PHONE)
    fit = page.evaluate(OVERFLOW_JS, PHONE["width"])
    full_page_shot(page, SHOTS / f"phone_{name}.png", PHONE)
    assert fit["scrollWidth"] <= PHONE["width"] + 1, fit
    assert fit["mainScroll"] <= 1, fit
    assert not fit["wide"], fit["wide"]
    assert not legends["hits"], legends["hits"]
    check_text(page, PHONE, tables_fit=False)       # a phone scrolls a wide table within its frame


@pytest.mark.parametrize("path,name", PAGES, ids=[n for _, n in PAGES])
def test_projector_legends_clear_of_titles_text_whole_tables_within_the_page(server, page, path, name):
    legends = open_at(page, f"{server}/{path}", PROJECTOR)
    assert not legends["hits"], legends["hits"]
    check_text(page, PROJECTOR, tables_fit=True)


@pytest.fixture(scope="module")
def dark_page(page):
    context = page.context.browser.new_context(viewport=PROJECTOR, color_scheme="dark")
    dark = context.new_page()
    dark.set_default_timeout(60_000)
    yield dark
    context.close()


@pytest.mark.parametrize("path,name", PAGES, ids=[n for _, n in PAGES])
def test_dark_theme_at_both_sizes_text_whole_and_readable(server, dark_page, path, name):
    for viewport, tables_fit in ((PROJECTOR, True), (PHONE, False)):
        legends = open_at(dark_page, f"{server}/{path}", viewport)
        assert not legends["hits"], (viewport, legends["hits"])
        check_text(dark_page, viewport, tables_fit)


def test_the_checks_see_what_they_forbid(page):
    """The rules fail on the defects they are for: a metric value cut with an ellipsis, a table
    wider than its frame is only simulated here (a canvas grid needs Streamlit), and text of 1.05:1
    contrast (the tile-walk table's colours before issue 28)."""
    page.set_viewport_size(PROJECTOR)
    page.set_content("""<div data-testid="stApp" style="background: rgb(14,17,23)">
      <div data-testid="stMainBlockContainer">
        <div data-testid="stMetricValue" style="color: rgb(250,250,250); width:80px; overflow:hidden;
             white-space:nowrap; text-overflow:ellipsis">1,136.587 / 2,268 of 25,492</div>
        <table><tr><td style="color: rgb(230,234,241); background: rgb(235,240,248)">1.386294</td></tr></table>
      </div></div>""")
    fit = page.evaluate(FIT_JS)
    assert fit["cut"] and "1,136.587" in fit["cut"][0]
    contrast = page.evaluate(CONTRAST_JS)
    assert contrast["checked"] == 2 and len(contrast["low"]) == 1 and "1.05:1" in contrast["low"][0]


# Presentation mode (issue 36, item 27): the promise is text of at least 16 px in figures; the play
# buttons were 11 px, and a legend lay over tick labels.
PRESENT_JS = r"""
() => {
  const visible = (root, sel) => [...root.querySelectorAll(sel)]
    .map(e => [e, e.getBoundingClientRect()]).filter(([e, r]) => r.width > 0 && r.height > 0);
  const meet = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
                         a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const small = [], hits = [];
  for (const chart of document.querySelectorAll("[data-testid='stPlotlyChart']")) {
    if (chart.getBoundingClientRect().width === 0) continue;
    const title = (chart.querySelector(".gtitle") || {}).textContent || "";
    for (const [t] of visible(chart, ".updatemenu-button text, .slider-label, .legendtext, .xtick text, .ytick text")) {
      const px = parseFloat(t.style.fontSize || getComputedStyle(t).fontSize);
      if (px < 15.5) small.push(`${title}: "${t.textContent.slice(0, 20)}" ${px} px`);
    }
    for (const [legend, lr] of visible(chart, "g.legend"))
      for (const [t, tr] of visible(chart, ".xtick text, .ytick text, .g-xtitle text, .g-ytitle text"))
        if (meet(lr, tr)) hits.push(`${title}: legend over "${t.textContent}"`);
  }
  return {small: [...new Set(small)].slice(0, 10), hits: hits.slice(0, 10)};
}
"""


PRESENT_PAGES = [("schedules?sc=Burst+5", "schedules"), ("kv", "kv"), ("tiles", "tiles"),
                 ("speculative", "speculative"), ("roofline", "roofline"), ("load", "load"),
                 ("pathologies", "pathologies"),
                 ("replay?tr=shared_prefix_caching_on.json.gz", "replay"), ("fleet", "fleet")]


@pytest.mark.parametrize("path,name", PRESENT_PAGES, ids=[n for _, n in PRESENT_PAGES])
def test_presentation_mode_text_of_16_px_and_legends_clear_of_axes(server, page, path, name):
    sep = "&" if "?" in path else "?"
    open_at(page, f"{server}/{path}{sep}present=true", PROJECTOR)
    got = page.evaluate(PRESENT_JS)
    assert not got["small"], got["small"]
    assert not got["hits"], got["hits"]


def test_the_replay_pages_first_chart_starts_above_the_fold(server, page):
    """Issue 36, item 27: on the default trace (the merged vLLM run) the first chart started at 970 px,
    below a 1280x800 screen: the trace's notes, the two clocks' row and the burst list came first."""
    open_at(page, f"{server}/replay", PROJECTOR)
    top = page.evaluate("""() => { const m = document.querySelector("[data-testid='stMain']");
        const c = document.querySelector("[data-testid='stPlotlyChart']");
        return c.getBoundingClientRect().top + m.scrollTop; }""")
    assert top < PROJECTOR["height"], top


# Pages whose tables are widest with other settings than the defaults (issue 36, item 27: at 1280 px
# "simulated continuou", "E2E p9" and "output tok/s (own dra" were cut at the frame's edge)
WIDE = [("schedules?sc=Burst+5", "schedules-burst5"), ("load", "load"),
        ("replay?tr=guidellm+0.8.1+against+our+server%3A+concurrency+1%2C+2%2C+4", "replay-guidellm")]


@pytest.mark.parametrize("path,name", WIDE, ids=[n for _, n in WIDE])
def test_projector_wide_tables_within_the_page(server, page, path, name):
    open_at(page, f"{server}/{path}", PROJECTOR)
    check_text(page, PROJECTOR, tables_fit=True)
