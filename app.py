"""Serving Explorer: the router and frame. Pages live in pages/; all logic lives in core/."""
import streamlit as st

st.set_page_config(page_title="Serving Explorer", page_icon=":material/speed:", layout="wide")

pg = st.navigation({
    "": [st.Page("pages/home.py", title="Home", icon=":material/home:", default=True)],
})
st.sidebar.caption("Every number is labeled by origin: **given** (teaching scenario), "
                   "**simulated** (core simulator, step model stated), **measured** (captured trace).")
pg.run()
