"""Our JSON workload: {"requests": [{"id", "arrival_ms", "prompt_tokens" | "prompt_ids" | "prompt",
"output_tokens", "tenant"?, "abort_at_ms"?, "deadline_ms"?, "priority"?}]}."""
from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from core.errors import WorkloadError, validation_message
from core.workload.model import MAX_TOKEN_ID, Request, Workload, as_int, located

Tokenize = Callable[[str], list[int]]


class RequestDoc(msgspec.Struct):
    """One request as our JSON workload writes it. Its shape is declared here (msgspec checks
    it, and words a refusal naming the field); the values' ranges are Request's own checks
    (core.workload.model), shared by every workload format. Counts are read as other tools
    write them (4, 4.0, "4"): Request refuses 4.5."""
    id: str | int
    arrival_ms: Any
    prompt_tokens: Any = None
    prompt_ids: list[Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]] | None = None
    prompt: Any = None                         # text: tokenized by gpu_runner, kept verbatim here
    output_tokens: Any = None
    max_output_tokens: Any = None              # (another name for output_tokens)
    tenant: str | None = None
    abort_at_ms: Any = None
    deadline_ms: Any = None
    priority: Any = 0


KNOWN = frozenset(RequestDoc.__struct_fields__)


def request_from_dict(d: Any, where: str, tokenize: Tokenize | None = None) -> Request:
    try:
        doc = msgspec.convert(d, RequestDoc)
    except msgspec.ValidationError as e:
        raise WorkloadError(validation_message(e, where, top=where)) from None
    return _request(doc, d, where, tokenize)


def _request(doc: RequestDoc, d: dict, where: str, tokenize: Tokenize | None) -> Request:
    ids = doc.prompt_ids
    if ids is None and isinstance(doc.prompt, str) and tokenize is not None:
        ids = tokenize(doc.prompt)
    # Text tokenized here decides the length; otherwise prompt_tokens (e.g. a count for the
    # bundled byte tokenizer, so the simulator can use the same file).
    n_prompt = len(ids) if ids is not None and (tokenize is not None or doc.prompt_tokens is None) \
        else doc.prompt_tokens
    if n_prompt is None:
        hint = (" (prompt text is only tokenized by gpu_runner)" if "prompt" in d else "")
        raise WorkloadError(f"{where}: give prompt_tokens or prompt_ids{hint}")
    n_out = doc.output_tokens if doc.output_tokens is not None else doc.max_output_tokens
    if n_out is None:
        raise WorkloadError(f"{where}.output_tokens: missing")
    return Request(
        id=str(doc.id),
        arrival_ms=doc.arrival_ms,
        prompt_tokens=as_int(n_prompt, f"{where}.prompt_tokens"),
        max_output_tokens=as_int(n_out, f"{where}.output_tokens"),
        prompt_ids=tuple(ids) if ids is not None else None,
        tenant=doc.tenant,
        abort_at_ms=doc.abort_at_ms,
        deadline_ms=doc.deadline_ms,
        priority=doc.priority if doc.priority is not None else 0,
        extra={k: v for k, v in d.items() if k not in KNOWN} | ({"prompt": d["prompt"]} if "prompt" in d else {}),
    )


def from_json_doc(doc: Any, name: str, tokenize: Tokenize | None) -> Workload:
    if isinstance(doc, list):
        doc = {"requests": doc}
    if not isinstance(doc, dict):
        raise WorkloadError(f"{name}: expected a JSON object with a 'requests' list")
    reqs = doc.get("requests")
    if not isinstance(reqs, list):
        raise WorkloadError(f"{name}: expected a 'requests' list at the top level")
    try:   # every request's shape at once (msgspec), then each one's values
        docs = msgspec.convert(reqs, list[RequestDoc])
    except msgspec.ValidationError as e:
        raise WorkloadError(validation_message(e, f"{name}: requests")) from None
    out = []
    for i, (shape, d) in enumerate(zip(docs, reqs)):
        try:
            out.append(_request(shape, d, f"{name}: requests[{i}]", tokenize))
        except WorkloadError as e:
            raise located(f"{name}: requests[{i}]", e) from None
    try:
        return Workload(out, name=doc.get("name", name) if isinstance(doc.get("name"), str) else name)
    except WorkloadError as e:
        raise located(name, e) from None


