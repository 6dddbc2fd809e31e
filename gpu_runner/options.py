"""The runner's engine options, declared once (core.config): importable without torch, so
command lines build their flags cheaply."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from core.config import SamplingParams, SchedulerConfig, check_options, opt

ATTENTION = ("auto", "torch", "triton")
MATMUL = ("auto", "torch", "onednn")


def parse_layer_head(text: str) -> tuple[int, int]:
    """The --capture-tiles flag: "LAYER,HEAD"."""
    try:
        layer, head = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAYER,HEAD like 0,0, got {text!r}") from None
    return layer, head


@dataclass(slots=True)
class EngineConfig:
    scheduler: SchedulerConfig = opt(factory=SchedulerConfig, help="scheduling options (core.config)")
    sampling: SamplingParams = opt(factory=SamplingParams, help="token sampling options (core.config)")
    kv_memory_mb: float | None = opt(None, "size the KV pool from a memory budget in MiB "
                                     "(instead of --kv-blocks)", minimum=0)
    attention: str = opt("auto", "attention kernels: auto = triton on CUDA, torch on CPU", choices=ATTENTION)
    matmul: str = opt("auto", "linear layers: onednn = weights packed once for oneDNN, q/k/v and gate/up fused "
                      "(CPU, float32); torch = torch.nn.functional.linear; auto = onednn where it can run",
                      choices=MATMUL)
    record: bool = opt(True, "record trace events (off: only the generated tokens, for overhead checks)")
    gamma: int = opt(4, "speculative decoding: draft tokens verified per step (with a draft model)", minimum=1)
    capture_tiles: tuple[int, int] | None = opt(None, "LAYER,HEAD: record per-tile (m, l) of the Triton "
                                                "attention kernel for one layer and head", parse=parse_layer_head)

    def __post_init__(self):
        check_options(self)
