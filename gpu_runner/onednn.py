"""The model's linear layers on oneDNN with weights packed once (CPU, float32): the runner's
`--matmul onednn` (the default on CPU, `auto`).

torch.nn.functional.linear hands each call to a BLAS that lays the weight out for its kernel
again on every call; for the tiny model's [16, 256] x [256, 704] decode product that is most
of the 87 µs it takes. Packing each weight once into oneDNN's blocked layout (what vLLM's CPU
backend and torch.compile's CPU freezing do) and fusing q/k/v into one product and gate/up into
another cuts the step's linear time (bench/step_overhead.py, docs/benchmarks.md). oneDNN's
result for a row does not depend on the other rows of the batch (checked in
tests/test_runner.py), so greedy outputs do not depend on how requests are batched; they can
differ from torch's in the last bits of float32 (different summation order).

The packed copies follow the weights: any change to a parameter (an optimiser step, a
copy_) is noticed by its version counter and the weights are packed again.
"""
from __future__ import annotations

import torch


def available(model) -> bool:
    """oneDNN can run this model's linears: a CPU float32 model and torch built with it."""
    p = next(model.parameters())
    return p.device.type == "cpu" and p.dtype == torch.float32 and torch.backends.mkldnn.is_available()


def _pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), None)


def _linear(x, packed, bias):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class OneDNNWeights:
    """Packed, fused weights of a gpu_runner.model.Transformer: per layer q|k|v (one product,
    then split), o, gate|up (one product), down; and the output head."""

    def __init__(self, model):
        self.model = model
        self._pack_all()

    def _stamp(self):
        # (the packed parameters, listed once at packing: walking the module tree for them took
        # ~0.25 ms of every 4.75 ms decode step. A parameter replaced by another object, rather
        # than changed in place or given new data, needs OneDNNWeights(model) anew)
        return tuple((p.data_ptr(), p._version) for p in self._sources)

    def _pack_all(self):
        m, cfg = self.model, self.model.cfg
        hd = cfg.head_dim
        self.split = (cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd)
        self.layers = []
        with torch.no_grad():
            for layer in m.layers:
                a, mlp = layer.self_attn, layer.mlp
                qkv_b = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
                self.layers.append((
                    _pack(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])), qkv_b,
                    _pack(a.o_proj.weight),
                    _pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                    _pack(mlp.down_proj.weight)))
            self.head = _pack(m.lm_head.weight)
        self._sources = [p for layer in m.layers for mod in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                             layer.self_attn.v_proj, layer.self_attn.o_proj,
                                                             layer.mlp.gate_proj, layer.mlp.up_proj,
                                                             layer.mlp.down_proj)
                         for p in mod.parameters()] + [m.lm_head.weight]
        self.stamp = self._stamp()

    def fresh(self) -> OneDNNWeights:
        """Itself, packed again first if any parameter changed since it was packed."""
        if self._stamp() != self.stamp:
            self._pack_all()
        return self

    def rope_tables(self, cos, sin):
        """The step's rotary tables for qkv(): cos and a sign-folded sin, [N, heads of q and
        k, hd], laid out once per step (every layer uses them) so the products are not
        broadcast. With rot = (-x2, x1): rot * sin == roll(x, hd/2) * (-sin1, sin2), exactly."""
        cfg = self.model.cfg
        N, hd, heads = cos.shape[0], cfg.head_dim, cfg.n_heads + cfg.n_kv_heads
        h = hd // 2
        signed = torch.cat([-sin[:, :h], sin[:, h:]], dim=-1)
        return (cos[:, None, :].expand(N, heads, hd).contiguous(), signed[:, None, :].expand(N, heads, hd).contiguous())

    def qkv(self, li: int, x, cos, sin):
        """x [N, dim] -> q [N, H, hd], k/v [N, Hkv, hd], rotary applied (as Attention.qkv);
        cos, sin: from rope_tables()."""
        cfg = self.model.cfg
        w, b = self.layers[li][0], self.layers[li][1]
        y = _linear(x, w, b)
        N, H, qk = x.shape[0], cfg.n_heads, self.split[0] + self.split[1]
        # q and k are adjacent columns: one rotary pass over both (the same elementwise math)
        x_qk = y[:, :qk].view(N, H + cfg.n_kv_heads, cfg.head_dim)
        qk_rot = x_qk * cos + x_qk.roll(cfg.head_dim // 2, -1) * sin
        return qk_rot[:, :H], qk_rot[:, H:], y[:, qk:].view(N, cfg.n_kv_heads, cfg.head_dim)

    def o(self, li: int, x):
        return _linear(x, self.layers[li][2], None)

    def mlp(self, li: int, x):
        """SwiGLU: down(silu(gate(x)) * up(x)), gate and up in one product."""
        gate, up = _linear(x, self.layers[li][3], None).chunk(2, dim=-1)
        return _linear(torch.nn.functional.silu(gate) * up, self.layers[li][4], None)

    def logits(self, hidden):
        return _linear(hidden, self.head, None)
