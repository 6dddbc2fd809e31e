"""What a router knows of one replica, as of a time: one board for the simulated fleet
(core.fleet.sim) and the real one (gpu_runner.fleet). Both tell it news as it happens, stamped
with when it happened (the simulator may tell a step's end at the step's start), and the router
reads it as of now less its staleness: the news up to then, applied in time order (ties: in the
order told).

News: `requests` (+1 routed there, -1 finished), `gauges` (running, waiting, KV blocks used, at a
step's end), `run` (a run of steps' gauges: (times, running, waiting, used, 0), each applied as its
step's end falls due), `kv` (the prefix cache's news: [(+1 cached | -1 evicted, hash)]; a CPU tier's
under it: +2 stored there | -2 evicted from it).
"""
from __future__ import annotations

import bisect
import heapq
import threading


class Board:
    """`requests`, `running`, `waiting`, `kv_used`, `cached` (hashes) as of the last `as_of`, and
    `t_ms`, the time of the latest news applied. `shared`: told from several threads (a real fleet's
    reader threads) and folded as it grows: past FOLD_AT news queued, what is older than the
    newest less the staleness is applied (the router never reads earlier than that)."""

    FOLD_AT = 4096

    def __init__(self, staleness_ms: float = 0.0, shared: bool = False):
        self.staleness_ms = staleness_ms
        self.news: list = []      # heap of (t_ms, seq, kind, value)
        self.seq = 0
        self.requests = self.running = self.waiting = self.kv_used = 0
        self.cached: set = set()
        self.cpu: set = set()     # hashes in the replica's CPU tier (core.kvtier)
        self.t_ms = 0.0
        self.lock = threading.Lock() if shared else None

    def tell(self, t_ms: float, kind: str, value) -> None:
        if self.lock is None:
            self.seq += 1
            heapq.heappush(self.news, (t_ms, self.seq, kind, value))
            return
        with self.lock:
            self.seq += 1
            heapq.heappush(self.news, (t_ms, self.seq, kind, value))
            full = len(self.news) > self.FOLD_AT
        if full:     # (no request routed for a while: the router reads as of now - staleness, never earlier)
            self.as_of(t_ms - self.staleness_ms)

    def as_of(self, t_ms: float) -> None:
        """Apply the news up to t_ms."""
        if self.lock is None:
            self._apply(t_ms)
            return
        with self.lock:
            self._apply(t_ms)

    def _apply(self, t_ms: float) -> None:
        news = self.news
        while news and news[0][0] <= t_ms:
            t, seq, kind, v = heapq.heappop(news)
            if kind == "requests":
                self.requests += v
            elif kind == "gauges":
                self.running, self.waiting, self.kv_used = v
            elif kind == "run":   # a run of steps' gauges, each as of its step's end: those due now at once
                times, j = v[0], v[4]
                k = bisect.bisect_right(times, t_ms, j)
                self.running, self.waiting, self.kv_used = v[1][k - 1], v[2][k - 1], v[3][k - 1]
                t = times[k - 1]
                if k < len(times):   # the rest when due (no other gauges of this replica fall among them)
                    heapq.heappush(news, (times[k], seq, kind, v[:4] + (k,)))
            else:   # "kv": hash events
                for sign, h in v:
                    where = self.cached if -1 <= sign <= 1 else self.cpu
                    if sign > 0:
                        where.add(h)
                    else:
                        where.discard(h)
            if t > self.t_ms:   # (the latest news heard: a run's last due step may be later than what follows it)
                self.t_ms = t
