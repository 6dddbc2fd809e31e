"""Out-of-core metrics (issue 29): core.analysis.outofcore computes, with DuckDB over the Parquet
file or its parts, the same summary as core.analysis.metrics.summarize on the loaded trace, field
by field (percentiles exact: both are Hyndman-Fan type 7), on bundled traces of every origin,
with fixed windows, tariffs and SLOs; and the CLI uses it past its row threshold or when asked."""
import json

import pytest

from bench.helpers import comparable, differences
from core.__main__ import main
from core.analysis.metrics import SLO, summarize
from core.errors import InputError
from core.trace import load_trace
from core.trace.parquet import to_parquet_bytes, write_parquet_parts
from tests.conftest import DATA

pytest.importorskip("duckdb")
from core.analysis.outofcore import summarize_parquet

TRACES = ("chapter31_continuous.json", "shared_prefix_caching_on.json.gz", "shared_prefix_measured_cpu.json.gz",
          "spec_measured_cpu.json", "runner_served_tiny_loadgen.json.gz", "vllm_cpu_run2_merged.json.gz")
OPTIONS = ({}, {"usd_per_hour": 3.0, "slo": SLO(ttft_ms=200.0, tpot_ms=30.0)},
           {"window": (100.0, 900.0), "slo": SLO(e2e_ms=1000.0)}, {"percentiles": (25, 75, 99.9)})


@pytest.fixture(scope="module")
def parquet_traces(tmp_path_factory):
    out = {}
    for name in TRACES:
        tr = load_trace(DATA / "traces" / name)
        d = tmp_path_factory.mktemp(name.split(".")[0])
        (d / "t.parquet").write_bytes(to_parquet_bytes(tr))
        write_parquet_parts(tr, d / "parts", rows_per_part=997)      # many parts, cut mid-table
        out[name] = (tr, d / "t.parquet", d / "parts")
    return out


@pytest.mark.parametrize("name", TRACES)
def test_out_of_core_equals_the_loaded_trace(parquet_traces, name):
    tr, file, parts = parquet_traces[name]
    for kw in OPTIONS:
        want = comparable(summarize(tr, per_request=False, **kw)["summary"])
        for where in (file, parts):
            got = summarize_parquet(where, **kw)
            assert got["computed"]["out_of_core"] and got["computed"]["percentiles"] == "exact"
            assert differences(want, comparable(got["summary"])) == [], (name, kw, where.name)


def test_the_engines_kv_events_are_summarised_out_of_core(parquet_traces):
    tr, file, parts = parquet_traces["vllm_cpu_run2_merged.json.gz"]
    want = summarize(tr, per_request=False)["summary"]["kv_events"]
    assert want["stored_blocks"] and want["peak_cached_blocks"]
    for where in (file, parts):
        assert summarize_parquet(where)["summary"]["kv_events"] == want


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(InputError, match="read Parquet"):
        summarize_parquet(DATA / "traces" / "chapter31_continuous.json")
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not parquet PAR1")
    with pytest.raises(InputError, match="x.parquet: not a readable Parquet file"):
        summarize_parquet(tmp_path / "x.parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"a": [1]}), tmp_path / "plain.parquet")
    with pytest.raises(InputError, match="not a serving trace"):
        summarize_parquet(tmp_path / "plain.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="without .parquet parts"):
        summarize_parquet(tmp_path / "empty")


def test_the_cli_summarises_out_of_core_when_asked_or_past_its_threshold(parquet_traces, capsys, monkeypatch):
    tr, file, parts = parquet_traces["shared_prefix_caching_on.json.gz"]
    assert main(["metrics", str(parts), "--json", "--out-of-core"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["computed"]["out_of_core"] and "requests" not in got
    assert differences(comparable(summarize(tr, per_request=False)["summary"]), comparable(got["summary"])) == []
    import core.commands.common as cli
    monkeypatch.setattr(cli, "OUT_OF_CORE_ROWS", 10)
    assert main(["metrics", str(file), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["computed"]["out_of_core"] and "summarised out of core" in out.err
    assert main(["metrics", str(file)]) == 0                     # the text report from the same summary
    assert "TTFT" in capsys.readouterr().out


def test_percentiles_of_a_column_too_large_for_one_quantile_state_are_exact():
    """Past EXACT_IN_MEMORY values (the 1M-request trace's 256 M ITL gaps) percentiles are found by
    narrowing buckets of the column; exact against numpy's 'linear' on a skewed column with ties,
    values on bucket edges and one huge outlier."""
    import duckdb
    import numpy as np
    import pyarrow as pa

    from core.analysis.outofcore import _narrowed_quantiles
    rng = np.random.default_rng(0)
    v = np.r_[rng.lognormal(3, 1, 2_500_000), np.full(400_000, 30.0), rng.integers(0, 50, 400_000).astype(float),
              [1e9]]
    con = duckdb.connect()
    con.register("t", pa.table({"g": v}))
    qs = [0.5, 0.9, 0.99, 0.999, 0.1234567, 0.0, 1.0]
    got = _narrowed_quantiles(con, "t", "g", "g IS NOT NULL", len(v), float(v.min()), float(v.max()), qs)
    want = np.percentile(v, [100 * q for q in qs], method="linear")
    assert got == pytest.approx(want.tolist(), rel=1e-12, abs=0)


def test_a_damaged_parquet_file_is_named_as_such_by_the_cli(parquet_traces, tmp_path, capsys):
    _, file, _ = parquet_traces["chapter31_continuous.json"]
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(file.read_bytes()[: len(file.read_bytes()) // 2])
    assert main(["metrics", str(cut), "--out-of-core"]) == 2
    assert "cut.parquet: not a readable Parquet file" in capsys.readouterr().err



def test_a_metric_is_defined_once_for_both_paths(parquet_traces, monkeypatch):
    """Change one definition (core/analysis/definitions.py) and both paths follow: TTFT + 1000 ms,
    Little's L from a doubled sum, the fit's decoding sequences counted twice. Neither path has
    a copy of its own to keep computing the old numbers."""
    from core.analysis import definitions as d
    from core.analysis.expr import Agg, Col, If
    from core.fit.outofcore import features_parquet
    from core.fit.stepfit import trace_features
    tr, file, _ = parquet_traces["shared_prefix_caching_on.json.gz"]
    before_mem = summarize(tr, per_request=False)["summary"]
    before_ooc = summarize_parquet(file)["summary"]
    steps, X, _ = trace_features(tr)
    _, Xo, _, _, _ = features_parquet(file)
    monkeypatch.setitem(d.REQUEST, "ttft_ms", Col("first_token_ms") - Col("arrival_ms") + 1000.0)
    monkeypatch.setitem(d.LITTLE, "inside", Agg("fsum", 2.0 * (d.Clip(Col("last_token_ms"), d.START, d.END)
                                                              - d.Clip(Col("arrival_ms"), d.START, d.END)),
                                                where=d._DONE))
    monkeypatch.setitem(d.STEP_FEATURES, "decode_seqs", If(d.PREFILL_ENTRY, 0.0, 2.0))
    for after, before in ((summarize(tr, per_request=False)["summary"], before_mem),
                          (summarize_parquet(file)["summary"], before_ooc)):
        assert after["ttft_ms"]["mean"] == pytest.approx(before["ttft_ms"]["mean"] + 1000.0, rel=1e-12)
        assert after["ttft_ms"]["p99"] == pytest.approx(before["ttft_ms"]["p99"] + 1000.0, rel=1e-12)
        assert after["littles_law"]["L"] == pytest.approx(2 * before["littles_law"]["L"], rel=1e-12)
        # unchanged (DuckDB's parallel aggregates may differ in the last bit between two queries)
        assert after["tpot_ms"] == pytest.approx(before["tpot_ms"], rel=1e-12)
    _, X2, _ = trace_features(tr)
    _, Xo2, _, _, _ = features_parquet(file)
    assert X[:, 2].sum() > 0
    assert list(X2[:, 2]) == list(2 * X[:, 2]) and list(Xo2[:, 2]) == pytest.approx(list(2 * Xo[:, 2]))
