"""The real engine's repeat noise (core.fit.noise): the floor every fidelity error is held against,
computed by hand here on runs with known times."""
import json

import pytest

from core.__main__ import main
from core.errors import InputError
from core.fit.noise import repeat_floor, times_floor
from core.fit.runs import load_run
from core.trace import save_trace
from core.trace.build import given_trace
from core.workload import Request, Workload

TTFT_A = [10.0, 20.0, 30.0, 40.0, 50.0]
TTFT_B = [11.0, 20.0, 33.0, 40.0, 45.0]


def _run(path, ttfts, prompts=(8, 9, 10, 11, 12), tag="x"):
    """Five requests, one every 100 ms, two tokens each: the first at arrival + TTFT, the second 5 ms later
    (E2E = TTFT + 5)."""
    reqs = [Request(f"cmpl-bench-{tag}-{i}-0", 100.0 * i, p, 2) for i, p in enumerate(prompts)]
    emitted = {r.id: [r.arrival_ms + t, r.arrival_ms + t + 5.0] for r, t in zip(reqs, ttfts)}
    save_trace(given_trace(Workload(reqs), emitted, {"label": path.stem}), path)
    return str(path)


def test_the_floor_is_the_median_of_each_repeat_as_the_others_prediction(tmp_path):
    a, b = _run(tmp_path / "a.json", TTFT_A, tag="aa"), _run(tmp_path / "b.json", TTFT_B, tag="bb")
    f = repeat_floor([load_run(a), load_run(b)])
    # a as b's prediction: |10-11|/11, 0, 3/33, 0, 5/45 -> median 1/11; b as a's: 1/10, 0, 3/30, 0, 5/50 -> 1/10
    assert f["paired"] == 5 and f["paired_by"] == "the index in each request's id"
    assert f["ttft_ms"]["p50"] == pytest.approx((1 / 11 + 1 / 10) / 2)
    assert f["ttft_ms"]["p50_min"] == pytest.approx(1 / 11) and f["ttft_ms"]["p50_max"] == pytest.approx(1 / 10)
    # E2E = TTFT + 5: |15-16|/16, 0, 3/38, 0, 5/50 -> median 1/16; |16-15|/15, 0, 3/35, 0, 5/55 -> 1/15
    assert f["e2e_ms"]["p50"] == pytest.approx((1 / 16 + 1 / 15) / 2)
    assert f["ttft_ms"]["run_medians"] == [30.0, 33.0]
    assert f["ttft_ms"]["run_spread"] == pytest.approx(33 / 30 - 1)
    assert times_floor(0.2, f, "ttft_ms") == pytest.approx(0.2 / ((1 / 11 + 1 / 10) / 2))
    assert times_floor(None, f, "ttft_ms") is None and times_floor(0.2, None, "ttft_ms") is None


def test_runs_that_are_not_repeats_are_refused_by_name(tmp_path):
    a = _run(tmp_path / "a.json", TTFT_A, tag="aa")
    other = _run(tmp_path / "other.json", TTFT_B, prompts=(8, 9, 99, 11, 12), tag="cc")
    with pytest.raises(InputError, match=r"other is not a repeat of a: its request 2 has 99 prompt tokens, a's 10"):
        repeat_floor([load_run(a), load_run(other)])
    with pytest.raises(InputError, match="given twice"):
        repeat_floor([load_run(a), load_run(a)])
    with pytest.raises(InputError, match="at least two runs"):
        repeat_floor([load_run(a)])


def test_the_cli_prints_the_floor_alone_and_beside_every_error(tmp_path, capsys):
    a, b = _run(tmp_path / "a.json", TTFT_A, tag="aa"), _run(tmp_path / "b.json", TTFT_B, tag="bb")
    assert main(["fidelity", "--repeats", a, b, "--json"]) == 0
    (f,) = json.loads(capsys.readouterr().out)["repeat_floors"]
    assert f["ttft_ms"]["p50"] == pytest.approx((1 / 11 + 1 / 10) / 2)
    assert main(["fidelity", "--repeats", a, b]) == 0
    text = capsys.readouterr().out
    assert "repeat floor of a over 2 repeats" in text and "TTFT 9.5%" in text
    assert main(["fidelity", "--fit", a]) != 0
    assert "go together" in capsys.readouterr().err
