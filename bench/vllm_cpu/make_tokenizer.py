"""Write a byte-level Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) that
matches the bundled byte models: id b (0-255) is the byte b, 256 = <s> (BOS), 257 = </s>
(EOS). `python -m gpu_runner export-hf` writes config.json + model.safetensors only, so
vLLM is given this directory with `--tokenizer DIR`.

The file is plain JSON built here (no `tokenizers` import needed); with `--check` it is
loaded back with the `tokenizers` library of whichever interpreter runs this and every
byte is checked to round-trip to its own id.

    python bench/vllm_cpu/make_tokenizer.py OUT_DIR [--check]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what the ByteLevel pre-tokenizer emits)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def special(i: int, content: str) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def tokenizer_doc() -> dict:
    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    vocab["<s>"] = 256
    vocab["</s>"] = 257
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [special(256, "<s>"), special(257, "</s>")],
            "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": []}}


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_doc(), ensure_ascii=False, indent=1) + "\n")
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
           "model_max_length": 2048}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}) + "\n")


def check(out: Path) -> None:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == 258, tok.get_vocab_size()
    for b in range(128):  # every ASCII byte is its own id
        assert tok.encode(chr(b), add_special_tokens=False).ids == [b], b
    for b in range(256):  # every id decodes back to its byte (through the ByteLevel decoder)
        assert tok.id_to_token(b) is not None, b
    text = "def f(x):\n    return x  # é ü 日本\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == list(text.encode("utf-8")), ids
    assert tok.decode(ids) == text, tok.decode(ids)
    assert tok.decode([256, 104, 105, 257], skip_special_tokens=True) == "hi"
    print(f"{out / 'tokenizer.json'}: byte-level, 258 tokens, round-trip OK")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = Path(sys.argv[1])
    write(d)
    if "--check" in sys.argv[2:]:
        check(d)
