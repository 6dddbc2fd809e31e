"""Attention tiles: online softmax tile by tile, tile visit order, HBM traffic, kernel stats."""
import pandas as pd
import streamlit as st

from core.errors import InputError
from core.figures.animate import tile_walk_animation
from core.figures.attention import (
    captured_tiles_figure,
    hbm_traffic_chart,
    online_softmax_figure,
    tile_event_groups,
    tile_grid,
)
from core.formulas import tiles
from core.lessons.scenarios import chapter_tile_example, random_tile_example
from ui import bound, ensure_app_frame, md, origin_badge, show_chart, show_table, theme, tile_traces

ensure_app_frame()

st.title("Attention tiles")
st.markdown("FlashAttention computes the same softmax attention, but walks the keys in tiles that fit in "
            "on-chip memory, carrying three running statistics per query row: the max logit **m**, the sum "
            "**l** of exp(logit − m), and the weighted sum **acc**. When a tile raises the max, the old l and "
            "acc are multiplied by the rescale factor exp(m_old − m_new).")

st.header("One query, tile by tile")
preset = st.segmented_control("Example", ["chapter", "random"], default="chapter", required=True,
                              help="chapter: weights [4, 2, 1, 1], values [1, 3, 0, 2]; random: seeded logits",
                              **bound("at_preset"))
if preset == "chapter":
    logits, values = chapter_tile_example()
    tile_size = st.number_input("Tile size (keys)", 1, 4, 2, **bound("at_tile"))
    st.caption("Unnormalised weights [4, 2, 1, 1] are exp(logits) with logits = ln w.")
else:
    c1, c2, c3, c4 = st.columns(4)
    n = c1.number_input("Keys", 2, 4096, 16, **bound("at_n"))
    tile_size = c2.number_input("Tile size (keys)", 1, 4096, 4, **bound("at_tile_r"))
    seed = c3.number_input("Seed", 0, 2**31 - 1, 0, **bound("at_seed"))
    scale = c4.number_input("Logit scale", 0.0, 1000.0, 3.0, **bound("at_scale"))
    logits, values = random_tile_example(int(n), int(seed), scale)
try:
    steps = tiles.online_softmax_steps(logits, values, int(tile_size))
except InputError as e:
    st.error(str(e))
    st.stop()
full = float(tiles.full_softmax_average(logits, values))
wrong = tiles.average_of_tile_averages(logits, values, int(tile_size))
with st.expander("Tile walk (animation)", expanded=True):
    st.caption("Press play: each frame reads one tile. m, l and acc update as the text describes; the table "
               "gives them in both conventions (the chapter's Example 31.2 reads l = 6 and acc = 10 after the "
               "first tile; the stored, rescaled values are 1.5 and 2.5 with m = ln 4), and their ratio, the "
               "output, is the same in both.")
    show_chart(tile_walk_animation(steps, logits, values, full, theme()), key="at_walk", width="stretch")
upto = st.slider("Tiles visited", 1, len(steps), len(steps), **bound("at_upto")) - 1
show_chart(online_softmax_figure(steps, upto, full, wrong), key="at_steps")
table = pd.DataFrame([{"tile": s.tile, "keys": f"{s.start}–{s.stop - 1}", "tile max": s.tile_max,
                       "running max m": s.m, "rescale e^(m_old−m_new)": s.rescale,
                       "tile sum (at new m)": s.tile_sum, "running sum l": s.l, "acc": float(s.acc),
                       "l·e^m (chapter)": tiles.unscaled(s)[0], "acc·e^m (chapter)": float(tiles.unscaled(s)[1]),
                       "output so far acc/l": float(s.output), "tile's own average": float(s.tile_output)}
                      for s in steps[: upto + 1]])
st.caption("l and acc are stored scaled by e^−m (numerically stable); the chapter's Example 31.2 writes them "
           "unscaled, as sums of the weights e^logit: the two '(chapter)' columns, equal to l·e^m and acc·e^m. "
           "Their ratio, the output, is the same in both conventions.")
show_table(table, hide_index=True, key="at_table",
             column_config={c: st.column_config.NumberColumn(format="%.6g") for c in table.columns
                            if c not in ("tile", "keys")})
final = float(steps[-1].output)
c1, c2, c3 = st.columns(3)
c1.metric("Online softmax (all tiles)", f"{final:.6g}")
diff = final - full
c2.metric("Full softmax", f"{full:.6g}", delta=f"{diff:+.2e} difference" if diff else "no difference",
          delta_color="off", delta_arrow="off")       # a difference of either sign is neither good nor bad news
c3.metric("Average of tile averages (wrong)", f"{wrong:.6g}", delta=f"{wrong - full:+.4g} error",
          delta_color="red" if wrong != full else "off", delta_arrow="off")   # an error is bad in either direction
st.caption(":blue-badge[given] chapter numbers, or :orange-badge[computed] from seeded random logits in "
           "float64. Tiles carry unequal probability mass, so an equal-weight average of their outputs is "
           "biased; merging (m, l, acc) is exact.")

st.header("A KV cache changes the work, not the answer")
cache = pd.DataFrame(tiles.cache_table())
show_table(cache, hide_index=True, key="at_cache",
             column_config={c: st.column_config.NumberColumn(format="%.2e") for c in cache.columns if "|" in c})
st.caption(":orange-badge[computed] seeded random tokens (7 × width 4), one causal attention head. Each position "
           "either recomputes every projection and the attention over the whole prefix, or projects only the new "
           "token and attends to the cached keys and values: the outputs agree to rounding (~1e-7 in float32). "
           "The control attends to cached values that are off by one, with the same shapes, and is wrong by 1. "
           "The cache saves the repeated projections; attention still reads every cached position.")

st.header("Which tiles does a causal kernel visit?")
c1, c2, c3 = st.columns(3)
T = c1.number_input("Sequence length", 1, 4096, 512, **bound("at_T"))
bq = c2.number_input("Query tile", 1, 1024, 128, **bound("at_bq"))
bk = c3.number_input("Key tile", 1, 1024, 64, **bound("at_bk"))
causal = st.toggle("Causal mask", True, **bound("at_causal"))
if T / bq * T / bk > 4096:
    st.warning("Too many tiles to draw; raise the tile sizes.")
else:
    show_chart(tile_grid(int(T), int(bq), int(bk), causal), key="at_grid")

st.header("Memory traffic: naive vs tiled")
c1, c2, c3 = st.columns(3)
hd = c1.selectbox("Head dim", [64, 128, 256], index=1, **bound("at_hd"))
dt = c2.selectbox("Bytes per element", [2, 4, 1], **bound("at_dt"))
bq2 = c3.number_input("Query tile (rows per pass)", 16, 1024, 128, **bound("at_bq2"))
lens = [2 ** k for k in range(8, 18)]
show_chart(hbm_traffic_chart(lens, int(hd), float(dt), int(bq2), causal), key="at_hbm")
r = tiles.hbm_traffic_bytes(8192, int(hd), float(dt), int(bq2), causal)
st.caption(f"Estimate, not a measurement: at 8,192 positions the score matrix alone is "
           f"{r['score_matrix_bytes'] / 2**20:,.0f} MiB per head; naive ≈ {r['naive_bytes'] / 2**20:,.0f} MiB vs "
           f"tiled ≈ {r['tiled_bytes'] / 2**20:,.0f} MiB ({r['ratio']:.1f}×). The arithmetic is unchanged — "
           "attention is still quadratic in length; only the traffic falls.")

st.header("Statistics captured from a real kernel")
found = tile_traces()
if not found:
    st.info("No trace with `tiles` events in data/traces yet. A `measured` trace captured by the runner's "
            "Triton kernel with tile-statistics capture enables this view.")
else:
    name = st.selectbox("Trace", list(found), key="at_trace")
    tr, rows = found[name]
    st.markdown(f"{md(tr.meta.get('label', name))} — {origin_badge(tr)}")
    groups = tile_event_groups(rows)
    pick = st.selectbox("layer, head, query tile", list(groups), key="at_pick")
    show_chart(captured_tiles_figure(groups[pick]), key="at_captured")
