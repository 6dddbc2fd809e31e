"""`gpu_runner serve` with the engine in its own process (the default; `--no-engine-process`
keeps it in a thread of the server: gpu_runner.client.InProcessClient).

In one process the engine thread and the HTTP event loop share the interpreter lock: every
streamed token's Python work (text, JSON, the socket write) holds up the step loop's Python
work between kernels. Measured on the tiny model, 16 streams: in-process decode steps of
~4.5 ms took ~9 ms inside the server. vLLM splits the same way (its EngineCore process and
the API server). Here:

    server process: HTTP handlers -> ProcessClient.submit/cancel --AddRequest/AbortRequest--> engine process
    engine process: EngineService step loop; after each step one Outputs message (every
                    request's events, detokenised, and the gauges) --> a reader thread in the
                    server, which applies it (EngineClient.apply: client queues, Prometheus metrics)

Every message is a gpu_runner.messages Struct, msgpack-encoded over a pipe (send_bytes /
recv_bytes: nothing is pickled). Both processes read the same monotonic clock (perf_counter_ns,
one origin), so arrival, scheduling and token times mean what they mean in one process. The
engine process loads the model itself from the same flags, writes the trace (--trace-out),
ignores Ctrl-C (the server stops it: unfinished requests end "abort", the trace is written)
and exits when the server goes away (its pipe closes).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import msgspec

from core.errors import ConfigError
from gpu_runner.client import EngineClient
from gpu_runner.launch import ServeOptions
from gpu_runner.messages import (
    EngineInfo,
    Fatal,
    Outputs,
    Shutdown,
    Stopped,
    decode_from_engine,
    decode_to_engine,
    encode,
)

READY_TIMEOUT_S = 600.0


def _engine_main(conn_in, conn_out, options: ServeOptions, origin_ns: int) -> None:
    """The engine process: build the engine from the server's options, report ready (EngineInfo),
    then run the step loop with messages arriving over `conn_in`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the server decides when to stop
    _die_with_parent()
    lock = threading.Lock()

    def send(msg):
        with lock:
            conn_out.send_bytes(encode(msg))
    try:
        from gpu_runner.launch import engine_service
        service = engine_service(options, send)
    except BaseException as e:   # a bad flag or checkpoint: the server reports it and exits
        send(Fatal(f"{type(e).__name__}: {e}" if not isinstance(e, ConfigError) else str(e)))
        return
    service.clock.origin_ns = origin_ns
    # SIGTERM to the whole process group (a supervisor, a benchmark's cleanup): stop as the
    # server would, so unfinished requests end "abort" and the trace is written
    signal.signal(signal.SIGTERM, lambda *_: service.request_stop())

    def receive():
        while True:
            try:
                msg = decode_to_engine(conn_in.recv_bytes())
            except (EOFError, OSError):   # the server is gone
                msg = Shutdown()
            if isinstance(msg, Shutdown):
                service.request_stop()          # the loop ends at its next drain
                return
            service.put(msg)

    send(service.info)
    threading.Thread(target=receive, name="requests", daemon=True).start()
    service.run()          # until stopped; writes the trace
    send(Stopped(**service.served()))


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


class ProcessClient(EngineClient):
    """The server's side of an engine process (gpu_runner.client.EngineClient)."""

    def __init__(self, options: ServeOptions, metrics=None, max_waiting: int = 256, origin_ns: int | None = None,
                 label: str = "the engine process", wait: bool = True):
        super().__init__(metrics, max_waiting, origin_ns)
        self.label = label           # how messages name it (a fleet: "replica 2")
        self._send_lock = threading.Lock()
        ctx = multiprocessing.get_context("spawn")    # a fresh interpreter: no threads or locks inherited
        child_in, self._to_engine = ctx.Pipe(duplex=False)          # (receiving end, sending end)
        self._from_engine, child_out_w = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_engine_main, args=(child_in, child_out_w, options, self.origin_ns),
                                name="gpu_runner-engine", daemon=True)
        self.proc.start()
        child_in.close()
        child_out_w.close()
        self.error: str | None = None
        self.summary: Stopped | None = None
        self.reader = threading.Thread(target=self._read, name="engine-events", daemon=True)
        if wait:    # (else the caller calls wait_ready: several engines load at once. The process must be
            #         started from a thread that lives as long as it: the kernel's parent-death signal
            #         follows the thread that forked it)
            self.wait_ready()

    def wait_ready(self):
        self.info = self._wait_ready()

    def _wait_ready(self) -> EngineInfo:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._from_engine.poll(0.2):
            if not self.proc.is_alive():
                raise ConfigError(f"{self.label} exited during startup (exit code {self.proc.exitcode})")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise ConfigError(f"{self.label} was not ready after {READY_TIMEOUT_S:g} s")
        msg = decode_from_engine(self._from_engine.recv_bytes())
        if isinstance(msg, Fatal):
            self.proc.join(10)
            raise ConfigError(msg.message)
        if not isinstance(msg, EngineInfo):
            self.proc.kill()
            raise ConfigError(f"{self.label} sent {type(msg).__name__} before it was ready")
        return msg

    def _send(self, msg):
        with self._send_lock:      # one writer at a time on the pipe
            self._to_engine.send_bytes(encode(msg))

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
            if self.error and "exit code None" not in self.error:
                return self.error
            return f"{self.label} ended (exit code {self.proc.exitcode})"
        return None

    def served(self) -> dict | None:
        """Requests and steps the engine served, once it has stopped."""
        return None if self.summary is None else {"requests": self.summary.requests, "steps": self.summary.steps}

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            if not self._stopping:
                self._stopping = True
                try:
                    self._send(Shutdown())
                except OSError:
                    pass
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
        if self.reader.is_alive():
            self.reader.join(5)

    def _read(self):
        """The reader thread: every message from the engine, applied in order."""
        while True:
            try:
                msg = decode_from_engine(self._from_engine.recv_bytes())
            except (EOFError, OSError):
                break
            except msgspec.MsgspecError as e:     # never from our own engine; if it happens, say so
                self.error = f"{self.label} sent a message that does not decode ({e})"
                break
            if isinstance(msg, Outputs):
                self.apply(msg)
            elif isinstance(msg, Stopped):
                self.summary = msg
        if not self._stopping and self.error is None:
            self.proc.join(1.0)       # (its exit code, when it is ending)
            self.error = f"{self.label} ended (exit code {self.proc.exitcode})"
        self.fail_all(self.error or "the server stopped", 503)    # nobody waits forever on a dead engine
