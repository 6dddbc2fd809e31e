"""Step-time models: how long one forward step takes in the simulator.

- constant:  every step takes `step_ms` (the unit-step model of the scheduling examples);
- affine:    base_ms + prefill_ms_per_token x prefill tokens + decode_ms_per_seq x decode
             sequences (fit it to a measured trace with `fit_affine` or core.fit.stepfit);
- features:  the affine terms plus attention's reads and the number of prefill pieces:
             + prefill_ms_per_kpos x attended positions of prefill tokens / 1,000
             + decode_ms_per_kpos x attended positions of decoding sequences / 1,000
             + prefill_ms_per_chunk x prefill pieces (requests with prompt tokens in the step),
             where a request computing n tokens after s cached ones attends n*s + n(n+1)/2
             positions (core.fit.stepfit fits it to step events by non-negative least squares);
- roofline:  max(bytes moved / bandwidth, FLOPs / peak) for a model and GPU preset, where
             bytes = weights once per step + KV read by attention (every cached position of
             every sequence in the batch) and FLOPs = 2 x params x tokens; plus base_ms of
             fixed overhead. An optimistic bound, not a prediction of a real engine.

Any kind may add a wake-up cost to a step that starts after the engine sat idle for t ms:
wake_ms x (1 - exp(-t / wake_tau_ms)) (a CPU engine's first step after a pause runs on cold caches
and sleeping threads: core.fit.wake measures it from a real run), and a first-use cost to a step
whose batch size in tokens the engine had not run before: shape_ms (a CPU engine's kernels build
their plans for each new shape on first use; the simulator's executor keeps the sizes it has
priced, core.sim.simulate.StepTimeExecutor).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core.config import check_options, opt
from core.engine.outputs import SchedulerOutput
from core.errors import ConfigError
from core.formulas.kv import GPUS, MODELS

if TYPE_CHECKING:
    from core.trace import Trace

STEP_MODELS = ("constant", "affine", "roofline", "features")


# features of a step (batch_features) and the coefficient of each, in order
FEATURES = ("step", "prefill_tokens", "decode_seqs", "prefill_kpos", "decode_kpos", "prefill_chunks")
FEATURE_COEFFICIENTS = ("base_ms", "prefill_ms_per_token", "decode_ms_per_seq", "prefill_ms_per_kpos",
                        "decode_ms_per_kpos", "prefill_ms_per_chunk")


def step_features(num_tokens: np.ndarray, start_pos: np.ndarray, is_prefill: np.ndarray) -> np.ndarray:
    """The FEATURES of one step from its entries: 1, prefill tokens, decoding sequences,
    attended positions / 1,000 of prefill and of decode entries, prefill pieces."""
    n = num_tokens.astype(float)
    pos = n * start_pos + n * (n + 1) / 2
    pre = is_prefill.astype(bool)
    return np.array([1.0, n[pre].sum(), float((~pre).sum()), pos[pre].sum() / 1000.0, pos[~pre].sum() / 1000.0,
                     float(pre.sum())])


def _combine(coef, feats):
    """sum of coef[i] * feats[i], added in FEATURES order: a step priced alone and the same step
    in a fast-forwarded run (arrays) get bit-identical durations."""
    total = coef[0] * feats[0]
    for c, f in zip(coef[1:], feats[1:]):
        total = total + c * f
    return total


def batch_features(batch: SchedulerOutput) -> np.ndarray:
    a = batch.agg
    if a is not None:   # (the same numbers: integer sums of the entries' counts and positions)
        return np.array([1.0, float(a[0]), float(a[1]), a[2] / 1000.0, a[3] / 1000.0, float(a[4])])
    return step_features(batch.num_tokens, batch.start_pos, batch.is_prefill)


MAX_COEF_MS = 1e6   # a step-time coefficient of at most 1,000 s: beyond it times overflow what a trace holds


@dataclass(slots=True)
class StepModel:
    kind: str = opt("constant", "how a step's duration is computed", flag="--step-model", choices=STEP_MODELS)
    step_ms: float = opt(1.0, "constant: ms per step", minimum=0, maximum=MAX_COEF_MS, label="ms per step")
    base_ms: float = opt(0.0, "affine/roofline: fixed ms per step", minimum=0, maximum=MAX_COEF_MS,
                         label="base ms per step")
    prefill_ms_per_token: float = opt(0.0, "affine: ms per prefill token", minimum=0, maximum=MAX_COEF_MS,
                                      label="ms per prefill token")
    decode_ms_per_seq: float = opt(0.0, "affine: ms per decoding sequence", minimum=0, maximum=MAX_COEF_MS,
                                   label="ms per decoding sequence")
    prefill_ms_per_kpos: float = opt(0.0, "features: ms per 1,000 attended positions of prefill tokens", minimum=0,
                                     maximum=MAX_COEF_MS, label="ms per 1,000 attended prefill positions")
    decode_ms_per_kpos: float = opt(0.0, "features: ms per 1,000 attended positions of decoding sequences",
                                    minimum=0, maximum=MAX_COEF_MS, label="ms per 1,000 attended decode positions")
    prefill_ms_per_chunk: float = opt(0.0, "features: ms per prefill piece (a request's prompt tokens in a step)",
                                      minimum=0, maximum=MAX_COEF_MS, label="ms per prefill piece")
    wake_ms: float = opt(0.0, "any kind: ms added to a step after a long idle (see wake_tau_ms)", minimum=0,
                         maximum=MAX_COEF_MS, label="wake-up ms after idle")
    wake_tau_ms: float = opt(100.0, "any kind: idle ms for the wake-up cost to reach 63% of wake_ms", above=0,
                             maximum=MAX_COEF_MS, label="wake-up time constant (ms)")
    shape_ms: float = opt(0.0, "any kind: ms added to a step whose batch size in tokens the engine had not run "
                                "before (kernels planned for a new shape on first use)", minimum=0,
                          maximum=MAX_COEF_MS, label="first-use ms per new batch size")
    model: str = opt("Llama-2-7B", "roofline: model preset (core.formulas.kv.MODELS)", label="Model preset")
    gpu: str = opt("A100-80GB", "roofline: GPU preset (core.formulas.kv.GPUS)", label="GPU preset")
    dtype_bytes: float = opt(2.0, "roofline: bytes per weight and KV element (and a disaggregated fleet's KV "
                                  "transfers)", above=0, maximum=16)

    def __post_init__(self):
        check_options(self)
        if self.kind == "constant" and self.step_ms <= 0:
            raise ConfigError(f"step_ms: expected a positive number, got {self.step_ms!r}")
        if self.kind == "affine" and self.base_ms <= 0 and self.prefill_ms_per_token <= 0 \
                and self.decode_ms_per_seq <= 0:
            raise ConfigError("affine step model: at least one of base_ms, prefill_ms_per_token, "
                              "decode_ms_per_seq must be positive")
        if self.kind == "features" and self.base_ms <= 0 and self.decode_ms_per_seq <= 0 \
                and self.decode_ms_per_kpos <= 0:
            # a decode-only step must take time, or a run of them would never advance the clock
            raise ConfigError("features step model: at least one of base_ms, decode_ms_per_seq, "
                              "decode_ms_per_kpos must be positive")
        if self.kind == "roofline":
            if self.model not in MODELS:
                raise ConfigError(f"model: unknown preset {self.model!r} (known: {', '.join(MODELS)})")
            if self.gpu not in GPUS:
                raise ConfigError(f"gpu: unknown preset {self.gpu!r} (known: {', '.join(GPUS)})")
            if self.dtype_bytes <= 0:
                raise ConfigError("dtype_bytes: expected a positive number")

    def coefficients(self) -> np.ndarray:
        """The features model's coefficients in FEATURES order (unused ones are 0)."""
        return np.array([getattr(self, name) for name in FEATURE_COEFFICIENTS], dtype=float)

    def wake(self, idle_ms: float) -> float:
        """The wake-up cost of a step that starts after `idle_ms` idle (0 without a wake term)."""
        if self.wake_ms <= 0 or not idle_ms > 0:
            return 0.0
        return self.wake_ms * -float(np.expm1(-idle_ms / self.wake_tau_ms))

    def duration_ms(self, batch: SchedulerOutput) -> float:
        if self.wake_ms > 0:
            return self._forward_ms(batch) + self.wake(batch.idle_ms)
        return self._forward_ms(batch)

    def _forward_ms(self, batch: SchedulerOutput) -> float:
        if self.kind == "constant":
            return self.step_ms
        if self.kind == "affine":
            return (self.base_ms + self.prefill_ms_per_token * batch.prefill_tokens
                    + self.decode_ms_per_seq * batch.decode_seqs)
        if self.kind == "features":
            return float(_combine(self.coefficients(), batch_features(batch)))
        # Attention reads the K/V of every position each new token attends to.
        a, n = batch.agg, batch.num_tokens
        kv_positions = a[2] + a[3] if a is not None else int((batch.start_pos * n + n * (n + 1) // 2).sum())
        return self._roofline_ms(kv_positions, batch.total_tokens)

    def _roofline_ms(self, kv_positions: int, tokens: int) -> float:
        m, g = MODELS[self.model], GPUS[self.gpu]
        bytes_moved = m.params * self.dtype_bytes + float(kv_positions) * m.kv_bytes_per_token(self.dtype_bytes)
        flops = 2.0 * m.params * tokens
        return self.base_ms + 1000.0 * max(bytes_moved / g.bandwidth_Bps, flops / g.flops)

    def decode_run_ms(self, batch: SchedulerOutput, k: int) -> list[float]:
        """Durations of `batch` (all one-token decodes) repeated k times, positions advancing
        by one each step; equal to duration_ms of each of those steps (a list: a run is often a
        few steps, where numpy's per-call cost dominated). The steps after the first follow
        without a pause: a wake-up cost is the first's alone."""
        out = self._run_ms(batch, k)
        if self.wake_ms > 0 and batch.idle_ms > 0 and k > 0:
            out[0] += self.wake(batch.idle_ms)
        return out

    def _run_ms(self, batch: SchedulerOutput, k: int) -> list[float]:
        a = batch.agg   # (a decode-only batch: n decoding sequences attending s0 positions in all)
        n = a[1] if a is not None else len(batch.reqs)
        if self.kind == "features":   # each step every sequence attends one more position
            s0 = float(a[3] if a is not None else (batch.start_pos + 1).sum())
            zero = np.zeros(k)
            return _combine(self.coefficients(), (np.ones(k), zero, np.full(k, float(n)), zero,
                                                  (s0 + n * np.arange(k, dtype=float)) / 1000.0, zero)).tolist()
        if self.kind != "roofline":
            return [float(self._forward_ms(batch))] * k
        s0 = a[3] if a is not None else int((batch.start_pos + 1).sum())
        return [self._roofline_ms(s0 + n * j, n) for j in range(k)]

    def describe(self) -> str:
        out = self._describe()
        if self.wake_ms > 0:
            out += f"; after idle + {self.wake_ms:.4g} ms x (1 - exp(-idle / {self.wake_tau_ms:.4g} ms))"
        if self.shape_ms > 0:
            out += f"; + {self.shape_ms:.4g} ms the first time a batch size (tokens) is run"
        return out

    def _describe(self) -> str:
        if self.kind == "constant":
            return f"constant: every step {self.step_ms:g} ms"
        if self.kind == "affine":
            return (f"affine: {self.base_ms:g} ms + {self.prefill_ms_per_token:g} ms x prefill tokens "
                    f"+ {self.decode_ms_per_seq:g} ms x decode sequences")
        if self.kind == "features":
            return (f"features: {self.base_ms:.4g} ms + {self.prefill_ms_per_token:.4g} ms x prefill tokens "
                    f"+ {self.decode_ms_per_seq:.4g} ms x decode sequences + {self.prefill_ms_per_kpos:.4g} ms "
                    f"x prefill attended kpos + {self.decode_ms_per_kpos:.4g} ms x decode attended kpos "
                    f"+ {self.prefill_ms_per_chunk:.4g} ms x prefill pieces")
        return (f"roofline: {self.model} ({self.dtype_bytes:g}-byte weights/KV) on {self.gpu} peaks, "
                f"max(bytes/bandwidth, FLOPs/peak) + {self.base_ms:g} ms")

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "description": self.describe()}
        if self.kind == "constant":
            d["step_ms"] = self.step_ms
        elif self.kind == "affine":
            d.update(base_ms=self.base_ms, prefill_ms_per_token=self.prefill_ms_per_token,
                     decode_ms_per_seq=self.decode_ms_per_seq)
        elif self.kind == "features":
            d.update(zip(FEATURE_COEFFICIENTS, self.coefficients().tolist()))
        else:
            d.update(model=self.model, gpu=self.gpu, dtype_bytes=self.dtype_bytes, base_ms=self.base_ms)
        if self.wake_ms > 0:
            d.update(wake_ms=self.wake_ms, wake_tau_ms=self.wake_tau_ms)
        if self.shape_ms > 0:
            d["shape_ms"] = self.shape_ms
        return d


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


@dataclass(frozen=True)
class Speed:
    """A machine's speed over a run, as a factor on every step's duration: factor[k] from t_ms[k]
    on (piecewise constant; factor[0] before t_ms[0]), on the simulation's clock. What a shared
    machine does to an engine that a step model of its batches cannot know (a benchmark client
    that takes more of two cores in one phase than in another). `how`: where the factors came from."""
    t_ms: tuple
    factor: tuple
    how: str = ""

    def __post_init__(self):
        t, f = np.asarray(self.t_ms, dtype=float), np.asarray(self.factor, dtype=float)
        if not len(t) or len(t) != len(f) or not np.isfinite(t).all() or (np.diff(t) < 0).any():
            raise ConfigError("speed: expected as many times (sorted) as factors, at least one")
        if not (np.isfinite(f).all() and (f > 0).all()):
            raise ConfigError("speed: every factor must be a positive number")
        object.__setattr__(self, "_t", t)
        object.__setattr__(self, "_f", f)

    def at(self, t_ms: float) -> float:
        k = int(np.searchsorted(self._t, t_ms, side="right")) - 1
        return float(self._f[max(k, 0)])

    def describe(self) -> dict:
        f = self._f
        return {"windows": len(f), "factor_min": float(f.min()), "factor_median": float(np.median(f)),
                "factor_max": float(f.max()), "how": self.how}
