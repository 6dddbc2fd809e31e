"""`python -m gpu_runner serve`: an OpenAI-compatible HTTP API over the runner (Starlette +
uvicorn). Handlers validate, submit to the engine's client (gpu_runner.client.EngineClient: the
engine in this process or in its own) and stream the text it sends back, already detokenised
and cut at stop strings by the engine; they never touch the engine.

    POST /v1/completions       prompt: text or token ids; stream (SSE) or not
    POST /v1/chat/completions  messages joined as "role: content" lines (the bundled models
                               have no chat template), then "assistant: "; a content given as
                               text parts is their texts joined with "\n" (as vLLM joins them)
    GET  /v1/models, /health, /metrics (Prometheus, vLLM's names: gpu_runner.server_metrics)
    GET  /server_info, /model_info: what sglang-router (sglang_router 0.3.2, `launch_router
         --worker-urls`) reads from each worker as it registers it: served_model_name names the
         model it routes (without it every worker is model "unknown" and the router's /v1/models
         says so); model_path only for a local checkpoint directory, since the router loads a
         tokenizer from it (a bare name such as `tiny` would send it to a model hub)

A request's id (its id in the trace) is its `X-Request-Id` header when that is 1-128 printable
ASCII characters, not of the server's own form `req-N`, and not used before by this server (as
vLLM takes X-Request-Id; sglang-router forwards the client's X-Request-Id to the worker it picks);
otherwise the server numbers it. The response's id is then `cmpl-<id>` / `chatcmpl-<id>`.

Fields (declared in gpu_runner.api): max_tokens (default 16), temperature (default 1.0, as
OpenAI), top_p, top_k (0 or -1 = off), seed, stop (strings), stop_token_ids, ignore_eos, n (1
only), stream, stream_options.include_usage. Unknown fields are ignored with one logged warning
per name (as vLLM does: benchmark clients send extras). Errors: 400 (bad JSON, wrong types, too
long for the model or the KV pool), 404 (unknown model), 503 + Retry-After (waiting queue
full, or shutting down).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from core.config import SamplingParams
from gpu_runner.api import BodyError, CompletionBody, bad_text, decode_body, unsupported
from gpu_runner.client import EngineClient, Overloaded, ServerStopping, Stream
from gpu_runner.messages import Accepted, Failed, RequestOutput
from gpu_runner.tokenizer import tokenizer_from_spec

log = logging.getLogger("gpu_runner.serve")
MAX_BODY = 4 * 2**20
BODY_TIMEOUT_S = 30.0      # the whole body must arrive within this (then 408)
MAX_REQUEST_ID = 128       # characters of an X-Request-Id the server takes as the request's id
_OWN_ID = re.compile(r"req-\d+")   # the ids the engine client gives requests without one

class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers


class EngineError(Exception):
    """The engine ended a request without a result (rejected after it was accepted, or failed)."""

    def __init__(self, message: str, status: int, cut: bool = False):
        super().__init__(message)
        self.status, self.cut = status, cut


class StreamCut(Exception):
    """A fleet's replica died under a stream already under way: the front end, a router, sends the
    error event naming it and then cuts the response (no [DONE], the HTTP body left unfinished), as
    sglang-router 0.3.2 cuts one whose worker died (measured: docs/fleet.md), so that a benchmark
    client counts the request failed (vllm bench serve counts any stream with a token a success
    unless the body breaks: aiohttp's ClientPayloadError). One `serve` whose engine dies ends its
    streams as vLLM's server does (vllm/entrypoints/openai/completion/serving.py): an error event,
    then [DONE]."""


class _NoCutTracebacks(logging.Filter):
    """uvicorn logs an exception that ends a started response with its traceback; a StreamCut is the
    front end's own choice, logged in one line where it is raised."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamCut)


logging.getLogger("uvicorn.error").addFilter(_NoCutTracebacks())


def error_body(message: str, status: int) -> dict:
    kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
            503: "ServiceUnavailableError"}.get(status, "Error")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def error(message: str, status: int = 400, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status), status, headers=headers)


class App:
    def __init__(self, se: EngineClient, model_name: str, metrics):
        info = se.info
        self.se, self.name, self.metrics = se, model_name, metrics
        self.tok = tokenizer_from_spec(info.tokenizer)     # prompts are encoded here, outputs decoded there
        self.max_seq_len, self.vocab = info.max_seq_len, info.vocab_size
        self.created = int(time.time())
        self.warned: set[str] = set()
        self.header_ids: set[str] = set()    # X-Request-Id values taken so far (ids stay unique)
        self.app = Starlette(routes=[
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prom, methods=["GET"]),
        ])

    # ---- small endpoints ----------------------------------------------------------------------
    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                                         "owned_by": "gpu_runner", "max_model_len": self.max_seq_len}]})

    async def version(self, request: Request):
        import torch
        return JSONResponse({"version": f"gpu_runner (torch {torch.__version__})"})

    def _model_path(self) -> str | None:
        return self.se.info.model if Path(self.se.info.model).is_dir() else None

    async def server_info(self, request: Request):
        info = self.se.info
        return JSONResponse({"served_model_name": self.name, "model_path": self._model_path(),
                             "version": "gpu_runner", "dp_size": 1, "max_running_requests": info.max_seqs,
                             "max_total_tokens": info.kv_blocks * info.block_size})

    async def model_info(self, request: Request):
        return JSONResponse({"model_path": self._model_path(), "tokenizer_path": self._model_path(),
                             "is_generation": True})

    def _take_header_id(self, request: Request) -> str | None:
        """The X-Request-Id to use as this request's id, now taken for good (a refused request's
        too), or None: absent, malformed, of the server's own form, or taken before."""
        rid = request.headers.get("x-request-id")
        if rid is None or not 0 < len(rid) <= MAX_REQUEST_ID or not (rid.isascii() and rid.isprintable()):
            return None
        if rid in self.header_ids or _OWN_ID.fullmatch(rid):
            log.warning("X-Request-Id %r is %s; the server numbers this request", rid,
                        "taken" if rid in self.header_ids else "of the server's own form")
            return None
        self.header_ids.add(rid)
        return rid

    async def health(self, request: Request):
        if not self.se.alive():
            return Response(f"engine stopped: {self.se.failure() or 'shutting down'}", 503)
        return Response(b"", 200)

    async def prom(self, request: Request):
        self.metrics.idle(**self.se.load())
        return Response(self.metrics.render(), 200, media_type="text/plain; version=0.0.4; charset=utf-8")

    # ---- parsing ------------------------------------------------------------------------------
    async def _body(self, request: Request) -> CompletionBody:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY:
            raise BadRequest(f"request body of {int(size):,} bytes is over the {MAX_BODY:,}-byte limit", 413)
        raw = bytearray()

        async def read():
            async for chunk in request.stream():
                raw.extend(chunk)
                if len(raw) > MAX_BODY:
                    raise BadRequest(f"request body is over the {MAX_BODY:,}-byte limit", 413)
        try:   # a body that never arrives whole (less than its Content-Length) must not hold a slot
            await asyncio.wait_for(read(), BODY_TIMEOUT_S)
        except TimeoutError:
            raise BadRequest(f"the request body did not arrive within {BODY_TIMEOUT_S:g} s", 408) from None
        try:
            body, unknown = decode_body(bytes(raw))
        except BodyError as e:
            raise BadRequest(str(e)) from None
        why = unsupported(body) or bad_text(body)
        if why:
            raise BadRequest(why)
        unknown = [k for k in unknown if k not in self.warned]
        if unknown:
            log.warning("ignoring unknown request field(s): %s", ", ".join(unknown))
            self.warned.update(unknown)
        if body.model is not None and body.model != self.name:
            raise BadRequest(f"The model `{body.model}` does not exist (this server serves `{self.name}`)", 404)
        return body

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if self.tok is None:
                raise BadRequest("prompt: this model has no tokenizer; send token ids")
            ids = self.tok.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab]
            if bad:
                raise BadRequest(f"prompt: token id {bad[0]} is outside the vocabulary (size {self.vocab})")
        else:
            raise BadRequest("prompt: expected a string or a list of token ids (one prompt per request)")
        if not ids:
            raise BadRequest("prompt: empty")
        return ids

    def _stream(self, body: CompletionBody, ids: list[int]) -> tuple[Stream, list[str]]:
        max_tokens = self._max_tokens(body, ids)
        sp = _sampling(body)
        stop = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
        if "" in stop:
            raise BadRequest("stop: expected a string or a list of up to 16 non-empty strings")
        info = self.se.info
        stops = _stop_token_ids(body, info)
        if info.speculative:   # one sampling setting for the whole speculative batch
            sp = _speculative_sampling(body, sp, info.sampling)
        return Stream("", ids, max_tokens, sp, stops, asyncio.get_running_loop(), stop)

    def _max_tokens(self, body: CompletionBody, ids: list[int]) -> int:
        """The completion's token limit (default 16); BadRequest for n > 1 or past the model's context."""
        if (body.n or 1) != 1:
            raise BadRequest("n: only 1 is supported")
        max_tokens = body.max_tokens or body.max_completion_tokens or 16
        if len(ids) + max_tokens > self.max_seq_len:
            raise BadRequest(f"This model's maximum context length is {self.max_seq_len} tokens. However, you "
                             f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} "
                             f"for the completion).")
        return max_tokens

    # ---- completions --------------------------------------------------------------------------
    async def completions(self, request: Request):
        return await self._serve(request, chat=False)

    async def chat(self, request: Request):
        return await self._serve(request, chat=True)

    async def _serve(self, request: Request, chat: bool):
        try:
            body = await self._body(request)
            if chat:
                if not body.messages:
                    raise BadRequest("messages: expected a non-empty list of {role, content} (content: a string "
                                     "or a list of text parts)")
                ids = self._prompt_ids("".join(f"{m.role}: {m.text()}\n" for m in body.messages) + "assistant: ")
            else:
                if body.prompt is None:
                    raise BadRequest("prompt: required")
                ids = self._prompt_ids(body.prompt)
            s = self._stream(body, ids)
            header_id = self._take_header_id(request)
            s.rid = header_id or ""
            usage_in_stream = body.stream_options is not None and body.stream_options.include_usage
            stream = body.stream
            try:
                self.se.submit(s)
            except Overloaded as e:
                raise BadRequest(f"server busy: {e}", 503, {"Retry-After": "1"}) from None
            except ServerStopping as e:
                raise BadRequest(str(e), 503, {"Retry-After": "5"}) from None
            first = await s.queue.get()
            if isinstance(first, Failed):   # refused, or rejected on arrival: the reason is the answer
                raise BadRequest(first.message, first.status, {"Retry-After": "1"} if first.status == 503 else None)
        except BadRequest as e:
            return error(str(e), e.status, e.headers)
        rid = ("chatcmpl-" if chat else "cmpl-") + (header_id or uuid.uuid4().hex)
        # (the first message is Accepted; anything else is the request's first output: kept for it)
        gen = _Generation(self, s, rid, chat, None if isinstance(first, Accepted) else first)
        if stream:
            return StreamingResponse(gen.sse(request, usage_in_stream), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await gen.whole(request)


def _sampling(body: CompletionBody) -> SamplingParams:
    """The request's sampling settings (OpenAI's defaults: temperature 1, top_p 1, no top_k)."""
    return SamplingParams(temperature=1.0 if body.temperature is None else body.temperature,
                          top_p=1.0 if body.top_p is None else body.top_p, top_k=max(0, body.top_k or 0),
                          seed=body.seed or 0)


def _stop_token_ids(body: CompletionBody, info) -> tuple[int, ...] | None:
    """The token ids that end the request (the model's end of sequence unless ignore_eos, then
    stop_token_ids), or None for the engine's default."""
    stop_ids = body.stop_token_ids or []
    ignore_eos = body.ignore_eos
    eos = () if ignore_eos else tuple(info.stop_token_ids)
    return tuple(dict.fromkeys([*eos, *stop_ids])) if (stop_ids or ignore_eos) else None


def _speculative_sampling(body: CompletionBody, sp: SamplingParams, server_sp: SamplingParams) -> SamplingParams:
    """The server's sampling settings; BadRequest when the request sets one of them otherwise."""
    given = {k for k in ("temperature", "top_p", "top_k", "seed") if getattr(body, k) is not None}
    if any(getattr(sp, k) != getattr(server_sp, k) for k in given):
        raise BadRequest("speculative serving samples with the server's settings "
                         f"(temperature {server_sp.temperature:g}, top_k {server_sp.top_k}, top_p "
                         f"{server_sp.top_p:g}, seed {server_sp.seed}); leave them out of the request")
    return server_sp


class _Generation:
    """The engine's outputs for one accepted request -> OpenAI-shaped responses."""

    def __init__(self, app: App, s: Stream, rid: str, chat: bool, first=None):
        self.app, self.s, self.rid, self.chat = app, s, rid, chat
        self._first = first     # an output taken off the queue before the response began
        self.ids: list[int] = []
        self.text = ""          # text delivered so far
        self.finish = None

    async def events(self):
        """Yields text as the engine sends it (final: held back there while it could still grow
        into a stop string); sets self.finish from the last output, or raises EngineError."""
        while self.finish is None:
            item, self._first = (self._first, None) if self._first is not None else (await self.s.queue.get(), None)
            if isinstance(item, RequestOutput):
                self.ids += item.token_ids
                self.text += item.text
                self.finish = item.finish_reason
                if item.text:
                    yield item.text
            elif isinstance(item, Failed):   # rejected after it was accepted (queue limit), or failed
                self.finish = "error"
                raise EngineError(item.message, item.status, item.cut)

    def usage(self) -> dict:
        n_p, n_c = len(self.s.prompt_ids), len(self.ids)
        return {"prompt_tokens": n_p, "completion_tokens": n_c, "total_tokens": n_p + n_c}

    def _chunk(self, delta: str | None, finish: str | None, first: bool = False) -> dict:
        if self.chat:
            d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
            choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": int(time.time()), "model": self.app.name,
                "choices": [choice]}

    async def _watch(self, request: Request):
        """Cancel the request when the client disconnects."""
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                self.app.se.cancel(self.s)
                return

    async def sse(self, request: Request, include_usage: bool):
        watcher = asyncio.create_task(self._watch(request))
        try:
            first, told = True, False
            async for delta in self.events():
                told = self.finish in ("length", "stop")    # the last delta carries the finish (events())
                yield f"data: {json.dumps(self._chunk(delta, self.finish if told else None, first))}\n\n"
                first = False
            if not told:
                reason = "length" if self.finish == "length" else "stop" if self.finish == "stop" else "abort"
                yield f"data: {json.dumps(self._chunk(None, reason, first))}\n\n"
            if include_usage:
                u = self._chunk(None, None)
                u["choices"], u["usage"] = [], self.usage()
                yield f"data: {json.dumps(u)}\n\n"
            yield "data: [DONE]\n\n"
        except EngineError as e:   # the stream ends with the reason, then [DONE] (a fleet's dead replica: cut)
            yield f"data: {json.dumps(error_body(str(e), e.status))}\n\n"
            if e.cut:     # (the reason reaches the client; the unfinished body makes its request a failure)
                log.warning("request %s: %s; its stream is cut after %d tokens", self.rid, e, len(self.ids))
                raise StreamCut(str(e)) from None
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            if not self.s.done:
                self.app.se.cancel(self.s)   # the client went away mid-stream

    async def whole(self, request: Request):
        watcher = asyncio.create_task(self._watch(request))
        try:
            async for _ in self.events():
                pass
        except EngineError as e:
            return error(str(e), e.status, {"Retry-After": "1"} if e.status == 503 else None)
        finally:
            watcher.cancel()
            if not self.s.done:
                self.app.se.cancel(self.s)
        reason = "length" if self.finish == "length" else "stop" if self.finish == "stop" else "abort"
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": self.text}, "logprobs": None,
                      "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": self.text, "logprobs": None, "finish_reason": reason,
                      "token_ids": self.ids}
            obj = "text_completion"
        return JSONResponse({"id": self.rid, "object": obj, "created": int(time.time()), "model": self.app.name,
                             "choices": [choice], "usage": self.usage()})


def serve(se: EngineClient, app: App, host: str, port: int, ready=None) -> str | None:
    """Run uvicorn until SIGINT/SIGTERM; on the signal the engine stops first (unfinished
    requests end with finish_reason "abort", the trace is written), then the HTTP server.
    An engine that stops by itself (a crash, a killed engine process) is logged and stops the
    server too, so that a supervisor restarts it: returns why (None after a signal)."""

    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            se.stop()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app.app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, lifespan="off")
    # /health says 503 as soon as the engine is gone; the server then exits
    return run_watched(_Server(config), se, "engine-watch", "the engine stopped: %s; the server exits (status 1)",
                       ready=ready)


def run_watched(server, client: EngineClient, name: str, said: str, tick=None, ready=None) -> str | None:
    """Run uvicorn's `server` with `client` started beside it and watched every 0.2 s by a thread
    `name`: `tick()` first (a fleet's stall check), then client.failure(): a failure is logged
    (`said` % why) and ends the server, and is returned (None when the server ended otherwise: a
    signal). The client is stopped when the server has ended. `ready(server)`: called before it runs."""
    import threading
    died: list[str] = []

    def watch():
        while not server.should_exit:
            time.sleep(0.2)
            if tick is not None:
                tick()
            why = client.failure()
            if why:
                log.error(said, why)
                died.append(why)
                server.should_exit = True
                return
    client.start()
    threading.Thread(target=watch, name=name, daemon=True).start()
    try:
        if ready is not None:
            ready(server)
        server.run()
    finally:
        client.stop()
    return died[0] if died else None
