"""The metrics of a Parquet trace larger than memory, computed where the data lives: DuckDB over
the file (or a directory of parts), column by column, never loading the trace (issue 29).

The result has the shape of `core.analysis.metrics.summarize(trace, per_request=False)` and the
same definitions (that module defines every metric; this one only computes them in SQL):
per-request TTFT, TPOT, E2E and request latency from the token and finish rows grouped by
request; ITL from consecutive emissions of each request; throughput over the drain window
[first arrival, last emission] or a fixed one; cost; Little's law; utilisation and the step
summary from step rows; SLO attainment and goodput; token conservation; the engine's own KV-event
summary (`kv_event` rows: counts by op, the peak of distinct cached blocks). Percentiles are exact:
DuckDB's `quantile_cont` interpolates between order statistics at (n - 1) q, numpy's 'linear'
(Hyndman-Fan type 7) estimator.

Memory is bounded by DuckDB's `memory_limit` (it spills sorts and aggregates to a temporary
directory beside the system's); a million-request trace is read in passes over its columns.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from core.analysis.metrics import (
    COMPLETED,
    DEFAULT_PERCENTILES,
    EARLY_REASONS,
    ESTIMATOR_LABEL,
    SLO,
    distribution_of,
    measurement_window,
)
from core.errors import InputError

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
    """The trace's head ({"schema", "meta"}) from the first part's Parquet metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        md = pq.read_schema(files[0]).metadata or {}
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{files[0]}: not a readable Parquet file ({e})") from None
    if HEAD_KEY not in md:
        raise InputError(f"{files[0]}: not a serving trace (no '{HEAD_KEY.decode()}' metadata)")
    try:
        return json.loads(md[HEAD_KEY])
    except ValueError as e:
        raise InputError(f"{files[0]}: the trace head is not JSON ({e})") from None


def _connect(tmp: str):
    import duckdb
    con = duckdb.connect(config={"memory_limit": MEMORY_LIMIT, "temp_directory": tmp,
                                 "threads": max(1, os.cpu_count() or 1)})
    con.execute("SET enable_progress_bar = false")    # a long query would draw a bar on the terminal
    return con


def _source_view(con, files: list[Path]) -> set:
    """The view `src`: every row of the parts with its place in the trace (rowkey: part, row in part),
    and `scan`: the rows in file order unsorted (a plain scan keeps it). Returns src's columns."""
    names = [str(f) for f in files]
    con.execute("CREATE TEMP TABLE parts (filename VARCHAR, part BIGINT)")
    con.executemany("INSERT INTO parts VALUES (?, ?)", [(f, k) for k, f in enumerate(names)])
    listed = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in names) + "]"   # a view takes no parameters
    # every row with its place in the trace: (part, row in part)
    con.execute("CREATE TEMP VIEW src AS SELECT s.*, p.part * 4294967296 + s.file_row_number AS rowkey "
                f"FROM read_parquet({listed}, filename=true, file_row_number=true) s JOIN parts p USING (filename)")
    # the rows in file order without sorting: a plain scan keeps it (DuckDB's preserve_insertion_order)
    con.execute(f"CREATE TEMP VIEW scan AS SELECT * FROM read_parquet({listed})")
    return {r[0] for r in con.execute("DESCRIBE src").fetchall()}


def _dist(con, table: str, col: str, name: str, percentiles) -> dict:
    """metrics.distribution's fields for a column of a DuckDB table, NaN/NULL left out."""
    # one quantile state for the median and every percentile (each quantile_cont call keeps its own
    # copy of the column: five of 25 M ITL gaps ran past the memory limit)
    fractions = [0.5] + [p / 100 for p in percentiles]
    where = f"{col} IS NOT NULL AND NOT isnan({col})"
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


def _nn(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def summarize_parquet(path, window=None, usd_per_hour=None, percentiles=DEFAULT_PERCENTILES,
                      slo: SLO | None = None) -> dict:
    """core.analysis.metrics.summarize(trace, per_request=False) of the Parquet trace at `path`
    without loading it (module docstring)."""
    import duckdb
    files = parquet_files(path)
    for f in files[1:]:
        if trace_head([f]) != trace_head(files[:1]):
            raise InputError(f"{f}: its head (schema, meta) differs from {files[0].name}'s: not parts of one trace")
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
        con = _connect(tmp)
        cols = _source_view(con, files)
        _request_table(con)
        n_req, completed, unfinished, single = con.execute(
            "SELECT count(*), count(*) FILTER (n > 0), count(*) FILTER (reason IS NULL), count(*) FILTER (n = 1) "
            "FROM m").fetchone()
        first_arrival, last_token = con.execute(
            "SELECT (SELECT min(arrival) FROM r), (SELECT max(t_ms) FROM src WHERE rtype = 'token')").fetchone()
        drain_start = float(first_arrival) if first_arrival is not None else 0.0    # metrics.drain_window
        start, end, kind = measurement_window(
            window, (drain_start, float(last_token) if last_token is not None else drain_start))
        emitted = int(con.execute("SELECT count(*) FROM src WHERE rtype = 'token' AND t_ms >= ? AND t_ms <= ?",
                                  [start, end]).fetchone()[0])
        span_ms = end - start
        tok_s = emitted / (span_ms / 1000.0) if span_ms > 0 else math.nan
        cost = per_1k = None
        if usd_per_hour is not None:
            if not (math.isfinite(usd_per_hour) and usd_per_hour >= 0):
                raise InputError(f"usd_per_hour: expected a number >= 0, got {usd_per_hour}")
            cost = usd_per_hour * span_ms / 3_600_000.0
            per_1k = cost / emitted * 1000.0 if emitted else math.nan
        # ITL: consecutive emissions of each request, by time (then trace order), gaps > 0; the window
        # runs over slices of requests so that its sort stays within the working memory
        n_tokens = int(con.execute("SELECT count(*) FROM src WHERE rtype = 'token'").fetchone()[0])
        slices = max(1, -(-n_tokens // ITL_SLICE_TOKENS))
        step = -(-max(int(n_req), 1) // slices)
        con.execute("CREATE TEMP TABLE itl (g DOUBLE)")
        for lo in range(0, max(int(n_req), 1), step):
            con.execute("INSERT INTO itl SELECT g FROM (SELECT t_ms - lag(t_ms) OVER (PARTITION BY req ORDER BY t_ms, "
                        "rowkey) AS g FROM src WHERE rtype = 'token' AND req >= ? AND req < ?) WHERE g > 0",
                        [lo, lo + step])
        dists = {"ttft_ms": _dist(con, "m", "ttft", "TTFT", percentiles),
                 "tpot_ms": _dist(con, "m", "tpot", "TPOT", percentiles),
                 "itl_ms": _dist(con, "itl", "g", "ITL", percentiles),
                 "e2e_ms": _dist(con, "m", "e2e", "E2E", percentiles),
                 "latency_ms": _dist(con, "m", "latency", "request latency", percentiles)}
        dists["latency_ms"].pop("notes")
        notes = [x for d in dists.values() for x in d.pop("notes", ())] if n_req else []
        if single:
            notes.append(f"{single} request(s) with one output token have no TPOT (missing, not 0)")
        if unfinished:
            notes.append(f"{unfinished} request(s) have no finish event (finish_reason null): "
                         "the capture ended before they finished")
        early = ", ".join(f"'{r}'" for r in EARLY_REASONS)
        problems = [f"request {rid!r}: {k} tokens emitted, more than max_output_tokens {mx}" if k > mx
                    else f"request {rid!r}: {k} of {mx} tokens emitted and no finish that ends a request early "
                         f"({', '.join(EARLY_REASONS)})"
                    for rid, k, mx in con.execute(
                        f"SELECT id, n, maxo FROM m WHERE n > maxo OR (n < maxo AND (reason IS NULL OR reason NOT IN "
                        f"({early}))) ORDER BY i").fetchall()]
        # Little's law over the window (metrics.littles_law)
        inside, arrivals, w_mean = con.execute(
            "SELECT sum(least(greatest(last, ?), ?) - least(greatest(arrival, ?), ?)) FILTER (last IS NOT NULL), "
            "count(*) FILTER (last IS NOT NULL AND arrival >= ? AND arrival <= ?), "
            "avg(last - arrival) FILTER (last IS NOT NULL AND arrival >= ? AND arrival <= ?) FROM m",
            [start, end, start, end, start, end, start, end]).fetchone()
        L = (inside or 0.0) / span_ms if span_ms > 0 else math.nan
        lam = arrivals / span_ms if span_ms > 0 else math.nan
        W = float(w_mean) if w_mean is not None else math.nan
        littles = {"L": _nn(float(L)), "lambda_per_ms": _nn(float(lam)), "arrival_rate_per_s": _nn(float(lam) * 1000.0),
                   "W_ms": _nn(W), "lambda_W": _nn(float(lam * W)), "window_ms": [start, end]}
        summary = {"requests": int(n_req), "completed": int(completed), "unfinished": int(unfinished),
                   "output_tokens": emitted, "window_ms": [start, end], "window_kind": kind,
                   "output_tok_per_s": _nn(tok_s), "usd_per_hour": usd_per_hour, "cost_usd": _nn(cost),
                   "cost_per_1k_output_usd": _nn(per_1k), "percentile_estimator": ESTIMATOR_LABEL, **dists,
                   "conservation_problems": problems, "notes": notes, "littles_law": littles,
                   "utilisation": _utilisation(con, cols, meta, start, end)}
        steps = _step_summary(con, cols)
        if steps is not None:
            summary["steps"] = steps
        if con.execute("SELECT count(*) FROM src WHERE rtype = 'kv_event'").fetchall()[0][0]:
            summary["kv_events"] = _kv_event_summary(con)
        if slo is not None and slo.given():
            summary["slo"] = _slo(con, slo, start, end, span_ms)
        con.close()
    return {"source": meta.get("source"), "label": meta.get("label"), "summary": summary,
            "computed": {"engine": f"duckdb {_duckdb_version()}", "out_of_core": True, "percentiles": "exact",
                         "parts": len(files)}}


def _request_table(con):
    """Tables r (requests in trace order), tk (token spans), fin (finishes) and m (one row per
    request: metrics.request_metrics' quantities) over the view `src`."""
    # requests in trace order (a token's `req` is that position)
    con.execute("CREATE TEMP TABLE r AS SELECT row_number() OVER (ORDER BY rowkey) - 1 AS i, id, t_ms AS arrival, "
                "max_output_tokens AS maxo FROM src WHERE rtype = 'request'")
    con.execute("CREATE TEMP TABLE tk AS SELECT req AS i, min(t_ms) AS first, max(t_ms) AS last, count(*) AS n "
                "FROM src WHERE rtype = 'token' GROUP BY req")
    # a request finished twice (a hostile file): its last finish row, as the in-memory path keeps
    con.execute("CREATE TEMP TABLE fin AS SELECT req AS i, arg_max(reason, rowkey) AS reason, "
                "arg_max(t_ms, rowkey) AS t FROM src WHERE rtype = 'finish' GROUP BY req")
    con.execute("""CREATE TEMP TABLE m AS SELECT r.i, r.id, r.arrival, r.maxo, tk.first, tk.last,
                     coalesce(tk.n, 0) AS n, tk.first - r.arrival AS ttft,
                     CASE WHEN tk.n >= 2 THEN (tk.last - tk.first) / (tk.n - 1) END AS tpot,
                     tk.last - r.arrival AS e2e,
                     CASE WHEN coalesce(tk.n, 0) > 0 THEN fin.t - r.arrival END AS latency, fin.reason
                   FROM r LEFT JOIN tk USING (i) LEFT JOIN fin USING (i)""")


def request_metrics_parquet(path):
    """metrics.request_metrics of a Parquet trace (file or directory of parts), computed out of core:
    one row per request in trace order (a million requests is ~100 MB here; the trace's token rows
    never come into memory)."""
    import numpy as np
    import pandas as pd
    files = parquet_files(path)
    trace_head(files)
    with tempfile.TemporaryDirectory(prefix="serving-explorer-duckdb-") as tmp:
        con = _connect(tmp)
        _source_view(con, files)
        _request_table(con)
        t = con.sql("SELECT id, arrival, first, last, n, ttft, tpot, e2e, latency, reason FROM m ORDER BY i"
                    ).to_arrow_table()
        con.close()
    num = lambda c: t.column(c).to_numpy(zero_copy_only=False).astype(float)   # NULL -> NaN
    reason = t.column("reason").to_pylist()
    return pd.DataFrame({"id": np.array(t.column("id").to_pylist(), dtype=object), "arrival_ms": num("arrival"),
                         "first_token_ms": num("first"), "last_token_ms": num("last"),
                         "output_tokens": t.column("n").to_numpy().astype(np.int64), "ttft_ms": num("ttft"),
                         "tpot_ms": num("tpot"), "e2e_ms": num("e2e"), "latency_ms": num("latency"),
                         "finish_reason": pd.Series(reason, dtype=object)})


def request_table_parquet(path):
    """The trace's requests (id, arrival_ms, prompt_tokens, max_output_tokens) in trace order, read out of
    core (core.analysis.compare.workload_differences reads only these)."""
    import pandas as pd
    files = parquet_files(path)
    trace_head(files)
    with tempfile.TemporaryDirectory(prefix="serving-explorer-duckdb-") as tmp:
        con = _connect(tmp)
        _source_view(con, files)
        df = con.execute("SELECT id, t_ms AS arrival_ms, prompt_tokens, max_output_tokens FROM src "
                         "WHERE rtype = 'request' ORDER BY rowkey").fetchdf()
        con.close()
    return pd.DataFrame({"id": df["id"].astype(object), "arrival_ms": df["arrival_ms"].astype(float),
                         "prompt_tokens": df["prompt_tokens"].astype("int64"),
                         "max_output_tokens": df["max_output_tokens"].astype("int64")})

def _kv_event_summary(con) -> dict:
    """kv_events.kv_event_summary from the kv_event rows: counts by op in SQL; the peak of distinct cached
    blocks by replaying the rows in recorded order, a million at a time (memory: the cache's hashes)."""
    from core.analysis.kv_events import CacheCount
    stored, removed, cleared = con.execute(
        "SELECT count(*) FILTER (kv_event_op = 'stored'), count(*) FILTER (kv_event_op = 'removed'), "
        "count(*) FILTER (kv_event_op = 'cleared') FROM src WHERE rtype = 'kv_event'").fetchall()[0]
    count, peak = CacheCount(), 0
    for b in con.sql("SELECT kv_event_op, hash FROM scan WHERE rtype = 'kv_event'").to_arrow_reader(1 << 20):
        n = count.feed(b.column("kv_event_op").to_pylist(), b.column("hash").to_pylist())
        peak = max(peak, int(n.max()) if len(n) else 0)
    return {"stored_blocks": int(stored), "removed_blocks": int(removed), "cleared": int(cleared),
            "peak_cached_blocks": peak}


def _duckdb_version() -> str:
    import duckdb
    return duckdb.__version__


def _utilisation(con, cols, meta, start, end) -> dict | None:
    """metrics.utilisation from the step rows."""
    if not {"running", "kv_used_blocks", "dur_ms"} <= cols:
        return None
    if not con.execute("SELECT count(*) FROM src WHERE rtype = 'step'").fetchone()[0]:
        return None
    span = end - start
    out = {"window_ms": [start, end]}
    recorded = False
    for key in ("running", "kv_used_blocks"):
        neg_all, weighted, peak = con.execute(
            f"SELECT bool_and({key} < 0), sum({key} * greatest(least(t_ms + dur_ms, ?) - greatest(t_ms, ?), 0)), "
            f"max({key}) FROM src WHERE rtype = 'step'", [end, start]).fetchone()
        if neg_all:
            out[f"{key}_mean"] = out[f"{key}_peak"] = None
            continue
        recorded = True
        out[f"{key}_mean"] = float(weighted) / span if span > 0 else None
        out[f"{key}_peak"] = int(peak)
    if not recorded:
        return None
    total = (meta.get("stats") or {}).get("kv_blocks")
    if total:
        out["kv_blocks"] = int(total)
        mean = out["kv_used_blocks_mean"]
        out["kv_used_fraction_mean"] = None if mean is None else mean / total
        out["kv_used_fraction_peak"] = out["kv_used_blocks_peak"] / total
    return out


def _step_summary(con, cols) -> dict | None:
    """metrics.step_summary from the step rows."""
    n = con.execute("SELECT count(*) FROM src WHERE rtype = 'step'").fetchone()[0]
    if not n:
        return None
    con.execute("CREATE TEMP TABLE st AS SELECT t_ms, dur_ms" +
                "".join(f", {c}" for c in ("prefill_tokens", "decode_tokens") if c in cols) +
                " FROM src WHERE rtype = 'step'")
    lo, hi, busy = con.execute("SELECT min(t_ms), max(t_ms + dur_ms), sum(dur_ms) FROM st").fetchone()
    d = _dist(con, "st", "dur_ms", "step duration", DEFAULT_PERCENTILES)   # as metrics.step_summary: the defaults
    d.pop("notes")
    out = {"steps": int(n), "span_ms": [float(lo), float(hi)], "busy_ms": float(busy),
           "busy_fraction": float(busy / (hi - lo)) if hi > lo else None, "dur_ms": d}
    for c in ("prefill_tokens", "decode_tokens"):
        if c in cols:
            neg, total = con.execute(f"SELECT bool_or({c} < 0 OR {c} IS NULL), sum({c}) FROM st").fetchone()
            if not neg:
                out[c] = int(total)
    return out


def _slo(con, slo: SLO, start, end, span_ms) -> dict:
    """metrics.slo_summary's fields: completed requests within every given bound (a missing TPOT
    violates nothing), goodput of those whose last token is in the window."""
    done = "reason IN (" + ", ".join(f"'{r}'" for r in COMPLETED) + ")"
    conds, counts = [], {}
    for key, col, bound in (("ttft", "ttft", slo.ttft_ms), ("tpot", "tpot", slo.tpot_ms), ("e2e", "e2e", slo.e2e_ms)):
        if bound is None:
            counts[key] = None
            continue
        ok = f"({col} <= {float(bound)!r}" + (f" OR {col} IS NULL OR isnan({col}))" if key == "tpot" else ")")
        conds.append(ok)
        counts[key] = int(con.execute(f"SELECT count(*) FROM m WHERE {done} AND NOT coalesce({ok}, false)")
                          .fetchone()[0])
    met_expr = " AND ".join([done] + [f"coalesce({c}, false)" for c in conds])
    con.execute(f"CREATE TEMP TABLE met AS SELECT i, last FROM m WHERE {met_expr}")
    n, met, fails = con.execute(f"SELECT count(*), (SELECT count(*) FROM met), count(*) FILTER (NOT coalesce({done}, "
                                "false)) FROM m").fetchone()
    counts["failed"] = int(fails)
    good = con.execute("SELECT count(*) FROM met WHERE last >= ? AND last <= ?", [start, end]).fetchone()[0]
    good_tokens = con.execute("SELECT count(*) FROM src JOIN met ON src.req = met.i WHERE src.rtype = 'token' "
                              "AND src.t_ms >= ? AND src.t_ms <= ?", [start, end]).fetchone()[0] if n else 0
    secs = span_ms / 1000.0
    return {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms, "requests": int(n),
            "met": int(met), "attainment": float(met / n) if n else None,
            "goodput_req_per_s": good / secs if secs > 0 else None,
            "goodput_tok_per_s": good_tokens / secs if secs > 0 else None, "violations": counts}
