"""Plotly figure builders: data in, go.Figure out. No streamlit here; each is unit-tested."""
import math

import plotly.graph_objects as go
import plotly.io as pio

# Okabe & Ito's colour-blind-safe palette; meaning is never carried by red vs green alone.
BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION, YELLOW, GRAY = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
ORIGIN_COLORS = {"given": BLUE, "simulated": ORANGE, "measured": GREEN, "imported": PURPLE}
PALETTE = [BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION, YELLOW, GRAY, "#000000", "#8C564B"]
CURSOR = VERMILLION



def _template() -> go.layout.Template:
    """plotly_white's layout with defaults for only the trace types we draw. Every go.Figure copies
    the default template when it is built; plotly_white carries styles for ~40 trace types and
    copying it cost ~10 ms per figure (a page draws several, every rerun, for every user)."""
    white = pio.templates["plotly_white"]
    t = go.layout.Template(layout=white.layout)
    t.layout.colorway = PALETTE   # default trace colours too (plotly's own put red beside green)
    for kind in ("bar", "scatter", "heatmap", "table", "sankey"):
        t.data[kind] = white.data[kind]
    return t


pio.templates["serving_explorer"] = _template()
pio.templates.default = "serving_explorer"


TITLE_CHARS = 48        # a title line fits a phone-width chart (390 px viewport) in Streamlit's title font
# The title and the legend in the margins, never over each other or over subplot titles, at any
# width: the title sits on the plot area (paper coordinates, automargin: plotly grows the top
# margin to its wrapped height, and its bottom padding leaves room for subplot titles); the legend
# is horizontal at the figure's bottom in container coordinates, so plotly reserves its wrapped
# height below the x-axis title rather than over it.
LEGEND = dict(orientation="h", xref="paper", x=0, xanchor="left", yref="container", y=0, yanchor="bottom")


def wrap_title(text: str, width: int = TITLE_CHARS) -> str:
    """`text` broken into lines of at most `width` characters, preferably after a colon or comma
    or before a parenthesis, else at a space (a word longer than `width` stays whole); text that
    already has line breaks is left as it is."""
    if "<br>" in text:
        return text
    lines = []
    while len(text) > width:
        natural = [i + 1 for i, c in enumerate(text[:width + 1]) if c in ":," and text[i + 1:i + 2] == " "]
        natural += [i for i, c in enumerate(text[:width + 1]) if c == "(" and text[i - 1:i] == " "]
        natural = [i for i in natural if i >= 8]
        spaces = [i for i, c in enumerate(text[:width + 1]) if c == " "]
        cut = max(natural) if natural else max(spaces) if spaces else text.find(" ", width)
        if cut <= 0:
            break
        lines.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    return "<br>".join(lines + [text])


def has_subplot_titles(fig: go.Figure) -> bool:
    """Annotations placed like make_subplots' titles: above a plot area that reaches the top."""
    return any(a.yref == "paper" and a.yanchor == "bottom" and a.y is not None and a.y >= 0.99
               for a in fig.layout.annotations)


def log_ticks(values=()) -> dict:
    """Axis properties for a log axis whose every label is drawn at the tick font's size: plotly's
    labels between powers of ten ("2", "5") are 3/4 of it, 9 px at the default 12. Over more than
    2.5 decades (or without data): powers of ten only; over fewer: 1-2-5 per decade (every digit
    under half a decade), placed as tick values over the positive `values`."""
    pos = [float(v) for v in values if v is not None and math.isfinite(float(v)) and float(v) > 0]
    if not pos:
        return dict(minorloglabels="none")
    lo, hi = math.floor(math.log10(min(pos))), math.ceil(math.log10(max(pos)))
    span = math.log10(max(pos) / min(pos))
    if span > 2.5:
        return dict(minorloglabels="none")
    digits = (1, 2, 5) if span >= 0.5 else range(1, 10)
    return dict(tickvals=[float(f"{m}e{k}") for k in range(lo - 1, hi + 1) for m in digits], minorloglabels="none")


NO_AXES = {"sankey", "table", "pie", "sunburst", "treemap", "indicator", "parcats", "parcoords"}
TITLE_LINE_PX = 22      # one line of the title font (17 px) with its leading


def base_layout(fig: go.Figure, title: str | None = None, height: int | None = None) -> go.Figure:
    """Margins, the title (wrapped to a phone's width) and the legend's place (see LEGEND). A
    figure without axes (a Sankey diagram, a table) gets its top margin set for the title's lines
    instead: plotly's automargin lays a Sankey's links out before the margin grows, so in a
    static export the title was drawn over the diagram and the links came apart from their nodes."""
    if title and fig.data and all(t.type in NO_AXES for t in fig.data):
        text = wrap_title(title)
        lines = text.count("<br>") + 1
        # plotly anchors a title of several lines at the middle of its block less half a line: the
        # padding that puts its first line 8 px below the top grows by half a line per extra line
        fig.update_layout(margin=dict(l=10, r=10, t=14 + TITLE_LINE_PX * lines, b=10),
                          title=dict(text=text, x=0, xanchor="left", xref="container", y=1, yanchor="top",
                                     yref="container", pad=dict(t=8 + TITLE_LINE_PX * (lines - 1) // 2, l=10),
                                     automargin=False), legend=LEGEND)
        if height:
            fig.update_layout(height=height)
        return fig
    gap = 28 if has_subplot_titles(fig) else 0   # room for subplot titles above the plot area
    fig.update_layout(margin=dict(l=10, r=10, t=10 if title else 10 + gap, b=10),
                      title=dict(text=wrap_title(title), x=0, xanchor="left", xref="container", y=1,
                                 yanchor="bottom", yref="paper", pad=dict(t=10, b=14 + gap), automargin=True)
                      if title else None,
                      legend=LEGEND)
    if height:
        fig.update_layout(height=height)
    fit_axis_titles(fig)
    return fig


def fit_axis_titles(fig: go.Figure, chars_per_px: float = 1 / 7, overhead_px: int = 150) -> go.Figure:
    """A y-axis title longer than its axis, estimated from the figure's height less the title,
    x axis and legend (`overhead_px`) at ~7 px a character, in two lines: centred on a short axis
    it would reach up into the figure's title."""
    plot_px = (fig.layout.height or 450) - overhead_px
    for axis in fig.select_yaxes():
        text = axis.title.text
        if not text or "<br>" in text:
            continue
        lo, hi = axis.domain or (0, 1)
        if len(text) > plot_px * (hi - lo) * chars_per_px:
            axis.title.text = wrap_title(text, -(-len(text) // 2) + 4)
    return fig
