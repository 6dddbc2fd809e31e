"""What the benchmarks share with the tests (the tests import these from here; bench imports
nothing from tests/): a page opened as the server runs it, a CLI run's peak memory, the smallest
valid trace, and summaries compared field by field."""
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def open_page(page, params=None):
    """The page as the server runs it: through app.py (page config, link checks, navigation);
    pages rerun themselves through app.py when started on their own (ui.ensure_app_frame)."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.switch_page(f"pages/{page}.py")
    for k, v in (params or {}).items():
        at.query_params[k] = v
    at.run()
    if at.exception:
        raise AssertionError(at.exception)
    return at


def peak_mib(argv, timeout_s: int = 600) -> tuple[int, str, int]:
    """(exit code, stderr, peak resident memory in MiB) of `python -m core ARGV` in its own process:
    VmHWM, the peak of that process's own memory since its exec (ru_maxrss would count the process
    it was forked from: Linux keeps the larger of the two across exec)."""
    code = ("import re, sys; from core.__main__ import main; rc = main(sys.argv[1:]); "
            "print(re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1), file=sys.stderr); "
            "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout_s,
                       cwd=str(ROOT))
    *err, rss_kib = r.stderr.rstrip("\n").split("\n")
    return r.returncode, "\n".join(err), int(rss_kib) // 1024


def minimal():
    """The smallest valid trace document: one request, two tokens, its finish."""
    return {"schema": "serving-trace/1", "meta": {"source": "given"},
            "requests": [{"id": "A", "arrival_ms": 0, "prompt_tokens": 4, "max_output_tokens": 2}],
            "events": [{"t_ms": 10, "type": "token", "req": "A", "index": 0},
                       {"t_ms": 20, "type": "token", "req": "A", "index": 1},
                       {"t_ms": 20, "type": "finish", "req": "A", "reason": "length"}]}


def differences(a, b, path=""):
    """Where two summaries differ (floats to 1e-9 relative: sums taken in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in {'the loaded trace' if k in a else 'out of core'}" for k in set(a) ^ set(b)]
        return out + [d for k in set(a) & set(b) for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(
            isinstance(x, (int, float)) for x in a + b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
            return [f"{path}: {a!r} vs {b!r}"]
        return []
    return [] if a == b else [f"{path}: {str(a)[:100]!r} vs {str(b)[:100]!r}"]


def comparable(summary: dict) -> dict:
    """Every field (the engine's KV-event summary too)."""
    return summary
