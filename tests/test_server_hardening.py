"""The serving side answers what it does not do, and what is not text, with a 4xx naming the
field (issue 27, items 9 and 12); a body that never arrives whole is answered 408."""
import socket
import time

import httpx
import pytest

from tests.helpers import Running

pytestmark = pytest.mark.slow   # a model in a server thread


@pytest.fixture(scope="module")
def srv(bundled):
    import torch
    torch.set_num_threads(1)
    with Running(bundled("tiny")) as s:
        yield s


@pytest.mark.parametrize("body,field", [
    ({"prompt": "hi", "max_tokens": 3, "best_of": 3}, "best_of"),
    ({"prompt": "hi", "max_tokens": 3, "logprobs": 5}, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2},
     "logprobs"),
    ({"prompt": "hi", "max_tokens": 3, "echo": True}, "echo"),
])
def test_what_the_server_does_not_do_is_refused(srv, body, field):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = httpx.post(f"{srv.url}{path}", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(field), r.text


def test_what_it_does_is_still_accepted(srv):
    for body in ({"prompt": "hi", "max_tokens": 3, "best_of": 1}, {"prompt": "hi", "max_tokens": 3, "logprobs": None},
                 {"prompt": "hi", "max_tokens": 3, "echo": False}):
        assert httpx.post(f"{srv.url}/v1/completions", json=body, timeout=30).status_code == 200


@pytest.mark.parametrize("raw,field", [
    (b'{"prompt": "\\ud800", "max_tokens": 3}', "prompt"),
    (b'{"prompt": ["ok", "\\udfff x"], "max_tokens": 3}', "prompt"),
    (b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 3}', "messages[0].content"),
    (b'{"prompt": "hi", "stop": ["\\ud800"], "max_tokens": 3}', "stop[0]"),
])
def test_a_lone_surrogate_is_a_400_and_the_connection_lives(srv, raw, field):
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    with httpx.Client(timeout=30) as c:
        r = c.post(f"{srv.url}{path}", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]      # msgspec refuses the escape itself; the text check names the field
        assert "surrogate" in msg and (field in msg or "byte" in msg), msg
        # the same keep-alive connection answers the next request
        assert c.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_a_body_shorter_than_its_length_gets_408(srv, monkeypatch):
    import gpu_runner.server as server
    monkeypatch.setattr(server, "BODY_TIMEOUT_S", 1.0)
    host, port = "127.0.0.1", srv.port
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        t0 = time.monotonic()
        s.settimeout(10)
        reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 8, reply[:200]


def test_chat_content_as_text_parts_is_served_as_its_joined_text(srv):
    # `vllm bench serve --backend openai-chat` sends every prompt as [{"type": "text", ...}]
    parts = [{"type": "text", "text": "the cat"}, {"type": "text", "text": "sat on"}]
    ask = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}], **ask},
                   timeout=30)
    same = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": [{"role": "user", "content":
                                                                          "the cat\nsat on"}], **ask}, timeout=30)
    assert r.status_code == 200 and same.status_code == 200, r.text
    # the same prompt (texts joined with "\n", as vLLM joins them): the same tokens and the same greedy answer
    assert r.json()["usage"] == same.json()["usage"]
    assert r.json()["choices"][0]["message"] == same.json()["choices"][0]["message"]
    stream = httpx.post(f"{srv.url}/v1/chat/completions", timeout=30,
                        json={"messages": [{"role": "user", "content": parts}], "stream": True, **ask})
    assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")


def test_a_part_that_is_not_text_is_a_400_naming_its_type_and_place(srv):
    parts = [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}],
                                                            "max_tokens": 3}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        "messages[0].content[1].type: 'image_url' parts are not supported"), r.text
