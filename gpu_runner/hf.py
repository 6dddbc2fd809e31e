"""Load a local Hugging Face Llama / Mistral / Qwen2 checkpoint (config.json +
*.safetensors, optional tokenizer.json) into our Transformer. Local files only: nothing is
downloaded, and only safetensors weights are read (never pickled .bin files)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated, Any

import msgspec
import torch
from msgspec import Meta

from core.errors import ConfigError, json_from_bytes, read_input_file, short, validation_message
from gpu_runner.model import ModelConfig, Transformer

SUPPORTED = ("llama", "mistral", "qwen2")
MAX_CONFIG_BYTES = 16 << 20          # config.json: a few KiB in practice
MAX_HEADER_BYTES = 100 << 20         # a safetensors header (the safetensors library's own limit)
# Bytes per element of every safetensors dtype; weights must be one of FLOAT_DTYPES.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_REQUIRED = object()


# ---- reading untrusted files ------------------------------------------------------------------

def read_limited(path: Path, what: str, limit: int) -> bytes:
    """The bytes of `path`, or ConfigError naming it (missing, unreadable, larger than `limit`)."""
    return read_input_file(path, what, ConfigError, limit)


def parse_json(data: bytes, where: str):
    return json_from_bytes(data, where, ConfigError)


def read_json(path: Path, what: str, limit: int):
    return parse_json(read_limited(path, what, limit), str(path))


# ---- config.json ----------------------------------------------------------------------------------

def _type_name(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), type(v).__name__)


Positive = Annotated[int, Meta(ge=1)]


class RopeParameters(msgspec.Struct):
    rope_type: str | None = "default"
    rope_theta: Annotated[float, Meta(gt=0)] | None = None


class HFConfig(msgspec.Struct):
    """The fields of a Hugging Face config.json this runner reads, declared (msgspec checks them
    and words a refusal naming the field); null or absent optional fields take their defaults."""
    model_type: str | None = None
    vocab_size: Positive | None = None        # required: None is refused below ("missing"/null)
    hidden_size: Positive | None = None
    num_hidden_layers: Positive | None = None
    num_attention_heads: Positive | None = None
    intermediate_size: Positive | None = None
    num_key_value_heads: Positive | None = None   # default: num_attention_heads
    head_dim: Positive | None = None               # default: hidden_size // num_attention_heads
    max_position_embeddings: Positive | None = None   # default 2048
    rope_theta: Annotated[float, Meta(gt=0)] | None = None   # default 10000 (or rope_parameters')
    rope_parameters: RopeParameters | None = None
    rope_scaling: Any = None
    rms_norm_eps: Annotated[float, Meta(ge=0)] | None = None   # default 1e-6
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = None             # default: Qwen2's q/k/v biases


REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def config_from_hf(cfg: dict, where: str = "config.json") -> ModelConfig:
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {_type_name(cfg)}")
    try:
        c = msgspec.convert(cfg, HFConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{where}: {validation_message(e)}") from None
    rope = _supported_rope(c, where)
    _check_required(c, cfg, where)
    heads, dim = c.num_attention_heads, c.hidden_size
    kv_heads = c.num_key_value_heads or heads
    head_dim = c.head_dim
    _check_heads(heads, kv_heads, dim, head_dim, where)
    theta = c.rope_theta if c.rope_theta is not None else rope.rope_theta
    try:
        return ModelConfig(vocab_size=c.vocab_size, dim=dim, n_layers=c.num_hidden_layers, n_heads=heads,
                           n_kv_heads=kv_heads, head_dim=head_dim, hidden_dim=c.intermediate_size,
                           max_seq_len=c.max_position_embeddings or 2048,
                           rope_theta=10000.0 if theta is None else float(theta),
                           norm_eps=1e-6 if c.rms_norm_eps is None else float(c.rms_norm_eps),
                           tie_embeddings=bool(c.tie_word_embeddings),
                           qkv_bias=c.model_type == "qwen2" if c.attention_bias is None else c.attention_bias)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _supported_rope(c: HFConfig, where: str) -> RopeParameters:
    """The config's rope parameters, or ConfigError for an unsupported model_type or rope variant."""
    if c.model_type not in SUPPORTED:
        raise ConfigError(f"{where}: model_type {short(c.model_type)} is not supported (expected one of "
                          f"{', '.join(SUPPORTED)})")
    if c.rope_scaling:
        raise ConfigError(f"{where}: rope_scaling {short(c.rope_scaling)} is not supported by this runner")
    rope = c.rope_parameters or RopeParameters()
    if rope.rope_type not in ("default", None):
        raise ConfigError(f"{where}: rope_parameters.rope_type {short(rope.rope_type)} is not supported "
                          "by this runner")
    return rope


def _check_required(c: HFConfig, cfg: dict, where: str) -> None:
    """ConfigError for the first REQUIRED field that is absent or null."""
    for key in REQUIRED:
        if getattr(c, key) is None:
            raise ConfigError(f"{where}: {key}: missing" if key not in cfg else f"{where}: {key}: expected an "
                              "integer >= 1, got null")


def _check_heads(heads: int, kv_heads: int, dim: int, head_dim: int | None, where: str) -> None:
    """ConfigError unless the attention heads divide evenly and the head dimension is even."""
    if heads % kv_heads:
        raise ConfigError(f"{where}: num_attention_heads ({heads}) must be a multiple of "
                          f"num_key_value_heads ({kv_heads})")
    if head_dim is None and dim % heads:
        raise ConfigError(f"{where}: hidden_size ({dim}) must be a multiple of num_attention_heads ({heads}) "
                          "when head_dim is not given")
    if (head_dim or dim // heads) % 2:
        raise ConfigError(f"{where}: head_dim ({head_dim or dim // heads}) must be even (rotary positions)")


def param_count(c: ModelConfig) -> int:
    """Parameters of Transformer(c), from the config alone (nothing allocated)."""
    hd = c.head_dim
    attn = c.dim * c.n_heads * hd * 2 + c.dim * c.n_kv_heads * hd * 2
    bias = (c.n_heads + 2 * c.n_kv_heads) * hd if c.qkv_bias else 0
    per_layer = attn + bias + 3 * c.dim * c.hidden_dim + 2 * c.dim
    return c.vocab_size * c.dim * (1 if c.tie_embeddings else 2) + c.n_layers * per_layer + c.dim


def memory_limit() -> int:
    """Bytes a model may take while it is built: this machine's RAM (64 GiB when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 64 << 30


def check_model_size(c: ModelConfig, where: str, limit: int | None = None) -> None:
    """Refuse a config whose model would not fit in memory, before anything is allocated. The
    model is built in float32 on the CPU (then cast), and the rotary tables are built in float64."""
    limit = memory_limit() if limit is None else limit
    n = param_count(c)
    need = n * 4 + c.max_seq_len * c.head_dim * 32
    if need > limit:
        raise ConfigError(
            f"{where}: the model needs about {need / 2**30:,.1f} GiB ({n:,} parameters in float32, vocab_size "
            f"{c.vocab_size} x hidden_size {c.dim}, num_hidden_layers {c.n_layers}, intermediate_size "
            f"{c.hidden_dim}, max_position_embeddings {c.max_seq_len}); this machine has {limit / 2**30:,.1f} GiB")


# ---- *.safetensors --------------------------------------------------------------------------------

def read_safetensors_header(f: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} from a safetensors file's header, checked against the file's
    size: a bounded read, whatever the header claims."""
    size, n, raw = _read_header_bytes(f)
    doc = parse_json(raw.rstrip(b" "), f"{f}: safetensors header")
    if not isinstance(doc, dict):
        raise ConfigError(f"{f}: corrupt safetensors header (expected a JSON object, got {_type_name(doc)})")
    data_len = size - 8 - n
    out = {}
    for name, e in doc.items():
        if name == "__metadata__":
            continue
        out[name] = _header_entry(f"{f}: tensor {short(name)}", e, data_len)
    from safetensors import SafetensorError, safe_open
    try:  # the library's own checks (offsets that cover the data exactly, ...): reads the header only
        with safe_open(str(f), framework="pt"):
            pass
    except SafetensorError as e:
        raise ConfigError(f"{f}: corrupt safetensors file ({_first_line(e)})") from None
    return out


def _read_header_bytes(f: Path) -> tuple[int, int, bytes]:
    """(file size, header length, header bytes) of a safetensors file; ConfigError when the file is
    unreadable, or the header length is truncated, too large or past the file's end."""
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ConfigError(f"{f}: truncated safetensors file ({size} bytes; the header length takes 8)")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER_BYTES:
                raise ConfigError(f"{f}: corrupt safetensors file: the header claims {n:,} bytes "
                                  f"(at most {MAX_HEADER_BYTES:,} are read)")
            if 8 + n > size:
                raise ConfigError(f"{f}: truncated safetensors file: the header claims {n:,} bytes, "
                                  f"the file holds {size:,}")
            raw = fh.read(n)
    except OSError as e:
        raise ConfigError(f"{f}: cannot read ({e.strerror or e})") from None
    return size, n, raw


def _is_int(v) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def _header_entry(where: str, e, data_len: int) -> tuple[str, tuple[int, ...]]:
    """(dtype, shape) of one header entry, checked (dtype known, shape and data_offsets well formed,
    within the data section and of the shape's size)."""
    if not isinstance(e, dict):
        raise ConfigError(f"{where}: corrupt header entry {short(e)}")
    dt, shape, off = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if dt not in DTYPE_BYTES:
        raise ConfigError(f"{where}: unknown dtype {short(dt)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise ConfigError(f"{where}: corrupt shape {short(shape)}")
    if not (isinstance(off, list) and len(off) == 2 and all(_is_int(o) for o in off) and 0 <= off[0] <= off[1]):
        raise ConfigError(f"{where}: corrupt data_offsets {short(off)}")
    if off[1] > data_len:
        raise ConfigError(f"{where}: truncated file: the tensor's data ends at byte {off[1]:,} of the data "
                          f"section, which holds {data_len:,}")
    if math.prod(shape) * DTYPE_BYTES[dt] != off[1] - off[0]:
        raise ConfigError(f"{where}: corrupt header: shape {shape} in {dt} does not match data_offsets {off}")
    return dt, tuple(shape)


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def load_hf(path: str | Path, device="cpu", dtype=torch.float32) -> tuple[Transformer, object]:
    """(model, tokenizer or None) from a checkpoint directory. Everything is checked (config
    fields, the model's size, every safetensors header, names, dtypes and shapes) before the
    model is allocated; tensors are then read one at a time."""
    d = Path(path)
    if not d.is_dir():
        raise ConfigError(f"--model {path}: not a directory (expected config.json + *.safetensors)")
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise ConfigError(f"--model {path}: no config.json")
    raw = read_json(cfg_path, "config.json", MAX_CONFIG_BYTES)
    cfg = config_from_hf(raw, str(cfg_path))
    check_model_size(cfg, str(cfg_path))
    source = _weight_sources(d, cfg, cfg_path)
    # End of sequence: config.json's eos_token_id (an id or a list of ids) stops generation
    # whether or not a tokenizer is present.
    eos = raw.get("eos_token_id")
    if isinstance(eos, list):
        eos = tuple(i for i in eos if isinstance(i, int) and not isinstance(i, bool)) or None
    elif isinstance(eos, bool) or not isinstance(eos, int):
        eos = None
    tok = None
    if (d / "tokenizer.json").exists():
        from gpu_runner.tokenizer import HFTokenizer
        tok = HFTokenizer(d / "tokenizer.json", eos)
        if tok.vocab_size > cfg.vocab_size:
            raise ConfigError(f"{d / 'tokenizer.json'}: {tok.vocab_size} tokens, more than {cfg_path.name}'s "
                              f"vocab_size {cfg.vocab_size}")
    model = Transformer(cfg)
    _read_weights(model, source, cfg)
    model.eos_token_id = eos
    return model.to(device=device, dtype=dtype).eval(), tok


def _weight_sources(d: Path, cfg: ModelConfig, cfg_path: Path) -> dict:
    """Where each parameter's values are: {name: (file, stored name, dtype, shape)}, every name,
    dtype and shape checked against the model the config describes (nothing is allocated)."""
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--model {d}: no *.safetensors weights (pickled .bin files are not read)")
    found: dict[str, tuple[Path, str, str, tuple[int, ...]]] = {}  # our name -> (file, stored name, dtype, shape)
    for f in files:
        for k, (dt, shape) in read_safetensors_header(f).items():
            name = k.removeprefix("model.")
            if name in found:
                raise ConfigError(f"{f}: tensor {short(k)} is also in {found[name][0]}")
            found[name] = (f, k, dt, shape)
    with torch.device("meta"):  # names and shapes only: nothing is allocated
        expected = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    source = {}  # parameter -> where its values come from
    for k in expected:
        if k == "lm_head.weight" and (cfg.tie_embeddings or k not in found):
            continue  # tied to the embedding (a stored lm_head is ignored, as transformers does)
        if k in found:
            source[k] = found[k]
    missing = [k for k in expected if k not in source and k != "lm_head.weight"]
    if missing:
        raise ConfigError(f"--model {d}: weights missing for {', '.join(missing[:3])}"
                          + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))
    for k, (f, stored, dt, shape) in source.items():
        if dt not in FLOAT_DTYPES:
            raise ConfigError(f"{f}: tensor {stored} has dtype {dt}; expected floating-point weights "
                              f"({', '.join(FLOAT_DTYPES)}; quantized checkpoints are not read)")
        if shape != expected[k]:
            raise ConfigError(f"{f}: tensor {stored} has shape {shape}, expected {expected[k]} from {cfg_path.name}")
    return source


def _read_weights(model: Transformer, source: dict, cfg: ModelConfig):
    """Copy the checked tensors into the model, one at a time; NaN or infinite values refused."""
    from safetensors import SafetensorError, safe_open
    state = model.state_dict()
    by_file: dict[Path, list[str]] = {}
    for k, (f, *_rest) in source.items():
        by_file.setdefault(f, []).append(k)
    with torch.no_grad():
        for f, keys in by_file.items():
            try:
                with safe_open(str(f), framework="pt") as sf:
                    for k in keys:
                        stored = source[k][1]
                        t = sf.get_tensor(stored)
                        if not torch.isfinite(t).all():
                            raise ConfigError(f"{f}: tensor {stored} holds NaN or infinite values")
                        state[k].copy_(t)
                        del t
            except SafetensorError as e:
                raise ConfigError(f"{f}: corrupt safetensors file ({_first_line(e)})") from None
        if "lm_head.weight" not in source and not cfg.tie_embeddings:
            state["lm_head.weight"].copy_(state["embed_tokens.weight"])


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
    if c.vocab_size == 258:   # the bundled byte models: a tokenizer others can load too
        write_byte_tokenizer(d, bos_token_id, eos_token_id)


BYTE_SPECIALS = {256: "<s>", 257: "</s>"}


def write_byte_tokenizer(d: Path, bos_token_id: int | None, eos_token_id: int | None) -> None:
    """tokenizer.json (+ tokenizer_config.json) for the byte models: token id = byte value
    (0..255), <s> = 256, </s> = 257; built with the `tokenizers` library (byte-level model,
    no merges), so transformers and vLLM encode text exactly as gpu_runner.tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    chars = ByteLevel.alphabet()   # the 256 printable stand-ins byte-level BPE uses for bytes
    table = _bytes_to_unicode()
    assert sorted(table.values()) == sorted(chars)
    vocab = {table[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(BYTE_SPECIALS[i], special=True) for i in (256, 257)])
    tok.save(str(d / "tokenizer.json"))
    names = {i: BYTE_SPECIALS.get(i) for i in (bos_token_id, eos_token_id)}
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": names.get(bos_token_id),
        "eos_token": names.get(eos_token_id), "add_bos_token": False, "add_eos_token": False,
        "model_max_length": 1_000_000, "clean_up_tokenization_spaces": False}, indent=1) + "\n")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what ByteLevel pre-tokenization produces)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
