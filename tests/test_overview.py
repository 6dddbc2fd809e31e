"""A trace too large to load, opened from its overview (issue 29, core/analysis/overview.py): every view
the replay page draws equals the in-memory one's (cursor.subset, cursor.step_at, request_metrics,
in-flight counts, time range, occupancy.block_states), on bundled traces with preemptions, prefix-cache
hits and evictions, counted steps (an iteration log) and no steps at all, as one file and as parts, read
over many small row groups and KV chunks; a stale overview is rebuilt and a failed build keeps the good
one; the replay page shows a large trace from its overview with the in-memory page's numbers; and the
out-of-core `compare`, `fit` and `export --csv` give the in-memory results."""
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("duckdb")

from core.__main__ import main
from core.analysis import cursor, overview
from core.analysis.metrics import request_metrics
from core.analysis.occupancy import block_states
from core.errors import InputError
from core.fit.stepfit import fit, trace_features
from core.trace import load_trace
from core.trace.parquet import to_parquet_bytes, write_parquet_parts
from tests.conftest import DATA, ROOT
from tests.helpers import charts as plotly_figures
from tests.helpers import unwritable_dir

TRACES = ("chapter31_measured_cpu.json", "shared_prefix_caching_off.json.gz", "shared_prefix_caching_on.json.gz",
          "shared_prefix_measured_cpu.json.gz", "vllm_cpu_run2_merged.json.gz", "runner_served_tiny_loadgen.json.gz")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each trace as a file and as 997-row parts, its overview built over small row groups and KV chunks."""
    mp = pytest.MonkeyPatch()
    mp.setattr(overview, "GROUP_ROWS", 64)
    mp.setattr(overview, "KV_CHUNK_ROWS", 1000)
    out = {}
    for name in TRACES:
        tr = load_trace(DATA / "traces" / name)
        d = tmp_path_factory.mktemp(name.split(".")[0])
        (d / "t.parquet").write_bytes(to_parquet_bytes(tr))
        write_parquet_parts(tr, d / "parts", rows_per_part=997)
        out[name] = (tr, [overview.open_overview(d / "t.parquet")[0], overview.open_overview(d / "parts")[0]])
    mp.undo()
    return out


def cursors(tr):
    a, b = cursor.time_range(tr)
    steps = tr.steps["t_ms"].to_numpy()
    extra = [steps[0] - 1e-3, steps[len(steps) // 2], steps[-1]] if len(steps) else []
    return [a - 1.0, a, *(a + f * (b - a) for f in (0.13, 0.5, 0.77)), b, *extra]


@pytest.mark.parametrize("name", TRACES)
def test_every_view_equals_the_loaded_traces(built, name):
    tr, ovs = built[name]
    rows = cursor.row_index(tr)
    want_occ = block_states(tr, max_snapshots=160) if len(tr.kv) else None
    for ov in ovs:
        pd.testing.assert_frame_equal(ov.request_metrics(), request_metrics(tr))
        assert ov.span() == cursor.time_range(tr)
        pd.testing.assert_frame_equal(ov.in_flight(), cursor.in_flight_series(tr))
        assert ov.counted_steps() == (len(tr.steps) > 0 and not len(tr.batch) and
                                      bool((tr.steps["prefill_tokens"] >= 0).all()))
        for c in cursors(tr):
            for limit in (5, 150):
                idx = cursor.requests_near(tr, c, limit, request_metrics(tr))
                got, want = ov.window(idx), cursor.subset(tr, idx, rows)
                for table in ("requests", "tokens", "finishes", "steps", "batch", "kv", "preempts"):
                    pd.testing.assert_frame_equal(getattr(got, table), getattr(want, table), obj=table)
                assert got.request_extra == want.request_extra and got.meta == want.meta
            r1, b1 = ov.step_at(c)
            r2, b2 = cursor.step_at(tr, c, rows)
            assert r1 == r2
            pd.testing.assert_frame_equal(b1, b2)
        # an arbitrary set, not contiguous: requests from both ends
        n = len(tr.requests)
        idx = sorted({0, n - 1, n // 3, n // 2})
        for table in ("tokens", "batch", "finishes", "preempts"):
            pd.testing.assert_frame_equal(getattr(ov.window(idx), table), getattr(cursor.subset(tr, idx), table))
        assert ov.has_kv == (want_occ is not None)
        if want_occ is not None:
            got = ov.occupancy()
            for k in ("times_ms", "state", "ref", "owner"):
                assert np.array_equal(getattr(got, k), getattr(want_occ, k)), k
            assert got.num_blocks == want_occ.num_blocks


def test_the_traces_cover_what_the_views_must_handle(built):
    """Preemptions, prefix-cache hits and evictions, shared blocks, counted steps, no steps."""
    trs = {n: built[n][0] for n in TRACES}
    assert len(trs["shared_prefix_caching_off.json.gz"].preempts)
    ops = set(trs["shared_prefix_caching_on.json.gz"].kv["op"].astype(str))
    assert {"hit", "evict", "cache"} <= ops
    assert (block_states(trs["shared_prefix_measured_cpu.json.gz"]).state == 3).any()       # shared
    assert len(trs["vllm_cpu_run2_merged.json.gz"].steps) and not len(trs["vllm_cpu_run2_merged.json.gz"].batch)
    assert not len(trs["runner_served_tiny_loadgen.json.gz"].steps)


def test_a_changed_trace_is_rebuilt_and_a_failed_build_keeps_the_good_one(tmp_path, monkeypatch):
    tr = load_trace(DATA / "traces" / "chapter31_measured_cpu.json")
    path = tmp_path / "t.parquet"
    path.write_bytes(to_parquet_bytes(tr))
    ov, took = overview.open_overview(path)
    assert took is not None and ov.folder == tmp_path / "t.parquet.overview"
    assert overview.open_overview(path)[1] is None            # up to date: read, not rebuilt
    good = (ov.folder / "overview.json").read_text()
    path.write_bytes(to_parquet_bytes(load_trace(DATA / "traces" / "cold_start_measured_cpu.json")))
    assert overview.current(path) is None                     # the trace changed: stale

    def broken(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(overview, "_occupancy", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        overview.open_overview(path)
    assert (ov.folder / "overview.json").read_text() == good   # the old overview untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet", "t.parquet.overview"]   # no half-built folder
    monkeypatch.undo()
    ov2, took = overview.open_overview(path)
    assert took is not None and len(ov2.requests) == 5


def test_an_unwritable_folder_puts_the_overview_in_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVING_EXPLORER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(overview.os, "access", lambda p, mode: False)
    d = overview.overview_dir(tmp_path / "ro" / "t.parquet")
    assert d.parent == tmp_path / "cache" / "overviews" and d.name.endswith(".overview")


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(InputError, match="read Parquet"):
        overview.build(DATA / "traces" / "chapter31_continuous.json")
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not parquet PAR1")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        overview.build(tmp_path / "x.parquet")
    assert not list(tmp_path.glob("*.part"))


def test_the_replay_page_opens_a_large_trace_from_its_overview(tmp_path, monkeypatch):
    """Below the threshold the page loads the trace; above it, from the overview: the same numbers."""
    from streamlit.testing.v1 import AppTest
    tr = load_trace(DATA / "traces" / "shared_prefix_measured_cpu.json.gz")
    (tmp_path / "big.parquet").write_bytes(to_parquet_bytes(tr))
    monkeypatch.setenv("SERVING_EXPLORER_TRACES", str(tmp_path))

    def page(large: bool):
        monkeypatch.setattr(overview, "LARGE_TRACE_ROWS", 10 if large else 10**9)
        at = AppTest.from_file(str(ROOT / "pages" / "replay.py"), default_timeout=120)
        at.query_params["tr"] = "big.parquet"
        at.run()
        assert not at.exception, at.exception[0].message
        s = at.slider(key="rp_cursor")
        s.set_value(s.min + 0.4 * (s.max - s.min)).run()
        assert not at.exception, at.exception[0].message
        return at

    small, big = page(False), page(True)
    assert any("too large to load" in i.value for i in big.info)
    assert not any("too large to load" in i.value for i in small.info)
    assert [(m.label, m.value) for m in big.metric] == [(m.label, m.value) for m in small.metric]
    at_cursor = lambda at: [c.value for c in at.caption if c.value.startswith(("At the cursor", "Timeline:"))]
    assert at_cursor(big) == at_cursor(small) and len(at_cursor(big)) >= 2
    charts = lambda at: [f["layout"].get("title", {}).get("text") for f in plotly_figures(at)]
    assert len(charts(big)) >= 3 and charts(big)[:3] == charts(small)[:3]      # timeline, batch, KV blocks
    assert big.get("download_button")        # the per-request CSV is offered
    assert not any(h.value == "Compare" for h in big.header)   # compare needs the trace in memory: said instead
    assert any("python -m core compare" in c.value for c in big.caption)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    a, b = d / "on.parquet", d / "off.parquet"
    a.write_bytes(to_parquet_bytes(load_trace(DATA / "traces" / "shared_prefix_caching_on.json.gz")))
    b.write_bytes(to_parquet_bytes(load_trace(DATA / "traces" / "shared_prefix_caching_off.json.gz")))
    return a, b


def close(x, y):
    if x is None or y is None:
        return x is y
    if isinstance(x, float) or isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(x) and math.isnan(y))
    return x == y


def test_compare_out_of_core_equals_in_memory(pair, capsys):
    a, b = pair
    got = []
    for flags in ([], ["--out-of-core"]):
        assert main(["compare", str(a), str(b), "--json", *flags]) == 0
        got.append(json.loads(capsys.readouterr().out))
    mem, ooc = got
    assert mem["workload_differences"] == ooc["workload_differences"]
    assert [r["metric"] for r in mem["metrics"]] == [r["metric"] for r in ooc["metrics"]]
    for r1, r2 in zip(mem["metrics"], ooc["metrics"]):
        assert all(close(r1[k], r2[k]) for k in r1), (r1, r2)
    assert ooc["computed"][0]["out_of_core"] and not mem["computed"][0]["out_of_core"]
    # the two caching runs of one workload: the same requests; TTFT differs (caching)
    ttft = next(r for r in mem["metrics"] if r["metric"] == "TTFT mean (ms)")
    tr_on = load_trace(DATA / "traces" / "shared_prefix_caching_on.json.gz")
    assert math.isclose(ttft["first"], float(request_metrics(tr_on)["ttft_ms"].mean()), rel_tol=1e-12)


def test_fit_out_of_core_equals_in_memory(pair, capsys):
    for path in pair:
        tr = load_trace(path)
        s1, X1, y1 = trace_features(tr)
        from core.fit.outofcore import features_parquet
        s2, X2, y2, _, counted = features_parquet(path)
        assert np.array_equal(s1, s2) and np.array_equal(y1, y2) and not counted
        assert np.allclose(X1, X2, rtol=1e-12, atol=1e-9)
        sm, _ = fit(tr, "features")
        assert main(["fit", str(path), "--json", "--out-of-core"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["fit"]["out_of_core"]
        want = sm.to_dict()
        assert got["step_model"].keys() == want.keys()
        for k, v in want.items():
            if isinstance(v, float):
                assert math.isclose(got["step_model"][k], v, rel_tol=1e-7, abs_tol=1e-9), k
    counted = DATA / "traces" / "vllm_cpu_run2_merged.json.gz"
    p = pair[0].parent / "counted.parquet"
    p.write_bytes(to_parquet_bytes(load_trace(counted)))
    assert main(["fit", str(p), "--out-of-core"]) == 2
    assert "carry counts" in capsys.readouterr().err
    assert main(["fit", str(p), "--out-of-core", "--model", "affine", "--json"]) == 0
    sm, _ = fit(load_trace(counted), "affine")
    got = json.loads(capsys.readouterr().out)["step_model"]
    assert all(math.isclose(got[k], v, rel_tol=1e-7, abs_tol=1e-9) for k, v in sm.to_dict().items()
               if isinstance(v, float))


def test_export_csv_out_of_core_is_the_same_file(pair, tmp_path, capsys):
    a, _ = pair
    assert main(["export", str(a), "--csv", str(tmp_path / "mem.csv")]) == 0
    assert main(["export", str(a), "--csv", str(tmp_path / "ooc.csv"), "--out-of-core"]) == 0
    assert (tmp_path / "mem.csv").read_bytes() == (tmp_path / "ooc.csv").read_bytes()
    capsys.readouterr()
    assert main(["export", str(a), "--chrome", str(tmp_path / "c.json"), "--out-of-core"]) == 2
    assert "per-request metrics (--csv) only" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_the_overview_command(pair, tmp_path, capsys):
    a, _ = pair
    assert main(["overview", str(a), "--out", str(tmp_path / "ov")]) == 0
    assert "wrote" in capsys.readouterr().out
    doc = json.loads((tmp_path / "ov" / "overview.json").read_text())
    assert doc["version"] == overview.VERSION and doc["summary"]["computed"]["out_of_core"]
    assert Path(tmp_path / "ov" / "occupancy.parquet").exists()


def test_large_values_fit_their_metric():
    """A 100k-request trace's TTFT (913,196 ms) and token count (25,668,865) were cut with an ellipsis
    in their metric columns: past 100 s a time is shown in seconds, past 10 M a count in millions."""
    from ui.fmt import count_metric, ms_metric
    assert ms_metric("TTFT p50", 88.125) == ("TTFT p50 ms", "88.125")
    assert ms_metric("TTFT p50", 99_999.5) == ("TTFT p50 ms", "99,999.5")
    assert ms_metric("TTFT p50", 913_196.0) == ("TTFT p50 s", "913.2")
    assert ms_metric("TPOT mean", None) == ("TPOT mean ms", "—")
    assert count_metric(100_000) == "100,000" and count_metric(25_668_865) == "25.67 M"


def test_a_damaged_overview_is_rebuilt_and_a_foreign_folder_is_left_alone(tmp_path):
    tr = load_trace(DATA / "traces" / "chapter31_measured_cpu.json")
    path = tmp_path / "t.parquet"
    path.write_bytes(to_parquet_bytes(tr))
    ov, _ = overview.open_overview(path)
    (ov.folder / "tokens.parquet").write_bytes(b"PAR1 damaged PAR1")
    ov2, took = overview.open_overview(path)
    assert took is not None and len(ov2.window([0, 1]).tokens) == len(cursor.subset(tr, [0, 1]).tokens)
    other = tmp_path / "u.parquet"
    other.write_bytes(to_parquet_bytes(tr))
    mine = tmp_path / "u.parquet.overview"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not an overview this tool wrote"):
        overview.open_overview(other)
    assert (mine / "notes.txt").read_text() == "mine"


def test_out_of_core_commands_name_a_damaged_parquet_file(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not parquet PAR1")
    for argv in (["fit", str(bad), "--out-of-core"], ["overview", str(bad)],
                 ["export", str(bad), "--out-of-core", "--csv", str(tmp_path / "o.csv")],
                 ["compare", str(bad), str(bad), "--out-of-core"]):
        assert main(argv) == 2
        assert "not a readable Parquet file" in capsys.readouterr().err, argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet"]


def test_the_trace_in_memory_and_its_overview_implement_one_interface():
    """core.analysis.views.TraceView: every call the replay page makes exists on both."""
    from core.analysis.overview import Overview
    from core.analysis.views import InMemoryView, TraceView
    calls = [n for n in vars(TraceView) if not n.startswith("_")]
    assert {"summary", "request_metrics", "span", "window", "step_at", "occupancy", "has_kv"} <= set(calls)
    for cls in (InMemoryView, Overview):
        assert [n for n in calls if not hasattr(cls, n)] == [], cls.__name__


# ---- issue 36 item 16: never delete what we did not write; one line for a folder we cannot use ------

def _trace_file(tmp_path, name="chapter31_measured_cpu.json", to="t.parquet"):
    path = tmp_path / to
    path.write_bytes(to_parquet_bytes(load_trace(DATA / "traces" / name)))
    return path


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("others", [{}, {"notes.txt": b"mine", "sub/data.bin": b"\x00\x01"}])
def test_a_folder_holding_an_overview_json_of_its_own_is_left_alone(tmp_path, capsys, monkeypatch, others):
    """`--out DIR` (and `--out .`) on a folder this tool did not write, even one holding a file named
    overview.json: refused with one line naming it, every file kept byte for byte."""
    trace = _trace_file(tmp_path)
    d = tmp_path / "work"
    d.mkdir()
    (d / "overview.json").write_text('{"version": 1, "mine": true}')
    for name, data in others.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
    before = _tree(d)
    for out in (str(d), "."):
        monkeypatch.chdir(d)
        assert main(["overview", str(trace), "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(d) in err[0] and "not an overview this tool wrote" in err[0], err
        assert _tree(d) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet", "work"]    # no temporary folder left


def test_an_overview_folder_that_is_a_link_or_unwritable_is_named_in_one_line(tmp_path, capsys):
    trace = _trace_file(tmp_path)
    real = tmp_path / "real"
    assert main(["overview", str(trace), "--out", str(real)]) == 0
    capsys.readouterr()
    before = _tree(real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert main(["overview", str(trace), "--out", str(link)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(link) in err[0] and "symbolic link" in err[0], err
    assert link.is_symlink() and _tree(real) == before
    ro = unwritable_dir(tmp_path)
    assert main(["overview", str(trace), "--out", str(ro / "ov")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(ro / "ov") in err[0] and "cannot write the overview here" in err[0], err


def test_only_the_files_this_tool_wrote_are_replaced(tmp_path, capsys):
    """A folder the user made (empty) is filled, and on a rebuild kept (never removed) with only our files
    replaced; a folder we made is replaced whole; a file of the user's put in either stops a rebuild."""
    trace = _trace_file(tmp_path)
    given = tmp_path / "given"
    given.mkdir()
    ino = given.stat().st_ino
    assert main(["overview", str(trace), "--out", str(given)]) == 0
    wrote = sorted(p.name for p in given.iterdir())
    assert overview.MARKER in wrote and "overview.json" in wrote and "tokens.parquet" in wrote
    trace.write_bytes(to_parquet_bytes(load_trace(DATA / "traces" / "cold_start_measured_cpu.json")))
    assert main(["overview", str(trace), "--out", str(given)]) == 0
    assert given.stat().st_ino == ino                     # the same folder, refilled
    assert json.loads((given / "overview.json").read_text())["summary"]["summary"]["requests"] == 5
    (given / "notes.txt").write_text("mine")
    assert main(["overview", str(trace), "--out", str(given)]) == 2
    assert "holds 'notes.txt'" in capsys.readouterr().err
    assert (given / "notes.txt").read_text() == "mine" and (given / "overview.json").exists()
    ov, _ = overview.open_overview(trace)                  # beside the trace: a folder we create
    (ov.folder / "notes.txt").write_text("mine")
    trace.write_bytes(to_parquet_bytes(load_trace(DATA / "traces" / "chapter31_measured_cpu.json")))
    with pytest.raises(InputError, match="holds 'notes.txt'"):
        overview.open_overview(trace)
    assert (ov.folder / "notes.txt").read_text() == "mine"
    (ov.folder / "notes.txt").unlink()
    ov2, took = overview.open_overview(trace)
    assert took is not None and len(ov2.requests) == len(load_trace(trace).requests)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]        # no folder set aside is left


def test_a_half_built_overview_is_rebuilt_not_drawn(tmp_path):
    """An overview of ours missing a file (a build cut short, a copy half made) is built again when opened,
    so the KV view the page reads later draws the trace's block states."""
    tr = load_trace(DATA / "traces" / "shared_prefix_measured_cpu.json.gz")
    path = tmp_path / "t.parquet"
    path.write_bytes(to_parquet_bytes(tr))
    ov, _ = overview.open_overview(path)
    (ov.folder / "occupancy.parquet").unlink()
    ov2, took = overview.open_overview(path)
    assert took is not None
    want = block_states(tr, max_snapshots=160)
    assert np.array_equal(ov2.occupancy().state, want.state)


def test_a_trace_replaced_during_its_build_is_built_again_not_mixed(tmp_path):
    """The overview records the trace it was built from: a trace replaced while the overview was being
    built gets an overview of the new trace (its summary, its requests), never the old numbers under the
    new trace's identity; one that keeps changing is refused in one line."""
    from core.analysis.outofcore import summarize_parquet
    path = _trace_file(tmp_path)                                      # 3 requests
    new = to_parquet_bytes(load_trace(DATA / "traces" / "cold_start_measured_cpu.json"))   # 5 requests
    swapped = []

    def replace_once(msg):
        if msg.startswith("tokens by request") and not swapped:
            path.write_bytes(new)
            swapped.append(msg)
    folder = overview.build(path, progress=replace_once)
    assert swapped and overview.current(path) == folder
    ov = overview.Overview(folder, path.name)
    assert len(ov.requests) == 5 and ov.rows()["tokens"] == len(load_trace(path).tokens)
    got, want = ov.summary()["summary"], summarize_parquet(path)["summary"]   # DuckDB: equal to the last bits
    assert got.keys() == want.keys()
    assert got["requests"] == got["completed"] == 5 and got["output_tokens"] == want["output_tokens"]
    assert all(close(got["ttft_ms"][q], want["ttft_ms"][q]) for q in want["ttft_ms"])
    flip = [to_parquet_bytes(load_trace(DATA / "traces" / n)) for n in ("chapter31_measured_cpu.json",
                                                                        "cold_start_measured_cpu.json")]

    def replace_always(msg):
        if msg.startswith("tokens by request"):
            path.write_bytes(flip[path.stat().st_size == len(flip[0])])
    with pytest.raises(InputError, match=f"changed during each of {overview.BUILD_TRIES} builds"):
        overview.build(path, out=tmp_path / "other", progress=replace_always)
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob(".*.part"))


def test_a_trace_rewritten_with_its_size_and_time_kept_is_stale(tmp_path):
    path = _trace_file(tmp_path)
    folder = overview.build(path)
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF          # one byte of the data changed, the size and mtime put back
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert overview.current(path) is None and folder.exists()


def test_the_replay_page_names_an_overview_folder_it_cannot_use(tmp_path, monkeypatch):
    """An overview folder beside the trace that is a link (or a folder of the user's): st.error naming it,
    not "This app has encountered an error"; the link and its target stay."""
    from streamlit.testing.v1 import AppTest
    path = _trace_file(tmp_path, "shared_prefix_measured_cpu.json.gz", "big.parquet")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "overview.json").write_text('{"version": 1}')
    (tmp_path / "big.parquet.overview").symlink_to(elsewhere, target_is_directory=True)
    monkeypatch.setenv("SERVING_EXPLORER_TRACES", str(tmp_path))
    monkeypatch.setattr(overview, "LARGE_TRACE_ROWS", 10)
    at = AppTest.from_file(str(ROOT / "pages" / "replay.py"), default_timeout=120)
    at.query_params["tr"] = path.name
    at.run()
    assert not at.exception, at.exception[0].message
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "big.parquet.overview" in errors[0] and "symbolic link" in errors[0], errors
    assert (tmp_path / "big.parquet.overview").is_symlink() and (elsewhere / "overview.json").exists()


def test_a_trace_replaced_by_another_of_the_same_name_size_and_time_is_read_again(tmp_path):
    """Issue 48 item 21: the page's caches were keyed by a file's name, size and modification time, so a
    trace replaced by another with all three equal (cp -p, a restored backup) kept the old one's
    results. Keyed by ui.cache.file_version (a hash of its first and last 64 KiB too), it is read again."""
    import os

    from ui.cache import file_version, load_trace_file
    doc = json.loads((DATA / "traces" / "chapter31_continuous.json").read_text())
    f = tmp_path / "t.json"
    a = dict(doc, meta={**doc["meta"], "label": "AAAA"})
    b = dict(doc, meta={**doc["meta"], "label": "BBBB"})
    f.write_text(json.dumps(a))
    t = f.stat().st_mtime_ns
    first = load_trace_file(f)[0]
    v1 = file_version([f])
    f.write_text(json.dumps(b))
    os.utime(f, ns=(t, t))
    assert f.stat().st_size == len(json.dumps(a))
    assert file_version([f]) != v1
    again = load_trace_file(f)[0]
    assert (first.meta["label"], again.meta["label"]) == ("AAAA", "BBBB")
