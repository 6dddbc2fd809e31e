"""`python -m gpu_runner loadgen`: load any OpenAI-compatible server (ours, vLLM, SGLang) with
a workload and write what the client saw as a measured trace.

Arrivals: the workload's own times (default), `--rate R` (Poisson, R requests/s, seeded) or
`--concurrency C` (closed loop: C requests in flight, the next sent when one ends; a burst
sweep is this, not an arrival process). Each request streams (`stream: true`,
`ignore_eos: true` so outputs have the workload's lengths, `temperature` 0 unless given);
every SSE chunk with text is one arrival time. Tokens that reach the client together count
as one inter-token gap, as vLLM's benchmark counts them: a chunk carrying k tokens (known
from `usage`) gives its time to all k. Failures (HTTP errors, dropped streams) become
finish events with reason "error" and the text in meta.failures. In parallel the server's
`/metrics` is sampled every --metrics-interval seconds into `gauge` events (running,
waiting, KV usage, preemptions, prefix cache) when it serves vLLM's names.

The trace: meta.source "measured", meta.device the client machine, meta.engine the server
(from /v1/models `owned_by`, /version, and the `server` response header), times in ms from
the first send.

Ctrl-C (SIGINT) stops it, also when the process was started with SIGINT ignored (a script's
background job is): what is still running (requests in flight, /metrics sampling, the
receivers) is cancelled and given STOP_GRACE_S to end, then the capture is written; the
requests in flight are left unfinished. Nothing waits past that: not a task that ignores its
cancellation, not a thread still parsing a /metrics page (run_loop).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import platform
import queue
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from core.errors import InputError
from core.trace import save_trace
from core.workload import Workload

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "pydoc_topics.txt"


def prompt_ids(workload: Workload) -> list[list[int]]:
    """Token ids to send: the workload's own, else bytes of the bundled corpus (byte-level
    tokenizers read them as text), a slice chosen by the request's position."""
    corpus = None
    out = []
    for k, r in enumerate(workload.requests):
        if r.prompt_ids is not None:
            out.append(list(r.prompt_ids))
            continue
        if corpus is None:
            corpus = list(CORPUS.read_bytes())
        start = (k * 7919) % max(1, len(corpus) - r.prompt_tokens)
        out.append(corpus[start:start + r.prompt_tokens])
    return out


def send_times(workload: Workload, rate: float | None, seed: int) -> list[float] | None:
    """Seconds from the start at which each request is sent (None: closed loop)."""
    n = len(workload)
    if rate is not None:
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
        return list(np.cumsum(gaps) - gaps[0])
    t0 = workload.requests[0].arrival_ms
    return [(r.arrival_ms - t0) / 1000 for r in workload.requests]


MAX_SSE_LINE = 1 << 20     # one SSE line (a token's event is ~200 bytes): longer is refused, never buffered
MAX_CHUNKS = 1_000_000     # streamed chunks of one request
STOP_GRACE_S = 1.0         # after Ctrl-C, what is still running gets this long to end; then the capture is written


class _DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """The loop's executor (asyncio.to_thread, DNS lookups, the receivers' decoding): a pool of
    at most max_workers threads, as ThreadPoolExecutor is, but of daemon threads that nothing
    waits for. A thread cannot be cancelled, and a ThreadPoolExecutor's threads are waited for
    by asyncio.run's shutdown and again by the interpreter's exit, while parsing a big /metrics
    page takes seconds (16 MiB: 2 to 14 s measured on a loaded 2-core machine): Ctrl-C must not
    wait for it. shutdown() lets idle threads end and waits for none."""

    def __init__(self, max_workers: int | None = None):
        super().__init__(max_workers)        # (the base's own threads never start: submit is ours)
        self._jobs = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._count_lock = threading.Lock()
        self._threads = 0
        self._closed = False

    def submit(self, fn, /, *args, **kwargs):
        with self._count_lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            fut = concurrent.futures.Future()
            self._jobs.put((fut, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and self._threads < self._max_workers:
                self._threads += 1
                threading.Thread(target=self._work, name=f"loadgen-worker-{self._threads}", daemon=True).start()
        return fut

    def _work(self):
        while (job := self._jobs.get()) is not None:
            fut, fn, args, kwargs = job
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args, **kwargs))
                except BaseException as e:   # handed to the awaiting task, as the pool does
                    fut.set_exception(e)
            del job, fut, fn, args, kwargs     # held by no idle thread
            self._idle.release()

    def shutdown(self, wait=True, *, cancel_futures=False):
        with self._count_lock:
            if not self._closed:
                self._closed = True
                for _ in range(self._threads):
                    self._jobs.put(None)     # each thread ends after the job it runs: none is waited for


def _quiet_abandoned(loop, context):
    """The loop's exception handler: a task given up on after STOP_GRACE_S is destroyed
    pending, as intended; anything else is reported as asyncio does."""
    if str(context.get("message", "")).startswith("Task was destroyed but it is pending"):
        return
    loop.default_exception_handler(context)


def run_loop(main, grace: float = STOP_GRACE_S):
    """asyncio.run(main), except that closing waits on nothing for long: tasks left when main
    ends (or is interrupted) are cancelled and get `grace` seconds, with the async generators'
    finalization, then the loop closes regardless; executor work runs in daemon threads
    (_DaemonThreads). asyncio.run instead waits for every task to end and every executor
    thread to return, however long that takes."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_DaemonThreads())
    loop.set_exception_handler(_quiet_abandoned)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            deadline = time.monotonic() + grace
            rest = asyncio.all_tasks(loop)
            for t in rest:
                t.cancel()
            _settle(loop, rest, deadline)
            _settle(loop, {loop.create_task(loop.shutdown_asyncgens())}, deadline)
        finally:
            loop.close()


def _settle(loop, tasks: set, deadline: float):
    """Run the loop until `tasks` have ended or the deadline (time.monotonic) has passed; those
    still running then are given up on."""
    if not tasks:
        return
    done, _ = loop.run_until_complete(asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic())))
    for t in done:
        if not t.cancelled():
            t.exception()        # retrieved: an error while being stopped is no one's concern


def _catch_sigint(handler):
    """SIGINT calls handler() (from the main thread; elsewhere nothing is installed) whatever
    its disposition was, SIG_IGN included; returns the function that puts the old one back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda *_: handler())
    return lambda: signal.signal(signal.SIGINT, old if old is not None else signal.SIG_DFL)


async def sse_lines(resp):
    """The response's lines, each at most MAX_SSE_LINE bytes (httpx's own line reader would
    buffer a line without a newline without bound)."""
    buf = bytearray()
    async for piece in resp.aiter_bytes():
        buf += piece
        while True:
            k = buf.find(b"\n")
            if k < 0:
                break
            line = bytes(buf[:k]).rstrip(b"\r")
            del buf[:k + 1]
            yield line
        if len(buf) > MAX_SSE_LINE:
            raise RuntimeError(f"an SSE line over {MAX_SSE_LINE >> 20} MiB without a newline")
    if buf:
        yield bytes(buf).rstrip(b"\r")


class Capture:
    def __init__(self, url: str, model: str | None, temperature: float, metrics_interval: float):
        self.url = url.rstrip("/")
        self.model = model
        self.temperature = temperature
        self.metrics_interval = metrics_interval
        self.t0 = 0.0
        self.records: list[dict] = []
        self.gauges: list[dict] = []
        self.failures: dict[str, str] = {}
        self.engine: dict = {}
        self.done = 0
        self.request_timeout = 600.0   # one request, from send to its finish (s)
        self.telemetry = None          # gpu_runner.observe.Telemetry: the server's own KV events and spans
        self.span_wait = 15.0          # at most this long for the spans after the last request: an exporter
        #                                backing off (its startup export failed) sends them seconds late
        self.t0_ns = 0
        self.engine_side = ""
        self.interrupted = False       # stopped by Ctrl-C (run)

    def now_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000

    async def identify(self, client: httpx.AsyncClient):
        try:
            r = await client.get(f"{self.url}/v1/models", timeout=30)
            r.raise_for_status()
            data = r.json()["data"][0]
            if not isinstance(data, dict) or not isinstance(data.get("id"), str):
                raise TypeError(f"data[0] is {str(data)[:60]}, expected an object with a string id")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
            raise InputError(f"--url {self.url}: GET /v1/models failed ({type(e).__name__}: {str(e)[:120]}); "
                             "is an OpenAI-compatible server running there?") from None
        self.model = self.model or data.get("id")
        self.engine = {"name": str(data.get("owned_by") or "?"), "url": self.url, "model": self.model,
                       "server_header": r.headers.get("server")}
        try:
            v = await client.get(f"{self.url}/version", timeout=5)
            if v.status_code == 200 and isinstance(v.json(), dict):
                self.engine["version"] = str(v.json().get("version"))[:200]
        except (httpx.HTTPError, ValueError, AttributeError):
            pass

    async def one(self, client: httpx.AsyncClient, rid: str, ids: list[int], max_tokens: int):
        rec = {"id": rid, "arrival_ms": self.now_ms(), "prompt_tokens": len(ids), "max_output_tokens": max_tokens,
               "chunks": [], "tokens": None, "reason": None}
        self.records.append(rec)
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "temperature": self.temperature,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        try:
            await asyncio.wait_for(self._stream(client, body, rec), self.request_timeout)
            if rec["reason"] is None:
                raise RuntimeError("the stream ended without a finish reason")
        except TimeoutError:
            self._failed(rec, f"no finish within {self.request_timeout:g} s (--request-timeout)")
        except (httpx.HTTPError, RuntimeError, ValueError, TypeError) as e:
            self._failed(rec, f"{type(e).__name__}: {e}")
        self.done += 1

    def _failed(self, rec: dict, why: str):
        rec["reason"] = "error"
        rec["end_ms"] = self.now_ms()
        self.failures[rec["id"]] = why[:300]

    async def _stream(self, client: httpx.AsyncClient, body: dict, rec: dict):
        async with client.stream("POST", f"{self.url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                head = bytearray()
                async for piece in resp.aiter_bytes():     # an error body is read up to 4 KiB, never whole
                    head += piece
                    if len(head) >= 4096:
                        break
                raise RuntimeError(f"HTTP {resp.status_code}: {bytes(head[:200]).decode('utf-8', 'replace')}")
            async for line in sse_lines(resp):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue           # comments (keep-alives), other fields, the end
                self._chunk(rec, orjson.loads(line[6:]), self.now_ms())

    @staticmethod
    def _chunk(rec: dict, chunk, t: float):
        """One SSE event's JSON: an object with choices [{text | delta.content, finish_reason}] and
        maybe usage {completion_tokens}; anything else is the server's error, said once."""
        if not isinstance(chunk, dict):
            raise TypeError(f"an SSE event is {type(chunk).__name__}, not a JSON object")
        if rec.get("response_id") is None and isinstance(chunk.get("id"), str):
            rec["response_id"] = chunk["id"][:200]     # the server's id (pairs it with its span)
        usage = chunk.get("usage")
        if usage is not None:
            n = usage.get("completion_tokens") if isinstance(usage, dict) else None
            if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
                raise TypeError(f"usage is {str(usage)[:60]}, expected an object with completion_tokens")
            rec["tokens"] = n
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise TypeError(f"choices is {type(choices).__name__}, expected a list")
        for ch in choices:
            if not isinstance(ch, dict):
                raise TypeError(f"a choice is {type(ch).__name__}, expected an object")
            delta = ch.get("delta") or {}
            if not isinstance(delta, dict):
                raise TypeError(f"delta is {type(delta).__name__}, expected an object")
            if ch.get("text") or delta.get("content"):
                rec["chunks"].append(t)
                if len(rec["chunks"]) > MAX_CHUNKS:
                    raise RuntimeError(f"more than {MAX_CHUNKS:,} streamed chunks for one request")
            if ch.get("finish_reason"):
                rec["reason"] = str(ch["finish_reason"])[:40]
                rec["end_ms"] = t

    async def sample_metrics(self, client: httpx.AsyncClient, stop: asyncio.Event):
        """/metrics every metrics_interval s: read at most 16 MiB, parsed off the event loop (a
        page of 100,000 series must not delay the streams' timestamps)."""
        from core.trace.gauges import gauge_from_text
        limit = 16 << 20
        while not stop.is_set():
            t = self.now_ms()
            try:
                async with client.stream("GET", f"{self.url}/metrics", timeout=5) as r:
                    body = bytearray()
                    async for piece in r.aiter_bytes():
                        body += piece
                        if len(body) > limit:
                            break
                g = await asyncio.to_thread(gauge_from_text, t, bytes(body[:limit]).decode("utf-8", "replace"))
                if g is not None:
                    self.gauges.append(g)
            except (httpx.HTTPError, ValueError):
                pass
            try:
                await asyncio.wait_for(stop.wait(), self.metrics_interval)
            except TimeoutError:
                pass

    async def wait_for_spans(self):
        """Until a span has arrived for every request sent (the server exports them in batches
        after a request ends), at most span_wait seconds."""
        deadline = time.monotonic() + self.span_wait
        while time.monotonic() < deadline:
            n = sum(1 for sp in self.telemetry.spans if sp.get("name") == "llm_request")
            if n >= len(self.records):
                return
            await asyncio.sleep(0.1)

    async def run(self, workload: Workload, rate: float | None, concurrency: int | None, seed: int, progress=None):
        """Send the workload and capture what comes back, until done or Ctrl-C: then `interrupted`
        is set and run returns at once, leaving what still runs to run_loop's close (cancelled,
        STOP_GRACE_S at most). SIGINT is ours meanwhile: asyncio.run's own handling is installed
        only when SIGINT has Python's default handler, so a loadgen started with SIGINT ignored
        (a background job of a script, a test suite run so) never stopped on it."""
        loop = asyncio.get_running_loop()
        ctrl_c = asyncio.Event()
        restore = _catch_sigint(lambda: loop.call_soon_threadsafe(ctrl_c.set))
        try:
            work = asyncio.create_task(self._send_all(workload, rate, concurrency, seed, progress))
            stopper = asyncio.create_task(ctrl_c.wait())
            await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                stopper.cancel()
                return work.result()
            self.interrupted = True
        finally:
            restore()

    async def _send_all(self, workload: Workload, rate: float | None, concurrency: int | None, seed: int,
                        progress=None):
        ids = prompt_ids(workload)
        reqs = workload.requests
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0), limits=limits) as client:
            await self.identify(client)
            stop = asyncio.Event()
            self.t0, self.t0_ns = time.perf_counter(), time.time_ns()
            sampler = asyncio.create_task(self.sample_metrics(client, stop))
            engine_side = asyncio.create_task(self.telemetry.run(stop)) if self.telemetry else None
            tasks = []

            async def report():
                while not stop.is_set():
                    if progress is not None:
                        progress(self.done, len(reqs))
                    await asyncio.sleep(0.2)
            reporter = asyncio.create_task(report())
            if concurrency is not None:
                queue = list(range(len(reqs)))[::-1]

                async def worker():
                    while queue:
                        k = queue.pop()
                        await self.one(client, reqs[k].id, ids[k], reqs[k].max_output_tokens)
                await asyncio.gather(*(worker() for _ in range(min(concurrency, len(reqs)))))   # no idle workers
            else:
                for k, at in enumerate(send_times(workload, rate, seed)):
                    delay = at - (time.perf_counter() - self.t0)
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(self.one(client, reqs[k].id, ids[k], reqs[k].max_output_tokens)))
                await asyncio.gather(*tasks)
            if self.telemetry and self.telemetry.otlp_port:
                await self.wait_for_spans()
            stop.set()
            await sampler
            await reporter
            if engine_side is not None:
                await engine_side
            if progress is not None:
                progress(self.done, len(reqs))

    def doc(self, workload: Workload, how: str) -> dict:
        """The serving-trace/1 document of what was captured."""
        from core.engine.core import now_iso
        requests, events, odd = [], [], []
        for rec in sorted(self.records, key=lambda r: r["arrival_ms"]):
            chunks = rec["chunks"]
            n = rec["tokens"] if rec["tokens"] is not None else len(chunks)
            maxo = rec["max_output_tokens"]
            if n > maxo:        # the server sent more than asked: the trace records what it sent, and says so
                odd.append(f"{rec['id']}: {n} tokens streamed for max_tokens {maxo}")
                maxo = n
            requests.append({"id": rec["id"], "arrival_ms": rec["arrival_ms"], "prompt_tokens": rec["prompt_tokens"],
                             "max_output_tokens": maxo}
                            | ({"response_id": rec["response_id"]} if rec.get("response_id") else {}))
            times = chunks[:n] + [chunks[-1]] * (n - len(chunks)) if chunks else []
            for i, t in enumerate(times):
                events.append({"t_ms": t, "type": "token", "req": rec["id"], "index": i})
            if rec["reason"] is None:
                continue        # still streaming when the capture stopped: no finish event (unfinished)
            end = max([rec.get("end_ms", rec["arrival_ms"])] + times[-1:])
            events.append({"t_ms": end, "type": "finish", "req": rec["id"], "reason": rec["reason"]})
        unfinished = sum(1 for r in self.records if r["reason"] is None)
        events += self.gauges
        meta = {"source": "measured", "label": f"{workload.name} against {self.engine.get('name')} ({how})",
                "created": now_iso(),
                "device": f"client: {platform.node() or '?'} ({platform.machine()}), server at {self.url}",
                "engine": self.engine, "workload": workload.name,
                "notes": f"captured by gpu_runner loadgen ({how}); times are client-side: arrival = when the request "
                         "was sent, a token = when its SSE chunk arrived",
                "versions": {"python": platform.python_version(), "httpx": httpx.__version__}}
        if getattr(self, "load", None):
            meta["load"] = self.load   # where this run sits on a load sweep's axis (core.lessons.load)
        if odd:
            meta["odd"] = odd[:100]
            meta["notes"] += f"; the server streamed more tokens than asked for {len(odd)} request(s) (meta.odd)"
        if unfinished:
            meta["notes"] += (f"; {unfinished} request(s) were still streaming when the capture stopped (no finish "
                              "event: unfinished)")
        if self.failures:
            meta["failures"] = self.failures
        return {"schema": "serving-trace/1", "meta": meta, "requests": requests, "events": events}


def with_engine_side(tr, cap: Capture):
    """The client's trace with what the server emitted meanwhile, on the client's clock (both
    start at t0: perf_counter and epoch read together): each request's span as its engine-side
    view (paired by the server's response id), the KV events."""
    from core.trace.imports.otlp import attach_spans, pair_requests
    from core.trace.imports.telemetry import telemetry_trace
    tel = cap.telemetry
    eng = telemetry_trace(cap.t0_ns, list(tel.spans), list(tel.kv_rows), [], {"source": "measured"}, [])
    tr.meta["clock"] = {"kind": "epoch", "t0_s": cap.t0_ns / 1e9, "resolution_ms": 1e-3,
                        "how": "loadgen's start: perf_counter (client times) and time.time_ns (the server's spans "
                               "and KV events) read together"}
    notes = [f"engine side: {tel.summary()}"]
    pairs = pair_requests(tr, eng) if len(eng.requests) else []
    if pairs:
        attach_spans(tr, eng, pairs, 0.0)
    cap.engine_side = (f"{len(pairs)} of {len(tr.requests)} requests paired with their server span"
                       if tel.otlp_port else "") + (f"; {len(eng.kv_events)} KV event rows" if tel.kv_endpoint else "")
    notes.append(cap.engine_side.lstrip("; ") + ".")
    if tel.otlp_port and len(pairs) < len(tr.requests):
        cap.engine_side += (f" — {len(tr.requests) - len(pairs)} without one after {cap.span_wait:g} s: start the "
                            "receiver before the server (its exporter backs off after failed exports), e.g. with "
                            "`gpu_runner observe`, or check --otlp-traces-endpoint")
    if len(eng.kv_events):
        tr.kv_events = eng.kv_events
    tr.meta["notes"] = f"{tr.meta.get('notes', '')}; " + " ".join(notes)
    tr.meta["provenance"] = {"client": "loadgen: arrival = sent, tokens = SSE chunks received",
                             "engine": "the server's spans (engine_* per request) and KV events"}
    return tr


def _check_args(a) -> None:
    """InputError for loadgen flags out of range (or both arrival modes at once)."""
    if (a.rate is not None) and (a.concurrency is not None):
        raise InputError("--rate and --concurrency: choose one (or neither: the workload's arrival times)")
    if a.rate is not None and not 0 < a.rate <= 1e6:
        raise InputError(f"--rate: expected requests per second in (0, 1e6], got {a.rate}")
    if a.concurrency is not None and a.concurrency > 100_000:
        raise InputError(f"--concurrency: at most 100,000 requests in flight, got {a.concurrency}")
    if not (a.metrics_interval > 0 and a.metrics_interval == a.metrics_interval):
        raise InputError(f"--metrics-interval: expected seconds > 0, got {a.metrics_interval}")
    if not (a.request_timeout > 0 and a.request_timeout == a.request_timeout):
        raise InputError(f"--request-timeout: expected seconds > 0, got {a.request_timeout}")


def _arrivals(a) -> tuple[str, dict | None]:
    """How requests arrive, in words, and as the trace's meta.load (None: the workload's own times)."""
    if a.rate is not None:
        return f"Poisson {a.rate:g} req/s, seed {a.seed}", {"kind": "open", "rate": a.rate, "seed": a.seed}
    if a.concurrency is not None:
        return f"closed loop, concurrency {a.concurrency}", {"kind": "closed", "concurrency": a.concurrency}
    return "the workload's arrival times", None


def main_loadgen(a) -> int:
    from core.cli import Progress, check_writable, write_output
    from core.trace import trace_from_doc
    from core.workload import load_workload
    _check_args(a)
    check_writable(a.out, "--out")
    w = load_workload(a.workload, tokenize=lambda text: list(text.encode("utf-8")))
    how, load = _arrivals(a)
    cap = Capture(a.url, a.model, a.temperature, a.metrics_interval)
    cap.request_timeout = a.request_timeout
    cap.load = load
    from gpu_runner.observe import Telemetry, check_flags
    check_flags(a)
    if a.kv_events or a.otlp_port:
        cap.telemetry = Telemetry(a.kv_events, a.kv_topic, a.otlp_port, kv_bind=a.kv_bind)
    t0 = time.perf_counter()
    try:
        run_loop(cap.run(w, a.rate, a.concurrency, a.seed, Progress("requests")))
    except KeyboardInterrupt:      # a second Ctrl-C within the grace, or one before run installed its own
        cap.interrupted = True
    if cap.interrupted:
        print("\ninterrupted: writing what was captured (unsent requests are left out)", file=sys.stderr)
    secs = time.perf_counter() - t0
    tr = trace_from_doc(cap.doc(w, how))
    if cap.telemetry is not None:
        tr = with_engine_side(tr, cap)
    write_output(a.out, lambda p: save_trace(tr, p), "--out")
    print(f"wrote {a.out}: {len(tr.requests)} requests, {len(tr.tokens)} tokens, {len(cap.failures)} failed, "
          f"{len(cap.gauges)} /metrics samples, in {secs:.1f} s against {cap.engine.get('name')} at {cap.url}"
          + (f"; engine side: {cap.engine_side.lstrip('; ')}" if cap.telemetry is not None else ""))
    return 0
