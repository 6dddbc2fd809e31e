"""python -m gpu_runner capture|generate ...  (run with -h for each command).

Bad arguments or files exit with code 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


from core.cli import Parser as _Parser, nonneg_float as _nonneg_float, positive_int as _pos_int


def _common(p):
    p.add_argument("--model", default="tiny",
                   help="tiny | tiny-draft | random-0.5b (random weights, for timing) | a local HF checkpoint dir")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["auto", "float32", "float64", "bfloat16", "float16"], default="auto",
                   help="auto: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--attention", choices=["auto", "torch", "triton"], default="auto",
                   help="auto: triton on CUDA, torch on CPU")
    p.add_argument("--temperature", type=_nonneg_float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_pos_int, help="CPU threads for torch")
    p.add_argument("--speculative", action="store_true", help="speculative decoding with a draft model")
    p.add_argument("--gamma", type=_pos_int, default=4, help="draft tokens verified per step (with --speculative)")
    p.add_argument("--draft", default="tiny-draft", help="draft model: tiny-draft | a local HF checkpoint dir")


def build_parser():
    ap = _Parser(prog="python -m gpu_runner", description="Serve workloads with a real model on the core scheduler.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    c = sub.add_parser("capture", help="serve a workload and write a measured trace")
    c.add_argument("--workload", required=True, help="workload file (JSON with prompt text/ids/counts, CSV, JSONL)")
    c.add_argument("--out", required=True, help="trace to write (.json, .json.gz, .parquet)")
    c.add_argument("--policy", choices=["continuous", "static", "serial"], default="continuous")
    c.add_argument("--max-seqs", type=_pos_int)
    c.add_argument("--token-budget", type=_pos_int)
    c.add_argument("--chunk", type=_pos_int, help="chunked prefill chunk size")
    c.add_argument("--block-size", type=_pos_int, default=16)
    c.add_argument("--kv-blocks", type=_pos_int, help="KV pool size in blocks")
    c.add_argument("--kv-memory-mb", type=_nonneg_float, help="or size the KV pool from a memory budget")
    c.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=False)
    c.add_argument("--no-record", action="store_true", help="do not record events (timing overhead checks)")
    c.add_argument("--label", help="trace label (meta.label)")
    c.add_argument("--capture-tiles", metavar="LAYER,HEAD",
                   help="record per-tile (m, l) of the Triton attention kernel for one layer and head")
    _common(c)
    g = sub.add_parser("generate", help="continue one prompt")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    g.add_argument("--max-tokens", type=_pos_int, default=64)
    g.add_argument("--json", action="store_true", help='print {"ids": [...], "text": ...} for the generated tokens')
    _common(g)
    return ap


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


def parse_pair(text):
    if text is None:
        return None
    from core.errors import ConfigError
    try:
        layer, head = (int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--capture-tiles: expected LAYER,HEAD like 0,0, got {text!r}") from None
    return layer, head


def load_draft(a, device, target):
    if not a.speculative:
        return None, None
    dtype = next(target.parameters()).dtype
    model, _, _, name = load_model(a.draft, device, {"torch.float32": "float32", "torch.float64": "float64",
                                                     "torch.bfloat16": "bfloat16", "torch.float16": "float16"}[str(dtype)])
    return model, name


class Progress:
    def __init__(self, total_label="tokens"):
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.label = total_label

    def __call__(self, done, total):
        now = time.perf_counter()
        if now - self.last < 0.2 and done < total:
            return
        self.last = now
        width = 30
        fill = int(width * done / max(total, 1))
        rate = done / max(now - self.t0, 1e-9)
        print(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {self.label} ({rate:,.0f}/s)",
              end="", file=sys.stderr, flush=True)
        if done >= total:
            print(file=sys.stderr)


def cmd_capture(a) -> int:
    import torch

    from core.scheduler import SchedulerConfig
    from core.workload import load_workload
    from gpu_runner.engine import Engine, EngineConfig, SamplingParams
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok, device, name = load_model(a.model, a.device, a.dtype)
    w = load_workload(a.workload, tokenize=tok.encode if tok is not None else None)
    attention = a.attention if a.attention != "auto" else ("triton" if device == "cuda" else "torch")
    cfg = EngineConfig(
        scheduler=SchedulerConfig(policy=a.policy, max_seqs=a.max_seqs, token_budget=a.token_budget, chunk=a.chunk,
                                  block_size=a.block_size, prefix_caching=a.prefix_caching),
        sampling=SamplingParams(a.temperature, a.top_k, a.top_p, a.seed), kv_blocks=a.kv_blocks,
        kv_memory_bytes=int(a.kv_memory_mb * 2**20) if a.kv_memory_mb is not None else None,
        attention=attention, record=not a.no_record, gamma=a.gamma, capture_tiles=parse_pair(a.capture_tiles))
    draft, draft_name = load_draft(a, device, model)
    engine = Engine(model, tok, cfg, device, name, draft=draft, draft_name=draft_name)
    t0 = time.perf_counter()
    tr, outputs = engine.run(w, progress=Progress())
    secs = time.perf_counter() - t0
    n_tok = sum(len(v) for v in outputs.values())
    if tr is None:
        print(f"served {len(w)} requests, {n_tok} tokens in {secs:.2f} s (recording off; nothing written)")
        return 0
    if a.label:
        tr.meta["label"] = a.label
    try:
        tr.save(a.out)
    except OSError as e:
        from core.errors import InputError
        raise InputError(f"--out {a.out}: cannot write ({e.strerror})") from None
    print(f"wrote {a.out}: {len(w)} requests, {n_tok} tokens, {len(tr.steps)} steps, {len(tr.preempts)} preemptions "
          f"in {secs:.2f} s on {tr.meta['device']}")
    return 0


def cmd_generate(a) -> int:
    import torch

    from core.errors import ConfigError
    from core.scheduler import SchedulerConfig
    from core.workload import Request, Workload, parse_token_ids
    from gpu_runner.engine import Engine, EngineConfig, SamplingParams
    if a.threads:
        torch.set_num_threads(a.threads)
    ids = parse_token_ids(a.prompt_ids, "--prompt-ids") if a.prompt_ids is not None else None
    model, tok, device, name = load_model(a.model, a.device, a.dtype)
    if a.prompt is not None:
        if tok is None:
            raise ConfigError(f"--prompt: the model at {a.model} has no tokenizer.json; use --prompt-ids")
        ids = tok.encode(a.prompt)
        if not ids:
            raise ConfigError("--prompt: empty prompt")
    else:
        bad = [i for i in ids if i >= model.cfg.vocab_size]
        if bad:
            raise ConfigError(f"--prompt-ids: id {bad[0]} is outside the vocabulary (size {model.cfg.vocab_size})")
    attention = a.attention if a.attention != "auto" else ("triton" if device == "cuda" else "torch")
    cfg = EngineConfig(scheduler=SchedulerConfig(policy="continuous"),
                       sampling=SamplingParams(a.temperature, a.top_k, a.top_p, a.seed), attention=attention,
                       record=False, gamma=a.gamma)
    w = Workload([Request("prompt", 0.0, len(ids), a.max_tokens, prompt_ids=tuple(ids))], name="generate")
    draft, draft_name = load_draft(a, device, model)
    _, out = Engine(model, tok, cfg, device, name, draft=draft, draft_name=draft_name).run(w)
    gen = out["prompt"]
    text = tok.decode(gen) if tok is not None else None
    if a.json:
        print(json.dumps({"ids": gen, "text": text}))
    else:
        print(text if text is not None else " ".join(map(str, gen)))
    return 0


def main(argv=None) -> int:
    from core.cli import run
    return run(build_parser(), {"capture": cmd_capture, "generate": cmd_generate}, argv)


if __name__ == "__main__":
    sys.exit(main())
