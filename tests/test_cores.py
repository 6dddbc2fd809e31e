"""Issue 53 item 2: `--cores` pins the engine as vLLM's CPU build binds its worker (its HTTP server on
the other cores): checked on the processes' own affinity masks, read from the OS."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from gpu_runner.launch import core_set
from tests.conftest import ROOT
from tests.helpers import free_port, stop_process

ALLOWED = os.sched_getaffinity(0)


def test_a_core_list_is_read_and_checked():
    first = min(ALLOWED)
    assert core_set(str(first)) == {first}
    assert core_set(f"{first}-{first}") == {first}
    with pytest.raises(ConfigError, match="expected a list"):
        core_set("x")
    with pytest.raises(ConfigError, match="may not run on"):
        core_set(str(max(ALLOWED) + 1000))


def _children(pid: int) -> list[int]:
    kids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(p.name))
            except (OSError, IndexError, ValueError):
                pass
    return kids


@pytest.mark.skipif(len(ALLOWED) < 2, reason="pinning the engine apart needs two cores")
def test_serve_pins_its_engine_and_puts_its_server_on_the_other_cores():
    from deploy.serve import wait_healthy
    core = max(ALLOWED)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpu_runner", "serve", "--port", str(port), "--threads", "1",
                             "--cores", str(core), "--kv-blocks", "64"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 60, [proc], path="/health")
        masks = {k: os.sched_getaffinity(k) for k in _children(proc.pid)}
        assert {core} in masks.values(), masks                         # the engine process
        assert os.sched_getaffinity(proc.pid) == ALLOWED - {core}       # the HTTP server
    finally:
        stop_process(proc)
