"""KV memory & paging: sizing calculator, block occupancy, prefix sharing, copy-on-write."""
import streamlit as st

from core.analysis.occupancy import evictions_and_preemptions, kv_op_counts, prefill_tokens, slots_held_at
from core.config import SchedulerConfig
from core.errors import InputError
from core.figures.engine import prefix_cache_figure
from core.figures.memory import block_table_figure, kv_growth_chart, occupancy_heatmap, waste_chart
from core.figures.tiers import tier_animation_figure, tier_occupancy_figure
from core.formulas import kv
from core.lessons import kv_tiers as tiers
from core.lessons.scenarios import fork_demo, prefix_match, shared_prefix_demo, without_tenants, word_prefix_match
from core.sim.stepmodel import StepModel
from core.workload.files import parse_token_ids
from ui import (
    bound,
    cached_block_states,
    cached_policies,
    cached_scenario,
    cached_vllm_cache,
    ensure_app_frame,
    md,
    option_input,
    origin_badge,
    paging_animation_view,
    show_chart,
    show_table,
)

ensure_app_frame()
ANIMATE_REQUESTS = 64

st.title("KV memory & paging")

# ---- calculator ----------------------------------------------------------------------
st.header("How big is the KV cache?")
st.markdown("KV bytes = 2 (K and V) × layers × sequences × tokens × KV heads × head dim × bytes per "
            "element. Grouped-query attention stores fewer KV heads than query heads.")
models = list(kv.MODELS) + ["Custom"]
c1, c2, c3 = st.columns(3)
preset = c1.selectbox("Model", models, **bound("kv_model"))
dtype = c2.selectbox("KV dtype", ["bf16", "fp16", "fp8", "fp32"], **bound("kv_dtype"))
gpu_name = c3.selectbox("GPU", list(kv.GPUS), index=list(kv.GPUS).index("A100-80GB"), **bound("kv_gpu"))
spec = kv.MODELS.get(preset, kv.MODELS["Llama-2-7B"])
custom = preset == "Custom"
if not custom:   # the greyed fields show the selected model's numbers (a widget keeps its last value otherwise)
    for key, value in (("kv_layers", spec.layers), ("kv_heads", spec.kv_heads), ("kv_hd", spec.head_dim)):
        if st.session_state.get(key) != value:
            st.session_state[key] = value
c1, c2, c3 = st.columns(3)
layers = c1.number_input("Layers", 1, 1000, spec.layers, disabled=not custom, **bound("kv_layers"))
kv_heads = c2.number_input("KV heads", 1, 1024, spec.kv_heads, disabled=not custom, **bound("kv_heads"))
head_dim = c3.number_input("Head dim", 1, 4096, spec.head_dim, disabled=not custom, **bound("kv_hd"))
if not custom:
    layers, kv_heads, head_dim = spec.layers, spec.kv_heads, spec.head_dim
c1, c2 = st.columns(2)
tokens = c1.number_input("Tokens per sequence", 1, 10_000_000, 2048, **bound("kv_tokens"))
seqs = c2.number_input("Sequences", 1, 1_000_000, 1, **bound("kv_seqs"))
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
show_chart(kv_growth_chart(shown, b, max(32768, int(tokens)), int(tokens)), key="kv_growth")

# ---- paging explorer ---------------------------------------------------------------------
st.header("Paged blocks over time")
st.markdown("A workload runs through the core scheduler and block manager; each physical block is free, "
            "cached-free (holds a reusable prefix), owned by one request, or shared (number = ref count).")
c1, c2, c3, c4 = st.columns(4)
pworkload = c1.selectbox("Workload", ["shared system prompt", "chapter31", "burst5", "poisson2000"],
                         **bound("pg_wl"))
block_size = option_input("pg_bs", 16, c2, label="Block size", max_value=256)
pool = option_input("pg_pool", 64, c3, label="Pool (blocks)", max_value=100_000)
max_seqs = option_input("pg_ms", 8, c4, label="Max sequences", max_value=4096)
c1, c2 = st.columns(2)
caching = option_input("pg_pc", True, c1)
salt = c2.toggle("Tenant salt (no sharing across tenants)", True, **bound("pg_salt"))

if pworkload == "shared system prompt":
    w = shared_prefix_demo(salt_by_tenant=salt, block_size=int(block_size))
else:
    w = cached_scenario(pworkload) if salt else without_tenants(cached_scenario(pworkload))
unit = StepModel("constant", step_ms=1.0)
try:
    config = SchedulerConfig(max_seqs=int(max_seqs), kv_blocks=int(pool), block_size=int(block_size),
                             prefix_caching=caching)
    (label, tr), = cached_policies(w, ("continuous",), config, unit)
except InputError as e:
    st.error(f"Paging settings: {e}")
    st.stop()
occ = cached_block_states(tr)
st.markdown(f"{origin_badge(tr)} continuous policy, constant 1 ms steps, {len(w)} requests, "
            f"pool of {pool} blocks × {block_size} tokens.")
cursor = st.slider("Time cursor: snapshot number (its time in ms is shown below it)", 0, len(occ.times_ms) - 1,
                   occ.busiest(), help="opens at the snapshot with the most blocks in use; snapshots are taken "
                   "where the blocks change, so their numbers are not milliseconds", **bound("pg_cursor"))
st.caption(f"Snapshot {cursor:,} of {len(occ.times_ms) - 1:,}: **{float(occ.times_ms[cursor]):g} ms**.")
show_chart(occupancy_heatmap(occ, tr.ids, cursor), key="pg_heatmap")
counts = kv_op_counts(tr)
for col, (op, n) in zip(st.columns(len(counts)), counts.items()):
    col.metric(op, n)
prefill_computed, prompt_total = prefill_tokens(tr)
st.caption(f"Prefill tokens computed: {prefill_computed:,} of {prompt_total:,} prompt tokens "
           f"({prompt_total - prefill_computed:,} served from the prefix cache, minus any recomputation "
           f"after preemption).")

with st.expander("Blocks filling token by token (animation)", expanded=True):
    anim = paging_animation_view(tr, int(block_size)) if len(w) <= ANIMATE_REQUESTS else None
    if len(w) > ANIMATE_REQUESTS:
        st.info(f"The animation draws one row per request: it is for workloads of at most {ANIMATE_REQUESTS} "
                "requests (shared system prompt, chapter31, burst5). The occupancy heatmap above covers this one.")
    elif anim is None:
        st.info("This run has no KV block events to animate.")
    else:
        pf, fig = anim
        st.caption("Press play: at each scheduled step the block manager hands out blocks (left: a request's "
                   "logical blocks, labelled with the physical block each maps to; ×n: shared by n sequences "
                   "through the prefix cache), and the step's tokens fill them (shade). Right: the pool. "
                   "A finished request's full blocks stay cached-free for later hits."
                   + (f" First {len(pf.steps)} of {pf.total_steps} steps." if pf.truncated else "")
                   + (f" {pf.more_requests} more requests hold blocks later (not drawn)." if pf.more_requests else ""))
        show_chart(fig, key="pg_anim", width="stretch")

t_cur = float(occ.times_ms[cursor])
held = slots_held_at(tr, t_cur, int(block_size))
ids = tr.ids
st.subheader(f"At {t_cur:g} ms")
if held.reqs:
    named = {ids[r]: t for r, t in held.tables.items()}
    show_chart(block_table_figure(named, occ.refs_at(cursor), f"Block tables at {t_cur:g} ms (logical -> physical; "
                                  "orange = shared)"), key="pg_tables")
    res = held.totals
    show_chart(waste_chart([ids[r] for r in held.reqs], held.tokens, held.paged_slots,
                           [held.max_len] * len(held.reqs), held.from_cache, held.writing), key="pg_waste")
    cached, writing = sum(held.from_cache), sum(held.writing)
    st.markdown(f"Paged: **{res.paged_slots:,}** slots held by {len(held.reqs)} sequences store "
                f"**{res.tokens:,}** tokens ({cached:,} of them in blocks taken from the prefix cache); "
                + (f"**{writing:,}** are being written by the step running at {t_cur:g} ms; " if writing else "")
                + f"**{held.tail_empty:,}** are empty in last blocks; {res.paged_waste_frac:.1%} of the held slots "
                f"hold no token yet. Contiguous max-length reservation ({held.max_len:,} per sequence): "
                f"**{res.contiguous_waste:,}** unused ({res.contiguous_waste_frac:.1%} of {res.contiguous_slots:,}).")
    st.caption("Stored: the blocks a sequence took from the prefix cache, then the tokens of its finished steps "
               "since its last preemption (core.analysis.occupancy.slots_held_at); a step's blocks are handed out "
               "when it starts and hold its tokens when it ends.")
else:
    st.info("No sequence holds blocks at this moment. Move the cursor.")
preempts, evicts = evictions_and_preemptions(tr)
if len(preempts) or len(evicts):
    with st.expander(f"Evictions ({counts['evict']}) and preemptions ({counts['preemptions']})"):
        show_table(preempts, hide_index=True, key="pg_preempts")
        show_table(evicts, hide_index=True, key="pg_evicts")

# ---- a real engine's prefix cache ------------------------------------------------------------
st.header("A real engine's prefix cache")
st.caption("vLLM 0.32.0 (CPU build) serving the bundled tiny model, 48 requests at Poisson 4/s, each a 128-token "
           "prefix shared by 8 requests + 64 tokens of its own, 48 out; `--block-size 32 --num-gpu-blocks-override 64 "
           "--enable-prefix-caching`. The engine published every block it cached and evicted (its KV events: "
           "data/imports/vllm_telemetry/run2_poisson4_p192_o48, how it was made in MADE.md).")
real, simulated, _, sim_notes = cached_vllm_cache()
show_chart(prefix_cache_figure(real, title="vLLM's own prefix cache (measured: its KV events), stacked by prefix "
                               "chain; dashed: the simulator on the same workload", simulated=simulated),
           key="kv_real_cache")
ops = real["op"].value_counts()
sim_ops = simulated["op"].value_counts()
c1, c2, c3 = st.columns(3)
c1.metric("blocks stored (vLLM · simulator)", f"{int(ops.get('stored', 0))} · {int(sim_ops.get('cache', 0))}")
c2.metric("blocks evicted (vLLM · simulator)", f"{int(ops.get('removed', 0))} · {int(sim_ops.get('evict', 0))}")
c3.metric("most cached at once (vLLM · simulator)", f"{int(real['cached'].max())} · "
          f"{int(simulated['cached'].max()) if len(simulated) else 0}")
st.caption(f"Measured: vLLM's KV events, {real.attrs.get('chain_count', 0)} prefix chains (blocks linked by their "
           "parent hash; each chain is one shared prefix and the requests that extended it). Simulated: "
           + md(sim_notes[0]) + ". Like vLLM V1, the simulator's vllm-v1 KV manager caches the full blocks the "
           "outputs fill too (48 output tokens complete one more block per request), caches each block when the "
           "step that fills it is scheduled, and keeps one block of the pool as vLLM's null block; "
           + md(sim_notes[1]) + ".")

# ---- a CPU tier under the prefix cache ------------------------------------------------------------
st.header("A CPU tier under the prefix cache")
st.markdown("vLLM can keep a second copy of prompt blocks in host memory (`--kv-offloading-size`): each full "
            "prompt block is copied to the CPU tier when the step that computes it ends; a request admitted "
            "later looks its prefix up there right after the GPU prefix cache, and a CPU hit copies the blocks "
            "back *before* the request's prefill, which then skips them. The tier is a copy, never the prefix "
            "cache itself; it evicts (LRU or ARC) only when a store needs room. Rules and code references: "
            "docs/kv-tiers.md.")
c1, c2, c3, c4, c5 = st.columns(5)
kt_models = ["Llama-3-8B", "Llama-2-7B", "Mistral-7B", "Qwen2.5-7B"]
kt_model = c1.selectbox("Model (on an H100)", kt_models, **bound("kt_model"))
kt_gbps = option_input("kt_gbps", tiers.HOST_GBPS, c2, label="Host link GB/s", min_value=0.1, max_value=1000.0)
kt_cpu = option_input("kt_cpu", tiers.CPU_BLOCKS, c3, label="CPU tier (blocks)", min_value=1, max_value=100_000)
kt_pool = option_input("kt_pool", tiers.GPU_BLOCKS, c4, label="GPU pool (blocks)", min_value=140, max_value=100_000)
kt_pol = c5.selectbox("CPU eviction", ["lru", "arc"], **bound("kt_pol"))
args = (int(kt_cpu), kt_pol, float(kt_gbps), int(kt_pool), kt_model)
with st.spinner("Simulating the workload with and without the CPU tier..."):
    cmp = tiers.compare(*args)
    tier_run = tiers.run(*args)
off_, on_ = cmp["without"], cmp["with"]
st.markdown(f"{origin_badge(tier_run)} {md(tiers.step_model(kt_model).describe())}; {len(tiers.workload())} "
            f"requests at "
            f"{tiers.RATE_PER_S:g}/s, each one of {tiers.PREFIXES} prefixes of {tiers.PREFIX_TOKENS:,} tokens (a "
            f"document, a conversation's history) + {tiers.OWN_TOKENS} tokens of its own, {tiers.OUT_TOKENS} out; "
            f"blocks of {tiers.BLOCK} tokens = {tiers.block_bytes(kt_model):,} bytes.")
m1, m2, m3, m4 = st.columns(4)
m1.metric("mean TTFT with the tier", f"{on_['ttft_mean_ms']:.1f} ms",
          f"{on_['ttft_mean_ms'] - off_['ttft_mean_ms']:+.1f} ms against none", delta_color="inverse")
m2.metric("prefill tokens computed", f"{on_['prefill_tokens']:,}",
          f"{on_['prefill_tokens'] - off_['prefill_tokens']:+,} against none", delta_color="inverse")
m3.metric("hits: GPU · CPU", f"{on_['gpu_hit_rate']:.1%} · {on_['cpu_hit_rate']:.1%}",
          help="Prompt tokens found on each tier on the requests' first admissions, over all their prompt tokens "
          "(core.analysis.kv_tiers: one definition with and without a tier). Without the tier the GPU rate is "
          f"{off_['gpu_hit_rate']:.1%}.")
cp = on_["copies"]
m4.metric("copied: stored · loaded", f"{cp['store']['bytes'] / 1e9:.1f} · {cp['load']['bytes'] / 1e9:.1f} GB",
          help=f"{cp['store']['blocks']:,} blocks stored, {cp['load']['blocks']:,} loaded in {cp['load']['jobs']} "
          f"loads, {cp['evict']['blocks']:,} evicted from the CPU tier.")
show_chart(tier_occupancy_figure(tier_run, int(kt_cpu)), key="kt_occ")
with st.expander("Blocks leaving for the CPU tier and coming back on a hit (animation)", expanded=False):
    small = tiers.small_run(kt_pol)
    st.caption(f"A small run to follow block by block: 8 requests over three prefixes of 4 blocks, served one at a "
               f"time; a GPU pool of {tiers.SMALL_GPU} blocks (left; one is vLLM's null block), a CPU tier of "
               f"{tiers.SMALL_CPU} (right). Each frame is one copy: outlined blocks leave the GPU pool for the CPU "
               "tier (blue), come back for a hit (orange), or are evicted from the tier (grey). "
               + origin_badge(small))
    show_chart(tier_animation_figure(small, tiers.SMALL_GPU, tiers.SMALL_CPU), key="kt_anim", width="stretch")

st.subheader("When does offloading pay?")
pt = tiers.per_token(kt_model, tiers.GPU, float(kt_gbps))
be = tiers.measured_break_even(*args)
st.markdown(
    f"A load must beat the recompute it replaces. Per token, the copy moves {pt['kv_bytes_per_token']:,} KV bytes over "
    f"the host link: **{pt['load_us']:.2f} µs** at {float(kt_gbps):g} GB/s. Computing the token again costs 2 × "
    f"parameters FLOPs: **{pt['recompute_us']:.2f} µs** at the {tiers.GPU}'s compute roof. So loading pays above "
    f"**{pt['break_even_gbps']:.1f} GB/s** for {kt_model} (KV bytes per token × FLOP/s / (2 × parameters)); "
    f"at {float(kt_gbps):g} GB/s it {'pays' if pt['pays'] else 'does not pay'}. :blue-badge[given: presets]")
if be["blocks_loaded"]:
    st.markdown(
        f"In the run: {be['loads']} loads brought back {be['blocks_loaded']:,} blocks at "
        f"**{be['load_ms_per_block']:.3f} ms a block** (copies queue one behind another on the link), against "
        f"**{be['prefill_ms_per_block']:.3f} ms a block** to prefill a {tiers.PREFIX_TOKENS:,}-token prefix in the "
        f"same step model ({be['flops_ms_per_block']:.3f} ms of it is the FLOPs; the rest is the K/V attention reads "
        "that the roofline step model charges). The load also costs the request a step: it waits for its copy "
        f"before its prefill. {origin_badge(tier_run)}")
else:
    st.info("No request found its prefix on the CPU tier in this run: nothing was loaded.")
st.caption("Exercises KV tiers 1 and 2 (Exercises page) work these numbers out.")

# ---- prefix identity -----------------------------------------------------------------------
st.header("Same prefix, not merely similar words")
c1, c2 = st.columns(2)
a_txt = c1.text_input("Cached request token ids", "10,11,12,13", **bound("px_a"))
b_txt = c2.text_input("New request token ids", "10,11,12,14", **bound("px_b"))
try:
    a_ids, b_ids = parse_token_ids(a_txt, "cached request"), parse_token_ids(b_txt, "new request")
    n = prefix_match(a_ids, b_ids)
    st.markdown(f"Reusable prefix: **{n} position(s)** (exact token ids, position by position, block size 1).")
except InputError as e:
    st.error(str(e))
words_a, words_b = "the cat sat on the mat", "on the mat the cat sat"
n_words = word_prefix_match(words_a, words_b)
st.markdown(f"Same words, different order: “{words_a}” vs “{words_b}” → matched prefix **{n_words}** "
            "positions. A cache key is the token sequence (and model/adapter and tenant), not a bag of words.")
n_salt = prefix_match([1, 2, 3, 4], [1, 2, 3, 4, 5], salt_a="tenant A", salt_b="tenant B")
st.caption(f"Identical ids from another tenant with a different cache salt: {n_salt} positions reused.")

# ---- fork / copy-on-write --------------------------------------------------------------
st.header("Parallel sampling: fork, then copy on write")
c1, c2, c3 = st.columns(3)
fp = c1.number_input("Prompt tokens", 1, 512, 6, **bound("fk_prompt"))
fs = c2.number_input("Samples", 1, 8, 3, **bound("fk_samples"))
fb = c3.number_input("Block size ", 1, 64, 4, **bound("fk_bs"))
demo = fork_demo(int(fp), int(fs), int(fb))
c1, c2 = st.columns(2)
show_chart(block_table_figure(demo["before"], demo["refs_before"],
                              f"After the fork: {int(fs)} samples share the prompt's blocks (orange = shared)"),
           key="fk_before", where=c1)
show_chart(block_table_figure(demo["after"], demo["refs_after"],
                              "After each sample's first token: copy on write (orange = still shared)"),
           key="fk_after", where=c2)
if demo["copies"]:
    st.markdown("Each sample appended a token into the shared, partly filled last block, so the block manager "
                "copied it first: " + ", ".join(f"{s}: block {a} → {b_}" for s, a, b_ in demo["copies"]) + ".")
else:
    st.markdown("The prompt fills its blocks exactly, so each sample's first token goes into a fresh block: "
                "no copy needed.")
