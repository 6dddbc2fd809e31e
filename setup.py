"""Compiles the engine core (core/engine) with mypyc: the same source, run as C extension modules.

    python setup.py build_ext --inplace        (the README's install commands run it)

The modules below are compiled from their own .py files (one source, never a second scheduler);
without a build, or with SERVING_EXPLORER_PURE=1 set, they run as plain Python with the same
results (tests/test_compiled.py compares the two). The build writes core/engine/_compiled.json,
the hash of every compiled source: core/engine/__init__.py runs the whole engine from source,
and says why, when a source changed after it was compiled (rebuild with the command above).
"""
import hashlib
import json
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
ENGINE = ROOT / "core" / "engine"
# the engine's step (scheduler, KV manager, block pool, prefix cache, policies, admission, request
# table, its outputs, the core and loop) and what records it (step log, KV log)
COMPILED = ("scheduler", "running", "kv_cache", "block_pool", "prefix_cache", "policies", "admission", "requests",
            "outputs", "core", "loop", "steplog", "kvlog")


def source_hashes() -> dict[str, str]:
    return {m: hashlib.sha256((ENGINE / f"{m}.py").read_bytes()).hexdigest() for m in COMPILED}


if __name__ == "__main__":
    from mypyc.build import mypycify

    stamp = ENGINE / "_compiled.json"
    stamp.unlink(missing_ok=True)   # (a failed build leaves the engine running from source)
    paths = [str((ENGINE / f"{m}.py").relative_to(ROOT)) for m in COMPILED]
    setup(name="serving-explorer-engine", py_modules=[],
          ext_modules=mypycify(["--ignore-missing-imports", "--follow-imports=silent",
                                "--disable-error-code", "annotation-unchecked", *paths],
                               opt_level="3", group_name="core_engine"))
    if "build_ext" in sys.argv:
        stamp.write_text(json.dumps(source_hashes(), indent=1) + "\n")
