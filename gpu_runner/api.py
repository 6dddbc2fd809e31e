"""The request bodies `gpu_runner serve` accepts, declared once (msgspec Structs with Meta
constraints): decoding checks every field and a failure becomes one line naming the field
("max_tokens: expected an integer >= 1, got 0"). Unknown fields are ignored (benchmark clients
send extras) and reported once by the server.

Fields: max_tokens (default 16), temperature (default 1.0, as OpenAI), top_p, top_k (0 or
-1 = off), seed, stop (strings), stop_token_ids, ignore_eos, n (1 only), stream,
stream_options.include_usage; prompt (text, token ids, or a one-element list of either) or
messages ([{role, content}]).
"""
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from core.errors import validation_message


class Message(msgspec.Struct):
    role: str
    content: str


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class CompletionBody(msgspec.Struct):
    model: str | None = None
    prompt: Any = None                    # checked against the tokenizer and vocabulary by the server
    messages: Annotated[list[Message], Meta(min_length=1)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=100)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    stop: str | Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=16)] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: Annotated[int, Meta(ge=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


KNOWN = frozenset(CompletionBody.__struct_fields__)
_ANY_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])

class BodyError(ValueError):
    """The body is not valid JSON, or a field does not fit its declaration (one line)."""


_DECODE = msgspec.json.Decoder(CompletionBody)


def decode_body(raw: bytes) -> tuple[CompletionBody, list[str]]:
    """(the body, its unknown field names), or BodyError with one line."""
    try:
        body = _DECODE.decode(raw)
        unknown = sorted(set(_ANY_OBJECT.decode(raw)) - KNOWN)
    except msgspec.ValidationError as e:
        raise BodyError(validation_message(e, top='body')) from None
    except msgspec.DecodeError as e:
        raise BodyError(f"body is not valid JSON: {str(e)[:120]}") from None
    except RecursionError:
        raise BodyError("body is not valid JSON: nested too deeply") from None
    return body, unknown
