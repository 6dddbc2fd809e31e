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
