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

import heapq
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr

from core.config import BIG
from core.engine import admission as adm
from core.engine import policies
from core.engine.outputs import (
    EngineOutputs,
    ExecutorOutput,
    Preemption,
    SchedulerOutput,
    StepRecord,
)
from core.engine.requests import INF, RUNNING, WAITING
from core.engine.running import SchedulerState
from core.kvtier import connector

_tuple = tuple.__new__   # makes a NamedTuple without its Python-level __new__ (once per step)
_INT = np.int64


@mypyc_attr(allow_interpreted_subclasses=True)   # (core.lessons.pathologies breaks one on purpose)
class Scheduler(SchedulerState):
    """The step: planning it (schedule: the policy's plan applied, KV blocks taken, preemption) and
    completing it (update; a simulator's run of decode-only steps: advance), on the state and
    transitions of SchedulerState (core.engine.running)."""

    # ---- one step ----------------------------------------------------------------------
    def schedule(self, now_ms: float) -> SchedulerOutput | None:
        """Choose the next step's batch (None if there is nothing to run now)."""
        cfg, kv = self.cfg, self.kv
        kv.now_ms = now_ms
        if self.aborts:
            self._abort_due(now_ms)
        if self.tier is not None:
            connector.loads_done(self, now_ms)
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
        while batch is None and self.holding and not self._run and not self.tier.loading:  # type: ignore[union-attr]
            if not preempted:   # (held blocks, nothing runs or loads: after one more try, the newest lets go)
                connector.release_held(self, now_ms)
            preempted = False   # (a step that preempted the last running request admits at once)
            batch = self._batch(None, self._admit_waiting(budget, 0, 0)[0], now_ms)
        while batch is None and self.waiting and not self._run and not self.holding:   # a head that cannot run even
            self._never_runs(self.waiting.popleft(), now_ms)     # alone: answered (and the next tried, as idle)
            batch = self._batch(None, self._admit_waiting(budget, 0, 0)[0], now_ms)
        if batch is None and self.tier is not None:   # (loads only: EngineCore.step has the executor make them)
            self.copies = self.tier.settle(self.request_data)
        return self._planned(batch) if batch is not None else None

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
        """Admit waiting requests while a seat (`running` taken), the budget left and KV blocks (with the
        watermark) allow, in vLLM's order: first the requests holding KV blocks (CPU-tier loads: a load done
        joins, one in flight is passed over), then the waiting queue, head first, never skipping past a
        head that does not fit; there a CPU-tier hit plans a load (the request then holds its blocks) and a
        tier lookup to be asked again passes the request over. Those passed over keep their places.
        Returns (the joins, budget used)."""
        held, waiting, tier = self.holding, self.waiting, self.tier
        if not waiting and not held:
            return [], used
        seats = self.seats - running
        joins: list[policies.Join] = []
        passed_held: list[int] = []
        passed: list[int] = []
        while seats > 0 and budget - used > 0:
            if held:
                r = held[0]
                if r in tier.loading:  # type: ignore[union-attr]
                    passed_held.append(held.popleft())
                    continue
                j = policies.held_join(self, r, budget - used)
                if j is None:
                    break
                held.popleft()
            elif waiting:
                j = policies.next_join(self, budget - used)
                if j is None:
                    break
                if j is policies.SKIP:
                    passed.append(waiting.popleft())
                    continue
                waiting.popleft()
                if j.load is not None:
                    connector.start_load(self, j)
                    passed_held.append(j.req)
                    continue
            else:
                break
            self._join(j)
            joins.append(j)
            used += j.take
            seats -= 1
        for r in reversed(passed_held):
            held.appendleft(r)
        for r in reversed(passed):
            waiting.appendleft(r)
        return joins, used

    def _join(self, j: policies.Join):
        """Request j.req (taken off the waiting queue by the caller, or holding blocks) joins the running set."""
        t, r, kv = self.requests, j.req, self.kv
        if r not in kv.tables:   # (one holding blocks from a CPU-tier load has its table)
            kv.admit(r, j.hits, t.salt[r])
            if self.tier is not None:
                self.tier.admitted(r, len(j.hits), 0, r not in self.ran, int(t.prompt_len[r] + t.emitted[r]))
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
        self._step_gauges = (len(self._run), len(self.waiting) + len(self.holding), self.kv.num_blocks - free, free)
        if self.request_data:
            self._attach_data(batch)
        if self.tier is not None:
            connector.offer(self, batch)
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
        if not nd0 or len(batch.reqs) or self._dec_ids or not self._fin or self._held_back or \
                (self.tier is not None and self.tier.busy):
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
        t, tier = self.requests, self.tier
        return min(INF if self.horizon_ms is None else self.horizon_ms, self.aborts[0][0] if self.aborts else INF,
                   t.arrival[self.next_arrival] if self.next_arrival < t.n else INF,
                   (tier.next_done_ms() or INF) if tier is not None else INF)

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
        if self.tier is not None:   # (the copies an executor made, measured: instead of the link's model)
            self.tier.submit(t_end, batch.kv_copies, out.copies)
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
