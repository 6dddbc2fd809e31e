"""Computations the pages call, as plain core functions: prediction from a trace, trace file
discovery, policies side by side, KV accounting, candidate tables, roofline tables, cursor
helpers. Expected values are worked by hand or read from the files themselves."""
import gzip
import json

import numpy as np
import pytest

from core.analysis.cursor import advance
from core.analysis.occupancy import Occupancy, evictions_and_preemptions, kv_op_counts, prefill_tokens, slots_held_at
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.figures.attention import tile_event_groups
from core.fit.predict import predicted_trace, scheduler_options
from core.formulas import roofline
from core.formulas.kv import GPUS, MODELS
from core.formulas.speculative import candidates, wrong_rule_error
from core.lessons.scenarios import (
    SCHEDULE_PRESETS,
    SchedulePreset,
    chapter_tile_example,
    max_output_tokens,
    random_tile_example,
    trace_files,
    without_tenants,
    word_prefix_match,
)
from core.lessons.schedules import fixed_window, per_request_table, policy_config, run_policies
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.trace import load_trace, parse_trace
from core.workload import Request, Workload, make_workload
from tests.conftest import DATA

# ---- prediction from a trace's metadata -------------------------------------------------------


def test_scheduler_options_are_read_from_the_trace_file():
    with gzip.open(DATA / "traces" / "shared_prefix_caching_on.json.gz") as f:
        raw = json.load(f)["meta"]["engine"]
    cfg = scheduler_options(load_trace(DATA / "traces" / "shared_prefix_caching_on.json.gz"))
    for name in ("policy", "max_seqs", "token_budget", "chunk", "block_size", "kv_blocks", "prefix_caching"):
        assert getattr(cfg, name) == raw[name], name


def test_scheduler_options_drop_speculation_and_name_bad_fields():
    spec = load_trace(DATA / "traces" / "spec_measured_cpu.json")
    assert spec.meta["engine"]["spec_gamma"] == 4
    assert scheduler_options(spec).spec_gamma == 0
    bad = load_trace(DATA / "traces" / "shared_prefix_caching_on.json.gz")
    bad.meta = {**bad.meta, "engine": {**bad.meta["engine"], "max_seqs": 0}}
    with pytest.raises(ConfigError, match="meta.engine: max_seqs"):
        scheduler_options(bad)
    assert scheduler_options(load_trace(DATA / "traces" / "chapter31_serial.json")) == SchedulerConfig()


def test_prediction_of_a_simulated_trace_reproduces_it():
    # Exact affine step times: the least-squares fit recovers 2 ms + 0.5 ms/prefill token + 1 ms/decode
    # sequence, and the recorded options rebuild the schedule, so the prediction equals the trace.
    w = make_workload([("A", 0, 8, 5), ("B", 3, 3, 4), ("C", 4, 12, 2), ("D", 30, 5, 6)])
    sm = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.5, decode_ms_per_seq=1.0)
    tr = simulate(w, SchedulerConfig("continuous", max_seqs=2, block_size=4, chunk=4), sm)
    pred = predicted_trace(tr)
    assert pred.meta["engine"]["max_seqs"] == 2 and pred.meta["engine"]["chunk"] == 4
    assert pred.meta["step_model"]["base_ms"] == pytest.approx(2.0)
    assert np.allclose(pred.tokens["t_ms"], tr.tokens["t_ms"])
    assert pred.tokens["req"].tolist() == tr.tokens["req"].tolist()


def test_prediction_needs_steps():
    with pytest.raises(ConfigError, match="at least 3 steps"):
        predicted_trace(load_trace(DATA / "traces" / "chapter31_serial.json"))


# ---- trace files ------------------------------------------------------------------------------


def test_trace_files_from_the_environment_value(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    for name in ("a.json", "b.json.gz", "c.parquet", "notes.txt", "chapter31_serial.json"):
        (d / name).write_text("{}")
    single = tmp_path / "one.json"
    single.write_text("{}")
    extra = f"{d}:{tmp_path / 'missing'}:{single}"
    files = trace_files(extra)
    bundled = trace_files("")
    assert set(bundled) >= {"chapter31_serial.json", "shared_prefix_caching_on.json.gz", "vllm_example_result.json"}
    assert "README.md" not in bundled
    assert set(files) - set(bundled) == {"a.json", "b.json.gz", "c.parquet", "one.json"}
    assert files["chapter31_serial.json"] == DATA / "traces" / "chapter31_serial.json"   # bundled wins
    assert files["one.json"] == single
    # each file once: one listed under its description is not listed again under its name (issue 36, item 27)
    assert len({p.resolve() for p in bundled.values()}) == len(bundled)
    assert "vllm_cpu_run2_merged.json.gz" not in bundled
    assert (DATA / "traces" / "vllm_cpu_run2_merged.json.gz") in bundled.values()


# ---- policies side by side --------------------------------------------------------------------


def test_chunked_policy_gets_its_chunk_explicitly():
    base = SchedulerConfig(max_seqs=4, block_size=8)
    cfg = policy_config("chunked", base, chunk=2)
    assert (cfg.policy, cfg.chunk, cfg.max_seqs, cfg.block_size) == ("continuous", 2, 4, 8)
    assert policy_config("static", base, chunk=2).chunk is None
    with pytest.raises(ConfigError, match="chunk"):
        policy_config("chunked", base)
    with pytest.raises(ConfigError, match="chunk"):
        policy_config("continuous", SchedulerConfig(chunk=4))
    with pytest.raises(ConfigError, match="policy"):
        policy_config("fifo", base)


def test_run_policies_chunking_by_hand():
    # One request, 4 prompt / 3 output tokens, 1 ms steps. Whole prefill: first token at 1 ms, then
    # 2 and 3 ms. Chunks of 2: the prefill takes two steps, so the tokens come at 2, 3 and 4 ms.
    w = make_workload([("A", 0, 4, 3)])
    runs = dict(run_policies(w, ["continuous", "chunked"], SchedulerConfig(), StepModel("constant", step_ms=1.0),
                             chunk=2))
    assert runs["simulated continuous"].tokens["t_ms"].tolist() == [1.0, 2.0, 3.0]
    assert runs["simulated continuous + chunked prefill"].tokens["t_ms"].tolist() == [2.0, 3.0, 4.0]
    table = per_request_table(list(runs.items()))
    assert table["emitted_tokens"].tolist() == [3, 3]


def test_fixed_window():
    w = make_workload([("A", 0, 4, 3)])
    runs = run_policies(w, ["continuous"], SchedulerConfig(), StepModel("constant", step_ms=1.0))
    assert fixed_window(runs, 0.0) == (0.0, 3.0)            # end 0 = the latest emission
    assert fixed_window(runs, 1.0, 10.0) == (1.0, 10.0)
    with pytest.raises(ConfigError, match="window: end"):
        fixed_window(runs, 5.0, 2.0)


# ---- scenarios ----------------------------------------------------------------------------------


def test_presets_are_option_values_and_checked():
    burst = SCHEDULE_PRESETS["burst5"].options()
    assert burst["SchedulerConfig.max_seqs"] == 3 and burst["SchedulerConfig.token_budget"] is None
    assert burst["StepModel.kind"] == "constant" and burst["StepModel.step_ms"] == 1.0
    assert burst["policies"] == ["static", "continuous"]
    with pytest.raises(ConfigError, match="unknown option 'max_seq'"):
        SchedulePreset(("static",), {"max_seq": 3}, {})
    with pytest.raises(ConfigError, match="policies"):
        SchedulePreset(("fifo",), {}, {})
    with pytest.raises(ConfigError, match="step_ms"):
        SchedulePreset(("static",), {}, {"kind": "constant", "step_ms": 0})


def test_workload_helpers():
    w = Workload([Request("a", 0.0, 2, 5, (1, 2), tenant="t1", abort_at_ms=9.0), Request("b", 1.0, 1, 7, tenant="t2")])
    assert max_output_tokens(w) == 12
    plain = without_tenants(w)
    assert [r.tenant for r in plain.requests] == [None, None]
    assert (plain.requests[0].prompt_ids, plain.requests[0].abort_at_ms) == ((1, 2), 9.0)


def test_word_prefix_match():
    assert word_prefix_match("the cat sat on the mat", "on the mat the cat sat") == 0
    assert word_prefix_match("a b c", "a b d") == 2


def test_tile_examples():
    logits, values = chapter_tile_example()
    assert np.exp(logits).tolist() == pytest.approx([4, 2, 1, 1]) and values.tolist() == [1, 3, 0, 2]
    a, b = random_tile_example(5, 3, 2.0), random_tile_example(5, 3, 2.0)
    assert a[0].shape == (5,) and np.array_equal(a[0], b[0])
    rng = np.random.default_rng(3)
    assert np.allclose(a[0], rng.standard_normal(5) * 2.0)
    with pytest.raises(ConfigError, match="num_keys"):
        random_tile_example(0, 0, 1.0)


# ---- KV accounting ------------------------------------------------------------------------------


def _paging_trace(b_hits_a: bool):
    """A: prompt 6, 4 outputs; B arrives at 1 ms: prompt 6, 2 outputs. Blocks of 4, 1 ms steps.
    With b_hits_a, B's first block is A's (a prefix hit) and B computes 2 of its 6 prompt tokens."""
    ev = [{"t_ms": 0.0, "type": "kv", "op": "alloc", "req": "A", "block": 0, "logical": 0, "ref": 1},
          {"t_ms": 0.0, "type": "kv", "op": "alloc", "req": "A", "block": 1, "logical": 1, "ref": 1}]
    if b_hits_a:
        ev += [{"t_ms": 1.0, "type": "kv", "op": "hit", "req": "B", "block": 0, "logical": 0, "ref": 2},
               {"t_ms": 1.0, "type": "kv", "op": "alloc", "req": "B", "block": 2, "logical": 1, "ref": 1}]
    else:
        ev += [{"t_ms": 1.0, "type": "kv", "op": "alloc", "req": "B", "block": 2, "logical": 0, "ref": 1},
               {"t_ms": 1.0, "type": "kv", "op": "alloc", "req": "B", "block": 3, "logical": 1, "ref": 1}]
    b_prefill = 2 if b_hits_a else 6
    steps = [(0.0, [("A", "prefill", 6)]), (1.0, [("A", "decode", 1), ("B", "prefill", b_prefill)]),
             (2.0, [("A", "decode", 1), ("B", "decode", 1)]), (3.0, [("A", "decode", 1)])]
    for i, (t, batch) in enumerate(steps):
        ev.append({"t_ms": t, "type": "step", "step": i, "dur_ms": 1.0, "running": len(batch), "waiting": 0,
                   "batch": [{"req": r, "kind": k, "tokens": n} for r, k, n in batch]})
    ev += [{"t_ms": t, "type": "token", "req": r, "index": i}
           for r, times in (("A", [1.0, 2.0, 3.0, 4.0]), ("B", [2.0, 3.0])) for i, t in enumerate(times)]
    ev += [{"t_ms": 3.0, "type": "finish", "req": "B", "reason": "length"},
           {"t_ms": 4.0, "type": "finish", "req": "A", "reason": "length"},
           {"t_ms": 4.0, "type": "kv", "op": "free", "req": "A", "block": 1, "logical": 1, "ref": 0},
           {"t_ms": 4.0, "type": "kv", "op": "evict", "block": 1, "ref": 0}]
    doc = {"schema": "serving-trace/1", "meta": {"source": "given"},
           "requests": [{"id": "A", "arrival_ms": 0.0, "prompt_tokens": 6, "max_output_tokens": 4},
                        {"id": "B", "arrival_ms": 1.0, "prompt_tokens": 6, "max_output_tokens": 2}],
           "events": ev}
    return parse_trace(json.dumps(doc), "paging.json")


def test_slots_held_by_hand():
    # At 2 ms, steps 0 and 1 have ended: A stored 6 + 1 = 7 tokens in 2 blocks (8 slots), B 6 in 2 blocks.
    # Contiguous reservation: the longest request, 6 + 4 = 10 slots each.
    held = slots_held_at(_paging_trace(False), 2.0, block_size=4)
    assert held.reqs == [0, 1] and held.tables == {0: [0, 1], 1: [2, 3]}
    assert (held.tokens, held.paged_slots, held.max_len) == ([7, 6], [8, 8], 10)
    assert (held.totals.paged_waste, held.totals.contiguous_waste) == (3, 7)
    assert held.totals.paged_waste_frac == pytest.approx(3 / 16)


def test_slots_held_count_prefix_hits_and_the_running_steps_slots():
    """Issue 36, item 3: B's first block comes from A (a prefix hit, 4 tokens it never computes). At 1.5 ms
    step 1 is running (1.0-2.0): A holds 8 slots, stores the 6 tokens of step 0 and its running decode
    token is being written into the 7th; B holds 8 slots, stores the 4 cached tokens, step 1 writes its 2
    prompt tokens, 2 slots stay empty. At 2 ms: A 7 stored, B 4 + 2 = 6, and step 2 (2.0-3.0) writes
    one token each."""
    tr = _paging_trace(True)
    held = slots_held_at(tr, 1.5, block_size=4)
    assert (held.paged_slots, held.tokens, held.from_cache, held.writing) == ([8, 8], [6, 4], [0, 4], [1, 2])
    assert held.tail_empty == (8 - 6 - 1) + (8 - 4 - 2)
    assert (held.totals.tokens, held.totals.paged_slots) == (10, 16)
    held = slots_held_at(tr, 2.0, block_size=4)
    assert (held.tokens, held.from_cache, held.writing, held.tail_empty) == ([7, 6], [0, 4], [1, 1], 1)
    assert held.totals.paged_waste == 16 - 13


def test_kv_counts_and_prefill_savings():
    tr = _paging_trace(True)
    assert kv_op_counts(tr) == {"alloc": 3, "hit": 1, "cache": 0, "evict": 1, "cow": 0, "preemptions": 0}
    assert prefill_tokens(tr) == (8, 12)              # B computed 2 of 6: 4 came from A's block
    assert prefill_tokens(_paging_trace(False)) == (12, 12)
    preempts, evicts = evictions_and_preemptions(tr)
    assert len(preempts) == 0 and evicts["op"].tolist() == ["evict"]


def test_occupancy_snapshot_lookup():
    occ = Occupancy(np.array([0.0, 10.0, 20.0]), np.zeros((2, 3), np.int8), np.array([[1, 2, 0], [0, 1, 1]]),
                    np.full((2, 3), -1), 2)
    assert [occ.index_at(t) for t in (-5.0, 0.0, 10.0, 15.0, 25.0)] == [0, 0, 1, 1, 2]
    assert occ.refs_at(1) == {0: 2, 1: 1}


# ---- speculative candidate tables ---------------------------------------------------------------


def test_candidate_table():
    names, p, q = candidates(["Paris", None, None], [0.6, 0.4, None], [0.8, 0.2, float("nan")])
    assert names == ["Paris", "#2"] and p.tolist() == [0.6, 0.4] and q.tolist() == [0.8, 0.2]
    with pytest.raises(ConfigError, match="column q, row 2"):
        candidates(["a", "b"], [0.5, 0.5], [1.0, None])
    with pytest.raises(ConfigError, match="2 to 8 candidates"):
        candidates(["a"], [1.0], [1.0])
    with pytest.raises(ConfigError, match="sum to 1"):
        candidates(["a", "b"], [0.5, 0.6], [0.5, 0.5])


def test_wrong_rule_error_paris():
    # Wrong rule: min(p, q) + 0.2 x p = [0.6 + 0.12, 0.2 + 0.08] = [0.72, 0.28]; error 0.12.
    assert wrong_rule_error([0.6, 0.4], [0.8, 0.2]) == pytest.approx(0.12)


# ---- roofline tables ----------------------------------------------------------------------------


def test_roofline_batch_table_by_hand():
    gpu, params = GPUS["A100-80GB"], MODELS["Llama-2-7B"].params
    rows = {r["batch"]: r for r in roofline.batch_table(params, 2.0, gpu)}
    # Intensity 2B/2 = B FLOP/B; ridge 312e12 / 2039e9 = 153: B <= 128 waits on memory.
    assert [rows[b]["bound"] for b in (1, 128, 256)] == ["bandwidth", "bandwidth", "compute"]
    assert rows[1]["step time ms (roofline)"] == pytest.approx(params * 2 / 2039e9 * 1000)
    assert rows[512]["step time ms (roofline)"] == pytest.approx(2 * params * 512 / 312e12 * 1000)
    assert rows[512]["tokens/s"] == pytest.approx(312e12 / (2 * params))
    assert roofline.compute_bound_tokens_per_s(params, gpu) == pytest.approx(312e12 / (2 * params))
    (pt,) = roofline.intensity_table([("decode B=1", 1.0)], gpu)
    assert pt["attainable TFLOP/s"] == pytest.approx(2.039) and pt["bound on A100-80GB"] == "bandwidth"


# ---- cursor and captured tiles ----------------------------------------------------------------------


def test_advance_wraps_at_the_end():
    assert advance(0.0, 0.0, 10.0, 2.5) == 2.5
    assert advance(9.0, 0.0, 10.0, 1.0) == 10.0
    assert advance(9.5, 0.0, 10.0, 1.0) == 0.0


def test_tile_event_groups():
    rows = [{"layer": 1, "head": 0, "q_tile": 0, "kv_tile": 0}, {"layer": 0, "head": 1, "q_tile": 2, "kv_tile": 0},
            {"layer": 0, "head": 1, "q_tile": 2, "kv_tile": 1}]
    groups = tile_event_groups(rows)
    assert list(groups) == [(0, 1, 2), (1, 0, 0)]
    assert [r["kv_tile"] for r in groups[(0, 1, 2)]] == [0, 1]


def _fragment_globals_reassigned(source: str) -> list[tuple[str, str]]:
    """(fragment, name) for each module-level name a @st.fragment function reads that the page
    assigns again at module level after the fragment's definition: a fragment rerun runs after
    the whole script, so it sees that later value, not the one above it."""
    import ast
    tree = ast.parse(source)
    stores: list[tuple[int, str]] = []      # (line, name) of module-level assignments to a bare name

    def names(target):
        if isinstance(target, ast.Name):
            yield target.id
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                yield from names(t)

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    stores.extend((node.lineno, n) for n in names(t))
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)
    visit(tree.body)
    bad = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and any("fragment" in ast.unparse(d) for d in fn.decorator_list):
            local = {a.arg for a in fn.args.args} | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                                                     and isinstance(n.ctx, ast.Store)}
            reads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            later = {n for line, n in stores if line > fn.end_lineno}
            bad += [(fn.name, name) for name in sorted((reads - local) & later)]
    return bad


def test_fragments_read_no_module_name_the_page_reassigns():
    """Issue 28 item 11: the replay page's cursor fragment read `big` (more than 150 requests:
    show a subset), which the fidelity section below reassigned (more than 2,000): on every cursor
    move the fragment drew all 500 requests and re-sent the large charts (0.8 s a move; 0.2 s once
    fixed). Every page's fragments read only names assigned once."""
    from tests.conftest import ROOT
    found = {p.name: _fragment_globals_reassigned(p.read_text()) for p in (ROOT / "pages").glob("*.py")}
    assert not {k: v for k, v in found.items() if v}, found
    # and the rule sees what it forbids
    assert _fragment_globals_reassigned("import streamlit as st\nbig = 1\n@st.fragment\ndef f():\n    return big\n"
                                        "big = 2\n") == [("f", "big")]
