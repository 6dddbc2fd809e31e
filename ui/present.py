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


def show_table(df, key: str, where=None, **kwargs):
    """How pages show a table of numbers: it joins this view's CSV export."""
    st.session_state.setdefault("_view_tables", {})[key] = df
    return (where or st).dataframe(df, key=key, **kwargs)


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
    """Start the page content near the top: Streamlit's default leaves ~6 rem of empty space
    above every title, a tenth of a projector screen. A fixed style sheet, no user input."""
    st.html("<style>.stMainBlockContainer, .block-container {padding-top: 2.25rem;}</style>")
