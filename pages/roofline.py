"""Roofline: why decode is bandwidth-bound and prefill compute-bound."""
import pandas as pd
import streamlit as st

from core.figures.roof import roofline_chart
from core.formulas import kv, roofline
from ui import bound, ensure_app_frame, show_chart, show_table

ensure_app_frame()

st.title("Roofline")
st.markdown("A dense forward step over B token positions does about 2·P·B FLOPs while reading the P·b bytes "
            "of weights once, so its arithmetic intensity is about **2B/b FLOP per byte**. Below a GPU's ridge "
            "point (peak FLOP/s ÷ bandwidth) a step waits on memory; above it, on arithmetic.")

c1, c2, c3 = st.columns(3)
gpu_name = c1.selectbox("GPU", list(kv.GPUS), index=list(kv.GPUS).index("A100-80GB"), **bound("rf_gpu"))
model_name = c2.selectbox("Model", list(kv.MODELS), **bound("rf_model"))
dtype = c3.selectbox("Weight bytes", [2.0, 1.0, 4.0, 0.5], **bound("rf_dtype"))
c1, c2 = st.columns(2)
batch = c1.number_input("Decode batch (sequences)", 1, 65536, 32, **bound("rf_batch"))
prompt = c2.number_input("Prefill length (tokens)", 1, 1_000_000, 2048, **bound("rf_prompt"))
gpu, model = kv.GPUS[gpu_name], kv.MODELS[model_name]
points = [("decode B=1", roofline.arithmetic_intensity(1, dtype)),
          (f"decode B={batch}", roofline.arithmetic_intensity(batch, dtype)),
          (f"prefill {prompt}", roofline.arithmetic_intensity(prompt, dtype))]
others = [g for n, g in kv.GPUS.items() if n in ("T4", "H100-SXM") and n != gpu_name]
show_chart(roofline_chart([gpu] + others, points), key="rf_chart")
show_table(pd.DataFrame(roofline.intensity_table(points, gpu)), hide_index=True, key="rf_points")
st.caption(f"{gpu.name}: {gpu.tflops_16:g} TFLOP/s dense 16-bit, {gpu.bandwidth_gbps:g} GB/s → ridge "
           f"{gpu.ridge_flop_per_byte:.0f} FLOP/B ({gpu.source}). Ignores attention, activations and KV traffic.")

st.header("Bandwidth-bound step rate")
wbytes = model.weight_bytes(dtype)
rate = roofline.bandwidth_bound_steps_per_s(gpu.bandwidth_Bps, wbytes)
c1, c2, c3 = st.columns(3)
c1.metric("Weight bytes", f"{wbytes / 1e9:,.2f} GB", help=kv.fmt_bytes(wbytes))
c2.metric("Steps/s upper bound", f"{rate:,.2f}")
c3.metric(f"Tokens/s at batch {batch}", f"{rate * batch:,.0f}",
          help="Bandwidth bound × batch, until the compute roof: "
               f"{roofline.compute_bound_tokens_per_s(model.params, gpu):,.0f} tokens/s")
chapter = roofline.bandwidth_bound_steps_per_s(2e12, 7e9 * 2)
st.markdown(f"The chapter's assumption — 2 TB/s and 7 B two-byte weights (14 GB) — gives "
            f"2e12 / 14e9 ≈ **{chapter:.3f}** weight-read-limited steps/s: an optimistic bound, not a "
            f"measurement. :blue-badge[given]")
show_table(pd.DataFrame(roofline.batch_table(model.params, dtype, gpu)), hide_index=True, key="rf_batch_table")
st.caption(":orange-badge[simulated] roofline lower bound on step time, max(weights/bandwidth, FLOPs/peak); "
           "batching shares the weight read until compute becomes the limit.")
