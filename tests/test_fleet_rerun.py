"""`gpu_runner fleet` run again with the same --trace-out (issue 48 item 26): each run merges only
its own replicas' traces (TRACE_OUT.replicas/ is cleared of the previous run's), so a replica
that serves nothing the second time does not bring back the first run's file; and flags that
cannot work (a router parameter that is not a finite number >= 0, item 35) are refused in one
line, exit 2, before any replica starts. Servers are started and stopped here on loopback, every
wait bounded and waiting on state."""
import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.conftest import ROOT
from tests.helpers import free_port

BOUND_S = 120      # a bound on any one wait, never an expected duration


def run_fleet(trace_out, n_requests):
    """One fleet run of two round-robin replicas: n_requests answered, then SIGTERM; its log."""
    from deploy.serve import wait_healthy
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpu_runner", "fleet", "--port", str(port), "--trace-out",
                             str(trace_out), "--replicas", "2", "--kv-blocks", "64", "--threads", "1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, BOUND_S, [proc], path="/health")
        for k in range(n_requests):
            r = httpx.post(f"{url}/v1/completions", json={"prompt": f"Request {k}: ", "max_tokens": 4,
                                                          "temperature": 0}, timeout=BOUND_S)
            assert r.status_code == 200, r.text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            log = proc.communicate(timeout=BOUND_S)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            log = proc.communicate(timeout=30)[0]
    return proc.returncode, log


@pytest.mark.slow
def test_a_second_run_with_the_same_trace_out_writes_its_own_trace(tmp_path):
    from core.trace import load_trace
    out = tmp_path / "fleet.json.gz"
    rc, log = run_fleet(out, 4)                       # both replicas serve: both write traces
    assert rc == 0, log
    replicas = tmp_path / "fleet.json.gz.replicas"
    assert {p.name for p in replicas.iterdir()} == {"replica-0.json.gz", "replica-1.json.gz"}
    assert len(load_trace(out).requests) == 4
    (replicas / "replica-7.json.gz").write_bytes(b"an older run's, with more replicas")
    (replicas / "notes.txt").write_text("not a replica trace: kept")

    rc, log = run_fleet(out, 1)                       # replica 1 serves nothing: a trace of 0 requests
    assert rc == 0, log
    assert f"wrote {out}: 1 requests" in log, log
    assert {p.name for p in replicas.iterdir()} == {"replica-0.json.gz", "replica-1.json.gz", "notes.txt"}
    assert len(load_trace(replicas / "replica-1.json.gz").requests) == 0    # this run's, not the last run's
    tr = load_trace(out)
    assert len(tr.requests) == 1 and tr.finishes["replica"].tolist() == [0]


def test_the_replicas_trace_directory_is_cleared_of_earlier_runs_only(tmp_path):
    from gpu_runner.fleet_serve import replica_trace_dir
    out = tmp_path / "t.json.gz"
    d = replica_trace_dir(out)
    assert d == tmp_path / "t.json.gz.replicas" and d.is_dir()
    for name in ("replica-0.json.gz", "replica-3.json.gz", ".partial-123-replica-1.json.gz", "mine.json", "x.txt"):
        (d / name).write_text("x")
    (d / "replica-dir").mkdir()
    assert replica_trace_dir(out) == d
    assert {p.name for p in d.iterdir()} == {"mine.json", "x.txt", "replica-dir"}


@pytest.mark.parametrize("param", ["cache_threshold=inf", "cache_threshold=-1", "balance_abs=inf",
                                   "balance_rel=nan"])
def test_a_router_parameter_that_cannot_work_is_refused_before_any_replica_starts(param, capsys, monkeypatch):
    import gpu_runner.fleet_serve
    from gpu_runner.__main__ import main

    def no_replicas(*a, **k):
        raise AssertionError("a replica was started")
    monkeypatch.setattr(gpu_runner.fleet_serve, "FleetClient", no_replicas)   # (what main_fleet calls)
    assert main(["fleet", "--router", "prefix-aware", "--router-param", param, "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    key = param.split("=")[0]
    assert err.count("\n") == 1 and f"router parameter {key}: expected a finite number >= 0" in err, err


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan"])
def test_a_stall_timeout_that_cannot_work_is_refused(value, capsys):
    from gpu_runner.__main__ import main
    assert main(["fleet", "--replica-stall-s", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--replica-stall-s: expected a finite number > 0" in err, err
