"""bench/calendar_step.py (issue 50's design measured before it is built) must keep making the
engine's own trace, or its figures measure something else."""
import numpy as np

from bench import calendar_step as cs
from bench.simulate import poisson_workload
from bench.step_cost import CONFIG, MODEL, run_once
from core.engine.admission import pool_blocks
from core.engine.requests import RequestTable
from core.engine.steplog import log_records


def test_the_calendar_step_makes_the_engines_trace():
    w = poisson_workload(400, 50.0)
    c = CONFIG
    log = cs.calendar_run(w, c.max_seqs, c.token_budget, c.chunk, c.block_size, pool_blocks(c, RequestTable(w)),
                          MODEL.base_ms, MODEL.prefill_ms_per_token, MODEL.decode_ms_per_seq)
    _, core = run_once(w, True, False)
    rec = log_records(core.log)
    steps = np.array(log["steps"])
    assert len(steps) == core.scheduler.step
    np.testing.assert_array_equal(steps[:, 0], rec["step"]["t_ms"])
    np.testing.assert_array_equal(steps[:, 1], rec["step"]["dur_ms"])
    batch, token = cs.rows_of(log)
    for k, v in batch.items():
        np.testing.assert_array_equal(v, np.asarray(rec["batch"][k]), err_msg=k)
    for k, v in token.items():
        np.testing.assert_array_equal(v, np.asarray(rec["token"][k]), err_msg=k)
    # every request's tokens, counted independently of both: its output length
    lens = np.bincount(token["req"], minlength=len(w.requests))
    np.testing.assert_array_equal(lens, [r.max_output_tokens for r in w.requests])


def test_the_bench_prints_its_ratio(capsys):
    assert cs.main(["--requests", "200", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "steps identical, batch rows identical, token rows identical" in out
