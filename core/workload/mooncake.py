"""Mooncake-format traces (kvcache-ai/Mooncake, FAST25-release/traces; AIPerf, guidellm and NVIDIA
Dynamo replay the same format): JSONL, one request a line,
    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2354]}
timestamp: arrival, ms since the trace start; input_length, output_length: tokens; hash_ids: one id
per 512-token block of the prompt (the last block may be partial). An id stands for a block and the
whole prefix before it, so requests whose hash_ids begin alike share that much prompt.

The prompt's token ids are made up from the hash ids so that the prefix cache (chained hashes over
full blocks of token ids, core.engine.prefix_cache) reuses exactly where hash_ids agree: block k of
the prompt holds the ids hash_ids[k] * block_tokens + j, j = 0, 1, ... (distinct hash ids give
distinct tokens; every id stays within 0..2**63-1 or the line is refused).

block_tokens: tokens per hash block in the workload. 512 (the default) is the traces' own block;
a smaller one scales every length by block_tokens/512, rounded up, at least 1, and keeps the sharing
structure: with 16, a 6,758-token prompt of 14 blocks becomes 212 tokens, 13 blocks of 16 and one of
4. A multiple of the simulator's block_size lets every hash block fill whole KV blocks. A scale other
than 512 is written into the workload's name.

Conventions (checked on every line of the published conversation and synthetic traces):
- len(hash_ids) == ceil(input_length / 512), otherwise the line is refused;
- output_length 0 is read as 1 (a request here emits at least one token; its prefill is the same);
  the workload's name says how many were;
- a request's id is its `id` or `request_id` field if given, else "mc-<line number>";
- other fields are ignored.
Each request keeps its prompt's token ids, so a file whose prompts hold more than MAX_PROMPT_TOKENS
tokens in all (after scaling) is refused, with block_tokens offered as the way to read it.
"""
from __future__ import annotations

import json
from itertools import chain
from typing import Annotated

import msgspec
from msgspec import Meta

from core.errors import WorkloadError, loads_json, validation_message
from core.workload.model import MAX_TIME_MS, MAX_TOKEN_ID, MAX_TOKENS, Request, Workload, located

TRACE_BLOCK_TOKENS = 512          # tokens per hash block in the published traces
MAX_PROMPT_TOKENS = 20_000_000    # prompt token ids kept in all: ~0.7 GB here (8 bytes a token, 32 a distinct id)
MAX_INT_DIGITS = 20               # a longer integer is out of every range here (2**63 has 19 digits)


class MooncakeLine(msgspec.Struct):
    """One line's shape and ranges, declared once; msgspec words a refusal naming the field."""
    timestamp: Annotated[float, Meta(ge=0, le=MAX_TIME_MS)]                # ms since the trace start
    input_length: Annotated[int, Meta(ge=1, le=MAX_TOKENS)]                # prompt tokens
    output_length: Annotated[int, Meta(ge=0, le=MAX_TOKENS)]               # output tokens (0 read as 1)
    hash_ids: list[Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]]            # one per 512-token block
    id: str | int | None = None
    request_id: str | int | None = None


def is_mooncake(first: object) -> bool:
    """Whether a JSONL file's first object reads as a Mooncake line."""
    return isinstance(first, dict) and "hash_ids" in first and "input_length" in first


def first_object(text: str) -> object:
    """The first non-blank line as JSON, or None when it is not JSON (then another reader words it)."""
    line = next((s for s in text.split("\n", 64)[:64] if s.strip()), "")
    try:
        return loads_json(line, "line", WorkloadError, parse_int=lambda s: int(s) if len(s) <= MAX_INT_DIGITS else 0)
    except (ValueError, WorkloadError):
        return None


def scaled(n: int, block_tokens: int) -> int:
    """A length in the trace's tokens as a length in the workload's: x block_tokens/512, rounded up, >= 1."""
    return max(1, -(-n * block_tokens // TRACE_BLOCK_TOKENS))


def from_mooncake_jsonl(text: str, name: str, block_tokens: int = TRACE_BLOCK_TOKENS,
                        max_prompt_tokens: int = MAX_PROMPT_TOKENS, limit_why: str = "") -> Workload:
    """`max_prompt_tokens` (at most MAX_PROMPT_TOKENS): a caller's lower bound on the prompt token ids
    kept, `limit_why` saying whose (a shared page's)."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) \
            or not 1 <= block_tokens <= TRACE_BLOCK_TOKENS:
        raise WorkloadError(f"block_tokens: expected an integer in 1..{TRACE_BLOCK_TOKENS} (tokens per "
                            f"{TRACE_BLOCK_TOKENS}-token hash block), got {block_tokens!r}")
    max_hash = (MAX_TOKEN_ID - (block_tokens - 1)) // block_tokens
    blocks: dict[int, tuple[int, ...]] = {}   # hash id -> its block's token ids (shared by every request)
    out, total, zero_out = [], 0, 0
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        where = f"{name} line {i + 1}"
        d = _line(line, where, max_hash, block_tokens)
        n_prompt = scaled(d.input_length, block_tokens)
        total += n_prompt
        limit = min(MAX_PROMPT_TOKENS, max_prompt_tokens)
        if total > limit:
            raise WorkloadError(
                f"{where}: the prompts reach {total:,} tokens, more than {limit:,} (each request keeps "
                f"its prompt's token ids{limit_why}); read it with a smaller block_tokens (16 makes each "
                f"{TRACE_BLOCK_TOKENS}-token block 16 tokens)")
        zero_out += d.output_length == 0
        rid = d.id if d.id is not None else d.request_id
        try:
            out.append(Request(
                id=str(rid) if rid is not None else f"mc-{i + 1}",
                arrival_ms=d.timestamp,
                prompt_tokens=n_prompt,
                max_output_tokens=scaled(d.output_length, block_tokens),
                prompt_ids=_prompt_ids(d.hash_ids, n_prompt, block_tokens, blocks)))
        except WorkloadError as e:
            raise located(where, e) from None
    try:
        w = Workload(out, name=name)
    except WorkloadError as e:
        raise located(name, e) from None
    notes = [f"block_tokens={block_tokens}: lengths x{block_tokens}/{TRACE_BLOCK_TOKENS}"] \
        if block_tokens != TRACE_BLOCK_TOKENS else []
    if zero_out:
        notes.append(f"output_length 0 read as 1 in {zero_out} request{'s' * (zero_out != 1)}")
    if notes:
        w.name = f"{name} ({'; '.join(notes)})"
    return w


def _line(line: str, where: str, max_hash: int, block_tokens: int) -> MooncakeLine:
    def parse_int(s):
        if len(s.lstrip("-")) > MAX_INT_DIGITS:
            raise WorkloadError(f"{where}: {s[:12]}... ({len(s):,} digits) is beyond every range here")
        return int(s)
    try:
        d = msgspec.convert(loads_json(line, where, WorkloadError, parse_int=parse_int), MooncakeLine)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{where}: not JSON ({e.msg}, column {e.colno})") from None
    except msgspec.ValidationError as e:
        raise WorkloadError(validation_message(e, where, top=where)) from None
    n, n_blocks = len(d.hash_ids), -(-d.input_length // TRACE_BLOCK_TOKENS)
    if n != n_blocks:
        raise WorkloadError(f"{where}.hash_ids: {n} block id{'s' * (n != 1)}, expected {n_blocks} (one per "
                            f"{TRACE_BLOCK_TOKENS}-token block of input_length {d.input_length})")
    big = next((k for k, h in enumerate(d.hash_ids) if h > max_hash), None)
    if big is not None:
        raise WorkloadError(f"{where}.hash_ids[{big}]: {d.hash_ids[big]} is too large: its token ids "
                            f"(hash id x {block_tokens} + position) would pass 2**63-1; at most {max_hash}")
    return d


def _prompt_ids(hash_ids: list[int], n_prompt: int, bt: int, blocks: dict) -> tuple[int, ...]:
    # Block k: hash_ids[k] * bt + j for j < bt; the last block only as far as the prompt reaches.
    def block(h):
        b = blocks.get(h)
        if b is None:
            b = blocks[h] = tuple(range(h * bt, h * bt + bt))
        return b
    last = n_prompt - (len(hash_ids) - 1) * bt          # 1..bt tokens (scaled() keeps it so)
    return tuple(chain.from_iterable([*map(block, hash_ids[:-1]), block(hash_ids[-1])[:last]]))
