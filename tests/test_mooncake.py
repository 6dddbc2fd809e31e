"""Mooncake-format traces (core/workload/mooncake.py): prompt ids that the prefix cache reuses
exactly where hash_ids agree (hits counted by hand, then by the simulator), the bundled slice
against the numbers data/mooncake/SOURCE.md states (counted here from the raw lines), and hostile
lines refused in one line naming the file, line and field."""
import gzip
import json

import pytest

from core.__main__ import main
from core.config import SchedulerConfig
from core.errors import WorkloadError
from core.sim.simulate import simulate
from core.workload import from_mooncake_jsonl, load_workload, mooncake, parse_workload
from tests.conftest import DATA

SLICE = DATA / "workloads" / "mooncake_conversation_500.jsonl"


def line(t, n_in, n_out, hash_ids, **extra):
    return json.dumps({"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": hash_ids, **extra})


def jsonl(*lines):
    return "\n".join(lines) + "\n"


def hits_per_request(tr):
    kv = tr.kv[tr.kv["op"] == "hit"]
    return {tr.requests["id"][i]: int((kv["req"] == i).sum()) for i in range(len(tr.requests))}


def first_prefill(tr, i):
    return int(tr.batch[tr.batch["req"] == i].iloc[0]["tokens"])


# ---- prompt ids from hash ids -------------------------------------------------------------------

def test_prompt_ids_follow_hash_ids_block_by_block():
    # 1,300 tokens = blocks of 512, 512 and 276; block k holds hash_ids[k] * 512 + j
    w = parse_workload(jsonl(line(7, 1300, 20, [3, 9, 4])), "t.jsonl")
    (r,) = w.requests
    assert (r.id, r.arrival_ms, r.prompt_tokens, r.max_output_tokens) == ("mc-1", 7.0, 1300, 20)
    ids = r.prompt_ids
    assert ids[:512] == tuple(range(3 * 512, 4 * 512))
    assert ids[512:1024] == tuple(range(9 * 512, 10 * 512))
    assert ids[1024:] == tuple(range(4 * 512, 4 * 512 + 276))
    assert w.name == "t.jsonl"


def test_block_tokens_scales_lengths_and_keeps_the_blocks():
    # block_tokens 4: 1,300 -> ceil(1300 * 4 / 512) = ceil(10.16) = 11 tokens = 4 + 4 + 3; output 20 -> 1
    w = parse_workload(jsonl(line(0, 1300, 20, [3, 9, 4]), line(5, 1, 600, [8])), "t.jsonl", block_tokens=4)
    a, b = w.requests
    assert a.prompt_ids == (12, 13, 14, 15, 36, 37, 38, 39, 16, 17, 18)
    assert (a.prompt_tokens, a.max_output_tokens) == (11, 1)
    assert (b.prompt_ids, b.max_output_tokens) == ((32,), 5)     # 1 token -> at least 1; 600 * 4 / 512 = 4.7 -> 5
    assert w.name == "t.jsonl (block_tokens=4: lengths x4/512)"


# ---- the prefix cache reuses exactly the shared leading hash blocks ------------------------------

def test_prefix_cache_hits_where_leading_hash_ids_agree():
    # block_tokens 4, simulator blocks of 2 tokens: a hash block is 2 KV blocks. Far-apart arrivals,
    # so each request finds the earlier ones cached.
    w = parse_workload(jsonl(
        line(0, 1300, 2, [1, 2, 3]),          # A: 11 tokens, hash blocks 4 + 4 + 3
        line(10_000, 1200, 2, [1, 2, 4]),     # B: 10 tokens; shares 2 leading hash blocks = 8 tokens
        line(20_000, 1300, 2, [5, 2, 3]),     # C: first block differs: the same later ids share nothing
        line(30_000, 1300, 2, [1, 2, 3]),     # D: A's prompt again
    ), "t.jsonl", block_tokens=4)
    tr = simulate(w, SchedulerConfig("continuous", block_size=2, prefix_caching=True))
    # B: 8 shared tokens = 4 KV blocks hit, 2 computed. D: A cached 5 full KV blocks (10 of 11
    # tokens); at least one prompt token is always computed, and 10 <= 11 - 1: 5 hits, 1 computed.
    assert hits_per_request(tr) == {"mc-1": 0, "mc-2": 4, "mc-3": 0, "mc-4": 5}
    assert [first_prefill(tr, i) for i in range(4)] == [11, 2, 11, 1]


def test_prefix_cache_hits_at_the_traces_own_block_size():
    # block_tokens 512 (no scaling), KV blocks of 16: one shared hash block = 32 KV blocks
    w = parse_workload(jsonl(line(0, 1024, 1, [7, 8]), line(1000, 1000, 1, [7, 9])), "t.jsonl")
    tr = simulate(w, SchedulerConfig("continuous", block_size=16, prefix_caching=True))
    assert hits_per_request(tr) == {"mc-1": 0, "mc-2": 32}
    assert first_prefill(tr, 1) == 1000 - 512


# ---- the bundled slice --------------------------------------------------------------------------

def raw_lines():
    return [json.loads(s) for s in SLICE.read_text().splitlines()]


def test_slice_loads_with_the_numbers_its_source_states():
    source = (DATA / "mooncake" / "SOURCE.md").read_text()
    for text in ("| requests | 500 |", "| time span | 165000 ms", "| mean input length | 14249.71 tokens",
                 "| mean output length | 361.884 tokens", "| prompt blocks | 14162 |",
                 "| blocks whose hash id appeared in an earlier request | 2283 (0.1612"):
        assert text in source
    w = load_workload(SLICE)
    assert len(w) == 500 and w.name == SLICE.name
    assert float(w.arrival_ms[-1] - w.arrival_ms[0]) == 165000
    assert int(w.prompt_tokens.sum()) == 7124855 and float(w.prompt_tokens.mean()) == pytest.approx(14249.71)
    assert int(w.max_output_tokens.sum()) == 180942
    # reuse counted on the reader's token ids: a 512-token block whose exact tokens an earlier
    # request's prompt held
    seen, blocks, reused = set(), 0, 0
    for r in w.requests:
        mine = {r.prompt_ids[k:k + 512] for k in range(0, r.prompt_tokens, 512)}
        blocks += len(mine)
        reused += len(mine & seen)
        seen |= mine
    assert (blocks, reused) == (14162, 2283)


def test_slice_prefix_hits_match_the_full_shared_blocks_counted_from_the_lines():
    # block_tokens 16 = the KV block: each hash block is one KV block. Serial runs one request at a
    # time and the default pool holds every request at once, so nothing is evicted: every full
    # hash block shared with an earlier request hits, but a prompt's last token is always computed.
    expected, seen = 0, set()
    for d in raw_lines():
        n_tokens = mooncake.scaled(d["input_length"], 16)
        leading = 0
        for k, h in enumerate(d["hash_ids"]):
            if h not in seen or min(16, n_tokens - 16 * k) < 16:
                break
            leading += 1
        expected += min(leading, (n_tokens - 1) // 16)
        seen.update(d["hash_ids"])
    w = load_workload(SLICE, block_tokens=16)
    assert len(w) == 500 and int(w.prompt_tokens.sum()) == sum(mooncake.scaled(d["input_length"], 16)
                                                              for d in raw_lines())
    tr = simulate(w, SchedulerConfig("serial", block_size=16, prefix_caching=True))
    assert int((tr.kv["op"] == "hit").sum()) == expected > 2000


# ---- conventions ----------------------------------------------------------------------------------

def test_ids_output_length_zero_and_recognition():
    text = jsonl(line(0, 10, 0, [1], id="x"), line(1, 10, 3, [1], request_id=42), "", line(2, 10, 0, [2]))
    for name in ("t.jsonl", "t.json", "t", "t.jsonl.gz"):
        w = parse_workload(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode(), name)
        assert [(r.id, r.max_output_tokens) for r in w.requests] == [("x", 1), ("42", 3), ("mc-4", 1)]
        assert w.name == f"{name} (output_length 0 read as 1 in 2 requests)"
    one = parse_workload(line(0, 10, 4, [1]), "one.json")          # a one-line file, no newline
    assert one.requests[0].prompt_tokens == 10
    # LLMServingSim JSONL is still read as before
    old = parse_workload(b'{"input_toks": 5, "output_toks": 2, "arrival_time_ns": 3000000}\n', "t.jsonl")
    assert (old.requests[0].prompt_tokens, old.requests[0].prompt_ids) == (5, None)


def test_the_cli_simulates_a_mooncake_file(tmp_path, capsys):
    p = tmp_path / "mc.jsonl"
    p.write_text(jsonl(line(0, 40, 2, [1]), line(1000, 40, 2, [1])))
    out = tmp_path / "t.json"
    assert main(["simulate", str(p), "--prefix-caching", "--block-size", "16", "--out", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    assert [r["id"] for r in doc["requests"]] == ["mc-1", "mc-2"]
    kv = [e for e in doc["events"] if e.get("type") == "kv" and e.get("op") == "hit"]
    assert len(kv) == 2                                               # 40 tokens: 2 full blocks of 16 shared


# ---- hostile input: one WorkloadError line naming file, line and field ----------------------------

OK = line(0, 600, 2, [1, 2])
HOSTILE = {
    "not JSON": (OK + "\n" + '{"timestamp": 0, "input_length": 6', "t.jsonl line 2: not JSON"),
    "not an object": (OK + "\n[1, 2]", "t.jsonl line 2: expected an object"),
    "missing field": (OK + '\n{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}',
                      "t.jsonl line 2.output_length: missing"),
    "negative input": (OK + "\n" + line(0, -5, 2, []), "t.jsonl line 2.input_length: expected an integer >= 1"),
    "zero input": (OK + "\n" + line(0, 0, 2, []), "t.jsonl line 2.input_length: expected an integer >= 1"),
    "negative output": (OK + "\n" + line(0, 5, -1, [1]), "t.jsonl line 2.output_length: expected an integer >= 0"),
    "negative time": (OK + "\n" + line(-1, 5, 1, [1]), "t.jsonl line 2.timestamp: expected a number >= 0"),
    "time as text": (OK + "\n" + line("0", 5, 1, [1]), "t.jsonl line 2.timestamp: expected a number, got a string"),
    "fractional length": (OK + "\n" + line(0, 5.5, 1, [1]),
                          "t.jsonl line 2.input_length: expected an integer, got a number"),
    "hash_ids not a list": (OK + "\n" + line(0, 600, 2, "1,2"), "t.jsonl line 2.hash_ids: expected a list"),
    "hash id not an integer": (OK + "\n" + line(0, 600, 2, [1, "b"]),
                               "t.jsonl line 2.hash_ids[1]: expected an integer, got a string"),
    "negative hash id": (OK + "\n" + line(0, 600, 2, [1, -2]), "t.jsonl line 2.hash_ids[1]: expected an integer >= 0"),
    "too few hash ids": (OK + "\n" + line(0, 600, 2, [1]),
                         "t.jsonl line 2.hash_ids: 1 block id, expected 2 (one per 512-token block of "
                         "input_length 600)"),
    "too many hash ids": (OK + "\n" + line(0, 512, 2, [1, 2]), "t.jsonl line 2.hash_ids: 2 block ids, expected 1"),
    "hash id past int64": (OK + "\n" + line(0, 600, 2, [1, 2**63]),
                           "t.jsonl line 2.hash_ids[1]: expected an integer <= 9223372036854775807"),
    "token id past int64": (OK + "\n" + line(0, 600, 2, [1, 2**54]),
                            f"t.jsonl line 2.hash_ids[1]: {2**54} is too large: its token ids (hash id x 512 + "
                            f"position) would pass 2**63-1; at most {2**54 - 1}"),
    "huge length": (OK + "\n" + line(0, 10**8, 2, [1]), "t.jsonl line 2.input_length: expected an integer <= 10000000"),
    "huge time": (OK + "\n" + line(1e13, 600, 2, [1, 2]), "t.jsonl line 2.timestamp: expected a number <= 1"),
    "5,000-digit number": (OK + '\n{"timestamp": 0, "input_length": 1' + "0" * 5000 + ', "output_length": 1, '
                           '"hash_ids": [1]}', "t.jsonl line 2: 100000000000... (5,001 digits) is beyond every range"),
    "NaN": (OK + '\n{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
            "t.jsonl line 2: NaN is not a JSON number"),
    "empty id": (OK + "\n" + line(0, 600, 2, [1, 2], id=""), "t.jsonl line 2: request '': id must be a non-empty"),
    "duplicate id": (line(0, 6, 1, [1], id="a") + "\n" + line(0, 6, 1, [1], id="a"),
                     "t.jsonl: duplicate request id 'a'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_lines_are_one_clear_error(case):
    text, msg = HOSTILE[case]
    with pytest.raises(WorkloadError) as e:
        parse_workload(text + "\n", "t.jsonl")
    assert str(e.value).startswith(msg) and "\n" not in str(e.value), str(e.value)


def test_the_cli_refuses_a_bad_line_in_one_line(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text(HOSTILE["too few hash ids"][0] + "\n")
    assert main(["simulate", str(p), "--out", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bad.jsonl line 2.hash_ids: 1 block id, expected 2") and err.count("\n") == 1, err


def test_too_many_prompt_tokens_are_refused_with_block_tokens_offered(monkeypatch):
    monkeypatch.setattr(mooncake, "MAX_PROMPT_TOKENS", 1000)
    text = jsonl(line(0, 600, 1, [1, 2]), line(1, 600, 1, [1, 3]))
    with pytest.raises(WorkloadError, match=r"^t.jsonl line 2: the prompts reach 1,200 tokens, more than 1,000 .*"
                                            r"smaller block_tokens"):
        parse_workload(text, "t.jsonl")
    assert len(parse_workload(text, "t.jsonl", block_tokens=16)) == 2   # 19 + 19 tokens


@pytest.mark.parametrize("bt", [0, 513, 2.0, True, "16"])
def test_block_tokens_out_of_range_is_refused(bt):
    with pytest.raises(WorkloadError, match=r"^block_tokens: expected an integer in 1..512"):
        from_mooncake_jsonl(jsonl(OK), "t.jsonl", bt)
