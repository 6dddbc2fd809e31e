"""Running the same benchmark code in an older revision and in this checkout, side by side:
the older one from a temporary git worktree, each in its own Python process."""
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def worktree(rev: str, where: Path):
    """A detached worktree of `rev` at `where` (removed afterwards)."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev],
                   check=True, capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True)


@contextmanager
def built_worktree(rev: str):
    """A detached worktree of `rev` in a temporary folder, its engine compiled as this checkout's
    (`python setup.py build_ext --inplace`), removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp, worktree(rev, Path(tmp) / "base") as base:
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=base, check=True,
                       capture_output=True)
        yield base


def run_worker(tree: Path, code: str, args: dict, timeout_s: float = 3600) -> dict:
    """`python -c code json(args)` in `tree` (its own modules first); the JSON its last line prints."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=timeout_s)
    if p.returncode:
        raise SystemExit(f"worker failed in {tree}:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])
