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

Progress (a fleet's stall detection, gpu_runner.fleet): while its step loop is not waiting idle
for work, the engine process sends something at least every BEAT_S: each step's Outputs, or an
empty Outputs (a beat) from a side thread while one step or a trace rewrite runs longer. So a
process that holds requests and sends nothing for seconds is frozen (SIGSTOP, swapped out) or
its loop waits idle with work queued: `stall_s` of that silence takes it out of service
(`check_stall`), however long a legitimate step is. Messages to the engine never block their
sender: each goes into an outbox that one writer thread per engine writes to the pipe (a frozen
engine's full pipe holds up that writer only), and `stop` kills an engine that stays silent.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import deque

import msgspec

from core.errors import ConfigError
from gpu_runner.client import Backlogged, EngineClient, Overloaded
from gpu_runner.launch import ServeOptions
from gpu_runner.messages import (
    AbortRequest,
    AddRequest,
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
BEAT_S = 0.5       # while not idle, the engine process sends something at least this often
# A replica holding requests whose engine process sent nothing for this long is out of rotation
# (--replica-stall-s). Its engine process sends at least every BEAT_S while its loop is not
# waiting idle, however long a step, so this bounds silence, not steps. Measured on the 2-core VM
# (tiny model, 1 torch thread per replica): one step prefilling 32 full-context prompts takes
# 18.7 s alone; with 3 replicas each given 24 such prompts and 8 decoding streams at once, steps
# took up to 37.6 s, and the longest silence of a replica holding requests was 0.62 s (over
# ~850 messages). 5 s is 8x that silence; a frozen replica is out ~5 s after its last message.
REPLICA_STALL_S = 5.0
MAX_UNSENT_BYTES = 512 * 2**20   # requests an engine has not read yet: past this, new ones get 503


def _size(msg) -> int:
    """About the bytes a message takes on the pipe (its token ids and a KV blob's bytes; the backlog
    bound is coarse, and encoding twice to know it would copy a prompt's KV once more)."""
    if isinstance(msg, AddRequest):
        kv = msg.kv
        return 256 + 9 * len(msg.prompt_ids) + (len(kv.k) + len(kv.v) if kv is not None else 0)
    return 256
log = logging.getLogger("gpu_runner.engine_process")


class _Beat:
    """The engine process's beat: a side thread sends an empty Outputs whenever nothing was sent
    for BEAT_S while the step loop is busy (a step, a trace rewrite: anything but the idle wait
    for work), so that silence means a frozen process, never a long step."""

    def __init__(self, send):
        self._send = send
        self.idle = False
        self.last = time.monotonic()

    def sent(self):
        self.last = time.monotonic()

    def start(self):
        threading.Thread(target=self._run, name="beat", daemon=True).start()

    def _run(self):
        while True:
            time.sleep(BEAT_S / 4)
            if not self.idle and time.monotonic() - self.last >= BEAT_S:
                try:
                    self._send(Outputs([]))
                except (OSError, ValueError):    # the server is gone
                    return


def _beating_service(beat: _Beat):
    """EngineService telling `beat` when its loop waits idle for work (no beats then)."""
    from gpu_runner.serving import EngineService

    class BeatingService(EngineService):
        def wait(self):
            beat.idle = True
            try:
                super().wait()
            finally:
                beat.idle = False

        def _flush(self, final: bool = False):     # (also from the idle wait: a rewrite is work)
            was, beat.idle = beat.idle, False
            try:
                super()._flush(final)
            finally:
                beat.idle = was
    return BeatingService


def _engine_main(conn_in, conn_out, options: ServeOptions, origin_ns: int) -> None:
    """The engine process: build the engine from the server's options, report ready (EngineInfo),
    then run the step loop with messages arriving over `conn_in`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the server decides when to stop
    _die_with_parent()
    lock = threading.Lock()

    def send(msg):
        with lock:
            conn_out.send_bytes(encode(msg))
            beat.sent()
    beat = _Beat(send)
    try:
        from gpu_runner.launch import engine_service
        service = engine_service(options, send, _beating_service(beat))
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
    beat.start()
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
    """The server's side of an engine process (gpu_runner.client.EngineClient). `stall_s` (a
    fleet's replicas): `check_stall` takes the engine out of service once it has held requests
    and sent nothing for that long (None: never)."""

    def __init__(self, options: ServeOptions, metrics=None, max_waiting: int = 256, origin_ns: int | None = None,
                 label: str = "the engine process", wait: bool = True, stall_s: float | None = None):
        super().__init__(metrics, max_waiting, origin_ns)
        self.label = label           # how messages name it (a fleet: "replica 2")
        self.stall_s = stall_s
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
        # progress: when the engine last sent anything; since when it owes an answer (a request
        # sent after that); why it is out of service (check_stall), and how often it was
        self.heard = time.monotonic()
        self._owed_since: float | None = None
        self.stall: str | None = None
        self.stalls = 0
        self._stop_t: float | None = None
        # the outbox: messages to the engine, written by one thread (a frozen engine blocks only it)
        self._outbox: deque = deque()
        self._out_cv = threading.Condition()
        self._unsent = 0                 # bytes in the outbox
        self._write_error: str | None = None
        self.writer = threading.Thread(target=self._write, name="engine-writer", daemon=True)
        self.writer.start()
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
        self.heard = time.monotonic()
        return msg

    # ---- to the engine: the outbox and its writer ----------------------------------------------
    def _send(self, msg):
        """Queue `msg` for the writer (never blocks). OSError: the pipe is broken (the engine is
        gone); Backlogged (an Overloaded): the engine has not read MAX_UNSENT_BYTES of requests (a
        new one waits for nothing: refused)."""
        size = _size(msg)
        with self._out_cv:
            if self._write_error is not None:
                raise OSError(self._write_error)
            if isinstance(msg, AddRequest) and self._unsent and self._unsent + size > MAX_UNSENT_BYTES:
                raise Backlogged(f"{self.label} has not read the {self._unsent / 2**20:.0f} MiB of requests "
                                 "sent to it")
            self._outbox.append((msg, size))
            self._unsent += size
            self._out_cv.notify()

    def _expect(self):
        if self._owed_since is None:      # (under the client's lock, as the request's stream is added)
            self._owed_since = time.monotonic()

    def _write(self):
        """The writer thread: the outbox to the pipe, in order, until stopped or the pipe breaks."""
        while True:
            with self._out_cv:
                while not self._outbox:
                    self._out_cv.wait()
                item = self._outbox[0]
            if item is None:
                return
            try:
                self._to_engine.send_bytes(encode(item[0]))     # (encoded here: only declared Structs travel)
            except (OSError, ValueError) as e:     # the engine is gone (or the pipe was closed)
                with self._out_cv:
                    self._write_error = f"{self.label}: its pipe is closed ({e})"
                    self._outbox.clear()
                    self._unsent = 0
                return
            with self._out_cv:
                if self._outbox and self._outbox[0] is item:
                    self._outbox.popleft()
                    self._unsent -= item[1]

    def _close_outbox(self):
        with self._out_cv:
            self._outbox.append(None)
            self._out_cv.notify()

    def start(self):
        self.reader.start()

    # ---- state ---------------------------------------------------------------------------------
    def running(self) -> bool:
        """The engine process runs (it may be out of service for a stall)."""
        return self.error is None and self.proc.is_alive()

    def alive(self) -> bool:
        return self.stall is None and self.running()

    def failure(self) -> str | None:
        """Why the engine process stopped, or is out of service, when the server did not ask it
        to (None otherwise)."""
        if self._stopping:
            return None
        if self.error is not None or not self.proc.is_alive():
            self.proc.join(0.5)
            if self.error and "exit code None" not in self.error:
                return self.error
            return f"{self.label} ended (exit code {self.proc.exitcode})"
        return self.stall

    def quiet_s(self, now: float | None = None) -> float:
        """Seconds since the engine last sent anything, or since a request was sent to it after
        that (whichever is later): how long it has been silent while owing an answer, when it
        holds requests."""
        now = time.monotonic() if now is None else now
        since = self._owed_since
        return max(0.0, now - (self.heard if since is None else max(since, self.heard)))

    def check_stall(self) -> str | None:
        """Take the engine out of service when it holds requests and has sent nothing for
        stall_s: its requests fail with a 503 naming it and why (an AbortRequest follows each, for
        when it resumes), and it is back as soon as it sends anything. Returns why, when now."""
        if self.stall_s is None:
            return None
        with self._lock:
            if self.stall is not None or self._stopping or not self.streams or not self.running():
                return None
            quiet = self.quiet_s()
            if quiet <= self.stall_s:
                return None
            why = (f"{self.label} made no progress for {quiet:.1f} s (its engine process, pid {self.proc.pid}, "
                   f"sent nothing while holding {len(self.streams)} requests; --replica-stall-s "
                   f"{self.stall_s:g}): taken out of rotation")
            self.stall = why
            self.stalls += 1
            held = list(self.streams.values())
        log.error("%s", why)
        self.fail_all(why, 503)
        for st in held:
            try:
                self._send(AbortRequest(st.rid, "abort"))
            except (OSError, Overloaded):
                break
        return why

    def served(self) -> dict | None:
        """Requests and steps the engine served, once it has stopped."""
        return None if self.summary is None else {"requests": self.summary.requests, "steps": self.summary.steps}

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the engine to stop (its unfinished requests end "abort", its trace is written) and
        wait for it to exit: at most `timeout_s`, and with `stall_s`, no longer than it stays
        silent that long (a frozen engine); then it is killed. Never blocks on its pipe."""
        with self._lock:
            if not self._stopping:
                self._stopping = True
                self._stop_t = time.monotonic()
                try:
                    self._send(Shutdown())
                except OSError:
                    pass
        start = self._stop_t or time.monotonic()
        end = start + timeout_s
        why = None
        while self.proc.is_alive():
            self.proc.join(0.1)
            now = time.monotonic()
            if now > end:
                why = f"did not stop within {timeout_s:g} s"
            elif self.stall_s is not None and now - max(self.heard, start) > self.stall_s:
                why = f"sent nothing for {self.stall_s:g} s while stopping (frozen?)"
            if why is not None and self.proc.is_alive():
                log.warning("%s %s: killed", self.label, why)
                self.proc.kill()
                self.proc.join(5)
                break
        self._close_outbox()
        if self.reader.is_alive():
            self.reader.join(5)

    # ---- from the engine ---------------------------------------------------------------------------
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
            was_quiet = self.quiet_s()
            self.heard = time.monotonic()
            self._owed_since = None
            if self.stall is not None:
                with self._lock:
                    self.stall = None
                log.warning("%s sent again after %.1f s without progress: back in rotation", self.label, was_quiet)
            if isinstance(msg, Outputs):
                self.apply(msg)
            elif isinstance(msg, Stopped):
                self.summary = msg
        if not self._stopping and self.error is None:
            self.proc.join(1.0)       # (its exit code, when it is ending)
            self.error = f"{self.label} ended (exit code {self.proc.exitcode})"
        if not self._stopping:      # (said at once, not when the last replica is gone)
            log.error("%s: its %d open request(s) fail (503 or an error event)", self.error, len(self.streams))
        self.fail_all(self.error or "the server stopped", 503)    # nobody waits forever on a dead engine
