"""Results of independent runs written to a shared location and gathered as a dataset (issue 29 part 2):
each task (a sweep point, a search configuration; a Ray task on any node, or a local worker) writes its
own result row as one Parquet file, `part-NNNNN.parquet`, under a local directory or any pyarrow
filesystem URI (`s3://bucket/prefix`, `gs://...`, `hdfs://...`, `file:///...`); the caller reads the
location back as one pyarrow dataset. Results then never pass through the driver's memory or Ray's
object store until gathered, and stay behind for later queries (DuckDB:
`SELECT * FROM 'runs/search/*.parquet'`).

A row holds the job's position (`job`), the whole result as JSON (`json`, our own writing: parsed as
data, never unpickled) and its top-level numbers and strings as columns, so that the dataset can be
queried without parsing. A location that already holds parts is refused: a run never mixes with, or
overwrites, an earlier one. Each part is written under a temporary name and moved into place.
"""
from __future__ import annotations

import json

from core.errors import ConfigError

PART = "part-{:05d}.parquet"


def _fs(location: str):
    """(pyarrow filesystem, path) of a directory or URI."""
    import pyarrow.fs as pafs
    try:
        if "://" in location:
            return pafs.FileSystem.from_uri(location)
        import os
        return pafs.LocalFileSystem(), os.path.abspath(location)
    except Exception as e:           # pyarrow: ArrowInvalid for a scheme it lacks, OSError for credentials...
        raise ConfigError(f"--results {location}: not a usable location ({str(e).splitlines()[0][:200]})") from None


def prepare(location: str) -> None:
    """Create the location (a folder) if missing; refuse one that already holds parts."""
    import pyarrow.fs as pafs
    fs, path = _fs(location)
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            raise ConfigError(f"--results {location}: a file, expected a directory (or a new name)")
        if info.type == pafs.FileType.NotFound:
            fs.create_dir(path, recursive=True)
            return
        held = [f.base_name for f in fs.get_file_info(pafs.FileSelector(path))
                if f.base_name.startswith("part-") and f.base_name.endswith(".parquet")]
    except OSError as e:
        raise ConfigError(f"--results {location}: cannot use it ({str(e).splitlines()[0][:200]})") from None
    if held:
        raise ConfigError(f"--results {location}: already holds {len(held)} result part(s) ({held[0]}, ...) of an "
                          "earlier run; give a new location")


def _row(index: int, result: dict) -> dict:
    row = {"job": [index], "json": [json.dumps(result, allow_nan=True, default=str)]}
    for k, v in result.items():
        if k not in row and isinstance(v, (int, float, str)):     # (bools are ints)
            row[k] = [v]
    return row


def write_result(fn, job: dict, index: int, location: str) -> str:
    """Run fn(**job) and write its result row to `location` (a module-level function: a Ray task or a
    worker process runs it). Returns the part's name (small: what travels back)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    result = fn(**job)
    fs, path = _fs(location)
    name = PART.format(index)
    tmp = f"{path}/.{name}.tmp"
    pq.write_table(pa.table(_row(index, result)), tmp, filesystem=fs)
    fs.move(tmp, f"{path}/{name}")
    return name


def gather(location: str, n: int) -> list:
    """The results of jobs 0..n-1, read back from the location as one dataset, in job order."""
    import pyarrow.dataset as ds
    fs, path = _fs(location)
    try:
        table = ds.dataset(path, filesystem=fs, format="parquet",
                           exclude_invalid_files=False).to_table(columns=["job", "json"])
    except Exception as e:
        raise ConfigError(f"--results {location}: cannot read the results back ({str(e).splitlines()[0][:200]})") \
            from None
    jobs = table.column("job").to_pylist()
    if sorted(jobs) != list(range(n)):
        missing = sorted(set(range(n)) - set(jobs))
        raise ConfigError(f"--results {location}: {len(missing)} of {n} result parts missing (job {missing[0]}, ...)"
                          if missing else f"--results {location}: parts of another run mixed in")
    by_job = dict(zip(jobs, table.column("json").to_pylist()))
    return [json.loads(by_job[k]) for k in range(n)]
