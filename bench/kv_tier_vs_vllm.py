"""Our CPU tier (core.kvtier) against vLLM 0.32's own CPUOffloadingManager, operation by operation.

Random sequences of what the offloading connector asks of the manager (stores offered by requests,
their completions, lookups, loads of ready prefixes and their completions, requests ending) are
applied to both; after each operation the resident keys, their chunk ids and readiness, the keys
evicted and the lookups' answers must be equal, for LRU and ARC.

Needs vLLM in its own virtual environment (never in requirements.txt), e.g. the one bench/vllm_cpu.sh
makes, with mypy_extensions added:

    /opt/vllm-venv/bin/pip install mypy_extensions
    PYTHONPATH=bench/vllm_cpu:. VLLM_TARGET_DEVICE=cpu \
        /opt/vllm-venv/bin/python -m bench.kv_tier_vs_vllm --sequences 2000

(bench/vllm_cpu/sitecustomize.py hides the torchvision wheels that do not import on the CPU torch)
"""
from __future__ import annotations

import argparse
import random


class Driver:
    """One random sequence applied to both managers (ours: core.kvtier.tier.CPUTier; theirs: vLLM's)."""

    def __init__(self, policy: str, seed: int, capacity: int, pool: int):
        from vllm.v1.kv_offload.base import make_offload_key
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        from core.kvtier.tier import CPUTier
        self.rng, self.seed, self.pool = random.Random(seed), seed, pool
        self.ours = CPUTier(capacity, policy, 1, 1.0, 0.0, 16)
        self.ref = CPUOffloadingManager(capacity, cache_policy=policy)
        self.keys = [make_offload_key(bytes([k]) * 8, 0) for k in range(pool)]   # one KV-cache group, as ours
        self.live: dict[int, dict] = {}    # request -> {keys, stored (vLLM's next index), ctx}
        self.flight: list[tuple[str, int, list]] = []   # vLLM's jobs in flight: (kind, request, keys)
        self.next_req, self.now, self.ops = 0, 0.0, 0

    def _new(self, keys=()) -> int:
        from vllm.v1.kv_offload.base import ReqContext
        r, ctx = self.next_req, ReqContext(str(self.next_req))
        self.next_req += 1
        self.ref.on_new_request(ctx)
        self.live[r] = {"keys": list(keys), "stored": len(keys), "ctx": ctx}
        return r

    def offer(self):
        """A request's step offers more prompt blocks (a new request, or one going on)."""
        rng = self.rng
        r = self._new() if not self.live or rng.random() < 0.3 else rng.choice(list(self.live))
        s = self.live[r]
        if any(j[1] == r and j[0] == "load" for j in self.flight):
            return
        start = rng.randrange(self.pool)
        more = [self.keys[(start + i) % self.pool] for i in range(rng.randint(1, 3))]
        s["keys"] += [k for k in dict.fromkeys(more) if k not in s["keys"]]
        for i, k in enumerate(s["keys"]):
            s["ctx"].set_offload_key_position(k, (i + 1) * 16)
        out = self.ref.prepare_store(s["keys"][s["stored"]:], s["ctx"])
        before = len(self.ours.log)
        self.ours.offer(r, s["keys"], list(range(len(s["keys"]))), len(s["keys"]), self.now)
        evicted = [j.keys for j in self.ours.log[before:] if j.kind == "evict"]
        here = (self.seed, self.ops)
        assert (out is None) == (r in self.ours.owed), (*here, "one refused the store, the other did not")
        if out is not None:
            assert (evicted[0] if evicted else []) == list(out.evicted_keys), (*here, evicted, out.evicted_keys)
            assert list(out.store_spec.block_ids) == [self.ours.chunk[k] for k in out.keys_to_store], here
            if out.keys_to_store:
                self.flight.append(("store", r, list(out.keys_to_store)))
            s["stored"] = len(s["keys"])
        self.ours.submit(self.now)

    def complete(self):
        """Everything in flight completes."""
        self.now += 10.0
        self.ours.due(self.now)
        for kind, r, ks in self.flight:
            (self.ref.complete_store if kind == "store" else self.ref.complete_load)(ks, self.live[r]["ctx"])
        self.flight = []

    def lookup(self):
        """A new request looks its prefix up and loads what it finds."""
        from vllm.v1.kv_offload.base import LookupResult
        start = self.rng.randrange(self.pool)
        want = [self.keys[(start + i) % self.pool] for i in range(self.rng.randint(1, 4))]
        r = self._new()
        ctx = self.live[r]["ctx"]
        hit, wait = 0, False
        for k in want:
            res = self.ref.lookup(k, ctx)
            if res == LookupResult.MISS:
                break
            wait |= res == LookupResult.HIT_PENDING
            hit += 1
        got = self.ours.lookup(r, want, 0)
        loading = {k for kind, _, ks in self.flight if kind == "load" for k in ks}
        theirs = None if wait or (hit and any(k in loading for k in want[:hit])) else hit
        assert got == theirs, (self.seed, self.ops, got, theirs)
        for i, k in enumerate(want):
            ctx.set_offload_key_position(k, (i + 1) * 16)
        if got:
            self.live[r].update(keys=want[:hit], stored=hit)
            self.ref.prepare_load(want[:hit], ctx)
            self.ours.load(r, want[:hit], list(range(hit)), 0, self.now, True)
            self.flight.append(("load", r, want[:hit]))

    def finish(self):
        """A request with nothing in flight ends."""
        idle = [r for r in self.live if not any(j[1] == r for j in self.flight)]
        if idle:
            r = self.rng.choice(idle)
            self.ref.on_request_finished(self.live.pop(r)["ctx"])
            self.ours.finished(r)
            self.ours.settle()

    def check(self):
        from core.kvtier.tier import PENDING
        ref, ours, here = self.ref._policy, self.ours, (self.seed, self.ops)
        resident = {k: c for k, c in ((k, ref.get(k)) for k in self.keys) if c is not None}
        assert set(resident) == set(ours.chunk), (*here, "resident keys differ")
        for k, c in resident.items():
            assert c.chunk_id == ours.chunk[k], (*here, "chunk ids differ")
            assert (c.ref_cnt == -1) == (ours.ref[k] == PENDING), (*here, "readiness differs")
            assert c.ref_cnt in (ours.ref[k], -1), (*here, "pins differ")
        assert _order(ref) == _order(ours.policy), (*here, "eviction order differs", _order(ref), _order(ours.policy))

    def step(self):
        self.now += 1.0
        x = self.rng.random()
        if x < 0.35 or not self.live:
            self.offer()
        elif x < 0.55 and self.flight:
            self.complete()
        elif x < 0.8:
            self.lookup()
        else:
            self.finish()
        self.ops += 1
        self.check()


def run(policy: str, seed: int, steps: int, capacity: int, pool: int) -> int:
    d = Driver(policy, seed, capacity, pool)
    for _ in range(steps):
        d.step()
    return d.ops


def _order(p) -> tuple:
    """What decides the next victims: LRU, the resident keys by rank; ARC, its four lists and target."""
    if hasattr(p, "t1"):
        return tuple(list(x) for x in (p.t1, p.t2, p.b1, p.b2)) + (p.target_t1_size if hasattr(p, "target_t1_size")
                                                                   else p.target,)
    ranks = p._ranks if hasattr(p, "_ranks") else p.rank
    return tuple(sorted(ranks, key=ranks.get))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", type=int, default=500)
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args(argv)
    total = 0
    for policy in ("lru", "arc"):
        for seed in range(a.sequences):
            total += run(policy, seed, a.steps, capacity=random.Random(seed).randint(2, 8), pool=12)
    print(f"equal after every one of {total:,} operations ({a.sequences} sequences x 2 policies)")


if __name__ == "__main__":
    main()
