"""A Parquet trace (a .parquet file or a directory of parts) as DuckDB reads it where it lives: its
files and their footers (rows, the trace's head), a connection with a bounded memory limit, the
checks the in-memory reader makes of a trace it loads (made here in SQL: what it refuses in one
line is refused here in that line), and the views `src` and `scan` of every row with its place in
the trace, decode spans and whole-table KV frees expanded in SQL as the in-memory reader expands
them. What core.analysis.outofcore's metrics and core.fit.outofcore's step fit read."""
from __future__ import annotations

import os
from pathlib import Path

from core.errors import InputError, TraceError
from core.trace.model import BadColumn
from core.trace.parquet import parquet_head
from core.trace.schema import REQUEST, TABLES
from core.trace.validate import Problems
from core.trace.writer import COLUMNS

MEMORY_LIMIT = "1GB"          # DuckDB's working set; the rest spills to disk
ITL_SLICE_TOKENS = 20_000_000  # token rows per slice of the ITL window
EXACT_IN_MEMORY = 20_000_000   # values a percentile is taken of in one quantile state; more: by narrowing
HEAD_KEY = b"serving-trace"   # the Parquet schema metadata holding the trace's head (schema, meta)


def parquet_files(path) -> list[Path]:
    """The Parquet file, or a directory's parts in name order (core.trace.parquet's layout)."""
    p = Path(path)
    if p.is_dir():
        parts = sorted(q for q in p.iterdir() if q.suffix == ".parquet")
        if not parts:
            raise InputError(f"{p}: a directory without .parquet parts")
        return parts
    if p.suffix != ".parquet":
        raise InputError(f"{p}: out-of-core analysis (metrics, overview, compare, fit, export) can only read Parquet "
                         "traces (a .parquet file or a directory of parts)")
    if not p.exists():
        raise InputError(f"{p}: no such file")
    return [p]


def parquet_rows(path) -> int | None:
    """Rows of a Parquet trace (a .parquet file or a directory of parts) from its footers; None for other
    files, or one that is not Parquet after all (the ordinary reader then says what is wrong)."""
    import pyarrow.parquet as pq
    p = Path(path)
    files = sorted(p.glob("*.parquet")) if p.is_dir() else [p] if p.suffix == ".parquet" and p.is_file() else []
    try:
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files) if files else None
    except Exception:       # pyarrow raises many types for a damaged file
        return None


def trace_head(files: list[Path]) -> dict:
    """The trace's head ({"schema", "meta"}) from the first part's Parquet metadata, checked as the
    in-memory reader checks it (core.trace.parquet.parquet_head)."""
    return _head_of(files[0], _schema(files[0]))


def _schema(f: Path):
    """A part's Arrow schema (with the head in its metadata), from its footer."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        return pq.read_schema(f)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{f}: not a readable Parquet file ({e})") from None


def _head_of(f: Path, schema) -> dict:
    if HEAD_KEY not in (schema.metadata or {}):
        raise InputError(f"{f}: not a serving trace (no '{HEAD_KEY.decode()}' metadata)")
    return parquet_head(schema, f.name)


def duck_connect(tmp: str):
    import duckdb
    con = duckdb.connect(config={"memory_limit": MEMORY_LIMIT, "temp_directory": tmp,
                                 "threads": max(1, os.cpu_count() or 1)})
    con.execute("SET enable_progress_bar = false")    # a long query would draw a bar on the terminal
    return con


def source_view(con, files: list[Path]) -> set:
    """The view `src`: every row of the parts with its place in the trace (rowkey: part, row in part),
    and `scan`: the rows in file order unsorted (a plain scan keeps it). Each holds every column of the
    layout in the layout's type, read as the in-memory reader reads it (`_column_sql`: a null in a field
    with a fill value is that value, a column the file lacks all null). The files' heads and declared
    columns are checked first (`check_layout`, no row read), then their rows (`check_parquet`). Returns
    the layout's columns the file has, and rowkey."""
    present = check_layout(files)
    names = [str(f) for f in files]
    con.execute("CREATE TEMP TABLE parts (filename VARCHAR, part BIGINT)")
    con.executemany("INSERT INTO parts VALUES (?, ?)", [(f, k) for k, f in enumerate(names)])
    listed = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in names) + "]"   # a view takes no parameters
    stored = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({listed})").fetchall()}
    cols = lambda s: ", ".join(_column_sql(c, stored, s) for c in COLUMNS)
    # every row with its place in the trace: (part, row in part)
    con.execute(f"CREATE TEMP VIEW src_file AS SELECT {cols('s.')}, p.part * 4294967296 + s.file_row_number AS rowkey "
                f"FROM read_parquet({listed}, filename=true, file_row_number=true) s JOIN parts p USING (filename)")
    spans = con.execute("SELECT 1 FROM src_file WHERE rtype = 'span' LIMIT 1").fetchone() is not None
    frees = con.execute("SELECT 1 FROM src_file WHERE rtype = 'kv_free' LIMIT 1").fetchone() is not None
    if spans or frees:   # decode spans and frees of whole tables expanded (core.trace.spans)
        if frees:
            _free_tables(con)
        con.execute(f"CREATE TEMP VIEW src AS {_expanded_sql(spans, frees)}")
        con.execute(f"CREATE TEMP VIEW scan AS SELECT {', '.join(_q(c) for c in COLUMNS)} FROM src ORDER BY rowkey")
    else:
        con.execute("CREATE TEMP VIEW src AS SELECT * FROM src_file")
        # the rows in file order without sorting: a plain scan keeps it (DuckDB's preserve_insertion_order)
        con.execute(f"CREATE TEMP VIEW scan AS SELECT {cols('')} FROM read_parquet({listed})")
    check_parquet(con, files, spans, frees)
    return (present & set(COLUMNS)) | {"rowkey"} | ({"step"} if spans else set())


def _free_tables(con):
    """A file's frees of whole tables (kv_free rows), with what places their rows: `kv_fr` (n blocks,
    after `pos` listed KV rows, the blocks freed before it in the file and by its request), `kv_upto`
    (per place, the freed rows up to it) and the view `kv_al` (each allocation's number for its request)."""
    con.execute("""CREATE TEMP TABLE kv_fr AS SELECT row_number() OVER (ORDER BY rowkey) - 1 AS k, t_ms, req,
                   logical + 1 AS n, "index" AS pos,
                   coalesce(sum(logical + 1) OVER (ORDER BY rowkey ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                       AS before_all,
                   coalesce(sum(logical + 1) OVER (PARTITION BY req ORDER BY rowkey
                                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before_req
                   FROM src_file WHERE rtype = 'kv_free'""")
    con.execute("CREATE TEMP TABLE kv_upto AS SELECT pos, max(before_all + n) AS upto FROM kv_fr GROUP BY pos")
    con.execute("""CREATE TEMP VIEW kv_listed AS SELECT *, row_number() OVER (ORDER BY rowkey) - 1 AS p
                   FROM src_file WHERE rtype = 'kv'""")
    con.execute("""CREATE TEMP VIEW kv_al AS SELECT req, block, logical, p,
                   row_number() OVER (PARTITION BY req ORDER BY p) - 1 AS ai FROM kv_listed WHERE op = 'alloc'""")


def _q(c: str) -> str:
    return f'"{c}"'


def _expanded_sql(spans: bool, frees: bool) -> str:
    """The view `src` of a file with decode spans or frees of whole tables (core.trace.spans, in SQL): its
    other rows as they are; with spans its listed token and batch rows keyed by (step, join) and each
    span's tokens and batch entries, one per step, each token at its step's end (the first step record
    of that number); with frees its listed KV rows and each free's rows (its request's allocations, the
    last first) keyed by their place among the KV rows."""
    from core.trace.spans import KEY

    def row(vals: dict) -> str:
        return ", ".join(f"{vals.get(c, f'CAST(NULL AS {_SQL_TYPES[COLUMNS[c]]})')} AS {_q(c)}" for c in COLUMNS)
    keyed = [_q(c) if c != "rtype" else c for c in COLUMNS]
    own = ["span", "kv_free"] + (["token", "batch"] if spans else []) + (["kv"] if frees else [])
    parts = ["SELECT * FROM src_file WHERE " + " AND ".join(f"rtype <> '{r}'" for r in own)]
    if spans:
        common = {"req": "e.req", "step": "e.step", "join": 'e."join"'}
        tok = row(common | {"rtype": "'token'", "t_ms": "st.t_end", "index": 'e."index"', "source": "'sampled'",
                            "token_id": "CAST(-1 AS BIGINT)", "replica": "CAST(0 AS BIGINT)"})
        bat = row(common | {"rtype": "'batch'", "kind": "'decode'", "tokens": "CAST(1 AS BIGINT)"})
        expanded = """(SELECT s.req, s."join", s.step + k AS step, s."index" + k AS "index"
                        FROM (SELECT req, "join", step, "index", unnest(range(tokens)) AS k
                              FROM src_file WHERE rtype = 'span') s)"""
        steps = ("(SELECT step, arg_min(t_ms + dur_ms, rowkey) AS t_end FROM src_file WHERE rtype = 'step' "
                 "GROUP BY step)")
        parts += [f"""SELECT {', '.join(keyed)}, step * {KEY} + "join" AS rowkey FROM src_file
                      WHERE rtype = 'token' OR rtype = 'batch'""",
                  f"SELECT {tok}, e.step * {KEY} + e.\"join\" AS rowkey FROM {expanded} e JOIN {steps} st USING (step)",
                  f"SELECT {bat}, e.step * {KEY} + e.\"join\" AS rowkey FROM {expanded} e"]
    if frees:
        free = row({"rtype": "'kv'", "t_ms": "f.t_ms", "op": "'free'", "req": "f.req", "block": "a.block",
                    "logical": "a.logical", "ref": "CAST(0 AS BIGINT)", "src": "CAST(-1 AS BIGINT)",
                    "replica": "CAST(0 AS BIGINT)"})
        parts += [f"""SELECT {', '.join('l.' + c for c in keyed)}, l.p + coalesce(u.upto, 0) AS rowkey
                      FROM kv_listed l ASOF LEFT JOIN kv_upto u ON l.p >= u.pos""",
                  f"""SELECT {free}, f.pos + f.before_all + f.j AS rowkey
                      FROM (SELECT *, unnest(range(n)) AS j FROM kv_fr) f
                      JOIN kv_al a ON a.req = f.req AND a.ai = f.before_req + f.n - 1 - f.j"""]
    return "\n        UNION ALL ".join(parts)


_SQL_TYPES = {"string": "VARCHAR", "int64": "BIGINT", "float64": "DOUBLE"}


def _fills() -> dict[str, dict]:
    """Per column, {fill value: the record types whose field in it reads a null as that value} (the fields
    with a fill that are neither required nor nullable: core.trace.parquet.Rows.field fills their nulls)."""
    out: dict[str, dict] = {}
    for rec in TABLES:
        for f in rec.columns:
            if not f.required and not f.nullable and f.fill is not None:
                out.setdefault(f.column, {}).setdefault(f.fill, []).append(rec.type)
    return out


_FILLS = _fills()


def _sql_value(v) -> str:
    return "'" + v.replace("'", "''") + "'" if isinstance(v, str) else repr(v)


def _column_sql(c: str, stored: dict, s: str = "") -> str:
    """Column `c` of the layout as the in-memory reader reads it: in the layout's type (a file may store it
    as another type of the same kind: core.trace.parquet.check_column_types), all null when the file lacks
    it, and a null of a record type whose field has a fill value read as that value (a step's dur_ms 0, its
    running -1: the in-memory reader's numbers from the same rows)."""
    want = _SQL_TYPES[COLUMNS[c]]
    q = lambda name: f'{s}"{name}"'
    if c not in stored:
        x = f"CAST(NULL AS {want})"
    elif stored[c] == want:
        x = q(c)
    else:
        x = f"CAST({q(c)} AS {want})"
    if c in _FILLS:   # (a simple CASE: DuckDB turns `rtype IN (five or more names)` into a join, which loses
        #                  the file order of `scan` even where the column is not read)
        rt = q("rtype") if stored.get("rtype") == "VARCHAR" else f"CAST({q('rtype')} AS VARCHAR)"
        x = f"CASE {rt} " + " ".join(f"WHEN {_sql_value(r)} THEN coalesce({x}, CAST({_sql_value(v)} AS {want}))"
                                     for v, rtypes in _FILLS[c].items() for r in rtypes) + f" ELSE {x} END"
    return f'{x} AS "{c}"'


# ---- the in-memory reader's checks, made where the data lives -----------------------------------------

CHECK_BATCH_ROWS = 1 << 18       # rows checked at a time (core.trace.parquet.RowChecker)
CHECK_SLICE_TOKENS = 2_000_000   # token rows of the requests whose cross-record rules are checked at a time
_CHECKED: set = set()            # the files (path, size, modification time) checked by this process


def _name(files: list[Path]) -> str:
    return files[0].name if len(files) == 1 else files[0].parent.name


def check_layout(files: list[Path]) -> set:
    """What check_parquet checks before a row is read, from each part's footer (no DuckDB query runs
    before it): its head (trace_head: nested past MAX_JSON_DEPTH, meta, stats), the same head as the first
    part's, the columns every trace needs, each column's declared type (core.trace.parquet.
    check_column_types: rtype text, numbers where numbers go). Returns the first part's column names."""
    from core.trace.parquet import RowChecker, check_column_types
    name = _name(files)
    first = None
    for f in files:
        schema = _schema(f)
        if first is None or HEAD_KEY not in (schema.metadata or {}):
            _head_of(f, schema)        # (a part with the first part's head bytes has its head)
        elif schema.metadata[HEAD_KEY] != first.metadata[HEAD_KEY]:   # as the in-memory reader
            raise TraceError(f"{name}/{f.name}: a part of a different trace (its metadata differs from "
                             f"{files[0].name}'s)")
        RowChecker(name, 0).check_columns(schema.names)
        check_column_types(schema, name)
        if first is None:
            first = schema
    return set(first.names)


def check_parquet(con, files: list[Path], spans: bool = False, frees: bool = False):
    """Every check trace_from_parquet makes before it returns a trace, made without loading it, with
    the same functions (a trace the in-memory reader refuses is refused here, in one line): after
    check_layout (the parts' heads and declared columns: `source_view` checks them before it makes its
    views), each record's values against their declarations, a batch of rows at a time
    (core.trace.parquet.RowChecker); request ids unique; the verbatim events' requests; and
    validate.check_consistency (tokens after arrival, indices 0..n-1, times not decreasing, at most
    max_output_tokens, one finish not before the last token) on slices of requests, their token and
    finish rows fetched by DuckDB. A problem's position is worked out (a pass over the token rows)
    only when there is one to name. A process checks the same files once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.trace.parquet import RowChecker, row_group_reads
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key in _CHECKED:
        return
    name = _name(files)
    pfs = [pq.ParquetFile(f, pre_buffer=False) for f in files]    # (pre-buffering holds row groups ahead)
    n_req = int(con.execute("SELECT count(*) FROM src WHERE rtype = 'request'").fetchone()[0])
    rows = RowChecker(name, n_req)
    for pf in pfs:
        for row_groups, columns, claimed in row_group_reads(pf):
            for b in pf.iter_batches(CHECK_BATCH_ROWS, row_groups=row_groups, columns=columns, use_threads=False):
                rows.add(pa.Table.from_batches([b]), claimed)
    if con.execute("SELECT 1 FROM src WHERE rtype = 'request' GROUP BY id HAVING count(*) > 1 LIMIT 1").fetchone():
        raise TraceError(f"{name}: request records: {BadColumn(REQUEST.field('id'))}")
    if rows.other:
        ids = con.execute("SELECT id FROM src WHERE rtype = 'request' ORDER BY rowkey").fetchnumpy()["id"]
        rows.finish({rid: j for j, rid in enumerate(ids.tolist())})
    if spans:
        _check_spans(con, name)
    if frees:
        _check_frees(con, name)
    _check_requests(con, name, n_req)
    con.execute("DROP TABLE chk_r")
    pa.default_memory_pool().release_unused()    # (mimalloc keeps freed pages for reuse otherwise)
    _CHECKED.add(key)


def _check_spans(con, name: str):
    """What the in-memory reader checks of a file with decode spans beyond each row (core.trace.parquet.
    _with_spans), before a span is expanded: no request given more decode tokens than its max_output_tokens,
    listed token and batch rows keyed (step and join present), no replica but 0, every span's steps recorded."""
    over = con.execute("""SELECT s.req, s.n, r.max_output_tokens FROM
        (SELECT req, sum(tokens) AS n FROM src_file WHERE rtype = 'span' GROUP BY req) s
        JOIN (SELECT row_number() OVER (ORDER BY rowkey) - 1 AS i, max_output_tokens FROM src_file
              WHERE rtype = 'request') r ON s.req = r.i
        WHERE s.n > r.max_output_tokens ORDER BY s.req LIMIT 1""").fetchone()
    if over:
        raise TraceError(f"{name}: span records: request {over[0]} decodes {int(over[1]):,} tokens, over its "
                         f"max_output_tokens {int(over[2]):,}")
    for rtype, keys in (("token", ("step", "join")), ("batch", ("join",))):
        miss = " OR ".join(f'"{k}" IS NULL' for k in keys)
        bad = con.execute(f"SELECT {', '.join(_q(k) for k in keys)} FROM src_file WHERE rtype = '{rtype}' AND ({miss}) "
                          "LIMIT 1").fetchone()
        if bad:
            k = keys[[v is None for v in bad].index(True)]
            raise TraceError(f"{name}: {rtype} records of a file with decode spans: {k} missing")
    if con.execute("SELECT 1 FROM src_file WHERE rtype = 'token' AND coalesce(replica, 0) <> 0 LIMIT 1").fetchone():
        raise TraceError(f"{name}: decode spans in a fleet trace (a replica other than 0): not supported")
    gap = con.execute("""SELECT e.req, e.step FROM (SELECT req, step + unnest(range(tokens)) AS step FROM src_file
                         WHERE rtype = 'span') e ANTI JOIN (SELECT DISTINCT step FROM src_file WHERE rtype = 'step') st
                         USING (step) ORDER BY e.step, e.req LIMIT 1""").fetchone()
    if gap:
        raise TraceError(f"{name}: span records: request {gap[0]} decodes in step {gap[1]}, which has no step record")


def _check_frees(con, name: str):
    """What the in-memory reader checks of a file's kv_free rows beyond each row (core.trace.spans.
    kv_with_frees), before one is expanded: each placed among the KV rows, in order; no more blocks
    freed than allocated; then each freed block an allocation of its request before it."""
    if con.execute("SELECT 1 FROM src_file WHERE rtype = 'kv' AND coalesce(replica, 0) <> 0 LIMIT 1").fetchone():
        raise TraceError(f"{name}: kv_free records in a fleet trace (a replica other than 0): not supported")
    n_listed, n_alloc = con.execute("SELECT count(*), count(*) FILTER (WHERE op = 'alloc') FROM kv_listed").fetchone()
    total = con.execute("SELECT coalesce(sum(n), 0) FROM kv_fr").fetchone()[0]
    bad = con.execute(f"""SELECT k, n, pos FROM (SELECT k, n, pos, lag(pos) OVER (ORDER BY k) AS prev FROM kv_fr)
                          WHERE n > {n_alloc} OR pos > {n_listed} OR pos < prev ORDER BY k LIMIT 1""").fetchone()
    if bad is not None or total > n_alloc:
        last = f"SELECT k, n, pos FROM kv_fr WHERE before_all + n > {n_alloc} ORDER BY k LIMIT 1"   # (they run out)
        k, n, pos = bad if bad is not None else con.execute(last).fetchone()
        raise TraceError(f"{name}: kv_free record {k}: frees {n:,} blocks after {pos:,} KV rows: expected its place "
                         f"among the {n_listed:,} KV rows, in order, and no more blocks than allocated ({n_alloc:,})")
    miss = con.execute("""SELECT f.k, f.req, f.n FROM (SELECT *, unnest(range(n)) AS j FROM kv_fr) f
                          LEFT JOIN kv_al a ON a.req = f.req AND a.ai = f.before_req + f.n - 1 - f.j
                          WHERE a.p IS NULL OR a.p >= f.pos ORDER BY f.k LIMIT 1""").fetchone()
    if miss is not None:
        raise TraceError(f"{name}: kv_free record {miss[0]}: request {miss[1]} frees {miss[2]:,} blocks, more than "
                         "it allocated before it")


def _check_requests(con, name: str, n_req: int):
    """validate.check_consistency over slices of requests; positions (each token's and finish's place
    among the records of its type, as the in-memory reader counts them) only for slices with problems."""
    con.execute("CREATE TEMP TABLE chk_r AS SELECT row_number() OVER (ORDER BY rowkey) - 1 AS i, id, "
                "t_ms AS arrival_ms, max_output_tokens FROM src WHERE rtype = 'request'")
    n_tok = int(con.execute("SELECT count(*) FROM src WHERE rtype = 'token'").fetchone()[0])
    step = -(-max(n_req, 1) // max(1, -(-n_tok // CHECK_SLICE_TOKENS)))
    failing = [lo for lo in range(0, max(n_req, 1), step) if _check_slice(con, Problems(name), lo, lo + step, False)]
    if not failing:
        return
    for rtype in ("token", "finish"):
        con.execute(f"CREATE TEMP TABLE chk_{rtype} AS SELECT rowkey, row_number() OVER (ORDER BY rowkey) - 1 AS pos "
                    f"FROM src WHERE rtype = '{rtype}'")
    pb = Problems(name)
    for lo in failing:
        _check_slice(con, pb, lo, lo + step, True)
    pb.raise_if_any()


def _check_slice(con, pb, lo: int, hi: int, exact: bool) -> bool:
    """check_consistency on requests lo..hi-1 (positions: exact, else their row keys, which sort the
    same); whether it found a problem."""
    import pandas as pd

    from core.trace.validate import check_consistency
    reqs = con.execute("SELECT id, arrival_ms, max_output_tokens FROM chk_r WHERE i >= ? AND i < ? ORDER BY i",
                       [lo, hi]).fetchdf()
    got = {}
    for rtype, cols in (("token", 's."index" AS "index", s.t_ms'), ("finish", "s.t_ms")):
        pos = "p.pos" if exact else "s.rowkey"
        join = f"JOIN chk_{rtype} p USING (rowkey) " if exact else ""
        order = "ORDER BY s.rowkey" if exact else ""     # (in file order: which of two equal records is named)
        got[rtype] = con.execute(f"SELECT s.req - ? AS req, {cols}, {pos} AS pos FROM src s {join}"
                                 f"WHERE s.rtype = '{rtype}' AND s.req >= ? AND s.req < ? {order}",
                                 [lo, lo, hi]).fetchnumpy()
    tok, fin = got["token"], got["finish"]
    n = len(pb.items)
    check_consistency(pb, reqs, pd.DataFrame({k: tok[k] for k in ("req", "index", "t_ms")}), tok["pos"],
                      pd.DataFrame({k: fin[k] for k in ("req", "t_ms")}), fin["pos"])
    return len(pb.items) > n
