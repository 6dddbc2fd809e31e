"""Outputs are never lost: files are replaced whole or not at all, a bad destination is
refused before any work, and an interrupted capture keeps what was served."""
import errno
import json

import pytest

from core.cli import check_writable, write_output
from core.engine import loop
from core.errors import InputError
from core.trace import parse_trace
from tests.conftest import DATA


def test_failed_write_keeps_the_existing_file(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("good")

    def fill_the_disk(p):
        p.write_text("half a tra")
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(InputError, match=r"--out .*out.json: cannot write \(No space left on device\)"):
        write_output(out, fill_the_disk, "--out")
    assert out.read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]   # no temporary left behind


def test_write_replaces_whole_and_keeps_the_suffix(tmp_path):
    out = tmp_path / "t.json.gz"
    seen = []
    write_output(out, lambda p: (seen.append(p.name), p.write_bytes(b"x")))
    assert out.read_bytes() == b"x" and seen[0].endswith("t.json.gz") and seen[0] != "t.json.gz"


@pytest.mark.parametrize("make, msg", [(lambda d: d / "missing" / "x.json", "does not exist"),
                                        (lambda d: d, "is a directory")])
def test_bad_destinations_are_refused_up_front(tmp_path, make, msg):
    with pytest.raises(InputError, match=msg):
        check_writable(make(tmp_path), "--out")


def test_cli_refuses_a_bad_destination_before_working(tmp_path, capsys):
    from core.__main__ import main as core_main
    from gpu_runner.__main__ import main as runner_main
    bad = tmp_path / "nope" / "x.json"
    assert core_main(["simulate", str(DATA / "workloads" / "burst5.json"), "--out", str(bad)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert runner_main(["capture", "--workload", str(DATA / "workloads" / "burst5.json"), "--out", str(bad)]) == 2
    assert "--out" in capsys.readouterr().err and not bad.parent.exists()


def test_interrupted_capture_writes_a_valid_partial_trace(tmp_path, monkeypatch, capsys):
    from gpu_runner.__main__ import main as runner_main
    real_run = loop.run

    def ctrl_c_after_4_steps(core, clock, on_output=None, inbox=None):
        def step(o):
            if on_output is not None:
                on_output(o)
            if core.num_steps >= 4:
                raise KeyboardInterrupt
        real_run(core, clock, on_output=step, inbox=inbox)
    monkeypatch.setattr(loop, "run", ctrl_c_after_4_steps)
    out = tmp_path / "partial.json"
    rc = runner_main(["capture", "--workload", str(DATA / "workloads" / "burst5.json"), "--out", str(out)])
    assert rc == 130
    assert "interrupted: wrote the partial trace" in capsys.readouterr().err
    tr = parse_trace(out.read_bytes(), out.name)
    assert len(tr.steps) == 4 and len(tr.finishes) < len(tr.requests)
    assert "interrupted after 4 steps" in tr.meta["notes"]
    assert json.loads(out.read_text())["meta"]["source"] == "measured"
