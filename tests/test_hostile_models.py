"""Broken model directories (GitHub issue 10, items 9 and 10): every one is a one-line
`error: ...` naming the file and the field, exit code 2, before anything large is allocated."""
import json
import shutil
import struct

import pytest
import torch

from core.errors import ConfigError
from gpu_runner import checkpoint
from gpu_runner.__main__ import main
from gpu_runner.hf import check_model_size, config_from_hf, export_hf, load_hf, param_count
from gpu_runner.model import ModelConfig, Transformer


@pytest.fixture(scope="module")
def good(tmp_path_factory, bundled):
    d = tmp_path_factory.mktemp("good")
    export_hf(bundled("tiny"), d, eos_token_id=257, bos_token_id=256)
    return d


@pytest.fixture
def ckpt(good, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(good, d)
    return d


def edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def cli_error(capsys, d, *args):
    """Run `generate` on checkpoint d: exit code 2 and one line on stderr, returned."""
    argv = list(args) or ["generate", "--model", str(d), "--prompt-ids", "1,2", "--max-tokens", "1",
                          "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_good_checkpoint_loads(ckpt, bundled):
    model, tok = load_hf(ckpt)
    assert model.eos_token_id == 257
    assert tok is not None and tok.encode("Hi") == [72, 105]     # the exported byte tokenizer
    ref = bundled("tiny")
    ids = torch.tensor([[256, 72, 105]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids))


# ---- safetensors files ------------------------------------------------------------------------

def st(d):
    return d / "model.safetensors"


def test_truncated_safetensors(ckpt, capsys):
    data = st(ckpt).read_bytes()
    st(ckpt).write_bytes(data[: len(data) // 2])
    err = cli_error(capsys, ckpt)
    assert "model.safetensors" in err and "truncated" in err


@pytest.mark.parametrize("size", [0, 5])
def test_safetensors_shorter_than_its_header_length(ckpt, capsys, size):
    st(ckpt).write_bytes(b"\x01" * size)
    err = cli_error(capsys, ckpt)
    assert "model.safetensors" in err and "truncated" in err


def test_safetensors_header_bomb(ckpt, capsys):
    st(ckpt).write_bytes(struct.pack("<Q", 1 << 62) + b"{}")
    err = cli_error(capsys, ckpt)
    assert "model.safetensors" in err and "header claims" in err


@pytest.mark.parametrize("header, msg", [
    (b"\xff\xfe garbage", "not UTF-8"),
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"embed_tokens.weight": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}', "unknown dtype"),
    (b'{"embed_tokens.weight": {"dtype": "F32", "shape": "x", "data_offsets": [0, 4]}}', "corrupt shape"),
    (b'{"embed_tokens.weight": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', "data_offsets"),
    (b'{"embed_tokens.weight": {"dtype": "F32", "shape": [9], "data_offsets": [0, 4]}}', "does not match"),
    (b'{"embed_tokens.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4000]}}', "truncated"),
])
def test_corrupt_safetensors_header(ckpt, capsys, header, msg):
    st(ckpt).write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    err = cli_error(capsys, ckpt)
    assert "model.safetensors" in err and msg in err, err


def test_corrupt_tensor_data_caught_by_safetensors(ckpt, capsys):
    # A header that passes our checks but that safetensors refuses (data section not covered).
    header = json.dumps({k: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
                         for k in ("a", "b")}).encode()
    st(ckpt).write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    err = cli_error(capsys, ckpt)
    assert "model.safetensors" in err


def test_wrong_dtype_tensor(ckpt, capsys):
    from safetensors.torch import load_file, save_file
    state = load_file(str(st(ckpt)))
    state["model.norm.weight"] = state["model.norm.weight"].to(torch.int32)
    save_file(state, str(st(ckpt)))
    err = cli_error(capsys, ckpt)
    assert "model.safetensors" in err and "model.norm.weight" in err and "I32" in err


def test_half_precision_tensors_load(ckpt):
    from safetensors.torch import load_file, save_file
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(st(ckpt))).items()}, str(st(ckpt)))
    model, _ = load_hf(ckpt)
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights(ckpt, capsys, bad):
    from safetensors.torch import load_file, save_file
    state = load_file(str(st(ckpt)))
    state["model.layers.1.mlp.up_proj.weight"][3, 4] = bad
    save_file(state, str(st(ckpt)))
    err = cli_error(capsys, ckpt)
    assert "model.safetensors" in err and "layers.1.mlp.up_proj.weight" in err and "NaN" in err


def test_wrong_shape_and_missing_tensors(ckpt, capsys):
    from safetensors.torch import load_file, save_file
    state = load_file(str(st(ckpt)))
    state["model.norm.weight"] = torch.ones(7)
    save_file(state, str(st(ckpt)))
    err = cli_error(capsys, ckpt)
    assert "model.norm.weight" in err and "(7,)" in err and "(256,)" in err
    del state["model.norm.weight"]
    save_file(state, str(st(ckpt)))
    assert "weights missing for norm.weight" in cli_error(capsys, ckpt)


def test_tensor_in_two_shards(ckpt, capsys):
    shutil.copy(st(ckpt), ckpt / "model-2.safetensors")
    err = cli_error(capsys, ckpt)
    assert "model.safetensors" in err and "model-2.safetensors" in err


# ---- config.json ----------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "intermediate_size", "num_key_value_heads", "head_dim",
                                   "max_position_embeddings"])
@pytest.mark.parametrize("value", ["256", True, 2.5, -1, 0, [4], {"a": 1}])
def test_config_integer_fields(ckpt, capsys, field, value):
    edit_config(ckpt, **{field: value})
    err = cli_error(capsys, ckpt)
    assert "config.json" in err and f"{field}: expected an integer" in err, err


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "intermediate_size"])
def test_config_required_fields_null_or_missing(ckpt, capsys, field):
    edit_config(ckpt, **{field: None})
    assert f"{field}: expected an integer >= 1, got null" in cli_error(capsys, ckpt)
    edit_config(ckpt, **{field: ...})
    assert f"{field}: missing" in cli_error(capsys, ckpt)


@pytest.mark.parametrize("field, value", [("rope_theta", "1e4"), ("rope_theta", 0), ("rope_theta", True),
                                          ("rms_norm_eps", -1e-5), ("rms_norm_eps", "small"),
                                          ("rope_parameters", [1]), ("rope_parameters", {"rope_theta": "x"})])
def test_config_float_fields(ckpt, capsys, field, value):
    edit_config(ckpt, **{field: value}, **({"rope_theta": ...} if field == "rope_parameters" else {}))
    err = cli_error(capsys, ckpt)
    assert "config.json" in err and field in err, err


@pytest.mark.parametrize("field", ["tie_word_embeddings", "attention_bias"])
def test_config_bool_fields(ckpt, capsys, field):
    edit_config(ckpt, **{field: "false"})
    assert f"{field}: expected true or false" in cli_error(capsys, ckpt)


def test_config_null_optional_fields_take_defaults(ckpt):
    edit_config(ckpt, head_dim=None, max_position_embeddings=None, tie_word_embeddings=True, rope_theta=None,
                rms_norm_eps=None, attention_bias=None)
    model, _ = load_hf(ckpt)
    assert model.cfg.head_dim == 32 and model.cfg.max_seq_len == 2048 and model.cfg.rope_theta == 10000.0
    edit_config(ckpt, num_key_value_heads=None)  # defaults to num_attention_heads: k_proj no longer fits
    with pytest.raises(ConfigError, match=r"k_proj.weight has shape \(64, 256\), expected \(256, 256\)"):
        load_hf(ckpt)


def test_rope_parameters_other_than_default_are_refused(ckpt, capsys):
    edit_config(ckpt, rope_parameters={"rope_type": "llama3", "factor": 8.0})
    assert "rope_parameters.rope_type 'llama3' is not supported" in cli_error(capsys, ckpt)


@pytest.mark.parametrize("content, msg", [
    (b"[1, 2, 3]", "expected a JSON object, got a list"),
    (b'"llama"', "expected a JSON object, got a string"),
    (b'{"model_type": "llama", "vocab_size": \xff\xfe}', "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"vocab_size": ' + b"9" * 5000 + b"}", "not valid JSON"),
    (b"{oops", "not valid JSON"),
])
def test_config_not_an_object(ckpt, capsys, content, msg):
    (ckpt / "config.json").write_bytes(content)
    err = cli_error(capsys, ckpt)
    assert "config.json" in err and msg in err, err


def test_config_too_large(ckpt, capsys):
    (ckpt / "config.json").write_bytes(b" " * (17 << 20))
    assert "config.json: larger than" in cli_error(capsys, ckpt)


@pytest.mark.parametrize("changes, msg", [
    ({"hidden_size": 250}, "hidden_size (250) must be a multiple of num_attention_heads (8)"),
    ({"num_key_value_heads": 3}, "num_attention_heads (8) must be a multiple of num_key_value_heads (3)"),
    ({"head_dim": 33}, "head_dim (33) must be even"),
])
def test_heads_not_dividing(ckpt, capsys, changes, msg):
    edit_config(ckpt, **({"head_dim": ...} if "hidden_size" in changes else {}), **changes)
    err = cli_error(capsys, ckpt)
    assert "config.json" in err and msg in err, err


def test_model_config_raises_config_error_with_field_names():
    with pytest.raises(ConfigError, match=r"dim \(250\) must be a multiple of n_heads \(8\)"):
        ModelConfig(dim=250, n_heads=8)
    with pytest.raises(ConfigError, match=r"n_heads \(8\) must be a multiple of n_kv_heads \(3\)"):
        ModelConfig(n_heads=8, n_kv_heads=3)
    for field in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "max_seq_len"):
        with pytest.raises(ConfigError, match=f"model config: {field}: expected a positive integer"):
            ModelConfig(**{field: 0})
    with pytest.raises(ConfigError, match="rope_theta"):
        ModelConfig(rope_theta=float("nan"))


@pytest.mark.parametrize("changes", [
    {"vocab_size": 10**9, "hidden_size": 10**6},
    {"num_hidden_layers": 10**6, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64},
    {"max_position_embeddings": 10**15},
])
def test_model_too_large_is_refused_before_allocating(ckpt, capsys, changes, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("Transformer built")
    monkeypatch.setattr("gpu_runner.hf.Transformer", boom)
    edit_config(ckpt, **{"head_dim": ...}, **changes)
    err = cli_error(capsys, ckpt)
    assert "config.json" in err and "GiB" in err and "vocab_size" in err and "this machine has" in err, err


def test_param_count_matches_the_model():
    for cfg in (ModelConfig(), ModelConfig(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                           hidden_dim=160, tie_embeddings=False, qkv_bias=True)):
        assert param_count(cfg) == Transformer(cfg).num_params()
    check_model_size(ModelConfig(), "x")
    with pytest.raises(ConfigError, match="x: the model needs"):
        check_model_size(ModelConfig(), "x", limit=1 << 20)


def test_config_from_hf_accepts_only_objects():
    with pytest.raises(ConfigError, match="expected a JSON object"):
        config_from_hf([])


# ---- tokenizer.json -----------------------------------------------------------------------------

@pytest.mark.parametrize("content, msg", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b"[1, 2]", "not a Hugging Face tokenizer.json"),
    (b'{"model": 5}', "not a Hugging Face tokenizer.json"),
    (b'{"model": {"type": "Nonsense"}}', "tokenizers library can read"),
])
def test_bad_tokenizer_json(ckpt, capsys, content, msg):
    (ckpt / "tokenizer.json").write_bytes(content)
    err = cli_error(capsys, ckpt)
    assert "tokenizer.json" in err and msg in err, err


def test_tokenizer_larger_than_the_vocabulary(ckpt, capsys):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    Tokenizer(WordLevel({f"w{i}": i for i in range(300)}, unk_token="w0")).save(str(ckpt / "tokenizer.json"))
    err = cli_error(capsys, ckpt)
    assert "tokenizer.json: 300 tokens" in err and "vocab_size 258" in err


# ---- item 10: a request longer than the model ---------------------------------------------------

@pytest.mark.parametrize("prompt", [1000, 10_000_000])
def test_capture_refuses_a_request_longer_than_the_model(tmp_path, capsys, prompt):
    w = tmp_path / "w.json"
    w.write_text(json.dumps({"requests": [{"id": "ok", "arrival_ms": 0, "prompt_tokens": 10, "output_tokens": 5},
                                          {"id": "huge", "arrival_ms": 0, "prompt_tokens": prompt,
                                           "output_tokens": 10_000_000}]}))
    err = cli_error(capsys, None, "capture", "--model", "tiny", "--device", "cpu", "--workload", str(w),
                    "--out", str(tmp_path / "t.json"))
    assert "'huge'" in err and f"{prompt + 10_000_000:,} tokens exceeds the model's 2,048 positions" in err, err
    assert not (tmp_path / "t.json").exists()


# ---- bundled checkpoints ------------------------------------------------------------------------

def test_broken_bundled_checkpoint(tmp_path):
    d = tmp_path / "tiny"
    shutil.copytree(checkpoint.BUNDLED["tiny"], d)
    (d / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 9\n")
    with pytest.raises(ConfigError, match="model.safetensors: corrupt safetensors file"):
        checkpoint.load_bundled(d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "n_kv_heads": 3}))
    with pytest.raises(ConfigError, match=r"config.json: model config: n_heads \(8\) must be a multiple"):
        checkpoint.load_bundled(d)
