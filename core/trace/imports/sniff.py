"""Which tool wrote a file, from its content (never its name), and the importer that reads it:
one declared table (`IMPORTERS`: kind, the shape it comes in, its recogniser, its reader, its
role in a merge), iterated in order by every entry point (one JSON document, JSON lines, other
text, a directory). Every import result says its kind (`Imported.kind`); merge dispatches on
kinds, and each kind's clock alignment lives beside its importer.

Read: vLLM / SGLang bench results (vllm_bench.py); AIPerf's profile_export.jsonl and summary
(aiperf.py); guidellm's benchmarks.json / .yaml (guidellm.py); inference-perf's per-request and
summary reports (inference_perf.py); vLLM's server log with iteration details (vllm_log.py);
OpenTelemetry spans as OTLP/JSON lines (otlp.py); vLLM KV-cache events as recorded by
`gpu_runner observe` or bench/vllm_cpu/record_telemetry.py (kv_events.py); and directories:
AIPerf artifact directories, inference-perf report directories, Parquet parts of one trace.

A file of a known tool that we do not read (a CSV export, a config, AIPerf's inputs.json, ...)
gets one line naming what it looks like and what we read instead, never a schema complaint.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from core.errors import InputError, TraceError, gunzip, read_input_file, short
from core.trace.imports import aiperf, guidellm, inference_perf, kv_events, otlp, scrapes, vllm_bench, vllm_log
from core.trace.imports.imported import Imported, checked
from core.trace.imports.vllm_bench import import_vllm, looks_like_vllm
from core.trace.jsoncodec import check_containers, too_deep

WE_READ = ("we read: our serving-trace/1 (JSON, gzip, Parquet), vllm bench serve / SGLang results, AIPerf "
           "profile_export.jsonl (and its summary and time slices), guidellm benchmarks.json/.yaml, inference-perf "
           "per_request_lifecycle_metrics.json (and its summaries and stage reports), vLLM's iteration log, OTLP "
           "spans (JSON lines or a protobuf export body), recorded KV events")
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 1_000          # nesting (collections within collections) of a YAML document
MAX_YAML_NODES = 10_000_000     # values of a YAML document once its aliases are expanded


def guarded(fn):
    """An importer's unexpected failure on a malformed file (a field of the wrong shape that no
    check named) becomes one line naming the file, never a traceback."""
    import functools

    @functools.wraps(fn)
    def call(*args, **kw):
        try:
            return fn(*args, **kw)
        except (AttributeError, TypeError, KeyError, IndexError, ValueError, OverflowError) as e:
            if isinstance(e, TraceError):
                raise
            name = args[1] if len(args) > 1 and isinstance(args[1], str) else str(args[0]) if args else "input"
            if isinstance(e, InputError):      # a check that words its problem (a workload's): its own line
                raise TraceError(str(e) if str(e).startswith(name) else f"{name}: {e}") from None
            raise TraceError(f"{name}: a field has an unexpected shape for the format it looks like "
                             f"({type(e).__name__}: {short(str(e), 80)})") from None
    return call


def _keys(doc) -> str:
    return ", ".join(list(doc)[:8]) + (", ..." if len(doc) > 8 else "")


@dataclass(frozen=True)
class Importer:
    """One kind of file another tool writes. `shape`: what `recognise` and `read` take: "doc" (one
    JSON document), "lines" (JSON lines: recognised by their first object), "text" (other text),
    "binary" (bytes no text importer reads: a protobuf body), "dir" (a directory). `read(x, name,
    path)` returns an Imported (or, for a file we know but do not read, raises TraceError with one
    line saying what it is). `role`: what the file adds to a
    merged run (core.trace.imports.merge): requests (a client's), spans (the engine's view of each
    request), steps (the engine's iteration log), telemetry (KV events, /metrics samples), or
    none (nothing: refused)."""
    kind: str
    shape: str
    recognise: Callable[[Any], bool]
    read: Callable[..., Any]
    role: str


def _is_sweep_summary(doc) -> bool:
    return isinstance(doc, list) and bool(doc) and all(looks_like_vllm(x) for x in doc[:50])


def _sweep_summary(doc, name, path):
    raise TraceError(f"{name}: looks like a vllm bench sweep point's summary.json (that point's runs); open the "
                     "sweep's directory (every point and run) or one of its run=N.json files")


def _aiperf_summary_doc(doc, name, path):
    beside = path.parent / "profile_export.jsonl" if path is not None else None
    if beside is not None and beside.is_file():
        return _aiperf_records(beside, doc)
    return aiperf.import_summary(doc, name)


def _is_otlp_lines(first) -> bool:
    return otlp.looks_like_otlp_json(first) or otlp.looks_like_collector_lines(first) or otlp.looks_like_bodies(first)


def _aiperf_record_lines(lines, name, path):
    return aiperf.import_records(lines, name, _aiperf_summary(path), _aiperf_scrapes(path), _aiperf_export(path))


def _aiperf_raw_lines(lines, name, path):
    imp = aiperf.import_records(aiperf.raw_to_records(lines, name), name, _aiperf_summary(path),
                                _aiperf_scrapes(path), _aiperf_export(path))
    imp.what = "raw records (profile_export_raw.jsonl)"
    imp.notes.append("Read from the raw export: token times are the content responses' perf_ns, output tokens "
                     "the stream's usage.completion_tokens.")
    return imp


def _vllm_result_lines(lines, name, path):
    """A file of results, one per run (SGLang bench_serving appends one per run)."""
    docs = [d for d in lines if looks_like_vllm(d)]
    if len(docs) == 1:
        return import_vllm(docs[0], name)
    runs = [import_vllm(d, f"{name} line {k + 1}") for k, d in enumerate(docs)]
    for k, r in enumerate(runs):
        r.run_label, r.runs = f"line {k + 1}", runs
        r.notes.insert(0, f"{name} holds {len(runs)} benchmark results (one per line); this is line {k + 1}.")
    return runs[0]


def _aiperf_csv(text, name, path):
    kind = "server-metrics CSV (aggregates)" if "Server Metrics" in text[:200] else "CSV export"
    raise TraceError(f"{name}: looks like AIPerf's {kind}; per-request data is in profile_export.jsonl beside it")


def _is_sweep_csv(text) -> bool:
    first = text.split("\n", 1)[0]
    return "mean_ttft_ms" in first or ("ttfts" in first and "date" in first)


def _sweep_csv(text, name, path):
    raise TraceError(f"{name}: looks like vllm bench sweep's summary.csv (every run's result, lists as Python "
                     "text); open the sweep's directory instead")


def _vllm_log_without_steps(text, name, path):
    raise TraceError(f"{name}: looks like a vLLM server log without iteration lines (vLLM writes one per step "
                     "with --enable-logging-iteration-details); " + WE_READ)


def _aiperf_dir(d, name, path):
    f = d / "profile_export.jsonl"
    return _aiperf_records(f, _aiperf_summary(f))


def _inference_perf_dir(d, name, path):
    f = d / "per_request_lifecycle_metrics.json"
    doc = json_doc(gunzip(read_input_file(f, "inference-perf report", TraceError), f.name, TraceError), f.name)
    if not inference_perf.looks_like_per_request(doc):
        raise TraceError(f"{f}: expected inference-perf's per-request list")
    return _read_as("inference-perf-requests", doc, f.name, f)


def _guidellm_dir(d, name, path):
    for file in ("benchmarks.json", "benchmarks.yaml"):
        f = d / file
        if f.is_file():
            raw = gunzip(read_input_file(f, "guidellm report", TraceError), f.name, TraceError)
            doc = _yaml(raw.decode("utf-8", "replace"), f.name) if file.endswith(".yaml") else json_doc(raw, f.name)
            return import_doc(doc, f.name, f)


def _sweep_dir(d, name, path):
    runs = vllm_bench.sweep_runs(d)

    def read(f):
        raw = gunzip(read_input_file(f, "sweep run", TraceError), f.name, TraceError)
        return json_doc(raw, f"{d.name}/{f.parent.name}/{f.name}")
    return vllm_bench.import_sweep(d, runs, read)


def _parquet_dir(d, name, path):
    from core.trace.parquet import trace_from_parquet_dir
    return trace_from_parquet_dir(d)


# Every kind of file we recognise, in the order each entry point tries them (first match reads).
IMPORTERS: tuple[Importer, ...] = (
    # one JSON document
    Importer("vllm-bench", "doc", looks_like_vllm, lambda d, n, p: import_vllm(d, n), "requests"),
    Importer("guidellm", "doc", guidellm.looks_like_report, lambda d, n, p: guidellm.import_report(d, n),
             "requests"),
    Importer("aiperf-summary", "doc", aiperf.looks_like_summary, _aiperf_summary_doc, "requests"),
    Importer("vllm-bench-sweep-point", "doc", _is_sweep_summary, _sweep_summary, "none"),
    Importer("inference-perf-requests", "doc", inference_perf.looks_like_per_request,
             lambda d, n, p: inference_perf.import_per_request(d, n, _beside_summary(p)), "requests"),
    Importer("inference-perf-summary", "doc", inference_perf.looks_like_summary,
             lambda d, n, p: inference_perf.import_summary(d, n), "requests"),
    Importer("inference-perf-stage-report", "doc", inference_perf.looks_like_stage_report,
             lambda d, n, p: inference_perf.import_stage_report(d, n), "requests"),
    Importer("aiperf-timeslices", "doc", aiperf.looks_like_timeslices, lambda d, n, p: aiperf.import_timeslices(d, n),
             "requests"),
    Importer("aiperf-phase-manifest", "doc", aiperf.looks_like_phase_manifest, aiperf.phase_manifest, "none"),
    Importer("otlp-spans", "doc", otlp.looks_like_otlp_json, lambda d, n, p: otlp.import_otlp_lines([d], n), "spans"),
    # JSON lines (recognised by the first object; one JSON document that is such a line reads as one line)
    Importer("aiperf-records", "lines", aiperf.looks_like_record, _aiperf_record_lines, "requests"),
    Importer("aiperf-raw", "lines", aiperf.looks_like_raw, _aiperf_raw_lines, "requests"),
    Importer("aiperf-scrapes", "lines", aiperf.looks_like_scrape, lambda x, n, p: aiperf.import_scrapes(x, n),
             "telemetry"),
    Importer("otlp-spans", "lines", _is_otlp_lines, lambda x, n, p: otlp.import_otlp_lines(x, n), "spans"),
    Importer("kv-events", "lines", kv_events.looks_like_capture, lambda x, n, p: kv_events.import_capture(x, n),
             "telemetry"),
    Importer("metrics-scrapes", "lines", scrapes.looks_like_scrape, lambda x, n, p: scrapes.import_scrapes(x, n),
             "telemetry"),
    Importer("vllm-bench", "lines", looks_like_vllm, _vllm_result_lines, "requests"),
    # other text
    Importer("vllm-log", "text", vllm_log.looks_like_iteration_log,
             lambda t, n, p: vllm_log.import_iteration_log(t, n), "steps"),
    Importer("aiperf-csv", "text", lambda t: t.startswith("# AIPerf"), _aiperf_csv, "none"),
    Importer("aiperf-timeslices", "text", lambda t: t.startswith(aiperf.TIMESLICES_CSV),
             lambda t, n, p: aiperf.import_timeslices(aiperf.timeslices_from_csv(t, n), n), "requests"),
    Importer("vllm-bench-sweep-csv", "text", _is_sweep_csv, _sweep_csv, "none"),
    Importer("vllm-log-without-steps", "text", vllm_log.looks_like_vllm_log, _vllm_log_without_steps, "none"),
    Importer("yaml", "text", lambda t: _looks_like_yaml(t), lambda t, n, p: import_doc(_yaml(t, n), n, p),
             "requests"),     # (a YAML report: read as the JSON document it holds, which names its kind)
    Importer("csv", "text", lambda t: bool(_CSV_HEAD.match(t[:4096])), lambda t, n, p: _foreign_csv(t, n), "none"),
    # other bytes (not UTF-8 text)
    Importer("otlp-spans", "binary", otlp.looks_like_protobuf_export,
             lambda b, n, p: otlp.import_spans(otlp.spans_of(otlp.otlp_json(b)), n, "an OTLP protobuf export body"),
             "spans"),
    # directories
    Importer("aiperf-records", "dir", lambda d: (d / "profile_export.jsonl").is_file(), _aiperf_dir, "requests"),
    Importer("inference-perf-requests", "dir", lambda d: (d / "per_request_lifecycle_metrics.json").is_file(),
             _inference_perf_dir, "requests"),
    Importer("guidellm", "dir", lambda d: any((d / f).is_file() for f in ("benchmarks.json", "benchmarks.yaml")),
             _guidellm_dir, "requests"),
    Importer("vllm-bench-sweep", "dir", lambda d: bool(vllm_bench.sweep_runs(d)), _sweep_dir, "requests"),
    Importer("serving-trace-parts", "dir", lambda d: any(d.glob("*.parquet")) or (d / "_meta.json").exists(),
             _parquet_dir, "requests"),
)
KINDS = {imp.kind: imp for imp in IMPORTERS}       # (a kind that comes in several shapes: one role)


def role_of(kind: str) -> str:
    """What a file of this kind adds to a merged run (our own serving traces: requests)."""
    imp = KINDS.get(kind)
    return imp.role if imp is not None else "requests"


def _match(shape: str, x) -> Importer | None:
    return next((imp for imp in IMPORTERS if imp.shape == shape and imp.recognise(x)), None)


def _read_with(imp: Importer, x, name: str, path: Path | None):
    import numpy as np
    with np.errstate(all="ignore"):   # an overflow to inf or nan is refused by checked(), not warned about
        out = imp.read(x, name, path)
    if isinstance(out, Imported):
        checked(out, name)          # every importer's trace held to the readers' checks
        if not out.kind:
            out.kind = imp.kind
            for r in out.runs:
                r.kind = r.kind or imp.kind
    return out


def _read_as(kind: str, x, name: str, path: Path | None):
    imp = next(i for i in IMPORTERS if i.kind == kind and i.shape in ("doc", "lines"))
    return _read_with(imp, x, name, path)


@guarded
def import_doc(doc, name: str, path: Path | None = None) -> Imported | None:
    """An Imported for a JSON document another tool wrote; None for one of ours (a `schema`
    key: the caller validates it); one line (TraceError) for anything else."""
    if isinstance(doc, dict) and "schema" in doc:
        return None
    imp = _match("doc", doc)
    if imp is not None:
        return _read_with(imp, doc, name, path)
    imp = _match("lines", doc)
    if imp is not None:               # a file of JSON lines with one line
        return _read_with(imp, [doc], name, path)
    raise TraceError(f"{name}: {foreign(doc)}")


def foreign(doc) -> str:
    """What a JSON document we do not read looks like, in one line."""
    if isinstance(doc, dict):
        if "aiperf_version" in doc and isinstance(doc.get("metrics"), dict) and "summary" in doc:
            return ("looks like AIPerf's server-metrics aggregate (server_metrics_export.json): statistics per "
                    "metric, no time series; per-request data is in profile_export.jsonl beside it")
        data = doc.get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict) \
                and {"session_id", "payloads"} <= data[0].keys():
            return ("looks like AIPerf's inputs.json (the request bodies it sent, no results); per-request data is "
                    "in profile_export.jsonl beside it")
        if "aiperf_version" in doc:
            return "looks like an AIPerf file that holds no per-request results; per-request data is in " \
                   "profile_export.jsonl"
        if "reports" in doc and "global" in doc:
            return ("looks like inference-perf's validation.json; per-request data is in "
                    "per_request_lifecycle_metrics.json beside it")
        if "load_summary" in doc:
            return "looks like an inference-perf stage report without successes; " + WE_READ
        return f"not a format we read (an object with keys {_keys(doc)}); {WE_READ}"
    if isinstance(doc, list):
        first = doc[0] if doc else None
        inner = f" of objects with keys {_keys(first)}" if isinstance(first, dict) else ""
        return f"not a format we read (a list of {len(doc)} items{inner}); {WE_READ}"
    return f"not a format we read (a {type(doc).__name__}: {short(doc)}); {WE_READ}"


def _beside(path: Path | None, file: str, looks_like) -> dict | None:
    """The JSON document `file` in the same directory as `path`, when it is what `looks_like`
    accepts (a companion file: a tool's summary beside its per-request records); else None."""
    f = None if path is None else path.parent / file
    if f is None or not f.is_file():
        return None
    try:
        doc = orjson.loads(read_input_file(f, file, TraceError))
    except orjson.JSONDecodeError:
        return None
    return doc if looks_like(doc) else None


def _beside_summary(path: Path | None) -> dict | None:
    return _beside(path, "summary_lifecycle_metrics.json", inference_perf.looks_like_summary)


def _aiperf_summary(path: Path | None) -> dict | None:
    return _beside(path, "profile_export_aiperf.json", aiperf.looks_like_summary)


def _aiperf_export(path: Path | None) -> dict | None:
    """server_metrics_export.json beside an AIPerf file (its phase time range), if any."""
    return _beside(path, "server_metrics_export.json", lambda d: isinstance(d, dict))


def _aiperf_scrapes(path: Path | None) -> list | None:
    if path is None:
        return None
    f = path.parent / "server_metrics_export.jsonl"
    if not f.is_file():
        return None
    lines = json_lines(gunzip(read_input_file(f, "AIPerf server metrics", TraceError), f.name, TraceError), f.name)
    return [x for x in lines if aiperf.looks_like_scrape(x)] or None


def _aiperf_records(path: Path, summary: dict | None) -> Imported:
    lines = json_lines(gunzip(read_input_file(path, "AIPerf export", TraceError), path.name, TraceError), path.name)
    if lines and aiperf.looks_like_raw(lines[0]):
        return import_lines(lines, path.name, path)
    return aiperf.import_records(lines, path.name, summary, _aiperf_scrapes(path), _aiperf_export(path))


def json_doc(raw: bytes, name: str):
    check_containers(raw, name)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise TraceError(f"{name}: not valid JSON ({e})") from None


def json_lines(raw: bytes, name: str) -> list:
    check_containers(raw, name)
    out = []
    for k, ln in enumerate(raw.splitlines()):
        if not ln.strip():
            continue
        try:
            out.append(orjson.loads(ln))
        except orjson.JSONDecodeError as e:
            if "depth limit" in str(e):
                raise TraceError(too_deep(ln, f"{name}: line {k + 1}")) from None
            raise TraceError(f"{name}: line {k + 1}: not valid JSON ({e})") from None
    return out


@guarded
def _results_with_infinity(raw: bytes) -> list | None:
    """Benchmark results written with Python's json, one per line, which spells an unbounded
    request rate `Infinity`: read with the non-finite constants allowed, only when every line
    is such a result (our own traces never take this path: they refuse non-finite numbers)."""
    import json
    out = []
    try:
        for ln in raw.decode("utf-8").splitlines():
            if ln.strip():
                out.append(json.loads(ln, parse_constant=float))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return out if out and all(looks_like_vllm(d) for d in out) else None


@guarded
def import_lines(lines: list, name: str, path: Path | None = None) -> Imported:
    first = next((x for x in lines if isinstance(x, dict)), None)
    if first is None:
        raise TraceError(f"{name}: JSON lines, but no line is an object; {WE_READ}")
    imp = _match("lines", first)
    if imp is None:
        raise TraceError(f"{name}: JSON lines, but not a format we read (first record's keys: {_keys(first)}); "
                         f"{WE_READ}")
    return _read_with(imp, lines, name, path)


_CSV_HEAD = re.compile(r"^[^\n,]+(,[^\n,]*){3,}\r?\n")


@guarded
def import_text(data: bytes, name: str, path: Path | None = None) -> Imported | None:
    """An Imported for text another tool wrote that is not one JSON document (the caller has
    parsed it once and found it is not): JSON lines, a server log, YAML, a CSV we know; None when
    it looks like JSON after all (the caller words what is wrong with it)."""
    raw = gunzip(data, name, TraceError)
    head = raw[:65536].lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head:
        return None
    if head[:1] in (b"{", b"["):
        if head[:1] == b"{" and b"\n" in raw.strip():
            try:
                first = orjson.loads(raw.lstrip(b"\xef\xbb\xbf \t\r\n").split(b"\n", 1)[0])
            except orjson.JSONDecodeError:
                first = None
            if isinstance(first, dict):
                return import_lines(json_lines(raw, name), name, path)
        if head[:1] == b"{":
            lines = _results_with_infinity(raw)
            if lines:    # SGLang bench_serving: one result per run, Python's json (Infinity for an unbounded rate)
                return import_lines(lines, name, path)
        return None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        text, what = None, f"not UTF-8 text (byte {e.start}) and not Parquet"
        # a log with a few stray bytes (a terminal's escape, a cut write) is still a log: read it with
        # them replaced when a text format recognises it, and say so
        lenient = raw.decode("utf-8-sig", errors="replace")
        bad = lenient.count("\ufffd") - raw.count("\ufffd".encode())
        if bad <= max(16, len(raw) // 10_000):
            imp = _match("text", lenient)
            if imp is not None:
                got = _read_with(imp, lenient, name, path)
                got.notes.append(f"{name}: {bad} byte(s) that are not UTF-8 (the first at byte {e.start}) were "
                                 "read as U+FFFD")
                return got
    imp = _match("text", text) if text is not None else None
    if imp is not None:
        return _read_with(imp, text, name, path)
    imp = _match("binary", raw)
    if imp is not None:
        return _read_with(imp, raw, name, path)
    if text is not None:
        what = f"not a format we read (text starting {short(text.strip()[:40])})"
    raise TraceError(f"{name}: {what}; {WE_READ}")


def _looks_like_yaml(text: str) -> bool:
    for ln in text.splitlines()[:50]:
        s = ln.strip()
        if not s or s.startswith("#") or s == "---":
            continue
        return bool(re.match(r"^[A-Za-z_][\w.-]*:(\s|$)", s))
    return False


def _yaml(text: str, name: str):
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml's: fast, and its parser does not recurse
    try:
        _yaml_bounds(yaml.parse(text, Loader=loader), name)
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise TraceError(f"{name}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None


def _yaml_bounds(events, name: str):
    """Refuse, from the parser's events and before any value is built, a YAML document that nests
    deeper than MAX_YAML_DEPTH or whose aliases expand it past MAX_YAML_NODES nodes (a 1 kB file can
    describe 3**30 leaves: the loader shares aliased values, but whatever walks the value walks them
    all), or that has more than MAX_YAML_ALIASES aliases or an alias inside its own anchor."""
    import yaml
    size: dict[str, int] = {}       # anchor -> nodes under it, aliases expanded
    open_: list[tuple[int, str | None]] = []   # (nodes before it, anchor) of each collection open
    total = aliases = 0
    for ev in events:
        line = f"line {ev.start_mark.line + 1}" if ev.start_mark else "its end"
        if isinstance(ev, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise TraceError(f"{name}: YAML with more than {MAX_YAML_ALIASES} aliases ({line}); at most "
                                 f"{MAX_YAML_ALIASES} are read")
            if ev.anchor not in size:
                what = "inside its own anchor" if any(a == ev.anchor for _, a in open_) else "to no anchor"
                raise TraceError(f"{name}: YAML alias *{ev.anchor[:40]} {what} ({line})")
            total += size[ev.anchor]
        elif isinstance(ev, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            total += 1
            if isinstance(ev, yaml.CollectionStartEvent):
                open_.append((total - 1, ev.anchor))
                if len(open_) > MAX_YAML_DEPTH:
                    raise TraceError(f"{name}: YAML nested more than {MAX_YAML_DEPTH:,} levels deep ({line})")
            elif ev.anchor:
                size[ev.anchor] = 1
        elif isinstance(ev, yaml.CollectionEndEvent):
            before, anchor = open_.pop()
            if anchor:
                size[anchor] = total - before
        if total > MAX_YAML_NODES:
            raise TraceError(f"{name}: YAML whose aliases expand it past {MAX_YAML_NODES:,} values ({line}); "
                             "at most that many are read")


def _foreign_csv(text: str, name: str) -> Imported:
    head = text.split("\n", 3)
    first = ",".join(head[:3])
    if "Run Info" in first and "Benchmark" in first:
        what = ("guidellm's CSV summary (one row per benchmark, no requests); its benchmarks.json or .yaml holds "
                "the per-request records")
    elif "AIPerf" in text[:500] and "Server Metrics" in text[:500]:
        what = "AIPerf's server-metrics CSV (aggregates); per-request data is in profile_export.jsonl"
    elif "Metric" in head[0] and ("avg" in head[0] or "p99" in head[0]):
        what = "AIPerf's CSV summary (profile_export_aiperf.csv); per-request data is in profile_export.jsonl"
    elif "arrived_at" in head[0]:
        what = "a Vidur-style workload (a workload, not a trace): open it on the Schedules page or simulate it"
    else:
        raise TraceError(f"{name}: not a format we read (a CSV file with header {short(head[0], 60)}); {WE_READ}")
    raise TraceError(f"{name}: looks like {what}")


@guarded
def import_directory(d: Path) -> object:
    """A directory: Parquet parts of one trace, an AIPerf artifact directory, an inference-perf
    report directory, a guidellm output directory, a vllm bench sweep."""
    imp = _match("dir", d)
    if imp is not None:
        return _read_with(imp, d, d.name, d)
    names = sorted(p.name for p in d.iterdir())[:8]
    raise TraceError(f"{d}: a directory we do not read (it holds {', '.join(names) or 'nothing'}); we read "
                     "directories of Parquet parts of one trace, AIPerf artifact directories (profile_export.jsonl), "
                     "inference-perf report directories (per_request_lifecycle_metrics.json), guidellm output "
                     "directories (benchmarks.json) and vllm bench sweep directories (<point>/run=N.json)")
