"""Hostile input to the readers (issue 36, items 10, 13, 17, 18, 19, 24): each refusal is one line
naming the file and what was wrong (exit 2), never a traceback, a hang or unbounded memory; the
numbers a refusal states (a byte offset, a nesting depth, a token count) are computed here from
the bytes the test wrote."""
import base64
import gzip
import json

import pytest

from core.__main__ import main
from tests.helpers import minimal


def refused(capsys, path, *names, argv=()):
    rc = main(["metrics", str(path), *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in names:
        assert n in err, err
    return err


# ---- item 13: a byte that is not UTF-8 ------------------------------------------------------------

LATIN1 = {"request id": (b'"id": "A"', b'"id": "A\xe9"'),
          "meta value": (b'"source": "given"', b'"source": "given", "note": "caf\xe9"'),
          "meta key": (b'"source": "given"', b'"source": "given", "caf\xe9": 1'),
          "event req": (b'"type": "token", "req": "A"', b'"type": "token", "req": "A\xe9"'),
          "key after the events": (b'"reason": "length"}]', b'"reason": "length"}], "caf\xe9": 1')}


@pytest.mark.parametrize("where", sorted(LATIN1))
@pytest.mark.parametrize("gz", [False, True])
def test_a_latin1_byte_is_named_with_its_offset(tmp_path, capsys, where, gz):
    old, new = LATIN1[where]
    text = json.dumps(minimal()).encode()
    assert old in text
    data = text.replace(old, new, 1)
    offset = data.index(b"\xe9")                   # where the byte is, in the (inflated) text
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(data) if gz else data)
    refused(capsys, p, p.name, "not UTF-8", f"byte {offset})")


# ---- item 17: JSON nested past what the parsers read ---------------------------------------------

def test_json_nested_too_deep_names_the_file_and_the_depth(tmp_path, capsys):
    n = 100_000
    deep = "[" * n + "]" * n
    doc = json.dumps(minimal())
    cases = {"trace.json": (doc.replace('"source": "given"', f'"source": "given", "x": {deep}'), n + 2),
             "events.json": (doc.replace('"events": [', f'"events": [{deep}, '), n + 2),
             "lines.jsonl": ('{"a": 1}\n{"b": ' + deep + "}\n", n + 1)}
    for name, (text, depth) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        refused(capsys, p, name, f"nested too deeply ({depth:,} levels", "1,024")
    # a recorded OTLP/HTTP export whose JSON body nests 100,000 deep (what `observe --otlp-port` keeps)
    body = ('{"a":' * n + "1" + "}" * n).encode()
    p = tmp_path / "otlp_bodies.jsonl"
    p.write_text(json.dumps({"recv_ns": 1, "content_type": "application/json",
                             "body_b64": base64.b64encode(body).decode()}) + "\n")
    refused(capsys, p, "otlp_bodies.jsonl: line 1", f"nested too deeply ({n:,} levels")


# ---- item 24: messages that name the field -------------------------------------------------------

def test_a_token_id_past_int64_is_refused_before_the_prefix_cache_hashes_it(tmp_path, capsys):
    from core.errors import WorkloadError
    from core.workload import Request
    for bad, at in ((2**63, 3), (2**64 + 5, 3), (-1, 3), (1.5, 3)):
        with pytest.raises(WorkloadError, match=rf"request 'a': prompt_ids\[{at}\]: expected a token id"):
            Request("a", 0.0, 4, 1, prompt_ids=[1, 2, 3, bad])
    Request("a", 0.0, 2, 1, prompt_ids=[0, 2**63 - 1])                # the largest int64 is a token id
    w = {"requests": [{"id": r, "arrival_ms": k, "prompt_tokens": 4, "output_tokens": 2,
                       "prompt_ids": [1, 2, 3, 2**63]} for k, r in enumerate("ab")]}
    p = tmp_path / "w.json"
    p.write_text(json.dumps(w))
    rc = main(["simulate", str(p), "--prefix-caching", "--block-size", "2", "--out", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "w.json: requests[0].prompt_ids[3]" in err, err
    assert not (tmp_path / "o.json").exists()


def test_a_kv_batch_number_past_int64_is_named(tmp_path, capsys):
    import msgspec
    payload = msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [5]}], 0])
    line = {"recv_ns": 1, "frames": [base64.b64encode(x).decode() for x in
                                     (b"kv", (2**63).to_bytes(8, "big"), payload)]}
    p = tmp_path / "kv_events.jsonl"
    p.write_text(json.dumps(line) + "\n")
    refused(capsys, p, "kv_events.jsonl: line 1: seq", str(2**63))
    assert "unexpected shape" not in capsys.readouterr().err


def test_aiperf_scrapes_with_string_timestamps_and_duplicate_request_ids(tmp_path, capsys):
    from tests.conftest import DATA
    run = DATA / "imports" / "aiperf" / "aiperf_n24_c2_p128_o16"
    lines = [json.loads(x) for x in (run / "server_metrics_export.jsonl").read_text().splitlines()]
    for x in lines:
        x["timestamp_ns"] = str(x["timestamp_ns"])
    p = tmp_path / "server_metrics_export.jsonl"
    p.write_text("\n".join(map(json.dumps, lines)) + "\n")
    err = refused(capsys, p, "server_metrics_export.jsonl: line 1: timestamp_ns", repr(lines[0]["timestamp_ns"]))
    assert "min()" not in err and "unexpected shape" not in err
    recs = [json.loads(x) for x in (run / "profile_export.jsonl").read_text().splitlines()]
    recs[3]["metadata"]["x_request_id"] = rid = recs[0]["metadata"]["x_request_id"]
    p = tmp_path / "profile_export.jsonl"
    p.write_text("\n".join(map(json.dumps, recs)) + "\n")
    err = refused(capsys, p, "profile_export.jsonl: metadata.x_request_id", rid, "record 1 and record 4")
    assert "unexpected shape" not in err
