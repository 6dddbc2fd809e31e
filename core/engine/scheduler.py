"""Iteration-level request scheduler, shared by the simulator and the runner.

One step = one forward pass over a batch of (request, token count) pairs. The rule for
every request is the same: it owns `prompt + emitted` known tokens, of which `computed`
have KV in the cache; a step computes `n` more, and when computed reaches
prompt + emitted the step's last logits yield the next token (emitted += 1).
So a fresh request emits its first token in the step that finishes its prefill, and a
request with n output tokens needs n steps when its prefill fits in one step.

Policies (who joins a step and what it mixes: serial, static, continuous, vllm-v1,
vllm-v0, orca, sarathi): core.engine.policies, which also holds the admission loop.

Limits: `max_seqs` running requests; `token_budget` tokens per step (prefill + decode);
`chunk` = chunked prefill (at most `chunk` prompt tokens per request per step; without
it a prompt is computed in a single step); KV blocks from `core.engine.kv_cache.BlockManager`.
When the running requests need more KV blocks than are free, the newest running
request is preempted (its blocks freed, to be recomputed) and re-queued at the front;
no new request is admitted in a step that preempted.

Admission control (queue order by priority, KV watermark, a bounded queue, a context
budget, per-request deadlines): core.engine.admission.

Per-step work is vectorised over the running set (numpy); only block allocation,
admission and finishing touch Python per request."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from core.config import BIG, POLICIES, SchedulerConfig  # noqa: F401  (re-exported)
from core.engine import admission as adm
from core.engine import policies
from core.engine.fastforward import fast_forward as _fast_forward
from core.engine.fastforward import plan_steady
from core.engine.kv_cache import BlockManager
from core.engine.outputs import DONE, NOT_ARRIVED, RUNNING, WAITING, Batch, RequestState  # noqa: F401  (re-exported)
from core.engine.steplog import BatchPart, FinishRecord, PreemptRecord, StepLog, StepOutput, StepRecord, TokenPart
from core.errors import ConfigError
from core.workload import Request, Workload


class Scheduler:
    decode_fast_path = True   # False: plan every step in full (tests compare the two)

    def __init__(self, workload: Workload | None, config: SchedulerConfig, log: StepLog | None = None,
                 stop_token_ids: Iterable[int] = ()):
        """`workload` None: no requests yet (a server adds them with add_request)."""
        self.cfg = config
        self.stop_token_ids = frozenset(stop_token_ids)  # a request emitting one of these stops (EOS)
        w = workload
        self.ids = list(w.ids) if w is not None else []
        self.n = n = len(self.ids)
        self.prompt_len = w.prompt_tokens.astype(np.int64) if n else np.empty(0, np.int64)
        self.out_len = w.max_output_tokens.astype(np.int64) if n else np.empty(0, np.int64)
        self.arrival = w.arrival_ms.astype(np.float64) if n else np.empty(0)
        reqs = w.requests if n and not w.plain else [None] * n   # per-request fields beyond the columns
        self.salt = [r and r.tenant for r in reqs]
        # Known token ids per request (prompt, then outputs when the caller supplies them).
        self.token_ids = [list(r.prompt_ids) if r and r.prompt_ids is not None else None for r in reqs]
        self.priority = [r.priority if r else 0 for r in reqs]
        # cancellations, earliest first: (time, request, finish reason "abort" or "deadline")
        self.aborts = sorted(e for e in (adm.abort_entry(r, i) for i, r in enumerate(reqs)) if e is not None)
        self.abort_at = np.full(n, np.inf)
        self.abort_reason = {}
        for t, i, why in self.aborts:
            self.abort_at[i], self.abort_reason[i] = t, why
        self.aborts_pending = bool(self.aborts)
        bs = config.block_size
        # KV slots a request ever needs: the last output token is never fed back.
        need_blocks = -(-(self.prompt_len + self.out_len - 1) // bs)
        if config.kv_blocks is None:
            num_blocks = int(need_blocks.sum())
        else:
            num_blocks = config.kv_blocks
            worst = int(need_blocks.argmax()) if self.n else 0
            if self.n and need_blocks[worst] > num_blocks and config.max_model_len is None:
                raise ConfigError(
                    f"kv_blocks: request {self.ids[worst]!r} needs {int(need_blocks[worst])} blocks "
                    f"of {bs} tokens (prompt + output - 1 = "
                    f"{int(self.prompt_len[worst] + self.out_len[worst] - 1)} tokens) "
                    f"but the pool has {num_blocks}")
        if config.chunk is None and config.token_budget is not None and self.n:
            worst = int(self.prompt_len.argmax())
            if self.prompt_len[worst] > config.token_budget:
                raise ConfigError(
                    f"token_budget: request {self.ids[worst]!r} has a {int(self.prompt_len[worst])}-token "
                    f"prompt, more than the per-step budget of {config.token_budget}; "
                    f"enable chunked prefill (chunk) or raise the budget")
        self.log = log
        self.bm = BlockManager(num_blocks, bs, config.prefix_caching, config.model_id,
                               log.kv if log is not None else None)
        self.computed = np.zeros(self.n, dtype=np.int64)
        self.emitted = np.zeros(self.n, dtype=np.int64)
        self.nblocks = np.zeros(self.n, dtype=np.int64)
        self.state = np.zeros(self.n, dtype=np.int8)  # RequestState per request
        self.run = np.empty(0, dtype=np.int64)        # running request indices, admission order
        self.waiting = adm.make_waiting(self)   # request indices, in admission order
        self._ran: set[int] = set()         # requests ever admitted (never rejected by queue_limit)
        self._wm = adm.watermark_blocks(config, num_blocks)
        self.failed = {"rejected": 0, "deadline": 0}
        self.next_arrival = 0
        self.num_done = 0
        self.step = 0
        self.num_preemptions = 0
        self._pending_step = None
        self._decoding = False  # the last step ran every running request (set by update)
        self._prefilling = None  # ... and these of them (mask over run) are mid-prefill
        self._consts: dict = {}
        self.stop_of: dict[int, frozenset] = {}   # per-request stop ids replacing stop_token_ids

    # ---- requests arriving while the loop runs (a server) -----------------------------------
    def add_request(self, r: Request, stop_ids: Iterable[int] | None = None) -> int:
        """Append request `r` (arrival times must not decrease) and return its index. `stop_ids`
        replace the scheduler's stop ids for it (() ignores EOS). Refused with ConfigError: a
        request that could never run (prompt + output over the KV pool; a prompt over the
        token budget without chunked prefill)."""
        return adm.add_request(self, r, stop_ids)

    # ---- clock-driven inputs ---------------------------------------------------------
    def done(self) -> bool:
        return self.num_done == self.n

    def admit_arrivals(self, now_ms: float):
        while self.next_arrival < self.n and self.arrival[self.next_arrival] <= now_ms:
            i = self.next_arrival
            if self.state[i] == NOT_ARRIVED:
                if adm.too_big(self.cfg, int(self.prompt_len[i]), int(self.out_len[i]), self.bm.num_blocks):
                    self._finish_failed(i, float(self.arrival[i]), adm.REJECTED)
                else:
                    self.waiting.append(i)
                    self.state[i] = WAITING
            self.next_arrival += 1

    def next_event_ms(self) -> float | None:
        """When something can next happen while idle: an arrival or an abort."""
        times = []
        nxt = self.next_arrival
        while nxt < self.n and self.state[nxt] == DONE:
            nxt += 1
        if nxt < self.n:
            times.append(float(self.arrival[nxt]))
        for t, i, _ in self.aborts:
            if self.state[i] != DONE:
                times.append(t)
                break
        return min(times) if times else None

    def abort(self, i: int, now_ms: float, reason: str = "abort", t_finish: float | None = None):
        """Cancel request i wherever it is; its blocks return to the pool at `now_ms`; the
        finish event is stamped `t_finish` (when the client cancelled) if given."""
        if self.state[i] == DONE:
            return
        if reason == adm.DEADLINE:
            self.failed[adm.DEADLINE] += 1
        if self.state[i] == RUNNING:
            self.bm.now_ms = now_ms
            self.bm.free_seq(i)
            self.nblocks[i] = 0
            self.run = self.run[self.run != i]
            self._decoding = False
        elif self.state[i] == WAITING:
            self.waiting.remove(i)
        self.state[i] = DONE  # a request not yet arrived is skipped when it would arrive
        self.num_done += 1
        if self.log is not None:
            self.log.finishes.append(FinishRecord(i, now_ms if t_finish is None else t_finish, reason))

    def _abort_due(self, now_ms):
        while self.aborts and self.aborts[0][0] <= now_ms:
            t, i, why = self.aborts.pop(0)
            self.abort(i, now_ms, why)

    def _finish_failed(self, i: int, t: float, why: str):
        """A request that never ran and never will (rejected)."""
        self.state[i] = DONE
        self.num_done += 1
        self.failed[why] += 1
        if self.log is not None:
            self.log.finishes.append(FinishRecord(i, t, why))

    # ---- one step ----------------------------------------------------------------------
    def _plan_running(self, run, budget):
        computed, emitted = self.computed[run], self.emitted[run]
        pending = self.prompt_len[run] + emitted - computed
        want = np.minimum(pending, self.cfg.chunk) if self.cfg.chunk else pending
        # A decode computes the one token emitted last; anything else is (re)prefill.
        is_decode = (pending == 1) & (emitted > 0)   # (with spec: decode + draft tokens)
        if self.cfg.spec_gamma:
            # A speculative decode verifies the last token plus up to gamma draft tokens, never
            # proposing past the request's output length.
            room = self.out_len[run] - emitted - 1
            want = want + np.where(is_decode, np.minimum(self.cfg.spec_gamma, room), 0)
        n = want if int(want.sum()) <= budget else policies.budget_shares(
            want, budget, is_decode, self.cfg.policy == "sarathi")
        bs = self.cfg.block_size
        need = (computed + n + (bs - 1)) // bs - self.nblocks[run]
        return n, need, is_decode, pending

    def schedule(self, now_ms: float) -> Batch | None:
        """Choose the next step's batch (None if there is nothing to run now)."""
        cfg, bm = self.cfg, self.bm
        bm.now_ms = now_ms
        self._abort_due(now_ms)
        budget = cfg.token_budget if cfg.token_budget is not None else BIG
        if cfg.policy == "vllm-v0" and self.waiting:   # a step of new prompts when any can join
            batch = policies.prefill_only_batch(self, now_ms, budget)
            if batch is not None:
                return self._planned(batch, joined=True)
        run = self.run
        # who may join in this step: static, only into an empty batch; vllm-v0, only in a step of
        # prompts alone (above)
        cohort_open = cfg.policy != "vllm-v0" and (cfg.policy != "static" or len(run) == 0)
        preempted = False
        # The steady state (every running request decodes, a few may be mid-prefill): planned
        # without the general path's per-request work; None: plan in full
        steady = plan_steady(self, run, budget) if self._decoding and len(run) else None
        if steady is not None:
            n, start, pre = steady
        elif len(run):
            n, need, is_decode, pending = self._plan_running(run, budget)
            while int(need.sum()) > bm.num_free:
                pos = adm.victim_position(cfg, run, self.priority, self.arrival)   # fcfs: the newest
                victim = int(run[pos])
                freed = bm.free_seq(victim)
                self.computed[victim] = 0
                self.nblocks[victim] = 0
                self.state[victim] = WAITING
                self.waiting.appendleft(victim)
                run = np.delete(run, pos)
                preempted = True
                self.num_preemptions += 1
                if self.log is not None:
                    self.log.preempts.append(PreemptRecord(victim, now_ms, "kv_full", freed))
                n, need, is_decode, pending = self._plan_running(run, budget)
            grow = np.flatnonzero(need > 0)
            if len(grow):
                who, more = run[grow], need[grow]
                if int(more.sum()) == len(grow):   # one block each
                    bm.grow_one_each(who, self.nblocks[who])
                else:
                    bm.grow_many(who.tolist(), more.tolist())
                self.nblocks[who] += more
        else:
            n = pending = np.empty(0, dtype=np.int64)
            is_decode = np.empty(0, dtype=bool)
        used = int(n.sum())
        new_reqs = new_n = new_pending = new_start = ()
        if cohort_open and not preempted:
            new_reqs, new_n, new_pending, new_start, used = policies.admit_waiting(self, budget, used, len(run))
        self.reject_over_bound(now_ms)
        if steady is not None:  # the running requests, then the admitted prefills: no entry is idle
            m0 = len(start)
            if new_reqs:
                self.run = run = np.concatenate([run, new_reqs])
                n = np.concatenate([n, new_n])
                start = np.concatenate([start, new_start])
            if pre is None and not new_reqs:   # decodes only
                is_prefill, emits, counts = self._const("false", m0), self._const("true", m0), (0, m0)
            else:
                is_prefill, emits = np.zeros(len(run), dtype=bool), np.ones(len(run), dtype=bool)
                is_prefill[m0:] = True
                emits[m0:] = [a >= b for a, b in zip(new_n, new_pending)]
                counts = (used - m0, m0)
                if pre is not None:   # (positions, is prefill, emits) of the running prefills
                    is_prefill[pre[0]], emits[pre[0]] = pre[1], pre[2]
                    counts = None
            batch = Batch(self.step, now_ms, run, n, start, is_prefill, emits, counts)
        else:
            batch = self._general_batch(run, n, pending, is_decode, new_reqs, new_n, new_pending, now_ms)
            if batch is None:
                return None
        return self._planned(batch, joined=bool(new_reqs) or preempted)

    def _planned(self, batch: Batch, joined: bool) -> Batch:
        free = self.bm.num_free
        self._pending_step = (len(self.run), len(self.waiting), self.bm.num_blocks - free, free)
        self._quiet = not joined  # nothing joined or left the running set
        return batch

    def reject_over_bound(self, now_ms: float):
        for i in adm.over_bound(self.cfg, self.waiting, self._ran):   # queue_limit
            self.waiting.remove(i)
            self._finish_failed(i, now_ms, adm.REJECTED)

    def _const(self, kind: str, k: int) -> np.ndarray:
        """k ones (int64), True or False: read-only views of one array per kind."""
        a = self._consts.get(kind)
        if a is None or len(a) < k:
            a = (np.ones if kind != "false" else np.zeros)(max(k, 256), dtype=np.int64 if kind == "ones" else bool)
            a.flags.writeable = False
            self._consts[kind] = a
        return a[:k]

    def _general_batch(self, run, n, pending, is_decode, new_reqs, new_n, new_pending, now_ms):
        if new_reqs:
            run = np.concatenate([run, np.array(new_reqs, dtype=np.int64)])
            n = np.concatenate([n, np.array(new_n, dtype=np.int64)])
            pending = np.concatenate([pending, np.array(new_pending, dtype=np.int64)])
            is_decode = np.concatenate([is_decode, np.zeros(len(new_reqs), dtype=bool)])
        self.run = run
        k = np.count_nonzero(n)
        if not k:
            return None
        if k == len(n):
            reqs, num = run, n
        else:
            active = n > 0
            reqs, num, is_decode, pending = run[active], n[active], is_decode[active], pending[active]
        return Batch(self.step, now_ms, reqs, num, self.computed[reqs], ~is_decode, num >= pending)

    def fast_forward(self, batch: Batch, durations, min_steps: int = 3) -> float | None:
        """Simulator shortcut (core.engine.fastforward): apply a run of identical decode-only steps
        starting with `batch` at once, with the events stepping them would record; returns
        when the last one ends, or None (then complete the step as usual)."""
        return _fast_forward(self, batch, durations, min_steps)

    # ---- completing a step: one path for plain, speculative and simulated steps ---------------
    def update(self, batch: Batch, out: StepOutput) -> np.ndarray:
        """Apply a finished step and return the indices of requests that emitted tokens.

        An entry emits when its computed tokens reach everything known (prompt + emitted):
        one token, or (speculative verification: 1 + gamma tokens computed) the accepted
        draft tokens plus one recovered or bonus token. Emission stops at max tokens and at
        the first stop id (EOS); the KV cache keeps only what the emitted tokens justify
        (prompt + emitted - 1 positions), so rejected draft positions return to the pool.
        A request cancelled while the step ran never receives its tokens."""
        bm = self.bm
        t_end = out.t_end_ms
        bm.now_ms = t_end
        r = batch.reqs
        whole = len(r) == len(self.run)   # every running request took part
        self.computed[r] = batch.start_pos + batch.num_tokens
        emit = batch.emits if batch.emits is not None else self.computed[r] >= self.prompt_len[r] + self.emitted[r]
        cancelled = None
        if self.aborts_pending:
            cancelled = self.abort_at[r] <= t_end
            if cancelled.any():
                emit = emit & ~cancelled
            else:
                cancelled = None
        stopped = []
        if out.tokens is None:  # simulated: one token (id unknown) per emitting entry
            er = r[emit]
            idx = self.emitted[er]
            self.emitted[er] = idx + 1
            ids = src = None
            # Every running request took part: next step those that emitted decode, the others
            # continue their prefill (schedule's steady-state plan).
            self._decoding = self.decode_fast_path and whole and not self.cfg.spec_gamma
            self._prefilling = None if len(er) == len(r) else ~emit
        else:
            self._decoding = False
            er, idx, ids, src, stopped = self._take_tokens(batch, out, emit)
        if self.log is not None:
            log = self.log
            running, waiting, used, free = self._pending_step
            dur = t_end - batch.t_ms if out.dur_ms is None else out.dur_ms
            log.steps.append(StepRecord(batch.step, batch.t_ms, dur, running, waiting, used, free))
            log.batch_parts.append(BatchPart(batch.step, r, batch.num_tokens, batch.is_prefill))
            log.token_parts.append(TokenPart(er, idx, t_end, ids))
            log.token_sources.append(src)
            if out.events:
                log.other.extend(out.events)
        if out.tokens is not None:  # keep KV only for positions the emitted tokens justify
            keep = self.prompt_len[r] + self.emitted[r] - 1
            for j in np.flatnonzero(self.computed[r] > np.maximum(keep, 0)).tolist():
                i = int(r[j])
                if self.emitted[i] == 0:
                    continue  # a prefill chunk: nothing emitted yet, nothing to roll back
                self.computed[i] = int(keep[j])
                bm.truncate(i, int(keep[j]))
                self.nblocks[i] = len(bm.tables[i])
        if bm.prefix_caching:
            bs = self.cfg.block_size
            crossed = (self.computed[r] // bs) > (batch.start_pos // bs)
            for i in r[crossed].tolist():
                ids_i = self.token_ids[i]
                if ids_i is not None and i in bm.tables:
                    bm.commit(i, ids_i, int(self.computed[i]))
        if out.tokens is None:   # one token each: emitted is now idx + 1
            fin = er[idx >= self.out_len[er] - 1]
        else:  # one row per token; a request's tokens are adjacent
            emitters = er[np.r_[True, er[1:] != er[:-1]]] if len(er) > 1 else er
            fin = emitters[self.emitted[emitters] >= self.out_len[emitters]]
        reasons = {}
        if stopped:
            extra = [i for i in stopped if self.emitted[i] < self.out_len[i]]
            if extra:
                fin = np.concatenate([fin, np.array(extra, dtype=np.int64)])
                reasons = {i: "stop" for i in extra}
        if len(fin):
            for i in fin.tolist():
                bm.free_seq(i)
                self.nblocks[i] = 0
                self.state[i] = DONE
                if self.log is not None:
                    self.log.finishes.append(FinishRecord(i, t_end, reasons.get(i, "length")))
            self.num_done += len(fin)
            keep = self.state[self.run] == RUNNING
            self.run = self.run[keep]
            if self._prefilling is not None and len(keep) == len(self._prefilling):
                self._prefilling = self._prefilling[keep]
        if cancelled is not None:
            for i in r[cancelled].tolist():
                self.abort(i, t_end, self.abort_reason.get(i, "abort"), max(float(self.abort_at[i]), batch.t_ms))
        self.step += 1
        self._pending_step = None
        return er

    def _take_tokens(self, batch, out, emit):
        """Emitted tokens of a step whose executor returned ids: cut at max tokens and at the
        first stop id. Returns (reqs, output index, ids, source codes or None, stopped reqs)."""
        emit_r, emit_idx, emit_ids, emit_src, stopped = [], [], [], [], []
        for j, i in enumerate(batch.reqs.tolist()):
            stop = self.stop_of.get(i, self.stop_token_ids)
            toks = out.tokens[j]
            if not emit[j] or not toks:
                continue
            first = int(self.emitted[i])
            k = min(len(toks), int(self.out_len[i]) - first)
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
            if self.token_ids[i] is not None:
                self.token_ids[i].extend(toks[:k])
            self.emitted[i] = first + k
        src = np.array(emit_src, dtype=np.int8) if out.sources is not None else None
        return (np.array(emit_r, dtype=np.int64), np.array(emit_idx, dtype=np.int64),
                np.array(emit_ids, dtype=np.int64), src, stopped)
