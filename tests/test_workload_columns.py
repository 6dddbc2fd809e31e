"""Column-wise workload loading (core.workload, core.workload.files): the Vidur CSV and LLMServingSim JSONL readers
agree with the row-by-row readers (values, order, ties, errors), Workload.from_columns checks
every Request rule, and the lazily built requests equal the eagerly built ones."""
import json
import pickle

import numpy as np
import pytest

from core.errors import WorkloadError
from core.workload import MAX_TIME_MS, MAX_TOKENS, Request, Workload, parse_workload
from core.workload.files import (
    _llmservingsim_jsonl_columns,
    _llmservingsim_jsonl_rows,
    _vidur_csv_columns,
    _vidur_csv_rows,
)
from tests.conftest import DATA


def rows(w: Workload):
    return [(r.id, r.arrival_ms, r.prompt_tokens, r.max_output_tokens) for r in w.requests]


def same(fast: Workload, slow: Workload):
    assert fast.name == slow.name and len(fast) == len(slow)
    assert fast.ids == [r.id for r in slow.requests]
    assert fast.arrival_ms.dtype == np.float64 and fast.prompt_tokens.dtype == np.int64
    assert fast.arrival_ms.tolist() == [r.arrival_ms for r in slow.requests]
    assert fast.prompt_tokens.tolist() == [r.prompt_tokens for r in slow.requests]
    assert fast.max_output_tokens.tolist() == [r.max_output_tokens for r in slow.requests]
    assert rows(fast) == rows(slow) and fast.requests == slow.requests
    assert fast.plain and fast.to_dict() == slow.to_dict()


def random_csv(rng, n, ids=None, crlf=False, blank=False, floats=False, extra=False):
    t = np.round(np.cumsum(rng.exponential(0.02, n)), 3)
    t[rng.random(n) < 0.3] = 1.0  # ties out of order: the sort must keep file order among them
    p, o = rng.integers(1, 2049, n), rng.integers(1, 513, n)
    head = ["arrived_at", "num_prefill_tokens", "num_decode_tokens"] + (["note"] if extra else [])
    if ids:
        head += ids
    lines = [",".join(head)]
    for i in range(n):
        cells = [repr(float(t[i])), f"{p[i]}.0" if floats and i % 3 == 0 else str(p[i]), str(o[i])]
        if extra:
            cells.append('"a, quoted note"')
        for c in ids or ():
            cells.append("" if rng.random() < 0.3 else f"{c}-{i} x")  # blanks fall back to the row number
        lines.append(",".join(cells))
        if blank and i % 7 == 0:
            lines.append("")
    return ("\r\n" if crlf else "\n").join(lines) + "\n"


@pytest.mark.parametrize("kw", [{}, {"ids": ["id"]}, {"ids": ["request_id"]}, {"ids": ["id", "request_id"]},
                                {"crlf": True, "blank": True}, {"floats": True, "extra": True}],
                         ids=["plain", "id", "request_id", "both", "crlf-blank", "floats-extra"])
def test_vidur_csv_columns_equal_rows(kw):
    rng = np.random.default_rng(len(str(kw)))
    text = random_csv(rng, 400, **kw)
    fast = _vidur_csv_columns(text, "r.csv", text.split("\n", 1)[0].strip().split(","))
    assert fast is not None, "the column-wise path should take this file"
    same(fast, _vidur_csv_rows(text, "r.csv"))
    same(parse_workload(text.encode(), "r.csv"), _vidur_csv_rows(text, "r.csv"))


def random_jsonl(rng, n, ids=False, crlf=False, blank=False, extra=False, big_ns=False):
    t = np.cumsum(rng.integers(0, 5_000_000, n))
    if big_ns:
        t = t + 2**58  # beyond 2**53: int -> float rounding must match Python's
    t[rng.random(n) < 0.3] = t[0]
    out = []
    for i in range(n):
        d = {"input_toks": int(rng.integers(1, 4000)), "output_toks": float(rng.integers(1, 500)) if i % 4 == 0
             else int(rng.integers(1, 500)), "arrival_time_ns": int(t[i]) if i % 5 else float(t[i])}
        if ids:
            d["id"] = f"q {i}"
        if extra:
            d |= {"model": "x", "score": 0.5, "ok": True, "none": None}
        out.append(json.dumps(d, separators=(",", ":") if i % 2 else (", ", ": ")))
        if blank and i % 6 == 0:
            out.append("   ")
    return ("\r\n" if crlf else "\n").join(out) + "\n"


@pytest.mark.parametrize("kw", [{}, {"ids": True}, {"crlf": True, "blank": True}, {"extra": True},
                                {"big_ns": True, "ids": True}],
                         ids=["plain", "ids", "crlf-blank", "extra", "big-ns"])
def test_llmservingsim_jsonl_columns_equal_rows(kw):
    rng = np.random.default_rng(7 + len(str(kw)))
    text = random_jsonl(rng, 300, **kw)
    fast = _llmservingsim_jsonl_columns(text, "r.jsonl")
    assert fast is not None, "the column-wise path should take this file"
    same(fast, _llmservingsim_jsonl_rows(text, "r.jsonl"))
    same(parse_workload(text.encode(), "r.jsonl"), _llmservingsim_jsonl_rows(text, "r.jsonl"))


OK = '{"input_toks": 1, "output_toks": 2, "arrival_time_ns": 3000000'


@pytest.mark.parametrize("text", [
    OK + ', "id": 7}\n' + OK + ', "id": "b"}\n',           # numeric id: str(7)
    OK + ', "id": "a"}\n' + OK + "}\n",                     # some ids missing: row number
    OK + ', "id": null}\n',                                  # str(None)
    '{"input_toks": "4", "output_toks": 2.0, "arrival_time_ns": "5"}\n',  # numbers as strings
    OK + ', "deep": [[1]]}\n',
    OK + "}\r" + OK + "}\r",                                 # lone \r ends lines
])
def test_jsonl_files_the_fast_path_declines_read_as_before(text):
    assert rows(parse_workload(text, "o.jsonl")) == rows(_llmservingsim_jsonl_rows(text, "o.jsonl"))


@pytest.mark.parametrize("text,msg", [
    (OK + "} " + OK + "}\n", "o.jsonl line 1: not JSON"),
    (OK + ', "x": NaN}\n', "o.jsonl line 1: NaN is not a JSON number"),
    (OK + ', "s": "\u2028"}\n', "o.jsonl line 1: not JSON"),  # str.splitlines() breaks the line
    ('{"input_toks": 1,\n "output_toks": 2, "arrival_time_ns": 3}\n', "o.jsonl line 1: not JSON"),
    (OK + "}\n" + OK.replace("1,", "4.5,") + "}\n", "o.jsonl line 2.input_toks: expected a positive integer, got 4.5"),
    (OK + "}\n" + OK.replace("3000000", "-1") + "}\n", "o.jsonl line 2: request '1': arrival_ms: expected a finite"),
    (OK + ', "id": "a"}\n' + OK + ', "id": "a"}\n', "o.jsonl: duplicate request id 'a'"),
    ("\n  \n", "o.jsonl: the workload has no requests"),
])
def test_jsonl_errors_as_before(text, msg):
    with pytest.raises(WorkloadError) as e:
        parse_workload(text, "o.jsonl")
    assert msg in str(e.value)
    with pytest.raises(WorkloadError) as e2:
        _llmservingsim_jsonl_rows(text, "o.jsonl")
    assert str(e.value) == str(e2.value)


HEAD = "arrived_at,num_prefill_tokens,num_decode_tokens"


@pytest.mark.parametrize("body,msg", [
    ("0,1,1\n0.5,4.5,1\n", "c.csv row 3.num_prefill_tokens: expected an integer, got '4.5'"),
    ("0,1,1\n0.5,1e400,1\n", "c.csv row 3.num_prefill_tokens: expected an integer, got '1e400'"),
    (f"0,1,1\n0,{2**70},1\n", f"c.csv row 3.num_prefill_tokens: expected an integer in 1..{MAX_TOKENS}, got {2**70}"),
    ("0,1,1\n-1,1,1\n", "c.csv row 3: request '1': arrival_ms: expected a finite number >= 0, got -1000.0"),
    ("0,1,1\nnan,1,1\n", "c.csv row 3: request '1': arrival_ms: expected a finite number >= 0, got nan"),
    ("0,1,1\n,1,1\n", "c.csv row 3.arrived_at: expected a number, got ''"),
    ("0,1,1\n1e10,1,1\n", "beyond the latest time"),
    ("0,1,0\n", "c.csv row 2.num_decode_tokens: expected an integer in 1..10000000, got 0"),
    ("0,1\n", "c.csv row 2"),
    ("", "c.csv: the workload has no requests"),
])
def test_csv_errors_as_before(body, msg):
    text = HEAD + "\n" + body
    with pytest.raises(WorkloadError) as e:
        parse_workload(text.encode(), "c.csv")
    assert msg in str(e.value)
    with pytest.raises(WorkloadError) as e2:
        _vidur_csv_rows(text, "c.csv")
    assert str(e.value) == str(e2.value)


def test_csv_duplicate_ids_and_odd_rows():
    with pytest.raises(WorkloadError, match="c.csv: duplicate request id 'a'"):
        parse_workload(f"{HEAD},id\n0,1,1,a\n1,1,1,a\n", "c.csv")
    # A row with an extra cell: csv.DictReader keeps going, so does the reader.
    w = parse_workload(f"{HEAD}\n0.5,1,1,extra\n0.25,2,2\n", "c.csv")
    assert rows(w) == [("1", 250.0, 2, 2), ("0", 500.0, 1, 1)]


# ---- Workload.from_columns -----------------------------------------------------------------

def test_from_columns_sorts_stably_and_builds_requests_lazily():
    a = np.array([5.0, 1.0, 5.0, 0.0, 1.0])
    p, o = np.array([1, 2, 3, 4, 5]), np.array([6, 7, 8, 9, 10])
    w = Workload.from_columns(None, a, p, o, name="cols")
    assert len(w) == 5 and w._requests is None  # len without building requests
    assert w.ids == ["3", "1", "4", "0", "2"] and w.arrival_ms.tolist() == [0, 1, 1, 5, 5]
    assert w.prompt_tokens.tolist() == [4, 2, 5, 1, 3] and w.max_output_tokens.tolist() == [9, 7, 10, 6, 8]
    eager = Workload([Request(str(i), float(a[i]), int(p[i]), int(o[i])) for i in range(5)], name="cols")
    assert w.plain and eager.plain and w.to_dict() == eager.to_dict()
    assert w.requests == eager.requests and w.requests is w.requests and w == eager
    assert eager.ids == w.ids and np.array_equal(eager.arrival_ms, w.arrival_ms)
    assert pickle.loads(pickle.dumps(w)) == w


def test_from_columns_ids_and_tenant():
    w = Workload.from_columns(np.array(["b", "a"]), [2.0, 1], [3, 4], [5, 6], tenant=["t", None])
    assert w.ids == ["a", "b"] and [r.tenant for r in w.requests] == [None, "t"] and not w.plain
    w = Workload.from_columns(("x",), [0], [1], [1], tenant="all")
    assert w.requests[0].tenant == "all" and not w.plain


@pytest.mark.parametrize("args,msg", [
    ((["a", "a"], [0, 1], [1, 1], [1, 1]), "w: duplicate request id 'a'"),
    ((["a", ""], [0, 1], [1, 1], [1, 1]), "w: row 1 (request ''): id must be a non-empty string"),
    ((["a", 5], [0, 1], [1, 1], [1, 1]), "w: row 1 (request 5): id must be a non-empty string"),
    ((None, [0, -1], [1, 1], [1, 1]), "w: row 1 (request '1'): arrival_ms: expected a finite number >= 0, got -1"),
    ((None, np.array([0, np.inf]), [1, 1], [1, 1]), "arrival_ms: expected a finite number >= 0, got inf"),
    ((None, [0, np.nan], [1, 1], [1, 1]), "row 1 (request '1'): arrival_ms: expected a finite number >= 0, got nan"),
    ((None, [0, 2 * MAX_TIME_MS], [1, 1], [1, 1]), "arrival_ms: 2000000000000.0 ms is beyond the latest time"),
    ((None, [0, 10**400], [1, 1], [1, 1]), "row 1 (request '1'): arrival_ms: expected a finite number >= 0"),
    ((None, [0, True], [1, 1], [1, 1]), "arrival_ms: expected a number of milliseconds, got True"),
    ((None, ["0", 1], [1, 1], [1, 1]), "row 0 (request '0'): arrival_ms: expected a number of milliseconds, got '0'"),
    ((None, [0, 1], [1, 0], [1, 1]), "row 1 (request '1'): prompt_tokens: expected an integer in 1..10000000, got 0"),
    ((None, [0, 1], [1, 1], np.array([1, MAX_TOKENS + 1])), "output_tokens: expected an integer in 1..10000000"),
    ((None, [0, 1], [1, 2**70], [1, 1]), "prompt_tokens: expected an integer in 1..10000000, got 11805916207174113"),
    ((None, [0, 1], np.array([1.0, 4.0]), [1, 1]), "row 0 (request '0'): prompt_tokens: expected a positive integer"),
    ((None, [0, 1], [1, 1], [1, False]), "row 1 (request '1'): output_tokens: expected a positive integer, got False"),
    ((None, [0], [1, 1], [1, 1]), "w: columns differ in length (arrival_ms 1, prompt_tokens 2, output_tokens 2)"),
    ((None, [], [], []), "w: the workload has no requests"),
])
def test_from_columns_refuses(args, msg):
    with pytest.raises(WorkloadError) as e:
        Workload.from_columns(*args, name="w")
    assert msg in str(e.value)


def test_from_columns_tenant_must_be_string():
    with pytest.raises(WorkloadError, match=r"w: row 0 \(request 'a'\): tenant: expected a string or null, got 3"):
        Workload.from_columns(["a"], [0], [1], [1], name="w", tenant=[3])


def test_list_workload_columns_follow_requests():
    w = Workload([Request("b", 2.0, 3, 4, tenant="t"), Request("a", 1, 1, 2, abort_at_ms=9.0)], name="l")
    assert w.ids == ["a", "b"] and w.arrival_ms.tolist() == [1.0, 2.0] and not w.plain
    w.requests = w.requests[:1]  # as tests do: the cached columns are dropped
    assert w.ids == ["a"] and len(w) == 1 and w.prompt_tokens.tolist() == [1]
    assert repr(w) == "Workload(name='l', 1 requests)"


def test_bundled_files_columnar():
    w = parse_workload((DATA / "workloads" / "poisson500_vidur.csv").read_bytes(), "poisson500_vidur.csv")
    assert w._requests is None and len(w) == 500 and w.ids[:2] == ["0", "1"]
    w = parse_workload((DATA / "workloads" / "llmservingsim64.jsonl").read_bytes(), "llmservingsim64.jsonl")
    assert w._requests is None and len(w) == 64


@pytest.mark.slow   # seconds: out of the fast loop
def test_million_row_csv():
    n = 1_000_000
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(1 / 50, n))
    t[0] = 0.0
    p, o = rng.integers(1, 2049, n), rng.integers(1, 513, n)
    secs = [f"{a:.6f}" for a in t.tolist()]
    lines = "\n".join(f"{a},{b},{c}" for a, b, c in zip(secs, p.tolist(), o.tolist()))
    w = parse_workload(f"{HEAD}\n{lines}\n".encode(), "big.csv")
    assert len(w) == n and w._requests is None
    assert np.array_equal(w.prompt_tokens, p) and np.array_equal(w.max_output_tokens, o)
    assert np.array_equal(w.arrival_ms, np.array([float(a) for a in secs]) * 1000.0)
    assert w.ids[:3] == ["0", "1", "2"] and w.ids[-1] == str(n - 1)
    last = w.requests[-1]
    assert (last.id, last.prompt_tokens, last.max_output_tokens) == (str(n - 1), int(p[-1]), int(o[-1]))
