"""The metrics of a Parquet trace larger than memory, computed where the data lives: DuckDB over
the file (or a directory of parts), column by column, never loading the trace (issue 29).

The result is `core.analysis.metrics.summarize(trace, per_request=False)`'s summary built by the
same function (core.analysis.definitions.summary) from the same definitions, each compiled to SQL
here (`DuckDBTrace`, the definitions' evaluator over the files): per-request TTFT, TPOT, E2E and
request latency from the token and finish rows grouped by request; throughput over the drain
window or a fixed one; cost; Little's law; utilisation and the step summary; SLO attainment and
goodput; token conservation; the engine's own KV-event summary. What the evaluator implements
itself: the ITL gaps (consecutive emissions of each request, a window in SQL), exact percentiles
(DuckDB's `quantile_cont` interpolates between order statistics at (n - 1) q, numpy's 'linear'
(Hyndman-Fan type 7) estimator) and the replay of KV events for their peak.

Before anything is computed, the files are checked as the in-memory reader checks a trace it loads,
with the same functions (core.analysis.parquet_source.check_parquet): what it refuses in one line
is refused here in that line.

Memory is bounded by DuckDB's `memory_limit` (it spills sorts and aggregates to a temporary
directory beside the system's); a million-request trace is read in passes over its columns.
"""
from __future__ import annotations

import math
import tempfile

from core.analysis import definitions as d
from core.analysis import fleet as fl
from core.analysis.definitions import distribution_of
from core.analysis.expr import request_columns_sql
from core.analysis.parquet_source import (
    EXACT_IN_MEMORY,
    ITL_SLICE_TOKENS,
    MEMORY_LIMIT,
    duck_connect,
    parquet_files,
    source_view,
    trace_head,
)
from core.errors import InputError
from core.trace.writer import COLUMNS


def _dist(con, table: str, col: str, name: str, percentiles, cond: str | None = None) -> dict:
    """metrics.distribution's fields for a column of a DuckDB table (the rows where `cond` holds, when
    given), NaN/NULL left out."""
    # one quantile state for the median and every percentile (each quantile_cont call keeps its own
    # copy of the column: five of 25 M ITL gaps ran past the memory limit)
    fractions = [0.5] + [p / 100 for p in percentiles]
    where = f"{col} IS NOT NULL AND NOT isnan({col})" + ("" if cond is None else f" AND {cond}")
    n = int(con.execute(f"SELECT count({col}) FROM {table} WHERE {where}").fetchone()[0])
    big = n > EXACT_IN_MEMORY
    qs = "[" + ", ".join(repr(q) for q in fractions) + "]"
    # fsum: a compensated sum, so the mean does not depend on how the threads split the column
    head = con.execute(f"SELECT count({col}), fsum({col}) / count({col}), stddev_pop({col}), min({col}), max({col})"
                       + ("" if big else f", quantile_cont({col}, {qs})") + f" FROM {table} WHERE {where}").fetchone()
    q = (_narrowed_quantiles(con, table, col, where, n, float(head[3]), float(head[4]), fractions) if big and n
         else head[5]) or [None] * (len(percentiles) + 1)
    if not n:
        return distribution_of(0, name, percentiles)
    return distribution_of(n, name, percentiles, float(head[1]), float(q[0]), float(head[2] or 0.0),
                           float(head[3]), float(head[4]), q[1:])


def _narrowed_quantiles(con, table, col, where, n, lo, hi, fractions, buckets=4096) -> list[float]:
    """Exact type-7 quantiles of a column too large for one quantile state: for each order
    statistic needed (ranks floor and ceil of (n - 1) q), count the values in equal-width
    buckets of the range still in play, keep the bucket holding that rank, and repeat until it
    holds few enough values to sort (each pass one scan of the column, no copy of it held)."""
    def kth(k: int) -> float:             # the k-th smallest value (0-based)
        # membership of the range in play is the same bucket expressions each pass, so a value on a
        # bucket's edge is counted in one bucket only, whatever the rounding
        cond, below, a, b = where, 0, lo, hi
        while True:
            inside = int(con.execute(f"SELECT count(*) FROM {table} WHERE {cond}").fetchone()[0])
            width = (b - a) / buckets
            if inside <= 2_000_000 or not width > 0 or a + width == a:
                return float(con.execute(f"SELECT {col} FROM {table} WHERE {cond} ORDER BY {col} LIMIT 1 OFFSET ?",
                                         [k - below]).fetchone()[0])
            bucket = f"least(greatest(floor(({col} - {a!r}) / {width!r}), 0), {buckets - 1})"
            counts = dict(con.execute(f"SELECT {bucket}::BIGINT AS j, count(*) FROM {table} WHERE {cond} "
                                      "GROUP BY j").fetchall())
            for j in range(buckets):
                c = counts.get(j, 0)
                if below + c > k:
                    cond = f"{cond} AND {bucket} = {j}"
                    a, b = a + j * width, a + (j + 1) * width
                    break
                below += c
    out = []
    cache: dict[int, float] = {}
    for q in fractions:
        h = (n - 1) * q
        f, c = math.floor(h), math.ceil(h)
        for k in (f, c):
            if k not in cache:
                cache[k] = kth(k)
        out.append(cache[f] + (h - f) * (cache[c] - cache[f]))
    return out


def summarize_parquet(path, window=None, usd_per_hour=None, percentiles=d.DEFAULT_PERCENTILES, slo=None) -> dict:
    """core.analysis.metrics.summarize(trace, per_request=False) of the Parquet trace at `path`
    without loading it (module docstring)."""
    import duckdb
    files = parquet_files(path)
    try:
        return _summarize(files, window, usd_per_hour, percentiles, slo)
    except duckdb.OutOfMemoryException as e:
        raise InputError(f"{path}: DuckDB ran out of its {MEMORY_LIMIT} working memory ({str(e).splitlines()[0]})") \
            from None
    except duckdb.Error as e:
        raise InputError(f"{path}: {str(e).splitlines()[0]}") from None


def _summarize(files, window, usd_per_hour, percentiles, slo) -> dict:
    head = trace_head(files)
    meta = head.get("meta") or {}
    with tempfile.TemporaryDirectory(prefix="serving-explorer-duckdb-") as tmp:
        con = duck_connect(tmp)
        ev = DuckDBTrace(con, source_view(con, files))
        kv = bool(ev.agg("kv_event", {"n": d.Agg("count")})["n"])
        summary = d.summary(ev, window, usd_per_hour, percentiles, slo, meta, has_kv_events=kv)
        fleet = fl.fleet_summary(ev, meta)
        if fleet is not None:
            summary["fleet"] = fleet
        con.close()
    return {"source": meta.get("source"), "label": meta.get("label"), "summary": summary,
            "computed": {"engine": f"duckdb {_duckdb_version()}", "out_of_core": True, "percentiles": "exact",
                         "parts": len(files)}}


# the definitions' relations over the view `src` (every row of the parts, `rtype` naming its record type)
RELATIONS = {"token": "(SELECT t_ms, req, rowkey FROM src WHERE rtype = 'token')",
             "finish": "(SELECT t_ms, req, reason, rowkey FROM src WHERE rtype = 'finish')",
             "step": "(SELECT * FROM src WHERE rtype = 'step')",
             "kv_event": "(SELECT kv_event_op AS op, hash FROM src WHERE rtype = 'kv_event')",
             "request": "m",
             "token_request": "(SELECT t.t_ms, t.req, m.* FROM (SELECT t_ms, req FROM src WHERE rtype = 'token') t "
                              "JOIN m ON t.req = m.i)"}


class DuckDBTrace:
    """A Parquet trace (the view `src`) as a core.analysis.definitions evaluator: each definition
    compiled to SQL and run where the data lives. Builds the request table `m` (definitions.REQUEST
    over the token and finish rows) on creation."""

    def __init__(self, con, cols: set):
        self.con, self.cols = con, cols
        # requests in trace order (a token's `req` is that position)
        con.execute("CREATE TEMP TABLE r AS SELECT row_number() OVER (ORDER BY rowkey) - 1 AS i, id, "
                    "t_ms AS arrival_ms, max_output_tokens FROM src WHERE rtype = 'request'")
        con.execute("CREATE TEMP TABLE m AS " + request_columns_sql(d.REQUEST, "r", RELATIONS))
        self._itl = self._steps = False
        self._rels = dict(RELATIONS)

    def _rel(self, name: str) -> str:
        """A relation's SQL (core.analysis.fleet's built on first use)."""
        if name not in self._rels:
            self._fleet_relations()
        return self._rels[name]

    def _fleet_relations(self):
        """core.analysis.fleet's relations (its docstring): the replica columns (0 where absent, as the
        in-memory reader fills them), the verbatim route and transfer events' fields from their JSON, the
        requests' fleet columns (table fm) and the visits (table fvisit)."""
        con, rels = self.con, self._rels
        rep = "coalesce(replica, 0)" if "replica" in self.cols else "0"
        rels["replica_finish"] = f"(SELECT t_ms, req, rowkey, {rep} AS replica FROM src WHERE rtype = 'finish')"
        rels["replica_step"] = f"(SELECT t_ms, coalesce(dur_ms, 0.0) AS dur_ms, {rep} AS replica FROM src " \
                               "WHERE rtype = 'step')"
        rels["replica_kv"] = f"(SELECT op, {rep} AS replica FROM src WHERE rtype = 'kv')"
        rels["replica_preempt"] = f"(SELECT t_ms, req, rowkey, {rep} AS replica FROM src WHERE rtype = 'preempt')"
        for kind, fields in fl.EVENT_FIELDS.items():
            cols = ", ".join(f"CASE WHEN json_type(e.json, '$.{c}') IN ('BIGINT', 'UBIGINT', 'DOUBLE') "
                             f"THEN CAST(json_extract(e.json, '$.{c}') AS DOUBLE) END AS {c}" for c in fields)
            ev = f"(SELECT json, rowkey FROM src WHERE rtype = 'other' AND " \
                 f"json_extract_string(json, '$.type') = '{kind}')"
            if fl.EVENT_REQ[kind]:    # (req: the request's row, only events whose req names one)
                con.execute(f"CREATE TEMP TABLE ev_{kind} AS SELECT {cols}, r.i AS req, e.rowkey FROM {ev} e "
                            "JOIN r ON json_type(e.json, '$.req') = 'VARCHAR' AND r.id = json_extract_string(e.json, "
                            "'$.req')")
            else:
                con.execute(f"CREATE TEMP TABLE ev_{kind} AS SELECT {cols}, e.rowkey FROM {ev} e")
            rels[kind] = f"ev_{kind}"
        con.execute("CREATE TEMP TABLE fm AS " + request_columns_sql(fl.FLEET_REQUEST, "m", rels))
        rels["fleet_request"] = "fm"
        rels["replica_hit"] = f"(SELECT k.t_ms, k.req, {rep.replace('replica', 'k.replica')} AS replica, fm.* " \
                              "FROM (SELECT * FROM src WHERE rtype = 'kv' AND op = 'hit' AND req IS NOT NULL) k " \
                              "JOIN fm ON k.req = fm.i)"
        # a batch entry's step: the first step record of its number (trace order)
        con.execute(f"""CREATE TEMP TABLE fvisit AS SELECT b.req, s.replica, min(s.t_ms) AS first_ms,
                        max(s.t_ms + s.dur_ms) AS last_end_ms
                        FROM (SELECT step, req FROM src WHERE rtype = 'batch') b
                        JOIN (SELECT step, arg_min(t_ms, rowkey) AS t_ms, arg_min(coalesce(dur_ms, 0.0), rowkey)
                              AS dur_ms, arg_min({rep}, rowkey) AS replica FROM src WHERE rtype = 'step'
                              GROUP BY step) s USING (step)
                        GROUP BY b.req, s.replica""")
        rels["visit"] = "(SELECT v.req, v.replica, v.first_ms, v.last_end_ms, fm.* FROM fvisit v " \
                        "JOIN fm ON v.req = fm.i)"

    def agg(self, name: str, aggs: dict, params: dict | None = None) -> dict:
        sel = ", ".join(a.sql(params or {}) for a in aggs.values())
        # fetchall: a result left unfinished blocks the connection's next streamed query
        row = self.con.execute(f"SELECT {sel} FROM {self._rel(name)}").fetchall()[0]
        return {k: _plain(v) for k, v in zip(aggs, row)}

    def replicas_seen(self, records) -> set:
        """The distinct replica values of these record types' rows (absent: 0)."""
        if "replica" not in self.cols:
            return {0} if self.con.execute("SELECT 1 FROM src WHERE rtype IN ?", [list(records)]).fetchone() else set()
        return {int(x) for (x,) in self.con.execute("SELECT DISTINCT coalesce(replica, 0) FROM src WHERE rtype IN ?",
                                                    [list(records)]).fetchall()}

    def columns(self, name: str) -> set:
        return set(COLUMNS) | {"rowkey"}     # (the views have every column of the layout, as a loaded trace does)

    def rows(self, name: str, cols: tuple, where) -> list[tuple]:
        return self.con.execute(f"SELECT {', '.join(cols)} FROM {RELATIONS[name]} WHERE {where.sql({})} "
                                "ORDER BY i").fetchall()

    def distribution(self, what: str, name: str, percentiles, relation: str = "request", where=None) -> dict:
        if relation != "request" or where is not None:
            return _dist(self.con, self._rel(relation), what, name, percentiles,
                         None if where is None else where.sql({}))
        if what == "itl":
            self._itl_table()
            return _dist(self.con, "itl", "g", name, percentiles)
        if what == "step_dur":
            if not self._steps:
                self.con.execute("CREATE TEMP TABLE st AS SELECT dur_ms FROM src WHERE rtype = 'step'")
                self._steps = True
            return _dist(self.con, "st", "dur_ms", name, percentiles)
        return _dist(self.con, "m", what, name, percentiles)

    def _itl_table(self):
        """ITL: consecutive emissions of each request, by time (then trace order), gaps > 0
        (metrics.itl_gaps_of); the window runs over slices of requests so that its sort stays
        within the working memory."""
        if self._itl:
            return
        con = self.con
        n_req = int(con.execute("SELECT count(*) FROM r").fetchone()[0])
        n_tokens = int(con.execute("SELECT count(*) FROM src WHERE rtype = 'token'").fetchone()[0])
        slices = max(1, -(-n_tokens // ITL_SLICE_TOKENS))
        step = -(-max(n_req, 1) // slices)
        con.execute("CREATE TEMP TABLE itl (g DOUBLE)")
        for lo in range(0, max(n_req, 1), step):
            con.execute("INSERT INTO itl SELECT g FROM (SELECT t_ms - lag(t_ms) OVER (PARTITION BY req ORDER BY t_ms, "
                        "rowkey) AS g FROM src WHERE rtype = 'token' AND req >= ? AND req < ?) WHERE g > 0",
                        [lo, lo + step])
        self._itl = True

    def kv_event_peak(self) -> int:
        """The most distinct blocks cached at once: the kv_event rows replayed in recorded order, a
        million at a time (memory: the cache's hashes; kv_events.CacheCount, as in memory)."""
        from core.analysis.kv_events import CacheCount
        count, peak = CacheCount(), 0
        rep = "coalesce(replica, 0) AS replica" if "replica" in self.cols else "0 AS replica"
        sql = f"SELECT kv_event_op, hash, {rep} FROM scan WHERE rtype = 'kv_event'"
        for b in self.con.sql(sql).to_arrow_reader(1 << 20):
            n = count.feed(b.column("kv_event_op").to_pylist(), b.column("hash").to_pylist(),
                           b.column("replica").to_pylist())
            peak = max(peak, int(n.max()) if len(n) else 0)
        return peak


def _plain(v):
    """A DuckDB value as the numpy path gives it: NaN / NULL as None, decimals (sums) as numbers."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if type(v).__name__ == "Decimal":
        return float(v) if v % 1 else int(v)
    return v


def request_metrics_parquet(path):
    """metrics.request_metrics of a Parquet trace (file or directory of parts), computed out of core:
    one row per request in trace order (a million requests is ~100 MB here; the trace's token rows
    never come into memory)."""
    import numpy as np
    import pandas as pd
    files = parquet_files(path)
    trace_head(files)
    with tempfile.TemporaryDirectory(prefix="serving-explorer-duckdb-") as tmp:
        con = duck_connect(tmp)
        DuckDBTrace(con, source_view(con, files))
        t = con.sql(f"SELECT {', '.join(d.REQUEST_METRICS)} FROM m ORDER BY i").to_arrow_table()
        con.close()
    num = lambda c: t.column(c).to_numpy(zero_copy_only=False).astype(float)   # NULL -> NaN
    return pd.DataFrame({"id": np.array(t.column("id").to_pylist(), dtype=object),
                         **{c: num(c) for c in d.REQUEST_METRICS[1:-1] if c != "output_tokens"},
                         "output_tokens": t.column("output_tokens").to_numpy().astype(np.int64),
                         "finish_reason": pd.Series(t.column("finish_reason").to_pylist(), dtype=object)}
                        )[list(d.REQUEST_METRICS)]


def request_table_parquet(path):
    """The trace's requests (id, arrival_ms, prompt_tokens, max_output_tokens) in trace order, read out of
    core (core.analysis.compare.workload_differences reads only these)."""
    import pandas as pd
    files = parquet_files(path)
    trace_head(files)
    with tempfile.TemporaryDirectory(prefix="serving-explorer-duckdb-") as tmp:
        con = duck_connect(tmp)
        source_view(con, files)
        df = con.execute("SELECT id, t_ms AS arrival_ms, prompt_tokens, max_output_tokens FROM src "
                         "WHERE rtype = 'request' ORDER BY rowkey").fetchdf()
        con.close()
    return pd.DataFrame({"id": df["id"].astype(object), "arrival_ms": df["arrival_ms"].astype(float),
                         "prompt_tokens": df["prompt_tokens"].astype("int64"),
                         "max_output_tokens": df["max_output_tokens"].astype("int64")})

def _duckdb_version() -> str:
    import duckdb
    return duckdb.__version__


