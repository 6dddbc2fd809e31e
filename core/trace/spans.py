"""Decode spans: how a simulated trace's Parquet file holds its plain decode steps.

A simulator's decoders emit one token in every step of a stretch, so the file keeps each stretch
as one `span` row instead of a token row and a batch row per step: request `req` (running order
`join`) decoded one token in each of the `tokens` consecutive steps from `step`, its output
indices from `index`; each token reached the client when its step ended (the step's t_ms +
dur_ms). The other entries (prefill chunks, a request that sat out, ...) are listed as before,
their token and batch rows carrying their step and join number. `expand` turns both into the
token and batch rows stepping would have listed, in the same order (step, then running order);
the readers (core.trace.parquet in memory, core.analysis.outofcore in SQL) read a file with
spans exactly as they read the same trace with every row listed.

A span row: req, join, step, tokens, index (columns of the file layout, core.trace.writer);
single-engine traces only (replica 0). Listed rows of a file with spans: token rows add step
and join, batch rows join.

The same files keep a free of a whole block table (no block shared) as one `kv_free` row, expanded
by `kv_with_frees` (the rule is below, beside it).
"""
from __future__ import annotations

import numpy as np

from core.errors import TraceError

SPAN_COLUMNS = ("req", "join", "step", "tokens", "index")
KEY = 1 << 32               # row order key: step x KEY + join (join numbers below 2**31; -1: before every join)
_JOIN_MAX = (1 << 31) - 1
_STEP_MAX = (1 << 31) - 1


def order_key(step, join) -> np.ndarray:
    return np.asarray(step, dtype=np.int64) * KEY + np.asarray(join, dtype=np.int64)


def check_spans(cols: dict, n_requests: int, max_output, name: str):
    """A file's span rows against what a trace allows, before any is expanded: every column
    present and in range (a request listed, step and join within the order key, at least one
    token), and no request given more decode tokens than its max_output_tokens (so expanding
    never makes more rows than a trace of those requests may hold; `max_output` None: not checked
    here). TraceError otherwise."""
    for c in SPAN_COLUMNS:
        v = cols.get(c)
        if v is None or (hasattr(v, "null_count") and v.null_count):
            raise TraceError(f"{name}: span records: {c} missing")
    req, join, step, n, idx = (np.asarray(cols[c], dtype=np.int64) for c in SPAN_COLUMNS)
    for what, v, lo, hi in (("req", req, 0, n_requests - 1), ("join", join, 0, _JOIN_MAX),
                            ("step", step, 0, _STEP_MAX), ("tokens", n, 1, _STEP_MAX), ("index", idx, 0, None)):
        bad = (v < lo) | (v > hi) if hi is not None else v < lo
        if bad.any():
            k = int(np.argmax(bad))
            upto = "" if hi is None else f"{hi:,}"
            raise TraceError(f"{name}: span record {k}: {what}: expected an integer in {lo}..{upto}, got {int(v[k])}")
    if ((step + n - 1) > _STEP_MAX).any():
        k = int(np.argmax((step + n - 1) > _STEP_MAX))
        raise TraceError(f"{name}: span record {k}: step + tokens past {_STEP_MAX:,}")
    if max_output is None:   # (checked over the whole file elsewhere: core.analysis.outofcore)
        return
    per_req = np.bincount(req, weights=n, minlength=n_requests)
    over = per_req > np.asarray(max_output, dtype=np.float64)
    if over.any():
        r = int(np.argmax(over))
        raise TraceError(f"{name}: span records: request {r} decodes {int(per_req[r]):,} tokens, over its "
                         f"max_output_tokens {int(np.asarray(max_output)[r]):,}")


def span_rows(spans: list, counter0: int, counter_step: list) -> dict | None:
    """Span rows from a step log's decoders: `spans` (req, join, a, b, e0) in decode counter values
    (the counter's value c ran in step counter_step[c - counter0]), each cut where those steps are not
    consecutive (a step the decoders sat out). None without spans."""
    if not spans:
        return None
    sp = np.array(spans, dtype=np.int64).reshape(-1, 5)
    cs = np.asarray(counter_step, dtype=np.int64)
    a, b = sp[:, 2] - counter0, sp[:, 3] - counter0
    gaps = np.flatnonzero(np.diff(cs) != 1) + 1 if len(cs) > 1 else np.zeros(0, np.int64)   # counter offsets
    if len(gaps):   # cut each span at the gaps inside it
        lo, hi = np.searchsorted(gaps, a, "right"), np.searchsorted(gaps, b, "left")
        cuts = hi - lo
        rep = np.repeat(np.arange(len(sp)), cuts + 1)
        first = np.cumsum(cuts + 1) - (cuts + 1)
        k = np.arange(len(rep)) - first[rep]            # piece number within its span
        starts = np.where(k == 0, a[rep], gaps[np.minimum(lo[rep] + k - 1, len(gaps) - 1)])
        ends = np.where(k == cuts[rep], b[rep], gaps[np.minimum(lo[rep] + k, len(gaps) - 1)])
        sp, a, b = sp[rep], starts, ends
    return {"req": sp[:, 0], "join": sp[:, 1], "step": cs[a], "tokens": b - a,
            "index": sp[:, 4] + (a - (sp[:, 2] - counter0))}


def _insert(dec: dict, dkey: np.ndarray, listed: dict, key: np.ndarray) -> dict:
    """The listed rows placed among the decoders' rows (both in key order)."""
    return _inserted(dec, len(dkey), np.searchsorted(dkey, key), listed)


def _inserted(dec: dict, n: int, at: np.ndarray, listed: dict) -> dict:
    """np.insert(dec[c], at, listed[c]) for every column c of `listed` (`at` in order; a column of
    `dec` given as a constant (value, dtype) is that value in each of its n rows), with the places
    found once for all the columns (np.insert finds them again for each)."""
    k = len(at)
    ins = np.asarray(at, dtype=np.int64) + np.arange(k)   # listed row j's place
    rest = np.ones(n + k, dtype=bool)                     # the others' (a mask: faster to write through)
    rest[ins] = False
    out = {}
    for c, v in listed.items():
        d = dec[c]
        if isinstance(d, tuple):
            col = np.full(n + k, d[0], dtype=d[1])
        else:
            col = np.empty(n + k, dtype=d.dtype)
            col[rest] = d
        col[ins] = v
        out[c] = col
    return out


def _filled(cols: dict, m: int) -> dict:
    """Columns with the constant ones (value, dtype) made arrays of m rows."""
    return {c: np.full(m, v[0], dtype=v[1]) if isinstance(v, tuple) else v for c, v in cols.items()}


def expand(span: dict, steps: dict, tokens: dict | None, batch: dict | None, name: str = "trace") \
        -> tuple[dict, dict]:
    """Token and batch columns with the span rows expanded, in step then running order.
    `span`: SPAN_COLUMNS; `steps`: the step records' step, t_ms, dur_ms (a span's steps must be
    among them); `tokens` (t_ms, req, index, source codes, token_id, step, join) and `batch` (step,
    req, tokens, kind codes, join): the listed rows, in key order, or None. Returns (tokens, batch)
    without the step and join columns the listed rows carried."""
    n = np.asarray(span["tokens"], dtype=np.int64)
    m = int(n.sum())
    first = np.cumsum(n) - n                           # each span's first row, span after span
    sp_step, sp_join = np.asarray(span["step"], dtype=np.int64), np.asarray(span["join"], dtype=np.int64)
    # row r of span s decodes in step sp_step[s] + (r - first[s]); the rows in (step, join) order
    order = np.argsort(order_key(np.arange(m) - np.repeat(first - sp_step, n), np.repeat(sp_join, n)), kind="stable")
    s = np.repeat(np.arange(len(n)), n)[order]         # (the one gather over every row: the rest read the spans')
    off = order - first[s]
    step = sp_step[s] + off
    key = order_key(step, sp_join[s])
    st = np.asarray(steps["step"], dtype=np.int64)
    if len(st) and st[-1] - st[0] == len(st) - 1 and (np.diff(st) == 1).all():   # (a run's steps: numbered in order)
        row = step - st[0]
        missing = (row < 0) | (row >= len(st))
        row[missing] = 0
    else:
        by = np.argsort(st, kind="stable")
        at = np.minimum(np.searchsorted(st[by], step), max(len(st) - 1, 0))
        missing = st[by][at] != step if len(st) else np.ones(len(step), bool)
        row = by[at] if len(st) else np.zeros(len(step), np.int64)
    if missing.any():
        k = int(np.argmax(missing))
        raise TraceError(f"{name}: span records: request {int(np.asarray(span['req'])[s[k]])} decodes in step "
                         f"{int(step[k])}, which has no step record")
    t_end = np.asarray(steps["t_ms"], dtype=np.float64)[row] + np.asarray(steps["dur_ms"], dtype=np.float64)[row]
    req = np.asarray(span["req"], dtype=np.int64)[s]
    d_tok = {"t_ms": t_end, "req": req, "index": np.asarray(span["index"], dtype=np.int64)[s] + off,
             "source": (0, np.int8), "token_id": (-1, np.int64)}
    d_batch = {"step": step, "req": req, "tokens": (1, np.int64), "kind": (0, np.int8)}
    if tokens is not None and len(tokens["req"]):
        tkey = order_key(tokens["step"], tokens["join"])
        d_tok = _insert(d_tok, key, {c: tokens[c] for c in d_tok}, tkey)
    if batch is not None and len(batch["req"]):
        bkey = order_key(batch["step"], batch["join"])
        d_batch = _insert(d_batch, key, {c: batch[c] for c in d_batch}, bkey)
    return _filled(d_tok, m), _filled(d_batch, m)


# ---- frees of whole block tables ---------------------------------------------------------------
# A `kv_free` row (a simulated file without shared blocks: no prefix cache, no fork) stands for the
# `free` rows of a request's whole block table: request `req` frees its next `logical` + 1 allocated
# blocks (in the order they were allocated, counting from its first allocation, each freed once),
# listed from the last allocated to the first, each with that allocation's block and logical index,
# reference count 0, no hash; it comes after `index` of the file's listed KV rows.
FREE_COLUMNS = ("t_ms", "req", "logical", "index")


def kv_with_frees(kv: dict, frees: dict, ops: tuple, name: str = "trace") -> dict:
    """The KV columns (t_ms, op codes into `ops`, req, block, logical, ref, hash (a list or None),
    src) with the kv_free rows expanded in place. TraceError where a row cannot be: its place
    outside the listed rows or before an earlier one's, or fewer allocations of its request before
    it than it frees."""
    L = len(kv["op"])
    check_frees(frees, None, name)
    n = np.asarray(frees["logical"], dtype=np.int64) + 1
    pos = np.asarray(frees["index"], dtype=np.int64)
    req = np.asarray(frees["req"], dtype=np.int64)
    a = np.flatnonzero(np.asarray(kv["op"]) == ops.index("alloc"))
    bad = (n > len(a)) | (pos > L) | (np.diff(pos, prepend=0) < 0)
    if bad.any() or n.sum() > len(a):   # (before anything is expanded: at most every allocation freed once)
        k = int(np.argmax(bad)) if bad.any() else int(np.argmax(np.cumsum(n) > len(a)))   # (where they run out)
        raise TraceError(f"{name}: kv_free record {k}: frees {int(n[k]):,} blocks after {int(pos[k]):,} KV rows: "
                         f"expected its place among the {L:,} KV rows, in order, and no more blocks than allocated "
                         f"({len(a):,})")
    ra = np.asarray(kv["req"], dtype=np.int64)[a]
    oa = np.argsort(ra, kind="stable")
    a, ra = a[oa], ra[oa]                                  # allocations by request, in order
    of = np.argsort(req, kind="stable")
    rf, nf = req[of], n[of]
    excl = np.cumsum(nf) - nf
    first = np.r_[True, rf[1:] != rf[:-1]] if len(rf) else np.zeros(0, bool)
    off = excl - excl[np.maximum.accumulate(np.where(first, np.arange(len(rf)), 0))]
    start = np.empty(len(req), np.int64)
    start[of] = np.searchsorted(ra, rf) + off              # each free's first allocation (among a)
    m = int(n.sum())
    f = np.repeat(np.arange(len(n)), n)
    j = np.arange(m) - np.repeat(np.cumsum(n) - n, n)
    src = np.repeat(start + n - 1, n) - j                  # the last allocated first
    ok = src < len(a)
    ok[ok] = (ra[src[ok]] == req[f[ok]]) & (a[src[ok]] < pos[f[ok]])
    if not ok.all():
        k = int(f[np.argmin(ok)])
        raise TraceError(f"{name}: kv_free record {k}: request {int(req[k])} frees {int(n[k]):,} blocks, more than "
                         "it allocated before it")
    rows = a[src]
    add = {"t_ms": np.asarray(frees["t_ms"], dtype=np.float64)[f], "op": np.full(m, ops.index("free"), np.int8),
           "req": req[f], "block": np.asarray(kv["block"])[rows], "logical": np.asarray(kv["logical"])[rows],
           "ref": np.zeros(m, np.int64), "src": np.full(m, -1, np.int64)}
    at = np.repeat(pos, n)
    out = _inserted({c: np.asarray(kv[c]) for c in add}, L, at, add)
    hashes = kv.get("hash")
    out["hash"] = None if hashes is None else list(np.insert(np.asarray(hashes, dtype=object), at, None))
    return out


def check_frees(cols: dict, n_requests: int | None, name: str):
    """A file's kv_free rows, each on its own: every column present, a request listed (when
    n_requests is given), logical and index >= 0, a time."""
    for c in FREE_COLUMNS:
        v = cols.get(c)
        if v is None or (hasattr(v, "null_count") and v.null_count):
            raise TraceError(f"{name}: kv_free records: {c} missing")
    for c in ("req", "logical", "index"):
        v = np.asarray(cols[c], dtype=np.int64)
        bad = (v < 0) | (v >= n_requests) if c == "req" and n_requests is not None else v < 0
        if bad.any():
            k = int(np.argmax(bad))
            raise TraceError(f"{name}: kv_free record {k}: {c}: {int(v[k])} out of range")
