"""Speculative decoding in the engine: a draft model proposes up to gamma tokens per decoding
request, the target verifies them all in the same batched forward, and exact rejection
sampling decides what is emitted (Leviathan et al. 2023; Chen et al. 2023):

- accept draft token x with probability min(1, p(x) / q(x)), u ~ U(0, 1) from the request's
  own generator;
- at the first rejection, emit y ~ normalize(max(p - q, 0)) ("recovered") and stop;
- if all are accepted, emit one more token y ~ p at the next position ("bonus").
Greedy decoding accepts while the draft token equals the target's argmax, and emits the
target's argmax at the first mismatch (or as the bonus), so it equals plain greedy output.
p and q are the target's and draft's distributions after the same temperature/top-k/top-p.

The draft keeps its own paged KV cache with the SAME block tables and slots as the target,
so the scheduler's allocation and rollback (BlockManager.truncate) serve both.
"""
from __future__ import annotations

import torch

from core.trace import TOKEN_SOURCES

SAMPLED, ACCEPTED, RECOVERED, BONUS = (TOKEN_SOURCES.index(s) for s in ("sampled", "accepted", "recovered", "bonus"))


def verify(p_probs, q_probs, proposals: list[int], gen: torch.Generator | None, greedy: bool, wrong: bool = False):
    """p_probs: [g+1, V] target distributions at the g+1 verified positions; q_probs: [g, V]
    draft distributions of the g proposals. Returns (tokens, sources, positions) where
    positions lists {"p", "q", "u", "accepted"} for each evaluated proposal. `wrong`
    resamples a rejection from p instead of the residual (the classic mistake; tests only)."""
    out, src, pos = [], [], []
    for i, x in enumerate(proposals):
        px, qx = float(p_probs[i, x]), float(q_probs[i, x])
        if greedy:
            u = None
            ok = int(p_probs[i].argmax()) == x
        else:
            u = float(torch.rand((), generator=gen, device=p_probs.device))
            ok = u < min(1.0, px / qx) if qx > 0 else True
        pos.append({"p": px, "q": qx, "u": u, "accepted": bool(ok)})
        if ok:
            out.append(x)
            src.append(ACCEPTED)
            continue
        if greedy:
            y = int(p_probs[i].argmax())
        else:
            r = p_probs[i] if wrong else torch.clamp(p_probs[i] - q_probs[i], min=0)
            y = int(torch.multinomial(r / r.sum(), 1, generator=gen))
        out.append(y)
        src.append(RECOVERED)
        return out, src, pos
    last = p_probs[len(proposals)]
    y = int(last.argmax()) if greedy else int(torch.multinomial(last, 1, generator=gen))
    out.append(y)
    src.append(BONUS)
    return out, src, pos


class DraftRunner:
    """The draft model, its paged cache (sharing the target's block tables), and how far each
    request's draft KV is valid."""

    def __init__(self, model, cache, attention):
        self.model = model
        self.cache = cache
        self.attention = attention
        self.valid: dict[int, int] = {}   # request -> positions 0..valid-1 hold draft KV

    def forward(self, entries, device):
        """entries: (token ids, first position, slots of positions 0..end) per request;
        returns the draft logits at each entry's last token."""
        from gpu_runner.kernels.reference import Chunk
        toks, pos, slots, chunks, row = [], [], [], [], 0
        for ids, start, all_slots in entries:
            n = len(ids)
            toks += ids
            pos += range(start, start + n)
            slots += all_slots[start:start + n]
            chunks.append(Chunk(row, n, start, torch.tensor(all_slots[:start + n], device=device)))
            row += n
        c = self.cache
        h = self.model.forward_paged(torch.tensor(toks, device=device), torch.tensor(pos, device=device),
                                     torch.tensor(slots, device=device), chunks, c,
                                     lambda q, li, ch: self.attention(q, c.k[li], c.v[li], ch))
        last = torch.tensor([ch.row + ch.n - 1 for ch in chunks], device=device)
        return self.model.logits(h[last])
