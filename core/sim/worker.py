"""A worker process of core.sim.parallel's pool: `python -m core.sim.worker` (started by the pool, not
by hand). Jobs arrive pickled on stdin from the process that started it; results go back on
stdout, which nothing else may write to (print() goes to stderr here)."""
import sys

import core.analysis.compare
import core.sim.sweep  # noqa: F401
from core.cli import no_hugepage_advice
from core.sim.parallel import serve

if __name__ == "__main__":
    no_hugepage_advice()
    out = sys.stdout.buffer
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, out)
