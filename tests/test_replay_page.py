"""The trace replay page, headless: bundled traces, the cursor, uploads good and bad,
engine results, comparisons and predictions."""
import json
import re

import pytest

from tests.conftest import DATA
from tests.helpers import arr, charts, fleet_e2e_error_median, growing, open_page


def replay(params=None):
    return open_page("replay", params)


def batch_title(at):
    for f in charts(at):
        title = (f["layout"].get("title") or {}).get("text", "")
        if title.startswith("Step "):
            return title
    return None


def test_given_trace_metrics_and_missing_views_named():
    at = replay({"tr": "chapter31_continuous.json"})
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["output tok/s"] == "30.0"
    assert (metrics["TTFT p50 ms"], metrics["TTFT p99 ms"]) == ("130", "139.8")   # linear: 130 + .98*10
    said = " ".join(i.value for i in [*at.info, *at.caption])
    for needed in ("`step` events", "`kv` events", "`spec` events", "`tiles` events"):
        assert needed in said


def test_moving_the_cursor_changes_the_batch_view():
    at = replay({"tr": "shared_prefix_caching_on.json.gz"})
    first = batch_title(at)
    assert first and first.startswith("Step ")
    slider = at.slider(key="rp_cursor")
    at.slider(key="rp_cursor").set_value(slider.min + (slider.max - slider.min) * 0.1).run()
    second = batch_title(at)
    assert second != first
    heat = [f for f in charts(at) if f["data"] and f["data"][0]["type"] == "heatmap"]
    assert heat, "KV occupancy view missing for a trace with kv events"


def test_upload_good_then_garbage_keeps_the_previous_trace():
    at = replay({"tr": "Upload a file…"})
    good = (DATA / "traces" / "chapter31_serial.json").read_bytes()
    at.file_uploader(key="rp_upload").set_value(("mine.json", good, "application/json")).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["output tok/s"] == "16.7"
    bad = ("bad.json", b'{"schema": "serving-trace/7"}', "application/json")
    at.file_uploader(key="rp_upload").set_value(bad).run()
    assert not at.exception
    errors = " ".join(e.value for e in at.error)
    assert "bad.json" in errors and "unknown version 'serving-trace/7'" in errors
    assert {m.label: m.value for m in at.metric}["output tok/s"] == "16.7"   # still the good one
    assert any("last file that loaded: mine.json" in c.value for c in at.caption)


def test_uploads_with_same_name_and_tokens_never_share_cached_results():
    """Issue 10 item 13: results derived from a trace are cached per trace object; two uploads with
    the same file name and the same requests and token counts (the chapter's serial and continuous
    schedules) must each show their own numbers, also after the other was collected."""
    import gc
    at = replay({"tr": "Upload a file…"})
    files = {"16.7": (DATA / "traces" / "chapter31_serial.json").read_bytes(),
             "30.0": (DATA / "traces" / "chapter31_continuous.json").read_bytes()}
    for expected in ["16.7", "30.0", "16.7", "30.0"]:
        at.file_uploader(key="rp_upload").set_value(("mine.json", files[expected], "application/json")).run()
        assert not at.exception
        assert {m.label: m.value for m in at.metric}["output tok/s"] == expected
        gc.collect()


@pytest.mark.parametrize("blob,msg", [
    (b"\x1f\x8b\x08\x00\x00", "gzip"),
    (b"not json at all", "not a format we read"),
    (json.dumps({"schema": "serving-trace/1", "meta": {"source": "given"},
                 "requests": [{"id": "A", "arrival_ms": 10, "prompt_tokens": 1, "max_output_tokens": 1}],
                 "events": [{"t_ms": 5, "type": "token", "req": "A", "index": 0}]}).encode(), "before its arrival"),
])
def test_bad_uploads_get_clear_messages(blob, msg):
    at = replay({"tr": "Upload a file…"})
    at.file_uploader(key="rp_upload").set_value(("x.json", blob, "application/json")).run()
    assert not at.exception
    assert any(msg in e.value for e in at.error)


def test_vllm_result_file():
    at = replay({"tr": "vllm_example_result.json"})
    assert {m.label: m.value for m in at.metric}["requests"] == "40"
    assert any("failed request" in w.value for w in at.warning)
    assert any("No send times" in i.value for i in at.info)
    agree = [d.value for d in at.dataframe if "file" in d.value.columns]
    assert agree, "agreement table missing"
    t = agree[0]
    assert ((t["file"] - t["ours"]).abs() < 1e-6).all()


def test_compare_caching_on_off_and_predict():
    at = replay({"tr": "shared_prefix_caching_on.json.gz", "rp_cmp": "shared_prefix_caching_off.json.gz"})
    table = [d.value for d in at.dataframe if "difference" in d.value.columns][0].set_index("metric")
    on, off = table.columns[0], table.columns[1]
    assert table.loc["TTFT mean (ms)", on] < table.loc["TTFT mean (ms)", off]   # caching saves prefill
    assert not at.warning                                                       # same workload
    titles = [(f["layout"].get("title") or {}).get("text", "") for f in charts(at)]
    assert len([t for t in titles if "CDF" in t and "error" not in t]) == 3
    at.button(key="rp_predict").click().run()
    assert at.selectbox(key="rp_cmp").value == "Predicted by the simulator"
    assert any("Prediction: core simulator, affine" in c.value for c in at.caption)


def test_compare_different_workloads_warns():
    at = replay({"tr": "chapter31_serial.json", "rp_cmp": "shared_prefix_caching_on.json.gz"})
    assert any("workloads differ" in w.value for w in at.warning)


def test_measured_trace_shows_device_and_predicts():
    at = replay({"tr": "shared_prefix_measured_cpu.json.gz"})
    text = " ".join(m.value for m in at.markdown).replace("\\", "")  # (user text is shown escaped)
    assert ":green-badge[measured] CPU" in text and "gpu_runner" in text    # origin, then device and engine
    at.button(key="rp_predict").click().run()
    assert not at.exception
    table = [d.value for d in at.dataframe if "difference" in d.value.columns][0]
    assert table.columns[2] == "predicted (simulated)"
    assert not at.warning                                              # same workload on both sides


def test_how_good_is_the_simulator_on_a_measured_run():
    at = replay({"tr": "shared_prefix_measured_cpu.json.gz"})
    assert "How good is the simulator?" in [h.value for h in at.header]
    summary = [d.value for d in at.dataframe if "median error" in d.value.columns][0]
    assert set(summary["requests"]) == {"held out", "in sample"} and set(summary["metric"]) == {"TTFT", "E2E"}
    # the held-out requests' errors: |predicted - measured| / measured from the worst-requests table
    worst = [d.value for d in at.dataframe if "e2e_ms_error" in d.value.columns][0]
    assert worst["held_out"].all()
    got = (worst["e2e_ms_predicted"] - worst["e2e_ms_measured"]).abs() / worst["e2e_ms_measured"]
    assert ((got - worst["e2e_ms_error"]).abs() < 1e-12).all()
    assert summary.loc[(summary["requests"] == "held out") & (summary["metric"] == "E2E"), "max error"].item() \
        == pytest.approx(worst["e2e_ms_error"].max())
    titles = [(f["layout"].get("title") or {}).get("text", "") for f in charts(at)]
    assert "TTFT error CDF" in titles and "E2E error CDF" in titles
    fit_on = at.selectbox(key="rp_fid_on").options
    assert "vllm_cpu_tiny_burst64.json" not in fit_on and "shared_prefix_caching_on.json.gz" in fit_on
    at.segmented_control(key="rp_fid_model").set_value("affine").run()
    assert not at.exception and any("affine:" in c.value for c in at.caption if "Fitted on" in c.value)


@pytest.mark.slow   # seconds: out of the fast loop
def test_an_engines_result_file_is_predicted_from_its_requests():
    at = replay({"tr": "vllm_cpu_tiny_burst64.json"})
    at.number_input(key="rp_rf_ms").set_value(16)
    at.number_input(key="rp_rf_bs").set_value(128)
    at.button(key="rp_predict_requests").click().run()
    assert not at.exception and not at.error
    assert at.selectbox(key="rp_cmp").value == "Predicted by the simulator"
    cap = [c.value for c in at.caption if c.value.startswith("Prediction: core simulator (vllm-v1)")]
    # the file streams per-token times: by default the steps are read off them; it was a closed loop
    # of 16 clients (request rate inf, max concurrency 16), and is predicted as one
    assert cap and "steps inferred from the streamed token times" in cap[0]
    assert "arrivals: a closed loop of 16 clients" in cap[0]
    # the closed loop's arrival times are predicted, so they are not reported as a workload difference
    assert not any("arrival times" in w.value for w in at.warning)
    table = [d.value for d in at.dataframe if "difference" in d.value.columns][0]
    assert table.columns[2] == "predicted (simulated)"
    at.segmented_control(key="rp_rf_method").set_value("requests").run()
    cap = [c.value for c in at.caption if c.value.startswith("Prediction: core simulator (vllm-v1)")]
    assert not at.exception and cap and "fitted to 64 requests" in cap[0]
    # the predicted requests are not in lockstep: TTFTs spread as the measured ones do (the first
    # of each wave alone, then the rest), so no prediction is drawn as vertical CDF lines
    assert not any("same TTFT" in w.value for w in at.warning)


@pytest.mark.slow   # seconds: out of the fast loop
def test_an_engines_result_file_is_tested_against_another_run_of_the_engine():
    """Issue 28 item 2: "How good is the simulator?" for engine results: fit on another result file
    of the same engine (steps read off its token times), every request of this one held out."""
    at = replay({"tr": "vllm_cpu_tiny_c16_p128_o64.json"})
    assert "How good is the simulator?" in [h.value for h in at.header]
    assert "vllm_cpu_tiny_burst64.json" in at.selectbox(key="rp_fid_peer").options
    assert not [d for d in at.dataframe if "median error" in d.value.columns]    # nothing before a choice
    at.selectbox(key="rp_fid_peer").set_value("vllm_cpu_tiny_burst64.json").run()
    assert not at.exception and not at.error
    cap = [c.value for c in at.caption if "Fitted on" in c.value][0]
    assert "burst64" in cap and "closed loop of 16 clients" in cap
    summary = [d.value for d in at.dataframe if "median error" in d.value.columns][0]
    assert set(summary["requests"]) == {"held out"} and set(summary["n"]) == {64}
    worst = [d.value for d in at.dataframe if "e2e_ms_error" in d.value.columns][0]
    # measured E2E as the file has it (latencies, seconds), independent of our reader
    raw = json.loads((DATA / "imports" / "vllm_cpu_tiny_c16_p128_o64.json").read_text())
    e2e = {f"req{i}": 1000 * v for i, v in enumerate(raw["latencies"])}
    for _, row in worst.iterrows():
        assert row["e2e_ms_measured"] == pytest.approx(e2e[row["id"]], rel=1e-12)
    # the fit's non-negativity bound is said where it binds (a step's time does not grow with the batch)
    assert any("held at 0" in i.value for i in at.info)


def test_live_mode_follows_a_growing_file(tmp_path, monkeypatch):
    """Issue 11 part 3: with Live on, the views re-read the file (a new version each time it is
    rewritten) and the counts advance."""
    import os
    import time
    path = tmp_path / "growing.json"
    growing(path, 1)
    monkeypatch.setenv("SERVING_EXPLORER_TRACES", str(tmp_path))
    at = replay({"tr": "growing.json"})
    at.toggle(key="rp_live").set_value(True).run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["requests so far"] == "1"
    growing(path, 3)
    os.utime(path, (time.time() + 5, time.time() + 5))   # a distinct version even within one clock tick
    at.run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["requests so far"] == "3" and metrics["finished"] == "3"
    assert any("Turn live off" in c.value for c in at.caption)


def test_step_cursor_moves_to_neighbouring_steps():
    import numpy as np

    from core.analysis.cursor import step_cursor
    starts = np.array([0.0, 29.6, 45.75, 50.15])
    assert step_cursor(30.0, +1, starts, 0.0, 60.0, 1.0) == 45.75
    assert step_cursor(45.75, +1, starts, 0.0, 60.0, 1.0) == 50.15     # from a step start: the next one
    assert step_cursor(45.75, -1, starts, 0.0, 60.0, 1.0) == 29.6
    assert step_cursor(55.0, +1, starts, 0.0, 60.0, 1.0) == 60.0       # past the last step: the end
    assert step_cursor(0.0, -1, starts, 0.0, 60.0, 1.0) == 0.0
    assert step_cursor(10.0, +1, np.empty(0), 0.0, 60.0, 2.5) == 12.5  # no steps: a fixed stride


def _titles(at):
    return [(f["layout"].get("title") or {}).get("text", "") for f in charts(at)]


def test_a_real_vllm_run_shows_the_engine_from_inside():
    """The bundled merged vLLM run: its own prefix cache (KV events), each request's phases (spans),
    its logged steps (counts), and where every number comes from."""
    at = replay({"tr": "vLLM 0.32 (CPU) run 2: client + iteration log + spans + KV events, merged"})
    assert not at.exception
    titles = " | ".join(_titles(at))
    assert "The engine's prefix cache (its KV events)" in titles and "6 prefix chains" in titles
    assert "Inside the engine, per request" in titles and "The engine's steps, from its iteration log" in titles
    cache = next(f for f in charts(at) if "prefix cache" in (f["layout"].get("title") or {}).get("text", ""))
    stacked = [t for t in cache["data"] if t.get("stackgroup") == "cached"]
    assert len(stacked) == 6 and max(sum(v) for v in zip(*(arr(t["y"]) for t in stacked))) <= 64   # a pool of 64
    said = " ".join(c.value for c in at.caption)
    assert "blocks cached" in said and "Measured by the engine" in said
    assert not any(t.startswith("Step ") and "0 tokens, 0 requests" in t for t in _titles(at))
    assert any(e.label == "Where these numbers come from" for e in at.expander)


@pytest.mark.parametrize("name", ["vLLM 0.32 (CPU) run 2: its prefix cache (KV events)",
                                  "vLLM 0.32 (CPU) run 2: its iteration log",
                                  "AIPerf 0.13 against our server (profile_export.jsonl)",
                                  "guidellm 0.8.1 against our server: concurrency 1, 2, 4"])
def test_every_bundled_tool_file_opens_on_the_replay_page(name):
    at = replay({"tr": name})
    assert not at.exception and not at.error


def test_several_files_of_one_run_are_merged_on_upload():
    run = DATA / "imports" / "vllm_telemetry" / "run2_poisson4_p192_o48"
    at = replay({"tr": "Upload several files of one run (merge)…"})
    files = [(n, (run / n).read_bytes(), "application/octet-stream")
             for n in ("vllm_bench_run2.json", "spans.otlp.jsonl", "server.log", "kv_events.jsonl")]
    at.file_uploader(key="rp_merge_upload").set_value(files).run()
    assert not at.exception and not at.error
    assert {m.label: m.value for m in at.metric}["requests"] == "48"
    titles = " | ".join(_titles(at))
    assert "prefix cache" in titles and "Inside the engine" in titles
    at.file_uploader(key="rp_merge_upload").set_value(files[2:3]).run()      # one file: nothing to merge
    assert any("at least one more file" in i.value for i in at.info)


def test_the_engines_clock_is_shown_beside_the_clients_and_bursts_are_flagged():
    """Issue 36, item 4: the merged vLLM run's client TTFT p50 (57.7 ms) and the engine's own (7.4 ms)
    were shown in different places without a word. Both are in the panel now, and the requests whose 48
    tokens reached the client within a tenth of the engine's decode time are counted and listed."""
    import gzip

    import numpy as np
    doc = json.loads(gzip.decompress((DATA / "traces" / "vllm_cpu_run2_merged.json.gz").read_bytes()))
    reqs = doc["requests"]
    engine_ttft = np.median([r["engine_ttft_ms"] for r in reqs])
    tokens = {}
    for e in doc["events"]:
        if e.get("type") == "token":
            tokens.setdefault(e["req"], []).append(e["t_ms"])
    bursts = [r["id"] for r in reqs if max(tokens[r["id"]]) - min(tokens[r["id"]]) < 0.1 * r["engine_decode_ms"]]
    assert 0 < len(bursts) < len(reqs)
    at = replay({"tr": "vLLM 0.32 (CPU) run 2: client + iteration log + spans + KV events, merged"})
    assert not at.exception
    said = next(c.value for c in at.caption if "Two clocks" in c.value)
    shown = float(re.search(r"TTFT p50 \*\*([\d,.]+) ms", said).group(1).replace(",", ""))
    assert shown == pytest.approx(engine_ttft, abs=0.001)
    assert f"**{len(bursts)} of {len(reqs)}** requests were delivered in a burst" in said
    table = next(d.value for d in at.dataframe if "engine decode ms" in d.value.columns)
    assert sorted(table["id"]) == sorted(bursts)


def test_sparse_server_gauges_are_drawn_as_samples_and_said_to_miss_the_run(tmp_path, monkeypatch):
    """Issue 36, item 5: 6 scrapes 2.5 s apart, all reading 0, were drawn as continuous lines (axis down to
    -1) beside an in-flight chart titled "(no step events)" on a trace with steps."""
    import gzip

    import numpy as np
    doc = json.loads(gzip.decompress((DATA / "traces" / "vllm_cpu_run2_merged.json.gz").read_bytes()))
    t = sorted(e["t_ms"] for e in doc["events"] if e.get("type") == "gauge" and "running" in e)   # the scrapes
    gap = np.median(np.diff(t))
    at = replay({"tr": "vLLM 0.32 (CPU) run 2: client + iteration log + spans + KV events, merged"})
    assert not at.exception
    fig = next(f for f in charts(at) if "Server gauges" in (f["layout"].get("title") or {}).get("text", ""))
    assert f"{len(t)} samples" in fig["layout"]["title"]["text"] and len(t) < 50
    assert all(tr_["mode"] == "markers" for tr_ in fig["data"] if tr_["name"] in ("running (server)",
                                                                                "waiting (server)"))
    assert fig["layout"]["yaxis"]["rangemode"] == "nonnegative"
    # a bundled example says it in a caption (issue 48 item 16a: no warning boxes before anything else)
    said = " ".join(c.value for c in at.caption)
    assert "miss this run's activity" in said and f"{len(t)} scrapes, a median {gap:,.0f} ms apart" in said
    assert not at.warning
    titles = " | ".join(_titles(at))
    assert "(no step events)" not in titles
    # the same file as the user's own: a warning box
    (tmp_path / "mine.json.gz").write_bytes((DATA / "traces" / "vllm_cpu_run2_merged.json.gz").read_bytes())
    monkeypatch.setenv("SERVING_EXPLORER_TRACES", str(tmp_path))
    at = replay({"tr": "mine.json.gz"})
    assert any("miss this run's activity" in w.value for w in at.warning)


def test_a_tools_own_percentiles_are_the_headline_with_ours_beside():
    """Issue 36, item 7: guidellm reports nearest-rank percentiles; the headline showed ours (linear),
    which differ. The file's figure is the headline now, marked and with its estimator named, ours beside."""
    doc = json.loads((DATA / "imports" / "guidellm" / "concurrent1-2-4_p64_o32_n12" / "benchmarks.json").read_text())
    ttft = doc["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"]
    at = replay({"tr": "guidellm 0.8.1 against our server: concurrency 1, 2, 4"})
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["TTFT p50 ms ·file"]) == pytest.approx(ttft["percentiles"]["p50"], abs=0.01)
    assert float(metrics["TTFT p99 ms ·file"]) == pytest.approx(ttft["percentiles"]["p99"], abs=0.01)
    said = " ".join(c.value for c in at.caption)
    assert "guidellm 0.8.1's own figures" in said and "nearest rank" in said and "ours beside them" in said


def test_zero_inter_token_gaps_are_explained_for_each_tool():
    """Issue 36, item 7: tokens that reach the client together are 0 ms gaps in AIPerf's and inference-perf's
    own ITL, one emission in ours; the page says so for each tool whose file has ITL statistics."""
    from core.analysis.tools import itl_note
    from core.trace.imports.sniff import import_directory
    for d, tool in (("aiperf/aiperf_c4_p64_o32", "AIPerf"), ("inference_perf/ip_rate4_p64_o32", "inference-perf")):
        imp = import_directory(DATA / "imports" / d)
        tk = imp.trace.tokens.sort_values(["req", "t_ms"], kind="stable")
        same = int(((tk["req"].diff() == 0) & (tk["t_ms"].diff() == 0)).sum())
        assert same > 0
        note = itl_note(imp)
        assert note.startswith(f"ITL: {same:,} tokens") and tool in note and "gap of 0 ms" in note


def test_a_file_of_several_benchmarks_lets_you_choose_one_and_compares_with_its_figures():
    """Issue 36, item 11: a 3-benchmark guidellm file always opened the first, and its comparison table held
    only the duration."""
    doc = json.loads((DATA / "imports" / "guidellm" / "concurrent1-2-4_p64_o32_n12" / "benchmarks.json").read_text())
    at = replay({"tr": "guidellm 0.8.1 against our server: concurrency 1, 2, 4"})
    assert at.selectbox(key="rp_run").options == ["concurrent@1", "concurrent@2", "concurrent@4"]
    at.selectbox(key="rp_run").set_value("concurrent@4").run()
    assert not at.exception
    ttft = doc["benchmarks"][2]["metrics"]["time_to_first_token_ms"]["successful"]["percentiles"]
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["TTFT p50 ms ·file"]) == pytest.approx(ttft["p50"], abs=0.01)
    agree = next(d.value for d in at.dataframe if "relative_difference" in d.value.columns)
    assert {"ttft_ms", "tpot_ms", "latency_ms"} <= set(agree["metric"])
    row = agree[(agree["metric"] == "ttft_ms") & (agree["stat"] == "p50")].iloc[0]
    assert row["file"] == pytest.approx(ttft["p50"])


def test_an_uploaded_aiperf_export_takes_its_summary_in_a_second_upload():
    """Issue 36, item 11: profile_export.jsonl alone said its summary was missing with no way to add it."""
    d = DATA / "imports" / "aiperf" / "aiperf_c4_p64_o32"
    summary = json.loads((d / "profile_export_aiperf.json").read_text())
    at = replay({"tr": "Upload a file…"})
    at.file_uploader(key="rp_upload").set_value(("profile_export.jsonl", (d / "profile_export.jsonl").read_bytes(),
                                                   "application/json")).run()
    assert not at.exception
    assert "TTFT p50 ms ·file" not in {m.label for m in at.metric}
    at.file_uploader(key="rp_aiperf_summary").set_value(
        ("profile_export_aiperf.json", (d / "profile_export_aiperf.json").read_bytes(), "application/json")).run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["TTFT p50 ms ·file"]) == pytest.approx(summary["time_to_first_token"]["p50"], abs=0.01)
    at.file_uploader(key="rp_aiperf_summary").set_value(("x.json", b'{"a": 1}', "application/json")).run()
    assert any("expected AIPerf's summary" in e.value for e in at.error)


def test_the_default_trace_opens_without_a_notice_box():
    """Issue 48 item 16a: the default (bundled) trace opened with two notice boxes (the gauges' gaps, one
    step of 2,205 outside the fitted range) above what a student should read first."""
    at = replay({})
    assert not at.exception
    assert len(at.warning) + len(at.info) == 0, [w.value for w in [*at.warning, *at.info]]


def test_a_trace_compared_with_itself_shows_the_comparison():
    """Found while timing issue 48 item 17's compare: the default trace compared with itself (one label
    for both) ended in a TypeError (the table's two columns had one name)."""
    at = replay({})
    name = at.selectbox(key="tr").value
    at.selectbox(key="rp_cmp").set_value(name).run()
    assert not at.exception, at.exception
    table = at.dataframe[[k for k, d in enumerate(at.dataframe) if "ratio" in d.value.columns][0]].value
    assert list(table.columns)[1].endswith("(first)") and list(table.columns)[2].endswith("(second)")
    assert (table["ratio"].dropna() == 1.0).all()


def test_a_whole_fleet_is_predicted_by_the_fleet_simulator():
    """Issue 52 item 5: "How good is the simulator?" on a fleet trace predicted it as one engine (64
    decoding sequences a step); the whole fleet is now predicted by the fleet simulator, its E2E error
    computed here from the measured and the simulated trace; one replica is still one engine."""

    from core.trace import load_trace
    at = open_page("replay", {"tr": "fleet_two.json.gz"})
    assert not at.exception
    err = fleet_e2e_error_median(load_trace(DATA / "traces" / "fleet_two.json.gz"))
    row = next(d.value for d in at.dataframe if "routing agreement" in d.value.columns).to_dict("records")[0]
    assert row["E2E error median"] == f"{err:.1%}"
    at = at.selectbox(key="rp_replica").set_value("replica 1 (both)").run()
    assert not at.exception
    assert not any("routing agreement" in d.value.columns for d in at.dataframe)
