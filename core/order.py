"""Stable ordering of integer keys (request, block and step ids), fast.

numpy's stable argsort is a radix sort only for keys of 16 bits or less; on int32/int64
keys it is a timsort, 6x slower on the millions of token rows a large trace has. Ids here
are small non-negative integers, so two stable 16-bit passes (low half, then high half:
an LSD radix sort) give the same order.
"""
from __future__ import annotations

import numpy as np


def stable_order(keys) -> np.ndarray:
    """Indices that sort `keys` (1-D integers), equal keys kept in their given order:
    np.argsort(keys, kind="stable"), computed faster for keys in [0, 2^32)."""
    k = np.asarray(keys)
    if k.dtype.kind not in "iu" or not len(k):
        return np.argsort(k, kind="stable")
    lo, hi = int(k.min()), int(k.max())
    if lo < 0 or hi >= 2**32:
        return np.argsort(k, kind="stable")
    if hi < 2**16:
        return np.argsort(k.astype(np.uint16), kind="stable")
    first = np.argsort((k & 0xFFFF).astype(np.uint16), kind="stable")
    return first[np.argsort((k[first] >> 16).astype(np.uint16), kind="stable")]
