"""What refusing a hostile input costs beside accepting an ordinary one (issue 27): wall time and
peak memory of `python -m core` on each, side by side in one run, each in its own process.

    python -m bench.hostile_inputs

Cases: a small gzip trace (the baseline), a gzip bomb (2.5 GiB of zeros in 2.4 MB), a trace
padded with 1 GiB of whitespace inside its gzip, and a 10M-output-token workload simulated to
JSON (refused naming Parquet) and to Parquet (streamed)."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# A one-line wrapper per case, so each peak is that case's own (RUSAGE_CHILDREN is a running
# maximum over every child this process has waited for, which would carry one case into the next).
_WRAP = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")


def run(args: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS MiB, exit code) of python -m core ARGS in a fresh process."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _WRAP, sys.executable, "-m", "core", *args], cwd=ROOT,
                       capture_output=True, text=True)
    secs = time.perf_counter() - t
    return secs, int(r.stdout.split()[-1]) / 1024, r.returncode


def gz(path: Path, head: bytes, filler: bytes, repeat: int, tail: bytes):
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(c.compress(head))
        for _ in range(repeat):
            f.write(c.compress(filler))
        f.write(c.compress(tail) + c.flush())


def main() -> int:
    from bench.helpers import minimal
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        doc = json.dumps(minimal()).encode()
        gz(d / "small.json.gz", doc, b"", 0, b"")
        gz(d / "bomb.json.gz", b"", b"\0" * (1 << 26), 40, b"")
        gz(d / "padded.json.gz", doc[:-1], b" " * (1 << 26), 16, b"}")
        (d / "long.json").write_text(json.dumps({"requests": [{"id": "a", "arrival_ms": 0, "prompt_tokens": 4,
                                                               "max_output_tokens": 10_000_000}]}))
        cases = [("small gzip trace (baseline)", ["metrics", str(d / "small.json.gz")]),
                 ("gzip bomb, 2.5 GiB inflated (refused)", ["metrics", str(d / "bomb.json.gz")]),
                 ("1 GiB of padding inside gzip (opened)", ["metrics", str(d / "padded.json.gz")]),
                 ("10M tokens -> JSON (refused, names Parquet)", ["simulate", str(d / "long.json"), "--out",
                                                                 str(d / "o.json")]),
                 ("10M tokens -> Parquet (streamed)", ["simulate", str(d / "long.json"), "--out",
                                                       str(d / "o.parquet")])]
        rows = [(name, *run(args)) for name, args in cases]
    base_t, base_m = rows[0][1], rows[0][2]
    print(f"{'case':<46} {'exit':>4} {'seconds':>8} {'x base':>7} {'peak MiB':>9} {'x base':>7}")
    for name, secs, mib, rc in rows:
        print(f"{name:<46} {rc:>4} {secs:>8.2f} {secs / base_t:>7.1f} {mib:>9.0f} {mib / base_m:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
