"""Serving Explorer: the router and frame. Pages live in pages/, the Streamlit helpers they share
in ui/, and all logic in core/."""
import streamlit as st

from ui import (
    compact_header,
    drop_nonfinite_params,
    drop_overlong_params,
    export_tools,
    freeze_startup_heap,
    link_box,
    link_slot,
    presentation_switch,
    start_view,
)

# a shared presentation link opens with the sidebar collapsed (the switch is in the sidebar)
st.set_page_config(page_title="Serving Explorer", page_icon=":material/speed:", layout="wide",
                   initial_sidebar_state="collapsed" if st.query_params.get("present") in ("True", "true") else "auto")
freeze_startup_heap()
compact_header()
drop_overlong_params()
drop_nonfinite_params()

pg = st.navigation({
    "": [st.Page("pages/home.py", title="Home", icon=":material/home:", default=True)],
    "Mechanisms": [
        st.Page("pages/schedules.py", title="Schedules", icon=":material/view_timeline:", url_path="schedules"),
        st.Page("pages/kv.py", title="KV memory & paging", icon=":material/memory:", url_path="kv"),
        st.Page("pages/tiles.py", title="Attention tiles", icon=":material/grid_on:", url_path="tiles"),
        st.Page("pages/speculative.py", title="Speculative decoding", icon=":material/call_split:",
                url_path="speculative"),
        st.Page("pages/roofline.py", title="Roofline", icon=":material/show_chart:", url_path="roofline"),
    ],
    "Capacity": [
        st.Page("pages/load.py", title="Load & SLOs", icon=":material/speed:", url_path="load"),
        st.Page("pages/fleet.py", title="Fleet", icon=":material/hub:", url_path="fleet"),
        st.Page("pages/pathologies.py", title="Serving pathologies", icon=":material/healing:",
                url_path="pathologies"),
    ],
    "Classroom": [
        st.Page("pages/exercises.py", title="Exercises", icon=":material/school:", url_path="exercises"),
    ],
    "Your runs": [
        st.Page("pages/replay.py", title="Trace replay", icon=":material/slow_motion_video:", url_path="replay"),
        st.Page("pages/calibration.py", title="Prediction vs measurement", icon=":material/rule:",
                url_path="calibration"),
    ],
})
st.sidebar.caption("Every number is labeled by origin: **given** (teaching scenario), "
                   "**simulated** (core simulator, step model stated), **measured** (captured trace).")
presentation_switch()
start_view()
link_slot(pg.url_path)   # the link's place, before the page's fragments run
pg.run()
link_box(pg.url_path)   # after the page ran: every widget it drew has its value
export_tools(pg.url_path or "home")
