"""One replica of a measured fleet from what it left behind: our own trace (`gpu_runner serve
--trace-out`), or its server's own files (vLLM: the server log with its iteration lines, its OTLP
request spans, its KV events, its /metrics scrapes) given as a folder or as one file, joined into
one replica's trace by core.trace.imports.merge (their clocks: the spans' epoch nanoseconds, the
log's time stamps placed by them, the recorders' epoch times).

A benchmark client's file is the whole fleet's, not a replica's: inside a replica's folder it is
refused with the way to give it (`--client`). Files of a folder that no reader knows (a README, the
server's start-up script) are left out and named."""
from __future__ import annotations

from pathlib import Path

from core.errors import InputError, TraceError
from core.trace.imports.imported import Imported
from core.trace.imports.merge import merge, role
from core.trace.model import Trace
from core.trace.open import open_trace

_NOT_READ = ("not a format we read", "a directory we do not read", "we read:")


def _parts(folder: Path) -> tuple[list, list[str], list[str]]:
    """(parts, their names, files left out) of a replica's folder."""
    parts, names, skipped = [], [], []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or not p.is_file():
            continue
        try:
            x = open_trace(p)
        except InputError as e:
            if any(s in str(e) for s in _NOT_READ):
                skipped.append(p.name)
                continue
            raise
        parts.append(x)
        names.append(str(p))
    if not parts:
        raise TraceError(f"{folder}: no file of a replica we read (a server log, request spans, KV events, /metrics "
                         f"scrapes, or our own trace); it holds {', '.join(skipped[:8]) or 'nothing'}")
    return parts, names, skipped


def replica_trace(path: str | Path) -> tuple[Trace, str]:
    """(the replica's trace, one line on how it was made) from a trace file, one file of a
    server's, or a folder of a replica's files."""
    p = Path(path)
    if p.is_dir() and not any(q.suffix == ".parquet" for q in p.iterdir()):
        parts, names, skipped = _parts(p)
    else:
        x = open_trace(p)
        if isinstance(x, Trace):
            return x, "its own trace"
        parts, names, skipped = [x], [str(p)], []
    for x, n in zip(parts, names):      # (our own measured trace has requests too: it is a replica's)
        client = isinstance(x, Imported) or x.meta.get("source") == "imported"
        if client and role(x) == "requests" and len((x.trace if isinstance(x, Imported) else x).requests):
            raise TraceError(f"{n}: a benchmark client's file is the whole fleet's, not one replica's: give it once "
                             "with --client FILE")
    if len(parts) == 1 and isinstance(parts[0], Trace):
        return parts[0], "its own trace"
    if any(isinstance(x, Imported) and len(x.runs) > 1 for x in parts):
        raise TraceError(f"{path}: a file of several runs is not one replica's")
    tr, report = merge(parts, names)
    how = "; ".join(f"{Path(r['file']).name} ({r['role']})" for r in report)
    if skipped:
        how += f"; left out (not a replica's file we read): {', '.join(skipped)}"
    return tr, how
