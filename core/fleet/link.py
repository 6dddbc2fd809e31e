"""The KV link between prefill and decode replicas: one link, shared fairly.

A transfer of `b` bytes that starts at `s` sends its bytes at the link's bandwidth `B`,
divided equally among the transfers sending at the same moment (processor sharing, as
BLIS's fair-share contention), and is done `latency` after its last byte left:
    alone:  dur = latency + b / B
    two equal transfers of b bytes started together: each dur = latency + 2b / B.
Bandwidth in GB/s (10**9 bytes per second, as BLIS's "25 GB/s"; not gigabits).
"""
from __future__ import annotations

import math

from core.errors import ConfigError


class Link:
    def __init__(self, gbps: float, latency_ms: float):
        for name, v, lo_ok in (("kv link bandwidth (GB/s)", gbps, False), ("kv link latency (ms)", latency_ms, True)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (v == 0 and not lo_ok):
                raise ConfigError(f"{name}: expected a finite number {'>= 0' if lo_ok else '> 0'}, got {v!r}")
        self.gbps = float(gbps)
        self.latency_ms = float(latency_ms)
        self.bytes_per_ms = self.gbps * 1e9 / 1e3
        self.t = 0.0                     # the time `left` describes
        self.left: dict = {}             # key -> bytes not yet sent (sending now)
        self.start: dict = {}            # key -> start time
        self.size: dict = {}             # key -> bytes
        self.sent_at: dict = {}          # key -> when its last byte left (latency still to run)

    def __len__(self) -> int:
        return len(self.left) + len(self.sent_at)

    def add(self, key, nbytes: int, t_ms: float):
        """Start a transfer at `t_ms` (not before the link's last event)."""
        self.advance(t_ms)
        self.start[key] = t_ms
        self.size[key] = nbytes
        if nbytes <= 0:
            self.sent_at[key] = t_ms
        else:
            self.left[key] = float(nbytes)

    def advance(self, t_ms: float):
        """Send bytes up to `t_ms` (fair shares, recomputed whenever a transfer's bytes run out)."""
        if t_ms <= self.t:
            return
        while self.left:
            share = self.bytes_per_ms / len(self.left)
            smallest = min(self.left.values())
            t_out = self.t + smallest / share
            if t_out > t_ms:
                sent = share * (t_ms - self.t)
                for k in self.left:
                    self.left[k] -= sent
                break
            for k in list(self.left):
                self.left[k] -= smallest
                if self.left[k] <= 1e-9 * max(1.0, self.size[k]):
                    del self.left[k]
                    self.sent_at[k] = t_out
            self.t = t_out
        self.t = t_ms

    def next_done_ms(self) -> float:
        """When the next transfer completes if none starts meanwhile (inf: none under way)."""
        best = min(self.sent_at.values(), default=math.inf) + self.latency_ms
        if self.left:
            share = self.bytes_per_ms / len(self.left)
            best = min(best, self.t + min(self.left.values()) / share + self.latency_ms)
        return best

    def pop_done(self, t_ms: float) -> list[tuple]:
        """Transfers complete by `t_ms`: (key, start, end, bytes), by end time."""
        self.advance(t_ms)
        done = sorted((s + self.latency_ms, k) for k, s in self.sent_at.items() if s + self.latency_ms <= t_ms)
        out = []
        for end, k in done:
            del self.sent_at[k]
            out.append((k, self.start.pop(k), end, self.size.pop(k)))
        return out

    def duration_alone_ms(self, nbytes: int) -> float:
        return self.latency_ms + nbytes / self.bytes_per_ms

    def to_dict(self) -> dict:
        return {"gbps": self.gbps, "latency_ms": self.latency_ms, "sharing": "fair (processor sharing), one link"}
