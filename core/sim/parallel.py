"""Independent simulations in worker processes (a sweep's points, a page's policies).

The simulator is Python and holds the interpreter lock, so threads do not overlap it;
processes do. Two kinds of workers, both maintained executors:

- a single-threaded caller (the CLI) forks its workers for the call (concurrent.futures'
  ProcessPoolExecutor): cheap, nothing to re-import;
- a caller running other threads (a Streamlit server) must not fork itself (a lock another
  thread holds at the fork stays held in the child forever), and multiprocessing's other
  start methods import the caller's main module in each worker (under Streamlit, the page
  script that happens to be running), so it uses loky's reusable executor: fresh interpreters,
  one per CPU, started once and shared by all its threads, restarted when one dies (`warm()`
  starts them ahead of the first use).

Results come back through a file in shared memory (/dev/shm) rather than a pipe:
the result is pickled with its arrays out of band (pickle protocol 5), the arrays written to
the file once and mapped by the caller, so a 150 MB trace costs one copy instead of four
(measured for two 10k-request policies: 1.06–1.27 s in two workers this way, 1.45–1.81 s
through the pipe, 1.73–1.97 s in one process; see docs/benchmarks.md). Without a usable
/dev/shm (missing, full) a result comes back through the pipe.

SERVING_EXPLORER_WORKERS=N caps the workers (1: everything in the calling process).
"""
from __future__ import annotations

import atexit
import glob
import io
import mmap
import multiprocessing as mp
import os
import pickle
import tempfile
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

SHM_DIR = "/dev/shm"
SHM_PREFIX = "serving-explorer-"
ALIGN = 64


def cpus() -> int:
    """CPUs this process may use (loky.cpu_count: its affinity, within a cgroup CPU quota, as in a
    container), capped by SERVING_EXPLORER_WORKERS."""
    import loky
    n = loky.cpu_count()
    cap = os.environ.get("SERVING_EXPLORER_WORKERS", "")
    return max(1, min(n, int(cap))) if cap.isdigit() else n


# ---- results through shared memory --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Parcel:
    """A pickled result: `data` (pickle protocol 5) and, when its buffers were written to a
    shared-memory file, that file's path and each buffer's (offset, length) in it."""
    data: bytes
    path: str | None = None
    spans: tuple = ()


def ship(obj, owner: int) -> Parcel:
    """Pickle `obj` for the process `owner` (its pid names the file, so files of a caller that
    died can be found and removed); its buffers go to a shared-memory file when possible."""
    bufs: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    size = sum(r.nbytes + ALIGN for r in raws)
    if size < 1 << 20 or not os.access(SHM_DIR, os.W_OK):
        return Parcel(pickle.dumps(obj, protocol=5))
    path = None
    try:
        fd, path = tempfile.mkstemp(dir=SHM_DIR, prefix=f"{SHM_PREFIX}{owner}-{os.getpid()}-")
        with os.fdopen(fd, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, size)     # ENOSPC here, not a SIGBUS later
            spans, at = [], 0
            for r in raws:
                pad = -at % ALIGN     # each array starts aligned (numpy's fast loops need it)
                f.write(bytes(pad))
                at += pad
                f.write(r)
                spans.append((at, r.nbytes))
                at += r.nbytes
        return Parcel(data, path, tuple(spans))
    except OSError:
        if path:
            _remove(path)
        return Parcel(pickle.dumps(obj, protocol=5))


def unship(p: Parcel):
    """The object of a Parcel. Its arrays stay in the mapped file (copy-on-write; the file is
    removed at once and its memory freed with the last array)."""
    if p.path is None:
        return pickle.loads(p.data)
    try:
        fd = os.open(p.path, os.O_RDONLY)
        try:
            mm = mmap.mmap(fd, p.spans[-1][0] + p.spans[-1][1], access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
    finally:
        _remove(p.path)
    view = memoryview(mm)
    return _Unpickler(io.BytesIO(p.data), buffers=[view[o:o + n] for o, n in p.spans]).load()


class _Unpickler(pickle.Unpickler):
    """Arrays come back with numpy's own dtype objects. Unpickled as numpy does it, each array
    gets a private copy of its dtype, and numpy then misses fast paths that compare dtypes by
    identity: np.minimum.at over 2.56 M rows took 100 ms instead of 3.3 ms (numpy 2.4)."""

    def find_class(self, module, name):
        found = super().find_class(module, name)
        if module.startswith("numpy") and name == "_frombuffer":
            def frombuffer(buf, dtype, *rest):
                if dtype.fields is None and dtype.subdtype is None and dtype.isnative:
                    dtype = np.dtype(dtype.str)
                return found(buf, dtype, *rest)
            return frombuffer
        return found


def _remove(path: str):
    try:
        os.unlink(path)
    except OSError:
        pass


def remove_orphans():
    """Remove shared-memory result files whose owner process is gone."""
    for path in glob.glob(os.path.join(SHM_DIR, SHM_PREFIX + "*")):
        pid = os.path.basename(path)[len(SHM_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


# ---- workers ------------------------------------------------------------------------------------

class _Shared:
    """A loky ProcessPoolExecutor: worker processes started once for this process and shared by its
    threads (every session of a Streamlit server), replaced by a fresh one when a worker died. Its
    workers are fresh interpreters (loky's own start method: no fork of a threaded caller, and the
    caller's main module is not imported in them). Results come back through shared memory
    (`ship`). (Not loky's get_reusable_executor: it keeps one executor per thread, and every
    Streamlit script run is a thread of its own, so each would start its own workers.)"""

    def __init__(self, size: int):
        self.size, self._ex, self._lock = size, None, threading.Lock()
        atexit.register(self.close)

    def _executor(self):
        import loky
        with self._lock:
            ex = self._ex
            if ex is None or ex._flags.broken or ex._flags.shutdown:
                if ex is not None:
                    ex.shutdown(wait=False)
                # timeout None: idle workers stay (a later page run would otherwise wait ~0.5 s for each)
                self._ex = ex = loky.ProcessPoolExecutor(self.size, timeout=None, initializer=_worker_start)
            return ex

    def close(self):
        if self._ex is not None:
            self._ex.shutdown(wait=False, kill_workers=True)
        _remove_own_files()

    def map(self, fn, jobs: list[dict]) -> list:
        """[fn(**job) for job in jobs] over the workers. When a worker dies every job of the call not
        yet answered runs in this process instead, unless the worker was killed (SIGKILL: likely the
        out-of-memory killer; the server must not try the same here)."""
        from loky.process_executor import BrokenProcessPool, TerminatedWorkerError
        futures = [self._executor().submit(_shipped, fn, job, os.getpid()) for job in jobs]
        out: list = [None] * len(jobs)
        for i, f in enumerate(futures):
            try:
                out[i] = unship(f.result())
            except (TerminatedWorkerError, BrokenProcessPool) as e:
                if "SIGKILL" in str(e):
                    raise MemoryError(f"a simulation's worker process was killed ({str(e).splitlines()[0]}); not "
                                      "retried here") from None
                out[i] = fn(**jobs[i])
        return out


def _worker_start():
    """In each worker, once: numpy's huge-page advice off (core.cli.no_hugepage_advice), and what
    every job imports, imported before the first one arrives."""
    import core.analysis.metrics
    import core.sim.simulate  # noqa: F401  (pandas and the simulator: what a job spends its import time on)
    from core.cli import no_hugepage_advice
    no_hugepage_advice()


def _shipped(fn, job: dict, owner: int) -> Parcel:
    return ship(fn(**job), owner)


def _remove_own_files():
    """At exit: result files still named after this process (a call cut short by a dead worker)."""
    for path in glob.glob(os.path.join(SHM_DIR, f"{SHM_PREFIX}{os.getpid()}-*")):
        _remove(path)


_POOL: _Shared | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _Shared:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            remove_orphans()
            _POOL = _Shared(cpus())
        return _POOL


def warm() -> None:
    """Start the worker processes now, in the background (each imports core, ~0.5 s), so that
    the first parallel run does not wait for them. Nothing with one CPU."""
    if cpus() > 1:
        threading.Thread(target=lambda: _pool().map(os.getpid, [{}] * cpus()), name="serving-explorer-warm",
                         daemon=True).start()


PARALLEL_MIN_REQUESTS = 1_000     # below this, a run simulates in milliseconds: no worker processes


def _set_up_then(fn, setup, job):
    """One job, after `setup` (function, argument) has run where it runs (e.g. routing policies a
    module registered, imported in a fresh worker process)."""
    setup[0](setup[1])
    return fn(**job)


def run_all(fn, jobs: list[dict], workers: int | None = None, ray: str | None = None,
            results: str | None = None, setup: tuple | None = None) -> list:
    """[fn(**job) for job in jobs], in order: forked for this call into up to `workers`
    processes (default: one per CPU; concurrent.futures) when the caller runs one thread, else on the
    process's shared workers (loky's reusable executor, one per CPU; `workers` does not apply); here, one after
    another, with one worker or job. A job whose worker dies runs here (see _Pool.map). `fn`
    must be a module-level function. A job's exception is raised here. `ray`: run them as Ray
    tasks instead (core.sim.rayrun: "local", "auto" or "ray://HOST:PORT"). `results`: each job writes
    its result row to this directory or pyarrow filesystem URI, read back as a dataset (core.sim.shared);
    the location is claimed for this call before the first job, or refused in one line. `setup`:
    (function, argument) called before each job where it runs (a worker process starts fresh)."""
    if setup is not None:
        jobs = [dict(fn=fn, setup=setup, job=j) for j in jobs]
        fn = _set_up_then
    if results is not None:
        from core.sim import shared
        run = shared.prepare(results, len(jobs))       # claimed (or refused) before any job runs
        try:
            run_all(shared.write_result, [dict(fn=fn, job=j, index=k, location=results, run=run)
                                          for k, j in enumerate(jobs)], workers, ray)
        except BaseException:
            shared.release(results, run)
            raise
        return shared.gather(results, len(jobs), run)
    if ray is not None:
        from core.sim.rayrun import run_on_ray
        return run_on_ray(fn, jobs, ray, workers)
    workers = min(workers or cpus(), cpus(), len(jobs))
    if workers <= 1:
        return [fn(**j) for j in jobs]
    if threading.active_count() == 1 and "fork" in mp.get_all_start_methods():
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
            return [f.result() for f in [pool.submit(fn, **j) for j in jobs]]
    return _pool().map(fn, jobs)

