"""Independent simulations in worker processes (a sweep's points).

The simulator is Python and holds the interpreter lock, so threads do not overlap it;
processes do. Workers are forked, which is cheap (nothing to re-import) and safe only
while the caller has a single thread: forking a process whose other threads may hold locks
(a Streamlit server) can deadlock the child, and the alternatives (spawn, forkserver)
re-import the caller's main module in every worker. So a multi-threaded caller runs the
jobs here, one after another. Results come back pickled: worth it for small results (a
sweep point's summary), not for whole traces (measured: two 10k-request policies, ~150 MB
of trace each, took as long in two processes as in one).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import threading
from concurrent.futures import ProcessPoolExecutor


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_all(fn, jobs: list[dict], workers: int | None = None) -> list:
    """[fn(**job) for job in jobs], in order, in up to `workers` forked processes (default:
    one per CPU); here, one after another, with one worker or job, where fork is missing,
    or when the caller runs other threads. A worker's exception is raised here."""
    workers = min(workers or cpus(), len(jobs))
    if workers <= 1 or threading.active_count() > 1 or "fork" not in mp.get_all_start_methods():
        return [fn(**j) for j in jobs]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
        return [f.result() for f in [pool.submit(fn, **j) for j in jobs]]
