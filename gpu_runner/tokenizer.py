"""Tokenizers: the bundled byte-level one, or a Hugging Face tokenizer.json (via the
`tokenizers` package, loaded from a local file; never downloaded)."""
from __future__ import annotations

from pathlib import Path

BOS, EOS = 256, 257
MAX_TOKENIZER_BYTES = 512 << 20  # tokenizer.json: tens of MiB at most in practice


class ByteTokenizer:
    """UTF-8 bytes are the tokens (ids 0-255); 256 = BOS, 257 = EOS."""
    vocab_size = 258
    bos_id, eos_id = BOS, EOS
    name = "byte"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    name = "tokenizer.json"

    def __init__(self, path: Path, eos_id: int | None = None):
        from tokenizers import Tokenizer

        from core.errors import ConfigError, json_from_bytes, read_input_file
        data = read_input_file(path, "tokenizer.json", ConfigError, MAX_TOKENIZER_BYTES)
        doc = json_from_bytes(data, str(path), ConfigError)
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            raise ConfigError(f"{path}: not a Hugging Face tokenizer.json (expected an object with a \"model\" "
                              "object)")
        try:
            self.tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # the tokenizers library raises plain Exception
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"{path}: not a tokenizer.json the tokenizers library can read ({msg})") from None
        self.vocab_size = self.tok.get_vocab_size()
        self.path = Path(path)
        self.eos_id = eos_id
        self.bos_id = None

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids))


def tokenizer_from_spec(spec):
    """The tokenizer a gpu_runner.messages.TokenizerSpec describes (the server encodes prompts with
    the engine's own tokenizer: the same file, read again), or None."""
    if spec.kind == "byte":
        return ByteTokenizer()
    if spec.kind == "hf" and spec.path is not None:
        eos = tuple(spec.eos_id) if isinstance(spec.eos_id, list) else spec.eos_id
        return HFTokenizer(Path(spec.path), eos)
    return None
