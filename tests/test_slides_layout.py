"""Issue 28 item 7: figures exported for slides keep their on-screen layout. Each exported SVG
is opened in Chromium and measured: every text lies inside the canvas, the figure's title
overlaps nothing else and sits above every plot area, the legend overlaps no other text, and
a Sankey diagram's links start on their nodes. (kaleido draws into a page where plotly's
automargin does not settle: the title was drawn over the plot, the first subplot title was
clipped, the legend covered the x axis's labels and a Sankey's links came apart from their
nodes.)"""
import io
import zipfile

import numpy as np
import pytest

from core.analysis.metrics import SLO
from core.config import SchedulerConfig
from core.figures.load import load_curves
from core.figures.memory import block_table_figure
from core.figures.slides import chromium, figures_zip
from core.figures.spec import mass_sankey
from core.figures.timeline import schedule_timeline
from core.lessons.load import sweep_policies
from core.lessons.scenarios import load_scenario
from core.lessons.schedules import run_policies
from core.sim.stepmodel import StepModel
from core.workload import make_workload

pytestmark = pytest.mark.browser

MEASURE = """() => {
  const svg = document.querySelector('svg');
  const o = svg.getBoundingClientRect();
  const box = el => { const r = el.getBoundingClientRect();
    return {l: r.left - o.left, t: r.top - o.top, r: r.right - o.left, b: r.bottom - o.top, w: r.width, h: r.height}; };
  const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim())
    .map(t => Object.assign(box(t), {text: t.textContent, cls: t.getAttribute('class') || '',
                                     legend: !!t.closest('.legend'), title: !!t.closest('.g-gtitle')}));
  const plots = [...svg.querySelectorAll('.bglayer rect, .plotclip rect')].map(box).filter(b => b.w > 0 && b.h > 0);
  const legend = svg.querySelector('.legend');
  const starts = [...svg.querySelectorAll('.sankey-link')].map(p => {
    const q = p.getPointAtLength(0), m = p.getScreenCTM();
    return {x: q.x * m.a + q.y * m.c + m.e - o.left, y: q.x * m.b + q.y * m.d + m.f - o.top}; });
  const nodes = [...svg.querySelectorAll('.sankey-node rect')].map(box);
  return {width: o.width, height: o.height, texts, plots, legend: legend ? box(legend) : null, starts, nodes};
}"""


def overlap(a, b, slack=1.0):
    return min(a["r"], b["r"]) - max(a["l"], b["l"]) > slack and min(a["b"], b["b"]) - max(a["t"], b["t"]) > slack


def figures():
    sched = run_policies(load_scenario("chapter31"), ["static", "continuous"], SchedulerConfig(max_seqs=3),
                         StepModel("constant", step_ms=10.0))
    rng = np.random.default_rng(0)
    w = make_workload([(i, 100.0 * i, int(rng.integers(16, 64)), int(rng.integers(4, 16))) for i in range(40)])
    curves = sweep_policies(w, ["continuous", "chunked"], SchedulerConfig(max_seqs=8),
                            StepModel("constant", step_ms=5.0), chunk=32, rates=[2.0, 8.0, 32.0],
                            slo=SLO(ttft_ms=100.0, tpot_ms=20.0))
    return {"sankey": mass_sankey([0.6, 0.4], [0.8, 0.2], ["Paris", "Lyon"]),
            "timeline": schedule_timeline(sched),
            "tables": block_table_figure({"prompt": [0, 1], "sample 1": [0, 2], "sample 2": [0, 3]}, {0: 3}),
            "curves": load_curves(curves, SLO(ttft_ms=100.0, tpot_ms=20.0))}


@pytest.fixture(scope="module")
def exported():
    if chromium() is None:
        pytest.skip("no Chromium on this machine")
    figs = figures()
    z = zipfile.ZipFile(io.BytesIO(figures_zip(figs, "svg")))
    return {name: (z.read(f"{name}.svg").decode(), bool(f.layout.title.text)) for name, f in figs.items()}


@pytest.mark.parametrize("name", ["sankey", "timeline", "tables", "curves"])
def test_an_exported_figure_keeps_its_title_legend_and_labels_apart(exported, page, name):
    svg, has_title = exported[name]
    page.set_content(f"<html><body style='margin:0'>{svg}</body></html>")
    m = page.evaluate(MEASURE)
    assert m["texts"], name
    for t in m["texts"]:     # inside the canvas, nothing clipped
        assert t["l"] >= -1 and t["t"] >= -1 and t["r"] <= m["width"] + 1 and t["b"] <= m["height"] + 1, (name, t)
    titles = [t for t in m["texts"] if t["title"]]
    assert bool(titles) == has_title, f"{name}: the title is missing from the export"
    title_bottom = max((t["b"] for t in titles), default=0.0)
    for p in m["plots"]:
        assert title_bottom <= p["t"] + 1, (name, "title over a plot area", title_bottom, p)
    for t in m["texts"]:
        if not t["title"]:
            assert not any(overlap(t, x) for x in titles), (name, "text under the title", t["text"])
    if m["legend"]:
        for t in m["texts"]:
            if not t["legend"]:
                assert not overlap(t, m["legend"]), (name, "text under the legend", t["text"])
    if name == "sankey":
        assert m["starts"] and m["nodes"]
        for s in m["starts"]:       # every link starts on a node's edge, within its height
            assert any(abs(s["x"] - n["r"]) <= 2 and n["t"] - 1 <= s["y"] <= n["b"] + 1 for n in m["nodes"]), s
        left = sorted((n for n in m["nodes"] if n["l"] < 50), key=lambda n: n["t"])
        heights = np.array([n["h"] for n in left])
        assert heights / heights.sum() == pytest.approx([0.8, 0.2], abs=0.03)   # draft Paris, draft Lyon: q
