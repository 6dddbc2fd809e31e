"""Bundled model checkpoints: a directory with config.json (ModelConfig fields plus
training notes) and model.safetensors. Safetensors only: nothing is unpickled."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gpu_runner.model import ModelConfig, Transformer

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "data" / "models"
BUNDLED = {"tiny": MODELS / "tiny", "tiny-draft": MODELS / "tiny-draft"}
FORMAT = "serving-explorer-byte-llama"


def save(model: Transformer, path: Path, notes: dict | None = None):
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"format": FORMAT, **model.cfg.to_dict(), "notes": notes or {}}
    (path / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()
             if not (model.cfg.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(path / "model.safetensors"))


def load_bundled(path: Path, device="cpu", dtype=torch.float32) -> Transformer:
    cfg_doc = json.loads((path / "config.json").read_text())
    fields = {k: v for k, v in cfg_doc.items() if k in ModelConfig.__dataclass_fields__}
    model = Transformer(ModelConfig(**fields))
    state = load_file(str(path / "model.safetensors"))
    if model.cfg.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()
