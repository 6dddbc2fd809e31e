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
    """A bundled checkpoint; a broken one (e.g. a Git LFS pointer instead of the weights) is a
    ConfigError naming the file."""
    from safetensors import SafetensorError

    from core.errors import ConfigError
    from gpu_runner.hf import MAX_CONFIG_BYTES, read_json, read_safetensors_header
    cfg_path, weights = path / "config.json", path / "model.safetensors"
    cfg_doc = read_json(cfg_path, "config.json", MAX_CONFIG_BYTES)
    if not isinstance(cfg_doc, dict):
        raise ConfigError(f"{cfg_path}: expected a JSON object")
    fields = {k: v for k, v in cfg_doc.items() if k in ModelConfig.__dataclass_fields__}
    try:
        cfg = ModelConfig(**fields)
    except ConfigError as e:
        raise ConfigError(f"{cfg_path}: {e}") from None
    read_safetensors_header(weights)
    model = Transformer(cfg)
    try:
        state = load_file(str(weights))
    except SafetensorError as e:
        raise ConfigError(f"{weights}: corrupt safetensors file ({e})") from None
    if model.cfg.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:  # missing, unexpected or mis-shaped tensors
        raise ConfigError(f"{weights}: does not match {cfg_path.name} ({str(e).splitlines()[-1].strip()})") from None
    return model.to(device=device, dtype=dtype).eval()
