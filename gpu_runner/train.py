"""Train the bundled byte-level models on the shipped corpus (data/corpus/pydoc_topics.txt).

    python -m gpu_runner.train [--which both|tiny|draft] [--steps-target 1200] [--steps-draft 1500]

Writes data/models/tiny and data/models/tiny-draft (config.json + model.safetensors) and
docs/training.md (loss curves, final losses, time taken, command). Deterministic on CPU for a
given torch version and thread count (seeded data order and initialisation).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gpu_runner import checkpoint
from gpu_runner.model import ModelConfig, Transformer, init_weights
from gpu_runner.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "data" / "corpus" / "pydoc_topics.txt"

TARGET = ModelConfig(dim=256, n_layers=4, n_heads=8, n_kv_heads=2, hidden_dim=704)
DRAFT = ModelConfig(dim=128, n_layers=1, n_heads=4, n_kv_heads=1, hidden_dim=352)


def corpus_tensor():
    data = torch.tensor(ByteTokenizer().encode(CORPUS.read_text()), dtype=torch.long)
    n_val = len(data) // 20                                   # last 5% held out
    return data[:-n_val], data[-n_val:]


def batches(data, batch, seq, gen):
    while True:
        ix = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
        x = torch.stack([data[i:i + seq] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + seq + 1] for i in ix.tolist()])
        yield x, y


@torch.no_grad()
def evaluate(model, data, seq, n=8):
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    losses = []
    it = batches(data, 16, seq, gen)
    for _ in range(n):
        x, y = next(it)
        losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


def train(cfg: ModelConfig, steps: int, seed: int, batch=16, seq=192, lr=3e-3, log_every=100, name="model"):
    torch.manual_seed(seed)
    train_data, val_data = corpus_tensor()
    model = Transformer(cfg)
    init_weights(model, seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)) * 0.95 + 0.05)
    gen = torch.Generator().manual_seed(seed)
    it = batches(train_data, batch, seq, gen)
    curve = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = next(it)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps:
            val = evaluate(model, val_data, seq)
            curve.append({"step": step, "train_loss": round(loss.item(), 4), "val_loss": round(val, 4),
                          "seconds": round(time.perf_counter() - t0, 1)})
            print(f"[{name}] step {step}/{steps} train {loss.item():.4f} val {val:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return model.eval(), curve, time.perf_counter() - t0


def sample_text(model, prompt: str, n: int = 200) -> str:
    tok = ByteTokenizer()
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids[:, -512:])[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return tok.decode(ids[0, len(tok.encode(prompt)):].tolist())


def main():
    ap = argparse.ArgumentParser(prog="python -m gpu_runner.train")
    ap.add_argument("--which", choices=["both", "tiny", "draft"], default="both")
    ap.add_argument("--steps-target", type=int, default=1200)
    ap.add_argument("--steps-draft", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--doc-only", action="store_true", help="only rewrite docs/training.md from saved models")
    args = ap.parse_args()
    if args.doc_only:
        rewrite_doc()
        return
    torch.set_num_threads(args.threads)
    results = {}
    for key, cfg, steps, seed in (("tiny", TARGET, args.steps_target, 31), ("tiny-draft", DRAFT, args.steps_draft, 7)):
        if args.which not in ("both", key.replace("tiny-", "")) and not (args.which == "tiny" and key == "tiny"):
            continue
        model, curve, secs = train(cfg, steps, seed, name=key)
        notes = {"corpus": "data/corpus/pydoc_topics.txt (CPython 3.11.7 pydoc topics, PSF license)",
                 "steps": steps, "batch": 16, "seq_len": 192, "seed": seed, "seconds": round(secs, 1),
                 "final_train_loss": curve[-1]["train_loss"], "final_val_loss": curve[-1]["val_loss"],
                 "params": model.num_params(), "torch": torch.__version__, "threads": args.threads,
                 "command": "python -m gpu_runner.train"}
        checkpoint.save(model, checkpoint.BUNDLED[key], notes)
        results[key] = (notes, curve, sample_text(model, SAMPLE_PROMPT))
    write_doc(results)


SAMPLE_PROMPT = 'The "while" statement is used'


def rewrite_doc():
    """Rebuild docs/training.md from the saved checkpoints and curves (no training)."""
    curves = json.loads((ROOT / "docs" / "training_curves.json").read_text())
    results = {}
    for key, curve in curves.items():
        notes = json.loads((checkpoint.BUNDLED[key] / "config.json").read_text())["notes"]
        model = checkpoint.load_bundled(checkpoint.BUNDLED[key])
        results[key] = (notes, curve, sample_text(model, SAMPLE_PROMPT))
    write_doc(results)


def write_doc(results):
    path = ROOT / "docs" / "training.md"
    lines = ["# Training the bundled models", "",
             "Both models are byte-level Llama-style decoders trained from scratch on CPU on the shipped corpus "
             "(`data/corpus/pydoc_topics.txt`, 466 KB: the CPython 3.11.7 pydoc topics, PSF license), "
             "next-byte cross-entropy, AdamW (lr 3e-3, warmup then cosine), batch 16 × 192 bytes, the last 5% "
             "of the corpus held out for validation. Losses are nats per byte.", "",
             "Command: `python -m gpu_runner.train` (2 CPU threads).", ""]
    for key, (notes, curve, sample) in results.items():
        lines += [f"## {key}", "",
                  f"{notes['params']:,} parameters; {notes['steps']} steps in {notes['seconds']:.0f} s on the "
                  f"2-core dev VM (torch {notes['torch']}). Final train loss {notes['final_train_loss']:.3f}, "
                  f"validation loss {notes['final_val_loss']:.3f} nats/byte "
                  f"({notes['final_val_loss'] / math.log(2):.3f} bits/byte).", "",
                  "| step | train loss | val loss | seconds |", "|---:|---:|---:|---:|"]
        lines += [f"| {c['step']} | {c['train_loss']:.3f} | {c['val_loss']:.3f} | {c['seconds']:.0f} |" for c in curve]
        lines += ["", f"Greedy continuation of `{SAMPLE_PROMPT}` (200 bytes):", "", "```",
                  sample.rstrip(), "```", ""]
    if not results:
        return
    path.write_text("\n".join(lines) + "\n")
    (ROOT / "docs" / "training_curves.json").write_text(
        json.dumps({k: c for k, (_, c, _) in results.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
