"""A request's way outside the engine's steps: the front end (an API server: vLLM's, ours)
between the client and the engine core.

    front end's arrival --in--> queued in the engine core --(queue, steps)--> a step ends with a
    token --out--> the front end has the token (streams it to the client)

A step model prices only the steps; TTFT and E2E as vLLM's own spans measure them (from its front
end's arrival to the token reaching the front end) also hold the way in (parsing, tokenising,
handing the request to the engine core process) and the way out (the step's outputs back to the
front end, detokenised). `FrontEnd` gives both a cost:

    in(request)  = in_ms + in_ms_per_prompt_token x prompt tokens
                   + in_ms_per_in_flight x requests in flight at the front end when it arrives
    out(token k) = out_ms + out_ms_per_output_token x k      (k = 0, 1, ...: a front end that falls
                                                              behind its engine delivers later and later)

The in-flight term is contention: the front end shares the machine's cores with the engine and
streams every request in flight, so each one it already serves delays a newcomer. The count
depends on when requests finish, which depends on the way in: `simulate` runs twice, the second
time with the counts of the first (`in_flight_at`).

`simulate(..., front_end=FrontEnd(...))` runs the engine on the requests as they reach the core
(`engine_workload`) and reports the trace on the front end's clock (`at_front_end`): arrivals as
the front end had them, tokens and finishes when they reach it, steps and KV events when the
engine did them (one clock; two places). Each request also carries what vLLM's spans carry
(engine_queue_ms, engine_prefill_ms, engine_decode_ms, engine_inference_ms) and when the core
queued it (queued_ms), so a simulated run and a measured one are compared part by part
(core.fit.frontfit fits these terms back from either).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from core.errors import ConfigError
from core.workload import Workload

CLOCK_NOTE = ("arrivals, tokens and finishes as the front end had them (core.sim.frontend: the way in and out "
              "modelled); steps and KV events when the engine core did them, on the same clock")


@dataclass(frozen=True, slots=True)
class FrontEnd:
    in_ms: float = 0.0                    # per request, front end -> engine core
    in_ms_per_prompt_token: float = 0.0   # per prompt token (tokenising)
    out_ms: float = 0.0                   # per token, engine step end -> front end
    out_ms_per_output_token: float = 0.0  # token k arrives k x this later again
    in_ms_per_in_flight: float = 0.0      # per request already in flight at the front end (contention)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"front end {f.name}: expected a finite number >= 0, got {v!r}")

    def way_in(self, prompt_tokens, in_flight=0) -> np.ndarray:
        return (self.in_ms + self.in_ms_per_prompt_token * np.asarray(prompt_tokens, dtype=np.float64)
                + self.in_ms_per_in_flight * np.asarray(in_flight, dtype=np.float64))

    def way_out(self, index) -> np.ndarray:
        return self.out_ms + self.out_ms_per_output_token * np.asarray(index, dtype=np.float64)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        busy = f" + {self.in_ms_per_in_flight:g} ms x requests in flight" if self.in_ms_per_in_flight else ""
        return (f"in {self.in_ms:g} ms + {self.in_ms_per_prompt_token:g} ms x prompt tokens{busy}; out "
                f"{self.out_ms:g} ms + {self.out_ms_per_output_token:g} ms x output position")

    @classmethod
    def from_dict(cls, d: dict, where: str = "front_end") -> FrontEnd:
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected an object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; expected {sorted(names)}")
        return cls(**d)


def in_flight_at(arrival: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """For each request, how many others had arrived before it and not finished when it arrived
    (a request that never finished counts as in flight)."""
    a = np.asarray(arrival, dtype=np.float64)
    f = np.where(np.isfinite(finish), finish, np.inf)
    before = np.searchsorted(np.sort(a), a, side="left")
    done = np.searchsorted(np.sort(f), a, side="right")
    return np.maximum(before - done, 0)


def engine_workload(workload: Workload, fe: FrontEnd, in_flight=0) -> Workload:
    """The requests as the engine core receives them: each arrival later by its way in (`in_flight`:
    per request, the others in flight when it arrived), in the order they reach the core (a longer
    prompt may be overtaken)."""
    arrive = np.asarray(workload.arrival_ms, dtype=np.float64) + fe.way_in(workload.prompt_tokens, in_flight)
    order = np.argsort(arrive, kind="stable")
    reqs = [dataclasses.replace(workload.requests[i], arrival_ms=float(arrive[i])) for i in order.tolist()]
    return Workload(reqs, name=workload.name)


def at_front_end(trace, workload: Workload, fe: FrontEnd):
    """A trace simulated on `engine_workload(workload, fe)`, reported on the front end's clock
    (in place; returned): arrivals back to the front end's, tokens and finishes later by their
    way out; per request queued_ms and the engine's phases (core.analysis.metrics reads them as
    it reads vLLM's spans)."""
    phases = engine_phases(trace)
    front = dict(zip(workload.ids, np.asarray(workload.arrival_ms, dtype=np.float64).tolist()))
    req = trace.requests
    queued = req["arrival_ms"].to_numpy(dtype=np.float64)
    req["arrival_ms"] = [front[i] for i in req["id"]]
    tok = trace.tokens
    if len(tok):
        tok["t_ms"] = tok["t_ms"].to_numpy() + fe.way_out(tok["index"].to_numpy())
    fin = trace.finishes
    if len(fin):
        n = np.zeros(len(req), dtype=np.int64)
        if len(tok):
            np.maximum.at(n, tok["req"].to_numpy(), tok["index"].to_numpy() + 1)
        last = np.maximum(n[fin["req"].to_numpy()] - 1, 0)
        fin["t_ms"] = fin["t_ms"].to_numpy() + fe.way_out(last)
    extra = list(trace.request_extra) + [{}] * (len(req) - len(trace.request_extra))
    for k in range(len(req)):
        e = dict(extra[k])
        e["queued_ms"] = float(queued[k])
        e.update({name: float(col[k]) for name, col in phases.items() if not np.isnan(col[k])})
        extra[k] = e
    trace.request_extra = extra
    trace.meta["front_end"] = fe.to_dict()
    trace.meta["clock_note"] = CLOCK_NOTE
    return trace


def engine_phases(trace) -> dict[str, np.ndarray]:
    """Per request (NaN where it never got so far), as vLLM's spans report them: the wait for the
    step boundary (its arrival at the core to the end of the step then running: an engine core's
    loop reads new requests only between steps, and vLLM's span starts its queue there, so this
    wait lies in the front end's share of TTFT on both sides), time in the core's queue (that
    boundary to its first step's start), prefill (to the end of the step of its first token),
    decode (first to last token), inference (first step's start to last token), from the trace's
    own steps, batch entries and tokens (engine clock)."""
    n = len(trace.requests)
    arrived = trace.requests["arrival_ms"].to_numpy(dtype=np.float64)
    first_step = np.full(n, np.nan)
    taken = arrived.copy()
    if len(trace.batch) and len(trace.steps):
        st = trace.steps
        start_of = dict(zip(st["step"].to_numpy().tolist(), st["t_ms"].to_numpy().tolist()))
        b = trace.batch
        s0 = b.groupby("req", sort=False)["step"].min()
        first_step[s0.index.to_numpy()] = [start_of.get(s, np.nan) for s in s0.to_numpy().tolist()]
        starts = st["t_ms"].to_numpy(dtype=np.float64)
        ends = starts + st["dur_ms"].to_numpy(dtype=np.float64)
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        k = np.searchsorted(starts, arrived, side="right") - 1     # the step started last at (or before) arrival
        running = (k >= 0) & (arrived < ends[np.maximum(k, 0)])
        taken = np.where(running, ends[np.maximum(k, 0)], arrived)
        taken = np.minimum(taken, np.where(np.isnan(first_step), np.inf, first_step))
    t_first = np.full(n, np.nan)
    t_last = np.full(n, np.nan)
    if len(trace.tokens):
        tok = trace.tokens
        g = tok.groupby("req", sort=False)["t_ms"]
        lo, hi = g.min(), g.max()
        t_first[lo.index.to_numpy()] = lo.to_numpy()
        t_last[hi.index.to_numpy()] = hi.to_numpy()
    return {"engine_wait_ms": taken - arrived, "engine_queue_ms": first_step - taken,
            "engine_prefill_ms": t_first - first_step, "engine_decode_ms": t_last - t_first,
            "engine_inference_ms": t_last - first_step}
