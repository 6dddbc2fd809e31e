"""Figure builders as plain functions: the data in the returned figures, and the block
states (core.analysis.occupancy) they draw from."""
import numpy as np
import pytest

from core.analysis.occupancy import CACHED, FREE, OWNED, SHARED, block_states, block_tables_at
from core.config import SchedulerConfig
from core.figures.attention import hbm_traffic_chart, online_softmax_figure, tile_grid
from core.figures.memory import block_table_figure, kv_growth_chart, occupancy_heatmap, waste_chart
from core.figures.roof import roofline_chart
from core.figures.spec import break_even_chart, expected_tokens_chart, mass_sankey, monte_carlo_figure
from core.figures.timeline import schedule_timeline
from core.formulas import kv
from core.formulas.speculative import monte_carlo
from core.formulas.tiles import online_softmax_steps
from core.sim.simulate import simulate
from core.trace import load_trace
from core.workload import Request, Workload, make_workload
from tests.conftest import DATA


def test_timeline_bars_and_ticks_equal_the_trace():
    tr = load_trace(DATA / "traces" / "chapter31_continuous.json")
    sim = simulate(make_workload([("A", 0, 4, 3), ("B", 20, 4, 2), ("C", 40, 2, 1)]),
                   SchedulerConfig("continuous"), None)
    fig = schedule_timeline([("given", tr), ("sim", sim)])
    bars = [t for t in fig.data if t.type == "bar"]
    given_queue = bars[0]
    assert list(given_queue.base) == [0, 20, 40]                 # bars start at arrivals
    assert list(given_queue.x) == [100, 130, 140]                # ... and last until first tokens (TTFT)
    ticks = [t for t in fig.data if t.type == "scatter"]
    assert sorted(ticks[0].x) == [100, 150, 150, 180, 200, 200]
    # Hover gaps: A's tokens at 100, 150, 200 -> gaps (none), 50, 50.
    a = [c[1] for c, y in zip(ticks[0].customdata, ticks[0].y) if y == "A"]
    assert np.isnan(a[0]) and a[1:] == [50, 50]
    sim_bars = [t for t in bars if t.xaxis == "x2"]
    prefill = [b for b in sim_bars if b.name == "prefill"][0]
    assert list(prefill.base) == [0, 20, 40]                     # scheduled at arrival (no queue)


def test_timeline_hides_markers_for_huge_traces():
    w = make_workload([(i, 0, 4, 50) for i in range(20)])
    fig = schedule_timeline([("sim", simulate(w, SchedulerConfig("continuous")))], max_token_markers=100)
    assert not [t for t in fig.data if t.type == "scatter"]
    assert "token ticks hidden" in fig.layout.title.text


def test_block_states_match_step_events():
    w = Workload([Request(f"r{i}", i * 2.0, 20, 6, prompt_ids=tuple(range(16)) + (i, i, i, i), tenant="t")
                  for i in range(6)])
    tr = simulate(w, SchedulerConfig("continuous", max_seqs=3, block_size=4, kv_blocks=20, prefix_caching=True))
    occ = block_states(tr, times_ms=tr.steps["t_ms"].to_numpy())
    used = (occ.state >= OWNED).sum(axis=0)
    assert used.tolist() == tr.steps["kv_used_blocks"].tolist()   # independent: logged by the scheduler
    assert (occ.state == SHARED).any()                             # the 16-token prefix is shared
    end = block_states(tr, times_ms=[tr.tokens["t_ms"].max()])
    assert set(end.state[:, 0].tolist()) <= {FREE, CACHED}          # everything released at the end
    assert (end.state[:, 0] == CACHED).sum() >= 4                   # prefix blocks stay cached
    tables = block_tables_at(tr, float(tr.steps["t_ms"].iloc[3]))
    assert all(len(t) >= 1 for t in tables.values())
    fig = occupancy_heatmap(occ, tr.ids, cursor_index=2)
    assert fig.data[0].z.shape == occ.state.shape
    assert set(np.unique(fig.data[0].text)) <= {""} | {str(k) for k in range(2, 10)}


def test_block_table_and_waste_figures():
    fig = block_table_figure({"a": [0, 1], "b": [0, 2]}, {0: 2, 1: 1, 2: 1})
    assert fig.data[0].text.tolist() == [["0", "1"], ["0", "2"]]
    assert fig.data[0].z.tolist() == [[1.0, 0.0], [1.0, 0.0]]      # block 0 is shared
    w = waste_chart(["a"], [5], [8], [64])
    by = {t.name: list(t.y) for t in w.data}
    assert by["paged: empty slots in the last block"] == [3] and by["contiguous: reserved max length"] == [64]
    assert by["stored: computed"] == [5] and "being written by the running step" not in by
    w = waste_chart(["a"], [6], [12], [64], from_cache=[4], writing=[2])
    by = {t.name: (list(t.y), list(t.base) if t.base is not None else None) for t in w.data}
    assert by["stored: from the prefix cache"] == ([4], [0]) and by["stored: computed"] == ([2], [4])
    assert by["being written by the running step"] == ([2], [6])
    assert by["paged: empty slots in the last block"] == ([4], [8])


def test_kv_growth_chart_hits_one_gib_at_2048():
    fig = kv_growth_chart([kv.MODELS["Llama-2-7B"]], 2, 4096, 2048)
    x, y = list(fig.data[0].x), list(fig.data[0].y)
    assert y[x.index(2048)] == pytest.approx(1.0)


def test_tile_figures():
    steps = online_softmax_steps(np.log([4, 2, 1, 1]), [1, 3, 0, 2], 2)
    fig = online_softmax_figure(steps, 1, 1.5, 4 / 3)
    assert list(fig.data[0].y) == pytest.approx([6 / 8, 2 / 8])    # tile masses 6 and 2 of 8
    assert list(fig.data[1].y) == pytest.approx([10 / 6, 1.5])
    grid = tile_grid(8, 4, 2, causal=True)
    text = grid.data[0].text
    # Query rows 0-3 see keys 0-3 only; a tile is partly masked (*) when a key in it lies after
    # some query row of the tile (row 0 cannot see key 1).
    assert text[0].tolist() == ["1*", "2*", "skip", "skip"]
    assert text[1].tolist() == ["1", "2", "3*", "4*"]
    hbm = hbm_traffic_chart([1024, 4096], 128, 2, 128)
    assert all(n > t for n, t in zip(hbm.data[0].y, hbm.data[1].y))


def test_sankey_flows_reproduce_the_final_distribution():
    fig = mass_sankey([0.6, 0.4], [0.8, 0.2], ["Paris", "Lyon"])
    link = fig.data[0].link
    into = {}
    for t, v in zip(link.target, link.value):
        into[t] = into.get(t, 0) + v
    assert into[3] == pytest.approx(0.6) and into[4] == pytest.approx(0.4)   # final Paris, final Lyon
    assert into[2] == pytest.approx(0.2)                                      # rejected
    wrong = mass_sankey([0.6, 0.4], [0.8, 0.2], ["Paris", "Lyon"], wrong=True)
    into = {}
    for t, v in zip(wrong.data[0].link.target, wrong.data[0].link.value):
        into[t] = into.get(t, 0) + v
    assert into[3] == pytest.approx(0.72)


def test_spec_charts():
    mc = monte_carlo([0.6, 0.4], [0.8, 0.2], 1000, seed=0)
    fig = monte_carlo_figure(mc, [0.6, 0.4], ["Paris", "Lyon"])
    assert list(fig.data[1].y) == mc["freq"]
    ex = expected_tokens_chart([0.8], 4)
    assert list(ex.data[0].y) == pytest.approx([1, 1.8, 2.44, 2.952, 3.3616])
    be = break_even_chart(0.8, 4, 1.0)
    assert be.data[0].y[0] == pytest.approx(3.3616)                          # free draft: E tokens per step


def test_roofline_chart_ridge_and_points():
    g = kv.GPUS["A100-80GB"]
    fig = roofline_chart([g], [("decode B=1", 1.0)])
    ridge = fig.data[1]
    assert ridge.x[0] == pytest.approx(312e12 / 2039e9)
    pt = fig.data[-1]
    assert pt.y[0] == pytest.approx(2039e9 / 1e12)                           # bandwidth-bound at intensity 1


def _many(n, seed=0):
    """A simulated trace of n Poisson requests (continuous, 32 seats)."""
    import numpy as np

    from core.config import SchedulerConfig
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    from core.workload import Request, Workload
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(5.0, n))
    wl = Workload([Request(f"r{i}", float(t[i]), int(rng.integers(1, 200)), int(rng.integers(1, 60)))
                   for i in range(n)])
    return simulate(wl, SchedulerConfig(max_seqs=32), StepModel("affine", base_ms=2, decode_ms_per_seq=0.1,
                                                               prefill_ms_per_token=0.01))


def test_timelines_fit_one_screen_at_any_size():
    from core.figures.timeline import schedule_timeline
    for n in (3, 40, 250, 2_000, 10_000):
        tr = _many(n)
        fig = schedule_timeline([("a", tr), ("b", tr)] if n <= 2_000 else [("a", tr)])
        assert fig.layout.height <= 900, (n, fig.layout.height)
        kinds = {d.type for d in fig.data}
        assert (kinds == {"heatmap"}) == (n * (2 if n <= 2_000 else 1) > 300)


def test_aggregate_timeline_totals_equal_the_detailed_data():
    import numpy as np

    from core.figures.timeline import aggregate_timeline
    tr = _many(1_500, seed=3)
    fig = aggregate_timeline([("x", tr)], groups=40, bins=120)
    heat = fig.data[0]
    custom = np.asarray(heat.customdata)
    assert custom[:, 0, 3].sum() == 1_500                      # every request in exactly one row
    z = np.asarray(heat.z)
    assert (z == custom[..., :3].sum(-1)).all()               # color = waiting + prefill + decode
    # a column = the requests in flight at its center, counted here from arrivals and last tokens
    t = tr.tokens
    last = t.groupby("req")["t_ms"].max().reindex(range(len(tr.requests))).to_numpy()
    arrival = tr.requests["arrival_ms"].to_numpy()
    centers = np.asarray(heat.x)
    in_flight = ((arrival[:, None] <= centers[None, :]) & (last[:, None] >= centers[None, :])).sum(0)
    assert (z.sum(0) == in_flight).all()


def test_kv_growth_merges_models_with_identical_kv_size():
    from core.figures.memory import kv_growth_chart
    from core.formulas import kv
    fig = kv_growth_chart([kv.MODELS[m] for m in ("Llama-3-8B", "Mistral-7B", "Llama-2-7B")], 2)
    # Llama-3-8B and Mistral-7B: 32 layers x 8 KV heads x 128 dims: one line, both names
    assert [t.name for t in fig.data] == ["Llama-3-8B = Mistral-7B (8 KV heads)", "Llama-2-7B (32 KV heads)"]


def test_draft_position_ticks_are_whole_positions():
    from core.figures.spec import acceptance_by_position_figure
    fig = acceptance_by_position_figure([0, 1, 2, 3], [0.9, 0.8, 0.6, 0.5], [10, 9, 7, 5])
    assert list(fig.layout.xaxis.tickvals) == [0, 1, 2, 3]


def test_preemptions_are_marked_on_the_timeline():
    from core.config import SchedulerConfig
    from core.figures.timeline import schedule_timeline
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    from core.workload import Request, Workload
    w = Workload([Request("L", 0.0, 2, 6), Request("H", 5.0, 2, 6)])
    tr = simulate(w, SchedulerConfig("continuous", block_size=2, kv_blocks=5), StepModel("constant", step_ms=10.0))
    fig = schedule_timeline([("sim", tr)])
    marks = [t for t in fig.data if t.name == "preempted"]
    # H is preempted at 40 ms (hand-worked in tests/test_admission.py)
    assert len(marks) == 1 and list(marks[0].x) == [40.0] and list(marks[0].y) == ["H"]


def test_the_tile_walk_animation_reads_the_chapters_numbers_in_both_conventions():
    from core.figures.animate import tile_walk_animation
    from core.lessons.scenarios import chapter_tile_example
    logits, values = chapter_tile_example()          # weights [4, 2, 1, 1], values [1, 3, 0, 2], tiles of 2
    steps = online_softmax_steps(logits, values, 2)
    fig = tile_walk_animation(steps, logits, values, 1.5)
    assert [f.name for f in fig.frames] == ["0", "1", "2"]            # before any tile, after each tile
    table = lambda k: fig.frames[k].data[3].cells.values            # columns: name, stored, chapter
    # after tile 0 (weights 4, 2): the chapter's l = 6, acc = 4*1 + 2*3 = 10; stored scaled by e^-ln4
    assert table(1)[2][1:3] == ["6", "10"] and table(1)[1][1:3] == ["1.5", "2.5"]
    # after tile 1 (weights 1, 1): l = 8, acc = 10 + 0 + 2 = 12, output 12 / 8 = 1.5 = the full softmax
    assert table(2)[2][1:4] == ["8", "12", "1.5"]
    assert list(fig.frames[1].data[1].x)[:2] == [-0.5, 1.5]         # the band over the tile being read: keys 0-1
    assert list(fig.frames[2].data[0].x)[:2] == [-0.5, 1.5]         # ... which is read by the next frame
    assert "m -inf → 1.386" in fig.frames[1].data[2].text[0]


def test_timeline_draws_dense_token_ticks_small_instead_of_hiding_them():
    """Issue 28 item 11: 64 requests x 64 tokens (vLLM's burst run) hid every tick; past 25 a row
    they are small dots (a density; separate when zoomed), up to the marker limit."""
    w = make_workload([(i, 0, 4, 64) for i in range(64)])
    fig = schedule_timeline([("sim", simulate(w, SchedulerConfig("continuous")))])
    ticks = [t for t in fig.data if t.type == "scatter"]
    assert ticks and sum(len(t.x) for t in ticks) == 64 * 64
    assert ticks[0].marker.size < 12 and "zoom in" in fig.layout.title.text


def _luminance(hex_color: str) -> float:
    r, g, b = (int(hex_color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4))
    f = lambda v: v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4   # WCAG 2.1 relative luminance
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b)


def _contrast(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@pytest.mark.parametrize("theme,dark_page", [("light", False), ("dark", True)])
def test_the_tile_walk_table_and_the_pool_follow_the_theme(theme, dark_page):
    """Issue 36, item 27: in the dark theme the tile-walk table was a bright box and the pool's free blocks
    a translucent grey whose numbers took the page's dark text colour."""
    from core.figures.animate import paging_animation, tile_walk_animation
    from core.lessons.blockframes import paging_frames
    from core.lessons.scenarios import load_scenario
    from core.sim.stepmodel import StepModel
    logits, values = np.log([4.0, 2.0, 1.0, 1.0]), np.array([1.0, 3.0, 0.0, 2.0])
    steps = online_softmax_steps(logits, values, 2)
    fig = tile_walk_animation(steps, logits, values, 1.5, theme)
    table = next(t for t in fig.data if t.type == "table")
    for fill in (table.header.fill.color, table.cells.fill.color):
        assert _contrast(table.cells.font.color, fill) >= 4.5
        assert (_luminance(fill) < 0.2) == dark_page          # dark cells on the dark page, light on the light
    tr = simulate(load_scenario("burst5"), SchedulerConfig(policy="continuous", max_seqs=3, block_size=4),
                  StepModel("constant", step_ms=1.0))
    pool = next(t for t in paging_animation(paging_frames(tr, 4), tr.ids, theme).data
                if t.type == "heatmap" and t.zmax == 4)
    free = pool.colorscale[0][1]
    assert free.startswith("#") and len(free) == 7                # opaque: its numbers take a contrasting colour
    assert (_luminance(free) < 0.2) == dark_page


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_sankey_labels_in_the_themes_strongest_text_colour(theme):
    """Issue 36, item 27: the Sankey's node labels were low-contrast in the light theme."""
    fig = mass_sankey([0.6, 0.4], [0.8, 0.2], ["Paris", "Lyon"], theme=theme)
    page = {"light": "#FFFFFF", "dark": "#0E1117"}[theme]           # Streamlit's backgrounds
    assert _contrast(fig.data[0].textfont.color, page) >= 15 and fig.data[0].textfont.size >= 14
