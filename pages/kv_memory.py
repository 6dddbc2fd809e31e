"""KV memory & paging: sizing calculator, block occupancy, prefix sharing, copy-on-write."""
import pandas as pd
import streamlit as st

from core import kv
from core.errors import InputError
from core.figures.memory import block_table_figure, kv_growth_chart, occupancy_heatmap, waste_chart
from core.occupancy import block_tables_at, tokens_in_cache_at
from core.scenarios import Limits, fork_demo, prefix_match, shared_prefix_demo
from core.workload import Request, Workload
from core.workload import parse_token_ids
from core.simulate import StepModel
from pages.common import cached_occupancy, cached_policies, cached_scenario, origin_badge

st.title("KV memory & paging")

# ---- calculator ----------------------------------------------------------------------
st.header("How big is the KV cache?")
st.markdown("KV bytes = 2 (K and V) × layers × sequences × tokens × KV heads × head dim × bytes per "
            "element. Grouped-query attention stores fewer KV heads than query heads.")
models = list(kv.MODELS) + ["Custom"]
c1, c2, c3 = st.columns(3)
preset = c1.selectbox("Model", models, key="kv_model", bind="query-params")
dtype = c2.selectbox("KV dtype", ["bf16", "fp16", "fp8", "fp32"], key="kv_dtype", bind="query-params")
gpu_name = c3.selectbox("GPU", list(kv.GPUS), index=list(kv.GPUS).index("A100-80GB"), key="kv_gpu",
                        bind="query-params")
spec = kv.MODELS.get(preset, kv.MODELS["Llama-2-7B"])
custom = preset == "Custom"
c1, c2, c3 = st.columns(3)
layers = c1.number_input("Layers", 1, 1000, spec.layers, key="kv_layers", disabled=not custom, bind="query-params")
kv_heads = c2.number_input("KV heads", 1, 1024, spec.kv_heads, key="kv_heads", disabled=not custom,
                           bind="query-params")
head_dim = c3.number_input("Head dim", 1, 4096, spec.head_dim, key="kv_hd", disabled=not custom, bind="query-params")
if not custom:
    layers, kv_heads, head_dim = spec.layers, spec.kv_heads, spec.head_dim
c1, c2 = st.columns(2)
tokens = c1.number_input("Tokens per sequence", 1, 10_000_000, 2048, key="kv_tokens", bind="query-params")
seqs = c2.number_input("Sequences", 1, 1_000_000, 1, key="kv_seqs", bind="query-params")
b = kv.DTYPE_BYTES[dtype]
per_token = kv.kv_bytes(int(layers), int(kv_heads), int(head_dim), b, 1)
total = kv.kv_bytes(int(layers), int(kv_heads), int(head_dim), b, int(tokens), int(seqs))
gpu = kv.GPUS[gpu_name]
m1, m2, m3 = st.columns(3)
m1.metric("KV per token", f"{per_token:,} B", help=f"{per_token / 1024:,.1f} KiB")
m2.metric("KV per sequence", f"{per_token * tokens / kv.GIB:,.3f} GiB", help=f"{per_token * tokens / kv.GB:,.3f} GB")
m3.metric("KV total", f"{total / kv.GIB:,.3f} GiB", help=f"{total / kv.GB:,.3f} GB")
st.caption(f"Side by side: {kv.fmt_bytes(total)} for {seqs:,} × {tokens:,} tokens "
           f"({kv.fmt_bytes(per_token)} per token). 1 GiB = 2³⁰ B; 1 GB = 10⁹ B.")
if not custom:
    wbytes = spec.weight_bytes(2)
    fit = kv.capacity(gpu.memory_bytes, wbytes, per_token * int(tokens))
    st.markdown(f"**Beside the weights**: {spec.name} has {spec.params / 1e9:.2f} B parameters = "
                f"{kv.fmt_bytes(wbytes)} in 2-byte weights. On a {gpu.name} ({gpu.memory_gb:g} GB as marketed) "
                f"that leaves room for **{fit:,} sequences** of {tokens:,} tokens, before activations, "
                f"workspace and fragmentation. :blue-badge[given: preset numbers]")
    st.caption(f"Model config: {spec.source}. GPU: {gpu.source}.")
shown = [kv.MODELS[m] for m in ("Llama-2-7B", "Llama-3-8B", "Mistral-7B", "Qwen2.5-7B", "Llama-2-70B")]
st.plotly_chart(kv_growth_chart(shown, b, max(32768, int(tokens)), int(tokens)), key="kv_growth")

# ---- paging explorer ---------------------------------------------------------------------
st.header("Paged blocks over time")
st.markdown("A workload runs through the core scheduler and block manager; each physical block is free, "
            "cached-free (holds a reusable prefix), owned by one request, or shared (number = ref count).")
c1, c2, c3, c4 = st.columns(4)
pworkload = c1.selectbox("Workload", ["shared system prompt", "chapter31", "burst5", "poisson2000"],
                         key="pg_wl", bind="query-params")
block_size = c2.number_input("Block size", 1, 256, 16, key="pg_bs", bind="query-params")
pool = c3.number_input("Pool (blocks)", 1, 100_000, 64, key="pg_pool", bind="query-params")
max_seqs = c4.number_input("Max sequences", 1, 4096, 8, key="pg_ms", bind="query-params")
c1, c2 = st.columns(2)
caching = c1.toggle("Prefix caching", True, key="pg_pc", bind="query-params")
salt = c2.toggle("Tenant salt (no sharing across tenants)", True, key="pg_salt", bind="query-params")

if pworkload == "shared system prompt":
    w = shared_prefix_demo(salt_by_tenant=salt, block_size=int(block_size))
else:
    w = cached_scenario(pworkload)
    if not salt:
        w = Workload([Request(r.id, r.arrival_ms, r.prompt_tokens, r.output_tokens, r.prompt_ids, None)
                      for r in w.requests], name=w.name)
lim = Limits(max_seqs=int(max_seqs), token_budget=None, kv_blocks=int(pool), block_size=int(block_size),
             prefix_caching=caching)
unit = StepModel("constant", step_ms=1.0)
try:
    (label, tr), = cached_policies(w, ("continuous",), lim, unit)
except InputError as e:
    st.error(f"Paging settings: {e}")
    st.stop()
occ = cached_occupancy(w, lim, unit, tr)
st.markdown(f"{origin_badge(tr)} continuous policy, constant 1 ms steps, {len(w)} requests, "
            f"pool of {pool} blocks × {block_size} tokens.")
cursor = st.slider("Time cursor (snapshot)", 0, len(occ.times_ms) - 1, min(len(occ.times_ms) - 1, 20),
                   key="pg_cursor")
st.plotly_chart(occupancy_heatmap(occ, tr.ids, cursor), key="pg_heatmap")
counts = tr.kv["op"].value_counts()
n_pre = len(tr.preempts)
cols = st.columns(6)
for col, op in zip(cols, ["alloc", "hit", "cache", "evict", "cow"]):
    col.metric(op, int(counts.get(op, 0)))
cols[5].metric("preemptions", n_pre)
prefill_computed = int(tr.batch[tr.batch["kind"] == "prefill"]["tokens"].sum())
prompt_total = int(tr.requests["prompt_tokens"].sum())
st.caption(f"Prefill tokens computed: {prefill_computed:,} of {prompt_total:,} prompt tokens "
           f"({prompt_total - prefill_computed:,} served from the prefix cache, minus any recomputation "
           f"after preemption).")

t_cur = float(occ.times_ms[cursor])
tables = block_tables_at(tr, t_cur)
ids = tr.ids
st.subheader(f"At {t_cur:g} ms")
if tables:
    ref_now = dict(zip(range(occ.num_blocks), occ.ref[:, cursor].tolist()))
    named = {ids[r]: t for r, t in sorted(tables.items())[:24]}
    st.plotly_chart(block_table_figure(named, ref_now), key="pg_tables")
    held = tokens_in_cache_at(tr, t_cur)
    reqs = sorted(tables)[:24]
    max_len = int((tr.requests["prompt_tokens"] + tr.requests["max_output_tokens"]).max())
    lens = [min(held.get(r, 0), len(tables[r]) * int(block_size)) for r in reqs]
    res = kv.reservation(lens, int(block_size), max_len)
    st.plotly_chart(waste_chart([ids[r] for r in reqs], lens, [-(-x // block_size) * block_size for x in lens],
                                [max_len] * len(reqs)), key="pg_waste")
    st.markdown(f"Paged: **{res.paged_waste:,}** empty slots in last blocks "
                f"({res.paged_waste_frac:.1%} of {res.paged_slots:,} held). Contiguous max-length "
                f"reservation ({max_len:,} per sequence): **{res.contiguous_waste:,}** unused "
                f"({res.contiguous_waste_frac:.1%} of {res.contiguous_slots:,}).")
else:
    st.info("No sequence holds blocks at this moment. Move the cursor.")
ev = tr.kv[tr.kv["op"].isin(["evict", "cow"])]
pre = tr.preempts
if len(pre) or len(ev):
    with st.expander(f"Evictions ({int((tr.kv['op'] == 'evict').sum())}) and preemptions ({len(pre)})"):
        st.dataframe(pd.DataFrame({"t_ms": pre["t_ms"], "request": [ids[r] for r in pre["req"]],
                                   "freed blocks": pre["freed_blocks"]}), hide_index=True, key="pg_preempts")
        st.dataframe(ev.head(200), hide_index=True, key="pg_evicts")

# ---- prefix identity -----------------------------------------------------------------------
st.header("Same prefix, not merely similar words")
c1, c2 = st.columns(2)
a_txt = c1.text_input("Cached request token ids", "10,11,12,13", key="px_a", bind="query-params")
b_txt = c2.text_input("New request token ids", "10,11,12,14", key="px_b", bind="query-params")
try:
    a_ids, b_ids = parse_token_ids(a_txt, "cached request"), parse_token_ids(b_txt, "new request")
    n = prefix_match(a_ids, b_ids)
    st.markdown(f"Reusable prefix: **{n} position(s)** (exact token ids, position by position, block size 1).")
except InputError as e:
    st.error(str(e))
words_a, words_b = "the cat sat on the mat", "on the mat the cat sat"
vocab = {w_: i + 100 for i, w_ in enumerate(dict.fromkeys(words_a.split()))}
n_words = prefix_match([vocab[x] for x in words_a.split()], [vocab[x] for x in words_b.split()])
st.markdown(f"Same words, different order: “{words_a}” vs “{words_b}” → matched prefix **{n_words}** "
            "positions. A cache key is the token sequence (and model/adapter and tenant), not a bag of words.")
n_salt = prefix_match([1, 2, 3, 4], [1, 2, 3, 4, 5], salt_a="tenant A", salt_b="tenant B")
st.caption(f"Identical ids from another tenant with a different cache salt: {n_salt} positions reused.")

# ---- fork / copy-on-write --------------------------------------------------------------
st.header("Parallel sampling: fork, then copy on write")
c1, c2, c3 = st.columns(3)
fp = c1.number_input("Prompt tokens", 1, 512, 6, key="fk_prompt", bind="query-params")
fs = c2.number_input("Samples", 1, 8, 3, key="fk_samples", bind="query-params")
fb = c3.number_input("Block size ", 1, 64, 4, key="fk_bs", bind="query-params")
demo = fork_demo(int(fp), int(fs), int(fb))
c1, c2 = st.columns(2)
c1.plotly_chart(block_table_figure(demo["before"], demo["refs_before"]), key="fk_before")
c2.plotly_chart(block_table_figure(demo["after"], demo["refs_after"]), key="fk_after")
if demo["copies"]:
    st.markdown("Each sample appended a token into the shared, partly filled last block, so the block manager "
                "copied it first: " + ", ".join(f"{s}: block {a} → {b_}" for s, a, b_ in demo["copies"]) + ".")
else:
    st.markdown("The prompt fills its blocks exactly, so each sample's first token goes into a fresh block: "
                "no copy needed.")
