"""The engine behind `python -m gpu_runner serve`: the core step loop in one background
thread, fed by HTTP handlers through an inbox.

    handler --submit()--> inbox --(between steps)--> EngineCore.add_request / abort
    engine thread: core.engine.loop.run(EngineCore(ModelExecutor), WallClock, inbox=...,
                                        on_output=...)
    each EngineOutputs: queued, tokens, finishes --call_soon_threadsafe--> the handler's queue

Handlers never touch the scheduler; the engine thread never blocks on a client; this layer
reads only the engine's outputs. Every request is answered: one the scheduler refuses at once
(it could never fit the KV pool or the token budget) with its message (400); one rejected on
arrival (over max_model_len: 400) or by a full queue (queue_limit: 503) before it was accepted
with that reason; one rejected after it was accepted (queue_limit) with a finish "rejected"
that names the limit; a full waiting queue of the server refuses at once (503). Stop: every
unfinished request is aborted, the thread ends, and the trace (if recorded) is written.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from core.config import SamplingParams
from core.engine import loop
from core.engine.core import EngineCore
from core.engine.outputs import EngineOutputs
from core.errors import ConfigError
from core.trace import save_trace
from core.workload import Request, Workload

FLUSH_EVERY_S = 1.0
FLUSH_SHARE = 0.05   # a flush rebuilds the whole trace: at most this share of the engine thread's time


class Overloaded(Exception):
    """The waiting queue is full (HTTP 503 with Retry-After)."""


class ServerStopping(Exception):
    """The server is shutting down and admits nothing new (HTTP 503)."""


@dataclass(eq=False)
class Stream:
    """One client request as the engine sees it; events go to `queue` on the client's loop:
    ("accepted",), ("error", message, HTTP status), ("tokens", [ids]), ("finish", reason, detail)."""
    rid: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_ids: tuple[int, ...] | None           # None: the model's EOS; () ignores it
    aloop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    index: int | None = None                   # the scheduler's request index once added
    arrival_ms: float = 0.0
    sent: int = 0
    first_token_ms: float | None = None
    last_token_ms: float | None = None
    scheduled_ms: float | None = None
    accepted: bool = False
    done: bool = False

    def push(self, item):
        batch = getattr(_PUSHES, "items", None)
        if batch is not None:        # inside one_delivery(): delivered together at its end
            batch.append((self, item))
        else:
            self.aloop.call_soon_threadsafe(self.queue.put_nowait, item)


_PUSHES = threading.local()


class one_delivery:
    """What one engine output tells the clients reaches their queues in one callback of their
    event loop: a request's last tokens and its finish arrive together, so its stream can send
    the finish reason with those tokens (server.Completion.events)."""

    def __enter__(self):
        _PUSHES.items = []

    def __exit__(self, *exc):
        items, _PUSHES.items = _PUSHES.items, None
        by_loop: dict = {}
        for st, item in items:
            by_loop.setdefault(st.aloop, []).append((st, item))
        for aloop, pairs in by_loop.items():
            aloop.call_soon_threadsafe(_deliver, pairs)


def _deliver(pairs):
    for st, item in pairs:
        st.queue.put_nowait(item)


class LocalEvents:
    """What the engine tells a request's client and the metrics, applied in this process: to
    the Stream (its queue, its times) and to `metrics` (gpu_runner.server_metrics.ServerMetrics or
    None). An engine in another process (gpu_runner.engine_process) sends the same calls over
    a pipe and the server applies them here, in the same order."""

    def __init__(self, metrics=None):
        self.metrics = metrics

    def accepted(self, s: Stream):
        s.push(("accepted",))

    def error(self, s: Stream, message: str, status: int = 400):
        s.done = True
        s.push(("error", message, status))

    def scheduled(self, s: Stream, prompt_tokens: int, t_ms: float):
        s.scheduled_ms = t_ms
        if self.metrics is not None:
            self.metrics.scheduled(s, prompt_tokens)

    def tokens(self, s: Stream, ids: list[int], t_ms: float):
        if self.metrics is not None:
            self.metrics.tokens(s, len(ids), t_ms)
        if s.first_token_ms is None:
            s.first_token_ms = t_ms
        s.last_token_ms = t_ms
        s.push(("tokens", ids))

    def finish(self, s: Stream, reason: str, t_ms: float, detail: str | None = None):
        s.done = True
        s.push(("finish", reason, detail))
        if self.metrics is not None:
            self.metrics.finished(s, reason, t_ms)

    def step(self, running: int, waiting: int, kv_usage: float, preemptions: int, hit_tokens: int):
        if self.metrics is not None:
            self.metrics.step(running, waiting, kv_usage, preemptions, hit_tokens)

    def flush(self):
        """Events are applied as they come (an engine process sends its buffer here)."""


class ServingEngine:
    """`engine` is a gpu_runner.engine.Engine; its scheduler options must give a KV pool
    (kv_blocks or kv_memory_mb). `events` receives what the engine tells clients and metrics
    (default: LocalEvents(metrics), applied in this process); `trace_out` is rewritten
    atomically about once a second."""

    def __init__(self, engine, max_waiting: int = 256, metrics=None, trace_out: Path | None = None, events=None):
        from gpu_runner.engine import ModelExecutor
        self.engine = engine
        self.cfg = engine.scheduler_config()
        if self.cfg.kv_blocks is None:
            raise ConfigError("serve needs a KV pool size: --kv-blocks N or --kv-memory-mb M")
        self.core = EngineCore(self.cfg, None, record=engine.cfg.record or trace_out is not None,
                               stop_token_ids=engine.stop_token_ids, request_data=True)
        self.clock = loop.WallClock(0.0)
        self.core.executor = self.executor = ModelExecutor(engine, self.cfg.kv_blocks, self.cfg.block_size,
                                                           self.clock)
        self.max_waiting = max_waiting
        self.events = events if events is not None else LocalEvents(metrics)
        self.trace_out = trace_out
        self.streams: dict[int, Stream] = {}     # unanswered requests by scheduler row
        self.stats = self.core.stats()            # the engine's gauges after its last output
        self._pending: deque = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._ids = itertools.count()
        self._hits_seen = 0
        self._last_flush = time.monotonic()
        self._flush_every = FLUSH_EVERY_S
        self._flushed_step = -1
        self.thread = threading.Thread(target=self.run, name="engine", daemon=True)
        self.error: BaseException | None = None

    # ---- called from HTTP handlers ----------------------------------------------------------
    def start(self):
        self.thread.start()

    @property
    def model_info(self) -> dict:
        """What the HTTP side needs of the model: its tokenizer, name and limits."""
        e = self.engine
        return {"tokenizer": e.tok, "name": e.model_name, "max_seq_len": e.model.cfg.max_seq_len,
                "vocab_size": e.model.cfg.vocab_size}

    def alive(self) -> bool:
        return self.error is None and self.thread.is_alive()

    def failure(self) -> str | None:
        """Why the engine stopped when nobody asked it to (None: running, or stopped on request)."""
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        if self.thread.ident is not None and not self.thread.is_alive() and not self._stopping:
            return "the engine thread ended"
        return None

    def submit(self, s: Stream, arrival_ms: float | None = None) -> None:
        """Queue a request (its arrival is now, or `arrival_ms` on this engine's clock);
        raises Overloaded / ServerStopping."""
        with self._cv:
            if self._stopping:
                raise ServerStopping("the server is shutting down")
            waiting = len(self._pending) + self.stats.waiting
            if waiting >= self.max_waiting:
                raise Overloaded(f"{waiting} requests are waiting (limit {self.max_waiting})")
            s.rid = s.rid or f"req-{next(self._ids)}"
            s.arrival_ms = self.clock.now() if arrival_ms is None else arrival_ms
            self._pending.append(("add", s))
            self._cv.notify()

    def cancel(self, s: Stream, reason: str = "abort") -> None:
        """The client went away (or a stop string matched): abort it between steps."""
        with self._cv:
            if not s.done:
                self._pending.append(("abort", s, reason))
                self._cv.notify()

    def request_stop(self) -> None:
        """Admit nothing new; the step loop aborts what is unfinished at its next drain, ends
        and writes the trace."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def stop(self, timeout_s: float = 30.0) -> None:
        """request_stop, then wait for the engine thread to end."""
        self.request_stop()
        if self.thread.is_alive():
            self.thread.join(timeout_s)

    def served(self) -> dict:
        return {"requests": self.core.num_requests, "steps": self.core.num_steps}

    def load(self) -> dict:
        """Running / waiting / KV usage after the engine's last output."""
        st = self.stats
        return {"running": st.running, "waiting": st.waiting + len(self._pending), "kv_usage": st.kv_usage}

    # ---- the inbox the step loop drains (engine thread) ---------------------------------------
    def drain(self, core: EngineCore, now_ms: float) -> bool:
        with self._cv:
            items = list(self._pending)
            self._pending.clear()
            stopping = self._stopping
        for item in items:
            if item[0] == "add":
                self._add(item[1])
            else:   # the finish comes back in the next EngineOutputs
                s, reason = item[1], item[2]
                if s.index is not None and not s.done:
                    core.abort(s.index, now_ms, reason)
        if stopping:
            for s in list(self.streams.values()):
                core.abort(s.index, now_ms, "abort")
        self.events.flush()
        if stopping:
            return False
        self._maybe_flush()
        return True

    def wait(self) -> None:
        while True:
            with self._cv:
                if self._pending or self._stopping:
                    return
                self._cv.wait(FLUSH_EVERY_S)
                if self._pending or self._stopping:
                    return
            self._maybe_flush()   # outside the lock: handlers keep submitting while the trace is written

    def _add(self, s: Stream):
        r = Request(s.rid, s.arrival_ms, len(s.prompt_ids), s.max_tokens, tuple(s.prompt_ids))
        try:
            s.index = self.core.add_request(r, s.stop_ids)
        except (ConfigError, ValueError) as e:
            self.events.error(s, str(e))
            return
        self.executor.add_request(s.index, s.rid, s.sampling)
        self.streams[s.index] = s

    def on_output(self, out: EngineOutputs):
        """Answer clients from what the engine says happened: accepted, first scheduled,
        tokens, finished (with its reason) or rejected before it was accepted."""
        with one_delivery():
            self._answer(out)

    def _answer(self, out: EngineOutputs):
        ev = self.events
        if out.step is not None:
            self.engine.note_first_step(out)
        gone = {f.req for f in out.finished}
        for i in out.queued:
            s = self.streams.get(i)
            if s is not None and i not in gone:
                s.accepted = True
                ev.accepted(s)
        for i in out.started:
            s = self.streams.get(i)
            if s is not None:
                ev.scheduled(s, len(s.prompt_ids), out.step.t_ms)
        for i, ids in out.new_tokens().items():
            s = self.streams.get(i)
            if s is not None:
                ev.tokens(s, ids, out.t_ms)
                s.sent += len(ids)
        for f in out.finished:
            s = self.streams.pop(f.req, None)
            if s is None or s.done:
                continue
            if not s.accepted:   # rejected on arrival: the client gets the reason as its answer
                ev.error(s, f"rejected: {f.detail or f.reason}", 503 if f.limit == "queue_limit" else 400)
            elif f.reason == "error":   # this request failed in the engine; the others go on
                ev.error(s, f"the engine failed on this request: {f.detail or 'error'}", 500)
            else:
                ev.finish(s, f.reason, f.t_ms, f.detail)
        st = self.stats = out.stats
        bs = self.cfg.block_size
        ev.step(st.running, st.waiting + len(self._pending), st.kv_usage, st.preemptions,
                (st.prefix_hit_blocks - self._hits_seen) * bs)
        self._hits_seen = st.prefix_hit_blocks
        ev.flush()

    def run(self):
        """The engine thread (or an engine process's main thread): the step loop until stopped."""
        import torch
        try:
            with torch.inference_mode():
                loop.run(self.core, self.clock, on_output=self.on_output, inbox=self)
        except BaseException as e:  # a model error must not leave clients waiting forever
            self.error = e
            with self._cv:
                self._stopping = True
            for s in list(self.streams.values()):
                self.events.error(s, f"engine failed: {type(e).__name__}: {e}", 500)
            self.streams.clear()
            self.events.flush()
        finally:
            self._flush(final=True)

    # ---- the trace --------------------------------------------------------------------------
    def workload(self) -> Workload | None:
        return self.core.scheduler.requests.workload("served") if self.core.num_requests else None

    def trace(self):
        """The measured trace of everything served so far (unfinished requests have no finish)."""
        from gpu_runner.engine import device_name
        wl = self.workload()
        if wl is None or self.core.log is None:
            return None
        e = self.engine
        meta = self.core.trace_meta(wl, "measured", f"served by gpu_runner on {e.model_name}",
                                    e.engine_meta(), device=device_name(e.device), **e.model_meta(),
                                    notes="gpu_runner serve: arrival = when the HTTP request was accepted")
        return self.core.trace(wl, meta)

    def _maybe_flush(self):
        if self.trace_out is not None and time.monotonic() - self._last_flush >= self._flush_every:
            self._flush()

    def _flush(self, final: bool = False):
        """Rewrite trace_out atomically when something changed: readable at any moment, and a
        killed server loses at most the last interval. The interval is one second while a
        rewrite is cheap; as the trace grows it stretches so that rewriting takes at most
        FLUSH_SHARE of the engine thread (a 50 ms rewrite: every second; 200 ms: every 4 s)."""
        if self.trace_out is None or (self.core.num_steps == self._flushed_step and not final):
            return
        started = time.monotonic()
        self._last_flush = started
        tr = self.trace()
        if tr is None:
            return
        from core.cli import write_output
        try:
            write_output(self.trace_out, lambda p: save_trace(tr, p), "--trace-out")
            self._flushed_step = self.core.num_steps
            self._flush_every = max(FLUSH_EVERY_S, (time.monotonic() - started) / FLUSH_SHARE)
            if final:
                print(f"gpu_runner serve: wrote {self.trace_out} ({self.core.num_requests} requests, "
                      f"{self.core.num_steps} steps)", flush=True)
        except Exception as e:  # a full disk must not stop serving; say it once per flush
            print(f"gpu_runner serve: could not write {self.trace_out}: {e}", flush=True)
