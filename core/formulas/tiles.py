"""Online softmax and tiled attention (the FlashAttention idea), in plain numpy.

For one query with logits s_j and values v_j, attention output = sum_j e^{s_j} v_j / sum_j e^{s_j}.
Walking the keys tile by tile, keep three running statistics:
    m   = max logit seen so far                       (for numerical stability)
    l   = sum_j e^{s_j - m}                           (softmax denominator, scaled by e^-m)
    acc = sum_j e^{s_j - m} v_j                       (numerator, same scale)
When a tile raises the max from m to m', the old l and acc are multiplied by e^{m - m'}
(the rescale factor). At the end output = acc / l: exactly the full softmax average.
Averaging the per-tile outputs instead weights every tile equally, which is wrong
whenever tiles carry unequal probability mass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TileStep:
    tile: int
    start: int               # first key index of the tile
    stop: int                # one past the last key index
    tile_max: float          # max logit inside the tile
    m: float                 # running max after this tile
    rescale: float           # factor applied to the previous l and acc: e^(m_old - m_new)
    tile_sum: float          # sum of e^(s - m) over this tile (at the new max)
    l: float                 # running denominator after this tile
    acc: np.ndarray          # running numerator after this tile (scalar values -> shape ())
    output: np.ndarray       # acc / l: the answer if the keys stopped here
    tile_output: np.ndarray  # this tile's own softmax average (used by the wrong method)


def _check(logits, values, tile_size):
    s = np.asarray(logits, dtype=float)
    v = np.asarray(values, dtype=float)
    if s.ndim != 1 or len(s) == 0:
        raise ConfigError("logits: expected a non-empty 1-D list of numbers")
    if v.shape[:1] != s.shape:
        raise ConfigError(f"values: expected {len(s)} values (one per logit), got {v.shape[0] if v.ndim else 0}")
    if not np.all(np.isfinite(s)) and not np.all(np.isfinite(s) | (s == -np.inf)):
        raise ConfigError("logits: expected finite numbers (or -inf for masked keys)")
    if not np.isfinite(s).any():
        raise ConfigError("logits: at least one key must be unmasked")
    if isinstance(tile_size, bool) or not isinstance(tile_size, int) or tile_size < 1:
        raise ConfigError(f"tile_size: expected a positive integer, got {tile_size!r}")
    return s, v


def unscaled(step: TileStep) -> tuple[float, np.ndarray]:
    """(l, acc) in the chapter's convention: sums of e^{s_j} (and e^{s_j} v_j) without the
    running max taken out, i.e. the stored l and acc times e^m. The chapter's Example 31.2
    (weights [4, 2, 1, 1], tiles of two) reads 6 and 10 after the first tile; the stored,
    numerically stable values are 1.5 and 2.5 (scaled by e^-m with m = ln 4)."""
    k = math.exp(step.m)
    return step.l * k, step.acc * k


def online_softmax_steps(logits, values, tile_size: int) -> list[TileStep]:
    """Every intermediate state of the tile-by-tile softmax average."""
    s, v = _check(logits, values, tile_size)
    m, l = -math.inf, 0.0
    acc = np.zeros(v.shape[1:])
    steps = []
    for k, start in enumerate(range(0, len(s), tile_size)):
        stop = min(start + tile_size, len(s))
        st, vt = s[start:stop], v[start:stop]
        tile_max = float(st.max())
        m_new = max(m, tile_max)
        rescale = math.exp(m - m_new) if m > -math.inf else 0.0
        p = np.exp(st - m_new)                        # unnormalised weights at the new max
        tile_sum = float(p.sum())
        l = l * rescale + tile_sum
        acc = acc * rescale + np.tensordot(p, vt, axes=1)
        m = m_new
        tile_out = np.tensordot(p, vt, axes=1) / tile_sum if tile_sum > 0 else np.full(v.shape[1:], np.nan)
        steps.append(TileStep(k, start, stop, tile_max, m, rescale, tile_sum, l, acc.copy(),
                              acc / l, tile_out))
    return steps


def online_softmax(logits, values, tile_size: int) -> float:
    """Softmax-weighted average of scalar `values`, computed tile by tile with a running
    max and sum; equals the full softmax average."""
    return float(online_softmax_steps(logits, values, tile_size)[-1].output)


def full_softmax_average(logits, values) -> np.ndarray:
    s, v = _check(logits, values, 1)
    w = np.exp(s - s.max())
    return np.tensordot(w / w.sum(), v, axes=1)


def average_of_tile_averages(logits, values, tile_size: int) -> float:
    """The WRONG merge: each tile's softmax average, then the plain mean over tiles."""
    return float(np.mean([st.tile_output for st in online_softmax_steps(logits, values, tile_size)], axis=0))


def merge_partials(parts) -> float:
    """Merge (numerator, denominator) tile summaries at a common scale: sum/sum."""
    num = sum(p[0] for p in parts)
    den = sum(p[1] for p in parts)
    return num / den


def mean_of_ratios(parts) -> float:
    """The wrong merge of (numerator, denominator) summaries: mean of num/den."""
    return sum(p[0] / p[1] for p in parts) / len(parts)


# ---- attention matrices ----------------------------------------------------------------

def causal_attention(q, k, v) -> np.ndarray:
    """Reference: softmax(q k^T / sqrt(d) + causal mask) v. q, k, v: [T, d]."""
    q, k, v = (np.asarray(a, dtype=float) for a in (q, k, v))
    T, d = q.shape
    scores = q @ k.T / math.sqrt(d)                        # [T, T]
    scores[np.triu(np.ones((T, T), dtype=bool), 1)] = -np.inf
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v


def tiled_causal_attention(q, k, v, block_q: int, block_k: int) -> tuple[np.ndarray, list[dict]]:
    """The same attention computed FlashAttention-style: for each query tile, visit key
    tiles left to right (skipping tiles fully above the diagonal), keeping per-row (m, l,
    acc). Returns (output [T, d], visit log: one dict per (q_tile, kv_tile) with m, l)."""
    q, k, v = (np.asarray(a, dtype=float) for a in (q, k, v))
    T, d = q.shape
    out = np.empty_like(v)
    visits = []
    for qi, q0 in enumerate(range(0, T, block_q)):
        q1 = min(q0 + block_q, T)
        m = np.full(q1 - q0, -np.inf)
        l = np.zeros(q1 - q0)
        acc = np.zeros((q1 - q0, v.shape[1]))
        rows = np.arange(q0, q1)[:, None]
        for ki, k0 in enumerate(range(0, T, block_k)):
            if k0 > q1 - 1:
                break  # causal: every key in this tile is in the future of every query
            k1 = min(k0 + block_k, T)
            s = q[q0:q1] @ k[k0:k1].T / math.sqrt(d)
            s = np.where(np.arange(k0, k1)[None, :] > rows, -np.inf, s)
            m_new = np.maximum(m, s.max(axis=1))
            scale = np.exp(np.where(np.isfinite(m), m - m_new, -np.inf))
            p = np.exp(s - m_new[:, None])
            l = l * scale + p.sum(axis=1)
            acc = acc * scale[:, None] + p @ v[k0:k1]
            m = m_new
            visits.append({"q_tile": qi, "kv_tile": ki, "m": m.tolist(), "l": l.tolist()})
        out[q0:q1] = acc / l[:, None]
    return out, visits


def cached_attention(q, k, v) -> np.ndarray:
    """Decode-style: position t attends to keys/values 0..t appended to a growing cache,
    one position at a time. Equals causal_attention at every position."""
    q, k, v = (np.asarray(a, dtype=float) for a in (q, k, v))
    T, d = q.shape
    keys, vals, out = [], [], []
    for t in range(T):
        keys.append(k[t]); vals.append(v[t])
        K, V = np.array(keys), np.array(vals)
        s = K @ q[t] / math.sqrt(d)
        w = np.exp(s - s.max())
        out.append((w / w.sum()) @ V)
    return np.array(out)


# ---- memory traffic ----------------------------------------------------------------

def hbm_traffic_bytes(seq_len: int, head_dim: int, dtype_bytes: float = 2, block_q: int = 128,
                      causal: bool = False) -> dict:
    """Rough HBM bytes for one head's forward pass.
    naive: read Q, K, V; write the T x T scores, read them back for softmax, write the
           probabilities, read them for P V; write O.
    tiled: read Q and O once; K and V are re-read once per query tile (T / block_q passes);
           the score matrix never leaves on-chip memory.
    With causal masking each pass touches about half the K/V and score entries."""
    T, d, b = seq_len, head_dim, dtype_bytes
    frac = 0.5 if causal else 1.0
    qkvo = 4 * T * d * b
    scores = T * T * b * frac
    naive = qkvo + 4 * scores           # S written, S read, P written, P read
    passes = math.ceil(T / block_q)
    tiled = 2 * T * d * b + passes * 2 * T * d * b * frac
    return {"naive_bytes": naive, "tiled_bytes": tiled, "score_matrix_bytes": scores,
            "ratio": naive / tiled}


def cached_vs_recomputed(n: int = 7, d: int = 4, seed: int = 124, dtype=np.float32) -> list[dict]:
    """Causal single-head attention over n random tokens of width d, two ways, per position t:
    recomputed from scratch (project the whole prefix 0..t, mask, softmax, take the last row)
    and with a KV cache (project only token t, append its key and value, attend its query to
    the cache). They are the same computation in another order: the difference is rounding
    (~1e-7 in float32, ~1e-16 in float64). A control attends to cached values that are off by
    one (+1): that breaks the identity although every shape matches. Also counts the
    multiply-adds each way (projections + attention), which is what the cache saves."""
    if n < 1 or d < 1:
        raise ConfigError("cached_vs_recomputed: expected n >= 1 tokens of width d >= 1")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(dtype)
    wq, wk, wv = (rng.standard_normal((d, d)).astype(dtype) for _ in range(3))
    scale = dtype(1.0 / math.sqrt(d))

    def softmax(s):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    keys, values, rows = [], [], []
    work_full = work_cached = 0
    for t in range(n):
        prefix = x[: t + 1]
        q, k, v = prefix @ wq, prefix @ wk, prefix @ wv          # recompute: the whole prefix again
        s = (q @ k.T) * scale
        s[np.triu_indices(t + 1, 1)] = -np.inf
        full = (softmax(s) @ v)[-1]
        keys.append(x[t] @ wk)                                   # cached: this token only
        values.append(x[t] @ wv)
        qt = x[t] @ wq
        K, V = np.stack(keys), np.stack(values)
        p = softmax((K @ qt) * scale)
        cached = p @ V
        control = p @ (V + dtype(1.0))
        work_full += 3 * (t + 1) * d * d + 2 * (t + 1) ** 2 * d
        work_cached += 3 * d * d + 2 * (t + 1) * d
        rows.append({"position": t, "max |cached - recomputed|": float(np.abs(cached - full).max()),
                     "control: values + 1": float(np.abs(control - full).max()),
                     "multiply-adds so far, recomputed": work_full, "multiply-adds so far, cached": work_cached})
    return rows


def cache_table() -> list[dict]:
    """cached_vs_recomputed in float32 and float64, one row per position (the tiles page)."""
    rows = []
    for a, b in zip(cached_vs_recomputed(dtype=np.float32), cached_vs_recomputed(dtype=np.float64)):
        rows.append({"position": a["position"], "max |cached − recomputed|, float32": a["max |cached - recomputed|"],
                     "max |cached − recomputed|, float64": b["max |cached - recomputed|"],
                     "control (cached values + 1)": a["control: values + 1"],
                     "multiply-adds so far, recomputed": a["multiply-adds so far, recomputed"],
                     "multiply-adds so far, with a KV cache": a["multiply-adds so far, cached"]})
    return rows
