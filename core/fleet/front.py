"""The router's front end, one for the simulated fleet (core.fleet.sim, core.fleet.apart) and the
real one (gpu_runner.fleet): a prompt's block hashes, what the router knows of a candidate
(`signals_of`, from its Board), the decision with the fleet's queue limit and the approximate
prefix record (`decide`), and the route event each records (`route_event`, `rejected_event`).
Each fleet gives it its candidates and news; none of it reads an engine."""
from __future__ import annotations

from core.engine.prefix_cache import block_hash
from core.fleet.router import Decision, Router, Signals, recorded


def prompt_hashes(ids, block_size: int, extra) -> list:
    """The chain of block hashes of a prompt's full blocks (the prefix cache's keys)."""
    parent, out = None, []
    for i in range(len(ids) // block_size):
        parent = block_hash(parent, tuple(ids[i * block_size:(i + 1) * block_size]), extra)
        out.append(parent)
    return out


def signals_of(router: Router, replica: int, board, kv_blocks: int, hashes, now_ms: float) -> Signals:
    """What the router knows of `replica` at now_ms: its board as of now less the staleness, and
    (prefix knowledge) how much of the prompt (`hashes`, or a function giving them) it holds."""
    board.as_of(now_ms - router.cfg.staleness_ms)
    cached = prefix = cpu = 0
    if router.prefix_mode is not None:
        hs = hashes() if callable(hashes) else hashes
        cached, prefix = router.known_prefix(replica, hs, board.cached)
        if board.cpu and router.prefix_mode == "precise":   # (a CPU tier's news: the blocks after those)
            while prefix + cpu < len(hs) and hs[prefix + cpu] in board.cpu:
                cpu += 1
    return Signals(replica, board.requests, board.running, board.waiting, board.kv_used, kv_blocks, cached, prefix,
                   board.t_ms, cpu)


def decide(router: Router, sigs: list[Signals], prompt_blocks: int, hashes_of) -> tuple[Decision | None, str | None]:
    """(the router's choice among the candidates' signals, None) or (None, why it refused): the
    fleet's queue limit first (requests waiting across the fleet, as the router sees them), then the
    policy; approximate prefix knowledge remembers what it sent where (`hashes_of(replica)`)."""
    lim = router.cfg.queue_limit
    if lim is not None:
        waiting = sum(max(0, s.requests - s.running) for s in sigs)
        if waiting >= lim:
            return None, f"router queue limit: {waiting} requests waiting across the fleet (limit {lim})"
    d = router.choose(sigs, prompt_blocks)
    if router.prefix_mode == "approximate":
        router.remember(d.replica, hashes_of(d.replica))
    return d, None


def rejected_event(t_ms: float, req: str, policy: str, why: str) -> dict:
    """A request no replica took: a route to -1 with the reason."""
    return {"type": "route", "t_ms": t_ms, "req": req, "policy": policy, "replica": -1, "stage": "rejected",
            "reason": why}


def route_event(t_ms: float, req: str, policy: str, d: Decision, sigs: list, prompt_blocks: int,
                dd: Decision | None = None, left_out: int = 0, signals: dict | None = None) -> dict:
    """The route event of a decision `d` (with `dd`, a disaggregated request's decode replica):
    the reasons, the scores and the signals of at most RECORDED_SIGNALS candidates (the chosen
    first: core.fleet.router.recorded), how many were left out, the prompt's full blocks.
    `signals`: the recorded candidates' signals as dicts already (a run made apart reads them back)."""
    ev = {"type": "route", "t_ms": t_ms, "req": req, "policy": policy, "replica": d.replica,
          "stage": "whole" if dd is None else "prefill", "reason": d.reason}
    if dd is not None:
        ev["decode"] = dd.replica
        ev["decode_reason"] = dd.reason
    scores = {**(d.scores or {}), **((dd.scores or {}) if dd is not None else {})}
    more = 0
    if signals is None:
        sigs, scores, more = recorded(list(sigs), (d.replica,) if dd is None else (d.replica, dd.replica),
                                      scores or None)
        signals = {str(s.replica): s.to_dict() for s in sigs}
    if scores:
        ev["scores"] = {str(k): v for k, v in scores.items()}
    ev["signals"] = signals
    if left_out or more:
        ev["signals_left_out"] = left_out + more    # (candidates whose signals were not recorded)
    ev["prompt_blocks"] = prompt_blocks
    return ev
