"""Whether the engine core runs compiled (setup.py: mypyc) or from source, and never a stale build.

`python setup.py build_ext --inplace` compiles core/engine's modules from their own .py files and
writes core/engine/_compiled.json, each compiled source's hash. Before any engine module is
imported (core/engine/__init__.py calls `guard`), the hashes are checked: where a source changed
after the build, or SERVING_EXPLORER_PURE=1 is set, every compiled module is loaded from its .py
file instead (all of them: compiled and plain modules of the engine do not mix), and `STATE` says
why. Benchmarks print `STATE` beside their numbers.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

STATE = "source (not built: python setup.py build_ext --inplace)"


class _FromSource:
    """A finder that loads the named engine modules from their .py files (not the extensions)."""

    def __init__(self, package: str, folder: Path, names):
        self.package, self.folder, self.names = package, folder, frozenset(names)

    def find_spec(self, name, path=None, target=None):
        pkg, _, mod = name.rpartition(".")
        if pkg == self.package and mod in self.names:
            return importlib.util.spec_from_file_location(name, self.folder / f"{mod}.py")
        return None


def guard(package: str, folder: str) -> str:
    """Decide, once, before the package's modules are imported; returns (and keeps) the state."""
    global STATE
    here = Path(folder)
    built = {p.name.split(".")[0] for p in here.iterdir() if p.name.endswith(tuple(EXTENSION_SUFFIXES))}
    if not built:
        return STATE
    try:
        hashes = json.loads((here / "_compiled.json").read_text())
    except (OSError, ValueError):
        hashes = {}
    stale = sorted(m for m in built | set(hashes) if not (here / f"{m}.py").is_file() or hashes.get(m) !=
                   hashlib.sha256((here / f"{m}.py").read_bytes()).hexdigest())
    if os.environ.get("SERVING_EXPLORER_PURE"):
        STATE = "source (SERVING_EXPLORER_PURE is set)"
    elif stale:
        STATE = (f"source: the build is older than {', '.join(f'{m}.py' for m in stale)} "
                 "(python setup.py build_ext --inplace)")
    else:
        STATE = "compiled (mypyc)"
        return STATE
    sys.meta_path.insert(0, _FromSource(package, here, built))
    return STATE
