"""Every page's layout at a phone's viewport (390x844) and a projector's (1280x800), in headless
Chromium: nothing wider than the screen, and no figure legend over a figure or subplot title."""
import pytest

from tests.helpers import SHOTS, wait_idle

pytestmark = pytest.mark.browser

PAGES = [("", "home"), ("schedules", "schedules"), ("kv", "kv"), ("tiles", "tiles"),
         ("speculative", "speculative"), ("roofline", "roofline"), ("load", "load"),
         ("pathologies", "pathologies"), ("exercises", "exercises"),
         ("replay?tr=shared_prefix_caching_on.json.gz", "replay")]
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
# (subplot titles are annotations), as [chart title, legend item texts, overlapped text].
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
  }
  return {charts, hits};
}
"""


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


@pytest.mark.parametrize("path,name", PAGES, ids=[n for _, n in PAGES])
def test_projector_legends_clear_of_titles(server, page, path, name):
    legends = open_at(page, f"{server}/{path}", PROJECTOR)
    assert not legends["hits"], legends["hits"]
