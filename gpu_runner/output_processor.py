"""The engine's output processor (vLLM's OutputProcessor): EngineOutputs -> what each client is
told (gpu_runner.messages), on the engine's side of the server. Tokens are detokenised here and
cut at stop strings here, so a stop string ends its request in the engine that matched it (no
round trip through the HTTP layer), and the HTTP layer only streams the text it is given.

Per request: text is delivered as soon as it is final: held back while it could still grow
into a stop string (the longest stop string's length - 1 characters) or ends in an incomplete
UTF-8 character. A request's last tokens and its finish come in one RequestOutput (as vLLM
sends them), so clients see no empty last chunk.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.engine.outputs import EngineOutputs, Finish
from gpu_runner.messages import Accepted, AddRequest, Failed, RequestEvent, RequestOutput, Scheduled

# finish reasons that end a request with its result; the others (rejected, error) answer it with an error
RESULT_REASONS = frozenset({"length", "stop", "abort", "deadline"})


class Detokenizer:
    """One request's text: ids in, final text out, cut before the first stop string."""

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]):
        self.decode = decode
        self.stop = stop
        self.hold = max((len(x) for x in stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = ""               # text delivered so far

    def _cut(self, full: str) -> int:
        return min((i for i in (full.find(x) for x in self.stop) if i >= 0), default=-1)

    def add(self, ids: list[int]) -> tuple[str, bool]:
        """New text to deliver after `ids`, and whether a stop string matched (the text then
        ends before it, and the request is over)."""
        self.ids += ids
        full = self.decode(self.ids)
        cut = self._cut(full) if self.stop else -1
        if cut >= 0:
            out = full[:cut][len(self.sent):]
            self.sent += out
            return out, True
        safe = len(full) - self.hold if self.stop else len(full)
        if full.endswith("\ufffd"):          # an incomplete UTF-8 character: wait for its other bytes
            safe = min(safe, len(full) - 1)
        out = full[len(self.sent):max(safe, len(self.sent))]
        self.sent += out
        return out, False

    def rest(self) -> str:
        """At the finish: what was held back (a stop string's match left out)."""
        full = self.decode(self.ids)
        cut = self._cut(full) if self.stop else -1
        out = (full[:cut] if cut >= 0 else full)[len(self.sent):]
        self.sent += out
        return out


@dataclass(slots=True, eq=False)
class _Request:
    rid: str
    prompt_tokens: int
    text: Detokenizer
    accepted: bool = False
    done: bool = False


@dataclass(eq=False)
class OutputProcessor:
    """Requests by the engine core's row; `process` turns one EngineOutputs into the events its
    clients are told, and names the requests a stop string ended (the caller aborts them in the
    engine: reason "stop")."""
    decode: Callable[[list[int]], str]
    reqs: dict[int, _Request] = field(default_factory=dict)

    def add(self, row: int, req: AddRequest):
        self.reqs[row] = _Request(req.rid, len(req.prompt_ids), Detokenizer(self.decode, list(req.stop)))

    def rid_of(self, row: int) -> str | None:
        r = self.reqs.get(row)
        return r.rid if r is not None else None

    def unfinished(self) -> list[int]:
        return [i for i, r in self.reqs.items() if not r.done]

    def process(self, out: EngineOutputs) -> tuple[list[RequestEvent], list[int]]:
        events: list[RequestEvent] = []
        reqs = self.reqs
        finishes = {f.req: f for f in out.finished}
        for i in out.queued:
            r = reqs.get(i)
            f = finishes.get(i)
            # accepted unless it was refused on arrival; one that finishes in the step that queued
            # it (one token asked, a stop on its first token) is accepted too, then answered below
            if r is not None and (f is None or f.reason in RESULT_REASONS):
                r.accepted = True
                events.append(Accepted(r.rid))
        for i in out.started:
            r = reqs.get(i)
            if r is not None:
                events.append(Scheduled(r.rid, r.prompt_tokens, out.step.t_ms))
        stopped = []
        for i, ids in out.new_tokens().items():
            r = reqs.get(i)
            if r is None or r.done:
                continue
            text, matched = r.text.add(ids)
            f = finishes.get(i)
            if matched:
                reason, detail = "stop", None
                r.done = True
                if f is None:
                    stopped.append(i)          # still running in the engine: abort it there
            elif f is not None and f.reason in RESULT_REASONS:
                reason, detail = f.reason, f.detail
                text += r.text.rest()
                r.done = True
            else:                              # more to come (or an error after these tokens: told below)
                reason = detail = None
            events.append(RequestOutput(r.rid, ids, text, out.t_ms, reason, detail))
        for i, f in finishes.items():          # the engine is done with these
            r = reqs.pop(i, None)
            if r is not None and not r.done:
                events.append(self._finish(r, f))
        return events, stopped

    def _finish(self, r: _Request, f: Finish) -> RequestEvent:
        if f.reason in RESULT_REASONS:
            return RequestOutput(r.rid, [], r.text.rest(), f.t_ms, f.reason, f.detail)
        if f.reason == "error":                # this request failed in the engine; the others go on
            return Failed(r.rid, f"the engine failed on this request: {f.detail or 'error'}", 500)
        # rejected: on arrival (over max_model_len: 400; by a full queue: 503), or after it was accepted
        return Failed(r.rid, f"rejected: {f.detail or f.reason}", 503 if f.limit == "queue_limit" else 400)
