"""Argument types and the one-line-error parser shared by the command lines
(python -m core, python -m gpu_runner)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the whole usage otherwise)
        raise SystemExit(fail(f"{self.prog}: {message}"))


def fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def no_hugepage_advice() -> None:
    """Stop numpy from asking the kernel for transparent huge pages on large arrays (its
    madvise(MADV_HUGEPAGE)), unless the user set NUMPY_MADVISE_HUGEPAGE. Where the kernel's
    THP defrag setting is "madvise" (this dev machine), every such request can compact memory
    synchronously: a 10,000-request simulation spent 0.3 s of its ~1 s in the kernel, 0.07 s
    without the advice (docs/benchmarks.md, round 6). Idempotent; numpy's switch is private,
    so a numpy without it is left as it is."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    import numpy as np
    switch = getattr(getattr(np, "_core", None), "multiarray", None)
    switch = getattr(switch, "_set_madvise_hugepage", None)
    if switch is not None:
        switch(False)


def run(parser, commands: dict, argv=None) -> int:
    """Parse, dispatch to commands[args.cmd]; bad input becomes exit code 2 and one line."""
    from core.errors import InputError
    no_hugepage_advice()
    try:
        a = parser.parse_args(argv)
        note_inputs(a)
        return commands[a.cmd](a)
    except InputError as e:
        return fail(str(e))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except MemoryError:   # (a process limit such as ulimit -v, or the machine's memory: said, not a traceback)
        return fail("out of memory: this command needed more memory than the process may use (ulimit -v, a "
                    "container's limit, or the machine's); try fewer requests, Parquet output (written as it is "
                    "simulated), or --out-of-core where the command has it")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `... | head` closed the pipe: stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # so the interpreter's final flush cannot fail again
        return 141


def _converter(parse, ok, expected: str):
    """An argparse type: parse the text, check it, or say what was expected."""
    def convert(s):
        try:
            v = parse(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}")
        return v
    return convert


positive_int = _converter(int, lambda v: v >= 1, "a positive integer")
nonneg_int = _converter(int, lambda v: v >= 0, "an integer >= 0")
any_int = _converter(int, lambda v: True, "an integer")
nonneg_float = _converter(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
finite_float = _converter(float, math.isfinite, "a finite number")
positive_float = _converter(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def list_of(convert, expected: str):
    """An argparse type: comma-separated values, each through `convert`."""
    def parse(s):
        parts = [x.strip() for x in s.split(",")]
        if not s.strip() or any(not x for x in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {expected}, got {s!r}")
        return [convert(x) for x in parts]
    return parse


def add_slo_flags(p):
    g = p.add_argument_group("SLOs (a request meets them when it completed and every given bound holds)")
    for name, what in (("ttft", "time to first token"), ("tpot", "time per output token"),
                       ("e2e", "end-to-end latency")):
        g.add_argument(f"--slo-{name}-ms", type=positive_float, metavar="MS", help=f"bound on {what}")


def _where(path, flag: str) -> str:
    return f"{flag + ' ' if flag else ''}{path}"


# The arguments that name what a command writes; every other argument naming an existing file or
# directory is one of its inputs, which no output may replace (`simulate W --out W` replaced the
# workload with a trace; `fleet-merge R0 R1 --out R0` a replica's trace with the fleet's).
OUTPUT_DESTS = frozenset({"out", "csv", "chrome", "trace_out", "results", "out_dir"})
_INPUTS: list[tuple[str, tuple[int, int]]] = []      # (as given, (device, inode)) of this run's inputs


def note_inputs(a) -> None:
    """Record the existing files and directories the parsed arguments `a` name (outside OUTPUT_DESTS)."""
    _INPUTS.clear()
    for dest, v in vars(a).items():
        if dest in OUTPUT_DESTS:
            continue
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(x, (str, Path)) and str(x):
                try:
                    st = os.stat(x)
                except (OSError, ValueError):
                    continue
                _INPUTS.append((str(x), (st.st_dev, st.st_ino)))


def check_not_input(path, flag: str = "") -> None:
    """Refuse an output that is (or links to) one of the command's inputs."""
    from core.errors import InputError
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    for given, ident in _INPUTS:
        if (st.st_dev, st.st_ino) == ident:
            raise InputError(f"{_where(path, flag)}: is {'' if str(given) == str(path) else 'the same file as '}"
                             f"an input of this command ({given}); write the output elsewhere (the input is left as "
                             "it is)")


def check_writable(path, flag: str = "", directory_ok: bool = True):
    """Refuse an output path before any work is done: its directory must exist and be
    writable, and the path must not be a directory (nor end with / when `directory_ok` is
    False: the output is one file) nor a socket; a device or FIFO must be writable itself."""
    import stat

    from core.errors import InputError
    p = Path(path)
    check_not_input(path, flag)
    if str(path).endswith("/") and not directory_ok:
        raise InputError(f"{_where(path, flag)}: ends with / (a directory); this output is one file: name it")
    try:
        mode = os.stat(p).st_mode
    except OSError:
        mode = None
    if mode is not None and _is_node(mode):
        if not os.access(p, os.W_OK):
            raise InputError(f"{_where(path, flag)}: is not writable")
        return
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InputError(f"{_where(path, flag)}: is neither a regular file nor a device or FIFO (a socket?); "
                         "name a file")
    parent = p.parent if str(p.parent) else Path(".")
    if str(path).endswith("/"):   # a partitioned trace: a directory of Parquet parts
        if p.is_dir() and any(not q.name.endswith(".parquet") for q in p.iterdir()):
            raise InputError(f"{_where(path, flag)}: holds files other than Parquet parts; name a new or "
                             "empty directory")
    elif p.is_dir():
        raise InputError(f"{_where(path, flag)}: is a directory (expected a file name; end it with / to write "
                         "a directory of Parquet parts)")
    if not parent.is_dir():
        raise InputError(f"{_where(path, flag)}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{_where(path, flag)}: directory {parent} is not writable")


def _write_directory(p: Path, write, flag: str):
    """write(tmp + "/") into a new directory beside `p`, then swap it in: an existing
    directory of parts is replaced whole or not at all."""
    import shutil

    from core.errors import InputError
    tmp = p.with_name(f".partial-{os.getpid()}-{p.name}")
    old = p.with_name(f".old-{os.getpid()}-{p.name}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        write(f"{tmp}/")
        if p.exists():
            os.replace(p, old)
        os.replace(tmp, p)
    except OSError as e:
        raise InputError(f"{_where(p, flag)}: cannot write ({e.strerror})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _is_node(mode: int) -> bool:
    """Whether a file mode is a character or block device's or a FIFO's (written through, never replaced)."""
    import stat
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)


def _stat_or_none(target: Path, path, flag: str):
    """os.stat(target), None when nothing is there; any other OSError as one line naming the flag and path."""
    from core.errors import InputError
    try:
        return os.stat(target)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(f"{_where(path, flag)}: cannot write ({e.strerror})") from None


def _write_through(target: Path, fifo: bool, write, path, flag: str, name: str) -> None:
    """write(tmp) into a temporary directory, then its bytes into the device or FIFO node `target`."""
    import tempfile

    from core.errors import InputError
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / f".partial-{os.getpid()}-{name}"
        try:
            write(tmp)
            _copy_into(tmp, target, fifo)
        except OSError as e:
            raise InputError(f"{_where(path, flag)}: cannot write ({e.strerror})") from None


def _replace_whole(target: Path, st, write, path, flag: str) -> None:
    """write(tmp) beside `target`, then rename it over `target` (given the mode and, when allowed,
    the owner of the regular file `st` there); the temporary file is removed whatever happens."""
    import stat

    from core.errors import InputError
    tmp = target.with_name(f".partial-{os.getpid()}-{target.name}")
    try:
        write(tmp)
        if st is not None and stat.S_ISREG(st.st_mode) and tmp.is_file():
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except PermissionError:
                pass          # another owner's file in a writable directory: ours now, as any editor does
        os.replace(tmp, target)
    except OSError as e:
        raise InputError(f"{_where(path, flag)}: cannot write ({e.strerror})") from None
    finally:
        if tmp.is_dir():
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def write_output(path, write, flag: str = ""):
    """write(tmp) to a temporary file, then put it at `path` without damaging what is there:
    - a regular file (or a new path) is replaced whole or not at all (a full disk or a kill
      mid-write leaves it intact), keeping the file's mode and, when allowed, its owner;
    - a symlink is written through: its target is replaced that way, the link stays;
    - a character or block device or a FIFO is written through (its node stays), a FIFO only
      when a process is reading it;
    - anything else (a socket) is refused.
    The temporary name ends like `path`, so writers that choose the format by suffix agree.
    An OSError becomes one line naming the flag and path."""
    import stat

    from core.errors import InputError
    p = Path(path)
    check_not_input(path, flag)
    if str(path).endswith("/"):
        return _write_directory(p, write, flag)
    target = Path(os.path.realpath(p)) if p.is_symlink() else p
    st = _stat_or_none(target, path, flag)
    mode = st.st_mode if st is not None else None
    special = mode is not None and _is_node(mode)
    if mode is not None and not (special or stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InputError(f"{_where(path, flag)}: is neither a regular file nor a device or FIFO (a socket?); "
                         "name a file")
    if special:
        _write_through(target, stat.S_ISFIFO(mode), write, path, flag, p.name)
    else:
        _replace_whole(target, st, write, path, flag)
    return None


def _copy_into(src: Path, node: Path, fifo: bool):
    """src's bytes written into a device or FIFO node (never replacing it). A FIFO is opened
    without blocking first: with no reader that fails at once (ENXIO) instead of hanging."""
    flags = os.O_WRONLY | (os.O_NONBLOCK if fifo else 0)
    try:
        fd = os.open(node, flags)
    except OSError as e:
        if fifo and e.errno == 6:     # ENXIO
            raise OSError(e.errno, "no process is reading the FIFO") from None
        raise
    try:
        if fifo:
            os.set_blocking(fd, True)
        with open(src, "rb") as f:
            while chunk := f.read(1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
        if not fifo:
            try:
                os.fsync(fd)
            except OSError as e:
                if e.errno not in (22, 25):     # EINVAL / ENOTTY: a node that does not sync
                    raise
    finally:
        os.close(fd)


class Progress:
    """A one-line progress bar on stderr: progress(done, total), redrawn at most every 0.2 s."""

    def __init__(self, total_label="tokens"):
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.label = total_label

    def __call__(self, done, total):
        now = time.perf_counter()
        if now - self.last < 0.2 and done < total:
            return
        self.last = now
        width = 30
        fill = int(width * done / max(total, 1))
        rate = done / max(now - self.t0, 1e-9)
        print(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {self.label} ({rate:,.0f}/s)",
              end="", file=sys.stderr, flush=True)
        if done >= total:
            print(file=sys.stderr)
