"""Argument types and the one-line-error parser shared by the command lines
(python -m core, python -m gpu_runner)."""
from __future__ import annotations

import argparse
import math
import sys


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the whole usage otherwise)
        raise SystemExit(fail(f"{self.prog}: {message}"))


def fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def run(parser, commands: dict, argv=None) -> int:
    """Parse, dispatch to commands[args.cmd]; bad input becomes exit code 2 and one line."""
    from core.errors import InputError
    try:
        a = parser.parse_args(argv)
        return commands[a.cmd](a)
    except InputError as e:
        return fail(str(e))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        return 130


def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def nonneg_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {s!r}")
    return v


def finite_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {s!r}")
    return v


def nonneg_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}")
    return v


def any_int(s):
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
