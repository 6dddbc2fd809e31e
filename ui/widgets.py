"""Widgets several pages share: the step-time model controls, the notice area."""

import streamlit as st

from core.errors import InputError
from core.formulas.kv import GPUS, MODELS
from core.sim.stepmodel import STEP_MODELS, StepModel
from ui.urls import bound


def step_model_controls() -> StepModel:
    """Sidebar widgets for the step-time model (bound to the URL)."""
    kind = st.segmented_control("Step-time model", list(STEP_MODELS), default="affine", required=True,
                                **bound("s_kind"))
    if kind == "constant":
        step_ms = st.number_input("ms per step", 0.001, 1e6, 10.0, **bound("s_step"))
        return StepModel("constant", step_ms=step_ms)
    base_ms = st.number_input("base ms per step", 0.0, 1e6, 20.0, **bound("s_base"))
    if kind in ("affine", "features"):
        pp = st.number_input("ms per prefill token", 0.0, 1e6, 20.0, format="%.4f", **bound("s_pp"))
        pd_ = st.number_input("ms per decoding sequence", 0.0, 1e6, 20.0, format="%.4f", **bound("s_pd"))
        more = {}
        if kind == "features":   # python -m core fit prints these for a measured trace
            more = dict(prefill_ms_per_kpos=st.number_input("ms per 1,000 attended prefill positions", 0.0, 1e6,
                                                            0.0, format="%.5f", **bound("s_ppk")),
                        decode_ms_per_kpos=st.number_input("ms per 1,000 attended decode positions", 0.0, 1e6,
                                                           0.0, format="%.5f", **bound("s_pdk")),
                        prefill_ms_per_chunk=st.number_input("ms per prefill piece", 0.0, 1e6, 0.0, format="%.4f",
                                                             **bound("s_pch")))
        try:
            return StepModel(kind, base_ms=base_ms, prefill_ms_per_token=pp, decode_ms_per_seq=pd_, **more)
        except InputError as e:
            st.error(f"Step model: {e}")
            st.stop()
    model = st.selectbox("Model preset", list(MODELS), **bound("s_model"))
    gpu = st.selectbox("GPU preset", list(GPUS), index=list(GPUS).index("A100-80GB"), **bound("s_gpu"))
    return StepModel("roofline", base_ms=base_ms, model=model, gpu=gpu)




def notices(notes: list[str], what: str = "these numbers") -> None:
    """At most one notice area: one note as a caption with a warning icon, several folded into
    one expander whose title counts them (a lecture screen is not a wall of yellow boxes)."""
    if len(notes) == 1:
        st.caption(f":material/warning: {notes[0]}")
    elif notes:
        with st.expander(f":material/warning: {len(notes)} notes on {what}"):
            for n in notes:
                st.markdown(f"- {n}")
