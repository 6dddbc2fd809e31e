"""Packing one step's work into the model's input: every scheduled chunk of every request
is concatenated into flat [N] token / position / slot tensors, with one `Chunk` per request
saying where its queries sit and which cache slots hold its context.

A request's position p lives at slot table[p // block_size] * block_size + p % block_size
of the paged cache (its block table lists physical blocks in logical order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gpu_runner.kernels.reference import Chunk, StepChunks


def slots_of(table: list[int], length: int, block_size: int) -> np.ndarray:
    """Slot id of each position 0..length-1 of a sequence with this block table: [length]."""
    p = np.arange(length)
    return np.asarray(table, dtype=np.int64)[p // block_size] * block_size + p % block_size


@dataclass
class Packed:
    tokens: torch.Tensor      # [N] token ids of every new position, chunk after chunk
    positions: torch.Tensor   # [N]
    slots: torch.Tensor       # [N] where each new position's K/V is written
    chunks: list[Chunk]       # per entry: rows, start, slots of positions 0..start+n-1

    def last_rows(self, which=None) -> torch.Tensor:
        """Row of each chosen chunk's last query (its next-token logits): [len(which)]."""
        cs = self.chunks if which is None else [self.chunks[j] for j in which]
        return torch.tensor([c.row + c.n - 1 for c in cs], device=self.tokens.device)


def pack(entries, device) -> Packed:
    """entries: (new token ids, first new position, slots of positions 0..>= end) per request."""
    toks, pos, slots, chunks, row = [], [], [], [], 0
    for ids, start, all_slots in entries:
        n = len(ids)
        end = start + n
        toks += ids
        pos += range(start, end)
        slots.append(all_slots[start:end])
        chunks.append(Chunk(row, n, start, torch.as_tensor(all_slots[:end], device=device)))
        row += n
    flat = np.concatenate(slots) if slots else np.empty(0, dtype=np.int64)
    return Packed(torch.tensor(toks, device=device), torch.tensor(pos, device=device),
                  torch.as_tensor(flat, device=device), StepChunks(chunks))


def attend_with(attention, cache):
    """The model's per-layer attention callback for a kernel and a paged cache."""
    return lambda q, li, chunks: attention(q, cache.k[li], cache.v[li], chunks)


def forward(model, packed: Packed, cache, attend, weights=None, rows=None):
    """Run `model` over a packed step against `cache`; attend(q, layer, chunks) -> [N, H, hd];
    weights: None or the model's gpu_runner.onednn.OneDNNWeights. Returns hidden states [N, D],
    or with `rows` (an index tensor) those rows' only (the model's forward_paged)."""
    return model.forward_paged(packed.tokens, packed.positions, packed.slots, packed.chunks, cache, attend, weights,
                               rows=rows)
