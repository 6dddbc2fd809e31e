"""What sglang-router (sglang_router 0.3.2) needs of a worker, on our server (issue 38 item 4):
GET /server_info and /model_info as it registers the worker (served_model_name names the model it
routes), and the client's X-Request-Id, which it forwards, as the request's id in the trace (as
vLLM takes it): sanitised, and unique within the server. In-process server on loopback, bounded."""
import threading

import httpx
import pytest

from core.trace import load_trace
from tests.helpers import Running

pytestmark = pytest.mark.slow   # a model in a server thread


@pytest.fixture(scope="module")
def traced(bundled, tmp_path_factory):
    """A server, its requests sent by `send(srv)` (given here, run once), then its trace."""
    import torch
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("router") / "trace.json"
    answers = {}
    with Running(bundled("tiny"), trace_out=out) as srv:
        answers["server_info"] = httpx.get(f"{srv.url}/server_info", timeout=10)
        answers["model_info"] = httpx.get(f"{srv.url}/model_info", timeout=10)
        for name, rid, path, stream in REQUESTS:
            body = ({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "The "})
            r = httpx.post(f"{srv.url}{path}", json={**body, "model": "tiny", "max_tokens": 2, "stream": stream},
                           headers={} if rid is None else {"X-Request-Id": rid}, timeout=30)
            assert r.status_code == 200, r.text
            answers[name] = r
        same = [None, None]

        def post(k):   # the same id twice at once: one request gets it
            same[k] = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "ab", "max_tokens": 2},
                                 headers={"X-Request-Id": "twin"}, timeout=30)
        threads = [threading.Thread(target=post, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        answers["twins"] = same
    return answers, load_trace(out)


LONG = "x" * 129
REQUESTS = [  # name, X-Request-Id sent (None: no header), path, stream
    ("plain", "router-7f3a", "/v1/completions", False),
    ("streamed", "router-7f3b", "/v1/completions", True),
    ("chat", "router-7f3c", "/v1/chat/completions", False),
    ("none", None, "/v1/completions", False),
    ("again", "router-7f3a", "/v1/completions", False),     # taken already
    ("long", LONG, "/v1/completions", False),
    ("longest", "y" * 128, "/v1/completions", False),
    ("control", "bad\tid", "/v1/completions", False),
    ("non_ascii", "caf\u00e9".encode("latin-1"), "/v1/completions", False),   # as bytes on the wire
    ("own_form", "req-99", "/v1/completions", False),
]


def test_server_info_names_the_served_model(traced):
    answers, _ = traced
    info = answers["server_info"]
    assert info.status_code == 200
    body = info.json()
    # the router's model id: served_model_name, else model_path; a bundled model has no path
    assert body["served_model_name"] == "tiny" and body["model_path"] is None
    assert body["dp_size"] == 1 and body["max_total_tokens"] == 256 * 16   # Running: 256 KV blocks of 16
    model = answers["model_info"]
    assert model.status_code == 200 and model.json() == {"model_path": None, "tokenizer_path": None,
                                                         "is_generation": True}


def test_x_request_id_is_the_trace_id_and_the_response_id(traced):
    answers, trace = traced
    ids = list(trace.ids)
    assert answers["plain"].json()["id"] == "cmpl-router-7f3a"
    assert answers["chat"].json()["id"] == "chatcmpl-router-7f3c"
    assert '"id": "cmpl-router-7f3b"' in answers["streamed"].text
    assert {"router-7f3a", "router-7f3b", "router-7f3c", "y" * 128} <= set(ids)
    assert len(ids) == len(set(ids)) == len(REQUESTS) + 2


@pytest.mark.parametrize("name", ["none", "again", "long", "control", "non_ascii", "own_form"])
def test_an_absent_taken_or_malformed_id_is_replaced_by_the_servers_own(traced, name):
    answers, trace = traced
    rid = answers[name].json()["id"]
    assert rid.startswith("cmpl-") and len(rid) == len("cmpl-") + 32      # a fresh uuid4 hex
    assert LONG not in trace.ids and "bad\tid" not in trace.ids and "caf\u00e9" not in trace.ids
    assert list(trace.ids).count("router-7f3a") == 1 and "req-99" not in trace.ids   # the server numbers from req-0


def test_one_id_sent_twice_at_once_is_given_to_one_request(traced):
    answers, trace = traced
    twins = answers["twins"]
    assert all(r is not None and r.status_code == 200 for r in twins)
    assert sorted(r.json()["id"] == "cmpl-twin" for r in twins) == [False, True]
    assert list(trace.ids).count("twin") == 1
