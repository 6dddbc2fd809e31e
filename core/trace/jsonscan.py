"""JSON text scanned without parsing it, vectorised a block at a time: which bytes are inside
strings, how deeply the text nests, where a list's top-level commas are, and the text with its
white space outside strings squeezed. The streaming decoder (jsonstream.py) cuts and squeezes
its buffer with these; messages about nesting count the depth with them.
"""
from __future__ import annotations

import numpy as np


def _blocks(buf, block: int = 1 << 20):
    """(offset, the block's bytes as uint8, which of them are inside a string) of `buf`, a block at
    a time; `buf` starts outside any string. A string's quote is escaped when an odd run of
    backslashes precedes it; an opening quote counts as inside, a closing one as outside. (Running
    sums in int32 within a block: int64 ones of a bool array are several times slower.)"""
    odd_run, in_str = 0, 0
    for start in range(0, len(buf), block):
        a = np.frombuffer(buf, np.uint8, min(block, len(buf) - start), start)
        quote = a == 34
        bs = a == 92
        if bs.any() or odd_run:
            pos = np.arange(len(a))
            last_other = np.maximum.accumulate(np.where(bs, -1 - odd_run, pos))  # last non-backslash
            q = np.flatnonzero(quote)
            run = q - 1 - np.where(q > 0, last_other[np.maximum(q - 1, 0)], -1 - odd_run)
            quote[q[run % 2 == 1]] = False
            odd_run = int(len(a) - 1 - last_other[-1]) % 2  # the run of backslashes at the end
        if quote.any():
            string = ((np.cumsum(quote, dtype=np.int32) + in_str) & 1).astype(bool)
        else:                        # no quote (white space padding, say): the state goes on
            string = np.full(len(a), bool(in_str))
        in_str = int(string[-1])
        yield start, a, string


def _depth(a, string, depth: int):
    """The nesting depth after each byte of a block (`depth` before it)."""
    steps = (((a == 123) | (a == 91)).astype(np.int8) - ((a == 125) | (a == 93))) * ~string
    if not steps.any():
        return np.full(len(a), depth, np.int64)
    d = np.cumsum(steps, dtype=np.int32)
    return d + np.int64(depth) if depth else d


def top_level_commas(buf, block: int = 1 << 20) -> tuple[int, bool]:
    """(offset of the last comma at the top level of `buf`, or -1; whether the list ends in
    `buf`): `buf` starts inside a list, at its top level, not inside a string. Vectorised, in blocks."""
    last, depth = -1, 0
    for start, a, string in _blocks(buf, block):
        d = _depth(a, string, depth)
        depth = int(d[-1])
        ends = np.flatnonzero(d < 0)
        stop = ends[0] if len(ends) else len(a)
        commas = np.flatnonzero((a[:stop] == 44) & ~string[:stop] & (d[:stop] == 0))
        if len(commas):
            last = start + int(commas[-1])
        if len(ends):
            return last, True
    return last, False


def json_depth(raw) -> int:
    """How deeply the JSON text `raw` nests (objects and lists, outside strings; 0 for a scalar),
    counted without parsing it: for a message when a parser refuses the nesting."""
    depth, deepest = 0, 0
    for _, a, string in _blocks(raw):
        d = _depth(a, string, depth)
        deepest = max(deepest, int(d.max()))
        depth = int(d[-1])
    return deepest


def squeeze(buf) -> bytearray:
    """`buf` (JSON text starting outside any string) with each run of white space outside strings
    cut to its first byte: the same JSON value (or the same refusal: tokens stay apart), a fraction
    of the bytes when the text is padded."""
    out, prev = bytearray(), False
    for _, a, string in _blocks(buf):
        ws = ((a == 32) | (a == 10) | (a == 13) | (a == 9)) & ~string
        keep = ~ws
        keep[1:] |= ~ws[:-1]
        if len(a):
            keep[0] |= not prev
            prev = bool(ws[-1])
        out += a[keep].tobytes()
    return out
