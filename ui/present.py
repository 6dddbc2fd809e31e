"""A view's figures and tables: presentation mode (projector-sized fonts), and the sidebar's
slides and handouts (SVG / PNG / CSV zips)."""

import streamlit as st

from core.errors import InputError
from ui.urls import bound


def presenting() -> bool:
    """Presentation mode (the sidebar switch, `present` in the URL)."""
    return bool(st.session_state.get("present"))


def start_view() -> None:
    """app.py, before the page runs: this view's figures and tables are collected afresh."""
    st.session_state["_view_figures"] = {}
    st.session_state["_view_tables"] = {}


def show_chart(fig, key: str, where=None, **kwargs):
    """How pages draw a figure: it joins this view's exports, and in presentation mode a copy
    with projector-sized fonts is drawn (the figure itself may be shared by caches)."""
    from core.figures.slides import for_presentation
    st.session_state.setdefault("_view_figures", {})[key] = fig
    return (where or st).plotly_chart(for_presentation(fig) if presenting() else fig, key=key, **kwargs)


SIGNIFICANT = 4     # digits a table shows of a column's typical value (the CSV export keeps them all)


def float_format(values) -> str | None:
    """A printf format for a float column: its median magnitude to SIGNIFICANT digits, at most 8
    decimals and none for numbers of 1,000 and more (1136.587 -> "1137"; 0.052312 -> "0.05231");
    None for a column with no finite values."""
    import numpy as np
    v = np.asarray(values, dtype=float)
    v = np.abs(v[np.isfinite(v)])
    v = v[v > 0]
    if not len(v):
        return None
    digits = int(np.floor(np.log10(float(np.median(v)))))
    decimals = min(8, max(0, SIGNIFICANT - 1 - digits))
    return f"%.{decimals}f"


# Long column names shown short (the full name is the column's tooltip and stays in the CSV), so
# that a table's columns fit the page at 1280 px instead of scrolling out of view
SHORT = {"recomputed prefill tokens": ("recomputed", "prefill tokens computed again after preemptions"),
         "KV blocks in use at the end": ("KV at end", "KV blocks still in use when the run ends"),
         "KV blocks in use, peak": ("KV peak", "most KV blocks in use at once"),
         "cost USD (drain)": ("USD", "cost over the drain window at the price per hour"),
         "USD per 1k tokens": ("USD/1k", "USD per 1,000 output tokens over the drain window"),
         "drain window ms": ("drain ms", "[first arrival, last emission], ms"),
         "tok/s (drain)": ("tok/s", "output tokens per second over the drain window"),
         "first_token_ms": ("first tok", "first token, ms"), "last_token_ms": ("last tok", "last token, ms"),
         "ttft_ms_measured": ("TTFT meas.", "measured TTFT, ms"), "ttft_ms_predicted": ("TTFT pred.", "predicted "
                             "TTFT, ms"), "ttft_ms_error": ("TTFT err", "|predicted − measured| / measured"),
         "e2e_ms_measured": ("E2E meas.", "measured E2E, ms"), "e2e_ms_predicted": ("E2E pred.", "predicted E2E, "
                            "ms"), "e2e_ms_error": ("E2E err", "|predicted − measured| / measured"),
         "held_out": ("held out", "no step of this request was fitted"),
         # latency columns: all shown the same way, the name with its unit in the tooltip (a table says "ms"
         # in its caption); shortening only some ("TTFT p99" beside "TTFT p50 ms") read as two kinds of number
         **{f"{m} {s} ms": (f"{m} {s}", f"{m} {s}, ms") for m in ("TTFT", "TPOT", "ITL", "E2E")
            for s in ("p50", "p90", "p95", "p99", "mean", "median")},
         "output_tokens": ("tokens", "output tokens emitted"), "finish_reason": ("finish", None),
         "prompt_tokens": ("prompt", "prompt tokens"), "offered req/s": ("offered/s", "offered load, req/s"),
         "goodput req/s": ("good req/s", "requests per second that met every SLO"),
         "goodput tok/s": ("good tok/s", "output tokens per second of requests that met every SLO"),
         "rescale e^(m_old−m_new)": ("rescale", "e^(m_old − m_new): how much the running sums shrink"),
         "tile sum (at new m)": ("tile sum", "the tile's sum of weights at the new running max m"),
         "output so far acc/l": ("acc/l", "the output so far: acc / l"),
         "max |cached − recomputed|, float32": ("|diff| f32", "max |cached − recomputed|, float32"),
         "max |cached − recomputed|, float64": ("|diff| f64", "max |cached − recomputed|, float64"),
         "control (cached values + 1)": ("control", "the same with cached values off by one"),
         "multiply-adds so far, recomputed": ("MACs recomputed", "multiply-adds so far, recomputing the prefix"),
         "multiply-adds so far, with a KV cache": ("MACs cached", "multiply-adds so far, with a KV cache"),
         "output tokens": ("tokens", "output tokens emitted"),
         "arrival_ms": ("arrival", "arrival, ms"), "ttft_ms": ("TTFT", "time to first token, ms"),
         "tpot_ms": ("TPOT", "time per output token after the first, ms"),
         "e2e_ms": ("E2E", "first arrival to last token, ms"), "latency_ms": ("latency", "arrival to finish, ms"),
         "running max m": ("max m", "running max of the logits, m"), "running sum l": ("sum l", "running sum l "
                           "(scaled by e^−m)"), "l·e^m (chapter)": ("l·e^m (ch.)", "l·e^m: the chapter's unscaled l"),
         "acc·e^m (chapter)": ("acc·e^m (ch.)", "acc·e^m: the chapter's unscaled acc"),
         "tile's own average": ("tile avg", "the tile's own softmax average (what the wrong merge averages)")}


def short_label(column: str) -> tuple[str, str | None] | None:
    """(label, tooltip) for a long column name shown short, or None to show it as it is."""
    if column in SHORT:
        return SHORT[column]
    if column.startswith("tok/s fixed ["):      # "tok/s fixed [0, 400] ms"
        return "tok/s fixed", f"output tokens per second over the fixed window {column.removeprefix('tok/s fixed ')}"
    return None


def show_table(df, key: str, where=None, export=None, **kwargs):
    """How pages show a table of numbers: it joins this view's CSV export (every digit; `export`:
    another frame to export, e.g. with the numbers a display column joins), and
    its float columns not configured by the page show their typical value to 4 significant
    digits (float_format): a column of 1136.587 needs no thousandths on screen, and shorter
    numbers keep a table's columns within the page."""
    st.session_state.setdefault("_view_tables", {})[key] = df if export is None else export
    config = dict(kwargs.pop("column_config", None) or {})
    try:
        floats = [c for c in df.columns if df[c].dtype.kind == "f" and c not in config]
    except AttributeError:            # a Styler or a plain list: as given
        floats = []
    for c in floats:
        f = float_format(df[c])
        if f is not None:
            config[c] = st.column_config.NumberColumn(format=f)
    for c in getattr(df, "columns", ()):
        short = short_label(c) if isinstance(c, str) else None
        if short:
            label, tip = short
            given = config.get(c)
            if given is None:
                config[c] = st.column_config.Column(label=label, help=tip or c)
            elif isinstance(given, dict) and not given.get("label"):
                config[c] = {**given, "label": label, "help": tip or c}
    return (where or st).dataframe(df, key=key, column_config=config or None, **kwargs)


def presentation_switch() -> None:
    """The sidebar's presentation switch (before the page runs: its figures read it)."""
    st.sidebar.toggle(":material/slideshow: Presentation mode", help="Fonts of at least 16 px in figures; "
                      "the sidebar starts collapsed when the link is opened", **bound("present"))


def export_tools(view: str) -> None:
    """After the page ran: the sidebar's exports of what it showed: its figures as SVG or PNG
    (rendered by kaleido with the system Chromium) and its tables as CSV, each set in a zip."""
    from core.figures.slides import figures_zip, for_presentation, tables_zip
    figs = st.session_state.get("_view_figures", {})
    tables = st.session_state.get("_view_tables", {})
    if not figs and not tables:
        return
    with st.sidebar.expander(":material/download: Slides and handouts"):
        st.caption(f"This view: {len(figs)} figure(s), {len(tables)} table(s). Animations are drawn at their "
                   "last frame; presentation mode gives larger fonts.")
        c1, c2, c3 = st.columns(3)
        asked = [(fmt, label) for fmt, label, col in (("svg", "SVG", c1), ("png", "PNG", c2), ("csv", "CSV", c3))
                 if col.button(label, key=f"export_{fmt}", disabled=not (tables if fmt == "csv" else figs))]
        for fmt, label in asked:
            try:
                with st.spinner(f"Rendering {label}…"):
                    data = tables_zip(tables) if fmt == "csv" else figures_zip(
                        {k: for_presentation(f) if presenting() else f for k, f in figs.items()}, fmt)
                st.session_state["_export"] = (view, fmt, data)
            except InputError as e:
                st.error(str(e))
        ready = st.session_state.get("_export")
        if ready and ready[0] == view:
            _, fmt, data = ready
            what = "tables as CSV" if fmt == "csv" else f"figures as {fmt.upper()}"
            st.download_button(f"Download {what} (zip, {len(data) / 1024:,.0f} KiB)", data,
                               file_name=f"serving-explorer-{view}-{fmt}.zip", mime="application/zip",
                               key="export_download", on_click="ignore")


def compact_header() -> None:
    """Start the page content near the top and use the page's width: Streamlit's default leaves
    ~6 rem of empty space above every title (a tenth of a projector screen) and 5 rem either side
    (at 1280 px a fifth of the width beside the sidebar, where tables' columns scrolled out of
    view; a phone keeps Streamlit's own 1 rem). A fixed style sheet, no user input."""
    st.html("<style>.stMainBlockContainer, .block-container {padding-top: 2.25rem;} @media (min-width: 640px) "
            "{.stMainBlockContainer, .block-container {padding-left: 2rem; padding-right: 2rem;}}</style>")
