"""`gpu_runner serve` with the engine in its own process (the default; `--no-engine-process`
keeps it in a thread of the server).

In one process the engine thread and the HTTP event loop share the interpreter lock: every
streamed token's Python work (text, JSON, the socket write) holds up the step loop's Python
work between kernels. Measured on the tiny model, 16 streams: in-process decode steps of
~4.5 ms took ~9 ms inside the server. vLLM splits the same way (its EngineCore process and
the API server). Here:

    server process: HTTP handlers -> ProcessServingEngine.submit/cancel --pipe--> engine process
    engine process: ServingEngine step loop; after each step one message with every
                    request's events --pipe--> a reader thread in the server, which applies
                    them with serving.LocalEvents (client queues, Prometheus metrics)

Both processes read the same monotonic clock (perf_counter_ns, one origin), so arrival,
scheduling and token times mean what they mean in one process. The engine process loads
the model itself from the same flags, writes the trace (--trace-out), ignores Ctrl-C (the
server stops it: unfinished requests end "abort", the trace is written) and exits when the
server goes away (its pipe closes).
"""
from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import os
import signal
import threading
import time
from types import SimpleNamespace

from core.config import SamplingParams
from core.errors import ConfigError
from gpu_runner.launch import ServeOptions
from gpu_runner.serving import LocalEvents, Overloaded, ServerStopping, Stream, one_delivery

READY_TIMEOUT_S = 600.0


class _RemoteEvents:
    """The engine process's events: buffered, sent as one message per flush (after each of the
    engine's outputs and each drain of its inbox). The engine thread adds most of them, the
    request thread a refusal now and then: one lock for the buffer. A request's last event
    (finish, error) also forgets its stream here."""

    def __init__(self, streams: dict, conn):
        self.buf: list = []
        self.lock = threading.Lock()
        self.streams = streams
        self.conn = conn

    def flush(self):
        out = self.take()
        if out:
            self.conn.send(out)

    def _add(self, event):
        with self.lock:
            self.buf.append(event)

    def take(self) -> list:
        with self.lock:
            out, self.buf = self.buf, []
        return out

    def accepted(self, s):
        self._add(("accepted", s.rid))

    def error(self, s, message, status=400):
        s.done = True
        self.streams.pop(s.rid, None)
        self._add(("error", s.rid, message, status))

    def scheduled(self, s, prompt_tokens, t_ms):
        s.scheduled_ms = t_ms
        self._add(("scheduled", s.rid, prompt_tokens, t_ms))

    def tokens(self, s, ids, t_ms):
        self._add(("tokens", s.rid, list(ids), t_ms))

    def finish(self, s, reason, t_ms, detail=None):
        s.done = True
        self.streams.pop(s.rid, None)
        self._add(("finish", s.rid, reason, t_ms, detail))

    def step(self, running, waiting, kv_usage, preemptions, hit_tokens):
        self._add(("step", None, running, waiting, kv_usage, preemptions, hit_tokens))


def _engine_main(conn_in, conn_out, options: ServeOptions, origin_ns: int) -> None:
    """The engine process: build the engine from the server's options, report ready, then run
    the step loop with requests arriving over `conn_in`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the server decides when to stop
    _die_with_parent()
    streams: dict[str, Stream] = {}     # unfinished requests by id
    events = _RemoteEvents(streams, conn_out)
    try:
        from gpu_runner.launch import serving_engine
        se = serving_engine(options, max_waiting=10**9, events=events)
    except BaseException as e:   # a bad flag or checkpoint: the server reports it and exits
        conn_out.send(("fatal", f"{type(e).__name__}: {e}" if not isinstance(e, ConfigError) else str(e)))
        return
    se.clock.origin_ns = origin_ns
    # SIGTERM to the whole process group (a supervisor, a benchmark's cleanup): stop as the
    # server would, so unfinished requests end "abort" and the trace is written
    signal.signal(signal.SIGTERM, lambda *_: se.request_stop())
    e = se.engine

    def receive():
        while True:
            try:
                msg = conn_in.recv()
            except (EOFError, OSError):   # the server is gone
                msg = ("stop",)
            if msg[0] == "add":
                _, rid, ids, max_tokens, sp, stop_ids, arrival_ms = msg
                s = Stream(rid, ids, max_tokens, SamplingParams(**sp), stop_ids, None)
                streams[rid] = s
                try:
                    se.submit(s, arrival_ms)
                except (Overloaded, ServerStopping) as err:
                    events.error(s, str(err), 503)
                    events.flush()
            elif msg[0] == "abort":
                s = streams.get(msg[1])
                if s is not None:
                    se.cancel(s, msg[2])
            else:
                se.request_stop()          # the loop ends at its next drain
                return

    conn_out.send(("ready", {"cfg": {k: getattr(se.cfg, k) for k in ("policy", "kv_blocks", "block_size", "max_seqs")},
                             "stop_token_ids": e.stop_token_ids, "draft": e.draft is not None,
                             "sampling": dataclasses.asdict(e.cfg.sampling), "model_info": se.model_info}))
    threading.Thread(target=receive, name="requests", daemon=True).start()
    se.run()          # until stopped; writes the trace
    events.flush()
    conn_out.send(("stopped", se.served()))


def _die_with_parent():
    """The engine process ends with the server, however the server ends (SIGKILL, SIGTERM to its
    pid alone while it was still loading): the kernel sends SIGTERM when the parent dies (Linux);
    elsewhere a watcher thread notices the parent is gone."""
    parent = os.getppid()
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:   # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class ProcessServingEngine:
    """The server's side of an engine process: what server.App needs of a ServingEngine
    (submit, cancel, stop, load, alive, engine.stop_token_ids / draft / cfg.sampling)."""

    def __init__(self, options: ServeOptions, metrics=None, max_waiting: int = 256):
        ctx = multiprocessing.get_context("spawn")    # a fresh interpreter: no threads or locks inherited
        child_in, self._to_engine = ctx.Pipe(duplex=False)          # (receiving end, sending end)
        self._from_engine, child_out_w = ctx.Pipe(duplex=False)
        self.origin_ns = time.perf_counter_ns()
        self.proc = ctx.Process(target=_engine_main, args=(child_in, child_out_w, options, self.origin_ns),
                                name="gpu_runner-engine", daemon=True)
        self.proc.start()
        child_in.close()
        child_out_w.close()
        self.events = LocalEvents(metrics)
        self.max_waiting = max_waiting
        self.streams: dict[str, Stream] = {}
        self._unscheduled: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._stopping = False
        self.error: str | None = None
        self.summary: dict | None = None
        self._load = {"running": 0, "waiting": 0, "kv_usage": 0.0}
        info = self._wait_ready()
        self.model_info = info["model_info"]
        self.cfg = SimpleNamespace(**info["cfg"])
        self.engine = SimpleNamespace(stop_token_ids=tuple(info["stop_token_ids"]),
                                      draft=True if info["draft"] else None,
                                      cfg=SimpleNamespace(sampling=SamplingParams(**info["sampling"])))
        self.reader = threading.Thread(target=self._read, name="engine-events", daemon=True)

    def _wait_ready(self) -> dict:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._from_engine.poll(0.2):
            if not self.proc.is_alive():
                raise ConfigError(f"the engine process exited during startup (exit code {self.proc.exitcode})")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise ConfigError(f"the engine process was not ready after {READY_TIMEOUT_S:g} s")
        kind, info = self._from_engine.recv()
        if kind == "fatal":
            self.proc.join(10)
            raise ConfigError(info)
        return info

    # ---- as ServingEngine ---------------------------------------------------------------------
    def start(self):
        self.reader.start()

    def alive(self) -> bool:
        return self.error is None and self.proc.is_alive()

    def failure(self) -> str | None:
        """Why the engine process stopped when the server did not ask it to (None otherwise)."""
        if self._stopping:
            return None
        if self.error is not None or not self.proc.is_alive():
            self.proc.join(0.5)
            code = self.proc.exitcode
            return self.error if self.error and "exit code None" not in self.error else \
                f"the engine process ended (exit code {code})"
        return None

    def submit(self, s: Stream) -> None:
        with self._lock:
            if self._stopping:
                raise ServerStopping("the server is shutting down")
            if not self.alive():
                raise ServerStopping(self.error or "the engine process is not running")
            if len(self._unscheduled) >= self.max_waiting:
                raise Overloaded(f"{len(self._unscheduled)} requests are waiting (limit {self.max_waiting})")
            s.rid = s.rid or f"req-{next(self._ids)}"
            s.arrival_ms = (time.perf_counter_ns() - self.origin_ns) / 1e6
            self.streams[s.rid] = s
            self._unscheduled.add(s.rid)
            try:
                self._to_engine.send(("add", s.rid, list(s.prompt_ids), s.max_tokens,
                                      dataclasses.asdict(s.sampling), s.stop_ids, s.arrival_ms))
            except OSError:    # the engine process died between the check and the send
                self.streams.pop(s.rid, None)
                self._unscheduled.discard(s.rid)
                raise ServerStopping("the engine process is not running") from None

    def cancel(self, s: Stream, reason: str = "abort") -> None:
        with self._lock:
            if not s.done and not self._stopping:
                try:
                    self._to_engine.send(("abort", s.rid, reason))
                except OSError:
                    pass       # a dead engine: the reader has failed or will fail every stream

    def load(self) -> dict:
        return dict(self._load)

    def served(self) -> dict | None:
        """Requests and steps the engine served, once it has stopped."""
        return self.summary

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            if not self._stopping:
                self._stopping = True
                try:
                    self._to_engine.send(("stop",))
                except OSError:
                    pass
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
        if self.reader.is_alive():
            self.reader.join(5)

    # ---- events from the engine (reader thread) -------------------------------------------------
    def _apply(self, msg):
        ev = self.events
        for kind, rid, *args in msg:
            if kind == "step":
                ev.step(*args)
                self._load = {"running": args[0], "waiting": args[1], "kv_usage": args[2]}
                continue
            s = self.streams.get(rid)
            if s is None:
                continue
            if kind in ("scheduled", "error", "finish"):
                self._unscheduled.discard(rid)
            if kind in ("error", "finish"):
                self.streams.pop(rid, None)
            getattr(ev, kind)(s, *args)

    def _read(self):
        ev = self.events
        while True:
            try:
                msg = self._from_engine.recv()
            except (EOFError, OSError):
                break
            if isinstance(msg, tuple):          # ("stopped", summary)
                self.summary = msg[1]
                continue
            with one_delivery():                # one message: one engine output (or a few)
                self._apply(msg)
        if not self._stopping and self.error is None:
            self.error = f"the engine process ended (exit code {self.proc.exitcode})"
        for s in list(self.streams.values()):     # nobody waits forever on a dead engine
            ev.error(s, self.error or "the server stopped", 503)
        self.streams.clear()
