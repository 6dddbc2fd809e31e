"""One request can never take down the engine, and an engine that does stop takes the server
down with it, loudly (issue 27, items 1 and 8). The server runs as `python -m gpu_runner serve`
subprocesses on loopback; every wait is bounded."""
import signal
import time

import httpx
import pytest

from core.config import SamplingParams, SchedulerConfig
from core.engine.outputs import ExecutorOutput
from core.engine.scheduler import Scheduler
from core.workload import Request
from tests.test_serving_answers import children, start_server, wait_gone


def test_a_tiny_temperature_samples_greedily():
    assert SamplingParams(temperature=1e-40).temperature == 0.0
    assert SamplingParams(temperature=2e-5).temperature == 2e-5


def test_filtered_probs_stay_finite_at_small_temperatures():
    import torch

    from gpu_runner.sampling import filtered_probs
    logits = torch.randn(3, 258) * 30
    for t in (1e-5, 1e-4, 0.01, 1.0, 100.0):
        p = filtered_probs(logits, SamplingParams(temperature=t, top_k=5, top_p=0.9))
        assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(3))


def test_an_entry_that_failed_ends_its_request_only():
    """The executor says one entry failed: that request finishes 'error' with the reason, its
    blocks go back to the pool, the other request goes on to its length."""
    sched = Scheduler(None, SchedulerConfig(max_seqs=2, kv_blocks=32, block_size=4))
    for rid in ("a", "b"):
        sched.add_request(Request(rid, 0.0, 8, 6))
    happened, t = [], 0.0
    while not sched.done() and t < 100:
        sched.admit_arrivals(t)
        b = sched.schedule(t)
        if sched.has_outputs():
            happened += sched.take_outputs(t).finished
        if b is None:
            t += 1.0
            continue
        t += 1.0
        failed = {j: "boom" for j, r in enumerate(b.reqs.tolist()) if r == 0 and sched.step == 2}
        happened += sched.update(b, ExecutorOutput(t, tokens=[[7]] * len(b.reqs), failed=failed or None)).finished
    by = {f.req: f for f in happened}
    assert by[0].reason == "error" and by[0].detail == "boom"
    assert by[1].reason == "length" and int(sched.requests.emitted[1]) == 6
    sched.kv.check()
    assert sched.kv.num_free == 32


def wait_health(url: str, proc, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited during startup"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server was not healthy in time")


PER_REQUEST = ({"prompt": "hi", "max_tokens": 5, "temperature": 1e-40},
               {"prompt": "hi", "max_tokens": 5, "temperature": 1e-40, "stream": True},
               {"prompt": "hi", "max_tokens": 5, "temperature": 0.8, "top_k": 3})
SERVER_WIDE = ({"prompt": "hi", "max_tokens": 5}, {"prompt": "hi", "max_tokens": 5, "stream": True})


@pytest.mark.slow
@pytest.mark.parametrize("flags,bodies", [([], PER_REQUEST), (["--no-engine-process"], PER_REQUEST),
                                          (["--speculative", "--temperature", "1e-40"], SERVER_WIDE)],
                         ids=["engine-process", "engine-thread", "speculative"])
def test_temperature_1e40_is_answered_and_the_engine_goes_on(flags, bodies):
    proc, url = start_server(*flags)
    try:
        wait_health(url, proc)
        for body in bodies:
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@pytest.mark.slow
def test_a_killed_engine_process_stops_the_server_with_status_1():
    proc, url = start_server()
    try:
        wait_health(url, proc)
        engine = children(proc.pid)
        assert engine
        for pid in engine:
            import os
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        code = proc.wait(30)
        assert code == 1, code
        assert time.monotonic() - t0 < 30
        for pid in engine:
            assert wait_gone(pid, 10)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_rejected_request_is_accounted_for_not_a_conservation_problem():
    from core.analysis.metrics import summarize
    from core.sim.simulate import simulate
    from core.workload import Workload
    w = Workload([Request("ok", 0.0, 8, 4), Request("long", 0.0, 100, 4)])
    tr = simulate(w, SchedulerConfig(max_model_len=64))
    reasons = dict(zip([tr.ids[i] for i in tr.finishes["req"]], tr.finishes["reason"].astype(str)))
    assert reasons == {"ok": "length", "long": "rejected"}
    assert summarize(tr)["summary"]["conservation_problems"] == []


@pytest.mark.slow
def test_gauges_return_to_zero_after_hangups_in_engine_process_mode():
    """20 streams that hang up mid-stream: /metrics says running 0, waiting 0, KV 0 once idle
    (issue 27, items 7 and 11), the engine in its own process as `serve` runs it by default."""
    import threading

    from prometheus_client.parser import text_string_to_metric_families
    proc, url = start_server("--max-seqs", "2")
    try:
        wait_health(url, proc)

        def hang():
            try:
                with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 500,
                                  "ignore_eos": True, "stream": True}, timeout=60) as r:
                    for k, _ in enumerate(r.iter_lines()):
                        if k > 3:
                            return
            except httpx.HTTPError:
                pass
        threads = [threading.Thread(target=hang) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        names = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
        deadline, g = time.monotonic() + 15, None
        while time.monotonic() < deadline:
            text = httpx.get(f"{url}/metrics", timeout=10).text
            g = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in names}
            if not any(g.values()):
                break
            time.sleep(0.3)
        assert g and not any(g.values()), g
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_an_engine_that_fails_answers_every_request_it_holds_even_those_still_in_its_inbox(bundled):
    """The model raises in a step: the request in the step and one that arrived meanwhile (still in
    the inbox, never added) are both answered Failed 500 with the reason; the thread ends."""
    import torch

    from gpu_runner.engine import Engine
    from gpu_runner.messages import AddRequest, Failed
    from gpu_runner.options import EngineConfig
    from gpu_runner.serving import EngineService
    from gpu_runner.tokenizer import ByteTokenizer
    torch.set_num_threads(1)
    told = []
    svc = EngineService(Engine(bundled("tiny"), ByteTokenizer(), EngineConfig(scheduler=SchedulerConfig(kv_blocks=32))),
                        lambda m: told.extend(m.events))
    late = AddRequest("late", [1, 2, 3], 4, SamplingParams(), None, [], 1.0)

    def boom(batch):
        svc.put(late)                    # arrives while the step runs
        raise RuntimeError("the device fell over")
    svc.executor.execute = boom
    svc.put(AddRequest("first", [1, 2, 3], 4, SamplingParams(), None, [], 0.0))
    svc.start()
    svc.thread.join(60)
    assert not svc.thread.is_alive() and "the device fell over" in svc.failure()
    failed = {e.rid: e for e in told if isinstance(e, Failed)}
    assert set(failed) == {"first", "late"}
    assert all(e.status == 500 and "the device fell over" in e.message for e in failed.values())
