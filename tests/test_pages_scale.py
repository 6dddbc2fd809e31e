"""Views at scale (issue 12): the shortcuts the pages take on large traces give the same
results as the plain computations, and the pages keep their layout. Timings are benchmarks
(bench/pages.py), never asserted here."""
import dataclasses

import numpy as np
import pytest

from core.analysis.cursor import row_index, step_at, subset, time_range
from core.analysis.occupancy import SHARED, block_states
from core.figures.memory import occupancy_heatmap
from core.lessons.scenarios import SCHEDULE_PRESETS, load_scenario
from core.trace import load_trace
from tests.conftest import DATA
from tests.helpers import charts, open_page

TABLES = ("requests", "tokens", "finishes", "batch", "preempts", "steps")


def traces():
    out = {name: load_trace(DATA / "traces" / name) for name in
           ("shared_prefix_caching_off.json.gz", "shared_prefix_measured_cpu.json.gz", "chapter31_continuous.json")}
    tr = out["shared_prefix_caching_off.json.gz"]
    # batch rows out of step order, and rows of no request: the index falls back / skips them
    shuffled = tr.batch.sample(frac=1.0, random_state=0).reset_index(drop=True)
    tokens = tr.tokens.copy()
    tokens.loc[tokens.index[:3], "req"] = -1
    out["shuffled"] = dataclasses.replace(tr, batch=shuffled, tokens=tokens)
    return out


@pytest.mark.parametrize("name", ["shared_prefix_caching_off.json.gz", "shared_prefix_measured_cpu.json.gz",
                                  "chapter31_continuous.json", "shuffled"])
def test_subset_and_step_at_with_the_row_index_are_the_plain_results(name):
    tr = traces()[name]
    assert name != "shuffled" or len(tr.preempts)        # preemptions are carried too
    index = row_index(tr)
    assert (index.batch_steps is None) == (name == "shuffled")
    rng = np.random.default_rng(1)
    n = len(tr.requests)
    for k in (1, min(5, n), min(40, n), n):
        idx = rng.choice(n, size=k, replace=False)
        plain, fast = subset(tr, idx), subset(tr, idx, index)
        for t in TABLES:
            assert getattr(fast, t).equals(getattr(plain, t)), (t, k)
    t0, t1 = time_range(tr)
    for t in np.r_[t0 - 1, np.linspace(t0, t1, 13), t1 + 1]:
        (r1, b1), (r2, b2) = step_at(tr, t), step_at(tr, t, index)
        assert r1 == r2 and b1.equals(b2)


def test_block_states_take_snapshot_times_in_any_order():
    tr = load_trace(DATA / "traces" / "shared_prefix_caching_on.json.gz")
    t = tr.kv["t_ms"].to_numpy()
    times = np.r_[t[::37], t[0] - 1, t[-1] + 1, t[5]]            # unsorted, repeated, outside the events
    got = block_states(tr, times_ms=times)
    order = np.argsort(times, kind="stable")
    want = block_states(tr, times_ms=times[order])
    for f in ("state", "ref", "owner"):
        assert np.array_equal(getattr(got, f)[:, order], getattr(want, f)), f


def test_occupancy_heatmap_writes_ref_counts_only_when_blocks_are_shared():
    off = load_trace(DATA / "traces" / "shared_prefix_caching_off.json.gz")
    occ = block_states(off)
    assert not (occ.state == SHARED).any()
    assert occupancy_heatmap(occ, off.ids).data[0].text is None
    on = load_trace(DATA / "traces" / "shared_prefix_caching_on.json.gz")
    occ = block_states(on)
    text = occupancy_heatmap(occ, on.ids).data[0].text
    assert text is not None and set(np.unique(text)) - {""}


def test_poisson_10000_scenario_is_the_production_sized_poisson():
    w = load_scenario("poisson10000")
    assert len(w) == 10_000 and len({r.id for r in w.requests}) == 10_000
    assert SCHEDULE_PRESETS["poisson10000"].options() == SCHEDULE_PRESETS["poisson2000"].options()


def test_replay_keeps_the_metrics_above_the_cursor_on_a_large_trace():
    at = open_page("replay", {"tr": "shared_prefix_measured_cpu.json.gz"})    # 200 requests: nearest 150 drawn
    order = [(n.type, getattr(n, "key", None) or getattr(n, "label", None)) for n in at.main
             if getattr(n, "type", None) in ("metric", "slider", "plotly_chart")]
    assert order[0] == ("metric", "requests") and order.index(("slider", "rp_cursor")) > 5
    assert {m.label: m.value for m in at.metric}["requests"] == "200"
    at.slider(key="rp_cursor").set_value(at.slider(key="rp_cursor").min).run()
    assert not at.exception
    assert any("of 200 requests nearest the cursor" in c.value for c in at.caption)


@pytest.mark.slow
def test_schedules_page_with_10000_requests_stays_one_screen():
    at = open_page("schedules", {"sc": "Poisson 10000", "pol": ["continuous", "chunked"], "ms": "256",
                                 "tb": "8192", "ch": "512", "s_base": "5", "s_pp": "0.02", "s_pd": "0.05"})
    timeline = [f for f in charts(at) if "aggregated" in (f["layout"].get("title") or {}).get("text", "")]
    assert timeline and timeline[0]["layout"]["height"] <= 900
    assert "20,000 requests" in timeline[0]["layout"]["title"]["text"]
