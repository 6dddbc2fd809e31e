"""Iteration-level request scheduler, shared by the simulator and the runner.

One step = one forward pass over a batch of (request, token count) pairs. The rule for
every request is the same: it owns `prompt + emitted` known tokens, of which `computed`
have KV in the cache; a step computes `n` more, and when computed reaches
prompt + emitted the step's last logits yield the next token (emitted += 1).
So a fresh request emits its first token in the step that finishes its prefill, and a
request with n output tokens needs n steps when its prefill fits in one step.

Policies
- continuous: iteration-level refill (Orca/vLLM): every step, running requests first
  (decodes and continuing prefill chunks, oldest first), then waiting requests are
  admitted FCFS while seats (`max_seqs`), the token budget and KV blocks allow.
- static: fixed cohorts: waiting requests are admitted only when the running set is
  empty; a cohort holds its seats until its last member finishes.
- serial: one request at a time (static/continuous with max_seqs = 1).

Limits: `max_seqs` running requests; `token_budget` tokens per step (prefill + decode);
`chunk` = chunked prefill (at most `chunk` prompt tokens per request per step; without
it a prompt is computed in a single step); KV blocks from `core.paging.BlockManager`.
When the running requests need more KV blocks than are free, the newest running
request is preempted (its blocks freed, to be recomputed) and re-queued at the front;
no new request is admitted in a step that preempted.

The per-step work is vectorised over the running set with numpy, so long simulations
stay fast; only block allocation, admission and finishing touch Python per request.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from core.errors import ConfigError
from core.paging import BlockManager, KVLog
from core.workload import Workload

POLICIES = ("serial", "static", "continuous")
BIG = 1 << 62  # "no limit" for budgets and seats


@dataclass(slots=True)
class SchedulerConfig:
    policy: str = "continuous"      # serial | static | continuous
    max_seqs: int | None = None     # running requests at most (None: no limit; serial: 1)
    token_budget: int | None = None  # tokens computed per step, prefill + decode (None: no limit)
    chunk: int | None = None        # chunked prefill: prompt tokens per request per step (None: off)
    block_size: int = 16            # tokens per KV block
    kv_blocks: int | None = None    # KV pool size in blocks (None: enough for every request at once)
    prefix_caching: bool = False    # reuse cached full blocks with an exact token-id prefix match
    model_id: str | None = None     # part of the prefix-cache key (model/adapter identity)
    spec_gamma: int = 0             # speculative decoding: draft tokens verified per decode step (0: off)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ConfigError(f"policy: expected one of {', '.join(POLICIES)}, got {self.policy!r}")
        for name in ("max_seqs", "token_budget", "chunk", "kv_blocks"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name}: expected a positive integer or none, got {v!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(f"block_size: expected a positive integer, got {self.block_size!r}")
        if isinstance(self.spec_gamma, bool) or not isinstance(self.spec_gamma, int) or self.spec_gamma < 0:
            raise ConfigError(f"spec_gamma: expected an integer >= 0, got {self.spec_gamma!r}")

    @property
    def seats(self) -> int:
        if self.policy == "serial":
            return 1
        return self.max_seqs if self.max_seqs is not None else BIG

    def to_dict(self) -> dict:
        return {"policy": self.policy, "max_seqs": self.seats if self.seats != BIG else None,
                "token_budget": self.token_budget, "chunk": self.chunk,
                "block_size": self.block_size, "kv_blocks": self.kv_blocks,
                "prefix_caching": self.prefix_caching, "model_id": self.model_id, "spec_gamma": self.spec_gamma}


@dataclass(slots=True)
class Batch:
    step: int
    t_ms: float                 # step start
    reqs: np.ndarray            # request indices, batch order
    num_tokens: np.ndarray      # tokens computed for each this step
    start_pos: np.ndarray       # first position written (tokens already cached)
    is_prefill: np.ndarray      # False: a one-token decode after at least one emission

    @property
    def prefill_tokens(self) -> int:
        return int(self.num_tokens[self.is_prefill].sum())

    @property
    def decode_seqs(self) -> int:
        return int((~self.is_prefill).sum())

    @property
    def total_tokens(self) -> int:
        return int(self.num_tokens.sum())


class StepRun(tuple):
    """Step-log entry for a run of steps (fast-forward): the seven columns as arrays."""

    def __new__(cls, *cols):
        return super().__new__(cls, cols)


class StepLog:
    """Columnar record of what the scheduler did (turned into a trace by core.trace)."""

    def __init__(self):
        self.steps = []                          # (step, t_ms, dur_ms, running, waiting, used, free) or StepRun
        self.batch_parts = []                    # (step or array of steps, reqs, num_tokens, is_prefill)
        self.token_parts = []                    # (reqs, index, t_ms, token_ids|None)
        self.finishes = []                       # (req, t_ms, reason)
        self.preempts = []                       # (req, t_ms, reason, freed_blocks)
        self.kv = KVLog()
        self.token_sources = []                  # per token part: codes into TOKEN_SOURCES, or None (sampled)
        self.other = []                          # verbatim events (spec, tiles)


class Scheduler:
    def __init__(self, workload: Workload, config: SchedulerConfig, log: StepLog | None = None):
        self.cfg = config
        reqs = workload.requests
        self.ids = [r.id for r in reqs]
        self.n = len(reqs)
        self.prompt_len = np.array([r.prompt_tokens for r in reqs], dtype=np.int64)
        self.out_len = np.array([r.output_tokens for r in reqs], dtype=np.int64)
        self.arrival = np.array([r.arrival_ms for r in reqs], dtype=np.float64)
        self.salt = [r.tenant for r in reqs]
        # Known token ids per request (prompt, then outputs when the caller supplies them).
        self.token_ids = [list(r.prompt_ids) if r.prompt_ids is not None else None for r in reqs]
        self.aborts = sorted((r.abort_at_ms, i) for i, r in enumerate(reqs) if r.abort_at_ms is not None)
        self.abort_at = np.array([np.inf if r.abort_at_ms is None else r.abort_at_ms for r in reqs])
        self.aborts_pending = bool(self.aborts)
        bs = config.block_size
        # KV slots a request ever needs: the last output token is never fed back.
        need_blocks = -(-(self.prompt_len + self.out_len - 1) // bs)
        if config.kv_blocks is None:
            num_blocks = int(need_blocks.sum())
        else:
            num_blocks = config.kv_blocks
            worst = int(need_blocks.argmax())
            if need_blocks[worst] > num_blocks:
                raise ConfigError(
                    f"kv_blocks: request {self.ids[worst]!r} needs {int(need_blocks[worst])} blocks "
                    f"of {bs} tokens (prompt + output - 1 = "
                    f"{int(self.prompt_len[worst] + self.out_len[worst] - 1)} tokens) "
                    f"but the pool has {num_blocks}")
        if config.chunk is None and config.token_budget is not None:
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
        self.state = np.zeros(self.n, dtype=np.int8)  # 0 not arrived, 1 waiting, 2 running, 3 done
        self.run = np.empty(0, dtype=np.int64)        # running request indices, admission order
        self.waiting: deque[int] = deque()
        self.next_arrival = 0
        self.num_done = 0
        self.step = 0
        self.num_preemptions = 0
        self._pending_step = None

    # ---- clock-driven inputs ---------------------------------------------------------
    def done(self) -> bool:
        return self.num_done == self.n

    def admit_arrivals(self, now_ms: float):
        while self.next_arrival < self.n and self.arrival[self.next_arrival] <= now_ms:
            i = self.next_arrival
            if self.state[i] == 0:
                self.waiting.append(i)
                self.state[i] = 1
            self.next_arrival += 1

    def next_event_ms(self) -> float | None:
        """When something can next happen while idle: an arrival or an abort."""
        times = []
        nxt = self.next_arrival
        while nxt < self.n and self.state[nxt] == 3:
            nxt += 1
        if nxt < self.n:
            times.append(float(self.arrival[nxt]))
        for t, i in self.aborts:
            if self.state[i] != 3:
                times.append(t)
                break
        return min(times) if times else None

    def abort(self, i: int, now_ms: float, reason: str = "abort", t_finish: float | None = None):
        """Cancel request i wherever it is; its blocks return to the pool at `now_ms`; the
        finish event is stamped `t_finish` (when the client cancelled) if given."""
        if self.state[i] == 3:
            return
        if self.state[i] == 2:
            self.bm.now_ms = now_ms
            self.bm.free_seq(i)
            self.nblocks[i] = 0
            self.run = self.run[self.run != i]
        elif self.state[i] == 1:
            self.waiting.remove(i)
        self.state[i] = 3  # a request not yet arrived is skipped when it would arrive
        self.num_done += 1
        if self.log is not None:
            self.log.finishes.append((i, now_ms if t_finish is None else t_finish, reason))

    def _abort_due(self, now_ms):
        while self.aborts and self.aborts[0][0] <= now_ms:
            t, i = self.aborts.pop(0)
            self.abort(i, now_ms)

    # ---- one step ----------------------------------------------------------------------
    def _plan_running(self, run, budget):
        pending = self.prompt_len[run] + self.emitted[run] - self.computed[run]
        want = np.minimum(pending, self.cfg.chunk) if self.cfg.chunk else pending
        if self.cfg.spec_gamma:
            # A speculative decode verifies the last token plus up to gamma draft tokens, never
            # proposing past the request's output length.
            room = self.out_len[run] - self.emitted[run] - 1
            want = want + np.where((pending == 1) & (self.emitted[run] > 0),
                                   np.minimum(self.cfg.spec_gamma, room), 0)
        # Oldest first: each request takes what the budget has left after those before it.
        before = np.cumsum(want) - want
        n = np.clip(budget - before, 0, want)
        need = -(-(self.computed[run] + n) // self.cfg.block_size) - self.nblocks[run]
        # A decode computes the one token emitted last; anything else is (re)prefill.
        is_decode = (pending == 1) & (self.emitted[run] > 0)   # (with spec: decode + draft tokens)
        return n, need, is_decode

    def schedule(self, now_ms: float) -> Batch | None:
        """Choose the next step's batch (None if there is nothing to run now)."""
        cfg, bm = self.cfg, self.bm
        bm.now_ms = now_ms
        self._abort_due(now_ms)
        budget = cfg.token_budget if cfg.token_budget is not None else BIG
        bs = cfg.block_size
        run = self.run
        cohort_open = cfg.policy == "continuous" or len(run) == 0
        preempted = False
        n = need = np.empty(0, dtype=np.int64)
        is_decode = np.empty(0, dtype=bool)
        if len(run):
            n, need, is_decode = self._plan_running(run, budget)
            while int(need.sum()) > bm.num_free:
                victim = int(run[-1])           # newest running request
                freed = bm.free_seq(victim)
                self.computed[victim] = 0
                self.nblocks[victim] = 0
                self.state[victim] = 1
                self.waiting.appendleft(victim)
                run = run[:-1]
                preempted = True
                self.num_preemptions += 1
                if self.log is not None:
                    self.log.preempts.append((victim, now_ms, "kv_full", freed))
                n, need, is_decode = self._plan_running(run, budget)
            grow = need > 0
            if grow.any():
                bm.grow_many(run[grow].tolist(), need[grow].tolist())
                self.nblocks[run] += need
        used = int(n.sum())
        new_reqs, new_n = [], []
        if cohort_open and not preempted:
            seats = cfg.seats - len(run)
            while self.waiting and seats > 0 and budget - used > 0:
                r = self.waiting[0]
                total = int(self.prompt_len[r] + self.emitted[r])  # tokens to (re)compute
                known = self.token_ids[r]
                hits = bm.match_prefix(known, self.salt[r], max_tokens=total - 1) if known else []
                cached = len(hits) * bs
                pending = total - cached
                take = min(pending, cfg.chunk or pending, budget - used)
                if cfg.chunk is None and take < pending:
                    break  # the whole prompt must fit in this step's budget
                if bm.admission_cost(hits, cached + take) > bm.num_free:
                    break  # FCFS: no skipping ahead of the head of the queue
                self.waiting.popleft()
                bm.admit(r, hits, self.salt[r])
                bm.grow(r, cached + take)
                self.computed[r] = cached
                self.nblocks[r] = len(bm.tables[r])
                self.state[r] = 2
                new_reqs.append(r)
                new_n.append(take)
                used += take
                seats -= 1
        if new_reqs:
            run = np.concatenate([run, np.array(new_reqs, dtype=np.int64)])
            n = np.concatenate([n, np.array(new_n, dtype=np.int64)])
            is_decode = np.concatenate([is_decode, np.zeros(len(new_reqs), dtype=bool)])
        self.run = run
        active = n > 0
        if not active.any():
            return None
        if active.all():
            reqs, num = run, n
        else:
            reqs, num, is_decode = run[active], n[active], is_decode[active]
        batch = Batch(self.step, now_ms, reqs, num, self.computed[reqs], ~is_decode)
        self._pending_step = (len(run), len(self.waiting), bm.num_used, bm.num_free)
        self._quiet = not new_reqs and not preempted  # nothing joined or left the running set
        return batch

    def fast_forward(self, batch: Batch, durations, min_steps: int = 3) -> float | None:
        """Simulator shortcut. If `batch` starts a run of identical decode-only steps (every
        running request decodes, nobody can be admitted, nobody finishes, KV suffices),
        apply as many of them as possible at once, with exactly the events step-by-step
        scheduling would record. `durations(k)` gives the k step durations. Returns the time
        the last applied step ends, or None (then use complete() as usual)."""
        cfg, bm, run = self.cfg, self.bm, self.run
        if (self.aborts_pending or not self._quiet or len(batch.reqs) != len(run)
                or batch.is_prefill.any() or cfg.spec_gamma):
            return None
        K = int((self.out_len[run] - self.emitted[run]).min()) - 1  # the finishing step runs normally
        if K < min_steps:
            return None
        t0 = batch.t_ms
        d = np.asarray(durations(K), dtype=np.float64)
        ends = np.cumsum(np.r_[t0, d])[1:]          # sequential sums: bit-identical to t += d
        starts = np.r_[t0, ends[:-1]]
        nxt = self.next_arrival
        arrivals_by_step = np.zeros(K, dtype=np.int64)
        if nxt < self.n:
            # Arrivals join the queue at each step start; they can only be admitted if the
            # queue was empty and a seat is free (continuous), so the run must stop there.
            pending = self.arrival[nxt:]
            arrivals_by_step = np.searchsorted(pending, starts, side="right")
            if cfg.policy == "continuous" and len(run) < cfg.seats and not self.waiting:
                K = min(K, int(np.searchsorted(starts, pending[0], side="left")))
        # KV: a request needs a new block at step j >= 1 when its position c + j starts a block.
        bs = cfg.block_size
        c = batch.start_pos
        residue = (-c) % bs
        by_residue = np.bincount(residue, minlength=bs)
        j = np.arange(1, K)
        need = by_residue[j % bs]
        over = np.flatnonzero(np.cumsum(need) > bm.num_free)
        if len(over):
            K = min(K, int(over[0]) + 1)
        if K < min_steps:
            return None
        n = len(run)
        log = self.log
        members = {res: run[residue == res].tolist() for res in np.flatnonzero(by_residue)}
        step0, waiting0 = self.step, len(self.waiting)
        alloc_steps = (np.flatnonzero(need[:K - 1]) + 1).tolist()  # steps that take new blocks
        owners, times = [], []
        for k in alloc_steps:
            m = members[k % bs]
            owners += m
            times += [float(starts[k])] * len(m)
        if owners and not bm.append_blocks(owners, times):
            for k in alloc_steps:  # some block must be evicted: replay step by step, exactly
                bm.now_ms = float(starts[k])
                bm.grow_many(members[k % bs], [1] * len(members[k % bs]))
        used = self._pending_step[2] + np.r_[0, np.cumsum(need[:K - 1])]
        if log is not None:
            steps = np.arange(step0, step0 + K)
            log.steps.append(StepRun(steps, starts[:K], d[:K], np.full(K, n), waiting0 + arrivals_by_step[:K],
                                     used, bm.num_blocks - used))
            log.batch_parts.append((steps, run, batch.num_tokens, batch.is_prefill))
            em = self.emitted[run]
            log.token_parts.append((np.tile(run, K), (em[None, :] + np.arange(K)[:, None]).ravel(),
                                    np.repeat(ends[:K], n), None))
            log.token_sources.append(None)
        self.computed[run] += K
        self.emitted[run] += K
        self.nblocks[run] = -(-self.computed[run] // bs)
        self.step += K
        self._pending_step = None
        return float(ends[K - 1])

    def complete_spec(self, batch: Batch, t_end_ms: float, new_tokens: list[list[int]],
                      sources: list[list[int]], spec_events: list[dict] | None = None) -> None:
        """Apply a step that may contain speculative verifications. new_tokens[j]: the
        tokens batch entry j emits (empty if none; for a verified decode: the accepted draft
        tokens then one recovered or bonus token); sources[j]: their codes in
        core.trace.TOKEN_SOURCES. A verified decode keeps KV only for the accepted prefix:
        computed becomes prompt + emitted - 1 and blocks past it return to the pool."""
        bm = self.bm
        bm.now_ms = t_end_ms
        r = batch.reqs
        self.computed[r] += batch.num_tokens
        cancelled = (self.abort_at[r] <= t_end_ms) if self.aborts_pending else np.zeros(len(r), dtype=bool)
        counts = np.array([0 if c else len(t) for t, c in zip(new_tokens, cancelled.tolist())], dtype=np.int64)
        emit_r, emit_idx, emit_src, emit_ids = [], [], [], []
        for j, i in enumerate(r.tolist()):
            k = int(counts[j])
            if not k:
                continue
            first = int(self.emitted[i])
            emit_r += [i] * k
            emit_idx += range(first, first + k)
            emit_src += sources[j][:k]
            emit_ids += new_tokens[j][:k]
            if self.token_ids[i] is not None:
                self.token_ids[i].extend(new_tokens[j][:k])
        self.emitted[r] += counts
        spec = ~batch.is_prefill & (batch.num_tokens > 1) & (counts > 0)
        for j in np.flatnonzero(spec).tolist():  # roll back KV past the accepted prefix
            i = int(r[j])
            keep = int(self.prompt_len[i] + self.emitted[i] - 1)
            self.computed[i] = keep
            bm.truncate(i, keep)
            self.nblocks[i] = len(bm.tables[i])
        if self.log is not None:
            running, waiting, used, free = self._pending_step
            self.log.steps.append((batch.step, batch.t_ms, t_end_ms - batch.t_ms, running, waiting, used, free))
            self.log.batch_parts.append((batch.step, r, batch.num_tokens, batch.is_prefill))
            er = np.array(emit_r, dtype=np.int64)
            self.log.token_parts.append((er, np.array(emit_idx, dtype=np.int64), t_end_ms,
                                         np.array(emit_ids, dtype=np.int64)))
            self.log.token_sources.append(np.array(emit_src, dtype=np.int8))
            if spec_events:
                self.log.other.extend(spec_events)
        if bm.prefix_caching:
            bs = self.cfg.block_size
            crossed = (self.computed[r] // bs) > (batch.start_pos // bs)
            for i in r[crossed].tolist():
                if self.token_ids[i] is not None and i in bm.tables:
                    bm.commit(i, self.token_ids[i], int(self.computed[i]))
        done = [int(i) for j, i in enumerate(r.tolist()) if counts[j] and self.emitted[i] >= self.out_len[i]]
        for i in done:
            bm.free_seq(i)
            self.nblocks[i] = 0
            self.state[i] = 3
            if self.log is not None:
                self.log.finishes.append((i, t_end_ms, "length"))
        self.num_done += len(done)
        for i in r[cancelled].tolist():
            self.abort(i, t_end_ms, t_finish=max(float(self.abort_at[i]), batch.t_ms))
        if done:
            self.run = self.run[self.state[self.run] == 2]
        self.step += 1
        self._pending_step = None

    def complete(self, batch: Batch, t_end_ms: float, dur_ms: float | None = None,
                 token_ids: np.ndarray | None = None, t_tokens_ms: float | None = None,
                 stopped: set | None = None) -> np.ndarray:
        """Apply a finished step. `token_ids` (runner): the sampled id for each batch entry
        (entries that do not emit this step are ignored); `stopped` ends requests early (EOS).
        Returns the indices of requests that emitted a token this step."""
        bm = self.bm
        bm.now_ms = t_end_ms
        r = batch.reqs
        self.computed[r] += batch.num_tokens
        emit = self.computed[r] == self.prompt_len[r] + self.emitted[r]
        cancelled = None
        if self.aborts_pending:
            cancelled = self.abort_at[r] <= t_end_ms  # cancelled mid-step: its token is never delivered
            if cancelled.any():
                emit &= ~cancelled
            else:
                cancelled = None
        er = r[emit]
        self.emitted[er] += 1
        t_tok = t_end_ms if t_tokens_ms is None else t_tokens_ms
        tids = None
        if token_ids is not None:  # one id per batch entry; entries that do not emit are ignored
            tids = np.asarray(token_ids, dtype=np.int64)[emit]
            for i, tid in zip(er.tolist(), tids.tolist()):
                if self.token_ids[i] is not None:
                    self.token_ids[i].append(tid)
        if self.log is not None:
            dur = t_end_ms - batch.t_ms if dur_ms is None else dur_ms
            running, waiting, used, free = self._pending_step
            self.log.steps.append((batch.step, batch.t_ms, dur, running, waiting, used, free))
            self.log.batch_parts.append((batch.step, r, batch.num_tokens, batch.is_prefill))
            self.log.token_parts.append((er, self.emitted[er] - 1, t_tok, tids))
            self.log.token_sources.append(None)
        if bm.prefix_caching:
            bs = self.cfg.block_size
            crossed = (self.computed[r] // bs) > (batch.start_pos // bs)
            for i in r[crossed].tolist():
                ids = self.token_ids[i]
                if ids is not None:
                    bm.commit(i, ids, int(self.computed[i]))
        fin = er[self.emitted[er] >= self.out_len[er]]
        reasons = {}
        if stopped:
            extra = [i for i in er.tolist() if i in stopped and self.emitted[i] < self.out_len[i]]
            if extra:
                fin = np.concatenate([fin, np.array(extra, dtype=np.int64)])
                reasons = {i: "stop" for i in extra}
        if len(fin):
            for i in fin.tolist():
                bm.free_seq(i)
                self.nblocks[i] = 0
                self.state[i] = 3
                if self.log is not None:
                    self.log.finishes.append((i, t_tok, reasons.get(i, "length")))
            self.num_done += len(fin)
            self.run = self.run[self.state[self.run] == 2]
        if cancelled is not None:
            for i in r[cancelled].tolist():
                self.abort(i, t_end_ms, t_finish=max(float(self.abort_at[i]), batch.t_ms))
        self.step += 1
        self._pending_step = None
        return er
