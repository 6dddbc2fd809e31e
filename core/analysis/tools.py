"""Our metrics beside another tool's own statistics of the same run (an Imported file's
`stats`), each computed as that tool computes it: its percentile estimator (numpy's method
names: vLLM, AIPerf and inference-perf interpolate linearly, guidellm takes the nearest rank,
'inverted_cdf'), its weighting (guidellm weights each request's ITL by its tokens - 1) and its
throughput window (when the file says what it was). The
metrics themselves are core.analysis.metrics' definitions; what the tool calls each of them is
in the importer's `origin` (shown as file_definition)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.analysis.metrics import itl_gaps, request_metrics, throughput

COLUMNS = ["metric", "stat", "file", "ours", "relative_difference", "file_definition"]


def weighted_stat(v: np.ndarray, w: np.ndarray | None, stat: str, estimator: str) -> float | None:
    """One statistic of samples v (NaN dropped) with optional weights w."""
    keep = ~np.isnan(v)
    v = v[keep]
    w = None if w is None else w[keep]
    if not len(v):
        return None
    if w is not None and not (w > 0).all():
        v, w = v[w > 0], w[w > 0]
        if not len(v):
            return None
    if stat == "mean":
        return float(np.average(v, weights=w))
    if stat == "min":
        return float(v.min())
    if stat == "max":
        return float(v.max())
    if stat == "std":
        mu = np.average(v, weights=w)
        return float(np.sqrt(np.average((v - mu) ** 2, weights=w)))
    q = 50.0 if stat == "p50" else float(stat[1:])
    if estimator != "inverted_cdf":
        return float(np.percentile(v, q, method=estimator, weights=w))
    # nearest rank over a (weighted) pdf, as guidellm computes it: the first value whose cumulative
    # probability reaches q, the probabilities summed in floating point as it sums them
    order = np.argsort(v, kind="stable")
    w = np.ones(len(v)) if w is None else w[order].astype(float)
    cdf = np.cumsum(w / w.sum())
    return float(v[order][min(int(np.searchsorted(cdf, q / 100.0, side="left")), len(v) - 1)])


def tool_comparison(imp) -> pd.DataFrame:
    """One row per (metric, stat) the tool reports: its value, ours computed its way, and the
    relative difference (ours - file) / file."""
    tr = imp.trace
    if tr is None or not imp.stats:
        return pd.DataFrame(columns=COLUMNS)
    m = request_metrics(tr)
    samples = {k: m[k].to_numpy(dtype=float) for k in ("ttft_ms", "tpot_ms", "e2e_ms", "latency_ms")}
    samples["itl_ms"] = itl_gaps(tr)
    tokens = m["output_tokens"].to_numpy(dtype=float)
    ok = np.isin(m["finish_reason"].to_numpy(dtype=object), ["error", "abort", "rejected"], invert=True)
    rows = []
    for (metric, stat), theirs in imp.stats.items():
        if metric == "output_tok_per_s":   # over the tool's own window when the file says what it was
            mine = throughput(tr, imp.window_ms).tok_per_s
        else:
            v = samples[metric]
            w = None
            if metric != "itl_ms":
                v = np.where(ok, v, np.nan)      # the tools' latency statistics are over successful requests
                if imp.weights.get(metric) == "tokens-1":
                    w = np.maximum(tokens - 1, 0)
            mine = weighted_stat(v, w, stat, imp.estimator)
        rel = None if mine is None or not theirs else (mine - theirs) / theirs
        rows.append({"metric": metric, "stat": stat, "file": theirs, "ours": mine, "relative_difference": rel,
                     "file_definition": imp.origin.get(metric, "")})
    return pd.DataFrame(rows, columns=COLUMNS)


# The replay page's headline statistics: (label, metric, the tool's stat key, our summary's key).
HEADLINE = (("TTFT p50", "ttft_ms", "p50", "median"), ("TTFT p99", "ttft_ms", "p99", "p99"),
            ("TPOT mean", "tpot_ms", "mean", "mean"))
ESTIMATOR_NAMES = {"inverted_cdf": "nearest rank", "linear": "linear interpolation"}


def headline(summary: dict, imp=None) -> list[dict]:
    """The headline statistics: where the file carries the tool's own figure, that figure (what its users
    saw, computed its way), with ours beside it; otherwise ours. One dict per HEADLINE row: label, value,
    ours, by (who computed `value`), estimator (of `value`)."""
    stats = getattr(imp, "stats", None) or {}
    ours_est = ESTIMATOR_NAMES.get(summary.get("percentile_estimator", "linear"), "linear interpolation")
    out = []
    for label, metric, stat, key in HEADLINE:
        ours = (summary.get(metric) or {}).get(key)
        theirs = stats.get((metric, stat))
        if theirs is not None:
            est = ESTIMATOR_NAMES.get(imp.estimator, imp.estimator) if stat.startswith("p") else "—"
            out.append({"label": label, "value": theirs, "ours": ours, "by": imp.tool, "estimator": est})
        else:
            out.append({"label": label, "value": ours, "ours": ours, "by": "ours",
                        "estimator": ours_est if stat.startswith("p") else "—"})
    return out


def itl_note(imp) -> str | None:
    """How the file's ITL and ours count tokens that reached the client together (a zero gap): the tool's
    statistics include them as 0 ms when its minimum ITL is 0; ours (core.analysis.metrics.itl_gaps)
    has one gap per new emission time. None when the file has no ITL statistics or the trace no such
    tokens."""
    stats = getattr(imp, "stats", None) or {}
    tr = getattr(imp, "trace", None)
    if ("itl_ms", "mean") not in stats and ("itl_ms", "p50") not in stats or tr is None or not len(tr.tokens):
        return None
    tk = tr.tokens
    order = np.lexsort((tk["t_ms"].to_numpy(dtype=float), tk["req"].to_numpy()))
    req, t = tk["req"].to_numpy()[order], tk["t_ms"].to_numpy(dtype=float)[order]
    zero = int(((req[1:] == req[:-1]) & (t[1:] == t[:-1])).sum())
    if not zero:
        return None
    counts = stats.get(("itl_ms", "min")) == 0.0
    return (f"ITL: {zero:,} tokens reached the client at the same time as the one before (several tokens in one "
            f"chunk). Ours has one gap per new arrival time, so these are not samples of ours; {imp.tool}'s own "
            + ("ITL counts each as a gap of 0 ms (its minimum is 0)." if counts else
               "ITL statistics may count them differently (its file does not say).")
            + " The two ITL rows of the comparison differ for that reason.")
