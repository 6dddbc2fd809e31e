"""core.sim.parallel: results shipped through shared memory equal the originals (dtypes included),
the worker pool used by multi-threaded callers (a Streamlit server) gives the same traces as
simulating in the caller, and failures (a job's error, a worker that dies, no usable
/dev/shm) end as they would in one process."""
import json
import os
import threading

import numpy as np
import pandas as pd
import pytest

from core.config import SchedulerConfig
from core.errors import ConfigError
from core.lessons.scenarios import poisson_workload
from core.lessons.schedules import PARALLEL_MIN_REQUESTS, run_policies
from core.sim import parallel
from core.sim.stepmodel import StepModel

STEP = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.05)
TABLES = ("requests", "tokens", "finishes", "steps", "batch", "kv", "preempts")


def in_thread(fn, *args, **kwargs):
    """fn(*args) called from a second thread, as a Streamlit script runs (the pool's path)."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=300)
    assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return out["value"]


def frame():
    n = 300_000     # over 1 MiB of buffers: shipped through a file
    return pd.DataFrame({"t_ms": np.linspace(0, 1, n), "req": np.arange(n, dtype=np.int64) % 977,
                         "kind": pd.Categorical(np.where(np.arange(n) % 3 == 0, "prefill", "decode")),
                         "flag": (np.arange(n) % 2).astype(np.int8)})


def test_a_shipped_frame_comes_back_equal_with_numpys_own_dtypes_and_leaves_no_file():
    df = frame()
    p = parallel.ship({"df": df, "note": "x"}, os.getpid())
    assert p.path is not None and os.path.exists(p.path)
    assert all(o % parallel.ALIGN == 0 for o, _ in p.spans)
    back = parallel.unship(p)
    assert not os.path.exists(p.path)
    pd.testing.assert_frame_equal(back["df"], df)
    assert back["note"] == "x"
    for col in ("t_ms", "req"):
        assert back["df"][col].to_numpy().dtype is np.dtype(df[col].dtype.str)
    # the fast path numpy takes only for its own dtype objects gives the same values
    fb = np.full(977, 2**62)
    np.minimum.at(fb, back["df"]["req"].to_numpy(), np.arange(len(df)))
    assert fb.tolist() == list(range(977))
    back["df"].loc[0, "t_ms"] = 5.0     # the mapping is the caller's own copy
    assert df.loc[0, "t_ms"] == 0.0


def test_small_results_and_a_missing_shm_dir_go_in_band(monkeypatch):
    assert parallel.ship({"a": 1}, os.getpid()).path is None
    monkeypatch.setattr(parallel, "SHM_DIR", "/nonexistent-serving-explorer")
    p = parallel.ship(frame(), os.getpid())
    assert p.path is None
    pd.testing.assert_frame_equal(parallel.unship(p), frame())


def test_files_of_dead_owners_are_removed_and_others_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "SHM_DIR", str(tmp_path))
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    mine = tmp_path / f"{parallel.SHM_PREFIX}{os.getpid()}-a"
    gone = tmp_path / f"{parallel.SHM_PREFIX}{dead}-b"
    other = tmp_path / "unrelated"
    for f in (mine, gone, other):
        f.write_bytes(b"x")
    parallel.remove_orphans()
    assert mine.exists() and other.exists() and not gone.exists()


def workload():
    return poisson_workload(PARALLEL_MIN_REQUESTS, rate_per_s=200.0, seed=7, max_prompt=96, max_output=12)


def test_policies_simulated_in_workers_equal_simulated_here(monkeypatch):
    w = workload()
    cfg = SchedulerConfig(max_seqs=32, token_budget=512)
    args = (w, ["static", "continuous", "chunked"], cfg, STEP, 32)
    calls = []
    monkeypatch.setattr(parallel._Shared, "map", lambda self, fn, jobs, orig=parallel._Shared.map:
                        calls.append(len(jobs)) or orig(self, fn, jobs))
    there = in_thread(run_policies, *args, created="(test)", record_kv=True, summaries=True)
    assert calls == [3]                 # the pool ran them
    monkeypatch.setenv("SERVING_EXPLORER_WORKERS", "1")
    here = run_policies(*args, created="(test)", record_kv=True, summaries=True)
    assert calls == [3]
    assert [x[0] for x in there] == [x[0] for x in here]
    for (_, a, sa), (_, b, sb) in zip(there, here):
        for t in TABLES:
            pd.testing.assert_frame_equal(getattr(a, t), getattr(b, t))
        assert json.dumps(a.meta, sort_keys=True) == json.dumps(b.meta, sort_keys=True)
        assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)
        assert len(a.kv) and len(a.tokens) == sum(r.max_output_tokens for r in w.requests)


def test_a_jobs_error_is_raised_in_the_caller():
    w = workload()
    with pytest.raises(ConfigError, match="kv_blocks: request 'r.*' needs .* the pool has 2"):
        in_thread(run_policies, w, ["continuous", "static"], SchedulerConfig(kv_blocks=2), STEP)


def die_in_worker(caller: int, x: int) -> int:
    if os.getpid() != caller:
        os._exit(3)
    return x * 2


def test_a_job_whose_worker_dies_runs_in_the_caller_and_the_pool_recovers():
    jobs = [dict(caller=os.getpid(), x=i) for i in range(3)]
    assert in_thread(parallel.run_all, die_in_worker, jobs) == [0, 2, 4]
    assert in_thread(parallel.run_all, os.getpid, [{}, {}]) != [os.getpid()] * 2    # new workers


def killed_in_worker(caller: int) -> int:
    import signal
    if os.getpid() != caller:
        os.kill(os.getpid(), signal.SIGKILL)      # as the out-of-memory killer would
    return 1


def test_a_job_whose_worker_is_killed_is_not_rerun_in_the_caller():
    with pytest.raises(MemoryError, match="killed"):
        in_thread(parallel.run_all, killed_in_worker, [dict(caller=os.getpid())] * 2)
    assert in_thread(parallel.run_all, die_in_worker, [dict(caller=os.getpid(), x=1)] * 2) == [2, 2]


def test_a_job_that_does_not_pickle_fails_whole_and_the_workers_stay_usable():
    with pytest.raises(Exception, match="pickle"):
        in_thread(parallel.run_all, die_in_worker, [dict(caller=os.getpid(), x=threading.Lock())] * 2)
    assert in_thread(parallel.run_all, os.getpid, [{}, {}]) != [os.getpid()] * 2


def test_threads_share_one_set_of_workers():
    """Every Streamlit script run is a thread of its own: they must reuse the same workers (loky's
    get_reusable_executor would keep one executor, and its processes, per thread)."""
    pids = set()
    for _ in range(4):
        pids |= set(in_thread(parallel.run_all, os.getpid, [{}] * 4))
    assert os.getpid() not in pids and len(pids) <= parallel.cpus()
