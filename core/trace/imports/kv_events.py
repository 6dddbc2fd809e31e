"""vLLM's KV-cache events (`--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", ...}'`): a ZMQ PUB stream of multipart messages [topic, seq, payload], seq an 8-byte
big-endian batch number, payload a msgpack KVEventBatch [ts (epoch s), [event, ...], dp_rank].
An event is a tagged msgspec struct, encoded as an array whose first item is the tag (or as a
map with a `type` key): BlockStored [block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, ...], BlockRemoved [block_hashes, medium, ...], AllBlocksCleared []. Only full
blocks, by content hash (unsigned 64-bit integers, beyond 2**53; bytes in older releases); no
request ids, no physical block ids, nothing for a cache hit.

`decode_message` turns one multipart message into `kv_event` rows (schema.KV_EVENT: one row per
block); `import_capture` reads a recorded stream: JSON lines {"recv_ns", "frames": [base64, ...]}
as bench/vllm_cpu/record_telemetry.py and `gpu_runner observe --kv-events --raw-out` write them.
"""
from __future__ import annotations

import base64
import binascii

import numpy as np

from core.errors import TraceError, short
from core.trace.imports.imported import Imported
from core.trace.model import Trace, frame
from core.trace.schema import INT_MAX, KV_EVENT, REQUEST

FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                          "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"),
          "BlockRemoved": ("block_hashes", "medium", "group_idx"),
          "AllBlocksCleared": ()}
MAX_ROWS = 50_000_000


def looks_like_capture(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("frames"), list) and "recv_ns" in doc


def block_hash(h, where: str) -> str:
    """A block hash as text: an unsigned 64-bit integer in decimal, bytes in hex."""
    if isinstance(h, bool):
        raise TraceError(f"{where}: a block hash: expected an integer or bytes, got {short(h)}")
    if isinstance(h, int):
        if h < 0:
            h += 1 << 64     # a signed encoding of the same 64 bits
        if not 0 <= h < 1 << 64:
            raise TraceError(f"{where}: a block hash: expected a 64-bit integer, got {short(h)}")
        return str(h)
    if isinstance(h, (bytes, bytearray)):
        return bytes(h).hex()
    raise TraceError(f"{where}: a block hash: expected an integer or bytes, got {short(h)}")


def _event(ev, where: str) -> tuple[str, dict]:
    if isinstance(ev, (list, tuple)) and ev and isinstance(ev[0], str):
        tag = ev[0]
        if tag not in FIELDS:
            raise TraceError(f"{where}: unknown event tag {short(tag)} (expected one of {', '.join(FIELDS)})")
        return tag, dict(zip(FIELDS[tag], ev[1:]))
    if isinstance(ev, dict):
        tag = ev.get("type") or ev.get("tag")
        if not isinstance(tag, str) or tag not in FIELDS:
            raise TraceError(f"{where}: unknown event type {short(tag)} (expected one of {', '.join(FIELDS)})")
        return tag, ev
    raise TraceError(f"{where}: an event: expected a tagged array or map, got {short(ev)}")


def _batch(payload: bytes, where: str) -> list:
    """The payload's KVEventBatch as [ts, [events], dp_rank, ...], checked."""
    import msgspec
    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as e:
        raise TraceError(f"{where}: payload: not msgpack ({e})") from None
    if isinstance(batch, dict):
        batch = [batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank")]
    if not (isinstance(batch, list) and len(batch) >= 2 and isinstance(batch[0], (int, float))
            and not isinstance(batch[0], bool) and isinstance(batch[1], list)):
        raise TraceError(f"{where}: payload: expected a KVEventBatch [ts, [events], dp_rank], got {short(batch)}")
    return batch


def _add_stored(f: dict, hashes: list, at: str, ts: float, seq: int, medium: str | None, rows: list):
    """A BlockStored event's rows, one per block (`at`: where the event is)."""
    parent = f.get("parent_block_hash")
    parent = None if parent is None else block_hash(parent, at)
    size = f.get("block_size")
    size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0
    if size > INT_MAX:
        raise TraceError(f"{at} (BlockStored): block_size: expected tokens per block, got {short(size)}")
    for h in hashes:       # a chain: each block's parent is the one before it
        hh = block_hash(h, at)
        rows.append((ts, "stored", hh, parent, size, seq, medium))
        parent = hh


def decode_payload(payload: bytes, seq: int, where: str, rows: list) -> float:
    """Append the rows of one KVEventBatch payload (msgpack) to `rows` as tuples (ts_s, op, hash,
    parent, tokens, seq, medium); returns the batch's timestamp (epoch s)."""
    batch = _batch(payload, where)
    ts = float(batch[0])
    for k, ev in enumerate(batch[1]):
        tag, f = _event(ev, f"{where}: event {k}")
        medium = f.get("medium") if isinstance(f.get("medium"), str) else None
        if tag == "AllBlocksCleared":
            rows.append((ts, "cleared", None, None, 0, seq, medium))
            continue
        hashes = f.get("block_hashes")
        if not isinstance(hashes, list):
            raise TraceError(f"{where}: event {k} ({tag}): block_hashes: expected a list, got {short(hashes)}")
        if tag == "BlockRemoved":
            rows.extend((ts, "removed", block_hash(h, f"{where}: event {k}"), None, 0, seq, medium) for h in hashes)
            continue
        _add_stored(f, hashes, f"{where}: event {k}", ts, seq, medium, rows)
        if len(rows) > MAX_ROWS:
            raise TraceError(f"{where}: more than {MAX_ROWS:,} KV event rows")
    return ts


def decode_message(frames: list[bytes], where: str, rows: list) -> float:
    """One multipart message [topic, seq, payload] (or [seq, payload] without a topic)."""
    if len(frames) == 3:
        _, seq_b, payload = frames
    elif len(frames) == 2:
        seq_b, payload = frames
    else:
        raise TraceError(f"{where}: expected 3 frames (topic, seq, payload), got {len(frames)}")
    if len(seq_b) != 8:
        raise TraceError(f"{where}: seq: expected 8 bytes (big-endian), got {len(seq_b)}")
    seq = int.from_bytes(seq_b, "big")
    if seq > INT_MAX:        # vLLM numbers batches from 0; the kv_event table keeps them as int64
        raise TraceError(f"{where}: seq: expected a batch number in 0..2**63-1, got {seq}")
    return decode_payload(payload, seq, where, rows)


def kv_event_frame(rows: list, t0_s: float):
    """The kv_events table of rows from decode_payload, times in ms from t0_s."""
    cols = list(zip(*rows)) if rows else [[]] * 7
    return frame(KV_EVENT, {"t_ms": np.maximum((np.asarray(cols[0], dtype=float) - t0_s) * 1000.0, 0.0),
                            "op": list(cols[1]), "hash": list(cols[2]), "parent": list(cols[3]),
                            "tokens": np.asarray(cols[4], dtype=np.int64), "seq": np.asarray(cols[5], dtype=np.int64),
                            "medium": list(cols[6])}, n_requests=0)


def import_capture(lines: list, name: str) -> Imported:
    rows, gaps, last_seq = [], 0, None
    for k, ln in enumerate(lines):
        where = f"{name}: line {k + 1}"
        if not looks_like_capture(ln):
            raise TraceError(f"{where}: expected {{recv_ns, frames}}, got {short(ln)}")
        try:
            frames = [base64.b64decode(f, validate=True) for f in ln["frames"]]
        except (binascii.Error, TypeError, ValueError):
            raise TraceError(f"{where}: frames: expected base64 strings") from None
        decode_message(frames, where, rows)
        seq = int.from_bytes(frames[-2], "big")
        if last_seq is not None and seq != last_seq + 1:
            gaps += 1
        last_seq = seq
    return kv_import(rows, name, gaps, len(lines))


def kv_import(rows: list, name: str, gaps: int, messages: int) -> Imported:
    t0 = min((r[0] for r in rows), default=0.0)
    table = kv_event_frame(rows, t0)
    ops = table["op"].astype(str)
    summary = {"event_batches": messages, "stored_blocks": int((ops == "stored").sum()),
               "removed_blocks": int((ops == "removed").sum()), "cleared": int((ops == "cleared").sum())}
    notes = [f"{messages:,} event batches from vLLM's KV-event stream: {summary['stored_blocks']:,} blocks stored, "
             f"{summary['removed_blocks']:,} removed, {summary['cleared']} clear(s). No request ids (the engine "
             "publishes content hashes only) and no event for a cache hit."]
    if gaps:
        notes.append(f"{gaps} gap(s) in the batch sequence numbers: the recorder missed batches (a slow subscriber "
                     "or a restart); counts cover what was received.")
    meta = {"source": "imported", "label": f"{name} (vLLM KV events)", "created": "unknown",
            "engine": {"name": "vllm"}, "device": "not recorded in the events", "notes": " ".join(notes),
            "clock": {"kind": "epoch", "t0_s": t0, "resolution_ms": 1e-3,
                      "how": "the event batches' ts (the engine's time.time() when it published them)"},
            "provenance": {"kv_events": "engine: vLLM KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared)"}}
    tr = Trace(meta=meta, requests=frame(REQUEST, {f.name: [] for f in REQUEST.columns}), kv_events=table)
    return Imported(tr, "vllm", summary, notes=notes, tool="vLLM", what="KV-cache events", origin=meta["provenance"])
