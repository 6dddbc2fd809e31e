"""A step model fitted to a Parquet trace larger than memory (issue 29): each step's features
(core.fit.stepfit.trace_features: prefill tokens, decoding sequences, attended positions, prefill
pieces) aggregated from the batch rows in DuckDB where the data lives, then the same solve.

Per batch row, the tokens already in its request's cache when the step began
(stepfit.entry_start_positions) are a window sum: the tokens of the same request's earlier rows
of the same stay (a stay ends at a preemption) in step order, plus its prefix-cache hits of that
stay times the block size. Only the per-step features (one row per step) come into memory.
"""
from __future__ import annotations

import tempfile

import numpy as np

from core.analysis.definitions import STEP_FEATURES
from core.analysis.parquet_source import duck_connect, parquet_files, source_view, trace_head
from core.errors import ConfigError
from core.fit.stepfit import FEATURES, MIN_STEPS, MODELS, counted_features_of, model_of, solve


def features_parquet(path) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict, bool]:
    """stepfit.trace_features of a Parquet trace: (step numbers, features, durations), the head's meta,
    and whether its steps carry counts instead of batch rows (stepfit.counted_steps)."""
    files = parquet_files(path)
    meta = trace_head(files).get("meta") or {}
    with tempfile.TemporaryDirectory(prefix="serving-explorer-duckdb-") as tmp:
        con = duck_connect(tmp)
        cols = source_view(con, files)
        steps = con.execute("SELECT step, t_ms, dur_ms" + (", prefill_tokens, prefill_reqs, decode_reqs"
                                                            if {"prefill_tokens", "prefill_reqs", "decode_reqs"} <= cols
                                                            else "")
                            + " FROM src WHERE rtype = 'step' ORDER BY rowkey").fetchnumpy()
        n_batch = con.execute("SELECT count(*) FROM src WHERE rtype = 'batch'").fetchone()[0]
        S = len(steps["step"])
        if S and not n_batch:
            con.close()
            counted = "prefill_tokens" in steps and bool((np.asarray(steps["prefill_tokens"]) >= 0).all())
            if not counted:
                return np.zeros(0, dtype=np.int64), np.zeros((0, len(FEATURES))), np.zeros(0), meta, False
            import pandas as pd
            return counted_features_of(pd.DataFrame(steps)) + (meta, True)
        if not S or not n_batch:
            con.close()
            return np.zeros(0, dtype=np.int64), np.zeros((0, len(FEATURES))), np.zeros(0), meta, False
        bs = int((meta.get("engine") or {}).get("block_size") or 16)
        # a step number twice (a hostile file): entry_start_positions takes its last row's start
        con.execute("CREATE TEMP TABLE st AS SELECT step, arg_max(t_ms, rowkey) AS t FROM src WHERE rtype = 'step' "
                    "GROUP BY step")
        con.execute("CREATE TEMP TABLE pre AS SELECT req, t_ms FROM src WHERE rtype = 'preempt'")
        # NaN start (a step without its step row): after every preemption, as numpy's searchsorted puts NaN
        con.execute("""CREATE TEMP TABLE b AS
            SELECT x.rowkey, x.req, x.step, x.kind, x.tokens,
                   (SELECT count(*) FROM pre WHERE pre.req = x.req AND (x.t IS NULL OR pre.t_ms <= x.t)) AS stay
            FROM (SELECT s.rowkey, s.req, s.step, s.kind, s.tokens, st.t FROM src s LEFT JOIN st USING (step)
                  WHERE s.rtype = 'batch') x""")
        hits = "0"
        if con.execute("SELECT count(*) FROM src WHERE rtype = 'kv' AND op = 'hit'").fetchone()[0]:
            con.execute("""CREATE TEMP TABLE h AS SELECT req, stay, count(*) AS hits FROM (
                SELECT k.req, (SELECT count(*) FROM pre WHERE pre.req = k.req AND pre.t_ms <= k.t_ms) AS stay
                FROM src k WHERE k.rtype = 'kv' AND k.op = 'hit') GROUP BY req, stay""")
            hits = f"coalesce((SELECT hits FROM h WHERE h.req = b.req AND h.stay = b.stay), 0) * {bs}"
        # each feature defined once (definitions.STEP_FEATURES), summed per step here
        sums = ", ".join(f"sum({e.sql({})})::DOUBLE AS {name}" for name, e in STEP_FEATURES.items())
        agg = con.execute(f"""
            SELECT step, {sums}
            FROM (SELECT step, kind, tokens,
                         (coalesce(sum(tokens) OVER (PARTITION BY req, stay ORDER BY step, rowkey
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) + {hits})::DOUBLE AS start
                  FROM b)
            GROUP BY step""").fetchnumpy()
        con.close()
    numbers = steps["step"].astype(np.int64)
    last_row = {int(s): i for i, s in enumerate(numbers)}     # trace_features: a number's last row gets its entries
    X = np.zeros((S, len(FEATURES)))
    X[:, 0] = 1.0
    has = np.zeros(S, dtype=bool)
    rows = np.array([last_row.get(int(s), -1) for s in agg["step"]], dtype=np.int64)
    ok = rows >= 0
    for col, name in enumerate(FEATURES[1:], 1):
        X[rows[ok], col] = np.asarray(agg[name], dtype=float)[ok]
    has[rows[ok]] = True
    return numbers[has], X[has], np.asarray(steps["dur_ms"], dtype=float)[has], meta, False


def fit_parquet(path, model: str = "features"):
    """stepfit.fit of a Parquet trace, out of core: (StepModel, report)."""
    if model not in MODELS:
        raise ConfigError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")
    steps, X, y, meta, counted = features_parquet(path)
    if model == "features" and counted:
        raise ConfigError("fit: the trace's steps carry counts, not batch entries (an engine's iteration log): the "
                          "attended positions the 'features' model needs are unknown; fit --model affine")
    if len(y) < MIN_STEPS:
        raise ConfigError(f"fit: the trace needs step events with batch composition (at least {MIN_STEPS} steps, "
                          f"has {len(y)})")
    full, quality = solve(X, y, model)
    return model_of(model, full), {"trace": meta.get("label") or meta.get("source"), "model": model, **quality,
                                   "out_of_core": True}
