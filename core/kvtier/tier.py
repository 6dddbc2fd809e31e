"""A CPU tier under the GPU prefix cache, with vLLM 0.32's rules (docs/kv-tiers.md cites the code).

The tier holds copies of full prompt blocks, keyed by the same chained hash as the GPU prefix cache
(one chunk = one GPU block). It is a copy, never the prefix cache itself: compute reads only GPU
blocks, and a GPU eviction leaves the tier alone. The scheduler (core.engine) asks it four things:

- `offer(req, keys, blocks)`: the step scheduling a request's prompt tokens offers every full
  prompt block those tokens complete (OffloadingConnectorScheduler._build_store_jobs). Keys already
  in the tier are skipped; new ones are inserted *pending* (not readable, not evictable), evicting
  exactly the shortfall by the policy (core.kvtier.policy) or, if that is impossible, storing none of
  the offer, which is made again the next step (CPUOffloadingManager.prepare_store).
- `submit(t_end)`: the step's stores start when it ends, in order behind earlier stores (the store
  direction of the host link is one FIFO stream); each is done `latency + bytes / bandwidth` after it
  starts (loads have their own stream).
- `lookup(req, keys, first)`: at admission, after the GPU hit (`first` blocks), how many consecutive
  blocks the tier holds ready; None when the request must wait a step (a block in reach still pending,
  or being loaded for another request, or the request's own stores unfinished).
- `load(req, keys, blocks, now)`: a CPU hit pins its chunks and starts a load at once; the request
  holds its GPU blocks and runs its prefill, minus the GPU-hit and loaded tokens, only after
  `due(now)` reports the load done (a scheduler step after the copy ends).

Completions are applied at the next scheduling at or after their end (`due`): vLLM's engine keeps
stepping while transfers are pending and applies them after the step whose poll sees them done.
A request's end refreshes the recency of every key it loaded, stored or found in the tier, at the
next scheduling, after that step's stores (`finished`).

Counts (`stats`): hits by tier on first admission (GPU blocks from the prefix cache, CPU blocks
loaded; one definition with and without a tier), blocks stored, loaded, evicted, bytes and busy time
per direction. `log`: one row per store or load job (kind, request, blocks, CPU chunk ids, GPU block
ids, offered, start, end).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.engine.prefix_cache import block_hash
from core.errors import ConfigError
from core.kvtier.policy import POLICIES

PENDING = -1   # a chunk's reference count while its store runs (vLLM's ChunkStatus.ref_cnt)


@dataclass(slots=True)
class Job:
    kind: str                 # "store" (GPU -> CPU) or "load" (CPU -> GPU)
    req: int
    keys: list
    chunks: list[int]         # CPU chunk ids
    blocks: list[int]         # GPU block ids
    t_offer: float
    t_start: float = float("nan")
    t_end: float = float("nan")
    first: bool = False       # a load on the request's first admission (its CPU hits)


@dataclass(slots=True)
class _Seen:
    """What one request did with the tier (the manager's per-request access record)."""
    pos: dict = field(default_factory=dict)       # keys observed -> block index in the request's prefix
    inserted: set = field(default_factory=set)
    reused: set = field(default_factory=set)
    missed: set = field(default_factory=set)      # keys already reported as store misses
    next_block: int = 0                           # prompt blocks offered so far (next_stored_chunk_idx)
    jobs: int = 0                                 # its transfers in flight


class CPUTier:
    def __init__(self, num_blocks: int, policy: str, block_bytes: int, gbps: float, latency_ms: float,
                 block_size: int):
        self.capacity = num_blocks
        self.block_size = block_size
        self.policy = POLICIES[policy](num_blocks)
        self.block_bytes = block_bytes
        self.bytes_per_ms = gbps * 1e6
        self.latency_ms = latency_ms
        self.chunk: dict[bytes, int] = {}      # key -> CPU chunk id
        self.ref: dict[bytes, int] = {}        # key -> PENDING, 0 (ready, evictable) or loads reading it
        self._fresh = 0
        self._free: list[int] = []
        self._n_evictable = 0
        self._req: dict[int, _Seen] = {}
        self._queued: list[Job] = []           # stores offered this step, not yet started
        self._flight: list[Job] = []           # started, not yet applied
        self._free_at = {"store": 0.0, "load": 0.0}   # each direction's stream is free from then
        self.loading: dict[int, Job] = {}      # request -> its load in flight
        self.loaded: dict[int, int] = {}       # request -> blocks loaded (its load applied, not yet scheduled)
        self._being_loaded: dict[bytes, int] = {}
        self.owed: set[int] = set()            # requests whose last offer found no room (offered again)
        self._ended: list[int] = []            # finished requests, their recency refreshed at the next scheduling
        self.log: list[Job] = []
        self.listener: Callable | None = None   # fn(+1 stored | -1 evicted, key, t_ms): a router's tier-aware index
        self.jobs: list[Job] = []              # copies decided since the last take (an executor that copies makes them)
        self.first_hits: dict[int, tuple[int, int]] = {}   # request -> (GPU, CPU) hit blocks, first admission
        self._keys: dict[int, list] = {}       # request -> its full blocks' chained hashes (the lookup's keys)
        self.stats = {"gpu_hit_blocks": 0, "cpu_hit_blocks": 0, "stored": 0, "loaded": 0, "evicted": 0,
                      "store_failures": 0, "store_bytes": 0, "load_bytes": 0, "store_ms": 0.0, "load_ms": 0.0,
                      "queried_tokens": 0}   # prompt tokens looked up in the tier (past the GPU hit), first admissions

    # ---- admission ------------------------------------------------------------------------------
    def lookup(self, req: int, keys: list, first: int) -> int | None:
        """Blocks keys[first:] the tier holds ready, consecutively from `first` (0: a miss); None: ask
        again next step (a block in reach is pending or being loaded, or the request has transfers
        in flight)."""
        s = self._req.get(req)
        if s is not None and s.jobs:
            return None
        hit, wait = 0, False
        for key in keys[first:]:
            r = self.ref.get(key)
            if r is None:
                break
            wait |= r == PENDING
            hit += 1
        if wait:
            return None
        if hit and self._being_loaded and any(k in self._being_loaded for k in keys[first:first + hit]):
            return None
        return hit

    def keys(self, req: int, token_ids, n_blocks: int, extra: bytes) -> list:
        """The chained hashes of the first `n_blocks` full blocks of `token_ids` (kept per request: a
        request's known tokens only grow)."""
        got = self._keys.get(req)
        if got is None:
            got = self._keys[req] = []
        bs = self.block_size
        for i in range(len(got), n_blocks):
            got.append(block_hash(got[-1] if got else None, tuple(token_ids[i * bs:(i + 1) * bs]), extra))
        return got

    def admitted(self, req: int, gpu_blocks: int, cpu_blocks: int, first: bool, tokens: int):
        """Hits by tier, counted on a request's first admission (GPU: the prefix cache's blocks), with the
        tokens the tier was asked for (`tokens` less the GPU hit: vLLM's external_prefix_cache_queries)."""
        if first:
            self.stats["gpu_hit_blocks"] += gpu_blocks
            self.stats["cpu_hit_blocks"] += cpu_blocks
            self.stats["queried_tokens"] += tokens - gpu_blocks * self.block_size
            self.first_hits[req] = (gpu_blocks, cpu_blocks)

    def load(self, req: int, keys: list, blocks: list[int], first: int, now_ms: float, first_admission: bool):
        """Start loading `keys` into GPU `blocks` for `req` (a CPU hit after `first` GPU-hit blocks):
        its chunks are pinned."""
        s = self._seen(req)
        chunks = []
        for key in keys:
            if self.ref[key] == 0:
                self.policy.evictable(key, False)
                self._n_evictable -= 1
            self.ref[key] += 1
            chunks.append(self.chunk[key])
            self._being_loaded[key] = self._being_loaded.get(key, 0) + 1
        self._observe(s, [(k, first + i) for i, k in enumerate(keys)])
        s.reused.update(k for k in keys if k not in s.inserted)
        s.next_block = first + len(keys)   # (later offers start after the loaded blocks: next_stored_chunk_idx)
        job = Job("load", req, list(keys), chunks, list(blocks), now_ms, first=first_admission)
        self._start(job, now_ms)
        self.jobs.append(job)
        self.loading[req] = job
        s.jobs += 1

    # ---- stores ---------------------------------------------------------------------------------
    def offer(self, req: int, keys: list, blocks: list[int], upto: int, now_ms: float):
        """The step scheduled at `now_ms` takes `req` up to `upto` full prompt blocks; keys/blocks: its
        full blocks' hashes and GPU blocks (at least `upto`). Offers those not offered yet."""
        s = self._seen(req)
        lo = s.next_block
        self.owed.discard(req)
        if upto <= lo:
            return
        offer = keys[lo:upto]
        new = [k for k in offer if k not in self.chunk]
        ready = [k for k in offer if k in self.chunk and self.ref[k] != PENDING]
        misses = [k for k in new if k not in s.missed]
        if misses:
            self.policy.store_miss(misses)
            s.missed.update(misses)
        keep = set(new) | set(ready)
        self._observe(s, [(k, lo + i) for i, k in enumerate(offer) if k in keep])
        s.reused.update(k for k in ready if k not in s.inserted)
        if new:
            if not self._room(len(new), set(offer), now_ms):   # no room: nothing stored, offered again next step
                self.stats["store_failures"] += 1
                self.owed.add(req)
                return
            at = dict(zip(offer, blocks[lo:upto]))
            job = Job("store", req, new, self._insert(new), [at[k] for k in new], float("nan"))
            self._queued.append(job)
            self.jobs.append(job)
            s.inserted.update(new)
            s.jobs += 1
        s.next_block = upto

    def _room(self, n: int, protected: set, now_ms: float) -> bool:
        """Free chunks for `n` new keys, evicting exactly the shortfall (all or nothing)."""
        short = n - (len(self._free) + self.capacity - self._fresh)
        if short <= 0:
            return True
        out = self.policy.evict(short, protected) if short <= self._n_evictable else None
        if out is None:
            return False
        freed = [self.chunk.pop(key) for key in out]
        for key in out:
            del self.ref[key]
        self._free += freed
        self._n_evictable -= len(out)
        self.log.append(Job("evict", -1, out, freed, [], now_ms, now_ms, now_ms))
        if self.listener is not None:
            for key in out:
                self.listener(-1, key, now_ms)
        self.stats["evicted"] += len(out)
        return True

    def _insert(self, keys: list) -> list[int]:
        """Chunks for new keys, pending (never-used ids first, then the last freed)."""
        chunks = []
        for key in keys:
            if self._fresh < self.capacity:
                c, self._fresh = self._fresh, self._fresh + 1
            else:
                c = self._free.pop()
            self.chunk[key], self.ref[key] = c, PENDING
            self.policy.insert(key)
            chunks.append(c)
        return chunks

    def submit(self, t_end_ms: float, jobs: list | None = None, measured: list | None = None):
        """The stores offered in the step that ended at `t_end_ms` start (behind earlier ones); `measured`:
        the (start, end) of that step's `jobs` as an executor made them (replacing the modelled times)."""
        for job in self._queued:
            job.t_offer = t_end_ms
            self._start(job, t_end_ms)
        self._queued = []
        if measured is not None:
            self.measured(jobs or [], measured)

    def take_jobs(self) -> list[Job]:
        """The copies decided since the last call (loads planned, stores offered), for an executor that
        makes them (the runner); forgotten here."""
        jobs, self.jobs = self.jobs, []
        return jobs

    def measured(self, jobs: list[Job], times: list):
        """The copies an executor made, with their measured (start, end) ms: these replace the modelled
        times (a store made right after its step: offered then)."""
        for job, (t0, t1) in zip(jobs, times):
            if job.kind == "store":
                job.t_offer = min(job.t_offer, t0) if job.t_offer == job.t_offer else t0
            job.t_start, job.t_end = t0, t1

    def _start(self, job: Job, t_ms: float):
        d = job.kind
        job.t_start = max(t_ms, self._free_at[d])
        job.t_end = job.t_start + self.latency_ms + len(job.keys) * self.block_bytes / self.bytes_per_ms
        self._free_at[d] = job.t_end
        self._flight.append(job)
        self.log.append(job)

    # ---- completions ----------------------------------------------------------------------------
    def next_done_ms(self) -> float | None:
        """When the earliest copy in flight ends (None: none is): a load lets its request join, a store makes
        its blocks readable to a lookup that waits for them."""
        return min(j.t_end for j in self._flight) if self._flight else None

    def due(self, now_ms: float) -> list[int]:
        """Apply the transfers done by `now_ms`, in the order they ended; returns the requests whose
        load is done (they may now be scheduled), then refreshes the recency of finished requests."""
        done = [j for j in self._flight if j.t_end <= now_ms]
        ready = []
        if done:
            self._flight = [j for j in self._flight if j.t_end > now_ms]
            done.sort(key=lambda j: (j.t_end, j.kind == "load"))
            for job in done:
                n = len(job.keys)
                self.stats[f"{job.kind}_bytes"] += n * self.block_bytes
                self.stats[f"{job.kind}_ms"] += job.t_end - job.t_start
                if job.kind == "store":
                    self.stats["stored"] += n
                    for key in job.keys:
                        if self.ref.get(key) == PENDING:
                            self.ref[key] = 0
                            self._n_evictable += 1
                            self.policy.evictable(key, True)
                            if self.listener is not None:
                                self.listener(1, key, job.t_end)
                else:
                    self.stats["loaded"] += n
                    for key in job.keys:
                        self.ref[key] -= 1
                        if self.ref[key] == 0:
                            self._n_evictable += 1
                            self.policy.evictable(key, True)
                        k = self._being_loaded[key] - 1
                        if k:
                            self._being_loaded[key] = k
                        else:
                            del self._being_loaded[key]
                    if self.loading.get(job.req) is job:
                        del self.loading[job.req]
                        self.loaded[job.req] = n
                        ready.append(job.req)
                s = self._req.get(job.req)
                if s is not None:
                    s.jobs -= 1
        return ready

    def finished(self, req: int):
        """Request `req` ended (finished, aborted): its keys' recency is refreshed at the next
        scheduling, after that step's stores."""
        if req in self._req:
            self._ended.append(req)
        self.loading.pop(req, None)
        self.loaded.pop(req, None)
        self.owed.discard(req)
        self._keys.pop(req, None)

    def settle(self, take: bool = False) -> list[Job] | None:
        """After a scheduling's stores: the finished requests' keys refreshed, head newest. `take`: return
        the copies decided since the last take (take_jobs), else None."""
        for req in self._ended:
            s = self._req.pop(req)   # (keys in prefix order, as the manager sorts them by position)
            self.policy.finished(sorted(s.pos, key=s.pos.__getitem__), s.inserted - s.reused, s.reused)
        self._ended = []
        return self.take_jobs() if take else None

    def events(self, ids) -> list[dict]:
        """The log as trace events (type "tier", core.trace.schema.TIER), requests named by `ids`."""
        out = []
        for j in self.log:
            n = len(j.keys)
            e = {"type": "tier", "t_ms": j.t_start, "op": j.kind, "req": ids[j.req] if j.req >= 0 else None,
                 "blocks": n, "bytes": 0 if j.kind == "evict" else n * self.block_bytes,
                 "dur_ms": j.t_end - j.t_start, "offered_ms": j.t_offer, "chunks": list(j.chunks),
                 "gpu_blocks": list(j.blocks), "hashes": [k.hex()[:16] for k in j.keys]}
            if j.kind == "load":
                e["first"] = j.first
            out.append(e)
        return out

    # ---- helpers --------------------------------------------------------------------------------
    def _seen(self, req: int) -> _Seen:
        s = self._req.get(req)
        if s is None:
            s = self._req[req] = _Seen()
        return s

    @staticmethod
    def _observe(s: _Seen, keyed):
        for k, i in keyed:
            s.pos.setdefault(k, i)

    @property
    def busy(self) -> bool:
        """Stores offered and not yet started, or offers owed: the scheduler must step one by one."""
        return bool(self._queued or self.owed)

    def used(self) -> int:
        return len(self.chunk)

    def metrics(self) -> tuple:
        """vLLM's offloading metrics so far: (store bytes, load bytes, store seconds, load seconds, CPU cache
        usage 0..1 (chunks being written or read over the capacity, as CPUOffloadingManager.get_stats),
        external prefix-cache queries and hits, tokens)."""
        s = self.stats
        busy = len(self.chunk) - self._n_evictable
        return (s["store_bytes"], s["load_bytes"], s["store_ms"] / 1e3, s["load_ms"] / 1e3,
                busy / self.capacity if self.capacity else 0.0, s["queried_tokens"],
                s["cpu_hit_blocks"] * self.block_size)

    def check(self):
        ids = list(self.chunk.values()) + self._free
        assert len(set(ids)) == len(ids), "a CPU chunk id is used twice"
        assert len(self.chunk) <= self.capacity
        for key in self.chunk:
            assert key in self.policy, "a resident chunk unknown to the policy"


def make_tier(cfg) -> CPUTier | None:
    """The tier a SchedulerConfig asks for (None: cpu_kv_blocks 0)."""
    if not cfg.cpu_kv_blocks:
        return None
    if cfg.kv_block_bytes is None:
        raise ConfigError("kv_block_bytes: the CPU tier prices each copy by the bytes of a KV block (all layers, K "
                          "and V); give it (e.g. 2 x layers x kv_heads x head_dim x block_size x dtype bytes)")
    return CPUTier(cfg.cpu_kv_blocks, cfg.cpu_kv_policy, cfg.kv_block_bytes, cfg.host_gbps, cfg.host_latency_ms,
                   cfg.block_size)


