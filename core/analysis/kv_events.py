"""The engine's own prefix cache, from a trace's kv_event rows (schema.KV_EVENT): blocks
stored, removed, clears, and the cached blocks over time (distinct hashes in the cache), defined
once for `metrics` (summary.kv_events), the pages and the Perfetto export."""
from __future__ import annotations

import numpy as np
import pandas as pd


def cached_blocks(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(t_ms, cached blocks after each row): a stored hash already cached and a removed hash not
    cached change nothing; a clear empties the cache."""
    cached: set = set()
    n = np.empty(len(table), dtype=np.int64)
    for k, (op, h) in enumerate(zip(table["op"].tolist(), table["hash"].tolist())):
        if op == "stored":
            cached.add(h)
        elif op == "removed":
            cached.discard(h)
        else:
            cached.clear()
        n[k] = len(cached)
    return table["t_ms"].to_numpy(dtype=float), n


def kv_event_summary(table: pd.DataFrame) -> dict:
    """{stored_blocks, removed_blocks, cleared, peak_cached_blocks} (metrics --json's summary.kv_events):
    rows by op, and the most distinct blocks cached at once."""
    ops = table["op"].astype(str)
    _, n = cached_blocks(table)
    return {"stored_blocks": int((ops == "stored").sum()), "removed_blocks": int((ops == "removed").sum()),
            "cleared": int((ops == "cleared").sum()), "peak_cached_blocks": int(n.max()) if len(n) else 0}
