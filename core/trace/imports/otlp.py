"""OpenTelemetry request spans from vLLM (`--otlp-traces-endpoint`): one `llm_request` span per
request, from its arrival at the engine's front-end to its finish, with the latencies vLLM
measured itself (gen_ai.latency.*, seconds) and its token counts (gen_ai.usage.*).

Read in the OTLP/JSON form that the OpenTelemetry Collector's file exporter writes (one
`ExportTraceServiceRequest` per line: resourceSpans[].scopeSpans[].spans[], hex trace and span
ids, int64 values as strings), in the OTLP/HTTP protobuf form as received (`otlp_json` converts
one body with opentelemetry-proto), and in the one-span-per-line form of
bench/vllm_cpu/otlp_collector.py ({name, start_ns, end_ns, attributes}).

Each span becomes a request: arrival = span start; first token at arrival + time_to_first_token;
last token at arrival + e2e; the completion tokens evenly between them (spans carry no per-token
times: "token times interpolated"), so the request's TTFT and E2E are the span's own. Its
engine-side phases (queue, prefill, decode, in model) are kept per request (`engine_queue_ms`,
`engine_prefill_ms`, `engine_decode_ms`, `engine_inference_ms`) for the timeline's phase view.
"""
from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

from core.errors import TraceError, short
from core.trace.imports.imported import Imported, epoch_offset
from core.trace.imports.rows import RequestRows, count, finite
from core.trace.model import Trace

REQUEST_SPAN = "llm_request"
LATENCY = "gen_ai.latency."
PHASES = {"engine_queue_ms": "time_in_queue", "engine_prefill_ms": "time_in_model_prefill",
          "engine_decode_ms": "time_in_model_decode", "engine_inference_ms": "time_in_model_inference"}
MAX_SPANS = 10_000_000
MAX_ORDER_WORK = 20_000_000     # (placements x requests) tried when pairing in order of arrival


def _value(v) -> object:
    """An OTLP/JSON AnyValue as a Python value (int64 strings as int)."""
    if not isinstance(v, dict) or len(v) != 1:
        return None
    (kind, x), = v.items()
    if kind == "intValue":
        try:
            return int(x)
        except (TypeError, ValueError):
            return None
    if kind == "doubleValue":
        return float(x) if isinstance(x, (int, float, str)) else None
    if kind in ("stringValue", "boolValue"):
        return x
    if kind == "arrayValue" and isinstance(x, dict):
        return [_value(e) for e in _list(x.get("values"))]
    return None


def _list(v) -> list:
    """A JSON value that should be a list: itself, or nothing (a file's value of another type)."""
    return v if isinstance(v, list) else []


def _attrs(lst) -> dict:
    if not isinstance(lst, list):
        return {}
    return {a["key"]: _value(a.get("value")) for a in lst if isinstance(a, dict) and isinstance(a.get("key"), str)}


def looks_like_otlp_json(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("resourceSpans"), list)


def looks_like_bodies(doc) -> bool:
    """A recorded OTLP/HTTP export: {recv_ns, content_type, body_b64} (bench/vllm_cpu/record_telemetry.py)."""
    return isinstance(doc, dict) and "body_b64" in doc and "content_type" in doc


def body_docs(lines: Iterable[dict], name: str) -> Iterator[dict]:
    """OTLP/JSON documents of recorded export bodies (base64, gzip or not)."""
    import binascii

    from core.errors import gunzip
    for k, ln in enumerate(lines):
        try:
            body = base64.b64decode(ln["body_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise TraceError(f"{name}: line {k + 1}: body_b64: expected base64") from None
        if str(ln.get("content_encoding") or "").lower() == "gzip" or body[:2] == b"\x1f\x8b":
            body = gunzip(body, f"{name}: line {k + 1}", TraceError)
        yield otlp_json(body, str(ln.get("content_type") or "application/x-protobuf"),
                        f"{name}: line {k + 1}: OTLP/JSON body")


def looks_like_protobuf_export(body: bytes) -> bool:
    """An OTLP/HTTP protobuf export body (ExportTraceServiceRequest) with at least one span."""
    try:
        doc = otlp_json(body)
    except TraceError:
        return False
    return any(True for _ in spans_of(doc))


def looks_like_collector_lines(doc) -> bool:
    return isinstance(doc, dict) and {"name", "start_ns", "end_ns", "attributes"} <= doc.keys()


def spans_of(doc: dict) -> Iterator[dict]:
    """The spans of one ExportTraceServiceRequest (OTLP/JSON) as {name, start_ns, end_ns,
    attributes, trace_id, span_id}."""
    for rs in _list(doc.get("resourceSpans")):
        for ss in _list(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans")) if isinstance(rs, dict) else ():
            for sp in _list(ss.get("spans")) if isinstance(ss, dict) else ():
                if isinstance(sp, dict):
                    yield {"name": sp.get("name"), "start_ns": sp.get("startTimeUnixNano"),
                           "end_ns": sp.get("endTimeUnixNano"), "attributes": _attrs(sp.get("attributes")),
                           "trace_id": sp.get("traceId"), "span_id": sp.get("spanId")}


def otlp_json(body: bytes, content_type: str = "application/x-protobuf", where: str = "OTLP/JSON body") -> dict:
    """One OTLP/HTTP export body (protobuf, or JSON) as OTLP/JSON: camelCase fields, int64 as
    strings, enums as integers, trace and span ids as lowercase hex (OTLP/JSON's rule, where
    protobuf's own JSON mapping would write base64). JSON is read by the guarded reader
    (core.trace.jsoncodec.parse_json_bytes): too deep a nesting is a TraceError naming `where` and the depth;
    a body still gzip after the caller inflated it once is refused (a gzip inside gzip)."""
    if "json" in content_type:
        if body[:2] == b"\x1f\x8b":       # inflated once already by the caller: a second gzip is not read
            raise TraceError(f"{where}: compressed twice (gzip inside gzip): not read")
        from core.trace.jsoncodec import parse_json_bytes
        doc = parse_json_bytes(body, where)   # one line naming `where` (nesting too deep: how deep)
        if not looks_like_otlp_json(doc):
            raise TraceError(f"{where}: expected an object with resourceSpans")
        return doc
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    msg = ExportTraceServiceRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as e:
        raise TraceError(f"OTLP protobuf body: {e}") from None
    doc = json_format.MessageToDict(msg, use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for sp in ss.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if sp.get(key):
                        sp[key] = base64.b64decode(sp[key]).hex()
                for link in sp.get("links", ()):
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = base64.b64decode(link[key]).hex()
    return doc


def _ns(v, where: str, key: str) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {key}: expected nanoseconds since the epoch, got {short(v)}") from None
    if not 0 < n < 1 << 63:
        raise TraceError(f"{where}: {key}: expected nanoseconds since the epoch, got {short(v)}")
    return n


def request_spans(spans: Iterable[dict], name: str, dropped: list | None = None) -> tuple[list[dict], int]:
    """(the llm_request spans, how many other spans there were). A span received twice (its trace
    and span ids, or for a span without ids its times and attributes, seen before: an exporter's
    retry, a file concatenated with itself) is kept once; `dropped` counts those."""
    reqs, other, seen = [], 0, set()
    for sp in spans:
        if sp.get("name") != REQUEST_SPAN:
            other += 1
            continue
        ids = (sp.get("trace_id"), sp.get("span_id"))
        key = ids if all(isinstance(x, str) and x for x in ids) else \
            (sp.get("start_ns"), sp.get("end_ns"), repr(sorted((sp.get("attributes") or {}).items()))[:4096])
        if key in seen:
            if dropped is not None:
                dropped.append(key)
            continue
        seen.add(key)
        reqs.append(sp)
        if len(reqs) > MAX_SPANS:
            raise TraceError(f"{name}: more than {MAX_SPANS:,} request spans")
    return reqs, other


def first_start_ns(reqs: list[dict], name: str) -> int:
    return min(_ns(sp["start_ns"], f"{name}: span {k}", "startTimeUnixNano") for k, sp in enumerate(reqs))


def add_span_requests(rows: RequestRows, reqs: list[dict], t0: int, name: str) -> dict:
    """Each request span as a request of `rows`, times in ms from t0 (epoch ns); returns
    {request id: its engine-side phases in ms}."""
    seen, phases = {}, {}
    for k, sp in enumerate(reqs):
        a, where = sp["attributes"], f"{name}: span {k}"
        s_ns = _ns(sp["start_ns"], where, "startTimeUnixNano")
        rid = str(a.get("gen_ai.request.id") or sp.get("span_id") or f"span{k}")
        if rid in seen:
            seen[rid] += 1
            rid = f"{rid}#{seen[rid]}"
        else:
            seen[rid] = 0
        at = (s_ns - t0) / 1e6
        if at < 0:
            raise TraceError(f"{where}: starts before the trace's origin")
        lat = {key: a.get(LATENCY + key) for key in ("time_to_first_token", "e2e", *PHASES.values())}
        n_out = count(a.get("gen_ai.usage.completion_tokens", 0), where, "gen_ai.usage.completion_tokens")
        n_in = count(a.get("gen_ai.usage.prompt_tokens", 0), where, "gen_ai.usage.prompt_tokens")
        phases[rid] = {ours: float(lat[theirs]) * 1000.0 for ours, theirs in PHASES.items() if finite(lat[theirs])}
        if n_out == 0 or not finite(lat["time_to_first_token"]):
            end = _ns(sp["end_ns"], where, "endTimeUnixNano")
            rows.empty(rid, at, n_in, t_ms=(end - t0) / 1e6, reason="stop")
            continue
        e2e = lat["e2e"] if finite(lat["e2e"]) else (_ns(sp["end_ns"], where, "endTimeUnixNano") - s_ns) / 1e9
        ttft = float(lat["time_to_first_token"])
        if not 0 <= ttft <= e2e:
            raise TraceError(f"{where}: expected 0 <= time_to_first_token <= e2e, got {ttft!r} and {e2e!r}")
        rows.add_interpolated(rid, at, n_in, at + ttft * 1000.0, at + float(e2e) * 1000.0, n_out, where)
    return phases


def span_notes(n: int, other: int, form: str) -> list[str]:
    notes = [f"{n:,} request spans ({form}); arrival = span start (the engine front-end's arrival), TTFT "
             "and E2E = the span's gen_ai.latency.time_to_first_token and e2e; token times interpolated between "
             "the first and the last (spans carry no per-token times), so ITL and TPOT are averages."]
    if other:
        notes.append(f"{other} other span(s) (startup, ...) left out.")
    return notes


def import_spans(spans: Iterable[dict], name: str, form: str) -> Imported:
    twice: list = []
    reqs, other = request_spans(spans, name, twice)
    if not reqs:
        raise TraceError(f"{name}: no '{REQUEST_SPAN}' spans ({other} other span(s)): vLLM sends one per request "
                         "with --otlp-traces-endpoint")
    t0 = first_start_ns(reqs, name)
    rows = RequestRows(name)
    phases = add_span_requests(rows, reqs, t0, name)
    meta = {"source": "imported", "label": f"{name} (vLLM OpenTelemetry spans)", "created": "unknown",
            "engine": {"name": "vllm"}, "device": "not recorded in the spans",
            "clock": {"kind": "epoch", "t0_s": t0 / 1e9, "resolution_ms": 1e-6,
                      "how": "span start times (startTimeUnixNano, the engine's wall clock)"},
            "provenance": PROVENANCE}
    notes = span_notes(len(reqs), other, form) + rows.notes()
    if twice:
        notes.append(f"{len(twice):,} span(s) appeared more than once (the same trace and span ids): each request "
                     "counted once")
    meta["notes"] = " ".join(notes)
    tr = rows.trace(meta)
    for k, rid in enumerate(tr.ids):
        tr.request_extra[k].update(phases.get(rid, {}))
    return Imported(tr, "vllm", {"spans": len(reqs), "other_spans": other}, rows.failed, notes,
                    tool="vLLM", what="OpenTelemetry request spans", origin=PROVENANCE)


PROVENANCE = {"arrival_ms": "engine: span start (arrival at vLLM's front-end)",
              "ttft_ms": "engine: gen_ai.latency.time_to_first_token",
              "e2e_ms": "engine: gen_ai.latency.e2e",
              "token_times": "interpolated evenly between the first and the last token (spans have no token times)",
              "phases": "engine: gen_ai.latency.time_in_queue, time_in_model_prefill, time_in_model_decode, "
                        "time_in_model_inference"}


def import_otlp_lines(lines: list[dict], name: str) -> Imported:
    """OTLP/JSON lines (collector file exporter), recorded export bodies, or the bench
    collector's span lines."""
    if lines and looks_like_bodies(lines[0]):
        return import_spans((sp for doc in body_docs(lines, name) for sp in spans_of(doc)), name,
                            "OTLP/HTTP export bodies as received")

    def spans():
        for doc in lines:
            if looks_like_otlp_json(doc):
                yield from spans_of(doc)
            elif looks_like_collector_lines(doc):
                yield doc
    return import_spans(spans(), name, "OTLP/JSON")


# ---- merging spans with a client's requests (core.trace.imports.merge) --------------------------

def _containing(keys: list[list[str]], ids: list[str]) -> list[int | None]:
    """For each request's keys (8+ characters each), the first of `ids` that contains one of them,
    else None; in time linear in the ids' total length, not keys x ids substring tests: each distinct
    key is indexed by its rarest 8-character piece, and each id's 8-character windows look it up."""
    uniq = {k for ks in keys for k in ks}
    count: dict[str, int] = {}
    for k in uniq:
        for g in {k[p:p + 8] for p in range(len(k) - 7)}:
            count[g] = count.get(g, 0) + 1
    by_piece: dict[str, list[tuple[str, int]]] = {}
    for k in uniq:
        p = min(range(len(k) - 7), key=lambda p: count[k[p:p + 8]])
        by_piece.setdefault(k[p:p + 8], []).append((k, p))
    first: dict[str, int] = {}          # key -> the first id that contains it
    for j, s in enumerate(ids):
        for q in range(len(s) - 7):
            for k, p in by_piece.get(s[q:q + 8], ()):
                if k not in first and q >= p and s.startswith(k, q - p):
                    first[k] = j
    return [min((first[k] for k in ks if k in first), default=None) for ks in keys]


_PREFIXES = (re.compile(r"^r\d+/"), re.compile(r"^(?:chatcmpl|cmpl)-"))
_TAILS = (re.compile(r"-[0-9a-f]{8}$"), re.compile(r"-\d+$"))


def id_forms(engine_id: str) -> list[str]:
    """The engine id and what it is with each decoration taken off in turn: `r<k>/` (the fleet
    merge's), `cmpl-`/`chatcmpl-` (vLLM's), a random 8-hex suffix, the choice index `-<n>`."""
    out = [engine_id]
    s = engine_id
    for pat in _PREFIXES:
        s = pat.sub("", s, count=1)
        out.append(s)
    for pat in _TAILS:
        s = pat.sub("", s, count=1)
        out.append(s)
    return list(dict.fromkeys(x for x in out if x))


def pair_requests(base: Trace, spans: Trace) -> list[tuple[int, int]]:
    """(base row, span row) pairs: by id (the span's request id is the client's request or response
    id with vLLM's decorations, id_forms, or contains it), else in order of arrival (_in_order).
    A client whose ids are the ones it sent (meta.client_ids) is paired by them alone: one
    replica's share of a fleet's client pairs its own requests and leaves the others unpaired."""
    sid = spans.ids
    sent = bool((base.meta.get("client_ids") or {}).get("sent"))
    keys = []      # (a short id the client did not send, e.g. req0, is its own numbering: no key)
    for i, rid in enumerate(base.ids):
        ex = base.request_extra[i] if i < len(base.request_extra) else {}
        keys.append([k for k in (ex.get("response_id"), rid) if isinstance(k, str) and (len(k) >= 8 or sent)])
    index: dict[str, int] = {}
    for j, s in enumerate(sid):
        for form in id_forms(str(s)):
            index.setdefault(form, j)
    exact = [next((index[k] for k in ks if k in index), None) for ks in keys]
    rest = [i for i, j in enumerate(exact) if j is None and keys[i]]
    if rest and not sent:      # (ids the client sent decide alone; others may sit inside a longer engine id)
        for i, j in zip(rest, _containing([keys[i] for i in rest], sid)):
            exact[i] = j
    by_id = [(i, j) for i, j in enumerate(exact) if j is not None]
    if by_id and (sent or len(by_id) >= max(1, len(base.ids) // 2)):
        return by_id
    return _in_order(base, spans)


def _in_order(base: Trace, spans: Trace) -> list[tuple[int, int]]:
    """Pairs in order of arrival: the client's requests are one run of consecutive spans (all of
    them when the counts agree; with more spans, those before or after are the engine's other
    requests, e.g. the client's warm-up): the run whose send-to-arrival delays vary least (among
    those whose prompt lengths all agree, when some do). None when two runs fit about as well
    (a workload sent twice)."""
    bi = np.argsort(base.requests["arrival_ms"].to_numpy(), kind="stable")
    sj = np.argsort(spans.requests["arrival_ms"].to_numpy(), kind="stable")
    n, m = len(bi), len(sj)
    if n == m:
        return list(zip(bi.tolist(), sj.tolist()))
    if not 0 < n < m or (m - n + 1) * n > MAX_ORDER_WORK:
        return []
    a = base.requests["arrival_ms"].to_numpy(dtype=float)[bi]
    s = spans.requests["arrival_ms"].to_numpy(dtype=float)[sj]
    pa = base.requests["prompt_tokens"].to_numpy()[bi]
    ps = spans.requests["prompt_tokens"].to_numpy()[sj]
    cand = [j for j in range(m - n + 1) if np.array_equal(ps[j:j + n], pa)] or range(m - n + 1)
    spread = sorted((float(np.ptp(s[j:j + n] - a)), j) for j in cand)
    if len(spread) > 1 and spread[1][0] < 2 * spread[0][0] + 1.0:
        return []
    j = spread[0][1]
    return list(zip(bi.tolist(), sj[j:j + n].tolist()))


def align_spans(base: Trace, base_clock: dict, spans: Trace, spans_clock: dict):
    """(offset ms, uncertainty ms, how, request pairs) that put the spans on the base's clock:
    the epoch clocks' difference when both are epoch clocks, else from the paired requests."""
    pairs = pair_requests(base, spans)
    if spans_clock["kind"] == "epoch" and base_clock["kind"] == "epoch":
        return (*epoch_offset(base_clock, spans_clock), pairs)
    return (*offset_by_pairs(base, spans, pairs), pairs)


def offset_by_pairs(base: Trace, spans: Trace, pairs) -> tuple[float, float, str]:
    """offset that moves span times onto the base: base send ~ span start - network delay."""
    if not pairs:
        raise TraceError(f"cannot pair the client's {len(base.ids)} requests with the {len(spans.ids)} spans (no "
                         "shared ids, and in order of arrival they fit no one run of consecutive spans, or more "
                         "than one)")
    a = base.requests["arrival_ms"].to_numpy()
    s = spans.requests["arrival_ms"].to_numpy()
    d = np.array([a[i] - s[j] for i, j in pairs])
    return float(np.median(d)), float((d.max() - d.min()) / 2), \
        f"paired {len(pairs)} requests; offset = median(client send - span start)"


def attach_spans(out: Trace, spans: Trace, pairs, off: float):
    """Each paired client request gets the engine's view of it: arrival at the engine, its TTFT
    and E2E from the engine's arrival, and the phases, on the base's clock."""
    tk = spans.tokens
    first = tk.groupby("req")["t_ms"].min() if len(tk) else pd.Series(dtype=float)
    last = tk.groupby("req")["t_ms"].max() if len(tk) else pd.Series(dtype=float)
    arr = spans.requests["arrival_ms"].to_numpy()
    for i, j in pairs:
        ex = spans.request_extra[j] if j < len(spans.request_extra) else {}
        view = {"engine_request_id": spans.ids[j], "engine_arrival_ms": float(arr[j] + off)}
        if j in first.index:
            view["engine_ttft_ms"] = float(first[j] - arr[j])
            view["engine_e2e_ms"] = float(last[j] - arr[j])
        view.update({k: ex[k] for k in PHASES if k in ex})
        out.request_extra[i].update(view)
