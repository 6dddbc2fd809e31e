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
            for k in sf.keys():  # noqa: SIM118  (safe_open is not a dict)
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
    # End of sequence: config.json's eos_token_id (an id or a list of ids) stops generation
    # whether or not a tokenizer is present.
    eos = raw.get("eos_token_id")
    if isinstance(eos, list):
        eos = tuple(i for i in eos if isinstance(i, int) and not isinstance(i, bool)) or None
    elif isinstance(eos, bool) or not isinstance(eos, int):
        eos = None
    model.eos_token_id = eos
    tok = None
    if (d / "tokenizer.json").exists():
        from gpu_runner.tokenizer import HFTokenizer
        tok = HFTokenizer(d / "tokenizer.json", eos)
    return model.to(device=device, dtype=dtype).eval(), tok


def export_hf(model: Transformer, path, eos_token_id: int | None = None, bos_token_id: int | None = None):
    """Write `model` as a Hugging Face Llama checkpoint (config.json + model.safetensors) that
    `load_hf`, transformers and vLLM read. The bundled byte models use BOS 256 / EOS 257; pass
    another `eos_token_id` to make a checkpoint that stops on a different token."""
    from safetensors.torch import save_file
    c = model.cfg
    if c.qkv_bias:
        raise ConfigError("export: q/k/v biases (Qwen2 layout) cannot be written as a Llama checkpoint")
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
           "hidden_size": c.dim, "intermediate_size": c.hidden_dim, "num_hidden_layers": c.n_layers,
           "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
           "max_position_embeddings": c.max_seq_len, "rope_theta": c.rope_theta, "rms_norm_eps": c.norm_eps,
           "tie_word_embeddings": c.tie_embeddings, "hidden_act": "silu", "attention_bias": False,
           "torch_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
           "bos_token_id": bos_token_id, "eos_token_id": eos_token_id}
    (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    state = {("" if k == "lm_head.weight" else "model.") + k: v.detach().contiguous().cpu()
             for k, v in model.state_dict().items() if not (c.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(d / "model.safetensors"))
