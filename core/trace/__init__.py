"""The `serving-trace/1` format: the contract between the simulator, the runner, importers
and the pages. See docs/trace-format.md and data/schema/serving-trace-1.json.

Modules, by job:
  schema.py     the one declaration of every record and field; the JSON Schema file and the
                docs' field tables are generated from it (`python -m core.trace --write`)
  model.py      the in-memory Trace: one pandas table per record type
  jsoncodec.py  the JSON form: encoder and the one fast (msgspec) decoder
  validate.py   the precise path: field-by-field checks and one clear error
  parquet.py    the columnar Parquet form
  build.py      traces from the scheduler log, from given emission times
  imports/      other tools' files: benchmark clients (vLLM, SGLang, AIPerf, guidellm, inference-perf),
                vLLM's iteration log, OpenTelemetry spans and KV events (imports/__init__.py)
  open.py       open_trace: any input, sniffed from its content
  save.py       save_trace: a file (JSON, gzip, Parquet, Parquet parts) chosen by its name
"""
from __future__ import annotations

import importlib

# Submodules load on first use (PEP 562), so a streamed simulation, which needs only the
# schema and the Parquet writer, never imports pandas.
_WHERE = {
    "given_trace": "build", "new_trace": "build", "one_replica": "build",
    "trace_from_records": "build",
    "Imported": "imports.imported", "stats_comparison": "imports.imported",
    "file_summary_comparison": "imports.vllm_bench", "file_window_comparison": "imports.vllm_bench",
    "import_vllm": "imports.vllm_bench", "looks_like_vllm": "imports.vllm_bench",
    "no_gc": "jsoncodec", "parse_json_bytes": "jsoncodec", "to_doc": "jsoncodec", "trace_json": "jsoncodec",
    "save_trace": "save",
    "Trace": "model",
    "load_trace": "open", "open_trace": "open", "parse_trace": "open",
    "PARQUET_KEY": "parquet", "is_parquet": "parquet", "to_parquet_bytes": "parquet", "trace_from_parquet": "parquet",
    "BATCH_COLS": "schema", "FINISH_COLS": "schema", "KINDS": "schema", "KV_COLS": "schema",
    "PREEMPT_COLS": "schema", "REQUEST_FIELDS": "schema", "SCHEMA": "schema", "SOURCES": "schema",
    "STEP_COLS": "schema", "TOKEN_COLS": "schema", "TOKEN_SOURCES": "schema",
    "trace_from_doc": "validate",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


__all__ = sorted(_WHERE)
