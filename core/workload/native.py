"""Our JSON workload: {"requests": [{"id", "arrival_ms", "prompt_tokens" | "prompt_ids" | "prompt",
"output_tokens", "tenant"?, "abort_at_ms"?, "deadline_ms"?, "priority"?}]}."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.errors import WorkloadError, short
from core.workload.model import Request, Workload, as_int, located

Tokenize = Callable[[str], list[int]]


def request_from_dict(d: Any, where: str, tokenize: Tokenize | None = None) -> Request:
    if not isinstance(d, dict):
        raise WorkloadError(f"{where}: expected an object, got {type(d).__name__}")
    known = {"id", "arrival_ms", "prompt_tokens", "prompt_ids", "prompt", "output_tokens",
             "max_output_tokens", "tenant", "abort_at_ms", "deadline_ms", "priority"}
    rid = d.get("id")
    if rid is None:
        raise WorkloadError(f"{where}.id: missing")
    if isinstance(rid, int) and not isinstance(rid, bool):
        rid = str(rid)
    if not isinstance(rid, str):
        raise WorkloadError(f"{where}.id: expected a string, got {short(rid)}")
    if "arrival_ms" not in d:
        raise WorkloadError(f"{where}.arrival_ms: missing")
    ids = d.get("prompt_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                and t >= 0 for t in ids):
            raise WorkloadError(f"{where}.prompt_ids: expected a list of non-negative integers")
    elif isinstance(d.get("prompt"), str) and tokenize is not None:
        ids = tokenize(d["prompt"])
    # Text tokenized here decides the length; otherwise prompt_tokens (e.g. a count for the
    # bundled byte tokenizer, so the simulator can use the same file).
    n_prompt = len(ids) if ids is not None and (tokenize is not None or "prompt_tokens" not in d) \
        else d.get("prompt_tokens")
    if n_prompt is None:
        hint = (" (prompt text is only tokenized by gpu_runner)" if "prompt" in d else "")
        raise WorkloadError(f"{where}: give prompt_tokens or prompt_ids{hint}")
    n_out = d.get("output_tokens", d.get("max_output_tokens"))
    if n_out is None:
        raise WorkloadError(f"{where}.output_tokens: missing")
    tenant = d.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise WorkloadError(f"{where}.tenant: expected a string or null, got {short(tenant)}")
    return Request(
        id=rid,
        arrival_ms=d["arrival_ms"],
        prompt_tokens=as_int(n_prompt, f"{where}.prompt_tokens"),
        max_output_tokens=as_int(n_out, f"{where}.output_tokens"),
        prompt_ids=tuple(ids) if ids is not None else None,
        tenant=tenant,
        abort_at_ms=d.get("abort_at_ms"),
        deadline_ms=d.get("deadline_ms"),
        priority=d.get("priority", 0),
        extra={k: v for k, v in d.items() if k not in known} | (
            {"prompt": d["prompt"]} if "prompt" in d else {}),
    )


def from_json_doc(doc: Any, name: str, tokenize: Tokenize | None) -> Workload:
    if isinstance(doc, list):
        doc = {"requests": doc}
    if not isinstance(doc, dict):
        raise WorkloadError(f"{name}: expected a JSON object with a 'requests' list")
    reqs = doc.get("requests")
    if not isinstance(reqs, list):
        raise WorkloadError(f"{name}: expected a 'requests' list at the top level")
    out = []
    for i, d in enumerate(reqs):
        try:
            out.append(request_from_dict(d, f"{name}: requests[{i}]", tokenize))
        except WorkloadError as e:
            raise located(f"{name}: requests[{i}]", e) from None
    try:
        return Workload(out, name=doc.get("name", name) if isinstance(doc.get("name"), str) else name)
    except WorkloadError as e:
        raise located(name, e) from None


