"""Iteration-level request scheduler, shared by the simulator and the runner.

One step = one forward pass over a batch of (request, token count) pairs. The rule for
every request is the same: it owns `prompt + emitted` known tokens, of which `computed`
have KV in the cache; a step computes `n` more, and when computed reaches
prompt + emitted the step's last logits yield the next token (emitted += 1).
So a fresh request emits its first token in the step that finishes its prefill, and a
request with n output tokens needs n steps when its prefill fits in one step.

    out = sched.schedule(now)            # SchedulerOutput (core.engine.outputs)
    res = executor.execute(out)          # ExecutorOutput
    happened = sched.update(out, res)    # EngineOutputs: tokens, finishes with reasons, ...

Policies (who joins a step and what it mixes: serial, static, continuous, vllm-v1, vllm-v0,
orca, sarathi): core.engine.policies plans, this class applies the plans.

Limits: `max_seqs` running requests; `token_budget` tokens per step (prefill + decode);
`chunk` = chunked prefill (at most `chunk` prompt tokens per request per step; without
it a prompt is computed in a single step); KV blocks from core.engine.kv_cache.
When the running requests need more KV blocks than are free, the newest running
request is preempted (its blocks freed, to be recomputed) and re-queued at the front;
no new request is admitted in a step that preempted.

Admission control (queue order by priority, KV watermark, a bounded queue, a context
budget, per-request deadlines): core.engine.admission. Per-request state: the request table
(core.engine.requests).

The work of a step follows what changed in it, not how many requests run. A running request
is either *explicit* (its computed and emitted counts kept in the request table, planned with
numpy over the few of them: a prompt being computed, a request recomputing, a speculative decode,
one with a cancellation time) or a *decoder*: one token a step, its position implicit from one
decode counter D (computed = base + D, the base fixed when it started decoding), so a plain
decode step touches no request. Two calendars say which decoders need attention in a step:
those whose position starts a new KV block (keyed by D mod block size; they take a block each,
in running order) and those that emit their last token (keyed by the value of D). The step
time is priced from counts (core.engine.outputs.SchedulerOutput.agg). Only a simulator counts
decoders: an executor that returns tokens per entry (`explicit_batches`: the runner, a server)
gets every entry listed, each one explicit, the same schedule; a simulator's outputs name the
decoders that started and stopped decoding instead of every token (core.engine.steplog keeps
them as membership spans).
"""
from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr

from core.config import BIG, SchedulerConfig
from core.engine import admission as adm
from core.engine import policies
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
from core.engine.requests import DONE, INF, NOT_ARRIVED, RUNNING, WAITING, RequestTable
from core.errors import ConfigError
from core.workload import Request, Workload

_tuple = tuple.__new__   # makes a NamedTuple without its Python-level __new__ (once per step)
_INT = np.int64


@mypyc_attr(allow_interpreted_subclasses=True)   # (core.lessons.pathologies breaks one on purpose)
class Scheduler:
    def __init__(self, workload: Workload | None, config: SchedulerConfig, stop_token_ids: Iterable[int] = (),
                 request_data: bool = False, kv_events: bool = False, explicit_batches: bool = True,
                 cache_news: bool = False):
        """`workload` None: no requests yet (a server adds them with add_request).
        `request_data`: each SchedulerOutput carries the token ids and block ids the executor
        has not been sent yet (an executor that runs a model keeps its own copy).
        `kv_events`: the KV block events go out with the EngineOutputs (a recorder wants them).
        `explicit_batches`: every SchedulerOutput lists every entry, each one explicit (an executor
        that returns tokens per entry); False (a simulator): the decoders are counted, not listed, and the
        outputs list only the other entries' tokens (EngineOutputs.decoded, entered, left).
        `cache_news`: the outputs carry the prefix cache's changes (a fleet router's precise knowledge).
        The scheduler records nothing itself: everything it did is in its EngineOutputs."""
        self.cfg = config
        self.stop_token_ids = frozenset(stop_token_ids)  # a request emitting one of these stops (EOS)
        self.requests = t = RequestTable(workload)
        # cancellations, earliest first: (time, request, finish reason "abort" or "deadline")
        self.aborts = sorted((float(t.abort_at[i]), i, why) for i, why in t.abort_reason.items())
        num_blocks = adm.pool_blocks(config, t)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.prefix_caching, config.model_id, kv_events)
        # vLLM V1 caches a request's full blocks (outputs too) when it schedules the tokens that fill them
        self.cache_when_scheduled = config.prefix_caching and config.kv_manager == "vllm-v1"
        self.commit_after = config.prefix_caching and not self.cache_when_scheduled
        self.rules = policies.RULES[config.policy]
        self.seats = config.seats
        self.waiting = adm.make_waiting(config, t)   # request rows, in admission order
        self.ran: set[int] = set()         # requests ever admitted (never rejected by queue_limit)
        self.watermark_blocks = adm.watermark_blocks(config, num_blocks)
        self.failed = {"rejected": 0, "deadline": 0}
        self.next_arrival = 0
        self.horizon_ms: float | None = None   # (a fleet's: when a request could next be routed here)
        self.finishes_end_runs = False         # (a closed loop answers each finish: runs stop there)
        self.num_done = self.step = self.num_preemptions = 0
        self.explicit_batches = explicit_batches
        # the running set: request -> its join number (running order = the order they joined)
        self._run: dict[int, int] = {}
        self._joins = 0
        self._exp: dict[int, int] = {}     # explicit running requests -> join number
        self._dec: dict[int, int] = {}     # decoders -> base (computed = base + D)
        self.D = 0                         # the decode counter: steps the decoders decoded in
        self._dsum = 0                     # sum of the decoders' bases
        self._dec_ids = 0                  # decoders whose filled blocks go into the prefix cache
        self._held_back = False            # the planned step preempted with requests waiting
        bs = config.block_size
        self._cross: list[list[tuple[int, int]]] = [[] for _ in range(bs)]   # (join, req), join order
        self._fin: dict[int, list[tuple[int, int]]] = {}    # D of their last token -> (join, req)
        self._fin_at: list[int] = []       # _fin's keys as a heap (stale ones dropped when met)
        # (listed batches keep every entry explicit; a speculative decode emits a varying number of tokens)
        self._decoders_ok = not config.spec_gamma and not explicit_batches
        self._last_dec_t: float | None = None   # end of the last step the decoders decoded in
        self._step_gauges: tuple[int, int, int, int] | None = None  # running, waiting, kv used, kv free: as planned
        self._step_nd = 0                  # decoders in the planned step (see _batch)
        # what happened since the last EngineOutputs (outside a step's own results)
        self._finished: list[Finish] = []
        self._queued: list[int] = []
        self._started: list[int] = []
        self._preempted: list[Preemption] = []
        self._entered: list[tuple] = []
        self._left: list[tuple] = []
        self.priced_ms: float | None = None   # (advance: the first step's price, where it then did not run)
        # request_data: how much of each request's token ids and block table the executor has
        self.request_data = request_data
        self._sent_tokens: dict[int, int] = {}
        self._sent_blocks: dict[int, int] = {}
        self._gone: list[int] = []
        self._news: list[tuple] = []
        if cache_news and self.kv.prefix is not None:    # (each with when it happened: a run's steps end apart)
            self.kv.prefix.listener = lambda sign, h: self._news.append((sign, h, self.kv.now_ms))

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
    def running(self) -> np.ndarray:
        """The running request rows, in running order (the order they joined)."""
        return np.fromiter(self._run, _INT, len(self._run))

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
                    self._finish_failed(i, Finish(i, float(t.arrival[i]), adm.REJECTED, why, "max_model_len"))
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
        self.kv.now_ms = now_ms
        self._leave(i, free_blocks)

    def _leave(self, i: int, free: bool = True) -> int:
        """Running request i leaves the running set (a finish, preemption or cancellation): its
        counts written back, its blocks freed (`free`); returns how many."""
        self._explicit_now(i)
        freed = self._free(i) if free else 0
        del self._run[i]
        del self._exp[i]
        return freed

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

    # ---- decoders: one token a step, positions implicit from the decode counter -------------
    def _decode_now(self, i: int, seq: int):
        """Request i (explicit, its last token emitted, one to compute) becomes a decoder."""
        t, bs = self.requests, self.cfg.block_size
        c = int(t.computed[i])
        base = c - self.D
        self._dec[i] = base
        if t.token_ids[i] is not None and (self.cache_when_scheduled or self.commit_after):
            self._dec_ids += 1   # (its filled blocks are cached as it decodes: stepped one by one)
        self._dsum += base
        del self._exp[i]
        bisect.insort(self._cross[(-base) % bs], (seq, i))
        end = int(t.out_len[i] + t.prompt_len[i]) - 2 - base   # the value of D in its last token's step
        if end not in self._fin:
            heapq.heappush(self._fin_at, end)
        self._fin.setdefault(end, []).append((seq, i))
        self._entered.append((i, seq, self.D, int(t.emitted[i])))

    def _explicit_now(self, i: int):
        """Decoder i leaves the calendars, its counts written back to the request table; it is
        explicit from now on."""
        b = self._dec.pop(i, None)
        if b is None:
            return
        base, seq, t = b, self._run[i], self.requests
        self._cross[(-base) % self.cfg.block_size].remove((seq, i))
        key = int(t.out_len[i] + t.prompt_len[i]) - 2 - base
        fin = self._fin.get(key)
        if fin is not None:
            fin.remove((seq, i))
            if not fin:
                del self._fin[key]
        if t.token_ids[i] is not None and (self.cache_when_scheduled or self.commit_after):
            self._dec_ids -= 1
        self._dsum -= base
        c = base + self.D
        t.computed[i] = c
        t.emitted[i] = c - t.prompt_len[i] + 1
        t.nblocks[i] = len(self.kv.tables[i])
        self._exp[i] = seq
        self._left.append((i, self.D, self._last_dec_t))

    # ---- one step ----------------------------------------------------------------------
    def schedule(self, now_ms: float) -> SchedulerOutput | None:
        """Choose the next step's batch (None if there is nothing to run now)."""
        cfg, kv = self.cfg, self.kv
        kv.now_ms = now_ms
        if self.aborts:
            self._abort_due(now_ms)
        budget = cfg.token_budget if cfg.token_budget is not None else BIG
        if self.rules.prefill_steps and self.waiting:   # vllm-v0: a step of new prompts when any can join
            joins, _ = self._admit_waiting(budget, 0, len(self._run))
            self.reject_over_bound(now_ms)
            if joins:
                return self._planned(self._batch(None, joins, now_ms))  # type: ignore[arg-type]  # (joins: a batch)
        # who may join in this step: static, only into an empty batch; vllm-v0, only in a step of
        # prompts alone (above)
        cohort_open = not self.rules.prefill_steps and (not self.rules.cohorts or not self._run)
        preempted = False
        plan = None
        if self._run:
            plan = self._plan(budget)
            while plan.need > kv.num_free:
                self._preempt(self._victim(), now_ms)
                preempted = True
                plan = self._plan(budget)
            self._grow(plan)
            if self.cache_when_scheduled:
                self._commit_scheduled(plan)
        self._held_back = preempted and bool(self.waiting)   # (nobody joins a step that preempted: the next may)
        used = plan.tokens if plan is not None else 0
        joins = []
        if cohort_open and not preempted:
            joins, used = self._admit_waiting(budget, used, len(self._run))
        if cfg.queue_limit is not None:
            self.reject_over_bound(now_ms)
        batch = self._batch(plan, joins, now_ms)
        while batch is None and self.waiting and not self._run:   # a head that cannot run even alone: answered
            self._never_runs(self.waiting.popleft(), now_ms)     # (and the next tried, as on an idle engine)
            batch = self._batch(None, self._admit_waiting(budget, 0, 0)[0], now_ms)
        return self._planned(batch) if batch is not None else None

    def _never_runs(self, i: int, now_ms: float):
        """Request i, at the head of the queue, cannot join an idle engine (a preempted request's
        prompt + outputs over the token budget without chunked prefill, or over the KV pool above
        the watermark): rejected with its numbers."""
        t, cfg, kv = self.requests, self.cfg, self.kv
        todo, e = int(t.prompt_len[i] + t.emitted[i]), int(t.emitted[i])
        self._finish_failed(i, Finish(i, now_ms, adm.REJECTED, (
            f"cannot run even with the engine idle: {todo:,} tokens to compute (its prompt and {e} tokens emitted "
            f"before a preemption), token budget {cfg.token_budget}, chunked prefill "
            f"{cfg.chunk if cfg.chunk else 'off'}, {kv.num_free:,} KV blocks free, {self.watermark_blocks} kept free "
            "(watermark)")))

    def _plan(self, budget: int) -> _Plan:
        """The running requests' share of the next step: each explicit one's tokens (what it has
        to compute, at most `chunk`; a speculative decode also proposes up to gamma draft tokens),
        the decoders one token each; over the budget, shared in running order (sarathi: decodes
        first), a decoder left without a token becoming explicit (it sits out); and the KV blocks
        they need: the explicit ones' and one for each decoder whose position starts a block."""
        cfg, t = self.cfg, self.requests
        chunk, gamma, bs = cfg.chunk, cfg.spec_gamma, cfg.block_size
        rows = []     # (join, req, computed, pending, want, is_decode)
        total = nd = len(self._dec)
        if self._exp:
            computed, emitted, prompt, out_len = t.computed, t.emitted, t.prompt_len, t.out_len
            for i, j in self._exp.items():
                c, e = int(computed[i]), int(emitted[i])
                pending = int(prompt[i]) + e - c
                want = min(pending, chunk) if chunk else pending
                is_decode = pending == 1 and e > 0
                if gamma and is_decode:
                    want += min(gamma, int(out_len[i]) - e - 1)
                rows.append((j, i, c, pending, want, is_decode))
                total += want
            if len(rows) > 1:
                rows.sort()
        if total > budget:
            rows, total = self._share(rows, budget)
            nd = len(self._dec)
        E, n, start, pre, emits = [], [], [], [], []
        need = 0
        needs = []
        nblocks = t.nblocks
        for _j, i, c, pending, take, is_decode in rows:
            if not take:
                continue   # (it sits out this step)
            E.append(i)
            n.append(take)
            start.append(c)
            pre.append(not is_decode)
            emits.append(take >= pending)
            k = -(-(c + take) // bs) - int(nblocks[i])
            needs.append(k)
            need += k
        cross = self._cross[self.D % bs] if nd else []
        return _Plan(E, n, start, pre, emits, needs, cross, nd, total, need + len(cross))

    def _share(self, rows: list, budget: int) -> tuple[list, int]:
        """The budget shared in running order (policies.budget_shares: sarathi, every decode before
        any prompt piece). Decoders left without a token become explicit (they sit out). Returns
        (the explicit rows with their shares, tokens)."""
        run = self._run
        entries = sorted([(run[i], i, None) for i in self._dec] + [(r[0], r[1], r) for r in rows])
        shares = policies.budget_shares([1 if r is None else r[4] for _, _, r in entries], budget,
                                        [r is None or r[5] for _, _, r in entries], self.rules.decodes_first)
        t, out = self.requests, []
        for (j, i, r), take in zip(entries, shares):
            if r is not None:
                out.append(r[:4] + (take, r[5]))
            elif not take:   # (it sits out: explicit, with no tokens this step)
                self._explicit_now(i)
                out.append((j, i, int(t.computed[i]), 1, 0, True))
        return out, sum(shares)

    def _victim(self) -> int:
        """The running request to preempt: the newest (fcfs) or by priority."""
        if self.cfg.scheduling_policy != "priority":
            return next(reversed(self._run))
        run = self.running
        return int(run[adm.victim_position(self.cfg, run, self.requests)])

    def _grow(self, plan: _Plan):
        """New KV blocks for the step, in running order: each explicit request's need and one for
        each decoder whose position starts a block (the decoders' block counts are the tables')."""
        who, more = [], []
        if plan.need:
            run = self._run
            grow = [(run[i], i, k) for i, k in zip(plan.E, plan.needs) if k > 0]
            if grow:
                if plan.cross:
                    grow = sorted(grow + [(s, i, 1) for s, i in plan.cross])
                who = [g[1] for g in grow]
                more = [g[2] for g in grow]
                nblocks = self.requests.nblocks
                for i, k in zip(plan.E, plan.needs):
                    if k > 0:
                        nblocks[i] += k
            else:
                self.kv.grow_one_each([e[1] for e in plan.cross])
                return
            if all(k == 1 for k in more):
                self.kv.grow_one_each(who)
            else:
                self.kv.grow_many(who, more)

    def _ends_block(self, E: list, start: list, n: list) -> list[int]:
        """The entries whose computed tokens fill a block this step (their end crosses a block
        boundary), in running order: the listed ones (E, from `start`, `n` tokens) and
        the decoders whose position + 1 ends a block (next step's block starters)."""
        bs, run = self.cfg.block_size, self._run
        rows = [(run.get(i, -1), k, i) for k, (i, s, m) in enumerate(zip(E, start, n)) if (s + m) // bs > s // bs]
        if self._dec:
            due = self._cross[(self.D + 1) % bs]
            if due:
                rows = sorted(rows + [(s, -1, i) for s, i in due])
        return [r[2] for r in rows]

    def _commit_scheduled(self, plan: _Plan):
        """vllm-v1 prefix caching: the full blocks the step's running entries will fill, cached
        when scheduled (outputs under stand-in ids, core.engine.kv_cache.commit)."""
        t, kv = self.requests, self.kv
        at = {i: k for k, i in enumerate(plan.E)}
        for i in self._ends_block(plan.E, plan.start, plan.n):
            ids = t.token_ids[i]
            if ids is None:
                continue
            k = at.get(i)
            if k is not None:
                kv.commit(i, ids, plan.start[k] + plan.n[k], int(t.prompt_len[i] + t.emitted[i]), -(i + 1))
            else:
                c = self._dec[i] + self.D
                kv.commit(i, ids, c + 1, c + 1, -(i + 1))

    def _preempt(self, victim: int, now_ms: float):
        t = self.requests
        freed = self._leave(victim)
        t.computed[victim] = 0
        t.state[victim] = WAITING
        self.waiting.appendleft(victim)
        self.num_preemptions += 1
        self._preempted.append(Preemption(victim, now_ms, "kv_full", freed))

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
        kv = self.kv
        kv.admit(r, j.hits, t.salt[r])
        kv.grow(r, j.cached + j.take)
        t.computed[r] = j.cached
        if t.preloaded:
            t.preloaded.pop(r, None)   # (preempted later, it recomputes everything here)
        t.nblocks[r] = len(kv.tables[r])
        t.state[r] = RUNNING
        self._run[r] = self._exp[r] = self._joins
        self._joins += 1
        if self.cache_when_scheduled:
            ids = t.token_ids[r]
            if ids is not None:
                kv.commit(r, ids, j.cached + j.take, int(t.prompt_len[r] + t.emitted[r]), -(r + 1))
        if r not in self.ran:
            self.ran.add(r)
            self._started.append(r)

    def _batch(self, plan: _Plan | None, joins: list[policies.Join], now_ms: float) -> SchedulerOutput | None:
        """The step's batch: the running requests that take part (those left without tokens sit
        out), then the ones that joined. Explicit batches list every entry (numpy arrays);
        otherwise the decoders are counted (agg, decoders) and the others listed (lists)."""
        E: list; n: list; start: list; pre: list; emits: list
        nd, E, n, start, pre, emits = ((plan.nd, plan.E, plan.n, plan.start, plan.pre, plan.emits) if plan is not None
                                       else (0, [], [], [], [], []))   # (the plan's lists: not read after this)
        for jn in joins:
            E.append(jn.req)
            n.append(jn.take)
            start.append(jn.cached)
            pre.append(True)
            emits.append(jn.take >= jn.todo)
        if not nd and not E:
            return None
        self._step_nd = nd
        prefill_tokens = prefill_pos = decode_pos = chunks = total = 0
        for m, s, p in zip(n, start, pre):
            pos = m * s + m * (m + 1) // 2
            total += m
            if p:
                prefill_tokens += m
                prefill_pos += pos
                chunks += 1
            else:
                decode_pos += pos
        decode_seqs = nd + len(E) - chunks
        if nd:
            decode_pos += self._dsum + nd * (self.D + 1)   # each decoder attends its position + 1
        agg = (prefill_tokens, decode_seqs, prefill_pos, decode_pos, chunks, total + nd)
        if not self.explicit_batches:
            run = self._run
            return SchedulerOutput(self.step, now_ms, E, n, start, pre, emits, agg=agg, decoders=nd,
                                   join_no=[run[i] for i in E])
        return SchedulerOutput(self.step, now_ms, np.array(E, dtype=_INT), np.array(n, dtype=_INT),
                               np.array(start, dtype=_INT), np.array(pre, dtype=bool), np.array(emits, dtype=bool),
                               agg=agg)

    def _planned(self, batch: SchedulerOutput) -> SchedulerOutput:
        free = self.kv.num_free
        self._step_gauges = (len(self._run), len(self.waiting), self.kv.num_blocks - free, free)
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

    def advance(self, batch: SchedulerOutput, durations) -> EngineOutputs | None:
        """A simulator's decode-only step (no listed entry) and the decode-only steps after it, up to
        the next arrival, cancellation or (a fleet) time a request could be routed here, a step
        whose blocks the pool cannot give, or a last token after which the next step could differ
        otherwise (a request waiting or an explicit one; `finishes_end_runs`: a closed loop answers
        finishes). Durations per stretch between finishes (`durations(batch, k)`, None: priced step
        by step), blocks in running order step by step (the block calendar), finishes at their
        steps' ends, one record for the run (StepRecord; `after`: the gauges after each step but
        the last). None where fewer than two steps would run. The same trace as stepping."""
        nd0, self.priced_ms = self._step_nd, None
        if not nd0 or len(batch.reqs) or self._dec_ids or not self._fin or self._held_back:
            return None
        kv, limit = self.kv, self._run_limit()
        D0, step0 = self.D, self.step
        _, waiting, used0, _ = self._step_gauges  # type: ignore[misc]
        starts: list[float] = []   # per step: start, duration, running, used; after each: running, used
        d, running, used, after_run, after_used = [], [], [], [], []
        cur, lo = batch, 1           # a stretch's batch; its first step whose blocks are taken here
        while True:
            D = self.D
            at, fin = self._fin_at, self._fin
            while at[0] not in fin:
                heapq.heappop(at)
            K = at[0] - D + 1               # through the step of the next last token
            dk: list[float] | None = durations(cur, K) if K > 1 or not lo else None
            if dk is None or (lo and cur.t_ms + dk[0] >= limit):   # (one step: stepped; a second that would
                if lo:                                             # admit or cancel is not in the run)
                    self.priced_ms = dk[0] if dk is not None else None
                    return None
                break
            st = _run_starts(cur.t_ms, dk[:K], limit, bool(starts))
            K, need, owners = self._run_need(D, lo, len(st))
            if lo and K < 2:
                return None     # (nothing changed yet)
            if K == 0:
                break
            del st[K:], need[K - lo:]
            u0 = used0 if lo else kv.num_used
            if owners:
                self._grow_run(D, lo, K, st, owners)
            u = ([used0] if lo else []) + [u0 + x for x in need]
            n_run = len(self._run)
            starts.extend(st)
            d += dk[:K]
            running.extend([n_run] * K)
            used.extend(u)
            after_run.extend([n_run] * K)
            after_used.extend(u)
            self.D += K
            self._last_dec_t = kv.now_ms = t_end = st[-1] + d[-1]
            due = self._fin.pop(D + K - 1, None)
            if not due:
                break   # (the run ended before the stretch's last token)
            self._finish_emitted([e[1] for e in sorted(due)], [], t_end)
            after_run[-1], after_used[-1] = len(self._run), kv.num_used
            if self.finishes_end_runs or self.waiting or self._exp or not self._dec:
                break
            nd = len(self._dec)   # the run goes on with the decoders left
            cur = self._batch(_Plan([], [], [], [], [], [], [], nd, nd, 0), [], t_end)  # type: ignore[assignment]
            lo = 0
        K = len(starts)
        rec = StepRecord(range(step0, step0 + K), starts, d, running, waiting, used, kv.num_blocks)
        self.step += K
        self._step_gauges = None
        return self.take_outputs(starts[-1] + d[-1], batch, d[0], record=rec, decoded=(D0, nd0),
                                 after=(after_run[:-1], [waiting] * (K - 1), after_used[:-1]))

    def _run_limit(self) -> float:
        """When a decode run must stop: the next arrival, cancellation or (a fleet) routing time."""
        t = self.requests
        return min(INF if self.horizon_ms is None else self.horizon_ms, self.aborts[0][0] if self.aborts else INF,
                   t.arrival[self.next_arrival] if self.next_arrival < t.n else INF)

    def _run_need(self, D: int, lo: int, K: int) -> tuple[int, list[int], list[int]]:
        """A run's steps lo..K-1 from the block calendar: (the steps the pool gives blocks for, blocks
        taken through each, the requests that take one, in order)."""
        bs, cross, free = self.cfg.block_size, self._cross, self.kv.num_free
        need: list[int] = []
        owners: list[int] = []
        n = 0
        for k in range(lo, K):
            c = cross[(D + k) % bs]
            if c:
                if n + len(c) > free:   # the pool cannot give this step's blocks: the run ends before it
                    return k, need, owners
                n += len(c)
                owners += [e[1] for e in c]
            need.append(n)
        return K, need, owners

    def _grow_run(self, D: int, lo: int, K: int, st: list[float], owners: list[int]):
        """Give a run's steps lo..K-1 their blocks, each at its step's start (st[k])."""
        bs, cross, kv = self.cfg.block_size, self._cross, self.kv
        if not kv.append_blocks(owners, [st[k] for k in range(lo, K) for _ in range(len(cross[(D + k) % bs]))]):
            for k in range(lo, K):   # some block must be evicted: step by step, exactly
                if cross[(D + k) % bs]:
                    kv.now_ms = st[k]
                    kv.grow_one_each([e[1] for e in cross[(D + k) % bs]])

    # ---- completing a step: one path for plain, speculative and simulated steps ---------------
    def update(self, batch: SchedulerOutput, out: ExecutorOutput) -> EngineOutputs:
        """Apply a finished step and return what happened (EngineOutputs).

        An entry emits when its computed tokens reach everything known (prompt + emitted):
        one token, or (speculative verification: 1 + gamma tokens computed) the accepted
        draft tokens plus one recovered or bonus token. Emission stops at max tokens and at
        the first stop id (EOS); the KV cache keeps only what the emitted tokens justify
        (prompt + emitted - 1 positions), so rejected draft positions return to the pool.
        A request cancelled while the step ran never receives its tokens. Decoders (counted,
        not listed) each emit one token: the decode counter moves on."""
        t, kv = self.requests, self.kv
        t_end = out.t_end_ms
        kv.now_ms = t_end
        nd = self._step_nd
        listed, start, ntok, emits = [x if type(x) is list else x.tolist()   # type: ignore[union-attr]
                                      for x in (batch.reqs, batch.start_pos, batch.num_tokens, batch.emits)]
        ends = self._ends_block(listed, start, ntok) if self.commit_after else None
        for i, s, m in zip(listed, start, ntok):
            t.computed[i] = s + m
        cancelled = [i for i in listed if t.abort_at[i] <= t_end] if self.aborts else []
        if cancelled:
            gone = set(cancelled)
            emits = [e and i not in gone for i, e in zip(listed, emits)]
        er: Any; idx: Any; ids: Any; src: Any   # (lists, or numpy arrays from an executor's tokens)
        if out.tokens is None:  # simulated: one token (id unknown) per emitting entry
            er, idx, fin = self._emit_one_each(listed, emits)
            ids = src = None
            stopped = []
        else:
            er, idx, ids, src, stopped = self._take_tokens(listed, out, emits)
            fin = self._reached_max(er.tolist())
        dur = t_end - batch.t_ms if out.dur_ms is None else out.dur_ms
        rec = _tuple(StepRecord, (batch.step, batch.t_ms, dur, *self._step_gauges))  # type: ignore[misc]
        if out.tokens is not None:
            self._roll_back(listed)
        D0 = self.D
        if nd:   # the decoders decoded: the counter moves on
            self.D += 1
            self._last_dec_t = t_end
            due = self._fin.pop(D0, None)
            if due:   # with the listed entries' finishes found above, in running order (join numbers)
                run = self._run
                fin = [i for _, i in sorted([(run[i], i) for i in fin] + due)]
        if ends:
            self._commit_filled(ends)
        # requests that reached their max tokens or a stop id leave, their blocks freed
        if fin or stopped:
            self._finish_emitted(fin, stopped, t_end)
        for i in cancelled:
            self.abort(i, t_end, t.abort_reason.get(i, "abort"), max(float(t.abort_at[i]), batch.t_ms))
        for j, why in (out.failed or {}).items():     # one request's failure ends that request only
            self.abort(int(listed[j]), t_end, "error", detail=why)
        if self._decoders_ok:   # the entries now one token away from their next emission decode from now on
            self._new_decoders(listed)
        self.step += 1
        self._step_gauges = None
        decoded = (D0, nd) if nd else None
        if self.explicit_batches and type(er) is list:
            er, idx = np.array(er, dtype=_INT), np.array(idx, dtype=_INT)  # type: ignore[assignment]
        return self.take_outputs(t_end, batch, dur, er, idx, ids, rec, None, src, out.events, decoded)

    def _commit_filled(self, ends: list):
        """Cache the blocks a step filled (a manager that commits after the step: commit_after)."""
        t, kv, dec = self.requests, self.kv, self._dec
        for i in ends:
            ids_i = t.token_ids[i]
            if ids_i is not None and i in kv.tables:
                base = dec.get(i)
                kv.commit(i, ids_i, int(t.computed[i]) if base is None else base + self.D)

    def _emit_one_each(self, listed: list, emits: list) -> tuple[list, list, list]:
        """A simulated step's tokens (ids unknown): one per emitting entry. Returns (requests, their
        output indices, those that reached their max tokens)."""
        t = self.requests
        emitted, out_len = t.emitted, t.out_len
        er, idx, fin = [], [], []
        for i, e in zip(listed, emits):
            if e:
                x = int(emitted[i])
                emitted[i] = x + 1
                er.append(i)
                idx.append(x)
                if x >= out_len[i] - 1:
                    fin.append(i)
        return er, idx, fin

    def _reached_max(self, er: list) -> list:
        """Of the requests that emitted (one row per token, a request's adjacent), those at their max."""
        t, fin, seen = self.requests, [], set()
        for i in er:
            if i not in seen:
                seen.add(i)
                if t.emitted[i] >= t.out_len[i]:
                    fin.append(i)
        return fin

    def _new_decoders(self, listed: list):
        t, exp = self.requests, self._exp
        state, emitted, computed, prompt, abort_at = t.state, t.emitted, t.computed, t.prompt_len, t.abort_at
        for i in listed:
            s = exp.get(i)
            if s is not None and state[i] == RUNNING:
                e = emitted[i]
                if e > 0 and computed[i] == prompt[i] + e - 1 and abort_at[i] == INF:
                    self._decode_now(i, s)

    def _roll_back(self, listed: list):
        """Keep KV only for the positions the emitted tokens justify (speculative rejections)."""
        t, kv = self.requests, self.kv
        for i in listed:
            keep = int(t.prompt_len[i] + t.emitted[i] - 1)
            if t.computed[i] <= max(keep, 0) or t.emitted[i] == 0:
                continue  # (a prefill chunk: nothing emitted yet, nothing to roll back)
            t.computed[i] = keep
            kv.truncate(i, keep)
            t.nblocks[i] = len(kv.tables[i])
            if self.request_data:
                self._sent_blocks[i] = min(self._sent_blocks.get(i, 0), int(t.nblocks[i]))

    def _finish_emitted(self, fin: list, stopped: list[int], t_end: float):
        """Requests that reached their max tokens (`fin`) or a stop id leave, their blocks freed."""
        t = self.requests
        reasons = {}
        if stopped:
            extra = [i for i in stopped if t.emitted[i] < t.out_len[i]]
            if extra:
                fin = list(fin) + extra
                reasons = {i: "stop" for i in extra}
        if not fin:
            return
        state, finished = t.state, self._finished
        for i in fin:   # (a decoder's last step ended at t_end: _last_dec_t)
            self._leave(i)
            state[i] = DONE
            finished.append(_tuple(Finish, (i, t_end, reasons.get(i, "length") if reasons else "length", None,  # type: ignore[misc]
                                            None)))
        self.num_done += len(fin)

    def _take_tokens(self, listed, out, emit):
        """Emitted tokens of a step whose executor returned ids: cut at max tokens and at the
        first stop id. Returns (reqs, output index, ids, source codes or None, stopped reqs)."""
        t = self.requests
        emit_r, emit_idx, emit_ids, emit_src, stopped = [], [], [], [], []
        for j, i in enumerate(listed):
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
        p, e, c = t.prompt_len, t.emitted, t.computed
        queued = sum([p[i] + e[i] - c[i] for i in self.waiting])
        return SchedulerStats(*self._gauges(), queued)

    def _gauges(self) -> tuple[int, int, int, int, int, int]:
        """SchedulerStats' fields now, as a plain tuple (made once per step)."""
        kv = self.kv
        return (len(self._run), len(self.waiting), kv.num_used, kv.num_blocks, self.num_preemptions, kv.counts["hit"])

    def has_outputs(self) -> bool:
        """Something happened outside a step (arrivals queued or rejected, cancellations)."""
        return bool(self._finished or self._queued or self._preempted or self.kv.events or self._left or self._news)

    def take_outputs(self, t_ms: float, batch: SchedulerOutput | None = None, dur_ms: float | None = None,
                     token_reqs=EMPTY, token_index=EMPTY, token_ids=None, record: StepRecord | None = None,
                     token_t_ms=None, token_sources=None, events=None, decoded=None,
                     after: tuple | None = None) -> EngineOutputs:
        """Everything that happened since the last EngineOutputs (with a step's tokens and
        record, when given), and forget it."""
        gauges = self._gauges()
        fin, queued, preempted, entered, left = self._finished, self._queued, self._preempted, self._entered, self._left
        self._finished, self._queued, self._preempted, self._entered, self._left = [], [], [], [], []
        if fin and self.request_data:
            self._gone += [f.req for f in fin]
            for f in fin:
                self._sent_tokens.pop(f.req, None)
                self._sent_blocks.pop(f.req, None)
        started = None
        if batch is not None and self._started:   # first scheduled in this step (kept for the step's outputs)
            started, self._started = self._started, []
        kv_events = self.kv.take_events() if self.kv.events else ()
        news, self._news = (self._news, []) if self._news else ((), self._news)
        return _tuple(EngineOutputs, (t_ms, gauges, batch, dur_ms, fin or (), queued or (), started or (),
                                      preempted or (), token_reqs, token_index, token_ids, record, token_t_ms,
                                      token_sources, kv_events, events, decoded, entered or (), left or (), after,
                                      news))


def _run_starts(t0: float, dk: list[float], limit: float, more: bool) -> list[float]:
    """Each step's start, from t0 (sums bit-identical to stepping's t += d), up to the first at `limit`
    (it would admit or cancel: not in the run, unless it is the run's first, `more` False)."""
    st: list[float] = []
    for x in dk:
        if t0 >= limit and (st or more):
            break
        st.append(t0)
        t0 += x
    return st


class _Plan:
    """The running requests' part of a step: the explicit ones in running order (E, their tokens
    n, start positions, is-prefill and emits flags, new KV blocks each), the decoders crossing a
    block boundary (join, req), how many decoders, and the step's tokens and new blocks."""
    __slots__ = ("E", "n", "start", "pre", "emits", "needs", "cross", "nd", "tokens", "need")

    def __init__(self, E, n, start, pre, emits, needs, cross, nd, tokens, need):
        self.E, self.n, self.start, self.pre, self.emits, self.needs = E, n, start, pre, emits, needs
        self.cross, self.nd, self.tokens, self.need = cross, nd, tokens, need
