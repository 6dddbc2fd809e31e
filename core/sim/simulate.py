"""The simulator: the core step loop with a step-time model as its executor.

Clock: starts at the first arrival. Each step starts when the previous one ends (or at
the next arrival when idle); the tokens a step emits are stamped at the step's end.
Step-time models are in core.sim.stepmodel.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from core.config import SchedulerConfig
from core.engine import loop
from core.engine.core import EngineCore
from core.engine.outputs import ExecutorOutput, SchedulerOutput
from core.engine.steplog import StepLog
from core.errors import ConfigError
from core.sim.stepmodel import Speed, StepModel
from core.workload import Workload

if TYPE_CHECKING:
    from core.sim.frontend import FrontEnd
    from core.trace import Trace


class StepTimeExecutor:
    """Prices each batch with a step-time model; emits one (unknown) token per completing entry.
    With the model's `shape_ms`, keeps the batch sizes (tokens) it has priced: a size it had not
    priced before costs shape_ms more, once."""

    def __init__(self, step_model: StepModel, speed: Speed | None = None):
        self.step_model = step_model
        self.speed = speed
        self.sizes_run: set[int] = set()

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        sm = self.step_model
        dur = sm.duration_ms(batch)
        if sm.shape_ms > 0:
            size = int(batch.total_tokens)
            if size not in self.sizes_run:
                self.sizes_run.add(size)
                dur += sm.shape_ms
        if self.speed is not None:
            dur *= self.speed.at(batch.t_ms)
        if not dur > 0:
            raise ConfigError(f"step model gave a non-positive step duration ({dur} ms)")
        return ExecutorOutput(batch.t_ms + dur, dur)

    def run_durations(self, batch: SchedulerOutput, k: int) -> list[float] | None:
        """A run of decode steps priced at once (Scheduler.advance), or None: then each is stepped. A
        run whose batch size (tokens) was not yet run is stepped (its first-use cost is priced once),
        and so is every step under a speed that changes over the run."""
        if self.speed is not None:
            return None
        if self.step_model.shape_ms > 0 and int(batch.total_tokens) not in self.sizes_run:
            return None
        return self.step_model.decode_run_ms(batch, k)


def simulate(workload: Workload, config: SchedulerConfig, step_model: StepModel | None = None,
             label: str | None = None, created: str | None = None, record_kv: bool = True,
             fast_forward: bool = True, front_end: FrontEnd | None = None, speed: Speed | None = None) -> Trace:
    """`fast_forward` applies runs of identical decode-only steps in one go (same trace as
    stepping one by one, which tests check); turn it off to step strictly. `front_end`: the
    requests' way in and out (core.sim.frontend); the trace is then on the front end's clock.
    `speed`: the machine's speed over the run (core.sim.stepmodel.Speed), every step's duration
    times its factor at the step's start."""
    if front_end is not None:
        from core.sim.frontend import at_front_end, engine_workload, in_flight_at
        inner = engine_workload(workload, front_end)
        tr = at_front_end(simulate(inner, config, step_model, label, created, record_kv, fast_forward, speed=speed),
                          workload, front_end)
        if front_end.in_ms_per_in_flight:   # contention: again, with the requests in flight the first run had
            busy = _in_flight(tr, workload, in_flight_at)
            tr = at_front_end(simulate(engine_workload(workload, front_end, busy), config, step_model, label,
                                       created, record_kv, fast_forward, speed=speed), workload, front_end)
        return tr
    with no_cyclic_gc():   # building the trace allocates as many acyclic objects as the run
        core = simulator(config, step_model, workload, record_kv, fast_forward, speed=speed)
        tr = core.trace(workload, _run(core, workload, label, created, speed))
        del core   # (freed before collection is back on: else its first pass walks every object of the run)
        return tr


def token_span_ms(workload: Workload, config: SchedulerConfig, step_model: StepModel | None = None,
                  fast_forward: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) token time of each request, in workload order (NaN: no token), exactly as
    `simulate`'s trace gives them, without recording the run: what a search that only compares
    TTFT and E2E (core.fit.reqfit) needs, at the cost of the steps alone."""
    n = len(workload)
    first, last = np.full(n, np.inf), np.full(n, -np.inf)

    def tokens(out):
        for i in out.token_reqs:    # (a few a step: the listed entries'; a decoder's first is listed)
            if out.t_ms < first[i]:
                first[i] = out.t_ms
            if out.t_ms > last[i]:
                last[i] = out.t_ms
        for i, _, t_last in out.left:   # a decoder's last token: the end of the last step it decoded in
            if t_last is not None and t_last > last[i]:
                last[i] = t_last
    if config.spec_gamma:
        raise ConfigError("spec_gamma: the simulator does not model speculative acceptance; "
                          "capture speculative runs with gpu_runner")
    core = EngineCore(config, StepTimeExecutor(step_model or StepModel()), workload, record=False, kv_events=False,
                      fast_forward=fast_forward, explicit_batches=False)
    core.observe(tokens)
    with no_cyclic_gc():
        loop.run(core, loop.VirtualClock(float(workload.arrival_ms[0])))
    first[np.isinf(first)] = np.nan
    last[np.isinf(last)] = np.nan
    return first, last


def _in_flight(tr, workload: Workload, in_flight_at) -> np.ndarray:
    """Per request of `workload` (its order), the others in flight at the front end when it arrived
    in trace `tr` (finish times on the front end's clock)."""
    fin = dict(zip(tr.requests["id"].to_numpy()[tr.finishes["req"].to_numpy()], tr.finishes["t_ms"].to_numpy()))
    finish = np.array([fin.get(i, np.inf) for i in workload.ids], dtype=np.float64)
    return in_flight_at(np.asarray(workload.arrival_ms, dtype=np.float64), finish)


@contextmanager
def no_cyclic_gc():
    """Cyclic GC off for a block that allocates many small acyclic records (a run's log):
    each collection pass would walk every live object of the process (in a Streamlit server,
    its whole heap) and free nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def reuse_freed_memory() -> bool:
    """Long runs allocate and free many large arrays; glibc returns each to the OS and the
    next one page-faults fresh memory (a third of a 40k-request run's time went to system
    time; the runner's prefill step of 16 x 128 tokens, 152-165 ms against 139-140 reused).
    Raise glibc's mmap and trim thresholds so freed memory is reused (the process keeps
    its peak heap). Process-wide, so only the command line, the app server's startup
    (ui.heap.freeze_startup_heap) and the runner's engine (gpu_runner.launch.build_engine) call
    it; a no-op where glibc is absent. True when glibc took both."""
    import ctypes
    try:   # (the process's own symbols, libc's among them: no library search, 1 ms against 6)
        libc = ctypes.CDLL(None)
        return libc.mallopt(-3, 1 << 30) == 1 and libc.mallopt(-1, 1 << 30) == 1   # M_MMAP_ / M_TRIM_THRESHOLD
    except (OSError, AttributeError, TypeError):
        return False


# Streaming: hand the log to the writer every this many executed steps. Small enough that the
# writer thread starts early and runs beside the scheduler (at 2,048 the first row groups came
# late and the scheduler then waited on the writer: 10k requests took 1.33 s end to end, 1.05 s
# at 512; bench.scale, docs/benchmarks.md); large enough that per-drain costs stay small.
FLUSH_STEPS = 512


def simulate_to_parquet(workload: Workload, config: SchedulerConfig, sink, step_model: StepModel | None = None,
                        label: str | None = None, created: str | None = None, record_kv: bool = True,
                        fast_forward: bool = True, flush_steps: int = FLUSH_STEPS,
                        row_group_rows: int | None = None) -> tuple[dict, dict]:
    """The trace `simulate` would return, written into one Parquet file (`sink`: a path or a
    pyarrow output stream) while the simulation runs: the log is handed to a
    core.trace.parquet.TraceWriter every `flush_steps` steps and forgotten, so memory stays
    bounded by the run's live state, not its length. Reading the file back gives exactly
    the trace `simulate` returns (tests check). Plain decode steps are written as decode spans
    (core.trace.spans: one row per stretch of a request's decoding, not a token and a batch row per
    step). Returns (meta, rows per record type: token and batch as read back, spans expanded). Needs
    neither pandas nor Request objects for a plain workload."""
    from core.engine.steplog import log_records
    from core.trace.writer import ROW_GROUP_ROWS, TraceWriter, dumps_json, workload_request_rows
    if row_group_rows is None:
        # The writer thread encodes a row group beside the run, but the last one (and the rows
        # still buffered) after its last step: 131,072 rows keep that tail short (a 10k-request run
        # 0.32 against 0.35 s with 262,144) and cost a long run nothing (100k: 3.28 against 3.30 s
        # with 1,048,576; docs/benchmarks.md, issue 50).
        row_group_rows = ROW_GROUP_ROWS // 8
    writer = TraceWriter(sink, row_group_rows)
    try:
        writer.add("request", workload_request_rows(workload))

        expanded, freed = [0], [0]

        def drain(log: StepLog):
            frees = log.kv.whole_frees() if log.kv is not None else None   # (frees of whole tables: a row each)
            records = log_records(log, spans=True)
            for rtype, cols in ([("kv_free", frees)] if frees else []) + list(records.items()):
                writer.add(rtype, {k: v for k, v in cols.items() if v is not None})
                if rtype == "span":
                    expanded[0] += int(cols["tokens"].sum())
                elif rtype == "kv_free":
                    freed[0] += int(cols["logical"].sum()) + len(cols["logical"])
            if log.other:
                writer.add("other", {"t_ms": np.array([float(e.get("t_ms", 0.0)) for e in log.other]),
                                     "json": [dumps_json(e) for e in log.other]})
            log.clear()

        core = simulator(config, step_model, workload, record_kv, fast_forward)
        log = core.log

        def on_output(_):
            if len(log.batch_parts) >= flush_steps:
                drain(log)

        core.observe(on_output)
        meta = _run(core, workload, label, created)
        drain(log)
    except BaseException:
        writer.abort()
        raise
    writer.close(meta)
    counts = dict(writer.counts)
    if expanded[0]:
        for rtype in ("token", "batch"):
            counts[rtype] = counts.get(rtype, 0) + expanded[0]
    if freed[0]:
        counts["kv"] = counts.get("kv", 0) + freed[0]
    return meta, counts


def simulator(config: SchedulerConfig, step_model: StepModel | None = None, workload: Workload | None = None,
              record_kv: bool = True, fast_forward: bool = False, scheduler=None,
              speed: Speed | None = None, cache_news: bool = False) -> EngineCore:
    """An engine core that simulates: the step-time model as its executor, recording its
    trace. Drive it with core.engine.loop.run on a VirtualClock, or step it yourself (several
    cores on one clock). `cache_news`: its outputs carry the prefix cache's changes (a fleet's router)."""
    if config.spec_gamma:
        raise ConfigError("spec_gamma: the simulator does not model speculative acceptance; "
                          "capture speculative runs with gpu_runner")
    extra = {"scheduler": scheduler} if scheduler is not None else {}
    return EngineCore(config, StepTimeExecutor(step_model or StepModel(), speed), workload, record=True,
                      kv_events=record_kv, fast_forward=fast_forward, explicit_batches=False, cache_news=cache_news,
                      **extra)


def _run(core: EngineCore, workload: Workload, label, created, speed: Speed | None = None) -> dict:
    """Run a simulator core over its workload; returns the trace's metadata."""
    with no_cyclic_gc():
        loop.run(core, loop.VirtualClock(float(workload.arrival_ms[0])))
        extra = {"speed": speed.describe()} if speed is not None else {}
        return core.trace_meta(workload, "simulated", label or f"{core.config.policy} (simulated)",
                               {"name": "core.simulate"}, created,
                               step_model=core.executor.step_model.to_dict(), **extra)
