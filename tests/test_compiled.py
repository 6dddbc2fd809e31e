"""The engine compiled by setup.py (mypyc) and the same source run as Python give the same traces,
and a build older than its source is never used (core.compiled).

The guard is tested on a package of its own (a module and a file named as its compiled extension
would be): a stale or missing stamp loads the .py file; a matching stamp prefers the extension,
as Python does. The equality test runs a set of simulations here and again in a process with
SERVING_EXPLORER_PURE=1 (the whole engine from source) and compares the trace documents' hashes;
it runs where the engine is built (the README's commands build it)."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import core.engine  # noqa: F401  (its import decides core.compiled.STATE)
from core import compiled

ROOT = Path(__file__).resolve().parents[1]

# each: a scheduler configuration and workload that takes a different path through the engine
RUNS = textwrap.dedent("""
    import hashlib, json
    import numpy as np
    from core import compiled
    from core.config import SchedulerConfig
    from core.fleet.router import RouterConfig
    from core.fleet.sim import FleetSpec, simulate_fleet
    from core.sim.simulate import simulate
    from core.sim.stepmodel import StepModel
    from core.trace import to_doc
    from core.workload import Request, Workload, load_workload

    def load(n, seed, shared=False):
        rng = np.random.default_rng(seed)
        t = np.cumsum(rng.exponential(3.0, n))
        rows = []
        for i in range(n):
            p, o = int(rng.integers(1, 300)), int(rng.integers(1, 90))
            ids = tuple(range(64)) + tuple(int(x) for x in rng.integers(100, 5000, p)) if shared else None
            rows.append(Request(f"q{i}", float(t[i]), p + (64 if shared else 0), o, prompt_ids=ids,
                                abort_at_ms=float(t[i]) + 150.0 if i % 7 == 3 else None,
                                deadline_ms=400.0 if i % 11 == 5 else None))
        return Workload(rows, name=f"load{seed}")

    affine = StepModel("affine", base_ms=2.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.05)
    out = {}
    for name, w, cfg in (
        ("continuous, chunked, preempting", load(300, 1), SchedulerConfig(max_seqs=32, token_budget=512, chunk=256,
                                                                          kv_blocks=250)),
        ("vllm-v1, prefix caching", load(200, 2, True), SchedulerConfig("vllm-v1", max_seqs=16, token_budget=512,
                                                                       chunk=256, kv_blocks=300, prefix_caching=True)),
        ("vllm-v0, prefix caching", load(200, 3, True), SchedulerConfig("vllm-v0", max_seqs=16, token_budget=1024,
                                                                       kv_blocks=300, prefix_caching=True)),
        ("sarathi", load(200, 4), SchedulerConfig("sarathi", max_seqs=16, token_budget=256, chunk=128)),
        ("orca, KV pressure", load(150, 5), SchedulerConfig("orca", max_seqs=16, token_budget=512, kv_blocks=120)),
        ("vllm-v1, a CPU tier under KV pressure", load(200, 7, True),   # (stores, loads, evictions, preemptions)
         SchedulerConfig("vllm-v1", max_seqs=16, token_budget=512, chunk=256, kv_blocks=90, prefix_caching=True,
                         kv_manager="vllm-v1", cpu_kv_blocks=400, kv_block_bytes=1 << 16, host_gbps=10.0))):
        doc = to_doc(simulate(w, cfg, affine, created="2026-01-01T00:00:00Z"))
        out[name] = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
    for spec_name, spec in (
        ("fleet, least-kv", FleetSpec.uniform(3, SchedulerConfig(prefix_caching=True, max_seqs=16), affine,
                                              router=RouterConfig("least-kv"))),
        ("fleet, disaggregated", FleetSpec.disagg(1, 2, SchedulerConfig(prefix_caching=True), affine,
                                                  kv_bytes_per_token=1000, link_gbps=1.0))):
        doc = to_doc(simulate_fleet(load(200, 6, True), spec, created="2026-01-01T00:00:00Z"))
        out[spec_name] = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
    print(json.dumps({"state": compiled.STATE, "runs": out}))
""")


def _runs(pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SERVING_EXPLORER_PURE"}
    if pure:
        env["SERVING_EXPLORER_PURE"] = "1"
    p = subprocess.run([sys.executable, "-c", RUNS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not compiled.STATE.startswith("compiled"),
                    reason=f"engine not compiled here ({compiled.STATE}); the README's commands build it")
def test_compiled_and_source_give_the_same_traces():
    built, source = _runs(False), _runs(True)
    assert built["state"] == "compiled (mypyc)"
    assert source["state"] == "source (SERVING_EXPLORER_PURE is set)"
    assert len(built["runs"]) == 8
    for name, h in built["runs"].items():
        assert source["runs"][name] == h, f"{name}: the compiled engine's trace differs from the source's"


def _package(tmp_path: Path, stamp: str | None) -> Path:
    """A package `pkgx` with module m (X = 1) beside a file named as m's compiled extension (not a
    loadable one: importing it fails), guarded as core/engine is."""
    pkg = tmp_path / "pkgx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from core.compiled import guard\n\nguard(__name__, __path__[0])\n")
    (pkg / "m.py").write_text("X = 1\n")
    (pkg / f"m{EXTENSION_SUFFIXES[0]}").write_bytes(b"not a shared object")
    if stamp == "matching":
        (pkg / "_compiled.json").write_text(json.dumps({"m": hashlib.sha256(b"X = 1\n").hexdigest()}))
    elif stamp == "stale":
        (pkg / "_compiled.json").write_text(json.dumps({"m": hashlib.sha256(b"X = 0\n").hexdigest()}))
    return tmp_path


def _import_m(path: Path, pure: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{path}{os.pathsep}{ROOT}"}
    env.pop("SERVING_EXPLORER_PURE", None)
    if pure:
        env["SERVING_EXPLORER_PURE"] = "1"
    code = "import pkgx.m, core.compiled as c; print(pkgx.m.X, '|', c.STATE)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("stamp", ["stale", None])
def test_a_build_older_than_its_source_is_not_used(tmp_path, stamp):
    p = _import_m(_package(tmp_path, stamp))
    assert p.returncode == 0, p.stderr
    x, state = p.stdout.strip().split(" | ")
    assert x == "1" and state.startswith("source: the build is older than m.py")


def test_a_matching_build_is_preferred_and_pure_turns_it_off(tmp_path):
    path = _package(tmp_path, "matching")
    p = _import_m(path)            # the extension is what Python loads: this one is not loadable
    assert p.returncode != 0 and "ImportError" in p.stderr
    p = _import_m(path, pure=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "1 | source (SERVING_EXPLORER_PURE is set)"
