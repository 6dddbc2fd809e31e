"""KV-cache sizing, model and GPU presets, capacity and paging waste.

KV bytes = 2 (K and V) x L layers x B sequences x T positions x H_kv heads x d_h x b bytes.
GQA/MQA models store H_kv < H_q heads; only the KV heads count.
GiB = 2**30 bytes; GB = 10**9 bytes. They differ by 7.4%; never mix them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from core.errors import ConfigError

GIB = 1 << 30
GB = 10 ** 9
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "int8": 1, "int4": 0.5}


def kv_bytes(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float, tokens: int, seqs: int = 1) -> int:
    for name, v in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                    ("tokens", tokens), ("seqs", seqs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{name}: expected an integer >= 0, got {v!r}")
    if not (isinstance(dtype_bytes, (int, float)) and dtype_bytes > 0):
        raise ConfigError(f"dtype_bytes: expected a positive number, got {dtype_bytes!r}")
    return int(2 * layers * seqs * tokens * kv_heads * head_dim * dtype_bytes)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False         # input embedding shared with the output head
    qkv_bias: bool = False     # Qwen2-style biases on q/k/v projections
    source: str = ""           # where the config numbers come from

    @property
    def params(self) -> int:
        """Parameter count of a Llama-style decoder (embeddings, attention, SwiGLU MLP,
        RMSNorm weights, output head unless tied)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate
        per_layer = attn + mlp + 2 * h
        emb = self.vocab * h
        return emb * (1 if self.tied else 2) + self.layers * per_layer + h

    def weight_bytes(self, dtype_bytes: float = 2) -> int:
        return int(self.params * dtype_bytes)

    def kv_bytes_per_token(self, dtype_bytes: float = 2) -> int:
        return kv_bytes(self.layers, self.kv_heads, self.head_dim, dtype_bytes, 1)


def model_from_hf_config(cfg: dict, name: str | None = None) -> ModelSpec:
    """Read the fields a Hugging Face Llama/Mistral/Qwen2 config.json uses."""
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        spec = ModelSpec(
            name=name or cfg.get("_name_or_path") or cfg.get("model_type", "model"),
            layers=int(cfg["num_hidden_layers"]), hidden=hidden, heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            source="config.json")
    except KeyError as e:
        raise ConfigError(f"config.json: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config.json: a size field is not an integer ({e})") from None
    return spec


def _m(name, L, h, H, kv, inter, vocab, tied=False, bias=False, hd=None, src=""):
    return ModelSpec(name, L, h, H, kv, hd or h // H, inter, vocab, tied, bias, src)


# Numbers from each model's published config.json.
MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    _m("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, src="meta-llama/Llama-2-7b-hf config.json"),
    _m("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000, src="meta-llama/Llama-2-13b-hf config.json"),
    _m("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, src="meta-llama/Llama-2-70b-hf config.json"),
    _m("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, src="meta-llama/Meta-Llama-3-8B config.json"),
    _m("Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256, src="meta-llama/Llama-3.1-70B config.json"),
    _m("Mistral-7B", 32, 4096, 32, 8, 14336, 32000, src="mistralai/Mistral-7B-v0.1 config.json"),
    _m("Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, bias=True, src="Qwen/Qwen2.5-7B config.json"),
    _m("Qwen2.5-0.5B", 24, 896, 14, 2, 4864, 151936, tied=True, bias=True, src="Qwen/Qwen2.5-0.5B config.json"),
]}


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    memory_gb: float          # marketed capacity (decimal GB as printed on the datasheet)
    bandwidth_gbps: float     # peak memory bandwidth, GB/s
    tflops_16: float          # peak dense FP16/BF16 tensor throughput, TFLOP/s (no sparsity)
    source: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GB)

    @property
    def bandwidth_Bps(self) -> float:
        return self.bandwidth_gbps * 1e9

    @property
    def flops(self) -> float:
        return self.tflops_16 * 1e12

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from bandwidth- to compute-bound."""
        return self.flops / self.bandwidth_Bps


# Vendor datasheet peaks (dense, no structured sparsity). Real kernels reach less.
GPUS: dict[str, GPUSpec] = {g.name: g for g in [
    GPUSpec("T4", 16, 320, 65, "NVIDIA T4 datasheet"),
    GPUSpec("A10G", 24, 600, 70, "AWS G5 (A10G) documentation; approximate tensor peak"),
    GPUSpec("L40", 48, 864, 181, "NVIDIA L40 datasheet"),
    GPUSpec("A100-40GB", 40, 1555, 312, "NVIDIA A100 datasheet (SXM)"),
    GPUSpec("A100-80GB", 80, 2039, 312, "NVIDIA A100 datasheet (SXM)"),
    GPUSpec("H100-SXM", 80, 3350, 989, "NVIDIA H100 datasheet (SXM)"),
    GPUSpec("H200", 141, 4800, 989, "NVIDIA H200 datasheet (SXM)"),
    GPUSpec("Chapter 2 TB/s", 80, 2000, 312, "the chapter's assumed 2 TB/s bandwidth"),
]}


def capacity(memory_bytes: int, weight_bytes: int, kv_bytes_per_seq: int, reserved_bytes: int = 0) -> int:
    """Whole sequences whose KV fits beside the weights (and any reserved workspace)."""
    if kv_bytes_per_seq <= 0:
        raise ConfigError("kv bytes per sequence must be positive")
    room = memory_bytes - weight_bytes - reserved_bytes
    return max(0, room // kv_bytes_per_seq)


def fmt_bytes(n: float) -> str:
    """Binary and decimal side by side, in the largest unit that keeps the value >= 1:
    '1.000 GiB (1.074 GB)', '512.000 KiB (524.288 kB)'."""
    units = [(2**40, "TiB", 10**12, "TB"), (GIB, "GiB", GB, "GB"), (2**20, "MiB", 10**6, "MB"),
             (2**10, "KiB", 10**3, "kB")]
    for b, bn, d, dn in units:
        if abs(n) >= b:
            return f"{n / b:,.3f} {bn} ({n / d:,.3f} {dn})"
    return f"{n:,.0f} B"


@dataclass(frozen=True, slots=True)
class Reservation:
    tokens: int              # tokens actually stored
    paged_slots: int         # slots held by paged allocation (whole blocks)
    contiguous_slots: int    # slots held by reserving max_len per sequence

    @property
    def paged_waste(self) -> int:
        return self.paged_slots - self.tokens

    @property
    def contiguous_waste(self) -> int:
        return self.contiguous_slots - self.tokens

    @property
    def paged_waste_frac(self) -> float:
        return self.paged_waste / self.paged_slots if self.paged_slots else 0.0

    @property
    def contiguous_waste_frac(self) -> float:
        return self.contiguous_waste / self.contiguous_slots if self.contiguous_slots else 0.0


def reservation(lengths, block_size: int, max_len: int) -> Reservation:
    """Slots held for sequences of the given current lengths: paged (last block partly
    empty) vs contiguous (each sequence reserves max_len up front)."""
    lengths = [int(x) for x in lengths]
    if any(x > max_len for x in lengths):
        raise ConfigError(f"max_len {max_len} is shorter than a sequence ({max(lengths)} tokens)")
    paged = sum(math.ceil(x / block_size) * block_size for x in lengths)
    return Reservation(sum(lengths), paged, max_len * len(lengths))
