"""The request bodies `gpu_runner serve` accepts, declared once (msgspec Structs with Meta
constraints): decoding checks every field and a failure becomes one line naming the field
("max_tokens: expected an integer >= 1, got 0"); a body whose strings are not UTF-8 is one
line naming the first bad byte ("request body: not UTF-8 JSON (byte 12)"). Unknown fields are ignored (benchmark clients
send extras) and reported once by the server.

Fields: max_tokens (default 16), temperature (default 1.0, as OpenAI), top_p, top_k (0 or
-1 = off), seed, stop (strings), stop_token_ids, ignore_eos, n (1 only), stream,
stream_options.include_usage; prompt (text, token ids, or a one-element list of either) or
messages ([{role, content}]; content a string or a list of text parts, as OpenAI's clients and
`vllm bench serve --backend openai-chat` send it). best_of (1 only), logprobs / top_logprobs (off only) and echo
(false only) are refused otherwise, as vLLM refuses what it does not support: a client asking for
log-likelihoods must not get an answer without them.
"""
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from core.errors import validation_message


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None      # a text part's text; other part types carry other fields


class Message(msgspec.Struct):
    role: str
    content: str | list[ContentPart]

    def text(self) -> str:
        """The content as one string: a list of text parts joined with "\n", as vLLM joins them
        (vllm/entrypoints/chat_utils.py, _parse_chat_message_content_parts: a string content is
        one text part, and the texts of the parts become `"\n".join(texts)` for a model without
        a chat template's own handling of parts). Other part types are refused first
        (`unsupported`)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text or "" for p in self.content)


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
    # asked for, answered 400 unless off (nothing is silently ignored that would change the answer)
    best_of: Annotated[int, Meta(ge=1)] | None = None
    logprobs: int | bool | None = None
    top_logprobs: int | None = None
    echo: bool = False


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
    except UnicodeDecodeError:     # (msgspec: a string's bytes are not UTF-8; its offset is the string's)
        raise BodyError(f"request body: not UTF-8 JSON (byte {_first_bad_utf8(raw)})") from None
    return body, unknown


def _first_bad_utf8(raw: bytes) -> int:
    """The offset in the body of its first byte that is not UTF-8 (-1: none)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start
    return -1


def unsupported(body: CompletionBody) -> str | None:
    """Why the body asks for something this server does not do (None: nothing)."""
    if body.best_of not in (None, 1):
        return f"best_of: only 1 is supported, got {body.best_of}"
    if body.logprobs not in (None, False, 0) or body.top_logprobs not in (None, 0):
        return "logprobs: not supported (this server returns no log-probabilities); leave logprobs and top_logprobs out"
    if body.echo:
        return "echo: not supported (the prompt is not returned); leave it out or set it false"
    return bad_part(body.messages or ())


def bad_part(messages) -> str | None:
    """A content part that is not text (an image, audio, ...), or a text part without its text:
    the part's place and type. vLLM takes these types; the bundled models read text only."""
    for k, m in enumerate(messages):
        for j, p in enumerate(m.content if isinstance(m.content, list) else ()):
            where = f"messages[{k}].content[{j}]"
            if p.type != "text":
                return (f"{where}.type: {p.type!r} parts are not supported (this server reads text only: "
                        '{"type": "text", "text": ...})')
            if p.text is None:
                return f"{where}.text: missing (a text part needs its text)"
    return None


def bad_text(body: CompletionBody) -> str | None:
    """A string field that is not valid Unicode text (a lone surrogate such as "\\ud800", which
    JSON can spell but no text encoding can encode): its name and position."""
    def where(name, s):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"{name}: not valid Unicode text (a lone surrogate at character {e.start})"
        return None
    fields = []
    p = body.prompt
    if isinstance(p, str):
        fields.append(("prompt", p))
    elif isinstance(p, list):
        fields += [(f"prompt[{k}]", x) for k, x in enumerate(p) if isinstance(x, str)]
    for k, m in enumerate(body.messages or ()):
        if isinstance(m.content, str):
            fields.append((f"messages[{k}].content", m.content))
        else:
            fields += [(f"messages[{k}].content[{j}].text", p.text or "") for j, p in enumerate(m.content)]
    fields += [(f"messages[{k}].role", m.role) for k, m in enumerate(body.messages or ())]
    stop = body.stop if isinstance(body.stop, list) else [body.stop] if isinstance(body.stop, str) else []
    fields += [(f"stop[{k}]", x) for k, x in enumerate(stop)]
    for name, s in fields:
        why = where(name, s)
        if why:
            return why
    return None
