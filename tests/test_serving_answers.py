"""Every request gets an answer: what the scheduler rejects (a context budget, a bounded queue)
reaches the client as an HTTP error naming the limit, or as the end of its stream with the
reason; and SIGTERM to the server's pid alone stops its engine process too, in every state.
Servers run as `python -m gpu_runner serve` subprocesses on loopback; every wait is bounded."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from core.config import SamplingParams, SchedulerConfig
from core.engine.outputs import ExecutorOutput
from core.engine.scheduler import Scheduler
from core.workload import Request
from tests.conftest import ROOT
from tests.helpers import free_port

pytestmark = pytest.mark.slow   # runs the bundled model in subprocesses


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (read from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def start_server(*flags) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpu_runner", "serve", "--port", str(port), "--threads", "1",
                             *flags], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def stream(url: str, body: dict, out: list, i: int):
    """One streaming completion: (status, last SSE payload before [DONE] or the error body, saw [DONE])."""
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            if r.status_code != 200:
                r.read()
                out[i] = (r.status_code, r.json(), False)
                return
            data = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
            done = bool(data) and data[-1] == "[DONE]"
            payloads = [json.loads(x) for x in data if x != "[DONE]"]
            out[i] = (200, payloads[-1] if payloads else None, done)
    except httpx.HTTPError as e:   # a client left waiting would end here, after the timeout
        out[i] = (None, repr(e), False)


def test_rejections_are_answered_with_the_limit_and_sigterm_stops_the_engine_process():
    from deploy.serve import wait_healthy
    proc, url = start_server("--max-model-len", "64", "--queue-limit", "1", "--max-seqs", "1", "--kv-blocks", "64")
    try:
        wait_healthy(url, 120, [proc], path="/health")
        engine = children(proc.pid)
        assert len(engine) >= 1                     # the engine runs in its own process (the default)
        # over the context budget: a 400 that names it, streaming or not, at once
        for streaming in (False, True):
            t0 = time.monotonic()
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "x" * 100, "max_tokens": 8, "stream": streaming},
                           timeout=30)
            assert r.status_code == 400 and "max_model_len 64" in r.json()["error"]["message"], r.text
            assert time.monotonic() - t0 < 10
        # a burst of 6 into one seat and a queue of 1: every client is answered, none waits
        out = [None] * 6
        body = {"prompt": "The ", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        threads = [threading.Thread(target=stream, args=(url, body, out, i)) for i in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(90)
        assert all(o is not None for o in out), out
        served = [o for o in out if o[0] == 200]
        rejected = [o for o in out if o[0] == 503]
        assert len(served) + len(rejected) == 6, out
        assert len(rejected) >= 3, out
        for _, last, done in served:
            assert done and last["choices"][0]["finish_reason"] == "length"
        for _, err, _ in rejected:
            assert "queue limit of 1" in err["error"]["message"], err
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        sigterm_stops_both(proc, engine)   # SIGTERM to the server's pid alone, after rejections
    finally:
        if proc.poll() is None:
            proc.kill()


def sigterm_stops_both(proc, engine: list[int]):
    """SIGTERM to the server's pid alone: the server ends, and so does every engine process."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    for pid in engine:
        assert wait_gone(pid, 30), f"engine process {pid} outlived the server"


def test_sigterm_while_the_engine_is_loading_stops_it_too():
    proc, url = start_server("--kv-blocks", "64")
    try:
        deadline = time.monotonic() + 60
        engine = []
        while not engine and time.monotonic() < deadline:   # spawned before the model loads
            engine = [p for p in children(proc.pid) if alive(p)]
            time.sleep(0.02)
        assert engine, "no engine process started"
        sigterm_stops_both(proc, engine)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_request_rejected_after_it_was_accepted_ends_its_stream_with_the_reason():
    """Engine side: with a queue limit of 1, a preempted request re-entering the queue pushes out
    the newest never-run one, which was accepted earlier: its Finish says rejected by queue_limit.
    HTTP side: such a finish ends the stream with an error event naming it, then [DONE]."""
    cfg = SchedulerConfig(max_seqs=2, block_size=4, kv_blocks=4, queue_limit=1)
    s = Scheduler(None, cfg, request_data=True)
    for k, arrival in enumerate((0.0, 0.0)):
        s.add_request(Request(f"r{k}", arrival, 4, 9))
    s.admit_arrivals(0.0)
    assert s.take_outputs(0.0).queued == [0, 1]
    t = 0.0
    s.add_request(Request("late", 0.5, 4, 2))
    accepted, happened = set(), []
    while not s.done() and t < 100:
        s.admit_arrivals(t)
        b = s.schedule(t)
        if s.has_outputs():
            o = s.take_outputs(t)
            accepted |= set(o.queued) - {f.req for f in o.finished}
            happened += o.finished
        if b is None:
            t += 1.0
            continue
        t += 1.0
        o = s.update(b, ExecutorOutput(t, tokens=[[7]] * len(b.reqs)))
        happened += o.finished
    late = [f for f in happened if f.req == 2]
    assert s.num_preemptions >= 1
    assert late and late[0].reason == "rejected" and late[0].limit == "queue_limit" and 2 in accepted
    assert "queue limit of 1" in late[0].detail

    # Engine side: its output processor answers the late request with Failed 503 naming the limit
    # (after what it had emitted), the others with their finish reason.
    from core.engine.outputs import EngineOutputs
    from gpu_runner.messages import AddRequest, Failed, RequestOutput
    from gpu_runner.output_processor import OutputProcessor
    proc = OutputProcessor(lambda ids: "".join(map(str, ids)))
    for i, rid in enumerate(("r0", "r1", "late")):
        proc.add(i, AddRequest(rid, [1, 2, 3, 4], 9, SamplingParams(), None, [], 0.0))
    told, _ = proc.process(EngineOutputs(3.0, (), finished=late))
    assert told == [Failed("late", f"rejected: {late[0].detail}", 503)]

    from gpu_runner.client import Stream
    from gpu_runner.server import _Generation

    class App:
        name = "tiny"

        class se:
            @staticmethod
            def cancel(*a):
                pass

    async def run():
        st = Stream("r", [1, 2], 5, None, None, asyncio.get_running_loop())
        st.done = True
        for item in (RequestOutput("r", [5], "5", 1.0), Failed("r", f"rejected: {late[0].detail}", 503)):
            st.queue.put_nowait(item)

        class Req:
            async def receive(self):
                await asyncio.sleep(3600)
        return [x async for x in _Generation(App, st, "cmpl-x", False).sse(Req(), False)]
    lines = asyncio.run(run())
    assert lines[-1] == "data: [DONE]\n\n"
    err = json.loads(lines[-2][6:])["error"]     # vLLM 0.32's (and OpenAI's) shape: {"error": {...}}
    assert err["code"] == 503 and "queue limit of 1" in err["message"] and err["type"] == "ServiceUnavailableError"
    assert json.loads(lines[0][6:])["choices"][0]["text"] == "5"     # what it had emitted, then the reason
