"""The engine's own prefix cache, from a trace's kv_event rows (schema.KV_EVENT): blocks
stored, removed, clears, and the cached blocks over time (distinct hashes in the cache), defined
once for `metrics` (summary.kv_events), the pages and the Perfetto export."""
from __future__ import annotations

import numpy as np
import pandas as pd


def cached_blocks(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(t_ms, cached blocks after each row): a stored hash already cached and a removed hash not
    cached change nothing; a clear empties the cache. A fleet's rows (a replica column): each
    replica's cache its own (the same hash on two replicas is two blocks; a clear empties its own),
    the count their sum."""
    reps = table["replica"].tolist() if "replica" in table else None
    return table["t_ms"].to_numpy(dtype=float), CacheCount().feed(table["op"].tolist(), table["hash"].tolist(),
                                                                  reps)


class CacheCount:
    """The distinct blocks cached after each kv_event row (per replica, summed), fed in recorded
    order all at once or in consecutive chunks (a trace larger than memory: core/analysis/outofcore.py)."""

    def __init__(self):
        self.cached: set = set()         # (replica, hash)

    def feed(self, ops: list, hashes: list, replicas: list | None = None) -> np.ndarray:
        cached = self.cached
        n = np.empty(len(ops), dtype=np.int64)
        reps = replicas if replicas is not None else [0] * len(ops)
        for k, (op, h, r) in enumerate(zip(ops, hashes, reps)):
            if op == "stored":
                cached.add((r, h))
            elif op == "removed":
                cached.discard((r, h))
            else:
                cached.difference_update([x for x in cached if x[0] == r])
            n[k] = len(cached)
        return n


def on_gpu(table: pd.DataFrame) -> pd.DataFrame:
    """The events of the GPU prefix cache: those whose medium is GPU or not stated (vLLM's CPU
    offloading tier publishes its own stores and evictions with medium CPU: another cache)."""
    if "medium" not in table:
        return table
    m = table["medium"]
    keep = m.isna() | (m.astype(str).str.upper() == "GPU")
    return table if bool(keep.all()) else table[keep.to_numpy()]


def kv_event_summary(table: pd.DataFrame) -> dict:
    """{stored_blocks, removed_blocks, cleared, peak_cached_blocks} (metrics --json's summary.kv_events):
    the GPU prefix cache's rows by op, and the most distinct blocks cached at once; with events of
    other media (a CPU offloading tier), their stored and removed blocks by medium too."""
    gpu = on_gpu(table)
    ops = gpu["op"].astype(str)
    _, n = cached_blocks(gpu)
    out = {"stored_blocks": int((ops == "stored").sum()), "removed_blocks": int((ops == "removed").sum()),
           "cleared": int((ops == "cleared").sum()), "peak_cached_blocks": int(n.max()) if len(n) else 0}
    if len(gpu) < len(table):
        rest = table.drop(gpu.index)
        for medium, rows in rest.groupby(rest["medium"].astype(str).str.upper()):
            o = rows["op"].astype(str)
            out[f"{medium.lower()}_stored_blocks"] = int((o == "stored").sum())
            out[f"{medium.lower()}_removed_blocks"] = int((o == "removed").sum())
    return out


def chain_roots(table: pd.DataFrame) -> dict:
    """Each stored block's prefix chain, named by the chain's first block: a block stored after
    its parent belongs to the parent's chain (vLLM hashes each block with its parent's, so blocks
    that share a first block share the prompt prefix up to it)."""
    root: dict = {}
    for op, h, parent in zip(table["op"].tolist(), table["hash"].tolist(), table["parent"].tolist()):
        if op == "stored" and h not in root:
            root[h] = root.get(parent, parent) if isinstance(parent, str) else h     # (none: NaN or None)
    return root


def _replicas_apart(table: pd.DataFrame) -> tuple[pd.DataFrame, list | None]:
    """A fleet's KV events with each replica's hashes its own (`r<k>:<hash>`: the same block hash in
    two replicas' caches is two cached blocks), and each row's replica; one engine's: as they are."""
    if "replica" not in table or table["replica"].nunique() < 2:
        return table, None
    reps = table["replica"].tolist()
    t = table.copy()
    t["hash"] = [f"r{k}:{h}" if isinstance(h, str) else None for k, h in zip(reps, table["hash"].tolist())]
    t["parent"] = [f"r{k}:{h}" if isinstance(h, str) else None for k, h in zip(reps, table["parent"].tolist())]
    return t, reps


def cache_over_time(table: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    """One row per kv_event row: t_ms, op, cached (distinct blocks in the cache after it), and
    cached blocks per prefix chain for the `top` chains with the most blocks at their peak (named
    chain 1.. by first appearance), the rest summed in `other chains`. A fleet's events (a replica
    column naming several): each replica's cache apart, `cached` their sum, chains named by replica
    (r0 chain 1, ...), a clear clearing its own replica's; attrs["replicas"] says how many. Only the GPU
    prefix cache's events (on_gpu)."""
    table, reps = _replicas_apart(on_gpu(table).reset_index(drop=True))
    root = chain_roots(table)
    cached: dict = {}          # hash -> its replica
    per: dict = {}
    rows = []
    rep_of = reps if reps is not None else [0] * len(table)
    for t, op, h, k in zip(table["t_ms"].tolist(), table["op"].astype(str).tolist(), table["hash"].tolist(), rep_of):
        if op == "stored" and h not in cached:
            cached[h] = k
            r = root.get(h, h)
            per[r] = per.get(r, 0) + 1
        elif op == "removed" and h in cached:
            del cached[h]
            r = root.get(h, h)
            per[r] -= 1
        elif op == "cleared":
            gone = [x for x, kk in cached.items() if kk == k]
            for x in gone:
                del cached[x]
                r = root.get(x, x)
                per[r] -= 1
            per = {r: n for r, n in per.items() if n}
        rows.append((t, op, len(cached), dict(per)))
    peak: dict = {}
    order: list = []
    for *_, p in rows:
        for r, n in p.items():
            if r not in peak:
                order.append(r)
            peak[r] = max(peak.get(r, 0), n)
    best = sorted(order, key=lambda r: (-peak[r], order.index(r)))[:top]
    names = {r: (f"{str(r).split(':', 1)[0]} " if reps is not None else "") + f"chain {order.index(r) + 1}"
             for r in sorted(best, key=order.index)}
    out = pd.DataFrame({"t_ms": [r[0] for r in rows], "op": [r[1] for r in rows], "cached": [r[2] for r in rows]})
    for r, name in names.items():
        out[name] = [p.get(r, 0) for *_, p in rows]
    out["other chains"] = out["cached"] - (out[list(names.values())].sum(axis=1) if names else 0)
    out.attrs["chains"] = list(names.values())
    out.attrs["chain_count"] = len(order)
    out.attrs["replicas"] = len(set(reps)) if reps is not None else 1
    return out


def cache_at(over_time: pd.DataFrame, t_ms: float) -> dict:
    """The prefix cache at a time: cached blocks, blocks per chain, and the stores, removals and
    clears up to then."""
    upto = over_time[over_time["t_ms"] <= t_ms]
    if not len(upto):
        return {"cached": 0, "stored": 0, "removed": 0, "cleared": 0}
    last = upto.iloc[-1]
    ops = upto["op"].value_counts()
    return {"cached": int(last["cached"]), "stored": int(ops.get("stored", 0)), "removed": int(ops.get("removed", 0)),
            "cleared": int(ops.get("cleared", 0)),
            "chains": {c: int(last[c]) for c in over_time.attrs.get("chains", []) + ["other chains"] if last[c]}}


def simulated_cache_over_time(kv: pd.DataFrame) -> pd.DataFrame:
    """The simulator's own prefix cache from its `kv` block events, in the same terms: a block
    enters the cache when it gets its hash ("cache"), leaves it when its cached copy is reused
    for other data ("evict"); t_ms and cached (blocks holding a hash)."""
    ev = kv[kv["op"].isin(["cache", "evict"])]
    cached: set = set()
    n = []
    for op, b in zip(ev["op"].astype(str).tolist(), ev["block"].tolist()):
        if op == "cache":
            cached.add(b)
        else:
            cached.discard(b)
        n.append(len(cached))
    return pd.DataFrame({"t_ms": ev["t_ms"].to_numpy(dtype=float), "op": ev["op"].astype(str).to_numpy(),
                         "cached": np.asarray(n, dtype=np.int64)})
