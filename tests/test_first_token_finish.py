"""A request that ends on its first token is answered: one token asked, a stop token id first, the
model's EOS first, a stop string in the first token; streamed and not; by `serve` (engine thread
and engine process) and by `fleet` (whole replicas and disaggregated prefill/decode).

Such a request is queued and finished by one engine output; the server once waited for its
"accepted" message, which the engine never sent for it, so the client hung (issue 48, item 0).
Expected tokens come from the batch runner (Engine.run), not from the server under test."""
import json

import httpx
import pytest

from gpu_runner.tokenizer import ByteTokenizer
from tests.helpers import BOUND_S, Running, reference, start_fleet, stop_process

pytestmark = pytest.mark.slow   # runs the bundled model

PROMPT = "def f(x):\n    return "


class _EosTokenizer(ByteTokenizer):
    """The byte tokenizer with another end-of-sequence id (the model's first greedy token)."""

    def __init__(self, eos: int):
        self.eos_id = eos


def ask(url: str, body: dict, stream: bool) -> tuple[int, list[int] | None, str, str | None]:
    """(status, token ids or None when streamed, text, finish reason), bounded by BOUND_S."""
    body = {"prompt": PROMPT, "temperature": 0, **body}
    if not stream:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=BOUND_S)
        if r.status_code != 200:
            return r.status_code, None, r.text, None
        ch = r.json()["choices"][0]
        return 200, ch["token_ids"], ch["text"], ch["finish_reason"]
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=BOUND_S) as r:
        lines = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", lines
    chunks = [json.loads(x) for x in lines[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert all(x is None for x in reasons[:-1]), reasons
    return r.status_code, None, text, reasons[-1]


@pytest.fixture(scope="module")
def first(bundled):
    """The bundled tiny model and its greedy first two tokens after PROMPT (the batch runner's)."""
    tiny = bundled("tiny")
    ids = reference(tiny, [PROMPT], 2)[0]
    return tiny, ids


def cases(t0: int):
    """(name, request fields, expected token ids, expected text, finish reason)."""
    text0 = ByteTokenizer().decode([t0])
    return [
        ("one token", {"max_tokens": 1}, [t0], text0, "length"),
        ("stop id first", {"max_tokens": 8, "stop_token_ids": [t0]}, [t0], text0, "stop"),
        ("stop string in the first token", {"max_tokens": 8, "stop": [text0]}, [t0], "", "stop"),
    ]


@pytest.mark.parametrize("engine_process", [False, True], ids=["engine-thread", "engine-process"])
def test_serve_answers_every_request_that_ends_on_its_first_token(first, engine_process):
    tiny, (t0, _) = first
    with Running(tiny, engine_process=engine_process) as srv:
        for name, body, ids, text, reason in cases(t0):
            for stream in (False, True):
                status, got_ids, got_text, got_reason = ask(srv.url, body, stream)
                assert status == 200, (name, stream, got_text)
                assert (got_text, got_reason) == (text, reason), (name, stream)
                if got_ids is not None:
                    assert got_ids == ids, name
        assert srv.metric("vllm:num_requests_running", model_name="tiny") == 0


def test_serve_answers_a_request_whose_first_token_is_the_models_eos(first):
    tiny, (t0, _) = first
    with Running(tiny, tok=_EosTokenizer(t0)) as srv:
        assert srv.engine.stop_token_ids == (t0,)
        for stream in (False, True):
            status, ids, text, reason = ask(srv.url, {"max_tokens": 8}, stream)
            assert (status, reason) == (200, "stop"), (stream, text)
            assert text == ByteTokenizer().decode([t0])
            if ids is not None:
                assert ids == [t0]


@pytest.mark.parametrize("flags", [["--replicas", "2"], ["--prefill-replicas", "1", "--decode-replicas", "1"]],
                         ids=["whole", "disaggregated"])
def test_fleet_answers_every_request_that_ends_on_its_first_token(first, tmp_path, flags):
    _, (t0, _) = first
    proc, url, _ = start_fleet(tmp_path, *flags)
    try:
        for name, body, ids, text, reason in cases(t0):
            for stream in (False, True):
                status, got_ids, got_text, got_reason = ask(url, body, stream)
                assert status == 200, (name, stream, got_text)
                assert (got_text, got_reason) == (text, reason), (name, stream)
                if got_ids is not None:
                    assert got_ids == ids, name
    finally:
        out = stop_process(proc)
    assert proc.returncode == 0, out
