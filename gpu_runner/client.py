"""The server's side of its engine: one interface (`EngineClient`) that the engine in a thread of
the server (`InProcessClient`) and the engine in its own process (gpu_runner.engine_process.
ProcessClient) both implement, so the HTTP layer never knows which it has.

    handler -> client.submit(stream) -> AddRequest ----------> engine (EngineService)
    handler <- stream.queue <- client.apply(Outputs) <-------- engine: one Outputs per engine output

Messages are gpu_runner.messages Structs both ways (passed as they are to a thread, msgpack
over a pipe to a process). The client keeps each unanswered request's Stream, the one
waiting-queue limit (`max_waiting`: requests submitted that the engine has not yet begun to
run; more are refused with 503), the engine's last gauges, and the Prometheus metrics.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from core.config import SamplingParams
from gpu_runner.messages import (
    AbortRequest,
    Accepted,
    AddRequest,
    EngineInfo,
    Failed,
    Outputs,
    RequestOutput,
    Scheduled,
    StepStats,
)


class Overloaded(Exception):
    """The waiting queue is full (HTTP 503 with Retry-After)."""


class Backlogged(Overloaded):
    """The engine has not read what was sent to it (an engine process's pipe backlog, another limit
    than the waiting queue's): a 503 as a full queue is."""


class ServerStopping(Exception):
    """The server is shutting down, or its engine is gone, and admits nothing new (HTTP 503)."""


@dataclass(eq=False)
class Stream:
    """One client request as the server keeps it; what the engine tells it arrives on `queue` (on
    the client's event loop): Accepted, RequestOutput (text and ids; the last one with the finish
    reason) or Failed."""
    rid: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_ids: tuple[int, ...] | None           # None: the model's EOS; () ignores it
    aloop: asyncio.AbstractEventLoop | None
    stop: list[str] = field(default_factory=list)   # stop strings
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival_ms: float = 0.0
    first_token_ms: float | None = None
    last_token_ms: float | None = None
    scheduled_ms: float | None = None
    done: bool = False

    def push(self, item):
        batch = getattr(_PUSHES, "items", None)
        if batch is not None:        # inside one_delivery(): delivered together at its end
            batch.append((self, item))
        elif self.aloop is not None:
            _soon(self.aloop, self.queue.put_nowait, item)


_PUSHES = threading.local()


class one_delivery:
    """What one engine output tells the clients reaches their queues in one callback of each event
    loop (a request's last text and its finish arrive together)."""

    def __enter__(self):
        _PUSHES.items = []

    def __exit__(self, *exc):
        items, _PUSHES.items = _PUSHES.items, None
        by_loop: dict = {}
        for st, item in items:
            if st.aloop is not None:
                by_loop.setdefault(st.aloop, []).append((st, item))
        for aloop, pairs in by_loop.items():
            _soon(aloop, _deliver, pairs)


def _soon(aloop, fn, arg):
    """fn(arg) on the client's event loop; nothing when that loop has closed (the server has
    stopped: nobody is waiting)."""
    try:
        aloop.call_soon_threadsafe(fn, arg)
    except RuntimeError:
        pass


def _deliver(pairs):
    for st, item in pairs:
        st.queue.put_nowait(item)


class EngineClient(ABC):
    """What the HTTP server needs of an engine, wherever it runs: `info` (EngineInfo), `submit`,
    `cancel`, `start`, `stop`, `alive`, `failure`, `load`, `served`. Subclasses send messages
    (`_send`) and hand every Outputs the engine sends to `apply`."""

    info: EngineInfo

    def __init__(self, metrics=None, max_waiting: int = 256, origin_ns: int | None = None):
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.streams: dict[str, Stream] = {}     # unanswered requests by id
        self._unscheduled: set[str] = set()       # submitted, not yet begun: the waiting-queue limit counts these
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._stopping = False
        # the engine's clock: one origin for both sides (a fleet: the front end's, for every replica)
        self.origin_ns = time.perf_counter_ns() if origin_ns is None else origin_ns
        self._stats = StepStats(0, 0, 0.0, 0, 0)

    # ---- the transport (subclasses) -----------------------------------------------------------
    @abstractmethod
    def _send(self, msg) -> None:
        """Deliver one message to the engine without blocking on it (OSError: it is gone;
        Overloaded: it has not taken what was sent to it)."""

    @abstractmethod
    def alive(self) -> bool:
        """The engine is running."""

    @abstractmethod
    def failure(self) -> str | None:
        """Why the engine stopped when the server did not ask it to (None: running, or stopped
        on request)."""

    @abstractmethod
    def start(self) -> None:
        """Start taking the engine's outputs (and the engine, in a thread)."""

    @abstractmethod
    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the engine: unfinished requests end, the trace is written."""

    @abstractmethod
    def served(self) -> dict | None:
        """Requests and steps the engine served (None while unknown)."""

    # ---- requests (HTTP handlers) -------------------------------------------------------------
    def now_ms(self) -> float:
        return (time.perf_counter_ns() - self.origin_ns) / 1e6

    def submit(self, s: Stream, kv=None, kv_out: bool = False) -> None:
        """Send a request to the engine (its arrival is now, or, with `kv`, the client's arrival it
        keeps); raises Overloaded / ServerStopping. `kv` (gpu_runner.messages.KVBlob): its prompt's
        KV computed elsewhere; `kv_out`: the engine sends its prompt's KV when it finishes."""
        with self._lock:
            if self._stopping:
                raise ServerStopping("the server is shutting down")
            if not self.alive():
                raise ServerStopping(self.failure() or "the engine is not running")
            if len(self._unscheduled) >= self.max_waiting:
                raise Overloaded(f"{len(self._unscheduled)} requests are waiting (limit {self.max_waiting})")
            s.rid = s.rid or f"req-{next(self._ids)}"
            if kv is None:
                s.arrival_ms = self.now_ms()
            self.streams[s.rid] = s
            self._unscheduled.add(s.rid)
            self._expect()
        msg = AddRequest(s.rid, list(s.prompt_ids), s.max_tokens, s.sampling,
                         None if s.stop_ids is None else list(s.stop_ids), list(s.stop),
                         self.now_ms() if kv is not None else s.arrival_ms, kv, kv_out)
        try:   # outside the lock: a large message (a prompt's KV) must not hold up the engine's outputs
            self._send(msg)
        except (OSError, Overloaded) as e:    # the engine process died between the check and the send,
            with self._lock:                  # or has not read what was sent to it
                self.streams.pop(s.rid, None)
                self._unscheduled.discard(s.rid)
            if isinstance(e, Overloaded):
                raise
            raise ServerStopping("the engine process is not running") from None

    def _expect(self) -> None:
        """A request was just added (under the lock): the engine owes an answer from now (an
        engine process's stall detection counts from here)."""
        return None

    def cancel(self, s: Stream, reason: str = "abort") -> None:
        """The client went away: abort its request (the engine answers with its finish)."""
        with self._lock:
            if s.done or self._stopping:
                return
            try:
                self._send(AbortRequest(s.rid, reason))
            except OSError:
                pass       # a dead engine: every stream is failed by whoever noticed

    def load(self) -> dict:
        """Running / waiting / KV usage after the engine's last output."""
        st = self._stats
        return {"running": st.running, "waiting": st.waiting, "kv_usage": st.kv_usage}

    # ---- what the engine says (its thread, or the reader of its pipe) ----------------------------
    def apply(self, msg: Outputs):
        """One engine output: every event to its stream (delivered together) and to the metrics."""
        with one_delivery(), self._lock:
            for ev in msg.events:
                s = self.streams.get(ev.rid)
                if s is not None:
                    self._event(s, ev)
            if msg.stats is not None:
                st = self._stats = msg.stats
                if self.metrics is not None:
                    self.metrics.step(st.running, st.waiting, st.kv_usage, st.preemptions, st.hit_tokens, st.tier)

    def _event(self, s: Stream, ev):
        m = self.metrics
        if isinstance(ev, Accepted):
            s.push(ev)
        elif isinstance(ev, Scheduled):
            self._unscheduled.discard(s.rid)
            s.scheduled_ms = ev.t_ms
            if m is not None:
                m.scheduled(s, ev.prompt_tokens)
        elif isinstance(ev, RequestOutput):
            if ev.token_ids:
                if m is not None:
                    m.tokens(s, len(ev.token_ids), ev.t_ms)
                if s.first_token_ms is None:
                    s.first_token_ms = ev.t_ms
                s.last_token_ms = ev.t_ms
            if ev.finish_reason is not None:
                self._end(s)
                if m is not None:
                    m.finished(s, ev.finish_reason, ev.t_ms)
            s.push(ev)
        elif isinstance(ev, Failed):
            self._end(s)
            s.push(ev)
        else:                      # KVReady, KVLoaded: a fleet's disaggregated handoff (its stream takes them)
            s.push(ev)

    def _end(self, s: Stream):
        s.done = True
        self.streams.pop(s.rid, None)
        self._unscheduled.discard(s.rid)

    def fail_all(self, message: str, status: int = 503, cut: bool = False):
        """Nobody waits forever on a dead engine: every open stream ends with `message` (`cut`: a
        fleet's replica, whose streams a router cuts rather than ends)."""
        with one_delivery(), self._lock:
            for s in list(self.streams.values()):
                self._end(s)
                s.push(Failed(s.rid, message, status, cut))


class InProcessClient(EngineClient):
    """The engine in a thread of the server (`serve --no-engine-process`, and tests that look
    inside it: `service` is the gpu_runner.serving.EngineService)."""

    def __init__(self, engine, metrics=None, max_waiting: int = 256, trace_out=None):
        from gpu_runner.serving import EngineService
        super().__init__(metrics, max_waiting)
        self.service = EngineService(engine, self.apply, trace_out=trace_out)
        self.service.clock.origin_ns = self.origin_ns
        self.info = self.service.info

    def _send(self, msg):
        self.service.put(msg)

    def start(self):
        self.service.start()

    def alive(self) -> bool:
        return self.service.alive()

    def failure(self) -> str | None:
        return self.service.failure()

    def stop(self, timeout_s: float = 30.0):
        with self._lock:
            self._stopping = True
        self.service.stop(timeout_s)
        why = self.service.failure()
        if self.streams:
            self.fail_all(f"engine failed: {why}" if why else "the server stopped", 500 if why else 503)

    def served(self) -> dict:
        return self.service.served()
