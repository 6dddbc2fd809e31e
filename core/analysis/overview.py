"""A Parquet trace too large to load, opened for the trace replay page from an overview built
once beside it (issue 29): the out-of-core summary, each request's spans, the steps, the KV
block states at the page's snapshot times, and the token and batch rows re-sorted by request,
so that a cursor move reads only the rows of the requests and the step it draws.

    python -m core overview T.parquet        # writes T.parquet.overview/ (or names where it wrote)

Every view is the in-memory one's, computed from fewer rows: `Overview.window(idx)` equals
`cursor.subset(trace, idx)`, `step_at` equals `cursor.step_at`, `request_metrics` equals
`metrics.request_metrics`, `occupancy` equals `occupancy.block_states(trace, max_snapshots=160)`
(tests/test_overview.py). Built with DuckDB over the file (bounded memory, spilling to disk);
read with pyarrow, one row group at a time. Nothing here loads the trace's token, batch or kv
rows whole.

The overview records the identity of every file it was built from (size, modification time and
a hash of its first and last 64 KiB), taken before the build and checked again after it: a trace
replaced while its overview was built is built again (never recorded as current for content it
was not built from), and a trace changed since is rebuilt on the next open. The overview's own
files are data we wrote (Parquet and JSON, never pickles), checked against the version written here.

An overview folder holds a marker file (MARKER: this tool's name, the build's id and the files it
wrote). A folder is replaced only when it holds that marker and nothing but the files it lists, and
only those files are removed; anything else (a folder of the user's, `--out .`, a symbolic link, a
folder we cannot write) is refused with one line naming it, and left as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from core.analysis.occupancy import Occupancy, OccupancyGrid, blocks_drawn, thinned_snapshots
from core.analysis.outofcore import summarize_parquet
from core.analysis.parquet_source import duck_connect, parquet_files, parquet_rows, source_view, trace_head
from core.errors import InputError
from core.trace.model import Trace
from core.trace.schema import BATCH, TABLES, TOKEN

VERSION = 2                 # 2: file identities carry a content hash; the folder carries MARKER
SNAPSHOTS = 160             # the replay page's KV snapshots (ui.cache.cached_block_states' default)
GROUP_ROWS = 65_536         # rows per row group of the by-request copies: a cursor move reads a few
LARGE_TRACE_ROWS = 20_000_000   # a Parquet trace past this many rows is opened from its overview
KV_CHUNK_ROWS = 1 << 20     # kv rows held at once while the block states are filled
SUFFIX = ".overview"
MARKER = ".serving-explorer-overview"     # {"tool": TOOL, "id": build id, "files": [...], "created": bool}
TOOL = "serving-explorer overview"
FILES = ("small.parquet", "token_spans.parquet", "batch_spans.parquet", "tokens.parquet", "batch.parquet",
         "batch_steps.parquet", "occupancy.parquet", "overview.json")
HASH_BYTES = 1 << 16        # bytes hashed at each end of a trace file (its identity)
BUILD_TRIES = 3             # builds of a trace that keeps changing under them before giving up
_SMALL = ("request", "finish", "step", "preempt")   # record types read whole at open (one row per request/step)


def is_large(path) -> bool:
    rows = parquet_rows(path)
    return rows is not None and rows > LARGE_TRACE_ROWS


def files_identity(files: list[Path]) -> list:
    """[name, size, mtime_ns, sha256 of the first and last HASH_BYTES] of each file."""
    out = []
    for f in files:
        with open(f, "rb") as fh:
            st = os.fstat(fh.fileno())
            h = hashlib.sha256(fh.read(HASH_BYTES))
            if st.st_size > HASH_BYTES:
                fh.seek(max(HASH_BYTES, st.st_size - HASH_BYTES))
                h.update(fh.read(HASH_BYTES))
        out.append([f.name, st.st_size, st.st_mtime_ns, h.hexdigest()])
    return out


def overview_dir(path) -> Path:
    """Where the overview of `path` lives: beside it, or (a folder we cannot write) in the user's
    cache (SERVING_EXPLORER_CACHE, else ~/.cache/serving-explorer), keyed by the trace's path."""
    p = Path(path).resolve()
    beside = p.parent / (p.name + SUFFIX)
    if beside.exists() or os.access(p.parent, os.W_OK):
        return beside
    root = Path(os.environ.get("SERVING_EXPLORER_CACHE") or Path.home() / ".cache" / "serving-explorer")
    return root / "overviews" / (hashlib.sha256(str(p).encode()).hexdigest()[:16] + SUFFIX)


def _cols(cols: set, rec, extra=()) -> str:
    want = list(dict.fromkeys([f.column for f in rec.columns] + list(extra)))
    return ", ".join(c if c in cols else f"NULL AS {c}" for c in want)


def _copy(con, sql: str, out: Path, params=()):
    con.execute(f"COPY ({sql}) TO '{str(out).replace(chr(39), chr(39) * 2)}' "
                f"(FORMAT parquet, ROW_GROUP_SIZE {GROUP_ROWS}, COMPRESSION zstd)", list(params))


def build(path, out: Path | None = None, progress=None) -> Path:
    """Write the overview of a Parquet trace (file or directory of parts); returns its folder.
    Written into a temporary folder beside the target and moved into place when complete, so
    a failed or interrupted build never leaves a half overview (nor removes a good one). A trace
    that changed during the build (its identity before and after differ) is built again, up to
    BUILD_TRIES times. The target is refused (InputError naming it, nothing written) when it is a
    symbolic link, not a folder, or a folder this tool did not write (module docstring)."""
    files = parquet_files(path)
    out = Path(os.path.abspath(overview_dir(path) if out is None else out))
    _check_target(out)
    say = progress or (lambda msg: None)
    try:
        for _ in range(BUILD_TRIES):
            before = files_identity(files)
            t_start = time.perf_counter()
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent))
            try:
                doc = _build_into(tmp, path, files, say)
                files = parquet_files(path)
                if files_identity(files) != before:      # replaced or rewritten while read: build it again
                    say("the trace changed during the build; building again")
                    continue
                doc.update(source=before, built={"seconds": round(time.perf_counter() - t_start, 3),
                                                 "engine": doc["summary"]["computed"]["engine"]})
                (tmp / "overview.json").write_text(json.dumps(doc, allow_nan=False))
                _install(tmp, out)
                return out
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        if e.filename is not None and str(e.filename) in {str(f) for f in files}:
            raise InputError(f"{e.filename}: cannot read the trace ({e.strerror or e})") from None
        where = f" ({e.filename})" if e.filename else ""
        raise InputError(f"{out}: cannot write the overview here: {e.strerror or e}{where}; give python -m core "
                         "overview --out a folder you can write") from None
    raise InputError(f"{path}: changed during each of {BUILD_TRIES} builds of its overview; build it when the trace "
                     "is no longer being written")


def _build_into(tmp: Path, path, files: list[Path], say) -> dict:
    """The overview's Parquet files written into `tmp`; returns the start of its overview.json."""
    head = trace_head(files)
    say("summary (out of core)")
    summary = summarize_parquet(path)
    with tempfile.TemporaryDirectory(prefix="serving-explorer-duckdb-") as spill:
        con = duck_connect(spill)
        cols = source_view(con, files)
        say("requests, finishes, steps, preemptions")
        small = ", ".join(f"'{t}'" for t in _SMALL)
        keep = list(dict.fromkeys(["rtype"] + [f.column for r in TABLES if r.type in _SMALL for f in r.columns]
                                  + ["json"]))
        _copy(con, f"SELECT {', '.join(c if c in cols else f'NULL AS {c}' for c in keep)} FROM scan "
                   f"WHERE rtype IN ({small})", tmp / "small.parquet")
        say("per-request spans")
        _copy(con, "SELECT req, min(t_ms) AS first, max(t_ms) AS last, count(*) AS n FROM src "
                   "WHERE rtype = 'token' GROUP BY req ORDER BY req", tmp / "token_spans.parquet")
        _copy(con, "SELECT req, min(step) AS first_step FROM src WHERE rtype = 'batch' GROUP BY req ORDER BY req",
              tmp / "batch_spans.parquet")
        say("tokens by request")
        _copy(con, f"SELECT {_cols(cols, TOKEN)}, rowkey FROM src WHERE rtype = 'token' ORDER BY req, rowkey",
              tmp / "tokens.parquet")
        say("batch entries by request and by step")
        _copy(con, f"SELECT {_cols(cols, BATCH)}, rowkey FROM src WHERE rtype = 'batch' ORDER BY req, rowkey",
              tmp / "batch.parquet")
        _copy(con, f"SELECT {_cols(cols, BATCH)} FROM scan WHERE rtype = 'batch'",
              tmp / "batch_steps.parquet")
        say("KV block states")
        occ = _occupancy(con, head.get("meta") or {}, tmp)
        con.close()
    return {"version": VERSION, "head": head, "summary": summary, "occupancy": occ}


def _marker(folder: Path) -> dict | None:
    """The folder's marker when it is this tool's (a regular file, not a link), else None."""
    m = folder / MARKER
    try:
        if m.is_symlink() or not m.is_file():
            return None
        doc = json.loads(m.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(doc, dict) and doc.get("tool") == TOOL and isinstance(doc.get("files"), list)
          and all(isinstance(f, str) and f in FILES for f in doc["files"]))
    return doc if ok else None


def _check_target(out: Path) -> None:
    """Refuse a target we must not write into (module docstring): InputError naming it."""
    if out.is_symlink():
        raise InputError(f"{out}: a symbolic link; an overview is written only into a real folder, never through a "
                         "link (give python -m core overview --out a folder path)")
    if not out.exists():
        return
    if not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; left as it is (give python -m core overview --out DIR)")
    try:
        held = sorted(os.listdir(out))
    except OSError as e:
        raise InputError(f"{out}: cannot read this folder ({e.strerror}); left as it is") from None
    if not held:
        return
    mark = _marker(out)
    if mark is None:
        raise InputError(f"{out}: exists and is not an overview this tool wrote (no {MARKER} marker); left as it is "
                         "(move it, or give python -m core overview --out DIR a new folder)")
    foreign = [f for f in held if f != MARKER and f not in mark["files"]]
    if foreign:
        raise InputError(f"{out}: holds {foreign[0]!r}, which this tool did not write; left as it is (move that "
                         "file, or give python -m core overview --out DIR a new folder)")


def _install(tmp: Path, out: Path) -> None:
    """Put the finished overview in `tmp` at `out`: a new folder is moved into place whole; a folder
    this tool created is swapped whole and only the files its marker lists are removed; an empty
    folder (or one this tool filled but did not create) is filled file by file, overview.json
    removed first and written last, so it is never current while half replaced."""
    made = [f for f in FILES if (tmp / f).exists()]
    existing = out.exists()
    old = _marker(out) if existing else None
    created = not existing or (old is not None and old.get("created") is True)
    (tmp / MARKER).write_text(json.dumps({"tool": TOOL, "id": uuid.uuid4().hex, "files": made,
                                          "created": created}))
    if not existing:
        tmp.chmod(0o755)
        os.rename(tmp, out)          # fails (nothing lost) if a non-empty folder appeared there meanwhile
        return
    if created:
        aside = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(out, aside)
        try:
            tmp.chmod(0o755)
            os.rename(tmp, out)
        except OSError:
            os.rename(aside, out)
            raise
        _remove_ours(aside, old)
        return
    (out / "overview.json").unlink(missing_ok=True)
    for f in [MARKER, *made]:          # the marker first: a half-filled folder is still known as ours
        if f != "overview.json":
            os.replace(tmp / f, out / f)
    for f in (old or {}).get("files", []):
        if f not in made:
            (out / f).unlink(missing_ok=True)
    os.replace(tmp / "overview.json", out / "overview.json")


def _remove_ours(folder: Path, mark: dict) -> None:
    """Remove the files a marker lists and the marker, then the folder if that emptied it."""
    for f in [*mark["files"], MARKER]:
        try:
            (folder / f).unlink()
        except FileNotFoundError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass          # something else appeared in it: left as it is


def _occupancy(con, meta: dict, tmp: Path) -> dict | None:
    """occupancy.block_states(trace, max_snapshots=SNAPSHOTS) from the kv rows, read in recorded
    order in chunks; written as one row per (block, snapshot) cell."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    n_kv, max_block = con.execute("SELECT count(*), max(block) FROM src WHERE rtype = 'kv'").fetchone()
    if not n_kv:
        return None
    # occupancy.snapshot_times: step starts (kv event times without steps) and the last token, thinned
    has_steps = con.execute("SELECT count(*) FROM src WHERE rtype = 'step'").fetchone()[0] > 0
    t = np.array([r[0] for r in con.execute(
        "SELECT DISTINCT t_ms FROM src WHERE rtype = ? ORDER BY t_ms", ["step" if has_steps else "kv"]).fetchall()],
        dtype=float)
    last_token = con.execute("SELECT max(t_ms) FROM src WHERE rtype = 'token'").fetchone()[0]
    t = thinned_snapshots(t, None if last_token is None else float(last_token), SNAPSHOTS)
    blocks = blocks_drawn(int(max_block) + 1, meta)
    grid = OccupancyGrid(t, blocks)
    ops = ["alloc", "free", "hit", "cow", "evict", "cache"]
    ops += [o for (o,) in con.execute("SELECT DISTINCT op FROM src WHERE rtype = 'kv'").fetchall() if o not in ops]
    code = "CASE op " + " ".join(f"WHEN '{o}' THEN {k}" for k, o in enumerate(ops)) + " END"
    reader = con.sql(f"SELECT block, ref, req, t_ms, {code} AS op, hash IS NOT NULL AS has_hash FROM scan "
                     "WHERE rtype = 'kv'").to_arrow_reader(KV_CHUNK_ROWS)
    for b in reader:
        col = lambda c: b.column(c).to_numpy(zero_copy_only=False)
        grid.add(col("block"), col("ref"), col("req"), col("t_ms"), col("op"), ops, col("has_hash"))
    occ = grid.occupancy()
    pq.write_table(pa.table({"state": occ.state.ravel(), "ref": occ.ref.ravel(), "owner": occ.owner.ravel()}),
                   tmp / "occupancy.parquet", compression="zstd")
    return {"times_ms": occ.times_ms.tolist(), "blocks": int(occ.num_blocks)}


@dataclass
class _Sorted:
    """A by-request copy: its file and each row group's first and last request."""
    pf: object
    lo: np.ndarray
    hi: np.ndarray
    columns: list

    @classmethod
    def open(cls, path: Path, key: str):
        import pyarrow.parquet as pq
        pf = pq.ParquetFile(path)
        md, col = pf.metadata, pf.schema_arrow.names.index(key)
        lo, hi = [], []
        for i in range(md.num_row_groups):
            st = md.row_group(i).column(col).statistics
            lo.append(st.min if st is not None and st.has_min_max else np.iinfo(np.int64).min)
            hi.append(st.max if st is not None and st.has_min_max else np.iinfo(np.int64).max)
        return cls(pf, np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64), pf.schema_arrow.names)

    def rows(self, key: str, values: np.ndarray):
        """The rows whose `key` is one of `values` (sorted), reading only the row groups that can hold them."""
        import pyarrow as pa
        import pyarrow.compute as pc
        if not len(values) or not len(self.lo):
            return self.pf.schema_arrow.empty_table()
        groups = [g for g in range(len(self.lo))
                  if np.searchsorted(values, self.lo[g], "left") < np.searchsorted(values, self.hi[g], "right")]
        if not groups:
            return self.pf.schema_arrow.empty_table()
        t = self.pf.read_row_groups(groups)
        return t.filter(pc.is_in(t.column(key), value_set=pa.array(values, type=t.schema.field(key).type)))


class Overview:        # a core.analysis.views.TraceView
    """An opened overview (`open_overview`): the trace's head, summary, requests, finishes, steps and
    preemptions in memory (one row per request or step), the rest read per cursor move."""

    def __init__(self, folder: Path, name: str):
        import pyarrow.parquet as pq

        from core.trace.parquet import Rows, trace_from_rows
        self.folder, self.name = folder, name
        doc = json.loads((folder / "overview.json").read_text())
        if doc.get("version") != VERSION:
            raise InputError(f"{folder}: an overview of version {doc.get('version')}, expected {VERSION}")
        self.doc = doc
        t = pq.read_table(folder / "small.parquet", read_dictionary=["rtype"])
        rtype = t.column("rtype").to_numpy(zero_copy_only=False).astype(object)
        rows = {}
        for r in ("request", "token", "finish", "step", "batch", "kv", "kv_event", "preempt", "other"):
            sel = np.flatnonzero(rtype == r)
            rows[r] = Rows.of_table(t.take(sel) if r in _SMALL and len(sel) else None, r, name)
        # a skeleton: every table the page reads whole is here; tokens, batch and kv are read per view
        self.skeleton = trace_from_rows(rows, doc["head"], name)
        n = len(self.skeleton.requests)
        ts = pq.read_table(folder / "token_spans.parquet")
        req = ts.column("req").to_numpy()
        self.first = np.full(n, np.nan)
        self.last = np.full(n, np.nan)
        self.count = np.zeros(n, dtype=np.int64)
        self.first[req] = ts.column("first").to_numpy()
        self.last[req] = ts.column("last").to_numpy()
        self.count[req] = ts.column("n").to_numpy()
        bs = pq.read_table(folder / "batch_spans.parquet")
        self.first_step = np.full(n, -1, dtype=np.int64)
        self.first_step[bs.column("req").to_numpy()] = bs.column("first_step").to_numpy()
        self._tokens = _Sorted.open(folder / "tokens.parquet", "req")
        self._batch = _Sorted.open(folder / "batch.parquet", "req")
        self._by_step = _Sorted.open(folder / "batch_steps.parquet", "step")
        self._metrics = self._occupancy = None
        occ = doc.get("occupancy")
        if occ is not None:     # read when drawn: its size checked now, so a damaged file is rebuilt at open
            cells = pq.ParquetFile(folder / "occupancy.parquet").metadata.num_rows
            if cells != occ["blocks"] * len(occ["times_ms"]):
                raise InputError(f"{folder}: occupancy.parquet holds {cells} cells, expected "
                                 f"{occ['blocks'] * len(occ['times_ms'])}")

    @property
    def meta(self) -> dict:
        return self.skeleton.meta

    @property
    def requests(self) -> pd.DataFrame:
        return self.skeleton.requests

    @property
    def steps(self) -> pd.DataFrame:
        return self.skeleton.steps

    def summary(self) -> dict:
        """metrics.summarize(trace, per_request=False), computed out of core (outofcore.summarize_parquet)."""
        return self.doc["summary"]

    def request_metrics(self) -> pd.DataFrame:
        """metrics.request_metrics of the whole trace."""
        if self._metrics is None:
            from core.analysis.metrics import request_metrics
            self._metrics = request_metrics(self.skeleton, spans=(self.first, self.last, self.count))
        return self._metrics

    def span(self) -> tuple[float, float]:
        """cursor.time_range of the whole trace."""
        from core.analysis.cursor import time_range_of
        sk = self.skeleton
        return time_range_of(sk.requests, float(np.nanmax(self.last)) if self.count.any() else None, sk.steps,
                             sk.finishes)

    def in_flight(self) -> pd.DataFrame:
        from core.analysis.cursor import in_flight_series
        return in_flight_series(self.skeleton, metrics=self.request_metrics())

    def _frame(self, t, rec):
        from core.trace.parquet import Rows
        return Rows.of_table(t, rec.type, self.name).frame(rec, len(self.skeleton.requests))

    def window(self, req_idx) -> Trace:
        """cursor.subset(trace, req_idx): those requests, their tokens, finishes, batch entries and
        preemptions (re-indexed), every step."""
        sk = self.skeleton
        idx = np.asarray(sorted(set(int(i) for i in req_idx)), dtype=np.int64)
        remap = np.full(len(sk.requests), -1, dtype=np.int64)
        remap[idx] = np.arange(len(idx))

        def by_req(sorted_copy, rec):
            t = sorted_copy.rows("req", idx)
            t = t.take(np.argsort(t.column("rowkey").to_numpy(), kind="stable"))
            df = self._frame(t, rec)
            df["req"] = remap[df["req"].to_numpy()]
            return df

        def small(df):
            r = df["req"].to_numpy()
            keep = (r >= 0) & (remap[np.maximum(r, 0)] >= 0)
            out = df[keep].copy()
            out["req"] = remap[r[keep]]
            return out.reset_index(drop=True)

        return Trace(meta=sk.meta, requests=sk.requests.iloc[idx].reset_index(drop=True),
                     tokens=by_req(self._tokens, TOKEN), finishes=small(sk.finishes), steps=sk.steps,
                     batch=by_req(self._batch, BATCH), kv=sk.kv, preempts=small(sk.preempts), other=[],
                     request_extra=[sk.request_extra[i] for i in idx] if sk.request_extra else [])

    def step_at(self, t_ms: float) -> tuple[dict | None, pd.DataFrame]:
        """cursor.step_at(trace, t_ms): the step at the cursor and its batch entries."""
        st = self.skeleton.steps
        if not len(st):
            return None, pd.DataFrame()
        k = int(np.searchsorted(st["t_ms"].to_numpy(), t_ms, side="right") - 1)
        if k < 0:
            return None, pd.DataFrame()
        row = st.iloc[k].to_dict()
        b = self._frame(self._by_step.rows("step", np.array([int(row["step"])], dtype=np.int64)), BATCH)
        b["request"] = self.skeleton.requests["id"].to_numpy()[b["req"].to_numpy()].tolist()
        return row, b.reset_index(drop=True)

    def kv_counts_at(self, t_ms: float) -> dict:
        """Blocks in each state at the snapshot at or before `t_ms` (a trace too large to replay its kv rows
        at each cursor move)."""
        occ = self.occupancy()
        return occ.at(occ.index_at(t_ms))

    def occupancy(self) -> Occupancy | None:
        """occupancy.block_states(trace, max_snapshots=160), None without kv rows."""
        occ = self.doc.get("occupancy")
        if occ is None or self._occupancy is not None:
            return self._occupancy
        import pyarrow.parquet as pq
        t = pq.read_table(self.folder / "occupancy.parquet")
        B, times = occ["blocks"], np.array(occ["times_ms"], dtype=float)
        shape = (B, len(times))
        self._occupancy = Occupancy(times, t.column("state").to_numpy().astype(np.int8).reshape(shape),
                         t.column("ref").to_numpy().astype(np.int32).reshape(shape),
                         t.column("owner").to_numpy().astype(np.int64).reshape(shape), B)
        return self._occupancy

    @property
    def has_kv(self) -> bool:
        return self.doc.get("occupancy") is not None

    def counted_steps(self) -> bool:
        """stepfit.counted_steps: steps with counts and no batch entries (an engine's iteration log)."""
        from core.trace.model import counted_steps_of
        return counted_steps_of(self.skeleton.steps, self._batch.pf.metadata.num_rows > 0)

    def prefix_cache(self):
        """The engine's own prefix cache over time (its KV events), None without them."""
        if not len(self.skeleton.kv_events):
            return None
        from core.analysis.kv_events import cache_over_time
        return cache_over_time(self.skeleton.kv_events)

    def rows(self) -> dict:
        """Rows of each record type in the trace."""
        return {"requests": len(self.skeleton.requests), "tokens": int(self.count.sum()),
                "steps": len(self.skeleton.steps), "batch entries": self._batch.pf.metadata.num_rows}


def current(path) -> Path | None:
    """The overview folder of `path` when one exists, was written by this tool and matches the
    trace's files as they are now."""
    folder = overview_dir(path)
    if folder.is_symlink() or _marker(folder) is None:
        return None
    try:
        doc = json.loads((folder / "overview.json").read_text())
        same = doc.get("version") == VERSION and doc.get("source") == files_identity(parquet_files(path))
        return folder if same else None
    except (OSError, ValueError, AttributeError):
        return None


def _open(folder: Path, path) -> Overview:
    try:
        return Overview(folder, Path(path).name)
    except InputError:
        raise
    except Exception as e:        # pyarrow, JSON and file errors of a damaged folder: named, one line
        why = (str(e).splitlines() or [""])[0][:200]
        raise InputError(f"{folder}: the overview cannot be read ({type(e).__name__}: {why})") from None


def open_overview(path, build_missing: bool = True, progress=None) -> tuple[Overview, float | None]:
    """(overview, seconds spent building it, or None when an up-to-date one was there). A damaged
    overview is built again, once; what cannot be built or read raises InputError naming the folder."""
    folder = current(path)
    if folder is not None:
        try:
            return _open(folder, path), None
        except InputError:
            pass               # damaged (its JSON or Parquet files): built again below
    if not build_missing:
        raise InputError(f"{path}: no overview (python -m core overview {path})")
    t = time.perf_counter()
    folder = build(path, progress=progress)
    return _open(folder, path), time.perf_counter() - t
