"""The engine behind `python -m gpu_runner serve`: an engine core stepped in one thread, fed by
messages (gpu_runner.messages) through an inbox, answering through one sink.

    client --put(AddRequest | AbortRequest)--> inbox --(between steps)--> EngineCore.add_request / abort
    engine thread: core.engine.loop.run(EngineCore(ModelExecutor), WallClock, inbox=self,
                                        on_output=...)
    each EngineOutputs --OutputProcessor--> one Outputs message --emit--> the client
                                            (gpu_runner.client: in this process, or over a pipe)

The engine thread never blocks on a client; clients never touch the engine core. Detokenising
and stop strings happen here (gpu_runner.output_processor): a stop string ends its request in
the engine at once. Every request is answered: one the engine refuses at once (it could never
fit the KV pool or the token budget) with Failed 400; one rejected on arrival (max_model_len:
400) or by the queue limit (503) with Failed naming the rule; the rest with a RequestOutput
carrying its finish reason. Stop: every unfinished request is aborted, the thread ends, and
the trace (if recorded) is written; a crash fails every unfinished request with its reason.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path

from core.engine import loop
from core.engine.core import EngineCore
from core.engine.outputs import EngineOutputs
from core.errors import ConfigError
from core.trace import save_trace
from core.workload import Request, Workload
from gpu_runner.messages import (
    AbortRequest,
    AddRequest,
    EngineInfo,
    Failed,
    KVBlob,
    KVLoaded,
    KVReady,
    Outputs,
    StepStats,
    TokenizerSpec,
)
from gpu_runner.output_processor import OutputProcessor

FLUSH_EVERY_S = 1.0
FLUSH_SHARE = 0.05   # a flush rebuilds the whole trace: at most this share of the engine thread's time
# A flush stalls every request in flight for as long as it takes (hundreds of ms once a trace holds
# a few hundred requests on a slow CPU): while any is in flight, the trace is rewritten at most
# this often (what a crash under continuous load could lose); otherwise as soon as it goes idle.
BUSY_FLUSH_EVERY_S = 30.0


def flush_due(since_s: float, every_s: float, busy: bool, busy_for_s: float = float("inf")) -> bool:
    """Whether the trace is due for a rewrite, `since_s` after the last one: every `every_s`
    while idle, every max(every_s, BUSY_FLUSH_EVERY_S) while requests are in flight, and then not
    before they have been in flight that long (`busy_for_s`): a rewrite due since an idle spell
    would otherwise stall the burst that just ended it (measured through `vllm bench serve`: the
    first step of a run, then 150-190 ms of the engine rewriting its trace; docs/benchmarks.md)."""
    if not busy:
        return since_s >= every_s
    every = max(every_s, BUSY_FLUSH_EVERY_S)
    return since_s >= every and busy_for_s >= every


def tokenizer_spec(tok) -> TokenizerSpec:
    if tok is None:
        return TokenizerSpec("none")
    path = getattr(tok, "path", None)
    if path is not None:
        eos = tok.eos_id
        return TokenizerSpec("hf", str(path), list(eos) if isinstance(eos, tuple) else eos)
    return TokenizerSpec("byte")


class EngineService:
    """`engine` is a gpu_runner.engine.Engine; its scheduler options must give a KV pool
    (kv_blocks or kv_memory_mb). `emit(Outputs)` receives what the engine tells its clients
    (called from the engine thread); `trace_out` is rewritten atomically about once a second."""

    def __init__(self, engine, emit, trace_out: Path | None = None, publish_cache: bool = False):
        from gpu_runner.engine import ModelExecutor
        self.engine = engine
        self.cfg = engine.scheduler_config()
        if self.cfg.kv_blocks is None:
            raise ConfigError("serve needs a KV pool size: --kv-blocks N or --kv-memory-mb M")
        self.core = EngineCore(self.cfg, None, record=engine.cfg.record or trace_out is not None,
                               stop_token_ids=engine.stop_token_ids, request_data=True, cache_news=publish_cache)
        self.clock = loop.WallClock(0.0)
        self.core.executor = self.executor = ModelExecutor(engine, self.cfg.kv_blocks, self.cfg.block_size,
                                                           self.clock)
        self.emit = emit
        tok = engine.tok
        self.outputs = OutputProcessor(tok.decode if tok is not None else lambda ids: " ".join(map(str, ids)))
        self.rows: dict[str, int] = {}             # request id -> engine row, while unfinished
        self.trace_out = trace_out
        self._pending: deque = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._hits_seen = 0
        self._last_flush = time.monotonic()
        self._busy_since: float | None = None      # (when requests last came to be in flight)
        self._flush_every = FLUSH_EVERY_S
        self._flushed_step = -1
        self.thread = threading.Thread(target=self.run, name="engine", daemon=True)
        self.error: BaseException | None = None
        # disaggregated prefill/decode (a fleet's replicas): prompts whose KV leaves when their
        # prefill finishes (row -> prompt tokens), and when each arriving KV reached this process
        self.kv_out: dict[int, int] = {}
        self.kv_recv: dict[str, float] = {}
        kv = self.core.scheduler.kv
        self.executor.hit_blocks = lambda i: len(kv.chain.get(i, ()))

    @property
    def info(self) -> EngineInfo:
        e, c = self.engine, self.cfg
        return EngineInfo(e.model_name, e.model.cfg.max_seq_len, e.model.cfg.vocab_size, tokenizer_spec(e.tok),
                          list(e.stop_token_ids), e.draft is not None, e.cfg.sampling, c.policy, c.kv_blocks,
                          c.block_size, c.max_seqs)

    # ---- control (any thread) ---------------------------------------------------------------------
    def start(self):
        self.thread.start()

    def put(self, msg: AddRequest | AbortRequest):
        """A message for the engine: applied between steps."""
        if isinstance(msg, AddRequest) and msg.kv is not None:
            self.kv_recv[msg.rid] = self.clock.now()     # the KV is in this process now
        with self._cv:
            self._pending.append(msg)
            self._cv.notify()

    def alive(self) -> bool:
        return self.error is None and self.thread.is_alive()

    def failure(self) -> str | None:
        """Why the engine stopped when nobody asked it to (None: running, or stopped on request)."""
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        if self.thread.ident is not None and not self.thread.is_alive() and not self._stopping:
            return "the engine thread ended"
        return None

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

    # ---- the inbox the step loop drains (engine thread) ---------------------------------------
    def drain(self, core: EngineCore, now_ms: float) -> bool:
        with self._cv:
            items = list(self._pending)
            self._pending.clear()
            stopping = self._stopping
        refused = []
        for msg in items:
            if isinstance(msg, AddRequest):
                why = self._add(msg)
                if why is not None:
                    refused.append(Failed(msg.rid, why, 400))
            else:   # the finish comes back in the next EngineOutputs
                i = self.rows.get(msg.rid)
                if i is not None:
                    core.abort(i, now_ms, msg.reason)
        if stopping:
            for i in self.outputs.unfinished():
                core.abort(i, now_ms, "abort")
        if refused:
            self.emit(Outputs(refused))
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
            self._maybe_flush()   # outside the lock: clients keep sending while the trace is written

    def _add(self, m: AddRequest) -> str | None:
        r = Request(m.rid, m.arrival_ms, len(m.prompt_ids), m.max_tokens, tuple(m.prompt_ids))
        kv = None
        if m.kv is not None:
            try:
                kv = self._kv_tensors(m.kv, len(m.prompt_ids))
            except ValueError as e:
                return f"the request's KV cache does not fit this engine: {e}"
        try:
            i = self.core.add_request(r, None if m.stop_token_ids is None else tuple(m.stop_token_ids),
                                      preloaded=kv[0].shape[1] if kv is not None else 0)
        except (ConfigError, ValueError) as e:
            return str(e)
        self.executor.add_request(i, m.rid, m.sampling)
        if kv is not None:
            self.executor.import_kv(i, kv[0], kv[1], self.kv_recv.pop(m.rid, self.clock.now()))
        if m.kv_out:
            self.kv_out[i] = len(m.prompt_ids)
        self.outputs.add(i, m)
        self.rows[m.rid] = i
        return None

    def _kv_tensors(self, blob: KVBlob, prompt: int):
        """The KV a prefill engine sent, as tensors of this engine's cache layout (ValueError when
        it cannot be: another model's shape, a dtype it does not know, too few bytes)."""
        import numpy as np
        import torch
        c = self.executor.cache.k
        want = [c.shape[0], blob.tokens, c.shape[3], c.shape[4]]
        if list(blob.shape) != want or not 0 < blob.tokens < prompt + 1:
            raise ValueError(f"shape {blob.shape}, expected {want} with 1..{prompt} tokens")
        dt = {"float32": np.float32, "float64": np.float64, "float16": np.float16}.get(blob.dtype)
        if dt is None and blob.dtype != "bfloat16":
            raise ValueError(f"dtype {blob.dtype!r}")
        n = int(np.prod(want))

        def tensor(raw: bytes):
            if dt is None:     # bfloat16: no numpy type; its bits as int16
                a = np.frombuffer(raw, dtype=np.int16, count=n)
                return torch.from_numpy(a.copy()).view(torch.bfloat16).reshape(want)
            if len(raw) != n * np.dtype(dt).itemsize:
                raise ValueError(f"{len(raw)} bytes, expected {n * np.dtype(dt).itemsize}")
            return torch.from_numpy(np.frombuffer(raw, dtype=dt).copy()).reshape(want)
        return tensor(blob.k), tensor(blob.v)

    def _kv_events(self, out: EngineOutputs) -> list:
        """KVReady for each prompt whose prefill finished here and must leave (read before the
        next step reuses its blocks); KVLoaded for each arrived KV written at this step."""
        import torch
        events = []
        for f in out.finished:
            n = self.kv_out.pop(f.req, None)
            if n is None or f.reason != "length":
                continue
            rid = self.outputs.rid_of(f.req)
            t0 = self.clock.now()
            k, v = self.executor.export_kv(f.req, n)
            dtype = str(k.dtype).removeprefix("torch.")
            if dtype == "bfloat16":    # numpy has no bfloat16: its bits as int16
                k, v = k.view(torch.int16), v.view(torch.int16)
            raw = (k.contiguous().numpy().tobytes(), v.contiguous().numpy().tobytes())
            events.append(KVReady(rid, KVBlob(n, dtype, list(k.shape), raw[0], raw[1], t0, self.clock.now())))
        ex = self.executor
        if ex.loaded:
            for i, t_recv, t_written, nbytes in ex.loaded:
                events.append(KVLoaded(ex.ids.get(i) or self.outputs.rid_of(i), t_recv, t_written, nbytes))
            ex.loaded.clear()
        return events

    def on_output(self, out: EngineOutputs):
        """Tell clients what the engine says happened: accepted, first scheduled, text and
        tokens, finished (with its reason) or failed; a stop string ends its request here."""
        if out.step is not None:
            self.engine.note_first_step(out)
        kv_events = self._kv_events(out) if (self.kv_out or self.executor.loaded) else []
        for f in out.finished:
            self.rows.pop(self.outputs.rid_of(f.req), None)
        events, stopped = self.outputs.process(out)
        events = kv_events + events    # (a prefill's KV before its finish: the stream is still open)
        for i in stopped:
            self.core.abort(i, out.t_ms, "stop")
        st = out.stats
        with self._cv:
            pending = len(self._pending)
        hits = (st.prefix_hit_blocks - self._hits_seen) * self.cfg.block_size
        self._hits_seen = st.prefix_hit_blocks
        news = [(sign, h) for sign, h, _ in out.cache_news]    # (a fleet router's precise prefix knowledge)
        tier = self.core.scheduler.tier
        self.emit(Outputs(events, StepStats(st.running, st.waiting + pending, st.kv_usage, st.preemptions, hits,
                                            st.kv_used_blocks, news, tier.metrics() if tier is not None else None)))

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
            why = f"engine failed: {type(e).__name__}: {e}"
            with self._cv:     # (requests still in the inbox were never added: answered too)
                waiting = [m.rid for m in self._pending if isinstance(m, AddRequest)]
                self._pending.clear()
            self.emit(Outputs([Failed(rid, why, 500) for i in self.outputs.unfinished()
                               if (rid := self.outputs.rid_of(i)) is not None]
                              + [Failed(rid, why, 500) for rid in waiting]))
        finally:
            self._flush(final=True)

    # ---- the trace --------------------------------------------------------------------------
    def workload(self) -> Workload | None:
        return self.core.scheduler.requests.workload("served") if self.core.num_requests else None

    def trace(self):
        """The measured trace of everything served so far (unfinished requests have no finish); with
        nothing served, a trace of 0 requests (its engine and clock: an idle replica still merges)."""
        from gpu_runner.engine import device_name
        if self.core.log is None:
            return None
        wl, e = self.workload(), self.engine
        meta = self.core.trace_meta(wl or _NothingServed, "measured",
                                    f"served by gpu_runner on {e.model_name}", e.engine_meta(),
                                    device=device_name(e.device), **e.model_meta(),
                                    notes="gpu_runner serve: arrival = when the HTTP request was accepted",
                                    clock=host_clock(self.clock))
        if wl is None:
            from core.trace.model import Trace, empty
            from core.trace.schema import REQUEST
            return Trace(meta=meta, requests=empty(REQUEST))
        return self.core.trace(wl, meta)

    def _maybe_flush(self):
        if self.trace_out is None:
            return
        now, busy = time.monotonic(), self.core.has_unfinished()
        if not busy:
            self._busy_since = None
        elif self._busy_since is None:
            self._busy_since = now
        if flush_due(now - self._last_flush, self._flush_every, busy,
                     now - self._busy_since if busy else float("inf")):
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


class _NothingServed:
    """The workload a trace of no requests names (trace_meta reads its name)."""
    name = "served"


def host_clock(clock) -> dict:
    """meta.clock of times on a WallClock: its origin on this host's monotonic clock (perf_counter_ns is
    CLOCK_MONOTONIC, one for every process of a boot: the boot id says which), and that instant on
    the epoch clock, so that replicas started apart are placed on one clock (core.fleet.clocks)."""
    pc, ep = time.perf_counter_ns(), time.time_ns()
    origin = clock.origin_ns - round(clock.t0 * 1e6)       # (t_ms 0 on perf_counter_ns)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        boot = None
    return {"kind": "perf_counter", "t0_s": origin / 1e9, "resolution_ms": 1e-6, "boot_id": boot,
            "epoch_t0_s": (ep - (pc - origin)) / 1e9,
            "how": "t_ms 0 on this host's CLOCK_MONOTONIC (perf_counter_ns, seconds since boot), and that instant on "
                   "the epoch clock (time_ns, read beside it when the trace was written)"}
