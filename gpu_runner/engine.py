"""The step loop: ask core.scheduler for a batch, run one forward pass over all scheduled
tokens against the paged KV cache, sample, hand the tokens back to the scheduler.

There is no scheduling logic here: admission, chunking, KV blocks, prefix hits and
preemption all come from core.scheduler / core.paging, exactly as in the simulator. The
engine only turns the scheduler's batch into tensors and the model's logits into tokens,
and stamps times with one clock (time.perf_counter_ns) after tokens reach the host.
"""
from __future__ import annotations

import datetime as _dt
import platform
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from core.errors import ConfigError
from core.scheduler import Scheduler, SchedulerConfig, StepLog
from core.trace import Trace, trace_from_log
from core.workload import Request, Workload
from gpu_runner.kernels.reference import Chunk, paged_attention
from gpu_runner.model import Transformer

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "pydoc_topics.txt"


@dataclass
class SamplingParams:
    temperature: float = 0.0       # 0 = greedy
    top_k: int = 0                 # 0 = off
    top_p: float = 1.0             # 1 = off
    seed: int = 0                  # per-request generators derive from it

    def __post_init__(self):
        if not (self.temperature >= 0):
            raise ConfigError(f"temperature: expected a number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k: expected an integer >= 0, got {self.top_k}")
        if not (0 < self.top_p <= 1):
            raise ConfigError(f"top_p: expected a number in (0, 1], got {self.top_p}")


class PagedKVCache:
    """Per layer K and V: [num_blocks, block_size, kv_heads, head_dim]."""

    def __init__(self, n_layers, num_blocks, block_size, kv_heads, head_dim, device, dtype):
        shape = (n_layers, num_blocks, block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.block_size = block_size

    def write(self, layer, slots, k, v):
        kf = self.k[layer].view(-1, k.shape[1], k.shape[2])
        vf = self.v[layer].view(-1, v.shape[1], v.shape[2])
        kf[slots] = k
        vf[slots] = v

    @staticmethod
    def bytes_per_block(cfg, block_size: int, dtype) -> int:
        return 2 * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * torch.tensor([], dtype=dtype).element_size()


def filtered_probs(logits, sp: SamplingParams):
    """Softmax after temperature, top-k and top-p (the same policy for target and draft)."""
    logits = logits.float() / sp.temperature
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


def prepare_workload(workload: Workload, tokenizer, vocab_size: int) -> tuple[Workload, list[str]]:
    """Every request needs token ids: ids outside the vocabulary are folded (id mod 256 for
    the byte tokenizer, mod vocab otherwise) so identical prefixes stay identical; requests
    given only as counts get corpus text (a deterministic slice chosen by request id)."""
    notes = []
    corpus = None
    out = []
    folded = filled = 0
    mod = 256 if vocab_size == 258 else vocab_size
    for r in workload.requests:
        ids = r.prompt_ids
        if ids is not None and max(ids) >= mod:
            ids = tuple(i % mod for i in ids)
            folded += 1
        if ids is None:
            if corpus is None:
                corpus = tokenizer.encode(CORPUS.read_text())
            start = zlib.crc32(r.id.encode()) % max(1, len(corpus) - r.prompt_tokens)
            ids = tuple(corpus[start:start + r.prompt_tokens])
            filled += 1
        out.append(Request(r.id, r.arrival_ms, r.prompt_tokens, r.output_tokens, ids, r.tenant, r.abort_at_ms,
                           dict(r.extra)))
    if folded:
        notes.append(f"{folded} prompt(s) had token ids beyond the model's vocabulary; folded mod {mod}")
    if filled:
        notes.append(f"{filled} prompt(s) given as token counts were filled with corpus text")
    return Workload(out, name=workload.name), notes


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


@dataclass
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    kv_blocks: int | None = None         # KV pool size in blocks (None: from memory budget or enough for all)
    kv_memory_bytes: int | None = None   # alternative: size the pool from a byte budget
    attention: str = "torch"             # torch | triton
    record: bool = True                  # write trace events (off: only the generated tokens)
    gamma: int = 4                       # speculative decoding: draft tokens per verification (with a draft)
    capture_tiles: tuple[int, int] | None = None  # (layer, head): record per-tile (m, l) (triton attention only)


class Engine:
    def __init__(self, model: Transformer, tokenizer, cfg: EngineConfig, device="cpu", model_name="tiny",
                 draft: Transformer | None = None, draft_name: str | None = None):
        self.model = model
        self.draft = draft
        self.draft_name = draft_name
        if draft is not None:
            if draft.cfg.vocab_size != model.cfg.vocab_size:
                raise ConfigError(f"draft: vocabulary size {draft.cfg.vocab_size} differs from the target's "
                                  f"{model.cfg.vocab_size} (the draft must share the tokenizer)")
            if cfg.gamma < 1:
                raise ConfigError(f"gamma: expected an integer >= 1, got {cfg.gamma}")
        self.tok = tokenizer
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        self.model_name = model_name
        if cfg.attention not in ("torch", "triton"):
            raise ConfigError(f"attention: expected torch or triton, got {cfg.attention!r}")
        self.attention = paged_attention
        if cfg.attention == "triton":
            from gpu_runner.kernels.triton_attention import paged_attention_triton
            self.attention = paged_attention_triton
        if cfg.capture_tiles is not None:
            if cfg.attention != "triton":
                raise ConfigError("capture_tiles: per-tile statistics come from the Triton kernel; use attention=triton")
            layer, head = cfg.capture_tiles
            if not (0 <= layer < model.cfg.n_layers and 0 <= head < model.cfg.n_heads):
                raise ConfigError(f"capture_tiles: layer {layer} / head {head} out of range "
                                  f"({model.cfg.n_layers} layers, {model.cfg.n_heads} heads)")
        self._tile_buf: list = []

    def _pool_blocks(self, sched_cfg: SchedulerConfig) -> int | None:
        c = self.cfg
        if c.kv_blocks is not None:
            return c.kv_blocks
        if c.kv_memory_bytes is not None:
            per = PagedKVCache.bytes_per_block(self.model.cfg, sched_cfg.block_size, self.dtype)
            n = c.kv_memory_bytes // per
            if n < 1:
                raise ConfigError(f"kv memory: {c.kv_memory_bytes} bytes is less than one block ({per} bytes)")
            return int(n)
        return sched_cfg.kv_blocks

    @torch.inference_mode()
    def run(self, workload: Workload, progress=None, on_step=None) -> tuple[Trace | None, dict[str, list[int]]]:
        """Serve the workload; returns (measured trace or None when recording is off,
        generated token ids per request id)."""
        m = self.model
        wl, notes = prepare_workload(workload, self.tok, m.cfg.vocab_size)
        too_long = [r.id for r in wl.requests if r.prompt_tokens + r.output_tokens > m.cfg.max_seq_len]
        if too_long:
            raise ConfigError(f"request {too_long[0]!r}: prompt + output exceeds the model's "
                              f"{m.cfg.max_seq_len} positions")
        sc = self.cfg.scheduler
        sched_cfg = SchedulerConfig(**{**asdict(sc), "kv_blocks": self._pool_blocks(sc),
                                       "model_id": self.model_name,
                                       "spec_gamma": self.cfg.gamma if self.draft is not None else 0})
        log = StepLog() if self.cfg.record else None
        sched = Scheduler(wl, sched_cfg, log)
        bs = sched_cfg.block_size
        cache = PagedKVCache(m.cfg.n_layers, sched.bm.num_blocks, bs, m.cfg.n_kv_heads, m.cfg.head_dim,
                             self.device, self.dtype)
        sp = self.cfg.sampling
        gens = {i: request_generator(sp.seed, r.id, self.device) for i, r in enumerate(wl.requests)}
        drafter = None
        if self.draft is not None:
            from gpu_runner.speculative import DraftRunner
            d = self.draft.cfg
            drafter = DraftRunner(self.draft, PagedKVCache(d.n_layers, sched.bm.num_blocks, bs, d.n_kv_heads,
                                                           d.head_dim, self.device, self.dtype), self.attention)
        eos = getattr(self.tok, "eos_id", None)
        first_arrival = wl.requests[0].arrival_ms
        self.ids = [r.id for r in wl.requests]
        t0 = time.perf_counter_ns()
        now = (lambda: first_arrival + (time.perf_counter_ns() - t0) / 1e6)
        tokens_out = 0
        total_out = sum(r.output_tokens for r in wl.requests)
        # Requests arrive on the wall clock: the capture starts at the first arrival and an idle
        # engine sleeps until the next one.
        while not sched.done():
            t = now()
            sched.admit_arrivals(t)
            batch = sched.schedule(t)
            if batch is None:
                nxt = sched.next_event_ms()
                if nxt is None:
                    break
                time.sleep(max(0.0, (nxt - now()) / 1000.0))
                continue
            emits = self._emits(sched, batch)
            if drafter is not None:
                new, src, events = self._forward_spec(sched, batch, cache, drafter, emits, gens, sp)
                t_end = now()                                          # tokens are on the host now
                for e in events:
                    e["t_ms"] = t_end
                if self.cfg.capture_tiles is not None:
                    events += self._tile_events(batch, batch.t_ms)
                sched.complete_spec(batch, t_end, new, src, events if log is not None else None)
                tokens_out += sum(len(t) for t in new)
                if progress is not None:
                    progress(tokens_out, total_out)
                continue
            ids = self._forward(sched, batch, cache, emits, gens, sp)  # host list, -1 where nothing emits
            t_end = now()                                              # tokens are on the host now
            if self.cfg.capture_tiles is not None and log is not None:
                log.other.extend(self._tile_events(batch, batch.t_ms))
            stopped = {int(r) for r, i in zip(batch.reqs.tolist(), ids) if eos is not None and i == eos}
            er = sched.complete(batch, t_end, token_ids=np.array(ids, dtype=np.int64), stopped=stopped or None)
            tokens_out += len(er)
            if progress is not None:
                progress(tokens_out, total_out)
            if on_step is not None:
                on_step(sched, batch)
        outputs = {r.id: list(sched.token_ids[i][r.prompt_tokens:]) for i, r in enumerate(wl.requests)}
        self.last_scheduler = sched
        if log is None:
            return None, outputs
        meta = self._meta(wl, sched_cfg, notes)
        tr = trace_from_log(wl, log, meta)
        return tr, outputs

    @staticmethod
    def _emits(sched, batch) -> np.ndarray:
        r = batch.reqs
        return batch.start_pos + batch.num_tokens == sched.prompt_len[r] + sched.emitted[r]

    def _forward(self, sched, batch, cache, emits, gens, sp) -> list[int]:
        bs = sched.cfg.block_size
        toks, pos, slots, chunks = [], [], [], []
        row = 0
        for r, start, n in zip(batch.reqs.tolist(), batch.start_pos.tolist(), batch.num_tokens.tolist()):
            ids = sched.token_ids[r]
            table = sched.bm.tables[r]
            all_slots = [table[p // bs] * bs + p % bs for p in range(start + n)]
            toks.extend(ids[start:start + n])
            pos.extend(range(start, start + n))
            slots.extend(all_slots[start:])
            chunks.append(Chunk(row, n, start, torch.tensor(all_slots, device=self.device)))
            row += n
        dev = self.device
        hidden = self.model.forward_paged(torch.tensor(toks, device=dev), torch.tensor(pos, device=dev),
                                          torch.tensor(slots, device=dev), chunks, cache, self._attend(cache))
        last_rows = [c.row + c.n - 1 for c, e in zip(chunks, emits.tolist()) if e]
        out = [-1] * len(chunks)
        if not last_rows:
            return out
        logits = self.model.logits(hidden[torch.tensor(last_rows, device=dev)])
        if sp.temperature == 0:
            picked = logits.argmax(-1).tolist()
        else:
            probs = filtered_probs(logits, sp)
            reqs = [r for r, e in zip(batch.reqs.tolist(), emits.tolist()) if e]
            picked = [int(torch.multinomial(probs[k], 1, generator=gens[r]).item()) for k, r in enumerate(reqs)]
        k = 0
        for j, e in enumerate(emits.tolist()):
            if e:
                out[j] = picked[k]
                k += 1
        return out

    def _attend(self, cache):
        cap = self.cfg.capture_tiles

        def attend(q, li, ch):
            if cap is not None and li == cap[0]:
                return self.attention(q, cache.k[li], cache.v[li], ch, capture_head=cap[1], stats_out=self._tile_buf)
            return self.attention(q, cache.k[li], cache.v[li], ch)
        return attend

    def _tile_events(self, batch, t_ms) -> list[dict]:
        """Captured (m, l) per query row after each KV tile, as `tiles` events."""
        from gpu_runner.kernels.triton_attention import BLOCK_M, BLOCK_N
        events = []
        row_to_req = {}
        row = 0
        for r, n in zip(batch.reqs.tolist(), batch.num_tokens.tolist()):
            row_to_req[row] = r
            row += n
        layer, head = self.cfg.capture_tiles
        for chunks, (m, l) in self._tile_buf:
            m, l = m.cpu().numpy(), l.cpu().numpy()
            for ci, c in enumerate(chunks):
                for qt in range(m.shape[1]):
                    rows = min(BLOCK_M, c.n - qt * BLOCK_M)
                    if rows <= 0:
                        continue
                    for kt in range(m.shape[2]):
                        mm, ll = m[ci, qt, kt, :rows], l[ci, qt, kt, :rows]
                        if np.isnan(mm).all():
                            continue
                        events.append({"t_ms": t_ms, "type": "tiles", "req": self.ids[row_to_req[c.row]],
                                       "step": int(batch.step), "layer": layer, "head": head, "q_tile": qt,
                                       "kv_tile": kt, "q_start": c.start + qt * BLOCK_M, "kv_start": kt * BLOCK_N,
                                       "m": [float(x) for x in mm], "l": [float(x) for x in ll]})
        self._tile_buf.clear()
        return events

    def _sample(self, logits, reqs, gens, sp) -> list[int]:
        if sp.temperature == 0:
            return logits.argmax(-1).tolist()
        probs = filtered_probs(logits, sp)
        return [int(torch.multinomial(probs[k], 1, generator=gens[r]).item()) for k, r in enumerate(reqs)]

    def _forward_spec(self, sched, batch, cache, drafter, emits, gens, sp):
        """One step with speculative verification for the decoding entries of the batch.
        Returns (tokens per entry, sources per entry, spec events)."""
        from gpu_runner.speculative import SAMPLED, verify
        bs = sched.cfg.block_size
        dev = self.device
        greedy = sp.temperature == 0
        reqs, starts, ns = batch.reqs.tolist(), batch.start_pos.tolist(), batch.num_tokens.tolist()
        slots_of = [None] * len(reqs)
        for j, (r, start, n) in enumerate(zip(reqs, starts, ns)):
            table = sched.bm.tables[r]
            slots_of[j] = [table[p // bs] * bs + p % bs for p in range(start + n)]
        spec = [j for j in range(len(reqs)) if not batch.is_prefill[j] and ns[j] > 1]
        # 1. Draft: catch its cache up to the last emitted token, then propose gamma_j tokens.
        gam = {j: ns[j] - 1 for j in spec}
        props = {j: [] for j in spec}
        qdist = {j: [] for j in spec}
        for j in spec:  # the draft's KV is valid at most as far as the target's (preemption resets)
            r = reqs[j]
            drafter.valid[r] = min(drafter.valid.get(r, 0), starts[j])
        active = list(spec)
        step = 0
        while active:
            entries = []
            for j in active:
                r, p = reqs[j], starts[j]
                if step == 0:
                    v = drafter.valid[r]
                    ids = sched.token_ids[r][v:p + 1]
                    entries.append((ids, v, slots_of[j]))
                else:
                    entries.append(([props[j][-1]], p + step, slots_of[j]))
            logits = drafter.forward(entries, dev)
            if greedy:
                picked = logits.argmax(-1).tolist()
                probs = None
            else:
                probs = filtered_probs(logits, sp)
                picked = [int(torch.multinomial(probs[k], 1, generator=gens[reqs[j]]).item())
                          for k, j in enumerate(active)]
            for k, j in enumerate(active):
                props[j].append(picked[k])
                qdist[j].append(probs[k] if probs is not None else None)
            step += 1
            active = [j for j in active if len(props[j]) < gam[j]]
        for j in spec:
            drafter.valid[reqs[j]] = starts[j] + gam[j]
        # 2. Target: one forward over everything; a verified entry feeds [last, proposals].
        toks, pos, slots, chunks, row = [], [], [], [], 0
        for j, (r, start, n) in enumerate(zip(reqs, starts, ns)):
            ids = sched.token_ids[r][start:start + n] if j not in gam else [sched.token_ids[r][start]] + props[j]
            toks += ids
            pos += range(start, start + n)
            slots += slots_of[j][start:]
            chunks.append(Chunk(row, n, start, torch.tensor(slots_of[j], device=dev)))
            row += n
        hidden = self.model.forward_paged(torch.tensor(toks, device=dev), torch.tensor(pos, device=dev),
                                          torch.tensor(slots, device=dev), chunks, cache, self._attend(cache))
        new = [[] for _ in reqs]
        src = [[] for _ in reqs]
        plain = [j for j in range(len(reqs)) if j not in gam and emits[j]]
        if plain:
            logits = self.model.logits(hidden[torch.tensor([chunks[j].row + chunks[j].n - 1 for j in plain],
                                                           device=dev)])
            for j, tok in zip(plain, self._sample(logits, [reqs[j] for j in plain], gens, sp)):
                new[j], src[j] = [tok], [SAMPLED]
        events = []
        for j in spec:
            c = chunks[j]
            logits = self.model.logits(hidden[c.row:c.row + c.n])           # [gamma + 1, V]
            if greedy:
                p = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
                q = torch.nn.functional.one_hot(torch.tensor(props[j], device=dev), logits.shape[-1]).to(logits.dtype)
            else:
                p = filtered_probs(logits, sp)
                q = torch.stack(qdist[j])
            out, s_, positions = verify(p, q, props[j], gens[reqs[j]], greedy)
            new[j], src[j] = out, s_
            accepted = sum(1 for x in positions if x["accepted"])
            drafter.valid[reqs[j]] = min(drafter.valid[reqs[j]], starts[j] + accepted + 1)
            events.append({"type": "spec", "req": self.ids[reqs[j]], "step": int(batch.step),
                           "proposed": props[j], "positions": positions, "accepted": accepted,
                           "bonus": accepted == len(props[j])})
        return new, src, events

    def _meta(self, wl, sched_cfg, notes) -> dict:
        try:
            import triton
            triton_version = triton.__version__
        except Exception:  # triton is optional on CPU
            triton_version = None
        return {
            "source": "measured",
            "label": f"{wl.name} on {self.model_name} ({sched_cfg.policy})",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": device_name(self.device),
            "engine": {"name": "gpu_runner", **sched_cfg.to_dict(), "attention": self.cfg.attention,
                       "capture_tiles": list(self.cfg.capture_tiles) if self.cfg.capture_tiles else None,
                       "kv_memory_bytes": self.cfg.kv_memory_bytes,
                       "sampling": asdict(self.cfg.sampling)},
            "model": {"name": self.model_name, **self.model.cfg.to_dict(), "params": self.model.num_params(),
                      "dtype": str(self.dtype).removeprefix("torch."), "tokenizer": getattr(self.tok, "name", "?")},
            "draft": None if self.draft is None else {"name": self.draft_name, "params": self.draft.num_params(),
                                                       "gamma": self.cfg.gamma, **self.draft.cfg.to_dict()},
            "versions": {"torch": torch.__version__, "triton": triton_version, "python": platform.python_version()},
            "workload": wl.name,
            "notes": "; ".join(notes),
        }
