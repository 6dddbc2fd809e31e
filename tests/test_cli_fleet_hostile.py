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
