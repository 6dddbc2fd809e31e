"""Writing a trace to a file, its form chosen by the name: .json, .json.gz, .parquet (the
columnar form), or a name ending in "/" (a directory of Parquet parts: a partitioned trace)."""
from __future__ import annotations

from pathlib import Path

from core.trace.jsoncodec import json_bytes
from core.trace.model import Trace
from core.trace.parquet import to_parquet_bytes, write_parquet_parts


def save_trace(trace: Trace, path: str | Path, pretty: bool = False):
    p = Path(path)
    if str(path).endswith("/"):
        write_parquet_parts(trace, p)
        return
    p.write_bytes(to_parquet_bytes(trace) if p.name.endswith(".parquet")
                  else json_bytes(trace, pretty, gz=p.name.endswith(".gz")))
