"""Figures for slides and handouts: a presentation copy with projector-sized fonts, and a view's
figures rendered to SVG/PNG (kaleido driving the system's Chromium; nothing is downloaded) or
its tables to CSV, each set in one zip."""
from __future__ import annotations

import io
import os
import re
import shutil
import threading
import zipfile
from pathlib import Path

import plotly.graph_objects as go

from core.analysis.export import csv_text
from core.errors import ConfigError

PRESENTATION_FONT = 18      # px: body text, titles and axis titles in figures
PRESENTATION_TICKS = 16     # px: tick labels, legends, hover labels
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_RENDER_LOCK = threading.Lock()     # one kaleido browser at a time per process
MARGINS_JS = Path(__file__).resolve().parent / "js" / "onscreen_margins.js"


def for_presentation(fig: go.Figure) -> go.Figure:
    """A copy of `fig` with fonts of at least 16 px (the original is shared by caches: never
    changed). Explicit smaller sizes on annotations and traces' text are raised too."""
    out = go.Figure(fig)
    out.update_layout(font=dict(size=PRESENTATION_FONT), legend=dict(font=dict(size=PRESENTATION_TICKS)),
                      hoverlabel=dict(font=dict(size=PRESENTATION_TICKS)))
    out.update_xaxes(tickfont=dict(size=PRESENTATION_TICKS), title_font=dict(size=PRESENTATION_FONT))
    out.update_yaxes(tickfont=dict(size=PRESENTATION_TICKS), title_font=dict(size=PRESENTATION_FONT))
    out.update_annotations(font=dict(size=PRESENTATION_TICKS))
    for menu in out.layout.updatemenus or ():         # an animation's play buttons
        menu.font.size = max(menu.font.size or 0, PRESENTATION_TICKS)
    for slider in out.layout.sliders or ():
        slider.font.size = max(slider.font.size or 0, PRESENTATION_TICKS)
        slider.currentvalue.font.size = max(slider.currentvalue.font.size or 0, PRESENTATION_TICKS)
    for tr in out.data:
        tf = getattr(tr, "textfont", None)
        if tf is not None and tf.size is not None and tf.size < PRESENTATION_TICKS:
            tr.textfont.size = PRESENTATION_TICKS
        if tr.type == "table":
            tr.header.font.size = max(tr.header.font.size or 0, PRESENTATION_TICKS)
            tr.cells.font.size = max(tr.cells.font.size or 0, PRESENTATION_TICKS)
            tr.cells.height = max(tr.cells.height or 0, 30)
    if out.layout.height:
        out.update_layout(height=min(int(out.layout.height * 1.15), 1100))
    return out


def still_figure(fig: go.Figure) -> go.Figure:
    """A copy of `fig` for a static image: an animation shows its last frame, without the play
    buttons and slider; in this app's own template (plotly_white with its palette: a figure made
    where Streamlit's template was the default carries its colour placeholders, which only
    Streamlit's page resolves, and exported black)."""
    import plotly.io as pio
    out = go.Figure(fig)
    out.layout.template = pio.templates["serving_explorer"]
    if out.frames:
        last = out.frames[-1]
        for i, d in zip(last.traces or range(len(last.data)), last.data):
            patch = d.to_plotly_json()
            patch.pop("type", None)
            out.data[i].update(patch)
        out.frames = ()
        out.layout.updatemenus = ()
        out.layout.sliders = ()
    return out


def chromium() -> str | None:
    """The system Chromium kaleido can drive (BROWSER_PATH, else the usual names on PATH)."""
    env = os.environ.get("BROWSER_PATH")
    if env and os.path.exists(env):
        return env
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _name(key: str, used: set) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_") or "figure"
    name, k = base, 2
    while name in used:
        name, k = f"{base}_{k}", k + 1
    used.add(name)
    return name


def figures_zip(figures: dict[str, go.Figure], fmt: str, width: int = 1280, scale: float = 1.0) -> bytes:
    """One file per figure (named by its key) in a zip: `fmt` "svg" or "png". Animated figures
    are drawn at their last frame. Raises ConfigError without a Chromium to drive."""
    if fmt not in ("svg", "png"):
        raise ConfigError(f"format: expected svg or png, got {fmt!r}")
    if not figures:
        raise ConfigError("this view has no figures to export")
    path = chromium()
    if path is None:
        raise ConfigError("SVG/PNG export drives a local Chromium and none was found (apt-get install "
                          "chromium, or set BROWSER_PATH); CSV export works without it")
    os.environ.setdefault("BROWSER_PATH", path)
    import kaleido
    buf, used = io.BytesIO(), set()
    # the page: plotly.py's own plotly.js, no MathJax (kaleido's default fetches it from a CDN:
    # an export never touches the network), and the on-screen margins shim (its file says why)
    page = kaleido.PageGenerator(mathjax=False, others=[MARGINS_JS.as_uri()])
    with _RENDER_LOCK, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        kaleido.start_sync_server(silence_warnings=True, page_generator=page)
        try:
            for key, fig in figures.items():
                still = still_figure(fig)
                h = int(still.layout.height or 500)
                data = kaleido.calc_fig_sync(still, opts={"format": fmt, "width": width, "height": h,
                                                          "scale": scale})
                z.writestr(f"{_name(key, used)}.{fmt}", data)
        finally:
            kaleido.stop_sync_server(silence_warnings=True)
    return buf.getvalue()


def tables_zip(tables: dict[str, object]) -> bytes:
    """One CSV per table (pandas data frames, named by key) in a zip; numbers to 15 significant
    digits, so binary round-off (0.7499999999999999) is written as the decimal it stands for."""
    if not tables:
        raise ConfigError("this view has no tables to export")
    buf, used = io.BytesIO(), set()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for key, df in tables.items():
            z.writestr(f"{_name(key, used)}.csv", csv_text(df, float_format="%.15g"))   # formula-safe cells
    return buf.getvalue()
