"""Streaming decode of a JSON trace (the fast path of core.trace.open): the events list is
decoded a slice at a time with jsoncodec's typed structs, so neither the inflated text nor
all event structs ever exist whole. jsoncodec holds the encoder, the structs and the
whole-document decoder this one falls back to.
"""
from __future__ import annotations

import gzip
import io
import re
import zlib
from itertools import chain
from operator import attrgetter

import msgspec
import numpy as np
import pandas as pd

from core import errors
from core.errors import TraceError
from core.trace.jsoncodec import EVENT_STRUCTS, TOP_DECODER, decode_events, decode_whole, gunzip
from core.trace.jsonscan import squeeze, top_level_commas
from core.trace.model import BadColumn, Trace, frame
from core.trace.schema import BATCH, STEP, TABLE_EVENTS, Field, Record, dtype
from core.trace.validate import Problems, read_events, trace_from_doc

# ---- streaming: the events list decoded a slice at a time -----------------------------------------
#
# The document is read in pieces of STREAM_CHUNK bytes (gzip inflated incrementally, capped
# like errors.gunzip), so that the inflated text and the typed structs never exist whole:
# 1. the header, everything before the top-level key "events" (schema, meta, requests), is
#    decoded as one object; a candidate `"events": [` is proven to be at the top level by
#    the header before it decoding as a complete object;
# 2. the events list is cut after a `},` near the end of the buffer and the slice decoded
#    as a list of typed structs, then turned into column pieces. A cut is trusted only when
#    its slice decodes completely (parsing is deterministic: a slice starting at the top
#    level that decodes as a list ends at the top level); otherwise `top_level_commas`
#    finds the true cut;
# 3. at the end of the input, the rest (last events, `]`, unknown top-level keys) is
#    decoded as an object `{"events":[` + rest.
# Every check of the whole-document decoder is made on the same bytes by the same
# decoders, so the result (or the refusal) is the same. Documents in another layout
# (events before requests, duplicate top-level keys, an escaped "events" key) go to the
# whole-document decoder.

STREAM_CHUNK = 1 << 22          # bytes of JSON text decoded at a time (4 MiB)
_HEADER_TRIES = 16              # candidate `"events": [` checked before giving up on streaming
_EVENTS_KEY = re.compile(rb'"events"[ \t\r\n]*:[ \t\r\n]*\[')
_WS = b" \t\r\n"


class _Refused(Exception):
    """The document is refused (the whole-document decoder would refuse it too)."""


class _TooBig(Exception):
    """gzip inflating beyond the limit (the message of errors.gunzip)."""


class _Whole(Exception):
    """Not in the streaming layout: decode the whole document (`text`: all of it, when read)."""

    def __init__(self, text=None):
        self.text = text


def _pieces(data: bytes, name: str, size: int):
    """The uncompressed input in pieces of at most `size` bytes; gzip is inflated as it is
    read, and more than errors.MAX_DECOMPRESSED_BYTES of it is refused like errors.gunzip."""
    if data[:2] != errors.GZIP_MAGIC:
        with memoryview(data) as mv:
            for i in range(0, len(data), size):
                yield mv[i:i + size]
        return
    limit, total = errors.MAX_DECOMPRESSED_BYTES, 0
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            while piece := f.read(size):
                total += len(piece)
                if total > limit:
                    raise _TooBig(f"{name}: gzip data inflates to more than {errors._size(limit)} "
                                     "(the limit for compressed input)")
                yield piece
    except (OSError, EOFError, zlib.error):
        raise _Refused from None  # errors.gunzip words it on the way to the precise path


class _Column:
    """One column, grown a slice at a time: numpy pieces merged into one array whenever they
    add up to its size (so few, large allocations: no heap left fragmented by thousands of
    small freed pieces), or one list of objects."""

    def __init__(self, f: Field):
        self.numeric = f.type != "str" and f.type != "str?"
        self.dtype = np.int8 if f.type == "enum" else dtype(f)
        self.arr = np.empty(0, self.dtype) if self.numeric else []
        self.pending: list = []
        self.n = 0

    def add(self, piece):
        if not self.numeric:
            self.arr += piece
            return
        self.pending.append(piece)
        self.n += len(piece)
        if self.n * self.arr.itemsize >= max(1 << 20, self.arr.nbytes):
            self.merge()

    def merge(self):
        if self.pending:
            self.arr = np.concatenate([self.arr, *self.pending])
            self.pending, self.n = [], 0

    def result(self):
        self.merge()
        return self.arr


class _Columns:
    """The columns of every table, a slice of events at a time: what `_tables` makes of
    all the events at once (enum columns kept as their category codes until the end)."""

    def __init__(self, index_of: dict):
        self.index_of = index_of
        self.lookup = {**index_of, None: -1}
        self.cols: dict[str, dict[str, _Column]] = {rec.table: {f.name: _Column(f) for f in rec.columns}
                                                    for rec in (*TABLE_EVENTS, BATCH)}
        self.other: list = []

    def _add(self, rec: Record, evs: list) -> dict:
        out = {}
        for f in rec.json_fields:
            if f.type == "batch":
                continue
            vals = map(attrgetter(f.name), evs)
            try:
                if f.type == "req":  # ids -> row positions
                    lookup = self.lookup if f.nullable else self.index_of
                    col = np.fromiter(map(lookup.__getitem__, vals), np.int64, len(evs))
                elif f.type in ("time", "int"):
                    col = np.fromiter(vals, np.float64 if f.type == "time" else np.int64, len(evs))
                elif f.type == "enum":
                    col = _codes(f, list(vals))
                else:
                    col = list(vals)
            except (KeyError, OverflowError):
                raise BadColumn(f) from None
            out[f.name] = col
        for name, col in out.items():  # only once the slice's columns are all made
            self.cols[rec.table][name].add(col)
        return out

    def add(self, events: list, other: list):
        by: dict[type, list] = {cls: [] for cls in EVENT_STRUCTS}
        for e in events:
            by[type(e)].append(e)
        for cls, rec in EVENT_STRUCTS.items():
            if not by[cls]:
                continue
            cols = self._add(rec, by[cls])
            if rec is STEP:
                batches = list(map(attrgetter("batch"), by[cls]))
                self._add(BATCH, list(chain.from_iterable(batches)))
                self.cols["batch"]["step"].add(np.repeat(cols["step"], list(map(len, batches))))
        self.other += other

    def tables(self) -> tuple[dict, list]:
        out, n = {}, len(self.index_of)
        for rec in (*TABLE_EVENTS, BATCH):
            cols = {f.name: self.cols[rec.table].pop(f.name).result() for f in rec.columns}
            for f in rec.columns:
                if f.type == "enum":
                    cols[f.name] = pd.Categorical.from_codes(cols[f.name], categories=list(f.values))
            out[rec.table] = frame(rec, cols, n)
        other = self.other
        if other:  # verbatim events: the precise checks, as in _tables
            pb = Problems("")
            other = read_events(other, self.index_of, pb)[1]
            pb.raise_if_any()
        return out, other


def _codes(f: Field, v: list) -> np.ndarray:
    """An enum column's category codes (-1: not one of the values), as model.frame makes them."""
    code = {x: k for k, x in enumerate(f.values)}
    try:
        return np.fromiter(map(code.__getitem__, v), np.int8, len(v))
    except (KeyError, TypeError):
        return np.fromiter((code.get(x, -1) if isinstance(x, str) else -1 for x in v), np.int8, len(v))


HELD_BEFORE_COUNTING = 64 << 20   # inflated bytes held at once past which a gzip input's total is counted first


class _Reader:
    """The uncompressed text, a piece at a time, into a bytearray buffer. What is held is bounded
    by what the document keeps, not by what it inflates to: once the buffer holds more than
    HELD_BEFORE_COUNTING bytes of a gzip input, the whole input is inflated once more keeping
    nothing, so that one inflating past errors.MAX_DECOMPRESSED_BYTES is refused holding only
    that much; white space padding is squeezed out of the buffer (jsonscan.squeeze) by the
    phases that hold text (`squeeze_before`, `rest`)."""

    def __init__(self, data: bytes, name: str, size: int):
        self.data, self.name, self.size = data, name, size
        self.pieces = _pieces(data, name, size)
        self.buf = bytearray()
        self.eof = False
        self.counted = data[:2] != errors.GZIP_MAGIC   # plain input: its size is held already
        self.squeezed = 0                               # the buffer's length after its last squeeze

    def more(self) -> bool:
        piece = next(self.pieces, None)
        if piece is None:
            self.eof = True
            return False
        self.buf += piece
        if not self.counted and len(self.buf) > HELD_BEFORE_COUNTING:
            self.counted = True
            for _ in _pieces(self.data, self.name, self.size):   # _TooBig past the limit, keeping nothing
                pass
        return True

    def squeeze_before(self, pos: int) -> int:
        """Squeeze buf[:pos] (the buffer starts outside any string) once the buffer has doubled since
        the last squeeze; returns where buf[pos] is now."""
        if len(self.buf) < max(2 * self.squeezed, self.size):
            return pos
        head = squeeze(memoryview(self.buf)[:pos])
        self.buf[:pos] = head
        self.squeezed = len(self.buf)
        return len(head)

    def rest(self) -> bytearray:
        """Everything (the buffer starts outside any string), white space padding squeezed."""
        while self.more():
            self.squeeze_before(len(self.buf))
        return self.buf


def _skip_to_object(rd: _Reader):
    """Read past leading white space (not kept); _Refused unless a JSON object starts there."""
    while not rd.buf.lstrip(_WS) and rd.more():
        rd.buf = rd.buf.lstrip(_WS)  # leading white space, however much, is not kept
    if rd.buf.lstrip(_WS)[:1] != b"{":
        raise _Refused  # not a JSON object (or gzip inside gzip, a BOM, ...): as decode_whole


def _read_for_key(rd: _Reader, pos: int) -> int:
    """No `"events": [` in rd.buf[pos:]: read on; where the next search starts. At the end of the
    input: _Refused (not a serving trace) or _Whole (no plain top-level "events" list)."""
    # the next search starts where an incomplete `"events" :` may begin
    k = rd.buf.rfind(b'"events"', pos)
    pos = k if k >= 0 and not rd.buf[k + 8:].strip(_WS + b":") else max(pos, len(rd.buf) - 8)
    pos = rd.squeeze_before(pos)    # (searched already)
    if not rd.more():
        if b'"schema"' not in rd.buf:
            raise _Refused    # not a serving trace: left unparsed for the other readers
        raise _Whole(rd.buf)  # no (plain) top-level "events" list
    return pos


def _keys_before(buf: bytearray, m: re.Match) -> tuple[dict | None, bytes]:
    """(the top-level keys before the candidate `"events": [` at m, undecoded values; None when the
    text before it is not an object's beginning), the byte before the key."""
    i = m.start() - 1  # the byte before the key
    while i >= 0 and buf[i] in _WS:
        i -= 1
    sep = buf[i:i + 1]
    if sep not in (b",", b"{"):
        return None, sep
    try:
        with memoryview(buf) as mv:
            return TOP_DECODER.decode(b"".join((mv[:i + (sep == b"{")], b"}"))), sep
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None, sep


def _checked_header(rd: _Reader, top: dict, sep: bytes) -> dict:
    """The header's keys decoded, once they are known to be a serving trace's in the streaming layout."""
    if not top and sep == b",":
        raise _Refused  # `{ ,`: not JSON
    if "schema" not in top:
        raise _Refused    # not a serving trace (another tool's document with an "events" key)
    if "events" in top or not {"schema", "meta", "requests"} <= top.keys():
        raise _Whole(rd.rest())  # another layout: the whole-document decoder
    return {k: msgspec.json.decode(v) for k, v in top.items()}


def _header(rd: _Reader) -> tuple[dict, int]:
    """(the top-level keys before "events", decoded; where the events list's text starts)."""
    _skip_to_object(rd)
    pos, tries = 0, 0
    while True:
        m = _EVENTS_KEY.search(rd.buf, pos)
        if m is None:
            pos = _read_for_key(rd, pos)
            continue
        top, sep = _keys_before(rd.buf, m)
        if top is not None:
            return _checked_header(rd, top, sep), m.end()
        tries += 1
        if tries >= _HEADER_TRIES:
            raise _Whole(rd.rest())
        pos = m.start() + 1


def _likely_cut(buf) -> int:
    """The offset of a comma likely between two events (0: none found): before the last
    `{"t_ms":` that follows `}` and `,` (our writer's events start with t_ms), else after
    the last `}`. Only a guess: the caller proves it by decoding."""
    k = len(buf)
    for _ in range(4):
        k = buf.rfind(b'{"t_ms":', 0, k)
        if k <= 0:
            break
        i = k - 1
        while i > 0 and buf[i] in _WS:
            i -= 1
        j = i - 1
        while j > 0 and buf[j] in _WS:
            j -= 1
        if i > 0 and buf[i] == 44 and buf[j] == 125:  # "}" and ","
            return i
    return buf.rfind(b"},") + 1


def _slice(raw) -> tuple[list, list]:
    try:
        return decode_events(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        raise _Refused from None


NO_COMMA_LIMIT = 64 << 20    # bytes of the events list without a top-level comma before the streaming path gives up


def _read_past_padding(rd: _Reader) -> bool:
    """Read until the buffer (starting outside any string) holds more than white space beyond what
    it held; the white space that comes meanwhile is squeezed out, not held. False at the end."""
    held = len(rd.buf)
    while rd.more():
        rd.squeeze_before(len(rd.buf))
        if len(rd.buf) > held + 1:
            return True
    return False


def _decode_before(buf: bytearray, cut: int, cols: _Columns, exact: bool) -> bool:
    """Add the events of buf[:cut] to cols; False when they do not decode as a list (when `exact`,
    the cut is the true one: _Refused)."""
    try:
        with memoryview(buf) as mv:
            raw = b"".join((b"[", mv[:cut], b"]"))
        events, other = _slice(raw) if exact else decode_events(raw)
        del raw
        if not events and not other:
            raise _Refused  # nothing before the comma: not JSON
        cols.add(events, other)
        del events, other
        return True
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return False  # perhaps cut inside a string or an event: find the true cut


def _cut_events(buf: bytearray, cols: _Columns) -> int:
    """Add the events before the last top-level comma of buf to cols; the comma's offset (<= 0:
    no top-level comma in buf yet)."""
    cut, exact = _likely_cut(buf), False
    while True:
        if cut > 0 and _decode_before(buf, cut, cols, exact):
            return cut
        if exact:
            if cut == 0:
                raise _Refused  # a comma first: not JSON
            return cut
        true_cut, _ = top_level_commas(buf)
        if true_cut == cut:
            raise _Refused  # the true cut, and it does not decode
        cut, exact = true_cut, True


def _stream_tail(rd: _Reader, cols: _Columns, cuts: int, doc: dict):
    """The rest of the input: the last events, the end of the list, the top-level keys after it (added to doc)."""
    if cuts and rd.buf.lstrip(_WS)[:1] == b"]":
        raise _Refused  # a comma before the end of the list: not JSON
    with memoryview(rd.buf) as mv:
        tail = b"".join((b'{"events":[', mv))
    rd.buf = bytearray()
    try:
        top = TOP_DECODER.decode(tail)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        raise _Refused from None
    ev = top.pop("events")
    if tail[10:10 + len(ev)] != bytes(ev) or top.keys() & doc.keys():
        raise _Whole  # a top-level key twice: the whole-document decoder resolves it
    cols.add(*_slice(ev))
    del tail, ev
    for k, v in top.items():
        doc[k] = msgspec.json.decode(v)


def _stream_events(rd: _Reader, start: int, chunk: int, index_of: dict, doc: dict) -> tuple[dict, list]:
    """The tables and verbatim events of the events list starting at rd.buf[start:]; the
    top-level keys after the list are added to `doc`."""
    rd.buf = rd.buf[start:]  # a new buffer: the header's text is freed
    rd.squeezed = 0
    cols, cuts = _Columns(index_of), 0
    while True:
        buf = rd.buf
        if len(buf) < chunk and rd.more():
            continue
        if rd.eof:
            break
        cut = _cut_events(buf, cols)
        if cut > 0:
            del buf[:cut + 1]
            cuts += 1
            continue
        if not _read_past_padding(rd):   # no top-level comma yet: read on
            break
        if len(rd.buf) > NO_COMMA_LIMIT:  # megabytes with no event boundary (one huge event): each further
            raise _Refused                # read would rescan them all; the whole-document path reads it
    _stream_tail(rd, cols, cuts, doc)
    return cols.tables()


def decode_fast(data: bytes, name: str, chunk: int = STREAM_CHUNK) -> Trace | None:
    """The trace in `data` (JSON bytes, gzip-compressed or not), or None when the fast path
    refuses it. Streams: the inflated text and the typed events are held a slice of about
    `chunk` bytes at a time. gzip inflating beyond errors.MAX_DECOMPRESSED_BYTES is refused
    (TraceError) as errors.gunzip refuses it; broken gzip is left to errors.gunzip (None)."""
    rd = _Reader(data, name, max(int(chunk), 1))
    try:
        doc, start = _header(rd)
        doc["events"] = []
        return trace_from_doc(doc, name, fast_events=lambda index_of: _stream_events(rd, start, chunk, index_of, doc))
    except (_Refused, TraceError, BadColumn, OverflowError, msgspec.ValidationError, msgspec.DecodeError,
            UnicodeDecodeError, RecursionError):
        return None  # the precise path words the problem (it sees the original events; a byte that is not
        #              UTF-8 in a header value: the byte's offset)
    except _TooBig as e:
        raise TraceError(str(e)) from None
    except _Whole as w:
        text = w.text
    finally:
        rd.pieces.close()
    return decode_whole(text if text is not None else gunzip(data, name), name)
