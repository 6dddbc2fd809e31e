"""Opening a workload file: the format follows the name's suffix, then the content.

- our JSON (core.workload.native); a `serving-trace/1` document is read as the workload of that trace;
- Vidur-style CSV: arrived_at (seconds), num_prefill_tokens, num_decode_tokens (core.workload.files);
- LLMServingSim-style JSONL: input_toks, output_toks, arrival_time_ns (core.workload.files);
- Mooncake-format JSONL: timestamp, input_length, output_length, hash_ids (core.workload.mooncake),
  told from LLMServingSim's by its first object (hash_ids and input_length). block_tokens (tokens per
  512-token hash block, default 512) applies to Mooncake files only.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.errors import WorkloadError, gunzip, loads_json, read_input_file
from core.workload.files import from_llmservingsim_jsonl, from_vidur_csv
from core.workload.model import Workload
from core.workload.mooncake import TRACE_BLOCK_TOKENS, first_object, from_mooncake_jsonl, is_mooncake
from core.workload.native import Tokenize, from_json_doc


def decode_bytes(data: bytes, name: str, error=WorkloadError) -> str:
    data = gunzip(data, name, error)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{name}: not UTF-8 text (byte {e.start})") from None


def _jsonl(text: str, name: str, block_tokens: int, limits: dict) -> Workload:
    if is_mooncake(first_object(text)):
        return from_mooncake_jsonl(text, name, block_tokens, **limits)
    return from_llmservingsim_jsonl(text, name)


def parse_workload(data: bytes | str, name: str = "workload", tokenize: Tokenize | None = None,
                   block_tokens: int = TRACE_BLOCK_TOKENS, max_prompt_tokens: int | None = None,
                   limit_why: str = "") -> Workload:
    """Parse a workload file's content; the format follows the name's suffix, then content.
    `max_prompt_tokens`: at most this many prompt token ids built from hash ids (a Mooncake trace's
    expansion; a shared page's lower limit, `limit_why` saying so)."""
    limits = {} if max_prompt_tokens is None else {"max_prompt_tokens": max_prompt_tokens, "limit_why": limit_why}
    text = decode_bytes(data, name) if isinstance(data, bytes) else data
    lower = name.lower().removesuffix(".gz")
    if lower.endswith(".csv"):
        return from_vidur_csv(text, name)
    if lower.endswith(".jsonl"):
        return _jsonl(text, name, block_tokens, limits)
    try:
        doc = loads_json(text, name, WorkloadError)
    except json.JSONDecodeError as e:
        first = text.lstrip()[:1]
        if first == "{" and "\n{" in text.strip():
            return _jsonl(text, name, block_tokens, limits)
        if first and first not in "{[":
            if "arrived_at" in text.split("\n", 1)[0]:
                return from_vidur_csv(text, name)
        raise WorkloadError(f"{name}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if is_mooncake(doc):  # a one-line Mooncake file
        return from_mooncake_jsonl(text, name, block_tokens, **limits)
    if isinstance(doc, dict) and "schema" in doc and "events" in doc:
        # A serving trace: its requests are the workload (max_output_tokens is read as
        # output_tokens); its events are not needed, so core.trace is not involved.
        meta = doc.get("meta")
        label = meta.get("label") if isinstance(meta, dict) else None
        doc = {"requests": doc.get("requests"), "name": label if isinstance(label, str) and label else "trace workload"}
    return from_json_doc(doc, name, tokenize)


def load_workload(path: str | Path, tokenize: Tokenize | None = None,
                  block_tokens: int = TRACE_BLOCK_TOKENS) -> Workload:
    return parse_workload(read_input_file(path, "workload", WorkloadError), Path(path).name, tokenize,
                          block_tokens)


