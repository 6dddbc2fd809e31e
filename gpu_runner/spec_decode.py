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
so the scheduler's allocation and rollback (KVCacheManager.truncate) serve both.
"""
from __future__ import annotations

import torch

from core.trace import TOKEN_SOURCES
from gpu_runner.batching import attend_with, forward, pack
from gpu_runner.sampling import sample

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

    def __init__(self, model, cache, attention, weights=None):
        self.model = model
        self.cache = cache
        self.attend = attend_with(attention, cache)
        self.weights = weights    # callable: the draft's current OneDNNWeights, or None
        self.valid: dict[int, int] = {}   # request -> positions 0..valid-1 hold draft KV

    def forward(self, entries, device):
        """entries: (token ids, first position, slots of positions 0..end) per request;
        returns the draft logits at each entry's last token: [len(entries), V]."""
        packed = pack(entries, device)
        w = None if self.weights is None else self.weights()
        return self.model.logits(forward(self.model, packed, self.cache, self.attend, w, rows=packed.last_rows()), w)

    def propose(self, reqs, token_ids, spec, starts, gammas, slots, gens, sp, device):
        """Draft gammas[j] tokens for each batch entry j in `spec` (reqs[j]: its request;
        token_ids[j]: the request's known ids; starts[j]: position of its last emitted token).
        First the draft's cache catches up to that token, then one token per draft step.
        Returns ({j: proposals}, {j: draft distributions per proposal (None when greedy)})."""
        for j in spec:  # the draft's KV is valid at most as far as the target's (preemption resets)
            self.valid[reqs[j]] = min(self.valid.get(reqs[j], 0), starts[j])
        props = {j: [] for j in spec}
        qdist = {j: [] for j in spec}
        active = list(spec)
        step = 0
        while active:
            entries = []
            for j in active:
                p = starts[j]
                if step == 0:
                    v = self.valid[reqs[j]]
                    entries.append((token_ids[j][v:p + 1], v, slots[j]))
                else:
                    entries.append(([props[j][-1]], p + step, slots[j]))
            picked, probs = sample(self.forward(entries, device), [gens[j] for j in active], sp)
            for k, j in enumerate(active):
                props[j].append(picked[k])
                qdist[j].append(probs[k] if probs is not None else None)
            step += 1
            active = [j for j in active if len(props[j]) < gammas[j]]
        for j in spec:
            self.valid[reqs[j]] = starts[j] + gammas[j]
        return props, qdist

    def rejected_after(self, req: int, start: int, accepted: int):
        """Verification accepted `accepted` proposals: draft KV past them is stale."""
        self.valid[req] = min(self.valid[req], start + accepted + 1)
