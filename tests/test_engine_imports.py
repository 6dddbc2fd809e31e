"""Engine result files beside our traces (issue 11 part 5): requests matched by position when
an import names them generically, and the file's own throughput/duration shown beside ours
with the window each uses."""
import numpy as np

from core.analysis.compare import workload_differences
from core.analysis.metrics import summarize
from core.trace import file_window_comparison, import_vllm, trace_from_doc


def runner_like(prompts, outputs, ids):
    events = []
    for rid, n in zip(ids, outputs):
        events += [{"t_ms": 10.0 + k, "type": "token", "req": rid, "index": k} for k in range(n)]
        events.append({"t_ms": 10.0 + n, "type": "finish", "req": rid, "reason": "length"})
    return trace_from_doc({"schema": "serving-trace/1", "meta": {"source": "measured"},
                           "requests": [{"id": rid, "arrival_ms": 0.0, "prompt_tokens": p, "max_output_tokens": n}
                                        for rid, p, n in zip(ids, prompts, outputs)],
                           "events": events})


def vllm_result(prompts, outputs, starts=None):
    n = len(prompts)
    doc = {"duration": 2.5, "completed": n, "total_output_tokens": sum(outputs), "request_throughput": n / 2.5,
           "output_throughput": sum(outputs) / 2.5, "input_lens": prompts, "output_lens": outputs,
           "ttfts": [0.05] * n, "itls": [[0.01] * (o - 1) for o in outputs], "errors": [""] * n}
    if starts is not None:
        doc["start_times"] = starts
    return doc


def test_generic_ids_are_matched_by_position():
    ours = runner_like([128, 128, 64], [64, 64, 32], ["a", "b", "c"])
    theirs = import_vllm(vllm_result([128, 100, 64], [64, 64, 32])).trace
    diffs = workload_differences(ours, theirs)
    assert diffs[0] == "no request id is shared: the 3 requests are matched by position (arrival order)"
    assert any("1 request(s) have different prompt lengths (#1 (b / req1): 128 vs 100)" in d for d in diffs)
    assert not any("ids differ" in d for d in diffs)
    same = import_vllm(vllm_result([128, 128, 64], [64, 64, 32])).trace
    assert workload_differences(ours, same) == [
        "no request id is shared: the 3 requests are matched by position (arrival order)"]
    # different counts: still reported as id differences
    assert "request ids differ" in workload_differences(ours, import_vllm(vllm_result([1, 2], [3, 4])).trace)[0]


def test_file_throughput_beside_ours_with_the_window_each_uses():
    outputs = [4, 6, 5]
    starts = [100.0, 100.2, 100.5]                      # seconds, as the benchmark writes them
    imp = import_vllm(vllm_result([8, 8, 8], outputs, starts))
    table = file_window_comparison(imp, summarize(imp.trace)).set_index("metric")
    assert table.loc["output throughput (tok/s)", "file"] == sum(outputs) / 2.5
    assert table.loc["duration (s)", "file"] == 2.5
    # ours, computed here from the per-request timeline: first send -> last token
    last_token_s = max(s + 0.05 + 0.01 * (o - 1) for s, o in zip(starts, outputs)) - min(starts)
    assert np.isclose(table.loc["duration (s)", "ours"], last_token_s)
    assert np.isclose(table.loc["output throughput (tok/s)", "ours"], sum(outputs) / last_token_s)
    assert np.isclose(table.loc["request throughput (req/s)", "ours"], 3 / last_token_s)
    assert "drain window" in table.loc["output throughput (tok/s)", "how"]
    # without send times there is no shared window: ours is left empty
    alone = import_vllm(vllm_result([8, 8, 8], outputs))
    assert file_window_comparison(alone, summarize(alone.trace))["ours"].isna().all()


def test_client_queue_times_are_reported_not_added():
    doc = vllm_result([8, 8], [3, 3], starts=[5.0, 5.5])
    doc["queue_times"] = [0.0, 0.25]
    imp = import_vllm(doc)
    note = " ".join(imp.notes)
    assert "mean 125.000 ms, max 250.000 ms" in note and "not part of TTFT" in note
    # TTFT still starts at the send: 50 ms for both, as the file says
    assert np.allclose(summarize(imp.trace)["summary"]["ttft_ms"]["mean"], 50.0)
