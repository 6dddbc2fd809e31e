"""Issue 50's design, measured before it is built: a step whose work follows what changed.

    python -m bench.calendar_step [--requests 10000] [--rate 50] [--repeat 3]

A feasibility measurement, not a second scheduler: nothing in the product imports it, and it is
deleted when core/engine takes the design. It runs bench.vs_vidur's workload (bench.step_cost's
engine: continuous batching, 256 seats, 8,192-token budget and chunk, block size 16, the affine
5 ms + 0.02 ms/prefill token + 0.05 ms/decode sequence; an unbounded KV pool, so no preemption)
two ways, side by side in one process:

- today's engine core loop, recording (core.engine: the planner, per-request arrays every step);
- the calendar step, for this configuration only: a decode counter D (a decoding request's next
  position is its first one + D - D at its first decode, so a plain decode touches no request), a
  block calendar keyed by position mod block size (only the requests that cross a block boundary
  this step are touched, in running order), a finish calendar keyed by the value of D at which a
  length-bounded request ends, the step time from running counts, and the step log as membership
  spans (request r decodes from counter value a to b), expanded into the batch and token rows by
  vectorised gathers afterwards.

It prints each way's seconds and microseconds per simulated step, and whether the calendar step
reproduces today's trace exactly (every step's start and duration, every batch row and token row,
in order). Nothing is asserted; docs/benchmarks.md records the figures.
"""
from __future__ import annotations

import argparse
import gc
import time
from collections import deque

import numpy as np

from bench.simulate import poisson_workload
from bench.step_cost import CONFIG, MODEL, run_once
from core.engine.admission import pool_blocks
from core.engine.requests import RequestTable
from core.engine.steplog import log_records


class _Calendars:
    """The calendar step's state: the block pool and tables, the running prompts and decoders, the
    block calendar (D mod block size -> decoders whose next position starts a block) and the finish
    calendar (value of D after their last decode -> decoders), with the spans and pieces recorded."""
    __slots__ = ("prompt", "out_len", "chunk", "bs", "free", "tables", "prefilling", "decoding", "crossing",
                 "finishing", "spans", "pieces")

    def __init__(self, prompt: list, out_len: list, chunk: int, bs: int, num_blocks: int):
        self.prompt, self.out_len, self.chunk, self.bs = prompt, out_len, chunk, bs
        self.free = list(range(num_blocks - 1, -1, -1))    # the pool hands out 0, 1, 2, ... (taken from the end)
        self.tables: dict[int, list[int]] = {}
        self.prefilling: dict[int, int] = {}               # mid-prefill request -> tokens computed (running order)
        self.decoding: set[int] = set()
        self.crossing = [[] for _ in range(bs)]            # D mod bs -> decoders whose next position starts a block
        self.finishing: dict[int, list[int]] = {}          # value of D after their last decode -> decoders
        self.spans: list = []
        self.pieces: list = []

    def take_work(self, step: int, D: int, waiting: deque, ndec: int, left: int, seats: int) -> tuple[list, list, int]:
        """The step's prefill work within `left` tokens: running prompts go on, oldest first; a fresh
        block for each decoder crossing a block boundary at counter value D; then waiting requests join
        while a seat, budget and the blocks of their first chunk are free. Returns the running prompts'
        and the joined ones' (request, tokens computed) and the prefill tokens taken."""
        prompt, chunk, bs, tables, free, pieces = self.prompt, self.chunk, self.bs, self.tables, self.free, self.pieces
        prefill_tokens = 0
        continued = []
        for r, c in self.prefilling.items():        # running prompts go on, oldest first
            if left <= 0:
                break
            take = min(prompt[r] - c, chunk, left)
            need = -(-(c + take) // bs) - len(tables[r])
            if need > 0:
                tables[r] += free[-need:]
                del free[-need:]
            continued.append((r, c + take))
            pieces.append((r, step, take))
            left -= take
            prefill_tokens += take
        due = self.crossing[D % bs]
        if due:                                     # a fresh block for each decoder crossing a boundary
            self._open_blocks(D, due)
        joined = []                                 # then waiting requests join
        running = ndec + len(self.prefilling)
        while waiting and running < seats and left > 0:
            r = waiting[0]
            take = min(prompt[r], chunk, left)
            need = -(-take // bs)
            if need > len(free):
                break
            waiting.popleft()
            tables[r] = free[-need:]
            del free[-need:]
            joined.append((r, take))
            pieces.append((r, step, take))
            left -= take
            prefill_tokens += take
            running += 1
        return continued, joined, prefill_tokens

    def _open_blocks(self, D: int, due: list) -> None:
        """A fresh block for each decoder crossing a block boundary at counter value D (`due`: its
        calendar entry, where decoders that finished since are dropped)."""
        due = self.crossing[D % self.bs] = [r for r in due if r in self.decoding]
        if due:
            free, tables = self.free, self.tables
            new = free[-len(due):]
            del free[-len(due):]
            for r, b in zip(due, new):
                tables[r].append(b)

    def settle(self, continued: list, joined: list, D: int, decoded: bool) -> int:
        """After the step: the decoders whose last decode brought the counter to D leave (when it
        decoded), then its prompts go on prefilling or start decoding (running prompts first, then the
        ones that joined). Returns how many requests are done."""
        prompt, prefilling = self.prompt, self.prefilling
        done = 0
        if decoded:
            for r in self.finishing.pop(D, ()):
                self.decoding.discard(r)
                self.free.extend(self.tables.pop(r))
                self.spans.append((r, D, 1))
                done += 1
        for r, c in continued:
            if c == prompt[r]:
                del prefilling[r]
                done += self._start_decoding(r, D)
            else:
                prefilling[r] = c
        for r, take in joined:
            if take == prompt[r]:
                done += self._start_decoding(r, D)
            else:
                prefilling[r] = take
        return done

    def _start_decoding(self, r: int, D: int) -> int:
        """Request r's prompt is done: it decodes from counter value D on; 1 if it is done instead."""
        if self.out_len[r] == 1:                       # its one token came with the prefill
            self.free.extend(self.tables.pop(r))
            return 1
        self.decoding.add(r)
        self.spans.append((r, D, 0))
        self.crossing[(D - self.prompt[r]) % self.bs].append(r)
        self.finishing.setdefault(D + self.out_len[r] - 1, []).append(r)
        return 0


def calendar_run(w, seats: int, budget: int, chunk: int, bs: int, num_blocks: int,
                 base_ms: float, prefill_ms: float, decode_ms: float) -> dict:
    """Continuous batching on calendars (see the module's text). Returns the step rows, the
    decode spans, the prefill pieces and the step at which each decode counter value was reached."""
    arrival = w.arrival_ms.tolist()
    n = len(arrival)
    cal = _Calendars(w.prompt_tokens.tolist(), [r.max_output_tokens for r in w.requests], chunk, bs, num_blocks)
    waiting: deque[int] = deque()
    D, t, nxt, step, done = 0, arrival[0], 0, 0, 0
    steps, counter_step = [], [-1]
    while done < n:
        while nxt < n and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        ndec = len(cal.decoding)
        continued, joined, prefill_tokens = cal.take_work(step, D, waiting, ndec, budget - ndec, seats)
        if not ndec and not cal.prefilling and not joined:
            t = arrival[nxt]                      # idle: jump to the next arrival
            continue
        dur = base_ms + prefill_ms * prefill_tokens + decode_ms * ndec
        steps.append((t, dur))
        t += dur
        if ndec:
            D += 1
            counter_step.append(step)
        done += cal.settle(continued, joined, D, ndec > 0)
        step += 1
    return {"steps": steps, "spans": cal.spans, "pieces": cal.pieces, "counter_step": counter_step}


def rows_of(log: dict) -> tuple[dict, dict]:
    """The batch and token rows (step order, then running order: request order under FCFS with no
    preemption) from the calendar run's spans and prefill pieces: each row a key step * N + request
    (a request is at most once in a step), the keys sorted as values (no argsort), the other columns
    computed from the key."""
    st = np.array(log["steps"], dtype=np.float64)
    t_end = st[:, 0] + st[:, 1]
    sp = np.array(log["spans"], dtype=np.int64)               # (req, D, 0 start | 1 end)
    sp = sp[np.lexsort((sp[:, 2], sp[:, 0]))].reshape(-1, 2, 3)
    req, d0, k = sp[:, 0, 0], sp[:, 0, 1], sp[:, 1, 1] - sp[:, 0, 1]
    off = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    counter_step = np.array(log["counter_step"], dtype=np.int64)
    N = int(max(req.max(initial=0), max((p[0] for p in log["pieces"]), default=0))) + 1
    dec_key = counter_step[np.repeat(d0, k) + 1 + off] * N + np.repeat(req, k)
    pc = np.array(log["pieces"], dtype=np.int64)             # (req, step, tokens)
    pc_key = pc[:, 1] * N + pc[:, 0]
    o = np.argsort(pc_key)
    pc_key, pc_tok = pc_key[o], pc[o, 2]
    key = np.sort(np.concatenate([dec_key, pc_key]))
    is_piece = np.zeros(len(key), dtype=bool)
    at = np.searchsorted(key, pc_key)
    is_piece[at] = True
    tokens = np.ones(len(key), dtype=np.int64)
    tokens[at] = pc_tok
    step, r = np.divmod(key, N)
    batch = {"step": step, "req": r, "tokens": tokens, "kind": is_piece.astype(np.int8)}
    # tokens: a prompt's last piece emits index 0; a decode at step s emits 1 + the decodes it did before
    done_before = np.zeros(len(t_end) + 1, dtype=np.int64)   # decode steps before each step
    np.add.at(done_before, counter_step[1:] + 1, 1)
    done_before = np.cumsum(done_before)[:-1]
    first_d = np.zeros(N, dtype=np.int64)
    first_d[req] = d0
    pcs = pc[np.lexsort((pc[:, 1], pc[:, 0]))]
    last = pcs[np.r_[pcs[1:, 0] != pcs[:-1, 0], True]]
    last_key = np.sort(last[:, 1] * N + last[:, 0])
    emit = ~is_piece
    emit[np.searchsorted(key, last_key)] = True
    ks, kr, kp = step[emit], r[emit], is_piece[emit]
    index = np.where(kp, 0, done_before[ks] - first_d[kr] + 1)
    return batch, {"t_ms": t_end[ks], "req": kr, "index": index}


def _best(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.disable()
        try:
            t = time.perf_counter()
            out = fn()
            best = min(best, time.perf_counter() - t)
        finally:
            gc.enable()
    return best, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    w = poisson_workload(a.requests, a.rate)
    c = CONFIG
    num_blocks = pool_blocks(c, RequestTable(w))
    args = (w, c.max_seqs, c.token_budget, c.chunk, c.block_size, num_blocks,
            MODEL.base_ms, MODEL.prefill_ms_per_token, MODEL.decode_ms_per_seq)
    run_once(w, True, False)                                 # warm
    calendar_run(*args)
    today_s, core = min((run_once(w, True, False) for _ in range(a.repeat)), key=lambda x: x[0])
    cal_s, log = _best(lambda: calendar_run(*args), a.repeat)
    today_rows_s, rec = _best(lambda: log_records(core.log), a.repeat)
    cal_rows_s, (batch, token) = _best(lambda: rows_of(log), a.repeat)
    n = core.scheduler.step
    st = rec["step"]
    mine = np.array(log["steps"])
    same = {"steps": len(mine) == n and np.array_equal(st["t_ms"], mine[:, 0])
            and np.array_equal(st["dur_ms"], mine[:, 1]),
            "batch rows": all(np.array_equal(np.asarray(rec["batch"][k]), v) for k, v in batch.items()),
            "token rows": all(np.array_equal(np.asarray(rec["token"][k]), v) for k, v in token.items())}
    print(f"{a.requests:,} requests (Poisson {a.rate:g}/s), {n:,} simulated steps; best of {a.repeat}")
    print(f"{'':<40} {'s':>7} {'us/step':>8}")
    for name, s in (("today's engine loop (recorded)", today_s), ("calendar step (spans recorded)", cal_s),
                    ("today's columns from the log", today_rows_s), ("calendar rows from spans", cal_rows_s)):
        print(f"{name:<40} {s:7.3f} {1e6 * s / n:8.1f}")
    print(f"loop: today / calendar = {today_s / cal_s:.1f}x; the same trace: "
          + ", ".join(f"{k} {'identical' if v else 'DIFFERENT'}" for k, v in same.items()))
    print("issue 50's target: <= 15 us per simulated step on this workload")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
