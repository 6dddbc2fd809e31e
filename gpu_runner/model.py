"""A Llama-style decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU) that
runs either on plain [B, T] batches (training, references) or on a packed batch of
variable-length chunks against a paged KV cache (the engine).

Weight names and the rotary convention (rotate-half) follow Hugging Face's Llama/Qwen2, so
local checkpoints load directly (see hf.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.config import check_options, opt
from core.errors import ConfigError


@dataclass
class ModelConfig:
    vocab_size: int = opt(258, "bytes 0-255, BOS 256, EOS 257", minimum=1)
    dim: int = opt(256, "model width", minimum=1)
    n_layers: int = opt(4, "decoder layers", minimum=1)
    n_heads: int = opt(8, "query heads", minimum=1)
    n_kv_heads: int = opt(2, "key/value heads (GQA: n_heads % n_kv_heads == 0)", minimum=1)
    head_dim: int | None = opt(None, "default dim // n_heads", minimum=1)
    hidden_dim: int = opt(704, "SwiGLU inner width", minimum=1)
    max_seq_len: int = opt(2048, "rotary table length", minimum=1)
    rope_theta: float = opt(10000.0, "rotary base", above=0)
    norm_eps: float = opt(1e-5, "RMSNorm epsilon", minimum=0)
    tie_embeddings: bool = opt(True, "output head shares the input embedding")
    qkv_bias: bool = opt(False, "Qwen2 puts biases on q/k/v")

    def __post_init__(self):
        # Bad shapes are input errors (a checkpoint's config), reported with the field names
        # before any tensor is allocated.
        try:
            check_options(self)
        except ConfigError as e:
            raise ConfigError(f"model config: {e}") from None
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model config: n_heads ({self.n_heads}) must be a multiple of "
                              f"n_kv_heads ({self.n_kv_heads})")
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ConfigError(f"model config: dim ({self.dim}) must be a multiple of n_heads ({self.n_heads}) "
                                  "when head_dim is not given")
            self.head_dim = self.dim // self.n_heads
        if self.head_dim % 2:
            raise ConfigError(f"model config: head_dim ({self.head_dim}) must be even (rotary positions)")

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope_tables(cfg: ModelConfig, device=None, dtype=torch.float32):
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    t = torch.arange(cfg.max_seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv)                                  # [S, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)                      # [S, hd] (rotate-half layout)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def apply_rope(x, cos, sin):
    # x: [..., hd]; cos/sin broadcast to it. rotate_half: (x1, x2) -> (-x2, x1)
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def qkv(self, x, cos, sin):
        # x: [N, dim] (packed tokens) -> q [N, H, hd], k/v [N, Hkv, hd], rotary applied
        N = x.shape[0]
        cfg = self.cfg
        q = self.q_proj(x).view(N, cfg.n_heads, cfg.head_dim)
        k = self.k_proj(x).view(N, cfg.n_kv_heads, cfg.head_dim)
        v = self.v_proj(x).view(N, cfg.n_kv_heads, cfg.head_dim)
        return apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None]), v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- plain batches: training and reference -------------------------------------------
    def forward(self, tokens):
        """tokens: [B, T] -> logits [B, T, V], full causal attention (no cache)."""
        B, T = tokens.shape
        cfg = self.cfg
        x = self.embed_tokens(tokens)                                    # [B, T, D]
        cos, sin = self.rope_cos[:T].to(x.dtype), self.rope_sin[:T].to(x.dtype)
        for layer in self.layers:
            a = layer.self_attn
            h = layer.input_layernorm(x).reshape(B * T, -1)
            q, k, v = a.qkv(h, cos.repeat(B, 1), sin.repeat(B, 1))
            q = q.view(B, T, cfg.n_heads, -1).transpose(1, 2)            # [B, H, T, hd]
            k = k.view(B, T, cfg.n_kv_heads, -1).transpose(1, 2)
            v = v.view(B, T, cfg.n_kv_heads, -1).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.norm(x))

    # ---- packed chunks against a paged KV cache ----------------------------------------------
    def forward_paged(self, tokens, positions, slots, seqs, cache, attention, weights=None, rows=None):
        """One engine step.
        tokens, positions, slots: [N] (all chunks packed; slot = block * block_size + offset,
        where each new token's K/V is written); seqs: per chunk (start, n_new, context_len,
        block_table tensor); cache: PagedKVCache; attention(q, layer, seqs) -> [N, H, hd]
        reads K/V through the block tables; weights: None (the modules' own linears) or a
        gpu_runner.onednn.OneDNNWeights of this model. Returns hidden states [N, D] (final
        norm applied), or with `rows` (a [R] index tensor) those rows' only, [R, D].

        With `rows` and oneDNN's linears (`weights`), the last layer writes every token's K/V
        and attends for every token as without, then runs its output projection, MLP and the
        final norm on the chosen rows only: a prefill of 16 x 128 tokens needs 16 rows' hidden
        states (their next-token logits), and the rest of the last layer is most of a layer's
        work. Each row's result is what it is without `rows`, bit for bit (oneDNN's products,
        the norms and the residual adds compute each row on its own; tests/test_runner.py).
        torch's linears can round a row differently in a batch of another size, so with them
        every row is computed and the chosen ones returned."""
        x = self.embed_tokens(tokens)                                    # [N, D]
        cos, sin = self.rope_cos[positions].to(x.dtype), self.rope_sin[positions].to(x.dtype)
        if weights is not None:
            cos, sin = weights.rope_tables(cos, sin)
        # (the rows cut before the last layer's output projection where its linears are oneDNN's,
        # whose rows are computed each on its own; torch's linears are not, so there after the norm)
        cut = len(self.layers) - 1 if weights is not None and rows is not None else None
        for li, layer in enumerate(self.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = a.qkv(h, cos, sin) if weights is None else weights.qkv(li, h, cos, sin)
            cache.write(li, slots, k, v)
            if li == cut and len(rows) == 0:
                return x[:0]                                             # (K/V written; no row wanted)
            o = attention(q, li, seqs)                                   # [N, H, hd]
            o = o.reshape(o.shape[0], -1)
            if li == cut:
                o, x = o[rows], x[rows]
            x = x + (a.o_proj(o) if weights is None else weights.o(li, o))
            h = layer.post_attention_layernorm(x)
            x = x + (layer.mlp(h) if weights is None else weights.mlp(li, h))
        return self.norm(x) if cut is not None or rows is None else self.norm(x)[rows]

    def logits(self, hidden, weights=None):
        return self.lm_head(hidden) if weights is None else weights.logits(hidden)


def init_weights(model: Transformer, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * model.cfg.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) \
                else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)
        elif "norm" in name:
            nn.init.ones_(p)
        else:
            nn.init.zeros_(p)
