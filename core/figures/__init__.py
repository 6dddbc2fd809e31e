"""Plotly figure builders: data in, go.Figure out. No streamlit here; each is unit-tested."""
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


def base_layout(fig: go.Figure, title: str | None = None, height: int | None = None) -> go.Figure:
    fig.update_layout(margin=dict(l=10, r=10, t=50 if title else 20, b=10),
                      title=dict(text=title, x=0, xanchor="left") if title else None,
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1))
    if height:
        fig.update_layout(height=height)
    return fig
