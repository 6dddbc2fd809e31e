"""Fault injection on the serving side (issue 27): episodes of random mixes of valid requests
(streamed and whole), invalid bodies, over-long prompts, unsupported fields, client disconnects
mid-stream, slow readers and bursts past the queue limit, against a server with small limits.
After each episode the invariants must hold:
- every request was answered (a result, a 4xx/503 naming the reason, or a stream that ended
  with a finish reason and [DONE]) unless the client itself hung up;
- when idle, /metrics says running 0, waiting 0, KV usage 0;
- the engine's KV cache passes its own check() and every block is back in the pool;
- the trace is valid and its finish reasons account for every request: length/stop for each
  result, abort for each hang-up, rejected for each over-long prompt and each queue-limit 503.
Under CI=true (or with no SERVE_FUZZ_SEED) the seeds are fixed and the episodes few; set
SERVE_FUZZ_EPISODES / SERVE_FUZZ_SEED to run more."""
import json
import os
import random
import threading
import time
from collections import Counter

import httpx
import pytest

from core.trace import trace_from_doc
from core.trace.jsoncodec import to_doc

pytestmark = pytest.mark.slow       # a model in a server thread, a few seconds per episode

EPISODES = int(os.environ.get("SERVE_FUZZ_EPISODES", "3"))
SEED = int(os.environ.get("SERVE_FUZZ_SEED", "20261201"))
KINDS = ("stream",) * 4 + ("whole",) * 2 + ("hangup",) * 2 + ("slow",) * 2 + (
    "bad_json", "bad_field", "too_long", "unsupported")


def server(model, tmp_path):
    """The tiny model behind the real HTTP app in this process (tests.test_server.Running: the
    engine in a thread, so that its scheduler and KV cache can be checked), small limits, its
    trace recorded."""
    from tests.helpers import Running
    return Running(model, max_waiting=6, trace_out=tmp_path / "t.json", max_seqs=3, kv_blocks=48, block_size=16,
                   queue_limit=3, max_model_len=192)


def gauges(srv) -> dict:
    return {"running": srv.metric("vllm:num_requests_running"), "waiting": srv.metric("vllm:num_requests_waiting"),
            "kv": srv.metric("vllm:kv_cache_usage_perc")}


def one(url: str, kind: str, rng: random.Random, out: list, k: int):
    """Send one request of `kind`; out[k] = (kind, outcome, detail)."""
    body = {"prompt": "The quick brown fox " * rng.randint(1, 3), "max_tokens": rng.randint(3, 24),
            "ignore_eos": True, "temperature": rng.choice([0, 0.7])}
    path = f"{url}/v1/completions"
    try:
        if kind == "bad_json":
            r = httpx.post(path, content=b'{"prompt": ', headers={"Content-Type": "application/json"}, timeout=60)
            out[k] = (kind, r.status_code, r.json().get("error", {}).get("message", ""))
            return
        if kind == "bad_field":
            r = httpx.post(path, json={**body, "max_tokens": 0}, timeout=60)
            out[k] = (kind, r.status_code, r.json().get("error", {}).get("message", ""))
            return
        if kind == "unsupported":
            r = httpx.post(path, json={**body, "best_of": 3}, timeout=60)
            out[k] = (kind, r.status_code, r.json().get("error", {}).get("message", ""))
            return
        if kind == "too_long":
            body["prompt"] = "x" * 200
        if kind == "whole":
            r = httpx.post(path, json=body, timeout=60)
            detail = (r.json()["error"]["message"] if r.status_code != 200 else
                      r.json()["choices"][0]["finish_reason"])
            out[k] = (kind, r.status_code, detail)
            return
        body["stream"] = True
        if kind in ("hangup", "slow"):
            body["max_tokens"] = rng.randint(12, 40)
        with httpx.stream("POST", path, json=body, timeout=60) as r:
            if r.status_code != 200:
                r.read()
                out[k] = (kind, r.status_code, r.json().get("error", {}).get("message", ""))
                return
            payloads, done = [], False
            for line in r.iter_lines():
                if kind == "slow":
                    time.sleep(0.03)
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                payloads.append(json.loads(line[6:]))
                if kind == "hangup" and len(payloads) >= 2:
                    out[k] = (kind, "hung up", None)
                    return          # closing the stream: the server must abort the request
            last = next((p for p in reversed(payloads) if p.get("choices")), payloads[-1] if payloads else None)
            reason = (last or {}).get("choices", [{}])[0].get("finish_reason") if last and last.get("choices") else None
            error = (last or {}).get("error", {}).get("message") if last and "choices" not in last else None
            out[k] = (kind, "stream", (reason, error, done))
    except httpx.HTTPError as e:
        out[k] = (kind, "client error", repr(e))


def wait_idle(srv, timeout_s=20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    g = gauges(srv)
    while time.monotonic() < deadline and (g["running"] or g["waiting"] or g["kv"]):
        time.sleep(0.2)
        g = gauges(srv)
    return g


@pytest.fixture(scope="module")
def model(bundled):
    import torch
    torch.set_num_threads(1)
    return bundled("tiny")


@pytest.mark.parametrize("episode", range(EPISODES))
def test_serving_invariants_hold_after_a_random_episode(model, tmp_path, episode):
    rng = random.Random(SEED + episode)
    kinds = [rng.choice(KINDS) for _ in range(rng.randint(12, 20))]
    with server(model, tmp_path) as srv:
        out = [None] * len(kinds)
        threads = []
        for k, kind in enumerate(kinds):
            th = threading.Thread(target=one, args=(srv.url, kind, random.Random(rng.random()), out, k))
            threads.append(th)
            th.start()
            time.sleep(rng.choice([0, 0, 0, 0.01, 0.05]))      # mostly bursts: past the queue limit
        for th in threads:
            th.join(90)
        assert all(o is not None for o in out), f"seed {SEED + episode}: a client never finished: {kinds}"
        # 1. every request answered
        results = rejected = hangups = 0
        for kind, outcome, detail in out:
            assert outcome != "client error", (SEED + episode, kind, detail)
            if kind in ("bad_json", "bad_field", "unsupported"):
                assert outcome == 400 and detail, (kind, outcome, detail)
            elif outcome == "hung up":
                hangups += 1
            elif outcome == "stream":
                reason, error, done = detail
                assert done, (kind, detail)                       # the stream ended with [DONE]
                if error:                                         # rejected after acceptance (queue limit)
                    assert "queue limit" in error, error
                    rejected += 1
                else:
                    assert reason in ("length", "stop"), detail
                    results += 1
            elif outcome == 200:
                results += 1
            else:                                                 # a refusal naming its reason
                assert outcome in (400, 503) and detail, (kind, outcome, detail)
                if "max_model_len" in detail or "queue limit" in detail:
                    rejected += 1
                else:
                    assert "waiting" in detail, detail             # --max-waiting: never reached the engine
        # 2. idle gauges back to 0
        g = wait_idle(srv)
        assert g == {"running": 0.0, "waiting": 0.0, "kv": 0.0}, g
        # 3. the engine's KV cache is consistent and whole again
        kv = srv.se.service.core.scheduler.kv
        kv.check()
        assert kv.num_free == 48
        # 4. the trace is valid and accounts for every request
        tr = srv.se.service.trace()
        trace_from_doc(to_doc(tr), "served")
        reasons = Counter(tr.finishes["reason"].astype(str))
        assert len(tr.finishes) == len(tr.requests)
        assert reasons["length"] + reasons["stop"] == results, (reasons, results)
        assert reasons["abort"] == hangups, (reasons, hangups)
        assert reasons["rejected"] == rejected, (reasons, rejected)
