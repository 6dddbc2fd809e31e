"""A server's Prometheus /metrics as `gauge` events (schema.GAUGE), the names mapped once for
every reader: loadgen and observe sampling /metrics, AIPerf's recorded scrapes
(server_metrics_export.jsonl). vLLM's counters appear with the `_total` suffix in the text
format and without it in parsers that strip it (prometheus_client's families, AIPerf)."""
from __future__ import annotations

import math
from collections.abc import Iterable

METRIC_TO_GAUGE = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
                   "vllm:kv_cache_usage_perc": "kv_usage", "vllm:gpu_cache_usage_perc": "kv_usage",
                   "vllm:num_preemptions": "preemptions", "vllm:prefix_cache_queries": "prefix_cache_queries",
                   "vllm:prefix_cache_hits": "prefix_cache_hits",
                   "vllm:kv_offload_store_bytes": "offload_store_bytes",
                   "vllm:kv_offload_load_bytes": "offload_load_bytes",
                   "vllm:kv_offload_store_time": "offload_store_s", "vllm:kv_offload_load_time": "offload_load_s",
                   "vllm:kv_offload_cpu_cache_usage_perc": "offload_cpu_usage",
                   "vllm:external_prefix_cache_queries": "external_prefix_cache_queries",
                   "vllm:external_prefix_cache_hits": "external_prefix_cache_hits",
                   "sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "waiting",
                   "sglang:token_usage": "kv_usage"}


def gauge_field(metric: str) -> str | None:
    """The gauge field a metric sample fills (None: not one we keep)."""
    return METRIC_TO_GAUGE.get(metric.removesuffix("_total"))


def gauge_event(t_ms: float, samples: Iterable[tuple[str, float]]) -> dict | None:
    """One gauge event from (metric name, value) samples at t_ms, values summed over label sets
    (several engines or models); non-finite or negative values are left out. None when no
    sample maps to a gauge field."""
    g: dict = {}
    for name, value in samples:
        key = gauge_field(name)
        if key is None:
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v) and v >= 0:
            g[key] = g.get(key, 0.0) + v
    return {"t_ms": t_ms, "type": "gauge", **g} if g else None


MAX_SERIES = 200_000      # samples read from one /metrics page; the rest is left out (a hostile page)


def gauge_from_text(t_ms: float, text: str, max_series: int = MAX_SERIES) -> dict | None:
    """One gauge event from a /metrics page in the Prometheus text format (bounded)."""
    from itertools import islice

    from prometheus_client.parser import text_string_to_metric_families

    def samples():
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                yield s.name, s.value
    try:
        return gauge_event(t_ms, islice(samples(), max_series))
    except ValueError:       # not the text format
        return None
