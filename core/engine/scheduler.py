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
time is priced from counts (core.engine.outputs.SchedulerOutput.agg); the per-request batch
arrays are built only for an executor that asks (`explicit_batches`: the runner, a server); a
simulator's outputs name the decoders that started and stopped decoding instead of every token
(core.engine.steplog keeps them as membership spans).
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np

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
from core.engine.requests import DONE, NOT_ARRIVED, RUNNING, WAITING, RequestTable
from core.errors import ConfigError
from core.workload import Request, Workload

_tuple = tuple.__new__   # makes a NamedTuple without its Python-level __new__ (once per step)
_INT = np.int64


class Scheduler:
    def __init__(self, workload: Workload | None, config: SchedulerConfig, stop_token_ids: Iterable[int] = (),
                 request_data: bool = False, kv_events: bool = False, explicit_batches: bool = True):
        """`workload` None: no requests yet (a server adds them with add_request).
        `request_data`: each SchedulerOutput carries the token ids and block ids the executor
        has not been sent yet (an executor that runs a model keeps its own copy).
        `kv_events`: the KV block events go out with the EngineOutputs (a recorder wants them).
        `explicit_batches`: every SchedulerOutput lists every entry (an executor that returns
        tokens per entry); False (a simulator): the decoders are counted, not listed, and the
        outputs list only the other entries' tokens (EngineOutputs.decoded, entered, left).
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
        self.num_done = 0
        self.step = 0
        self.num_preemptions = 0
        self.explicit_batches = explicit_batches
        # the running set: request -> its join number (running order = the order they joined)
        self._run: dict[int, int] = {}
        self._joins = 0
        self._exp: dict[int, int] = {}     # explicit running requests -> join number
        self._dec: dict[int, int] = {}     # decoders -> base (computed = base + D)
        self._stint: dict[int, int] = {}   # decoders -> the number of their decoding stint (calendar entries' key)
        self._stints = 0
        self.D = 0                         # the decode counter: steps the decoders decoded in
        self._dsum = 0                     # sum of the decoders' bases
        bs = config.block_size
        self._cross: list[list[tuple[int, int, int]]] = [[] for _ in range(bs)]   # (join, req, stint), join order
        self._fin: dict[int, list[tuple[int, int, int]]] = {}    # D of their last token -> (join, req, stint)
        self._decoders_ok = not config.spec_gamma   # (a speculative decode emits a varying number of tokens)
        self._last_dec_t: float | None = None   # end of the last step the decoders decoded in
        self._step_gauges = None  # (running, waiting, kv used, kv free) when the pending step was planned
        self._step_plan = None    # what schedule planned for update: see _batch
        # what happened since the last EngineOutputs (outside a step's own results)
        self._finished: list[Finish] = []
        self._queued: list[int] = []
        self._started: list[int] = []
        self._preempted: list[Preemption] = []
        self._entered: list[tuple] = []
        self._left: list[tuple] = []
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
        self._explicit_now(i)
        if free_blocks:
            self.kv.now_ms = now_ms
            self._free(i)
        del self._run[i]
        del self._exp[i]

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
        stint = self._stint[i] = self._stints
        self._stints += 1
        self._dsum += base
        del self._exp[i]
        bisect.insort(self._cross[(-base) % bs], (seq, i, stint))
        end = int(t.out_len[i] + t.prompt_len[i]) - 2 - base   # the value of D in its last token's step
        self._fin.setdefault(end, []).append((seq, i, stint))
        if not self.explicit_batches:
            self._entered.append((i, seq, self.D, int(t.emitted[i])))

    def _explicit_now(self, i: int):
        """Decoder i's counts written back to the request table; it is explicit from now on."""
        base = self._dec.pop(i, None)
        if base is None:
            return
        del self._stint[i]
        t = self.requests
        c = base + self.D
        t.computed[i] = c
        t.emitted[i] = c - t.prompt_len[i] + 1
        self._dsum -= base
        self._exp[i] = self._run[i]
        if not self.explicit_batches:
            self._left.append((i, self.D, self._last_dec_t))

    def _sync_decoders(self):
        """Every decoder's counts written into the request table (they stay decoders)."""
        if not self._dec:
            return
        t = self.requests
        who = np.fromiter(self._dec, _INT, len(self._dec))
        c = np.fromiter(self._dec.values(), _INT, len(self._dec)) + self.D
        t.computed[who] = c
        t.emitted[who] = c - t.prompt_len[who] + 1

    def _due(self, bucket: list) -> list[tuple[int, int, int]]:
        """The live entries of a calendar bucket (those still in the same decoding stint)."""
        stint = self._stint
        live = [e for e in bucket if stint.get(e[1]) == e[2]]
        if len(live) < len(bucket):
            bucket[:] = live
        return live

    # ---- one step ----------------------------------------------------------------------
    def schedule(self, now_ms: float) -> SchedulerOutput | None:
        """Choose the next step's batch (None if there is nothing to run now)."""
        cfg, kv = self.cfg, self.kv
        kv.now_ms = now_ms
        self._abort_due(now_ms)
        budget = cfg.token_budget if cfg.token_budget is not None else BIG
        if self.rules.prefill_steps and self.waiting:   # vllm-v0: a step of new prompts when any can join
            joins, _ = self._admit_waiting(budget, 0, len(self._run))
            self.reject_over_bound(now_ms)
            if joins:
                return self._planned(self._batch(None, joins, now_ms), joined=True)
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
        used = plan.tokens if plan is not None else 0
        joins = []
        if cohort_open and not preempted:
            joins, used = self._admit_waiting(budget, used, len(self._run))
        self.reject_over_bound(now_ms)
        batch = self._batch(plan, joins, now_ms)
        if batch is None:
            return None
        return self._planned(batch, joined=bool(joins) or preempted)

    def _plan(self, budget: int) -> _Plan:
        """The running requests' share of the next step: the explicit ones planned in full (numpy
        over them), the decoders one token each, and the KV blocks both need."""
        cfg, t, dec = self.cfg, self.requests, self._dec
        nd = len(dec)
        exp = self._exp
        if exp:
            E = np.fromiter(exp, _INT, len(exp))
            if len(E) > 1:
                E = E[np.argsort(np.fromiter(exp.values(), _INT, len(exp)), kind="stable")]
            p = policies.plan_running(self, E, BIG)   # (the budget is shared below, with the decoders)
            want = p.num_tokens
            total = nd + int(want.sum())
        else:
            E = p = None
            total = nd
        if total > budget:
            return self._plan_over_budget(budget)
        cross = self._due(self._cross[self.D % cfg.block_size]) if nd else []
        need = len(cross)
        if p is not None:
            need += int(p.need.sum())
        return _Plan(E, p, cross, nd, total, need)

    def _plan_over_budget(self, budget: int) -> _Plan:
        """The running requests want more tokens than the budget: shared in running order (sarathi:
        decodes first) as policies.budget_shares does; a decoder left without a token this step
        becomes explicit (it sits out)."""
        self._sync_decoders()
        run = self.running
        p = policies.plan_running(self, run, budget)
        for i in run[(p.num_tokens == 0) & np.isin(run, np.fromiter(self._dec, _INT, len(self._dec)))].tolist():
            self._explicit_now(i)
        keep = np.isin(run, np.fromiter(self._exp, _INT, len(self._exp)))
        E = run[keep]
        sub = policies.RunningPlan(p.num_tokens[keep], p.need[keep], p.start[keep], p.is_prefill[keep],
                                   p.emits[keep], False)
        nd = len(self._dec)
        cross = self._due(self._cross[self.D % self.cfg.block_size]) if nd else []
        return _Plan(E, sub, cross, nd, nd + int(sub.num_tokens.sum()), len(cross) + int(sub.need.sum()))

    def _victim(self) -> int:
        """The running request to preempt: the newest (fcfs) or by priority."""
        if self.cfg.scheduling_policy != "priority":
            return next(reversed(self._run))
        run = self.running
        return int(run[adm.victim_position(self.cfg, run, self.requests)])

    def _grow(self, plan: _Plan):
        """New KV blocks for the step, in running order: each explicit request's need and one for
        each decoder whose position starts a block."""
        t, kv = self.requests, self.kv
        who, more = [], []
        if plan.p is not None:
            grow = np.flatnonzero(plan.p.need > 0)
            if len(grow):
                who = plan.E[grow].tolist()
                more = plan.p.need[grow].tolist()
                if plan.cross:   # merged with the decoders by join order
                    run = self._run
                    rows = sorted([(run[i], i, k) for i, k in zip(who, more)]
                                  + [(s, i, 1) for s, i, _ in plan.cross])
                    who = [r[1] for r in rows]
                    more = [r[2] for r in rows]
        if not who:
            if not plan.cross:
                return
            who = [e[1] for e in plan.cross]
            more = None
        nblocks = t.nblocks
        if more is None or all(k == 1 for k in more):
            arr = np.array(who, dtype=_INT)
            kv.grow_many(arr, nblocks[arr], one_each=True)
            nblocks[arr] += 1
        else:
            kv.grow_many(who, more)
            nblocks[who] += more

    def _ends_block(self, E: np.ndarray, start: np.ndarray, n: np.ndarray, decoders: bool) -> list[int]:
        """The entries whose computed tokens fill a block this step (their end crosses a block
        boundary), in running order: the listed ones (E, from `start`, `n` tokens) and, with
        `decoders`, the decoders whose position + 1 ends a block (next step's block starters)."""
        bs, run = self.cfg.block_size, self._run
        rows = []
        if len(E):
            end = start + n
            for j in np.flatnonzero(end // bs > start // bs).tolist():
                i = int(E[j])
                rows.append((run.get(i, -1), j, i))
        if decoders and self._dec:
            rows += [(s, -1, i) for s, i, _ in self._due(self._cross[(self.D + 1) % bs])]
            rows.sort()
        return [i for _, _, i in rows]

    def _commit_scheduled(self, plan: _Plan):
        """vllm-v1 prefix caching: the full blocks the step's running entries will fill, cached
        when scheduled (outputs under stand-in ids, core.engine.kv_cache.commit)."""
        t, kv = self.requests, self.kv
        p = plan.p
        E, start, n = (plan.E, p.start, p.num_tokens) if p is not None else (EMPTY, EMPTY, EMPTY)
        for i in self._ends_block(E, start, n, True):
            ids = t.token_ids[i]
            if ids is None:
                continue
            base = self._dec.get(i)
            if base is None:
                j = plan.pos(i)
                kv.commit(i, ids, int(start[j] + n[j]), int(t.prompt_len[i] + t.emitted[i]), -(i + 1))
            else:
                c = base + self.D
                kv.commit(i, ids, c + 1, c + 1, -(i + 1))

    def _preempt(self, victim: int, now_ms: float):
        t = self.requests
        self._explicit_now(victim)
        freed = self._free(victim)
        t.computed[victim] = 0
        t.state[victim] = WAITING
        del self._run[victim]
        del self._exp[victim]
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
        self.kv.admit(r, j.hits, t.salt[r])
        self.kv.grow(r, j.cached + j.take)
        t.computed[r] = j.cached
        if t.preloaded:
            t.preloaded.pop(r, None)   # (preempted later, it recomputes everything here)
        t.nblocks[r] = len(self.kv.tables[r])
        t.state[r] = RUNNING
        self._run[r] = self._exp[r] = self._joins
        self._joins += 1
        if self.cache_when_scheduled:
            ids = t.token_ids[r]
            if ids is not None:
                self.kv.commit(r, ids, j.cached + j.take, int(t.prompt_len[r] + t.emitted[r]), -(r + 1))
        if r not in self.ran:
            self.ran.add(r)
            self._started.append(r)

    def _batch(self, plan: _Plan | None, joins, now_ms) -> SchedulerOutput | None:
        """The step's batch: the running requests that take part (those left without tokens sit
        out), then the ones that joined. Explicit batches list every entry; otherwise the
        decoders are counted (agg, decoders) and only the others listed."""
        if plan is not None and plan.p is not None:
            p = plan.p
            act = p.num_tokens > 0
            E, n, start, pre, emits = plan.E, p.num_tokens, p.start, p.is_prefill, p.emits
            if not act.all():
                E, n, start, pre, emits = E[act], n[act], start[act], pre[act], emits[act]
        else:
            E = n = start = EMPTY
            pre = emits = _NO
        if joins:
            new, _, new_start, new_n, new_todo = zip(*joins)
            E = np.concatenate([E, new])
            n = np.concatenate([n, new_n])
            start = np.concatenate([start, new_start])
            pre = np.concatenate([pre, np.ones(len(joins), dtype=bool)])
            emits = np.concatenate([emits, [a >= b for a, b in zip(new_n, new_todo)]])
        nd = plan.nd if plan is not None else 0
        if not nd and not len(E):
            return None
        self._step_plan = (plan, nd)
        prefill_tokens = int(n[pre].sum()) if len(E) else 0
        decode_seqs = nd + len(E) - int(np.count_nonzero(pre))
        if len(E):
            pos = n * start + n * (n + 1) // 2
            prefill_pos, decode_pos, chunks = int(pos[pre].sum()), int(pos[~pre].sum()), int(np.count_nonzero(pre))
            total = int(n.sum()) + nd
        else:
            prefill_pos = decode_pos = chunks = 0
            total = nd
        if nd:
            decode_pos += self._dsum + nd * (self.D + 1)   # each decoder attends its position + 1
        agg = (prefill_tokens, decode_seqs, prefill_pos, decode_pos, chunks, total)
        if self.explicit_batches and nd:   # every entry listed, in running order (the joins after them)
            run = self._run
            dec = np.fromiter(self._dec, _INT, nd)
            dstart = np.fromiter(self._dec.values(), _INT, nd) + self.D
            m = len(E) - len(joins)
            allr = np.concatenate([E[:m], dec])
            order = np.argsort(np.fromiter((run[i] for i in allr.tolist()), _INT, len(allr)), kind="stable")
            ones = np.ones(nd, dtype=_INT)
            E = np.concatenate([allr[order], E[m:]])
            n = np.concatenate([np.concatenate([n[:m], ones])[order], n[m:]])
            start = np.concatenate([np.concatenate([start[:m], dstart])[order], start[m:]])
            pre = np.concatenate([np.concatenate([pre[:m], np.zeros(nd, dtype=bool)])[order], pre[m:]])
            emits = np.concatenate([np.concatenate([emits[:m], np.ones(nd, dtype=bool)])[order], emits[m:]])
            nd = 0
        join_no = None
        if not self.explicit_batches:
            run = self._run
            join_no = np.fromiter((run[i] for i in E.tolist()), _INT, len(E))
        return SchedulerOutput(self.step, now_ms, E, n, start, pre, emits, (prefill_tokens, decode_seqs), agg=agg,
                               decoders=nd, join_no=join_no)

    def _planned(self, batch: SchedulerOutput, joined: bool) -> SchedulerOutput:
        kv = self.kv
        free = kv.num_free
        self._step_gauges = (len(self._run), len(self.waiting), kv.num_blocks - free, free)
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

    def fast_forward(self, batch: SchedulerOutput, durations, min_steps: int = 3) -> EngineOutputs | None:
        """(Kept for the engine core's interface: a step's work already follows what changed.)"""
        return None

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
        plan, nd = self._step_plan
        self._step_plan = None
        r = batch.reqs
        ends = (self._ends_block(r, batch.start_pos, batch.num_tokens, not self.explicit_batches)
                if self.commit_after else None)
        if self.explicit_batches and self._dec:
            self._sync_decoders()
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
        else:
            er, idx, ids, src, stopped = self._take_tokens(batch, out, emit)
        dur = t_end - batch.t_ms if out.dur_ms is None else out.dur_ms
        rec = _tuple(StepRecord, (batch.step, batch.t_ms, dur, *self._step_gauges))
        if out.tokens is not None:
            self._roll_back(r)
        D0 = self.D
        fin_dec = None
        if nd:   # the decoders decoded: the counter moves on
            self.D += 1
            self._last_dec_t = t_end
            due = self._fin.pop(D0, None)
            if due:
                fin_dec = self._due(due)
        if ends:
            for i in ends:
                ids_i = t.token_ids[i]
                if ids_i is not None and i in kv.tables:
                    base = self._dec.get(i)
                    kv.commit(i, ids_i, int(t.computed[i]) if base is None else base + self.D)
        # requests that reached their max tokens or a stop id leave, their blocks freed
        if out.tokens is None:   # one token each: emitted is now idx + 1
            fin = er[idx >= t.out_len[er] - 1]
        else:  # one row per token; a request's tokens are adjacent
            emitters = er[np.r_[True, er[1:] != er[:-1]]] if len(er) > 1 else er
            fin = emitters[t.emitted[emitters] >= t.out_len[emitters]]
        if fin_dec and not self.explicit_batches:   # (listed entries' finishes are found above)
            if len(fin):
                run = self._run
                fin = np.array([i for _, i in sorted([(run[i], i) for i in fin.tolist()]
                                                     + [(s, i) for s, i, _ in fin_dec])], dtype=_INT)
            else:
                fin = np.array([e[1] for e in fin_dec], dtype=_INT)
        if len(fin) or stopped:
            self._finish_emitted(fin, stopped, t_end)
        if cancelled is not None:
            for i in r[cancelled].tolist():
                self.abort(i, t_end, t.abort_reason.get(i, "abort"), max(float(t.abort_at[i]), batch.t_ms))
        for j, why in (out.failed or {}).items():     # one request's failure ends that request only
            self.abort(int(r[j]), t_end, "error", detail=why)
        if self._decoders_ok:   # the entries now one token away from their next emission decode from now on
            self._new_decoders(r)
        self.step += 1
        self._step_gauges = None
        decoded = (D0, nd) if nd and not self.explicit_batches else None
        return self.take_outputs(t_end, batch, dur, er, idx, ids, rec, None, src, out.events, decoded)

    def _new_decoders(self, r: np.ndarray):
        t, exp = self.requests, self._exp
        if not len(r):
            return
        live = r[(t.state[r] == RUNNING) & (t.emitted[r] > 0) & (t.computed[r] == t.prompt_len[r] + t.emitted[r] - 1)
                 & np.isinf(t.abort_at[r])]
        for i in live.tolist():
            s = exp.get(i)
            if s is not None:
                self._decode_now(i, s)

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
        dec, run, exp = self._dec, self._run, self._exp
        for i in fin.tolist():
            base = dec.pop(i, None)
            if base is not None:   # a decoder: its counts written back as it leaves
                del self._stint[i]
                c = base + self.D
                t.computed[i] = c
                t.emitted[i] = c - t.prompt_len[i] + 1
                self._dsum -= base
                if not self.explicit_batches:
                    self._left.append((i, self.D, t_end))
            else:
                del exp[i]
            del run[i]
            kv.free_seq(i)
            nblocks[i] = 0
            state[i] = DONE
            finished.append(Finish(i, t_end, reasons.get(i, "length") if reasons else "length"))
            if self.request_data:
                self._sent_blocks[i] = 0
        self.num_done += len(fin)

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
        return (len(self._run), len(self.waiting), kv.num_used, kv.num_blocks, self.num_preemptions,
                kv.counts["hit"])

    def has_outputs(self) -> bool:
        """Something happened outside a step (arrivals queued or rejected, cancellations)."""
        return bool(self._finished or self._queued or self._preempted or self.kv.events or self._left)

    def take_outputs(self, t_ms: float, batch: SchedulerOutput | None = None, dur_ms: float | None = None,
                     token_reqs=EMPTY, token_index=EMPTY, token_ids=None, record: StepRecord | None = None,
                     token_t_ms=None, token_sources=None, events=None, decoded=None) -> EngineOutputs:
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
        entered = left = ()
        if self._entered:
            entered, self._entered = self._entered, []
        if self._left:
            left, self._left = self._left, []
        kv_events = self.kv.take_events() if self.kv.events else ()
        return _tuple(EngineOutputs, (t_ms, gauges, batch, dur_ms, fin or (), queued or (), started or (),
                                      preempted or (), token_reqs, token_index, token_ids, record, token_t_ms,
                                      token_sources, kv_events, events, decoded, entered, left))


_NO = np.zeros(0, dtype=bool)
_NO.flags.writeable = False


class _Plan:
    """The running requests' part of a step: the explicit ones (E, in running order, and their
    policies.RunningPlan p), the decoders crossing a block boundary (join, req, base), how many
    decoders, the tokens and the new KV blocks the step takes for them."""
    __slots__ = ("E", "p", "cross", "nd", "tokens", "need", "_pos")

    def __init__(self, E, p, cross, nd, tokens, need):
        self.E, self.p, self.cross, self.nd, self.tokens, self.need = E, p, cross, nd, tokens, need
        self._pos = None

    def pos(self, i: int) -> int:
        if self._pos is None:
            self._pos = {int(r): j for j, r in enumerate(self.E.tolist())}
        return self._pos[i]
