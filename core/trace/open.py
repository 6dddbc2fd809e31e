"""One way in for every trace input. The content decides, never the file name:
- Parquet magic `PAR1`: the columnar form (parquet.py);
- JSON, gzip-compressed or not (detected from the bytes): a document with a `schema` key is a
  serving trace (jsoncodec.py, validate.py);
- anything else another tool wrote (imports/sniff.py's importer table): benchmark clients'
  files, vLLM's iteration log, spans and KV events become an `Imported` carrying its trace and
  its kind; a file of a known tool that we do not read gets one line saying what it is and what
  we read instead. A JSON document is parsed once (the fast trace decoder refuses a document
  without our `schema` key before parsing it);
- a directory: Parquet parts of one trace, or a tool's output directory (imports/sniff.py).
"""
from __future__ import annotations

from pathlib import Path

import orjson

from core.errors import TraceError, gunzip, read_input_file
from core.trace.imports.imported import Imported
from core.trace.imports.sniff import import_directory, import_doc, import_text
from core.trace.jsoncodec import check_containers, no_gc, parse_json_bytes
from core.trace.jsonstream import decode_fast
from core.trace.model import Trace
from core.trace.parquet import is_parquet, trace_from_parquet
from core.trace.validate import trace_from_doc

_NOT_ONE_DOCUMENT = object()


def _read(data: bytes | str, name: str, engines: bool, path: Path | None = None) -> Trace | Imported:
    with no_gc():
        if isinstance(data, str):  # JSON text
            doc = parse_json_bytes(data, name)
        elif is_parquet(data):
            return trace_from_parquet(data, name)
        else:
            tr = decode_fast(data, name)   # inflates gzip as it decodes (bounded); refuses others unparsed
            if tr is not None:
                return tr
            data = gunzip(data, name, TraceError)    # once, for the paths below (bounded, counted first)
            check_containers(data, name)             # (not our trace format: parsed whole below)
            try:
                doc = orjson.loads(data)             # the one parse of a JSON document
            except orjson.JSONDecodeError:
                doc = _NOT_ONE_DOCUMENT
            if doc is _NOT_ONE_DOCUMENT:
                if engines:
                    imp = import_text(data, name, path)   # JSON lines, logs, YAML, CSV
                    if imp is not None:
                        return imp
                doc = parse_json_bytes(data, name)   # not JSON after all: words what is wrong
        if engines:
            imp = import_doc(doc, name, path)
            if imp is not None:
                return imp
        return trace_from_doc(doc, name)


def open_trace(src: str | Path | bytes, name: str | None = None) -> Trace | Imported:
    """A Trace, or an engine's benchmark result as an Imported (its `.trace`, `.failed`,
    `.file_summary`, `.notes`), from a path or the file's bytes; `name` labels errors."""
    if isinstance(src, (str, Path)):
        if Path(src).is_dir():   # Parquet parts of one trace, or a tool's output directory
            return import_directory(Path(src))
        return _read(read_input_file(src, "trace", TraceError), name or Path(src).name, engines=True, path=Path(src))
    return _read(bytes(src), name or "trace", engines=True)


def parse_trace(data: bytes | str, name: str = "trace") -> Trace:
    """A serving trace only (engine results are refused): JSON bytes or text, gzip, Parquet."""
    return _read(data, name, engines=False)


def load_trace(path: str | Path) -> Trace:
    if Path(path).is_dir():
        from core.trace.parquet import trace_from_parquet_dir
        return trace_from_parquet_dir(path)
    return parse_trace(read_input_file(path, "trace", TraceError), Path(path).name)
