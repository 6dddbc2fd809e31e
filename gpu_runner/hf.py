"""Load a local Hugging Face Llama / Mistral / Qwen2 checkpoint (config.json +
*.safetensors, optional tokenizer.json) into our Transformer. Local files only: nothing is
downloaded, and only safetensors weights are read (never pickled .bin files)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from core.errors import ConfigError
from gpu_runner.model import ModelConfig, Transformer

SUPPORTED = ("llama", "mistral", "qwen2")


def config_from_hf(cfg: dict, where: str = "config.json") -> ModelConfig:
    mt = cfg.get("model_type")
    if mt not in SUPPORTED:
        raise ConfigError(f"{where}: model_type {mt!r} is not supported (expected one of {', '.join(SUPPORTED)})")
    if cfg.get("rope_scaling"):
        raise ConfigError(f"{where}: rope_scaling {cfg['rope_scaling']!r} is not supported by this runner")
    try:
        heads = int(cfg["num_attention_heads"])
        return ModelConfig(
            vocab_size=int(cfg["vocab_size"]), dim=int(cfg["hidden_size"]), n_layers=int(cfg["num_hidden_layers"]),
            n_heads=heads, n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg["head_dim"]) if cfg.get("head_dim") else None,
            hidden_dim=int(cfg["intermediate_size"]),
            max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
            rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", mt == "qwen2")))
    except KeyError as e:
        raise ConfigError(f"{where}: missing field {e.args[0]!r}") from None


def load_hf(path: str | Path, device="cpu", dtype=torch.float32) -> tuple[Transformer, object]:
    """(model, tokenizer or None) from a checkpoint directory."""
    d = Path(path)
    if not d.is_dir():
        raise ConfigError(f"--model {path}: not a directory (expected config.json + *.safetensors)")
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise ConfigError(f"--model {path}: no config.json")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg_path}: not valid JSON ({e.msg})") from None
    cfg = config_from_hf(raw, str(cfg_path))
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--model {path}: no *.safetensors weights (pickled .bin files are not read)")
    tensors = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                tensors[k.removeprefix("model.")] = sf.get_tensor(k)
    model = Transformer(cfg)
    state = model.state_dict()
    missing = [k for k in state if k not in tensors and not (k == "lm_head.weight" and cfg.tie_embeddings)]
    if "lm_head.weight" in missing and "embed_tokens.weight" in tensors:
        missing.remove("lm_head.weight")
        tensors["lm_head.weight"] = tensors["embed_tokens.weight"]
    if missing:
        raise ConfigError(f"--model {path}: weights missing for {', '.join(missing[:3])}"
                          + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    with torch.no_grad():
        for k, v in state.items():
            src = tensors.get(k, tensors.get("embed_tokens.weight") if k == "lm_head.weight" else None)
            if src.shape != v.shape:
                raise ConfigError(f"--model {path}: {k} has shape {tuple(src.shape)}, expected {tuple(v.shape)}")
            v.copy_(src)
    tok = None
    if (d / "tokenizer.json").exists():
        from gpu_runner.tokenizer import HFTokenizer
        eos = raw.get("eos_token_id")
        tok = HFTokenizer(d / "tokenizer.json", eos if isinstance(eos, int) else None)
    return model.to(device=device, dtype=dtype).eval(), tok
