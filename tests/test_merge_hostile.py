"""`merge` refuses files that cannot belong to the run, each in one line naming the file and
why (issue #36, item 20), and its readers' work stays linear in what they are given (item 18):
an iteration line is parsed by patterns that each see a bounded window, a guidellm report's
notes do not grow with the square of its benchmarks, and pairing requests with spans by id is
an index look-up, not a substring test per (request, span). Built from the real bundled files;
work is counted, never timed."""
import base64
import json
import re

import msgspec
import numpy as np
import pandas as pd
import pytest

from core.__main__ import main
from core.errors import TraceError
from core.trace.imports import guidellm, otlp, vllm_log
from core.trace.model import Trace, frame
from core.trace.schema import REQUEST
from tests.conftest import DATA
from tests.helpers import merge_refused

RUN2 = DATA / "imports" / "vllm_telemetry" / "run2_poisson4_p192_o48"
AIPERF = DATA / "imports" / "aiperf"
YEAR_S = 365 * 86400


def refused(capsys, tmp_path, files, *words):
    return merge_refused(capsys, tmp_path, files, *words, out_name="merged.json")


def test_two_client_files_are_refused(capsys, tmp_path):
    """Two AIPerf runs (24 s apart): the second's requests used to be dropped and its /metrics
    samples attached 24 s into the first run, exit 0."""
    first, second = (AIPERF / d / "profile_export.jsonl" for d in ("aiperf_c4_p64_o32", "aiperf_n24_c2_p128_o16"))
    refused(capsys, tmp_path, [first, second], str(second), "a second client's requests", str(first))


def test_the_same_file_twice_is_refused(capsys, tmp_path):
    f = AIPERF / "aiperf_c4_p64_o32" / "profile_export.jsonl"
    refused(capsys, tmp_path, [f, f], str(f), "given twice")
    spans = RUN2 / "spans.otlp.jsonl"
    refused(capsys, tmp_path, [RUN2 / "vllm_bench_run2.json", spans, spans], "given twice")
    # one capture in two forms (the collector's OTLP/JSON and the recorded export bodies)
    refused(capsys, tmp_path, [RUN2 / "vllm_bench_run2.json", spans, RUN2 / "otlp_bodies.jsonl"],
            "otlp_bodies.jsonl", "holds the same data as", "spans.otlp.jsonl")


def kv_capture_moved(tmp_path, seconds: float):
    """run2's real KV-event capture with every batch's time (payload ts and receive time) moved."""
    lines = []
    for ln in (RUN2 / "kv_events.jsonl").read_text().splitlines():
        rec = json.loads(ln)
        topic, seq, payload = (base64.b64decode(f) for f in rec["frames"])
        ts, events, rank = msgspec.msgpack.decode(payload)
        payload = msgspec.msgpack.encode([ts + seconds, events, rank])
        rec["frames"] = [base64.b64encode(b).decode() for b in (topic, seq, payload)]
        rec["recv_ns"] += int(seconds * 1e9)
        lines.append(json.dumps(rec))
    p = tmp_path / "kv_events_later.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_kv_capture_from_a_year_later_is_refused(capsys, tmp_path):
    """It used to be attached at +31,536,000,000 ms and counted as this run's prefix cache."""
    later = kv_capture_moved(tmp_path, YEAR_S)
    files = [RUN2 / "vllm_bench_run2.json", RUN2 / "spans.otlp.jsonl", later]
    refused(capsys, tmp_path, files, later.name, "365.0 days after the run ends", "not from this run")
    # the same capture at its real time joins
    assert main(["merge", *map(str, files[:2]), str(kv_capture_moved(tmp_path, 0)), "--out",
                 str(tmp_path / "ok.json")]) == 0


def test_a_second_kv_capture_is_refused(capsys, tmp_path):
    """Two recorders of one engine's events (observe and a second SUB) would count every block
    twice: the second is refused, naming the first."""
    files = [RUN2 / "vllm_bench_run2.json", RUN2 / "spans.otlp.jsonl", RUN2 / "kv_events.jsonl",
             kv_capture_moved(tmp_path, 0.001)]
    refused(capsys, tmp_path, files, "kv_events_later.jsonl", "already has KV events", "kv_events.jsonl")


class Window:
    """A compiled pattern that records how many characters each call may look at."""

    def __init__(self, pat, seen):
        self.pat, self.seen = pat, seen

    def __getattr__(self, name):
        fn = getattr(self.pat, name)
        if name not in ("search", "match", "fullmatch", "findall", "finditer", "sub", "split"):
            return fn

        def call(string, pos=0, endpos=None, *a, **k):
            if isinstance(string, str):
                end = len(string) if endpos is None else min(endpos, len(string))
                self.seen.append(end - pos)
            return fn(string, pos, *([endpos] if endpos is not None else []), *a, **k)
        return call


def test_an_iteration_line_is_read_through_bounded_windows(monkeypatch):
    """A 20 KB line of repeated timestamps and 'Iteration(' (no step in it) used to go whole
    through one pattern with an unbounded gap, quadratic in the line's length (60 KB: 4-7 s,
    1 MB: ~12 min). Every pattern now sees at most 1 KB per call, a bounded number of calls per
    'Iteration(' in the line: linear work."""
    seen = []
    for name, v in list(vars(vllm_log).items()):
        if isinstance(v, re.Pattern):
            monkeypatch.setattr(vllm_log, name, Window(v, seen))
    unit = "12-01 20:06:51 Iteration("
    text = "INFO " + unit * 800 + "\n"
    assert len(text) > 20_000
    assert not vllm_log.looks_like_iteration_log(text)
    with pytest.raises(TraceError, match=r"no 'Iteration\(i\)"):      # refused is right: what it cost is the question
        vllm_log.import_iteration_log(text, "hostile.log")
    assert seen and max(seen) <= 1024, max(seen)
    assert len(seen) <= 4 * text.count("Iteration(") + 4
    # and a real line still reads
    real = next(ln for ln in (RUN2 / "server.log").read_text().splitlines() if "Iteration(" in ln)
    row = vllm_log.step_line(real)
    assert row and row["ctok"] == re.search(r"(\d+) context tokens", real)[1]


def one_request_benchmarks(n: int) -> dict:
    def bench(k):
        s = 1.7e9 + k
        timings = {"request_start": s, "first_token_iteration": s + 0.01, "last_token_iteration": s + 0.02,
                   "request_end": s + 0.03}
        return {"config": {"strategy": {"type_": "constant", "rate": float(k + 1)}},
                "requests": {"successful": [{"request_id": f"r{k}", "prompt_tokens": 4, "output_tokens": 2,
                                             "info": {"timings": timings}}]}}
    return {"metadata": {"guidellm_version": "0.8.1"}, "benchmarks": [bench(k) for k in range(n)]}


def test_a_report_of_many_benchmarks_has_notes_of_bounded_size():
    """Each of N benchmarks' notes used to name all N (10,000 benchmarks: 2.4 GB); now a note
    names a few and counts the rest, so every note is short whatever N is."""
    n = 200
    imp = guidellm.import_report(one_request_benchmarks(n), "b.json")
    assert len(imp.runs) == n
    sizes = [sum(len(x) for x in r.notes) for r in imp.runs]
    assert max(sizes) < 600, max(sizes)
    assert f"holds {n} benchmarks" in imp.runs[-1].notes[0] and "and 195 more" in imp.runs[-1].notes[0]


def test_a_report_of_more_benchmarks_than_a_sweep_has_is_refused_before_reading_any(monkeypatch):
    """Each benchmark becomes a run held in memory (~90 KB with one request): past
    guidellm.MAX_BENCHMARKS the report is refused in one line, before any benchmark is read."""
    read = []
    real = guidellm._benchmark
    monkeypatch.setattr(guidellm, "_benchmark", lambda *a: read.append(1) or real(*a))
    n = getattr(guidellm, "MAX_BENCHMARKS", 1_000) + 1
    with pytest.raises(TraceError, match=rf"b.json: benchmarks: {n:,} benchmarks, more than"):
        guidellm.import_report(one_request_benchmarks(n), "b.json")
    assert read == []


class Counting(str):
    """An id that counts the string operations done on it."""
    ops = 0

    def __contains__(self, x):
        Counting.ops += 1
        return str.__contains__(self, x)

    def __getitem__(self, k):
        Counting.ops += 1
        return str.__getitem__(self, k)

    def startswith(self, *a):
        Counting.ops += 1
        return str.startswith(self, *a)

    def find(self, *a):
        Counting.ops += 1
        return str.find(self, *a)


def _trace_of(ids):
    n = len(ids)
    cols = {"id": ids, "arrival_ms": np.arange(n, dtype=float), "prompt_tokens": np.ones(n, int),
            "max_output_tokens": np.ones(n, int)}
    tr = Trace(meta={}, requests=frame(REQUEST, cols), request_extra=[{} for _ in range(n)])
    tr.requests["id"] = pd.Series(ids, dtype=object)      # the counting strings themselves
    assert all(type(i) is Counting for i in tr.ids)
    return tr


def test_pairing_requests_with_spans_is_linear_in_their_ids():
    """2,000 client requests, 1,999 spans, no id in common: the old pairing tested every
    (request, span) for a substring (4 million tests; 20,000 + 20,000 took 25-42 s). The pairing
    now costs a few operations per character of the ids."""
    n = 2000
    base = _trace_of([Counting(f"client-{k:08d}-abcdefgh") for k in range(n)])
    spans = _trace_of([Counting(f"engine-{k:08d}-abcdefgh") for k in range(n - 1)])
    chars = sum(map(len, base.ids)) + sum(map(len, spans.ids))
    Counting.ops = 0
    assert otlp.pair_requests(base, spans) == []
    assert Counting.ops <= 4 * chars, (Counting.ops, chars)
    # ids that do contain the client's: each request finds its own span
    spans = _trace_of([Counting(f"cmpl-x{k:08d}-abcdefgh-7") for k in range(n)][::-1])
    base = _trace_of([Counting(f"x{k:08d}-abcdefgh") for k in range(n)])
    Counting.ops = 0
    pairs = otlp.pair_requests(base, spans)
    assert pairs == [(i, n - 1 - i) for i in range(n)]
    assert Counting.ops <= 4 * (sum(map(len, base.ids)) + sum(map(len, spans.ids)))
