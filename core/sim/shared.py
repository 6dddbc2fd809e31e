"""Results of independent runs written to a shared location and gathered as a dataset (issue 29 part 2):
each task (a sweep point, a search configuration; a Ray task on any node, or a local worker) writes its
own result row as one Parquet file, `part-NNNNN.parquet`, under a local directory or any pyarrow
filesystem URI (`s3://bucket/prefix`, `gs://...`, `hdfs://...`, `file:///...`); the caller reads the
location back as one pyarrow dataset. Results then never pass through the driver's memory or Ray's
object store until gathered, and stay behind for later queries (DuckDB:
`SELECT * FROM 'runs/search/*.parquet'`).

A row holds the job's position (`job`), the run's id (`run_id`), the whole result as JSON (`json`, our
own writing: parsed as data, never unpickled) and its top-level numbers and strings as columns, so that
the dataset can be queried without parsing. Each part is written under a temporary name and moved into
place.

One run per location, checked before any work: the location must be new or empty, and the run claims
it before its first job by creating CLAIM there (a local directory: exclusively, O_CREAT | O_EXCL, so of
two runs started together exactly one gets it; an object store, which has no exclusive create: the
claim is written, then the location listed, and a run that finds any other entry withdraws its own, so
two never both proceed). A location that holds anything (an earlier run's parts or claim, a file of
the user's), that cannot be written, or that another run claimed, is refused in one line before any
simulation. The gather reads back only this run's parts, by name and run id. The claim stays with the
parts (it records the run); a run that fails before writing any part withdraws it.
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid

from core.errors import ConfigError

PART = "part-{:05d}.parquet"
CLAIM = "_claim.json"        # not *.parquet: `SELECT * FROM 'DIR/*.parquet'` reads the parts only


def _fs(location: str):
    """(pyarrow filesystem, path) of a directory or URI."""
    import pyarrow.fs as pafs
    try:
        if "://" in location:
            return pafs.FileSystem.from_uri(location)
        return pafs.LocalFileSystem(), os.path.abspath(location)
    except Exception as e:           # pyarrow: ArrowInvalid for a scheme it lacks, OSError for credentials...
        raise ConfigError(f"--results {location}: not a usable location ({str(e).splitlines()[0][:200]})") from None


def _why(e: Exception) -> str:
    return getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0][:200]


def _entries(fs, path: str) -> list[str]:
    import pyarrow.fs as pafs
    return sorted(f.base_name for f in fs.get_file_info(pafs.FileSelector(path)))


def prepare(location: str, jobs: int = 0) -> str:
    """Create the location (a folder) if missing and claim it for one run (module docstring); returns
    the run's id. Refused (ConfigError, one line) when it is a file, holds anything, cannot be
    written, or another run claimed it."""
    import pyarrow.fs as pafs
    fs, path = _fs(location)
    run = uuid.uuid4().hex
    claim = json.dumps({"run_id": run, "jobs": jobs, "host": socket.gethostname(), "pid": os.getpid(),
                        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            raise ConfigError(f"--results {location}: a file, expected a directory (or a new name)")
        if info.type == pafs.FileType.NotFound:
            fs.create_dir(path, recursive=True)
        else:
            _refuse_held(location, _entries(fs, path))
        if isinstance(fs, pafs.LocalFileSystem):
            fd = os.open(os.path.join(path, CLAIM), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(claim)
        else:
            mine = f"{CLAIM}.{run}"
            with fs.open_output_stream(f"{path}/{mine}") as f:
                f.write(claim.encode())
            others = [e for e in _entries(fs, path) if e != mine]
            if others:
                fs.delete_file(f"{path}/{mine}")
                _refuse_held(location, others)
    except FileExistsError:
        raise ConfigError(f"--results {location}: claimed by another run started at the same time ({CLAIM}); give "
                          "each run its own location") from None
    except OSError as e:
        raise ConfigError(f"--results {location}: cannot write there ({_why(e)}); give a location you can "
                          "write") from None
    return run


def _refuse_held(location: str, held: list[str]) -> None:
    parts = [f for f in held if f.startswith("part-") and f.endswith(".parquet")]
    if parts:
        raise ConfigError(f"--results {location}: already holds {len(parts)} result part(s) ({parts[0]}, ...) of an "
                          "earlier run; give a new location")
    claims = [f for f in held if f.startswith(CLAIM)]
    if claims:
        raise ConfigError(f"--results {location}: claimed by another run ({claims[0]}); give each run its own "
                          "location")
    if held:
        raise ConfigError(f"--results {location}: holds {len(held)} other file(s) ({held[0]!r}, ...); give a new or "
                          "empty location")


def release(location: str, run: str) -> None:
    """Withdraw this run's claim when no part was written (a run that failed before its first result),
    so the location can be used again; a location with parts keeps its claim."""
    fs, path = _fs(location)
    try:
        held = _entries(fs, path)
        if any(f.startswith("part-") for f in held):
            return
        for name in (CLAIM, f"{CLAIM}.{run}"):
            if name in held and run in _read(fs, f"{path}/{name}"):
                fs.delete_file(f"{path}/{name}")
    except OSError:
        pass            # best effort: the run's own error is the one to report


def _read(fs, path: str) -> str:
    with fs.open_input_stream(path) as f:
        return f.read(1 << 16).decode(errors="replace")


def _row(index: int, run: str, result: dict) -> dict:
    row = {"job": [index], "run_id": [run], "json": [json.dumps(result, allow_nan=True, default=str)]}
    for k, v in result.items():
        if k not in row and isinstance(v, (int, float, str)):     # (bools are ints)
            row[k] = [v]
    return row


def write_result(fn, job: dict, index: int, location: str, run: str = "") -> str:
    """Run fn(**job) and write its result row to `location` (a module-level function: a Ray task or a
    worker process runs it). Returns the part's name (small: what travels back)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    result = fn(**job)
    fs, path = _fs(location)
    name = PART.format(index)
    tmp = f"{path}/.{name}.tmp"
    try:
        pq.write_table(pa.table(_row(index, run, result)), tmp, filesystem=fs)
        fs.move(tmp, f"{path}/{name}")
    except OSError as e:
        raise ConfigError(f"--results {location}: cannot write {name} ({_why(e)})") from None
    return name


def gather(location: str, n: int, run: str | None = None) -> list:
    """The results of jobs 0..n-1 of this run (`run`: its id), read back from their parts, in job order."""
    import pyarrow.dataset as ds
    fs, path = _fs(location)
    names = [PART.format(k) for k in range(n)]
    try:
        held = set(_entries(fs, path))
        missing = [k for k, name in enumerate(names) if name not in held]
        if missing:
            raise ConfigError(f"--results {location}: {len(missing)} of {n} result parts missing (job {missing[0]}, "
                              "...)")
        table = ds.dataset([f"{path}/{name}" for name in names], filesystem=fs,
                           format="parquet").to_table(columns=["job", "run_id", "json"])
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"--results {location}: cannot read the results back ({_why(e)})") from None
    jobs = table.column("job").to_pylist()
    if sorted(jobs) != list(range(n)) or (run is not None and set(table.column("run_id").to_pylist()) != {run}):
        raise ConfigError(f"--results {location}: parts of another run mixed in")
    by_job = dict(zip(jobs, table.column("json").to_pylist()))
    return [json.loads(by_job[k]) for k in range(n)]
