"""`--results LOCATION` (core.sim.shared, issue 36 item 21): a location is claimed for one run before any
job runs, so two runs started together never share one; a location that cannot be written or that
holds anything is refused in one line before any work; only this run's parts are read back."""
import os
import threading

import pytest

from core.__main__ import main
from core.errors import ConfigError
from core.sim import parallel, shared
from tests.helpers import unwritable_dir

CALLS: list = []


def square(x: int) -> dict:
    CALLS.append(x)
    return {"x": x, "square": x * x}


def fails(x: int) -> dict:
    raise ConfigError(f"job {x}: refused")


@pytest.fixture(autouse=True)
def _calls():
    CALLS.clear()
    yield
    CALLS.clear()


def jobs(n=4, base=0):
    return [{"x": base + k} for k in range(n)]


def test_a_location_is_claimed_atomically_so_the_second_of_two_runs_is_refused(tmp_path, monkeypatch):
    """Two runs that both found the location empty (the check precedes any write): the claim is an
    exclusive create, so the second is refused before its first job and the first's rows are its own."""
    loc = str(tmp_path / "runs")
    first = shared.prepare(loc, 4)
    monkeypatch.setattr(shared, "_entries", lambda fs, path: [])      # the second listed before the claim
    with pytest.raises(ConfigError, match="claimed by another run started at the same time"):
        shared.prepare(loc, 4)
    monkeypatch.undo()
    assert first and sorted(os.listdir(loc)) == [shared.CLAIM]


def test_two_runs_started_together_on_one_location_never_mix(tmp_path):
    """Started together from two threads: exactly one run gets the location; its results are its own
    jobs' (squares of 0..3 or of 100..103), the other is refused in one line having run nothing."""
    loc = str(tmp_path / "runs")
    start, out = threading.Barrier(2), {}

    def run(base):
        start.wait(timeout=60)
        try:
            out[base] = parallel.run_all(square, jobs(4, base), workers=1, results=loc)
        except ConfigError as e:
            out[base] = e
    threads = [threading.Thread(target=run, args=(b,)) for b in (0, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    won = [b for b in (0, 100) if isinstance(out[b], list)]
    lost = [b for b in (0, 100) if isinstance(out[b], ConfigError)]
    assert len(won) == 1 and len(lost) == 1, out
    assert out[won[0]] == [{"x": won[0] + k, "square": (won[0] + k) ** 2} for k in range(4)]
    assert "claimed by another run" in str(out[lost[0]]) or "already holds" in str(out[lost[0]])
    assert sorted(CALLS) == [won[0] + k for k in range(4)]          # the refused run ran no job


def test_an_unwritable_location_is_refused_before_any_work(tmp_path):
    ro = unwritable_dir(tmp_path, empty=True)
    for loc in (ro, ro / "new"):
        with pytest.raises(ConfigError, match=f"--results {loc}: cannot write there"):
            parallel.run_all(square, jobs(), workers=1, results=str(loc))
        assert CALLS == []


def test_a_location_holding_an_unrelated_file_is_refused_before_any_work_and_left_as_it_is(tmp_path):
    loc = tmp_path / "runs"
    loc.mkdir()
    (loc / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds 1 other file\(s\) \('notes.txt'"):
        parallel.run_all(square, jobs(), workers=1, results=str(loc))
    assert CALLS == [] and sorted(os.listdir(loc)) == ["notes.txt"] and (loc / "notes.txt").read_text() == "mine"
    (loc / "notes.txt").unlink()                        # then the next run on it works
    assert parallel.run_all(square, jobs(), workers=1, results=str(loc)) == [{"x": k, "square": k * k}
                                                                            for k in range(4)]
    assert sorted(os.listdir(loc)) == [shared.CLAIM] + [f"part-{k:05d}.parquet" for k in range(4)]
    with pytest.raises(ConfigError, match="already holds 4 result part"):    # a finished run's location
        parallel.run_all(square, jobs(), workers=1, results=str(loc))


def test_a_run_that_fails_before_its_first_part_gives_the_location_back(tmp_path):
    loc = str(tmp_path / "runs")
    with pytest.raises(ConfigError, match="job 0: refused"):
        parallel.run_all(fails, jobs(), workers=1, results=loc)
    assert os.listdir(loc) == []
    assert parallel.run_all(square, jobs(2), workers=1, results=loc) == [{"x": 0, "square": 0}, {"x": 1, "square": 1}]


def test_only_this_runs_parts_are_read_back(tmp_path):
    loc = str(tmp_path / "runs")
    parallel.run_all(square, jobs(2), workers=1, results=loc)
    with pytest.raises(ConfigError, match="parts of another run mixed in"):
        shared.gather(loc, 2, run="some-other-run")


def test_the_command_line_names_a_refused_location_in_one_line(tmp_path, capsys):
    w = tmp_path / "w.csv"
    w.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" +
                 "".join(f"{i * 0.05},{100 + i},{20}\n" for i in range(20)))
    loc = tmp_path / "runs"
    loc.mkdir()
    (loc / "notes.txt").write_text("mine")
    assert main(["sweep", str(w), "--rates", "5,10", "--json", "--workers", "1", "--results", str(loc)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(loc) in err[0] and "notes.txt" in err[0], err
    assert sorted(os.listdir(loc)) == ["notes.txt"]          # refused before any point was simulated
