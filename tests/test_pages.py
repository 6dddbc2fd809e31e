"""Every page headless (Streamlit AppTest): runs without exception, shows the reference
numbers, reacts correctly to widgets and to URL query parameters."""

import re

import pytest

from tests.helpers import arr, charts, open_page


def all_text(at):
    return " ".join([m.value for m in at.markdown] + [c.value for c in at.caption])


def frame_with(at, column):
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with column {column!r}")


# ---- schedules ---------------------------------------------------------------------------

def test_schedules_chapter_numbers():
    at = open_page("schedules")
    summ = frame_with(at, "tok/s (drain)").set_index("schedule")
    assert summ.loc["given serial", "tok/s (drain)"] == pytest.approx(6 / 0.36)
    assert summ.loc["given continuous", "tok/s (drain)"] == pytest.approx(30.0)
    assert summ.loc["given serial", "cost USD (drain)"] == pytest.approx(0.0002)
    assert summ.loc["given continuous", "USD per 1k tokens"] == pytest.approx(0.018519, abs=1e-6)
    # Chapter 31 opens on its two given schedules and the chapter's fixed 400 ms window:
    # 6 tokens / 0.4 s = 15 tok/s for both.
    assert list(summ.index) == ["given serial", "given continuous"]
    assert summ.loc["given serial", "tok/s fixed [0, 400] ms"] == pytest.approx(15.0)
    assert summ.loc["given continuous", "tok/s fixed [0, 400] ms"] == pytest.approx(15.0)
    per_req = frame_with(at, "TTFT ms")
    assert per_req["TTFT ms"].tolist() == ["100", "240", "320"]     # given serial, first in the picker
    at.selectbox(key="sched_pick").select("given continuous").run()
    per_req = frame_with(at, "TTFT ms")
    assert per_req["TTFT ms"].tolist() == ["100", "130", "140"]
    assert per_req["TPOT ms"].tolist() == ["50", "50", "—"]         # C has no TPOT
    # The simulated policies, one click away: the latest emission of all schedules is simulated
    # serial's with the chapter preset (20 ms + 20 ms/prefill token + 20 ms/decode seq): A 100,
    # 140, 180; B from 180: +100 -> 280, 320; C from 320: 20 + 2*20 -> 380.
    at.pills(key="pol").set_value(["serial", "static", "continuous", "chunked"]).run()
    at.number_input(key="w1").set_value(0.0).run()
    summ = frame_with(at, "tok/s (drain)").set_index("schedule")
    assert [c for c in summ.columns if c.startswith("tok/s fixed")] == ["tok/s fixed [0, 380] ms"]
    assert summ.loc["simulated serial", "drain window ms"] == "[0, 380]"
    notes = next(e for e in at.expander if "notes on these percentiles" in e.label)   # one notice area
    assert any("p99" in m.value for m in notes.markdown)               # too few samples for a tail
    assert not at.warning


def test_schedules_timeline_bars_start_at_arrivals_and_ticks_at_emissions():
    at = open_page("schedules")
    fig = charts(at)[0]
    given_serial_ticks = [t for t in fig["data"] if t.get("mode") == "markers" and t.get("xaxis", "x") == "x"]
    xs = sorted(arr(given_serial_ticks[0]["x"]))
    assert xs == [100, 140, 180, 260, 300, 360]
    queue = [t for t in fig["data"] if t["type"] == "bar" and t.get("xaxis", "x") == "x"][0]
    assert arr(queue["base"]) == [0, 20, 40]


def steps_taken(at) -> dict[str, int]:
    """The schedules page's "Forward steps taken" line (the summary table leaves steps to it)."""
    line = next(m.value for m in at.markdown if m.value.startswith("Forward steps taken: "))
    return {k: int(v.replace(",", "")) for k, v in re.findall(r"\*\*(.+?)\*\* ([\d,]+)", line)}


def test_schedules_burst_static_vs_continuous_from_url():
    at = open_page("schedules", {"sc": "Burst 5", "pol": ["static", "continuous"], "ms": "3",
                                 "s_kind": "constant", "s_step": "1"})
    assert steps_taken(at) == {"simulated static": 35, "simulated continuous": 20}
    assert "Forward steps taken: **simulated static** 35, **simulated continuous** 20." in all_text(at)


def test_overlong_link_parameters_are_dropped_with_a_notice():
    """Issue 10 item 15: a parameter over 4,096 characters (name or value) is removed before any
    widget reads it; the rest of the link still applies."""
    at = open_page("schedules", {"sc": "x" * 100_000, "ms": "3", "y" * 5000: "1"})
    notes = [w.value for w in at.warning if "Ignored the link's parameter" in w.value]
    assert len(notes) == 2
    assert any("**sc**: 100,000 characters, at most 4,096." in n for n in notes)
    assert any("5,000 characters" in n and "…" in n for n in notes)   # a long name is shortened
    assert "sc" not in at.query_params and at.query_params["ms"] in ("3", ["3"])
    assert at.number_input(key="ms").value == 3


def test_schedules_changing_a_widget_changes_the_result():
    at = open_page("schedules", {"sc": "Burst 5", "pol": ["continuous"], "s_kind": "constant", "s_step": "1"})
    assert steps_taken(at)["simulated continuous"] == 20  # no limit
    at.number_input(key="ms").set_value(1).run()
    # One seat: requests run one after another: 5 + 20 + 10 + 15 + 10 = 60 steps.
    assert steps_taken(at)["simulated continuous"] == 60


def test_schedules_custom_table_bad_row_is_reported():
    at = open_page("schedules", {"sc": "Custom"})
    assert "given serial" not in frame_with(at, "tok/s (drain)")["schedule"].tolist()
    assert at.session_state["sc"] == "Custom"


def test_schedules_switching_scenario_applies_presets():
    at = open_page("schedules")
    at.selectbox(key="sc").select("Burst 5").run()
    assert not at.exception
    assert at.number_input(key="ms").value == 3
    assert at.selectbox(key="sc").value == "Burst 5"
    assert frame_with(at, "tok/s (drain)")["schedule"].tolist() == ["simulated static", "simulated continuous"]


# ---- KV memory ---------------------------------------------------------------------------

def test_kv_calculator_reference():
    at = open_page("kv")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["KV per token"] == "524,288 B"        # 512 KiB
    assert metrics["KV per sequence"] == "1.000 GiB"     # 2,048 tokens
    at.number_input(key="kv_seqs").set_value(40).run()
    assert {m.label: m.value for m in at.metric}["KV total"] == "40.000 GiB"
    at.number_input(key="kv_seqs").set_value(1).run()
    at.number_input(key="kv_tokens").set_value(32768).run()
    assert {m.label: m.value for m in at.metric}["KV per sequence"] == "16.000 GiB"


def test_kv_gqa_preset_is_smaller():
    at = open_page("kv", {"kv_model": "Llama-3-8B"})
    assert {m.label: m.value for m in at.metric}["KV per token"] == "131,072 B"  # 8 KV heads of 32


def test_kv_paging_views_and_tenant_salt():
    at = open_page("kv")
    figs = charts(at)
    heat = [f for f in figs if f["data"] and f["data"][0]["type"] == "heatmap"]
    assert heat, "occupancy heatmap missing"
    hits_on = int({m.label: m.value for m in at.metric}["hit"])
    at.toggle(key="pg_salt").set_value(False).run()
    hits_off = int({m.label: m.value for m in at.metric}["hit"])
    assert hits_off > hits_on > 0       # without salts, tenants also share each other's system prompt
    text = all_text(at)
    assert "Reusable prefix: **3 position(s)**" in text
    assert "matched prefix **0**" in text


def test_kv_prefix_identity_input_and_bad_input():
    at = open_page("kv", {"px_b": "20,21"})
    assert "Reusable prefix: **0 position(s)**" in all_text(at)
    at.text_input(key="px_b").set_value("10, 11, x").run()
    assert any("'x' is not an integer token id" in e.value for e in at.error)
    assert {m.label: m.value for m in at.metric}["KV per token"] == "524,288 B"  # the rest still works


def test_kv_fork_copy_on_write():
    at = open_page("kv")
    text = all_text(at)
    assert "sample 1: block 1 →" in text     # 6 prompt tokens, blocks of 4: the partial block 1 is copied


# ---- attention tiles ------------------------------------------------------------------

def test_tiles_chapter_example():
    at = open_page("tiles")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Online softmax (all tiles)"] == "1.5"
    assert metrics["Full softmax"] == "1.5"
    assert metrics["Average of tile averages (wrong)"] == "1.33333"
    steps = frame_with(at, "running sum l")
    assert steps["output so far acc/l"].round(6).tolist() == [round(10 / 6, 6), 1.5]


def test_tiles_random_matches_full_softmax():
    at = open_page("tiles", {"at_preset": "random", "at_n": "64", "at_tile_r": "8", "at_seed": "3"})
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Online softmax (all tiles)"] == metrics["Full softmax"]


# ---- speculative ---------------------------------------------------------------------------

def test_speculative_paris():
    at = open_page("speculative")
    nums = frame_with(at, "wrong rule").set_index("candidate")
    assert nums.loc["Paris", "accept min(1, p/q)"] == pytest.approx(0.75)
    assert nums.loc["Paris", "final"] == pytest.approx(0.6)
    assert nums.loc["Paris", "wrong rule"] == pytest.approx(0.72)
    assert nums.loc["Lyon", "residual"] == pytest.approx(1.0)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Wrong rule: Paris"] == "0.72"
    sankeys = [f for f in charts(at) if f["data"][0]["type"] == "sankey"]
    assert len(sankeys) == 2


def test_speculative_exercise_preset():
    at = open_page("speculative", {"sp_preset": "exercise"})
    nums = frame_with(at, "wrong rule").set_index("candidate")
    assert nums["accept min(1, p/q)"].tolist() == pytest.approx([0.5, 1.0])
    assert nums["final"].tolist() == pytest.approx([0.3, 0.7])
    assert {m.label: m.value for m in at.metric}["Rejection mass"] == "0.3"


# ---- roofline ---------------------------------------------------------------------------

def test_roofline_chapter_numbers():
    at = open_page("roofline")
    assert "≈ **142.857**" in all_text(at)
    pts = frame_with(at, "intensity FLOP/B")
    assert pts["intensity FLOP/B"].tolist() == [1.0, 32.0, 2048.0]


# ---- home --------------------------------------------------------------------------------

def test_home_links_every_page():
    at = open_page("home")
    assert [m.value for m in at.metric] == ["16.667 tok/s", "30.000 tok/s"]
    # issue 28 item 8: every page has a link on Home (Load & SLOs, Serving pathologies and Exercises had none)
    from tests.conftest import ROOT
    linked = {el.proto.page for el in at.get("page_link")}          # url paths: schedules, kv, ...
    pages = {p.stem for p in (ROOT / "pages").glob("*.py") if p.name != "home.py"}
    assert pages <= linked, pages - linked


def test_tiles_page_shows_captured_kernel_statistics():
    at = open_page("tiles")
    captured = [f for f in charts(at) if any("running max m" in (a.get("text") or "")
                                              for a in f["layout"].get("annotations", []))]
    assert captured, "the bundled Triton tile-statistics trace should be drawn"
    assert any("measured" in m.value and "CPU" in m.value for m in at.markdown)


def test_speculative_page_shows_measured_acceptance():
    at = open_page("speculative")
    pos = [f for f in charts(at) if (f["layout"].get("title") or {}).get("text", "").startswith("Measured acceptance")]
    assert pos
    rates = arr(pos[0]["data"][0]["y"])
    assert len(rates) == 4 and all(0 < r <= 1 for r in rates)


@pytest.mark.parametrize("value, shown", [("burst5", "Burst 5"), ("BURST 5", "Burst 5"), ("Burst 5", "Burst 5"),
                                          ("shared_prefix", "Shared prefix")])
def test_scenario_links_take_short_names_and_labels(value, shown):
    at = open_page("schedules", {"sc": value})
    assert at.selectbox(key="sc").value == shown
    assert not any("is not one of" in w.value for w in at.warning)


def test_an_unknown_scenario_in_a_link_is_said_not_ignored():
    at = open_page("schedules", {"sc": "nonsense"})
    assert at.selectbox(key="sc").value == "Chapter 31"
    assert any("scenario **nonsense** is not one of" in w.value for w in at.warning)


def test_a_preset_writes_every_value_into_the_link():
    # Burst 5 switches the step model to constant 1 ms: the ms-per-step widget appears in that
    # same run and must still reach the URL, or the shared link reopens with 10 ms steps.
    at = open_page("schedules")
    at.selectbox(key="sc").set_value("Burst 5").run()
    q = {k: at.query_params[k] for k in at.query_params}
    assert q["s_step"] == "1.0" and q["s_kind"] == "constant" and q["ms"] == "3"
    again = open_page("schedules", {**q, "sc": "Burst 5"})
    assert again.number_input(key="s_step").value == 1.0 and again.number_input(key="ms").value == 3


def test_tile_table_shows_both_conventions_with_the_chapters_numbers():
    # Example 31.2: weights [4, 2, 1, 1], values [1, 3, 0, 2], two tiles of two keys. The chapter
    # writes tile 1's numerator and denominator as 10 and 6, then 12 and 8 after both tiles; the
    # stored statistics are scaled by e^-m (m = ln 4): 2.5 and 1.5, then 3 and 2.
    at = open_page("tiles")
    df = next(d.value for d in at.dataframe if "l·e^m (chapter)" in d.value.columns)
    assert df["l·e^m (chapter)"].tolist() == pytest.approx([6, 8])
    assert df["acc·e^m (chapter)"].tolist() == pytest.approx([10, 12])
    assert df["running sum l"].tolist() == pytest.approx([1.5, 2]) and df["acc"].tolist() == pytest.approx([2.5, 3])
    assert df["output so far acc/l"].tolist() == pytest.approx([10 / 6, 1.5])


@pytest.mark.parametrize("page, params, key, kind, expected", [
    ("tiles", {"at_upto": "1"}, "at_upto", "slider", 1),
    ("kv", {"pg_cursor": "5"}, "pg_cursor", "slider", 5),
    ("schedules", {"sched_pick": "given continuous"}, "sched_pick", "selectbox", "given continuous"),
    ("schedules", {"sched_from": "given continuous"}, "sched_from", "selectbox", "given continuous"),
    ("schedules", {"sched_to": "given serial"}, "sched_to", "selectbox", "given serial"),
    ("replay", {"tr": "shared_prefix_caching_on.json.gz", "rp_cursor": "1000"}, "rp_cursor", "slider", 1000.0),
])
def test_cursors_and_picks_come_back_from_the_link(page, params, key, kind, expected):
    # issue 14: the KV time cursor, the tiles-visited slider, the per-request schedule pick and
    # the replay cursor were not in the URL
    at = open_page(page, params)
    assert getattr(at, kind)(key=key).value == expected


def test_cached_attention_equals_recomputing_it():
    import numpy as np

    from core.formulas.tiles import cached_vs_recomputed
    for dtype, tol in ((np.float32, 5e-6), (np.float64, 1e-12)):
        rows = cached_vs_recomputed(dtype=dtype)
        assert len(rows) == 7
        assert max(r["max |cached - recomputed|"] for r in rows) < tol
        # attention weights sum to 1, so values + 1 move every output by exactly 1
        assert all(abs(r["control: values + 1"] - 1) < tol for r in rows)
    # work by hand for 7 tokens of width 4: recompute sum_t 3(t+1)16 + 2(t+1)^2 4 = 1344 + 1120;
    # cached sum_t 48 + 8(t+1) = 336 + 224
    last = cached_vs_recomputed()[-1]
    assert (last["multiply-adds so far, recomputed"], last["multiply-adds so far, cached"]) == (2464, 560)
    at = open_page("tiles")
    table = next(d.value for d in at.dataframe if "control (cached values + 1)" in d.value.columns)
    assert len(table) == 7 and table["max |cached − recomputed|, float64"].max() < 1e-12


def test_an_edited_pq_table_travels_in_the_link():
    import json

    from core.errors import InputError
    from core.formulas.speculative import table_from_link, table_to_link
    text = table_to_link(["x", "y"], [0.3, 0.7], [0.6, 0.4])
    assert table_from_link(text) == (["x", "y"], [0.3, 0.7], [0.6, 0.4])
    for bad in ("garbage", "[]", json.dumps([["x", "a", 1]]), json.dumps([["x", 1]])):
        with pytest.raises(InputError, match="the link's p/q table"):
            table_from_link(bad)
    # the page opens on the link's table and computes from it: exercise 3's numbers
    at = open_page("speculative", {"sp_pq": text})
    numbers = next(d.value for d in at.dataframe if "accept min(1, p/q)" in d.value.columns)
    assert numbers["accept min(1, p/q)"].tolist() == pytest.approx([0.5, 1.0])
    assert numbers["final"].tolist() == pytest.approx([0.3, 0.7])
    at = open_page("speculative", {"sp_pq": "garbage"})
    assert any("showing the preset" in w.value for w in at.warning) and not at.exception


def test_a_custom_workload_travels_in_the_link():
    import json

    from core.errors import InputError
    from core.lessons.scenarios import custom_from_link, custom_to_link, workload_from_rows
    rows = [{"id": "X", "arrival_ms": 0, "prompt_tokens": 8, "max_output_tokens": 4},
            {"id": "Y", "arrival_ms": 5.5, "prompt_tokens": 2, "max_output_tokens": 3}]
    text = custom_to_link(workload_from_rows(rows))
    assert text == '[["X",0,8,4],["Y",5.5,2,3]]' and custom_from_link(text) == rows
    for bad in ("garbage", "[]", json.dumps([["X", 0, 8]]), json.dumps([["X", 0, -8, 4]])):
        with pytest.raises(InputError):
            custom_from_link(bad)
    # the page opens on the link's table. Serial, 1 ms steps: X's 4 tokens at 1-4 ms; Y arrives
    # at 5.5 ms to an idle server, its prefill step gives its first token at 6.5 ms: TTFT 1 ms
    at = open_page("schedules", {"sc": "Custom", "wl": text, "pol": ["serial"], "s_kind": "constant", "s_step": "1"})
    assert not at.exception
    table = next(d.value for d in at.dataframe if "TTFT ms" in d.value.columns)
    assert table["request"].tolist() == ["X", "Y"] and table["TTFT ms"].tolist() == ["1", "1"]
    assert at.query_params["wl"] == text                       # the link keeps the table
    at = open_page("schedules", {"sc": "Custom", "wl": "garbage"})
    assert any("showing the example table" in w.value for w in at.warning) and not at.exception


@pytest.mark.parametrize("page", ["schedules", "kv", "tiles", "speculative", "roofline", "replay"])
def test_no_two_charts_on_a_page_share_a_title(page):
    """Issue 36, item 27: the KV page's fork and copy-on-write tables had the same title."""
    at = open_page(page)
    titles = [(f["layout"].get("title") or {}).get("text", "") for f in charts(at)]
    titles = [t for t in titles if t]
    assert len(titles) == len(set(titles)), sorted(t for t in titles if titles.count(t) > 1)


@pytest.mark.parametrize("params", [{}, {"sc": "Burst 5"}], ids=["chapter31-given", "burst5-simulated"])
def test_the_schedules_caption_names_only_the_colours_drawn(params):
    """Issue 36, item 27: the caption named a yellow prefill bar that the given schedules (no steps) do not
    draw. It is written from the figure now: each bar it names is drawn, in the colour it names."""
    from core.figures.timeline import COLOR_WORDS
    at = open_page("schedules", params)
    fig = next(f for f in charts(at) if any(t.get("type") == "bar" and t.get("orientation") == "h"
                                           for t in f["data"]))
    drawn = {t["name"]: COLOR_WORDS[t["marker"]["color"]] for t in fig["data"] if t.get("type") == "bar"}
    caption = next(c.value for c in at.caption if c.value.startswith("Bars: "))
    named = dict(re.findall(r"([\w -]+?) \((gray|yellow|blue)\)", caption.removeprefix("Bars: ")))
    named = {k.strip().lstrip(", ").replace("first-to-last token", "decode"): v for k, v in named.items()}
    assert named == drawn
    assert ("prefill" in drawn) == bool(params)      # the given table has no steps: no prefill bar
