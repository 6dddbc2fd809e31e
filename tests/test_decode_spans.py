"""Decode spans (core.trace.spans): a simulation streamed into Parquet keeps each stretch of a
request's plain decoding as one row, and every reader reads the file as the trace stepping would
have listed: in memory (the same trace as `simulate`), out of core (the same summary, DuckDB), the
large-trace overview (the same views). Hostile span rows are refused in one line by both readers
before anything is expanded."""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from core.analysis import overview
from core.analysis.metrics import request_metrics, summarize
from core.analysis.outofcore import summarize_parquet
from core.config import SchedulerConfig
from core.errors import InputError
from core.sim.simulate import simulate, simulate_to_parquet
from core.sim.stepmodel import StepModel
from core.trace import load_trace, to_doc
from core.trace.spans import expand, span_rows
from core.workload import load_workload
from tests.conftest import DATA, ROOT
from tests.test_outofcore import OPTIONS, differences
from tests.test_streaming import poisson

MODEL = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
CREATED = "2026-12-06T00:00:00+00:00"
CASES = {   # what the spans must survive: preemption, a policy whose prefill steps the decoders sit out
    # (spans cut at the gap), prefix caching (vLLM v1's cache commits as decoders fill blocks), a budget
    # some decoders do not fit (they sit out: explicit for a step)
    "preempt": (lambda: poisson(300, 1), SchedulerConfig(max_seqs=16, token_budget=256, chunk=64, kv_blocks=160)),
    "vllm-v0": (lambda: poisson(200, 3), SchedulerConfig(policy="vllm-v0", max_seqs=16)),
    "prefix": (lambda: load_workload(DATA / "workloads" / "shared_prefix_200.json"),
               SchedulerConfig(max_seqs=32, token_budget=512, chunk=128, prefix_caching=True, kv_blocks=400)),
    "sarathi": (lambda: poisson(200, 4), SchedulerConfig(policy="sarathi", max_seqs=64, token_budget=24, chunk=16)),
}


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    out = {}
    for name, (make, cfg) in CASES.items():
        w = make()
        d = tmp_path_factory.mktemp(name)
        simulate_to_parquet(w, cfg, str(d / "t.parquet"), MODEL, created=CREATED, flush_steps=5)
        (d / "parts").mkdir()
        (d / "parts" / "part-00000.parquet").write_bytes((d / "t.parquet").read_bytes())
        out[name] = (simulate(w, cfg, MODEL, created=CREATED), d / "t.parquet", d / "parts")
    return out


def rtype_rows(path, rtype):
    t = pq.read_table(path)
    return t.filter(pc.equal(t.column("rtype"), rtype))


@pytest.mark.parametrize("name", CASES)
def test_a_file_with_spans_reads_as_the_trace_in_memory(streamed, name):
    mem, path, _ = streamed[name]
    spans = rtype_rows(path, "span")
    assert len(spans) and len(rtype_rows(path, "token")) + pc.sum(spans.column("tokens")).as_py() == len(mem.tokens)
    frees = rtype_rows(path, "kv_free")    # whole tables freed: one row each (none where blocks are shared)
    assert (len(frees) > 0) == (not CASES[name][1].prefix_caching)
    freed = pc.sum(frees.column("logical")).as_py() + len(frees) if len(frees) else 0
    assert len(rtype_rows(path, "kv")) + freed == len(mem.kv)
    assert to_doc(load_trace(path)) == to_doc(mem)


@pytest.mark.parametrize("name", CASES)
def test_out_of_core_metrics_of_a_file_with_spans_equal_the_loaded_trace(streamed, name):
    mem, path, parts = streamed[name]
    for kw in OPTIONS:
        want = summarize(mem, per_request=False, **kw)["summary"]
        for where in (path, parts):
            assert differences(want, summarize_parquet(where, **kw)["summary"]) == [], (name, kw, where.name)


@pytest.mark.parametrize("name", ["preempt", "prefix"])
def test_the_overview_of_a_file_with_spans_equals_the_loaded_trace(streamed, name):
    import pandas as pd

    from core.analysis import cursor
    from core.analysis.occupancy import block_states
    mem, path, _ = streamed[name]
    ov = overview.open_overview(path)[0]
    pd.testing.assert_frame_equal(ov.request_metrics(), request_metrics(mem))
    rows = cursor.row_index(mem)
    a, b = cursor.time_range(mem)
    for c in (a, (a + b) / 2, b):
        idx = cursor.requests_near(mem, c, 40, request_metrics(mem))
        got, want = ov.window(idx), cursor.subset(mem, idx, rows)
        for table in ("tokens", "batch", "steps", "kv"):
            pd.testing.assert_frame_equal(getattr(got, table), getattr(want, table), obj=table)
        r1, b1 = ov.step_at(c)
        r2, b2 = cursor.step_at(mem, c, rows)
        assert r1 == r2
        pd.testing.assert_frame_equal(b1, b2)
    got, want = ov.occupancy(), block_states(mem, max_snapshots=160)
    for k in ("times_ms", "state", "ref", "owner"):
        assert np.array_equal(getattr(got, k), getattr(want, k)), k


def test_span_rows_are_cut_where_the_decoders_sat_out_a_step():
    """Counter values 0..5 ran in steps 3, 4, 5, 7, 8, 10: a span over all six is three spans of
    consecutive steps, each output index where it was."""
    got = span_rows([(9, 2, 0, 6, 4), (8, 1, 1, 3, 0)], 0, [3, 4, 5, 7, 8, 10])
    rows = sorted(zip(*(got[c].tolist() for c in ("req", "join", "step", "tokens", "index"))))
    assert rows == [(8, 1, 4, 2, 0), (9, 2, 3, 3, 4), (9, 2, 7, 2, 7), (9, 2, 10, 1, 9)]


def test_expand_places_listed_rows_by_step_then_join():
    """Request 5 (join 0) decodes in steps 0-2; request 6 (join 1) is listed in steps 1 and 2 (a
    prefill, then its first token), request 4 (join 2) in step 1: by step, then join."""
    span = {"req": np.array([5]), "join": np.array([0]), "step": np.array([0]), "tokens": np.array([3]),
            "index": np.array([10])}
    steps = {"step": np.arange(3), "t_ms": np.array([0.0, 5.0, 11.0]), "dur_ms": np.array([5.0, 6.0, 7.0])}
    listed_b = {"step": np.array([1, 1, 2]), "req": np.array([6, 4, 6]), "tokens": np.array([100, 1, 1]),
                "kind": np.array([1, 0, 0], dtype=np.int8), "join": np.array([1, 2, 1])}
    listed_t = {"t_ms": np.array([11.0, 18.0]), "req": np.array([4, 6]), "index": np.array([0, 0]),
                "source": np.zeros(2, np.int8), "token_id": np.full(2, -1), "step": np.array([1, 2]),
                "join": np.array([2, 1])}
    tok, bat = expand(span, steps, listed_t, listed_b)
    assert list(zip(bat["step"].tolist(), bat["req"].tolist(), bat["tokens"].tolist())) == [
        (0, 5, 1), (1, 5, 1), (1, 6, 100), (1, 4, 1), (2, 5, 1), (2, 6, 1)]
    assert list(zip(tok["t_ms"].tolist(), tok["req"].tolist(), tok["index"].tolist())) == [
        (5.0, 5, 10), (11.0, 5, 11), (11.0, 4, 0), (18.0, 5, 12), (18.0, 6, 0)]



@pytest.mark.parametrize("seed", range(6))
def test_expand_equals_listing_every_row_by_hand(seed):
    """Random spans (requests decoding over overlapping stretches of steps, joins in any order) and
    listed rows between them: expand gives what listing each span's steps one by one and sorting
    every row by (step, join) gives, each token at its step's end (listed tokens keep their time)."""
    rng = np.random.default_rng(seed)
    n_steps, n_spans = 40, 25
    joins = rng.permutation(200)[:n_spans + 12]
    start = rng.integers(0, n_steps - 1, n_spans)
    n = np.minimum(rng.integers(1, 15, n_spans), n_steps - start)
    span = {"req": rng.integers(0, 50, n_spans), "join": joins[:n_spans], "step": start, "tokens": n,
            "index": rng.integers(0, 9, n_spans)}
    steps = {"step": np.arange(n_steps), "t_ms": np.cumsum(rng.uniform(1, 3, n_steps)),
             "dur_ms": rng.uniform(0.5, 1.0, n_steps)}
    # listed rows: the other joins, in steps of their own (one per (step, join)), in key order
    lj = joins[n_spans:]
    ls = rng.integers(0, n_steps, len(lj))
    key_order = np.lexsort((lj, ls))
    ls, lj = ls[key_order], lj[key_order]
    k = len(lj)
    listed_t = {"t_ms": rng.uniform(0, 100, k), "req": rng.integers(0, 50, k), "index": rng.integers(0, 9, k),
                "source": rng.integers(0, 3, k).astype(np.int8), "token_id": rng.integers(0, 1000, k),
                "step": ls, "join": lj}
    listed_b = {"step": ls, "req": listed_t["req"], "tokens": rng.integers(2, 99, k),
                "kind": np.ones(k, np.int8), "join": lj}
    tok, bat = expand(span, steps, listed_t, listed_b)
    end = steps["t_ms"] + steps["dur_ms"]
    rows = []   # (step, join, token row, batch row)
    for j in range(n_spans):
        for off in range(int(n[j])):
            st, r = int(start[j]) + off, int(span["req"][j])
            rows.append((st, int(span["join"][j]), (float(end[st]), r, int(span["index"][j]) + off, 0, -1),
                         (st, r, 1, 0)))
    for j in range(k):
        rows.append((int(ls[j]), int(lj[j]),
                     tuple(listed_t[c][j].item() for c in ("t_ms", "req", "index", "source", "token_id")),
                     tuple(listed_b[c][j].item() for c in ("step", "req", "tokens", "kind"))))
    rows.sort(key=lambda x: (x[0], x[1]))
    assert list(zip(*(tok[c].tolist() for c in ("t_ms", "req", "index", "source", "token_id")))) == [x[2] for x in rows]
    assert list(zip(*(bat[c].tolist() for c in ("step", "req", "tokens", "kind")))) == [x[3] for x in rows]
    assert (tok["source"].dtype, tok["token_id"].dtype, bat["tokens"].dtype, bat["kind"].dtype) == \
        (np.int8, np.int64, np.int64, np.int8)


def test_rows_placed_for_every_column_at_once_equal_numpy_insert():
    """spans._inserted (the kv_free rows' placement) against np.insert, column by column, with several
    rows at one place, at the start and at the end, and a constant column."""
    from core.trace.spans import _inserted
    rng = np.random.default_rng(1)
    n = 50
    at = np.sort(np.r_[0, 0, rng.integers(0, n + 1, 20), n, n])
    dec = {"a": rng.integers(0, 9, n), "b": rng.uniform(0, 1, n), "c": (7, np.int8)}
    add = {"a": rng.integers(100, 200, len(at)), "b": rng.uniform(5, 6, len(at)), "c": np.full(len(at), 3, np.int8)}
    got = _inserted(dec, n, at, add)
    assert np.array_equal(got["a"], np.insert(dec["a"], at, add["a"]))
    assert np.array_equal(got["b"], np.insert(dec["b"], at, add["b"]))
    assert np.array_equal(got["c"], np.insert(np.full(n, 7, np.int8), at, add["c"])) and got["c"].dtype == np.int8

# ---- hostile span rows: one line from both readers, nothing expanded first ----------------------------

def with_value(path, tmp, rtype, column, value, where=0):
    """The file with `column` of its `where`-th `rtype` row set to `value`."""
    t = pq.read_table(path)
    k = np.flatnonzero(pc.equal(t.column("rtype"), rtype).to_numpy(zero_copy_only=False))[where]
    at = np.zeros(len(t), dtype=bool)
    at[k] = True
    col = pc.if_else(pa.array(at), pa.scalar(value, pa.int64()), pc.cast(t.column(column), pa.int64()))
    out = tmp / f"bad_{rtype}_{column}.parquet"
    pq.write_table(t.set_column(t.column_names.index(column), column, col), out)
    return out


@pytest.mark.parametrize("column,value,message", [
    ("tokens", 2 ** 31 - 1, r"span record \d+: step \+ tokens past|over its max_output_tokens"),
    ("tokens", 0, r"span record \d+: tokens: expected an integer in 1\.\."),
    ("req", 10 ** 6, r"span record \d+: req: expected an integer in 0\.\."),
    ("step", 10 ** 8, r"which has no step record"),
    ("join", -5, r"span record \d+: join: expected an integer in 0\.\."),
])
def test_hostile_span_rows_are_refused_before_anything_is_expanded(streamed, tmp_path, column, value, message):
    _, path, _ = streamed["preempt"]
    bad = with_value(path, tmp_path, "span", column, value)
    for read in (lambda: load_trace(bad), lambda: summarize_parquet(bad)):
        with pytest.raises(InputError, match=message):
            read()


@pytest.mark.parametrize("column,value,where,message", [
    ("logical", 10 ** 9, 0, r"kv_free record 0: frees 1,000,000,001 blocks"),     # more than allocated: not expanded
    ("logical", 5000, 0, r"kv_free record \d+: frees [\d,]+ blocks after [\d,]+ KV rows: expected"),
    ("index", 0, 0, r"kv_free record 0: request \d+ frees [\d,]+ blocks, more than it allocated before it"),
    ("index", 0, -1, r"kv_free record \d+: frees [\d,]+ blocks after 0 KV rows"),  # out of order
    ("req", 10 ** 6, 0, r"kv_free record 0: req: 1000000 out of range"),
    ("index", -3, 0, r"kv_free record 0: index: -3 out of range"),
])
def test_hostile_frees_of_whole_tables_are_refused_before_they_are_expanded(streamed, tmp_path, column, value, where,
                                                                         message):
    _, path, _ = streamed["preempt"]
    bad = with_value(path, tmp_path, "kv_free", column, value, where)
    for read in (lambda: load_trace(bad), lambda: summarize_parquet(bad)):
        with pytest.raises(InputError, match=message):
            read()


@pytest.mark.parametrize("rtype,what", [("token", "decode spans"), ("kv", "kv_free records")])
def test_spans_and_whole_table_frees_are_refused_in_a_fleet_trace(streamed, tmp_path, rtype, what):
    """Both encodings are a single engine's: listed rows on another replica are refused by both readers."""
    _, path, _ = streamed["preempt"]
    t = pq.read_table(path)
    bad = t.set_column(t.column_names.index("replica"), "replica",
                       pc.if_else(pc.equal(t.column("rtype"), rtype), pa.scalar(1, pa.int64()), t.column("replica")))
    pq.write_table(bad, tmp_path / "fleet.parquet")
    for read in (lambda: load_trace(tmp_path / "fleet.parquet"), lambda: summarize_parquet(tmp_path / "fleet.parquet")):
        with pytest.raises(InputError, match=f"{what} in a fleet trace"):
            read()


def test_listed_rows_of_a_file_with_spans_must_carry_their_place(streamed, tmp_path):
    _, path, _ = streamed["preempt"]
    t = pq.read_table(path)
    is_tok = pc.equal(t.column("rtype"), "token")
    bad = t.set_column(t.column_names.index("join"), "join",
                       pc.if_else(is_tok, pa.scalar(None, pa.int64()), t.column("join")))
    pq.write_table(bad, tmp_path / "nojoin.parquet")
    for read in (lambda: load_trace(tmp_path / "nojoin.parquet"),
                 lambda: summarize_parquet(tmp_path / "nojoin.parquet")):
        with pytest.raises(InputError, match="token records of a file with decode spans: join missing"):
            read()


def test_the_command_line_reports_every_token(tmp_path, capsys):
    """`core simulate --out x.parquet` counts the spans' tokens with the listed ones."""
    from core.__main__ import main
    w = DATA / "workloads" / "poisson500_vidur.csv"
    assert main(["simulate", str(w), "--out", str(tmp_path / "x.parquet")]) == 0
    n = int(load_workload(w).max_output_tokens.sum())
    assert f"{n} tokens" in capsys.readouterr().out
    assert len(load_trace(tmp_path / "x.parquet").tokens) == n
    assert len(rtype_rows(tmp_path / "x.parquet", "token")) < n / 10


@pytest.mark.parametrize("name", ["preempt", "prefix"])
def test_step_features_out_of_core_of_a_file_with_spans_equal_the_loaded_trace(streamed, name):
    """What a fit reads (core.fit.outofcore.features_parquet) equals the features of the trace in memory."""
    from core.fit.outofcore import features_parquet
    from core.fit.stepfit import trace_features
    mem, path, _ = streamed[name]
    steps, X, y = trace_features(mem)
    so, Xo, yo, _, _ = features_parquet(path)
    assert list(so) == list(steps) and np.allclose(Xo, X, rtol=1e-12) and np.allclose(yo, y, rtol=1e-12)


@pytest.mark.parametrize("large", [False, True])
def test_the_replay_page_shows_a_file_with_spans_as_the_same_trace_written_plainly(streamed, tmp_path, monkeypatch,
                                                                                    large):
    """A simulated run's file (decode spans, whole-table frees) and the same trace written row by row
    (core.trace.to_parquet_bytes): the replay page shows the same numbers, charts and cursor, loaded
    in memory and (large) from its overview."""
    from streamlit.testing.v1 import AppTest

    from core.trace import to_parquet_bytes
    from tests.helpers import charts as plotly_figures
    tr, path, _ = streamed["preempt"]
    (tmp_path / "spans.parquet").write_bytes(path.read_bytes())
    (tmp_path / "plain.parquet").write_bytes(to_parquet_bytes(tr))
    monkeypatch.setenv("SERVING_EXPLORER_TRACES", str(tmp_path))
    monkeypatch.setattr(overview, "LARGE_TRACE_ROWS", 10 if large else 10**9)
    shown = []
    for name in ("spans.parquet", "plain.parquet"):
        at = AppTest.from_file(str(ROOT / "pages" / "replay.py"), default_timeout=120)
        at.query_params["tr"] = name
        at.run()
        assert not at.exception, at.exception[0].message
        s = at.slider(key="rp_cursor")
        s.set_value(s.min + 0.4 * (s.max - s.min)).run()
        assert not at.exception, at.exception[0].message
        shown.append(([(m.label, m.value) for m in at.metric],
                      [c.value for c in at.caption if c.value.startswith(("At the cursor", "Timeline:"))],
                      [f["layout"].get("title", {}).get("text") for f in plotly_figures(at)][:3]))
    assert shown[0] == shown[1]
    assert len(shown[0][0]) >= 3 and len(shown[0][1]) >= 2 and len(shown[0][2]) == 3
