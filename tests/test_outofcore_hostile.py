"""Hostile inputs that still got through (issue 48 items 22-24): Parquet traces the out-of-core path
(DuckDB over the file) ended in a Python exception line, a search whose every configuration is invalid,
a Parquet head nested thousands of levels deep. Each is now one line naming the file, the field and what
was expected (CLI: exit status 2), the same from the in-memory reader and out of core; or, where the
in-memory reader reads the file, the same numbers out of core. Inputs are built at test time from a
bundled trace with pyarrow."""
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from core.__main__ import main
from core.analysis.metrics import summarize
from core.errors import InputError, TraceError
from core.trace import load_trace
from core.trace.parquet import to_parquet_bytes, trace_from_parquet
from core.trace.writer import PARQUET_KEY, RTYPES
from tests.conftest import DATA

pytest.importorskip("duckdb")
from core.analysis.outofcore import summarize_parquet

TRACE = DATA / "traces" / "shared_prefix_caching_on.json.gz"


@pytest.fixture(scope="module")
def table():
    """The bundled trace as one Arrow table in the file layout (its head in the schema metadata)."""
    return pq.read_table(pa.BufferReader(to_parquet_bytes(load_trace(TRACE))))


def head_of(t) -> dict:
    return json.loads(t.schema.metadata[PARQUET_KEY])


def with_head(t, head):
    return t.replace_schema_metadata({PARQUET_KEY: head if isinstance(head, bytes) else json.dumps(head).encode()})


def with_column(t, name, values):
    return t.set_column(t.column_names.index(name), name, values)


def nulls_in(t, column, rtype):
    """`t` with `column` null in every row of record type `rtype`."""
    col = t.column(column)
    return with_column(t, column, pc.if_else(pc.equal(t.column("rtype"), rtype), pa.scalar(None, col.type), col))


def write(t, path, by_type=False):
    """`t` as a Parquet file: one row group, or (by_type) one row group per run of a record type, the
    layout our writer makes (the in-memory reader then reads each record type's row groups on their own)."""
    if not by_type:
        pq.write_table(t, path)
        return path
    rt = t.column("rtype").to_pylist()
    with pq.ParquetWriter(path, t.schema) as w:
        start = 0
        for i in range(1, len(rt) + 1):
            if i == len(rt) or rt[i] != rt[start]:
                w.write_table(t.slice(start, i - start))
                start = i
    return path


COMMANDS = {"metrics": lambda p, tmp: ["metrics", p], "fit": lambda p, tmp: ["fit", p],
            "export": lambda p, tmp: ["export", p, "--csv", str(tmp / "out.csv")]}


def one_line(capsys, argv) -> str:
    """The command's one line on stderr (exit status 2, no traceback)."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, (rc, err)
    return err.strip()


def refused_everywhere(capsys, tmp_path, path, *words) -> str:
    """Every command (metrics, fit, export), in memory and out of core, refuses `path` in the same line."""
    lines = {one_line(capsys, COMMANDS[c](path, tmp_path) + extra)
             for c in COMMANDS for extra in ([], ["--out-of-core"])}
    assert len(lines) == 1, lines
    line = lines.pop()
    for w in words:
        assert w in line, line
    return line


# ---- item 22: the out-of-core path's exception lines ---------------------------------------------------

@pytest.mark.parametrize("by_type", [False, True])
def test_a_head_whose_stats_are_not_counts_is_one_line(tmp_path, capsys, table, by_type):
    """meta.stats values that are strings ended metrics (both paths) in "ValueError: invalid literal for int()"
    (the KV pool's size read as a number): the head is refused where it is read, naming the field."""
    head = head_of(table)
    head["meta"]["stats"] = {k: "lots" for k in head["meta"]["stats"]}
    p = write(with_head(table, head), tmp_path / "head_stats_str.parquet", by_type)
    refused_everywhere(capsys, tmp_path, p, "head_stats_str.parquet: meta.stats.steps: expected a count "
                                            "(an integer >= 0), got 'lots'")
    head["meta"]["stats"] = {"kv_blocks": "400"}
    p = write(with_head(table, head), tmp_path / "kv_blocks_str.parquet", by_type)
    refused_everywhere(capsys, tmp_path, p, "meta.stats.kv_blocks: expected a count")
    head["meta"]["stats"] = ["not", "an", "object"]
    p = write(with_head(table, head), tmp_path / "stats_list.parquet", by_type)
    refused_everywhere(capsys, tmp_path, p, "meta.stats: expected an object of counts")


def test_a_json_trace_whose_stats_are_not_counts_is_one_line_too(tmp_path, capsys):
    """The same check for the JSON form (core.trace.validate.check_meta, which both forms' readers call)."""
    from core.trace import save_trace
    tr = load_trace(TRACE)
    tr.meta["stats"] = {**tr.meta["stats"], "kv_blocks": "lots"}
    save_trace(tr, tmp_path / "t.json")
    assert "t.json: meta.stats.kv_blocks: expected a count (an integer >= 0), got 'lots'" in \
        one_line(capsys, ["metrics", tmp_path / "t.json"])


@pytest.mark.parametrize("by_type", [False, True])
@pytest.mark.parametrize("column", ["dur_ms", "running", "waiting", "kv_used_blocks", "replica"])
def test_nulls_the_in_memory_reader_fills_are_filled_out_of_core(tmp_path, capsys, table, by_type, column):
    """Step rows whose dur_ms is null, or whose running column is all null, ended metrics --out-of-core in a
    TypeError (float(None), int(None)): the in-memory reader reads such a null as the field's fill value
    (dur_ms 0, running -1: not recorded), and so does DuckDB's view of the file now. Same summary, same fit,
    same exported metrics."""
    import pandas as pd

    from core.analysis.metrics import request_metrics
    from core.analysis.outofcore import request_metrics_parquet
    from core.fit.outofcore import fit_parquet
    from core.fit.stepfit import fit
    p = write(nulls_in(table, column, "step"), tmp_path / f"{column}_null.parquet", by_type)
    tr = load_trace(p)
    assert differences(summarize(tr, per_request=False)["summary"], summarize_parquet(p)["summary"]) == []
    want, got = fit(tr), fit_parquet(p)
    assert want[0].to_dict() == got[0].to_dict() and want[1]["steps"] == got[1]["steps"]
    pd.testing.assert_frame_equal(request_metrics_parquet(p), request_metrics(tr), check_dtype=False)
    for argv in (["metrics", p, "--out-of-core"], ["fit", p, "--out-of-core"],
                 ["export", p, "--out-of-core", "--csv", tmp_path / "o.csv"]):
        assert main([str(a) for a in argv]) == 0
        assert "Traceback" not in capsys.readouterr().err


def test_an_optional_column_the_file_lacks_reads_as_its_fill_out_of_core(tmp_path, table):
    """A column the file does not have is all null for the in-memory reader; out of core too (it was a
    DuckDB binder error: the finish records' reason, read by the summary)."""
    p = write(table.drop_columns(["reason", "dur_ms", "replica"]), tmp_path / "lacks.parquet")
    assert differences(summarize(load_trace(p), per_request=False)["summary"], summarize_parquet(p)["summary"]) == []


@pytest.mark.parametrize("by_type", [False, True])
def test_rtype_stored_as_integers_is_refused_by_its_declared_type(tmp_path, capsys, table, by_type):
    """The record types as integers ended fit --out-of-core and export --out-of-core in a DuckDB
    ConversionException traceback (metrics --out-of-core: "Conversion Error: Could not convert string
    'request' to INT64"), in memory "unknown record type": the declared type is checked from the footer,
    by both readers, before DuckDB compares a value."""
    codes = pa.array([RTYPES.index(r) for r in table.column("rtype").to_pylist()], pa.int64())
    p = write(with_column(table, "rtype", codes), tmp_path / "rtype_int.parquet", by_type)
    refused_everywhere(capsys, tmp_path, p, "rtype_int.parquet: column rtype: stored as int64, expected string")


WRONG_KINDS = {
    "t_ms as text": ("t_ms", lambda col: pc.cast(col, pa.string()), "column t_ms: stored as string, expected float64"),
    "json as integers": ("json", lambda col: pa.array([None] * len(col), pa.int64()),
                         "column json: stored as int64, expected string"),
    "running as booleans": ("running", lambda col: pc.greater(col, 0),
                            "column running: stored as bool, expected int64"),
    "step as lists": ("step", lambda col: pa.array([None if x is None else [x] for x in col.to_pylist()]),
                      "column step: stored as list<"),
}


@pytest.mark.parametrize("case", sorted(WRONG_KINDS))
def test_a_column_of_the_wrong_kind_is_one_line_in_both_readers(tmp_path, capsys, table, case):
    column, change, words = WRONG_KINDS[case]
    p = write(with_column(table, column, change(table.column(column))), tmp_path / "kind.parquet")
    refused_everywhere(capsys, tmp_path, p, f"kind.parquet: {words}")


def test_numbers_stored_in_another_numeric_type_are_read_as_the_layouts(tmp_path, table):
    """Another writer's integers as int32, or as float64 holding nulls (pandas writes an integer column with
    missing values so), are numbers: both readers read them, to the same numbers."""
    t = with_column(table, "step", pc.cast(table.column("step"), pa.int32()))
    for c in ("running", "waiting", "req", "index", "tokens"):
        t = with_column(t, c, pc.cast(t.column(c), pa.float64()))
    p = write(t, tmp_path / "other_types.parquet")
    tr = load_trace(p)
    assert tr.steps["step"].dtype == "int64"
    assert differences(summarize(tr, per_request=False)["summary"], summarize_parquet(p)["summary"]) == []
    is_step = pc.equal(t.column("rtype"), "step")
    bad = with_column(t, "running", pc.if_else(is_step, pa.scalar(1.5), t.column("running")))
    write(bad, tmp_path / "half.parquet")
    for read in (lambda: load_trace(tmp_path / "half.parquet"),
                 lambda: summarize_parquet(tmp_path / "half.parquet")):
        with pytest.raises(InputError, match="half.parquet: column running: does not hold int64"):
            read()


# ---- item 24: a head nested thousands of levels deep ----------------------------------------------------

def deep_head(table, depth, kind):
    raw = json.dumps(head_of(table)).encode()
    nest = b"[" * depth + b"]" * depth if kind == "list" else b'{"x":' * depth + b"1" + b"}" * depth
    return with_head(table, raw.replace(b'"meta": {', b'"meta": {"x": ' + nest + b", ", 1))


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("depth", [2500, 100_000])
def test_a_head_nested_past_the_limit_is_one_line_naming_depth_and_limit(tmp_path, capsys, table, kind, depth):
    """A head whose meta holds {"x": [[[...]]]} thousands of levels deep: "JSON nested too deeply" without
    how deep, after pyarrow had read the whole table on its thread pool (a process exiting while that pool
    winds down now and then aborted: exit -6, "terminate called without an active exception"). Now the
    depth and the limit, from the footer, before a row is read; the same line in memory and out of core."""
    p = write(deep_head(table, depth, kind), tmp_path / "deep.parquet")
    refused_everywhere(capsys, tmp_path, p, f"deep.parquet: serving-trace metadata: JSON nested too deeply "
                                            f"({depth + 2:,} levels; at most 1,024 are read)")


def test_a_deep_head_is_refused_before_any_row_is_read_or_duckdb_started(tmp_path, table, monkeypatch):
    import core.analysis.outofcore as ooc
    import core.trace.parquet as tp
    from core.trace.parquet import write_parquet_parts
    p = write(deep_head(table, 3000, "list"), tmp_path / "deep.parquet")
    parts = tmp_path / "parts"
    write_parquet_parts(load_trace(TRACE), parts, rows_per_part=5000)
    for part in sorted(parts.iterdir()):
        pq.write_table(deep_head(pq.read_table(part), 3000, "list"), part)

    def no(*a, **k):
        raise AssertionError("rows read (or DuckDB started) before the head was checked")
    monkeypatch.setattr(tp, "_arrow", no)
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", no)
    monkeypatch.setattr(ooc, "duck_connect", no)
    for read in (lambda: trace_from_parquet(p.read_bytes(), "deep.parquet"), lambda: load_trace(parts),
                 lambda: summarize_parquet(p), lambda: summarize_parquet(parts)):
        with pytest.raises(TraceError, match=r"nested too deeply \(3,002 levels; at most 1,024 are read\)"):
            read()


def test_a_head_within_the_limit_is_read(tmp_path, table):
    p = write(deep_head(table, 500, "dict"), tmp_path / "d.parquet")
    assert summarize_parquet(p)["summary"]["requests"] == len(load_trace(p).requests)


# ---- item 23: a search none of whose configurations can run ----------------------------------------------

SHARED = str(DATA / "workloads" / "shared_prefix_200.json")


@pytest.mark.parametrize("results", [False, True])
def test_a_search_none_of_whose_configurations_can_run_says_why(tmp_path, capsys, results):
    """Every grid point invalid (max_seqs 0 and -1) ended `search --results DIR` in "cannot read the results
    back (No match for FieldRef.Name(job) ...)": no job ran, nothing was written, and the empty dataset was
    read back. Now one line: none can run, and the first reasons; the location is not claimed."""
    where = tmp_path / "runs"
    extra = ["--results", where] if results else []
    line = one_line(capsys, ["search", SHARED, "--rate", "5", "--grid", "max_seqs=0,-1,-2,-3,-4",
                             "--slo-ttft-ms", "500", *extra])
    assert line.startswith("error: search: none of the grid's 5 configurations can run the workload "
                           "shared_prefix_200: max_seqs 0: grid point: max_seqs: expected a positive integer"), line
    assert "max_seqs -2:" in line and "max_seqs -3" not in line and line.endswith("; and 2 more")
    assert not where.exists()


@pytest.mark.parametrize("results", [False, True])
def test_a_search_whose_pools_are_all_too_small_says_why(tmp_path, capsys, results):
    """Each configuration valid, but none can hold the workload's longest request (a KV pool too small):
    the same line, with the pool's reason."""
    extra = ["--results", tmp_path / "runs"] if results else []
    line = one_line(capsys, ["search", SHARED, "--rate", "5", "--grid", "kv_blocks=2,3", "--slo-ttft-ms", "500",
                             *extra])
    assert "none of the grid's 2 configurations can run the workload shared_prefix_200: kv_blocks 2: kv_blocks: " \
           "request" in line and "but the pool has 3" in line, line


def test_a_search_with_one_configuration_that_runs_is_answered(capsys):
    assert main(["search", SHARED, "--rate", "5", "--grid", "max_seqs=0,16", "--slo-ttft-ms", "500",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [("invalid" in p) for p in got["points"]] == [True, False]


def differences(a, b):
    from tests.test_outofcore import differences as diff
    return diff(a, b)
