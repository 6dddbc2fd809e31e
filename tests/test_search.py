"""The capacity search (core.experiments.search, issue 29 part 3): its answer and every point against a
brute-force run of every configuration made here with the simulator and the metric definitions,
early stopping that never drops a configuration that would have met the target, the grid's
refusals, and the command line."""
import json

import numpy as np
import pytest

from core.__main__ import main
from core.analysis.metrics import SLO, request_metrics, slo_check
from core.config import SchedulerConfig
from core.errors import ConfigError
from core.experiments.search import configurations, parse_grid, search
from core.experiments.sweep import point_summary, retimed
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import Request, Workload

SM = StepModel("affine", base_ms=5.0, prefill_ms_per_token=0.02, decode_ms_per_seq=0.4)
SLO_ = SLO(ttft_ms=400.0, tpot_ms=12.0)


def workload(n=240, seed=3):
    rng = np.random.default_rng(seed)
    return Workload([Request(f"r{i}", 0.0, int(rng.integers(32, 1200)), int(rng.integers(8, 120)))
                     for i in range(n)], name="mixed")


def brute_force(w, base, grid, rate, target, usd):
    """Every configuration in full, the winner chosen by the documented rule, made here."""
    rows = []
    for point, cfg in configurations(base, grid):
        try:
            tr = simulate(retimed(w, rate, 0), cfg, SM, record_kv=False)
        except ConfigError as e:
            rows.append({"config": point, "invalid": str(e), "attainment": -1.0})
            continue
        met, _ = slo_check(request_metrics(tr), SLO_)
        p = point_summary(tr, SLO_)
        good = p["slo"]["goodput_tok_per_s"]
        rows.append({"config": point, "attainment": float(met.mean()), "goodput": good,
                     "cost": usd / 3600 / good * 1000 if good else None})
    ok = [(i, r) for i, r in enumerate(rows) if r["attainment"] >= target]
    best = min(ok, key=lambda ir: (ir[1]["cost"], ir[1]["config"].get("kv_blocks") or 0,
                                   ir[1]["config"].get("max_seqs") or 0, ir[0]))[1] if ok else None
    return rows, best


@pytest.mark.parametrize("rate,target", [(8.0, 0.9), (12.0, 0.8), (40.0, 0.9)])
def test_the_search_answers_as_a_brute_force_run_of_every_configuration(rate, target):
    w = workload()
    base = SchedulerConfig("continuous", block_size=16)
    # budget 512 without chunking cannot run the 1,000-token prompts: those points are invalid, said why
    grid = {"max_seqs": [1, 4, 16, 64], "token_budget": [512, 4096], "chunk": [None, 256], "kv_blocks": [600, 6000]}
    got = search(w, base, SM, grid, rate, SLO_, target=target, usd_per_hour=4.0, workers=1)
    rows, best = brute_force(w, base, grid, rate, target, 4.0)
    assert len(got["points"]) == len(rows) == 32
    assert any("invalid" in p for p in got["points"]) and got["pruned"] > 0    # one seat: hopeless early
    assert (got["best"] is None) == (rate == 40.0)
    for p, r in zip(got["points"], rows):
        assert p["config"] == r["config"]
        if "invalid" in r:
            assert p["invalid"] == r["invalid"]
        elif p.get("pruned"):            # stopped early: it would indeed have missed the target
            assert r["attainment"] < target and p["attainment_at_most"] >= r["attainment"] - 1e-12, (p, r)
        else:
            assert p["slo"]["attainment"] == pytest.approx(r["attainment"], abs=1e-12)
            assert p["meets"] == (r["attainment"] >= target)
    assert (got["best"] or {}).get("config") == (best or {}).get("config")
    # the same answer without early stopping
    full = search(w, base, SM, grid, rate, SLO_, target=target, usd_per_hour=4.0, prune=False, workers=1)
    assert full["pruned"] == 0 and (full["best"] or {}).get("config") == (best or {}).get("config")


def test_some_configurations_stop_early_and_the_answer_holds():
    w = workload()
    got = search(w, SchedulerConfig("continuous"), SM, {"max_seqs": [1, 2, 64]}, 30.0, SLO_, target=0.9,
                 workers=1)
    assert got["pruned"] >= 1 and got["simulated"] + got["pruned"] == 3


def test_the_grid_is_read_and_refused_with_the_option_named():
    assert parse_grid(["max_seqs=8,16", "chunk=256", "prefix_caching=true,false", "kv_blocks=none,4000"]) == \
        {"max_seqs": [8, 16], "chunk": [256], "prefix_caching": [True, False], "kv_blocks": [None, 4000]}
    for bad, said in ((["max_seq=8"], "unknown option 'max_seq'"), (["max_seqs"], "NAME=V1"),
                      (["max_seqs=8,x"], "max_seqs: expected an integer"), (["max_seqs=8,8"], "listed twice"),
                      (["max_seqs=8", "max_seqs=16"], "given twice"), (["max_seqs=8,"], "empty value"),
                      ([f"max_seqs={','.join(map(str, range(1, 100)))}", f"chunk={','.join(map(str, range(1, 100)))}"],
                       "at most 4,096")):
        with pytest.raises(ConfigError, match=said):
            parse_grid(bad)
    with pytest.raises(ConfigError, match="at least one SLO"):
        search(workload(20), SchedulerConfig(), SM, {"max_seqs": [2]}, 5.0, SLO())


def test_the_command_line_prints_every_point_and_the_best(tmp_path, capsys):
    w = tmp_path / "w.json"
    w.write_text(json.dumps({"requests": [{"id": f"r{i}", "arrival_ms": 0, "prompt_tokens": 64 + i,
                                           "max_output_tokens": 16} for i in range(60)]}))
    args = ["search", str(w), "--rate", "8", "--slo-ttft-ms", "400", "--grid", "max_seqs=2,16", "--step-model",
            "affine", "--base-ms", "5", "--prefill-ms-per-token", "0.02", "--decode-ms-per-seq", "0.4",
            "--usd-per-hour", "4", "--workers", "1"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["config"] for p in out["points"]] == [{"max_seqs": 2}, {"max_seqs": 16}]
    meets = [p for p in out["points"] if p.get("meets")]
    assert meets and out["best"] == min(meets, key=lambda p: (p["cost_per_1k_good_tokens_usd"],
                                                              p["config"]["max_seqs"]))
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"best: max_seqs {out['best']['config']['max_seqs']}" in text and "USD" in text
    assert main(["search", str(w), "--rate", "8", "--grid", "bogus=1"]) == 2
    assert "unknown option 'bogus'" in capsys.readouterr().err


def small_grid_workload():
    rng = np.random.default_rng(5)
    return Workload([Request(f"q{i}", 0.0, int(rng.integers(16, 400)), int(rng.integers(4, 40))) for i in range(60)],
                    name="small")


@pytest.mark.slow       # a local Ray starts in ~3 s
def test_a_64_configuration_search_on_local_ray_equals_the_local_executor():
    """Issue 29 part 2: the same search as Ray tasks on a local Ray of 2 workers gives the same
    points and the same answer as the local executor."""
    pytest.importorskip("ray")
    grid = {"max_seqs": [1, 2, 8, 32], "token_budget": [256, 1024, 4096, None], "kv_blocks": [40, 200, 2000, None]}
    kw = dict(target=0.9, usd_per_hour=2.0)
    here = search(small_grid_workload(), SchedulerConfig("continuous", chunk=128), SM, grid, 10.0, SLO_, workers=1,
                  **kw)
    on_ray = search(small_grid_workload(), SchedulerConfig("continuous", chunk=128), SM, grid, 10.0, SLO_,
                    workers=2, ray="local", **kw)
    assert len(here["points"]) == 64
    assert on_ray["points"] == here["points"] and on_ray["best"] == here["best"] and here["best"] is not None


def test_ray_is_imported_only_when_asked_for(tmp_path):
    """The CLI without --ray and the Load page's search never import Ray; asked for without Ray
    installed, the search says how to get it."""
    import subprocess
    import sys

    from tests.conftest import ROOT
    code = ("import sys, json\n"
            "from core.__main__ import main\n"
            "w = sys.argv[1]\n"
            "main(['search', w, '--rate', '8', '--slo-ttft-ms', '400', '--grid', 'max_seqs=2,16', '--json',"
            " '--workers', '1'])\n"
            "from tests.helpers import open_page\n"
            "at = open_page('load', {'ld_s_ms': '16', 'ld_s_tb': '8192', 'ld_s_kb': 'none'})\n"
            "at.button(key='ld_s_go').click().run()\n"
            "assert not at.exception and 'ld_search_done' in at.session_state\n"
            "print('RAY IMPORTED' if 'ray' in sys.modules else 'NO RAY')\n")
    w = tmp_path / "w.json"
    w.write_text(json.dumps({"requests": [{"id": f"r{i}", "arrival_ms": 0, "prompt_tokens": 64,
                                           "max_output_tokens": 8} for i in range(30)]}))
    out = subprocess.run([sys.executable, "-c", code, str(w)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "NO RAY"


def test_asking_for_ray_without_it_says_how_to_install_it(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)          # "import ray" fails as if not installed
    with pytest.raises(ConfigError, match="Ray is not installed.*pip install ray=="):
        search(small_grid_workload(), SchedulerConfig(), SM, {"max_seqs": [2, 4]}, 5.0, SLO_, ray="local")


def test_results_written_to_a_shared_location_are_gathered_as_a_dataset(tmp_path):
    """Issue 29 part 2: each configuration writes its result row as a Parquet part (a directory, or a
    pyarrow filesystem URI); the search read back from the dataset equals the in-memory one; the parts
    stay, queryable (DuckDB), and a location that holds an earlier run's parts is refused."""
    import duckdb
    grid = {"max_seqs": [1, 8], "token_budget": [256, None]}
    kw = dict(target=0.9, usd_per_hour=2.0, workers=2)
    args = (small_grid_workload(), SchedulerConfig("continuous", chunk=128), SM, grid, 10.0, SLO_)
    here = search(*args, **kw)
    for where in (str(tmp_path / "runs" / "a"), (tmp_path / "b").as_uri()):
        shared = search(*args, results=where, **kw)
        assert shared["points"] == here["points"] and shared["best"] == here["best"]
        d = tmp_path / "runs" / "a" if "://" not in where else tmp_path / "b"
        assert sorted(p.name for p in d.iterdir()) == ["_claim.json"] + [f"part-{k:05d}.parquet" for k in range(4)]
        n, pruned = duckdb.connect().execute(f"SELECT count(*), count(*) FILTER (pruned) FROM "
                                             f"read_parquet('{d}/*.parquet', union_by_name=true)").fetchone()
        assert n == 4 and pruned == sum(1 for p in here["points"] if p.get("pruned"))
        with pytest.raises(ConfigError, match="already holds 4 result part"):
            search(*args, results=where, **kw)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="a file, expected a directory"):
        search(*args, results=str(tmp_path / "file"), **kw)
    with pytest.raises(ConfigError, match="not a usable location"):
        search(*args, results="nosuchscheme://x/y", **kw)


def test_sweep_results_to_a_location_from_the_command_line(tmp_path, capsys):
    w = tmp_path / "w.csv"
    w.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" +
                 "".join(f"{i * 0.05},{100 + i},{20}\n" for i in range(40)))
    out = []
    for extra in ([], ["--results", str(tmp_path / "sweep")]):
        assert main(["sweep", str(w), "--rates", "5,10,20", "--slo-ttft-ms", "400", "--json", "--workers", "2",
                     *extra]) == 0
        out.append(json.loads(capsys.readouterr().out))
    assert out[0] == out[1]
    assert len(list((tmp_path / "sweep").glob("part-*.parquet"))) == 3


@pytest.mark.slow       # a local Ray starts in ~3 s
def test_ray_tasks_write_their_rows_to_the_shared_location(tmp_path):
    pytest.importorskip("ray")
    grid = {"max_seqs": [1, 8], "token_budget": [256, None]}
    args = (small_grid_workload(), SchedulerConfig("continuous", chunk=128), SM, grid, 10.0, SLO_)
    here = search(*args, workers=1)
    on_ray = search(*args, workers=2, ray="local", results=str(tmp_path / "r"))
    assert on_ray["points"] == here["points"] and on_ray["best"] == here["best"]
    assert len(list((tmp_path / "r").glob("part-*.parquet"))) == 4


def test_a_time_budget_starts_no_configuration_once_spent():
    """budget_s=0: the first wave (one configuration with one worker) runs, every later one is listed as
    not simulated; the one that ran equals the same configuration run without a budget."""
    w = workload(80)
    grid = {"max_seqs": [4, 16, 64]}
    full = search(w, SchedulerConfig("continuous"), SM, grid, 8.0, SLO_, target=0.9, workers=1)
    cut = search(w, SchedulerConfig("continuous"), SM, grid, 8.0, SLO_, target=0.9, workers=1, budget_s=0)
    assert cut["points"][0] == full["points"][0]
    assert [("not_run" in p) for p in cut["points"]] == [False, True, True] and cut["not_run"] == 2
    assert all("budget of 0 s was spent" in p["not_run"] for p in cut["points"][1:])
    assert cut["best"] == (full["points"][0] if full["points"][0].get("meets") else None)


def test_the_work_of_a_search_is_bounded_before_it_runs():
    from core.experiments.search import check_work, simulated_tokens
    w = workload(50)
    tokens = sum(r.prompt_tokens + r.max_output_tokens for r in w.requests)     # counted here
    grid = {"max_seqs": [1, 2, 4], "token_budget": [512, 1024]}
    assert simulated_tokens(w, grid) == 6 * tokens
    assert check_work(w, grid, 6 * tokens) == 6 * tokens
    with pytest.raises(ConfigError, match=f"6 configurations x {tokens:,} tokens of 50 requests"):
        check_work(w, grid, 6 * tokens - 1)
