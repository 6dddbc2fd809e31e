"""The `serving-trace/1` format: the contract between the simulator, the runner, importers
and the pages. See docs/trace-format.md and data/schema/serving-trace-1.json.

In memory a trace is columnar (pandas DataFrames per event type, request index codes
instead of ids) so that million-event traces load and aggregate quickly; on disk it is
one JSON document (optionally gzip-compressed) with an `events` list.
"""
from __future__ import annotations

import gc
import gzip
import json
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.errors import TraceError, read_input_file, short
from core.paging import KV_OPS
from core.workload import Request, Workload, decode_bytes

SCHEMA = "serving-trace/1"
SOURCES = ("given", "simulated", "measured", "imported")
TOKEN_SOURCES = ("sampled", "accepted", "recovered", "bonus")
KINDS = ("decode", "prefill")  # batch entry kinds (category order: code 1 = prefill)
REQUEST_FIELDS = ("id", "arrival_ms", "prompt_tokens", "max_output_tokens", "tenant")
# Event types whose rows live in DataFrames; any other type is kept verbatim in `other`.
TABLE_TYPES = ("token", "finish", "step", "kv", "preempt")
MAX_REPORTED = 1  # problems spelled out; the rest are counted


def _empty(cols: dict) -> pd.DataFrame:
    return pd.DataFrame(copy=False, data={c: pd.Series(dtype=t) for c, t in cols.items()})


TOKEN_COLS = {"req": "int64", "index": "int64", "t_ms": "float64", "source": "object", "token_id": "int64"}
FINISH_COLS = {"req": "int64", "t_ms": "float64", "reason": "object"}
STEP_COLS = {"step": "int64", "t_ms": "float64", "dur_ms": "float64", "running": "int64",
             "waiting": "int64", "kv_used_blocks": "int64", "kv_free_blocks": "int64"}
BATCH_COLS = {"step": "int64", "req": "int64", "kind": "object", "tokens": "int64"}
KV_COLS = {"t_ms": "float64", "op": "object", "req": "int64", "block": "int64", "logical": "int64",
           "ref": "int64", "hash": "object", "src": "int64"}
PREEMPT_COLS = {"t_ms": "float64", "req": "int64", "reason": "object", "freed_blocks": "int64"}


@dataclass
class Trace:
    meta: dict
    requests: pd.DataFrame                # id, arrival_ms, prompt_tokens, max_output_tokens, tenant
    tokens: pd.DataFrame = field(default_factory=lambda: _empty(TOKEN_COLS))
    finishes: pd.DataFrame = field(default_factory=lambda: _empty(FINISH_COLS))
    steps: pd.DataFrame = field(default_factory=lambda: _empty(STEP_COLS))
    batch: pd.DataFrame = field(default_factory=lambda: _empty(BATCH_COLS))  # one row per (step, req)
    kv: pd.DataFrame = field(default_factory=lambda: _empty(KV_COLS))
    preempts: pd.DataFrame = field(default_factory=lambda: _empty(PREEMPT_COLS))
    other: list = field(default_factory=list)          # spec, tiles, unknown events, verbatim
    request_extra: list = field(default_factory=list)  # per request: unknown fields, verbatim
    extra: dict = field(default_factory=dict)          # unknown top-level fields, verbatim

    @property
    def ids(self) -> list[str]:
        return self.requests["id"].tolist()

    @property
    def source(self) -> str:
        return self.meta.get("source", "")

    @property
    def label(self) -> str:
        return self.meta.get("label") or self.source

    def event_types(self) -> set[str]:
        present = {name for name, df in (("token", self.tokens), ("finish", self.finishes),
                                         ("step", self.steps), ("kv", self.kv),
                                         ("preempt", self.preempts)) if len(df)}
        return present | {e.get("type") for e in self.other}

    def workload(self) -> Workload:
        reqs = []
        for i, row in enumerate(self.requests.itertuples(index=False)):
            extra = self.request_extra[i] if i < len(self.request_extra) else {}
            ids = extra.get("prompt_ids")
            reqs.append(Request(
                id=row.id, arrival_ms=float(row.arrival_ms), prompt_tokens=int(row.prompt_tokens),
                output_tokens=int(row.max_output_tokens),
                prompt_ids=tuple(ids) if isinstance(ids, list) and len(ids) == row.prompt_tokens else None,
                tenant=row.tenant if isinstance(row.tenant, str) else None,
                abort_at_ms=extra.get("abort_at_ms")))
        return Workload(reqs, name=self.meta.get("label") or "trace workload")

    # ---- to the JSON form ----------------------------------------------------------
    def to_doc(self) -> dict:
        ids = np.array(self.ids, dtype=object)
        req_docs = []
        for i, row in enumerate(self.requests.itertuples(index=False)):
            d = {"id": row.id, "arrival_ms": float(row.arrival_ms), "prompt_tokens": int(row.prompt_tokens),
                 "max_output_tokens": int(row.max_output_tokens)}
            if isinstance(row.tenant, str):
                d["tenant"] = row.tenant
            if i < len(self.request_extra):
                d.update(self.request_extra[i])
            req_docs.append(d)
        parts: list[tuple[np.ndarray, int, list[dict]]] = []  # (times, type order, events)

        tk = self.tokens
        if len(tk):
            has_id = tk["token_id"].to_numpy() >= 0
            evs = [{"t_ms": t, "type": "token", "req": r, "index": k, "source": s}
                   for t, r, k, s in zip(tk["t_ms"].tolist(), ids[tk["req"].to_numpy()].tolist(),
                                         tk["index"].tolist(), tk["source"].tolist())]
            if has_id.any():
                for e, tid, h in zip(evs, tk["token_id"].tolist(), has_id.tolist()):
                    if h:
                        e["token_id"] = tid
            parts.append((tk["t_ms"].to_numpy(), 2, evs))
        fn = self.finishes
        if len(fn):
            evs = [{"t_ms": t, "type": "finish", "req": r, "reason": s}
                   for t, r, s in zip(fn["t_ms"].tolist(), ids[fn["req"].to_numpy()].tolist(),
                                      fn["reason"].tolist())]
            parts.append((fn["t_ms"].to_numpy(), 3, evs))
        st = self.steps
        if len(st):
            b = self.batch
            by_step: dict[int, list] = {}
            for s, r, kd, n in zip(b["step"].tolist(), ids[b["req"].to_numpy()].tolist(),
                                   b["kind"].tolist(), b["tokens"].tolist()):
                by_step.setdefault(s, []).append({"req": r, "kind": kd, "tokens": n})
            evs = [{"t_ms": t, "type": "step", "step": s, "dur_ms": d, "batch": by_step.get(s, []),
                    "running": ru, "waiting": wa, "kv_used_blocks": u, "kv_free_blocks": f}
                   for s, t, d, ru, wa, u, f in zip(*(st[c].tolist() for c in STEP_COLS))]
            parts.append((st["t_ms"].to_numpy(), 1, evs))
        kv = self.kv
        if len(kv):
            req_ids = np.where(kv["req"].to_numpy() >= 0, ids[np.maximum(kv["req"].to_numpy(), 0)], None) \
                if len(ids) else np.full(len(kv), None)
            evs = []
            for t, op, r, blk, lg, ref, h, src in zip(kv["t_ms"].tolist(), kv["op"].tolist(), req_ids.tolist(),
                                                     kv["block"].tolist(), kv["logical"].tolist(),
                                                     kv["ref"].tolist(), kv["hash"].tolist(), kv["src"].tolist()):
                e = {"t_ms": t, "type": "kv", "op": op, "req": r, "block": blk, "logical": lg, "ref": ref}
                if h is not None:
                    e["hash"] = h
                if src >= 0:
                    e["src"] = src
                evs.append(e)
            parts.append((kv["t_ms"].to_numpy(), 0, evs))
        pr = self.preempts
        if len(pr):
            evs = [{"t_ms": t, "type": "preempt", "req": r, "reason": s, "freed_blocks": f}
                   for t, r, s, f in zip(pr["t_ms"].tolist(), ids[pr["req"].to_numpy()].tolist(),
                                         pr["reason"].tolist(), pr["freed_blocks"].tolist())]
            parts.append((pr["t_ms"].to_numpy(), 0, evs))
        if self.other:
            parts.append((np.array([e.get("t_ms", 0.0) for e in self.other], dtype=float), 4, list(self.other)))
        events: list = []
        if parts:
            times = np.concatenate([p[0] for p in parts])
            order_key = np.concatenate([np.full(len(p[2]), p[1]) for p in parts])
            flat = [e for p in parts for e in p[2]]
            order = np.lexsort((order_key, times))  # by time; at equal times kv, step, token, finish
            events = [flat[i] for i in order.tolist()]
        doc = {"schema": SCHEMA, "meta": self.meta, "requests": req_docs, "events": events}
        doc.update(self.extra)
        return doc

    def dumps(self, pretty: bool = False) -> str:
        doc = self.to_doc()
        if not pretty:
            return json.dumps(doc, separators=(",", ":"), allow_nan=False)
        # Readable and diff-friendly: one request / one event per line.
        head = {k: v for k, v in doc.items() if k not in ("requests", "events")}
        lines = ["{"]
        for k, v in head.items():
            lines.append(f" {json.dumps(k)}: {json.dumps(v, allow_nan=False)},")
        for key in ("requests", "events"):
            items = doc[key]
            lines.append(f' "{key}": [')
            lines += [f"  {json.dumps(x, allow_nan=False)}{',' if i < len(items) - 1 else ''}"
                      for i, x in enumerate(items)]
            lines.append(" ]," if key == "requests" else " ]")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path, pretty: bool = False):
        """.json, .json.gz, or .parquet (the columnar form), by the file name."""
        p = Path(path)
        if p.name.endswith(".parquet"):
            p.write_bytes(to_parquet_bytes(self))
            return
        data = self.dumps(pretty and not p.name.endswith(".gz")).encode()
        if p.name.endswith(".gz"):
            data = gzip.compress(data, compresslevel=6, mtime=0)  # reproducible bytes
        p.write_bytes(data)


# ---- loading and validation --------------------------------------------------------

class _Problems:
    """Collects validation problems; raises one TraceError naming the first."""

    def __init__(self, name: str):
        self.name = name
        self.items: list[tuple[float, str]] = []

    def add(self, order: float, msg: str):
        self.items.append((order, msg))

    def raise_if_any(self):
        if not self.items:
            return
        self.items.sort(key=lambda x: x[0])
        first = self.items[0][1]
        more = len(self.items) - 1
        tail = f" (and {more} more problem{'s' if more != 1 else ''})" if more else ""
        raise TraceError(f"{self.name}: {first}{tail}")


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


def _ok_time(v) -> bool:
    try:
        return _is_num(v) and math.isfinite(v) and v >= 0
    except OverflowError:  # an integer too large for a float
        return False


def parse_json_bytes(data: bytes | str, name: str, error=TraceError) -> Any:
    """Parse JSON (gzip-compressed or not). orjson when installed (several times faster);
    any failure is re-parsed by the standard library to word the error precisely."""
    if isinstance(data, bytes):
        raw = data
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as e:
                raise error(f"{name}: broken gzip data ({e})") from None
        try:
            import orjson
            return orjson.loads(raw)
        except ImportError:
            pass
        except orjson.JSONDecodeError:
            pass
        data = raw
    text = decode_bytes(data, name, error) if isinstance(data, bytes) else data
    if not text.strip():
        raise error(f"{name}: the file is empty")
    try:
        return json.loads(text, parse_constant=lambda c: _bad_constant(c, name, error))
    except json.JSONDecodeError as e:
        raise error(f"{name}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise error(f"{name}: JSON nested too deeply") from None


def _bad_constant(c, name, error):
    raise error(f"{name}: {c} is not allowed (JSON numbers must be finite)")


def load_trace(path: str | Path) -> Trace:
    return parse_trace(read_input_file(path, "trace", TraceError), Path(path).name)


def parse_trace(data: bytes | str, name: str = "trace") -> Trace:
    """JSON, gzip-compressed JSON, or the Parquet form, detected from the bytes."""
    with no_gc():
        if isinstance(data, bytes) and is_parquet(data):
            return trace_from_parquet(data, name)
        if isinstance(data, bytes):
            tr = _typed_parse(data, name)
            if tr is not None:
                return tr
        return trace_from_doc(parse_json_bytes(data, name), name)


class no_gc:
    """Pause the cyclic garbage collector: parsing a million small acyclic objects would
    otherwise trigger many full collections (seconds) for nothing."""

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()


def trace_from_doc(doc: Any, name: str = "trace", event_columns=None) -> Trace:
    """Validate a decoded document and build the Trace. `event_columns` (from the typed
    fast decoder) replaces reading doc["events"] when given."""
    if not isinstance(doc, dict):
        raise TraceError(f"{name}: expected a JSON object at the top level, got {type(doc).__name__}")
    schema = doc.get("schema")
    if schema is None:
        raise TraceError(f"{name}: schema: missing (expected {SCHEMA!r})")
    if schema != SCHEMA:
        raise TraceError(f"{name}: schema: unknown version {schema!r}; this build reads {SCHEMA!r}")
    meta = doc.get("meta")
    if not isinstance(meta, dict):
        raise TraceError(f"{name}: meta: expected an object with at least 'source'")
    if meta.get("source") not in SOURCES:
        raise TraceError(f"{name}: meta.source: expected one of {', '.join(SOURCES)}, got {short(meta.get('source'))}")
    reqs = doc.get("requests")
    if not isinstance(reqs, list):
        raise TraceError(f"{name}: requests: expected a list")
    events = doc.get("events")
    if event_columns is None and not isinstance(events, list):
        raise TraceError(f"{name}: events: expected a list")
    pb = _Problems(name)

    # Requests.
    ids, arrival, prompt, max_out, tenant, extras = [], [], [], [], [], []
    index_of: dict[str, int] = {}
    for i, r in enumerate(reqs):
        at = f"requests[{i}]"
        if not isinstance(r, dict):
            pb.add(-1e18 + i, f"{at}: expected an object"); continue
        rid = r.get("id")
        if _is_int(rid):
            rid = str(int(rid))
        if not isinstance(rid, str) or not rid:
            pb.add(-1e18 + i, f"{at}.id: expected a non-empty string, got {short(rid)}"); continue
        if rid in index_of:
            pb.add(-1e18 + i, f"{at}.id: duplicate request id {rid!r}"); continue
        bad = None
        if not _ok_time(r.get("arrival_ms")):
            bad = f"{at}.arrival_ms: expected a finite number >= 0, got {short(r.get('arrival_ms'))}"
        elif not (_is_int(r.get("prompt_tokens")) and r["prompt_tokens"] >= 0):
            bad = f"{at}.prompt_tokens: expected an integer >= 0, got {short(r.get('prompt_tokens'))}"
        elif not (_is_int(r.get("max_output_tokens")) and r["max_output_tokens"] >= 1):
            bad = f"{at}.max_output_tokens: expected an integer >= 1, got {short(r.get('max_output_tokens'))}"
        elif r.get("tenant") is not None and not isinstance(r.get("tenant"), str):
            bad = f"{at}.tenant: expected a string or null, got {short(r.get('tenant'))}"
        if bad:
            pb.add(-1e18 + i, bad); continue
        index_of[rid] = len(ids)
        ids.append(rid)
        arrival.append(float(r["arrival_ms"]))
        prompt.append(int(r["prompt_tokens"]))
        max_out.append(int(r["max_output_tokens"]))
        tenant.append(r.get("tenant"))
        extras.append({k: v for k, v in r.items() if k not in REQUEST_FIELDS})
    pb.raise_if_any()

    cols = event_columns(index_of) if event_columns is not None else _fast_event_columns(events, index_of)
    if cols is None and event_columns is not None:
        return None  # the typed fast path found an anomaly: the caller re-parses generically
    if cols is None:  # something is off: the precise per-event pass names the problem
        cols = _slow_event_columns(events, index_of, pb)
        pb.raise_if_any()
    tok, fin, stp, bat, kvc, pre, other = cols

    requests = pd.DataFrame(copy=False, data={"id": pd.Series(ids, dtype=object), "arrival_ms": np.array(arrival, dtype=float),
                             "prompt_tokens": np.array(prompt, dtype=np.int64),
                             "max_output_tokens": np.array(max_out, dtype=np.int64),
                             "tenant": pd.Series(tenant, dtype=object)})
    tokens = pd.DataFrame(copy=False, data={"req": np.array(tok[0], dtype=np.int64), "index": np.array(tok[1], dtype=np.int64),
                           "t_ms": np.array(tok[2], dtype=float),
                           "source": pd.Categorical(tok[3], categories=TOKEN_SOURCES),
                           "token_id": np.array(tok[4], dtype=np.int64)})
    finishes = pd.DataFrame(copy=False, data={"req": np.array(fin[0], dtype=np.int64), "t_ms": np.array(fin[1], dtype=float),
                             "reason": pd.Series(fin[2], dtype=object)})
    steps = pd.DataFrame(copy=False, data={c: np.array(v, dtype=STEP_COLS[c]) for c, v in zip(STEP_COLS, stp)})
    batch = pd.DataFrame(copy=False, data={"step": np.array(bat[0], dtype=np.int64), "req": np.array(bat[1], dtype=np.int64),
                          "kind": pd.Categorical(bat[2], categories=KINDS),
                          "tokens": np.array(bat[3], dtype=np.int64)})
    kv = pd.DataFrame(copy=False, data={c: (pd.Series(v, dtype=object) if KV_COLS[c] == "object" else np.array(v, dtype=KV_COLS[c]))
                       for c, v in zip(KV_COLS, kvc)})
    kv["op"] = pd.Categorical(kvc[1], categories=KV_OPS)
    preempts = pd.DataFrame(copy=False, data={"t_ms": np.array(pre[0], dtype=float), "req": np.array(pre[1], dtype=np.int64),
                             "reason": pd.Series(pre[2], dtype=object),
                             "freed_blocks": np.array(pre[3], dtype=np.int64)})
    _check_consistency(pb, requests, tokens, np.array(tok[5], dtype=np.int64),
                       finishes, np.array(fin[3], dtype=np.int64))
    pb.raise_if_any()
    extra = {k: v for k, v in doc.items() if k not in ("schema", "meta", "requests", "events")}
    return Trace(meta=meta, requests=requests, tokens=tokens, finishes=finishes, steps=steps, batch=batch,
                 kv=kv, preempts=preempts, other=other, request_extra=extras, extra=extra)


def _slow_event_columns(events, index_of, pb):
    """Event fields checked one by one, every problem recorded with its event index."""
    # Events: split by type, checking each row's fields.
    tok = ([], [], [], [], [], [])      # req, index, t, source, token_id, position
    fin = ([], [], [], [])              # req, t, reason, position
    stp = ([], [], [], [], [], [], [])  # step, t, dur, running, waiting, used, free
    bat = ([], [], [], [])              # step, req, kind, tokens
    kvc = ([], [], [], [], [], [], [], [])
    pre = ([], [], [], [])
    other = []

    def req_of(e, i, typ, required=True):
        r = e.get("req")
        if r is None and not required:
            return -1
        if _is_int(r) and not isinstance(r, str):
            r = str(int(r))
        j = index_of.get(r) if isinstance(r, str) else None
        if j is None:
            pb.add(i, f"events[{i}] ({typ}): req {r!r} is not in requests")
        return j

    for i, e in enumerate(events):
        if not isinstance(e, dict):
            pb.add(i, f"events[{i}]: expected an object"); continue
        typ = e.get("type")
        if not isinstance(typ, str):
            pb.add(i, f"events[{i}].type: expected a string, got {short(typ)}"); continue
        t = e.get("t_ms")
        if not _ok_time(t):
            pb.add(i, f"events[{i}] ({typ}).t_ms: expected a finite number >= 0, got {short(t)}"); continue
        if typ == "token":
            j = req_of(e, i, typ)
            k = e.get("index")
            if not (_is_int(k) and k >= 0):
                pb.add(i, f"events[{i}] (token).index: expected an integer >= 0, got {short(k)}"); continue
            src = e.get("source", "sampled")
            if src not in TOKEN_SOURCES:
                pb.add(i, f"events[{i}] (token).source: expected one of {', '.join(TOKEN_SOURCES)}, got {short(src)}")
                continue
            tid = e.get("token_id", -1)
            if not (_is_int(tid) and tid >= -1):
                pb.add(i, f"events[{i}] (token).token_id: expected an integer >= 0, got {short(tid)}"); continue
            if j is None:
                continue
            tok[0].append(j); tok[1].append(int(k)); tok[2].append(float(t)); tok[3].append(src)
            tok[4].append(int(tid)); tok[5].append(i)
        elif typ == "finish":
            j = req_of(e, i, typ)
            reason = e.get("reason", "length")
            if not isinstance(reason, str):
                pb.add(i, f"events[{i}] (finish).reason: expected a string, got {short(reason)}"); continue
            if j is None:
                continue
            fin[0].append(j); fin[1].append(float(t)); fin[2].append(reason); fin[3].append(i)
        elif typ == "step":
            s = e.get("step", len(stp[0]))
            d = e.get("dur_ms", 0.0)
            if not _is_int(s) or s < 0:
                pb.add(i, f"events[{i}] (step).step: expected an integer >= 0, got {short(s)}"); continue
            if not _ok_time(d):
                pb.add(i, f"events[{i}] (step).dur_ms: expected a finite number >= 0, got {short(d)}"); continue
            counts = []
            for f_ in ("running", "waiting", "kv_used_blocks", "kv_free_blocks"):
                v = e.get(f_, -1)
                if not (_is_int(v) and v >= -1):
                    pb.add(i, f"events[{i}] (step).{f_}: expected an integer >= 0, got {short(v)}"); break
                counts.append(int(v))
            else:
                b = e.get("batch", [])
                if not isinstance(b, list):
                    pb.add(i, f"events[{i}] (step).batch: expected a list"); continue
                ok = True
                rows = []
                for k_, item in enumerate(b):
                    if not isinstance(item, dict):
                        pb.add(i, f"events[{i}] (step).batch[{k_}]: expected an object"); ok = False; break
                    j = req_of(item, i, "step")
                    kind = item.get("kind")
                    n = item.get("tokens")
                    if kind not in ("prefill", "decode"):
                        pb.add(i, f"events[{i}] (step).batch[{k_}].kind: expected prefill or decode, got {short(kind)}")
                        ok = False; break
                    if not (_is_int(n) and n >= 1):
                        pb.add(i, f"events[{i}] (step).batch[{k_}].tokens: expected an integer >= 1, got {short(n)}")
                        ok = False; break
                    if j is None:
                        ok = False; break
                    rows.append((j, kind, int(n)))
                if not ok:
                    continue
                stp[0].append(int(s)); stp[1].append(float(t)); stp[2].append(float(d))
                for col, v in zip(stp[3:], counts):
                    col.append(v)
                for j, kind, n in rows:
                    bat[0].append(int(s)); bat[1].append(j); bat[2].append(kind); bat[3].append(n)
        elif typ == "kv":
            op = e.get("op")
            if op not in KV_OPS:
                pb.add(i, f"events[{i}] (kv).op: expected one of {', '.join(KV_OPS)}, got {short(op)}"); continue
            j = req_of(e, i, typ, required=False)
            blk = e.get("block")
            if not (_is_int(blk) and blk >= 0):
                pb.add(i, f"events[{i}] (kv).block: expected an integer >= 0, got {short(blk)}"); continue
            lg, ref, src = e.get("logical", -1), e.get("ref", 0), e.get("src", -1)
            if not (_is_int(lg) and _is_int(ref) and _is_int(src)):
                pb.add(i, f"events[{i}] (kv): logical, ref and src must be integers"); continue
            h = e.get("hash")
            if j is None:
                continue
            kvc[0].append(float(t)); kvc[1].append(op); kvc[2].append(j); kvc[3].append(int(blk))
            kvc[4].append(int(lg)); kvc[5].append(int(ref)); kvc[6].append(h if isinstance(h, str) else None)
            kvc[7].append(int(src))
        elif typ == "preempt":
            j = req_of(e, i, typ)
            fb = e.get("freed_blocks", 0)
            if not (_is_int(fb) and fb >= 0):
                pb.add(i, f"events[{i}] (preempt).freed_blocks: expected an integer >= 0, got {short(fb)}"); continue
            if j is None:
                continue
            pre[0].append(float(t)); pre[1].append(j); pre[2].append(str(e.get("reason", "kv_full")))
            pre[3].append(int(fb))
        else:
            if typ in ("spec", "tiles") and "req" in e and e["req"] is not None:
                req_of(e, i, typ)
            other.append(e)
    return tok, fin, stp, bat, kvc, pre, other


_NUM = {int, float}


def _fast_event_columns(events, index_of):
    """The same columns as _slow_event_columns, built with whole-column checks. Returns None
    at the first anomaly of any kind, so that the slow pass can report it precisely."""
    try:
        types = [e["type"] for e in events]
    except (KeyError, TypeError):
        return None
    if set(map(type, types)) - {str}:
        return None
    codes, uniques = pd.factorize(pd.Series(types, dtype=object), use_na_sentinel=True)
    if (codes < 0).any() or not all(type(u) is str for u in uniques):
        return None
    by = {u: np.flatnonzero(codes == k) for k, u in enumerate(uniques)}

    def get(idx):
        if len(idx) == 0:
            return []
        if len(idx) == 1:
            return [events[int(idx[0])]]
        return list(operator.itemgetter(*idx.tolist())(events))

    def fields(ev, *keys):
        """Columns for required keys in one C-level pass (KeyError if any is missing)."""
        if not ev:
            return [[] for _ in keys]
        rows = list(map(operator.itemgetter(*keys), ev))
        return [list(c) for c in zip(*rows)] if len(keys) > 1 else [rows]

    def optional(ev, key, default):
        return [e.get(key, default) for e in ev] if any(key in e for e in ev) else [default] * len(ev)

    def times(ev, t=None):
        t = [e["t_ms"] for e in ev] if t is None else t
        if not set(map(type, t)) <= _NUM:
            raise KeyError
        a = np.array(t, dtype=float)
        if not (np.isfinite(a).all() and (a >= 0).all()):
            raise KeyError
        return a

    def ints(vals, lo):
        if vals and not set(map(type, vals)) <= {int}:
            raise KeyError
        a = np.array(vals, dtype=np.int64)
        if (a < lo).any():
            raise KeyError
        return a

    id_index = pd.Index(list(index_of), dtype=object)

    def reqs(vals, allow_none=False):
        out = id_index.get_indexer(pd.Index(vals, dtype=object)).astype(np.int64)  # -1: unknown / not a str
        if (out < 0).any():
            if not allow_none:
                raise KeyError
            missing = out < 0
            if any(vals[i] is not None for i in np.flatnonzero(missing).tolist()):
                raise KeyError
        return out

    def strs(vals, allowed=None):
        if allowed is not None:  # a categorical: codes into `allowed`, -1 for anything else
            codes = pd.Index(allowed, dtype=object).get_indexer(pd.Index(vals, dtype=object))
            if (codes < 0).any():
                raise KeyError
            return pd.Categorical.from_codes(codes, categories=allowed)
        if vals and not set(map(type, vals)) <= {str}:
            raise KeyError
        return vals

    try:
        ev = get(by.get("token", np.empty(0, int)))
        r_, k_, t_ = fields(ev, "req", "index", "t_ms")
        tok = (reqs(r_), ints(k_, 0), times(ev, t_), strs(optional(ev, "source", "sampled"), TOKEN_SOURCES),
               ints(optional(ev, "token_id", -1), -1), by.get("token", np.empty(0, int)))
        ev = get(by.get("finish", np.empty(0, int)))
        fin = (reqs([e["req"] for e in ev]), times(ev), strs([e.get("reason", "length") for e in ev]),
               by.get("finish", np.empty(0, int)))
        ev = get(by.get("step", np.empty(0, int)))
        step_ids = ints([e["step"] for e in ev], 0)
        durs = [e.get("dur_ms", 0.0) for e in ev]
        if durs and not set(map(type, durs)) <= _NUM:
            raise KeyError
        dur = np.array(durs, dtype=float)
        if not (np.isfinite(dur).all() and (dur >= 0).all()):
            raise KeyError
        stp = (step_ids, times(ev), dur) + tuple(ints([e.get(f, -1) for e in ev], -1)
                                                for f in ("running", "waiting", "kv_used_blocks", "kv_free_blocks"))
        batches = [e.get("batch", []) for e in ev]
        if batches and not set(map(type, batches)) <= {list}:
            raise KeyError
        lens = np.array([len(b) for b in batches], dtype=np.int64)
        items = [it for b in batches for it in b]
        if items and not set(map(type, items)) <= {dict}:
            raise KeyError
        br, bk, bn = fields(items, "req", "kind", "tokens")
        bat = (np.repeat(step_ids, lens), reqs(br), strs(bk, KINDS), ints(bn, 1))
        ev = get(by.get("kv", np.empty(0, int)))
        hashes = optional(ev, "hash", None)
        if hashes and not set(map(type, hashes)) <= {str, type(None)}:
            raise KeyError
        t_, op_, b_ = fields(ev, "t_ms", "op", "block")
        kvc = (times(ev, t_), strs(op_, KV_OPS), reqs(optional(ev, "req", None), allow_none=True),
               ints(b_, 0), ints(optional(ev, "logical", -1), -2**62),
               ints(optional(ev, "ref", 0), -2**62), hashes, ints(optional(ev, "src", -1), -2**62))
        ev = get(by.get("preempt", np.empty(0, int)))
        reasons = [e.get("reason", "kv_full") for e in ev]
        pre = (times(ev), reqs([e["req"] for e in ev]), [str(r) for r in reasons],
               ints([e.get("freed_blocks", 0) for e in ev], 0))
        other = []
        known = {"token", "finish", "step", "kv", "preempt"}
        rest = sorted(i for u, idx in by.items() if u not in known for i in idx.tolist())
        for i in rest:
            e = events[i]
            if not _ok_time(e.get("t_ms")):
                raise KeyError
            if e["type"] in ("spec", "tiles") and e.get("req") is not None and e["req"] not in index_of:
                raise KeyError
            other.append(e)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return tok, fin, stp, bat, kvc, pre, other


def _check_consistency(pb: _Problems, requests, tokens, tok_pos, finishes, fin_pos):
    """Cross-event rules, vectorised: tokens after arrival, indices 0..n-1 without repeats,
    emission times non-decreasing in index order, counts within max_output_tokens, one
    finish per request, not before its last token."""
    ids = requests["id"].to_numpy()
    if len(tokens):
        req = tokens["req"].to_numpy()
        idx = tokens["index"].to_numpy()
        t = tokens["t_ms"].to_numpy()
        arr = requests["arrival_ms"].to_numpy()[req]
        for k in np.flatnonzero(t < arr):
            pb.add(tok_pos[k], f"events[{tok_pos[k]}] (token): request {ids[req[k]]!r} token {idx[k]} at "
                               f"{t[k]} ms is before its arrival at {arr[k]} ms")
        order = np.lexsort((idx, req))
        r_s, i_s, t_s, p_s = req[order], idx[order], t[order], tok_pos[order]
        same = r_s[1:] == r_s[:-1]
        for k in np.flatnonzero(same & (i_s[1:] == i_s[:-1])):
            pb.add(p_s[k + 1], f"events[{p_s[k + 1]}] (token): request {ids[r_s[k]]!r} token index "
                               f"{i_s[k]} appears twice")
        for k in np.flatnonzero(same & (t_s[1:] < t_s[:-1])):
            pb.add(p_s[k + 1], f"events[{p_s[k + 1]}] (token): request {ids[r_s[k]]!r} token {i_s[k + 1]} at "
                               f"{t_s[k + 1]} ms is earlier than token {i_s[k]} at {t_s[k]} ms (times must not decrease)")
        counts = np.bincount(req, minlength=len(requests))
        maxo = requests["max_output_tokens"].to_numpy()
        for j in np.flatnonzero(counts > maxo):
            pb.add(1e18, f"request {ids[j]!r}: {counts[j]} tokens, more than its max_output_tokens {maxo[j]}")
        # Indices 0..n-1: after sorting, the k-th token of a request must have index k.
        start = np.r_[0, np.flatnonzero(~same) + 1]
        rank = np.arange(len(r_s)) - np.repeat(start, np.diff(np.r_[start, len(r_s)]))
        for k in np.flatnonzero(i_s != rank)[:1]:
            pb.add(p_s[k], f"events[{p_s[k]}] (token): request {ids[r_s[k]]!r} token indices must run "
                           f"0..n-1 without gaps; found index {i_s[k]} where {rank[k]} was expected")
    if len(finishes):
        req = finishes["req"].to_numpy()
        t = finishes["t_ms"].to_numpy()
        dup = pd.Series(req).duplicated().to_numpy()
        for k in np.flatnonzero(dup):
            pb.add(fin_pos[k], f"events[{fin_pos[k]}] (finish): request {ids[req[k]]!r} finishes twice")
        if len(tokens):
            last = tokens.groupby("req")["t_ms"].max()
            lt = last.reindex(req).to_numpy()
            for k in np.flatnonzero(t < lt):
                pb.add(fin_pos[k], f"events[{fin_pos[k]}] (finish): request {ids[req[k]]!r} finishes at {t[k]} ms, "
                                   f"before its last token at {lt[k]} ms")


def new_trace(meta: dict, workload: Workload) -> Trace:
    """An empty trace for a workload (events are added by builders)."""
    reqs = workload.requests
    requests = pd.DataFrame(copy=False, data={
        "id": pd.Series([r.id for r in reqs], dtype=object),
        "arrival_ms": np.fromiter((r.arrival_ms for r in reqs), dtype=float, count=len(reqs)),
        "prompt_tokens": np.fromiter((r.prompt_tokens for r in reqs), dtype=np.int64, count=len(reqs)),
        "max_output_tokens": np.fromiter((r.output_tokens for r in reqs), dtype=np.int64, count=len(reqs)),
        "tenant": pd.Series([r.tenant for r in reqs], dtype=object)})
    extras = []
    for r in reqs:
        e = dict(r.extra) if r.extra else {}
        if r.prompt_ids is not None:
            e["prompt_ids"] = list(r.prompt_ids)
        if r.abort_at_ms is not None:
            e["abort_at_ms"] = r.abort_at_ms
        extras.append(e)
    return Trace(meta=dict(meta), requests=requests, request_extra=extras)


def trace_from_log(workload: Workload, log, meta: dict) -> Trace:
    """Turn a scheduler StepLog (simulator or runner) into a Trace."""
    tr = new_trace(meta, workload)
    if log.token_parts:
        reqs = np.concatenate([p[0] for p in log.token_parts])
        idx = np.concatenate([p[1] for p in log.token_parts])
        # A part's time is one scalar (a step) or one per token (a fast-forwarded run of steps).
        t = np.concatenate([np.full(len(p[0]), p[2], dtype=float) if np.ndim(p[2]) == 0 else p[2]
                            for p in log.token_parts])
        if any(p[3] is not None for p in log.token_parts):
            tid = np.concatenate([p[3] if p[3] is not None else np.full(len(p[0]), -1) for p in log.token_parts])
        else:
            tid = np.full(len(t), -1, dtype=np.int64)
        src = getattr(log, "token_sources", None)  # per part: codes into TOKEN_SOURCES, None = sampled
        if src and any(c is not None for c in src):
            codes = np.concatenate([c if c is not None else np.zeros(len(p[0]), dtype=np.int8)
                                    for c, p in zip(src, log.token_parts)])
        else:
            codes = np.zeros(len(reqs), dtype=np.int8)
        tr.tokens = pd.DataFrame(copy=False, data={
            "req": reqs.astype(np.int64, copy=False), "index": idx.astype(np.int64, copy=False), "t_ms": t,
            "source": pd.Categorical.from_codes(codes, TOKEN_SOURCES), "token_id": tid.astype(np.int64, copy=False)})
    if log.finishes:
        f = list(zip(*log.finishes))
        tr.finishes = pd.DataFrame(copy=False, data={"req": np.array(f[0], dtype=np.int64), "t_ms": np.array(f[1], dtype=float),
                                    "reason": pd.Series(f[2], dtype=object)})
    if log.steps:
        # Entries are single steps (tuples of scalars) or StepRuns (tuples of arrays), in order.
        parts, singles = [], []
        for e in log.steps:
            if np.ndim(e[0]) == 0:  # a single step (a StepRun holds arrays)
                singles.append(e)
                continue
            if singles:
                parts.append(list(zip(*singles)))
                singles = []
            parts.append(e)
        if singles:
            parts.append(list(zip(*singles)))
        tr.steps = pd.DataFrame(copy=False, data={
            name: np.concatenate([np.asarray(p[i], dtype=STEP_COLS[name]) for p in parts])
            for i, name in enumerate(STEP_COLS)})
        # A part's step is one index, or an array of steps that all ran the same batch.
        step = np.concatenate([np.full(len(p[1]), p[0], dtype=np.int64) if np.ndim(p[0]) == 0
                               else np.repeat(p[0], len(p[1])) for p in log.batch_parts])
        tile = lambda k: np.concatenate([p[k] if np.ndim(p[0]) == 0 else np.tile(p[k], len(p[0]))
                                         for p in log.batch_parts])
        tr.batch = pd.DataFrame(copy=False, data={
            "step": step, "req": tile(1).astype(np.int64, copy=False),
            "kind": pd.Categorical.from_codes(tile(3).astype(np.int8), KINDS),
            "tokens": tile(2).astype(np.int64, copy=False)})
    if len(log.kv):
        c = log.kv.columns()
        tr.kv = pd.DataFrame(copy=False, data={
            "t_ms": c["t_ms"], "op": pd.Categorical.from_codes(c["op"], KV_OPS),
            "req": c["req"], "block": c["block"], "logical": c["logical"], "ref": c["ref"],
            "hash": pd.Series(c["hash"], dtype=object), "src": c["src"]})
    tr.other = list(getattr(log, "other", []) or [])
    if log.preempts:
        p = list(zip(*log.preempts))
        tr.preempts = pd.DataFrame(copy=False, data={"req": np.array(p[0], dtype=np.int64), "t_ms": np.array(p[1], dtype=float),
                                    "reason": pd.Series(p[2], dtype=object),
                                    "freed_blocks": np.array(p[3], dtype=np.int64)})[list(PREEMPT_COLS)]
    return tr


def given_trace(workload: Workload, emissions: dict[str, list[float]], meta: dict) -> Trace:
    """A trace from assigned emission times per request id (teaching scenarios)."""
    tr = new_trace({"source": "given", **meta}, workload)
    pos = {rid: i for i, rid in enumerate(tr.ids)}
    rows = [(pos[rid], k, float(t)) for rid, ts in emissions.items() for k, t in enumerate(ts)]
    req, idx, t = (np.array(c) for c in zip(*rows))
    tr.tokens = pd.DataFrame(copy=False, data={"req": req.astype(np.int64), "index": idx.astype(np.int64), "t_ms": t.astype(float),
                              "source": pd.Categorical(["sampled"] * len(rows), categories=TOKEN_SOURCES),
                              "token_id": np.full(len(rows), -1, dtype=np.int64)})
    last = {rid: max(ts) for rid, ts in emissions.items()}
    tr.finishes = pd.DataFrame(copy=False, data={"req": np.array([pos[r] for r in last], dtype=np.int64),
                                "t_ms": np.array(list(last.values()), dtype=float),
                                "reason": pd.Series(["length"] * len(last), dtype=object)})
    return trace_from_doc(tr.to_doc(), meta.get("label", "given"))  # validate on the way out


# ---- columnar Parquet form -----------------------------------------------------------
# One Parquet table, one row per record, `rtype` naming the record: request, token, finish,
# step, batch (one per (step, request) entry), kv, preempt, other (JSON of an event kept
# verbatim). Columns a record does not use are null. The document's meta and unknown
# top-level fields live in the file's key-value metadata ("serving-trace" -> JSON).
PARQUET_KEY = b"serving-trace"
_PQ_COLUMNS = {  # column -> (arrow type name, records that use it)
    "rtype": "string", "t_ms": "float64", "req": "int64", "id": "string", "prompt_tokens": "int64",
    "max_output_tokens": "int64", "tenant": "string", "index": "int64", "source": "string", "token_id": "int64",
    "reason": "string", "step": "int64", "dur_ms": "float64", "running": "int64", "waiting": "int64",
    "kv_used_blocks": "int64", "kv_free_blocks": "int64", "kind": "string", "tokens": "int64", "op": "string",
    "block": "int64", "logical": "int64", "ref": "int64", "hash": "string", "src": "int64",
    "freed_blocks": "int64", "json": "string",
}


def to_parquet_bytes(trace: Trace) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(rtype: str, cols: dict) -> pa.Table:
        n = len(next(iter(cols.values()))) if cols else 0
        arrays, names = [pa.array([rtype] * n, pa.string())], ["rtype"]
        for name, typ in _PQ_COLUMNS.items():
            if name == "rtype":
                continue
            t = getattr(pa, typ if typ != "float64" else "float64")()
            if name in cols:
                v = cols[name]
                v = v.astype(object) if hasattr(v, "dtype") and str(v.dtype) == "category" else v
                arrays.append(pa.array(v, type=t, from_pandas=True))
            else:
                arrays.append(pa.nulls(n, type=t))
            names.append(name)
        return pa.Table.from_arrays(arrays, names=names)

    rq = trace.requests
    extras = [json.dumps(e, separators=(",", ":"), allow_nan=False) if e else None for e in trace.request_extra]
    parts = [table("request", {"t_ms": rq["arrival_ms"], "id": rq["id"], "prompt_tokens": rq["prompt_tokens"],
                               "max_output_tokens": rq["max_output_tokens"], "tenant": rq["tenant"],
                               "json": pd.Series(extras + [None] * (len(rq) - len(extras)), dtype=object)})]
    tk = trace.tokens
    parts.append(table("token", {"t_ms": tk["t_ms"], "req": tk["req"], "index": tk["index"],
                                 "source": tk["source"], "token_id": tk["token_id"]}))
    fn = trace.finishes
    parts.append(table("finish", {"t_ms": fn["t_ms"], "req": fn["req"], "reason": fn["reason"]}))
    stp = trace.steps
    parts.append(table("step", {c: stp[c] for c in STEP_COLS}))
    bt = trace.batch
    parts.append(table("batch", {"step": bt["step"], "req": bt["req"], "kind": bt["kind"], "tokens": bt["tokens"]}))
    kv = trace.kv
    parts.append(table("kv", {c: kv[c] for c in KV_COLS}))
    pr = trace.preempts
    parts.append(table("preempt", {c: pr[c] for c in PREEMPT_COLS}))
    if trace.other:
        parts.append(table("other", {"t_ms": [float(e.get("t_ms", 0.0)) for e in trace.other],
                                     "json": [json.dumps(e, separators=(",", ":"), allow_nan=False)
                                              for e in trace.other]}))
    t = pa.concat_tables(parts)
    head = json.dumps({"schema": SCHEMA, "meta": trace.meta, "extra": trace.extra}, allow_nan=False)
    t = t.replace_schema_metadata({PARQUET_KEY: head.encode()})
    buf = pa.BufferOutputStream()
    pq.write_table(t, buf, compression="zstd")
    return buf.getvalue().to_pybytes()


def trace_from_parquet(data: bytes, name: str = "trace.parquet") -> Trace:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        t = pq.read_table(pa.BufferReader(data))
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise TraceError(f"{name}: not a readable Parquet file ({type(e).__name__}: {str(e)[:120]})") from None
    md = t.schema.metadata or {}
    if PARQUET_KEY not in md:
        raise TraceError(f"{name}: Parquet file without serving-trace metadata (not written by this tool?)")
    try:
        head = json.loads(md[PARQUET_KEY].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TraceError(f"{name}: broken serving-trace metadata in the Parquet file") from None
    if not isinstance(head, dict) or head.get("schema") != SCHEMA:
        got = head.get("schema") if isinstance(head, dict) else None
        raise TraceError(f"{name}: schema: unknown version {got!r}; this build reads {SCHEMA!r}")
    meta = head.get("meta")
    if not isinstance(meta, dict) or meta.get("source") not in SOURCES:
        raise TraceError(f"{name}: meta.source: expected one of {', '.join(SOURCES)}")
    missing = [c for c in _PQ_COLUMNS if c not in t.column_names]
    if missing:
        raise TraceError(f"{name}: Parquet table lacks column(s) {', '.join(missing)}")
    try:
        t = t.select(list(_PQ_COLUMNS)).cast(pa.schema([(c, getattr(pa, ty)()) for c, ty in _PQ_COLUMNS.items()]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise TraceError(f"{name}: Parquet column types do not match the format ({str(e)[:120]})") from None
    pb = _Problems(name)
    import pyarrow.compute as pc
    rtype_col = t.column("rtype")
    if rtype_col.null_count:
        raise TraceError(f"{name}: a row has no record type (rtype)")
    kinds = ["request", "token", "finish", "step", "batch", "kv", "preempt", "other"]
    rt_idx = pc.index_in(rtype_col, value_set=pa.array(kinds))
    if rt_idx.null_count:
        raise TraceError(f"{name}: unknown record type in column rtype")
    rt = rt_idx.to_numpy(zero_copy_only=False).astype(np.int64)

    class _Part:
        """Columns of one record type as numpy / pandas, straight from Arrow."""

        def __init__(self, kind):
            self.kind = kind
            sel = np.flatnonzero(rt == kinds.index(kind))
            contiguous = len(sel) and sel[-1] - sel[0] + 1 == len(sel)
            # Our writer keeps each record type contiguous: slice (zero-copy) instead of take.
            self.col = ((lambda c: t.column(c).slice(int(sel[0]), len(sel))) if contiguous
                        else (lambda c: t.column(c).take(pa.array(sel))))
            self.n = len(sel)

        def __len__(self):
            return self.n

        def categorical(self, c, allowed, default):
            """A string column as a Categorical over `allowed` (None if a value is outside)."""
            col = self.col(c).fill_null(default) if self.n else pa.array([], pa.string())
            d = col.combine_chunks().dictionary_encode() if self.n else None
            if d is None:
                return pd.Categorical([], categories=allowed)
            values = d.dictionary.to_pylist()
            if not set(values) <= set(allowed):
                return None
            remap = np.array([allowed.index(v) for v in values], dtype=np.int64)
            return pd.Categorical.from_codes(remap[d.indices.to_numpy(zero_copy_only=False)], categories=allowed)

        def __getitem__(self, c):
            col = self.col(c)
            if pa.types.is_string(col.type):
                return pd.Series(col.to_numpy(zero_copy_only=False), dtype=object)
            if col.null_count:
                return pd.Series(col.to_pandas(types_mapper=None))
            return pd.Series(col.to_numpy())

    def rows(kind, cols, ints=(), floats=()):
        part = _Part(kind)
        for c in ints:
            if part.col(c).null_count:
                raise TraceError(f"{name}: {kind} records: {c} missing")
        for c in floats:
            v = part.col(c)
            a = v.to_numpy(zero_copy_only=False).astype(float)
            if v.null_count or not np.isfinite(a).all() or (a < 0).any():
                raise TraceError(f"{name}: {kind} records: {c} must be finite and >= 0")
        return part

    rq = rows("request", ["t_ms", "id", "prompt_tokens", "max_output_tokens", "tenant", "json"],
              ints=("prompt_tokens", "max_output_tokens"), floats=("t_ms",))
    n = len(rq)
    if rq["id"].isna().any() or rq["id"].duplicated().any():
        raise TraceError(f"{name}: request ids must be present and unique")
    if (rq["prompt_tokens"] < 0).any() or (rq["max_output_tokens"] < 1).any():
        raise TraceError(f"{name}: request token counts out of range")
    requests = pd.DataFrame(copy=False, data={"id": rq["id"].astype(object), "arrival_ms": rq["t_ms"].astype(float),
                             "prompt_tokens": rq["prompt_tokens"].astype(np.int64),
                             "max_output_tokens": rq["max_output_tokens"].astype(np.int64),
                             "tenant": rq["tenant"].astype(object).where(rq["tenant"].notna(), None)})
    try:
        extras = [json.loads(x) if isinstance(x, str) else {} for x in rq["json"]]
    except json.JSONDecodeError:
        raise TraceError(f"{name}: a request's extra fields are not valid JSON") from None

    def req_codes(part, kind, allow_none=False):
        r = part["req"]
        if not allow_none and r.isna().any():
            raise TraceError(f"{name}: {kind} records: req missing")
        v = r.fillna(-1).to_numpy(dtype=np.int64)
        lo = -1 if allow_none else 0
        if ((v < lo) | (v >= n)).any():
            raise TraceError(f"{name}: {kind} records: req refers to no request")
        return v

    tk = rows("token", ["t_ms", "req", "index", "source", "token_id"], ints=("index",), floats=("t_ms",))
    source = tk.categorical("source", TOKEN_SOURCES, "sampled")
    if source is None:
        raise TraceError(f"{name}: token records: source must be one of {', '.join(TOKEN_SOURCES)}")
    tokens = pd.DataFrame(copy=False, data={"req": req_codes(tk, "token"), "index": tk["index"].to_numpy(dtype=np.int64),
                           "t_ms": tk["t_ms"].to_numpy(dtype=float), "source": source,
                           "token_id": tk["token_id"].fillna(-1).to_numpy(dtype=np.int64)})
    fn = rows("finish", ["t_ms", "req", "reason"], floats=("t_ms",))
    finishes = pd.DataFrame(copy=False, data={"req": req_codes(fn, "finish"), "t_ms": fn["t_ms"].to_numpy(dtype=float),
                             "reason": fn["reason"].fillna("length").astype(object)})
    sp = rows("step", list(STEP_COLS), ints=("step",), floats=("t_ms", "dur_ms"))
    steps = pd.DataFrame(copy=False, data={c: sp[c].fillna(-1).to_numpy(dtype=STEP_COLS[c]) for c in STEP_COLS})
    bt = rows("batch", ["step", "req", "kind", "tokens"], ints=("step", "tokens"))
    kind = bt.categorical("kind", KINDS, "")
    if kind is None:
        raise TraceError(f"{name}: batch records: kind must be prefill or decode")
    batch = pd.DataFrame(copy=False, data={"step": bt["step"].to_numpy(dtype=np.int64), "req": req_codes(bt, "batch"), "kind": kind,
                          "tokens": bt["tokens"].to_numpy(dtype=np.int64)})
    kvp = rows("kv", list(KV_COLS), ints=("block",), floats=("t_ms",))
    op = kvp.categorical("op", KV_OPS, "")
    if op is None:
        raise TraceError(f"{name}: kv records: op must be one of {', '.join(KV_OPS)}")
    kv = pd.DataFrame(copy=False, data={"t_ms": kvp["t_ms"].to_numpy(dtype=float), "op": op,
                       "req": req_codes(kvp, "kv", allow_none=True), "block": kvp["block"].to_numpy(dtype=np.int64),
                       "logical": kvp["logical"].fillna(-1).to_numpy(dtype=np.int64),
                       "ref": kvp["ref"].fillna(0).to_numpy(dtype=np.int64),
                       "hash": kvp["hash"].astype(object).where(kvp["hash"].notna(), None),
                       "src": kvp["src"].fillna(-1).to_numpy(dtype=np.int64)})
    pr = rows("preempt", list(PREEMPT_COLS), floats=("t_ms",))
    preempts = pd.DataFrame(copy=False, data={"t_ms": pr["t_ms"].to_numpy(dtype=float), "req": req_codes(pr, "preempt"),
                             "reason": pr["reason"].fillna("kv_full").astype(object),
                             "freed_blocks": pr["freed_blocks"].fillna(0).to_numpy(dtype=np.int64)})
    try:
        other = [json.loads(x) for x in _Part("other")["json"]]
    except (TypeError, json.JSONDecodeError):
        raise TraceError(f"{name}: an 'other' event is not valid JSON") from None
    _check_consistency(pb, requests, tokens, np.arange(len(tokens)), finishes, np.arange(len(finishes)))
    pb.raise_if_any()
    extra = head.get("extra") if isinstance(head.get("extra"), dict) else {}
    return Trace(meta=meta, requests=requests, tokens=tokens, finishes=finishes, steps=steps, batch=batch, kv=kv,
                 preempts=preempts, other=other, request_extra=extras, extra=extra)


def is_parquet(data: bytes) -> bool:
    return data[:4] == b"PAR1"


# ---- typed fast decoding (msgspec) -------------------------------------------------------
# The common case - a valid trace with only the known event types - decodes straight into
# typed structs, several times faster than generic JSON objects. Anything unexpected
# (unknown event types, wrong types, out-of-range values) returns None, and the generic
# path then parses the document again and reports the first problem precisely.
try:
    import msgspec
except ImportError:  # optional: the generic path handles everything
    msgspec = None

if msgspec is not None:
    class _Tok(msgspec.Struct, tag="token", tag_field="type"):
        t_ms: float
        req: str
        index: int
        source: str = "sampled"
        token_id: int = -1

    class _Fin(msgspec.Struct, tag="finish", tag_field="type"):
        t_ms: float
        req: str
        reason: str = "length"

    class _Item(msgspec.Struct):
        req: str
        kind: str
        tokens: int

    class _Step(msgspec.Struct, tag="step", tag_field="type"):
        t_ms: float
        step: int
        dur_ms: float = 0.0
        batch: list[_Item] = []
        running: int = -1
        waiting: int = -1
        kv_used_blocks: int = -1
        kv_free_blocks: int = -1

    class _KV(msgspec.Struct, tag="kv", tag_field="type"):
        t_ms: float
        op: str
        block: int
        req: str | None = None
        logical: int = -1
        ref: int = 0
        hash: str | None = None
        src: int = -1

    class _Pre(msgspec.Struct, tag="preempt", tag_field="type"):
        t_ms: float
        req: str
        reason: str = "kv_full"
        freed_blocks: int = 0

    _TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
    _EVENTS = msgspec.json.Decoder(list[_Tok | _Fin | _Step | _KV | _Pre])


def _typed_parse(data: bytes, name: str) -> Trace | None:
    if msgspec is None:
        return None
    raw = data
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            return None
    try:
        top = _TOP.decode(raw)
        events = _EVENTS.decode(top["events"]) if "events" in top else None
        doc = {k: msgspec.json.decode(v) for k, v in top.items() if k != "events"}
    except (msgspec.DecodeError, KeyError, RecursionError, UnicodeDecodeError):
        return None
    if events is None:
        return None
    doc["events"] = None
    try:
        return trace_from_doc(doc, name, event_columns=lambda index_of: _struct_columns(events, index_of))
    except TraceError:
        return None  # let the generic path word the error (it sees the original events)


def _struct_columns(events, index_of):
    ids = pd.Index(list(index_of), dtype=object)

    def codes(vals, allowed_none=False):
        c = ids.get_indexer(pd.Index(vals, dtype=object)).astype(np.int64)
        if (c < 0).any() and not (allowed_none and all(vals[i] is None for i in np.flatnonzero(c < 0).tolist())):
            raise ValueError
        return c

    def cat(vals, allowed):
        c = pd.Index(allowed, dtype=object).get_indexer(pd.Index(vals, dtype=object))
        if (c < 0).any():
            raise ValueError
        return pd.Categorical.from_codes(c, categories=allowed)

    def nonneg(a, what=float):
        a = np.asarray(a, dtype=what)
        if len(a) and (not np.isfinite(a).all() if what is float else False) or (a < 0).any():
            raise ValueError
        return a

    by: dict[type, list] = {}
    for e in events:
        by.setdefault(type(e), []).append(e)
    try:
        tk = by.get(_Tok, [])
        tok_id = np.array([e.token_id for e in tk], dtype=np.int64)
        if (tok_id < -1).any():
            raise ValueError
        tok = (codes([e.req for e in tk]), nonneg([e.index for e in tk], np.int64), nonneg([e.t_ms for e in tk]),
               cat([e.source for e in tk], TOKEN_SOURCES), tok_id, np.arange(len(tk)))
        fn = by.get(_Fin, [])
        fin = (codes([e.req for e in fn]), nonneg([e.t_ms for e in fn]), [e.reason for e in fn], np.arange(len(fn)))
        sp = by.get(_Step, [])
        step_ids = nonneg([e.step for e in sp], np.int64)
        counts = [np.array([getattr(e, f) for e in sp], dtype=np.int64)
                  for f in ("running", "waiting", "kv_used_blocks", "kv_free_blocks")]
        if any((c < -1).any() for c in counts):
            raise ValueError
        stp = (step_ids, nonneg([e.t_ms for e in sp]), nonneg([e.dur_ms for e in sp]), *counts)
        items = [it for e in sp for it in e.batch]
        n_tok = np.array([it.tokens for it in items], dtype=np.int64)
        if (n_tok < 1).any():
            raise ValueError
        bat = (np.repeat(step_ids, [len(e.batch) for e in sp]), codes([it.req for it in items]),
               cat([it.kind for it in items], KINDS), n_tok)
        kv = by.get(_KV, [])
        kvc = (nonneg([e.t_ms for e in kv]), cat([e.op for e in kv], KV_OPS), codes([e.req for e in kv], True),
               nonneg([e.block for e in kv], np.int64), np.array([e.logical for e in kv], dtype=np.int64),
               np.array([e.ref for e in kv], dtype=np.int64), [e.hash for e in kv],
               np.array([e.src for e in kv], dtype=np.int64))
        pr = by.get(_Pre, [])
        pre = (nonneg([e.t_ms for e in pr]), codes([e.req for e in pr]), [e.reason for e in pr],
               nonneg([e.freed_blocks for e in pr], np.int64))
    except (ValueError, OverflowError):
        return None
    return tok, fin, stp, bat, kvc, pre, []
