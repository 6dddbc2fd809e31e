"""`merge` places every file of a run where it happened and keeps what it holds (issue #36,
items 8 and 9): a server log written in any real time zone (India +05:30, Nepal +05:45) lands
on its requests; engine events before the client's first request (its warm-up) are kept; a
`gpu_runner observe` output keeps its KV events and gauges; a guidellm file of several
benchmarks joins with all of them. Built from the real bundled files (data/imports), with
expected values computed from those files directly (or their MADE.md / split_summary.json)."""
import json
import re
from datetime import datetime, timedelta

import numpy as np
import pytest

from core.__main__ import main
from core.trace import load_trace, open_trace
from core.trace.imports.merge import merge
from tests.conftest import DATA
from tests.helpers import merge_refused

TELEMETRY = DATA / "imports" / "vllm_telemetry"
RUN2 = TELEMETRY / "run2_poisson4_p192_o48"
RUN1 = TELEMETRY / "run1_c4_p128_o32"
OBSERVED = DATA / "imports" / "vllm_observed"
SPLIT = json.loads((TELEMETRY / "split_summary.json").read_text())
STAMP = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def shifted_log(tmp_path, minutes: int):
    """run2's real server log as if written in a time zone `minutes` east of UTC (vLLM wrote it
    in UTC: its timestamps match the spans' epoch times, MADE.md)."""
    def moved(m):
        t = datetime(2026, int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6])) + timedelta(minutes=minutes)
        return f"{m[1]} {t:%m-%d %H:%M:%S}"
    p = tmp_path / f"server_{minutes:+d}min.log"
    p.write_text(STAMP.sub(moved, (RUN2 / "server.log").read_text()))
    return p


def merge_cli(capsys, tmp_path, files, *more):
    out = tmp_path / "merged.json.gz"
    rc = main(["merge", *map(str, files), "--out", str(out), "--json", *more])
    got = capsys.readouterr()
    assert rc == 0, got.err
    return load_trace(out), json.loads(got.out)["files"]


def refused(capsys, tmp_path, files, *words):
    return merge_refused(capsys, tmp_path, files, *words)


def scheduled_epoch_ms(spans_file) -> dict:
    """Each request span's first scheduled time (start + time in queue), epoch ms, read from the
    OTLP/JSON lines directly."""
    out = {}
    for ln in spans_file.read_text().splitlines():
        for rs in json.loads(ln)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    if sp["name"] != "llm_request":
                        continue
                    a = {x["key"]: x["value"] for x in sp["attributes"]}
                    rid = a["gen_ai.request.id"]["stringValue"]
                    q = a.get("gen_ai.latency.time_in_queue", {}).get("doubleValue", 0.0)
                    out[rid] = (int(sp["startTimeUnixNano"]) / 1e6, int(sp["startTimeUnixNano"]) / 1e6 + q * 1000.0)
    return out


def median_distance_to_prefill(tr, spans_file) -> float:
    """Median distance from each request's scheduled time (on the merged clock, through its
    span's start and the merged engine_arrival_ms) to the nearest prefill step start."""
    sched = scheduled_epoch_ms(spans_file)
    offsets = [e["engine_arrival_ms"] - sched[e["engine_request_id"]][0] for e in tr.request_extra]
    assert np.ptp(offsets) < 1e-3          # one offset for every span
    t = np.array(sorted(s for _, s in sched.values())) + offsets[0]
    pre = np.sort(tr.steps[tr.steps["prefill_reqs"] > 0]["t_ms"].to_numpy())
    k = np.clip(np.searchsorted(pre, t), 1, len(pre) - 1)
    return float(np.median(np.minimum(np.abs(t - pre[k - 1]), np.abs(t - pre[k]))))


@pytest.mark.parametrize("minutes, zone", [(330, "UTC+05:30"), (345, "UTC+05:45")])
def test_a_log_written_in_a_half_or_quarter_hour_zone_lands_on_its_requests(capsys, tmp_path, minutes, zone):
    """Asia/Kolkata and Asia/Kathmandu: the old search tried whole hours only and put the steps
    ~30 min away (± 1,793,263 ms) or before the trace's origin (every step dropped), exit 0."""
    base = [RUN2 / "vllm_bench_run2.json", RUN2 / "spans.otlp.jsonl"]
    utc, _ = merge_cli(capsys, tmp_path, [*base, RUN2 / "server.log"])
    tr, report = merge_cli(capsys, tmp_path, [*base, shifted_log(tmp_path, minutes)])
    assert zone in report[2]["how"]
    n_lines = SPLIT["run2_poisson4_p192_o48"]["iteration_lines"]
    assert len(tr.steps) == n_lines == 2167                     # every step, none dropped
    assert median_distance_to_prefill(tr, RUN2 / "spans.otlp.jsonl") < 100.0
    assert report[2]["uncertainty_ms"] < 100.0
    # the same steps, at the same times, as the log written in UTC
    assert np.allclose(tr.steps["t_ms"].to_numpy(), utc.steps["t_ms"].to_numpy(), atol=1e-6)


def test_a_log_in_no_real_time_zone_is_refused(capsys, tmp_path):
    """5 h 37 min from UTC is no zone: no offset puts its steps on the requests, so the log is
    refused (its alignment is less certain than the run is long) instead of being placed wrong."""
    log = shifted_log(tmp_path, 337)
    refused(capsys, tmp_path, [RUN2 / "vllm_bench_run2.json", RUN2 / "spans.otlp.jsonl", log], log.name,
            "more than the run lasts")


def test_engine_events_of_the_warm_up_are_kept(capsys, tmp_path):
    """run1: the client's 16 warm-up requests came 8 s before its 48 profiled ones (MADE.md). The
    engine's steps and KV events of the warm-up are kept (the origin moves to the earliest event),
    and the 16 spans that match no client request are counted in the notes."""
    files = [RUN1 / f for f in ("vllm_bench_run1.json", "spans.otlp.jsonl", "server.log", "kv_events.jsonl",
                                "metrics_scrapes.jsonl")]
    tr, report = merge_cli(capsys, tmp_path, files)
    split = SPLIT["run1_c4_p128_o32"]
    assert report[1]["matched"] == "48 of 48"
    assert len(tr.steps) == split["iteration_lines"] == 784
    kv = tr.kv_events["op"].value_counts()
    assert kv.get("stored", 0) == split["kv"]["BlockStored_blocks"] == 111
    assert kv.get("removed", 0) == split["kv"]["BlockRemoved_blocks"] == 51
    scrapes = len((RUN1 / "metrics_scrapes.jsonl").read_text().splitlines())
    assert len(tr.events_of("gauge")) == scrapes + split["iteration_lines"]   # /metrics pages + the log's KV usage
    first_request = tr.requests["arrival_ms"].min()
    warm_kv = tr.kv_events[tr.kv_events["t_ms"] < first_request]
    assert len(warm_kv) > 0 and (warm_kv["op"] == "stored").all()
    # the warm-up began ~8 s before the profiled run (split_summary marks)
    marks = SPLIT["marks_ns"]
    assert first_request == pytest.approx((marks["run1_start"] - marks["warmup_start"]) / 1e6, abs=3000)
    assert min(tr.steps["t_ms"].min(), tr.kv_events["t_ms"].min()) >= 0.0
    assert "16 of its 64 request spans matched no client request" in tr.meta["notes"]
    assert "origin" in tr.meta["notes"]


def test_events_before_the_first_request_are_kept_not_dropped(capsys, tmp_path):
    """run2: the log's steps and a /metrics page from before the client's first request used to be
    dropped (48 steps, 1 sample); now every one is in the trace."""
    files = [RUN2 / f for f in ("vllm_bench_run2.json", "spans.otlp.jsonl", "server.log", "kv_events.jsonl",
                                "metrics_scrapes.jsonl")]
    tr, report = merge_cli(capsys, tmp_path, files)
    split = SPLIT["run2_poisson4_p192_o48"]
    assert len(tr.steps) == split["iteration_lines"]
    kv = tr.kv_events["op"].value_counts()
    assert kv.get("stored", 0) == split["kv"]["BlockStored_blocks"] and kv.get("cleared", 0) == 1
    scrapes = len((RUN2 / "metrics_scrapes.jsonl").read_text().splitlines())
    assert len(tr.events_of("gauge")) == scrapes + split["iteration_lines"]
    assert all(r["dropped"] == 0 for r in report)
    first_request = tr.requests["arrival_ms"].min()
    assert tr.steps["t_ms"].min() < first_request and min(g["t_ms"] for g in tr.events_of("gauge")) == 0.0


def test_an_observe_output_keeps_its_kv_events_and_gauges(capsys, tmp_path):
    """Session 1 of data/imports/vllm_observed: `gpu_runner observe` wrote 48 request spans, 85 KV
    event rows and 38 gauge samples (MADE.md); merged with client A's file (24 requests), all 85
    rows and 38 samples stay, and the 24 spans of run B are counted as not matched."""
    files = [OBSERVED / "session1_observe" / "vllm_bench_A.json", OBSERVED / "observed.json.gz"]
    tr, report = merge_cli(capsys, tmp_path, files)
    assert report[1]["matched"] == "24 of 24"
    assert len(tr.kv_events) == 85 and len(tr.events_of("gauge")) == 38
    decoded = [json.loads(ln) for ln in (OBSERVED / "session1_observe" / "kv_events.decoded.jsonl").read_text()
               .splitlines()]
    stored = sum(len(ev["block_hashes"]) for d in decoded for ev in d["payload"][1] if ev["type"] == "BlockStored")
    assert (tr.kv_events["op"] == "stored").sum() == stored == 84
    assert "24 of its 48 request spans matched no client request" in tr.meta["notes"]


GUIDELLM = DATA / "imports" / "guidellm" / "concurrent1-2-4_p64_o32_n12" / "benchmarks.json"


def scrapes_during(tmp_path, t0_s: float, t1_s: float, n: int = 5):
    """Real /metrics pages (run2's), as if sampled evenly between two epoch times."""
    pages = [json.loads(ln)["text"] for ln in (RUN2 / "metrics_scrapes.jsonl").read_text().splitlines()][:n]
    p = tmp_path / "metrics_scrapes.jsonl"
    p.write_text("".join(json.dumps({"t_ns": int((t0_s + (t1_s - t0_s) * k / (n - 1)) * 1e9), "text": page}) + "\n"
                         for k, page in enumerate(pages)))
    return p


def guidellm_records():
    doc = json.loads(GUIDELLM.read_text())
    return [(b, r) for b in doc["benchmarks"] for kind in ("successful", "incomplete", "errored")
            for r in b["requests"].get(kind) or []]


def test_every_benchmark_of_a_guidellm_file_is_merged(capsys, tmp_path):
    """Three benchmarks of 12 requests (concurrency 1, 2, 4): the merge used to take benchmark 0
    only; every request of every benchmark is now in the trace, at its own start time."""
    recs = guidellm_records()
    starts = np.array([r["info"]["timings"]["request_start"] for _, r in recs])
    scr = scrapes_during(tmp_path, starts.min(), starts.max())
    tr, report = merge_cli(capsys, tmp_path, [GUIDELLM, scr])
    assert len(tr.requests) == len(recs) == 36
    assert sorted(tr.ids) == sorted(r["request_id"] for _, r in recs)
    arrival = dict(zip(tr.ids, tr.requests["arrival_ms"]))
    for (_, r), s in zip(recs, starts):
        assert arrival[r["request_id"]] == pytest.approx((s - starts.min()) * 1000.0, abs=1e-3)
    assert len(tr.tokens) == sum(r["output_tokens"] for _, r in recs)
    assert sorted({e["run"] for e in tr.request_extra}) == ["concurrent@1", "concurrent@2", "concurrent@4"]
    assert len(tr.events_of("gauge")) == 5
    # one benchmark, chosen
    one, _ = merge_cli(capsys, tmp_path, [GUIDELLM, scr], "--run", "2")
    want = [r["request_id"] for b, r in recs if b is recs[-1][0]]
    assert sorted(one.ids) == sorted(want) and len(want) == 12


def test_a_file_of_runs_on_separate_clocks_asks_which(tmp_path):
    """A vllm bench sweep's runs each have their own perf_counter clock: merged together they
    would be placed arbitrarily, so the merge asks for one (--run K) instead."""
    from core.errors import TraceError
    sweep = open_trace(DATA / "imports" / "vllm_sweep" / "named_poisson")
    assert len(sweep.runs) > 1
    spans = open_trace(RUN2 / "spans.otlp.jsonl")
    with pytest.raises(TraceError, match=r"--run K"):
        merge([sweep, spans], ["named_poisson", "spans.otlp.jsonl"])


def test_spans_with_kv_events_and_gauges_keep_them_when_they_join_a_client():
    """The old join of a spans file took only its spans: an observe output paired with a client
    file by id (here: a client file holding the same 48 requests) lost its 85 KV rows and 38
    gauges. Counts from the observe output itself."""
    from core.trace.model import Trace
    obs = load_trace(OBSERVED / "observed.json.gz")
    client = Trace(meta={**obs.meta, "provenance": {"arrival_ms": "client: when it sent the request"}},
                   requests=obs.requests.copy(), tokens=obs.tokens, finishes=obs.finishes,
                   request_extra=[{} for _ in obs.request_extra])
    tr, report = merge([client, obs], ["client.json", "observed.json.gz"])
    assert report[1]["matched"] == "48 of 48" and report[1]["role"].startswith("engine spans")
    assert len(obs.kv_events) == 85 and len(obs.events_of("gauge")) == 38
    assert tr.kv_events["hash"].tolist() == obs.kv_events["hash"].tolist()
    assert len(tr.events_of("gauge")) == 38


def test_busy_periods_are_placed_with_one_pricing_per_period_and_the_same_result():
    """Issue 48 item 20: merging an iteration log of 2,000 busy periods with 2,000 spans took 16 s: each
    period priced its 1,000 candidate shifts one numpy call at a time. Now one (blocked) call per
    period, with the shifts a plain loop over the candidates gives (computed here)."""
    import numpy as np
    import pandas as pd

    from core.trace.imports import vllm_log
    rng = np.random.default_rng(7)
    n = 2000
    starts = np.cumsum(rng.uniform(30.0, 3000.0, n))              # one two-step busy period each
    steps = pd.DataFrame({"t_ms": np.repeat(starts, 2) + np.tile([0.0, 8.0], n), "dur_ms": np.full(2 * n, 8.0),
                          "prefill_reqs": np.tile([1, 0], n)})
    sched = np.sort(starts + rng.uniform(0.0, 900.0, n))

    def by_hand(t, d, pre):
        cut = np.flatnonzero(t[1:] > t[:-1] + d[:-1] + 1e-6) + 1
        bounds = np.concatenate([[0], cut, [len(t)]])
        out, prev_end, grid = t.copy(), -np.inf, np.arange(0.0, 1000.0, 1.0)
        for a, b in zip(bounds[:-1], bounds[1:]):
            lo = max(0.0, prev_end - t[a])
            cand = grid[grid >= lo] if lo < 1000.0 else np.array([lo])
            p = t[a:b][pre[a:b]]
            cost = [np.minimum(np.abs(sched[:, None] - (p + c)[None, :]).min(axis=0), 200.0).sum() for c in cand]
            out[a:b] = t[a:b] + cand[int(np.argmin(cost))]
            prev_end = out[b - 1] + d[b - 1]
        return out

    calls = []
    real = vllm_log._nearest
    try:
        vllm_log._nearest = lambda xs, ref: calls.append(1) or real(xs, ref)
        got, _ = vllm_log.refine_busy_periods(steps, 0.0, sched)
    finally:
        vllm_log._nearest = real
    assert len(calls) <= n + 1                                    # was ~1,000 a period
    k = 200                                                       # the first 200 periods, by hand
    assert np.array_equal(got[:2 * k], by_hand(steps["t_ms"].to_numpy()[:2 * k], steps["dur_ms"].to_numpy()[:2 * k],
                                                steps["prefill_reqs"].to_numpy()[:2 * k] > 0))
