"""Run a workload through the core scheduler with a step-time model; returns a trace.

Step-time models (the duration of one forward step):
- constant:  every step takes `step_ms` (the unit-step model of the scheduling examples);
- affine:    base_ms + prefill_ms_per_token x prefill tokens + decode_ms_per_seq x decode
             sequences (fit it to a measured trace with `fit_affine`);
- roofline:  max(bytes moved / bandwidth, FLOPs / peak) for a model and GPU preset, where
             bytes = weights once per step + KV read by attention (every cached position of
             every sequence in the batch) and FLOPs = 2 x params x tokens; plus base_ms of
             fixed overhead. An optimistic bound, not a prediction of a real engine.

Clock: starts at the first arrival. Each step starts when the previous one ends (or at
the next arrival when idle); the tokens a step emits are stamped at the step's end.
"""
from __future__ import annotations

import datetime as _dt
import gc
import math
from dataclasses import dataclass

import numpy as np

from core.errors import ConfigError
from core.kv import GPUS, MODELS
from core.scheduler import Batch, Scheduler, SchedulerConfig, StepLog
from core.trace import Trace, trace_from_log
from core.workload import Workload

STEP_MODELS = ("constant", "affine", "roofline")


@dataclass(slots=True)
class StepModel:
    kind: str = "constant"           # constant | affine | roofline
    step_ms: float = 1.0             # constant: duration of every step
    base_ms: float = 0.0             # affine/roofline: fixed cost per step
    prefill_ms_per_token: float = 0.0  # affine: cost per prefill token
    decode_ms_per_seq: float = 0.0   # affine: cost per decoding sequence
    model: str = "Llama-2-7B"        # roofline: model preset (core.kv.MODELS)
    gpu: str = "A100-80GB"           # roofline: GPU preset (core.kv.GPUS)
    dtype_bytes: float = 2.0         # roofline: bytes per weight and KV element

    def __post_init__(self):
        if self.kind not in STEP_MODELS:
            raise ConfigError(f"step model: expected one of {', '.join(STEP_MODELS)}, got {self.kind!r}")
        for name in ("step_ms", "base_ms", "prefill_ms_per_token", "decode_ms_per_seq", "dtype_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name}: expected a finite number >= 0, got {v!r}")
        if self.kind == "constant" and self.step_ms <= 0:
            raise ConfigError(f"step_ms: expected a positive number, got {self.step_ms!r}")
        if self.kind == "affine" and self.base_ms <= 0 and self.prefill_ms_per_token <= 0 \
                and self.decode_ms_per_seq <= 0:
            raise ConfigError("affine step model: at least one of base_ms, prefill_ms_per_token, "
                              "decode_ms_per_seq must be positive")
        if self.kind == "roofline":
            if self.model not in MODELS:
                raise ConfigError(f"model: unknown preset {self.model!r} (known: {', '.join(MODELS)})")
            if self.gpu not in GPUS:
                raise ConfigError(f"gpu: unknown preset {self.gpu!r} (known: {', '.join(GPUS)})")
            if self.dtype_bytes <= 0:
                raise ConfigError("dtype_bytes: expected a positive number")

    def duration_ms(self, batch: Batch) -> float:
        if self.kind == "constant":
            return self.step_ms
        if self.kind == "affine":
            return (self.base_ms + self.prefill_ms_per_token * batch.prefill_tokens
                    + self.decode_ms_per_seq * batch.decode_seqs)
        # Attention reads the K/V of every position each new token attends to.
        kv_positions = int((batch.start_pos * batch.num_tokens + batch.num_tokens * (batch.num_tokens + 1) // 2).sum())
        return self._roofline_ms(kv_positions, batch.total_tokens)

    def _roofline_ms(self, kv_positions: int, tokens: int) -> float:
        m, g = MODELS[self.model], GPUS[self.gpu]
        bytes_moved = m.params * self.dtype_bytes + float(kv_positions) * m.kv_bytes_per_token(self.dtype_bytes)
        flops = 2.0 * m.params * tokens
        return self.base_ms + 1000.0 * max(bytes_moved / g.bandwidth_Bps, flops / g.flops)

    def decode_run_ms(self, batch: Batch, k: int) -> np.ndarray:
        """Durations of `batch` (all one-token decodes) repeated k times, positions advancing
        by one each step; equal to duration_ms of each of those steps."""
        if self.kind != "roofline":
            return np.full(k, self.duration_ms(batch))
        s0 = int((batch.start_pos + 1).sum())
        n = len(batch.reqs)
        return np.array([self._roofline_ms(s0 + n * j, n) for j in range(k)])

    def describe(self) -> str:
        if self.kind == "constant":
            return f"constant: every step {self.step_ms:g} ms"
        if self.kind == "affine":
            return (f"affine: {self.base_ms:g} ms + {self.prefill_ms_per_token:g} ms x prefill tokens "
                    f"+ {self.decode_ms_per_seq:g} ms x decode sequences")
        return (f"roofline: {self.model} ({self.dtype_bytes:g}-byte weights/KV) on {self.gpu} peaks, "
                f"max(bytes/bandwidth, FLOPs/peak) + {self.base_ms:g} ms")

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "description": self.describe()}
        if self.kind == "constant":
            d["step_ms"] = self.step_ms
        elif self.kind == "affine":
            d.update(base_ms=self.base_ms, prefill_ms_per_token=self.prefill_ms_per_token,
                     decode_ms_per_seq=self.decode_ms_per_seq)
        else:
            d.update(model=self.model, gpu=self.gpu, dtype_bytes=self.dtype_bytes, base_ms=self.base_ms)
        return d


def simulate(workload: Workload, config: SchedulerConfig, step_model: StepModel | None = None,
             label: str | None = None, created: str | None = None, record_kv: bool = True,
             fast_forward: bool = True) -> Trace:
    """`fast_forward` applies runs of identical decode-only steps in one go (same trace as
    stepping one by one, which tests check); turn it off to step strictly."""
    step_model = step_model or StepModel()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the run allocates many small acyclic records; cyclic GC passes only cost time
    try:
        return _simulate(workload, config, step_model, label, created, record_kv, fast_forward)
    finally:
        if gc_was_enabled:
            gc.enable()


def _simulate(workload, config, step_model, label, created, record_kv, fast_forward) -> Trace:
    if config.spec_gamma:
        raise ConfigError("spec_gamma: the simulator does not model speculative acceptance; "
                          "capture speculative runs with gpu_runner")
    log = StepLog()
    sched = Scheduler(workload, config, log)
    if not record_kv:
        sched.bm.log = None
    t = float(workload.requests[0].arrival_ms)
    while not sched.done():
        sched.admit_arrivals(t)
        batch = sched.schedule(t)
        if batch is None:
            nxt = sched.next_event_ms()
            if nxt is None or nxt <= t:
                if sched.done():
                    break
                raise RuntimeError(f"scheduler made no progress at t={t} ms "
                                   f"({len(sched.waiting)} waiting, {len(sched.run)} running)")
            t = nxt
            continue
        if fast_forward:
            t_end = sched.fast_forward(batch, lambda k: step_model.decode_run_ms(batch, k))
            if t_end is not None:
                t = t_end
                continue
        dur = step_model.duration_ms(batch)
        if not dur > 0:
            raise ConfigError(f"step model gave a non-positive step duration ({dur} ms)")
        sched.complete(batch, t + dur, dur)
        t += dur
    meta = {
        "source": "simulated",
        "label": label or f"{config.policy} (simulated)",
        "created": created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "engine": {"name": "core.simulate", **config.to_dict()},
        "step_model": step_model.to_dict(),
        "workload": workload.name,
        "stats": {"steps": sched.step, "preemptions": sched.num_preemptions,
                  "kv_blocks": sched.bm.num_blocks, **{f"kv_{k}": v for k, v in sched.bm.counts.items()}},
    }
    return trace_from_log(workload, log, meta)


def fit_affine(trace: Trace) -> StepModel:
    """Least-squares fit of the affine step model to a trace's step events:
    dur = base + a x prefill tokens + c x decode sequences (coefficients clipped at 0)."""
    st, b = trace.steps, trace.batch
    if len(st) < 3 or not len(b):
        raise ConfigError("fit: the trace needs step events with batch composition (at least 3 steps)")
    pre = b[b["kind"] == "prefill"].groupby("step")["tokens"].sum()
    dec = b[b["kind"] == "decode"].groupby("step")["req"].count()
    steps = st["step"].to_numpy()
    x_pre = pre.reindex(steps, fill_value=0).to_numpy(dtype=float)
    x_dec = dec.reindex(steps, fill_value=0).to_numpy(dtype=float)
    y = st["dur_ms"].to_numpy(dtype=float)
    A = np.column_stack([np.ones_like(y), x_pre, x_dec])
    coef = np.linalg.lstsq(A, y, rcond=None)[0]
    coef = np.maximum(coef, 0.0)
    if coef.sum() <= 0:
        coef[0] = float(np.mean(y)) or 1e-3
    return StepModel("affine", base_ms=float(coef[0]), prefill_ms_per_token=float(coef[1]),
                     decode_ms_per_seq=float(coef[2]))
