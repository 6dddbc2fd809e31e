"""Other tools' real files (data/imports/: how each was made is in its MADE.md) import through the
one open, and our metrics equal the tool's own, computed its way (estimator, weighting, window)."""
import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest

from core.__main__ import main
from core.analysis.metrics import request_metrics, summarize
from core.analysis.tools import tool_comparison
from core.errors import TraceError
from core.trace import Imported, load_trace, open_trace, save_trace

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = ROOT / "data" / "imports"
TELEMETRY = IMPORTS / "vllm_telemetry"
RUNS = ("run1_c4_p128_o32", "run2_poisson4_p192_o48")

PER_REQUEST = [
    "aiperf/aiperf_c4_p64_o32", "aiperf/aiperf_n24_c2_p128_o16", "aiperf/aiperf_n24_c4_p64_o32_raw",
    "aiperf/aiperf_c4_p64_o32/profile_export.jsonl", "aiperf/aiperf_n24_c4_p64_o32_raw/profile_export_raw.jsonl",
    "inference_perf/ip_rate4_p64_o32", "inference_perf/ip_conc2_n12_p128_o16",
    "inference_perf/ip_rate4_p64_o32/per_request_lifecycle_metrics.json",
    "guidellm/concurrent4_p64_o32_n48/benchmarks.json", "guidellm/concurrent4_p64_o32_n48/benchmarks.yaml",
    "guidellm/concurrent1-2-4_p64_o32_n12/benchmarks.json",
    "vllm_sweep/maxseqs_x_concurrency", "vllm_sweep/named_poisson",
    "sglang/sglang_c4_p64_o32_n24/sglang_bench.jsonl", "sglang/sglang_rate20_p64_o32_n24/sglang_bench.jsonl",
]
# The must-hold statistics: TTFT, TPOT, E2E (or the tool's request latency) mean / p50 / p99, output tok/s
MUST = {(m, s) for m in ("ttft_ms", "tpot_ms", "e2e_ms", "latency_ms") for s in ("mean", "p50", "p99")} | {
    ("output_tok_per_s", "value")}


def runs_of(rel):
    imp = open_trace(IMPORTS / rel)
    assert isinstance(imp, Imported) and imp.trace is not None
    return imp.runs or [imp]


@pytest.mark.parametrize("rel", PER_REQUEST)
def test_every_client_file_gives_the_clients_own_numbers(rel):
    for imp in runs_of(rel):
        table = tool_comparison(imp)
        got = {(r.metric, r.stat): r for r in table.itertuples()}
        must = MUST & set(got)
        # no send times in the file (SGLang's): no shared window, so no throughput to compare
        wanted = {"ttft_ms", "tpot_ms"} | (set() if imp.aligned_at_zero else {"output_tok_per_s"})
        assert wanted <= {m for m, _ in must}, sorted(got)
        assert {"e2e_ms", "latency_ms"} & {m for m, _ in must}
        for key in must:
            r = got[key]
            tol = 0.02 if key[0] == "tpot_ms" else 0.01
            assert abs(r.ours - r.file) <= tol * abs(r.file), (rel, imp.run_label, key, r.ours, r.file)
        assert all(r.file_definition for r in table.itertuples())   # every value says where it came from
        assert imp.trace.meta["provenance"]
        assert imp.aligned_at_zero or imp.trace.meta["clock"]["kind"] in ("epoch", "perf_counter")


def test_aiperf_per_request_values_are_aiperfs(tmp_path):
    d = IMPORTS / "aiperf" / "aiperf_c4_p64_o32"
    recs = [json.loads(ln) for ln in (d / "profile_export.jsonl").read_text().splitlines()]
    m = request_metrics(open_trace(d).trace).set_index("id")
    for r in recs:
        rid, mm = r["metadata"]["x_request_id"], r["metrics"]
        assert m.loc[rid, "ttft_ms"] == pytest.approx(mm["time_to_first_token"]["value"], abs=1e-6)
        assert m.loc[rid, "e2e_ms"] == pytest.approx(mm["request_latency"]["value"], abs=1e-6)
        assert m.loc[rid, "tpot_ms"] == pytest.approx(mm["inter_token_latency"]["value"], abs=1e-6)
        assert m.loc[rid, "output_tokens"] == mm["output_sequence_length"]["value"]
    # the raw export, read from its responses' perf_ns, gives the same requests as the profile export
    raw = open_trace(IMPORTS / "aiperf" / "aiperf_n24_c4_p64_o32_raw" / "profile_export_raw.jsonl")
    ref = open_trace(IMPORTS / "aiperf" / "aiperf_n24_c4_p64_o32_raw" / "profile_export.jsonl")
    a, b = request_metrics(raw.trace).set_index("id"), request_metrics(ref.trace).set_index("id")
    assert sorted(a.index) == sorted(b.index)
    assert np.allclose(a.loc[b.index, "ttft_ms"], b["ttft_ms"], atol=1e-3)
    assert np.allclose(a.loc[b.index, "e2e_ms"], b["e2e_ms"], atol=1e-3)
    # the artifact directory brings the /metrics scrapes as gauge events
    tr = open_trace(IMPORTS / "aiperf" / "aiperf_n24_c2_p128_o16").trace
    gauges = tr.events_of("gauge")
    assert gauges and all("running" in g and "kv_usage" in g for g in gauges)


def test_guidellm_sweep_is_several_runs_and_tokens_are_interpolated():
    imp = open_trace(IMPORTS / "guidellm" / "concurrent1-2-4_p64_o32_n12" / "benchmarks.json")
    assert [r.run_label for r in imp.runs] == ["concurrent@1", "concurrent@2", "concurrent@4"]
    doc = json.loads((IMPORTS / "guidellm" / "concurrent1-2-4_p64_o32_n12" / "benchmarks.json").read_text())
    for run, bench in zip(imp.runs, doc["benchmarks"]):
        reqs = bench["requests"]["successful"]
        assert len(run.trace.requests) == len(reqs) == 12
        m = request_metrics(run.trace).set_index("id")
        for r in reqs:
            t = r["info"]["timings"]
            assert m.loc[r["request_id"], "ttft_ms"] == pytest.approx(
                (t["first_token_iteration"] - t["request_start"]) * 1000, abs=1e-6)
            assert m.loc[r["request_id"], "tpot_ms"] == pytest.approx(r["inter_token_latency_ms"], rel=1e-9)
        assert "interpolated" in " ".join(run.notes)


def test_inference_perf_token_times_are_its_own():
    f = IMPORTS / "inference_perf" / "ip_conc2_n12_p128_o16" / "per_request_lifecycle_metrics.json"
    doc = json.loads(f.read_text())
    tr = open_trace(f).trace
    m = request_metrics(tr).set_index("id")
    t0 = min(r["start_time"] for r in doc)
    for k, r in enumerate(doc):
        times = r["info"]["response_metrics"]["output_token_times"]
        assert m.loc[f"req{k}", "ttft_ms"] == pytest.approx((times[0] - r["start_time"]) * 1000, abs=1e-6)
        assert m.loc[f"req{k}", "latency_ms"] == pytest.approx((r["end_time"] - r["start_time"]) * 1000, abs=1e-6)
        assert m.loc[f"req{k}", "arrival_ms"] == pytest.approx((r["start_time"] - t0) * 1000, abs=1e-6)


FOREIGN = {
    "aiperf/aiperf_c4_p64_o32/inputs.json": "AIPerf's inputs.json",
    "aiperf/aiperf_c4_p64_o32/profile_export_aiperf.csv": "AIPerf's CSV summary",
    "aiperf/aiperf_c4_p64_o32/server_metrics_export.json": "AIPerf's server-metrics aggregate",
    "aiperf/aiperf_c4_p64_o32/server_metrics_export.csv": "AIPerf's server-metrics CSV",
    "guidellm/concurrent4_p64_o32_n48/benchmarks.csv": "guidellm's CSV summary",
    "inference_perf/ip_rate4_p64_o32/validation.json": "inference-perf's validation.json",
}


@pytest.mark.parametrize("rel", sorted(FOREIGN))
def test_a_file_we_do_not_read_gets_one_line_naming_it(rel, capsys):
    assert main(["metrics", str(IMPORTS / rel)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and FOREIGN[rel] in err and "schema" not in err and "Traceback" not in err


def test_summary_only_files_say_where_the_requests_are(tmp_path, capsys):
    src = IMPORTS / "aiperf" / "aiperf_c4_p64_o32" / "profile_export_aiperf.json"
    alone = tmp_path / "profile_export_aiperf.json"
    alone.write_bytes(src.read_bytes())
    imp = open_trace(alone)
    assert imp.trace is None and "profile_export.jsonl" in imp.notes[0] and imp.stats
    assert main(["metrics", str(alone), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == [] and out["tool"] == "AIPerf 0.13.0"
    # beside its records it opens them
    assert open_trace(src).trace is not None
    imp = open_trace(IMPORTS / "inference_perf" / "ip_rate4_p64_o32" / "summary_lifecycle_metrics.json")
    assert imp.trace is None and "per_request_lifecycle_metrics.json" in imp.notes[0]


ITER = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
                  r"(\d+) generation tokens, iteration elapsed time: ([0-9.]+) ms")


@pytest.mark.parametrize("run", RUNS)
def test_the_iteration_log_gives_one_step_per_line(run):
    log = TELEMETRY / run / "server.log"
    lines = [ITER.search(ln).groups() for ln in log.read_text().splitlines() if "Iteration(" in ln]
    imp = open_trace(log)
    st = imp.trace.steps
    assert len(st) == len(lines) > 100 and not len(imp.trace.requests)
    assert st["step"].tolist() == [int(g[0]) for g in lines]
    assert st["dur_ms"].tolist() == [float(g[5]) for g in lines]
    assert st["prefill_tokens"].tolist() == [int(g[2]) for g in lines]
    assert st["decode_reqs"].tolist() == [int(g[3]) for g in lines]
    t, d = st["t_ms"].to_numpy(), st["dur_ms"].to_numpy()
    assert (t[1:] >= t[:-1] + d[:-1] - 1e-9).all()        # back to back at the earliest, never overlapping
    assert len(imp.trace.events_of("gauge")) == len(lines)  # the KV usage of every line


def test_fit_a_step_model_to_vllms_own_steps(capsys):
    log = TELEMETRY / RUNS[0] / "server.log"
    assert main(["fit", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sm, fit = out["step_model"], out["fit"]
    # one 99 ms step (the 2-core machine) dominates the squared error of this run: the typical step is what
    # the fit gets right
    assert sm["kind"] == "affine" and fit["steps"] > 100 and fit["relative_error"]["p50"] < 0.3
    assert sm["prefill_ms_per_token"] > 0 and sm["base_ms"] > 0
    assert main(["fit", str(log), "--model", "features"]) == 2
    assert "counts, not batch entries" in capsys.readouterr().err


def _span_attrs(path: Path) -> dict:
    """request id -> {attribute: value} of the llm_request spans, read here with json alone."""
    out = {}
    for ln in path.read_text().splitlines():
        for rs in json.loads(ln)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    if sp["name"] != "llm_request":
                        continue
                    a = {x["key"]: next(iter(x["value"].values())) for x in sp["attributes"]}
                    out[a["gen_ai.request.id"]] = a
    return out


@pytest.mark.parametrize("run", RUNS)
def test_spans_give_requests_with_vllms_own_ttft_and_e2e(run):
    spans = _span_attrs(TELEMETRY / run / "spans.otlp.jsonl")
    for f in ("spans.otlp.jsonl", "otlp_bodies.jsonl"):      # OTLP/JSON lines, and the protobuf bodies as received
        tr = open_trace(TELEMETRY / run / f).trace
        m = request_metrics(tr).set_index("id")
        assert sorted(m.index) == sorted(spans)
        for rid, a in spans.items():
            assert m.loc[rid, "ttft_ms"] == pytest.approx(a["gen_ai.latency.time_to_first_token"] * 1000, abs=1e-6)
            assert m.loc[rid, "e2e_ms"] == pytest.approx(a["gen_ai.latency.e2e"] * 1000, abs=1e-6)
            assert m.loc[rid, "output_tokens"] == int(a["gen_ai.usage.completion_tokens"])
        extra = tr.request_extra[0]
        assert {"engine_queue_ms", "engine_prefill_ms", "engine_decode_ms"} <= extra.keys()


def _decoded_counts(run: str) -> dict:
    """Blocks stored / removed and clears, from the recorder's own decode (msgpack, in vLLM's
    environment: data/imports/vllm_telemetry/scripts)."""
    c = {"stored_blocks": 0, "removed_blocks": 0, "cleared": 0}
    for ln in (TELEMETRY / run / "kv_events.decoded.jsonl").read_text().splitlines():
        for ev in json.loads(ln)["payload"][1]:
            if ev["type"] == "BlockStored":
                c["stored_blocks"] += len(ev["block_hashes"])
            elif ev["type"] == "BlockRemoved":
                c["removed_blocks"] += len(ev["block_hashes"])
            else:
                c["cleared"] += 1
    return c


@pytest.mark.parametrize("run", RUNS)
def test_kv_events_reproduce_vllms_counts_exactly(run, capsys):
    assert main(["metrics", str(TELEMETRY / run / "kv_events.jsonl"), "--json"]) == 0
    kv = json.loads(capsys.readouterr().out)["summary"]["kv_events"]
    assert {k: kv[k] for k in ("stored_blocks", "removed_blocks", "cleared")} == _decoded_counts(run)
    split = json.loads((TELEMETRY / "split_summary.json").read_text())[run]["kv"]
    assert kv["stored_blocks"] == split["BlockStored_blocks"] and kv["cleared"] == split["AllBlocksCleared"]
    assert 0 < kv["peak_cached_blocks"] <= 64           # vLLM ran with a pool of 64 blocks


def test_kv_event_hashes_survive_every_format_exactly(tmp_path):
    tr = open_trace(TELEMETRY / RUNS[1] / "kv_events.jsonl").trace
    hashes = tr.kv_events["hash"].dropna().tolist()
    assert any(int(h) > 2**53 for h in hashes)
    first = json.loads((TELEMETRY / RUNS[1] / "kv_events.jsonl").read_text().splitlines()[0])
    assert base64.b64decode(first["frames"][0]) == b"kv-events"
    for name in ("t.json", "t.json.gz", "t.parquet"):
        save_trace(tr, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert back.kv_events["hash"].tolist() == tr.kv_events["hash"].tolist()
        assert back.kv_events["op"].tolist() == tr.kv_events["op"].tolist()
        assert summarize(back)["summary"]["kv_events"] == summarize(tr)["summary"]["kv_events"]


def test_a_directory_we_do_not_read_gets_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(TraceError, match="a directory we do not read"):
        open_trace(tmp_path)


def test_merge_joins_a_client_file_the_log_spans_kv_events_and_metrics(tmp_path, capsys):
    run = TELEMETRY / RUNS[1]
    files = [run / f for f in ("vllm_bench_run2.json", "spans.otlp.jsonl", "server.log", "kv_events.jsonl",
                               "metrics_scrapes.jsonl")]
    out = tmp_path / "merged.json.gz"
    assert main(["merge", *map(str, files), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["files"]
    assert [r["clock"] for r in report] == ["perf_counter", "epoch", "wall-clock", "epoch", "epoch"]
    assert all(r["how"] and r["uncertainty_ms"] is not None for r in report)
    assert report[1]["matched"] == "48 of 48"
    assert report[2]["uncertainty_ms"] < 100            # the log's 1 s timestamps, refined against the spans
    tr = load_trace(out)
    # the client's requests, each with the engine's own view of it (its span)
    spans = request_metrics(open_trace(run / "spans.otlp.jsonl").trace).set_index("id")
    views = {e["engine_request_id"]: e for e in tr.request_extra}
    assert sorted(views) == sorted(spans.index)
    for rid, e in views.items():
        assert e["engine_ttft_ms"] == pytest.approx(spans.loc[rid, "ttft_ms"], abs=1e-6)
        assert e["engine_e2e_ms"] == pytest.approx(spans.loc[rid, "e2e_ms"], abs=1e-6)
    # the client's own numbers are untouched
    client = request_metrics(open_trace(run / "vllm_bench_run2.json").trace)
    assert np.allclose(request_metrics(tr)["ttft_ms"], client["ttft_ms"])
    log_steps = len(open_trace(run / "server.log").trace.steps)
    assert len(tr.steps) == log_steps - report[2]["dropped"] > 1000
    assert summarize(tr)["summary"]["kv_events"]["stored_blocks"] == 177
    assert tr.events_of("gauge")
    # files of a run that cannot be aligned: one line
    bad = ["merge", str(run / "server.log"), str(run / "kv_events.jsonl"), "--out", str(tmp_path / "x.json")]
    assert main(bad) == 2
    assert "iteration log" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_the_kv_page_shows_vllms_own_prefix_cache_beside_the_simulators():
    from tests.helpers import charts, open_page
    at = open_page("kv")
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    counts = _decoded_counts(RUNS[1])
    vllm_stored, sim_stored = metrics["blocks stored (vLLM · simulator)"].split(" · ")
    assert int(vllm_stored) == counts["stored_blocks"] and int(sim_stored) > 0
    assert int(metrics["blocks evicted (vLLM · simulator)"].split(" · ")[0]) == counts["removed_blocks"]
    assert int(metrics["most cached at once (vLLM · simulator)"].split(" · ")[1]) <= 64
    fig = next(f for f in charts(at) if "vLLM's own prefix cache" in (f["layout"].get("title") or {}).get("text", ""))
    assert any(t.get("name", "").startswith("simulator") for t in fig["data"])


# ---- issue 36, item 10: AIPerf time slices and phase manifest, inference-perf stage reports, raw OTLP bodies --

def _timeslices_doc(n: int = 3, exact: bool = True) -> dict:
    """AIPerf 0.13's profile_export_aiperf_timeslices.json in its documented shape (exporters/
    timeslice_metrics_json_exporter.py: no file AIPerf wrote with --slice-duration is bundled); older
    releases numbered windows (timeslice_index) and kept --slice-duration in input_config."""
    t0 = 1_796_166_938_735_069_727
    out = []
    for k in range(n):
        s = {"start_ns": t0 + k * 10_000_000_000, "end_ns": t0 + (k + 1) * 10_000_000_000 - 7,
             "is_complete": k < n - 1} if exact else {"timeslice_index": k}
        s["time_to_first_token"] = {"unit": "ms", "avg": 40.0 + k, "min": 30.5, "max": 90.25, "p50": 41.0,
                                    "p90": 60.0, "p99": 80.0, "std": 5.5}
        s["inter_token_latency"] = {"unit": "ms", "avg": 12.0 + k / 4, "p99": 17.75}
        s["request_latency"] = {"unit": "ms", "avg": 400.0 + 10 * k, "p99": 600.0}
        s["output_token_throughput"] = {"unit": "tokens/sec", "avg": 1300.0 - k}
        out.append(s)
    return {"timeslices": out, "input_config": {"artifacts": {"slice_duration": 10}}}


def _timeslices_csv(doc: dict) -> str:
    """The CSV AIPerf writes beside it (timeslice_metrics_csv_exporter.py): one row per statistic."""
    headers = {"time_to_first_token": "Time to First Token", "inter_token_latency": "Inter Token Latency",
               "request_latency": "Request Latency", "output_token_throughput": "Output Token Throughput"}
    rows = ["Timeslice,Start_NS,End_NS,Metric,Unit,Stat,Value"]
    for k, s in enumerate(doc["timeslices"]):
        for tag, header in sorted(headers.items()):
            for stat, v in s[tag].items():
                if stat != "unit":
                    rows.append(f"{k},{s['start_ns']},{s['end_ns']},{header},{s[tag]['unit']},{stat},{v:.2f}")
    return "\n".join(rows) + "\n"


def test_aiperf_time_slices_are_read_as_windows_with_aiperfs_own_statistics(tmp_path, capsys):
    doc = _timeslices_doc()
    p = tmp_path / "profile_export_aiperf_timeslices.json"
    p.write_text(json.dumps(doc, indent=2))
    q = tmp_path / "profile_export_aiperf_timeslices.csv"
    q.write_text(_timeslices_csv(doc))
    t0 = doc["timeslices"][0]["start_ns"]
    for f in (p, q):
        imp = open_trace(f)
        assert imp.kind == "aiperf-timeslices" and imp.trace is None and len(imp.windows) == len(imp.runs) == 3
        for k, (w, s) in enumerate(zip(imp.windows, doc["timeslices"])):
            assert w["window_ms"] == ((s["start_ns"] - t0) / 1e6, (s["end_ns"] - t0) / 1e6)
            assert w["complete"] == (k < 2 or f is q) and imp.runs[k].window_ms == w["window_ms"]  # (CSV: no flag)
            assert w["stats"][("ttft_ms", "mean")] == s["time_to_first_token"]["avg"]      # ms: as written
            assert w["stats"][("ttft_ms", "p99")] == s["time_to_first_token"]["p99"]
            assert w["stats"][("tpot_ms", "mean")] == s["inter_token_latency"]["avg"]     # AIPerf's ITL is our TPOT
            assert w["stats"][("e2e_ms", "mean")] == s["request_latency"]["avg"]
            assert w["stats"][("output_tok_per_s", "value")] == s["output_token_throughput"]["avg"]
        assert main(["metrics", str(f)]) == 0
        out = capsys.readouterr().out
        assert "slice 1 [10, 20] s: TTFT mean 41.000 ms, p99 80.000 ms" in out
        assert ("(a partial window)" in out) == (f is p)
        assert main(["metrics", str(f), "--run", "2", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["file_summary"]["time_to_first_token.avg"] == 42.0
    # an older release's windows, numbered: placed by --slice-duration
    p.write_text(json.dumps(_timeslices_doc(exact=False)))
    assert [w["window_ms"] for w in open_trace(p).windows] == [(0.0, 10000.0), (10000.0, 20000.0), (20000.0, 30000.0)]


def test_aiperf_phase_manifest_names_the_files_to_give_instead(tmp_path, capsys):
    """phase_manifest.json as AIPerf 0.13 writes it (exporters/exporter_manager.py: an index of the phases'
    counts, time ranges and artifact paths)."""
    doc = {"schema_version": 1, "phases": [
        {"phase_index": 0, "profiling_index": None, "phase_name": "warmup", "phase_kind": "warmup", "start_ns": 1,
         "end_ns": 2, "was_cancelled": False, "successful_request_count": 2, "error_request_count": 0,
         "total_request_count": 2, "error_summary": []},
        {"phase_index": 1, "profiling_index": 0, "phase_name": "profiling", "phase_kind": "profiling", "start_ns": 3,
         "end_ns": 4, "was_cancelled": False, "successful_request_count": 48, "error_request_count": 0,
         "total_request_count": 48, "error_summary": [],
         "metrics_json": "phases/profiling/profile_export_aiperf.json"}]}
    p = tmp_path / "phase_manifest.json"
    p.write_text(json.dumps(doc, indent=2, sort_keys=True))
    assert main(["metrics", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "AIPerf's phase_manifest.json" in err and "profile_export.jsonl" in err
    assert "phases/profiling/profile_export_aiperf.json" in err and "not a format we read" not in err


def test_inference_perf_stage_report_gives_its_own_statistics(capsys):
    import yaml
    f = IMPORTS / "inference_perf" / "ip_rate4_p64_o32" / "inference-perf.partial.stage_0.yaml"
    agg = yaml.safe_load(f.read_text())["results"]["request_performance"]["aggregate"]
    imp = open_trace(f)
    assert imp.kind == "inference-perf-stage-report" and imp.trace is None
    for ours, theirs in (("ttft_ms", "time_to_first_token"), ("tpot_ms", "time_per_output_token"),
                         ("itl_ms", "inter_token_latency"), ("latency_ms", "request_latency")):
        for stat, key in (("mean", "mean"), ("p50", "p50"), ("p99", "p99")):
            assert imp.stats[(ours, stat)] == pytest.approx(agg["latency"][theirs][key] * 1000.0, rel=1e-12)
    assert imp.stats[("output_tok_per_s", "value")] == agg["throughput"]["output_token_rate"]["mean"]
    assert imp.file_summary["requests.total"] == 48
    assert main(["metrics", str(f)]) == 0 and "per_request_lifecycle_metrics.json" in capsys.readouterr().out


def test_a_raw_otlp_protobuf_body_is_read_as_spans(tmp_path):
    """The bodies vLLM really sent (otlp_bodies.jsonl, base64), as a raw .pb.gz and .pb: the same requests as
    the recorded lines; the llm_request spans counted here with opentelemetry-proto itself."""
    import gzip

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    lines = (TELEMETRY / RUNS[1] / "otlp_bodies.jsonl").read_text().splitlines()
    bodies = [base64.b64decode(json.loads(x)["body_b64"]) for x in lines]
    raw = b"".join(bodies)                        # protobuf: concatenated messages merge into one
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(raw)
    n = sum(sp.name == "llm_request" for rs in msg.resource_spans for ss in rs.scope_spans for sp in ss.spans)
    want = open_trace(TELEMETRY / RUNS[1] / "otlp_bodies.jsonl").trace
    assert n == len(want.requests) > 0
    for name, data in (("spans.pb.gz", gzip.compress(raw)), ("spans.pb", raw)):
        (tmp_path / name).write_bytes(data)
        imp = open_trace(tmp_path / name)
        assert imp.kind == "otlp-spans" and len(imp.trace.requests) == n
        assert imp.trace.ids == want.ids
        assert imp.trace.tokens["t_ms"].tolist() == want.tokens["t_ms"].tolist()
