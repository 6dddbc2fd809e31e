"""Building the runner from its options: the model (bundled, random, or a local Hugging Face
checkpoint), the draft, the Engine, and the engine `serve` runs behind its client (in a thread
of the server, or in an engine process of its own: gpu_runner.engine_process, which gets the
same ServeOptions)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from core.config import check_options, opt
from core.errors import ConfigError
from gpu_runner.options import EngineConfig


@dataclass(slots=True)
class ModelOptions:
    """Which model runs where (not part of a trace's engine options: the trace records the
    resolved model, device and dtype)."""
    model: str = opt("tiny", "tiny | tiny-draft | random-0.5b (random weights, for timing) | "
                     "a local HF checkpoint dir")
    device: str = opt("auto", "auto: cuda if available, else cpu", choices=("auto", "cpu", "cuda"))
    dtype: str = opt("auto", "auto: float32 on CPU, bfloat16 on CUDA",
                     choices=("auto", "float32", "float64", "bfloat16", "float16"))
    threads: int | None = opt(None, "CPU threads for torch", minimum=1, maximum=1024)
    cores: str | None = opt(None, "CPU cores the engine runs on, e.g. 0 or 0-1 or 0,2 (pinned: sched_setaffinity); "
                            "serve puts its HTTP server on the others, as vLLM's CPU build binds its worker and API "
                            "server (default: not pinned)", metavar="LIST")
    speculative: bool = opt(False, "speculative decoding with a draft model")
    draft: str = opt("tiny-draft", "draft model: tiny-draft | a local HF checkpoint dir")

    def __post_init__(self):
        check_options(self)
        if self.cores is not None:
            core_set(self.cores)


def core_set(spec: str) -> set[int]:
    """The cores named by `spec` ("0", "0-1", "0,2-3"), each one this process may run on; ConfigError
    naming the flag otherwise."""
    import os
    allowed = os.sched_getaffinity(0)
    out: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ConfigError(f"cores: expected a list such as 0 or 0-1 or 0,2, got {spec!r}") from None
    if not out or not out <= allowed:
        raise ConfigError(f"cores: {spec!r} names cores this process may not run on (it may use "
                          f"{', '.join(map(str, sorted(allowed)))})")
    return out


def pin(cores: str | None, rest: bool = False) -> None:
    """This process onto `cores` (rest: onto every other core it may use; none left: unchanged)."""
    import os
    if not cores:
        return
    chosen = core_set(cores)
    target = (os.sched_getaffinity(0) - chosen) if rest else chosen
    if target:
        os.sched_setaffinity(0, target)


@dataclass(slots=True)
class ServeOptions:
    """What `serve` builds its engine from (picklable: sent to an engine process)."""
    model: ModelOptions
    engine: EngineConfig
    trace_out: str | None = None
    publish_cache: bool = False      # send the prefix cache's changes (a fleet router's precise knowledge)


def load_model(name: str, device: str, dtype_name: str):
    import torch

    from core.errors import ConfigError
    from gpu_runner import checkpoint
    from gpu_runner.tokenizer import ByteTokenizer
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
    dtype = {"auto": torch.bfloat16 if device == "cuda" else torch.float32, "float32": torch.float32,
             "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    if name == "random-0.5b":  # Llama/Qwen2-shaped, ~0.5B parameters, random weights: realistic step times
        from gpu_runner.model import ModelConfig, Transformer, init_weights
        cfg = ModelConfig(vocab_size=151936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, hidden_dim=4864,
                          max_seq_len=4096, rope_theta=1e6, tie_embeddings=True, qkv_bias=True)
        model = Transformer(cfg)
        init_weights(model, seed=0)
        return model.to(device=device, dtype=dtype).eval(), ByteTokenizer(), device, name
    if name in checkpoint.BUNDLED:
        path = checkpoint.BUNDLED[name]
        if not (path / "model.safetensors").exists():
            raise ConfigError(f"--model {name}: bundled weights missing at {path} (run python -m gpu_runner.train)")
        return checkpoint.load_bundled(path, device, dtype), ByteTokenizer(), device, name
    from gpu_runner.hf import load_hf
    model, tok = load_hf(name, device, dtype)
    return model, tok, device, name


def load_draft(mo: ModelOptions, device, target):
    if not mo.speculative:
        return None, None
    dtype_name = str(next(target.parameters()).dtype).removeprefix("torch.")  # the draft runs in the target's dtype
    model, _, _, name = load_model(mo.draft, device, dtype_name)
    return model, name


def build_engine(mo: ModelOptions, cfg: EngineConfig, adjust=None):
    """The Engine for these options (threads set, model and draft loaded, load time noted);
    `adjust(model, cfg)` may return the options changed once the model is known."""
    import torch

    from gpu_runner.engine import Engine
    pin(mo.cores)          # (before torch starts its threads: they inherit the affinity)
    from core.sim.simulate import reuse_freed_memory
    # (each prefill activation, 2-8 MB, otherwise page-faults fresh memory in: what vLLM's CPU
    # build asks of tcmalloc in LD_PRELOAD, vllm/platforms/cpu.py; docs/benchmarks.md)
    malloc = reuse_freed_memory()
    if mo.threads:
        torch.set_num_threads(mo.threads)
    t_load = time.perf_counter()
    model, tok, device, name = load_model(mo.model, mo.device, mo.dtype)
    load_ms = (time.perf_counter() - t_load) * 1000.0
    draft, draft_name = load_draft(mo, device, model)
    if adjust is not None:
        cfg = adjust(model, cfg)
    engine = Engine(model, tok, cfg, device, name, draft=draft, draft_name=draft_name)
    engine.startup["model_load_ms"] = load_ms
    if malloc:
        engine.startup["malloc"] = "glibc keeps freed memory for reuse (mmap and trim thresholds 1 GiB)"
    return engine


def serve_engine(options: ServeOptions):
    """The Engine `serve` runs: model, draft, KV pool (default: every seat, max_seqs or 32, can
    hold a full-context sequence)."""

    def default_pool(model, cfg):
        sc = cfg.scheduler
        if sc.kv_blocks is not None or cfg.kv_memory_mb is not None:
            return cfg
        per_seq = -(-model.cfg.max_seq_len // sc.block_size)
        return dataclasses.replace(cfg, scheduler=dataclasses.replace(sc, kv_blocks=per_seq * (sc.max_seqs or 32)))
    return build_engine(options.model, options.engine, default_pool)


def engine_service(options: ServeOptions, emit, cls=None):
    """The engine side of `serve` (gpu_runner.serving.EngineService, or its subclass `cls`),
    telling `emit` its outputs."""
    from gpu_runner.serving import EngineService
    return (cls or EngineService)(serve_engine(options), emit, Path(options.trace_out) if options.trace_out else None,
                                  publish_cache=options.publish_cache)

