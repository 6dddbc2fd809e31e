"""Requests, token times and finishes rebuilt from a benchmark client's per-request records,
one request at a time, shared by every importer.

A client records when each streamed chunk arrived, not each token: a request's output tokens
are spread over its chunks, one per chunk with the remainder released with the last one (so
TTFT, E2E and TPOT = (E2E - TTFT) / (n - 1) are the client's own); when a client streamed more
chunks than tokens, the first n-1 chunk times and the last are kept. A client that records only
the first and last token times (guidellm) gets its tokens interpolated evenly between them.
"""
from __future__ import annotations

import math

import numpy as np

from core.errors import TraceError, WorkloadError, short
from core.trace.build import new_trace
from core.trace.model import Trace, frame
from core.trace.schema import FINISH, TOKEN, dtype
from core.workload import MAX_TIME_MS, MAX_TOKENS, Request, Workload

# What an import may hold is counted in bytes of token rows (a 490-byte file can claim 10**8 tokens):
# each output token is a row of the token table (t_ms, req, index, token_id: 8 bytes each; source: 1).
TOKEN_ROW_BYTES = sum(1 if f.type == "enum" else np.dtype(dtype(f)).itemsize for f in TOKEN.columns)
MAX_IMPORT_BYTES = 1 << 30                               # token rows of one file (building them: ~1.3x that)
MAX_IMPORT_TOKENS = MAX_IMPORT_BYTES // TOKEN_ROW_BYTES  # checked before allocating


def import_budget() -> str:
    """The cap on output tokens, in words (for messages)."""
    return (f"the {MAX_IMPORT_TOKENS:,} output tokens an import holds ({MAX_IMPORT_BYTES / 2**30:g} GiB of token "
            f"rows, {TOKEN_ROW_BYTES} bytes each)")


def finite(x) -> bool:
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:
        return False


def count(v, where: str, key: str) -> int:
    """A token count from a file: an integer in 0..MAX_TOKENS, else one clear error."""
    if not (finite(v) and float(v).is_integer() and 0 <= v <= MAX_TOKENS):
        raise TraceError(f"{where}: {key}: expected an integer in 0..{MAX_TOKENS}, got {short(v)}")
    return int(v)


def seconds(v, where: str, key: str, lo: float = 0.0) -> float:
    if not (finite(v) and v >= lo):
        raise TraceError(f"{where}: {key}: expected a number >= {lo:g}, got {short(v)}")
    return float(v)


class RequestRows:
    """Rows of an imported run; `trace(meta)` builds the Trace (requests sorted by arrival)."""

    def __init__(self, name: str, id_field: str = "request id"):
        self.name, self.id_field = name, id_field     # id_field: where the file keeps a request's id
        self.reqs, self.tok_j, self.tok_t, self.failed, self.finishes = [], [], [], [], []  # tok_j: tok_t[k]'s request
        self.merged = 0
        self.tokens = 0

    def _budget(self, n: int, where: str):
        self.tokens += n
        if self.tokens > MAX_IMPORT_TOKENS:
            raise TraceError(f"{where}: more than {import_budget()}")

    def fail(self, rid: str, at_ms: float, prompt_tokens: int, error: str, index: int | None = None,
             t_ms: float | None = None, reason: str = "error"):
        """A request that got no tokens (failed, or cancelled before its first token)."""
        self.failed.append({"index": len(self.reqs) if index is None else index, "id": rid, "error": error})
        self.reqs.append(Request(rid, at_ms, max(prompt_tokens, 1), 1, extra={"error": error}))
        self.finishes.append((len(self.reqs) - 1, max(at_ms, t_ms if t_ms is not None else at_ms), reason))

    def empty(self, rid: str, at_ms: float, prompt_tokens: int, t_ms: float | None = None, reason: str = "stop"):
        """A request that finished without output tokens."""
        self.reqs.append(Request(rid, at_ms, max(prompt_tokens, 1), 1))
        self.finishes.append((len(self.reqs) - 1, max(at_ms, t_ms if t_ms is not None else at_ms), reason))

    def add(self, rid: str, at_ms: float, prompt_tokens: int, chunk_ms, n_out: int, where: str,
            reason: str = "length", end_ms: float | None = None, error: str | None = None):
        """A request whose streamed chunks arrived at `chunk_ms` (absolute ms, non-decreasing)."""
        chunk_t = np.asarray(chunk_ms, dtype=float)
        if not len(chunk_t) or n_out <= 0:
            raise TraceError(f"{where}: a request with output needs at least one chunk time")
        if not (np.all(np.diff(chunk_t) >= 0) and chunk_t[0] >= at_ms):
            raise TraceError(f"{where}: chunk times must not decrease nor come before the request's start")
        if not chunk_t[-1] <= MAX_TIME_MS:
            raise TraceError(f"{where}: the last token at {chunk_t[-1]:g} ms is beyond the latest time "
                             f"{MAX_TIME_MS:g} ms")
        self._budget(n_out, where)
        if n_out >= len(chunk_t):
            counts = np.ones(len(chunk_t), dtype=np.int64)
            counts[-1] += n_out - len(chunk_t)
        else:  # more stream chunks than tokens: keep the first n-1 chunk times and the last
            self.merged += 1
            chunk_t = np.concatenate([chunk_t[: n_out - 1], chunk_t[-1:]])
            counts = np.ones(n_out, dtype=np.int64)
        self._tokens(rid, at_ms, prompt_tokens, np.repeat(chunk_t, counts), reason, end_ms, error)

    def add_interpolated(self, rid: str, at_ms: float, prompt_tokens: int, first_ms: float, last_ms: float,
                         n_out: int, where: str, reason: str = "length", end_ms: float | None = None,
                         error: str | None = None):
        """A request known only by its first and last token times: tokens evenly in between."""
        if not (at_ms <= first_ms <= last_ms <= MAX_TIME_MS):
            raise TraceError(f"{where}: expected start <= first token <= last token <= {MAX_TIME_MS:g} ms, got "
                             f"{at_ms:g}, {first_ms:g}, {last_ms:g}")
        self._budget(n_out, where)
        times = np.linspace(first_ms, last_ms, n_out) if n_out > 1 else np.array([first_ms])
        self._tokens(rid, at_ms, prompt_tokens, times, reason, end_ms, error)

    def _tokens(self, rid, at_ms, prompt_tokens, times, reason, end_ms, error):
        j = len(self.reqs)
        n = len(times)
        extra = {"error": error} if error else {}
        self.reqs.append(Request(rid, at_ms, max(prompt_tokens, 1), n, extra=extra))
        if error:
            self.failed.append({"index": j, "id": rid, "error": error})
        self.tok_j.append(j); self.tok_t.append(times)
        end = float(times[-1]) if end_ms is None else max(float(times[-1]), min(end_ms, MAX_TIME_MS))
        self.finishes.append((j, end, reason))

    def notes(self) -> list[str]:
        out = []
        if self.merged:
            out.append(f"{self.merged} request(s) streamed more chunks than output tokens; their extra chunk times "
                       "were merged, so their ITL gaps differ from the file's.")
        if self.failed:
            out.append(f"{len(self.failed)} failed request(s) are kept with a finish reason 'error' (or 'abort'); "
                       "those without tokens are excluded from latency statistics.")
        return out

    def trace(self, meta: dict) -> Trace:
        if not self.reqs:
            raise TraceError(f"{self.name}: the file lists no requests")
        first: dict[str, int] = {}
        for k, r in enumerate(self.reqs):
            j = first.setdefault(r.id, k)
            if j != k:
                raise TraceError(f"{self.name}: {self.id_field} {short(r.id, 60)} names two requests (record {j + 1} "
                                 f"and record {k + 1}); each request needs its own id")
        try:
            tr = new_trace(meta, Workload(self.reqs, name=self.name))
        except WorkloadError as e:
            raise TraceError(str(e) if str(e).startswith(self.name) else f"{self.name}: {e}") from None
        # Workload() sorted by arrival (stable); map our request index -> position in trace.
        pos = {rid: k for k, rid in enumerate(tr.ids)}
        order = np.array([pos[r.id] for r in self.reqs])
        if self.tok_t:     # one column at a time, the pieces freed as they are joined: ~1.3x the rows kept
            counts = np.fromiter(map(len, self.tok_t), np.int64, len(self.tok_t))
            t_ms, self.tok_t = np.concatenate(self.tok_t), []
            req = np.repeat(order[self.tok_j], counts)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            index = np.arange(len(t_ms))
            index -= first
            del first
            tr.tokens = frame(TOKEN, {"t_ms": t_ms, "req": req, "index": index})
        fin = self.finishes
        tr.finishes = frame(FINISH, {"t_ms": [f[1] for f in fin], "req": order[[f[0] for f in fin]],
                                     "reason": [f[2] for f in fin]})
        err_of = {f["id"]: f["error"] for f in self.failed}
        for k, rid in enumerate(tr.ids):
            if rid in err_of:
                tr.request_extra[k]["error"] = err_of[rid]
        return tr
