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
  engines.py    vLLM / SGLang benchmark result files
  open.py       open_trace: any input, sniffed from its content
"""
from __future__ import annotations

from core.trace.build import given_trace, new_trace, trace_from_log
from core.trace.engines import Imported, file_summary_comparison, file_window_comparison, import_vllm, looks_like_vllm
from core.trace.jsoncodec import no_gc, parse_json_bytes
from core.trace.model import Trace
from core.trace.open import load_trace, open_trace, parse_trace
from core.trace.parquet import PARQUET_KEY, is_parquet, to_parquet_bytes, trace_from_parquet
from core.trace.schema import (
    BATCH_COLS,
    FINISH_COLS,
    KINDS,
    KV_COLS,
    PREEMPT_COLS,
    REQUEST_FIELDS,
    SCHEMA,
    SOURCES,
    STEP_COLS,
    TOKEN_COLS,
    TOKEN_SOURCES,
)
from core.trace.validate import trace_from_doc

__all__ = ["BATCH_COLS", "FINISH_COLS", "Imported", "KINDS", "KV_COLS", "PARQUET_KEY", "PREEMPT_COLS",
           "REQUEST_FIELDS", "SCHEMA", "SOURCES", "STEP_COLS", "TOKEN_COLS", "TOKEN_SOURCES", "Trace",
           "file_summary_comparison", "file_window_comparison", "given_trace", "import_vllm", "is_parquet",
           "load_trace", "looks_like_vllm",
           "new_trace", "no_gc", "open_trace", "parse_json_bytes", "parse_trace", "to_parquet_bytes",
           "trace_from_doc", "trace_from_log", "trace_from_parquet"]
