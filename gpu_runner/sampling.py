"""Turning logits into tokens, the same way for the target, the draft and every request:
temperature, then top-k, then top-p (nucleus), then a draw from the request's own
generator (seeded from the run's seed and the request id, so a request's samples do not
depend on what else shares its batch). Temperature 0 is greedy (argmax)."""
from __future__ import annotations

import zlib

import torch

from core.config import SamplingParams


def filtered_probs(logits, sp: SamplingParams):
    """Softmax after temperature, top-k and top-p: [..., V]. The largest logit is subtracted
    first, so a small temperature sends the others to -inf, never the maximum to inf."""
    logits = logits.float()
    logits = (logits - logits.max(-1, keepdim=True).values) / sp.temperature
    if sp.top_k and sp.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < sp.top_p      # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def request_generator(seed: int, rid: str, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(rid.encode())) % (2**63))
    return g


def sample(logits, gens: list, sp: SamplingParams) -> tuple[list[int], torch.Tensor | None]:
    """One token per row of logits [R, V]; gens[k] is row k's request generator.
    Returns (token ids, the filtered distributions [R, V] or None when greedy)."""
    if sp.temperature == 0:
        return logits.argmax(-1).tolist(), None
    probs = filtered_probs(logits, sp)
    return [int(torch.multinomial(probs[k], 1, generator=g).item()) for k, g in enumerate(gens)], probs
