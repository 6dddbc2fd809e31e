"""KV block states over time (core.analysis.occupancy.block_states) against a direct, event-by-event
reading of the kv events: the vectorised search must give each block's state, ref count
and owner at every snapshot exactly."""
import numpy as np
import pytest

from core.analysis.occupancy import CACHED, FREE, OWNED, SHARED, block_states
from core.config import SchedulerConfig
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload


def direct(trace, times):
    kv = trace.kv
    op, blk, ref = kv["op"].astype(str).tolist(), kv["block"].tolist(), kv["ref"].tolist()
    req, t, hashed = kv["req"].tolist(), kv["t_ms"].tolist(), kv["hash"].notna().tolist()
    B = max(blk) + 1
    state = np.zeros((B, len(times)), np.int8)
    refs = np.zeros((B, len(times)), np.int32)
    owner = np.full((B, len(times)), -1, np.int64)
    for j, ts in enumerate(times):
        for b in range(B):
            evs = [k for k in range(len(op)) if blk[k] == b and t[k] <= ts]
            if not evs:
                continue
            e = evs[-1]
            s = SHARED if ref[e] > 1 else OWNED if ref[e] == 1 else CACHED if (hashed[e] and op[e] == "free") else FREE
            if op[e] == "evict":
                s = FREE
            state[b, j], refs[b, j] = s, ref[e]
            takes = [k for k in evs if op[k] in ("alloc", "hit", "cow", "cache")]
            if takes and s >= OWNED:
                owner[b, j] = req[takes[-1]]
    return state, refs, owner


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_states_equal_a_direct_reading(seed):
    rng = np.random.default_rng(seed)
    shared = tuple(int(x) for x in rng.integers(0, 50, 24))      # a common prefix: hits, cached-free, evictions
    reqs = []
    for i in range(40):
        own = tuple(int(x) for x in rng.integers(0, 50, int(rng.integers(1, 30))))
        ids = shared + own if rng.random() < 0.6 else own
        reqs.append(Request(f"r{i}", float(i * rng.integers(1, 6)), len(ids), int(rng.integers(1, 20)), ids))
    tr = simulate(Workload(reqs), SchedulerConfig(max_seqs=6, kv_blocks=40, block_size=4, prefix_caching=True),
                  StepModel("constant", step_ms=1.0))
    assert set(tr.kv["op"].astype(str)) >= {"alloc", "free", "hit"}
    occ = block_states(tr, max_snapshots=60)
    state, refs, owner = direct(tr, occ.times_ms)
    B = state.shape[0]
    assert np.array_equal(occ.state[:B], state) and np.array_equal(occ.ref[:B], refs)
    assert np.array_equal(occ.owner[:B], owner)


def test_busiest_snapshot_is_where_most_blocks_are_held():
    from core.analysis.occupancy import FREE, OWNED, SHARED, Occupancy
    state = np.array([[FREE, OWNED, OWNED, FREE],
                      [FREE, FREE, SHARED, FREE],
                      [FREE, OWNED, SHARED, FREE]])
    occ = Occupancy.__new__(Occupancy)
    occ.state = state
    assert occ.busiest() == 2
