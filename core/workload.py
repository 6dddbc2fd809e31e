"""Requests and workloads, and loaders for the workload files people already have.

Formats read by `parse_workload`:
- our JSON: {"requests": [{"id", "arrival_ms", "prompt_tokens" | "prompt_ids" | "prompt",
  "output_tokens", "tenant"?, "abort_at_ms"?}]}; a `serving-trace/1` document is read
  as the workload of that trace;
- Vidur-style CSV: arrived_at (seconds), num_prefill_tokens, num_decode_tokens;
- LLMServingSim-style JSONL: input_toks, output_toks, arrival_time_ns.
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import WorkloadError, gunzip, loads_json, read_input_file, short

MAX_TOKENS = 10_000_000  # per request; larger counts are certainly a unit mistake
# Latest time (ms) anywhere: ~31.7 years. A float64 near 1e12 still resolves ~1e-4 ms, so every
# time stays exact to the microsecond (Chrome export) and sums of times stay finite.
MAX_TIME_MS = 1e12


@dataclass(slots=True)
class Request:
    id: str
    arrival_ms: float
    prompt_tokens: int
    max_output_tokens: int                 # tokens the request asks for (max_tokens; JSON key output_tokens)
    prompt_ids: tuple[int, ...] | None = None  # exact token ids, needed for prefix caching
    tenant: str | None = None              # cache salt: blocks are never shared across tenants
    abort_at_ms: float | None = None       # client cancels at this time (runner/simulator)
    extra: dict = field(default_factory=dict)  # unknown fields, kept verbatim

    def __post_init__(self):
        where = f"request {self.id!r}"
        if not isinstance(self.id, str) or not self.id:
            raise WorkloadError(f"{where}: id must be a non-empty string")
        _check_time(self.arrival_ms, f"{where}: arrival_ms")
        _check_count(self.prompt_tokens, f"{where}: prompt_tokens")
        _check_count(self.max_output_tokens, f"{where}: output_tokens")
        if self.prompt_ids is not None:
            self.prompt_ids = tuple(self.prompt_ids)
            if len(self.prompt_ids) != self.prompt_tokens:
                raise WorkloadError(f"{where}: prompt_ids has {len(self.prompt_ids)} ids "
                                    f"but prompt_tokens is {self.prompt_tokens}")
        if self.abort_at_ms is not None:
            _check_time(self.abort_at_ms, f"{where}: abort_at_ms")

    def to_dict(self) -> dict:
        d = {"id": self.id, "arrival_ms": self.arrival_ms, "prompt_tokens": self.prompt_tokens,
             "output_tokens": self.max_output_tokens}
        if self.prompt_ids is not None:
            d["prompt_ids"] = list(self.prompt_ids)
        if self.tenant is not None:
            d["tenant"] = self.tenant
        if self.abort_at_ms is not None:
            d["abort_at_ms"] = self.abort_at_ms
        d.update(self.extra)
        return d


@dataclass(slots=True)
class Workload:
    requests: list[Request]
    name: str = "workload"

    def __post_init__(self):
        if not self.requests:
            raise WorkloadError(f"{self.name}: the workload has no requests")
        seen = set()
        for r in self.requests:
            if r.id in seen:
                raise WorkloadError(f"{self.name}: duplicate request id {r.id!r}")
            seen.add(r.id)
        # Stable sort: equal arrivals keep file order (FCFS tie-break).
        self.requests = sorted(self.requests, key=lambda r: r.arrival_ms)

    def __len__(self):
        return len(self.requests)

    def to_dict(self) -> dict:
        return {"name": self.name, "requests": [r.to_dict() for r in self.requests]}


def _check_time(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WorkloadError(f"{what}: expected a number of milliseconds, got {short(v)}")
    try:
        finite = math.isfinite(v)
    except OverflowError:
        finite = False
    if not finite or v < 0:
        raise WorkloadError(f"{what}: expected a finite number >= 0, got {short(v)}")
    if v > MAX_TIME_MS:
        raise WorkloadError(f"{what}: {short(v)} ms is beyond the latest time {MAX_TIME_MS:g} ms")


def _check_count(v, what):
    if isinstance(v, bool) or not isinstance(v, int):
        raise WorkloadError(f"{what}: expected a positive integer, got {short(v)}")
    if v < 1 or v > MAX_TOKENS:
        raise WorkloadError(f"{what}: expected an integer in 1..{MAX_TOKENS}, got {v}")


def _as_int(v, what):
    # Accept 4 and 4.0 (CSV/JSON writers differ), refuse 4.5 and "4".
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            raise WorkloadError(f"{what}: expected an integer, got {short(v)}") from None
        if f.is_integer():
            return int(f)
        raise WorkloadError(f"{what}: expected an integer, got {short(v)}")
    return v


def _as_float(v, what):
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise WorkloadError(f"{what}: expected a number, got {short(v)}") from None
    return v


Tokenize = Callable[[str], list[int]]


def request_from_dict(d: Any, where: str, tokenize: Tokenize | None = None) -> Request:
    if not isinstance(d, dict):
        raise WorkloadError(f"{where}: expected an object, got {type(d).__name__}")
    known = {"id", "arrival_ms", "prompt_tokens", "prompt_ids", "prompt", "output_tokens",
             "max_output_tokens", "tenant", "abort_at_ms"}
    rid = d.get("id")
    if rid is None:
        raise WorkloadError(f"{where}.id: missing")
    if isinstance(rid, int) and not isinstance(rid, bool):
        rid = str(rid)
    if not isinstance(rid, str):
        raise WorkloadError(f"{where}.id: expected a string, got {short(rid)}")
    if "arrival_ms" not in d:
        raise WorkloadError(f"{where}.arrival_ms: missing")
    ids = d.get("prompt_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                and t >= 0 for t in ids):
            raise WorkloadError(f"{where}.prompt_ids: expected a list of non-negative integers")
    elif isinstance(d.get("prompt"), str) and tokenize is not None:
        ids = tokenize(d["prompt"])
    # Text tokenized here decides the length; otherwise prompt_tokens (e.g. a count for the
    # bundled byte tokenizer, so the simulator can use the same file).
    n_prompt = len(ids) if ids is not None and (tokenize is not None or "prompt_tokens" not in d) \
        else d.get("prompt_tokens")
    if n_prompt is None:
        hint = (" (prompt text is only tokenized by gpu_runner)" if "prompt" in d else "")
        raise WorkloadError(f"{where}: give prompt_tokens or prompt_ids{hint}")
    n_out = d.get("output_tokens", d.get("max_output_tokens"))
    if n_out is None:
        raise WorkloadError(f"{where}.output_tokens: missing")
    tenant = d.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise WorkloadError(f"{where}.tenant: expected a string or null, got {short(tenant)}")
    return Request(
        id=rid,
        arrival_ms=d["arrival_ms"],
        prompt_tokens=_as_int(n_prompt, f"{where}.prompt_tokens"),
        max_output_tokens=_as_int(n_out, f"{where}.output_tokens"),
        prompt_ids=tuple(ids) if ids is not None else None,
        tenant=tenant,
        abort_at_ms=d.get("abort_at_ms"),
        extra={k: v for k, v in d.items() if k not in known} | (
            {"prompt": d["prompt"]} if "prompt" in d else {}),
    )


def _prefix(where, e):
    # Re-raise a Request validation error with the row location in front (once).
    msg = str(e)
    return WorkloadError(msg if msg.startswith(where) else f"{where}: {msg}")


def _count(v, what):
    n = _as_int(v, what)
    _check_count(n, what)
    return n


def _from_json_doc(doc: Any, name: str, tokenize: Tokenize | None) -> Workload:
    if isinstance(doc, list):
        doc = {"requests": doc}
    if not isinstance(doc, dict):
        raise WorkloadError(f"{name}: expected a JSON object with a 'requests' list")
    reqs = doc.get("requests")
    if not isinstance(reqs, list):
        raise WorkloadError(f"{name}: expected a 'requests' list at the top level")
    out = []
    for i, d in enumerate(reqs):
        try:
            out.append(request_from_dict(d, f"{name}: requests[{i}]", tokenize))
        except WorkloadError as e:
            raise _prefix(f"{name}: requests[{i}]", e) from None
    try:
        return Workload(out, name=doc.get("name", name) if isinstance(doc.get("name"), str) else name)
    except WorkloadError as e:
        raise _prefix(name, e) from None


def _from_vidur_csv(text: str, name: str) -> Workload:
    reader = csv.DictReader(io.StringIO(text))
    need = ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise WorkloadError(f"{name}: CSV is missing column(s) {', '.join(missing)} "
                            f"(expected Vidur-style {','.join(need)})")
    out = []
    for i, row in enumerate(reader):
        where = f"{name} row {i + 2}"  # +1 header, +1 one-based
        try:
            arrived_s = _as_float(row["arrived_at"], f"{where}.arrived_at")
            out.append(Request(
                id=str(row.get("id") or row.get("request_id") or i),
                arrival_ms=arrived_s * 1000.0 if isinstance(arrived_s, (int, float)) else arrived_s,
                prompt_tokens=_count(row["num_prefill_tokens"], f"{where}.num_prefill_tokens"),
                max_output_tokens=_count(row["num_decode_tokens"], f"{where}.num_decode_tokens")))
        except WorkloadError as e:
            raise _prefix(where, e) from None
    return Workload(out, name=name)


def _from_llmservingsim_jsonl(text: str, name: str) -> Workload:
    out = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        where = f"{name} line {i + 1}"
        try:
            d = loads_json(line, where, WorkloadError)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(d, dict):
            raise WorkloadError(f"{where}: expected an object")
        for k in ("input_toks", "output_toks", "arrival_time_ns"):
            if k not in d:
                raise WorkloadError(f"{where}: missing {k}")
        try:
            t_ns = _as_float(d["arrival_time_ns"], f"{where}.arrival_time_ns")
            out.append(Request(
                id=str(d.get("id", len(out))),
                arrival_ms=t_ns / 1e6 if isinstance(t_ns, (int, float)) and not isinstance(t_ns, bool) else t_ns,
                prompt_tokens=_count(d["input_toks"], f"{where}.input_toks"),
                max_output_tokens=_count(d["output_toks"], f"{where}.output_toks")))
        except WorkloadError as e:
            raise _prefix(where, e) from None
    return Workload(out, name=name)


def decode_bytes(data: bytes, name: str, error=WorkloadError) -> str:
    data = gunzip(data, name, error)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{name}: not UTF-8 text (byte {e.start})") from None


def parse_workload(data: bytes | str, name: str = "workload",
                   tokenize: Tokenize | None = None) -> Workload:
    """Parse a workload file's content; the format follows the name's suffix, then content."""
    text = decode_bytes(data, name) if isinstance(data, bytes) else data
    lower = name.lower().removesuffix(".gz")
    if lower.endswith(".csv"):
        return _from_vidur_csv(text, name)
    if lower.endswith(".jsonl"):
        return _from_llmservingsim_jsonl(text, name)
    try:
        doc = loads_json(text, name, WorkloadError)
    except json.JSONDecodeError as e:
        first = text.lstrip()[:1]
        if first == "{" and "\n{" in text.strip():
            return _from_llmservingsim_jsonl(text, name)
        if first and first not in "{[":
            if "arrived_at" in text.split("\n", 1)[0]:
                return _from_vidur_csv(text, name)
        raise WorkloadError(f"{name}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if isinstance(doc, dict) and "schema" in doc and "events" in doc:
        # A serving trace: its requests are the workload (max_output_tokens is read as
        # output_tokens); its events are not needed, so core.trace is not involved.
        meta = doc.get("meta")
        label = meta.get("label") if isinstance(meta, dict) else None
        doc = {"requests": doc.get("requests"), "name": label if isinstance(label, str) and label else "trace workload"}
    return _from_json_doc(doc, name, tokenize)


def load_workload(path: str | Path, tokenize: Tokenize | None = None) -> Workload:
    return parse_workload(read_input_file(path, "workload", WorkloadError), Path(path).name, tokenize)


def make_workload(rows: Iterable[tuple], name="workload") -> Workload:
    """Build from (id, arrival_ms, prompt_tokens, output_tokens) tuples (tests, pages)."""
    return Workload([Request(str(i), float(a), int(p), int(o)) for i, a, p, o in rows], name=name)


def parse_token_ids(text: str, what: str = "token ids") -> list[int]:
    """'10, 11,12 13' -> [10, 11, 12, 13]; a clear error names the bad item."""
    items = [x for x in text.replace(",", " ").split() if x]
    if not items:
        raise WorkloadError(f"{what}: expected token ids like 10,11,12")
    out = []
    for x in items:
        try:
            v = int(x)
        except ValueError:
            raise WorkloadError(f"{what}: {x!r} is not an integer token id") from None
        if v < 0:
            raise WorkloadError(f"{what}: token ids must be >= 0, got {v}")
        out.append(v)
    return out
