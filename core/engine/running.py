"""The scheduler's state and its transitions (core.engine.scheduler.Scheduler's base; the step itself,
planning and completing it, is scheduler.py): the request table, the waiting queue, the running set
with the decoders' two calendars (block crossings keyed by D mod block size, last tokens keyed by D),
arrivals, cancellations, requests becoming decoders and explicit again, emitted tokens and finishes,
and the outputs taken after each step (EngineOutputs). See scheduler.py's docstring for the model."""
from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Iterable

import numpy as np
from mypy_extensions import mypyc_attr

from core.config import SchedulerConfig
from core.engine import admission as adm
from core.engine import policies
from core.engine.kv_cache import KVCacheManager
from core.engine.outputs import (
    EMPTY,
    EngineOutputs,
    Finish,
    Preemption,
    SchedulerOutput,
    SchedulerStats,
    StepRecord,
)
from core.engine.requests import DONE, INF, NOT_ARRIVED, RUNNING, WAITING, RequestTable
from core.errors import ConfigError
from core.kvtier.tier import make_tier
from core.workload import Request, Workload

_tuple = tuple.__new__   # makes a NamedTuple without its Python-level __new__ (once per step)
_INT = np.int64


@mypyc_attr(allow_interpreted_subclasses=True)
class SchedulerState:
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
        self.tier = make_tier(config)      # the CPU tier under the prefix cache (core.kvtier), or None
        self.holding: deque[int] = deque()   # waiting requests holding KV blocks (CPU-tier loads), scheduled first
        self.copies: list | None = None    # CPU-tier loads planned by a schedule that made no batch (request_data)
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
            if self.tier is not None:   # the CPU tier's, on the same channel: +2 stored there, -2 evicted from it
                self.tier.listener = lambda sign, h, t: self._news.append((2 * sign, h, t))

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
        done = self.tier.next_done_ms() if self.tier is not None else None
        if done is not None:
            times.append(done)
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
        elif i in self.holding:   # (its CPU-tier load planned or done: it holds blocks)
            self.holding.remove(i)
            self.kv.now_ms = now_ms
            self._free(i)
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
        if self.tier is not None:
            self.tier.finished(i)

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
        cross = self._cross[(-base) % self.cfg.block_size]   # (in join order: found by bisection)
        del cross[bisect.bisect_left(cross, (seq, i))]
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
        state, finished, tier = t.state, self._finished, self.tier
        for i in fin:   # (a decoder's last step ended at t_end: _last_dec_t)
            self._leave(i)
            if tier is not None:
                tier.finished(i)
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

    def reject_over_bound(self, now_ms: float):
        for i in adm.over_bound(self.cfg, self.waiting, self.ran):   # queue_limit
            self.waiting.remove(i)
            self._finish_failed(i, Finish(
                i, now_ms, adm.REJECTED, f"{len(self.waiting) + 1} requests waiting, over the queue limit of "
                f"{self.cfg.queue_limit}", "queue_limit"))

    # ---- what happened ----------------------------------------------------------------------
    def stats(self) -> SchedulerStats:
        """The gauges now, with the prompt tokens the waiting requests must still compute
        (a preempted request recomputes its emitted tokens too): a router's load signals."""
        t = self.requests
        p, e, c = t.prompt_len, t.emitted, t.computed
        queued = sum([p[i] + e[i] - c[i] for i in self.waiting]) + sum([p[i] + e[i] - c[i] for i in self.holding])
        return SchedulerStats(*self._gauges(), queued)

    def _gauges(self) -> tuple[int, int, int, int, int, int]:
        """SchedulerStats' fields now, as a plain tuple (made once per step)."""
        kv = self.kv
        return (len(self._run), len(self.waiting) + len(self.holding), kv.num_used, kv.num_blocks, self.num_preemptions,
                kv.counts["hit"])

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
