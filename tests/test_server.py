"""`gpu_runner serve`: the OpenAI-compatible server on loopback, started and stopped by the
tests (in-process in a thread, and one subprocess for SIGTERM), every wait bounded."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from gpu_runner.tokenizer import ByteTokenizer
from tests.conftest import ROOT
from tests.helpers import Running, free_port, reference

pytestmark = pytest.mark.slow   # runs the bundled model

PROMPTS = ["The ", "def f(x):\n    return ", "A list is", "import "]


@pytest.fixture(scope="module")
def tiny(bundled):
    torch.set_num_threads(1)
    return bundled("tiny")


def sse_tokens(lines):
    chunks = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
    return chunks


@pytest.mark.parametrize("engine_process", [False, True], ids=["engine-thread", "engine-process"])
def test_completions_equal_the_batch_runner_streaming_or_not(tiny, engine_process):
    ref = reference(tiny, PROMPTS, 24)
    with Running(tiny, engine_process=engine_process) as srv, httpx.Client(timeout=60) as c:
        for p, want in zip(PROMPTS, ref):
            r = c.post(f"{srv.url}/v1/completions", json={"prompt": p, "max_tokens": 24, "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["token_ids"] == want
            assert body["choices"][0]["text"] == ByteTokenizer().decode(want)
            assert body["usage"] == {"prompt_tokens": len(p), "completion_tokens": 24, "total_tokens": len(p) + 24}
            with c.stream("POST", f"{srv.url}/v1/completions",
                          json={"prompt": list(p.encode()), "max_tokens": 24, "temperature": 0, "stream": True,
                                "stream_options": {"include_usage": True}}) as s:
                chunks = sse_tokens(list(s.iter_lines()))
            assert "".join(ch["choices"][0]["text"] for ch in chunks if ch["choices"]) == ByteTokenizer().decode(want)
            assert chunks[-2]["choices"][0]["finish_reason"] == "length"
            # the finish comes with the last tokens (as from vLLM): no empty chunk a client would count
            assert all(ch["choices"][0]["text"] for ch in chunks if ch["choices"])
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
        chat = c.post(f"{srv.url}/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0})
        assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
        assert len(chat.json()["choices"][0]["message"]["content"]) > 0
        models = c.get(f"{srv.url}/v1/models").json()
        assert models["data"][0]["id"] == "tiny"
        assert c.get(f"{srv.url}/health").status_code == 200
        assert srv.metric("vllm:generation_tokens_total", model_name="tiny") == 2 * 24 * len(PROMPTS) + 5
        assert srv.metric("vllm:request_success_total", model_name="tiny", finished_reason="length") == 9


def test_a_dead_engine_process_fails_requests_clearly(tiny):
    """The engine process killed under a running server: /health says so, open streams end with
    an error event, new requests get 503, and nothing hangs."""
    with Running(tiny, engine_process=True) as srv, httpx.Client(timeout=30) as c:
        assert c.get(f"{srv.url}/health").status_code == 200
        with c.stream("POST", f"{srv.url}/v1/completions",
                      json={"prompt": "The ", "max_tokens": 1500, "stream": True, "ignore_eos": True}) as s:
            lines = s.iter_lines()
            assert next(lines).startswith("data: ")           # streaming has started
            srv.se.proc.kill()
            rest = [x for x in lines if x.startswith("data: ")]
        assert any(x.startswith('data: {"error": {') for x in rest), rest[-3:]     # vLLM 0.32's error event,
        assert rest[-1] == "data: [DONE]"                     # then [DONE]: one server ends it as vLLM does
        deadline = time.monotonic() + 10
        while c.get(f"{srv.url}/health").status_code != 503:
            assert time.monotonic() < deadline, "/health still says healthy"
            time.sleep(0.1)
        r = c.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and "engine process" in r.text


def test_speculative_serving_is_greedy_exact(tiny, bundled):
    """With a draft model the server verifies draft tokens; greedy output is unchanged, and the
    recorded trace has spec events."""
    draft = bundled("tiny-draft")
    ref = reference(tiny, PROMPTS[:2], 20)
    with Running(tiny, draft=draft) as srv, httpx.Client(timeout=60) as c:
        for p, want in zip(PROMPTS[:2], ref):
            r = c.post(f"{srv.url}/v1/completions", json={"prompt": p, "max_tokens": 20, "temperature": 0})
            assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == want
        r = c.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 0.7})
        assert r.status_code == 400 and "speculative serving samples with the server's settings" in r.text
        r = c.post(f"{srv.url}/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 20})   # no sampling fields
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == ref[0]   # server: greedy
        assert srv.se.service.trace().events_of("spec")


def test_concurrent_streams_all_complete_and_batch_together(tiny):
    async def one(client, url, k):
        async with client.stream("POST", f"{url}/v1/completions",
                                 json={"prompt": PROMPTS[k % 4], "max_tokens": 16, "temperature": 0,
                                       "stream": True}) as s:
            lines = [x async for x in s.aiter_lines()]
        return "".join(ch["choices"][0]["text"] for ch in sse_tokens(lines) if ch["choices"])

    async def main(url):
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(one(client, url, k) for k in range(32)))

    ref = [ByteTokenizer().decode(t) for t in reference(tiny, PROMPTS, 16)]
    with Running(tiny) as srv:
        texts = asyncio.run(main(srv.url))
        assert texts == [ref[k % 4] for k in range(32)]     # batching does not change greedy outputs
        assert srv.metric("vllm:request_success_total", finished_reason="length") == 32
        assert max(r.running for r in srv.se.service.core.log.steps) > 1       # continuous batching across clients


def test_cancelled_streams_return_their_kv_blocks(tiny):
    async def cancel_midway(client, url):
        async with client.stream("POST", f"{url}/v1/completions",
                                 json={"prompt": "The ", "max_tokens": 400, "temperature": 0, "stream": True,
                                       "ignore_eos": True}) as s:
            n = 0
            async for line in s.aiter_lines():
                n += line.startswith("data: ")
                if n >= 3:
                    break          # leave mid-stream: the connection closes

    async def main(url):
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(cancel_midway(client, url) for _ in range(20)))

    with Running(tiny) as srv:
        asyncio.run(main(srv.url))
        deadline = time.monotonic() + 30
        while srv.se.streams or srv.se.service.core.num_done < 20:
            assert time.monotonic() < deadline, "cancelled requests were not aborted"
            time.sleep(0.05)
        assert srv.metric("vllm:kv_cache_usage_perc") == 0.0
        assert srv.metric("vllm:request_success_total", finished_reason="abort") == 20
        bm = srv.se.service.core.scheduler.kv
        assert bm.num_free == bm.num_blocks
        bm.check()
        # and it keeps serving
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200


def test_overload_gets_503_and_the_server_keeps_serving(tiny):
    async def main(url):
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(f"{url}/v1/completions",
                                                      json={"prompt": "The ", "max_tokens": 60, "ignore_eos": True})
                                          for _ in range(12)))

    with Running(tiny, max_waiting=2, max_seqs=1) as srv:
        rs = asyncio.run(main(srv.url))
        codes = [r.status_code for r in rs]
        assert codes.count(503) >= 1 and codes.count(200) >= 2, codes
        busy = next(r for r in rs if r.status_code == 503)
        assert busy.headers["retry-after"] and "waiting" in busy.json()["error"]["message"]
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200


def test_bad_requests_get_400_with_the_reason(tiny):
    with Running(tiny, kv_blocks=8, block_size=16) as srv, httpx.Client(timeout=30) as c:
        url = f"{srv.url}/v1/completions"
        cases = [
            ({"prompt": "x" * 2000, "max_tokens": 100}, 400, "maximum context length is 2048"),
            ({"prompt": "x" * 100, "max_tokens": 100}, 400, "need 13 KV blocks of 16; the pool has 8"),
            ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens: expected an integer"),
            ({"prompt": "x", "temperature": -1}, 400, "temperature: expected a number"),
            ({"prompt": [1, 2, 999]}, 400, "token id 999 is outside the vocabulary"),
            ({"max_tokens": 3}, 400, "prompt: required"),
            ({"prompt": "x", "model": "gpt-9"}, 404, "`gpt-9` does not exist"),
            ({"prompt": "x", "n": 2}, 400, "n: only 1"),
        ]
        for body, code, msg in cases:
            r = c.post(url, json=body)
            assert r.status_code == code and msg in r.json()["error"]["message"], (body, r.status_code, r.text)
        r = c.post(url, content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = c.post(url, content=b"[" * 100_000, headers={"content-type": "application/json"})
        assert r.status_code == 400
        # unknown fields (benchmark clients send them) are ignored
        r = c.post(url, json={"prompt": "x", "max_tokens": 2, "best_of": 1, "logprobs": None, "extra": {"a": 1}})
        assert r.status_code == 200
        # stop strings end the request before the match, which is not returned
        ref = reference(tiny, ["The "], 30)[0]
        text = ByteTokenizer().decode(ref)
        stop = text[5:7]
        r = c.post(url, json={"prompt": "The ", "max_tokens": 30, "temperature": 0, "stop": stop}).json()
        assert r["choices"][0]["text"] == text[:text.find(stop)] and r["choices"][0]["finish_reason"] == "stop"
        assert c.get(f"{srv.url}/health").status_code == 200     # none of it hurt the server


def test_metrics_parse_and_use_vllm_names(tiny):
    with Running(tiny) as srv:
        httpx.post(f"{srv.url}/v1/completions", json={"prompt": "The ", "max_tokens": 5, "temperature": 0},
                   timeout=30)
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
        for want in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                     "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:request_success_total",
                     "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_count",
                     "vllm:e2e_request_latency_seconds_sum", "vllm:request_queue_time_seconds_count"]:
            assert want in names, want
        assert srv.metric("vllm:generation_tokens_total") == 5
        assert srv.metric("vllm:prompt_tokens_total") == 4
        assert srv.metric("vllm:inter_token_latency_seconds_count") == 4     # 5 tokens, 4 gaps


def _serve_with_trace(port: int, out, kv_blocks: int):
    """`gpu_runner serve --trace-out OUT` on `port`, returned once healthy."""
    from deploy.serve import wait_healthy
    proc = subprocess.Popen([sys.executable, "-m", "gpu_runner", "serve", "--port", str(port), "--threads", "1",
                             "--kv-blocks", str(kv_blocks), "--trace-out", str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 60, [proc], path="/health")
    except BaseException:
        proc.kill()
        raise
    return proc


def test_sigterm_writes_a_valid_trace(tmp_path):
    from core.analysis.metrics import conservation
    from core.trace import load_trace
    port = free_port()
    out = tmp_path / "served.json"
    proc = _serve_with_trace(port, out, 128)
    try:
        for p in PROMPTS:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": p, "max_tokens": 8}, timeout=30)
            assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    tr = load_trace(out)
    assert tr.meta["source"] == "measured" and len(tr.requests) == 4 and len(tr.finishes) == 4
    assert len(tr.tokens) == 32
    assert conservation(tr) == []
    # its clock: t_ms 0 on this host's CLOCK_MONOTONIC and on the epoch clock (a fleet merge places it by them)
    clock = tr.meta["clock"]
    assert clock["kind"] == "perf_counter" and 0 < clock["t0_s"] < time.monotonic()
    assert abs(clock["epoch_t0_s"] - (time.time() - (time.monotonic() - clock["t0_s"]))) < 0.5


def test_loadgen_against_our_server_matches_the_servers_own_trace(tiny, tmp_path):
    """The capture client: a valid measured trace whose per-request token counts equal what the
    server recorded, with /metrics gauges; Poisson and closed-loop modes."""
    from core.trace import load_trace
    from gpu_runner.__main__ import main
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"requests": [{"id": f"r{k}", "arrival_ms": 40 * k, "prompt": PROMPTS[k % 4],
                                            "output_tokens": 6 + k % 5} for k in range(12)]}))
    for mode in (["--rate", "50"], ["--concurrency", "4"], []):
        with Running(tiny) as srv:
            out = tmp_path / "captured.json"
            assert main(["loadgen", "--url", srv.url, "--workload", str(wl), "--out", str(out),
                         "--metrics-interval", "0.05", *mode]) == 0
            server_tr = srv.se.service.trace()
        tr = load_trace(out)
        assert tr.meta["source"] == "measured" and tr.meta["engine"]["name"] == "gpu_runner"
        from core.analysis.metrics import request_metrics
        got = dict(zip(*(request_metrics(tr)[c] for c in ("id", "output_tokens"))))
        assert got == {f"r{k}": 6 + k % 5 for k in range(12)}
        served = request_metrics(server_tr)["output_tokens"]   # the server's ids are its own
        assert sorted(served) == sorted(got.values())
        assert set(tr.finishes["reason"]) == {"length"}
        gauges = [e for e in tr.other if e.get("type") == "gauge"]
        assert gauges and {"running", "waiting", "kv_usage"} <= set(gauges[0])


def test_loadgen_names_an_unreachable_server(tmp_path, capsys):
    from gpu_runner.__main__ import main
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"requests": [{"id": "a", "arrival_ms": 0, "prompt": "x", "output_tokens": 2}]}))
    rc = main(["loadgen", "--url", f"http://127.0.0.1:{free_port()}", "--workload", str(wl),
               "--out", str(tmp_path / "o.json")])
    assert rc == 2 and "GET /v1/models failed" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_the_trace_is_rewritten_when_idle_not_under_requests_in_flight():
    """A --trace-out rewrite stalls every request in flight for as long as it takes: it waits
    for the engine to go idle, unless requests have been in flight for BUSY_FLUSH_EVERY_S."""
    from gpu_runner.serving import BUSY_FLUSH_EVERY_S, flush_due
    assert BUSY_FLUSH_EVERY_S == 30.0
    assert flush_due(1.0, 1.0, busy=False) and not flush_due(0.5, 1.0, busy=False)
    assert not flush_due(5.0, 1.0, busy=True) and not flush_due(29.9, 1.0, busy=True)
    assert flush_due(30.0, 1.0, busy=True)
    assert not flush_due(30.0, 60.0, busy=True) and flush_due(60.0, 60.0, busy=True)   # the 5% rule still stretches it
    # a rewrite due since an idle spell waits until the requests now in flight have been so for as long
    assert not flush_due(100.0, 1.0, busy=True, busy_for_s=0.02) and not flush_due(100.0, 1.0, True, 29.9)
    assert flush_due(100.0, 1.0, busy=True, busy_for_s=30.0) and flush_due(100.0, 1.0, busy=False, busy_for_s=0.0)


def test_an_idle_server_writes_a_trace_of_no_requests_that_merges(tmp_path):
    """Issue 52 item 7: `serve --trace-out` that served nothing wrote no file, so a fleet merge of an
    idle replica failed; it writes a trace of 0 requests with its clock, and fleet-merge takes it."""
    from core.fleet.merge import merge_replicas
    from core.trace import load_trace
    port = free_port()
    out = tmp_path / "idle.json.gz"
    proc = _serve_with_trace(port, out, 64)
    try:
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "(0 requests, 0 steps)" in log, log
    idle = load_trace(out)
    assert len(idle.requests) == 0 and idle.meta["clock"]["kind"] == "perf_counter"
    busy = load_trace(ROOT / "data" / "traces" / "chapter31_measured_cpu.json")
    busy.meta = {**busy.meta, "clock": {**idle.meta["clock"], "t0_s": idle.meta["clock"]["t0_s"] - 10.0}}
    m = merge_replicas([busy, idle], names=["busy", "idle"])
    assert len(m.requests) == len(busy.requests)
    assert [r["offset_ms"] for r in m.meta["fleet"]["alignment"]] == pytest.approx([0.0, 10_000.0])
