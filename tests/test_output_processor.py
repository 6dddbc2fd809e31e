"""The engine's output processor: text is detokenised and cut at stop strings on the engine side;
a request's last text and its finish come in one RequestOutput; every request ends with exactly
one finishing output or one Failed. Checked with the byte tokenizer against the texts worked
out by hand."""
import numpy as np

from core.config import SamplingParams
from core.engine.outputs import EngineOutputs, Finish
from gpu_runner.messages import (
    AddRequest,
    Failed,
    Outputs,
    RequestOutput,
    StepStats,
    decode_from_engine,
    decode_to_engine,
    encode,
)
from gpu_runner.output_processor import Detokenizer, OutputProcessor
from gpu_runner.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def out(t, tokens=(), finished=()):
    """EngineOutputs with these (row, id) tokens and finishes."""
    reqs = np.array([r for r, _ in tokens], dtype=np.int64)
    ids = np.array([i for _, i in tokens], dtype=np.int64)
    return EngineOutputs(t, (), token_reqs=reqs, token_index=np.zeros(len(reqs), dtype=np.int64),
                         token_ids=ids, finished=list(finished))


def add(proc, row, rid, stop=()):
    proc.add(row, AddRequest(rid, [1, 2], 50, SamplingParams(), None, list(stop), 0.0))


def test_text_is_held_back_while_it_could_grow_into_a_stop_string():
    d = Detokenizer(TOK.decode, ["END"])
    said = [d.add(TOK.encode(ch)) for ch in "abcEN"]
    assert "".join(t for t, _ in said) == "abc"          # the last 2 characters held ("EN" may become "END")
    assert d.add(TOK.encode("x")) == ("E", False)
    assert d.add(TOK.encode("yE")) == ("Nx", False)
    assert d.add(TOK.encode("ND!")) == ("y", True)      # cut before the match; what follows it is never sent
    assert d.sent == "abcENxy"


def test_an_incomplete_utf8_character_waits_for_its_other_bytes():
    d = Detokenizer(TOK.decode, [])
    e_acute = "é".encode()                                # two bytes
    assert d.add([e_acute[0]]) == ("", False)
    assert d.add([e_acute[1], ord("!")]) == ("é!", False)


def test_stop_string_ends_the_request_in_the_engine_and_the_last_text_carries_the_finish():
    proc = OutputProcessor(TOK.decode)
    add(proc, 0, "a", stop=["\n\n"])
    add(proc, 1, "b")
    ev, stopped = proc.process(out(1.0, [(0, ord("h")), (0, ord("\n")), (1, ord("x"))]))
    assert [(e.rid, e.text, e.finish_reason) for e in ev] == [("a", "h", None), ("b", "x", None)]
    assert stopped == []
    # a's stop string completes; b reaches its length in the same step: both finish with their last text
    ev, stopped = proc.process(out(2.0, [(0, ord("\n")), (0, ord("z")), (1, ord("y"))],
                                   [Finish(1, 2.0, "length")]))
    assert [(e.rid, e.text, e.finish_reason) for e in ev] == [("a", "", "stop"), ("b", "y", "length")]
    assert stopped == [0]                                   # the engine is told to end it ("stop")
    assert ev[0].token_ids == [ord("\n"), ord("z")]       # every id the step emitted
    # the engine's own finish for a (the abort it was asked for) tells the client nothing more
    ev, stopped = proc.process(out(3.0, finished=[Finish(0, 2.0, "stop")]))
    assert ev == [] and stopped == [] and proc.reqs == {}


def test_rejections_and_failures_are_answered_with_their_status():
    proc = OutputProcessor(TOK.decode)
    for row, rid in enumerate("abcd"):
        add(proc, row, rid)
    ev, _ = proc.process(out(1.0, finished=[
        Finish(0, 1.0, "rejected", "prompt + output = 116 tokens, over max_model_len 64", "max_model_len"),
        Finish(1, 1.0, "rejected", "3 requests waiting, over the queue limit of 2", "queue_limit"),
        Finish(2, 1.0, "error", "logits are not finite"),
        Finish(3, 1.0, "abort")]))
    assert ev == [Failed("a", "rejected: prompt + output = 116 tokens, over max_model_len 64", 400),
                  Failed("b", "rejected: 3 requests waiting, over the queue limit of 2", 503),
                  Failed("c", "the engine failed on this request: logits are not finite", 500),
                  RequestOutput("d", [], "", 1.0, "abort")]


def test_messages_round_trip_through_msgpack_and_refuse_what_does_not_fit():
    import msgspec
    import pytest
    m = Outputs([RequestOutput("a", [1, 2], "hi", 3.5, "length")], StepStats(1, 0, 0.25, 0, 16))
    assert decode_from_engine(encode(m)) == m
    a = AddRequest("r", [5, 6], 4, SamplingParams(temperature=0.5, seed=3), [9], ["x"], 12.0)
    assert decode_to_engine(encode(a)) == a
    with pytest.raises(msgspec.ValidationError):
        decode_to_engine(encode(("add", "r", [5, 6], 4)))      # a positional tuple is not a message
