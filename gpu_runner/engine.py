"""The runner: the core step loop with a real model as its executor.

`Engine.run` builds an engine core (core.engine.core.EngineCore) with a `ModelExecutor` and
steps it on the wall clock (core.engine.loop.run); the scheduler
(admission, chunking, KV blocks, prefix hits, preemption, stop conditions) is exactly the
simulator's. The executor sees only SchedulerOutputs (core.engine.outputs): it keeps its own
copy of each request's token ids and block table, updated from the ids and block ids each
output carries, turns a batch into one packed forward over the paged KV cache
(gpu_runner.batching), samples or verifies draft tokens (gpu_runner.sampling,
gpu_runner.spec_decode), and reads the clock once the tokens are on the host.
"""
from __future__ import annotations

import dataclasses
import platform
import zlib
from pathlib import Path

import numpy as np
import torch

from core.config import SamplingParams, SchedulerConfig, to_dict
from core.engine import loop
from core.engine.core import EngineCore
from core.engine.outputs import EngineOutputs, ExecutorOutput, SchedulerOutput
from core.errors import ConfigError
from core.trace import Trace
from core.workload import Request, Workload
from gpu_runner.batching import forward, pack, slots_of
from gpu_runner.kernels.reference import paged_attention
from gpu_runner.model import Transformer
from gpu_runner.options import EngineConfig
from gpu_runner.sampling import filtered_probs, request_generator, sample

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "pydoc_topics.txt"
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
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * elem


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
        out.append(Request(r.id, r.arrival_ms, r.prompt_tokens, r.max_output_tokens, ids, r.tenant, r.abort_at_ms,
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


class Engine:
    def __init__(self, model: Transformer, tokenizer, cfg: EngineConfig, device="cpu", model_name="tiny",
                 draft: Transformer | None = None, draft_name: str | None = None):
        self.model = model
        self.draft = draft
        self.draft_name = draft_name
        if draft is not None and draft.cfg.vocab_size != model.cfg.vocab_size:
            raise ConfigError(f"draft: vocabulary size {draft.cfg.vocab_size} differs from the target's "
                              f"{model.cfg.vocab_size} (the draft must share the tokenizer)")
        self.tok = tokenizer
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        self.model_name = model_name
        self.startup: dict = {}   # cold start: model_load_ms (set by the command line that loaded it)
        self.interrupted = False          # the last run() was stopped by Ctrl-C (its trace is partial)
        self.attention_name = cfg.attention if cfg.attention != "auto" else \
            ("triton" if self.device.type == "cuda" else "torch")
        self.attention = paged_attention
        if self.attention_name == "triton":
            from gpu_runner.kernels.triton_attention import paged_attention_triton
            self.attention = paged_attention_triton
        from gpu_runner import onednn
        if cfg.matmul == "onednn" and not onednn.available(model):
            raise ConfigError("matmul onednn: needs a float32 model on the CPU and torch built with oneDNN "
                              "(use --matmul torch)")
        self.matmul_name = "onednn" if cfg.matmul != "torch" and onednn.available(model) else "torch"
        self._weights = onednn.OneDNNWeights(model) if self.matmul_name == "onednn" else None
        self._draft_weights = (onednn.OneDNNWeights(draft) if self.matmul_name == "onednn" and draft is not None
                               and onednn.available(draft) else None)
        if cfg.capture_tiles is not None:
            if self.attention_name != "triton":
                raise ConfigError("capture_tiles: per-tile statistics come from the Triton kernel; "
                                  "use attention=triton")
            layer, head = cfg.capture_tiles
            if not (0 <= layer < model.cfg.n_layers and 0 <= head < model.cfg.n_heads):
                raise ConfigError(f"capture_tiles: layer {layer} / head {head} out of range "
                                  f"({model.cfg.n_layers} layers, {model.cfg.n_heads} heads)")

    @property
    def weights(self):
        """The target's packed oneDNN weights (repacked if a parameter changed), or None."""
        return None if self._weights is None else self._weights.fresh()

    @property
    def draft_weights(self):
        return None if self._draft_weights is None else self._draft_weights.fresh()

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """End-of-sequence ids: the tokenizer's, else the checkpoint config's."""
        eos = getattr(self.tok, "eos_id", None)
        if eos is None:
            eos = getattr(self.model, "eos_token_id", None)
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)

    def pool_blocks(self, sc: SchedulerConfig) -> int | None:
        """KV blocks of the pool: kv_blocks, or what kv_memory_mb holds, or None (unsized)."""
        if sc.kv_blocks is not None or self.cfg.kv_memory_mb is None:
            return sc.kv_blocks
        per = PagedKVCache.bytes_per_block(self.model.cfg, sc.block_size, self.dtype)
        budget = int(self.cfg.kv_memory_mb * 2**20)
        if budget < per:
            raise ConfigError(f"kv memory: {budget} bytes is less than one block ({per} bytes)")
        return budget // per

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler options this engine runs with: its pool, model id and draft length."""
        sc = self.cfg.scheduler
        tier = {}
        if sc.cpu_kv_blocks:   # the CPU tier's copies are real here: its bytes per block are this model's
            if self.draft is not None:
                raise ConfigError("cpu_kv_blocks: the CPU tier copies the target model's KV only; run it without "
                                  "a draft model")
            tier = {"kv_block_bytes": PagedKVCache.bytes_per_block(self.model.cfg, sc.block_size, self.dtype)}
        return dataclasses.replace(sc, kv_blocks=self.pool_blocks(sc), model_id=self.model_name,
                                   spec_gamma=self.cfg.gamma if self.draft is not None else 0, **tier)

    @torch.inference_mode()
    def run(self, workload: Workload, progress=None, on_output=None) -> tuple[Trace | None, dict[str, list[int]]]:
        """Serve the workload; returns (measured trace or None when recording is off,
        generated token ids per request id). progress(done, total) after each step;
        on_output(EngineOutputs) too."""
        m = self.model
        # Checked first: it needs only the counts (filling a huge prompt from the corpus would fail first).
        too_long = [r for r in workload.requests if r.prompt_tokens + r.max_output_tokens > m.cfg.max_seq_len]
        if too_long:
            r = too_long[0]
            raise ConfigError(f"request {r.id!r}: prompt + output = {r.prompt_tokens + r.max_output_tokens:,} "
                              f"tokens exceeds the model's {m.cfg.max_seq_len:,} positions")
        wl, notes = prepare_workload(workload, self.tok, m.cfg.vocab_size)
        sched_cfg = self.scheduler_config()
        core = EngineCore(sched_cfg, None, wl, record=self.cfg.record, stop_token_ids=self.stop_token_ids,
                          request_data=True)
        # Requests arrive on the wall clock: the capture starts at the first arrival and an idle
        # engine sleeps until the next one.
        clock = loop.WallClock(wl.requests[0].arrival_ms)
        core.executor = executor = ModelExecutor(self, core.num_kv_blocks, sched_cfg.block_size, clock)
        for i, r in enumerate(wl.requests):
            executor.add_request(i, r.id, self.cfg.sampling)
        total_out = sum(r.max_output_tokens for r in wl.requests)
        done = 0

        def after(out: EngineOutputs):
            nonlocal done
            if out.step is None:
                return
            self.note_first_step(out)
            done += len(out.token_reqs)
            if progress is not None:
                progress(done, total_out)
            if on_output is not None:
                on_output(out)

        self.interrupted = False
        try:
            loop.run(core, clock, on_output=after)
        except KeyboardInterrupt:  # Ctrl-C: keep what was served; the trace says it is partial
            self.interrupted = True
            notes.append(f"interrupted after {core.num_steps} steps: {core.num_done} of {core.num_requests} requests "
                         "finished; unfinished requests have no finish event")
        outputs = {r.id: list(core.scheduler.requests.outputs(i)) for i, r in enumerate(wl.requests)}
        self.last_core = core
        if core.log is None:
            return None, outputs
        meta = core.trace_meta(wl, "measured", f"{wl.name} on {self.model_name} ({sched_cfg.policy})",
                               self.engine_meta(), device=device_name(self.device), **self.model_meta(),
                               notes="; ".join(notes))
        return core.trace(wl, meta), outputs

    def note_first_step(self, out: EngineOutputs):
        """Cold start: the first step's duration (lazy initialisation, allocator and kernel
        warm-up land in it), kept in the trace's meta.startup beside model_load_ms."""
        if "first_step_ms" not in self.startup and out.step is not None:
            self.startup["first_step_ms"] = out.dur_ms

    def engine_meta(self) -> dict:
        c = to_dict(self.cfg)
        del c["scheduler"]
        return {"name": "gpu_runner", **c, "attention": self.attention_name, "matmul": self.matmul_name}

    def model_meta(self) -> dict:
        from importlib.metadata import PackageNotFoundError, version
        try:   # the installed version, without importing triton (which fixes its interpreter mode)
            triton_version = version("triton")
        except PackageNotFoundError:  # triton is optional on CPU
            triton_version = None
        return {
            "model": {"name": self.model_name, **self.model.cfg.to_dict(), "params": self.model.num_params(),
                      "dtype": str(self.dtype).removeprefix("torch."), "tokenizer": getattr(self.tok, "name", "?")},
            "draft": None if self.draft is None else {"name": self.draft_name, "params": self.draft.num_params(),
                                                       "gamma": self.cfg.gamma, **self.draft.cfg.to_dict()},
            "versions": {"torch": torch.__version__, "triton": triton_version, "python": platform.python_version()},
            "startup": dict(self.startup) or None,
        }


class ModelExecutor:
    """One scheduled batch on the model: draft proposals (speculative), one packed target
    forward, sampling or exact verification; the step ends when the tokens are on the host.
    Per request (by its row in the scheduler's table) it keeps the known token ids and the
    block table the SchedulerOutputs send, and its sampling settings and generator."""

    def __init__(self, engine: Engine, num_blocks: int, block_size: int, clock):
        self.e = engine
        self.clock = clock
        self.block_size = block_size
        m = engine.model.cfg
        self.cache = PagedKVCache(m.n_layers, num_blocks, block_size, m.n_kv_heads, m.head_dim, engine.device,
                                  engine.dtype)
        self.ids: dict[int, str] = {}            # request row -> request id (trace events)
        self.gens: dict[int, torch.Generator] = {}
        self.sp_of: dict[int, SamplingParams] = {}   # per-request sampling (a server's requests differ)
        self.tokens: dict[int, list[int]] = {}   # known ids: prompt, then outputs
        self.tables: dict[int, list[int]] = {}   # KV block table
        self.drafter = None
        if engine.draft is not None:
            from gpu_runner.spec_decode import DraftRunner
            d = engine.draft.cfg
            self.drafter = DraftRunner(engine.draft, PagedKVCache(d.n_layers, num_blocks, block_size, d.n_kv_heads,
                                                                  d.head_dim, engine.device, engine.dtype),
                                       engine.attention, lambda: engine.draft_weights)
        self.tile_buf: list = []
        self.pending_kv: dict[int, tuple] = {}   # disaggregated decode: row -> (K, V, t_recv_ms), written at its
        #                                         first step into the blocks the scheduler gave it
        self.loaded: list[tuple[int, float, float, int]] = []   # (row, t_recv_ms, t_written_ms, bytes) since taken
        self.hit_blocks = None                  # row -> its leading blocks that are prefix-cache hits (shared:
        #                                         never overwritten); set by the engine's owner
        self.cpu_tier = None                    # the CPU tier's pool (core.kvtier): made at its first copy

    # ---- the CPU tier under the prefix cache: real copies between the two pools -------------------------
    def _copies(self, jobs, kind: str, times: dict) -> dict:
        """Make the copies of one kind among `jobs`; their (start, end) ms added to `times` by job id."""
        mine = [j for j in jobs if j.kind == kind]
        times.update(zip(map(id, mine), self.copy_kv(mine)))
        return times

    def copy_kv(self, jobs) -> list[tuple[float, float]]:
        """Make the CPU tier's copies (core.kvtier.tier.Job: load, CPU chunks into GPU blocks; store,
        GPU blocks into CPU chunks), one after another; (start, end) ms of each, on the engine's clock.
        The CPU pool lives in host memory (pinned when the model is on a GPU); each copy is waited for,
        so its time is the copy's own."""
        c = self.cache
        if self.cpu_tier is None:
            m, n = self.e.model.cfg, self.e.cfg.scheduler.cpu_kv_blocks
            self.cpu_tier = PagedKVCache(m.n_layers, n, self.block_size, m.n_kv_heads, m.head_dim,
                                         torch.device("cpu"), self.e.dtype)
            if c.k.device.type == "cuda":
                self.cpu_tier.k, self.cpu_tier.v = self.cpu_tier.k.pin_memory(), self.cpu_tier.v.pin_memory()
        cpu, times = self.cpu_tier, []
        for job in jobs:
            t0 = self.clock.now()
            blocks = torch.tensor(job.blocks, dtype=torch.long, device=c.k.device)
            chunks = torch.tensor(job.chunks, dtype=torch.long)
            for gpu_pool, host in ((c.k, cpu.k), (c.v, cpu.v)):
                if job.kind == "load":
                    gpu_pool.index_copy_(1, blocks, host.index_select(1, chunks).to(gpu_pool.device))
                else:
                    host.index_copy_(1, chunks, gpu_pool.index_select(1, blocks).to(host.device))
            if c.k.device.type == "cuda":
                torch.cuda.synchronize(c.k.device)
            times.append((t0, self.clock.now()))
        return times

    # ---- disaggregated prefill/decode: the prompt's KV out of this cache, into another ----------------
    def export_kv(self, i: int, tokens: int):
        """K and V of request row i's first `tokens` positions: two CPU tensors [layers, tokens,
        kv_heads, head_dim] (a copy: the blocks may be reused at the next step)."""
        c, bs = self.cache, self.block_size
        slots = torch.tensor(slots_of(self.tables[i], tokens, bs), dtype=torch.long, device=c.k.device)
        lay, h, d = c.k.shape[0], c.k.shape[3], c.k.shape[4]
        k = c.k.view(lay, -1, h, d).index_select(1, slots).cpu()
        v = c.v.view(lay, -1, h, d).index_select(1, slots).cpu()
        return k, v

    def import_kv(self, i: int, k: torch.Tensor, v: torch.Tensor, t_recv_ms: float) -> None:
        """Request row i arrives with its prompt's KV (disaggregated decode): written into its
        blocks when it is first scheduled (they are allocated then)."""
        self.pending_kv[i] = (k, v, t_recv_ms)

    def _write_pending(self, reqs: list[int]):
        c, bs = self.cache, self.block_size
        for i in reqs:
            got = self.pending_kv.pop(i, None)
            if got is None:
                continue
            k, v, t_recv = got
            n = k.shape[1]
            skip = min(n, (self.hit_blocks(i) if self.hit_blocks is not None else 0) * bs)
            if skip < n:
                slots = torch.tensor(slots_of(self.tables[i], n, bs)[skip:], dtype=torch.long, device=c.k.device)
                lay, h, d = c.k.shape[0], c.k.shape[3], c.k.shape[4]
                c.k.view(lay, -1, h, d).index_copy_(1, slots, k[:, skip:].to(c.k.device, c.k.dtype))
                c.v.view(lay, -1, h, d).index_copy_(1, slots, v[:, skip:].to(c.v.device, c.v.dtype))
            nbytes = (n - skip) * (k[:, :1].numel() + v[:, :1].numel()) * k.element_size()
            self.loaded.append((i, t_recv, self.clock.now(), nbytes))

    def add_request(self, i: int, rid: str, sp: SamplingParams) -> None:
        """Request row i (its id and sampling) before it is first scheduled."""
        self.ids[i] = rid
        self.gens[i] = request_generator(sp.seed, rid, self.e.device)
        self.sp_of[i] = sp

    def _receive(self, batch: SchedulerOutput):
        """Apply what the output carries: new token ids, block table changes, requests gone."""
        for i in batch.finished:
            for d in (self.ids, self.gens, self.sp_of, self.tokens, self.tables, self.pending_kv):
                d.pop(i, None)
            if self.drafter is not None:
                self.drafter.valid.pop(i, None)
        for i, ids, (keep, new) in zip(batch.reqs.tolist(), batch.new_token_ids, batch.block_updates):
            self.tokens.setdefault(i, []).extend(ids)
            table = self.tables.setdefault(i, [])
            del table[keep:]
            table.extend(new)

    def attend(self, q, li, chunks):
        cap, c = self.e.cfg.capture_tiles, self.cache
        if cap is not None and li == cap[0]:
            return self.e.attention(q, c.k[li], c.v[li], chunks, capture_head=cap[1], stats_out=self.tile_buf)
        return self.e.attention(q, c.k[li], c.v[li], chunks)

    def execute(self, batch: SchedulerOutput) -> ExecutorOutput:
        """One step: draft proposals, one packed forward, sampling and verification; tokens on the host."""
        e, dev = self.e, self.e.device
        self._receive(batch)
        bs = self.block_size
        reqs, starts, ns = batch.reqs.tolist(), batch.start_pos.tolist(), batch.num_tokens.tolist()
        if self.pending_kv:
            self._write_pending(reqs)
        copies = batch.kv_copies or []
        times = self._copies(copies, "load", {})   # (the CPU tier's loads land before the forward)
        known = [self.tokens[r] for r in reqs]
        slots = [slots_of(self.tables[r], s + n, bs) for r, s, n in zip(reqs, starts, ns)]
        # Plain entries that complete emit one sampled token; a decode entry of more than one
        # token verifies draft proposals.
        emits = batch.emits.tolist()
        spec, props, qdist = self._propose(batch, reqs, known, starts, ns, slots)
        entries = [([known[j][s]] + props[j] if j in props else known[j][s:s + n], s, slots[j])
                   for j, (s, n) in enumerate(zip(starts, ns))]
        packed = pack(entries, dev)
        weights = e.weights
        plain = [j for j in range(len(reqs)) if emits[j] and j not in props]
        # only the rows whose logits are read: each plain entry's last token, then each
        # speculative entry's gamma + 1 (the model's last layer runs on those alone)
        want = [packed.chunks[j].row + packed.chunks[j].n - 1 for j in plain]
        at = {}
        for j in spec:
            c = packed.chunks[j]
            at[j] = len(want)
            want.extend(range(c.row, c.row + c.n))
        every = len(want) == len(packed.tokens) and want == list(range(len(want)))     # (a decode-only step)
        hidden = forward(e.model, packed, self.cache, self.attend, weights,
                         rows=None if every else torch.tensor(want, dtype=torch.long, device=dev))
        tokens = [[] for _ in reqs]
        sources = [[] for _ in reqs] if self.drafter else None
        failed: dict[int, str] = {}
        if plain:
            logits = e.model.logits(hidden[:len(plain)], weights)
            self._sample_plain(logits, [reqs[j] for j in plain], plain, tokens, sources, failed)
        events = []
        for j in spec:
            c = packed.chunks[j]
            logits = e.model.logits(hidden[at[j]:at[j] + c.n], weights)  # [gamma + 1, V]
            ev = self._verify(batch, j, reqs[j], starts[j], logits, props[j], qdist, tokens, sources, failed)
            if ev is not None:
                events.append(ev)
        t_end = self.clock.now()                                     # tokens are on the host now
        for ev in events:
            ev["t_ms"] = t_end
        if e.cfg.capture_tiles is not None:
            events += self._tile_events(batch)
        times = self._copies(copies, "store", times)   # the blocks this step filled, now that their KV is written
        return ExecutorOutput(t_end, tokens=tokens, sources=sources, events=events or None, failed=failed or None,
                              copies=[times[id(j)] for j in copies] or None)

    def _propose(self, batch: SchedulerOutput, reqs, known, starts, ns, slots) -> tuple[list[int], dict, dict]:
        """The speculative entries (decodes of more than one token) and the draft's proposals for them."""
        spec = [j for j in range(len(reqs)) if not batch.is_prefill[j] and ns[j] > 1] if self.drafter else []
        props, qdist = {}, {}
        if spec:
            props, qdist = self.drafter.propose(reqs, known, spec, starts, {j: ns[j] - 1 for j in spec}, slots,
                                                [self.gens[r] for r in reqs], self.e.cfg.sampling, self.e.device)
        return spec, props, qdist

    def _sample_plain(self, logits, rows: list[int], plain: list[int], tokens, sources, failed) -> None:
        """One sampled token per plain entry (rows[k]: entry plain[k]'s request), into tokens/sources;
        an entry whose logits are not finite, or whose draw fails, goes into failed."""
        from gpu_runner.spec_decode import SAMPLED
        groups: dict[tuple, list[int]] = {}
        for k, r in enumerate(rows):
            p = self.sp_of[r]
            groups.setdefault((p.temperature, p.top_k, p.top_p), []).append(k)
        finite = torch.isfinite(logits).all(-1).tolist()
        for k in [k for k, ok in enumerate(finite) if not ok]:
            failed[plain[k]] = "the model's logits are not finite (inf or NaN) for this request"
        for ks in groups.values():   # one draw per distinct sampling setting
            ks = [k for k in ks if finite[k]]
            if not ks:
                continue
            try:
                picked, _ = sample(logits[ks] if len(ks) < len(plain) else logits,
                                   [self.gens[rows[k]] for k in ks], self.sp_of[rows[ks[0]]])
            except (RuntimeError, ValueError) as err:    # one setting's draw fails: its requests only
                for k in ks:
                    failed[plain[k]] = f"sampling failed: {type(err).__name__}: {str(err)[:200]}"
                continue
            for k, tok in zip(ks, picked):
                tokens[plain[k]] = [tok]
                if sources is not None:
                    sources[plain[k]] = [SAMPLED]

    def _verify(self, batch: SchedulerOutput, j: int, r: int, start: int, logits, proposed: list[int], qdist,
                tokens, sources, failed) -> dict | None:
        """Verify entry j's proposals (request row r) against its logits [gamma + 1, V]: its tokens and
        sources, and its `spec` event (None, and the entry in failed, when verification fails)."""
        from gpu_runner.spec_decode import verify
        sp, dev = self.e.cfg.sampling, self.e.device
        greedy = sp.temperature == 0
        try:
            if not torch.isfinite(logits).all():
                raise ValueError("the model's logits are not finite (inf or NaN)")
            if greedy:
                p = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
                q = torch.nn.functional.one_hot(torch.tensor(proposed, device=dev), logits.shape[-1]).to(logits.dtype)
            else:
                p = filtered_probs(logits, sp)
                q = torch.stack(qdist[j])
            tokens[j], sources[j], positions = verify(p, q, proposed, self.gens[r], greedy)
        except (RuntimeError, ValueError) as err:      # this request's verification only
            failed[j] = f"speculative verification failed: {type(err).__name__}: {str(err)[:200]}"
            tokens[j], sources[j] = [], []
            return None
        accepted = sum(1 for x in positions if x["accepted"])
        self.drafter.rejected_after(r, start, accepted)
        return {"type": "spec", "req": self.ids[r], "step": int(batch.step), "proposed": proposed,
                "positions": positions, "accepted": accepted, "bonus": accepted == len(proposed)}

    def _tile_events(self, batch) -> list[dict]:
        """Captured (m, l) per query row after each KV tile, as `tiles` events."""
        from gpu_runner.kernels.triton_attention import BLOCK_M, BLOCK_N
        events = []
        row_to_req = {}
        row = 0
        for r, n in zip(batch.reqs.tolist(), batch.num_tokens.tolist()):
            row_to_req[row] = r
            row += n
        layer, head = self.e.cfg.capture_tiles
        for chunks, (m, l) in self.tile_buf:
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
                        events.append({"t_ms": batch.t_ms, "type": "tiles", "req": self.ids[row_to_req[c.row]],
                                       "step": int(batch.step), "layer": layer, "head": head, "q_tile": qt,
                                       "kv_tile": kt, "q_start": c.start + qt * BLOCK_M, "kv_start": kt * BLOCK_N,
                                       "m": [float(x) for x in mm], "l": [float(x) for x in ll]})
        self.tile_buf.clear()
        return events
