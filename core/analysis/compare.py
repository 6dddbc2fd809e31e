"""Two traces of the same workload side by side: what differs in their workloads, a metric
table, and empirical CDFs."""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.analysis.metrics import summarize
from core.trace import Trace


def workload_differences(a: Trace, b: Trace, limit: int = 5, arrivals: bool = True) -> list[str]:
    """Differences between two traces' workloads (ids, arrivals unless `arrivals` is False,
    prompt/output lengths); `workload_differences_of` for their request tables alone."""
    return workload_differences_of(a.requests, b.requests, limit, arrivals)


def workload_differences_of(a_requests: pd.DataFrame, b_requests: pd.DataFrame, limit: int = 5,
                            arrivals: bool = True) -> list[str]:
    """workload_differences from the two request tables (id, arrival_ms, prompt_tokens, max_output_tokens).
    Requests are matched by id; when no id is shared and both have the same number of requests
    (an engine's result file names its requests req0, req1, ... by position), they are matched
    by position in arrival order instead, and the first line says so."""
    out = []
    ra, rb = a_requests.set_index("id"), b_requests.set_index("id")
    common = ra.index.intersection(rb.index)
    if len(common) == 0 and len(ra) == len(rb) and len(ra):
        out.append(f"no request id is shared: the {len(ra)} requests are matched by position (arrival order)")
        ra = a_requests.sort_values("arrival_ms", kind="stable").reset_index(drop=True)
        rb = b_requests.sort_values("arrival_ms", kind="stable").reset_index(drop=True)
        names = [f"#{i} ({x} / {y})" for i, (x, y) in enumerate(zip(ra["id"], rb["id"]))]
        common = ra.index
    else:
        only_a, only_b = ra.index.difference(rb.index), rb.index.difference(ra.index)
        if len(only_a) or len(only_b):
            out.append(f"request ids differ: {len(only_a)} only in the first, {len(only_b)} only in the second")
        names = list(common)
    for col, what in (("arrival_ms", "arrival times"), ("prompt_tokens", "prompt lengths"),
                      ("max_output_tokens", "requested output lengths"))[0 if arrivals else 1:]:
        x, y = ra.loc[common, col].to_numpy(), rb.loc[common, col].to_numpy()
        diff = ~np.isclose(x, y) if col == "arrival_ms" else x != y
        if diff.any():
            ex = ", ".join(f"{names[i]}: {x[i]:g} vs {y[i]:g}" for i in np.flatnonzero(diff)[:limit])
            out.append(f"{int(diff.sum())} request(s) have different {what} ({ex})")
    return out


METRIC_ROWS = [("TTFT mean", "ttft_ms", "mean"), ("TTFT p50", "ttft_ms", "median"), ("TTFT p99", "ttft_ms", "p99"),
               ("TPOT mean", "tpot_ms", "mean"), ("TPOT p99", "tpot_ms", "p99"), ("ITL mean", "itl_ms", "mean"),
               ("ITL p99", "itl_ms", "p99"), ("E2E mean", "e2e_ms", "mean"), ("E2E p99", "e2e_ms", "p99")]


RESERVED = ("metric", "difference", "ratio")    # the table's own columns


def distinct_labels(label_a: str, label_b: str) -> tuple[str, str]:
    """Two column labels that are neither equal (a trace compared with itself, or two files of the same
    label) nor one of the table's own columns: "(first)" and "(second)" appended where needed."""
    a, b = str(label_a), str(label_b)
    if a == b:
        a, b = f"{a} (first)", f"{b} (second)"
    a = a if a not in RESERVED else f"{a} (first)"
    b = b if b not in RESERVED else f"{b} (second)"
    return a, b


def compare_table(a: Trace, b: Trace, label_a: str, label_b: str) -> pd.DataFrame:
    """Key metrics side by side with the difference (second - first) and the ratio."""
    return summary_table(summarize(a, per_request=False, client_window_too=False)["summary"],
                         summarize(b, per_request=False, client_window_too=False)["summary"], label_a, label_b)


def summary_table(sa: dict, sb: dict, label_a: str, label_b: str) -> pd.DataFrame:
    """compare_table from two summaries (metrics.summarize's "summary", over their own drain windows; or
    core.analysis.outofcore's for traces larger than memory)."""
    for s, label in ((sa, label_a), (sb, label_b)):
        if s.get("window_kind", "drain") != "drain":
            raise ValueError(f"{label}: a summary over a fixed window; the table compares drain windows")
    rows = []
    for name, key, stat in METRIC_ROWS:
        rows.append((f"{name} (ms)", sa[key][stat], sb[key][stat]))
    span = lambda s: s["window_ms"][1] - s["window_ms"][0]
    rows.append(("output tok/s (own drain window)", sa["output_tok_per_s"], sb["output_tok_per_s"]))
    rows.append(("drain window (ms)", span(sa), span(sb)))
    rows.append(("emitted tokens", sa["output_tokens"], sb["output_tokens"]))
    label_a, label_b = distinct_labels(label_a, label_b)
    df = pd.DataFrame(rows, columns=["metric", label_a, label_b])
    x = pd.to_numeric(df[label_a], errors="coerce")
    y = pd.to_numeric(df[label_b], errors="coerce")
    df["difference"] = y - x
    df["ratio"] = np.where(x != 0, y / x, np.nan)
    return df


def cdf_points(values) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF: sorted values and cumulative fractions (missing values dropped)."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[~np.isnan(v)]
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)
