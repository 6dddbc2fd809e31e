"""What a student sees is right (issue 28, items 1, 3, 4): the greyed model fields follow the
model, a wrong answer looks wrong, an error is never styled as good news, the speculative α is
in the link."""
from tests.helpers import open_page


def test_the_greyed_fields_follow_a_model_switch():
    at = open_page("kv")
    at.selectbox(key="kv_model").set_value("Llama-2-7B").run()
    at.selectbox(key="kv_model").set_value("Qwen2.5-7B").run()
    shown = {n.key: n.value for n in at.number_input if n.key in ("kv_layers", "kv_heads", "kv_hd")}
    assert shown == {"kv_layers": 28, "kv_heads": 4, "kv_hd": 128}
    # 2 (K and V) x 28 layers x 4 KV heads x 128 dims x 2 bytes = 57,344 B per token
    assert {m.label: m.value for m in at.metric}["KV per token"] == "57,344 B"


def test_a_wrong_answer_is_red_and_says_which_way():
    at = open_page("exercises")
    at.number_input(key="ex_ch31-1_0").set_value(123456.0).run()
    assert not at.success and len(at.error) == 1
    assert "too high" in at.error[0].value and "A, serial (ms)" in at.error[0].value


def test_the_wrong_merge_error_is_not_green_and_no_difference_has_no_arrow():
    at = open_page("tiles")
    m = {x.label: x for x in at.metric}
    assert m["Full softmax"].delta == "no difference"
    wrong = m["Average of tile averages (wrong)"]
    assert wrong.delta.endswith("error")
    from streamlit.proto.Metric_pb2 import Metric
    assert wrong.proto.color == Metric.MetricColor.Value("RED")
    assert wrong.proto.direction == Metric.MetricDirection.Value("NONE")      # no arrow: either sign is an error


def test_the_acceptance_rate_is_in_the_link():
    at = open_page("speculative", {"sp_alpha": "0.75"})
    assert [s.value for s in at.slider if s.key == "sp_alpha"] == [0.75]
    said = " ".join(c.value for c in at.caption)
    # (1 - 0.75^5) / (1 - 0.75) = 3.05078125 tokens per verification at the default gamma 4
    assert "= 3.051" in said


def test_compare_with_resets_when_the_main_trace_changes():
    at = open_page("replay", {"tr": "shared_prefix_caching_on.json.gz", "rp_cmp": "shared_prefix_caching_off.json.gz"})
    assert at.selectbox(key="rp_cmp").value == "shared_prefix_caching_off.json.gz"   # a link's pair is kept
    at.selectbox(key="tr").set_value("chapter31_continuous.json").run()
    assert at.selectbox(key="rp_cmp").value == "(none)"


def test_table_exports_carry_no_binary_round_off():
    import io
    import zipfile

    import pandas as pd

    from core.figures.slides import tables_zip
    z = zipfile.ZipFile(io.BytesIO(tables_zip({"t": pd.DataFrame({"x": [0.1 + 0.2, 0.75 - 1e-16, 1 / 3]})})))
    text = z.read(z.namelist()[0]).decode()
    assert text.splitlines() == ["x", "0.3", "0.75", "0.333333333333333"]


def _luminance(hex_color: str) -> float:
    """WCAG 2.1 relative luminance of #rrggbb."""
    c = [int(hex_color.lstrip("#")[k:k + 2], 16) / 255 for k in (0, 2, 4)]
    lin = [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_the_tile_walk_table_is_readable_in_every_theme():
    """Issue 28 item 6: the table brings its own text and fill colours, at least 4.5:1 (WCAG AA),
    instead of the theme's light text on plotly's light fills."""
    import numpy as np

    from core.figures.animate import tile_walk_animation
    from core.formulas.tiles import online_softmax_steps
    logits, values = np.array([1.0, 2.0, 3.0, 0.5]), np.array([1.0, 2.0, 3.0, 4.0])
    steps = online_softmax_steps(logits, values, 2)
    fig = tile_walk_animation(steps, logits, values, float(steps[-1].output))
    table = next(t for t in fig.data if t.type == "table")
    for part in (table.header, table.cells):
        assert _contrast(part.font.color, part.fill.color) >= 4.5


def test_free_kv_blocks_take_the_page_background_in_every_theme():
    """Issue 28 item 6: free cells were #F2F2F2 (glaring in the dark theme): now a translucent grey
    over the page, in the heatmap and in the paging animation."""
    import re

    from core.analysis.occupancy import FREE
    from core.figures.animate import STATE_COLORS as ANIM
    from core.figures.memory import STATE_COLORS
    for color in (STATE_COLORS[FREE], ANIM[0]):
        alpha = float(re.fullmatch(r"rgba\(\d+,\d+,\d+,([0-9.]+)\)", color).group(1))
        assert alpha <= 0.2


def test_the_expected_tokens_chart_draws_each_alpha_once():
    """Issue 28 item 10: α = 0.8 selected drew a second 'α = 0.8' curve over the reference one."""
    from tests.helpers import charts
    at = open_page("speculative", {"sp_alpha": "0.8"})
    fig = next(f for f in charts(at) if "Expected tokens per target verification" in
               (f["layout"].get("title") or {}).get("text", ""))
    names = [t["name"] for t in fig["data"] if t.get("name", "").startswith("α = ")]
    assert names == ["α = 0.5", "α = 0.7", "α = 0.8", "α = 0.9"]


def test_the_captured_kernel_chart_colours_each_row_alike_in_both_panels():
    """Issue 28 item 10: a row's two lines and its legend entry share one colour, distinct per row
    (the default cycle coloured a row's two traces differently and repeated every 5 rows)."""
    from core.figures.attention import captured_tiles_figure
    rows = [{"req": 0, "step": 0, "layer": 0, "head": 0, "q_tile": 0, "kv_tile": t,
             "m": [float(i + t) for i in range(12)], "l": [1.0 + i for i in range(12)]} for t in range(3)]
    fig = captured_tiles_figure(rows)
    by_row = {}
    for tr in fig.data:
        by_row.setdefault(tr.legendgroup, set()).add(tr.line.color)
    assert len(by_row) == 12 and all(len(c) == 1 for c in by_row.values())
    assert len({next(iter(c)) for c in by_row.values()}) == 12
