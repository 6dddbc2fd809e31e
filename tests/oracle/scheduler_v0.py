"""Test oracle (issue 50): the scheduler as it was before the decode counter and calendars, kept
only to compare traces with (tests/test_oracle.py). Not shipped code."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np

from core.config import BIG, SchedulerConfig
from core.engine import admission as adm
from core.engine.kv_cache import KVCacheManager
from core.engine.outputs import (
    EMPTY,
    EngineOutputs,
    ExecutorOutput,
    Finish,
    Preemption,
    SchedulerOutput,
    SchedulerStats,
    StepRecord,
)
from core.errors import ConfigError
from core.workload import Request, Workload
from tests.oracle import fastforward_v0 as fastforward
from tests.oracle import policies_v0 as policies
from tests.oracle.requests_v0 import DONE, NOT_ARRIVED, RUNNING, WAITING, RequestTable

_tuple = tuple.__new__   # makes a NamedTuple without its Python-level __new__ (once per step)


class Scheduler:
    decode_fast_path = True   # False: plan every step in full (tests compare the two)

    def __init__(self, workload: Workload | None, config: SchedulerConfig, stop_token_ids: Iterable[int] = (),
                 request_data: bool = False, kv_events: bool = False, explicit_batches: bool = True):
        """`workload` None: no requests yet (a server adds them with add_request).
        `request_data`: each SchedulerOutput carries the token ids and block ids the executor
        has not been sent yet (an executor that runs a model keeps its own copy).
        `kv_events`: the KV block events go out with the EngineOutputs (a recorder wants them).
        The scheduler records nothing itself: everything it did is in its EngineOutputs."""
        self.cfg = config
        self.stop_token_ids = frozenset(stop_token_ids)  # a request emitting one of these stops (EOS)
        self.requests = t = RequestTable(workload)
        # cancellations, earliest first: (time, request, finish reason "abort" or "deadline")
        self.aborts = sorted((float(t.abort_at[i]), i, why) for i, why in t.abort_reason.items())
        num_blocks = adm.pool_blocks(config, t)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.prefix_caching, config.model_id, kv_events)
        self.tier = self.copies = None   # (the oracle predates the CPU tier: runs without one)
        # vLLM V1 caches a request's full blocks (outputs too) when it schedules the tokens that fill them
        self.cache_when_scheduled = config.prefix_caching and config.kv_manager == "vllm-v1"
        self.rules = policies.RULES[config.policy]
        self.seats = config.seats
        self.running = np.empty(0, dtype=np.int64)   # running request rows, admission order
        self.waiting = adm.make_waiting(config, t)   # request rows, in admission order
        self.ran: set[int] = set()         # requests ever admitted (never rejected by queue_limit)
        self.watermark_blocks = adm.watermark_blocks(config, num_blocks)
        self.failed = {"rejected": 0, "deadline": 0}
        self.next_arrival = 0
        # A fleet adds requests as they are routed, so no run of fast-forwarded steps may pass
        # the next time one could be (core.fleet sets it before each step; None: no limit).
        self.horizon_ms: float | None = None
        self.num_done = 0
        self.step = 0
        self.num_preemptions = 0
        self.quiet = False       # the last planned step: nobody joined or left the running set
        self._step_gauges = None  # (running, waiting, kv used, kv free) when the pending step was planned
        self._steady = False     # the last step ran every running request (set by update)
        self._prefilling = None  # ... and these of them (mask over running) are mid-prefill
        self._consts: dict = {}
        self._ff_after = 0       # no fast-forward can succeed before this step (a request finishes first)
        self.run_after = None    # the last fast-forwarded run: per step (running, waiting, KV used) after it
        # what happened since the last EngineOutputs (outside a step's own results)
        self._finished: list[Finish] = []
        self._queued: list[int] = []
        self._started: list[int] = []
        self._preempted: list[Preemption] = []
        # request_data: how much of each request's token ids and block table the executor has
        self.request_data = request_data
        self._sent_tokens: dict[int, int] = {}
        self._sent_blocks: dict[int, int] = {}
        self._gone: list[int] = []

    # ---- requests arriving while the loop runs (a server) -----------------------------------
    def add_request(self, r: Request, stop_ids: Iterable[int] | None = None, preloaded: int = 0,
                    client_abort: bool = False) -> int:
        """Append request `r` (arrival times must not decrease) and return its row. `stop_ids`
        replace the scheduler's stop ids for it (() ignores EOS). `preloaded`: prompt tokens
        whose KV arrives with the request (disaggregated decode: computed elsewhere and
        transferred); they count as computed when it first joins, in blocks of its own.
        `client_abort`: its abort_at_ms is applied here (a simulated client: a fleet's replica).
        Refused with ConfigError: a request that could never run (prompt + output over the KV pool without a context
        budget to reject it; a prompt over the token budget without chunked prefill)."""
        t = self.requests
        why = adm.refusal(self.cfg, r.prompt_tokens, r.max_output_tokens, self.kv.num_blocks)
        if why is not None:
            raise ConfigError(why)
        if t.n and r.arrival_ms < t.arrival[t.n - 1]:
            raise ValueError(f"arrival {r.arrival_ms} ms is before the previous request's")
        i = t.add(r, stop_ids, client_abort)
        if preloaded:
            t.preloaded[i] = min(int(preloaded), r.prompt_tokens - 1)
        if i in t.abort_reason:   # (its deadline joins the cancellations, not abort_at_ms: a client cancels itself)
            bisect.insort(self.aborts, (float(t.abort_at[i]), i, t.abort_reason[i]))
        return i

    @property
    def n(self) -> int:
        return self.requests.n

    # ---- clock-driven inputs ---------------------------------------------------------
    def done(self) -> bool:
        return self.num_done == self.requests.n

    def admit_arrivals(self, now_ms: float):
        t = self.requests
        while self.next_arrival < t.n and t.arrival[self.next_arrival] <= now_ms:
            i = self.next_arrival
            if t.state[i] == NOT_ARRIVED:
                why = adm.too_big(self.cfg, int(t.prompt_len[i]), int(t.out_len[i]), self.kv.num_blocks)
                if why is not None:
                    self._finish_failed(i, Finish(i, float(t.arrival[i]), adm.REJECTED, why,
                                                                       "max_model_len"))
                else:
                    self.waiting.append(i)
                    t.state[i] = WAITING
                    self._queued.append(i)
            self.next_arrival += 1

    def next_event_ms(self) -> float | None:
        """When something can next happen while idle: an arrival or an abort."""
        t = self.requests
        times = []
        nxt = self.next_arrival
        while nxt < t.n and t.state[nxt] == DONE:
            nxt += 1
        if nxt < t.n:
            times.append(float(t.arrival[nxt]))
        for when, i, _ in self.aborts:
            if t.state[i] != DONE:
                times.append(when)
                break
        return min(times) if times else None

    def abort(self, i: int, now_ms: float, reason: str = "abort", t_finish: float | None = None,
              detail: str | None = None):
        """Cancel request i wherever it is; its blocks return to the pool at `now_ms`; the
        finish is stamped `t_finish` (when the client cancelled) if given."""
        t = self.requests
        if t.state[i] == DONE:
            return
        if reason == adm.DEADLINE:
            self.failed[adm.DEADLINE] += 1
        if t.state[i] == RUNNING:
            self.leave_running(i, now_ms)
        elif t.state[i] == WAITING:
            self.waiting.remove(i)
        self._done(i, Finish(i, now_ms if t_finish is None else t_finish, reason, detail))

    def leave_running(self, i: int, now_ms: float, free_blocks: bool = True):
        """Take request i out of the running set (its KV blocks freed unless `free_blocks` is
        False: the deliberately broken variant in core.lessons.pathologies)."""
        if free_blocks:
            self.kv.now_ms = now_ms
            self._free(i)
        self.running = self.running[self.running != i]
        self._steady = False

    def _abort_due(self, now_ms):
        while self.aborts and self.aborts[0][0] <= now_ms:
            _, i, why = self.aborts.pop(0)
            self.abort(i, now_ms, why)

    def _done(self, i: int, f: Finish):
        self.requests.state[i] = DONE  # a request not yet arrived is skipped when it would arrive
        self.num_done += 1
        self._finished.append(f)

    def _finish_failed(self, i: int, f: Finish):
        """A request that never ran and never will (rejected)."""
        self.failed[f.reason] += 1
        self._done(i, f)

    def _free(self, i: int) -> int:
        freed = self.kv.free_seq(i)
        self.requests.nblocks[i] = 0
        if self.request_data:
            self._sent_blocks[i] = 0
        return freed

    # ---- one step ----------------------------------------------------------------------
    def schedule(self, now_ms: float) -> SchedulerOutput | None:
        """Choose the next step's batch (None if there is nothing to run now)."""
        cfg, kv = self.cfg, self.kv
        kv.now_ms = now_ms
        self._abort_due(now_ms)
        budget = cfg.token_budget if cfg.token_budget is not None else BIG
        if self.rules.prefill_steps and self.waiting:   # vllm-v0: a step of new prompts when any can join
            joins, _ = self._admit_waiting(budget, 0, len(self.running))
            self.reject_over_bound(now_ms)
            if joins:
                return self._planned(self._joined_batch(joins, now_ms), joined=True)
        run = self.running
        # who may join in this step: static, only into an empty batch; vllm-v0, only in a step of
        # prompts alone (above)
        cohort_open = not self.rules.prefill_steps and (not self.rules.cohorts or len(run) == 0)
        preempted = False
        if len(run):
            steady = self._steady and self.decode_fast_path
            plan = policies.plan_running(self, run, budget, self._prefilling, steady)
            while not plan.steady and int(plan.need.sum()) > kv.num_free:
                pos = adm.victim_position(cfg, run, self.requests)   # fcfs: the newest
                self._preempt(int(run[pos]), now_ms)
                run = np.delete(run, pos)
                preempted = True
                plan = policies.plan_running(self, run, budget)
            if plan.grow is not None:   # decodes only: one block each where a position starts one
                if len(plan.grow):
                    who = run[plan.grow]
                    kv.grow_one_each(who.tolist())
                    self.requests.nblocks[who] += 1
            else:
                self._grow(run, plan.need)
            if self.cache_when_scheduled:
                self._cache_scheduled(run, plan.start, self._const("ones", len(run)) if plan.num_tokens is None
                                      else plan.num_tokens)
            used = len(run) if plan.num_tokens is None else int(plan.num_tokens.sum())
        else:
            plan = None
            used = 0
        joins = []
        if cohort_open and not preempted:
            joins, used = self._admit_waiting(budget, used, len(run))
        self.reject_over_bound(now_ms)
        batch = self._batch(run, plan, joins, used, now_ms)
        if batch is None:
            return None
        return self._planned(batch, joined=bool(joins) or preempted)

    def _cache_scheduled(self, reqs: np.ndarray, start: np.ndarray, n: np.ndarray):
        """vllm-v1: the blocks a step will fill are cached when it is scheduled, request by request
        (running ones first, then each as it joins: one that joins after them may already hit
        them); a simulated request's output ids, unknown, are stand-ins of its own
        (core.engine.kv_cache.commit)."""
        t, kv, bs = self.requests, self.kv, self.cfg.block_size
        end = start + n
        for j in np.flatnonzero(end // bs > start // bs).tolist():
            i = int(reqs[j])
            ids = t.token_ids[i]
            if ids is not None:
                kv.commit(i, ids, int(end[j]), int(t.prompt_len[i] + t.emitted[i]), -(i + 1))

    def _preempt(self, victim: int, now_ms: float):
        t = self.requests
        freed = self._free(victim)
        t.computed[victim] = 0
        t.state[victim] = WAITING
        self.waiting.appendleft(victim)
        self.num_preemptions += 1
        self._preempted.append(Preemption(victim, now_ms, "kv_full", freed))

    def _grow(self, run: np.ndarray, need: np.ndarray):
        """Append `need` fresh KV blocks to each running request's table."""
        grow = np.flatnonzero(need > 0)
        if not len(grow):
            return
        who, more = run[grow], need[grow]
        nblocks = self.requests.nblocks
        if int(more.sum()) == len(grow):   # one block each
            self.kv.grow_one_each(who.tolist())
        else:
            self.kv.grow_many(who.tolist(), more.tolist())
        nblocks[who] += more

    def _admit_waiting(self, budget: int, used: int, running: int) -> tuple[list[policies.Join], int]:
        """Admit waiting requests, head of the queue first, while a seat, the budget left and KV
        blocks (with the watermark) allow, `running` seats being taken; never skips past a head
        that does not fit. Returns (the joins, budget used)."""
        joins = []
        seats = self.seats - running
        while self.waiting and seats > 0 and budget - used > 0:
            j = policies.next_join(self, budget - used)
            if j is None:
                break
            self._join(j)
            joins.append(j)
            used += j.take
            seats -= 1
        return joins, used

    def _join(self, j: policies.Join):
        t, r = self.requests, j.req
        self.waiting.popleft()
        self.kv.admit(r, j.hits, t.salt[r])
        self.kv.grow(r, j.cached + j.take)
        t.computed[r] = j.cached
        if t.preloaded:
            t.preloaded.pop(r, None)   # (preempted later, it recomputes everything here)
        t.nblocks[r] = len(self.kv.tables[r])
        t.state[r] = RUNNING
        if self.cache_when_scheduled:
            ids = t.token_ids[r]
            if ids is not None:
                self.kv.commit(r, ids, j.cached + j.take, int(t.prompt_len[r] + t.emitted[r]), -(r + 1))
        if r not in self.ran:
            self.ran.add(r)
            self._started.append(r)

    def _joined_batch(self, joins, now_ms) -> SchedulerOutput:
        """vllm-v0: a step of just the prompts that joined."""
        reqs, _, cached, take, todo = (np.array(c, dtype=np.int64) if k != 1 else None
                                       for k, c in enumerate(zip(*joins)))
        self.running = np.concatenate([self.running, reqs])
        return SchedulerOutput(self.step, now_ms, reqs, take, cached, np.ones(len(reqs), dtype=bool), take >= todo)

    def _batch(self, run, plan, joins, used, now_ms) -> SchedulerOutput | None:
        """The step's batch: the running requests that take part, then the ones that joined."""
        m0 = len(run)
        if plan is not None and plan.grow is not None and not joins:   # decodes only (the common step)
            self.running = run
            return SchedulerOutput(self.step, now_ms, run, self._const("ones", m0), plan.start,
                                   self._const("false", m0), self._const("true", m0))
        if plan is None:
            n = start = np.empty(0, dtype=np.int64)
            is_prefill = emits = np.empty(0, dtype=bool)
        else:
            n = plan.num_tokens if plan.num_tokens is not None else self._const("ones", m0)
            is_prefill = plan.is_prefill if plan.is_prefill is not None else self._const("false", m0)
            emits = plan.emits if plan.emits is not None else self._const("true", m0)
            start = plan.start
        if joins:   # (the joins' columns as tuples: numpy takes them as they are)
            new, _, new_start, new_n, new_todo = zip(*joins)
            run = np.concatenate([run, new])
            n = np.concatenate([n, new_n])
            start = np.concatenate([start, new_start])
            is_prefill = np.concatenate([is_prefill, np.ones(len(joins), dtype=bool)])
            emits = np.concatenate([emits, [a >= b for a, b in zip(new_n, new_todo)]])
        self.running = run
        if plan is None or not plan.steady:   # entries left without tokens (over the budget) sit out
            k = np.count_nonzero(n)
            if not k:
                return None
            if k < len(n):
                active = n > 0
                return SchedulerOutput(self.step, now_ms, run[active], n[active], start[active],
                                       is_prefill[active], emits[active])
        return SchedulerOutput(self.step, now_ms, run, n, start, is_prefill, emits)

    def _planned(self, batch: SchedulerOutput, joined: bool) -> SchedulerOutput:
        kv = self.kv
        free = kv.num_free
        self._step_gauges = (len(self.running), len(self.waiting), kv.num_blocks - free, free)
        self.quiet = not joined  # nothing joined or left the running set
        if self.request_data:
            self._attach_data(batch)
        return batch

    def _attach_data(self, batch: SchedulerOutput):
        """What the executor has not been sent: each entry's new token ids and block table
        changes (a table only grows, or loses its tail: the kept length says which), and the
        requests that left."""
        t, tables = self.requests, self.kv.tables
        toks, blocks = [], []
        for i in batch.reqs.tolist():
            ids = t.token_ids[i] or []
            s = self._sent_tokens.get(i, 0)
            toks.append(ids[s:])
            self._sent_tokens[i] = len(ids)
            table = tables[i]
            k = self._sent_blocks.get(i, 0)
            blocks.append((k, table[k:]))
            self._sent_blocks[i] = len(table)
        batch.new_token_ids, batch.block_updates = toks, blocks
        batch.finished, self._gone = self._gone, []

    def reject_over_bound(self, now_ms: float):
        for i in adm.over_bound(self.cfg, self.waiting, self.ran):   # queue_limit
            self.waiting.remove(i)
            self._finish_failed(i, Finish(
                i, now_ms, adm.REJECTED, f"{len(self.waiting) + 1} requests waiting, over the queue limit of "
                f"{self.cfg.queue_limit}", "queue_limit"))

    def _const(self, kind: str, k: int) -> np.ndarray:
        """k ones (int64), True or False: read-only views of one array per kind."""
        a = self._consts.get(kind)
        if a is None or len(a) < k:
            a = (np.ones if kind != "false" else np.zeros)(max(k, 256), dtype=np.int64 if kind == "ones" else bool)
            a.flags.writeable = False
            self._consts[kind] = a
        return a[:k]

    def fast_forward(self, batch: SchedulerOutput, durations, min_steps: int = 3) -> EngineOutputs | None:
        """Simulator shortcut (core.engine.fastforward): apply a run of identical decode-only steps
        starting with `batch` at once; returns the run's EngineOutputs (what stepping them one by
        one would report, as arrays: the same trace), or None (then complete the step as usual)."""
        if (self.step < self._ff_after or self.aborts or not self.quiet or len(batch.reqs) != len(self.running)
                or self.cfg.queue_limit is not None or batch.prefill_tokens or self.cfg.spec_gamma
                or self.cache_when_scheduled):
            return None
        run, wait = fastforward.plan(self, batch, durations, min_steps)
        if run is None:   # (a request about to finish blocks every run until it is gone: skip the tries)
            self._ff_after = self.step + wait
            return None
        t, kv = self.requests, self.kv
        K, members = run.steps, self.running
        emitted0 = t.emitted[members]
        waiting0, used0 = len(self.waiting), self._step_gauges[2]
        t_end = run.t_end_ms
        if run.remaining is None:
            if run.owners and not kv.append_blocks(run.owners, run.times):
                for k in run.alloc_steps:  # some block must be evicted: replay step by step, exactly
                    kv.now_ms = float(run.starts[k])
                    owners = run.members[k % self.cfg.block_size]
                    kv.grow_many(owners, [1] * len(owners))
            t.computed[members] += K
            t.emitted[members] += K
            t.nblocks[members] = adm.blocks_for(t.computed[members], self.cfg.block_size)
            fin = members[t.emitted[members] >= t.out_len[members]]
            if len(fin):   # their last token came in the run's last step: they leave at its end, as update does
                kv.now_ms = t_end
                self._finish_emitted(fin, [], t_end)
            freed = None
        else:
            took = np.minimum(run.remaining, K)
            t.computed[members] += took
            t.emitted[members] += took
            t.nblocks[members] = adm.blocks_for(t.computed[members], self.cfg.block_size)
            freed = self._through_finishes(run, members)
        rec, token_reqs, token_index, token_t = fastforward.outputs(run, self.step, members, emitted0, used0,
                                                                    waiting0, kv.num_blocks, freed)
        # what each step left behind (running, waiting, KV blocks used after its end): a fleet's
        # router hears these step by step
        used_after = rec.kv_used_blocks - (0 if freed is None else freed)
        self.run_after = (np.r_[rec.running[1:], len(self.running)], rec.waiting, used_after)
        self.step += K
        self._step_gauges = None
        return self.take_outputs(t_end, batch, float(run.durations[0]), token_reqs, token_index, None, rec,
                                 token_t)

    def _through_finishes(self, run, members: np.ndarray) -> np.ndarray:
        """A run through finishes: its block allocations and its requests' finishes in stepping
        order (a step's allocations at its start, its finishers' frees at its end); returns the
        blocks freed at the end of each step."""
        kv, K = self.kv, run.steps
        left = run.remaining
        ends = run.ends
        freed = np.zeros(K, dtype=np.int64)
        stops = sorted(set((left[left <= K] - 1).tolist()) | {K - 1})
        owners, times, osteps = run.owners, run.times, run.owner_steps
        o = 0
        for f in stops:
            e = bisect.bisect_right(osteps, f, o)
            if e > o and not kv.append_blocks(owners[o:e], times[o:e]):
                k0 = o   # some block must be evicted: step by step, exactly
                while k0 < e:
                    k1 = bisect.bisect_right(osteps, osteps[k0], k0)
                    kv.now_ms = float(times[k0])
                    kv.grow_many(owners[k0:k1], [1] * (k1 - k0))
                    k0 = k1
            o = e
            fin = members[left == f + 1]
            if len(fin):
                before = kv.num_free
                kv.now_ms = float(ends[f])
                self._finish_emitted(fin, [], float(ends[f]))
                freed[f] = kv.num_free - before
        return freed

    # ---- completing a step: one path for plain, speculative and simulated steps ---------------
    def update(self, batch: SchedulerOutput, out: ExecutorOutput) -> EngineOutputs:
        """Apply a finished step and return what happened (EngineOutputs).

        An entry emits when its computed tokens reach everything known (prompt + emitted):
        one token, or (speculative verification: 1 + gamma tokens computed) the accepted
        draft tokens plus one recovered or bonus token. Emission stops at max tokens and at
        the first stop id (EOS); the KV cache keeps only what the emitted tokens justify
        (prompt + emitted - 1 positions), so rejected draft positions return to the pool.
        A request cancelled while the step ran never receives its tokens."""
        t, kv = self.requests, self.kv
        t_end = out.t_end_ms
        kv.now_ms = t_end
        r = batch.reqs
        whole = len(r) == len(self.running)   # every running request took part
        t.computed[r] = batch.start_pos + batch.num_tokens
        emit = batch.emits if batch.emits is not None else t.computed[r] >= t.prompt_len[r] + t.emitted[r]
        cancelled = None
        if self.aborts:
            cancelled = t.abort_at[r] <= t_end
            if cancelled.any():
                emit = emit & ~cancelled
            else:
                cancelled = None
        stopped = []
        if out.tokens is None:  # simulated: one token (id unknown) per emitting entry
            er = r[emit]
            idx = t.emitted[er]
            t.emitted[er] = idx + 1
            ids = src = None
            # Every running request took part: next step those that emitted decode, the others
            # continue their prefill (the steady-state plan of core.engine.policies).
            self._steady = whole and not self.cfg.spec_gamma
            self._prefilling = None if len(er) == len(r) else ~emit
        else:
            self._steady = False
            er, idx, ids, src, stopped = self._take_tokens(batch, out, emit)
        dur = t_end - batch.t_ms if out.dur_ms is None else out.dur_ms
        rec = _tuple(StepRecord, (batch.step, batch.t_ms, dur, *self._step_gauges))
        if out.tokens is not None:
            self._roll_back(r)
        if kv.prefix_caching and not self.cache_when_scheduled:
            bs = self.cfg.block_size
            crossed = (t.computed[r] // bs) > (batch.start_pos // bs)
            for i in r[crossed].tolist():
                ids_i = t.token_ids[i]
                if ids_i is not None and i in kv.tables:
                    kv.commit(i, ids_i, int(t.computed[i]))
        # requests that reached their max tokens or a stop id leave, their blocks freed
        if out.tokens is None:   # one token each: emitted is now idx + 1
            fin = er[idx >= t.out_len[er] - 1]
        else:  # one row per token; a request's tokens are adjacent
            emitters = er[np.r_[True, er[1:] != er[:-1]]] if len(er) > 1 else er
            fin = emitters[t.emitted[emitters] >= t.out_len[emitters]]
        if len(fin) or stopped:
            self._finish_emitted(fin, stopped, t_end)
        if cancelled is not None:
            for i in r[cancelled].tolist():
                self.abort(i, t_end, t.abort_reason.get(i, "abort"), max(float(t.abort_at[i]), batch.t_ms))
        for j, why in (out.failed or {}).items():     # one request's failure ends that request only
            self.abort(int(r[j]), t_end, "error", detail=why)
        self.step += 1
        self._step_gauges = None
        return self.take_outputs(t_end, batch, dur, er, idx, ids, rec, None, src, out.events)

    def _roll_back(self, r: np.ndarray):
        """Keep KV only for the positions the emitted tokens justify (speculative rejections)."""
        t, kv = self.requests, self.kv
        keep = t.prompt_len[r] + t.emitted[r] - 1
        for j in np.flatnonzero(t.computed[r] > np.maximum(keep, 0)).tolist():
            i = int(r[j])
            if t.emitted[i] == 0:
                continue  # a prefill chunk: nothing emitted yet, nothing to roll back
            t.computed[i] = int(keep[j])
            kv.truncate(i, int(keep[j]))
            t.nblocks[i] = len(kv.tables[i])
            if self.request_data:
                self._sent_blocks[i] = min(self._sent_blocks.get(i, 0), int(t.nblocks[i]))

    def _finish_emitted(self, fin: np.ndarray, stopped: list[int], t_end: float):
        """Requests that reached their max tokens (`fin`) or a stop id leave, their blocks freed."""
        t = self.requests
        reasons = {}
        if stopped:
            extra = [i for i in stopped if t.emitted[i] < t.out_len[i]]
            if extra:
                fin = np.concatenate([fin, np.array(extra, dtype=np.int64)])
                reasons = {i: "stop" for i in extra}
        if not len(fin):
            return
        kv, state, nblocks, finished = self.kv, t.state, t.nblocks, self._finished
        for i in fin.tolist():   # (what _free and _done do, inline: one of these per request of a run)
            kv.free_seq(i)
            nblocks[i] = 0
            state[i] = DONE
            f = Finish(i, t_end, reasons.get(i, "length") if reasons else "length")
            finished.append(f)
            if self.request_data:
                self._sent_blocks[i] = 0
        self.num_done += len(fin)
        keep = t.state[self.running] == RUNNING
        self.running = self.running[keep]
        if self._prefilling is not None and len(keep) == len(self._prefilling):
            self._prefilling = self._prefilling[keep]

    def _take_tokens(self, batch, out, emit):
        """Emitted tokens of a step whose executor returned ids: cut at max tokens and at the
        first stop id. Returns (reqs, output index, ids, source codes or None, stopped reqs)."""
        t = self.requests
        emit_r, emit_idx, emit_ids, emit_src, stopped = [], [], [], [], []
        for j, i in enumerate(batch.reqs.tolist()):
            stop = t.stop_of.get(i, self.stop_token_ids)
            toks = out.tokens[j]
            if not emit[j] or not toks:
                continue
            first = int(t.emitted[i])
            k = min(len(toks), int(t.out_len[i]) - first)
            if stop:
                for m in range(k):
                    if toks[m] in stop:
                        k = m + 1
                        stopped.append(i)
                        break
            emit_r += [i] * k
            emit_idx += range(first, first + k)
            emit_ids += toks[:k]
            if out.sources is not None:
                emit_src += out.sources[j][:k]
            if t.token_ids[i] is not None:
                t.token_ids[i].extend(toks[:k])
            t.emitted[i] = first + k
        src = np.array(emit_src, dtype=np.int8) if out.sources is not None else None
        return (np.array(emit_r, dtype=np.int64), np.array(emit_idx, dtype=np.int64),
                np.array(emit_ids, dtype=np.int64), src, stopped)

    # ---- what happened ----------------------------------------------------------------------
    def stats(self) -> SchedulerStats:
        """The gauges now, with the prompt tokens the waiting requests must still compute
        (a preempted request recomputes its emitted tokens too): a router's load signals."""
        t = self.requests
        w = np.fromiter(self.waiting, np.int64, len(self.waiting))
        queued = int((t.prompt_len[w] + t.emitted[w] - t.computed[w]).sum()) if len(w) else 0
        return SchedulerStats(*self._gauges(), queued)

    def _gauges(self) -> tuple:
        """SchedulerStats' fields now, as a plain tuple (made once per step)."""
        kv = self.kv
        return (len(self.running), len(self.waiting), kv.num_used, kv.num_blocks, self.num_preemptions,
                kv.counts["hit"])

    def has_outputs(self) -> bool:
        """Something happened outside a step (arrivals queued or rejected, cancellations)."""
        return bool(self._finished or self._queued or self._preempted or self.kv.events)

    def take_outputs(self, t_ms: float, batch: SchedulerOutput | None = None, dur_ms: float | None = None,
                     token_reqs=EMPTY, token_index=EMPTY, token_ids=None, record: StepRecord | None = None,
                     token_t_ms=None, token_sources=None, events=None) -> EngineOutputs:
        """Everything that happened since the last EngineOutputs (with a step's tokens and
        record, when given), and forget it."""
        gauges = self._gauges()
        fin, queued, preempted, started = self._finished, self._queued, self._preempted, None
        if fin:
            self._finished = []
            if self.request_data:
                self._gone += [f.req for f in fin]
                for f in fin:
                    self._sent_tokens.pop(f.req, None)
                    self._sent_blocks.pop(f.req, None)
        if queued:
            self._queued = []
        if preempted:
            self._preempted = []
        if batch is not None and self._started:   # first scheduled in this step (kept for the step's outputs)
            started, self._started = self._started, []
        kv_events = self.kv.take_events() if self.kv.events else ()
        return _tuple(EngineOutputs, (t_ms, gauges, batch, dur_ms, fin or (), queued or (), started or (),
                                      preempted or (), token_reqs, token_index, token_ids, record, token_t_ms,
                                      token_sources, kv_events, events, None, (), ()))
