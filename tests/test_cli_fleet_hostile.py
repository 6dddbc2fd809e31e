"""Hostile flags and files on the fleet's command line (issue 48, items 25-37): each gets one line
naming what is wrong and a non-zero exit, and never replaces an input or a file it cannot finish."""
import pytest

from core.__main__ import main
from tests.conftest import DATA

SHARED = str(DATA / "workloads" / "shared_prefix_200.json")


def one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize("param", ["balance_abs=inf", "cache_threshold=inf", "balance_rel=nan", "prefix=-1"])
@pytest.mark.parametrize("command", ["simulate", "sweep", "search"])
def test_a_router_parameter_that_is_not_a_finite_number_is_one_line(tmp_path, capsys, command, param):
    """Item 35: `--router-param ...=inf` ended simulate and sweep in a ValueError traceback ("min() arg is
    an empty sequence") and search --json in "Out of range float values are not JSON compliant"."""
    policy = "weighted" if param.startswith("prefix=") else "prefix-aware"
    extra = {"simulate": ["--out", str(tmp_path / "o.json")], "sweep": ["--rates", "5"],
             "search": ["--rate", "5", "--grid", "max_seqs=8,16", "--slo-ttft-ms", "500", "--json"]}[command]
    rc = main([command, SHARED, "--replicas", "2", "--router", policy, "--router-param", param, *extra])
    assert rc == 2
    one_line_error(capsys, f"router parameter {param.split('=')[0]}: expected a finite number >= 0")
    assert not (tmp_path / "o.json").exists()


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, capsys):
    """Item 25: `simulate W --out W` and `fleet-merge R0 R1 --out R0` (also through a symlink to an
    input) exited 0 and replaced the input (a Mooncake .jsonl became a JSON trace)."""
    import shutil
    w = tmp_path / "w.jsonl"
    shutil.copy(DATA / "workloads" / "mooncake_conversation_500.jsonl", w)
    before = w.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(w)
    for out in (w, link):
        assert main(["simulate", str(w), "--out", str(out)]) == 2
        one_line_error(capsys, "is ", "an input of this command", str(w))
        assert w.read_bytes() == before and link.is_symlink()
    r0, r1 = tmp_path / "r0.json", tmp_path / "r1.json"
    for r in (r0, r1):
        assert main(["simulate", str(DATA / "workloads" / "burst5.json"), "--out", str(r)]) == 0
    capsys.readouterr()
    kept = r0.read_bytes()
    assert main(["fleet-merge", str(r0), str(r1), "--out", str(r0)]) == 2
    one_line_error(capsys, "an input of this command")
    assert r0.read_bytes() == kept
    assert main(["fleet-merge", str(r0), str(r1), "--out", str(tmp_path / "fleet.json")]) == 0
