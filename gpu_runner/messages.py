"""The messages between the HTTP server and its engine, declared once (msgspec Structs, as vLLM's
EngineCoreRequest / EngineCoreOutputs): the same objects whether the engine runs in a thread of
the server (passed as they are) or in its own process (msgpack over a pipe). No positional
tuples: every field is named and typed, and a message that does not fit its declaration fails
to decode.

    server -> engine:  AddRequest, AbortRequest, Shutdown
    engine -> server:  EngineInfo (once, when ready) | Fatal (could not start)
                       Outputs (after each engine output: per-request events + the step's gauges)
                       Stopped (the engine has ended; what it served)

Per request, the engine sends Accepted (it entered the waiting queue), Scheduled (first run),
RequestOutput (new token ids with their text, already detokenised and cut at stop strings; the
last one carries the finish reason) and Failed (no result: a rejection or an error, with the
HTTP status that answers it). Every request ends with exactly one RequestOutput that has a
finish reason, or one Failed.
"""
from __future__ import annotations

import msgspec

from core.config import SamplingParams


class KVBlob(msgspec.Struct, frozen=True):
    """A prompt's KV cache as tensors' bytes (disaggregated prefill -> decode): K and V of every
    layer for the prompt's first `tokens` positions, each [layers, tokens, kv_heads, head_dim]
    of `dtype`, C order. `t_start_ms`: when the prefill engine began copying it out of its
    cache (its step had ended); `t_sent_ms`: when the copy was ready to send."""
    tokens: int
    dtype: str
    shape: list[int]
    k: bytes
    v: bytes
    t_start_ms: float
    t_sent_ms: float

    @property
    def nbytes(self) -> int:
        return len(self.k) + len(self.v)


class AddRequest(msgspec.Struct, tag="add", frozen=True):
    rid: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_token_ids: list[int] | None       # None: the model's EOS; []: none (ignore_eos)
    stop: list[str]                        # stop strings: the engine's output processor cuts at them
    arrival_ms: float                      # on the engine's clock (one origin for both processes)
    kv: KVBlob | None = None               # disaggregated decode: the prompt's KV, computed elsewhere
    kv_out: bool = False                   # disaggregated prefill: send the prompt's KV when it finishes


class AbortRequest(msgspec.Struct, tag="abort", frozen=True):
    rid: str
    reason: str = "abort"


class Shutdown(msgspec.Struct, tag="shutdown", frozen=True):
    pass


ToEngine = AddRequest | AbortRequest | Shutdown


class TokenizerSpec(msgspec.Struct, frozen=True):
    """How the server builds the same tokenizer to encode prompts (the engine decodes outputs)."""
    kind: str                              # byte | hf | none
    path: str | None = None                # tokenizer.json (hf)
    eos_id: int | list[int] | None = None


class EngineInfo(msgspec.Struct, tag="ready", frozen=True):
    """What the server needs of its engine: the model's limits and tokenizer, the stop ids,
    the sampling a speculative engine uses for every request, and the scheduler's shape."""
    model: str
    max_seq_len: int
    vocab_size: int
    tokenizer: TokenizerSpec
    stop_token_ids: list[int]
    speculative: bool
    sampling: SamplingParams               # the engine's own (a speculative batch uses it for all)
    policy: str
    kv_blocks: int
    block_size: int
    max_seqs: int | None


class Fatal(msgspec.Struct, tag="fatal", frozen=True):
    message: str


class Accepted(msgspec.Struct, tag="accepted", frozen=True):
    rid: str


class Scheduled(msgspec.Struct, tag="scheduled", frozen=True):
    rid: str
    prompt_tokens: int
    t_ms: float


class RequestOutput(msgspec.Struct, tag="output", frozen=True):
    rid: str
    token_ids: list[int]                   # new ids (all the step emitted, a stop string's included)
    text: str                              # new text: detokenised, held back while it could still
    #                                        grow into a stop string, cut before a matched one
    t_ms: float
    finish_reason: str | None = None       # length | stop | abort | deadline (None: more to come)
    detail: str | None = None


class Failed(msgspec.Struct, tag="failed", frozen=True):
    rid: str
    message: str
    status: int                            # the HTTP status that answers it (400, 500, 503)
    cut: bool = False                      # a fleet's replica died under it: its stream is cut, as a router
    #                                        cuts a stream whose upstream died (gpu_runner.server.StreamCut)


class KVReady(msgspec.Struct, tag="kv_ready", frozen=True):
    """Disaggregated prefill: the request's prompt KV, copied out as its prefill finished."""
    rid: str
    kv: KVBlob


class KVLoaded(msgspec.Struct, tag="kv_loaded", frozen=True):
    """Disaggregated decode: the request's KV arrived in this engine (`t_recv_ms`, its message
    decoded) and was written into its blocks (`t_written_ms`, at its first step); `bytes` written
    (blocks it already held as prefix-cache hits are not overwritten)."""
    rid: str
    t_recv_ms: float
    t_written_ms: float
    bytes: int


class StepStats(msgspec.Struct, tag="stats", frozen=True):
    running: int
    waiting: int
    kv_usage: float
    preemptions: int
    hit_tokens: int                        # prefix-cache hits since the last StepStats, in tokens
    kv_used_blocks: int = 0
    cache_news: list[tuple[int, bytes]] = []   # (+1 cached | -1 evicted, block hash) since the last (a fleet
    #                                            router's precise prefix knowledge; only when asked)
    tier: tuple | None = None               # the CPU tier's metrics so far (core.kvtier.tier.CPUTier.metrics)


RequestEvent = Accepted | Scheduled | RequestOutput | Failed | KVReady | KVLoaded


class Outputs(msgspec.Struct, tag="outputs", frozen=True):
    events: list[RequestEvent]
    stats: StepStats | None = None


class Stopped(msgspec.Struct, tag="stopped", frozen=True):
    requests: int
    steps: int


FromEngine = EngineInfo | Fatal | Outputs | Stopped

_ENC = msgspec.msgpack.Encoder()
_TO_ENGINE = msgspec.msgpack.Decoder(ToEngine)
_FROM_ENGINE = msgspec.msgpack.Decoder(FromEngine)


def encode(msg) -> bytes:
    return _ENC.encode(msg)


def decode_to_engine(raw: bytes) -> AddRequest | AbortRequest | Shutdown:
    return _TO_ENGINE.decode(raw)


def decode_from_engine(raw: bytes) -> EngineInfo | Fatal | Outputs | Stopped:
    return _FROM_ENGINE.decode(raw)
