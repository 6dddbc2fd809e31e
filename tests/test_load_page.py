"""The Load & SLOs page (AppTest) and core.lessons.load, against hand computations."""
import json

import pytest

from core.errors import InputError
from core.lessons.load import exercise6, parse_loads
from tests.conftest import DATA
from tests.helpers import arr, charts, open_page


def test_exercise6_by_hand():
    rows = {r["schedule"]: r for r in exercise6()}
    plain, chunked = rows["no chunking"], rows["chunks of 32, 48-token budget"]
    # No chunking, affine 5 ms + 0.2/prefill token + 0.5/decoding sequence: step 1 prefills the
    # eight 16-token prompts (5 + 25.6 = 30.6 ms, 8 tokens); step 2 prefills long0 (arrived at
    # 20) beside 8 decodes (5 + 80 + 4 = 89 ms -> 119.6, 9 tokens); step 3 prefills the five
    # long prompts that arrived by then (2,000 tokens) beside 9 decodes: 409.5 ms -> 529.1, past
    # the 400 ms window. So 17 tokens in [0, 400], and long1 (arrived 35) waits until 529.1.
    assert plain["window_tokens"] == 17 and plain["window_tok_per_s"] == pytest.approx(17 / 0.4)
    assert plain["ttft_max_ms"] == pytest.approx(529.1 - 35) and plain["contract_holds"]
    assert chunked["window_tokens"] > 10 * plain["window_tokens"]
    assert chunked["over_bound"] > 0 and chunked["ttft_max_ms"] > 500 and not chunked["contract_holds"]


def test_parse_loads():
    assert parse_loads("20, 5,10 ,5", "open") == [5.0, 10.0, 20.0]
    for text, kind, msg in (("", "open", "expected comma-separated"), ("5,x", "open", "'x' is not a number"),
                            ("0", "open", "a rate > 0"), ("2.5", "closed", "whole number of clients"),
                            (",".join(str(i) for i in range(1, 30)), "open", "at most 24")):
        with pytest.raises(InputError, match=msg):
            parse_loads(text, kind)


def test_load_page_default_sweep():
    at = open_page("load")
    (fig,) = charts(at)
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    # each panel says what its dashes mean (p50 in three, goodput in the fourth: issue 28 item 10)
    assert titles[:4] == ["TTFT (ms)<br>solid p99 · dashed p50", "TPOT (ms)<br>solid p99 · dashed p50",
                          "E2E (ms)<br>solid p99 · dashed p50", "tokens / s<br>solid output · dashed goodput"]
    dashes = {(t["xaxis"], t["line"]["dash"]) for t in fig["data"] if t.get("legendgroup") == "continuous"
              and t.get("mode") == "lines+markers"}
    assert dashes == {(x, d) for x in ("x", "x2", "x3", "x4") for d in ("solid", "dash")}
    # the legend: one entry per policy, at the top of the figure (above the fold at 1280x800)
    shown = [t["name"] for t in fig["data"] if t.get("showlegend", True) and t.get("legendgroup")]
    assert shown == ["continuous", "continuous + chunked prefill"]
    assert fig["layout"]["legend"]["yref"] == "container" and fig["layout"]["legend"]["y"] == 1
    slo_lines = {t["name"]: arr(t["y"]) for t in fig["data"] if str(t.get("name", "")).startswith("SLO")}
    assert slo_lines == {"SLO TTFT <= 500 ms": [500, 500], "SLO TPOT <= 50 ms": [50, 50]}   # the default bounds
    assert fig["layout"]["height"] <= 900
    policies = {t["legendgroup"] for t in fig["data"] if t.get("legendgroup")}
    assert policies == {"continuous", "continuous + chunked prefill"}
    xs = arr(next(t for t in fig["data"] if t.get("name") == "continuous")["x"])
    assert xs == [5, 10, 15, 20, 25, 30]
    text = " ".join(m.value for m in at.markdown)
    assert "capacity" in text and ":orange-badge[simulated]" in text
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["L: mean requests in system"] == metrics["λ·W"]      # Little's law, drain window
    ex6 = at.dataframe[-1].value
    assert ex6["contract"].tolist() == ["holds", "FAILED"]
    assert "has **not** improved" in text


def test_load_page_closed_loop_and_bad_input():
    at = open_page("load", {"ld_kind": "closed", "ld_loads": "1,8", "ld_pol": "continuous"})
    (fig,) = charts(at)
    assert arr(fig["data"][0]["x"]) == [1, 8]
    assert fig["layout"]["xaxis3"]["title"]["text"] == "clients in a closed loop"
    at = open_page("load", {"ld_loads": "5,abc"})
    assert [e.value for e in at.error] == ["loads: 'abc' is not a number"] and not charts(at)


def test_measured_runs_state_their_load():
    from core.lessons.load import measured_point, run_load
    from core.trace import load_trace, open_trace
    vllm = open_trace(DATA / "imports" / "vllm_cpu_tiny_burst64.json")
    assert run_load(vllm.trace, vllm.file_summary) == {"kind": "closed", "concurrency": 16}
    p = measured_point("v", vllm.trace, None, vllm.file_summary)
    assert p["ttft_ms"]["p99"] == pytest.approx(vllm.file_summary["p99_ttft_ms"])   # vLLM's own number
    lg = load_trace(DATA / "traces" / "runner_served_tiny_loadgen.json.gz")          # note of an older capture
    assert run_load(lg) == {"kind": "closed", "concurrency": 16}
    assert run_load(load_trace(DATA / "traces" / "shared_prefix_measured_cpu.json.gz")) is None
    lg.meta["load"] = {"kind": "open", "rate": 7.5, "seed": 0}                        # what loadgen writes now
    assert run_load(lg)["rate"] == 7.5


@pytest.mark.slow   # seconds: out of the fast loop
def test_load_page_draws_measured_runs_of_the_same_kind():
    at = open_page("load", {"ld_kind": "closed", "ld_loads": "1,16"})
    (fig,) = charts(at)
    names = {t.get("name") for t in fig["data"]}
    assert {"measured: vllm_cpu_tiny_loadgen.json.gz", "measured: runner_served_tiny_loadgen.json.gz"} <= names
    diamonds = [t for t in fig["data"] if t.get("name") == "measured: vllm_cpu_tiny_loadgen.json.gz"]
    assert all(arr(t["x"]) == [16] for t in diamonds)
    at = open_page("load", {})   # open loop: the closed-loop captures are not drawn
    assert not any(str(t.get("name", "")).startswith("measured") for t in charts(at)[0]["data"])


@pytest.mark.slow   # seconds: out of the fast loop
def test_a_sweep_directory_or_a_guidellm_file_brings_every_run_as_a_point():
    """vllm bench sweep's output directory (12 runs: max_seqs 2 and 16 x concurrency 1, 2, 4, two
    runs each) and guidellm's file of three benchmarks: each run a diamond at the load it ran."""
    sweep = "vllm bench sweep against our server: max_seqs 2 and 16 x concurrency 1, 2, 4 (12 runs)"
    gl = "guidellm 0.8.1 against our server: concurrency 1, 2, 4"
    at = open_page("load", {"ld_kind": "closed", "ld_loads": "1,2,4"})
    at.multiselect(key="ld_meas").set_value([sweep, gl]).run()
    assert not at.exception
    (fig,) = charts(at)
    measured = [t for t in fig["data"] if str(t.get("name", "")).startswith("imported: ")]   # by origin
    names = {t["name"] for t in measured}
    assert len([n for n in names if n.startswith(f"imported: {sweep} [")]) == 12
    assert {f"imported: {gl} [concurrent@{c}]" for c in (1, 2, 4)} <= names
    for t in measured:
        label = t["name"]
        want = 4 if "concurrency=4" in label or "@4" in label else 2 if "concurrency=2" in label or "@2" in label else 1
        assert arr(t["x"]) == [want]


SEARCH_LINK = {"ld_s_ms": "8,16,64", "ld_s_tb": "2048,8192", "ld_s_kb": "none", "ld_s_rate": "20", "ld_s_usd": "4"}


def searched_here():
    """core.experiments.search on the page's defaults and SEARCH_LINK's grid, run here."""
    from core.analysis.metrics import SLO
    from core.config import SchedulerConfig
    from core.experiments.search import search
    from core.lessons.schedules import policy_config
    from core.sim.stepmodel import StepModel
    from core.workload import load_workload
    return search(load_workload(DATA / "workloads" / "poisson500_vidur.csv"),
                  policy_config("chunked", SchedulerConfig(), 512),
                  StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05),
                  {"max_seqs": [8, 16, 64], "token_budget": [2048, 8192], "kv_blocks": [None]}, 20.0,
                  SLO(ttft_ms=500.0, tpot_ms=50.0), target=0.9, seed=0, usd_per_hour=4.0, workers=1)


def search_chart(at):
    figs = [f for f in charts(at) if (f["layout"].get("title") or {}).get("text", "").startswith("Capacity search")]
    return figs[0] if figs else None


def test_a_link_never_starts_the_capacity_search():
    """Issue 36 item 22: a link restores the search's inputs, not its run (the old "run" switch in the
    link, ld_s_run=true, is ignored); the search runs on the page's button only."""
    at = open_page("load", {**SEARCH_LINK, "ld_s_run": "true"})
    assert search_chart(at) is None and "ld_search_done" not in at.session_state
    assert [b.label for b in at.button if b.key == "ld_s_go"] == ["Run the search (6 configurations)"]
    at.button(key="ld_s_go").click().run()
    assert not at.exception and search_chart(at) is not None


def test_a_grid_past_the_pages_work_cap_is_refused_before_any_work():
    """configurations x the workload's prompt + output tokens (counted here from the bundled CSV) past
    core.lessons.load.SEARCH_MAX_TOKENS: one error naming the numbers, no button to start it."""
    import csv
    with open(DATA / "workloads" / "poisson500_vidur.csv") as f:
        rows = list(csv.DictReader(f))
    tokens = sum(int(r["num_prefill_tokens"]) + int(r["num_decode_tokens"]) for r in rows)
    n = 100 * 2
    at = open_page("load", {**SEARCH_LINK, "ld_s_ms": ",".join(str(k) for k in range(1, 101))})
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and f"{n} configurations x {tokens:,} tokens" in errors[0], errors
    assert f"{n * tokens / 1e6:,.1f} M simulated tokens; at most 40 M per search on this page" in errors[0]
    assert not [b for b in at.button if b.key == "ld_s_go"] and search_chart(at) is None


def test_one_search_at_a_time_per_session():
    """A search still running in this session (its lock held): the button says so instead of starting
    another."""
    import threading
    at = open_page("load", SEARCH_LINK)
    held = threading.Lock()
    held.acquire()
    at.session_state["ld_search_lock"] = held
    at.button(key="ld_s_go").click().run()
    assert any("still running" in w.value for w in at.warning)
    assert search_chart(at) is None and "ld_search_done" not in at.session_state
    held.release()
    at.button(key="ld_s_go").click().run()
    assert search_chart(at) is not None


def test_the_capacity_search_section_answers_as_the_search_does():
    """Issue 29 part 3 and issue 36 item 25: the Load page's search is core.experiments.search on the page's
    workload, SLOs and step model. Its chart: every simulated configuration drawn, those with the same
    result on one marker labelled with their count, the answer starred, the cost axis in plain USD;
    its table: no "None", an em dash with the reason, notes that fit their column; "Open this
    configuration" opens the Schedules page on the searched workload with the answer's settings."""
    want = searched_here()
    at = open_page("load", SEARCH_LINK)
    at.button(key="ld_s_go").click().run()
    assert not at.exception and not at.error
    best = want["best"]["config"]
    said = at.success[0].value
    assert f"max\\_seqs {best['max_seqs']}, token\\_budget {best['token_budget']}" in said
    fig = search_chart(at)
    marks = {t["name"]: t for t in fig["data"]}
    assert {"meets the SLOs", "misses them", "cheapest meeting the SLOs"} <= set(marks)
    # configurations with the same (goodput, cost): counted here from the search's own points
    same: dict = {}
    for p in want["points"]:
        if "meets" in p and p["cost_per_1k_good_tokens_usd"] is not None:
            same.setdefault((p["meets"], round(p["slo"]["goodput_tok_per_s"], 6)), []).append(p)
    assert any(len(g) > 1 for g in same.values())          # this grid has coincident results (budgets 2048, 8192)
    drawn = {}
    for name in ("meets the SLOs", "misses them"):
        t = marks[name]
        for x, text, cd in zip(arr(t["x"]), t["text"], t["customdata"]):
            drawn[(name == "meets the SLOs", round(x, 6))] = (cd[2], text)
    assert {k: n for k, (n, _) in drawn.items()} == {k: len(g) for k, g in same.items()}
    assert all(text == (f"×{n}" if n > 1 else "") for n, text in drawn.values())
    star = marks["cheapest meeting the SLOs"]
    assert arr(star["x"]) == [want["best"]["slo"]["goodput_tok_per_s"]]
    assert arr(star["y"]) == [want["best"]["cost_per_1k_good_tokens_usd"]]
    y = fig["layout"]["yaxis"]
    assert y["exponentformat"] == "none" and "s" not in y["tickformat"]      # no SI prefix (µ) on USD
    table = next(d for d in at.dataframe if "note" in d.value.columns)
    cells = table.value.astype(str).to_numpy().ravel().tolist()
    assert "None" not in cells and "nan" not in cells
    for p, (_, row) in zip(want["points"], table.value.iterrows()):
        if p.get("pruned"):
            assert row["goodput tok/s"] == "—" and row["note"].startswith("stopped early: ")
    from core.lessons.load import NOTE_CHARS
    assert max(len(n) for n in table.value["note"]) <= NOTE_CHARS
    assert json.loads(table.proto.columns)["note"]["width"] == "large"
    at.session_state["_prev_sc"] = "Chapter 31"       # Schedules seen before in this session: its preset must not win
    at.button(key="ld_s_open").click().run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Schedules"]
    assert any("Workload: 500 requests" in c.value for c in at.caption)
    assert any("capacity search" in c.value for c in at.caption)
    assert at.number_input(key="ms").value == best["max_seqs"] and at.number_input(key="tb").value == \
        best["token_budget"]
    assert at.pills(key="pol").value == ["chunked"]
    # opened as a link is: the Upload scenario's preset did not add its own values to the address
    assert set(at.query_params) <= {"sc", "pol", "ms", "tb", "kb", "ch", "bs", "s_kind", "s_base", "s_pp", "s_pd",
                                    "usd"}
