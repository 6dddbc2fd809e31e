"""The streaming JSON decoder (jsonstream.decode_fast, the fast path of core.trace.open) against an
independent reading of the same bytes: a JSON parser that is not msgspec (orjson, the standard
library for errors) and the precise path (validate.py), which share no structs with the fast
decoders: the same traces (tables, dtypes, order, meta, verbatim events), the same refusals and
error messages, whatever the chunk size and wherever its boundaries fall; gzip stays capped;
memory stays a slice at a time."""
import gzip
import json
import random
import zlib

import pandas as pd
import pytest

from core import errors
from core.config import SchedulerConfig
from core.errors import TraceError
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import jsonscan, jsonstream, parse_trace, to_doc, trace_from_doc, trace_json
from core.trace.jsoncodec import gunzip, parse_json_bytes
from core.trace.jsonstream import decode_fast
from core.workload import Request, Workload
from tests.conftest import DATA
from tests.helpers import minimal, sim_trace


def REFERENCE(data: bytes, name: str):
    """The independent reading: parse_json_bytes (orjson / the standard library) + validate.py."""
    return trace_from_doc(parse_json_bytes(gunzip(data, name), name), name)


TABLES = ("requests", "tokens", "finishes", "steps", "batch", "kv", "preempts")
TRACES = sorted((DATA / "traces").glob("*.json*"))


def assert_identical(a, b):
    for t in TABLES:
        x, y = getattr(a, t), getattr(b, t)
        pd.testing.assert_frame_equal(x, y, check_exact=True)
        assert list(x.dtypes) == list(y.dtypes) and list(x.columns) == list(y.columns), t
    for k in ("meta", "other", "request_extra", "extra"):   # json.dumps: types and key order too
        assert json.dumps(getattr(a, k)) == json.dumps(getattr(b, k)), k


def old_flow(raw: bytes, name: str):
    """The reference flow: inflate, parse, the precise path (every problem worded there)."""
    return REFERENCE(raw, name)


def new_flow(raw: bytes, name: str, chunk: int = jsonstream.STREAM_CHUNK):
    """open.py with the streaming decoder given the file's bytes (gzip or not)."""
    tr = decode_fast(raw, name, chunk)
    return tr if tr is not None else trace_from_doc(parse_json_bytes(raw, name), name)


def outcome(flow, *args):
    try:
        return flow(*args)
    except TraceError as e:
        return str(e)


def assert_same(raw: bytes, name: str = "t.json", chunks=(1, 7, 64, 4096, jsonstream.STREAM_CHUNK)):
    want = outcome(old_flow, raw, name)
    for chunk in chunks:
        got = outcome(new_flow, raw, name, chunk)
        if isinstance(want, str):
            assert got == want, chunk
        else:
            assert not isinstance(got, str), (chunk, got)
            assert_identical(got, want)
    return want


@pytest.fixture
def streamed_only(monkeypatch):
    """Fail if decode_fast falls back to the whole-document decoder."""
    def whole(*a):
        raise AssertionError("fell back to the whole-document decoder")
    monkeypatch.setattr(jsonstream, "decode_whole", whole)


def random_trace(seed: int, n_max: int = 40, **cfg):
    rng = random.Random(seed)
    reqs = []
    t = 0.0
    for i in range(rng.randint(min(5, n_max), n_max)):
        t += rng.expovariate(1 / 20)
        n = rng.randint(1, 300 if n_max > 5 else 40)
        ids = tuple(rng.randrange(50) for _ in range(n)) if cfg.get("prefix_caching") else None
        reqs.append(Request(id=f"r{i}", arrival_ms=round(t, 3), prompt_tokens=n, prompt_ids=ids,
                            max_output_tokens=rng.randint(1, 60)))
    budget = rng.choice([None, 256, 1024])
    config = {"max_seqs": rng.randint(1, 16), "token_budget": budget,
              "chunk": rng.choice([64, 200] if budget else [None, 64, 200]), **cfg}
    return simulate(Workload(reqs, name=f"random{seed}"), SchedulerConfig(**config),
                    StepModel("affine", base_ms=rng.uniform(1, 5), prefill_ms_per_token=0.02,
                              decode_ms_per_seq=0.1))


def with_everything(tr):
    """A trace with verbatim spec, tiles and unknown events, request extras and top-level extras,
    and strings that look like the structure: quotes, backslashes, brackets, `},{"t_ms":`."""
    tricky = 'a"b\\"},{"t_ms":0,"type":"token"}],"events":[\\\\' + "\u00e9\u4e2d\U0001F600" + '{[\\'
    ids = tr.ids
    tr.other += [
        {"t_ms": 0.5, "type": "spec", "req": ids[0], "step": 1, "proposed": [1, 2, 3],
         "positions": [{"p": 0.5, "q": 0.25, "u": 0.1, "accepted": True}], "accepted": 1, "bonus": False},
        {"t_ms": 1.0, "type": "tiles", "req": ids[-1], "step": 0, "layer": 0, "head": 1, "q_tile": 0,
         "kv_tile": 2, "q_start": 0, "kv_start": 32, "m": [0.5, -1.25], "l": [1.0, 2.5]},
        {"t_ms": 2.0, "type": "my_probe", "note": tricky, "nested": {"x": [tricky, {"}": "{"}]}},
        {"t_ms": 3.0, "type": tricky, "k": "\\"},
    ]
    tr.request_extra = [dict(x, label=tricky) for x in tr.request_extra] or [{"label": tricky}] * len(ids)
    tr.extra["zz_after_events"] = {"s": tricky, "list": [1, {"a": tricky}]}
    tr.meta = dict(tr.meta, notes=tricky, stats={"events": [1, 2]})  # an "events" key, not top-level
    tr.finishes["reason"] = [tricky if i % 2 else "length" for i in range(len(tr.finishes))]
    return tr


# ---- the same traces -------------------------------------------------------------------------

@pytest.mark.parametrize("seed,cfg", [(0, {}), (1, {"kv_blocks": 40}), (2, {"prefix_caching": True, "kv_blocks": 60}),
                                      (3, {"policy": "static"}), (4, {"policy": "serial"})])
def test_simulated_traces_stream_identically(seed, cfg, streamed_only):
    tr = random_trace(seed, **cfg)
    for raw in (trace_json(tr).encode(), trace_json(tr, pretty=True).encode(),
                gzip.compress(trace_json(tr).encode())):
        want = REFERENCE(raw, "t")
        assert want is not None
        for chunk in (13, 500, 1 << 16, jsonstream.STREAM_CHUNK):
            assert_identical(decode_fast(raw, "t", chunk), want)


def test_rich_simulated_trace_streams_identically(streamed_only):
    tr = sim_trace(kv_blocks=70)                           # steps, batch, kv with hashes, preemptions
    assert len(tr.preempts) and tr.kv["hash"].notna().any()
    raw = trace_json(tr).encode()
    want = REFERENCE(raw, "t")
    for chunk in (29, 100, 1000, 1 << 20):
        assert_identical(decode_fast(raw, "t", chunk), want)


@pytest.mark.slow   # seconds: out of the fast loop
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_bundled_traces_stream_identically(path, streamed_only):
    raw = path.read_bytes()
    want = REFERENCE(raw, path.name)
    assert want is not None
    for chunk in (1, 97, 4096, jsonstream.STREAM_CHUNK) if len(raw) < 10_000 else (97, 4096, jsonstream.STREAM_CHUNK):
        assert_identical(decode_fast(raw, path.name, chunk), want)
        assert_identical(decode_fast(gunzip(raw, path.name), path.name, chunk), want)  # inflated by the caller
    assert_identical(parse_trace(raw, path.name), want)


@pytest.mark.slow   # seconds: out of the fast loop
def test_verbatim_events_and_tricky_strings_at_every_boundary(streamed_only):
    tr = with_everything(random_trace(5, n_max=4, kv_blocks=50))
    raw = trace_json(tr).encode()
    want = REFERENCE(raw, "t")
    assert want is not None and {"spec", "tiles", "my_probe"} <= want.event_types()
    for chunk in [*range(1, 41), 61, 127, 128, 1000, 4093]:
        got = decode_fast(raw, "t", chunk)
        assert_identical(got, want)
    assert_identical(want, trace_from_doc(json.loads(raw), "t"))     # and the precise path agrees
    pretty = trace_json(tr, pretty=True).encode()
    for chunk in (1, 9, 333):
        assert_identical(decode_fast(pretty, "t", chunk), want)


def test_tiny_documents(streamed_only):
    for doc in (minimal(), dict(minimal(), events=[]), dict(minimal(), events=[], requests=[])):
        raw = json.dumps(doc).encode()
        assert_same(raw)
        assert decode_fast(raw, "t", 1) is not None
    assert_same(b'\n\n  {"schema":"serving-trace/1","meta":{"source":"given"},"requests":[],\n "events" :\n[ ] }\n ')


# ---- other layouts: the whole-document decoder takes them, with the same result ----------------------

def _layouts():
    doc = minimal()
    doc["zz"] = {"events": [1]}
    keys = list(doc)
    out = {}
    for order in (["events", "schema", "meta", "requests", "zz"], ["schema", "meta", "events", "requests", "zz"],
                  ["zz", "requests", "meta", "schema", "events"]):
        assert sorted(order) == sorted(keys)
        out[",".join(order)] = json.dumps({k: doc[k] for k in order}).encode()
    text = json.dumps(doc)
    out["events-key-escaped"] = text.replace('"events"', '"ev\\u0065nts"', 1).encode()
    out["events-twice"] = (text[:-1] + ', "events": []}').encode()
    out["schema-twice-after-events"] = (text[:-1] + ', "schema": "serving-trace/2"}').encode()
    out["meta-after-events"] = (text[:-1] + ', "meta": {"source": "simulated"}}').encode()
    out["events-in-meta-string"] = text.replace('"given"', '"given", "label": "\\"events\\":[1,2]"').encode()
    out["events-key-in-meta"] = text.replace('"given"', '"given", "x": {"events": [1, {"a": 2}]}').encode()
    out["whitespace"] = json.dumps(doc, indent=3).encode()
    out["not-a-trace"] = json.dumps({"ttfts": [1], "events": 3}).encode()
    out["no-events"] = json.dumps({k: v for k, v in doc.items() if k != "events"}).encode()
    return out


@pytest.mark.parametrize("name,raw", list(_layouts().items()), ids=list(_layouts()))
def test_other_layouts_decode_as_before(name, raw):
    assert_same(raw, chunks=(1, 5, 4096))
    assert_same(gzip.compress(raw), "t.json.gz", chunks=(3, 4096))


# ---- malformed input: the same refusal, the same message -------------------------------------------

BAD = {
    "trailing-comma": lambda t: t.replace("}]}", "},]}"),
    "leading-comma": lambda t: t.replace('"events":[{', '"events":[,{'),
    "double-comma": lambda t: t.replace('},{"t_ms":20', '},,{"t_ms":20'),
    "comma-in-header": lambda t: t.replace('{"schema"', '{ ,"schema"'),
    "no-comma": lambda t: t.replace('},{"t_ms":20', '}{"t_ms":20'),
    "not-objects": lambda t: t.replace('"events":[{', '"events":[1,{'),
    "unknown-req": lambda t: t.replace('"req":"A","index":1', '"req":"B","index":1'),
    "bad-enum": lambda t: t.replace('"index":0', '"index":0,"source":"guessed"'),
    "int-beyond-int64": lambda t: t.replace('"index":1', '"index":99999999999999999999'),
    "float-index": lambda t: t.replace('"index":1', '"index":1.0'),
    "nan": lambda t: t.replace('"t_ms":20', '"t_ms":NaN'),
    "negative-time": lambda t: t.replace('"t_ms":20', '"t_ms":-1'),
    "gap": lambda t: t.replace('"index":1', '"index":2'),
    "unknown-type-bad-time": lambda t: t.replace("]}", ',{"t_ms":"x","type":"zz"}]}'),
    "type-not-str": lambda t: t.replace("]}", ',{"t_ms":1,"type":5}]}'),
    "unterminated-string": lambda t: t.replace('"reason":"length"', '"reason":"length}]}'),
    "garbage-after": lambda t: t + "x",
    "bad-schema": lambda t: t.replace("serving-trace/1", "serving-trace/9"),
    "bad-meta": lambda t: t.replace('"given"', '"invented"'),
    "events-not-list": lambda t: t.replace('"events":[', '"events":{"a":[').replace("]}", "]}}"),
    "deep": lambda t: t.replace('"reason":"length"', '"reason":' + "[" * 5000 + "]" * 5000),
    "bad-utf8": lambda t: t.replace("length", "len\xffgth"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_malformed_input_same_message(name):
    text = BAD[name](json.dumps(minimal(), separators=(",", ":")))
    raw = text.encode("utf-8", "surrogateescape") if name != "bad-utf8" else text.encode("latin-1")
    want = assert_same(raw, chunks=(1, 2, 7, 4096))
    if name == "float-index":  # refused by the fast decoders, read by the precise path
        assert not isinstance(want, str) and decode_fast(raw, "t.json") is None
    else:
        assert isinstance(want, str) and want.startswith("t.json: "), want
    assert_same(gzip.compress(raw), "t.json.gz", chunks=(3, 4096))


@pytest.mark.slow   # seconds: out of the fast loop
def test_truncated_and_mutated_documents_same_outcome():
    text = trace_json(with_everything(random_trace(7, n_max=3))).encode()
    rng = random.Random(0)
    for k in sorted(rng.sample(range(len(text)), 40)):
        assert_same(text[:k], chunks=(11, 512))
    for _ in range(100):
        b = bytearray(text)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.choice(b'{}[],:"\\ 0e-x\n')
        assert_same(bytes(b), chunks=(7, 300))


# ---- gzip: capped, errors as errors.gunzip words them ------------------------------------------

def test_gzip_bomb_refused_with_the_same_message(monkeypatch):
    monkeypatch.setattr(errors, "MAX_DECOMPRESSED_BYTES", 100_000)
    for text in (b" " * 300_000, json.dumps(minimal()).encode()[:-2] + b" " * 300_000 + b"]}"):
        bomb = gzip.compress(text)
        with pytest.raises(TraceError) as want:
            gunzip(bomb, "b.json.gz")
        for chunk in (1000, 1 << 16, jsonstream.STREAM_CHUNK):
            with pytest.raises(TraceError) as got:
                decode_fast(bomb, "b.json.gz", chunk)
            assert str(got.value) == str(want.value)
    ok = gzip.compress(json.dumps(minimal()).encode())
    assert decode_fast(ok, "ok.json.gz", 100) is not None


def _held(monkeypatch) -> list:
    """The longest the reader's buffer got, recorded as pieces arrive."""
    most = [0]
    more = jsonstream._Reader.more

    def spy(self):
        got = more(self)
        most[0] = max(most[0], len(self.buf))
        return got
    monkeypatch.setattr(jsonstream._Reader, "more", spy)
    return most


@pytest.mark.parametrize("where", ["header", "between events", "inside an event", "after the events",
                                   "after the document"])
def test_white_space_padding_is_squeezed_out_not_held(monkeypatch, streamed_only, where):
    """Issue 36, item 14: what the reader holds is bounded by what the document keeps, not by what it
    inflates to: a megabyte of white space anywhere (gzip: a kilobyte) is squeezed out as it is read
    (jsonscan.squeeze), and the trace is the one the reference reads from the whole text."""
    tr = random_trace(5)
    text = trace_json(tr)
    pad = " \n\t\r" * (1 << 18)                       # 1 MiB
    at = {"header": text.index('"requests"'), "between events": text.index('{"t_ms"', text.index('"events"') + 40),
          "inside an event": text.index('"type"', text.index('"events"') + 40),
          "after the events": text.rindex("]"), "after the document": len(text)}[where]
    raw = (text[:at] + pad + text[at:]).encode()
    want = REFERENCE(raw, "t")
    for data in (raw, gzip.compress(raw)):
        held = _held(monkeypatch)
        assert_identical(decode_fast(data, "t.json.gz", 4096), want)
        assert held[0] < 64 * 1024, (where, held[0])     # the padding alone is 1,048,576 bytes


def test_inflating_past_the_limit_is_refused_holding_a_bounded_buffer(monkeypatch):
    """A small gzip file inflating past the limit inside one long string (no event boundary, no white
    space to squeeze) is refused once the reader holds HELD_BEFORE_COUNTING bytes: the whole input is
    counted first, keeping nothing, instead of being held up to the limit."""
    monkeypatch.setattr(errors, "MAX_DECOMPRESSED_BYTES", 4_000_000)
    monkeypatch.setattr(jsonstream, "HELD_BEFORE_COUNTING", 200_000, raising=False)
    doc = json.dumps(minimal())
    for at in (doc.index('"source"'), doc.index('"t_ms"')):      # in the header, in an event
        bomb = gzip.compress((doc[:at] + '"x": "' + "A" * 5_000_000 + '", ' + doc[at:]).encode())
        held = _held(monkeypatch)
        with pytest.raises(TraceError, match="inflates to more than"):
            decode_fast(bomb, "b.json.gz", 65536)
        assert held[0] < 200_000 + 2 * 65536, held[0]


def test_gzip_problems_are_left_to_gunzip():
    raw = json.dumps(minimal()).encode()
    z = gzip.compress(raw)
    twice = gzip.compress(z)
    assert decode_fast(twice, "t.json.gz") is None
    assert outcome(new_flow, twice, "t.json.gz") == outcome(old_flow, twice, "t.json.gz")
    assert "gzip data inside gzip" in outcome(new_flow, twice, "t.json.gz")
    for broken in (z[:-6], z[:len(z) // 2], z[:-4] + b"\0\0\0\0", z + b"junk"):
        assert decode_fast(broken, "t.json.gz", 16) is None
        msg = outcome(new_flow, broken, "t.json.gz")
        assert msg == outcome(old_flow, broken, "t.json.gz") and "broken gzip data" in msg
    # several members, zero padding: read as GzipFile reads them
    half = len(raw) // 2
    for ok in (gzip.compress(raw[:half]) + gzip.compress(raw[half:]), z + b"\0" * 10,
               zlib.compress(raw, wbits=31)):
        assert_same(ok, "t.json.gz", chunks=(1, 10, 4096))
        assert decode_fast(ok, "t.json.gz", 10) is not None


# ---- the scanner that proves a cut -----------------------------------------------------------

def _commas_reference(s: bytes) -> tuple[int, bool]:
    last, depth, in_str, esc = -1, 0, False, False
    for i, c in enumerate(s):
        if in_str:
            if esc:
                esc = False
            elif c == 92:
                esc = True
            elif c == 34:
                in_str = False
        elif c == 34:
            in_str = True
        elif c in b"[{":
            depth += 1
        elif c in b"]}":
            depth -= 1
            if depth < 0:
                return last, True
        elif c == 44 and depth == 0:
            last = i
    return last, False


def _scan_reference(s: bytes) -> tuple[int, bytes]:
    """(the deepest nesting, the text with each white space run outside strings cut to its first byte),
    byte by byte."""
    depth, deepest, in_str, esc, out, prev_ws = 0, 0, False, False, bytearray(), False
    for c in s:
        ws = False
        if in_str:
            if esc:
                esc = False
            elif c == 92:
                esc = True
            elif c == 34:
                in_str = False
        elif c == 34:
            in_str = True
        elif c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in b"]}":
            depth -= 1
        elif c in b" \t\r\n":
            ws = True
        if not (ws and prev_ws):
            out.append(c)
        prev_ws = ws
    return deepest, bytes(out)


def test_top_level_commas_matches_a_reference_parser():
    rng = random.Random(1)
    inside = ["a", "\\\\", '\\"', "},{", "]", "[", ",", "\\u0022", "\u00e9"]  # string contents, escaped
    outside = list("{}[],: a")

    def token():
        if rng.random() < 0.3:
            return '"' + "".join(rng.choice(inside) for _ in range(rng.randint(0, 6))) + '"'
        return rng.choice(outside)
    for _ in range(3000):
        s = "".join(token() for _ in range(rng.randint(0, 25))).encode()
        s = s[:rng.randint(0, len(s))]  # it may end inside a string, after a backslash
        for block in (1, 2, 3, 7, 1 << 20):
            assert jsonscan.top_level_commas(s, block) == _commas_reference(s), (s, block)
    items = [json.dumps(x, separators=(",", ":")).encode() for x in
             ({"a": 'x\\"},{'}, ["\\\\", "]"], {"b": {"c": '\\\\\\"}'}}, "\\", 5)]
    s = b",".join(items) + b"]"
    assert jsonscan.top_level_commas(s, 4) == (len(s) - len(items[-1]) - 2, True)


def test_nesting_depth_and_squeezed_white_space_match_a_reference_parser(monkeypatch):
    """jsonscan's depth (for messages about nesting) and white space squeezing (padding is not held)
    against a byte-by-byte reference, in blocks of any size (state carried across them)."""
    rng = random.Random(2)
    inside = ["a", "\\\\", '\\"', "},{", "]", "[", ",", "  ", "\t\n", "\\u0022", "\u00e9"]  # (raw tabs: not
    outside = list("{}[],: a") + ["   ", "\n\t \r", " "]                                   # JSON, scanned alike)

    def token():
        if rng.random() < 0.3:
            return '"' + "".join(rng.choice(inside) for _ in range(rng.randint(0, 6))) + '"'
        return rng.choice(outside)
    blocks = jsonscan._blocks
    for _ in range(1500):
        s = "".join(token() for _ in range(rng.randint(0, 25))).encode()
        s = s[:rng.randint(0, len(s))]
        want = _scan_reference(s)
        for block in (1, 2, 3, 7, 1 << 20):
            monkeypatch.setattr(jsonscan, "_blocks", lambda buf, b=block: blocks(buf, b))
            assert (jsonscan.json_depth(s), bytes(jsonscan.squeeze(s))) == want, (s, block)
    doc = {"a": [1, "x  y", {"b": ["  ", None]}], "c": "\\"}
    text = json.dumps(doc, indent=7).replace("\n", "\n \t \n   ").encode()
    assert json.loads(jsonscan.squeeze(text)) == doc and len(jsonscan.squeeze(text)) < len(text) / 2


# ---- memory: a slice at a time -------------------------------------------------------------------

def test_events_decoded_a_slice_at_a_time(monkeypatch, streamed_only):
    tr = random_trace(8, kv_blocks=60)
    raw = trace_json(tr).encode()
    assert len(raw) > 100_000
    want = REFERENCE(raw, "t")
    sizes = []
    events = jsonstream.decode_events

    def spy(r):
        sizes.append(len(r))
        return events(r)
    monkeypatch.setattr(jsonstream, "decode_events", spy)
    biggest = max(len(json.dumps(e, separators=(",", ":"))) for e in to_doc(tr)["events"])
    for chunk in (4096, 20_000):
        sizes.clear()
        got = decode_fast(gzip.compress(raw), "t.json.gz", chunk)
        assert_identical(got, want)
        assert len(sizes) > len(raw) // (2 * chunk) + 1
        assert max(sizes) <= 2 * chunk + biggest + 64
