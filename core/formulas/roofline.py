"""Roofline arithmetic for a dense decoder.

A forward pass over B token positions of a P-parameter model does about 2*P*B FLOPs and,
if the B positions share one read of the b-byte weights, reads P*b bytes of weights, so
    arithmetic intensity ~ 2*P*B / (P*b) = 2*B/b  FLOP/byte
(ignoring attention, activations and KV traffic). Batch-1 decode in 2-byte weights sits at
1 FLOP/byte; a 2,048-token prefill at 2,048.
A step that must read all weights once cannot run faster than bandwidth / weight bytes.
"""
from __future__ import annotations

from core.errors import ConfigError
from core.formulas.kv import GPUSpec


def arithmetic_intensity(batch_tokens: float, dtype_bytes: float = 2) -> float:
    """FLOP per byte of weights read for a step over `batch_tokens` positions."""
    if batch_tokens <= 0 or dtype_bytes <= 0:
        raise ConfigError("batch_tokens and dtype_bytes must be positive")
    return 2.0 * batch_tokens / dtype_bytes


def bandwidth_bound_steps_per_s(bandwidth_Bps: float, weight_bytes: float) -> float:
    """Upper bound on forward steps per second when each step reads every weight once."""
    if bandwidth_Bps <= 0 or weight_bytes <= 0:
        raise ConfigError("bandwidth and weight bytes must be positive")
    return bandwidth_Bps / weight_bytes


def attainable_flops(intensity: float, gpu: GPUSpec) -> float:
    """min(peak compute, intensity x bandwidth): the roof at this intensity."""
    return min(gpu.flops, intensity * gpu.bandwidth_Bps)


def bound_of(intensity: float, gpu: GPUSpec) -> str:
    return "compute" if intensity >= gpu.ridge_flop_per_byte else "bandwidth"


def step_time_s(params: int, dtype_bytes: float, tokens: int, gpu: GPUSpec,
                kv_bytes_read: float = 0.0) -> float:
    """Roofline lower bound for one forward step: max(bytes moved / bandwidth,
    FLOPs / peak). Bytes = weights once + the KV read by attention."""
    bytes_moved = params * dtype_bytes + kv_bytes_read
    flops = 2.0 * params * tokens
    return max(bytes_moved / gpu.bandwidth_Bps, flops / gpu.flops)


def compute_bound_tokens_per_s(params: int, gpu: GPUSpec) -> float:
    """Token positions per second at the compute roof: peak FLOP/s / (2 x params)."""
    return gpu.flops / (2.0 * params)


def intensity_table(points: list[tuple[str, float]], gpu: GPUSpec) -> list[dict]:
    """Per (label, intensity FLOP/B): which roof bounds it on `gpu` and the attainable TFLOP/s."""
    return [{"workload": label, "intensity FLOP/B": x, "bound on " + gpu.name: bound_of(x, gpu),
             "attainable TFLOP/s": attainable_flops(x, gpu) / 1e12} for label, x in points]


def batch_table(params: int, dtype_bytes: float, gpu: GPUSpec,
                batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512)) -> list[dict]:
    """Per decode batch size B: roofline step time (weights read once, 2 x params x B FLOPs),
    tokens/s = B / step time, and the bounding roof."""
    rows = []
    for b in batches:
        t_s = step_time_s(params, dtype_bytes, b, gpu)
        rows.append({"batch": b, "step time ms (roofline)": t_s * 1000, "tokens/s": b / t_s,
                     "bound": bound_of(arithmetic_intensity(b, dtype_bytes), gpu)})
    return rows
