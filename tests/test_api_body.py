"""The server's request body, declared once (gpu_runner.api): every field checked on decoding,
and every refusal one line that names the field, for hostile bodies too."""
import pytest

from gpu_runner.api import KNOWN, BodyError, bad_text, decode_body, unsupported


@pytest.mark.parametrize("raw, message", [
    (b'{"prompt": "x", "max_tokens": "ten"}', "max_tokens: expected an integer or null, got a string"),
    (b'{"max_tokens": 0}', "max_tokens: expected an integer >= 1"),
    (b'{"max_tokens": 4.0}', "max_tokens: expected an integer or null, got a number"),
    (b'{"temperature": -1}', "temperature: expected a number >= 0"),
    (b'{"temperature": 101}', "temperature: expected a number <= 100"),
    (b'{"temperature": 1e400}', "temperature: number out of range"),
    (b'{"top_p": 0}', "top_p: expected a number > 0"),
    (b'{"seed": 99999999999999999999999}', "seed: expected an integer <= 9223372036854775807"),
    (b'{"ignore_eos": 1}', "ignore_eos: expected true or false, got an integer"),
    (b'{"stop": ["a", 3]}', "stop[1]: expected a string, got an integer"),
    (b'{"stop": [""]}', "stop[0]: expected a string of length >= 1"),
    (b'{"stop": ' + b'["a"]'[:-1] + b', "b"' * 16 + b']}', "stop: expected a list of length <= 16"),
    (b'{"messages": [{"role": "user"}]}', "messages[0].content: missing"),
    (b'{"messages": []}', "messages: expected a list of length >= 1"),
    (b'{"stream_options": "yes"}', "stream_options: expected an object or null, got a string"),
    (b'[1, 2]', "body: expected an object, got a list"),
    (b'"hello"', "body: expected an object, got a string"),
    (b'{not json', "body is not valid JSON"),
    (b'{"temperature": NaN}', "body is not valid JSON"),
    (b'[' * 100_000, "body"),
    (b'{"prompt": ' + b'[' * 100_000 + b'}', "body is not valid JSON"),
    (b'\xff\xfe', "body is not valid JSON"),
])
def test_a_bad_body_is_refused_in_one_line_naming_the_field(raw, message):
    with pytest.raises(BodyError) as e:
        decode_body(raw)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_good_body_decodes_and_unknown_fields_are_named_not_refused():
    body, unknown = decode_body(b'{"prompt": [1, 2], "max_tokens": 3, "temperature": 0, "stop": "x", "seed": -5, '
                                b'"stream": true, "stream_options": {"include_usage": true, "continuous": 1}, '
                                b'"best_of": 2, "logprobs": null, "ignored_extra": 1, "chat_template": "x"}')
    assert (body.prompt, body.max_tokens, body.temperature, body.stop, body.seed) == ([1, 2], 3, 0.0, "x", -5)
    assert body.stream and body.stream_options.include_usage
    assert unknown == ["chat_template", "ignored_extra"] and "ignored_extra" not in KNOWN
    assert (body.best_of, body.logprobs) == (2, None)      # declared: the server refuses best_of 2 (unsupported)
    empty, none = decode_body(b"{}")
    assert empty.max_tokens is None and empty.temperature is None and not empty.stream and none == []


def test_chat_content_given_as_text_parts_is_their_texts_joined_by_newlines():
    # what `vllm bench serve --backend openai-chat` sends; vLLM joins text parts with "\n"
    body, _ = decode_body(b'{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": '
                          b'[{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]}')
    assert unsupported(body) is None and bad_text(body) is None
    assert [m.text() for m in body.messages] == ["be brief", "one\ntwo"]
    empty, _ = decode_body(b'{"messages": [{"role": "user", "content": []}]}')
    assert empty.messages[0].text() == "" and unsupported(empty) is None


@pytest.mark.parametrize("content, message", [
    (b'[{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]',
     "messages[0].content[1].type: 'image_url' parts are not supported"),
    (b'[{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]',
     "messages[0].content[0].type: 'input_audio' parts are not supported"),
    (b'[{"type": "text"}]', "messages[0].content[0].text: missing"),
])
def test_a_part_that_is_not_text_is_refused_naming_its_type_and_place(content, message):
    body, _ = decode_body(b'{"messages": [{"role": "user", "content": ' + content + b'}]}')
    why = unsupported(body)
    assert why is not None and why.startswith(message) and "\n" not in why


@pytest.mark.parametrize("content, message", [
    (b'5', "messages[0].content: expected a string or a list, got an integer"),
    (b'[{"text": "x"}]', "messages[0].content[0].type: missing"),
    (b'[{"type": "text", "text": 5}]', "messages[0].content[0].text: expected a string or null, got an integer"),
    (b'["x"]', "messages[0].content[0]: expected an object, got a string"),
])
def test_a_badly_shaped_content_is_refused_in_one_line(content, message):
    with pytest.raises(BodyError) as e:
        decode_body(b'{"messages": [{"role": "user", "content": ' + content + b'}]}')
    assert str(e.value) == message


@pytest.mark.parametrize("raw, byte", [
    (b'{"prompt": "\xff"}', 12),
    (b'{"prompt": "caf\xc3", "max_tokens": 2}', 15),               # a sequence cut short
    (b'{"pr\xffompt": "x"}', 4),                                    # in a field's name
    (b'{"prompt": "\xed\xa0\x80"}', 12),                            # a surrogate's bytes: never UTF-8
    (b'{"messages": [{"role": "user", "content": "ok \xc0\xaf"}]}', 46),   # an overlong "/"
])
def test_a_body_that_is_not_utf8_is_refused_naming_its_first_bad_byte(raw, byte):
    with pytest.raises(BodyError) as e:
        decode_body(raw)
    assert str(e.value) == f"request body: not UTF-8 JSON (byte {byte})"
    with pytest.raises(UnicodeDecodeError) as u:
        raw.decode("utf-8")
    assert u.value.start == byte


def test_the_server_answers_a_body_that_is_not_utf8_with_400_not_500():
    """serve's App (the fleet's front end is the same): a 400 naming the byte, nothing submitted."""
    from starlette.testclient import TestClient

    from core.config import SamplingParams
    from gpu_runner.client import EngineClient
    from gpu_runner.messages import EngineInfo, TokenizerSpec
    from gpu_runner.server import App
    from gpu_runner.server_metrics import ServerMetrics

    class NoEngine(EngineClient):
        info = EngineInfo("tiny", 2048, 258, TokenizerSpec("byte"), [257], False, SamplingParams(), "continuous",
                          64, 16, None)

        def submit(self, s, kv=None, kv_out=False):
            raise AssertionError("a body that does not decode must not reach the engine")
        _send = start = stop = served = lambda self, *a, **k: None
        alive = lambda self: True
        failure = lambda self: None

    app = App(NoEngine(), "tiny", ServerMetrics("tiny"))
    with TestClient(app.app) as client:
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = client.post(path, content=b'{"prompt": "\xff\xfe", "messages": [{"role": "u", "content": "x"}]}',
                            headers={"content-type": "application/json"})
            msg = r.json()["error"]["message"]
            assert r.status_code == 400 and msg == "request body: not UTF-8 JSON (byte 12)", r.text
        r = client.post("/v1/completions", content=b"{not json")
        assert r.status_code == 400 and "body is not valid JSON" in r.json()["error"]["message"]
