"""gpu_runner loadgen against small hostile servers (issue 27, item 4): whatever the server
sends, the capture is written with what was seen and what was odd, every request ends (a
finish, or a recorded failure) within its deadline, and memory stays bounded. The servers are
written here on asyncio streams, on loopback; every run is bounded in time."""
import asyncio
import json
import resource
import subprocess
import sys
import threading

import pytest

from core.trace import load_trace
from tests.conftest import DATA, ROOT

pytestmark = pytest.mark.slow     # subprocesses, a few seconds each
WORKLOAD = str(DATA / "workloads" / "burst5.json")


def chunk(text=None, finish=None, **extra):
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": text or "",
                                                                         "finish_reason": finish}], **extra}


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


class Hostile:
    """One server, one behaviour (`mode`), in a thread of its own."""

    def __init__(self, mode: str):
        self.mode, self.port, self.loop = mode, None, asyncio.new_event_loop()
        self.ready = threading.Event()
        self.streams = 0                       # completion streams opened so far (read by the tests)
        self.completed = 0                     # completion streams the server sent to their end
        threading.Thread(target=self._run, daemon=True).start()
        assert self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode()
                length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                               if h.lower().startswith(b"content-length")), 0)
                if length:
                    await reader.readexactly(length)
                path = line.split()[1]
                if path == "/v1/models":
                    data = ["x"] if self.mode == "models_list" else [{"id": "tiny", "owned_by": "hostile"}]
                    await self.reply(writer, json.dumps({"data": data}).encode())
                elif path == "/metrics":
                    await self.reply(writer, self.metrics(), "text/plain")
                elif path == "/v1/completions":
                    await self.completion(writer)
                    self.completed += 1
                    return
                else:
                    await self.reply(writer, b"{}", status="404 Not Found")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def metrics(self) -> bytes:
        if self.mode == "nan_metrics":
            return b"vllm:num_requests_running NaN\nvllm:kv_cache_usage_perc +Inf\nvllm:num_requests_waiting 1\n"
        if self.mode == "huge_metrics":
            return "".join(f'vllm:num_requests_running{{engine="{k}"}} 1\n' for k in range(100_000)).encode()
        return b"vllm:num_requests_running 1\n"

    async def reply(self, writer, body: bytes, ctype="application/json", status="200 OK"):
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body)
        await writer.drain()

    async def completion(self, writer):
        m = self.mode
        if m == "endless_500":
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\n")
            for _ in range(2000):
                writer.write(b"x" * 65536)
                await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        await writer.drain()
        self.streams += 1
        if m == "silence":
            await asyncio.sleep(30)
            return
        if m in ("keepalive", "keepalive_long"):
            for _ in range(30 if m == "keepalive" else 3000):     # 6 s, or 10 minutes
                writer.write(b": keep-alive\n\n")
                await writer.drain()
                await asyncio.sleep(0.2)
            return
        if m == "huge_line":
            for _ in range(200):
                writer.write(b"data: " + b"x" * 65536)
                await writer.drain()
            return
        events = {"list_chunk": [sse(b"[1, 2, 3]")],
                  "string_delta": [sse({"choices": [{"delta": "hi", "finish_reason": None}]})],
                  "usage_5": [sse(chunk("a")), sse({"choices": [], "usage": 5})],
                  "too_many": [sse(chunk("t")) for _ in range(50)] + [sse(chunk("", "length"))],
                  "no_finish": [sse(chunk("t")) for _ in range(5)],
                  "nan_metrics": [sse(chunk("t")), sse(chunk("u", "length"))],
                  "huge_metrics": [sse(chunk("t")) for _ in range(20)] + [sse(chunk("u", "length"))]}[m]
        for e in events:
            writer.write(e)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


def loadgen(url, out, *extra, mem_gib=None, timeout=120):
    code = "import sys; from gpu_runner.__main__ import main; sys.exit(main(sys.argv[1:]))"
    pre = None
    if mem_gib:
        def pre():
            resource.setrlimit(resource.RLIMIT_AS, (mem_gib << 30, mem_gib << 30))
    return subprocess.run([sys.executable, "-c", code, "loadgen", "--url", url, "--workload", WORKLOAD, "--out",
                           str(out), "--concurrency", "2", "--request-timeout", "3", "--metrics-interval", "0.1",
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout, preexec_fn=pre)


@pytest.mark.parametrize("mode,failure", [
    ("list_chunk", "not a JSON object"), ("string_delta", "delta is str"), ("usage_5", "usage is 5"),
    ("silence", "no finish within 3 s"), ("keepalive", "no finish within 3 s"),
    ("no_finish", "without a finish reason"), ("huge_line", "without a newline"), ("endless_500", "HTTP 500"),
])
def test_every_request_ends_and_the_capture_is_written(tmp_path, mode, failure):
    srv = Hostile(mode)
    out = tmp_path / "t.json"
    r = loadgen(f"http://127.0.0.1:{srv.port}", out, mem_gib=3)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    tr = load_trace(out)
    fails = tr.meta.get("failures") or {}
    assert len(fails) == len(tr.requests) == 5
    assert all(failure in v for v in fails.values()), fails


def test_more_tokens_than_asked_are_kept_and_said(tmp_path):
    srv = Hostile("too_many")
    out = tmp_path / "t.json"
    r = loadgen(f"http://127.0.0.1:{srv.port}", out)
    assert r.returncode == 0, r.stderr[-2000:]
    tr = load_trace(out)
    assert tr.meta["odd"] and "50 tokens streamed for max_tokens" in tr.meta["odd"][0]
    assert len(tr.tokens) == 5 * 50


@pytest.mark.parametrize("mode", ["nan_metrics", "huge_metrics"])
def test_metrics_pages_that_are_odd_or_huge(tmp_path, mode):
    srv = Hostile(mode)
    out = tmp_path / "t.json"
    r = loadgen(f"http://127.0.0.1:{srv.port}", out)
    assert r.returncode == 0, r.stderr[-2000:]
    tr = load_trace(out)
    assert not (tr.meta.get("failures") or {})
    for g in tr.events_of("gauge"):
        assert all(v == v and v not in (float("inf"),) for k, v in g.items() if k not in ("t_ms", "type"))


def test_a_models_list_of_strings_is_one_line(tmp_path):
    srv = Hostile("models_list")
    r = loadgen(f"http://127.0.0.1:{srv.port}", tmp_path / "t.json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "/v1/models" in r.stderr, r.stderr
    assert not (tmp_path / "t.json").exists()


def test_absurd_flags_are_refused(tmp_path):
    srv = Hostile("no_finish")
    for extra, msg in ((["--metrics-interval", "-1"], "--metrics-interval"),
                       (["--request-timeout", "0"], "--request-timeout")):
        r = loadgen(f"http://127.0.0.1:{srv.port}", tmp_path / "t.json", *extra)
        assert r.returncode == 2 and msg in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "gpu_runner", "loadgen", "--url", f"http://127.0.0.1:{srv.port}",
                        "--workload", WORKLOAD, "--out", str(tmp_path / "c.json"), "--concurrency", "100000000"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--concurrency" in r.stderr


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_ctrl_c_on_streams_that_never_finish_keeps_the_capture(tmp_path, sigint):
    """Ctrl-C while both streams hang: loadgen stops on the signal itself (the streams still open,
    nothing more sent), writes what it saw and exits 0. "ignored": started with SIGINT ignored, as
    a non-interactive shell starts a background job (`pytest ... &` in a script): asyncio.run then
    installs no SIGINT handling at all, and loadgen went on until its streams ended (issue 48,
    item 38); its own handler stops it, and its own bound (STOP_GRACE_S) ends the stop."""
    import signal
    import time
    srv = Hostile("keepalive_long")           # streams keep-alives for 10 minutes: never finishes within the test
    out = tmp_path / "t.json"
    disposition = {"default": signal.SIG_DFL, "ignored": signal.SIG_IGN}[sigint]    # whatever pytest's own is

    def pre():
        signal.signal(signal.SIGINT, disposition)
    p = subprocess.Popen([sys.executable, "-m", "gpu_runner", "loadgen", "--url", f"http://127.0.0.1:{srv.port}",
                          "--workload", WORKLOAD, "--out", str(out), "--concurrency", "2", "--request-timeout", "600"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pre)
    deadline = time.monotonic() + 120          # a bound on a broken run, not the thing asserted
    while srv.streams < 2 and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)                       # wait for the state: both concurrent streams are open
    assert srv.streams == 2, (srv.streams, p.poll())
    p.send_signal(signal.SIGINT)
    try:                                       # loadgen's own bound is STOP_GRACE_S (then the write):
        _, err = p.communicate(timeout=120)    # this only ends a broken run, far short of the streams' end
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and "Task exception was never retrieved" not in err and "Traceback" not in err, err
    assert "interrupted: writing what was captured" in err, err
    assert srv.streams == 2 and srv.completed == 0, (srv.streams, srv.completed)   # stopped on the signal, not
    #                                                                                 at the streams' end
    tr = load_trace(out)
    assert len(tr.requests) == 2 and not len(tr.finishes)       # in flight when stopped: unfinished, not "error"
    assert "still streaming when the capture stopped" in tr.meta["notes"]


def test_the_loop_closes_without_waiting_on_a_stuck_task_or_thread():
    """run_loop (loadgen's asyncio.run): a task that swallows its cancellation and a to_thread
    call that never returns get the grace (STOP_GRACE_S in loadgen), then are left behind;
    asyncio.run would wait for both for ever (the task in its shutdown, the thread in its
    executor's shutdown and at the interpreter's exit)."""
    from gpu_runner.loadgen import run_loop
    release, seen = threading.Event(), {"cancels": 0}

    def blocked():
        seen["daemon"] = threading.current_thread().daemon
        release.wait()

    async def stubborn():
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen["cancels"] += 1             # swallowed

    async def main():
        asyncio.create_task(stubborn())
        asyncio.create_task(asyncio.to_thread(blocked))
        while "daemon" not in seen:
            await asyncio.sleep(0.01)
        return "done"

    got = []
    th = threading.Thread(target=lambda: got.append(run_loop(main(), grace=0.2)), daemon=True)
    th.start()
    th.join(60)                                # a bound on a broken run, not the thing asserted
    try:
        assert got == ["done"] and not th.is_alive()
        assert seen["cancels"] >= 1 and not release.is_set() and seen["daemon"]   # left behind, still blocked:
    finally:                                                                        # nothing waits for its thread
        release.set()
