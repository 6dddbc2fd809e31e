"""Where a command's time goes when the engine runs compiled (mypyc), which cProfile cannot see.

    python -m bench.compiled_profile [--hz 999] [--top 30] -- python -m core simulate W.csv ...

Runs the command under Linux `perf record` with DWARF call graphs (perf must be installed; it is
not a project dependency), then reads `perf script` and charges each sample to the innermost
compiled engine function on its stack (mypyc names them CPyDef_<module>___<Class>___<method>):
that function's own code and the CPython API it calls (list and dict operations, allocation,
reference counting), but not another compiled function it calls. Samples with no compiled frame
are grouped by what they are: imports, another thread (Parquet encoding, OpenBLAS), the
interpreter's start and end, or the innermost frame. Prints, per group, its share of the samples
(`own`) and of the samples where it is on the stack at all (`with callees`). perf's own
unwinding slows the run, so shares, not seconds, are the result; cProfile's, by contrast, count
Python calls only and inflate code that makes many (docs/benchmarks.md, issue 50).
"""
import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def samples(script: str):
    """(thread id, [frame symbols, innermost first]) per sample of `perf script` output."""
    tid, stack = None, []
    for line in script.splitlines():
        if not line.strip():
            if stack:
                yield tid, stack
            tid, stack = None, []
        elif line[0] in "\t ":
            parts = line.split()
            if len(parts) >= 2:
                stack.append(parts[1].split("+")[0])
        else:
            parts = line.split()
            tid = parts[1] if len(parts) > 1 else None
    if stack:
        yield tid, stack


def group(stack: list[str], main: bool) -> str:
    compiled = [s for s in stack if s.startswith("CPyDef_")]
    if compiled:
        return compiled[0].removeprefix("CPyDef_").replace("___", ".")
    if not main:
        arrow = any("parquet" in s or "arrow" in s for s in stack)
        return "another thread: " + ("OpenBLAS" if "blas_thread_server" in stack else
                                     "Parquet/Arrow" if arrow else stack[-1])
    if "Py_FinalizeEx" in stack:
        return "interpreter exit"
    if any("Import" in s for s in stack):
        return "imports"
    return "other: " + stack[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hz", type=int, default=999)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command to profile after --")
    if shutil.which("perf") is None:
        sys.exit("perf is not installed (Debian: apt-get install linux-perf)")
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "perf.data"
        subprocess.run(["perf", "record", "-q", "-F", str(a.hz), "--call-graph", "dwarf,16384", "-o", str(data),
                        *cmd], check=True, stdout=subprocess.DEVNULL)
        script = subprocess.run(["perf", "script", "-i", str(data)], check=True, capture_output=True,
                                text=True).stdout
    got = list(samples(script))
    # the interpreter's main thread: the one running Py_RunMain most (a launcher shim has its own)
    main_tid = collections.Counter(t for t, st in got if "Py_RunMain" in st).most_common(1)[0][0]
    own, seen = collections.Counter(), collections.Counter()
    total = 0
    for tid, stack in got:
        total += 1
        own[group(stack, tid == main_tid)] += 1
        for s in {s for s in stack if s.startswith("CPyDef_")}:
            seen[s.removeprefix("CPyDef_").replace("___", ".")] += 1
    print(f"{total:,} samples at {a.hz} Hz: {' '.join(cmd)}")
    print(f"{'own':>6} {'with callees':>12}  where")
    for name, n in own.most_common(a.top):
        print(f"{100 * n / total:5.1f}% {100 * seen.get(name, n) / total:11.1f}%  {name}")


if __name__ == "__main__":
    main()
